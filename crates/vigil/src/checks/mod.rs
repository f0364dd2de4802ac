//! Built-in checks: disk, file descriptors, memory, saturation, process, TCP, HTTP.
//!
//! Each is a builder-style struct named by its mechanism and implements [`Check`]:
//!
//! | check | measures | observed unit |
//! |---|---|---|
//! | [`DiskSpace`] | free space on the filesystem holding a path (`statvfs`) | `bytes` or `percent` |
//! | [`FileDescriptors`] | open descriptors (`/proc/self/fd`) against `RLIMIT_NOFILE` | `count` |
//! | [`Memory`] | RSS, or the cgroup's working set, against a limit (cgroup v2/v1 aware) | `bytes` |
//! | [`Saturation`] | in-flight requests against a maximum, or the tokio runtime's busy ratio | `count` / `percent` |
//! | [`ProcessAlive`] | a support process, by pid file or by name in `/proc` | `count` |
//! | [`TcpConnect`] | a TCP connect with its own timeout | `ms` |
//! | [`HttpGet`] | an HTTP GET: expected status, optionally a health+json body | `ms` |
//!
//! A check from a closure is [`crate::FnCheck`].
//!
//! Local resource checks grade a value against a warn level and a fail level: the first
//! warns early enough for an operator to act, the second takes the server out of
//! rotation before the resource runs out and requests start failing in odd ways.
//! Checks that read the filesystem do it on tokio's blocking pool: a `statvfs` on a hung
//! network mount must not stall a runtime worker (the registry's timeout then cuts it).
//!
//! [`Check`]: crate::Check

mod disk;
mod fd;
mod http;
mod memory;
mod process;
mod saturation;
mod tcp;

pub use disk::{Amount, DiskSpace, ParseAmountError};
pub use fd::FileDescriptors;
pub use http::{HttpGet, HttpGetError};
pub use memory::{CgroupMemory, CgroupVersion, Memory};
pub use process::ProcessAlive;
pub use saturation::{InFlight, InFlightGuard, Saturation};
pub use tcp::TcpConnect;

use vigil_core::Status;

/// Grades `value` against levels that must not be reached: at or above `fail` fails, at
/// or above `warn` warns.
fn grade_above(value: f64, warn: Option<f64>, fail: f64) -> Status {
    if value >= fail {
        Status::Fail
    } else if warn.is_some_and(|w| value >= w) {
        Status::Warn
    } else {
        Status::Pass
    }
}

/// Formats a byte count for people: `1.5 GiB`.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Rounds a percentage to two decimals for the `observedValue` field (more digits are
/// noise to a reader and to a dashboard).
fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// Checks a percentage level given by a user: finite and within 0..=100.
fn assert_percent(what: &str, value: f64) {
    assert!(
        value.is_finite() && (0.0..=100.0).contains(&value),
        "{what} must be a percentage within 0..=100, got {value}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grade_above_orders_levels() {
        assert_eq!(grade_above(10.0, Some(80.0), 95.0), Status::Pass);
        assert_eq!(grade_above(80.0, Some(80.0), 95.0), Status::Warn);
        assert_eq!(grade_above(95.0, Some(80.0), 95.0), Status::Fail);
        assert_eq!(grade_above(90.0, None, 95.0), Status::Pass);
    }

    #[test]
    fn human_bytes_picks_a_readable_unit() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024 * 1024), "3.0 GiB");
    }
}
