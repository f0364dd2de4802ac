//! `lb.toml`: the load balancer's configuration, its defaults, and errors that name the
//! file, line and key.
//!
//! Floor 7, shared (floors: the crate doc): imports no other module of this crate.
//!
//! Every section is `#[serde(default, deny_unknown_fields)]`: an empty file is a valid
//! (if useless) configuration, a misspelt key is an error. Loading ends in
//! [`LbConfig::validate`], whose errors name the key; [`load`] turns both parse and
//! validation errors into a [`ConfigError`] carrying the file, line and column of the key
//! and the offending source line. `examples/lb.toml` documents every key.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vigil_core::Invalid;
use vigil_core::anomaly::{self, AnomalyConfig};
use vigil_core::outlier::OutlierConfig;
use vigil_core::pool::{NewTargets, PoolConfig, RetryBudgetConfig};
use vigil_core::thresholds::{
    DEFAULT_HEALTHY_THRESHOLD, DEFAULT_UNHEALTHY_THRESHOLD, ThresholdsConfig,
};
use vigil_core::throttle::{AdaptiveThrottleConfig, RetryThrottleConfig};

pub mod share;
pub use share::ShareConfig;

/// Exit code of a configuration that does not load (sysexits' EX_CONFIG): `vigil lb`,
/// `vigil lb check-config`, and the daemon at start.
pub const EXIT_BAD_CONFIG: u8 = 78;

/// Default client listener: loopback, a non-privileged port.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default admin listener (`/admin/targets`, `/metrics`): loopback only, Envoy's admin
/// port; never exposed by default because it tells everything about the fleet.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9901";
/// Default worker threads: 0, one per CPU (the proxy is CPU-bound; more threads than
/// cores only add context switches). 1 selects a single-threaded runtime.
pub const DEFAULT_WORKERS: usize = 0;
/// Default time to finish in-flight requests after SIGTERM: 10 s, below Kubernetes'
/// 30 s termination grace period, so the drain ends before a SIGKILL.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Default scheduler slice of a worker thread: 300 us (docs/lb.md, "Worker slices").
pub const DEFAULT_WORKER_SLICE: Duration = Duration::from_micros(300);
/// The slices Linux's fair scheduler accepts (it clamps to this range).
pub const WORKER_SLICE_RANGE: (Duration, Duration) =
    (Duration::from_micros(100), Duration::from_millis(100));
/// Default connect timeout: 1 s. On a LAN a connect takes well under a millisecond; a
/// target that cannot accept within a second is as good as down, and the request is
/// retried elsewhere (connect failures are always safe to retry).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default response-header timeout: 10 s. The gray-failure defence: a frozen target (it
/// accepts, never answers) holds a request at most this long, where peers wait 30-60 s.
pub const DEFAULT_RESPONSE_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default longest wait for a target to take more of a request: 10 s, as the response
/// header's. A target that takes nothing for that long (frozen, or refusing an upload
/// without answering) gets no more of the client's time (nginx: 60 s, then 504).
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Default longest wait for more of a response body once its head went to the client:
/// 60 s (nginx's `proxy_read_timeout`, which also applies between reads); long enough
/// for a stream with heartbeats, short enough that a stalled body is cut.
pub const DEFAULT_RESPONSE_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default deadline of a whole exchange (upload, response header, response body): 5
/// minutes, so that no request (a trickled upload, a body dripping under every stall
/// limit) holds a client and a target connection for ever. Envoy's route timeout works
/// the same way at 15 s; `"0s"` disables it for long downloads and streams.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Default idle time of a pooled backend connection: 30 s, below the common 60-75 s
/// keep-alive timeouts of backends (nginx 75 s), so we close first and never send a
/// request on a connection the backend is closing.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time a client has to send a complete request header: 10 s (HAProxy's
/// `timeout http-request` advice). A slowloris client gets 408 after it. It also bounds
/// how long an idle keep-alive client connection is kept.
pub const DEFAULT_CLIENT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time an HTTP/2 client connection with no stream being served is kept: 75 s,
/// nginx's `keepalive_timeout`, which bounds idle HTTP/2 connections since 1.19.7.
/// Longer than an HTTP/1.1 keep-alive (`client_header`) because one HTTP/2 connection
/// carries all of a client's requests (a gRPC channel), and reopening it costs a
/// handshake; the client is told GOAWAY first, so it opens a new one without failing a
/// request.
pub const DEFAULT_CLIENT_H2_IDLE_TIMEOUT: Duration = Duration::from_secs(75);
/// Default time a client has to take each part of its answer: 60 s (nginx's
/// `send_timeout`). A client that stops reading (slow read) is disconnected after it, so
/// it cannot hold a target connection whose body is being relayed.
pub const DEFAULT_CLIENT_WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default longest quiet time of a tunnel (a WebSocket after its `101`): 1 hour,
/// HAProxy's advice for `timeout tunnel`. A WebSocket idles for minutes between
/// messages (and most send pings well within this); a tunnel nobody uses for an hour
/// is closed rather than held for ever.
pub const DEFAULT_TUNNEL_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// Default limit on a request header: 16 KiB (HAProxy's `tune.bufsize`); larger gets 431.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 16 * 1024;
/// Default limit on the client connections open at once on one listener: 10,000.
/// Each in flight needs a second descriptor for its target, so this stays within the
/// 65,536 open files a systemd unit commonly allows (`LimitNOFILE`), and at the 14 KiB
/// a slow HTTP/2 client holds until `client_header` closes it (`bench/lb/slow_h2.py`,
/// issue 38) it caps them near 140 MiB;
/// `bench/lb/memory.py`'s 9,000 idle connections stay under it. nginx's default is 512
/// per worker (`worker_connections`), HAProxy derives its `maxconn` from the open-file
/// limit.
pub const DEFAULT_MAX_CLIENT_CONNECTIONS: usize = 10_000;
/// Default largest request body buffered so that the request can be retried or hedged:
/// 64 KiB; larger bodies stream straight through and are never retried.
pub const DEFAULT_MAX_RETRY_BODY_BYTES: usize = 64 * 1024;
/// Default number of retries of one request: 2 (three targets tried at most), within
/// the retry budget.
pub const DEFAULT_MAX_RETRIES: u32 = 2;
/// Default health-check path: `/readyz`, the local-health endpoint a load balancer
/// should use (Kubernetes convention; vigil's library serves it).
pub const DEFAULT_HEALTH_PATH: &str = "/readyz";
/// Default health-check interval: 2 s (HAProxy's `inter`); with the default unhealthy
/// threshold of 3 and 1 s timeout, a dead target is out within about 7 s.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(2);
/// Default health-check timeout: 1 s; a local health endpoint answers in milliseconds.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
/// Default jitter of the interval: +-10%, so checks of many targets do not align.
pub const DEFAULT_HEALTH_JITTER: f64 = 0.1;
/// Default expected statuses: 2xx and 3xx, as HAProxy's `httpchk` accepts.
pub const DEFAULT_EXPECTED_STATUSES: &str = "200-399";
/// Default hedging quantile: a request still unanswered past the pool's recent p95
/// latency is hedged, so at most about 5% of requests are duplicated.
pub const DEFAULT_HEDGE_QUANTILE: f64 = 0.95;
/// Default lower bound of the hedge delay: 10 ms, so a very fast pool does not hedge on
/// scheduling noise.
pub const DEFAULT_HEDGE_MIN_DELAY: Duration = Duration::from_millis(10);
/// Default upper bound of the hedge delay: 1 s.
pub const DEFAULT_HEDGE_MAX_DELAY: Duration = Duration::from_secs(1);

