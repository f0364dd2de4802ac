//! What a controller replica may do now: lead, follow, or wait for its store.

use std::fmt;

/// What a controller replica may do now.
///
/// ```text
/// Leading      --commit failed------------------>  StoreFailing { dirty }
/// StoreFailing --retry due, guard as committed--->  Recovering
/// Recovering   --commit ok----------------------->  Leading
/// Recovering   --commit failed------------------->  StoreFailing
/// any          --commit fenced, or term ended---->  Following
/// Following    --a term of its own--------------->  Recovering (or StoreFailing { dirty })
/// ```
///
/// Only [`Mode::judges`] lets an observation reach the guard. In every other mode
/// target list and config changes wait, and are applied with the first batch that
/// can be committed (the retry's snapshot, or a new term's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Judges and commits. `epoch`: the lease term its batches are fenced with, which
    /// the store refuses once another replica took over (None: a lone controller,
    /// unfenced).
    Leading {
        /// The lease term (None: a lone controller).
        epoch: Option<i64>,
    },
    /// Another replica leads, or none does: this one shows what the leader committed
    /// and decides nothing; a mutation is refused as not the leader's to take.
    Following {
        /// Who leads, in words (or why this replica's term ended).
        leader: String,
    },
    /// Leads, but its last commit failed, so that batch never happened: nothing is
    /// judged, operator commands are refused (one in force but lost at a restart is
    /// worse than one refused), the store is tried again now and then.
    StoreFailing {
        /// The lease term, kept for the retry (None: a lone controller).
        epoch: Option<i64>,
        /// The store's error, as shown (readiness, dashboard, refusals).
        error: String,
        /// The guard is ahead of the store: the failed batch could not be undone
        /// (the store could not be read either), so it is rebuilt from the store
        /// before anything is written again.
        dirty: bool,
    },
    /// A retry of the failing store (a snapshot of the committed state, after the
    /// changes that waited) is in the batch being committed: judging is open again,
    /// and the commit's outcome ends this mode (leading, or failing again; a failed
    /// retry is not news and is not logged again).
    Recovering {
        /// The lease term (None: a lone controller).
        epoch: Option<i64>,
    },
}

impl Mode {
    /// A lone controller: it leads from the start, unfenced.
    pub const ALONE: Mode = Mode::Leading { epoch: None };

    /// The term this replica holds (its batches' fence): None while following, and
    /// always for a lone controller.
    pub fn epoch(&self) -> Option<i64> {
        match self {
            Mode::Leading { epoch }
            | Mode::StoreFailing { epoch, .. }
            | Mode::Recovering { epoch } => *epoch,
            Mode::Following { .. } => None,
        }
    }

    /// Whether observations are judged (fed to the guard) and commands applied.
    pub fn judges(&self) -> bool {
        matches!(self, Mode::Leading { .. } | Mode::Recovering { .. })
    }

    /// Whether another replica leads (this one decides nothing of its own).
    pub fn follows(&self) -> bool {
        matches!(self, Mode::Following { .. })
    }

    /// Whether the store is being retried in the current batch.
    pub fn recovering(&self) -> bool {
        matches!(self, Mode::Recovering { .. })
    }

    /// Whether the guard is ahead of the store and must be rebuilt from it before the
    /// store is written again.
    pub fn dirty(&self) -> bool {
        matches!(self, Mode::StoreFailing { dirty: true, .. })
    }

    /// Why nothing is judged now, in words (readiness, the dashboard's banner), or
    /// None while this replica judges.
    pub fn halted(&self) -> Option<String> {
        match self {
            Mode::Leading { .. } | Mode::Recovering { .. } => None,
            Mode::Following { .. } | Mode::StoreFailing { .. } => Some(self.to_string()),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Leading { epoch: None } => f.write_str("leading"),
            Mode::Leading { epoch: Some(e) } => write!(f, "leading (epoch {e})"),
            Mode::Following { leader } => write!(f, "not the leader: {leader}"),
            Mode::StoreFailing { error, .. } => f.write_str(error),
            Mode::Recovering { .. } => f.write_str("retrying the store"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_leader_or_a_retry_judges_and_the_others_say_why_not() {
        let following = Mode::Following {
            leader: "replica b leads (epoch 4)".into(),
        };
        let failing = Mode::StoreFailing {
            epoch: Some(3),
            error: "disk full".into(),
            dirty: true,
        };
        assert!(Mode::ALONE.judges() && Mode::Recovering { epoch: Some(3) }.judges());
        assert!(!following.judges() && !failing.judges());
        assert_eq!(
            following.halted().as_deref(),
            Some("not the leader: replica b leads (epoch 4)")
        );
        assert_eq!(failing.halted().as_deref(), Some("disk full"));
        assert_eq!(Mode::Recovering { epoch: None }.halted(), None);
        assert_eq!(failing.epoch(), Some(3), "a failing leader keeps its term");
        assert_eq!(following.epoch(), None, "a follower has no term");
        assert!(failing.dirty() && !Mode::ALONE.dirty());
    }
}
