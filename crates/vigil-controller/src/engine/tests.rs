use super::*;
use crate::store::SqliteStore;
use vigil_core::guard::{GuardConfig, SafetyGuard};

fn targets(n: usize) -> Vec<TargetConfig> {
    (0..n)
        .map(|i| TargetConfig {
            id: format!("t{i:03}"),
            url: format!("http://127.0.0.1:{}", 1000 + i),
            zone: format!("z{}", i % 3),
            group: String::new(),
            heartbeat: false,
            interval: None,
        })
        .collect()
}

fn probe(id: &str, zone: &str, ok: bool) -> Command {
    let obs = if ok {
        Observation::pass(id, zone)
    } else {
        Observation::failed_checks(id, zone, ["disk:free"])
    };
    Command::Probe {
        id: id.to_string(),
        record: ProbeRecord {
            at_ms: 0,
            ok,
            duration_ms: 1.0,
            status: Some(200),
            health: None,
            detail: String::new(),
        },
        obs,
        worker: None,
    }
}

/// The guard's view of every target, as the API shows it (history aside: it is not
/// persisted).
async fn guard_views(tx: &mpsc::Sender<Command>) -> Vec<serde_json::Value> {
    let (reply, rx) = oneshot::channel();
    tx.send(Command::Fleet(reply)).await.unwrap();
    let fleet = rx.await.unwrap();
    fleet
        .targets
        .iter()
        .map(|t| {
            let mut v = serde_json::to_value(t).unwrap();
            v.as_object_mut().unwrap().remove("history");
            v.as_object_mut().unwrap().remove("last_probe");
            v
        })
        .collect()
}

/// Starts an engine on the store in `dir` with `n` targets.
async fn start(
    dir: &std::path::Path,
    n: usize,
) -> (
    mpsc::Sender<Command>,
    watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let guard = GuardConfig {
        grace: Duration::ZERO,
        ..GuardConfig::default()
    };
    start_with(dir, n, guard).await
}

/// [`start`] with the guard's settings.
async fn start_with(
    dir: &std::path::Path,
    n: usize,
    guard: GuardConfig,
) -> (
    mpsc::Sender<Command>,
    watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let config = Arc::new(ControllerConfig {
        guard,
        ..ControllerConfig::default()
    });
    let store = SqliteStore::open(&dir.join("vigil.db")).unwrap();
    let (store, _thread) = StoreHandle::spawn(Box::new(store));
    let (actions, _actions_rx) = mpsc::unbounded_channel();
    let (plan, _plan_rx) = watch::channel(Arc::new(Plan {
        targets: Vec::new(),
        probe: config.probe.clone(),
        heartbeat_ttl: config.heartbeat.ttl,
    }));
    let (mut engine, _) = Engine::recover(
        config,
        store,
        Arc::new(Metrics::new()),
        Arc::new(StoreHealth::default()),
        actions,
        plan,
    )
    .await
    .unwrap();
    engine.initial_targets(Vec::new(), Some(targets(n)));
    let (tx, rx) = mpsc::channel(1024);
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(engine.run(rx, stop_rx));
    (tx, stop, task)
}

/// A crash (no final snapshot) after probes, some of which the engine did not log
/// (healthy targets passing again) and a bulk start-up it snapshotted instead of
/// logging: the restarted engine's guard is where the first one left it.
async fn restart_keeps_the_guard(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, _stop, task) = start(dir.path(), n).await;
    for round in 0..4 {
        for t in targets(n) {
            let ok = !(t.id == "t001" || (t.id == "t002" && round % 2 == 1));
            tx.send(probe(&t.id, &t.zone, ok)).await.unwrap();
        }
    }
    // A hold is answered once committed: everything before it is in the store.
    let (reply, rx) = oneshot::channel();
    tx.send(Command::SetHold {
        id: "t000".into(),
        kind: HoldKind::Silenced,
        reason: "test".into(),
        duration: None,
        reply,
    })
    .await
    .unwrap();
    rx.await.unwrap().unwrap();
    let before = guard_views(&tx).await;
    task.abort();
    let _ = task.await;
    let rec =
        crate::store::Store::recover(&mut SqliteStore::open(&dir.path().join("vigil.db")).unwrap())
            .unwrap();
    let ops: Vec<Op> = rec
        .ops
        .iter()
        .flat_map(|b| serde_json::from_str::<Vec<Op>>(b).unwrap())
        .collect();
    let count = |f: fn(&Op) -> bool| ops.iter().filter(|o| f(o)).count();
    if n >= BULK_CHANGES {
        assert!(rec.snapshot.is_some(), "a bulk start is snapshotted");
        assert_eq!(count(|o| matches!(o, Op::Add { .. })), 0);
    }
    // A target's first two passes make it healthy; its later passes are not logged
    // (t001 fails 4 times, t002 alternates: 4 logged each).
    let observed = count(|o| matches!(o, Op::Observe { .. }));
    assert_eq!(observed, 2 * (n - 2) + 8, "of {} probes", 4 * n);
    let (tx, _stop, _task) = start(dir.path(), n).await;
    let after = guard_views(&tx).await;
    assert_eq!(before.len(), n);
    let flapping = before.iter().find(|v| v["id"] == "t002").unwrap();
    assert!(flapping["penalty"].as_u64().unwrap() > 0, "{flapping}");
    // A flap penalty decays with the time between the two views (seconds on a
    // loaded machine): it may only have decayed, never grown or reset.
    let (mut before, mut after) = (before, after);
    for (b, a) in before.iter_mut().zip(after.iter_mut()) {
        let pb = b["penalty"].take().as_u64().unwrap();
        let pa = a["penalty"].take().as_u64().unwrap();
        assert!(
            pa <= pb && (pb == 0 || pa > 0) && pb - pa <= pb / 100 + 1,
            "{}: penalty {pb} -> {pa}",
            b["id"]
        );
    }
    assert_eq!(before, after);
}

