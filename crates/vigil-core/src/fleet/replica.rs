//! One controller replica's judging state between its inputs and its store: the
//! guard, the [`Mode`], each target's [`Standing`], and what was decided but is not
//! committed yet; what a commit's outcome, a store read and a term do to them.
//!
//! `vigil controller` drives it from its tokio loop (a store thread, timers, the
//! lease task); `vigil sim` drives it from its virtual clock with a store it can
//! break. Both journal the same [`Uncommitted`] batch, recover with the same
//! [`Replica::rebuild`] and leave a failing store by the same [`Mode`] changes, so a
//! crash in the simulator loses what a crash of the controller loses: the batch not
//! yet committed, and nothing else.
//!
//! ```text
//!   input --step--> guard --> Uncommitted (ops, decisions, events, transitions)
//!                                 | take (fenced by the mode's epoch)
//!                                 v
//!                         driver commits it --> committed(Commit) --> Mode
//!                                 | Commit::Failed: the batch never happened
//!                                 v
//!                         driver reads the store --> restore(Stored) --> guard
//! ```

use super::mode::Mode;
use super::standing::Standing;
use super::step::{Effect, Input, Refusal, step};
use super::trace::{Call, Trace};
use crate::anomaly::AnomalyState;
use crate::guard::{
    Applied, GuardConfig, GuardEvent, GuardState, GuardTargetView, Op, SafetyGuard,
};
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the store holds of the guard: the last snapshot and the op rows after it
/// (each row a JSON array of [`Op`]s, one per committed batch), as written by
/// [`Uncommitted::ops_row`] and [`Uncommitted::snapshot`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    /// The last snapshot ([`Replica::snapshot`]'s text), if any.
    pub snapshot: Option<String>,
    /// The op rows committed after it, oldest first.
    pub ops: Vec<String>,
}

impl Stored {
    /// Writes `batch` as a store does: its ops as one row, then its snapshot, which
    /// covers every row before it (those are dropped). This is the contract the
    /// controller's SQLite and PostgreSQL stores keep in one transaction; the
    /// simulator's store is this.
    pub fn commit(&mut self, batch: &Uncommitted) {
        if !batch.ops.is_empty() {
            self.ops.push(batch.ops_row());
        }
        if let Some((text, _)) = &batch.snapshot {
            self.snapshot = Some(text.clone());
            self.ops.clear();
        }
    }
}

/// The guard rebuilt from what the store holds ([`Replica::rebuild`]).
#[derive(Debug)]
pub struct Rebuilt {
    /// The replica, leading alone (the driver sets its mode).
    pub replica: Replica,
    /// The latest guard time it has seen: a clock restarted on it never goes back.
    pub latest: Time,
    /// Ops replayed after the snapshot.
    pub replayed: usize,
    /// The queue workers' comparison as snapshotted.
    pub anomaly: AnomalyState,
}

/// Why what the store holds cannot be rebuilt: the driver must not start over with
/// a reset budget.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    /// The snapshot does not parse.
    #[error(
        "the store's guard snapshot does not parse ({0}); refusing to start with a reset budget"
    )]
    Snapshot(serde_json::Error),
    /// An op row does not parse.
    #[error("guard op batch {row} after the snapshot does not parse: {error}")]
    Ops {
        /// Its index after the snapshot.
        row: usize,
        /// Why.
        error: serde_json::Error,
    },
}

/// The guard config and state as snapshotted together (the ops after a snapshot were
/// made under its config until a `Reconfigure` op says otherwise), with the queue
/// workers' peer comparison, so a restart judges them on the window they had.
#[derive(Deserialize)]
struct Snapshot {
    config: GuardConfig,
    state: GuardState,
    /// Guard time of the snapshot: the clock never restarts earlier than this.
    #[serde(default)]
    at: Time,
    /// The anomaly detector's windows (absent before the first heartbeat worker, and in
    /// snapshots written before they were kept).
    #[serde(default)]
    anomaly: AnomalyState,
}

