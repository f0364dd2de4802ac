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
mod levels;
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

use crate::CheckResult;
use levels::PercentLevels;

/// `part` as a percentage of `whole`; a `whole` of zero counts as full (100%).
fn percent_of(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        100.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Runs `observe` on tokio's blocking pool (see the module docs); a panic there fails
/// the check, naming it by `what`.
async fn observe_blocking(
    what: &str,
    observe: impl FnOnce() -> CheckResult + Send + 'static,
) -> CheckResult {
    match tokio::task::spawn_blocking(observe).await {
        Ok(observation) => observation,
        Err(e) => CheckResult::fail(format!("{what} check task failed: {e}")),
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

/// Checks the `level` ("warn" or "fail") a user gives to `check`: a percentage, finite
/// and within 0..=100.
fn assert_percent(check: &str, level: &str, value: f64) {
    assert!(
        value.is_finite() && (0.0..=100.0).contains(&value),
        "{check} {level} level must be a percentage within 0..=100, got {value}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_of_counts_an_empty_whole_as_full() {
        assert_eq!(percent_of(1, 4), 25.0);
        assert_eq!(percent_of(0, 0), 100.0);
    }

    #[test]
    fn human_bytes_picks_a_readable_unit() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024 * 1024), "3.0 GiB");
    }
}
