//! The HTTP side: JSON API, heartbeats, Prometheus metrics and the dashboard (axum).
//!
//! Reads are open; every mutating call (holds, freezes) needs `Authorization: Bearer
//! <token>` and gets 401 without it, changing nothing. Heartbeats are the exception:
//! they can only vouch for a declared heartbeat target, and workers should not carry
//! the operator's token.

use crate::dashboard;
use crate::engine::{Command, FleetView, Plan};
use crate::metrics::Metrics;
use crate::scheduler::Heartbeats;
use crate::store::StoreHandle;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
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
}

/// The router.
pub fn router(state: AppState) -> Router {
    let mutating = Router::new()
        .route(
            "/api/targets/{id}/silence",
            post(silence).delete(clear_hold),
        )
        .route(
            "/api/targets/{id}/maintenance",
            post(maintenance).delete(clear_hold),
        )
        .route("/api/freeze", post(freeze).delete(unfreeze))
        .route("/api/unfreeze", post(unfreeze))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/", get(dashboard_page))
        .route("/dashboard/live", get(dashboard_live))
        .route("/livez", get(|| async { "ok\n" }))
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

async fn require_token(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let expected = st.token.read().expect("token lock").clone();
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
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

// === mutations ===

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct HoldBody {
    #[serde(default)]
    reason: String,
    /// How long, e.g. "2h"; absent: until cleared.
    #[serde(default, rename = "for", with = "humantime_serde")]
    duration: Option<Duration>,
}

async fn set_hold(
    st: &AppState,
    id: String,
    kind: HoldKind,
    body: HoldBody,
) -> Result<Response, ApiError> {
    let (tx, rx) = oneshot::channel();
    let reason = if body.reason.is_empty() {
        format!("{kind:?} by operator").to_lowercase()
    } else {
        body.reason
    };
    st.engine
        .send(Command::SetHold {
            id: id.clone(),
            kind,
            reason: reason.clone(),
            duration: body.duration,
            reply: tx,
        })
        .await
        .map_err(|_| unavailable("engine stopped"))?;
    answer(rx, json!({ "target": id, "hold": kind, "reason": reason })).await
}

async fn answer(
    rx: oneshot::Receiver<Result<(), String>>,
    ok: serde_json::Value,
) -> Result<Response, ApiError> {
    match rx.await {
        Ok(Ok(())) => Ok(Json(ok).into_response()),
        Ok(Err(e)) if e.starts_with("unknown target") => Err(ApiError(StatusCode::NOT_FOUND, e)),
        Ok(Err(e)) => Err(unavailable(e)),
        Err(_) => Err(unavailable("engine stopped")),
    }
}

async fn silence(
    State(st): State<AppState>,
    Path(id): Path<String>,
    body: Option<Json<HoldBody>>,
) -> Result<Response, ApiError> {
    set_hold(
        &st,
        id,
        HoldKind::Silenced,
        body.map(|b| b.0).unwrap_or_default(),
    )
    .await
}

async fn maintenance(
    State(st): State<AppState>,
    Path(id): Path<String>,
    body: Option<Json<HoldBody>>,
) -> Result<Response, ApiError> {
    set_hold(
        &st,
        id,
        HoldKind::Maintenance,
        body.map(|b| b.0).unwrap_or_default(),
    )
    .await
}

async fn clear_hold(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (tx, rx) = oneshot::channel();
    st.engine
        .send(Command::ClearHold {
            id: id.clone(),
            reply: tx,
        })
        .await
        .map_err(|_| unavailable("engine stopped"))?;
    answer(rx, json!({ "target": id, "hold": null })).await
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FreezeBody {
    #[serde(default)]
    reason: String,
}

async fn freeze(
    State(st): State<AppState>,
    body: Option<Json<FreezeBody>>,
) -> Result<Response, ApiError> {
    let mut reason = body.map(|b| b.0.reason).unwrap_or_default();
    if reason.is_empty() {
        reason = "frozen by operator".into();
    }
    let (tx, rx) = oneshot::channel();
    st.engine
        .send(Command::Freeze {
            reason: reason.clone(),
            reply: tx,
        })
        .await
        .map_err(|_| unavailable("engine stopped"))?;
    answer(rx, json!({ "frozen": true, "reason": reason })).await
}

async fn unfreeze(State(st): State<AppState>) -> Result<Response, ApiError> {
    let (tx, rx) = oneshot::channel();
    st.engine
        .send(Command::Unfreeze { reply: tx })
        .await
        .map_err(|_| unavailable("engine stopped"))?;
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

async fn heartbeat(
    State(st): State<AppState>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    if body.len() > MAX_HEARTBEAT_BYTES {
        return Err(ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            "heartbeat too large".into(),
        ));
    }
    let hb: HeartbeatBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("heartbeat body: {e}")))?;
    let known = st
        .plan
        .borrow()
        .targets
        .iter()
        .any(|t| t.id == hb.target && t.heartbeat);
    if !known {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("{:?} is not a heartbeat target", hb.target),
        ));
    }
    let report = match hb.report {
        None => None,
        Some(v) => Some(
            HealthReport::parse(v.to_string().as_bytes())
                .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("report: {e}")))?,
        ),
    };
    st.heartbeats.beat(&hb.target, report);
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "target": hb.target, "accepted": true })),
    )
        .into_response())
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
