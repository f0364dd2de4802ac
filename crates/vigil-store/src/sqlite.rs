//! The SQLite store ([`SqliteStore`], the default): one file in WAL mode, its schema
//! migrations ([`MIGRATIONS`]), opening that refuses what would silently start over
//! (the crate doc's "Opening" section), and the deploy driver's rollout tables
//! (`rollouts.rs`). The crate doc has the invariants it keeps; [`Store`] the contract.

use crate::{
    ACTION_COLUMNS, ActionRecord, ActionState, Batch, DecisionRecord, KEEP_DECISIONS,
    KEEP_TRANSITIONS, Recovered, SNAPSHOT_PART, Store, StoreError, TransitionRecord, parts,
};
use rusqlite::{Connection, OptionalExtension, params};
use std::path::Path;

mod rollouts;
pub use rollouts::{RolloutRequest, RolloutSave, RolloutStep, StoredRollout};

/// SQLite's page cache, as `PRAGMA cache_size` (negative: KiB). The controller writes
/// small batches, a snapshot now and then, and reads the newest rows: 512 KiB serves
/// that, where SQLite's default (2 MiB) would stay resident for nothing.
const CACHE_KIB: i64 = -512;

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
