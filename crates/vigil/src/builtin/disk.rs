//! `DiskSpace`: free space on the filesystem holding a path, against warn and fail levels.

use super::{assert_percent, human_bytes, observe_blocking, round2};
use crate::{Check, CheckResult};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use vigil_core::Status;

/// Default warn level: under 10% free. Most filesystems slow down (fragmentation,
/// reserved blocks) and log rotation starts failing well before 0%; 10% leaves an
/// operator hours to act on a typical growth rate.
pub const DEFAULT_WARN_BELOW: Amount = Amount::Percent(10.0);
/// Default fail level: under 5% free. Below that a burst of writes (a core dump, a
/// large upload, a compaction) can fill the disk, and a server that cannot write
/// should stop taking traffic before its requests start failing.
pub const DEFAULT_FAIL_BELOW: Amount = Amount::Percent(5.0);

/// An amount of free space: absolute bytes or a percentage of the filesystem's size.
///
/// Parses from `"10%"`, `"512MiB"`, `"2GB"`, `"1048576"` (bytes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    /// Bytes.
    Bytes(u64),
    /// Percent of the filesystem's size (0..=100).
    Percent(f64),
}

impl Amount {
    /// The amount in bytes on a filesystem of `total` bytes.
    fn bytes_of(self, total: u64) -> u64 {
        match self {
            Amount::Bytes(b) => b,
            Amount::Percent(p) => (total as f64 * p / 100.0).ceil() as u64,
        }
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Bytes(b) => f.write_str(&human_bytes(*b)),
            Amount::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// An amount that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid amount {0:?}: expected a percentage (\"10%\") or bytes (\"512MiB\", \"2GB\", \"4096\")"
)]
pub struct ParseAmountError(pub String);

impl FromStr for Amount {
    type Err = ParseAmountError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseAmountError(s.to_string());
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| err())?;
            if !(p.is_finite() && (0.0..=100.0).contains(&p)) {
                return Err(err());
            }
            return Ok(Amount::Percent(p));
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let num: f64 = num.parse().map_err(|_| err())?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1000,
            "kib" => 1 << 10,
            "m" | "mb" => 1000 * 1000,
            "mib" => 1 << 20,
            "g" | "gb" => 1000 * 1000 * 1000,
            "gib" => 1 << 30,
            "t" | "tb" => 1000 * 1000 * 1000 * 1000,
            "tib" => 1 << 40,
            // Display writes PiB for the largest amounts: what it writes must parse back
            // (found by the `amount` fuzz target).
            "p" | "pb" => 1000 * 1000 * 1000 * 1000 * 1000,
            "pib" => 1 << 50,
            _ => return Err(err()),
        };
        let bytes = num * mult as f64;
        // `as u64` would saturate silently: an amount past 16 EiB is a typo, not a limit.
        if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
            return Err(err());
        }
        Ok(Amount::Bytes(bytes as u64))
    }
}

/// Free disk space on the filesystem holding `path` (`statvfs`), counted as the space
/// available to an unprivileged process (root's reserved blocks excluded, as `df` does).
///
/// ```
/// use vigil::builtin::{Amount, DiskSpace};
/// let check = DiskSpace::new("/var/lib/app")
///     .warn_below(Amount::Percent(15.0))
///     .fail_below(Amount::Bytes(1 << 30));
/// ```
///
/// The observed value is free bytes, or free percent when the fail level is a
/// percentage, so the value reads in the unit the operator chose.
#[derive(Clone, Debug)]
pub struct DiskSpace {
    path: PathBuf,
    warn_below: Option<Amount>,
    fail_below: Amount,
}

