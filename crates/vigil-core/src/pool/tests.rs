//! Tests of the pool policies: fail-open, slow start, selection, retry budget.

use super::*;
use proptest::prelude::*;

const T: [&str; 4] = ["a", "b", "c", "d"];

fn secs(s: u64) -> Time {
    Time::from_secs(s)
}

fn no_jitter() -> PoolConfig {
    PoolConfig {
        outlier: OutlierConfig {
            max_ejection_jitter: 0.0,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A pool of a, b, c, d, all healthy at t=2 (two passing checks each).
fn healthy_pool(config: PoolConfig) -> Pool<&'static str> {
    let mut p = Pool::new("api", config);
    for t in T {
        p.add_target(t, TargetSpec::default(), Time::ZERO);
    }
    for s in 1..=2 {
        for t in T {
            p.observe_probe(&t, secs(s), true, "HTTP 200");
        }
    }
    p
}

/// The routing set of a pool whose targets (name, weight) are in service at once.
fn routes_of(targets: &[(&'static str, u32)]) -> RoutingSet<&'static str> {
    let mut p = Pool::new(
        "api",
        PoolConfig {
            new_targets: NewTargets::Healthy,
            ..Default::default()
        },
    );
    for &(t, weight) in targets {
        let spec = TargetSpec {
            weight,
            ..Default::default()
        };
        p.add_target(t, spec, Time::ZERO);
    }
    p.routing_set(Time::ZERO)
}

fn fail(p: &mut Pool<&'static str>, t: &'static str, from: u64) -> Vec<PoolEvent<&'static str>> {
    (0..3)
        .flat_map(|i| p.observe_probe(&t, secs(from + i), false, "HTTP 503 fail"))
        .collect()
}

#[test]
fn new_targets_get_no_traffic_until_checked() {
    let mut p = Pool::new("api", PoolConfig::default());
    p.add_target("a", TargetSpec::default(), Time::ZERO);
    assert!(
        p.routing_set(Time::ZERO).is_empty(),
        "unknown targets get no traffic"
    );
    assert_eq!(p.fail_open(), None, "a warming pool is not in fail-open");
    p.observe_probe(&"a", secs(1), true, "HTTP 200");
    assert!(p.routing_set(secs(1)).is_empty(), "one pass is not enough");
    let ev = p.observe_probe(&"a", secs(2), true, "HTTP 200");
    assert!(
        matches!(
            ev.as_slice(),
            [PoolEvent::Health {
                to: HealthState::Healthy,
                ..
            }]
        ),
        "{ev:?}"
    );
    assert_eq!(p.routing_set(secs(2)).len(), 1);
}

#[test]
fn new_targets_healthy_get_traffic_at_once() {
    let mut p = Pool::new(
        "api",
        PoolConfig {
            new_targets: NewTargets::Healthy,
            ..Default::default()
        },
    );
    p.add_target("a", TargetSpec::default(), Time::ZERO);
    assert_eq!(p.routing_set(Time::ZERO).len(), 1);
}

#[test]
fn unhealthy_targets_leave_the_routing_set_and_say_why() {
    let mut p = healthy_pool(PoolConfig::default());
    let ev = fail(&mut p, "a", 3);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].left_service(), Some(&"a"));
    assert_eq!(
        ev[0].to_string(),
        "pool api: target a unhealthy (was healthy) after 3 failed checks; last: HTTP 503 fail"
    );
    let routes = p.routing_set(secs(10));
    assert_eq!(routes.len(), 3);
    assert!(routes.routes.iter().all(|r| r.key != "a"));
}

/// Without hysteresis: leave as soon as the fraction is back at the threshold.
fn no_hysteresis() -> PoolConfig {
    PoolConfig {
        panic_exit_margin: 0.0,
        panic_exit_dwell: Duration::ZERO,
        panic_exit_ramp: Duration::ZERO,
        ..Default::default()
    }
}

#[test]
fn fails_open_below_the_panic_threshold_and_recovers() {
    let mut p = healthy_pool(no_hysteresis());
    fail(&mut p, "a", 3);
    let ev = fail(&mut p, "b", 3);
    assert!(
        !ev.iter().any(|e| matches!(e, PoolEvent::FailOpen { .. })),
        "2/4 = 50% is not below 50%"
    );
    let ev = fail(&mut p, "c", 3);
    let fo: Vec<_> = ev
        .iter()
        .filter(|e| matches!(e, PoolEvent::FailOpen { .. }))
        .collect();
    assert_eq!(fo.len(), 1, "{ev:?}");
    assert_eq!(
        fo[0].to_string(),
        "pool api: 1/4 healthy < 50% panic threshold: failing open (routing to all targets)"
    );
    assert_eq!(p.fail_open(), Some(secs(5)));
    let routes = p.routing_set(secs(6));
    assert!(routes.fail_open);
    assert_eq!(routes.len(), 4, "fail-open routes to every target");

    // c recovers: 2/4 is no longer below 50%, and this pool has no margin nor dwell.
    p.observe_probe(&"c", secs(7), true, "HTTP 200");
    let ev = p.observe_probe(&"c", secs(8), true, "HTTP 200");
    let end = ev
        .iter()
        .find(|e| matches!(e, PoolEvent::FailOpen { entered: false, .. }))
        .expect("fail-open must end when enough recover");
    assert_eq!(
        end.to_string(),
        "pool api: 2/4 healthy >= 50% (panic threshold 50% + margin) for 0s: fail-open ended"
    );
    let routes = p.routing_set(secs(8));
    assert!(!routes.fail_open);
    assert_eq!(routes.len(), 2);
}

/// Ten targets, all healthy at t=2, checks deciding at once (thresholds of 1).
#[test]
fn fail_open_counts_every_target_and_says_which_are_not_checked_yet() {
    // Two new targets: the first fails its checks before the second has a verdict.
    let mut p = Pool::new("api", no_hysteresis());
    p.add_target("a", TargetSpec::default(), Time::ZERO);
    p.add_target("b", TargetSpec::default(), Time::ZERO);
    let ev = fail(&mut p, "a", 1);
    let fo: Vec<String> = ev
        .iter()
        .filter(|e| matches!(e, PoolEvent::FailOpen { .. }))
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        fo,
        [
            "pool api: 0/2 healthy (1 not checked yet, left out of the fraction) < 50% panic threshold: failing open (routing to all targets)"
        ],
        "a pool of two is never \"0/1 healthy\""
    );
    // b passes its checks: 1 of 2 in service, both with a verdict.
    let ev: Vec<String> = (4..6)
        .flat_map(|s| p.observe_probe(&"b", secs(s), true, "HTTP 200"))
        .filter(|e| matches!(e, PoolEvent::FailOpen { .. }))
        .map(|e| e.to_string())
        .collect();
    assert_eq!(
        ev,
        ["pool api: 1/2 healthy >= 50% (panic threshold 50% + margin) for 0s: fail-open ended"]
    );
}

#[test]
fn drained_targets_get_no_traffic_even_in_fail_open_and_never_cause_it() {
    let mut p = healthy_pool(no_hysteresis());
    assert_eq!(p.set_drained(&"z", true, secs(3)), None, "unknown target");
    // Three of four drained: one in service, yet no fail-open (1/1 of the fraction).
    for t in ["a", "b", "c"] {
        let ev = p.set_drained(&t, true, secs(3)).expect("known");
        assert!(ev.is_empty(), "{ev:?}");
    }
    assert_eq!(
        p.set_drained(&"a", true, secs(3)),
        Some(Vec::new()),
        "idempotent"
    );
    assert!(p.fail_open().is_none());
    assert_eq!(p.healthy_counts(), (1, 1));
    let routes = p.routing_set(secs(3));
    assert_eq!(
        routes.routes.iter().map(|r| r.key).collect::<Vec<_>>(),
        ["d"]
    );
    let states: Vec<_> = p.targets(secs(3)).map(|v| (*v.key, v.state)).collect();
    assert_eq!(
        states,
        [
            ("a", TargetState::Drained),
            ("b", TargetState::Drained),
            ("c", TargetState::Drained),
            ("d", TargetState::SlowStart)
        ]
    );
    assert!(!p.is_in_service(&"a") && p.is_drained(&"a"));
    // The last one fails: fail-open, but it routes to d only, never to the drained.
    let ev: Vec<String> = fail(&mut p, "d", 4)
        .iter()
        .filter(|e| matches!(e, PoolEvent::FailOpen { .. }))
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        ev,
        [
            "pool api: 0/4 healthy (3 drained, left out of the fraction) < 50% panic threshold: failing open (routing to all targets)"
        ]
    );
    let routes = p.routing_set(secs(7));
    assert!(routes.fail_open);
    assert_eq!(
        routes.routes.iter().map(|r| r.key).collect::<Vec<_>>(),
        ["d"]
    );
    // Undrained: back in service through slow start, and fail-open ends.
    let ev = p.set_drained(&"a", false, secs(8)).expect("known");
    assert!(
        ev.iter()
            .any(|e| matches!(e, PoolEvent::FailOpen { entered: false, .. })),
        "{ev:?}"
    );
    let a = p.targets(secs(8)).find(|v| *v.key == "a").unwrap();
    assert_eq!(a.state, TargetState::SlowStart);
    assert!(!a.drained);
}

