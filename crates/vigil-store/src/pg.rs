//! The PostgreSQL store: the same tables, the same transactions and the same
//! invariants as the SQLite store (the parent module's doc), for several controller
//! replicas sharing one database, plus the leader lease and fenced writes.
//!
//! ## Why the blocking `postgres` crate
//!
//! [`Store`] is a blocking trait served by one dedicated thread ([`StoreHandle`](super::StoreHandle)): the
//! engine's commits are already serialised there, as SQLite needs. The `postgres` crate
//! is tokio-postgres (the same protocol code, types and errors) behind a blocking
//! client that drives its connection on a small runtime of its own; it fits that
//! thread as it is. tokio-postgres itself would need the store thread to own a runtime
//! and `block_on` every call: the same thing, written by hand. Nothing is gained by an
//! async store while one writer commits one batch at a time.
//!
//! ## Schema and migrations
//!
//! The tables live in the connection's current schema (the first of its
//! `search_path`): point a controller at a schema of its own with
//! `options=-csearch_path%3Dvigil` in the URL. The schema version is the one row of
//! `vigil_schema`; [`PG_MIGRATIONS`] run in order, each in a transaction that first locks
//! `vigil_schema` (replicas starting together migrate once, the others wait and see the
//! new version). Versions 1 to 3 hold the same tables as SQLite's (PostgreSQL types:
//! identity columns for `AUTOINCREMENT`); version 4 adds the lease, version 5 the
//! replicas' heartbeats and probe results (`replicas`, `probe_results`: sharded
//! probing, written by every replica, unfenced: a result is a fact, not a decision). A schema from a newer
//! vigil is refused ([`StoreError::TooNew`]), and so are a search_path naming no schema
//! and a schema holding vigil's tables without `vigil_schema`.
//!
//! ## The leader lease (database clock, monotonic epoch)
//!
//! One row of `leases` per lease name: the holder (a replica id), the epoch (a counter
//! that only grows: one per term of leadership) and `expires_at`. [`PostgresStore::try_lease`]
//! acquires or renews in ONE statement, judged by the database's `now()` only:
//!
//! - a renewal succeeds only for the holder *and* the epoch it was granted (matching the
//!   name or the holder alone lets a replica whose lease was taken over renew someone
//!   else's term: Oban #1488, two leaders);
//! - an acquisition succeeds only once the lease has expired, and starts a new epoch;
//! - otherwise nothing changes and the statement answers who holds it.
//!
//! No session state is used for correctness (no advisory lock, no LISTEN, no
//! connection-bound lock), so the store works through a transaction pooler (PgBouncer in
//! transaction mode 1.21 or later: tokio-postgres prepares its statements). When to renew
//! and when a replica must consider itself demoted is `vigil_core::lease`'s, with the
//! times passed in.
//!
//! ## Fenced writes
//!
//! A lease alone does not stop a leader paused past its term from writing when it
//! wakes (Kubernetes leader election does not fence either). So every batch carries the
//! epoch it was decided under ([`Batch::fence`]), and [`Store::commit`] first locks the
//! lease row (`SELECT ... FOR UPDATE`) in the same transaction and rolls back with
//! [`StoreError::Fenced`] unless that epoch and holder are still current: the storage
//! rejects an older token (Kleppmann's fencing tokens). The row lock orders the commit
//! against a concurrent takeover: the takeover waits for the commit, or the commit sees
//! the new epoch. A store opened for a replica ([`PostgresStore::for_replica`]) refuses a
//! batch without a fence, and counts an action's attempt only while its replica holds an
//! unexpired lease, so a deposed leader's actuator does not start a run either. An
//! action's idempotency key is unique (a constraint): the same intent cannot be
//! recorded twice.

use super::{
    ACTION_COLUMNS, ActionRecord, ActionState, Batch, DecisionRecord, KEEP_DECISIONS,
    KEEP_TRANSITIONS, MemberRow, Recovered, ReplicaReport, ReplicaState, ReplicaStore,
    SNAPSHOT_PART, Store, StoreError, StoredResult, TransitionRecord, parts,
};
use postgres::{Client, NoTls};
use std::time::Duration;

