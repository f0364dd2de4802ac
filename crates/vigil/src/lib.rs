//! Health checks for Rust services: `/livez`, `/readyz` and `/health` done right.
//!
//! ```no_run
//! use std::time::Duration;
//! use vigil::{CheckOptions, FnCheck, Health, CheckResult, Status};
//!
//! # async fn db_ping() -> bool { true }
//! #[tokio::main]
//! async fn main() -> std::io::Result<()> {
//!     let health = Health::builder()
//!         .dependency(
//!             "postgres:connect",
//!             FnCheck::new(|| async {
//!                 if db_ping().await { vigil::check::pass() } else { CheckResult::fail("no connection") }
//!             }),
//!             CheckOptions::every(Duration::from_secs(5)).timeout(Duration::from_secs(1)),
//!         )
//!         .start();
//!     // Health endpoints on their own thread and port: they answer under overload.
//!     let _reserved = health.serve_reserved("127.0.0.1:8081".parse().unwrap())?;
//!     // The application, with a concurrency limit that sheds instead of queueing.
//!     let app = axum::Router::new()
//!         .route("/", axum::routing::get(|| async { "hello" }))
//!         .layer(health.shed_layer(256));
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//!     axum::serve(listener, app)
//!         .with_graceful_shutdown(health.clone().shutdown_on_signal())
//!         .await
//! }
//! ```
//!
//! Modules:
//! - [`check`]: the [`Check`] trait and [`FnCheck`].
//! - [`health`]: the registry ([`HealthBuilder`]) and the handle ([`Health`]).
//! - `background` / `watchdog`: the background checker and the task that restarts it;
//!   `shared`: the checker state both share with the handle and the endpoints.
//! - [`snapshot`]: the immutable [`Snapshot`] endpoints read.
//! - [`endpoints`]: `/livez`, `/readyz`, `/healthz`, `/health`.
//! - [`reserved`]: the endpoints on a dedicated thread and port ([`ReservedServer`]).
//! - [`admission`]: the admission layer ([`AdmissionLayer`]): deadlines, an adaptive
//!   concurrency limit and a controlled-delay queue with adaptive LIFO.
//! - [`guard`]: the dependency guard ([`DependencyGuard`]): a breaker around a
//!   dependency's calls, degraded answers while it is open.
//! - [`front`]: the layer both share: health paths bypass, the rest pass a [`front::Gate`].
//! - [`shed`]: the fixed concurrency-limit layer for the application's port ([`ShedLayer`]).
//! - [`metrics`]: Prometheus metrics read from the snapshot ([`metrics::HealthCollector`]).
//! - [`heartbeat`]: signed heartbeats to `vigil controller`, for processes no prober reaches.
//! - [`worker`]: queue-worker health: the gate that stops a sick worker pulling, with
//!   RabbitMQ (feature `rabbitmq`) and NATS JetStream (feature `nats`) adapters.
//! - [`builtin`]: built-in checks (also reachable as `vigil::checks`, their first name).
//! - [`options`]: [`CheckOptions`], [`HealthConfig`].
//! - `systemd` (feature `systemd`): `Type=notify` readiness, reload, stop and watchdog.

pub mod admission;
#[cfg(feature = "agent-check")]
pub mod agent;
mod background;
pub mod builtin;
pub mod check;
pub mod endpoints;
pub mod front;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod guard;
pub mod health;
pub mod heartbeat;
pub mod metrics;
pub mod options;
pub mod reserved;
mod shared;
pub mod shed;
pub mod shutdown;
pub mod snapshot;
#[cfg(feature = "systemd")]
pub use vigil_daemon::systemd;
mod watchdog;
pub mod worker;

/// The built-in checks under their first name: the same module as [`builtin`].
pub use admission::{Admission, AdmissionConfig, AdmissionLayer};
pub use builtin as checks;
#[allow(deprecated)]
pub use check::Observation;
pub use check::{Check, DynCheck, FnCheck};
pub use guard::{DependencyGuard, Guarded};
pub use health::{BuildError, CheckKind, CheckerFault, Health, HealthBuilder};
pub use options::{CheckOptions, HealthConfig};
pub use reserved::ReservedServer;
pub use shed::{ShedLayer, ShedStats};
pub use shutdown::shutdown_signal;
pub use snapshot::{Lifecycle, Snapshot};
pub use vigil_core::{CheckResult, Criticality, HealthReport, Status};

/// docs/library.md, whose Rust examples are compiled as doc-tests (`cargo test -p vigil
/// --doc`), so the user guide cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
pub struct LibraryGuide;
