//! Real-process tests of `vigil lb` at the edge (issue 38): what a client can send that
//! a careful peer (nginx, HAProxy) refuses or serves. The real binary on loopback, raw
//! sockets on the client side, scripted raw backends that record the requests that
//! reached them whole. Health checks are off, so the only requests a backend sees are
//! the tests'. Every read is bounded in time.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod lb_support;
use lb_support::{LbProcess as Lb, serve_each, take_exact, take_head};

/// Longest wait for any answer.
const WAIT: Duration = Duration::from_secs(5);

/// A request as a backend got it: its request line and `Host` field.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    line: String,
    host: String,
}

/// A keep-alive backend that records each request it read whole (a length or chunks
/// up to 1 MiB; anything else ends the connection unrecorded) and answers `name`.
async fn backend(name: &'static str) -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let addr = serve_each(move |mut c| {
        let log = log.clone();
        async move {
            let mut buf = Vec::new();
            while let Some(raw) = take_head(&mut c, &mut buf).await {
                let head = raw.to_ascii_lowercase();
                let field = |n: &str| {
                    head.split("\r\n")
                        .skip(1)
                        .filter_map(|l| l.split_once(':'))
                        .find(|(k, _)| k.trim() == n)
                        .map(|(_, v)| v.trim().to_string())
                };
                if field("transfer-encoding").is_some() {
                    loop {
                        let Some(p) = buf.windows(2).position(|w| w == b"\r\n") else {
                            if !lb_support::fill(&mut c, &mut buf).await {
                                return;
                            }
                            continue;
                        };
                        let line = String::from_utf8_lossy(&buf[..p]).to_string();
                        let Ok(size) = usize::from_str_radix(line.trim(), 16) else {
                            return;
                        };
                        if size > 1 << 20 {
                            return;
                        }
                        buf.drain(..p + 2);
                        if take_exact(&mut c, &mut buf, size + 2).await.is_none() {
                            return;
                        }
                        if size == 0 {
                            break;
                        }
                    }
                } else if let Some(n) = field("content-length") {
                    let n: usize = n.parse().unwrap_or(0);
                    if take_exact(&mut c, &mut buf, n).await.is_none() {
                        return;
                    }
                }
                log.lock().unwrap().push(Seen {
                    line: raw.split("\r\n").next().unwrap_or_default().to_string(),
                    host: field("host").unwrap_or_default(),
                });
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{name}",
                    name.len()
                );
                if c.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (addr, seen)
}

/// Sends `request` on a fresh connection and reads until the balancer closes it or
/// `WAIT` passes: the status code and everything read.
async fn exchange(lb: &Lb, request: &[u8]) -> (u16, String) {
    let mut c = TcpStream::connect(("127.0.0.1", lb.port))
        .await
        .expect("connect to the balancer");
    c.write_all(request).await.expect("send");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, async {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = c.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&chunk[..n]);
        }
    })
    .await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn userinfo_bad_hosts_and_huge_chunk_sizes_get_400_and_http_1_2_is_served_as_1_1() {
    // Host `b` has a route of its own; everything else goes to `other`.
    let (b_addr, b_seen) = backend("pool b").await;
    let (o_addr, o_seen) = backend("pool other").await;
    let lb = Lb::start(&format!(
        "[[routes]]\nhost = \"b\"\npool = \"b\"\n[[routes]]\npool = \"other\"\n\
         [pools.b]\ntargets = [{{ addr = \"{b_addr}\" }}]\n[pools.b.health_check]\nenabled = false\n\
         [pools.other]\ntargets = [{{ addr = \"{o_addr}\" }}]\n[pools.other.health_check]\nenabled = false\n"
    ))
    .await;

    for (what, request) in [
        (
            "absolute form with userinfo",
            "GET http://u:p@b:80/x HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n",
        ),
        (
            "absolute form with userinfo and no Host of its own",
            "GET http://u:p@b:80/x HTTP/1.1\r\nHost: u:p@b:80\r\nConnection: close\r\n\r\n",
        ),
        (
            "a space in Host",
            "GET /x HTTP/1.1\r\nHost: a b\r\nConnection: close\r\n\r\n",
        ),
        (
            "userinfo in Host",
            "GET /x HTTP/1.1\r\nHost: b:80@evil\r\nConnection: close\r\n\r\n",
        ),
        (
            "a chunk size of 2^64 - 1",
            "POST /c HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc",
        ),
        (
            "a chunk size of 2^64 - 1 with nothing after its line",
            "POST /c HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n",
        ),
    ] {
        let (status, text) = exchange(&lb, request.as_bytes()).await;
        assert_eq!(status, 400, "{what}: got {text:?}");
        assert!(
            text.to_ascii_lowercase().contains("connection: close"),
            "{what}: the connection closes after the refusal: {text:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        *b_seen.lock().unwrap(),
        Vec::<Seen>::new(),
        "no refused request may reach a target whole"
    );
    assert_eq!(*o_seen.lock().unwrap(), Vec::<Seen>::new());

    // RFC 9110 2.5: a higher minor version of HTTP/1 is served as HTTP/1.1.
    let (status, text) = exchange(
        &lb,
        b"GET /v HTTP/1.2\r\nHost: b\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200, "HTTP/1.2 is served as HTTP/1.1: {text:?}");
    assert!(text.ends_with("pool b"), "{text:?}");
    // Pipelined after a 1.1 request on one connection, too.
    let (status, text) = exchange(
        &lb,
        b"GET /p1 HTTP/1.1\r\nHost: b\r\n\r\nGET /p2 HTTP/1.9\r\nHost: b\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200, "{text:?}");
    assert_eq!(text.matches("HTTP/1.1 200").count(), 2, "{text:?}");
    // The absolute form without userinfo still routes by its authority.
    let (status, text) = exchange(
        &lb,
        b"GET http://b:80/y HTTP/1.1\r\nHost: elsewhere\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200, "{text:?}");
    assert!(text.ends_with("pool b"), "{text:?}");
    let b_lines: Vec<Seen> = b_seen.lock().unwrap().clone();
    let want = |line: &str, host: &str| Seen {
        line: line.into(),
        host: host.into(),
    };
    assert_eq!(
        b_lines,
        [
            want("GET /v HTTP/1.1", "b"),
            want("GET /p1 HTTP/1.1", "b"),
            want("GET /p2 HTTP/1.1", "b"),
            want("GET /y HTTP/1.1", "b:80"),
        ],
        "what the target of pool b got"
    );
    assert_eq!(*o_seen.lock().unwrap(), Vec::<Seen>::new());
    // And a plain chunked upload still goes through.
    let (status, text) = exchange(
        &lb,
        b"POST /up HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200, "{text:?}");
}
