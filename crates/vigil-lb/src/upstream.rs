//! Connections to targets: a lean HTTP/1.1 client over a per-target pool of TCP
//! connections, driven inside the client request's own task.
//!
//! Why not hyper's client: a proxy knows its target, its request is already parsed and
//! valid, and its answer goes straight back out through hyper's server. hyper's client
//! runs each connection as a task of its own and hands requests, responses and body
//! chunks across channels, which on a busy balancer cost more than the parsing (four
//! task wake-ups per request, measured with `perf`). Here the request's task writes the
//! request (serialised once per request, [`Outgoing`]; one `write` when the body is
//! small), reads and parses the response head (`httparse`, framing rules in
//! [`vigil_core::http1`]), and the response body is read by whoever polls it: hyper's
//! server, sending it on to the client. A body already in the read buffer (the common
//! small answer) is handed over whole and the connection is back in the pool before the
//! client gets its response.
//!
//! Each target keeps a LIFO list of idle connections (warm ones stay warm, the others
//! age out). A connection goes back only when its exchange ended cleanly with nothing
//! left unread; one whose body was abandoned is closed. An idle connection that the
//! target closed is noticed at checkout from the readiness epoll already reported (no
//! system call in the normal case); one that closes in the very moment a request is sent
//! on it is noticed by the empty answer, and an idempotent request then goes again on a
//! new connection to the same target.

use crate::proxy::{Failure, connection_options, hop_by_hop_index};
use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Uri};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use vigil_core::http1::{self, ChunkedDecoder, Decoded, Framing};

/// Largest response head accepted from a target (a larger one is a 502).
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// A buffered request body up to this size goes out in the same write as the head.
const INLINE_BODY: usize = 16 * 1024;
/// Read buffer space allocated when a read finds less than [`MIN_READ_ROOM`] left.
const READ_RESERVE: usize = 16 * 1024;
const MIN_READ_ROOM: usize = 2 * 1024;
/// A read buffer grown past this (a large head) is not kept in the pool.
const KEEP_BUFFER: usize = 64 * 1024;

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
}

/// The request body as the client sends it.
#[derive(Debug)]
pub enum OutgoingBody {
    /// Read whole already (it can be sent again).
    Buffered(Bytes),
    /// Streamed from the client, once: its `Content-Length` (kept among the headers),
    /// or none (sent chunked).
    Streamed(Option<u64>),
}

impl Outgoing {
    /// Serialises a request in origin form; `headers` are sent as they are except
    /// `Content-Length` for a buffered body (written from the body) and `Host` when
    /// absent (each target's own).
    pub fn new(
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: OutgoingBody,
        idempotent: bool,
    ) -> Outgoing {
        let mut head = Vec::with_capacity(256);
        head.extend_from_slice(method.as_str().as_bytes());
        head.push(b' ');
        head.extend_from_slice(
            uri.path_and_query()
                .map_or("/", |pq| pq.as_str())
                .as_bytes(),
        );
        head.extend_from_slice(b" HTTP/1.1\r\n");
        let buffered = matches!(body, OutgoingBody::Buffered(_));
        for (name, value) in headers {
            if buffered && name == header::CONTENT_LENGTH {
                continue;
            }
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        let (body, chunked) = match body {
            OutgoingBody::Buffered(b) => {
                // Methods that define a body say so even when it is empty.
                if !b.is_empty() || matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
                    let _ = write!(head, "content-length: {}\r\n", b.len());
                }
                (b, false)
            }
            OutgoingBody::Streamed(Some(_)) => (Bytes::new(), false),
            OutgoingBody::Streamed(None) => {
                head.extend_from_slice(b"transfer-encoding: chunked\r\n");
                (Bytes::new(), true)
            }
        };
        Outgoing {
            head,
            needs_host: !headers.contains_key(header::HOST),
            head_request: *method == Method::HEAD,
            idempotent,
            body,
            chunked,
        }
    }
}

