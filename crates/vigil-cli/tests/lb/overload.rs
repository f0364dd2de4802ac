//! Real-process tests of `vigil lb` under overload (issue 31): the deadline every
//! attempt carries, the retry throttle that stops retries when most attempts fail, and
//! the per-try timeout derived when none is set. The real binary, real loopback
//! targets (scripted ones that record what they were sent, vigil-testkit's backends),
//! real clients; every loop is bounded, every wait polls a condition.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use vigil_testkit::{Backend, Mode};

use crate::lb_support;
use lb_support::{LbProcess, serve_each, take_head};

/// The tables of a pool `api` whose targets are in service at once and never leave
/// it: no active checks, no ejection. What these tests look at is the data path alone.
const STILL_POOL: &str = "[pools.api.health_check]\nenabled = false\n\
    [pools.api.outlier]\nmax_ejection_percent = 0\n\
    [pools.api.outlier.success_rate]\nenabled = false\n";

fn targets(addrs: &[SocketAddr]) -> String {
    let items: Vec<String> = addrs
        .iter()
        .map(|a| format!("{{ addr = \"{a}\" }}"))
        .collect();
    format!("targets = [{}]", items.join(", "))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .expect("client")
}

async fn metrics(lb: &LbProcess) -> String {
    client()
        .get(format!("http://127.0.0.1:{}/metrics", lb.admin))
        .send()
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text")
}

/// The value of the sample of `metric` whose labels contain `labels` (0 when absent).
fn sample(text: &str, metric: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with('{'))
        .filter(|l| l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The value of field `name` in a lower-cased request head.
fn field<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
        .map(str::trim)
}

/// What a recording target saw: every request head, lower-cased, in arrival order.
type Heads = Arc<Mutex<Vec<String>>>;

