//! The admission layer over real loopback HTTP (an axum server using
//! `Health::admission_layer`, reqwest as the client): expired work refused before the
//! handler runs, health paths never refused, the adaptive limit cutting in on slow
//! answers, and its metrics as Prometheus' promtool reads them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vigil::admission::{ConcurrencyLimitConfig, DEADLINE_HEADER};
use vigil::guard::BreakerConfig;
use vigil::{Admission, AdmissionConfig, DependencyGuard, FnCheck, Health};

mod support;
use support::{every, fast_config};

/// A limit fixed at `n` (initial = min = max).
fn fixed(n: u32) -> AdmissionConfig {
    AdmissionConfig {
        limit: ConcurrencyLimitConfig {
            initial: n,
            min: n,
            max: n,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// What the application handler saw.
#[derive(Default)]
struct Handler {
    /// Requests that reached the handler.
    entered: AtomicU64,
    /// Running now, and the most at once.
    running: AtomicU64,
    peak: AtomicU64,
    /// How long each answer takes, in ms.
    delay_ms: AtomicU64,
    /// While set, answers wait for `release` instead.
    hold: AtomicBool,
    release: tokio::sync::Notify,
}

/// A service: `/work` under the admission layer (counted by `Handler`), `/metrics`, and
/// vigil's health paths; its address.
async fn serve(
    admission: Arc<Admission>,
    handler: Arc<Handler>,
    guard: Option<Arc<DependencyGuard>>,
) -> (SocketAddr, Health) {
    let health = Health::builder()
        .config(fast_config())
        .local(
            "disk:free",
            FnCheck::new(|| std::future::ready(vigil::check::pass())),
            every(100),
        )
        .local("admission:requests", admission.check(), every(50))
        .start();
    let mut registry = prometheus_client::registry::Registry::default();
    let mut collector =
        vigil::metrics::HealthCollector::new(&health).with_admission(admission.clone());
    if let Some(g) = guard {
        collector = collector.with_guard(g);
    }
    collector.register(&mut registry);
    let registry = Arc::new(registry);
    let h = handler.clone();
    let app = axum::Router::new()
        .route(
            "/work",
            axum::routing::get(move || {
                let h = h.clone();
                async move {
                    h.entered.fetch_add(1, Ordering::SeqCst);
                    let now = h.running.fetch_add(1, Ordering::SeqCst) + 1;
                    h.peak.fetch_max(now, Ordering::SeqCst);
                    if h.hold.load(Ordering::SeqCst) {
                        h.release.notified().await;
                    } else {
                        let ms = h.delay_ms.load(Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    h.running.fetch_sub(1, Ordering::SeqCst);
                    "done"
                }
            }),
        )
        .route(
            "/metrics",
            axum::routing::get(move || {
                let registry = registry.clone();
                async move { vigil::metrics::encode(&registry, None).1 }
            }),
        )
        .layer(health.admission_layer(admission));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, health)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(64)
        .build()
        .unwrap()
}

struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

async fn get(c: &reqwest::Client, addr: SocketAddr, path: &str, fields: &[(&str, &str)]) -> Answer {
    let mut req = c.get(format!("http://{addr}{path}"));
    for (k, v) in fields {
        req = req.header(*k, *v);
    }
    let r = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    Answer {
        status: r.status().as_u16(),
        retry_after: r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string()),
        body: r.text().await.unwrap(),
    }
}

/// Polls `cond` every 10 ms for at most `within`.
async fn until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_deadline_is_refused_with_retry_after_and_the_handler_never_runs() {
    let admission = Admission::new(AdmissionConfig::default());
    let handler = Arc::new(Handler::default());
    let (addr, _health) = serve(admission.clone(), handler.clone(), None).await;
    let c = client();
    for fields in [
        [(DEADLINE_HEADER, "0")],
        // gRPC's form of the same: no time left.
        [("grpc-timeout", "0m")],
    ] {
        let a = get(&c, addr, "/work", &fields).await;
        assert_eq!(a.status, 503, "{fields:?}: refused, not run: {}", a.body);
        assert_eq!(
            a.retry_after.as_deref(),
            Some("1"),
            "a refusal says when to come back"
        );
        assert!(a.body.contains("expired"), "{}", a.body);
    }
    assert_eq!(
        handler.entered.load(Ordering::SeqCst),
        0,
        "expired work must never reach the handler"
    );
    assert_eq!(admission.refused("expired"), 2);
    // Time left, or no deadline at all: served.
    assert_eq!(
        get(&c, addr, "/work", &[(DEADLINE_HEADER, "5000")])
            .await
            .status,
        200
    );
    assert_eq!(get(&c, addr, "/work", &[]).await.status, 200);
    assert_eq!(handler.entered.load(Ordering::SeqCst), 2);
    assert_eq!(admission.admitted_total(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_paths_are_never_refused_while_the_limit_is_full() {
    let admission = Admission::new(fixed(2));
    let handler = Arc::new(Handler::default());
    handler.hold.store(true, Ordering::SeqCst);
    let (addr, _health) = serve(admission.clone(), handler.clone(), None).await;
    let c = client();
    let held: Vec<_> = (0..2)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { get(&c, addr, "/work", &[]).await.status })
        })
        .collect();
    until(Duration::from_secs(10), "two held requests running", || {
        admission.in_flight() == 2
    })
    .await;
    // Over the limit: it queues, then is refused at the queue-time bound (100 ms).
    let a = get(&c, addr, "/work", &[]).await;
    assert_eq!(a.status, 503, "over a full limit: refused: {}", a.body);
    assert!(a.body.contains("queue_time"), "{}", a.body);
    for path in ["/livez", "/readyz", "/healthz", "/health"] {
        for fields in [&[][..], &[(DEADLINE_HEADER, "0")][..]] {
            let a = get(&c, addr, path, fields).await;
            assert_eq!(
                a.status, 200,
                "{path} {fields:?} must bypass the admission layer: {}",
                a.body
            );
        }
    }
    // The refusal shows as a warn in /readyz, which stays 200: overload is no fault.
    let mut readyz = String::new();
    for _ in 0..500 {
        let a = get(&c, addr, "/readyz?verbose", &[]).await;
        assert_eq!(a.status, 200);
        if a.body.contains("shedding load") {
            readyz = a.body;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let v: serde_json::Value = serde_json::from_str(&readyz).expect("health+json");
    assert_eq!(v["status"], "warn", "shedding warns in /readyz: {readyz}");
    assert_eq!(handler.entered.load(Ordering::SeqCst), 2);
    handler.hold.store(false, Ordering::SeqCst);
    handler.release.notify_waiters();
    for h in held {
        assert_eq!(h.await.unwrap(), 200);
    }
    assert_eq!(
        get(&c, addr, "/work", &[]).await.status,
        200,
        "capacity is back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_limit_cuts_in_when_answers_are_slow() {
    // Answers of 200 ms against a 50 ms latency target: every sample is overload.
    let admission = Admission::new(AdmissionConfig {
        limit: ConcurrencyLimitConfig {
            initial: 20,
            min: 2,
            max: 20,
            latency_target: Duration::from_millis(50),
            ..Default::default()
        },
        ..Default::default()
    });
    let handler = Arc::new(Handler::default());
    handler.delay_ms.store(200, Ordering::SeqCst);
    let (addr, _health) = serve(admission.clone(), handler.clone(), None).await;
    let c = client();
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..40)
        .map(|_| {
            let (c, stop, refused) = (c.clone(), stop.clone(), refused.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let a = get(&c, addr, "/work", &[]).await;
                    match a.status {
                        200 => {}
                        503 => {
                            refused.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        s => panic!("unexpected {s}: {}", a.body),
                    }
                }
            })
        })
        .collect();
    until(
        Duration::from_secs(30),
        "the limit falls to 10 or below",
        || admission.limit() <= 10,
    )
    .await;
    // Held there: what runs at once follows the limit (a little slack for requests
    // admitted just before a cut).
    handler.peak.store(0, Ordering::SeqCst);
    let cut_to = admission.limit();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let peak = handler.peak.load(Ordering::SeqCst);
    assert!(
        peak <= u64::from(cut_to) + 2,
        "after the cut to {cut_to}, at most that many run at once: peak {peak}"
    );
    stop.store(true, Ordering::SeqCst);
    for h in clients {
        h.await.unwrap();
    }
    assert!(
        refused.load(Ordering::SeqCst) > 0 && admission.refused_total() > 0,
        "40 clients over the cut limit: some were refused"
    );
    assert!(
        handler.peak.load(Ordering::SeqCst) <= 20,
        "never more than the maximum"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_and_guard_metrics_pass_promtool() {
    let admission = Admission::new(AdmissionConfig::default());
    let guard = DependencyGuard::new("postgres", BreakerConfig::default(), "serving cached reads");
    let _ = guard.call(async { Ok::<_, ()>(()) }).await;
    let handler = Arc::new(Handler::default());
    let (addr, _health) = serve(admission, handler, Some(guard)).await;
    let c = client();
    assert_eq!(
        get(&c, addr, "/work", &[(DEADLINE_HEADER, "0")])
            .await
            .status,
        503
    );
    assert_eq!(get(&c, addr, "/work", &[]).await.status, 200);
    let text = get(&c, addr, "/metrics", &[]).await.body;
    for metric in [
        r#"vigil_admission_refused_total{reason="expired"} 1"#,
        // The /work above and this scrape: /metrics is an application path.
        "vigil_admission_admitted_total 2",
        "vigil_admission_limit 20",
        r#"vigil_dependency_calls_total{dependency="postgres",result="ok"} 1"#,
    ] {
        assert!(text.contains(metric), "{metric} in:\n{text}");
    }
    let Some(promtool) = vigil_testkit::promtool_check_metrics(&text) else {
        eprintln!(
            "SKIPPED promtool check: promtool is not installed (Debian package `prometheus`; scripts/install-test-deps.sh installs it)"
        );
        return;
    };
    assert!(
        promtool.clean(),
        "promtool check metrics: {}\n{text}",
        promtool.said
    );
}
