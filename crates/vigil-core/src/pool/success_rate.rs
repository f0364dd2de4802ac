//! The success-rate rule's cadence over a [`Pool`]: every `interval`, each target's
//! request counts since the last judgement go into a fleet-relative
//! [`AnomalyDetector`] (the pool's targets in service as one cohort), every target is
//! judged against its peers, and the outliers are ejected through the pool's outlier
//! detection ([`Pool::eject`]: `max_ejection_percent`, ejection times, fail-open as
//! for any ejection). A target out of service (unhealthy, ejected) is forgotten: it is
//! judged afresh on its return, never on what it did before it left.
//!
//! `vigil lb` drives it from its tick loop (moved here from the balancer, so the rule
//! has one implementation for every driver).

use super::{Pool, PoolEvent};
use crate::anomaly::{AnomalyConfig, AnomalyDetector, Counts, Finding, MemberVerdict};
use crate::outlier::{EjectReason, OutlierEvent};
use crate::time::Time;
use std::collections::BTreeMap;
use std::fmt::Display;
use std::time::Duration;

/// The rule's state: the detector, the targets it was last given counts of, and when
/// it next judges.
#[derive(Debug)]
pub struct SuccessRateRule<K> {
    detector: AnomalyDetector,
    /// The targets it was last given counts of, by the name the detector knows them by.
    members: BTreeMap<String, K>,
    /// When it next judges (`None`: at the next call, or the rule is off).
    next: Option<Time>,
}

/// What one judgement found.
#[derive(Debug)]
pub struct Judgement<K> {
    /// The pool's events (ejections and what they changed).
    pub events: Vec<PoolEvent<K>>,
    /// Each target in service, judged (the balancer shows the last one per target).
    pub verdicts: Vec<(K, MemberVerdict)>,
    /// Targets out of service, whose last verdict no longer stands.
    pub forgotten: Vec<K>,
}

/// Whether the rule judges now.
#[derive(Debug, PartialEq, Eq)]
pub enum Due {
    /// Not yet: its interval has not passed.
    NotYet,
    /// Now: give it each target's counts since the last time.
    Now,
    /// The rule is off; `cleared` says it was on until now (its verdicts no longer stand).
    Off {
        /// It was on until now.
        cleared: bool,
    },
}

impl<K: Clone + Ord + Display> SuccessRateRule<K> {
    /// A rule judging with `config`.
    pub fn new(config: AnomalyConfig) -> Self {
        SuccessRateRule {
            detector: AnomalyDetector::new(config),
            members: BTreeMap::new(),
            next: None,
        }
    }

    /// Whether it judges at `now`: on (`enabled`) and `interval` after the last time.
    /// A changed `config` is taken, keeping what the detector learnt. Turned off, it
    /// forgets everything.
    pub fn due(
        &mut self,
        now: Time,
        enabled: bool,
        interval: Duration,
        config: AnomalyConfig,
    ) -> Due {
        if !enabled {
            let cleared = self.next.take().is_some();
            if cleared {
                self.detector = AnomalyDetector::new(config);
                self.members.clear();
            }
            return Due::Off { cleared };
        }
        if self.next.is_some_and(|next| now < next) {
            return Due::NotYet;
        }
        self.next = Some(now + interval);
        if *self.detector.config() != config {
            self.detector = AnomalyDetector::restore(config, self.detector.state().clone());
        }
        Due::Now
    }

    /// Judges every target of `counts` (each target's successes and failures since the
    /// last judgement, every target the balancer has) against its peers in service,
    /// ejecting the outliers from `pool`. `jitter` gives each ejection's jitter in
    /// `[0, 1)`. Call it when [`SuccessRateRule::due`] says [`Due::Now`].
    pub fn judge(
        &mut self,
        now: Time,
        pool: &mut Pool<K>,
        counts: impl IntoIterator<Item = (K, Counts)>,
        mut jitter: impl FnMut() -> f64,
    ) -> Judgement<K> {
        let mut judgement = Judgement {
            events: Vec::new(),
            verdicts: Vec::new(),
            forgotten: Vec::new(),
        };
        // Each target's name once (the detector knows members by name).
        let counts: BTreeMap<String, (K, Counts)> = counts
            .into_iter()
            .map(|(k, c)| (k.to_string(), (k, c)))
            .collect();
        for gone in self.members.keys().filter(|m| !counts.contains_key(*m)) {
            self.detector.remove(gone);
        }
        self.members.clear();
        for (name, (key, c)) in counts {
            if pool.is_in_service(&key) {
                self.detector.record(now, &name, "", c);
                self.members.insert(name, key);
            } else {
                self.detector.remove(&name);
                judgement.forgotten.push(key);
            }
        }
        for v in self.detector.evaluate(now) {
            let Some(key) = self.members.get(&v.member).cloned() else {
                continue;
            };
            if v.is_outlier() {
                let evs = pool.eject(&key, now, EjectReason::success_rate(&v), jitter());
                let ejected = evs.iter().any(|e| {
                    matches!(
                        e,
                        PoolEvent::Outlier {
                            event: OutlierEvent::Ejected { .. },
                            ..
                        }
                    )
                });
                if ejected {
                    // Judged afresh when it is back.
                    self.detector.remove(&v.member);
                }
                judgement.events.extend(evs);
            }
            judgement.verdicts.push((key, v));
        }
        judgement
    }
}

