//! Connections to targets: a lean HTTP/1.1 client over a per-target pool of TCP
//! connections, driven inside the client request's own task.
//!
//! Floor 6, upstream (floors: the crate doc): imports the shared body and http_util; its
//! child [`http2`] imports from it.
//!
//! Why not hyper's client: a proxy knows its target, its request is already parsed and
//! valid, and its answer goes straight back out to the client ([`crate::downstream`]). hyper's client
//! runs each connection as a task of its own and hands requests, responses and body
//! chunks across channels, which on a busy balancer cost more than the parsing (four
//! task wake-ups per request, measured with `perf`). Here the request's task writes the
//! request (serialised once per request, [`Outgoing`]; one `write` when the body is
//! small), reads and parses the response head (`httparse`, framing rules in
//! [`vigil_core::http1`]) into spans of the bytes read ([`ResponseHead`]: no map of
//! fields is built, they go on as they came), and the response body is read by whoever
//! polls it: the client side, sending it on. A body already in the read buffer (the common
//! small answer) is handed over whole and the connection is back in the pool before the
//! client gets its response.
//!
//! Each target keeps a LIFO list of idle connections (warm ones stay warm, the others
//! age out). A connection goes back only when its exchange ended cleanly with nothing
//! left unread; one whose body was abandoned is closed. An idle connection that the
//! target closed is noticed at checkout from the readiness epoll already reported (no
//! system call in the normal case); one that closes in the very moment a request is sent
//! on it is noticed by the empty answer, and an idempotent request then goes again on a
//! new connection to the same target. An idle connection holds no buffer: its read and
//! write buffers go to the worker's spare list ([`crate::spare`]) when it is checked in
//! and it takes them back for its next exchange, so a burst that leaves hundreds of
//! idle connections behind does not keep 16 KB each (`bench/lb/memory.py --burst`).

/// HTTP/2 to targets (gRPC).
pub mod http2;
/// TLS to targets, and the one dial every connection to a target is made with.
pub mod tls;

use crate::body::{BodyReader, Growth, READ_RESERVE, poll_read_more};
use crate::config::Protocol;
use crate::http_util::{AttemptFailure, connection_options, hop_by_hop};
use crate::spare;
use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use smallvec::SmallVec;
use std::cell::Cell;
use std::io::{self, Write as _};
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};
use tls::{Dialer, TargetStream, TargetTls};
use tokio::io::AsyncWrite;
use vigil_core::http1::{self, ChunkedDecoder, Decoded, Framing};

/// Largest response head accepted from a target (a larger one is a 502).
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// A buffered request body up to this size goes out in the same write as the head.
const INLINE_BODY: usize = 16 * 1024;

/// Idle connections kept per target (shared out among the workers, at least
/// [`MIN_IDLE_PER_WORKER`] each); more close when their exchange ends.
const MAX_IDLE_PER_TARGET: usize = 512;
const MIN_IDLE_PER_WORKER: usize = 8;

/// Workers the pools are sharded for (set once, before the first pool is built).
static WORKERS: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// This thread's worker number: which shard of every pool it uses.
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Sets how many workers (threads with a runtime of their own) the connection pools
/// serve: each worker keeps its own idle connections, so a connection is only ever used
/// by the runtime whose reactor it is registered with (no cross-thread wake-ups).
/// Called once at start, before any pool exists.
pub fn set_workers(n: usize) {
    WORKERS.store(n.max(1), Ordering::Relaxed);
}

/// Marks the calling thread as worker `k` (0-based) for the connection pools.
pub fn set_worker(k: usize) {
    WORKER.with(|w| w.set(k));
}
/// One client request as every attempt sends it: serialised once.
#[derive(Debug)]
pub struct Outgoing {
    /// Request line and header fields, without the final empty line.
    head: Vec<u8>,
    /// The client sent no `Host`: each target gets its own.
    needs_host: bool,
    /// A HEAD request: the answer has no body, whatever its head says.
    head_request: bool,
    /// Safe to send again when a reused connection turned out closed.
    idempotent: bool,
    /// The buffered body (empty when there is none or it is streamed).
    body: Bytes,
    /// The body is streamed from the client with chunked coding (no length known).
    chunked: bool,
    /// The body is streamed from the client.
    streamed: bool,
    /// An upgrade (WebSocket): a `101` answer is final and hands the connection over.
    upgrade: bool,
    /// A gRPC request (`content-type: application/grpc...`): each attempt also
    /// carries `grpc-timeout`.
    grpc: bool,
    /// The deadline the client sent, when `headers.deadline = "trust"` (from the head's
    /// arrival): the balancer waits no longer.
    client_deadline: Option<Duration>,
}

/// The request body as the client sends it.
#[derive(Debug)]
pub enum OutgoingBody {
    /// Read whole already (it can be sent again).
    Buffered(Bytes),
    /// Streamed from the client, once: its length, or none (sent chunked).
    Streamed(Option<u64>),
}

