//! The engine: the one task that owns the fleet [`Replica`] (the guard, its mode and
//! the batch not yet committed: `vigil_core::fleet`, which the simulator drives too),
//! feeds it probe results and operator commands, records everything in the store, and
//! hands committed actions to the actuator.
//!
//! Every guard call is an op ([`Op`], applied by the replica) appended to the current batch; once per turn
//! of the loop (after draining every queued command) the batch is committed in one
//! transaction, and only then are its actions run and its operator commands answered.
//! One owner, one order: the op log replays exactly.
//!
//! ## When the store cannot commit
//!
//! A batch whose commit failed never happened: its actions are not run, its operator
//! commands are answered 503, and the guard is rebuilt from the store (snapshot + op
//! log, as at start), so budget, target states and holds are exactly as committed.
//! Until a commit succeeds again the engine is *failing*: probes are shown but not
//! judged, operator commands are refused without being applied, target list changes
//! wait; `/readyz` answers 503 with the error, `vigil_controller_store_healthy` is 0 and
//! the dashboard says "store failing: no actions are taken". Once a second it tries
//! the store again with the largest write there is, a snapshot of the committed state
//! (after the changes that waited); when that commits, judging resumes and a target
//! still failing is decided again. Rebuilding from the store rather than keeping a copy
//! of the committed state costs nothing while the store works (a copy would double the
//! guard's memory, 180 bytes per target); if the store cannot even be read, nothing is
//! judged until it can.
//!
//! Readers never ask it for the whole fleet: it publishes a [`FleetView`] (see
//! [`crate::view`]) at most every [`PUBLISH_EVERY`] while something changed, and right
//! after committing an operator's command, before answering it.

use crate::clock::{Clock, rfc3339_ms, unix_ms};
use crate::config::{ControllerConfig, ProbeConfig, TargetConfig};
use crate::history::History;
use crate::leader::Leadership;
use crate::metrics::{Metrics, TargetLabels};
use crate::prober::ProbeRecord;
use crate::probing::{Judged, Sharding};
use crate::store::{
    ActionRecord, Batch, Fence, NewDecision, NewTransition, Recovered, StoreError, StoreHandle,
    StoreHealth,
};
use crate::view::FleetViews;
pub use crate::view::{EventInfo, FleetView, GuardView, HoldInfo, TargetDetail, TargetInfo};
use prometheus_client::metrics::gauge::Gauge;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use vigil_core::Time;
use vigil_core::anomaly::{AnomalyDetector, MemberVerdict};
use vigil_core::fleet::{
    AfterCommit, Commit, DecisionKind, Dissent, DissentConfig, Effect, Input, Mode, Rebuilt,
    Refusal, Replica, Standing, Stored, Turn, Uncommitted, judge_peers, peer_check,
};
use vigil_core::fleet::{GateReport, SharedPause, shared_pauses};
use vigil_core::guard::{
    Decision, FreezeScope, GuardEvent, Hold, HoldKind, Observation, Op, Reason, WhenFrozen,
};

/// The outcome of a freeze alert's decision, and the kind of its action's event
/// (a replacement's is `replace`).
pub const ALERT: &str = DecisionKind::Alert.as_str();
/// Commands drained at most per turn, so queries and shutdown are never starved.
const MAX_COMMANDS_PER_TURN: usize = 4096;
/// Guard ticks (hold expiry, flap release): once a second is finer than any hold.
const TICK_EVERY: Duration = Duration::from_secs(1);
/// Targets added or removed at once (start-up, a discovery change) from which the
/// guard is snapshotted rather than each change logged: one write of the whole state
/// instead of thousands of ops that the next snapshot would drop anyway.
const BULK_CHANGES: usize = 256;
/// A guard that changed nothing is snapshotted this often all the same (its stored
/// time, which a restart never goes back before, keeps up with the clock).
const QUIET_SNAPSHOT_EVERY: Duration = Duration::from_secs(600);
/// The workers' peer comparison changes with every heartbeat: a change of it alone
/// snapshots the guard at most this often (a crash forgets at most this much of the
/// comparison; a graceful stop nothing).
const ANOMALY_SNAPSHOT_EVERY: Duration = Duration::from_secs(30);
/// Recent guard events kept for the dashboard.
const RECENT_EVENTS: usize = 20;
/// While the store fails, how often it is tried again (with a snapshot of the
/// committed state). A second keeps a short outage short, and a failing write a second
/// costs nothing.
const STORE_RETRY_EVERY: Duration = Duration::from_secs(1);
/// The published view is rebuilt at most this often while something changes (probe
/// results do all the time): readers see the fleet at most this old, and a view of
/// 10,000 targets (a few ms to build) costs the engine under 1% of a core.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(500);
/// After a decision the view is republished as soon as this much has passed since the
/// last one (the decision log and the targets' tiles agree within it), not later than
/// the next [`PUBLISH_EVERY`]: a storm of decisions still costs one view per 50 ms.
const PUBLISH_SOON: Duration = Duration::from_millis(50);
/// How often a follower rebuilds its guard from what the leader committed (what its
/// API and dashboard show): the leader snapshots at most every `store.snapshot_every`
/// and logs its ops in between, so a follower is this far behind at most.
const FOLLOW_RELOAD_EVERY: Duration = Duration::from_secs(2);
/// A view is republished this often even when nothing changed, so its time and the
/// guard's time-driven figures (budget tokens returning) stay current.
const PUBLISH_QUIET: Duration = Duration::from_secs(5);

