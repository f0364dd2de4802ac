//! The admin listener: `/admin/targets` (JSON: every target's state, since when, last
//! check, ejections, the success-rate rule's last verdict and the reason of its last
//! change), `POST` and `DELETE /admin/targets/<host:port>/drain` (drain a target, or put
//! it back), `/admin/verdicts` (with `[share]`: this balancer's own probe results, for
//! its peers, `crate::share`), `/metrics` (Prometheus text) and `/livez`. Served on its own address so
//! that it can stay private: that address is its only protection (it binds loopback by
//! default), as for the reads; changes are refused from browsers (a request with an
//! `Origin` field), so a web page cannot drain targets through a local admin port.
//!
//! Floor 3, downstream (floors: the crate doc): imports pool and metrics.

use crate::metrics::Metrics;
use crate::pool::PoolRt;
use crate::share::Feed;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use vigil_core::pool::TargetState;

/// The JSON document of `/admin/targets`.
pub fn targets_json(pools: &BTreeMap<String, Arc<PoolRt>>) -> Value {
    let mut out = serde_json::Map::new();
    for (name, pool) in pools {
        let now = pool.now();
        let clock = *pool.clock();
        let state = pool.state.lock().expect("pool lock");
        let rts = pool.targets.lock().expect("targets lock");
        let (healthy, known) = state.healthy_counts();
        let targets: Vec<Value> = state
            .targets(now)
            .map(|v| {
                let rt = rts.get(v.key);
                let last_change = rt.and_then(|t| t.last_change.lock().expect("lock").clone());
                let outstanding = rt.map_or(0, |t| t.outstanding.load(Ordering::Relaxed));
                let state = match v.state {
                    // A drained target with requests still in flight is draining.
                    TargetState::Drained if outstanding > 0 => "draining".to_string(),
                    s => s.to_string(),
                };
                json!({
                    "addr": v.key,
                    "zone": v.spec.zone,
                    "weight": v.spec.weight,
                    "effective_weight": v.effective_weight,
                    "state": state,
                    "drained": v.drained,
                    "health": v.health.to_string(),
                    "since": clock.wall(v.health_since),
                    "outstanding": outstanding,
                    "ejections": v.ejections,
                    "ejected_until": v.ejection.map(|e| clock.wall(e.until)),
                    "ejection_reason": v.ejection.map(|e| e.reason.to_string()),
                    "last_check": v.last_probe.map(|p| json!({
                        "ok": p.ok,
                        "detail": p.detail,
                        "at": clock.wall(p.at),
                    })),
                    "success_rate": rt.and_then(|t| t.success_rate.lock().expect("lock").as_ref().map(verdict_json)),
                    "reason": last_change.as_ref().map(|(_, why)| why.clone()),
                    "reason_at": last_change.map(|(at, _)| clock.wall(at)),
                })
            })
            .collect();
        let section = pool.section.load();
        out.insert(
            name.clone(),
            json!({
                "balance": section.balance.to_string(),
                "fail_open": state.fail_open().is_some(),
                "fail_open_since": state.fail_open().map(|t| clock.wall(t)),
                "healthy": healthy,
                "known": known,
                "panic_threshold": section.panic_threshold,
                "requests": requests_json(&pool.clients.counts(now)),
                "targets": targets,
            }),
        );
    }
    json!({ "pools": out })
}

/// What a pool's clients got: answers by class (`1xx` .. `5xx`, `gateway_error` for
/// vigil's own 502/503/504), the success rate since start and over the recent window
/// (`recent`: about the last minute). Errors are 5xx and gateway errors; `success_rate`
/// is `null` with no answer to judge.
fn requests_json(c: &crate::pool::ClientCounts) -> Value {
    let rate = |answered: u64, errors: u64| {
        (answered > 0).then(|| (answered - errors.min(answered)) as f64 / answered as f64)
    };
    let mut out = serde_json::Map::new();
    out.insert("answered".into(), c.answered().into());
    for (name, n) in crate::pool::CLIENT_CLASSES.iter().zip(c.classes) {
        out.insert((*name).into(), n.into());
    }
    out.insert("errors".into(), c.errors().into());
    out.insert("success_rate".into(), json!(rate(c.answered(), c.errors())));
    out.insert(
        "recent".into(),
        json!({
            "seconds": c.recent_span.as_secs_f64().round(),
            "answered": c.recent_answered,
            "errors": c.recent_errors,
            "success_rate": rate(c.recent_answered, c.recent_errors),
        }),
    );
    Value::Object(out)
}

