//! The fleet's models: servers (life, disk and fd growth, GC pauses, gray and slow
//! faults), dependencies and their conditions over time, probes, deployments, and the
//! controller's state that a restart loses.

use crate::scenario::DepCriticality;
use std::time::Duration;
use vigil_core::anomaly::AnomalyDetector;
use vigil_core::fleet::{Dissent, DissentTally, Replica, Stored, Uncommitted};
use vigil_core::rollout::Rollout;
use vigil_core::shard::Shard;
use vigil_core::{Thresholds, Time};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Life {
    Up,
    Down,
    Booting,
}

/// A quantity growing linearly from `base` at `t0` by `rate` per second.
#[derive(Clone, Copy, Debug)]
pub(super) struct Growth {
    pub(super) base: f64,
    pub(super) t0: Time,
    pub(super) rate: f64,
}

impl Growth {
    pub(super) fn flat(base: f64) -> Self {
        Growth {
            base,
            t0: Time::ZERO,
            rate: 0.0,
        }
    }
    pub(super) fn at(&self, now: Time) -> f64 {
        self.base + self.rate * now.since(self.t0).as_secs_f64()
    }
}

/// A fault growing linearly to its full size over `len` from `start`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct FaultRamp {
    pub(super) start: Time,
    pub(super) len: Duration,
}

impl FaultRamp {
    pub(super) fn new(start: Time, len: Option<Duration>) -> Option<FaultRamp> {
        len.map(|len| FaultRamp { start, len })
    }

    /// How far the ramp is at `t`: 0 before it starts, 1 once it is over.
    pub(super) fn progress(&self, t: Time) -> f64 {
        if t <= self.start {
            return 0.0;
        }
        if self.len.is_zero() {
            return 1.0;
        }
        (t.since(self.start).as_secs_f64() / self.len.as_secs_f64()).min(1.0)
    }

    /// When the ramp reaches `fraction` of its size.
    pub(super) fn reaches(&self, fraction: f64) -> Time {
        self.start + self.len.mul_f64(fraction.clamp(0.0, 1.0))
    }
}

/// A fault's size at a given time: `to`, reached at the end of its ramp, if any.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Ramped {
    pub(super) to: f64,
    pub(super) ramp: Option<FaultRamp>,
}

impl Ramped {
    pub(super) fn at(&self, t: Time) -> f64 {
        match self.ramp {
            None => self.to,
            Some(r) => self.to * r.progress(t),
        }
    }

