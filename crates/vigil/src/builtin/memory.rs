//! `Memory`: the process's memory use against a limit, cgroup-aware.
//!
//! Two limits can apply, and the check grades against whichever is closer:
//! - the cgroup's (a container's): what the OOM killer enforces. Usage is the cgroup's
//!   *working set* (`memory.current` minus inactive file pages, as the kubelet counts it),
//!   because page cache the kernel can drop is not pressure. cgroup v2 (`memory.max`,
//!   every ancestor up to the mount, the smallest wins) and v1 (`memory.limit_in_bytes`,
//!   and the hierarchical limit from `memory.stat`) are both read;
//! - an explicit RSS limit given to [`Memory::rss_limit`], against the process's resident
//!   set from `/proc/self/statm`.
//!
//! With neither, the check passes and reports the RSS, saying no limit applies.

use super::{PercentLevels, human_bytes, percent_of, round2};
use crate::{Check, CheckResult};
use std::fs;
use std::path::{Path, PathBuf};
use vigil_core::Status;

/// Default warn level: 80% of the limit.
pub const DEFAULT_WARN_PERCENT: f64 = 80.0;
/// Default fail level: 95% of the limit. Past it the kernel reclaims hard and the OOM
/// killer is one allocation burst away; better to shed traffic than to be killed with
/// requests in flight.
pub const DEFAULT_FAIL_PERCENT: f64 = 95.0;

/// cgroup v1 reports "no limit" as a huge page-aligned number (PAGE_COUNTER_MAX pages);
/// anything this large is no limit.
const UNLIMITED_THRESHOLD: u64 = 1 << 62;

/// Which cgroup interface a directory speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The unified hierarchy: `memory.max`, `memory.current`.
    V2,
    /// The legacy memory controller: `memory.limit_in_bytes`, `memory.usage_in_bytes`.
    V1,
}

/// Where the process's cgroup memory controller lives, and how far up limits are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMemory {
    /// Interface version.
    pub version: CgroupVersion,
    /// The process's own cgroup directory.
    pub dir: PathBuf,
    /// The hierarchy's mount point: v2 limits are read from `dir` up to here.
    pub mount: PathBuf,
}

/// What the cgroup says about memory.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CgroupReading {
    /// Smallest limit on the way up, `None` when unlimited.
    limit: Option<u64>,
    /// Working set: usage minus inactive file pages.
    working_set: u64,
}

impl CgroupMemory {
    /// Finds the memory controller of the calling process from `/proc/self/cgroup` and
    /// `/proc/self/mountinfo`. `None` outside Linux or without a mounted memory cgroup.
    pub fn detect() -> Option<CgroupMemory> {
        let cgroup = fs::read_to_string("/proc/self/cgroup").ok()?;
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
        Self::from_proc(&cgroup, &mountinfo, |p| p.exists())
    }

    /// A cgroup directory given explicitly (an unusual mount, or a test).
    pub fn at(version: CgroupVersion, dir: impl Into<PathBuf>) -> CgroupMemory {
        let dir = dir.into();
        CgroupMemory {
            version,
            mount: dir.clone(),
            dir,
        }
    }

    /// Resolves the controller from the text of `/proc/self/cgroup` and
    /// `/proc/self/mountinfo`; `exists` tells whether a path exists (v2 is only used when
    /// its directory has `memory.max`, so a hybrid host without the v2 memory controller
    /// falls back to v1).
    pub fn from_proc(
        cgroup: &str,
        mountinfo: &str,
        exists: impl Fn(&Path) -> bool,
    ) -> Option<CgroupMemory> {
        let mut v2_path = None;
        let mut v1_path = None;
        for line in cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if id == "0" && controllers.is_empty() {
                v2_path = Some(path);
            } else if controllers.split(',').any(|c| c == "memory") {
                v1_path = Some(path);
            }
        }
        let mounts: Vec<Mount<'_>> = mountinfo.lines().filter_map(Mount::parse).collect();
        if let Some(path) = v2_path
            && let Some(m) = mounts.iter().find(|m| m.fstype == "cgroup2")
            && let Some(dir) = m.resolve(path)
            && exists(&dir.join("memory.max"))
        {
            return Some(CgroupMemory {
                version: CgroupVersion::V2,
                dir,
                mount: PathBuf::from(m.mount_point),
            });
        }
        if let Some(path) = v1_path
            && let Some(m) = mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == "memory"))
            && let Some(dir) = m.resolve(path)
            && exists(&dir.join("memory.limit_in_bytes"))
        {
            return Some(CgroupMemory {
                version: CgroupVersion::V1,
                dir,
                mount: PathBuf::from(m.mount_point),
            });
        }
        None
    }

    fn read(&self) -> Result<CgroupReading, String> {
        match self.version {
            CgroupVersion::V2 => {
                let current = read_u64(&self.dir.join("memory.current"))?;
                let inactive = stat_field(&self.dir.join("memory.stat"), "inactive_file");
                // The effective limit is the smallest on the path up to the mount.
                let mut limit: Option<u64> = None;
                let mut dir = self.dir.as_path();
                loop {
                    match fs::read_to_string(dir.join("memory.max")) {
                        Ok(text) => {
                            if let Some(l) = parse_limit(&text) {
                                limit = Some(limit.map_or(l, |cur| cur.min(l)));
                            }
                        }
                        // The root cgroup has no memory.max; ancestors outside our
                        // namespace are not visible. Either way: nothing more to read.
                        Err(_) if dir != self.dir => break,
                        Err(e) => {
                            return Err(format!(
                                "cannot read {}: {e}",
                                dir.join("memory.max").display()
                            ));
                        }
                    }
                    if dir == self.mount {
                        break;
                    }
                    match dir.parent() {
                        Some(p) if p.starts_with(&self.mount) => dir = p,
                        _ => break,
                    }
                }
                Ok(CgroupReading {
                    limit,
                    working_set: current.saturating_sub(inactive.unwrap_or(0)),
                })
            }
            CgroupVersion::V1 => {
                let usage = read_u64(&self.dir.join("memory.usage_in_bytes"))?;
                let own = parse_limit(
                    &fs::read_to_string(self.dir.join("memory.limit_in_bytes")).map_err(|e| {
                        format!(
                            "cannot read {}/memory.limit_in_bytes: {e}",
                            self.dir.display()
                        )
                    })?,
                );
                let stat = self.dir.join("memory.stat");
                let hierarchical = stat_field(&stat, "hierarchical_memory_limit")
                    .filter(|l| *l < UNLIMITED_THRESHOLD);
                let limit = match (own, hierarchical) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let inactive = stat_field(&stat, "total_inactive_file");
                Ok(CgroupReading {
                    limit,
                    working_set: usage.saturating_sub(inactive.unwrap_or(0)),
                })
            }
        }
    }
}

