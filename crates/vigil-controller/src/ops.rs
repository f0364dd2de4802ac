//! Guard ops: every call the controller makes on the guard, as a serialisable record.
//!
//! The store appends each op to its log and replays the log after the last snapshot on
//! restart. The guard is deterministic, so the replay rebuilds the state exactly.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use vigil_core::Time;
use vigil_core::guard::{Decision, GuardConfig, Hold, Observation, SafetyGuard};

/// One call on the guard. `at` is the guard time in nanoseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum GuardOp {
    /// [`SafetyGuard::observe`].
    Observe {
        /// When.
        at: u64,
        /// What.
        obs: Observation,
    },
    /// [`SafetyGuard::add_target`].
    Add {
        /// When.
        at: u64,
        /// Target id.
        id: String,
        /// Zone.
        zone: String,
    },
    /// [`SafetyGuard::remove_target`].
    Remove {
        /// When.
        at: u64,
        /// Target id.
        id: String,
    },
    /// [`SafetyGuard::set_hold`].
    SetHold {
        /// When.
        at: u64,
        /// Target id.
        id: String,
        /// The hold.
        hold: Hold,
    },
    /// [`SafetyGuard::clear_hold`].
    ClearHold {
        /// When.
        at: u64,
        /// Target id.
        id: String,
    },
    /// [`SafetyGuard::freeze`].
    Freeze {
        /// When.
        at: u64,
        /// Why.
        reason: String,
    },
    /// [`SafetyGuard::unfreeze`].
    Unfreeze {
        /// When.
        at: u64,
    },
    /// [`SafetyGuard::tick`].
    Tick {
        /// When.
        at: u64,
    },
    /// [`SafetyGuard::reconfigure`].
    Reconfigure {
        /// The new config.
        config: Box<GuardConfig>,
    },
}

/// `Time` as the integer nanoseconds ops carry.
pub fn nanos(t: Time) -> u64 {
    u64::try_from(t.as_elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The `Time` of an op's integer nanoseconds.
pub fn time(n: u64) -> Time {
    Time::from_elapsed(Duration::from_nanos(n))
}

impl GuardOp {
    /// When the op was made (None for a reconfiguration).
    pub fn at(&self) -> Option<Time> {
        match self {
            GuardOp::Observe { at, .. }
            | GuardOp::Add { at, .. }
            | GuardOp::Remove { at, .. }
            | GuardOp::SetHold { at, .. }
            | GuardOp::ClearHold { at, .. }
            | GuardOp::Freeze { at, .. }
            | GuardOp::Unfreeze { at }
            | GuardOp::Tick { at } => Some(time(*at)),
            GuardOp::Reconfigure { .. } => None,
        }
    }

    /// Applies the op. Returns the decision an observation produced, and whether a hold
    /// op found its target (false: unknown target, nothing changed).
    pub fn apply(&self, g: &mut SafetyGuard) -> (Option<Decision>, bool) {
        match self {
            GuardOp::Observe { at, obs } => (g.observe(time(*at), obs), true),
            GuardOp::Add { at, id, zone } => {
                g.add_target(time(*at), id, zone);
                (None, true)
            }
            GuardOp::Remove { at, id } => (None, g.remove_target(time(*at), id)),
            GuardOp::SetHold { at, id, hold } => {
                (None, g.set_hold(time(*at), id, hold.clone()).is_ok())
            }
            GuardOp::ClearHold { at, id } => (None, g.clear_hold(time(*at), id).is_ok()),
            GuardOp::Freeze { at, reason } => {
                g.freeze(time(*at), reason);
                (None, true)
            }
            GuardOp::Unfreeze { at } => {
                g.unfreeze(time(*at));
                (None, true)
            }
            GuardOp::Tick { at } => {
                g.tick(time(*at));
                (None, true)
            }
            GuardOp::Reconfigure { config } => {
                g.reconfigure((**config).clone());
                (None, true)
            }
        }
    }
}
