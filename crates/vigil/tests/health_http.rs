//! The library's contracts over real loopback HTTP: endpoints, hung dependencies, the
//! watchdog, lifecycle, `?exclude`, the shed layer and the reserved listener.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vigil::{
    CheckResult, CheckerFault, FnCheck, Health, HealthConfig, HealthReport, Lifecycle, Status,
};

fn pass_check() -> FnCheck<impl Fn() -> std::future::Ready<CheckResult> + Send + Sync> {
    FnCheck::new(|| std::future::ready(vigil::check::pass()))
}

/// A check that passes while `up` is true and fails with `why` otherwise.
fn switch_check(
    up: Arc<AtomicBool>,
    why: &'static str,
) -> FnCheck<impl Fn() -> std::future::Ready<CheckResult> + Send + Sync> {
    FnCheck::new(move || {
        std::future::ready(if up.load(Ordering::SeqCst) {
            vigil::check::pass()
        } else {
            CheckResult::fail(why)
        })
    })
}

/// Everything a test looks at in one answer.
struct Answer {
    status: u16,
    content_type: String,
    cache_control: String,
    body: String,
}

impl Answer {
    fn report(&self) -> HealthReport {
        HealthReport::parse(self.body.as_bytes())
            .unwrap_or_else(|e| panic!("not health+json ({e}): {}", self.body))
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

async fn get(addr: SocketAddr, path: &str) -> Answer {
    let r = client()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let header = |n: &str| {
        r.headers()
            .get(n)
            .map(|v| v.to_str().unwrap_or("").to_string())
            .unwrap_or_default()
    };
    Answer {
        status: r.status().as_u16(),
        content_type: header("content-type"),
        cache_control: header("cache-control"),
        body: r.text().await.expect("body"),
    }
}

/// Polls `path` until `pred` holds, panicking with the last answer after `within`.
async fn until(
    addr: SocketAddr,
    path: &str,
    within: Duration,
    what: &str,
    pred: impl Fn(&Answer) -> bool,
) -> Answer {
    let deadline = Instant::now() + within;
    loop {
        let a = get(addr, path).await;
        if pred(&a) {
            return a;
        }
        if Instant::now() > deadline {
            panic!(
                "{what}: not seen within {within:?}; last answer {} {}",
                a.status, a.body
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn reserved(health: &Health) -> vigil::ReservedServer {
    health
        .serve_reserved("127.0.0.1:0".parse().unwrap())
        .expect("bind reserved listener")
}

// === the reserved thread ===

/// The reserved thread asks for the shortest scheduler turn (100 us) so that a probe
/// waking it takes the CPU from busy application threads at once; the test's own
/// threads keep the kernel's. Skipped on a kernel without the setting (before 6.12).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserved_thread_runs_on_short_scheduler_turns() {
    let Ok(Some(default)) = vigil_sys::thread_slice() else {
        eprintln!("skipped: this kernel has no scheduler slice setting (Linux 6.12 and later)");
        return;
    };
    let health = Health::builder().config(fast_config()).start();
    let srv = reserved(&health);
    assert_eq!(get(srv.local_addr(), "/livez").await.status, 200);
    let mut reserved_threads = Vec::new();
    for t in vigil_testkit::thread_slices(std::process::id()) {
        if t.name == "vigil-health" {
            reserved_threads.push(t.slice);
        } else {
            assert_eq!(t.slice, Some(default), "{} keeps the kernel's turn", t.name);
        }
    }
    assert!(
        !reserved_threads.is_empty(),
        "the reserved thread is running"
    );
    assert!(
        reserved_threads
            .iter()
            .all(|s| *s == Some(Duration::from_micros(100))),
        "{reserved_threads:?}"
    );
}

// === endpoints ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_speak_health_json_with_no_store_and_the_right_codes() {
    let health = Health::builder()
        .config(fast_config())
        .local("disk:free", pass_check(), every(100))
        .dependency(
            "cache:ping",
            FnCheck::new(|| async { CheckResult::fail("cache down") }),
            every(100).non_critical(),
        )
        .version("1.2.3")
        .start();
    let srv = reserved(&health);
    let addr = srv.local_addr();

    let live = get(addr, "/livez").await;
    assert_eq!((live.status, live.body.as_str()), (200, "ok"));
    assert_eq!(live.cache_control, "no-store");

    let ready = until(addr, "/readyz", Duration::from_secs(10), "ready", |a| {
        a.status == 200
    })
    .await;
    assert_eq!(ready.content_type, "application/health+json");
    assert_eq!(
        ready.cache_control, "no-store",
        "health answers must not be cached"
    );
    let r = ready.report();
    assert_eq!(r.status, Status::Pass);
    assert!(r.checks.contains_key("disk:free"));
    assert!(
        !r.checks.contains_key("cache:ping"),
        "a dependency must not count for readiness"
    );
    let healthz = get(addr, "/healthz").await;
    assert_eq!(healthz.status, 200, "/healthz is an alias of /readyz");

    let full = get(addr, "/health").await;
    assert_eq!(
        full.status, 200,
        "warn (a non-critical failure) still answers 200"
    );
    let r = full.report();
    assert_eq!(r.status, Status::Warn);
    assert_eq!(r.version.as_deref(), Some("1.2.3"));
    assert_eq!(
        r.checks["cache:ping"][0].output.as_deref(),
        Some("cache down")
    );
    assert!(
        r.checks["cache:ping"][0].time.is_none(),
        "compact body has no times"
    );

    let verbose = get(addr, "/health?verbose").await;
    let r = verbose.report();
    assert!(verbose.body.contains("\n  "), "verbose is pretty-printed");
    assert!(
        r.checks["cache:ping"][0].time.is_some(),
        "verbose has the check's time"
    );
    assert!(r.checks["cache:ping"][0].duration.is_some());
    assert_eq!(
        r.checks["watchdog:restarts"][0].observed_value,
        Some(0.into())
    );
    srv.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critical_dependency_failure_fails_health_but_not_readiness() {
    let up = Arc::new(AtomicBool::new(true));
    let health = Health::builder()
        .config(fast_config())
        .dependency(
            "postgres:connect",
            switch_check(up.clone(), "refused"),
            every(50),
        )
        .start();
    let srv = reserved(&health);
    let addr = srv.local_addr();
    until(
        addr,
        "/health",
        Duration::from_secs(10),
        "health passes",
        |a| a.status == 200,
    )
    .await;
    up.store(false, Ordering::SeqCst);
    let a = until(
        addr,
        "/health",
        Duration::from_secs(10),
        "health fails",
        |a| a.status == 503,
    )
    .await;
    assert_eq!(
        a.report().failing_checks().collect::<Vec<_>>(),
        ["postgres:connect"]
    );
    assert_eq!(
        get(addr, "/readyz").await.status,
        200,
        "a dependency outage must not fail readiness"
    );
    up.store(true, Ordering::SeqCst);
    until(
        addr,
        "/health",
        Duration::from_secs(10),
        "health recovers",
        |a| a.status == 200,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_dependency_is_cut_at_its_timeout_while_health_answers_fast() {
    let health = Health::builder()
        .config(fast_config())
        .local("disk:free", pass_check(), every(100))
        .dependency(
            "db:query",
            FnCheck::new(|| async {
                std::future::pending::<()>().await;
                vigil::check::pass()
            }),
            every(500).timeout(Duration::from_millis(300)),
        )
        .start();
    let srv = reserved(&health);
    let addr = srv.local_addr();
    // While the check hangs, /health answers at once (it reads the snapshot).
    for _ in 0..20 {
        let t = Instant::now();
        let a = get(addr, "/health").await;
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "/health took {:?} while a dependency hangs",
            t.elapsed()
        );
        assert_eq!(a.content_type, "application/health+json");
    }
    let a = until(
        addr,
        "/health",
        Duration::from_secs(10),
        "hung check reported",
        |a| a.body.contains("timed out after 300ms"),
    )
    .await;
    assert_eq!(a.status, 503);
    let r = a.report();
    assert_eq!(r.checks["db:query"][0].status, Status::Fail);
    assert_eq!(
        r.checks["db:query"][0].output.as_deref(),
        Some("timed out after 300ms"),
        "the reason must say the check was cut at its timeout"
    );
    assert_eq!(
        r.checks["disk:free"][0].status,
        Status::Pass,
        "other checks keep running"
    );
    assert_eq!(get(addr, "/readyz").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_never_call_a_check_while_serving() {
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    let health = Health::builder()
        .config(fast_config())
        .dependency(
            "db:ping",
            FnCheck::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
                std::future::ready(vigil::check::pass())
            }),
            // Runs once now, then not for an hour.
            every(3_600_000),
        )
        .start();
    let srv = reserved(&health);
    let addr = srv.local_addr();
    until(addr, "/health", Duration::from_secs(10), "first run", |a| {
        a.status == 200
    })
    .await;
    for path in ["/health", "/readyz", "/health?verbose", "/livez"].repeat(50) {
        get(addr, path).await;
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "200 requests must not run the check: endpoints read the snapshot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclude_leaves_a_check_out_of_body_and_status() {
    let health = Health::builder()
        .config(fast_config())
        .local("disk:free", pass_check(), every(100))
        .local(
            "mem:rss",
            FnCheck::new(|| async { CheckResult::fail("rss over limit") }),
            every(100).gates_startup(false),
        )
        .dependency(
            "postgres:connect",
            FnCheck::new(|| async { CheckResult::fail("refused") }),
            every(100),
        )
        .start();
    let srv = reserved(&health);
    let addr = srv.local_addr();
    until(
        addr,
        "/readyz?exclude=mem:rss",
        Duration::from_secs(10),
        "ready without mem",
        |a| a.status == 200,
    )
    .await;
    assert_eq!(get(addr, "/readyz").await.status, 503);
    let a = get(addr, "/health?exclude=mem:rss").await;
    assert_eq!(a.status, 503, "postgres still fails");
    assert!(
        !a.body.contains("mem:rss"),
        "excluded check must leave the body: {}",
        a.body
    );
    // By component, comma-separated, and repeated.
    assert_eq!(get(addr, "/health?exclude=mem,postgres").await.status, 200);
    assert_eq!(
        get(addr, "/health?exclude=mem&exclude=postgres%3Aconnect")
            .await
            .status,
        200
    );
    assert_eq!(get(addr, "/health?exclude=nothing").await.status, 503);
}

/// The health+json draft: `componentType` on every entry, `output` only when not
/// passing; in the compact answer and in `?verbose`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_json_entries_have_component_type_and_no_output_when_passing() {
    let health = Health::builder()
        .config(fast_config())
        .local(
            "disk:free",
            FnCheck::new(|| async {
                CheckResult::new(Status::Pass).with_output("12 GiB free, plenty")
            }),
            every(100),
        )
        .dependency(
            "postgres:connect",
            FnCheck::new(|| async { CheckResult::fail("refused") }),
            every(100).non_critical(),
        )
        .start();
    let srv = reserved(&health);
    let addr = srv.local_addr();
    until(addr, "/health", Duration::from_secs(10), "checked", |a| {
        a.body.contains("refused")
    })
    .await;
    for path in ["/health", "/health?verbose", "/readyz"] {
        let a = get(addr, path).await;
        let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
        for (name, entries) in v["checks"].as_object().unwrap() {
            for e in entries.as_array().unwrap() {
                assert!(
                    e["componentType"].is_string(),
                    "{path}: {name} has no componentType: {e}"
                );
                if e["status"] == "pass" {
                    assert!(
                        e.get("output").is_none(),
                        "{path}: {name} passes and must have no output: {e}"
                    );
                }
            }
        }
        if path.starts_with("/health") {
            assert_eq!(
                v["checks"]["postgres:connect"][0]["output"], "refused",
                "{path}: a failing entry keeps its output"
            );
        }
    }
}

// === watchdog ===

async fn watchdog_recovers_from(fault: CheckerFault) {
    let health = Health::builder()
        .config(fast_config())
        .local("disk:free", pass_check(), every(100))
        .start();
    let srv = reserved(&health);
    let addr = srv.local_addr();
    until(addr, "/readyz", Duration::from_secs(10), "ready", |a| {
        a.status == 200
    })
    .await;
    health.inject_fault(fault);
    let stalled = until(
        addr,
        "/readyz",
        Duration::from_secs(10),
        "stall reported",
        |a| a.status == 503,
    )
    .await;
    let r = stalled.report();
    assert_eq!(
        r.output.as_deref(),
        Some("health checker stalled"),
        "{fault:?}: {}",
        stalled.body
    );
    for q in ["watchdog", "watchdog:restarts", "watchdog,disk"] {
        let a = get(addr, &format!("/readyz?exclude={q}")).await;
        assert_eq!(
            (a.status, a.report().output.as_deref()),
            (503, Some("health checker stalled")),
            "{fault:?}: ?exclude={q} must not hide a stalled checker: {}",
            a.body
        );
    }
    assert!(
        r.checks["watchdog:restarts"][0]
            .output
            .as_deref()
            .unwrap_or("")
            .starts_with("health checker stalled")
    );
    assert_eq!(
        get(addr, "/health").await.status,
        503,
        "stale dependency results fail /health too"
    );
    let back = until(
        addr,
        "/readyz?verbose",
        Duration::from_secs(10),
        "recovery",
        |a| a.status == 200,
    )
    .await;
    let r = back.report();
    assert_eq!(
        r.checks["watchdog:restarts"][0].observed_value,
        Some(1.into()),
        "the restart must be counted and reported"
    );
    assert_eq!(health.restarts(), 1);
    // And the restarted checker really checks: results keep getting fresh.
    let before = health.snapshot().sequence;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        health.snapshot().sequence > before,
        "restarted checker must publish"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_restarts_a_panicked_checker() {
    watchdog_recovers_from(CheckerFault::Panic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_restarts_a_killed_checker() {
    watchdog_recovers_from(CheckerFault::Abort).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_restarts_a_hung_checker_after_its_staleness() {
    watchdog_recovers_from(CheckerFault::Hang).await;
}

// === lifecycle ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_while_starting_until_startup_checks_passed_once() {
    let warm = Arc::new(AtomicBool::new(false));
    let health = Health::builder()
        .config(fast_config())
        .local(
            "cache:warm",
            switch_check(warm.clone(), "warming"),
            every(50),
        )
        .start();
    let srv = reserved(&health);
    let addr = srv.local_addr();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = get(addr, "/readyz").await;
    assert_eq!(a.status, 503, "not ready while starting");
    assert_eq!(a.report().output.as_deref(), Some("starting"));
    assert_eq!(health.lifecycle(), Lifecycle::Starting);
    assert_eq!(
        get(addr, "/livez").await.status,
        200,
        "alive while starting"
    );
    warm.store(true, Ordering::SeqCst);
    until(
        addr,
        "/readyz",
        Duration::from_secs(10),
        "ready once started",
        |a| a.status == 200,
    )
    .await;
    assert_eq!(health.lifecycle(), Lifecycle::Running);
    // After start-up, a failing local check fails readiness for its own reason.
    warm.store(false, Ordering::SeqCst);
    let a = until(
        addr,
        "/readyz",
        Duration::from_secs(10),
        "check failure",
        |a| a.status == 503,
    )
    .await;
    assert_eq!(a.report().output.as_deref(), Some("cache:warm fail"));
    assert_eq!(
        health.lifecycle(),
        Lifecycle::Running,
        "start-up happens once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_shutdown_fails_readiness_at_once_and_keeps_liveness() {
    let health = Health::builder()
        .config(fast_config())
        .local("disk:free", pass_check(), every(100))
        .start();
    let srv = reserved(&health);
    let addr = srv.local_addr();
    until(addr, "/readyz", Duration::from_secs(10), "ready", |a| {
        a.status == 200
    })
    .await;
    let mut sub = health.subscribe();
    health.begin_shutdown();
    // No polling: the snapshot is republished synchronously.
    let a = get(addr, "/readyz").await;
    assert_eq!(a.status, 503);
    assert_eq!(a.report().output.as_deref(), Some("shutting down"));
    for q in ["lifecycle", "lifecycle:state", "lifecycle,disk"] {
        let a = get(addr, &format!("/readyz?exclude={q}")).await;
        assert_eq!(
            a.status, 503,
            "?exclude={q} must not hide that the service is draining: {}",
            a.body
        );
        assert!(a.body.contains("lifecycle:state"), "{}", a.body);
    }
    assert_eq!(
        sub.borrow_and_update().lifecycle,
        Lifecycle::ShuttingDown,
        "subscribers see it"
    );
    assert_eq!(get(addr, "/livez").await.status, 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        get(addr, "/readyz").await.status,
        503,
        "the checker must not undo shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_fails_readiness_before_the_service_stops_listening() {
    // Install tokio's SIGTERM handler before raising the signal, so the process survives.
    let _hold = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    let health = Health::builder()
        .config(HealthConfig {
            drain_delay: Duration::from_millis(800),
            ..fast_config()
        })
        .local("disk:free", pass_check(), every(100))
        .start();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "app" }))
        .merge(health.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(health.clone().shutdown_on_signal())
            .into_future(),
    );
    until(addr, "/readyz", Duration::from_secs(10), "ready", |a| {
        a.status == 200
    })
    .await;
    let t0 = Instant::now();
    rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::TERM)
        .expect("raise SIGTERM");
    let a = until(
        addr,
        "/readyz",
        Duration::from_secs(5),
        "readiness fails on SIGTERM",
        |a| a.status == 503,
    )
    .await;
    assert_eq!(a.report().output.as_deref(), Some("shutting down"));
    assert_eq!(
        get(addr, "/").await.status,
        200,
        "still serving during the drain delay"
    );
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server stops after the drain delay")
        .unwrap()
        .unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(800),
        "stopped before the drain delay"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener must be closed after the drain"
    );
}

use std::future::IntoFuture;

mod support;
use support::{every, fast_config};

// === shed layer ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shed_layer_sheds_app_requests_over_the_limit_but_serves_health() {
    let health = Health::builder()
        .config(fast_config())
        .local("disk:free", pass_check(), every(100))
        .start();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let layer = health.shed_layer(2);
    let stats = layer.stats();
    let app = axum::Router::new()
        .route(
            "/slow",
            axum::routing::get(move || {
                let g = g.clone();
                async move {
                    let _p = g.acquire().await.expect("gate");
                    "done"
                }
            }),
        )
        .route("/fast", axum::routing::get(|| async { "fast" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(axum::serve(listener, app).into_future());
    until(addr, "/readyz", Duration::from_secs(10), "ready", |a| {
        a.status == 200
    })
    .await;

    let held: Vec<_> = (0..2).map(|_| tokio::spawn(get(addr, "/slow"))).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats.in_flight() < 2 {
        assert!(Instant::now() < deadline, "two slow requests never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = Instant::now();
    let shed = get(addr, "/fast").await;
    assert_eq!(shed.status, 503, "over the limit: shed, not queued");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "shedding must be immediate"
    );
    assert_eq!(stats.shed_total(), 1);
    for path in ["/livez", "/readyz", "/health"] {
        assert_eq!(
            get(addr, path).await.status,
            200,
            "{path} must bypass the limit"
        );
    }
    gate.add_permits(2);
    for h in held {
        assert_eq!(h.await.unwrap().body, "done");
    }
    assert_eq!(get(addr, "/fast").await.body, "fast", "capacity is back");
    assert_eq!(stats.in_flight(), 0);
    server.abort();
}

// === reserved listener ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_listener_reports_a_taken_port_and_stops_on_shutdown() {
    let health = Health::builder().config(fast_config()).start();
    let srv = reserved(&health);
    let addr = srv.local_addr();
    let err = health.serve_reserved(addr).unwrap_err();
    assert_eq!(
        err.kind(),
        std::io::ErrorKind::AddrInUse,
        "the bind error goes to the caller"
    );
    assert_eq!(get(addr, "/livez").await.status, 200);
    tokio::task::spawn_blocking(move || srv.shutdown())
        .await
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "a shut down reserved listener must refuse connections"
    );
}

/// A blocking HTTP/1.1 GET with its own timeout, from the test's own thread: the probe
/// must not depend on the runtime it is trying to prove saturated.
fn blocking_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(String, Duration), String> {
    use std::io::{Read, Write};
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok((out, t.elapsed()))
}

#[test]
fn heavy_livez_on_the_reserved_listener_answers_while_every_app_worker_is_busy() {
    const WORKERS: usize = 2;
    let app_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .unwrap();
    let health = app_rt.block_on(async {
        Health::builder()
            .local("disk:free", pass_check(), every(100))
            .start()
    });
    let srv = reserved(&health);
    // A naive /livez on the application's runtime, for contrast.
    let naive_addr = app_rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(axum::serve(l, health.router()).into_future());
        a
    });
    assert!(blocking_get(naive_addr, "/livez", Duration::from_secs(5)).is_ok());

    // Occupy every worker: blocking sleeps hold a worker as CPU-bound work would,
    // without loading the machine.
    let busy_for = Duration::from_secs(4);
    let started = Arc::new(AtomicU64::new(0));
    for _ in 0..WORKERS * 4 {
        let s = started.clone();
        app_rt.spawn(async move {
            s.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(busy_for);
        });
    }
    let t0 = Instant::now();
    while started.load(Ordering::SeqCst) < WORKERS as u64 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let naive = blocking_get(naive_addr, "/livez", Duration::from_millis(1500));
    let (resp, took) = blocking_get(srv.local_addr(), "/livez", Duration::from_secs(3))
        .expect("reserved /livez must answer while the app runtime is saturated");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    // Figures for the report (`--no-capture` shows them).
    eprintln!(
        "reserved /livez under saturation: {took:?}; naive same-runtime /livez: {:?}",
        naive.as_ref().map(|(_, d)| *d)
    );
    assert!(
        t0.elapsed() < busy_for,
        "the probes must have run while the workers were still busy"
    );
    assert!(
        took < Duration::from_secs(1),
        "reserved /livez took {took:?} under saturation"
    );
    assert!(
        naive.is_err() || naive.as_ref().unwrap().1 >= Duration::from_secs(1),
        "the naive endpoint answered in {naive:?}: the runtime was not saturated, the test proves nothing"
    );
    srv.shutdown();
    app_rt.shutdown_background();
}
