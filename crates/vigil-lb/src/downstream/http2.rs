//! HTTP/2 from clients: over TLS when ALPN chose `h2`, or in cleartext when a plain
//! connection opens with the HTTP/2 preface (prior knowledge, `h2c`; the HTTP/1.1
//! `Upgrade: h2c` dance is refused on purpose, see [`crate::downstream`]). On the `h2`
//! crate, beside the own HTTP/1.1 server, as pingora runs its HTTP/2 sessions.
//!
//! Floor 3, downstream, a child of [`crate::downstream`] (floors: the crate doc): imports
//! its parent, proxy, upstream, and the shared body and http_util.
//!
//! Each stream is one request, served in a task of its own. It is written out as the
//! HTTP/1.1 head it would have been (pingora's `pseudo_raw_h1_request_header`), and
//! that head goes through the very parser and rewrite of the HTTP/1.1 side
//! (`http1::parse_request`, `downstream::prepare`): one set of header rules (hop-by-hop,
//! underscores, `X-Forwarded-*`, `Via`, routing) whichever protocol the client spoke.
//! The body is buffered when it is small and its length known (so the request can be
//! retried), else streamed ([`BodyReader`] over the HTTP/2 stream). The answer, from an
//! HTTP/1.1 or an HTTP/2 target, goes back as HEADERS, DATA as the client's flow
//! control allows, and trailers when the target sent some (gRPC's `grpc-status`).
//!
//! SIGTERM: the connection is told GOAWAY and serves the streams it has; the h2 crate
//! ends it when they are done.
//!
//! Time limits (issue 38: before them, 3,000 connections that had sent half a header
//! block were all open 23 s later, 17 KiB each, and an idle connection was kept for
//! ever). The h2 crate buffers a header block until its last frame and has no clock of
//! its own, so the connection's reader (`Watched`) reads the frame headers going
//! by (`FrameScan`): from the first byte of a HEADERS frame to the end of the frame
//! that carries END_HEADERS, the block must be done within `timeouts.client_header`,
//! as an HTTP/1.1 head must; a connection with no stream being served for
//! `timeouts.client_h2_idle` is idle. Either way the client is told GOAWAY (NO_ERROR,
//! with the last stream served: a request it sent later was not processed and may go
//! elsewhere) and the connection is closed. HAProxy closes both; nginx the idle ones
//! (`keepalive_timeout`).

use crate::access_log::Pending;
use crate::body::BodyReader;
use crate::downstream::{FrontSettings, Stop, local_entry, prepare};
use crate::http_util::VIA;
use crate::proxy::{Proxy, Reply};
use crate::upstream::http2::send_all;
use crate::upstream::{Outgoing, OutgoingBody, ResponseHead, UpstreamResponse};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;
use vigil_core::http1::{self, MAX_HEADERS, RequestBody, RequestError};

/// Streams a client may have open at once on one connection (nginx's
/// `http2_max_concurrent_streams` is 128; gRPC clients open one per call).
const MAX_CONCURRENT_STREAMS: u32 = 256;

/// Longest wait for a GOAWAY to reach a client whose connection is being closed (a
/// client that reads nothing any more is not waited for).
const GOAWAY_FLUSH: Duration = Duration::from_secs(1);

