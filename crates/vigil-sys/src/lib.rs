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
#[derive(Debug, Default)]
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

/// Sets the calling thread's scheduling attributes.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn set_attr(attr: &SchedAttr) -> io::Result<()> {
    // SAFETY: `attr` is a valid `sched_attr` whose `size` field says its size; the
    // kernel only reads it; pid 0 is the calling thread; flags must be 0.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, attr as *const SchedAttr, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Asks the kernel's fair scheduler (EEVDF, Linux 6.12 and later) to run the calling
/// thread in turns of `slice` instead of its default (a few milliseconds): a thread with
/// a shorter slice gets the CPU sooner and more often, for shorter turns, with the same
/// share of it. The thread's policy (`SCHED_OTHER` or `SCHED_BATCH`) and nice value stay
/// as they are; no privilege is needed.
///
/// Returns the slice the kernel keeps for the thread, read back (it clamps to 0.1-100
/// ms). Errors: `Unsupported` where the kernel has no such setting (before 6.12: it
/// ignores the value) or the thread runs under a real-time or deadline policy (left
/// alone); the system call's own error otherwise.
pub fn set_thread_slice(slice: Duration) -> io::Result<Duration> {
    #[cfg(target_os = "linux")]
    {
        let mut attr = get_attr(0)?;
        let fair = [libc::SCHED_OTHER, libc::SCHED_BATCH].map(|p| p as u32);
        if !fair.contains(&attr.sched_policy) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "the thread runs under scheduling policy {}, not a fair one: left alone",
                    attr.sched_policy
                ),
            ));
        }
        attr.size = SCHED_ATTR_SIZE_VER0;
        attr.sched_flags = 0;
        attr.sched_runtime = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX).max(1);
        set_attr(&attr)?;
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
        let fair = [libc::SCHED_OTHER, libc::SCHED_BATCH].map(|p| p as u32);
        let slice = fair.contains(&attr.sched_policy) && attr.sched_runtime > 0;
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
            attr.size = SCHED_ATTR_SIZE_VER0;
            attr.sched_nice = 5;
            set_attr(&attr).expect("a higher nice value is allowed");
            set_thread_slice(Duration::from_millis(1)).expect("allowed");
            (5, get_attr(0).expect("readable").sched_nice)
        });
        assert_eq!(after, before);
    }
}
