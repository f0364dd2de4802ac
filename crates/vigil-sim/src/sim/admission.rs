//! The servers' defences against overload, driven as the `vigil` library drives them:
//! admission control (`vigil_core::admission`: the propagated deadline and the queue-time
//! rule) and the dependency guard (`vigil_core::breaker`, one breaker per server and
//! dependency).
//!
//! # Model
//!
//! - **Admission**: the balancer propagates the attempt's deadline (its per-try timeout,
//!   else the client's); a server refuses what it cannot start in time. In the tick's
//!   aggregate, the queue holds at most the work that [`QueueTime::admit`] would still
//!   start: every attempt carries a deadline, so its wait is bounded by the deadline
//!   less the server's typical request time (the median worker time and the host's own
//!   slowness, what the library's estimate follows), not by the controlled delay's 5 ms.
//!   What is beyond is refused (a fast 503: `admission_refused`), so no worker is spent
//!   on an attempt whose client has left. Adaptive LIFO changes who waits, not how many
//!   are served in time, and is not modelled. The naive servers keep `max_queue_wait`
//!   and serve it in order.
//! - **Dependency guard**: each tick a server's calls to a dependency are fed to its
//!   breaker: slow (its latency past `breaker.slow_call`) or failing calls are bad. While
//!   the breaker is not closed, the requests that need that dependency are answered
//!   degraded: the dependency's `degraded` share from a cache (a success), the rest failed
//!   at once; neither holds a worker on the dependency. Without a degraded answer the
//!   guard trips on slow calls only (`TripOn::Slow`: failing fast what fails fast anyway
//!   helps no one). When half-open, `breaker.probes` trial calls go each tick until the breaker decides. The open time's jitter is a pure
//!   hash of the server, the dependency and the opening (no draw from the run's stream).

use super::Sim;
use crate::rng::hash_unit;
use crate::scenario::Switch;
use std::time::Duration;
use vigil_core::Time;
use vigil_core::admission::QueueTime;
use vigil_core::breaker::{Breaker, BreakerChange, BreakerConfig, BreakerState, Permit, TripOn};

/// Per server: its admission state and its dependency breakers.
#[derive(Clone, Debug)]
pub(super) struct Defences {
    pub(super) queue: QueueTime,
    pub(super) breakers: Vec<Breaker>,
    /// Times any of its breakers opened (for the jitter's hash).
    opens: u64,
    /// Whether some breaker is not closed.
    pub(super) degraded: bool,
}

impl<'a> Sim<'a> {
    pub(super) fn fresh_defences(&self, now: Time) -> Defences {
        let f = &self.cfg.fleet;
        let breakers = if f.dependency_guard == Switch::On {
            // A guard without a degraded answer (`degraded = 0`) trips on slowness only
            // (`TripOn::Slow`): failing fast what fails fast anyway would turn a
            // dependency's 55% errors into 100% (`fail-open-hovering`).
            self.deps
                .iter()
                .map(|d| {
                    let trip_on = if d.degraded > 0.0 {
                        f.breaker.trip_on
                    } else {
                        TripOn::Slow
                    };
                    Breaker::new(BreakerConfig {
                        trip_on,
                        ..f.breaker
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        Defences {
            queue: QueueTime::new(f.queue_time, Self::pt(now)),
            breakers,
            opens: 0,
            degraded: false,
        }
    }

    /// Whether server `i` answers dependency `d`'s requests degraded now.
    pub(super) fn guard_open(&self, i: usize, d: usize) -> bool {
        self.defences[i]
            .breakers
            .get(d)
            .is_some_and(|b| b.state() != BreakerState::Closed)
    }

    /// The longest queue wait, seconds, that server `i`'s admission control lets stand at
    /// `now`; `None` when admission is off.
    pub(super) fn admission_wait(&self, i: usize, now: Time) -> Option<f64> {
        if self.cfg.fleet.admission != Switch::On {
            return None;
        }
        let pnow = Self::pt(now);
        let typical = self.service.median() + self.servers[i].slow.at(now);
        let expected = Duration::from_secs_f64(typical);
        let deadline = pnow + Duration::from_secs_f64(self.deadline);
        // Every attempt carries the balancer's deadline: the deadline bounds its wait
        // (rules 1 and 2 as `QueueTime::admit` applies them; zero when it cannot be met).
        let bound = self.defences[i]
            .queue
            .wait_bound(pnow, Some(deadline), expected);
        Some(bound.as_secs_f64())
    }

    /// After server `i` served this tick: its queue emptied (or not), and its calls to
    /// each dependency went to the breakers. `served` requests ran on its workers.
    pub(super) fn defences_after_tick(&mut self, i: usize, now: Time, served: u64) {
        let pnow = Self::pt(now);
        if self.servers[i].backlog == 0 {
            self.defences[i].queue.empty_at(pnow);
        }
        if self.defences[i].breakers.is_empty() {
            return;
        }
        let slow_call = self.cfg.fleet.breaker.slow_call.as_secs_f64();
        let mut degraded = false;
        for d in 0..self.deps.len() {
            let (err, extra) = self.dep_for(i, d, now);
            let latency = self.deps[d].latency.as_secs_f64() + extra;
            let calls = match self.defences[i].breakers[d].permit(pnow) {
                // The expected share, not a draw: the breaker needs a ratio.
                (Permit::Call, _) => (served as f64 * self.deps[d].request_fraction).round() as u64,
                (Permit::Trial, change) => {
                    if let Some(c) = change {
                        self.breaker_changed(i, d, &c);
                    }
                    // The trials of this tick (the first was just granted).
                    let mut n = 1;
                    while n < self.cfg.fleet.breaker.probes
                        && self.defences[i].breakers[d].permit(pnow).0 == Permit::Trial
                    {
                        n += 1;
                    }
                    u64::from(n)
                }
                (Permit::Degraded, _) => 0,
            };
            if calls > 0 {
                let trips_on_failed =
                    self.defences[i].breakers[d].config().trip_on == TripOn::SlowOrFailed;
                let bad = if latency > slow_call {
                    calls
                } else if err > 0.0 && trips_on_failed {
                    (calls as f64 * err).round() as u64
                } else {
                    0
                };
                let def = &mut self.defences[i];
                let u = hash_unit(self.seed, &[0xB4E, i as u64, d as u64, def.opens]);
                if let Some(change) = def.breakers[d].record(pnow, calls, bad, u) {
                    if matches!(
                        change,
                        BreakerChange::Opened { .. } | BreakerChange::Reopened { .. }
                    ) {
                        self.defences[i].opens += 1;
                    }
                    if matches!(change, BreakerChange::Opened { .. }) {
                        self.s.breaker_opens += 1;
                    }
                    self.breaker_changed(i, d, &change);
                }
            }
            degraded |= self.guard_open(i, d);
        }
        self.defences[i].degraded = degraded;
    }

    fn breaker_changed(&mut self, i: usize, d: usize, change: &BreakerChange) {
        let line = format!("{} {}: {change}", self.ctl_ids[i], self.dep_check_names[d]);
        // One server's breaker is news; twenty opening together are one event (the
        // summary counts them).
        if matches!(change, BreakerChange::Opened { .. }) && self.s.breaker_opens <= 3 {
            self.note(line);
        }
    }
}
