//! Real-process tests of `vigil lb`'s client side (`vigil_lb::downstream`): the real binary
//! on loopback, raw sockets on the client side, and scripted raw backends (tokio) that
//! record exactly which requests reached them. Health checks are off so that the only
//! requests a backend sees are the ones the tests send. Every read is bounded in time.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest wait for any answer.
const WAIT: Duration = Duration::from_secs(5);

use crate::lb_support;
use lb_support::{LbProcess as Lb, fill, serve_each, take_exact, take_head};

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Deterministic body bytes.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| b'a' + (i % 26) as u8).collect()
}

// ---------------------------------------------------------------------------------
// Reading HTTP/1.1 off a socket (both sides).

async fn take_line<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(p) = buf.windows(2).position(|w| w == b"\r\n") {
            let mut line: Vec<u8> = buf.drain(..p + 2).collect();
            line.truncate(p);
            return Some(line);
        }
        if !fill(r, buf).await {
            return None;
        }
    }
}

/// A chunked body, decoded (`None`: cut short or malformed).
async fn take_chunked<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = take_line(r, buf).await?;
        let size = lossy(&line);
        let size = size.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16).ok()?;
        if size == 0 {
            // Trailer fields, up to the empty line.
            while !take_line(r, buf).await?.is_empty() {}
            return Some(body);
        }
        let data = take_exact(r, buf, size + 2).await?;
        if &data[size..] != b"\r\n" {
            return None;
        }
        body.extend_from_slice(&data[..size]);
    }
}

/// Everything until the peer closes.
async fn take_rest<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> Vec<u8> {
    while fill(r, buf).await {}
    std::mem::take(buf)
}

/// Values of the field `name` (lower case) in a lower-cased head.
fn fields<'h>(head: &'h str, name: &str) -> Vec<&'h str> {
    head.split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.trim() == name)
        .map(|(_, v)| v.trim())
        .collect()
}

fn content_length(head: &str) -> Option<usize> {
    fields(head, "content-length")
        .first()
        .map(|v| v.parse().expect("numeric content-length"))
}

fn is_chunked(head: &str) -> bool {
    fields(head, "transfer-encoding")
        .iter()
        .any(|v| v.ends_with("chunked"))
}

/// A response as a client read it.
#[derive(Debug)]
struct Resp {
    status: u16,
    /// The head, lower-cased.
    head: String,
    /// The body (decoded when it came chunked).
    body: Vec<u8>,
    /// It came chunked.
    chunked: bool,
}

impl Resp {
    fn field(&self, name: &str) -> Vec<&str> {
        fields(&self.head, name)
    }
}

async fn read_response<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    head_request: bool,
) -> Resp {
    let read = async {
        let Some(head) = take_head(r, buf).await else {
            panic!(
                "the connection closed before a response head; read {:?}",
                lossy(buf)
            );
        };
        let head = head.to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 "), "status line: {head:?}");
        let status: u16 = head[9..12].parse().expect("status code");
        let bodiless = head_request || status < 200 || status == 204 || status == 304;
        let (body, chunked) = if bodiless {
            (Vec::new(), false)
        } else if is_chunked(&head) {
            let body = take_chunked(r, buf)
                .await
                .unwrap_or_else(|| panic!("chunked body cut short or malformed: {head}"));
            (body, true)
        } else if let Some(n) = content_length(&head) {
            let body = take_exact(r, buf, n)
                .await
                .unwrap_or_else(|| panic!("body shorter than its content-length: {head}"));
            (body, false)
        } else {
            (take_rest(r, buf).await, false)
        };
        Resp {
            status,
            head,
            body,
            chunked,
        }
    };
    tokio::time::timeout(WAIT, read)
        .await
        .expect("a whole response within 5 s")
}

