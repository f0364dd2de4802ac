//! gRPC health v1 over loopback with tonic-health's real client: Check and Watch follow
//! the snapshot, unknown services, per-service checks, NOT_SERVING on shutdown.
#![cfg(feature = "grpc")]

use std::time::Duration;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use vigil::grpc::GrpcHealth;
use vigil::{Health, Status};

mod support;
use support::{Knob, fast};

struct Fixture {
    health: Health,
    local: Knob,
    db: Knob,
    client: HealthClient<Channel>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start() -> Fixture {
    let local = Knob::default();
    let db = Knob::default();
    let health = Health::builder()
        .local("disk:free", local.check(), fast())
        .dependency("db:ping", db.check(), fast())
        .start();
    let grpc = GrpcHealth::new(&health).service("shop.v1.Orders", ["db"]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(grpc.serve(listener, async {
        let _ = stopped.await;
    }));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Fixture {
        health,
        local,
        db,
        client: HealthClient::new(channel),
        _stop: stop,
    }
}

fn req(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.into(),
    }
}

async fn check(client: &mut HealthClient<Channel>, service: &str) -> ServingStatus {
    let r = client.check(req(service)).await.unwrap().into_inner();
    ServingStatus::try_from(r.status).unwrap()
}

/// Polls Check until it answers `want`, for at most 10 s.
async fn wait_check(client: &mut HealthClient<Channel>, service: &str, want: ServingStatus) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut last = None;
    while tokio::time::Instant::now() < deadline {
        let now = check(client, service).await;
        if now == want {
            return;
        }
        last = Some(now);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("Check({service:?}) never answered {want:?}; last {last:?}");
}

/// The next Watch message, within 10 s.
async fn next(
    stream: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
) -> ServingStatus {
    let msg = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a Watch message within 10 s")
        .unwrap()
        .expect("the Watch stream stays open");
    ServingStatus::try_from(msg.status).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_follows_readiness_and_per_service_checks() {
    let mut f = start().await;
    wait_check(&mut f.client, "", ServingStatus::Serving).await;
    wait_check(&mut f.client, "shop.v1.Orders", ServingStatus::Serving).await;

    // A failing dependency takes down the service that needs it, not the server.
    f.db.set(Status::Fail);
    wait_check(&mut f.client, "shop.v1.Orders", ServingStatus::NotServing).await;
    assert_eq!(check(&mut f.client, "").await, ServingStatus::Serving);
    f.db.set(Status::Warn);
    wait_check(&mut f.client, "shop.v1.Orders", ServingStatus::Serving).await;

    // A failing local check takes down the whole server and every service.
    f.local.set(Status::Fail);
    wait_check(&mut f.client, "", ServingStatus::NotServing).await;
    assert_eq!(
        check(&mut f.client, "shop.v1.Orders").await,
        ServingStatus::NotServing
    );
    // Warn is still serving.
    f.local.set(Status::Warn);
    wait_check(&mut f.client, "", ServingStatus::Serving).await;

    let unknown = f.client.check(req("no.such.Service")).await.unwrap_err();
    assert_eq!(
        unknown.code(),
        Code::NotFound,
        "Check on an unknown service is NOT_FOUND"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_changes_and_not_serving_on_shutdown() {
    let mut f = start().await;
    wait_check(&mut f.client, "", ServingStatus::Serving).await;
    let mut watch = f.client.watch(req("")).await.unwrap().into_inner();
    assert_eq!(
        next(&mut watch).await,
        ServingStatus::Serving,
        "Watch starts with the current status"
    );

    f.local.set(Status::Fail);
    assert_eq!(next(&mut watch).await, ServingStatus::NotServing);
    f.local.set(Status::Pass);
    assert_eq!(next(&mut watch).await, ServingStatus::Serving);

    f.health.begin_shutdown();
    assert_eq!(
        next(&mut watch).await,
        ServingStatus::NotServing,
        "shutdown must turn gRPC health NOT_SERVING"
    );
    assert_eq!(check(&mut f.client, "").await, ServingStatus::NotServing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_on_an_unknown_service_streams_service_unknown_and_stays_open() {
    let mut f = start().await;
    let mut watch = f
        .client
        .watch(req("no.such.Service"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next(&mut watch).await, ServingStatus::ServiceUnknown);
    // The call stays open: no further message, no end of stream, while nothing changes.
    f.local.set(Status::Fail);
    let more = tokio::time::timeout(Duration::from_millis(500), watch.message()).await;
    assert!(
        more.is_err(),
        "the stream must stay open and quiet, got {more:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_turns_not_serving_when_the_checker_stalls() {
    let mut f = start().await;
    wait_check(&mut f.client, "", ServingStatus::Serving).await;
    let mut watch = f.client.watch(req("")).await.unwrap().into_inner();
    assert_eq!(next(&mut watch).await, ServingStatus::Serving);
    // A hung checker publishes nothing more: the stream must notice the staleness itself.
    f.health.inject_fault(vigil::CheckerFault::Hang);
    assert_eq!(
        next(&mut watch).await,
        ServingStatus::NotServing,
        "a stalled health checker must turn Watch NOT_SERVING"
    );
}