/// What the scheduler probes, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Targets (config and discovery merged), shared with the engine's own records:
    /// one copy of each target's strings, however many parts hold it.
    pub targets: Vec<Arc<TargetConfig>>,
    /// Probe settings.
    pub probe: ProbeConfig,
    /// Heartbeat TTL.
    pub heartbeat_ttl: Duration,
}

/// Where a target list came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The config file.
    Config,
    /// The discovery file.
    Discovery,
    /// Auto Scaling groups (`[discovery.aws]`).
    Aws,
}

/// A message to the engine.
pub enum Command {
    /// A probe finished.
    Probe {
        /// Target id.
        id: String,
        /// What the guard sees.
        obs: Observation,
        /// What the API shows.
        record: ProbeRecord,
        /// A queue worker's counters (totals since it started) and its gate, from a
        /// fresh heartbeat.
        worker: Option<crate::heartbeat::WorkerSeen>,
    },
    /// A new target list from one source.
    Targets {
        /// Which source.
        source: Source,
        /// Its list.
        targets: Vec<TargetConfig>,
    },
    /// Put a hold on a target (answered once committed).
    SetHold {
        /// Target.
        id: String,
        /// Silenced or maintenance.
        kind: HoldKind,
        /// Why.
        reason: String,
        /// For how long (None: until cleared).
        duration: Option<Duration>,
        /// Answer.
        reply: oneshot::Sender<Result<(), EngineError>>,
    },
    /// Lift a hold of one kind (answered once committed).
    ClearHold {
        /// Target.
        id: String,
        /// The kind to lift: a hold of the other kind stays, and the call is refused.
        kind: HoldKind,
        /// Answer.
        reply: oneshot::Sender<Result<(), EngineError>>,
    },
    /// Manual freeze.
    Freeze {
        /// Why.
        reason: String,
        /// Answer.
        reply: oneshot::Sender<Result<(), EngineError>>,
    },
    /// Lift the manual freeze.
    Unfreeze {
        /// Answer.
        reply: oneshot::Sender<Result<(), EngineError>>,
    },
    /// A reloaded config.
    Reconfigure(Arc<ControllerConfig>),
    /// Publish the fleet as it is now, and answer with it (tests and tools: the API
    /// reads the published view instead).
    Fleet(oneshot::Sender<Arc<FleetView>>),
    /// One target with its probe history.
    Target {
        /// Its id.
        id: String,
        /// Answer.
        reply: oneshot::Sender<Result<TargetDetail, EngineError>>,
    },
    /// Tests: start recording the replica's calls (None), or answer with what was
    /// recorded and stop ([`vigil_core::fleet::Trace`]).
    #[cfg(test)]
    Trace(Option<oneshot::Sender<Option<vigil_core::fleet::Trace>>>),
}

/// Why the engine refused a command or a query (it changed nothing): the API maps each
/// variant to its HTTP status instead of reading the text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// No such target.
    #[error("unknown target {0:?}")]
    UnknownTarget(String),
    /// The target has no hold of the kind to lift.
    #[error("{id:?} has no {kind} hold")]
    NoHold {
        /// Target.
        id: String,
        /// The kind asked for.
        kind: &'static str,
    },
    /// The target's hold is of the other kind.
    #[error("{id:?} has a {held} hold, not a {kind} one: DELETE /api/targets/{id}/{held} lifts it")]
    OtherHold {
        /// Target.
        id: String,
        /// The kind asked for.
        kind: &'static str,
        /// The kind in force.
        held: &'static str,
    },
    /// The store could not commit it: it was not applied.
    #[error("store failing, not applied: {0}")]
    Store(String),
    /// This replica does not lead (several replicas on PostgreSQL, or its term ended
    /// under it): only the leader takes mutations; nothing was applied.
    #[error("not the leader: {detail}")]
    NotLeader {
        /// The replica that leads, as last read from the store (None: nobody now).
        leader: Option<String>,
        /// Who leads, in words (or why this replica's term ended).
        detail: String,
    },
    /// The engine has stopped (its command channel is closed): nothing was applied.
    #[error("engine stopped")]
    Stopped,
}

impl From<Refusal> for EngineError {
    fn from(r: Refusal) -> EngineError {
        match r {
            Refusal::UnknownTarget(id) => EngineError::UnknownTarget(id),
            Refusal::NoHold { id, kind } => EngineError::NoHold {
                id,
                kind: hold_path(kind),
            },
            Refusal::OtherHold { id, kind, held } => EngineError::OtherHold {
                id,
                kind: hold_path(kind),
                held: hold_path(held),
            },
            Refusal::Halted(Mode::Following { leader }) => EngineError::NotLeader {
                leader: None,
                detail: leader,
            },
            Refusal::Halted(mode) => EngineError::Store(mode.to_string()),
        }
    }
}

/// A hold kind as in the API's paths (`silence`, `maintenance`).
pub fn hold_path(kind: HoldKind) -> &'static str {
    match kind {
        HoldKind::Silenced => "silence",
        HoldKind::Maintenance => "maintenance",
    }
}

