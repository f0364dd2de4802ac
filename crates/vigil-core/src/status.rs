//! `Status` (pass / warn / fail) and how statuses combine.
//!
//! Rules, in the order they apply:
//! 1. Statuses are ordered `Pass < Warn < Fail`; combining statuses takes the worst.
//! 2. A check marked [`Criticality::NonCritical`] can only warn: its `Fail` counts as
//!    `Warn` in the aggregate (a degraded service still serves, so it stays in service).
//! 3. An empty set of checks passes (a process with nothing to check is healthy).
//!
//! Pass and warn answer HTTP 200, fail answers 503 ([`Status::http_code`]).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The outcome of a check or of a whole service, as the health+json draft names it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Healthy.
    #[default]
    Pass,
    /// Healthy with a concern: degraded but still serving something useful.
    Warn,
    /// Unhealthy.
    Fail,
}

/// Whether a failing check makes the whole service fail, or only degrades it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Criticality {
    /// A failure of this check fails the service. Defaults to this.
    #[default]
    Critical,
    /// A failure of this check only degrades the service (counts as warn).
    NonCritical,
}

impl Status {
    /// The worse of two statuses.
    pub fn worst(self, other: Status) -> Status {
        self.max(other)
    }

    /// This status as it counts towards an aggregate, given the check's criticality.
    pub fn weighted(self, criticality: Criticality) -> Status {
        match (self, criticality) {
            (Status::Fail, Criticality::NonCritical) => Status::Warn,
            (s, _) => s,
        }
    }

    /// Aggregates checks' statuses: worst wins, non-critical failures only warn,
    /// nothing at all passes.
    pub fn aggregate<I>(items: I) -> Status
    where
        I: IntoIterator<Item = (Status, Criticality)>,
    {
        items
            .into_iter()
            .map(|(s, c)| s.weighted(c))
            .fold(Status::Pass, Status::worst)
    }

    /// The HTTP status code a health endpoint answers with: 200 for pass and warn,
    /// 503 for fail.
    pub fn http_code(self) -> u16 {
        match self {
            Status::Pass | Status::Warn => 200,
            Status::Fail => 503,
        }
    }

    /// True for pass and warn: a load balancer keeps routing to a degraded target.
    pub fn is_serving(self) -> bool {
        self != Status::Fail
    }

    /// The word the health+json draft uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status word that is not one of the draft's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown status {0:?}: expected pass, warn or fail (or ok/up, down/error)")]
pub struct UnknownStatus(pub String);

impl FromStr for Status {
    type Err = UnknownStatus;

    /// Parses the draft's words, and the aliases it lists for other ecosystems:
    /// `ok`/`up` for pass (NodeJS, Spring), `error`/`down` for fail.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "pass" | "ok" | "up" => Ok(Status::Pass),
            "warn" | "degraded" => Ok(Status::Warn),
            "fail" | "error" | "down" => Ok(Status::Fail),
            _ => Err(UnknownStatus(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_status() -> impl Strategy<Value = Status> {
        prop_oneof![Just(Status::Pass), Just(Status::Warn), Just(Status::Fail)]
    }

    #[test]
    fn empty_aggregate_passes() {
        assert_eq!(Status::aggregate([]), Status::Pass);
    }

    #[test]
    fn non_critical_failure_only_warns() {
        let s = Status::aggregate([
            (Status::Pass, Criticality::Critical),
            (Status::Fail, Criticality::NonCritical),
        ]);
        assert_eq!(
            s,
            Status::Warn,
            "a non-critical failure must degrade, not fail"
        );
    }

    #[test]
    fn critical_failure_fails() {
        let s = Status::aggregate([
            (Status::Warn, Criticality::NonCritical),
            (Status::Fail, Criticality::Critical),
        ]);
        assert_eq!(s, Status::Fail);
    }

    #[test]
    fn http_codes_follow_the_draft() {
        assert_eq!(Status::Pass.http_code(), 200);
        assert_eq!(Status::Warn.http_code(), 200, "warn is still serving");
        assert_eq!(Status::Fail.http_code(), 503);
    }

    #[test]
    fn aliases_parse() {
        assert_eq!("UP".parse::<Status>().unwrap(), Status::Pass);
        assert_eq!("down".parse::<Status>().unwrap(), Status::Fail);
        assert!("maybe".parse::<Status>().is_err());
    }

    proptest! {
        #[test]
        fn aggregate_is_worst_of_weighted(items in proptest::collection::vec((any_status(), any::<bool>()), 0..20)) {
            let items: Vec<_> = items.into_iter().map(|(s, c)| (s, if c { Criticality::Critical } else { Criticality::NonCritical })).collect();
            let agg = Status::aggregate(items.clone());
            for (s, c) in &items {
                prop_assert!(agg >= s.weighted(*c));
            }
            if items.iter().all(|(_, c)| *c == Criticality::NonCritical) {
                prop_assert!(agg <= Status::Warn, "only non-critical checks can never fail the service");
            }
            prop_assert!(items.is_empty() || items.iter().any(|(s, c)| s.weighted(*c) == agg) || agg == Status::Pass);
        }
    }
}
