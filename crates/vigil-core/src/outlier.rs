//! Passive outlier detection: consecutive errors eject a target, with growing ejection times.
//!
//! Based on Envoy's outlier detection (`consecutive_5xx`, `consecutive_gateway_failure`,
//! `base_ejection_time`, `max_ejection_percent`, `max_ejection_time`): the balancer
//! reports the outcome of every real request it forwarded ([`OutlierDetector::observe`]);
//! a target that answers too many errors *in a row* is ejected for a while, without
//! waiting for the active health checker to notice.
//!
//! # Rules
//!
//! 1. **Counting.** Per target, two streaks are kept:
//!    - *errors*: any 5xx response but 503 (rule 5), and any gateway error (connect failure, timeout,
//!      connection reset before a complete response). Ejects at
//!      [`OutlierConfig::consecutive_5xx`] (default 5, Envoy's).
//!    - *gateway errors*: 502/504 responses and local gateway errors. Ejects at
//!      [`OutlierConfig::consecutive_gateway_errors`] (default 3: a target we cannot even
//!      talk to is stronger evidence than a target that answers 500).
//!
//!    Any other response resets both streaks (a 4xx is the client's fault, not the
//!    target's), except a shed answer (rule 5). A success also clears a pending
//!    "skipped" report (rule 3).
//! 2. **Ejection time** = `base_ejection_time x n`, where `n` is the number of ejections
//!    of this target including this one, capped at `max_ejection_time`, then stretched by
//!    jitter: `t x (1 + max_ejection_jitter x jitter)`, where `jitter` in `[0, 1)` is a
//!    random fraction **supplied by the caller** (no RNG here; the simulator passes a
//!    seeded one, tests pass 0). Jitter keeps targets ejected together from all returning
//!    at the same instant. `n` decays: every full `base_ejection_time` a target spends
//!    back in service forgives one past ejection (Envoy decrements per interval).
//! 3. **Never too many.** An ejection that would make more than
//!    `max(1, floor(pool_size x max_ejection_percent / 100))` targets ejected at once is
//!    refused and reported once per error streak as [`OutlierEvent::EjectionSkipped`]
//!    (like Envoy, at least one target can always be ejected; `max_ejection_percent = 0`
//!    disables ejection altogether). The streak is kept, so the target is ejected by its
//!    next error once there is room.
//! 4. **Readmission** happens in [`OutlierDetector::tick`] once `now >= until`: the
//!    driver calls `tick` regularly (or at [`OutlierDetector::next_readmission`]).
//!    Outcomes observed while a target is ejected (late answers of requests already in
//!    flight, traffic sent to it in fail-open) are ignored: they neither extend nor end
//!    the ejection. Readmission resets both streaks.
//!
//! 5. **Overload is not a host fault.** A *shed* answer, 503 (with or without
//!    `Retry-After`) or 429 ([`RequestOutcome::is_shed`]), says the target is busy, not
//!    broken: it neither counts towards a streak nor resets one, so shedding never ejects
//!    on its own (a target mixing 500s with its 503s is still ejected by the 500s).
//!    Ejecting servers that shed removes capacity exactly when it is short: in a retry
//!    storm, availability was 88.8% with such ejections and 90.0% without. What a shed
//!    answer does instead is raise the target's *load* as balancing sees it
//!    ([`crate::pool::ShedPenalty`]): errors count as load (the SRE book, "Handling
//!    Overload"), so least-loaded balancing does not sinkhole traffic into a target that
//!    fails fast. The cost: a target that answers 503 to everything because it is
//!    broken is left to the active checks.
//!
//! 6. **Success rate (driven from outside).** A target answering 20% errors among peers
//!    at 0.1% never fails five requests in a row often enough for rule 1. Comparing its
//!    error rate with its peers' is the fleet-relative policy of [`crate::anomaly`]
//!    (volume, peers, absolute floor, binomial test); a driver that runs it ejects an
//!    outlier with [`OutlierDetector::eject`] and [`EjectReason::success_rate`], through
//!    the same rules 2 to 4 (ejection time, `max_ejection_percent`, readmission). `vigil
//!    lb` does so every `[outlier.success_rate] interval`.
//!
//! Everything returns [`OutlierEvent`]s saying why, ready to be logged (`Display`).
//!
//! # Example
//!
//! ```
//! use vigil_core::outlier::{OutlierConfig, OutlierDetector, OutlierEvent, RequestOutcome};
//! use vigil_core::Time;
//!
//! let mut d = OutlierDetector::new(OutlierConfig::default());
//! for t in ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"] {
//!     d.add_target(t);
//! }
//! let mut events = Vec::new();
//! for i in 0..5 {
//!     // jitter = 0.0: the caller supplies randomness (here none).
//!     events.extend(d.observe(&"a", Time::from_secs(i), RequestOutcome::Response(500), 0.0));
//! }
//! assert!(matches!(events.as_slice(), [OutlierEvent::Ejected { .. }]));
//! assert!(d.is_ejected(&"a"));
//! // 30 s later (default base ejection time x 1st ejection) it comes back.
//! let back = d.tick(Time::from_secs(4 + 30));
//! assert!(matches!(back.as_slice(), [OutlierEvent::Readmitted { .. }]));
//! ```