struct TargetRuntime {
    spec: Arc<TargetConfig>,
    /// Its `target_up` metric labels.
    labels: TargetLabels,
    /// Its `target_up` series.
    up: Gauge,
    history: History,
    /// Its last probe failed (the next failure is not logged again).
    last_failed: bool,
    /// A queue worker's gate, from its last fresh heartbeat (boxed: most targets
    /// have none).
    gate: Option<Box<GateSeen>>,
}

/// A queue worker's gate as its heartbeats showed it.
struct GateSeen {
    /// Paused since (the engine's time of the first heartbeat saying so).
    paused_since: Option<Time>,
    /// Whether a heartbeat showed it pulling: a worker not yet ready after its start
    /// does not pull either, and is starting, not paused ([`STARTING_PAUSE`]).
    pulled: bool,
    /// Its state in words while paused.
    state: String,
}

type Reply = (
    oneshot::Sender<Result<(), EngineError>>,
    Result<(), EngineError>,
);

/// The engine. Build it with [`Engine::recover`], run it with [`Engine::run`].
pub struct Engine {
    /// The guard, the mode, the standings and the batch not yet committed
    /// (`vigil_core::fleet::Replica`, which the simulator drives too).
    replica: Replica,
    clock: Clock,
    store: StoreHandle,
    metrics: Arc<Metrics>,
    actions: mpsc::UnboundedSender<ActionRecord>,
    plan: watch::Sender<Arc<Plan>>,
    config: Arc<ControllerConfig>,
    config_targets: Vec<Arc<TargetConfig>>,
    discovered: Vec<Arc<TargetConfig>>,
    /// The last good list from Auto Scaling groups.
    aws_discovered: Vec<Arc<TargetConfig>>,
    /// By id (the same shared string as the target's metric labels).
    runtime: BTreeMap<Arc<str>, TargetRuntime>,
    events: VecDeque<EventInfo>,
    replies: Vec<Reply>,
    last_snapshot: Instant,
    /// Zone names, one shared copy each.
    zones: BTreeSet<Arc<str>>,
    /// Shared with `/readyz` and the dashboard.
    health: Arc<StoreHealth>,
    /// When a failing store is tried again.
    retry_at: Instant,
    /// Discovery is configured but no good list has been read since start: targets
    /// the guard knows are kept (see [`Engine::initial_targets`]).
    discovery_pending: bool,
    /// The same for Auto Scaling groups: configured, no list read since start.
    aws_pending: bool,
    /// Where readers find the fleet.
    views: FleetViews,
    /// When the published view was built.
    last_publish: Instant,
    /// Something a reader sees changed since the last publish.
    view_dirty: bool,
    /// A decision was made since the last publish.
    decided: bool,
    /// Queue workers compared with their peers (cohort: the target's group). Not
    /// persisted: after a restart it judges again after one window.
    anomaly: AnomalyDetector,
    /// Heartbeat counters were recorded since the last snapshot.
    anomaly_changed: bool,
    /// The last verdict of each worker, by target id (refreshed every tick).
    verdicts: BTreeMap<String, MemberVerdict>,
    /// Cohorts most of whose workers paused themselves together (refreshed every
    /// tick, `vigil_core::fleet::cohort`).
    shared_pauses: Vec<SharedPause>,
    /// Several replicas: who leads (None: this process alone, always leads, unfenced).
    /// While this replica leads, every batch carries its term (the mode's epoch), and
    /// the store refuses it once another replica took over.
    lead: Option<watch::Receiver<Leadership>>,
    /// When a follower next reloads the leader's state.
    follow_reload_at: Instant,
    /// Several replicas share the probing: this replica reports its results through
    /// the store, and the leader judges each target by its probers' agreement.
    sharding: Option<Sharding>,
    /// The leader's check of lone dissenters (`Sharding::dissent`): when it is due
    /// next, and the rule with which replicas it last found failing most of their
    /// targets alone.
    dissent_due: Instant,
    dissent: Dissent,
}

pub use vigil_core::anomaly::PEER_CHECK;

/// The guard's part of what the store holds (its snapshot and op rows), taken out of
/// `rec`.
fn stored(rec: &mut Recovered) -> Stored {
    Stored {
        snapshot: rec.snapshot.take(),
        ops: std::mem::take(&mut rec.ops),
    }
}

/// What recovery found, for the log.
#[derive(Debug)]
pub struct RecoveryReport {
    /// Whether a snapshot was loaded.
    pub snapshot: bool,
    /// Ops replayed.
    pub ops: usize,
    /// Actions left intended, to run again.
    pub pending: Vec<ActionRecord>,
}

