//! The rules of `share.rs`, one scenario each, on a 1 s interval.

use super::*;

const I: Duration = Duration::from_secs(1);

fn share(id: &str, budget: usize) -> Share {
    Share::new(ShareSettings {
        id: id.into(),
        probes_per_interval: budget,
        local_every: 10,
        interval: I,
    })
}

fn at(ms: u64) -> Time {
    Time::from_millis(ms)
}

/// A target that `lb-1` does not probe among lb-1, lb-2 and lb-3 (budget 1), and its
/// assigned prober.
fn target_of_other(s: &Share, now: Time) -> (String, String) {
    (0..100)
        .map(|i| format!("10.0.0.{i}:80"))
        .find_map(|t| {
            let p = s.probers_of(&t, now);
            (p[0] != "lb-1").then(|| (t, p[0].clone()))
        })
        .expect("some target is assigned to a peer")
}

fn peered(budget: usize) -> Share {
    let mut s = share("lb-1", budget);
    s.peer_answered("lb-2", at(0));
    s.peer_answered("lb-3", at(0));
    s
}

#[test]
fn alone_every_target_is_probed_every_interval() {
    let mut s = share("lb-1", 1);
    for t in ["a:1", "b:1", "c:1"] {
        assert_eq!(
            s.plan(t, at(0), Turn::Scheduled),
            Plan::Probe(Why::Assigned),
            "with no live peer a balancer probes as if unshared"
        );
    }
}

#[test]
fn budget_one_gives_one_prober_and_two_gives_two() {
    for budget in [1, 2] {
        let s = peered(budget);
        for i in 0..50 {
            let t = format!("10.0.0.{i}:80");
            assert_eq!(s.probers_of(&t, at(0)).len(), budget, "target {t}");
        }
    }
    // Budget 2: each of the three balancers probes about two thirds of the targets.
    let s = peered(2);
    let mine = (0..300)
        .filter(|i| {
            s.probers_of(&format!("10.0.0.{i}:80"), at(0))
                .contains(&"lb-1".to_string())
        })
        .count();
    assert!((150..250).contains(&mine), "lb-1 probes {mine} of 300");
}

#[test]
fn assignment_moves_when_a_peer_dies() {
    let mut s = peered(1);
    let (t, by) = target_of_other(&s, at(0));
    // The other peer keeps answering; `by` falls silent.
    let other = if by == "lb-2" { "lb-3" } else { "lb-2" };
    s.peer_answered(other, at(1900));
    assert!(
        s.live_peers(at(1900)).contains(&by.as_str()),
        "live within 2 intervals"
    );
    assert!(
        !s.live_peers(at(2000)).contains(&by.as_str()),
        "not live after 2 intervals"
    );
    let now_probers = s.probers_of(&t, at(2000));
    assert_eq!(now_probers.len(), 1);
    assert_ne!(
        now_probers[0], by,
        "a dead peer's target moves to a live balancer"
    );
    // Targets of the live balancers did not move.
    for i in 0..100 {
        let x = format!("10.0.0.{i}:80");
        let before = s.probers_of(&x, at(0));
        if before[0] != by {
            assert_eq!(
                s.probers_of(&x, at(2000)),
                before,
                "target {x} moved needlessly"
            );
        }
    }
}

#[test]
fn remote_passes_are_taken_and_the_slow_probe_comes_every_local_every() {
    let mut s = peered(1);
    let (t, by) = target_of_other(&s, at(0));
    // The first turn with a fresh verdict: no local probe yet, so the slow one.
    s.remote(&t, &by, 1, true, "HTTP 200", Duration::ZERO, at(0));
    assert_eq!(s.plan(&t, at(0), Turn::Scheduled), Plan::Probe(Why::Slow));
    assert_eq!(s.local(&t, true, at(10)), None);
    let mut probes = 0;
    let mut taken = 0;
    for n in 1..=20u64 {
        let now = at(n * 1000);
        for p in ["lb-2", "lb-3"] {
            s.peer_answered(p, now);
        }
        s.remote(
            &t,
            &by,
            n + 1,
            true,
            "HTTP 200",
            Duration::from_millis(100),
            now,
        );
        match s.plan(&t, now, Turn::Scheduled) {
            Plan::Probe(Why::Slow) => {
                probes += 1;
                s.local(&t, true, now);
            }
            Plan::Take { by: b, detail } => {
                assert_eq!((b.as_str(), detail.as_str()), (by.as_str(), "HTTP 200"));
                taken += 1;
            }
            other => panic!("turn {n}: {other:?}"),
        }
    }
    assert_eq!(probes, 2, "one slow probe every 10 intervals");
    assert_eq!(taken, 18, "every other turn takes the peer's new pass");
    // The same sequence number again is nothing new.
    let now = at(20_500);
    assert!(!s.remote(&t, &by, 21, true, "HTTP 200", Duration::ZERO, now));
    assert_eq!(s.plan(&t, now, Turn::Scheduled), Plan::Idle);
}

