//! A target pool as the balancer sees it: who may get traffic, fail-open, slow start.
//!
//! This module holds the sans-IO routing policies of one pool of targets. A driver (the
//! load balancer, or the simulator) feeds observations in and asks who to route to; the
//! types here never read a clock, draw a random number, or do I/O: `now` and randomness
//! are parameters.
//!
//! - [`Pool`]: per target the active-check verdict ([`Thresholds`]), the passive outlier
//!   state ([`OutlierDetector`]), a weight and a slow-start ramp; pool-wide fail-open.
//! - [`RoutingSet`]: an immutable snapshot of who may get traffic and with what weight,
//!   with the two selection policies: [`RoutingSet::pick_p2c`] (power of two choices on
//!   outstanding requests, based on tower's p2c) and [`RoutingSet::pick_round_robin`].
//! - [`ShedPenalty`]: shed answers (503, 429) count as load for balancing, never as a
//!   host failure (see the outlier module's rule 5).
//! - [`RetryBudget`]: may this request be retried (or hedged) without amplifying an
//!   outage (based on Finagle's `RetryBudget` / linkerd's retry budget).
//!
//! # Driving a pool
//!
//! ```
//! use vigil_core::pool::{Pool, PoolConfig, PoolEvent, TargetSpec};
//! use vigil_core::outlier::RequestOutcome;
//! use vigil_core::Time;
//!
//! let mut pool = Pool::new("api", PoolConfig::default());
//! for t in ["a:80", "b:80", "c:80", "d:80"] {
//!     pool.add_target(t, TargetSpec::default(), Time::ZERO);
//! }
//! // New targets are Unknown (no traffic) until checked: default healthy_threshold is 2.
//! for s in 1..=2 {
//!     for t in ["a:80", "b:80", "c:80", "d:80"] {
//!         pool.observe_probe(&t, Time::from_secs(s), true, "HTTP 200 pass");
//!     }
//! }
//! let routes = pool.routing_set(Time::from_secs(2));
//! assert_eq!(routes.len(), 4);
//! // Pick with P2C: the caller supplies two random numbers and the outstanding counts.
//! let picked = routes.pick_p2c(Time::from_secs(2), [7, 42], |_t| 0, |_t| false);
//! assert!(picked.is_some());
//! // Report what happened to requests; 5 x 500 ejects (outlier detection).
//! for _ in 0..5 {
//!     pool.observe_request(&"a:80", Time::from_secs(3), RequestOutcome::Response(500), 0.0);
//! }
//! assert_eq!(pool.routing_set(Time::from_secs(3)).len(), 3);
//! // Call tick() regularly: it readmits targets whose ejection ended.
//! let events = pool.tick(Time::from_secs(40));
//! assert!(events.iter().any(|e| matches!(e, PoolEvent::Outlier { .. })));
//! ```
//!
//! # Rules
//!
//! **In service.** A target is *in service* when its active-check verdict is
//! [`HealthState::Healthy`], outlier detection has not ejected it and it is not drained. Active checks go through
//! [`Pool::observe_probe`] (`ok` = the check passed; a health+json `warn` is `ok`),
//! request outcomes through [`Pool::observe_request`], and [`Pool::tick`] readmits
//! targets whose ejection time ended. A new target starts [`HealthState::Unknown`] and gets no
//! traffic until `healthy_threshold` checks pass, unless
//! [`PoolConfig::new_targets`] is [`NewTargets::Healthy`] (e.g. no active checks).
//!
//! **Fail-open (panic mode, Envoy's `healthy_panic_threshold`).** The healthy fraction
//! is `in service / targets with a verdict` (unknown targets are left out: they are not
//! evidence of anything, and adding new targets must not trigger panic). When it falls
//! *below* [`PoolConfig::panic_threshold`] (default 0.5), the pool fails open: the
//! routing set is *every* target at full weight, because a health check that takes out
//! most of a fleet at once is more likely broken itself (or measuring a shared
//! dependency) than right, and serving from all is better than serving from none or
//! from a few overloaded survivors. Both transitions are [`PoolEvent::FailOpen`] events
//! whose `Display` says why, e.g. `pool api: 1/4 healthy < 50% panic threshold: failing
//! open`. A pool whose targets are all unknown is *warming*: nothing to route to, no
//! fail-open.
//!
//! **Leaving fail-open (hysteresis).** A pool whose healthy fraction hovers around the
//! threshold (a growing random fraction of check timeouts) would otherwise enter and
//! leave fail-open several times a minute, and each exit would dump the whole load on the
//! few targets still in service at once. So the exit is harder than the entry:
//!
//! 1. *Margin.* It leaves only when the fraction is at or above `panic_threshold +
//!    panic_exit_margin` (default 0.1: 60% healthy for the default 50% threshold).
//! 2. *Dwell.* The fraction must have stayed at or above that level for
//!    `panic_exit_dwell` (default 30 s) without a break; any dip below it restarts the
//!    wait. Checked on every observation and on [`Pool::tick`];
//!    [`Pool::next_deadline`] says when the wait ends.
//! 3. *Ramp down.* On leaving, the targets out of service keep their full share and lose
//!    it linearly over `panic_exit_ramp` (default 20 s), the mirror of slow start, so
//!    the targets in service take the load over gradually rather than all at once. The
//!    routing set carries the ramp ([`RampDirection::Down`]); a target that comes back
//!    during it has its ordinary weight. Falling below the threshold again during the
//!    ramp re-enters fail-open at once.
//!
//! Entering stays immediate: it protects the survivors. Every exit needs one period of
//! at least `panic_exit_dwell` above the exit level, so the number of fail-open episodes
//! is bounded by the number of such periods (a proptest checks it), however the fraction
//! hovers.
//!
//! **Slow start (Envoy's slow start mode).** A target that enters service (first
//! verdict, recovery, or readmission after an ejection) gets an effective weight that
//! rises linearly from `slow_start_min_weight x weight` to `weight` over
//! `slow_start_window`, so it is not flooded with a full share of traffic while its
//! caches and connection pools are cold. Routing sets carry the ramp; the effective
//! weight is computed at pick time from `now`, so a snapshot need not be rebuilt while
//! the ramp advances.
//!
//! **Drain (lame duck).** An operator (or a deployer) may *drain* a target
//! ([`Pool::set_drained`]): it gets no new request, not even in fail-open, while its
//! health checks, outlier state and ejections go on; undraining puts it back (through
//! slow start, as any target entering service). A drained target is out of service yet
//! not a failure: it is left out of the healthy fraction like a target not checked yet,
//! so draining hosts for a deploy never drives a pool into fail-open (which would route
//! to them again). Requests it already has are the driver's to let finish.
//!
//! **Selection.** Both pickers take a `skip` predicate (targets already tried by this
//! request, for retries) and never return a skipped target. P2C samples two distinct
//! candidates with probability proportional to effective weight, then takes the one with
//! fewer outstanding requests (`load`, the caller's count); ties go to the first sample.
//! Round-robin takes the caller's counter (an atomic incremented per request) and walks
//! the candidates in order, each getting a share proportional to its effective weight.
//!
//! **Events.** Every method that changes state returns the [`PoolEvent`]s it caused,
//! with a `Display` suitable for a log line that says what changed and why.
//! [`PoolEvent::left_service`] names the target that stopped getting traffic (the
//! balancer uses it to retry that target's in-flight requests elsewhere at once).

