//! The dependency guard: a circuit breaker around a dependency's calls
//! (`vigil_core::breaker`), so a slow or failing dependency costs no worker.
//!
//! [`DependencyGuard::call`] runs a call under the breaker:
//! - **closed**: the call goes, bounded by its budget (`BreakerConfig::slow_call`): at the
//!   budget the guard gives up on it and answers [`Guarded::Degraded`] (a timeout is a
//!   bad call); an error is a bad call too ([`Guarded::Failed`]). When the share of bad
//!   calls in the window reaches `failure_ratio` (at least `min_calls` calls), it opens;
//! - **open**: no call goes: the caller gets [`Guarded::Degraded`] at once (no call, no
//!   worker held) and answers in its degraded mode (cached reads);
//! - **half-open**, after `open_for` plus a random jitter (up to `jitter` of it, so a
//!   fleet's servers do not probe the dependency in step): `probes` trial calls go; all
//!   good closes it, one bad reopens it for twice as long (up to `max_open_for`).
//!
//! [`DependencyGuard::check`] is a [`Check`] for `/health`: **warn** with the reason
//! while open or half-open (`postgres: open: 12 of 20 calls failed or were slow; serving
//! cached reads`), pass while closed. Register it as a dependency check (non-critical:
//! degraded is not down). A check that reads the guard's state never calls the
//! dependency, so it never queues behind the traffic it judges.

use crate::{Check, CheckResult, Status};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use vigil_core::breaker::{Breaker, Permit};
pub use vigil_core::breaker::{BreakerChange, BreakerConfig, BreakerState};
use vigil_core::time::Time;

/// What a guarded call gave.
#[derive(Debug)]
pub enum Guarded<T, E> {
    /// The call answered within its budget.
    Ok(T),
    /// The call failed (counted bad).
    Failed(E),
    /// No answer to use: the breaker is open (no call was made) or the call ran past
    /// its budget (given up, counted bad). Answer in the degraded mode.
    Degraded(Degraded),
}

/// Why a call was answered degraded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Degraded {
    /// The breaker is open (or half-open with its trials taken): no call was made.
    Open,
    /// The call ran past its budget and was given up.
    TimedOut,
}

struct Inner {
    breaker: Breaker,
    /// The reason of the last opening, for `/health`.
    reason: String,
}

/// See the module doc.
pub struct DependencyGuard {
    name: String,
    degraded_mode: String,
    epoch: Instant,
    inner: Mutex<Inner>,
    calls: [AtomicU64; 4],
}

/// The call outcomes counted, in the order of [`DependencyGuard::calls`].
pub const CALL_RESULTS: [&str; 4] = ["ok", "failed", "timed_out", "degraded"];

