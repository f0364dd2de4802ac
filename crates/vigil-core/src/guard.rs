//! The controller's safety guard: may it act on this target now, and why (not).
//!
//! [`SafetyGuard`] is the policy the fleet controller (`vigil controller`) and the
//! simulator (`vigil sim`) both drive. It is a pure state machine: every method that
//! depends on time takes `now: Time` from its driver; nothing here reads a clock, does
//! I/O or spawns anything. Its whole state ([`GuardState`]) is serde-serialisable so a
//! driver can persist it and restore it after a restart: budget tokens, flap penalties,
//! freeze state, holds, failure streaks, all of it.
//!
//! # What it decides
//!
//! The driver feeds one [`Observation`] per probe of a target (the target's id and zone,
//! whether the endpoint itself failed, the names of the checks that failed in its
//! health+json report). [`SafetyGuard::observe`] returns a [`Decision`] when the target
//! is a *candidate* for replacement, or `None` when there is nothing to decide (it
//! passed, it is in its grace period, or it has not failed long enough yet).
//!
//! A target is a candidate when it failed at least `thresholds.unhealthy_threshold` (N)
//! consecutive probes spanning at least `min_failing` (T), or when it fails while
//! flapping. A candidate is acted on ([`Outcome::Act`]: report it for replacement) only
//! when **all** of these hold; otherwise the decision is [`Outcome::HoldBack`] and its
//! [`Decision::reasons`] say every reason why:
//!
//! 1. **Fraction cap.** The unhealthy fraction of the fleet, and of the target's zone,
//!    is at most `max_unhealthy_fraction` (default 30%). Above it the fleet (or zone) is
//!    *frozen* and nobody in it is acted on ([`Reason::FleetFrozen`]); the freeze lifts
//!    by itself when the fraction drops back. A single unhealthy target never freezes
//!    anything (`freeze_min_unhealthy`, default 2), or a fleet of three could never
//!    replace a host. "Unhealthy" means unhealthy *by the thresholds* (N consecutive
//!    failed probes, until `healthy_threshold` pass): a single failed probe is noise (a
//!    dependency failing 2% of checks would otherwise freeze a zone of six every time
//!    two blips coincide) and never counts towards a freeze.
//!
//!    The freeze's reason says what the evidence shows ([`FreezeEvidence`]): how many of
//!    the unhealthy targets fail which check, local or dependency, or fail as a whole
//!    ("fleet-wide failure: 11/20 unhealthy (cap 30%): 8 of 11 fail disk:free (local),
//!    2 fail postgres:query (dependency), 1 fail as a whole; most fail local checks at
//!    once: a common cause (a deploy, a config, a load pattern), not a shared
//!    dependency"), and names a shared dependency only when most of them fail it.
//!
//!    **Above the cap** the guard holds by default (`frozen.action = "hold"`). With
//!    `frozen.action = "act-slowly"` (after the Kubernetes node lifecycle controller's
//!    secondary eviction rate in a partially unhealthy zone) it still acts on targets
//!    whose failure is *local* (a local check, not the endpoint nor a dependency) and
//!    *persistent* (failing for `frozen.min_failing`, default 15 min), at the much
//!    slower `frozen.actions` per `frozen.per` (default 1 per hour, on top of the ordinary budget), and
//!    never in a scope where every target is unhealthy. Either way, a freeze lasting
//!    `frozen.alert_after` (default 15 min) raises [`GuardEvent::FreezeAlert`] once, so
//!    a human decides.
//! 2. **Peers not failing.** The *eager* fraction (targets whose last probe failed, or
//!    unhealthy, or *in doubt*) is under the cap too, else the action waits
//!    ([`Reason::PeersFailing`], no freeze announced). Targets that fail together reach N
//!    one probe at a time, so the first of them could be confirmed before its peers
//!    count; the next probes tell a shared failure (the freeze follows) from coinciding
//!    blips (the action goes ahead). A target is in doubt when its driver cannot tell
//!    that it passes: its probers disagree ([`Observation::disputed`]) or have no fresh
//!    result ([`SafetyGuard::doubt`]), as when a prober stops or is cut off just as a
//!    shared failure starts. A guard that cannot see part of the fleet does not take it
//!    for healthy (while one of several probers sees every target failing, the guard
//!    holds, as a single controller cut off from the fleet would).
//! 3. **Not a freeze's aftermath.** When a freeze lifts, a target that failed under it is
//!    not acted on at once: its peers' recovery lifted the freeze, and it may simply be
//!    the last of them to be seen recovering (probes and their reports arrive one at a
//!    time). It is acted on only once it has failed again on its own,
//!    `unhealthy_threshold` probes over `min_failing` since it last failed under the
//!    freeze ([`Reason::FreezeAftermath`]).
//! 4. **Budget.** A token is left in the action budget ([`budget`]): `budget.actions`
//!    per `budget.per` (default 2 per 10 minutes). Each token comes back `per` after it
//!    was spent, so **no window of length `per` holds more than `actions` actions**.
//! 5. **Local cause.** At least one of the target's failures is its own ([`cause`]): the
//!    endpoint failed, a local check failed (disk, fd, memory, ...), or a dependency check
//!    failed that fewer than `cause.shared_min_targets` targets fail. A dependency check
//!    failing on many targets is attributed to that shared dependency
//!    ([`Reason::SharedDependency`]) and nobody is replaced for it.
//! 6. **Not flapping.** Flap damping after BGP route-flap dampening, RFC 2439
//!    ([`damping`]): each pass-to-fail change adds a penalty that decays with a
//!    half-life; at the suppress threshold the target is flapping ([`Reason::Flapping`])
//!    until the penalty decays below the reuse threshold.
//! 7. **No operator hold.** The target is not silenced nor in maintenance ([`Hold`]),
//!    and the operator has not frozen the guard ([`SafetyGuard::freeze`]).
//! 8. **Not already reported.** A target acted on is reported once; it becomes eligible
//!    again only after it has recovered (its verdict is healthy again, on a pass that
//!    no prober disputes).
//!
//! Only when 1-3 and 5-8 hold is a budget token spent, so a held-back decision never
//! costs budget.
//!
//! # Targets
//!
//! Targets are keyed by id (any string). [`SafetyGuard::add_target`] registers one (its
//! grace period starts then); [`SafetyGuard::observe`] registers unknown ones on the fly.
//! During the grace period (`grace`, default 60 s, like an Auto Scaling group's health
//! check grace period) observations are ignored and the target counts nowhere.
//! [`SafetyGuard::remove_target`] forgets a target completely. Targets in maintenance are
//! left out of every count (they may be down on purpose); silenced ones still count
//! towards the fraction cap but are never acted on.
//!
//! # Time, persistence and restarts
//!
//! `Time` is whatever monotonic time base the driver chooses, but a driver that persists
//! [`GuardState`] across restarts must use one that survives the restart (the controller
//! uses wall-clock time since the UNIX epoch, never allowed to go backwards); the
//! simulator uses its virtual clock. Budget tokens, penalties and freezes are stored
//! as timestamps, so a restart neither refills the budget nor forgets a flap.
//! [`SafetyGuard::restore`] from a serialised state gives exactly the decisions the
//! original would have given.
//!
//! # Events
//!
//! Guard-level changes (a freeze starting or ending, a target starting or stopping to
//! flap) are queued as [`GuardEvent`]s; drivers take them with
//! [`SafetyGuard::drain_events`] and log them. [`Decision::repeated`] is true when a
//! decision for the target repeats the previous one (same outcome, same kinds of reason),
//! so a driver can record changes only, not every probe.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use vigil_core::Time;
//! use vigil_core::guard::{GuardConfig, Observation, Outcome, SafetyGuard};
//!
//! let config = GuardConfig {
//!     grace: Duration::ZERO,
//!     min_failing: Duration::from_secs(20),
//!     ..GuardConfig::default()
//! };
//! config.validate().unwrap();
//! let mut guard = SafetyGuard::new(config);
//! for i in 0..10 {
//!     guard.add_target(Time::ZERO, &format!("web-{i}"), "zone-a");
//! }
//! let mut acted = Vec::new();
//! for s in (0..=60).step_by(10) {
//!     let now = Time::from_secs(s);
//!     for i in 0..10 {
//!         let obs = if i == 3 {
//!             Observation::failed_checks(format!("web-{i}"), "zone-a", ["disk:free"])
//!         } else {
//!             Observation::pass(format!("web-{i}"), "zone-a")
//!         };
//!         if let Some(d) = guard.observe(now, &obs) {
//!             if d.outcome == Outcome::Act {
//!                 acted.push(d.to_string());
//!             }
//!         }
//!     }
//! }
//! assert_eq!(acted.len(), 1, "reported once: {acted:?}");
//! assert!(acted[0].contains("local check disk:free failed"));
//! // Persist and restore.
//! let saved = serde_json::to_string(guard.state()).unwrap();
//! let restored = SafetyGuard::restore(guard.config().clone(), serde_json::from_str(&saved).unwrap());
//! assert_eq!(restored.budget_left(Time::from_secs(60)), 1);
//! ```

