//! The HTTP side: JSON API, heartbeats, Prometheus metrics and the dashboard (axum).
//!
//! Reads are open; every mutating call (holds, freezes) needs `Authorization: Bearer
//! <token>` (the scheme in any case, RFC 7235) and gets 401 without it, changing
//! nothing. Heartbeats are signed instead, each target with its own key
//! ([`crate::heartbeat`]): workers should not carry the operator's token.

use crate::clock::wall_ms;
use crate::dashboard;
use crate::engine::{Command, CommandError, FleetView, Plan};
use crate::heartbeat::{self, Rejection};
use crate::metrics::Metrics;
use crate::scheduler::Heartbeats;
use crate::store::StoreHandle;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use vigil_core::HealthReport;
use vigil_core::guard::HoldKind;

/// Default number of records a list endpoint returns.
const DEFAULT_LIMIT: usize = 50;
/// Most records a list endpoint returns, however many are asked for.
const MAX_LIMIT: usize = 1000;
/// Largest heartbeat body accepted (a health+json report fits).
const MAX_HEARTBEAT_BYTES: usize = vigil_core::report::MAX_REPORT_BYTES;
/// Longest hold (`for`) an operator may ask for: 30 days covers the longest planned
/// maintenance; a target out for longer should leave the fleet, not sit in it held.
/// No `for` at all still means "until lifted".
pub const MAX_HOLD_FOR: Duration = Duration::from_secs(30 * 24 * 3600);
/// Longest reason (bytes) of a hold or freeze: a few sentences and a ticket link. The
/// reason is stored in the guard state, every snapshot and the decisions it explains.
pub const MAX_REASON_BYTES: usize = 4096;
/// Largest body of a mutating call (a reason and a duration fit many times over).
const MAX_MUTATION_BYTES: usize = 16 * 1024;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The engine's mailbox.
    pub engine: mpsc::Sender<Command>,
    /// The store.
    pub store: StoreHandle,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The bearer token in force (reloadable).
    pub token: Arc<RwLock<Option<String>>>,
    /// Heartbeats.
    pub heartbeats: Arc<Heartbeats>,
    /// The current plan (to know the heartbeat targets).
    pub plan: watch::Receiver<Arc<Plan>>,
    /// How heartbeats are verified (reloadable).
    pub heartbeat_auth: Arc<RwLock<HeartbeatAuth>>,
    /// Whether the store takes the engine's commits (for `/readyz`).
    pub store_health: Arc<crate::store::StoreHealth>,
}

/// How heartbeats are verified: the secret their keys derive from, the replay window.
#[derive(Clone, Debug)]
pub struct HeartbeatAuth {
    /// `heartbeat.secret` or `VIGIL_HEARTBEAT_SECRET`.
    pub secret: Option<String>,
    /// `heartbeat.max_skew`.
    pub max_skew: Duration,
}

impl HeartbeatAuth {
    /// From the config.
    pub fn of(config: &crate::config::ControllerConfig) -> HeartbeatAuth {
        HeartbeatAuth {
            secret: config.heartbeat.effective_secret(),
            max_skew: config.heartbeat.max_skew,
        }
    }
}

/// The router.
pub fn router(state: AppState) -> Router {
    let mutating = Router::new()
        .route(
            "/api/targets/{id}/silence",
            post(silence).delete(clear_silence),
        )
        .route(
            "/api/targets/{id}/maintenance",
            post(maintenance).delete(clear_maintenance),
        )
        .route("/api/freeze", post(freeze).delete(unfreeze))
        .route("/api/unfreeze", post(unfreeze))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/", get(dashboard_page))
        .route("/dashboard/live", get(dashboard_live))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/targets", get(targets))
        .route("/api/targets/{id}", get(target))
        .route("/api/decisions", get(decisions))
        .route("/api/actions", get(actions))
        .route("/api/guard", get(guard))
        .route("/api/heartbeat", post(heartbeat))
        .merge(mutating)
        .with_state(state)
}

// === errors ===

struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn unavailable<E: std::fmt::Display>(e: E) -> ApiError {
    ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}

// === auth ===

/// Constant-time comparison, so the token cannot be guessed byte by byte from timings.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is
/// case-insensitive (RFC 7235 section 2.1: `bearer`, `BEARER` are the same scheme),
/// followed by one or more spaces.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}

async fn require_token(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let expected = st.token.read().expect("token lock").clone();
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let ok = match (&expected, given) {
        (Some(e), Some(g)) => same(e.as_bytes(), g.as_bytes()),
        _ => false,
    };
    if !ok {
        let why = if expected.is_none() {
            "mutating calls are disabled: no api_token configured (config or VIGIL_API_TOKEN)"
        } else {
            "missing or wrong bearer token"
        };
        tracing::warn!(path = %req.uri().path(), "unauthorized API call refused");
        let mut resp = ApiError(StatusCode::UNAUTHORIZED, why.into()).into_response();
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"vigil\""),
        );
        return resp;
    }
    next.run(req).await
}

