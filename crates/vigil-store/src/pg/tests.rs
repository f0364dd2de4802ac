use super::*;
use crate::tests::{PgSchema, pg_base_url};
use crate::{Fence, NewDecision};

/// A TTL short enough for a test to wait out.
const TTL: Duration = Duration::from_millis(300);

fn act(target: &str) -> NewDecision {
    NewDecision {
        at_ms: 1000,
        target: target.into(),
        zone: "a".into(),
        outcome: vigil_core::fleet::DecisionKind::Act,
        reasons: serde_json::json!([]),
        summary: "s".into(),
        action: Some(serde_json::json!({"target": target})),
    }
}

fn granted(a: LeaseAnswer) -> LeaseRow {
    match a {
        LeaseAnswer::Granted(row) => row,
        other => panic!("expected the lease, got {other:?}"),
    }
}

fn held(a: LeaseAnswer) -> LeaseRow {
    match a {
        LeaseAnswer::Held(row) => row,
        other => panic!("expected someone else's lease, got {other:?}"),
    }
}

fn fence(holder: &str, epoch: i64) -> Option<Fence> {
    Some(Fence {
        lease: CONTROLLER_LEASE.into(),
        holder: holder.into(),
        epoch,
    })
}

#[test]
fn an_unreachable_server_is_an_error_naming_the_url_without_its_password() {
    let err = PostgresStore::open("postgres://vigil:s3cret@127.0.0.1:1/test?connect_timeout=2")
        .err()
        .expect("nothing listens on port 1");
    let text = err.to_string();
    assert!(text.contains("cannot connect"), "{text}");
    assert!(text.contains("vigil:***@127.0.0.1:1"), "{text}");
    assert!(
        !text.contains("s3cret"),
        "the password must not be shown: {text}"
    );
}

#[test]
fn a_search_path_naming_no_schema_and_tables_without_a_version_are_refused() {
    let sep = if pg_base_url().contains('?') {
        '&'
    } else {
        '?'
    };
    let url = format!(
        "{}{sep}options=-csearch_path%3Dvigil_no_such_schema_{}",
        pg_base_url(),
        std::process::id()
    );
    let err = PostgresStore::open(&url).err().expect("no such schema");
    assert!(
        err.to_string().contains("names no existing schema"),
        "{err}"
    );

    let schema = PgSchema::new();
    schema
        .client()
        .batch_execute("CREATE TABLE guard_snapshot (id INTEGER)")
        .unwrap();
    let err = PostgresStore::open(&schema.url)
        .err()
        .expect("no version table");
    assert!(err.to_string().contains("no vigil_schema"), "{err}");
}

#[test]
fn a_store_whose_connection_broke_connects_again_at_the_next_call() {
    let schema = PgSchema::new();
    let mut s = PostgresStore::open(&schema.url).unwrap();
    let backend = |s: &mut PostgresStore| -> i32 {
        s.client()
            .query_one("SELECT pg_backend_pid()", &[])
            .unwrap()
            .get(0)
    };
    let before = backend(&mut s);
    // The server ends the connection (as a restart, or a partition past
    // tcp_user_timeout, does from the client's side).
    schema
        .client()
        .execute("SELECT pg_terminate_backend($1)", &[&before])
        .unwrap();
    // The call that meets the break may fail; the one after it must work.
    let mut failed = Vec::new();
    let answered = (0..2).find_map(|_| match s.lease(CONTROLLER_LEASE) {
        Ok(l) => Some(l),
        Err(e) => {
            failed.push(e.to_string());
            None
        }
    });
    assert!(
        answered.is_some(),
        "the store never connected again after its connection broke: {failed:?}"
    );
    assert_ne!(backend(&mut s), before, "a new connection");
    // And a fenced commit works on it too.
    granted(s.try_lease(CONTROLLER_LEASE, "a", TTL, None).unwrap());
    let mut s = s.for_replica(CONTROLLER_LEASE, "a");
    s.commit(&Batch {
        fence: fence("a", 1),
        ..Batch::default()
    })
    .expect("a commit after the reconnection");
}

