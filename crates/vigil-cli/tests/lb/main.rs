//! Real-process tests of `vigil lb`: the real binary in front of real HTTP backends
//! (vigil-testkit) on loopback, driven by real clients. Every load loop is bounded in
//! time; every wait polls a condition until a generous deadline.

use serde_json::Value;
use std::io::Write;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vigil_core::Status;
use vigil_testkit::{Backend, Mode};

#[path = "../lb_support/mod.rs"]
mod lb_support;
use lb_support::{LbProcess, serve_each, take_exact, take_head};

/// A running `vigil lb` process ([`LbProcess`]) and an HTTP client for it.
struct Lb {
    process: LbProcess,
    http: reqwest::Client,
}

impl std::ops::Deref for Lb {
    type Target = LbProcess;
    fn deref(&self) -> &LbProcess {
        &self.process
    }
}

impl std::ops::DerefMut for Lb {
    fn deref_mut(&mut self) -> &mut LbProcess {
        &mut self.process
    }
}

/// Fast health checks so that tests take seconds: interval 200ms, timeout 300ms,
/// 1 pass to rise, 3 failures to fall.
const FAST_CHECKS: &str = r#"
interval = "200ms"
timeout = "300ms"
healthy_threshold = 1
unhealthy_threshold = 3
"#;

fn targets_toml(backends: &[&Backend]) -> String {
    let items: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ addr = \"{}\" }}", b.addr()))
        .collect();
    format!("targets = [{}]", items.join(", "))
}