/// Serves an HTTP/2 connection until the client ends it or the drain has finished
/// its streams. `https`: it came over TLS.
pub async fn serve_h2<S>(
    io: S,
    peer: SocketAddr,
    proxy: Arc<Proxy>,
    settings: FrontSettings,
    stop: Stop,
    https: bool,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let watch = Arc::new(Watch::new());
    let io = Watched {
        io,
        scan: FrameScan::new(),
        watch: watch.clone(),
    };
    let handshake = h2::server::Builder::new()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(settings.max_header_bytes as u32)
        .handshake::<_, Bytes>(io);
    let mut conn = match tokio::time::timeout(settings.header_timeout, handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(%peer, "HTTP/2 handshake failed: {e}");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "HTTP/2 preface not done within timeouts.client_header");
            return;
        }
    };
    let client_ip: Arc<str> = peer.ip().to_string().into();
    let mut draining = false;
    let expired = loop {
        let due = watch.due(settings.header_timeout, settings.h2_idle_timeout);
        tokio::select! {
            biased;
            _ = stop.drain.cancelled(), if !draining => {
                draining = true;
                conn.graceful_shutdown();
            }
            _ = stop.close.cancelled() => {
                conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                return;
            }
            // A header block began or a stream ended: the next deadline moved.
            _ = watch.changed.notified() => {}
            _ = tokio::time::sleep_until(due.map_or_else(Instant::now, |d| d.0)), if due.is_some() => {
                if let Some((at, why)) = watch.due(settings.header_timeout, settings.h2_idle_timeout)
                    && at <= Instant::now()
                {
                    break why;
                }
            }
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    let guard = StreamGuard::new(watch.clone());
                    let (proxy, client_ip) = (proxy.clone(), client_ip.clone());
                    tokio::spawn(async move {
                        serve_stream(req, respond, proxy, client_ip, peer, https, settings).await;
                        drop(guard);
                    });
                }
                Some(Err(e)) => {
                    tracing::debug!(%peer, "HTTP/2 connection ended: {e}");
                    return;
                }
                None => {
                    tracing::debug!(%peer, "HTTP/2 connection closed");
                    return;
                }
            }
        }
    };
    match expired {
        Expiry::HeaderBlock => {
            proxy.count_timeout("none", "client_header");
            tracing::debug!(
                %peer,
                "HTTP/2 header block not done within timeouts.client_header: GOAWAY, closing"
            );
        }
        Expiry::Idle => tracing::debug!(
            %peer,
            "HTTP/2 connection idle for timeouts.client_h2_idle: GOAWAY, closing"
        ),
    }
    // GOAWAY with the last stream served, then the h2 crate closes the connection.
    conn.abrupt_shutdown(h2::Reason::NO_ERROR);
    let closing = async { while let Some(Ok(_)) = conn.accept().await {} };
    let _ = tokio::time::timeout(GOAWAY_FLUSH, closing).await;
}

/// Why a connection's time ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expiry {
    /// A header block was not done within `timeouts.client_header`.
    HeaderBlock,
    /// No stream for `timeouts.client_h2_idle`.
    Idle,
}

/// What the connection's loop needs to know of its reader and its streams: when the
/// header block being read began, how many streams are being served, since when none
/// is. Shared by [`Watched`], the stream tasks ([`StreamGuard`]) and [`serve_h2`].
#[derive(Debug)]
struct Watch {
    /// The zero of the times below (tokio's clock: paused in tests).
    start: Instant,
    /// Milliseconds from `start` to the start of the open header block, plus 1; 0
    /// while none is open.
    block_since: AtomicU64,
    /// Streams being served.
    streams: AtomicUsize,
    /// Milliseconds from `start` to the end of the last stream.
    idle_since: AtomicU64,
    /// Told when a header block begins or the last stream ends.
    changed: Notify,
}

impl Watch {
    fn new() -> Watch {
        Watch {
            start: Instant::now(),
            block_since: AtomicU64::new(0),
            streams: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// The next deadline and what it is for: the open header block's, or the idle
    /// time's while no stream is being served.
    fn due(&self, header_timeout: Duration, idle_timeout: Duration) -> Option<(Instant, Expiry)> {
        let ms = Duration::from_millis;
        let block = match self.block_since.load(Ordering::Acquire) {
            0 => None,
            b => Some((self.start + ms(b - 1) + header_timeout, Expiry::HeaderBlock)),
        };
        let idle = (self.streams.load(Ordering::Acquire) == 0).then(|| {
            let since = self.idle_since.load(Ordering::Acquire);
            (self.start + ms(since) + idle_timeout, Expiry::Idle)
        });
        match (block, idle) {
            (Some(b), Some(i)) => Some(if i.0 < b.0 { i } else { b }),
            (b, i) => b.or(i),
        }
    }
}

/// A stream being served: counted in its connection's [`Watch`] while it lives.
struct StreamGuard(Arc<Watch>);

impl StreamGuard {
    fn new(watch: Arc<Watch>) -> StreamGuard {
        watch.streams.fetch_add(1, Ordering::AcqRel);
        StreamGuard(watch)
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let w = &self.0;
        w.idle_since.store(w.now_ms(), Ordering::Release);
        if w.streams.fetch_sub(1, Ordering::AcqRel) == 1 {
            w.changed.notify_one();
        }
    }
}

/// Where a connection's bytes are in HTTP/2's framing (RFC 9113 4.1): the preface,
/// then frames of a 9-byte header (length, type, flags, stream) and a payload. Only
/// header blocks are of interest: a HEADERS frame and the CONTINUATION frames after
/// it, up to the end of the frame with END_HEADERS. Sans-IO: fed what was read.
#[derive(Clone, Debug)]
struct FrameScan {
    /// Bytes to pass over: the rest of the preface, or of a frame's payload.
    skip: u64,
    /// The frame header being read, and how much of it is in.
    head: [u8; 9],
    have: usize,
    /// The frame being passed over ends the header block (END_HEADERS).
    ends_block: bool,
    /// A header block is open.
    in_block: bool,
}

/// The client's connection preface (RFC 9113 3.4): `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
const PREFACE_LEN: u64 = 24;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;

/// What a [`FrameScan::feed`] changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockChange {
    /// A header block is open and began in these bytes.
    Began,
    /// The header block that was open is done, none is open.
    Ended,
    /// As before.
    Same,
}

impl FrameScan {
    fn new() -> FrameScan {
        FrameScan {
            skip: PREFACE_LEN,
            head: [0; 9],
            have: 0,
            ends_block: false,
            in_block: false,
        }
    }