/// [`Snapshot`] as written: serialised from references, since cloning a large
/// fleet's state first would double its memory for a moment.
#[derive(Serialize)]
struct SnapshotRef<'a> {
    config: &'a GuardConfig,
    state: &'a GuardState,
    at: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    anomaly: Option<&'a AnomalyState>,
}

/// A target's standing changed (recorded with the batch, for the history).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// When.
    pub at: Time,
    /// The target.
    pub id: String,
    /// Its standing before.
    pub from: Standing,
    /// Its standing now.
    pub to: Standing,
    /// What the guard says of it now ([`describe`]).
    pub detail: String,
}

/// What was decided since the last commit, in order: committed as one batch, or
/// lost (a crash) or undone (a failed commit) as one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Uncommitted {
    /// The guard's ops (a snapshot in the same batch may cover them).
    pub ops: Vec<Op>,
    /// Decisions ([`Effect::Decide`]) and the guard's events ([`Effect::Event`]), in
    /// the order they happened: an act's action runs once this batch is committed, a
    /// freeze alert ([`GuardEvent::FreezeAlert`]) is delivered as one.
    pub effects: Vec<Effect>,
    /// Standings that changed.
    pub transitions: Vec<Transition>,
    /// The guard state after these ops, to snapshot (the text, and the guard time).
    pub snapshot: Option<(String, Time)>,
    /// The term it was decided in: the store takes it only while the term is
    /// current (None: a lone controller, unfenced).
    pub epoch: Option<i64>,
}

impl Uncommitted {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
            && self.effects.is_empty()
            && self.transitions.is_empty()
            && self.snapshot.is_none()
    }

    /// The ops as one stored row (a JSON array), as [`Replica::rebuild`] reads it.
    pub fn ops_row(&self) -> String {
        serde_json::to_string(&self.ops).expect("guard ops serialise")
    }

    /// The guard events among its effects (undone with it when its commit fails).
    pub fn events(&self) -> impl Iterator<Item = &GuardEvent> {
        self.effects.iter().filter_map(|e| match e {
            Effect::Event(ev) => Some(ev),
            _ => None,
        })
    }
}

/// How a commit of an [`Uncommitted`] batch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Commit {
    /// Written: its actions run, its commands are answered.
    Done,
    /// Not written (the store's error): the batch never happened.
    Failed(String),
    /// Refused because another replica took the term over: this one follows.
    Fenced(String),
}

/// What the driver does after [`Replica::committed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterCommit {
    /// Nothing more (written; or nothing to write).
    Done,
    /// Written, and it was the retry of a failing store: judging resumes.
    Recovered,
    /// Not written: the guard is ahead of the store; read the store and
    /// [`Replica::restore`] it. `first`: the store just started failing (say so once).
    Undo {
        /// The store was working until this commit.
        first: bool,
    },
    /// Another replica leads: follow.
    Follow,
}

/// One call's effects: what the guard said, and the standings it changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Turn {
    /// The step's effects (see [`step`]), a refusal included.
    pub effects: Vec<Effect>,
    /// Standings that changed (also in the batch).
    pub transitions: Vec<Transition>,
}

impl Turn {
    /// Whether the guard changed.
    pub fn changed(&self) -> bool {
        self.effects.iter().any(|e| matches!(e, Effect::Log(_)))
    }

    /// The refusal, if the input was refused.
    pub fn refusal(&self) -> Option<&Refusal> {
        self.effects.iter().find_map(|e| match e {
            Effect::Refused(r) => Some(r),
            _ => None,
        })
    }
}