impl Engine {
    /// Rebuilds the guard from the store (snapshot + op log) and prepares the engine.
    pub async fn recover(
        config: Arc<ControllerConfig>,
        store: StoreHandle,
        metrics: Arc<Metrics>,
        health: Arc<StoreHealth>,
        actions: mpsc::UnboundedSender<ActionRecord>,
        plan: watch::Sender<Arc<Plan>>,
    ) -> Result<(Engine, RecoveryReport), anyhow::Error> {
        let mut rec = store.call(|s| s.recover()).await?;
        let had_snapshot = rec.snapshot.is_some();
        let Rebuilt {
            replica,
            latest,
            replayed,
            anomaly,
        } = Replica::rebuild(&stored(&mut rec), &config.guard)?;
        metrics.store_healthy(true);
        let clock = Clock::start(latest);
        let report = RecoveryReport {
            snapshot: had_snapshot,
            ops: replayed,
            pending: rec.pending,
        };
        let mut engine = Engine {
            replica,
            clock,
            store,
            metrics,
            actions,
            plan,
            config: config.clone(),
            config_targets: Vec::new(),
            discovered: Vec::new(),
            aws_discovered: Vec::new(),
            runtime: BTreeMap::new(),
            events: VecDeque::new(),
            replies: Vec::new(),
            last_snapshot: Instant::now(),
            zones: BTreeSet::new(),
            health,
            retry_at: Instant::now(),
            discovery_pending: false,
            aws_pending: false,
            views: FleetViews::new(FleetView::empty()),
            last_publish: Instant::now(),
            view_dirty: true,
            decided: false,
            anomaly: AnomalyDetector::restore(config.anomaly.clone(), anomaly),
            anomaly_changed: false,
            verdicts: BTreeMap::new(),
            shared_pauses: Vec::new(),
            lead: None,
            follow_reload_at: Instant::now(),
            sharding: None,
            dissent_due: Instant::now(),
            dissent: Dissent::new(DissentConfig::default()),
        };
        // Targets the guard remembers keep their state only if still configured; the
        // caller sends both sources before the first flush.
        for id in engine
            .replica
            .guard()
            .target_ids()
            .map(String::from)
            .collect::<Vec<_>>()
        {
            let zone = engine
                .replica
                .guard()
                .target(latest, &id)
                .map(|v| v.zone.to_string())
                .unwrap_or_default();
            let labels = engine.labels(&id, &zone);
            engine.runtime.insert(
                labels.target.clone(),
                TargetRuntime {
                    up: engine.metrics.target_up(&labels),
                    labels,
                    spec: Arc::new(TargetConfig {
                        id,
                        url: String::new(),
                        zone,
                        group: String::new(),
                        heartbeat: false,
                        interval: None,
                    }),
                    history: History::default(),
                    last_failed: false,
                    gate: None,
                },
            );
        }
        engine.reconfigure_guard(&config);
        engine.config = config;
        engine.publish();
        Ok((engine, report))
    }

    /// A target's `target_up` labels, its zone shared with every target in it.
    fn labels(&mut self, id: &str, zone: &str) -> TargetLabels {
        TargetLabels {
            target: Arc::from(id),
            zone: intern(&mut self.zones, zone),
        }
    }

    /// Where the engine publishes the fleet for readers (the API, the dashboard).
    pub fn views(&self) -> FleetViews {
        self.views.clone()
    }

    /// The clock the engine uses (probers stamp results with it).
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Makes this engine one of several replicas: it follows until `lead` says it holds
    /// the lease, then reloads the guard from the store and leads in that term (its
    /// batches fenced by the epoch), and follows again when the term ends. Call before
    /// [`Engine::run`].
    pub fn replicated(&mut self, lead: watch::Receiver<Leadership>) {
        let who = lead.borrow().describe();
        self.lead = Some(lead);
        self.replica.follow(who);
    }

    /// Makes this replica share the probing with the others (see [`crate::probing`]):
    /// its results reach the leader through the store, and while it leads it judges a
    /// probed target only by the agreement of the target's probers, never by a probe
    /// of its own alone. Call before [`Engine::run`].
    pub fn sharded(&mut self, sharding: Sharding) {
        self.sharding = Some(sharding);
    }

    /// Reports this replica's results (and heartbeat) to the store; the leader reads
    /// everyone's back and judges the targets due.
    async fn report(&mut self) {
        let leading = self.replica.mode().epoch().is_some();
        let Some(sh) = self.sharding.as_mut() else {
            return;
        };
        let runtime = &self.runtime;
        let report = sh.report(leading, &|id: &str| {
            runtime.get(id).map(|rt| rt.spec.heartbeat)
        });
        let sent = report.clone();
        match self
            .store
            .call(move |s| {
                s.replicas()
                    .ok_or_else(StoreError::no_replicas)?
                    .report(&sent)
            })
            .await
        {
            Ok(state) => {
                let sh = self.sharding.as_mut().expect("checked above");
                if sh.answered(state, leading) {
                    self.view_dirty = true;
                }
                if leading && self.replica.mode().judges() {
                    self.judge_agreed();
                }
            }
            Err(e) => {
                self.metrics.store_error();
                if let Some(sh) = self.sharding.as_mut() {
                    sh.failed(report, &e);
                }
            }
        }
    }

