//! Cause attribution: is a target's failure its own, or a shared dependency's?
//!
//! A failing health+json report names the checks that failed. The guard sorts them:
//!
//! - the **endpoint itself failed** (connection refused, timeout, garbage, a `fail`
//!   status without a failing check): local, it counts;
//! - a **local check** failed: the check's component (the part of its name before `:`)
//!   is listed in [`CauseConfig::local_checks`] (disk, file descriptors, memory, a dead
//!   process, ...): local, it counts;
//! - a **dependency check** failed (any other name, e.g. `postgres:connect`): it counts
//!   only while fewer than [`CauseConfig::shared_min_targets`] targets fail that very
//!   check. From that many on, the failure is attributed to the shared dependency and
//!   nobody is replaced for it: replacing hosts does not fix a slow database.
//!
//! A target is replaceable only when at least one of its causes counts. No peer decides
//! for another: the counts are taken over the guard's latest observation of each target.

use crate::invalid::Invalid;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Default threshold for a shared dependency: 2 targets. Two hosts failing the very same
/// dependency check at the same time is far likelier a dependency problem than two
/// coincident local faults, and a false attribution only delays a replacement.
pub const DEFAULT_SHARED_MIN_TARGETS: u32 = 2;

/// Default local check components: the host-level checks vigil's library ships
/// (`disk`, `fd`, `memory`, `workers`, `watchdog`, `lifecycle`), the controller's
/// comparison of a queue worker with its peers (`worker:failure_rate`: a worker failing
/// far more than its peers is its own problem), and common spellings of the same (`fds`,
/// `mem`, `cpu`, `process`, `system`). A failure of one of these is the host's own.
pub fn default_local_checks() -> Vec<String> {
    [
        "disk",
        "fd",
        "fds",
        "memory",
        "mem",
        "cpu",
        "process",
        "workers",
        "worker",
        "watchdog",
        "lifecycle",
        "system",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// How failures are attributed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CauseConfig {
    /// Check components (the part before `:`, or a whole check name) that are local to
    /// the host. Defaults to [`default_local_checks`].
    pub local_checks: Vec<String>,
    /// Number of targets failing the same dependency check from which it is attributed to
    /// that shared dependency. Defaults to 2.
    pub shared_min_targets: u32,
}

impl Default for CauseConfig {
    fn default() -> Self {
        CauseConfig {
            local_checks: default_local_checks(),
            shared_min_targets: DEFAULT_SHARED_MIN_TARGETS,
        }
    }
}

impl CauseConfig {
    /// Checks the values; the error names the bad key.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.shared_min_targets < 2 {
            return Err(Invalid::new(
                "shared_min_targets",
                "must be at least 2 (one target is never shared)",
            ));
        }
        Ok(())
    }

    /// Whether a check name is one of the host's own checks.
    pub fn is_local(&self, check: &str) -> bool {
        let component = check.split(':').next().unwrap_or(check);
        self.local_checks
            .iter()
            .any(|l| l.eq_ignore_ascii_case(component) || l.eq_ignore_ascii_case(check))
    }
}

/// One reason a target fails.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    /// The endpoint failed as a whole (no usable health report, or fail with no failing check).
    Endpoint,
    /// A local check failed.
    LocalCheck {
        /// The check's name.
        check: String,
    },
    /// A dependency check failed on this target only (or on too few to be shared).
    DependencyCheck {
        /// The check's name.
        check: String,
    },
    /// A dependency check that fails on many targets: not this target's fault.
    SharedDependency {
        /// The check's name.
        check: String,
        /// Targets failing it now.
        targets: u32,
    },
}

impl Cause {
    /// Whether this cause justifies replacing the target.
    pub fn counts(&self) -> bool {
        !matches!(self, Cause::SharedDependency { .. })
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Endpoint => f.write_str("endpoint failed"),
            Cause::LocalCheck { check } => write!(f, "local check {check} failed"),
            Cause::DependencyCheck { check } => write!(f, "dependency check {check} failed"),
            Cause::SharedDependency { check, targets } => {
                write!(f, "shared dependency {check} fails on {targets} targets")
            }
        }
    }
}

/// Counts of targets failing each dependency check (derived state, rebuilt on restore).
#[derive(Clone, Debug, Default)]
pub(crate) struct SharedIndex {
    failing: BTreeMap<String, u32>,
}

impl SharedIndex {
    pub(crate) fn add(&mut self, check: &str) {
        *self.failing.entry(check.to_string()).or_default() += 1;
    }

    pub(crate) fn remove(&mut self, check: &str) {
        if let Some(n) = self.failing.get_mut(check) {
            *n -= 1;
            if *n == 0 {
                self.failing.remove(check);
            }
        }
    }

    pub(crate) fn count(&self, check: &str) -> u32 {
        self.failing.get(check).copied().unwrap_or(0)
    }
}

/// Sorts one target's failure into causes, given how many targets fail each check.
pub(crate) fn attribute(
    config: &CauseConfig,
    endpoint_failed: bool,
    failing_checks: &[String],
    index: &SharedIndex,
) -> Vec<Cause> {
    let mut causes = Vec::new();
    if endpoint_failed {
        causes.push(Cause::Endpoint);
    }
    for check in failing_checks {
        if config.is_local(check) {
            causes.push(Cause::LocalCheck {
                check: check.clone(),
            });
            continue;
        }
        let targets = index.count(check);
        if targets >= config.shared_min_targets {
            causes.push(Cause::SharedDependency {
                check: check.clone(),
                targets,
            });
        } else {
            causes.push(Cause::DependencyCheck {
                check: check.clone(),
            });
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_checks_match_by_component_case_insensitively() {
        let c = CauseConfig::default();
        assert!(c.is_local("disk:free"));
        assert!(c.is_local("Memory:utilization"));
        assert!(!c.is_local("postgres:connect"));
        assert!(!c.is_local("diskcache:hits"), "component must match whole");
    }

    #[test]
    fn a_dependency_check_failing_on_many_targets_is_attributed_to_it() {
        let c = CauseConfig::default();
        let mut idx = SharedIndex::default();
        let checks = vec!["postgres:connect".to_string(), "disk:free".to_string()];
        idx.add("postgres:connect");
        let alone = attribute(&c, false, &checks, &idx);
        assert!(alone.iter().all(Cause::counts), "{alone:?}");
        idx.add("postgres:connect");
        let shared = attribute(&c, false, &checks, &idx);
        assert_eq!(
            shared[0],
            Cause::SharedDependency {
                check: "postgres:connect".into(),
                targets: 2
            }
        );
        assert!(shared[1].counts(), "a local check still counts");
    }
}