    /// Takes in `bytes`, the next ones the client sent.
    fn feed(&mut self, mut bytes: &[u8]) -> BlockChange {
        let was_open = self.in_block;
        let mut began = false;
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = bytes
                    .len()
                    .min(usize::try_from(self.skip).unwrap_or(usize::MAX));
                self.skip -= n as u64;
                bytes = &bytes[n..];
                if self.skip == 0 && self.ends_block {
                    self.end_frame();
                }
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < 9 {
                break;
            }
            self.have = 0;
            let len = u64::from(u32::from_be_bytes([
                0,
                self.head[0],
                self.head[1],
                self.head[2],
            ]));
            let (kind, flags) = (self.head[3], self.head[4]);
            if kind == HEADERS || (kind == CONTINUATION && self.in_block) {
                began |= !self.in_block;
                self.in_block = true;
                self.ends_block = flags & END_HEADERS != 0;
            } else {
                // Any other frame inside a block is the client's protocol error, which
                // the h2 crate answers; it does not end the block's clock.
                self.ends_block = false;
            }
            self.skip = len;
            if len == 0 && self.ends_block {
                self.end_frame();
            }
        }
        match (was_open, self.in_block) {
            (_, true) if began => BlockChange::Began,
            (true, false) => BlockChange::Ended,
            _ => BlockChange::Same,
        }
    }

    fn end_frame(&mut self) {
        self.in_block = false;
        self.ends_block = false;
    }
}

