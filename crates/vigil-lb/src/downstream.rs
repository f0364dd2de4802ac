//! The client side: a lean HTTP/1.1 server. Each client connection is one task that
//! reads a request head, turns it into the bytes every attempt sends, hands it to the
//! proxy, and writes the answer back; then the next request on the same connection.
//!
//! Floor 3, downstream (floors: the crate doc): imports proxy, tunnel, pool and upstream,
//! and the shared helpers (body, http_util, worker, spare, park, config); its child
//! [`http2`] imports from it.
//!
//! Why not hyper's server: a proxy forwards header fields, it does not look at them.
//! hyper builds an `http::HeaderMap` of every request (a hashed, allocated entry per
//! field) that the proxy then serialised again for the target, and encoded a second
//! `HeaderMap` for every response: a third of vigil's instructions per request
//! (`python3 bench/lb/instructions.py`). Here the head is parsed once by `httparse`
//! (framing rules in [`vigil_core::http1`]), end-to-end field lines are copied as they
//! came, hop-by-hop ones are left out, and the forwarding fields are appended; the
//! target's answer goes back the same way ([`ResponseHead::write_to`]).
//!
//! What a client gets from this side itself: 400 for a malformed request (or an
//! ambiguous body length: `Transfer-Encoding` not ending in chunked, or sent with
//! `Content-Length`), 431 for a head over `limits.max_header_bytes` or over 100 fields,
//! 408 when a started head or a buffered body does not arrive within
//! `timeouts.client_header` (an idle keep-alive connection is closed silently after the
//! same time), 405 for `CONNECT`, 404 when no route matches. After any of these, and
//! after a request whose body was not read to its end, the connection is closed.
//!
//! A client that stops reading its answer is disconnected after `timeouts.client_write`.
//!
//! A valid upgrade (a GET without a body whose `Connection` names its one `Upgrade`,
//! not `h2c`) is forwarded with `Upgrade`; the target's `101` turns the connection into
//! a tunnel ([`crate::tunnel`]). Any other `Upgrade` is removed as hop-by-hop.
//!
//! Not done here: HTTP/2, forwarding request trailers.

/// The client connections of a listener, under `limits.max_client_connections`.
pub mod admit;
/// HTTP/2 from clients (TLS ALPN `h2`, cleartext prior knowledge).
pub mod http2;

use crate::access_log::Pending;
use crate::body::{BodyReader, CONTINUE, ClientStream, Growth, poll_read_more};
use crate::config::{ClientDeadline, Underscores};
use crate::http_util::{UPGRADE, VIA, connection_options, hop_by_hop, is_idempotent};
use crate::park::{self, PARK_AFTER};
use crate::proxy::{Proxy, ProxyTable, Reply};
use crate::spare;
use crate::upstream::{Outgoing, OutgoingBody, ResponseHead, Upgraded, UpstreamResponse};
use admit::Admitted;
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use smallvec::SmallVec;
use std::future::Future;
use std::io::{self, Write as _};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use vigil_core::admission::{DEADLINE_HEADER, parse_deadline_ms, parse_grpc_timeout};
use vigil_core::http1::{self, Framing, MAX_HEADERS, RequestBody, RequestError};

/// Settings of the client side fixed at start.
#[derive(Clone, Copy, Debug)]
pub struct FrontSettings {
    /// Time a client has to send a request head once it started one; also how long an
    /// idle keep-alive connection is kept.
    pub header_timeout: Duration,
    /// Largest request head.
    pub max_header_bytes: usize,
    /// Longest wait for a client to take more of its answer.
    pub write_timeout: Duration,
    /// How long an HTTP/2 connection with no stream being served is kept.
    pub h2_idle_timeout: Duration,
}

/// How the HTTP/2 connection preface starts (RFC 9113 3.4): a request line httparse
/// refuses (version 2.0), so it is looked for only when a first head fails to parse.
const H2_PREFACE_START: &[u8] = b"PRI * HTTP/2.0\r\n";

/// A client connection's socket and buffers.
struct ClientConn {
    tcp: ClientStream,
    /// Bytes read and not yet used (the next request may already be here: pipelining).
    rbuf: BytesMut,
    /// The answer being written.
    wbuf: Vec<u8>,
    /// Longest wait for the client to take more of it.
    write_timeout: Duration,
    /// The connection became a tunnel (and has ended as one).
    tunneled: bool,
}

/// A request head turned into what the proxy needs; owns nothing of the read buffer.
pub(crate) struct Prepared {
    /// Bytes of the head in the read buffer.
    pub(crate) head_len: usize,
    /// Request line and forwarded fields (no framing fields, no final empty line).
    pub(crate) out_head: Vec<u8>,
    /// A valid upgrade (WebSocket): `Connection: upgrade` and `Upgrade` are in
    /// `out_head`, and a 101 answer turns the connection into a tunnel.
    pub(crate) upgrade: bool,
    pub(crate) has_host: bool,
    pub(crate) head_request: bool,
    /// POST, PUT, PATCH: a body is part of the method, so an empty one is declared.
    pub(crate) declares_body: bool,
    pub(crate) idempotent: bool,
    pub(crate) body: RequestBody,
    pub(crate) keep_alive: bool,
    pub(crate) http10: bool,
    pub(crate) expect_continue: bool,
    /// A gRPC request.
    pub(crate) grpc: bool,
    /// The client's deadline, when trusted (`headers.deadline`).
    pub(crate) client_deadline: Option<Duration>,
    /// The matching route's pool, or none (404).
    pub(crate) pool: Option<Arc<crate::pool::PoolRt>>,
    /// The configuration it was routed by.
    pub(crate) table: Arc<ProxyTable>,
}

/// Time limits on relaying a response body.
#[derive(Clone, Copy, Debug)]
struct BodyLimits {
    /// Longest wait for more of it from the target.
    stall: Duration,
    /// The request's deadline, if any.
    deadline: Option<Instant>,
}