pub mod budget;
pub mod cause;
pub mod damping;
pub mod op;
mod reason;
mod state;
#[cfg(test)]
mod tests;

use crate::invalid::Invalid;
use crate::report::HealthReport;
use crate::status::Status;
use crate::thresholds::{HealthState, Thresholds, ThresholdsConfig};
use crate::time::Time;
use budget::BudgetConfig;
use cause::{Cause, CauseConfig};
use damping::{DampingConfig, FlapDamper};
pub use op::{Applied, Op};
pub use reason::{
    CheckTally, Decision, EVIDENCE_CHECKS, FreezeEvidence, GuardEvent, LikelyCause, Outcome, Reason,
};
use serde::{Deserialize, Serialize};
pub use state::{Freeze, FreezeScope, GuardState, Hold, HoldKind, ManualFreeze};
use state::{GuardTarget, Index};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// Default minimum failing duration T: 30 s. Together with N consecutive failures this
/// keeps a restart, a deploy or a GC pause (seconds) from looking like a dead host.
pub const DEFAULT_MIN_FAILING: Duration = Duration::from_secs(30);
/// Default grace period for a new target: 60 s, long enough for a typical service to
/// boot and warm up before its health means anything.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);
/// Default fraction cap: 30% unhealthy. Above that, the failure is far likelier shared
/// (a dependency, the network, the checker itself) than a set of independent bad hosts,
/// and replacing 30% of a fleet at once risks the fleet.
pub const DEFAULT_MAX_UNHEALTHY_FRACTION: f64 = 0.3;
/// Default minimum number of unhealthy targets for a freeze: 2. One unhealthy target is
/// by definition not a fleet-wide signal, and without this floor a fleet (or zone) of
/// three or fewer could never replace anything.
pub const DEFAULT_FREEZE_MIN_UNHEALTHY: u32 = 2;

/// Default `frozen.min_failing`: 15 min. Above the cap only a failure that outlasts
/// every transient (a deploy, a restart, a dependency blip) is worth a slow action.
pub const DEFAULT_FROZEN_MIN_FAILING: Duration = Duration::from_secs(15 * 60);
/// Default `frozen.alert_after`: 15 min. A freeze that long is not a blip: a fleet (or
/// zone) has been short of capacity for a quarter of an hour and the guard will not act
/// (or only slowly): a human must look.
pub const DEFAULT_FREEZE_ALERT_AFTER: Duration = Duration::from_secs(15 * 60);
/// Default slow rate (`frozen.actions` per `frozen.per`): 1 action per hour, twelve
/// times slower than the default budget (2 per 10 min), as the Kubernetes node lifecycle
/// controller's secondary eviction rate (0.01 node/s) is ten times below its normal one
/// (0.1 node/s).
pub const DEFAULT_FROZEN_ACTIONS: u32 = 1;
/// See [`DEFAULT_FROZEN_ACTIONS`].
pub const DEFAULT_FROZEN_PER: Duration = Duration::from_secs(3600);

// === Config ===

/// What the guard does with candidates in a frozen fleet or zone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WhenFrozen {
    /// Act on no one until the freeze lifts. Defaults to this.
    #[default]
    Hold,
    /// Act on local, persistent failures at the slow `frozen.budget`.
    ActSlowly,
}

