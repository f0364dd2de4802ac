//! The rollout policy: deploy a revision in health-gated waves, roll back when it is bad.
//!
//! [`Rollout`] is a sans-IO state machine that `vigil deploy` and the simulator drive. It
//! never touches a host: [`Rollout::poll`] returns [`Command`]s (drain this host, install
//! this revision with this idempotency key, undrain, alert) and the driver feeds back what
//! happened ([`Rollout::drained`], [`Rollout::installed`], [`Rollout::report`],
//! [`Rollout::sample`]). Its whole state is serialisable, so a driver that persists it
//! after every step resumes after a crash without skipping or repeating a host (each
//! install carries an idempotency key per host and revision).
//!
//! # The rules
//!
//! 1. **The floor.** At least `min_healthy` hosts (a count, or a percentage of the fleet
//!    rounded up; default 75%) stay in service at every moment. A wave takes at most
//!    `fleet - floor - (hosts already unhealthy or held by the guard)` hosts, capped by
//!    `max_wave`; when that is zero the rollout *holds* and says why, it never dips below
//!    the floor. By default a wave stays within one zone (`zones = "one-at-a-time"`).
//!    Held hosts are never touched while held. The driver tells the policy what the
//!    controller holds ([`Rollout::held`]); when it cannot read the controller it says so
//!    ([`Rollout::controller_view`]) and no new wave starts until it can: an unreadable
//!    signal fails closed, as CodeDeploy's unreadable alarms do (a wave in progress still
//!    finishes its report-back and bake, and a rollback still runs).
//! 2. **Report-back.** A host is drained, installed, and must then *report back*: its
//!    health answer shows the new revision and passes. The `progress_deadline` (default
//!    10 minutes, from the drain) **acts**: a host that has not reported back by then fails
//!    its wave, and the rollout rolls back (Kubernetes' `progressDeadlineSeconds` only sets
//!    a condition: kubernetes #23211).
//! 3. **Bake and verdict.** Once every host of a wave reported back, the wave bakes for
//!    `bake` (default 5 minutes). During the bake a new host that turns unhealthy fails
//!    the wave at once. What the verdict weighs depends on the evidence the driver has
//!    ([`Evidence`], [`Rollout::judge_by`]):
//!    - **The balancer's request counts** ([`Evidence::BalancerRequests`], fed by
//!      [`Rollout::outcomes`]): the new hosts' errors and requests summed over the wave
//!      against the old-revision hosts' over the same window, every request one trial
//!      (a host weighs what it served: slow start gives a just-returned host little
//!      traffic, and little weight). A one-sided SPRT on the error counts
//!      ([`requests`]: H0 the old rate, H1 the old rate plus `min_effect`, errors of
//!      both kinds `alpha` and `beta`) **fails** the wave as soon as it is reached, even
//!      during the bake; it **passes** once the bake is over; in between it is
//!      **inconclusive: needs N more requests**. New hosts whose error rate is above
//!      `max_error_rate` beyond doubt (a Wilson bound at `1 - alpha`) fail at once too.
//!      The last wave has no old host left: it is compared with the old hosts' counts of
//!      the last wave judged, and says so (only a rollout without any old host is held to
//!      `max_error_rate` alone).
//!    - **The hosts' own samples** ([`Evidence::HostSamples`], the default, fed by
//!      [`Rollout::sample`]; the fallback when no balancer is read): new hosts whose mean
//!      sample exceeds `max_error_rate` fail at once; after the bake the new hosts'
//!      samples are compared with the old hosts' of the same window by a one-sided
//!      Mann-Whitney U test (Kayenta's choice): **Fail** when worse with p < `alpha`
//!      *and* by at least `min_effect` (difference of medians); **Pass** with
//!      `min_samples` per side (default 50, Kayenta's minimum) that is not a fail. With
//!      sparse traffic most samples see no error and the medians tie at 0: prefer the
//!      balancer's counts.
//!
//!    **Inconclusive** *holds* the rollout and says so (never a pass, never a fail: Argo
//!    #3015/#3850; Flagger counts no data as failure, flagger #1035). A held rollout is
//!    re-judged as data arrives, and a human can [`approve`](Rollout::approve) or
//!    [`abort`](Rollout::abort) it. With host samples and no old host left (the last
//!    wave), the verdict rests on the fixed limit and the sample count alone, and says
//!    so; the last host failing still fails the rollout (aws-cdk #6575).
//! 4. **Rollback is latched.** A failed wave marks the revision *bad*: it is never
//!    deployed again until a human [`clears`](Rollout::clear_bad) it, and a new rollout of it
//!    is refused. The rollback reinstalls the previous revision on every host that got the
//!    bad one (a host back in service, one that reported back and was undrained, is
//!    drained again first), through the same waves and the same floor; nothing redeploys by itself
//!    afterwards, so deploy <-> rollback cycles (keel #1485) cannot happen. A rollback
//!    that itself fails stops and raises an alert: a human decides.
//! 5. **Everything explained.** Every decision is appended to [`Rollout::decisions`] with
//!    its values, thresholds, sample sizes and test statistic.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use vigil_core::Time;
//! use vigil_core::rollout::{Command, HostSpec, Rollout, RolloutConfig, Phase};
//!
//! let hosts: Vec<HostSpec> = (0..4).map(|i| HostSpec::new(format!("web-{i}"), "a", "v1")).collect();
//! let config = RolloutConfig { bake: Duration::ZERO, min_samples: 0, ..RolloutConfig::default() };
//! let mut r = Rollout::start(config, hosts, "v2", Time::ZERO).unwrap();
//! let mut now = Time::ZERO;
//! while !r.is_finished() {
//!     now = now + Duration::from_secs(1);
//!     for c in r.poll(now) {
//!         match c {
//!             Command::Drain { host } => r.drained(now, &host),
//!             Command::Install { host, revision, .. } => {
//!                 r.installed(now, &host, Ok(()));
//!                 r.report(now, &host, &revision, true);
//!             }
//!             _ => {}
//!         }
//!     }
//! }
//! assert_eq!(r.phase(), &Phase::Completed);
//! ```

use crate::invalid::Invalid;
use crate::time::Time;
pub use requests::{Decision, ErrorSprt, FixedLimit, RequestCounts, SprtResult};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

