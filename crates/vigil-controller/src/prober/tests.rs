use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::net::TcpListener;

const PASS: &str = r#"{"status":"pass","checks":{"disk:free":[{"status":"pass"}]}}"#;

/// `vigil_testkit::scripted_server`, addressed as a health URL.
async fn serve(answer: String, per_conn: usize) -> (http::Uri, Arc<AtomicUsize>) {
    let (addr, conns) = vigil_testkit::scripted_server(answer, per_conn).await;
    let uri = format!("http://{addr}/health").parse().unwrap();
    (uri, conns)
}

fn with_length(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/health+json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

async fn probe(p: &Prober, uri: &http::Uri, max_body: usize) -> ProbeRecord {
    p.probe(
        "t",
        "z",
        uri.clone(),
        Duration::from_secs(5),
        max_body,
        Answers::HealthJson,
    )
    .await
    .1
}

#[tokio::test]
async fn keep_alive_reuses_one_connection_per_target() {
    let (uri, conns) = serve(with_length(PASS), usize::MAX).await;
    let p = Prober::new(true);
    for _ in 0..5 {
        let r = probe(&p, &uri, 65536).await;
        assert!(r.ok, "a pass answer must pass: {r:?}");
    }
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "probes must share a pooled connection"
    );
    assert_eq!(p.idle_connections(), 1);
}

#[tokio::test]
async fn without_keep_alive_every_probe_has_its_own_connection() {
    let (uri, conns) = serve(with_length(PASS), usize::MAX).await;
    let p = Prober::new(false);
    for _ in 0..3 {
        assert!(probe(&p, &uri, 65536).await.ok);
    }
    assert_eq!(conns.load(Ordering::SeqCst), 3);
    assert_eq!(p.idle_connections(), 0);
}

