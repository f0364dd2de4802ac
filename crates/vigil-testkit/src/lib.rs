//! Test doubles shared by vigil's crates (like tower's `tower-test`).
//!
//! [`Backend`] is a real HTTP/1.1 server on loopback, running on its own thread and
//! runtime (so it keeps answering whatever the test's runtime is doing), whose health
//! endpoints and request behaviour a test changes at any time:
//!
//! - `/livez` always 200; `/readyz` and `/health` answer the configured health as
//!   health+json (status code 200 for pass/warn, 503 for fail);
//! - every other path answers per [`Mode`]: 200 with the backend's name, a chosen
//!   status, garbage bytes, a frozen connection (accepted, never answered, like a
//!   SIGSTOPped process), or a delay;
//! - [`Backend::kill`] closes the listener and every open connection, like a crash.
//!
//! [`Backend::start_plain`] is an ordinary web server instead (an nginx serving a site):
//! no health endpoint at all, `/` answers `200` with an HTML page and every other path
//! `404` with one.
//!
//! [`scripted_server`] answers every request with the same raw bytes, for HTTP clients'
//! unit tests (the lb's upstream client, the controller's prober).
//!
//! [`read_request`] reads one HTTP/1.1 request from a blocking stream, for tests that
//! stand in for a webhook receiver.
//!
//! [`thread_slices`] lists a process's threads with their scheduler slices (Linux), for
//! tests of the threads that ask for short turns.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use vigil_core::{CheckResult, Criticality, HealthReport, Status};

/// How a backend answers application requests (every path but its health endpoints).
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// 200 with the backend's name as the body.
    Ok,
    /// This status code, with the backend's name as the body.
    Status(u16),
    /// Bytes that are not HTTP, then the connection closes. As a health mode
    /// (`set_health_mode`): a `200` declared `application/health+json` whose body is
    /// not, a garbage health answer by any rule.
    Garbage,
    /// Read the request, never answer (the connection stays open).
    Freeze,
    /// Answer 200 after this delay.
    Delay(Duration),
    /// Every `every`-th application request (counted since the backend started) gets
    /// `status`, the others 200: a deterministic error rate of `1 / every`, never two
    /// errors in a row (for `every` > 1).
    FailEvery {
        /// One request in this many fails.
        every: u64,
        /// The status it gets.
        status: u16,
    },
}

#[derive(Debug)]
struct State {
    name: String,
    mode: Mode,
    /// Mode of the health endpoints themselves (`Ok` means: answer the health).
    health_mode: Mode,
    checks: BTreeMap<String, Status>,
    /// A check whose status flips on every `/readyz` or `/health` answer, starting
    /// with the given status (a target that flaps every probe, whatever the timing).
    flapping: Option<(String, Status)>,
    /// An ordinary web server: no health endpoints (see [`Backend::start_plain`]).
    plain: bool,
}

