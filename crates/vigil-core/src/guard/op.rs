//! Guard inputs as data: every call a driver makes on the [`SafetyGuard`], as a
//! serialisable [`Op`] applied by [`SafetyGuard::apply`].
//!
//! The guard is deterministic, so a driver that keeps a log of the ops it applied (the
//! controller appends them to its store after each snapshot) rebuilds the exact state
//! by applying the log again after a restart. One enum for every input means the
//! driver's live path and its replay path are the same call: nothing a driver does to
//! the guard can be missing from the log.
//!
//! The form on disk is the controller's store format since its first release: a JSON
//! object tagged by `op` (`observe`, `add`, `remove`, `doubt`, `set_hold`, `clear_hold`,
//! `freeze`, `unfreeze`, `tick`, `reconfigure`), with `at` in integer nanoseconds since
//! the driver's epoch ([`Time`]'s own serialisation).

use super::{Decision, GuardConfig, Hold, Observation, SafetyGuard};
use crate::time::Time;
use serde::{Deserialize, Serialize};

/// One call on the guard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// A probe's result ([`SafetyGuard::observe`]).
    Observe {
        /// When.
        at: Time,
        /// What.
        obs: Observation,
    },
    /// A target appears or changes zone ([`SafetyGuard::add_target`]).
    Add {
        /// When.
        at: Time,
        /// Target id.
        id: String,
        /// Zone.
        zone: String,
    },
    /// A target is forgotten ([`SafetyGuard::remove_target`]).
    Remove {
        /// When.
        at: Time,
        /// Target id.
        id: String,
    },
    /// No verdict on a target now ([`SafetyGuard::doubt`]).
    Doubt {
        /// When.
        at: Time,
        /// Target id.
        id: String,
    },
    /// An operator's hold ([`SafetyGuard::set_hold`]).
    SetHold {
        /// When.
        at: Time,
        /// Target id.
        id: String,
        /// The hold.
        hold: Hold,
    },
    /// A hold lifted ([`SafetyGuard::clear_hold`]).
    ClearHold {
        /// When.
        at: Time,
        /// Target id.
        id: String,
    },
    /// An operator's freeze ([`SafetyGuard::freeze`]).
    Freeze {
        /// When.
        at: Time,
        /// Why.
        reason: String,
    },
    /// The operator's freeze lifted ([`SafetyGuard::unfreeze`]).
    Unfreeze {
        /// When.
        at: Time,
    },
    /// Time passes ([`SafetyGuard::tick`]).
    Tick {
        /// When.
        at: Time,
    },
    /// New settings ([`SafetyGuard::reconfigure`]).
    Reconfigure {
        /// The new config.
        config: Box<GuardConfig>,
    },
}

impl Op {
    /// When the op was made (None for a reconfiguration, which has no time).
    pub fn at(&self) -> Option<Time> {
        match self {
            Op::Observe { at, .. }
            | Op::Add { at, .. }
            | Op::Remove { at, .. }
            | Op::Doubt { at, .. }
            | Op::SetHold { at, .. }
            | Op::ClearHold { at, .. }
            | Op::Freeze { at, .. }
            | Op::Unfreeze { at }
            | Op::Tick { at } => Some(*at),
            Op::Reconfigure { .. } => None,
        }
    }

    /// The target the op is about, if it is about one.
    pub fn target(&self) -> Option<&str> {
        match self {
            Op::Observe { obs, .. } => Some(&obs.target),
            Op::Add { id, .. }
            | Op::Remove { id, .. }
            | Op::Doubt { id, .. }
            | Op::SetHold { id, .. }
            | Op::ClearHold { id, .. } => Some(id),
            Op::Freeze { .. } | Op::Unfreeze { .. } | Op::Tick { .. } | Op::Reconfigure { .. } => {
                None
            }
        }
    }
}

/// What applying an [`Op`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Applied {
    /// The guard's state changed: a driver that logs ops for replay must log this one.
    /// An observation may have produced a decision.
    Changed(Option<Decision>),
    /// Nothing changed that any later call could tell apart (a healthy target passing
    /// again, a quiet tick): replaying the log without this op ends in the same state.
    Unchanged,
    /// The op names a target the guard does not know; nothing changed.
    UnknownTarget,
}

impl Applied {
    /// Whether a driver that logs ops for replay must log this one.
    pub fn changed(&self) -> bool {
        matches!(self, Applied::Changed(_))
    }

    /// The decision an observation produced, if any.
    pub fn into_decision(self) -> Option<Decision> {
        match self {
            Applied::Changed(d) => d,
            Applied::Unchanged | Applied::UnknownTarget => None,
        }
    }
}

impl SafetyGuard {
    /// Applies one op. Observations and ticks take the fast path of
    /// [`SafetyGuard::observe_changed`] and [`SafetyGuard::tick_changed`], so
    /// [`Applied::Unchanged`] may be left out of a replay log. Every other op counts as
    /// a change when its target exists (an `add` of a known target may move its zone;
    /// a `remove` of an unknown one is [`Applied::UnknownTarget`]).
    pub fn apply(&mut self, op: &Op) -> Applied {
        match op {
            Op::Observe { at, obs } => match self.observe_changed(*at, obs) {
                (decision, true) => Applied::Changed(decision),
                (_, false) => Applied::Unchanged,
            },
            Op::Add { at, id, zone } => {
                self.add_target(*at, id, zone);
                Applied::Changed(None)
            }
            Op::Remove { at, id } => known(self.remove_target(*at, id)),
            Op::Doubt { at, id } => match self.doubt(*at, id) {
                Ok(true) => Applied::Changed(None),
                Ok(false) => Applied::Unchanged,
                Err(_) => Applied::UnknownTarget,
            },
            Op::SetHold { at, id, hold } => known(self.set_hold(*at, id, hold.clone()).is_ok()),
            Op::ClearHold { at, id } => known(self.clear_hold(*at, id).is_ok()),
            Op::Freeze { at, reason } => {
                self.freeze(*at, reason);
                Applied::Changed(None)
            }
            Op::Unfreeze { at } => {
                self.unfreeze(*at);
                Applied::Changed(None)
            }
            Op::Tick { at } => {
                if self.tick_changed(*at) {
                    Applied::Changed(None)
                } else {
                    Applied::Unchanged
                }
            }
            Op::Reconfigure { config } => {
                self.reconfigure((**config).clone());
                Applied::Changed(None)
            }
        }
    }
}