impl Outgoing {
    /// A request whose `head` holds its request line and the fields to forward (each
    /// `name: value` and a line end) but neither `Content-Length` nor
    /// `Transfer-Encoding`: those are written here, from `body`.
    /// `declares_body`: the method defines a body (POST, PUT, PATCH), so an empty one
    /// is declared with a length of 0.
    pub fn new(
        mut head: Vec<u8>,
        has_host: bool,
        head_request: bool,
        declares_body: bool,
        body: OutgoingBody,
        idempotent: bool,
    ) -> Outgoing {
        let streamed = matches!(body, OutgoingBody::Streamed(_));
        let (body, chunked) = match body {
            OutgoingBody::Buffered(b) => {
                if !b.is_empty() || declares_body {
                    let _ = write!(head, "content-length: {}\r\n", b.len());
                }
                (b, false)
            }
            OutgoingBody::Streamed(Some(n)) => {
                let _ = write!(head, "content-length: {n}\r\n");
                (Bytes::new(), false)
            }
            OutgoingBody::Streamed(None) => {
                head.extend_from_slice(b"transfer-encoding: chunked\r\n");
                (Bytes::new(), true)
            }
        };
        Outgoing {
            head,
            needs_host: !has_host,
            head_request,
            idempotent,
            body,
            chunked,
            streamed,
            upgrade: false,
            grpc: false,
            client_deadline: None,
        }
    }

    /// Sets what the client side read of the request's deadline: whether it is gRPC
    /// (each attempt then carries `grpc-timeout` too), and the client's own deadline
    /// when it is trusted. The client's fields themselves are never in the head: each
    /// attempt writes its own ([`write_deadline_fields`]).
    pub fn set_deadline(&mut self, grpc: bool, client_deadline: Option<Duration>) {
        self.grpc = grpc;
        self.client_deadline = client_deadline;
    }

    /// Marks the request as an upgrade (its head has `Connection: upgrade` and
    /// `Upgrade`): a `101 Switching Protocols` answer ends the exchange and the
    /// connection becomes the response's [`Upgraded`] tunnel.
    pub fn set_upgrade(&mut self) {
        self.upgrade = true;
    }
}

impl Outgoing {
    /// Whether the request may be sent twice (an idempotent method).
    pub fn is_idempotent(&self) -> bool {
        self.idempotent
    }

    /// Whether the body is streamed from the client (not buffered).
    pub fn is_streamed(&self) -> bool {
        self.streamed
    }

    /// Request line and fields as every attempt sends them (no final empty line).
    pub fn head_bytes(&self) -> &[u8] {
        &self.head
    }

    /// The buffered body (empty when there is none or it is streamed).
    pub fn buffered_body(&self) -> Bytes {
        self.body.clone()
    }

    /// Whether the request asks for an upgrade ([`Outgoing::set_upgrade`]).
    pub fn is_upgrade(&self) -> bool {
        self.upgrade
    }

    /// The client's trusted deadline ([`Outgoing::set_deadline`]).
    pub fn client_deadline(&self) -> Option<Duration> {
        self.client_deadline
    }

    /// Whether it is a gRPC request ([`Outgoing::set_deadline`]).
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }
}

/// The deadline an attempt carries, in whole milliseconds (rounded down: a target told
/// a deadline must never have less than that), at most
/// [`vigil_core::admission::MAX_DEADLINE`].
pub fn deadline_ms(d: Duration) -> u64 {
    let max = vigil_core::admission::MAX_DEADLINE.as_millis();
    // At most a day: fits.
    d.as_millis().min(max) as u64
}

