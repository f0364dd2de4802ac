//! The queue driver: arrivals, workers pulling through their `WorkerGate`, where a failed
//! message goes (back to the queue, stamped, or dead-lettered: the gate's poison rule),
//! and what a worker reports.

use super::{CHECK_DEP0, Sim};
use crate::scenario::ScenarioConfig;
use std::collections::VecDeque;
use vigil_core::anomaly::Counts;
use vigil_core::gate::{self, Disposition, Evidence, FailedOn, GateChange, Pause};
use vigil_core::{Status, Time};

/// The messages waiting in the queue, oldest first, and what the queue's tally needs.
#[derive(Debug, Default)]
pub(super) struct QueueState {
    waiting: VecDeque<Waiting>,
    /// Messages waiting (the sum over `waiting`).
    len: u64,
    /// When the last fault with a duration ends, once known.
    last_fault_end: Option<Option<Time>>,
}

/// A run of messages in the queue.
#[derive(Debug)]
enum Waiting {
    /// This many fresh, healthy messages (never failed: no stamp).
    Fresh(u64),
    /// One message with a past (or poison).
    One(Message),
}

/// A message that failed before, or a poison one: what its headers carry.
#[derive(Debug, Default)]
struct Message {
    poison: bool,
    /// (server, what its failure said), as `x-vigil-failed-on` carries them.
    stamp: Vec<(usize, Evidence)>,
    /// When the first failure that pointed at it happened (`x-vigil-failed-since`).
    since: Option<Time>,
}

impl QueueState {
    /// Takes the oldest message: `None` for a fresh healthy one.
    fn pop(&mut self) -> Option<Option<Message>> {
        let front = self.waiting.front_mut()?;
        self.len -= 1;
        match front {
            Waiting::Fresh(n) if *n > 1 => {
                *n -= 1;
                Some(None)
            }
            Waiting::Fresh(_) => {
                self.waiting.pop_front();
                Some(None)
            }
            Waiting::One(_) => match self.waiting.pop_front() {
                Some(Waiting::One(m)) => Some(Some(m)),
                _ => unreachable!("the front was One"),
            },
        }
    }

    fn push_fresh(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.len += n;
        match self.waiting.back_mut() {
            Some(Waiting::Fresh(k)) => *k += n,
            _ => self.waiting.push_back(Waiting::Fresh(n)),
        }
    }

    fn push(&mut self, m: Message) {
        self.len += 1;
        self.waiting.push_back(Waiting::One(m));
    }
}

