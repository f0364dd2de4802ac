//! The worker gate on a real RabbitMQ (127.0.0.1:5672, guest/guest, running on every
//! machine, CI's included): a sick worker stops pulling and its peer takes the work, a
//! black hole pauses itself, poison is dead-lettered, and no message is ever lost.
#![cfg(feature = "rabbitmq")]

mod support;

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::time::Duration;
use support::Knob;
use support::queue::{Behaviour, Ledger, PATIENCE, gated_worker, handler, until};
use tokio::sync::watch;
use vigil::worker::rabbitmq::{RabbitConfig, consume};
use vigil::worker::{FAILED_ON_HEADER, Worker};
use vigil::{Health, Status};
use vigil_core::gate::GateConfig;

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

async fn connect() -> Connection {
    Connection::connect(AMQP, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ must be reachable at {AMQP} (start it with `rabbitmq-server -detached`): {e}"))
}

/// A fresh queue (and its dead-letter queue), deleted when the test ends.
struct Queues {
    name: String,
    dlq: String,
    channel: Channel,
}

impl Queues {
    async fn new(conn: &Connection, test: &str) -> Queues {
        let name = format!("vigil-test-{test}-{}", std::process::id());
        let dlq = format!("{name}-dead");
        let channel = conn.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        for q in [&name, &dlq] {
            let _ = channel
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
            channel
                .queue_declare(
                    q.as_str().into(),
                    QueueDeclareOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
        Queues { name, dlq, channel }
    }

    async fn publish(&self, ids: std::ops::Range<u32>) {
        for id in ids {
            self.channel
                .basic_publish(
                    "".into(),
                    self.name.as_str().into(),
                    BasicPublishOptions::default(),
                    id.to_string().as_bytes(),
                    BasicProperties::default(),
                )
                .await
                .unwrap()
                .await
                .unwrap();
        }
    }

    async fn dead_letters(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while let Some(m) = self
            .channel
            .basic_get(self.dlq.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            let stamp = m
                .delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get(FAILED_ON_HEADER).cloned())
                .map(|v| match v {
                    AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            out.push((
                String::from_utf8_lossy(&m.delivery.data).into_owned(),
                stamp,
            ));
        }
        out
    }

    async fn cleanup(&self) {
        for q in [&self.name, &self.dlq] {
            let _ = self
                .channel
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
}

/// A worker with a `disk:free` check the test turns, consuming the queue until `stop`.
struct TestWorker {
    worker: Worker,
    disk: Knob,
    _health: Health,
    task: tokio::task::JoinHandle<()>,
}

async fn start_worker(
    conn: &Connection,
    q: &Queues,
    id: &str,
    gate: GateConfig,
    behaviour: Behaviour,
    ledger: Ledger,
    stop: watch::Receiver<bool>,
) -> TestWorker {
    let (worker, disk, health) = gated_worker(id, gate).await;
    let channel = conn.create_channel().await.unwrap();
    let mut config = RabbitConfig::new(q.name.clone());
    config.dead_letter_queue = Some(q.dlq.clone());
    let (w, knob, id) = (worker.clone(), disk.clone(), id.to_string());
    let task = tokio::spawn(async move {
        let handler = handler(behaviour, ledger, knob, id);
        let mut stop = stop;
        consume(&w, &channel, &config, handler, async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
        .expect("the consumer ends only on shutdown");
    });
    TestWorker {
        worker,
        disk,
        _health: health,
        task,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sick_worker_stops_pulling_and_its_peer_takes_every_message() {
    let conn = connect().await;
    let q = Queues::new(&conn, "sick").await;
    let ledger = Ledger::default();
    let (stop_tx, stop) = watch::channel(false);
    let a = start_worker(
        &conn,
        &q,
        "a",
        GateConfig::default(),
        Behaviour::Normal,
        ledger.clone(),
        stop.clone(),
    )
    .await;
    let b = start_worker(
        &conn,
        &q,
        "b",
        GateConfig::default(),
        Behaviour::Normal,
        ledger.clone(),
        stop.clone(),
    )
    .await;
    q.publish(0..100).await;
    until("both workers handled messages", || {
        ledger.done_by("a") > 0 && ledger.done_by("b") > 0
    })
    .await;

    // a's disk fills: its gate closes at the next readiness check.
    a.disk.set(Status::Fail);
    let mut pulling = a.worker.pulling();
    tokio::time::timeout(PATIENCE, pulling.wait_for(|p| !*p))
        .await
        .expect("a sick worker must stop pulling")
        .unwrap();
    assert!(
        a.worker.report().state.contains("disk:free"),
        "{:?}",
        a.worker.report()
    );
    let a_done = ledger.done_by("a");
    q.publish(100..300).await;
    until("every message is handled", || ledger.done() == 300).await;
    assert_eq!(
        ledger.done_by("a"),
        a_done,
        "a paused worker handles nothing"
    );
    assert!(
        q.dead_letters().await.is_empty(),
        "nothing is dead-lettered for a sick worker"
    );

    // Healed: two passing checks and it pulls again.
    a.disk.set(Status::Pass);
    tokio::time::timeout(PATIENCE, pulling.wait_for(|p| *p))
        .await
        .expect("a healed worker pulls again")
        .unwrap();
    q.publish(300..400).await;
    until("the rest is handled", || ledger.done() == 400).await;
    assert!(ledger.done_by("a") > a_done, "a took work again");

    stop_tx.send_replace(true);
    for w in [a, b] {
        tokio::time::timeout(PATIENCE, w.task)
            .await
            .expect("consumers stop on shutdown")
            .unwrap();
    }
    assert_eq!(ledger.done(), 400, "no message lost");
    q.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_pauses_itself_and_its_failures_are_redone_by_peers() {
    let conn = connect().await;
    let q = Queues::new(&conn, "blackhole").await;
    let ledger = Ledger::default();
    let (stop_tx, stop) = watch::channel(false);
    let mut gate = GateConfig::default();
    gate.kill_switch.min_messages = 20;
    let hole = start_worker(
        &conn,
        &q,
        "hole",
        gate.clone(),
        Behaviour::BlackHole,
        ledger.clone(),
        stop.clone(),
    )
    .await;
    let good = start_worker(
        &conn,
        &q,
        "good",
        gate,
        Behaviour::Normal,
        ledger.clone(),
        stop.clone(),
    )
    .await;
    q.publish(0..300).await;
    until("every message is handled", || ledger.done() == 300).await;
    let report = hole.worker.report();
    assert!(
        !report.pulling && report.state.contains("kill switch"),
        "the black hole must pause itself: {report:?}"
    );
    assert!(report.failed >= 20, "{report:?}");
    assert_eq!(
        report.dead_lettered, 0,
        "one worker failing a message does not make it poison"
    );
    assert!(q.dead_letters().await.is_empty());
    assert_eq!(ledger.done_by("hole"), 0);
    stop_tx.send_replace(true);
    for w in [hole, good] {
        tokio::time::timeout(PATIENCE, w.task)
            .await
            .unwrap()
            .unwrap();
    }
    q.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_failing_on_two_workers_is_dead_lettered_with_both_ids() {
    let conn = connect().await;
    let q = Queues::new(&conn, "poison").await;
    let ledger = Ledger::default();
    let (stop_tx, stop) = watch::channel(false);
    let workers = [
        start_worker(
            &conn,
            &q,
            "w1",
            GateConfig::default(),
            Behaviour::Normal,
            ledger.clone(),
            stop.clone(),
        )
        .await,
        start_worker(
            &conn,
            &q,
            "w2",
            GateConfig::default(),
            Behaviour::Normal,
            ledger.clone(),
            stop.clone(),
        )
        .await,
    ];
    q.publish(0..50).await;
    q.channel
        .basic_publish(
            "".into(),
            q.name.as_str().into(),
            BasicPublishOptions::default(),
            b"poison",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    until("the good messages are handled", || ledger.done() == 50).await;
    let mut dead = Vec::new();
    let start = tokio::time::Instant::now();
    while dead.is_empty() {
        assert!(
            start.elapsed() < PATIENCE,
            "the poison message must be dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        dead = q.dead_letters().await;
    }
    assert_eq!(dead.len(), 1);
    let (body, stamp) = &dead[0];
    assert_eq!(body, "poison");
    let mut ids: Vec<&str> = stamp.split(',').collect();
    ids.sort();
    assert_eq!(ids, ["w1", "w2"], "the stamp names both workers");
    for w in &workers {
        assert!(w.worker.may_pull(), "one poison message pauses nobody");
    }
    stop_tx.send_replace(true);
    for w in workers {
        tokio::time::timeout(PATIENCE, w.task)
            .await
            .unwrap()
            .unwrap();
    }
    q.cleanup().await;
}
