//! A target's standing: the one state it is shown in, and what follows from it.

use crate::HealthState;
use crate::guard::{GuardTargetView, HoldKind};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The state a target is shown in (the API's `state`, the dashboard's tiles, what
/// `vigil deploy` reads back), most severe first: the declaration order is the
/// dashboard's order of attention. On the wire it is its lower-case name
/// (`"unhealthy"`, ...), as it always was.
///
/// Unhealthy comes before reported: a reported target is being dealt with (an action
/// was taken), an unhealthy one is a candidate the guard holds back (frozen, budget,
/// shared cause), which is what an operator must look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Standing {
    /// Failed long enough to be replaced; held back by the guard.
    Unhealthy,
    /// Reported for replacement; waiting for it to recover or go.
    Reported,
    /// Fails on and off: damped, not replaced.
    Flapping,
    /// Its last probe failed; not yet judged.
    Failing,
    /// An operator's hold: never acted on, still counted.
    Silenced,
    /// An operator's hold: never acted on, not counted.
    Maintenance,
    /// No probe answered yet.
    Unknown,
    /// New: not judged during its grace period.
    Grace,
    /// Passes its probes.
    Healthy,
}

impl Standing {
    /// Every standing, most severe first.
    pub const ALL: [Standing; 9] = [
        Standing::Unhealthy,
        Standing::Reported,
        Standing::Flapping,
        Standing::Failing,
        Standing::Silenced,
        Standing::Maintenance,
        Standing::Unknown,
        Standing::Grace,
        Standing::Healthy,
    ];

    /// The standing a target's guard view shows, the most important first: an
    /// operator's hold, then grace, no answer yet, reported, flapping, unhealthy,
    /// a failed last probe, healthy.
    pub fn of(v: &GuardTargetView<'_>) -> Standing {
        match v.hold {
            Some(h) if h.kind == HoldKind::Maintenance => return Standing::Maintenance,
            Some(_) => return Standing::Silenced,
            None => {}
        }
        if v.in_grace {
            Standing::Grace
        } else if v.last_ok.is_none() {
            Standing::Unknown
        } else if v.reported_at.is_some() {
            Standing::Reported
        } else if v.flapping {
            Standing::Flapping
        } else if v.health == HealthState::Unhealthy {
            Standing::Unhealthy
        } else if v.last_ok == Some(false) {
            Standing::Failing
        } else {
            Standing::Healthy
        }
    }

    /// Its name, as on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Standing::Unhealthy => "unhealthy",
            Standing::Reported => "reported",
            Standing::Flapping => "flapping",
            Standing::Failing => "failing",
            Standing::Silenced => "silenced",
            Standing::Maintenance => "maintenance",
            Standing::Unknown => "unknown",
            Standing::Grace => "grace",
            Standing::Healthy => "healthy",
        }
    }

    /// The standing named `name`, if it is one.
    pub fn from_name(name: &str) -> Option<Standing> {
        Standing::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Its rank in [`Standing::ALL`] (0 most severe).
    pub fn severity(self) -> usize {
        self as usize
    }

    /// What it means, in a few words (the dashboard's legend).
    pub fn meaning(self) -> &'static str {
        match self {
            Standing::Unhealthy => "failed long enough to be replaced; held back by the guard",
            Standing::Reported => "reported for replacement; waiting for it to recover or go",
            Standing::Flapping => "fails on and off: damped, not replaced",
            Standing::Failing => "its last probe failed; not yet judged",
            Standing::Silenced => "an operator's hold: never acted on, still counted",
            Standing::Maintenance => "an operator's hold: never acted on, not counted",
            Standing::Unknown => "no probe answered yet",
            Standing::Grace => "new: not judged during its grace period",
            Standing::Healthy => "passes its probes",
        }
    }

    /// Shown among the targets that need an operator's eye (else with the calm ones).
    pub fn needs_attention(self) -> bool {
        self <= Standing::Maintenance
    }

    /// Whether a rollout counts the target as held: out of service for the floor and
    /// never touched by a wave. Unhealthy, reported and flapping are the guard's
    /// judgements; silenced and maintenance are an operator's holds. Failing (one
    /// failed probe, not yet judged) is not: the deployer's own probe sees the same
    /// host, and a host restarted by its own wave fails a probe or two.
    pub fn is_held(self) -> bool {
        matches!(
            self,
            Standing::Unhealthy
                | Standing::Reported
                | Standing::Flapping
                | Standing::Silenced
                | Standing::Maintenance
        )
    }
}

impl fmt::Display for Standing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_standing_has_one_rank_and_attention_standings_come_first() {
        for (i, s) in Standing::ALL.iter().enumerate() {
            assert_eq!(s.severity(), i, "{s} ranked once");
            assert_eq!(Standing::from_name(s.name()), Some(*s), "{s} named once");
        }
        let first_calm = Standing::ALL
            .iter()
            .position(|s| !s.needs_attention())
            .unwrap();
        assert!(
            Standing::ALL[first_calm..]
                .iter()
                .all(|s| !s.needs_attention()),
            "the standings needing attention are the most severe ones"
        );
        assert_eq!(Standing::from_name("no such state"), None);
    }

    #[test]
    fn the_wire_names_are_the_lower_case_names_and_held_is_the_deployers_five() {
        for s in Standing::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.name());
            let back: Standing = serde_json::from_value(s.name().into()).unwrap();
            assert_eq!(back, s);
        }
        let held: Vec<&str> = Standing::ALL
            .into_iter()
            .filter(|s| s.is_held())
            .map(Standing::name)
            .collect();
        assert_eq!(
            held,
            [
                "unhealthy",
                "reported",
                "flapping",
                "silenced",
                "maintenance"
            ]
        );
    }
}