/// Default floor: 75% of the fleet stays in service (waves of a quarter at most).
pub const DEFAULT_MIN_HEALTHY: Floor = Floor::Percent(75);
/// Default progress deadline per host, from drain to report-back: 10 minutes.
pub const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(600);
/// Default bake time per wave: 5 minutes.
pub const DEFAULT_BAKE: Duration = Duration::from_secs(300);
/// Default fixed limit on the new hosts' mean error rate during the bake: 5%.
pub const DEFAULT_MAX_ERROR_RATE: f64 = 0.05;
/// Default minimum samples per side for a verdict: 50 (Kayenta's minimum per metric).
pub const DEFAULT_MIN_SAMPLES: usize = 50;
/// Default minimum effect (difference of medians) for a failing comparison: 0.01.
pub const DEFAULT_MIN_EFFECT: f64 = 0.01;
/// Default significance of the comparison: 0.05 (one-sided).
pub const DEFAULT_ALPHA: f64 = 0.05;
/// Default chance of passing a wave worse by `min_effect` under the request-weighted
/// test: 0.05. As small as `alpha`: passing a bad wave costs the next waves' clients,
/// while failing a good one costs a redeploy; at the default `min_effect` it takes
/// about 300 error-free requests on the new hosts to pass against an error-free
/// baseline (seconds of traffic for a web fleet).
pub const DEFAULT_BETA: f64 = 0.05;

/// The minimum number of hosts in service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Floor {
    /// This many hosts.
    Count(usize),
    /// This percentage of the fleet, rounded up.
    Percent(u8),
}

impl Floor {
    /// The floor for a fleet of `n` hosts.
    pub fn of(self, n: usize) -> usize {
        match self {
            Floor::Count(c) => c.min(n),
            Floor::Percent(p) => (n * usize::from(p)).div_ceil(100),
        }
    }
}

impl Serialize for Floor {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Floor::Count(c) => s.serialize_u64(*c as u64),
            Floor::Percent(p) => s.serialize_str(&format!("{p}%")),
        }
    }
}

impl<'de> Deserialize<'de> for Floor {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Count(c) => Ok(Floor::Count(c as usize)),
            Raw::Text(t) => t
                .strip_suffix('%')
                .and_then(|p| p.trim().parse::<u8>().ok())
                .filter(|p| *p <= 100)
                .map(Floor::Percent)
                .ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "expected a host count (8) or a percentage (\"75%\"), got {t:?}"
                    ))
                }),
        }
    }
}

impl fmt::Display for Floor {
    /// As the config writes it: `8` or `75%`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Floor::Count(c) => write!(f, "{c}"),
            Floor::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl fmt::Display for Zones {
    /// As the config writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Zones::OneAtATime => "one-at-a-time",
            Zones::Any => "any",
        })
    }
}

/// How waves treat zones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Zones {
    /// A wave never spans two zones (a bad revision takes out at most part of one zone).
    #[default]
    OneAtATime,
    /// Waves ignore zones.
    Any,
}

/// The rollout's settings. Every field has a default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutConfig {
    /// Hosts that stay in service: a count or a percentage (`"75%"`). Defaults to 75%.
    pub min_healthy: Floor,
    /// Largest wave, whatever the floor allows (0 = no cap). Defaults to 0.
    pub max_wave: usize,
    /// Waves within one zone, or across zones. Defaults to one zone at a time.
    pub zones: Zones,
    /// Per host, from drain to report-back. Defaults to 10 minutes.
    #[serde(with = "humantime_serde")]
    pub progress_deadline: Duration,
    /// Bake time per wave. Defaults to 5 minutes.
    #[serde(with = "humantime_serde")]
    pub bake: Duration,
    /// Fixed limit on the new hosts' mean sample (error rate) during the bake. Defaults to
    /// 0.05.
    pub max_error_rate: f64,
    /// Samples needed per side for a verdict. Defaults to 50.
    pub min_samples: usize,
    /// Smallest worsening (new - old) that fails a wave: of error rates under the
    /// balancer's counts (the SPRT's H1), of medians under host samples. Defaults to
    /// 0.01.
    pub min_effect: f64,
    /// Significance of the one-sided comparison. Defaults to 0.05.
    pub alpha: f64,
    /// Under the balancer's counts: the chance of passing a wave worse by `min_effect`.
    /// Defaults to 0.05.
    pub beta: f64,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            min_healthy: DEFAULT_MIN_HEALTHY,
            max_wave: 0,
            zones: Zones::OneAtATime,
            progress_deadline: DEFAULT_PROGRESS_DEADLINE,
            bake: DEFAULT_BAKE,
            max_error_rate: DEFAULT_MAX_ERROR_RATE,
            min_samples: DEFAULT_MIN_SAMPLES,
            min_effect: DEFAULT_MIN_EFFECT,
            alpha: DEFAULT_ALPHA,
            beta: DEFAULT_BETA,
        }
    }
}

impl RolloutConfig {
    /// Checks the values; the error starts with the bad key.
    pub fn validate(&self) -> Result<(), Invalid> {
        if let Floor::Percent(p) = self.min_healthy
            && p > 100
        {
            return Err(Invalid::new(
                "min_healthy",
                format!("must be at most 100%, got {p}%"),
            ));
        }
        if self.progress_deadline.is_zero() {
            return Err(Invalid::new("progress_deadline", "must be longer than 0s"));
        }
        if !(self.max_error_rate.is_finite() && (0.0..=1.0).contains(&self.max_error_rate)) {
            return Err(Invalid::new(
                "max_error_rate",
                format!("must be in [0, 1], got {}", self.max_error_rate),
            ));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0 && self.alpha < 1.0) {
            return Err(Invalid::new(
                "alpha",
                format!("must be in (0, 1), got {}", self.alpha),
            ));
        }
        if !(self.beta.is_finite() && self.beta > 0.0 && self.beta < 1.0 - self.alpha) {
            return Err(Invalid::new(
                "beta",
                format!("must be in (0, 1 - alpha), got {}", self.beta),
            ));
        }
        if !(self.min_effect.is_finite() && self.min_effect >= 0.0) {
            return Err(Invalid::new(
                "min_effect",
                format!("must be at least 0, got {}", self.min_effect),
            ));
        }
        Ok(())
    }
}

/// A host as the rollout starts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostSpec {
    /// Its id.
    pub id: String,
    /// Its zone.
    pub zone: String,
    /// The revision it runs.
    pub revision: String,
    /// Whether it is healthy now.
    pub healthy: bool,
    /// Whether the controller's guard holds it (silenced, in maintenance, reported).
    pub held: bool,
}

impl HostSpec {
    /// A healthy, unheld host.
    pub fn new(
        id: impl Into<String>,
        zone: impl Into<String>,
        revision: impl Into<String>,
    ) -> Self {
        HostSpec {
            id: id.into(),
            zone: zone.into(),
            revision: revision.into(),
            healthy: true,
            held: false,
        }
    }
}

/// What the driver could read of the controller's view of the hosts this round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControllerView {
    /// Read: these hosts are held (the controller holds, quarantines or judges them
    /// unhealthy); every other host is not.
    Read {
        /// The held hosts.
        held: BTreeSet<String>,
    },
    /// Could not be read (why, in words): no new wave starts (fail closed).
    Unreadable(String),
}

