//! What the guard decided and why, in words: [`Outcome`], [`Reason`], [`Decision`], the
//! evidence behind a freeze, and [`GuardEvent`]: each with the `Display` drivers log and show.

use super::WhenFrozen;
use super::cause::{Cause, CauseConfig};
use super::state::{FailTally, FreezeScope, is_zero};
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// What the guard decided about a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Report the target for replacement (the driver runs its actuator).
    Act,
    /// Do not act now; the reasons say why.
    HoldBack,
}

impl Outcome {
    /// `act` or `hold_back`, as in metrics labels and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Act => "act",
            Outcome::HoldBack => "hold_back",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Act => "act on",
            Outcome::HoldBack => "hold back",
        })
    }
}

/// One reason in a decision. The first reason of a decision about a failing target is
/// [`Reason::Failing`] (why it is a candidate); the others are why it is held back, or
/// [`Reason::BudgetSpent`] when it is acted on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// The target fails: its streak and what fails.
    Failing {
        /// Consecutive failed probes.
        failures: u32,
        /// Time since the first of them.
        #[serde(with = "humantime_serde")]
        failing_for: Duration,
        /// What fails, attributed.
        causes: Vec<Cause>,
    },
    /// The fleet is frozen: too many targets unhealthy.
    FleetFrozen {
        /// Unhealthy targets.
        unhealthy: u32,
        /// Targets counted.
        total: u32,
        /// The cap, 0..1.
        cap: f64,
        /// What the unhealthy targets fail (absent in records written before it existed).
        #[serde(default)]
        evidence: FreezeEvidence,
    },
    /// The target's zone is frozen: too many of its targets unhealthy.
    ZoneFrozen {
        /// The zone.
        zone: String,
        /// Unhealthy targets in it.
        unhealthy: u32,
        /// Targets counted in it.
        total: u32,
        /// The cap, 0..1.
        cap: f64,
        /// What the unhealthy targets fail (absent in records written before it existed).
        #[serde(default)]
        evidence: FreezeEvidence,
    },
    /// Not frozen, but so many targets fail their last probe right now (counting the
    /// ones not yet unhealthy by the thresholds) that a freeze may be starting: the
    /// action waits for the next probes to tell.
    PeersFailing {
        /// The zone, when it is the zone's count; `None` for the fleet's.
        zone: Option<String>,
        /// Targets failing their last probe (or unhealthy, or in doubt).
        failing: u32,
        /// How many of them are in doubt: no verdict now, their probers disagree or
        /// are silent (absent from decisions stored before it existed: 0).
        #[serde(default, skip_serializing_if = "is_zero")]
        in_doubt: u32,
        /// Targets counted.
        total: u32,
        /// The cap, 0..1.
        cap: f64,
    },
    /// The target failed while its fleet or zone was frozen, and the freeze has just
    /// lifted: its failure is taken for its own only once it has failed again on its
    /// own (`unhealthy_threshold` probes over `min_failing` since), else the last
    /// targets of a shared failure to be seen recovering would be acted on the moment
    /// their peers' recovery lifts the freeze.
    FreezeAftermath {
        /// Time since it last failed under the freeze.
        #[serde(with = "humantime_serde")]
        ago: Duration,
        /// Consecutive failed probes since.
        failures: u32,
        /// Failed probes it needs since (`unhealthy_threshold`).
        needs: u32,
        /// Time it needs since (`min_failing`).
        #[serde(with = "humantime_serde")]
        min_failing: Duration,
    },
    /// The fleet or the target's zone is frozen, but this failure is local and
    /// persistent: acted on at the slow rate (`frozen.action = "act-slowly"`).
    FrozenSlowRate {
        /// Slow-budget tokens left after this action.
        left: u32,
        /// Slow-budget actions per window.
        actions: u32,
        /// The slow budget's window.
        #[serde(with = "humantime_serde")]
        per: Duration,
    },
    /// An operator froze the guard.
    ManualFreeze {
        /// The operator's reason.
        reason: String,
    },
    /// The target is in maintenance.
    Maintenance {
        /// The operator's reason.
        reason: String,
    },
    /// The target is silenced.
    Silenced {
        /// The operator's reason.
        reason: String,
    },
    /// Every failure of the target is attributed to shared dependencies.
    SharedDependency {
        /// The shared dependency checks.
        checks: Vec<String>,
    },
    /// The target flaps: damped, not replaced.
    Flapping {
        /// Its current penalty.
        penalty: u32,
        /// The suppress threshold.
        suppress: u32,
        /// The reuse threshold, below which it is released.
        reuse: u32,
    },
    /// The target was already reported for replacement and has not recovered since.
    AlreadyReported {
        /// Time since it was reported.
        #[serde(with = "humantime_serde")]
        ago: Duration,
    },
    /// No budget token left.
    BudgetExhausted {
        /// Actions per window.
        actions: u32,
        /// The window.
        #[serde(with = "humantime_serde")]
        per: Duration,
        /// Time until a token comes back (none if the budget is 0).
        #[serde(with = "humantime_serde")]
        next_token_in: Option<Duration>,
    },
    /// A budget token was spent on this action.
    BudgetSpent {
        /// Tokens left after it.
        left: u32,
        /// Actions per window.
        actions: u32,
        /// The window.
        #[serde(with = "humantime_serde")]
        per: Duration,
    },
}

