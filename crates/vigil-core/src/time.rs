//! Time as policies see it: a monotonic instant passed in by the driver.
//!
//! Policies never read a clock. A real driver converts its own monotonic clock into
//! [`Time`] (nanoseconds since the driver's start), the simulator uses its virtual clock.
//! Only differences between two `Time`s mean anything.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// A monotonic instant: the time elapsed since an epoch chosen by the driver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(Duration);

impl Time {
    /// The driver's epoch.
    pub const ZERO: Time = Time(Duration::ZERO);

    /// The instant `elapsed` after the epoch.
    pub const fn from_elapsed(elapsed: Duration) -> Self {
        Time(elapsed)
    }

    /// The instant `ms` milliseconds after the epoch (handy in tests and the simulator).
    pub const fn from_millis(ms: u64) -> Self {
        Time(Duration::from_millis(ms))
    }

    /// The instant `s` seconds after the epoch.
    pub const fn from_secs(s: u64) -> Self {
        Time(Duration::from_secs(s))
    }

    /// Time elapsed since the epoch.
    pub const fn as_elapsed(self) -> Duration {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Time) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, rhs: Duration) -> Time {
        Time(self.0.saturating_add(rhs))
    }
}

impl Sub<Duration> for Time {
    type Output = Time;
    fn sub(self, rhs: Duration) -> Time {
        Time(self.0.saturating_sub(rhs))
    }
}

/// A `Time` serialises as integer nanoseconds since the driver's epoch: an exact round
/// trip, the same form the guard's persisted state has always used.
impl serde::Serialize for Time {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl<'de> serde::Deserialize<'de> for Time {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <u64 as serde::Deserialize>::deserialize(d).map(|n| Time(Duration::from_nanos(n)))
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{:.3}s", self.0.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_saturates_instead_of_panicking() {
        let a = Time::from_secs(5);
        let b = Time::from_secs(7);
        assert_eq!(b.since(a), Duration::from_secs(2));
        assert_eq!(
            a.since(b),
            Duration::ZERO,
            "earlier.since(later) must be zero"
        );
    }
}
