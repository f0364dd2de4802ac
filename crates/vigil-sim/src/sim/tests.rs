use super::model::{DepCond, FaultRamp, Gc, Ramped};
use super::*;
use crate::clients::Tally;
use crate::scenario::Scenario;
use std::path::Path;
use vigil_core::Status;

fn busy_scenario() -> Scenario {
    // Every kind of event: kills, a gray failure, a dependency spell, a lost zone,
    // a disk filling, a controller restart, a queue.
    Scenario::parse(
        Path::new("t.toml"),
        r#"
duration = "20m"
[fleet]
servers = 12
[[dependencies]]
name = "db"
request_fraction = 0.5
[queue]
rate = 50.0
[[faults]]
at = "1m"
kind = "kill"
target = "server:1"
[[faults]]
at = "2m"
kind = "gray"
target = "server:2"
error_rate = 0.5
[[faults]]
at = "3m"
kind = "dependency"
dependency = "db"
error_rate = 0.3
affected = 0.5
duration = "5m"
[[faults]]
at = "9m"
kind = "zone_down"
zone = 1
duration = "4m"
[[faults]]
at = "4m"
kind = "disk_fill"
target = "server:5"
fill_in = "3m"
[[faults]]
at = "10m"
kind = "controller_restart"
"#,
    )
    .expect("valid scenario")
}

#[test]
fn same_seed_same_run_different_seed_different_run() {
    let s = busy_scenario();
    let a = run(&s.config, 7, Policies::Vigil, &mut |_| {});
    let b = run(&s.config, 7, Policies::Vigil, &mut |_| {});
    assert_eq!(a.summary, b.summary, "same seed, same numbers");
    assert_eq!(a.series, b.series, "same seed, same timeline");
    assert_eq!(a.log, b.log, "same seed, same events");
    let c = run(&s.config, 8, Policies::Vigil, &mut |_| {});
    assert_ne!(a.summary, c.summary, "the seed must matter");
}

#[test]
fn a_run_accounts_for_every_request_and_sees_its_faults() {
    let s = busy_scenario();
    let o = run(&s.config, 1, Policies::Vigil, &mut |_| {});
    let sum: u64 = o.series.iter().map(|x| x.requests).sum();
    assert_eq!(sum, o.summary.requests, "the timeline adds up to the total");
    assert!(o.summary.client_errors > 0, "faults cost something");
    assert!(o.summary.ejections > 0, "the gray failure is ejected");
    assert!(
        o.summary.controller_actions > 0,
        "the dead server is replaced"
    );
    assert_eq!(o.marks.len(), 6, "every fault is marked");
    assert!(o.summary.messages_delivered > 0, "the queue is consumed");
}

fn sim_for(src: &str) -> Scenario {
    Scenario::parse(Path::new("t.toml"), src).expect("valid scenario")
}

/// Twenty servers in two zones, a `deploy` fault at 2m with `extra` keys and a rollout
/// of waves of at most 4 hosts, 1 minute of bake.
fn deploy_scenario(extra: &str) -> Scenario {
    sim_for(&format!(
        "duration = \"40m\"\n[fleet]\nservers = 20\nzones = 2\n\
         [[faults]]\nat = \"2m\"\nkind = \"deploy\"\nwaves = [0.5, 1.0]\n\
         wave_interval = \"5m\"\n{extra}\n\
         [faults.rollout]\nmax_wave = 4\nbake = \"1m\"\nprogress_deadline = \"2m\"\n"
    ))
}

#[test]
fn a_good_revision_rolls_out_in_floor_sized_waves_one_zone_at_a_time() {
    let s = deploy_scenario("error_rate = 0.0\nreadiness = \"passes\"");
    let o = run(&s.config, 1, Policies::Vigil, &mut |_| {});
    // 20 hosts, at most 4 per wave, a wave never spans the two zones of 10: 3 waves
    // per zone.
    assert_eq!(o.summary.deploy_waves, 6, "{:#?}", o.log);
    assert_eq!(o.summary.rollbacks, 0);
    assert!(
        o.log
            .iter()
            .any(|(_, l)| l.contains("completed") || l.contains("every host runs")),
        "{:#?}",
        o.log
    );
    assert_eq!(o.summary.client_errors, 0);
}

