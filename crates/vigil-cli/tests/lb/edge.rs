//! Real-process tests of `vigil lb` at the edge (issue 38): what a client can send that
//! a careful peer (nginx, HAProxy) refuses or serves. The real binary on loopback, raw
//! sockets on the client side, scripted raw backends that record the requests that
//! reached them whole. Health checks are off, so the only requests a backend sees are
//! the tests'. Every read is bounded in time.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::lb_support;
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

// ---------------------------------------------------------------------------------
// HTTP/2 clients' time limits, with the python `h2` library (hpack, hyperframe).

/// Whether python3 has the `h2` library. Without it the HTTP/2 tests say so and skip,
/// except in CI (`CI` set), where scripts/install-test-deps.sh installs it: there
/// they fail.
fn python_h2() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import h2, hpack, hyperframe"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let why = "python3 with the h2 library is not installed (`pip install h2`; \
                   scripts/install-test-deps.sh installs it)";
        assert!(
            std::env::var_os("CI").is_none(),
            "{why}: CI must run this test"
        );
        eprintln!("SKIPPED: {why}");
    }
    ok
}

/// Four HTTP/2 clients at once (prior knowledge), each on a connection of its own;
/// prints `{name: [seconds until the balancer closed it, GOAWAY seen, answers]}`:
/// `half` sends half a header block (HEADERS without END_HEADERS) and nothing more;
/// `trickled` a header block in three frames 300 ms apart, then nothing; `idle` one
/// request, then nothing; `busy` a request every 500 ms for 4 s (`busy_while_busy`),
/// then nothing. Times run from the client's last byte.
const H2_PROBE: &str = r#"# Probes vigil lb's HTTP/2 time limits. Prints one JSON
# object: for each connection, how long until the balancer closed it, whether a GOAWAY
# came first, and the statuses of the answers it got.
import json, socket, sys, threading, time
import h2.connection, h2.config, h2.events
from hpack import Encoder
from hyperframe.frame import HeadersFrame, ContinuationFrame

port = int(sys.argv[1])
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS = [(":method", "GET"), (":scheme", "http"), (":authority", "b"), (":path", "/x")]


def connect():
    s = socket.create_connection(("127.0.0.1", port))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    s.sendall(conn.data_to_send())
    # The balancer's SETTINGS, acknowledged: nothing of the client's is owed after it
    # (an ACK sent inside a header block would be a protocol error).
    s.settimeout(5)
    while not any(isinstance(e, h2.events.RemoteSettingsChanged) for e in conn.receive_data(s.recv(65536))):
        pass
    s.sendall(conn.data_to_send())
    return s, conn


def until_closed(s, conn, start, limit=15.0):
    """Reads until the peer closes; (seconds from start, GOAWAY seen, statuses)."""
    goaway, statuses = False, []
    s.settimeout(0.2)
    while time.monotonic() - start < limit:
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            break
        if not data:
            break
        try:
            events = conn.receive_data(data)
        except Exception:
            events = []
        for e in events:
            if isinstance(e, h2.events.ConnectionTerminated):
                goaway = True
            if isinstance(e, h2.events.ResponseReceived):
                statuses.append(dict(e.headers).get(b":status", b"").decode())
        out = conn.data_to_send()
        if out:
            try:
                s.sendall(out)
            except OSError:
                pass
    return round(time.monotonic() - start, 2), goaway, statuses


def fields_block():
    """The request's header block in three pieces that end between fields (the h2
    crate decodes each frame's fragment as it comes)."""
    e = Encoder()
    parts = [e.encode([h]) for h in HEADERS]
    return parts[0] + parts[1], parts[2], parts[3]


def half_block(name):
    """Sends half a header block (HEADERS without END_HEADERS) and waits."""
    s, conn = connect()
    f = HeadersFrame(1)
    f.flags.add("END_STREAM")
    f.data = fields_block()[0]
    start = time.monotonic()
    s.sendall(f.serialize())
    results[name] = until_closed_raw(s, start, ack=False)


def trickled_block(name):
    """A header block in three frames 300 ms apart (done well within the limit), then idle."""
    s, conn = connect()
    pieces = fields_block()
    f = HeadersFrame(1)
    f.flags.add("END_STREAM")
    f.data = pieces[0]
    s.sendall(f.serialize())
    time.sleep(0.3)
    c = ContinuationFrame(1)
    c.data = pieces[1]
    s.sendall(c.serialize())
    time.sleep(0.3)
    c = ContinuationFrame(1)
    c.flags.add("END_HEADERS")
    c.data = pieces[2]
    s.sendall(c.serialize())
    start = time.monotonic()
    results[name] = until_closed_raw(s, start)


