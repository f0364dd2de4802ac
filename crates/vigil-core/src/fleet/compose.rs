//! How the engine composes the policies: the peer check, the probers' agreement into
//! an observation or doubt, the dissent rule, and which decisions are recorded.
//!
//! Each piece is pure and takes the time it needs: `vigil controller` and `vigil sim`
//! call these very functions instead of each writing its own.

use crate::anomaly::{AnomalyDetector, MemberVerdict, PEER_CHECK};
use crate::guard::{Decision, Observation, Op, Outcome};
use crate::shard::Agreement;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

// === peer check ===

/// Composes a queue worker's standing among its peers (`crate::anomaly`) into its
/// observation: an outlier fails the peer check ([`PEER_CHECK`], a check of the
/// controller's, after the worker's own). Returns whether it failed it.
pub fn peer_check(obs: &mut Observation, outlier: bool) -> bool {
    if outlier {
        obs.failing_checks.push(PEER_CHECK.to_string());
    }
    outlier
}

/// Compares the queue workers with their peers as of `now` (old windows expired
/// first): every worker's verdict, each with `Some(outlier)` when its standing changed
/// from what `was_outlier` says it was (it became, or stopped being, an outlier), for
/// the driver to say so once.
pub fn judge_peers(
    peers: &mut AnomalyDetector,
    now: Time,
    mut was_outlier: impl FnMut(&str) -> bool,
) -> Vec<(MemberVerdict, Option<bool>)> {
    peers.expire(now);
    peers
        .evaluate(now)
        .into_iter()
        .map(|v| {
            let outlier = v.is_outlier();
            let changed = (outlier != was_outlier(&v.member)).then_some(outlier);
            (v, changed)
        })
        .collect()
}

// === probers' agreement ===

/// What the probers of a target due for a verdict say of it together
/// (`crate::shard` rule 3 and 4).
#[derive(Clone, Debug, PartialEq)]
pub enum Judged {
    /// They agree on this observation (a disputed pass when one of them sees the
    /// target failing).
    Seen(Observation),
    /// They do not: results stale, missing, or failing beside none passing. The guard
    /// holds the target in doubt (`crate::shard` rule 4).
    InDoubt,
}

impl Judged {
    /// The verdict of an [`Agreement`] on target `id` in `zone`: a pass, a disputed
    /// pass, doubt, or (failing) the observation one of its probers reported, which
    /// `failed` finds (the endpoint failed, when none of them said more).
    pub fn of(
        agreement: Agreement,
        id: &str,
        zone: &str,
        failed: impl FnOnce() -> Option<Observation>,
    ) -> Judged {
        match agreement {
            Agreement::Undecided => Judged::InDoubt,
            Agreement::Passing => Judged::Seen(Observation::pass(id, zone)),
            Agreement::Split => Judged::Seen(Observation::pass(id, zone).disputed()),
            Agreement::Failing => {
                Judged::Seen(failed().unwrap_or_else(|| Observation::endpoint_failure(id, zone)))
            }
        }
    }

    /// The guard op that records this verdict of target `id` at `at`: an observation,
    /// or doubt.
    pub fn into_op(self, at: Time, id: &str) -> Op {
        match self {
            Judged::Seen(obs) => Op::Observe { at, obs },
            Judged::InDoubt => Op::Doubt {
                at,
                id: id.to_string(),
            },
        }
    }
}

// === dissent ===

/// Default share of a replica's fresh results that fail alone (while another prober
/// passes the target) from which it is said to be cut off: 0.5. Under half is a
/// prober seeing some real failures its peers miss by timing; over half of what it
/// probes failing alone is its own network, not the fleet.
pub const DEFAULT_DISSENT_SHARE: f64 = 0.5;
/// Default least number of targets failed alone before the share counts: 3. One or
/// two lone failures in an interval are timing (a probe just before a recovery), not
/// a replica cut off.
pub const DEFAULT_DISSENT_MIN: u32 = 3;

/// The dissent rule's settings: when a prober is said to be cut off from its targets.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DissentConfig {
    /// Share of its fresh results a replica fails alone. Defaults to 0.5.
    pub share: f64,
    /// Least targets failed alone. Defaults to 3.
    pub min_targets: u32,
}

