//! The service itself: routes, checks, cache, fault injection, start and drain.
//!
//! Degraded mode, the point of the example: reads go to the database through a
//! [`DependencyGuard`] and are answered from the in-memory cache when a read fails, runs
//! past its budget, or the guard's breaker is open (slow or failing reads opened it: no
//! read waits on a database known to be slow or down). A read's budget is
//! [`ServiceConfig::read_budget`] (1 s), or less when the caller's deadline
//! (`x-vigil-deadline-ms`, `grpc-timeout`) leaves less: what is left of it minus
//! [`DEADLINE_MARGIN`], so the cached answer still reaches the caller in time. The
//! database check and the guard's check are non-critical *dependencies*: when the
//! database is down `/health` says `warn` (with the reason) and `/readyz` stays `pass`,
//! so load balancers keep routing to a server that still serves. Only when nothing can be
//! served (database down *and* nothing cached) does the local `cache:serving` check fail
//! readiness.
//!
//! The application's port runs vigil's admission layer ([`Admission`]: deadlines, an
//! adaptive concurrency limit, a controlled-delay queue), or with
//! [`AdmissionMode::Off`] the fixed shed limit alone (`max_in_flight`), the setup the
//! benchmarks compare it with.

use crate::store::{Item, Store};
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use vigil::checks::{Amount, DiskSpace, FileDescriptors, InFlight, Memory, Saturation};
use vigil::guard::{BreakerConfig, Degraded};
use vigil::{
    Admission, AdmissionConfig, Check, CheckOptions, CheckResult, Criticality, DependencyGuard,
    FnCheck, Guarded, Health, HealthConfig, Status,
};

/// Default read budget: a read waits at most 1 s for the database before answering from
/// the cache (the clients' usual patience; a read slower than that counts as bad for the
/// breaker).
pub const DEFAULT_READ_BUDGET: Duration = Duration::from_secs(1);
/// What a read leaves of the caller's deadline: 50 ms to answer from the cache and send
/// the answer, so a degraded answer arrives before the caller gives up (a balancer's
/// per-try timeout, loopback to a LAN away).
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(50);
/// Whether the application's port runs the admission layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AdmissionMode {
    /// Deadlines, the adaptive limit (at most `max_in_flight`) and the queue (the default).
    #[default]
    On,
    /// The fixed limit alone: `max_in_flight` requests, the rest shed with 503.
    Off,
}
/// The database check gives up after this (its registry timeout is twice as long, so the
/// check can record the failure itself and open the read breaker).
pub const DB_CHECK_TIMEOUT: Duration = Duration::from_secs(1);
/// The database check warns when a round trip is slower than this: reads still work
/// but clients feel it (a brownout).
pub const DB_SLOW: Duration = Duration::from_millis(200);
/// Longest `/work` or `/fault/freeze` a request may ask for: bounded so a typo cannot
/// wedge the demo for an hour.
pub const MAX_BUSY: Duration = Duration::from_secs(60);
/// Default flap period of the dependency fault.
pub const DEFAULT_FLAP_PERIOD: Duration = Duration::from_secs(2);

