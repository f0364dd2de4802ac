//! Scenarios first (the cases the module doc promises), then proptest invariants.

use super::*;
use proptest::prelude::*;

fn secs(s: u64) -> Time {
    Time::from_secs(s)
}

/// Feeds `seconds` seconds of traffic: member i handles `per_sec` requests a second and
/// fails `rates[i]` of them (spread evenly, deterministically).
fn feed(
    d: &mut AnomalyDetector,
    cohort: &str,
    names: &[&str],
    rates: &[f64],
    per_sec: u64,
    seconds: u64,
) {
    let mut owed = vec![0.0f64; names.len()];
    for s in 0..seconds {
        for (i, name) in names.iter().enumerate() {
            owed[i] += rates[i] * per_sec as f64;
            let failed = (owed[i].floor() as u64).min(per_sec);
            owed[i] -= failed as f64;
            d.record(secs(s), name, cohort, Counts::new(per_sec - failed, failed));
        }
    }
}

fn finding_of<'a>(v: &'a [MemberVerdict], member: &str) -> &'a MemberVerdict {
    v.iter()
        .find(|v| v.member == member)
        .expect("every member has a verdict")
}

#[test]
fn binomial_tail_matches_exact_small_cases() {
    // P(X >= 8), X ~ B(10, 1/2) = (45 + 10 + 1) / 1024.
    let p = binomial_upper_tail(10, 8, 0.5);
    assert!((p - 56.0 / 1024.0).abs() < 1e-12, "{p}");
    // P(X >= 1), X ~ B(3, 0.1) = 1 - 0.9^3.
    let p = binomial_upper_tail(3, 2, 0.1);
    assert!((p - (3.0 * 0.01 * 0.9 + 0.001)).abs() < 1e-12, "{p}");
    assert_eq!(
        binomial_upper_tail(100, 3, 0.5),
        1.0,
        "below the mean is no evidence"
    );
    assert_eq!(binomial_upper_tail(10, 11, 0.5), 0.0);
    // Huge volumes stay finite and fast.
    let p = binomial_upper_tail(1_000_000, 200_000, 0.001);
    assert!((0.0..1e-300).contains(&p), "{p}");
}

#[test]
fn a_black_hole_among_peers_at_five_percent_is_an_outlier_within_thirty_seconds() {
    let mut d = AnomalyDetector::new(AnomalyConfig::default());
    let names = ["w1", "w2", "w3", "w4"];
    feed(&mut d, "v1", &names, &[0.05, 0.05, 0.05, 1.0], 10, 30);
    let v = d.evaluate(secs(30));
    let bad = finding_of(&v, "w4");
    assert_eq!(bad.finding, Finding::Outlier, "{bad}");
    assert!(bad.test.unwrap().p_value < 1e-100, "{bad}");
    assert!((bad.peers.pooled_rate - 0.05).abs() < 0.01, "{bad}");
    for name in &names[..3] {
        assert!(
            !finding_of(&v, name).is_outlier(),
            "{}",
            finding_of(&v, name)
        );
    }
    let text = bad.to_string();
    assert!(
        text.contains("100.0% failed of 300 vs 3 peers at 5.0% pooled"),
        "{text}"
    );
}

#[test]
fn a_target_at_twenty_percent_among_peers_at_a_tenth_of_a_percent_is_found() {
    // The balancer's case: consecutive-error ejection rarely sees 5 errors in a row here.
    let mut d = AnomalyDetector::new(AnomalyConfig::default());
    feed(
        &mut d,
        "",
        &["a", "b", "c", "d", "e"],
        &[0.001, 0.001, 0.001, 0.001, 0.2],
        100,
        60,
    );
    let v = d.evaluate(secs(60));
    assert!(finding_of(&v, "e").is_outlier(), "{}", finding_of(&v, "e"));
    assert_eq!(v.iter().filter(|v| v.is_outlier()).count(), 1);
}

#[test]
fn a_very_healthy_fleet_has_no_outlier() {
    // envoy #37723: 0.1% among peers at 0.01% is ten times worse and significant at this
    // volume, yet healthy.
    let mut d = AnomalyDetector::new(AnomalyConfig::default());
    feed(
        &mut d,
        "",
        &["a", "b", "c", "d"],
        &[0.0001, 0.0001, 0.0001, 0.001],
        10_000,
        60,
    );
    let v = d.evaluate(secs(60));
    let d_v = finding_of(&v, "d");
    assert!(
        d_v.test.unwrap().p_value < d_v.test.unwrap().threshold,
        "the test alone would eject: {d_v}"
    );
    assert_eq!(
        d_v.finding,
        Finding::BelowFloor {
            floor: DEFAULT_FLOOR
        },
        "{d_v}"
    );
}

