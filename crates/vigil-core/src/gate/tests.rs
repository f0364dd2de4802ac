//! The gate's promises: readiness stops pulling at once and resumes without flapping, the
//! kill switch trips on a black hole and backs off, poison is told from sickness.

use super::*;

fn secs(s: u64) -> Time {
    Time::from_secs(s)
}

fn ms(v: u64) -> Time {
    Time::from_millis(v)
}

#[test]
fn a_failed_readiness_check_stops_pulling_at_once_and_two_passes_resume_it() {
    let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    assert_eq!(g.observe_readiness(secs(5), Ok(())), None);
    let change = g.observe_readiness(secs(10), Err("fd:open 99% used".into()));
    assert_eq!(
        change,
        Some(GateChange::Paused(Pause::Unready {
            reason: "fd:open 99% used".into()
        }))
    );
    assert!(!g.may_pull(), "must stop at the first failed check");
    assert_eq!(
        g.observe_readiness(secs(15), Ok(())),
        None,
        "one pass is not enough"
    );
    assert!(!g.may_pull());
    assert_eq!(
        g.observe_readiness(secs(20), Ok(())),
        Some(GateChange::Resumed { probation: false })
    );
    assert!(g.may_pull());
}

#[test]
fn readiness_failing_every_other_check_keeps_the_worker_stopped() {
    let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    let mut changes = 0;
    for i in 1..=100 {
        let r = if i % 2 == 0 {
            Ok(())
        } else {
            Err("disk:free".to_string())
        };
        changes += usize::from(g.observe_readiness(secs(5 * i), r).is_some());
        if i > 1 {
            assert!(!g.may_pull(), "check {i}: a flapping host must stay out");
        }
    }
    assert_eq!(changes, 1, "one pause, no toggling");
}

#[test]
fn a_black_hole_trips_the_kill_switch_and_pauses_with_growing_backoff() {
    let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    // 10 messages a second, every one failing while local checks pass.
    let mut t = 0;
    let mut change = None;
    while change.is_none() {
        t += 100;
        change = g.record(ms(t), false);
    }
    assert_eq!(t, 10_000, "trips at the 100th message");
    let Some(GateChange::Paused(Pause::KillSwitch {
        failed: 100,
        of: 100,
        until,
    })) = change
    else {
        panic!("{change:?}");
    };
    assert_eq!(until, ms(10_000) + Duration::from_secs(60));
    assert!(!g.may_pull());
    assert_eq!(
        g.record(ms(10_100), false),
        None,
        "outcomes while paused are ignored"
    );
    assert_eq!(g.tick(ms(69_999)), None);
    assert_eq!(
        g.tick(ms(70_000)),
        Some(GateChange::Resumed { probation: true })
    );
    assert!(g.to_string().contains("probation"), "{g}");
    // Still broken: ten probe messages, then a pause twice as long.
    let mut change = None;
    for i in 1..=10 {
        change = g.record(ms(70_000 + 100 * i), false);
    }
    let Some(GateChange::Paused(Pause::KillSwitch {
        failed: 10,
        of: 10,
        until,
    })) = change
    else {
        panic!("{change:?}");
    };
    assert_eq!(until, ms(71_000) + Duration::from_secs(120));
}

#[test]
fn a_worker_that_recovers_on_probation_pulls_normally() {
    let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    for i in 1..=100 {
        g.record(ms(100 * i), false);
    }
    g.tick(secs(70));
    for i in 1..=10 {
        assert_eq!(
            g.record(secs(70) + Duration::from_millis(100 * i), true),
            None
        );
    }
    assert!(g.may_pull());
    assert_eq!(g.to_string(), "pulling");
}

#[test]
fn few_failures_or_few_messages_never_trip_it() {
    let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    // 99 failures: under min_messages.
    for i in 1..=99 {
        assert_eq!(g.record(ms(100 * i), false), None);
    }
    // Then a steady 5% failure rate for an hour.
    let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    for i in 1..=36_000u64 {
        assert_eq!(g.record(ms(100 * i), i % 20 != 0), None, "message {i}");
    }
}