/// The whole configuration of `vigil lb`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LbConfig {
    /// Address the proxy listens on. Defaults to 127.0.0.1:8080.
    pub listen: SocketAddr,
    /// Address of the admin listener (`/admin/targets`, `/metrics`). Defaults to
    /// 127.0.0.1:9901.
    pub admin_listen: SocketAddr,
    /// Worker threads; 0 = one per CPU. Defaults to 0.
    pub workers: usize,
    /// The turn each worker thread asks Linux's fair scheduler for (`sched_setattr`,
    /// Linux 6.12 and later; older kernels keep their default): a proxy's work per
    /// request is short, and a worker on short turns gets the CPU back sooner when it
    /// shares it. 0s leaves the kernel's default. Defaults to 300us.
    #[serde(with = "humantime_serde")]
    pub worker_slice: Duration,
    /// Time to finish in-flight requests after SIGTERM. Defaults to 10s.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Timeouts.
    pub timeouts: TimeoutsConfig,
    /// Limits on client requests.
    pub limits: LimitsConfig,
    /// What is done with client request header fields.
    pub headers: HeadersConfig,
    /// Shared probe verdicts among balancers (`[share]`, config/share.rs).
    pub share: ShareConfig,
    /// Routing rules, tried in order; the first match wins.
    pub routes: Vec<RouteConfig>,
    /// Listeners that terminate TLS (HTTPS), by name, each with its certificates.
    pub tls_listeners: BTreeMap<String, TlsListenerConfig>,
    /// Pools of targets, by name.
    pub pools: BTreeMap<String, PoolSection>,
    /// One JSON line per request (off by default).
    pub access_log: AccessLogConfig,
}

impl Default for LbConfig {
    fn default() -> Self {
        LbConfig {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            admin_listen: DEFAULT_ADMIN_LISTEN.parse().expect("valid default address"),
            workers: DEFAULT_WORKERS,
            worker_slice: DEFAULT_WORKER_SLICE,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            timeouts: TimeoutsConfig::default(),
            limits: LimitsConfig::default(),
            headers: HeadersConfig::default(),
            share: ShareConfig::default(),
            routes: Vec::new(),
            tls_listeners: BTreeMap::new(),
            pools: BTreeMap::new(),
            access_log: AccessLogConfig::default(),
        }
    }
}

/// Default access log destination: `-`, standard output (a container's log collector
/// reads it; vigil's own logs go to standard error).
pub const DEFAULT_ACCESS_LOG_PATH: &str = "-";
/// Default lines the access log's channel holds: 16,384, about a second of a busy
/// worker's requests (bench/lb: tens of thousands per second) while the disk stalls;
/// past it, lines are dropped and counted rather than slowing a request.
pub const DEFAULT_ACCESS_LOG_BUFFER: usize = 16 * 1024;

/// Access logs (`[access_log]`): one JSON line per client request, written by a thread
/// of its own (docs/lb.md, "Access logs").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AccessLogConfig {
    /// Write a line per request. Defaults to false.
    pub enabled: bool,
    /// Where: `-` for standard output, or a file (appended to; relative to the
    /// configuration file's directory; opened anew on SIGHUP, for logrotate). Defaults
    /// to `-`.
    pub path: PathBuf,
    /// Log the query string too. A query may hold secrets (tokens, e-mail addresses),
    /// so only the path is logged unless this is true. Defaults to false.
    pub query: bool,
    /// Lines waiting for the writer at most; more are dropped and counted
    /// (`vigil_lb_access_log_dropped_total`). At least 1. Defaults to 16384.
    pub buffer: usize,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        AccessLogConfig {
            enabled: false,
            path: PathBuf::from(DEFAULT_ACCESS_LOG_PATH),
            query: false,
            buffer: DEFAULT_ACCESS_LOG_BUFFER,
        }
    }
}

/// Timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimeoutsConfig {
    /// Connecting to a target. Defaults to 1s.
    #[serde(with = "humantime_serde")]
    pub connect: Duration,
    /// From the start of forwarding to a complete response header, all attempts
    /// (retries, hedges) included; past it the client gets 504. A streamed request body
    /// is not counted: the time starts when it was sent. Defaults to 10s.
    #[serde(with = "humantime_serde")]
    pub response_header: Duration,
    /// Time one attempt has for its response header (at most `response_header`); an
    /// attempt past it is abandoned, counted as a timeout by outlier detection, and a
    /// retriable request (see `retries.methods`) is retried on another target while
    /// `response_header` allows. Absent: derived per pool,
    /// `response_header / (max_retries + 1)`, at least 500ms and at most
    /// `response_header` ([`vigil_core::retry::default_per_try`]), as a cue to retry
    /// only: when no retry can go, the attempt keeps the rest of `response_header`.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub per_try: Option<Duration>,
    /// Longest wait for a target to take more of a request (head or body); then 504
    /// (retried like a per-try timeout when the request may be). Defaults to 10s.
    #[serde(with = "humantime_serde")]
    pub send: Duration,
    /// Longest wait for more of a response body once its head went to the client; then
    /// the client connection is closed (the answer is visibly cut). Defaults to 60s.
    #[serde(with = "humantime_serde")]
    pub response_body: Duration,
    /// Deadline of the whole exchange from the request head: upload, response header,
    /// response body. Past it: 504 before the response head was forwarded, the
    /// connection closed after. `"0s"` disables it. Defaults to 5m.
    #[serde(with = "humantime_serde")]
    pub request: Duration,
    /// Idle time after which a pooled backend connection is closed. Defaults to 30s.
    #[serde(with = "humantime_serde")]
    pub idle: Duration,
    /// Time a client has to send a complete request header (408 after it); also the
    /// idle time of a keep-alive client connection. Defaults to 10s.
    #[serde(with = "humantime_serde")]
    pub client_header: Duration,
    /// Longest wait for a client to take more of its answer (it stopped reading);
    /// then the connection closes. Defaults to 60s.
    #[serde(with = "humantime_serde")]
    pub client_write: Duration,
    /// How long an HTTP/2 client connection with no stream being served is kept; then
    /// GOAWAY and close. (An HTTP/2 header block must be done within `client_header`.)
    /// Defaults to 75s.
    #[serde(with = "humantime_serde")]
    pub client_h2_idle: Duration,
    /// Longest time a tunnel (a WebSocket or other upgrade, after the target's `101`)
    /// may pass no byte either way; then both sides are closed. Defaults to 1h.
    #[serde(with = "humantime_serde")]
    pub tunnel_idle: Duration,
}