/// Appends an attempt's deadline fields to a request head being written:
/// `x-vigil-deadline-ms` ([`vigil_core::admission::DEADLINE_HEADER`]) and, on a gRPC
/// request, `grpc-timeout` in milliseconds (at least 1: gRPC's value is positive). No
/// allocation: the digits are written straight into `out`.
pub fn write_deadline_fields(out: &mut Vec<u8>, deadline: Duration, grpc: bool) {
    let ms = deadline_ms(deadline);
    out.extend_from_slice(vigil_core::admission::DEADLINE_HEADER.as_bytes());
    out.extend_from_slice(b": ");
    push_decimal(out, ms);
    out.extend_from_slice(b"\r\n");
    if grpc {
        out.extend_from_slice(b"grpc-timeout: ");
        push_decimal(out, ms.max(1));
        out.extend_from_slice(b"m\r\n");
    }
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Where a kept header field is in the response's read buffer.
#[derive(Debug, Clone, Copy)]
struct FieldSpan {
    start: u32,
    colon: u32,
    end: u32,
}

/// A target's response head as it goes on to the client: the status, the reason, the
/// end-to-end fields (hop-by-hop ones and those `Connection` names already left out,
/// `Content-Length` too when `Transfer-Encoding` framed the body), as spans of the
/// bytes read, and how the body is framed.
#[derive(Debug)]
pub struct ResponseHead {
    /// Status code.
    pub status: u16,
    /// How the target framed the body.
    pub framing: Framing,
    read: Bytes,
    reason: Range<usize>,
    fields: SmallVec<[FieldSpan; 12]>,
}

impl ResponseHead {
    /// A head made from a status and fields that did not arrive as HTTP/1.1 (an
    /// HTTP/2 answer): written out once as HTTP/1.1 text, spans into it.
    pub fn synthesize<'a>(
        status: u16,
        fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
        framing: Framing,
    ) -> ResponseHead {
        let mut text = Vec::with_capacity(256);
        let mut spans = SmallVec::new();
        for (name, value) in fields {
            if hop_by_hop(name).is_some() {
                continue;
            }
            let start = text.len();
            text.extend_from_slice(name);
            let colon = text.len();
            text.extend_from_slice(b": ");
            text.extend_from_slice(value);
            // Past 4 GiB of fields the rest is left out (spans are 32-bit).
            let Ok(end) = u32::try_from(text.len()) else {
                break;
            };
            spans.push(FieldSpan {
                start: start as u32,
                colon: colon as u32,
                end,
            });
            text.extend_from_slice(b"\r\n");
        }
        ResponseHead {
            status,
            framing,
            read: Bytes::from(text),
            reason: 0..0,
            fields: spans,
        }
    }

    /// Each field as (name, value).
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields.iter().map(|f| {
            (
                &self.read[f.start as usize..f.colon as usize],
                self.read[f.colon as usize + 1..f.end as usize].trim_ascii(),
            )
        })
    }

    /// Appends the status line and the fields, each line with its end (no empty line).
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"HTTP/1.1 ");
        let code = itoa_status(self.status);
        out.extend_from_slice(&code);
        out.push(b' ');
        if self.reason.is_empty() {
            // An answer that had no reason phrase (HTTP/2): the usual one.
            let reason = http::StatusCode::from_u16(self.status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("");
            out.extend_from_slice(reason.as_bytes());
        } else {
            out.extend_from_slice(&self.read[self.reason.clone()]);
        }
        out.extend_from_slice(b"\r\n");
        for f in &self.fields {
            out.extend_from_slice(&self.read[f.start as usize..f.end as usize]);
            out.extend_from_slice(b"\r\n");
        }
    }

    /// The value of the first field named `name` (any case), trimmed.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields.iter().find_map(|f| {
            let n = &self.read[f.start as usize..f.colon as usize];
            n.eq_ignore_ascii_case(name.as_bytes())
                .then(|| self.read[f.colon as usize + 1..f.end as usize].trim_ascii())
        })
    }
}

/// Three ASCII digits of a status code (100..=999 by then).
fn itoa_status(status: u16) -> [u8; 3] {
    [
        b'0' + (status / 100 % 10) as u8,
        b'0' + (status / 10 % 10) as u8,
        b'0' + (status % 10) as u8,
    ]
}

/// A target's response: head, and body to read.
#[derive(Debug)]
pub struct UpstreamResponse {
    /// The head.
    pub head: ResponseHead,
    /// The body.
    pub body: UpstreamResponseBody,
    /// After a `101` to an upgrade: the connection, no longer HTTP (never pooled).
    pub upgraded: Option<Upgraded>,
}

impl UpstreamResponse {
    /// An HTTP/2 answer: its head, and its body read from `body` (data, then trailers).
    pub fn from_h2(status: u16, headers: &http::HeaderMap, body: h2::RecvStream) -> Self {
        let end = body.is_end_stream();
        UpstreamResponse {
            head: ResponseHead::from_h2(status, headers, end),
            body: UpstreamResponseBody {
                state: if end {
                    BodyState::Ready(None)
                } else {
                    BodyState::H2(body, false)
                },
                conn: None,
                keep_alive: false,
            },
            upgraded: None,
        }
    }
}

/// A target connection switched to another protocol by a `101` answer.
#[derive(Debug)]
pub struct Upgraded {
    /// The connection.
    pub stream: TargetStream,
    /// What the target sent after its `101` head (the new protocol's first bytes).
    pub read_ahead: Bytes,
}

/// One connection to a target, with its buffers.
#[derive(Debug)]
struct Conn {
    stream: TargetStream,
    /// The target's TLS settings it was made under ([`Dialer::generation`]).
    generation: u64,
    /// Bytes read and not yet consumed.
    rbuf: BytesMut,
    /// The request being written.
    wbuf: Vec<u8>,
}

impl Conn {
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        poll_read_more(&mut self.stream, &mut self.rbuf, Growth::Body, cx)
    }

    async fn read(&mut self) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_read(cx)).await
    }

    /// Writes `buf` unless the target answers (or closes) first: a target refusing an
    /// upload (413) often stops reading it, and would hold the write forever.
    /// `Ok(false)`: it answered; what it sent is in the read buffer. A target that takes
    /// none of it for `stall` is an error of kind `TimedOut`.
    async fn write_unless_answered(&mut self, mut buf: &[u8], stall: Duration) -> io::Result<bool> {
        /// What one wait brought.
        enum Step {
            Wrote(usize),
            Flushed,
            Answered,
            Interim,
        }
        loop {
            // Each wait for the target to take more is bounded by `stall`.
            let step = std::future::poll_fn(|cx| {
                if buf.is_empty() {
                    // TLS keeps records until flushed (a no-op on plain TCP).
                    return Pin::new(&mut self.stream)
                        .poll_flush(cx)
                        .map_ok(|()| Step::Flushed);
                }
                match Pin::new(&mut self.stream).poll_write(cx, buf) {
                    Poll::Ready(Ok(0)) => Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(r) => Poll::Ready(r.map(Step::Wrote)),
                    // Blocked: the target may have answered instead. Readiness can be
                    // stale: only bytes (or the end) say it did.
                    Poll::Pending => match ready!(self.poll_read(cx)) {
                        Ok(0) => Poll::Ready(Ok(Step::Answered)),
                        Ok(_) if self.skip_interim() => Poll::Ready(Ok(Step::Interim)),
                        Ok(_) => Poll::Ready(Ok(Step::Answered)),
                        Err(e) => Poll::Ready(Err(e)),
                    },
                }
            });
            let step = tokio::time::timeout(stall, step).await.map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the target took none of the request",
                )
            })??;
            match step {
                Step::Flushed => return Ok(true),
                Step::Wrote(n) => buf = &buf[n..],
                Step::Answered => return Ok(false),
                Step::Interim => {}
            }
        }
    }
}