// === reads ===

async fn fleet(st: &AppState) -> Result<Arc<FleetView>, ApiError> {
    let (tx, rx) = oneshot::channel();
    st.engine
        .send(Command::Fleet(tx))
        .await
        .map_err(|_| unavailable("engine stopped"))?;
    rx.await.map_err(|_| unavailable("engine stopped"))
}

async fn targets(State(st): State<AppState>) -> Result<Response, ApiError> {
    let f = fleet(&st).await?;
    let list: Vec<_> = f
        .targets
        .iter()
        .map(|t| {
            let mut t = t.clone();
            t.history.clear();
            t
        })
        .collect();
    Ok(Json(json!({ "now_ms": f.now_ms, "targets": list })).into_response())
}

async fn target(State(st): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let f = fleet(&st).await?;
    let Some(t) = f.targets.iter().find(|t| t.id == id).cloned() else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("unknown target {id:?}"),
        ));
    };
    let (id1, id2) = (id.clone(), id.clone());
    let transitions = st
        .store
        .call(move |s| s.transitions(&id1, DEFAULT_LIMIT))
        .await
        .map_err(unavailable)?;
    let decisions = st
        .store
        .call(move |s| s.decisions(Some(&id2), DEFAULT_LIMIT))
        .await
        .map_err(unavailable)?;
    Ok(
        Json(json!({ "target": t, "transitions": transitions, "decisions": decisions }))
            .into_response(),
    )
}

#[derive(Deserialize)]
struct ListQuery {
    target: Option<String>,
    limit: Option<usize>,
}

async fn decisions(
    State(st): State<AppState>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
    let rows = st
        .store
        .call(move |s| s.decisions(q.target.as_deref(), limit))
        .await
        .map_err(unavailable)?;
    Ok(Json(json!({ "decisions": rows })).into_response())
}

async fn actions(
    State(st): State<AppState>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
    let rows = st
        .store
        .call(move |s| s.actions(limit))
        .await
        .map_err(unavailable)?;
    Ok(Json(json!({ "actions": rows })).into_response())
}

async fn guard(State(st): State<AppState>) -> Result<Response, ApiError> {
    let f = fleet(&st).await?;
    Ok(Json(json!({ "now_ms": f.now_ms, "guard": f.guard, "events": f.events })).into_response())
}

async fn metrics(State(st): State<AppState>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (ctype, body) = st.metrics.encode_for(accept);
    ([(header::CONTENT_TYPE, ctype)], body).into_response()
}

/// Ready while the store takes the engine's commits; 503 with the store's error while
/// it does not (no action is taken meanwhile).
async fn readyz(State(st): State<AppState>) -> Response {
    match st.store_health.error() {
        None => no_store((StatusCode::OK, "ok\n").into_response()),
        Some(e) => no_store(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("store failing: no actions are taken: {e}\n"),
            )
                .into_response(),
        ),
    }
}

// === mutations ===

/// A refused field of a mutating call's body: a 422 naming it.
struct Invalid {
    field: String,
    message: String,
}

impl IntoResponse for Invalid {
    fn into_response(self) -> Response {
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({
                "error": format!("{}: {}", self.field, self.message),
                "field": self.field,
            })),
        )
            .into_response()
    }
}

fn invalid(field: &str, message: String) -> Invalid {
    Invalid {
        field: field.to_string(),
        message,
    }
}

/// The string fields of a mutating call's JSON object body (absent or empty: none).
/// Refused with 422 naming the field: a field not in `allowed`, a value that is not a
/// string, a reason too long; or naming `body` when it is not a JSON object or too
/// large.
fn fields(
    body: &[u8],
    allowed: &[&str],
) -> Result<std::collections::BTreeMap<String, String>, Invalid> {
    if body.len() > MAX_MUTATION_BYTES {
        return Err(invalid(
            "body",
            format!("{} bytes, at most {MAX_MUTATION_BYTES}", body.len()),
        ));
    }
    let mut out = std::collections::BTreeMap::new();
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(out);
    }
    let map = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(m)) => m,
        Ok(_) => return Err(invalid("body", "must be a JSON object".into())),
        Err(e) => return Err(invalid("body", format!("not JSON: {e}"))),
    };
    for (k, v) in map {
        if !allowed.contains(&k.as_str()) {
            return Err(invalid(
                &k,
                format!("unknown field; expected one of {}", allowed.join(", ")),
            ));
        }
        match v {
            serde_json::Value::String(text) => {
                out.insert(k, text);
            }
            serde_json::Value::Null => {}
            other => return Err(invalid(&k, format!("must be a string, got {other}"))),
        }
    }
    if let Some(reason) = out.get("reason") {
        check_reason(reason)?;
    }
    Ok(out)
}

