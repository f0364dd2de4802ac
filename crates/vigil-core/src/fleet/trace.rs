//! A replica's calls, recorded with what each returned, and replayed.
//!
//! Both drivers ([`vigil controller`'s engine and `vigil sim`) change a [`Replica`]
//! only through its methods. A [`Trace`] records every such call from the moment
//! [`Replica::start_trace`] is called (the replica as it was then, the input of each
//! call and its output), and [`Trace::replay`] makes the same calls on a copy of that
//! starting replica and compares each output with the recorded one. A trace that
//! replays proves that what the driver got (the decisions, the batches it committed,
//! the undo after a failed commit) is a function of the calls alone: no state of the
//! driver's own leaked into the judgement. The drivers' tests record a run (the
//! controller's live loop over a real store, failing and recovering; the simulator
//! through crashes and a failover) and replay it.
//!
//! Recording costs nothing until it is started (one `Option` check per call); a
//! recorded call clones its input and output.
//!
//! [`vigil controller`'s engine]: Replica

use super::replica::{AfterCommit, Commit, Replica, Stored, Turn, Uncommitted};
use super::step::Input;
use crate::anomaly::AnomalyState;
use crate::guard::Op;
use crate::time::Time;

/// One call on a [`Replica`], with what it returned.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    /// [`Replica::step`].
    Step {
        /// Its time.
        now: Time,
        /// Its input.
        input: Input,
        /// What it returned.
        turn: Turn,
    },
    /// [`Replica::apply`].
    Apply {
        /// Its time.
        now: Time,
        /// The op.
        op: Op,
        /// The target it named.
        target: Option<String>,
        /// What it returned: the turn, and whether the op found its target.
        out: (Turn, bool),
    },
    /// [`Replica::start_bulk`].
    StartBulk,
    /// [`Replica::end_bulk`].
    EndBulk {
        /// Its time.
        at: Time,
        /// The workers' comparison it snapshotted.
        anomaly: Option<AnomalyState>,
    },
    /// [`Replica::snapshot`].
    Snapshot {
        /// Its time.
        at: Time,
        /// The workers' comparison it snapshotted.
        anomaly: Option<AnomalyState>,
    },
    /// [`Replica::take`], with the batch it returned.
    Take(Option<Uncommitted>),
    /// [`Replica::committed`].
    Committed {
        /// The commit's outcome.
        outcome: Commit,
        /// What it returned.
        after: AfterCommit,
    },
    /// [`Replica::restore`].
    Restore {
        /// What the store held.
        stored: Stored,
        /// Its time.
        now: Time,
        /// What it returned (the error as text).
        out: Result<usize, String>,
    },
    /// [`Replica::retry`], with what it returned.
    Retry(bool),
    /// [`Replica::lead`].
    Lead {
        /// The term's epoch.
        epoch: Option<i64>,
        /// Why nothing is judged until the store is read.
        why: String,
    },
    /// [`Replica::follow`].
    Follow {
        /// Who leads.
        leader: String,
    },
}

impl Call {
    /// The call's name, for a divergence's message.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Step { .. } => "step",
            Call::Apply { .. } => "apply",
            Call::StartBulk => "start_bulk",
            Call::EndBulk { .. } => "end_bulk",
            Call::Snapshot { .. } => "snapshot",
            Call::Take(_) => "take",
            Call::Committed { .. } => "committed",
            Call::Restore { .. } => "restore",
            Call::Retry(_) => "retry",
            Call::Lead { .. } => "lead",
            Call::Follow { .. } => "follow",
        }
    }
}

/// A replica as it was when recording started, and every call on it since.
#[derive(Clone, Debug)]
pub struct Trace {
    pub(super) start: Box<Replica>,
    pub(super) calls: Vec<Call>,
}

/// A replayed call returned something other than the recorded one.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("call {index} ({name}) diverged: recorded {recorded}, replayed {replayed}")]
pub struct Divergence {
    /// Its position in the trace (from 0).
    pub index: usize,
    /// Which call.
    pub name: &'static str,
    /// What it returned when recorded (`Debug`).
    pub recorded: String,
    /// What it returned on replay (`Debug`).
    pub replayed: String,
}

impl Trace {
    /// The calls, in order.
    pub fn calls(&self) -> &[Call] {
        &self.calls
    }

    /// Makes every call again on a copy of the starting replica, comparing each output
    /// with the recorded one. Returns the replica as the calls left it (its mode and
    /// guard are the recorded replica's, if nothing diverged) or the first divergence.
    pub fn replay(&self) -> Result<Replica, Divergence> {
        let mut r = (*self.start).clone();
        for (index, call) in self.calls.iter().enumerate() {
            let diverged =
                |recorded: &dyn std::fmt::Debug, replayed: &dyn std::fmt::Debug| Divergence {
                    index,
                    name: call.name(),
                    recorded: format!("{recorded:?}"),
                    replayed: format!("{replayed:?}"),
                };
            match call {
                Call::Step { now, input, turn } => {
                    let got = r.step(*now, input.clone());
                    if got != *turn {
                        return Err(diverged(turn, &got));
                    }
                }
                Call::Apply {
                    now,
                    op,
                    target,
                    out,
                } => {
                    let got = r.apply(*now, op.clone(), target.as_deref());
                    if got != *out {
                        return Err(diverged(out, &got));
                    }
                }
                Call::StartBulk => r.start_bulk(),
                Call::EndBulk { at, anomaly } => r.end_bulk(*at, anomaly.as_ref()),
                Call::Snapshot { at, anomaly } => r.snapshot(*at, anomaly.as_ref()),
                Call::Take(batch) => {
                    let got = r.take();
                    if got != *batch {
                        return Err(diverged(batch, &got));
                    }
                }
                Call::Committed { outcome, after } => {
                    let got = r.committed(outcome.clone());
                    if got != *after {
                        return Err(diverged(after, &got));
                    }
                }
                Call::Restore { stored, now, out } => {
                    let got = r.restore(stored, *now).map_err(|e| e.to_string());
                    if got != *out {
                        return Err(diverged(out, &got));
                    }
                }
                Call::Retry(out) => {
                    let got = r.retry();
                    if got != *out {
                        return Err(diverged(out, &got));
                    }
                }
                Call::Lead { epoch, why } => r.lead(*epoch, why.clone()),
                Call::Follow { leader } => r.follow(leader.clone()),
            }
        }
        Ok(r)
    }
}