impl<'a> Sim<'a> {
    /// One tick of the queue: arrivals, then every worker whose gate lets it pull takes
    /// a share in proportion to its speed. A worker failing a message spends `fail_time`
    /// on it, a healthy one `process_time`: a worker that fails fast pulls more (the
    /// black hole). A worker fails every message when its disk or fds are exhausted, and
    /// the share a gray failure sets otherwise (its health checks pass: only the kill
    /// switch and the controller's peer comparison can see it); a message also fails,
    /// after its `process_time`, with the error rate of the queue's `dependency` as the
    /// worker sees it, and a poison message always. Where a failed message goes is the
    /// gate's word (`WorkerGate::message_failed`; naive workers: the old rule,
    /// `gate::naive_disposition`): back to the queue, stamped as the library stamps it
    /// (redelivered after its visibility timeout, behind what waits), or dead-lettered.
    pub(super) fn queue_tick(&mut self) {
        let cfg: &'a ScenarioConfig = self.cfg;
        let q = cfg.queue.as_ref().expect("checked by caller");
        let now = self.now;
        let dt = cfg.tick.as_secs_f64();
        let arrivals = self.rng.poisson(q.rate * dt);
        let mut poison = 0;
        if q.poison > 0.0 {
            for _ in 0..arrivals {
                poison += u64::from(self.rng.unit() < q.poison);
            }
        }
        self.queue.push_fresh(arrivals - poison);
        for _ in 0..poison {
            self.queue.push(Message {
                poison: true,
                ..Message::default()
            });
        }
        let dep = q.dependency.as_deref().map(|d| self.dep_index(Some(d)));
        // (server, speed, share of its messages failing fast, dependency error rate)
        let mut speeds: Vec<(usize, f64, f64, f64)> = Vec::new();
        let mut demand = 0.0;
        for i in 0..self.servers.len() {
            if !self.is_up(i) {
                continue;
            }
            if !self.gates.is_empty() && !self.gate_lets_pull(i, now) {
                continue;
            }
            let fail = if self.disk_full(i, now) || self.fds_exhausted(i, now) {
                1.0
            } else {
                self.servers[i].gray.at(now).clamp(0.0, 1.0)
            };
            let dep_err = dep.map_or(0.0, |d| self.dep_for(i, d, now).0.clamp(0.0, 1.0));
            let per =
                q.process_time.as_secs_f64() * (1.0 - fail) + q.fail_time.as_secs_f64() * fail;
            let speed = f64::from(q.threads) * dt / per;
            demand += speed;
            speeds.push((i, speed, fail, dep_err));
        }
        self.track_resume(now);
        if demand <= 0.0 || self.queue.len == 0 {
            self.s.max_queue_backlog = self.s.max_queue_backlog.max(self.queue.len);
            return;
        }
        let take = (self.queue.len as f64).min(demand);
        let mut pulled_total = 0u64;
        let mut failed = 0u64;
        let mut back: Vec<Message> = Vec::new();
        let pnow = Self::pt(now);
        let available = self.queue.len;
        let mut shares: Vec<(usize, u64, f64, f64)> = Vec::with_capacity(speeds.len());
        for (i, speed, fail, dep_err) in speeds {
            let share = take * speed / demand;
            let n = (share + self.rng.unit()).floor() as u64;
            let n = n.min(available - pulled_total);
            pulled_total += n;
            shares.push((i, n, fail, dep_err));
        }
        // The worker that takes the oldest messages rotates with the tick: a message sent
        // back goes to whoever asks next, not always to the worker that failed it.
        let first = if shares.is_empty() {
            0
        } else {
            (self.tick_no % shares.len() as u64) as usize
        };
        shares.rotate_left(first);
        for (i, n, fail, dep_err) in shares {
            // A message fails fast (the host) or, having run, on the dependency.
            let p_fail = fail + (1.0 - fail) * dep_err;
            let mut f = 0u64;
            for _ in 0..n {
                let m = self.queue.pop().expect("n is at most what waits");
                // Certain outcomes draw nothing: runs without gray failures keep their
                // random sequence.
                let ok = !(m.as_ref().is_some_and(|m| m.poison)
                    || p_fail >= 1.0
                    || (p_fail > 0.0 && self.rng.unit() < p_fail));
                if ok {
                    if let Some(change) = self.gates.get_mut(i).and_then(|g| g.record(pnow, true)) {
                        self.gate_changed(i, change);
                    }
                    continue;
                }
                f += 1;
                let m = m.unwrap_or_default();
                if let Some(m) = self.message_failed(i, pnow, m) {
                    back.push(m);
                }
            }
            failed += f;
            let t = &mut self.msg_totals[i];
            *t = Counts::new(t.ok + (n - f), t.failed + f);
        }
        self.s.messages_delivered += pulled_total;
        self.s.message_failures += failed;
        // Failed messages go back to the queue (redelivered after their visibility
        // timeout), behind what waits.
        for m in back {
            self.queue.push(m);
        }
        self.s.max_queue_backlog = self.s.max_queue_backlog.max(self.queue.len);
    }

