//! The queue driver: arrivals, workers pulling through their `WorkerGate`, and what a
//! worker reports.

use super::Sim;
use crate::scenario::ScenarioConfig;
use vigil_core::anomaly::Counts;
use vigil_core::gate::{GateChange, Pause};
use vigil_core::{Status, Time};

impl<'a> Sim<'a> {
    /// One tick of the queue: arrivals, then every worker whose gate lets it pull takes
    /// a share in proportion to its speed. A worker failing a message spends `fail_time`
    /// on it, a healthy one `process_time`: a worker that fails fast pulls more (the
    /// black hole). A worker fails every message when its disk or fds are exhausted, and
    /// the share a gray failure sets otherwise (its health checks pass: only the kill
    /// switch and the controller's peer comparison can see it). Failed messages go back
    /// to the queue.
    pub(super) fn queue_tick(&mut self) {
        let cfg: &'a ScenarioConfig = self.cfg;
        let q = cfg.queue.as_ref().expect("checked by caller");
        let now = self.now;
        let dt = cfg.tick.as_secs_f64();
        let arrivals = self.rng.poisson(q.rate * dt);
        self.queue_backlog += arrivals;
        // (server, speed, share of its messages failing)
        let mut speeds: Vec<(usize, f64, f64)> = Vec::new();
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
            let per =
                q.process_time.as_secs_f64() * (1.0 - fail) + q.fail_time.as_secs_f64() * fail;
            let speed = f64::from(q.threads) * dt / per;
            demand += speed;
            speeds.push((i, speed, fail));
        }
        if demand <= 0.0 || self.queue_backlog == 0 {
            self.s.max_queue_backlog = self.s.max_queue_backlog.max(self.queue_backlog);
            return;
        }
        let take = (self.queue_backlog as f64).min(demand);
        let mut pulled_total = 0u64;
        let mut failed = 0u64;
        let pnow = Self::pt(now);
        for (i, speed, fail) in speeds {
            let share = take * speed / demand;
            let n = (share + self.rng.unit()).floor() as u64;
            let n = n.min(self.queue_backlog - pulled_total);
            pulled_total += n;
            let mut f = 0u64;
            for _ in 0..n {
                // Certain outcomes draw nothing: runs without gray failures keep their
                // random sequence.
                let ok = !(fail >= 1.0 || (fail > 0.0 && self.rng.unit() < fail));
                f += u64::from(!ok);
                if let Some(change) = self.gates.get_mut(i).and_then(|g| g.record(pnow, ok)) {
                    self.gate_changed(i, change);
                }
            }
            failed += f;
            let t = &mut self.msg_totals[i];
            *t = Counts::new(t.ok + (n - f), t.failed + f);
        }
        self.s.messages_delivered += pulled_total;
        self.s.message_failures += failed;
        // Failed messages go back to the queue (redelivered after their visibility timeout).
        self.queue_backlog = self.queue_backlog - pulled_total + failed;
        self.s.max_queue_backlog = self.s.max_queue_backlog.max(self.queue_backlog);
    }

    /// Worker `i`'s gate at `now`: feeds it the host's readiness (the library feeds it
    /// every snapshot of the local checks; here, once per tick) and its timers, and says
    /// whether it may pull.
    pub(super) fn gate_lets_pull(&mut self, i: usize, now: Time) -> bool {
        let (failing, status) = self.checks(i, now, false);
        let readiness = if status == Status::Fail {
            Err(self.check_names(failing).join(", "))
        } else {
            Ok(())
        };
        let pnow = Self::pt(now);
        let g = &mut self.gates[i];
        if let Some(change) = g
            .observe_readiness(pnow, readiness)
            .or_else(|| g.tick(pnow))
        {
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