impl Reason {
    /// A short stable name of the reason's kind (`failing`, `fleet_frozen`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Reason::Failing { .. } => "failing",
            Reason::FleetFrozen { .. } => "fleet_frozen",
            Reason::ZoneFrozen { .. } => "zone_frozen",
            Reason::FrozenSlowRate { .. } => "frozen_slow_rate",
            Reason::PeersFailing { .. } => "peers_failing",
            Reason::FreezeAftermath { .. } => "freeze_aftermath",
            Reason::ManualFreeze { .. } => "manual_freeze",
            Reason::Maintenance { .. } => "maintenance",
            Reason::Silenced { .. } => "silenced",
            Reason::SharedDependency { .. } => "shared_dependency",
            Reason::Flapping { .. } => "flapping",
            Reason::AlreadyReported { .. } => "already_reported",
            Reason::BudgetExhausted { .. } => "budget_exhausted",
            Reason::BudgetSpent { .. } => "budget_spent",
        }
    }
}

pub(super) fn pct(f: f64) -> String {
    format!("{:.0}%", f * 100.0)
}

pub(super) fn human(d: Duration) -> humantime::FormattedDuration {
    // Milliseconds under a minute, whole seconds above: both read better than nanoseconds.
    if d < Duration::from_secs(60) {
        humantime::format_duration(Duration::from_millis(d.as_millis() as u64))
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs()))
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Failing {
                failures,
                failing_for,
                causes,
            } => {
                write!(
                    f,
                    "{failures} consecutive failed probes over {}",
                    human(*failing_for)
                )?;
                if !causes.is_empty() {
                    let c: Vec<String> = causes.iter().map(ToString::to_string).collect();
                    write!(f, " ({})", c.join(", "))?;
                }
                Ok(())
            }
            Reason::FleetFrozen {
                unhealthy,
                total,
                cap,
                evidence,
            } => {
                write!(
                    f,
                    "fleet-wide failure: {unhealthy}/{total} unhealthy (cap {})",
                    pct(*cap)
                )?;
                evidence.describe(f, *unhealthy, None)
            }
            Reason::ZoneFrozen {
                zone,
                unhealthy,
                total,
                cap,
                evidence,
            } => {
                write!(
                    f,
                    "zone-wide failure in zone {zone}: {unhealthy}/{total} unhealthy (cap {})",
                    pct(*cap)
                )?;
                evidence.describe(f, *unhealthy, Some(zone))
            }
            Reason::PeersFailing {
                zone,
                failing,
                in_doubt,
                total,
                cap,
            } => {
                match zone {
                    Some(z) => write!(f, "{failing}/{total} of zone {z}")?,
                    None => write!(f, "{failing}/{total} of the fleet")?,
                }
                write!(f, " failing right now")?;
                if *in_doubt > 0 {
                    write!(
                        f,
                        " ({in_doubt} of them in doubt: their probers disagree or have no fresh result)"
                    )?;
                }
                write!(
                    f,
                    ", above the cap ({}): waiting for the next probes to tell a shared failure from coincidence",
                    pct(*cap)
                )
            }
            Reason::FreezeAftermath {
                ago,
                failures,
                needs,
                min_failing,
            } => write!(
                f,
                "failed with a frozen fleet or zone until {} ago: acted on only once it fails on its own ({failures} of {needs} probes over {} since)",
                human(*ago),
                human(*min_failing)
            ),
            Reason::FrozenSlowRate { left, actions, per } => write!(
                f,
                "frozen, but this failure is local and persistent: acting at the slow rate ({left} of {actions} per {} left)",
                human(*per)
            ),
            Reason::ManualFreeze { reason } => write!(f, "frozen by an operator: {reason}"),
            Reason::Maintenance { reason } => write!(f, "in maintenance: {reason}"),
            Reason::Silenced { reason } => write!(f, "silenced: {reason}"),
            Reason::SharedDependency { checks } => write!(
                f,
                "failure attributed to shared dependency {}: nobody is replaced for it",
                checks.join(", ")
            ),
            Reason::Flapping {
                penalty,
                suppress,
                reuse,
            } => write!(
                f,
                "flapping: penalty {penalty} reached {suppress} (released below {reuse}); damped, not replaced"
            ),
            Reason::AlreadyReported { ago } => {
                write!(f, "already reported for replacement {} ago", human(*ago))
            }
            Reason::BudgetExhausted {
                actions,
                per,
                next_token_in,
            } => {
                write!(f, "action budget exhausted ({actions} per {})", human(*per))?;
                match next_token_in {
                    Some(d) => write!(f, ", next token in {}", human(*d)),
                    None => Ok(()),
                }
            }
            Reason::BudgetSpent { left, actions, per } => {
                write!(
                    f,
                    "action budget: {left} of {actions} per {} left",
                    human(*per)
                )
            }
        }
    }
}

