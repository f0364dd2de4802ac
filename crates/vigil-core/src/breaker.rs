//! The dependency guard's breaker: when a dependency is slow or failing, stop calling it
//! and answer in the degraded mode instead of holding a worker on it.
//!
//! A request that waits on a slow dependency holds its worker for the whole wait: when
//! the dependency's latency passes the clients' timeout, every worker ends up waiting on
//! answers nobody reads, and requests that never touch that dependency starve too. The
//! Builders' Library's remedy ("Implementing health checks": serve cached reads while the
//! database is unavailable) must apply when the database is *slow*, not only when it
//! errors. The breaker is the classic circuit breaker (Nygard, "Release It!", as in
//! resilience4j and Hystrix) with slowness counted as failure (resilience4j's slow-call
//! rate):
//!
//! | state | calls | leaves when |
//! |---|---|---|
//! | **closed** | every call goes | of the last `window`'s calls (at least `min_calls`), the share that failed or took longer than `slow_call` reaches `failure_ratio`: **open** |
//! | **open** | none: the caller answers degraded at once | `open_for` passed (jittered by up to `jitter`, so a fleet of servers does not probe in step): **half-open** |
//! | **half-open** | `probes` calls go, the rest degraded | all `probes` succeeded in time: **closed**; any failed or slow: **open** again, for twice as long (up to `max_open_for`) |
//!
//! The caller draws the jitter (`u` in `0..1`) and passes the time, as everywhere in
//! vigil-core. The service reports the breaker's state in its `/health` as **warn** with
//! the reason ("open: 12 of 20 calls slower than 200ms"): degraded, still serving.

use crate::Invalid;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// Default slow-call threshold: 1 s. A call slower than that is treated as a failure.
pub const DEFAULT_SLOW_CALL: Duration = Duration::from_secs(1);
/// Default failure ratio: 50% of calls failed or slow (resilience4j's default).
pub const DEFAULT_FAILURE_RATIO: f64 = 0.5;
/// Default minimum calls in the window before the ratio means anything: 10.
pub const DEFAULT_MIN_CALLS: u32 = 10;
/// Default window: 10 s of calls.
pub const DEFAULT_BREAKER_WINDOW: Duration = Duration::from_secs(10);
/// Default first open time: 5 s.
pub const DEFAULT_OPEN_FOR: Duration = Duration::from_secs(5);
/// Default longest open time: 30 s (repeated failed probes double it up to this). It is
/// also the longest a service keeps answering degraded after its dependency is well
/// again: `vigil sim` (`scenarios/slow-dependency-retries.toml`) puts the fleet's
/// recovery at about this after a 15-minute slowdown, so it is kept well under a minute.
pub const DEFAULT_MAX_OPEN_FOR: Duration = Duration::from_secs(30);
/// Default trial calls when half-open: 3.
pub const DEFAULT_PROBES: u32 = 3;
/// Window slots: the window slides in tenths.
const SLOTS: usize = 10;

/// Which calls count as bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TripOn {
    /// Failed calls and calls slower than `slow_call` (the default): for a dependency
    /// whose degraded answer (a cache) serves better than its errors.
    #[default]
    SlowOrFailed,
    /// Slow calls only: for a dependency without a degraded answer. Failing at once
    /// what fails at once anyway helps no one, and would turn a dependency's 55% errors
    /// into 100% refused (`vigil sim`, `scenarios/fail-open-hovering.toml`); slowness is
    /// what holds workers.
    Slow,
}

/// [`Breaker`]'s settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// A call slower than this counts as failed. Defaults to 1 s.
    #[serde(with = "humantime_serde")]
    pub slow_call: Duration,
    /// Share of failed or slow calls that opens the breaker (0-1]. Defaults to 0.5.
    pub failure_ratio: f64,
    /// Calls in the window before it may open. Defaults to 10.
    pub min_calls: u32,
    /// The sliding window calls are counted over. Defaults to 10 s.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// How long it stays open the first time. Defaults to 5 s.
    #[serde(with = "humantime_serde")]
    pub open_for: Duration,
    /// The longest it stays open after repeated failed probes. Defaults to 30 s.
    #[serde(with = "humantime_serde")]
    pub max_open_for: Duration,
    /// Up to this share of the open time is added at random (0-1). Defaults to 0.2.
    pub jitter: f64,
    /// Trial calls when half-open. Defaults to 3.
    pub probes: u32,
    /// Which calls count as bad. Defaults to slow or failed.
    pub trip_on: TripOn,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            slow_call: DEFAULT_SLOW_CALL,
            failure_ratio: DEFAULT_FAILURE_RATIO,
            min_calls: DEFAULT_MIN_CALLS,
            window: DEFAULT_BREAKER_WINDOW,
            open_for: DEFAULT_OPEN_FOR,
            max_open_for: DEFAULT_MAX_OPEN_FOR,
            jitter: 0.2,
            probes: DEFAULT_PROBES,
            trip_on: TripOn::SlowOrFailed,
        }
    }
}

