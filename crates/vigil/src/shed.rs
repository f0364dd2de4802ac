//! Load shedding for the application's own port: a concurrency limit that answers 503 at
//! once to application requests over the limit (never queues them), while health
//! requests bypass the limit and are answered by vigil's router.
//!
//! Why shed instead of queue: a queued request waits behind work the service cannot keep
//! up with, and by the time it runs the client may have given up; a fast 503 lets the
//! load balancer retry elsewhere. Why health bypasses: an overloaded instance that also
//! times out its health checks gets ejected, which moves its load onto its peers and can
//! cascade through the fleet; its `/readyz` should tell the truth about the host instead.
//!
//! The permit is held until the inner service returns its response (head), not while a
//! streaming body is sent.

use crate::endpoints::is_health_path;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use tokio::sync::Semaphore;
use tower::{Layer, Service, ServiceExt};

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
#[derive(Clone, Debug)]
pub struct ShedLayer {
    health: Router,
    stats: Arc<ShedStats>,
}

impl ShedLayer {
    /// A layer in front of `health` (the health router) with `max_in_flight`
    /// application requests at once.
    pub fn new(health: Router, max_in_flight: usize) -> ShedLayer {
        ShedLayer {
            health,
            stats: Arc::new(ShedStats {
                limit: max_in_flight,
                sem: Arc::new(Semaphore::new(max_in_flight)),
                shed: AtomicU64::new(0),
            }),
        }
    }

    /// The layer's counters (shared by every service it makes).
    pub fn stats(&self) -> Arc<ShedStats> {
        self.stats.clone()
    }
}

impl<S> Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Shed<S> {
        Shed {
            inner,
            health: self.health.clone(),
            stats: self.stats.clone(),
        }
    }
}

/// The service made by [`ShedLayer`].
#[derive(Clone, Debug)]
pub struct Shed<S> {
    inner: S,
    health: Router,
    stats: Arc<ShedStats>,
}

impl<S> Service<Request<Body>> for Shed<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Always ready: the decision to shed is made per request in `call`, and the inner
        // service is driven to readiness there (`oneshot`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if is_health_path(req.uri().path()) {
            let health = self.health.clone();
            return Box::pin(health.oneshot(req));
        }
        let Ok(permit) = self.stats.sem.clone().try_acquire_owned() else {
            self.stats.shed.fetch_add(1, Ordering::Relaxed);
            return Box::pin(async { Ok(overloaded()) });
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            let response = inner.oneshot(req).await;
            drop(permit);
            response
        })
    }
}

fn overloaded() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [
            (
                header::RETRY_AFTER,
                HeaderValue::from(SHED_RETRY_AFTER_SECS),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        "overloaded: request shed\n",
    )
        .into_response()
}