fn check_reason(reason: &str) -> Result<(), Invalid> {
    if reason.len() > MAX_REASON_BYTES {
        return Err(invalid(
            "reason",
            format!("{} bytes, at most {MAX_REASON_BYTES}", reason.len()),
        ));
    }
    Ok(())
}

/// A hold's `for`: more than 0, at most [`MAX_HOLD_FOR`].
fn hold_for(text: Option<&str>) -> Result<Option<Duration>, Invalid> {
    let Some(text) = text else { return Ok(None) };
    let d = humantime::parse_duration(text).map_err(|e| {
        invalid(
            "for",
            format!("{text:?} is not a duration ({e}); e.g. \"2h\""),
        )
    })?;
    if d.is_zero() {
        return Err(invalid("for", "must be longer than 0s".into()));
    }
    if d > MAX_HOLD_FOR {
        return Err(invalid(
            "for",
            format!(
                "{text:?} is longer than the most a hold may last, {}; omit `for` to hold until lifted",
                humantime::format_duration(MAX_HOLD_FOR)
            ),
        ));
    }
    Ok(Some(d))
}

async fn set_hold(st: &AppState, id: String, kind: HoldKind, body: &[u8]) -> Response {
    // `{"reason": "...", "for": "2h"}`, both optional; no `for`: until lifted.
    let mut body = match fields(body, &["reason", "for"]) {
        Ok(b) => b,
        Err(r) => return r.into_response(),
    };
    let duration = match hold_for(body.get("for").map(String::as_str)) {
        Ok(d) => d,
        Err(r) => return r.into_response(),
    };
    let (tx, rx) = oneshot::channel();
    let reason = body
        .remove("reason")
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| format!("{kind:?} by operator").to_lowercase());
    if st
        .engine
        .send(Command::SetHold {
            id: id.clone(),
            kind,
            reason: reason.clone(),
            duration,
            reply: tx,
        })
        .await
        .is_err()
    {
        return unavailable("engine stopped").into_response();
    }
    answer(rx, json!({ "target": id, "hold": kind, "reason": reason })).await
}

async fn answer(
    rx: oneshot::Receiver<Result<(), CommandError>>,
    ok: serde_json::Value,
) -> Response {
    let err = match rx.await {
        Ok(Ok(())) => return Json(ok).into_response(),
        Ok(Err(e)) => e,
        Err(_) => return unavailable("engine stopped").into_response(),
    };
    let code = match &err {
        CommandError::UnknownTarget(_) | CommandError::NoHold { .. } => StatusCode::NOT_FOUND,
        CommandError::OtherHold { .. } => StatusCode::CONFLICT,
        CommandError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    ApiError(code, err.to_string()).into_response()
}

async fn silence(State(st): State<AppState>, Path(id): Path<String>, body: Bytes) -> Response {
    set_hold(&st, id, HoldKind::Silenced, &body).await
}

async fn maintenance(State(st): State<AppState>, Path(id): Path<String>, body: Bytes) -> Response {
    set_hold(&st, id, HoldKind::Maintenance, &body).await
}

async fn clear_silence(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    clear_hold(&st, id, HoldKind::Silenced).await
}

async fn clear_maintenance(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    clear_hold(&st, id, HoldKind::Maintenance).await
}

async fn clear_hold(st: &AppState, id: String, kind: HoldKind) -> Response {
    let (tx, rx) = oneshot::channel();
    if st
        .engine
        .send(Command::ClearHold {
            id: id.clone(),
            kind,
            reply: tx,
        })
        .await
        .is_err()
    {
        return unavailable("engine stopped").into_response();
    }
    answer(rx, json!({ "target": id, "hold": null })).await
}

async fn freeze(State(st): State<AppState>, body: Bytes) -> Response {
    let reason = match fields(&body, &["reason"]) {
        Ok(mut b) => b
            .remove("reason")
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "frozen by operator".into()),
        Err(r) => return r.into_response(),
    };
    let (tx, rx) = oneshot::channel();
    if st
        .engine
        .send(Command::Freeze {
            reason: reason.clone(),
            reply: tx,
        })
        .await
        .is_err()
    {
        return unavailable("engine stopped").into_response();
    }
    answer(rx, json!({ "frozen": true, "reason": reason })).await
}