    /// Message `m` failed on worker `i`: judged as the library judges it, then counted.
    /// Returns it when it goes back to the queue.
    fn message_failed(&mut self, i: usize, pnow: Time, mut m: Message) -> Option<Message> {
        let q = self.cfg.queue.as_ref().expect("checked by caller");
        let ids = &self.ctl_ids;
        let failed_on: Vec<FailedOn<'_>> = m
            .stamp
            .iter()
            .map(|&(w, evidence)| FailedOn {
                worker: &ids[w],
                evidence,
            })
            .collect();
        let witnessed_for = m.since.map(|t| pnow.since(t));
        let (disposition, change) = match self.gates.get_mut(i) {
            Some(g) => g.message_failed(pnow, &ids[i], &failed_on, witnessed_for),
            None => (
                gate::naive_disposition(q.worker.poison_workers, &ids[i], &failed_on),
                None,
            ),
        };
        drop(failed_on);
        if let Some(change) = change {
            self.gate_changed(i, change);
        }
        match disposition {
            Disposition::DeadLetter { .. } => {
                self.s.dead_letters += 1;
                if !m.poison {
                    self.s.healthy_dead_letters += 1;
                }
                None
            }
            Disposition::Requeue { stamp: None } => Some(m),
            Disposition::Requeue {
                stamp: Some(evidence),
            } => {
                match m.stamp.iter_mut().find(|(w, _)| *w == i) {
                    // The strongest evidence a worker gave stays (as the library's
                    // `Stamp::after` keeps it).
                    Some(entry) if evidence == Evidence::Message => entry.1 = evidence,
                    Some(_) => {}
                    None => m.stamp.push((i, evidence)),
                }
                if evidence == Evidence::Message && m.since.is_none() {
                    m.since = Some(pnow);
                }
                Some(m)
            }
        }
    }

    /// After the last fault with a duration ended: the first tick every worker that is
    /// up pulls again (`workers_resumed_after`).
    fn track_resume(&mut self, now: Time) {
        if self.s.workers_resumed_after.is_some() {
            return;
        }
        let end = *self.queue.last_fault_end.get_or_insert_with(|| {
            self.cfg
                .faults
                .iter()
                .filter_map(|f| f.duration.map(|d| Time::from_elapsed(f.at + d)))
                .max()
        });
        let Some(end) = end else { return };
        if now < end {
            return;
        }
        let all = (0..self.servers.len())
            .filter(|&i| self.is_up(i))
            .all(|i| self.gates.get(i).is_none_or(|g| g.may_pull()));
        if all {
            self.s.workers_resumed_after = Some(now.since(end));
        }
    }

    /// Worker `i`'s gate at `now`: feeds it the host's readiness and its dependency
    /// checks (the library feeds it every snapshot of the checks; here, once per tick)
    /// and its timers, and says whether it may pull.
    pub(super) fn gate_lets_pull(&mut self, i: usize, now: Time) -> bool {
        let (failing, status) = self.checks(i, now, false);
        let readiness = if status == Status::Fail {
            Err(self.check_names(failing).join(", "))
        } else {
            Ok(())
        };
        // Its dependency checks (the `/health` checks beyond readiness): what ends a
        // shared kill-switch pause (rule 4 of `vigil_core::gate`).
        let deps = (!self.deps.is_empty()).then(|| {
            let (failing, _) = self.checks(i, now, true);
            let deps = failing & !((1u32 << CHECK_DEP0) - 1);
            if deps == 0 {
                Ok(())
            } else {
                Err(self.check_names(deps).join(", "))
            }
        });
        let pnow = Self::pt(now);
        let g = &mut self.gates[i];
        let a = g.observe_readiness(pnow, readiness);
        let b = deps.and_then(|d| g.observe_dependencies(pnow, d));
        let c = g.tick(pnow);
        for change in [a, b, c].into_iter().flatten() {
            self.gate_changed(i, change);
        }
        self.gates[i].may_pull()
    }

    pub(super) fn gate_changed(&mut self, i: usize, change: GateChange) {
        let id = &self.ctl_ids[i];
        let line = match change {
            GateChange::Paused(Pause::Unready { reason }) => {
                self.s.worker_pauses += 1;
                format!("worker {id}: stops pulling: {reason}")
            }
            GateChange::Paused(Pause::KillSwitch { failed, of, until }) => {
                self.s.worker_pauses += 1;
                let pause = until.since(Self::pt(self.now));
                format!(
                    "worker {id}: kill switch: {failed} of {of} messages failed; paused for {}",
                    humantime::format_duration(pause)
                )
            }
            GateChange::Resumed { probation: true } => {
                format!("worker {id}: pulls again, on probation")
            }
            GateChange::Resumed { probation: false } => format!("worker {id}: pulls again"),
        };
        self.note(line);
    }
}