/// One connection to a target, with its buffers.
#[derive(Debug)]
struct Conn {
    tcp: TcpStream,
    /// Bytes read and not yet consumed.
    rbuf: BytesMut,
    /// The request being written.
    wbuf: Vec<u8>,
}

impl Conn {
    /// Whether an idle connection can take a request: the target has not closed it nor
    /// sent anything unasked. Reads epoll's last word; a system call only when epoll
    /// said "readable" (then a 1-byte read tells closed, garbage, or stale readiness).
    fn is_usable(&self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        match self.tcp.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                let mut b = [0u8; 1];
                matches!(self.tcp.try_read(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        // Room for a read: most answers fit many times in what is left of the buffer,
        // whose earlier bytes may still be shared by answers in flight.
        if self.rbuf.capacity() - self.rbuf.len() < MIN_READ_ROOM {
            self.rbuf.reserve(READ_RESERVE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.tcp), cx, &mut self.rbuf)
    }

    async fn read(&mut self) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_read(cx)).await
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
    /// `host:port` as configured (resolved at connect time when not an IP address).
    addr: String,
    /// The address when `addr` is an IP address (no resolution per connect).
    sock: Option<SocketAddr>,
    idle: Mutex<Vec<Idle>>,
}

/// How an exchange failed.
enum ExchangeError {
    /// The connection closed or broke before any byte of an answer: on a reused
    /// connection, most likely closed by the target while idle.
    NoAnswer,
    /// Anything else.
    Failed(Failure),
}

impl ConnPool {
    /// An empty pool for `addr` (`host:port`).
    pub fn new(addr: &str) -> Arc<Self> {
        Arc::new(ConnPool {
            addr: addr.to_string(),
            sock: addr.parse().ok(),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Idle connections now.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().expect("idle lock").len()
    }

    /// Closes idle connections unused for `max_idle` or more, or closed by the target.
    pub fn evict_idle(&self, max_idle: Duration) {
        let now = Instant::now();
        self.idle
            .lock()
            .expect("idle lock")
            .retain(|i| now.duration_since(i.since) < max_idle && i.conn.is_usable());
    }

    /// The most recently used idle connection that is usable.
    fn checkout(&self, max_idle: Duration) -> Option<Box<Conn>> {
        let mut idle = self.idle.lock().expect("idle lock");
        while let Some(i) = idle.pop() {
            if i.since.elapsed() < max_idle && i.conn.is_usable() {
                return Some(i.conn);
            }
        }
        None
    }

    /// Gives back a connection whose exchange ended with nothing left unread.
    fn checkin(&self, mut conn: Box<Conn>) {
        if !conn.rbuf.is_empty() {
            return;
        }
        if conn.rbuf.capacity() > KEEP_BUFFER {
            conn.rbuf = BytesMut::new();
        }
        self.idle.lock().expect("idle lock").push(Idle {
            conn,
            since: Instant::now(),
        });
    }

    async fn connect(&self, timeout: Duration) -> Result<Box<Conn>, Failure> {
        let connecting = async {
            let tcp = match self.sock {
                Some(sa) => TcpStream::connect(sa).await,
                None => TcpStream::connect(self.addr.as_str()).await,
            }?;
            tcp.set_nodelay(true)?;
            Ok::<_, io::Error>(tcp)
        };
        match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok(tcp)) => Ok(Box::new(Conn {
                tcp,
                rbuf: BytesMut::with_capacity(READ_RESERVE),
                wbuf: Vec::with_capacity(512),
            })),
            Ok(Err(e)) => {
                tracing::debug!(target_addr = %self.addr, "connect failed: {e}");
                Err(Failure::Connect)
            }
            Err(_) => {
                tracing::debug!(target_addr = %self.addr, "connect timed out");
                Err(Failure::Connect)
            }
        }
    }

