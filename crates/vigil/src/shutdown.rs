//! Shutdown signals: SIGTERM (what Kubernetes, systemd and `docker stop` send) or Ctrl-C.
//!
//! The order that keeps clients from seeing errors: fail readiness first
//! ([`crate::Health::begin_shutdown`]), keep serving for the drain delay while load
//! balancers notice and stop sending, then stop listening and finish in-flight requests.
//! [`crate::Health::shutdown_on_signal`] does the first two steps and returns when it is
//! time for the third.

/// Resolves on the first SIGTERM or Ctrl-C (SIGINT).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C; relying on SIGTERM");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM; relying on Ctrl-C");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("Ctrl-C: shutting down"),
        _ = term => tracing::info!("SIGTERM: shutting down"),
    }
}
