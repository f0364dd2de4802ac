//! Deep-health probes: `GET {url}{path}` over pooled HTTP/1.1 connections, bounded in
//! time and body size, judged as a guard [`Observation`].

use serde::Serialize;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vigil_core::guard::Observation;
use vigil_core::http1::{self, ChunkedDecoder, Decoded, Framing};
use vigil_core::judge::Answers;

/// Idle pooled connections are dropped after this long: longer than any sane probe
/// interval would keep every connection warm forever on a 10 s interval; 90 s matches
/// hyper's default and most servers' keep-alive timeouts.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How often the pool drops connections idle past [`POOL_IDLE_TIMEOUT`] (those of
/// removed targets, mostly): a sweep walks the whole pool, so not on every probe.
const POOL_SWEEP_EVERY: Duration = Duration::from_secs(30);
/// First read buffer of a probe: a typical health answer and its head fit in one read.
/// The buffer lives only while the probe runs; an idle connection holds no buffer.
const FIRST_READ: usize = 1024;
/// Largest response head accepted: health answers carry a handful of headers; a
/// larger head is a misbehaving or hostile endpoint.
const MAX_HEAD: usize = 16 * 1024;

/// One probe, as the API and dashboard show it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbeRecord {
    /// When it finished (UNIX ms).
    pub at_ms: i64,
    /// Whether it passed.
    pub ok: bool,
    /// How long it took.
    pub duration_ms: f64,
    /// HTTP status, if any came back.
    pub status: Option<u16>,
    /// The report's status (`pass`, `warn`, `fail`) if it parsed.
    pub health: Option<vigil_core::Status>,
    /// What failed: the error, or the failing checks.
    pub detail: String,
}

/// The `User-Agent` of every probe.
pub const USER_AGENT: &str = "vigil-controller";

/// The HTTP prober (cheap to clone: the pool is shared).
///
/// A deliberately small HTTP/1.1 client: one `GET`, the response head parsed with
/// `httparse`, the body framed by `Content-Length`, chunked encoding or the end of the
/// connection, and bounded by `max_body`. Idle keep-alive connections wait in a pool,
/// at most one per `host:port`, holding only the socket: no buffer, no task, no
/// channel (hyper's client keeps a task, channels and 8 KiB+ of buffers per pooled
/// connection, which at 10,000 targets was most of the controller's memory and CPU).
#[derive(Clone)]
pub struct Prober {
    keep_alive: bool,
    /// The `User-Agent` sent (names the replica when there are several).
    agent: Arc<str>,
    pool: Arc<Mutex<Pool>>,
}

/// Idle connections by `host:port`.
struct Pool {
    idle: HashMap<Box<str>, Idle>,
    last_sweep: Instant,
}

/// An idle connection: the bare socket, out of the runtime's reactor (a registered
/// tokio stream keeps a few hundred bytes of readiness state in the reactor per
/// connection, at 10,000 targets the largest part of a target's memory). It is
/// registered again when checked out: two `epoll_ctl` calls per probe.
struct Idle {
    stream: std::net::TcpStream,
    since: Instant,
}

/// Why an exchange failed; `stale` failures on a reused connection are retried once on
/// a fresh one (the server closed the idle connection as we reused it: nothing of the
/// request was answered, and a GET is safe to repeat).
struct Failure {
    message: String,
    stale: bool,
}

impl Failure {
    fn new(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            stale: false,
        }
    }

    fn stale(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            stale: true,
        }
    }
}

/// A response read in full: status, `Content-Type`, body, and whether the connection
/// may be reused.
struct Answer {
    status: u16,
    content_type: Option<String>,
    body: Vec<u8>,
    reusable: bool,
}

impl Default for Prober {
    fn default() -> Self {
        Self::new(true)
    }
}

impl Prober {
    /// A prober with its own connection pool; without `keep_alive`, every probe opens
    /// (and closes) its own connection.
    pub fn new(keep_alive: bool) -> Prober {
        Prober {
            keep_alive,
            agent: Arc::from(USER_AGENT),
            pool: Arc::new(Mutex::new(Pool {
                idle: HashMap::new(),
                last_sweep: Instant::now(),
            })),
        }
    }

    /// Sends `User-Agent: vigil-controller (replica <id>)`, so a target's logs tell
    /// the replicas that probe it apart.
    pub fn for_replica(mut self, id: &str) -> Prober {
        self.agent = Arc::from(format!("{USER_AGENT} (replica {id})"));
        self
    }