#[test]
fn replicas_starting_together_migrate_once() {
    let schema = PgSchema::new();
    let opened: Vec<_> = (0..4)
        .map(|_| {
            let url = schema.url.clone();
            std::thread::spawn(move || PostgresStore::open(&url).map(drop))
        })
        .collect();
    for t in opened {
        t.join().unwrap().expect("every replica opens the store");
    }
    let version: i64 = schema
        .client()
        .query_one("SELECT version FROM vigil_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, PG_MIGRATIONS.len() as i64);
}

#[test]
fn the_lease_is_renewed_by_holder_and_epoch_and_taken_over_only_after_it_expires() {
    let schema = PgSchema::new();
    let mut a = PostgresStore::open(&schema.url).unwrap();
    let mut b = PostgresStore::open(&schema.url).unwrap();
    let first = granted(a.try_lease(CONTROLLER_LEASE, "a", TTL, None).unwrap());
    assert_eq!((first.holder.as_str(), first.epoch), ("a", 1));
    assert!(first.live());
    // Renewed: same epoch, later expiry.
    let renewed = granted(a.try_lease(CONTROLLER_LEASE, "a", TTL, Some(1)).unwrap());
    assert_eq!(renewed.epoch, 1);
    assert!(renewed.expires_ms >= first.expires_ms);
    assert_eq!(
        renewed.since_ms, first.since_ms,
        "a renewal keeps the term's start"
    );
    // Held: b is told who leads.
    let seen = held(b.try_lease(CONTROLLER_LEASE, "b", TTL, None).unwrap());
    assert_eq!((seen.holder.as_str(), seen.epoch), ("a", 1));
    // Guessing the epoch does not help another id, nor the right id a wrong epoch.
    held(b.try_lease(CONTROLLER_LEASE, "b", TTL, Some(1)).unwrap());
    held(a.try_lease(CONTROLLER_LEASE, "a", TTL, Some(7)).unwrap());
    // Expired: b takes over at the next epoch...
    std::thread::sleep(TTL + Duration::from_millis(50));
    let taken = granted(b.try_lease(CONTROLLER_LEASE, "b", TTL, None).unwrap());
    assert_eq!((taken.holder.as_str(), taken.epoch), ("b", 2));
    // ...and a, renewing its old term by its own id, is refused (Oban #1488: a
    // renewal matched by name alone made two leaders).
    let seen = held(a.try_lease(CONTROLLER_LEASE, "a", TTL, Some(1)).unwrap());
    assert_eq!((seen.holder.as_str(), seen.epoch), ("b", 2));
    // Resigning hands over at once.
    assert!(
        !a.resign(CONTROLLER_LEASE, "a", 1).unwrap(),
        "not a's to give"
    );
    assert!(b.resign(CONTROLLER_LEASE, "b", 2).unwrap());
    let back = granted(a.try_lease(CONTROLLER_LEASE, "a", TTL, None).unwrap());
    assert_eq!(back.epoch, 3, "every term its own epoch");
    assert_eq!(a.lease(CONTROLLER_LEASE).unwrap().unwrap().holder, "a");
}

#[test]
fn a_replica_whose_lease_was_taken_over_cannot_commit() {
    let schema = PgSchema::new();
    let mut a = PostgresStore::open(&schema.url)
        .unwrap()
        .for_replica(CONTROLLER_LEASE, "a");
    let mut b = PostgresStore::open(&schema.url)
        .unwrap()
        .for_replica(CONTROLLER_LEASE, "b");
    granted(a.try_lease(CONTROLLER_LEASE, "a", TTL, None).unwrap());
    let created = a
        .commit(&Batch {
            ops: vec!["a1".into()],
            decisions: vec![act("x")],
            fence: fence("a", 1),
            ..Batch::default()
        })
        .expect("the leader commits");
    a.start_attempt(created[0].id)
        .expect("the leader runs its action");
    // Without a fence, or with a made-up one, a replica commits nothing.
    let err = b.commit(&Batch::default()).unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    let err = b
        .commit(&Batch {
            ops: vec!["b0".into()],
            fence: fence("b", 1),
            ..Batch::default()
        })
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");

    // a stalls past its TTL; b takes over.
    std::thread::sleep(TTL + Duration::from_millis(50));
    assert_eq!(
        granted(b.try_lease(CONTROLLER_LEASE, "b", TTL, None).unwrap()).epoch,
        2
    );
    // a wakes and commits what it decided under epoch 1: rolled back, whole.
    let err = a
        .commit(&Batch {
            ops: vec!["a2".into()],
            decisions: vec![act("y")],
            snapshot: Some(("a's state".into(), 5)),
            fence: fence("a", 1),
            ..Batch::default()
        })
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, StoreError::Fenced { .. }), "{text}");
    assert!(
        text.contains("epoch 2 held by \"b\"") && text.contains("under epoch 1"),
        "{text}"
    );
    // Nor does its actuator start a run.
    let err = a.start_attempt(created[0].id).unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    // b's writes go through; nothing of a's stale batch is there.
    b.commit(&Batch {
        ops: vec!["b1".into()],
        fence: fence("b", 2),
        ..Batch::default()
    })
    .expect("the new leader commits");
    let rec = b.recover().unwrap();
    assert_eq!(rec.snapshot, None);
    assert_eq!(rec.ops, ["[a1]", "[b1]"]);
    assert_eq!(
        rec.pending.len(),
        1,
        "only x's action, intended under epoch 1"
    );
    assert_eq!(rec.pending[0].attempts, 1);
    b.start_attempt(rec.pending[0].id)
        .expect("the new leader resumes the action");
    let epoch: Option<i64> = schema
        .client()
        .query_one("SELECT epoch FROM actions", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        epoch,
        Some(1),
        "an action records the term it was decided in"
    );
}

