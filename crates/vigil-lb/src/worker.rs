//! A worker thread's manners: each worker runs its own single-threaded runtime
//! (`daemon.rs`), and a busy one offers its CPU to other runnable processes once per
//! `SHARE_CPU_EVERY` (`share_cpu`).
//!
//! Floor 7, shared (floors: the crate doc): imports no other module of this crate.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// How long a busy worker runs before it offers its CPU to other runnable processes.
const SHARE_CPU_EVERY: Duration = Duration::from_millis(1);

thread_local! {
    /// When this worker thread last offered its CPU.
    static SHARED_CPU_AT: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Called between two requests of a client connection and after each accepted one: a
/// worker busy for [`SHARE_CPU_EVERY`] since it last did so yields its CPU
/// (`sched_yield`).
///
/// Under load a worker never sleeps: there is always another ready connection. The
/// kernel then lets it run on until its next tick (every 4 ms with `HZ=250`) while a
/// process woken on the same CPU but not yet due (a target on a shared machine, with
/// requests queued) waits: the 1-4 ms tail measured in `docs/lb.md`. With nothing
/// else runnable the call returns at once; at most one system call per interval.
pub(crate) fn share_cpu() {
    SHARED_CPU_AT.with(|at| share_cpu_with(at, Instant::now, std::thread::yield_now));
}

/// [`share_cpu`] with its clock and its yield passed in: `at` is when the CPU was last
/// offered, `now` is read on each call and, after a yield, again (the next interval
/// starts when the CPU is back).
fn share_cpu_with(at: &Cell<Option<Instant>>, now: impl Fn() -> Instant, yield_now: impl FnOnce()) {
    let t = now();
    match at.get() {
        Some(last) if t.duration_since(last) < SHARE_CPU_EVERY => {}
        Some(_) => {
            yield_now();
            at.set(Some(now()));
        }
        None => at.set(Some(t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_worker_yields_once_per_interval_and_not_between() {
        let base = Instant::now();
        let clock = Cell::new(Duration::ZERO);
        let now = || base + clock.get();
        let (at, yields) = (Cell::new(None), Cell::new(0u32));
        let ask = || share_cpu_with(&at, now, || yields.set(yields.get() + 1));
        ask();
        assert_eq!(
            yields.get(),
            0,
            "a fresh worker has nothing to give back yet"
        );
        // Asked every 0.1 ms for 4.55 intervals: once per interval, never between.
        let step = SHARE_CPU_EVERY / 10;
        let mut per_call = Vec::new();
        for _ in 0..45 {
            clock.set(clock.get() + step);
            let before = yields.get();
            ask();
            per_call.push(yields.get() - before);
        }
        assert_eq!(yields.get(), 4, "one yield per full interval: {per_call:?}");
        let at_calls: Vec<usize> = (0..45).filter(|&i| per_call[i] == 1).collect();
        assert_eq!(
            at_calls,
            [9, 19, 29, 39],
            "each a full interval after the last"
        );
        // A yield that took a while: the next interval starts when the CPU is back.
        clock.set(clock.get() + SHARE_CPU_EVERY);
        share_cpu_with(&at, now, || clock.set(clock.get() + SHARE_CPU_EVERY * 3));
        clock.set(clock.get() + step);
        let before = yields.get();
        ask();
        assert_eq!(
            yields.get(),
            before,
            "the time spent yielding does not count as busy"
        );
    }
}