#[test]
fn a_revision_failing_requests_behind_a_passing_readiness_is_rolled_back_by_its_error_rate() {
    // /readyz passes, 20% of requests fail: only the rollout's error-rate samples see
    // it, during the bake of the first wave.
    let s = deploy_scenario("error_rate = 0.2\nreadiness = \"passes\"");
    let o = run(&s.config, 1, Policies::Vigil, &mut |_| {});
    assert_eq!(o.summary.deploy_waves, 1, "{:#?}", o.log);
    assert_eq!(o.summary.rollbacks, 1, "{:#?}", o.log);
    assert!(
        o.log
            .iter()
            .any(|(_, l)| l.contains("deploy:") && l.contains("error rate")),
        "the log says why: {:#?}",
        o.log
    );
    // The timer rollout pushes both waves.
    let naive = run(&s.config.naive(), 1, Policies::Naive, &mut |_| {});
    assert_eq!(naive.summary.deploy_waves, 2);
    assert!(naive.summary.client_errors > 10 * o.summary.client_errors.max(1));
}

/// Ten queue workers; `faults` appended.
fn queue_scenario(controller: &str, faults: &str) -> Scenario {
    sim_for(&format!(
        "duration = \"20m\"\n[fleet]\nservers = 10\n[clients]\nrate = 0.0\n\
         [queue]\nrate = 100.0\n[controller]\nmode = \"{controller}\"\n{faults}"
    ))
}

#[test]
fn the_kill_switch_alone_pauses_a_black_hole_for_longer_and_longer() {
    // Controller off: only the worker's own gate can see a failure its checks pass.
    let s = queue_scenario(
        "off",
        "[[faults]]\nat = \"2m\"\nkind = \"gray\"\ntarget = \"server:3\"\nerror_rate = 1.0\n",
    );
    let o = run(&s.config, 1, Policies::Vigil, &mut |_| {});
    let naive = run(&s.config.naive(), 1, Policies::Naive, &mut |_| {});
    let rate = o.summary.metric("message_failure_rate").unwrap();
    let naive_rate = naive.summary.metric("message_failure_rate").unwrap();
    // 18 minutes of black hole: pauses of 1, 2, 4, 8 minutes, each after a probation
    // of 10 messages; never pulling freely again.
    assert!(
        (3..=6).contains(&o.summary.worker_pauses),
        "pauses doubling, not toggling: {}",
        o.summary.worker_pauses
    );
    assert!(rate < 0.01, "vigil {rate}");
    assert!(naive_rate > 0.5, "naive {naive_rate}");
    assert!(
        o.log
            .iter()
            .any(|(_, l)| l.contains("kill switch") && l.contains("server-0003")),
        "the log says which worker paused and why"
    );
    assert_eq!(o.summary.controller_actions, 0);
}

/// A queue whose messages call `db`, with `poison` of them poison, and `faults`.
fn queue_with_dependency(poison: f64, faults: &str) -> Scenario {
    sim_for(&format!(
        "duration = \"10m\"\n[fleet]\nservers = 6\n[clients]\nrate = 0.0\n\
         [[dependencies]]\nname = \"db\"\n\
         [queue]\nrate = 30.0\ndependency = \"db\"\npoison = {poison}\n{faults}"
    ))
}

#[test]
fn a_shared_outage_dead_letters_nothing_where_the_old_rule_dead_letters_healthy_messages() {
    let s = queue_with_dependency(
        0.0,
        "[[faults]]\nat = \"2m\"\nkind = \"dependency\"\ndependency = \"db\"\n\
         error_rate = 1.0\nduration = \"30s\"\n",
    );
    let o = run(&s.config, 1, Policies::Vigil, &mut |_| {});
    let naive = run(&s.config.naive(), 1, Policies::Naive, &mut |_| {});
    assert_eq!(o.summary.dead_letters, 0, "{:?}", o.log);
    assert!(
        o.summary.worker_pauses >= 1,
        "the kill switches pause the fleet"
    );
    // Their dependency checks failed during the pause: each ends its pause once they
    // pass again (two checks), not when its 60 s run out (about 32 s after the end).
    let resumed = o
        .summary
        .workers_resumed_after
        .expect("the fleet pulls again");
    assert!(
        resumed <= Duration::from_secs(15),
        "the fleet pulls again within seconds of the outage's end: {resumed:?}"
    );
    assert!(
        naive.summary.healthy_dead_letters >= 50,
        "the old rule dead-letters healthy messages in a shared outage: {}",
        naive.summary.healthy_dead_letters
    );
    // The same outage on one worker's connection only: its failures are its own, and
    // again nothing is dead-lettered.
    let s = queue_with_dependency(
        0.0,
        "[[faults]]\nat = \"2m\"\nkind = \"conn_broken\"\ndependency = \"db\"\n\
         target = \"server:2\"\nduration = \"30s\"\n",
    );
    let o = run(&s.config, 1, Policies::Vigil, &mut |_| {});
    assert_eq!(o.summary.dead_letters, 0, "{:?}", o.log);
}