/// A real HTTP backend on 127.0.0.1 with a port of its own.
pub struct Backend {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    requests: Arc<AtomicU64>,
    health_requests: Arc<AtomicU64>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Backend {
    /// Starts a backend named `name` on an ephemeral loopback port, passing its health.
    pub fn start(name: &str) -> Backend {
        Self::start_on(name, "127.0.0.1:0".parse().expect("valid address"))
    }

    /// Starts a backend on a given address (e.g. to restart a killed one on its port).
    pub fn start_on(name: &str, addr: SocketAddr) -> Backend {
        Self::start_with(name, addr, false)
    }

    /// Starts an ordinary web server named `name`, with no health endpoint: `/`
    /// answers `200` with an HTML page, every other path (`/health`, `/readyz` too)
    /// `404` with one. Requests for `/` count as application requests, the others as
    /// health requests when their path is a health path.
    pub fn start_plain(name: &str) -> Backend {
        Self::start_with(name, "127.0.0.1:0".parse().expect("valid address"), true)
    }

    fn start_with(name: &str, addr: SocketAddr, plain: bool) -> Backend {
        let state = Arc::new(Mutex::new(State {
            name: name.to_string(),
            mode: Mode::Ok,
            health_mode: Mode::Ok,
            checks: BTreeMap::new(),
            flapping: None,
            plain,
        }));
        let requests = Arc::new(AtomicU64::new(0));
        let health_requests = Arc::new(AtomicU64::new(0));
        let std_listener = std::net::TcpListener::bind(addr).expect("bind test backend");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("local addr");
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (st, rq, hq) = (state.clone(), requests.clone(), health_requests.clone());
        let thread = std::thread::Builder::new()
            .name(format!("backend-{name}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("backend runtime");
                rt.block_on(serve(std_listener, st, rq, hq, rx));
                // Dropping the runtime drops every connection task: sockets close.
                rt.shutdown_background();
            })
            .expect("spawn backend thread");
        Backend {
            addr,
            state,
            requests,
            health_requests,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// The backend's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets how application requests are answered.
    pub fn set_mode(&self, mode: Mode) {
        self.state.lock().expect("state lock").mode = mode;
    }

    /// Sets how the health endpoints themselves behave (`Mode::Ok`: answer the health).
    pub fn set_health_mode(&self, mode: Mode) {
        self.state.lock().expect("state lock").health_mode = mode;
    }

    /// Sets the status of a named check in `/readyz` and `/health` (e.g. `"disk:free"`,
    /// `"postgres:connect"`). The overall status is their aggregate (all critical).
    pub fn set_check(&self, name: &str, status: Status) {
        let mut st = self.state.lock().expect("state lock");
        if st.flapping.as_ref().is_some_and(|(n, _)| n == name) {
            st.flapping = None;
        }
        st.checks.insert(name.to_string(), status);
    }

    /// Sets every check back to pass and forgets them (a flapping one too).
    pub fn clear_checks(&self) {
        let mut st = self.state.lock().expect("state lock");
        st.checks.clear();
        st.flapping = None;
    }

    /// Makes the named check alternate between `first` and pass on every health
    /// answer, `first` on the next one: a target that flaps every probe, tied to the
    /// probes rather than to a clock (so a busy machine cannot turn it into a steady
    /// failure). [`Backend::set_check`] on the same name or [`Backend::clear_checks`]
    /// ends it.
    pub fn flap_check(&self, name: &str, first: Status) {
        let mut st = self.state.lock().expect("state lock");
        st.checks.remove(name);
        st.flapping = Some((name.to_string(), first));
    }

    /// Application requests answered or received so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Health requests received so far.
    pub fn health_requests(&self) -> u64 {
        self.health_requests.load(Ordering::Relaxed)
    }

    /// Stops listening and closes every open connection, like a crash.
    pub fn kill(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().expect("backend thread panicked");
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn serve(
    listener: std::net::TcpListener,
    state: Arc<Mutex<State>>,
    requests: Arc<AtomicU64>,
    health_requests: Arc<AtomicU64>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    loop {
        let (mut stream, _) = tokio::select! {
            _ = &mut shutdown => return,
            r = listener.accept() => match r { Ok(s) => s, Err(_) => continue },
        };
        let (st, rq, hq) = (state.clone(), requests.clone(), health_requests.clone());
        tokio::spawn(async move {
            // Garbage is decided per connection, before HTTP parsing: peek at the mode.
            let garbage = st.lock().expect("state lock").mode == Mode::Garbage;
            if garbage {
                let mut buf = [0u8; 1024];
                let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await;
                // The request line only: a probe's `Accept: application/health+json`
                // says `/health` too.
                let line = buf.split(|&b| b == b'\n').next().unwrap_or(&[]);
                let is_health = line.windows(7).any(|w| w == b"/readyz" || w == b"/health");
                if !is_health {
                    rq.fetch_add(1, Ordering::Relaxed);
                    let _ = stream.write_all(b"\x00\x01garbage, not HTTP\r\n\r\n").await;
                    return;
                }
                // Health probes still get a real answer on a fresh parse of this request.
                let (status, body) = health_answer(&st, "/health");
                let resp = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/health+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(resp.as_bytes()).await;
                return;
            }
            let svc = service_fn(move |req: Request<Incoming>| {
                let (st, rq, hq) = (st.clone(), rq.clone(), hq.clone());
                async move { Ok::<_, hyper::Error>(handle(req, &st, &rq, &hq).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn health_answer(state: &Mutex<State>, path: &str) -> (u16, String) {
    let mut st = state.lock().expect("state lock");
    let flap = st.flapping.as_mut().map(|(name, next)| {
        let now = *next;
        *next = if now == Status::Pass {
            Status::Fail
        } else {
            Status::Pass
        };
        (name.clone(), now)
    });
    let mut report = HealthReport::from_results(
        st.checks
            .iter()
            .map(|(n, s)| (n.clone(), *s))
            .chain(flap)
            .map(|(n, s)| (n, CheckResult::new(s), Criticality::Critical)),
    );
    report.description = Some(format!("{} {}", st.name, path));
    (report.status.http_code(), report.to_json())
}

async fn handle(
    req: Request<Incoming>,
    state: &Mutex<State>,
    requests: &AtomicU64,
    health_requests: &AtomicU64,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let is_health = matches!(path.as_str(), "/readyz" | "/health" | "/healthz" | "/livez");
    let (mode, plain) = {
        let st = state.lock().expect("state lock");
        let plain = st.plain.then(|| st.name.clone());
        if is_health {
            (st.health_mode.clone(), plain)
        } else {
            (st.mode.clone(), plain)
        }
    };
    let nth = if is_health {
        health_requests.fetch_add(1, Ordering::Relaxed) + 1
    } else {
        requests.fetch_add(1, Ordering::Relaxed) + 1
    };
    if let Some(name) = plain {
        let (code, body) = if path == "/" {
            (200, format!("<html><body><h1>{name}</h1></body></html>"))
        } else {
            (
                404,
                "<html><body><h1>404 Not Found</h1></body></html>".into(),
            )
        };
        return Response::builder()
            .status(code)
            .header("content-type", "text/html; charset=utf-8")
            .body(Full::new(Bytes::from(body)))
            .expect("valid response");
    }
    match mode {
        Mode::Freeze => std::future::pending::<()>().await,
        Mode::Delay(d) => tokio::time::sleep(d).await,
        _ => {}
    }
    let (code, body, ctype) = if path == "/livez" {
        (200, "ok".to_string(), "text/plain")
    } else if is_health && matches!(mode, Mode::Ok | Mode::Delay(_)) {
        let (c, b) = health_answer(state, &path);
        (c, b, vigil_core::HEALTH_JSON)
    } else if is_health && mode == Mode::Garbage {
        let name = state.lock().expect("state lock").name.clone();
        (
            200,
            format!("{name}: not health+json"),
            vigil_core::HEALTH_JSON,
        )
    } else {
        let name = state.lock().expect("state lock").name.clone();
        match mode {
            Mode::Status(c) => (c, name, "text/plain"),
            Mode::FailEvery { every, status } if every > 0 && nth.is_multiple_of(every) => {
                (status, name, "text/plain")
            }
            _ => (200, name, "text/plain"),
        }
    };
    Response::builder()
        .status(code)
        .header("content-type", ctype)
        .header("cache-control", "no-store")
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}

/// A scripted HTTP/1 server on loopback, for clients' unit tests: it reads each request
/// head (bodies are not expected) and answers it with `answer`, raw bytes whatever they
/// are (a truncated head, garbage, a chunked body...); after `per_conn` answers it closes
/// the connection. Runs on the caller's tokio runtime. Returns its address and the count
/// of connections it accepted.
pub async fn scripted_server(
    answer: impl Into<Vec<u8>>,
    per_conn: usize,
) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::AsyncReadExt;
    let answer: Vec<u8> = answer.into();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("bound address");
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                for _ in 0..per_conn {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        if tcp.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                            return;
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
                    buf.drain(..end);
                    if tcp.write_all(&answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// One HTTP/1.1 request as a webhook receiver in a test sees it.
#[derive(Debug)]
pub struct RawRequest {
    /// The method (`POST`).
    pub method: String,
    /// The request target (`/install`).
    pub path: String,
    /// Header fields, names lower-cased.
    pub headers: BTreeMap<String, String>,
    /// The body (`content-length` bytes).
    pub body: Vec<u8>,
}

/// Reads one request (head, then `content-length` bytes of body) from `reader`.
/// `Ok(None)`: the peer closed the connection before sending one.
pub fn read_request(reader: &mut impl std::io::BufRead) -> std::io::Result<Option<RawRequest>> {
    let mut request_line = String::new();
    if reader.read_line(&mut request_line)? == 0 {
        return Ok(None);
    }
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v: &String| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    let mut words = request_line.split(' ');
    Ok(Some(RawRequest {
        method: words.next().unwrap_or_default().to_string(),
        path: words.next().unwrap_or_default().to_string(),
        headers,
        body,
    }))
}

/// The first line a child prints when it serves (`vigil example-service`'s
/// `LISTENING app=127.0.0.1:40001 health=... store=...`), read from its stdout: each
/// `key=value` word by its key.
#[derive(Clone, Debug)]
pub struct Listening(pub String);

impl Listening {
    /// Reads the first line of `child`'s stdout (taken from it; piped).
    pub fn read(child: &mut std::process::Child) -> Listening {
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout piped")),
            &mut line,
        )
        .expect("read the LISTENING line");
        Listening(line)
    }

    /// The value of `key` (`"app"` for `app=...`); panics naming the line without it.
    pub fn get(&self, key: &str) -> String {
        let prefix = format!("{key}=");
        self.0
            .split_whitespace()
            .find_map(|w| w.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no {key}= in the LISTENING line {:?}", self.0))
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn health_follows_the_checks_and_kill_refuses_connections() {
        let mut b = Backend::start("b1");
        assert!(get(b.addr(), "/readyz").starts_with("HTTP/1.1 200"));
        b.set_check("disk:free", Status::Fail);
        let r = get(b.addr(), "/health");
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.contains("disk:free"), "{r}");
        b.set_mode(Mode::Status(500));
        assert!(get(b.addr(), "/x").starts_with("HTTP/1.1 500"));
        assert_eq!(b.requests(), 1);
        let addr = b.addr();
        b.kill();
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "a killed backend must refuse connections"
        );
    }

    #[test]
    fn a_plain_site_has_a_page_and_no_health_endpoint() {
        let b = Backend::start_plain("site");
        let r = get(b.addr(), "/");
        assert!(
            r.starts_with("HTTP/1.1 200") && r.contains("text/html"),
            "{r}"
        );
        for path in ["/health", "/readyz", "/x"] {
            assert!(get(b.addr(), path).starts_with("HTTP/1.1 404"), "{path}");
        }
        assert_eq!((b.requests(), b.health_requests()), (2, 2));
    }

    #[test]
    fn a_flapping_check_alternates_on_every_health_answer_until_set() {
        let b = Backend::start("b1");
        b.flap_check("disk:free", Status::Fail);
        let codes: Vec<bool> = (0..5)
            .map(|_| get(b.addr(), "/health").starts_with("HTTP/1.1 503"))
            .collect();
        assert_eq!(codes, [true, false, true, false, true]);
        b.set_check("disk:free", Status::Fail);
        for _ in 0..3 {
            assert!(get(b.addr(), "/readyz").starts_with("HTTP/1.1 503"));
        }
        b.clear_checks();
        assert!(get(b.addr(), "/readyz").starts_with("HTTP/1.1 200"));
    }
}

/// One thread of a process: its id, its name (`comm`) and its scheduler slice
/// (`vigil_sys::thread_slice_of`: `None` where the kernel reports none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadSlice {
    /// The thread's id (`/proc/<pid>/task/<tid>`; the process's own id for its main thread).
    pub tid: u32,
    /// Its name.
    pub name: String,
    /// Its slice under the fair scheduler.
    pub slice: Option<std::time::Duration>,
}

/// Every thread of process `pid` (`std::process::id()` for the calling one), sorted by
/// name then id; a thread that ends while this looks is left out.
pub fn thread_slices(pid: u32) -> Vec<ThreadSlice> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out: Vec<ThreadSlice> = tasks
        .filter_map(|task| {
            let task = task.ok()?.path();
            let tid: u32 = task.file_name()?.to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(task.join("comm")).ok()?;
            let slice = vigil_sys::thread_slice_of(i32::try_from(tid).ok()?).ok()?;
            Some(ThreadSlice {
                tid,
                name: name.trim().to_string(),
                slice,
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.name, a.tid).cmp(&(&b.name, b.tid)));
    out
}

// === promtool ===

/// What `promtool check metrics` said of a text.
#[derive(Debug, Clone)]
pub struct Promtool {
    /// It exited 0.
    pub success: bool,
    /// Its stdout and stderr (lint warnings, errors).
    pub said: String,
}

impl Promtool {
    /// Passed without a word: no error, no lint warning.
    pub fn clean(&self) -> bool {
        self.success && self.said.trim().is_empty()
    }
}

/// `promtool check metrics` on `text`; `None` when promtool is not installed (Debian's
/// `prometheus` package): the caller skips, saying so.
pub fn promtool_check_metrics(text: &str) -> Option<Promtool> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()
        .expect("stdin was piped")
        .write_all(text.as_bytes())
        .expect("write the metrics to promtool");
    let out = child.wait_with_output().expect("promtool ran");
    Some(Promtool {
        success: out.status.success(),
        said: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    })
}