/// What [`start`] needs.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// Application listener.
    pub listen: SocketAddr,
    /// Reserved health listener.
    pub health_listen: SocketAddr,
    /// HAProxy agent-check responder (its own thread too), if wanted.
    pub agent_listen: Option<SocketAddr>,
    /// gRPC health v1 server (on the application runtime), if wanted.
    pub grpc_listen: Option<SocketAddr>,
    /// PostgreSQL URL.
    pub db: String,
    /// SQLite file used when PostgreSQL is unreachable at start.
    pub sqlite_path: PathBuf,
    /// Directory whose filesystem the disk check watches.
    pub data_dir: PathBuf,
    /// Free space on `data_dir`'s filesystem below which `/health` warns (None: never).
    pub disk_warn_below: Option<Amount>,
    /// Free space on `data_dir`'s filesystem below which `/health` fails.
    pub disk_fail_below: Amount,
    /// Instance name (reported as the health description).
    pub name: String,
    /// The revision it runs (reported as health+json's `releaseId`).
    pub revision: String,
    /// Worker threads of the application runtime (for `/fault/freeze`).
    pub workers: usize,
    /// Application requests in flight at once before shedding.
    pub max_in_flight: usize,
    /// Interval of every check.
    pub check_interval: Duration,
    /// How long readiness fails before the listener closes on shutdown.
    pub drain_delay: Duration,
    /// Whether a database failure fails `/health` (critical) or only degrades it
    /// (non-critical, the default: reads are still served from the cache).
    pub dependency: Criticality,
    /// The admission layer, on or off.
    pub admission: AdmissionMode,
    /// The longest a read waits for the database (the guard's slow-call threshold).
    pub read_budget: Duration,
}

/// The in-memory read cache.
#[derive(Default)]
struct Cache {
    items: RwLock<HashMap<i64, Item>>,
}

impl Cache {
    fn get(&self, id: i64) -> Option<Item> {
        self.items
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }
    fn put(&self, item: Item) {
        self.items
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(item.id, item);
    }
    fn len(&self) -> usize {
        self.items.read().unwrap_or_else(|e| e.into_inner()).len()
    }
    fn clear(&self) {
        self.items
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

struct AppState {
    store: Arc<Store>,
    cache: Arc<Cache>,
    /// The reads' breaker.
    guard: Arc<DependencyGuard>,
    /// Verdict of the last database check (for `cache:serving` and `/fault`).
    db_up: Arc<AtomicBool>,
    disk_fault: Arc<AtomicBool>,
    flap: Mutex<Option<tokio::task::AbortHandle>>,
    workers: usize,
    /// The POST fault: this many POSTs in 10,000 answer 500 (`/fault/post-errors`).
    post_errors: AtomicU32,
    /// POSTs answered so far (the fault picks every n-th, evenly: reproducible).
    posts: AtomicU64,
}

// === checks ===

/// The disk check, switchable to a threshold no filesystem can meet (100% free); the
/// example worker's disk fault is the same check.
pub(crate) struct DiskWithFault {
    pub(crate) normal: DiskSpace,
    pub(crate) impossible: DiskSpace,
    pub(crate) fault: Arc<AtomicBool>,
}

impl Check for DiskWithFault {
    async fn check(&self) -> CheckResult {
        if self.fault.load(Ordering::SeqCst) {
            let mut o = self.impossible.check().await;
            o.output = o
                .output
                .map(|s| format!("{s} (fault injected: a threshold no disk can meet)"));
            o
        } else {
            self.normal.check().await
        }
    }
    fn component_type(&self) -> &str {
        "system"
    }
}

/// The database round trip, on its own connection; records its verdict for
/// `cache:serving`.
struct StoreCheck {
    store: Arc<Store>,
    db_up: Arc<AtomicBool>,
}

impl Check for StoreCheck {
    async fn check(&self) -> CheckResult {
        let started = Instant::now();
        let result = tokio::time::timeout(DB_CHECK_TIMEOUT, self.store.ping()).await;
        let took = started.elapsed();
        let ms = (took.as_secs_f64() * 100_000.0).round() / 100.0;
        let kind = self.store.kind();
        let observation = match result {
            Ok(Ok(())) if took > DB_SLOW => CheckResult::new(Status::Warn).with_output(format!(
                "{kind}: SELECT 1 took {ms} ms, slower than {}",
                humantime::format_duration(DB_SLOW)
            )),
            Ok(Ok(())) => {
                CheckResult::new(Status::Pass).with_output(format!("{kind}: SELECT 1 in {ms} ms"))
            }
            Ok(Err(e)) => CheckResult::fail(format!("{e}; reads served from the cache")),
            Err(_) => CheckResult::fail(format!(
                "{kind}: no answer within {}; reads served from the cache",
                humantime::format_duration(DB_CHECK_TIMEOUT)
            )),
        };
        let up = observation.status != Status::Fail;
        if self.db_up.swap(up, Ordering::SeqCst) != up {
            tracing::info!(database = kind, up, output = ?observation.output, "database state changed");
        }
        observation.with_observed(ms, "ms")
    }
    fn component_type(&self) -> &str {
        "datastore"
    }
}

// === start ===

/// The gRPC health server's stop switch and task.
type GrpcServer = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
);

/// A started service.
pub struct Running {
    /// Where the application listens.
    pub app_addr: SocketAddr,
    /// Where the reserved health listener listens.
    pub health_addr: SocketAddr,
    /// The health handle.
    pub health: Health,
    /// Which store is in use: `postgres` or `sqlite`.
    pub store_kind: &'static str,
    /// Why the store is SQLite although a PostgreSQL URL was given.
    pub store_fallback: Option<String>,
    /// Where the agent-check responder listens, if started.
    pub agent_addr: Option<SocketAddr>,
    /// Where the gRPC health server listens, if started.
    pub grpc_addr: Option<SocketAddr>,
    /// The gRPC health server: stopped after the application listener.
    grpc: Option<GrpcServer>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    reserved: vigil::ReservedServer,
    agent: Option<vigil::agent::AgentServer>,
}

impl Running {
    /// Resolves when the service has stopped: after a SIGTERM/Ctrl-C or [`Running::stop`],
    /// readiness failed, the drain delay passed, the listener closed and in-flight
    /// requests finished.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let result = (&mut self.server).await;
        if let Some((stop, task)) = self.grpc.take() {
            // NOT_SERVING since the drain began; now the port closes too.
            let _ = stop.send(());
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "gRPC health server failed"),
                Err(e) => tracing::warn!(error = %e, "gRPC health server task failed"),
            }
        }
        self.reserved.shutdown();
        if let Some(agent) = self.agent {
            agent.shutdown();
        }
        result??;
        tracing::info!("stopped");
        Ok(())
    }

    /// Starts the same drain a SIGTERM starts.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // The server may be gone already; then it is stopped.
            let _ = stop.send(());
        }
    }
}