#[test]
fn poison_on_healthy_workers_is_still_dead_lettered_and_nothing_else() {
    let s = queue_with_dependency(0.005, "");
    let o = run(&s.config, 1, Policies::Vigil, &mut |_| {});
    // 30 messages/s for 10 minutes, 1 in 200 poison: about 90.
    assert!(
        (70..=110).contains(&o.summary.dead_letters),
        "poison is dead-lettered: {}",
        o.summary.dead_letters
    );
    assert_eq!(o.summary.healthy_dead_letters, 0);
    assert_eq!(o.summary.worker_pauses, 0, "poison pauses nobody");
}

#[test]
fn workers_failing_alike_are_not_outliers_and_nobody_is_replaced() {
    // Every worker fails 30% of its messages: a shared cause (a bad dependency), not
    // a sick worker. The peer comparison finds nobody; the kill switches pause them
    // all (locally), and the controller replaces none.
    let s = queue_scenario(
        "guarded",
        "[[faults]]\nat = \"2m\"\nkind = \"gray\"\ntarget = \"all\"\nerror_rate = 0.3\n",
    );
    let o = run(&s.config, 1, Policies::Vigil, &mut |_| {});
    assert_eq!(o.summary.controller_actions, 0, "{:?}", o.log);
    assert!(
        !o.log
            .iter()
            .any(|(_, l)| l.contains("far more than its peers")),
        "nobody is an outlier"
    );
    // The same fault on one worker: it is the outlier, and only it is replaced.
    let s = queue_scenario(
        "guarded",
        "[[faults]]\nat = \"2m\"\nkind = \"gray\"\ntarget = \"server:6\"\nerror_rate = 0.3\n",
    );
    let o = run(&s.config, 1, Policies::Vigil, &mut |_| {});
    assert_eq!(o.summary.controller_actions, 1, "{:?}", o.log);
    assert!(
        o.log
            .iter()
            .any(|(_, l)| l.contains("far more than its peers") && l.contains("server-0006")),
        "{:?}",
        o.log
    );
}

#[test]
fn ramps_grow_linearly_to_their_size() {
    let r = FaultRamp {
        start: Time::from_secs(100),
        len: Duration::from_secs(200),
    };
    assert_eq!(r.progress(Time::from_secs(50)), 0.0, "not before it starts");
    assert_eq!(r.progress(Time::from_secs(100)), 0.0);
    assert_eq!(r.progress(Time::from_secs(150)), 0.25);
    assert_eq!(r.progress(Time::from_secs(300)), 1.0);
    assert_eq!(r.progress(Time::from_secs(900)), 1.0, "and stays there");
    assert_eq!(r.reaches(0.5), Time::from_secs(200));
    let slow = Ramped {
        to: 3.0,
        ramp: Some(r),
    };
    assert_eq!(slow.at(Time::from_secs(200)), 1.5);
    assert_eq!(
        Ramped {
            to: 3.0,
            ramp: None
        }
        .at(Time::ZERO),
        3.0
    );
    // A ramped dependency fault grows from the dependency's usual error rate.
    let c = DepCond {
        error_rate: 0.5,
        extra_latency: Duration::from_secs(2),
        affected: 1.0,
        key: 1,
        ramp: Some(r),
        from_error_rate: 0.1,
    };
    assert!((c.error_rate_at(Time::from_secs(200)) - 0.3).abs() < 1e-12);
    assert_eq!(c.extra_at(Time::from_secs(150)), 0.5);
}

