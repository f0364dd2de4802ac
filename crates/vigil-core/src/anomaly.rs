//! Fleet-relative anomaly detection: is this member failing much more than its peers?
//!
//! A queue worker whose disk is full, or a target that answers 20% of requests with an
//! error, is not caught by consecutive-failure rules: the worker fails fast and pulls
//! *more* work than its peers (the SRE book's "sinkholing"), the target never fails five
//! requests in a row often enough. What gives them away is the comparison with their
//! peers. [`AnomalyDetector`] keeps, per member, its successes and failures over a sliding
//! window and judges each member against the other members of its **cohort** (members
//! grouped by version, zone or whatever the driver chooses, so a canary is compared with
//! its own kind). It is sans-IO: counts come in with the time they were observed, and
//! [`AnomalyDetector::evaluate`] returns one [`MemberVerdict`] per member; acting on an outlier
//! is the driver's business, through the [`SafetyGuard`](crate::guard::SafetyGuard)
//! (budget, fraction cap, flap damping) like any other candidate.
//!
//! # The rules
//!
//! A member is an **outlier** only when every one of these holds; each verdict says which
//! one failed and carries the numbers (the member's rate and volume, the peers' pooled,
//! median and highest rates, the test's p-value and the threshold it was held to):
//!
//! 1. **Enough volume.** The member handled at least `min_volume` requests in the window
//!    (default 20, [`DEFAULT_MIN_VOLUME`]): below that one failure is 5%, and nothing is
//!    said about it ([`Finding::LowVolume`]).
//! 2. **Enough peers.** At least `min_peers` other members of its cohort (default 3,
//!    [`DEFAULT_MIN_PEERS`]) have enough volume themselves. With fewer, the verdict is
//!    computed and reported but marked [`Finding::TooFewPeers`]: report only, never act.
//!    Two peers cannot tell which of three is odd.
//! 3. **Not a shared failure.** Of the cohort's members with enough volume, at most
//!    `shared_fraction` (default half, [`DEFAULT_SHARED_FRACTION`]) fail at or above the
//!    floor. When most of the cohort fails together nobody is an outlier
//!    ([`Finding::SharedFailure`]): that is a shared cause (a dependency, the broker), and
//!    replacing members would not help. The safety guard's fraction cap says the same from
//!    the health side.
//! 4. **Above the absolute floor.** The member's failure rate is at least `floor`
//!    (default 10%, [`DEFAULT_FLOOR`], MassTransit's kill-switch rate). A purely relative
//!    test misfires on very healthy fleets: a member at 0.1% among peers at 0.01% is
//!    "ten times worse" and statistically certain at high volume, yet healthy (Envoy's
//!    success-rate ejection, envoy #37723) ([`Finding::BelowFloor`]).
//! 5. **Much worse than its peers.** Its rate is at least `min_ratio` times the peers'
//!    pooled rate (default 2, [`DEFAULT_MIN_RATIO`]): at high volume 11% against 10% is
//!    significant, but not an anomaly worth a replacement ([`Finding::NotWorse`]).
//! 6. **Statistically significant.** A one-sided exact binomial test: how likely is it
//!    that a member with the peers' pooled failure rate `p` fails at least `k` of its `n`
//!    requests? The member is an outlier when that probability is below `significance`
//!    divided by the number of members judged in the cohort (Bonferroni: with 50 members
//!    judged every interval, one would otherwise be "significant" by chance now and then).
//!    Default `significance` 0.001 ([`DEFAULT_SIGNIFICANCE`]) ([`Finding::NotSignificant`]).
//!
//! Why a binomial test rather than median + k x MAD of the rates: failures are counts,
//! and the binomial test weighs them by volume (5 failures of 10 and 500 of 1,000 are not
//! the same evidence), while the MAD of a healthy fleet's rates is often 0, which makes
//! any difference infinitely many MADs away. The peers' rate `p` is smoothed
//! (`(failures + 0.5) / (requests + 1)`) so that a fleet with no failure at all does not
//! make a single failure impossible (p-value 0).
//!
//! # Window
//!
//! Counts are kept in buckets of `bucket` (default 5 s) over `window` (default 60 s,
//! [`DEFAULT_WINDOW`]): at 10 messages/s per worker that is 600 messages per member, ample
//! for the test, and a member that recovers is judged on its recent behaviour within a
//! minute. Drivers that see cumulative counters (a worker's heartbeat reports its totals)
//! use [`AnomalyDetector::record_totals`], which takes differences and treats a counter that
//! went down as a restart.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use vigil_core::Time;
//! use vigil_core::anomaly::{AnomalyConfig, AnomalyDetector, Counts, Finding};
//!
//! let mut detector = AnomalyDetector::new(AnomalyConfig::default());
//! for s in 0..30 {
//!     let now = Time::from_secs(s);
//!     for w in 0..4 {
//!         // Ten messages a second each; worker-3 fails every one, its peers one in twenty.
//!         let failed = if w == 3 { 10 } else if s % 2 == 0 { 1 } else { 0 };
//!         detector.record(now, &format!("worker-{w}"), "v1", Counts::new(10 - failed, failed));
//!     }
//! }
//! let verdicts = detector.evaluate(Time::from_secs(30));
//! let outliers: Vec<_> = verdicts.iter().filter(|v| v.is_outlier()).collect();
//! assert_eq!(outliers.len(), 1);
//! assert_eq!(outliers[0].member, "worker-3");
//! assert!(outliers[0].to_string().contains("outlier"), "{}", outliers[0]);
//! // The state persists and restores.
//! let saved = serde_json::to_string(detector.state()).unwrap();
//! let restored = AnomalyDetector::restore(AnomalyConfig::default(), serde_json::from_str(&saved).unwrap());
//! assert_eq!(restored.evaluate(Time::from_secs(30)), verdicts);
//! ```