impl Default for DissentConfig {
    fn default() -> DissentConfig {
        DissentConfig {
            share: DEFAULT_DISSENT_SHARE,
            min_targets: DEFAULT_DISSENT_MIN,
        }
    }
}

/// One interval's tally for the [`Dissent`] rule, per prober: (targets it failed
/// alone while another prober passed them, targets it had a fresh result for).
pub type DissentTally = BTreeMap<String, (u32, u32)>;

/// Counts one target's verdict into `tally`: every prober in `probers` with a fresh
/// result among `reports` (one per prober, in the same order), and those failing it
/// alone (`crate::shard::dissenting`). Both drivers call it for every probed target
/// they judge, once per its interval.
pub fn tally_dissent(
    tally: &mut DissentTally,
    probers: &[&str],
    reports: &[Option<crate::shard::Report>],
    fresh_for: std::time::Duration,
) {
    for (p, r) in probers.iter().zip(reports) {
        if r.is_some_and(|r| r.age <= fresh_for) {
            tally.entry((*p).to_string()).or_default().1 += 1;
        }
    }
    for i in crate::shard::dissenting(reports, fresh_for) {
        tally.entry(probers[i].to_string()).or_default().0 += 1;
    }
}

/// The dissent rule, once per probe interval over that interval's verdicts: a replica
/// failing at least `share` of the targets it has fresh results for while another
/// prober passes them (and at least `min_targets` of them) is likely cut off from the
/// targets (a route, a firewall, its own network), not seeing a fleet that fails.
/// Its targets are in doubt meanwhile (`crate::shard::dissenting`, rule 4), so the
/// guard holds every action they would need; this only says so, once when it starts
/// and once when it ends.
#[derive(Clone, Debug, Default)]
pub struct Dissent {
    config: DissentConfig,
    dissenting: BTreeSet<String>,
}

/// One replica's dissent in an interval.
#[derive(Clone, Debug, PartialEq)]
pub struct DissentChange {
    /// The replica.
    pub replica: String,
    /// Targets it failed alone.
    pub alone: u32,
    /// Targets it had a fresh result for.
    pub fresh: u32,
}

/// What one interval's tally says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DissentRound {
    /// Every replica's share of lone failures (0 without a fresh result).
    pub ratios: Vec<(String, f64)>,
    /// Replicas found dissenting that were not in the last interval.
    pub started: Vec<DissentChange>,
    /// Replicas dissenting in the last interval that no longer are.
    pub ended: Vec<String>,
}

impl Dissent {
    /// The rule with `config`, nobody dissenting yet.
    pub fn new(config: DissentConfig) -> Dissent {
        Dissent {
            config,
            dissenting: BTreeSet::new(),
        }
    }

    /// Judges one interval's tally (per replica: targets failed alone, targets with a
    /// fresh result) and says who started and who stopped dissenting.
    pub fn judge(&mut self, tally: &BTreeMap<String, (u32, u32)>) -> DissentRound {
        let mut round = DissentRound::default();
        let mut now = BTreeSet::new();
        for (replica, &(alone, fresh)) in tally {
            let ratio = if fresh == 0 {
                0.0
            } else {
                f64::from(alone) / f64::from(fresh)
            };
            round.ratios.push((replica.clone(), ratio));
            if alone >= self.config.min_targets && ratio >= self.config.share {
                now.insert(replica.clone());
                if !self.dissenting.contains(replica) {
                    round.started.push(DissentChange {
                        replica: replica.clone(),
                        alone,
                        fresh,
                    });
                }
            }
        }
        round.ended = self.dissenting.difference(&now).cloned().collect();
        self.dissenting = now;
        round
    }
}

// === decisions ===

/// A decision as recorded and counted: the guard's act or hold-back, or a freeze
/// alert (which the engine records as a decision with an action of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// The target is reported for replacement.
    Act,
    /// Not acted on now; the reasons say why.
    HoldBack,
    /// A freeze went on long enough to tell a human.
    Alert,
}

impl DecisionKind {
    /// Every kind.
    pub const ALL: [DecisionKind; 3] = [
        DecisionKind::Act,
        DecisionKind::HoldBack,
        DecisionKind::Alert,
    ];

