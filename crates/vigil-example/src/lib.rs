//! An example service built with the vigil library: a read service over PostgreSQL
//! (or a local SQLite file when PostgreSQL is unreachable) that keeps serving cached
//! reads when its database goes down, and says so (`/health` warns, `/readyz` passes).
//!
//! - [`service`]: routes, checks, cache, fault injection, start and drain.
//! - [`store`]: the PostgreSQL / SQLite item store and its fault switches.
//! - [`cli`]: arguments (`vigil example-service`, `cargo run --example service`).
//! - [`worker`]: the example queue worker (`vigil example-worker`): RabbitMQ or NATS
//!   JetStream through the library's worker gate, with fault injection, and heartbeats
//!   to a controller.
//! - [`broker`]: the queue layout on either broker, for the worker and the producer.
//! - [`producer`]: a steady producer for the worker's queue (`vigil example-producer`).

pub mod broker;
pub mod cli;
pub mod producer;
pub mod service;
pub mod store;
pub mod worker;
