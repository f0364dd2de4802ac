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
//! Both stamp a failed message with the worker's id and what its failure says (header
//! [`FAILED_ON_HEADER`], see [`parse_failed_on`]) and with the time of the first failure
//! that pointed at the message ([`FAILED_SINCE_HEADER`]) when they send it back, so that
//! a message that failed on two different workers while they were otherwise succeeding
//! is recognised as poison and dead-lettered (rule 3 of [`vigil_core::gate`]), while
//! failures that follow one worker are that worker's problem and failures every worker
//! shares (a dependency down for all) are nobody's message's. The counters a heartbeat reports
//! (processed, failed, in flight, the age of the oldest message in flight) are in
//! [`Worker::report`]; the liveness of the process never depends on the broker.

use crate::health::Health;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use vigil_core::Time;
/// The gate's policy types, re-exported so a worker needs no direct vigil-core dependency.
pub use vigil_core::gate::{Disposition, Evidence, FailedOn, GateConfig, KillSwitchConfig};
use vigil_core::gate::{GateChange, WorkerGate};

#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;

/// The message header that lists the workers a message failed on: comma-separated ids,
/// each followed by `;failing` when that worker was failing other messages too (its
/// failure says nothing about the message). See [`parse_failed_on`].
pub const FAILED_ON_HEADER: &str = "x-vigil-failed-on";

/// The message header with the time of the first failure that pointed at the message
/// (a worker otherwise succeeding failed it), in milliseconds since the Unix epoch: the
/// gate dead-letters only `poison_after` later.
pub const FAILED_SINCE_HEADER: &str = "x-vigil-failed-since";

/// Most entries a [`FAILED_ON_HEADER`] keeps: more than any worker pool a message goes
/// round, so a corrupt or hostile header cannot grow without bound.
pub const MAX_FAILED_ON: usize = 64;

/// The qualifier of an entry whose worker was failing other messages too.
const FAILING: &str = "failing";

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
    /// before (with no time: see [`Worker::failed_stamped`]). Returns where it goes.
    pub fn failed(&self, ticket: Ticket, failed_on: &[FailedOn<'_>]) -> Disposition {
        let stamp = Stamp {
            failed_on: failed_on.to_vec(),
            since_ms: None,
        };
        self.failed_stamped(ticket, &stamp).disposition
    }

    /// The message failed; `stamp` is what its headers said. Returns where it goes and
    /// the headers to write when it is sent on (the adapters carry it out).
    pub fn failed_stamped(&self, ticket: Ticket, stamp: &Stamp<'_>) -> Restamp {
        self.inner.lock_in_flight().remove(&ticket.0);
        self.inner.failed.fetch_add(1, Ordering::Relaxed);
        let now = self.inner.now();
        let now_ms = unix_ms(SystemTime::now());
        let witnessed_for = stamp.witnessed_for(now_ms);
        let (disposition, change) = self.inner.lock_gate().message_failed(
            now,
            &self.inner.id,
            &stamp.failed_on,
            witnessed_for,
        );
        self.inner.apply(change);
        match disposition {
            Disposition::DeadLetter { .. } => &self.inner.dead_lettered,
            Disposition::Requeue { .. } => &self.inner.requeued,
        }
        .fetch_add(1, Ordering::Relaxed);
        stamp.after(&self.inner.id, disposition, now_ms)
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
        let observed = tokio::select! {
            changed = snapshots.changed(), if health_alive => match changed {
                Ok(()) => {
                    let snapshot = snapshots.borrow_and_update();
                    Some((verdict(&snapshot), dependency_verdict(&snapshot)))
                }
                Err(_) => {
                    // The health registry is gone: nothing vouches for the host any more.
                    health_alive = false;
                    Some((Err("health checks stopped".to_string()), None))
                }
            },
            _ = tick.tick() => None,
        };
        let Some(inner) = inner.upgrade() else { return };
        let now = inner.now();
        let changes = {
            let mut gate = inner.lock_gate();
            match observed {
                Some((ready, deps)) => {
                    let a = gate.observe_readiness(now, ready);
                    // The dependency checks end a shared kill-switch pause (rule 4).
                    let b = deps.and_then(|d| gate.observe_dependencies(now, d));
                    let c = gate.tick(now);
                    [a, b, c]
                }
                None => [gate.tick(now), None, None],
            }
        };
        for change in changes {
            inner.apply(change);
        }
    }
}

/// The verdict of a snapshot's dependency checks (its `/health` checks beyond
/// readiness): `Err` naming what fails, `None` when it has none.
fn dependency_verdict(snapshot: &crate::snapshot::Snapshot) -> Option<Result<(), String>> {
    let ready = &snapshot.ready_now().checks;
    let full = snapshot.full_now();
    let deps: Vec<(&String, &Vec<vigil_core::CheckResult>)> = full
        .checks
        .iter()
        .filter(|(name, _)| !ready.contains_key(*name))
        .collect();
    if deps.is_empty() {
        return None;
    }
    let failing: Vec<&str> = deps
        .iter()
        .filter(|(_, results)| results.iter().any(|r| r.status == vigil_core::Status::Fail))
        .map(|(name, _)| name.as_str())
        .collect();
    Some(if failing.is_empty() {
        Ok(())
    } else {
        Err(failing.join(", "))
    })
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

/// What a message's headers say about its past failures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stamp<'a> {
    /// The workers it failed on ([`FAILED_ON_HEADER`]).
    pub failed_on: Vec<FailedOn<'a>>,
    /// When the first failure that pointed at it happened ([`FAILED_SINCE_HEADER`]),
    /// milliseconds since the Unix epoch.
    pub since_ms: Option<u64>,
}