/// What the driver must do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Command {
    /// Take the host out of service gracefully (lame duck); answer with
    /// [`Rollout::drained`].
    Drain {
        /// The host.
        host: String,
    },
    /// Install `revision`; answer with [`Rollout::installed`]. Repeating a command with
    /// the same key must not install twice.
    Install {
        /// The host.
        host: String,
        /// The revision.
        revision: String,
        /// Idempotency key: rollout id, host and revision.
        key: String,
    },
    /// Put the host back in service.
    Undrain {
        /// The host.
        host: String,
    },
    /// Something a human must look at.
    Alert {
        /// Why.
        reason: String,
    },
}

/// Where one host is in the rollout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum HostStep {
    /// Not touched yet.
    Pending,
    /// Drain asked.
    Draining {
        /// Since when (the progress deadline counts from here).
        since: Time,
    },
    /// Install asked.
    Installing {
        /// Since the drain.
        since: Time,
    },
    /// Installed; waiting for the host to report back.
    AwaitingReport {
        /// Since the drain.
        since: Time,
    },
    /// Reported back with the revision, passing.
    Done {
        /// When.
        at: Time,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Host {
    zone: String,
    /// What it runs, as last reported (or as it was at the start).
    revision: String,
    healthy: bool,
    held: bool,
    step: HostStep,
    /// Samples (e.g. error rate per interval) with their time.
    samples: Vec<(Time, f64)>,
    /// The balancer's counts per interval between two reads: (from, to, counts).
    #[serde(default)]
    outcomes: Vec<(Time, Time, RequestCounts)>,
    /// The last cumulative counts read and when.
    #[serde(default)]
    counted: Option<(Time, RequestCounts)>,
}

/// What the verdict weighs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Evidence {
    /// The hosts' own samples ([`Rollout::sample`]): the host-reported rule.
    #[default]
    HostSamples,
    /// The balancer's request counts per host ([`Rollout::outcomes`]).
    BalancerRequests,
}

/// Where the rollout is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// Deploying wave `wave` (0-based) of the target revision.
    Deploying {
        /// Wave index.
        wave: usize,
    },
    /// Every host of the wave reported back; baking since `since`.
    Baking {
        /// Wave index.
        wave: usize,
        /// Bake start.
        since: Time,
    },
    /// Waiting: the floor leaves no room, or the verdict is inconclusive.
    Held {
        /// Wave index.
        wave: usize,
        /// Why.
        reason: String,
    },
    /// Every host runs the revision.
    Completed,
    /// Reinstalling the previous revision.
    RollingBack {
        /// Why the rollout failed.
        reason: String,
    },
    /// Every host that got the bad revision runs the previous one again.
    RolledBack {
        /// Why the rollout failed.
        reason: String,
    },
    /// The rollback itself failed: stopped, a human decides.
    RollbackFailed {
        /// Why.
        reason: String,
    },
    /// Stopped by a human.
    Aborted {
        /// Why.
        reason: String,
    },
}

/// A wave's verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum WaveVerdict {
    /// Proceed.
    Pass,
    /// Roll back.
    Fail,
    /// Not enough data: hold.
    Inconclusive {
        /// About how many more requests on the new hosts decide it (more samples per
        /// side under host samples).
        needs: u64,
    },
}

/// The comparison behind a verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Samples of the new hosts in the window.
    pub new_samples: usize,
    /// Samples of the old-revision hosts in the window.
    pub old_samples: usize,
    /// Median of the new hosts' samples.
    pub new_median: f64,
    /// Median of the old hosts' samples (0 without any).
    pub old_median: f64,
    /// Mann-Whitney U of the new hosts (None without old samples).
    pub u: Option<f64>,
    /// One-sided p-value that the new hosts are worse (None without old samples).
    pub p_value: Option<f64>,
}

/// One explained decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutDecision {
    /// When.
    pub at: Time,
    /// What, in words with the values.
    pub what: String,
}

/// The rollout's whole state (serialisable).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rollout {
    config: RolloutConfig,
    id: String,
    revision: String,
    /// What each host ran before (the rollback target), by host.
    previous: BTreeMap<String, String>,
    hosts: BTreeMap<String, Host>,
    phase: Phase,
    /// Hosts of the current wave.
    wave_hosts: Vec<String>,
    /// Waves started so far.
    waves: usize,
    /// Revisions marked bad (latched).
    bad: BTreeSet<String>,
    decisions: Vec<RolloutDecision>,
    /// Commands produced but not yet taken by `poll`.
    #[serde(default)]
    outbox: Vec<Command>,
    /// Why the controller's view cannot be read now (None: it can, or none is used).
    #[serde(default)]
    unreadable: Option<String>,
    /// The hosts of every wave started, in order (a rollback's reinstall is not a wave).
    #[serde(default)]
    wave_log: Vec<Vec<String>>,
    /// What the verdict weighs.
    #[serde(default)]
    evidence: Evidence,
    /// The old hosts' counts in the last wave judged against them (wave index, counts):
    /// the last wave's baseline.
    #[serde(default)]
    baseline: Option<(usize, RequestCounts)>,
}

/// One host of a rollout as it stands (for display: the dashboard, `status`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RolloutHost<'a> {
    /// Its id.
    pub id: &'a str,
    /// Its zone.
    pub zone: &'a str,
    /// What it runs, as last reported.
    pub revision: &'a str,
    /// What it ran before the rollout (a rollback's target).
    pub previous: &'a str,
    /// Serving, as last reported.
    pub healthy: bool,
    /// Held by the controller.
    pub held: bool,
    /// Where it is.
    pub step: &'a HostStep,
    /// Samples taken.
    pub samples: usize,
}

/// Why a rollout cannot start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// The revision was marked bad by an earlier rollback.
    #[error("revision {0} is marked bad by an earlier rollback; clear it first (a human decision)")]
    Bad(String),
    /// No host to deploy to.
    #[error("no hosts to deploy to")]
    NoHosts,
    /// The config is invalid.
    #[error("{0}")]
    Config(#[from] crate::invalid::Invalid),
}

impl Rollout {
    /// Starts a rollout of `revision` to `hosts` (hosts already on it are left alone).
    pub fn start(
        config: RolloutConfig,
        hosts: Vec<HostSpec>,
        revision: &str,
        now: Time,
    ) -> Result<Rollout, StartError> {
        Self::start_with_bad(config, hosts, revision, now, BTreeSet::new())
    }

    /// Like [`Rollout::start`], carrying the bad revisions a previous rollout latched.
    pub fn start_with_bad(
        config: RolloutConfig,
        hosts: Vec<HostSpec>,
        revision: &str,
        now: Time,
        bad: BTreeSet<String>,
    ) -> Result<Rollout, StartError> {
        let held = BTreeSet::new();
        Self::start_seeing(
            config,
            hosts,
            revision,
            now,
            bad,
            ControllerView::Read { held },
        )
    }

