//! The process's memory allocator: jemalloc (feature `jemalloc`, on by default), with
//! its background thread returning freed memory to the system.
//!
//! Why not glibc's malloc, the default: after a burst (4,000 requests in flight through
//! `vigil lb` at once) glibc keeps every page the burst used, for good (82 MiB after
//! three bursts, growing wave after wave); jemalloc's background thread gives freed
//! pages back about 10 s (its `dirty_decay_ms`) after they were freed, to 17-20 MiB,
//! whatever the process does next. Measured with `python3 bench/lb/memory.py --burst
//! --later 15` (docs/lb.md, "A burst"); throughput and p99 were level or slightly better
//! (`bench/lb/variants.py`, same run). glibc's own trimming (`malloc_trim`) would need
//! `unsafe`, which the workspace forbids; mimalloc was measured before and kept more.
//! Without the background thread jemalloc purges only while the process allocates, so
//! an idle balancer kept its burst's memory too (57-78 MiB in the same run).

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Starts jemalloc's background thread, which returns freed memory to the system on a
/// timer. Call once, after logging is set up; a failure is logged, not fatal (memory is
/// then returned only while the process allocates).
pub fn return_freed_memory() {
    #[cfg(feature = "jemalloc")]
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(
            "memory freed after a burst is kept until the next allocations (jemalloc's background thread did not start: {e})"
        );
    }
}
