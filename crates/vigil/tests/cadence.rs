//! The background checker's schedule and the watchdog's timing, in tokio's paused time:
//! deterministic, no sleeping, no HTTP (the HTTP contracts are in `health_http.rs`).

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use vigil::{CheckOptions, CheckerFault, FnCheck, Health, HealthConfig, Lifecycle, Status};

type Log = Arc<Mutex<Vec<Duration>>>;
type BoxedObs = std::pin::Pin<Box<dyn std::future::Future<Output = vigil::CheckResult> + Send>>;

/// A check that logs when it starts (relative to `t0`) and takes `takes` to finish.
fn logging_check(
    t0: Instant,
    log: Log,
    takes: Duration,
) -> FnCheck<impl Fn() -> BoxedObs + Send + Sync> {
    FnCheck::new(move || {
        log.lock().unwrap().push(t0.elapsed());
        let fut: BoxedObs = Box::pin(async move {
            tokio::time::sleep(takes).await;
            vigil::check::pass()
        });
        fut
    })
}

fn config() -> HealthConfig {
    HealthConfig {
        heartbeat: Duration::from_millis(100),
        stale_after: Duration::from_millis(500),
        restart_backoff: Duration::from_millis(1000),
        drain_delay: Duration::from_millis(100),
    }
}

