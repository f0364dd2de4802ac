//! vigil lb: an HTTP load balancer that ejects failed servers fast and fails open.
//!
//! The policies (rise/fall thresholds, outlier ejection, fail-open, slow start, P2C,
//! retry budget) are vigil-core's sans-IO state machines; this crate drives them with
//! real I/O (tokio; hyper for the admin listener and the health checks):
//!
//! - [`config`]: `lb.toml`, defaults, errors naming file, line and key;
//! - [`balancer`]: a pool at run time: policy state, lock-free routing snapshots,
//!   events logged with their cause;
//! - [`front`]: the client side, a lean HTTP/1.1 server (parse once, forward raw
//!   field lines);
//! - [`front_h2`]: HTTP/2 from clients (TLS ALPN `h2`, cleartext prior knowledge);
//! - [`proxy`]: the data path: retries, hedging, timeouts, outlier reporting;
//! - [`checker`]: active health checks;
//! - [`admin`] and [`metrics`]: `/admin/targets`, `/metrics`;
//! - [`upstream`]: pooled connections to targets; [`upstream_h2`]: HTTP/2 to gRPC targets;
//! - [`tunnel`]: WebSocket and other upgrades, joined byte for byte after the `101`;
//! - [`server`]: listeners, reload on SIGHUP, drain on SIGTERM;
//! - [`spare`]: client connection buffers kept per worker thread while idle;
//! - [`park`]: idle keep-alive client connections, parked off the runtime;
//! - [`tls`]: TLS termination, certificates by SNI, reloaded on SIGHUP;
//! - [`cli`]: `vigil lb` and `vigil lb check-config`.

pub mod admin;
pub mod balancer;
pub mod checker;
pub mod cli;
pub mod config;
pub mod front;
pub mod front_h2;
pub mod metrics;
pub mod park;
pub mod proxy;
pub mod server;
pub mod spare;
pub mod tls;
pub mod tunnel;
pub mod upstream;
pub mod upstream_h2;
