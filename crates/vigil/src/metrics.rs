//! Prometheus metrics of the health machinery, read from the published snapshot at
//! scrape time (a prometheus-client `Collector`: no second copy of the state, no global
//! registry).
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `vigil_check_status{check,kind}` | gauge | 0 pass, 1 warn, 2 fail |
//! | `vigil_check_duration_seconds{check,kind}` | gauge | how long the last run took |
//! | `vigil_health_status{endpoint}` | gauge | 0 pass, 1 warn, 2 fail, for `readyz` and `health` |
//! | `vigil_lifecycle{state}` | gauge | 1 for the current state (`starting`, `running`, `shutting_down`) |
//! | `vigil_checker_restarts_total` | counter | restarts of the background checker by the watchdog |
//! | `vigil_snapshot_age_seconds` | gauge | age of the published snapshot (stays under `stale_after` while the checker lives) |
//! | `vigil_requests_in_flight` | gauge | application requests running (with a shed layer) |
//! | `vigil_requests_shed_total` | counter | application requests shed with 503 (with a shed layer) |
//! | `vigil_admission_refused_total{reason}` | counter | requests refused by the admission layer: `expired`, `unmeetable`, `queue_time`, `queue_full` |
//! | `vigil_admission_admitted_total` | counter | requests the admission layer let through |
//! | `vigil_admission_limit` | gauge | its adaptive concurrency limit now |
//! | `vigil_admission_in_flight` | gauge | requests running under it |
//! | `vigil_admission_queued` | gauge | requests waiting in its queue |
//! | `vigil_admission_expected_latency_seconds` | gauge | the median latency its deadline rule expects |
//! | `vigil_dependency_breaker_state{dependency}` | gauge | 0 closed, 1 half-open, 2 open (per dependency guard) |
//! | `vigil_dependency_calls_total{dependency,result}` | counter | guarded calls: `ok`, `failed`, `timed_out`, `degraded` (not made: open) |
//! | `vigil_build_info{version,commit}` | gauge | 1, naming the vigil build |
//!
//! Serving: [`encode`] writes a registry in the format the scraper's `Accept` header
//! asks for (`vigil_daemon::exposition`, which `vigil lb`'s and `vigil controller`'s
//! `/metrics` use too; re-exported here).

use crate::shared::{CheckKind, Shared};
use crate::shed::ShedStats;
use crate::{Health, Lifecycle};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use vigil_core::Status;

/// The collector; see the module docs. It does not keep the background checker alive:
/// after the last [`Health`] is dropped it reports the last snapshot.
#[derive(Clone)]
pub struct HealthCollector {
    shared: Arc<Shared>,
    shed: Option<Arc<ShedStats>>,
    admission: Option<Arc<crate::Admission>>,
    guards: Vec<Arc<crate::DependencyGuard>>,
}

impl std::fmt::Debug for HealthCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthCollector").finish_non_exhaustive()
    }
}

impl HealthCollector {
    /// A collector over `health`'s snapshots.
    pub fn new(health: &Health) -> Self {
        HealthCollector {
            shared: health.shared(),
            shed: None,
            admission: None,
            guards: Vec::new(),
        }
    }

    /// Also reports a shed layer's in-flight and shed counters.
    pub fn with_shed(mut self, stats: Arc<ShedStats>) -> Self {
        self.shed = Some(stats);
        self
    }

    /// Also reports an admission layer's counters and limit.
    pub fn with_admission(mut self, admission: Arc<crate::Admission>) -> Self {
        self.admission = Some(admission);
        self
    }

    /// Also reports a dependency guard's breaker state and calls (repeatable).
    pub fn with_guard(mut self, guard: Arc<crate::DependencyGuard>) -> Self {
        self.guards.push(guard);
        self
    }

    /// Registers this collector in `registry`, and `vigil_build_info`
    /// ([`register_build_info`]).
    pub fn register(self, registry: &mut Registry) {
        registry.register_collector(Box::new(self));
        register_build_info(registry);
    }
}

