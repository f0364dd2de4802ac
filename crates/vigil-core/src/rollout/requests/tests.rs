//! The request test alone, then whole rollouts judged by the balancer's counts with a
//! simulated balancer (slow start, ~165 requests/s over 6 hosts), as in issue 37.

use super::super::*;
use super::*;
use std::time::Duration;

fn sprt() -> ErrorSprt {
    ErrorSprt {
        alpha: DEFAULT_ALPHA,
        beta: DEFAULT_BETA,
        min_effect: DEFAULT_MIN_EFFECT,
    }
}

#[test]
fn three_errors_against_an_error_free_baseline_fail_and_none_in_300_pass() {
    let old = RequestCounts::new(2000, 0);
    let r = sprt().test(RequestCounts::new(120, 3), old);
    assert_eq!(r.decision, Decision::Fail, "{r}");
    let r = sprt().test(RequestCounts::new(120, 1), old);
    assert!(
        matches!(r.decision, Decision::Inconclusive { .. }),
        "one error decides nothing yet: {r}"
    );
    // The same three errors against an old side that saw few requests: not damning.
    let r = sprt().test(RequestCounts::new(138, 3), RequestCounts::new(246, 0));
    assert!(matches!(r.decision, Decision::Inconclusive { .. }), "{r}");
    let r = sprt().test(RequestCounts::new(320, 0), old);
    assert_eq!(r.decision, Decision::Pass, "{r}");
    let r = sprt().test(RequestCounts::new(50, 0), old);
    assert!(
        matches!(r.decision, Decision::Inconclusive { needs } if needs > 100 && needs < 400),
        "50 clean requests are too few: {r}"
    );
}

#[test]
fn a_new_side_as_good_as_a_noisy_old_side_passes_and_a_worse_one_fails() {
    // 1% errors on both sides: H1 is 2%.
    let old = RequestCounts::new(20_000, 200);
    let r = sprt().test(RequestCounts::new(3000, 30), old);
    assert_eq!(r.decision, Decision::Pass, "{r}");
    let r = sprt().test(RequestCounts::new(3000, 75), old);
    assert_eq!(r.decision, Decision::Fail, "{r}");
}

#[test]
fn needs_is_enough_clean_requests_to_pass() {
    let old = RequestCounts::new(5000, 3);
    for (n, e) in [(0, 0), (40, 0), (200, 1), (900, 4)] {
        let new = RequestCounts::new(n, e);
        let Decision::Inconclusive { needs } = sprt().test(new, old).decision else {
            continue;
        };
        let after = RequestCounts::new(n + needs, e);
        assert_eq!(
            sprt().test(after, old).decision,
            Decision::Pass,
            "{needs} more clean requests after {new} must pass"
        );
    }
}

#[test]
fn the_fixed_limit_needs_the_interval_beyond_it() {
    let limit = FixedLimit {
        limit: 0.05,
        alpha: 0.05,
    };
    assert_eq!(
        limit.test(RequestCounts::new(1, 1)).0,
        Decision::Inconclusive { needs: MAX_NEEDS }
    );
    assert_eq!(
        limit.test(RequestCounts::new(40, 40)).0,
        Decision::Inconclusive { needs: MAX_NEEDS },
        "too few to fail"
    );
    assert_eq!(limit.test(RequestCounts::new(400, 60)).0, Decision::Fail);
    assert_eq!(limit.test(RequestCounts::new(400, 4)).0, Decision::Pass);
    let (d, _, _) = limit.test(RequestCounts::new(20, 0));
    let Decision::Inconclusive { needs } = d else {
        panic!("20 requests are too few: {d:?}")
    };
    assert_eq!(
        limit.test(RequestCounts::new(20 + needs, 0)).0,
        Decision::Pass
    );
    assert!((normal_quantile(0.95) - 1.644_853_6).abs() < 1e-6);
    assert!((normal_quantile(0.001) + 3.090_232_3).abs() < 1e-6);
}

/// A seeded generator (splitmix64): no dependency, same draws on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) as f64 / u64::MAX as f64
    }
}

/// What the simulated balancer and fleet do.
struct Traffic {
    /// Client requests per second over the whole fleet.
    rate: f64,
    /// Error chance per request on the old revision.
    old_errors: f64,
    /// Error chance per request on the new revision.
    new_errors: f64,
}

/// How a simulated rollout ended.
#[derive(Debug)]
struct Outcome {
    phase: Phase,
    waves: usize,
    /// Requests the new revision served and the errors clients got from it.
    new_served: u64,
    new_errors: u64,
    decisions: Vec<String>,
    /// Intervals of the balancer's counts the state holds at the end.
    kept_outcomes: usize,
}

