use super::*;
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `vigil_testkit::scripted_server`, addressed as `host:port`.
async fn serve(answer: Vec<u8>, per_conn: usize) -> (String, Arc<AtomicUsize>) {
    let (addr, accepted) = vigil_testkit::scripted_server(answer, per_conn).await;
    (addr.to_string(), accepted)
}

/// A 200 answer with `body` and its Content-Length.
fn with_length(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A bodiless request for `/` with `method`.
fn get(method: &str) -> Outgoing {
    Outgoing::new(
        format!("{method} / HTTP/1.1\r\n").into_bytes(),
        false,
        method == "HEAD",
        false,
        OutgoingBody::Buffered(Bytes::new()),
        true,
    )
}

const SECOND: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);
const HELLO: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\nhello";

/// A GET of `/` on `pool`, up to the response head.
async fn send_get(pool: &Arc<ConnPool>) -> Result<UpstreamResponse, AttemptFailure> {
    fetch_head(pool, &get("GET")).await
}

async fn fetch_head(
    pool: &Arc<ConnPool>,
    req: &Outgoing,
) -> Result<UpstreamResponse, AttemptFailure> {
    let t = AttemptTimeouts {
        connect: SECOND,
        idle: MINUTE,
        head: MINUTE,
        send: MINUTE,
        deadline: MINUTE,
    };
    pool.send(req, b"t", None, t).await
}

#[test]
fn every_attempt_states_its_deadline_in_whole_milliseconds() {
    let mut out = Vec::new();
    write_deadline_fields(&mut out, Duration::from_micros(1_999_999), false);
    assert_eq!(
        out, b"x-vigil-deadline-ms: 1999\r\n",
        "rounded down, never up"
    );
    out.clear();
    write_deadline_fields(&mut out, Duration::from_micros(400), true);
    assert_eq!(
        out, b"x-vigil-deadline-ms: 0\r\ngrpc-timeout: 1m\r\n",
        "an expired attempt says 0; grpc-timeout must stay positive"
    );
    out.clear();
    write_deadline_fields(&mut out, Duration::from_secs(10 * 86_400), false);
    assert_eq!(out, b"x-vigil-deadline-ms: 86400000\r\n", "capped at a day");
    // What the targets' side parses back.
    assert_eq!(
        vigil_core::admission::parse_deadline_ms(b"86400000"),
        Some(vigil_core::admission::MAX_DEADLINE)
    );
}

/// Status and whole body of `req` sent on `pool`.
async fn fetch(pool: &Arc<ConnPool>, req: &Outgoing) -> Result<(u16, Vec<u8>), AttemptFailure> {
    let resp = fetch_head(pool, req).await?;
    let status = resp.head.status;
    let body = resp.body.collect().await.unwrap().to_bytes();
    Ok((status, body.to_vec()))
}

#[tokio::test]
async fn a_connection_busy_while_the_tls_settings_change_is_not_pooled_again() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pool = ConnPool::new(&listener.local_addr().unwrap().to_string());
    let (busy, _peer) = tokio::join!(pool.connect(MINUTE), listener.accept());
    let busy = busy.unwrap();
    // A reload changes the pool's TLS while `busy` carries a request: it finishes
    // there, and then closes instead of serving the next ones under the old trust.
    let tls = Some(Arc::new(tls::tests::tls(None)));
    assert!(
        pool.dialer.set_tls(tls.clone()),
        "cleartext to TLS is a change"
    );
    pool.checkin(busy);
    assert_eq!(pool.idle_count(), 0, "made under the old settings");
    // The same settings again change nothing; back to cleartext is a change.
    assert!(!pool.dialer.set_tls(tls));
    pool.set_protocol(Protocol::Http1, None);
    let (fresh, _peer) = tokio::join!(pool.connect(MINUTE), listener.accept());
    pool.checkin(fresh.unwrap());
    assert_eq!(pool.idle_count(), 1, "made under the current settings");
    pool.set_protocol(Protocol::Http1, Some(Arc::new(tls::tests::tls(None))));
    assert_eq!(pool.idle_count(), 0, "a change closes the idle ones too");
}

#[tokio::test]
async fn every_idle_connection_closed_by_the_target_is_evicted_in_one_pass() {
    // More than tokio's cooperative budget (128 readiness polls per task poll):
    // readiness must not read "pending" for the rest, or closed ones would stay.
    const N: usize = 200;
    // Nothing here waits on the wall clock, so a busy machine only makes it slower
    // (it used to connect 200 times against a backlog of 128 with a 1 s timeout
    // while another thread accepted, then sleep 200 ms for the FINs): each connect
    // is paired with its accept, so the backlog never holds more than one, and the
    // connect timeout is a minute, never reached.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pool = ConnPool::new(&listener.local_addr().unwrap().to_string());
    let mut conns = Vec::with_capacity(N);
    let mut accepted = Vec::with_capacity(N);
    for _ in 0..N {
        let (conn, peer) = tokio::join!(pool.connect(MINUTE), listener.accept());
        conns.push(conn.unwrap());
        accepted.push(peer.unwrap().0);
    }
    drop(accepted); // the target closes every one of them
    // The reactor has seen each FIN once each connection reads as readable (which
    // does not consume the readiness the pass below looks at).
    for c in &conns {
        c.stream.tcp().readable().await.unwrap();
    }
    for c in conns {
        pool.checkin(c);
    }
    assert_eq!(pool.idle_count(), N);
    // One pass, from one task poll.
    pool.evict_idle(MINUTE);
    assert_eq!(pool.idle_count(), 0, "closed connections left in the pool");
}

