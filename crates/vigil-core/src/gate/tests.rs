//! The gate's promises: readiness stops pulling at once and resumes without flapping, the
//! kill switch trips on a black hole and backs off, poison is told from sickness.

use super::*;
use std::collections::VecDeque;

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
    let now = secs(1);
    assert_eq!(
        g.on_failure(now, "w1", &[], None),
        Disposition::Requeue {
            stamp: Some(Evidence::Message)
        }
    );
    assert_eq!(
        g.on_failure(now, "w1", &[FailedOn::message("w1")], None),
        Disposition::Requeue {
            stamp: Some(Evidence::Message)
        },
        "the same worker again says nothing about the message"
    );
    assert_eq!(
        g.on_failure(
            now,
            "w2",
            &[FailedOn::message("w1")],
            Some(Duration::from_secs(1))
        ),
        Disposition::Requeue {
            stamp: Some(Evidence::Message)
        },
        "two workers at once may be the start of a shared outage"
    );
    assert_eq!(
        g.on_failure(now, "w2", &[FailedOn::message("w1")], None),
        Disposition::Requeue {
            stamp: Some(Evidence::Message)
        },
        "a stamp that does not say when is counted from now"
    );
    assert_eq!(
        g.on_failure(
            now,
            "w2",
            &[FailedOn::message("w1")],
            Some(Duration::from_secs(5))
        ),
        Disposition::DeadLetter { workers: 2 }
    );
    let mut sick = WorkerGate::new(GateConfig::default(), Time::ZERO);
    sick.observe_readiness(secs(1), Err("disk:free".into()));
    assert_eq!(
        sick.on_failure(
            now,
            "w2",
            &[FailedOn::message("w1")],
            Some(Duration::from_secs(9))
        ),
        Disposition::Requeue { stamp: None },
        "a sick worker's failure is not the message's"
    );
}

#[test]
fn a_failure_on_a_worker_failing_broadly_never_counts_toward_poison() {
    let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    for i in 1..=30 {
        g.record(ms(100 * i), true);
    }
    assert_eq!(g.evidence(ms(3_050)), Evidence::Message);
    // One failure among its last 20 outcomes: still otherwise succeeding.
    g.record(ms(3_100), false);
    assert_eq!(g.evidence(ms(3_150)), Evidence::Message);
    // Two (10%, the trip rate): failing broadly, its failure says nothing about its message.
    g.record(ms(3_200), false);
    assert_eq!(g.evidence(ms(3_250)), Evidence::Worker);
    let long_ago = Some(Duration::from_secs(60));
    assert_eq!(
        g.on_failure(ms(3_250), "w2", &[FailedOn::message("w1")], long_ago),
        Disposition::Requeue {
            stamp: Some(Evidence::Worker)
        },
        "dead-lettering is suspended while the worker fails"
    );
    // 18 successes later the two failures are still among its last 20.
    for i in 1..=18 {
        g.record(ms(3_200 + 10 * i), true);
    }
    assert_eq!(g.evidence(ms(3_400)), Evidence::Worker);
    g.record(ms(3_400), true);
    assert_eq!(
        g.evidence(ms(3_450)),
        Evidence::Message,
        "the first aged out"
    );
    // A stamp whose failures all pointed at their workers is no evidence either.
    let h = WorkerGate::new(GateConfig::default(), Time::ZERO);
    let excused = [FailedOn {
        worker: "w1",
        evidence: Evidence::Worker,
    }];
    assert_eq!(
        h.on_failure(secs(1), "w2", &excused, long_ago),
        Disposition::Requeue {
            stamp: Some(Evidence::Message)
        }
    );
    // Old outcomes age out with the kill switch's window: an idle worker counts.
    assert_eq!(
        g.evidence(ms(3_450) + Duration::from_secs(60)),
        Evidence::Message
    );
}

#[test]
fn a_worker_on_probation_is_no_witness() {
    let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    for i in 1..=100 {
        g.record(ms(100 * i), false);
    }
    assert_eq!(
        g.tick(secs(70)),
        Some(GateChange::Resumed { probation: true })
    );
    // Its recent outcomes aged out during the pause, but probation is still no evidence.
    assert_eq!(g.evidence(secs(71)), Evidence::Worker);
}

/// A message in the little fleet of [`run_fleet`].
#[derive(Clone, Debug)]
struct Msg {
    poison: bool,
    stamp: Vec<(String, Evidence)>,
    /// When the first failure that pointed at it happened.
    since: Option<Time>,
}

/// What [`run_fleet`] counted.
#[derive(Debug, Default)]
struct FleetRun {
    poison_produced: u64,
    processed: u64,
    dead_healthy: u64,
    dead_poison: u64,
    left: usize,
    /// When every gate pulled again after the dependency came back (first 100 ms step).
    all_pulling_at: Option<Time>,
}

