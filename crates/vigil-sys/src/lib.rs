//! The few system calls vigil needs that no well-kept crate wraps, each behind a safe
//! function. The rest of the workspace forbids `unsafe`; here it is denied and allowed
//! on each call, with the reason beside it.
//!
//! - [`set_thread_slice`]: `sched_setattr` with a slice for the fair scheduler (Linux
//!   6.12 and later). `libc` declares the system call's number only; `nix`, `rustix` and
//!   `thread-priority` (3.1) set policies, priorities and deadline parameters, not a
//!   slice for a normal thread.

use std::io;
use std::time::Duration;

/// The kernel's `struct sched_attr` as of its first version (`SCHED_ATTR_SIZE_VER0`,
/// 48 bytes), which every kernel with the call accepts.
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

#[cfg(target_os = "linux")]
const SCHED_ATTR_SIZE_VER0: u32 = 48;

/// `SCHED_FLAG_RESET_ON_FORK` of `sched_attr::sched_flags`.
#[cfg(target_os = "linux")]
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// The scheduling attributes of thread `tid` (0: the calling thread).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn get_attr(tid: i32) -> io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: `attr` is a valid, writable `sched_attr` of the size passed; `tid` is any
    // number (the kernel answers ESRCH for one that is no thread); flags must be 0.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut attr as *mut SchedAttr,
            SCHED_ATTR_SIZE_VER0,
            0,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr)
}

/// Sets the calling thread's scheduling attributes (`attr` with its `size` set to the
/// version-0 size).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn set_attr(attr: &mut SchedAttr) -> io::Result<()> {
    attr.size = SCHED_ATTR_SIZE_VER0;
    // SAFETY: `attr` is a valid `sched_attr` whose `size` field says its size, so the
    // kernel only reads it (it writes `size` back only for a size it does not accept);
    // pid 0 is the calling thread; flags must be 0.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, attr as *const SchedAttr, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the calling thread runs under a seccomp filter (`Seccomp: 2` in
/// `/proc/thread-self/status`): one that may kill the process for a system call it
/// does not allow (systemd's `SystemCallFilter=` does, by default, for
/// `sched_setattr`, which is in its `@resources` set).
#[cfg(target_os = "linux")]
fn under_seccomp_filter() -> bool {
    std::fs::read_to_string("/proc/thread-self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .is_some_and(|v| v.trim() == "2")
    })
}

/// Makes [`set_attr`] with `attr` in a child process forked from the calling thread
/// (which inherits its seccomp filter) and tells whether it succeeded there: a filter
/// that kills the caller for that call kills the child only.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn set_attr_survives_in_a_child(mut attr: SchedAttr) -> bool {
    // SAFETY: between fork and _exit the child only makes the async-signal-safe system
    // calls sched_setattr(2) (in `set_attr`, which reads errno and allocates nothing)
    // and _exit(2), on memory it already has; no lock.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = set_attr(&mut attr).is_ok();
        // SAFETY: ends the child at once, without running the parent's exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) }
    }
    if pid < 0 {
        return false;
    }
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid place for the child's status; `pid` is our child.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        if waited == pid {
            return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
}

/// Whether `policy` is one of the fair scheduler's, whose threads have a slice
/// (`SCHED_OTHER`, `SCHED_BATCH`; not `SCHED_IDLE`, nor the real-time ones).
#[cfg(target_os = "linux")]
fn fair(policy: u32) -> bool {
    [libc::SCHED_OTHER, libc::SCHED_BATCH]
        .map(|p| p as u32)
        .contains(&policy)
}

/// Asks the kernel's fair scheduler (EEVDF, Linux 6.12 and later) to run the calling
/// thread in turns of `slice` instead of its default (a few milliseconds): a thread with
/// a shorter slice gets the CPU sooner and more often, for shorter turns, with the same
/// share of it. The thread's policy (`SCHED_OTHER` or `SCHED_BATCH`) and nice value stay
/// as they are; no privilege is needed.
///
/// Threads the thread starts afterwards inherit the slice (since Linux 6.12).
///
/// Under a seccomp filter, which may kill the whole process for a system call it does
/// not allow, the call is first tried in a forked child (one `fork` per call, only
/// then); refused there, it is not made here.
///
/// Returns the slice the kernel keeps for the thread, read back (it clamps to 0.1-100
/// ms; a loaded sched_ext scheduler keeps the value but may ignore it). Errors:
/// `Unsupported` where the kernel has no such setting (before 6.12: it ignores the
/// value) or the thread runs under a real-time, deadline or idle policy (left alone);
/// `PermissionDenied` where a seccomp filter forbids the call; the system call's own
/// error otherwise.
pub fn set_thread_slice(slice: Duration) -> io::Result<Duration> {
    #[cfg(target_os = "linux")]
    {
        let mut attr = get_attr(0)?;
        if !fair(attr.sched_policy) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "the thread runs under scheduling policy {}, not a fair one: left alone",
                    attr.sched_policy
                ),
            ));
        }
        // Keep SCHED_FLAG_RESET_ON_FORK as it is (an unprivileged thread may not clear
        // it); nothing else is asked for.
        attr.sched_flags &= SCHED_FLAG_RESET_ON_FORK;
        attr.sched_runtime = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX).max(1);
        if under_seccomp_filter() && !set_attr_survives_in_a_child(attr) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the process's seccomp filter does not allow sched_setattr (tried in a child \
                 process; systemd's SystemCallFilter=~@resources forbids it): not asked for",
            ));
        }
        set_attr(&mut attr)?;
        match thread_slice()? {
            Some(kept) => Ok(kept),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this kernel has no slice setting for normal threads (Linux 6.12 and later do)",
            )),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = slice;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a scheduler slice can only be asked for on Linux",
        ))
    }
}

