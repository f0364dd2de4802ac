//! HAProxy agent-check responder, fed by the health snapshot.
//!
//! HAProxy's `agent-check` (`server s1 10.0.0.1:80 check agent-check agent-port 9999
//! agent-inter 2s`) connects to the agent port, reads one line and closes; the words of
//! the line set the server's state and weight. vigil answers from readiness (the same
//! verdict as `/readyz`, staleness included):
//!
//! | readiness | line | effect in HAProxy |
//! |---|---|---|
//! | pass | `up ready 100%` | up, full weight |
//! | warn | `up ready 50%` | up, weight at 50% of the configured one (see [`AgentCheck::warn_weight`]) |
//! | fail | `down #<failing checks>` | down, with the reason in the logs and stats page |
//! | starting | `down #starting` | down until start-up checks passed once |
//! | shutting down | `drain` | DRAIN state: no new connections, existing ones finish |
//!
//! `ready` in the pass/warn lines undoes an earlier `drain` (a restarted instance on the
//! same address). Each connection gets its line and is closed at once; nothing is read.

use crate::Health;
use crate::snapshot::{LIFECYCLE_CHECK, Lifecycle, Snapshot};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use vigil_core::Status;

/// Default weight while readiness warns: half. A degraded server keeps serving (it is
/// not unhealthy) but gets less of the traffic while it is degraded.
pub const DEFAULT_WARN_WEIGHT: u8 = 50;

/// Longest time spent writing the line to one connection: a client that does not read
/// 30 bytes within a second is not HAProxy doing its check.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest reason sent after `#`, so the line stays one short TCP segment.
const MAX_REASON: usize = 200;

/// The agent-check responder over a [`Health`]; see the module docs.
#[derive(Clone, Debug)]
pub struct AgentCheck {
    health: Health,
    warn_weight: u8,
}

impl AgentCheck {
    /// A responder for `health`.
    pub fn new(health: &Health) -> Self {
        AgentCheck {
            health: health.clone(),
            warn_weight: DEFAULT_WARN_WEIGHT,
        }
    }

    /// Weight in percent (1..=100) sent while readiness warns. Defaults to 50.
    pub fn warn_weight(mut self, percent: u8) -> Self {
        assert!(
            (1..=100).contains(&percent),
            "AgentCheck::warn_weight must be within 1..=100, got {percent}"
        );
        self.warn_weight = percent;
        self
    }

    /// The line (with its `\n`) answered for `snapshot`.
    pub fn line(&self, snapshot: &Snapshot) -> String {
        if snapshot.lifecycle == Lifecycle::ShuttingDown {
            return "drain\n".into();
        }
        let ready = snapshot.ready_now();
        match ready.status {
            Status::Pass => "up ready 100%\n".into(),
            Status::Warn => format!("up ready {}%\n", self.warn_weight),
            Status::Fail => {
                let reason = if snapshot.lifecycle == Lifecycle::Starting {
                    "starting".to_string()
                } else {
                    let failing: Vec<&str> = ready
                        .failing_checks()
                        .filter(|c| *c != LIFECYCLE_CHECK)
                        .collect();
                    // The report's output already names the failing checks ("disk:free
                    // fail") or says the checker stalled: said once, not twice.
                    match (&ready.output, failing.is_empty()) {
                        (Some(output), _) => output.clone(),
                        (None, false) => format!("failing {}", failing.join(",")),
                        (None, true) => "not ready".to_string(),
                    }
                };
                format!("down #{}\n", sanitize(reason.trim()))
            }
        }
    }

    /// Answers every connection on `listener` until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> io::Result<()> {
        tokio::pin!(shutdown);
        loop {
            let (mut stream, peer) = tokio::select! {
                biased;
                _ = &mut shutdown => {
                    tracing::debug!("agent-check responder: shutdown");
                    return Ok(());
                }
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and friends are transient: log, back off, keep serving.
                        tracing::warn!(error = %e, "agent-check responder: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let line = self.line(&self.health.snapshot());
            tokio::spawn(async move {
                let write = async {
                    stream.write_all(line.as_bytes()).await?;
                    stream.shutdown().await
                };
                match tokio::time::timeout(WRITE_TIMEOUT, write).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "agent-check write failed"),
                    Err(_) => tracing::debug!(%peer, "agent-check write timed out"),
                }
            });
        }
    }

    /// Serves on `addr` from a dedicated OS thread with its own single-threaded runtime
    /// (like [`Health::serve_reserved`]), so HAProxy gets its answer even when the
    /// application's runtime is saturated. Stops when the returned server is dropped.
    pub fn serve_reserved(self, addr: SocketAddr) -> io::Result<AgentServer> {
        let std_listener = std::net::TcpListener::bind(addr)?;
        std_listener.set_nonblocking(true)?;
        let local_addr = std_listener.local_addr()?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("vigil-agent-check".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(std_listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(error = %e, "agent-check responder cannot start");
                            return;
                        }
                    };
                    let stop = async {
                        let _ = stop_rx.await;
                    };
                    if let Err(e) = self.serve(listener, stop).await {
                        tracing::error!(error = %e, "agent-check responder stopped");
                    }
                });
            })?;
        Ok(AgentServer {
            local_addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }
}

/// Keeps the reason to one line of plain words HAProxy can show.
fn sanitize(reason: &str) -> String {
    reason
        .chars()
        .map(|c| if c.is_control() || c == '#' { ' ' } else { c })
        .take(MAX_REASON)
        .collect()
}

/// An agent-check responder running on its own thread; stops on drop.
#[derive(Debug)]
pub struct AgentServer {
    local_addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AgentServer {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops listening and waits for the thread to end.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            // The thread may already be gone; then there is nothing to stop.
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("agent-check responder thread panicked");
        }
    }
}

impl Drop for AgentServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::time::{Instant, SystemTime};
    use vigil_core::{CheckResult, Criticality, HealthReport};

    fn snapshot(lifecycle: Lifecycle, ready: HealthReport) -> Snapshot {
        Snapshot {
            full: ready.clone(),
            ready,
            lifecycle,
            criticality: BTreeMap::new(),
            published_at: SystemTime::now(),
            published_mono: Instant::now(),
            sequence: 1,
            restarts: 0,
            stale_after: Duration::from_secs(3600),
        }
    }

    fn agent() -> AgentCheck {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let health = rt.block_on(async { Health::builder().start() });
        AgentCheck::new(&health)
    }

    #[test]
    fn lines_for_each_state() {
        let agent = agent();
        let failing = HealthReport::from_results([(
            "fd:open",
            CheckResult::fail("out of\ndescriptors #1"),
            Criticality::Critical,
        )]);
        assert_eq!(
            agent.line(&snapshot(Lifecycle::Starting, failing.clone())),
            "down #starting\n"
        );
        assert_eq!(
            agent.line(&snapshot(Lifecycle::Running, failing.clone())),
            "down #failing fd:open\n"
        );
        assert_eq!(
            agent.line(&snapshot(Lifecycle::ShuttingDown, failing)),
            "drain\n"
        );
        let warn = HealthReport::from_results([(
            "db",
            CheckResult::fail("down"),
            Criticality::NonCritical,
        )]);
        assert_eq!(
            agent.line(&snapshot(Lifecycle::Running, warn)),
            "up ready 50%\n"
        );
    }

    #[test]
    fn reasons_stay_on_one_line() {
        assert_eq!(sanitize("a\nb#c"), "a b c");
        assert_eq!(sanitize(&"x".repeat(1000)).len(), MAX_REASON);
    }
}
