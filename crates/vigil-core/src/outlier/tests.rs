use super::*;
use proptest::prelude::*;

fn detector(n: usize, config: OutlierConfig) -> OutlierDetector<usize> {
    let mut d = OutlierDetector::new(config);
    for i in 0..n {
        d.add_target(i);
    }
    d
}

fn no_jitter() -> OutlierConfig {
    OutlierConfig {
        max_ejection_jitter: 0.0,
        ..Default::default()
    }
}

#[test]
fn five_consecutive_5xx_eject_for_the_base_time() {
    let mut d = detector(10, no_jitter());
    for i in 0..4 {
        assert_eq!(
            d.observe(&0, Time::from_secs(i), RequestOutcome::Response(500), 0.0),
            None
        );
    }
    let ev = d
        .observe(&0, Time::from_secs(4), RequestOutcome::Response(500), 0.0)
        .expect("the fifth 5xx must eject");
    match ev {
        OutlierEvent::Ejected {
            target,
            reason,
            ejections,
            duration,
            until,
        } => {
            assert_eq!(target, 0);
            assert_eq!(
                reason,
                EjectReason::Consecutive5xx {
                    count: 5,
                    last: RequestOutcome::Response(500)
                }
            );
            assert_eq!(ejections, 1);
            assert_eq!(duration, Duration::from_secs(30));
            assert_eq!(until, Time::from_secs(34));
        }
        other => panic!("expected an ejection, got {other:?}"),
    }
    assert!(d.is_ejected(&0));
    assert!(d.tick(Time::from_secs(33)).is_empty(), "not before until");
    let back = d.tick(Time::from_secs(34));
    assert_eq!(
        back,
        vec![OutlierEvent::Readmitted {
            target: 0,
            ejected_for: Duration::from_secs(30)
        }]
    );
    assert!(!d.is_ejected(&0));
}

#[test]
fn a_success_or_a_4xx_resets_the_streak() {
    let mut d = detector(10, no_jitter());
    for i in 0..4 {
        d.observe(&0, Time::from_secs(i), RequestOutcome::Response(502), 0.0);
    }
    // 4 x 502 is also 4 gateway errors: the 3rd would already have ejected.
    assert!(d.is_ejected(&0), "3 gateway errors eject by default");
    let mut d = detector(10, no_jitter());
    for i in 0..4 {
        d.observe(&1, Time::from_secs(i), RequestOutcome::Response(500), 0.0);
    }
    d.observe(&1, Time::from_secs(5), RequestOutcome::Response(404), 0.0);
    assert_eq!(
        d.consecutive_errors(&1),
        0,
        "a 4xx is not the target's fault"
    );
    for i in 0..4 {
        d.observe(
            &1,
            Time::from_secs(6 + i),
            RequestOutcome::Response(500),
            0.0,
        );
    }
    assert!(!d.is_ejected(&1));
}

#[test]
fn shed_answers_never_eject_and_do_not_reset_a_streak() {
    let mut d = detector(10, no_jitter());
    let mut ev = Vec::new();
    for i in 0..100 {
        for code in [503, 429] {
            ev.extend(d.observe(
                &0,
                Time::from_millis(i),
                RequestOutcome::Response(code),
                0.0,
            ));
        }
    }
    assert!(
        ev.is_empty(),
        "a shedding target is overloaded, not broken: {ev:?}"
    );
    assert!(!d.is_ejected(&0));
    // Four 500s, sheds in between, then a fifth 500: the sheds did not reset it.
    for i in 0..4 {
        d.observe(&1, Time::from_secs(i), RequestOutcome::Response(500), 0.0);
        d.observe(&1, Time::from_secs(i), RequestOutcome::Response(503), 0.0);
    }
    let e = d.observe(&1, Time::from_secs(5), RequestOutcome::Response(500), 0.0);
    assert!(matches!(e, Some(OutlierEvent::Ejected { .. })), "{e:?}");
}

#[test]
fn gateway_errors_eject_after_three() {
    let mut d = detector(10, no_jitter());
    d.observe(&2, Time::ZERO, RequestOutcome::ConnectFailure, 0.0);
    d.observe(&2, Time::ZERO, RequestOutcome::Timeout, 0.0);
    let ev = d
        .observe(&2, Time::ZERO, RequestOutcome::Reset, 0.0)
        .unwrap();
    assert!(
        matches!(
            ev,
            OutlierEvent::Ejected {
                reason: EjectReason::ConsecutiveGatewayErrors { count: 3, .. },
                ..
            }
        ),
        "{ev:?}"
    );
    assert!(
        ev.to_string().contains("3 consecutive gateway errors"),
        "{ev}"
    );
}