fn pool_of_ten(config: PoolConfig) -> Pool<usize> {
    let mut p = Pool::new(
        "api",
        PoolConfig {
            thresholds: ThresholdsConfig {
                healthy_threshold: 1,
                unhealthy_threshold: 1,
            },
            ..config
        },
    );
    for t in 0..10 {
        p.add_target(t, TargetSpec::default(), Time::ZERO);
        p.observe_probe(&t, secs(2), true, "HTTP 200");
    }
    p
}

fn fail_open_changes(ev: &[PoolEvent<usize>]) -> Vec<bool> {
    ev.iter()
        .filter_map(|e| match e {
            PoolEvent::FailOpen { entered, .. } => Some(*entered),
            _ => None,
        })
        .collect()
}

#[test]
fn leaving_fail_open_needs_the_margin_and_the_dwell() {
    let mut p = pool_of_ten(PoolConfig::default());
    let mut ev = Vec::new();
    for t in 0..6 {
        ev.extend(p.observe_probe(&t, secs(10), false, "timeout"));
    }
    assert_eq!(fail_open_changes(&ev), [true], "4/10 < 50%: {ev:?}");
    // 5/10 is back at the threshold, but not at threshold + margin (60%).
    let ev = p.observe_probe(&0, secs(20), true, "HTTP 200");
    assert!(fail_open_changes(&ev).is_empty(), "5/10 < 60%: {ev:?}");
    assert!(p.fail_open().is_some());
    // 6/10 reaches the exit level at 21 s: the dwell (30 s) starts.
    p.observe_probe(&1, secs(21), true, "HTTP 200");
    assert_eq!(p.next_deadline(), Some(secs(51)));
    assert!(
        fail_open_changes(&p.tick(secs(50))).is_empty(),
        "29 s < 30 s"
    );
    // A dip below the exit level restarts the wait.
    p.observe_probe(&1, secs(40), false, "timeout");
    p.observe_probe(&1, secs(45), true, "HTTP 200");
    assert!(
        fail_open_changes(&p.tick(secs(51))).is_empty(),
        "the dip reset it"
    );
    assert_eq!(p.next_deadline(), Some(secs(75)));
    let ev = p.tick(secs(75));
    assert_eq!(fail_open_changes(&ev), [false], "{ev:?}");
    assert_eq!(
        ev[0].to_string(),
        "pool api: 6/10 healthy >= 60% (panic threshold 50% + margin) for 30s: fail-open ended, unhealthy targets' share ramping down over 20s"
    );
    // Entering again is immediate.
    let ev = p.observe_probe(&0, secs(80), false, "timeout");
    assert!(fail_open_changes(&ev).is_empty(), "5/10 is not below 50%");
    let ev = p.observe_probe(&1, secs(80), false, "timeout");
    assert_eq!(fail_open_changes(&ev), [true], "{ev:?}");
}

