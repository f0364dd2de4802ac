//! The HTTP side: JSON API, heartbeats, Prometheus metrics and the dashboard (axum).
//!
//! Reads are open; every mutating call (holds, freezes) needs `Authorization: Bearer
//! <token>` (the scheme in any case, RFC 7235) and gets 401 without it, changing
//! nothing. Heartbeats are signed instead, each target with its own key
//! ([`crate::heartbeat`]): workers should not carry the operator's token.
//!
//! Reads never ask the engine for the fleet: they read the view it publishes
//! ([`crate::view`]) and filter, page and serialise it on their own task. Heavy reads
//! (a page of targets, the decision and action logs, a target's history, the
//! dashboard) are capped at [`HEAVY_READS`] at a time; beyond that they are refused at
//! once with `503` and `Retry-After`, which costs next to nothing, so no number of
//! looping readers can take the core the probes need.

use crate::clock::wall_ms;
use crate::dashboard;
use crate::engine::{Command, EngineError, Plan};
use crate::heartbeat::{self, Rejection};
use crate::metrics::Metrics;
use crate::scheduler::Heartbeats;
use crate::store::StoreHandle;
use crate::view::{FleetView, FleetViews, TargetInfo, counts_as_map};
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
use subtle::ConstantTimeEq;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use vigil_core::HealthReport;
use vigil_core::fleet::Standing;
use vigil_core::guard::HoldKind;

/// Default number of records a list endpoint returns.
const DEFAULT_LIMIT: usize = 50;
/// Most records a list endpoint returns, however many are asked for.
const MAX_LIMIT: usize = 1000;
/// Targets per page of `GET /api/targets` unless `?limit=` says otherwise: about
/// 150 KB of JSON, serialised in well under a millisecond.
const DEFAULT_TARGET_LIMIT: usize = 500;
/// Heavy reads served at a time; more are refused with 503. Four lets a few dashboards
/// and scripts read together, and bounds what reads can hold (a page, a rendered
/// dashboard: each under a few MB at 10,000 targets) and queue on the store's thread,
/// which commits the engine's batches.
pub const HEAVY_READS: usize = 4;
/// Scrapes of `/metrics` served at a time (apart from the heavy reads, so a crowd of
/// dashboard readers never fails Prometheus' scrape, nor scrapers the dashboards).
const METRICS_SCRAPES: usize = 2;
/// What a refused read is told to wait (seconds).
const RETRY_AFTER_S: &str = "1";
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
    /// The fleet as the engine last published it.
    pub views: FleetViews,
    /// The configuration in force (the dashboard says when the actuator is a dry run).
    pub config: watch::Receiver<Arc<crate::config::ControllerConfig>>,
    /// The balancers' pools as last read (`[dashboard] balancers`).
    pub balancers: crate::balancers::BalancerViews,
    /// Who leads (several replicas on PostgreSQL), for `GET /api/leader`.
    pub leadership: watch::Receiver<crate::leader::Leadership>,
    /// What this replica probes, and the live replicas sharing the probing.
    pub probing: watch::Receiver<Arc<crate::probing::Probing>>,
    /// How each discovery source fared, for `GET /api/discovery`.
    pub discovery: Arc<crate::discovery::DiscoveryStatus>,
    /// The `liveness` actuator's restart permits, for `GET /api/targets/{id}/liveness`.
    pub permits: crate::actuator::Permits,
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
    let heavy = Router::new()
        .route("/", get(dashboard_page))
        .route("/dashboard/live", get(dashboard_live))
        .route("/api/targets", get(targets))
        .route("/api/targets/{id}", get(target))
        .route("/api/decisions", get(decisions))
        .route("/api/actions", get(actions))
        .route_layer(middleware::from_fn_with_state(
            Arc::new(Semaphore::new(HEAVY_READS)),
            at_most,
        ));
    let scrapes =
        Router::new()
            .route("/metrics", get(metrics))
            .route_layer(middleware::from_fn_with_state(
                Arc::new(Semaphore::new(METRICS_SCRAPES)),
                at_most,
            ));
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/guard", get(guard))
        .route("/api/leader", get(leader))
        .route("/api/probing", get(probing))
        .route("/api/discovery", get(discovery))
        // Not a heavy read: one lookup in the published view (and, rarely, the target's
        // last decision). An instance's liveness probe must not be refused with 503
        // because dashboards are busy: `vigil check --fleet` would take that for a dead
        // controller and restart on its local verdict.
        .route("/api/targets/{id}/liveness", get(liveness))
        .route("/api/heartbeat", post(heartbeat))
        .merge(heavy)
        .merge(scrapes)
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

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let code = match &e {
            EngineError::UnknownTarget(_) | EngineError::NoHold { .. } => StatusCode::NOT_FOUND,
            EngineError::OtherHold { .. } => StatusCode::CONFLICT,
            EngineError::Store(_) | EngineError::Stopped | EngineError::NotLeader { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        ApiError(code, e.to_string())
    }
}

