//! Rise/fall thresholds: turning a stream of probe results into a health verdict.
//!
//! The classic HAProxy `rise`/`fall` (Envoy `healthy_threshold`/`unhealthy_threshold`)
//! rule: a target becomes healthy after `healthy_threshold` consecutive successes and
//! unhealthy after `unhealthy_threshold` consecutive failures. A single result against
//! the current verdict changes nothing, which is what keeps one lost packet from
//! ejecting a server.
//!
//! A new target starts [`HealthState::Unknown`] and needs the same streaks to get a verdict,
//! so a load balancer can withhold traffic until it has been checked
//! ([`Thresholds::new_unknown`]), or assume it healthy until proven otherwise
//! ([`Thresholds::new_healthy`]).

use crate::invalid::Invalid;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Default healthy threshold: 2 consecutive successes (HAProxy's `rise 2`), enough to
/// not readmit on one lucky probe, few enough to readmit within two intervals.
pub const DEFAULT_HEALTHY_THRESHOLD: u32 = 2;
/// Default unhealthy threshold: 3 consecutive failures (HAProxy's `fall 3`), so one lost
/// probe never ejects a target.
pub const DEFAULT_UNHEALTHY_THRESHOLD: u32 = 3;

/// The thresholds. Both must be at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ThresholdsConfig {
    /// Consecutive successes that make a target healthy. Defaults to 2.
    pub healthy_threshold: u32,
    /// Consecutive failures that make a target unhealthy. Defaults to 3.
    pub unhealthy_threshold: u32,
}

impl Default for ThresholdsConfig {
    fn default() -> Self {
        ThresholdsConfig {
            healthy_threshold: DEFAULT_HEALTHY_THRESHOLD,
            unhealthy_threshold: DEFAULT_UNHEALTHY_THRESHOLD,
        }
    }
}

impl ThresholdsConfig {
    /// Checks the values; the error names the bad key.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.healthy_threshold == 0 {
            return Err(Invalid::new("healthy_threshold", "must be at least 1"));
        }
        if self.unhealthy_threshold == 0 {
            return Err(Invalid::new("unhealthy_threshold", "must be at least 1"));
        }
        Ok(())
    }
}

/// A target's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthState {
    /// Not yet checked enough to say.
    Unknown,
    /// Serving.
    Healthy,
    /// Not serving.
    Unhealthy,
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HealthState::Unknown => "unknown",
            HealthState::Healthy => "healthy",
            HealthState::Unhealthy => "unhealthy",
        })
    }
}

/// A change of verdict, returned by [`Thresholds::observe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// Verdict before.
    pub from: HealthState,
    /// Verdict after.
    pub to: HealthState,
    /// Length of the streak that caused it.
    pub streak: u32,
    /// When the streak began (the first result of it).
    pub streak_started: Time,
}

/// The rise/fall state machine for one target.
#[derive(Clone, Debug)]
pub struct Thresholds {
    config: ThresholdsConfig,
    health: HealthState,
    since: Time,
    /// Consecutive results agreeing with `streak_ok`; reset when a result disagrees.
    streak: u32,
    streak_ok: bool,
    streak_started: Time,
}

impl Thresholds {
    /// A target with no verdict yet: it needs a full streak either way.
    pub fn new_unknown(config: ThresholdsConfig, now: Time) -> Self {
        Self::with_health(config, HealthState::Unknown, now)
    }

    /// A target assumed healthy until `unhealthy_threshold` failures say otherwise.
    pub fn new_healthy(config: ThresholdsConfig, now: Time) -> Self {
        Self::with_health(config, HealthState::Healthy, now)
    }

    /// A target in a given state (e.g. restored from a store).
    pub fn with_health(config: ThresholdsConfig, health: HealthState, now: Time) -> Self {
        Thresholds {
            config,
            health,
            since: now,
            streak: 0,
            streak_ok: true,
            streak_started: now,
        }
    }

    /// Records one probe result. Returns the transition when the verdict flipped.
    pub fn observe(&mut self, now: Time, ok: bool) -> Option<Transition> {
        if self.streak == 0 || self.streak_ok != ok {
            self.streak = 0;
            self.streak_ok = ok;
            self.streak_started = now;
        }
        self.streak = self.streak.saturating_add(1);
        let (target, needed) = if ok {
            (HealthState::Healthy, self.config.healthy_threshold)
        } else {
            (HealthState::Unhealthy, self.config.unhealthy_threshold)
        };
        if self.health != target && self.streak >= needed {
            let t = Transition {
                from: self.health,
                to: target,
                streak: self.streak,
                streak_started: self.streak_started,
            };
            self.health = target;
            self.since = now;
            return Some(t);
        }
        None
    }

    /// Forces a verdict (an operator's action, or a passive ejection); the streak restarts.
    /// Returns the transition when it changed anything.
    pub fn force(&mut self, now: Time, health: HealthState) -> Option<Transition> {
        self.streak = 0;
        if self.health == health {
            return None;
        }
        let t = Transition {
            from: self.health,
            to: health,
            streak: 0,
            streak_started: now,
        };
        self.health = health;
        self.since = now;
        Some(t)
    }

    /// The current verdict.
    pub fn health(&self) -> HealthState {
        self.health
    }