#[test]
fn leaving_fail_open_hands_the_load_over_gradually() {
    let mut p = pool_of_ten(PoolConfig::default());
    for t in 0..6 {
        p.observe_probe(&t, secs(10), false, "timeout");
    }
    for t in 0..2 {
        p.observe_probe(&t, secs(20), true, "HTTP 200");
    }
    let share_in_service = |p: &Pool<usize>, now: Time| {
        let routes = p.routing_set(now);
        let total: f64 = routes.routes.iter().map(|r| r.effective_weight(now)).sum();
        let ins: f64 = routes
            .routes
            .iter()
            .filter(|r| p.is_in_service(&r.key))
            .map(|r| r.effective_weight(now))
            .sum();
        ins / total
    };
    let during = share_in_service(&p, secs(49));
    assert!(
        (during - 0.6).abs() < 1e-9,
        "fail-open: 6 of 10 equal shares"
    );
    assert_eq!(fail_open_changes(&p.tick(secs(50))), [false]);
    assert_eq!(p.leaving_fail_open(secs(50)), Some(secs(50)));
    // At the exit the split is the fail-open one; then the 4 unhealthy targets' share
    // goes down linearly over 20 s, so no step dumps their load on the others.
    let mut last = during;
    for s in 50..=71 {
        let share = share_in_service(&p, secs(s));
        assert!(
            share - last <= 0.05,
            "share of the targets in service jumped from {last} to {share} at {s}s"
        );
        assert!(share >= last - 1e-9, "and only grows");
        last = share;
    }
    assert!(
        (last - 1.0).abs() < 1e-9,
        "after the ramp they carry it all"
    );
    let half = p.routing_set(secs(60));
    let unhealthy = half.routes.iter().find(|r| r.key == 4).unwrap();
    assert!((unhealthy.effective_weight(secs(60)) - 0.5).abs() < 1e-9);
    assert_eq!(p.leaving_fail_open(secs(70)), None);
    assert_eq!(
        p.routing_set(secs(70)).len(),
        6,
        "only the targets in service"
    );
}