use crate::anomaly::MemberVerdict;
use crate::invalid::Invalid;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// Default consecutive errors (5xx or gateway) that eject: 5, Envoy's `consecutive_5xx`.
pub const DEFAULT_CONSECUTIVE_5XX: u32 = 5;
/// Default consecutive gateway errors (connect failure, timeout, reset, 502/504) that
/// eject: 3, fewer than for 5xx because a target we cannot talk to at all is stronger
/// evidence than one answering errors, and every such request costs a retry.
pub const DEFAULT_CONSECUTIVE_GATEWAY_ERRORS: u32 = 3;
/// Default base ejection time: 30 s, Envoy's; long enough for the active checker to
/// confirm or deny, short enough that a transient blip costs little capacity.
pub const DEFAULT_BASE_EJECTION_TIME: Duration = Duration::from_secs(30);
/// Default cap on one ejection: 300 s, Envoy's `max_ejection_time`, so a flapping target
/// is still retried every five minutes.
pub const DEFAULT_MAX_EJECTION_TIME: Duration = Duration::from_secs(300);
/// Default share of a pool that may be ejected at once: 10%, Envoy's. Outlier detection
/// acts on request outcomes, which a bad client or a shared dependency can spoil for
/// every target at once; it must never empty a pool.
pub const DEFAULT_MAX_EJECTION_PERCENT: u32 = 10;
/// Default jitter: up to 25% longer ejections, so targets ejected together (one shared
/// blip) come back spread over a quarter of their ejection time.
pub const DEFAULT_MAX_EJECTION_JITTER: f64 = 0.25;

/// Outlier detection settings (one per pool).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutlierConfig {
    /// Consecutive errors (5xx responses or gateway errors) that eject a target; 0
    /// disables this rule. Defaults to 5.
    pub consecutive_5xx: u32,
    /// Consecutive gateway errors (connect failure, timeout, reset, 502/504) that eject
    /// a target; 0 disables this rule. Defaults to 3.
    pub consecutive_gateway_errors: u32,
    /// Ejection time of a first ejection; the n-th lasts n times this. Defaults to 30s.
    #[serde(with = "humantime_serde")]
    pub base_ejection_time: Duration,
    /// Longest ejection (before jitter). Defaults to 300s.
    #[serde(with = "humantime_serde")]
    pub max_ejection_time: Duration,
    /// Most targets of the pool ejected at once, in percent (at least one can always be
    /// ejected; 0 disables ejection). Defaults to 10.
    pub max_ejection_percent: u32,
    /// Ejection times are stretched by up to this fraction (0 to 1), times the caller's
    /// random fraction. Defaults to 0.25.
    pub max_ejection_jitter: f64,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            consecutive_5xx: DEFAULT_CONSECUTIVE_5XX,
            consecutive_gateway_errors: DEFAULT_CONSECUTIVE_GATEWAY_ERRORS,
            base_ejection_time: DEFAULT_BASE_EJECTION_TIME,
            max_ejection_time: DEFAULT_MAX_EJECTION_TIME,
            max_ejection_percent: DEFAULT_MAX_EJECTION_PERCENT,
            max_ejection_jitter: DEFAULT_MAX_EJECTION_JITTER,
        }
    }
}

