//! `FileDescriptors`: open file descriptors against the process's soft `RLIMIT_NOFILE`.

use super::{PercentLevels, percent_of, round2};
use crate::{Check, CheckResult};
use rustix::process::{Resource, getrlimit};
use std::io;
use std::path::PathBuf;
use vigil_core::Status;

/// Default warn level: 80% of the soft limit in use, time to look for a leak.
pub const DEFAULT_WARN_PERCENT: f64 = 80.0;
/// Default fail level: 95% of the soft limit in use. Past it the next accept or open
/// fails with EMFILE; a server this close cannot take connections reliably, so it leaves
/// rotation while it can still answer its health check.
pub const DEFAULT_FAIL_PERCENT: f64 = 95.0;

/// Where Linux lists the calling process's open descriptors.
const PROC_SELF_FD: &str = "/proc/self/fd";

/// File descriptors in use (entries of `/proc/self/fd`) against the soft
/// `RLIMIT_NOFILE`, the limit `accept` and `open` actually hit.
///
/// When not a single descriptor is left (the check cannot even open `/proc/self/fd`),
/// the check fails saying so: that is the condition it exists to catch.
#[derive(Clone, Debug)]
pub struct FileDescriptors {
    levels: PercentLevels,
    fd_dir: PathBuf,
}

impl Default for FileDescriptors {
    fn default() -> Self {
        Self::new()
    }
}

impl FileDescriptors {
    /// Warns at 80% of the soft limit, fails at 95%.
    pub fn new() -> Self {
        FileDescriptors {
            levels: PercentLevels::new(DEFAULT_WARN_PERCENT, DEFAULT_FAIL_PERCENT),
            fd_dir: PathBuf::from(PROC_SELF_FD),
        }
    }

    /// Warns at this percentage of the soft limit in use. Defaults to 80.
    pub fn warn_at_percent(mut self, percent: f64) -> Self {
        self.levels.set_warn("FileDescriptors", percent);
        self
    }

    /// Never warns, only fails.
    pub fn no_warn(mut self) -> Self {
        self.levels.clear_warn();
        self
    }

    /// Fails at this percentage of the soft limit in use. Defaults to 95.
    pub fn fail_at_percent(mut self, percent: f64) -> Self {
        self.levels.set_fail("FileDescriptors", percent);
        self
    }

    /// Counts open descriptors, not counting the one used to list them.
    fn count_open(&self) -> io::Result<u64> {
        let mut n: u64 = 0;
        for entry in std::fs::read_dir(&self.fd_dir)? {
            entry?;
            n += 1;
        }
        // The directory handle read_dir holds is listed too.
        Ok(n.saturating_sub(1))
    }

    fn observe(&self) -> CheckResult {
        let limit = getrlimit(Resource::Nofile).current;
        let open = match self.count_open() {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::MFILE.raw_os_error()) => {
                let limit = limit.map_or("unlimited".to_string(), |l| l.to_string());
                return CheckResult::fail(format!(
                    "file descriptors exhausted: not one left to list {PROC_SELF_FD} (EMFILE, soft limit {limit})"
                ));
            }
            Err(e) => {
                return CheckResult::fail(format!(
                    "cannot count open file descriptors in {}: {e}",
                    self.fd_dir.display()
                ));
            }
        };
        self.grade(open, limit)
    }

    /// Grades `open` descriptors against the soft `limit` (`None`: unlimited).
    fn grade(&self, open: u64, limit: Option<u64>) -> CheckResult {
        let Some(limit) = limit.filter(|l| *l > 0) else {
            return CheckResult::new(Status::Pass)
                .with_observed(open, "count")
                .with_output(format!(
                    "{open} file descriptors open; no soft limit (RLIMIT_NOFILE unlimited)"
                ));
        };
        let used = percent_of(open, limit);
        CheckResult::new(self.levels.grade(used))
            .with_observed(open, "count")
            .with_output(format!(
                "{open} of {limit} file descriptors in use ({:.1}%); {}",
                round2(used),
                self.levels.describe()
            ))
    }
}

impl Check for FileDescriptors {
    async fn check(&self) -> CheckResult {
        // Listing /proc/self/fd is a handful of getdents calls on a pseudo-filesystem
        // that never blocks on a device: done inline.
        self.observe()
    }

    fn component_type(&self) -> &str {
        "system"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grades_against_the_limit() {
        let check = FileDescriptors::new();
        assert_eq!(check.grade(10, Some(1000)).status, Status::Pass);
        assert_eq!(check.grade(800, Some(1000)).status, Status::Warn);
        assert_eq!(check.grade(950, Some(1000)).status, Status::Fail);
        assert_eq!(
            check.grade(1_000_000, None).status,
            Status::Pass,
            "no limit, nothing to exhaust"
        );
    }

    #[test]
    fn counts_a_descriptor_we_open() {
        let check = FileDescriptors::new();
        let before = check.count_open().unwrap();
        let files: Vec<_> = (0..5)
            .map(|_| std::fs::File::open("/proc/self/stat").unwrap())
            .collect();
        let during = check.count_open().unwrap();
        drop(files);
        // Other test threads may open descriptors too; ours are at least counted.
        assert!(
            during >= before + 5,
            "5 open files must be counted: before {before}, during {during}"
        );
    }
}
