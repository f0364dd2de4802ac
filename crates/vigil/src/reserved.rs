//! Reserved capacity: the health endpoints served by a dedicated OS thread running its
//! own single-threaded tokio runtime, on a port of their own.
//!
//! Why a thread and not a task: when every worker of the application's runtime is busy
//! (CPU-bound handlers, a blocking call in async code), a task on that runtime waits
//! for a worker like any request does, and `/livez` times out on a process that is
//! alive. This thread shares nothing with the application's runtime but the snapshot
//! (an `ArcSwap` load), so the endpoints answer as long as the OS schedules it.

use axum::Router;
use axum::serve::ListenerExt;
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long [`ReservedServer::shutdown`] waits for open health connections to finish
/// before closing them: health requests take microseconds, 1 s is ample.
pub const RESERVED_SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// The scheduler turn the reserved thread asks for: the shortest Linux allows.
const RESERVED_SLICE: Duration = Duration::from_micros(100);

/// Asks Linux's fair scheduler (6.12 and later; no privilege needed) to run the calling
/// thread, the reserved one, on [`RESERVED_SLICE`] turns. A thread with a short slice
/// that wakes up (a probe arrived) may take the CPU from a busy thread with a longer
/// one instead of waiting for that thread's turn to end, so `/livez` is answered sooner
/// when the application's threads saturate every CPU; the thread's share of the CPU
/// is unchanged. `bench/livez.sh` with `HEALTH_NICE=` (no nice value, as an
/// unprivileged service runs): reserved `/livez` p99 0.2-2.8 ms against 3.7-4.1 ms on
/// the kernel's default turn (docs/example.md). An older kernel keeps its default; a
/// seccomp filter that forbids the call is found in a forked child first
/// (`vigil_sys::set_thread_slice`), so it never kills the service.
fn ask_for_short_turns() {
    if let Err(e) = vigil_sys::set_thread_slice(RESERVED_SLICE) {
        tracing::debug!(error = %e, "reserved health thread: the kernel's default scheduler turn stays");
    }
}

/// The health endpoints' own listener thread. Stops on [`shutdown`](Self::shutdown) or
/// when dropped.
#[derive(Debug)]
pub struct ReservedServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ReservedServer {
    pub(crate) fn start(router: Router, addr: SocketAddr) -> std::io::Result<ReservedServer> {
        // Bind here, on the caller's thread, so a taken port is the caller's error.
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("vigil-health")
            .build()?;
        let (tx, rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("vigil-health".into())
            .spawn(move || {
                ask_for_short_turns();
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(error = %e, "reserved health listener failed");
                            return;
                        }
                    };
                    // Small request, small answer: never let Nagle hold a health reply.
                    let listener = listener.tap_io(|tcp| {
                        if let Err(e) = tcp.set_nodelay(true) {
                            tracing::debug!(error = %e, "TCP_NODELAY on a health connection");
                        }
                    });
                    let (drain_tx, drain_rx) = oneshot::channel::<()>();
                    let serve = axum::serve(listener, router).with_graceful_shutdown(async move {
                        let _ = rx.await;
                        let _ = drain_tx.send(());
                    });
                    let grace = async move {
                        let _ = drain_rx.await;
                        tokio::time::sleep(RESERVED_SHUTDOWN_GRACE).await;
                    };
                    tokio::select! {
                        r = std::future::IntoFuture::into_future(serve) => if let Err(e) = r {
                            tracing::error!(error = %e, "reserved health listener failed");
                        },
                        _ = grace => tracing::warn!("reserved health listener: grace over, closing open connections"),
                    }
                });
                // Dropping the runtime closes every connection still open.
            })?;
        tracing::info!(%addr, "health endpoints on a reserved thread");
        Ok(ReservedServer {
            addr,
            stop: Some(tx),
            thread: Some(thread),
        })
    }

    /// The address the listener is bound to (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening, lets open requests finish (up to [`RESERVED_SHUTDOWN_GRACE`]) and
    /// joins the thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("reserved health thread panicked");
        }
    }
}

impl Drop for ReservedServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
