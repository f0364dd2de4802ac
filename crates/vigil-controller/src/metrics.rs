//! Prometheus metrics (prometheus-client, a registry of our own, no global state).
//!
//! Names follow Prometheus conventions with the `vigil_controller_` prefix: counters end
//! in `_total` (prometheus-client adds it), durations are in seconds.
//!
//! Two things prometheus-client 0.24 does not do, done here:
//! - **Label values are escaped** (`\` `"` and newline, as both exposition formats
//!   require): it writes them as given, so a target id or zone with a `"` broke the
//!   whole scrape and a crafted one (`x"} 1\nvigil_controller_guard_frozen 1`) injected
//!   series. Escaping, rather than restricting ids to a character set, keeps every id
//!   an operator already uses (host names, ARNs, paths) valid; JSON, HTML and the logs
//!   escape on their own.
//! - **The Prometheus text format 0.0.4** for scrapers that do not ask for OpenMetrics
//!   ([`Metrics::encode_for`], the library's converter): prometheus-client always writes OpenMetrics, whose
//!   counter families are named without `_total`, which Prometheus' text parser and
//!   `promtool check metrics` read as counters without help (client_rust #194).

use crate::store::ActionState;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{
    EncodeLabel, EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::fmt::Write as _;
use std::sync::Arc;

/// A metric's labels.
pub type Labels = Vec<(&'static str, String)>;

/// The labels of a target's `target_up` series: shared strings, so the series' key
/// costs two reference counts, not copies of the id and zone.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TargetLabels {
    /// The target's id.
    pub target: Arc<str>,
    /// Its zone.
    pub zone: Arc<str>,
}

impl EncodeLabelSet for TargetLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("target", Escaped(&self.target)).encode(encoder.encode_label())?;
        ("zone", Escaped(&self.zone)).encode(encoder.encode_label())
    }
}

/// A label value from outside (a target id, a zone), written escaped: `\` as `\\`,
/// `"` as `\"`, a newline as `\n`, the escapes both exposition formats define.
pub struct Escaped<'a>(pub &'a str);

impl EncodeLabelValue for Escaped<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        let mut rest = self.0;
        while let Some(i) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..i])?;
            encoder.write_str(match rest.as_bytes()[i] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[i + 1..];
        }
        encoder.write_str(rest)
    }
}

/// What an action does, the `kind` label of `vigil_controller_actions_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionKind {
    /// A target's replacement (event kind `replace`).
    Replace,
    /// A freeze alert for a human (event kind `alert`).
    Alert,
}

impl ActionKind {
    /// The label value, the event's `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Replace => "replace",
            ActionKind::Alert => "alert",
        }
    }
}