/// Drives a rollout of 6 hosts (one zone) with the defaults but `bake`, a second at a
/// time: a balancer routes `traffic` to the hosts in service by weight, a host
/// undrained `t` seconds ago weighing `max(0.1, t / 10 s)` (vigil lb's default slow
/// start); the driver reads the balancer's counts every 2 s (the default probe
/// interval); an install takes 3 s before the host reports back.
fn simulate(bake: Duration, traffic: &Traffic, seed: u64, limit: u64) -> Outcome {
    let hosts: Vec<HostSpec> = (0..6)
        .map(|i| HostSpec::new(format!("h{i}"), "a", "v1"))
        .collect();
    let config = RolloutConfig {
        bake,
        ..RolloutConfig::default()
    };
    let mut r = Rollout::start(config, hosts, "v2", Time::ZERO).unwrap();
    r.judge_by(Time::ZERO, Evidence::BalancerRequests);
    let mut rng = Rng(seed);
    let ids: Vec<String> = (0..6).map(|i| format!("h{i}")).collect();
    // Per host: in service since (None: drained), running revision, cumulative counts.
    let mut since: BTreeMap<String, Option<u64>> =
        ids.iter().map(|h| (h.clone(), Some(0))).collect();
    let mut running: BTreeMap<String, String> =
        ids.iter().map(|h| (h.clone(), "v1".to_string())).collect();
    let mut counts: BTreeMap<String, RequestCounts> = ids
        .iter()
        .map(|h| (h.clone(), RequestCounts::default()))
        .collect();
    let mut reports: Vec<(u64, String, String)> = Vec::new();
    let (mut new_served, mut new_errors) = (0, 0);
    for s in 1..=limit {
        let now = Time::from_secs(s);
        for c in r.poll(now) {
            match c {
                Command::Drain { host } => {
                    since.insert(host.clone(), None);
                    r.drained(now, &host);
                }
                Command::Install { host, revision, .. } => {
                    since.insert(host.clone(), None);
                    running.insert(host.clone(), revision.clone());
                    r.installed(now, &host, Ok(()));
                    reports.push((s + 3, host, revision));
                }
                Command::Undrain { host } => {
                    since.insert(host, Some(s));
                }
                Command::Alert { .. } => {}
            }
        }
        for (at, host, revision) in std::mem::take(&mut reports) {
            if at <= s {
                r.report(now, &host, &revision, true);
            } else {
                reports.push((at, host, revision));
            }
        }
        if r.is_finished() {
            break;
        }
        // One second of traffic.
        let weights: Vec<(String, f64)> = ids
            .iter()
            .filter_map(|h| since[h].map(|t| (h.clone(), ((s - t) as f64 / 10.0).clamp(0.1, 1.0))))
            .collect();
        let total: f64 = weights.iter().map(|(_, w)| w).sum();
        for (h, w) in &weights {
            let expect = traffic.rate * w / total;
            let n = expect.floor() as u64 + u64::from(rng.next() < expect.fract());
            let is_new = running[h] == "v2";
            let p = if is_new {
                traffic.new_errors
            } else {
                traffic.old_errors
            };
            let e = (0..n).filter(|_| rng.next() < p).count() as u64;
            if is_new {
                new_served += n;
                new_errors += e;
            }
            let c = counts.get_mut(h).unwrap();
            *c = c.plus(RequestCounts::new(n, e));
        }
        if s % 2 == 0 {
            for h in &ids {
                r.outcomes(now, h, counts[h]);
                r.report(now, h, &running[h], true);
            }
        }
    }
    Outcome {
        phase: r.phase().clone(),
        waves: r.waves().len(),
        new_served,
        new_errors,
        decisions: r.decisions().iter().map(|d| d.what.clone()).collect(),
        kept_outcomes: r.hosts.values().map(|h| h.outcomes.len()).sum(),
    }
}

/// Issue 37's revision: 500 on 5% of POSTs, about half the traffic.
const BAD: Traffic = Traffic {
    rate: 165.0,
    old_errors: 0.0,
    new_errors: 0.025,
};

