//! `PercentLevels`: a warn level and a fail level on the share of a capacity in use,
//! shared by the checks that grade a "percent used" ([`FileDescriptors`], [`Memory`],
//! [`Saturation`]). Each keeps its own builder methods and delegates to this.
//!
//! [`FileDescriptors`]: super::FileDescriptors
//! [`Memory`]: super::Memory
//! [`Saturation`]: super::Saturation

use super::assert_percent;
use vigil_core::Status;

/// Levels that must not be reached: at or above `fail` fails, at or above `warn` (when
/// set) warns. Both are percentages within 0..=100.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct PercentLevels {
    warn: Option<f64>,
    fail: f64,
}

impl PercentLevels {
    /// Warns at `warn`, fails at `fail`: a check's defaults, constants that need no
    /// validation.
    pub(super) const fn new(warn: f64, fail: f64) -> Self {
        PercentLevels {
            warn: Some(warn),
            fail,
        }
    }

    /// Warns at `percent`; panics naming `check` when it is not within 0..=100.
    pub(super) fn set_warn(&mut self, check: &str, percent: f64) {
        assert_percent(check, "warn", percent);
        self.warn = Some(percent);
    }

    /// Never warns, only fails.
    pub(super) fn clear_warn(&mut self) {
        self.warn = None;
    }

    /// Fails at `percent`; panics naming `check` when it is not within 0..=100.
    pub(super) fn set_fail(&mut self, check: &str, percent: f64) {
        assert_percent(check, "fail", percent);
        self.fail = percent;
    }

    /// Grades `used_percent` against the levels.
    pub(super) fn grade(&self, used_percent: f64) -> Status {
        if used_percent >= self.fail {
            Status::Fail
        } else if self.warn.is_some_and(|w| used_percent >= w) {
            Status::Warn
        } else {
            Status::Pass
        }
    }

    /// The levels for a check's output: `warn at 80%, fail at 95%` or `fail at 95%`.
    pub(super) fn describe(&self) -> String {
        match self.warn {
            Some(w) => format!("warn at {w}%, fail at {}%", self.fail),
            None => format!("fail at {}%", self.fail),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grade_orders_levels() {
        let mut levels = PercentLevels::new(80.0, 95.0);
        assert_eq!(levels.grade(10.0), Status::Pass);
        assert_eq!(levels.grade(80.0), Status::Warn);
        assert_eq!(levels.grade(95.0), Status::Fail);
        levels.clear_warn();
        assert_eq!(levels.grade(90.0), Status::Pass);
        assert_eq!(levels.grade(95.0), Status::Fail);
    }

    #[test]
    fn describe_names_the_levels_set() {
        let mut levels = PercentLevels::new(80.0, 95.0);
        assert_eq!(levels.describe(), "warn at 80%, fail at 95%");
        levels.set_warn("Test", 72.5);
        levels.set_fail("Test", 100.0);
        assert_eq!(levels.describe(), "warn at 72.5%, fail at 100%");
        levels.clear_warn();
        assert_eq!(levels.describe(), "fail at 100%");
    }

    #[test]
    #[should_panic(expected = "Test warn level must be a percentage within 0..=100, got 101")]
    fn warn_level_above_100_panics() {
        PercentLevels::new(80.0, 95.0).set_warn("Test", 101.0);
    }

    #[test]
    #[should_panic(expected = "Test fail level must be a percentage within 0..=100, got NaN")]
    fn fail_level_nan_panics() {
        PercentLevels::new(80.0, 95.0).set_fail("Test", f64::NAN);
    }
}
