//! The example worker on the machine's real RabbitMQ (127.0.0.1:5672, guest/guest, on
//! every machine, CI's included), its faults switched over real HTTP as an operator would:
//! a worker whose disk fails stops pulling and fails nothing; a black hole among its peers
//! pauses itself and every message is still processed, none lost; a naive worker keeps
//! eating the queue.

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::time::{Duration, Instant};
use vigil_example::worker::{Args, DEFAULT_AMQP, Running, start};

async fn channel() -> (Connection, Channel) {
    let conn = Connection::connect(DEFAULT_AMQP, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| {
            panic!("RabbitMQ must be reachable at {DEFAULT_AMQP} (scripts/install-test-deps.sh checks it): {e}")
        });
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    (conn, ch)
}

/// A fresh durable queue and its `.dead` queue, named for the test and the process.
async fn fresh_queue(ch: &Channel, test: &str) -> String {
    let q = format!("vigil-example-{test}-{}", std::process::id());
    for name in [q.clone(), format!("{q}.dead")] {
        let _ = ch
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
        ch.queue_declare(
            name.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    q
}

async fn delete_queue(ch: &Channel, q: &str) {
    for name in [q.to_string(), format!("{q}.dead")] {
        let _ = ch
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
}

async fn publish(ch: &Channel, q: &str, n: u32) {
    for i in 0..n {
        ch.basic_publish(
            "".into(),
            q.into(),
            BasicPublishOptions::default(),
            i.to_string().as_bytes(),
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
}

fn args(queue: &str, id: &str, naive: bool) -> Args {
    Args {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_disk_fails_stops_pulling_and_fails_nothing() {
    let (_conn, ch) = channel().await;
    let q = fresh_queue(&ch, "disk").await;
    let sick = start(args(&q, "w-sick", false)).await.unwrap();
    let well = start(args(&q, "w-well", false)).await.unwrap();
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
    publish(&ch, &q, 60).await;
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
    delete_queue(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_pauses_itself_and_its_peers_process_every_message() {
    let (_conn, ch) = channel().await;
    let q = fresh_queue(&ch, "black-hole").await;
    let hole = start(args(&q, "w-hole", false)).await.unwrap();
    let a = start(args(&q, "w-a", false)).await.unwrap();
    let b = start(args(&q, "w-b", false)).await.unwrap();
    post(&hole, "/fault/black-hole?on=true").await;
    publish(&ch, &q, 400).await;
    let r = until(
        &[&hole, &a, &b],
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
    for w in [hole, a, b] {
        w.stop().await.unwrap();
    }
    delete_queue(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_naive_black_hole_never_pauses() {
    let (_conn, ch) = channel().await;
    let q = fresh_queue(&ch, "naive").await;
    let hole = start(args(&q, "n-hole", true)).await.unwrap();
    let a = start(args(&q, "n-a", true)).await.unwrap();
    post(&hole, "/fault/black-hole?on=true").await;
    publish(&ch, &q, 200).await;
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
    delete_queue(&ch, &q).await;
}