/// One replica's judging state. See the module's doc.
#[derive(Clone, Debug)]
pub struct Replica {
    guard: SafetyGuard,
    mode: Mode,
    pending: Uncommitted,
    /// Each target's standing (absent until first computed: its first is no change).
    standing: BTreeMap<String, Standing>,
    /// Ops are applied without being logged: a snapshot in the same batch covers them.
    unlogged: bool,
    /// Ops logged since the last snapshot.
    ops_since_snapshot: usize,
    /// The length of the last snapshot (bytes), to size the next one's buffer.
    snapshot_size: usize,
    /// Every call since [`Replica::start_trace`] (None: not recording).
    trace: Option<Trace>,
}

impl Replica {
    /// A replica on `guard`, leading alone, nothing pending.
    pub fn new(guard: SafetyGuard) -> Replica {
        Replica {
            guard,
            mode: Mode::ALONE,
            pending: Uncommitted::default(),
            standing: BTreeMap::new(),
            unlogged: false,
            ops_since_snapshot: 0,
            snapshot_size: 0,
            trace: None,
        }
    }

    /// Starts recording every call on this replica, with what each returns, from the
    /// replica as it is now (see [`Trace`]); a trace already recording starts again.
    pub fn start_trace(&mut self) {
        let mut start = self.clone();
        start.trace = None;
        self.trace = Some(Trace {
            start: Box::new(start),
            calls: Vec::new(),
        });
    }

    /// The calls recorded since [`Replica::start_trace`] (None: not recording), and
    /// recording stops.
    pub fn take_trace(&mut self) -> Option<Trace> {
        self.trace.take()
    }

    /// Records a call when recording; `call` builds it only then.
    fn traced(&mut self, call: impl FnOnce() -> Call) {
        if let Some(t) = &mut self.trace {
            t.calls.push(call());
        }
    }

    /// The guard rebuilt from what the store holds: the snapshot, then the ops after
    /// it (a fresh guard on `config` when there is no snapshot).
    pub fn rebuild(stored: &Stored, config: &GuardConfig) -> Result<Rebuilt, RebuildError> {
        let mut latest = Time::ZERO;
        let mut anomaly = AnomalyState::default();
        let mut guard = match &stored.snapshot {
            Some(text) => {
                let snap: Snapshot = serde_json::from_str(text).map_err(RebuildError::Snapshot)?;
                latest = snap.at;
                anomaly = snap.anomaly;
                SafetyGuard::restore(snap.config, snap.state)
            }
            None => SafetyGuard::new(config.clone()),
        };
        let mut replayed = 0;
        for (row, text) in stored.ops.iter().enumerate() {
            let ops: Vec<Op> =
                serde_json::from_str(text).map_err(|error| RebuildError::Ops { row, error })?;
            for op in ops {
                if let Some(at) = op.at() {
                    latest = latest.max(at);
                }
                guard.apply(&op);
                replayed += 1;
            }
        }
        guard.drain_events();
        for v in guard.targets(latest) {
            if let Some(t) = v.failing_since {
                latest = latest.max(t);
            }
        }
        let mut replica = Replica::new(guard);
        replica.standing = standings(&replica.guard, latest);
        replica.ops_since_snapshot = stored.ops.len();
        replica.snapshot_size = stored.snapshot.as_ref().map_or(0, String::len);
        Ok(Rebuilt {
            replica,
            latest,
            replayed,
            anomaly,
        })
    }

    /// The guard (read-only: every change goes through [`Replica::step`] or
    /// [`Replica::apply`], so it is journaled).
    pub fn guard(&self) -> &SafetyGuard {
        &self.guard
    }

    /// What this replica may do now.
    pub fn mode(&self) -> &Mode {
        &self.mode
    }

    /// Target `id`'s standing as last computed.
    pub fn standing(&self, id: &str) -> Option<Standing> {
        self.standing.get(id).copied()
    }

    /// Ops logged since the last snapshot.
    pub fn ops_since_snapshot(&self) -> usize {
        self.ops_since_snapshot
    }

    /// Whether nothing is waiting to be committed.
    pub fn is_clean(&self) -> bool {
        self.pending.is_empty()
    }

