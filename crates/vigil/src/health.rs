//! The registry and the handle: [`HealthBuilder`] registers local and dependency checks,
//! [`Health`] is the cheap, cloneable handle a service keeps (snapshots, endpoints,
//! lifecycle).
//!
//! ## Design
//! - One piece of shared state (`Shared`, in `crate::shared`, below the checker, the
//!   watchdog and the endpoints) holds the registry, the latest result of every check,
//!   the lifecycle and the watchdog's view. It sits behind a `std::sync::Mutex`
//!   taken only by writers (the checker, the watchdog, `begin_shutdown`), briefly and
//!   never across an `.await`.
//! - Every write republishes a whole immutable [`Snapshot`] into an `ArcSwap` (and a
//!   `watch` channel for subscribers). Readers (endpoints, gRPC, agent-check) load it
//!   without a lock and never call a check.
//! - Writers publish under the mutex, so snapshots appear in the order of their sequence
//!   numbers and no write is lost to a race between two publishers.

use crate::check::{Check, DynCheck};
use crate::options::{CheckOptions, HealthConfig};
pub use crate::shared::{CheckKind, CheckerFault};
use crate::shared::{Registered, Shared, State};
use crate::snapshot::{LIFECYCLE_CHECK, Lifecycle, Snapshot, WATCHDOG_CHECK};
use arc_swap::ArcSwap;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use vigil_core::HealthReport;

/// Why a [`HealthBuilder`] could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// Two checks share a name.
    #[error("check {0:?} is registered twice")]
    DuplicateName(String),
    /// A check name is empty or reserved.
    #[error("check name {0:?} is empty or reserved by vigil")]
    BadName(String),
    /// A check's options are invalid.
    #[error("check {name:?}: {reason}")]
    BadOptions {
        /// The check.
        name: String,
        /// What is wrong, naming the key.
        reason: String,
    },
    /// The health config is invalid.
    #[error("health config: {0}")]
    BadConfig(String),
    /// `start` was called outside a tokio runtime.
    #[error("HealthBuilder::start must be called inside a tokio runtime")]
    NoRuntime,
}

// === impl HealthBuilder ===

/// Registers checks, then [`start`](HealthBuilder::start)s the background checker and
/// its watchdog.
#[must_use = "a HealthBuilder does nothing until start() is called"]
pub struct HealthBuilder {
    checks: Vec<Registered>,
    config: HealthConfig,
    version: Option<String>,
    release_id: Option<String>,
    description: Option<String>,
}

impl HealthBuilder {
    fn add<C: Check>(mut self, kind: CheckKind, name: &str, check: C, opts: CheckOptions) -> Self {
        self.checks.push(Registered {
            name: name.to_string(),
            kind,
            opts,
            check: Arc::new(check),
        });
        self
    }

    /// Registers a local check: the host itself can do work. Counts for `/readyz` and
    /// `/health`.
    pub fn local<C: Check>(self, name: &str, check: C, opts: CheckOptions) -> Self {
        self.add(CheckKind::Local, name, check, opts)
    }

    /// Registers a dependency check (database, downstream service). Counts for `/health`
    /// only.
    pub fn dependency<C: Check>(self, name: &str, check: C, opts: CheckOptions) -> Self {
        self.add(CheckKind::Dependency, name, check, opts)
    }

    /// Registers an already type-erased check.
    pub fn with_dyn(
        mut self,
        kind: CheckKind,
        name: &str,
        check: Arc<dyn DynCheck>,
        opts: CheckOptions,
    ) -> Self {
        self.checks.push(Registered {
            name: name.to_string(),
            kind,
            opts,
            check,
        });
        self
    }

    /// Sets the checker, watchdog and drain settings.
    pub fn config(mut self, config: HealthConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets the service version reported in health+json.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// Sets the release (deployed revision) reported in health+json as `releaseId`: the
    /// service's configuration should pass the revision it was deployed as (a build id,
    /// a git commit, a package version), so that `vigil deploy` sees a host report back
    /// with the revision it just installed.
    pub fn release_id(mut self, release: impl Into<String>) -> Self {
        self.release_id = Some(release.into());
        self
    }

    /// Sets the service description reported in health+json.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Validates the registry and starts the background checker and watchdog on the
    /// current tokio runtime.
    pub fn try_start(self) -> Result<Health, BuildError> {
        self.config.validate().map_err(BuildError::BadConfig)?;
        let mut seen = std::collections::BTreeSet::new();
        for c in &self.checks {
            if c.name.is_empty() || c.name == WATCHDOG_CHECK || c.name == LIFECYCLE_CHECK {
                return Err(BuildError::BadName(c.name.clone()));
            }
            if !seen.insert(c.name.as_str()) {
                return Err(BuildError::DuplicateName(c.name.clone()));
            }
            c.opts.validate().map_err(|reason| BuildError::BadOptions {
                name: c.name.clone(),
                reason,
            })?;
        }
        let rt = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        let n = self.checks.len();
        let st = State {
            results: vec![None; n],
            passed_once: vec![false; n],
            lifecycle: Lifecycle::Starting,
            stalled: None,
            restarts: 0,
            last_restart_reason: None,
            last_beat: Instant::now(),
            sequence: 0,
        };
        let placeholder = Arc::new(Snapshot {
            ready: HealthReport::default(),
            full: HealthReport::default(),
            lifecycle: Lifecycle::Starting,
            criticality: BTreeMap::new(),
            published_at: SystemTime::now(),
            published_mono: std::time::Instant::now(),
            sequence: 0,
            restarts: 0,
            stale_after: self.config.stale_after,
        });
        let (tx, _) = watch::channel(placeholder.clone());
        let (stop, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            checks: self.checks,
            config: self.config,
            version: self.version,
            release_id: self.release_id,
            description: self.description,
            current: ArcSwap::new(placeholder),
            tx,
            state: Mutex::new(st),
            stop,
            fault: Mutex::new(None),
            fault_notify: Notify::new(),
            checker_abort: Mutex::new(None),
        });
        // Publish a complete "starting" snapshot before anything can read it.
        {
            let mut st = shared.lock();
            shared.publish(&mut st);
        }
        rt.spawn(crate::watchdog::run(shared.clone()));
        Ok(Health {
            inner: Arc::new(Handle { shared }),
        })
    }

