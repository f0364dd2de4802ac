//! The immutable health snapshot the background checker publishes and every endpoint
//! reads: readiness (local) and full (local + dependency) reports, and the lifecycle.
//!
//! A snapshot is never mutated after it is published; readers load the current one from
//! an `ArcSwap` without a lock and without calling any check.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant, SystemTime};
use vigil_core::{CheckResult, Criticality, HealthReport, Status};

/// Name of the watchdog's entry in both reports: status of the background checker,
/// with the number of restarts as its observed value.
pub const WATCHDOG_CHECK: &str = "watchdog:restarts";

/// Name of the lifecycle entry in the readiness report (`starting`, `running`,
/// `shutting down`).
pub const LIFECYCLE_CHECK: &str = "lifecycle:state";

/// Entries that `?exclude=` never removes: whether the service is starting or shutting
/// down and whether its checker is alive are what readiness is for; hiding them would
/// let a prober route to a draining service or trust a dead checker's last results.
pub const RESERVED_CHECKS: [&str; 2] = [LIFECYCLE_CHECK, WATCHDOG_CHECK];

/// Output of the watchdog entry (and of the report) when the checker is stalled.
pub const STALLED: &str = "health checker stalled";

/// Where the service is in its life, as readiness sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lifecycle {
    /// Start-up checks have not all passed once yet: not ready.
    Starting,
    /// Started: readiness follows the local checks.
    Running,
    /// Shutdown has begun: not ready, so load balancers drain the service first.
    ShuttingDown,
}

impl Lifecycle {
    /// The word used in reports: `starting`, `running`, `shutting down`.
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Starting => "starting",
            Lifecycle::Running => "running",
            Lifecycle::ShuttingDown => "shutting down",
        }
    }
}

impl fmt::Display for Lifecycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One published state of the service's health.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Readiness (`/readyz`): local checks, the watchdog and the lifecycle.
    pub ready: HealthReport,
    /// Full health (`/health`): local and dependency checks and the watchdog.
    pub full: HealthReport,
    /// Lifecycle at publication.
    pub lifecycle: Lifecycle,
    /// Criticality of every entry in the reports, by name (to re-aggregate after
    /// `?exclude=`).
    pub criticality: BTreeMap<String, Criticality>,
    /// Wall-clock time of publication.
    pub published_at: SystemTime,
    /// Monotonic time of publication (std clock, comparable across runtimes).
    pub published_mono: Instant,
    /// Publication counter, increasing by one per snapshot.
    pub sequence: u64,
    /// How many times the watchdog has restarted the background checker.
    pub restarts: u64,
    /// How old a snapshot may get before readers must treat the checker as stalled.
    pub stale_after: Duration,
}

impl Snapshot {
    /// Time since publication.
    pub fn age(&self) -> Duration {
        self.published_mono.elapsed()
    }

    /// True when the snapshot is older than its allowed staleness: the checker stopped
    /// publishing (dead, hung, or starved) and nobody has said so yet.
    pub fn is_stale(&self) -> bool {
        self.age() > self.stale_after
    }

    /// Readiness as it should be served now: [`Snapshot::ready`], or a failing copy
    /// saying [`STALLED`] if the snapshot is stale.
    pub fn ready_now(&self) -> HealthReport {
        self.serve(&self.ready)
    }

    /// Full health as it should be served now (see [`Snapshot::ready_now`]).
    pub fn full_now(&self) -> HealthReport {
        self.serve(&self.full)
    }

    fn serve(&self, report: &HealthReport) -> HealthReport {
        if !self.is_stale() {
            return report.clone();
        }
        let mut r = report.clone();
        let age = humantime::format_duration(round_ms(self.age()));
        r.checks.insert(
            WATCHDOG_CHECK.into(),
            vec![stalled_result(
                self.restarts,
                &format!("no snapshot for {age}"),
            )],
        );
        r.status = Status::Fail;
        r.output = Some(STALLED.into());
        r
    }

    /// `report` without the excluded checks, its status re-aggregated. A name excludes
    /// the entry of that exact name, or every entry of that component (`postgres`
    /// excludes `postgres:connect`). The [`RESERVED_CHECKS`] are never excluded.
    pub fn exclude(&self, report: &HealthReport, names: &[String]) -> HealthReport {
        if names.is_empty() {
            return report.clone();
        }
        let excluded = |key: &str| {
            !RESERVED_CHECKS.contains(&key)
                && names
                    .iter()
                    .any(|n| key == n || key.split(':').next() == Some(n.as_str()))
        };
        let kept = report
            .checks
            .iter()
            .filter(|(k, _)| !excluded(k))
            .flat_map(|(k, rs)| {
                let c = self.criticality.get(k).copied().unwrap_or_default();
                rs.iter().map(move |r| (k.clone(), r.clone(), c))
            });
        let mut out = HealthReport::from_results(kept);
        out.version = report.version.clone();
        out.release_id = report.release_id.clone();
        out.description = report.description.clone();
        // A stall or a lifecycle state said so in the output; the reserved entries are
        // kept, so that output still holds.
        out.output = match &report.output {
            Some(o) if out.status != vigil_core::Status::Pass && o.as_str() == STALLED => {
                Some(o.clone())
            }
            _ => summarize(&out),
        };
        out
    }
}

/// The watchdog entry of a stalled checker.
pub(crate) fn stalled_result(restarts: u64, why: &str) -> CheckResult {
    CheckResult::fail(format!("{STALLED}: {why}"))
        .with_observed(restarts, "restarts")
        .with_component_type("component")
}

/// A report's top-level `output`: why it is not passing (None when it passes).
pub(crate) fn summarize(report: &HealthReport) -> Option<String> {
    let bad: Vec<String> = report
        .checks
        .iter()
        .filter(|(_, rs)| rs.iter().any(|r| r.status != Status::Pass))
        .map(|(k, rs)| {
            let worst = rs.iter().map(|r| r.status).max().unwrap_or_default();
            format!("{k} {worst}")
        })
        .collect();
    if bad.is_empty() {
        None
    } else {
        Some(bad.join(", "))
    }
}

pub(crate) fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}