/// How long connecting may take before the store is reported unreachable: a database
/// on the same network answers in milliseconds; five seconds covers a busy one.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Schema migrations, in order; `vigil_schema.version` counts those applied. 1-3 are
/// SQLite's [`super::MIGRATIONS`] in PostgreSQL's dialect; 4 is the lease, 5 the
/// replicas' membership and probe results (sharded probing).
pub const PG_MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    "CREATE TABLE guard_snapshot (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq BIGINT NOT NULL,
        state TEXT NOT NULL,
        saved_ms BIGINT NOT NULL
    );
    CREATE TABLE guard_ops (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        op TEXT NOT NULL
    );
    CREATE TABLE decisions (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at_ms BIGINT NOT NULL,
        target TEXT NOT NULL,
        zone TEXT NOT NULL,
        outcome TEXT NOT NULL,
        reasons TEXT NOT NULL,
        summary TEXT NOT NULL
    );
    CREATE INDEX decisions_target ON decisions (target, id);
    CREATE TABLE actions (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        decision_id BIGINT NOT NULL REFERENCES decisions (id),
        target TEXT NOT NULL,
        idempotency_key TEXT NOT NULL UNIQUE,
        state TEXT NOT NULL CHECK (state IN ('intended', 'done', 'failed')),
        attempts BIGINT NOT NULL DEFAULT 0,
        created_ms BIGINT NOT NULL,
        finished_ms BIGINT,
        result TEXT,
        event TEXT NOT NULL
    );
    CREATE INDEX actions_state ON actions (state);
    CREATE TABLE transitions (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at_ms BIGINT NOT NULL,
        target TEXT NOT NULL,
        from_state TEXT NOT NULL,
        to_state TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX transitions_target ON transitions (target, id);",
    // 2: a snapshot's text past its first part.
    "CREATE TABLE guard_snapshot_parts (
        part BIGINT PRIMARY KEY,
        text TEXT NOT NULL
    );",
    // 3: `vigil deploy`'s rollouts (the deploy driver runs on SQLite today; the tables
    // keep the two schemas' versions in step).
    "CREATE TABLE rollouts (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        revision TEXT NOT NULL,
        phase TEXT NOT NULL,
        finished INTEGER NOT NULL CHECK (finished IN (0, 1)),
        state TEXT NOT NULL,
        clock_ms BIGINT NOT NULL,
        started_ms BIGINT NOT NULL,
        updated_ms BIGINT NOT NULL
    );
    CREATE INDEX rollouts_name ON rollouts (name, started_ms);
    CREATE TABLE rollout_steps (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        rollout TEXT NOT NULL REFERENCES rollouts (id),
        host TEXT,
        command TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('intended', 'done', 'failed')),
        attempts BIGINT NOT NULL DEFAULT 0,
        created_ms BIGINT NOT NULL,
        finished_ms BIGINT,
        result TEXT
    );
    CREATE INDEX rollout_steps_state ON rollout_steps (rollout, state);
    CREATE TABLE rollout_requests (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('abort', 'approve', 'clear_bad')),
        detail TEXT NOT NULL,
        created_ms BIGINT NOT NULL,
        applied_ms BIGINT,
        outcome TEXT
    );
    CREATE INDEX rollout_requests_pending ON rollout_requests (name, applied_ms);",
    // 4: the leader lease, and the epoch each action was decided under.
    "CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        epoch BIGINT NOT NULL CHECK (epoch > 0),
        acquired_at TIMESTAMPTZ NOT NULL,
        renewed_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    );
    ALTER TABLE actions ADD COLUMN epoch BIGINT;",
    // 5: sharded probing: the live replicas, and each one's latest result per target
    // (written on change; see `crate::probing`).
    "CREATE TABLE replicas (
        id TEXT PRIMARY KEY,
        started_at TIMESTAMPTZ NOT NULL,
        seen_at TIMESTAMPTZ NOT NULL
    );
    CREATE TABLE probe_results (
        target TEXT NOT NULL,
        replica TEXT NOT NULL,
        ok BOOLEAN NOT NULL,
        observation TEXT,
        changed_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (target, replica)
    );
    CREATE INDEX probe_results_replica ON probe_results (replica);",
];

/// A replica not heard from for this long is forgotten with its results (a replica
/// that restarts with the same id starts over anyway).
const FORGET_REPLICAS_AFTER: &str = "1 hour";

/// A statement of a store opened without a lease runs at most this long: the
/// largest write (a snapshot of 10,000 targets, about a megabyte) takes well under a
/// second on a database that works.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// A lock is waited for at most this long by a store opened without a lease.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// The bounds of a replica's statements for lease TTL `ttl`: a statement runs at most
/// `ttl / 2`, a lock is waited for at most `ttl / 5`. The lease task's request then
/// fails in time for another attempt before the leader's local deadline
/// (`ttl - ttl / 5`), and an engine commit stuck behind a lock (which holds the lease
/// row `FOR UPDATE`, so renewals would queue behind it) gives the row back within
/// `ttl / 5` instead of freezing every replica until the lock goes.
pub fn limits_for_lease(ttl: Duration) -> (Duration, Duration) {
    (
        (ttl / 2).max(Duration::from_millis(1)),
        (ttl / 5).max(Duration::from_millis(1)),
    )
}

/// `SET LOCAL` of the bounds: transaction-scoped, so it holds through a transaction
/// pooler (PgBouncer in transaction mode hands each transaction any server
/// connection; a session `SET` or a startup option would stay on one it no longer
/// uses, or be refused). A transaction left idle for longer than a statement may run
/// (its process paused by SIGSTOP or cut off in the middle of a commit) is ended by the
/// server (`idle_in_transaction_session_timeout`), so the lease row it holds
/// `FOR UPDATE` is freed for the other replicas instead of staying locked until TCP
/// gives up on the session.
fn limits_sql(statement: Duration, lock: Duration) -> String {
    let statement = statement.as_millis().max(1);
    format!(
        "SET LOCAL statement_timeout = '{statement}ms'; SET LOCAL lock_timeout = '{}ms'; \
         SET LOCAL idle_in_transaction_session_timeout = '{statement}ms'",
        lock.as_millis().max(1)
    )
}

