//! Real-process tests of the example service under overload (issue 31): the shipped
//! binary's `vigil example-service` on the machine's PostgreSQL (127.0.0.1:5432,
//! database `test`) and `vigil lb` in front of it. The reads' dependency guard serves
//! cached reads while PostgreSQL is slow and goes back to it after; the admission layer
//! refuses work whose deadline has passed before its handler runs. Every wait polls a
//! condition, bounded.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::lb_support;
use lb_support::LbProcess;

const PG: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A running `vigil example-service`; killed when dropped.
struct Service {
    child: Child,
    app: String,
    health: String,
    store: String,
    _dir: tempfile::TempDir,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Service {
    fn start(db: &str, extra: &[&str]) -> Service {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["example-service", "--listen", "127.0.0.1:0"])
            .args([
                "--health-listen",
                "127.0.0.1:0",
                "--check-interval",
                "200ms",
            ])
            // About the database, not this machine's disk (which may be nearly full).
            .args(["--disk-fail-below", "0%", "--disk-warn-below", "off"])
            .args(["--db", db, "--name", "overload"])
            .args(extra)
            .arg("--data-dir")
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start vigil example-service");
        let line = vigil_testkit::Listening::read(&mut child);
        Service {
            app: line.get("app"),
            health: line.get("health"),
            store: line.get("store"),
            child,
            _dir: dir,
        }
    }

