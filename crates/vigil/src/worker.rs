//! Queue-worker health: a worker pulls only while its host is well, pauses itself when it
//! fails everything, and sends back what it cannot handle instead of failing it.
//!
//! A worker that polls a queue has no load balancer to take it out of service, and a sick
//! one fails fast, so it pulls *more* than its healthy peers. [`Worker`] wraps the policy
//! [`vigil_core::gate::WorkerGate`] (the rules are numbered in its docs) with the service's
//! [`Health`]: every published health snapshot feeds the gate its local readiness (the
//! `/readyz` verdict: disk, fds, memory, the watchdog, and the lifecycle, so a draining
//! service stops pulling too), and the broker adapters ask it whether to pull and where a
//! failed message goes:
//!
//! - [`rabbitmq`] (feature `rabbitmq`, lapin): consumes while the gate is open, cancels
//!   the consumer when it closes and sends the deliveries it still holds back to the queue;
//! - [`nats`] (feature `nats`, async-nats): fetches JetStream batches only while the gate
//!   is open; what it holds when the gate closes is NAKed with a delay.
//!
//! Both stamp a failed message with the worker's id (header [`FAILED_ON_HEADER`],
//! comma-separated ids) when they send it back, so that a message that failed on two
//! different workers is recognised as poison and dead-lettered, while failures that
//! follow one worker are that worker's problem. The counters a heartbeat reports
//! (processed, failed, in flight, the age of the oldest message in flight) are in
//! [`Worker::report`]; the liveness of the process never depends on the broker.

use crate::health::Health;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use vigil_core::Time;
/// The gate's policy types, re-exported so a worker needs no direct vigil-core dependency.
pub use vigil_core::gate::{Disposition, GateConfig, KillSwitchConfig};
use vigil_core::gate::{GateChange, WorkerGate};

#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;

/// The message header that lists the workers a message failed on (comma-separated ids).
pub const FAILED_ON_HEADER: &str = "x-vigil-failed-on";

/// How often the gate's timers (the kill switch's pause) are advanced.
const TICK_EVERY: Duration = Duration::from_secs(1);

/// A queue worker's gate and counters, shared by its consumer loop and its heartbeats.
/// Cheap to clone.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

struct Inner {
    id: String,
    epoch: Instant,
    gate: Mutex<WorkerGate>,
    pulling: watch::Sender<bool>,
    processed: AtomicU64,
    failed: AtomicU64,
    requeued: AtomicU64,
    dead_lettered: AtomicU64,
    next_ticket: AtomicU64,
    in_flight: Mutex<BTreeMap<u64, Instant>>,
}

/// A message being processed; hand it back to [`Worker::succeeded`] or [`Worker::failed`].
#[must_use = "a ticket counts a message in flight until it is handed back"]
#[derive(Debug)]
pub struct Ticket(u64);

/// What a worker reports about itself (in heartbeats and logs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkerReport {
    /// The worker's id.
    pub id: String,
    /// Whether it pulls now.
    pub pulling: bool,
    /// Its gate, in words (`pulling`, `paused: local readiness fails (disk:free ...)`).
    pub state: String,
    /// Messages handled successfully since start.
    pub processed: u64,
    /// Messages that failed since start.
    pub failed: u64,
    /// Messages sent back to the queue (failed and stamped, or held when it paused).
    pub requeued: u64,
    /// Messages dead-lettered as poison.
    pub dead_lettered: u64,
    /// Messages in flight now.
    pub in_flight: u64,
    /// Age of the oldest message in flight, in milliseconds (0 when none): a worker whose
    /// oldest message keeps ageing is stuck, even if it still answers.
    pub oldest_in_flight_ms: u64,
}