impl Conn {
    /// Drops complete interim (1xx, not 101) heads at the start of the read buffer: a
    /// `100 Continue` mid-upload asks for the rest of the body, it is not an answer.
    /// True when nothing else was read (keep sending).
    fn skip_interim(&mut self) -> bool {
        loop {
            match http1::parse_response(&self.rbuf, false, |_, _| {}) {
                Ok(Some(h)) if (100..200).contains(&h.status) && h.status != 101 => {
                    self.rbuf.advance(h.len);
                    if self.rbuf.is_empty() {
                        return true;
                    }
                }
                _ => return false,
            }
        }
    }
}

#[derive(Debug)]
struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

/// The connections of one target.
#[derive(Debug)]
pub struct ConnPool {
    /// How a connection to it is made: address, TLS or not.
    dialer: Dialer,
    /// Idle connections, one list per worker.
    idle: Box<[Mutex<Vec<Idle>>]>,
    /// Idle connections kept per worker.
    idle_cap: usize,
    /// Whether the target speaks HTTP/2 (`protocol = "h2"`; set on reload).
    h2: std::sync::atomic::AtomicBool,
    /// Its HTTP/2 connections, one per worker.
    h2_conns: crate::upstream::http2::H2Conns,
}

/// The time limits of one attempt.
#[derive(Clone, Copy, Debug)]
pub struct AttemptTimeouts {
    /// Connecting.
    pub connect: Duration,
    /// An idle pooled connection older than this is not used.
    pub idle: Duration,
    /// A streamed body's response head, from the body's end.
    pub head: Duration,
    /// Longest wait for the target to take more of the request.
    pub send: Duration,
    /// The time the balancer will still wait for this attempt's response header, sent
    /// to the target as its deadline ([`write_deadline_fields`]).
    pub deadline: Duration,
}

/// How an exchange failed.
enum ExchangeError {
    /// The connection closed or broke before any byte of an answer: on a reused
    /// connection, most likely closed by the target while idle.
    NoAnswer,
    /// Anything else.
    Failed(AttemptFailure),
}

impl ConnPool {
    /// An empty pool for `addr` (`host:port`).
    pub fn new(addr: &str) -> Arc<Self> {
        let workers = WORKERS.load(Ordering::Relaxed);
        Arc::new(ConnPool {
            dialer: Dialer::new(addr),
            idle: (0..workers).map(|_| Mutex::new(Vec::new())).collect(),
            idle_cap: (MAX_IDLE_PER_TARGET / workers).max(MIN_IDLE_PER_WORKER),
            h2: std::sync::atomic::AtomicBool::new(false),
            h2_conns: crate::upstream::http2::H2Conns::new(workers),
        })
    }

    /// Speak `protocol` to this target from now on, over `tls` or in cleartext. A change
    /// of TLS settings (a reload re-reads them) closes the idle connections at once;
    /// one busy now closes when its exchange ends (its generation is old, `checkin`),
    /// and an HTTP/2 connection is replaced at its worker's next request.
    pub fn set_protocol(&self, protocol: Protocol, tls: Option<Arc<TargetTls>>) {
        self.h2.store(protocol == Protocol::H2, Ordering::Relaxed);
        if self.dialer.set_tls(tls) {
            for shard in &self.idle {
                shard.lock().expect("idle lock").clear();
            }
        }
    }

    /// How connections to this target are made (a health check makes its own).
    pub fn dialer(&self) -> &Dialer {
        &self.dialer
    }

    /// Idle connections now.
    pub fn idle_count(&self) -> usize {
        self.idle
            .iter()
            .map(|s| s.lock().expect("idle lock").len())
            .sum()
    }

    /// This worker's idle connections.
    fn shard(&self) -> &Mutex<Vec<Idle>> {
        &self.idle[WORKER.with(Cell::get) % self.idle.len()]
    }