    /// Idle connections in the pool now.
    pub fn idle_connections(&self) -> usize {
        self.pool.lock().expect("pool lock").idle.len()
    }

    /// Probes `base` + `path`, judging the answer by the rules of `answers`. Never
    /// fails: every failure is an observation.
    pub async fn probe(
        &self,
        target: &str,
        zone: &str,
        uri: http::Uri,
        timeout: Duration,
        max_body: usize,
        answers: Answers,
    ) -> (Observation, ProbeRecord) {
        let started = Instant::now();
        let result = tokio::time::timeout(timeout, self.fetch(&uri, max_body, answers)).await;
        let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
        let mut record = ProbeRecord {
            at_ms: crate::clock::wall_ms(),
            ok: false,
            duration_ms,
            status: None,
            health: None,
            detail: String::new(),
        };
        let fail = |record: &mut ProbeRecord, detail: String| {
            record.detail = detail;
            Observation::endpoint_failure(target, zone)
        };
        let obs = match result {
            Err(_) => fail(
                &mut record,
                format!("timed out after {}", humantime::format_duration(timeout)),
            ),
            Ok(Err(e)) => fail(&mut record, e),
            Ok(Ok(answer)) => {
                let status = answer.status;
                record.status = Some(status);
                // vigil-core's one judge (its doc has the rule table), by the configured
                // `probe.answers`: with `plain-status` (the default) a server without a
                // health endpoint is judged by its code, 2xx-3xx pass; with
                // `health+json` an answer that is not a health answer is garbage. Any
                // 4xx-5xx with a report is a fail either way.
                let j = vigil_core::judge(
                    answers,
                    status,
                    answer.content_type.as_deref(),
                    &answer.body,
                );
                record.health = j.report.as_ref().map(|r| r.status);
                let obs = j.observation(target, zone);
                if j.invalid {
                    record.detail = format!("garbage health response: {}", j.detail);
                } else if obs.endpoint_failed && j.report.is_some() {
                    record.detail = format!("{}: fail without a failing check", j.detail);
                } else if obs.endpoint_failed {
                    // A plain status failing: "HTTP 503", "HTTP 404, not a health
                    // answer: a plain 4xx fails (is the path right?)".
                    record.detail = j.detail;
                } else if !obs.failing_checks.is_empty() {
                    record.detail = format!("failing: {}", obs.failing_checks.join(", "));
                }
                obs
            }
        };
        record.ok = obs.is_ok();
        (obs, record)
    }

    /// Fetches `uri` and judges the answer with vigil-core's one judge, keeping the
    /// health+json report (its `version`, `releaseId`, checks): what `vigil deploy` reads
    /// to see a host report back. `Err` when no answer came (refused, timed out, not
    /// HTTP).
    pub async fn answer(
        &self,
        uri: &http::Uri,
        timeout: Duration,
        max_body: usize,
    ) -> Result<vigil_core::judge::Judgement, String> {
        // A report-back is a health+json report (its `releaseId` or `version`): the
        // body is read as one whatever its Content-Type says.
        let answers = Answers::HealthJson;
        match tokio::time::timeout(timeout, self.fetch(uri, max_body, answers)).await {
            Err(_) => Err(format!(
                "timed out after {}",
                humantime::format_duration(timeout)
            )),
            Ok(Err(e)) => Err(e),
            Ok(Ok(a)) => Ok(vigil_core::judge(
                answers,
                a.status,
                Some(vigil_core::HEALTH_JSON),
                &a.body,
            )),
        }
    }

    /// The observation for a target whose URL does not parse (config validation makes
    /// this unreachable for configured targets; it is a failure, never a panic).
    pub fn bad_url(target: &str, zone: &str, url: &str) -> (Observation, ProbeRecord) {
        let record = ProbeRecord {
            at_ms: crate::clock::wall_ms(),
            ok: false,
            duration_ms: 0.0,
            status: None,
            health: None,
            detail: format!("bad URL {url:?}"),
        };
        (Observation::endpoint_failure(target, zone), record)
    }

