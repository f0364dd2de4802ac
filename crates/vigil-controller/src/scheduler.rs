//! The probe scheduler: every target on its own interval with jitter, probes bounded by
//! a semaphore, heartbeat targets judged by the age of their last heartbeat.
//!
//! A heartbeat target's silence is evidence only once a whole TTL has passed since the
//! scheduler first knew it (added to the plan, or at start for the targets it already
//! had): before that it is pending, and no observation is sent. A worker that sends
//! every 30 s of a 1 h TTL must not be replaced in the controller's first second.
//!
//! One task holds a min-heap of due times over a slab of targets. Removed targets are
//! dropped lazily (their heap entries carry a slot and an epoch that no longer match). New targets get a random first
//! slot within one interval, so a fleet added at once is not probed at once.
//!
//! With several replicas it probes this replica's share only ([`Probing::probes`]):
//! a membership change replans, keeping the schedule of the targets still its own.

use crate::config::TargetConfig;
use crate::engine::{Command, Plan};
use crate::metrics::Metrics;
use crate::prober::{ProbeRecord, Prober};
use crate::probing::Probing;
use rand::Rng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, mpsc, watch};
use vigil_core::HealthReport;
use vigil_core::guard::Observation;

/// The last heartbeat of a push target.
#[derive(Clone, Debug)]
pub struct Beat {
    /// When it arrived.
    pub at: Instant,
    /// The health it carried, if any.
    pub report: Option<HealthReport>,
    /// Its signed timestamp (UNIX ms): the next one of this target must be later.
    pub signed_ms: i64,
    /// A queue worker's counters, if it sent them.
    pub worker: Option<crate::heartbeat::WorkerCounters>,
}

/// Heartbeats received, by target id (shared with the API).
#[derive(Default)]
pub struct Heartbeats(Mutex<HashMap<String, Beat>>);

impl Heartbeats {
    /// Records a verified heartbeat signed at `signed_ms`, unless it is not later than
    /// the last one recorded for the target (a replay): then nothing changes and this
    /// returns false. Checked and recorded under one lock, so two copies of one
    /// heartbeat sent at once cannot both pass.
    pub fn beat(
        &self,
        id: &str,
        signed_ms: i64,
        report: Option<HealthReport>,
        worker: Option<crate::heartbeat::WorkerCounters>,
    ) -> bool {
        let mut beats = self.0.lock().expect("heartbeat lock");
        if beats.get(id).is_some_and(|b| b.signed_ms >= signed_ms) {
            return false;
        }
        beats.insert(
            id.to_string(),
            Beat {
                at: Instant::now(),
                report,
                signed_ms,
                worker,
            },
        );
        true
    }

    fn get(&self, id: &str) -> Option<Beat> {
        self.0.lock().expect("heartbeat lock").get(id).cloned()
    }

    fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.0
            .lock()
            .expect("heartbeat lock")
            .retain(|k, _| keep(k));
    }
}

/// A scheduled target: its spec and an epoch, 16 bytes. The probe URL is built and
/// parsed at each probe (one allocation, which parsing keeps): a parsed `http::Uri`
/// kept per target would be 88 bytes and one more allocation for each.
struct Slot {
    spec: Arc<TargetConfig>,
    /// Tells this target's heap entries from those of a target that held the slot
    /// before it.
    epoch: u32,
}

/// The probe URI of a (non-heartbeat) target; None when it does not parse.
fn probe_uri(spec: &TargetConfig, path: &str) -> Option<http::Uri> {
    http::Uri::try_from(format!("{}{}", spec.url.trim_end_matches('/'), path)).ok()
}

/// A due probe in the heap: (due time as nanoseconds since the scheduler started, slot,
/// epoch), 16 bytes. Entries of removed or replaced targets are skipped when popped.
type Due = Reverse<(u64, u32, u32)>;

fn since(base: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
}

