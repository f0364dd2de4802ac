//! The controller's time base for the guard: wall-clock time since the UNIX epoch, kept
//! monotonic.
//!
//! The guard's state holds timestamps (budget tokens, penalties, freezes) that must mean
//! the same after a restart, so the controller cannot use a per-process monotonic
//! epoch. It reads the wall clock once at start, never earlier than the last time it
//! persisted (a clock stepped backwards must not refill the budget), and advances it
//! with the monotonic clock from there.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;
use vigil_core::Time;

/// Wall-clock-based, monotonic `Time` source.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: Duration,
    start: Instant,
}

impl Clock {
    /// A clock starting at the wall clock now, or at `not_before` if that is later.
    pub fn start(not_before: Time) -> Clock {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Clock {
            base: wall.max(not_before.as_elapsed()),
            start: Instant::now(),
        }
    }

    /// Now, as the guard sees it.
    pub fn now(&self) -> Time {
        Time::from_elapsed(self.base + self.start.elapsed())
    }

    /// The instant corresponding to a `Time` (for timers).
    pub fn instant_of(&self, t: Time) -> Instant {
        self.start + t.as_elapsed().saturating_sub(self.base)
    }
}

/// A `Time` of this clock as UNIX milliseconds.
pub fn unix_ms(t: Time) -> i64 {
    i64::try_from(t.as_elapsed().as_millis()).unwrap_or(i64::MAX)
}

/// The wall clock now, as UNIX milliseconds (for display only, never for the guard).
pub fn wall_ms() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// UNIX milliseconds as RFC 3339 (UTC, milliseconds).
pub fn rfc3339_ms(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_starts_before_the_last_persisted_time() {
        let far = Time::from_secs(10_000_000_000);
        let c = Clock::start(far);
        assert!(
            c.now() >= far,
            "a clock stepped back must not rewind the guard"
        );
        let a = c.now();
        assert!(c.now() >= a);
    }
}