    /// When the current verdict began.
    pub fn since(&self) -> Time {
        self.since
    }

    /// Consecutive failures so far (0 when the last result was a success).
    pub fn consecutive_failures(&self) -> u32 {
        if self.streak_ok { 0 } else { self.streak }
    }

    /// Consecutive successes so far (0 when the last result was a failure).
    pub fn consecutive_successes(&self) -> u32 {
        if self.streak_ok { self.streak } else { 0 }
    }

    /// When the current failure streak began, if the last result was a failure.
    pub fn failing_since(&self) -> Option<Time> {
        (!self.streak_ok && self.streak > 0).then_some(self.streak_started)
    }

    /// The configuration.
    pub fn config(&self) -> ThresholdsConfig {
        self.config
    }

    /// Replaces the configuration (a reload) without losing the verdict or the streak.
    pub fn reconfigure(&mut self, config: ThresholdsConfig) {
        self.config = config;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(rise: u32, fall: u32) -> ThresholdsConfig {
        ThresholdsConfig {
            healthy_threshold: rise,
            unhealthy_threshold: fall,
        }
    }

    #[test]
    fn falls_after_exactly_unhealthy_threshold_failures() {
        let mut t = Thresholds::new_healthy(cfg(2, 3), Time::ZERO);
        assert_eq!(t.observe(Time::from_secs(1), false), None);
        assert_eq!(t.observe(Time::from_secs(2), false), None);
        let tr = t
            .observe(Time::from_secs(3), false)
            .expect("third failure must eject");
        assert_eq!(
            (tr.from, tr.to, tr.streak),
            (HealthState::Healthy, HealthState::Unhealthy, 3)
        );
        assert_eq!(tr.streak_started, Time::from_secs(1));
        assert_eq!(t.since(), Time::from_secs(3));
        assert_eq!(
            t.observe(Time::from_secs(4), false),
            None,
            "no repeated transition"
        );
    }

    #[test]
    fn one_success_resets_the_failure_streak() {
        let mut t = Thresholds::new_healthy(cfg(2, 3), Time::ZERO);
        t.observe(Time::from_secs(1), false);
        t.observe(Time::from_secs(2), false);
        t.observe(Time::from_secs(3), true);
        assert_eq!(t.consecutive_failures(), 0);
        t.observe(Time::from_secs(4), false);
        t.observe(Time::from_secs(5), false);
        assert_eq!(
            t.health(),
            HealthState::Healthy,
            "the streak restarted at t=4"
        );
        assert_eq!(t.failing_since(), Some(Time::from_secs(4)));
    }

    #[test]
    fn unknown_needs_a_full_streak_either_way() {
        let mut t = Thresholds::new_unknown(cfg(2, 3), Time::ZERO);
        assert_eq!(t.observe(Time::from_secs(1), true), None);
        assert_eq!(t.health(), HealthState::Unknown);
        let tr = t.observe(Time::from_secs(2), true).unwrap();
        assert_eq!(
            (tr.from, tr.to),
            (HealthState::Unknown, HealthState::Healthy)
        );
    }

    #[test]
    fn force_restarts_the_streak() {
        let mut t = Thresholds::new_healthy(cfg(2, 3), Time::ZERO);
        t.observe(Time::from_secs(1), true);
        assert!(
            t.force(Time::from_secs(2), HealthState::Unhealthy)
                .is_some()
        );
        assert_eq!(t.observe(Time::from_secs(3), true), None);
        assert!(t.observe(Time::from_secs(4), true).is_some());
    }

    #[test]
    fn zero_thresholds_are_rejected() {
        assert!(cfg(0, 1).validate().unwrap_err().key == "healthy_threshold");
        assert!(cfg(1, 0).validate().unwrap_err().key == "unhealthy_threshold");
    }

    proptest! {
        /// The verdict changes only at the end of a streak of exactly the threshold's
        /// length (or longer, when starting from Unknown is the same rule), and always then.
        #[test]
        fn changes_state_exactly_at_its_threshold(
            rise in 1u32..6, fall in 1u32..6,
            results in proptest::collection::vec(any::<bool>(), 0..200),
            start_healthy in any::<bool>(),
        ) {
            let mut t = if start_healthy {
                Thresholds::new_healthy(cfg(rise, fall), Time::ZERO)
            } else {
                Thresholds::new_unknown(cfg(rise, fall), Time::ZERO)
            };
            let mut streak = 0u32;
            let mut last: Option<bool> = None;
            for (i, ok) in results.into_iter().enumerate() {
                streak = if last == Some(ok) { streak + 1 } else { 1 };
                last = Some(ok);
                let before = t.health();
                let tr = t.observe(Time::from_secs(i as u64 + 1), ok);
                let (target, needed) = if ok { (HealthState::Healthy, rise) } else { (HealthState::Unhealthy, fall) };
                if before == target {
                    prop_assert!(tr.is_none(), "no transition into the state it is already in");
                } else if streak < needed {
                    prop_assert!(tr.is_none(), "changed after {streak} < {needed} results");
                    prop_assert_eq!(t.health(), before);
                } else {
                    prop_assert!(tr.is_some(), "did not change after {streak} >= {needed} results");
                    prop_assert_eq!(t.health(), target);
                }
            }
        }
    }
}
