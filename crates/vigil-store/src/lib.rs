//! The controller's store: what must survive a crash, behind a [`Store`] trait, on
//! SQLite ([`SqliteStore`], embedded) or PostgreSQL ([`PostgresStore`], several
//! replicas). Its own crate (vigil-controller re-exports it as `store`): it depends on
//! vigil-core and the two databases' clients, nothing of the controller's.
//!
//! ## What is stored
//!
//! - **The guard's state, as a snapshot plus an op log.** Every call the controller
//!   makes on the [`SafetyGuard`](vigil_core::guard::SafetyGuard) (an observation, a
//!   target added or removed, a hold, a freeze, a reconfiguration, a tick) is appended
//!   to `guard_ops` as JSON, with the time it was made at. Now and then the whole guard
//!   state is written to `guard_snapshot` and the ops it covers are deleted. The guard is
//!   deterministic, so on restart loading the snapshot and replaying the ops after it
//!   rebuilds exactly the state before the crash: budget tokens, flap penalties,
//!   freezes, streaks.
//! - **The decision log** (`decisions`): every decision that is not a repeat of the
//!   previous one for its target, with its reasons as JSON.
//! - **Actions** (`actions`): the intent to act, written in the *same transaction* as
//!   the op and the decision that caused it, before the actuator runs; marked `done`
//!   or `failed` after. `attempts` is incremented (committed) before every run.
//! - **Transitions** (`transitions`): a target's state changes, its history.
//!
//! Decisions and transitions are pruned to the newest [`KEEP_DECISIONS`] and
//! [`KEEP_TRANSITIONS`] at each snapshot (decisions that caused an action are kept);
//! actions are never pruned.
//!
//! ## Invariants and recovery
//!
//! 1. Nothing acts before its intent is committed; an intent is never deleted. A crash
//!    between intent and `done` leaves it `intended`; on restart such actions are run
//!    again with the same idempotency key (at least once, never silently twice: each
//!    run counts in `attempts`, and the key lets the receiver deduplicate).
//! 2. An op is committed together with the decision and the intent it produced, in one
//!    transaction, so a replayed op never produces an action that was not recorded, and
//!    a recorded action's op is always replayed (the budget token is spent again in the
//!    replay: no burst after a restart).
//! 3. SIGKILL at any moment loses at most the ops not yet committed: the probes in
//!    flight (the controller commits once per batch of messages, milliseconds apart).
//!
//! ## On disk (SQLite)
//!
//! One file, `vigil.db`, in WAL mode with `synchronous = NORMAL`: a committed
//! transaction survives the process being killed; power loss may lose the last
//! transactions, never corrupt the file. The schema version is `PRAGMA user_version`;
//! migrations in [`MIGRATIONS`] run in order, each in a transaction. A file from a newer
//! vigil is refused rather than guessed at. rusqlite is blocking, so the store lives on
//! its own thread behind [`StoreHandle`].
//!
//! ## Opening: a new store, or one that is really there
//!
//! A store is created only where there is no file: built as `vigil.db.new` and renamed
//! into place once its schema is committed, so vigil itself never leaves a 0-byte or
//! schema-less `vigil.db` behind (a crash mid-creation leaves only the `.new` file,
//! replaced at the next start). An existing file is therefore a store written by an
//! earlier run, and opening it refuses ([`StoreError::Unusable`]) anything that would
//! silently start over with a full budget and no holds: a 0-byte file, a file without
//! vigil's schema, a failed `PRAGMA quick_check`, a file or file system it cannot
//! write (checked with a real write transaction, since SQLite falls back to read-only
//! by itself). Starting over is an operator's decision ([`set_aside`], the controller's
//! `--reset-store`).
//!
//! ## Rollouts (`vigil deploy`)
//!
//! The deploy driver keeps its rollouts in the same file, in three tables of its own
//! (migration 3), written by [`SqliteStore`]'s rollout methods (`rollouts.rs`):
//!
//! - `rollouts`: one row per rollout, holding the serialised
//!   [`Rollout`](vigil_core::rollout::Rollout) (its hosts' steps, phase, bad revisions,
//!   decisions, and the commands it produced but the driver has not taken yet), the
//!   policy time of the last save (`clock_ms`: the driver's clock never restarts below
//!   it), and its phase in words for listings.
//! - `rollout_steps`: every command the driver took from the policy (drain, install,
//!   undrain, alert), written `intended` in the *same transaction* as the state that no
//!   longer holds it, before it runs; marked `done` or `failed` in the same transaction
//!   as the state that took its result. `attempts` is counted (committed) before each run.
//! - `rollout_requests`: what a human asked (`abort`, `approve`, `clear_bad`) while a
//!   driver may be running; the driver applies it in the transaction that saves the
//!   state it changed, and records the outcome.
//!
//! Invariants: the state and the steps never disagree (one transaction), so after a
//! SIGKILL the driver reloads the state, runs the steps still `intended` again with the
//! same idempotency key, and polls the policy for what is next: no host is skipped, and
//! no install is started without its intent on disk. An install re-run after a crash
//! carries the key of the first run: the install hook deduplicates on it. Rollouts and
//! their steps are never pruned (a few rows per host per rollout).
//!
//! ## PostgreSQL, for several replicas
//!
//! [`PostgresStore`] (module [`pg`]) keeps the same tables with the same transactions,
//! so every invariant above holds there too; the same test suite runs against both
//! (`tests::on_sqlite`, `tests::on_postgres`). It adds what several replicas need: a
//! leader lease judged by the database's clock with an epoch that only grows, and
//! fenced writes: a [`Batch`] carries the epoch it was decided under ([`Fence`]) and
//! its commit rolls back ([`StoreError::Fenced`]) once another replica has taken over.
//! The schema version is a table there (`vigil_schema`), with the same rule: a newer
//! schema is refused. The `pg` module doc has the details.