    pub(super) fn is_zero(&self) -> bool {
        self.to == 0.0
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Gc {
    pub(super) start: Time,
    pub(super) pause: Duration,
    pub(super) every: Duration,
}

impl Gc {
    /// Remaining pause at `now`, if paused.
    pub(super) fn remaining(&self, now: Time) -> Option<Duration> {
        if now < self.start {
            return None;
        }
        let into = now.since(self.start).as_nanos() % self.every.as_nanos();
        let into = Duration::from_nanos(into as u64);
        (into < self.pause).then(|| self.pause - into)
    }
    /// Paused fraction of `[now, now + dt)`.
    pub(super) fn paused_fraction(&self, now: Time, dt: Duration) -> f64 {
        let end = now + dt;
        if end <= self.start {
            return 0.0;
        }
        let from = now.max(self.start);
        let every = self.every.as_nanos();
        let mut k = from.since(self.start).as_nanos() / every;
        let mut paused = 0u128;
        loop {
            let ps = self.start.as_elapsed().as_nanos() + k * every;
            let pe = ps + self.pause.as_nanos();
            let (a, b) = (
                ps.max(from.as_elapsed().as_nanos()),
                pe.min(end.as_elapsed().as_nanos()),
            );
            if b > a {
                paused += b - a;
            }
            if ps >= end.as_elapsed().as_nanos() {
                break;
            }
            k += 1;
        }
        paused as f64 / dt.as_nanos() as f64
    }
}

#[derive(Clone, Debug)]
pub(super) struct Server {
    pub(super) zone: u32,
    pub(super) incarnation: u32,
    pub(super) life: Life,
    pub(super) boot_at: Time,
    /// Background checker phase within its interval.
    pub(super) phase: Duration,
    pub(super) backlog: u64,
    pub(super) disk: Growth,
    pub(super) fds: Growth,
    pub(super) gc: Option<Gc>,
    pub(super) checker_dead_at: Option<Time>,
    /// (dependency, since, until)
    pub(super) conn_broken: Option<(usize, Time, Option<Time>)>,
    /// Share of requests failing (a gray failure).
    pub(super) gray: Ramped,
    /// Extra worker time of every request and health answer, seconds (a slow host).
    pub(super) slow: Ramped,
    pub(super) bad_version: bool,
    /// Runs the revision being rolled out (bad or not).
    pub(super) new_revision: bool,
    /// Replaced by the controller while it was up (capacity the system took out).
    pub(super) replaced_while_up: bool,
    /// Arrivals exceeded capacity in the last tick (brownout).
    pub(super) overloaded: bool,
    /// Its queue was full in the last tick: it shed arrivals (503).
    pub(super) shedding: bool,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct DepCond {
    pub(super) error_rate: f64,
    pub(super) extra_latency: Duration,
    pub(super) affected: f64,
    pub(super) key: u64,
    /// Ramping from `from_error_rate` (and no extra latency) to the values above.
    pub(super) ramp: Option<FaultRamp>,
    pub(super) from_error_rate: f64,
}

impl DepCond {
    pub(super) fn error_rate_at(&self, t: Time) -> f64 {
        match self.ramp {
            None => self.error_rate,
            Some(r) => {
                self.from_error_rate + (self.error_rate - self.from_error_rate) * r.progress(t)
            }
        }
    }

    /// Extra latency, seconds.
    pub(super) fn extra_at(&self, t: Time) -> f64 {
        let full = self.extra_latency.as_secs_f64();
        self.ramp.map_or(full, |r| full * r.progress(t))
    }
}

pub(super) struct Dep {
    pub(super) latency: Duration,
    pub(super) request_fraction: f64,
    pub(super) criticality: DepCriticality,
    /// Share of its requests a degraded answer serves (see `DependencyConfig::degraded`).
    pub(super) degraded: f64,
    /// Conditions over time, first at t = 0.
    pub(super) history: Vec<(Time, DepCond)>,
}

impl Dep {
    pub(super) fn cond_at(&self, t: Time) -> &DepCond {
        self.history
            .iter()
            .rev()
            .find(|(at, _)| *at <= t)
            .map(|(_, c)| c)
            .unwrap_or(&self.history[0].1)
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Probe {
    pub(super) ok: bool,
    pub(super) latency: Duration,
    pub(super) endpoint_failed: bool,
    pub(super) failing: u32,
    pub(super) detail: &'static str,
}

pub(super) struct Deployment {
    pub(super) fault: u16,
    /// Timer rollout: servers `0..deployed` got the new version.
    pub(super) deployed: u32,
    pub(super) halted: bool,
    /// vigil's rollout (`gate = "health"`), the policy `vigil deploy` drives.
    pub(super) rollout: Option<Box<Rollout>>,
    /// Its decisions already noted, and the last wave counted.
    pub(super) seen_decisions: usize,
    pub(super) last_wave: Option<usize>,
    pub(super) rolling_back: bool,
    pub(super) polls: u64,
}

/// The controller: the replica `vigil controller` drives (`vigil_core::fleet::Replica`:
/// the guard, its mode, the batch not yet committed) and what a restart loses.
pub(super) struct Controller {
    pub(super) up: bool,
    pub(super) replica: Replica,
    /// Its store (the guard's snapshot and op rows), which a restart reads back.
    pub(super) store: SimStore,
    /// Naive mode: thresholds per server.
    pub(super) naive: Vec<Thresholds>,
    /// Queue workers compared with their peers, as `vigil controller` does with the
    /// counters workers report (kept in memory there too: a restart starts afresh).
    pub(super) anomaly: AnomalyDetector,
    /// Per server: the comparison's last verdict said outlier.
    pub(super) outlier: Vec<bool>,
    /// Per slot, the instance the fleet lists (its incarnation; None while it is being
    /// replaced): the controller's target list.
    pub(super) listed: Vec<Option<u32>>,
    /// Per slot, the instance the committed guard knows.
    pub(super) committed: Vec<Option<u32>>,
    /// Membership changes in the batch not yet committed.
    pub(super) members: Vec<Member>,
    /// Sharded probing (`controller.replicas` > 1): who probes which target.
    pub(super) shard: Option<Shard>,
    /// Per replica: cut off from the targets (`prober_cut_off`).
    pub(super) cut: Vec<bool>,
    /// The dissent rule, as the leader runs it once per probe interval.
    pub(super) dissent: Dissent,
    /// This interval's tally for it.
    pub(super) tally: DissentTally,
    /// Tests: the replica's calls are recorded, one trace per process (a restart
    /// starts a new replica), for `vigil_core::fleet::Trace::replay`.
    #[cfg(test)]
    pub(super) traces: Option<Vec<vigil_core::fleet::Trace>>,
}

/// A membership change: slot, and the instance now listed there (None: none).
pub(super) type Member = (usize, Option<u32>);

/// The controller's store: what it holds, and whether it works.
pub(super) struct SimStore {
    pub(super) stored: Stored,
    /// Commits and reads fail (`store_outage`).
    pub(super) down: bool,
    /// A commit takes this long (`store_slow`; 0: at once).
    pub(super) latency: Duration,
    /// The commit under way: its number, its batch and its membership changes.
    pub(super) in_flight: Option<(u32, Uncommitted, Vec<Member>)>,
    /// Commits started (a restart or a failover ends the one under way: its
    /// completion, numbered before, is ignored).
    pub(super) commits: u32,
    /// The lease's epoch (None: a lone controller, unfenced): a failover starts the
    /// next, and the store refuses a batch of an earlier term.
    pub(super) epoch: Option<i64>,
    /// A retry of the failing store is scheduled.
    pub(super) retry_scheduled: bool,
    /// Slots whose committed act has not run yet (the controller was down when it
    /// was committed): a restarted controller or a successor runs them.
    pub(super) intended: Vec<usize>,
}