#[test]
fn pool_defaults_are_the_documented_ones() {
    let c = PoolConfig::default();
    assert_eq!(c.panic_threshold, 0.5);
    assert_eq!(c.panic_exit_margin, 0.1);
    assert_eq!(c.panic_exit_dwell, Duration::from_secs(30));
    assert_eq!(c.panic_exit_ramp, Duration::from_secs(20));
}

#[test]
fn panic_threshold_zero_never_fails_open() {
    let mut p = healthy_pool(PoolConfig {
        panic_threshold: 0.0,
        ..Default::default()
    });
    for t in T {
        fail(&mut p, t, 3);
    }
    assert_eq!(p.fail_open(), None);
    assert!(p.routing_set(secs(9)).is_empty());
}

#[test]
fn outlier_ejection_then_slow_start_ramp() {
    let mut p = healthy_pool(no_jitter());
    let mut ev = Vec::new();
    for _ in 0..5 {
        ev.extend(p.observe_request(&"a", secs(3), RequestOutcome::Response(500), 0.0));
    }
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].left_service(), Some(&"a"));
    assert!(
        ev[0].to_string().starts_with(
            "pool api: target a ejected for 30s after 5 consecutive errors (last: HTTP 500)"
        ),
        "{}",
        ev[0]
    );
    assert_eq!(p.routing_set(secs(4)).len(), 3);
    assert_eq!(p.next_deadline(), Some(secs(33)));
    let back = p.tick(secs(33));
    assert_eq!(back.len(), 1);
    assert_eq!(
        back[0].to_string(),
        "pool api: target a readmitted after 30s ejected"
    );

    // Slow start: 10% at readmission, 50% halfway through the 10 s window, full after.
    let routes = p.routing_set(secs(33));
    let a = routes.routes.iter().find(|r| r.key == "a").unwrap();
    assert!((a.effective_weight(secs(33)) - 0.1).abs() < 1e-9);
    assert!((a.effective_weight(secs(38)) - 0.5).abs() < 1e-9);
    assert!((a.effective_weight(secs(43)) - 1.0).abs() < 1e-9);
    let view = p.targets(secs(35)).find(|v| *v.key == "a").unwrap();
    assert_eq!(view.state, TargetState::SlowStart);
    assert_eq!(view.ejections, 1);
    let view = p.targets(secs(50)).find(|v| *v.key == "a").unwrap();
    assert_eq!(view.state, TargetState::Healthy);
}

#[test]
fn outlier_detection_is_bounded_by_max_ejection_percent() {
    let mut p = healthy_pool(no_jitter());
    let mut ev = Vec::new();
    for t in ["a", "b"] {
        for _ in 0..5 {
            ev.extend(p.observe_request(&t, secs(3), RequestOutcome::Response(500), 0.0));
        }
    }
    assert_eq!(
        p.routing_set(secs(3)).len(),
        3,
        "only one of four may be ejected"
    );
    assert!(
        ev.iter().any(|e| matches!(
            e,
            PoolEvent::Outlier {
                event: OutlierEvent::EjectionSkipped { target: "b", .. },
                ..
            }
        )),
        "{ev:?}"
    );
}

#[test]
fn reload_keeps_state_of_known_targets() {
    let mut p = healthy_pool(PoolConfig::default());
    fail(&mut p, "a", 3);
    p.set_targets(
        ["a", "b", "e"].map(|t| (t, TargetSpec::default())),
        secs(20),
    );
    let states: Vec<_> = p.targets(secs(20)).map(|v| (*v.key, v.state)).collect();
    assert_eq!(
        states,
        vec![
            ("a", TargetState::Unhealthy),
            ("b", TargetState::Healthy),
            ("e", TargetState::Unknown)
        ]
    );
    p.reconfigure(
        PoolConfig {
            panic_threshold: 0.9,
            ..Default::default()
        },
        secs(21),
    );
    assert!(
        p.fail_open().is_some(),
        "1/2 healthy < 90% after the reload"
    );
}