/// Probe duration buckets (seconds): from a fast loopback answer to the timeout.
const PROBE_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Schedule lag buckets (seconds): fine below 10 ms, where a healthy scheduler's p99
/// lies, so its percentiles can be read off the histogram.
const LAG_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// Every metric the controller exports.
pub struct Metrics {
    registry: Registry,
    target_up: Family<TargetLabels, Gauge>,
    decisions: Family<Labels, Counter>,
    actions: Family<Labels, Counter>,
    heartbeats: Family<Labels, Counter>,
    store_errors: Counter,
    store_healthy: Gauge,
    frozen: Gauge,
    /// How long the oldest automatic freeze in force has lasted, seconds (0: none).
    frozen_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    budget_left: Gauge,
    unhealthy: Gauge,
    targets: Gauge,
    schedule_lag: Histogram,
    discovery_up: Family<Labels, Gauge>,
    discovery_failures: Family<Labels, Counter>,
    discovery_targets: Family<Labels, Gauge>,
    discovery_skipped: Family<Labels, Gauge>,
    prober_dissent: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The per-result series, looked up once: a probe then costs no label hashing
    /// beyond its own `target_up` series.
    probes_ok: (Histogram, Counter),
    probes_fail: (Histogram, Counter),
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers everything.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("vigil_controller");
        let target_up = Family::<TargetLabels, Gauge>::default();
        registry.register(
            "target_up",
            "Whether the target's last probe passed (1) or failed (0)",
            target_up.clone(),
        );
        let probe_duration =
            Family::<Labels, Histogram>::new_with_constructor(|| Histogram::new(PROBE_BUCKETS));
        registry.register(
            "probe_duration_seconds",
            "Duration of deep-health probes, by result",
            probe_duration.clone(),
        );
        let probes = Family::<Labels, Counter>::default();
        registry.register("probes", "Probes made, by result", probes.clone());
        let decisions = Family::<Labels, Counter>::default();
        registry.register(
            "decisions",
            "Guard decisions recorded (repeats excluded), by outcome",
            decisions.clone(),
        );
        let actions = Family::<Labels, Counter>::default();
        registry.register(
            "actions",
            "Actuator runs finished, by kind (replace, alert) and result (done, failed); alert on failed",
            actions.clone(),
        );
        let heartbeats = Family::<Labels, Counter>::default();
        registry.register(
            "heartbeats",
            "Heartbeats received, by result: accepted, or why refused (unsigned, bad_signature, stale, replayed, unknown_target, malformed, too_large, no_secret)",
            heartbeats.clone(),
        );
        let store_errors = Counter::default();
        registry.register(
            "store_errors",
            "Store operations that failed (commits of the engine, action bookkeeping)",
            store_errors.clone(),
        );
        let store_healthy = Gauge::default();
        registry.register(
            "store_healthy",
            "Whether the last commit of the engine succeeded (1); 0: store failing, no action is taken",
            store_healthy.clone(),
        );
        let frozen = Gauge::default();
        registry.register(
            "guard_frozen",
            "Whether the whole fleet is frozen (1): automatically or by an operator",
            frozen.clone(),
        );
        let frozen_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "guard_frozen_seconds",
            "How long the oldest automatic freeze (fleet or zone) in force has lasted, 0 when none; alert on it (guard.frozen.alert_after)",
            frozen_seconds.clone(),
        );
        let budget_left = Gauge::default();
        registry.register(
            "guard_budget_left",
            "Action budget tokens left",
            budget_left.clone(),
        );
        let unhealthy = Gauge::default();
        registry.register(
            "guard_unhealthy_targets",
            "Targets the guard counts as unhealthy",
            unhealthy.clone(),
        );
        let targets = Gauge::default();
        registry.register("targets", "Targets known", targets.clone());
        let schedule_lag = Histogram::new(LAG_BUCKETS);
        registry.register(
            "schedule_lag_seconds",
            "How late probes start against their schedule",
            schedule_lag.clone(),
        );
        let discovery_up = Family::<Labels, Gauge>::default();
        registry.register(
            "discovery_up",
            "Whether the discovery source's last try gave a list (1); 0: failing, its last list is kept",
            discovery_up.clone(),
        );
        let discovery_failures = Family::<Labels, Counter>::default();
        registry.register(
            "discovery_failures",
            "Failed tries of a discovery source (a rejected or unreadable file, an AWS API error)",
            discovery_failures.clone(),
        );
        let discovery_targets = Family::<Labels, Gauge>::default();
        registry.register(
            "discovery_targets",
            "Targets in force from a discovery source (its last list, kept through failures)",
            discovery_targets.clone(),
        );
        let discovery_skipped = Family::<Labels, Gauge>::default();
        registry.register(
            "discovery_skipped",
            "Instances a discovery source found in service but left out as targets at its last good listing (a missing or bad health-URL tag, an instance EC2 does not list yet): GET /api/discovery names them and why",
            discovery_skipped.clone(),
        );
        let prober_dissent = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "prober_dissent_ratio",
            "Share of the targets a replica has fresh results for that it fails while another prober passes them (the leader's reading, several replicas only); near 1: that replica is likely cut off from the targets, and the guard holds meanwhile",
            prober_dissent.clone(),
        );
        let probes_ok = result_series(&probe_duration, &probes, "ok");
        let probes_fail = result_series(&probe_duration, &probes, "fail");
        Metrics {
            registry,
            target_up,
            decisions,
            actions,
            heartbeats,
            store_errors,
            store_healthy,
            frozen,
            frozen_seconds,
            budget_left,
            unhealthy,
            targets,
            schedule_lag,
            discovery_up,
            discovery_failures,
            discovery_targets,
            discovery_skipped,
            prober_dissent,
            probes_ok,
            probes_fail,
        }
    }

    /// A target's `target_up` series (created if new): keep it, and set it per probe
    /// with [`Metrics::probe`] without looking it up again.
    pub fn target_up(&self, labels: &TargetLabels) -> Gauge {
        self.target_up.get_or_create(labels).clone()
    }

    /// Records a probe of the target whose `target_up` series is `up`.
    pub fn probe(&self, up: &Gauge, ok: bool, seconds: f64) {
        let (duration, count) = if ok {
            &self.probes_ok
        } else {
            &self.probes_fail
        };
        up.set(i64::from(ok));
        duration.observe(seconds);
        count.inc();
    }

    /// Forgets a removed target's series.
    pub fn forget(&self, target: &TargetLabels) {
        self.target_up.remove(target);
    }

    /// Records `n` committed decisions of one outcome.
    pub fn decision(&self, outcome: &str, n: u64) {
        if n > 0 {
            self.decisions
                .get_or_create(&vec![("outcome", outcome.to_string())])
                .inc_by(n);
        }
    }

    /// Sets a replica's dissent ratio (see `prober_dissent_ratio`).
    pub fn prober_dissent(&self, replica: &str, ratio: f64) {
        self.prober_dissent
            .get_or_create(&vec![("replica", replica.to_string())])
            .set(ratio);
    }

    /// Counts a failed store operation.
    pub fn store_error(&self) {
        self.store_errors.inc();
    }

    /// Sets the store-health gauge.
    pub fn store_healthy(&self, healthy: bool) {
        self.store_healthy.set(i64::from(healthy));
    }

    /// Records a finished action of `kind` (its event's: `replace` or `alert`).
    pub fn action(&self, kind: ActionKind, state: ActionState) {
        let s = match state {
            ActionState::Done => "done",
            ActionState::Failed => "failed",
            ActionState::Intended => "intended",
        };
        self.actions
            .get_or_create(&vec![
                ("kind", kind.as_str().to_string()),
                ("result", s.to_string()),
            ])
            .inc();
    }

    /// Counts a heartbeat: `accepted`, or the reason it was refused.
    pub fn heartbeat(&self, result: &str) {
        self.heartbeats
            .get_or_create(&vec![("result", result.to_string())])
            .inc();
    }

    /// Updates the guard gauges.
    pub fn guard(&self, frozen: bool, budget_left: u32, unhealthy: u32, targets: usize) {
        self.frozen.set(i64::from(frozen));
        self.budget_left.set(i64::from(budget_left));
        self.unhealthy.set(i64::from(unhealthy));
        self.targets.set(i64::try_from(targets).unwrap_or(i64::MAX));
    }

    /// Sets how long the oldest automatic freeze in force has lasted (0: none).
    pub fn frozen_for(&self, seconds: f64) {
        self.frozen_seconds.set(seconds);
    }

    /// Sets a discovery source's gauges: whether its last try worked, targets in force,
    /// instances in service it left out.
    pub fn discovery(&self, source: &str, ok: bool, targets: usize, skipped: usize) {
        let labels = vec![("source", source.to_string())];
        self.discovery_up.get_or_create(&labels).set(i64::from(ok));
        self.discovery_targets
            .get_or_create(&labels)
            .set(i64::try_from(targets).unwrap_or(i64::MAX));
        self.discovery_skipped
            .get_or_create(&labels)
            .set(i64::try_from(skipped).unwrap_or(i64::MAX));
    }

    /// Counts a failed try of a discovery source.
    pub fn discovery_failure(&self, source: &str) {
        self.discovery_failures
            .get_or_create(&vec![("source", source.to_string())])
            .inc();
    }

    /// Records how late a probe started.
    pub fn lag(&self, seconds: f64) {
        self.schedule_lag.observe(seconds);
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    /// `(content type, body)` for a scrape with this `Accept` header (OpenMetrics or the
    /// 0.0.4 text format), with `vigil_build_info` (outside the `vigil_controller`
    /// prefix).
    pub fn encode_for(&self, accept: Option<&str>) -> (&'static str, String) {
        let build = vigil_daemon::exposition::build_info_registry();
        vigil_daemon::exposition::encode_all(&[&self.registry, &build], accept)
    }
}