impl DiskSpace {
    /// Checks the filesystem holding `path`, warning below 10% free and failing below 5%.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        DiskSpace {
            path: path.into(),
            warn_below: Some(DEFAULT_WARN_BELOW),
            fail_below: DEFAULT_FAIL_BELOW,
        }
    }

    /// Warns when free space is below this. Defaults to 10%.
    pub fn warn_below(mut self, amount: Amount) -> Self {
        if let Amount::Percent(p) = amount {
            assert_percent("DiskSpace", "warn", p);
        }
        self.warn_below = Some(amount);
        self
    }

    /// Never warns, only fails.
    pub fn no_warn(mut self) -> Self {
        self.warn_below = None;
        self
    }

    /// Fails when free space is below this. Defaults to 5%.
    pub fn fail_below(mut self, amount: Amount) -> Self {
        if let Amount::Percent(p) = amount {
            assert_percent("DiskSpace", "fail", p);
        }
        self.fail_below = amount;
        self
    }

    /// The path whose filesystem is checked.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn observe(&self) -> CheckResult {
        let vfs = match rustix::fs::statvfs(&self.path) {
            Ok(vfs) => vfs,
            Err(e) => {
                return CheckResult::fail(format!(
                    "cannot stat the filesystem of {}: {e}",
                    self.path.display()
                ));
            }
        };
        let total = vfs.f_blocks.saturating_mul(vfs.f_frsize);
        let free = vfs.f_bavail.saturating_mul(vfs.f_frsize);
        self.grade(free, total)
    }

    /// Grades `free` bytes out of `total`.
    fn grade(&self, free: u64, total: u64) -> CheckResult {
        let free_pct = if total == 0 {
            0.0
        } else {
            free as f64 * 100.0 / total as f64
        };
        let fail_bytes = self.fail_below.bytes_of(total);
        let (status, verdict) = if free < fail_bytes {
            (
                Status::Fail,
                format!(", below the fail level {}", self.fail_below),
            )
        } else if let Some(level) = self.warn_below
            && free < level.bytes_of(total)
        {
            (Status::Warn, format!(", below the warn level {level}"))
        } else {
            (Status::Pass, String::new())
        };
        let output = format!(
            "{}: {} free of {} ({:.1}%){verdict}",
            self.path.display(),
            human_bytes(free),
            human_bytes(total),
            free_pct
        );
        let observation = CheckResult::new(status).with_output(output);
        match self.fail_below {
            Amount::Percent(_) => observation.with_observed(round2(free_pct), "percent"),
            Amount::Bytes(_) => observation.with_observed(free, "bytes"),
        }
    }
}

impl Check for DiskSpace {
    async fn check(&self) -> CheckResult {
        let this = self.clone();
        observe_blocking("disk", move || this.observe()).await
    }

    fn component_type(&self) -> &str {
        "system"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_parse() {
        assert_eq!("10%".parse::<Amount>().unwrap(), Amount::Percent(10.0));
        assert_eq!(
            "512MiB".parse::<Amount>().unwrap(),
            Amount::Bytes(512 << 20)
        );
        assert_eq!(
            "2GB".parse::<Amount>().unwrap(),
            Amount::Bytes(2_000_000_000)
        );
        assert_eq!("4096".parse::<Amount>().unwrap(), Amount::Bytes(4096));
        assert_eq!("1.5 GiB".parse::<Amount>().unwrap(), Amount::Bytes(3 << 29));
        for bad in [
            "",
            "%",
            "101%",
            "-5%",
            "12 parsecs",
            "-1GB",
            "abc",
            "99999999999TiB",
        ] {
            assert!(bad.parse::<Amount>().is_err(), "{bad:?} must not parse");
        }
    }

    #[test]
    fn what_display_writes_parses_back() {
        // Minimised from the `amount` fuzz target (fuzz/regressions/amount/).
        for bytes in [
            0,
            512,
            1536,
            3 << 30,
            7 << 40,
            7_777_777_777_777_772,
            u64::MAX / 2,
        ] {
            let shown = Amount::Bytes(bytes).to_string();
            let back = shown.parse::<Amount>();
            assert!(
                back.is_ok(),
                "{bytes} is displayed as {shown:?}, which must parse"
            );
        }
    }

    #[test]
    fn grading_uses_both_levels() {
        let check = DiskSpace::new("/x")
            .warn_below(Amount::Percent(20.0))
            .fail_below(Amount::Bytes(100));
        assert_eq!(check.grade(500, 1000).status, Status::Pass);
        assert_eq!(check.grade(150, 1000).status, Status::Warn);
        let failed = check.grade(99, 1000);
        assert_eq!(failed.status, Status::Fail);
        assert_eq!(failed.observed_unit.as_deref(), Some("bytes"));
        assert!(
            failed
                .output
                .as_deref()
                .unwrap()
                .contains("below the fail level"),
            "output must say why: {:?}",
            failed.output
        );
    }
}