/// The success-rate rule's last verdict on a target: its numbers, the rule that decided
/// (`finding`: `outlier`, `low_volume`, `too_few_peers`, `shared_failure`,
/// `below_floor`, `not_worse`, `not_significant`) and the verdict in words.
fn verdict_json(v: &vigil_core::anomaly::MemberVerdict) -> Value {
    let finding = serde_json::to_value(&v.finding).unwrap_or(Value::Null);
    json!({
        "requests": v.counts.total(),
        "errors": v.counts.failed,
        "error_rate": v.rate,
        "peers": v.peers.count,
        "peers_error_rate": v.peers.pooled_rate,
        "p_value": v.test.map(|t| t.p_value),
        "threshold": v.test.map(|t| t.threshold),
        "finding": finding["kind"],
        "verdict": v.to_string(),
    })
}

/// How often a drain with `?wait=` looks at the requests in flight.
const DRAIN_POLL: Duration = Duration::from_millis(20);
/// The longest `?wait=` honoured.
const MAX_DRAIN_WAIT: Duration = Duration::from_secs(300);

/// A query parameter's value (`force` alone is `Some("")`).
fn query_param<'a, B>(req: &'a Request<B>, name: &str) -> Option<&'a str> {
    req.uri()
        .query()?
        .split('&')
        .find_map(|kv| match kv.split_once('=') {
            Some((k, v)) if k == name => Some(v),
            None if kv == name => Some(""),
            _ => None,
        })
}

/// `POST` (drain) or `DELETE` (undrain) `/admin/targets/<target>/drain`: the target in
/// every pool that lists it. A drained target gets no new request, not even in
/// fail-open; requests in flight finish (`/admin/targets` says `draining` until they
/// have, then `drained`); its health checks go on. A drain that would leave a pool with
/// no other target in service is refused (409) unless `?force=true`. `?wait=30s` holds
/// the answer until no request is in flight on it any more, or that time passed (the
/// answer says which). Draining a drained target, or undraining one in service, answers
/// 200 and changes nothing (a deployer may call again). Answers JSON: the target and,
/// per pool, its state and requests in flight; an error names the target (404: no pool
/// lists it).
async fn drain<B>(
    req: &Request<B>,
    target: &str,
    pools: &BTreeMap<String, Arc<PoolRt>>,
) -> (StatusCode, Value) {
    let err = |status, msg: String| (status, json!({ "error": msg, "target": target }));
    let drained = match *req.method() {
        Method::POST => true,
        Method::DELETE => false,
        _ => {
            return err(
                StatusCode::METHOD_NOT_ALLOWED,
                format!(
                    "{} {}: POST drains the target, DELETE undrains it",
                    req.method(),
                    req.uri().path()
                ),
            );
        }
    };
    if req.headers().contains_key(header::ORIGIN) {
        return err(
            StatusCode::FORBIDDEN,
            "refused: a request with an Origin field comes from a browser; drain from a script or vigil deploy".into(),
        );
    }
    let listed: Vec<&Arc<PoolRt>> = pools.values().filter(|p| p.has_target(target)).collect();
    if listed.is_empty() {
        return err(
            StatusCode::NOT_FOUND,
            format!(
                "no pool has a target {target:?} (a target is named host:port as lb.toml lists it)"
            ),
        );
    }
    let force = matches!(query_param(req, "force"), Some("" | "true" | "1"));
    let wait = match query_param(req, "wait") {
        None => Duration::ZERO,
        Some(w) => match humantime::parse_duration(w) {
            Ok(d) if d <= MAX_DRAIN_WAIT => d,
            _ => {
                return err(
                    StatusCode::BAD_REQUEST,
                    format!("wait={w:?}: not a duration of at most 5m (e.g. wait=30s)"),
                );
            }
        },
    };
    if drained && !force {
        for p in &listed {
            if !p.is_drained(target) && p.in_service_besides(target) == 0 {
                return (
                    StatusCode::CONFLICT,
                    json!({
                        "error": format!(
                            "refused: draining {target} would leave pool {} with no target in service (add ?force=true to drain it anyway)",
                            p.name
                        ),
                        "target": target,
                        "pool": p.name,
                    }),
                );
            }
        }
    }
    let by = "the admin API";
    let mut in_flight: Vec<u64> = listed
        .iter()
        .map(|p| p.set_drained(target, drained, by).unwrap_or(0))
        .collect();
    if drained && !wait.is_zero() {
        let deadline = tokio::time::Instant::now() + wait;
        while in_flight.iter().any(|n| *n > 0) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(DRAIN_POLL).await;
            in_flight = listed.iter().map(|p| p.in_flight(target)).collect();
        }
    }
    let out: Vec<Value> = listed
        .iter()
        .zip(in_flight)
        .map(|(p, in_flight)| {
            let state = if !drained {
                "undrained"
            } else if in_flight > 0 {
                "draining"
            } else {
                "drained"
            };
            json!({ "pool": p.name, "state": state, "in_flight": in_flight })
        })
        .collect();
    (
        StatusCode::OK,
        json!({ "target": target, "drained": drained, "pools": out }),
    )
}