/// Opens the store, warms the cache, registers the checks, binds both listeners and
/// serves on the current runtime.
pub async fn start(config: ServiceConfig) -> anyhow::Result<Running> {
    std::fs::create_dir_all(&config.data_dir)?;
    let store = Arc::new(Store::open(&config.db, config.sqlite_path.clone()).await?);
    let cache = Arc::new(Cache::default());
    match store.all().await {
        Ok(items) => {
            let n = items.len();
            items.into_iter().for_each(|i| cache.put(i));
            tracing::info!(items = n, "cache warmed");
        }
        Err(e) => tracing::warn!(error = %e, "cannot warm the cache"),
    }
    let db_up = Arc::new(AtomicBool::new(true));
    let disk_fault = Arc::new(AtomicBool::new(false));
    let in_flight = InFlight::new();
    let guard = DependencyGuard::new(
        store.kind(),
        BreakerConfig {
            slow_call: config.read_budget,
            ..BreakerConfig::default()
        },
        "serving cached reads",
    );
    let admission = (config.admission == AdmissionMode::On).then(|| {
        let mut cfg = AdmissionConfig::default();
        let max = u32::try_from(config.max_in_flight).unwrap_or(u32::MAX);
        cfg.limit.max = max;
        cfg.limit.min = cfg.limit.min.min(max);
        cfg.limit.initial = cfg.limit.initial.min(max);
        Admission::new(cfg)
    });

    let every = CheckOptions::every(config.check_interval).timeout(DB_CHECK_TIMEOUT * 2);
    let serving = {
        let cache = cache.clone();
        let db_up = db_up.clone();
        FnCheck::new(move || {
            let n = cache.len();
            let up = db_up.load(Ordering::SeqCst);
            let o = if n > 0 {
                CheckResult::new(Status::Pass).with_output(format!("{n} items cached"))
            } else if up {
                CheckResult::new(Status::Pass).with_output("cache empty; reads go to the database")
            } else {
                CheckResult::fail("cannot serve: the database is unreachable and nothing is cached")
            };
            std::future::ready(o.with_observed(n, "count"))
        })
    };
    let mut builder = Health::builder();
    if let Some(a) = &admission {
        // Warns (never fails) while it queues or refuses: overload is not a fault.
        builder = builder.local("admission:requests", a.check(), every.clone());
    }
    let health = builder
        .description(format!("vigil example service {}", config.name))
        .version(env!("CARGO_PKG_VERSION"))
        .release_id(config.revision.clone())
        .config(HealthConfig {
            drain_delay: config.drain_delay,
            ..HealthConfig::default()
        })
        .local(
            "disk:free",
            DiskWithFault {
                normal: {
                    let d = DiskSpace::new(&config.data_dir).fail_below(config.disk_fail_below);
                    match config.disk_warn_below {
                        Some(level) => d.warn_below(level),
                        None => d.no_warn(),
                    }
                },
                impossible: DiskSpace::new(&config.data_dir).fail_below(Amount::Percent(100.0)),
                fault: disk_fault.clone(),
            },
            every.clone(),
        )
        .local("fd:open", FileDescriptors::new(), every.clone())
        .local("memory:working-set", Memory::new(), every.clone())
        .local(
            "workers:in-flight",
            Saturation::with_tracker(in_flight.clone(), config.max_in_flight),
            every.clone(),
        )
        .local("cache:serving", serving, every.clone())
        .dependency(
            &format!("{}:query", store.kind()),
            StoreCheck {
                store: store.clone(),
                db_up: db_up.clone(),
            },
            CheckOptions {
                criticality: config.dependency,
                ..every.clone()
            },
        )
        // Warns with the reason while the reads' breaker is open; reads the breaker's
        // state only, never the database.
        .dependency(
            &format!("{}:reads", store.kind()),
            guard.check(),
            CheckOptions {
                criticality: Criticality::NonCritical,
                ..every.clone()
            },
        )
        .start();

    let state = Arc::new(AppState {
        store: store.clone(),
        cache,
        guard: guard.clone(),
        db_up,
        disk_fault,
        flap: Mutex::new(None),
        workers: config.workers,
        post_errors: AtomicU32::new(0),
        posts: AtomicU64::new(0),
    });
    // The library's metrics (checks, lifecycle, admission or shedding, the reads' guard,
    // build), served at /metrics in the format the scraper asks for.
    let shed = health.shed_layer(config.max_in_flight);
    let mut registry = prometheus_client::registry::Registry::default();
    let collector = vigil::metrics::HealthCollector::new(&health).with_guard(guard);
    match &admission {
        Some(a) => collector.with_admission(a.clone()),
        None => collector.with_shed(shed.stats()),
    }
    .register(&mut registry);
    let registry = Arc::new(registry);
    let app = Router::new()
        .route("/", get(index))
        .route("/items/{id}", get(item))
        .route("/orders", post(order))
        .route("/work", get(work))
        .route("/naive/livez", get(naive_livez))
        .route("/fault", get(faults))
        .route("/fault/disk", post(fault_disk))
        .route("/fault/dependency", post(fault_dependency))
        .route("/fault/brownout", post(fault_brownout))
        .route("/fault/flap", post(fault_flap))
        .route("/fault/freeze", post(fault_freeze))
        .route("/fault/cache/clear", post(fault_cache_clear))
        .route("/fault/post-errors", post(fault_post_errors))
        .route("/fault/reset", post(fault_reset))
        .with_state(state)
        .layer(axum::middleware::from_fn(
            move |req, next: axum::middleware::Next| {
                let guard = in_flight.enter();
                async move {
                    let response = next.run(req).await;
                    drop(guard);
                    response
                }
            },
        ));
    // Health paths bypass the limit and are answered by vigil on this port too.
    let app = match admission {
        Some(a) => app.layer(health.admission_layer(a)),
        None => app.layer(shed),
    };
    // Added after the layer, so outside it: a scrape is never refused or queued, and
    // the figures of an overload are there while it lasts.
    let app = app.route(
        "/metrics",
        get(move |headers: axum::http::HeaderMap| {
            let registry = registry.clone();
            async move {
                let accept = headers
                    .get(axum::http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok());
                let (ctype, body) = vigil::metrics::encode(&registry, accept);
                ([(axum::http::header::CONTENT_TYPE, ctype)], body)
            }
        }),
    );

    let reserved = health.serve_reserved(config.health_listen)?;
    let agent = match config.agent_listen {
        Some(addr) => {
            let agent = vigil::agent::AgentCheck::new(&health).serve_reserved(addr)?;
            tracing::info!(addr = %agent.local_addr(), "HAProxy agent-check responder");
            Some(agent)
        }
        None => None,
    };
    let grpc = match config.grpc_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            let addr = listener.local_addr()?;
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let server = vigil::grpc::GrpcHealth::new(&health).serve(listener, async {
                let _ = stopped.await;
            });
            tracing::info!(%addr, "gRPC health v1 server");
            Some((addr, stop, tokio::spawn(server)))
        }
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let app_addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let drain = {
        let health = health.clone();
        async move {
            tokio::select! {
                _ = vigil::shutdown_signal() => {}
                _ = stop_rx => tracing::info!("stop requested"),
            }
            health.drain().await;
        }
    };
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(drain)
            .await
    });
    tracing::info!(app = %app_addr, health = %reserved.local_addr(), store = store.kind(), "example service listening");
    Ok(Running {
        app_addr,
        health_addr: reserved.local_addr(),
        health,
        store_kind: store.kind(),
        store_fallback: store.fallback_reason().map(str::to_string),
        agent_addr: agent.as_ref().map(|a| a.local_addr()),
        grpc_addr: grpc.as_ref().map(|g| g.0),
        grpc: grpc.map(|(_, stop, task)| (stop, task)),
        stop: Some(stop_tx),
        server,
        reserved,
        agent,
    })
}