    /// Bytes of buffer the idle connections hold (none: they gave them away).
    #[cfg(test)]
    fn idle_buffer_bytes(&self) -> usize {
        self.idle
            .iter()
            .flat_map(|s| {
                s.lock()
                    .expect("idle lock")
                    .iter()
                    .map(|i| i.conn.rbuf.capacity() + i.conn.wbuf.capacity())
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    /// Closes idle connections unused for `max_idle` or more, or closed by the target.
    pub fn evict_idle(&self, max_idle: Duration) {
        let now = Instant::now();
        for shard in &self.idle {
            shard.lock().expect("idle lock").retain_mut(|i| {
                now.duration_since(i.since) < max_idle && i.conn.stream.is_usable()
            });
        }
    }

    /// The most recently used idle connection that is usable.
    fn checkout(&self, max_idle: Duration) -> Option<Box<Conn>> {
        let mut idle = self.shard().lock().expect("idle lock");
        while let Some(mut i) = idle.pop() {
            if i.since.elapsed() < max_idle && i.conn.stream.is_usable() {
                return Some(i.conn);
            }
        }
        None
    }

    /// Gives back a connection whose exchange ended with nothing left unread.
    fn checkin(&self, mut conn: Box<Conn>) {
        // Unread bytes, or made under TLS settings a reload has since changed: closed.
        if !conn.rbuf.is_empty() || conn.generation != self.dialer.generation() {
            return;
        }
        // Idle, it holds no buffer (one grown large by a big head or body is freed).
        spare::give_read(std::mem::take(&mut conn.rbuf));
        spare::give_write(std::mem::take(&mut conn.wbuf));
        let mut idle = self.shard().lock().expect("idle lock");
        // Past the cap (a burst's worth), the connection closes rather than idles.
        if idle.len() < self.idle_cap {
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }

    async fn connect(&self, timeout: Duration) -> Result<Box<Conn>, AttemptFailure> {
        let generation = self.dialer.generation();
        match self.dialer.dial(Protocol::Http1, timeout).await {
            Ok(stream) => Ok(Box::new(Conn {
                stream,
                generation,
                // Not from the spare list: measured, a burst of new connections
                // then held ~0.8 KB more per request in flight (docs/lb.md, "A burst").
                rbuf: BytesMut::with_capacity(READ_RESERVE),
                wbuf: Vec::with_capacity(512),
            })),
            Err(e) => {
                tracing::debug!(target_addr = %self.dialer.addr(), "connect failed: {e}");
                Err(AttemptFailure::Connect)
            }
        }
    }

    /// Sends `req` (with `host` as its `Host` when it has none, and `streamed` as its
    /// body when the body is streamed) on an idle connection or a new one, and waits for
    /// the response head. A streamed body's attempt gets its response head within
    /// `t.head` of the body's end (the caller times the others from their start).
    pub async fn send(
        self: &Arc<Self>,
        req: &Outgoing,
        host: &[u8],
        mut streamed: Option<&mut BodyReader<'_>>,
        t: AttemptTimeouts,
    ) -> Result<UpstreamResponse, AttemptFailure> {
        if self.h2.load(Ordering::Relaxed) {
            let worker = WORKER.with(Cell::get);
            return self
                .h2_conns
                .send(&self.dialer, worker, req, host, streamed, t)
                .await;
        }
        loop {
            let (mut conn, reused) = match self.checkout(t.idle) {
                Some(c) => (c, true),
                None => (self.connect(t.connect).await?, false),
            };
            let replayable = streamed.is_none();
            match self
                .exchange(&mut conn, req, host, streamed.take(), t)
                .await
            {
                Ok(head) => return self.respond(conn, head),
                Err(ExchangeError::NoAnswer) if reused && replayable && req.idempotent => {
                    tracing::debug!(target_addr = %self.dialer.addr(), "pooled connection closed by the target: sending again on a new one");
                }
                Err(ExchangeError::NoAnswer) => return Err(AttemptFailure::Reset),
                Err(ExchangeError::Failed(f)) => return Err(f),
            }
        }
    }

    /// Writes the request and reads up to a final response head (1xx skipped).
    async fn exchange(
        &self,
        conn: &mut Conn,
        req: &Outgoing,
        host: &[u8],
        streamed: Option<&mut BodyReader<'_>>,
        t: AttemptTimeouts,
    ) -> Result<Head, ExchangeError> {
        // A pooled connection gave its buffers away while idle.
        if conn.wbuf.capacity() == 0 {
            conn.wbuf = spare::take_write();
        }
        if conn.rbuf.capacity() == 0 {
            conn.rbuf = spare::take_read(spare::TARGET_READ);
        }
        conn.wbuf.clear();
        conn.wbuf.extend_from_slice(&req.head);
        if req.needs_host {
            conn.wbuf.extend_from_slice(b"host: ");
            conn.wbuf.extend_from_slice(host);
            conn.wbuf.extend_from_slice(b"\r\n");
        }
        write_deadline_fields(&mut conn.wbuf, t.deadline, req.grpc);
        conn.wbuf.extend_from_slice(b"\r\n");
        let inline = req.body.len() <= INLINE_BODY;
        if inline {
            conn.wbuf.extend_from_slice(&req.body);
        }
        let broken = |e: io::Error| {
            tracing::debug!(target_addr = %self.dialer.addr(), "sending the request failed: {e}");
            ExchangeError::NoAnswer
        };
        // A target that takes nothing for `t.send` is frozen: a 504, not a wait forever.
        let stalled = |_| {
            tracing::debug!(target_addr = %self.dialer.addr(), "the target took none of the request within timeouts.send");
            ExchangeError::Failed(AttemptFailure::SendStall)
        };
        tokio::time::timeout(t.send, conn.stream.write_now(&conn.wbuf))
            .await
            .map_err(stalled)?
            .map_err(broken)?;
        if !inline {
            tokio::time::timeout(t.send, conn.stream.write_now(&req.body))
                .await
                .map_err(stalled)?
                .map_err(broken)?;
        }
        // A target may answer before the whole body is sent (a 413, say) and close: its
        // answer is still read, and the connection is not reused.
        let mut cut_short = false;
        let streamed_body = streamed.is_some();
        if let Some(body) = streamed {
            cut_short = self.stream_body(conn, body, req.chunked, t.send).await?;
        }
        if streamed_body {
            // The response-header timeout runs from the end of the upload.
            match tokio::time::timeout(t.head, self.read_head(conn, req, cut_short)).await {
                Ok(r) => r,
                Err(_) => Err(ExchangeError::Failed(AttemptFailure::Timeout)),
            }
        } else {
            self.read_head(conn, req, cut_short).await
        }
    }

    /// Reads up to a final response head (1xx skipped). `cut_short`: the request body
    /// did not all go out (the connection is not reused).
    async fn read_head(
        &self,
        conn: &mut Conn,
        req: &Outgoing,
        cut_short: bool,
    ) -> Result<Head, ExchangeError> {
        let mut answered = false;
        loop {
            if !conn.rbuf.is_empty() {
                answered = true;
                // Parsed from a frozen view of what was read, so that header values are
                // slices of it (shared, not copied).
                let read = conn.rbuf.split().freeze();
                let base = read.as_ptr() as usize;
                let mut fields: SmallVec<[FieldSpan; 12]> = SmallVec::new();
                // Fields naming this connection (hop-by-hop) are not kept: they
                // describe this connection only.
                let mut named: SmallVec<[&[u8]; 2]> = SmallVec::new();
                let mut odd_coding = false;
                let parsed = http1::parse_response(&read, req.head_request, |name, value| {
                    if let Some(i) = hop_by_hop(name.as_bytes()) {
                        match i {
                            0 => named.extend(connection_options(value)),
                            // A coding besides chunked (gzip) would be lost when the
                            // body is framed again for the client.
                            3 => odd_coding |= !value.trim_ascii().eq_ignore_ascii_case(b"chunked"),
                            _ => {}
                        }
                        return;
                    }
                    let start = name.as_ptr() as usize - base;
                    let colon = start + name.len();
                    let end = if value.is_empty() {
                        colon + 1
                    } else {
                        value.as_ptr() as usize - base + value.len()
                    };
                    // Within MAX_RESPONSE_HEAD (64 KiB) of the start: fits in u32.
                    fields.push(FieldSpan {
                        start: start as u32,
                        colon: colon as u32,
                        end: end as u32,
                    });
                });
                if !named.is_empty() {
                    fields.retain(|f| {
                        let n = &read[f.start as usize..f.colon as usize];
                        !named.iter().any(|m| m.eq_ignore_ascii_case(n))
                    });
                }
                drop(named);
                match parsed {
                    Ok(Some(h)) if h.status == 101 => {
                        let fields = if req.upgrade {
                            switching_fields(&read[..h.len], base)
                        } else {
                            None
                        };
                        let Some(fields) = fields else {
                            tracing::debug!(target_addr = %self.dialer.addr(), "101 Switching Protocols to a request without Upgrade, or without its own");
                            return Err(ExchangeError::Failed(AttemptFailure::Garbage));
                        };
                        return Ok(Head { h, fields, read });
                    }
                    Ok(Some(h)) if h.status < 200 => {
                        conn.rbuf = unfreeze(read.slice(h.len..));
                        continue;
                    }
                    Ok(Some(h)) if odd_coding && h.status >= 200 => {
                        tracing::debug!(target_addr = %self.dialer.addr(), "a transfer coding other than chunked in the response");
                        return Err(ExchangeError::Failed(AttemptFailure::Garbage));
                    }
                    Ok(Some(mut h)) => {
                        h.keep_alive &= !cut_short;
                        return Ok(Head { h, fields, read });
                    }
                    Ok(None) if read.len() >= MAX_RESPONSE_HEAD => {
                        tracing::debug!(target_addr = %self.dialer.addr(), "response head over {MAX_RESPONSE_HEAD} bytes");
                        return Err(ExchangeError::Failed(AttemptFailure::Garbage));
                    }
                    Ok(None) => conn.rbuf = unfreeze(read),
                    Err(e) => {
                        tracing::debug!(target_addr = %self.dialer.addr(), "{e}");
                        return Err(ExchangeError::Failed(AttemptFailure::Garbage));
                    }
                }
            }
            match conn.read().await {
                Ok(0) | Err(_) if !answered => return Err(ExchangeError::NoAnswer),
                Ok(0) => {
                    tracing::debug!(target_addr = %self.dialer.addr(), "connection closed in the response head");
                    return Err(ExchangeError::Failed(AttemptFailure::Reset));
                }
                Err(e) => {
                    tracing::debug!(target_addr = %self.dialer.addr(), "reading the response failed: {e}");
                    return Err(ExchangeError::Failed(AttemptFailure::Reset));
                }
                Ok(_) => {}
            }
        }
    }

    /// Copies a streamed client body to the target, chunked when its length is unknown.
    /// `Ok(true)`: the target stopped taking it (it may have answered already).
    async fn stream_body(
        &self,
        conn: &mut Conn,
        body: &mut BodyReader<'_>,
        chunked: bool,
        stall: Duration,
    ) -> Result<bool, ExchangeError> {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            tracing::debug!(target_addr = %self.dialer.addr(), "{what}: {e}");
            true
        };
        while let Some(data) = body.next_data().await {
            let data = data.map_err(|e| {
                tracing::debug!(target_addr = %self.dialer.addr(), "the client's request body broke: {e}");
                // The client's fault, not the target's: 408 when it stalled, else 400.
                let code = if e.kind() == io::ErrorKind::TimedOut {
                    408
                } else {
                    400
                };
                ExchangeError::Failed(AttemptFailure::Client(code))
            })?;
            if data.is_empty() {
                continue;
            }
            conn.wbuf.clear();
            if chunked {
                let _ = write!(conn.wbuf, "{:x}\r\n", data.len());
            }
            conn.wbuf.extend_from_slice(&data);
            if chunked {
                conn.wbuf.extend_from_slice(b"\r\n");
            }
            let wbuf = std::mem::take(&mut conn.wbuf);
            let sent = conn.write_unless_answered(&wbuf, stall).await;
            conn.wbuf = wbuf;
            match sent {
                Ok(true) => {}
                Ok(false) => {
                    tracing::debug!(target_addr = %self.dialer.addr(), "the target answered before the whole request body");
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    tracing::debug!(target_addr = %self.dialer.addr(), "the target took none of the request body within timeouts.send");
                    return Err(ExchangeError::Failed(AttemptFailure::SendStall));
                }
                Err(e) => return Ok(failed("sending the request body failed", &e)),
            }
        }
        if chunked {
            match conn.write_unless_answered(b"0\r\n\r\n", stall).await {
                Ok(true) => {}
                Ok(false) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    return Err(ExchangeError::Failed(AttemptFailure::SendStall));
                }
                Err(e) => return Ok(failed("sending the request body failed", &e)),
            }
        }
        Ok(false)
    }

    /// Turns a parsed head into the response; a body already read whole gives the
    /// connection back now.
    fn respond(
        self: &Arc<Self>,
        mut conn: Box<Conn>,
        head: Head,
    ) -> Result<UpstreamResponse, AttemptFailure> {
        let Head { h, fields, read } = head;
        let after = read.slice(h.len..);
        if h.status == 101 {
            // Only an upgrade gets here (`read_head`): the connection is the tunnel's.
            return Ok(UpstreamResponse {
                head: ResponseHead {
                    status: 101,
                    framing: Framing::Empty,
                    read: read.slice(..h.len),
                    reason: h.reason,
                    fields,
                },
                body: UpstreamResponseBody {
                    state: BodyState::Ready(None),
                    conn: None,
                    keep_alive: false,
                },
                upgraded: Some(Upgraded {
                    stream: conn.stream,
                    read_ahead: after,
                }),
            });
        }
        let state = match h.framing {
            Framing::Length(n) if after.len() as u64 >= n => {
                let n = n as usize;
                // Bytes past the answer were never asked for: the connection is not
                // reused (checkin refuses a buffer that is not empty).
                conn.rbuf.extend_from_slice(&after[n..]);
                BodyState::Ready(Some(after.slice(..n)))
            }
            framing => {
                if !after.is_empty() {
                    conn.rbuf = unfreeze(after);
                }
                match framing {
                    Framing::Empty => BodyState::Ready(None),
                    Framing::Length(n) => BodyState::Length(n),
                    Framing::Chunked => BodyState::Chunked(ChunkedDecoder::new()),
                    Framing::UntilClose => BodyState::UntilClose,
                }
            }
        };
        let conn = if matches!(state, BodyState::Ready(_)) {
            if h.keep_alive {
                self.checkin(conn);
            }
            None
        } else {
            Some((self.clone(), conn))
        };
        Ok(UpstreamResponse {
            head: ResponseHead {
                status: h.status,
                framing: h.framing,
                read: read.slice(..h.len),
                reason: h.reason,
                fields,
            },
            body: UpstreamResponseBody {
                state,
                conn,
                keep_alive: h.keep_alive,
            },
            upgraded: None,
        })
    }
}

/// The fields of a `101 Switching Protocols` head (`head`, at address `base`) to pass
/// on: its `Upgrade` (which must be there: it names the protocol switched to) and the
/// end-to-end ones (`Sec-WebSocket-Accept`); `None` without `Upgrade`. Parsed here,
/// off the usual path, because the framing parser leaves interim heads' fields out.
fn switching_fields(head: &[u8], base: usize) -> Option<SmallVec<[FieldSpan; 12]>> {
    let mut raw = [httparse::EMPTY_HEADER; http1::MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut raw);
    resp.parse(head).ok()?;
    let named: SmallVec<[&[u8]; 2]> = resp
        .headers
        .iter()
        .filter(|f| f.name.eq_ignore_ascii_case("connection"))
        .flat_map(|f| connection_options(f.value))
        .collect();
    let mut fields = SmallVec::new();
    let mut upgrade = false;
    for f in resp.headers.iter() {
        let name = f.name.as_bytes();
        match hop_by_hop(name) {
            Some(crate::http_util::UPGRADE) => upgrade = true,
            Some(_) => continue,
            None if named
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name) && !n.eq_ignore_ascii_case(b"upgrade")) =>
            {
                continue;
            }
            None => {}
        }
        let start = name.as_ptr() as usize - base;
        let colon = start + name.len();
        let end = if f.value.is_empty() {
            colon + 1
        } else {
            f.value.as_ptr() as usize - base + f.value.len()
        };
        fields.push(FieldSpan {
            start: start as u32,
            colon: colon as u32,
            end: end as u32,
        });
    }
    upgrade.then_some(fields)
}