/// The guard's behaviour above the fraction cap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FrozenConfig {
    /// `hold` or `act-slowly`. Defaults to `hold`.
    pub action: WhenFrozen,
    /// With `act-slowly`: a target's failure must have lasted this long. Defaults to 15m.
    #[serde(with = "humantime_serde")]
    pub min_failing: Duration,
    /// With `act-slowly`: at most this many actions in a frozen scope per `per`, on top
    /// of the ordinary budget. Defaults to 1.
    pub actions: u32,
    /// The slow budget's window. Defaults to 1h.
    #[serde(with = "humantime_serde")]
    pub per: Duration,
    /// A freeze lasting this long raises an alert (0s: never). Defaults to 15m.
    #[serde(with = "humantime_serde")]
    pub alert_after: Duration,
}

impl FrozenConfig {
    /// The slow budget (`actions` per `per`).
    pub fn budget(&self) -> BudgetConfig {
        BudgetConfig {
            actions: self.actions,
            per: self.per,
        }
    }
}

impl Default for FrozenConfig {
    fn default() -> Self {
        FrozenConfig {
            action: WhenFrozen::Hold,
            min_failing: DEFAULT_FROZEN_MIN_FAILING,
            actions: DEFAULT_FROZEN_ACTIONS,
            per: DEFAULT_FROZEN_PER,
            alert_after: DEFAULT_FREEZE_ALERT_AFTER,
        }
    }
}

/// The guard's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuardConfig {
    /// N: consecutive failed probes before a target is a candidate
    /// (`unhealthy_threshold`), and consecutive passes that count as recovered
    /// (`healthy_threshold`). Defaults to 3 and 2.
    pub thresholds: ThresholdsConfig,
    /// T: the failure streak must span at least this long, e.g. `"30s"`. Defaults to 30 s.
    #[serde(with = "humantime_serde")]
    pub min_failing: Duration,
    /// Grace period of a new target: observations before its end are ignored.
    /// Defaults to 60 s.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// Unhealthy fraction of the fleet or of a zone above which it is frozen, in 0..1.
    /// Defaults to 0.3.
    pub max_unhealthy_fraction: f64,
    /// Unhealthy targets needed for any freeze. Defaults to 2.
    pub freeze_min_unhealthy: u32,
    /// The action budget. Defaults to 2 per 10 minutes.
    pub budget: BudgetConfig,
    /// Flap damping. Defaults to 1000 / 2000 / 750, 15 min half-life.
    pub damping: DampingConfig,
    /// Cause attribution.
    pub cause: CauseConfig,
    /// What happens above the cap: hold (default) or act slowly; when to alert.
    pub frozen: FrozenConfig,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            thresholds: ThresholdsConfig::default(),
            min_failing: DEFAULT_MIN_FAILING,
            grace: DEFAULT_GRACE,
            max_unhealthy_fraction: DEFAULT_MAX_UNHEALTHY_FRACTION,
            freeze_min_unhealthy: DEFAULT_FREEZE_MIN_UNHEALTHY,
            budget: BudgetConfig::default(),
            damping: DampingConfig::default(),
            cause: CauseConfig::default(),
            frozen: FrozenConfig::default(),
        }
    }
}

impl GuardConfig {
    /// Checks the values; the error names the bad key (relative to the guard's table).
    pub fn validate(&self) -> Result<(), Invalid> {
        self.thresholds
            .validate()
            .map_err(|e| e.within("thresholds"))?;
        if !(0.0..=1.0).contains(&self.max_unhealthy_fraction) {
            return Err(Invalid::new(
                "max_unhealthy_fraction",
                format!("must be within 0..1, got {}", self.max_unhealthy_fraction),
            ));
        }
        if self.freeze_min_unhealthy == 0 {
            return Err(Invalid::new("freeze_min_unhealthy", "must be at least 1"));
        }
        self.budget.validate().map_err(|e| e.within("budget"))?;
        self.damping.validate().map_err(|e| e.within("damping"))?;
        self.cause.validate().map_err(|e| e.within("cause"))?;
        if self.frozen.per.is_zero() {
            return Err(Invalid::new("frozen.per", "must be longer than 0s"));
        }
        Ok(())
    }
}

// === Observations ===

/// One probe of one target, as the guard sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// The target's id.
    pub target: String,
    /// The target's zone (any label; `""` when the fleet has no zones).
    pub zone: String,
    /// The endpoint itself failed: refused, timed out, answered garbage, or reported
    /// `fail` without naming a failing check.
    pub endpoint_failed: bool,
    /// Names of the checks that failed in its health+json report.
    pub failing_checks: Vec<String>,
    /// A pass that another of the target's probers disputes: its own fresh result
    /// fails (several probers, verdict by agreement: a pass from any one of them is the
    /// target's pass). The target passes, but stays *in doubt*: it counts as failing in
    /// the eager fraction that holds actions (rule 2) until an undisputed observation.
    #[serde(default, skip_serializing_if = "state::is_false")]
    pub disputed: bool,
}

impl Observation {
    /// A passing probe (pass or warn: degraded is healthy for replacement purposes).
    pub fn pass(target: impl Into<String>, zone: impl Into<String>) -> Self {
        Observation {
            target: target.into(),
            zone: zone.into(),
            endpoint_failed: false,
            failing_checks: Vec::new(),
            disputed: false,
        }
    }

    /// A probe whose endpoint failed as a whole.
    pub fn endpoint_failure(target: impl Into<String>, zone: impl Into<String>) -> Self {
        Observation {
            endpoint_failed: true,
            ..Self::pass(target, zone)
        }
    }

    /// A probe whose report failed these checks.
    pub fn failed_checks<I, S>(
        target: impl Into<String>,
        zone: impl Into<String>,
        checks: I,
    ) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Observation {
            failing_checks: checks.into_iter().map(Into::into).collect(),
            ..Self::pass(target, zone)
        }
    }

    /// The observation for a parsed health+json report: pass and warn pass; fail lists
    /// the failing checks, or is an endpoint failure when it names none.
    pub fn from_report(
        target: impl Into<String>,
        zone: impl Into<String>,
        report: &HealthReport,
    ) -> Self {
        if report.status != Status::Fail {
            return Self::pass(target, zone);
        }
        let checks: Vec<String> = report.failing_checks().map(String::from).collect();
        if checks.is_empty() {
            Self::endpoint_failure(target, zone)
        } else {
            Self::failed_checks(target, zone, checks)
        }
    }

    /// This pass, disputed by another prober (see [`Observation::disputed`]).
    pub fn disputed(self) -> Self {
        Observation {
            disputed: true,
            ..self
        }
    }

    /// Whether the probe passed.
    pub fn is_ok(&self) -> bool {
        !self.endpoint_failed && self.failing_checks.is_empty()
    }
}

