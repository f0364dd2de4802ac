//! `vigil deploy`: drives the rollout policy (`vigil_core::rollout`) against real hosts.
//!
//! The policy decides everything (waves, the floor, report-back deadlines, bake,
//! verdict, rollback, the bad-revision latch) and explains every decision; this module
//! only does the I/O around it:
//!
//! - [`config`]: `deploy.toml` (hosts, the policy's keys, install and drain hooks, the
//!   store), loaded with file:line:key errors.
//! - [`hooks`]: install (exec or signed webhook, through the controller's actuator
//!   code), drain and undrain (exec or an HTTP call), alerts. Its module doc states the
//!   contract an install hook must keep with the idempotency key.
//! - [`driver`]: the loop. Each round it applies what humans asked (abort, approve,
//!   clear a bad revision), runs the steps still intended, polls the policy and runs
//!   what it commands, then probes every host (the controller's prober, vigil-core's
//!   one judge) and feeds the policy each host's reported revision (`releaseId`, else
//!   `version`), health and an error-rate sample.
//! - [`balancer`]: what clients got from each host, as the `vigil lb`s in front of the
//!   hosts counted it (`[lb] admin`): the verdict's evidence when configured.
//! - [`controller`]: the controller's view (`GET /api/targets`): hosts it holds or
//!   judges unhealthy count as held; unreadable, no new wave starts (fail closed); it
//!   can list the hosts too.
//! - [`cli`]: `vigil deploy plan|run|status|abort|approve|clear-bad|explain|check-config`.
//!
//! # Crash safety
//!
//! The policy's whole state lives in the controller's store (`rollouts`, see
//! [`crate::store`]), saved after every step. A command taken from the policy is
//! written as an intent (`rollout_steps`) in the same transaction as the state that no
//! longer holds it, before its hook runs, and marked done in the same transaction as the
//! state that took its result. So a deployer killed at any moment and started again
//! (`vigil deploy run`) reloads the state, runs the intended steps again (an install with
//! the same idempotency key, which the hook deduplicates), and goes on: no host is
//! skipped, none is installed twice for one revision. Only one driver runs per
//! deployment: `run` holds an exclusive `flock` on a file beside the store, which the
//! kernel releases when the process dies.
//!
//! The policy's clock is the wall clock (UNIX time), never restarted below the last
//! saved value: a progress deadline or a bake counts the time the deployer was down.

pub mod balancer;
pub mod cli;
pub mod config;
pub mod controller;
pub mod driver;
pub mod hooks;