/// A client connection's reader and writer, telling its [`Watch`] when a header block
/// begins and ends.
struct Watched<S> {
    io: S,
    scan: FrameScan,
    watch: Arc<Watch>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            match this.scan.feed(&buf.filled()[before..]) {
                BlockChange::Began => {
                    let since = this.watch.now_ms() + 1;
                    this.watch.block_since.store(since, Ordering::Release);
                    this.watch.changed.notify_one();
                }
                BlockChange::Ended => this.watch.block_since.store(0, Ordering::Release),
                BlockChange::Same => {}
            }
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, b)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The HTTP/1.1 head an HTTP/2 request would have been: request line, `Host` from
/// `:authority`, the fields, and `Transfer-Encoding: chunked` for a body of unknown
/// length (so that the parser frames it as the body it is).
fn pseudo_head(parts: &http::request::Parts, end_stream: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(if pq.is_empty() { "/" } else { pq }.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let authority = parts.uri.authority();
    if let Some(a) = authority {
        out.extend_from_slice(b"host: ");
        out.extend_from_slice(a.as_str().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let mut has_length = false;
    for (name, value) in &parts.headers {
        if *name == http::header::HOST && authority.is_some() {
            continue;
        }
        // Framing is HTTP/2's; a length the client states is checked against the data.
        if *name == http::header::TRANSFER_ENCODING {
            continue;
        }
        has_length |= *name == http::header::CONTENT_LENGTH;
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !end_stream && !has_length {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

async fn serve_stream(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    proxy: Arc<Proxy>,
    client_ip: Arc<str>,
    peer: SocketAddr,
    https: bool,
    settings: FrontSettings,
) {
    let (parts, mut recv) = req.into_parts();
    let text = pseudo_head(&parts, recv.is_end_stream());
    let prepared = {
        let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        match http1::parse_request(&text, &mut fields) {
            Ok(Some((head, fields))) => prepare(&head, fields, &proxy, &client_ip, https),
            Ok(None) => Err((400, "request head incomplete".to_string())),
            Err(RequestError::TooManyHeaders) => {
                Err((431, format!("more than {MAX_HEADERS} header fields")))
            }
            Err(e) => Err((400, e.to_string())),
        }
    };
    let req = match prepared {
        Ok(r) => r,
        Err((code, msg)) => {
            proxy.count_local("none", code);
            local(&mut respond, code, &msg, false);
            return;
        }
    };
    let head_request = req.head_request;
    // The access log's line, written when this ends however it ends.
    let mut log = req.table.access_log.as_ref().map(|l| {
        let path = l.path_of(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
        let method = parts.method.as_str().to_string();
        let mut p = Box::new(Pending::begin(l, peer, "HTTP/2", method, path));
        p.entry.bytes_in = match req.body {
            RequestBody::None => Some(0),
            RequestBody::Length(n) => Some(n),
            _ => None,
        };
        p.entry.pool = req.pool.as_ref().map(|p| p.name.clone());
        p
    });
    let Some(pool) = req.pool.clone() else {
        proxy.count_local("none", 404);
        let msg = "no route for this host and path";
        local_entry(&mut log, 404, msg, head_request);
        local(&mut respond, 404, msg, head_request);
        return;
    };
    let table = req.table.clone();
    let deadline = table.request_timeout.map(|t| Instant::now() + t);
    let whole = match req.body {
        RequestBody::None => Some(Bytes::new()),
        RequestBody::Length(n) if n <= table.max_retry_body_bytes as u64 => {
            match read_whole(&mut recv, n as usize, table.client_body_timeout).await {
                Ok(b) => Some(b),
                Err((code, msg)) => {
                    proxy.count_local(&pool.name, code);
                    pool.clients.record(code, true);
                    local_entry(&mut log, code, msg, head_request);
                    local(&mut respond, code, msg, head_request);
                    return;
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
        head_request,
        req.declares_body,
        match whole {
            Some(body) => OutgoingBody::Buffered(body),
            None => OutgoingBody::Streamed(length),
        },
        req.idempotent,
    );
    out.set_deadline(req.grpc, req.client_deadline);
    let (answer, served) = if out.is_streamed() {
        let mut reader = BodyReader::h2(recv, table.client_body_timeout);
        proxy
            .forward(&table, &pool, out, Some(&mut reader), deadline)
            .await
    } else {
        proxy.forward(&table, &pool, out, None, deadline).await
    };
    if let Some(l) = log.as_mut() {
        l.entry.attempts = served.attempts;
        l.entry.upstream = served.upstream;
        l.entry.target = served.target.as_ref().map(|t| t.addr.clone());
        if let Reply::Target(resp) = &answer {
            l.entry.status = resp.head.status;
        }
    }
    drop(served);
    match answer {
        Reply::Local(code, msg) => {
            local_entry(&mut log, code, &msg, head_request);
            local(&mut respond, code, &msg, head_request)
        }
        Reply::Target(resp) => {
            let stall = table.response_body_timeout;
            let (cut, sent) = relay(
                respond,
                resp,
                head_request,
                stall,
                deadline,
                settings.write_timeout,
            )
            .await;
            if let Some(l) = log.as_mut() {
                l.entry.bytes_out = sent;
            }
            if let Some(kind) = cut {
                tracing::debug!(pool = %pool.name, "response body cut: timeouts.{kind}");
                proxy.count_timeout(&pool.name, kind);
            }
        }
    }
}

/// Reads a body of `n` bytes whole within `timeout`.
async fn read_whole(
    recv: &mut h2::RecvStream,
    n: usize,
    timeout: Duration,
) -> Result<Bytes, (u16, &'static str)> {
    let mut buf = BytesMut::with_capacity(n);
    let reading = async {
        while let Some(data) = recv.data().await {
            let data = data.map_err(|_| (400, "the request stream broke"))?;
            let _ = recv.flow_control().release_capacity(data.len());
            buf.extend_from_slice(&data);
            if buf.len() > n {
                return Err((400, "more body than its content-length"));
            }
        }
        if buf.len() != n {
            return Err((400, "less body than its content-length"));
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, reading).await {
        Ok(Ok(())) => Ok(buf.freeze()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err((408, "request body too slow")),
    }
}

/// One of vigil's own answers.
fn local(respond: &mut h2::server::SendResponse<Bytes>, code: u16, msg: &str, head_request: bool) {
    let mut b = http::Response::builder()
        .status(code)
        .header("content-type", "text/plain; charset=utf-8")
        .header("via", VIA);
    if code == 503 {
        b = b.header("retry-after", "1");
    }
    let Ok(resp) = b.body(()) else {
        return;
    };
    let body = format!("{msg}\n");
    match respond.send_response(resp, head_request) {
        Ok(mut stream) if !head_request => {
            // Small: within the initial window, no waiting on flow control.
            let _ = stream.send_data(Bytes::from(body), true);
        }
        Ok(_) => {}
        Err(e) => tracing::debug!("HTTP/2 answer not sent: {e}"),
    }
}

/// The target's head as an HTTP/2 response (its fields are end-to-end already).
fn response_head(head: &ResponseHead) -> Option<http::Response<()>> {
    let mut b = http::Response::builder().status(head.status);
    for (name, value) in head.fields() {
        match (
            http::HeaderName::from_bytes(name),
            http::HeaderValue::from_bytes(value),
        ) {
            (Ok(n), Ok(v)) => b = b.header(n, v),
            _ => tracing::debug!(
                "response field {:?} cannot be sent in HTTP/2: left out",
                String::from_utf8_lossy(name)
            ),
        }
    }
    b.header("via", VIA).body(()).ok()
}

/// Sends the target's answer on the stream: head, data as the client's flow control
/// allows (each wait within `write_timeout`), trailers. Returns the timeout kind that
/// cut the body, if one did, and the body bytes sent.
async fn relay(
    mut respond: h2::server::SendResponse<Bytes>,
    resp: UpstreamResponse,
    head_request: bool,
    stall: Duration,
    deadline: Option<Instant>,
    write_timeout: Duration,
) -> (Option<&'static str>, u64) {
    let UpstreamResponse { head, mut body, .. } = resp;
    let Some(r) = response_head(&head) else {
        respond.send_reset(h2::Reason::INTERNAL_ERROR);
        return (None, 0);
    };
    if head_request {
        let _ = respond.send_response(r, true);
        return (None, 0);
    }
    if let Some(whole) = body.ready_now() {
        let (end, len) = (whole.is_empty(), whole.len() as u64);
        if let Ok(mut stream) = respond.send_response(r, end)
            && !end
            && let Err(e) = send_all(&mut stream, whole, true, write_timeout).await
        {
            tracing::debug!("HTTP/2 response body not sent: {e}");
            return (None, 0);
        }
        return (None, len);
    }
    let Ok(mut stream) = respond.send_response(r, false) else {
        return (None, 0);
    };
    let mut sent = 0u64;
    loop {
        let stall_at = Instant::now() + stall;
        let (until, kind) = match deadline {
            Some(d) if d < stall_at => (d, "request"),
            _ => (stall_at, "response_body"),
        };
        let Ok(next) = tokio::time::timeout_at(until, body.frame()).await else {
            stream.send_reset(h2::Reason::CANCEL);
            return (Some(kind), sent);
        };
        match next {
            None => {
                let _ = stream.send_data(Bytes::new(), true);
                return (None, sent);
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    let len = data.len() as u64;
                    if let Err(e) = send_all(&mut stream, data, false, write_timeout).await {
                        tracing::debug!("HTTP/2 response body not sent: {e}");
                        stream.send_reset(h2::Reason::CANCEL);
                        return (None, sent);
                    }
                    sent += len;
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        let _ = stream.send_trailers(trailers);
                        return (None, sent);
                    }
                }
            },
            Some(Err(e)) => {
                // Cut short: the client must see a broken stream, not a whole answer.
                tracing::debug!("target response body broke: {e}");
                stream.send_reset(h2::Reason::INTERNAL_ERROR);
                return (None, sent);
            }
        }
    }
}

/// A connection whose first bytes were already read (the HTTP/2 preface, found while
/// looking for an HTTP/1.1 head): those first, then the socket.
pub struct Prefixed<S> {
    prefix: Bytes,
    io: S,
}

impl<S> Prefixed<S> {
    /// `prefix` then `io`.
    pub fn new(prefix: Bytes, io: S) -> Self {
        Prefixed { prefix, io }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, b)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags, 0, 0, 0, 1]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_header_block_is_open_from_its_first_frame_to_the_end_of_end_headers() {
        use BlockChange::*;
        let settings = frame(0x4, 0, &[]);
        let mut scan = FrameScan::new();
        assert_eq!(scan.feed(PREFACE), Same);
        assert_eq!(scan.feed(&settings), Same);
        // HEADERS without END_HEADERS, a CONTINUATION without, then one with: open
        // until the last byte of the last one, whatever the reads' sizes.
        let mut bytes = frame(HEADERS, 0x1, b"abc");
        bytes.extend(frame(CONTINUATION, 0, b"de"));
        let last = frame(CONTINUATION, END_HEADERS, b"fgh");
        assert_eq!(scan.feed(&bytes[..4]), Same, "a frame header half in");
        assert_eq!(scan.feed(&bytes[4..]), Began);
        assert_eq!(scan.feed(&last[..last.len() - 1]), Same);
        assert_eq!(scan.feed(&last[last.len() - 1..]), Ended);
        // DATA frames open nothing; a HEADERS frame with END_HEADERS is open while its
        // payload trickles in.
        assert_eq!(scan.feed(&frame(0x0, 0x1, &[7; 40])), Same);
        let whole = frame(HEADERS, END_HEADERS | 0x1, &[1; 20]);
        assert_eq!(scan.feed(&whole[..12]), Began);
        assert_eq!(scan.feed(&whole[12..]), Ended);
        // Two whole blocks in one read: nothing stays open; one ending and the next
        // beginning in one read: the clock starts again.
        let mut two = whole.clone();
        two.extend_from_slice(&whole);
        assert_eq!(scan.feed(&two), Same);
        let mut next = whole.clone();
        next.extend_from_slice(&frame(HEADERS, 0, b"x"));
        assert_eq!(scan.feed(&whole[..12]), Began);
        assert_eq!(scan.feed(&next[12..]), Began, "the next block began");
        assert_eq!(scan.feed(&frame(CONTINUATION, END_HEADERS, &[])), Ended);
        // A CONTINUATION outside a block (a protocol error) opens none.
        assert_eq!(scan.feed(&frame(CONTINUATION, 0, b"z")), Same);
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_deadline_is_the_open_blocks_or_the_idle_connections() {
        let (header, idle) = (Duration::from_secs(10), Duration::from_secs(75));
        let w = Arc::new(Watch::new());
        let t0 = w.start;
        assert_eq!(w.due(header, idle), Some((t0 + idle, Expiry::Idle)));
        tokio::time::advance(Duration::from_secs(3)).await;
        w.block_since.store(w.now_ms() + 1, Ordering::Release);
        let block_due = t0 + Duration::from_secs(3) + header;
        assert_eq!(w.due(header, idle), Some((block_due, Expiry::HeaderBlock)));
        w.block_since.store(0, Ordering::Release);
        let guard = StreamGuard::new(w.clone());
        assert_eq!(
            w.due(header, idle),
            None,
            "a stream being served: no deadline"
        );
        tokio::time::advance(Duration::from_secs(100)).await;
        drop(guard);
        assert_eq!(
            w.due(header, idle),
            Some((t0 + Duration::from_secs(103) + idle, Expiry::Idle)),
            "idle from the end of the last stream"
        );
        assert!(
            tokio::time::timeout(Duration::ZERO, w.changed.notified())
                .await
                .is_ok(),
            "the loop is told when the last stream ends"
        );
    }

    #[test]
    fn an_http2_request_is_written_as_the_http1_head_it_would_have_been() {
        let req = http::Request::builder()
            .method("POST")
            .uri("https://api.example:8443/svc.Echo/Say?x=1")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("host", "other")
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        assert_eq!(
            String::from_utf8(pseudo_head(&parts, false)).unwrap(),
            "POST /svc.Echo/Say?x=1 HTTP/1.1\r\nhost: api.example:8443\r\n\
             content-type: application/grpc\r\nte: trailers\r\n\
             transfer-encoding: chunked\r\n\r\n"
        );
        let req = http::Request::builder()
            .uri("/")
            .header("host", "h")
            .header("content-length", "0")
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        assert_eq!(
            String::from_utf8(pseudo_head(&parts, true)).unwrap(),
            "GET / HTTP/1.1\r\nhost: h\r\ncontent-length: 0\r\n\r\n"
        );
    }
}