use crate::invalid::Invalid;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

/// Default sliding window: one minute (MassTransit's kill switch judges one minute too).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
/// Default bucket: 5 s, so the window slides in twelfths and a burst ages out smoothly.
pub const DEFAULT_BUCKET: Duration = Duration::from_secs(5);
/// Default minimum volume per member in the window: 20 (one failure is then 5%).
pub const DEFAULT_MIN_VOLUME: u64 = 20;
/// Default minimum number of peers with enough volume: 3.
pub const DEFAULT_MIN_PEERS: usize = 3;
/// Default absolute floor on a member's failure rate: 10%.
pub const DEFAULT_FLOOR: f64 = 0.10;
/// Default minimum ratio of the member's rate to its peers' pooled rate: 2.
pub const DEFAULT_MIN_RATIO: f64 = 2.0;
/// Default family-wise significance of the binomial test: 0.001.
pub const DEFAULT_SIGNIFICANCE: f64 = 0.001;
/// Default largest fraction of a cohort at or above the floor that is still judged member
/// by member: one half. Above it the failure is shared.
pub const DEFAULT_SHARED_FRACTION: f64 = 0.5;

/// The check a queue worker fails when it fails far more than its peers, as the
/// controller and the simulator report it to the guard: local to the worker (a default
/// local check component), so the guard treats it like a full disk.
pub const PEER_CHECK: &str = "worker:failure_rate";

/// How members are compared with their peers. Every field has a default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnomalyConfig {
    /// Sliding window the counts are judged over, e.g. `"60s"`. Defaults to 60 s.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Bucket granularity of the window. Defaults to 5 s.
    #[serde(with = "humantime_serde")]
    pub bucket: Duration,
    /// Requests a member must have handled in the window to be judged. Defaults to 20.
    pub min_volume: u64,
    /// Peers with enough volume a member needs before a verdict may be acted on.
    /// Defaults to 3.
    pub min_peers: usize,
    /// Failure rate (0..1) a member must reach to be an outlier. Defaults to 0.1.
    pub floor: f64,
    /// How many times its peers' pooled rate a member's rate must be. Defaults to 2.
    pub min_ratio: f64,
    /// Family-wise significance of the binomial test (0..1). Defaults to 0.001.
    pub significance: f64,
    /// Fraction of a cohort at or above the floor beyond which the failure is shared and
    /// nobody is an outlier. Defaults to 0.5.
    pub shared_fraction: f64,
}

