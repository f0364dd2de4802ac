use super::*;
use rusqlite::Connection;
use std::path::Path;

/// Where a test's store lives: a temporary SQLite file, or a PostgreSQL schema of
/// its own (created for the test, dropped after it).
pub(crate) enum TestDb {
    Sqlite(tempfile::TempDir),
    Postgres(PgSchema),
}

impl TestDb {
    pub(crate) fn sqlite() -> TestDb {
        TestDb::Sqlite(tempfile::tempdir().unwrap())
    }

    pub(crate) fn postgres() -> TestDb {
        TestDb::Postgres(PgSchema::new())
    }

    /// Opens (or reopens) the store.
    pub(crate) fn open(&self) -> Result<Box<dyn Store>, StoreError> {
        self.open_with_retention(KEEP_DECISIONS, KEEP_TRANSITIONS)
    }

    pub(crate) fn open_with_retention(
        &self,
        decisions: i64,
        transitions: i64,
    ) -> Result<Box<dyn Store>, StoreError> {
        Ok(match self {
            TestDb::Sqlite(dir) => Box::new(
                SqliteStore::open(&dir.path().join("vigil.db"))?
                    .with_retention(decisions, transitions),
            ),
            TestDb::Postgres(schema) => {
                Box::new(PostgresStore::open(&schema.url)?.with_retention(decisions, transitions))
            }
        })
    }

    /// Rows in `table`, read past the store.
    fn count(&self, table: &str) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {table}");
        match self {
            TestDb::Sqlite(dir) => Connection::open(dir.path().join("vigil.db"))
                .unwrap()
                .query_row(&sql, [], |r| r.get(0))
                .unwrap(),
            TestDb::Postgres(schema) => schema.client().query_one(&sql, &[]).unwrap().get(0),
        }
    }

    /// Sets the stored schema version, past the store.
    fn set_version(&self, v: i64) {
        match self {
            TestDb::Sqlite(dir) => Connection::open(dir.path().join("vigil.db"))
                .unwrap()
                .pragma_update(None, "user_version", v)
                .unwrap(),
            TestDb::Postgres(schema) => {
                schema
                    .client()
                    .execute("UPDATE vigil_schema SET version = $1", &[&v])
                    .unwrap();
            }
        }
    }
}