/// A client connection to the balancer.
struct Client {
    tcp: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(port: u16) -> Client {
        Client {
            tcp: TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect to vigil lb"),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).await.expect("write a request");
    }

    async fn response(&mut self) -> Resp {
        read_response(&mut self.tcp, &mut self.buf, false).await
    }

    async fn head_response(&mut self) -> Resp {
        read_response(&mut self.tcp, &mut self.buf, true).await
    }

    /// Sends `req` and reads its answer.
    async fn roundtrip(&mut self, req: &[u8]) -> Resp {
        self.send(req).await;
        self.response().await
    }

    /// Everything else the balancer sends, until it closes (within 5 s).
    /// The next response head alone (lower case); its body is left to read.
    async fn head_only(&mut self) -> String {
        tokio::time::timeout(WAIT, take_head(&mut self.tcp, &mut self.buf))
            .await
            .expect("a head in time")
            .expect("a head")
            .to_ascii_lowercase()
    }

    async fn rest(&mut self) -> Vec<u8> {
        tokio::time::timeout(WAIT, take_rest(&mut self.tcp, &mut self.buf))
            .await
            .expect("the balancer closes the connection within 5 s")
    }

    /// The balancer closed the connection with nothing more to say.
    async fn expect_closed(&mut self, what: &str) {
        let rest = self.rest().await;
        assert!(rest.is_empty(), "{what}: more bytes: {:?}", lossy(&rest));
    }

    /// Nothing more arrives for a while (and the connection is still open).
    async fn expect_quiet(&mut self, what: &str) {
        assert!(
            self.buf.is_empty(),
            "{what}: extra bytes {:?}",
            lossy(&self.buf)
        );
        let mut b = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(300), self.tcp.read(&mut b)).await {
            Err(_) => {}
            Ok(Ok(0)) => panic!("{what}: the balancer closed the connection"),
            Ok(Ok(n)) => panic!("{what}: extra bytes {:?}", lossy(&b[..n])),
            Ok(Err(e)) => panic!("{what}: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------
// Backends.

/// A request as a backend received it.
#[derive(Clone, Debug)]
struct Seen {
    /// The request line, as sent.
    line: String,
    /// The whole head, lower-cased.
    head: String,
    /// The body (decoded when chunked).
    body: Vec<u8>,
}

impl Seen {
    fn field(&self, name: &str) -> Vec<&str> {
        fields(&self.head, name)
    }
}

/// What a backend answers.
struct Reply {
    bytes: Vec<u8>,
    /// Close the connection after the answer.
    close: bool,
    delay: Duration,
}

impl Reply {
    fn keep(bytes: impl Into<Vec<u8>>) -> Reply {
        Reply {
            bytes: bytes.into(),
            close: false,
            delay: Duration::ZERO,
        }
    }

    fn close(bytes: impl Into<Vec<u8>>) -> Reply {
        Reply {
            close: true,
            ..Reply::keep(bytes)
        }
    }
}

fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// What [`echo`] answers for a request line and body.
fn echoed(line: &str, body: &[u8]) -> String {
    let sum: u64 = body.iter().map(|b| u64::from(*b)).sum();
    format!("{line} len={} sum={sum}", body.len())
}

/// Answers the request line, body length and byte sum.
fn echo(s: &Seen) -> Reply {
    Reply::keep(ok(&echoed(&s.line, &s.body)))
}

struct Backend {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Backend {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn lines(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.line).collect()
    }
}

/// A keep-alive HTTP/1.1 backend: reads each request whole (Content-Length or chunked),
/// records it, and answers what `handler` says.
async fn backend(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Backend {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (log, handler) = (seen.clone(), Arc::new(handler));
    let addr = serve_each(move |mut c| {
        let (log, handler) = (log.clone(), handler.clone());
        async move {
            let mut buf = Vec::new();
            loop {
                let Some(raw) = take_head(&mut c, &mut buf).await else {
                    return;
                };
                let line = raw.split("\r\n").next().unwrap_or_default().to_string();
                let head = raw.to_ascii_lowercase();
                let body = if is_chunked(&head) {
                    take_chunked(&mut c, &mut buf).await
                } else {
                    take_exact(&mut c, &mut buf, content_length(&head).unwrap_or(0)).await
                };
                let Some(body) = body else { return };
                let s = Seen { line, head, body };
                log.lock().unwrap().push(s.clone());
                let reply = handler(&s);
                tokio::time::sleep(reply.delay).await;
                if c.write_all(&reply.bytes).await.is_err() || reply.close {
                    return;
                }
            }
        }
    })
    .await;
    Backend { addr, seen }
}

/// A backend that reads only the request head, answers `answer`, holds the connection
/// for `hold` without reading any more, and closes it.
async fn head_only_backend(answer: &'static [u8], hold: Duration) -> Backend {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let addr = serve_each(move |mut c| {
        let log = log.clone();
        async move {
            let mut buf = Vec::new();
            let Some(raw) = take_head(&mut c, &mut buf).await else {
                return;
            };
            log.lock().unwrap().push(Seen {
                line: raw.split("\r\n").next().unwrap_or_default().to_string(),
                head: raw.to_ascii_lowercase(),
                body: Vec::new(),
            });
            let _ = c.write_all(answer).await;
            tokio::time::sleep(hold).await;
            // Dropped with the body unread: the kernel resets the connection.
        }
    })
    .await;
    Backend { addr, seen }
}

// ---------------------------------------------------------------------------------
// The balancer.

/// A configuration with one pool `api` of `targets`, health checks off. `top`: top-level
/// sections (`[timeouts]`, `[limits]`); `pool`: more keys of `[pools.api]`.
fn config(top: &str, pool: &str, targets: &[SocketAddr]) -> String {
    let items: Vec<String> = targets
        .iter()
        .map(|a| format!("{{ addr = \"{a}\" }}"))
        .collect();
    format!(
        "{top}\n[pools.api]\ntargets = [{}]\n{pool}\n[pools.api.health_check]\nenabled = false\n",
        items.join(", ")
    )
}

/// A raw client of the balancer's proxy port.
async fn client_of(lb: &Lb) -> Client {
    Client::connect(lb.port).await
}

/// A balancer (top-level sections `top`) in front of one backend answering with
/// `handler`.
async fn setup(
    top: &str,
    handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
) -> (Lb, Backend) {
    let b = backend(handler).await;
    let lb = Lb::start(&config(top, "", &[b.addr])).await;
    (lb, b)
}

/// A balancer in front of one [`echo`] backend.
async fn echo_setup(top: &str) -> (Lb, Backend) {
    setup(top, echo).await
}

// ---------------------------------------------------------------------------------
// (a) Pipelining.

/// The scheduler slice of each of `lb`'s threads named `vigil-lb-<n>` (its workers), by
/// name, read with `sched_getattr` from outside the process.
fn worker_slices(lb: &Lb) -> Vec<(String, Option<Duration>)> {
    vigil_testkit::thread_slices(lb.child.id())
        .into_iter()
        .filter(|t| {
            t.name
                .strip_prefix("vigil-lb-")
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .map(|t| (t.name, t.slice))
        .collect()
}

/// `worker_slice`: each worker thread runs on the turn asked for (300 us by default) and
/// the log says so; the main thread (the control side: health checks, admin) keeps the
/// kernel's; "0s" asks for nothing. Skipped on a kernel without the setting (before Linux 6.12).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_run_on_the_scheduler_turns_asked_for() {
    let Ok(Some(default)) = vigil_sys::thread_slice() else {
        eprintln!("skipped: this kernel has no scheduler slice setting (Linux 6.12 and later)");
        return;
    };
    let pool = "[pools.p]\ntargets = [{ addr = \"127.0.0.1:9\" }]\n[pools.p.health_check]\nenabled = false\n";
    for (top, want) in [
        ("", Duration::from_micros(300)),
        ("worker_slice = \"100us\"\n", Duration::from_micros(100)),
        ("worker_slice = \"0s\"\n", default),
    ] {
        let lb = Lb::start(&format!("{top}{pool}")).await;
        let expected = [
            ("vigil-lb-0".to_string(), Some(want)),
            ("vigil-lb-1".to_string(), Some(want)),
        ];
        let asks = top != "worker_slice = \"0s\"\n";
        // The workers ask as they start, which may be just after the admin answers.
        let deadline = Instant::now() + WAIT;
        let mut slices = worker_slices(&lb);
        while (slices != expected || lb.log().contains("worker threads run on") != asks)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
            slices = worker_slices(&lb);
        }
        assert_eq!(slices, expected, "{top:?}\n{}", lb.log());
        assert_eq!(
            lb.log().contains("worker threads run on"),
            asks,
            "{}",
            lb.log()
        );
        let main = vigil_testkit::thread_slices(lb.child.id())
            .into_iter()
            .find(|t| t.tid == lb.child.id())
            .expect("the main thread")
            .slice;
        assert_eq!(
            main,
            Some(default),
            "the main thread keeps the kernel's turn"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_in_one_write_are_answered_in_order() {
    let (lb, b) = echo_setup("").await;
    let mut c = client_of(&lb).await;
    c.send(
        b"GET /one HTTP/1.1\r\nHost: a\r\n\r\n\
          POST /two HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\
          GET /three HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await;
    for (line, body) in [
        ("GET /one HTTP/1.1", &b""[..]),
        ("POST /two HTTP/1.1", b"hello"),
        ("GET /three HTTP/1.1", b""),
    ] {
        let r = c.response().await;
        assert_eq!(r.status, 200, "{line}: {r:?}");
        assert_eq!(lossy(&r.body), echoed(line, body), "answers in order");
    }
    c.expect_quiet("after three answers").await;
    assert_eq!(
        b.lines(),
        [
            "GET /one HTTP/1.1",
            "POST /two HTTP/1.1",
            "GET /three HTTP/1.1"
        ]
    );

    // A body too large to buffer (streamed through) with the next request right behind
    // it in the same write: the body ends where its length says, not later or earlier.
    let big = pattern(100_000);
    let mut req = format!(
        "PUT /big HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
        big.len()
    )
    .into_bytes();
    req.extend_from_slice(&big);
    req.extend_from_slice(b"GET /after-big HTTP/1.1\r\nHost: a\r\n\r\n");
    let mut c = client_of(&lb).await;
    c.send(&req).await;
    let r = c.response().await;
    assert_eq!(lossy(&r.body), echoed("PUT /big HTTP/1.1", &big));
    let r = c.response().await;
    assert_eq!(lossy(&r.body), echoed("GET /after-big HTTP/1.1", b""));
    c.expect_quiet("after the streamed body").await;
    assert_eq!(b.lines().len(), 5, "{:?}", b.lines());
}

// ---------------------------------------------------------------------------------
// (b) Expect: 100-continue.

/// Reads exactly the interim `100 Continue` answer, and nothing else.
async fn expect_continue(c: &mut Client, what: &str) {
    const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
    let got = tokio::time::timeout(WAIT, take_exact(&mut c.tcp, &mut c.buf, CONTINUE.len()))
        .await
        .unwrap_or_else(|_| panic!("{what}: no 100 Continue within 5 s"))
        .unwrap_or_else(|| panic!("{what}: closed instead of 100 Continue"));
    assert_eq!(lossy(&got), lossy(CONTINUE), "{what}");
    c.expect_quiet(what).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let (lb, b) = echo_setup("").await;
    for (path, size) in [("/small", 5usize), ("/streamed", 100_000)] {
        let mut c = client_of(&lb).await;
        c.send(
            format!(
                "POST {path} HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: {size}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        expect_continue(&mut c, path).await;
        let body = pattern(size);
        let r = c.roundtrip(&body).await;
        assert_eq!(r.status, 200, "{path}: {r:?}");
        let line = format!("POST {path} HTTP/1.1");
        assert_eq!(lossy(&r.body), echoed(&line, &body), "{path}");
        let seen = b.seen();
        let s = seen.iter().find(|s| s.line == line).expect("forwarded");
        assert_eq!(s.body, body, "{path}: the backend got the body");
        assert!(
            s.field("expect").is_empty(),
            "{path}: the expectation was met here, not forwarded: {}",
            s.head
        );
        // The connection goes on.
        let r = c.roundtrip(b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(lossy(&r.body), echoed("GET /next HTTP/1.1", b""), "{path}");
    }
}

// ---------------------------------------------------------------------------------
// (c) HTTP/1.0 and Connection: close.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_closes_unless_kept_alive_and_close_is_honoured() {
    let (lb, b) = echo_setup("").await;

    let mut c = client_of(&lb).await;
    let r = c.roundtrip(b"GET /ten HTTP/1.0\r\n\r\n").await;
    assert_eq!(r.status, 200);
    assert_eq!(lossy(&r.body), echoed("GET /ten HTTP/1.1", b""));
    assert!(r.field("connection").contains(&"close"), "{}", r.head);
    c.expect_closed("HTTP/1.0 without keep-alive").await;

    let mut c = client_of(&lb).await;
    for path in ["/ka1", "/ka2"] {
        let r = c
            .roundtrip(format!("GET {path} HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").as_bytes())
            .await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(lossy(&r.body), echoed(&format!("GET {path} HTTP/1.1"), b""));
        assert_eq!(
            r.field("connection"),
            ["keep-alive"],
            "an HTTP/1.0 client is told the connection stays: {}",
            r.head
        );
    }
    // The last one without keep-alive: answered, then closed.
    let r = c.roundtrip(b"GET /ka3 HTTP/1.0\r\n\r\n").await;
    assert_eq!(lossy(&r.body), echoed("GET /ka3 HTTP/1.1", b""));
    c.expect_closed("HTTP/1.0 after keep-alive").await;

    // HTTP/1.1 with Connection: close, and a request pipelined after it is not served.
    let mut c = client_of(&lb).await;
    let r = c
        .roundtrip(
            b"GET /bye HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n\
              GET /never HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .await;
    assert_eq!(lossy(&r.body), echoed("GET /bye HTTP/1.1", b""));
    assert!(r.field("connection").contains(&"close"), "{}", r.head);
    c.expect_closed("HTTP/1.1 Connection: close").await;
    assert!(
        !b.lines().iter().any(|l| l.contains("/never")),
        "{:?}",
        b.lines()
    );
    assert_eq!(b.lines().len(), 5, "{:?}", b.lines());
}

// ---------------------------------------------------------------------------------
// (d) Bodies without a length: re-chunked for HTTP/1.1, raw until close for HTTP/1.0.

/// 50 000 bytes of [`pattern`] in three chunks (one with an extension) and a trailer.
fn chunked_answer() -> Vec<u8> {
    let body = pattern(50_000);
    let mut out =
        b"HTTP/1.1 200 OK\r\nx-kind: chunked\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for (i, piece) in [&body[..5], &body[5..30_005], &body[30_005..]]
        .iter()
        .enumerate()
    {
        let ext = if i == 1 { ";name=value" } else { "" };
        out.extend_from_slice(format!("{:x}{ext}\r\n", piece.len()).as_bytes());
        out.extend_from_slice(piece);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\nx-trailer: t\r\n\r\n");
    out
}

fn length_less_answers(s: &Seen) -> Reply {
    if s.line.contains("/chunked") {
        Reply::keep(chunked_answer())
    } else if s.line.contains("/until-close") {
        let mut out = b"HTTP/1.1 200 OK\r\nx-kind: until-close\r\n\r\n".to_vec();
        out.extend_from_slice(&pattern(50_000));
        Reply::close(out)
    } else {
        echo(s)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_without_a_length_are_rechunked_for_http11_and_raw_until_close_for_http10() {
    let (lb, _b) = setup("", length_less_answers).await;
    let want = pattern(50_000);

    let mut c = client_of(&lb).await;
    for path in ["/chunked", "/until-close", "/chunked", "/until-close"] {
        let r = c
            .roundtrip(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
            .await;
        assert_eq!(r.status, 200, "{path}");
        assert!(
            r.chunked,
            "{path}: chunked to an HTTP/1.1 client: {}",
            r.head
        );
        assert_eq!(
            r.field("transfer-encoding"),
            ["chunked"],
            "{path}: one transfer-encoding: {}",
            r.head
        );
        assert!(r.field("content-length").is_empty(), "{path}: {}", r.head);
        assert!(r.field("connection").is_empty(), "{path}: {}", r.head);
        assert_eq!(r.field("x-kind"), [&path[1..]], "{path}");
        assert_eq!(r.body.len(), want.len(), "{path}");
        assert!(r.body == want, "{path}: the decoded body differs");
    }
    c.expect_quiet("the HTTP/1.1 connection stays").await;

    for (path, ka) in [
        ("/chunked", ""),
        ("/until-close", ""),
        ("/chunked", "Connection: keep-alive\r\n"),
    ] {
        let mut c = client_of(&lb).await;
        let r = c
            .roundtrip(format!("GET {path} HTTP/1.0\r\n{ka}\r\n").as_bytes())
            .await;
        assert_eq!(r.status, 200, "{path}");
        assert!(
            !r.chunked && r.field("transfer-encoding").is_empty(),
            "{path}: an HTTP/1.0 client knows no chunked coding: {}",
            r.head
        );
        assert!(r.field("content-length").is_empty(), "{path}: {}", r.head);
        assert!(
            r.field("connection").contains(&"close"),
            "{path} {ka:?}: {}",
            r.head
        );
        assert!(
            r.body == want,
            "{path}: raw body differs ({} bytes)",
            r.body.len()
        );
        c.expect_closed(path).await;
    }
}

// ---------------------------------------------------------------------------------
// (e) Request smuggling.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_request_framing_gets_400_and_nothing_reaches_the_backend() {
    let (lb, b) = echo_setup("").await;
    let smuggled = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n";
    for (what, head, body) in [
        (
            "TE chunked and CL",
            "POST /te-cl HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n",
            "0\r\n\r\n",
        ),
        (
            "CL and TE chunked",
            "POST /cl-te HTTP/1.1\r\nHost: a\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n",
            "0\r\n\r\n",
        ),
        (
            "TE gzip",
            "POST /gzip HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
            "",
        ),
        (
            "TE chunked, gzip",
            "POST /chunked-gzip HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            "0\r\n\r\n",
        ),
        (
            "TE gzip then TE chunked",
            "POST /te-te HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
            "0\r\n\r\n",
        ),
        (
            "two Content-Lengths",
            "POST /cl-cl HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 37\r\n\r\n",
            "",
        ),
        (
            "a list Content-Length",
            "POST /cl-list HTTP/1.1\r\nHost: a\r\nContent-Length: 0, 37\r\n\r\n",
            "",
        ),
        (
            "chunked in HTTP/1.0",
            "POST /ten-chunked HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            "0\r\n\r\n",
        ),
        (
            "space before the colon",
            "POST /space HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n",
            "0\r\n\r\n",
        ),
    ] {
        let mut c = client_of(&lb).await;
        c.send(format!("{head}{body}{smuggled}").as_bytes()).await;
        let r = c.response().await;
        assert_eq!(r.status, 400, "{what}: {r:?}");
        assert!(
            r.field("connection").contains(&"close"),
            "{what}: {}",
            r.head
        );
        c.expect_closed(what).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        b.lines(),
        Vec::<String>::new(),
        "the backend saw requests it must not"
    );
    // The balancer still serves.
    let r = client_of(&lb)
        .await
        .roundtrip(b"GET /fine HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    assert_eq!(lossy(&r.body), echoed("GET /fine HTTP/1.1", b""));
}

// ---------------------------------------------------------------------------------
// (f) A chunked request body.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_request_body_reaches_the_backend_intact_and_the_next_request_follows() {
    let (lb, b) = echo_setup("").await;
    let big = pattern(70_000);
    let mut want = b"hello".to_vec();
    want.extend_from_slice(b"abcdefghijklmnopqrstuvwxyz");
    want.extend_from_slice(&big);

    let mut c = client_of(&lb).await;
    c.send(b"POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await;
    let mut pieces: Vec<Vec<u8>> = vec![
        b"5;ext=1\r\nhello\r\n".to_vec(),
        b"1a\r\nabcdefghijklmnopqrstuvwxyz\r\n".to_vec(),
    ];
    let mut p = format!("{:x}\r\n", big.len()).into_bytes();
    p.extend_from_slice(&big);
    p.extend_from_slice(b"\r\n");
    pieces.push(p);
    pieces.push(b"0\r\nx-trailer: 1\r\n\r\nGET /after HTTP/1.1\r\nHost: a\r\n\r\n".to_vec());
    for p in pieces {
        c.send(&p).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = c.response().await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(lossy(&r.body), echoed("POST /up HTTP/1.1", &want));
    let r = c.response().await;
    assert_eq!(lossy(&r.body), echoed("GET /after HTTP/1.1", b""));
    c.expect_quiet("after the chunked body").await;

    let seen = b.seen();
    assert_eq!(b.lines(), ["POST /up HTTP/1.1", "GET /after HTTP/1.1"]);
    let up = &seen[0];
    assert_eq!(up.field("transfer-encoding"), ["chunked"], "{}", up.head);
    assert!(up.field("content-length").is_empty(), "{}", up.head);
    assert!(
        up.body == want,
        "decoded body differs ({} bytes)",
        up.body.len()
    );
}

// ---------------------------------------------------------------------------------
// (g) A target answering before the whole (streamed) body was sent.

/// Sends a POST of `size` bytes (head and body) from a task of its own, reads the answer.
async fn post_reading_answer(lb: &Lb, size: usize) -> Resp {
    let tcp = TcpStream::connect(("127.0.0.1", lb.port)).await.unwrap();
    let (mut rd, mut wr) = tcp.into_split();
    let writer = tokio::spawn(async move {
        let body = pattern(size);
        let head = format!(
            "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        // The balancer may stop reading (and reset) once the target has answered.
        if wr.write_all(head.as_bytes()).await.is_ok() {
            let _ = wr.write_all(&body).await;
        }
        wr
    });
    let mut buf = Vec::new();
    let r = read_response(&mut rd, &mut buf, false).await;
    writer.abort();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_refusing_a_large_body_and_closing_gets_its_413_to_the_client() {
    let b = head_only_backend(
        b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 8\r\nconnection: close\r\n\r\ntoo big\n",
        Duration::ZERO,
    )
    .await;
    let lb = Lb::start(&config("", "", &[b.addr])).await;
    for _ in 0..3 {
        let r = post_reading_answer(&lb, 2 * 1024 * 1024).await;
        assert_eq!(r.status, 413, "{r:?}\nlog:\n{}", lb.log());
        assert_eq!(r.body, b"too big\n");
    }
    assert!(b.lines().iter().all(|l| l == "POST /upload HTTP/1.1"));
}

/// The same early answer, from a target that keeps the connection open without reading
/// the rest of the body (as servers that answer before the body commonly do for a while):
/// the client must get the answer, not a 504 after the response-header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_refusing_a_large_body_without_closing_gets_its_413_to_the_client() {
    let b = head_only_backend(
        b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 8\r\nconnection: close\r\n\r\ntoo big\n",
        Duration::from_secs(8),
    )
    .await;
    let lb = Lb::start(&config(
        "[timeouts]\nresponse_header = \"3s\"\n",
        "",
        &[b.addr],
    ))
    .await;
    // More than loopback's socket buffers hold between the balancer and the target.
    let r = post_reading_answer(&lb, 32 * 1024 * 1024).await;
    assert_eq!(r.status, 413, "{r:?}");
}

// ---------------------------------------------------------------------------------
// (h) HEAD, 204 and 304.

fn head_answers(s: &Seen) -> Reply {
    if s.line.starts_with("HEAD /chunked") {
        Reply::keep(&b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-head: c\r\n\r\n"[..])
    } else if s.line.starts_with("HEAD ") {
        Reply::keep(&b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\nx-head: yes\r\n\r\n"[..])
    } else if s.line.contains("/204") {
        Reply::keep(&b"HTTP/1.1 204 No Content\r\nx-no: content\r\n\r\n"[..])
    } else if s.line.contains("/304") {
        Reply::keep(&b"HTTP/1.1 304 Not Modified\r\netag: \"v1\"\r\n\r\n"[..])
    } else {
        echo(s)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_204_and_304_answers_have_no_body_and_keep_the_connection() {
    let (lb, b) = setup("", head_answers).await;
    let mut c = client_of(&lb).await;

    c.send(b"HEAD /h HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let r = c.head_response().await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.field("content-length"),
        ["1234"],
        "the target's length: {}",
        r.head
    );
    assert_eq!(r.field("x-head"), ["yes"]);
    c.expect_quiet("no body after a HEAD answer").await;

    c.send(b"HEAD /chunked HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let r = c.head_response().await;
    assert_eq!(r.status, 200);
    assert_eq!(r.field("x-head"), ["c"]);
    assert!(r.field("content-length").is_empty(), "{}", r.head);
    c.expect_quiet("no body (not even a last chunk) after a HEAD answer")
        .await;

    for (path, status) in [("/204", 204u16), ("/304", 304)] {
        let r = c
            .roundtrip(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
            .await;
        assert_eq!(r.status, status, "{r:?}");
        assert!(
            r.field("transfer-encoding").is_empty() && r.field("content-length").is_empty(),
            "{path}: no framing added to a bodiless answer: {}",
            r.head
        );
        c.expect_quiet(path).await;
    }
    let r = c.roundtrip(b"GET /g HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(lossy(&r.body), echoed("GET /g HTTP/1.1", b""));
    assert_eq!(
        b.lines(),
        [
            "HEAD /h HTTP/1.1",
            "HEAD /chunked HTTP/1.1",
            "GET /204 HTTP/1.1",
            "GET /304 HTTP/1.1",
            "GET /g HTTP/1.1"
        ]
    );
}

// ---------------------------------------------------------------------------------
// (i) Absolute-form request targets.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_reaches_the_backend_in_origin_form() {
    let (lb, b) = echo_setup("").await;
    let mut c = client_of(&lb).await;
    let r = c
        .roundtrip(b"GET http://whatever/p?x=1 HTTP/1.1\r\nHost: whatever\r\n\r\n")
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(lossy(&r.body), echoed("GET /p?x=1 HTTP/1.1", b""));
    let r = c
        .roundtrip(b"GET http://whatever HTTP/1.1\r\nHost: whatever\r\n\r\n")
        .await;
    assert_eq!(lossy(&r.body), echoed("GET / HTTP/1.1", b""));
    let seen = b.seen();
    assert_eq!(b.lines(), ["GET /p?x=1 HTTP/1.1", "GET / HTTP/1.1"]);
    for s in &seen {
        assert_eq!(s.field("host"), ["whatever"], "{}", s.head);
    }
    // RFC 9112 3.2: an HTTP/1.1 request without Host is a 400, absolute form or not.
    let r = client_of(&lb)
        .await
        .roundtrip(b"GET http://whatever/p HTTP/1.1\r\n\r\n")
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(b.lines().len(), 2, "nothing more reached the backend");
}

/// RFC 9112 3.2.2: a proxy receiving the absolute form MUST ignore the received Host
/// and send one made from the request target (the balancer routes by the authority, so
/// a different Host reaching the target is a host confusion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_replaces_a_conflicting_host() {
    let host = host_the_target_sees(b"GET http://a.example/p HTTP/1.1\r\nHost: b.example\r\n\r\n");
    assert_eq!(host.await, ["a.example"]);
}

/// Sends `request` through a balancer to an [`echo`] backend; the `Host` values the
/// backend received.
async fn host_the_target_sees(request: &[u8]) -> Vec<String> {
    let (lb, b) = echo_setup("").await;
    let r = client_of(&lb).await.roundtrip(request).await;
    assert_eq!(r.status, 200, "{r:?}");
    let seen = b.seen();
    seen[0]
        .field("host")
        .into_iter()
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------------------------
// Truncated target answers: the client must see the truncation.

fn truncating_answers(s: &Seen) -> Reply {
    if s.line.contains("/short-length") {
        let mut out = b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n".to_vec();
        out.extend_from_slice(&pattern(30_000));
        Reply::close(out)
    } else if s.line.contains("/short-chunked") {
        Reply::close(
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n3\r\nabc\r\n"[..],
        )
    } else {
        echo(s)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_target_answer_reaches_the_client_truncated() {
    let (lb, _b) = setup("", truncating_answers).await;
    for version in ["1.1", "1.0"] {
        let mut c = client_of(&lb).await;
        c.send(format!("GET /short-length HTTP/{version}\r\nHost: a\r\n\r\n").as_bytes())
            .await;
        let head = c.head_only().await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert_eq!(fields(&head, "content-length"), ["100000"], "{head}");
        let rest = c.rest().await;
        assert_eq!(
            rest.len(),
            30_000,
            "HTTP/{version}: only what the target sent"
        );
    }

    let mut c = client_of(&lb).await;
    c.send(b"GET /short-chunked HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    let head = c.head_only().await;
    assert!(is_chunked(&head), "{head}");
    let rest = lossy(&c.rest().await);
    assert!(rest.contains("hello") && rest.contains("abc"), "{rest:?}");
    assert!(
        !rest.contains("0\r\n\r\n"),
        "no last chunk: the client must see the body was cut: {rest:?}"
    );
}

// ---------------------------------------------------------------------------------
// Graceful shutdown.

fn slow_answers(s: &Seen) -> Reply {
    let mut r = echo(s);
    if s.line.contains("/slow") {
        r.delay = Duration::from_millis(1500);
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_idle_keep_alive_connections_and_finishes_in_flight_ones() {
    let b = backend(slow_answers).await;
    let mut lb = Lb::start(&config("", "", &[b.addr])).await;
    let mut idle = client_of(&lb).await;
    let r = idle
        .roundtrip(b"GET /warm HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    assert_eq!(r.status, 200);
    let mut busy = client_of(&lb).await;
    busy.send(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let sent = Instant::now();
    lb.signal("TERM");

    idle.expect_closed("an idle keep-alive connection on SIGTERM")
        .await;
    assert!(
        sent.elapsed() < Duration::from_secs(1),
        "the idle connection closed at once, not at the end of the drain: {:?}",
        sent.elapsed()
    );
    let r = busy.response().await;
    assert_eq!(r.status, 200, "the in-flight request finishes");
    assert_eq!(lossy(&r.body), echoed("GET /slow HTTP/1.1", b""));
    assert!(r.field("connection").contains(&"close"), "{}", r.head);
    busy.expect_closed("after the drained answer").await;

    let deadline = Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Some(s) = lb.child.try_wait().unwrap() {
            break s.code();
        }
        assert!(Instant::now() < deadline, "vigil lb did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code, Some(0), "log:\n{}", lb.log());
}

// ---------------------------------------------------------------------------------
// Hostile or failing clients.

/// A client connection's read buffer starts at 1 KiB (`spare::CLIENT_READ`): heads
/// larger than that, whole or trickled in pieces, and pipelined behind each other, reach
/// the target unchanged; one over `limits.max_header_bytes` (16 KiB) gets 431.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_larger_than_the_first_read_buffer_are_forwarded_whole() {
    let (lb, b) = echo_setup("").await;
    let cookie = |n: usize| "c".repeat(n);
    let mut c = client_of(&lb).await;
    for n in [900, 1_100, 3_000, 9_500, 15_000] {
        let req = format!(
            "GET /big{n} HTTP/1.1\r\nHost: a\r\nCookie: {}\r\n\r\n",
            cookie(n)
        );
        let r = c.roundtrip(req.as_bytes()).await;
        assert_eq!(r.status, 200, "a {n}-byte field: {r:?}");
    }
    // Trickled: the head arrives in 700-byte pieces.
    let req = format!(
        "GET /trickled HTTP/1.1\r\nHost: a\r\nCookie: {}\r\n\r\n",
        cookie(5_000)
    );
    for piece in req.as_bytes().chunks(700) {
        c.send(piece).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(c.response().await.status, 200);
    // Pipelined: three large heads in one write.
    let three: String = (0..3)
        .map(|i| {
            format!(
                "GET /piped{i} HTTP/1.1\r\nHost: a\r\nCookie: {}\r\n\r\n",
                cookie(2_000 + i)
            )
        })
        .collect();
    c.send(three.as_bytes()).await;
    for i in 0..3 {
        assert_eq!(c.response().await.status, 200, "pipelined request {i}");
    }
    let seen = b.seen();
    let sizes: Vec<(String, usize)> = seen
        .iter()
        .map(|s| {
            (
                s.line.clone(),
                s.field("cookie").first().map_or(0, |v| v.len()),
            )
        })
        .collect();
    let want: Vec<(String, usize)> = [900, 1_100, 3_000, 9_500, 15_000]
        .into_iter()
        .map(|n| (format!("GET /big{n} HTTP/1.1"), n))
        .chain([("GET /trickled HTTP/1.1".to_string(), 5_000)])
        .chain((0..3).map(|i| (format!("GET /piped{i} HTTP/1.1"), 2_000 + i)))
        .collect();
    assert_eq!(sizes, want, "every head reaches the target whole, in order");

    let mut c = client_of(&lb).await;
    let req = format!(
        "GET /huge HTTP/1.1\r\nHost: a\r\nCookie: {}\r\n\r\n",
        cookie(17_000)
    );
    let r = c.roundtrip(req.as_bytes()).await;
    assert_eq!(r.status, 431, "a head over 16 KiB: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_fields_get_431_and_a_stalled_buffered_body_408() {
    let (lb, b) = echo_setup("[timeouts]\nclient_header = \"1s\"\n").await;
    let many: String = (0..101).map(|i| format!("x-f{i}: 1\r\n")).collect();
    let mut c = client_of(&lb).await;
    let r = c
        .roundtrip(format!("GET /many HTTP/1.1\r\nHost: a\r\n{many}\r\n").as_bytes())
        .await;
    assert_eq!(r.status, 431, "{r:?}");
    c.expect_closed("after 431").await;

    let mut c = client_of(&lb).await;
    let started = Instant::now();
    let r = c
        .roundtrip(b"POST /stall HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nhalf!")
        .await;
    assert_eq!(r.status, 408, "{r:?}");
    assert!(started.elapsed() >= Duration::from_millis(900));
    c.expect_closed("after 408").await;
    assert_eq!(b.lines(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunked_request_body_gets_400() {
    let (lb, _b) = echo_setup("").await;
    let mut c = client_of(&lb).await;
    let r = c
        .roundtrip(
            b"POST /bad HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\nzz\r\nhello\r\n0\r\n\r\n",
        )
        .await;
    assert_eq!(r.status, 400, "the client's fault: {r:?}");
}

/// Clients that abort their uploads, or send broken chunked bodies, say nothing about
/// the target: outlier detection must not eject it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_client_uploads_do_not_eject_the_target() {
    let b = backend(echo).await;
    let lb = Lb::start(&config("", "panic_threshold = 0.0\n", &[b.addr])).await;
    for _ in 0..3 {
        let mut c = client_of(&lb).await;
        c.send(
            b"POST /bad HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\nzz\r\n",
        )
        .await;
        let _ = c.rest().await;
    }
    for _ in 0..3 {
        let mut c = client_of(&lb).await;
        c.send(b"POST /abort HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
            .await;
        c.send(&pattern(70_000)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(c);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = client_of(&lb)
        .await
        .roundtrip(b"GET /ok HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    assert_eq!(r.status, 200, "the target is still in service: {r:?}");
}

/// `timeouts.response_header` is the target's time to answer, not the client's time to
/// upload: a streamed body that takes longer than it still gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_streamed_upload_is_not_cut_by_the_response_header_timeout() {
    let (lb, b) = echo_setup("[timeouts]\nresponse_header = \"1s\"\n").await;
    let body = pattern(128 * 1024);
    let mut c = client_of(&lb).await;
    c.send(
        format!(
            "POST /slow-upload HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    for piece in body.chunks(16 * 1024) {
        // Not unwrapped: a balancer that gave up answers and closes; its answer is read.
        if c.tcp.write_all(piece).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let r = c.response().await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(lossy(&r.body), echoed("POST /slow-upload HTTP/1.1", &body));
    assert_eq!(b.lines().len(), 1);
}

/// `Connection: host` must not leave the target without a `Host` (RFC 9112 3.2: a
/// request without one is invalid; the balancer routed by it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_naming_host_does_not_strip_host() {
    let host =
        host_the_target_sees(b"GET /h HTTP/1.1\r\nHost: app.example\r\nConnection: host\r\n\r\n");
    assert_eq!(host.await, ["app.example"]);
}

/// `Transfer-Encoding: gzip, chunked`: the balancer removes only the chunked coding, so
/// it must tell the target about gzip (or refuse with 501), not pass gzip bytes off as
/// the plain body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_coding_other_than_chunked_is_not_silently_dropped() {
    let (lb, b) = echo_setup("").await;
    let r = client_of(&lb)
        .await
        .roundtrip(
            b"POST /gz HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
              5\r\nhello\r\n0\r\n\r\n",
        )
        .await;
    if r.status == 200 {
        let seen = b.seen();
        assert!(
            seen[0]
                .field("transfer-encoding")
                .iter()
                .any(|v| v.contains("gzip")),
            "the gzip coding was dropped: {}",
            seen[0].head
        );
    } else {
        assert_eq!(r.status, 501, "{r:?}");
    }
}

/// A client that stops reading a large answer (slow read) is disconnected after
/// `timeouts.client_write`; without it the relay (and its target connection) would wait
/// for the client forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_disconnected_after_client_write() {
    const BIG: usize = 64 * 1024 * 1024;
    let b = backend(|_| {
        let mut r = format!("HTTP/1.1 200 OK\r\ncontent-length: {BIG}\r\n\r\n").into_bytes();
        r.resize(r.len() + BIG, b'z');
        Reply::keep(r)
    })
    .await;
    let lb = Lb::start(&config("[timeouts]\nclient_write = \"1s\"", "", &[b.addr])).await;
    let mut c = TcpStream::connect(("127.0.0.1", lb.port)).await.unwrap();
    c.write_all(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    // Not reading: the socket buffers fill, the proxy's writes stall.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    let read_all = async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read_all)
        .await
        .expect("the proxy closed the connection");
    assert!(got < BIG, "the whole answer arrived: {got} bytes");
    assert!(
        lb.log().contains("client_write"),
        "the log says why: {}",
        lb.log()
    );
}

/// A target that says `100 Continue` unasked in the middle of an upload, then reads the
/// rest: the interim answer is skipped and the whole body goes on (it is not taken for
/// an early final answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interim_100_mid_upload_does_not_stop_the_body() {
    let addr = serve_each(|mut c| async move {
        let mut buf = Vec::new();
        let Some(head) = take_head(&mut c, &mut buf).await else {
            return;
        };
        let n = content_length(&head.to_ascii_lowercase()).unwrap_or(0);
        let _ = c.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await;
        // Not reading for a moment: the balancer's writes block meanwhile.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(body) = take_exact(&mut c, &mut buf, n).await else {
            return;
        };
        let _ = c
            .write_all(&ok(&echoed("POST /upload HTTP/1.1", &body)))
            .await;
    })
    .await;
    let lb = Lb::start(&config("", "", &[addr])).await;
    let size = 16 * 1024 * 1024;
    let r = post_reading_answer(&lb, size).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        lossy(&r.body),
        echoed("POST /upload HTTP/1.1", &pattern(size))
    );
}

/// Mangled requests (bytes flipped, cut, duplicated, spliced from a set of valid and
/// hostile requests; a fixed seed) each on its own connection: every answer is a
/// well-formed status line or a close, the backend never sees a request whose framing
/// the balancer did not check, and the balancer keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mangled_requests_get_an_answer_or_a_close_and_break_nothing() {
    let (lb, b) = echo_setup("[timeouts]\nclient_header = \"1s\"").await;
    let seeds: [&[u8]; 5] = [
        b"GET /a?b HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n",
        b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
        b"PUT /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"GET http://a/p HTTP/1.0\r\nConnection: keep-alive, x\r\nx: 1\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok",
    ];
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut answered = 0;
    for i in 0..300 {
        let mut req = seeds[(next() % seeds.len() as u64) as usize].to_vec();
        for _ in 0..=(next() % 4) {
            let at = (next() as usize) % req.len().max(1);
            match next() % 5 {
                0 => req[at] = next() as u8,
                1 => req.truncate(at.max(1)),
                2 => {
                    let dup = req[at..].to_vec();
                    req.extend_from_slice(&dup);
                }
                3 => req.insert(at, b"\r\n:\0 ,;"[(next() % 7) as usize]),
                _ => {
                    let other = seeds[(next() % seeds.len() as u64) as usize];
                    req.splice(at.., other.iter().copied());
                }
            }
        }
        let mut c = TcpStream::connect(("127.0.0.1", lb.port)).await.unwrap();
        let _ = c.write_all(&req).await;
        let _ = c.shutdown().await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(WAIT, c.read_to_end(&mut out)).await;
        if !out.is_empty() {
            let ok = out.len() >= 12
                && out.starts_with(b"HTTP/1.1 ")
                && out[9..12].iter().all(u8::is_ascii_digit);
            assert!(ok, "case {i}: {:?} got {:?}", lossy(&req), lossy(&out));
            answered += 1;
        }
    }
    // (With this seed: about 200 refusals, 40 proxied, a few 404s; the rest closed.)
    assert!(
        answered > 200,
        "most mangled requests get an answer: {answered}"
    );
    for s in b.seen() {
        let framing =
            s.head.matches("content-length").count() + s.head.matches("transfer-encoding").count();
        assert!(
            framing <= 1,
            "the backend got ambiguous framing: {}",
            s.head
        );
    }
    let r = client_of(&lb)
        .await
        .roundtrip(b"GET /after HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    assert_eq!(r.status, 200, "still serving: {r:?}");
}

// ---------------------------------------------------------------------------------
// The request-smuggling table of docs/lb.md ("Request framing and smuggling"): the rows
// not covered by a test above, each input on a connection of its own.

/// What a backend must have received for a row: nothing complete, or one request with
/// this body and these (lower-case) fields present and absent.
enum Reaches {
    Nothing,
    Body(
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
    ),
}

/// The admin listener's `/metrics` text.
async fn metrics(lb: &Lb) -> String {
    let mut c = TcpStream::connect(("127.0.0.1", lb.admin)).await.unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, c.read_to_end(&mut out))
        .await
        .expect("metrics within 5 s")
        .expect("metrics read");
    lossy(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_table_inputs_get_the_documented_answer() {
    use Reaches::*;
    let (lb, b) = echo_setup("").await;
    const P: &str = "POST / HTTP/1.1\r\nHost: a\r\n";
    const TE: &str = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    let cases: Vec<(&str, String, u16, Reaches)> = vec![
        (
            "underscore Content_Length (dropped)",
            format!("{P}Content_Length: 5\r\nX_Other: 1\r\nX-Kept: 1\r\n\r\n"),
            200,
            Body(
                "",
                &["x-kept: 1", "content-length: 0"],
                &["content_length", "x_other"],
            ),
        ),
        (
            "bare LF in a chunk extension",
            format!("{TE}2;\nxx\r\nhi\r\n0\r\n\r\n"),
            400,
            Nothing,
        ),
        (
            "bare LF ending a chunk size",
            format!("{TE}2\nhi\r\n0\r\n\r\n"),
            400,
            Nothing,
        ),
        (
            "bare LF after chunk data",
            format!("{TE}2\r\nhi\n0\r\n\r\n"),
            400,
            Nothing,
        ),
        (
            "bare LF in the trailers",
            format!("{TE}2\r\nhi\r\n0\r\nx: y\n\r\n"),
            400,
            Nothing,
        ),
        (
            "empty chunk-size line",
            format!("{TE}\r\nhi\r\n0\r\n\r\n"),
            400,
            Nothing,
        ),
        (
            "chunk size 0x2",
            format!("{TE}0x2\r\nhi\r\n0\r\n\r\n"),
            400,
            Nothing,
        ),
        (
            "space after the chunk size",
            format!("{TE}2 \r\nhi\r\n0\r\n\r\n"),
            200,
            Body("hi", &["transfer-encoding: chunked"], &[]),
        ),
        (
            "TE chunked, identity",
            format!("{P}Transfer-Encoding: chunked, identity\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
            400,
            Nothing,
        ),
        (
            "TE xchunked",
            format!("{P}Transfer-Encoding: xchunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
            400,
            Nothing,
        ),
        (
            "TE with a tab before the value",
            format!("{P}Transfer-Encoding:\tchunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
            200,
            Body("hi", &[], &[]),
        ),
        (
            "TE with a vertical tab",
            format!("{P}Transfer-Encoding:\x0bchunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
            400,
            Nothing,
        ),
        (
            "TE folded (obs-fold)",
            format!("{P}Transfer-Encoding:\r\n chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
            400,
            Nothing,
        ),
        (
            "TE chunked in two fields",
            format!(
                "{P}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
            ),
            501,
            Nothing,
        ),
        (
            "obs-fold in another field",
            format!("{P}X-A: 1\r\n 2\r\nContent-Length: 2\r\n\r\nhi"),
            400,
            Nothing,
        ),
        (
            "bare LF line ends in the head",
            "POST / HTTP/1.1\nHost: a\nContent-Length: 2\n\nhi".to_string(),
            200,
            Body("hi", &["content-length: 2"], &[]),
        ),
        (
            "two equal Content-Lengths",
            format!("{P}Content-Length: 2\r\nContent-Length: 2\r\n\r\nhi"),
            200,
            Body("hi", &["content-length: 2"], &[]),
        ),
        (
            "Content-Length list 2, 2",
            format!("{P}Content-Length: 2, 2\r\n\r\nhi"),
            400,
            Nothing,
        ),
        (
            "Connection naming Content-Length",
            format!("{P}Connection: Content-Length\r\nContent-Length: 2\r\n\r\nhi"),
            200,
            Body("hi", &["content-length: 2"], &[]),
        ),
        (
            "Connection naming Transfer-Encoding",
            format!(
                "{P}Connection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
            ),
            200,
            Body("hi", &["transfer-encoding: chunked"], &[]),
        ),
        (
            "Upgrade: h2c",
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
             HTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
                .to_string(),
            200,
            Body("", &[], &["upgrade", "http2-settings", "connection"]),
        ),
        (
            "two Host fields",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".to_string(),
            400,
            Nothing,
        ),
        (
            "NUL in a field value",
            "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\0b\r\n\r\n".to_string(),
            400,
            Nothing,
        ),
    ];
    for (what, raw, status, reaches) in cases {
        let before = b.seen().len();
        let mut c = client_of(&lb).await;
        let r = c.roundtrip(raw.as_bytes()).await;
        assert_eq!(r.status, status, "{what}: {r:?}");
        if status >= 400 {
            assert!(
                r.field("connection").contains(&"close"),
                "{what}: {}",
                r.head
            );
            c.expect_closed(what).await;
        }
        let seen = b.seen();
        match reaches {
            Nothing => assert_eq!(
                seen.len(),
                before,
                "{what}: the backend got a request: {:?}",
                seen.last()
            ),
            Body(body, present, absent) => {
                assert_eq!(seen.len(), before + 1, "{what}");
                let s = &seen[before];
                assert_eq!(lossy(&s.body), body, "{what}");
                for p in present {
                    assert!(
                        s.head.contains(&format!("\r\n{p}\r\n")),
                        "{what}: no {p}: {}",
                        s.head
                    );
                }
                for a in absent {
                    assert!(
                        !s.head.contains(&format!("\r\n{a}:")),
                        "{what}: {a} forwarded: {}",
                        s.head
                    );
                }
            }
        }
    }
    let m = metrics(&lb).await;
    assert!(
        m.contains("vigil_lb_request_fields_dropped_total{reason=\"underscore\"} 2"),
        "the two dropped fields are counted: {m}"
    );
}

/// `headers.underscores`: `forward` passes such fields on as sent, `reject` answers 400
/// (and counts it); neither changes the framing of the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn underscored_fields_can_be_forwarded_or_refused() {
    let (lb, b) = echo_setup("[headers]\nunderscores = \"forward\"\n").await;
    let r = client_of(&lb)
        .await
        .roundtrip(b"GET / HTTP/1.1\r\nHost: a\r\nX_Custom: 1\r\n\r\n")
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(b.seen()[0].field("x_custom"), ["1"]);
    drop(lb);

    let (lb, b) = echo_setup("[headers]\nunderscores = \"reject\"\n").await;
    let mut c = client_of(&lb).await;
    let r = c
        .roundtrip(b"GET / HTTP/1.1\r\nHost: a\r\nX_Custom: 1\r\n\r\n")
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    c.expect_closed("after a refused underscore").await;
    assert!(b.seen().is_empty());
    assert!(
        metrics(&lb)
            .await
            .contains("vigil_lb_request_fields_dropped_total{reason=\"underscore\"} 1")
    );
}

// ---------------------------------------------------------------------------------
// Every exchange bounded in time (issue 14 part 2): a target that stops reading an
// upload, a response body that stalls after its head, and the overall deadline.

/// A target that reads a request head and then nothing more, answering `answer` (may be
/// empty) and holding the connection open for a minute.
async fn stalling_backend(answer: &'static [u8]) -> Backend {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let addr = serve_each(move |mut c| {
        let log = log.clone();
        async move {
            let mut buf = Vec::new();
            let Some(raw) = take_head(&mut c, &mut buf).await else {
                return;
            };
            log.lock().unwrap().push(Seen {
                line: raw.split("\r\n").next().unwrap_or_default().to_string(),
                head: raw.to_ascii_lowercase(),
                body: Vec::new(),
            });
            let _ = c.write_all(answer).await;
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
    })
    .await;
    Backend { addr, seen }
}

/// The value of the counter line starting with `prefix` in `/metrics` (0 if absent).
async fn counter(lb: &Lb, prefix: &str) -> u64 {
    metrics(lb)
        .await
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_to_a_target_that_stops_reading_gets_504_after_the_send_timeout() {
    let b = stalling_backend(b"").await;
    let lb = Lb::start(&config("[timeouts]\nsend = \"500ms\"\n", "", &[b.addr])).await;
    let mut c = client_of(&lb).await;
    // 256 MiB announced: far more than the socket buffers between here and the target.
    let size: u64 = 256 << 20;
    c.send(format!("POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\n\r\n").as_bytes())
        .await;
    let (mut rd, mut wr) = c.tcp.into_split();
    let writer = tokio::spawn(async move {
        let piece = vec![b'x'; 64 * 1024];
        // Until the balancer stops reading (its answer is read below).
        while tokio::time::timeout(Duration::from_secs(10), wr.write_all(&piece))
            .await
            .is_ok_and(|r| r.is_ok())
        {}
    });
    let started = Instant::now();
    let mut buf = Vec::new();
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        read_response(&mut rd, &mut buf, false),
    )
    .await
    .expect("an answer, not a hang");
    writer.abort();
    assert_eq!(r.status, 504, "{r:?}");
    assert!(
        lossy(&r.body).contains("timeouts.send"),
        "{}",
        lossy(&r.body)
    );
    eprintln!("504 after {:?}", started.elapsed());
    assert_eq!(
        counter(&lb, "vigil_lb_timeouts_total{pool=\"api\",kind=\"send\"}").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_body_stalling_after_its_head_is_cut_after_the_body_timeout() {
    let b = stalling_backend(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789").await;
    let lb = Lb::start(&config(
        "[timeouts]\nresponse_body = \"500ms\"\n",
        "",
        &[b.addr],
    ))
    .await;
    let mut c = client_of(&lb).await;
    c.send(b"GET /stall HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let head = c.head_only().await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let started = Instant::now();
    let rest = c.rest().await;
    assert_eq!(lossy(&rest), "0123456789", "the part sent, then the close");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "cut after about 500 ms: {:?}",
        started.elapsed()
    );
    assert_eq!(
        counter(
            &lb,
            "vigil_lb_timeouts_total{pool=\"api\",kind=\"response_body\"}"
        )
        .await,
        1
    );
}

/// `timeouts.request` bounds the whole exchange: a head that comes too late is a 504 at
/// the deadline (not at `response_header`), and a body dripping in under the stall
/// limit is cut at the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_deadline_bounds_the_header_wait_and_a_dripping_body() {
    let b = backend(|s: &Seen| {
        if s.line.contains("/late") {
            Reply {
                delay: Duration::from_secs(3),
                ..Reply::keep(ok("late"))
            }
        } else {
            Reply::keep(ok("fine"))
        }
    })
    .await;
    let drip = serve_each(|mut c| async move {
        let mut buf = Vec::new();
        if take_head(&mut c, &mut buf).await.is_none() {
            return;
        }
        let _ = c
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
            .await;
        for _ in 0..1000 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if c.write_all(b"d").await.is_err() {
                return;
            }
        }
    })
    .await;
    let lb = Lb::start(&format!(
        "[timeouts]\nrequest = \"1s\"\nresponse_header = \"10s\"\n\
         [[routes]]\npath_prefix = \"/drip\"\npool = \"drip\"\n\
         [[routes]]\npool = \"api\"\n\
         [pools.api]\ntargets = [{{ addr = \"{}\" }}]\n[pools.api.health_check]\nenabled = false\n\
         [pools.drip]\ntargets = [{{ addr = \"{drip}\" }}]\n[pools.drip.health_check]\nenabled = false\n",
        b.addr
    ))
    .await;
    let mut c = client_of(&lb).await;
    let started = Instant::now();
    let r = c.roundtrip(b"GET /late HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let waited = started.elapsed();
    assert_eq!(r.status, 504, "{r:?}");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_millis(2500),
        "504 at the 1 s deadline: {waited:?}"
    );

    let mut c = client_of(&lb).await;
    c.send(b"GET /drip HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let head = c.head_only().await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let rest = c.rest().await;
    assert!(
        !rest.is_empty() && rest.len() < 20,
        "some drops, then the cut at 1 s: {}",
        rest.len()
    );
    assert_eq!(
        counter(
            &lb,
            "vigil_lb_timeouts_total{pool=\"api\",kind=\"request\"}"
        )
        .await,
        1
    );
    assert_eq!(
        counter(
            &lb,
            "vigil_lb_timeouts_total{pool=\"drip\",kind=\"request\"}"
        )
        .await,
        1
    );
}

/// An idle keep-alive connection gives its buffers back after a second (issue 14 part
/// 2, memory): its next request is still served, and a head that started arriving
/// before that moment and ends after it is read whole.
/// A keep-alive connection idle for a moment leaves its task for the park
/// (`vigil_lb::park`, docs/lb.md "Memory per idle client connection"): it still serves
/// its next request, and still closes when `timeouts.client_header` has passed since
/// it went idle, not later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_keep_alive_connection_serves_its_next_request_and_closes_on_time() {
    let (lb, b) = echo_setup("[timeouts]\nclient_header = \"2s\"\n").await;
    let mut c = client_of(&lb).await;
    for i in 1..=3 {
        if i > 1 {
            // Idle well past `PARK_AFTER` (250 ms): parked.
            tokio::time::sleep(Duration::from_millis(800)).await;
        }
        let r = c
            .roundtrip(format!("GET /{i} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
            .await;
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        assert_eq!(lossy(&r.body), echoed(&format!("GET /{i} HTTP/1.1"), b""));
    }
    let idle = Instant::now();
    c.expect_closed("idle past timeouts.client_header").await;
    let waited = idle.elapsed();
    assert!(
        (Duration::from_millis(1900)..Duration::from_millis(3500)).contains(&waited),
        "closed {waited:?} after going idle (client_header 2s)"
    );
    assert_eq!(b.lines().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_give_buffers_back_and_serve_the_next_request() {
    let (lb, b) = echo_setup("").await;
    let mut c = client_of(&lb).await;
    let r = c.roundtrip(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(lossy(&r.body), echoed("GET /first HTTP/1.1", b""));
    // Past the release: the next request on the same connection.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = c
        .roundtrip(b"POST /second HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
        .await;
    assert_eq!(lossy(&r.body), echoed("POST /second HTTP/1.1", b"hello"));
    // Half a head before the release moment, the rest after it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.send(b"GET /third HTTP/1.1\r\nHo").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    c.send(b"st: a\r\n\r\n").await;
    let r = c.response().await;
    assert_eq!(lossy(&r.body), echoed("GET /third HTTP/1.1", b""));
    c.expect_quiet("after three answers").await;
    assert_eq!(b.lines().len(), 3);
}

// ---------------------------------------------------------------------------------
// Memory after load.

/// The balancer gives a burst's memory back to the system: its allocator, jemalloc,
/// runs the background thread that returns freed pages on a timer (without it, an idle
/// balancer kept a burst's memory: docs/lb.md, "A burst"; the figures are
/// bench/lb/memory.py's, not a test's).
#[cfg(feature = "jemalloc")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balancer_runs_the_allocator_thread_that_returns_freed_memory() {
    let (lb, _b) = echo_setup("").await;
    let tasks = format!("/proc/{}/task", lb.child.id());
    let names: Vec<String> = std::fs::read_dir(&tasks)
        .expect("the balancer's threads")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect();
    assert!(
        names.iter().any(|n| n == "jemalloc_bg_thd"),
        "no jemalloc background thread: freed memory would stay with the process; threads: {names:?}\nlog:\n{}",
        lb.log()
    );
}