#[tokio::test(start_paused = true)]
async fn checks_run_at_a_fixed_cadence_whatever_the_request_rate() {
    let t0 = Instant::now();
    let log: Log = Arc::default();
    let health = Health::builder()
        .config(config())
        .dependency(
            "db:ping",
            logging_check(t0, log.clone(), Duration::from_millis(10)),
            CheckOptions::every(Duration::from_secs(1)).jitter(0.0),
        )
        .start();
    // Readers in a tight loop must not change the cadence.
    for _ in 0..1000 {
        let _ = health.snapshot();
    }
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    let runs = log.lock().unwrap().clone();
    let secs: Vec<u128> = runs.iter().map(|d| d.as_millis() / 1000).collect();
    assert_eq!(
        secs,
        (0..=10).collect::<Vec<_>>(),
        "one run per interval: {runs:?}"
    );
    for d in &runs {
        assert!(
            d.as_millis() % 1000 < 5,
            "runs start on their slot without drift: {runs:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn jitter_delays_each_run_within_its_fraction_without_drift() {
    let t0 = Instant::now();
    let log: Log = Arc::default();
    let _health = Health::builder()
        .config(config())
        .dependency(
            "db:ping",
            logging_check(t0, log.clone(), Duration::ZERO),
            CheckOptions::every(Duration::from_secs(1)).jitter(0.5),
        )
        .start();
    tokio::time::sleep(Duration::from_millis(20_900)).await;
    let runs = log.lock().unwrap().clone();
    assert_eq!(runs.len(), 21, "{runs:?}");
    for (k, d) in runs.iter().enumerate() {
        let slot = Duration::from_secs(k as u64);
        assert!(
            *d >= slot && *d < slot + Duration::from_millis(500),
            "run {k} at {d:?} is outside its slot's jitter window"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_longer_than_its_interval_never_overlaps_and_skips_missed_slots() {
    let t0 = Instant::now();
    let log: Log = Arc::default();
    let _health = Health::builder()
        .config(config())
        .dependency(
            "slow:query",
            logging_check(t0, log.clone(), Duration::from_millis(2500)),
            CheckOptions::every(Duration::from_secs(1))
                .timeout(Duration::from_secs(5))
                .jitter(0.0),
        )
        .start();
    tokio::time::sleep(Duration::from_millis(9_500)).await;
    let runs: Vec<u128> = log.lock().unwrap().iter().map(|d| d.as_millis()).collect();
    assert_eq!(runs, [0, 3000, 6000, 9000], "next free slot after each run");
}

#[tokio::test(start_paused = true)]
async fn a_hung_checker_is_reported_after_its_staleness_and_restarted_after_the_backoff() {
    let health = Health::builder()
        .config(config())
        .local(
            "disk:free",
            FnCheck::new(|| async { vigil::check::pass() }),
            CheckOptions::every(Duration::from_millis(200)).jitter(0.0),
        )
        .start();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(health.snapshot().ready.status, Status::Pass);
    assert_eq!(health.lifecycle(), Lifecycle::Running);
    health.inject_fault(CheckerFault::Hang);
    // Not yet stale: one missed heartbeat is no stall.
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(
        health.snapshot().ready.status,
        Status::Pass,
        "stalled too early"
    );
    // Stale after 500 ms (plus at most one watchdog period).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = health.snapshot();
    assert_eq!(s.ready.status, Status::Fail);
    assert_eq!(s.ready.output.as_deref(), Some("health checker stalled"));
    assert_eq!(health.restarts(), 0, "the restart waits for the backoff");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let s = health.snapshot();
    assert_eq!(s.ready.status, Status::Pass, "{:?}", s.ready);
    assert_eq!(s.restarts, 1);
    let wd = &s.ready.checks["watchdog:restarts"][0];
    assert!(
        wd.output.as_deref().unwrap_or("").contains("no heartbeat"),
        "{wd:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_starved_checker_that_resumes_is_reported_stalled_but_not_restarted() {
    let health = Health::builder()
        .config(config())
        .local(
            "disk:free",
            FnCheck::new(|| async { vigil::check::pass() }),
            CheckOptions::every(Duration::from_millis(200)).jitter(0.0),
        )
        .start();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut sub = health.subscribe();
    // Silent for 1.2 s: stale after 0.5 s, back before the 1 s restart backoff ends.
    health.inject_fault(CheckerFault::Pause(Duration::from_millis(1200)));
    let mut saw_stall = false;
    let until = Instant::now() + Duration::from_millis(3000);
    while Instant::now() < until {
        tokio::select! {
            _ = sub.changed() => {
                saw_stall |= sub.borrow_and_update().ready.output.as_deref() == Some("health checker stalled");
            }
            _ = tokio::time::sleep_until(until) => {}
        }
    }
    assert!(saw_stall, "the stall must be reported while it lasts");
    assert_eq!(
        health.restarts(),
        0,
        "a checker that resumed must not be restarted"
    );
    assert_eq!(health.snapshot().ready.status, Status::Pass);
}

#[tokio::test(start_paused = true)]
async fn a_crash_looping_checker_is_restarted_with_growing_backoff() {
    let health = Health::builder()
        .config(config())
        .local(
            "disk:free",
            FnCheck::new(|| async { vigil::check::pass() }),
            CheckOptions::every(Duration::from_millis(200)).jitter(0.0),
        )
        .start();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut restart_times = Vec::new();
    let t0 = Instant::now();
    for n in 1..=3u64 {
        health.inject_fault(CheckerFault::Panic);
        while health.restarts() < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        restart_times.push(t0.elapsed());
    }
    let gaps: Vec<u128> = restart_times
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    assert!(
        gaps[0] >= 2000 && gaps[1] >= 4000,
        "backoff must double on a crash loop: restarts at {restart_times:?}"
    );
    assert_eq!(health.snapshot().ready.status, Status::Pass);
}

#[tokio::test(start_paused = true)]
async fn only_gating_checks_hold_start_up() {
    let health = Health::builder()
        .config(config())
        .local(
            "disk:free",
            FnCheck::new(|| async { vigil::check::pass() }),
            CheckOptions::every(Duration::from_millis(200)),
        )
        .dependency(
            "db:ping",
            FnCheck::new(|| async { vigil::CheckResult::fail("down") }),
            CheckOptions::every(Duration::from_millis(200)),
        )
        .start();
    assert_eq!(health.snapshot().lifecycle, Lifecycle::Starting);
    assert_eq!(health.snapshot().ready.status, Status::Fail);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        health.lifecycle(),
        Lifecycle::Running,
        "a failing dependency must not hold start-up unless it gates it"
    );

    let gated = Health::builder()
        .config(config())
        .dependency(
            "db:ping",
            FnCheck::new(|| async { vigil::CheckResult::fail("down") }),
            CheckOptions::every(Duration::from_millis(200)).gates_startup(true),
        )
        .start();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(gated.lifecycle(), Lifecycle::Starting);
    let out = gated.snapshot().ready.checks["lifecycle:state"][0]
        .output
        .clone();
    assert_eq!(
        out.as_deref(),
        Some("starting: waiting for db:ping to pass once")
    );
}

#[tokio::test(start_paused = true)]
async fn a_service_without_start_up_gates_is_ready_at_the_first_beat() {
    let health = Health::builder().config(config()).start();
    assert_eq!(health.snapshot().ready.status, Status::Fail, "starting");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(health.lifecycle(), Lifecycle::Running);
    assert_eq!(health.snapshot().ready.status, Status::Pass);
}

#[tokio::test(start_paused = true)]
async fn bad_registries_are_rejected_with_the_reason() {
    let ok = || FnCheck::new(|| async { vigil::check::pass() });
    let err = Health::builder()
        .local("a", ok(), CheckOptions::default())
        .dependency("a", ok(), CheckOptions::default())
        .try_start()
        .unwrap_err();
    assert_eq!(err.to_string(), "check \"a\" is registered twice");
    let err = Health::builder()
        .local("b", ok(), CheckOptions::default().timeout(Duration::ZERO))
        .try_start()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "check \"b\": timeout: must be greater than zero"
    );
    let err = Health::builder()
        .local("watchdog:restarts", ok(), CheckOptions::default())
        .try_start()
        .unwrap_err();
    assert!(matches!(err, vigil::BuildError::BadName(_)));
}

#[test]
fn start_outside_a_runtime_is_an_error_not_a_hang() {
    let err = Health::builder().try_start().unwrap_err();
    assert!(matches!(err, vigil::BuildError::NoRuntime));
}
