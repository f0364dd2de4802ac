//! The simulator's controller is the fleet [`Replica`] `vigil controller` drives: a
//! run's calls on it, recorded, replay to the same outputs (the controller's engine
//! tests replay its live path the same way).

use super::*;
use crate::scenario::Scenario;
use std::path::Path;
use vigil_core::fleet::{Call, Commit, Trace};

/// Runs scenario file `name` (under `scenarios/`) recording every controller
/// process's replica: one trace per process.
fn traces(name: &str) -> Vec<Trace> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios")
        .join(name);
    let s = Scenario::load(&path).expect("the scenario loads");
    let mut sim = Sim::new(&s.config, 1, Policies::Vigil);
    sim.ctl.traces = Some(Vec::new());
    sim.ctl.replica.start_trace();
    sim.run(&mut |_| {});
    let mut traces = sim.ctl.traces.take().expect("recording");
    traces.extend(sim.ctl.replica.take_trace());
    traces
}

fn count(traces: &[Trace], f: impl Fn(&Call) -> bool) -> usize {
    traces
        .iter()
        .flat_map(Trace::calls)
        .filter(|c| f(c))
        .count()
}

fn replays(traces: &[Trace]) {
    for (i, t) in traces.iter().enumerate() {
        if let Err(d) = t.replay() {
            panic!("process {i}'s replica does not replay: {d}");
        }
    }
}

#[test]
fn a_crash_that_loses_a_batch_replays_through_the_replica_process_by_process() {
    let traces = traces("controller-crash-lost-batch.toml");
    assert!(
        traces.len() >= 2,
        "the controller restarted: {}",
        traces.len()
    );
    let acted = count(
        &traces,
        |c| matches!(c, Call::Take(Some(b)) if b.effects.iter().any(|e| matches!(e, vigil_core::fleet::Effect::Decide(vigil_core::fleet::DecisionKind::Act, _)))),
    );
    assert!(acted >= 1, "the run decides to act");
    replays(&traces);
}

#[test]
fn a_store_outage_and_a_failover_replay_through_the_replica() {
    let outage = traces("store-outage-mid-incident.toml");
    let failed = count(&outage, |c| {
        matches!(
            c,
            Call::Committed {
                outcome: Commit::Failed(_),
                ..
            }
        )
    });
    assert!(failed >= 1, "the store refused a commit");
    assert!(count(&outage, |c| matches!(c, Call::Restore { .. })) >= 1);
    replays(&outage);
    let failover = traces("leader-failover.toml");
    assert!(
        count(&failover, |c| matches!(
            c,
            Call::Lead { .. } | Call::Follow { .. }
        )) >= 1,
        "the run changes leader"
    );
    replays(&failover);
}
