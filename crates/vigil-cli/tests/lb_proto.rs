//! Real-process tests of `vigil lb`'s protocols beyond plain HTTP/1.1: WebSocket (and
//! other HTTP/1.1 upgrades) through the real binary to real backends, driven by real
//! clients (tokio-tungstenite). Every wait polls a condition until a deadline.

use futures::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message;

mod lb_support;
use lb_support::{LbProcess, serve_each, take_head};

/// A WebSocket echo server (tokio-tungstenite's server side): every message comes back.
async fn ws_echo_backend() -> SocketAddr {
    serve_each(|tcp| async move {
        let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
            return;
        };
        while let Some(Ok(msg)) = ws.next().await {
            if msg.is_close() {
                break;
            }
            if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                break;
            }
        }
    })
    .await
}

/// A balancer in front of `target` (no active checks: the target speaks WebSocket only).
async fn lb_for(target: SocketAddr, top: &str) -> LbProcess {
    LbProcess::start(&format!(
        "{top}\n[pools.ws]\ntargets = [{{ addr = \"{target}\" }}]\n\
         [pools.ws.health_check]\nenabled = false\n"
    ))
    .await
}

/// The admin `/metrics` text.
async fn metrics(lb: &LbProcess) -> String {
    reqwest::get(format!("http://127.0.0.1:{}/metrics", lb.admin))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text")
}

/// The value of the sample `series` (name and labels exactly as exposed), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Polls `/metrics` until `cond` holds on it, or panics after `within`.
async fn wait_metrics(lb: &LbProcess, within: Duration, what: &str, cond: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + within;
    loop {
        let m = metrics(lb).await;
        if cond(&m) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\nmetrics:\n{m}\nlog:\n{}",
            lb.log()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws_connect(lb: &LbProcess, path: &str) -> Ws {
    let url = format!("ws://127.0.0.1:{}{path}", lb.port);
    let (ws, resp) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "WebSocket handshake through vigil lb: {e}\nlog:\n{}",
                lb.log()
            )
        });
    assert_eq!(resp.status().as_u16(), 101);
    assert_eq!(
        resp.headers().get("via").map(|v| v.as_bytes()),
        Some(&b"1.1 vigil"[..]),
        "the 101 went through vigil"
    );
    ws
}

