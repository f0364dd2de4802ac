//! gRPC health v1 (`grpc.health.v1.Health`: Check and Watch), fed by the health snapshot.
//!
//! The whole server (service name `""`) is `SERVING` while readiness passes or warns
//! (the same verdict as `/readyz`, staleness included), and `NOT_SERVING` while it fails,
//! while the service is starting and once shutdown has begun, so gRPC load balancers and
//! Kubernetes' `grpc` probe drain it like an HTTP one. Named services can be declared
//! with the checks they depend on ([`GrpcHealth::service`]): such a service is serving
//! when the whole server is and none of its checks fails.
//!
//! Check on an unknown service answers `NOT_FOUND`; Watch on one streams
//! `SERVICE_UNKNOWN` and keeps the call open, as the protocol asks.
//!
//! Why not tonic-health's `HealthReporter`: it keeps a second copy of the state that a
//! task would have to mirror from the snapshot, and its Watch refuses unknown services
//! instead of streaming `SERVICE_UNKNOWN`. Implementing tonic-health's generated
//! `Health` service over the snapshot keeps one source of truth; the wire types, server
//! and client are tonic-health's.

use crate::Health;
use crate::snapshot::Snapshot;
use futures::stream::{self, BoxStream, StreamExt};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Request, Response, Status as GrpcStatus};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health as HealthService, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use vigil_core::Status;

/// How often an open Watch re-reads the snapshot even without a new publication, so a
/// stalled checker (a snapshot that stops changing) still turns the stream NOT_SERVING.
pub const WATCH_RECHECK: Duration = Duration::from_secs(1);

/// The gRPC health service over a [`Health`]; see the module docs.
#[derive(Clone, Debug)]
pub struct GrpcHealth {
    health: Health,
    /// Named services and the checks (names or components) each depends on.
    services: Arc<BTreeMap<String, Vec<String>>>,
}

impl GrpcHealth {
    /// The service for `health`, knowing only the whole server (`""`).
    pub fn new(health: &Health) -> Self {
        GrpcHealth {
            health: health.clone(),
            services: Arc::default(),
        }
    }

    /// Declares a named service (e.g. `"shop.v1.Orders"`) that is serving when the whole
    /// server is and none of `checks` fails. A check is named exactly
    /// (`"postgres:connect"`) or by component (`"postgres"` covers every
    /// `postgres:...` entry). A listed check with no result yet counts as failing.
    pub fn service<I, S>(mut self, name: impl Into<String>, checks: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Arc::make_mut(&mut self.services)
            .insert(name.into(), checks.into_iter().map(Into::into).collect());
        self
    }

    /// The status of `service` in `snapshot`; `None` for a service nobody declared.
    pub fn status_in(&self, snapshot: &Snapshot, service: &str) -> Option<ServingStatus> {
        let ready = snapshot.ready_now();
        let server_serving = ready.status.is_serving();
        if service.is_empty() {
            return Some(serving(server_serving));
        }
        let checks = self.services.get(service)?;
        if !server_serving {
            return Some(ServingStatus::NotServing);
        }
        let full = snapshot.full_now();
        let all_fine = checks.iter().all(|wanted| {
            let mut matched = full.checks.iter().filter(|(name, _)| {
                name.as_str() == wanted
                    || name
                        .strip_prefix(wanted.as_str())
                        .is_some_and(|rest| rest.starts_with(':'))
            });
            let mut any = false;
            let ok = matched.all(|(_, results)| {
                any = true;
                results.iter().all(|r| r.status != Status::Fail)
            });
            any && ok
        });
        Some(serving(all_fine))
    }

    /// The tonic service, to add to a `tonic::transport::Server` next to the
    /// application's own services.
    pub fn into_server(self) -> HealthServer<GrpcHealth> {
        HealthServer::new(self)
    }

    /// Serves only the health service on `listener` until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tonic::transport::Server::builder()
            .add_service(self.into_server())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }
}

fn serving(yes: bool) -> ServingStatus {
    if yes {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

fn response(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

/// State of one Watch call between two messages.
struct WatchState {
    grpc: GrpcHealth,
    service: String,
    rx: watch::Receiver<Arc<Snapshot>>,
    last: Option<ServingStatus>,
    recheck: tokio::time::Interval,
    done: bool,
}

#[tonic::async_trait]
impl HealthService for GrpcHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, GrpcStatus> {
        let service = &request.get_ref().service;
        match self.status_in(&self.health.snapshot(), service) {
            Some(status) => Ok(Response::new(response(status))),
            None => Err(GrpcStatus::not_found(format!(
                "unknown service {service:?}"
            ))),
        }
    }

    type WatchStream = BoxStream<'static, Result<HealthCheckResponse, GrpcStatus>>;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, GrpcStatus> {
        let mut recheck = tokio::time::interval(WATCH_RECHECK);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let state = WatchState {
            grpc: self.clone(),
            service: request.into_inner().service,
            rx: self.health.subscribe(),
            last: None,
            recheck,
            done: false,
        };
        let stream = stream::unfold(state, |mut st| async move {
            loop {
                if st.done {
                    return None;
                }
                let snapshot = st.rx.borrow_and_update().clone();
                let now = st
                    .grpc
                    .status_in(&snapshot, &st.service)
                    .unwrap_or(ServingStatus::ServiceUnknown);
                if st.last != Some(now) {
                    st.last = Some(now);
                    return Some((Ok(response(now)), st));
                }
                tokio::select! {
                    changed = st.rx.changed() => {
                        if changed.is_err() {
                            // The health machinery is gone: the service is going away.
                            st.done = true;
                            if st.last != Some(ServingStatus::NotServing) {
                                return Some((Ok(response(ServingStatus::NotServing)), st));
                            }
                        }
                    }
                    _ = st.recheck.tick() => {}
                }
            }
        });
        Ok(Response::new(stream.boxed()))
    }
}