    /// Sends `req` (with `host` as its `Host` when it has none, and `streamed` as its
    /// body when the body is streamed) on an idle connection or a new one, and waits for
    /// the response head.
    pub async fn send(
        self: &Arc<Self>,
        req: &Outgoing,
        host: &HeaderValue,
        mut streamed: Option<Incoming>,
        connect_timeout: Duration,
        max_idle: Duration,
    ) -> Result<Response<UpstreamResponseBody>, Failure> {
        loop {
            let (mut conn, reused) = match self.checkout(max_idle) {
                Some(c) => (c, true),
                None => (self.connect(connect_timeout).await?, false),
            };
            let replayable = streamed.is_none();
            match self.exchange(&mut conn, req, host, streamed.take()).await {
                Ok(head) => return self.respond(conn, head),
                Err(ExchangeError::NoAnswer) if reused && replayable && req.idempotent => {
                    tracing::debug!(target_addr = %self.addr, "pooled connection closed by the target: sending again on a new one");
                }
                Err(ExchangeError::NoAnswer) => return Err(Failure::Reset),
                Err(ExchangeError::Failed(f)) => return Err(f),
            }
        }
    }

    /// Writes the request and reads up to a final response head (1xx skipped).
    async fn exchange(
        &self,
        conn: &mut Conn,
        req: &Outgoing,
        host: &HeaderValue,
        streamed: Option<Incoming>,
    ) -> Result<Head, ExchangeError> {
        conn.wbuf.clear();
        conn.wbuf.extend_from_slice(&req.head);
        if req.needs_host {
            conn.wbuf.extend_from_slice(b"host: ");
            conn.wbuf.extend_from_slice(host.as_bytes());
            conn.wbuf.extend_from_slice(b"\r\n");
        }
        conn.wbuf.extend_from_slice(b"\r\n");
        let inline = req.body.len() <= INLINE_BODY;
        if inline {
            conn.wbuf.extend_from_slice(&req.body);
        }
        let broken = |e: io::Error| {
            tracing::debug!(target_addr = %self.addr, "sending the request failed: {e}");
            ExchangeError::NoAnswer
        };
        conn.tcp.write_all(&conn.wbuf).await.map_err(broken)?;
        if !inline {
            conn.tcp.write_all(&req.body).await.map_err(broken)?;
        }
        if let Some(body) = streamed {
            self.stream_body(conn, body, req.chunked).await?;
        }
        let mut answered = false;
        loop {
            if !conn.rbuf.is_empty() {
                answered = true;
                // Parsed from a frozen view of what was read, so that header values are
                // slices of it (shared, not copied).
                let read = conn.rbuf.split().freeze();
                let mut headers = HeaderMap::new();
                let mut bad_field = false;
                // Fields naming this connection (hop-by-hop) are not kept: the proxy
                // would only remove them again.
                let mut named: Vec<HeaderName> = Vec::new();
                let parsed = http1::parse_response(&read, req.head_request, |name, value| {
                    let Ok(n) = HeaderName::from_bytes(name.as_bytes()) else {
                        bad_field = true;
                        return;
                    };
                    if let Some(i) = hop_by_hop_index(&n) {
                        if i == 0 {
                            named.extend(connection_options(value));
                        }
                        return;
                    }
                    match HeaderValue::from_maybe_shared(read.slice_ref(value)) {
                        Ok(v) => {
                            headers.append(n, v);
                        }
                        Err(_) => bad_field = true,
                    }
                });
                for n in named {
                    headers.remove(n);
                }
                match parsed {
                    Ok(Some(h)) if h.status == 101 => {
                        tracing::debug!(target_addr = %self.addr, "101 Switching Protocols to a request without Upgrade");
                        return Err(ExchangeError::Failed(Failure::Garbage));
                    }
                    Ok(Some(h)) if h.status < 200 => {
                        conn.rbuf = unfreeze(read.slice(h.len..));
                        continue;
                    }
                    Ok(Some(_)) if bad_field => {
                        tracing::debug!(target_addr = %self.addr, "invalid header field in the response");
                        return Err(ExchangeError::Failed(Failure::Garbage));
                    }
                    Ok(Some(h)) => return Ok(Head { h, headers, read }),
                    Ok(None) if read.len() >= MAX_RESPONSE_HEAD => {
                        tracing::debug!(target_addr = %self.addr, "response head over {MAX_RESPONSE_HEAD} bytes");
                        return Err(ExchangeError::Failed(Failure::Garbage));
                    }
                    Ok(None) => conn.rbuf = unfreeze(read),
                    Err(e) => {
                        tracing::debug!(target_addr = %self.addr, "{e}");
                        return Err(ExchangeError::Failed(Failure::Garbage));
                    }
                }
            }
            match conn.read().await {
                Ok(0) | Err(_) if !answered => return Err(ExchangeError::NoAnswer),
                Ok(0) => {
                    tracing::debug!(target_addr = %self.addr, "connection closed in the response head");
                    return Err(ExchangeError::Failed(Failure::Reset));
                }
                Err(e) => {
                    tracing::debug!(target_addr = %self.addr, "reading the response failed: {e}");
                    return Err(ExchangeError::Failed(Failure::Reset));
                }
                Ok(_) => {}
            }
        }
    }