    /// Applies one input at `now` through the judging [`step`]: journaled, its
    /// standings refreshed. While this replica does not judge ([`Mode::judges`]),
    /// nothing is applied and the turn is one [`Refusal::Halted`].
    pub fn step(&mut self, now: Time, input: Input) -> Turn {
        let recorded = self.trace.is_some().then(|| input.clone());
        let turn = self.step_untraced(now, input);
        if let Some(input) = recorded {
            let turn = turn.clone();
            self.traced(|| Call::Step { now, input, turn });
        }
        turn
    }

    fn step_untraced(&mut self, now: Time, input: Input) -> Turn {
        if !self.mode.judges() {
            return Turn {
                effects: vec![Effect::Refused(Refusal::Halted(self.mode.clone()))],
                transitions: Vec::new(),
            };
        }
        let effects = step(&mut self.guard, now, input);
        // The one target its op is about (none: a tick, a freeze: any may change).
        let target = effects
            .iter()
            .find_map(Effect::op)
            .and_then(Op::target)
            .map(str::to_string);
        self.record(now, effects, target.as_deref())
    }

    /// Applies a membership or settings op ([`Op::Add`], [`Op::Remove`],
    /// [`Op::Reconfigure`]) the driver made from its target lists or its config:
    /// journaled like a step's. `target`: the one target it affects (None: any may
    /// change). Returns the turn and whether the op found its target.
    pub fn apply(&mut self, now: Time, op: Op, target: Option<&str>) -> (Turn, bool) {
        let recorded = self.trace.is_some().then(|| op.clone());
        let out = self.apply_untraced(now, op, target);
        if let Some(op) = recorded {
            let out = out.clone();
            let target = target.map(str::to_string);
            self.traced(|| Call::Apply {
                now,
                op,
                target,
                out,
            });
        }
        out
    }

    fn apply_untraced(&mut self, now: Time, op: Op, target: Option<&str>) -> (Turn, bool) {
        let applied = self.guard.apply(&op);
        let found = applied != Applied::UnknownTarget;
        let mut effects = vec![Effect::Log(op)];
        if let Some(d) = applied.into_decision()
            && let Some(kind) = super::DecisionKind::recorded(&d)
        {
            effects.push(Effect::Decide(kind, d));
        }
        effects.extend(self.guard.drain_events().into_iter().map(Effect::Event));
        (self.record(now, effects, target), found)
    }

    /// Starts a bulk change (many targets added or removed at once): its ops are
    /// applied but not logged, since [`Replica::end_bulk`] snapshots the result.
    pub fn start_bulk(&mut self) {
        self.traced(|| Call::StartBulk);
        self.unlogged = true;
    }

    /// Ends a bulk change: a snapshot covers every op of the batch, logged or not.
    pub fn end_bulk(&mut self, at: Time, anomaly: Option<&AnomalyState>) {
        self.traced(|| Call::EndBulk {
            at,
            anomaly: anomaly.cloned(),
        });
        self.unlogged = false;
        self.snapshot_untraced(at, anomaly);
        self.pending.ops.clear();
        // Maps filled one target at a time in id order keep half-empty nodes.
        self.guard.compact();
        let standing = std::mem::take(&mut self.standing);
        self.standing = standing.into_iter().collect();
    }

    /// Puts a snapshot of the guard (and the workers' comparison) in the batch.
    pub fn snapshot(&mut self, at: Time, anomaly: Option<&AnomalyState>) {
        self.traced(|| Call::Snapshot {
            at,
            anomaly: anomaly.cloned(),
        });
        self.snapshot_untraced(at, anomaly);
    }

    fn snapshot_untraced(&mut self, at: Time, anomaly: Option<&AnomalyState>) {
        let snap = SnapshotRef {
            config: self.guard.config(),
            state: self.guard.state(),
            at,
            anomaly,
        };
        // One buffer of about the last snapshot's size, not a chain of doublings.
        let mut buf = Vec::with_capacity(self.snapshot_size + self.snapshot_size / 8);
        serde_json::to_writer(&mut buf, &snap).expect("guard state serialises");
        self.snapshot_size = buf.len();
        let text = String::from_utf8(buf).expect("serde_json writes UTF-8");
        self.pending.snapshot = Some((text, at));
        self.ops_since_snapshot = 0;
    }

