//! What every vigil process shares beside its own work, and nothing more: `vigil lb`
//! and `vigil controller` need these two, not the service library (axum, tower, the
//! health machinery) they once took them from.
//!
//! - [`exposition`]: a `/metrics` body in the format the scraper asks for (OpenMetrics
//!   or Prometheus' 0.0.4 text), with `vigil_build_info`;
//! - `systemd` (feature `systemd`): `Type=notify` readiness, reload, stop and watchdog.
//!
//! The service library (`vigil`) re-exports both, so a service built on it serves the
//! same exposition and notifies systemd the same way.

pub mod exposition;
#[cfg(feature = "systemd")]
pub mod systemd;