/// A target id the guard does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown target {0:?}")]
pub struct UnknownTarget(pub String);

// === The guard ===

/// The safety guard. See the module docs.
#[derive(Clone, Debug)]
pub struct SafetyGuard {
    config: GuardConfig,
    state: GuardState,
    index: Index,
    events: Vec<GuardEvent>,
    /// The freezes may not match the counts (after a reconfiguration, until the next
    /// [`SafetyGuard::update_freeze`]): no observation takes the no-change fast path.
    freeze_stale: bool,
    /// Zone names, one shared copy each.
    zones: BTreeSet<Arc<str>>,
}

/// A read-only view of one target.
#[derive(Clone, Debug, PartialEq)]
pub struct GuardTargetView<'a> {
    /// Its id.
    pub id: &'a str,
    /// Its zone.
    pub zone: &'a str,
    /// Its rise/fall verdict.
    pub health: HealthState,
    /// Still in its grace period (nothing observed counts yet).
    pub in_grace: bool,
    /// Whether its last observation passed (None: none yet).
    pub last_ok: Option<bool>,
    /// Consecutive failed probes.
    pub consecutive_failures: u32,
    /// When the current failure streak began.
    pub failing_since: Option<Time>,
    /// Whether the endpoint itself failed at the last observation.
    pub endpoint_failed: bool,
    /// Checks failing at the last observation.
    pub failing_checks: &'a [String],
    /// Flap penalty now.
    pub penalty: u32,
    /// Flapping (suppressed).
    pub flapping: bool,
    /// The operator's hold on it.
    pub hold: Option<&'a Hold>,
    /// When it was reported for replacement (until it recovers).
    pub reported_at: Option<Time>,
    /// Its driver cannot tell that it passes ([`SafetyGuard::doubt`]): it counts as
    /// failing in the eager fraction.
    pub in_doubt: bool,
}

/// The guard's overall state at a moment, for dashboards and APIs.
#[derive(Clone, Debug, PartialEq)]
pub struct GuardStatus {
    /// Whether the whole fleet is frozen (automatically or by an operator).
    pub fleet_frozen: bool,
    /// Automatic freezes in force (fleet and zones).
    pub freezes: Vec<Freeze>,
    /// The operator's freeze, if any.
    pub manual_freeze: Option<ManualFreeze>,
    /// Why it is frozen, one reason per freeze (empty when nothing is frozen).
    pub reasons: Vec<Reason>,
    /// Budget tokens left.
    pub budget_left: u32,
    /// When the next token comes back, if none is left.
    pub next_token_at: Option<Time>,
    /// Unhealthy targets counted.
    pub unhealthy: u32,
    /// Targets counted (known, out of grace, not in maintenance).
    pub total: u32,
}

impl SafetyGuard {
    /// A guard with no targets. Validate the config first ([`GuardConfig::validate`]).
    pub fn new(config: GuardConfig) -> Self {
        Self::restore(config, GuardState::default())
    }

    /// A guard continuing from a saved state, under a (possibly new) config.
    pub fn restore(config: GuardConfig, state: GuardState) -> Self {
        let mut g = SafetyGuard {
            config,
            state,
            index: Index::default(),
            events: Vec::new(),
            freeze_stale: true,
            zones: BTreeSet::new(),
        };
        // A restored state has a copy of the zone's name per target: share them.
        let mut zones = std::mem::take(&mut g.zones);
        for t in g.state.targets.values_mut() {
            t.zone = intern(&mut zones, &t.zone);
        }
        g.zones = zones;
        g.compact();
        g.reconfigure(g.config.clone());
        g
    }

    /// Replaces the configuration (a reload), keeping all state.
    pub fn reconfigure(&mut self, config: GuardConfig) {
        self.config = config;
        let mut index = Index::default();
        for t in self.state.targets.values_mut() {
            t.thresholds.reconfigure(self.config.thresholds);
            index.apply(&self.config.cause, t, true);
        }
        self.index = index;
        self.freeze_stale = true;
    }

    /// The configuration.
    pub fn config(&self) -> &GuardConfig {
        &self.config
    }

    /// The whole state, to persist (serde). Restore it with [`SafetyGuard::restore`].
    pub fn state(&self) -> &GuardState {
        &self.state
    }

    /// Takes the guard-level events queued since the last call.
    pub fn drain_events(&mut self) -> Vec<GuardEvent> {
        std::mem::take(&mut self.events)
    }

    /// Registers a target (its grace period starts now) or updates its zone. Returns
    /// true when it was new.
    pub fn add_target(&mut self, now: Time, id: &str, zone: &str) -> bool {
        if let Some(t) = self.state.targets.get_mut(id) {
            if *t.zone != *zone {
                self.index.apply(&self.config.cause, t, false);
                t.zone = intern(&mut self.zones, zone);
                self.index.apply(&self.config.cause, t, true);
                self.update_freeze(now);
            }
            return false;
        }
        let t = GuardTarget {
            zone: intern(&mut self.zones, zone),
            first_seen: now,
            in_grace: !self.config.grace.is_zero(),
            thresholds: Thresholds::new_unknown(self.config.thresholds, now),
            last_ok: None,
            failures: 0,
            endpoint_failed: false,
            failing_checks: Vec::new(),
            damper: FlapDamper::default(),
            hold: None,
            reported: None,
            last_signature: None,
            in_doubt: false,
            frozen_with: None,
        };
        self.index.apply(&self.config.cause, &t, true);
        self.state.targets.insert(id.into(), t);
        self.update_freeze(now);
        true
    }

    /// Forgets a target completely. Returns true when it was known.
    pub fn remove_target(&mut self, now: Time, id: &str) -> bool {
        match self.state.targets.remove(id) {
            Some(t) => {
                self.index.apply(&self.config.cause, &t, false);
                self.update_freeze(now);
                true
            }
            None => false,
        }
    }