impl Default for AnomalyConfig {
    fn default() -> Self {
        AnomalyConfig {
            window: DEFAULT_WINDOW,
            bucket: DEFAULT_BUCKET,
            min_volume: DEFAULT_MIN_VOLUME,
            min_peers: DEFAULT_MIN_PEERS,
            floor: DEFAULT_FLOOR,
            min_ratio: DEFAULT_MIN_RATIO,
            significance: DEFAULT_SIGNIFICANCE,
            shared_fraction: DEFAULT_SHARED_FRACTION,
        }
    }
}

impl AnomalyConfig {
    /// Checks the values; the error starts with the bad key.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.bucket.is_zero() {
            return Err(Invalid::new("bucket", "must be longer than 0s"));
        }
        if self.window < self.bucket {
            return Err(Invalid::new(
                "window",
                format!(
                    "must be at least bucket ({}), got {}",
                    humantime::format_duration(self.bucket),
                    humantime::format_duration(self.window)
                ),
            ));
        }
        if self.min_peers == 0 {
            return Err(Invalid::new("min_peers", "must be at least 1"));
        }
        let unit = |key: &str, v: f64, open_low: bool| {
            let ok = v.is_finite() && v <= 1.0 && if open_low { v > 0.0 } else { v >= 0.0 };
            if ok {
                Ok(())
            } else {
                let low = if open_low { "(0" } else { "[0" };
                Err(Invalid::new(key, format!("must be in {low}, 1], got {v}")))
            }
        };
        unit("floor", self.floor, true)?;
        unit("significance", self.significance, true)?;
        unit("shared_fraction", self.shared_fraction, false)?;
        if !(self.min_ratio.is_finite() && self.min_ratio >= 1.0) {
            return Err(Invalid::new(
                "min_ratio",
                format!("must be at least 1, got {}", self.min_ratio),
            ));
        }
        Ok(())
    }
}

/// Successes and failures: what a member did in some span of time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Requests (messages) that succeeded.
    pub ok: u64,
    /// Requests (messages) that failed.
    pub failed: u64,
}

impl Counts {
    /// `ok` successes and `failed` failures.
    pub const fn new(ok: u64, failed: u64) -> Self {
        Counts { ok, failed }
    }

    /// Successes plus failures.
    pub const fn total(self) -> u64 {
        self.ok.saturating_add(self.failed)
    }

    /// Failures over total (0 when there was nothing).
    pub fn rate(self) -> f64 {
        match self.total() {
            0 => 0.0,
            n => self.failed as f64 / n as f64,
        }
    }

    fn add(&mut self, other: Counts) {
        self.ok = self.ok.saturating_add(other.ok);
        self.failed = self.failed.saturating_add(other.failed);
    }
}

/// One bucket of a member's window: the counts recorded from `start` on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Bucket {
    start: Time,
    counts: Counts,
}

/// What the detector remembers of one member.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Member {
    cohort: String,
    buckets: VecDeque<Bucket>,
    /// The last cumulative totals seen by [`AnomalyDetector::record_totals`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    totals: Option<Counts>,
}

/// The detector's whole state, serialisable so a driver can persist and restore it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnomalyState {
    members: BTreeMap<String, Member>,
}

/// The peers a member was compared with (the other members of its cohort with enough
/// volume).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Peers {
    /// How many peers had enough volume.
    pub count: usize,
    /// Their counts, summed.
    pub pooled: Counts,
    /// Their pooled failure rate (failures over requests), 0..1.
    pub pooled_rate: f64,
    /// The median of their individual failure rates.
    pub median_rate: f64,
    /// The highest of their individual failure rates.
    pub max_rate: f64,
}

