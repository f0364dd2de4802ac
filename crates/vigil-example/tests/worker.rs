//! The example worker on the machine's real brokers (RabbitMQ at 127.0.0.1:5672,
//! guest/guest, and NATS with JetStream at 127.0.0.1:4222, on every machine, CI's
//! included), its faults switched over real HTTP as an operator would: a worker whose
//! disk fails stops pulling and fails nothing; a black hole among its peers pauses itself
//! and every message is still processed, none lost (the broker holds none afterwards,
//! none dead-lettered); a naive worker keeps eating the queue. Each test runs once per
//! broker (`rabbitmq_*`, `nats_*`), through the same [`Broker`] layout the demo and the
//! benchmark use.

use std::time::{Duration, Instant};
use vigil_example::broker::Broker;
use vigil_example::worker::{Args, DEFAULT_AMQP, DEFAULT_NATS, Running, start};

async fn broker(url: &str) -> Broker {
    Broker::connect(url).await.unwrap_or_else(|e| {
        panic!(
            "the broker must be reachable at {url} (scripts/install-test-deps.sh checks it): {e:#}"
        )
    })
}

/// A fresh queue (and its `.dead`), named for the test and the process.
async fn fresh_queue(b: &Broker, test: &str) -> String {
    let q = format!("vigil-example-{test}-{}", std::process::id());
    let _ = b.delete(&q).await;
    b.declare(&q).await.unwrap();
    q
}

async fn publish(b: &Broker, q: &str, n: u32) {
    for i in 0..n {
        b.publish(q, i.to_string()).await.unwrap();
    }
}

/// Once every worker has stopped: nothing is left on the broker, nothing dead.
async fn nothing_left(b: &Broker, q: &str) {
    let (queued, dead) = b.depths(q).await.unwrap();
    assert_eq!((queued, dead), (0, 0), "messages left in {q} and {q}.dead");
}

fn args(url: &str, queue: &str, id: &str, naive: bool) -> Args {
    Args {
        broker: url.to_string(),
        listen: "127.0.0.1:0".parse().unwrap(),
        work_time: Duration::from_millis(20),
        check_interval: Duration::from_millis(200),
        naive,
        ..Args::new(queue, id)
    }
}

async fn post(w: &Running, path: &str) {
    let r = reqwest::Client::new()
        .post(format!("http://{}{path}", w.addr))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.status());
}