use serde::Serialize;
use std::time::Duration;

/// Decisions kept (the newest); older ones are pruned at each snapshot. 100,000 rows is
/// weeks of a busy fleet's changes in a few tens of MB; actions are never pruned.
pub const KEEP_DECISIONS: i64 = 100_000;
/// Transitions kept (the newest), pruned like decisions.
pub const KEEP_TRANSITIONS: i64 = 100_000;

/// Bytes of snapshot text per row (the first part in `guard_snapshot`, the rest in
/// `guard_snapshot_parts`).
pub const SNAPSHOT_PART: usize = 64 * 1024;

/// `text` in parts of at most `max` bytes, each cut at a character boundary.
fn parts(text: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = rest.len().min(max.max(4));
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (part, tail) = rest.split_at(cut);
        rest = tail;
        Some(part)
    })
}

/// A store error.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite said no.
    #[error("store {path}: {source}")]
    Sqlite {
        /// The database file.
        path: String,
        /// Why.
        #[source]
        source: rusqlite::Error,
    },
    /// The file's schema is newer than this program.
    #[error(
        "store {path}: schema version {found} is newer than this vigil's {known}; refusing to guess"
    )]
    TooNew {
        /// The database file.
        path: String,
        /// Its version.
        found: i64,
        /// Ours.
        known: i64,
    },
    /// The store thread is gone (it panicked or shut down).
    #[error("the store thread is gone")]
    Gone,
    /// An existing file the controller will not start on (it would lose the state an
    /// earlier run left in it).
    #[error("store {path}: {why}")]
    Unusable {
        /// The database file (or PostgreSQL URL, without its password).
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// PostgreSQL said no, or could not be reached.
    #[error("store {url}: {why}")]
    Postgres {
        /// The URL, without its password.
        url: String,
        /// What was being done, and the server's (or the client's) words.
        why: String,
        /// The error.
        #[source]
        source: ::postgres::Error,
    },
    /// The write was decided under a lease epoch that is no longer current (another
    /// replica took over), or by a replica that does not hold the lease: nothing of it
    /// was written.
    #[error("store {url}: fenced: {why}")]
    Fenced {
        /// The URL, without its password.
        url: String,
        /// Whose lease, which epochs.
        why: String,
    },
}

/// A decision as recorded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecisionRecord {
    /// Its id.
    pub id: i64,
    /// When (UNIX milliseconds).
    pub at_ms: i64,
    /// The target.
    pub target: String,
    /// Its zone.
    pub zone: String,
    /// `act` or `hold_back`.
    pub outcome: String,
    /// The reasons, as `vigil_core::guard::Reason` JSON.
    pub reasons: serde_json::Value,
    /// The decision, said in one line.
    pub summary: String,
}

