//! `ProcessAlive`: a critical support process (a sidecar, an agent, a local proxy) runs.
//!
//! Found by pid file (the pid it names exists in `/proc` and is not a zombie) or by
//! name (a process in `/proc` whose `comm` or first argument's file name matches).

use super::observe_blocking;
use crate::{Check, CheckResult};
use std::fs;
use std::path::{Path, PathBuf};
use vigil_core::Status;

/// Where the process is found.
#[derive(Clone, Debug)]
enum Target {
    PidFile(PathBuf),
    Name(String),
}

/// A support process is alive; see the module docs. Observed value: how many matching
/// processes run (0 or 1 for a pid file).
#[derive(Clone, Debug)]
pub struct ProcessAlive {
    target: Target,
    proc_root: PathBuf,
}

impl ProcessAlive {
    /// The process whose pid `path` holds (a decimal number, surrounding whitespace ok).
    pub fn pid_file(path: impl Into<PathBuf>) -> Self {
        ProcessAlive {
            target: Target::PidFile(path.into()),
            proc_root: PathBuf::from("/proc"),
        }
    }

    /// Any process named `name`: its `comm` (the kernel keeps the first 15 bytes of the
    /// executable's name) or the file name of its `argv[0]`.
    pub fn name(name: impl Into<String>) -> Self {
        ProcessAlive {
            target: Target::Name(name.into()),
            proc_root: PathBuf::from("/proc"),
        }
    }

    fn observe(&self) -> CheckResult {
        match &self.target {
            Target::PidFile(path) => self.observe_pid_file(path),
            Target::Name(name) => self.observe_name(name),
        }
    }

    fn observe_pid_file(&self, path: &Path) -> CheckResult {
        let text = match fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                return CheckResult::fail(format!("cannot read pid file {}: {e}", path.display()))
                    .with_observed(0, "count");
            }
        };
        let Ok(pid) = text.trim().parse::<u32>() else {
            return CheckResult::fail(format!(
                "pid file {} holds {:?}, not a pid",
                path.display(),
                text.trim()
            ))
            .with_observed(0, "count");
        };
        match self.state_of(pid) {
            Some(state) if state != 'Z' && state != 'X' => CheckResult::new(Status::Pass)
                .with_observed(1, "count")
                .with_output(format!(
                    "pid {pid} from {} is running (state {state})",
                    path.display()
                )),
            Some(state) => CheckResult::fail(format!(
                "pid {pid} from {} is dead (state {state}, not yet reaped)",
                path.display()
            ))
            .with_observed(0, "count"),
            None => CheckResult::fail(format!("pid {pid} from {} is not running", path.display()))
                .with_observed(0, "count"),
        }
    }

    fn observe_name(&self, name: &str) -> CheckResult {
        let entries = match fs::read_dir(&self.proc_root) {
            Ok(e) => e,
            Err(e) => {
                return CheckResult::fail(format!("cannot list {}: {e}", self.proc_root.display()));
            }
        };
        // comm holds at most 15 bytes of the name.
        let comm_name: String = name.chars().take(15).collect();
        let mut pids = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            // Processes come and go while we look: unreadable entries are skipped.
            let comm = fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            let argv0_matches = || {
                fs::read(entry.path().join("cmdline"))
                    .ok()
                    .and_then(|c| {
                        let first = c.split(|b| *b == 0).next()?.to_vec();
                        let first = String::from_utf8(first).ok()?;
                        Some(Path::new(&first).file_name().is_some_and(|f| f == name))
                    })
                    .unwrap_or(false)
            };
            if (comm.trim_end_matches('\n') == comm_name || argv0_matches())
                && self.state_of(pid).is_some_and(|s| s != 'Z' && s != 'X')
            {
                pids.push(pid);
            }
        }
        if pids.is_empty() {
            CheckResult::fail(format!("no process named {name:?} is running"))
                .with_observed(0, "count")
        } else {
            let shown: Vec<String> = pids.iter().take(5).map(u32::to_string).collect();
            let more = if pids.len() > 5 { ", ..." } else { "" };
            CheckResult::new(Status::Pass)
                .with_observed(pids.len(), "count")
                .with_output(format!(
                    "{} process(es) named {name:?} running (pid {}{more})",
                    pids.len(),
                    shown.join(", ")
                ))
        }
    }

    /// The state letter of `pid` from `/proc/<pid>/stat`, `None` when it does not exist.
    fn state_of(&self, pid: u32) -> Option<char> {
        let stat = fs::read_to_string(self.proc_root.join(pid.to_string()).join("stat")).ok()?;
        // "pid (comm) S ...": comm may hold spaces and parentheses; the state follows
        // the last ')'.
        let after = &stat[stat.rfind(')')? + 1..];
        after.trim_start().chars().next()
    }
}

impl Check for ProcessAlive {
    async fn check(&self) -> CheckResult {
        // Scanning /proc by name touches every process: keep it off the runtime workers.
        let this = self.clone();
        observe_blocking("process", move || this.observe()).await
    }

    fn component_type(&self) -> &str {
        "system"
    }
}