    /// The leader: every probed target due for a verdict gets one observation, the
    /// agreement of its probers, or doubt while they do not agree on one.
    fn judge_agreed(&mut self) {
        let now = Instant::now();
        let (interval, timeout) = (self.config.probe.interval, self.config.probe.timeout);
        let due: Vec<(Arc<str>, Judged)> = {
            let Some(sh) = self.sharding.as_mut() else {
                return;
            };
            sh.retain(|id| self.runtime.contains_key(id));
            self.runtime
                .iter()
                .filter_map(|(id, rt)| {
                    let every = rt.spec.interval.unwrap_or(interval);
                    let heartbeat = rt.spec.heartbeat;
                    sh.verdict(id, &rt.spec.zone, every, timeout, heartbeat, now)
                        .map(|judged| (id.clone(), judged))
                })
                .collect()
        };
        for (id, judged) in due {
            let input = Input::Agreed {
                id: id.to_string(),
                judged,
            };
            let turn = self.replica.step(self.clock.now(), input);
            if self.effects(turn) {
                self.view_dirty = true;
            }
        }
        if now >= self.dissent_due {
            self.dissent_due = now + interval;
            self.check_dissent();
        }
    }

    /// The leader, once per probe interval, from the verdicts of that interval: the
    /// dissent rule (`vigil_core::fleet::Dissent`) says which replicas are likely cut
    /// off from their targets; said once at WARN when it starts and once when it
    /// ends, and in `vigil_controller_prober_dissent_ratio`.
    fn check_dissent(&mut self) {
        let Some(sh) = self.sharding.as_mut() else {
            return;
        };
        let round = self.dissent.judge(&sh.take_dissent());
        for (replica, ratio) in &round.ratios {
            self.metrics.prober_dissent(replica, *ratio);
        }
        for d in &round.started {
            let (replica, alone, fresh) = (&d.replica, d.alone, d.fresh);
            tracing::warn!(
                replica = %replica,
                alone,
                fresh,
                "replica {replica} fails {alone} of the {fresh} targets it probes while their other probers pass them: it is likely cut off from the targets; while it is, those targets are in doubt and the guard holds the actions they would need"
            );
        }
        for gone in &round.ended {
            tracing::info!(replica = %gone, "replica {gone} agrees with the other probers again");
        }
    }