/// A final response head: its framing, its fields, and everything read with it.
struct Head {
    h: http1::ResponseHead,
    fields: SmallVec<[FieldSpan; 12]>,
    /// The bytes read so far, head first (what follows it is body).
    read: Bytes,
}

/// Bytes back into a read buffer: without a copy when nothing else holds them.
fn unfreeze(b: Bytes) -> BytesMut {
    b.try_into_mut().unwrap_or_else(|b| {
        let mut m = BytesMut::with_capacity(b.len().max(READ_RESERVE));
        m.extend_from_slice(&b);
        m
    })
}

#[derive(Debug)]
enum BodyState {
    /// The whole body, or nothing more (`None`).
    Ready(Option<Bytes>),
    /// This many bytes still to come.
    Length(u64),
    /// Chunked.
    Chunked(ChunkedDecoder),
    /// Until the target closes.
    UntilClose,
    /// An HTTP/2 stream: data, then trailers (true once the data ended).
    H2(h2::RecvStream, bool),
}

/// A target's response body, read as it is polled; gives its connection back to the
/// pool once read to the end (a body dropped before that closes it).
#[derive(Debug)]
pub struct UpstreamResponseBody {
    state: BodyState,
    /// The connection (and the pool it goes back to), while the body is still arriving
    /// on it.
    conn: Option<(Arc<ConnPool>, Box<Conn>)>,
    keep_alive: bool,
}

