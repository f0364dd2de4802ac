//! vigil's one health-probe client: `GET url` over HTTP/1.1, plain or over TLS, bounded
//! in time and body size, its answer judged by vigil-core's one judge
//! ([`vigil_core::judge()`]). The controller's prober and `vigil check` probe with it.
//!
//! # Why a hand-written client
//!
//! A deliberately small HTTP/1.1 client: one `GET`, the response head parsed by
//! vigil-core's `http1` (httparse), the body framed by `Content-Length`, chunked
//! encoding or the end of the connection, and bounded by `max_body`. Idle keep-alive
//! connections wait in a pool, at most one per scheme and `host:port`, holding only the
//! socket: no buffer, no task, no channel (hyper's client keeps a task, channels and
//! 8 KiB+ of buffers per pooled connection, which at 10,000 targets was most of the
//! controller's memory and CPU).
//!
//! # HTTPS
//!
//! `https://` URLs are probed over rustls ([`tls`] has the rules): the certificate is
//! verified against the URL's host (sent as SNI), trusted when it chains to the
//! system's roots or to the optional [`CaFile`]. There is no "insecure" switch. A TLS
//! failure says what failed: `certificate not trusted: UnknownIssuer`, `TLS handshake
//! timed out after 2s`.
//!
//! An https connection is reused as a plain one is (same pool, same staleness check),
//! but it cannot leave the runtime's reactor while idle as a bare socket does: an idle
//! TLS connection keeps its rustls state (some KiB of buffers and keys) and the
//! reactor's registration. That is still far cheaper than a handshake per probe; a
//! fleet of very many https targets that cannot afford the memory probes with
//! `reuse_connection: false` (a new connection per probe, resumed from rustls's
//! session cache).
//!
//! # What it does not do
//!
//! No redirects (a 3xx is an answer, judged as such), no proxies (a probe goes straight
//! to the instance, never through `HTTP_PROXY`), no HTTP/2, no request bodies. The
//! library's heartbeats and the balancer's checker (its own TLS dialer, gRPC health)
//! are not health probes of this kind and keep their own clients
//! (docs/architecture.md).

mod exchange;
pub mod tls;

pub use tls::{CaError, CaFile};

use exchange::{Answer, Conn, Failure};
use std::borrow::Cow;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tokio::io::ReadBuf;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use vigil_core::judge::{Answers, Judgement};

/// Idle pooled connections are dropped after this long: longer than any sane probe
/// interval would keep every connection warm forever on a 10 s interval; 90 s matches
/// hyper's default and most servers' keep-alive timeouts.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How often the pool drops connections idle past [`POOL_IDLE_TIMEOUT`] (those of
/// removed targets, mostly): a sweep walks the whole pool, so not on every probe.
const POOL_SWEEP_EVERY: Duration = Duration::from_secs(30);
/// Default whole-probe timeout ([`Limits::default`]): 2 s, the budget a Kubernetes exec
/// probe or a script usually allows, and far above a healthy endpoint's answer time
/// (it reads a snapshot).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// How a [`Client`] is built.
#[derive(Clone, Debug)]
pub struct Options {
    /// Keep one idle connection per scheme and `host:port` between probes (true), or
    /// open and close one per probe (false: less memory per target, more CPU, and
    /// `Connection: close` is sent).
    pub reuse_connection: bool,
    /// The `User-Agent` sent.
    pub user_agent: String,
    /// Extra CA certificates trusted for https targets, besides the system's roots.
    pub ca: Option<CaFile>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            reuse_connection: true,
            user_agent: concat!("vigil/", env!("CARGO_PKG_VERSION")).into(),
            ca: None,
        }
    }
}

/// The bounds and the judging rule of one probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The whole probe: connect, TLS handshake, request, response and body. Defaults to
    /// [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    /// Largest body read. Defaults to vigil-core's `MAX_REPORT_BYTES` (64 KiB).
    pub max_body: usize,
    /// What counts as a health answer. Also decides what a body over `max_body` is:
    /// with `plain-status`, a body not declared JSON is judged by its code and left
    /// unread. Defaults to `health+json`.
    pub answers: Answers,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: DEFAULT_TIMEOUT,
            max_body: vigil_core::report::MAX_REPORT_BYTES,
            answers: Answers::HealthJson,
        }
    }
}

/// An answer, and what the judge made of it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The HTTP status.
    pub status: u16,
    /// The `Content-Type`, as sent.
    pub content_type: Option<String>,
    /// The body (empty when a large plain page was judged by its code, unread).
    pub body: Vec<u8>,
    /// vigil-core's judgement of it, by [`Limits::answers`].
    pub judgement: Judgement,
    /// Whether it came over a pooled connection.
    pub reused: bool,
}

