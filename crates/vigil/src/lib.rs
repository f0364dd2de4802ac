//! Health checks for Rust services: `/livez`, `/readyz` and `/health` done right.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "agent-check")]
pub mod agent;
pub mod check;
pub mod checks;
#[cfg(feature = "grpc")]
pub mod grpc;

pub use check::{Check, DynCheck, FnCheck, Observation};
pub use vigil_core::{CheckResult, Criticality, HealthReport, Status};