#[test]
fn ejection_time_grows_with_repeated_ejections_and_is_capped() {
    let c = OutlierConfig {
        max_ejection_time: Duration::from_secs(100),
        ..no_jitter()
    };
    assert_eq!(c.ejection_time(1, 0.0), Duration::from_secs(30));
    assert_eq!(c.ejection_time(2, 0.0), Duration::from_secs(60));
    assert_eq!(c.ejection_time(3, 0.0), Duration::from_secs(90));
    assert_eq!(c.ejection_time(4, 0.0), Duration::from_secs(100));
    let j = OutlierConfig::default();
    assert_eq!(j.ejection_time(1, 0.5), Duration::from_millis(33_750));

    let mut d = detector(10, c);
    let mut now = Time::ZERO;
    let mut durations = Vec::new();
    for _ in 0..3 {
        let mut ev = None;
        for _ in 0..5 {
            ev = ev.or(d.observe(&0, now, RequestOutcome::Response(500), 0.0));
        }
        let Some(OutlierEvent::Ejected {
            duration, until, ..
        }) = ev
        else {
            panic!("expected ejection, got {ev:?}")
        };
        durations.push(duration.as_secs());
        now = until;
        d.tick(now);
    }
    assert_eq!(
        durations,
        vec![30, 60, 90],
        "immediate re-ejections must back off"
    );
}

#[test]
fn past_ejections_are_forgiven_with_time_in_service() {
    let mut d = detector(10, no_jitter());
    let eject = |d: &mut OutlierDetector<usize>, now| {
        let mut ev = None;
        for _ in 0..5 {
            ev = ev.or(d.observe(&0, now, RequestOutcome::Response(500), 0.0));
        }
        match ev {
            Some(OutlierEvent::Ejected {
                ejections, until, ..
            }) => (ejections, until),
            other => panic!("expected ejection, got {other:?}"),
        }
    };
    let (n, until) = eject(&mut d, Time::ZERO);
    assert_eq!(n, 1);
    d.tick(until);
    let (n, until) = eject(&mut d, until + Duration::from_secs(1));
    assert_eq!(n, 2);
    d.tick(until);
    // 60 s in service = 2 x base: both past ejections forgiven.
    let (n, _) = eject(&mut d, until + Duration::from_secs(60));
    assert_eq!(n, 1);
}

#[test]
fn never_more_than_max_ejection_percent_but_always_one() {
    let mut d = detector(4, no_jitter());
    assert_eq!(d.config().max_ejected(4), 1, "10% of 4 rounds up to one");
    for _ in 0..5 {
        d.observe(&0, Time::ZERO, RequestOutcome::Response(500), 0.0);
    }
    assert!(d.is_ejected(&0));
    let mut events = Vec::new();
    for _ in 0..10 {
        events.extend(d.observe(&1, Time::ZERO, RequestOutcome::Response(500), 0.0));
    }
    assert!(!d.is_ejected(&1), "a second ejection of 4 exceeds 10%");
    assert_eq!(
        events.len(),
        1,
        "skipped ejection is reported once per streak"
    );
    assert!(
        events[0]
            .to_string()
            .contains("1 of at most 1 targets already ejected"),
        "{}",
        events[0]
    );
    // Once target 0 is back, target 1's next error ejects it.
    d.tick(Time::from_secs(30));
    let ev = d.observe(&1, Time::from_secs(31), RequestOutcome::Response(500), 0.0);
    assert!(matches!(ev, Some(OutlierEvent::Ejected { target: 1, .. })));
}

#[test]
fn an_ejection_from_outside_follows_the_same_limits_and_times() {
    let reason = EjectReason::SuccessRate {
        failed: 20,
        requests: 100,
        peers: 3,
        peers_rate: 0.001,
        p_value: 1e-30,
        threshold: 2.5e-4,
    };
    let mut d = detector(4, no_jitter());
    let ev = d.eject(&0, Time::ZERO, reason, 0.0).expect("ejects");
    assert!(
        matches!(ev, OutlierEvent::Ejected { ejections: 1, duration, .. } if duration == Duration::from_secs(30)),
        "{ev:?}"
    );
    assert_eq!(
        ev.to_string(),
        "target 0 ejected for 30s after a success-rate outlier: 20.0% errors (20 of 100 requests) vs 0.10% for its 3 peers (binomial p=1.0e-30 < 2.5e-4) (ejection #1)"
    );
    assert_eq!(
        d.eject(&0, Time::ZERO, reason, 0.0),
        None,
        "already ejected"
    );
    assert_eq!(d.eject(&9, Time::ZERO, reason, 0.0), None, "unknown target");
    // One of four is the most: the next is refused, every time it is asked.
    for _ in 0..2 {
        let skipped = d.eject(&1, Time::ZERO, reason, 0.0);
        assert!(
            matches!(
                skipped,
                Some(OutlierEvent::EjectionSkipped {
                    ejected: 1,
                    limit: 1,
                    ..
                })
            ),
            "{skipped:?}"
        );
    }
    assert!(!d.is_ejected(&1));
    // Readmitted by tick like any other; a second ejection lasts twice as long.
    d.tick(Time::from_secs(30));
    assert!(!d.is_ejected(&0));
    let again = d.eject(&0, Time::from_secs(31), reason, 0.0);
    assert!(
        matches!(again, Some(OutlierEvent::Ejected { ejections: 2, .. })),
        "{again:?}"
    );
}