    /// The batch to commit now (None: nothing to write, or nothing of this replica's
    /// own: a follower's changes are dropped), fenced by the mode's epoch.
    pub fn take(&mut self) -> Option<Uncommitted> {
        let batch = self.take_untraced();
        if self.trace.is_some() {
            let recorded = batch.clone();
            self.traced(|| Call::Take(recorded));
        }
        batch
    }

    fn take_untraced(&mut self) -> Option<Uncommitted> {
        if self.mode.follows() {
            self.pending = Uncommitted::default();
            return None;
        }
        if self.pending.is_empty() {
            return None;
        }
        let mut batch = std::mem::take(&mut self.pending);
        batch.epoch = self.mode.epoch();
        Some(batch)
    }

    /// The outcome of committing the batch last [`Replica::take`]n.
    pub fn committed(&mut self, outcome: Commit) -> AfterCommit {
        let recorded = self.trace.is_some().then(|| outcome.clone());
        let after = self.committed_untraced(outcome);
        if let Some(outcome) = recorded {
            let after = after.clone();
            self.traced(|| Call::Committed { outcome, after });
        }
        after
    }

    fn committed_untraced(&mut self, outcome: Commit) -> AfterCommit {
        match outcome {
            Commit::Done => match self.mode {
                Mode::Recovering { epoch } => {
                    self.mode = Mode::Leading { epoch };
                    AfterCommit::Recovered
                }
                _ => AfterCommit::Done,
            },
            Commit::Fenced(why) => {
                self.follow_untraced(why);
                AfterCommit::Follow
            }
            Commit::Failed(error) => {
                let first = matches!(self.mode, Mode::Leading { .. });
                self.mode = Mode::StoreFailing {
                    epoch: self.mode.epoch(),
                    error,
                    dirty: true,
                };
                AfterCommit::Undo { first }
            }
        }
    }

    /// The guard as the store holds it (after a failed commit, a new term, or to
    /// follow the leader): standings follow it back without transitions that never
    /// happened, and a failing store is no longer `dirty`.
    pub fn restore(&mut self, stored: &Stored, now: Time) -> Result<usize, RebuildError> {
        let out = self.restore_untraced(stored, now);
        if self.trace.is_some() {
            let recorded = out.as_ref().map(|n| *n).map_err(|e| e.to_string());
            let stored = stored.clone();
            self.traced(|| Call::Restore {
                stored,
                now,
                out: recorded,
            });
        }
        out
    }

    fn restore_untraced(&mut self, stored: &Stored, now: Time) -> Result<usize, RebuildError> {
        let rebuilt = Replica::rebuild(stored, self.guard.config())?;
        let r = rebuilt.replica;
        self.guard = r.guard;
        self.ops_since_snapshot = r.ops_since_snapshot;
        self.snapshot_size = r.snapshot_size;
        if let Mode::StoreFailing { dirty, .. } = &mut self.mode {
            *dirty = false;
        }
        self.standing = standings(&self.guard, now);
        Ok(rebuilt.replayed)
    }

    /// A failing store is due for a retry and the guard is as committed (not
    /// [`Mode::dirty`]): judging opens again, with the retry's batch (the driver adds
    /// what waited, then a snapshot). Returns false (nothing changed) when the guard
    /// must be restored first.
    pub fn retry(&mut self) -> bool {
        let retried = !self.mode.dirty();
        if retried {
            self.mode = Mode::Recovering {
                epoch: self.mode.epoch(),
            };
        }
        self.traced(|| Call::Retry(retried));
        retried
    }