#[test]
fn least_request_scans_every_target_weighted_and_shares_ties() {
    let routes = routes_of(&[("a", 1), ("b", 1), ("c", 1), ("d", 1)]);
    // P2C could pick c (the second busiest) when it samples b and c; this never does.
    let load = |k: &&str| match *k {
        "a" => 3,
        "b" => 9,
        "c" => 5,
        _ => 1,
    };
    for r in [0, 1, 2, 3, u64::MAX] {
        assert_eq!(
            routes.pick_least(Time::ZERO, r, load, |_| false),
            Some(&"d")
        );
    }
    assert_eq!(
        routes.pick_least(Time::ZERO, 0, load, |k| *k == "d"),
        Some(&"a"),
        "skipped targets are never picked"
    );
    assert_eq!(routes.pick_least(Time::ZERO, 0, load, |_| true), None);
    // Equal loads: the random start spreads picks over every target.
    let picked: std::collections::BTreeSet<&str> = (0..4)
        .filter_map(|r| routes.pick_least(Time::ZERO, r, |_| 0, |_| false).copied())
        .collect();
    assert_eq!(picked.len(), 4, "{picked:?}");

    // Weighted: twice the weight takes twice the load before it loses.
    let routes = routes_of(&[("heavy", 2), ("light", 1)]);
    let load = |heavy: u64, light: u64| move |k: &&str| if *k == "heavy" { heavy } else { light };
    // Score (load + 1) / weight.
    assert_eq!(
        routes.pick_least(Time::ZERO, 1, load(3, 0), |_| false),
        Some(&"light"),
        "4/2 vs 1/1"
    );
    assert_eq!(
        routes.pick_least(Time::ZERO, 1, load(2, 1), |_| false),
        Some(&"heavy"),
        "3/2 vs 2/1"
    );
}

#[test]
fn p2c_prefers_the_less_loaded_of_two() {
    let routes = routes_of(&[("a", 1), ("b", 1)]);
    let load = |k: &&str| if *k == "a" { 10 } else { 0 };
    for r in [[0, 0], [u64::MAX, 0], [1 << 63, 12345]] {
        assert_eq!(
            routes.pick_p2c(Time::ZERO, r, load, |_| false),
            Some(&"b"),
            "with two targets both are always compared"
        );
    }
    assert_eq!(
        routes.pick_p2c(Time::ZERO, [0, 0], load, |k| *k == "b"),
        Some(&"a"),
        "skipped targets are never picked"
    );
    assert_eq!(routes.pick_p2c(Time::ZERO, [0, 0], load, |_| true), None);
}

#[test]
fn round_robin_rotates_and_respects_weights() {
    let mut p = Pool::new(
        "api",
        PoolConfig {
            new_targets: NewTargets::Healthy,
            ..Default::default()
        },
    );
    for t in ["a", "b", "c"] {
        p.add_target(t, TargetSpec::default(), Time::ZERO);
    }
    let routes = p.routing_set(Time::ZERO);
    let picks: Vec<_> = (0..6)
        .map(|i| *routes.pick_round_robin(Time::ZERO, i, |_| false).unwrap())
        .collect();
    assert_eq!(picks, ["a", "b", "c", "a", "b", "c"]);
    let picks: Vec<_> = (0..4)
        .map(|i| {
            *routes
                .pick_round_robin(Time::ZERO, i, |k| *k == "b")
                .unwrap()
        })
        .collect();
    assert_eq!(picks, ["a", "c", "a", "c"]);

    p.add_target(
        "c",
        TargetSpec {
            weight: 2,
            zone: None,
        },
        Time::ZERO,
    );
    let routes = p.routing_set(Time::ZERO);
    let mut counts = std::collections::BTreeMap::new();
    for i in 0..4000 {
        *counts
            .entry(*routes.pick_round_robin(Time::ZERO, i, |_| false).unwrap())
            .or_insert(0) += 1;
    }
    assert_eq!(counts["c"], 2000, "weight 2 of 4 gets half: {counts:?}");
}