/// What the head read ended with.
enum HeadRead {
    Ready(Prepared),
    /// The client closed, went idle too long, or the balancer is draining.
    Closed,
    /// Refused: status and message; the connection closes after the answer.
    Refused(u16, String),
    /// The HTTP/2 connection preface (cleartext, prior knowledge): the connection is
    /// HTTP/2's.
    H2,
    /// Idle for [`PARK_AFTER`] since `idle_since`: to the park ([`crate::park`]).
    Park {
        idle_since: Instant,
    },
}

/// What a head read's wait for bytes ended with.
enum Wait {
    Read(io::Result<usize>),
    /// The header timeout.
    TimedOut,
    /// Idle for [`PARK_AFTER`].
    Park,
}

/// When a client connection stops: `drain` is cancelled on SIGTERM (the connection
/// closes between two requests), `close` when the drain time has run out (tunnels,
/// which have no "between two requests", close then).
#[derive(Clone, Debug, Default)]
pub struct Stop {
    /// Cancelled on SIGTERM.
    pub drain: CancellationToken,
    /// Cancelled when the drain time ran out.
    pub close: CancellationToken,
}

/// Where an idle plain connection waits, with its place under the listener's limit.
pub type ParkSender = park::Sender<Admitted>;

/// Answers a connection over its listener's `limits.max_client_connections` and closes
/// it: a plain one gets `503` (`Retry-After: 1`) before it has sent anything, and what
/// it sends meanwhile is read for a moment so that the close does not reset the answer
/// away; a TLS one is closed at once, before any handshake.
pub async fn refuse(tcp: TcpStream, peer: SocketAddr, tls: bool, admission: Arc<admit::Admission>) {
    let max = admission.max();
    tracing::debug!(%peer, "connection refused: {max} open (limits.max_client_connections)");
    if tls {
        return;
    }
    // Held while answering: a flood over the limit is closed unanswered past a few.
    let Some(_answering) = admission.answer_refusal() else {
        return;
    };
    let mut c = ClientConn {
        tcp: ClientStream::Plain(tcp),
        rbuf: BytesMut::new(),
        wbuf: Vec::new(),
        write_timeout: LINGER_TIME,
        tunneled: false,
    };
    let msg = format!(
        "too many connections: {max} are open on this listener (limits.max_client_connections)"
    );
    if c.write_local(503, &msg, false, false).await.is_ok() {
        c.linger().await;
    }
}

/// Serves a connection to a TLS listener: the handshake (within
/// `timeouts.client_header`, as a request head), then HTTP/1.1 over it. `admitted`:
/// its place under the listener's limit, given back when it closes.
#[allow(clippy::too_many_arguments)] // the connection's parts, as serve_connection's
pub async fn serve_tls(
    tcp: TcpStream,
    peer: SocketAddr,
    config: Arc<rustls::ServerConfig>,
    proxy: Arc<Proxy>,
    settings: FrontSettings,
    stop: Stop,
    admitted: Admitted,
) {
    // Boxed: the handshake's state is large and over once the connection is served.
    let accept = Box::pin(tokio_rustls::TlsAcceptor::from(config).accept(tcp));
    let tls = match tokio::time::timeout(settings.header_timeout, accept).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            proxy.count_handshake("error");
            tracing::debug!(%peer, "TLS handshake failed: {e}");
            return;
        }
        Err(_) => {
            proxy.count_handshake("timeout");
            tracing::debug!(%peer, "TLS handshake not done within timeouts.client_header");
            return;
        }
    };
    proxy.count_handshake("ok");
    if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
        let h2 = crate::downstream::http2::serve_h2(tls, peer, proxy, settings, stop, true);
        Box::pin(h2).await;
        drop(admitted);
        return;
    }
    let served = serve_connection(
        ClientStream::Tls(Box::new(tls)),
        peer,
        proxy,
        settings,
        stop,
        admitted,
    );
    Box::pin(served).await;
}

/// Serves one client connection until it closes, fails, or `stop.drain` is cancelled
/// between two requests; `admitted` is given back then.
pub async fn serve_connection(
    tcp: ClientStream,
    peer: SocketAddr,
    proxy: Arc<Proxy>,
    settings: FrontSettings,
    stop: Stop,
    admitted: Admitted,
) {
    serve(tcp, peer, proxy, settings, stop, None, true, admitted).await
}

