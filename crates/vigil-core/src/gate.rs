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
//! 3. **Poison is not sickness, and a shared outage is not poison.** A message that
//!    failed is sent back to the queue stamped with the worker's id and with what the
//!    failure says ([`Evidence`]). It points at the *message* only when the worker was
//!    otherwise succeeding: fewer than `kill_switch.trip_rate` (10%) of its last
//!    [`POISON_RECENT_OUTCOMES`] (20) outcomes within `kill_switch.window` failed (a
//!    worker with no recent outcome counts as succeeding: nothing says otherwise), and
//!    it is not on probation. Otherwise the failure points at the worker's state or at a
//!    cause its peers share (a dependency down for every worker), and is stamped as
//!    such. A message is dead-lettered when `poison_workers` (default 2) different
//!    workers, this one included, failed it while otherwise succeeding, the first of
//!    those failures at least `poison_after` (5 s) ago: the message is the problem.
//!    - A worker failing broadly never dead-letters (dead-lettering is suspended while
//!      it fails): when every worker loses the same dependency, messages go round, the
//!      kill switches pause the workers, and nothing healthy is dead-lettered.
//!    - `poison_after` closes the race at the start of an outage: a worker's first
//!      failures of an outage still read as evidence against their messages (its
//!      history is all successes), and on an idle queue a message failed by one worker
//!      goes straight to a peer that has not failed anything yet. Within 5 s every
//!      busy worker has failed other messages too (a message takes 100 ms; the
//!      example's dependency timeout is its work time), so the peer's failure no longer
//!      counts. The cost: a poison message goes round for 5 s before it is
//!      dead-lettered. The drivers carry the time of the first such failure in the
//!      stamp (wall clock, so workers' clocks must agree to well within 5 s).
//!    - The failure of a message that an otherwise succeeding worker (this one or
//!      another) already failed is the message's, already counted once: it never
//!      counts toward whether this worker is otherwise succeeding, and toward the kill
//!      switch only when this worker is failing broadly anyway. Otherwise a poison
//!      message going round the workers for 5 s would add a failure to every one of
//!      them, and a few poison messages would make healthy workers look sick (or trip
//!      the kill switches of two otherwise idle ones).
//!    - Failures concentrated on one worker are that worker's problem, which rules 1-2
//!      and the controller handle. A message a worker held while paused goes back
//!      unstamped: it never ran.
//!    - What cannot be told apart: a queue holding only the one message, in an outage
//!      longer than `poison_after`, looks like poison and is dead-lettered.
//!
//!    [`naive_disposition`] is the rule without this judgement (any 2 workers at once:
//!    vigil's rule before issue 36), for the simulator's naive twin.
//! 4. **A shared blip ends the pause when it is over.** A kill-switch pause is *shared*
//!    when the worker's dependency checks (its `/health` checks beyond readiness: the
//!    database, a downstream service, what every peer shares) fail when it trips or
//!    while it is paused: the cause is one its cohort shares, not this worker. Such a
//!    pause ends as soon as those checks pass again `readiness.healthy_threshold` times
//!    in a row (default 2): the worker pulls on probation at once, with its peers, where
//!    otherwise a 50 s blip would stop it for its whole pause (60 s, or longer after
//!    doubling). Probation still judges: a worker still failing trips again (the pause
//!    doubling as in rule 2). A pause whose dependency checks never failed waits its
//!    time out: the gate cannot tell that a cause it does not see is gone. The
//!    controller's view of the cohort ("4 of 4 fail together") does not reach the
//!    workers; their own dependency checks are what they know of the shared cause.
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
//! assert_eq!(
//!     gate.on_failure(Time::from_secs(5), "w1", &[], None),
//!     Disposition::Requeue { stamp: None }
//! );
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
/// Outcomes (the latest, within `kill_switch.window`) that say whether a worker was
/// otherwise succeeding when it failed a message: 20, enough that one unlucky failure
/// among them (a 1% background error rate) does not excuse a poison message, and few
/// enough that a worker failing broadly stops witnessing after its first failure or two.
pub const POISON_RECENT_OUTCOMES: usize = 20;
/// Default time a message must have been failing on otherwise succeeding workers before
/// it is poison: 5 s, many times a message's processing time, so that at the start of a
/// shared outage every busy worker has failed other messages too before a second
/// worker's failure can count (rule 3).
pub const DEFAULT_POISON_AFTER: Duration = Duration::from_secs(5);

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
    /// Different workers a message must fail on, each while otherwise succeeding (rule
    /// 3), to be dead-lettered. Defaults to 2.
    pub poison_workers: usize,
    /// How long ago the first of those failures must be before the message is
    /// dead-lettered (rule 3). Defaults to 5 s.
    #[serde(with = "humantime_serde")]
    pub poison_after: Duration,
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
            poison_after: DEFAULT_POISON_AFTER,
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

