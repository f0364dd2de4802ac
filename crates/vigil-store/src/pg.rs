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

mod journal;
mod replicas;

#[cfg(test)]
mod tests;