#[test]
fn five_percent_errors_on_posts_fail_wave_one_with_15s_and_40s_bakes() {
    for bake in [15, 40] {
        for seed in 1..=30 {
            let o = simulate(Duration::from_secs(bake), &BAD, seed, 600);
            assert!(
                matches!(o.phase, Phase::RolledBack { .. }) && o.waves == 1,
                "bake {bake}s seed {seed}: the bad revision must stop in wave 1: {o:#?}"
            );
            assert!(
                o.new_errors <= 10,
                "bake {bake}s seed {seed}: halted within a few client errors: {o:#?}"
            );
            let failed = o.decisions.iter().find(|d| d.contains("fails")).unwrap();
            assert!(failed.contains("by the balancer's counts"), "{failed}");
        }
    }
}

#[test]
fn a_good_revision_completes_with_15s_bakes() {
    for (seed, old_errors) in (1..=30).zip([0.0, 0.002].into_iter().cycle()) {
        let good = Traffic {
            rate: 165.0,
            old_errors,
            new_errors: old_errors,
        };
        let o = simulate(Duration::from_secs(15), &good, seed, 900);
        assert_eq!(
            o.phase,
            Phase::Completed,
            "seed {seed}, background errors {old_errors}: {o:#?}"
        );
        assert_eq!(o.waves, 6);
        assert!(o.new_served > 0);
        assert!(
            o.kept_outcomes <= 6 * 20,
            "the counts of past waves are not kept: {}",
            o.kept_outcomes
        );
        let last = o
            .decisions
            .iter()
            .rev()
            .find(|d| d.starts_with("wave 6 passes"))
            .unwrap();
        assert!(
            last.contains("compared with the old hosts' counts of wave 5"),
            "{last}"
        );
    }
}

#[test]
fn too_little_traffic_is_inconclusive_and_says_how_many_requests_it_needs() {
    let sparse = Traffic {
        rate: 2.0,
        old_errors: 0.0,
        new_errors: 0.0,
    };
    let o = simulate(Duration::from_secs(15), &sparse, 7, 60);
    let Phase::Held { wave: 0, reason } = &o.phase else {
        panic!("a wave with a handful of requests must hold: {o:#?}")
    };
    let needs: u64 = reason
        .split("needs ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the hold names the requests it needs: {reason}"));
    assert!(needs > 100, "{reason}");
    assert!(
        reason.contains("more requests on the new hosts"),
        "{reason}"
    );
    // Given time, the same traffic decides it.
    let o = simulate(Duration::from_secs(15), &sparse, 7, 2000);
    assert!(o.waves >= 2, "{o:#?}");
    assert!(
        o.decisions.iter().any(|d| d.starts_with("wave 1 passes")),
        "{o:#?}"
    );
}

#[test]
fn a_wave_failing_in_its_bake_drains_its_hosts_before_reinstalling_them() {
    let hosts: Vec<HostSpec> = (0..6)
        .map(|i| HostSpec::new(format!("h{i}"), "a", "v1"))
        .collect();
    let mut r = Rollout::start(RolloutConfig::default(), hosts, "v2", Time::ZERO).unwrap();
    r.judge_by(Time::ZERO, Evidence::BalancerRequests);
    let t = Time::from_secs;
    let mut commands = r.poll(t(1));
    assert_eq!(commands, vec![Command::Drain { host: "h0".into() }]);
    r.drained(t(1), "h0");
    r.installed(t(1), "h0", Ok(()));
    r.report(t(2), "h0", "v2", true);
    commands = r.poll(t(2));
    assert!(
        commands.contains(&Command::Undrain { host: "h0".into() }),
        "{commands:?}"
    );
    for (s, served, errors) in [(3, 0, 0), (5, 60, 6)] {
        r.outcomes(t(s), "h0", RequestCounts::new(served, errors));
        for h in 1..6 {
            r.outcomes(t(s), &format!("h{h}"), RequestCounts::new(served * 5, 0));
        }
    }
    commands = r.poll(t(5));
    assert!(
        matches!(r.phase(), Phase::RollingBack { .. }),
        "{:?}",
        r.phase()
    );
    assert_eq!(
        commands,
        vec![Command::Drain { host: "h0".into() }],
        "h0 serves clients: drained before its reinstall"
    );
    r.drained(t(6), "h0");
    let commands = r.poll(t(6));
    assert!(
        matches!(&commands[..], [Command::Install { host, revision, key }] if host == "h0" && revision == "v1" && key.contains(":rollback:")),
        "{commands:?}"
    );
    r.installed(t(7), "h0", Ok(()));
    r.report(t(8), "h0", "v1", true);
    assert!(
        r.poll(t(8))
            .contains(&Command::Undrain { host: "h0".into() })
    );
    assert!(
        matches!(r.phase(), Phase::RolledBack { .. }),
        "{:?}",
        r.phase()
    );
}
