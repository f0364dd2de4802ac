//! `TcpConnect` and `HttpGet` against real servers on loopback.

use axum::http::StatusCode;
use axum::routing::get;
use std::net::SocketAddr;
use std::time::Duration;
use vigil::Check;
use vigil::Status;
use vigil::checks::{HttpGet, TcpConnect};
use vigil_core::{CheckResult, Criticality, HEALTH_JSON, HealthReport};

fn output(o: &CheckResult) -> &str {
    o.output.as_deref().unwrap_or("")
}

/// A port on loopback that refuses connections (bound, then closed).
fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[tokio::test]
async fn tcp_connect_passes_on_a_listener_and_fails_on_a_refused_port() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ok = TcpConnect::new(addr.to_string()).check().await;
    assert_eq!(ok.status, Status::Pass, "{}", output(&ok));
    assert_eq!(ok.observed_unit.as_deref(), Some("ms"));

    let refused = TcpConnect::new(closed_port().to_string()).check().await;
    assert_eq!(refused.status, Status::Fail);
    assert!(output(&refused).contains("refused"), "{}", output(&refused));
}

#[tokio::test]
async fn tcp_connect_is_cut_at_its_own_timeout_when_the_peer_never_accepts() {
    // A listener with a backlog of 0 whose queue is full: Linux drops further SYNs, so a
    // connect hangs like one to a host that stopped answering.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    let mut hung = false;
    for _ in 0..8 {
        match tokio::time::timeout(
            Duration::from_millis(300),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(s)) => fillers.push(s),
            Ok(Err(e)) => panic!("connect to a full backlog must hang, not {e}"),
            Err(_) => {
                hung = true;
                break;
            }
        }
    }
    assert!(hung, "the backlog never filled");
    let o = TcpConnect::new(addr.to_string())
        .timeout(Duration::from_millis(300))
        .check()
        .await;
    assert_eq!(o.status, Status::Fail, "{}", output(&o));
    assert!(
        output(&o).contains("timed out after 300ms"),
        "{}",
        output(&o)
    );
    drop(listener);
}

/// A dependency on loopback with a route per behaviour.
async fn dependency() -> SocketAddr {
    let warn_report = HealthReport::from_results([
        (
            "db:connections",
            CheckResult::fail("pool exhausted"),
            Criticality::NonCritical,
        ),
        (
            "disk:free",
            CheckResult::new(Status::Pass),
            Criticality::Critical,
        ),
    ]);
    let fail_report = HealthReport::from_results([(
        "db:connections",
        CheckResult::fail("down"),
        Criticality::Critical,
    )]);
    let warn_body = warn_report.to_json();
    let fail_body = fail_report.to_json();
    let app = axum::Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route(
            "/teapot",
            get(|| async { (StatusCode::IM_A_TEAPOT, "short and stout") }),
        )
        .route("/no-content", get(|| async { StatusCode::NO_CONTENT }))
        .route(
            "/health-warn",
            get(move || async move { ([("content-type", HEALTH_JSON)], warn_body) }),
        )
        .route(
            "/health-fail",
            get(move || async move {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("content-type", HEALTH_JSON)],
                    fail_body,
                )
            }),
        )
        .route(
            "/garbage",
            get(|| async { ([("content-type", "text/html")], "<html>not health</html>") }),
        )
        .route(
            "/hang",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                "late"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn http_get_checks_the_status_code() {
    let addr = dependency().await;
    let ok = HttpGet::new(&format!("http://{addr}/ok"))
        .unwrap()
        .check()
        .await;
    assert_eq!(ok.status, Status::Pass, "{}", output(&ok));
    assert_eq!(ok.observed_unit.as_deref(), Some("ms"));

    let teapot = HttpGet::new(&format!("http://{addr}/teapot"))
        .unwrap()
        .check()
        .await;
    assert_eq!(teapot.status, Status::Fail);
    assert!(output(&teapot).contains("418"), "{}", output(&teapot));

    let expected = HttpGet::new(&format!("http://{addr}/teapot"))
        .unwrap()
        .expect_status(418)
        .check()
        .await;
    assert_eq!(expected.status, Status::Pass, "{}", output(&expected));

    let wrong = HttpGet::new(&format!("http://{addr}/ok"))
        .unwrap()
        .expect_status(204)
        .check()
        .await;
    assert_eq!(wrong.status, Status::Fail);
    assert!(
        output(&wrong).contains("expected 204"),
        "{}",
        output(&wrong)
    );
}

#[tokio::test]
async fn http_get_maps_a_health_json_status() {
    let addr = dependency().await;
    let warn = HttpGet::new(&format!("http://{addr}/health-warn"))
        .unwrap()
        .health_json()
        .check()
        .await;
    assert_eq!(
        warn.status,
        Status::Warn,
        "a degraded dependency warns: {}",
        output(&warn)
    );
    assert!(
        output(&warn).contains("failing: db:connections"),
        "{}",
        output(&warn)
    );

    let fail = HttpGet::new(&format!("http://{addr}/health-fail"))
        .unwrap()
        .health_json()
        .check()
        .await;
    assert_eq!(fail.status, Status::Fail, "{}", output(&fail));

    let garbage = HttpGet::new(&format!("http://{addr}/garbage"))
        .unwrap()
        .health_json()
        .check()
        .await;
    assert_eq!(garbage.status, Status::Fail);
    assert!(
        output(&garbage).contains("not health+json"),
        "{}",
        output(&garbage)
    );

    // A status-only endpoint (text/plain "ok") passes, as with `vigil check`, the
    // balancer and the controller: the one judge reads the real Content-Type.
    let plain = HttpGet::new(&format!("http://{addr}/ok"))
        .unwrap()
        .health_json()
        .check()
        .await;
    assert_eq!(plain.status, Status::Pass, "{}", output(&plain));
}

#[tokio::test]
async fn http_get_fails_on_refusal_and_hang() {
    let refused = HttpGet::new(&format!("http://{}/", closed_port()))
        .unwrap()
        .check()
        .await;
    assert_eq!(refused.status, Status::Fail);
    assert!(
        output(&refused).to_lowercase().contains("refused"),
        "{}",
        output(&refused)
    );

    let addr = dependency().await;
    let hang = HttpGet::new(&format!("http://{addr}/hang"))
        .unwrap()
        .timeout(Duration::from_millis(300))
        .check()
        .await;
    assert_eq!(hang.status, Status::Fail);
    assert!(
        output(&hang).contains("timed out after 300ms"),
        "{}",
        output(&hang)
    );
}

#[test]
fn http_get_rejects_urls_it_cannot_fetch() {
    assert!(
        HttpGet::new("https://example.invalid/").is_err(),
        "no TLS stack"
    );
    assert!(HttpGet::new("not a url").is_err());
    assert!(HttpGet::new("/relative").is_err());
}