#[test]
fn replicas_report_results_on_change_and_a_silent_replica_drops_out() {
    use crate::{ProbeResultRow, ReplicaReport};
    let schema = PgSchema::new();
    let mut a = PostgresStore::open(&schema.url).unwrap();
    let mut b = PostgresStore::open(&schema.url).unwrap();
    let row = |t: &str, ok: bool| ProbeResultRow {
        target: t.into(),
        ok,
        observation: (!ok).then(|| "{}".to_string()),
    };
    let report = |id: &str, first, upserts, removed, read| ReplicaReport {
        as_of_ms: None,
        replica: id.into(),
        first,
        upserts,
        removed,
        member_ttl: TTL,
        read_results: read,
    };
    a.report(&report(
        "a",
        true,
        vec![row("x", true), row("y", false)],
        vec![],
        false,
    ))
    .unwrap();
    let st = b
        .report(&report("b", true, vec![row("x", false)], vec![], true))
        .unwrap();
    let ids: Vec<&str> = st.members.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    let mut got: Vec<(String, String, bool)> = st
        .results
        .iter()
        .map(|r| (r.target.clone(), r.replica.clone(), r.ok))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("x".into(), "a".into(), true),
            ("x".into(), "b".into(), false),
            ("y".into(), "a".into(), false)
        ]
    );
    assert!(st.results.iter().all(|r| r.as_of_ms <= st.now_ms));
    // A heartbeat without changes keeps a's rows current; a removal drops one.
    std::thread::sleep(TTL / 2);
    a.report(&report("a", false, vec![], vec!["y".into()], false))
        .unwrap();
    let st = b.report(&report("b", false, vec![], vec![], true)).unwrap();
    let x_a = st
        .results
        .iter()
        .find(|r| r.target == "x" && r.replica == "a")
        .expect("a's unchanged row is kept");
    assert!(
        st.now_ms - x_a.as_of_ms < (TTL / 2).as_millis() as i64,
        "an unchanged row is current as of its prober's last report"
    );
    assert!(!st.results.iter().any(|r| r.target == "y"), "removed");
    // a falls silent past the TTL: it is no member, and its rows are not read.
    std::thread::sleep(TTL + Duration::from_millis(50));
    let st = b.report(&report("b", false, vec![], vec![], true)).unwrap();
    let ids: Vec<&str> = st.members.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["b"]);
    assert!(st.results.iter().all(|r| r.replica == "b"));
    // a restarts: its earlier run's rows go at its first report.
    a.report(&report("a", true, vec![], vec![], false)).unwrap();
    let st = b.report(&report("b", false, vec![], vec![], true)).unwrap();
    assert!(
        st.results.iter().all(|r| r.replica == "b"),
        "{:?}",
        st.results
    );
}

#[test]
fn a_report_that_waited_stamps_its_results_as_of_when_it_was_composed() {
    use crate::{ProbeResultRow, ReplicaReport};
    let schema = PgSchema::new();
    let mut a = PostgresStore::open(&schema.url).unwrap();
    let mut b = PostgresStore::open(&schema.url).unwrap();
    let row = |t: &str| ProbeResultRow {
        target: t.into(),
        ok: true,
        observation: None,
    };
    let report = |id: &str, upserts, as_of_ms| ReplicaReport {
        replica: id.into(),
        first: false,
        upserts,
        removed: vec![],
        member_ttl: Duration::from_secs(60),
        read_results: true,
        as_of_ms,
    };
    let as_of = |st: &ReplicaState, t: &str| {
        st.results
            .iter()
            .find(|r| r.target == t)
            .map(|r| r.as_of_ms)
            .unwrap()
    };
    let t0 = b.report(&report("b", vec![], None)).unwrap().now_ms;
    // a's report was composed 10 s ago and waited (a cut connection, a paused
    // process): its pass of x is as old as that, not as fresh as its arrival.
    let st = a
        .report(&report("a", vec![row("x")], Some(t0 - 10_000)))
        .unwrap();
    assert!(
        (as_of(&st, "x") - (t0 - 10_000)).abs() <= 1,
        "x as of {} (t0 {t0})",
        as_of(&st, "x")
    );
    let a_seen = |st: &ReplicaState| st.members.iter().find(|m| m.id == "a").unwrap().seen_ms;
    assert!((a_seen(&st) - (t0 - 10_000)).abs() <= 1, "{:?}", st.members);
    // The next one, composed 5 s ago: x's row is current as of then.
    let st = a.report(&report("a", vec![], Some(t0 - 5_000))).unwrap();
    assert!((as_of(&st, "x") - (t0 - 5_000)).abs() <= 1);
    // An estimate ahead of the database's clock is the database's now, and an
    // older one never takes the heartbeat back.
    let st = a
        .report(&report("a", vec![row("z")], Some(t0 + 3_600_000)))
        .unwrap();
    assert!(as_of(&st, "z") <= st.now_ms && as_of(&st, "z") >= t0, "z");
    let st = a.report(&report("a", vec![], Some(t0 - 20_000))).unwrap();
    assert!(
        a_seen(&st) >= t0,
        "the heartbeat went back: {:?}",
        st.members
    );
}