#[test]
fn checks_time_out_when_the_answer_is_slower_than_their_timeout() {
    let s = sim_for("[fleet]\nservers = 4\n[[dependencies]]\nname = \"db\"\n");
    let mut sim = Sim::new(&s.config, 1, Policies::Vigil);
    let now = Time::from_secs(60);
    let timeout = Duration::from_secs(2);
    assert!(
        sim.probe(0, now, false, timeout).ok,
        "a healthy server answers"
    );
    // A host slower than the check timeout: the check times out, even on the
    // reserved health thread.
    sim.servers[0].slow = Ramped {
        to: 2.5,
        ramp: None,
    };
    let p = sim.probe(0, now, false, timeout);
    assert!(!p.ok && p.endpoint_failed, "{p:?}");
    assert_eq!((p.detail, p.latency), (TIMEOUT, timeout));
    // Slower, but within the timeout: it answers, late.
    sim.servers[0].slow = Ramped {
        to: 1.5,
        ramp: None,
    };
    let p = sim.probe(0, now, false, timeout);
    assert!(p.ok, "{p:?}");
    assert!(p.latency > Duration::from_millis(1500));
    // The background dependency check times out against a slow database: /health
    // fails with the dependency's check, /readyz does not notice.
    sim.deps[0].history.push((
        Time::ZERO,
        DepCond {
            error_rate: 0.0,
            extra_latency: Duration::from_secs(3),
            affected: 1.0,
            key: 1,
            ramp: None,
            from_error_rate: 0.0,
        },
    ));
    let (failing, status) = sim.checks(1, now, true);
    assert_eq!(status, Status::Fail);
    assert_eq!(sim.check_names(failing), vec!["db:connect".to_string()]);
    assert_eq!(sim.checks(1, now, false).1, Status::Pass);
}

#[test]
fn slow_requests_hold_workers_and_answer_late() {
    // The plain queue: no admission control.
    let s = sim_for("[fleet]\nservers = 2\nzones = 1\nbrownout = 0.0\nadmission = \"off\"\n");
    let mut sim = Sim::new(&s.config, 1, Policies::Vigil);
    sim.tick_fail_prob = Some(0.0);
    // Healthy: 400 requests in a second, all in time.
    let (t, _) = sim.serve(1, 400, false);
    assert_eq!(
        t,
        Tally {
            ok: 400,
            ..Tally::default()
        }
    );
    // 480 ms more per request: 16 workers serve 32 a second, the queue holds what a
    // healthy server answers in 1 s (784 requests), the rest is shed; all late (no
    // brownout here, to keep the figures round).
    sim.servers[0].slow = Ramped {
        to: 0.48,
        ramp: None,
    };
    let (t, _) = sim.serve(0, 1000, false);
    assert_eq!(t.ok + t.timeout, 32, "{t:?}");
    assert_eq!(t.err, 1000 - 32 - 784, "shed beyond the queue: {t:?}");
    assert_eq!(sim.servers[0].backlog, 784);
    let (t, _) = sim.serve(0, 0, false);
    assert_eq!(t.timeout, 32, "queued behind 24 s of work: late");
}

#[test]
fn admission_control_queues_only_what_can_still_be_answered_in_time() {
    let s = sim_for("[fleet]\nservers = 2\nzones = 1\nbrownout = 0.0\n");
    let mut sim = Sim::new(&s.config, 1, Policies::Vigil);
    sim.tick_fail_prob = Some(0.0);
    // The slow server of the test above: 0.5 s per request, 32 a second. With the
    // balancer's 1 s deadline a request may wait 0.5 s: 16 queue, the rest is refused
    // at once, and what is served is in time.
    sim.servers[0].slow = Ramped {
        to: 0.48,
        ramp: None,
    };
    let (t, _) = sim.serve(0, 1000, false);
    assert_eq!(t.ok, 32, "{t:?}");
    assert_eq!(sim.servers[0].backlog, 16);
    assert_eq!(t.err, 1000 - 32 - 16, "{t:?}");
    assert_eq!(sim.s.admission_refused, 1000 - 32 - 16 - (1000 - 32 - 784));
    let (t, _) = sim.serve(0, 0, false);
    assert_eq!(
        (t.ok, t.timeout),
        (16, 0),
        "the queue answered in time: {t:?}"
    );
    // Past the deadline even alone (1.1 s per request): refused at once, no worker spent.
    sim.servers[1].slow = Ramped {
        to: 1.08,
        ramp: None,
    };
    let (t, _) = sim.serve(1, 100, false);
    assert_eq!(sim.servers[1].backlog, 0);
    assert!(t.err >= 80, "{t:?}");
}

/// Dependency 0 answers `extra` later for every server from t = 0.
fn slow_db(sim: &mut Sim<'_>, extra: Duration) {
    sim.deps[0].history.push((
        Time::ZERO,
        DepCond {
            error_rate: 0.0,
            extra_latency: extra,
            affected: 1.0,
            key: 1,
            ramp: None,
            from_error_rate: 0.0,
        },
    ));
}

