use super::*;
use crate::fleet::Call;
use crate::fleet::DecisionKind;
use crate::guard::{GuardConfig, Observation};
use std::collections::BTreeSet;
use std::time::Duration;

/// An in-memory store: what [`Replica::take`]n batches left behind when committed.
#[derive(Default)]
struct Mem {
    stored: Stored,
    /// Commits fail while set.
    down: bool,
}

impl Mem {
    fn commit(&mut self, r: &mut Replica) -> (AfterCommit, Vec<DecisionKind>) {
        let Some(batch) = r.take() else {
            return (AfterCommit::Done, Vec::new());
        };
        if self.down {
            return (r.committed(Commit::Failed("disk full".into())), Vec::new());
        }
        self.stored.commit(&batch);
        let kinds = batch
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::Decide(k, _) => Some(*k),
                _ => None,
            })
            .collect();
        (r.committed(Commit::Done), kinds)
    }
}

fn config() -> GuardConfig {
    GuardConfig {
        grace: Duration::ZERO,
        min_failing: Duration::ZERO,
        ..GuardConfig::default()
    }
}

fn at(s: u64) -> Time {
    Time::from_secs(s)
}

/// Ten targets added and passing twice, committed.
fn fleet(mem: &mut Mem) -> Replica {
    let mut r = Replica::new(SafetyGuard::new(config()));
    for i in 0..10 {
        let op = Op::Add {
            at: at(0),
            id: format!("t{i}"),
            zone: "a".into(),
        };
        r.apply(at(0), op, Some(&format!("t{i}")));
    }
    for s in 1..3 {
        for i in 0..10 {
            r.step(at(s), Input::Probe(Observation::pass(format!("t{i}"), "a")));
        }
    }
    mem.commit(&mut r);
    r
}

fn fail(r: &mut Replica, s: u64, id: &str) -> Turn {
    r.step(
        at(s),
        Input::Probe(Observation::failed_checks(id, "a", ["disk:free"])),
    )
}

/// Fails `id` from second `from`, committing each turn, until a turn decides to act
/// on it; that turn's batch is left uncommitted. Returns its second, and the guard
/// state (serialised) as of the last commit before it.
fn fail_until_decided(r: &mut Replica, mem: &mut Mem, from: u64, id: &str) -> (u64, String) {
    let mut committed = serde_json::to_string(r.guard().state()).unwrap();
    for s in from..from + 10 {
        let turn = fail(r, s, id);
        if turn
            .effects
            .iter()
            .any(|e| matches!(e, Effect::Decide(DecisionKind::Act, _)))
        {
            return (s, committed);
        }
        mem.commit(r);
        committed = serde_json::to_string(r.guard().state()).unwrap();
    }
    panic!("no act decided on {id}");
}

/// Fails `id` until the guard acts; returns when it did.
fn fail_until_act(r: &mut Replica, mem: &mut Mem, from: u64, id: &str) -> (u64, Vec<DecisionKind>) {
    for s in from..from + 10 {
        fail(r, s, id);
        let (_, kinds) = mem.commit(r);
        if kinds.contains(&DecisionKind::Act) {
            return (s, kinds);
        }
    }
    panic!("no act on {id}");
}