    /// Like [`try_start`](HealthBuilder::try_start), panicking on a bad registry (a
    /// programming error: duplicate or reserved name, invalid options, no runtime).
    pub fn start(self) -> Health {
        match self.try_start() {
            Ok(h) => h,
            Err(e) => panic!("vigil: cannot start health checks: {e}"),
        }
    }
}

// === impl Health ===

struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // The last handle is gone: stop the checker and the watchdog.
        self.shared.stop.send_replace(true);
    }
}

/// The service's health: a cheap handle (an `Arc` inside) to the published snapshots,
/// the endpoints and the lifecycle. Dropping the last clone stops the background tasks.
#[derive(Clone)]
pub struct Health {
    inner: Arc<Handle>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.snapshot();
        f.debug_struct("Health")
            .field("checks", &self.inner.shared.checks.len())
            .field("lifecycle", &s.lifecycle)
            .field("ready", &s.ready.status)
            .field("full", &s.full.status)
            .finish()
    }
}

impl Health {
    /// Starts registering checks.
    pub fn builder() -> HealthBuilder {
        HealthBuilder {
            checks: Vec::new(),
            config: HealthConfig::default(),
            version: None,
            release_id: None,
            description: None,
        }
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.inner.shared.clone()
    }

    /// The latest snapshot, lock-free.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.shared.current.load_full()
    }

    /// A receiver notified on every published snapshot (for streaming protocols such as
    /// gRPC `Watch`).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.inner.shared.tx.subscribe()
    }

    /// The health endpoints (`/livez`, `/readyz`, `/healthz`, `/health`) as an axum
    /// router, to merge into the application's own router.
    pub fn router(&self) -> axum::Router {
        crate::endpoints::router(self.inner.shared.clone())
    }

    /// Serves the health endpoints on `addr` from a dedicated OS thread with its own
    /// single-threaded runtime, so they answer even when the application's runtime is
    /// saturated.
    pub fn serve_reserved(&self, addr: SocketAddr) -> std::io::Result<crate::ReservedServer> {
        crate::reserved::ReservedServer::start(self.router(), addr)
    }

    /// A tower layer for the application's port: at most `max_in_flight` application
    /// requests run at once, the rest are shed with 503 at once (never queued), and
    /// health requests bypass the limit. See [`crate::ShedLayer`].
    pub fn shed_layer(&self, max_in_flight: usize) -> crate::ShedLayer {
        crate::ShedLayer::new(self.router(), max_in_flight)
    }

    /// The admission layer for the application's port, sharing `admission` (make it
    /// with [`crate::Admission::new`] and register [`crate::Admission::check`] as a local
    /// check first): deadlines, an adaptive concurrency limit and a controlled-delay
    /// queue; health requests bypass it. See [`crate::admission`].
    pub fn admission_layer(&self, admission: Arc<crate::Admission>) -> crate::AdmissionLayer {
        crate::AdmissionLayer::new(self.router(), admission)
    }

    /// The current lifecycle.
    pub fn lifecycle(&self) -> Lifecycle {
        self.inner.shared.lock().lifecycle
    }

    /// How many times the watchdog restarted the background checker.
    pub fn restarts(&self) -> u64 {
        self.inner.shared.lock().restarts
    }

    /// Turns readiness to fail ("shutting down") at once, so load balancers drain the
    /// service before it stops listening. Idempotent.
    pub fn begin_shutdown(&self) {
        let sh = &self.inner.shared;
        let mut st = sh.lock();
        if st.lifecycle != Lifecycle::ShuttingDown {
            st.lifecycle = Lifecycle::ShuttingDown;
            tracing::info!("shutting down: readiness now fails");
            sh.publish(&mut st);
        }
    }

    /// The configured drain delay.
    pub fn drain_delay(&self) -> Duration {
        self.inner.shared.config.drain_delay
    }

    /// Begins shutdown, then waits the drain delay while the service keeps serving.
    /// When this returns, stop listening.
    pub async fn drain(&self) {
        self.begin_shutdown();
        tokio::time::sleep(self.drain_delay()).await;
        tracing::info!("drain delay over: stopping");
    }

    /// Waits for SIGTERM or Ctrl-C, then [`drain`](Health::drain)s. Made for axum's
    /// `with_graceful_shutdown`:
    /// `axum::serve(l, app).with_graceful_shutdown(health.clone().shutdown_on_signal())`.
    pub async fn shutdown_on_signal(self) {
        crate::shutdown::shutdown_signal().await;
        self.drain().await;
    }

    /// Injects a fault into the background checker (tests, chaos drills).
    pub fn inject_fault(&self, fault: CheckerFault) {
        let sh = &self.inner.shared;
        tracing::warn!(?fault, "injecting a fault into the health checker");
        match fault {
            CheckerFault::Abort => {
                if let Some(h) = sh
                    .checker_abort
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                {
                    h.abort();
                }
            }
            CheckerFault::Panic | CheckerFault::Hang | CheckerFault::Pause(_) => {
                *sh.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(fault);
                sh.fault_notify.notify_one();
            }
        }
    }
}
