//! The worker gate on a real NATS JetStream (127.0.0.1:4222, running on every machine,
//! CI's included): a sick worker stops fetching and its peer takes the work, poison is
//! dead-lettered, and no message is ever lost.
#![cfg(feature = "nats")]

mod support;

use async_nats::jetstream::{self, consumer::pull, stream};
use futures::StreamExt;
use std::time::Duration;
use support::queue::{Behaviour, Ledger, PATIENCE, gated_worker, handler, until};
use tokio::sync::watch;
use vigil::Status;
use vigil::worker::FAILED_ON_HEADER;
use vigil::worker::nats::{NatsConfig, consume};
use vigil_core::gate::GateConfig;

const NATS: &str = "127.0.0.1:4222";

/// A fresh stream with a work subject and a dead-letter subject, deleted at the end.
struct Work {
    js: jetstream::Context,
    stream: String,
    subject: String,
    dead: String,
}

impl Work {
    async fn new(test: &str) -> Work {
        let client = async_nats::connect(NATS).await.unwrap_or_else(|e| {
            panic!("NATS must be reachable at {NATS} with JetStream (nats-server -js): {e}")
        });
        let js = jetstream::new(client);
        let stream = format!("vigil-test-{test}-{}", std::process::id());
        let _ = js.delete_stream(&stream).await;
        js.create_stream(stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{stream}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
        Work {
            subject: format!("{stream}.work"),
            dead: format!("{stream}.dead"),
            js,
            stream,
        }
    }

    async fn consumer(&self, name: &str, subject: &str) -> jetstream::consumer::PullConsumer {
        self.js
            .get_stream(&self.stream)
            .await
            .unwrap()
            .create_consumer(pull::Config {
                durable_name: Some(name.into()),
                filter_subject: subject.into(),
                ack_wait: Duration::from_secs(5),
                ..Default::default()
            })
            .await
            .unwrap()
    }

    async fn publish(&self, ids: impl IntoIterator<Item = String>) {
        for id in ids {
            self.js
                .publish(self.subject.clone(), id.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    }
}

struct Running {
    worker: vigil::worker::Worker,
    disk: support::Knob,
    _health: vigil::Health,
    task: tokio::task::JoinHandle<()>,
}

async fn start(work: &Work, id: &str, ledger: &Ledger, stop: &watch::Receiver<bool>) -> Running {
    let (worker, disk, health) = gated_worker(id, GateConfig::default()).await;
    let consumer = work.consumer("workers", &work.subject).await;
    let config = NatsConfig {
        dead_letter_subject: Some(work.dead.clone()),
        expires: Duration::from_millis(300),
        ..NatsConfig::default()
    };
    let (w, js, mut stop) = (worker.clone(), work.js.clone(), stop.clone());
    let handler = handler(
        Behaviour::Normal,
        ledger.clone(),
        disk.clone(),
        id.to_string(),
    );
    let task = tokio::spawn(async move {
        consume(&w, &js, &consumer, &config, handler, async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
        .expect("the consumer ends only on shutdown");
    });
    Running {
        worker,
        disk,
        _health: health,
        task,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sick_worker_stops_fetching_and_its_peer_takes_every_message() {
    let work = Work::new("sick").await;
    let ledger = Ledger::default();
    let (stop_tx, stop) = watch::channel(false);
    let a = start(&work, "a", &ledger, &stop).await;
    let b = start(&work, "b", &ledger, &stop).await;
    work.publish((0..100).map(|i| i.to_string())).await;
    until("both workers handled messages", || {
        ledger.done_by("a") > 0 && ledger.done_by("b") > 0
    })
    .await;
    a.disk.set(Status::Fail);
    let mut pulling = a.worker.pulling();
    tokio::time::timeout(PATIENCE, pulling.wait_for(|p| !*p))
        .await
        .expect("a sick worker must stop pulling")
        .unwrap();
    let (a_done, a_failed) = (ledger.done_by("a"), ledger.failures_of("a"));
    work.publish((100..300).map(|i| i.to_string())).await;
    until("every message is handled", || ledger.done() == 300).await;
    assert_eq!(
        ledger.done_by("a"),
        a_done,
        "a paused worker handles nothing"
    );
    assert!(
        ledger.failures_of("a") <= a_failed + 1,
        "a paused worker runs nothing more"
    );
    a.disk.set(Status::Pass);
    tokio::time::timeout(PATIENCE, pulling.wait_for(|p| *p))
        .await
        .expect("a healed worker pulls again")
        .unwrap();
    stop_tx.send_replace(true);
    for w in [a, b] {
        tokio::time::timeout(PATIENCE, w.task)
            .await
            .expect("consumers stop on shutdown")
            .unwrap();
    }
    let _ = work.js.delete_stream(&work.stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_failing_on_two_workers_is_dead_lettered_with_both_ids() {
    let work = Work::new("poison").await;
    let ledger = Ledger::default();
    let (stop_tx, stop) = watch::channel(false);
    let workers = [
        start(&work, "w1", &ledger, &stop).await,
        start(&work, "w2", &ledger, &stop).await,
    ];
    work.publish((0..50).map(|i| i.to_string()).chain(["poison".to_string()]))
        .await;
    until("the good messages are handled", || ledger.done() == 50).await;
    let dead = work.consumer("dead-reader", &work.dead).await;
    let mut batch = dead
        .fetch()
        .max_messages(5)
        .expires(PATIENCE)
        .messages()
        .await
        .unwrap();
    let m = tokio::time::timeout(PATIENCE, batch.next())
        .await
        .expect("the poison message is dead-lettered")
        .unwrap()
        .unwrap();
    assert_eq!(&m.payload[..], b"poison");
    let stamp = m
        .headers
        .as_ref()
        .and_then(|h| h.get(FAILED_ON_HEADER))
        .map(|v| v.as_str().to_string())
        .unwrap_or_default();
    let mut ids: Vec<&str> = stamp.split(',').collect();
    ids.sort();
    assert_eq!(ids, ["w1", "w2"], "the stamp names both workers");
    stop_tx.send_replace(true);
    for w in workers {
        assert!(w.worker.may_pull(), "one poison message pauses nobody");
        tokio::time::timeout(PATIENCE, w.task)
            .await
            .unwrap()
            .unwrap();
    }
    let _ = work.js.delete_stream(&work.stream).await;
}
