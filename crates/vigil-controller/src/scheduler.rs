//! The probe scheduler: every target on its own interval with jitter, probes bounded by
//! a semaphore, heartbeat targets judged by the age of their last heartbeat.
//!
//! One task holds a min-heap of due times. Removed targets are dropped lazily (their
//! heap entries carry an epoch that no longer matches). New targets get a random first
//! slot within one interval, so a fleet added at once is not probed at once.

use crate::config::TargetConfig;
use crate::engine::{Command, Plan};
use crate::metrics::Metrics;
use crate::prober::{ProbeRecord, Prober};
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
}

/// Heartbeats received, by target id (shared with the API).
#[derive(Default)]
pub struct Heartbeats(Mutex<HashMap<String, Beat>>);

impl Heartbeats {
    /// Records a heartbeat.
    pub fn beat(&self, id: &str, report: Option<HealthReport>) {
        self.0.lock().expect("heartbeat lock").insert(
            id.to_string(),
            Beat {
                at: Instant::now(),
                report,
            },
        );
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

struct Entry {
    spec: Arc<TargetConfig>,
    /// The probe URL, parsed once per plan (None for heartbeat targets or a URL that
    /// does not parse: the probe then reports it).
    uri: Option<http::Uri>,
    epoch: u64,
}

fn probe_uri(spec: &TargetConfig, path: &str) -> Option<http::Uri> {
    if spec.heartbeat {
        return None;
    }
    format!("{}{}", spec.url.trim_end_matches('/'), path)
        .parse()
        .ok()
}

/// Runs the scheduler until `shutdown` flips or the engine is gone.
pub async fn run(
    mut plan_rx: watch::Receiver<Arc<Plan>>,
    engine: mpsc::Sender<Command>,
    prober: Prober,
    heartbeats: Arc<Heartbeats>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
    tasks: tokio_util::task::TaskTracker,
) {
    let mut entries: HashMap<String, Entry> = HashMap::new();
    let mut heap: BinaryHeap<Reverse<(Instant, u64, String)>> = BinaryHeap::new();
    let mut epoch = 0u64;
    let mut plan = plan_rx.borrow_and_update().clone();
    let mut permits = Arc::new(Semaphore::new(plan.probe.concurrency));
    let mut replan = true;
    loop {
        if replan {
            replan = false;
            let now = Instant::now();
            let interval = plan.probe.interval;
            let wanted: HashMap<&str, &TargetConfig> =
                plan.targets.iter().map(|t| (t.id.as_str(), &**t)).collect();
            entries.retain(|id, _| wanted.contains_key(id.as_str()));
            heartbeats.retain(|id| wanted.get(id).is_some_and(|t| t.heartbeat));
            for t in &plan.targets {
                if let Some(e) = entries.get_mut(&t.id)
                    && *e.spec == **t
                {
                    // Same target; the probe path may have changed with the plan.
                    e.uri = probe_uri(t, &plan.probe.path);
                    continue;
                }
                epoch += 1;
                let first = now
                    + t.interval
                        .unwrap_or(interval)
                        .mul_f64(rand::rng().random_range(0.0..1.0));
                entries.insert(
                    t.id.clone(),
                    Entry {
                        spec: t.clone(),
                        uri: probe_uri(t, &plan.probe.path),
                        epoch,
                    },
                );
                heap.push(Reverse((first, epoch, t.id.clone())));
            }
        }
        let next_due = heap.peek().map(|Reverse((due, _, _))| *due);
        let sleep = async {
            match next_due {
                Some(due) => tokio::time::sleep_until(due.into()).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
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
                let Some(Reverse((due, ep, id))) = heap.pop() else { continue };
                let Some(entry) = entries.get(&id).filter(|e| e.epoch == ep) else {
                    continue; // removed or replaced
                };
                let spec = entry.spec.clone();
                let uri = entry.uri.clone();
                let now = Instant::now();
                metrics.lag(now.saturating_duration_since(due).as_secs_f64());
                let interval = spec.interval.unwrap_or(plan.probe.interval);
                let jitter = plan.probe.jitter * rand::rng().random_range(-1.0..=1.0);
                let base = if now > due + interval { now } else { due };
                heap.push(Reverse((base + interval.mul_f64(1.0 + jitter), ep, id)));
                if spec.heartbeat {
                    let (obs, record) = judge_heartbeat(&spec, heartbeats.get(&spec.id), plan.heartbeat_ttl);
                    if engine.send(Command::Probe { id: spec.id.clone(), obs, record }).await.is_err() {
                        break;
                    }
                    continue;
                }
                // Bounded concurrency: wait for a slot (the lag metric shows when this bites).
                let permit = tokio::select! {
                    biased;
                    _ = shutdown.changed() => break,
                    p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                };
                let (prober, engine) = (prober.clone(), engine.clone());
                let (timeout, max_body) = (plan.probe.timeout, plan.probe.max_body);
                tasks.spawn(async move {
                    let (obs, record) = match uri {
                        Some(uri) => prober.probe(&spec.id, &spec.zone, uri, timeout, max_body).await,
                        None => Prober::bad_url(&spec.id, &spec.zone, &spec.url),
                    };
                    drop(permit);
                    // The engine is gone only at shutdown: the probe in flight is lost, by design.
                    let _ = engine.send(Command::Probe { id: spec.id.clone(), obs, record }).await;
                });
            }
        }
    }
    tracing::debug!("scheduler stopped");
}

fn judge_heartbeat(
    spec: &TargetConfig,
    beat: Option<Beat>,
    ttl: Duration,
) -> (Observation, ProbeRecord) {
    let mut record = ProbeRecord {
        at_ms: crate::clock::wall_ms(),
        ok: false,
        duration_ms: 0.0,
        status: None,
        health: None,
        detail: String::new(),
    };
    let obs = match beat {
        None => {
            record.detail = "no heartbeat received yet".into();
            Observation::endpoint_failure(&spec.id, &spec.zone)
        }
        Some(b) if b.at.elapsed() > ttl => {
            record.detail = format!(
                "no heartbeat for {} (ttl {})",
                humantime::format_duration(Duration::from_secs(b.at.elapsed().as_secs())),
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
    (obs, record)
}