impl BreakerConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), Invalid> {
        if !(self.failure_ratio > 0.0 && self.failure_ratio <= 1.0) {
            return Err(Invalid::new(
                "failure_ratio",
                format!("{} is not within (0, 1]", self.failure_ratio),
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(Invalid::new(
                "jitter",
                format!("{} is not within 0-1", self.jitter),
            ));
        }
        if self.probes == 0 {
            return Err(Invalid::new("probes", "must be at least 1"));
        }
        if self.min_calls == 0 {
            return Err(Invalid::new("min_calls", "must be at least 1"));
        }
        if self.slow_call.is_zero() || self.window.is_zero() || self.open_for.is_zero() {
            return Err(Invalid::new(
                "slow_call",
                "slow_call, window and open_for must be above 0",
            ));
        }
        if self.max_open_for < self.open_for {
            return Err(Invalid::new(
                "max_open_for",
                format!(
                    "{:?} is shorter than open_for ({:?})",
                    self.max_open_for, self.open_for
                ),
            ));
        }
        Ok(())
    }
}

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go.
    Closed,
    /// No call goes until `until`.
    Open {
        /// When it turns half-open.
        until: Time,
    },
    /// Trial calls go: `started` of the `probes`, `passed` of them succeeded.
    HalfOpen {
        /// Trial calls let through.
        started: u32,
        /// Trial calls that succeeded in time.
        passed: u32,
    },
}

impl BreakerState {
    /// The metric label.
    pub fn name(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen { .. } => "half_open",
        }
    }
}

/// What the caller should do with a call now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Call the dependency.
    Call,
    /// Call it as a half-open trial (report its outcome as usual).
    Trial,
    /// Do not call: answer degraded.
    Degraded,
}

/// A change of state, with why: what the service logs and shows in `/health`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BreakerChange {
    /// Opened from closed: `bad` of `calls` in the window failed or were slow.
    Opened {
        /// Failed or slow calls.
        bad: u64,
        /// Calls in the window.
        calls: u64,
        /// Until when.
        until: Time,
    },
    /// A half-open trial failed or was slow: open again, for longer.
    Reopened {
        /// Until when.
        until: Time,
    },
    /// The open time passed: trials go.
    HalfOpened,
    /// Every trial succeeded.
    Closed,
}

impl fmt::Display for BreakerChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BreakerChange::Opened { bad, calls, .. } => write!(
                f,
                "open: {bad} of {calls} calls failed or were slow; answering degraded"
            ),
            BreakerChange::Reopened { .. } => {
                write!(f, "open again: a trial call failed or was slow")
            }
            BreakerChange::HalfOpened => write!(f, "half-open: trial calls go"),
            BreakerChange::Closed => write!(f, "closed: trial calls succeeded"),
        }
    }
}

