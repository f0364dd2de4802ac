//! Prometheus metrics of the load balancer (prometheus-client, no global registry).
//!
//! Floor 7, shared (floors: the crate doc): imports no other module of this crate.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `vigil_lb_requests_total` | pool, target, code | client requests answered (target `none`: answered by vigil itself) |
//! | `vigil_lb_request_duration_seconds` | pool | time to the response header, histogram |
//! | `vigil_lb_target_up` | pool, target | 1 when the target is in service (healthy, not ejected) |
//! | `vigil_lb_target_ejections_total` | pool, target | outlier ejections |
//! | `vigil_lb_pool_fail_open` | pool | 1 while the pool routes to all targets (panic mode) |
//! | `vigil_lb_retries_total` | pool, reason | retries and hedges sent (connect, reset, ejected, hedge) |
//! | `vigil_lb_retries_denied_total` | pool | retries the budget refused |
//! | `vigil_lb_retries_throttled_total` | pool | retries and hedges the retry throttle refused (most attempts were failing) |
//! | `vigil_lb_requests_shed_total` | pool | client requests answered 503 at once by the pool's adaptive throttle (`throttle`: its targets refused most requests) |
//! | `vigil_lb_retry_throttle_tokens` | pool | tokens in the pool's retry throttle (retries go while above half of `max_tokens`); absent when `retries.throttle = "off"` |
//! | `vigil_lb_health_checks_total` | pool, target, result | active checks by result (pass, fail) |
//! | `vigil_lb_timeouts_total` | pool, kind | timeouts by kind: `per_try` (an attempt, retried if it may be), `response_header` (the client's wait for a head: 504), `deadline` (the client's own deadline, `headers.deadline = "trust"`: 504), `send` (the target took none of the request: 504), `response_body` (the body stalled after its head: connection cut), `request` (the overall deadline: 504 before the head, cut after) |
//! | `vigil_lb_tunnels_total` | pool | tunnels opened (a `101` to a WebSocket or other upgrade) |
//! | `vigil_lb_tunnels_open` | pool | tunnels open now |
//! | `vigil_lb_tunnels_closed_total` | pool, reason | tunnels closed: `closed` (by the peers), `idle` (`timeouts.tunnel_idle`), `drain` (the drain time ran out after SIGTERM), `error` |
//! | `vigil_lb_tunnel_bytes_total` | pool, direction | bytes through tunnels, `to_target` or `to_client`, counted as they move |
//! | `vigil_lb_tls_handshakes_total` | result | TLS handshakes on the TLS listeners: `ok`, `error` (no common protocol, a bad client hello, a reset), `timeout` (`timeouts.client_header`) |
//! | `vigil_lb_client_connections` | listener | client connections open now, by listener (`listen`, `tls_listeners.<name>`), idle and parked ones included |
//! | `vigil_lb_client_connections_refused_total` | listener | client connections refused at once because `limits.max_client_connections` were open on that listener |
//! | `vigil_lb_access_log_dropped_total` | | access log lines dropped because the writer fell behind (`[access_log]`; a request never waits for its line) |
//! | `vigil_lb_access_log_write_errors_total` | | access log lines that could not be written (the file cannot be opened, a full or read-only disk) |
//! | `vigil_lb_request_fields_dropped_total` | reason | client request header fields not forwarded (`underscore`: a name with `_`, dropped or refused per `headers.underscores`) |
//! | `vigil_lb_share_peers_live` | | `[share]` peers that answered their feed within 2 intervals |
//! | `vigil_lb_share_fallback_targets` | pool | targets a peer should probe whose verdicts are stale, probed here every interval instead |
//! | `vigil_lb_share_disagreements_total` | pool, target | a local probe and a fresh peer verdict made after it differ: one balancer's path to the target, not the target |
//! | `vigil_lb_share_verdicts_taken_total` | pool | peers' passing verdicts observed instead of a local probe |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Labels of a per-pool metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// Pool name.
    pub pool: String,
}

/// Labels of a per-target metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    /// Pool name.
    pub pool: String,
    /// `host:port`.
    pub target: String,
}

/// Labels of the request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Pool name (`none` when no route matched).
    pub pool: String,
    /// `host:port`, or `none` when vigil answered itself.
    pub target: String,
    /// HTTP status code sent to the client.
    pub code: String,
}

/// Labels of the retry counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    /// Pool name.
    pub pool: String,
    /// Why: connect, reset, ejected, hedge.
    pub reason: String,
}

/// Labels of the health-check counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckLabels {
    /// Pool name.
    pub pool: String,
    /// `host:port`.
    pub target: String,
    /// pass or fail.
    pub result: String,
}