/// A transaction whose statements are bounded by `limits`.
fn begin<'a>(
    client: &'a mut Client,
    limits: &str,
) -> Result<postgres::Transaction<'a>, postgres::Error> {
    let mut tx = client.transaction()?;
    tx.batch_execute(limits)?;
    Ok(tx)
}

/// The lease every controller replica of one store competes for.
pub const CONTROLLER_LEASE: &str = "controller";

/// A lease as the database saw it, in UNIX milliseconds of the database's clock.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LeaseRow {
    /// The replica holding it.
    pub holder: String,
    /// Its term.
    pub epoch: i64,
    /// When this term began.
    pub since_ms: i64,
    /// When it expires unless renewed.
    pub expires_ms: i64,
    /// The database's `now()` when this was read.
    pub now_ms: i64,
}

impl LeaseRow {
    /// Whether the database still counted it as held when it was read.
    pub fn live(&self) -> bool {
        self.expires_ms > self.now_ms
    }
}

/// The answer to [`PostgresStore::try_lease`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// Ours, at this epoch (renewed, or newly acquired).
    Granted(LeaseRow),
    /// Someone else's (or ours at another epoch): this row as it stood.
    Held(LeaseRow),
    /// No one has ever held it and the insert lost a race: try again.
    Vacant,
}

/// The controller's PostgreSQL store.
pub struct PostgresStore {
    client: Client,
    /// What `client` was made from: a connection that broke (a partition past
    /// `tcp_user_timeout`, a restarted server, a terminated backend) is made again
    /// from it at the next call ([`PostgresStore::connection`]).
    config: postgres::Config,
    /// The URL without its password, for messages.
    url: String,
    keep: (i64, i64),
    /// Set for a replica: its lease and id. Commits then need a fence.
    replica: Option<(String, String)>,
    /// `SET LOCAL statement_timeout ...; SET LOCAL lock_timeout ...`, run first in
    /// every transaction (see [`limits_sql`]).
    limits: String,
}

/// `url` without the password, for logs and errors.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// A PostgreSQL error in words: the server's message (and detail) for a database error,
/// else the client's error and its causes.
pub fn describe(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(d) = db.detail() {
            s.push_str(&format!("; {d}"));
        }
        return s;
    }
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        s.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    s
}