#[test]
fn a_slow_dependency_opens_the_guard_and_frees_the_workers() {
    let src = "[fleet]\nservers = 1\nzones = 1\nbrownout = 0.0\n\
               [[dependencies]]\nname = \"db\"\nrequest_fraction = 0.4\ndegraded = 0.5\n";
    let s = sim_for(src);
    let mut sim = Sim::new(&s.config, 1, Policies::Vigil);
    let now = Time::from_secs(10);
    sim.now = now;
    slow_db(&mut sim, Duration::from_millis(1500));
    sim.tick_fail_prob = None;
    sim.tick_plain_punctual = false;
    // The first tick's calls are slow: its db requests hold workers for 1.5 s...
    let rate_slow = sim.server_rate(0, now);
    assert!(rate_slow < 30.0, "{rate_slow}");
    sim.serve(0, 200, false);
    assert!(
        sim.guard_open(0, 0),
        "the calls were slow: the breaker opened"
    );
    assert_eq!(sim.s.breaker_opens, 1);
    // ...and from then on none does: capacity is back, and the db requests are answered
    // from the cache (half of them) or failed at once.
    assert!(sim.server_rate(0, now) > 700.0);
    let p = sim.request_fail_prob(0, now);
    assert!((p - 0.2).abs() < 1e-9, "{p}");
    // The naive twin has no guard.
    let naive = s.config.naive();
    let mut sim = Sim::new(&naive, 1, Policies::Naive);
    slow_db(&mut sim, Duration::from_millis(1500));
    sim.now = now;
    sim.tick_plain_punctual = false;
    sim.serve(0, 200, false);
    assert!(!sim.guard_open(0, 0));
}

#[test]
fn retries_and_latency_are_deterministic_per_seed() {
    let s = sim_for(
        r#"
duration = "10m"
[fleet]
servers = 10
service_time_p99 = "200ms"
max_queue_wait = "5s"
[clients]
retry = "backoff"
[lb.retries]
max_retries = 2
per_try_timeout = "500ms"
[[dependencies]]
name = "db"
request_fraction = 0.5
[[faults]]
at = "1m"
kind = "latency"
target = "servers:0-1"
latency = "2s"
ramp = "3m"
[[faults]]
at = "2m"
kind = "dependency"
dependency = "db"
error_rate = 0.2
latency = "800ms"
ramp = "1m"
duration = "2m"
"#,
    );
    let a = run(&s.config, 3, Policies::Vigil, &mut |_| {});
    let b = run(&s.config, 3, Policies::Vigil, &mut |_| {});
    assert_eq!(a.summary, b.summary, "same seed, same numbers");
    assert_eq!(a.series, b.series, "same seed, same timeline");
    assert_eq!(a.log, b.log, "same seed, same events");
    assert!(a.summary.client_retries > 0 && a.summary.lb_retries > 0);
    assert!(a.summary.request_timeouts > 0);
    let sum: u64 = a.series.iter().map(|x| x.requests).sum();
    assert_eq!(sum, a.summary.requests, "the timeline adds up to the total");
    let c = run(&s.config, 4, Policies::Vigil, &mut |_| {});
    assert_ne!(a.summary, c.summary, "the seed must matter");
}

#[test]
fn gc_pause_fraction_and_remaining() {
    let g = Gc {
        start: Time::from_secs(10),
        pause: Duration::from_millis(500),
        every: Duration::from_secs(2),
    };
    assert_eq!(g.remaining(Time::from_secs(9)), None);
    assert_eq!(
        g.remaining(Time::from_millis(10_100)),
        Some(Duration::from_millis(400))
    );
    assert_eq!(g.remaining(Time::from_millis(10_600)), None);
    let f = g.paused_fraction(Time::from_secs(10), Duration::from_secs(1));
    assert!((f - 0.5).abs() < 1e-9, "{f}");
    let f = g.paused_fraction(Time::from_secs(11), Duration::from_secs(1));
    assert!(f.abs() < 1e-9, "{f}");
}

