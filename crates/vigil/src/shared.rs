//! The checker state shared by the handle, the background checker, the watchdog and the
//! endpoints: the registry, the latest result of every check, the lifecycle and the
//! watchdog's view, and the one place that turns them into a published [`Snapshot`].
//!
//! It sits below all of its users (none of them imports another through it), so the
//! checker, the watchdog and the endpoints depend on this module and not on each other's
//! owner ([`crate::health`]). See `health`'s docs for the locking and publishing design.

use crate::check::DynCheck;
use crate::options::{CheckOptions, HealthConfig};
use crate::snapshot::{LIFECYCLE_CHECK, Lifecycle, STALLED, Snapshot, WATCHDOG_CHECK};
use crate::snapshot::{stalled_result, summarize};
use arc_swap::ArcSwap;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::sync::{Notify, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use vigil_core::{CheckResult, Criticality, HealthReport, Status};

/// Which reports a check counts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CheckKind {
    /// The host itself can do work (disk, file descriptors, memory, saturation): counts
    /// for `/readyz` and `/health`.
    Local,
    /// A database or downstream service: counts for `/health` only, so a dependency
    /// outage never takes every instance out of a load balancer at once.
    Dependency,
}

/// A fault to inject into the background checker, for tests and chaos drills: the
/// watchdog must notice it, fail readiness with "health checker stalled", and restart
/// the checker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckerFault {
    /// The checker panics at its next wake-up.
    Panic,
    /// The checker stops making progress (awaits forever) at its next wake-up.
    Hang,
    /// The checker task is aborted now, as if killed.
    Abort,
    /// The checker stops making progress for this long, then resumes by itself (a
    /// starved runtime): the stall is reported, but the checker is not restarted if it
    /// resumes within the restart backoff.
    Pause(Duration),
}

pub(crate) struct Registered {
    pub name: String,
    pub kind: CheckKind,
    pub opts: CheckOptions,
    pub check: Arc<dyn DynCheck>,
}

impl Registered {
    pub fn gates_startup(&self) -> bool {
        self.opts
            .gates_startup
            .unwrap_or(self.kind == CheckKind::Local)
    }
}

/// Mutable state behind [`Shared::state`].
pub(crate) struct State {
    /// Latest result per check, by registry index (None: not run yet).
    pub results: Vec<Option<CheckResult>>,
    /// Whether each check has passed (not failed, weighted) at least once.
    pub passed_once: Vec<bool>,
    pub lifecycle: Lifecycle,
    /// Set by the watchdog when the checker is stalled, cleared by the checker's beat.
    pub stalled: Option<String>,
    pub restarts: u64,
    pub last_restart_reason: Option<String>,
    /// The checker's last sign of life.
    pub last_beat: Instant,
    pub sequence: u64,
}

pub(crate) struct Shared {
    pub checks: Vec<Registered>,
    pub config: HealthConfig,
    pub version: Option<String>,
    pub release_id: Option<String>,
    pub description: Option<String>,
    pub current: ArcSwap<Snapshot>,
    pub tx: watch::Sender<Arc<Snapshot>>,
    pub state: Mutex<State>,
    /// Stops the checker and watchdog when the last `Health` handle is dropped.
    pub stop: watch::Sender<bool>,
    pub fault: Mutex<Option<CheckerFault>>,
    pub fault_notify: Notify,
    pub checker_abort: Mutex<Option<AbortHandle>>,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock can only come from a bug in vigil's own short
        // critical sections; the state stays consistent, so recover rather than poison
        // every endpoint.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Builds and publishes a snapshot of `st`. Call with the state lock held.
    pub fn publish(&self, st: &mut State) {
        st.sequence += 1;
        let snap = Arc::new(self.build(st));
        self.current.store(snap.clone());
        self.tx.send_replace(snap);
    }

    /// The checker's heartbeat: proof of life, clears a stall, publishes.
    pub fn beat(&self, st: &mut State) {
        st.last_beat = Instant::now();
        if st.stalled.take().is_some() {
            tracing::info!(restarts = st.restarts, "health checker recovered");
        }
        self.advance_lifecycle(st);
        self.publish(st);
    }