/// `%XX` escapes decoded (a client may escape the `:` of `host:port`); `None` when the
/// result is not UTF-8 or an escape is malformed.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Answers one admin request.
pub async fn handle<B>(
    req: &Request<B>,
    pools: &BTreeMap<String, Arc<PoolRt>>,
    metrics: &Metrics,
    feed: Option<&Feed>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if let Some(target) = path
        .strip_prefix("/admin/targets/")
        .and_then(|rest| rest.strip_suffix("/drain"))
    {
        let (status, body) = match percent_decode(target) {
            Some(t) if !t.is_empty() && !t.contains('/') => drain(req, &t, pools).await,
            _ => (
                StatusCode::BAD_REQUEST,
                json!({ "error": format!("{target:?} is not a target's host:port"), "target": target }),
            ),
        };
        let mut resp = Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CACHE_CONTROL, "no-store");
        if status == StatusCode::METHOD_NOT_ALLOWED {
            resp = resp.header(header::ALLOW, "POST, DELETE");
        }
        return resp
            .body(Full::new(Bytes::from(
                serde_json::to_string_pretty(&body).expect("JSON value serialises") + "\n",
            )))
            .expect("valid response");
    }
    let (status, ctype, body) = match path {
        "/admin/targets" => (
            StatusCode::OK,
            "application/json",
            serde_json::to_string_pretty(&targets_json(pools)).expect("JSON value serialises"),
        ),
        "/metrics" => {
            let accept = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let (ctype, body) = metrics.encode_for(accept);
            (StatusCode::OK, ctype, body)
        }
        "/livez" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        "/admin/verdicts" => match feed {
            Some(f) => (
                StatusCode::OK,
                "application/json",
                serde_json::to_string(&f.verdicts_json()).expect("JSON value serialises"),
            ),
            None => (
                StatusCode::NOT_FOUND,
                "text/plain",
                "no [share] peers in lb.toml: this balancer shares no verdicts\n".to_string(),
            ),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "admin endpoints: /admin/targets, POST|DELETE /admin/targets/<host:port>/drain, /admin/verdicts, /metrics, /livez\n".to_string(),
        ),
    };
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, ctype)
        .header(header::CACHE_CONTROL, "no-store")
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}