    /// Copies a streamed client body to the target, chunked when its length is unknown.
    async fn stream_body(
        &self,
        conn: &mut Conn,
        mut body: Incoming,
        chunked: bool,
    ) -> Result<(), ExchangeError> {
        use http_body_util::BodyExt;
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            tracing::debug!(target_addr = %self.addr, "{what}: {e}");
            ExchangeError::Failed(Failure::Reset)
        };
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| failed("the client's request body broke", &e))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers are not forwarded
            };
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
            conn.tcp
                .write_all(&conn.wbuf)
                .await
                .map_err(|e| failed("sending the request body failed", &e))?;
        }
        if chunked {
            conn.tcp
                .write_all(b"0\r\n\r\n")
                .await
                .map_err(|e| failed("sending the request body failed", &e))?;
        }
        Ok(())
    }

    /// Turns a parsed head into the response; a body already read whole gives the
    /// connection back now.
    fn respond(
        self: &Arc<Self>,
        mut conn: Box<Conn>,
        head: Head,
    ) -> Result<Response<UpstreamResponseBody>, Failure> {
        let Head { h, headers, read } = head;
        let status = StatusCode::from_u16(h.status).map_err(|_| {
            tracing::debug!(target_addr = %self.addr, status = h.status, "bad status code");
            Failure::Garbage
        })?;
        let after = read.slice(h.len..);
        drop(read);
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
        let mut r = Response::new(UpstreamResponseBody {
            state,
            conn,
            keep_alive: h.keep_alive,
        });
        *r.status_mut() = status;
        *r.headers_mut() = headers;
        Ok(r)
    }
}

/// A final response head: its framing, its fields, and everything read with it.
struct Head {
    h: http1::ResponseHead,
    headers: HeaderMap,
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
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// `vigil_testkit::scripted_server`, addressed as `host:port`.
    async fn serve(answer: Vec<u8>, per_conn: usize) -> (String, Arc<AtomicUsize>) {
        let (addr, accepted) = vigil_testkit::scripted_server(answer, per_conn).await;
        (addr.to_string(), accepted)
    }

