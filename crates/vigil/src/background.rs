//! The background checker: runs every registered check at its own fixed cadence (with
//! jitter), cuts each run at its timeout, and publishes a snapshot after every result and
//! at every heartbeat.
//!
//! ## Invariants
//! - The cadence does not depend on the request rate: endpoints only read snapshots.
//! - The cadence is fixed: run `k` of a check is due at `start + k * interval` plus a
//!   random offset in `[0, jitter * interval)`, so jitter spreads a fleet's probes without
//!   making the schedule drift. A run that overruns its slot skips the missed slots
//!   instead of running back to back.
//! - At most one run of a check is in flight; each run is its own task inside a
//!   `JoinSet` owned by the checker, so a hung or panicking check cannot stop the loop,
//!   and aborting the checker (the watchdog's restart) aborts its in-flight runs too.
//! - The loop beats (publishes, refreshing the watchdog's view) at least every
//!   heartbeat, whatever the checks do.

use crate::shared::{CheckerFault, Shared};
use futures::FutureExt;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::task::JoinSet;
use tokio::time::Instant;
use vigil_core::CheckResult;

/// Runs until the last `Health` handle is dropped (or the task is aborted).
pub(crate) async fn run(shared: Arc<Shared>) {
    let mut stop = shared.stop.subscribe();
    let n = shared.checks.len();
    let start = Instant::now();
    let mut slot: Vec<Instant> = vec![start; n];
    // The first run of every check is immediate: start-up should not wait a jitter.
    let mut due: Vec<Instant> = vec![start; n];
    let mut running = vec![false; n];
    let mut tasks: JoinSet<(usize, CheckResult)> = JoinSet::new();
    let mut task_index = HashMap::new();
    let heartbeat = shared.config.heartbeat;
    let mut next_beat = start + heartbeat;
    {
        let mut st = shared.lock();
        shared.beat(&mut st);
    }
    loop {
        if let Some(fault) = take_fault(&shared) {
            match fault {
                CheckerFault::Panic => panic!("injected fault: health checker panicked"),
                CheckerFault::Hang => {
                    tracing::warn!("injected fault: health checker hangs");
                    std::future::pending::<()>().await;
                }
                CheckerFault::Pause(d) => {
                    tracing::warn!(pause = ?d, "injected fault: health checker pauses");
                    tokio::time::sleep(d).await;
                }
                CheckerFault::Abort => {}
            }
        }
        let now = Instant::now();
        for i in 0..n {
            if !running[i] && due[i] <= now {
                running[i] = true;
                let handle = tasks.spawn(run_one(shared.clone(), i));
                task_index.insert(handle.id(), i);
            }
        }
        let wake = (0..n)
            .filter(|i| !running[*i])
            .map(|i| due[i])
            .fold(next_beat, Instant::min);
        tokio::select! {
            biased;
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    tracing::debug!("health checker stopping: health handle dropped");
                    return;
                }
            }
            _ = shared.fault_notify.notified() => {}
            Some(joined) = tasks.join_next_with_id() => {
                let (i, result) = match joined {
                    Ok((_, (i, r))) => (i, r),
                    Err(e) => {
                        // run_one catches panics, so this is a cancellation from outside.
                        let Some(i) = task_index.remove(&e.id()) else { continue };
                        (i, CheckResult::fail(format!("check run lost: {e}")))
                    }
                };
                task_index.retain(|_, v| *v != i);
                running[i] = false;
                let interval = shared.checks[i].opts.interval;
                let now = Instant::now();
                slot[i] = next_slot(slot[i], interval, now);
                due[i] = slot[i] + jitter(interval, shared.checks[i].opts.jitter);
                let mut st = shared.lock();
                shared.record(&mut st, i, result);
                shared.beat(&mut st);
            }
            _ = tokio::time::sleep_until(wake) => {
                let now = Instant::now();
                if now >= next_beat {
                    next_beat = next_slot(next_beat, heartbeat, now);
                    let mut st = shared.lock();
                    shared.beat(&mut st);
                }
            }
        }
    }
}