#[test]
fn a_failed_commit_never_happened_and_the_decision_is_made_again_once_the_store_works() {
    let mut mem = Mem::default();
    let mut r = fleet(&mut mem);
    // t1 fails, committed each time, until the act is decided; then the store fails.
    let (s, before) = fail_until_decided(&mut r, &mut mem, 3, "t1");
    mem.down = true;
    let (after, kinds) = mem.commit(&mut r);
    assert_eq!(after, AfterCommit::Undo { first: true });
    assert!(kinds.is_empty(), "nothing committed");
    assert!(
        r.mode().dirty(),
        "the guard is ahead of the store until restored"
    );
    assert!(!r.retry(), "no retry before the guard is as committed");
    let halted = fail(&mut r, s + 1, "t1");
    assert!(
        matches!(
            halted.refusal(),
            Some(Refusal::Halted(Mode::StoreFailing { .. }))
        ),
        "{halted:?}"
    );
    r.restore(&mem.stored, at(s + 1)).unwrap();
    assert_eq!(
        serde_json::to_string(r.guard().state()).unwrap(),
        before,
        "the act never happened: the guard is as committed"
    );
    assert_eq!(r.standing("t1"), Some(Standing::Failing));
    // A retry while the store still fails is not news.
    assert!(r.retry());
    r.snapshot(at(s + 2), None);
    assert_eq!(mem.commit(&mut r).0, AfterCommit::Undo { first: false });
    r.restore(&mem.stored, at(s + 2)).unwrap();
    mem.down = false;
    assert!(r.retry());
    assert!(r.mode().recovering());
    r.snapshot(at(s + 3), None);
    assert_eq!(mem.commit(&mut r).0, AfterCommit::Recovered);
    assert_eq!(r.mode(), &Mode::ALONE);
    let (_, kinds) = fail_until_act(&mut r, &mut mem, s + 4, "t1");
    assert_eq!(kinds, vec![DecisionKind::Act], "decided again, once");
}

#[test]
fn a_crash_loses_the_uncommitted_batch_and_nothing_else() {
    let mut mem = Mem::default();
    let mut r = fleet(&mut mem);
    let (s, _) = fail_until_act(&mut r, &mut mem, 3, "t1");
    let committed = serde_json::to_string(r.guard().state()).unwrap();
    // t2 fails until its act is decided, and the process dies before the commit.
    let (t, _) = fail_until_decided(&mut r, &mut mem, s + 1, "t2");
    assert!(!r.is_clean());
    let mut lost = Replica::rebuild(&mem.stored, &config()).unwrap().replica;
    let v = lost.guard().target(at(t), "t2").unwrap();
    assert!(v.reported_at.is_none(), "the lost act is not remembered");
    let v1 = lost.guard().target(at(t), "t1").unwrap();
    assert!(v1.reported_at.is_some(), "the committed act is");
    assert_ne!(
        serde_json::to_string(lost.guard().state()).unwrap(),
        committed
    );
    // The successor decides t2 again, once.
    let (_, kinds) = fail_until_act(&mut lost, &mut mem, t + 1, "t2");
    assert_eq!(kinds, vec![DecisionKind::Act]);
}

#[test]
fn a_fenced_commit_follows_drops_what_was_pending_and_refuses_to_judge() {
    let mut mem = Mem::default();
    let mut r = fleet(&mut mem);
    r.lead(Some(3), "new term".into());
    r.restore(&mem.stored, at(3)).unwrap();
    assert!(r.retry());
    r.snapshot(at(3), None);
    let batch = r.take().unwrap();
    assert_eq!(batch.epoch, Some(3), "a term's batch carries its epoch");
    assert_eq!(r.committed(Commit::Done), AfterCommit::Recovered);
    fail(&mut r, 4, "t1");
    assert_eq!(
        r.committed(Commit::Fenced("replica b took over".into())),
        AfterCommit::Follow
    );
    assert!(
        r.take().is_none(),
        "a follower has nothing of its own to commit"
    );
    let turn = fail(&mut r, 5, "t1");
    assert_eq!(
        turn.refusal(),
        Some(&Refusal::Halted(Mode::Following {
            leader: "replica b took over".into()
        }))
    );
}

#[test]
fn a_standing_that_changes_is_one_transition_in_the_batch_and_the_first_is_none() {
    let mut mem = Mem::default();
    let mut r = fleet(&mut mem);
    assert_eq!(r.standing("t1"), Some(Standing::Healthy));
    let turn = fail(&mut r, 3, "t1");
    assert_eq!(turn.transitions.len(), 1, "{turn:?}");
    let tr = &turn.transitions[0];
    assert_eq!((tr.from, tr.to), (Standing::Healthy, Standing::Failing));
    assert!(tr.detail.contains("disk:free"), "{}", tr.detail);
    let batch = r.take().unwrap();
    assert_eq!(batch.transitions, turn.transitions);
    assert_eq!(batch.ops.len(), 1);
    assert!(r.take().is_none(), "taken once");
}

