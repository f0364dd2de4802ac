//! Per-check options ([`CheckOptions`]) and the health machinery's own settings
//! ([`HealthConfig`]), each default a named constant saying why.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use vigil_core::Criticality;

/// How often a check runs by default: every 10 s keeps the load on a dependency
/// predictable and small (one query per instance per 10 s) while still noticing an
/// outage well inside a typical 30 s alerting window.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// How long a check may take by default before it is cut and reported as failed: 2 s is
/// far above a healthy dependency's latency and well under the interval, so a hung check
/// never delays its own next run.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Default jitter, as a fraction of the interval: each run starts up to 10% of the
/// interval late, so a fleet restarted at once does not probe its database in lockstep,
/// while the cadence itself stays fixed (no drift).
pub const DEFAULT_JITTER: f64 = 0.1;

/// How often the background checker publishes a fresh snapshot even when no check is due
/// (its heartbeat): 1 s makes a dead checker visible within seconds.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);

/// How old a snapshot may get before the watchdog declares the checker stalled: three
/// heartbeats, so one late tick on a busy machine does not flap readiness.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(3);

/// First delay before the watchdog restarts a stalled checker; doubled on each restart
/// that follows without a healthy heartbeat in between (a crash loop), up to
/// [`MAX_RESTART_BACKOFF`]. 1 s keeps the outage short while making the stall visible to
/// anything polling `/readyz`.
pub const DEFAULT_RESTART_BACKOFF: Duration = Duration::from_secs(1);

/// Ceiling of the restart backoff: a checker that panics on every start is retried every
/// 30 s instead of in a hot loop.
pub const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(30);

/// How long [`crate::Health::drain`] keeps serving with readiness failed before letting
/// the service stop listening: 5 s covers a load balancer probing every second that needs
/// two or three failures to drain a target (vigil lb, HAProxy `fall 3 inter 1s`). Raise
/// it to `failureThreshold x periodSeconds` under Kubernetes.
pub const DEFAULT_DRAIN_DELAY: Duration = Duration::from_secs(5);

/// Options of one registered check. `Serialize` lets docs/config.md be checked against
/// the defaults (crates/vigil-cli/tests/cli/config_reference.rs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckOptions {
    /// How often the check runs. Defaults to [`DEFAULT_INTERVAL`] (10 s).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// How long one run may take before it is cut and reported as failed. Defaults to
    /// [`DEFAULT_TIMEOUT`] (2 s).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Whether a failure fails the service or only degrades it (warn). Defaults to
    /// critical.
    pub criticality: Criticality,
    /// Up to this fraction of the interval is added at random to each run's start, in
    /// `[0, 1)`. Defaults to [`DEFAULT_JITTER`] (0.1). Use 0 in tests.
    pub jitter: f64,
    /// Whether readiness waits for this check to pass once before the service leaves the
    /// starting state. `None` (the default): local checks gate start-up, dependency checks
    /// do not.
    pub gates_startup: Option<bool>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            interval: DEFAULT_INTERVAL,
            timeout: DEFAULT_TIMEOUT,
            criticality: Criticality::Critical,
            jitter: DEFAULT_JITTER,
            gates_startup: None,
        }
    }
}

impl CheckOptions {
    /// Options with this interval (and defaults for the rest).
    pub fn every(interval: Duration) -> Self {
        CheckOptions {
            interval,
            ..Default::default()
        }
    }

    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Marks the check non-critical: its failure only degrades the service (warn).
    pub fn non_critical(mut self) -> Self {
        self.criticality = Criticality::NonCritical;
        self
    }

    /// Sets the jitter fraction.
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets whether readiness waits for this check to pass once at start-up.
    pub fn gates_startup(mut self, gates: bool) -> Self {
        self.gates_startup = Some(gates);
        self
    }

    /// Checks the options; the error names the bad key.
    pub fn validate(&self) -> Result<(), String> {
        if self.interval.is_zero() {
            return Err("interval: must be greater than zero".into());
        }
        if self.timeout.is_zero() {
            return Err("timeout: must be greater than zero".into());
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(format!("jitter: {} is not in [0, 1)", self.jitter));
        }
        Ok(())
    }
}

/// Settings of the health machinery itself (checker heartbeat, watchdog, drain).
/// `Serialize` lets docs/config.md be checked against the defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// How often the checker publishes a snapshot when nothing else changed. Defaults to
    /// [`DEFAULT_HEARTBEAT`] (1 s).
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Snapshot age after which the checker counts as stalled. Defaults to
    /// [`DEFAULT_STALE_AFTER`] (3 s); must exceed the heartbeat.
    #[serde(with = "humantime_serde")]
    pub stale_after: Duration,
    /// First delay before restarting a stalled checker. Defaults to
    /// [`DEFAULT_RESTART_BACKOFF`] (1 s).
    #[serde(with = "humantime_serde")]
    pub restart_backoff: Duration,
    /// How long to keep serving with readiness failed on shutdown. Defaults to
    /// [`DEFAULT_DRAIN_DELAY`] (5 s).
    #[serde(with = "humantime_serde")]
    pub drain_delay: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            heartbeat: DEFAULT_HEARTBEAT,
            stale_after: DEFAULT_STALE_AFTER,
            restart_backoff: DEFAULT_RESTART_BACKOFF,
            drain_delay: DEFAULT_DRAIN_DELAY,
        }
    }
}

impl HealthConfig {
    /// Checks the settings; the error names the bad key.
    pub fn validate(&self) -> Result<(), String> {
        if self.heartbeat.is_zero() {
            return Err("heartbeat: must be greater than zero".into());
        }
        if self.stale_after <= self.heartbeat {
            return Err(format!(
                "stale_after: {} must exceed heartbeat ({})",
                humantime::format_duration(self.stale_after),
                humantime::format_duration(self.heartbeat)
            ));
        }
        if self.restart_backoff.is_zero() {
            return Err("restart_backoff: must be greater than zero".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_has_a_default() {
        let o: CheckOptions = toml::from_str("").unwrap();
        assert_eq!(o, CheckOptions::default());
        let c: HealthConfig = toml::from_str("").unwrap();
        assert_eq!(c, HealthConfig::default());
        assert!(o.validate().is_ok() && c.validate().is_ok());
    }

    #[test]
    fn durations_parse_as_humantime_and_unknown_keys_are_rejected() {
        let o: CheckOptions =
            toml::from_str("interval = \"250ms\"\ncriticality = \"non-critical\"").unwrap();
        assert_eq!(o.interval, Duration::from_millis(250));
        assert_eq!(o.criticality, Criticality::NonCritical);
        let err = toml::from_str::<CheckOptions>("intervall = \"1s\"").unwrap_err();
        assert!(err.to_string().contains("intervall"), "{err}");
    }

    #[test]
    fn validate_names_the_bad_key() {
        let err = CheckOptions::default().jitter(1.5).validate().unwrap_err();
        assert!(err.starts_with("jitter"), "{err}");
        let c = HealthConfig {
            stale_after: Duration::from_millis(500),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().starts_with("stale_after"));
    }
}
