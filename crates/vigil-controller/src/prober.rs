//! Deep-health probes: `GET {url}{path}` over pooled HTTP/1.1 connections, bounded in
//! time and body size, judged as a guard [`Observation`].

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use std::time::{Duration, Instant};
use vigil_core::HealthReport;
use vigil_core::guard::Observation;

/// Idle pooled connections are dropped after this long: longer than any sane probe
/// interval would keep every connection warm forever on a 10 s interval; 90 s matches
/// hyper's default and most servers' keep-alive timeouts.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Read buffer per connection: health answers are small, and hyper's adaptive buffer
/// starts at 8 KiB per pooled connection (growing up to ~400 KiB); a fixed 4 KiB keeps
/// an idle connection cheap. Larger answers are simply read in several chunks.
const READ_BUFFER: usize = 4096;

/// One probe, as the API and dashboard show it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbeRecord {
    /// When it finished (UNIX ms).
    pub at_ms: i64,
    /// Whether it passed.
    pub ok: bool,
    /// How long it took.
    pub duration_ms: f64,
    /// HTTP status, if any came back.
    pub status: Option<u16>,
    /// The report's status (`pass`, `warn`, `fail`) if it parsed.
    pub health: Option<vigil_core::Status>,
    /// What failed: the error, or the failing checks.
    pub detail: String,
}

/// The HTTP prober (cheap to clone: the pool is shared).
#[derive(Clone)]
pub struct Prober {
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Default for Prober {
    fn default() -> Self {
        Self::new(true)
    }
}

impl Prober {
    /// A prober with its own connection pool; without `keep_alive`, every probe opens
    /// (and closes) its own connection.
    pub fn new(keep_alive: bool) -> Prober {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .http1_read_buf_exact_size(READ_BUFFER);
        if !keep_alive {
            builder.pool_max_idle_per_host(0);
        }
        let client = builder.build(connector);
        Prober { client }
    }

    /// Probes `base` + `path`. Never fails: every failure is an observation.
    pub async fn probe(
        &self,
        target: &str,
        zone: &str,
        uri: http::Uri,
        timeout: Duration,
        max_body: usize,
    ) -> (Observation, ProbeRecord) {
        let started = Instant::now();
        let result = tokio::time::timeout(timeout, self.fetch(uri, max_body)).await;
        let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
        let mut record = ProbeRecord {
            at_ms: crate::clock::wall_ms(),
            ok: false,
            duration_ms,
            status: None,
            health: None,
            detail: String::new(),
        };
        let fail = |record: &mut ProbeRecord, detail: String| {
            record.detail = detail;
            Observation::endpoint_failure(target, zone)
        };
        let obs = match result {
            Err(_) => fail(
                &mut record,
                format!("timed out after {}", humantime::format_duration(timeout)),
            ),
            Ok(Err(e)) => fail(&mut record, e),
            Ok(Ok((status, body))) => {
                record.status = Some(status);
                if status != 200 && status != 503 {
                    fail(&mut record, format!("HTTP {status}, not a health answer"))
                } else {
                    match HealthReport::parse(&body) {
                        Err(e) => fail(&mut record, format!("garbage health response: {e}")),
                        Ok(report) => {
                            record.health = Some(report.status);
                            let obs = Observation::from_report(target, zone, &report);
                            if obs.endpoint_failed {
                                record.detail = "status fail without a failing check".into();
                            } else if !obs.failing_checks.is_empty() {
                                record.detail =
                                    format!("failing: {}", obs.failing_checks.join(", "));
                            }
                            obs
                        }
                    }
                }
            }
        };
        record.ok = obs.is_ok();
        (obs, record)
    }

    /// The observation for a target whose URL does not parse (config validation makes
    /// this unreachable for configured targets; it is a failure, never a panic).
    pub fn bad_url(target: &str, zone: &str, url: &str) -> (Observation, ProbeRecord) {
        let record = ProbeRecord {
            at_ms: crate::clock::wall_ms(),
            ok: false,
            duration_ms: 0.0,
            status: None,
            health: None,
            detail: format!("bad URL {url:?}"),
        };
        (Observation::endpoint_failure(target, zone), record)
    }

    async fn fetch(&self, uri: http::Uri, max_body: usize) -> Result<(u16, Bytes), String> {
        let req = http::Request::get(uri)
            .header(
                http::header::ACCEPT,
                "application/health+json, application/json",
            )
            .header(http::header::USER_AGENT, "vigil-controller")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| format!("request failed: {}", error_chain(&e)))?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), max_body)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    format!("health body larger than {max_body} bytes")
                } else {
                    format!("reading body: {e}")
                }
            })?
            .to_bytes();
        Ok((status, body))
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