/// An engine refusal as the API answers it: its status and `{"error": ...}`, and for
/// a follower the replica that leads (`"leader"`, null when nobody does now), where a
/// client sends the mutation instead.
fn refusal(e: EngineError) -> Response {
    let leader = match &e {
        EngineError::NotLeader { leader, .. } => Some(leader.clone()),
        _ => None,
    };
    let ApiError(code, message) = ApiError::from(e);
    match leader {
        Some(leader) => (
            code,
            [(header::RETRY_AFTER, RETRY_AFTER_S)],
            Json(json!({ "error": message, "leader": leader })),
        )
            .into_response(),
        None => ApiError(code, message).into_response(),
    }
}

fn unavailable<E: std::fmt::Display>(e: E) -> ApiError {
    ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}

/// A query parameter that cannot be served: 422 naming it.
#[derive(Debug)]
struct BadParam {
    name: String,
    why: String,
}

impl IntoResponse for BadParam {
    fn into_response(self) -> Response {
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(
                json!({ "error": format!("{}: {}", self.name, self.why), "parameter": self.name }),
            ),
        )
            .into_response()
    }
}

fn bad_param(name: &str, why: impl std::fmt::Display) -> BadParam {
    BadParam {
        name: name.to_string(),
        why: why.to_string(),
    }
}

// === auth ===

/// Constant-time comparison (`subtle`), so the token cannot be guessed byte by byte
/// from timings. Only its length shows (as before: a token's length is no secret).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
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

/// Serves the request if one of `permits` is free, else refuses it at once with 503
/// and `Retry-After` (queueing would let looping readers pile up memory and work).
async fn at_most(State(permits): State<Arc<Semaphore>>, req: Request, next: Next) -> Response {
    let Ok(_permit) = permits.try_acquire_owned() else {
        let mut resp = unavailable("too many reads at once; retry shortly").into_response();
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_S));
        return resp;
    };
    next.run(req).await
}