/// One check failed by some of a freeze's unhealthy targets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckTally {
    /// The check's name.
    pub check: String,
    /// Whether it is one of the host's own checks ([`CauseConfig::local_checks`]).
    pub local: bool,
    /// Unhealthy targets failing it.
    pub targets: u32,
}

/// What the evidence behind a freeze points to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LikelyCause {
    /// Most of the unhealthy targets fail the same dependency check.
    SharedDependency,
    /// Most of them fail as a whole (refused, timed out, a plain 404 or 503): the
    /// network, the checker, its probe path, a zone.
    Unreachable,
    /// Most of them fail local checks at once: a common cause, not independent hosts.
    LocalAtOnce,
    /// No single explanation (or nothing known yet). Defaults to this.
    #[default]
    Mixed,
}

/// What the unhealthy targets of a frozen scope fail, as of the last observation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreezeEvidence {
    /// The checks they fail, most failed first (at most [`EVIDENCE_CHECKS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckTally>,
    /// Checks left out of `checks`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_checks: u32,
    /// Unhealthy targets whose endpoint failed as a whole.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub endpoint_failed: u32,
    /// Unhealthy targets whose last probe passed (recovering).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recovering: u32,
    /// What it points to.
    #[serde(default)]
    pub likely: LikelyCause,
}

/// Most checks named in a freeze's reason.
pub const EVIDENCE_CHECKS: usize = 3;

impl FreezeEvidence {
    /// Builds the evidence from the tallies of one scope.
    pub(super) fn from_tally(tally: &FailTally, cause: &CauseConfig) -> Self {
        let failing = tally.failing;
        let mut checks: Vec<CheckTally> = tally
            .checks
            .iter()
            .map(|(c, &n)| CheckTally {
                check: c.clone(),
                local: cause.is_local(c),
                targets: n,
            })
            .collect();
        // Most failed first; ties by name, so the text is deterministic.
        checks.sort_by(|a, b| b.targets.cmp(&a.targets).then(a.check.cmp(&b.check)));
        let majority = |n: u32| failing > 0 && 2 * n > failing;
        let local_targets = tally.local;
        let likely = match checks.first() {
            Some(c) if !c.local && majority(c.targets) => LikelyCause::SharedDependency,
            _ if majority(tally.endpoint) => LikelyCause::Unreachable,
            _ if majority(local_targets) => LikelyCause::LocalAtOnce,
            _ => LikelyCause::Mixed,
        };
        let more_checks = checks.len().saturating_sub(EVIDENCE_CHECKS) as u32;
        checks.truncate(EVIDENCE_CHECKS);
        FreezeEvidence {
            checks,
            more_checks,
            endpoint_failed: tally.endpoint,
            recovering: tally.recovering,
            likely,
        }
    }