impl Lb {
    /// Writes `body` (everything but the listen addresses) and starts the balancer;
    /// returns once its admin listener answers.
    async fn start(body: &str) -> Lb {
        Lb {
            process: LbProcess::start(body).await,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(15))
                .pool_max_idle_per_host(64)
                .build()
                .expect("client"),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin)
    }

    async fn admin_targets(&self) -> Value {
        self.http
            .get(self.admin_url("/admin/targets"))
            .send()
            .await
            .expect("admin answers")
            .json()
            .await
            .expect("admin JSON")
    }

    /// (addr, state) of every target of `pool`.
    async fn states(&self, pool: &str) -> Vec<(String, String)> {
        let v = self.admin_targets().await;
        v["pools"][pool]["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("pool {pool} in {v}"))
            .iter()
            .map(|t| {
                (
                    t["addr"].as_str().unwrap().to_string(),
                    t["state"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    async fn state_of(&self, pool: &str, addr: SocketAddr) -> String {
        self.states(pool)
            .await
            .into_iter()
            .find(|(a, _)| *a == addr.to_string())
            .map(|(_, s)| s)
            .unwrap_or_else(|| panic!("target {addr} not in pool {pool}"))
    }

    /// Polls until `cond` holds on the admin document, or panics after `within`.
    async fn wait_admin(&self, within: Duration, what: &str, cond: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + within;
        loop {
            let v = self.admin_targets().await;
            if cond(&v) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for: {what}\nadmin: {v:#}\nlog:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn wait_all_in_service(&self, pool: &str) {
        self.wait_admin(Duration::from_secs(20), "every target in service", |v| {
            v["pools"][pool]["targets"]
                .as_array()
                .is_some_and(|ts| ts.iter().all(in_service))
        })
        .await;
    }

    async fn metrics(&self) -> String {
        self.http
            .get(self.admin_url("/metrics"))
            .send()
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("metrics text")
    }
}

fn in_service(t: &Value) -> bool {
    matches!(t["state"].as_str(), Some("healthy" | "slow-start"))
}

/// One client request as the load loop saw it.
#[derive(Clone, Debug)]
struct Sample {
    start: Instant,
    latency: Duration,
    /// Status code, or the client error.
    result: Result<u16, String>,
}

/// A bounded load: `clients` loops issuing GET `path` until stopped or `max` elapsed.
struct Load {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(lb: &Lb, path: &str, clients: usize, max: Duration) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let deadline = Instant::now() + max;
        let tasks = (0..clients)
            .map(|_| {
                let (stop, samples, http, url) =
                    (stop.clone(), samples.clone(), lb.http.clone(), lb.url(path));
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        let start = Instant::now();
                        let result = match http.get(&url).send().await {
                            Ok(r) => {
                                let code = r.status().as_u16();
                                match r.bytes().await {
                                    Ok(_) => Ok(code),
                                    Err(e) => Err(format!("body: {e}")),
                                }
                            }
                            Err(e) => Err(e.to_string()),
                        };
                        samples.lock().unwrap().push(Sample {
                            start,
                            latency: start.elapsed(),
                            result,
                        });
                        // A small pause keeps the load steady without saturating the
                        // two shared cores.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                })
            })
            .collect();
        Load {
            stop,
            samples,
            tasks,
        }
    }

    /// Lets the load run for `d`, then [`Load::finish`].
    async fn finish_after(self, d: Duration) -> Vec<Sample> {
        tokio::time::sleep(d).await;
        self.finish().await
    }

    async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("load task");
        }
        self.samples.lock().unwrap().clone()
    }
}

fn failures(samples: &[Sample]) -> Vec<&Sample> {
    samples.iter().filter(|s| s.result != Ok(200)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_killed_backend_is_ejected_in_time_and_no_request_fails_after() {
    killed_backend_scenario(true).await;
}

/// The detection bound is the active checker's: with outlier detection off, the
/// checks alone take the dead target out in time, and retries cover the meantime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_killed_backend_is_found_by_active_checks_alone_within_the_bound() {
    killed_backend_scenario(false).await;
}

async fn killed_backend_scenario(outlier_detection: bool) {
    let mut backends: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = backends.iter().collect();
    let outlier = if outlier_detection {
        ""
    } else {
        "[pools.api.outlier]\nconsecutive_5xx = 0\nconsecutive_gateway_errors = 0\n\
         [pools.api.outlier.success_rate]\nenabled = false\n"
    };
    let lb = Lb::start(&format!(
        "[pools.api]\n{}\nslow_start_window = \"0s\"\n{outlier}[pools.api.health_check]\n{FAST_CHECKS}",
        targets_toml(&refs)
    ))
    .await;
    lb.wait_all_in_service("api").await;
    let load = Load::start(&lb, "/work", 4, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(1)).await;

    let victim = backends[0].addr();
    let killed_at = Instant::now();
    backends[0].kill();
    // Detection bound: interval x unhealthy_threshold + timeout (+10% jitter), plus
    // generous slack for a loaded 2-core machine.
    let bound = Duration::from_millis(200 * 3 * 11 / 10 + 300);
    let deadline = killed_at + bound + Duration::from_secs(3);
    let ejected_at = loop {
        let s = lb.state_of("api", victim).await;
        if s == "unhealthy" || s == "ejected" {
            assert!(
                outlier_detection || s == "unhealthy",
                "with outlier detection off only the checks act: {s}"
            );
            break Instant::now();
        }
        assert!(Instant::now() < deadline, "killed target still {s}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let detection = ejected_at - killed_at;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let samples = load.finish().await;

    let after: Vec<&Sample> = samples.iter().filter(|s| s.start >= ejected_at).collect();
    assert!(
        after.len() > 50,
        "the load must keep running: {} requests",
        after.len()
    );
    let failed_after: Vec<_> = after.iter().filter(|s| s.result != Ok(200)).collect();
    assert!(
        failed_after.is_empty(),
        "no client request may fail once the target is out: {failed_after:?}"
    );
    let all_failed = failures(&samples);
    assert!(
        all_failed.is_empty(),
        "retries must cover the connect failures and resets of the kill itself: {all_failed:?}\nlog:\n{}",
        lb.log()
    );
    let log = lb.log();
    assert!(
        log.contains(&format!("target {victim}")),
        "the state change must be logged with the target: {log}"
    );
    eprintln!(
        "killed target out after {detection:?} (bound {bound:?}, outlier detection {outlier_detection}); {} requests, 0 failed",
        samples.len()
    );
    if !outlier_detection {
        assert!(
            detection <= bound + Duration::from_millis(1500),
            "the checks must find a dead target within interval x unhealthy_threshold + timeout (+ slack): {detection:?} > {bound:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_health_check_failing_fails_open_and_recovery_ends_it() {
    let backends: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = backends.iter().collect();
    let lb = Lb::start(&format!(
        "[pools.api]\n{}\nslow_start_window = \"0s\"\npanic_exit_dwell = \"500ms\"\n[pools.api.health_check]\n{FAST_CHECKS}health_json = true\n",
        targets_toml(&refs)
    ))
    .await;
    lb.wait_all_in_service("api").await;

    // A shared dependency breaks: every backend's readiness fails, yet they still serve.
    for b in &backends {
        b.set_check("postgres:connect", Status::Fail);
    }
    lb.wait_admin(Duration::from_secs(10), "pool api in fail-open", |v| {
        v["pools"]["api"]["fail_open"] == true
    })
    .await;
    for _ in 0..40 {
        let r = lb.http.get(lb.url("/x")).send().await.expect("request");
        assert_eq!(
            r.status(),
            200,
            "fail-open must keep serving from all targets"
        );
    }
    let m = lb.metrics().await;
    assert!(
        m.contains("vigil_lb_pool_fail_open{pool=\"api\"} 1"),
        "fail-open must be a metric: {m}"
    );
    let log = lb.log();
    assert!(
        log.contains("pool api: 1/4 healthy < 50% panic threshold: failing open")
            || log.contains("pool api: 0/4 healthy < 50% panic threshold: failing open"),
        "fail-open must be logged with its reason: {log}"
    );
    assert!(
        log.contains("failing: postgres:connect"),
        "the failing check must be named: {log}"
    );

    for b in &backends {
        b.clear_checks();
    }
    lb.wait_admin(Duration::from_secs(10), "fail-open over", |v| {
        v["pools"]["api"]["fail_open"] == false
    })
    .await;
    assert!(lb.log().contains("fail-open ended"));
    let r = lb.http.get(lb.url("/x")).send().await.expect("request");
    assert_eq!(r.status(), 200);
}

/// A balancer that has just started checks its new targets at the fast interval until
/// they have a verdict: with a 10 s interval and the default `healthy_threshold` of 2,
/// its targets are in service in well under one interval (about 200 ms), not after 10 s
/// of "no target in service" 503s. After the verdict, checks go back to every 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_targets_are_checked_fast_until_their_first_verdict() {
    let backends: Vec<Backend> = (0..2).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = backends.iter().collect();
    let lb = Lb::start(&format!(
        "[pools.api]\n{}\n[pools.api.health_check]\npath = \"/readyz\"\ninterval = \"10s\"\n",
        targets_toml(&refs)
    ))
    .await;
    // Half an interval: before the fast first checks, the second pass came 10 s later.
    lb.wait_admin(
        Duration::from_secs(5),
        "every target in service within half an interval",
        |v| {
            v["pools"]["api"]["targets"]
                .as_array()
                .is_some_and(|ts| ts.iter().all(in_service))
        },
    )
    .await;
    let r = lb.http.get(lb.url("/")).send().await.expect("answer");
    assert_eq!(r.status(), 200, "{}", lb.log());
    // Judged: back to the configured interval. The last check is older than the fast
    // interval and stays put for a while (the next one is due 10 s after it).
    let last = |v: &Value| v["pools"]["api"]["targets"][0]["last_check"]["at"].clone();
    let first = last(&lb.admin_targets().await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        last(&lb.admin_targets().await),
        first,
        "no fast checks after the verdict"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degraded_warn_targets_stay_in_service() {
    let backends: Vec<Backend> = (0..2).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = backends.iter().collect();
    let lb = Lb::start(&format!(
        "[pools.api]\n{}\n[pools.api.health_check]\n{FAST_CHECKS}health_json = true\n",
        targets_toml(&refs)
    ))
    .await;
    lb.wait_all_in_service("api").await;
    backends[0].set_check("cache:hit-ratio", Status::Warn);
    backends[1].set_check("disk:free", Status::Fail);
    lb.wait_admin(Duration::from_secs(10), "b1 unhealthy", |v| {
        v["pools"]["api"]["targets"][1]["state"] == "unhealthy"
    })
    .await;
    let t0 = &lb.admin_targets().await["pools"]["api"]["targets"][0];
    assert!(in_service(t0), "warn is degraded, not down: {t0}");
    assert!(
        t0["last_check"]["detail"]
            .as_str()
            .unwrap()
            .contains("health+json warn"),
        "{t0}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outlier_detection_ejects_a_500_backend_bounded_by_max_ejection_percent() {
    let backends: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = backends.iter().collect();
    let lb = Lb::start(&format!(
        "[pools.api]\n{}\n[pools.api.health_check]\n{FAST_CHECKS}",
        targets_toml(&refs)
    ))
    .await;
    lb.wait_all_in_service("api").await;
    // Two of four pass their health checks but answer 500 to real requests. 10% of 4
    // allows one ejection (at least one is always allowed), not two.
    backends[0].set_mode(Mode::Status(500));
    backends[1].set_mode(Mode::Status(500));
    let mut codes = std::collections::BTreeMap::new();
    for _ in 0..300 {
        let r = lb.http.get(lb.url("/x")).send().await.expect("request");
        *codes.entry(r.status().as_u16()).or_insert(0) += 1;
    }
    let states = lb.states("api").await;
    let ejected: Vec<_> = states.iter().filter(|(_, s)| s == "ejected").collect();
    assert_eq!(
        ejected.len(),
        1,
        "exactly one of the two 500-ing targets is ejected: {states:?}"
    );
    let bad = [
        backends[0].addr().to_string(),
        backends[1].addr().to_string(),
    ];
    assert!(bad.contains(&ejected[0].0), "{states:?}");
    let log = lb.log();
    assert!(
        log.contains("consecutive errors (last: HTTP 500)"),
        "the ejection says why: {log}"
    );
    assert!(
        log.contains("(max_ejection_percent)"),
        "the refused second ejection says why: {log}"
    );
    let m = lb.metrics().await;
    assert!(m.contains("vigil_lb_target_ejections_total"), "{m}");
    eprintln!("codes seen: {codes:?}");
}

/// The success-rate rule judges fast: every second over the last five.
const FAST_SUCCESS_RATE: &str =
    "[pools.api.outlier.success_rate]\ninterval = \"1s\"\nwindow = \"5s\"\n";

/// Starts four backends answering per `modes` behind a round-robin pool with the fast
/// success-rate rule, and a steady load through it.
async fn success_rate_fleet(modes: [Mode; 4]) -> (Vec<Backend>, Lb, Load) {
    let backends: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = backends.iter().collect();
    let lb = Lb::start(&format!(
        "[pools.api]\n{}\nbalance = \"round-robin\"\nslow_start_window = \"0s\"\n\
         [pools.api.health_check]\n{FAST_CHECKS}{FAST_SUCCESS_RATE}",
        targets_toml(&refs)
    ))
    .await;
    lb.wait_all_in_service("api").await;
    for (b, m) in backends.iter().zip(modes) {
        b.set_mode(m);
    }
    let load = Load::start(&lb, "/work", 4, Duration::from_secs(40));
    (backends, lb, load)
}

/// Issue 17: a target answering 500 to one request in five, among peers that never
/// fail, never has five errors in a row (the consecutive-error rule cannot see it), but
/// its error rate against its peers' ejects it; the others stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_failing_a_fifth_of_its_requests_is_ejected_by_its_success_rate() {
    let fail_a_fifth = Mode::FailEvery {
        every: 5,
        status: 500,
    };
    let (backends, lb, load) =
        success_rate_fleet([fail_a_fifth, Mode::Ok, Mode::Ok, Mode::Ok]).await;
    let bad = backends[0].addr();
    lb.wait_admin(Duration::from_secs(20), "the 20% target ejected", |v| {
        v["pools"]["api"]["targets"].as_array().is_some_and(|ts| {
            ts.iter()
                .any(|t| t["addr"] == bad.to_string() && t["state"] == "ejected")
        })
    })
    .await;
    let v = lb.admin_targets().await;
    let samples = load.finish().await;
    let targets = v["pools"]["api"]["targets"].as_array().unwrap();
    let t = targets
        .iter()
        .find(|t| t["addr"] == bad.to_string())
        .unwrap();
    let reason = t["ejection_reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("a success-rate outlier: ")
            && reason.contains("% errors (")
            && reason.contains("for its 3 peers (binomial p="),
        "the ejection says which rule and its numbers: {t:#}"
    );
    // Its error rate, as the verdict counted it: a fifth, give or take the window's edge.
    let rate = reason
        .trim_start_matches("a success-rate outlier: ")
        .split('%')
        .next()
        .and_then(|r| r.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("a rate in {reason:?}"));
    assert!((15.0..=25.0).contains(&rate), "{reason}");
    assert!(
        t["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("target {bad} ejected for"))
                && r.contains("success-rate outlier")),
        "{t:#}"
    );
    for t in targets.iter().filter(|t| t["addr"] != bad.to_string()) {
        assert!(in_service(t), "a peer at 0% stays in service: {t:#}");
        assert_eq!(t["ejections"], 0, "{t:#}");
        let sr = &t["success_rate"];
        assert_eq!(sr["errors"], 0, "{t:#}");
        assert_eq!(sr["finding"], "below_floor", "{t:#}");
    }
    let log = lb.log();
    assert!(
        log.contains(&format!("target {bad} ejected for"))
            && log.contains("after a success-rate outlier: "),
        "the ejection is logged with its reason: {log}"
    );
    assert!(
        !log.contains("consecutive errors"),
        "one error in five never makes a streak of five: {log}"
    );
    let ejections = log.matches(" ejected for ").count();
    assert_eq!(ejections, 1, "only the bad target is ever ejected: {log}");
    let served = samples.iter().filter(|s| s.result == Ok(200)).count();
    assert!(
        served > 200,
        "the load ran: {} of {}",
        served,
        samples.len()
    );
}

/// A fleet whose targets fail alike is not judged target by target: all at 0% (under
/// the absolute floor) or all at 20% (a failure they share), nobody is ejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_failing_alike_ejects_nobody_by_success_rate() {
    let fail_a_fifth = || Mode::FailEvery {
        every: 5,
        status: 500,
    };
    for (modes, finding) in [
        ([Mode::Ok, Mode::Ok, Mode::Ok, Mode::Ok], "below_floor"),
        (
            [
                fail_a_fifth(),
                fail_a_fifth(),
                fail_a_fifth(),
                fail_a_fifth(),
            ],
            "shared_failure",
        ),
    ] {
        let (_backends, lb, load) = success_rate_fleet(modes).await;
        // Judged on a full window with volume, several times over.
        lb.wait_admin(
            Duration::from_secs(20),
            &format!("every target judged {finding} on 50+ requests"),
            |v| {
                v["pools"]["api"]["targets"].as_array().is_some_and(|ts| {
                    ts.iter().all(|t| {
                        t["success_rate"]["finding"] == finding
                            && t["success_rate"]["requests"].as_u64().unwrap_or(0) >= 50
                    })
                })
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let v = lb.admin_targets().await;
        let samples = load.finish().await;
        for t in v["pools"]["api"]["targets"].as_array().unwrap() {
            assert!(in_service(t), "{finding}: nobody ejected: {t:#}");
            assert_eq!(t["ejections"], 0, "{finding}: {t:#}");
            assert_eq!(t["success_rate"]["finding"], finding, "{t:#}");
        }
        let log = lb.log();
        assert!(!log.contains(" ejected for "), "{finding}: {log}");
        assert!(
            log.contains("success rate: "),
            "the verdicts are logged (debug): {log}"
        );
        let failed = samples.iter().filter(|s| s.result == Ok(500)).count();
        eprintln!(
            "{finding}: {} requests, {failed} answered 500",
            samples.len()
        );
    }
}

/// Issue 15: each pool's `/admin/targets` entry counts what its clients got, by class,
/// with the success rate since start and over the last minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pool_counts_its_clients_answers_by_class_with_a_success_rate() {
    let b = Backend::start("b");
    let nobody = lb_support::free_port();
    let lb = Lb::start(&format!(
        "[[routes]]\npath_prefix = \"/gone\"\npool = \"gone\"\n[[routes]]\npool = \"api\"\n\
         [pools.api]\n{}\n[pools.api.health_check]\n{FAST_CHECKS}\
         [pools.gone]\ntargets = [{{ addr = \"127.0.0.1:{nobody}\" }}]\n\
         [pools.gone.health_check]\nenabled = false\n",
        targets_toml(&[&b]),
    ))
    .await;
    lb.wait_all_in_service("api").await;
    let mut sent = std::collections::BTreeMap::new();
    for (mode, path, n) in [
        (Mode::Ok, "/x", 10),
        (Mode::Status(404), "/x", 5),
        (Mode::Status(500), "/x", 3),
        (Mode::Ok, "/gone/x", 4),
    ] {
        b.set_mode(mode);
        for _ in 0..n {
            let r = lb.http.get(lb.url(path)).send().await.expect("request");
            *sent.entry(r.status().as_u16()).or_insert(0u64) += 1;
        }
    }
    assert_eq!(
        sent.get(&502),
        Some(&4),
        "nothing listens for pool gone: {sent:?}"
    );
    let v = lb.admin_targets().await;
    let api = &v["pools"]["api"]["requests"];
    assert_eq!(
        (
            &api["answered"],
            &api["2xx"],
            &api["4xx"],
            &api["5xx"],
            &api["gateway_error"]
        ),
        (&18.into(), &10.into(), &5.into(), &3.into(), &0.into()),
        "{api:#}"
    );
    let rate = api["success_rate"].as_f64().unwrap();
    assert!(
        (rate - 15.0 / 18.0).abs() < 1e-9,
        "a 4xx is the client's: {api:#}"
    );
    assert_eq!(api["recent"]["answered"], 18, "{api:#}");
    assert_eq!(api["recent"]["errors"], 3, "{api:#}");
    assert!((api["recent"]["success_rate"].as_f64().unwrap() - rate).abs() < 1e-9);
    assert!(
        api["recent"]["seconds"].as_f64().unwrap() <= 60.0,
        "{api:#}"
    );
    let gone = &v["pools"]["gone"]["requests"];
    assert_eq!(gone["gateway_error"], 4, "{gone:#}");
    assert_eq!(gone["recent"]["success_rate"], 0.0, "{gone:#}");
}

impl Lb {
    /// `POST` (drain) or `DELETE` (undrain) `/admin/targets/<target>/drain` + `query`:
    /// the status and the JSON answer.
    async fn drain(&self, method: reqwest::Method, target: &str, query: &str) -> (u16, Value) {
        let r = self
            .http
            .request(
                method,
                self.admin_url(&format!("/admin/targets/{target}/drain{query}")),
            )
            .send()
            .await
            .expect("admin answers");
        let code = r.status().as_u16();
        (code, r.json().await.expect("a JSON answer"))
    }

    /// The admin document's entry for `addr` in `pool`.
    async fn target(&self, pool: &str, addr: SocketAddr) -> Value {
        let v = self.admin_targets().await;
        v["pools"][pool]["targets"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["addr"] == addr.to_string()).cloned())
            .unwrap_or_else(|| panic!("target {addr} not in pool {pool}: {v}"))
    }
}

/// Issue 18: a drained target gets no new request while those it has finish there
/// (`draining`, then `drained`), and undraining puts it back in service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_target_finishes_its_requests_takes_no_new_ones_and_comes_back() {
    let backends: Vec<Backend> = (0..3).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = backends.iter().collect();
    let lb = Lb::start(&format!(
        "[pools.api]\n{}\nbalance = \"round-robin\"\nslow_start_window = \"0s\"\n\
         [pools.api.health_check]\n{FAST_CHECKS}",
        targets_toml(&refs)
    ))
    .await;
    lb.wait_all_in_service("api").await;
    let lame = &backends[0];
    let addr = lame.addr();
    lame.set_mode(Mode::Delay(Duration::from_millis(1500)));
    // Round-robin sends every third request to b0, where it waits 1.5 s.
    let in_flight: Vec<_> = (0..6)
        .map(|_| {
            let (http, url) = (lb.http.clone(), lb.url("/x"));
            tokio::spawn(async move {
                let r = http.get(&url).send().await.expect("request");
                (r.status().as_u16(), r.text().await.expect("body"))
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lame.requests() == 0 {
        assert!(Instant::now() < deadline, "no request reached b0");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (code, answer) = lb.drain(reqwest::Method::POST, &addr.to_string(), "").await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["target"], addr.to_string(), "{answer}");
    assert_eq!(answer["drained"], true, "{answer}");
    assert_eq!(answer["pools"][0]["pool"], "api", "{answer}");
    assert_eq!(answer["pools"][0]["state"], "draining", "{answer}");
    assert!(
        answer["pools"][0]["in_flight"].as_u64() >= Some(1),
        "{answer}"
    );
    let t = lb.target("api", addr).await;
    assert_eq!(t["state"], "draining", "{t:#}");
    assert_eq!(t["drained"], true, "{t:#}");
    assert!(t["outstanding"].as_u64() >= Some(1), "{t:#}");
    assert!(
        t["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("target {addr} drained by the admin API"))),
        "{t:#}"
    );
    // No new request reaches it...
    let before = lame.requests();
    for _ in 0..30 {
        let r = lb.http.get(lb.url("/y")).send().await.expect("request");
        assert_eq!(r.status(), 200);
        assert_ne!(
            r.text().await.unwrap(),
            "b0",
            "a drained target gets no new request"
        );
    }
    assert_eq!(lame.requests(), before, "b0 got no new request");
    // Draining again changes nothing (a deployer may retry); `?wait=` answers once no
    // request is in flight on it any more.
    let asked = Instant::now();
    let (code, answer) = lb
        .drain(reqwest::Method::POST, &addr.to_string(), "?wait=10s")
        .await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["pools"][0]["state"], "drained", "{answer}");
    assert_eq!(answer["pools"][0]["in_flight"], 0, "{answer}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    // ...and those it had finish there.
    let mut from_lame = 0;
    for h in in_flight {
        let (code, body) = h.await.expect("request task");
        assert_eq!(code, 200, "an in-flight request finishes: {body}");
        from_lame += usize::from(body == "b0");
    }
    assert!(
        from_lame >= 1,
        "the requests in flight on b0 were answered by b0"
    );
    lb.wait_admin(Duration::from_secs(5), "b0 drained", |v| {
        v["pools"]["api"]["targets"][0]["state"] == "drained"
            && v["pools"]["api"]["targets"][0]["outstanding"] == 0
    })
    .await;
    // Undrained: back in service, and traffic reaches it again.
    lame.set_mode(Mode::Ok);
    let (code, answer) = lb
        .drain(reqwest::Method::DELETE, &addr.to_string(), "")
        .await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["drained"], false, "{answer}");
    assert_eq!(answer["pools"][0]["state"], "undrained", "{answer}");
    let t = lb.target("api", addr).await;
    assert!(in_service(&t), "{t:#}");
    assert_eq!(t["drained"], false, "{t:#}");
    for _ in 0..30 {
        let r = lb.http.get(lb.url("/z")).send().await.expect("request");
        assert_eq!(r.status(), 200);
    }
    assert!(
        lame.requests() > before,
        "an undrained target gets traffic again"
    );
    let log = lb.log();
    assert!(
        log.contains(&format!(
            "target {addr} drained by the admin API: no new requests"
        )) && log.contains(&format!("target {addr} undrained by the admin API")),
        "{log}"
    );
}

/// The drain API's refusals: an unknown target (404), the last target in service of a
/// pool (409 unless `?force=true`), a browser (403), a method other than POST and DELETE
/// (405); a target may be named with its `:` escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_api_names_what_it_refuses_and_why() {
    let api: Vec<Backend> = (0..2).map(|i| Backend::start(&format!("a{i}"))).collect();
    let solo = Backend::start("solo");
    let lb = Lb::start(&format!(
        "[[routes]]\npath_prefix = \"/solo\"\npool = \"solo\"\n[[routes]]\npool = \"api\"\n\
         [pools.api]\n{}\nslow_start_window = \"0s\"\n[pools.api.health_check]\n{FAST_CHECKS}\
         [pools.solo]\n{}\nslow_start_window = \"0s\"\n[pools.solo.health_check]\n{FAST_CHECKS}",
        targets_toml(&api.iter().collect::<Vec<_>>()),
        targets_toml(&[&solo]),
    ))
    .await;
    lb.wait_all_in_service("api").await;
    lb.wait_all_in_service("solo").await;

    let (code, answer) = lb
        .drain(
            reqwest::Method::POST,
            &api[0].addr().to_string(),
            "?wait=forever",
        )
        .await;
    assert_eq!(code, 400, "{answer}");
    let (code, answer) = lb.drain(reqwest::Method::POST, "10.9.9.9:1", "").await;
    assert_eq!(code, 404, "{answer}");
    assert_eq!(answer["target"], "10.9.9.9:1", "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("no pool has a target \"10.9.9.9:1\"")),
        "{answer}"
    );

    let only = solo.addr().to_string();
    let (code, answer) = lb.drain(reqwest::Method::POST, &only, "").await;
    assert_eq!(code, 409, "{answer}");
    assert_eq!(answer["pool"], "solo", "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains(&format!(
                "draining {only} would leave pool solo with no target in service"
            )) && e.contains("?force=true")),
        "{answer}"
    );
    assert!(in_service(&lb.target("solo", solo.addr()).await));
    let r = lb.http.get(lb.url("/solo/x")).send().await.unwrap();
    assert_eq!(r.status(), 200, "a refused drain changes nothing");

    let (code, answer) = lb.drain(reqwest::Method::POST, &only, "?force=true").await;
    assert_eq!(code, 200, "{answer}");
    let r = lb.http.get(lb.url("/solo/x")).send().await.unwrap();
    assert_eq!(
        r.status(),
        503,
        "a pool whose only target is drained has none"
    );
    let (code, _) = lb.drain(reqwest::Method::DELETE, &only, "").await;
    assert_eq!(code, 200);
    let r = lb.http.get(lb.url("/solo/x")).send().await.unwrap();
    assert_eq!(r.status(), 200, "undrained, it serves again");

    let a0 = api[0].addr();
    let r = lb
        .http
        .post(lb.admin_url(&format!("/admin/targets/{a0}/drain")))
        .header("Origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a browser cannot drain");
    assert!(in_service(&lb.target("api", a0).await));
    let r = lb
        .http
        .get(lb.admin_url(&format!("/admin/targets/{a0}/drain")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST, DELETE");

    let escaped = a0.to_string().replace(':', "%3A");
    let (code, answer) = lb.drain(reqwest::Method::POST, &escaped, "").await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["target"], a0.to_string(), "{answer}");
    assert_eq!(lb.target("api", a0).await["state"], "drained");
    // One target of two left: draining it too would leave none.
    let (code, answer) = lb
        .drain(reqwest::Method::POST, &api[1].addr().to_string(), "")
        .await;
    assert_eq!(code, 409, "{answer}");
    let (code, _) = lb.drain(reqwest::Method::DELETE, &escaped, "").await;
    assert_eq!(code, 200);
}

/// Sends raw bytes to the proxy and returns what came back (until close or 5 s).
async fn raw(port: u16, request: &[u8], pause: Option<Duration>) -> String {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    s.write_all(request).await.expect("write");
    if let Some(p) = pause {
        tokio::time::sleep(p).await;
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_and_a_garbage_backend_get_their_status_and_disturb_nothing() {
    let good: Vec<Backend> = (0..2).map(|i| Backend::start(&format!("g{i}"))).collect();
    let garbage = Backend::start("garbage");
    garbage.set_mode(Mode::Garbage);
    let lb = Lb::start(&format!(
        "[timeouts]\nclient_header = \"1s\"\n\
         [[routes]]\npath_prefix = \"/bad\"\npool = \"bad\"\n\
         [[routes]]\npool = \"api\"\n\
         [pools.api]\n{}\n[pools.api.health_check]\n{FAST_CHECKS}\
         [pools.bad]\n{}\n[pools.bad.health_check]\n{FAST_CHECKS}",
        targets_toml(&good.iter().collect::<Vec<_>>()),
        targets_toml(&[&garbage]),
    ))
    .await;
    lb.wait_all_in_service("api").await;
    lb.wait_all_in_service("bad").await;
    let load = Load::start(&lb, "/ok", 2, Duration::from_secs(20));

    // Slowloris: half a header, then silence.
    let slow = raw(lb.port, b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Slow: ", None);
    // A header over the 16 KiB limit.
    let mut big = b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 17 * 1024));
    big.extend(b"\r\n\r\n");
    let oversized = raw(lb.port, &big, None);
    // Not HTTP at all.
    let malformed = raw(lb.port, b"HELLO THERE\r\n\r\n", None);
    let (slow, oversized, malformed) = tokio::join!(slow, oversized, malformed);
    assert!(slow.starts_with("HTTP/1.1 408"), "slowloris: {slow:?}");
    assert!(
        oversized.starts_with("HTTP/1.1 431"),
        "oversized: {oversized:?}"
    );
    assert!(
        malformed.starts_with("HTTP/1.1 400"),
        "malformed: {malformed:?}"
    );

    for _ in 0..5 {
        let r = lb.http.get(lb.url("/bad/x")).send().await.expect("request");
        assert_eq!(r.status(), 502, "garbage from the target is a 502");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let samples = load.finish().await;
    assert!(samples.len() > 20, "load ran: {}", samples.len());
    let failed = failures(&samples);
    assert!(failed.is_empty(), "nothing else is disturbed: {failed:?}");
    // The 90th percentile, not the maximum: a proxy held up by the slowloris (client
    // header timeout 1 s, most of this load's duration) would delay most requests by
    // up to a second, while one request delayed by a starved CI machine says nothing.
    let mut latencies: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    latencies.sort();
    let p90 = latencies[latencies.len() * 9 / 10];
    assert!(
        p90 < Duration::from_millis(500),
        "other clients were not held up: p90 {p90:?}, slowest {:?}",
        latencies.last()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_with_a_bad_config_keeps_the_old_one_and_a_good_one_keeps_health_state() {
    let backends: Vec<Backend> = (0..3).map(|i| Backend::start(&format!("b{i}"))).collect();
    let two = format!(
        "[pools.api]\n{}\n[pools.api.health_check]\n{FAST_CHECKS}",
        targets_toml(&[&backends[0], &backends[1]])
    );
    let lb = Lb::start(&two).await;
    lb.wait_all_in_service("api").await;
    let since_before = lb.admin_targets().await["pools"]["api"]["targets"][0]["since"].clone();

    // A typo: the running configuration must stay.
    let head = std::fs::read_to_string(&lb.config).unwrap();
    let bad = head.replace("interval = \"200ms\"", "intervall = \"200ms\"");
    std::fs::write(&lb.config, &bad).unwrap();
    lb.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lb.log().contains("reload rejected") {
        assert!(
            Instant::now() < deadline,
            "no rejection logged: {}",
            lb.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = lb.log();
    assert!(
        log.contains("lb.toml:") && log.contains("key `pools.api.health_check.intervall`"),
        "the rejection names file, line and key: {log}"
    );
    for _ in 0..20 {
        let r = lb
            .http
            .get(lb.url("/x"))
            .send()
            .await
            .expect("still serving");
        assert_eq!(r.status(), 200);
    }
    assert_eq!(lb.states("api").await.len(), 2);

    // check-config says the same, with exit code 78.
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["lb", "check-config", "-c"])
        .arg(&lb.config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("intervall"), "{err}");

    // A good config adding a third target: the first two keep their state.
    let three = head.replace(
        &targets_toml(&[&backends[0], &backends[1]]),
        &targets_toml(&[&backends[0], &backends[1], &backends[2]]),
    );
    std::fs::write(&lb.config, &three).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["lb", "check-config", "-c"])
        .arg(&lb.config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    lb.signal("HUP");
    lb.wait_admin(Duration::from_secs(10), "three targets", |v| {
        v["pools"]["api"]["targets"].as_array().map(Vec::len) == Some(3)
    })
    .await;
    let v = lb.admin_targets().await;
    assert_eq!(
        v["pools"]["api"]["targets"][0]["since"], since_before,
        "a reload must not reset target health: {v}"
    );
    lb.wait_all_in_service("api").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_frozen_backend_holds_no_request_past_the_response_timeout() {
    let backends: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = backends.iter().collect();
    let lb = Lb::start(&format!(
        "[timeouts]\nresponse_header = \"1s\"\n\
         [pools.api]\n{}\nslow_start_window = \"0s\"\n\
         [pools.api.hedge]\nenabled = true\nmin_delay = \"50ms\"\nmax_delay = \"500ms\"\n\
         [pools.api.health_check]\n{FAST_CHECKS}",
        targets_toml(&refs)
    ))
    .await;
    lb.wait_all_in_service("api").await;
    let load = Load::start(&lb, "/work", 4, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let frozen_at = Instant::now();
    // Like SIGSTOP: the connection is accepted, nothing ever answers, health included.
    backends[0].set_mode(Mode::Freeze);
    backends[0].set_health_mode(Mode::Freeze);
    let victim = backends[0].addr();
    let deadline = Instant::now() + Duration::from_secs(10);
    let out_at = loop {
        let s = lb.state_of("api", victim).await;
        if s == "unhealthy" || s == "ejected" {
            break Instant::now();
        }
        assert!(Instant::now() < deadline, "frozen target still {s}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let samples = load.finish().await;

    let slowest = samples.iter().map(|s| s.latency).max().unwrap();
    assert!(
        slowest <= Duration::from_millis(1000 + 700),
        "no request may wait past the 1s response timeout (+ scheduling slack): {slowest:?}"
    );
    let rate = |from: Instant, to: Instant| {
        let n = samples
            .iter()
            .filter(|s| s.start >= from && s.start < to && s.result == Ok(200))
            .count();
        n as f64 / (to - from).as_secs_f64()
    };
    let before = rate(frozen_at - Duration::from_millis(1500), frozen_at);
    let last = samples.iter().map(|s| s.start).max().unwrap();
    let after = rate(out_at, last);
    assert!(
        after >= 0.5 * before,
        "throughput must recover once the target is out: {after:.0}/s after vs {before:.0}/s before"
    );
    let failed = failures(&samples);
    eprintln!(
        "frozen target out after {:?}; slowest {slowest:?}; {before:.0}/s before, {after:.0}/s after; {} failed: {failed:?}",
        out_at - frozen_at,
        failed.len()
    );
    assert!(
        failed.len() <= 4,
        "hedging and moving in-flight requests must leave at most a handful of errors: {failed:?}"
    );
}

/// Issue 14 part 1: a frozen target (accepts, never answers, health checks included)
/// among healthy ones, with a realistic per-try timeout shorter than the time the active
/// checks need: the requests caught on it time out after `per_try`, count as gateway
/// errors for outlier detection, and go again to another target. No client sees an
/// error, and none waits much longer than one per-try timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_a_frozen_target_costs_no_client_error_with_a_per_try_timeout() {
    frozen_target_with_timeouts("response_header = \"5s\"\nper_try = \"500ms\"").await;
}

async fn frozen_target_with_timeouts(timeouts: &str) {
    const PER_TRY: Duration = Duration::from_millis(500);
    let backends: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = backends.iter().collect();
    // Checks every 500 ms, 3 failures to fall: about 2 s before they take the frozen
    // target out, four times the per-try timeout.
    let lb = Lb::start(&format!(
        "[timeouts]\n{timeouts}\n\
         [pools.api]\n{}\nslow_start_window = \"0s\"\n\
         [pools.api.health_check]\ninterval = \"500ms\"\ntimeout = \"400ms\"\n\
         healthy_threshold = 1\nunhealthy_threshold = 3\njitter = 0.0\n",
        targets_toml(&refs)
    ))
    .await;
    lb.wait_all_in_service("api").await;
    let load = Load::start(&lb, "/work", 8, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(1)).await;
    backends[0].set_mode(Mode::Freeze);
    backends[0].set_health_mode(Mode::Freeze);
    let victim = backends[0].addr();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = lb.state_of("api", victim).await;
        if s == "unhealthy" || s == "ejected" {
            break;
        }
        assert!(Instant::now() < deadline, "frozen target still {s}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let samples = load.finish().await;
    let failed = failures(&samples);
    let slowest = samples.iter().map(|s| s.latency).max().unwrap();
    let metrics = lb.metrics().await;
    let timeouts_retried = metrics
        .lines()
        .find(|l| l.starts_with("vigil_lb_retries_total{") && l.contains("reason=\"timeout\""))
        .unwrap_or("none");
    eprintln!(
        "{} requests, {} failed, slowest {slowest:?}; {timeouts_retried}",
        samples.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "no client error: {failed:?}");
    assert!(
        slowest <= PER_TRY + Duration::from_millis(700),
        "the slowest request waits one per-try timeout and a retry (+ scheduling slack): {slowest:?}"
    );
    assert!(
        timeouts_retried != "none",
        "requests caught on the frozen target were retried: {metrics}"
    );
}

/// Hedging with a gray failure (requests hang, the health path still answers): the
/// hedges answer every request, and the attempts they overtook run on to their per-try
/// timeout, which outlier detection counts: the frozen target is ejected for timeouts,
/// long before any active check would notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_a_frozen_target_under_hedging_is_ejected_for_its_per_try_timeouts() {
    let backends: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = backends.iter().collect();
    // Active checks too slow to notice within this test: only outlier detection can.
    let lb = Lb::start(&format!(
        "[timeouts]\nper_try = \"300ms\"\n\
         [pools.api]\n{}\nslow_start_window = \"0s\"\n\
         [pools.api.hedge]\nenabled = true\nmin_delay = \"20ms\"\nmax_delay = \"100ms\"\n\
         [pools.api.health_check]\ninterval = \"60s\"\ntimeout = \"1s\"\n\
         healthy_threshold = 1\nunhealthy_threshold = 3\n",
        targets_toml(&refs)
    ))
    .await;
    lb.wait_all_in_service("api").await;
    let load = Load::start(&lb, "/work", 4, Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(500)).await;
    backends[0].set_mode(Mode::Freeze);
    let victim = backends[0].addr().to_string();
    lb.wait_admin(
        Duration::from_secs(5),
        "the frozen target ejected for its timeouts",
        |v| {
            v["pools"]["api"]["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| {
                    t["addr"] == victim.as_str()
                        && t["state"] == "ejected"
                        && t["reason"].as_str().is_some_and(|r| r.contains("timeout"))
                })
        },
    )
    .await;
    let samples = load.finish().await;
    let failed = failures(&samples);
    assert!(
        failed.is_empty(),
        "hedges answered every request: {failed:?}"
    );
}

/// Issue 14 part 2: being slower than a hedge is not a failure. A target that answers
/// every request, only slower than the hedge delay, loses most races and is never
/// ejected for it (before, three overtakes in a row ejected it for 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_a_slow_target_overtaken_by_hedges_is_never_ejected() {
    let backends: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = backends.iter().collect();
    let lb = Lb::start(&format!(
        "[timeouts]\nper_try = \"2s\"\n\
         [pools.api]\n{}\nslow_start_window = \"0s\"\n\
         [pools.api.hedge]\nenabled = true\nmin_delay = \"20ms\"\nmax_delay = \"50ms\"\n\
         [pools.api.health_check]\ninterval = \"60s\"\ntimeout = \"1s\"\n\
         healthy_threshold = 1\nunhealthy_threshold = 3\n",
        targets_toml(&refs)
    ))
    .await;
    lb.wait_all_in_service("api").await;
    backends[0].set_mode(Mode::Delay(Duration::from_millis(250)));
    let load = Load::start(&lb, "/work", 4, Duration::from_secs(3));
    let samples = load.finish_after(Duration::from_secs(3)).await;
    let failed = failures(&samples);
    assert!(failed.is_empty(), "{failed:?}");
    let metrics = lb.metrics().await;
    let hedges: u64 = metrics
        .lines()
        .find(|l| l.starts_with("vigil_lb_retries_total{") && l.contains("reason=\"hedge\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(
        hedges >= 3,
        "the slow target was overtaken: {hedges} hedges\n{metrics}"
    );
    assert!(
        !metrics.contains("vigil_lb_target_ejections_total{"),
        "no target ejected: {metrics}"
    );
    assert!(in_service_state(
        &lb.state_of("api", backends[0].addr()).await
    ));
}

fn in_service_state(s: &str) -> bool {
    matches!(s, "healthy" | "slow-start")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_then_exits_0() {
    let b = Backend::start("slow");
    let mut lb = Lb::start(&format!(
        "[pools.api]\n{}\n[pools.api.health_check]\n{FAST_CHECKS}",
        targets_toml(&[&b])
    ))
    .await;
    lb.wait_all_in_service("api").await;
    b.set_mode(Mode::Delay(Duration::from_millis(1500)));
    let (http, url) = (lb.http.clone(), lb.url("/slow"));
    let inflight = tokio::spawn(async move { http.get(url).send().await.map(|r| r.status()) });
    tokio::time::sleep(Duration::from_millis(400)).await;
    lb.signal("TERM");
    let status = inflight
        .await
        .unwrap()
        .expect("in-flight request completes");
    assert_eq!(status, 200, "the in-flight request is drained, not dropped");
    let deadline = Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Some(s) = lb.child.try_wait().unwrap() {
            break s.code();
        }
        assert!(
            Instant::now() < deadline,
            "vigil lb did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(0), "log:\n{}", lb.log());
}

#[test]
fn check_config_accepts_the_example_and_rejects_with_file_line_key() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/lb.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["lb", "check-config", "-c", example])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    let mut f = std::fs::File::create(&bad).unwrap();
    writeln!(f, "[pools.api]\ntargets = [{{ addr = \"127.0.0.1\" }}]").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["lb", "check-config", "-c"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml:2:") && err.contains("key `pools.api.targets[0].addr`"),
        "{err}"
    );
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["lb"])
        .current_dir(empty.path())
        .env_remove("VIGIL_LB_CONFIG")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(78),
        "no lb.toml where the default points is a config error naming it: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("lb.toml"));
}

#[test]
fn check_config_lists_every_invalid_value_not_only_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    // Three wrong values in three sections, and a fourth check (per_try against
    // response_header) that depends on one of them and must not add a second error.
    std::fs::write(
        &bad,
        "[timeouts]\nresponse_header = \"0s\"\nper_try = \"1s\"\n\n\
         [limits]\nmax_header_bytes = 100\n\n\
         [pools.api]\ntargets = [{ addr = \"127.0.0.1:1\" }]\n\
         [pools.api.health_check]\njitter = 0.9\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["lb", "check-config", "-c"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(78),
        "exit code of a bad config: {err}"
    );
    for (line, key, value) in [
        (2, "timeouts.response_header", "got 0s"),
        (6, "limits.max_header_bytes", "got 100"),
        (11, "pools.api.health_check.jitter", "got 0.9"),
    ] {
        let want = format!("bad.toml:{line}:1: key `{key}`: ");
        let found = err.lines().any(|l| l.contains(&want) && l.contains(value));
        assert!(found, "check-config must list {want}... {value}:\n{err}");
    }
    assert!(
        !err.contains("timeouts.per_try"),
        "a check whose input is itself invalid is skipped:\n{err}"
    );
    // The daemon refuses the same file with the same list.
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["lb", "-c"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("limits.max_header_bytes"));
}

/// A backend that answers 200 to everything (health checks included), records every
/// request head it receives, and sends hop-by-hop headers of its own.
async fn capturing_backend() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let addr = serve_each(move |mut c| {
        let log = log.clone();
        async move {
            let mut buf = Vec::new();
            loop {
                let Some(head) = take_head(&mut c, &mut buf).await else {
                    return;
                };
                let head = head.to_ascii_lowercase();
                // Read a Content-Length body and record its length and byte sum.
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                let Some(body) = take_exact(&mut c, &mut buf, len).await else {
                    return;
                };
                log.lock().unwrap().push(format!(
                    "{head}body-bytes: {} sum: {}",
                    body.len(),
                    body.iter().map(|b| u64::from(*b)).sum::<u64>()
                ));
                let resp = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\
                                connection: keep-alive, x-internal\r\nkeep-alive: timeout=5\r\n\
                                x-internal: secret\r\nx-app: kept\r\n\r\nok";
                if c.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_are_added_and_hop_by_hop_headers_removed_both_ways() {
    let (addr, seen) = capturing_backend().await;
    let lb = Lb::start(&format!(
        "[pools.api]\ntargets = [{{ addr = \"{addr}\" }}]\n[pools.api.health_check]\n{FAST_CHECKS}"
    ))
    .await;
    lb.wait_all_in_service("api").await;
    let resp = raw(
        lb.port,
        b"GET /h?q=1 HTTP/1.1\r\nHost: app.example\r\nConnection: close, x-secret\r\n\
          X-Secret: 1\r\nTE: trailers\r\nProxy-Authorization: Basic eDp5\r\n\
          X-Forwarded-For: 10.0.0.1\r\nX-Custom: kept\r\n\r\n",
        None,
    )
    .await
    .to_ascii_lowercase();
    assert!(resp.starts_with("http/1.1 200"), "{resp}");
    assert!(
        resp.contains("x-app: kept") && resp.contains("via: 1.1 vigil"),
        "{resp}"
    );
    assert!(
        !resp.contains("x-internal") && !resp.contains("keep-alive: timeout"),
        "the target's hop-by-hop headers must not reach the client: {resp}"
    );
    let heads = seen.lock().unwrap().clone();
    let head = heads
        .iter()
        .find(|h| h.starts_with("get /h?q=1 http/1.1"))
        .unwrap_or_else(|| panic!("request not forwarded: {heads:?}"));
    for want in [
        "host: app.example",
        "x-forwarded-for: 10.0.0.1, 127.0.0.1",
        "x-forwarded-proto: http",
        "via: 1.1 vigil",
        "x-custom: kept",
    ] {
        assert!(head.contains(want), "missing {want:?} in {head}");
    }
    for gone in [
        "x-secret",
        "\r\nte:",
        "proxy-authorization",
        "connection: close",
    ] {
        assert!(
            !head.contains(gone),
            "{gone:?} must not be forwarded: {head}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_small_and_streamed_reach_the_target_intact() {
    let (addr, seen) = capturing_backend().await;
    let lb = Lb::start(&format!(
        "[pools.api]\ntargets = [{{ addr = \"{addr}\" }}]\n[pools.api.health_check]\n{FAST_CHECKS}"
    ))
    .await;
    lb.wait_all_in_service("api").await;
    // 10 bytes are buffered (retryable); 300 KiB exceed max_retry_body_bytes and stream.
    for (path, size) in [("/small", 10usize), ("/large", 300 * 1024)] {
        let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let sum: u64 = body.iter().map(|b| u64::from(*b)).sum();
        let r = lb
            .http
            .post(lb.url(path))
            .body(body)
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), 200, "{path}");
        let heads = seen.lock().unwrap().clone();
        let head = heads
            .iter()
            .find(|h| h.starts_with(&format!("post {path} ")))
            .unwrap_or_else(|| panic!("{path} not forwarded: {heads:?}"));
        assert!(
            head.ends_with(&format!("body-bytes: {size} sum: {sum}")),
            "{path}: body altered: {head}"
        );
    }
}

/// The `vigil lb` TOML block of the README's "The load balancer" section, for these
/// targets, without its listen addresses (the harness sets them).
fn readme_quick_start(targets: &[SocketAddr]) -> String {
    let readme = include_str!("../../../../README.md");
    let section = readme
        .split("### The load balancer")
        .nth(1)
        .expect("the README has a load balancer section");
    let block = section
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a TOML block in it");
    let mut toml: String = block
        .lines()
        .filter(|l| !l.starts_with("listen") && !l.starts_with("admin_listen"))
        .map(|l| format!("{l}\n"))
        .collect();
    for (i, t) in targets.iter().enumerate() {
        let placeholder = format!("10.0.0.{}:80", i + 1);
        assert!(toml.contains(&placeholder), "{toml}");
        toml = toml.replace(&placeholder, &t.to_string());
    }
    toml
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_serves_plain_web_servers() {
    let sites = [
        Backend::start_plain("site-1"),
        Backend::start_plain("site-2"),
    ];
    let config = readme_quick_start(&[sites[0].addr(), sites[1].addr()]);
    let lb = Lb::start(&config).await;
    lb.wait_all_in_service("api").await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let r = lb.http.get(lb.url("/")).send().await.expect("proxied");
        assert_eq!(r.status(), 200, "log:\n{}", lb.log());
        let body = r.text().await.unwrap();
        seen.extend(
            ["site-1", "site-2"]
                .into_iter()
                .filter(|s| body.contains(s)),
        );
    }
    assert_eq!(seen.len(), 2, "both sites serve");
    let log = lb.log();
    assert!(
        !log.contains("failing open") && !log.contains("ERROR"),
        "a healthy quick start logs no fail-open:\n{log}"
    );
}

#[test]
fn check_config_warns_when_a_target_answers_404_on_the_default_check_path() {
    let sites = [
        Backend::start_plain("site-1"),
        Backend::start_plain("site-2"),
    ];
    let service = Backend::start("svc");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lb.toml");
    std::fs::write(
        &config,
        format!(
            "[[routes]]\npath_prefix = \"/svc/\"\npool = \"svc\"\n[[routes]]\npath_prefix = \"/other/\"\npool = \"other\"\n[[routes]]\npool = \"site\"\n[pools.site]\ntargets = [{{ addr = \"{}\" }}, {{ addr = \"{}\" }}]\n[pools.svc]\ntargets = [{{ addr = \"{}\" }}]\n[pools.other]\ntargets = [{{ addr = \"{}\" }}]\nhealth_check.path = \"/x\"\n",
            sites[0].addr(),
            sites[1].addr(),
            service.addr(),
            sites[0].addr()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["lb", "check-config", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "a warning, not an error: {err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ok (3 pools, 4 targets, 3 routes)"),
        "{out:?}"
    );
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning:")).collect();
    assert_eq!(warnings.len(), 1, "only the plain sites on /readyz: {err}");
    assert!(
        warnings[0].contains("pool site: 2 of 2 targets")
            && warnings[0].contains("answer 404 to GET /readyz"),
        "{err}"
    );
    assert!(
        err.contains("[pools.site.health_check]\n  path = \"/\""),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_counts_every_target_and_a_404_on_the_default_path_says_why() {
    // A plain site fails its checks on /readyz (404) while the other target's first
    // check is still waiting for an answer: 1 unhealthy, 1 unknown.
    let site = Backend::start_plain("site");
    let frozen = Backend::start("frozen");
    frozen.set_health_mode(Mode::Freeze);
    let lb = Lb::start(&format!(
        "[pools.api]\n{}\n[pools.api.health_check]\ninterval = \"100ms\"\njitter = 0.0\ntimeout = \"60s\"\nunhealthy_threshold = 2\n",
        targets_toml(&[&site, &frozen])
    ))
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let line = loop {
        let log = lb.log();
        if let Some(l) = log.lines().find(|l| l.contains("failing open")) {
            break l.to_string();
        }
        assert!(Instant::now() < deadline, "no fail-open; log:\n{log}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert!(
        line.contains(
            "pool api: 0/2 healthy (1 not checked yet, left out of the fraction) < 50% panic threshold"
        ),
        "{line}"
    );
    let reason = lb.admin_targets().await["pools"]["api"]["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["addr"] == site.addr().to_string())
        .map(|t| {
            t["last_check"]["detail"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap();
    assert!(
        reason.starts_with("HTTP 404") && reason.contains("default health_check.path"),
        "{reason}"
    );
}

/// The first line of `lb`'s log that contains `what`, awaited (at most 20 s).
async fn log_line(lb: &Lb, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = lb.log();
        if let Some(l) = log.lines().find(|l| l.contains(what)) {
            return l.to_string();
        }
        assert!(Instant::now() < deadline, "no {what:?} in the log:\n{log}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_web_server_behind_a_minimal_config_is_served_with_a_warning_not_an_error() {
    // The smallest config a newcomer writes: targets, nothing else. The plain server
    // has no /readyz (404), so the pool fails open: served, and said at WARN with the
    // fix, because a 404 on the default path from every target is a missing setting.
    let site = Backend::start_plain("site");
    let lb = Lb::start(&format!("[pools.web]\n{}\n", targets_toml(&[&site]))).await;
    let line = log_line(&lb, "failing open").await;
    assert!(line.contains(" WARN "), "WARN, not ERROR: {line}");
    assert!(
        line.contains("404 on the default health_check.path") && line.contains("path = \"/\""),
        "the line says why and the fix: {line}"
    );
    let r = lb.http.get(lb.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200, "fail-open serves the site");
    let log = lb.log();
    assert!(!log.contains(" ERROR "), "nothing at ERROR:\n{log}");

    // The same server checked on a path the operator chose: a 404 there is a failure
    // like any other, and fail-open stays an ERROR.
    let lb = Lb::start(&format!(
        "[pools.web]\n{}\n[pools.web.health_check]\npath = \"/health\"\n",
        targets_toml(&[&site])
    ))
    .await;
    let line = log_line(&lb, "failing open").await;
    assert!(
        line.contains(" ERROR "),
        "an explicit path is not excused: {line}"
    );
    assert!(!line.contains("default health_check.path"), "{line}");
}

// The other files of this binary (one binary per component: a 2-core machine
// links a handful of test binaries, not one per file).
mod access_log;
mod edge;
mod front;
mod overload;
mod proto;
mod share;