fn known(found: bool) -> Applied {
    if found {
        Applied::Changed(None)
    } else {
        Applied::UnknownTarget
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::HoldKind;
    use std::time::Duration;

    fn guard() -> SafetyGuard {
        SafetyGuard::new(GuardConfig {
            grace: Duration::ZERO,
            ..GuardConfig::default()
        })
    }

    /// The ops of a small story: targets added, one failing until acted on, a hold,
    /// a freeze, ticks; passing probes of healthy targets in between.
    fn story() -> Vec<Op> {
        let s = Time::from_secs;
        let mut ops = Vec::new();
        for i in 0..10 {
            ops.push(Op::Add {
                at: s(0),
                id: format!("t{i}"),
                zone: format!("z{}", i % 2),
            });
        }
        for k in 1..40u64 {
            for i in 0..10 {
                let id = format!("t{i}");
                let zone = format!("z{}", i % 2);
                // t7's probers go quiet for a while (in doubt, twice), then one
                // disputes its pass.
                if i == 7 && (20..23).contains(&k) {
                    for _ in 0..2 {
                        ops.push(Op::Doubt {
                            at: s(k),
                            id: id.clone(),
                        });
                    }
                    continue;
                }
                let obs = if i == 3 && k > 5 {
                    Observation::failed_checks(&id, &zone, ["disk:free"])
                } else if i == 7 && (23..25).contains(&k) {
                    Observation::pass(&id, &zone).disputed()
                } else {
                    Observation::pass(&id, &zone)
                };
                ops.push(Op::Observe { at: s(k), obs });
            }
            ops.push(Op::Tick { at: s(k) });
        }
        ops.push(Op::SetHold {
            at: s(41),
            id: "t5".into(),
            hold: Hold {
                kind: HoldKind::Silenced,
                reason: "kept".into(),
                until: Some(s(100)),
            },
        });
        ops.push(Op::Freeze {
            at: s(42),
            reason: "by hand".into(),
        });
        ops.push(Op::Unfreeze { at: s(43) });
        ops.push(Op::Tick { at: s(101) });
        ops.push(Op::Remove {
            at: s(102),
            id: "t9".into(),
        });
        ops
    }

    #[test]
    fn replaying_only_the_changed_ops_rebuilds_the_same_state() {
        let mut live = guard();
        let mut log = Vec::new();
        let mut decisions = 0;
        for op in story() {
            let applied = live.apply(&op);
            if applied.changed() {
                log.push(serde_json::to_string(&op).unwrap());
            }
            decisions += usize::from(applied.into_decision().is_some());
        }
        assert!(decisions >= 1, "the failing target was decided on");
        assert!(
            log.len() < story().len() / 2,
            "passing probes of healthy targets are left out: {} of {}",
            log.len(),
            story().len()
        );
        let mut replayed = guard();
        for line in &log {
            let op: Op = serde_json::from_str(line).unwrap();
            assert!(replayed.apply(&op).changed(), "{line}");
        }
        assert_eq!(
            serde_json::to_value(replayed.state()).unwrap(),
            serde_json::to_value(live.state()).unwrap()
        );
    }

    #[test]
    fn ops_on_unknown_targets_change_nothing() {
        let mut g = guard();
        let before = serde_json::to_value(g.state()).unwrap();
        let at = Time::from_secs(1);
        for op in [
            Op::Remove { at, id: "x".into() },
            Op::Doubt { at, id: "x".into() },
            Op::ClearHold { at, id: "x".into() },
            Op::SetHold {
                at,
                id: "x".into(),
                hold: Hold {
                    kind: HoldKind::Maintenance,
                    reason: "r".into(),
                    until: None,
                },
            },
        ] {
            assert_eq!(g.apply(&op), Applied::UnknownTarget, "{op:?}");
        }
        assert_eq!(serde_json::to_value(g.state()).unwrap(), before);
    }

    #[test]
    fn the_wire_form_is_the_stores_form() {
        // The controller's store holds ops in this form since its first release: a
        // store written then must replay now.
        let op: Op = serde_json::from_str(
            r#"{"op":"set_hold","at":1500000000,"id":"t1","hold":{"kind":"silenced","reason":"r","until":null}}"#,
        )
        .unwrap();
        assert_eq!(op.at(), Some(Time::from_millis(1500)));
        assert_eq!(op.target(), Some("t1"));
        let back = serde_json::to_value(&op).unwrap();
        assert_eq!(back["at"], 1_500_000_000u64);
        assert_eq!(back["op"], "set_hold");
        let tick: Op = serde_json::from_str(r#"{"op":"tick","at":7}"#).unwrap();
        assert_eq!(
            tick,
            Op::Tick {
                at: Time::from_elapsed(Duration::from_nanos(7))
            }
        );
    }
}