impl OutlierConfig {
    /// Checks the values; the error names the bad key.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.max_ejection_percent > 100 {
            return Err(Invalid::new(
                "max_ejection_percent",
                format!(
                    "must be between 0 and 100, got {}",
                    self.max_ejection_percent
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.max_ejection_jitter) {
            return Err(Invalid::new(
                "max_ejection_jitter",
                format!("must be between 0 and 1, got {}", self.max_ejection_jitter),
            ));
        }
        if self.base_ejection_time.is_zero() {
            return Err(Invalid::new("base_ejection_time", "must be more than 0s"));
        }
        if self.max_ejection_time < self.base_ejection_time {
            return Err(Invalid::new(
                "max_ejection_time",
                format!(
                    "({}) must be at least base_ejection_time ({})",
                    humantime::format_duration(self.max_ejection_time),
                    humantime::format_duration(self.base_ejection_time)
                ),
            ));
        }
        Ok(())
    }

    /// How many of `pool_size` targets may be ejected at once (rule 3 of the module docs).
    pub fn max_ejected(&self, pool_size: usize) -> usize {
        if self.max_ejection_percent == 0 || pool_size == 0 {
            return 0;
        }
        (pool_size * self.max_ejection_percent as usize / 100).max(1)
    }

    /// The ejection time of the `n`-th ejection (n >= 1) with the caller's `jitter` in
    /// `[0, 1)` (clamped).
    pub fn ejection_time(&self, n: u32, jitter: f64) -> Duration {
        let base = self
            .base_ejection_time
            .saturating_mul(n.max(1))
            .min(self.max_ejection_time);
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        base.mul_f64(1.0 + self.max_ejection_jitter * jitter)
    }
}

/// What happened to one request forwarded to a target, as the driver saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestOutcome {
    /// A complete response header arrived with this status code.
    Response(u16),
    /// The connection could not be established (refused, unreachable, connect timeout).
    ConnectFailure,
    /// No response (header) within the response timeout.
    Timeout,
    /// The connection broke, or the target sent something that is not HTTP, before a
    /// complete response header.
    Reset,
}

impl RequestOutcome {
    /// True for outcomes that count towards the error streak: 5xx (but 503, a shed
    /// answer) and gateway errors.
    pub fn is_error(self) -> bool {
        match self {
            RequestOutcome::Response(code) => (500..600).contains(&code) && code != 503,
            _ => true,
        }
    }

    /// True for gateway errors: local failures, 502 and 504.
    pub fn is_gateway_error(self) -> bool {
        match self {
            RequestOutcome::Response(code) => matches!(code, 502 | 504),
            _ => true,
        }
    }

    /// True for a shed answer: 503 (with or without `Retry-After`) or 429. Load, not
    /// failure: it never counts towards ejection nor resets a streak (rule 5).
    pub fn is_shed(self) -> bool {
        matches!(self, RequestOutcome::Response(429 | 503))
    }
}

impl fmt::Display for RequestOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestOutcome::Response(code) => write!(f, "HTTP {code}"),
            RequestOutcome::ConnectFailure => f.write_str("connect failure"),
            RequestOutcome::Timeout => f.write_str("timeout"),
            RequestOutcome::Reset => f.write_str("reset"),
        }
    }
}