    /// Lays the per-target map out densely. Targets added one by one in id order (as a
    /// driver adds a sorted list, or as a saved state is read back) leave the map's
    /// nodes about half full; after adding many targets at once, this rebuilds it with
    /// full nodes (O(n), no change in behaviour).
    pub fn compact(&mut self) {
        let targets = std::mem::take(&mut self.state.targets);
        self.state.targets = targets.into_iter().collect();
    }

    /// Ids of the known targets, in order.
    pub fn target_ids(&self) -> impl Iterator<Item = &str> {
        self.state.targets.keys().map(|k| &**k)
    }

    /// Puts an operator's hold on a target (replacing any previous one).
    pub fn set_hold(&mut self, now: Time, id: &str, hold: Hold) -> Result<(), UnknownTarget> {
        self.modify(now, id, |t| t.hold = Some(Box::new(hold)))
    }

    /// Lifts the operator's hold on a target. Returns whether there was one.
    pub fn clear_hold(&mut self, now: Time, id: &str) -> Result<bool, UnknownTarget> {
        let mut had = false;
        self.modify(now, id, |t| had = t.hold.take().is_some())?;
        Ok(had)
    }

    /// The driver has no verdict on a target now: the probers it trusts disagree
    /// without a pass, or their results are stale or missing (a prober stopped, cut
    /// off, or just assigned). Nothing about the target itself changes (its streak,
    /// verdict and reasons stay); it is *in doubt* until its next observation, and
    /// counts as failing in the eager fraction that holds actions (rule 2): a guard
    /// that cannot see part of the fleet does not take it for healthy. Returns whether
    /// anything changed (false when it was in doubt already).
    pub fn doubt(&mut self, now: Time, id: &str) -> Result<bool, UnknownTarget> {
        let mut changed = false;
        self.modify(now, id, |t| {
            changed = !t.in_doubt;
            t.in_doubt = true;
        })?;
        Ok(changed)
    }

    /// Freezes the guard by hand: nobody is acted on until [`SafetyGuard::unfreeze`].
    pub fn freeze(&mut self, now: Time, reason: &str) {
        self.state.manual_freeze = Some(ManualFreeze {
            reason: reason.to_string(),
            since: now,
        });
        self.events.push(GuardEvent::ManualFreeze {
            reason: reason.to_string(),
        });
    }

    /// Lifts the manual freeze. Returns whether there was one. Automatic freezes are not
    /// affected: they lift when the fraction drops.
    pub fn unfreeze(&mut self, _now: Time) -> bool {
        let had = self.state.manual_freeze.take().is_some();
        if had {
            self.events.push(GuardEvent::ManualUnfreeze);
        }
        had
    }

    /// Lifts expired holds and releases targets whose flap penalty decayed. Drivers call
    /// it now and then (observations do the same for the observed target).
    pub fn tick(&mut self, now: Time) {
        self.sweep(now, true);
        self.update_freeze(now);
    }

    /// [`SafetyGuard::tick`], saying whether it changed anything. With no hold due, no
    /// flapping target and the freezes up to date, a tick changes nothing and takes a
    /// fast path; a driver that logs every call for replay may leave such ticks out.
    pub fn tick_changed(&mut self, now: Time) -> bool {
        let quiet = !self.freeze_stale
            && !self.alert_due(now)
            && self.index.next_hold_expiry.is_none_or(|n| n > now)
            && !self
                .state
                .targets
                .values()
                .any(|t| t.damper.is_suppressed());
        if quiet {
            return false;
        }
        self.tick(now);
        true
    }

    /// Expires due holds on every target (and, with `flaps`, refreshes every flapping
    /// target's damper).
    fn sweep(&mut self, now: Time, flaps: bool) {
        let holds_due = self.index.next_hold_expiry.is_some_and(|n| n <= now);
        if !holds_due && !flaps {
            return;
        }
        if holds_due {
            self.index.next_hold_expiry = None;
        }
        let ids: Vec<String> = self
            .state
            .targets
            .iter()
            .filter(|(_, t)| {
                t.hold.as_ref().is_some_and(|h| h.until.is_some())
                    || (flaps && t.damper.is_suppressed())
            })
            .map(|(id, _)| id.to_string())
            .collect();
        for id in ids {
            // Re-indexing re-registers the expiry of the holds still pending.
            self.expire(now, &id, true);
        }
    }

    /// Records one probe and decides. Returns a decision when the target is a candidate
    /// for replacement (see the module docs), `None` when there is nothing to decide.
    pub fn observe(&mut self, now: Time, obs: &Observation) -> Option<Decision> {
        self.add_target(now, &obs.target, &obs.zone);
        self.sweep(now, false);
        self.expire(now, &obs.target, false);
        let cfg = &self.config;
        let t = self
            .state
            .targets
            .get_mut(obs.target.as_str())
            .expect("add_target registered it");
        self.index.apply(&cfg.cause, t, false);
        if t.in_grace {
            if now < t.first_seen + cfg.grace {
                self.index.apply(&cfg.cause, t, true);
                return None;
            }
            t.in_grace = false;
            t.thresholds = Thresholds::new_unknown(cfg.thresholds, now);
        }
        let ok = obs.is_ok();
        t.failures = if ok { 0 } else { t.failures.saturating_add(1) };
        t.thresholds.observe(now, ok);
        if ok && !obs.disputed && t.thresholds.health() == HealthState::Healthy {
            // Recovered: if it fails again later, it may be reported again. Not on a
            // disputed pass: while one prober still sees it failing, it has not
            // recovered, and one prober's stale pass must not re-arm an action.
            t.reported = None;
        }
        if !ok && t.last_ok != Some(false) && t.damper.flap(&cfg.damping, now) {
            self.events.push(GuardEvent::Flapping {
                target: obs.target.clone(),
                penalty: t.damper.penalty(&cfg.damping, now),
            });
        }
        t.last_ok = Some(ok);
        t.in_doubt = ok && obs.disputed;
        if ok {
            t.frozen_with = None;
        }
        t.endpoint_failed = obs.endpoint_failed;
        t.failing_checks.clone_from(&obs.failing_checks);
        self.index.apply(&cfg.cause, t, true);
        self.update_freeze(now);
        if !ok && self.frozen_around(&obs.zone) {
            let t = self
                .state
                .targets
                .get_mut(obs.target.as_str())
                .expect("present");
            t.frozen_with = Some((now, t.failures));
        }
        self.decide(now, &obs.target)
    }