/// Whether a verdict is report-only for want of peers (the balancer logs it).
pub fn too_few_peers(v: &MemberVerdict) -> bool {
    matches!(v.finding, Finding::TooFewPeers { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{NewTargets, PoolConfig, TargetSpec};

    const T: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

    fn pool() -> Pool<&'static str> {
        let mut p = Pool::new(
            "api",
            PoolConfig {
                new_targets: NewTargets::Healthy,
                ..Default::default()
            },
        );
        for t in T {
            p.add_target(t, TargetSpec::default(), Time::ZERO);
        }
        p
    }

    /// Every target 200 requests a round; `bad` fails half of them.
    fn round(bad: &'static str) -> Vec<(&'static str, Counts)> {
        T.iter()
            .map(|&t| {
                let failed = if t == bad { 100 } else { 0 };
                (t, Counts::new(200 - failed, failed))
            })
            .collect()
    }

    #[test]
    fn a_target_failing_where_its_peers_succeed_is_ejected_at_the_rules_cadence() {
        let mut p = pool();
        let mut rule = SuccessRateRule::new(AnomalyConfig::default());
        let every = Duration::from_secs(10);
        let cfg = AnomalyConfig::default();
        let mut ejected_at = None;
        for s in 0..12u64 {
            let now = Time::from_secs(10 * s);
            assert_eq!(rule.due(now, true, every, cfg.clone()), Due::Now);
            assert_eq!(
                rule.due(now + Duration::from_secs(5), true, every, cfg.clone()),
                Due::NotYet,
                "once per interval"
            );
            let j = rule.judge(now, &mut p, round("c"), || 0.0);
            assert!(
                j.verdicts.iter().all(|(k, v)| *k != "a" || !v.is_outlier()),
                "a healthy peer is never an outlier"
            );
            if j.events.iter().any(|e| {
                matches!(e, PoolEvent::Outlier { event: OutlierEvent::Ejected { target, .. }, .. } if *target == "c")
            }) {
                ejected_at = Some(s);
                break;
            }
        }
        let s = ejected_at.expect("c is ejected within 12 rounds");
        assert!(!p.is_in_service(&"c"));
        // Out of service, c is forgotten: no verdict of it stands.
        let now = Time::from_secs(10 * (s + 1));
        assert_eq!(rule.due(now, true, every, cfg.clone()), Due::Now);
        let j = rule.judge(now, &mut p, round("c"), || 0.0);
        assert_eq!(j.forgotten, vec!["c"]);
        assert!(j.verdicts.iter().all(|(k, _)| *k != "c"));
        // Turned off: its verdicts no longer stand, once.
        assert_eq!(
            rule.due(now, false, every, cfg.clone()),
            Due::Off { cleared: true }
        );
        assert_eq!(
            rule.due(now, false, every, cfg),
            Due::Off { cleared: false }
        );
    }

    #[test]
    fn every_target_failing_alike_is_nobodys_outlier() {
        let mut p = pool();
        let mut rule = SuccessRateRule::new(AnomalyConfig::default());
        let cfg = AnomalyConfig::default();
        for s in 0..12u64 {
            let now = Time::from_secs(10 * s);
            rule.due(now, true, Duration::from_secs(10), cfg.clone());
            let all_bad = T.iter().map(|&t| (t, Counts::new(100, 100)));
            let j = rule.judge(now, &mut p, all_bad, || 0.0);
            assert!(j.events.is_empty(), "a shared failure ejects nobody");
        }
    }
}