mod retry_budget;
mod selection;
mod success_rate;

use crate::invalid::Invalid;
use crate::outlier::{Ejection, OutlierConfig, OutlierDetector, OutlierEvent, RequestOutcome};
use crate::thresholds::{HealthState, Thresholds, ThresholdsConfig};
use crate::time::Time;
pub use retry_budget::{
    DEFAULT_MIN_RETRIES_PER_SECOND, DEFAULT_RETRY_RATIO, DEFAULT_RETRY_WINDOW, RetryBudget,
    RetryBudgetConfig,
};
pub use selection::{
    DEFAULT_SHED_PENALTY_HALF_LIFE, Ramp, RampDirection, Route, RoutingSet, ShedPenalty,
};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;
pub use success_rate::{Due, Judgement, SuccessRateRule, too_few_peers};

/// Default panic threshold: fail open below 50% healthy, Envoy's default. Below half,
/// the survivors would carry more than twice their share; a check taking out half a
/// fleet at once is more likely wrong than right.
pub const DEFAULT_PANIC_THRESHOLD: f64 = 0.5;
/// Default slow-start window: 10 s, long enough to warm a target's caches and connection
/// pools under a growing share, short next to the 30 s base ejection time.
pub const DEFAULT_SLOW_START_WINDOW: Duration = Duration::from_secs(10);
/// Default weight at the start of the ramp: 10% of the target's weight (Envoy's
/// `min_weight_percent`), so a readmitted target gets some traffic to prove itself.
pub const DEFAULT_SLOW_START_MIN_WEIGHT: f64 = 0.1;
/// Default target weight: 1 (all targets equal).
pub const DEFAULT_WEIGHT: u32 = 1;
/// Default exit margin: leave fail-open only at `panic_threshold + 0.1` healthy (60% for
/// the default threshold). A target flapping on its checks moves a pool of ten by 0.1; the
/// margin means one flapping target cannot take the pool in and out of fail-open.
pub const DEFAULT_PANIC_EXIT_MARGIN: f64 = 0.1;
/// Default dwell: the healthy fraction must stay at the exit level for 30 s before the
/// pool leaves fail-open. That is three full check cycles at the default checks (2 s
/// interval x (3 to fall + 2 to rise) = 10 s): a recovery that lasts that long is not a
/// flapping target's lucky streak.
pub const DEFAULT_PANIC_EXIT_DWELL: Duration = Duration::from_secs(30);
/// Default ramp down on leaving fail-open: 20 s, twice slow start's window, because it
/// moves a larger share (up to half the traffic) onto the targets in service.
pub const DEFAULT_PANIC_EXIT_RAMP: Duration = Duration::from_secs(20);