/// What kind of failure a probe met: callers word and count them (an unreachable
/// target against a broken answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The URL cannot be probed (scheme, no host).
    Url,
    /// No connection: resolution or TCP connect failed.
    Connect,
    /// The TLS handshake failed (untrusted certificate, not https, ...).
    Tls,
    /// Connected, but the request got no answer (sending failed, closed first).
    Request,
    /// An answer that is not usable HTTP (garbage, closed mid-answer, too large a head).
    Response,
    /// The body is over `max_body`.
    TooLarge,
    /// No answer within the timeout.
    Timeout,
}

/// Why a probe has no answer: its kind, and what an operator reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ProbeError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// What failed, e.g. `connect to 10.0.0.1:8080: Connection refused (os error 111)`,
    /// `certificate not trusted: UnknownIssuer`, `timed out after 2s`.
    pub message: String,
}

impl ProbeError {
    fn new(kind: ErrorKind, message: impl Into<String>) -> ProbeError {
        ProbeError {
            kind,
            message: message.into(),
        }
    }
}

/// The probe client (cheap to clone: the pool and the TLS configuration are shared).
#[derive(Clone)]
pub struct Client {
    reuse: bool,
    agent: Arc<str>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("reuse_connection", &self.reuse)
            .field("user_agent", &self.agent)
            .finish_non_exhaustive()
    }
}

struct Shared {
    pool: Mutex<Pool>,
    ca: Option<CaFile>,
    /// Built at the first https probe: reading the system's roots costs milliseconds
    /// that a client probing only http:// never pays.
    tls: OnceLock<Result<TlsConnector, String>>,
}

/// Idle connections by `host:port` (`https://host:port` for TLS ones).
struct Pool {
    idle: HashMap<Box<str>, Idle>,
    last_sweep: Instant,
}

/// An idle connection since `since`.
struct Idle {
    conn: IdleConn,
    since: Instant,
}