/// A plain connection of a listener with a park ([`crate::park`]): idle for
/// [`PARK_AFTER`], it leaves its task and its socket waits there. `first`: its first
/// request (not one after a stay in the park), where HTTP/2's preface may come.
#[allow(clippy::too_many_arguments)] // the connection's parts, as serve_connection's
pub(crate) async fn serve_parkable(
    tcp: TcpStream,
    peer: SocketAddr,
    proxy: Arc<Proxy>,
    settings: FrontSettings,
    stop: Stop,
    park: ParkSender,
    first: bool,
    admitted: Admitted,
) {
    let tcp = ClientStream::Plain(tcp);
    serve(
        tcp,
        peer,
        proxy,
        settings,
        stop,
        Some(park),
        first,
        admitted,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    tcp: ClientStream,
    peer: SocketAddr,
    proxy: Arc<Proxy>,
    settings: FrontSettings,
    stop: Stop,
    park: Option<ParkSender>,
    mut first: bool,
    admitted: Admitted,
) {
    let shutdown = &stop.drain;
    let parkable = park.is_some() && matches!(tcp, ClientStream::Plain(_));
    let client_ip = peer.ip().to_string();
    let mut c = ClientConn {
        tcp,
        // Taken when the socket has bytes, given back whenever it has none
        // ([`crate::spare`]).
        rbuf: BytesMut::new(),
        wbuf: Vec::new(),
        write_timeout: settings.write_timeout,
        tunneled: false,
    };
    // One timer for the connection's life, re-armed for each head.
    let timer = tokio::time::sleep(settings.header_timeout);
    tokio::pin!(timer);
    loop {
        let req = match c
            .read_head(
                &settings,
                &proxy,
                &client_ip,
                timer.as_mut(),
                shutdown,
                first,
                parkable,
            )
            .await
        {
            HeadRead::Ready(req) => req,
            HeadRead::Closed => return,
            HeadRead::Park { idle_since } => {
                let (ClientStream::Plain(tcp), Some(park)) = (c.tcp, park) else {
                    unreachable!("only plain connections with a park park");
                };
                // Its buffers went back when it went idle; what is left is the socket.
                if let Ok(tcp) = tcp.into_std() {
                    // A park gone (the listener draining) drops it: closed.
                    let _ = park.send(park::Parked {
                        tcp,
                        peer,
                        idle_since,
                        keep: admitted,
                    });
                }
                return;
            }
            HeadRead::H2 => {
                let ClientConn { tcp, rbuf, .. } = c;
                let io = crate::downstream::http2::Prefixed::new(rbuf.freeze(), tcp);
                // Boxed, as every path but the common one: the task of every
                // connection is as large as its largest state.
                let h2 = crate::downstream::http2::serve_h2(io, peer, proxy, settings, stop, false);
                return Box::pin(h2).await;
            }
            HeadRead::Refused(code, msg) => {
                proxy.count_local("none", code);
                tracing::debug!(%peer, code, "request refused: {msg}");
                return Box::pin(async move {
                    if c.write_local(code, &msg, false, false).await.is_ok() {
                        c.linger().await;
                    }
                })
                .await;
            }
        };
        first = false;
        c.rbuf.advance(req.head_len);
        // Boxed: a request being forwarded is the largest state by far, and an idle
        // connection's task should not be the size of it.
        match Box::pin(c.exchange(req, &proxy, &stop, peer)).await {
            Ok(true) => crate::worker::share_cpu(),
            // A tunnel closed both ways already: nothing to linger for.
            Ok(false) if c.tunneled => return,
            Ok(false) => return Box::pin(c.linger()).await,
            Err(e) => {
                tracing::debug!(%peer, "client connection ended: {e}");
                return;
            }
        }
    }
}

/// How long, and for how many bytes, a closing connection keeps reading what the client
/// still sends (see [`ClientConn::linger`]).
const LINGER_TIME: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 256 * 1024;

impl ClientConn {
    /// Closes after an answer the client may still be sending to (a refused request, a
    /// body left unread): the write side first, then what arrives is read and dropped
    /// for a moment. Closing with unread bytes makes the kernel send a reset, which can
    /// destroy the answer before the client reads it.
    async fn linger(mut self) {
        if self.tcp.shutdown().await.is_err() {
            return;
        }
        let deadline = Instant::now() + LINGER_TIME;
        let mut drained = 0;
        while drained < LINGER_BYTES {
            self.rbuf.clear();
            let more = std::future::poll_fn(|cx| {
                poll_read_more(&mut self.tcp, &mut self.rbuf, Growth::Body, cx)
            });
            match tokio::time::timeout_at(deadline, more).await {
                Ok(Ok(n)) if n > 0 => drained += n,
                _ => return,
            }
        }
    }

    /// Reads until a complete request head is in the buffer and prepares it.
    #[allow(clippy::too_many_arguments)] // the connection's settings and state, by reference
    async fn read_head(
        &mut self,
        settings: &FrontSettings,
        proxy: &Proxy,
        client_ip: &str,
        mut timer: Pin<&mut Sleep>,
        shutdown: &CancellationToken,
        first: bool,
        parkable: bool,
    ) -> HeadRead {
        let mut armed = false;
        // An idle connection waits `PARK_AFTER` with its task, then goes to the park.
        let (mut parking, mut idle_since) = (false, Instant::now());
        // After an incomplete parse: how far the buffer was looked at. A head arriving a
        // byte at a time is parsed again only once an empty line may have arrived, not
        // per read (which would cost the square of its length).
        let mut partial: Option<usize> = None;
        loop {
            let worth_parsing = match partial {
                None => !self.rbuf.is_empty(),
                Some(seen) => may_end_head(&self.rbuf, seen),
            };
            if worth_parsing {
                let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
                match http1::parse_request(&self.rbuf, &mut fields) {
                    Ok(Some((head, _))) if head.len > settings.max_header_bytes => {
                        return too_large(settings);
                    }
                    Ok(Some((head, fields))) => {
                        let https = matches!(self.tcp, ClientStream::Tls(_));
                        return match prepare(&head, fields, proxy, client_ip, https) {
                            Ok(p) => HeadRead::Ready(p),
                            Err((code, msg)) => HeadRead::Refused(code, msg),
                        };
                    }
                    Ok(None) if self.rbuf.len() >= settings.max_header_bytes => {
                        return too_large(settings);
                    }
                    Ok(None) => partial = Some(self.rbuf.len()),
                    Err(RequestError::TooManyHeaders) => {
                        return HeadRead::Refused(
                            431,
                            format!("more than {MAX_HEADERS} header fields"),
                        );
                    }
                    Err(e @ RequestError::UnsupportedTransferCoding) => {
                        return HeadRead::Refused(501, e.to_string());
                    }
                    // Only as a connection's first bytes, and only in cleartext (over
                    // TLS, HTTP/2 is chosen by ALPN).
                    Err(RequestError::Syntax(_))
                        if first
                            && matches!(self.tcp, ClientStream::Plain(_))
                            && self.rbuf.starts_with(H2_PREFACE_START) =>
                    {
                        return HeadRead::H2;
                    }
                    // `HTTP/1.2`: served as HTTP/1.1, the highest minor version of
                    // HTTP/1 (RFC 9110 2.5), as nginx and HAProxy do; httparse knows
                    // only 1.0 and 1.1, so the digit is rewritten and the head parsed
                    // again (forwarded heads say HTTP/1.1 anyway).
                    Err(RequestError::Syntax(_)) if let Some(i) = newer_minor(&self.rbuf) => {
                        self.rbuf[i] = b'1';
                        partial = None;
                        continue;
                    }
                    Err(e) => return HeadRead::Refused(400, e.to_string()),
                }
            } else if partial.is_some() {
                if self.rbuf.len() >= settings.max_header_bytes {
                    return too_large(settings);
                }
                partial = Some(self.rbuf.len());
            } else if shutdown.is_cancelled() {
                return HeadRead::Closed;
            }
            // More bytes: now, or within the header timeout (the timer is armed only
            // when the socket has nothing, which is also when the client is idle).
            let idle = self.rbuf.is_empty();
            if idle {
                self.give_buffers_back();
            }
            let cancelled = shutdown.cancelled();
            tokio::pin!(cancelled);
            let read = std::future::poll_fn(|cx| {
                if self.rbuf.capacity() == 0 {
                    // No buffer while there is nothing to read: one again once there is.
                    match self.tcp.poll_read_ready(cx) {
                        Poll::Ready(Ok(())) => self.rbuf = spare::take_read(spare::CLIENT_READ),
                        Poll::Ready(Err(e)) => return Poll::Ready(Wait::Read(Err(e))),
                        Poll::Pending => {}
                    }
                }
                if self.rbuf.capacity() > 0 {
                    if let Poll::Ready(r) =
                        poll_read_more(&mut self.tcp, &mut self.rbuf, Growth::Head, cx)
                    {
                        return Poll::Ready(Wait::Read(r));
                    }
                    // Ready was stale (the last read did not drain the socket's
                    // readiness): nothing came after all.
                    if self.rbuf.is_empty() {
                        spare::give_read(std::mem::take(&mut self.rbuf));
                    }
                }
                if !armed {
                    idle_since = Instant::now();
                    parking = idle && parkable && settings.header_timeout > PARK_AFTER;
                    let wait = if parking {
                        PARK_AFTER
                    } else {
                        settings.header_timeout
                    };
                    timer.as_mut().reset(idle_since + wait);
                    armed = true;
                }
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(if parking { Wait::Park } else { Wait::TimedOut });
                }
                if idle && cancelled.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Wait::Read(Ok(0)));
                }
                Poll::Pending
            })
            .await;
            match read {
                Wait::Read(Ok(0)) | Wait::Read(Err(_)) => return HeadRead::Closed,
                // Not idle any more: the head is due as usual.
                Wait::Read(Ok(_)) if parking => {
                    parking = false;
                    timer.as_mut().reset(idle_since + settings.header_timeout);
                }
                Wait::Read(Ok(_)) => {}
                Wait::Park => return HeadRead::Park { idle_since },
                // A started head that did not arrive in time: slowloris, or a client
                // gone quiet mid-request. An idle connection just closes.
                Wait::TimedOut if self.rbuf.is_empty() => return HeadRead::Closed,
                Wait::TimedOut => {
                    return HeadRead::Refused(
                        408,
                        "the request head did not arrive in time".into(),
                    );
                }
            }
        }
    }

    /// Between two requests: the buffers go to this worker's spares ([`crate::spare`]),
    /// so an idle keep-alive connection costs its task and its socket, not 5 KiB.
    fn give_buffers_back(&mut self) {
        spare::give_read(std::mem::take(&mut self.rbuf));
        spare::give_write(std::mem::take(&mut self.wbuf));
    }

    /// The write buffer, empty, for an answer's head.
    fn begin_write(&mut self) {
        if self.wbuf.capacity() == 0 {
            self.wbuf = spare::take_write();
        } else {
            self.wbuf.clear();
        }
    }

    /// Reads or streams the body, forwards, and writes the answer. `Ok(true)`: the
    /// connection can take another request.
    async fn exchange(
        &mut self,
        req: Prepared,
        proxy: &Proxy,
        stop: &Stop,
        peer: SocketAddr,
    ) -> io::Result<bool> {
        let shutdown = &stop.drain;
        let table = req.table;
        // The access log's line, written when this ends however it ends (boxed: the
        // exchange's state stays small when access logs are off).
        let mut log = table.access_log.as_ref().map(|l| {
            let (method, path) = l.request_line(&req.out_head);
            let proto = if req.http10 { "HTTP/1.0" } else { "HTTP/1.1" };
            Box::new(Pending::begin(l, peer, proto, method, path))
        });
        if let Some(l) = log.as_mut() {
            l.entry.bytes_in = match req.body {
                RequestBody::None => Some(0),
                RequestBody::Length(n) => Some(n),
                _ => None,
            };
        }
        // The whole exchange's deadline (`timeouts.request`), from the head's arrival.
        let deadline = table.request_timeout.map(|t| Instant::now() + t);
        let has_body = req.body != RequestBody::None;
        let Some(pool) = req.pool else {
            proxy.count_local("none", 404);
            // An unread body would be taken for the next request: close instead.
            let keep = req.keep_alive && !has_body && !shutdown.is_cancelled();
            let msg = "no route for this host and path";
            local_entry(&mut log, 404, msg, req.head_request);
            self.write_local(404, msg, keep, req.head_request).await?;
            return Ok(keep);
        };
        let whole = match req.body {
            RequestBody::None => Some(Bytes::new()),
            RequestBody::Length(n) if n <= table.max_retry_body_bytes as u64 => {
                match self
                    .read_body(
                        n as usize,
                        req.expect_continue,
                        table.client_body_timeout,
                        deadline,
                    )
                    .await
                {
                    Ok(b) => Some(b),
                    Err((code, msg)) => {
                        proxy.count_local(&pool.name, code);
                        pool.clients.record(code, true);
                        if let Some(l) = log.as_mut() {
                            l.entry.pool = Some(pool.name.clone());
                        }
                        local_entry(&mut log, code, msg, req.head_request);
                        self.write_local(code, msg, false, req.head_request).await?;
                        return Ok(false);
                    }
                }
            }
            _ => None,
        };
        let length = match req.body {
            RequestBody::Length(n) => Some(n),
            _ => None,
        };
        let mut out = Outgoing::new(
            req.out_head,
            req.has_host,
            req.head_request,
            req.declares_body,
            match whole {
                Some(body) => OutgoingBody::Buffered(body),
                None => OutgoingBody::Streamed(length),
            },
            req.idempotent,
        );
        if req.upgrade {
            out.set_upgrade();
        }
        out.set_deadline(req.grpc, req.client_deadline);
        let ((answer, served), body_done) = if out.is_streamed() {
            let mut reader = BodyReader::h1(
                &mut self.tcp,
                &mut self.rbuf,
                length,
                req.expect_continue,
                table.client_body_timeout,
            );
            let answer = proxy
                .forward(&table, &pool, out, Some(&mut reader), deadline)
                .await;
            (answer, reader.is_done())
        } else {
            let answer = proxy.forward(&table, &pool, out, None, deadline).await;
            (answer, true)
        };
        let keep = req.keep_alive && body_done && !shutdown.is_cancelled();
        if let Some(l) = log.as_mut() {
            let e = &mut l.entry;
            e.pool = Some(pool.name.clone());
            e.attempts = served.attempts;
            e.upstream = served.upstream;
            e.target = served.target.as_ref().map(|t| t.addr.clone());
            if let Reply::Target(resp) = &answer {
                e.status = resp.head.status;
            }
        }
        drop(served);
        let answer = match answer {
            Reply::Target(mut resp) if resp.upgraded.is_some() => {
                let up = resp.upgraded.take().expect("checked just before");
                self.tunnel(resp, up, &table, proxy, &pool.name, stop)
                    .await?;
                return Ok(false);
            }
            other => other,
        };
        match answer {
            Reply::Local(code, msg) => {
                local_entry(&mut log, code, &msg, req.head_request);
                self.write_local(code, &msg, keep, req.head_request).await?;
                Ok(keep)
            }
            Reply::Target(resp) => {
                let limits = BodyLimits {
                    stall: table.response_body_timeout,
                    deadline,
                };
                self.write_response(resp, keep, req.http10, limits)
                    .await
                    .map(|(keep, cut, sent)| {
                        if let Some(l) = log.as_mut() {
                            l.entry.bytes_out = sent;
                        }
                        if let Some(kind) = cut {
                            tracing::debug!(pool = %pool.name, "response body cut: timeouts.{kind}");
                            proxy.count_timeout(&pool.name, kind);
                        }
                        keep
                    })
            }
        }
    }

    /// Passes the target's `101` on and joins the two connections until the tunnel
    /// ends ([`crate::tunnel`]).
    async fn tunnel(
        &mut self,
        resp: UpstreamResponse,
        mut up: Upgraded,
        table: &ProxyTable,
        proxy: &Proxy,
        pool: &str,
        stop: &Stop,
    ) -> io::Result<()> {
        self.begin_write();
        resp.head.write_to(&mut self.wbuf);
        self.wbuf.extend_from_slice(b"via: ");
        self.wbuf.extend_from_slice(VIA.as_bytes());
        self.wbuf
            .extend_from_slice(b"\r\nconnection: upgrade\r\n\r\n");
        self.send_wbuf().await?;
        self.tunneled = true;
        let ahead = self.rbuf.split();
        crate::tunnel::run(
            &mut self.tcp,
            &ahead,
            &mut up.stream,
            &up.read_ahead,
            table.tunnel_idle_timeout,
            &stop.close,
            &proxy.metrics,
            pool,
        )
        .await;
        Ok(())
    }

    /// Reads a body of `n` bytes whole, within `timeout` (and by `deadline`).
    async fn read_body(
        &mut self,
        n: usize,
        expect_continue: bool,
        timeout: Duration,
        deadline: Option<Instant>,
    ) -> Result<Bytes, (u16, &'static str)> {
        if self.rbuf.len() < n {
            if expect_continue && self.rbuf.is_empty() {
                self.tcp
                    .write_now(CONTINUE)
                    .await
                    .map_err(|_| (400, "incomplete request body"))?;
            }
            let deadline = deadline.map_or(Instant::now() + timeout, |d| {
                d.min(Instant::now() + timeout)
            });
            while self.rbuf.len() < n {
                let more = std::future::poll_fn(|cx| {
                    poll_read_more(&mut self.tcp, &mut self.rbuf, Growth::Body, cx)
                });
                match tokio::time::timeout_at(deadline, more).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return Err((400, "incomplete request body")),
                    Ok(Ok(_)) => {}
                    Err(_) => return Err((408, "request body too slow")),
                }
            }
        }
        Ok(self.rbuf.split_to(n).freeze())
    }

    /// Writes one of vigil's own answers.
    async fn write_local(
        &mut self,
        code: u16,
        msg: &str,
        keep: bool,
        head_request: bool,
    ) -> io::Result<()> {
        self.begin_write();
        let reason = http::StatusCode::from_u16(code)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("");
        let _ = write!(
            self.wbuf,
            "HTTP/1.1 {code} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n\
             via: {VIA}\r\ncontent-length: {}\r\n",
            msg.len() + 1
        );
        if code == 503 {
            self.wbuf.extend_from_slice(b"retry-after: 1\r\n");
        }
        if !keep {
            self.wbuf.extend_from_slice(b"connection: close\r\n");
        }
        self.wbuf.extend_from_slice(b"\r\n");
        if !head_request {
            self.wbuf.extend_from_slice(msg.as_bytes());
            self.wbuf.push(b'\n');
        }
        self.send_wbuf().await
    }

    /// Writes a target's answer; `Ok((true, _, _))` when the connection can go on, the
    /// timeout (`response_body` or `request`) that cut the body, if one did, and the
    /// body bytes written.
    async fn write_response(
        &mut self,
        resp: UpstreamResponse,
        mut keep: bool,
        http10: bool,
        limits: BodyLimits,
    ) -> io::Result<(bool, Option<&'static str>, u64)> {
        let UpstreamResponse { head, mut body, .. } = resp;
        // A body without a length: chunked to an HTTP/1.1 client, until close to 1.0.
        let rechunk = matches!(head.framing, Framing::Chunked | Framing::UntilClose);
        if rechunk && http10 {
            keep = false;
        }
        self.write_head(&head, keep, rechunk && !http10, http10);
        let rechunk = rechunk && !http10;
        if let Some(whole) = body.ready_now() {
            // The usual small answer: head and body in one write.
            put_data(&mut self.wbuf, &whole, rechunk);
            if rechunk {
                self.wbuf.extend_from_slice(b"0\r\n\r\n");
            }
            self.send_wbuf().await?;
            return Ok((keep, None, whole.len() as u64));
        }
        let mut sent = 0u64;
        drop(head);
        self.send_wbuf().await?;
        loop {
            // More of the body within the stall limit and the request's deadline; else
            // the client sees the answer cut (no last chunk, the connection closes).
            let stall_at = Instant::now() + limits.stall;
            let (until, kind) = match limits.deadline {
                Some(d) if d < stall_at => (d, "request"),
                _ => (stall_at, "response_body"),
            };
            let Ok(next) = tokio::time::timeout_at(until, body.frame()).await else {
                return Ok((false, Some(kind), sent));
            };
            match next {
                None => break,
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if data.is_empty() {
                        continue;
                    }
                    self.wbuf.clear();
                    put_data(&mut self.wbuf, &data, rechunk);
                    self.send_wbuf().await?;
                    sent += data.len() as u64;
                    // A client taking each piece just within `client_write` is bounded
                    // by the deadline too.
                    if limits.deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok((false, Some("request"), sent));
                    }
                }
                Some(Err(e)) => {
                    // Cut short: the client must see a truncated answer, not a whole one
                    // (no last chunk, and the connection closes).
                    tracing::debug!("target response body broke: {e}");
                    return Ok((false, None, sent));
                }
            }
        }
        if rechunk {
            self.send(b"0\r\n\r\n").await?;
        }
        Ok((keep, None, sent))
    }

    /// Writes `buf` to the client: at once when its socket takes it (the usual case, no
    /// timer), else within the write timeout.
    async fn send(&mut self, mut buf: &[u8]) -> io::Result<()> {
        if let ClientStream::Plain(tcp) = &self.tcp {
            match tcp.try_write(buf) {
                Ok(n) if n == buf.len() => return Ok(()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        match tokio::time::timeout(self.write_timeout, self.tcp.write_now(buf)).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took none of its answer within timeouts.client_write",
            )),
        }
    }

    async fn send_wbuf(&mut self) -> io::Result<()> {
        let wbuf = std::mem::take(&mut self.wbuf);
        let sent = self.send(&wbuf).await;
        self.wbuf = wbuf;
        sent
    }

    fn write_head(&mut self, head: &ResponseHead, keep: bool, chunked: bool, http10: bool) {
        self.begin_write();
        head.write_to(&mut self.wbuf);
        // A second `Via` line says the same as one combined value (RFC 9110 5.3).
        self.wbuf.extend_from_slice(b"via: ");
        self.wbuf.extend_from_slice(VIA.as_bytes());
        self.wbuf.extend_from_slice(b"\r\n");
        if chunked {
            self.wbuf
                .extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        if !keep {
            self.wbuf.extend_from_slice(b"connection: close\r\n");
        } else if http10 {
            self.wbuf.extend_from_slice(b"connection: keep-alive\r\n");
        }
        self.wbuf.extend_from_slice(b"\r\n");
    }
}