impl TimeoutsConfig {
    /// The time one attempt of a pool that retries up to `max_retries` times has for
    /// its response header: `per_try` when set, else derived from `response_header`
    /// ([`vigil_core::retry::default_per_try`]).
    pub fn per_try_for(&self, max_retries: u32) -> Duration {
        self.per_try.unwrap_or_else(|| {
            vigil_core::retry::default_per_try(self.response_header, max_retries)
        })
    }
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        TimeoutsConfig {
            connect: DEFAULT_CONNECT_TIMEOUT,
            response_header: DEFAULT_RESPONSE_HEADER_TIMEOUT,
            per_try: None,
            send: DEFAULT_SEND_TIMEOUT,
            response_body: DEFAULT_RESPONSE_BODY_TIMEOUT,
            request: DEFAULT_REQUEST_TIMEOUT,
            idle: DEFAULT_IDLE_TIMEOUT,
            client_header: DEFAULT_CLIENT_HEADER_TIMEOUT,
            client_write: DEFAULT_CLIENT_WRITE_TIMEOUT,
            client_h2_idle: DEFAULT_CLIENT_H2_IDLE_TIMEOUT,
            tunnel_idle: DEFAULT_TUNNEL_IDLE_TIMEOUT,
        }
    }
}

/// Limits on client requests.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest request header in bytes (at least 8192); larger gets 431. Defaults to 16384.
    pub max_header_bytes: usize,
    /// Largest request body buffered for retries and hedging; larger bodies stream and
    /// are never retried. Defaults to 65536.
    pub max_retry_body_bytes: usize,
    /// Client connections open at once on one listener (the plain `listen`, each TLS
    /// listener; over every worker), idle ones included; more are refused at once
    /// (503 on a plain listener, closed before the handshake on a TLS one). At least
    /// 1. Defaults to 10000.
    pub max_client_connections: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_retry_body_bytes: DEFAULT_MAX_RETRY_BODY_BYTES,
            max_client_connections: DEFAULT_MAX_CLIENT_CONNECTIONS,
        }
    }
}

/// What is done with client request header fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HeadersConfig {
    /// Fields whose name has an underscore: `drop`, `forward` or `reject`. Defaults
    /// to `drop`.
    pub underscores: Underscores,
    /// A deadline the client sends (`x-vigil-deadline-ms`, and `grpc-timeout` on gRPC
    /// requests): `strip` or `trust`. Defaults to `strip`.
    pub deadline: ClientDeadline,
}

/// What is done with a deadline a client sends ([`vigil_core::admission::DEADLINE_HEADER`],
/// `grpc-timeout`). Every attempt carries the balancer's own deadline (the time it will
/// still wait for that attempt's response header); the question is whether the client's
/// may shorten it. Anyone can send the header: a client that is not another tier of
/// your own could make targets refuse its requests, or, were it believed without the
/// balancer's own bound, make them work on requests nobody waits for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientDeadline {
    /// Ignore it: the field is not forwarded, and targets get the balancer's deadline
    /// alone (on gRPC requests, `grpc-timeout` is replaced by it). Defaults to this.
    #[default]
    Strip,
    /// Honour it: the balancer waits no longer than the client (a malformed value is
    /// ignored), and targets get the shorter of the two.
    Trust,
}

/// What to do with a request header field whose name has an underscore
/// (`Content_Length`). CGI, WSGI and similar gateways map `-` and `_` to the same
/// variable (`CONTENT_LENGTH`), so a target behind one may take such a field for the
/// framing field vigil did not see: a request-smuggling vector. nginx drops them by
/// default (`underscores_in_headers off`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Underscores {
    /// Leave the field out of the forwarded request (counted in
    /// `vigil_lb_request_fields_dropped_total{reason="underscore"}`). Defaults to this.
    #[default]
    Drop,
    /// Forward it as sent.
    Forward,
    /// Answer 400 (counted the same way).
    Reject,
}

/// Default ALPN protocols of a TLS listener, in the server's order of preference.
pub const DEFAULT_ALPN: [&str; 2] = ["h2", "http/1.1"];

/// A listener that terminates TLS: requests arriving on it are routed like the plain
/// listener's (`X-Forwarded-Proto: https`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsListenerConfig {
    /// Address to listen on (required; a restart is needed to change it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Protocols offered in the TLS handshake (ALPN), in order of preference: `h2`,
    /// `http/1.1`. Defaults to `["h2", "http/1.1"]`.
    pub alpn: Vec<String>,
    /// Certificates, chosen by the name the client asks for (SNI); the first is the
    /// default (no SNI, or a name no certificate lists). At least one.
    pub certificates: Vec<CertificateConfig>,
}

impl Default for TlsListenerConfig {
    fn default() -> Self {
        TlsListenerConfig {
            listen: None,
            alpn: DEFAULT_ALPN.iter().map(|s| s.to_string()).collect(),
            certificates: Vec::new(),
        }
    }
}

/// A certificate chain and its private key (PEM files; a relative path is relative to
/// the configuration file's directory), and the server names it is chosen for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CertificateConfig {
    /// PEM file of the certificate chain, the server's certificate first (required).
    pub cert: PathBuf,
    /// PEM file of its private key (PKCS#8, PKCS#1 or SEC1; required).
    pub key: PathBuf,
    /// Names (SNI) this certificate is chosen for: `api.example.com`, or
    /// `*.example.com` for one label below. Empty: only as the listener's default (when
    /// it is the first). Defaults to empty.
    pub server_names: Vec<String>,
}

/// One routing rule: requests whose host and path match go to `pool`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteConfig {
    /// Host to match (case-insensitive, port ignored); absent matches any host.
    pub host: Option<String>,
    /// Path prefix to match. Defaults to `/` (everything).
    pub path_prefix: Option<String>,
    /// The pool to route to (required).
    pub pool: String,
}

