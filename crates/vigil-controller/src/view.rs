//! The fleet as readers see it: an immutable snapshot the engine publishes, which the
//! API and the dashboard read without ever asking the engine.
//!
//! ## Why a published snapshot
//!
//! The engine is one task: it feeds every probe result to the guard. When each API read
//! asked it for a view of the whole fleet (every target with its probe history), two
//! clients looping on `GET /api/targets` at 10,000 targets kept it busy building views:
//! probing fell from ~6,800 to ~1,600 probes/s, results queued past their timeouts
//! (489 false probe failures in 25 s), and the views' garbage left RSS at 4-6x.
//!
//! Now the engine builds one compact [`FleetView`] (no probe history, the targets'
//! strings shared with the engine's own records) at most every
//! [`PUBLISH_EVERY`](crate::engine::PUBLISH_EVERY) while anything changed (within
//! 50 ms of a decision), and at once after an operator's command is committed (so a
//! client reads its own writes), and
//! swaps it into an [`ArcSwap`] (as the `vigil` library publishes health snapshots).
//! Readers load the current `Arc` (lock-free, never blocking the engine) and
//! filter, page and serialise on their own tasks, so the engine's cost is one view per
//! period however many read. The one-target view with its history
//! (`GET /api/targets/{id}`) is still asked of the engine: one target's worth of work.
//!
//! A target's state, its severity and its meaning are vigil-core's [`Standing`],
//! defined once: the API validates `?state=` against it, the dashboard sorts and
//! explains with it, `vigil deploy` reads it back.

use crate::config::TargetConfig;
use crate::prober::ProbeRecord;
use arc_swap::ArcSwap;
use serde::{Serialize, Serializer};
use std::sync::Arc;
use std::time::Duration;
use vigil_core::HealthState;
use vigil_core::fleet::Standing;
use vigil_core::guard::HoldKind;

/// The published views: the engine stores, readers load.
#[derive(Clone)]
pub struct FleetViews(Arc<ArcSwap<FleetView>>);

impl FleetViews {
    /// Starts with `first`.
    pub fn new(first: FleetView) -> FleetViews {
        FleetViews(Arc::new(ArcSwap::from_pointee(first)))
    }

    /// The latest view (lock-free; hold it briefly: an old view stays alive while held).
    pub fn load(&self) -> Arc<FleetView> {
        self.0.load_full()
    }

    /// Publishes `view`.
    pub fn store(&self, view: Arc<FleetView>) {
        self.0.store(view);
    }
}

/// The fleet at a moment, for the API and dashboard.
#[derive(Clone, Debug, Serialize)]
pub struct FleetView {
    /// When (UNIX ms).
    pub now_ms: i64,
    /// The guard.
    pub guard: GuardView,
    /// Every target, by id.
    pub targets: Vec<TargetInfo>,
    /// Targets per standing, every standing listed (in [`Standing::ALL`] order).
    #[serde(serialize_with = "counts_as_map")]
    pub counts: Vec<(Standing, usize)>,
    /// Recent guard events (freezes, flapping), newest last.
    pub events: Vec<EventInfo>,
    /// The store cannot commit (its last error): no action is taken until it can.
    pub store_error: Option<String>,
    /// Each queue worker's standing among the peers of its group (`vigil_core::anomaly`),
    /// by target id; absent when no heartbeat carries worker counters.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<vigil_core::anomaly::MemberVerdict>,
    /// Answers already serialised from this view, by query.
    #[serde(skip)]
    pub answers: AnswerCache,
}

/// Most bytes of answers kept per view: a whole walk of 10,000 targets in pages of
/// 1,000 (about 3.9 MB) fits.
const CACHED_BYTES: usize = 4 << 20;

/// Answers serialised from one view, by query: readers asking the same thing of the
/// same view (dashboards, scripts polling faster than the view changes, several
/// clients walking the fleet) cost one serialisation per view, not one per read. Dies
/// with its view; a new view starts empty.
#[derive(Default)]
pub struct AnswerCache(std::sync::Mutex<(usize, Vec<(String, bytes::Bytes)>)>);

impl AnswerCache {
    /// The answer to `key`, made by `make` (outside the lock) if not kept yet; kept
    /// while the cache holds under `CACHED_BYTES`.
    pub fn get_or_make(&self, key: &str, make: impl FnOnce() -> bytes::Bytes) -> bytes::Bytes {
        let found = {
            let kept = self.0.lock().expect("answer cache lock");
            kept.1
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, b)| b.clone())
        };
        if let Some(b) = found {
            return b;
        }
        let made = make();
        let mut kept = self.0.lock().expect("answer cache lock");
        if kept.0 + made.len() <= CACHED_BYTES && !kept.1.iter().any(|(k, _)| k == key) {
            kept.0 += made.len();
            kept.1.push((key.to_string(), made.clone()));
        }
        made
    }
}