/// The duty-cycle case: a fault on for a minute, off for a minute, for two hours.
/// Without backoff the switch would trip once a cycle (60 times); with it, the pauses grow
/// to `max_pause` and the worker pauses about once per 10 minutes at most.
#[test]
fn a_fifty_percent_duty_cycle_fault_does_not_make_it_toggle_every_cycle() {
    let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    let mut pauses = 0;
    for step in 1..=72_000u64 {
        let now = ms(100 * step);
        let fault_on = (now.as_elapsed().as_secs() / 60).is_multiple_of(2);
        if let Some(GateChange::Paused(_)) = g.tick(now) {
            pauses += 1;
        }
        if g.may_pull()
            && let Some(GateChange::Paused(_)) = g.record(now, !fault_on)
        {
            pauses += 1;
        }
    }
    // About one pause per max_pause (10 min) plus the ramp up to it: 15 here.
    assert!(pauses <= 18, "{pauses} pauses in 2 hours");
    assert!(pauses >= 4, "the fault is still acted on: {pauses}");
}

#[test]
fn the_pause_length_resets_after_a_calm_period() {
    let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    let fail_burst = |g: &mut WorkerGate, from: Time| {
        let mut last = None;
        for i in 1..=100 {
            if let Some(c) = g.record(from + Duration::from_millis(10 * i), false) {
                last = Some(c);
            }
        }
        last
    };
    fail_burst(&mut g, Time::ZERO);
    g.tick(secs(61));
    for i in 1..=10 {
        g.record(secs(61) + Duration::from_millis(i), true);
    }
    // Calm for 10 minutes, then a new burst: the first pause again.
    g.tick(secs(61 + 600));
    let Some(GateChange::Paused(Pause::KillSwitch { until, .. })) = fail_burst(&mut g, secs(700))
    else {
        panic!("trips again");
    };
    assert_eq!(
        until,
        secs(700) + Duration::from_millis(1000) + Duration::from_secs(60)
    );
}

#[test]
fn a_message_failing_on_two_workers_is_poison_and_one_sick_worker_is_not() {
    let g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    assert_eq!(
        g.on_failure("w1", &[]),
        Disposition::Requeue { stamp: true }
    );
    assert_eq!(
        g.on_failure("w1", &["w1"]),
        Disposition::Requeue { stamp: true },
        "the same worker again says nothing about the message"
    );
    assert_eq!(
        g.on_failure("w2", &["w1"]),
        Disposition::DeadLetter { workers: 2 }
    );
    let mut sick = WorkerGate::new(GateConfig::default(), Time::ZERO);
    sick.observe_readiness(secs(1), Err("disk:free".into()));
    assert_eq!(
        sick.on_failure("w2", &["w1"]),
        Disposition::Requeue { stamp: false },
        "a sick worker's failure is not the message's"
    );
}

#[test]
fn config_errors_name_the_key() {
    assert!(GateConfig::default().validate().is_ok());
    let bad = |f: fn(&mut GateConfig)| {
        let mut c = GateConfig::default();
        f(&mut c);
        c.validate().unwrap_err().key
    };
    assert!(bad(|c| c.kill_switch.trip_rate = 1.0) == "kill_switch.trip_rate");
    assert!(bad(|c| c.kill_switch.max_pause = Duration::from_secs(1)) == "kill_switch.max_pause");
    assert!(bad(|c| c.kill_switch.probe_messages = 0) == "kill_switch.probe_messages");
    assert!(bad(|c| c.poison_workers = 1) == "poison_workers");
    assert!(bad(|c| c.readiness.healthy_threshold = 0).starts_with("readiness."));
    let c: GateConfig = toml::from_str("[kill_switch]\nmin_messages = 50\n").unwrap();
    assert_eq!(
        (c.kill_switch.min_messages, c.kill_switch.trip_rate),
        (50, DEFAULT_KILL_TRIP_RATE)
    );
}

#[test]
fn a_readiness_table_setting_one_threshold_keeps_the_gates_default_for_the_other() {
    // Setting only `healthy_threshold` used to bring the active checks' unhealthy
    // threshold (3) with it: the worker then kept pulling through two failed checks.
    let c: GateConfig = toml::from_str("[readiness]\nhealthy_threshold = 4\n").unwrap();
    assert_eq!(c.readiness.healthy_threshold, 4);
    assert_eq!(c.readiness.unhealthy_threshold, 1, "the gate's default");
    let c: GateConfig = toml::from_str("[readiness]\nunhealthy_threshold = 2\n").unwrap();
    assert_eq!(c.readiness.healthy_threshold, 2);
    assert_eq!(c.readiness.unhealthy_threshold, 2);
    let c: GateConfig = toml::from_str("").unwrap();
    assert_eq!(c, GateConfig::default());
    let e = toml::from_str::<GateConfig>("[readiness]\nhealthy = 4\n").unwrap_err();
    assert!(e.to_string().contains("healthy"), "{e}");
}