    /// Like [`Rollout::start_with_bad`], with what the driver could read of the
    /// controller at the start: hosts it holds are held (as well as those whose
    /// [`HostSpec::held`] says so); unreadable, the first wave is held (fail closed).
    pub fn start_seeing(
        config: RolloutConfig,
        hosts: Vec<HostSpec>,
        revision: &str,
        now: Time,
        bad: BTreeSet<String>,
        view: ControllerView,
    ) -> Result<Rollout, StartError> {
        config.validate().map_err(StartError::Config)?;
        let (view_held, unreadable) = match view {
            ControllerView::Read { held } => (held, None),
            ControllerView::Unreadable(why) => (BTreeSet::new(), Some(why)),
        };
        if bad.contains(revision) {
            return Err(StartError::Bad(revision.to_string()));
        }
        if hosts.is_empty() {
            return Err(StartError::NoHosts);
        }
        let previous = hosts
            .iter()
            .map(|h| (h.id.clone(), h.revision.clone()))
            .collect();
        let hosts: BTreeMap<String, Host> = hosts
            .into_iter()
            .map(|h| {
                let step = if h.revision == revision {
                    HostStep::Done { at: now }
                } else {
                    HostStep::Pending
                };
                let held = h.held || view_held.contains(&h.id);
                (
                    h.id,
                    Host {
                        zone: h.zone,
                        revision: h.revision,
                        healthy: h.healthy,
                        held,
                        step,
                        samples: Vec::new(),
                        outcomes: Vec::new(),
                        counted: None,
                    },
                )
            })
            .collect();
        let mut r = Rollout {
            id: format!("{revision}@{}", now.as_elapsed().as_millis()),
            config,
            revision: revision.to_string(),
            previous,
            hosts,
            phase: Phase::Deploying { wave: 0 },
            wave_hosts: Vec::new(),
            waves: 0,
            bad,
            decisions: Vec::new(),
            outbox: Vec::new(),
            unreadable,
            wave_log: Vec::new(),
            evidence: Evidence::HostSamples,
            baseline: None,
        };
        let n = r.hosts.len();
        let floor = r.config.min_healthy.of(n);
        r.decide(
            now,
            format!(
                "rollout of {revision} to {n} hosts; floor {floor} in service (min_healthy {}), zones {}",
                r.config.min_healthy, r.config.zones
            ),
        );
        r.start_wave(now);
        Ok(r)
    }

    /// The rollout's id (`revision@start ms`): the prefix of its idempotency keys.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The revision being deployed.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// Where it is.
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Every decision so far, oldest first.
    pub fn decisions(&self) -> &[RolloutDecision] {
        &self.decisions
    }

    /// Revisions marked bad.
    pub fn bad_revisions(&self) -> &BTreeSet<String> {
        &self.bad
    }

    /// A host's step.
    pub fn host_step(&self, host: &str) -> Option<&HostStep> {
        self.hosts.get(host).map(|h| &h.step)
    }

    /// Hosts of the current wave.
    pub fn wave_hosts(&self) -> &[String] {
        &self.wave_hosts
    }

    /// The hosts of every wave started so far, in order.
    pub fn waves(&self) -> &[Vec<String>] {
        &self.wave_log
    }