/// Sends `msg` and expects it back within 10 s.
async fn echo(ws: &mut Ws, msg: Message) {
    ws.send(msg.clone()).await.expect("send");
    let back = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("an echo within 10 s")
        .expect("the stream is open")
        .expect("a message");
    assert_eq!(back, msg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_talks_to_an_echo_backend_through_the_balancer() {
    let backend = ws_echo_backend().await;
    let lb = lb_for(backend, "").await;
    let mut ws = ws_connect(&lb, "/chat?room=1").await;
    echo(&mut ws, Message::text("hello through vigil")).await;
    // Larger than a tunnel buffer (16 KiB) and than a socket's usual window.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    echo(&mut ws, Message::binary(big.clone())).await;
    for i in 0..50 {
        echo(&mut ws, Message::text(format!("message {i}"))).await;
    }
    let m = metrics(&lb).await;
    assert_eq!(
        sample(&m, "vigil_lb_tunnels_total{pool=\"ws\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "vigil_lb_tunnels_open{pool=\"ws\"}"),
        Some(1.0),
        "{m}"
    );
    for direction in ["to_target", "to_client"] {
        let bytes = sample(
            &m,
            &format!("vigil_lb_tunnel_bytes_total{{pool=\"ws\",direction=\"{direction}\"}}"),
        )
        .unwrap_or(0.0);
        assert!(bytes > big.len() as f64, "{direction}: {bytes} bytes\n{m}");
    }
    // A second one at the same time on another connection.
    let mut other = ws_connect(&lb, "/").await;
    echo(&mut other, Message::text("second")).await;
    ws.close(None).await.expect("close handshake");
    while let Some(Ok(_)) = ws.next().await {}
    drop(ws);
    other.close(None).await.expect("close handshake");
    while let Some(Ok(_)) = other.next().await {}
    drop(other);
    wait_metrics(&lb, Duration::from_secs(10), "both tunnels closed", |m| {
        sample(m, "vigil_lb_tunnels_open{pool=\"ws\"}") == Some(0.0)
            && sample(
                m,
                "vigil_lb_tunnels_closed_total{pool=\"ws\",reason=\"closed\"}",
            ) == Some(2.0)
    })
    .await;
}

/// What a plain HTTP backend saw: each request head, as text.
async fn recording_backend(answer: &'static str) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let addr = serve_each(move |mut tcp| {
        let seen = s.clone();
        async move {
            let mut buf = Vec::new();
            while let Some(head) = take_head(&mut tcp, &mut buf).await {
                seen.lock().unwrap().push(head);
                if tcp.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (addr, seen)
}

#[tokio::test]
async fn an_upgrade_the_target_declines_stays_http_and_only_valid_upgrades_are_forwarded() {
    let (backend, seen) = recording_backend("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
    let lb = lb_for(backend, "").await;
    let mut c = tokio::net::TcpStream::connect(("127.0.0.1", lb.port))
        .await
        .unwrap();
    let mut buf = Vec::new();
    let ws_head = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: \
                   dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
    // 1. A valid upgrade the target answers with 200: an ordinary answer, and the
    //    connection goes on as HTTP.
    // 2. The same as a POST with a body: not an upgrade (the body would be taken for
    //    the new protocol's bytes by one reader and not by another).
    // 3. h2c: never forwarded (h2c smuggling), a plain request.
    // 4. A plain request after them on the same connection.
    let requests = [
        format!("GET /a HTTP/1.1\r\nHost: x\r\n{ws_head}\r\n"),
        format!("POST /b HTTP/1.1\r\nHost: x\r\n{ws_head}Content-Length: 2\r\n\r\nhi"),
        "GET /c HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n\
         HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
            .to_string(),
        "GET /d HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
    ];
    for r in &requests {
        c.write_all(r.as_bytes()).await.unwrap();
        let head = tokio::time::timeout(Duration::from_secs(10), take_head(&mut c, &mut buf))
            .await
            .expect("an answer")
            .expect("the connection stays open");
        assert!(head.starts_with("HTTP/1.1 200"), "{r}: {head}");
        assert!(
            !head.to_ascii_lowercase().contains("upgrade"),
            "no upgrade in the answer: {head}"
        );
        lb_support::take_exact(&mut c, &mut buf, 2).await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    let lower: Vec<String> = seen.iter().map(|h| h.to_ascii_lowercase()).collect();
    assert!(
        lower[0].contains("\r\nupgrade: websocket\r\n") && lower[0].contains("connection: upgrade"),
        "a valid upgrade is forwarded with its Upgrade: {}",
        seen[0]
    );
    assert!(
        lower[0].contains("sec-websocket-key: dghlihnhbxbszsbub25jzq=="),
        "{}",
        seen[0]
    );
    for (i, h) in lower.iter().enumerate().skip(1) {
        assert!(
            !h.contains("upgrade") && !h.contains("http2-settings"),
            "request {i} must go as a plain request: {h}"
        );
    }
    let m = metrics(&lb).await;
    assert_eq!(
        sample(&m, "vigil_lb_tunnels_total{pool=\"ws\"}"),
        None,
        "{m}"
    );
}

#[tokio::test]
async fn a_101_to_a_request_that_asked_for_no_upgrade_is_a_502() {
    let (backend, _) = recording_backend(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
    )
    .await;
    let lb = lb_for(backend, "").await;
    let resp = reqwest::get(format!("http://127.0.0.1:{}/", lb.port))
        .await
        .expect("an answer");
    assert_eq!(resp.status().as_u16(), 502);
}

#[tokio::test]
async fn a_quiet_tunnel_is_closed_after_tunnel_idle() {
    let backend = ws_echo_backend().await;
    let lb = lb_for(backend, "[timeouts]\ntunnel_idle = \"300ms\"").await;
    let mut ws = ws_connect(&lb, "/").await;
    // Traffic keeps it open past the idle time.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        echo(&mut ws, Message::text("ping")).await;
    }
    let quiet = Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("the tunnel closes within 10 s");
    assert!(
        !matches!(end, Some(Ok(Message::Text(_) | Message::Binary(_)))),
        "{end:?}"
    );
    let waited = quiet.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "closed after {waited:?}, before the idle time"
    );
    wait_metrics(&lb, Duration::from_secs(10), "an idle close counted", |m| {
        sample(
            m,
            "vigil_lb_tunnels_closed_total{pool=\"ws\",reason=\"idle\"}",
        ) == Some(1.0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_tunnels_open_until_the_drain_timeout_then_closes_them_and_exits_0() {
    let backend = ws_echo_backend().await;
    let mut lb = lb_for(backend, "drain_timeout = \"2s\"").await;
    let mut ws = ws_connect(&lb, "/").await;
    echo(&mut ws, Message::text("before")).await;
    lb.signal("TERM");
    let term = Instant::now();
    // Draining: no new connection is taken, but the tunnel works on.
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", lb.port))
        .await
        .is_ok()
    {
        assert!(Instant::now() < deadline, "still listening after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    echo(&mut ws, Message::text("during the drain")).await;
    assert!(
        term.elapsed() < Duration::from_secs(2),
        "the echo came in the drain time"
    );
    let end = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("the tunnel is closed after the drain time");
    assert!(
        !matches!(end, Some(Ok(Message::Text(_) | Message::Binary(_)))),
        "{end:?}"
    );
    let closed = term.elapsed();
    assert!(
        closed >= Duration::from_millis(1900),
        "closed {closed:?} after SIGTERM, before the 2 s drain timeout"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = lb.child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "vigil lb did not exit\n{}",
            lb.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(0), "{}", lb.log());
    assert!(
        lb.log().contains("tunnels still open; closing"),
        "the log says why it closed: {}",
        lb.log()
    );
}