#[test]
fn slightly_worse_at_high_volume_is_not_an_outlier() {
    let mut d = AnomalyDetector::new(AnomalyConfig::default());
    feed(
        &mut d,
        "",
        &["a", "b", "c", "d"],
        &[0.06, 0.06, 0.06, 0.11],
        1_000,
        60,
    );
    let v = d.evaluate(secs(60));
    assert_eq!(
        finding_of(&v, "d").finding,
        Finding::NotWorse { min_ratio: 2.0 },
        "{}",
        finding_of(&v, "d")
    );
}

#[test]
fn a_shared_failure_makes_nobody_an_outlier() {
    let mut d = AnomalyDetector::new(AnomalyConfig::default());
    // Three of five fail together (a dependency): shared.
    feed(
        &mut d,
        "",
        &["a", "b", "c", "d", "e"],
        &[0.0, 0.0, 1.0, 0.9, 0.95],
        10,
        30,
    );
    let v = d.evaluate(secs(30));
    assert!(v.iter().all(|v| !v.is_outlier()), "{v:#?}");
    assert_eq!(
        finding_of(&v, "c").finding,
        Finding::SharedFailure { failing: 3, of: 5 }
    );
    assert!(finding_of(&v, "c").to_string().contains("shared cause"));
}

#[test]
fn too_few_peers_is_reported_but_never_acted_on() {
    let mut d = AnomalyDetector::new(AnomalyConfig::default());
    feed(&mut d, "", &["a", "b", "c"], &[0.0, 0.0, 1.0], 10, 30);
    let v = d.evaluate(secs(30));
    let c = finding_of(&v, "c");
    assert_eq!(c.finding, Finding::TooFewPeers { peers: 2, min: 3 }, "{c}");
    assert!(!c.is_outlier());
    assert!(
        c.test.unwrap().p_value < 1e-50,
        "the evidence is still reported: {c}"
    );
}

#[test]
fn low_volume_is_not_judged() {
    let mut d = AnomalyDetector::new(AnomalyConfig::default());
    feed(
        &mut d,
        "",
        &["a", "b", "c", "d"],
        &[0.0, 0.0, 0.0, 0.0],
        10,
        30,
    );
    d.record(secs(30), "e", "", Counts::new(0, 19));
    let v = d.evaluate(secs(30));
    assert_eq!(finding_of(&v, "e").finding, Finding::LowVolume { min: 20 });
    d.record(secs(31), "e", "", Counts::new(0, 1));
    assert!(
        finding_of(&d.evaluate(secs(31)), "e").is_outlier(),
        "20 failures of 20 against a clean fleet"
    );
}

#[test]
fn cohorts_compare_like_with_like() {
    let mut d = AnomalyDetector::new(AnomalyConfig::default());
    // v2 fails 15% everywhere (a bad version: the rollout's business, not a black hole);
    // v1 is clean. Compared across versions every v2 member would be an outlier.
    feed(&mut d, "v1", &["a1", "a2", "a3", "a4"], &[0.0; 4], 10, 30);
    feed(&mut d, "v2", &["b1", "b2", "b3", "b4"], &[0.15; 4], 10, 30);
    let v = d.evaluate(secs(30));
    assert!(v.iter().all(|v| !v.is_outlier()), "{v:#?}");
    assert_eq!(finding_of(&v, "b1").peers.count, 3);
    let mut mixed = AnomalyDetector::new(AnomalyConfig::default());
    feed(
        &mut mixed,
        "",
        &["a1", "a2", "a3", "a4", "a5", "a6", "b1"],
        &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.15],
        10,
        30,
    );
    assert!(
        finding_of(&mixed.evaluate(secs(30)), "b1").is_outlier(),
        "without cohorts it would be"
    );
}

#[test]
fn a_member_that_recovers_is_cleared_once_its_failures_leave_the_window() {
    let mut d = AnomalyDetector::new(AnomalyConfig::default());
    let names = ["a", "b", "c", "d"];
    feed(&mut d, "", &names, &[0.0, 0.0, 0.0, 1.0], 10, 30);
    assert!(finding_of(&d.evaluate(secs(30)), "d").is_outlier());
    for s in 30..100 {
        for n in names {
            d.record(secs(s), n, "", Counts::new(10, 0));
        }
    }
    assert!(!finding_of(&d.evaluate(secs(100)), "d").is_outlier());
    d.expire(secs(100));
    assert!(
        d.state.members["d"].buckets.len() <= 13,
        "old buckets are dropped"
    );
}

#[test]
fn totals_are_differenced_and_a_restart_counts_from_zero() {
    let mut d = AnomalyDetector::new(AnomalyConfig::default());
    d.record_totals(secs(0), "w", "", Counts::new(5_000, 4_000));
    assert_eq!(
        d.evaluate(secs(0))[0].counts,
        Counts::default(),
        "history before the first report is not judged"
    );
    d.record_totals(secs(10), "w", "", Counts::new(5_050, 4_010));
    assert_eq!(d.evaluate(secs(10))[0].counts, Counts::new(50, 10));
    d.record_totals(secs(20), "w", "", Counts::new(7, 3));
    assert_eq!(
        d.evaluate(secs(20))[0].counts,
        Counts::new(57, 13),
        "a restart counts its new totals"
    );
}

