//! vigil lb: an HTTP load balancer that ejects failed servers fast and fails open.
//!
//! The policies (rise/fall thresholds, outlier ejection, fail-open, slow start, P2C,
//! retry budget) are vigil-core's sans-IO state machines; this crate drives them with
//! real I/O (hyper 1, tokio):
//!
//! - [`config`]: `lb.toml`, defaults, errors naming file, line and key;
//! - [`balancer`]: a pool at run time: policy state, lock-free routing snapshots,
//!   events logged with their cause;
//! - [`proxy`]: the data path: routing, forwarding headers, retries, hedging, timeouts;
//! - [`checker`]: active health checks;
//! - [`admin`] and [`metrics`]: `/admin/targets`, `/metrics`;
//! - [`upstream`]: pooled connections to targets;
//! - [`conn`]: the client connection wrapper that lets a slowloris get its 408;
//! - [`server`]: listeners, reload on SIGHUP, drain on SIGTERM;
//! - [`cli`]: `vigil lb` and `vigil lb check-config`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod balancer;
pub mod checker;
pub mod cli;
pub mod config;
pub mod conn;
pub mod metrics;
pub mod proxy;
pub mod server;
pub mod upstream;
