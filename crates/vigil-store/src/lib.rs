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

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

/// SQLite's page cache, as `PRAGMA cache_size` (negative: KiB). The controller writes
/// small batches, a snapshot now and then, and reads the newest rows: 512 KiB serves
/// that, where SQLite's default (2 MiB) would stay resident for nothing.
const CACHE_KIB: i64 = -512;

/// Decisions kept (the newest); older ones are pruned at each snapshot. 100,000 rows is
/// weeks of a busy fleet's changes in a few tens of MB; actions are never pruned.
pub const KEEP_DECISIONS: i64 = 100_000;
/// Transitions kept (the newest), pruned like decisions.
pub const KEEP_TRANSITIONS: i64 = 100_000;

/// Schema migrations, in order; `PRAGMA user_version` counts those applied.
pub const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    "CREATE TABLE guard_snapshot (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq INTEGER NOT NULL,
        state TEXT NOT NULL,
        saved_ms INTEGER NOT NULL
    );
    CREATE TABLE guard_ops (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        op TEXT NOT NULL
    );
    CREATE TABLE decisions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ms INTEGER NOT NULL,
        target TEXT NOT NULL,
        zone TEXT NOT NULL,
        outcome TEXT NOT NULL,
        reasons TEXT NOT NULL,
        summary TEXT NOT NULL
    );
    CREATE INDEX decisions_target ON decisions (target, id);
    CREATE TABLE actions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        decision_id INTEGER NOT NULL REFERENCES decisions (id),
        target TEXT NOT NULL,
        idempotency_key TEXT NOT NULL UNIQUE,
        state TEXT NOT NULL CHECK (state IN ('intended', 'done', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        created_ms INTEGER NOT NULL,
        finished_ms INTEGER,
        result TEXT,
        event TEXT NOT NULL
    );
    CREATE INDEX actions_state ON actions (state);
    CREATE TABLE transitions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ms INTEGER NOT NULL,
        target TEXT NOT NULL,
        from_state TEXT NOT NULL,
        to_state TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX transitions_target ON transitions (target, id);",
    // 2: a snapshot's text past its first part, in parts of SNAPSHOT_PART bytes (SQLite
    // copies each text it is given: one copy of a 10,000-target snapshot stayed resident
    // in the store thread's heap; a part's copy is reused by the next).
    "CREATE TABLE guard_snapshot_parts (
        part INTEGER PRIMARY KEY,
        text TEXT NOT NULL
    );",
    // 3: `vigil deploy`'s rollouts (see the `rollouts` section of the module doc): the
    // policy's whole state per rollout, its steps (intents, like `actions`), and the
    // requests (abort, approve, clear a bad revision) a human left for the driver.
    "CREATE TABLE rollouts (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        revision TEXT NOT NULL,
        phase TEXT NOT NULL,
        finished INTEGER NOT NULL CHECK (finished IN (0, 1)),
        state TEXT NOT NULL,
        clock_ms INTEGER NOT NULL,
        started_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL
    );
    CREATE INDEX rollouts_name ON rollouts (name, started_ms);
    CREATE TABLE rollout_steps (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        rollout TEXT NOT NULL REFERENCES rollouts (id),
        host TEXT,
        command TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('intended', 'done', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        created_ms INTEGER NOT NULL,
        finished_ms INTEGER,
        result TEXT
    );
    CREATE INDEX rollout_steps_state ON rollout_steps (rollout, state);
    CREATE TABLE rollout_requests (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('abort', 'approve', 'clear_bad')),
        detail TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        applied_ms INTEGER,
        outcome TEXT
    );
    CREATE INDEX rollout_requests_pending ON rollout_requests (name, applied_ms);",
];

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

/// The controller's persistence. Implementations are blocking; the controller calls
/// them from one dedicated thread ([`StoreHandle`]).
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
    /// Lease `name` as it stands (None: never held, or a store without leases).
    fn lease(&mut self, _name: &str) -> Result<Option<LeaseRow>, StoreError> {
        Ok(None)
    }
    /// Several replicas: records this replica's heartbeat and changed results in one
    /// transaction, and answers the live replicas (and their results, if asked). Only
    /// a shared store has replicas: the default refuses.
    fn report(&mut self, _report: &ReplicaReport) -> Result<ReplicaState, StoreError> {
        Err(StoreError::Unusable {
            path: "this store".into(),
            why: "has no replicas (sharded probing needs PostgreSQL)".into(),
        })
    }
    /// The latest `vigil deploy` rollouts, newest first (none: a store without them).
    fn recent_rollouts(&mut self, _limit: usize) -> Result<Vec<StoredRollout>, StoreError> {
        Ok(Vec::new())
    }
}