#[test]
fn a_remote_fail_needs_local_confirmation() {
    let mut s = peered(1);
    let (t, by) = target_of_other(&s, at(0));
    s.remote(&t, &by, 1, true, "HTTP 200", Duration::ZERO, at(0));
    assert_eq!(s.plan(&t, at(0), Turn::Scheduled), Plan::Probe(Why::Slow));
    s.local(&t, true, at(0));
    // A fail arrives between turns: wake the checker, which confirms it at once.
    assert!(
        s.remote(
            &t,
            &by,
            2,
            false,
            "HTTP 503",
            Duration::from_millis(50),
            at(500)
        ),
        "a new remote fail wakes the target's checker"
    );
    assert_eq!(
        s.plan(&t, at(500), Turn::Woken),
        Plan::Probe(Why::Confirm { by: by.clone() }),
        "a remote fail is confirmed by a local probe, never taken"
    );
    assert_eq!(
        s.local(&t, false, at(510)),
        None,
        "confirmed: no disagreement"
    );
    // Confirmed once: the woken turn has nothing more, the scheduled one no fail to take.
    assert_eq!(s.plan(&t, at(520), Turn::Woken), Plan::Idle);
    assert_eq!(s.plan(&t, at(1000), Turn::Scheduled), Plan::Idle);
    // The next fail asks again.
    assert!(s.remote(&t, &by, 3, false, "HTTP 503", Duration::ZERO, at(1500)));
    assert_eq!(
        s.plan(&t, at(1500), Turn::Scheduled),
        Plan::Probe(Why::Confirm { by })
    );
}

#[test]
fn a_stale_feed_falls_back_at_two_intervals_not_before() {
    let mut s = peered(1);
    let (t, by) = target_of_other(&s, at(0));
    s.remote(&t, &by, 1, true, "HTTP 200", Duration::ZERO, at(0));
    assert_eq!(s.plan(&t, at(0), Turn::Scheduled), Plan::Probe(Why::Slow));
    s.local(&t, true, at(0));
    // The peers stay live (they answer), but `by` publishes nothing new on `t`.
    for ms in [500, 1000, 1500, 1999] {
        s.peer_answered("lb-2", at(ms));
        s.peer_answered("lb-3", at(ms));
        assert!(
            !matches!(
                s.plan(&t, at(ms), Turn::Scheduled),
                Plan::Probe(Why::Fallback(_))
            ),
            "no fallback at {ms} ms, within 2 intervals"
        );
    }
    s.peer_answered("lb-2", at(2000));
    s.peer_answered("lb-3", at(2000));
    assert_eq!(
        s.plan(&t, at(2000), Turn::Scheduled),
        Plan::Probe(Why::Fallback(Fallback {
            probers: vec![by.clone()],
            silent_for: Some(Duration::from_secs(2)),
            first: true,
        })),
        "2 intervals without a verdict: probe it myself"
    );
    assert_eq!(s.fallback_targets(), 1);
    match s.plan(&t, at(3000), Turn::Scheduled) {
        Plan::Probe(Why::Fallback(f)) => assert!(!f.first, "logged once"),
        other => panic!("{other:?}"),
    }
    // A fresh verdict again ends the fallback.
    s.peer_answered(&by, at(3500));
    s.remote(&t, &by, 2, true, "HTTP 200", Duration::ZERO, at(3500));
    assert!(!matches!(
        s.plan(&t, at(4000), Turn::Scheduled),
        Plan::Probe(Why::Fallback(_))
    ));
    assert_eq!(s.fallback_targets(), 0);
}

#[test]
fn a_dead_peers_targets_are_taken_over() {
    let mut s = peered(1);
    let (t, by) = target_of_other(&s, at(0));
    s.remote(&t, &by, 1, true, "HTTP 200", Duration::ZERO, at(0));
    s.plan(&t, at(0), Turn::Scheduled);
    s.local(&t, true, at(0));
    let other = if by == "lb-2" { "lb-3" } else { "lb-2" };
    s.peer_answered(other, at(2000));
    // `by` is gone: its target is probed every interval, assigned anew or in fallback.
    match s.plan(&t, at(2000), Turn::Scheduled) {
        Plan::Probe(Why::Assigned | Why::Fallback(_)) => {}
        other => panic!("a dead peer's target must be probed every interval: {other:?}"),
    }
}

