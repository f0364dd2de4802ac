//! The shipped binary's example service speaks gRPC health v1 when asked
//! (`vigil example-service --grpc-listen ADDR`): a standard client (tonic-health's) gets
//! SERVING for the whole server once it is ready, NOT_FOUND for a service it does not
//! know, and NOT_SERVING as soon as SIGTERM starts the drain.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn status(client: &mut HealthClient<Channel>, service: &str) -> Result<i32, tonic::Code> {
    client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map(|r| r.into_inner().status)
        .map_err(|s| s.code())
}

#[tokio::test]
async fn example_service_answers_grpc_health_checks_and_drains_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["example-service", "--listen", "127.0.0.1:0"])
        .args([
            "--health-listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
        ])
        .args(["--check-interval", "100ms", "--drain-delay", "3s"])
        // About the protocol, not this machine's disk (which may be nearly full).
        .args(["--disk-fail-below", "0%", "--disk-warn-below", "off"])
        .args(["--db", "postgres://nobody@127.0.0.1:1/none"])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start vigil example-service");
    let line = vigil_testkit::Listening::read(&mut child);
    let service = Service(child);
    let addr = line.get("grpc");
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the gRPC health server");
    let mut client = HealthClient::new(channel);

    let deadline = Instant::now() + Duration::from_secs(20);
    while status(&mut client, "").await != Ok(ServingStatus::Serving as i32) {
        assert!(Instant::now() < deadline, "never SERVING once ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        status(&mut client, "no.such.Service").await,
        Err(tonic::Code::NotFound),
        "an unknown service is NOT_FOUND"
    );

    rustix::process::kill_process(
        rustix::process::Pid::from_raw(service.0.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while status(&mut client, "").await != Ok(ServingStatus::NotServing as i32) {
        assert!(
            Instant::now() < deadline,
            "NOT_SERVING within the drain delay after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