/// What one worker's failure of a message says, as the message's stamp records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Evidence {
    /// The worker was otherwise succeeding: the failure points at the message.
    Message,
    /// The worker was failing other messages too (or on probation): the failure points
    /// at the worker's state or a cause its peers share, and never counts toward poison.
    Worker,
}

/// One worker a message failed on, from its stamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailedOn<'a> {
    /// The worker's id.
    pub worker: &'a str,
    /// What its failure said.
    pub evidence: Evidence,
}

impl<'a> FailedOn<'a> {
    /// A failure that pointed at the message (what a stamp without evidence, written
    /// before issue 36, meant).
    pub fn message(worker: &'a str) -> Self {
        FailedOn {
            worker,
            evidence: Evidence::Message,
        }
    }
}

/// Where a failed message goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Back to the queue for another worker; `stamp`: add this worker, with what its
    /// failure says, to the message's list of workers it failed on (`None`: leave the
    /// stamp as it is, the message never had a fair run here).
    Requeue {
        /// What to record for this worker, if anything.
        stamp: Option<Evidence>,
    },
    /// Dead-letter it: it failed on this many different workers that were otherwise
    /// succeeding.
    DeadLetter {
        /// Different workers whose failure pointed at the message, this one included.
        workers: usize,
    },
}