// === impl SqliteStore ===

/// The SQLite store (the default).
pub struct SqliteStore {
    conn: Connection,
    path: String,
    keep: (i64, i64),
}

impl SqliteStore {
    /// Opens the store at `path`, migrating it: creates it if no file is there, and
    /// refuses ([`StoreError::Unusable`]) an existing file that is not a store it can
    /// use (see the module doc).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let shown = path.display().to_string();
        if !path.exists() {
            create(path)?;
            tracing::info!(store = %shown, "new store created");
        }
        let unusable = |why: String| StoreError::Unusable {
            path: shown.clone(),
            why,
        };
        let len = std::fs::metadata(path)
            .map_err(|e| unusable(format!("cannot be read: {e}")))?
            .len();
        if len == 0 {
            return Err(unusable(
                "is empty (0 bytes), where a store written by an earlier run was expected".into(),
            ));
        }
        let sqlite = |what: &str| {
            let shown = shown.clone();
            let what = what.to_string();
            move |e: rusqlite::Error| StoreError::Unusable {
                path: shown.clone(),
                why: format!("{what}: {e}"),
            }
        };
        // Read-write, never create: the file is there, and must stay the one opened.
        let mut conn = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX
                | rusqlite::OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(sqlite("cannot be opened"))?;
        if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(true) {
            return Err(unusable(
                "cannot be written (read-only file or file system)".into(),
            ));
        }
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sqlite("cannot be opened"))?;
        let check: Vec<String> = conn
            .prepare("PRAGMA quick_check")
            .and_then(|mut st| {
                st.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<_, _>>()
            })
            .map_err(sqlite("is not a readable SQLite database"))?;
        if check != ["ok"] {
            return Err(unusable(format!(
                "fails PRAGMA quick_check: {}",
                check.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
            )));
        }
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(sqlite("is not a readable SQLite database"))?;
        let tables: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_schema WHERE type = 'table' AND name = 'guard_snapshot'",
                [],
                |r| r.get(0),
            )
            .map_err(sqlite("is not a readable SQLite database"))?;
        if version == 0 || tables == 0 {
            return Err(unusable(format!(
                "holds no vigil store (schema version {version}, no guard_snapshot table), where a store written by an earlier run was expected"
            )));
        }
        let known = MIGRATIONS.len() as i64;
        if version > known {
            return Err(StoreError::TooNew {
                path: shown,
                found: version,
                known,
            });
        }
        // A real write, as every commit will make: SQLite opens a file it cannot write
        // read-only without a word, and a read-only file system shows only here.
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; PRAGMA user_version = {version}; COMMIT;"
        ))
        .map_err(sqlite("cannot be written"))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sqlite("cannot be written"))?;
        let e = |source| StoreError::Sqlite {
            path: shown.clone(),
            source,
        };
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(e)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(e)?;
        conn.pragma_update(None, "cache_size", CACHE_KIB)
            .map_err(e)?;
        migrate(&mut conn, &shown, version)?;
        Ok(SqliteStore {
            conn,
            path: shown,
            keep: (KEEP_DECISIONS, KEEP_TRANSITIONS),
        })
    }

    /// Changes how many decisions and transitions are kept (tests use small numbers).
    pub fn with_retention(mut self, decisions: i64, transitions: i64) -> Self {
        self.keep = (decisions, transitions);
        self
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }
}

/// Applies the migrations after `version`, each in its own transaction.
fn migrate(conn: &mut Connection, shown: &str, version: i64) -> Result<(), StoreError> {
    let e = |source| StoreError::Sqlite {
        path: shown.to_string(),
        source,
    };
    for (i, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(version).unwrap_or(0))
    {
        let tx = conn.transaction().map_err(e)?;
        tx.execute_batch(sql).map_err(e)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)
            .map_err(e)?;
        tx.commit().map_err(e)?;
        tracing::info!(store = %shown, version = i + 1, "store schema migrated");
    }
    Ok(())
}