/// A JSON answer serialised straight from borrowed data (no `serde_json::Value` tree
/// of the fleet).
fn json_bytes<T: serde::Serialize>(v: &T) -> Response {
    match serde_json::to_vec(v) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `GET /api/targets`: which targets, validated.
#[derive(Debug, Default, PartialEq)]
struct TargetQuery {
    /// Only targets in one of these states (empty: any).
    states: Vec<Standing>,
    /// Only targets in this zone.
    zone: Option<String>,
    /// At most this many.
    limit: usize,
    /// Only targets whose id sorts after this one (the previous page's `next_after`).
    after: Option<String>,
}

impl TargetQuery {
    /// Parses the query's pairs; an unknown, repeated or bad parameter is a 422
    /// naming it.
    fn parse(pairs: &[(String, String)]) -> Result<TargetQuery, BadParam> {
        let mut q = TargetQuery {
            limit: DEFAULT_TARGET_LIMIT,
            ..TargetQuery::default()
        };
        let mut seen: Vec<&str> = Vec::new();
        for (name, value) in pairs {
            if seen.contains(&name.as_str()) {
                return Err(bad_param(name, "given more than once"));
            }
            seen.push(name);
            match name.as_str() {
                "state" => {
                    for s in value.split(',') {
                        let Some(state) = Standing::from_name(s.trim()) else {
                            let known: Vec<&str> = Standing::ALL.map(Standing::name).to_vec();
                            return Err(bad_param(
                                name,
                                format!(
                                    "unknown state {s:?} (one or more of {}, comma-separated)",
                                    known.join(", ")
                                ),
                            ));
                        };
                        q.states.push(state);
                    }
                }
                "zone" => q.zone = Some(value.clone()),
                "limit" => {
                    q.limit = match value.parse::<usize>() {
                        Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
                        _ => {
                            return Err(bad_param(
                                name,
                                format!(
                                    "must be a whole number from 1 to {MAX_LIMIT}, got {value:?}"
                                ),
                            ));
                        }
                    }
                }
                "after" => q.after = Some(value.clone()),
                _ => {
                    return Err(bad_param(
                        name,
                        "unknown parameter (known: state, zone, limit, after)",
                    ));
                }
            }
        }
        Ok(q)
    }

    fn wants(&self, t: &TargetInfo) -> bool {
        (self.states.is_empty() || self.states.contains(&t.state))
            && self.zone.as_ref().is_none_or(|z| *z == t.spec.zone)
    }

    /// The page of `targets` (sorted by id) it selects, and whether more follow.
    fn page<'a>(&self, targets: &'a [TargetInfo]) -> (Vec<&'a TargetInfo>, bool) {
        let from = self
            .after
            .as_deref()
            .map_or(0, |a| targets.partition_point(|t| t.id() <= a));
        let mut page: Vec<&TargetInfo> = targets[from..]
            .iter()
            .filter(|t| self.wants(t))
            .take(self.limit + 1)
            .collect();
        let more = page.len() > self.limit;
        page.truncate(self.limit);
        (page, more)
    }
}

#[derive(serde::Serialize)]
struct TargetPage<'a> {
    now_ms: i64,
    /// Targets in the fleet.
    total: usize,
    /// Targets per state, the whole fleet.
    #[serde(serialize_with = "counts_as_map")]
    counts: &'a [(Standing, usize)],
    targets: Vec<&'a TargetInfo>,
    /// Pass as `?after=` for the next page (None: this is the last).
    next_after: Option<&'a str>,
}

