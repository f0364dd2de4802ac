//! The watchdog: notices when the background checker is dead, panicked or stalled, fails
//! health with "health checker stalled", and restarts the checker with backoff.
//!
//! ## Protocol
//! - The checker beats (publishes) at least every heartbeat. The watchdog looks every
//!   quarter of the allowed staleness (or heartbeat, whichever is shorter).
//! - The checker is stalled when its task has ended (a panic or an abort: detected at
//!   once) or when its last beat is older than `stale_after` (a hang, or a runtime too
//!   starved to run it).
//! - On a stall the watchdog publishes a failing snapshot first (so `/readyz` says so)
//!   and waits the restart backoff (doubling on a crash loop, capped). A checker that
//!   beat again meanwhile was only starved and is left alone; otherwise the old task is
//!   aborted, the restart counted and a new checker started. The stall clears at the
//!   next beat: recovery needs no process restart.
//! - Readers do not rely on the watchdog alone: [`crate::Snapshot::ready_now`] fails a
//!   snapshot older than `stale_after` by itself, which covers a dead watchdog too.

use crate::background::panic_message;
use crate::options::MAX_RESTART_BACKOFF;
use crate::shared::Shared;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use vigil_core::backoff::Backoff;

/// Spawns the checker, then watches it until the last `Health` handle is dropped.
pub(crate) async fn run(shared: Arc<Shared>) {
    let mut stop = shared.stop.subscribe();
    let cfg = shared.config.clone();
    let period = cfg
        .heartbeat
        .min(cfg.stale_after / 4)
        .max(Duration::from_millis(1));
    // No jitter: one process's checker, nobody to collide with, and the restart times
    // stay exact for tests on paused time.
    let schedule = Backoff::new(cfg.restart_backoff, MAX_RESTART_BACKOFF);
    let mut restarts_in_a_row = 0;
    let mut backoff = schedule.next(restarts_in_a_row, 0.0);
    let mut restarted_at: Option<Instant> = None;
    let mut checker = spawn_checker(&shared);
    loop {
        tokio::select! {
            biased;
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    checker.abort();
                    tracing::debug!("health watchdog stopping: health handle dropped");
                    return;
                }
                continue;
            }
            _ = tokio::time::sleep(period) => {}
        }
        let now = Instant::now();
        let age = now.saturating_duration_since(shared.lock().last_beat);
        let dead = checker.is_finished();
        let reason = if dead {
            Some(match (&mut checker).await {
                Ok(()) => "checker exited".to_string(),
                Err(e) if e.is_panic() => {
                    format!("checker panicked: {}", panic_message(&*e.into_panic()))
                }
                Err(e) if e.is_cancelled() => "checker was killed".to_string(),
                Err(e) => format!("checker failed: {e}"),
            })
        } else if age > cfg.stale_after {
            Some(format!(
                "no heartbeat for {}",
                humantime::format_duration(crate::snapshot::round_ms(age))
            ))
        } else {
            None
        };
        let Some(reason) = reason else {
            // Healthy for a while after a restart: a crash loop is over, reset the backoff.
            if restarted_at.is_some_and(|t| now - t > cfg.stale_after * 2) {
                restarts_in_a_row = 0;
                backoff = schedule.next(restarts_in_a_row, 0.0);
                restarted_at = None;
            }
            continue;
        };
        tracing::warn!(%reason, restart_in = %humantime::format_duration(backoff), "health checker stalled");
        {
            let mut st = shared.lock();
            st.stalled = Some(reason.clone());
            shared.publish(&mut st);
        }
        tokio::select! {
            biased;
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    checker.abort();
                    return;
                }
            }
            _ = tokio::time::sleep(backoff) => {}
        }
        // A checker that was only starved (a saturated runtime, a long GC-like pause)
        // beats again by itself: that is a stall worth reporting, not a crash worth a
        // restart. Only a dead one, or one still silent after the backoff, is replaced.
        if !dead && !checker.is_finished() && shared.lock().last_beat > now {
            tracing::info!("health checker resumed by itself: no restart");
            continue;
        }
        checker.abort();
        {
            let mut st = shared.lock();
            st.restarts += 1;
            st.last_restart_reason = Some(reason);
            // Give the new checker a full staleness window to beat before judging it.
            st.last_beat = Instant::now();
            tracing::info!(restarts = st.restarts, "restarting health checker");
        }
        checker = spawn_checker(&shared);
        restarted_at = Some(Instant::now());
        restarts_in_a_row = restarts_in_a_row.saturating_add(1);
        backoff = schedule.next(restarts_in_a_row, 0.0);
    }
}

fn spawn_checker(shared: &Arc<Shared>) -> JoinHandle<()> {
    let handle = tokio::spawn(crate::background::run(shared.clone()));
    *shared
        .checker_abort
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = Some(handle.abort_handle());
    handle
}
