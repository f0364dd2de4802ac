//! The worker gate: may this queue worker pull work now, and where does a failed message go?
//!
//! A queue worker has no load balancer to take it out of service. When its host is sick
//! (disk full, no file descriptors) it keeps pulling and failing messages, and because it
//! fails fast it pulls *more* than its healthy peers: prefetch credit, long polling and
//! least-loaded dispatch all reward fast failure (the SRE book's "sinkholing"). The
//! [`WorkerGate`] is the local half of vigil's answer (the other half, comparing workers
//! with their peers, is [`anomaly`](crate::anomaly) in the controller). It is sans-IO: the
//! library's broker adapters feed it local readiness and message outcomes with the time,
//! and ask it whether to pull; the simulator drives the same type.
//!
//! # The rules
//!
//! 1. **Readiness gates pulling.** The worker pulls only while its local readiness (the
//!    library's `/readyz` checks: disk, fds, memory, watchdog) passes. It stops at the
//!    first failed readiness check (`readiness.unhealthy_threshold`, default 1: with
//!    checks every interval, the worker stops within one interval of the failure, inside
//!    the two intervals promised) and resumes after `readiness.healthy_threshold` passes
//!    in a row (default 2), so a check that fails every other time keeps it stopped.
//! 2. **The kill switch** (after MassTransit's): a worker that fails too many messages
//!    pauses itself even when its checks pass (a black hole: broken in a way no local
//!    check sees). It trips when, over `kill_switch.window` (default 1 minute), it handled
//!    at least `kill_switch.min_messages` (100) and failed more than
//!    `kill_switch.trip_rate` (10%) of them; it then pauses for `kill_switch.restart_after`
//!    (60 s). After the pause it pulls again *on probation*: the first
//!    `kill_switch.probe_messages` (10) decide; failing more than the trip rate of them
//!    trips it again for twice the previous pause (up to `kill_switch.max_pause`, 10
//!    minutes). The pause length goes back to `restart_after` only after the switch has
//!    stayed closed for `max_pause`: a fault with a 50% duty cycle makes the worker pause
//!    for longer and longer, never toggle every interval.
//! 3. **Poison is not sickness.** A message that failed is sent back to the queue stamped
//!    with the worker's id; once it has failed on `poison_workers` (default 2) different
//!    workers it is dead-lettered: the message is the problem. Failures concentrated on
//!    one worker are that worker's problem, which rules 1-2 and the controller handle.
//!    A message a worker held while paused goes back unstamped: it never ran.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use vigil_core::Time;
//! use vigil_core::gate::{Disposition, GateConfig, WorkerGate};
//!
//! let mut gate = WorkerGate::new(GateConfig::default(), Time::ZERO);
//! assert!(gate.may_pull());
//! // Its disk fills: the next readiness check fails and it stops pulling.
//! gate.observe_readiness(Time::from_secs(5), Err("disk:free 0.1% free".into()));
//! assert!(!gate.may_pull());
//! assert!(gate.to_string().contains("disk:free"), "{gate}");
//! // A message it was processing failed meanwhile: back to the queue, not its fault.
//! assert_eq!(gate.on_failure("w1", &[]), Disposition::Requeue { stamp: false });
//! ```

use crate::invalid::Invalid;
use crate::thresholds::{HealthState, Thresholds, ThresholdsConfig};
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

/// Default kill-switch window: 1 minute (MassTransit's tracking period).
pub const DEFAULT_KILL_WINDOW: Duration = Duration::from_secs(60);
/// Default messages in the window before the kill switch may trip: 100, so that a few
/// early failures of a fresh worker are not a rate.
pub const DEFAULT_KILL_MIN_MESSAGES: u64 = 100;
/// Default failure rate above which the kill switch trips: 10%.
pub const DEFAULT_KILL_TRIP_RATE: f64 = 0.10;
/// Default first pause: 60 s (MassTransit's restart timeout).
pub const DEFAULT_KILL_RESTART_AFTER: Duration = Duration::from_secs(60);
/// Default longest pause, and the calm time after which the pause length resets: 10 min.
pub const DEFAULT_KILL_MAX_PAUSE: Duration = Duration::from_secs(600);
/// Default messages a worker on probation handles before it is judged again: 10.
pub const DEFAULT_KILL_PROBE_MESSAGES: u64 = 10;
/// Default number of different workers a message must fail on to be poison: 2.
pub const DEFAULT_POISON_WORKERS: usize = 2;