impl Worker {
    /// Starts a worker's gate on the service's health: every new health snapshot feeds
    /// the gate its readiness. Must be called within a tokio runtime; the task it spawns
    /// ends when the last clone of the worker is dropped. `config` should have passed
    /// [`GateConfig::validate`].
    pub fn start(id: impl Into<String>, health: &Health, config: GateConfig) -> Worker {
        let epoch = Instant::now();
        let (pulling, _) = watch::channel(true);
        let inner = Arc::new(Inner {
            id: id.into(),
            epoch,
            gate: Mutex::new(WorkerGate::new(config, Time::ZERO)),
            pulling,
            processed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            requeued: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            next_ticket: AtomicU64::new(0),
            in_flight: Mutex::new(BTreeMap::new()),
        });
        tokio::spawn(drive(Arc::downgrade(&inner), health.subscribe()));
        Worker { inner }
    }

    /// The worker's id (what it stamps on messages it failed).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// True when the worker may pull messages now.
    pub fn may_pull(&self) -> bool {
        *self.inner.pulling.borrow()
    }

    /// A receiver that sees every change of [`Worker::may_pull`].
    pub fn pulling(&self) -> watch::Receiver<bool> {
        self.inner.pulling.subscribe()
    }

    /// Counts a message in flight.
    pub fn begin(&self) -> Ticket {
        let n = self.inner.next_ticket.fetch_add(1, Ordering::Relaxed);
        self.inner.lock_in_flight().insert(n, Instant::now());
        Ticket(n)
    }

    /// The message succeeded.
    pub fn succeeded(&self, ticket: Ticket) {
        self.inner.lock_in_flight().remove(&ticket.0);
        self.inner.processed.fetch_add(1, Ordering::Relaxed);
        let now = self.inner.now();
        let change = self.inner.lock_gate().record(now, true);
        self.inner.apply(change);
    }

    /// The message failed; `failed_on` lists the workers its stamp says it failed on
    /// before. Returns where it goes (the adapters carry it out).
    pub fn failed(&self, ticket: Ticket, failed_on: &[&str]) -> Disposition {
        self.inner.lock_in_flight().remove(&ticket.0);
        self.inner.failed.fetch_add(1, Ordering::Relaxed);
        let now = self.inner.now();
        let (change, disposition) = {
            let mut gate = self.inner.lock_gate();
            // Judged before this failure counts: a worker that turned sick while it held
            // the message sends it back unstamped.
            let disposition = gate.on_failure(&self.inner.id, failed_on);
            (gate.record(now, false), disposition)
        };
        self.inner.apply(change);
        match disposition {
            Disposition::DeadLetter { .. } => &self.inner.dead_lettered,
            Disposition::Requeue { .. } => &self.inner.requeued,
        }
        .fetch_add(1, Ordering::Relaxed);
        disposition
    }

    /// A message it held was sent back unprocessed (the gate closed before its turn).
    pub fn returned(&self, ticket: Ticket) {
        self.inner.lock_in_flight().remove(&ticket.0);
        self.inner.requeued.fetch_add(1, Ordering::Relaxed);
    }