/// What an action is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionState {
    /// Written before running; still so after a crash mid-run.
    Intended,
    /// The actuator succeeded.
    Done,
    /// The actuator gave up.
    Failed,
}

impl ActionState {
    fn as_str(self) -> &'static str {
        match self {
            ActionState::Intended => "intended",
            ActionState::Done => "done",
            ActionState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> ActionState {
        match s {
            "done" => ActionState::Done,
            "failed" => ActionState::Failed,
            _ => ActionState::Intended,
        }
    }
}

/// An action as recorded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ActionRecord {
    /// Its id.
    pub id: i64,
    /// The decision that caused it.
    pub decision_id: i64,
    /// The target.
    pub target: String,
    /// Unique per action; sent to webhooks as `Idempotency-Key`.
    pub idempotency_key: String,
    /// Its state.
    pub state: ActionState,
    /// Runs started.
    pub attempts: i64,
    /// When it was intended (UNIX ms).
    pub created_ms: i64,
    /// When it finished (UNIX ms).
    pub finished_ms: Option<i64>,
    /// The actuator's last word.
    pub result: Option<String>,
    /// The event (JSON) the actuator sends.
    pub event: serde_json::Value,
    /// The leader lease's epoch it was decided under (PostgreSQL; None without a lease):
    /// the exec actuator passes it as `VIGIL_EPOCH`, a fencing token for the receiver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
}

/// A target's state change as recorded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TransitionRecord {
    /// Its id.
    pub id: i64,
    /// When (UNIX ms).
    pub at_ms: i64,
    /// The target.
    pub target: String,
    /// State before.
    pub from: String,
    /// State after.
    pub to: String,
    /// Why.
    pub detail: String,
}

/// A decision to record, maybe with the intent of an action.
#[derive(Clone, Debug)]
pub struct NewDecision {
    /// When (UNIX ms).
    pub at_ms: i64,
    /// The target.
    pub target: String,
    /// Its zone.
    pub zone: String,
    /// Act, hold back, or a freeze alert (stored as `act`, `hold_back`, `alert`).
    pub outcome: vigil_core::fleet::DecisionKind,
    /// Reasons JSON.
    pub reasons: serde_json::Value,
    /// One line.
    pub summary: String,
    /// For an act: the event the actuator will send (the idempotency key is added).
    pub action: Option<serde_json::Value>,
}

/// A state change to record.
#[derive(Clone, Debug)]
pub struct NewTransition {
    /// When (UNIX ms).
    pub at_ms: i64,
    /// The target.
    pub target: String,
    /// Before.
    pub from: String,
    /// After.
    pub to: String,
    /// Why.
    pub detail: String,
}

/// One transaction's worth of writes.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// Guard ops (each a JSON object), in order; stored as one row.
    pub ops: Vec<String>,
    /// Decisions (and intents).
    pub decisions: Vec<NewDecision>,
    /// Transitions.
    pub transitions: Vec<NewTransition>,
    /// The guard state after this batch's ops, to snapshot (and drop the ops it covers).
    pub snapshot: Option<(String, i64)>,
    /// The lease term this batch was decided in (replicas on PostgreSQL): the commit
    /// rolls back with [`StoreError::Fenced`] unless it is still current. The SQLite
    /// store (one process) ignores it.
    pub fence: Option<Fence>,
}

/// A lease term, as a fencing token: the store takes a write only while the lease
/// is still at this epoch with this holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The lease's name.
    pub lease: String,
    /// The replica that holds it.
    pub holder: String,
    /// Its epoch.
    pub epoch: i64,
}

impl Batch {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
            && self.decisions.is_empty()
            && self.transitions.is_empty()
            && self.snapshot.is_none()
    }
}

/// What a restart needs.
#[derive(Clone, Debug, Default)]
pub struct Recovered {
    /// The last snapshot (guard state JSON), if any.
    pub snapshot: Option<String>,
    /// Op rows after it, in order: each a JSON array of ops (one batch).
    pub ops: Vec<String>,
    /// Actions left `intended` (to run again).
    pub pending: Vec<ActionRecord>,
}