/// Whether bytes read since `seen` may complete a head: a line feed followed by an
/// empty line (`\n\n` or `\n\r\n`) at or after `seen` (looking back two bytes, which
/// an earlier read may have ended with).
fn may_end_head(buf: &[u8], seen: usize) -> bool {
    let from = seen.saturating_sub(2).min(buf.len());
    buf[from..].iter().enumerate().any(|(i, &b)| {
        b == b'\n' && matches!(&buf[from + i + 1..], [b'\n', ..] | [b'\r', b'\n', ..])
    })
}

/// Notes in the access log's line (when there is one) that vigil answered `code` with
/// `msg` itself.
pub(crate) fn local_entry(
    log: &mut Option<Box<Pending>>,
    code: u16,
    msg: &str,
    head_request: bool,
) {
    if let Some(l) = log.as_mut() {
        l.entry.status = code;
        l.entry.error = Some(msg.to_string());
        // write_local's body: the message and a line feed.
        l.entry.bytes_out = if head_request {
            0
        } else {
            msg.len() as u64 + 1
        };
    }
}

/// Appends body bytes, as a chunk when `chunked`.
fn put_data(out: &mut Vec<u8>, data: &[u8], chunked: bool) {
    if data.is_empty() {
        return;
    }
    if chunked {
        let _ = write!(out, "{:x}\r\n", data.len());
    }
    out.extend_from_slice(data);
    if chunked {
        out.extend_from_slice(b"\r\n");
    }
}

