//! systemd's service notification protocol (`Type=notify` / `Type=notify-reload`,
//! sd_notify(3)), for `vigil lb`, `vigil controller` and any service built on vigil.
//!
//! Four moments, one call each, all no-ops outside systemd (no `$NOTIFY_SOCKET`):
//! - [`ready`] once the process serves (`READY=1`, with a `STATUS=` line);
//! - [`reloading`] when a SIGHUP reload starts (`RELOADING=1` with `MONOTONIC_USEC=`, as
//!   `Type=notify-reload` requires), then [`ready`] again when it is done;
//! - [`stopping`] when a SIGTERM drain starts (`STOPPING=1`);
//! - [`watchdog`]: a loop sending `WATCHDOG=1` at half of `$WATCHDOG_USEC` (set by
//!   `WatchdogSec=`), run on the runtime whose stall should count as a hang.
//!
//! The datagrams are sent by the `sd-notify` crate. A failed send is logged once at
//! warn level and never stops the service: systemd then times the unit out, which says
//! more than an exit would.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sd_notify::NotifyState;

/// Whether a failed notification was already logged (one warning, not one per ping).
static WARNED: AtomicBool = AtomicBool::new(false);

fn send(what: &str, states: &[NotifyState]) {
    // `false`: keep $NOTIFY_SOCKET, later calls (reload, stop, pings) need it.
    if let Err(e) = sd_notify::notify(false, states)
        && !WARNED.swap(true, Ordering::Relaxed)
    {
        tracing::warn!(error = %e, "cannot notify systemd ({what}); further failures are not logged");
    }
}

/// `READY=1` and `STATUS=<status>`: the service is serving (again, after a reload).
pub fn ready(status: &str) {
    send("ready", &[NotifyState::Ready, NotifyState::Status(status)]);
}

/// `RELOADING=1` with the current `MONOTONIC_USEC`: a reload has begun; call [`ready`]
/// when it is over (even when the new configuration was rejected: the old one serves).
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send("reloading", &[NotifyState::Reloading, now]),
        Err(_) => send("reloading", &[NotifyState::Reloading]),
    }
}

/// `STOPPING=1`: shutdown has begun.
pub fn stopping() {
    send("stopping", &[NotifyState::Stopping]);
}

/// How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC` (sd_watchdog_enabled(3)),
/// when it is set and `$WATCHDOG_PID` is absent or this process. None otherwise.
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.parse::<u32>().ok() != Some(std::process::id())
    {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// Sends `WATCHDOG=1` every [`watchdog_interval`], forever; returns at once when the
/// watchdog is off. Spawn it on the runtime that must stay alive (a runtime too stalled
/// to run it is what the watchdog is for).
pub async fn watchdog() {
    let Some(every) = watchdog_interval() else {
        return;
    };
    tracing::info!(
        every = %humantime::format_duration(every),
        "systemd watchdog on: pinging at half of WatchdogSec"
    );
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        send("watchdog", &[NotifyState::Watchdog]);
    }
}