fn ms_of(column: &str) -> String {
    format!("(EXTRACT(EPOCH FROM {column}) * 1000)::BIGINT")
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user@host:port/db?options=...`) and migrates its
    /// schema. An unreachable server, a refused login or an unusable schema is an error
    /// naming the URL (without its password).
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let shown = redact(url);
        let mut config: postgres::Config = url.parse().map_err(|e| StoreError::Unusable {
            path: shown.clone(),
            why: format!("is not a PostgreSQL URL: {e}"),
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_tcp_user_timeout().is_none() {
            // A statement sent to a server that vanished (no ACK) fails after this
            // rather than at the kernel's default of about 15 minutes.
            config.tcp_user_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("vigil-controller");
        }
        let mut client = config.connect(NoTls).map_err(|e| StoreError::Postgres {
            url: shown.clone(),
            why: format!("cannot connect: {}", describe(&e)),
            source: e,
        })?;
        migrate(&mut client, &shown)?;
        Ok(PostgresStore {
            client,
            config,
            url: shown,
            keep: (KEEP_DECISIONS, KEEP_TRANSITIONS),
            replica: None,
            limits: limits_sql(DEFAULT_STATEMENT_TIMEOUT, DEFAULT_LOCK_TIMEOUT),
        })
    }

    /// This store serves replica `id` competing for `lease`: commits must carry a fence
    /// and attempts are counted only while `id` holds the lease.
    pub fn for_replica(mut self, lease: &str, id: &str) -> Self {
        self.replica = Some((lease.to_string(), id.to_string()));
        self
    }

    /// Bounds every statement of this store by `statement` and every lock wait by
    /// `lock` (see [`limits_for_lease`]).
    pub fn with_limits(mut self, statement: Duration, lock: Duration) -> Self {
        self.limits = limits_sql(statement, lock);
        self
    }

    /// The connection, made again first if the last one broke. A `postgres::Client`
    /// whose connection ended stays closed: every later call would fail with
    /// "connection closed" forever, so a replica cut off from the database for longer
    /// than `tcp_user_timeout` (or whose backend was restarted or terminated) would
    /// never lead, commit or report again once the database was back. The call that
    /// met the break has already failed (its outcome unknown to the caller, who treats
    /// it as not done); nothing is retried here.
    fn connection(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.is_closed() {
            let client = self
                .config
                .connect(NoTls)
                .map_err(|e| StoreError::Postgres {
                    url: self.url.clone(),
                    why: format!("reconnecting: {}", describe(&e)),
                    source: e,
                })?;
            tracing::warn!(store = %self.url, "PostgreSQL connection made again after it broke");
            self.client = client;
        }
        Ok(&mut self.client)
    }

    /// Runs `f` in a transaction of its own, bounded like every other.
    fn once<T>(
        &mut self,
        what: &'static str,
        f: impl FnOnce(&mut postgres::Transaction<'_>) -> Result<T, postgres::Error>,
    ) -> Result<T, StoreError> {
        let err = self.err(what);
        let limits = self.limits.clone();
        let mut tx = begin(self.connection()?, &limits).map_err(&err)?;
        let v = f(&mut tx).map_err(&err)?;
        tx.commit().map_err(&err)?;
        Ok(v)
    }

    /// Changes how many decisions and transitions are kept (tests use small numbers).
    pub fn with_retention(mut self, decisions: i64, transitions: i64) -> Self {
        self.keep = (decisions, transitions);
        self
    }

    /// The URL it was opened with, without the password.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn err(&self, what: &'static str) -> impl Fn(postgres::Error) -> StoreError + use<> {
        let url = self.url.clone();
        move |e| StoreError::Postgres {
            url: url.clone(),
            why: format!("{what}: {}", describe(&e)),
            source: e,
        }
    }

    /// Acquires or renews `lease` for `holder` in one statement, judged by the
    /// database's clock: renewed when `holder` holds it at `epoch` and it has not
    /// expired; acquired at the next epoch when it has expired (whoever held it);
    /// else left alone. `epoch` None only acquires.
    pub fn try_lease(
        &mut self,
        lease: &str,
        holder: &str,
        ttl: Duration,
        epoch: Option<i64>,
    ) -> Result<LeaseAnswer, StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let sql = format!(
            "WITH granted AS (
                INSERT INTO leases AS l (name, holder, epoch, acquired_at, renewed_at, expires_at)
                VALUES ($1, $2, 1, now(), now(), now() + $3::BIGINT * INTERVAL '1 millisecond')
                ON CONFLICT (name) DO UPDATE SET
                    holder = EXCLUDED.holder,
                    epoch = CASE WHEN l.expires_at > now() THEN l.epoch ELSE l.epoch + 1 END,
                    acquired_at = CASE WHEN l.expires_at > now() THEN l.acquired_at ELSE now() END,
                    renewed_at = now(),
                    expires_at = EXCLUDED.expires_at
                WHERE l.expires_at <= now() OR (l.holder = EXCLUDED.holder AND l.epoch = $4::BIGINT)
                RETURNING l.holder, l.epoch, l.acquired_at, l.expires_at
            )
            SELECT TRUE, holder, epoch, {a}, {x}, {n} FROM granted
            UNION ALL
            SELECT FALSE, holder, epoch, {a}, {x}, {n} FROM leases
            WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM granted)",
            a = ms_of("acquired_at"),
            x = ms_of("expires_at"),
            n = ms_of("now()"),
        );
        let rows = self.once("acquiring or renewing the lease", |c| {
            c.query(&sql, &[&lease, &holder, &ttl_ms, &epoch])
        })?;
        let Some(r) = rows.first() else {
            return Ok(LeaseAnswer::Vacant);
        };
        let row = LeaseRow {
            holder: r.get(1),
            epoch: r.get(2),
            since_ms: r.get(3),
            expires_ms: r.get(4),
            now_ms: r.get(5),
        };
        Ok(if r.get::<_, bool>(0) {
            LeaseAnswer::Granted(row)
        } else {
            LeaseAnswer::Held(row)
        })
    }

    /// Gives `lease` up at once (expires now) if `holder` holds it at `epoch`, so
    /// another replica takes over at its next attempt. Returns whether it did.
    pub fn resign(&mut self, lease: &str, holder: &str, epoch: i64) -> Result<bool, StoreError> {
        let n = self.once("resigning the lease", |c| c.execute(
                "UPDATE leases SET expires_at = now() WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()",
                &[&lease, &holder, &epoch],
            ))?;
        Ok(n == 1)
    }

    /// The lease as it stands, if anyone ever held it.
    pub fn lease(&mut self, lease: &str) -> Result<Option<LeaseRow>, StoreError> {
        let sql = format!(
            "SELECT holder, epoch, {a}, {x}, {n} FROM leases WHERE name = $1",
            a = ms_of("acquired_at"),
            x = ms_of("expires_at"),
            n = ms_of("now()"),
        );
        let row = self.once("reading the lease", |c| c.query_opt(&sql, &[&lease]))?;
        Ok(row.map(|r| LeaseRow {
            holder: r.get(0),
            epoch: r.get(1),
            since_ms: r.get(2),
            expires_ms: r.get(3),
            now_ms: r.get(4),
        }))
    }

    /// Test access to the connection (raw SQL in the store's schema).
    #[cfg(test)]
    pub(crate) fn client(&mut self) -> &mut Client {
        &mut self.client
    }
}

/// Applies the migrations after the schema's version, each in its own transaction
/// holding `vigil_schema`'s lock; refuses a newer schema and one it cannot place.
fn migrate(client: &mut Client, shown: &str) -> Result<(), StoreError> {
    let pg = |what: &'static str| {
        move |e: postgres::Error| StoreError::Postgres {
            url: shown.to_string(),
            why: format!("{what}: {}", describe(&e)),
            source: e,
        }
    };
    let unusable = |why: String| StoreError::Unusable {
        path: shown.to_string(),
        why,
    };
    let schema: Option<String> = client
        .query_one("SELECT current_schema()", &[])
        .map_err(pg("reading the current schema"))?
        .get(0);
    let Some(schema) = schema else {
        return Err(unusable(
            "its search_path names no existing schema: create the schema, or fix options=-csearch_path=... in the URL".into(),
        ));
    };
    let has = |client: &mut Client, table: &str| -> Result<bool, StoreError> {
        Ok(client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1)",
                &[&table],
            )
            .map_err(pg("reading the catalog"))?
            .get(0))
    };
    if !has(client, "vigil_schema")? {
        if has(client, "guard_snapshot")? {
            return Err(unusable(format!(
                "schema {schema:?} holds vigil's tables but no vigil_schema version table: refusing to guess its version"
            )));
        }
        // Replicas starting together race to create it; the loser sees a unique
        // violation on the catalog and finds the table there.
        if let Err(e) = client.batch_execute(
            "CREATE TABLE IF NOT EXISTS vigil_schema (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                version BIGINT NOT NULL
            );
            INSERT INTO vigil_schema (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;",
        ) {
            if !has(client, "vigil_schema")? {
                return Err(pg("creating vigil_schema")(e));
            }
            client
                .batch_execute(
                    "INSERT INTO vigil_schema (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
                )
                .map_err(pg("creating vigil_schema"))?;
        }
    }
    let known = PG_MIGRATIONS.len() as i64;
    loop {
        let mut tx = client.transaction().map_err(pg("migrating"))?;
        tx.batch_execute("LOCK TABLE vigil_schema IN EXCLUSIVE MODE")
            .map_err(pg("locking vigil_schema"))?;
        let version: i64 = tx
            .query_opt("SELECT version FROM vigil_schema WHERE id = 1", &[])
            .map_err(pg("reading the schema version"))?
            .map_or(0, |r| r.get(0));
        if version > known {
            return Err(StoreError::TooNew {
                path: shown.to_string(),
                found: version,
                known,
            });
        }
        if version == known {
            tx.commit().map_err(pg("migrating"))?;
            return Ok(());
        }
        let sql = PG_MIGRATIONS[usize::try_from(version).unwrap_or(0)];
        tx.batch_execute(sql).map_err(pg("migrating"))?;
        tx.execute(
            "INSERT INTO vigil_schema (id, version) VALUES (1, $1)
             ON CONFLICT (id) DO UPDATE SET version = $1",
            &[&(version + 1)],
        )
        .map_err(pg("migrating"))?;
        tx.commit().map_err(pg("migrating"))?;
        tracing::info!(store = %shown, schema = %schema, version = version + 1, "store schema migrated");
    }
}

fn action_from_row(r: &postgres::Row) -> ActionRecord {
    let state: String = r.get(4);
    let event: String = r.get(9);
    ActionRecord {
        id: r.get(0),
        decision_id: r.get(1),
        target: r.get(2),
        idempotency_key: r.get(3),
        state: ActionState::parse(&state),
        attempts: r.get(5),
        created_ms: r.get(6),
        finished_ms: r.get(7),
        result: r.get(8),
        event: serde_json::from_str(&event).unwrap_or(serde_json::Value::Null),
        epoch: r.get(10),
    }
}

// === impl Store for PostgresStore ===

impl Store for PostgresStore {
    fn recover(&mut self) -> Result<Recovered, StoreError> {
        let e = self.err("recovering");
        // One snapshot of the database for the whole read (a leader may be writing).
        let mut tx = self
            .client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(&e)?;
        tx.batch_execute(&self.limits).map_err(&e)?;
        let snap = tx
            .query_opt("SELECT seq, state FROM guard_snapshot WHERE id = 1", &[])
            .map_err(&e)?
            .map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1)));
        let snapshot = match snap {
            Some((seq, mut text)) => {
                for r in tx
                    .query("SELECT text FROM guard_snapshot_parts ORDER BY part", &[])
                    .map_err(&e)?
                {
                    text.push_str(r.get::<_, &str>(0));
                }
                Some((seq, text))
            }
            None => None,
        };
        let after = snapshot.as_ref().map_or(0, |s| s.0);
        let ops = tx
            .query(
                "SELECT op FROM guard_ops WHERE seq > $1 ORDER BY seq",
                &[&after],
            )
            .map_err(&e)?
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        let pending = tx
            .query(
                &format!(
                    "SELECT {ACTION_COLUMNS}, epoch FROM actions WHERE state = 'intended' ORDER BY id"
                ),
                &[],
            )
            .map_err(&e)?
            .iter()
            .map(action_from_row)
            .collect();
        tx.commit().map_err(&e)?;
        Ok(Recovered {
            snapshot: snapshot.map(|s| s.1),
            ops,
            pending,
        })
    }

    fn commit(&mut self, batch: &Batch) -> Result<Vec<ActionRecord>, StoreError> {
        let (keep_decisions, keep_transitions) = self.keep;
        let url = self.url.clone();
        let e = |e: postgres::Error| StoreError::Postgres {
            url: url.clone(),
            why: format!("committing a batch: {}", describe(&e)),
            source: e,
        };
        let fenced = |why: String| StoreError::Fenced {
            url: url.clone(),
            why,
        };
        if self.replica.is_some() && batch.fence.is_none() {
            return Err(fenced(
                "a replica commits only as the leader, and this batch carries no lease epoch"
                    .into(),
            ));
        }
        let limits = self.limits.clone();
        let mut tx = begin(self.connection()?, &limits).map_err(e)?;
        let mut epoch = None;
        if let Some(f) = &batch.fence {
            // The fence: the lease row, locked until this transaction ends, must still
            // be the term this batch was decided in.
            let row = tx
                .query_opt(
                    "SELECT holder, epoch FROM leases WHERE name = $1 FOR UPDATE",
                    &[&f.lease],
                )
                .map_err(e)?;
            match row.map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1))) {
                Some((holder, current)) if holder == f.holder && current == f.epoch => {}
                Some((holder, current)) => {
                    return Err(fenced(format!(
                        "lease {:?} is at epoch {current} held by {holder:?}; this batch was decided by {:?} under epoch {}: rolled back",
                        f.lease, f.holder, f.epoch
                    )));
                }
                None => {
                    return Err(fenced(format!(
                        "lease {:?} was never granted; this batch claims epoch {}: rolled back",
                        f.lease, f.epoch
                    )));
                }
            }
            epoch = Some(f.epoch);
        }
        let mut created = Vec::new();
        if !batch.ops.is_empty() {
            let mut row =
                String::with_capacity(batch.ops.iter().map(|o| o.len() + 1).sum::<usize>() + 2);
            row.push('[');
            row.push_str(&batch.ops.join(","));
            row.push(']');
            tx.execute("INSERT INTO guard_ops (op) VALUES ($1)", &[&row])
                .map_err(e)?;
        }
        if !batch.decisions.is_empty() {
            let insert_decision = tx
                .prepare(
                    "INSERT INTO decisions (at_ms, target, zone, outcome, reasons, summary)
                     VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                )
                .map_err(e)?;
            let insert_action = tx
                .prepare(
                    "INSERT INTO actions (decision_id, target, idempotency_key, state, created_ms, event, epoch)
                     VALUES ($1, $2, $3, 'intended', $4, $5, $6) RETURNING id",
                )
                .map_err(e)?;
            for d in &batch.decisions {
                let decision_id: i64 = tx
                    .query_one(
                        &insert_decision,
                        &[
                            &d.at_ms,
                            &d.target,
                            &d.zone,
                            &d.outcome.as_str(),
                            &d.reasons.to_string(),
                            &d.summary,
                        ],
                    )
                    .map_err(e)?
                    .get(0);
                if let Some(event) = &d.action {
                    let key = format!("vigil-{}-{}", d.at_ms, decision_id);
                    let mut event = event.clone();
                    event["idempotency_key"] = serde_json::Value::String(key.clone());
                    let id: i64 = tx
                        .query_one(
                            &insert_action,
                            &[
                                &decision_id,
                                &d.target,
                                &key,
                                &d.at_ms,
                                &event.to_string(),
                                &epoch,
                            ],
                        )
                        .map_err(e)?
                        .get(0);
                    created.push(ActionRecord {
                        id,
                        decision_id,
                        target: d.target.clone(),
                        idempotency_key: key,
                        state: ActionState::Intended,
                        attempts: 0,
                        created_ms: d.at_ms,
                        finished_ms: None,
                        result: None,
                        event,
                        epoch,
                    });
                }
            }
        }
        if !batch.transitions.is_empty() {
            let insert = tx
                .prepare(
                    "INSERT INTO transitions (at_ms, target, from_state, to_state, detail)
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .map_err(e)?;
            for t in &batch.transitions {
                tx.execute(&insert, &[&t.at_ms, &t.target, &t.from, &t.to, &t.detail])
                    .map_err(e)?;
            }
        }
        if let Some((state, saved_ms)) = &batch.snapshot {
            let seq: i64 = tx
                .query_one("SELECT COALESCE(MAX(seq), 0)::BIGINT FROM guard_ops", &[])
                .map_err(e)?
                .get(0);
            let mut parts = parts(state, SNAPSHOT_PART);
            let first = parts.next().unwrap_or("");
            tx.execute(
                "INSERT INTO guard_snapshot (id, seq, state, saved_ms) VALUES (1, $1, $2, $3)
                 ON CONFLICT (id) DO UPDATE SET seq = $1, state = $2, saved_ms = $3",
                &[&seq, &first, saved_ms],
            )
            .map_err(e)?;
            tx.execute("DELETE FROM guard_snapshot_parts", &[])
                .map_err(e)?;
            let insert = tx
                .prepare("INSERT INTO guard_snapshot_parts (part, text) VALUES ($1, $2)")
                .map_err(e)?;
            for (i, part) in parts.enumerate() {
                tx.execute(&insert, &[&(i as i64 + 1), &part]).map_err(e)?;
            }
            tx.execute("DELETE FROM guard_ops WHERE seq <= $1", &[&seq])
                .map_err(e)?;
            tx.execute(
                "DELETE FROM decisions WHERE id <= (SELECT MAX(id) FROM decisions) - $1
                 AND id NOT IN (SELECT decision_id FROM actions)",
                &[&keep_decisions],
            )
            .map_err(e)?;
            tx.execute(
                "DELETE FROM transitions WHERE id <= (SELECT MAX(id) FROM transitions) - $1",
                &[&keep_transitions],
            )
            .map_err(e)?;
        }
        tx.commit().map_err(e)?;
        Ok(created)
    }

    fn start_attempt(&mut self, id: i64) -> Result<(), StoreError> {
        let Some((lease, holder)) = self.replica.clone() else {
            self.once("counting an attempt", |c| {
                c.execute(
                    "UPDATE actions SET attempts = attempts + 1 WHERE id = $1",
                    &[&id],
                )
            })?;
            return Ok(());
        };
        // A replica runs an action only while it holds the lease: a deposed leader's
        // actuator must not start a run its successor will also start.
        let n = self.once("counting an attempt", |c| {
            c.execute(
                "UPDATE actions SET attempts = attempts + 1 WHERE id = $1 AND EXISTS (
                    SELECT 1 FROM leases WHERE name = $2 AND holder = $3 AND expires_at > now())",
                &[&id, &lease, &holder],
            )
        })?;
        if n == 1 {
            return Ok(());
        }
        Err(StoreError::Fenced {
            url: self.url.clone(),
            why: format!(
                "replica {holder:?} does not hold lease {lease:?} (or action {id} does not exist): the attempt is not counted and the action not run here"
            ),
        })
    }

    fn finish_action(
        &mut self,
        id: i64,
        state: ActionState,
        at_ms: i64,
        result: &str,
    ) -> Result<(), StoreError> {
        // Not fenced: a run that happened is a fact, whoever reports it.
        self.once("finishing an action", |c| {
            c.execute(
                "UPDATE actions SET state = $2, finished_ms = $3, result = $4 WHERE id = $1",
                &[&id, &state.as_str(), &at_ms, &result],
            )
        })?;
        Ok(())
    }

    fn decisions(
        &mut self,
        target: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DecisionRecord>, StoreError> {
        let limit = limit as i64;
        let rows = self.once("reading decisions", |c| {
            c.query(
                "SELECT id, at_ms, target, zone, outcome, reasons, summary FROM decisions
                 WHERE ($1::TEXT IS NULL OR target = $1) ORDER BY id DESC LIMIT $2",
                &[&target, &limit],
            )
        })?;
        Ok(rows
            .iter()
            .map(|r| DecisionRecord {
                id: r.get(0),
                at_ms: r.get(1),
                target: r.get(2),
                zone: r.get(3),
                outcome: r.get(4),
                reasons: serde_json::from_str(r.get::<_, &str>(5))
                    .unwrap_or(serde_json::Value::Null),
                summary: r.get(6),
            })
            .collect())
    }

    fn actions(&mut self, limit: usize) -> Result<Vec<ActionRecord>, StoreError> {
        let limit = limit as i64;
        let rows = self.once("reading actions", |c| {
            c.query(
                &format!("SELECT {ACTION_COLUMNS}, epoch FROM actions ORDER BY id DESC LIMIT $1"),
                &[&limit],
            )
        })?;
        Ok(rows.iter().map(action_from_row).collect())
    }

    fn transitions(
        &mut self,
        target: &str,
        limit: usize,
    ) -> Result<Vec<TransitionRecord>, StoreError> {
        let limit = limit as i64;
        let rows = self.once("reading transitions", |c| {
            c.query(
                "SELECT id, at_ms, target, from_state, to_state, detail FROM transitions
                 WHERE target = $1 ORDER BY id DESC LIMIT $2",
                &[&target, &limit],
            )
        })?;
        Ok(rows
            .iter()
            .map(|r| TransitionRecord {
                id: r.get(0),
                at_ms: r.get(1),
                target: r.get(2),
                from: r.get(3),
                to: r.get(4),
                detail: r.get(5),
            })
            .collect())
    }

    fn replicas(&mut self) -> Option<&mut dyn ReplicaStore> {
        Some(self)
    }
}

impl ReplicaStore for PostgresStore {
    fn lease(&mut self, name: &str) -> Result<Option<LeaseRow>, StoreError> {
        PostgresStore::lease(self, name)
    }

    fn report(&mut self, r: &ReplicaReport) -> Result<ReplicaState, StoreError> {
        let e = self.err("reporting probe results");
        let ttl_ms = i64::try_from(r.member_ttl.as_millis()).unwrap_or(i64::MAX);
        let limits = self.limits.clone();
        let mut tx = begin(self.connection()?, &limits).map_err(&e)?;
        if r.first {
            // A new run: rows of an earlier run of this id say nothing about now, and
            // replicas long gone are forgotten.
            tx.execute(
                "DELETE FROM probe_results WHERE replica = $1",
                &[&r.replica],
            )
            .map_err(&e)?;
            tx.batch_execute(&format!(
                "DELETE FROM probe_results WHERE replica IN (
                    SELECT id FROM replicas WHERE seen_at < now() - INTERVAL '{FORGET_REPLICAS_AFTER}');
                 DELETE FROM replicas WHERE seen_at < now() - INTERVAL '{FORGET_REPLICAS_AFTER}';"
            ))
            .map_err(&e)?;
        }
        // As of when: the report's composition, never later than now (see
        // `ReplicaReport::as_of_ms`), and a heartbeat never goes back.
        let as_of = "LEAST(now(), COALESCE(to_timestamp($3::BIGINT / 1000.0), now()))";
        tx.execute(
            &format!(
                "INSERT INTO replicas AS r (id, started_at, seen_at) VALUES ($1, now(), {as_of})
                 ON CONFLICT (id) DO UPDATE SET seen_at = GREATEST(r.seen_at, {as_of}),
                     started_at = CASE WHEN $2 THEN now() ELSE r.started_at END"
            ),
            &[&r.replica, &r.first, &r.as_of_ms],
        )
        .map_err(&e)?;
        if !r.upserts.is_empty() {
            let targets: Vec<&str> = r.upserts.iter().map(|u| u.target.as_str()).collect();
            let oks: Vec<bool> = r.upserts.iter().map(|u| u.ok).collect();
            let obs: Vec<Option<&str>> =
                r.upserts.iter().map(|u| u.observation.as_deref()).collect();
            let as_of = "LEAST(now(), COALESCE(to_timestamp($5::BIGINT / 1000.0), now()))";
            tx.execute(
                &format!(
                    "INSERT INTO probe_results (target, replica, ok, observation, changed_at)
                     SELECT t, $1, o, b, {as_of} FROM unnest($2::TEXT[], $3::BOOLEAN[], $4::TEXT[]) AS u(t, o, b)
                     ON CONFLICT (target, replica) DO UPDATE SET
                         ok = EXCLUDED.ok, observation = EXCLUDED.observation, changed_at = {as_of}"
                ),
                &[&r.replica, &targets, &oks, &obs, &r.as_of_ms],
            )
            .map_err(&e)?;
        }
        if !r.removed.is_empty() {
            tx.execute(
                "DELETE FROM probe_results WHERE replica = $1 AND target = ANY($2)",
                &[&r.replica, &r.removed],
            )
            .map_err(&e)?;
        }
        let live = "seen_at > now() - $1::BIGINT * INTERVAL '1 millisecond'";
        let members = tx
            .query(
                &format!(
                    "SELECT id, {s}, {n} FROM replicas WHERE {live} ORDER BY id",
                    s = ms_of("started_at"),
                    n = ms_of("seen_at"),
                ),
                &[&ttl_ms],
            )
            .map_err(&e)?
            .iter()
            .map(|row| MemberRow {
                id: row.get(0),
                since_ms: row.get(1),
                seen_ms: row.get(2),
            })
            .collect();
        let now_ms: i64 = tx
            .query_one(&format!("SELECT {}", ms_of("now()")), &[])
            .map_err(&e)?
            .get(0);
        let mut results = Vec::new();
        if r.read_results {
            for row in tx
                .query(
                    &format!(
                        "SELECT p.target, p.replica, p.ok, p.observation, {a}
                         FROM probe_results p JOIN replicas r ON r.id = p.replica
                         WHERE r.{live}",
                        a = ms_of("GREATEST(p.changed_at, r.seen_at)"),
                    ),
                    &[&ttl_ms],
                )
                .map_err(&e)?
            {
                results.push(StoredResult {
                    target: row.get(0),
                    replica: row.get(1),
                    ok: row.get(2),
                    observation: row.get(3),
                    as_of_ms: row.get(4),
                });
            }
        }
        tx.commit().map_err(&e)?;
        Ok(ReplicaState {
            now_ms,
            members,
            results,
        })
    }
}

#[cfg(test)]
mod tests;
