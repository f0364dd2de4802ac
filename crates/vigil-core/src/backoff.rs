//! Exponential backoff with jitter: how long to wait before the next try.
//!
//! One rule for every loop in vigil that tries again after a failure (the webhook's
//! retries, the AWS client's, Auto Scaling discovery's polls after a failing API, the
//! library's watchdog restarting a crashed checker), so each gets the same bounds and
//! the same jitter instead of its own doubling.
//!
//! # The rule
//!
//! The wait before retry `attempt` (0: the first retry) is
//!
//! ```text
//! ceiling = min(base x 2^attempt, max(max, base))
//! wait    = ceiling x (1 - jitter x r)        r in [0, 1), supplied by the caller
//! ```
//!
//! - **Bounded:** never longer than `max` (or `base`, when `base` is the longer: a
//!   configured first wait is never cut), never negative; the doubling saturates
//!   instead of overflowing however many attempts.
//! - **Jitter subtracts:** `jitter` is the share of the ceiling that is random. 0 is
//!   none (the same wait every time: tests, and loops with nobody to collide with);
//!   [`EQUAL_JITTER`] (0.5) keeps at least half the ceiling; [`FULL_JITTER`] (1) waits
//!   anywhere between 0 and the ceiling. These are the three schemes of "Exponential
//!   Backoff And Jitter" (AWS Architecture Blog, 2015): jitter keeps many clients that
//!   failed together (one receiver outage, one throttled API) from retrying together.
//!   Subtracting rather than adding keeps `max` a true bound.
//! - **Sans-IO:** the caller supplies `r` (`rand::random::<f64>()` in production, a
//!   seeded RNG in the simulator, a constant in tests) and sleeps itself; nothing
//!   here reads a clock or draws a number.
//!
//! ```
//! use std::time::Duration;
//! use vigil_core::backoff::{Backoff, EQUAL_JITTER};
//!
//! let b = Backoff::new(Duration::from_millis(500), Duration::from_secs(30))
//!     .with_jitter(EQUAL_JITTER);
//! assert_eq!(b.next(0, 0.0), Duration::from_millis(500));
//! assert_eq!(b.next(3, 0.0), Duration::from_secs(4));
//! assert_eq!(b.next(3, 0.5), Duration::from_secs(3), "a quarter off at r = 0.5");
//! assert_eq!(b.next(40, 0.0), Duration::from_secs(30), "capped");
//! ```

use std::time::Duration;

/// No jitter: every wait is the ceiling.
pub const NO_JITTER: f64 = 0.0;
/// "Equal jitter": a wait is between half the ceiling and the ceiling.
pub const EQUAL_JITTER: f64 = 0.5;
/// "Full jitter": a wait is between 0 and the ceiling (AWS's advice for clients of
/// its APIs).
pub const FULL_JITTER: f64 = 1.0;

/// Exponential backoff: `base` doubled per attempt up to `max`, less a random share
/// `jitter` (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// The wait before the first retry (before jitter).
    pub base: Duration,
    /// The longest wait (before jitter); a `base` longer than this is its own cap.
    pub max: Duration,
    /// Share of each wait that is random, within `0..=1` (values outside are clamped).
    /// [`NO_JITTER`], [`EQUAL_JITTER`] or [`FULL_JITTER`].
    pub jitter: f64,
}

impl Backoff {
    /// Doubling from `base` up to `max`, without jitter.
    pub const fn new(base: Duration, max: Duration) -> Backoff {
        Backoff {
            base,
            max,
            jitter: NO_JITTER,
        }
    }

    /// The same backoff with this share of each wait random.
    pub const fn with_jitter(self, jitter: f64) -> Backoff {
        Backoff { jitter, ..self }
    }

    /// The wait before retry `attempt` (0: the first) without jitter:
    /// `min(base x 2^attempt, max(max, base))`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let cap = self.max.max(self.base);
        // 2^31 x any base is past any sane cap; saturating keeps a huge base finite.
        let factor = 1u32 << attempt.min(31);
        self.base.saturating_mul(factor).min(cap)
    }

    /// The wait before retry `attempt` (0: the first), with `rand_unit` the caller's
    /// random number in `[0, 1)` (clamped into `[0, 1]`; NaN counts as 0).
    pub fn next(&self, attempt: u32, rand_unit: f64) -> Duration {
        let ceiling = self.ceiling(attempt);
        let jitter = unit(self.jitter);
        let r = unit(rand_unit);
        // Through `try_from`: near `Duration::MAX` the float product may round past it.
        Duration::try_from_secs_f64(ceiling.as_secs_f64() * (1.0 - jitter * r))
            .map_or(ceiling, |d| d.min(ceiling))
    }
}