    async fn fetch(
        &self,
        uri: &http::Uri,
        max_body: usize,
        answers: Answers,
    ) -> Result<Answer, String> {
        if uri.scheme_str() != Some("http") {
            return Err(format!("only http:// URLs are probed, not {uri}"));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("URL without a host: {uri}"))?;
        let key = authority.as_str();
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {key}\r\nAccept: application/health+json, application/json\r\nUser-Agent: {}\r\n{}\r\n",
            self.agent,
            if self.keep_alive {
                ""
            } else {
                "Connection: close\r\n"
            }
        );
        let pooled = if self.keep_alive {
            self.checkout(key)
        } else {
            None
        };
        let reused = pooled.is_some();
        let mut stream = match pooled {
            Some(s) => s,
            None => connect(authority.host(), authority.port_u16().unwrap_or(80)).await?,
        };
        let answer = match exchange(&mut stream, request.as_bytes(), max_body, answers).await {
            Err(f) if f.stale && reused => {
                // The pooled connection was closed under us: once more, fresh.
                stream = connect(authority.host(), authority.port_u16().unwrap_or(80)).await?;
                exchange(&mut stream, request.as_bytes(), max_body, answers).await
            }
            other => other,
        }
        .map_err(|f| f.message)?;
        if self.keep_alive && answer.reusable {
            self.checkin(key, stream);
        }
        Ok(answer)
    }

    /// An idle connection to `key` that is still open, if the pool has one.
    fn checkout(&self, key: &str) -> Option<TcpStream> {
        let idle = self.pool.lock().expect("pool lock").idle.remove(key)?;
        if idle.since.elapsed() >= POOL_IDLE_TIMEOUT {
            return None;
        }
        // An idle connection has nothing to read: readable means the server closed it
        // (EOF) or sent something unasked; either way it is not reused. The socket is
        // non-blocking: nothing to read is `WouldBlock`.
        let mut probe = [0u8; 1];
        match idle.stream.peek(&mut probe) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                TcpStream::from_std(idle.stream).ok()
            }
            _ => None,
        }
    }

    fn checkin(&self, key: &str, stream: TcpStream) {
        // Out of the reactor while idle (see `Idle`); a socket that cannot be taken
        // out is closed rather than pooled.
        let Ok(stream) = stream.into_std() else {
            return;
        };
        let now = Instant::now();
        let mut pool = self.pool.lock().expect("pool lock");
        if now.duration_since(pool.last_sweep) >= POOL_SWEEP_EVERY {
            pool.last_sweep = now;
            pool.idle
                .retain(|_, i| now.duration_since(i.since) < POOL_IDLE_TIMEOUT);
        }
        // Reuse the key's allocation when the target was pooled before.
        match pool.idle.get_mut(key) {
            Some(slot) => *slot = Idle { stream, since: now },
            None => {
                pool.idle.insert(key.into(), Idle { stream, since: now });
            }
        }
    }
}

async fn connect(host: &str, port: u16) -> Result<TcpStream, String> {
    // `Authority::host` keeps an IPv6 literal's brackets.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let stream = match bare.parse::<IpAddr>() {
        Ok(ip) => TcpStream::connect(SocketAddr::new(ip, port)).await,
        // A name: resolved by tokio on its blocking pool, as hyper's connector does.
        Err(_) => TcpStream::connect((bare, port)).await,
    }
    .map_err(|e| format!("request failed: connect to {host}:{port}: {e}"))?;
    stream
        .set_nodelay(true)
        .map_err(|e| format!("request failed: {e}"))?;
    Ok(stream)
}

/// Reads more into `buf` (growing it when full). Returns the bytes read (0: EOF).
async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<usize, Failure> {
    if buf.capacity() - buf.len() < FIRST_READ / 2 {
        buf.reserve(buf.len().max(FIRST_READ));
    }
    stream
        .read_buf(buf)
        .await
        .map_err(|e| Failure::new(format!("reading the response: {e}")))
}

/// Reads until `buf` holds `need` bytes.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>, need: usize) -> Result<(), Failure> {
    if need > buf.len() {
        buf.reserve(need - buf.len());
    }
    while buf.len() < need {
        if read_more(stream, buf).await? == 0 {
            return Err(Failure::new("connection closed in the middle of the body"));
        }
    }
    Ok(())
}

fn too_large(max_body: usize) -> Failure {
    Failure::new(format!("health body larger than {max_body} bytes"))
}