// === handlers ===

async fn index() -> &'static str {
    "vigil example service\n\
     GET  /items/{id}            a read (database within its budget, else cache)\n\
     POST /orders                a write that stores nothing (201)\n\
     GET  /metrics               Prometheus metrics of the health machinery\n\
     GET  /work?ms=N             N ms of CPU on the application runtime\n\
     GET  /naive/livez           a liveness endpoint on the application runtime (for comparison)\n\
     GET  /livez /readyz /health vigil's endpoints (also on the reserved health port)\n\
     GET  /fault                 current faults\n\
     POST /fault/disk?on=true    the disk check demands 100% free space\n\
     POST /fault/dependency?on=true  the database is unreachable (closed port)\n\
     POST /fault/brownout?ms=N   every query takes N ms longer (pg_sleep)\n\
     POST /fault/flap?on=true&period_ms=N  the database goes up and down\n\
     POST /fault/freeze?ms=N     every application worker blocks for N ms\n\
     POST /fault/cache/clear     empty the read cache\n\
     POST /fault/post-errors?percent=P  P% of POST /orders answer 500 (health still passes)\n\
     POST /fault/reset           clear every fault\n"
}

fn served(item: Item, from: &'static str, degraded: Option<&str>) -> Response {
    let mut body = serde_json::json!({
        "id": item.id, "name": item.name, "price_cents": item.price_cents, "served_from": from,
    });
    if let Some(why) = degraded {
        body["degraded"] = why.into();
    }
    let mut r = axum::Json(body).into_response();
    r.headers_mut()
        .insert("x-served-from", HeaderValue::from_static(from));
    r
}

