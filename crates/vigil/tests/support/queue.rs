//! Shared by the queue-worker tests (RabbitMQ, NATS): a gated worker whose disk check
//! the test turns, a handler with a chosen behaviour, and a ledger of who did what.

use super::{Knob, fast};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vigil::worker::Worker;
use vigil::{Health, Status};
use vigil_core::gate::GateConfig;

/// Every wait is bounded: a broken gate fails the test instead of hanging it.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Which worker handled each message successfully, and how often each failed.
#[derive(Clone, Default)]
pub struct Ledger(pub Arc<Mutex<Ledger0>>);

#[derive(Default)]
pub struct Ledger0 {
    pub done: BTreeMap<u32, Vec<String>>,
    pub failures: BTreeMap<String, u32>,
}

impl Ledger {
    pub fn done(&self) -> usize {
        self.0.lock().unwrap().done.len()
    }
    pub fn failures_of(&self, worker: &str) -> u32 {
        self.0
            .lock()
            .unwrap()
            .failures
            .get(worker)
            .copied()
            .unwrap_or(0)
    }
    pub fn done_by(&self, worker: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .done
            .values()
            .filter(|w| w.iter().any(|x| x == worker))
            .count()
    }
}

/// How a test worker's handler behaves.
#[derive(Clone, Copy)]
pub enum Behaviour {
    /// Succeeds unless its disk is bad (or the message is "poison").
    Normal,
    /// Fails every message fast while its checks pass: a black hole.
    BlackHole,
}

/// A worker gated by a `disk:free` check the test turns (passing once this returns).
pub async fn gated_worker(id: &str, gate: GateConfig) -> (Worker, Knob, Health) {
    let disk = Knob::default();
    let health = Health::builder()
        .local("disk:free", disk.check(), fast())
        .start();
    let mut snapshots = health.subscribe();
    tokio::time::timeout(
        PATIENCE,
        snapshots.wait_for(|s| s.ready_now().status == Status::Pass),
    )
    .await
    .expect("the first checks pass")
    .expect("the health registry lives");
    let worker = Worker::start(id, &health, gate);
    (worker, disk, health)
}

/// A boxed message handler, as the adapters take it.
pub type HandlerFn = Box<
    dyn Fn(bytes::Bytes) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync,
>;

/// The handler of worker `id`: records successes and failures in the ledger.
pub fn handler(behaviour: Behaviour, ledger: Ledger, knob: Knob, id: String) -> HandlerFn {
    Box::new(move |payload: bytes::Bytes| {
        let (ledger, knob, id) = (ledger.clone(), knob.clone(), id.clone());
        Box::pin(async move {
            let msg = String::from_utf8_lossy(&payload).into_owned();
            tokio::time::sleep(Duration::from_millis(2)).await;
            let fail = match behaviour {
                Behaviour::BlackHole => Some("black hole"),
                Behaviour::Normal if knob.get() == Status::Fail => Some("disk full"),
                Behaviour::Normal if msg == "poison" => Some("cannot parse"),
                Behaviour::Normal => None,
            };
            let mut l = ledger.0.lock().unwrap();
            if let Some(why) = fail {
                *l.failures.entry(id.clone()).or_default() += 1;
                return Err(why.to_string());
            }
            l.done
                .entry(msg.parse().unwrap())
                .or_default()
                .push(id.clone());
            Ok(())
        })
    })
}

/// Waits (bounded) until `cond` holds.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
