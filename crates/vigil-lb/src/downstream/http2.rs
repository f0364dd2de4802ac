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

use crate::body::BodyReader;
use crate::downstream::{FrontSettings, Stop, prepare};
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
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use vigil_core::http1::{self, MAX_HEADERS, RequestBody, RequestError};

/// Streams a client may have open at once on one connection (nginx's
/// `http2_max_concurrent_streams` is 128; gRPC clients open one per call).
const MAX_CONCURRENT_STREAMS: u32 = 256;

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
    loop {
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
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    tokio::spawn(serve_stream(req, respond, proxy.clone(), client_ip.clone(), https, settings));
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
    let Some(pool) = req.pool.clone() else {
        proxy.count_local("none", 404);
        local(
            &mut respond,
            404,
            "no route for this host and path",
            head_request,
        );
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
    let answer = if out.is_streamed() {
        let mut reader = BodyReader::h2(recv, table.client_body_timeout);
        proxy
            .forward(&table, &pool, out, Some(&mut reader), deadline)
            .await
    } else {
        proxy.forward(&table, &pool, out, None, deadline).await
    };
    match answer {
        Reply::Local(code, msg) => local(&mut respond, code, &msg, head_request),
        Reply::Target(resp) => {
            let stall = table.response_body_timeout;
            if let Some(kind) = relay(
                respond,
                resp,
                head_request,
                stall,
                deadline,
                settings.write_timeout,
            )
            .await
            {
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
/// cut the body, if one did.
async fn relay(
    mut respond: h2::server::SendResponse<Bytes>,
    resp: UpstreamResponse,
    head_request: bool,
    stall: Duration,
    deadline: Option<Instant>,
    write_timeout: Duration,
) -> Option<&'static str> {
    let UpstreamResponse { head, mut body, .. } = resp;
    let Some(r) = response_head(&head) else {
        respond.send_reset(h2::Reason::INTERNAL_ERROR);
        return None;
    };
    if head_request {
        let _ = respond.send_response(r, true);
        return None;
    }
    if let Some(whole) = body.ready_now() {
        let end = whole.is_empty();
        if let Ok(mut stream) = respond.send_response(r, end)
            && !end
            && let Err(e) = send_all(&mut stream, whole, true, write_timeout).await
        {
            tracing::debug!("HTTP/2 response body not sent: {e}");
        }
        return None;
    }
    let Ok(mut stream) = respond.send_response(r, false) else {
        return None;
    };
    loop {
        let stall_at = Instant::now() + stall;
        let (until, kind) = match deadline {
            Some(d) if d < stall_at => (d, "request"),
            _ => (stall_at, "response_body"),
        };
        let Ok(next) = tokio::time::timeout_at(until, body.frame()).await else {
            stream.send_reset(h2::Reason::CANCEL);
            return Some(kind);
        };
        match next {
            None => {
                let _ = stream.send_data(Bytes::new(), true);
                return None;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    if let Err(e) = send_all(&mut stream, data, false, write_timeout).await {
                        tracing::debug!("HTTP/2 response body not sent: {e}");
                        stream.send_reset(h2::Reason::CANCEL);
                        return None;
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        let _ = stream.send_trailers(trailers);
                        return None;
                    }
                }
            },
            Some(Err(e)) => {
                // Cut short: the client must see a broken stream, not a whole answer.
                tracing::debug!("target response body broke: {e}");
                stream.send_reset(h2::Reason::INTERNAL_ERROR);
                return None;
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