/// Balancing policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Balance {
    /// Power of two choices on outstanding requests. Defaults to this.
    #[default]
    P2c,
    /// Round-robin (weighted).
    RoundRobin,
    /// Least outstanding requests over every target (weighted), like HAProxy's
    /// `leastconn`.
    LeastRequest,
}

/// One target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TargetConfig {
    /// `host:port` (required).
    pub addr: String,
    /// Relative share of traffic. Defaults to 1.
    pub weight: u32,
    /// Zone, reported in `/admin/targets`.
    pub zone: Option<String>,
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            addr: String::new(),
            weight: vigil_core::pool::DEFAULT_WEIGHT,
            zone: None,
        }
    }
}

/// The protocol spoken to a pool's targets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// HTTP/1.1 (keep-alive, pooled connections). Defaults to this.
    #[default]
    Http1,
    /// HTTP/2 in cleartext with prior knowledge (one multiplexed connection per target
    /// and worker): gRPC services, whose trailers HTTP/1.1 cannot carry.
    H2,
}

/// TLS to a pool's targets: whom to trust, which name to verify, and the balancer's
/// own certificate for targets that ask for one. Certificates are always verified:
/// a target with a self-signed certificate is trusted by naming it (or its CA) in `ca`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TargetTlsConfig {
    /// PEM file of the certificate authorities the targets' certificates chain to
    /// (relative to the configuration file's directory). Absent: the system's roots.
    pub ca: Option<PathBuf>,
    /// The name sent as SNI and verified against every target's certificate. Absent:
    /// each target's own host (a name, or an IP address verified as an IP SAN).
    pub server_name: Option<String>,
    /// PEM chain the balancer presents to targets that ask for a client certificate
    /// (mutual TLS); needs `key`.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
}

/// The kind of active health check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckType {
    /// GET `path` over HTTP/1.1. Defaults to this.
    #[default]
    Http,
    /// gRPC health v1 `Check` (`grpc.health.v1.Health/Check`) over HTTP/2 cleartext:
    /// passes on `SERVING`.
    Grpc,
}

/// A pool of targets and its policies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolSection {
    /// The targets.
    pub targets: Vec<TargetConfig>,
    /// `http1` or `h2` (prior knowledge in cleartext, ALPN over TLS) to the targets.
    /// Defaults to `http1`.
    pub protocol: Protocol,
    /// TLS to the targets (`[pools.<name>.tls]`); absent: cleartext. Requests and
    /// health checks alike.
    pub tls: Option<TargetTlsConfig>,
    /// `p2c`, `round-robin` or `least-request`. Defaults to `p2c`.
    pub balance: Balance,
    /// Fail open (route to all) when the healthy fraction falls below this. Defaults
    /// to 0.5.
    pub panic_threshold: f64,
    /// Leave fail-open only at or above `panic_threshold` plus this. Defaults to 0.1.
    pub panic_exit_margin: f64,
    /// The healthy fraction must stay at the exit level this long before the pool leaves
    /// fail-open. Defaults to 30s.
    #[serde(with = "humantime_serde")]
    pub panic_exit_dwell: Duration,
    /// On leaving fail-open, the targets out of service lose their share over this time.
    /// Defaults to 20s.
    #[serde(with = "humantime_serde")]
    pub panic_exit_ramp: Duration,
    /// Ramp-up time of a target entering service; 0s disables. Defaults to 10s.
    #[serde(with = "humantime_serde")]
    pub slow_start_window: Duration,
    /// Fraction of its weight a target starts its ramp with. Defaults to 0.1.
    pub slow_start_min_weight: f64,
    /// Active health checks.
    pub health_check: HealthCheckConfig,
    /// Passive outlier detection: consecutive errors (vigil_core::outlier) and success
    /// rate against the peers (vigil_core::anomaly).
    pub outlier: OutlierSection,
    /// Retries.
    pub retries: RetryConfig,
    /// Hedging of slow idempotent requests.
    pub hedge: HedgeConfig,
    /// Local shedding when the targets refuse most requests: the SRE book's adaptive
    /// throttling ([`vigil_core::throttle::AdaptiveThrottle`]), `{ k, window }`.
    /// Absent: off (every request is forwarded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle: Option<AdaptiveThrottleConfig>,
}

impl Default for PoolSection {
    fn default() -> Self {
        let core = PoolConfig::default();
        PoolSection {
            targets: Vec::new(),
            protocol: Protocol::Http1,
            tls: None,
            balance: Balance::P2c,
            panic_threshold: core.panic_threshold,
            panic_exit_margin: core.panic_exit_margin,
            panic_exit_dwell: core.panic_exit_dwell,
            panic_exit_ramp: core.panic_exit_ramp,
            slow_start_window: core.slow_start_window,
            slow_start_min_weight: core.slow_start_min_weight,
            health_check: HealthCheckConfig::default(),
            outlier: OutlierSection::from(core.outlier),
            retries: RetryConfig::default(),
            hedge: HedgeConfig::default(),
            throttle: None,
        }
    }
}

impl PoolSection {
    /// The vigil-core policy configuration of this pool.
    pub fn core(&self) -> PoolConfig {
        PoolConfig {
            panic_threshold: self.panic_threshold,
            panic_exit_margin: self.panic_exit_margin,
            panic_exit_dwell: self.panic_exit_dwell,
            panic_exit_ramp: self.panic_exit_ramp,
            slow_start_window: self.slow_start_window,
            slow_start_min_weight: self.slow_start_min_weight,
            new_targets: if self.health_check.enabled {
                self.health_check.new_targets
            } else {
                NewTargets::Healthy
            },
            thresholds: ThresholdsConfig {
                healthy_threshold: self.health_check.healthy_threshold,
                unhealthy_threshold: self.health_check.unhealthy_threshold,
            },
            outlier: self.outlier.core(),
        }
    }
}

/// Default interval of the success-rate rule: every 10 s (Envoy's outlier detection
/// `interval`) the targets' error rates over the window are compared.
pub const DEFAULT_SUCCESS_RATE_INTERVAL: Duration = Duration::from_secs(10);