async fn targets(
    State(st): State<AppState>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Response {
    let q = match TargetQuery::parse(&pairs) {
        Ok(q) => q,
        Err(bad) => return bad.into_response(),
    };
    let f: Arc<FleetView> = st.views.load();
    let body = f.answers.get_or_make(&format!("targets {q:?}"), || {
        let (page, more) = q.page(&f.targets);
        let next_after = more.then(|| page.last().map(|t| t.id())).flatten();
        let page = TargetPage {
            now_ms: f.now_ms,
            total: f.targets.len(),
            counts: &f.counts,
            targets: page,
            next_after,
        };
        serde_json::to_vec(&page)
            .expect("a page of targets serialises")
            .into()
    });
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn target(State(st): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    // Asked of the engine (one target's worth of work): the published view leaves the
    // probe history out to stay small.
    let (tx, rx) = oneshot::channel();
    st.engine
        .send(Command::Target {
            id: id.clone(),
            reply: tx,
        })
        .await
        .map_err(|_| EngineError::Stopped)?;
    let t = rx.await.map_err(|_| EngineError::Stopped)??;
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

impl ListQuery {
    /// The rows asked for: `limit` (default 50) from 1 to 1,000. A limit outside that is
    /// refused with a 422 naming it, not silently clamped (a client asking for 5,000 rows
    /// and getting 1,000 would think it had them all).
    fn limit(&self) -> Result<usize, BadParam> {
        match self.limit {
            None => Ok(DEFAULT_LIMIT),
            Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            Some(n) => Err(bad_param(
                "limit",
                format!("must be a whole number from 1 to {MAX_LIMIT}, got {n}"),
            )),
        }
    }
}

async fn decisions(
    State(st): State<AppState>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let limit = match q.limit() {
        Ok(n) => n,
        Err(bad) => return Ok(bad.into_response()),
    };
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
    let limit = match q.limit() {
        Ok(n) => n,
        Err(bad) => return Ok(bad.into_response()),
    };
    let rows = st
        .store
        .call(move |s| s.actions(limit))
        .await
        .map_err(unavailable)?;
    Ok(Json(json!({ "actions": rows })).into_response())
}

async fn guard(State(st): State<AppState>) -> Response {
    #[derive(serde::Serialize)]
    struct GuardPage<'a> {
        now_ms: i64,
        guard: &'a crate::view::GuardView,
        events: &'a [crate::view::EventInfo],
        #[serde(serialize_with = "counts_as_map")]
        counts: &'a [(Standing, usize)],
        store_error: Option<&'a str>,
    }
    let f = st.views.load();
    json_bytes(&GuardPage {
        now_ms: f.now_ms,
        guard: &f.guard,
        events: &f.events,
        counts: &f.counts,
        store_error: f.store_error.as_deref(),
    })
}

// === liveness ===

/// `GET /api/targets/{id}/liveness`: may this instance be restarted now? What `vigil
/// check --fleet` asks when its local check fails. `{"verdict": "restart"}` while the
/// target holds a restart permit of the `liveness` actuator (the guard decided to act
/// on it: failing on its own, within budget and cap); otherwise `{"verdict": "alive"}`
/// with the guard's reason (a freeze, a spent budget, a shared cause, an operator hold,
/// or not failing as the controller sees it). 404 for an unknown target; 503 (with the
/// leader) on a replica that does not lead, which holds no permits.
async fn liveness(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    let l = st.leadership.borrow().clone();
    if l.store != "sqlite" && l.epoch.is_none() {
        let leader = l.leader.as_ref().map(|r| r.holder.clone());
        return no_store(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({
                    "error": format!("replica {} does not lead: restart permits are held by the leader", l.replica),
                    "leader": leader,
                })),
            )
                .into_response(),
        );
    }
    let view = st.views.load();
    let Ok(i) = view.targets.binary_search_by(|t| t.id().cmp(id.as_str())) else {
        return ApiError(StatusCode::NOT_FOUND, format!("unknown target {id:?}")).into_response();
    };
    let t = &view.targets[i];
    let kind = st.config.borrow().actuator.kind;
    if let Some(p) = st.permits.collect(&id, tokio::time::Instant::now()) {
        return no_store(
            Json(json!({
                "target": id,
                "verdict": "restart",
                "reason": format!(
                    "restart permit of action {} (granted {} ago, valid {} more): failing on its own, within the fleet's budget and cap",
                    p.action,
                    humantime::format_duration(Duration::from_secs(p.age.as_secs())),
                    humantime::format_duration(Duration::from_secs(p.left.as_secs())),
                ),
                "action": p.action,
                "state": t.state,
            }))
            .into_response(),
        );
    }
    let mut reason = alive_reason(t, &view);
    if t.state == Standing::Unhealthy && !frozen(t, &view) && view.guard.budget_left > 0 {
        // Held back for a reason of its own (a shared dependency, peers failing, a
        // freeze's aftermath): its last decision says which. Rare, so the store is asked.
        let id2 = id.clone();
        if let Ok(Ok(mut d)) = tokio::time::timeout(
            Duration::from_secs(1),
            st.store.call(move |s| s.decisions(Some(&id2), 1)),
        )
        .await
            && let Some(d) = d.pop()
        {
            reason = format!("held back by the guard: {}", d.summary);
        }
    }
    if kind != crate::config::ActuatorKind::Liveness {
        reason.push_str(
            " (actuator.kind is not \"liveness\": this controller grants no restart permits)",
        );
    }
    no_store(
        Json(json!({ "target": id, "verdict": "alive", "reason": reason, "state": t.state }))
            .into_response(),
    )
}

/// Whether `t`'s fleet or zone is frozen in `view`.
fn frozen(t: &TargetInfo, view: &FleetView) -> bool {
    view.guard.frozen || view.guard.frozen_zones.iter().any(|z| *z == t.spec.zone)
}