    /// A 200 answer with `body` and its Content-Length.
    fn with_length(body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    fn get(method: Method) -> Outgoing {
        Outgoing::new(
            &method,
            &Uri::from_static("/"),
            &HeaderMap::new(),
            OutgoingBody::Buffered(Bytes::new()),
            true,
        )
    }

    const SECOND: Duration = Duration::from_secs(1);
    const MINUTE: Duration = Duration::from_secs(60);
    const HELLO: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\nhello";

    /// A GET of `/` on `pool`, up to the response head.
    async fn send_get(pool: &Arc<ConnPool>) -> Result<Response<UpstreamResponseBody>, Failure> {
        fetch_head(pool, &get(Method::GET)).await
    }

    async fn fetch_head(
        pool: &Arc<ConnPool>,
        req: &Outgoing,
    ) -> Result<Response<UpstreamResponseBody>, Failure> {
        let host = HeaderValue::from_static("t");
        pool.send(req, &host, None, SECOND, MINUTE).await
    }

    /// Status and whole body of `req` sent on `pool`.
    async fn fetch(pool: &Arc<ConnPool>, req: &Outgoing) -> Result<(u16, Vec<u8>), Failure> {
        let resp = fetch_head(pool, req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        Ok((status, body.to_vec()))
    }

    #[test]
    fn the_request_is_serialised_once_with_its_length_and_without_the_clients() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        h.insert("x-b", HeaderValue::from_static("2"));
        let o = Outgoing::new(
            &Method::POST,
            &Uri::from_static("/p?q=1"),
            &h,
            OutgoingBody::Buffered(Bytes::from_static(b"abc")),
            false,
        );
        assert_eq!(
            String::from_utf8_lossy(&o.head),
            "POST /p?q=1 HTTP/1.1\r\nx-b: 2\r\ncontent-length: 3\r\n"
        );
        assert!(o.needs_host && !o.idempotent && !o.chunked);
        let o = Outgoing::new(
            &Method::POST,
            &Uri::from_static("/"),
            &HeaderMap::new(),
            OutgoingBody::Streamed(None),
            false,
        );
        assert!(o.chunked);
        assert!(String::from_utf8_lossy(&o.head).ends_with("transfer-encoding: chunked\r\n"));
        let o = get(Method::GET);
        assert_eq!(
            String::from_utf8_lossy(&o.head),
            "GET / HTTP/1.1\r\n",
            "no length for an empty GET"
        );
    }

    #[tokio::test]
    async fn a_connection_is_reused_and_a_whole_small_body_is_handed_over_at_once() {
        let (addr, accepted) = serve(HELLO.to_vec(), usize::MAX).await;
        let pool = ConnPool::new(&addr);
        for _ in 0..20 {
            let resp = send_get(&pool).await.unwrap();
            assert_eq!(resp.headers()["x-a"], "1");
            assert_eq!(
                pool.idle_count(),
                1,
                "back in the pool before the body is read"
            );
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"hello");
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one keep-alive connection"
        );
    }

    #[tokio::test]
    async fn chunked_and_streamed_bodies_arrive_whole_and_free_the_connection_at_the_end() {
        let big = "x".repeat(100_000);
        let chunked = format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{big}\r\n3;e=1\r\nabc\r\n0\r\nt: 1\r\n\r\n",
            big.len()
        );
        let (addr, accepted) = serve(chunked.into_bytes(), usize::MAX).await;
        let pool = ConnPool::new(&addr);
        for _ in 0..3 {
            let (status, body) = fetch(&pool, &get(Method::GET)).await.unwrap();
            assert_eq!(status, 200);
            assert_eq!(body.len(), big.len() + 3);
            assert!(body.ends_with(b"xabc"));
            assert_eq!(pool.idle_count(), 1);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);