/// A read: from the database through the guard, within the read budget or what the
/// caller's deadline leaves; from the cache when the read failed, ran out of time, or the
/// breaker is open (marked `"degraded"` with the reason).
async fn item(
    State(st): State<Arc<AppState>>,
    Path(id): Path<i64>,
    headers: axum::http::HeaderMap,
) -> Response {
    let now = tokio::time::Instant::now();
    let limit = vigil::admission::headers_deadline(&headers, now).map_or(Duration::MAX, |d| {
        d.saturating_duration_since(now)
            .saturating_sub(DEADLINE_MARGIN)
    });
    let why = if limit.is_zero() {
        // No time for the database: answer what can be answered now.
        "no time left for the database"
    } else {
        match st.guard.call_within(limit, st.store.get(id)).await {
            Guarded::Ok(Some(item)) => {
                st.cache.put(item.clone());
                return served(item, "database", None);
            }
            Guarded::Ok(None) => return (StatusCode::NOT_FOUND, "no such item\n").into_response(),
            Guarded::Failed(e) => {
                tracing::debug!(error = %e, id, "read failed; trying the cache");
                "the read failed"
            }
            Guarded::Degraded(Degraded::TimedOut) => {
                st.store.abandon_reads();
                "the read ran out of time"
            }
            Guarded::Degraded(Degraded::Open) => "the breaker is open",
        }
    };
    match st.cache.get(id) {
        Some(item) => served(item, "cache", Some(why)),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database unavailable ({why}) and item {id} not cached\n"),
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
struct Ms {
    ms: Option<u64>,
}

fn bounded(ms: Option<u64>, default: u64) -> Duration {
    Duration::from_millis(ms.unwrap_or(default)).min(MAX_BUSY)
}

/// Burns CPU on the worker that polls it, without yielding: what a CPU-bound handler
/// (JSON of a huge document, a regex, a hash) does to an async runtime.
async fn work(Query(q): Query<Ms>) -> String {
    let want = bounded(q.ms, 10);
    let started = Instant::now();
    let mut x: u64 = 0;
    while started.elapsed() < want {
        for i in 0..1000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    format!("worked {} ms\n", want.as_millis())
}

/// What many services do: a liveness route on the application's own runtime. It queues
/// behind every busy worker.
async fn naive_livez() -> &'static str {
    "ok"
}

#[derive(Deserialize)]
struct On {
    on: Option<bool>,
    period_ms: Option<u64>,
}

async fn faults(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(serde_json::json!({
        "disk": st.disk_fault.load(Ordering::SeqCst),
        "dependency": st.store.is_down(),
        "brownout_ms": st.store.brownout().as_millis() as u64,
        "flap": st.flap.lock().unwrap_or_else(|e| e.into_inner()).is_some(),
        "cached_items": st.cache.len(),
        "database_up": st.db_up.load(Ordering::SeqCst),
        "read_breaker": st.guard.state().name(),
        "post_errors_percent": f64::from(st.post_errors.load(Ordering::SeqCst)) / 100.0,
        "store": st.store.kind(),
    }))
    .into_response()
}

async fn fault_disk(State(st): State<Arc<AppState>>, Query(q): Query<On>) -> String {
    let on = q.on.unwrap_or(true);
    st.disk_fault.store(on, Ordering::SeqCst);
    tracing::warn!(on, "fault: disk");
    format!("disk fault {}\n", if on { "on" } else { "off" })
}

async fn fault_dependency(State(st): State<Arc<AppState>>, Query(q): Query<On>) -> String {
    let on = q.on.unwrap_or(true);
    stop_flap(&st);
    st.store.set_down(on).await;
    tracing::warn!(on, "fault: dependency");
    format!("dependency fault {}\n", if on { "on" } else { "off" })
}

async fn fault_brownout(State(st): State<Arc<AppState>>, Query(q): Query<Ms>) -> String {
    let latency = bounded(q.ms, 0);
    st.store.set_brownout(latency);
    tracing::warn!(ms = latency.as_millis() as u64, "fault: brownout");
    format!("brownout {} ms\n", latency.as_millis())
}

fn stop_flap(st: &AppState) {
    if let Some(h) = st.flap.lock().unwrap_or_else(|e| e.into_inner()).take() {
        h.abort();
    }
}

async fn fault_flap(State(st): State<Arc<AppState>>, Query(q): Query<On>) -> String {
    let on = q.on.unwrap_or(true);
    stop_flap(&st);
    if !on {
        st.store.set_down(false).await;
        return "flap off\n".into();
    }
    let period = q
        .period_ms
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_FLAP_PERIOD)
        .max(Duration::from_millis(10));
    let store = st.store.clone();
    let task = tokio::spawn(async move {
        let mut down = false;
        loop {
            down = !down;
            store.set_down(down).await;
            tokio::time::sleep(period).await;
        }
    });
    *st.flap.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
    tracing::warn!(period_ms = period.as_millis() as u64, "fault: flap");
    format!("flap every {} ms\n", period.as_millis())
}

/// Blocks every application worker (a `std::thread::sleep` in async code, a deadlock):
/// the reserved listener keeps answering `/livez`, the naive one does not, and if it
/// lasts past the watchdog's staleness `/readyz` says the health checker stalled.
async fn fault_freeze(State(st): State<Arc<AppState>>, Query(q): Query<Ms>) -> Response {
    let pause = bounded(q.ms, 5000);
    for _ in 0..st.workers {
        tokio::spawn(async move { std::thread::sleep(pause) });
    }
    tracing::warn!(ms = pause.as_millis() as u64, "fault: freeze");
    (
        StatusCode::ACCEPTED,
        format!(
            "freezing {} workers for {} ms\n",
            st.workers,
            pause.as_millis()
        ),
    )
        .into_response()
}

/// A write: answers 201 and stores nothing, or 500 under the POST fault, on an even
/// share of POSTs (the n-th POST fails when `n * rate` crosses a whole number), while
/// every health check still passes: the bad revision only its clients can see.
async fn order(State(st): State<Arc<AppState>>) -> Response {
    let n = st.posts.fetch_add(1, Ordering::Relaxed);
    let per_10k = u64::from(st.post_errors.load(Ordering::Relaxed));
    if (n + 1) * per_10k / 10_000 > n * per_10k / 10_000 {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "order failed (fault injected: /fault/post-errors)\n",
        )
            .into_response();
    }
    (
        StatusCode::CREATED,
        axum::Json(serde_json::json!({ "order": n })),
    )
        .into_response()
}