/// The PostgreSQL the tests use: `VIGIL_TEST_POSTGRES`, else the one every machine
/// (CI's too) runs.
pub(crate) fn pg_base_url() -> String {
    std::env::var("VIGIL_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A schema of one test's own in the test database, dropped when done: tests run in
/// parallel on one server. An unreachable server fails the test, loudly.
pub(crate) struct PgSchema {
    pub(crate) name: String,
    /// The store URL: the schema first on its search_path.
    pub(crate) url: String,
}

impl PgSchema {
    pub(crate) fn new() -> PgSchema {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "vigil_t_{}_{}_{nanos}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let base = pg_base_url();
        let mut c = connect_or_explain(&base);
        c.batch_execute(&format!("CREATE SCHEMA {name}")).unwrap();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-csearch_path%3D{name}");
        PgSchema { name, url }
    }

    pub(crate) fn client(&self) -> ::postgres::Client {
        connect_or_explain(&self.url)
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        if let Ok(mut c) = ::postgres::Client::connect(&pg_base_url(), ::postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
        }
    }
}

fn connect_or_explain(url: &str) -> ::postgres::Client {
    ::postgres::Client::connect(url, ::postgres::NoTls).unwrap_or_else(|e| {
            panic!(
                "PostgreSQL at {url} is unreachable ({}): the store tests run against it on every machine, CI's included (127.0.0.1:5432, trust auth, database `test`; set VIGIL_TEST_POSTGRES for another). Start it rather than skip these tests.",
                pg::describe(&e)
            )
        })
}

/// Each test below runs once on SQLite and once on PostgreSQL: the same contract.
macro_rules! on_both {
        ($($name:ident),* $(,)?) => {
            mod on_sqlite {
                $( #[test] fn $name() { super::$name(&super::TestDb::sqlite()) } )*
            }
            mod on_postgres {
                $( #[test] fn $name() { super::$name(&super::TestDb::postgres()) } )*
            }
        };
    }

on_both!(
    ops_after_the_snapshot_are_replayed_and_covered_ones_dropped,
    a_large_snapshot_is_stored_in_parts_and_read_back_whole,
    an_intent_survives_until_finished_and_keys_are_unique,
    old_decisions_and_transitions_are_pruned_at_snapshots_but_not_acted_ones,
    a_store_from_a_newer_vigil_is_refused,
    reads_filter_and_order_newest_first,
);

fn decision(target: &str, act: bool) -> NewDecision {
    NewDecision {
        at_ms: 1000,
        target: target.into(),
        zone: "a".into(),
        outcome: if act {
            vigil_core::fleet::DecisionKind::Act
        } else {
            vigil_core::fleet::DecisionKind::HoldBack
        },
        reasons: serde_json::json!([]),
        summary: "s".into(),
        action: act.then(|| serde_json::json!({"target": target})),
    }
}

fn ops_after_the_snapshot_are_replayed_and_covered_ones_dropped(db: &TestDb) {
    let mut s = db.open().unwrap();
    s.commit(&Batch {
        ops: vec!["a".into(), "b".into()],
        snapshot: Some(("state-after-b".into(), 1)),
        ..Batch::default()
    })
    .unwrap();
    s.commit(&Batch {
        ops: vec!["c".into()],
        ..Batch::default()
    })
    .unwrap();
    drop(s);
    let mut s = db.open().unwrap();
    let r = s.recover().unwrap();
    assert_eq!(r.snapshot.as_deref(), Some("state-after-b"));
    assert_eq!(r.ops, ["[c]"], "one row per batch");
}

fn a_large_snapshot_is_stored_in_parts_and_read_back_whole(db: &TestDb) {
    let mut s = db.open().unwrap();
    // Several parts, with a two-byte character across every part boundary.
    let big: String = (0..3 * SNAPSHOT_PART / 7)
        .map(|i| format!("{:06}é", i))
        .collect();
    assert!(big.len() > 2 * SNAPSHOT_PART);
    s.commit(&Batch {
        snapshot: Some((big.clone(), 1)),
        ..Batch::default()
    })
    .unwrap();
    assert_eq!(s.recover().unwrap().snapshot.as_deref(), Some(big.as_str()));
    let rows = db.count("guard_snapshot_parts");
    assert!(rows >= 2, "{rows} parts after the first");
    // A smaller snapshot leaves no part of the larger one behind.
    s.commit(&Batch {
        snapshot: Some(("small".into(), 2)),
        ..Batch::default()
    })
    .unwrap();
    drop(s);
    let mut s = db.open().unwrap();
    assert_eq!(s.recover().unwrap().snapshot.as_deref(), Some("small"));
    assert_eq!(
        parts("abcéd", 4).collect::<Vec<_>>(),
        ["abc", "éd"],
        "a part never splits a character"
    );
}

fn an_intent_survives_until_finished_and_keys_are_unique(db: &TestDb) {
    let mut s = db.open().unwrap();
    let created = s
        .commit(&Batch {
            decisions: vec![
                decision("x", true),
                decision("y", false),
                decision("z", true),
            ],
            ..Batch::default()
        })
        .unwrap();
    assert_eq!(created.len(), 2);
    assert_ne!(created[0].idempotency_key, created[1].idempotency_key);
    assert_eq!(
        created[0].event["idempotency_key"],
        created[0].idempotency_key.as_str()
    );
    s.start_attempt(created[0].id).unwrap();
    s.finish_action(created[0].id, ActionState::Done, 2000, "ok")
        .unwrap();
    drop(s);
    let mut s = db.open().unwrap();
    let r = s.recover().unwrap();
    assert_eq!(r.pending.len(), 1);
    assert_eq!(r.pending[0].target, "z");
    let all = s.actions(10).unwrap();
    assert_eq!(all[1].attempts, 1);
    assert_eq!(all[1].state, ActionState::Done);
    assert_eq!(s.decisions(Some("y"), 10).unwrap().len(), 1);
}

fn old_decisions_and_transitions_are_pruned_at_snapshots_but_not_acted_ones(db: &TestDb) {
    let mut s = db.open_with_retention(3, 2).unwrap();
    let mut decisions = vec![decision("acted", true)];
    decisions.extend((0..9).map(|i| decision(&format!("d{i}"), false)));
    let transitions = (0..5)
        .map(|i| NewTransition {
            at_ms: i,
            target: "t".into(),
            from: "a".into(),
            to: "b".into(),
            detail: String::new(),
        })
        .collect();
    s.commit(&Batch {
        decisions,
        transitions,
        ..Batch::default()
    })
    .unwrap();
    assert_eq!(
        s.decisions(None, 100).unwrap().len(),
        10,
        "no pruning without a snapshot"
    );
    s.commit(&Batch {
        snapshot: Some(("{}".into(), 0)),
        ..Batch::default()
    })
    .unwrap();
    let left: Vec<String> = s
        .decisions(None, 100)
        .unwrap()
        .into_iter()
        .map(|d| d.target)
        .collect();
    assert_eq!(
        left,
        ["d8", "d7", "d6", "acted"],
        "newest 3, and the one an action refers to"
    );
    assert_eq!(s.transitions("t", 100).unwrap().len(), 2);
}

fn a_store_from_a_newer_vigil_is_refused(db: &TestDb) {
    drop(db.open().unwrap());
    db.set_version(99);
    let err = db.open().err().unwrap();
    assert!(matches!(err, StoreError::TooNew { found: 99, .. }), "{err}");
    assert!(
        err.to_string().contains("schema version 99 is newer"),
        "{err}"
    );
}

fn reads_filter_and_order_newest_first(db: &TestDb) {
    let mut s = db.open().unwrap();
    let t = |target: &str, at_ms: i64| NewTransition {
        at_ms,
        target: target.into(),
        from: "healthy".into(),
        to: "failing".into(),
        detail: "d".into(),
    };
    s.commit(&Batch {
        decisions: vec![
            decision("x", false),
            decision("y", true),
            decision("x", true),
        ],
        transitions: vec![t("x", 1), t("y", 2), t("x", 3)],
        ..Batch::default()
    })
    .unwrap();
    let xs = s.decisions(Some("x"), 10).unwrap();
    assert_eq!(xs.len(), 2);
    assert!(xs[0].id > xs[1].id, "newest first");
    assert_eq!(xs[0].reasons, serde_json::json!([]));
    assert_eq!(s.decisions(None, 2).unwrap().len(), 2, "the limit holds");
    let acts = s.actions(10).unwrap();
    assert_eq!(
        acts.iter().map(|a| a.target.as_str()).collect::<Vec<_>>(),
        ["x", "y"]
    );
    assert_eq!(acts[0].event["target"], "x");
    assert_eq!(acts[0].state, ActionState::Intended);
    let tx = s.transitions("x", 10).unwrap();
    assert_eq!(tx.iter().map(|t| t.at_ms).collect::<Vec<_>>(), [3, 1]);
    assert!(s.transitions("none", 10).unwrap().is_empty());
}

#[test]
fn files_that_are_not_a_usable_store_are_refused_and_a_new_one_is_made_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vigil.db");
    let why = |path: &Path| match SqliteStore::open(path) {
        Err(StoreError::Unusable { why, .. }) => why,
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened {}", path.display()),
    };
    std::fs::write(&path, b"").unwrap();
    assert!(why(&path).contains("is empty (0 bytes)"));
    std::fs::remove_file(&path).unwrap();
    Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE other (x);")
        .unwrap();
    assert!(
        why(&path).contains("holds no vigil store"),
        "{}",
        why(&path)
    );
    // set_aside moves it; a new store is then created, whole.
    let aside = set_aside(&path).unwrap().unwrap();
    assert!(aside.exists() && !path.exists());
    std::fs::write(dir.path().join("vigil.db.new"), b"half-made").unwrap();
    let s = SqliteStore::open(&path).unwrap();
    assert!(!dir.path().join("vigil.db.new").exists());
    drop(s);
    SqliteStore::open(&path).expect("reopens");
}

#[test]
fn a_corrupt_file_is_reported_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vigil.db");
    std::fs::write(&path, b"this is not a database, just bytes ........................................................................................").unwrap();
    let err = SqliteStore::open(&path).err().expect("must refuse garbage");
    assert!(err.to_string().contains("vigil.db"), "{err}");
}