impl UpstreamResponseBody {
    /// The whole body, when it is already in memory (its connection already back in
    /// the pool); `None` when it still has to be read from the target.
    pub fn ready_now(&mut self) -> Option<Bytes> {
        match &mut self.state {
            BodyState::Ready(b) => Some(b.take().unwrap_or_default()),
            _ => None,
        }
    }

    /// The body ended cleanly: give the connection back.
    fn finish(&mut self) {
        self.state = BodyState::Ready(None);
        if let Some((pool, conn)) = self.conn.take()
            && self.keep_alive
        {
            pool.checkin(conn);
        }
    }

    fn fail(&mut self, e: io::Error) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.state = BodyState::Ready(None);
        self.conn = None;
        Poll::Ready(Some(Err(e)))
    }
}

impl Body for UpstreamResponseBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        if let BodyState::H2(recv, data_done) = &mut this.state {
            if !*data_done {
                match ready!(recv.poll_data(cx)) {
                    Some(Ok(data)) => {
                        let _ = recv.flow_control().release_capacity(data.len());
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Some(Err(e)) => return this.fail(io::Error::other(e)),
                    None => *data_done = true,
                }
            }
            return match ready!(recv.poll_trailers(cx)) {
                Ok(trailers) => {
                    this.state = BodyState::Ready(None);
                    Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))))
                }
                Err(e) => this.fail(io::Error::other(e)),
            };
        }
        loop {
            let conn = match &mut this.state {
                BodyState::Ready(b) => return Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
                _ => {
                    &mut this
                        .conn
                        .as_mut()
                        .expect("a body still arriving has its connection")
                        .1
                }
            };
            // First what the buffer holds.
            match &mut this.state {
                BodyState::Length(left) if !conn.rbuf.is_empty() => {
                    let n = conn
                        .rbuf
                        .len()
                        .min(usize::try_from(*left).unwrap_or(usize::MAX));
                    let data = conn.rbuf.split_to(n).freeze();
                    *left -= n as u64;
                    if *left == 0 {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                BodyState::Chunked(dec) => match dec.decode(&conn.rbuf) {
                    Ok((_, Decoded::Data(r))) => {
                        conn.rbuf.advance(r.start);
                        let data = conn.rbuf.split_to(r.len()).freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Ok((n, Decoded::NeedMore)) => conn.rbuf.advance(n),
                    Ok((n, Decoded::End)) => {
                        conn.rbuf.advance(n);
                        this.finish();
                        return Poll::Ready(None);
                    }
                    Err(e) => return this.fail(io::Error::new(io::ErrorKind::InvalidData, e)),
                },
                BodyState::UntilClose if !conn.rbuf.is_empty() => {
                    let data = conn.rbuf.split().freeze();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                _ => {}
            }
            // Then more from the target.
            match ready!(conn.poll_read(cx)) {
                Ok(0) if matches!(this.state, BodyState::UntilClose) => {
                    this.state = BodyState::Ready(None);
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    return this.fail(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the target closed the connection in the response body",
                    ));
                }
                Ok(_) => {}
                Err(e) => return this.fail(e),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, BodyState::Ready(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            BodyState::Ready(None) => SizeHint::with_exact(0),
            BodyState::Ready(Some(b)) => SizeHint::with_exact(b.len() as u64),
            BodyState::Length(n) => SizeHint::with_exact(*n),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests;