/// The binomial test a verdict applied.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Test {
    /// P(X >= failures) for X ~ Binomial(volume, smoothed peers' rate); 1 when the
    /// member's failures are not above what its peers' rate predicts.
    pub p_value: f64,
    /// The threshold it was compared with: `significance` over the members judged.
    pub threshold: f64,
}

/// Why a member is, or is not, an outlier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// Every rule holds: the member fails far more than its peers.
    Outlier,
    /// Too few requests in the window to say anything.
    LowVolume {
        /// The minimum.
        min: u64,
    },
    /// It looks like an outlier, but there are too few peers to act on it: report only.
    TooFewPeers {
        /// Peers with enough volume.
        peers: usize,
        /// The minimum.
        min: usize,
    },
    /// Most of the cohort fails together: a shared cause, nobody is an outlier.
    SharedFailure {
        /// Members at or above the floor.
        failing: usize,
        /// Members with enough volume.
        of: usize,
    },
    /// The member's failure rate is under the absolute floor.
    BelowFloor {
        /// The floor.
        floor: f64,
    },
    /// Not `min_ratio` times worse than its peers.
    NotWorse {
        /// The ratio required.
        min_ratio: f64,
    },
    /// The difference could be chance.
    NotSignificant,
}

/// The judgement of one member against its peers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberVerdict {
    /// The member's id.
    pub member: String,
    /// Its cohort.
    pub cohort: String,
    /// Its counts in the window.
    pub counts: Counts,
    /// Its failure rate in the window, 0..1.
    pub rate: f64,
    /// The peers it was compared with.
    pub peers: Peers,
    /// The binomial test, when there were peers to test against.
    pub test: Option<Test>,
    /// The verdict.
    pub finding: Finding,
}

impl MemberVerdict {
    /// True when the member is an outlier that may be acted on.
    pub fn is_outlier(&self) -> bool {
        self.finding == Finding::Outlier
    }
}

impl fmt::Display for MemberVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (cohort {}): {:.1}% failed of {} vs {} peers at {:.1}% pooled (median {:.1}%, highest {:.1}%)",
            self.member,
            if self.cohort.is_empty() {
                "-"
            } else {
                &self.cohort
            },
            self.rate * 100.0,
            self.counts.total(),
            self.peers.count,
            self.peers.pooled_rate * 100.0,
            self.peers.median_rate * 100.0,
            self.peers.max_rate * 100.0,
        )?;
        if let Some(t) = self.test {
            write!(f, "; binomial p={:.2e} vs {:.2e}", t.p_value, t.threshold)?;
        }
        match &self.finding {
            Finding::Outlier => write!(f, ": outlier"),
            Finding::LowVolume { min } => write!(f, ": too few requests to judge (min {min})"),
            Finding::TooFewPeers { peers, min } => {
                write!(f, ": {peers} peers with volume, {min} needed: report only")
            }
            Finding::SharedFailure { failing, of } => write!(
                f,
                ": {failing} of {of} in the cohort fail together, a shared cause: nobody is an outlier"
            ),
            Finding::BelowFloor { floor } => {
                write!(f, ": under the {:.1}% floor", floor * 100.0)
            }
            Finding::NotWorse { min_ratio } => {
                write!(f, ": not {min_ratio}x its peers' rate")
            }
            Finding::NotSignificant => write!(f, ": not significant"),
        }
    }
}

/// Fleet-relative anomaly detection: see the [module docs](self).
#[derive(Clone, Debug)]
pub struct AnomalyDetector {
    config: AnomalyConfig,
    state: AnomalyState,
}

impl AnomalyDetector {
    /// A detector with no members. The config should have passed
    /// [`AnomalyConfig::validate`].
    pub fn new(config: AnomalyConfig) -> Self {
        AnomalyDetector {
            config,
            state: AnomalyState::default(),
        }
    }

    /// A detector restored from a saved [`AnomalyState`].
    pub fn restore(config: AnomalyConfig, state: AnomalyState) -> Self {
        AnomalyDetector { config, state }
    }

    /// Its configuration.
    pub fn config(&self) -> &AnomalyConfig {
        &self.config
    }