/// The kill switch's settings. Every field has a default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KillSwitchConfig {
    /// Window over which the failure rate is measured. Defaults to 1 minute.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Messages in the window before it may trip (0 = the kill switch is off). Defaults
    /// to 100.
    pub min_messages: u64,
    /// Failure rate (0..1) above which it trips. Defaults to 0.1.
    pub trip_rate: f64,
    /// First pause. Defaults to 60 s.
    #[serde(with = "humantime_serde")]
    pub restart_after: Duration,
    /// Longest pause; also how long it must stay closed before the pause length resets.
    /// Defaults to 10 minutes.
    #[serde(with = "humantime_serde")]
    pub max_pause: Duration,
    /// Messages handled on probation before it is judged again. Defaults to 10.
    pub probe_messages: u64,
}

impl Default for KillSwitchConfig {
    fn default() -> Self {
        KillSwitchConfig {
            window: DEFAULT_KILL_WINDOW,
            min_messages: DEFAULT_KILL_MIN_MESSAGES,
            trip_rate: DEFAULT_KILL_TRIP_RATE,
            restart_after: DEFAULT_KILL_RESTART_AFTER,
            max_pause: DEFAULT_KILL_MAX_PAUSE,
            probe_messages: DEFAULT_KILL_PROBE_MESSAGES,
        }
    }
}

/// The gate's settings. Every field has a default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GateConfig {
    /// Local readiness thresholds: stop after `unhealthy_threshold` failed checks in a row
    /// (default 1), resume after `healthy_threshold` passes (default 2). A table that sets
    /// one of them keeps the gate's default for the other (not the active checks' 3).
    #[serde(deserialize_with = "readiness_over_gate_defaults")]
    pub readiness: ThresholdsConfig,
    /// The kill switch.
    pub kill_switch: KillSwitchConfig,
    /// Different workers a message must fail on to be dead-lettered. Defaults to 2.
    pub poison_workers: usize,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            readiness: ThresholdsConfig {
                healthy_threshold: 2,
                unhealthy_threshold: 1,
            },
            kill_switch: KillSwitchConfig::default(),
            poison_workers: DEFAULT_POISON_WORKERS,
        }
    }
}

/// `readiness` with the keys it sets, the gate's defaults for the others.
fn readiness_over_gate_defaults<'de, D>(d: D) -> Result<ThresholdsConfig, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Given {
        healthy_threshold: Option<u32>,
        unhealthy_threshold: Option<u32>,
    }
    let given = Given::deserialize(d)?;
    let def = GateConfig::default().readiness;
    Ok(ThresholdsConfig {
        healthy_threshold: given.healthy_threshold.unwrap_or(def.healthy_threshold),
        unhealthy_threshold: given.unhealthy_threshold.unwrap_or(def.unhealthy_threshold),
    })
}