#[tokio::test]
async fn a_pooled_connection_closed_by_the_server_is_replaced_transparently() {
    // One answer per connection, without saying `Connection: close`.
    let (uri, conns) = serve(with_length(PASS), 1).await;
    let p = Prober::new(true);
    for i in 0..4 {
        let r = probe(&p, &uri, 65536).await;
        assert!(
            r.ok,
            "probe {i} must pass despite the closed idle connection: {r:?}"
        );
        // Give the FIN time to arrive for some probes, not for others.
        if i % 2 == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(conns.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn chunked_bodies_are_decoded() {
    let (a, b) = PASS.split_at(10);
    let answer = format!(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x};ext=1\r\n{b}\r\n0\r\nx-trailer: 1\r\n\r\n",
        a.len(),
        b.len()
    );
    let (uri, conns) = serve(answer, usize::MAX).await;
    let p = Prober::new(true);
    for _ in 0..2 {
        let r = probe(&p, &uri, 65536).await;
        assert!(r.ok, "a chunked pass answer must pass: {r:?}");
        assert_eq!(r.status, Some(200));
    }
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "a chunked answer keeps the connection"
    );
}

#[tokio::test]
async fn a_body_ending_with_the_connection_is_read_to_the_end() {
    let answer = format!("HTTP/1.0 200 OK\r\n\r\n{PASS}");
    let (uri, _) = serve(answer, 1).await;
    let p = Prober::new(true);
    let r = probe(&p, &uri, 65536).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(
        p.idle_connections(),
        0,
        "a close-delimited answer is not pooled"
    );
}

#[tokio::test]
async fn bodies_larger_than_max_body_fail() {
    let big = format!(r#"{{"status":"pass","output":"{}"}}"#, "x".repeat(5000));
    let p = Prober::new(true);
    let (uri, _) = serve(with_length(&big), usize::MAX).await;
    let r = probe(&p, &uri, 1000).await;
    assert!(!r.ok);
    assert!(r.detail.contains("larger than 1000 bytes"), "{}", r.detail);
    let chunked = format!(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n",
        big.len()
    );
    let (uri, _) = serve(chunked, usize::MAX).await;
    let r = probe(&p, &uri, 1000).await;
    assert!(r.detail.contains("larger than 1000 bytes"), "{}", r.detail);
    let (uri, _) = serve(format!("HTTP/1.0 200 OK\r\n\r\n{big}"), 1).await;
    let r = probe(&p, &uri, 1000).await;
    assert!(r.detail.contains("larger than 1000 bytes"), "{}", r.detail);
}

#[tokio::test]
async fn answers_are_judged_by_the_one_judge() {
    let p = Prober::new(true);
    let answer = |code: &str, body: &str| {
        format!(
            "HTTP/1.1 {code}\r\ncontent-type: application/health+json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    // A 503 whose body says pass is a fail (it used to pass here).
    let (uri, _) = serve(
        answer("503 Service Unavailable", r#"{"status":"pass"}"#),
        usize::MAX,
    )
    .await;
    let (obs, r) = p
        .probe(
            "t",
            "z",
            uri,
            Duration::from_secs(5),
            65536,
            Answers::HealthJson,
        )
        .await;
    assert!(!r.ok && obs.endpoint_failed, "{}", r.detail);
    assert!(r.detail.contains("counting fail"), "{}", r.detail);
    // A 500 with a failing report names its failing check (it used to be garbage).
    let body = r#"{"status":"fail","checks":{"disk:free":[{"status":"fail"}]}}"#;
    let (uri, _) = serve(answer("500 Internal Server Error", body), usize::MAX).await;
    let (obs, r) = p
        .probe(
            "t",
            "z",
            uri,
            Duration::from_secs(5),
            65536,
            Answers::HealthJson,
        )
        .await;
    assert_eq!(obs.failing_checks, ["disk:free"], "{}", r.detail);
}

#[tokio::test]
async fn garbage_and_wrong_statuses_fail_with_a_reason() {
    let p = Prober::new(true);
    let (uri, _) = serve("\x00\x01garbage, not HTTP\r\n\r\n".into(), 1).await;
    let r = probe(&p, &uri, 65536).await;
    assert!(!r.ok);
    assert!(r.detail.contains("not an HTTP response"), "{}", r.detail);
    let (uri, _) = serve(with_length("not json"), usize::MAX).await;
    let r = probe(&p, &uri, 65536).await;
    assert!(r.detail.contains("garbage health response"), "{}", r.detail);
    let (uri, _) = serve(
        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".into(),
        usize::MAX,
    )
    .await;
    let r = probe(&p, &uri, 65536).await;
    assert_eq!(r.status, Some(404));
    assert!(r.detail.contains("HTTP 404"), "{}", r.detail);
}

#[tokio::test]
async fn a_silent_endpoint_times_out_and_a_closed_port_is_refused() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri: http::Uri = format!("http://{}/health", l.local_addr().unwrap())
        .parse()
        .unwrap();
    let p = Prober::new(true);
    let (_, r) = p
        .probe(
            "t",
            "z",
            uri.clone(),
            Duration::from_millis(200),
            65536,
            Answers::PlainStatus,
        )
        .await;
    assert!(!r.ok);
    assert!(r.detail.contains("timed out"), "{}", r.detail);
    drop(l);
    let r = probe(&p, &uri, 65536).await;
    assert!(!r.ok);
    assert!(r.detail.contains("request failed"), "{}", r.detail);
}

/// A plain server's answers, judged as `probe.answers` says.
async fn plain(p: &Prober, answer: String, answers: Answers) -> (Observation, ProbeRecord) {
    let (uri, _) = serve(answer, usize::MAX).await;
    p.probe("t", "", uri, Duration::from_secs(5), 1000, answers)
        .await
}

fn page(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn plain_statuses_are_answers_unless_health_json_is_demanded() {
    let p = Prober::new(true);
    let ok = page("200 OK", "<h1>Welcome</h1>");
    let (obs, r) = plain(&p, ok.clone(), Answers::PlainStatus).await;
    assert!(obs.is_ok() && r.ok, "a plain 200 page passes: {r:?}");
    let (_, r) = plain(&p, ok, Answers::HealthJson).await;
    assert!(
        !r.ok && r.detail.contains("garbage health response"),
        "{r:?}"
    );
    let missing = page("404 Not Found", "<h1>Not Found</h1>");
    let (obs, r) = plain(&p, missing, Answers::PlainStatus).await;
    assert!(!r.ok && obs.endpoint_failed);
    assert_eq!(
        r.detail,
        "HTTP 404, not a health answer: a plain 4xx fails (is the path right?)"
    );
    // A page larger than max_body (1000 here) is judged by its code, not read.
    let big = page("200 OK", &"x".repeat(5000));
    let (_, r) = plain(&p, big.clone(), Answers::PlainStatus).await;
    assert!(r.ok, "a large plain page passes by its code: {r:?}");
    let (_, r) = plain(&p, big, Answers::HealthJson).await;
    assert!(r.detail.contains("larger than 1000 bytes"), "{r:?}");
    // A health+json body decides in either mode.
    let report = r#"{"status":"fail","checks":{"disk:free":[{"status":"fail"}]}}"#;
    let (obs, _) = plain(&p, with_length(report), Answers::PlainStatus).await;
    assert_eq!(obs.failing_checks, ["disk:free"]);
}