/// Which rule ejected a target.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EjectReason {
    /// `consecutive_5xx` errors in a row; the last one is carried.
    Consecutive5xx {
        /// Length of the streak.
        count: u32,
        /// The outcome that completed it.
        last: RequestOutcome,
    },
    /// `consecutive_gateway_errors` gateway errors in a row.
    ConsecutiveGatewayErrors {
        /// Length of the streak.
        count: u32,
        /// The outcome that completed it.
        last: RequestOutcome,
    },
    /// Its error rate is an outlier against its peers' (rule 6, [`crate::anomaly`]).
    SuccessRate {
        /// Its failed requests in the window judged.
        failed: u64,
        /// Its requests in the window judged.
        requests: u64,
        /// How many peers it was compared with.
        peers: usize,
        /// The peers' pooled error rate, 0..1.
        peers_rate: f64,
        /// The binomial test's p-value ...
        p_value: f64,
        /// ... and the threshold it fell below.
        threshold: f64,
    },
}

impl EjectReason {
    /// The success-rate reason carrying an outlier verdict's numbers.
    pub fn success_rate(v: &MemberVerdict) -> EjectReason {
        EjectReason::SuccessRate {
            failed: v.counts.failed,
            requests: v.counts.total(),
            peers: v.peers.count,
            peers_rate: v.peers.pooled_rate,
            p_value: v.test.map_or(1.0, |t| t.p_value),
            threshold: v.test.map_or(0.0, |t| t.threshold),
        }
    }
}

impl fmt::Display for EjectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EjectReason::Consecutive5xx { count, last } => {
                write!(f, "{count} consecutive errors (last: {last})")
            }
            EjectReason::ConsecutiveGatewayErrors { count, last } => {
                write!(f, "{count} consecutive gateway errors (last: {last})")
            }
            EjectReason::SuccessRate {
                failed,
                requests,
                peers,
                peers_rate,
                p_value,
                threshold,
            } => {
                let rate = if *requests == 0 {
                    0.0
                } else {
                    *failed as f64 / *requests as f64
                };
                write!(
                    f,
                    "a success-rate outlier: {:.1}% errors ({failed} of {requests} requests) vs {:.2}% for its {peers} peers (binomial p={p_value:.1e} < {threshold:.1e})",
                    rate * 100.0,
                    peers_rate * 100.0
                )
            }
        }
    }
}

/// A change reported by the detector.
#[derive(Clone, Debug, PartialEq)]
pub enum OutlierEvent<K> {
    /// The target was ejected until `until`.
    Ejected {
        /// The target.
        target: K,
        /// Why.
        reason: EjectReason,
        /// How many times it has been ejected, this one included (after decay).
        ejections: u32,
        /// How long this ejection lasts (jitter included).
        duration: Duration,
        /// When it ends.
        until: Time,
    },
    /// The target deserved ejection but too many targets are ejected already.
    EjectionSkipped {
        /// The target.
        target: K,
        /// Why it would have been ejected.
        reason: EjectReason,
        /// Targets ejected now.
        ejected: usize,
        /// The most that may be ejected at once.
        limit: usize,
    },
    /// The target's ejection ended; it is back in service.
    Readmitted {
        /// The target.
        target: K,
        /// How long it was out.
        ejected_for: Duration,
    },
}

impl<K> OutlierEvent<K> {
    /// The target the event is about.
    pub fn target(&self) -> &K {
        match self {
            OutlierEvent::Ejected { target, .. }
            | OutlierEvent::EjectionSkipped { target, .. }
            | OutlierEvent::Readmitted { target, .. } => target,
        }
    }
}