async fn report(w: &Running) -> serde_json::Value {
    reqwest::get(format!("http://{}/worker", w.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Waits until `cond` holds on the workers' reports, or panics after `within`.
async fn until(
    workers: &[&Running],
    within: Duration,
    what: &str,
    cond: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + within;
    loop {
        let mut reports = Vec::new();
        for w in workers {
            reports.push(report(w).await);
        }
        if cond(&reports) {
            return reports;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}: {reports:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sum(reports: &[serde_json::Value], key: &str) -> u64 {
    reports.iter().map(|r| r[key].as_u64().unwrap()).sum()
}

async fn a_worker_whose_disk_fails_stops_pulling_and_fails_nothing(url: &str) {
    let b = broker(url).await;
    let q = fresh_queue(&b, "disk").await;
    let sick = start(args(url, &q, "w-sick", false)).await.unwrap();
    let well = start(args(url, &q, "w-well", false)).await.unwrap();
    // Both pull once their first checks have run.
    until(
        &[&sick, &well],
        Duration::from_secs(10),
        "both workers pull",
        |r| r.iter().all(|r| r["pulling"] == true),
    )
    .await;
    post(&sick, "/fault/disk?on=true").await;
    // Its readiness fails within a check interval or two: it stops pulling.
    until(
        &[&sick],
        Duration::from_secs(10),
        "the sick worker stops pulling",
        |r| r[0]["pulling"] == false && r[0]["state"].as_str().unwrap().contains("fault injected"),
    )
    .await;
    let readyz = reqwest::get(format!("http://{}/readyz?verbose", sick.addr))
        .await
        .unwrap();
    let status = readyz.status();
    let body = readyz.text().await.unwrap();
    assert_eq!(status, 503, "its /readyz says why it stopped: {body}");
    publish(&b, &q, 60).await;
    let r = until(
        &[&sick, &well],
        Duration::from_secs(30),
        "every message processed",
        |r| sum(r, "processed") == 60,
    )
    .await;
    assert_eq!(r[0]["processed"], 0, "the sick worker took nothing: {r:#?}");
    assert_eq!(sum(&r, "failed"), 0, "nothing failed: {r:#?}");
    assert!(
        r[0]["state"].as_str().unwrap().contains("disk:free"),
        "{r:#?}"
    );
    assert!(body.contains("fault injected"), "{body}");
    // Healed, it pulls again.
    post(&sick, "/fault/reset").await;
    until(
        &[&sick],
        Duration::from_secs(10),
        "the healed worker pulls again",
        |r| r[0]["pulling"] == true,
    )
    .await;
    sick.stop().await.unwrap();
    well.stop().await.unwrap();
    nothing_left(&b, &q).await;
    b.delete(&q).await.unwrap();
}

async fn a_black_hole_pauses_itself_and_its_peers_process_every_message(url: &str) {
    let b = broker(url).await;
    let q = fresh_queue(&b, "black-hole").await;
    let hole = start(args(url, &q, "w-hole", false)).await.unwrap();
    let a = start(args(url, &q, "w-a", false)).await.unwrap();
    let bw = start(args(url, &q, "w-b", false)).await.unwrap();
    post(&hole, "/fault/black-hole?on=true").await;
    publish(&b, &q, 400).await;
    let r = until(
        &[&hole, &a, &bw],
        Duration::from_secs(60),
        "every message processed",
        |r| sum(r, "processed") == 400,
    )
    .await;
    // Every message ran to success on a peer; the black hole's failures went back to the
    // queue (stamped with its id only: not poison) and were redone.
    assert_eq!(r[0]["processed"], 0, "{r:#?}");
    assert_eq!(
        sum(&r, "dead_lettered"),
        0,
        "one sick worker makes no poison: {r:#?}"
    );
    let failed = r[0]["failed"].as_u64().unwrap();
    assert!(
        failed >= 100,
        "the kill switch needs 100 messages to judge: {r:#?}"
    );
    assert!(
        r[0]["state"].as_str().unwrap().contains("kill switch") && r[0]["pulling"] == false,
        "the black hole paused itself: {r:#?}"
    );
    // It failed far fewer messages than the 400 it would have eaten again and again.
    assert!(failed < 400, "{r:#?}");
    for w in [hole, a, bw] {
        w.stop().await.unwrap();
    }
    nothing_left(&b, &q).await;
    b.delete(&q).await.unwrap();
}

async fn a_naive_black_hole_never_pauses(url: &str) {
    let b = broker(url).await;
    let q = fresh_queue(&b, "naive").await;
    let hole = start(args(url, &q, "n-hole", true)).await.unwrap();
    let a = start(args(url, &q, "n-a", true)).await.unwrap();
    post(&hole, "/fault/black-hole?on=true").await;
    publish(&b, &q, 200).await;
    let r = until(
        &[&hole, &a],
        Duration::from_secs(60),
        "every message processed",
        |r| sum(r, "processed") == 200,
    )
    .await;
    assert_eq!(
        r[0]["pulling"], true,
        "nothing stops a naive worker: {r:#?}"
    );
    // Failing in 2 ms where its peer needs 20, it grabbed most deliveries.
    let failed = r[0]["failed"].as_u64().unwrap();
    assert!(
        failed > 200,
        "the naive black hole eats the queue again and again: {r:#?}"
    );
    for w in [hole, a] {
        w.stop().await.unwrap();
    }
    nothing_left(&b, &q).await;
    b.delete(&q).await.unwrap();
}

/// Each scenario once per broker.
macro_rules! on_both_brokers {
    ($($scenario:ident => $rabbit:ident, $nats:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $rabbit() {
            $scenario(DEFAULT_AMQP).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $nats() {
            $scenario(DEFAULT_NATS).await;
        }
    )*};
}

on_both_brokers! {
    a_worker_whose_disk_fails_stops_pulling_and_fails_nothing =>
        rabbitmq_a_worker_whose_disk_fails_stops_pulling_and_fails_nothing,
        nats_a_worker_whose_disk_fails_stops_pulling_and_fails_nothing;
    a_black_hole_pauses_itself_and_its_peers_process_every_message =>
        rabbitmq_a_black_hole_pauses_itself_and_its_peers_process_every_message,
        nats_a_black_hole_pauses_itself_and_its_peers_process_every_message;
    a_naive_black_hole_never_pauses =>
        rabbitmq_a_naive_black_hole_never_pauses,
        nats_a_naive_black_hole_never_pauses;
}