    /// Whether an automatic freeze holds the fleet or `zone`.
    fn frozen_around(&self, zone: &str) -> bool {
        self.state.frozen.iter().any(|f| match &f.scope {
            FreezeScope::Fleet => true,
            FreezeScope::Zone(z) => **z == *zone,
        })
    }

    /// Records one probe like [`SafetyGuard::observe`], and says whether the guard's
    /// state changed. A passing probe of a target that is healthy, passed last time,
    /// has nothing pending (no streak to reset, no flap damping, no hold due) and whose
    /// zone is unchanged changes nothing that any later call could tell apart; it takes
    /// a fast path that touches nothing and returns `(None, false)`. A driver that logs
    /// every call to replay it after a restart may leave such calls out of its log: the
    /// replayed guard ends in the same state (the steady state of a healthy fleet then
    /// logs nothing per probe).
    pub fn observe_changed(&mut self, now: Time, obs: &Observation) -> (Option<Decision>, bool) {
        if self.is_quiet(now, obs) {
            return (None, false);
        }
        (self.observe(now, obs), true)
    }

    /// Whether [`SafetyGuard::observe`] of `obs` would change nothing that matters: see
    /// [`SafetyGuard::observe_changed`]. The only difference is the healthy target's
    /// success streak, which no decision reads once the verdict is healthy.
    fn is_quiet(&self, now: Time, obs: &Observation) -> bool {
        if self.freeze_stale
            || !obs.is_ok()
            || obs.disputed
            || self.index.next_hold_expiry.is_some_and(|n| n <= now)
            || self.alert_due(now)
        {
            return false;
        }
        let Some(t) = self.state.targets.get(obs.target.as_str()) else {
            return false;
        };
        !t.in_grace
            && *t.zone == *obs.zone
            && t.last_ok == Some(true)
            && t.failures == 0
            && !t.endpoint_failed
            && t.failing_checks.is_empty()
            && t.last_signature.is_none()
            && !t.in_doubt
            && t.reported.is_none()
            && !t.damper.is_suppressed()
            && t.thresholds.health() == HealthState::Healthy
            && t.thresholds.consecutive_successes() > 0
    }

    /// Budget tokens left at `now`.
    pub fn budget_left(&self, now: Time) -> u32 {
        self.state.budget.left(&self.config.budget, now)
    }

    /// The guard's overall state at `now`.
    pub fn status(&self, now: Time) -> GuardStatus {
        let mut reasons: Vec<Reason> = Vec::new();
        if let Some(m) = &self.state.manual_freeze {
            reasons.push(Reason::ManualFreeze {
                reason: m.reason.clone(),
            });
        }
        reasons.extend(self.state.frozen.iter().map(|f| self.freeze_reason(f)));
        GuardStatus {
            fleet_frozen: self.state.manual_freeze.is_some()
                || self
                    .state
                    .frozen
                    .iter()
                    .any(|f| f.scope == FreezeScope::Fleet),
            freezes: self.state.frozen.clone(),
            manual_freeze: self.state.manual_freeze.clone(),
            reasons,
            budget_left: self.budget_left(now),
            next_token_at: self.state.budget.next_token_at(&self.config.budget, now),
            unhealthy: self.index.unhealthy,
            total: self.index.total,
        }
    }