/// One line of `/proc/self/mountinfo`, the fields we need.
struct Mount<'a> {
    root: &'a str,
    mount_point: &'a str,
    fstype: &'a str,
    super_opts: &'a str,
}

impl<'a> Mount<'a> {
    /// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
    fn parse(line: &'a str) -> Option<Mount<'a>> {
        let (left, right) = line.split_once(" - ")?;
        let mut l = left.split(' ');
        let root = l.nth(3)?;
        let mount_point = l.next()?;
        let mut r = right.split(' ');
        let fstype = r.next()?;
        let _source = r.next()?;
        let super_opts = r.next().unwrap_or("");
        Some(Mount {
            root,
            mount_point,
            fstype,
            super_opts,
        })
    }

    /// The directory of cgroup `path` under this mount, when the mount shows it.
    fn resolve(&self, path: &str) -> Option<PathBuf> {
        let rel = if self.root == "/" {
            path
        } else {
            path.strip_prefix(self.root)?
        };
        let rel = rel.trim_start_matches('/');
        Some(if rel.is_empty() {
            PathBuf::from(self.mount_point)
        } else {
            Path::new(self.mount_point).join(rel)
        })
    }
}

/// `max` or a huge v1 number is no limit.
fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|l| *l < UNLIMITED_THRESHOLD)
}

fn read_u64(path: &Path) -> Result<u64, String> {
    let text =
        fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    text.trim()
        .parse()
        .map_err(|_| format!("{}: not a number: {:?}", path.display(), text.trim()))
}

/// A `key value` line of a `memory.stat` file.
fn stat_field(path: &Path, key: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The resident set size of this process, from `/proc/self/statm` (pages).
fn rss_bytes() -> Result<u64, String> {
    let statm = fs::read_to_string("/proc/self/statm")
        .map_err(|e| format!("cannot read /proc/self/statm: {e}"))?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("/proc/self/statm: unexpected content {statm:?}"))?;
    Ok(pages * rustix::param::page_size() as u64)
}

/// Where cgroup limits come from.
#[derive(Clone, Debug)]
enum CgroupSource {
    /// Found from `/proc/self` at each check (cheap; follows a process moved between cgroups).
    Detect,
    /// Given explicitly.
    Fixed(CgroupMemory),
    /// Ignored.
    Off,
}

/// Memory in use against the cgroup's limit and/or an explicit RSS limit; see the
/// module docs. The observed value is bytes in use against the closest limit.
#[derive(Clone, Debug)]
pub struct Memory {
    rss_limit: Option<u64>,
    cgroup: CgroupSource,
    levels: PercentLevels,
}

impl Default for Memory {
    fn default() -> Self {
        Self::new()
    }
}

/// One usage-against-limit reading.
struct Usage {
    what: String,
    used: u64,
    limit: u64,
}

impl Memory {
    /// Grades against the detected cgroup limit, warning at 80% and failing at 95%.
    pub fn new() -> Self {
        Memory {
            rss_limit: None,
            cgroup: CgroupSource::Detect,
            levels: PercentLevels::new(DEFAULT_WARN_PERCENT, DEFAULT_FAIL_PERCENT),
        }
    }

    /// Also grades the process's RSS against `bytes`. Defaults to none.
    pub fn rss_limit(mut self, bytes: u64) -> Self {
        self.rss_limit = Some(bytes);
        self
    }