/// Where the minor digit of the request line's version is, when that version is
/// `HTTP/1.2` to `HTTP/1.9` (the line complete or not: httparse refuses the version as
/// soon as it is read).
fn newer_minor(buf: &[u8]) -> Option<usize> {
    let line = &buf[..buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len())];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let n = line.len();
    (n >= 9 && line[..n - 1].ends_with(b" HTTP/1.") && (b'2'..=b'9').contains(&line[n - 1]))
        .then_some(n - 1)
}

fn too_large(settings: &FrontSettings) -> HeadRead {
    HeadRead::Refused(
        431,
        format!(
            "request head over {} bytes (limits.max_header_bytes)",
            settings.max_header_bytes
        ),
    )
}

/// Splits a request target into the authority it names (absolute form) and its origin
/// form (`/path?query`, possibly without the leading `/`, or `*`).
fn split_target(target: &str) -> Option<(Option<&str>, &str)> {
    if target.starts_with('/') || target == "*" {
        return Some((None, target));
    }
    let scheme_end = target.find("://")?;
    let scheme = &target[..scheme_end];
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let rest = &target[scheme_end + 3..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, pq) = rest.split_at(end);
    (!authority.is_empty()).then_some((Some(authority), pq))
}

/// Whether `v` is a valid `Host` value (RFC 9110 7.2, RFC 3986 3.2.2): `uri-host [
/// ":" port ]`, the host an IP literal in brackets or a reg-name (letters, digits,
/// `-._~`, sub-delims, `%` and two hex digits; an IPv4 address is one), the port
/// digits. Empty is valid (a target URI without an authority, RFC 9110 7.2).
fn valid_host(v: &[u8]) -> bool {
    let (host, port) = if let Some(lit) = v.strip_prefix(b"[") {
        let Some(close) = lit.iter().position(|&b| b == b']') else {
            return false;
        };
        let (inner, rest) = (&lit[..close], &lit[close + 1..]);
        // IPv6 (hex digits, colons, dots for an embedded IPv4) or IPvFuture (`v1.x`).
        if inner.is_empty()
            || !inner
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b":._~-!$&'()*+,;=".contains(&b))
        {
            return false;
        }
        (&b""[..], rest)
    } else {
        let end = v.iter().position(|&b| b == b':').unwrap_or(v.len());
        (&v[..end], &v[end..])
    };
    let port_ok = match port {
        [] => true,
        [b':', digits @ ..] => digits.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    let mut i = 0;
    while i < host.len() {
        match host[i] {
            b'%' => {
                if !host
                    .get(i + 1..i + 3)
                    .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
                {
                    return false;
                }
                i += 3;
                continue;
            }
            b if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b) => {}
            _ => return false,
        }
        i += 1;
    }
    port_ok
}

