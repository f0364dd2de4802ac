//! Heartbeats to the controller: for a process no prober can reach (a queue worker behind
//! NAT, a batch job), it pushes its own health to `vigil controller`, signed.
//!
//! Every `every` (default 5 s, well under the controller's default `heartbeat.ttl`) the
//! process `POST`s `{"target": id, "report": <its /health report>}` to the controller's
//! `/api/heartbeat`, with a queue worker's counters under `"worker"` when it has one
//! ([`crate::worker::Worker::report`]). Each heartbeat is signed the way the controller
//! verifies it: `X-Vigil-Timestamp` (UNIX milliseconds) and `X-Vigil-Signature:
//! sha256=<hex HMAC-SHA256(key, timestamp + "." + body)>`, where `key` is the target's own
//! key (`vigil controller heartbeat-key <id>` prints it). A signature is good only for its
//! body and time, so a heartbeat read off the wire cannot be replayed for long, and a
//! worker holds only its own key. The signature is [`vigil_core::signature`], the very
//! code the controller verifies with.
//!
//! Sending never blocks the service and never changes its health: a controller that is
//! down is the controller's problem (its TTL turns the target failed, and its guard
//! decides). Failures are counted and logged when they start and when they end, not on
//! every beat.

use crate::health::Health;
use crate::worker::Worker;
use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use vigil_core::signature;

/// Default interval between heartbeats: 5 s, a sixth of the controller's default TTL
/// (30 s), so that a few lost beats never look like a dead worker.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(5);
/// Default timeout of one heartbeat: 2 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
pub use vigil_core::signature::{SIGNATURE_HEADER, TIMESTAMP_HEADER};

/// Where and as whom to send heartbeats.
#[derive(Clone, Debug)]
pub struct HeartbeatConfig {
    /// The controller's base URL, e.g. `http://10.0.0.5:9400`.
    pub controller: String,
    /// This process's target id in the controller's config.
    pub target: String,
    /// The target's own key (`vigil controller heartbeat-key <target>`).
    pub key: String,
    /// Interval between heartbeats. Defaults to 5 s.
    pub every: Duration,
    /// Timeout of one heartbeat. Defaults to 2 s.
    pub timeout: Duration,
}

impl HeartbeatConfig {
    /// Heartbeats for `target` to `controller`, signed with `key`, with the defaults.
    pub fn new(
        controller: impl Into<String>,
        target: impl Into<String>,
        key: impl Into<String>,
    ) -> Self {
        HeartbeatConfig {
            controller: controller.into(),
            target: target.into(),
            key: key.into(),
            every: DEFAULT_EVERY,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// A heartbeat configuration that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum HeartbeatError {
    /// The controller URL is not `http://host[:port]`.
    #[error("heartbeat controller URL {0:?}: only http://host[:port] is supported")]
    Url(String),
    /// No key.
    #[error(
        "heartbeat key for target {0:?} is empty: get it with `vigil controller heartbeat-key {0}`"
    )]
    NoKey(String),
    /// A zero interval.
    #[error("heartbeat interval must be longer than 0s")]
    Interval,
}

/// The running heartbeat task; dropping it stops the heartbeats.
pub struct Heartbeats {
    stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Stats {
    sent: AtomicU64,
    failed: AtomicU64,
}

impl Heartbeats {
    /// Heartbeats the controller accepted (2xx).
    pub fn accepted(&self) -> u64 {
        self.stats.sent.load(Ordering::Relaxed)
    }

    /// Heartbeats that failed (refused, unreachable, timed out).
    pub fn failed(&self) -> u64 {
        self.stats.failed.load(Ordering::Relaxed)
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts sending heartbeats with `health`'s full report (and `worker`'s counters). Must
/// be called within a tokio runtime.
pub fn start(
    health: &Health,
    worker: Option<Worker>,
    config: HeartbeatConfig,
) -> Result<Heartbeats, HeartbeatError> {
    let base: Uri = config
        .controller
        .parse()
        .map_err(|_| HeartbeatError::Url(config.controller.clone()))?;
    if base.scheme_str() != Some("http") || base.host().is_none() {
        return Err(HeartbeatError::Url(config.controller.clone()));
    }
    if config.key.is_empty() {
        return Err(HeartbeatError::NoKey(config.target.clone()));
    }
    if config.every.is_zero() {
        return Err(HeartbeatError::Interval);
    }
    let url: Uri = format!("{}/api/heartbeat", config.controller.trim_end_matches('/'))
        .parse()
        .map_err(|_| HeartbeatError::Url(config.controller.clone()))?;
    let stats = Arc::new(Stats::default());
    let task = tokio::spawn(run(health.clone(), worker, config, url, stats.clone()));
    Ok(Heartbeats { stats, task })
}

async fn run(
    health: Health,
    worker: Option<Worker>,
    config: HeartbeatConfig,
    url: Uri,
    stats: Arc<Stats>,
) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut tick = tokio::time::interval(config.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        let mut body = serde_json::json!({
            "target": config.target,
            "report": health.snapshot().full_now(),
        });
        if let Some(w) = &worker {
            body["worker"] = serde_json::to_value(w.report()).unwrap_or_default();
        }
        let body = Bytes::from(body.to_string());
        let result = send(&client, &url, &config, body).await;
        match result {
            Ok(()) => {
                stats.sent.fetch_add(1, Ordering::Relaxed);
                if std::mem::take(&mut failing) {
                    tracing::info!(target_id = %config.target, "heartbeats accepted again");
                }
            }
            Err(why) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(target_id = %config.target, error = %why, "heartbeat failed (logged once until it works again)");
                }
            }
        }
    }
}

async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &Uri,
    config: &HeartbeatConfig,
    body: Bytes,
) -> Result<(), String> {
    let ts = signature::timestamp_ms(SystemTime::now());
    let request = Request::post(url.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            header::USER_AGENT,
            concat!("vigil/", env!("CARGO_PKG_VERSION")),
        )
        .header(TIMESTAMP_HEADER, ts.to_string())
        .header(SIGNATURE_HEADER, sign(&config.key, ts, &body))
        .body(Full::new(body))
        .map_err(|e| format!("cannot build request: {e}"))?;
    let response = tokio::time::timeout(config.timeout, client.request(request))
        .await
        .map_err(|_| {
            format!(
                "no answer within {}",
                humantime::format_duration(config.timeout)
            )
        })?
        .map_err(|e| format!("POST {url}: {e}"))?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(format!("POST {url}: {}", response.status()))
    }
}

/// `sha256=<hex HMAC-SHA256(key, timestamp + "." + body)>`, the controller's heartbeat
/// signature ([`vigil_core::signature::sign_heartbeat`]); `timestamp_ms` is UNIX
/// milliseconds, as sent in [`TIMESTAMP_HEADER`].
pub fn sign(key: &str, timestamp_ms: i64, body: &[u8]) -> String {
    signature::sign_heartbeat(key, timestamp_ms, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes the old sender made, pinned (as in `vigil_core::signature`).
    #[test]
    fn a_known_signature_keeps_its_bytes() {
        let key = "bd96a43fa9047ca16a44562d290f4d0e6f18152710c35f58588a04fa3056ec4b";
        let body = br#"{"target":"w1","report":{"status":"pass"}}"#;
        assert_eq!(
            sign(key, 1_765_000_000_123, body),
            "sha256=7cf9ae094f34990c9fd40e8ba37eaee3312127e210119c556c0f8c259b50d313"
        );
    }
}