/// The calling thread's slice under the fair scheduler, `None` where the kernel does not
/// report one (before Linux 6.12, or not Linux).
pub fn thread_slice() -> io::Result<Option<Duration>> {
    thread_slice_of(0)
}

/// [`thread_slice`] of thread `tid` (a Linux thread id, as in `/proc/<pid>/task/<tid>`;
/// 0 is the calling thread).
pub fn thread_slice_of(tid: i32) -> io::Result<Option<Duration>> {
    #[cfg(target_os = "linux")]
    {
        let attr = get_attr(tid)?;
        let slice = fair(attr.sched_policy) && attr.sched_runtime > 0;
        Ok(slice.then(|| Duration::from_nanos(attr.sched_runtime)))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = tid;
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a fresh thread, so that the test thread's own attributes stay.
    fn on_a_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().expect("thread")
    }

    #[test]
    fn a_slice_is_kept_clamped_and_read_back_on_a_kernel_that_has_it() {
        let Ok(Some(default)) = thread_slice() else {
            eprintln!("skipped: this kernel reports no fair-scheduler slice (before 6.12)");
            return;
        };
        let (set, read, other) = on_a_thread(|| {
            let set =
                set_thread_slice(Duration::from_micros(300)).expect("allowed without privilege");
            (
                set,
                thread_slice().expect("readable"),
                thread_slice_of_a_new_thread(),
            )
        });
        assert_eq!(
            set,
            Duration::from_micros(300),
            "kept as asked (default {default:?})"
        );
        assert_eq!(read, Some(Duration::from_micros(300)));
        assert_eq!(
            other,
            Some(Duration::from_micros(300)),
            "a thread it starts inherits it"
        );
        assert_eq!(
            thread_slice().expect("readable"),
            Some(default),
            "other threads keep theirs"
        );

        let clamped = on_a_thread(|| set_thread_slice(Duration::from_micros(10)));
        assert_eq!(
            clamped.expect("allowed"),
            Duration::from_micros(100),
            "the kernel's floor"
        );
    }

    /// A thread under a seccomp filter that kills the process for `sched_setattr` (as
    /// systemd's `SystemCallFilter=~@resources` does) gets an error, and the process
    /// lives: without the probe in a child, this test's process would die of SIGSYS.
    #[test]
    fn a_seccomp_filter_that_kills_for_the_call_is_found_without_dying() {
        let Ok(Some(_)) = thread_slice() else {
            eprintln!("skipped: this kernel reports no fair-scheduler slice (before 6.12)");
            return;
        };
        let arch = match std::env::consts::ARCH {
            "x86_64" => seccompiler::TargetArch::x86_64,
            "aarch64" => seccompiler::TargetArch::aarch64,
            other => {
                eprintln!("skipped: no seccomp filter built for {other}");
                return;
            }
        };
        // On the calling thread only (no TSYNC): the rest of the test process is
        // unaffected. Every other call is allowed.
        let filter = move |call: i64, action: seccompiler::SeccompAction| {
            let rules = [(call, vec![])].into_iter().collect();
            let filter = seccompiler::SeccompFilter::new(
                rules,
                seccompiler::SeccompAction::Allow,
                action,
                arch,
            )
            .expect("filter");
            let bpf: seccompiler::BpfProgram = filter.try_into().expect("bpf");
            seccompiler::apply_filter(&bpf).expect("seccomp filter installed");
        };
        let (refused, allowed_meanwhile) = on_a_thread(move || {
            filter(
                libc::SYS_sched_setattr,
                seccompiler::SeccompAction::KillProcess,
            );
            assert!(under_seccomp_filter());
            let refused = set_thread_slice(Duration::from_micros(300));
            (refused, thread_slice().expect("sched_getattr is allowed"))
        });
        let e = refused.expect_err("refused, not made");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("seccomp"), "{e}");
        assert_ne!(allowed_meanwhile, Some(Duration::from_micros(300)));

        // A filter that allows it: the probe passes and the slice is set.
        let set = on_a_thread(move || {
            filter(
                libc::SYS_getpid,
                seccompiler::SeccompAction::Errno(libc::EPERM as u32),
            );
            set_thread_slice(Duration::from_micros(300))
        });
        assert_eq!(
            set.expect("allowed by this filter"),
            Duration::from_micros(300)
        );
    }

    fn thread_slice_of_a_new_thread() -> Option<Duration> {
        on_a_thread(|| thread_slice().expect("readable"))
    }

    #[test]
    fn the_nice_value_is_kept() {
        let Ok(Some(_)) = thread_slice() else {
            eprintln!("skipped: this kernel reports no fair-scheduler slice (before 6.12)");
            return;
        };
        let (before, after) = on_a_thread(|| {
            // Raising one's own nice value needs no privilege.
            let mut attr = get_attr(0).expect("readable");
            let nice = (attr.sched_nice + 1).min(19);
            attr.sched_nice = nice;
            set_attr(&mut attr).expect("a higher nice value is allowed");
            set_thread_slice(Duration::from_millis(1)).expect("allowed");
            (nice, get_attr(0).expect("readable").sched_nice)
        });
        assert_eq!(after, before);
    }
}
