//! The fleet engine: the controller's composition of the policies (guard, peer
//! comparison, probers' agreement), sans-IO, so that `vigil controller` and `vigil sim`
//! drive one engine instead of two compositions.
//!
//! ## Why here
//!
//! The engine composes vigil-core's own policies ([`crate::guard`], [`crate::anomaly`],
//! [`crate::shard`]) and nothing else: it needs no dependency vigil-core lacks, and
//! the store, the prober and the actuators it talks to are the drivers' (tokio, SQL,
//! HTTP). A `vigil-engine` crate would hold one module and depend on vigil-core alone;
//! as a module it sits beside the policies it composes, under the same rule (time is
//! passed in, nothing reads a clock), and the `clippy.toml` ban on `Instant` covers it.
//!
//! ## Status of the move (issue 32)
//!
//! Here now: the replica's [`Mode`]; a target's displayed [`Standing`]; the pieces of
//! the composition both drivers call ([`peer_check`] and [`judge_peers`], the probers'
//! agreement as [`Judged`], the [`Dissent`] rule, [`DecisionKind`]: which decisions are
//! recorded, counted by kind); the judging [`step`]: a probe result, the probers'
//! verdict, a tick or an operator's command in, [`Effect`]s out (the op to log, the
//! decision, the guard's events, or a typed [`Refusal`]); and the [`Replica`] around
//! it: the guard with its mode, its standings and the batch not yet committed
//! ([`Uncommitted`]), what a commit's outcome ([`Commit`]), a store read
//! ([`Replica::restore`]), a new term or its end do to them, and recovery
//! ([`Replica::rebuild`]). The controller's live path, its crash recovery, its
//! failing-store path and the simulator all drive the replica.
//!
//! Still in the controller's `engine.rs` (its tokio loop): merging the target lists of
//! its sources into membership ops, the snapshot policy's timers, the probers' shared
//! results (`probing.rs`), and the view it publishes.

//! ## Inputs
//!
//! Everything that happens to a controller, each stamped with the engine's time:
//!
//! | input | from | today in `engine.rs` |
//! |---|---|---|
//! | probe result (`Observation` + what the API shows) | the prober | `Command::Probe` |
//! | heartbeat (a queue worker's counters with its health) | the heartbeat listener | `Command::Probe { worker: Some(_) }` |
//! | probers' results (sharded probing) | the store, read back by the report | `Engine::report` |
//! | target list, per source (config, file, Auto Scaling) | discovery | `Command::Targets` |
//! | operator command (hold, clear, freeze, unfreeze) | the API | `Command::SetHold` ... |
//! | reconfiguration | `SIGHUP` | `Command::Reconfigure` |
//! | tick | a timer, once a second | `tick` in `Engine::run` |
//! | leadership change (a term with its epoch, or none) | the lease task | `Engine::leadership_changed` |
//! | commit result (actions created / failed / fenced) | the store thread | `Engine::flush` |
//! | store read (the committed state, to undo or to follow) | the store thread | `Engine::reload` |
//!
//! ## Effects
//!
//! What the driver does on the engine's behalf, in this order within a turn:
//!
//! 1. **commit** one batch (guard ops, decisions with their actions, state transitions,
//!    a snapshot), fenced by the mode's epoch;
//! 2. once committed, **run** its actions and **answer** its operator commands
//!    (refusals are answered at once, with a typed reason, never a parsed string);
//! 3. **read** the store (undo a failed commit, follow the leader, a new term);
//! 4. **publish** a view of the fleet, and the probing **plan** (targets, settings);
//! 5. **report** this replica's probe results (sharded probing).
//!
//! ## Mode
//!
//! One [`Mode`] instead of six flags (`failing`, `dirty`, `recovering`, `following`,
//! `term`, `targets_pending`) and a string prefix: leading with its epoch, following
//! (who leads), store failing (with whether the guard is ahead of the store), or
//! recovering (a retry is in the batch). Only [`Mode::judges`] lets a probe reach the
//! guard; the others say why not in [`Mode::halted`].

pub mod cohort;
mod compose;
mod mode;
mod replica;
mod standing;
mod step;
mod trace;

pub use cohort::{GateReport, PausedMember, SharedPause, shared_pauses};
pub use compose::{
    DEFAULT_DISSENT_MIN, DEFAULT_DISSENT_SHARE, DecisionKind, Dissent, DissentChange,
    DissentConfig, DissentRound, DissentTally, Judged, judge_peers, peer_check, tally_dissent,
};
pub use mode::Mode;
pub use replica::{
    AfterCommit, Commit, RebuildError, Rebuilt, Replica, Stored, Transition, Turn, Uncommitted,
    describe,
};
pub use standing::Standing;
pub use step::{Effect, Input, Refusal, step};
pub use trace::{Call, Divergence, Trace};