    /// A term of this replica's own starts at `epoch`: nothing is judged until the
    /// store has been read ([`Replica::restore`], then [`Replica::retry`]).
    pub fn lead(&mut self, epoch: Option<i64>, why: String) {
        if self.trace.is_some() {
            let why = why.clone();
            self.traced(|| Call::Lead { epoch, why });
        }
        self.pending = Uncommitted::default();
        self.mode = Mode::StoreFailing {
            epoch,
            error: why,
            dirty: true,
        };
    }

    /// Another replica leads (or none does): what was not committed is dropped (a
    /// successor decides it again), and nothing is judged.
    pub fn follow(&mut self, leader: String) {
        if self.trace.is_some() {
            let leader = leader.clone();
            self.traced(|| Call::Follow { leader });
        }
        self.follow_untraced(leader);
    }

    fn follow_untraced(&mut self, leader: String) {
        self.pending = Uncommitted::default();
        self.mode = Mode::Following { leader };
    }

    /// Records a step's effects in the batch and refreshes the standings it changed.
    fn record(&mut self, now: Time, effects: Vec<Effect>, target: Option<&str>) -> Turn {
        let mut changed = false;
        for e in &effects {
            match e {
                Effect::Log(op) => {
                    changed = true;
                    if !self.unlogged {
                        self.pending.ops.push(op.clone());
                        self.ops_since_snapshot += 1;
                    }
                }
                Effect::Decide(..) | Effect::Event(_) => self.pending.effects.push(e.clone()),
                Effect::Refused(_) => {}
            }
        }
        let mut transitions = Vec::new();
        if changed {
            match target {
                Some(id) => self.refresh(now, id, &mut transitions),
                None => {
                    // Every target with a standing (a target gets one when its own op
                    // is recorded, and loses it with its removal).
                    for (id, from) in self.standing.iter_mut() {
                        if let Some(view) = self.guard.target(now, id) {
                            refreshed(now, id, from, &view, &mut transitions);
                        }
                    }
                }
            }
            self.pending.transitions.extend(transitions.iter().cloned());
        }
        Turn {
            effects,
            transitions,
        }
    }

    fn refresh(&mut self, now: Time, id: &str, out: &mut Vec<Transition>) {
        let Some(view) = self.guard.target(now, id) else {
            self.standing.remove(id);
            return;
        };
        match self.standing.get_mut(id) {
            Some(from) => refreshed(now, id, from, &view, out),
            None => {
                self.standing.insert(id.to_string(), Standing::of(&view));
            }
        }
    }
}

/// Every target's standing in `guard` at `now`.
fn standings(guard: &SafetyGuard, now: Time) -> BTreeMap<String, Standing> {
    guard
        .targets(now)
        .map(|v| (v.id.to_string(), Standing::of(&v)))
        .collect()
}

/// Target `id`'s standing `from`, refreshed from its guard view: a change is a
/// transition.
fn refreshed(
    now: Time,
    id: &str,
    from: &mut Standing,
    view: &GuardTargetView<'_>,
    out: &mut Vec<Transition>,
) {
    let to = Standing::of(view);
    if *from != to {
        out.push(Transition {
            at: now,
            id: id.to_string(),
            from: *from,
            to,
            detail: describe(view),
        });
        *from = to;
    }
}

/// What the guard says of a target, in one line (a transition's detail).
pub fn describe(v: &GuardTargetView<'_>) -> String {
    let mut parts = Vec::new();
    if v.endpoint_failed {
        parts.push("endpoint failed".to_string());
    }
    if !v.failing_checks.is_empty() {
        parts.push(format!("failing: {}", v.failing_checks.join(", ")));
    }
    if v.consecutive_failures > 0 {
        parts.push(format!("{} consecutive failures", v.consecutive_failures));
    }
    if v.flapping {
        parts.push(format!("flap penalty {}", v.penalty));
    }
    if let Some(h) = v.hold {
        parts.push(format!("{:?}: {}", h.kind, h.reason).to_lowercase());
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests;