/// A pool's passive outlier detection: vigil-core's consecutive-error rules (the same
/// keys as [`OutlierConfig`], with its defaults) and the success-rate rule the balancer
/// drives ([`SuccessRateConfig`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutlierSection {
    /// Consecutive errors (5xx responses or gateway errors) that eject a target; 0
    /// disables this rule. Defaults to 5.
    pub consecutive_5xx: u32,
    /// Consecutive gateway errors that eject a target; 0 disables this rule. Defaults
    /// to 3.
    pub consecutive_gateway_errors: u32,
    /// Ejection time of a first ejection; the n-th lasts n times this. Defaults to 30s.
    #[serde(with = "humantime_serde")]
    pub base_ejection_time: Duration,
    /// Longest ejection (before jitter). Defaults to 300s.
    #[serde(with = "humantime_serde")]
    pub max_ejection_time: Duration,
    /// Most targets of the pool ejected at once, in percent, whatever the rule (at least
    /// one can always be ejected; 0 disables ejection). Defaults to 10.
    pub max_ejection_percent: u32,
    /// Ejection times are stretched by up to this fraction. Defaults to 0.25.
    pub max_ejection_jitter: f64,
    /// Ejection of a target whose error rate is an outlier against its peers'.
    pub success_rate: SuccessRateConfig,
}

impl Default for OutlierSection {
    fn default() -> Self {
        OutlierSection::from(OutlierConfig::default())
    }
}

impl From<OutlierConfig> for OutlierSection {
    fn from(c: OutlierConfig) -> Self {
        OutlierSection {
            consecutive_5xx: c.consecutive_5xx,
            consecutive_gateway_errors: c.consecutive_gateway_errors,
            base_ejection_time: c.base_ejection_time,
            max_ejection_time: c.max_ejection_time,
            max_ejection_percent: c.max_ejection_percent,
            max_ejection_jitter: c.max_ejection_jitter,
            success_rate: SuccessRateConfig::default(),
        }
    }
}

impl OutlierSection {
    /// The vigil-core settings of the consecutive-error rules and the ejection limits.
    pub fn core(&self) -> OutlierConfig {
        OutlierConfig {
            consecutive_5xx: self.consecutive_5xx,
            consecutive_gateway_errors: self.consecutive_gateway_errors,
            base_ejection_time: self.base_ejection_time,
            max_ejection_time: self.max_ejection_time,
            max_ejection_percent: self.max_ejection_percent,
            max_ejection_jitter: self.max_ejection_jitter,
        }
    }
}

/// The success-rate rule (issue 17): every `interval`, each target's errors over the
/// last `window` are compared with its peers' (the pool's other targets in service) by
/// vigil-core's fleet-relative policy ([`vigil_core::anomaly`]); an outlier is ejected
/// like a target with too many consecutive errors, within `max_ejection_percent`. An
/// outlier must clear every rule of that policy: `min_requests` in the window, at least
/// `min_peers` peers with as many, not a failure most of the pool shares, at least the
/// absolute `floor`, `min_ratio` times its peers' rate, and a binomial test significant
/// at `significance`. Errors are what outlier detection counts (5xx but 503, gateway
/// errors); shed answers (503, 429) are neither errors nor successes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SuccessRateConfig {
    /// Whether to eject success-rate outliers. Defaults to true.
    pub enabled: bool,
    /// How often the targets are judged (and the granularity of the window). Defaults
    /// to 10s.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// The span of requests judged. Defaults to 60s.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Requests a target must have had in the window to be judged. Defaults to 20.
    pub min_requests: u64,
    /// Peers with enough requests a target needs before it may be ejected. Defaults to 3.
    pub min_peers: usize,
    /// Error rate (0..1) a target must reach to be ejected. Defaults to 0.1.
    pub floor: f64,
    /// How many times its peers' pooled error rate a target's must be. Defaults to 2.
    pub min_ratio: f64,
    /// Significance of the binomial test (0..1), shared by the targets judged at once.
    /// Defaults to 0.001.
    pub significance: f64,
    /// Fraction of the pool at or above the floor beyond which the failure is shared and
    /// nobody is ejected. Defaults to 0.5.
    pub shared_fraction: f64,
}

impl Default for SuccessRateConfig {
    fn default() -> Self {
        SuccessRateConfig {
            enabled: true,
            interval: DEFAULT_SUCCESS_RATE_INTERVAL,
            window: anomaly::DEFAULT_WINDOW,
            min_requests: anomaly::DEFAULT_MIN_VOLUME,
            min_peers: anomaly::DEFAULT_MIN_PEERS,
            floor: anomaly::DEFAULT_FLOOR,
            min_ratio: anomaly::DEFAULT_MIN_RATIO,
            significance: anomaly::DEFAULT_SIGNIFICANCE,
            shared_fraction: anomaly::DEFAULT_SHARED_FRACTION,
        }
    }
}

impl SuccessRateConfig {
    /// The fleet-relative policy's settings: counts are recorded once per `interval`,
    /// which is therefore its bucket.
    pub fn anomaly(&self) -> AnomalyConfig {
        AnomalyConfig {
            window: self.window,
            bucket: self.interval,
            min_volume: self.min_requests,
            min_peers: self.min_peers,
            floor: self.floor,
            min_ratio: self.min_ratio,
            significance: self.significance,
            shared_fraction: self.shared_fraction,
        }
    }

    /// Checks the values with the policy's own validation; the error names this
    /// section's keys.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.interval < Duration::from_millis(100) {
            return Err(Invalid::new("interval", "must be at least 100ms"));
        }
        if self.window < self.interval {
            return Err(Invalid::new(
                "window",
                format!(
                    "must be at least interval ({}), got {}",
                    humantime::format_duration(self.interval),
                    humantime::format_duration(self.window)
                ),
            ));
        }
        if self.min_requests == 0 {
            return Err(Invalid::new("min_requests", "must be at least 1"));
        }
        self.anomaly().validate().map_err(|e| {
            e.renamed("bucket", "interval")
                .renamed("min_volume", "min_requests")
        })
    }
}