/// Runs the scheduler until `shutdown` flips or the engine is gone.
// The task's inputs, each its own channel or handle; a struct holding them would only
// be taken apart again on the first line.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    mut plan_rx: watch::Receiver<Arc<Plan>>,
    mut probing_rx: watch::Receiver<Arc<Probing>>,
    engine: mpsc::Sender<Command>,
    prober: Prober,
    heartbeats: Arc<Heartbeats>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
    tasks: tokio_util::task::TaskTracker,
) {
    let base = Instant::now();
    let mut slots: Vec<Option<Slot>> = Vec::new();
    let mut free: Vec<u32> = Vec::new();
    let mut heap: BinaryHeap<Due> = BinaryHeap::new();
    let mut epoch = 0u32;
    let mut plan = plan_rx.borrow_and_update().clone();
    let mut permits = Arc::new(Semaphore::new(plan.probe.concurrency));
    let mut replan = true;
    let mut probing_open = true;
    // When each heartbeat target of the plan was first known: the start of the TTL its
    // first heartbeat has (all of the plan, not only this replica's share, so a target
    // handed over from a replica is not given a new TTL).
    let mut known_since: HashMap<String, Instant> = HashMap::new();
    loop {
        if replan {
            replan = false;
            let now = Instant::now();
            let interval = plan.probe.interval;
            let by_id: HashMap<&str, usize> = plan
                .targets
                .iter()
                .enumerate()
                .map(|(i, t)| (t.id.as_str(), i))
                .collect();
            heartbeats.retain(|id| by_id.get(id).is_some_and(|&i| plan.targets[i].heartbeat));
            known_since.retain(|id, _| {
                by_id
                    .get(id.as_str())
                    .is_some_and(|&i| plan.targets[i].heartbeat)
            });
            for t in plan.targets.iter().filter(|t| t.heartbeat) {
                known_since.entry(t.id.clone()).or_insert(now);
            }
            // Several replicas share the probing: this one probes its share only.
            let mine: Vec<&Arc<TargetConfig>> = {
                let probing = probing_rx.borrow_and_update();
                plan.targets.iter().filter(|t| probing.probes(t)).collect()
            };
            let by_id: HashMap<&str, usize> = mine
                .iter()
                .enumerate()
                .map(|(i, t)| (t.id.as_str(), i))
                .collect();
            let mut kept = vec![false; mine.len()];
            for (si, slot) in slots.iter_mut().enumerate() {
                let Some(s) = slot else { continue };
                match by_id.get(s.spec.id.as_str()) {
                    Some(&ti) if !kept[ti] && **mine[ti] == *s.spec => {
                        // Same target: keep its schedule; the plan's copy is the live
                        // one.
                        kept[ti] = true;
                        s.spec = mine[ti].clone();
                    }
                    _ => {
                        // Removed or changed: its heap entries are skipped from now on.
                        *slot = None;
                        free.push(u32::try_from(si).expect("fewer than 2^32 targets"));
                    }
                }
            }
            for (t, _) in mine.iter().zip(&kept).filter(|(_, k)| !**k) {
                epoch = epoch.wrapping_add(1);
                let si = free.pop().unwrap_or_else(|| {
                    slots.push(None);
                    u32::try_from(slots.len() - 1).expect("fewer than 2^32 targets")
                });
                slots[si as usize] = Some(Slot {
                    spec: (*t).clone(),
                    epoch,
                });
                let first = now
                    + t.interval
                        .unwrap_or(interval)
                        .mul_f64(rand::rng().random_range(0.0..1.0));
                heap.push(Reverse((since(base, first), si, epoch)));
            }
            slots.shrink_to_fit();
        }
        let next_due = heap
            .peek()
            .map(|Reverse((due, _, _))| base + Duration::from_nanos(*due));
        let sleep = async {
            match next_due {
                Some(due) => tokio::time::sleep_until(due.into()).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            changed = probing_rx.changed(), if probing_open => {
                // Its sender gone (the engine stopping): the share stays as it is.
                probing_open = changed.is_ok();
                replan = true;
            }
            changed = plan_rx.changed() => {
                if changed.is_err() {
                    break;
                }
                let new = plan_rx.borrow_and_update().clone();
                if new.probe.concurrency != plan.probe.concurrency {
                    permits = Arc::new(Semaphore::new(new.probe.concurrency));
                }
                plan = new;
                replan = true;
            }
            _ = sleep => {
                let Some(Reverse((due, si, ep))) = heap.pop() else { continue };
                let Some(slot) = slots
                    .get(si as usize)
                    .and_then(Option::as_ref)
                    .filter(|s| s.epoch == ep)
                else {
                    continue; // removed or replaced
                };
                let spec = slot.spec.clone();
                let due = base + Duration::from_nanos(due);
                let now = Instant::now();
                metrics.lag(now.saturating_duration_since(due).as_secs_f64());
                let interval = spec.interval.unwrap_or(plan.probe.interval);
                let jitter = plan.probe.jitter * rand::rng().random_range(-1.0..=1.0);
                let start = if now > due + interval { now } else { due };
                heap.push(Reverse((since(base, start + interval.mul_f64(1.0 + jitter)), si, ep)));
                if spec.heartbeat {
                    let beat = heartbeats.get(&spec.id);
                    let known = known_since.get(&spec.id).copied().unwrap_or(base);
                    let Some((obs, record)) =
                        judge_heartbeat(&spec, beat.clone(), plan.heartbeat_ttl, known, now)
                    else {
                        continue; // pending: no heartbeat yet, and its first TTL not over
                    };
                    // A worker's counters count only while its heartbeat is fresh.
                    let worker = beat
                        .filter(|_| !obs.endpoint_failed)
                        .and_then(|b| b.worker.map(|w| w.seen()));
                    if engine.send(Command::Probe { id: spec.id.clone(), obs, record, worker }).await.is_err() {
                        break;
                    }
                    continue;
                }
                let uri = probe_uri(&spec, &plan.probe.path);
                // Bounded concurrency: wait for a slot (the lag metric shows when this bites).
                let permit = tokio::select! {
                    biased;
                    _ = shutdown.changed() => break,
                    p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                };
                let (prober, engine) = (prober.clone(), engine.clone());
                let (timeout, max_body, answers) =
                    (plan.probe.timeout, plan.probe.max_body, plan.probe.answers);
                tasks.spawn(async move {
                    let (obs, record) = match uri {
                        Some(uri) => prober.probe(&spec.id, &spec.zone, uri, timeout, max_body, answers).await,
                        None => Prober::bad_url(&spec.id, &spec.zone, &spec.url),
                    };
                    drop(permit);
                    // The engine is gone only at shutdown: the probe in flight is lost, by design.
                    let _ = engine.send(Command::Probe { id: spec.id.clone(), obs, record, worker: None }).await;
                });
            }
        }
    }
    tracing::debug!("scheduler stopped");
}

/// Judges a heartbeat target at `now` from its last heartbeat. None while it is pending:
/// no heartbeat yet and less than `ttl` since `known_since`, when the scheduler first
/// knew it (silence is no evidence before a heartbeat was due).
fn judge_heartbeat(
    spec: &TargetConfig,
    beat: Option<Beat>,
    ttl: Duration,
    known_since: Instant,
    now: Instant,
) -> Option<(Observation, ProbeRecord)> {
    let mut record = ProbeRecord {
        at_ms: crate::clock::wall_ms(),
        ok: false,
        duration_ms: 0.0,
        status: None,
        health: None,
        detail: String::new(),
    };
    let whole_secs = |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs()));
    let obs = match beat {
        None => {
            let silent = now.saturating_duration_since(known_since);
            if silent <= ttl {
                return None;
            }
            record.detail = format!(
                "no heartbeat received in the {} since the target was known (ttl {})",
                whole_secs(silent),
                humantime::format_duration(ttl)
            );
            Observation::endpoint_failure(&spec.id, &spec.zone)
        }
        Some(b) if now.saturating_duration_since(b.at) > ttl => {
            record.detail = format!(
                "no heartbeat for {} (ttl {})",
                whole_secs(now.saturating_duration_since(b.at)),
                humantime::format_duration(ttl)
            );
            Observation::endpoint_failure(&spec.id, &spec.zone)
        }
        Some(b) => match &b.report {
            Some(r) => {
                record.health = Some(r.status);
                let o = Observation::from_report(&spec.id, &spec.zone, r);
                if !o.failing_checks.is_empty() {
                    record.detail = format!("failing: {}", o.failing_checks.join(", "));
                }
                o
            }
            None => Observation::pass(&spec.id, &spec.zone),
        },
    };
    record.ok = obs.is_ok();
    Some((obs, record))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn worker() -> TargetConfig {
        TargetConfig {
            id: "worker-1".into(),
            url: String::new(),
            zone: "a".into(),
            group: "workers".into(),
            heartbeat: true,
            interval: None,
        }
    }

    fn beat_at(at: Instant) -> Beat {
        Beat {
            at,
            report: None,
            signed_ms: 1,
            worker: None,
        }
    }

    #[test]
    fn silence_is_no_evidence_before_the_first_ttl_has_passed() {
        let known = Instant::now();
        for after in [Duration::ZERO, Duration::from_millis(600), HOUR] {
            assert!(
                judge_heartbeat(&worker(), None, HOUR, known, known + after).is_none(),
                "a heartbeat target without a heartbeat {after:?} after it was known \
                 (ttl 1h) must be pending, not failing"
            );
        }
    }

    #[test]
    fn silence_fails_once_the_first_ttl_has_passed() {
        let known = Instant::now();
        let (obs, record) = judge_heartbeat(
            &worker(),
            None,
            HOUR,
            known,
            known + HOUR + Duration::from_secs(1),
        )
        .expect("a target silent for longer than its TTL is judged");
        assert!(obs.endpoint_failed, "silence past the TTL is a failure");
        assert!(!record.ok);
        assert!(
            record.detail.contains("no heartbeat received in the 1h 1s")
                && record.detail.contains("ttl 1h"),
            "the detail says how long and against which TTL: {}",
            record.detail
        );
    }

    #[test]
    fn a_heartbeat_is_judged_by_its_age_whenever_the_target_was_known() {
        let t0 = Instant::now();
        let known = t0 + HOUR; // the beat predates the target's first knowledge here
        let (obs, _) = judge_heartbeat(&worker(), Some(beat_at(t0)), HOUR, t0, t0 + HOUR / 2)
            .expect("a fresh heartbeat is an observation");
        assert!(obs.is_ok(), "a fresh heartbeat without a report passes");
        let (obs, record) = judge_heartbeat(
            &worker(),
            Some(beat_at(t0)),
            HOUR,
            known,
            t0 + HOUR + Duration::from_secs(5),
        )
        .expect("a stale heartbeat is an observation");
        assert!(obs.endpoint_failed, "a heartbeat older than the TTL fails");
        assert!(
            record.detail.contains("no heartbeat for 1h 5s"),
            "{}",
            record.detail
        );
    }
}