    /// The leadership changed: a new term reloads and leads, an ended one follows.
    async fn leadership_changed(&mut self) {
        let Some(l) = self.lead.as_mut().map(|rx| rx.borrow_and_update().clone()) else {
            return;
        };
        if l.epoch.is_some() && l.epoch != self.replica.mode().epoch() {
            tracing::warn!(replica = %l.replica, epoch = ?l.epoch, "leading: the guard is reloaded from what the store holds, then judging starts");
            if let Some(sh) = self.sharding.as_mut() {
                sh.all_due();
            }
            // Judged again only once the guard is as the store has it: until it could
            // be read, the term's first batch waits (and says why, as before).
            let error = self.replica.mode().halted().unwrap_or_else(|| {
                "the store could not be read at the start of this term".to_string()
            });
            self.replica.lead(l.epoch, error);
            self.retry_store().await;
            // Actions a previous leader intended and never finished are resumed here.
            match self.store.call(|s| s.recover()).await {
                Ok(rec) => {
                    for a in rec.pending {
                        tracing::warn!(action = a.id, target_id = %a.target, attempts = a.attempts, "resuming an action left intended by the previous leader");
                        let _ = self.actions.send(a);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the actions left intended; they run at the next term")
                }
            }
        } else if l.epoch.is_none() && !self.replica.mode().follows() {
            tracing::warn!(replica = %l.replica, "the term ended: this replica follows and decides nothing");
            self.follow(l.describe());
        } else if self.replica.mode().follows() {
            self.replica.follow(l.describe());
            self.view_dirty = true;
        }
    }

    /// The fence of a batch decided in the term `epoch` (None: following, or a lone
    /// controller).
    fn fence(&self, epoch: Option<i64>) -> Option<Fence> {
        let epoch = epoch?;
        let l = self.lead.as_ref()?.borrow();
        Some(Fence {
            lease: l.lease.clone(),
            holder: l.replica.clone(),
            epoch,
        })
    }

    /// The refusal of a follower: who leads as last read, and `detail`.
    fn not_leader(&self, detail: String) -> EngineError {
        let leader = self.lead.as_ref().and_then(|l| {
            l.borrow()
                .leader
                .as_ref()
                .filter(|r| r.live())
                .map(|r| r.holder.clone())
        });
        EngineError::NotLeader { leader, detail }
    }

    /// Stops judging: what was not committed is dropped (a successor decides it again),
    /// and target changes wait for a term of this replica's own.
    fn follow(&mut self, who: String) {
        for (tx, _) in std::mem::take(&mut self.replies) {
            let _asker_may_be_gone = tx.send(Err(self.not_leader(who.clone())));
        }
        self.replica.follow(who);
        self.follow_reload_at = Instant::now();
        self.view_dirty = true;
    }

    /// Runs until `shutdown` flips; commits a final snapshot on the way out.
    pub async fn run(
        mut self,
        mut rx: mpsc::Receiver<Command>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(TICK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.flush().await;
        self.publish();
        loop {
            let lead = self.lead.clone();
            let report_at = self.sharding.as_ref().map(|s| s.next_report);
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                _ = async { tokio::time::sleep_until(report_at.expect("checked by the guard")).await }, if report_at.is_some() => {
                    self.report().await;
                }
                r = async { lead.expect("checked by the guard").changed().await }, if lead.is_some() => {
                    if r.is_err() {
                        // The lease task is gone: nobody renews, so nobody leads here.
                        self.lead = None;
                        self.follow("the lease task stopped".into());
                    } else {
                        self.leadership_changed().await;
                    }
                }
                cmd = rx.recv() => {
                    let Some(cmd) = cmd else { break };
                    self.handle(cmd);
                    let mut n = 1;
                    while n < MAX_COMMANDS_PER_TURN {
                        match rx.try_recv() {
                            Ok(cmd) => self.handle(cmd),
                            Err(_) => break,
                        }
                        n += 1;
                    }
                }
                _ = tick.tick() => {
                    if self.replica.mode().follows() {
                        if self.follow_reload_at <= Instant::now() {
                            self.follow_reload_at = Instant::now() + FOLLOW_RELOAD_EVERY;
                            if self.reload().await {
                                self.view_dirty = true;
                            }
                        }
                    } else if !self.replica.mode().judges() {
                        if self.retry_at <= Instant::now() {
                            self.retry_store().await;
                        }
                    } else {
                        // A tick with no hold due and nobody flapping changes nothing:
                        // it is not logged, and no target's state needs a refresh.
                        self.judge_workers();
                        self.judge_pauses();
                        let turn = self.replica.step(self.clock.now(), Input::Tick);
                        if self.effects(turn) {
                            self.view_dirty = true;
                        }
                    }
                }
            }
            self.flush().await;
            self.publish_if_due();
        }
        if self.replica.mode().follows() {
            tracing::info!("engine stopped (a follower: nothing of its own to snapshot)");
            return;
        }
        if !self.replica.mode().judges() {
            tracing::error!(
                "engine stopped with the store failing: the guard state is as last committed"
            );
            return;
        }
        self.snapshot();
        self.flush().await;
        tracing::info!("engine stopped; guard state snapshotted");
    }

    fn handle(&mut self, cmd: Command) {
        // While the store fails, an operator command is refused, not applied: it could
        // not be made durable, and one in force but lost at the next restart is worse
        // than one refused.
        let cmd = match cmd {
            Command::SetHold { reply, .. }
            | Command::ClearHold { reply, .. }
            | Command::Freeze { reply, .. }
            | Command::Unfreeze { reply }
                if !self.replica.mode().judges() =>
            {
                let refusal = match self.replica.mode() {
                    Mode::Following { leader } => self.not_leader(leader.clone()),
                    other => EngineError::Store(other.to_string()),
                };
                let _asker_may_be_gone = reply.send(Err(refusal));
                return;
            }
            cmd => cmd,
        };
        // Queries change nothing a reader sees; everything else may.
        self.view_dirty |= !matches!(cmd, Command::Fleet(_) | Command::Target { .. });
        match cmd {
            Command::Probe {
                id,
                mut obs,
                mut record,
                worker,
            } => {
                let Some(rt) = self.runtime.get_mut(id.as_str()) else {
                    return; // Removed while the probe was in flight.
                };
                rt.gate = seen_gate(self.clock.now(), rt.gate.take(), worker.as_ref());
                if let Some(g) = rt.gate.as_ref().filter(|g| g.paused_since.is_some()) {
                    // Its own words for its pause, in its record: no check fails, yet it
                    // does not pull.
                    if !record.detail.is_empty() {
                        record.detail.push_str("; ");
                    }
                    record.detail.push_str(&g.state);
                }
                if let Some(totals) = worker.map(|w| w.totals) {
                    self.anomaly
                        .record_totals(self.clock.now(), &id, &rt.spec.group, totals);
                    self.anomaly_changed = true;
                    if let Some(v) = self.verdicts.get(id.as_str()) {
                        // The worker's standing among its peers, on every record: an
                        // outlier fails the peer check (the verdict says why).
                        if peer_check(&mut obs, v.is_outlier()) {
                            record.ok = false;
                        }
                        if !record.detail.is_empty() {
                            record.detail.push_str("; ");
                        }
                        record.detail.push_str(&v.to_string());
                    }
                }
                // The first failure of a streak, with its reason, at once: the guard's
                // verdicts wait out the grace period and the thresholds, and a fleet
                // probed on a path it does not serve should say so in its first
                // seconds, not only in the API.
                if !record.ok && !rt.last_failed {
                    let probed = if rt.spec.heartbeat {
                        "its heartbeat".to_string()
                    } else {
                        format!(
                            "{}{}",
                            rt.spec.url.trim_end_matches('/'),
                            self.config.probe.path
                        )
                    };
                    tracing::info!(
                        target_id = %id,
                        probe = %probed,
                        reason = %record.detail,
                        "probe failed"
                    );
                }
                rt.last_failed = !record.ok;
                self.metrics
                    .probe(&rt.up, record.ok, record.duration_ms / 1000.0);
                rt.history.push(record, self.config.probe.history);
                let heartbeat = rt.spec.heartbeat;
                if let Some(sh) = self.sharding.as_mut() {
                    // Shared probing: this result reaches the leader through the
                    // store; the leader judges by every prober's result together (a
                    // heartbeat target's by every replica's: a worker's heartbeats
                    // reach whichever replica its address leads to).
                    let id = self
                        .runtime
                        .get_key_value(id.as_str())
                        .map(|(k, _)| k.clone())
                        .expect("looked up above");
                    sh.record(&id, &obs, heartbeat);
                    return;
                }
                // A probe that changes nothing in the guard (a healthy target passing
                // again) is not logged: replaying the log without it ends in the same
                // state (`Applied::Unchanged`), and a healthy fleet then writes
                // nothing to the store per probe. While this replica does not judge,
                // it is shown, not judged (the turn is a refusal): a decision now could
                // not be committed, and a target still failing is decided again once
                // the store works.
                let turn = self.replica.step(self.clock.now(), Input::Probe(obs));
                self.effects(turn);
            }
            Command::Targets { source, targets } => {
                let targets = shared(targets);
                match source {
                    Source::Config => self.config_targets = targets,
                    Source::Discovery => {
                        self.discovered = targets;
                        self.discovery_pending = false;
                    }
                    Source::Aws => {
                        self.aws_discovered = targets;
                        self.aws_pending = false;
                    }
                }
                // Otherwise they wait: applied with the next batch that commits.
                if self.replica.mode().judges() {
                    self.apply_targets();
                }
            }
            Command::SetHold {
                id,
                kind,
                reason,
                duration,
                reply,
            } => {
                let now = self.clock.now();
                let hold = Hold {
                    kind,
                    reason,
                    until: duration.map(|d| now + d),
                };
                let input = Input::SetHold {
                    id: id.clone(),
                    hold,
                };
                self.command(now, input, reply);
            }
            Command::ClearHold { id, kind, reply } => {
                // Only a hold of the kind asked for is lifted (the step refuses the
                // other kind).
                let input = Input::ClearHold {
                    id: id.clone(),
                    kind,
                };
                self.command(self.clock.now(), input, reply);
            }
            Command::Freeze { reason, reply } => {
                self.command(self.clock.now(), Input::Freeze { reason }, reply);
            }
            Command::Unfreeze { reply } => {
                self.command(self.clock.now(), Input::Unfreeze, reply);
            }
            Command::Reconfigure(config) => self.reconfigure(config),
            Command::Fleet(reply) => {
                self.publish();
                let _receiver_may_be_gone = reply.send(self.views.load());
            }
            Command::Target { id, reply } => {
                let detail = self.target_detail(&id);
                let _receiver_may_be_gone =
                    reply.send(detail.ok_or(EngineError::UnknownTarget(id)));
            }
            #[cfg(test)]
            Command::Trace(None) => self.replica.start_trace(),
            #[cfg(test)]
            Command::Trace(Some(reply)) => {
                let _receiver_may_be_gone = reply.send(self.replica.take_trace());
            }
        }
    }

    fn reconfigure(&mut self, config: Arc<ControllerConfig>) {
        if let Some(sh) = self.sharding.as_mut() {
            sh.set_probers(config.replicas.probers);
        }
        self.config_targets = config.targets.iter().cloned().map(Arc::new).collect();
        self.config = config.clone();
        self.discovery_pending &= config.discovery.is_some();
        if config.discovery.as_ref().is_none_or(|d| d.aws.is_none()) {
            // Auto Scaling discovery turned off: its targets go.
            self.aws_pending = false;
            self.aws_discovered = Vec::new();
        }
        if !self.replica.mode().judges() {
            // Applied with the next successful commit (`retry_store`).
            return;
        }
        self.reconfigure_guard(&config);
        self.apply_targets();
    }

    fn reconfigure_guard(&mut self, config: &ControllerConfig) {
        if *self.replica.guard().config() != config.guard {
            let op = Op::Reconfigure {
                config: Box::new(config.guard.clone()),
            };
            self.op(op, None);
        }
    }

    /// Applies a membership or settings op through the replica (journaled, its
    /// decision and state changes recorded). `target`: the one target it affects
    /// (None: any may change). Returns whether the op found its target.
    fn op(&mut self, op: Op, target: Option<&str>) -> bool {
        let (turn, found) = self.replica.apply(self.clock.now(), op, target);
        self.effects(turn);
        found
    }

    /// Says what one turn of the replica did (`vigil_core::fleet::Replica::step`,
    /// which the simulator drives too), in its order: its decisions and the guard's
    /// events in the log and on the dashboard, then the state changes it caused. The
    /// replica keeps them in its batch; [`Engine::flush`] writes them. Returns whether
    /// the guard changed.
    fn effects(&mut self, turn: Turn) -> bool {
        let changed = turn.changed();
        for e in turn.effects {
            match e {
                Effect::Decide(kind, d) => self.note_decision(kind, &d),
                Effect::Event(ev) => self.guard_event(ev),
                Effect::Log(_) | Effect::Refused(_) => {}
            }
        }
        for t in turn.transitions {
            tracing::info!(target_id = %t.id, from = %t.from, to = %t.to, detail = %t.detail, "target state changed");
        }
        changed
    }

    /// An operator's command through the judging step: its effects recorded, its
    /// answer (or refusal) given once the batch is committed.
    fn command(
        &mut self,
        now: Time,
        input: Input,
        reply: oneshot::Sender<Result<(), EngineError>>,
    ) {
        let turn = self.replica.step(now, input);
        let refused = turn.refusal().cloned().map(EngineError::from);
        self.effects(turn);
        self.replies.push((reply, refused.map_or(Ok(()), Err)));
    }

    /// Compares the queue workers with their peers: refreshes every worker's verdict
    /// and logs a worker that becomes, or stops being, an outlier.
    fn judge_workers(&mut self) {
        if self.anomaly.is_empty() {
            return;
        }
        let was = &self.verdicts;
        let judged = judge_peers(&mut self.anomaly, self.clock.now(), |id| {
            was.get(id).is_some_and(MemberVerdict::is_outlier)
        });
        let mut verdicts = BTreeMap::new();
        for (v, changed) in judged {
            match changed {
                Some(true) => {
                    tracing::warn!(target_id = %v.member, verdict = %v, "worker fails far more than its peers")
                }
                Some(false) => {
                    tracing::info!(target_id = %v.member, verdict = %v, "worker no longer an outlier")
                }
                None => {}
            }
            verdicts.insert(v.member.clone(), v);
        }
        self.verdicts = verdicts;
    }

    /// Finds the cohorts most of whose workers paused themselves together
    /// (`vigil_core::fleet::cohort`), and logs (and lists among the guard's events) a
    /// shared pause that begins or ends.
    fn judge_pauses(&mut self) {
        let now = self.clock.now();
        let reports = self.runtime.values().filter_map(|rt| {
            rt.gate.as_ref().map(|g| GateReport {
                member: &rt.spec.id,
                cohort: &rt.spec.group,
                // A worker never seen pulling is starting (its readiness not yet passing),
                // not paused, until its pause outlasts a start.
                paused: g
                    .paused_since
                    .filter(|&t| g.pulled || now.since(t) >= STARTING_PAUSE)
                    .map(|t| (t, g.state.as_str())),
            })
        });
        let shared = shared_pauses(reports, self.config.anomaly.shared_fraction);
        if shared == self.shared_pauses {
            return;
        }
        let mut said = Vec::new();
        for s in &shared {
            if !self.shared_pauses.iter().any(|o| o.cohort == s.cohort) {
                tracing::warn!(cohort = %s.cohort, paused = s.paused, of = s.of, outage = %s, "workers paused together");
                said.push(s.to_string());
            }
        }
        for o in &self.shared_pauses {
            if !shared.iter().any(|s| s.cohort == o.cohort) {
                tracing::info!(cohort = %o.cohort, "workers no longer paused together");
                said.push(format!(
                    "shared outage in cohort {} over: its workers pull again",
                    o.cohort
                ));
            }
        }
        for message in said {
            if self.events.len() >= RECENT_EVENTS {
                self.events.pop_front();
            }
            self.events.push_back(EventInfo {
                at_ms: unix_ms(self.clock.now()),
                message,
            });
        }
        self.shared_pauses = shared;
        self.view_dirty = true;
    }

    fn snapshot(&mut self) {
        let anomaly = (!self.anomaly.is_empty()).then(|| self.anomaly.state());
        self.replica.snapshot(self.clock.now(), anomaly);
        self.last_snapshot = Instant::now();
        self.anomaly_changed = false;
    }
}

/// How long a worker never seen pulling may not pull before its pause counts towards a
/// shared outage: longer than a worker's start (its readiness passing), so the demo's
/// four workers starting together are not "a shared outage" for their first second;
/// a controller started during a real one says so this much later.
const STARTING_PAUSE: std::time::Duration = std::time::Duration::from_secs(10);

/// A worker's gate after a probe of it: as its fresh heartbeat says (`worker`), paused
/// since the first heartbeat that said so; unknown when no fresh heartbeat says.
fn seen_gate(
    now: Time,
    was: Option<Box<GateSeen>>,
    worker: Option<&crate::heartbeat::WorkerSeen>,
) -> Option<Box<GateSeen>> {
    let gate = worker?.gate.as_ref()?;
    let pulled = was.as_ref().is_some_and(|g| g.pulled);
    let since = was.and_then(|g| g.paused_since);
    Some(Box::new(match gate {
        None => GateSeen {
            paused_since: None,
            pulled: true,
            state: String::new(),
        },
        Some(state) => GateSeen {
            paused_since: Some(since.unwrap_or(now)),
            pulled,
            state: state.clone(),
        },
    }))
}

/// The one shared copy of `name` in `set` (added if new).
fn intern(set: &mut BTreeSet<Arc<str>>, name: &str) -> Arc<str> {
    if let Some(n) = set.get(name) {
        return n.clone();
    }
    let n: Arc<str> = Arc::from(name);
    set.insert(n.clone());
    n
}

/// The targets behind `Arc`s, in a list of their own size: `collect` would reuse the
/// (15 times larger) allocation of the `TargetConfig`s and keep it for good.
fn shared(targets: Vec<TargetConfig>) -> Vec<Arc<TargetConfig>> {
    let mut out = Vec::with_capacity(targets.len());
    out.extend(targets.into_iter().map(Arc::new));
    out
}

fn log_store_error(e: &StoreError, n_actions: usize) {
    tracing::error!(
        error = %e,
        actions_not_run = n_actions,
        "store commit failed: the batch is undone, its actions are NOT run"
    );
}

mod commit;
mod members;
mod publish;
mod rows;
#[cfg(test)]
mod tests;