#[test]
fn a_local_fail_against_a_feed_pass_is_a_disagreement_once_a_later_pass_comes() {
    let mut s = peered(1);
    let (t, by) = target_of_other(&s, at(0));
    s.remote(&t, &by, 1, true, "HTTP 200", Duration::ZERO, at(0));
    assert_eq!(s.plan(&t, at(0), Turn::Scheduled), Plan::Probe(Why::Slow));
    // This balancer's path to `t` is cut: its probe fails, the peer's passed.
    assert_eq!(
        s.local(&t, false, at(100)),
        None,
        "a pass from before is only doubt"
    );
    assert!(s.in_doubt(&t));
    assert_eq!(
        s.plan(&t, at(1000), Turn::Scheduled),
        Plan::Probe(Why::Doubt),
        "in doubt, only local probes count"
    );
    s.remote(&t, &by, 2, true, "HTTP 200", Duration::ZERO, at(900));
    let d = s
        .local(&t, false, at(1000))
        .expect("a later peer pass: a disagreement");
    assert_eq!(d.failing_from(), "lb-1");
    assert_eq!(
        d.to_string(),
        format!(
            "{t} fails from lb-1 only (it passes from {by}): lb-1's path to the target, not the target; lb-1 routes around it, the others keep it"
        )
    );
    // Counted once; still in doubt (no remote pass taken) until the views agree.
    s.peer_answered("lb-2", at(1900));
    s.peer_answered("lb-3", at(1900));
    s.remote(&t, &by, 3, true, "HTTP 200", Duration::ZERO, at(1900));
    assert_eq!(s.local(&t, false, at(2000)), None);
    assert_eq!(
        s.plan(&t, at(2100), Turn::Scheduled),
        Plan::Probe(Why::Doubt)
    );
    assert_eq!(s.local(&t, true, at(2100)), None);
    assert!(!s.in_doubt(&t), "agreeing again ends the doubt");
}

#[test]
fn a_local_pass_against_a_feed_fail_is_a_disagreement_naming_the_peer() {
    let mut s = peered(1);
    let (t, by) = target_of_other(&s, at(0));
    s.remote(&t, &by, 1, true, "HTTP 200", Duration::ZERO, at(0));
    s.plan(&t, at(0), Turn::Scheduled);
    s.local(&t, true, at(0));
    assert!(s.remote(&t, &by, 2, false, "connect failed", Duration::ZERO, at(400)));
    assert_eq!(
        s.plan(&t, at(400), Turn::Woken),
        Plan::Probe(Why::Confirm { by: by.clone() })
    );
    assert_eq!(s.local(&t, true, at(410)), None, "first, doubt");
    s.remote(
        &t,
        &by,
        3,
        false,
        "connect failed",
        Duration::ZERO,
        at(1300),
    );
    let d = s
        .local(&t, true, at(1400))
        .expect("the peer still fails it");
    assert_eq!(d.failing_from(), by);
    assert!(
        d.to_string().contains(&format!("fails from {by} only")),
        "{d}"
    );
}

#[test]
fn late_news_of_a_death_is_no_disagreement() {
    let mut s = peered(1);
    let (t, by) = target_of_other(&s, at(0));
    s.remote(&t, &by, 1, true, "HTTP 200", Duration::ZERO, at(0));
    s.plan(&t, at(0), Turn::Scheduled);
    s.local(&t, true, at(0));
    // The target dies; the slow probe sees it before the assigned peer does.
    s.remote(&t, &by, 2, true, "HTTP 200", Duration::ZERO, at(9000));
    assert_eq!(s.local(&t, false, at(9500)), None);
    s.remote(
        &t,
        &by,
        3,
        false,
        "connect failed",
        Duration::ZERO,
        at(10_000),
    );
    assert_eq!(s.local(&t, false, at(10_100)), None, "the feed agrees now");
    assert!(!s.in_doubt(&t));
}

#[test]
fn an_answer_under_its_own_name_is_ignored() {
    let mut s = share("lb-1", 1);
    s.peer_answered("lb-1", at(0));
    assert!(s.live_peers(at(0)).is_empty());
    assert!(!s.remote("a:1", "lb-1", 1, false, "x", Duration::ZERO, at(0)));
}