/// Where a failed message goes, and its headers when it is sent on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restamp {
    /// Where it goes.
    pub disposition: Disposition,
    /// The new [`FAILED_ON_HEADER`] value (for a requeue with a stamp, and for the dead
    /// letter: who failed it).
    pub failed_on: String,
    /// The new [`FAILED_SINCE_HEADER`] value, if any (absent: write it empty).
    pub failed_since: Option<String>,
}

impl<'a> Stamp<'a> {
    /// Parses the two headers (absent: `None`). Never fails: see [`parse_failed_on`]
    /// and [`parse_failed_since`].
    pub fn parse(failed_on: Option<&'a str>, failed_since: Option<&str>) -> Self {
        Stamp {
            failed_on: failed_on.map(parse_failed_on).unwrap_or_default(),
            since_ms: failed_since.and_then(parse_failed_since),
        }
    }

    /// How long ago, at `now_ms`, the first failure that pointed at the message was:
    /// `None` when no entry points at the message, or the time is missing or in the
    /// future (a clock ahead of ours, or a corrupt value): counted from now.
    pub fn witnessed_for(&self, now_ms: u64) -> Option<Duration> {
        if !self
            .failed_on
            .iter()
            .any(|f| f.evidence == Evidence::Message)
        {
            return None;
        }
        self.since_ms
            .filter(|&t| t <= now_ms)
            .map(|t| Duration::from_millis(now_ms - t))
    }

    /// The headers after worker `me` failed the message at `now_ms` with `disposition`.
    pub fn after(&self, me: &str, disposition: Disposition, now_ms: u64) -> Restamp {
        let evidence = match disposition {
            Disposition::Requeue { stamp: None } => None,
            Disposition::Requeue { stamp: Some(e) } => Some(e),
            Disposition::DeadLetter { .. } => Some(Evidence::Message),
        };
        let mut failed_on = self.failed_on.clone();
        if let Some(evidence) = evidence {
            match failed_on.iter_mut().find(|f| f.worker == me) {
                // The strongest evidence a worker gave stays.
                Some(f) if evidence == Evidence::Message => f.evidence = evidence,
                Some(_) => {}
                None => {
                    if failed_on.len() >= MAX_FAILED_ON {
                        failed_on.remove(0);
                    }
                    failed_on.push(FailedOn {
                        worker: me,
                        evidence,
                    });
                }
            }
        }
        let since = match self.witnessed_for(now_ms) {
            Some(ago) => Some(now_ms - ago.as_millis() as u64),
            None if failed_on.iter().any(|f| f.evidence == Evidence::Message) => Some(now_ms),
            None => None,
        };
        Restamp {
            disposition,
            failed_on: format_failed_on(&failed_on),
            failed_since: since.map(|t| t.to_string()),
        }
    }
}

/// Parses a [`FAILED_ON_HEADER`] value: comma-separated entries, each a worker id
/// (its failure pointed at the message; what every entry meant before the qualifier
/// existed) or `id;failing` (its worker was failing other messages too). Never fails:
/// blanks around entries are ignored, empty entries and empty ids are skipped, an entry
/// with any other qualifier counts as `failing` (it never counts toward poison: a
/// header this version cannot read must not dead-letter a message), a second entry for
/// an id keeps the stronger evidence, and at most [`MAX_FAILED_ON`] entries are read.
pub fn parse_failed_on(value: &str) -> Vec<FailedOn<'_>> {
    let mut out: Vec<FailedOn<'_>> = Vec::new();
    for entry in value.split(',') {
        let entry = entry.trim();
        let (worker, evidence) = match entry.split_once(';') {
            None => (entry, Evidence::Message),
            Some((id, _qualifier)) => (id.trim(), Evidence::Worker),
        };
        if worker.is_empty() {
            continue;
        }
        if let Some(f) = out.iter_mut().find(|f| f.worker == worker) {
            if evidence == Evidence::Message {
                f.evidence = evidence;
            }
        } else if out.len() < MAX_FAILED_ON {
            out.push(FailedOn { worker, evidence });
        }
    }
    out
}

/// Parses a [`FAILED_SINCE_HEADER`] value (milliseconds since the Unix epoch); anything
/// else is `None`: the time is then counted from now, so a corrupt value can delay a
/// poison message's dead-lettering by `poison_after`, never hasten it.
pub fn parse_failed_since(value: &str) -> Option<u64> {
    value.trim().parse().ok()
}