/// What a new target's verdict is before any active check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NewTargets {
    /// Unknown: no traffic until `healthy_threshold` checks pass. Defaults to this.
    #[default]
    Unknown,
    /// Healthy until `unhealthy_threshold` checks fail (for pools without active checks).
    Healthy,
}

/// One pool's routing policy settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Fail open when the healthy fraction falls below this (0 to 1; 0 never fails
    /// open). Defaults to 0.5.
    pub panic_threshold: f64,
    /// Leave fail-open only at or above `panic_threshold` plus this (0 to 1).
    /// Defaults to 0.1.
    pub panic_exit_margin: f64,
    /// The healthy fraction must stay at the exit level this long before the pool
    /// leaves fail-open (0: at once). Defaults to 30s.
    #[serde(with = "humantime_serde")]
    pub panic_exit_dwell: Duration,
    /// On leaving fail-open, the targets out of service lose their share linearly over
    /// this time (0: at once). Defaults to 20s.
    #[serde(with = "humantime_serde")]
    pub panic_exit_ramp: Duration,
    /// Time over which a target entering service ramps up to its full weight (0
    /// disables slow start). Defaults to 10s.
    #[serde(with = "humantime_serde")]
    pub slow_start_window: Duration,
    /// Fraction of its weight a target gets at the start of the ramp (0 to 1).
    /// Defaults to 0.1.
    pub slow_start_min_weight: f64,
    /// Verdict of a target before its first checks. Defaults to `unknown`.
    pub new_targets: NewTargets,
    /// Rise/fall thresholds of the active checks.
    pub thresholds: ThresholdsConfig,
    /// Passive outlier detection.
    pub outlier: OutlierConfig,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            panic_threshold: DEFAULT_PANIC_THRESHOLD,
            panic_exit_margin: DEFAULT_PANIC_EXIT_MARGIN,
            panic_exit_dwell: DEFAULT_PANIC_EXIT_DWELL,
            panic_exit_ramp: DEFAULT_PANIC_EXIT_RAMP,
            slow_start_window: DEFAULT_SLOW_START_WINDOW,
            slow_start_min_weight: DEFAULT_SLOW_START_MIN_WEIGHT,
            new_targets: NewTargets::Unknown,
            thresholds: ThresholdsConfig::default(),
            outlier: OutlierConfig::default(),
        }
    }
}