    /// A view of one target at `now`.
    pub fn target(&self, now: Time, id: &str) -> Option<GuardTargetView<'_>> {
        let (id, t) = self.state.targets.get_key_value(id)?;
        Some(self.view(now, id, t))
    }

    /// Views of every target at `now`, in id order.
    pub fn targets(&self, now: Time) -> impl Iterator<Item = GuardTargetView<'_>> {
        self.state
            .targets
            .iter()
            .map(move |(id, t)| self.view(now, id, t))
    }

    fn view<'a>(&'a self, now: Time, id: &'a str, t: &'a GuardTarget) -> GuardTargetView<'a> {
        GuardTargetView {
            id,
            zone: &t.zone,
            health: t.thresholds.health(),
            in_grace: t.in_grace,
            last_ok: t.last_ok,
            consecutive_failures: t.failures,
            failing_since: t.thresholds.failing_since(),
            endpoint_failed: t.endpoint_failed,
            failing_checks: &t.failing_checks,
            penalty: t.damper.penalty(&self.config.damping, now),
            flapping: t.damper.is_suppressed(),
            hold: t.hold.as_deref(),
            reported_at: t.reported,
            in_doubt: t.in_doubt,
        }
    }

    // === internals ===

    /// Applies `f` to a target, keeping the index and freezes up to date.
    fn modify(
        &mut self,
        now: Time,
        id: &str,
        f: impl FnOnce(&mut GuardTarget),
    ) -> Result<(), UnknownTarget> {
        let t = self
            .state
            .targets
            .get_mut(id)
            .ok_or_else(|| UnknownTarget(id.to_string()))?;
        self.index.apply(&self.config.cause, t, false);
        f(t);
        self.index.apply(&self.config.cause, t, true);
        self.update_freeze(now);
        Ok(())
    }

    /// Lifts an expired hold and releases a decayed flap penalty on one target.
    fn expire(&mut self, now: Time, id: &str, reindex: bool) {
        let Some(t) = self.state.targets.get_mut(id) else {
            return;
        };
        if t.damper.refresh(&self.config.damping, now) {
            self.events.push(GuardEvent::Stable {
                target: id.to_string(),
            });
        }
        let expired = t
            .hold
            .as_ref()
            .is_some_and(|h| h.until.is_some_and(|u| u <= now));
        if expired || reindex {
            self.index.apply(&self.config.cause, t, false);
            if expired {
                t.hold = None;
            }
            self.index.apply(&self.config.cause, t, true);
        }
    }

    fn exceeds(&self, unhealthy: u32, total: u32) -> bool {
        unhealthy >= self.config.freeze_min_unhealthy
            && f64::from(unhealthy) > self.config.max_unhealthy_fraction * f64::from(total)
    }

    /// Starts and ends automatic freezes from the current counts.
    fn update_freeze(&mut self, now: Time) {
        self.freeze_stale = false;
        let mut want: Vec<(FreezeScope, u32, u32)> = Vec::new();
        if self.exceeds(self.index.unhealthy, self.index.total) {
            want.push((FreezeScope::Fleet, self.index.unhealthy, self.index.total));
        }
        for (zone, &(total, unhealthy, _)) in &self.index.zones {
            if self.exceeds(unhealthy, total) {
                want.push((FreezeScope::Zone(zone.to_string()), unhealthy, total));
            }
        }
        let old = std::mem::take(&mut self.state.frozen);
        for f in &old {
            // A freeze of the zone "" (restored from before targets without a zone
            // were left out of the zones) ends without a word: it never was a zone.
            let nameless = f.scope == FreezeScope::Zone(String::new());
            if !nameless && !want.iter().any(|(s, _, _)| *s == f.scope) {
                let (total, unhealthy) = match &f.scope {
                    FreezeScope::Fleet => (self.index.total, self.index.unhealthy),
                    FreezeScope::Zone(z) => {
                        let (t, u, _) = self
                            .index
                            .zones
                            .get(z.as_str())
                            .copied()
                            .unwrap_or_default();
                        (t, u)
                    }
                };
                self.events.push(GuardEvent::Unfrozen {
                    scope: f.scope.clone(),
                    unhealthy,
                    total,
                });
            }
        }
        let mut frozen = Vec::with_capacity(want.len());
        let alert_after = self.config.frozen.alert_after;
        for (scope, unhealthy, total) in want {
            let before = old.iter().find(|f| f.scope == scope);
            let since = before.map(|f| f.since);
            let f = Freeze {
                scope,
                since: since.unwrap_or(now),
                unhealthy,
                total,
                alerted: before.is_some_and(|f| f.alerted),
            };
            if since.is_none() {
                self.events.push(GuardEvent::Frozen {
                    scope: f.scope.clone(),
                    reason: self.freeze_reason(&f),
                });
            }
            frozen.push(f);
        }
        // Alerts: the fleet's first, and a zone's only when the fleet's has not been
        // raised (a human paged for the whole fleet needs no second page per zone, the
        // same targets and reason once more: the zone's alert counts as raised).
        frozen.sort_by_key(|f| f.scope != FreezeScope::Fleet);
        let mut fleet_alerted = false;
        for f in &mut frozen {
            if !f.alerted && !alert_after.is_zero() && now.since(f.since) >= alert_after {
                f.alerted = true;
                if !fleet_alerted {
                    self.events.push(GuardEvent::FreezeAlert {
                        scope: f.scope.clone(),
                        frozen_for: now.since(f.since),
                        reason: self.freeze_reason(f),
                        action: self.config.frozen.action,
                    });
                }
            }
            fleet_alerted |= f.scope == FreezeScope::Fleet && f.alerted;
        }
        self.state.frozen = frozen;
    }

    /// Whether a freeze in force is due to raise its alert at `now`.
    fn alert_due(&self, now: Time) -> bool {
        let after = self.config.frozen.alert_after;
        !after.is_zero()
            && self
                .state
                .frozen
                .iter()
                .any(|f| !f.alerted && now.since(f.since) >= after)
    }

    fn freeze_reason(&self, f: &Freeze) -> Reason {
        let cap = self.config.max_unhealthy_fraction;
        let cause = &self.config.cause;
        match &f.scope {
            FreezeScope::Fleet => Reason::FleetFrozen {
                unhealthy: f.unhealthy,
                total: f.total,
                cap,
                evidence: FreezeEvidence::from_tally(&self.index.tally, cause),
            },
            FreezeScope::Zone(zone) => Reason::ZoneFrozen {
                zone: zone.clone(),
                unhealthy: f.unhealthy,
                total: f.total,
                cap,
                evidence: self
                    .index
                    .zone_tally
                    .get(zone.as_str())
                    .map(|t| FreezeEvidence::from_tally(t, cause))
                    .unwrap_or_default(),
            },
        }
    }

    /// The decision about a target just observed.
    fn decide(&mut self, now: Time, id: &str) -> Option<Decision> {
        let cfg = &self.config;
        let t = self.state.targets.get(id)?;
        if t.last_ok != Some(false) {
            self.state
                .targets
                .get_mut(id)
                .expect("present")
                .last_signature = None;
            return None;
        }
        let failures = t.failures;
        let failing_for = t
            .thresholds
            .failing_since()
            .map_or(Duration::ZERO, |s| now.since(s));
        let confirmed =
            failures >= cfg.thresholds.unhealthy_threshold && failing_for >= cfg.min_failing;
        let flapping = t.damper.is_suppressed();
        if !confirmed && !flapping {
            return None;
        }
        let causes = cause::attribute(
            &cfg.cause,
            t.endpoint_failed,
            &t.failing_checks,
            &self.index.shared,
        );
        let mut hold: Vec<Reason> = Vec::new();
        match &t.hold {
            Some(h) if h.kind == HoldKind::Maintenance => hold.push(Reason::Maintenance {
                reason: h.reason.clone(),
            }),
            Some(h) => hold.push(Reason::Silenced {
                reason: h.reason.clone(),
            }),
            None => {}
        }
        if let Some(m) = &self.state.manual_freeze {
            hold.push(Reason::ManualFreeze {
                reason: m.reason.clone(),
            });
        }
        let mut freezes: Vec<Reason> = Vec::new();
        // Every scope frozen around this target is partly healthy (see rule 1: never act
        // where everyone is unhealthy).
        let mut partly_healthy = true;
        for f in &self.state.frozen {
            let applies = match &f.scope {
                FreezeScope::Fleet => true,
                FreezeScope::Zone(z) => **z == *t.zone,
            };
            if applies {
                partly_healthy &= f.unhealthy < f.total;
                freezes.push(self.freeze_reason(f));
            }
        }
        // And so is the target's zone, frozen or not: a zone too small to freeze (one
        // counted target, the others in maintenance or grace) whose every target is
        // unhealthy is a scope where everyone is unhealthy too. Found by the invariants'
        // proptest: a fleet freeze acted slowly on the only counted target of its zone.
        if !t.zone.is_empty()
            && let Some(&(zt, zu, _)) = self.index.zones.get(&*t.zone)
        {
            partly_healthy &= zu < zt;
        }
        partly_healthy &= self.index.unhealthy < self.index.total;
        // Above the cap, `act-slowly` may still act on a local, persistent failure.
        let local_persistent = !t.endpoint_failed
            && !t.failing_checks.is_empty()
            && t.failing_checks.iter().all(|c| cfg.cause.is_local(c))
            && failing_for >= cfg.frozen.min_failing;
        let slow_rate = !freezes.is_empty()
            && cfg.frozen.action == WhenFrozen::ActSlowly
            && local_persistent
            && partly_healthy;
        let frozen_reasons = freezes.len();
        hold.extend(freezes);
        // Rule 3, the aftermath: failing under a freeze that has just lifted.
        if frozen_reasons == 0
            && let Some((at, then)) = t.frozen_with
        {
            let own = failures.saturating_sub(then);
            let needs = cfg.thresholds.unhealthy_threshold;
            if own < needs || now.since(at) < cfg.min_failing {
                hold.push(Reason::FreezeAftermath {
                    ago: now.since(at),
                    failures: own,
                    needs,
                    min_failing: cfg.min_failing,
                });
            }
        }
        if !causes.iter().any(Cause::counts) {
            hold.push(Reason::SharedDependency {
                checks: causes
                    .iter()
                    .filter_map(|c| match c {
                        Cause::SharedDependency { check, .. } => Some(check.clone()),
                        _ => None,
                    })
                    .collect(),
            });
        }
        if flapping {
            hold.push(Reason::Flapping {
                penalty: t.damper.penalty(&cfg.damping, now),
                suppress: cfg.damping.suppress,
                reuse: cfg.damping.reuse,
            });
        }
        if let Some(at) = t.reported {
            hold.push(Reason::AlreadyReported { ago: now.since(at) });
        }
        let zone = t.zone.to_string();
        let mut reasons = vec![Reason::Failing {
            failures,
            failing_for,
            causes,
        }];
        // Targets failing together reach the thresholds one probe at a time: before any
        // of them is acted on, the eager count (last probe failed, or in doubt) must be
        // under the cap too, so a freeze that is starting is never raced (rule 2).
        if hold.is_empty() && confirmed {
            let (zt, _, zf) = self.index.zones.get(&*t.zone).copied().unwrap_or_default();
            // How many of them are in doubt: counted only when an action waits.
            let in_doubt = |zone: Option<&str>| {
                let n = self
                    .state
                    .targets
                    .values()
                    .filter(|o| o.in_doubt && o.counted() && zone.is_none_or(|z| *o.zone == *z))
                    .count();
                u32::try_from(n).unwrap_or(u32::MAX)
            };
            if self.exceeds(self.index.failing, self.index.total) {
                hold.push(Reason::PeersFailing {
                    zone: None,
                    failing: self.index.failing,
                    in_doubt: in_doubt(None),
                    total: self.index.total,
                    cap: cfg.max_unhealthy_fraction,
                });
            } else if self.exceeds(zf, zt) {
                hold.push(Reason::PeersFailing {
                    zone: Some(t.zone.to_string()),
                    failing: zf,
                    in_doubt: in_doubt(Some(&t.zone)),
                    total: zt,
                    cap: cfg.max_unhealthy_fraction,
                });
            }
        }
        let budget_cfg = &cfg.budget;
        let slow_cfg = &cfg.frozen.budget();
        // Held only by automatic freezes, and allowed to act slowly through them.
        let slow = slow_rate && hold.len() == frozen_reasons;
        let outcome = if !confirmed {
            // Failing while flapping: reported as flapping, never acted on.
            Outcome::HoldBack
        } else if slow
            && self.state.frozen_budget.left(slow_cfg, now) > 0
            && self.state.budget.left(budget_cfg, now) > 0
        {
            let spent = self.state.frozen_budget.try_spend(slow_cfg, now)
                && self.state.budget.try_spend(budget_cfg, now);
            debug_assert!(spent, "both budgets had a token left");
            reasons.extend(std::mem::take(&mut hold));
            reasons.push(Reason::FrozenSlowRate {
                left: self.state.frozen_budget.left(slow_cfg, now),
                actions: slow_cfg.actions,
                per: slow_cfg.per,
            });
            reasons.push(Reason::BudgetSpent {
                left: self.state.budget.left(budget_cfg, now),
                actions: budget_cfg.actions,
                per: budget_cfg.per,
            });
            Outcome::Act
        } else if hold.is_empty() && self.state.budget.try_spend(budget_cfg, now) {
            reasons.push(Reason::BudgetSpent {
                left: self.state.budget.left(budget_cfg, now),
                actions: budget_cfg.actions,
                per: budget_cfg.per,
            });
            Outcome::Act
        } else {
            if self.state.budget.left(budget_cfg, now) == 0 {
                hold.push(Reason::BudgetExhausted {
                    actions: budget_cfg.actions,
                    per: budget_cfg.per,
                    next_token_in: self
                        .state
                        .budget
                        .next_token_at(budget_cfg, now)
                        .map(|at| at.since(now)),
                });
            }
            Outcome::HoldBack
        };
        reasons.extend(hold);
        let t = self.state.targets.get_mut(id).expect("present");
        if outcome == Outcome::Act {
            t.reported = Some(now);
        }
        let mut signature = outcome.as_str().to_string();
        for r in &reasons {
            signature.push(' ');
            signature.push_str(r.kind());
        }
        let repeated = t.last_signature.as_deref() == Some(signature.as_str());
        t.last_signature = Some(signature.into_boxed_str());
        Some(Decision {
            target: id.to_string(),
            zone,
            at: now,
            outcome,
            reasons,
            repeated,
        })
    }
}

/// The one shared copy of `name` in `set` (added if new).
fn intern(set: &mut BTreeSet<Arc<str>>, name: &str) -> Arc<str> {
    if let Some(n) = set.get(name) {
        return n.clone();
    }
    let n: Arc<str> = Arc::from(name);
    set.insert(n.clone());
    n
}