#[derive(Deserialize)]
struct Percent {
    percent: Option<f64>,
}

async fn fault_post_errors(State(st): State<Arc<AppState>>, Query(q): Query<Percent>) -> Response {
    let percent = q.percent.unwrap_or(5.0);
    if !(0.0..=100.0).contains(&percent) {
        return (
            StatusCode::BAD_REQUEST,
            format!("percent={percent}: must be in 0..100\n"),
        )
            .into_response();
    }
    st.post_errors
        .store((percent * 100.0).round() as u32, Ordering::SeqCst);
    tracing::warn!(percent, "fault: POST errors");
    format!("{percent}% of POSTs answer 500\n").into_response()
}

async fn fault_cache_clear(State(st): State<Arc<AppState>>) -> String {
    let n = st.cache.len();
    st.cache.clear();
    tracing::warn!(items = n, "fault: cache cleared");
    format!("cleared {n} cached items\n")
}

async fn fault_reset(State(st): State<Arc<AppState>>) -> String {
    stop_flap(&st);
    st.disk_fault.store(false, Ordering::SeqCst);
    st.post_errors.store(0, Ordering::SeqCst);
    st.store.set_down(false).await;
    st.store.set_brownout(Duration::ZERO);
    tracing::warn!("faults reset");
    "faults reset\n".into()
}
