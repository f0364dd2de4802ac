//! Active health checks: one loop per target, GET `path` every `interval` (with jitter,
//! measured from one check's start to the next) on a fresh connection, judged by
//! status code and optionally by the health+json body.
//!
//! A fresh connection per check (like HAProxy) is deliberate: it tests that the target
//! still accepts connections, which a pooled connection would hide. Results go to the
//! pool policy ([`crate::balancer::PoolRt::observe_probe`]) with a detail string saying
//! what the check saw; the policy decides (rise/fall thresholds) and the balancer logs
//! transitions, not every probe.

use crate::balancer::PoolRt;
use crate::config::{HealthCheckConfig, StatusSet};
use crate::metrics::CheckLabels;
use crate::proxy::ErrorChain;
use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use vigil_core::report::MAX_REPORT_BYTES;

/// The result of one check: passed or not, and what it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the check passed.
    pub ok: bool,
    /// What it saw, for logs and `/admin/targets`.
    pub detail: String,
}

/// Checks one target once.
pub async fn probe(
    client: &Client<HttpConnector, Empty<Bytes>>,
    addr: &str,
    hc: &HealthCheckConfig,
    expected: &StatusSet,
) -> Verdict {
    let fail = |detail: String| Verdict { ok: false, detail };
    let req = match Request::get(format!("http://{addr}{}", hc.path))
        .header(header::USER_AGENT, "vigil-lb health check")
        .header(header::ACCEPT, "application/health+json, */*")
        .body(Empty::new())
    {
        Ok(r) => r,
        Err(e) => return fail(format!("bad check request: {e}")),
    };
    let work = async {
        let resp = match client.request(req).await {
            Ok(r) => r,
            Err(e) => {
                let what = if e.is_connect() {
                    "connect failed"
                } else {
                    "request failed"
                };
                return fail(format!("{what}: {}", ErrorChain(&e)));
            }
        };
        let code = resp.status().as_u16();
        let status_ok = expected.contains(code);
        let expected_list = hc.expected_statuses.join(",");
        if !hc.health_json {
            return if status_ok {
                Verdict {
                    ok: true,
                    detail: format!("HTTP {code}"),
                }
            } else {
                fail(format!("HTTP {code}, expected {expected_list}"))
            };
        }
        let content_type = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = match Limited::new(resp.into_body(), MAX_REPORT_BYTES)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(e) => return fail(format!("HTTP {code}, body unreadable: {e}")),
        };
        // vigil-core's one judge (its doc has the rule table); the configured
        // `expected_statuses` must also hold.
        let j = vigil_core::judge(code, content_type.as_deref(), &body);
        let mut detail = j.detail.clone();
        if !status_ok {
            detail.push_str(&format!("; expected {expected_list}"));
        }
        Verdict {
            // Degraded (warn) stays in service: it still serves something useful.
            ok: status_ok && j.is_serving(),
            detail,
        }
    };
    match tokio::time::timeout(hc.timeout, work).await {
        Ok(v) => v,
        Err(_) => fail(format!(
            "no answer within {}",
            humantime::format_duration(hc.timeout)
        )),
    }
}

/// A client for checks: no pooling, so every check opens a fresh connection.
pub fn check_client(connect_timeout: Duration) -> Client<HttpConnector, Empty<Bytes>> {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(http)
}

/// Checks every target of `pool` until `stop` changes or is dropped.
pub fn spawn_checks(
    pool: Arc<PoolRt>,
    client: Client<HttpConnector, Empty<Bytes>>,
    stop: watch::Receiver<()>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let section = pool.section.load_full();
    let hc = section.health_check.clone();
    if !hc.enabled {
        return Vec::new();
    }
    let expected = StatusSet::parse(&hc.expected_statuses).expect("validated config");
    section
        .targets
        .iter()
        .map(|t| {
            let (pool, client, hc, expected, addr) = (
                pool.clone(),
                client.clone(),
                hc.clone(),
                expected.clone(),
                t.addr.clone(),
            );
            let mut stop = stop.clone();
            tokio::spawn(async move {
                loop {
                    // Checks start every interval (+-jitter) from the previous start, not
                    // from its end: a target that times out is still checked once per
                    // interval, which is what bounds detection by
                    // interval x unhealthy_threshold + timeout.
                    let started = tokio::time::Instant::now();
                    let v = tokio::select! {
                        biased;
                        _ = stop.changed() => return,
                        v = probe(&client, &addr, &hc, &expected) => v,
                    };
                    pool_metrics(&pool, &addr, v.ok);
                    pool.observe_probe(&addr, v.ok, v.detail);
                    let spread = 1.0 + hc.jitter * (2.0 * rand::random::<f64>() - 1.0);
                    let next = started + hc.interval.mul_f64(spread);
                    tokio::select! {
                        biased;
                        _ = stop.changed() => return,
                        _ = tokio::time::sleep_until(next) => {}
                    }
                }
            })
        })
        .collect()
}

fn pool_metrics(pool: &PoolRt, addr: &str, ok: bool) {
    pool.metrics()
        .checks
        .get_or_create(&CheckLabels {
            pool: pool.name.clone(),
            target: addr.to_string(),
            result: if ok { "pass" } else { "fail" }.into(),
        })
        .inc();
}