/// One recorded input sequence (probe results of six targets: passes, one target
/// flapping, one failing for good under a silence then without, two failing
/// together; silences set, lifted and refused), given to the controller's
/// live path (commands, the engine's loop, the store) and to
/// `vigil_core::fleet::step`, the judging step the simulator drives: the same
/// observations are logged and the same decisions recorded, in the same order.
#[tokio::test]
async fn one_recorded_sequence_gives_the_same_effects_from_the_controller_and_the_step() {
    use vigil_core::fleet::{DecisionKind, Effect, Input, step};
    let guard_config = GuardConfig {
        grace: Duration::ZERO,
        min_failing: Duration::ZERO,
        ..GuardConfig::default()
    };
    let n = 6;
    /// One recorded input: a probe result, or an operator setting or lifting a
    /// silence (`Maintenance` asked of a silenced target is refused).
    enum Rec {
        Probe(String, String, bool),
        Hold(&'static str),
        Lift(&'static str, HoldKind),
    }
    let mut recorded: Vec<Rec> = Vec::new();
    let round = |recorded: &mut Vec<Rec>, ok: &dyn Fn(usize) -> bool| {
        for t in targets(n) {
            let i: usize = t.id[1..].parse().unwrap();
            recorded.push(Rec::Probe(t.id.clone(), t.zone.clone(), ok(i)));
        }
    };
    for _ in 0..2 {
        round(&mut recorded, &|_| true);
    }
    for r in 0..4 {
        round(&mut recorded, &|i| i != 2 || r % 2 == 0);
    }
    recorded.push(Rec::Hold("t001"));
    for _ in 0..2 {
        round(&mut recorded, &|i| i != 1);
    }
    recorded.push(Rec::Lift("t001", HoldKind::Maintenance));
    recorded.push(Rec::Lift("t005", HoldKind::Silenced));
    recorded.push(Rec::Lift("t001", HoldKind::Silenced));
    for _ in 0..4 {
        round(&mut recorded, &|i| i != 1);
    }
    for _ in 0..4 {
        round(&mut recorded, &|i| i != 1 && i != 3 && i != 4);
    }
    for _ in 0..3 {
        round(&mut recorded, &|i| i != 1);
    }
    recorded.push(Rec::Hold("t000"));

    // The controller's path.
    let dir = tempfile::tempdir().unwrap();
    let (tx, _stop, task) = start_with(dir.path(), n, guard_config.clone()).await;
    let mut answers = Vec::new();
    for rec in &recorded {
        match rec {
            Rec::Probe(id, zone, ok) => tx.send(probe(id, zone, *ok)).await.unwrap(),
            // Answered once committed: everything before it is in the store.
            Rec::Hold(id) => answers.push(silence(&tx, id).await),
            Rec::Lift(id, kind) => {
                let (reply, rx) = oneshot::channel();
                let id = id.to_string();
                let kind = *kind;
                tx.send(Command::ClearHold { id, kind, reply })
                    .await
                    .unwrap();
                answers.push(rx.await.unwrap());
            }
        }
    }
    task.abort();
    let _ = task.await;
    let mut db = SqliteStore::open(&dir.path().join("vigil.db")).unwrap();
    let mut decided: Vec<(String, String)> = crate::store::Store::decisions(&mut db, None, 1000)
        .unwrap()
        .into_iter()
        .map(|d| (d.target, d.outcome))
        .collect();
    decided.reverse();
    let observed: Vec<Observation> = crate::store::Store::recover(&mut db)
        .unwrap()
        .ops
        .iter()
        .flat_map(|b| serde_json::from_str::<Vec<Op>>(b).unwrap())
        .filter_map(|op| match op {
            Op::Observe { obs, .. } => Some(obs),
            _ => None,
        })
        .collect();

    // The step's path, as the simulator drives it.
    let mut guard = SafetyGuard::new(guard_config);
    let mut now = Time::ZERO;
    for t in targets(n) {
        guard.apply(&Op::Add {
            at: now,
            id: t.id,
            zone: t.zone,
        });
    }
    let mut effects = Vec::new();
    let mut step_answers = Vec::new();
    for rec in &recorded {
        now = now + Duration::from_millis(1);
        let input = match rec {
            Rec::Probe(id, zone, ok) => {
                let Command::Probe { obs, .. } = probe(id, zone, *ok) else {
                    unreachable!()
                };
                Input::Probe(obs)
            }
            Rec::Hold(id) => Input::SetHold {
                id: id.to_string(),
                hold: Hold {
                    kind: HoldKind::Silenced,
                    reason: "test".into(),
                    until: None,
                },
            },
            Rec::Lift(id, kind) => Input::ClearHold {
                id: id.to_string(),
                kind: *kind,
            },
        };
        let fx = step(&mut guard, now, input);
        if !matches!(rec, Rec::Probe(..)) {
            let refused = fx.iter().find_map(|e| match e {
                Effect::Refused(r) => Some(EngineError::from(r.clone())),
                _ => None,
            });
            step_answers.push(refused.map_or(Ok(()), Err));
        }
        effects.extend(fx);
    }
    let step_decided: Vec<(String, String)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Decide(k, d) => Some((d.target.clone(), k.as_str().to_string())),
            Effect::Event(_) | Effect::Log(_) | Effect::Refused(_) => None,
        })
        .collect();
    let step_observed: Vec<Observation> = effects
        .iter()
        .filter_map(|e| match e.op() {
            Some(Op::Observe { obs, .. }) => Some(obs.clone()),
            _ => None,
        })
        .collect();

    let kinds = |k: DecisionKind| step_decided.iter().filter(|d| d.1 == k.as_str()).count();
    assert!(
        kinds(DecisionKind::Act) > 0 && kinds(DecisionKind::HoldBack) > 0,
        "the sequence acts and holds back: {step_decided:?}"
    );
    assert_eq!(
        decided, step_decided,
        "the same decisions, in the same order"
    );
    assert_eq!(answers, step_answers, "the same answers to the operator");
    assert!(
        matches!(answers[1], Err(EngineError::OtherHold { .. }))
            && matches!(answers[2], Err(EngineError::NoHold { .. })),
        "{answers:?}"
    );
    assert_eq!(observed, step_observed, "the same observations logged");
}