#[test]
fn the_request_is_serialised_once_with_its_length() {
    let line = || b"POST /p?q=1 HTTP/1.1\r\nx-b: 2\r\n".to_vec();
    let o = Outgoing::new(
        line(),
        false,
        false,
        true,
        OutgoingBody::Buffered(Bytes::from_static(b"abc")),
        false,
    );
    assert_eq!(
        String::from_utf8_lossy(&o.head),
        "POST /p?q=1 HTTP/1.1\r\nx-b: 2\r\ncontent-length: 3\r\n"
    );
    assert!(o.needs_host && !o.idempotent && !o.chunked);
    let o = Outgoing::new(
        line(),
        true,
        false,
        true,
        OutgoingBody::Buffered(Bytes::new()),
        false,
    );
    assert!(
        String::from_utf8_lossy(&o.head).ends_with("content-length: 0\r\n"),
        "an empty POST says so"
    );
    let o = Outgoing::new(
        line(),
        true,
        false,
        true,
        OutgoingBody::Streamed(None),
        false,
    );
    assert!(o.chunked && !o.needs_host);
    assert!(String::from_utf8_lossy(&o.head).ends_with("transfer-encoding: chunked\r\n"));
    let o = Outgoing::new(
        line(),
        true,
        false,
        true,
        OutgoingBody::Streamed(Some(7)),
        false,
    );
    assert!(String::from_utf8_lossy(&o.head).ends_with("content-length: 7\r\n"));
    let o = get("GET");
    assert_eq!(
        String::from_utf8_lossy(&o.head),
        "GET / HTTP/1.1\r\n",
        "no length for an empty GET"
    );
}

#[tokio::test]
async fn the_head_goes_on_without_hop_by_hop_fields_and_with_its_reason() {
    let answer = b"HTTP/1.1 201 Made It\r\nConnection: keep-alive, X-Hop\r\nx-hop: 1\r\nKeep-Alive: timeout=5\r\nx-a:  spaced  \r\nx-empty:\r\ncontent-length: 2\r\n\r\nok";
    let (addr, _) = serve(answer.to_vec(), usize::MAX).await;
    let resp = send_get(&ConnPool::new(&addr)).await.unwrap();
    let mut out = Vec::new();
    resp.head.write_to(&mut out);
    assert_eq!(
        String::from_utf8_lossy(&out),
        "HTTP/1.1 201 Made It\r\nx-a:  spaced\r\nx-empty:\r\ncontent-length: 2\r\n"
    );
    assert_eq!(resp.head.get("X-A"), Some(&b"spaced"[..]));
    assert_eq!(resp.head.framing, Framing::Length(2));
}

#[tokio::test]
async fn a_connection_is_reused_and_a_whole_small_body_is_handed_over_at_once() {
    let (addr, accepted) = serve(HELLO.to_vec(), usize::MAX).await;
    let pool = ConnPool::new(&addr);
    for _ in 0..20 {
        let resp = send_get(&pool).await.unwrap();
        assert_eq!(resp.head.get("x-a"), Some(&b"1"[..]));
        assert_eq!(
            pool.idle_count(),
            1,
            "back in the pool before the body is read"
        );
        assert_eq!(
            pool.idle_buffer_bytes(),
            0,
            "an idle connection holds no buffer"
        );
        let body = resp.body.collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hello");
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one keep-alive connection"
    );
}