    /// Every host as it stands, by id.
    pub fn hosts(&self) -> impl Iterator<Item = RolloutHost<'_>> {
        self.hosts.iter().map(|(id, h)| RolloutHost {
            id,
            zone: &h.zone,
            revision: &h.revision,
            previous: self.previous.get(id).map_or("", String::as_str),
            healthy: h.healthy,
            held: h.held,
            step: &h.step,
            samples: h.samples.len(),
        })
    }

    /// Why the controller cannot be read now, if it cannot.
    pub fn controller_unreadable(&self) -> Option<&str> {
        self.unreadable.as_deref()
    }

    /// True when nothing more will happen without a human.
    pub fn is_finished(&self) -> bool {
        matches!(
            self.phase,
            Phase::Completed
                | Phase::RolledBack { .. }
                | Phase::RollbackFailed { .. }
                | Phase::Aborted { .. }
        )
    }

    /// Hosts out of service now: draining, installing, awaiting report, unhealthy or held.
    pub fn out_of_service(&self) -> usize {
        self.hosts.values().filter(|h| out(h)).count()
    }

    /// The floor for this fleet.
    pub fn floor(&self) -> usize {
        self.config.min_healthy.of(self.hosts.len())
    }

    /// Clears a bad mark (a human decision); a new rollout of it may then start.
    pub fn clear_bad(&mut self, now: Time, revision: &str) {
        if self.bad.remove(revision) {
            self.decide(
                now,
                format!("revision {revision} cleared by a human: it may be deployed again"),
            );
        }
    }

    /// A human approves a held (inconclusive) wave: it passes.
    pub fn approve(&mut self, now: Time) {
        if let Phase::Held { wave, .. } = self.phase
            && self
                .wave_hosts
                .iter()
                .all(|h| matches!(self.hosts[h].step, HostStep::Done { .. }))
        {
            self.decide(now, format!("wave {} approved by a human", wave + 1));
            self.next_wave(now);
        }
    }

    /// A human aborts: nothing more is started (hosts mid-install finish their step).
    pub fn abort(&mut self, now: Time, reason: &str) {
        if !self.is_finished() {
            self.decide(now, format!("aborted by a human: {reason}"));
            self.phase = Phase::Aborted {
                reason: reason.to_string(),
            };
        }
    }

    /// The host finished draining.
    pub fn drained(&mut self, now: Time, host: &str) {
        let Some(revision) = self.want(host) else {
            return;
        };
        if let Some(h) = self.hosts.get_mut(host)
            && let HostStep::Draining { since } = h.step
        {
            h.step = HostStep::Installing { since };
            let key = match self.phase {
                Phase::RollingBack { .. } => format!("{}:{host}:rollback:{revision}", self.id),
                _ => format!("{}:{host}:{revision}", self.id),
            };
            self.outbox.push(Command::Install {
                host: host.to_string(),
                revision,
                key,
            });
        }
        self.advance(now);
    }

    /// The install finished (`Err` with the installer's message).
    pub fn installed(&mut self, now: Time, host: &str, result: Result<(), String>) {
        match result {
            Ok(()) => {
                if let Some(h) = self.hosts.get_mut(host)
                    && let HostStep::Installing { since } = h.step
                {
                    h.step = HostStep::AwaitingReport { since };
                }
                self.advance(now);
            }
            Err(why) => {
                if matches!(self.phase, Phase::RollingBack { .. }) {
                    self.rollback_failed(
                        now,
                        format!("reinstalling the previous revision on {host} failed: {why}"),
                    );
                } else {
                    self.fail(
                        now,
                        format!("install of {} on {host} failed: {why}", self.revision),
                    );
                }
            }
        }
    }

    /// A host's health answer: the revision it reports and whether it passes.
    pub fn report(&mut self, now: Time, host: &str, revision: &str, healthy: bool) {
        let Some(want) = self.want(host) else { return };
        let Some(h) = self.hosts.get_mut(host) else {
            return;
        };
        h.revision = revision.to_string();
        h.healthy = healthy;
        if let HostStep::AwaitingReport { .. } = h.step
            && revision == want
            && healthy
        {
            h.step = HostStep::Done { at: now };
            self.outbox.push(Command::Undrain {
                host: host.to_string(),
            });
            self.decide(
                now,
                format!("{host} reported back: revision {revision}, passing"),
            );
        }
        self.advance(now);
    }

    /// The guard holds or releases a host (the controller holds it, quarantines it or
    /// judges it unhealthy): a held host counts as out of service and is not touched.
    /// Returns true when the hold changed.
    pub fn held(&mut self, now: Time, host: &str, held: bool) -> bool {
        let changed = match self.hosts.get_mut(host) {
            Some(h) if h.held != held => {
                h.held = held;
                true
            }
            _ => false,
        };
        if changed {
            self.decide_hold(now, host, held);
        }
        self.advance(now);
        changed
    }

    /// What the driver read of the controller this round: every host's hold at once
    /// (then one step, so no wave starts on half of them), or that it could not be
    /// read, which starts no new wave until it is read again (said once, with why; the
    /// holds stay as last read).
    pub fn controller_view(&mut self, now: Time, view: ControllerView) {
        match view {
            ControllerView::Read { held } => {
                let changed: Vec<(String, bool)> = self
                    .hosts
                    .iter_mut()
                    .filter_map(|(id, h)| {
                        let want = held.contains(id);
                        (h.held != want).then(|| {
                            h.held = want;
                            (id.clone(), want)
                        })
                    })
                    .collect();
                for (id, held) in changed {
                    self.decide_hold(now, &id, held);
                }
                if self.unreadable.take().is_some() {
                    self.decide(now, "the controller can be read again".to_string());
                }
            }
            ControllerView::Unreadable(why) => self.unreadable = Some(why),
        }
        self.advance(now);
    }

    fn decide_hold(&mut self, now: Time, host: &str, held: bool) {
        self.decide(
            now,
            format!(
                "{host} {} by the controller",
                if held {
                    "held (out of service, not touched)"
                } else {
                    "released"
                }
            ),
        );
    }

    /// Whether the host is held by the controller now.
    pub fn is_held(&self, host: &str) -> bool {
        self.hosts.get(host).is_some_and(|h| h.held)
    }

    /// A sample (e.g. the host's error rate over the last interval, 0..1).
    pub fn sample(&mut self, now: Time, host: &str, value: f64) {
        if let Some(h) = self.hosts.get_mut(host)
            && value.is_finite()
        {
            h.samples.push((now, value));
        }
    }

    /// What the verdict weighs from now on (said once when it changes). The driver that
    /// reads a balancer's counts says [`Evidence::BalancerRequests`] before it feeds
    /// them; without one the host-reported rule stays.
    pub fn judge_by(&mut self, now: Time, evidence: Evidence) {
        if self.evidence != evidence {
            self.evidence = evidence;
            self.decide(now, format!("verdicts weigh {}", evidence_words(evidence)));
        }
    }

    /// What the verdict weighs.
    pub fn evidence(&self) -> Evidence {
        self.evidence
    }

    /// The balancer's counts of `host` so far (cumulative, as its counters stand at
    /// `now`: the requests it answered through this host and the errors among them).
    /// The policy keeps the differences between two reads; a count lower than the last
    /// (a balancer restarted) starts again from it.
    pub fn outcomes(&mut self, now: Time, host: &str, total: RequestCounts) {
        let Some(h) = self.hosts.get_mut(host) else {
            return;
        };
        if let Some((at, last)) = h.counted {
            let delta = if total.requests >= last.requests && total.errors >= last.errors {
                RequestCounts::new(total.requests - last.requests, total.errors - last.errors)
            } else {
                total
            };
            if delta.requests > 0 && now > at {
                h.outcomes.push((at, now, delta));
            }
        }
        h.counted = Some((now, total));
    }

    /// The balancer's counts over intervals that began at or after `since`: the wave's
    /// hosts, and the old-revision hosts not yet deployed.
    pub fn request_counts(&self, since: Time) -> (RequestCounts, RequestCounts) {
        let (mut new, mut old) = (RequestCounts::default(), RequestCounts::default());
        for (id, h) in &self.hosts {
            let window = h
                .outcomes
                .iter()
                .filter(|(from, _, _)| *from >= since)
                .fold(RequestCounts::default(), |a, (_, _, c)| a.plus(*c));
            if self.wave_hosts.contains(id) {
                new = new.plus(window);
            } else if h.revision != self.revision && h.step == HostStep::Pending {
                old = old.plus(window);
            }
        }
        (new, old)
    }

    /// The rule the current (or next) wave's verdict follows, in words (for a plan).
    pub fn verdict_rule(&self) -> String {
        let cfg = &self.config;
        match self.evidence {
            Evidence::BalancerRequests => {
                let old_left = self
                    .hosts
                    .values()
                    .any(|h| h.revision != self.revision && h.step == HostStep::Pending);
                let against = match (old_left, self.baseline) {
                    (true, _) => "the old-revision hosts' counts of the same window".to_string(),
                    (false, Some((w, c))) => format!(
                        "the old hosts' counts of wave {} ({c}), as no old-revision host is left",
                        w + 1
                    ),
                    (false, None) if self.waves > 1 => {
                        "the old hosts' counts of the wave before, as no old-revision host is left"
                            .to_string()
                    }
                    (false, None) => {
                        return format!(
                            "the balancer's request counts, with no old-revision host to compare with: the new hosts' error rate held to max_error_rate {} (Wilson bound at {})",
                            cfg.max_error_rate,
                            1.0 - cfg.alpha
                        );
                    }
                };
                format!(
                    "the balancer's request counts: the new hosts' errors per request against {against}, by an SPRT (alpha {}, beta {}, min_effect {}), failing as soon as it is reached and passing after the bake; error rate above {} fails",
                    cfg.alpha, cfg.beta, cfg.min_effect, cfg.max_error_rate
                )
            }
            Evidence::HostSamples => format!(
                "the hosts' own samples: Mann-Whitney against the old hosts' with {} samples per side (alpha {}, min_effect {} of medians); mean above {} fails",
                cfg.min_samples, cfg.alpha, cfg.min_effect, cfg.max_error_rate
            ),
        }
    }

    /// A dry run's stand-in for a verdict: a wave whose bake is over (or that is held
    /// inconclusive) passes, and the decision says it was assumed. Returns true when it
    /// did. Never for a real rollout: `vigil deploy plan` uses it to show the waves.
    pub fn assume_pass(&mut self, now: Time) -> bool {
        let wave = match self.phase {
            Phase::Baking { wave, since } if now.since(since) >= self.config.bake => wave,
            Phase::Held { wave, ref reason } if reason.starts_with("inconclusive") => wave,
            _ => return false,
        };
        let rule = self.verdict_rule();
        self.decide(
            now,
            format!(
                "wave {} baked {}; its verdict is assumed to pass here (`run` judges it by {rule})",
                wave + 1,
                humantime::format_duration(self.config.bake)
            ),
        );
        self.next_wave(now);
        true
    }

    /// Advances time and returns what the driver must do now.
    pub fn poll(&mut self, now: Time) -> Vec<Command> {
        self.advance(now);
        std::mem::take(&mut self.outbox)
    }

    /// The revision `host` is being moved to (its previous one during a rollback).
    fn want(&self, host: &str) -> Option<String> {
        match self.phase {
            Phase::RollingBack { .. } => self.previous.get(host).cloned(),
            _ => self.hosts.contains_key(host).then(|| self.revision.clone()),
        }
    }

    fn decide(&mut self, now: Time, what: String) {
        self.decisions.push(RolloutDecision { at: now, what });
    }

    /// Starts the next wave of hosts still to deploy (or completes).
    fn start_wave(&mut self, now: Time) {
        // The balancer's counts so far are all before the next bake: no verdict reads
        // them again (the last wave's baseline is kept apart), so the saved state does
        // not grow with the rollout.
        for h in self.hosts.values_mut() {
            h.outcomes.clear();
        }
        let pending: Vec<String> = self
            .hosts
            .iter()
            .filter(|(_, h)| h.step == HostStep::Pending)
            .map(|(id, _)| id.clone())
            .collect();
        let wave = self.waves;
        if pending.is_empty() {
            self.phase = Phase::Completed;
            self.wave_hosts.clear();
            self.decide(now, format!("completed: every host runs {}", self.revision));
            return;
        }
        if let Some(why) = self.unreadable.clone() {
            let reason = format!(
                "the controller cannot be read ({why}): no new wave until it can (fail closed)"
            );
            self.hold(now, wave, reason);
            return;
        }
        let n = self.hosts.len();
        let floor = self.floor();
        let out_now = self.out_of_service();
        let mut room = n.saturating_sub(floor).saturating_sub(out_now);
        if self.config.max_wave > 0 {
            room = room.min(self.config.max_wave);
        }
        // Hosts already out of service (unhealthy, held) cost no room to deploy: they are
        // out already. Prefer them.
        let mut chosen: Vec<String> = Vec::new();
        let zone = match self.config.zones {
            // The zone of the first host that may be taken: a held host must not keep
            // its zone's turn (and so every other zone) waiting.
            Zones::OneAtATime => pending
                .iter()
                .find(|id| !self.hosts[*id].held)
                .or(pending.first())
                .map(|id| self.hosts[id].zone.clone()),
            Zones::Any => None,
        };
        for id in &pending {
            let h = &self.hosts[id];
            if zone.as_ref().is_some_and(|z| *z != h.zone) {
                continue;
            }
            if out(h) {
                // Held hosts are the guard's: never touch them.
                if !h.held {
                    chosen.push(id.clone());
                }
            } else if room > 0 {
                room -= 1;
                chosen.push(id.clone());
            }
        }
        if chosen.is_empty() {
            let held: Vec<&str> = pending
                .iter()
                .filter(|id| self.hosts[*id].held)
                .map(String::as_str)
                .collect();
            let reason = if held.len() == pending.len() {
                format!(
                    "every host left to deploy is held by the controller ({}): waiting for it to release them",
                    held.join(", ")
                )
            } else {
                format!(
                    "floor: {floor} of {n} hosts must stay in service and {out_now} are out (unhealthy, held or in a wave): no host can be taken now"
                )
            };
            self.hold(now, wave, reason);
            return;
        }
        self.waves += 1;
        self.decide(
            now,
            format!(
                "wave {} of {}: {} ({} hosts; {} of {n} in service before it, floor {floor})",
                wave + 1,
                self.revision,
                chosen.join(", "),
                chosen.len(),
                n - out_now
            ),
        );
        for id in &chosen {
            if let Some(h) = self.hosts.get_mut(id) {
                h.step = HostStep::Draining { since: now };
            }
            self.outbox.push(Command::Drain { host: id.clone() });
        }
        self.wave_log.push(chosen.clone());
        self.wave_hosts = chosen;
        self.phase = Phase::Deploying { wave };
    }

    /// Holds before wave `wave` for `reason` (said once while it stays the reason).
    fn hold(&mut self, now: Time, wave: usize, reason: String) {
        if self.phase
            != (Phase::Held {
                wave,
                reason: reason.clone(),
            })
        {
            self.decide(now, format!("wave {} held: {reason}", wave + 1));
        }
        self.wave_hosts.clear();
        self.phase = Phase::Held { wave, reason };
    }

    fn next_wave(&mut self, now: Time) {
        self.start_wave(now);
    }

    /// Applies deadlines, bake ends and verdicts.
    fn advance(&mut self, now: Time) {
        match self.phase.clone() {
            Phase::Deploying { wave } => {
                if let Some(late) = self.late_host(now) {
                    return self.fail(now, late);
                }
                if let Some(sick) = self.sick_new_host() {
                    return self.fail(now, sick);
                }
                if self.wave_done() {
                    self.decide(
                        now,
                        format!(
                            "wave {} reported back; baking for {}",
                            wave + 1,
                            humantime::format_duration(self.config.bake)
                        ),
                    );
                    self.phase = Phase::Baking { wave, since: now };
                    self.advance(now);
                }
            }
            Phase::Baking { wave, since } => {
                if let Some(sick) = self.sick_new_host() {
                    return self.fail(now, sick);
                }
                if self.evidence == Evidence::BalancerRequests {
                    // A sequential test may be acted on at any look: a fail fails now; a
                    // pass waits for the bake's end.
                    if let (WaveVerdict::Fail, why) = self.request_verdict(since) {
                        return self.fail(
                            now,
                            format!("wave {} fails during its bake: {why}", wave + 1),
                        );
                    }
                    if now.since(since) >= self.config.bake {
                        self.judge(now, wave, since);
                    }
                    return;
                }
                let (limit_broken, mean, count) = self.over_limit(since);
                if limit_broken {
                    return self.fail(
                        now,
                        format!(
                            "wave {}: new hosts' mean error rate {:.2}% over {count} samples exceeds the limit {:.2}%",
                            wave + 1,
                            mean * 100.0,
                            self.config.max_error_rate * 100.0
                        ),
                    );
                }
                if now.since(since) >= self.config.bake {
                    self.judge(now, wave, since);
                }
            }
            Phase::Held { wave, .. } => {
                if let Some(sick) = self.sick_new_host() {
                    return self.fail(now, sick);
                }
                if self.wave_hosts.is_empty() || !self.wave_done() {
                    // Held for room: try again.
                    self.start_wave(now);
                } else {
                    let since = self
                        .wave_hosts
                        .iter()
                        .filter_map(|h| match self.hosts[h].step {
                            HostStep::Done { at } => Some(at),
                            _ => None,
                        })
                        .max()
                        .unwrap_or(now);
                    self.judge(now, wave, since);
                }
            }
            Phase::RollingBack { reason } => {
                if let Some(late) = self.late_host(now) {
                    return self.rollback_failed(now, late);
                }
                if self.rollback_done() {
                    self.decide(
                        now,
                        format!(
                            "rolled back: every host that got {} runs its previous revision",
                            self.revision
                        ),
                    );
                    self.phase = Phase::RolledBack { reason };
                }
            }
            _ => {}
        }
    }

    /// Judges a baked wave.
    fn judge(&mut self, now: Time, wave: usize, since: Time) {
        let (verdict, why) = self.verdict(since);
        if self.evidence == Evidence::BalancerRequests
            && !matches!(verdict, WaveVerdict::Inconclusive { .. })
        {
            // The last wave's baseline: the old hosts as last seen beside new ones.
            let (_, old) = self.request_counts(since);
            if old.requests > 0 {
                self.baseline = Some((wave, old));
            }
        }
        match verdict {
            WaveVerdict::Pass => {
                self.decide(now, format!("wave {} passes: {why}", wave + 1));
                self.next_wave(now);
            }
            WaveVerdict::Fail => self.fail(now, format!("wave {} fails: {why}", wave + 1)),
            WaveVerdict::Inconclusive { .. } => {
                let reason = format!(
                    "inconclusive: {why}; waiting for more data (or a human: approve / abort)"
                );
                // Said once per hold: the figures change every round while it waits.
                if !matches!(&self.phase, Phase::Held { reason: r, .. } if r.starts_with("inconclusive"))
                {
                    if !matches!(self.phase, Phase::Held { .. }) {
                        self.outbox.push(Command::Alert {
                            reason: format!(
                                "rollout of {} held at wave {}: {reason}",
                                self.revision,
                                wave + 1
                            ),
                        });
                    }
                    self.decide(now, format!("wave {} held: {reason}", wave + 1));
                }
                self.phase = Phase::Held { wave, reason };
            }
        }
    }

    /// The verdict of the current wave over what was seen since `since` (not knowing
    /// whether the bake is over: a pass before it is not acted on).
    pub fn verdict(&self, since: Time) -> (WaveVerdict, String) {
        match self.evidence {
            Evidence::BalancerRequests => self.request_verdict(since),
            Evidence::HostSamples => self.sample_verdict(since),
        }
    }

    /// The verdict by the balancer's counts (rule 3).
    fn request_verdict(&self, since: Time) -> (WaveVerdict, String) {
        let cfg = &self.config;
        let (new, old) = self.request_counts(since);
        let limit = FixedLimit {
            limit: cfg.max_error_rate,
            alpha: cfg.alpha,
        };
        let (fixed, lo, hi) = limit.test(new);
        if fixed == Decision::Fail {
            return (
                WaveVerdict::Fail,
                format!(
                    "the new hosts' error rate by the balancer's counts, {new}, is above the limit {:.2}% (Wilson bound {:.2}%..{:.2}% at {})",
                    cfg.max_error_rate * 100.0,
                    lo * 100.0,
                    hi * 100.0,
                    1.0 - cfg.alpha
                ),
            );
        }
        let (baseline, note) = if old.requests > 0 {
            (Some(old), String::new())
        } else {
            match self.baseline {
                Some((w, b)) => (
                    Some(b),
                    format!(
                        "; no old-revision host serves now: compared with the old hosts' counts of wave {}",
                        w + 1
                    ),
                ),
                None => (None, String::new()),
            }
        };
        let (decision, why) = match baseline {
            Some(b) => {
                let sprt = ErrorSprt {
                    alpha: cfg.alpha,
                    beta: cfg.beta,
                    min_effect: cfg.min_effect,
                }
                .test(new, b);
                (sprt.decision, format!("{sprt}{note}"))
            }
            None => (
                fixed,
                format!(
                    "no old-revision host to compare with: the new hosts' {new} held to the limit {:.2}% (Wilson bound {:.2}%..{:.2}% at {})",
                    cfg.max_error_rate * 100.0,
                    lo * 100.0,
                    hi * 100.0,
                    1.0 - cfg.alpha
                ),
            ),
        };
        match decision {
            Decision::Fail => (WaveVerdict::Fail, why),
            Decision::Pass => (WaveVerdict::Pass, why),
            Decision::Inconclusive { needs } => (
                WaveVerdict::Inconclusive { needs },
                format!("needs {needs} more requests on the new hosts ({why})"),
            ),
        }
    }

    /// The verdict by the hosts' own samples (rule 3, the host-reported rule).
    fn sample_verdict(&self, since: Time) -> (WaveVerdict, String) {
        let c = self.compare(since);
        let cfg = &self.config;
        if c.new_samples < cfg.min_samples {
            return (
                WaveVerdict::Inconclusive {
                    needs: (cfg.min_samples - c.new_samples) as u64,
                },
                format!(
                    "{} samples from the new hosts, {} needed",
                    c.new_samples, cfg.min_samples
                ),
            );
        }
        let Some(p) = c.p_value else {
            return (
                WaveVerdict::Pass,
                format!(
                    "no old-revision host left to compare with: judged on the fixed limit only (median {:.4} over {} samples, limit {:.4})",
                    c.new_median, c.new_samples, cfg.max_error_rate
                ),
            );
        };
        if c.old_samples < cfg.min_samples {
            return (
                WaveVerdict::Inconclusive {
                    needs: (cfg.min_samples - c.old_samples) as u64,
                },
                format!(
                    "{} samples from the old hosts, {} needed",
                    c.old_samples, cfg.min_samples
                ),
            );
        }
        let effect = c.new_median - c.old_median;
        let stats = format!(
            "new median {:.4} ({} samples) vs old {:.4} ({} samples), Mann-Whitney U {:.1}, one-sided p {:.3e} (alpha {}), effect {:.4} (min {})",
            c.new_median,
            c.new_samples,
            c.old_median,
            c.old_samples,
            c.u.unwrap_or(0.0),
            p,
            cfg.alpha,
            effect,
            cfg.min_effect
        );
        if p < cfg.alpha && effect >= cfg.min_effect {
            (WaveVerdict::Fail, stats)
        } else {
            (WaveVerdict::Pass, stats)
        }
    }

    /// New hosts' samples against old-revision hosts' over the same window.
    pub fn compare(&self, since: Time) -> Comparison {
        let mut new = Vec::new();
        let mut old = Vec::new();
        for (id, h) in &self.hosts {
            let window = h
                .samples
                .iter()
                .filter(|(t, _)| *t >= since)
                .map(|(_, v)| *v);
            if self.wave_hosts.contains(id) {
                new.extend(window);
            } else if h.revision != self.revision && h.step == HostStep::Pending {
                old.extend(window);
            }
        }
        let (u, p_value) = if old.is_empty() || new.is_empty() {
            (None, None)
        } else {
            let (u, p) = mann_whitney_greater(&new, &old);
            (Some(u), Some(p))
        };
        Comparison {
            new_samples: new.len(),
            old_samples: old.len(),
            new_median: median(&mut new),
            old_median: median(&mut old),
            u,
            p_value,
        }
    }

    fn late_host(&self, now: Time) -> Option<String> {
        self.wave_hosts.iter().find_map(|id| match self.hosts[id].step {
            HostStep::Draining { since } | HostStep::Installing { since } | HostStep::AwaitingReport { since }
                if now.since(since) >= self.config.progress_deadline =>
            {
                Some(format!(
                    "{id} did not report back with {} within the progress deadline {} (it reports {:?}, {})",
                    self.target_label(),
                    humantime::format_duration(self.config.progress_deadline),
                    self.hosts[id].revision,
                    if self.hosts[id].healthy { "passing" } else { "failing" }
                ))
            }
            _ => None,
        })
    }

    fn target_label(&self) -> String {
        match self.phase {
            Phase::RollingBack { .. } => "its previous revision".to_string(),
            _ => format!("revision {}", self.revision),
        }
    }

    fn sick_new_host(&self) -> Option<String> {
        self.wave_hosts.iter().find_map(|id| {
            let h = &self.hosts[id];
            (matches!(h.step, HostStep::Done { .. }) && !h.healthy)
                .then(|| format!("{id} runs {} and turned unhealthy", self.revision))
        })
    }

    fn wave_done(&self) -> bool {
        self.wave_hosts
            .iter()
            .all(|h| matches!(self.hosts[h].step, HostStep::Done { .. }))
    }

    fn over_limit(&self, since: Time) -> (bool, f64, usize) {
        let values: Vec<f64> = self
            .wave_hosts
            .iter()
            .flat_map(|id| {
                self.hosts[id]
                    .samples
                    .iter()
                    .filter(|(t, _)| *t >= since)
                    .map(|(_, v)| *v)
            })
            .collect();
        if values.is_empty() {
            return (false, 0.0, 0);
        }
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        (mean > self.config.max_error_rate, mean, values.len())
    }

    /// Fails the rollout: latches the revision as bad and starts the rollback.
    fn fail(&mut self, now: Time, reason: String) {
        if matches!(self.phase, Phase::RollingBack { .. }) || self.is_finished() {
            return;
        }
        self.bad.insert(self.revision.clone());
        self.decide(
            now,
            format!(
                "{reason}; revision {} marked bad; rolling back",
                self.revision
            ),
        );
        self.phase = Phase::RollingBack {
            reason: reason.clone(),
        };
        // Every host that was touched (or runs the bad revision) goes back to what it ran.
        let touched: Vec<String> = self
            .hosts
            .iter()
            .filter(|(id, h)| h.step != HostStep::Pending && self.previous[*id] != self.revision)
            .map(|(id, _)| id.clone())
            .collect();
        self.wave_hosts = touched.clone();
        for id in touched {
            let previous = self.previous[&id].clone();
            let key = format!("{}:{id}:rollback:{previous}", self.id);
            let Some(h) = self.hosts.get_mut(&id) else {
                continue;
            };
            if matches!(h.step, HostStep::Done { .. }) {
                // Reported back and undrained: it serves clients (a wave failing in its
                // bake, or one that passed before). Drained first, so the reinstall
                // cuts no request; its install follows the drain (`drained`).
                h.step = HostStep::Draining { since: now };
                self.outbox.push(Command::Drain { host: id.clone() });
                continue;
            }
            // Still in the wave's hands (draining, installing, awaiting its report):
            // out of service already, straight to the install. The floor was reserved
            // for it by its wave.
            h.step = HostStep::AwaitingReport { since: now };
            self.outbox.push(Command::Install {
                host: id.clone(),
                revision: previous,
                key,
            });
        }
        self.advance(now);
    }

    fn rollback_done(&self) -> bool {
        self.wave_done()
    }

    fn rollback_failed(&mut self, now: Time, why: String) {
        let reason = format!("rollback failed: {why}; stopped, a human decides");
        self.decide(now, reason.clone());
        self.outbox.push(Command::Alert {
            reason: reason.clone(),
        });
        self.phase = Phase::RollbackFailed { reason };
    }
}

