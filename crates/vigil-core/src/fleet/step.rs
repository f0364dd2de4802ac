//! The engine's judging step: one input at one time, applied to the guard, returns
//! the effects a driver records and acts on.
//!
//! This is the part of the step function both drivers already share: `vigil
//! controller` turns its probe results, its probers' verdicts and its ticks into
//! [`Input`]s and commits the [`Effect`]s (ops to the log, decisions to the store,
//! events to the log and the dashboard); `vigil sim` feeds the same inputs from its
//! virtual fleet and acts on the same effects. The rest of the step (target lists,
//! operator commands, leadership, commit results) is still the controller's own.

use super::compose::{DecisionKind, Judged};
use crate::guard::{Applied, Decision, GuardEvent, Hold, HoldKind, Observation, Op, SafetyGuard};
use crate::time::Time;

/// One input to the judging step.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A probe result of one target (its own prober's), the peer check composed in
    /// ([`peer_check`](super::peer_check): the controller's sharded probing reports the
    /// composed observation to the other replicas too).
    Probe(Observation),
    /// Its probers' verdict on target `id` (sharded probing): an observation or doubt.
    Agreed {
        /// The target.
        id: String,
        /// What its probers say together.
        judged: Judged,
    },
    /// Time passed: holds expire, flap penalties decay, freezes are re-evaluated.
    Tick,
    /// An operator puts a hold on target `id`.
    SetHold {
        /// The target.
        id: String,
        /// The hold.
        hold: Hold,
    },
    /// An operator lifts the hold of `kind` on target `id`: a hold of the other kind
    /// stays (lifting a maintenance with a silence's lift would put a target under
    /// repair back in the counts and in reach of the actuator), and is refused.
    ClearHold {
        /// The target.
        id: String,
        /// The kind to lift.
        kind: HoldKind,
    },
    /// An operator freezes the fleet.
    Freeze {
        /// Why.
        reason: String,
    },
    /// An operator lifts the manual freeze.
    Unfreeze,
}

/// Why an input was refused (it changed nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// This replica does not judge now ([`Replica::step`](super::Replica::step)):
    /// it follows, or its store fails. A probe is shown, not judged; an operator's
    /// command is refused, since it could not be made durable.
    Halted(super::Mode),
    /// No such target.
    UnknownTarget(String),
    /// The target has no hold to lift.
    NoHold {
        /// The target.
        id: String,
        /// The kind asked for.
        kind: HoldKind,
    },
    /// The target's hold is of the other kind.
    OtherHold {
        /// The target.
        id: String,
        /// The kind asked for.
        kind: HoldKind,
        /// The kind in force.
        held: HoldKind,
    },
}

/// One effect of a step, in the order they happened.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// The guard changed: this op goes to the log (an input that changed nothing, a
    /// healthy target passing again, has no op: replaying without it ends the same).
    Log(Op),
    /// A decision to record (a repeated hold-back is not one): an act is an action
    /// to run once it is committed.
    Decide(DecisionKind, Decision),
    /// Something the guard says happened (a freeze, flapping, an alert due).
    Event(GuardEvent),
    /// The operator's command was refused; nothing changed.
    Refused(Refusal),
}

impl Effect {
    /// The op, if this effect logs one.
    pub fn op(&self) -> Option<&Op> {
        match self {
            Effect::Log(op) => Some(op),
            Effect::Decide(..) | Effect::Event(_) | Effect::Refused(_) => None,
        }
    }
}

/// Applies `input` at `now` to `guard` and returns its effects: the op first (when it
/// changed the guard), then its decision, then the guard's events; or why an
/// operator's command was refused.
pub fn step(guard: &mut SafetyGuard, now: Time, input: Input) -> Vec<Effect> {
    let op = match input {
        Input::Probe(obs) => Op::Observe { at: now, obs },
        Input::Agreed { id, judged } => judged.into_op(now, &id),
        Input::Tick => Op::Tick { at: now },
        Input::SetHold { id, hold } => Op::SetHold { at: now, id, hold },
        Input::ClearHold { id, kind } => {
            let held = guard.target(now, &id).map(|v| v.hold.map(|h| h.kind));
            let refusal = match held {
                None => Some(Refusal::UnknownTarget(id.clone())),
                Some(None) => Some(Refusal::NoHold {
                    id: id.clone(),
                    kind,
                }),
                Some(Some(h)) if h != kind => Some(Refusal::OtherHold {
                    id: id.clone(),
                    kind,
                    held: h,
                }),
                Some(Some(_)) => None,
            };
            if let Some(r) = refusal {
                return vec![Effect::Refused(r)];
            }
            Op::ClearHold { at: now, id }
        }
        Input::Freeze { reason } => Op::Freeze { at: now, reason },
        Input::Unfreeze => Op::Unfreeze { at: now },
    };
    let applied = guard.apply(&op);
    let mut effects = Vec::new();
    if let (Applied::UnknownTarget, Op::SetHold { id, .. }) = (&applied, &op) {
        effects.push(Effect::Refused(Refusal::UnknownTarget(id.clone())));
    }
    if applied.changed() {
        effects.push(Effect::Log(op));
        if let Some(d) = applied.into_decision()
            && let Some(kind) = DecisionKind::recorded(&d)
        {
            effects.push(Effect::Decide(kind, d));
        }
    }
    effects.extend(guard.drain_events().into_iter().map(Effect::Event));
    effects
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::GuardConfig;
    use std::time::Duration;

    fn guard(n: usize) -> SafetyGuard {
        let mut g = SafetyGuard::new(GuardConfig {
            grace: Duration::ZERO,
            min_failing: Duration::ZERO,
            ..GuardConfig::default()
        });
        for i in 0..n {
            g.add_target(Time::ZERO, &format!("t{i}"), "a");
        }
        g
    }

    fn probe(id: &str, ok: bool) -> Input {
        Input::Probe(if ok {
            Observation::pass(id, "a")
        } else {
            Observation::failed_checks(id, "a", ["disk:free"])
        })
    }

    #[test]
    fn a_pass_that_changes_nothing_has_no_effect_and_a_confirmed_failure_is_one_act() {
        let mut g = guard(10);
        let at = |s| Time::ZERO + Duration::from_secs(s);
        for s in 0..2 {
            for i in 0..10 {
                step(&mut g, at(s), probe(&format!("t{i}"), true));
            }
        }
        assert!(
            step(&mut g, at(3), probe("t0", true)).is_empty(),
            "a healthy target passing again is not logged"
        );
        let acts: Vec<DecisionKind> = (4..8)
            .flat_map(|s| step(&mut g, at(s), probe("t1", false)))
            .filter_map(|e| match e {
                Effect::Decide(k, _) => Some(k),
                _ => None,
            })
            .collect();
        assert_eq!(acts.first(), Some(&DecisionKind::Act), "{acts:?}");
    }
}