/// One request and its response on `stream`. A body over `max_body` fails the probe,
/// unless plain statuses are answers and the body does not say it is JSON: then an
/// ordinary page too large to read (an application's `/`) is judged by its code, and
/// its connection is closed rather than read to the end.
async fn exchange(
    stream: &mut TcpStream,
    request: &[u8],
    max_body: usize,
    answers: Answers,
) -> Result<Answer, Failure> {
    stream
        .write_all(request)
        .await
        .map_err(|e| Failure::stale(format!("request failed: sending: {e}")))?;
    // The buffer only once the answer is there: a probe waiting on a slow target holds
    // none (at the concurrency limit, a thousand waiting probes would hold a MiB).
    stream
        .readable()
        .await
        .map_err(|e| Failure::stale(format!("reading the response: {e}")))?;
    let mut buf: Vec<u8> = Vec::with_capacity(FIRST_READ);
    let framing_error = |e: http1::FramingError| Failure::new(e.to_string());
    let mut content_type: Option<String> = None;
    // Framing rules (HEAD/1xx/204/304, Transfer-Encoding over Content-Length, ...) are
    // vigil-core's, shared with the load balancer's client.
    let head = 'read: loop {
        let n = match read_more(stream, &mut buf).await {
            // Reset before any answer: the server dropped the idle connection.
            Err(f) if buf.is_empty() => return Err(Failure::stale(f.message)),
            r => r?,
        };
        if n == 0 {
            return Err(if buf.is_empty() {
                Failure::stale("request failed: connection closed before any response")
            } else {
                Failure::new("connection closed in the middle of the response head")
            });
        }
        loop {
            let fields = |name: &str, value: &[u8]| {
                if name.eq_ignore_ascii_case("content-type") {
                    content_type = Some(String::from_utf8_lossy(value).into_owned());
                }
            };
            match http1::parse_response(&buf, false, fields).map_err(framing_error)? {
                None if buf.len() > MAX_HEAD => {
                    return Err(Failure::new(format!(
                        "response head larger than {MAX_HEAD} bytes"
                    )));
                }
                None => continue 'read,
                Some(h) if h.status == 101 => {
                    return Err(Failure::new("the endpoint switched protocols"));
                }
                // 1xx precede the real answer: skip them.
                Some(h) if h.status < 200 => {
                    buf.drain(..h.len);
                }
                Some(h) => break 'read h,
            }
        }
    };
    let start = head.len;
    let status = head.status;
    let skip_large = answers == Answers::PlainStatus
        && !content_type
            .as_deref()
            .is_some_and(|c| c.to_ascii_lowercase().contains("json"));
    let unread = |content_type| Answer {
        status,
        content_type,
        body: Vec::new(),
        reusable: false,
    };
    match head.framing {
        Framing::Empty => Ok(Answer {
            status,
            content_type,
            body: Vec::new(),
            reusable: head.keep_alive && buf.len() == start,
        }),
        Framing::Length(len) => {
            let Some(len) = usize::try_from(len).ok().filter(|&l| l <= max_body) else {
                return if skip_large {
                    Ok(unread(content_type))
                } else {
                    Err(too_large(max_body))
                };
            };
            fill(stream, &mut buf, start + len).await?;
            let reusable = head.keep_alive && buf.len() == start + len;
            buf.truncate(start + len);
            buf.drain(..start);
            Ok(Answer {
                status,
                content_type,
                body: buf,
                reusable,
            })
        }
        Framing::Chunked => {
            let mut decoder = ChunkedDecoder::new();
            let (mut body, mut pos) = (Vec::new(), start);
            loop {
                let (used, what) = decoder.decode(&buf[pos..]).map_err(framing_error)?;
                match what {
                    Decoded::Data(r) => {
                        if r.len() > max_body - body.len() {
                            return if skip_large {
                                Ok(unread(content_type))
                            } else {
                                Err(too_large(max_body))
                            };
                        }
                        body.extend_from_slice(&buf[pos + r.start..pos + r.end]);
                    }
                    Decoded::End => {
                        return Ok(Answer {
                            status,
                            content_type,
                            body,
                            reusable: head.keep_alive && buf.len() == pos + used,
                        });
                    }
                    Decoded::NeedMore => {
                        if read_more(stream, &mut buf).await? == 0 {
                            return Err(Failure::new(
                                "connection closed in the middle of the body",
                            ));
                        }
                    }
                }
                pos += used;
            }
        }
        Framing::UntilClose => {
            loop {
                if buf.len() - start > max_body {
                    return if skip_large {
                        Ok(unread(content_type))
                    } else {
                        Err(too_large(max_body))
                    };
                }
                if read_more(stream, &mut buf).await? == 0 {
                    break;
                }
            }
            buf.drain(..start);
            Ok(Answer {
                status,
                content_type,
                body: buf,
                reusable: false,
            })
        }
    }
}

#[cfg(test)]
mod tests;