/// Formats entries as a [`FAILED_ON_HEADER`] value.
pub fn format_failed_on(entries: &[FailedOn<'_>]) -> String {
    let mut out = String::new();
    for (i, f) in entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(f.worker);
        if f.evidence == Evidence::Worker {
            out.push(';');
            out.push_str(FAILING);
        }
    }
    out
}

/// Milliseconds since the Unix epoch (0 for a clock before it).
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn m(worker: &str) -> FailedOn<'_> {
        FailedOn::message(worker)
    }

    fn w(worker: &str) -> FailedOn<'_> {
        FailedOn {
            worker,
            evidence: Evidence::Worker,
        }
    }

    #[test]
    fn stamps_accumulate_distinct_ids_with_their_evidence() {
        assert_eq!(parse_failed_on(" a, b,,"), vec![m("a"), m("b")]);
        assert_eq!(parse_failed_on("a;failing,b"), vec![w("a"), m("b")]);
        assert_eq!(
            parse_failed_on("a;failing,a"),
            vec![m("a")],
            "the stronger evidence of an id stays"
        );
        assert_eq!(
            parse_failed_on("a;what,;failing, ; ,b ; failing"),
            vec![w("a"), w("b")],
            "an unknown qualifier never counts toward poison; empty ids are skipped"
        );
        assert_eq!(format_failed_on(&[m("a"), w("b")]), "a,b;failing");
        let stamp = Stamp::parse(Some("a"), None);
        let r = stamp.after(
            "b",
            Disposition::Requeue {
                stamp: Some(Evidence::Worker),
            },
            1_000,
        );
        assert_eq!(r.failed_on, "a,b;failing");
        assert_eq!(
            r.failed_since.as_deref(),
            Some("1000"),
            "an old stamp without a time is counted from now"
        );
        let r = Stamp::parse(Some("a;failing"), None).after(
            "a",
            Disposition::Requeue {
                stamp: Some(Evidence::Message),
            },
            2_000,
        );
        assert_eq!(
            r.failed_on, "a",
            "a worker's stronger evidence replaces its weaker"
        );
        assert_eq!(r.failed_since.as_deref(), Some("2000"));
        let r = Stamp::parse(None, None).after("a", Disposition::Requeue { stamp: None }, 5);
        assert_eq!((r.failed_on.as_str(), r.failed_since), ("", None));
    }

    #[test]
    fn the_first_witnessed_failure_time_is_kept_and_a_bad_one_counts_from_now() {
        let s = Stamp::parse(Some("a"), Some("1000"));
        assert_eq!(s.witnessed_for(6_000), Some(Duration::from_secs(5)));
        let r = s.after("b", Disposition::DeadLetter { workers: 2 }, 6_000);
        assert_eq!(
            (r.failed_on.as_str(), r.failed_since.as_deref()),
            ("a,b", Some("1000"))
        );
        for bad in ["", "soon", "-5", "1e3", "99999999999999999999"] {
            assert_eq!(
                Stamp::parse(Some("a"), Some(bad)).witnessed_for(6_000),
                None,
                "{bad:?}"
            );
        }
        let future = Stamp::parse(Some("a"), Some("9000"));
        assert_eq!(
            future.witnessed_for(6_000),
            None,
            "a time ahead of ours: from now"
        );
        let r = future.after(
            "b",
            Disposition::Requeue {
                stamp: Some(Evidence::Message),
            },
            6_000,
        );
        assert_eq!(r.failed_since.as_deref(), Some("6000"), "rewritten to now");
        assert_eq!(
            Stamp::parse(Some("a;failing"), Some("1000")).witnessed_for(6_000),
            None,
            "a time with no failure pointing at the message means nothing"
        );
    }

    proptest! {
        /// Any header, however corrupt: parsing never panics, keeps at most
        /// MAX_FAILED_ON distinct non-empty ids, and what it writes back parses to the
        /// same entries (nothing read is lost on the way round).
        #[test]
        fn any_header_parses_and_round_trips(value in ".{0,300}", since in ".{0,30}", me in "[a-z0-9-]{1,8}") {
            let stamp = Stamp::parse(Some(&value), Some(&since));
            prop_assert!(stamp.failed_on.len() <= MAX_FAILED_ON);
            let mut ids: Vec<&str> = stamp.failed_on.iter().map(|f| f.worker).collect();
            ids.sort_unstable();
            ids.dedup();
            prop_assert_eq!(ids.len(), stamp.failed_on.len());
            prop_assert!(ids.iter().all(|id| !id.is_empty()));
            let r = stamp.after(&me, Disposition::Requeue { stamp: Some(Evidence::Worker) }, 10_000);
            let again = parse_failed_on(&r.failed_on);
            prop_assert!(again.iter().any(|f| f.worker == me.as_str()));
            for f in &stamp.failed_on {
                if !f.worker.contains(',') && !f.worker.contains(';') && again.len() < MAX_FAILED_ON {
                    prop_assert!(again.iter().any(|g| g.worker == f.worker), "{} lost", f.worker);
                }
            }
        }
    }
}
