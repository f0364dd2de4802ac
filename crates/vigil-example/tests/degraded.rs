//! The example service over real loopback HTTP with the machine's PostgreSQL (database
//! `test`, trust auth): degraded mode, fault injection, the SQLite fallback, and the
//! reserved listener under a frozen application runtime.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use vigil::checks::Amount;
use vigil_example::service::{Running, ServiceConfig, start};

const PG: &str = "postgres://postgres@127.0.0.1:5432/test";

fn config(dir: &std::path::Path, db: &str) -> ServiceConfig {
    ServiceConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        health_listen: "127.0.0.1:0".parse().unwrap(),
        agent_listen: Some("127.0.0.1:0".parse().unwrap()),
        grpc_listen: None,
        db: db.into(),
        sqlite_path: dir.join("fallback.sqlite"),
        data_dir: dir.to_path_buf(),
        // Levels any test machine meets (CI's disk once had 9.5% free, under the 10%
        // default): these tests are about the database, not the host's disk.
        disk_warn_below: Some(Amount::Bytes(1 << 20)),
        disk_fail_below: Amount::Bytes(1),
        name: "test".into(),
        revision: "r1".into(),
        workers: 2,
        max_in_flight: 64,
        check_interval: Duration::from_millis(100),
        drain_delay: Duration::from_millis(200),
        dependency: vigil::Criticality::NonCritical,
        admission: vigil_example::service::AdmissionMode::On,
        read_budget: vigil_example::service::DEFAULT_READ_BUDGET,
    }
}

struct Svc {
    running: Running,
    app: String,
    health: String,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

/// A service on the machine's PostgreSQL: these tests are about that database, so a
/// fallback to SQLite is a failure with its reason, not a test of the wrong store.
async fn start_pg() -> Svc {
    let s = start_with(PG).await;
    assert_eq!(
        s.running.store_kind, "postgres",
        "the machine runs PostgreSQL; the service fell back because: {:?}",
        s.running.store_fallback
    );
    s
}

async fn start_with(db: &str) -> Svc {
    let dir = tempfile::tempdir().unwrap();
    let running = start(config(dir.path(), db)).await.unwrap();
    Svc {
        app: format!("http://{}", running.app_addr),
        health: format!("http://{}", running.health_addr),
        running,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        _dir: dir,
    }
}

impl Svc {
    async fn get(&self, url: &str) -> (u16, String) {
        let r = self.client.get(url).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn post(&self, path: &str) -> String {
        let r = self
            .client
            .post(format!("{}{path}", self.app))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "POST {path}: {}", r.status());
        r.text().await.unwrap()
    }