/// Active health checks of a pool's targets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthCheckConfig {
    /// Whether to check at all; without checks every target is assumed healthy and only
    /// outlier detection removes targets. Defaults to true.
    pub enabled: bool,
    /// `http` (GET `path`) or `grpc` (gRPC health v1 `Check` of `grpc_service`).
    /// Defaults to `http`.
    #[serde(rename = "type")]
    pub check_type: CheckType,
    /// With `type = "grpc"`: the service asked about; empty asks about the whole
    /// server. Defaults to empty.
    pub grpc_service: String,
    /// Path to GET. Defaults to `/readyz`.
    pub path: String,
    /// Time between checks of one target. Defaults to 2s.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Random spread of the interval, as a fraction (0.1 = +-10%). Defaults to 0.1.
    pub jitter: f64,
    /// A check not answered within this fails. Defaults to 1s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Consecutive passing checks that make a target healthy. Defaults to 2.
    pub healthy_threshold: u32,
    /// Consecutive failing checks that make a target unhealthy. Defaults to 3.
    pub unhealthy_threshold: u32,
    /// Status codes that pass: codes (`"200"`), classes (`"2xx"`) or ranges
    /// (`"200-299"`). Defaults to `["200-399"]`.
    pub expected_statuses: Vec<String>,
    /// Read the body as health+json: `pass` and `warn` pass (a degraded target stays in
    /// service), `fail` or an unreadable body fails. Defaults to false.
    pub health_json: bool,
    /// Verdict of a new target before its checks: `unknown` (no traffic until
    /// `healthy_threshold` checks pass) or `healthy`. Defaults to `unknown`.
    pub new_targets: NewTargets,
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        HealthCheckConfig {
            enabled: true,
            check_type: CheckType::Http,
            grpc_service: String::new(),
            path: DEFAULT_HEALTH_PATH.to_string(),
            interval: DEFAULT_HEALTH_INTERVAL,
            jitter: DEFAULT_HEALTH_JITTER,
            timeout: DEFAULT_HEALTH_TIMEOUT,
            healthy_threshold: DEFAULT_HEALTHY_THRESHOLD,
            unhealthy_threshold: DEFAULT_UNHEALTHY_THRESHOLD,
            expected_statuses: vec![DEFAULT_EXPECTED_STATUSES.to_string()],
            health_json: false,
            new_targets: NewTargets::Unknown,
        }
    }
}

/// Retries of failed requests.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Most retries of one request (each on another target). Defaults to 2.
    pub max_retries: u32,
    /// The budget shared by retries and hedges (see vigil_core::pool::RetryBudget).
    pub budget: RetryBudgetConfig,
    /// Which requests may be sent again after a reset or a per-try timeout (the target
    /// may have acted on them): `idempotent` or `all`. Defaults to `idempotent`.
    pub methods: RetryMethods,
    /// gRPC-style retry throttling on top of the budget
    /// ([`vigil_core::throttle::RetryThrottle`]): a table `{ max_tokens, token_ratio }`,
    /// or `"off"`. Defaults to `{ max_tokens = 10, token_ratio = 0.1 }`.
    pub throttle: RetryThrottleSetting,
}

/// Whether a pool throttles its retries (`retries.throttle`): `"off"`, or the token
/// bucket's settings as a table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RetryThrottleSetting {
    /// No throttle: only `max_retries` and the budget bound retries.
    Off,
    /// A token bucket (gRFC A6): failures take a token, successes give back
    /// `token_ratio`, retries go while it holds more than half of `max_tokens`.
    Tokens(RetryThrottleConfig),
}

impl Default for RetryThrottleSetting {
    fn default() -> Self {
        RetryThrottleSetting::Tokens(RetryThrottleConfig::default())
    }
}

impl RetryThrottleSetting {
    /// The bucket's settings, unless off.
    pub fn tokens(&self) -> Option<RetryThrottleConfig> {
        match self {
            RetryThrottleSetting::Off => None,
            RetryThrottleSetting::Tokens(c) => Some(*c),
        }
    }
}

impl Serialize for RetryThrottleSetting {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RetryThrottleSetting::Off => s.serialize_str("off"),
            RetryThrottleSetting::Tokens(c) => c.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for RetryThrottleSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{self, MapAccess, Visitor};
        struct Setting;
        impl<'de> Visitor<'de> for Setting {
            type Value = RetryThrottleSetting;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"off\" or a table { max_tokens, token_ratio }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                if v == "off" {
                    Ok(RetryThrottleSetting::Off)
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(v), &self))
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                RetryThrottleConfig::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RetryThrottleSetting::Tokens)
            }
        }
        d.deserialize_any(Setting)
    }
}

/// Which requests are sent again after the target may have seen them (a connection
/// reset before the answer, a per-try timeout, the target leaving service). A connect
/// failure is retried whatever the method (nothing was sent); a streamed body never is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryMethods {
    /// GET, HEAD, OPTIONS, TRACE, PUT, DELETE (RFC 9110 9.2.2). Defaults to this.
    #[default]
    Idempotent,
    /// Every method, POST and PATCH included, when the body was buffered: for services
    /// that tolerate a duplicate (nginx's `proxy_next_upstream non_idempotent`).
    All,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_retries: DEFAULT_MAX_RETRIES,
            budget: RetryBudgetConfig::default(),
            methods: RetryMethods::Idempotent,
            throttle: RetryThrottleSetting::default(),
        }
    }
}

/// Hedging: an idempotent request unanswered past the pool's recent latency quantile is
/// also sent to a second target; the first answer wins.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HedgeConfig {
    /// Whether to hedge. Defaults to false.
    pub enabled: bool,
    /// Latency quantile of the pool's recent requests after which to hedge. Defaults
    /// to 0.95.
    pub quantile: f64,
    /// Shortest hedge delay. Defaults to 10ms.
    #[serde(with = "humantime_serde")]
    pub min_delay: Duration,
    /// Longest hedge delay. Defaults to 1s.
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
}

impl Default for HedgeConfig {
    fn default() -> Self {
        HedgeConfig {
            enabled: false,
            quantile: DEFAULT_HEDGE_QUANTILE,
            min_delay: DEFAULT_HEDGE_MIN_DELAY,
            max_delay: DEFAULT_HEDGE_MAX_DELAY,
        }
    }
}

/// A set of status codes that pass a health check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusSet(Vec<(u16, u16)>);

impl StatusSet {
    /// Parses `"200"`, `"2xx"`, `"200-299"` items.
    pub fn parse(items: &[String]) -> Result<StatusSet, String> {
        let mut ranges = Vec::new();
        for item in items {
            let s = item.trim();
            let bad = || format!("{s:?} is not a status code, class (2xx) or range (200-299)");
            let r = if let Some(class) = s.strip_suffix("xx") {
                let c: u16 = class.parse().map_err(|_| bad())?;
                (c * 100, c * 100 + 99)
            } else if let Some((a, b)) = s.split_once('-') {
                (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                )
            } else {
                let c = s.parse().map_err(|_| bad())?;
                (c, c)
            };
            if !(100..=599).contains(&r.0) || !(100..=599).contains(&r.1) || r.0 > r.1 {
                return Err(bad());
            }
            ranges.push(r);
        }
        if ranges.is_empty() {
            return Err("must list at least one status".into());
        }
        Ok(StatusSet(ranges))
    }