/// Why a target without a permit may not be restarted, from the published view.
fn alive_reason(t: &TargetInfo, view: &FleetView) -> String {
    let g = &view.guard;
    match t.state {
        Standing::Healthy => "not failing from the controller's view: it passes its probes".into(),
        Standing::Failing => format!(
            "not failing long enough from the controller's view ({} failed probe(s) so far)",
            t.consecutive_failures
        ),
        Standing::Grace => "in its grace period: not judged yet".into(),
        Standing::Unknown => "no probe of the controller has answered yet".into(),
        Standing::Silenced | Standing::Maintenance => {
            let why = t.hold.as_ref().map_or("", |h| h.reason.as_str());
            format!("operator hold ({}): {why}", t.state.name())
        }
        Standing::Flapping => "flapping: damped, not restarted".into(),
        Standing::Reported => "already acted on; its restart permit expired (it is acted on again once it has recovered)".into(),
        Standing::Unhealthy if frozen(t, view) => {
            let mut why = if g.frozen {
                "frozen: the fleet".to_string()
            } else {
                format!("frozen: zone {}", t.spec.zone)
            };
            if let Some(m) = &g.manual_freeze {
                why.push_str(&format!(" (operator: {m})"));
            }
            if !g.reasons.is_empty() {
                why.push_str(": ");
                why.push_str(&g.reasons.join("; "));
            }
            why
        }
        Standing::Unhealthy if g.budget_left == 0 => {
            let next = g
                .next_token_at_ms
                .map(|ms| format!("; the next token returns in {}", humantime::format_duration(Duration::from_secs(((ms - view.now_ms).max(0) / 1000) as u64))))
                .unwrap_or_default();
            format!(
                "restart budget spent: {} per {} used{next}",
                g.budget_actions,
                humantime::format_duration(g.budget_per)
            )
        }
        Standing::Unhealthy => "held back by the guard".into(),
    }
}

async fn metrics(State(st): State<AppState>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (ctype, body) = st.metrics.encode_for(accept);
    ([(header::CONTENT_TYPE, ctype)], body).into_response()
}

/// Who leads: this replica's id, whether it leads (and in which epoch), and the lease
/// as last read from the store (holder, epoch, since and expiry in UNIX ms of the
/// database's clock). A follower serves every read of the API and the dashboard from
/// the store; mutations go to the leader.
async fn leader(State(st): State<AppState>) -> Response {
    let l = st.leadership.borrow().clone();
    let mut body = serde_json::to_value(&l).unwrap_or_default();
    body["leading"] = serde_json::Value::Bool(l.store == "sqlite" || l.epoch.is_some());
    body["summary"] = serde_json::Value::String(if l.store == "sqlite" {
        format!("replica {} alone on its SQLite store", l.replica)
    } else {
        l.describe()
    });
    no_store(axum::Json(body).into_response())
}

/// Which replicas probe which targets: the live members as this replica last read
/// them, its own share, and each probed target's probers (rendezvous hashing).
async fn probing(State(st): State<AppState>) -> Response {
    let p = st.probing.borrow().clone();
    let plan = st.plan.borrow().clone();
    let mut shares: std::collections::BTreeMap<&str, usize> = p
        .shard
        .iter()
        .flat_map(|s| s.members().iter().map(|m| (m.as_str(), 0)))
        .collect();
    let mut share = 0usize;
    let targets: Vec<serde_json::Value> = plan
        .targets
        .iter()
        .map(|t| {
            let probers: Vec<&str> = match (&p.shard, t.heartbeat) {
                (Some(s), false) => s.probers_of(&t.id),
                _ => vec![p.replica.as_str()],
            };
            for m in &probers {
                *shares.entry(m).or_default() += 1;
            }
            let here = p.probes(t);
            share += usize::from(here);
            serde_json::json!({"id": t.id, "probers": probers, "here": here, "heartbeat": t.heartbeat})
        })
        .collect();
    let body = serde_json::json!({
        "replica": p.replica,
        "sharded": p.shard.is_some(),
        "probers": p.shard.as_ref().map_or(1, |s| s.probers()),
        "live": p.shard.as_ref().map_or_else(|| vec![p.replica.clone()], |s| s.members().to_vec()),
        "members": p.members,
        "share": share,
        "shares": shares,
        "targets": targets,
        "summary": match &p.shard {
            Some(s) => format!(
                "{} live replicas share the probing, {} per target; replica {} probes {share} of {} targets",
                s.members().len(), s.probers().min(s.members().len()), p.replica, plan.targets.len()
            ),
            None => format!("replica {} alone probes all {} targets", p.replica, plan.targets.len()),
        },
    });
    no_store(axum::Json(body).into_response())
}