#[test]
fn shed_answers_raise_the_load_balancing_sees_and_it_decays() {
    let hl = DEFAULT_SHED_PENALTY_HALF_LIFE;
    let mut p = ShedPenalty::default();
    assert_eq!(p.load(secs(0), hl), 0.0);
    for _ in 0..10 {
        p.add(secs(1), hl);
    }
    assert!((p.load(secs(1), hl) - 10.0).abs() < 1e-9);
    assert!(
        (p.load(secs(2), hl) - 5.0).abs() < 1e-9,
        "halves every half-life"
    );
    // P2C on outstanding + penalty: a target failing fast (0 outstanding, shedding) loses
    // to a busy one that answers (3 outstanding).
    let routes = routes_of(&[("shedding", 1), ("busy", 1)]);
    let now = secs(1);
    let load = |k: &&str| {
        if *k == "shedding" {
            p.load(now, hl).round() as u64
        } else {
            3
        }
    };
    for r in [[0, 0], [u64::MAX, 0], [1 << 63, 12345]] {
        assert_eq!(routes.pick_p2c(now, r, load, |_| false), Some(&"busy"));
        assert_eq!(routes.pick_least(now, r[0], load, |_| false), Some(&"busy"));
    }
    // Shedding is not a failure: a pool never ejects a target for it.
    let mut pool = healthy_pool(no_jitter());
    for _ in 0..50 {
        let ev = pool.observe_request(&"a", secs(3), RequestOutcome::Response(503), 0.0);
        assert!(ev.is_empty(), "{ev:?}");
    }
    assert!(pool.is_in_service(&"a"));
}

#[test]
fn retry_budget_allows_the_ratio_plus_the_floor() {
    let mut b = RetryBudget::new(RetryBudgetConfig {
        ratio: 0.2,
        min_retries_per_second: 1,
        window: Duration::from_secs(10),
    });
    // Floor alone: 1/s x 10 s = 10 retries.
    let now = secs(100);
    assert_eq!(b.available(now), 10);
    for _ in 0..100 {
        b.deposit(now);
    }
    assert_eq!(b.available(now), 30, "10 floor + 20% of 100");
    let allowed = (0..100).filter(|_| b.try_withdraw(now)).count();
    assert_eq!(allowed, 30);
    assert!(!b.try_withdraw(now));
    // Everything ages out after the window.
    assert_eq!(b.available(secs(111)), 10);
}

#[test]
fn bad_pool_config_names_the_key() {
    let c = PoolConfig {
        panic_threshold: 50.0,
        ..Default::default()
    };
    assert!(c.validate().unwrap_err().key == "panic_threshold");
    let mut c = PoolConfig::default();
    c.outlier.max_ejection_percent = 200;
    assert!(c.validate().unwrap_err().key == "outlier.max_ejection_percent");
    let mut c = PoolConfig::default();
    c.thresholds.healthy_threshold = 0;
    assert!(c.validate().unwrap_err().key == "thresholds.healthy_threshold");
}

#[test]
fn pool_config_parses_from_toml_with_every_default() {
    // serde defaults: an empty table is the default config.
    let c: PoolConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(c, PoolConfig::default());
    let c: PoolConfig = serde_json::from_str(
        r#"{"slow_start_window": "5s", "outlier": {"base_ejection_time": "1m"}}"#,
    )
    .unwrap();
    assert_eq!(c.slow_start_window, Duration::from_secs(5));
    assert_eq!(c.outlier.base_ejection_time, Duration::from_secs(60));
    assert!(serde_json::from_str::<PoolConfig>(r#"{"panic": 1}"#).is_err());
}

#[derive(Clone, Debug)]
enum Op {
    Probe(usize, bool),
    Request(usize, u16),
    Tick,
    Add(usize),
    Remove(usize),
    Drain(usize, bool),
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..8, any::<bool>()).prop_map(|(t, ok)| Op::Probe(t, ok)),
        4 => (0usize..8, prop_oneof![Just(200u16), Just(500), Just(502)]).prop_map(|(t, c)| Op::Request(t, c)),
        2 => Just(Op::Tick),
        1 => (0usize..8).prop_map(Op::Add),
        1 => (0usize..8).prop_map(Op::Remove),
        1 => (0usize..8, any::<bool>()).prop_map(|(t, d)| Op::Drain(t, d)),
    ]
}