    /// True when `code` passes.
    pub fn contains(&self, code: u16) -> bool {
        self.0.iter().any(|(a, b)| (*a..=*b).contains(&code))
    }
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> Invalid {
    Invalid::new(key, message)
}

impl LbConfig {
    /// Checks everything serde cannot; the error names the key (the first of
    /// [`Self::problems`]).
    pub fn validate(&self) -> Result<(), Invalid> {
        self.problems().into_iter().next().map_or(Ok(()), Err)
    }

    /// Every value serde cannot check that is wrong, in the order of the file's
    /// sections, each naming its key and the value: `check-config` lists them all, as
    /// rustc does. A check that depends on another value is skipped while that value is
    /// itself wrong (`timeouts.per_try` against a zero `timeouts.response_header`), so
    /// one mistake is reported once.
    pub fn problems(&self) -> Vec<Invalid> {
        let mut bad = Vec::new();
        let (min, max) = WORKER_SLICE_RANGE;
        if !self.worker_slice.is_zero() && !(min..=max).contains(&self.worker_slice) {
            bad.push(invalid(
                "worker_slice",
                format!(
                    "must be 0s (the kernel's default) or from {} to {}, got {}",
                    humantime::format_duration(min),
                    humantime::format_duration(max),
                    humantime::format_duration(self.worker_slice)
                ),
            ));
        }
        let t = &self.timeouts;
        for (key, value) in [
            ("timeouts.connect", t.connect),
            ("timeouts.response_header", t.response_header),
        ] {
            if value.is_zero() {
                bad.push(invalid(key, "must be more than 0s, got 0s"));
            }
        }
        if let Some(p) = t.per_try
            && (p.is_zero() || (!t.response_header.is_zero() && p > t.response_header))
        {
            bad.push(invalid(
                "timeouts.per_try",
                format!(
                    "must be more than 0s and at most timeouts.response_header ({}), got {}",
                    humantime::format_duration(t.response_header),
                    humantime::format_duration(p)
                ),
            ));
        }
        for (key, value) in [
            ("timeouts.send", t.send),
            ("timeouts.response_body", t.response_body),
            ("timeouts.client_header", t.client_header),
            ("timeouts.client_write", t.client_write),
            ("timeouts.client_h2_idle", t.client_h2_idle),
            ("timeouts.tunnel_idle", t.tunnel_idle),
        ] {
            if value.is_zero() {
                bad.push(invalid(key, "must be more than 0s, got 0s"));
            }
        }
        if self.limits.max_header_bytes < 8192 {
            bad.push(invalid(
                "limits.max_header_bytes",
                format!(
                    "must be at least 8192, got {}",
                    self.limits.max_header_bytes
                ),
            ));
        }
        if self.limits.max_client_connections == 0 {
            bad.push(invalid(
                "limits.max_client_connections",
                "must be at least 1, got 0",
            ));
        }
        if self.listen == self.admin_listen {
            bad.push(invalid(
                "admin_listen",
                format!("must differ from listen ({})", self.listen),
            ));
        }
        if self.routes.is_empty() && self.pools.len() > 1 {
            bad.push(invalid(
                "routes",
                "required when there are several pools (with one pool, everything goes to it)",
            ));
        }
        for (i, r) in self.routes.iter().enumerate() {
            if r.pool.is_empty() {
                bad.push(invalid(
                    format!("routes[{i}]"),
                    "missing key `pool`: the pool this route sends to",
                ));
            } else if !self.pools.contains_key(&r.pool) {
                let known: Vec<&str> = self.pools.keys().map(String::as_str).collect();
                bad.push(invalid(
                    format!("routes[{i}].pool"),
                    format!("no pool named {:?} (pools: {})", r.pool, known.join(", ")),
                ));
            }
            if let Some(p) = &r.path_prefix
                && !p.starts_with('/')
            {
                bad.push(invalid(
                    format!("routes[{i}].path_prefix"),
                    format!("must start with '/', got {p:?}"),
                ));
            }
        }
        if self.access_log.buffer == 0 {
            bad.push(invalid("access_log.buffer", "must be at least 1, got 0"));
        }
        if self.access_log.path.as_os_str().is_empty() {
            bad.push(invalid(
                "access_log.path",
                "must be \"-\" (standard output) or a file, got \"\"",
            ));
        }
        self.tls_problems(&mut bad);
        for (name, pool) in &self.pools {
            pool_problems(name, pool, &mut bad);
        }
        if let Err(e) = self.share.validate(self.admin_listen) {
            bad.push(e.within("share"));
        }
        bad
    }
}

/// The `[pools.<name>]` part of [`LbConfig::problems`].
fn pool_problems(name: &str, pool: &PoolSection, bad: &mut Vec<Invalid>) {
    let key = |k: &str| format!("pools.{name}.{k}");
    let within = |e: Invalid, section: &str| e.within(&format!("pools.{name}.{section}"));
    if pool.targets.is_empty() {
        bad.push(invalid(key("targets"), "a pool needs at least one target"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, t) in pool.targets.iter().enumerate() {
        let tk = key(&format!("targets[{i}].addr"));
        if let Err(m) = validate_addr(&t.addr) {
            bad.push(invalid(tk, m));
        } else if !seen.insert(&t.addr) {
            bad.push(invalid(tk, format!("{} is listed twice", t.addr)));
        }
    }
    if let Err(e) = pool.core().validate() {
        // The pool's thresholds are lb.toml's health_check thresholds.
        bad.push(
            e.renamed("thresholds", "health_check")
                .within(&format!("pools.{name}")),
        );
    }
    let hc = &pool.health_check;
    if hc.enabled {
        if !hc.path.starts_with('/') {
            bad.push(invalid(
                key("health_check.path"),
                format!("must start with '/', got {:?}", hc.path),
            ));
        }
        if hc.interval < Duration::from_millis(10) {
            bad.push(invalid(
                key("health_check.interval"),
                format!(
                    "must be at least 10ms, got {}",
                    humantime::format_duration(hc.interval)
                ),
            ));
        }
        if hc.timeout.is_zero() {
            bad.push(invalid(
                key("health_check.timeout"),
                "must be more than 0s, got 0s",
            ));
        }
        if !(0.0..=0.5).contains(&hc.jitter) {
            bad.push(invalid(
                key("health_check.jitter"),
                format!("must be between 0 and 0.5, got {}", hc.jitter),
            ));
        }
        if let Err(m) = StatusSet::parse(&hc.expected_statuses) {
            bad.push(invalid(key("health_check.expected_statuses"), m));
        }
    }
    if let Err(e) = pool.outlier.success_rate.validate() {
        bad.push(within(e, "outlier.success_rate"));
    }
    if let Err(e) = pool.retries.budget.validate() {
        bad.push(within(e, "retries.budget"));
    }
    if let Some(t) = pool.retries.throttle.tokens()
        && let Err(e) = t.validate()
    {
        bad.push(within(e, "retries.throttle"));
    }
    if let Some(t) = &pool.throttle
        && let Err(e) = t.validate()
    {
        bad.push(within(e, "throttle"));
    }
    if let Some(tls) = &pool.tls {
        if tls.cert.is_some() != tls.key.is_some() {
            bad.push(invalid(
                key(if tls.cert.is_some() {
                    "tls.key"
                } else {
                    "tls.cert"
                }),
                "missing: a client certificate needs both `cert` and `key`",
            ));
        }
        if let Some(n) = &tls.server_name
            && rustls::pki_types::ServerName::try_from(n.as_str()).is_err()
        {
            bad.push(invalid(
                key("tls.server_name"),
                format!("{n:?} is not a DNS name or an IP address"),
            ));
        }
    }
    let h = &pool.hedge;
    if !(0.0..1.0).contains(&h.quantile) || h.quantile < 0.5 {
        bad.push(invalid(
            key("hedge.quantile"),
            format!("must be between 0.5 and 1 (exclusive), got {}", h.quantile),
        ));
    }
    if h.max_delay < h.min_delay {
        bad.push(invalid(
            key("hedge.max_delay"),
            format!(
                "must be at least hedge.min_delay ({}), got {}",
                humantime::format_duration(h.min_delay),
                humantime::format_duration(h.max_delay)
            ),
        ));
    }
}

impl LbConfig {
    /// The `[tls_listeners.<name>]` part of [`LbConfig::problems`] (files are read
    /// later, by `crate::tls::load`).
    fn tls_problems(&self, bad: &mut Vec<Invalid>) {
        let mut addrs = vec![self.listen, self.admin_listen];
        for (i, l) in &self.tls_listeners {
            let key = |k: &str| format!("tls_listeners.{i}.{k}");
            match l.listen {
                None => bad.push(invalid(
                    format!("tls_listeners.{i}"),
                    "missing key `listen`: the address of this TLS listener",
                )),
                Some(addr) if addrs.contains(&addr) => bad.push(invalid(
                    key("listen"),
                    format!("{addr} is already listen, admin_listen or another TLS listener"),
                )),
                Some(addr) => addrs.push(addr),
            }
            if l.alpn.is_empty() {
                bad.push(invalid(key("alpn"), "must offer at least one protocol"));
            }
            for (j, p) in l.alpn.iter().enumerate() {
                if !SUPPORTED_ALPN.contains(&p.as_str()) {
                    bad.push(invalid(
                        format!("tls_listeners.{i}.alpn[{j}]"),
                        format!("{p:?} is not one of {}", SUPPORTED_ALPN.join(", ")),
                    ));
                }
            }
            if l.certificates.is_empty() {
                bad.push(invalid(
                    key("certificates"),
                    "a TLS listener needs at least one certificate",
                ));
            }
            for (j, c) in l.certificates.iter().enumerate() {
                let ck = |k: &str| format!("tls_listeners.{i}.certificates[{j}].{k}");
                if c.cert.as_os_str().is_empty() {
                    bad.push(invalid(ck("cert"), "missing: the PEM file of the chain"));
                }
                if c.key.as_os_str().is_empty() {
                    bad.push(invalid(ck("key"), "missing: the PEM file of the key"));
                }
                for (k, n) in c.server_names.iter().enumerate() {
                    let bare = n.strip_prefix("*.").unwrap_or(n);
                    let ok = !bare.is_empty()
                        && bare.split('.').all(|label| {
                            !label.is_empty()
                                && label
                                    .bytes()
                                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                        });
                    if !ok {
                        bad.push(invalid(
                            format!("tls_listeners.{i}.certificates[{j}].server_names[{k}]"),
                            format!("{n:?} is not a DNS name or *.name"),
                        ));
                    }
                }
            }
        }
    }
}

/// ALPN protocols a TLS listener can speak.
pub const SUPPORTED_ALPN: [&str; 2] = ["h2", "http/1.1"];

fn validate_addr(addr: &str) -> Result<(), String> {
    if addr.is_empty() {
        return Err("missing: host:port of the target".into());
    }
    let auth: http::uri::Authority = addr
        .parse()
        .map_err(|_| format!("{addr:?} is not host:port"))?;
    if auth.port_u16().is_none() || auth.as_str().contains('@') {
        return Err(format!("{addr:?} is not host:port (a port is required)"));
    }
    Ok(())
}

/// A configuration that cannot be used: file, line, column, key path and source line
/// (the one implementation every vigil TOML file shares).
pub use vigil_config::{ConfigError, ErrorKind};

/// Reads, parses and validates a configuration file.
/// A relative `access_log.path` is made relative to the file's directory here.
pub fn load(path: &Path) -> Result<LbConfig, ConfigError> {
    let mut config = parse(path, &vigil_config::read(path)?)?;
    let log = &mut config.access_log.path;
    if log.as_os_str() != DEFAULT_ACCESS_LOG_PATH && log.is_relative() {
        *log = path.parent().unwrap_or(Path::new(".")).join(&*log);
    }
    Ok(config)
}

/// [`load`], and every listener (`listen`, `admin_listen`, each TLS listener's) must
/// be free now: `check-config`, like `nginx -t`, says whether a balancer started on
/// this file could listen. Every taken address is named, not only the first.
pub fn check(path: &Path) -> Result<LbConfig, ConfigError> {
    let text = vigil_config::read(path)?;
    let config = parse(path, &text)?;
    let mut listeners = vec![
        ("listen".to_string(), config.listen),
        ("admin_listen".to_string(), config.admin_listen),
    ];
    for (name, l) in &config.tls_listeners {
        if let Some(addr) = l.listen {
            listeners.push((format!("tls_listeners.{name}.listen"), addr));
        }
    }
    let taken = listeners
        .iter()
        .filter_map(|(key, addr)| vigil_config::try_bind(key, *addr, "lb").err());
    vigil_config::invalid_all(path, &text, taken)?;
    Ok(config)
}

/// Parses and validates configuration text (`path` is used in errors only).
pub fn parse(path: &Path, text: &str) -> Result<LbConfig, ConfigError> {
    let config: LbConfig = vigil_config::from_str(path, text)?;
    vigil_config::invalid_all(path, text, config.problems())?;
    Ok(config)
}

impl fmt::Display for Balance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Balance::P2c => "p2c",
            Balance::RoundRobin => "round-robin",
            Balance::LeastRequest => "least-request",
        })
    }
}

#[cfg(test)]
mod tests;