        let (addr, accepted) = serve(with_length(&big), usize::MAX).await;
        let pool = ConnPool::new(&addr);
        for _ in 0..3 {
            let (_, body) = fetch(&pool, &get(Method::GET)).await.unwrap();
            assert_eq!(body.len(), big.len());
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_ending_with_the_connection_is_read_to_the_end_and_not_pooled() {
        let (addr, accepted) = serve(b"HTTP/1.1 200 OK\r\n\r\nuntil close".to_vec(), 1).await;
        let pool = ConnPool::new(&addr);
        for _ in 0..2 {
            let (_, body) = fetch(&pool, &get(Method::GET)).await.unwrap();
            assert_eq!(body, b"until close");
            assert_eq!(pool.idle_count(), 0);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn informational_answers_are_skipped_and_head_answers_have_no_body() {
        let answer = b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
        let (addr, _) = serve(answer.to_vec(), usize::MAX).await;
        let pool = ConnPool::new(&addr);
        assert_eq!(
            fetch(&pool, &get(Method::GET)).await.unwrap(),
            (200, b"hello".to_vec())
        );
        let (addr, accepted) = serve(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n".to_vec(),
            usize::MAX,
        )
        .await;
        let pool = ConnPool::new(&addr);
        for _ in 0..2 {
            assert_eq!(
                fetch(&pool, &get(Method::HEAD)).await.unwrap(),
                (200, vec![])
            );
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "the HEAD answer kept its connection"
        );
    }

    #[tokio::test]
    async fn a_pooled_connection_the_target_closed_is_replaced_for_idempotent_requests() {
        // One answer per connection, then the server closes: every reuse finds it closed.
        let (addr, accepted) = serve(HELLO.to_vec(), 1).await;
        let pool = ConnPool::new(&addr);
        for _ in 0..5 {
            assert_eq!(fetch(&pool, &get(Method::GET)).await.unwrap().1, b"hello");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn an_abandoned_body_closes_its_connection_and_idle_ones_age_out() {
        let big = "y".repeat(50_000);
        let (addr, accepted) = serve(with_length(&big), usize::MAX).await;
        let pool = ConnPool::new(&addr);
        let first = send_get(&pool).await.unwrap();
        drop(first);
        assert_eq!(
            pool.idle_count(),
            0,
            "a body not read to the end is not pooled"
        );
        let (_, body) = fetch(&pool, &get(Method::GET)).await.unwrap();
        assert_eq!(body.len(), big.len());
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        pool.evict_idle(MINUTE);
        assert_eq!(pool.idle_count(), 1, "not idle for a minute yet");
        pool.evict_idle(Duration::ZERO);
        assert_eq!(pool.idle_count(), 0, "idle past the limit: closed");
    }

    #[tokio::test]
    async fn garbage_truncation_and_refusal_are_classified() {
        let (addr, _) = serve(b"SSH-2.0-OpenSSH\r\n\r\n".to_vec(), usize::MAX).await;
        assert_eq!(
            fetch(&ConnPool::new(&addr), &get(Method::GET)).await,
            Err(Failure::Garbage)
        );
        let (addr, _) = serve(
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nx".to_vec(),
            usize::MAX,
        )
        .await;
        assert_eq!(
            fetch(&ConnPool::new(&addr), &get(Method::GET)).await,
            Err(Failure::Garbage)
        );
        let (addr, _) = serve(b"HTTP/1.1 200 OK\r\ncontent-le".to_vec(), 1).await;
        assert_eq!(
            fetch(&ConnPool::new(&addr), &get(Method::GET)).await,
            Err(Failure::Reset)
        );
        // Nothing at all in answer on a new connection: reset, not retried.
        let (addr, accepted) = serve(Vec::new(), 1).await;
        assert_eq!(
            fetch(&ConnPool::new(&addr), &get(Method::GET)).await,
            Err(Failure::Reset)
        );
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let pool = ConnPool::new(&format!("127.0.0.1:{port}"));
        assert_eq!(fetch(&pool, &get(Method::GET)).await, Err(Failure::Connect));
    }

    #[tokio::test]
    async fn with_both_lengths_transfer_encoding_frames_and_content_length_is_dropped() {
        let smuggle = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n";
        let (addr, _) = serve(smuggle.to_vec(), usize::MAX).await;
        let pool = ConnPool::new(&addr);
        let resp = send_get(&pool).await.unwrap();
        assert!(
            !resp.headers().contains_key(header::CONTENT_LENGTH),
            "a client must not trust the target's Content-Length here"
        );
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"0123456789");
        assert_eq!(
            pool.idle_count(),
            0,
            "a connection that sent both is not reused"
        );
    }

    #[tokio::test]
    async fn a_truncated_body_is_an_error_not_a_short_success() {
        let (addr, _) = serve(
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc".to_vec(),
            1,
        )
        .await;
        let pool = ConnPool::new(&addr);
        let resp = send_get(&pool).await.unwrap();
        assert!(resp.into_body().collect().await.is_err());
        assert_eq!(pool.idle_count(), 0);
    }
}