/// One replica's latest result for one target, as it writes it: on change only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeResultRow {
    /// The target.
    pub target: String,
    /// The probe passed.
    pub ok: bool,
    /// The failing observation (the guard's `Observation`, JSON); None when it passed.
    pub observation: Option<String>,
}

/// What one replica tells the others at each report (sharded probing): "I am alive,
/// and every result of mine not changed here is still current as of now".
#[derive(Clone, Debug, Default)]
pub struct ReplicaReport {
    /// Its id.
    pub replica: String,
    /// Its first report since it started: its rows from an earlier run are dropped
    /// first (they say nothing about now).
    pub first: bool,
    /// Results that changed since the last report.
    pub upserts: Vec<ProbeResultRow>,
    /// Targets it no longer probes: their rows go.
    pub removed: Vec<String>,
    /// A replica is live while its last report is at most this old.
    pub member_ttl: Duration,
    /// Answer with every live replica's results too (the leader asks).
    pub read_results: bool,
    /// The database's time (UNIX ms) as of which this report's results are the
    /// replica's belief: when it was composed, estimated from the replica's last
    /// answer (that answer's `now_ms` plus the local time since it arrived, never
    /// later than the truth). The store stamps the replica's heartbeat and its changed
    /// rows with the earlier of this and its own now, so a report that waited (a cut
    /// connection, a paused process, a busy store thread) cannot make old results
    /// look fresh. `None` (nothing answered yet): the store's now, and the report
    /// carries no results.
    pub as_of_ms: Option<i64>,
}

/// A live replica, as the store saw it (UNIX ms of the database's clock).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemberRow {
    /// Its id.
    pub id: String,
    /// When it first reported in this run.
    pub since_ms: i64,
    /// Its last report.
    pub seen_ms: i64,
}

/// A result as the leader reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResult {
    /// The target.
    pub target: String,
    /// The prober.
    pub replica: String,
    /// It passed.
    pub ok: bool,
    /// The failing observation (JSON), if it failed.
    pub observation: Option<String>,
    /// Current as of (its change, or its prober's last report if later), UNIX ms of
    /// the database's clock.
    pub as_of_ms: i64,
}

/// The answer to a [`ReplicaReport`].
#[derive(Clone, Debug, Default)]
pub struct ReplicaState {
    /// The database's `now()`, UNIX ms.
    pub now_ms: i64,
    /// The live replicas (this one included once its report is in).
    pub members: Vec<MemberRow>,
    /// Every live replica's results, when asked for.
    pub results: Vec<StoredResult>,
}

/// The controller's journal: what every store keeps (the guard's ops and snapshot,
/// decisions, actions, transitions). Implementations are blocking; the controller calls
/// them from one dedicated thread ([`StoreHandle`]). What only a shared store does is
/// [`ReplicaStore`], reached through [`Store::replicas`].
pub trait Store: Send {
    /// What a restart needs: snapshot, ops after it, pending actions.
    fn recover(&mut self) -> Result<Recovered, StoreError>;
    /// Writes a batch in one transaction. Returns the actions it created, in the order
    /// of their decisions.
    fn commit(&mut self, batch: &Batch) -> Result<Vec<ActionRecord>, StoreError>;
    /// Counts a run of an action (committed before the run starts).
    fn start_attempt(&mut self, id: i64) -> Result<(), StoreError>;
    /// Marks an action finished.
    fn finish_action(
        &mut self,
        id: i64,
        state: ActionState,
        at_ms: i64,
        result: &str,
    ) -> Result<(), StoreError>;
    /// Recent decisions, newest first, optionally of one target.
    fn decisions(
        &mut self,
        target: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DecisionRecord>, StoreError>;
    /// Recent actions, newest first.
    fn actions(&mut self, limit: usize) -> Result<Vec<ActionRecord>, StoreError>;
    /// A target's recent transitions, newest first.
    fn transitions(
        &mut self,
        target: &str,
        limit: usize,
    ) -> Result<Vec<TransitionRecord>, StoreError>;
    /// The latest `vigil deploy` rollouts, newest first (none: a store without them).
    fn recent_rollouts(&mut self, _limit: usize) -> Result<Vec<StoredRollout>, StoreError> {
        Ok(Vec::new())
    }
    /// What only a store shared by several replicas does (PostgreSQL); None for one
    /// that is not (SQLite): sharded probing and the lease need the shared one.
    fn replicas(&mut self) -> Option<&mut dyn ReplicaStore> {
        None
    }
}

/// A store several controller replicas share ([`PostgresStore`]): the leader lease and
/// the replicas' probe results, on top of the journal every [`Store`] keeps.
pub trait ReplicaStore: Store {
    /// Lease `name` as it stands (None: never held).
    fn lease(&mut self, name: &str) -> Result<Option<LeaseRow>, StoreError>;
    /// Records this replica's heartbeat and changed results in one transaction, and
    /// answers the live replicas (and their results, if asked).
    fn report(&mut self, report: &ReplicaReport) -> Result<ReplicaState, StoreError>;
}

impl StoreError {
    /// The error of a call that needs a [`ReplicaStore`] on a store that is not one.
    pub fn no_replicas() -> StoreError {
        StoreError::Unusable {
            path: "this store".into(),
            why: "has no replicas (sharded probing needs PostgreSQL)".into(),
        }
    }
}

pub mod pg;
pub use pg::{LeaseAnswer, LeaseRow, PostgresStore};

mod sqlite;
pub use sqlite::{
    MIGRATIONS, RolloutRequest, RolloutSave, RolloutStep, SqliteStore, StoredRollout, set_aside,
};

pub(crate) const ACTION_COLUMNS: &str = "id, decision_id, target, idempotency_key, state, attempts, created_ms, finished_ms, result, event";

// === impl StoreHealth ===

/// Whether the store takes the engine's commits, shared by the engine (which sets it
/// after every commit) with `/readyz` and the dashboard.
#[derive(Debug, Default)]
pub struct StoreHealth(std::sync::Mutex<Option<String>>);

impl StoreHealth {
    /// The last commit succeeded.
    pub fn set_ok(&self) {
        *self.0.lock().expect("store health lock") = None;
    }

