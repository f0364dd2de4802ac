//! The discrete-event engine: the event queue (a heap ordered by time, then sequence),
//! the periodic probe streams, and the loop that takes events in order and dispatches them.

use super::{EPOCH, MAX_LOG, Sim};
use std::cmp::Ordering;
use std::time::Duration;
use vigil_core::Time;

#[derive(Clone, Copy, Debug)]
pub(super) enum Ev {
    Tick,
    LbProbe(u32),
    LbProbeDone {
        server: u32,
        incarnation: u32,
        ok: bool,
        detail: &'static str,
    },
    CtlProbe(u32),
    CtlProbeDone {
        server: u32,
        incarnation: u32,
        endpoint_failed: bool,
        failing: u32,
        /// Sharded probing: bit k set when the target's k-th prober is cut off from it.
        cut: u16,
    },
    CtlRound,
    FaultStart(u16),
    FaultEnd(u16),
    Boot {
        server: u32,
        incarnation: u32,
    },
    DeployWave {
        fault: u16,
        wave: u16,
    },
    /// vigil's rollout policy's turn: feed it the hosts' health and error rates, carry out
    /// its commands.
    DeployPoll {
        fault: u16,
    },
    ControllerUp,
    /// The controller's commit number `n` ends (`store_slow`).
    CtlCommitted(u32),
    /// The controller tries its failing store again.
    CtlRetry,
    /// A successor takes the controller's lease over (`leader_failover`).
    CtlLead,
}

/// A strictly periodic event per server (active probes): presorted phases walked in
/// cycles, so a fleet's probes cost no heap operations.
#[derive(Default)]
pub(super) struct Periodic {
    /// (phase in ns, server), sorted.
    pub(super) phases: Vec<(u64, u32)>,
    pub(super) interval: u64,
    pub(super) cycle: u64,
    pub(super) next: usize,
}

impl Periodic {
    pub(super) fn new(mut phases: Vec<(u64, u32)>, interval: Duration) -> Self {
        phases.sort_unstable();
        Periodic {
            phases,
            interval: interval.as_nanos() as u64,
            cycle: 0,
            next: 0,
        }
    }

    pub(super) fn next_at(&self) -> Option<Time> {
        let (phase, _) = self.phases.get(self.next)?;
        Some(Time::ZERO + Duration::from_nanos(self.cycle * self.interval + phase))
    }

    pub(super) fn advance(&mut self) -> u32 {
        let server = self.phases[self.next].1;
        self.next += 1;
        if self.next == self.phases.len() {
            self.next = 0;
            self.cycle += 1;
        }
        server
    }
}

pub(super) struct Scheduled {
    pub(super) at: Time,
    pub(super) seq: u64,
    pub(super) ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap, we want the earliest first.
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

impl<'a> Sim<'a> {
    pub(super) fn schedule(&mut self, at: Time, ev: Ev) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at,
            seq: self.seq,
            ev,
        });
    }

    /// Policy time for simulation time `t`.
    pub(super) fn pt(t: Time) -> Time {
        t + EPOCH
    }

    pub(super) fn note(&mut self, msg: String) {
        if self.log.len() < MAX_LOG {
            self.log.push((self.now.as_elapsed(), msg));
        } else {
            self.log_dropped += 1;
        }
    }

    pub(super) fn run(&mut self, progress: &mut dyn FnMut(f64)) {
        let end = Time::from_elapsed(self.cfg.duration);
        let step = (self.cfg.duration / 100).max(Duration::from_secs(1));
        let mut next_progress = Time::ZERO + step;
        loop {
            // Merge the heap with the two periodic probe streams (earliest first; on a
            // tie the heap, then LB probes, then controller probes: fixed, so
            // deterministic).
            let heap_at = self.heap.peek().map(|s| s.at);
            let lb_at = self.lb_probes.next_at();
            let ctl_at = self.ctl_probes.next_at();
            let first = [heap_at, lb_at, ctl_at].into_iter().flatten().min();
            let Some(at) = first else { break };
            let ev = if heap_at == Some(at) {
                self.heap.pop().expect("peeked").ev
            } else if lb_at == Some(at) {
                Ev::LbProbe(self.lb_probes.advance())
            } else {
                Ev::CtlProbe(self.ctl_probes.advance())
            };
            if at >= end {
                break;
            }
            self.now = at;
            self.s.events += 1;
            if at >= next_progress {
                progress(at.as_elapsed().as_secs_f64() / self.cfg.duration.as_secs_f64());
                next_progress = at + step;
            }
            self.handle(ev);
        }
        self.now = end;
        progress(1.0);
    }

    pub(super) fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Tick => self.on_tick(),
            Ev::LbProbe(i) => self.on_lb_probe(i),
            Ev::LbProbeDone {
                server,
                incarnation,
                ok,
                detail,
            } => self.on_lb_probe_done(server, incarnation, ok, detail),
            Ev::CtlProbe(i) => self.on_ctl_probe(i),
            Ev::CtlProbeDone {
                server,
                incarnation,
                endpoint_failed,
                failing,
                cut,
            } => self.on_ctl_probe_done(server, incarnation, endpoint_failed, failing, cut),
            Ev::CtlRound => self.on_ctl_round(),
            Ev::FaultStart(f) => self.on_fault(f as usize, true),
            Ev::FaultEnd(f) => self.on_fault(f as usize, false),
            Ev::Boot {
                server,
                incarnation,
            } => self.on_boot(server, incarnation),
            Ev::DeployWave { fault, wave } => self.on_deploy_wave(fault, wave),
            Ev::DeployPoll { fault } => self.on_deploy_poll(fault),
            Ev::ControllerUp => self.on_controller_up(),
            Ev::CtlCommitted(n) => self.on_ctl_committed(n),
            Ev::CtlRetry => self.on_ctl_retry(),
            Ev::CtlLead => self.on_ctl_lead(),
        }
    }
}