/// `x` clamped into `[0, 1]`, NaN as 0.
fn unit(x: f64) -> f64 {
    if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn without_jitter_the_wait_doubles_from_base_up_to_max() {
        let b = Backoff::new(500 * MS, Duration::from_secs(30));
        let waits: Vec<Duration> = (0..8).map(|a| b.next(a, 0.7)).collect();
        assert_eq!(
            waits,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000].map(|ms| ms * MS),
            "no jitter: r changes nothing"
        );
    }

    #[test]
    fn a_base_longer_than_max_is_never_cut() {
        let b = Backoff::new(Duration::from_secs(60), Duration::from_secs(30));
        assert_eq!(b.next(0, 0.0), Duration::from_secs(60));
        assert_eq!(b.next(5, 0.0), Duration::from_secs(60));
    }

    #[test]
    fn huge_attempts_and_bases_saturate_instead_of_overflowing() {
        let b = Backoff::new(Duration::MAX / 2, Duration::MAX);
        assert_eq!(b.next(u32::MAX, 0.0), Duration::MAX);
        let b = Backoff::new(MS, Duration::from_secs(20));
        assert_eq!(b.next(u32::MAX, 0.0), Duration::from_secs(20));
    }

    #[test]
    fn jitter_takes_its_share_off_the_ceiling() {
        let ceiling = Duration::from_secs(4);
        let full = Backoff::new(Duration::from_secs(1), ceiling).with_jitter(FULL_JITTER);
        assert_eq!(full.next(2, 0.0), ceiling);
        assert_eq!(full.next(2, 0.25), Duration::from_secs(3));
        assert_eq!(full.next(2, 1.0), Duration::ZERO);
        let equal = full.with_jitter(EQUAL_JITTER);
        assert_eq!(equal.next(2, 1.0), Duration::from_secs(2), "at least half");
    }

    #[test]
    fn out_of_range_randomness_and_jitter_are_clamped() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).with_jitter(2.0);
        assert_eq!(b.next(0, f64::NAN), Duration::from_secs(1));
        assert_eq!(b.next(0, -1.0), Duration::from_secs(1));
        assert_eq!(b.next(0, 7.0), Duration::ZERO, "jitter 2 counts as 1");
        let b = b.with_jitter(f64::NAN);
        assert_eq!(b.next(0, 0.9), Duration::from_secs(1), "NaN jitter is none");
    }

    /// Jitter spreads: clients that failed together, each drawing its own `r`, wait
    /// over the whole jitter window rather than all the same time.
    #[test]
    fn jitter_spreads_waits_over_its_window() {
        let b =
            Backoff::new(Duration::from_secs(1), Duration::from_secs(60)).with_jitter(EQUAL_JITTER);
        let waits: Vec<Duration> = (0..100).map(|i| b.next(3, f64::from(i) / 100.0)).collect();
        let (lo, hi) = (waits.iter().min().unwrap(), waits.iter().max().unwrap());
        assert_eq!(*hi, Duration::from_secs(8));
        assert!(
            *lo > Duration::from_secs(4) && *lo < Duration::from_millis(4100),
            "{lo:?}"
        );
        let mut distinct = waits.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), 100, "each r its own wait");
    }

    proptest! {
        #[test]
        fn every_wait_is_within_its_jitter_window_and_the_cap(
            base_ms in 1u64..100_000,
            max_ms in 1u64..1_000_000,
            jitter in 0.0f64..=1.0,
            attempt in 0u32..100,
            r in 0.0f64..1.0,
        ) {
            let b = Backoff::new(ms(base_ms), ms(max_ms)).with_jitter(jitter);
            let ceiling = b.ceiling(attempt);
            let wait = b.next(attempt, r);
            prop_assert!(ceiling <= ms(max_ms.max(base_ms)), "bounded by the cap");
            prop_assert!(wait <= ceiling, "jitter never adds");
            prop_assert!(wait >= ceiling.mul_f64(1.0 - jitter).saturating_sub(MS), "jitter takes at most its share");
        }

        #[test]
        fn the_ceiling_never_shrinks_from_one_attempt_to_the_next(
            base_ms in 1u64..100_000,
            max_ms in 1u64..1_000_000,
            attempt in 0u32..100,
        ) {
            let b = Backoff::new(ms(base_ms), ms(max_ms));
            prop_assert!(b.ceiling(attempt + 1) >= b.ceiling(attempt));
        }
    }
}