impl GateConfig {
    /// Checks the values; the error starts with the bad key.
    pub fn validate(&self) -> Result<(), Invalid> {
        self.readiness
            .validate()
            .map_err(|e| e.within("readiness"))?;
        let k = &self.kill_switch;
        if !(k.trip_rate.is_finite() && k.trip_rate > 0.0 && k.trip_rate < 1.0) {
            return Err(Invalid::new(
                "kill_switch.trip_rate",
                format!("must be in (0, 1), got {}", k.trip_rate),
            ));
        }
        if k.window.is_zero() {
            return Err(Invalid::new("kill_switch.window", "must be longer than 0s"));
        }
        if k.restart_after.is_zero() || k.max_pause < k.restart_after {
            return Err(Invalid::new(
                "kill_switch.max_pause",
                format!(
                    "must be at least restart_after ({}), and restart_after longer than 0s",
                    humantime::format_duration(k.restart_after)
                ),
            ));
        }
        if k.probe_messages == 0 {
            return Err(Invalid::new(
                "kill_switch.probe_messages",
                "must be at least 1",
            ));
        }
        if self.poison_workers < 2 {
            return Err(Invalid::new(
                "poison_workers",
                format!(
                    "must be at least 2 (one worker failing a message says nothing about the message), got {}",
                    self.poison_workers
                ),
            ));
        }
        Ok(())
    }
}

/// Why the gate is closed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Pause {
    /// Local readiness fails.
    Unready {
        /// What the failing check said.
        reason: String,
    },
    /// The kill switch tripped.
    KillSwitch {
        /// Messages failed in the window (or on probation) when it tripped.
        failed: u64,
        /// Messages handled then.
        of: u64,
        /// When it pulls again, on probation.
        until: Time,
    },
}

/// A change of the gate, for the driver to log and act on.
#[derive(Clone, Debug, PartialEq)]
pub enum GateChange {
    /// It stopped pulling: stop consuming, send held messages back.
    Paused(Pause),
    /// It pulls again (`probation` when the kill switch lets it try).
    Resumed {
        /// True when resuming on the kill switch's probation.
        probation: bool,
    },
}

/// Where a failed message goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Back to the queue for another worker; `stamp`: add this worker to the message's
    /// list of workers it failed on.
    Requeue {
        /// Whether to record this worker as one the message failed on.
        stamp: bool,
    },
    /// Dead-letter it: it failed on this many different workers.
    DeadLetter {
        /// Different workers it failed on, this one included.
        workers: usize,
    },
}

#[derive(Clone, Debug, PartialEq)]
enum Switch {
    Closed { since: Time },
    Open { until: Time, failed: u64, of: u64 },
    Probation { failed: u64, of: u64 },
}

/// The worker gate: see the [module docs](self).
#[derive(Clone, Debug)]
pub struct WorkerGate {
    config: GateConfig,
    readiness: Thresholds,
    unready_reason: String,
    outcomes: VecDeque<(Time, bool)>,
    switch: Switch,
    /// The pause the next trip costs.
    next_pause: Duration,
}