#[test]
fn zero_percent_disables_ejection() {
    let mut d = detector(
        4,
        OutlierConfig {
            max_ejection_percent: 0,
            ..no_jitter()
        },
    );
    for _ in 0..10 {
        d.observe(&0, Time::ZERO, RequestOutcome::Response(500), 0.0);
    }
    assert!(!d.is_ejected(&0));
}

#[test]
fn outcomes_while_ejected_are_ignored() {
    let mut d = detector(10, no_jitter());
    for _ in 0..5 {
        d.observe(&0, Time::ZERO, RequestOutcome::Response(500), 0.0);
    }
    let until = d.ejection(&0).unwrap().until;
    for _ in 0..20 {
        assert_eq!(
            d.observe(&0, Time::from_secs(1), RequestOutcome::Response(500), 0.0),
            None
        );
    }
    d.observe(&0, Time::from_secs(1), RequestOutcome::Response(200), 0.0);
    assert_eq!(d.ejection(&0).unwrap().until, until);
    assert_eq!(d.ejections(&0), 1);
}

#[test]
fn bad_config_names_the_key() {
    let bad = OutlierConfig {
        max_ejection_percent: 101,
        ..Default::default()
    };
    assert!(bad.validate().unwrap_err().key == "max_ejection_percent");
    let bad = OutlierConfig {
        max_ejection_jitter: 2.0,
        ..Default::default()
    };
    assert!(bad.validate().unwrap_err().key == "max_ejection_jitter");
    let bad = OutlierConfig {
        max_ejection_time: Duration::from_secs(1),
        ..Default::default()
    };
    assert!(bad.validate().unwrap_err().key == "max_ejection_time");
    assert!(OutlierConfig::default().validate().is_ok());
}

fn any_outcome() -> impl Strategy<Value = RequestOutcome> {
    prop_oneof![
        3 => Just(RequestOutcome::Response(200)),
        3 => Just(RequestOutcome::Response(500)),
        1 => Just(RequestOutcome::Response(503)),
        1 => Just(RequestOutcome::Response(502)),
        1 => Just(RequestOutcome::Response(429)),
        1 => Just(RequestOutcome::Response(404)),
        1 => Just(RequestOutcome::ConnectFailure),
        1 => Just(RequestOutcome::Timeout),
        1 => Just(RequestOutcome::Reset),
    ]
}

proptest! {
    /// Whatever the outcomes, never more than the limit is ejected, every ejection
    /// lasts between its nominal time and nominal x (1 + jitter), and no target comes
    /// back before its time.
    #[test]
    fn ejections_stay_bounded_and_last_their_time(
        n in 1usize..30,
        pct in 0u32..=100,
        jitter_max in 0.0f64..=1.0,
        steps in proptest::collection::vec((0usize..30, any_outcome(), 0u64..5000, 0.0f64..1.0), 1..400),
    ) {
        let config = OutlierConfig {
            max_ejection_percent: pct,
            max_ejection_jitter: jitter_max,
            base_ejection_time: Duration::from_secs(3),
            max_ejection_time: Duration::from_secs(10),
            ..Default::default()
        };
        let mut d = detector(n, config);
        let limit = config.max_ejected(n);
        let mut now = Time::ZERO;
        for (t, outcome, dt, jitter) in steps {
            now = now + Duration::from_millis(dt);
            for ev in d.tick(now) {
                let OutlierEvent::Readmitted { target, ejected_for } = ev else {
                    panic!("tick only readmits");
                };
                prop_assert!(ejected_for >= Duration::from_secs(3), "target {target} back after {ejected_for:?}");
            }
            if let Some(OutlierEvent::Ejected { ejections, duration, .. }) = d.observe(&(t % n), now, outcome, jitter) {
                let nominal = Duration::from_secs(3).saturating_mul(ejections).min(Duration::from_secs(10));
                prop_assert!(duration >= nominal);
                prop_assert!(duration <= nominal.mul_f64(1.0 + jitter_max) + Duration::from_nanos(1));
            }
            prop_assert!(d.ejected_count() <= limit, "{} ejected > limit {limit}", d.ejected_count());
        }
    }
}