#[test]
fn p2c_steers_around_a_slow_or_shedding_server() {
    let shares = |slow: f64, shed: u64| {
        let s = sim_for("[fleet]\nservers = 4\nzones = 1\n");
        let mut sim = Sim::new(&s.config, 1, Policies::Vigil);
        sim.refresh_routes();
        sim.servers[0].slow = Ramped {
            to: slow,
            ramp: None,
        };
        if shed > 0 {
            sim.record_shed(1, shed);
        }
        if !sim.p2c_weights(2000, true, true) {
            return None;
        }
        let mut w = vec![0.0; 4];
        for (j, r) in sim.routes.routes.iter().enumerate() {
            w[r.key as usize] = sim.weights[j];
        }
        Some(w)
    };
    // Alike: no sampling, the caller's exact round-robin applies.
    assert_eq!(shares(0.0, 0), None);
    // 700 ms late: P2C sends it a small share, the others share the rest evenly.
    let w = shares(0.7, 0).expect("the servers differ");
    assert!(w[0] < 0.08, "the slow server's share: {w:?}");
    for x in &w[1..] {
        assert!((0.26..0.40).contains(x), "{w:?}");
    }
    // 200 answers just shed: a 200-request penalty, a fraction of its share.
    let w = shares(0.0, 200).expect("the servers differ");
    assert!(w[1] < 0.1, "the shedding server's share: {w:?}");
    // P2C is vigil's; the naive balancer is round-robin.
    let s = sim_for("[fleet]\nservers = 4\n");
    assert_eq!(s.config.lb.balance, crate::scenario::Balance::P2c);
    assert_eq!(
        s.config.naive().lb.balance,
        crate::scenario::Balance::RoundRobin
    );
}

/// The log of the repository's scenario `name` (seed 1, vigil's policies).
fn scenario_log(name: &str) -> Vec<(f64, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios")
        .join(format!("{name}.toml"));
    let s = Scenario::load(&path).expect("the scenario loads");
    let o = run(&s.config, 1, Policies::Vigil, &mut |_| {});
    o.log
        .into_iter()
        .map(|(t, line)| (t.as_secs_f64(), line))
        .collect()
}

fn acts(log: &[(f64, String)]) -> Vec<f64> {
    log.iter()
        .filter(|(_, l)| l.starts_with("controller: act on "))
        .map(|(t, _)| *t)
        .collect()
}

#[test]
fn while_the_store_fails_nobody_is_acted_on_and_after_it_each_failing_server_once() {
    let log = scenario_log("store-outage-mid-incident");
    let acts = acts(&log);
    assert_eq!(acts.len(), 2, "{log:#?}");
    assert!(
        acts.iter().all(|t| *t >= 390.0),
        "an act before the store works again (3m30s to 6m30s): {acts:?}"
    );
    assert!(
        log.iter()
            .any(|(t, l)| *t < 390.0 && l.starts_with("controller: store failing")),
        "{log:#?}"
    );
}

#[test]
fn a_crash_loses_the_decision_not_committed_and_the_restarted_controller_decides_once_more() {
    let log = scenario_log("controller-crash-lost-batch");
    let lost = log
        .iter()
        .find(|(_, l)| l.contains("not committed are lost with the process"))
        .map(|(t, _)| *t)
        .expect("the crash catches a decision before its commit");
    let acts = acts(&log);
    assert_eq!(acts.len(), 1, "{log:#?}");
    assert!(
        acts[0] > lost + 20.0,
        "acted on after the restart: {acts:?}"
    );
}

#[test]
fn a_successor_fences_the_cut_off_leaders_commit_and_decides_again_once_per_server() {
    let log = scenario_log("leader-failover");
    let cut = log
        .iter()
        .find(|(_, l)| l.contains("the cut-off leader's 2 decided action(s)"))
        .map(|(t, _)| *t)
        .expect("the leader is cut off with its decisions not committed");
    assert!(
        log.iter()
            .any(|(t, l)| *t > cut && l.starts_with("controller: another replica took over")),
        "the old term's commit lands fenced: {log:#?}"
    );
    let acts = acts(&log);
    assert_eq!(acts.len(), 2, "{log:#?}");
    assert!(acts.iter().all(|t| *t > cut), "{acts:?}");
}

#[test]
fn a_prober_cut_off_is_named_and_nobody_is_replaced_on_its_view_alone() {
    let log = scenario_log("prober-cut-off");
    assert!(
        log.iter().any(|(t, l)| (180.0..240.0).contains(t)
            && l.starts_with("controller: replica r0 fails")
            && l.contains("likely cut off")),
        "{log:#?}"
    );
    assert!(
        log.iter()
            .any(|(_, l)| l == "controller: replica r0 agrees with the other probers again"),
        "{log:#?}"
    );
    let acted: Vec<&String> = log
        .iter()
        .filter(|(_, l)| l.starts_with("controller: act on "))
        .map(|(_, l)| l)
        .collect();
    assert_eq!(acted.len(), 1, "{acted:?}");
    assert!(
        acted[0].contains("server-0007"),
        "only the full disk: {acted:?}"
    );
}