proptest! {
    /// After any sequence of observations: the pool is in fail-open exactly when the
    /// healthy fraction is below the threshold; then it routes to every target, and
    /// otherwise exactly to the targets in service; effective weights stay within
    /// (0, weight]; at most max_ejection_percent of the pool is ejected.
    #[test]
    fn routing_set_follows_the_rules(
        threshold in 0.0f64..=1.0,
        ops in proptest::collection::vec((any_op(), 0u64..3000), 1..300),
        r in any::<[u64; 2]>(),
    ) {
        let mut config = no_jitter();
        config.panic_threshold = threshold;
        config.outlier.base_ejection_time = Duration::from_secs(2);
        config.slow_start_window = Duration::from_secs(3);
        let mut p: Pool<usize> = Pool::new("p", config);
        for t in 0..4 {
            p.add_target(t, TargetSpec::default(), Time::ZERO);
        }
        let mut now = Time::ZERO;
        for (op, dt) in ops {
            now = now + Duration::from_millis(dt);
            match op {
                Op::Probe(t, ok) => { p.observe_probe(&t, now, ok, "x"); }
                Op::Request(t, c) => { p.observe_request(&t, now, RequestOutcome::Response(c), 0.5); }
                Op::Tick => { p.tick(now); }
                Op::Add(t) => { p.add_target(t, TargetSpec::default(), now); }
                Op::Remove(t) => { p.remove_target(&t, now); }
                Op::Drain(t, d) => { p.set_drained(&t, d, now); }
            }
            let (healthy, known) = p.healthy_counts();
            let below = known > 0 && (healthy as f64) < threshold * known as f64;
            let panic = p.fail_open().is_some();
            prop_assert!(panic || !below, "below the threshold ({}/{}) and not in fail-open", healthy, known);
            let routes = p.routing_set(now);
            prop_assert_eq!(routes.fail_open, panic);
            let drained = p.targets(now).filter(|v| v.drained).count();
            for route in &routes.routes {
                prop_assert!(!p.is_drained(&route.key), "a drained target never gets traffic");
            }
            if panic || p.leaving_fail_open(now).is_some() {
                prop_assert_eq!(routes.len(), p.len() - drained, "fail-open (and leaving it) routes to all but the drained");
            } else {
                prop_assert_eq!(routes.len(), healthy);
                for route in &routes.routes {
                    prop_assert!(p.is_in_service(&route.key));
                }
            }
            for route in &routes.routes {
                let w = route.effective_weight(now);
                prop_assert!(w >= 0.0 && w <= f64::from(route.weight), "weight {w}");
                if p.is_in_service(&route.key) || panic {
                    prop_assert!(w > 0.0, "in service or in fail-open: weight {w}");
                }
            }
            let ejected = p.targets(now).filter(|v| v.ejection.is_some()).count();
            prop_assert!(ejected <= config.outlier.max_ejected(p.len()).max(ejected.min(1)));
            if let Some(k) = routes.pick_p2c(now, r, |_| 0, |_| false) {
                prop_assert!(routes.routes.iter().any(|x| x.key == *k));
            } else {
                prop_assert!(routes.is_empty());
            }
        }
    }

    /// Hysteresis: every exit from fail-open needs a period of at least the dwell (30 s)
    /// at or above the exit level (60%), and every entry after the first needs an exit,
    /// so transitions <= 2 x such periods + 1, however the healthy fraction hovers
    /// around the threshold. Exits happen only at or above the exit level.
    #[test]
    fn fail_open_transitions_are_bounded_by_recoveries_that_persist(
        ops in proptest::collection::vec((0usize..10, any::<bool>(), 0u64..20_000, any::<bool>()), 1..400),
    ) {
        const DWELL: Duration = Duration::from_secs(30);
        const LEVEL: f64 = 0.6;
        let mut p = pool_of_ten(PoolConfig::default());
        let mut now = secs(2);
        // (time, fraction) after every step.
        let mut timeline: Vec<(Time, f64)> = vec![(now, 1.0)];
        let mut transitions = 0usize;
        let mut exits = 0usize;
        for (t, ok, dt, tick) in ops {
            now = now + Duration::from_millis(dt);
            let ev = if tick { p.tick(now) } else { p.observe_probe(&t, now, ok, "x") };
            let (healthy, known) = p.healthy_counts();
            let f = healthy as f64 / known as f64;
            for entered in fail_open_changes(&ev) {
                transitions += 1;
                if !entered {
                    exits += 1;
                    prop_assert!(f >= LEVEL - 1e-9, "left fail-open at {}/{}", healthy, known);
                }
            }
            timeline.push((now, f));
        }
        // Periods at or above the exit level that lasted at least the dwell.
        let mut persisted = 0usize;
        let mut start: Option<Time> = None;
        for &(at, f) in &timeline {
            match (f >= LEVEL - 1e-9, start) {
                (true, None) => start = Some(at),
                (false, Some(s)) => {
                    if at.since(s) >= DWELL { persisted += 1; }
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start && now.since(s) >= DWELL {
            persisted += 1;
        }
        prop_assert!(exits <= persisted, "{} exits, {} persisted recoveries", exits, persisted);
        prop_assert!(transitions <= 2 * persisted + 1, "{} transitions, {} persisted recoveries", transitions, persisted);
    }

    /// A ramp down never increases, starts at the full weight, ends at zero.
    #[test]
    fn ramp_down_is_monotonic(
        weight in 1u32..100, window_ms in 1u64..100_000,
        times in proptest::collection::vec(0u64..200_000, 1..50),
    ) {
        let route = Route { key: (), weight, ramp: Some(Ramp { start: Time::ZERO, window: Duration::from_millis(window_ms), min_weight: 0.0, direction: RampDirection::Down }) };
        let mut times = times;
        times.sort();
        let mut last = f64::from(weight);
        prop_assert_eq!(route.effective_weight(Time::ZERO), last);
        for t in times {
            let w = route.effective_weight(Time::from_millis(t));
            prop_assert!(w <= last && w >= 0.0);
            last = w;
        }
        prop_assert_eq!(route.effective_weight(Time::from_millis(window_ms)), 0.0);
    }

    /// Effective weight never decreases during a ramp, and reaches the full weight at
    /// the end of the window.
    #[test]
    fn slow_start_ramp_is_monotonic(
        weight in 1u32..100, min in 0.0f64..=1.0, window_ms in 1u64..100_000,
        times in proptest::collection::vec(0u64..200_000, 1..50),
    ) {
        let route = Route { key: (), weight, ramp: Some(Ramp { start: Time::ZERO, window: Duration::from_millis(window_ms), min_weight: min, direction: RampDirection::Up }) };
        let mut times = times;
        times.sort();
        let mut last = 0.0;
        for t in times {
            let w = route.effective_weight(Time::from_millis(t));
            prop_assert!(w >= last);
            prop_assert!(w <= f64::from(weight));
            last = w;
        }
        prop_assert_eq!(route.effective_weight(Time::from_millis(window_ms)), f64::from(weight));
    }

    /// The bulk calls (per-tick aggregation) decide exactly as the per-request ones.
    #[test]
    fn retry_budget_bulk_calls_equal_per_request_calls(
        ratio in 0.0f64..2.0, floor in 0u32..5,
        steps in proptest::collection::vec((0u64..700, 0u64..50, 0u64..50), 1..100),
    ) {
        let config = RetryBudgetConfig { ratio, min_retries_per_second: floor, window: Duration::from_secs(1) };
        let (mut bulk, mut single) = (RetryBudget::new(config), RetryBudget::new(config));
        let mut now = Time::ZERO;
        for (dt, requests, retries) in steps {
            now = now + Duration::from_millis(dt);
            bulk.deposit_many(now, requests);
            for _ in 0..requests {
                single.deposit(now);
            }
            let granted = bulk.withdraw_up_to(now, retries);
            let one_by_one = (0..retries).filter(|_| single.try_withdraw(now)).count() as u64;
            prop_assert_eq!(granted, one_by_one);
            prop_assert_eq!(bulk.available(now), single.available(now));
        }
    }

    /// The budget never lets retries in any window exceed floor + ratio x requests.
    #[test]
    fn retry_budget_never_exceeds_its_allowance(
        ratio in 0.0f64..1.0, floor in 0u32..5,
        steps in proptest::collection::vec((0u64..500, any::<bool>()), 1..500),
    ) {
        let config = RetryBudgetConfig { ratio, min_retries_per_second: floor, window: Duration::from_secs(1) };
        let mut b = RetryBudget::new(config);
        let mut now = Time::ZERO;
        let mut log: Vec<(Time, bool)> = Vec::new(); // (when, is_retry)
        for (dt, retry) in steps {
            now = now + Duration::from_millis(dt);
            if retry {
                if b.try_withdraw(now) { log.push((now, true)); }
            } else {
                b.deposit(now);
                log.push((now, false));
            }
            // Every retry in the last 0.9 s lies in the bucket window of the latest
            // retry, whose requests all lie in the last 2 s: so retries in the last 0.9 s
            // are at most floor x 1 s + ratio x requests of the last 2 s.
            // (`t + d > now`, not `t > now - d`: `Time` saturates at zero, which would
            // drop the requests made at time zero from the count.)
            let retries = log.iter().filter(|(t, rt)| *rt && *t + Duration::from_millis(900) > now).count();
            let requests = log.iter().filter(|(t, rt)| !rt && *t + Duration::from_secs(2) > now).count();
            prop_assert!(retries as f64 <= f64::from(floor) + ratio * requests as f64 + 1e-9, "{retries} retries for {requests} requests");
        }
    }
}