/// Labels of the timeout counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TimeoutLabels {
    /// Pool name.
    pub pool: String,
    /// per_try, response_header, deadline, send, response_body, request.
    pub kind: String,
}

/// Labels of the dropped-field counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// Why: underscore.
    pub reason: String,
}

/// Labels of the tunnel byte counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TunnelBytesLabels {
    /// Pool name.
    pub pool: String,
    /// `to_target` or `to_client`.
    pub direction: String,
}

/// Labels of the closed-tunnel counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TunnelCloseLabels {
    /// Pool name.
    pub pool: String,
    /// closed, idle, drain, error.
    pub reason: String,
}

/// Labels of the client connection metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    /// The listener's key in lb.toml: `listen` or `tls_listeners.<name>`.
    pub listener: String,
}

/// Labels of the TLS handshake counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabels {
    /// ok, error, timeout.
    pub result: String,
}

/// Every metric, registered in one registry.
pub struct Metrics {
    registry: Registry,
    /// Requests by pool, target, code.
    pub requests: Family<RequestLabels, Counter>,
    /// Time to response header by pool.
    pub duration: Family<PoolLabels, Histogram>,
    /// Target in service.
    pub target_up: Family<TargetLabels, Gauge>,
    /// Outlier ejections.
    pub ejections: Family<TargetLabels, Counter>,
    /// Pool in fail-open.
    pub fail_open: Family<PoolLabels, Gauge>,
    /// Retries and hedges sent.
    pub retries: Family<RetryLabels, Counter>,
    /// Retries refused by the budget.
    pub retries_denied: Family<PoolLabels, Counter>,
    /// Retries and hedges refused by the retry throttle.
    pub retries_throttled: Family<PoolLabels, Counter>,
    /// Requests shed locally by the adaptive throttle.
    pub requests_shed: Family<PoolLabels, Counter>,
    /// Tokens in each pool's retry throttle.
    pub retry_throttle_tokens: Family<PoolLabels, Gauge<f64, AtomicU64>>,
    /// Active checks.
    pub checks: Family<CheckLabels, Counter>,
    /// Client request fields not forwarded.
    pub fields_dropped: Family<DropLabels, Counter>,
    /// Timeouts by kind.
    pub timeouts: Family<TimeoutLabels, Counter>,
    /// Tunnels opened.
    pub tunnels: Family<PoolLabels, Counter>,
    /// Tunnels open now.
    pub tunnels_open: Family<PoolLabels, Gauge>,
    /// Tunnels closed, by reason.
    pub tunnels_closed: Family<TunnelCloseLabels, Counter>,
    /// Bytes through tunnels, by direction.
    pub tunnel_bytes: Family<TunnelBytesLabels, Counter>,
    /// TLS handshakes by result.
    pub tls_handshakes: Family<HandshakeLabels, Counter>,
    /// Client connections open, by listener.
    pub client_connections: Family<ListenerLabels, Gauge>,
    /// Client connections refused over the limit, by listener.
    pub client_connections_refused: Family<ListenerLabels, Counter>,
    /// `[share]` peers live.
    pub share_peers_live: Gauge,
    /// Targets probed in fallback, by pool.
    pub share_fallback_targets: Family<PoolLabels, Gauge>,
    /// Disagreements of vantage points, by target.
    pub share_disagreements: Family<TargetLabels, Counter>,
    /// Peers' passes observed, by pool.
    pub share_verdicts_taken: Family<PoolLabels, Counter>,
    /// Access log lines dropped because the writer's channel was full.
    pub access_log_dropped: Counter,
    /// Access log lines that could not be written (the file cannot be opened or written).
    pub access_log_write_errors: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `vigil_lb` prefix.
    pub fn new() -> Self {
        let mut root = Registry::default();
        vigil_daemon::exposition::register_build_info(&mut root);
        let registry = root.sub_registry_with_prefix("vigil_lb");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("requests", "Client requests answered", requests.clone());
        // Family's constructor type defaults to `fn() -> M`: a plain function fits it.
        let duration = Family::<PoolLabels, Histogram>::new_with_constructor(duration_histogram);
        registry.register(
            "request_duration_seconds",
            "Time from request to response header",
            duration.clone(),
        );
        let target_up = Family::<TargetLabels, Gauge>::default();
        registry.register(
            "target_up",
            "1 when the target is in service",
            target_up.clone(),
        );
        let ejections = Family::<TargetLabels, Counter>::default();
        registry.register("target_ejections", "Outlier ejections", ejections.clone());
        let fail_open = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "pool_fail_open",
            "1 while the pool routes to all targets",
            fail_open.clone(),
        );
        let retries = Family::<RetryLabels, Counter>::default();
        registry.register("retries", "Retries and hedges sent", retries.clone());
        let retries_denied = Family::<PoolLabels, Counter>::default();
        registry.register(
            "retries_denied",
            "Retries refused by the retry budget",
            retries_denied.clone(),
        );
        let retries_throttled = Family::<PoolLabels, Counter>::default();
        registry.register(
            "retries_throttled",
            "Retries and hedges refused by the retry throttle",
            retries_throttled.clone(),
        );
        let retry_throttle_tokens = Family::<PoolLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "retry_throttle_tokens",
            "Tokens in the retry throttle; retries go while above half its size",
            retry_throttle_tokens.clone(),
        );
        let requests_shed = Family::<PoolLabels, Counter>::default();
        registry.register(
            "requests_shed",
            "Client requests answered 503 at once by the adaptive throttle",
            requests_shed.clone(),
        );
        let checks = Family::<CheckLabels, Counter>::default();
        registry.register("health_checks", "Active health checks", checks.clone());
        let timeouts = Family::<TimeoutLabels, Counter>::default();
        registry.register("timeouts", "Timeouts by kind", timeouts.clone());
        let fields_dropped = Family::<DropLabels, Counter>::default();
        registry.register(
            "request_fields_dropped",
            "Client request header fields not forwarded",
            fields_dropped.clone(),
        );
        let tunnels = Family::<PoolLabels, Counter>::default();
        registry.register(
            "tunnels",
            "Tunnels opened (101 to an upgrade)",
            tunnels.clone(),
        );
        let tunnels_open = Family::<PoolLabels, Gauge>::default();
        registry.register("tunnels_open", "Tunnels open now", tunnels_open.clone());
        let tunnels_closed = Family::<TunnelCloseLabels, Counter>::default();
        registry.register(
            "tunnels_closed",
            "Tunnels closed, by reason",
            tunnels_closed.clone(),
        );
        let tunnel_bytes = Family::<TunnelBytesLabels, Counter>::default();
        registry.register(
            "tunnel_bytes",
            "Bytes through tunnels, by direction",
            tunnel_bytes.clone(),
        );
        let tls_handshakes = Family::<HandshakeLabels, Counter>::default();
        registry.register(
            "tls_handshakes",
            "TLS handshakes on the TLS listeners, by result",
            tls_handshakes.clone(),
        );
        let client_connections = Family::<ListenerLabels, Gauge>::default();
        registry.register(
            "client_connections",
            "Client connections open, by listener",
            client_connections.clone(),
        );
        let client_connections_refused = Family::<ListenerLabels, Counter>::default();
        registry.register(
            "client_connections_refused",
            "Client connections refused because limits.max_client_connections were open",
            client_connections_refused.clone(),
        );
        let access_log_dropped = Counter::default();
        registry.register(
            "access_log_dropped",
            "Access log lines dropped because the writer fell behind (its channel was full)",
            access_log_dropped.clone(),
        );
        let access_log_write_errors = Counter::default();
        registry.register(
            "access_log_write_errors",
            "Access log lines that could not be written (file not writable, disk full)",
            access_log_write_errors.clone(),
        );
        let share_peers_live = Gauge::default();
        registry.register(
            "share_peers_live",
            "[share] peers that answered within 2 intervals",
            share_peers_live.clone(),
        );
        let share_fallback_targets = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "share_fallback_targets",
            "Targets whose peer verdicts are stale, probed here every interval",
            share_fallback_targets.clone(),
        );
        let share_disagreements = Family::<TargetLabels, Counter>::default();
        registry.register(
            "share_disagreements",
            "Local probe and peer verdict differ: a path to the target, not the target",
            share_disagreements.clone(),
        );
        let share_verdicts_taken = Family::<PoolLabels, Counter>::default();
        registry.register(
            "share_verdicts_taken",
            "Peers' passing verdicts observed instead of a local probe",
            share_verdicts_taken.clone(),
        );
        Metrics {
            share_peers_live,
            share_fallback_targets,
            share_disagreements,
            share_verdicts_taken,
            access_log_dropped,
            access_log_write_errors,
            registry: root,
            client_connections,
            client_connections_refused,
            tls_handshakes,
            tunnels,
            tunnels_open,
            tunnels_closed,
            tunnel_bytes,
            requests,
            duration,
            target_up,
            ejections,
            fail_open,
            retries,
            retries_denied,
            retries_throttled,
            retry_throttle_tokens,
            requests_shed,
            checks,
            fields_dropped,
            timeouts,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// `(content type, body)` for a scrape with this `Accept` header: OpenMetrics or
    /// the 0.0.4 text format ([`vigil_daemon::exposition::encode`]).
    pub fn encode_for(&self, accept: Option<&str>) -> (&'static str, String) {
        vigil_daemon::exposition::encode(&self.registry, accept)
    }
}

/// 100 us to about 13 s in powers of two.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}
