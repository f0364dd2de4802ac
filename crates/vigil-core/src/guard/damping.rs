//! Flap damping, after BGP route-flap dampening (RFC 2439).
//!
//! Every time a target starts failing (a passing probe followed by a failing one) it
//! earns a penalty. The penalty decays exponentially with a half-life. When it reaches
//! the *suppress* threshold the target is *flapping*: the guard reports it as such and
//! does not replace it (replacing a host that flaps because of, say, a flaky network path
//! just flaps the replacement). It stays flapping until the penalty decays below the
//! *reuse* threshold: the gap between the two thresholds is the hysteresis. The penalty
//! never exceeds a ceiling, `reuse * 2^(max_suppress / half_life)`, so a target that
//! stops flapping is released at most `max_suppress` later (RFC 2439's "maximum hold-down
//! time"). Defaults are the classic router defaults (Cisco's 1000 / 2000 / 750 / 15 min
//! / 60 min).
//!
//! A target that fails once and stays failing earns one penalty (below the suppress
//! threshold by default), so a plainly dead host is still replaced.

use crate::invalid::Invalid;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Default penalty per flap: 1000, RFC 2439's conventional unit.
pub const DEFAULT_FLAP_PENALTY: u32 = 1000;
/// Default suppress threshold: 2000, i.e. about three failure episodes within one
/// half-life (the first decays a little before the third arrives).
pub const DEFAULT_SUPPRESS_THRESHOLD: u32 = 2000;
/// Default reuse threshold: 750, the router default; well below suppress so a target
/// does not toggle between flapping and not.
pub const DEFAULT_REUSE_THRESHOLD: u32 = 750;
/// Default half-life: 15 minutes, the router default; long against a 10 s probe interval
/// so a loop of fail/recover/fail within minutes is caught.
pub const DEFAULT_HALF_LIFE: Duration = Duration::from_secs(15 * 60);
/// Default longest suppression after the flapping stops: 60 minutes (router default).
pub const DEFAULT_MAX_SUPPRESS: Duration = Duration::from_secs(60 * 60);

/// Flap damping parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DampingConfig {
    /// Penalty added each time the target starts failing. Defaults to 1000.
    pub penalty: u32,
    /// Penalty at or above which the target is flapping. Defaults to 2000.
    pub suppress: u32,
    /// Penalty below which a flapping target is released. Defaults to 750.
    pub reuse: u32,
    /// Time for the penalty to halve, e.g. `"15m"`. Defaults to 15 minutes.
    #[serde(with = "humantime_serde")]
    pub half_life: Duration,
    /// Longest a target stays suppressed after it stops flapping. Defaults to 60 minutes.
    #[serde(with = "humantime_serde")]
    pub max_suppress: Duration,
}

impl Default for DampingConfig {
    fn default() -> Self {
        DampingConfig {
            penalty: DEFAULT_FLAP_PENALTY,
            suppress: DEFAULT_SUPPRESS_THRESHOLD,
            reuse: DEFAULT_REUSE_THRESHOLD,
            half_life: DEFAULT_HALF_LIFE,
            max_suppress: DEFAULT_MAX_SUPPRESS,
        }
    }
}

impl DampingConfig {
    /// Checks the values; the error names the bad key.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.reuse >= self.suppress {
            return Err(Invalid::new(
                "reuse",
                format!(
                    "({}) must be below suppress ({})",
                    self.reuse, self.suppress
                ),
            ));
        }
        if self.half_life.is_zero() {
            return Err(Invalid::new("half_life", "must be longer than 0s"));
        }
        Ok(())
    }

    /// The penalty ceiling, `reuse * 2^(max_suppress / half_life)`, at least `suppress`
    /// so that suppression is reachable at all.
    pub fn ceiling(&self) -> u32 {
        let ratio = self.max_suppress.as_secs_f64() / self.half_life.as_secs_f64().max(1e-9);
        let c = f64::from(self.reuse) * ratio.min(31.0).exp2();
        (c.min(f64::from(u32::MAX)) as u32).max(self.suppress)
    }
}

/// One target's flap penalty. The penalty is stored as of its last change and decayed
/// on read, so reading it never changes it (and restoring it gives identical results).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlapDamper {
    penalty: u32,
    updated: Time,
    suppressed: bool,
}

impl FlapDamper {
    /// The penalty at `now`, decayed since its last change.
    pub fn penalty(&self, config: &DampingConfig, now: Time) -> u32 {
        if self.penalty == 0 {
            return 0;
        }
        let dt = now.since(self.updated).as_secs_f64();
        let halvings = dt / config.half_life.as_secs_f64().max(1e-9);
        (f64::from(self.penalty) * (-halvings).exp2()) as u32
    }

    /// Whether the target is flapping (suppressed). Call [`FlapDamper::refresh`] first
    /// for an up-to-date answer.
    pub fn is_suppressed(&self) -> bool {
        self.suppressed
    }

    /// Records a flap. Returns true when the target just became suppressed.
    pub fn flap(&mut self, config: &DampingConfig, now: Time) -> bool {
        let p = self
            .penalty(config, now)
            .saturating_add(config.penalty)
            .min(config.ceiling());
        self.penalty = p;
        self.updated = now;
        if !self.suppressed && p >= config.suppress {
            self.suppressed = true;
            return true;
        }
        false
    }

    /// Releases the target once its penalty decayed below `reuse`. Returns true when it
    /// was just released.
    pub fn refresh(&mut self, config: &DampingConfig, now: Time) -> bool {
        if self.suppressed && self.penalty(config, now) < config.reuse {
            self.suppressed = false;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> DampingConfig {
        DampingConfig {
            half_life: Duration::from_secs(60),
            max_suppress: Duration::from_secs(240),
            ..DampingConfig::default()
        }
    }

    #[test]
    fn penalty_halves_every_half_life() {
        let c = cfg();
        let mut d = FlapDamper::default();
        d.flap(&c, Time::from_secs(0));
        assert_eq!(d.penalty(&c, Time::from_secs(0)), 1000);
        assert_eq!(d.penalty(&c, Time::from_secs(60)), 500);
        assert_eq!(d.penalty(&c, Time::from_secs(120)), 250);
    }

    #[test]
    fn suppressed_at_suppress_released_below_reuse() {
        let c = cfg();
        let mut d = FlapDamper::default();
        assert!(!d.flap(&c, Time::from_secs(0)));
        assert!(d.flap(&c, Time::from_secs(0)), "2000 reaches suppress");
        assert!(d.is_suppressed());
        // 2000 -> below 750 takes log2(2000/750) = 1.415 half-lives = 85 s.
        assert!(!d.refresh(&c, Time::from_secs(80)));
        assert!(d.refresh(&c, Time::from_secs(90)));
        assert!(!d.is_suppressed());
    }

    #[test]
    fn penalty_is_capped_so_suppression_ends_within_max_suppress() {
        let c = cfg();
        let mut d = FlapDamper::default();
        for _ in 0..100 {
            d.flap(&c, Time::from_secs(0));
        }
        assert_eq!(d.penalty(&c, Time::from_secs(0)), 750 * 16);
        assert!(
            d.refresh(&c, Time::from_secs(241)),
            "released after max_suppress"
        );
    }

    #[test]
    fn reuse_not_below_suppress_is_rejected() {
        let c = DampingConfig {
            reuse: 2000,
            ..DampingConfig::default()
        };
        assert!(c.validate().unwrap_err().key == "reuse");
    }
}