#[tokio::test]
async fn a_restart_after_a_crash_restores_the_guard_with_few_targets() {
    restart_keeps_the_guard(5).await;
}

#[tokio::test]
async fn a_restart_after_a_crash_restores_the_guard_after_a_bulk_start() {
    restart_keeps_the_guard(BULK_CHANGES + 50).await;
}

/// The SQLite store with commits that fail while `fail` is set (reads keep
/// working, as on a full disk). The integration test fills a real file system;
/// this one runs without root.
struct FailingCommits {
    inner: SqliteStore,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

impl crate::store::Store for FailingCommits {
    fn recover(&mut self) -> Result<Recovered, StoreError> {
        self.inner.recover()
    }
    fn commit(&mut self, batch: &Batch) -> Result<Vec<ActionRecord>, StoreError> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Unusable {
                path: "test".into(),
                why: "database or disk is full (injected)".into(),
            });
        }
        self.inner.commit(batch)
    }
    fn start_attempt(&mut self, id: i64) -> Result<(), StoreError> {
        self.inner.start_attempt(id)
    }
    fn finish_action(
        &mut self,
        id: i64,
        state: crate::store::ActionState,
        at_ms: i64,
        result: &str,
    ) -> Result<(), StoreError> {
        self.inner.finish_action(id, state, at_ms, result)
    }
    fn decisions(
        &mut self,
        target: Option<&str>,
        limit: usize,
    ) -> Result<Vec<crate::store::DecisionRecord>, StoreError> {
        self.inner.decisions(target, limit)
    }
    fn actions(&mut self, limit: usize) -> Result<Vec<ActionRecord>, StoreError> {
        self.inner.actions(limit)
    }
    fn transitions(
        &mut self,
        target: &str,
        limit: usize,
    ) -> Result<Vec<crate::store::TransitionRecord>, StoreError> {
        self.inner.transitions(target, limit)
    }
}