impl PoolConfig {
    /// Checks the values; the error names the bad key (`outlier.` and `thresholds.`
    /// prefixed for the nested ones).
    pub fn validate(&self) -> Result<(), Invalid> {
        if !(0.0..=1.0).contains(&self.panic_threshold) {
            return Err(Invalid::new(
                "panic_threshold",
                format!(
                    "must be a fraction between 0 and 1 (0.5 = 50%), got {}",
                    self.panic_threshold
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.panic_exit_margin) {
            return Err(Invalid::new(
                "panic_exit_margin",
                format!(
                    "must be a fraction between 0 and 1 (0.1 = 10 points above panic_threshold), got {}",
                    self.panic_exit_margin
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.slow_start_min_weight) {
            return Err(Invalid::new(
                "slow_start_min_weight",
                format!(
                    "must be between 0 and 1, got {}",
                    self.slow_start_min_weight
                ),
            ));
        }
        self.thresholds
            .validate()
            .map_err(|e| e.within("thresholds"))?;
        self.outlier.validate().map_err(|e| e.within("outlier"))?;
        Ok(())
    }
}

/// A target's static description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    /// Relative share of traffic (0 = never any traffic, even in fail-open).
    pub weight: u32,
    /// Zone (informational here; reported in views).
    pub zone: Option<String>,
}

impl Default for TargetSpec {
    fn default() -> Self {
        TargetSpec {
            weight: DEFAULT_WEIGHT,
            zone: None,
        }
    }
}

/// The last active check of a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastProbe {
    /// When it completed.
    pub at: Time,
    /// Whether it passed.
    pub ok: bool,
    /// What it saw (status code, health+json status, error).
    pub detail: String,
}

/// Where a target stands, as one word (for admin views and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetState {
    /// Not checked enough yet: no traffic.
    Unknown,
    /// In service at full weight.
    Healthy,
    /// In service, ramping up after entering service.
    SlowStart,
    /// Active checks say it is down.
    Unhealthy,
    /// Ejected by outlier detection.
    Ejected,
    /// Drained by an operator: no new traffic.
    Drained,
}

impl fmt::Display for TargetState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TargetState::Unknown => "unknown",
            TargetState::Healthy => "healthy",
            TargetState::SlowStart => "slow-start",
            TargetState::Unhealthy => "unhealthy",
            TargetState::Ejected => "ejected",
            TargetState::Drained => "drained",
        })
    }
}

/// A change in a pool.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolEvent<K> {
    /// The active checks' verdict on a target changed.
    Health {
        /// The pool.
        pool: String,
        /// The target.
        target: K,
        /// Verdict before.
        from: HealthState,
        /// Verdict after.
        to: HealthState,
        /// Consecutive checks that caused it.
        streak: u32,
        /// What the last check saw.
        detail: String,
    },
    /// Outlier detection ejected, readmitted, or declined to eject a target.
    Outlier {
        /// The pool.
        pool: String,
        /// What happened.
        event: OutlierEvent<K>,
    },
    /// The pool entered (`entered`) or left fail-open.
    FailOpen {
        /// The pool.
        pool: String,
        /// True when entering fail-open, false when leaving.
        entered: bool,
        /// Targets in service.
        healthy: usize,
        /// Targets with a verdict (the denominator).
        known: usize,
        /// Every target of the pool, unknown and drained ones included (for the log line:
        /// a pool of two with one unknown is "0/2 healthy (1 not checked yet)", not "0/1").
        total: usize,
        /// Drained targets (out of the fraction as unknown ones are).
        drained: usize,
        /// The panic threshold.
        threshold: f64,
        /// The fraction the pool had to reach to leave (threshold + exit margin).
        exit_level: f64,
        /// How long it had to stay there (leaving only).
        dwell: Duration,
        /// Over how long the targets out of service lose their share (leaving only).
        ramp: Duration,
    },
}

impl<K: Clone> PoolEvent<K> {
    /// The target that stopped getting traffic through this event, if any: it went
    /// unhealthy or was ejected. (In fail-open the pool still routes to it; check
    /// [`Pool::fail_open`].)
    pub fn left_service(&self) -> Option<&K> {
        match self {
            PoolEvent::Health {
                target,
                from: HealthState::Healthy,
                to: HealthState::Unhealthy,
                ..
            } => Some(target),
            PoolEvent::Outlier {
                event: OutlierEvent::Ejected { target, .. },
                ..
            } => Some(target),
            _ => None,
        }
    }
}