impl std::fmt::Debug for DependencyGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DependencyGuard")
            .field("name", &self.name)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl DependencyGuard {
    /// A closed guard for the dependency `name` (e.g. `postgres`); panics on an invalid
    /// config. `degraded_mode` says what the service does while open (`serving cached
    /// reads`), for `/health`.
    pub fn new(name: &str, cfg: BreakerConfig, degraded_mode: &str) -> Arc<Self> {
        if let Err(e) = cfg.validate() {
            panic!("vigil: invalid breaker config for {name}: {e}");
        }
        Arc::new(DependencyGuard {
            name: name.to_string(),
            degraded_mode: degraded_mode.to_string(),
            epoch: Instant::now(),
            inner: Mutex::new(Inner {
                breaker: Breaker::new(cfg),
                reason: String::new(),
            }),
            calls: Default::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Time {
        Time::from_elapsed(Instant::now().saturating_duration_since(self.epoch))
    }

    /// The dependency's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The breaker's state now.
    pub fn state(&self) -> BreakerState {
        self.lock().breaker.state()
    }

    /// The budget of one call (`slow_call`).
    pub fn budget(&self) -> Duration {
        self.lock().breaker.config().slow_call
    }

    /// Calls so far with `result` (a [`CALL_RESULTS`] label).
    pub fn calls(&self, result: &str) -> u64 {
        CALL_RESULTS
            .iter()
            .position(|r| *r == result)
            .map_or(0, |i| self.calls[i].load(Ordering::Relaxed))
    }

    fn log(&self, inner: &mut Inner, change: Option<BreakerChange>) {
        let Some(change) = change else { return };
        let text = format!("{change}");
        let text = text.replace("answering degraded", &self.degraded_mode);
        match change {
            BreakerChange::Opened { .. } | BreakerChange::Reopened { .. } => {
                tracing::warn!(dependency = %self.name, change = %text, "dependency breaker");
                inner.reason = text;
            }
            BreakerChange::HalfOpened | BreakerChange::Closed => {
                tracing::info!(dependency = %self.name, change = %text, "dependency breaker");
            }
        }
    }

    /// Runs `call` under the breaker (see the module doc), bounded by the budget.
    pub async fn call<T, E, F>(&self, call: F) -> Guarded<T, E>
    where
        F: Future<Output = Result<T, E>>,
    {
        self.call_within(Duration::MAX, call).await
    }

    /// [`DependencyGuard::call`] bounded by `limit` too, when it is shorter than the
    /// budget: what the caller's deadline leaves (less the time to answer). A call cut at
    /// `limit` counts as bad like one cut at the budget: the dependency did not answer in
    /// the time there was, and a breaker that ignored such cuts would never open while
    /// every caller's deadline is shorter than the budget (a balancer's per-try timeout).
    pub async fn call_within<T, E, F>(&self, limit: Duration, call: F) -> Guarded<T, E>
    where
        F: Future<Output = Result<T, E>>,
    {
        let (budget, trial) = {
            let mut st = self.lock();
            let (permit, change) = st.breaker.permit(self.now());
            self.log(&mut st, change);
            if permit == Permit::Degraded {
                self.calls[3].fetch_add(1, Ordering::Relaxed);
                return Guarded::Degraded(Degraded::Open);
            }
            (
                st.breaker.config().slow_call.min(limit),
                permit == Permit::Trial,
            )
        };
        let started = Instant::now();
        let mut pending = Pending {
            guard: self,
            started,
            trial,
            armed: true,
        };
        let outcome = tokio::time::timeout(budget, call).await;
        pending.armed = false;
        let took = started.elapsed();
        let (ok, result) = match outcome {
            Ok(Ok(v)) => (true, Guarded::Ok(v)),
            Ok(Err(e)) => (false, Guarded::Failed(e)),
            Err(_) => (false, Guarded::Degraded(Degraded::TimedOut)),
        };
        let i = match &result {
            Guarded::Ok(_) => 0,
            Guarded::Failed(_) => 1,
            Guarded::Degraded(_) => 2,
        };
        self.calls[i].fetch_add(1, Ordering::Relaxed);
        let mut st = self.lock();
        // A cut call is bad whatever `trip_on` says (it is a slow call) and whatever
        // `took` says (exactly the budget is not "slower than" it in paused time).
        let timed_out = matches!(result, Guarded::Degraded(Degraded::TimedOut));
        let bad = timed_out || st.breaker.is_bad(ok, took);
        let change = st
            .breaker
            .record(self.now(), 1, u64::from(bad), rand::random::<f64>());
        self.log(&mut st, change);
        result
    }

    /// Records a call whose caller went away before it ended (see [`Pending`]).
    fn cancelled(&self, started: Instant, trial: bool) {
        let mut st = self.lock();
        let slow = started.elapsed() > st.breaker.config().slow_call;
        if trial || slow {
            let change = st.breaker.record(self.now(), 1, 1, rand::random::<f64>());
            self.log(&mut st, change);
        }
    }

    /// A check for `/health`: warn with the reason while open or half-open.
    pub fn check(self: &Arc<Self>) -> GuardCheck {
        GuardCheck {
            guard: self.clone(),
        }
    }
}

/// A call in progress. If its future is dropped before the call ends (the client
/// disconnected, the balancer cancelled the attempt), the breaker still hears of it: a
/// half-open trial that never reported would keep the breaker half-open for good (its
/// trials all handed out, none recorded), so a cancelled trial counts as bad (the
/// breaker opens again and tries later); a cancelled call already slower than the
/// budget counts as slow; any other says nothing.
struct Pending<'a> {
    guard: &'a DependencyGuard,
    started: Instant,
    trial: bool,
    armed: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.guard.cancelled(self.started, self.trial);
        }
    }
}

/// See [`DependencyGuard::check`].
#[derive(Debug)]
pub struct GuardCheck {
    guard: Arc<DependencyGuard>,
}