async fn fleet(tx: &mpsc::Sender<Command>) -> Arc<FleetView> {
    let (reply, rx) = oneshot::channel();
    tx.send(Command::Fleet(reply)).await.unwrap();
    rx.await.unwrap()
}

async fn silence(tx: &mpsc::Sender<Command>, id: &str) -> Result<(), EngineError> {
    let (reply, rx) = oneshot::channel();
    tx.send(Command::SetHold {
        id: id.into(),
        kind: HoldKind::Silenced,
        reason: "test".into(),
        duration: None,
        reply,
    })
    .await
    .unwrap();
    rx.await.unwrap()
}

#[tokio::test]
async fn a_decision_whose_commit_failed_has_no_effect_and_is_made_again_once_the_store_works() {
    let dir = tempfile::tempdir().unwrap();
    let config = Arc::new(ControllerConfig {
        guard: GuardConfig {
            grace: Duration::ZERO,
            min_failing: Duration::ZERO,
            ..GuardConfig::default()
        },
        ..ControllerConfig::default()
    });
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let store = FailingCommits {
        inner: SqliteStore::open(&dir.path().join("vigil.db")).unwrap(),
        fail: fail.clone(),
    };
    let (store, _thread) = StoreHandle::spawn(Box::new(store));
    let (actions, mut actions_rx) = mpsc::unbounded_channel();
    let (plan, _plan_rx) = watch::channel(Arc::new(Plan {
        targets: Vec::new(),
        probe: config.probe.clone(),
        heartbeat_ttl: config.heartbeat.ttl,
    }));
    let health = Arc::new(StoreHealth::default());
    let (mut engine, _) = Engine::recover(
        config,
        store,
        Arc::new(Metrics::new()),
        health.clone(),
        actions,
        plan,
    )
    .await
    .unwrap();
    engine.initial_targets(Vec::new(), Some(targets(5)));
    let (tx, rx) = mpsc::channel(1024);
    let (_stop, stop_rx) = watch::channel(false);
    tokio::spawn(engine.run(rx, stop_rx));
    for _ in 0..2 {
        for t in targets(5) {
            tx.send(probe(&t.id, &t.zone, true)).await.unwrap();
        }
    }
    silence(&tx, "t004").await.unwrap();
    let before = guard_views(&tx).await;
    tx.send(Command::Trace(None)).await.unwrap();

    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..5 {
        tx.send(probe("t001", "z1", false)).await.unwrap();
    }
    assert_eq!(
        silence(&tx, "t002").await,
        Err(EngineError::Store(
            "store test: database or disk is full (injected)".into()
        )),
        "a mutation that cannot be committed is refused"
    );
    let f = fleet(&tx).await;
    assert!(f.store_error.is_some());
    assert!(health.error().is_some());
    assert_eq!(f.guard.budget_left, 2, "no budget spent");
    assert_eq!(
        guard_views(&tx).await,
        before,
        "every target as committed: no failure streak, no report, no new hold"
    );
    assert!(
        actions_rx.try_recv().is_err(),
        "no action without an intent"
    );

    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), async {
        while fleet(&tx).await.store_error.is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the store was tried again");
    assert!(health.error().is_none());
    for _ in 0..3 {
        tx.send(probe("t001", "z1", false)).await.unwrap();
    }
    let action = tokio::time::timeout(Duration::from_secs(10), actions_rx.recv())
        .await
        .expect("decided again once the store works")
        .unwrap();
    assert_eq!(action.target, "t001");
    assert_eq!(fleet(&tx).await.guard.budget_left, 1);
    silence(&tx, "t002").await.unwrap();

    // The live path's replica, recorded from the failure on, replays exactly: the
    // commits refused, the undo, the retry and the act decided again are a
    // function of the replica's calls alone, as the simulator makes them.
    let (reply, rx) = oneshot::channel();
    tx.send(Command::Trace(Some(reply))).await.unwrap();
    let trace = rx.await.unwrap().expect("recording");
    let calls = |name: &str| trace.calls().iter().filter(|c| c.name() == name).count();
    assert!(
        calls("committed") >= 3 && calls("restore") >= 1 && calls("retry") >= 1,
        "the trace holds the failure and the recovery: {:?}",
        trace.calls().iter().map(|c| c.name()).collect::<Vec<_>>()
    );
    let failed = trace.calls().iter().any(|c| {
        matches!(
            c,
            vigil_core::fleet::Call::Committed {
                outcome: Commit::Failed(_),
                ..
            }
        )
    });
    assert!(failed, "a failed commit was recorded");
    trace
        .replay()
        .expect("the live path replays through the replica");
}