    /// The last commit failed with `error`.
    pub fn set_failing(&self, error: String) {
        *self.0.lock().expect("store health lock") = Some(error);
    }

    /// The error of the last commit, if it failed.
    pub fn error(&self) -> Option<String> {
        self.0.lock().expect("store health lock").clone()
    }
}

// === impl StoreHandle ===

type Job<S> = Box<dyn FnOnce(&mut S) + Send>;

/// The store on its own thread: async callers send it closures. The one way a blocking
/// store runs off the async threads: the controller's engine holds a `dyn Store`, `vigil
/// deploy` a [`SqliteStore`] (for its rollout tables). The thread ends when every
/// handle is dropped.
pub struct StoreHandle<S: ?Sized + Send + 'static = dyn Store> {
    tx: std::sync::mpsc::Sender<Job<S>>,
}

impl<S: ?Sized + Send + 'static> Clone for StoreHandle<S> {
    fn clone(&self) -> Self {
        StoreHandle {
            tx: self.tx.clone(),
        }
    }
}

impl StoreHandle {
    /// Moves the controller's `store` onto a new thread. The thread ends when every
    /// handle is dropped.
    pub fn spawn(store: Box<dyn Store>) -> (StoreHandle, std::thread::JoinHandle<()>) {
        StoreHandle::on_thread(store)
    }
}

impl<S: ?Sized + Send + 'static> StoreHandle<S> {
    /// Moves `store` (of any type: `vigil deploy` keeps a [`SqliteStore`]) onto a new
    /// thread. The thread ends when every handle is dropped.
    pub fn on_thread(mut store: Box<S>) -> (StoreHandle<S>, std::thread::JoinHandle<()>) {
        let (tx, rx) = std::sync::mpsc::channel::<Job<S>>();
        let thread = std::thread::Builder::new()
            .name("vigil-store".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job(store.as_mut());
                }
                tracing::debug!("store thread: every handle dropped, exiting");
            })
            .expect("spawn the store thread");
        (StoreHandle { tx }, thread)
    }

    /// Runs `f` on the store thread and returns its result.
    pub async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut S) -> Result<R, StoreError> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Box::new(move |s: &mut S| {
                // The caller may have given up (shutdown); the result is then moot.
                let _ = tx.send(f(s));
            }))
            .map_err(|_| StoreError::Gone)?;
        rx.await.map_err(|_| StoreError::Gone)?
    }
}

#[cfg(test)]
pub(crate) mod tests;
