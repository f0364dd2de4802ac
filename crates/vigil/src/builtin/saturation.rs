//! `Saturation`: how busy the service's workers are.
//!
//! Two mechanisms, pick what the service has:
//! - [`Saturation::in_flight`]: the application counts requests in flight with an
//!   [`InFlight`] tracker (`let _guard = tracker.enter();` around each request), graded
//!   against the maximum it can serve at once;
//! - [`Saturation::shed`]: the in-flight count of the application's
//!   [`ShedLayer`](crate::ShedLayer), against its limit;
//! - [`Saturation::runtime_busy`]: the share of time the tokio runtime's workers spent
//!   busy since the previous check (`worker_total_busy_duration`, stable tokio
//!   metrics). Tokio folds a worker's busy time in when the worker parks or does its
//!   periodic maintenance, so a worker stuck in one long poll shows as busy only once it
//!   yields; the in-flight count has no such lag.

use super::{PercentLevels, percent_of, round2};
use crate::{Check, CheckResult, ShedStats};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vigil_core::Status;

/// Default warn level: 80% of capacity in use.
pub const DEFAULT_WARN_PERCENT: f64 = 80.0;
/// Default fail level: 100% of capacity: every worker is taken, a new request queues;
/// the load balancer should send it elsewhere.
pub const DEFAULT_FAIL_PERCENT: f64 = 100.0;
/// Default fail level of [`Saturation::runtime_busy`]: 95%. A runtime busy all the time
/// reads a little under 100% (the check's own sampling, parking between polls), so a
/// level of 100 would never be reached by a saturated runtime.
pub const DEFAULT_RUNTIME_BUSY_FAIL_PERCENT: f64 = 95.0;

/// Counts requests in flight; cheap to clone, shared by the app and the check.
#[derive(Clone, Debug, Default)]
pub struct InFlight {
    count: Arc<AtomicUsize>,
}