/// Whether an `Upgrade` value may be tunnelled: protocol tokens (`websocket`,
/// `foo/2`), none of them `h2c`.
fn upgradable(value: &[u8]) -> bool {
    let mut any = false;
    for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
        let name = token.split(|&b| b == b'/').next().unwrap_or_default();
        if name.is_empty()
            || name.eq_ignore_ascii_case(b"h2c")
            || !token
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/".contains(&b))
        {
            return false;
        }
        any = true;
    }
    any
}

/// A request head rewritten for the targets.
#[derive(Debug)]
pub struct Forwarded<'b> {
    /// Request line in origin form and the forwarded fields (no `Content-Length`,
    /// `Transfer-Encoding` or final empty line: [`Outgoing::new`] writes those).
    pub out_head: Vec<u8>,
    /// The `Upgrade` value to forward (with `Connection: upgrade`), when the request is
    /// a valid upgrade: a GET without a body, HTTP/1.1, one `Upgrade` field that
    /// `Connection` names, and no `h2c` in it (h2c is not tunnelled: a client could
    /// reach the target in HTTP/2 past every rule of this proxy, "h2c smuggling").
    /// Otherwise `Upgrade` is dropped like any hop-by-hop field and the request is a
    /// plain one.
    pub upgrade: Option<&'b [u8]>,
    /// A `Host` field is among them.
    pub has_host: bool,
    /// The host the request is for: the absolute form's authority, else `Host`.
    pub host: Option<&'b str>,
    /// The path, for routing (no query).
    pub path: &'b str,
    /// Fields left out because their name has an underscore.
    pub underscores_dropped: u32,
    /// The client's `x-vigil-deadline-ms`, parsed (never forwarded: each attempt sends
    /// its own; `None` when absent or malformed).
    pub deadline: Option<Duration>,
    /// The client's `grpc-timeout`, parsed (never forwarded either).
    pub grpc_timeout: Option<Duration>,
    /// A gRPC request (`content-type: application/grpc...`).
    pub grpc: bool,
}