#[tokio::test]
async fn chunked_and_streamed_bodies_arrive_whole_and_free_the_connection_at_the_end() {
    let big = "x".repeat(100_000);
    let chunked = format!(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{big}\r\n3;e=1\r\nabc\r\n0\r\nt: 1\r\n\r\n",
        big.len()
    );
    let (addr, accepted) = serve(chunked.into_bytes(), usize::MAX).await;
    let pool = ConnPool::new(&addr);
    for _ in 0..3 {
        let (status, body) = fetch(&pool, &get("GET")).await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(body.len(), big.len() + 3);
        assert!(body.ends_with(b"xabc"));
        assert_eq!(pool.idle_count(), 1);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    let (addr, accepted) = serve(with_length(&big), usize::MAX).await;
    let pool = ConnPool::new(&addr);
    for _ in 0..3 {
        let (_, body) = fetch(&pool, &get("GET")).await.unwrap();
        assert_eq!(body.len(), big.len());
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_body_ending_with_the_connection_is_read_to_the_end_and_not_pooled() {
    let (addr, accepted) = serve(b"HTTP/1.1 200 OK\r\n\r\nuntil close".to_vec(), 1).await;
    let pool = ConnPool::new(&addr);
    for _ in 0..2 {
        let (_, body) = fetch(&pool, &get("GET")).await.unwrap();
        assert_eq!(body, b"until close");
        assert_eq!(pool.idle_count(), 0);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn informational_answers_are_skipped_and_head_answers_have_no_body() {
    let answer = b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
    let (addr, _) = serve(answer.to_vec(), usize::MAX).await;
    let pool = ConnPool::new(&addr);
    assert_eq!(
        fetch(&pool, &get("GET")).await.unwrap(),
        (200, b"hello".to_vec())
    );
    let (addr, accepted) = serve(
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n".to_vec(),
        usize::MAX,
    )
    .await;
    let pool = ConnPool::new(&addr);
    for _ in 0..2 {
        assert_eq!(fetch(&pool, &get("HEAD")).await.unwrap(), (200, vec![]));
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "the HEAD answer kept its connection"
    );
}

#[tokio::test]
async fn a_pooled_connection_the_target_closed_is_replaced_for_idempotent_requests() {
    // One answer per connection, then the server closes: every reuse finds it closed.
    let (addr, accepted) = serve(HELLO.to_vec(), 1).await;
    let pool = ConnPool::new(&addr);
    for _ in 0..5 {
        assert_eq!(fetch(&pool, &get("GET")).await.unwrap().1, b"hello");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn an_abandoned_body_closes_its_connection_and_idle_ones_age_out() {
    let big = "y".repeat(50_000);
    let (addr, accepted) = serve(with_length(&big), usize::MAX).await;
    let pool = ConnPool::new(&addr);
    let first = send_get(&pool).await.unwrap();
    drop(first);
    assert_eq!(
        pool.idle_count(),
        0,
        "a body not read to the end is not pooled"
    );
    let (_, body) = fetch(&pool, &get("GET")).await.unwrap();
    assert_eq!(body.len(), big.len());
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    pool.evict_idle(MINUTE);
    assert_eq!(pool.idle_count(), 1, "not idle for a minute yet");
    pool.evict_idle(Duration::ZERO);
    assert_eq!(pool.idle_count(), 0, "idle past the limit: closed");
}

#[tokio::test]
async fn garbage_truncation_and_refusal_are_classified() {
    let (addr, _) = serve(b"SSH-2.0-OpenSSH\r\n\r\n".to_vec(), usize::MAX).await;
    assert_eq!(
        fetch(&ConnPool::new(&addr), &get("GET")).await,
        Err(AttemptFailure::Garbage)
    );
    let (addr, _) = serve(
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nx".to_vec(),
        usize::MAX,
    )
    .await;
    assert_eq!(
        fetch(&ConnPool::new(&addr), &get("GET")).await,
        Err(AttemptFailure::Garbage)
    );
    let (addr, _) = serve(b"HTTP/1.1 200 OK\r\ncontent-le".to_vec(), 1).await;
    assert_eq!(
        fetch(&ConnPool::new(&addr), &get("GET")).await,
        Err(AttemptFailure::Reset)
    );
    // Nothing at all in answer on a new connection: reset, not retried.
    let (addr, accepted) = serve(Vec::new(), 1).await;
    assert_eq!(
        fetch(&ConnPool::new(&addr), &get("GET")).await,
        Err(AttemptFailure::Reset)
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let pool = ConnPool::new(&format!("127.0.0.1:{port}"));
    assert_eq!(
        fetch(&pool, &get("GET")).await,
        Err(AttemptFailure::Connect)
    );
}

#[tokio::test]
async fn with_both_lengths_transfer_encoding_frames_and_content_length_is_dropped() {
    let smuggle = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n";
    let (addr, _) = serve(smuggle.to_vec(), usize::MAX).await;
    let pool = ConnPool::new(&addr);
    let resp = send_get(&pool).await.unwrap();
    assert_eq!(
        resp.head.get("content-length"),
        None,
        "a client must not trust the target's Content-Length here"
    );
    let body = resp.body.collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"0123456789");
    assert_eq!(
        pool.idle_count(),
        0,
        "a connection that sent both is not reused"
    );
}

#[tokio::test]
async fn a_truncated_body_is_an_error_not_a_short_success() {
    let (addr, _) = serve(
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc".to_vec(),
        1,
    )
    .await;
    let pool = ConnPool::new(&addr);
    let resp = send_get(&pool).await.unwrap();
    assert!(resp.body.collect().await.is_err());
    assert_eq!(pool.idle_count(), 0);
}