fn evidence_words(e: Evidence) -> &'static str {
    match e {
        Evidence::BalancerRequests => {
            "the balancer's request counts per host (errors per request, new vs old)"
        }
        Evidence::HostSamples => "the hosts' own samples (host-reported rule)",
    }
}

/// A host is out of service when it is in a wave's hands, unhealthy or held.
fn out(h: &Host) -> bool {
    !h.healthy
        || h.held
        || matches!(
            h.step,
            HostStep::Draining { .. }
                | HostStep::Installing { .. }
                | HostStep::AwaitingReport { .. }
        )
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One-sided Mann-Whitney U test that `a` tends to be greater than `b`: returns U of `a`
/// and the p-value, by the normal approximation with tie correction and continuity
/// correction (adequate at the 50-sample minimum the verdict requires).
pub fn mann_whitney_greater(a: &[f64], b: &[f64]) -> (f64, f64) {
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|v| (*v, true))
        .chain(b.iter().map(|v| (*v, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len();
    let mut rank_sum_a = 0.0;
    let mut ties = 0.0;
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let t = (j - i + 1) as f64;
        let avg = (i + j) as f64 / 2.0 + 1.0;
        rank_sum_a += avg * all[i..=j].iter().filter(|x| x.1).count() as f64;
        ties += t * t * t - t;
        i = j + 1;
    }
    let u = rank_sum_a - n1 * (n1 + 1.0) / 2.0;
    let mean = n1 * n2 / 2.0;
    let nf = n as f64;
    let var = n1 * n2 / 12.0 * ((nf + 1.0) - ties / (nf * (nf - 1.0)).max(1.0));
    if var <= 0.0 {
        return (u, 1.0);
    }
    let z = (u - mean - 0.5) / var.sqrt();
    (u, 0.5 * libm::erfc(z / std::f64::consts::SQRT_2))
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phase::Deploying { wave } => write!(f, "deploying wave {}", wave + 1),
            Phase::Baking { wave, .. } => write!(f, "baking wave {}", wave + 1),
            Phase::Held { wave, reason } => write!(f, "held at wave {}: {reason}", wave + 1),
            Phase::Completed => write!(f, "completed"),
            Phase::RollingBack { reason } => write!(f, "rolling back: {reason}"),
            Phase::RolledBack { reason } => write!(f, "rolled back: {reason}"),
            Phase::RollbackFailed { reason } => write!(f, "rollback failed: {reason}"),
            Phase::Aborted { reason } => write!(f, "aborted: {reason}"),
        }
    }
}

pub mod requests;

#[cfg(test)]
mod tests;