pub use vigil_daemon::exposition::{
    OPENMETRICS, TEXT_0_0_4, build_info_registry, encode, encode_all, register_build_info,
    to_text_0_0_4,
};

fn status_value(s: Status) -> i64 {
    match s {
        Status::Pass => 0,
        Status::Warn => 1,
        Status::Fail => 2,
    }
}

impl Collector for HealthCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snap = self.shared.current.load_full();
        let ready = snap.ready_now();
        let full = snap.full_now();
        let kinds: Vec<(&str, &'static str)> = self
            .shared
            .checks
            .iter()
            .map(|c| {
                let kind = match c.kind {
                    CheckKind::Local => "local",
                    CheckKind::Dependency => "dependency",
                };
                (c.name.as_str(), kind)
            })
            .collect();

        let g = ConstGauge::new(0i64);
        let mut m = encoder.encode_descriptor(
            "vigil_check_status",
            "Status of each check's last run: 0 pass, 1 warn, 2 fail.",
            None,
            g.metric_type(),
        )?;
        for (name, kind) in &kinds {
            if let Some(r) = full.checks.get(*name).and_then(|rs| rs.first()) {
                let labels = [("check", *name), ("kind", *kind)];
                ConstGauge::new(status_value(r.status)).encode(m.encode_family(&labels)?)?;
            }
        }
        let g = ConstGauge::new(0f64);
        let mut m = encoder.encode_descriptor(
            "vigil_check_duration_seconds",
            "How long each check's last run took.",
            None,
            g.metric_type(),
        )?;
        for (name, kind) in &kinds {
            let d = full
                .checks
                .get(*name)
                .and_then(|rs| rs.first())
                .and_then(|r| r.duration);
            if let Some(d) = d {
                let labels = [("check", *name), ("kind", *kind)];
                ConstGauge::new(d.as_secs_f64()).encode(m.encode_family(&labels)?)?;
            }
        }
        let mut m = encoder.encode_descriptor(
            "vigil_health_status",
            "Status served by each endpoint: 0 pass, 1 warn, 2 fail.",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (endpoint, report) in [("readyz", &ready), ("health", &full)] {
            ConstGauge::new(status_value(report.status))
                .encode(m.encode_family(&[("endpoint", endpoint)])?)?;
        }
        let mut m = encoder.encode_descriptor(
            "vigil_lifecycle",
            "1 for the service's current lifecycle state.",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (state, l) in [
            ("starting", Lifecycle::Starting),
            ("running", Lifecycle::Running),
            ("shutting_down", Lifecycle::ShuttingDown),
        ] {
            ConstGauge::new(i64::from(snap.lifecycle == l))
                .encode(m.encode_family(&[("state", state)])?)?;
        }
        let c = ConstCounter::new(snap.restarts);
        c.encode(encoder.encode_descriptor(
            "vigil_checker_restarts",
            "Restarts of the background health checker by its watchdog.",
            None,
            c.metric_type(),
        )?)?;
        let g = ConstGauge::new(snap.age().as_secs_f64());
        g.encode(encoder.encode_descriptor(
            "vigil_snapshot_age_seconds",
            "Age of the published health snapshot.",
            None,
            g.metric_type(),
        )?)?;
        if let Some(shed) = &self.shed {
            let g = ConstGauge::new(shed.in_flight() as i64);
            g.encode(encoder.encode_descriptor(
                "vigil_requests_in_flight",
                "Application requests running under the concurrency limit.",
                None,
                g.metric_type(),
            )?)?;
            let c = ConstCounter::new(shed.shed_total());
            c.encode(encoder.encode_descriptor(
                "vigil_requests_shed",
                "Application requests shed with 503 over the concurrency limit.",
                None,
                c.metric_type(),
            )?)?;
        }
        if let Some(a) = &self.admission {
            let mut m = encoder.encode_descriptor(
                "vigil_admission_refused",
                "Application requests refused by the admission layer, by reason.",
                None,
                ConstCounter::new(0u64).metric_type(),
            )?;
            for reason in crate::admission::REFUSAL_REASONS {
                ConstCounter::new(a.refused(reason))
                    .encode(m.encode_family(&[("reason", reason)])?)?;
            }
            let c = ConstCounter::new(a.admitted_total());
            c.encode(encoder.encode_descriptor(
                "vigil_admission_admitted",
                "Application requests the admission layer let through.",
                None,
                c.metric_type(),
            )?)?;
            for (name, help, v) in [
                (
                    "vigil_admission_limit",
                    "The adaptive concurrency limit now.",
                    i64::from(a.limit()),
                ),
                (
                    "vigil_admission_in_flight",
                    "Requests running under the admission layer.",
                    i64::from(a.in_flight()),
                ),
                (
                    "vigil_admission_queued",
                    "Requests waiting in the admission queue.",
                    a.queued() as i64,
                ),
            ] {
                let g = ConstGauge::new(v);
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
            let g = ConstGauge::new(a.expected_latency().as_secs_f64());
            g.encode(encoder.encode_descriptor(
                "vigil_admission_expected_latency_seconds",
                "The median latency the deadline rule expects a request to take.",
                None,
                g.metric_type(),
            )?)?;
        }
        if !self.guards.is_empty() {
            let mut m = encoder.encode_descriptor(
                "vigil_dependency_breaker_state",
                "Each dependency guard's breaker: 0 closed, 1 half-open, 2 open.",
                None,
                ConstGauge::new(0i64).metric_type(),
            )?;
            for g in &self.guards {
                let v = match g.state() {
                    crate::guard::BreakerState::Closed => 0,
                    crate::guard::BreakerState::HalfOpen { .. } => 1,
                    crate::guard::BreakerState::Open { .. } => 2,
                };
                ConstGauge::new(v).encode(m.encode_family(&[("dependency", g.name())])?)?;
            }
            let mut m = encoder.encode_descriptor(
                "vigil_dependency_calls",
                "Calls through each dependency guard, by result.",
                None,
                ConstCounter::new(0u64).metric_type(),
            )?;
            for g in &self.guards {
                for result in crate::guard::CALL_RESULTS {
                    ConstCounter::new(g.calls(result)).encode(
                        m.encode_family(&[("dependency", g.name()), ("result", result)])?,
                    )?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CheckOptions, CheckResult, FnCheck};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn metrics_follow_the_snapshot() {
        let health = Health::builder()
            .local(
                "disk:free",
                FnCheck::new(|| async { crate::check::pass() }),
                CheckOptions::every(Duration::from_secs(1)),
            )
            .dependency(
                "db:ping",
                FnCheck::new(|| async { CheckResult::fail("down") }),
                CheckOptions::every(Duration::from_secs(1)),
            )
            .start();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let layer = health.shed_layer(4);
        let mut registry = Registry::default();
        HealthCollector::new(&health)
            .with_shed(layer.stats())
            .register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "vigil_check_status{check=\"disk:free\",kind=\"local\"} 0",
            "vigil_check_status{check=\"db:ping\",kind=\"dependency\"} 2",
            "vigil_health_status{endpoint=\"readyz\"} 0",
            "vigil_health_status{endpoint=\"health\"} 2",
            "vigil_lifecycle{state=\"running\"} 1",
            "vigil_lifecycle{state=\"starting\"} 0",
            "vigil_checker_restarts_total 0",
            "vigil_requests_in_flight 0",
            "vigil_requests_shed_total 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(text.contains("vigil_check_duration_seconds{check=\"db:ping\""));
        assert!(
            text.contains("vigil_build_info{version=\"0.1.0\",commit=\""),
            "{text}"
        );
    }
}