impl<K: fmt::Display> fmt::Display for PoolEvent<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolEvent::Health {
                pool,
                target,
                from,
                to,
                streak,
                detail,
            } => {
                let what = if *to == HealthState::Healthy {
                    "passed"
                } else {
                    "failed"
                };
                write!(
                    f,
                    "pool {pool}: target {target} {to} (was {from}) after {streak} {what} checks; last: {detail}"
                )
            }
            PoolEvent::Outlier { pool, event } => write!(f, "pool {pool}: {event}"),
            PoolEvent::FailOpen {
                pool,
                entered: true,
                healthy,
                known,
                total,
                drained,
                threshold,
                ..
            } => write!(
                f,
                "pool {pool}: {} < {}% panic threshold: failing open (routing to all targets)",
                HealthyCounts(*healthy, *known, *total, *drained),
                percent(*threshold)
            ),
            PoolEvent::FailOpen {
                pool,
                entered: false,
                healthy,
                known,
                total,
                drained,
                threshold,
                exit_level,
                dwell,
                ramp,
            } => {
                write!(
                    f,
                    "pool {pool}: {} >= {}% (panic threshold {}% + margin) for {}: fail-open ended",
                    HealthyCounts(*healthy, *known, *total, *drained),
                    percent(*exit_level),
                    percent(*threshold),
                    humantime::format_duration(*dwell)
                )?;
                if !ramp.is_zero() {
                    write!(
                        f,
                        ", unhealthy targets' share ramping down over {}",
                        humantime::format_duration(*ramp)
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Healthy targets out of every target, saying how many are left out of the fraction
/// for want of a verdict or because they are drained: `1/4 healthy`, `0/2 healthy (1
/// not checked yet, left out of the fraction)`, `2/4 healthy (1 drained, left out of
/// the fraction)`.
struct HealthyCounts(usize, usize, usize, usize);

impl fmt::Display for HealthyCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let HealthyCounts(healthy, known, total, drained) = *self;
        write!(f, "{healthy}/{total} healthy")?;
        let unknown = total.saturating_sub(known + drained);
        match (unknown, drained) {
            (0, 0) => {}
            (u, 0) => write!(f, " ({u} not checked yet, left out of the fraction)")?,
            (0, d) => write!(f, " ({d} drained, left out of the fraction)")?,
            (u, d) => write!(
                f,
                " ({u} not checked yet and {d} drained, left out of the fraction)"
            )?,
        }
        Ok(())
    }
}

fn percent(fraction: f64) -> String {
    let p = fraction * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{}", p.round() as i64)
    } else {
        format!("{p:.1}")
    }
}

#[derive(Clone, Debug)]
struct Member<K> {
    key: K,
    spec: TargetSpec,
    thresholds: Thresholds,
    last_probe: Option<LastProbe>,
    /// When it last entered service (starts the slow-start ramp).
    entered_service: Option<Time>,
    /// Drained: no new traffic, left out of the healthy fraction.
    drained: bool,
}

/// A read-only view of one target, for admin endpoints and metrics.
#[derive(Clone, Debug)]
pub struct TargetView<'a, K> {
    /// The target.
    pub key: &'a K,
    /// Its weight and zone.
    pub spec: &'a TargetSpec,
    /// The one-word state.
    pub state: TargetState,
    /// The active checks' verdict.
    pub health: HealthState,
    /// When that verdict began.
    pub health_since: Time,
    /// The last active check.
    pub last_probe: Option<&'a LastProbe>,
    /// The current ejection, if any.
    pub ejection: Option<Ejection>,
    /// How many times outlier detection ejected it.
    pub ejections: u32,
    /// Its effective weight now (slow start applied; 0 when out of service).
    pub effective_weight: f64,
    /// Whether it is drained ([`Pool::set_drained`]).
    pub drained: bool,
}

/// One pool: its targets' health and ejections, and fail-open. See the module docs.
#[derive(Clone, Debug)]
pub struct Pool<K> {
    name: String,
    config: PoolConfig,
    members: Vec<Member<K>>,
    outlier: OutlierDetector<K>,
    /// Since when the pool is in fail-open.
    fail_open: Option<Time>,
    /// In fail-open: since when the healthy fraction is at or above the exit level.
    recovered_since: Option<Time>,
    /// When the pool last left fail-open (the targets out of service ramp down from it).
    left_fail_open: Option<Time>,
}