/// A fleet of `n` workers sharing one queue for `for_secs`: 20 fresh messages a second
/// (every 50th one poison when `poison`), the workers finishing one message every
/// 25 ms in turn when they may pull, failing every message while `dependency_down` says so at
/// that time and every poison message always. `naive`: the rule before issue 36.
fn run_fleet(
    n: usize,
    for_secs: u64,
    poison: bool,
    dependency_down: impl Fn(Time) -> bool,
    naive: bool,
) -> FleetRun {
    run_fleet_checked(n, for_secs, poison, dependency_down, naive, false)
}

/// [`run_fleet`], the workers also checking the dependency once a second when
/// `dependency_checks` (rule 4).
fn run_fleet_checked(
    n: usize,
    for_secs: u64,
    poison: bool,
    dependency_down: impl Fn(Time) -> bool,
    naive: bool,
    dependency_checks: bool,
) -> FleetRun {
    let mut gates: Vec<WorkerGate> = (0..n)
        .map(|_| WorkerGate::new(GateConfig::default(), Time::ZERO))
        .collect();
    let ids: Vec<String> = (0..n).map(|i| format!("w{i}")).collect();
    let mut queue: VecDeque<Msg> = VecDeque::new();
    let mut run = FleetRun::default();
    let mut produced = 0u64;
    for step in 1..=for_secs * 40 {
        let now = ms(25 * step);
        if step.is_multiple_of(2) {
            produced += 1;
            run.poison_produced += u64::from(poison && produced.is_multiple_of(50));
            queue.push_back(Msg {
                poison: poison && produced.is_multiple_of(50),
                stamp: Vec::new(),
                since: None,
            });
        }
        // One worker finishes a message every 25 ms, in turn (staggered, as real
        // workers are): each of 4 every 100 ms.
        for g in &mut gates {
            g.tick(now);
            if dependency_checks && step.is_multiple_of(40) {
                let r = if dependency_down(now) {
                    Err("db:connect refused".to_string())
                } else {
                    Ok(())
                };
                g.observe_dependencies(now, r);
            }
        }
        if run.all_pulling_at.is_none()
            && now > ms(25)
            && dependency_down(now - Duration::from_millis(25))
            && !dependency_down(now)
        {
            // The dependency just came back: from now on, watch for the fleet.
            run.all_pulling_at = Some(Time::ZERO);
        }
        if run.all_pulling_at == Some(Time::ZERO) && gates.iter().all(|g| g.may_pull()) {
            run.all_pulling_at = Some(now);
        }
        let w = (step as usize) % n;
        let g = &mut gates[w];
        if !g.may_pull() {
            continue;
        }
        let Some(m) = queue.pop_front() else { continue };
        let ok = !m.poison && !dependency_down(now);
        if ok {
            run.processed += 1;
            g.record(now, true);
            continue;
        }
        let failed_on: Vec<FailedOn<'_>> = m
            .stamp
            .iter()
            .map(|(id, e)| FailedOn {
                worker: id,
                evidence: *e,
            })
            .collect();
        let d = if naive {
            g.record(now, false);
            naive_disposition(2, &ids[w], &failed_on)
        } else {
            g.message_failed(now, &ids[w], &failed_on, m.since.map(|t| now.since(t)))
                .0
        };
        match d {
            Disposition::DeadLetter { .. } if m.poison => run.dead_poison += 1,
            Disposition::DeadLetter { .. } => run.dead_healthy += 1,
            Disposition::Requeue { stamp } => {
                let mut m = m;
                if stamp == Some(Evidence::Message) && m.since.is_none() {
                    m.since = Some(now);
                }
                if let Some(e) = stamp {
                    match m.stamp.iter_mut().find(|(id, _)| *id == ids[w]) {
                        Some(entry) if e == Evidence::Message => entry.1 = e,
                        Some(_) => {}
                        None => m.stamp.push((ids[w].clone(), e)),
                    }
                }
                queue.push_back(m);
            }
        }
    }
    run.left = queue.len();
    run
}

#[test]
fn a_shared_outage_dead_letters_nothing_and_the_old_rule_did() {
    // Every worker loses the dependency from 60 s to 110 s (the 50 s blip).
    let down = |t: Time| (secs(60)..secs(110)).contains(&t);
    let vigil = run_fleet(4, 600, false, down, false);
    assert_eq!(
        vigil.dead_healthy, 0,
        "a shared outage must not dead-letter healthy messages: {vigil:?}"
    );
    assert!(vigil.processed > 11_000, "the fleet works again: {vigil:?}");
    let naive = run_fleet(4, 600, false, down, true);
    assert!(
        naive.dead_healthy >= 10,
        "the rule before issue 36 dead-letters healthy messages in a shared outage: {naive:?}"
    );
}

