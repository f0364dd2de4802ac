//! vigil's health model and its policies.
//!
//! Everything here is sans-IO: a policy is a plain state machine that takes the current
//! time ([`time::Time`], passed in by its driver) and an observation, and returns a
//! decision. Nothing here reads a clock, owns a timer, does I/O or spawns a task. The
//! load balancer, the controller and the simulator drive these very same types, which is
//! what lets `vigil sim` say something true about production behaviour.
//!
//! - [`status`]: `Status` (pass / warn / fail) and its aggregation rules.
//! - [`report`]: `CheckResult` and `HealthReport`, as the health+json draft spells them.
//! - [`thresholds`]: rise/fall thresholds turning probe results into a health verdict.
//! - [`outlier`]: passive outlier detection (consecutive errors, ejection with backoff).
//! - [`pool`]: a target pool's routing set: fail-open below the panic threshold, slow start.
//! - [`anomaly`]: fleet-relative anomaly detection (is a member failing far more than its
//!   peers?), for queue workers and balancer targets.
//! - [`throttle`]: retries that stop when they cannot help (gRPC's retry throttling) and
//!   local shedding when targets refuse most work (the SRE book's adaptive throttling).
//! - [`backoff`]: exponential backoff with caller-supplied jitter, for every loop that
//!   tries again after a failure.
//! - [`admission`]: whether a service should start a request at all: its deadline, its
//!   time in the queue (controlled delay, adaptive LIFO), an adaptive concurrency limit.
//! - [`breaker`]: the dependency guard's circuit breaker (slow calls count as failures),
//!   so a service answers degraded instead of holding workers on a slow dependency.
//! - [`gate`]: the queue worker's gate (pull only while ready, kill switch, poison vs
//!   sickness).
//! - [`fleet`]: the controller's composition of the policies (its mode, a target's
//!   standing, the peer check, the probers' agreement), driven by `vigil controller` and
//!   `vigil sim` alike.
//! - [`guard`]: the controller's safety guard (fraction cap, action budget, flap damping,
//!   cause attribution).
//! - [`rollout`]: health-gated rollouts in waves, with report-back and latched rollback.
//! - [`lease`]: a replica's view of the leader lease: when to renew, when to stop
//!   trusting it (the controller's several replicas).
//! - [`shard`]: sharded probing among controller replicas (rendezvous assignment) and
//!   the verdict by agreement of a target's probers.
//! - [`judge`](mod@judge): the one judge of an HTTP health answer (status code + optional
//!   health+json body -> verdict), with its rule table.
//! - [`signature`]: not a policy but the HMAC signatures of heartbeats and webhooks, one
//!   implementation for the signer and the verifier.
//! - [`build`]: the version and git commit this was built from.
//! - [`http1`]: not a policy but the HTTP/1.1 wire codec the balancer and the prober share,
//!   sans-IO: request and response framing (where a head ends, how its body is delimited,
//!   the smuggling rules), chunked decoding.

pub mod admission;
pub mod anomaly;
pub mod backoff;
pub mod breaker;
pub mod build;
pub mod fleet;
pub mod gate;
pub mod guard;
pub mod http1;
pub mod invalid;
pub mod judge;
pub mod lease;
pub mod outlier;
pub mod pool;
pub mod report;
pub mod retry;
pub mod rollout;
pub mod shard;
pub mod share;
pub mod signature;
pub mod stats;
pub mod status;
pub mod thresholds;
pub mod throttle;
pub mod time;

pub use invalid::Invalid;
pub use judge::{Answers, Judgement, judge};
pub use report::{CheckResult, HEALTH_JSON, HealthReport, ParseError};
pub use status::{Criticality, Status};
pub use thresholds::{HealthState, Thresholds, ThresholdsConfig, Transition};
pub use time::Time;
