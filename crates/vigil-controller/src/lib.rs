//! vigil controller: the central fleet health checker with a safety guard, a store, an API and a dashboard.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cli;