impl InFlight {
    /// A tracker at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one request in flight until the guard drops.
    pub fn enter(&self) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::Relaxed);
        InFlightGuard {
            count: Arc::clone(&self.count),
        }
    }

    /// Requests in flight now.
    pub fn current(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

/// One request in flight; dropping it (also on panic or cancellation) ends it.
#[derive(Debug)]
#[must_use = "the request counts as in flight only while the guard lives"]
pub struct InFlightGuard {
    count: Arc<AtomicUsize>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
enum Mechanism {
    InFlight {
        tracker: InFlight,
        max: usize,
    },
    Shed(Arc<ShedStats>),
    RuntimeBusy {
        handle: tokio::runtime::Handle,
        /// Wall time and total busy time at the previous check.
        last: Mutex<Option<(Instant, Duration)>>,
    },
}

/// Worker saturation; see the module docs.
#[derive(Debug)]
pub struct Saturation {
    mechanism: Mechanism,
    levels: PercentLevels,
}

impl Saturation {
    /// Grades requests in flight against `max`. Take the tracker with
    /// [`Saturation::tracker`] before registering the check.
    pub fn in_flight(max: usize) -> Self {
        assert!(max > 0, "Saturation::in_flight: max must be at least 1");
        Saturation {
            mechanism: Mechanism::InFlight {
                tracker: InFlight::new(),
                max,
            },
            levels: PercentLevels::new(DEFAULT_WARN_PERCENT, DEFAULT_FAIL_PERCENT),
        }
    }

    /// Grades requests counted by an existing tracker against `max`.
    pub fn with_tracker(tracker: InFlight, max: usize) -> Self {
        let mut s = Self::in_flight(max);
        s.mechanism = Mechanism::InFlight { tracker, max };
        s
    }

    /// Grades the application requests in flight through a [`ShedLayer`](crate::ShedLayer)
    /// (`health.shed_layer(n)` then `layer.stats()`) against its limit.
    pub fn shed(stats: Arc<ShedStats>) -> Self {
        Saturation {
            mechanism: Mechanism::Shed(stats),
            levels: PercentLevels::new(DEFAULT_WARN_PERCENT, DEFAULT_FAIL_PERCENT),
        }
    }

    /// Grades the busy share of the runtime behind `handle` between two checks. The
    /// first check only takes a baseline (and passes).
    pub fn runtime_busy(handle: tokio::runtime::Handle) -> Self {
        Saturation {
            mechanism: Mechanism::RuntimeBusy {
                handle,
                last: Mutex::new(None),
            },
            levels: PercentLevels::new(DEFAULT_WARN_PERCENT, DEFAULT_RUNTIME_BUSY_FAIL_PERCENT),
        }
    }

    /// The in-flight tracker the application counts with (`None` for `runtime_busy`).
    pub fn tracker(&self) -> Option<InFlight> {
        match &self.mechanism {
            Mechanism::InFlight { tracker, .. } => Some(tracker.clone()),
            Mechanism::Shed(_) | Mechanism::RuntimeBusy { .. } => None,
        }
    }

    /// Warns at this percentage of capacity. Defaults to 80.
    pub fn warn_at_percent(mut self, percent: f64) -> Self {
        self.levels.set_warn("Saturation", percent);
        self
    }

    /// Never warns, only fails.
    pub fn no_warn(mut self) -> Self {
        self.levels.clear_warn();
        self
    }

    /// Fails at this percentage of capacity. Defaults to 100 (95 for `runtime_busy`).
    pub fn fail_at_percent(mut self, percent: f64) -> Self {
        self.levels.set_fail("Saturation", percent);
        self
    }

    fn grade_count(&self, n: usize, max: usize) -> CheckResult {
        let used = percent_of(n as u64, max as u64);
        CheckResult::new(self.levels.grade(used))
            .with_observed(n, "count")
            .with_output(format!(
                "{n} of {max} requests in flight ({:.1}%); {}",
                round2(used),
                self.levels.describe()
            ))
    }

    fn observe(&self) -> CheckResult {
        match &self.mechanism {
            Mechanism::InFlight { tracker, max } => self.grade_count(tracker.current(), *max),
            Mechanism::Shed(stats) => self.grade_count(stats.in_flight(), stats.limit()),
            Mechanism::RuntimeBusy { handle, last } => {
                let metrics = handle.metrics();
                let workers = metrics.num_workers();
                let busy: Duration = (0..workers)
                    .map(|w| metrics.worker_total_busy_duration(w))
                    .sum();
                let now = Instant::now();
                let previous = last
                    .lock()
                    .expect("saturation sample lock poisoned")
                    .replace((now, busy));
                let Some((then, busy_then)) = previous else {
                    return CheckResult::new(Status::Pass).with_output(format!(
                        "runtime busy ratio: baseline taken over {workers} workers"
                    ));
                };
                let wall = now.saturating_duration_since(then).as_secs_f64() * workers as f64;
                let used = if wall <= 0.0 {
                    0.0
                } else {
                    (busy.saturating_sub(busy_then).as_secs_f64() * 100.0 / wall).min(100.0)
                };
                CheckResult::new(self.levels.grade(used))
                    .with_observed(round2(used), "percent")
                    .with_output(format!(
                        "runtime workers busy {:.1}% of the time since the last check ({workers} workers); {}",
                        round2(used),
                        self.levels.describe()
                    ))
            }
        }
    }
}

impl Check for Saturation {
    async fn check(&self) -> CheckResult {
        self.observe()
    }

    fn component_type(&self) -> &str {
        "system"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_counts_until_dropped() {
        let check = Saturation::in_flight(4);
        let tracker = check.tracker().expect("in-flight mechanism has a tracker");
        assert_eq!(check.observe().status, Status::Pass);
        let guards: Vec<_> = (0..4).map(|_| tracker.enter()).collect();
        let full = check.observe();
        assert_eq!(full.status, Status::Fail, "all 4 workers taken must fail");
        assert_eq!(full.observed_value, Some(4.into()));
        drop(guards);
        assert_eq!(tracker.current(), 0, "dropped guards must leave flight");
        assert_eq!(check.observe().status, Status::Pass);
    }
}