    /// Records a check's result; moves Starting to Running when every start-up gate has
    /// passed once.
    pub fn record(&self, st: &mut State, i: usize, result: CheckResult) {
        let reg = &self.checks[i];
        let prev = st.results[i].as_ref().map(|r| r.status);
        if prev != Some(result.status) {
            let output = result.output.as_deref().unwrap_or("");
            match prev {
                Some(p) => {
                    tracing::info!(check = %reg.name, from = %p, to = %result.status, output, "check changed")
                }
                None => {
                    tracing::info!(check = %reg.name, status = %result.status, output, "check first result")
                }
            }
        }
        if result.status.weighted(reg.opts.criticality) != Status::Fail {
            st.passed_once[i] = true;
        }
        st.results[i] = Some(result);
        self.advance_lifecycle(st);
    }

    /// Starting becomes Running once every start-up gate has passed once (at the
    /// checker's first beat when there is no gate at all).
    fn advance_lifecycle(&self, st: &mut State) {
        if st.lifecycle == Lifecycle::Starting && self.startup_waiting(st).is_empty() {
            st.lifecycle = Lifecycle::Running;
            tracing::info!("start-up checks passed: ready");
        }
    }

    /// Names of the start-up gates that have not passed once.
    fn startup_waiting(&self, st: &State) -> Vec<&str> {
        self.checks
            .iter()
            .enumerate()
            .filter(|(i, r)| r.gates_startup() && !st.passed_once[*i])
            .map(|(_, r)| r.name.as_str())
            .collect()
    }

    fn build(&self, st: &State) -> Snapshot {
        let mut ready = Vec::new();
        let mut full = Vec::new();
        let mut criticality = BTreeMap::new();
        for (i, reg) in self.checks.iter().enumerate() {
            let result = st.results[i].clone().unwrap_or_else(|| {
                CheckResult::fail("not checked yet").with_component_type(reg.check.component_type())
            });
            criticality.insert(reg.name.clone(), reg.opts.criticality);
            if reg.kind == CheckKind::Local {
                ready.push((reg.name.clone(), result.clone(), reg.opts.criticality));
            }
            full.push((reg.name.clone(), result, reg.opts.criticality));
        }
        let watchdog = match &st.stalled {
            Some(why) => stalled_result(st.restarts, why),
            None => {
                let r = CheckResult::new(Status::Pass)
                    .with_observed(st.restarts, "restarts")
                    .with_component_type("component");
                match &st.last_restart_reason {
                    Some(why) => r.with_output(format!(
                        "checker restarted {} time(s), last because: {why}",
                        st.restarts
                    )),
                    None => r,
                }
            }
        };
        criticality.insert(WATCHDOG_CHECK.into(), Criticality::Critical);
        ready.push((
            WATCHDOG_CHECK.into(),
            watchdog.clone(),
            Criticality::Critical,
        ));
        full.push((WATCHDOG_CHECK.into(), watchdog, Criticality::Critical));

        let lifecycle = match st.lifecycle {
            Lifecycle::Starting => {
                let waiting = self.startup_waiting(st);
                CheckResult::fail(format!(
                    "starting: waiting for {} to pass once",
                    waiting.join(", ")
                ))
            }
            Lifecycle::Running => CheckResult::new(Status::Pass),
            Lifecycle::ShuttingDown => CheckResult::fail("shutting down"),
        }
        .with_observed(st.lifecycle.as_str(), "state")
        .with_component_type("component");
        criticality.insert(LIFECYCLE_CHECK.into(), Criticality::Critical);
        ready.push((LIFECYCLE_CHECK.into(), lifecycle, Criticality::Critical));

        let finish = |results: Vec<(String, CheckResult, Criticality)>| {
            let mut r = HealthReport::from_results(results);
            r.version = self.version.clone();
            r.release_id = self.release_id.clone();
            r.description = self.description.clone();
            r.output = if st.stalled.is_some() {
                Some(STALLED.into())
            } else {
                summarize(&r)
            };
            r
        };
        let mut ready = finish(ready);
        if st.stalled.is_none() && st.lifecycle != Lifecycle::Running {
            ready.output = Some(st.lifecycle.as_str().into());
        }
        Snapshot {
            ready,
            full: finish(full),
            lifecycle: st.lifecycle,
            criticality,
            published_at: SystemTime::now(),
            published_mono: std::time::Instant::now(),
            sequence: st.sequence,
            restarts: st.restarts,
            stale_after: self.config.stale_after,
        }
    }
}