#[test]
fn a_bulk_change_is_one_snapshot_without_its_ops_and_rebuilds_the_same() {
    let mut r = Replica::new(SafetyGuard::new(config()));
    r.start_bulk();
    for i in 0..300 {
        let id = format!("t{i}");
        let op = Op::Add {
            at: at(1),
            id: id.clone(),
            zone: "a".into(),
        };
        r.apply(at(1), op, Some(&id));
    }
    r.end_bulk(at(1), None);
    let batch = r.take().unwrap();
    assert!(batch.ops.is_empty(), "the snapshot covers them");
    let stored = Stored {
        snapshot: batch.snapshot.map(|(text, _)| text),
        ops: Vec::new(),
    };
    let rebuilt = Replica::rebuild(&stored, &config()).unwrap();
    assert_eq!(rebuilt.replica.guard().target_ids().count(), 300);
    assert_eq!(rebuilt.latest, at(1));
    assert_eq!(
        serde_json::to_string(rebuilt.replica.guard().state()).unwrap(),
        serde_json::to_string(r.guard().state()).unwrap()
    );
}

#[test]
fn a_store_that_does_not_parse_is_an_error_that_names_the_row() {
    let stored = Stored {
        snapshot: None,
        ops: vec!["[]".into(), "[{\"op\":\"nope\"}]".into()],
    };
    let e = Replica::rebuild(&stored, &config()).unwrap_err();
    assert!(e.to_string().starts_with("guard op batch 1 "), "{e}");
    let stored = Stored {
        snapshot: Some("{".into()),
        ops: Vec::new(),
    };
    let e = Replica::rebuild(&stored, &config()).unwrap_err();
    assert!(
        e.to_string()
            .contains("refusing to start with a reset budget"),
        "{e}"
    );
}

/// A run through a failed commit, its undo, the store's return and a fence, recorded
/// from the middle (after the fleet was built).
fn traced_run() -> (Replica, crate::fleet::Trace) {
    let mut mem = Mem::default();
    let mut r = fleet(&mut mem);
    r.start_trace();
    let (s, _) = fail_until_decided(&mut r, &mut mem, 3, "t1");
    mem.down = true;
    mem.commit(&mut r);
    r.restore(&mem.stored, at(s + 1)).unwrap();
    mem.down = false;
    assert!(r.retry());
    r.snapshot(at(s + 2), None);
    mem.commit(&mut r);
    fail_until_act(&mut r, &mut mem, s + 3, "t1");
    r.step(at(s + 20), Input::Tick);
    r.take();
    r.committed(Commit::Fenced("epoch 2 leads".into()));
    let trace = r.take_trace().expect("recording");
    (r, trace)
}

#[test]
fn a_recorded_run_replays_to_the_same_outputs_and_the_same_replica() {
    let (mut r, trace) = traced_run();
    let kinds: BTreeSet<&str> = trace.calls().iter().map(Call::name).collect();
    for k in ["step", "take", "committed", "restore", "retry", "snapshot"] {
        assert!(kinds.contains(k), "the run records {k}: {kinds:?}");
    }
    let replayed = trace
        .replay()
        .expect("the same calls give the same outputs");
    assert_eq!(replayed.mode(), r.mode());
    assert_eq!(
        serde_json::to_string(replayed.guard().state()).unwrap(),
        serde_json::to_string(r.guard().state()).unwrap()
    );
    assert!(r.take_trace().is_none(), "taking the trace stops recording");
}

#[test]
fn a_replay_names_the_first_call_whose_output_differs() {
    let (_, mut trace) = traced_run();
    // Pretend the recorded run decided nothing at its first act.
    let index = trace
        .calls
        .iter()
        .position(|c| matches!(c, Call::Take(Some(b)) if b.effects.iter().any(|e| matches!(e, Effect::Decide(DecisionKind::Act, _)))))
        .expect("the run acts");
    if let Call::Take(Some(b)) = &mut trace.calls[index] {
        b.effects.clear();
    }
    let d = trace.replay().unwrap_err();
    assert_eq!((d.index, d.name), (index, "take"), "{d}");
    assert!(d.replayed.contains("Act"), "{d}");
}