    /// Reads cgroup limits from this controller instead of detecting it.
    pub fn cgroup(mut self, cgroup: CgroupMemory) -> Self {
        self.cgroup = CgroupSource::Fixed(cgroup);
        self
    }

    /// Ignores cgroup limits (only the RSS limit, if any, applies).
    pub fn ignore_cgroup(mut self) -> Self {
        self.cgroup = CgroupSource::Off;
        self
    }

    /// Warns at this percentage of the limit. Defaults to 80.
    pub fn warn_at_percent(mut self, percent: f64) -> Self {
        self.levels.set_warn("Memory", percent);
        self
    }

    /// Never warns, only fails.
    pub fn no_warn(mut self) -> Self {
        self.levels.clear_warn();
        self
    }

    /// Fails at this percentage of the limit. Defaults to 95.
    pub fn fail_at_percent(mut self, percent: f64) -> Self {
        self.levels.set_fail("Memory", percent);
        self
    }

    fn observe(&self) -> CheckResult {
        let rss = match rss_bytes() {
            Ok(r) => r,
            Err(e) => return CheckResult::fail(e),
        };
        let mut usages = Vec::new();
        let mut notes = Vec::new();
        let cgroup = match &self.cgroup {
            CgroupSource::Detect => CgroupMemory::detect(),
            CgroupSource::Fixed(c) => Some(c.clone()),
            CgroupSource::Off => None,
        };
        if let Some(cg) = cgroup {
            match cg.read() {
                Ok(CgroupReading {
                    limit: Some(limit),
                    working_set,
                }) => usages.push(Usage {
                    what: format!("cgroup {:?} working set", cg.version),
                    used: working_set,
                    limit,
                }),
                Ok(CgroupReading { limit: None, .. }) => notes.push("cgroup sets no limit"),
                Err(e) => return CheckResult::fail(format!("cgroup memory: {e}")),
            }
        } else if !matches!(self.cgroup, CgroupSource::Off) {
            notes.push("no memory cgroup");
        }
        if let Some(limit) = self.rss_limit {
            usages.push(Usage {
                what: "RSS".into(),
                used: rss,
                limit,
            });
        }
        self.grade(rss, usages, &notes)
    }

    fn grade(&self, rss: u64, usages: Vec<Usage>, notes: &[&str]) -> CheckResult {
        let pct = |u: &Usage| percent_of(u.used, u.limit);
        let Some(worst) = usages.iter().max_by(|a, b| pct(a).total_cmp(&pct(b))) else {
            let why = if notes.is_empty() {
                "no memory limit".to_string()
            } else {
                format!("no memory limit ({})", notes.join(", "))
            };
            return CheckResult::new(Status::Pass)
                .with_observed(rss, "bytes")
                .with_output(format!("RSS {}; {why}", human_bytes(rss)));
        };
        let used = pct(worst);
        CheckResult::new(self.levels.grade(used))
            .with_observed(worst.used, "bytes")
            .with_output(format!(
                "{} {} of {} limit ({:.1}%); RSS {}; {}",
                worst.what,
                human_bytes(worst.used),
                human_bytes(worst.limit),
                round2(used),
                human_bytes(rss),
                self.levels.describe()
            ))
    }
}

impl Check for Memory {
    async fn check(&self) -> CheckResult {
        // A few small reads from /proc and cgroupfs, pseudo-filesystems that do not
        // block on devices: done inline.
        self.observe()
    }

    fn component_type(&self) -> &str {
        "system"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn detects_v1_on_a_hybrid_host_without_v2_memory() {
        let cgroup = "4:memory:/app/abc\n0::/\n";
        let found =
            CgroupMemory::from_proc(cgroup, MOUNTINFO, |p| p.ends_with("memory.limit_in_bytes"))
                .expect("v1 controller");
        assert_eq!(found.version, CgroupVersion::V1);
        assert_eq!(found.dir, PathBuf::from("/sys/fs/cgroup/memory/app/abc"));
    }

    #[test]
    fn prefers_v2_when_it_has_the_memory_controller() {
        let cgroup = "4:memory:/app/abc\n0::/svc.slice/x.service\n";
        let found = CgroupMemory::from_proc(cgroup, MOUNTINFO, |_| true).expect("v2 controller");
        assert_eq!(found.version, CgroupVersion::V2);
        assert_eq!(
            found.dir,
            PathBuf::from("/sys/fs/cgroup/unified/svc.slice/x.service")
        );
        assert_eq!(found.mount, PathBuf::from("/sys/fs/cgroup/unified"));
    }

    #[test]
    fn namespaced_mount_root_is_stripped() {
        let mountinfo = "50 40 0:40 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let found = CgroupMemory::from_proc("0::/kubepods/pod1/c1\n", mountinfo, |_| true)
            .expect("v2 controller");
        assert_eq!(found.dir, PathBuf::from("/sys/fs/cgroup/c1"));
    }

    #[test]
    fn no_memory_cgroup_is_none() {
        assert_eq!(CgroupMemory::from_proc("0::/\n", "", |_| true), None);
    }

    #[test]
    fn limits_parse() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None, "v1 'unlimited'");
        assert_eq!(parse_limit("1048576\n"), Some(1048576));
    }
}