/// The breaker (see the module doc).
#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: BreakerConfig,
    state: BreakerState,
    /// (slot start, calls, bad), oldest first.
    slots: Vec<(Time, u64, u64)>,
    /// The open time of the next opening.
    next_open: Duration,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: BreakerConfig) -> Self {
        Breaker {
            next_open: cfg.open_for,
            cfg,
            state: BreakerState::Closed,
            slots: Vec::with_capacity(SLOTS + 1),
        }
    }

    /// The state now (without moving on: see [`permit`](Self::permit)).
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// The settings.
    pub fn config(&self) -> &BreakerConfig {
        &self.cfg
    }

    /// Whether a call of `latency` that `ok` counts as bad (see [`TripOn`]).
    pub fn is_bad(&self, ok: bool, latency: Duration) -> bool {
        latency > self.cfg.slow_call || (!ok && self.cfg.trip_on == TripOn::SlowOrFailed)
    }

    /// What to do with a call at `now`; moves open to half-open when its time is over
    /// (returned as the change).
    pub fn permit(&mut self, now: Time) -> (Permit, Option<BreakerChange>) {
        let mut change = None;
        if let BreakerState::Open { until } = self.state
            && now >= until
        {
            self.state = BreakerState::HalfOpen {
                started: 0,
                passed: 0,
            };
            change = Some(BreakerChange::HalfOpened);
        }
        let permit = match &mut self.state {
            BreakerState::Closed => Permit::Call,
            BreakerState::Open { .. } => Permit::Degraded,
            BreakerState::HalfOpen { started, .. } if *started < self.cfg.probes => {
                *started += 1;
                Permit::Trial
            }
            BreakerState::HalfOpen { .. } => Permit::Degraded,
        };
        (permit, change)
    }

    fn window(&mut self, now: Time) -> (u64, u64) {
        let slot = self.cfg.window / SLOTS as u32;
        self.slots
            .retain(|&(start, _, _)| now.since(start) < self.cfg.window);
        if self
            .slots
            .last()
            .is_none_or(|&(start, _, _)| now.since(start) >= slot)
        {
            self.slots.push((now, 0, 0));
        }
        self.slots
            .iter()
            .fold((0, 0), |(c, b), &(_, cc, bb)| (c + cc, b + bb))
    }

    fn open(&mut self, now: Time, u: f64) -> Time {
        let jitter = self.next_open.mul_f64(self.cfg.jitter * u.clamp(0.0, 1.0));
        let until = now + self.next_open + jitter;
        self.next_open = (self.next_open * 2).min(self.cfg.max_open_for);
        self.state = BreakerState::Open { until };
        self.slots.clear();
        until
    }

    /// Reports `calls` calls that ended at `now`, `bad` of them failed or slow (see
    /// [`is_bad`](Self::is_bad)), as [`Permit::Call`]s or, when half-open, trials; `u`
    /// draws the jitter should it open. Returns the change, if any.
    pub fn record(&mut self, now: Time, calls: u64, bad: u64, u: f64) -> Option<BreakerChange> {
        let bad = bad.min(calls);
        match self.state {
            BreakerState::Closed => {
                let (c, b) = self.window(now);
                let last = self.slots.last_mut().expect("window pushes a slot");
                last.1 += calls;
                last.2 += bad;
                let (c, b) = (c + calls, b + bad);
                if c >= u64::from(self.cfg.min_calls)
                    && b as f64 >= self.cfg.failure_ratio * c as f64
                {
                    let until = self.open(now, u);
                    return Some(BreakerChange::Opened {
                        bad: b,
                        calls: c,
                        until,
                    });
                }
                None
            }
            // A call that started before the breaker opened and ends now tells nothing
            // new.
            BreakerState::Open { .. } => None,
            BreakerState::HalfOpen { started, passed } => {
                if bad > 0 {
                    let until = self.open(now, u);
                    return Some(BreakerChange::Reopened { until });
                }
                let passed = passed + calls as u32;
                if passed >= self.cfg.probes {
                    self.state = BreakerState::Closed;
                    self.next_open = self.cfg.open_for;
                    return Some(BreakerChange::Closed);
                }
                self.state = BreakerState::HalfOpen { started, passed };
                None
            }
        }
    }

    /// Calls and bad calls in the window now (for `/health` and metrics).
    pub fn counts(&mut self, now: Time) -> (u64, u64) {
        self.window(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secs(s: u64) -> Time {
        Time::from_secs(s)
    }

    #[test]
    fn failures_count_unless_it_trips_on_slowness_only() {
        let b = Breaker::new(BreakerConfig::default());
        assert!(b.is_bad(false, Duration::from_millis(10)));
        let b = Breaker::new(BreakerConfig {
            trip_on: TripOn::Slow,
            ..BreakerConfig::default()
        });
        assert!(!b.is_bad(false, Duration::from_millis(10)));
        assert!(b.is_bad(false, Duration::from_millis(1500)));
        assert!(b.is_bad(true, Duration::from_millis(1500)));
    }

    #[test]
    fn slow_calls_open_it_trials_close_it() {
        let mut b = Breaker::new(BreakerConfig::default());
        assert_eq!(b.permit(secs(0)).0, Permit::Call);
        assert!(b.is_bad(true, Duration::from_millis(1500)));
        assert!(!b.is_bad(true, Duration::from_millis(900)));
        // 9 calls are too few to judge, even all bad.
        assert_eq!(b.record(secs(1), 9, 9, 0.0), None);
        let Some(BreakerChange::Opened {
            bad: 10,
            calls: 10,
            until,
        }) = b.record(secs(1), 1, 1, 0.0)
        else {
            panic!("ten bad calls of ten open it: {:?}", b.state());
        };
        assert_eq!(until, secs(6));
        assert_eq!(b.permit(secs(5)).0, Permit::Degraded);
        assert_eq!(
            b.permit(secs(6)),
            (Permit::Trial, Some(BreakerChange::HalfOpened))
        );
        assert_eq!(b.permit(secs(6)).0, Permit::Trial);
        assert_eq!(b.permit(secs(6)).0, Permit::Trial);
        assert_eq!(
            b.permit(secs(6)).0,
            Permit::Degraded,
            "three trials at most"
        );
        assert_eq!(b.record(secs(7), 2, 0, 0.0), None);
        assert_eq!(b.record(secs(7), 1, 0, 0.0), Some(BreakerChange::Closed));
        assert_eq!(b.permit(secs(7)).0, Permit::Call);
    }

    #[test]
    fn a_failed_trial_doubles_the_open_time_up_to_the_max() {
        let cfg = BreakerConfig {
            jitter: 0.0,
            ..Default::default()
        };
        let mut b = Breaker::new(cfg);
        b.record(secs(0), 10, 10, 0.0);
        let mut t = 5;
        for expect in [10, 20, 30, 30] {
            b.permit(secs(t));
            let Some(BreakerChange::Reopened { until }) = b.record(secs(t), 1, 1, 0.0) else {
                panic!("a failed trial reopens");
            };
            assert_eq!(until, secs(t + expect));
            t += expect;
        }
    }

    #[test]
    fn the_ratio_is_over_the_window() {
        let mut b = Breaker::new(BreakerConfig::default());
        // 40% bad: stays closed.
        assert_eq!(b.record(secs(0), 100, 40, 0.0), None);
        // The old calls slide out; 6 of 10 bad now opens.
        assert_eq!(b.record(secs(11), 4, 0, 0.0), None);
        assert!(matches!(
            b.record(secs(11), 6, 6, 0.0),
            Some(BreakerChange::Opened {
                bad: 6,
                calls: 10,
                ..
            })
        ));
    }

    #[test]
    fn jitter_spreads_the_reopening() {
        let mut a = Breaker::new(BreakerConfig::default());
        let mut b = Breaker::new(BreakerConfig::default());
        let Some(BreakerChange::Opened { until: ua, .. }) = a.record(secs(0), 10, 10, 0.0) else {
            panic!()
        };
        let Some(BreakerChange::Opened { until: ub, .. }) = b.record(secs(0), 10, 10, 1.0) else {
            panic!()
        };
        assert_eq!(ub.since(ua), Duration::from_secs(1), "20% of 5 s");
    }

    proptest! {
        /// No call goes while open; at most `probes` while half-open; a breaker opens
        /// only on a window holding at least `min_calls` with the ratio reached.
        #[test]
        fn never_calls_while_open(
            steps in prop::collection::vec((0u64..3000, 0u64..20, 0u64..20, 0u32..4), 1..200),
        ) {
            let cfg = BreakerConfig::default();
            let mut b = Breaker::new(cfg);
            let mut now = Time::ZERO;
            let mut trials = 0u32;
            for (dt, calls, bad, asks) in steps {
                now = now + Duration::from_millis(dt);
                for _ in 0..asks {
                    let before = b.state();
                    let (p, _) = b.permit(now);
                    match b.state() {
                        BreakerState::Open { until } => {
                            prop_assert_eq!(p, Permit::Degraded);
                            prop_assert!(now < until);
                        }
                        BreakerState::HalfOpen { .. } => {
                            if !matches!(before, BreakerState::HalfOpen { .. }) { trials = 0; }
                            if p == Permit::Trial { trials += 1; }
                            prop_assert!(trials <= cfg.probes);
                        }
                        BreakerState::Closed => prop_assert_eq!(p, Permit::Call),
                    }
                }
                if let Some(BreakerChange::Opened { bad, calls, .. }) = b.record(now, calls, bad, 0.5) {
                    prop_assert!(calls >= u64::from(cfg.min_calls));
                    prop_assert!(bad as f64 >= cfg.failure_ratio * calls as f64);
                }
            }
        }
    }
}