impl Clone for AnswerCache {
    /// Empty: a copy of a view is a new view.
    fn clone(&self) -> AnswerCache {
        AnswerCache::default()
    }
}

impl std::fmt::Debug for AnswerCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnswerCache")
    }
}

impl FleetView {
    /// No target, nothing known yet (until the engine publishes its first view).
    pub fn empty() -> FleetView {
        FleetView {
            now_ms: 0,
            guard: GuardView::default(),
            targets: Vec::new(),
            counts: Self::count_states(&[]),
            events: Vec::new(),
            store_error: None,
            workers: Vec::new(),
            answers: AnswerCache::default(),
        }
    }

    /// How many targets are in `state`.
    pub fn count(&self, state: Standing) -> usize {
        self.counts
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    }

    /// Per-state counts of `targets`, every state listed.
    pub fn count_states(targets: &[TargetInfo]) -> Vec<(Standing, usize)> {
        let mut counts: Vec<(Standing, usize)> = Standing::ALL.iter().map(|s| (*s, 0)).collect();
        for t in targets {
            counts[t.state.severity()].1 += 1;
        }
        counts
    }
}

/// Per-state counts as a JSON object, states in [`Standing::ALL`] order.
pub fn counts_as_map<S: Serializer>(counts: &[(Standing, usize)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(counts.iter().map(|(k, v)| (k.name(), v)))
}

/// A guard event, for display.
#[derive(Clone, Debug, Serialize)]
pub struct EventInfo {
    /// When (UNIX ms).
    pub at_ms: i64,
    /// What happened, in words.
    pub message: String,
}

/// The guard's state, for display.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GuardView {
    /// The whole fleet frozen (automatically or manually).
    pub frozen: bool,
    /// Zones frozen.
    pub frozen_zones: Vec<String>,
    /// Why, in words.
    pub reasons: Vec<String>,
    /// Why, structured.
    pub reasons_detail: Vec<vigil_core::guard::Reason>,
    /// An operator freeze's reason.
    pub manual_freeze: Option<String>,
    /// Tokens left.
    pub budget_left: u32,
    /// Tokens per window.
    pub budget_actions: u32,
    /// The window.
    #[serde(with = "humantime_serde")]
    pub budget_per: Duration,
    /// When the next token returns (UNIX ms), if none is left.
    pub next_token_at_ms: Option<i64>,
    /// Unhealthy targets counted.
    pub unhealthy: u32,
    /// Targets counted.
    pub total: u32,
    /// Cohorts of queue workers most of which paused themselves together (their kill
    /// switch, their readiness), as their heartbeats report: one shared cause, said
    /// once, even when no check of the controller fails (`vigil_core::fleet::cohort`).
    pub shared_outages: Vec<SharedOutage>,
}

/// A cohort of queue workers paused together (`vigil_core::fleet::SharedPause`).
#[derive(Clone, Debug, Serialize)]
pub struct SharedOutage {
    /// The cohort (the workers' group).
    pub cohort: String,
    /// Workers paused.
    pub paused: usize,
    /// Workers reporting their gate.
    pub of: usize,
    /// What paused them, by kind, most common first (`kill switch: 4`).
    pub reason: String,
    /// When the pause became shared (UNIX ms).
    pub since_ms: i64,
    /// In a sentence.
    pub summary: String,
    /// The paused workers, by id.
    pub members: Vec<PausedWorker>,
}

/// A paused worker of a [`SharedOutage`].
#[derive(Clone, Debug, Serialize)]
pub struct PausedWorker {
    /// Its target id.
    pub id: String,
    /// Paused since (UNIX ms).
    pub since_ms: i64,
    /// Its gate's state, as its heartbeat says.
    pub state: String,
}

impl SharedOutage {
    /// The view of `s`, times as UNIX ms by `ms`.
    pub fn of(s: &vigil_core::fleet::SharedPause, ms: impl Fn(vigil_core::Time) -> i64) -> Self {
        SharedOutage {
            cohort: s.cohort.clone(),
            paused: s.paused,
            of: s.of,
            reason: s.reason.clone(),
            since_ms: ms(s.since),
            summary: s.to_string(),
            members: s
                .members
                .iter()
                .map(|m| PausedWorker {
                    id: m.member.clone(),
                    since_ms: ms(m.since),
                    state: m.state.clone(),
                })
                .collect(),
        }
    }
}