impl WorkerGate {
    /// A gate that starts open (the worker's readiness is assumed good until a check says
    /// otherwise; the library runs its first checks before it starts consuming).
    pub fn new(config: GateConfig, now: Time) -> Self {
        let next_pause = config.kill_switch.restart_after;
        WorkerGate {
            readiness: Thresholds::new_healthy(config.readiness, now),
            config,
            unready_reason: String::new(),
            outcomes: VecDeque::new(),
            switch: Switch::Closed { since: now },
            next_pause,
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &GateConfig {
        &self.config
    }

    /// True when the worker may pull messages.
    pub fn may_pull(&self) -> bool {
        self.readiness.health() != HealthState::Unhealthy
            && !matches!(self.switch, Switch::Open { .. })
    }

    /// Why it does not pull, if it does not.
    pub fn pause(&self) -> Option<Pause> {
        if self.readiness.health() == HealthState::Unhealthy {
            return Some(Pause::Unready {
                reason: self.unready_reason.clone(),
            });
        }
        match self.switch {
            Switch::Open { until, failed, of } => Some(Pause::KillSwitch { failed, of, until }),
            _ => None,
        }
    }

    /// Feeds one local readiness result (`Err` with what failed). Returns the change of
    /// the gate, if any.
    pub fn observe_readiness(
        &mut self,
        now: Time,
        result: Result<(), String>,
    ) -> Option<GateChange> {
        let before = self.may_pull();
        if let Err(reason) = &result {
            self.unready_reason.clone_from(reason);
        }
        self.readiness.observe(now, result.is_ok());
        self.change(before)
    }

    /// Records the outcome of one message this worker processed while its gate was open.
    /// Returns the change of the gate, if any.
    pub fn record(&mut self, now: Time, ok: bool) -> Option<GateChange> {
        let before = self.may_pull();
        let k = &self.config.kill_switch;
        match &mut self.switch {
            Switch::Open { .. } => return None,
            Switch::Probation { failed, of } => {
                *of += 1;
                *failed += u64::from(!ok);
                if *of >= k.probe_messages {
                    let (failed, of) = (*failed, *of);
                    if failed as f64 > k.trip_rate * of as f64 {
                        self.trip(now, failed, of);
                    } else {
                        self.switch = Switch::Closed { since: now };
                        self.outcomes.clear();
                    }
                }
            }
            Switch::Closed { since } => {
                if now.since(*since) >= k.max_pause {
                    self.next_pause = k.restart_after;
                }
                self.outcomes.push_back((now, ok));
                while self
                    .outcomes
                    .front()
                    .is_some_and(|&(t, _)| now.since(t) >= k.window)
                {
                    self.outcomes.pop_front();
                }
                let of = self.outcomes.len() as u64;
                let failed = self.outcomes.iter().filter(|(_, ok)| !ok).count() as u64;
                if k.min_messages > 0
                    && of >= k.min_messages
                    && failed as f64 > k.trip_rate * of as f64
                {
                    self.trip(now, failed, of);
                }
            }
        }
        self.change(before)
    }

    /// Advances time: ends a kill-switch pause that is due. Returns the change, if any.
    pub fn tick(&mut self, now: Time) -> Option<GateChange> {
        let before = self.may_pull();
        match self.switch {
            Switch::Open { until, .. } if now >= until => {
                self.switch = Switch::Probation { failed: 0, of: 0 };
            }
            Switch::Closed { since } if now.since(since) >= self.config.kill_switch.max_pause => {
                self.next_pause = self.config.kill_switch.restart_after;
            }
            _ => {}
        }
        self.change(before)
    }

    /// Where a message that just failed on worker `me` goes, given the workers it had
    /// already failed on (from its stamp).
    pub fn on_failure(&self, me: &str, failed_on: &[&str]) -> Disposition {
        if !self.may_pull() {
            // The worker is sick: the message never had a fair run here.
            return Disposition::Requeue { stamp: false };
        }
        let mut workers: Vec<&str> = failed_on.to_vec();
        workers.push(me);
        workers.sort_unstable();
        workers.dedup();
        if workers.len() >= self.config.poison_workers {
            Disposition::DeadLetter {
                workers: workers.len(),
            }
        } else {
            Disposition::Requeue { stamp: true }
        }
    }

    fn trip(&mut self, now: Time, failed: u64, of: u64) {
        let pause = self.next_pause;
        self.next_pause = (pause * 2).min(self.config.kill_switch.max_pause);
        self.switch = Switch::Open {
            until: now + pause,
            failed,
            of,
        };
        self.outcomes.clear();
    }

    fn change(&self, before: bool) -> Option<GateChange> {
        match (before, self.may_pull()) {
            (true, false) => self.pause().map(GateChange::Paused),
            (false, true) => Some(GateChange::Resumed {
                probation: matches!(self.switch, Switch::Probation { .. }),
            }),
            _ => None,
        }
    }
}

impl fmt::Display for WorkerGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pause() {
            None if matches!(self.switch, Switch::Probation { .. }) => {
                write!(f, "pulling, on probation after the kill switch tripped")
            }
            None => write!(f, "pulling"),
            Some(p) => write!(f, "paused: {p}"),
        }
    }
}

impl fmt::Display for Pause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pause::Unready { reason } => write!(f, "local readiness fails ({reason})"),
            Pause::KillSwitch { failed, of, until } => write!(
                f,
                "kill switch: {failed} of {of} messages failed; pulling again on probation at {until}"
            ),
        }
    }
}

#[cfg(test)]
mod tests;