impl Check for GuardCheck {
    async fn check(&self) -> CheckResult {
        let g = &self.guard;
        let now = g.now();
        let mut st = g.lock();
        let state = st.breaker.state();
        let (calls, bad) = st.breaker.counts(now);
        match state {
            BreakerState::Closed => CheckResult::new(Status::Pass)
                .with_observed(0, "state")
                .with_output(format!(
                    "{}: closed: {bad} of {calls} recent calls failed or were slow",
                    g.name
                )),
            BreakerState::Open { until } => {
                // The breaker moves on at a call: without calls, its time may be over.
                let when = match until.since(now) {
                    left if left.is_zero() => "trial calls at the next call".to_string(),
                    left => format!(
                        "trial calls in {}",
                        // Whole milliseconds: "4s 998ms", not its nanoseconds.
                        humantime::format_duration(Duration::from_millis(left.as_millis() as u64))
                    ),
                };
                CheckResult::new(Status::Warn)
                    .with_observed(2, "state")
                    .with_output(format!("{}: {} ({when})", g.name, st.reason))
            }
            BreakerState::HalfOpen { .. } => {
                let reason = std::mem::take(&mut st.reason);
                st.reason = reason.clone();
                CheckResult::new(Status::Warn)
                    .with_observed(1, "state")
                    .with_output(format!(
                        "{}: half-open: trial calls go (after {reason}); {}",
                        g.name, g.degraded_mode
                    ))
            }
        }
    }

    fn component_type(&self) -> &str {
        "component"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            slow_call: Duration::from_millis(100),
            min_calls: 4,
            jitter: 0.0,
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn slow_calls_are_cut_at_the_budget_and_open_the_breaker() {
        let g = DependencyGuard::new("postgres", cfg(), "serving cached reads");
        for _ in 0..4 {
            let started = Instant::now();
            let r = g
                .call(async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Ok::<_, ()>(1)
                })
                .await;
            assert!(matches!(r, Guarded::Degraded(Degraded::TimedOut)));
            assert_eq!(
                started.elapsed(),
                Duration::from_millis(100),
                "cut at the budget"
            );
        }
        assert!(matches!(g.state(), BreakerState::Open { .. }));
        let started = Instant::now();
        let r = g.call(async { Ok::<_, ()>(1) }).await;
        assert!(matches!(r, Guarded::Degraded(Degraded::Open)));
        assert_eq!(started.elapsed(), Duration::ZERO, "no call while open");
        let c = g.check().check().await;
        assert_eq!(c.status, Status::Warn);
        let out = c.output.unwrap();
        assert!(
            out.starts_with(
                "postgres: open: 4 of 4 calls failed or were slow; serving cached reads"
            ),
            "{out}"
        );
        // Half-open after open_for: three good trials close it.
        tokio::time::sleep(Duration::from_secs(5)).await;
        for _ in 0..3 {
            assert!(matches!(
                g.call(async { Ok::<_, ()>(1) }).await,
                Guarded::Ok(1)
            ));
        }
        assert_eq!(g.state(), BreakerState::Closed);
        assert_eq!(g.check().check().await.status, Status::Pass);
        assert_eq!(g.calls("timed_out"), 4);
        assert_eq!(g.calls("degraded"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_limit_cuts_the_call_and_counts_it_bad() {
        let g = DependencyGuard::new("postgres", cfg(), "serving cached reads");
        for _ in 0..4 {
            let started = Instant::now();
            let r = g
                .call_within(Duration::from_millis(30), async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, ()>(1)
                })
                .await;
            assert!(matches!(r, Guarded::Degraded(Degraded::TimedOut)));
            assert_eq!(
                started.elapsed(),
                Duration::from_millis(30),
                "cut at the caller's limit, under the 100 ms budget"
            );
        }
        assert!(
            matches!(g.state(), BreakerState::Open { .. }),
            "calls cut at the caller's limit open the breaker: {g:?}"
        );
        // A limit above the budget does not lengthen it.
        let g = DependencyGuard::new("postgres", cfg(), "serving cached reads");
        let started = Instant::now();
        let r = g
            .call_within(Duration::from_secs(10), async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, ()>(1)
            })
            .await;
        assert!(matches!(r, Guarded::Degraded(Degraded::TimedOut)));
        assert_eq!(started.elapsed(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_trials_do_not_leave_the_breaker_half_open() {
        let g = DependencyGuard::new("postgres", cfg(), "serving cached reads");
        let slow = || async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, ()>(1)
        };
        for _ in 0..4 {
            g.call(slow()).await;
        }
        assert!(matches!(g.state(), BreakerState::Open { .. }));
        tokio::time::sleep(Duration::from_secs(5)).await;
        // The trial's caller goes away before the trial ends.
        let cut = tokio::time::timeout(Duration::from_millis(10), g.call(slow())).await;
        assert!(cut.is_err(), "the caller gave up first");
        assert!(
            matches!(g.state(), BreakerState::Open { .. }),
            "a cancelled trial reopens it, it does not leave it half-open: {g:?}"
        );
        // And it tries again later: good trials close it.
        tokio::time::sleep(Duration::from_secs(30)).await;
        for _ in 0..3 {
            assert!(matches!(
                g.call(async { Ok::<_, ()>(1) }).await,
                Guarded::Ok(1)
            ));
        }
        assert_eq!(g.state(), BreakerState::Closed);
    }
}