/// The poison rule without the gate's judgement: dead-letter once `poison_workers`
/// different workers (this one included) failed the message, whatever their state.
/// vigil's rule before issue 36, and what the simulator's naive workers do: when every
/// worker loses the same dependency, it dead-letters healthy messages.
pub fn naive_disposition(
    poison_workers: usize,
    me: &str,
    failed_on: &[FailedOn<'_>],
) -> Disposition {
    let mut workers: Vec<&str> = failed_on.iter().map(|f| f.worker).collect();
    workers.push(me);
    workers.sort_unstable();
    workers.dedup();
    if workers.len() >= poison_workers {
        Disposition::DeadLetter {
            workers: workers.len(),
        }
    } else {
        Disposition::Requeue {
            stamp: Some(Evidence::Message),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Switch {
    Closed {
        since: Time,
    },
    Open {
        until: Time,
        failed: u64,
        of: u64,
        /// The worker's dependency checks failed when it tripped or since (rule 4).
        shared: bool,
    },
    Probation {
        failed: u64,
        of: u64,
    },
}

/// The worker gate: see the [module docs](self).
#[derive(Clone, Debug)]
pub struct WorkerGate {
    config: GateConfig,
    readiness: Thresholds,
    unready_reason: String,
    outcomes: VecDeque<(Time, bool)>,
    /// The latest outcomes whatever the switch's state (never cleared by a trip): whether
    /// the worker is otherwise succeeding (rule 3).
    recent: VecDeque<(Time, bool)>,
    switch: Switch,
    /// The pause the next trip costs.
    next_pause: Duration,
    /// Whether the worker's dependency checks fail now (rule 4), and the passes in a
    /// row since they last failed.
    deps_failing: bool,
    deps_passes: u32,
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
            recent: VecDeque::new(),
            switch: Switch::Closed { since: now },
            next_pause,
            deps_failing: false,
            deps_passes: 0,
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
            Switch::Open {
                until, failed, of, ..
            } => Some(Pause::KillSwitch { failed, of, until }),
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

    /// Feeds one result of the worker's dependency checks (its `/health` checks beyond
    /// readiness; `Err` with what failed): what it knows of a cause its peers share.
    /// Ends a shared kill-switch pause once they pass again (rule 4). Returns the change
    /// of the gate, if any.
    pub fn observe_dependencies(
        &mut self,
        _now: Time,
        result: Result<(), String>,
    ) -> Option<GateChange> {
        let before = self.may_pull();
        match result {
            Err(_) => {
                self.deps_failing = true;
                self.deps_passes = 0;
                if let Switch::Open { shared, .. } = &mut self.switch {
                    *shared = true;
                }
            }
            Ok(()) if self.deps_failing => {
                self.deps_passes += 1;
                if self.deps_passes >= self.config.readiness.healthy_threshold {
                    self.deps_failing = false;
                }
            }
            Ok(()) => {}
        }
        if matches!(self.switch, Switch::Open { shared: true, .. }) && !self.deps_failing {
            self.switch = Switch::Probation { failed: 0, of: 0 };
        }
        self.change(before)
    }

    /// Whether the kill switch's pause is shared (rule 4): the worker's dependency checks
    /// failed when it tripped or since.
    pub fn pause_is_shared(&self) -> bool {
        matches!(self.switch, Switch::Open { shared: true, .. })
    }

    /// Records the outcome of one message this worker processed while its gate was open.
    /// Returns the change of the gate, if any.
    pub fn record(&mut self, now: Time, ok: bool) -> Option<GateChange> {
        let before = self.may_pull();
        if self.recent.len() >= POISON_RECENT_OUTCOMES {
            self.recent.pop_front();
        }
        self.recent.push_back((now, ok));
        self.count_for_kill_switch(now, ok);
        self.change(before)
    }

    fn count_for_kill_switch(&mut self, now: Time, ok: bool) {
        let k = &self.config.kill_switch;
        match &mut self.switch {
            Switch::Open { .. } => {}
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

    /// What a failure on this worker at `now` says (rule 3), judged before the failure
    /// is recorded: whether the worker was otherwise succeeding.
    pub fn evidence(&self, now: Time) -> Evidence {
        if matches!(self.switch, Switch::Probation { .. }) {
            // It has just been failing broadly; its probe messages decide about it, not
            // about them.
            return Evidence::Worker;
        }
        let window = self.config.kill_switch.window;
        let recent: Vec<bool> = self
            .recent
            .iter()
            .filter(|&&(t, _)| now.since(t) < window)
            .map(|&(_, ok)| ok)
            .collect();
        let failed = recent.iter().filter(|ok| !**ok).count();
        if failed == 0 || (failed as f64) < self.config.kill_switch.trip_rate * recent.len() as f64
        {
            Evidence::Message
        } else {
            Evidence::Worker
        }
    }

    /// Where a message that just failed on worker `me` at `now` goes, given the workers
    /// it had already failed on (from its stamp) and how long ago the first of them that
    /// pointed at the message failed it (`None`: none did, or the stamp does not say).
    /// Judges only: [`WorkerGate::message_failed`] judges and counts.
    pub fn on_failure(
        &self,
        now: Time,
        me: &str,
        failed_on: &[FailedOn<'_>],
        witnessed_for: Option<Duration>,
    ) -> Disposition {
        if !self.may_pull() {
            // The worker is sick: the message never had a fair run here.
            return Disposition::Requeue { stamp: None };
        }
        if self.evidence(now) == Evidence::Worker {
            // Dead-lettering is suspended while this worker fails broadly.
            return Disposition::Requeue {
                stamp: Some(Evidence::Worker),
            };
        }
        let mut workers: Vec<&str> = failed_on
            .iter()
            .filter(|f| f.evidence == Evidence::Message)
            .map(|f| f.worker)
            .collect();
        workers.push(me);
        workers.sort_unstable();
        workers.dedup();
        if workers.len() >= self.config.poison_workers
            && witnessed_for.is_some_and(|d| d >= self.config.poison_after)
        {
            Disposition::DeadLetter {
                workers: workers.len(),
            }
        } else {
            Disposition::Requeue {
                stamp: Some(Evidence::Message),
            }
        }
    }

    /// A message this worker processed failed at `now`: where it goes
    /// ([`WorkerGate::on_failure`], judged before this failure counts), and the change
    /// of the gate once the failure is counted. A failure of a message that an
    /// otherwise succeeding worker already failed counts only toward the kill switch,
    /// and only while this worker is failing broadly (rule 3).
    pub fn message_failed(
        &mut self,
        now: Time,
        me: &str,
        failed_on: &[FailedOn<'_>],
        witnessed_for: Option<Duration>,
    ) -> (Disposition, Option<GateChange>) {
        let disposition = self.on_failure(now, me, failed_on, witnessed_for);
        let witnessed = failed_on.iter().any(|f| f.evidence == Evidence::Message);
        if !witnessed {
            return (disposition, self.record(now, false));
        }
        if self.evidence(now) == Evidence::Message {
            return (disposition, None);
        }
        let before = self.may_pull();
        self.count_for_kill_switch(now, false);
        (disposition, self.change(before))
    }

    fn trip(&mut self, now: Time, failed: u64, of: u64) {
        let pause = self.next_pause;
        self.next_pause = (pause * 2).min(self.config.kill_switch.max_pause);
        self.switch = Switch::Open {
            until: now + pause,
            failed,
            of,
            shared: self.deps_failing,
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
            Some(p) if self.pause_is_shared() => write!(
                f,
                "paused: {p}; a shared cause (its dependency checks fail): pulling again once they pass"
            ),
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