    /// `act`, `hold_back` or `alert`: as in the store, metrics labels and the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Act => "act",
            DecisionKind::HoldBack => "hold_back",
            DecisionKind::Alert => "alert",
        }
    }

    /// The kind a guard decision is recorded as, or None when it is not recorded: a
    /// hold-back repeating the previous one (same outcome, same kinds of reason) says
    /// nothing new. An act always is: each one is an action.
    pub fn recorded(d: &Decision) -> Option<DecisionKind> {
        match d.outcome {
            Outcome::Act => Some(DecisionKind::Act),
            Outcome::HoldBack if d.repeated => None,
            Outcome::HoldBack => Some(DecisionKind::HoldBack),
        }
    }
}

impl From<Outcome> for DecisionKind {
    fn from(o: Outcome) -> DecisionKind {
        match o {
            Outcome::Act => DecisionKind::Act,
            Outcome::HoldBack => DecisionKind::HoldBack,
        }
    }
}

impl fmt::Display for DecisionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outlier_fails_the_peer_check_after_its_own_checks() {
        let mut obs = Observation::failed_checks("w1", "a", ["disk:free"]);
        assert!(peer_check(&mut obs, true));
        assert_eq!(obs.failing_checks, ["disk:free", PEER_CHECK]);
        let mut fine = Observation::pass("w2", "a");
        assert!(!peer_check(&mut fine, false));
        assert!(fine.is_ok(), "a worker like its peers passes as it is");
    }

    #[test]
    fn agreement_becomes_an_observation_or_doubt() {
        let at = Time::ZERO;
        let op =
            |a, failed: Option<Observation>| Judged::of(a, "t1", "a", || failed).into_op(at, "t1");
        assert_eq!(
            op(Agreement::Undecided, None),
            Op::Doubt {
                at,
                id: "t1".into()
            }
        );
        assert_eq!(
            op(Agreement::Split, None),
            Op::Observe {
                at,
                obs: Observation::pass("t1", "a").disputed()
            }
        );
        assert_eq!(
            op(Agreement::Failing, None),
            Op::Observe {
                at,
                obs: Observation::endpoint_failure("t1", "a")
            },
            "failing with nothing said: the endpoint failed"
        );
        let reported = Observation::failed_checks("t1", "a", ["db:query"]);
        assert_eq!(
            op(Agreement::Failing, Some(reported.clone())),
            Op::Observe { at, obs: reported }
        );
    }

    #[test]
    fn a_replica_failing_most_of_its_targets_alone_dissents_once_until_it_agrees() {
        let mut d = Dissent::new(DissentConfig::default());
        let tally = |alone, fresh| {
            BTreeMap::from([
                ("r1".to_string(), (alone, fresh)),
                ("r2".to_string(), (0, 10)),
            ])
        };
        let r = d.judge(&tally(5, 10));
        assert_eq!(
            r.started,
            [DissentChange {
                replica: "r1".into(),
                alone: 5,
                fresh: 10
            }],
            "half failed alone: cut off"
        );
        assert_eq!(r.ratios, [("r1".into(), 0.5), ("r2".into(), 0.0)]);
        assert!(d.judge(&tally(6, 10)).started.is_empty(), "said once");
        let r = d.judge(&tally(2, 2));
        assert_eq!(r.ended, ["r1"], "two alone are under the least number");
        assert_eq!(
            d.judge(&tally(4, 10)),
            DissentRound {
                ratios: vec![("r1".into(), 0.4), ("r2".into(), 0.0)],
                ..DissentRound::default()
            }
        );
    }

    #[test]
    fn a_repeated_hold_back_is_not_recorded_and_every_act_is() {
        let d = |outcome, repeated| Decision {
            target: "t1".into(),
            zone: String::new(),
            at: Time::ZERO,
            outcome,
            reasons: Vec::new(),
            repeated,
        };
        assert_eq!(
            DecisionKind::recorded(&d(Outcome::Act, true)),
            Some(DecisionKind::Act)
        );
        assert_eq!(DecisionKind::recorded(&d(Outcome::HoldBack, true)), None);
        assert_eq!(
            DecisionKind::recorded(&d(Outcome::HoldBack, false)),
            Some(DecisionKind::HoldBack)
        );
        for k in DecisionKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
        assert_eq!(
            DecisionKind::from(Outcome::Act).as_str(),
            Outcome::Act.as_str()
        );
        assert_eq!(
            DecisionKind::from(Outcome::HoldBack).as_str(),
            Outcome::HoldBack.as_str()
        );
    }
}