/// Creates a new store at `path` (where no file is): built beside it as `<path>.new`
/// and renamed into place once its schema is committed and synced.
fn create(path: &Path) -> Result<(), StoreError> {
    let shown = path.display().to_string();
    let io = |what: &str, e: std::io::Error| StoreError::Unusable {
        path: shown.clone(),
        why: format!("cannot be created ({what}): {e}"),
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = std::path::PathBuf::from(tmp);
    for leftover in ["", "-journal", "-wal", "-shm"] {
        let mut p = tmp.as_os_str().to_owned();
        p.push(leftover);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing a leftover", e)),
        }
    }
    {
        let mut conn = Connection::open(&tmp).map_err(|source| StoreError::Sqlite {
            path: tmp.display().to_string(),
            source,
        })?;
        migrate(&mut conn, &tmp.display().to_string(), 0)?;
    }
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| io("syncing", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("renaming into place", e))?;
    if let Some(dir) = path.parent() {
        // The rename is durable once the directory is synced.
        std::fs::File::open(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        })
        .and_then(|d| d.sync_all())
        .map_err(|e| io("syncing its directory", e))?;
    }
    Ok(())
}

/// Moves the store at `path` (and its `-wal` and `-shm` files) aside, to
/// `<path>.reset-<UNIX seconds>`, so the next [`SqliteStore::open`] starts over.
/// Returns where it went (None: there was no file).
pub fn set_aside(path: &Path) -> Result<Option<std::path::PathBuf>, StoreError> {
    if !path.exists() {
        return Ok(None);
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut to = path.as_os_str().to_owned();
    to.push(format!(".reset-{secs}"));
    let to = std::path::PathBuf::from(to);
    for suffix in ["", "-wal", "-shm"] {
        let (mut a, mut b) = (path.as_os_str().to_owned(), to.as_os_str().to_owned());
        a.push(suffix);
        b.push(suffix);
        match std::fs::rename(&a, &b) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(StoreError::Unusable {
                    path: path.display().to_string(),
                    why: format!("cannot be moved aside to {}: {e}", b.to_string_lossy()),
                });
            }
        }
    }
    Ok(Some(to))
}

fn action_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ActionRecord> {
    let state: String = r.get(4)?;
    let event: String = r.get(9)?;
    Ok(ActionRecord {
        id: r.get(0)?,
        decision_id: r.get(1)?,
        target: r.get(2)?,
        idempotency_key: r.get(3)?,
        state: ActionState::parse(&state),
        attempts: r.get(5)?,
        created_ms: r.get(6)?,
        finished_ms: r.get(7)?,
        result: r.get(8)?,
        event: serde_json::from_str(&event).unwrap_or(serde_json::Value::Null),
        epoch: None,
    })
}

const ACTION_COLUMNS: &str = "id, decision_id, target, idempotency_key, state, attempts, created_ms, finished_ms, result, event";

impl Store for SqliteStore {
    fn recent_rollouts(&mut self, limit: usize) -> Result<Vec<StoredRollout>, StoreError> {
        SqliteStore::recent_rollouts(self, limit)
    }