#[test]
fn a_poison_message_on_healthy_workers_is_still_dead_lettered() {
    let vigil = run_fleet(4, 300, true, |_| false, false);
    // One in 50 of 6,000 messages is poison: 120, all dead-lettered but the few of the
    // last seconds, still going round their 5 s.
    assert_eq!(vigil.poison_produced, 120);
    assert!(
        vigil.dead_poison >= 116,
        "poison among healthy workers must be dead-lettered: {vigil:?}"
    );
    assert_eq!(vigil.dead_healthy, 0, "{vigil:?}");
    assert!(vigil.left < 10, "nothing piles up: {vigil:?}");
    // And during a shared outage, poison is kept until the workers succeed again, then
    // dead-lettered; nothing healthy is.
    let down = |t: Time| (secs(30)..secs(60)).contains(&t);
    let mixed = run_fleet(4, 600, true, down, false);
    assert_eq!(mixed.dead_healthy, 0, "{mixed:?}");
    assert!(
        mixed.dead_poison + 4 >= mixed.poison_produced,
        "poison from the outage is dead-lettered after it: {mixed:?}"
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

// === rule 4: a shared blip ends the pause when it is over ===

/// A gate whose kill switch tripped at 10 s (100 failures in 10 s).
fn tripped() -> WorkerGate {
    let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    for i in 1..=100 {
        g.record(ms(100 * i), false);
    }
    assert!(!g.may_pull());
    g
}

#[test]
fn a_pause_whose_dependency_checks_failed_ends_when_they_pass_again() {
    let mut g = tripped();
    assert!(!g.pause_is_shared(), "nothing said the cause is shared yet");
    assert_eq!(g.observe_dependencies(secs(12), Err("db".into())), None);
    assert!(g.pause_is_shared());
    assert!(g.to_string().contains("a shared cause"), "{g}");
    assert_eq!(
        g.observe_dependencies(secs(20), Ok(())),
        None,
        "one pass is not enough"
    );
    assert_eq!(
        g.observe_dependencies(secs(21), Ok(())),
        Some(GateChange::Resumed { probation: true }),
        "the shared cause is gone: probation at once, not at 70 s"
    );
    // Probation still judges: failing again pauses it for twice as long.
    let mut change = None;
    for i in 1..=10 {
        change = g.record(secs(21) + Duration::from_millis(100 * i), false);
    }
    let Some(GateChange::Paused(Pause::KillSwitch { until, .. })) = change else {
        panic!("{change:?}");
    };
    assert_eq!(until, secs(22) + Duration::from_secs(120));
}

#[test]
fn a_trip_while_the_dependency_checks_fail_is_shared_from_the_start() {
    let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
    g.observe_dependencies(secs(1), Err("db".into()));
    for i in 1..=100 {
        g.record(secs(1) + Duration::from_millis(100 * i), false);
    }
    assert!(g.pause_is_shared());
    g.observe_dependencies(secs(12), Ok(()));
    assert_eq!(
        g.observe_dependencies(secs(13), Ok(())),
        Some(GateChange::Resumed { probation: true })
    );
}

#[test]
fn a_pause_whose_dependency_checks_never_failed_waits_its_time() {
    let mut g = tripped();
    for t in 11..70 {
        assert_eq!(g.observe_dependencies(secs(t), Ok(())), None, "at {t} s");
        assert_eq!(g.tick(secs(t)), None, "at {t} s");
    }
    assert!(!g.pause_is_shared());
    assert_eq!(
        g.tick(secs(70)),
        Some(GateChange::Resumed { probation: true })
    );
    // Dependency checks that fail and pass while the gate pulls change nothing.
    let mut h = WorkerGate::new(GateConfig::default(), Time::ZERO);
    assert_eq!(h.observe_dependencies(secs(1), Err("db".into())), None);
    assert_eq!(h.observe_dependencies(secs(2), Ok(())), None);
    assert!(h.may_pull());
}

#[test]
fn after_a_shared_blip_the_fleet_pulls_again_together_within_seconds() {
    // The 50 s blip; the kill switches trip within seconds of its start.
    let down = |t: Time| (secs(60)..secs(110)).contains(&t);
    let checked = run_fleet_checked(4, 300, false, down, false, true);
    let back = checked.all_pulling_at.expect("the fleet pulls again");
    assert!(
        back.since(secs(110)) <= Duration::from_secs(3),
        "two passing checks a second apart: every worker pulls within 3 s, at {back}"
    );
    assert_eq!(checked.dead_healthy, 0, "{checked:?}");
    // Without dependency checks, the pause (60 s from the trip) runs out first.
    let blind = run_fleet(4, 300, false, down, false);
    let blind_back = blind.all_pulling_at.expect("the fleet pulls again");
    assert!(
        blind_back.since(secs(110)) >= Duration::from_secs(8),
        "the whole pause: {blind_back}"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Whatever the fleet's size and the outage's start and length: a dependency every
    /// worker loses dead-letters no healthy message.
    #[test]
    fn no_shared_outage_dead_letters_a_healthy_message(
        n in 2usize..8,
        start_ms in 20_000u64..80_000,
        len_ms in 1_000u64..200_000,
        checks in proptest::bool::ANY,
    ) {
        let down = |t: Time| (ms(start_ms)..ms(start_ms + len_ms)).contains(&t);
        let run = run_fleet_checked(n, 300, false, down, false, checks);
        proptest::prop_assert_eq!(run.dead_healthy, 0, "{:?}", run);
    }
}