/// A target that records every request head, then answers 200 (`answer`) or never
/// (the connection stays open: a frozen target).
async fn recording_target(answer: bool) -> (SocketAddr, Heads) {
    let heads: Heads = Arc::default();
    let log = heads.clone();
    let addr = serve_each(move |mut c| {
        let log = log.clone();
        async move {
            let mut buf = Vec::new();
            while let Some(head) = take_head(&mut c, &mut buf).await {
                log.lock().unwrap().push(head.to_ascii_lowercase());
                if !answer {
                    // Hold the connection until the balancer gives up on it.
                    while lb_support::fill(&mut c, &mut buf).await {}
                    return;
                }
                let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                if c.write_all(ok).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (addr, heads)
}

/// Sends a GET with `fields` (`name: value` lines) on a connection of its own; the
/// status, and how long it took.
async fn get(lb: &LbProcess, path: &str, fields: &[(&str, &str)]) -> (u16, Duration) {
    let mut req = client().get(format!("http://127.0.0.1:{}{path}", lb.port));
    for (n, v) in fields {
        req = req.header(*n, *v);
    }
    let start = Instant::now();
    let r = req.send().await.expect("the balancer answers");
    let code = r.status().as_u16();
    let _ = r.bytes().await;
    (code, start.elapsed())
}

/// (a) An attempt tells its target how long the balancer will still wait for it, and a
/// retry, sent when less of the client's wait is left, says less. One target is frozen
/// (records the request, never answers), the other answers: requests whose first try
/// lands on the frozen one go again after the 1.5 s per-try timeout, with what is left
/// of the 2 s response-header time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_carries_the_time_left_and_a_retry_carries_less() {
    let (frozen, frozen_heads) = recording_target(false).await;
    let (good, good_heads) = recording_target(true).await;
    let lb = LbProcess::start(&format!(
        "[timeouts]\nresponse_header = \"2s\"\nper_try = \"1500ms\"\n\
         [pools.api]\n{}\nbalance = \"round-robin\"\nslow_start_window = \"0s\"\n{STILL_POOL}",
        targets(&[frozen, good])
    ))
    .await;
    // Round-robin: within a few requests one starts on the frozen target.
    let mut retried = None;
    for i in 0..6 {
        let id = format!("r{i}");
        let (code, took) = get(&lb, "/x", &[("x-test-id", &id)]).await;
        assert_eq!(code, 200, "the retry answers request {id}");
        let mine = |heads: &Heads| {
            heads
                .lock()
                .unwrap()
                .iter()
                .find(|h| field(h, "x-test-id") == Some(&id))
                .cloned()
        };
        if let Some(first) = mine(&frozen_heads) {
            let second = mine(&good_heads).expect("the retry reached the other target");
            retried = Some((first, second, took));
            break;
        }
    }
    let (first, second, took) = retried.expect("a request started on the frozen target");
    let ms = |h: &str| -> u64 {
        field(h, "x-vigil-deadline-ms")
            .unwrap_or_else(|| panic!("no deadline in {h}"))
            .parse()
            .expect("whole milliseconds")
    };
    let (a, b) = (ms(&first), ms(&second));
    eprintln!("first try told {a} ms, the retry {b} ms; the request took {took:?}");
    assert!(
        (1400..=1500).contains(&a),
        "the first try is told its per-try time (1500 ms, less a hair): {a}"
    );
    assert!(
        b <= 500 && b + 300 >= 500 - 100,
        "the retry is told what is left of the 2 s header wait, about 500 ms: {b}"
    );
    assert!(b < a, "a retry carries less than the try before it");
    // A request that went straight to the answering target was told its per-try time.
    let direct = good_heads.lock().unwrap().first().cloned().unwrap();
    assert!(ms(&direct) <= 1500, "{direct}");
}

/// (a) A client's own deadline is stripped by default (the target sees the balancer's
/// alone, here the derived per-try time, 2 s / 3) and honoured with
/// `headers.deadline = "trust"`: the target gets the shorter, and the balancer itself
/// waits no longer than the client (a frozen target costs 504 at the client's deadline,
/// not at `response_header`). gRPC's `grpc-timeout` goes the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_deadline_is_stripped_by_default_and_honoured_when_trusted() {
    let (good, heads) = recording_target(true).await;
    let (frozen, _) = recording_target(false).await;
    let pools = format!(
        "[[routes]]\npath_prefix = \"/frozen\"\npool = \"frozen\"\n\
         [[routes]]\npool = \"api\"\n\
         [pools.frozen]\n{}\n\
         [pools.frozen.health_check]\nenabled = false\n\
         [pools.api]\n{}\nslow_start_window = \"0s\"\n{STILL_POOL}",
        targets(&[frozen]),
        targets(&[good])
    );
    let grpc = [
        ("content-type", "application/grpc"),
        ("grpc-timeout", "300m"),
        ("x-vigil-deadline-ms", "400"),
    ];
    let last = |heads: &Heads| heads.lock().unwrap().last().cloned().unwrap();

    let strip = LbProcess::start(&format!("[timeouts]\nresponse_header = \"2s\"\n{pools}")).await;
    get(&strip, "/x", &[("x-vigil-deadline-ms", "50")]).await;
    let h = last(&heads);
    assert_eq!(
        h.matches("x-vigil-deadline-ms").count(),
        1,
        "the client's field is not forwarded beside the balancer's: {h}"
    );
    let told: u64 = field(&h, "x-vigil-deadline-ms").unwrap().parse().unwrap();
    assert!(
        (600..=666).contains(&told),
        "by default the target sees the balancer's own deadline, the derived per-try time \
         2 s / (2 retries + 1): {told}"
    );
    get(&strip, "/x", &grpc).await;
    let h = last(&heads);
    let grpc_told = field(&h, "grpc-timeout").expect("gRPC requests carry grpc-timeout");
    assert_eq!(h.matches("grpc-timeout").count(), 1, "{h}");
    let grpc_ms: u64 = grpc_told.strip_suffix('m').unwrap().parse().unwrap();
    assert!(
        (600..=666).contains(&grpc_ms),
        "an untrusted client's grpc-timeout is replaced by the balancer's: {h}"
    );
    let (code, took) = get(&strip, "/frozen", &[("x-vigil-deadline-ms", "300")]).await;
    assert_eq!(code, 504);
    assert!(
        took >= Duration::from_millis(1900),
        "an untrusted deadline does not shorten the balancer's wait: {took:?}"
    );
    drop(strip);

    let trust = LbProcess::start(&format!(
        "[timeouts]\nresponse_header = \"2s\"\n[headers]\ndeadline = \"trust\"\n{pools}"
    ))
    .await;
    get(&trust, "/x", &[("x-vigil-deadline-ms", "250")]).await;
    let h = last(&heads);
    let told: u64 = field(&h, "x-vigil-deadline-ms").unwrap().parse().unwrap();
    assert!(
        (200..=250).contains(&told),
        "a trusted client's shorter deadline is passed on: {h}"
    );
    get(&trust, "/x", &grpc).await;
    let h = last(&heads);
    let told: u64 = field(&h, "x-vigil-deadline-ms").unwrap().parse().unwrap();
    let grpc_ms: u64 = field(&h, "grpc-timeout")
        .unwrap()
        .strip_suffix('m')
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (250..=300).contains(&told) && told == grpc_ms,
        "the shorter of the client's two deadlines (300 ms), in both fields: {h}"
    );
    let (code, took) = get(&trust, "/frozen", &[("x-vigil-deadline-ms", "300")]).await;
    eprintln!("a frozen target with a trusted 300 ms deadline: {code} after {took:?}");
    assert_eq!(code, 504);
    assert!(
        took < Duration::from_millis(1200),
        "the balancer waits no longer than the trusted client: {took:?}"
    );
    let m = metrics(&trust).await;
    assert!(
        sample(&m, "vigil_lb_timeouts_total", "kind=\"deadline\"") >= 1.0,
        "counted as the client's deadline: {m}"
    );
}

/// What a [`failing_target`] does with a request while failing.
#[derive(Clone, Copy)]
enum Failure {
    /// Closes the connection once the head is read.
    Reset,
    /// Answers 503 with `retry-after: 1`.
    Shed,
}

/// A target that fails every request while `failing` (a 200 after), counting each
/// request it sees.
async fn failing_target(
    hits: Arc<AtomicU64>,
    failing: Arc<AtomicBool>,
    how: Failure,
) -> SocketAddr {
    serve_each(move |mut c| {
        let (hits, failing) = (hits.clone(), failing.clone());
        async move {
            let mut buf = Vec::new();
            while take_head(&mut c, &mut buf).await.is_some() {
                hits.fetch_add(1, Ordering::SeqCst);
                let answer: &[u8] = match (failing.load(Ordering::SeqCst), how) {
                    (true, Failure::Reset) => return,
                    (true, Failure::Shed) => {
                        b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-length: 0\r\n\r\n"
                    }
                    (false, _) => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                };
                if c.write_all(answer).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

/// (b) Every target failing (two reset every request, one answers 503), the budget
/// made generous so that only the throttle can stop retries: the first requests are
/// retried, then the bucket drains (every attempt fails, none refills it) and each
/// client request costs the fleet exactly one attempt. The tokens gauge and the refusal
/// counter say so; once the targets answer again, successes refill the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_throttle_stops_retries_when_every_target_fails() {
    let hits = Arc::new(AtomicU64::new(0));
    let failing = Arc::new(AtomicBool::new(true));
    let addrs = [
        failing_target(hits.clone(), failing.clone(), Failure::Reset).await,
        failing_target(hits.clone(), failing.clone(), Failure::Reset).await,
        failing_target(hits.clone(), failing.clone(), Failure::Shed).await,
    ];
    let lb = LbProcess::start(&format!(
        "[pools.api]\n{}\nslow_start_window = \"0s\"\n\
         [pools.api.retries]\nmax_retries = 2\n\
         [pools.api.retries.budget]\nratio = 10.0\nmin_retries_per_second = 1000\n\
         {STILL_POOL}",
        targets(&addrs)
    ))
    .await;
    const REQUESTS: usize = 60;
    let mut per_request = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let before = hits.load(Ordering::SeqCst);
        let (code, _) = get(&lb, "/x", &[]).await;
        assert!(code == 502 || code == 503, "every target fails: {code}");
        per_request.push(hits.load(Ordering::SeqCst) - before);
    }
    eprintln!("attempts per client request: {per_request:?}");
    let early: u64 = per_request[..10].iter().sum();
    assert!(
        early > 10,
        "before the bucket drains, failed requests are retried: {per_request:?}"
    );
    // Ten tokens, retries while above five: at most five failed attempts before the
    // first refusal, whichever requests they belong to.
    let retries: u64 = per_request.iter().map(|n| n - 1).sum();
    assert!(
        retries <= 5,
        "the throttle allows retries only while the bucket is above half: {per_request:?}"
    );
    assert!(
        per_request[20..].iter().all(|&n| n == 1),
        "once drained, a client request costs one attempt: {per_request:?}"
    );
    let m = metrics(&lb).await;
    let tokens = sample(&m, "vigil_lb_retry_throttle_tokens", "pool=\"api\"");
    let refused = sample(&m, "vigil_lb_retries_throttled_total", "pool=\"api\"");
    let denied = sample(&m, "vigil_lb_retries_denied_total", "pool=\"api\"");
    eprintln!("tokens {tokens}, throttled {refused}, budget-denied {denied}");
    assert_eq!(
        tokens, 0.0,
        "every attempt failed: the bucket is empty\n{m}"
    );
    assert!(
        refused >= 10.0,
        "the refused retries are counted (about 2 in 3 first attempts reset): {m}"
    );
    assert_eq!(denied, 0.0, "the budget never had to refuse: {m}");

    // The targets recover: 51 successes (0.1 token each) take the bucket above half.
    failing.store(false, Ordering::SeqCst);
    for _ in 0..55 {
        let (code, _) = get(&lb, "/x", &[]).await;
        assert_eq!(code, 200);
    }
    let m = metrics(&lb).await;
    let tokens = sample(&m, "vigil_lb_retry_throttle_tokens", "pool=\"api\"");
    assert!(
        tokens > 5.0,
        "successes refill the bucket, and retries may go again: {tokens}\n{m}"
    );
}

/// A client request as the load saw it: its status (or the client's error), its time.
type Outcome = (Result<u16, String>, Duration);

/// (c) `response_header = "2s"` and no `per_try`: one of three targets freezes
/// (accepts, never answers, its health checks too) under steady GETs. The derived
/// per-try time (2 s / 3) lets every request caught on it go again to another target
/// before the client's wait is over: no client error, where an attempt given all of
/// `response_header` would be a 504 for each request caught there until the target is
/// out (three in a row for outlier detection, or the active checks' three failures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_a_frozen_target_costs_no_client_error_with_the_default_per_try() {
    let backends: Vec<Backend> = (0..3).map(|i| Backend::start(&format!("b{i}"))).collect();
    let addrs: Vec<SocketAddr> = backends.iter().map(Backend::addr).collect();
    let lb = LbProcess::start(&format!(
        "[timeouts]\nresponse_header = \"2s\"\n\
         [pools.api]\n{}\nslow_start_window = \"0s\"\n\
         [pools.api.health_check]\ninterval = \"500ms\"\ntimeout = \"400ms\"\n\
         healthy_threshold = 1\nunhealthy_threshold = 3\njitter = 0.0\n",
        targets(&addrs)
    ))
    .await;
    // Every target in service before the load starts.
    let http = client();
    let admin = format!("http://127.0.0.1:{}/admin/targets", lb.admin);
    let in_service = || async {
        let v: serde_json::Value = http.get(&admin).send().await.ok()?.json().await.ok()?;
        Some(
            v["pools"]["api"]["targets"]
                .as_array()?
                .iter()
                .filter(|t| matches!(t["state"].as_str(), Some("healthy" | "slow-start")))
                .count(),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_service().await != Some(3) {
        assert!(Instant::now() < deadline, "targets never came into service");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let results: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let url = format!("http://127.0.0.1:{}/work", lb.port);
    let load: Vec<_> = (0..6)
        .map(|_| {
            let (stop, results, http, url) =
                (stop.clone(), results.clone(), http.clone(), url.clone());
            tokio::spawn(async move {
                let end = Instant::now() + Duration::from_secs(30);
                while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                    let start = Instant::now();
                    let r = match http.get(&url).send().await {
                        Ok(r) => {
                            let code = r.status().as_u16();
                            r.bytes().await.map(|_| code).map_err(|e| e.to_string())
                        }
                        Err(e) => Err(e.to_string()),
                    };
                    results.lock().unwrap().push((r, start.elapsed()));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    backends[0].set_mode(Mode::Freeze);
    backends[0].set_health_mode(Mode::Freeze);
    let frozen = backends[0].addr().to_string();
    // Until the frozen target is out of service (its checks fail, or it is ejected),
    // then a little longer.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v: serde_json::Value = http.get(&admin).send().await.unwrap().json().await.unwrap();
        let out = v["pools"]["api"]["targets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| {
                t["addr"] == frozen.as_str()
                    && matches!(t["state"].as_str(), Some("unhealthy" | "ejected"))
            });
        if out {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the frozen target never left service: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.expect("load task");
    }
    let results = std::mem::take(&mut *results.lock().unwrap());
    let failed: Vec<_> = results.iter().filter(|(r, _)| *r != Ok(200)).collect();
    let slowest = results.iter().map(|(_, d)| *d).max().unwrap();
    let m = metrics(&lb).await;
    let timeouts_retried = sample(&m, "vigil_lb_retries_total", "reason=\"timeout\"");
    let per_try = sample(&m, "vigil_lb_timeouts_total", "kind=\"per_try\"");
    eprintln!(
        "{} requests, {} failed, slowest {slowest:?}; {per_try} per-try timeouts, \
         {timeouts_retried} retried",
        results.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "no client error: {failed:?}");
    assert!(
        per_try >= 1.0 && timeouts_retried >= 1.0,
        "requests were caught on the frozen target, timed out per try and went again: {m}"
    );
    assert!(
        slowest < Duration::from_millis(666 + 900),
        "the slowest request waited one derived per-try time and a retry (+ slack), \
         not the 2 s response_header: {slowest:?}"
    );
}

/// The derived per-try time is a cue to retry elsewhere, not a limit: a pool of one
/// target answering in 1 s, under `response_header = "2s"` and no `per_try` (a share of
/// 666 ms), still gets its answers, since no retry can go anywhere else; so does a pool
/// whose retries are all refused. Only an explicit `per_try` abandons an attempt that
/// has nowhere to go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_past_the_derived_per_try_time_is_awaited_when_no_retry_can_go() {
    let slow = Backend::start("slow");
    slow.set_mode(Mode::Delay(Duration::from_secs(1)));
    let config = |timeouts: &str| {
        format!(
            "[timeouts]\nresponse_header = \"2s\"\n{timeouts}\n\
             [pools.api]\n{}\nslow_start_window = \"0s\"\n{STILL_POOL}",
            targets(&[slow.addr()])
        )
    };
    let derived = LbProcess::start(&config("")).await;
    let (code, took) = get(&derived, "/x", &[]).await;
    eprintln!("derived per-try, one slow target: {code} after {took:?}");
    assert_eq!(code, 200, "answered after {took:?}");
    assert!(took >= Duration::from_millis(950), "{took:?}");
    drop(derived);

    let explicit = LbProcess::start(&config("per_try = \"500ms\"")).await;
    let (code, took) = get(&explicit, "/x", &[]).await;
    assert_eq!(
        code, 504,
        "an explicit per-try time is a limit ({took:?}): the test can tell the two apart"
    );
}

/// Opt-in local shedding (`[pools.api.throttle]`): with every target refusing (503),
/// the balancer soon answers most requests itself, at once, with 503 and
/// `Retry-After`, and forwards only a trickle (rejected requests count as requests, so
/// it keeps probing). Without the table nothing is shed: every request reaches a target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_asks_for_it_sheds_locally_when_its_targets_refuse_most_work() {
    let hits = Arc::new(AtomicU64::new(0));
    let refusing = Arc::new(AtomicBool::new(true));
    let addr = failing_target(hits.clone(), refusing.clone(), Failure::Shed).await;
    const REQUESTS: u64 = 100;
    let run = |lb: LbProcess| {
        let hits = hits.clone();
        async move {
            let before = hits.load(Ordering::SeqCst);
            for _ in 0..REQUESTS {
                let r = client()
                    .get(format!("http://127.0.0.1:{}/x", lb.port))
                    .send()
                    .await
                    .expect("the balancer answers");
                assert_eq!(r.status().as_u16(), 503);
                assert!(r.headers().contains_key("retry-after"), "{r:?}");
            }
            let m = metrics(&lb).await;
            (hits.load(Ordering::SeqCst) - before, m)
        }
    };
    let config = |extra: &str| {
        format!(
            "[pools.api]\n{}\nslow_start_window = \"0s\"\n{STILL_POOL}{extra}",
            targets(&[addr])
        )
    };
    let (forwarded, m) = run(LbProcess::start(&config("")).await).await;
    assert_eq!(
        forwarded, REQUESTS,
        "off by default: everything is forwarded"
    );
    assert_eq!(
        sample(&m, "vigil_lb_requests_shed_total", "pool=\"api\""),
        0.0
    );

    let (forwarded, m) =
        run(LbProcess::start(&config("[pools.api.throttle]\nk = 2.0\nwindow = \"1m\"\n")).await)
            .await;
    let shed = sample(&m, "vigil_lb_requests_shed_total", "pool=\"api\"");
    eprintln!("{forwarded} of {REQUESTS} forwarded, {shed} shed locally");
    assert_eq!(
        forwarded + shed as u64,
        REQUESTS,
        "each request forwarded or shed"
    );
    assert!(
        forwarded <= REQUESTS / 4,
        "with nothing accepted, most requests are shed: {forwarded} forwarded"
    );
}