impl<K: fmt::Display> fmt::Display for OutlierEvent<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutlierEvent::Ejected {
                target,
                reason,
                ejections,
                duration,
                ..
            } => write!(
                f,
                "target {target} ejected for {} after {reason} (ejection #{ejections})",
                humantime::format_duration(round_ms(*duration))
            ),
            OutlierEvent::EjectionSkipped {
                target,
                reason,
                ejected,
                limit,
            } => write!(
                f,
                "target {target} not ejected after {reason}: {ejected} of at most {limit} targets already ejected (max_ejection_percent)"
            ),
            OutlierEvent::Readmitted {
                target,
                ejected_for,
            } => write!(
                f,
                "target {target} readmitted after {} ejected",
                humantime::format_duration(round_ms(*ejected_for))
            ),
        }
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// A current ejection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ejection {
    /// When it began.
    pub since: Time,
    /// When it ends.
    pub until: Time,
    /// Why.
    pub reason: EjectReason,
}

/// What outlier detection remembers of one target: its error streaks and ejections.
#[derive(Clone, Debug, Default)]
struct OutlierState {
    errors: u32,
    gateway_errors: u32,
    /// Past ejections, before decay.
    ejections: u32,
    ejected: Option<Ejection>,
    /// When the last ejection ended (starts the decay of `ejections`).
    readmitted_at: Option<Time>,
    /// A skipped ejection was reported for the current streak.
    skip_reported: bool,
}

/// Envoy-style passive outlier detection over one pool's targets, keyed by `K`.
#[derive(Clone, Debug)]
pub struct OutlierDetector<K> {
    config: OutlierConfig,
    targets: BTreeMap<K, OutlierState>,
}