#[test]
fn changing_cohort_starts_afresh() {
    let mut d = AnomalyDetector::new(AnomalyConfig::default());
    d.record(secs(0), "w", "v1", Counts::new(0, 100));
    d.record(secs(1), "w", "v2", Counts::new(10, 0));
    let v = d.evaluate(secs(1));
    assert_eq!(
        (v[0].cohort.as_str(), v[0].counts),
        ("v2", Counts::new(10, 0))
    );
}

#[test]
fn config_errors_name_the_key() {
    let bad = |f: fn(&mut AnomalyConfig)| {
        let mut c = AnomalyConfig::default();
        f(&mut c);
        c.validate().unwrap_err().key
    };
    assert!(AnomalyConfig::default().validate().is_ok());
    assert!(bad(|c| c.floor = 0.0) == "floor");
    assert!(bad(|c| c.significance = 1.5) == "significance");
    assert!(bad(|c| c.shared_fraction = f64::NAN) == "shared_fraction");
    assert!(bad(|c| c.min_ratio = 0.5) == "min_ratio");
    assert!(bad(|c| c.min_peers = 0) == "min_peers");
    assert!(bad(|c| c.bucket = Duration::ZERO) == "bucket");
    assert!(bad(|c| c.window = Duration::from_secs(1)) == "window");
    let err = toml::from_str::<AnomalyConfig>("flor = 0.2")
        .unwrap_err()
        .to_string();
    assert!(err.contains("flor"), "unknown keys are rejected: {err}");
}

proptest! {
    /// Whatever the traffic: never more outliers in a cohort than the shared fraction
    /// allows, none under the floor, none with too few peers or too little volume, and a
    /// restored detector judges the same.
    #[test]
    fn outliers_are_bounded_and_always_justified(
        members in proptest::collection::vec((0u64..40, 0u64..40, 0u8..2), 1..12),
        rounds in 1u64..8,
    ) {
        let config = AnomalyConfig::default();
        let mut d = AnomalyDetector::new(config.clone());
        for r in 0..rounds {
            for (i, &(ok, failed, cohort)) in members.iter().enumerate() {
                d.record(secs(r * 7), &format!("m{i}"), &format!("c{cohort}"), Counts::new(ok, failed));
            }
        }
        let now = secs(rounds * 7);
        let verdicts = d.evaluate(now);
        prop_assert_eq!(verdicts.len(), members.len());
        for cohort in ["c0", "c1"] {
            let of_cohort: Vec<_> = verdicts.iter().filter(|v| v.cohort == cohort).collect();
            let judged = of_cohort.iter().filter(|v| v.counts.total() >= config.min_volume).count();
            let outliers = of_cohort.iter().filter(|v| v.is_outlier()).count();
            prop_assert!(outliers as f64 <= config.shared_fraction * judged as f64);
        }
        for v in verdicts.iter().filter(|v| v.is_outlier()) {
            prop_assert!(v.rate >= config.floor);
            prop_assert!(v.counts.total() >= config.min_volume);
            prop_assert!(v.peers.count >= config.min_peers);
            prop_assert!(v.rate >= config.min_ratio * v.peers.pooled_rate);
            let t = v.test.unwrap();
            prop_assert!(t.p_value < t.threshold);
        }
        let saved = serde_json::to_string(d.state()).unwrap();
        let restored = AnomalyDetector::restore(config, serde_json::from_str(&saved).unwrap());
        prop_assert_eq!(restored.evaluate(now), verdicts);
    }

    /// The tail sum agrees with the direct sum of the probability mass function.
    #[test]
    fn binomial_tail_agrees_with_the_direct_sum(n in 1u64..60, k in 0u64..60, p in 0.01f64..0.99) {
        let k = k.min(n);
        let direct: f64 = (k..=n).map(|i| {
            let ln_c = libm::lgamma(n as f64 + 1.0) - libm::lgamma(i as f64 + 1.0) - libm::lgamma((n - i) as f64 + 1.0);
            (ln_c + i as f64 * p.ln() + (n - i) as f64 * (1.0 - p).ln()).exp()
        }).sum();
        let tail = binomial_upper_tail(n, k, p);
        if (k as f64) > n as f64 * p && k > 0 {
            prop_assert!((tail - direct).abs() <= 1e-9 * direct.max(1e-300) + 1e-15, "n={} k={} p={} tail={} direct={}", n, k, p, tail, direct);
        } else {
            prop_assert_eq!(tail, 1.0);
        }
    }
}