    /// Its counters and state, for a heartbeat.
    pub fn report(&self) -> WorkerReport {
        let oldest = self
            .inner
            .lock_in_flight()
            .values()
            .min()
            .map(|t| t.elapsed())
            .unwrap_or_default();
        WorkerReport {
            id: self.inner.id.clone(),
            pulling: self.may_pull(),
            state: self.inner.lock_gate().to_string(),
            processed: self.inner.processed.load(Ordering::Relaxed),
            failed: self.inner.failed.load(Ordering::Relaxed),
            requeued: self.inner.requeued.load(Ordering::Relaxed),
            dead_lettered: self.inner.dead_lettered.load(Ordering::Relaxed),
            in_flight: self.inner.lock_in_flight().len() as u64,
            oldest_in_flight_ms: u64::try_from(oldest.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl Inner {
    fn now(&self) -> Time {
        Time::from_elapsed(self.epoch.elapsed())
    }

    fn lock_gate(&self) -> MutexGuard<'_, WorkerGate> {
        // A panic while holding the lock leaves the gate in a valid state (every method
        // finishes its update before returning), so a poisoned lock is still usable.
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_in_flight(&self) -> MutexGuard<'_, BTreeMap<u64, Instant>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes a change of the gate and logs why.
    fn apply(&self, change: Option<GateChange>) {
        let Some(change) = change else { return };
        match &change {
            GateChange::Paused(why) => {
                tracing::warn!(worker = %self.id, reason = %why, "worker stops pulling")
            }
            GateChange::Resumed { probation } => {
                tracing::info!(worker = %self.id, probation, "worker pulls again")
            }
        }
        self.pulling
            .send_replace(matches!(change, GateChange::Resumed { .. }));
    }
}

/// Feeds the gate every readiness verdict and ticks its timers, until the worker is gone.
async fn drive(inner: Weak<Inner>, mut snapshots: watch::Receiver<Arc<crate::snapshot::Snapshot>>) {
    let mut tick = tokio::time::interval(TICK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut health_alive = true;
    loop {
        let readiness = tokio::select! {
            changed = snapshots.changed(), if health_alive => match changed {
                Ok(()) => Some(verdict(&snapshots.borrow_and_update())),
                Err(_) => {
                    // The health registry is gone: nothing vouches for the host any more.
                    health_alive = false;
                    Some(Err("health checks stopped".to_string()))
                }
            },
            _ = tick.tick() => None,
        };
        let Some(inner) = inner.upgrade() else { return };
        let now = inner.now();
        let change = {
            let mut gate = inner.lock_gate();
            match readiness {
                Some(r) => gate.observe_readiness(now, r).or_else(|| gate.tick(now)),
                None => gate.tick(now),
            }
        };
        inner.apply(change);
    }
}

/// The readiness verdict of a snapshot: `Err` naming what fails.
fn verdict(snapshot: &crate::snapshot::Snapshot) -> Result<(), String> {
    let report = snapshot.ready_now();
    if report.status != vigil_core::Status::Fail {
        return Ok(());
    }
    let failing: Vec<String> = report
        .checks
        .iter()
        .filter(|(_, results)| results.iter().any(|r| r.status == vigil_core::Status::Fail))
        .map(
            |(name, results)| match results.iter().find_map(|r| r.output.as_deref()) {
                Some(out) if !out.is_empty() => format!("{name}: {out}"),
                _ => name.clone(),
            },
        )
        .collect();
    Err(if failing.is_empty() {
        report.output.clone().unwrap_or_else(|| "not ready".into())
    } else {
        failing.join(", ")
    })
}

/// Waits until the gate is open; false when `shutdown` completed first (or the worker
/// is gone). The adapters' loops start every round with it.
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
async fn until_pulling<S: std::future::Future<Output = ()>>(
    pulling: &mut watch::Receiver<bool>,
    mut shutdown: std::pin::Pin<&mut S>,
) -> bool {
    while !*pulling.borrow_and_update() {
        tokio::select! {
            _ = &mut shutdown => return false,
            changed = pulling.changed() => if changed.is_err() { return false },
        }
    }
    true
}

/// Splits a [`FAILED_ON_HEADER`] value into worker ids.
pub fn parse_failed_on(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// The [`FAILED_ON_HEADER`] value after this worker failed the message.
pub fn stamp_failed_on(previous: &[&str], me: &str) -> String {
    let mut ids: Vec<&str> = previous.to_vec();
    if !ids.contains(&me) {
        ids.push(me);
    }
    ids.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_accumulate_distinct_ids() {
        assert_eq!(parse_failed_on(" a, b,,"), vec!["a", "b"]);
        assert_eq!(stamp_failed_on(&["a"], "b"), "a,b");
        assert_eq!(stamp_failed_on(&["a", "b"], "a"), "a,b");
        assert_eq!(stamp_failed_on(&[], "a"), "a");
    }
}
