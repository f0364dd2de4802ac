//! The admin listener: `/admin/targets` (JSON: every target's state, since when, last
//! check, ejections, the success-rate rule's last verdict and the reason of its last
//! change), `/metrics` (Prometheus text) and `/livez`. Served on its own address so that it can stay private.

use crate::balancer::PoolRt;
use crate::metrics::Metrics;
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

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
                json!({
                    "addr": v.key,
                    "zone": v.spec.zone,
                    "weight": v.spec.weight,
                    "effective_weight": v.effective_weight,
                    "state": v.state.to_string(),
                    "health": v.health.to_string(),
                    "since": clock.wall(v.health_since),
                    "outstanding": rt.map_or(0, |t| t.outstanding.load(Ordering::Relaxed)),
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
                "targets": targets,
            }),
        );
    }
    json!({ "pools": out })
}

/// The success-rate rule's last verdict on a target: its numbers, the rule that decided
/// (`finding`: `outlier`, `low_volume`, `too_few_peers`, `shared_failure`,
/// `below_floor`, `not_worse`, `not_significant`) and the verdict in words.
fn verdict_json(v: &vigil_core::anomaly::Verdict) -> Value {
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

/// Answers one admin request.
pub fn handle<B>(
    req: &Request<B>,
    pools: &BTreeMap<String, Arc<PoolRt>>,
    metrics: &Metrics,
) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match req.uri().path() {
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
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "admin endpoints: /admin/targets, /metrics, /livez\n".to_string(),
        ),
    };
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, ctype)
        .header(header::CACHE_CONTROL, "no-store")
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}