async fn unfreeze(State(st): State<AppState>) -> Response {
    let (tx, rx) = oneshot::channel();
    if st
        .engine
        .send(Command::Unfreeze { reply: tx })
        .await
        .is_err()
    {
        return unavailable("engine stopped").into_response();
    }
    answer(rx, json!({ "frozen": false })).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeartbeatBody {
    target: String,
    /// Optional health+json report of the worker.
    #[serde(default)]
    report: Option<serde_json::Value>,
}

/// `POST /api/heartbeat`: verified ([`crate::heartbeat`]) before it counts; a refused
/// heartbeat changes nothing and is counted by its reason.
async fn heartbeat(State(st): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    match accept_heartbeat(&st, &headers, &body) {
        Ok(id) => {
            st.metrics.heartbeat("accepted");
            (
                StatusCode::ACCEPTED,
                Json(json!({ "target": id, "accepted": true })),
            )
                .into_response()
        }
        Err((why, message)) => {
            st.metrics.heartbeat(why.as_str());
            // Debug, not warn: a flood of forged heartbeats must not flood the log;
            // the counter is what to alert on.
            tracing::debug!(reason = why.as_str(), error = %message, "heartbeat refused");
            let code = match why {
                Rejection::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
                Rejection::Malformed => StatusCode::BAD_REQUEST,
                Rejection::UnknownTarget => StatusCode::NOT_FOUND,
                Rejection::Unsigned
                | Rejection::BadSignature
                | Rejection::Stale
                | Rejection::Replayed
                | Rejection::NoSecret => StatusCode::UNAUTHORIZED,
            };
            let mut resp = (
                code,
                Json(json!({ "error": message, "reason": why.as_str() })),
            )
                .into_response();
            if code == StatusCode::UNAUTHORIZED {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("X-Vigil-Signature realm=\"vigil-heartbeat\""),
                );
            }
            resp
        }
    }
}

fn accept_heartbeat(
    st: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<String, (Rejection, String)> {
    if body.len() > MAX_HEARTBEAT_BYTES {
        return Err((Rejection::TooLarge, "heartbeat too large".into()));
    }
    // Parsed before it is verified, to learn whose key signs it: bounded in size, and
    // nothing of it is used until the signature matches.
    let hb: HeartbeatBody = serde_json::from_slice(body)
        .map_err(|e| (Rejection::Malformed, format!("heartbeat body: {e}")))?;
    let known = st
        .plan
        .borrow()
        .targets
        .iter()
        .any(|t| t.id == hb.target && t.heartbeat);
    if !known {
        return Err((
            Rejection::UnknownTarget,
            format!("{:?} is not a heartbeat target", hb.target),
        ));
    }
    let auth = st
        .heartbeat_auth
        .read()
        .expect("heartbeat auth lock")
        .clone();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let signed_ms = heartbeat::verify(
        auth.secret.as_deref(),
        &hb.target,
        header(heartbeat::TIMESTAMP_HEADER),
        header(heartbeat::SIGNATURE_HEADER),
        body,
        wall_ms(),
        auth.max_skew,
    )
    .map_err(|why| {
        let message = match why {
            Rejection::NoSecret => "no heartbeat secret is configured".to_string(),
            Rejection::Unsigned => format!(
                "unsigned: {} and {} are required",
                heartbeat::TIMESTAMP_HEADER,
                heartbeat::SIGNATURE_HEADER
            ),
            Rejection::Stale => format!(
                "{} is more than {} away from the controller's clock",
                heartbeat::TIMESTAMP_HEADER,
                humantime::format_duration(auth.max_skew)
            ),
            _ => format!(
                "signature does not match (HMAC-SHA256 with {:?}'s key over \"<timestamp>.<body>\")",
                hb.target
            ),
        };
        (why, message)
    })?;
    let report = match hb.report {
        None => None,
        Some(v) => Some(
            HealthReport::parse(v.to_string().as_bytes())
                .map_err(|e| (Rejection::Malformed, format!("report: {e}")))?,
        ),
    };
    if !st.heartbeats.beat(&hb.target, signed_ms, report) {
        return Err((
            Rejection::Replayed,
            format!(
                "{} {signed_ms} is not after the last accepted heartbeat of {:?}",
                heartbeat::TIMESTAMP_HEADER,
                hb.target
            ),
        ));
    }
    Ok(hb.target)
}

// === dashboard ===

async fn dashboard_page(State(st): State<AppState>) -> Result<Response, ApiError> {
    let (f, d) = dashboard_data(&st).await?;
    Ok(no_store(dashboard::page(&f, &d).into_response()))
}

async fn dashboard_live(State(st): State<AppState>) -> Result<Response, ApiError> {
    let (f, d) = dashboard_data(&st).await?;
    Ok(no_store(dashboard::live(&f, &d).into_response()))
}

async fn dashboard_data(
    st: &AppState,
) -> Result<(Arc<FleetView>, Vec<crate::store::DecisionRecord>), ApiError> {
    let f = fleet(st).await?;
    let d = st
        .store
        .call(|s| s.decisions(None, 20))
        .await
        .map_err(unavailable)?;
    Ok((f, d))
}

fn no_store(mut r: Response) -> Response {
    let h: &mut HeaderMap = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
