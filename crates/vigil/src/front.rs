//! The front of the application's port: one tower layer that answers health paths from
//! vigil's router and passes every other request through a [`Gate`] first (a fixed
//! limit: [`crate::ShedLayer`]; deadlines, an adaptive limit and a queue:
//! [`crate::AdmissionLayer`]).
//!
//! Why health bypasses the gate: an overloaded instance that also times out its health
//! checks gets ejected, which moves its load onto its peers and can cascade through the
//! fleet; its `/readyz` should tell the truth about the host instead.
//!
//! A gate's refusal is a fast `503` with `Retry-After` ([`overloaded`]): a load balancer
//! or client should try elsewhere or later, not hammer the overloaded instance at once.
//! The gate's ticket is held until the inner service returns its response (head), not
//! while a streaming body is sent.

use crate::endpoints::is_health_path;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use std::convert::Infallible;
use std::future::Future;
use std::task::{Context, Poll};
use tower::{Layer, Service, ServiceExt};

/// What decides whether an application request may run: implemented by the shed and the
/// admission layers' shared state.
pub trait Gate: Clone + Send + Sync + 'static {
    /// Held while the request runs; dropped after [`Gate::leave`].
    type Ticket: Send + 'static;

    /// Admits `req` (a ticket) or answers it at once (the refusal, e.g. [`overloaded`]).
    /// Whatever needs deciding before the request is polled (a non-blocking permit) is
    /// decided here, not in the future.
    fn enter(
        &self,
        req: &Request<Body>,
    ) -> impl Future<Output = Result<Self::Ticket, Response>> + Send + 'static;

    /// The application answered `response` under `ticket`. Defaults to nothing.
    fn leave(ticket: &mut Self::Ticket, response: &Response) {
        let _ = (ticket, response);
    }
}

/// A fast `503` with `Retry-After: retry_after_secs` and `Cache-Control: no-store`.
pub fn overloaded(retry_after_secs: u64, body: String) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [
            (header::RETRY_AFTER, HeaderValue::from(retry_after_secs)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response()
}

// === impl GateLayer ===

/// The layer: health paths to `health`, the rest through the gate `G`.
#[derive(Clone, Debug)]
pub struct GateLayer<G> {
    health: Router,
    gate: G,
}

impl<G> GateLayer<G> {
    /// A layer in front of `health` (the health router) with `gate`.
    pub fn with_gate(health: Router, gate: G) -> Self {
        GateLayer { health, gate }
    }

    /// The gate (shared by every service the layer makes).
    pub fn gate(&self) -> &G {
        &self.gate
    }
}

impl<S, G: Clone> Layer<S> for GateLayer<G> {
    type Service = Gated<S, G>;

    fn layer(&self, inner: S) -> Gated<S, G> {
        Gated {
            inner,
            health: self.health.clone(),
            gate: self.gate.clone(),
        }
    }
}

/// The service made by [`GateLayer`].
#[derive(Clone, Debug)]
pub struct Gated<S, G> {
    inner: S,
    health: Router,
    gate: G,
}

impl<S, G> Service<Request<Body>> for Gated<S, G>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    G: Gate,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Always ready: the gate decides per request in `call`, and the inner service is
        // driven to readiness there (`oneshot`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if is_health_path(req.uri().path()) {
            let health = self.health.clone();
            return Box::pin(health.oneshot(req));
        }
        let enter = self.gate.enter(&req);
        let inner = self.inner.clone();
        Box::pin(async move {
            let mut ticket = match enter.await {
                Ok(t) => t,
                Err(refusal) => return Ok(refusal),
            };
            let response = inner.oneshot(req).await;
            if let Ok(r) = &response {
                G::leave(&mut ticket, r);
            }
            drop(ticket);
            response
        })
    }
}