/// Replica "a" holding the lease, its statements bounded for a 1 s lease TTL: the
/// schema, the store and its (statement, lock) bounds.
fn leader_with_bounds() -> (PgSchema, PostgresStore, Duration, Duration) {
    let schema = PgSchema::new();
    let (statement, lock) = limits_for_lease(Duration::from_millis(1000));
    let mut a = PostgresStore::open(&schema.url)
        .unwrap()
        .for_replica(CONTROLLER_LEASE, "a")
        .with_limits(statement, lock);
    granted(a.try_lease(CONTROLLER_LEASE, "a", TTL, None).unwrap());
    (schema, a, statement, lock)
}

#[test]
fn a_transaction_left_idle_past_the_statement_bound_is_ended_and_its_locks_freed() {
    // A replica paused (SIGSTOP) in the middle of a commit holding the lease row.
    let (schema, mut a, statement, lock) = leader_with_bounds();
    let mut paused = schema.client();
    let mut tx = paused.transaction().unwrap();
    tx.batch_execute(&limits_sql(statement, lock)).unwrap();
    tx.batch_execute("SELECT * FROM leases FOR UPDATE").unwrap();
    // It stays idle past the bound: the server ends it, and the row is free.
    std::thread::sleep(statement * 3);
    a.try_lease(CONTROLLER_LEASE, "a", TTL, Some(1))
        .expect("the lease row is free once the idle transaction was ended");
    let err = tx
        .batch_execute("SELECT 1")
        .expect_err("the idle transaction's session was ended");
    let why = format!("{err:?}");
    assert!(
        why.contains("idle-in-transaction") || err.is_closed(),
        "{why}"
    );
}

#[test]
fn a_lock_held_by_another_connection_makes_the_store_fail_in_time_not_hang() {
    let (schema, mut a, _, lock) = leader_with_bounds();
    // Another session holds the lease table: every read and write of it waits.
    let mut other = schema.client();
    let mut held = other.transaction().unwrap();
    held.batch_execute("LOCK TABLE leases IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let bound = lock + Duration::from_millis(500);
    let started = std::time::Instant::now();
    let err = a
        .commit(&Batch {
            ops: vec!["a1".into()],
            fence: fence("a", 1),
            ..Batch::default()
        })
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        took < bound,
        "the commit waited {took:?} (lock_timeout {lock:?})"
    );
    assert!(err.to_string().contains("lock timeout"), "{err}");
    let started = std::time::Instant::now();
    let err = a
        .try_lease(CONTROLLER_LEASE, "a", TTL, Some(1))
        .unwrap_err();
    assert!(
        started.elapsed() < bound,
        "the renewal waited {:?}",
        started.elapsed()
    );
    assert!(err.to_string().contains("lock timeout"), "{err}");
    // The lock gone, the store works again.
    held.rollback().unwrap();
    a.commit(&Batch {
        ops: vec!["a2".into()],
        fence: fence("a", 1),
        ..Batch::default()
    })
    .expect("commits once the lock is gone");
}

#[test]
fn an_idempotency_key_is_unique_in_the_schema() {
    let schema = PgSchema::new();
    let mut s = PostgresStore::open(&schema.url).unwrap();
    let created = s
        .commit(&Batch {
            decisions: vec![act("x")],
            ..Batch::default()
        })
        .unwrap();
    let err = s
        .client()
        .execute(
            "INSERT INTO actions (decision_id, target, idempotency_key, state, created_ms, event)
                 VALUES ($1, 'x', $2, 'intended', 0, '{}')",
            &[&created[0].decision_id, &created[0].idempotency_key],
        )
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(&postgres::error::SqlState::UNIQUE_VIOLATION),
        "a duplicate intent must be rejected: {err}"
    );
}
