//! The HTTP endpoints: `/livez`, `/readyz` (and its alias `/healthz`), `/health`.
//!
//! Every handler reads the published snapshot (or nothing at all, for `/livez`) and
//! never calls a check, so answering costs the same whatever the checks do and a flood of
//! probes never reaches a dependency.
//!
//! - `/livez`: `200 ok`, constant. It reads nothing: if the process can answer, it lives.
//! - `/readyz`, `/healthz`: readiness (local checks, watchdog, lifecycle).
//! - `/health`: full health (local and dependency checks, watchdog).
//! - Query: `?verbose` pretty-prints every detail (times, durations, component types);
//!   without it the body is compact (status, outputs, observed values);
//!   `?exclude=name` (repeatable, or comma-separated) leaves a check out of the body and
//!   of the status, as Kubernetes' `/readyz?exclude=` does; the lifecycle and watchdog
//!   entries ([`crate::snapshot::RESERVED_CHECKS`]) are never left out.
//! - Per the health+json draft, every check entry has its `componentType`, and a passing
//!   entry has no `output` (the draft: "SHOULD be omitted for pass state").
//! - 200 for pass and warn, 503 for fail; `Content-Type: application/health+json`,
//!   `Cache-Control: no-store`.

use crate::shared::Shared;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::sync::Arc;
use vigil_core::{HEALTH_JSON, HealthReport};

/// Paths the health router answers.
pub const HEALTH_PATHS: [&str; 4] = ["/livez", "/readyz", "/healthz", "/health"];

/// True when `path` is one of the health endpoints.
pub fn is_health_path(path: &str) -> bool {
    HEALTH_PATHS.contains(&path)
}

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/healthz", get(readyz))
        .route("/health", get(health))
        .with_state(shared)
}

async fn livez() -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/plain")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        "ok",
    )
        .into_response()
}

async fn readyz(State(shared): State<Arc<Shared>>, RawQuery(q): RawQuery) -> Response {
    let snap = shared.current.load();
    let query = Query::parse(q.as_deref());
    respond(
        snap.exclude(&snap.ready_now(), &query.exclude),
        query.verbose,
    )
}

async fn health(State(shared): State<Arc<Shared>>, RawQuery(q): RawQuery) -> Response {
    let snap = shared.current.load();
    let query = Query::parse(q.as_deref());
    respond(
        snap.exclude(&snap.full_now(), &query.exclude),
        query.verbose,
    )
}

fn respond(mut report: HealthReport, verbose: bool) -> Response {
    for r in report.checks.values_mut().flatten() {
        if r.status == vigil_core::Status::Pass {
            r.output = None;
        }
    }
    let code = StatusCode::from_u16(report.status.http_code())
        .expect("Status::http_code returns 200 or 503");
    let body = if verbose {
        report.to_json_pretty()
    } else {
        compact(report).to_json()
    };
    (
        code,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(HEALTH_JSON)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response()
}

/// Drops the details a machine polling every second does not need (`componentType`
/// stays: the draft asks for it and it is short).
fn compact(mut report: HealthReport) -> HealthReport {
    for r in report.checks.values_mut().flatten() {
        r.time = None;
        r.duration = None;
        r.component_id = None;
    }
    report
}

#[derive(Debug, Default, PartialEq)]
struct Query {
    verbose: bool,
    exclude: Vec<String>,
}

impl Query {
    fn parse(q: Option<&str>) -> Query {
        let mut out = Query::default();
        for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "verbose" => out.verbose = !matches!(v, "0" | "false"),
                "exclude" => out
                    .exclude
                    .extend(v.split(',').map(percent_decode).filter(|s| !s.is_empty())),
                _ => {}
            }
        }
        out
    }
}

/// Decodes `%XX` escapes (check names contain `:`, which clients may escape) and `+`.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parses_verbose_and_exclude() {
        assert_eq!(Query::parse(None), Query::default());
        let q = Query::parse(Some("verbose&exclude=postgres%3Aconnect&exclude=disk,mem"));
        assert!(q.verbose);
        assert_eq!(q.exclude, ["postgres:connect", "disk", "mem"]);
        assert!(!Query::parse(Some("verbose=false")).verbose);
        assert_eq!(
            percent_decode("a%2"),
            "a%2",
            "a truncated escape stays as is"
        );
    }
}