def until_closed_raw(s, start, limit=15.0, ack=True):
    """For a connection whose streams the h2 library did not open: frame types only."""
    from hyperframe.frame import Frame
    goaway, statuses, buf = False, [], b""
    s.settimeout(0.2)
    while time.monotonic() - start < limit:
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            break
        if not data:
            break
        buf += data
        while len(buf) >= 9:
            f, length = Frame.parse_frame_header(memoryview(buf[:9]))
            if len(buf) < 9 + length:
                break
            if f.type == 0x7:
                goaway = True
            if f.type == 0x1:
                statuses.append("headers")
            if ack and f.type == 0x4 and "ACK" not in f.flags:
                s.sendall(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")  # SETTINGS ACK
            buf = buf[9 + length :]
    return round(time.monotonic() - start, 2), goaway, statuses


def idle_after_request(name):
    """One request answered, then nothing: idle from the answer."""
    s, conn = connect()
    conn.send_headers(1, HEADERS, end_stream=True)
    s.sendall(conn.data_to_send())
    start = time.monotonic()
    results[name] = until_closed(s, conn, start)


def busy(name, every=0.5, total=4.0):
    """A request every `every` s for `total` s, then idle."""
    s, conn = connect()
    start = time.monotonic()
    sid = 1
    goaway, statuses = False, []
    s.settimeout(0.05)
    next_at = start
    while time.monotonic() - start < total:
        if time.monotonic() >= next_at:
            conn.send_headers(sid, HEADERS, end_stream=True)
            s.sendall(conn.data_to_send())
            sid += 2
            next_at += every
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        if not data:
            break
        for e in conn.receive_data(data):
            if isinstance(e, h2.events.ConnectionTerminated):
                goaway = True
            if isinstance(e, h2.events.ResponseReceived):
                statuses.append(dict(e.headers).get(b":status", b"").decode())
        out = conn.data_to_send()
        if out:
            s.sendall(out)
    results[name + "_while_busy"] = (round(time.monotonic() - start, 2), goaway, statuses)
    results[name] = until_closed(s, conn, time.monotonic())


results = {}
threads = [
    threading.Thread(target=f, args=(n,))
    for f, n in [
        (half_block, "half"),
        (trickled_block, "trickled"),
        (idle_after_request, "idle"),
        (busy, "busy"),
    ]
]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(results))
"#;