    fn recover(&mut self) -> Result<Recovered, StoreError> {
        let e = self.err();
        let mut snap: Option<(i64, String)> = self
            .conn
            .query_row(
                "SELECT seq, state FROM guard_snapshot WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(&e)?;
        if let Some((_, text)) = &mut snap {
            let mut stmt = self
                .conn
                .prepare("SELECT text FROM guard_snapshot_parts ORDER BY part")
                .map_err(&e)?;
            let mut rows = stmt.query([]).map_err(&e)?;
            while let Some(row) = rows.next().map_err(&e)? {
                text.push_str(row.get_ref(0).map_err(&e)?.as_str().map_err(|x| {
                    e(rusqlite::Error::FromSqlConversionFailure(
                        0,
                        rusqlite::types::Type::Text,
                        Box::new(x),
                    ))
                })?);
            }
        }
        let after = snap.as_ref().map_or(0, |s| s.0);
        let mut stmt = self
            .conn
            .prepare("SELECT op FROM guard_ops WHERE seq > ?1 ORDER BY seq")
            .map_err(&e)?;
        let ops = stmt
            .query_map([after], |r| r.get::<_, String>(0))
            .map_err(&e)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&e)?;
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {ACTION_COLUMNS} FROM actions WHERE state = 'intended' ORDER BY id"
            ))
            .map_err(&e)?;
        let pending = stmt
            .query_map([], action_from_row)
            .map_err(&e)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&e)?;
        Ok(Recovered {
            snapshot: snap.map(|s| s.1),
            ops,
            pending,
        })
    }

    fn commit(&mut self, batch: &Batch) -> Result<Vec<ActionRecord>, StoreError> {
        let (keep_decisions, keep_transitions) = self.keep;
        let path = self.path.clone();
        let e = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(e)?;
        let mut created = Vec::new();
        {
            if !batch.ops.is_empty() {
                // One row per batch (a JSON array of ops): one insert however many
                // probes the batch holds.
                let mut row =
                    String::with_capacity(batch.ops.iter().map(|o| o.len() + 1).sum::<usize>() + 2);
                row.push('[');
                row.push_str(&batch.ops.join(","));
                row.push(']');
                tx.prepare_cached("INSERT INTO guard_ops (op) VALUES (?1)")
                    .map_err(e)?
                    .execute([row])
                    .map_err(e)?;
            }
            for d in &batch.decisions {
                tx.prepare_cached(
                    "INSERT INTO decisions (at_ms, target, zone, outcome, reasons, summary)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(e)?
                .execute(params![
                    d.at_ms,
                    d.target,
                    d.zone,
                    d.outcome.as_str(),
                    d.reasons.to_string(),
                    d.summary
                ])
                .map_err(e)?;
                let decision_id = tx.last_insert_rowid();
                if let Some(event) = &d.action {
                    // The key is fixed before the id is known: derive it from the
                    // decision's id, unique in this store and stable across retries.
                    let key = format!("vigil-{}-{}", d.at_ms, decision_id);
                    let mut event = event.clone();
                    event["idempotency_key"] = serde_json::Value::String(key.clone());
                    tx.prepare_cached(
                        "INSERT INTO actions (decision_id, target, idempotency_key, state, created_ms, event)
                         VALUES (?1, ?2, ?3, 'intended', ?4, ?5)",
                    )
                    .map_err(e)?
                    .execute(params![decision_id, d.target, key, d.at_ms, event.to_string()])
                    .map_err(e)?;
                    created.push(ActionRecord {
                        id: tx.last_insert_rowid(),
                        decision_id,
                        target: d.target.clone(),
                        idempotency_key: key,
                        state: ActionState::Intended,
                        attempts: 0,
                        created_ms: d.at_ms,
                        finished_ms: None,
                        result: None,
                        event,
                        epoch: None,
                    });
                }
            }
            for t in &batch.transitions {
                tx.prepare_cached(
                    "INSERT INTO transitions (at_ms, target, from_state, to_state, detail)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(e)?
                .execute(params![t.at_ms, t.target, t.from, t.to, t.detail])
                .map_err(e)?;
            }
            if let Some((state, saved_ms)) = &batch.snapshot {
                let seq: i64 = tx
                    .query_row("SELECT COALESCE(MAX(seq), 0) FROM guard_ops", [], |r| {
                        r.get(0)
                    })
                    .map_err(e)?;
                let mut parts = parts(state, SNAPSHOT_PART);
                tx.execute(
                    "INSERT INTO guard_snapshot (id, seq, state, saved_ms) VALUES (1, ?1, ?2, ?3)
                     ON CONFLICT (id) DO UPDATE SET seq = ?1, state = ?2, saved_ms = ?3",
                    params![seq, parts.next().unwrap_or(""), saved_ms],
                )
                .map_err(e)?;
                tx.execute("DELETE FROM guard_snapshot_parts", [])
                    .map_err(e)?;
                for (i, part) in parts.enumerate() {
                    tx.prepare_cached(
                        "INSERT INTO guard_snapshot_parts (part, text) VALUES (?1, ?2)",
                    )
                    .map_err(e)?
                    .execute(params![i as i64 + 1, part])
                    .map_err(e)?;
                }
                tx.execute("DELETE FROM guard_ops WHERE seq <= ?1", [seq])
                    .map_err(e)?;
                // Retention, at snapshot time only (cheap, bounded work). Decisions an
                // action refers to are kept.
                tx.execute(
                    "DELETE FROM decisions WHERE id <= (SELECT MAX(id) FROM decisions) - ?1
                     AND id NOT IN (SELECT decision_id FROM actions)",
                    [keep_decisions],
                )
                .map_err(e)?;
                tx.execute(
                    "DELETE FROM transitions WHERE id <= (SELECT MAX(id) FROM transitions) - ?1",
                    [keep_transitions],
                )
                .map_err(e)?;
            }
        }
        tx.commit().map_err(e)?;
        Ok(created)
    }

    fn start_attempt(&mut self, id: i64) -> Result<(), StoreError> {
        let e = self.err();
        self.conn
            .execute(
                "UPDATE actions SET attempts = attempts + 1 WHERE id = ?1",
                [id],
            )
            .map_err(e)?;
        Ok(())
    }

    fn finish_action(
        &mut self,
        id: i64,
        state: ActionState,
        at_ms: i64,
        result: &str,
    ) -> Result<(), StoreError> {
        let e = self.err();
        self.conn
            .execute(
                "UPDATE actions SET state = ?2, finished_ms = ?3, result = ?4 WHERE id = ?1",
                params![id, state.as_str(), at_ms, result],
            )
            .map_err(e)?;
        Ok(())
    }

    fn decisions(
        &mut self,
        target: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DecisionRecord>, StoreError> {
        let e = self.err();
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, at_ms, target, zone, outcome, reasons, summary FROM decisions
                 WHERE (?1 IS NULL OR target = ?1) ORDER BY id DESC LIMIT ?2",
            )
            .map_err(&e)?;
        let rows = stmt
            .query_map(params![target, limit as i64], |r| {
                let reasons: String = r.get(5)?;
                Ok(DecisionRecord {
                    id: r.get(0)?,
                    at_ms: r.get(1)?,
                    target: r.get(2)?,
                    zone: r.get(3)?,
                    outcome: r.get(4)?,
                    reasons: serde_json::from_str(&reasons).unwrap_or(serde_json::Value::Null),
                    summary: r.get(6)?,
                })
            })
            .map_err(&e)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&e)?;
        Ok(rows)
    }

    fn actions(&mut self, limit: usize) -> Result<Vec<ActionRecord>, StoreError> {
        let e = self.err();
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {ACTION_COLUMNS} FROM actions ORDER BY id DESC LIMIT ?1"
            ))
            .map_err(&e)?;
        let rows = stmt
            .query_map([limit as i64], action_from_row)
            .map_err(&e)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&e)?;
        Ok(rows)
    }

    fn transitions(
        &mut self,
        target: &str,
        limit: usize,
    ) -> Result<Vec<TransitionRecord>, StoreError> {
        let e = self.err();
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, at_ms, target, from_state, to_state, detail FROM transitions
                 WHERE target = ?1 ORDER BY id DESC LIMIT ?2",
            )
            .map_err(&e)?;
        let rows = stmt
            .query_map(params![target, limit as i64], |r| {
                Ok(TransitionRecord {
                    id: r.get(0)?,
                    at_ms: r.get(1)?,
                    target: r.get(2)?,
                    from: r.get(3)?,
                    to: r.get(4)?,
                    detail: r.get(5)?,
                })
            })
            .map_err(&e)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&e)?;
        Ok(rows)
    }
}

pub mod pg;
pub use pg::{LeaseAnswer, LeaseRow, PostgresStore};

mod rollouts;
pub use rollouts::{RolloutRequest, RolloutSave, RolloutStep, StoredRollout};

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

type Job = Box<dyn FnOnce(&mut dyn Store) + Send>;

/// The store on its own thread: async callers send it closures.
#[derive(Clone)]
pub struct StoreHandle {
    tx: std::sync::mpsc::Sender<Job>,
}

impl StoreHandle {
    /// Moves `store` onto a new thread. The thread ends when every handle is dropped.
    pub fn spawn(mut store: Box<dyn Store>) -> (StoreHandle, std::thread::JoinHandle<()>) {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
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
        F: FnOnce(&mut dyn Store) -> Result<R, StoreError> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Box::new(move |s: &mut dyn Store| {
                // The caller may have given up (shutdown); the result is then moot.
                let _ = tx.send(f(s));
            }))
            .map_err(|_| StoreError::Gone)?;
        rx.await.map_err(|_| StoreError::Gone)?
    }
}

#[cfg(test)]
pub(crate) mod tests;