impl<K: Ord + Clone> OutlierDetector<K> {
    /// A detector with no targets.
    pub fn new(config: OutlierConfig) -> Self {
        OutlierDetector {
            config,
            targets: BTreeMap::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &OutlierConfig {
        &self.config
    }

    /// Replaces the configuration (a reload); current ejections and streaks are kept.
    pub fn reconfigure(&mut self, config: OutlierConfig) {
        self.config = config;
    }

    /// Adds a target (in service, no history). Adding a known target changes nothing.
    pub fn add_target(&mut self, target: K) {
        self.targets.entry(target).or_default();
    }

    /// Forgets a target and its history.
    pub fn remove_target(&mut self, target: &K) {
        self.targets.remove(target);
    }

    /// Number of targets.
    pub fn len(&self) -> usize {
        self.targets.len()
    }

    /// True when there are no targets.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// Records one request's outcome. `jitter` is a random fraction in `[0, 1)` used only
    /// if this ejects the target. Returns what changed (nothing, an ejection, or a
    /// skipped ejection). Unknown targets and ejected targets are ignored.
    pub fn observe(
        &mut self,
        target: &K,
        now: Time,
        outcome: RequestOutcome,
        jitter: f64,
    ) -> Option<OutlierEvent<K>> {
        let ejected_now = self.ejected_count();
        let limit = self.config.max_ejected(self.targets.len());
        let config = self.config;
        let st = self.targets.get_mut(target)?;
        if st.ejected.is_some() || outcome.is_shed() {
            return None;
        }
        if !outcome.is_error() {
            st.errors = 0;
            st.gateway_errors = 0;
            st.skip_reported = false;
            return None;
        }
        st.errors = st.errors.saturating_add(1);
        if outcome.is_gateway_error() {
            st.gateway_errors = st.gateway_errors.saturating_add(1);
        } else {
            st.gateway_errors = 0;
        }
        let reason = if config.consecutive_gateway_errors > 0
            && st.gateway_errors >= config.consecutive_gateway_errors
        {
            EjectReason::ConsecutiveGatewayErrors {
                count: st.gateway_errors,
                last: outcome,
            }
        } else if config.consecutive_5xx > 0 && st.errors >= config.consecutive_5xx {
            EjectReason::Consecutive5xx {
                count: st.errors,
                last: outcome,
            }
        } else {
            return None;
        };
        if ejected_now + 1 > limit {
            if st.skip_reported {
                return None;
            }
            st.skip_reported = true;
            return Some(OutlierEvent::EjectionSkipped {
                target: target.clone(),
                reason,
                ejected: ejected_now,
                limit,
            });
        }
        Some(Self::eject_now(config, target, st, now, reason, jitter))
    }

    /// Ejects `target` for `reason` found by a rule the driver runs (rule 6: a
    /// success-rate outlier), under the same limits as the streaks: refused and reported
    /// as [`OutlierEvent::EjectionSkipped`] (every time: the driver judges at its own
    /// pace) when `max_ejection_percent` is reached, the same growing ejection time, the
    /// same readmission. `None` for an unknown or already ejected target.
    pub fn eject(
        &mut self,
        target: &K,
        now: Time,
        reason: EjectReason,
        jitter: f64,
    ) -> Option<OutlierEvent<K>> {
        let ejected_now = self.ejected_count();
        let limit = self.config.max_ejected(self.targets.len());
        let config = self.config;
        let st = self.targets.get_mut(target)?;
        if st.ejected.is_some() {
            return None;
        }
        if ejected_now + 1 > limit {
            return Some(OutlierEvent::EjectionSkipped {
                target: target.clone(),
                reason,
                ejected: ejected_now,
                limit,
            });
        }
        Some(Self::eject_now(config, target, st, now, reason, jitter))
    }

    fn eject_now(
        config: OutlierConfig,
        target: &K,
        st: &mut OutlierState,
        now: Time,
        reason: EjectReason,
        jitter: f64,
    ) -> OutlierEvent<K> {
        // Decay: every full base_ejection_time back in service forgives one ejection.
        if let Some(back) = st.readmitted_at {
            let served = now.since(back).as_nanos();
            let per = config.base_ejection_time.as_nanos().max(1);
            let forgiven = u32::try_from(served / per).unwrap_or(u32::MAX);
            st.ejections = st.ejections.saturating_sub(forgiven);
        }
        st.ejections = st.ejections.saturating_add(1);
        let duration = config.ejection_time(st.ejections, jitter);
        let until = now + duration;
        st.ejected = Some(Ejection {
            since: now,
            until,
            reason,
        });
        st.errors = 0;
        st.gateway_errors = 0;
        st.skip_reported = false;
        OutlierEvent::Ejected {
            target: target.clone(),
            reason,
            ejections: st.ejections,
            duration,
            until,
        }
    }

    /// Readmits every target whose ejection has ended by `now`.
    pub fn tick(&mut self, now: Time) -> Vec<OutlierEvent<K>> {
        let mut events = Vec::new();
        for (k, st) in &mut self.targets {
            if let Some(e) = st.ejected
                && now >= e.until
            {
                st.ejected = None;
                st.readmitted_at = Some(now);
                st.errors = 0;
                st.gateway_errors = 0;
                events.push(OutlierEvent::Readmitted {
                    target: k.clone(),
                    ejected_for: now.since(e.since),
                });
            }
        }
        events
    }

    /// The earliest time a current ejection ends, if any (when to call [`Self::tick`]).
    pub fn next_readmission(&self) -> Option<Time> {
        self.targets
            .values()
            .filter_map(|s| s.ejected.map(|e| e.until))
            .min()
    }

    /// True while the target is ejected (until a `tick` readmits it).
    pub fn is_ejected(&self, target: &K) -> bool {
        self.ejection(target).is_some()
    }

    /// The target's current ejection, if any.
    pub fn ejection(&self, target: &K) -> Option<Ejection> {
        self.targets.get(target).and_then(|s| s.ejected)
    }

    /// How many times the target has been ejected (before decay is applied at the next
    /// ejection).
    pub fn ejections(&self, target: &K) -> u32 {
        self.targets.get(target).map_or(0, |s| s.ejections)
    }

    /// The target's current error streak (5xx and gateway errors).
    pub fn consecutive_errors(&self, target: &K) -> u32 {
        self.targets.get(target).map_or(0, |s| s.errors)
    }

    /// Targets ejected now.
    pub fn ejected_count(&self) -> usize {
        self.targets
            .values()
            .filter(|s| s.ejected.is_some())
            .count()
    }
}

#[cfg(test)]
mod tests;