/// A plain idle connection is the bare socket, out of the runtime's reactor (a
/// registered tokio stream keeps a few hundred bytes of readiness state in the reactor
/// per connection, at 10,000 targets the largest part of a target's memory); it is
/// registered again when checked out: two `epoll_ctl` calls per probe. A TLS one stays
/// registered (its session cannot be taken apart and put back together).
enum IdleConn {
    Plain(std::net::TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// Where a probe is, for the message of a timeout.
#[repr(u8)]
#[derive(Clone, Copy)]
enum Phase {
    Connect = 0,
    Handshake = 1,
    Exchange = 2,
}

impl Client {
    /// A client with its own connection pool.
    pub fn new(options: Options) -> Client {
        Client {
            reuse: options.reuse_connection,
            agent: Arc::from(options.user_agent),
            shared: Arc::new(Shared {
                pool: Mutex::new(Pool {
                    idle: HashMap::new(),
                    last_sweep: Instant::now(),
                }),
                ca: options.ca,
                tls: OnceLock::new(),
            }),
        }
    }

    /// The same client (same pool) sending another `User-Agent`.
    pub fn with_user_agent(mut self, agent: &str) -> Client {
        self.agent = Arc::from(agent);
        self
    }

    /// Idle connections in the pool now.
    pub fn idle_connections(&self) -> usize {
        self.shared.pool.lock().expect("pool lock").idle.len()
    }

    /// `GET uri` within `limits`, the answer judged by `limits.answers`. `Err` when no
    /// answer came (refused, TLS refused, timed out, not HTTP, too large).
    pub async fn get(&self, uri: &http::Uri, limits: Limits) -> Result<Seen, ProbeError> {
        let phase = AtomicU8::new(Phase::Connect as u8);
        let fetched = tokio::time::timeout(limits.timeout, self.fetch(uri, limits, &phase)).await;
        let (answer, reused) = fetched.map_err(|_| {
            let after = humantime::format_duration(limits.timeout);
            ProbeError::new(
                ErrorKind::Timeout,
                if phase.load(Ordering::Relaxed) == Phase::Handshake as u8 {
                    format!("TLS handshake timed out after {after}")
                } else {
                    format!("timed out after {after}")
                },
            )
        })??;
        let judgement = vigil_core::judge(
            limits.answers,
            answer.status,
            answer.content_type.as_deref(),
            &answer.body,
        );
        Ok(Seen {
            status: answer.status,
            content_type: answer.content_type,
            body: answer.body,
            judgement,
            reused,
        })
    }

    async fn fetch(
        &self,
        uri: &http::Uri,
        limits: Limits,
        phase: &AtomicU8,
    ) -> Result<(Answer, bool), ProbeError> {
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(ProbeError::new(
                    ErrorKind::Url,
                    format!("only http:// and https:// URLs are probed, not {uri}"),
                ));
            }
        };
        let authority = uri
            .authority()
            .ok_or_else(|| ProbeError::new(ErrorKind::Url, format!("URL without a host: {uri}")))?;
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let key: Cow<str> = if tls {
            Cow::Owned(format!("https://{authority}"))
        } else {
            Cow::Borrowed(authority.as_str())
        };
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: application/health+json, application/json\r\nUser-Agent: {}\r\n{}\r\n",
            self.agent,
            if self.reuse {
                ""
            } else {
                "Connection: close\r\n"
            }
        );
        let open = || async {
            phase.store(Phase::Connect as u8, Ordering::Relaxed);
            let tcp = connect(authority.host(), port).await?;
            if !tls {
                return Ok(Conn::Plain(tcp));
            }
            phase.store(Phase::Handshake as u8, Ordering::Relaxed);
            let conn = self.handshake(tcp, authority.host(), port).await?;
            Ok::<_, ProbeError>(conn)
        };
        let pooled = if self.reuse {
            self.checkout(&key)
        } else {
            None
        };
        let reused = pooled.is_some();
        let mut conn = match pooled {
            Some(c) => c,
            None => open().await?,
        };
        phase.store(Phase::Exchange as u8, Ordering::Relaxed);
        let answer = match exchange::exchange(&mut conn, request.as_bytes(), limits).await {
            Err(Failure { stale: true, .. }) if reused => {
                // The pooled connection was closed under us: once more, fresh.
                conn = open().await?;
                phase.store(Phase::Exchange as u8, Ordering::Relaxed);
                exchange::exchange(&mut conn, request.as_bytes(), limits).await
            }
            other => other,
        }
        .map_err(|f| ProbeError::new(f.kind, f.message))?;
        if self.reuse && answer.reusable {
            self.checkin(&key, conn);
        }
        Ok((answer, reused))
    }

    async fn handshake(&self, tcp: TcpStream, host: &str, port: u16) -> Result<Conn, ProbeError> {
        let connector = self
            .shared
            .tls
            .get_or_init(|| tls::connector(self.shared.ca.as_ref()))
            .as_ref()
            .map_err(|e| ProbeError::new(ErrorKind::Tls, e.clone()))?;
        let name = tls::server_name(host).map_err(|e| ProbeError::new(ErrorKind::Tls, e))?;
        let stream = connector.connect(name, tcp).await.map_err(|e| {
            ProbeError::new(ErrorKind::Tls, tls::describe(&e, &format!("{host}:{port}")))
        })?;
        Ok(Conn::Tls(Box::new(stream)))
    }

    /// An idle connection to `key` that is still open, if the pool has one.
    fn checkout(&self, key: &str) -> Option<Conn> {
        let idle = self
            .shared
            .pool
            .lock()
            .expect("pool lock")
            .idle
            .remove(key)?;
        if idle.since.elapsed() >= POOL_IDLE_TIMEOUT {
            return None;
        }
        // An idle connection has nothing to read: readable means the server closed it
        // (EOF, a TLS close_notify) or sent something unasked; either way it is not
        // reused. The socket is non-blocking: nothing to read is `WouldBlock`.
        let mut probe = [0u8; 1];
        match idle.conn {
            IdleConn::Plain(s) => match s.peek(&mut probe) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    TcpStream::from_std(s).ok().map(Conn::Plain)
                }
                _ => None,
            },
            IdleConn::Tls(s) => {
                let mut cx = Context::from_waker(Waker::noop());
                let mut buf = ReadBuf::new(&mut probe);
                match s.get_ref().0.poll_peek(&mut cx, &mut buf) {
                    Poll::Pending => Some(Conn::Tls(s)),
                    Poll::Ready(_) => None,
                }
            }
        }
    }

    fn checkin(&self, key: &str, conn: Conn) {
        let conn = match conn {
            // Out of the reactor while idle (see `IdleConn`); a socket that cannot be
            // taken out is closed rather than pooled.
            Conn::Plain(s) => match s.into_std() {
                Ok(s) => IdleConn::Plain(s),
                Err(_) => return,
            },
            Conn::Tls(s) => IdleConn::Tls(s),
        };
        let now = Instant::now();
        let mut pool = self.shared.pool.lock().expect("pool lock");
        if now.duration_since(pool.last_sweep) >= POOL_SWEEP_EVERY {
            pool.last_sweep = now;
            pool.idle
                .retain(|_, i| now.duration_since(i.since) < POOL_IDLE_TIMEOUT);
        }
        // Reuse the key's allocation when the target was pooled before.
        match pool.idle.get_mut(key) {
            Some(slot) => *slot = Idle { conn, since: now },
            None => {
                pool.idle.insert(key.into(), Idle { conn, since: now });
            }
        }
    }
}

async fn connect(host: &str, port: u16) -> Result<TcpStream, ProbeError> {
    // `Authority::host` keeps an IPv6 literal's brackets.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let stream = match bare.parse::<IpAddr>() {
        Ok(ip) => TcpStream::connect(SocketAddr::new(ip, port)).await,
        // A name: resolved by tokio on its blocking pool, as hyper's connector does.
        Err(_) => TcpStream::connect((bare, port)).await,
    }
    .map_err(|e| ProbeError::new(ErrorKind::Connect, format!("connect to {host}:{port}: {e}")))?;
    stream.set_nodelay(true).map_err(|e| {
        ProbeError::new(ErrorKind::Connect, format!("connect to {host}:{port}: {e}"))
    })?;
    Ok(stream)
}