impl Forwarded<'_> {
    /// The deadline the client asked for, if it is trusted: the shorter of its
    /// `x-vigil-deadline-ms` and `grpc-timeout`.
    pub fn client_deadline(&self, trust: ClientDeadline) -> Option<Duration> {
        match trust {
            ClientDeadline::Strip => None,
            ClientDeadline::Trust => match (self.deadline, self.grpc_timeout) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

/// Rewrites a parsed request head (`fields` as parsed, `client_ip` the peer's address)
/// into the head its targets get: the request line in origin form, every end-to-end
/// field line as it came, hop-by-hop fields and those `Connection` names left out,
/// `Content-Length` and `Expect` left out (the body is framed again as sent and 100
/// Continue is answered here), fields whose name has an underscore dropped or refused
/// per `underscores`, `X-Forwarded-For` extended, `X-Forwarded-Proto` and `Via` set,
/// the client's deadline fields (`x-vigil-deadline-ms`, `grpc-timeout`) read and left
/// out (each attempt writes its own). Errors are the status and message the client gets.
pub fn forwarded_head<'b>(
    head: &http1::RequestHead<'b>,
    fields: &[httparse::Header<'b>],
    client_ip: &str,
    underscores: Underscores,
) -> Result<Forwarded<'b>, (u16, String)> {
    forwarded_head_as(head, fields, client_ip, underscores, false)
}

/// [`forwarded_head`] for a request that arrived over TLS when `https`
/// (`X-Forwarded-Proto: https`).
pub fn forwarded_head_as<'b>(
    head: &http1::RequestHead<'b>,
    fields: &[httparse::Header<'b>],
    client_ip: &str,
    underscores: Underscores,
    https: bool,
) -> Result<Forwarded<'b>, (u16, String)> {
    if head.method == "CONNECT" {
        return Err((405, "CONNECT is not supported".into()));
    }
    let Some((authority, pq)) = split_target(head.target) else {
        return Err((400, format!("bad request target {:?}", head.target)));
    };
    // `http://u:p@b/`: userinfo is deprecated in http(s) URIs (RFC 9110 4.2.4) and a
    // recipient may refuse it; nginx and HAProxy answer 400. Taken as a host, `u:p@b`
    // would route to another pool than `b` and hand the credentials to its targets.
    if let Some(a) = authority
        && a.contains('@')
    {
        return Err((
            400,
            format!("userinfo in the request target {:?}", head.target),
        ));
    }
    // RFC 9112 3.2: a Host field with an invalid value is a 400. A peer that reads
    // `b:80@evil` or `a b` as a host, and one that does not, would route or log the
    // same request apart.
    for (what, value) in [
        ("request target's authority", authority.map(str::as_bytes)),
        ("Host field", head.host),
    ] {
        if let Some(v) = value
            && !valid_host(v)
        {
            return Err((400, format!("bad {what} {:?}", String::from_utf8_lossy(v))));
        }
    }
    if pq == "*" && head.method != "OPTIONS" {
        return Err((400, "the asterisk form is for OPTIONS only".into()));
    }
    let path = pq.split('?').next().unwrap_or_default();
    let path = if path.is_empty() { "/" } else { path };
    let host_field = head.host.and_then(|h| std::str::from_utf8(h).ok());

    let mut out = Vec::with_capacity(head.len + 96);
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    if !pq.starts_with('/') && pq != "*" {
        out.push(b'/');
    }
    out.extend_from_slice(pq.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");

    let mut named: SmallVec<[&[u8]; 2]> = SmallVec::new();
    for c in fields
        .iter()
        .filter(|f| f.name.eq_ignore_ascii_case("connection"))
    {
        named.extend(connection_options(c.value));
    }
    let mut forwarded_for: SmallVec<[&[u8]; 2]> = SmallVec::new();
    let mut underscores_dropped = 0;
    // `Upgrade` values (hop-by-hop: only forwarded for a valid upgrade, below).
    let mut upgrades: SmallVec<[&[u8]; 1]> = SmallVec::new();
    let (mut deadline, mut grpc_timeout, mut grpc) = (None, None, false);
    for f in fields {
        let name = f.name.as_bytes();
        if let Some(i) = hop_by_hop(name) {
            if i == UPGRADE {
                upgrades.push(f.value);
            }
            continue;
        }
        if named.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            continue;
        }
        // `Content_Length` is CONTENT_LENGTH to a CGI-style gateway behind the target.
        if underscores != Underscores::Forward && name.contains(&b'_') {
            if underscores == Underscores::Reject {
                return Err((
                    400,
                    format!(
                        "header field {:?}: underscores in field names are refused \
                         (headers.underscores)",
                        f.name
                    ),
                ));
            }
            underscores_dropped += 1;
            continue;
        }
        match name.len() {
            // The absolute form's authority is the host (RFC 9112 3.2.2): a client's
            // Host field naming another is replaced, not forwarded.
            4 if authority.is_some() && name.eq_ignore_ascii_case(b"host") => continue,
            14 if name.eq_ignore_ascii_case(b"content-length") => continue,
            6 if name.eq_ignore_ascii_case(b"expect") => continue,
            17 if name.eq_ignore_ascii_case(b"x-forwarded-proto") => continue,
            // The balancer's own deadline replaces the client's (headers.deadline).
            19 if name.eq_ignore_ascii_case(DEADLINE_HEADER.as_bytes()) => {
                deadline = parse_deadline_ms(f.value);
                continue;
            }
            12 if name.eq_ignore_ascii_case(b"grpc-timeout") => {
                grpc_timeout = parse_grpc_timeout(f.value);
                continue;
            }
            12 if name.eq_ignore_ascii_case(b"content-type") => {
                grpc = f.value.starts_with(b"application/grpc");
            }
            15 if name.eq_ignore_ascii_case(b"x-forwarded-for") => {
                forwarded_for.push(f.value);
                continue;
            }
            _ => {}
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(f.value);
        out.extend_from_slice(b"\r\n");
    }
    let mut has_host = head.host.is_some();
    if let Some(a) = authority {
        out.extend_from_slice(b"host: ");
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
        has_host = true;
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    for v in forwarded_for.iter().filter(|v| !v.is_empty()) {
        out.extend_from_slice(v);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(client_ip.as_bytes());
    out.extend_from_slice(if https {
        b"\r\nx-forwarded-proto: https\r\nvia: "
    } else {
        b"\r\nx-forwarded-proto: http\r\nvia: "
    });
    out.extend_from_slice(VIA.as_bytes());
    out.extend_from_slice(b"\r\n");
    let upgrade = match upgrades.as_slice() {
        [value]
            if head.method == "GET"
                && !head.http10
                && head.body == RequestBody::None
                && named.iter().any(|n| n.eq_ignore_ascii_case(b"upgrade"))
                && upgradable(value) =>
        {
            Some(*value)
        }
        _ => None,
    };
    Ok(Forwarded {
        out_head: out,
        upgrade,
        has_host,
        // The absolute form's authority is the request's host (RFC 9112 3.2.2).
        host: authority.or(host_field),
        path,
        underscores_dropped,
        deadline,
        grpc_timeout,
        grpc,
    })
}

/// Turns a parsed head into the request the targets get, and finds its route.
pub(crate) fn prepare(
    head: &http1::RequestHead<'_>,
    fields: &[httparse::Header<'_>],
    proxy: &Proxy,
    client_ip: &str,
    https: bool,
) -> Result<Prepared, (u16, String)> {
    // One configuration for the whole request, from routing to the last attempt.
    let table = proxy.table.load_full();
    let fwd =
        forwarded_head_as(head, fields, client_ip, table.underscores, https).inspect_err(|e| {
            if e.0 == 400 && table.underscores == Underscores::Reject {
                proxy.count_dropped("underscore", 1);
            }
        })?;
    if fwd.underscores_dropped > 0 {
        proxy.count_dropped("underscore", fwd.underscores_dropped);
    }
    let pool = table.route(fwd.host, fwd.path).cloned();
    let client_deadline = fwd.client_deadline(table.client_deadline);
    let mut out_head = fwd.out_head;
    if let Some(protocols) = fwd.upgrade {
        out_head.extend_from_slice(b"connection: upgrade\r\nupgrade: ");
        out_head.extend_from_slice(protocols);
        out_head.extend_from_slice(b"\r\n");
    }
    Ok(Prepared {
        head_len: head.len,
        out_head,
        upgrade: fwd.upgrade.is_some(),
        has_host: fwd.has_host,
        head_request: head.method == "HEAD",
        declares_body: matches!(head.method, "POST" | "PUT" | "PATCH"),
        idempotent: is_idempotent(head.method),
        body: head.body,
        keep_alive: head.keep_alive,
        http10: head.http10,
        expect_continue: head.expect_continue,
        grpc: fwd.grpc,
        client_deadline,
        pool,
        table,
    })
}

#[cfg(test)]
mod tests;