/// The (shared) histogram and counter of one probe result.
fn result_series(
    duration: &Family<Labels, Histogram>,
    count: &Family<Labels, Counter>,
    result: &str,
) -> (Histogram, Counter) {
    let labels = vec![("result", result.to_string())];
    (
        duration.get_or_create(&labels).clone(),
        count.get_or_create(&labels).clone(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_label_values_are_escaped_and_inject_nothing() {
        let m = Metrics::new();
        let labels = TargetLabels {
            target: Arc::from("x\"} 1\nvigil_controller_guard_frozen 1\n# \\"),
            zone: Arc::from("z"),
        };
        m.target_up(&labels).set(1);
        let text = m.encode_for(None).1;
        assert!(
            text.contains(
                r#"vigil_controller_target_up{target="x\"} 1\nvigil_controller_guard_frozen 1\n# \\",zone="z"} 1"#
            ),
            "{text}"
        );
        let frozen = text
            .lines()
            .filter(|l| l.starts_with("vigil_controller_guard_frozen "))
            .count();
        assert_eq!(frozen, 1, "{text}");
    }

    #[test]
    fn the_text_format_names_counter_families_with_total_and_has_no_eof() {
        let m = Metrics::new();
        m.decision("act", 1);
        let text = m.encode_for(None).1;
        assert!(
            text.contains("# TYPE vigil_controller_decisions_total counter\n"),
            "{text}"
        );
        assert!(text.contains("# HELP vigil_controller_decisions_total Guard"));
        assert!(text.contains("vigil_controller_decisions_total{outcome=\"act\"} 1\n"));
        assert!(text.contains("# TYPE vigil_controller_guard_frozen gauge\n"));
        assert!(!text.contains("# EOF"));
        assert!(m.encode().ends_with("# EOF\n"));
    }
}