    /// Its whole state, to persist.
    pub fn state(&self) -> &AnomalyState {
        &self.state
    }

    /// Records what `member` (of `cohort`) did since its last record, observed at `now`.
    /// A member changing cohort (a new version) starts its window afresh.
    pub fn record(&mut self, now: Time, member: &str, cohort: &str, counts: Counts) {
        let m = entry(&mut self.state.members, member, cohort);
        m.add(now, counts, &self.config);
    }

    /// Records a member's cumulative totals (as a heartbeat reports them): the difference
    /// from the last totals is recorded; totals that went down mean the member restarted,
    /// and count from zero.
    pub fn record_totals(&mut self, now: Time, member: &str, cohort: &str, totals: Counts) {
        let m = entry(&mut self.state.members, member, cohort);
        let delta = match m.totals {
            Some(last) if totals.ok >= last.ok && totals.failed >= last.failed => {
                Counts::new(totals.ok - last.ok, totals.failed - last.failed)
            }
            // First report: its totals may span hours before this detector saw it; only
            // what happens from now on is judged.
            None => Counts::default(),
            Some(_) => totals,
        };
        m.totals = Some(totals);
        m.add(now, delta, &self.config);
    }

    /// Forgets a member.
    pub fn remove(&mut self, member: &str) {
        self.state.members.remove(member);
    }

    /// How many members it knows.
    pub fn len(&self) -> usize {
        self.state.members.len()
    }

    /// True when it knows no member.
    pub fn is_empty(&self) -> bool {
        self.state.members.is_empty()
    }

    /// Drops the buckets that have left the window; call it now and then (evaluate does
    /// not need it: it ignores them).
    pub fn expire(&mut self, now: Time) {
        let window = self.config.window;
        for m in self.state.members.values_mut() {
            while m
                .buckets
                .front()
                .is_some_and(|b| !in_window(b.start, now, window))
            {
                m.buckets.pop_front();
            }
        }
    }

    /// Judges every member against its cohort's peers, in member order.
    pub fn evaluate(&self, now: Time) -> Vec<MemberVerdict> {
        let c = &self.config;
        // Window counts per member, grouped by cohort.
        let mut cohorts: BTreeMap<&str, Vec<(&str, Counts)>> = BTreeMap::new();
        for (id, m) in &self.state.members {
            let mut sum = Counts::default();
            for b in m
                .buckets
                .iter()
                .filter(|b| in_window(b.start, now, c.window))
            {
                sum.add(b.counts);
            }
            cohorts.entry(&m.cohort).or_default().push((id, sum));
        }
        let mut verdicts = Vec::with_capacity(self.state.members.len());
        for (cohort, members) in cohorts {
            let judged: Vec<(&str, Counts)> = members
                .iter()
                .copied()
                .filter(|(_, n)| n.total() >= c.min_volume)
                .collect();
            let failing = judged.iter().filter(|(_, n)| n.rate() >= c.floor).count();
            let shared = failing > 0 && failing as f64 > c.shared_fraction * judged.len() as f64;
            let threshold = c.significance / judged.len().max(1) as f64;
            for &(id, counts) in &members {
                let peers = peers_of(id, &judged);
                let rate = counts.rate();
                let test = (peers.pooled.total() > 0).then(|| Test {
                    p_value: binomial_upper_tail(
                        counts.total(),
                        counts.failed,
                        (peers.pooled.failed as f64 + 0.5) / (peers.pooled.total() as f64 + 1.0),
                    ),
                    threshold,
                });
                let finding = if counts.total() < c.min_volume {
                    Finding::LowVolume { min: c.min_volume }
                } else if shared {
                    Finding::SharedFailure {
                        failing,
                        of: judged.len(),
                    }
                } else if rate < c.floor {
                    Finding::BelowFloor { floor: c.floor }
                } else if rate < c.min_ratio * peers.pooled_rate {
                    Finding::NotWorse {
                        min_ratio: c.min_ratio,
                    }
                } else if !test.is_some_and(|t| t.p_value < t.threshold) {
                    Finding::NotSignificant
                } else if peers.count < c.min_peers {
                    Finding::TooFewPeers {
                        peers: peers.count,
                        min: c.min_peers,
                    }
                } else {
                    Finding::Outlier
                };
                verdicts.push(MemberVerdict {
                    member: id.to_string(),
                    cohort: cohort.to_string(),
                    counts,
                    rate,
                    peers,
                    test,
                    finding,
                });
            }
        }
        verdicts.sort_by(|a, b| a.member.cmp(&b.member));
        verdicts
    }
}