/// One target, for display: compact, its strings shared with the engine's record (a
/// view of 10,000 targets is about 1.7 MB, made without copying any id or URL).
#[derive(Clone, Debug)]
pub struct TargetInfo {
    /// Id, URL, zone, group, heartbeat.
    pub spec: Arc<TargetConfig>,
    /// Its standing (shown as its name).
    pub state: Standing,
    /// Rise/fall verdict.
    pub health: HealthState,
    /// Consecutive failed probes.
    pub consecutive_failures: u32,
    /// Failing since (UNIX ms).
    pub failing_since_ms: Option<i64>,
    /// Failing checks at the last probe.
    pub failing_checks: Vec<String>,
    /// The endpoint itself failed at the last probe.
    pub endpoint_failed: bool,
    /// Flap penalty.
    pub penalty: u32,
    /// Flapping.
    pub flapping: bool,
    /// Operator hold (boxed: most targets have none).
    pub hold: Option<Box<HoldInfo>>,
    /// Reported for replacement at (UNIX ms).
    pub reported_at_ms: Option<i64>,
    /// No verdict now, or a disputed pass (its probers disagree or are silent): it
    /// counts as failing when the guard weighs an action on its peers.
    pub in_doubt: bool,
    /// Last probe.
    pub last_probe: Option<ProbeRecord>,
}

impl TargetInfo {
    /// Its id.
    pub fn id(&self) -> &str {
        &self.spec.id
    }

    /// What fails, in a few words: the failing checks, or the endpoint's error.
    pub fn failure(&self) -> Option<String> {
        if !self.failing_checks.is_empty() {
            return Some(self.failing_checks.join(", "));
        }
        if self.endpoint_failed {
            let detail = self.last_probe.as_ref().map_or("", |p| p.detail.as_str());
            return Some(if detail.is_empty() {
                "endpoint failed".to_string()
            } else {
                format!("endpoint: {detail}")
            });
        }
        None
    }
}

/// The JSON shape of a target (the same as before views were published).
#[derive(Serialize)]
struct TargetWire<'a> {
    id: &'a str,
    url: &'a str,
    zone: &'a str,
    group: &'a str,
    heartbeat: bool,
    state: Standing,
    health: HealthState,
    consecutive_failures: u32,
    failing_since_ms: Option<i64>,
    failing_checks: &'a [String],
    endpoint_failed: bool,
    penalty: u32,
    flapping: bool,
    hold: Option<&'a HoldInfo>,
    reported_at_ms: Option<i64>,
    in_doubt: bool,
    last_probe: Option<&'a ProbeRecord>,
}

impl Serialize for TargetInfo {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        TargetWire {
            id: &self.spec.id,
            url: &self.spec.url,
            zone: &self.spec.zone,
            group: &self.spec.group,
            heartbeat: self.spec.heartbeat,
            state: self.state,
            health: self.health,
            consecutive_failures: self.consecutive_failures,
            failing_since_ms: self.failing_since_ms,
            failing_checks: &self.failing_checks,
            endpoint_failed: self.endpoint_failed,
            penalty: self.penalty,
            flapping: self.flapping,
            hold: self.hold.as_deref(),
            reported_at_ms: self.reported_at_ms,
            in_doubt: self.in_doubt,
            last_probe: self.last_probe.as_ref(),
        }
        .serialize(s)
    }
}

/// One target with its recent probes (`GET /api/targets/{id}`).
#[derive(Clone, Debug, Serialize)]
pub struct TargetDetail {
    /// The target.
    #[serde(flatten)]
    pub info: TargetInfo,
    /// Recent probes, newest last.
    pub history: Vec<ProbeRecord>,
}

/// An operator hold, for display.
#[derive(Clone, Debug, Serialize)]
pub struct HoldInfo {
    /// silenced or maintenance.
    pub kind: HoldKind,
    /// Why.
    pub reason: String,
    /// Until (UNIX ms).
    pub until_ms: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_made_once_per_view_and_the_cache_is_bounded() {
        let cache = AnswerCache::default();
        let mut made = 0;
        for _ in 0..3 {
            let b = cache.get_or_make("?limit=10", || {
                made += 1;
                bytes::Bytes::from_static(b"page")
            });
            assert_eq!(&b[..], b"page");
        }
        assert_eq!(made, 1, "made once, then kept");
        let big = || bytes::Bytes::from(vec![0u8; CACHED_BYTES]);
        let mut made_big = 0;
        for _ in 0..2 {
            cache.get_or_make("big", || {
                made_big += 1;
                big()
            });
        }
        assert_eq!(made_big, 2, "an answer over the bound is not kept");
    }
}