/// Each discovery source's state: a failing source keeps its last list, and this is
/// where that shows (besides the ERROR log lines and `vigil_controller_discovery_up`).
async fn discovery(State(st): State<AppState>) -> Response {
    let sources = st.discovery.snapshot();
    let failing: Vec<&str> = sources.iter().filter(|s| !s.ok).map(|s| s.source).collect();
    let mut summary = if sources.is_empty() {
        "no discovery source configured".to_string()
    } else if failing.is_empty() {
        "every discovery source works".to_string()
    } else {
        format!("failing: {}; their last lists are kept", failing.join(", "))
    };
    let skipped: Vec<String> = sources
        .iter()
        .flat_map(|s| s.skipped.iter().map(ToString::to_string))
        .collect();
    match skipped.len() {
        0 => {}
        1 => summary.push_str(&format!(
            "; 1 instance in service is not a target: {}",
            skipped[0]
        )),
        n => summary.push_str(&format!(
            "; {n} instances in service are not targets: {}",
            skipped.join("; ")
        )),
    }
    no_store(
        axum::Json(serde_json::json!({"sources": sources, "summary": summary})).into_response(),
    )
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
        return ApiError::from(EngineError::Stopped).into_response();
    }
    answer(rx, json!({ "target": id, "hold": kind, "reason": reason })).await
}

async fn answer(rx: oneshot::Receiver<Result<(), EngineError>>, ok: serde_json::Value) -> Response {
    match rx.await {
        Ok(Ok(())) => Json(ok).into_response(),
        Ok(Err(e)) => refusal(e),
        Err(_) => ApiError::from(EngineError::Stopped).into_response(),
    }
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
        return ApiError::from(EngineError::Stopped).into_response();
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
        return ApiError::from(EngineError::Stopped).into_response();
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
        return ApiError::from(EngineError::Stopped).into_response();
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
    /// A queue worker's counters, compared with its peers'.
    #[serde(default)]
    worker: Option<heartbeat::WorkerCounters>,
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
    if !st.heartbeats.beat(&hb.target, signed_ms, report, hb.worker) {
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
    let (f, recent) = dashboard_data(&st).await?;
    Ok(no_store(dashboard::page(&f, &recent).into_response()))
}

async fn dashboard_live(State(st): State<AppState>) -> Result<Response, ApiError> {
    let (f, recent) = dashboard_data(&st).await?;
    Ok(no_store(dashboard::live(&f, &recent).into_response()))
}

async fn dashboard_data(st: &AppState) -> Result<(Arc<FleetView>, dashboard::Recent), ApiError> {
    let recent = st
        .store
        .call(|s| {
            Ok(dashboard::Recent {
                decisions: s.decisions(None, dashboard::RECENT_DECISIONS)?,
                actions: s.actions(dashboard::RECENT_ACTIONS)?,
                balancers: Arc::default(),
                dry_run: false,
                rollouts: s.recent_rollouts(dashboard::rollouts::RECENT_ROLLOUTS)?,
            })
        })
        .await
        .map_err(unavailable)?;
    let mut recent = recent;
    recent.balancers = st.balancers.load_full();
    recent.dry_run = st.config.borrow().actuator.kind == crate::config::ActuatorKind::Log;
    // The view after the store's records: a decision the view shows acted on is
    // already in them.
    Ok((st.views.load(), recent))
}

fn no_store(mut r: Response) -> Response {
    let h: &mut HeaderMap = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[cfg(test)]
mod tests;