/// The first slot of the cadence `prev + k * interval` (k >= 1) that is not in the past.
fn next_slot(prev: Instant, interval: Duration, now: Instant) -> Instant {
    let next = prev + interval;
    if next >= now {
        return next;
    }
    let behind = now - next;
    let skipped = behind.as_nanos().div_ceil(interval.as_nanos().max(1));
    let skipped = u32::try_from(skipped).unwrap_or(u32::MAX);
    next + interval.saturating_mul(skipped)
}

fn jitter(interval: Duration, fraction: f64) -> Duration {
    if fraction <= 0.0 {
        return Duration::ZERO;
    }
    // Whole milliseconds, rounded down: tokio's timers round a deadline *up* to the next
    // millisecond, so a sub-millisecond jitter of 499.6 ms would fire at +500 ms, outside
    // the promised `[0, fraction * interval)` window.
    let j = interval.mul_f64(fraction * rand::random::<f64>());
    Duration::from_millis(u64::try_from(j.as_millis()).unwrap_or(u64::MAX))
}

fn take_fault(shared: &Shared) -> Option<CheckerFault> {
    shared
        .fault
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
}

/// Runs check `i` once: times it, cuts it at its timeout, turns a panic into a failure.
async fn run_one(shared: Arc<Shared>, i: usize) -> (usize, CheckResult) {
    let reg = &shared.checks[i];
    let started_wall = SystemTime::now();
    let started = Instant::now();
    let run = AssertUnwindSafe(reg.check.check_boxed()).catch_unwind();
    let mut result = match tokio::time::timeout(reg.opts.timeout, run).await {
        Ok(Ok(r)) => r,
        Ok(Err(panic)) => CheckResult::fail(format!("check panicked: {}", panic_message(&panic))),
        Err(_) => CheckResult::fail(format!(
            "timed out after {}",
            humantime::format_duration(reg.opts.timeout)
        )),
    };
    if result.time.is_none() {
        result.time = Some(started_wall);
    }
    if result.duration.is_none() {
        result.duration = Some(crate::snapshot::round_ms(started.elapsed()));
    }
    if result.component_type.is_none() {
        result.component_type = Some(reg.check.component_type().to_string());
    }
    (i, result)
}

/// The message of a panic payload (a `&str` or `String` for `panic!`).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_slot_keeps_the_cadence_and_skips_missed_slots() {
        let t0 = Instant::now();
        let i = Duration::from_secs(10);
        assert_eq!(next_slot(t0, i, t0 + Duration::from_secs(3)), t0 + i);
        assert_eq!(
            next_slot(t0, i, t0 + Duration::from_secs(25)),
            t0 + Duration::from_secs(30),
            "an overrun must skip to the next future slot, not run back to back"
        );
        assert_eq!(
            next_slot(t0, i, t0 + Duration::from_secs(20)),
            t0 + Duration::from_secs(20),
            "a slot falling exactly now is not skipped"
        );
    }

    proptest::proptest! {
        #[test]
        fn next_slot_is_on_the_cadence_and_the_first_not_in_the_past(
            interval_ms in 1u64..10_000,
            now_ms in 0u64..1_000_000,
        ) {
            let t0 = Instant::now();
            let interval = Duration::from_millis(interval_ms);
            let now = t0 + Duration::from_millis(now_ms);
            let next = next_slot(t0, interval, now);
            let offset = (next - t0).as_nanos();
            proptest::prop_assert_eq!(offset % interval.as_nanos(), 0, "off the cadence");
            proptest::prop_assert!(next > t0, "a slot is always after the previous one");
            proptest::prop_assert!(next >= now || next == t0 + interval, "in the past");
            proptest::prop_assert!(next < now + interval || next == t0 + interval, "skipped a free slot");
        }
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let i = Duration::from_secs(10);
        assert_eq!(jitter(i, 0.0), Duration::ZERO);
        for _ in 0..1000 {
            assert!(jitter(i, 0.1) < Duration::from_secs(1));
        }
    }
}
