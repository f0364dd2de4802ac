//! vigil controller: the central fleet health checker with a safety guard, a store, an
//! API and a dashboard.
//!
//! - [`config`]: `fleet.toml`, validated, every default named.
//! - [`engine`]: the task owning the guard (`vigil_core::guard::SafetyGuard`); every
//!   guard call is an op committed to the store before anything acts.
//! - [`scheduler`] and [`prober`]: deep-health probing with jitter, timeouts, bounded
//!   concurrency and pooled connections; heartbeat targets.
//! - [`probing`]: sharded probing among several replicas (who probes what, results
//!   through the store, the leader's verdict by agreement).
//! - [`discovery`]: the watched target file.
//! - [`heartbeat`]: heartbeat signatures (a key per target, HMAC over time and body).
//! - [`history`]: each target's recent probes, packed, for the API.
//! - [`leader`]: the leader lease of several replicas on PostgreSQL, and who leads.
//! - [`store`]: the `Store` trait and its SQLite and PostgreSQL implementations (snapshot + op log,
//!   decision log, action intents).
//! - [`actuator`]: log, webhook (HMAC-signed, retried, idempotent), exec, and
//!   [`aws`]'s Auto Scaling actuator.
//! - [`aws`]: AWS Auto Scaling: the actuator, discovery from groups, a Query API
//!   client (SigV4), credentials.
//! - [`view`]: the fleet as the engine publishes it for readers (API, dashboard).
//! - [`api`], [`dashboard`], [`metrics`]: HTTP API, server-rendered dashboard, Prometheus.
//! - [`cli`]: `vigil controller [check-config] -c fleet.toml`.
//! - [`deploy`]: `vigil deploy`, the driver of the rollout policy (waves, report-back,
//!   rollback) against real hosts, its state in the same store.

pub mod actuator;
pub mod api;
pub mod aws;
pub mod balancers;
pub mod cli;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod deploy;
pub mod discovery;
pub mod engine;
pub mod heartbeat;
pub mod history;
pub mod leader;
pub mod metrics;
pub mod prober;
pub mod probing;
pub mod scheduler;
pub use vigil_store as store;
pub mod view;