    /// Polls `url` until its status code and body satisfy `pred`, for at most 15 s.
    async fn wait(&self, url: &str, pred: impl Fn(u16, &str) -> bool) -> (u16, String) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut last = (0, String::new());
        while Instant::now() < deadline {
            last = self.get(url).await;
            if pred(last.0, &last.1) {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{url} never got there; last {last:?}");
    }

    async fn ready_and_passing(&self) {
        self.wait(&format!("{}/health", self.health), |c, b| {
            c == 200 && b.starts_with(r#"{"status":"pass""#)
        })
        .await;
    }
}

/// The one line the agent-check responder writes.
async fn agent_line(addr: std::net::SocketAddr) -> String {
    use tokio::io::AsyncReadExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut line = String::new();
    stream.read_to_string(&mut line).await.unwrap();
    line
}

fn status_of(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["status"].as_str().unwrap().to_string()
}

fn check_status(body: &str, check: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["checks"][check][0]["status"]
        .as_str()
        .unwrap_or_else(|| panic!("no check {check} in {body}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_come_from_postgres_and_every_check_passes() {
    let s = start_pg().await;
    s.ready_and_passing().await;
    let (code, body) = s.get(&format!("{}/items/7", s.app)).await;
    assert_eq!(code, 200);
    assert!(body.contains(r#""served_from":"database""#), "{body}");
    assert!(body.contains(r#""name":"item 7""#), "{body}");
    let (code, _) = s.get(&format!("{}/items/999999", s.app)).await;
    assert_eq!(code, 404);
    // The health endpoints are on the application port too.
    let (code, body) = s.get(&format!("{}/health", s.app)).await;
    assert_eq!(code, 200);
    assert_eq!(check_status(&body, "postgres:query"), "pass");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_down_warns_and_reads_come_from_the_cache() {
    let s = start_pg().await;
    s.ready_and_passing().await;
    s.post("/fault/dependency?on=true").await;

    let (code, body) = s
        .wait(&format!("{}/health", s.health), |_, b| {
            status_of(b) == "warn"
        })
        .await;
    assert_eq!(code, 200, "degraded is still 200");
    assert_eq!(check_status(&body, "postgres:query"), "fail");
    assert!(
        body.contains("refused"),
        "the reason is the real connect error: {body}"
    );
    let (code, _) = s.get(&format!("{}/readyz", s.health)).await;
    assert_eq!(
        code, 200,
        "a degraded server stays ready: load balancers keep it"
    );
    assert_eq!(
        agent_line(s.running.agent_addr.unwrap()).await,
        "up ready 100%\n",
        "the agent follows readiness, not the dependency"
    );

    let (code, body) = s.get(&format!("{}/items/3", s.app)).await;
    assert_eq!(code, 200);
    assert!(body.contains(r#""served_from":"cache""#), "{body}");

    s.post("/fault/dependency?on=false").await;
    s.ready_and_passing().await;
    let (_, body) = s.get(&format!("{}/items/3", s.app)).await;
    assert!(body.contains(r#""served_from":"database""#), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_down_with_nothing_cached_fails_readiness() {
    let s = start_pg().await;
    s.ready_and_passing().await;
    s.post("/fault/dependency?on=true").await;
    s.post("/fault/cache/clear").await;
    let (_, body) = s
        .wait(&format!("{}/readyz", s.health), |c, _| c == 503)
        .await;
    assert_eq!(check_status(&body, "cache:serving"), "fail", "{body}");
    let (code, _) = s.get(&format!("{}/items/3", s.app)).await;
    assert_eq!(code, 503, "nothing to serve");

    // The database back: reads work (and refill the cache), readiness passes again.
    s.post("/fault/reset").await;
    s.wait(&format!("{}/readyz", s.health), |c, _| c == 200)
        .await;
    let (code, _) = s.wait(&format!("{}/items/3", s.app), |c, _| c == 200).await;
    assert_eq!(code, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_fault_fails_readiness_until_cleared() {
    let s = start_pg().await;
    s.ready_and_passing().await;
    s.post("/fault/disk?on=true").await;
    let (_, body) = s
        .wait(&format!("{}/readyz", s.health), |c, _| c == 503)
        .await;
    assert_eq!(check_status(&body, "disk:free"), "fail");
    assert!(body.contains("below the fail level 100%"), "{body}");
    let line = agent_line(s.running.agent_addr.unwrap()).await;
    assert!(
        line.starts_with("down #") && line.contains("disk:free"),
        "HAProxy is told why: {line:?}"
    );
    s.post("/fault/disk?on=false").await;
    s.wait(&format!("{}/readyz", s.health), |c, _| c == 200)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brownout_slows_real_queries_and_warns() {
    let s = start_pg().await;
    s.ready_and_passing().await;
    s.post("/fault/brownout?ms=300").await;
    let started = Instant::now();
    let (code, body) = s.get(&format!("{}/items/9", s.app)).await;
    let took = started.elapsed();
    assert_eq!(code, 200);
    assert!(body.contains(r#""served_from":"database""#), "{body}");
    assert!(
        took >= Duration::from_millis(300),
        "pg_sleep must slow the read: {took:?}"
    );
    let (_, body) = s
        .wait(&format!("{}/health", s.health), |_, b| {
            check_status(b, "postgres:query") == "warn"
        })
        .await;
    assert!(body.contains("slower than"), "{body}");
    s.post("/fault/brownout?ms=0").await;
    s.ready_and_passing().await;
}

/// Issue 34: the demo's brownout (500 ms on every query) under concurrent reads. The
/// reads queue on their connection and go to the cache once the breaker opens; the
/// check's `SELECT 1` has its own connection, so it measures the database (a steady
/// warn), not the reads' queue (which made it alternate warn and "no answer within 1s").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brownout_under_load_is_a_steady_warn_and_reads_come_from_the_cache() {
    let s = start_pg().await;
    s.ready_and_passing().await;
    s.post("/fault/brownout?ms=500").await;
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..8)
        .map(|i| {
            let (client, app, stop) = (s.client.clone(), s.app.clone(), stop.clone());
            tokio::spawn(async move {
                let mut from_cache = 0u32;
                while !stop.load(Ordering::SeqCst) {
                    let r = client
                        .get(format!("{app}/items/{}", 1 + i))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 200, "every read is answered");
                    if r.text().await.unwrap().contains(r#""served_from":"cache""#) {
                        from_cache += 1;
                    }
                }
                from_cache
            })
        })
        .collect();
    // Verbose: with each check's time, to tell its runs apart.
    let url = format!("{}/health?verbose", s.health);
    // Twenty distinct runs of the database check, each one a warn.
    let mut seen = std::collections::BTreeSet::new();
    let mut reads_warned = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < 20 {
        assert!(
            Instant::now() < deadline,
            "only {} check runs in 30 s",
            seen.len()
        );
        let (code, body) = s.get(&url).await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let query = &v["checks"]["postgres:query"][0];
        let time = query["time"].as_str().unwrap_or_default().to_string();
        if seen.insert(time) && seen.len() > 2 {
            // (The first runs may predate the brownout.)
            assert_eq!(
                query["status"], "warn",
                "a brownout is a steady warn, never a fail: {body}"
            );
            assert_eq!(code, 200);
        }
        reads_warned |= check_status(&body, "postgres:reads") == "warn";
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut from_cache = 0;
    for r in readers {
        from_cache += r.await.unwrap();
    }
    assert!(
        reads_warned,
        "the reads' breaker opened and /health said so"
    );
    assert!(from_cache > 0, "queued reads were answered from the cache");
    s.post("/fault/brownout?ms=0").await;
    // Reads go back to the database once the abandoned queries have drained and the
    // breaker's trial reads succeed (it reopens, for longer, while they are slow).
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (code, body) = s.get(&format!("{}/items/1", s.app)).await;
        assert_eq!(code, 200);
        let (_, health) = s.get(&format!("{}/health", s.health)).await;
        // Trial reads close the breaker; the check shows it at its next run.
        if body.contains(r#""served_from":"database""#) && status_of(&health) == "pass" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "reads never returned to the database: {body} {health}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flap_takes_the_database_down_and_up_again() {
    let s = start_pg().await;
    s.ready_and_passing().await;
    s.post("/fault/flap?on=true&period_ms=700").await;
    let url = format!("{}/health", s.health);
    s.wait(&url, |_, b| check_status(b, "postgres:query") == "fail")
        .await;
    s.wait(&url, |_, b| check_status(b, "postgres:query") == "pass")
        .await;
    s.wait(&url, |_, b| check_status(b, "postgres:query") == "fail")
        .await;
    s.post("/fault/flap?on=false").await;
    s.ready_and_passing().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_back_to_sqlite_when_postgres_is_unreachable() {
    let started = Instant::now();
    let s = start_with("postgres://postgres@127.0.0.1:1/test").await;
    assert_eq!(s.running.store_kind, "sqlite");
    let reason = s.running.store_fallback.clone().unwrap_or_default();
    assert!(reason.contains("refused"), "the reason is kept: {reason:?}");
    assert!(
        started.elapsed() < vigil_example::store::STARTUP_WINDOW,
        "a refused connection falls back at once, without the startup retries"
    );
    s.ready_and_passing().await;
    let (code, body) = s.get(&format!("{}/items/42", s.app)).await;
    assert_eq!(code, 200);
    assert!(body.contains(r#""served_from":"database""#), "{body}");
    let (_, body) = s.get(&format!("{}/health", s.health)).await;
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        health["releaseId"], "r1",
        "the configured revision is reported as releaseId: {body}"
    );

    // The same degraded mode with SQLite as the dependency.
    s.post("/fault/dependency?on=true").await;
    let (_, body) = s
        .wait(&format!("{}/health", s.health), |_, b| {
            status_of(b) == "warn"
        })
        .await;
    assert_eq!(check_status(&body, "sqlite:query"), "fail");
    let (_, body) = s.get(&format!("{}/items/42", s.app)).await;
    assert!(body.contains(r#""served_from":"cache""#), "{body}");
}

/// The service on its own 2-worker runtime; the test's client on another, so freezing
/// the service's workers does not freeze the measurement.
#[test]
fn reserved_livez_answers_while_every_application_worker_is_frozen() {
    let dir = tempfile::tempdir().unwrap();
    let app_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let running = app_rt.block_on(start(config(dir.path(), PG))).unwrap();
    let app = format!("http://{}", running.app_addr);
    let health = format!("http://{}", running.health_addr);
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    client_rt.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        let r = client
            .post(format!("{app}/fault/freeze?ms=3000"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        // Let the freeze take both workers.
        tokio::time::sleep(Duration::from_millis(300)).await;

        let started = Instant::now();
        let reserved = client.get(format!("{health}/livez")).send().await.unwrap();
        let reserved_took = started.elapsed();
        assert_eq!(reserved.status(), 200);

        let started = Instant::now();
        let naive = client
            .get(format!("{app}/naive/livez"))
            .send()
            .await
            .unwrap();
        let naive_took = started.elapsed();
        assert_eq!(naive.status(), 200);

        assert!(
            naive_took > Duration::from_millis(1000),
            "the naive endpoint must wait for a frozen worker: {naive_took:?}"
        );
        assert!(
            reserved_took < Duration::from_millis(1000),
            "the reserved /livez must answer while the workers are frozen: {reserved_took:?}"
        );
    });
    drop(running);
    drop(app_rt);
}