/// Runs [`H2_PROBE`] against `port`: its JSON.
async fn h2_probe(port: u16) -> serde_json::Value {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args(["-c", H2_PROBE, &port.to_string()])
            .output()
            .expect("run python3")
    })
    .await
    .expect("the probe's thread");
    assert!(
        out.status.success(),
        "the HTTP/2 probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the probe's output {:?}: {e}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `GET path` on the admin listener: the body.
async fn admin_get(lb: &Lb, path: &str) -> String {
    let mut c = TcpStream::connect(("127.0.0.1", lb.admin))
        .await
        .expect("connect to the admin listener");
    let req = format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    c.write_all(req.as_bytes()).await.expect("send");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, c.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_header_blocks_are_bounded_by_client_header_and_idle_connections_get_goaway() {
    if !python_h2() {
        return;
    }
    let (addr, _seen) = backend("pool b").await;
    let lb = Lb::start(&format!(
        "[timeouts]\nclient_header = \"1s\"\nclient_h2_idle = \"3s\"\n\
         [pools.b]\ntargets = [{{ addr = \"{addr}\" }}]\n[pools.b.health_check]\nenabled = false\n"
    ))
    .await;
    let got = h2_probe(lb.port).await;
    let of = |name: &str| -> (f64, bool, Vec<String>) {
        let v = &got[name];
        let answers = v[2].as_array().expect("answers").iter();
        (
            v[0].as_f64().expect("seconds"),
            v[1].as_bool().expect("goaway"),
            answers
                .map(|a| a.as_str().unwrap_or_default().to_string())
                .collect(),
        )
    };
    let (secs, goaway, answers) = of("half");
    assert!(
        (0.9..2.0).contains(&secs) && goaway && answers.is_empty(),
        "half a header block: GOAWAY and closed after client_header (1s), not the idle \
         time (3s): {got}"
    );
    let (secs, goaway, answers) = of("trickled");
    assert_eq!(
        answers,
        ["headers"],
        "a block done within client_header is served: {got}"
    );
    assert!(
        (2.8..4.5).contains(&secs) && goaway,
        "then idle for client_h2_idle: {got}"
    );
    let (secs, goaway, answers) = of("idle");
    assert_eq!(answers, ["200"], "{got}");
    assert!(
        (2.8..4.5).contains(&secs) && goaway,
        "an idle connection gets GOAWAY and is closed after client_h2_idle (3s): {got}"
    );
    let (_, goaway, answers) = of("busy_while_busy");
    assert!(
        !goaway && answers.len() == 8 && answers.iter().all(|a| a == "200"),
        "a connection with requests every 500 ms is kept past client_h2_idle: {got}"
    );
    let (secs, goaway, _) = of("busy");
    assert!(
        (2.3..4.5).contains(&secs) && goaway,
        "idle from the end of its last stream: {got}"
    );
    let metrics = admin_get(&lb, "/metrics").await;
    assert!(
        metrics.contains("vigil_lb_timeouts_total{pool=\"none\",kind=\"client_header\"} 1"),
        "the header block's timeout is counted: {metrics}"
    );
    let log = lb.log();
    assert!(
        log.contains("HTTP/2 header block not done within timeouts.client_header"),
        "{log}"
    );
}

// ---------------------------------------------------------------------------------
// The connection limit.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_max_client_connections_get_503_and_a_closed_one_frees_its_place() {
    let (addr, _seen) = backend("pool b").await;
    let lb = Lb::start(&format!(
        "[limits]\nmax_client_connections = 3\n\
         [pools.b]\ntargets = [{{ addr = \"{addr}\" }}]\n[pools.b.health_check]\nenabled = false\n"
    ))
    .await;
    // Three open (the balancer has two workers: the count is the listener's): one
    // kept alive after a request, long enough to be parked, two that sent nothing.
    let mut kept = TcpStream::connect(("127.0.0.1", lb.port)).await.unwrap();
    kept.write_all(b"GET /k HTTP/1.1\r\nHost: b\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let head = tokio::time::timeout(WAIT, take_head(&mut kept, &mut buf))
        .await
        .expect("an answer in time")
        .expect("an answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let quiet: Vec<TcpStream> = idle_connections(2, lb.port).await;
    let gauge = |m: &str| {
        m.lines()
            .find(|l| l.starts_with("vigil_lb_client_connections{listener=\"listen\"}"))
            .map(|l| l.rsplit(' ').next().unwrap_or_default().to_string())
    };
    let until = |want: &'static str| {
        let lb = &lb;
        async move {
            let deadline = Instant::now() + WAIT;
            loop {
                let m = admin_get(lb, "/metrics").await;
                if gauge(&m).as_deref() == Some(want) {
                    return m;
                }
                assert!(
                    Instant::now() < deadline,
                    "client_connections != {want}: {m}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    until("3").await;
    tokio::time::sleep(Duration::from_millis(400)).await; // `kept` is parked by now
    let (status, text) = exchange(&lb, b"GET /over HTTP/1.1\r\nHost: b\r\n\r\n").await;
    assert_eq!(status, 503, "the fourth connection is refused: {text:?}");
    let lower = text.to_ascii_lowercase();
    assert!(
        lower.contains("retry-after: 1")
            && lower.contains("connection: close")
            && text.contains("limits.max_client_connections"),
        "a clear refusal: {text:?}"
    );
    let m = until("3").await;
    assert!(
        m.contains("vigil_lb_client_connections_refused_total{listener=\"listen\"} 1"),
        "{m}"
    );
    assert!(
        lb.log().contains("limits.max_client_connections"),
        "the refusal is logged: {}",
        lb.log()
    );
    // The parked one closes: its place is free again, and the parked ones' count held.
    drop(kept);
    until("2").await;
    let (status, text) = exchange(
        &lb,
        b"GET /again HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200, "{text:?}");
    drop(quiet);
    until("0").await;
}

/// `n` connections to `port` that send nothing.
async fn idle_connections(n: usize, port: u16) -> Vec<TcpStream> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect"),
        );
    }
    out
}