    /// `": 8 of 11 fail disk:free (local), ...; <what it points to>"`.
    pub(super) fn describe(
        &self,
        f: &mut fmt::Formatter<'_>,
        unhealthy: u32,
        zone: Option<&str>,
    ) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        for (i, c) in self.checks.iter().enumerate() {
            let kind = if c.local { "local" } else { "dependency" };
            parts.push(if i == 0 {
                format!("{} of {unhealthy} fail {} ({kind})", c.targets, c.check)
            } else {
                format!("{} fail {} ({kind})", c.targets, c.check)
            });
        }
        if self.more_checks > 0 {
            parts.push(format!("{} more checks", self.more_checks));
        }
        if self.endpoint_failed > 0 {
            parts.push(if parts.is_empty() {
                format!("{} of {unhealthy} fail as a whole", self.endpoint_failed)
            } else {
                format!("{} fail as a whole", self.endpoint_failed)
            });
        }
        if self.recovering > 0 {
            parts.push(format!("{} recovering", self.recovering));
        }
        if !parts.is_empty() {
            write!(f, ": {}", parts.join(", "))?;
        }
        let shared = self
            .checks
            .first()
            .map(|c| c.check.as_str())
            .unwrap_or_default();
        match (self.likely, zone) {
            (LikelyCause::SharedDependency, _) => {
                write!(f, "; likely the shared dependency {shared}")
            }
            (LikelyCause::Unreachable, None) => f.write_str(
                "; most fail as a whole (no answer, or a failing answer naming no check): likely the network, the checker itself, or a probe path they do not serve (their probes say which)",
            ),
            (LikelyCause::Unreachable, Some(_)) => f.write_str(
                "; most fail as a whole (no answer, or a failing answer naming no check): likely a zone outage or a network partition",
            ),
            (LikelyCause::LocalAtOnce, _) => f.write_str(
                "; most fail local checks at once: a common cause (a deploy, a config, a load pattern), not a shared dependency",
            ),
            (LikelyCause::Mixed, _) => f.write_str("; no single cause"),
        }
    }
}

/// A decision about one candidate, with every reason for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The target.
    pub target: String,
    /// Its zone.
    pub zone: String,
    /// When it was decided.
    pub at: Time,
    /// Act or hold back.
    pub outcome: Outcome,
    /// Why: [`Reason::Failing`] first, then the reasons for holding back (or the budget
    /// spent on acting).
    pub reasons: Vec<Reason>,
    /// True when the previous decision about this target had the same outcome and the
    /// same kinds of reason: drivers may skip recording it.
    pub repeated: bool,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.outcome, self.target)?;
        if !self.zone.is_empty() {
            write!(f, " (zone {})", self.zone)?;
        }
        let r: Vec<String> = self.reasons.iter().map(ToString::to_string).collect();
        write!(f, ": {}", r.join("; "))
    }
}

/// A guard-level change, for drivers to log.
#[derive(Clone, Debug, PartialEq)]
pub enum GuardEvent {
    /// A freeze started; the reason says why.
    Frozen {
        /// What is frozen.
        scope: FreezeScope,
        /// [`Reason::FleetFrozen`] or [`Reason::ZoneFrozen`].
        reason: Reason,
    },
    /// A freeze ended (the fraction dropped back).
    Unfrozen {
        /// What was frozen.
        scope: FreezeScope,
        /// Unhealthy targets now.
        unhealthy: u32,
        /// Targets counted now.
        total: u32,
    },
    /// A freeze has lasted `frozen.alert_after`: a human should decide (raised once per
    /// freeze).
    FreezeAlert {
        /// What is frozen.
        scope: FreezeScope,
        /// How long it has been frozen.
        frozen_for: Duration,
        /// Why, as of now.
        reason: Reason,
        /// What the guard does meanwhile.
        action: WhenFrozen,
    },
    /// An operator froze the guard.
    ManualFreeze {
        /// Why.
        reason: String,
    },
    /// An operator lifted the manual freeze.
    ManualUnfreeze,
    /// A target started flapping (suppressed).
    Flapping {
        /// The target.
        target: String,
        /// Its penalty.
        penalty: u32,
    },
    /// A flapping target was released (its penalty decayed below reuse).
    Stable {
        /// The target.
        target: String,
    },
}

impl fmt::Display for GuardEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GuardEvent::Frozen { scope, reason } => write!(f, "{scope} frozen: {reason}"),
            GuardEvent::Unfrozen {
                scope,
                unhealthy,
                total,
            } => write!(f, "{scope} unfrozen: {unhealthy}/{total} unhealthy"),
            GuardEvent::FreezeAlert {
                scope,
                frozen_for,
                reason,
                action,
            } => {
                let doing = match action {
                    WhenFrozen::Hold => "the guard acts on no one",
                    WhenFrozen::ActSlowly => {
                        "the guard acts only on local, persistent failures, slowly"
                    }
                };
                write!(
                    f,
                    "ALERT: {scope} frozen for {}: {reason}; {doing}: a human must decide",
                    human(*frozen_for)
                )
            }
            GuardEvent::ManualFreeze { reason } => write!(f, "frozen by an operator: {reason}"),
            GuardEvent::ManualUnfreeze => f.write_str("operator freeze lifted"),
            GuardEvent::Flapping { target, penalty } => {
                write!(f, "{target} is flapping (penalty {penalty}): damped")
            }
            GuardEvent::Stable { target } => write!(f, "{target} stopped flapping"),
        }
    }
}