    /// The sum of the samples of `metric` whose labels contain `labels`.
    async fn metric(&self, c: &reqwest::Client, metric: &str, labels: &str) -> u64 {
        let text = get(c, &format!("{}/metrics", self.app), &[]).await.1;
        text.lines()
            .filter(|l| l.starts_with(metric))
            .filter(|l| l[metric.len()..].starts_with([' ', '{']) && l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap()
}

async fn get(c: &reqwest::Client, url: &str, fields: &[(&str, &str)]) -> (u16, String) {
    let mut req = c.get(url);
    for (k, v) in fields {
        req = req.header(*k, *v);
    }
    match req.send().await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

async fn post(c: &reqwest::Client, url: &str) {
    let r = c.post(url).send().await.unwrap();
    assert!(r.status().is_success(), "POST {url}: {}", r.status());
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// Polls `f` every 100 ms until it gives `Some`, for at most `within`.
async fn until<T, F, Fut>(within: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + within;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => {
                panic!("{what}: not within {within:?}; last: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_serves_cached_reads_from_a_slow_postgres_and_returns_to_it() {
    let svc = Service::start(PG, &["--read-budget", "300ms"]);
    assert_eq!(
        svc.store, "postgres",
        "the machine runs PostgreSQL at 127.0.0.1:5432 (database test)"
    );
    let c = client();
    let health = format!("{}/health", svc.health);
    until(Duration::from_secs(30), "passing", || async {
        let (code, body) = get(&c, &health, &[]).await;
        (code == 200 && json(&body)["status"] == "pass")
            .then_some(())
            .ok_or(body)
    })
    .await;
    let (_, body) = get(&c, &format!("{}/items/5", svc.app), &[]).await;
    assert_eq!(json(&body)["served_from"], "database", "{body}");

    // PostgreSQL slow: every query sleeps 800 ms on the server, past the 300 ms budget.
    post(&c, &format!("{}/fault/brownout?ms=800", svc.app)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let slowest_cached_ms = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..6)
        .map(|i| {
            let (c, app, stop, slowest) = (
                c.clone(),
                svc.app.clone(),
                stop.clone(),
                slowest_cached_ms.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let t = Instant::now();
                    let (code, body) = get(&c, &format!("{app}/items/{}", 1 + i % 5), &[]).await;
                    assert_eq!(code, 200, "every read is answered: {body}");
                    let took = t.elapsed().as_millis() as u64;
                    assert!(
                        took < 800,
                        "no read waits out the slow database ({took} ms): {body}"
                    );
                    if json(&body)["served_from"] == "cache" {
                        slowest.fetch_max(took, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    // The breaker opens: /health warns with the reason, still 200.
    let body = until(
        Duration::from_secs(30),
        "the reads' breaker opens",
        || async {
            let (code, body) = get(&c, &health, &[]).await;
            let v = json(&body);
            (code == 200
                && v["status"] == "warn"
                && v["checks"]["postgres:reads"][0]["status"] == "warn")
                .then(|| body.clone())
                .ok_or(body)
        },
    )
    .await;
    let reads = &json(&body)["checks"]["postgres:reads"][0];
    assert!(
        reads["output"]
            .as_str()
            .is_some_and(|o| o.contains("serving cached reads")),
        "the reason is in /health: {body}"
    );
    // While open: reads answered from the cache, marked degraded, at once.
    for _ in 0..10 {
        let t = Instant::now();
        let (code, body) = get(&c, &format!("{}/items/3", svc.app), &[]).await;
        assert_eq!(code, 200);
        let v = json(&body);
        if v["served_from"] == "cache" {
            assert!(v["degraded"].is_string(), "a cached read says why: {body}");
            assert!(
                t.elapsed() < Duration::from_millis(300),
                "a cached read does not wait for the database: {:?}",
                t.elapsed()
            );
        }
    }
    let degraded = svc
        .metric(&c, "vigil_dependency_calls_total", "result=\"degraded\"")
        .await;
    assert!(
        degraded > 0,
        "reads made no call while the breaker was open"
    );

    // PostgreSQL fast again: trial reads close the breaker, reads return to it.
    post(&c, &format!("{}/fault/brownout?ms=0", svc.app)).await;
    until(
        Duration::from_secs(90),
        "reads back at the database",
        || async {
            let (_, read) = get(&c, &format!("{}/items/2", svc.app), &[]).await;
            let (_, h) = get(&c, &health, &[]).await;
            (json(&read)["served_from"] == "database" && json(&h)["status"] == "pass")
                .then_some(())
                .ok_or(format!("{read} {h}"))
        },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.await.unwrap();
    }
    eprintln!(
        "slowest cached read: {} ms",
        slowest_cached_ms.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_behind_vigil_lb_refuses_expired_work_before_running_it() {
    let svc = Service::start(PG, &[]);
    let c = client();
    until(Duration::from_secs(30), "ready", || async {
        let (code, body) = get(&c, &format!("{}/readyz", svc.health), &[]).await;
        (code == 200).then_some(()).ok_or(body)
    })
    .await;
    let addr = svc.app.trim_start_matches("http://");
    let lb = LbProcess::start(&format!(
        "[timeouts]\nresponse_header = \"2s\"\n[headers]\ndeadline = \"trust\"\n\
         [pools.api]\ntargets = [{{ addr = \"{addr}\" }}]\nslow_start_window = \"0s\"\n\
         [pools.api.health_check]\nenabled = false\n\
         [pools.api.outlier]\nmax_ejection_percent = 0\n\
         [pools.api.outlier.success_rate]\nenabled = false\n"
    ))
    .await;
    let via_lb = format!("http://127.0.0.1:{}/work?ms=1", lb.port);
    let (code, body) = get(&c, &via_lb, &[]).await;
    assert_eq!(code, 200, "the path works: {body}");

    let admitted = svc.metric(&c, "vigil_admission_admitted_total", "").await;
    let refused = || svc.metric(&c, "vigil_admission_refused_total", "reason=\"expired\"");
    let expired_before = refused().await;
    // A client whose deadline has passed (trusted, so passed on): the balancer tells the
    // service 0 ms left, and the service refuses it at once.
    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(get(&c, &via_lb, &[("x-vigil-deadline-ms", "0")]).await.0);
    }
    let expired = until(Duration::from_secs(10), "expired work counted", || async {
        let n = refused().await - expired_before;
        (n > 0).then_some(n).ok_or(format!("{n} refused"))
    })
    .await;
    let admitted_after = svc.metric(&c, "vigil_admission_admitted_total", "").await;
    // (/metrics is outside the admission layer: scrapes are not counted.)
    assert_eq!(
        admitted_after, admitted,
        "no expired request was admitted: the handler never ran for any of them \
         ({expired} refused as expired, clients got {answers:?})"
    );
    assert!(
        answers.iter().all(|&a| a == 503 || a == 504),
        "expired work fails fast, never served: {answers:?}"
    );
    eprintln!("expired at the service: {expired} of 5; clients got {answers:?}");
}