impl<K: Ord + Clone> Pool<K> {
    /// An empty pool.
    pub fn new(name: impl Into<String>, config: PoolConfig) -> Self {
        Pool {
            name: name.into(),
            outlier: OutlierDetector::new(config.outlier),
            config,
            members: Vec::new(),
            fail_open: None,
            recovered_since: None,
            left_fail_open: None,
        }
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Replaces the configuration (a reload) keeping every target's verdict, streaks
    /// and ejections. Returns the fail-open change it caused, if any.
    pub fn reconfigure(&mut self, config: PoolConfig, now: Time) -> Vec<PoolEvent<K>> {
        self.config = config;
        self.outlier.reconfigure(config.outlier);
        for m in &mut self.members {
            m.thresholds.reconfigure(config.thresholds);
        }
        self.update_fail_open(now).into_iter().collect()
    }

    /// Adds a target, or updates the spec of a known one (keeping its state).
    pub fn add_target(&mut self, key: K, spec: TargetSpec, now: Time) -> Vec<PoolEvent<K>> {
        if let Some(m) = self.members.iter_mut().find(|m| m.key == key) {
            m.spec = spec;
            return Vec::new();
        }
        let thresholds = match self.config.new_targets {
            NewTargets::Unknown => Thresholds::new_unknown(self.config.thresholds, now),
            NewTargets::Healthy => Thresholds::new_healthy(self.config.thresholds, now),
        };
        self.outlier.add_target(key.clone());
        self.members.push(Member {
            key,
            spec,
            thresholds,
            last_probe: None,
            entered_service: None,
            drained: false,
        });
        self.update_fail_open(now).into_iter().collect()
    }

    /// Removes a target and its history.
    pub fn remove_target(&mut self, key: &K, now: Time) -> Vec<PoolEvent<K>> {
        self.members.retain(|m| &m.key != key);
        self.outlier.remove_target(key);
        self.update_fail_open(now).into_iter().collect()
    }

    /// Makes the target set exactly `targets`: known targets keep their state (and get
    /// the new spec), new ones start per [`PoolConfig::new_targets`], missing ones go.
    pub fn set_targets(
        &mut self,
        targets: impl IntoIterator<Item = (K, TargetSpec)>,
        now: Time,
    ) -> Vec<PoolEvent<K>> {
        let targets: Vec<(K, TargetSpec)> = targets.into_iter().collect();
        let gone: Vec<K> = self
            .members
            .iter()
            .filter(|m| !targets.iter().any(|(k, _)| *k == m.key))
            .map(|m| m.key.clone())
            .collect();
        for k in &gone {
            self.members.retain(|m| &m.key != k);
            self.outlier.remove_target(k);
        }
        let mut events = Vec::new();
        for (k, spec) in targets {
            events.extend(self.add_target(k, spec, now));
        }
        events.extend(self.update_fail_open(now));
        events
    }

    /// Records an active check's result on `key`; `detail` says what it saw (logged
    /// with the transition it may cause). Unknown keys are ignored.
    pub fn observe_probe(
        &mut self,
        key: &K,
        now: Time,
        ok: bool,
        detail: impl Into<String>,
    ) -> Vec<PoolEvent<K>> {
        let Some(i) = self.index(key) else {
            return Vec::new();
        };
        let detail = detail.into();
        let was_in = self.in_service(i);
        let m = &mut self.members[i];
        m.last_probe = Some(LastProbe {
            at: now,
            ok,
            detail: detail.clone(),
        });
        let mut events = Vec::new();
        if let Some(t) = m.thresholds.observe(now, ok) {
            events.push(PoolEvent::Health {
                pool: self.name.clone(),
                target: key.clone(),
                from: t.from,
                to: t.to,
                streak: t.streak,
                detail,
            });
        }
        if !was_in && self.in_service(i) {
            self.members[i].entered_service = Some(now);
        }
        events.extend(self.update_fail_open(now));
        events
    }

    /// Records the outcome of a request forwarded to `key` (passive outlier detection).
    /// `jitter` in `[0, 1)` is the caller's random fraction, used only if this ejects.
    pub fn observe_request(
        &mut self,
        key: &K,
        now: Time,
        outcome: RequestOutcome,
        jitter: f64,
    ) -> Vec<PoolEvent<K>> {
        let Some(ev) = self.outlier.observe(key, now, outcome, jitter) else {
            return Vec::new();
        };
        let mut events = vec![PoolEvent::Outlier {
            pool: self.name.clone(),
            event: ev,
        }];
        events.extend(self.update_fail_open(now));
        events
    }

    /// Ejects `key` for a reason found by a rule the driver runs (a success-rate
    /// outlier, [`OutlierDetector::eject`]): the same limits (`max_ejection_percent`),
    /// ejection times and readmission as the streaks of [`Pool::observe_request`], and
    /// the same fail-open rules afterwards. `jitter` in `[0, 1)` as there.
    pub fn eject(
        &mut self,
        key: &K,
        now: Time,
        reason: crate::outlier::EjectReason,
        jitter: f64,
    ) -> Vec<PoolEvent<K>> {
        let Some(ev) = self.outlier.eject(key, now, reason, jitter) else {
            return Vec::new();
        };
        let mut events = vec![PoolEvent::Outlier {
            pool: self.name.clone(),
            event: ev,
        }];
        events.extend(self.update_fail_open(now));
        events
    }

    /// Drains `key` (`drained = true`: no new traffic, even in fail-open; left out of the
    /// healthy fraction) or puts it back (`false`: it re-enters service through slow
    /// start if it is healthy and not ejected). Health checks and outlier detection go on
    /// meanwhile. `None` for an unknown key; otherwise the fail-open change it caused, if
    /// any. Draining a drained target (or the reverse) changes nothing.
    pub fn set_drained(&mut self, key: &K, drained: bool, now: Time) -> Option<Vec<PoolEvent<K>>> {
        let i = self.index(key)?;
        if self.members[i].drained == drained {
            return Some(Vec::new());
        }
        self.members[i].drained = drained;
        if !drained && self.in_service(i) {
            self.members[i].entered_service = Some(now);
        }
        Some(self.update_fail_open(now).into_iter().collect())
    }

    /// The active checks' verdict on `key` (`None`: not a target of this pool).
    pub fn health(&self, key: &K) -> Option<HealthState> {
        self.index(key).map(|i| self.members[i].thresholds.health())
    }

    /// Whether `key` is drained.
    pub fn is_drained(&self, key: &K) -> bool {
        self.index(key).is_some_and(|i| self.members[i].drained)
    }

    /// Advances time: readmits targets whose ejection ended. Call it regularly (the
    /// balancer does every 100 ms) or at [`Pool::next_deadline`].
    pub fn tick(&mut self, now: Time) -> Vec<PoolEvent<K>> {
        let readmitted = self.outlier.tick(now);
        let mut events = Vec::new();
        for ev in readmitted {
            if let Some(i) = self.index(ev.target())
                && self.in_service(i)
            {
                self.members[i].entered_service = Some(now);
            }
            events.push(PoolEvent::Outlier {
                pool: self.name.clone(),
                event: ev,
            });
        }
        events.extend(self.update_fail_open(now));
        events
    }

    /// When [`Pool::tick`] next has something to do: the earliest end of an ejection, or
    /// the end of the dwell before leaving fail-open.
    pub fn next_deadline(&self) -> Option<Time> {
        let exit = self
            .recovered_since
            .filter(|_| self.fail_open.is_some())
            .map(|s| s + self.config.panic_exit_dwell);
        match (self.outlier.next_readmission(), exit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the pool last left fail-open, while the targets out of service are still
    /// ramping down (`panic_exit_ramp` after it); `None` otherwise.
    pub fn leaving_fail_open(&self, now: Time) -> Option<Time> {
        self.left_fail_open
            .filter(|at| self.fail_open.is_none() && now.since(*at) < self.config.panic_exit_ramp)
    }

    /// Since when the pool is in fail-open, if it is.
    pub fn fail_open(&self) -> Option<Time> {
        self.fail_open
    }

    /// Targets in service and targets with a verdict, drained ones left out (the
    /// healthy fraction's terms).
    pub fn healthy_counts(&self) -> (usize, usize) {
        let known = self
            .members
            .iter()
            .filter(|m| m.thresholds.health() != HealthState::Unknown && !m.drained)
            .count();
        let healthy = (0..self.members.len())
            .filter(|&i| self.in_service(i))
            .count();
        (healthy, known)
    }

    /// Number of targets.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True when the pool has no targets.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// True when `key` is in service (healthy, not ejected, not drained).
    pub fn is_in_service(&self, key: &K) -> bool {
        self.index(key).is_some_and(|i| self.in_service(i))
    }

    /// Who may get traffic now: in fail-open every target at full weight, otherwise the
    /// targets in service with their slow-start ramps (and, while the pool is leaving
    /// fail-open, the others ramping down). Never a drained target.
    pub fn routing_set(&self, now: Time) -> RoutingSet<K> {
        let fail_open = self.fail_open.is_some();
        let leaving = self.leaving_fail_open(now);
        let routes = self
            .members
            .iter()
            .enumerate()
            .filter(|(i, m)| !m.drained && (fail_open || leaving.is_some() || self.in_service(*i)))
            .map(|(i, m)| Route {
                key: m.key.clone(),
                weight: m.spec.weight,
                ramp: match leaving {
                    _ if fail_open => None,
                    Some(start) if !self.in_service(i) => Some(Ramp {
                        start,
                        window: self.config.panic_exit_ramp,
                        min_weight: 0.0,
                        direction: RampDirection::Down,
                    }),
                    _ => self.ramp(m, now),
                },
            })
            .collect();
        RoutingSet { routes, fail_open }
    }

    /// Every target, for admin views and metrics.
    pub fn targets(&self, now: Time) -> impl Iterator<Item = TargetView<'_, K>> {
        self.members.iter().enumerate().map(move |(i, m)| {
            let ejection = self.outlier.ejection(&m.key);
            let in_service = self.in_service(i);
            let ramp = self.ramp(m, now);
            let state = match (m.thresholds.health(), ejection) {
                _ if m.drained => TargetState::Drained,
                (_, Some(_)) => TargetState::Ejected,
                (HealthState::Unknown, None) => TargetState::Unknown,
                (HealthState::Unhealthy, None) => TargetState::Unhealthy,
                (HealthState::Healthy, None) if ramp.is_some() => TargetState::SlowStart,
                (HealthState::Healthy, None) => TargetState::Healthy,
            };
            let route = Route {
                key: (),
                weight: m.spec.weight,
                ramp,
            };
            TargetView {
                key: &m.key,
                spec: &m.spec,
                state,
                health: m.thresholds.health(),
                health_since: m.thresholds.since(),
                last_probe: m.last_probe.as_ref(),
                ejection,
                ejections: self.outlier.ejections(&m.key),
                effective_weight: if in_service {
                    route.effective_weight(now)
                } else {
                    0.0
                },
                drained: m.drained,
            }
        })
    }

    fn index(&self, key: &K) -> Option<usize> {
        self.members.iter().position(|m| &m.key == key)
    }

    fn in_service(&self, i: usize) -> bool {
        let m = &self.members[i];
        m.thresholds.health() == HealthState::Healthy
            && !m.drained
            && !self.outlier.is_ejected(&m.key)
    }

    fn ramp(&self, m: &Member<K>, now: Time) -> Option<Ramp> {
        let window = self.config.slow_start_window;
        let start = m.entered_service?;
        (!window.is_zero() && now.since(start) < window).then_some(Ramp {
            start,
            window,
            min_weight: self.config.slow_start_min_weight,
            direction: RampDirection::Up,
        })
    }

    /// The fraction a pool in fail-open must reach (and keep for the dwell) to leave.
    fn exit_level(&self) -> f64 {
        (self.config.panic_threshold + self.config.panic_exit_margin).min(1.0)
    }

    /// Enters fail-open below the threshold; leaves it per the hysteresis rules (module
    /// docs). Called after every change and on every tick.
    fn update_fail_open(&mut self, now: Time) -> Option<PoolEvent<K>> {
        let (healthy, known) = self.healthy_counts();
        let threshold = self.config.panic_threshold;
        let exit_level = self.exit_level();
        // A hair of tolerance: 3/5 must count as 60%, whatever the rounding of 0.5 + 0.1.
        let below = known > 0 && (healthy as f64) < threshold * known as f64;
        let above = (healthy as f64) >= exit_level * known as f64 - 1e-9;
        let total = self.members.len();
        let drained = self.members.iter().filter(|m| m.drained).count();
        let event = |entered, dwell, ramp| PoolEvent::FailOpen {
            pool: self.name.clone(),
            entered,
            healthy,
            known,
            total,
            drained,
            threshold,
            exit_level,
            dwell,
            ramp,
        };
        match self.fail_open {
            None if below => {
                self.fail_open = Some(now);
                self.recovered_since = None;
                self.left_fail_open = None;
                Some(event(true, Duration::ZERO, Duration::ZERO))
            }
            None => None,
            // Nothing known any more (every target removed or unknown): nothing to ramp.
            Some(_) if known == 0 => {
                self.fail_open = None;
                self.recovered_since = None;
                Some(event(false, Duration::ZERO, Duration::ZERO))
            }
            Some(_) if above => {
                let since = *self.recovered_since.get_or_insert(now);
                let dwell = now.since(since);
                if dwell < self.config.panic_exit_dwell {
                    return None;
                }
                self.fail_open = None;
                self.recovered_since = None;
                self.left_fail_open = Some(now);
                Some(event(false, dwell, self.config.panic_exit_ramp))
            }
            Some(_) => {
                self.recovered_since = None;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests;
