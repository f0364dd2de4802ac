//! Load shedding for the application's own port: a concurrency limit that answers 503 at
//! once to application requests over the limit (never queues them), while health
//! requests bypass the limit and are answered by vigil's router.
//!
//! Why shed instead of queue: a queued request waits behind work the service cannot keep
//! up with, and by the time it runs the client may have given up; a fast 503 lets the
//! load balancer retry elsewhere. Why health bypasses, and how long a permit is held:
//! [`crate::front`], the layer this one shares with [`crate::AdmissionLayer`].

use crate::front::{Gate, GateLayer, Gated, overloaded};
use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::response::Response;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// `Retry-After` sent with a shed request, in seconds: a load balancer or client should
/// try elsewhere or later, not hammer the overloaded instance at once.
pub const SHED_RETRY_AFTER_SECS: u64 = 1;

/// In-flight and shed counters of a [`ShedLayer`] (for metrics and a saturation check).
#[derive(Debug)]
pub struct ShedStats {
    limit: usize,
    sem: Arc<Semaphore>,
    shed: AtomicU64,
}

impl ShedStats {
    /// Application requests running now.
    pub fn in_flight(&self) -> usize {
        self.limit - self.sem.available_permits()
    }

    /// The concurrency limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// In-flight requests as a fraction of the limit, 0..=1.
    pub fn saturation(&self) -> f64 {
        if self.limit == 0 {
            1.0
        } else {
            self.in_flight() as f64 / self.limit as f64
        }
    }

    /// Requests shed (answered 503) so far.
    pub fn shed_total(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }
}

/// A tower layer limiting in-flight application requests, shedding the excess, and
/// answering health paths from vigil's router outside the limit. Build it with
/// [`crate::Health::shed_layer`]; apply it with `Router::layer`.
pub type ShedLayer = GateLayer<Arc<ShedStats>>;

/// The service made by [`ShedLayer`].
pub type Shed<S> = Gated<S, Arc<ShedStats>>;

impl ShedLayer {
    /// A layer in front of `health` (the health router) with `max_in_flight`
    /// application requests at once.
    pub fn new(health: Router, max_in_flight: usize) -> ShedLayer {
        GateLayer::with_gate(
            health,
            Arc::new(ShedStats {
                limit: max_in_flight,
                sem: Arc::new(Semaphore::new(max_in_flight)),
                shed: AtomicU64::new(0),
            }),
        )
    }

    /// The layer's counters (shared by every service it makes).
    pub fn stats(&self) -> Arc<ShedStats> {
        self.gate().clone()
    }
}

impl Gate for Arc<ShedStats> {
    type Ticket = OwnedSemaphorePermit;

    fn enter(
        &self,
        _req: &Request<Body>,
    ) -> impl Future<Output = Result<OwnedSemaphorePermit, Response>> + Send + 'static {
        // Decided now, before the future is polled: over the limit is shed at once.
        let permit = self.sem.clone().try_acquire_owned().map_err(|_| {
            self.shed.fetch_add(1, Ordering::Relaxed);
            overloaded(SHED_RETRY_AFTER_SECS, "overloaded: request shed\n".into())
        });
        std::future::ready(permit)
    }
}