/// A member's record, created on first sight; a member changing cohort starts afresh.
fn entry<'a>(
    members: &'a mut BTreeMap<String, Member>,
    member: &str,
    cohort: &str,
) -> &'a mut Member {
    let m = members.entry(member.to_string()).or_default();
    if m.cohort != cohort {
        m.cohort = cohort.to_string();
        m.buckets.clear();
    }
    m
}

impl Member {
    fn add(&mut self, now: Time, counts: Counts, config: &AnomalyConfig) {
        match self.buckets.back_mut() {
            Some(b) if now >= b.start && now.since(b.start) < config.bucket => b.counts.add(counts),
            _ => self.buckets.push_back(Bucket { start: now, counts }),
        }
        while self
            .buckets
            .front()
            .is_some_and(|b| !in_window(b.start, now, config.window))
        {
            self.buckets.pop_front();
        }
    }
}

/// A bucket that started at `start` still counts at `now`.
fn in_window(start: Time, now: Time, window: Duration) -> bool {
    start > now || now.since(start) < window
}

/// The other judged members of a cohort, summarised.
fn peers_of(member: &str, judged: &[(&str, Counts)]) -> Peers {
    let mut pooled = Counts::default();
    let mut rates = Vec::with_capacity(judged.len());
    for &(_, n) in judged.iter().filter(|(id, _)| *id != member) {
        pooled.add(n);
        rates.push(n.rate());
    }
    rates.sort_by(f64::total_cmp);
    let median_rate = match rates.len() {
        0 => 0.0,
        n if n % 2 == 1 => rates[n / 2],
        n => (rates[n / 2 - 1] + rates[n / 2]) / 2.0,
    };
    Peers {
        count: rates.len(),
        pooled,
        pooled_rate: pooled.rate(),
        median_rate,
        max_rate: rates.last().copied().unwrap_or(0.0),
    }
}

/// P(X >= k) for X ~ Binomial(n, p), 0 < p < 1; 1 when k is not above the mean.
///
/// Summed from the k-th term upwards, each term from the last (t(i+1) = t(i) (n-i)/(i+1)
/// p/(1-p)), starting from the k-th term computed in log space, until the terms stop
/// mattering: above the mean they fall geometrically, so a few dozen terms suffice
/// whatever `n` is. Written here rather than pulling a statistics crate (statrs brings
/// nalgebra) into the sans-IO core for one tail sum; `libm::lgamma` is the one piece
/// taken from a crate.
pub fn binomial_upper_tail(n: u64, k: u64, p: f64) -> f64 {
    let (nf, kf) = (n as f64, k as f64);
    if k == 0 || kf <= nf * p {
        return 1.0;
    }
    if k > n {
        return 0.0;
    }
    let p = p.clamp(f64::MIN_POSITIVE, 1.0 - f64::EPSILON);
    let ln_choose = libm::lgamma(nf + 1.0) - libm::lgamma(kf + 1.0) - libm::lgamma(nf - kf + 1.0);
    let mut term = (ln_choose + kf * p.ln() + (nf - kf) * (1.0 - p).ln()).exp();
    let odds = p / (1.0 - p);
    let mut sum = term;
    let mut i = k;
    while i < n && term > sum * 1e-17 {
        term *= (n - i) as f64 / (i + 1) as f64 * odds;
        sum += term;
        i += 1;
    }
    sum.min(1.0)
}

#[cfg(test)]
mod tests;
