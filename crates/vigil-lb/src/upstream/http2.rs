//! HTTP/2 to targets (`protocol = "h2"`: prior knowledge in cleartext, ALPN `h2` over
//! TLS), for gRPC services: one multiplexed connection per target and worker, on the
//! `h2` crate.
//!
//! Floor 6, upstream, a child of [`crate::upstream`] (floors: the crate doc): imports its
//! parent and the shared body and http_util.
//!
//! The request arrives as the HTTP/1.1 head every attempt sends ([`Outgoing`]: the
//! client side's header hygiene already applied, whichever protocol the client spoke);
//! here it is read back into an `http::Request` (`Host` becomes `:authority`), with
//! `te: trailers` for gRPC (gRPC servers ask for it; it is the one `TE` HTTP/2
//! allows). The answer comes back as a [`ResponseHead`] built from the HTTP/2 head
//! (the same type the HTTP/1.1 path yields, so the client side writes either alike)
//! and a body that yields the data frames and then the trailers (`grpc-status`).
//!
//! A request body streamed from an HTTP/2 client is pumped by a task of its own while
//! the response comes back: gRPC's bidirectional streams need both directions at once.
//! One streamed from an HTTP/1.1 client is sent whole before the answer is awaited, as
//! on the HTTP/1.1 path.
//!
//! Why `h2` and not hyper's client: as pingora does, HTTP/2 runs on the `h2` crate
//! beside the own HTTP/1.1 path, sharing its request representation; hyper would
//! bring its own request and connection types for one protocol.

use crate::body::BodyReader;
use crate::config::Protocol;
use crate::http_util::AttemptFailure;
use crate::upstream::tls::Dialer;
use crate::upstream::{AttemptTimeouts, Outgoing, ResponseHead, UpstreamResponse};
use bytes::Bytes;
use h2::client::SendRequest;
use std::io;
use std::sync::Mutex;

/// The HTTP/2 connections of one target: one per worker, shared by its requests, each
/// with the generation of the TLS settings it was made under ([`Dialer::generation`]).
#[derive(Debug)]
pub struct H2Conns {
    per_worker: Box<[Mutex<Option<Made>>]>,
}

/// A connection and the generation of the TLS settings it was made under.
type Made = (u64, SendRequest<Bytes>);

impl H2Conns {
    /// No connection yet, for `workers` workers.
    pub fn new(workers: usize) -> H2Conns {
        H2Conns {
            per_worker: (0..workers.max(1)).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// A connection ready for a new stream: this worker's, or a new one.
    async fn ready(
        &self,
        dialer: &Dialer,
        worker: usize,
        t: &AttemptTimeouts,
    ) -> Result<SendRequest<Bytes>, AttemptFailure> {
        let addr = dialer.addr();
        let slot = &self.per_worker[worker % self.per_worker.len()];
        let generation = dialer.generation();
        let existing = slot.lock().expect("h2 slot lock").clone();
        // One made under TLS settings a reload has since changed is replaced (its
        // streams in flight go on).
        if let Some((made, send)) = existing
            && made == generation
        {
            // `ready` fails when the connection has gone (GOAWAY, closed): then a new
            // one, as for a pooled HTTP/1.1 connection the target closed.
            if let Ok(send) = send.ready().await {
                return Ok(send);
            }
        }
        let send = connect(dialer, t).await?;
        *slot.lock().expect("h2 slot lock") = Some((generation, send.clone()));
        send.ready().await.map_err(|e| {
            tracing::debug!(target_addr = %addr, "h2 connection not ready: {e}");
            AttemptFailure::Connect
        })
    }

    /// Sends `req` and waits for the response head.
    pub async fn send(
        &self,
        dialer: &Dialer,
        worker: usize,
        req: &Outgoing,
        host: &[u8],
        streamed: Option<&mut BodyReader<'_>>,
        t: AttemptTimeouts,
    ) -> Result<UpstreamResponse, AttemptFailure> {
        let request = to_request(req, host, t.deadline).map_err(|e| {
            tracing::debug!(target_addr = %dialer.addr(), "request not expressible in HTTP/2: {e}");
            AttemptFailure::Garbage
        })?;
        let addr = dialer.addr();
        let mut send = self.ready(dialer, worker, &t).await?;
        let body = req.buffered_body();
        let end = body.is_empty() && streamed.is_none();
        let (response, mut stream) = send.send_request(request, end).map_err(|e| {
            tracing::debug!(target_addr = %addr, "h2 request refused: {e}");
            AttemptFailure::Reset
        })?;
        let reset = |e: h2::Error| {
            tracing::debug!(target_addr = %addr, "h2 stream failed: {e}");
            AttemptFailure::Reset
        };
        if !end && streamed.is_none() {
            send_all(&mut stream, body, true, t.send)
                .await
                .map_err(reset)?;
        }
        if let Some(reader) = streamed {
            match reader.take_h2() {
                // Both directions at once (gRPC streams): the body goes on in a task.
                Some(mut recv) => {
                    let send_timeout = t.send;
                    tokio::spawn(async move {
                        if let Err(e) = pump(&mut recv, &mut stream, send_timeout).await {
                            tracing::debug!("h2 request body pump ended: {e}");
                            stream.send_reset(h2::Reason::CANCEL);
                        }
                    });
                }
                None => {
                    while let Some(data) = reader.next_data().await {
                        let data = data.map_err(|e| {
                            AttemptFailure::Client(if e.kind() == io::ErrorKind::TimedOut {
                                408
                            } else {
                                400
                            })
                        })?;
                        send_all(&mut stream, data, false, t.send)
                            .await
                            .map_err(reset)?;
                    }
                    send_all(&mut stream, Bytes::new(), true, t.send)
                        .await
                        .map_err(reset)?;
                }
            }
        }
        let resp = response.await.map_err(reset)?;
        let (parts, body) = resp.into_parts();
        Ok(UpstreamResponse::from_h2(
            parts.status.as_u16(),
            &parts.headers,
            body,
        ))
    }
}

/// A new HTTP/2 connection (prior knowledge in cleartext, ALPN `h2` over TLS) whose
/// driver runs in a task of this worker's runtime.
async fn connect(
    dialer: &Dialer,
    t: &AttemptTimeouts,
) -> Result<SendRequest<Bytes>, AttemptFailure> {
    let addr = dialer.addr();
    let connecting = async {
        let stream = dialer.dial(Protocol::H2, t.connect).await?;
        h2::client::handshake(stream)
            .await
            .map_err(|e| io::Error::other(e.to_string()))
    };
    match tokio::time::timeout(t.connect, connecting).await {
        Ok(Ok((send, conn))) => {
            let target = addr.to_string();
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(target_addr = %target, "h2 connection ended: {e}");
                }
            });
            Ok(send)
        }
        Ok(Err(e)) => {
            tracing::debug!(target_addr = %addr, "h2 connect failed: {e}");
            Err(AttemptFailure::Connect)
        }
        Err(_) => {
            tracing::debug!(target_addr = %addr, "h2 connect timed out");
            Err(AttemptFailure::Connect)
        }
    }
}

/// Sends `data` on `stream` as the peer's flow control allows (each wait within
/// `stall`), ending the stream when `end`.
pub(crate) async fn send_all(
    stream: &mut h2::SendStream<Bytes>,
    mut data: Bytes,
    end: bool,
    stall: std::time::Duration,
) -> Result<(), h2::Error> {
    if data.is_empty() {
        if end {
            stream.send_data(Bytes::new(), true)?;
        }
        return Ok(());
    }
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        let granted =
            tokio::time::timeout(stall, std::future::poll_fn(|cx| stream.poll_capacity(cx)))
                .await
                .map_err(|_| h2::Error::from(h2::Reason::CANCEL))?;
        let n = match granted {
            Some(Ok(n)) => n.min(data.len()),
            Some(Err(e)) => return Err(e),
            None => return Err(h2::Error::from(h2::Reason::STREAM_CLOSED)),
        };
        if n > 0 {
            let chunk = data.split_to(n);
            stream.send_data(chunk, end && data.is_empty())?;
        }
    }
    Ok(())
}

/// Copies a client's HTTP/2 request body (and trailers) to the target's stream.
async fn pump(
    recv: &mut h2::RecvStream,
    stream: &mut h2::SendStream<Bytes>,
    stall: std::time::Duration,
) -> Result<(), h2::Error> {
    while let Some(data) = recv.data().await {
        let data = data?;
        let n = data.len();
        send_all(stream, data, false, stall).await?;
        let _ = recv.flow_control().release_capacity(n);
    }
    match recv.trailers().await? {
        Some(trailers) => stream.send_trailers(trailers),
        None => stream.send_data(Bytes::new(), true),
    }
}

/// The HTTP/1.1 head of `req` as an HTTP/2 request (`host`: the target's, when the
/// client sent none), carrying the attempt's `deadline`
/// ([`crate::upstream::write_deadline_fields`]: `x-vigil-deadline-ms`, and
/// `grpc-timeout` for gRPC).
fn to_request(
    req: &Outgoing,
    host: &[u8],
    deadline: std::time::Duration,
) -> Result<http::Request<()>, String> {
    let mut text = req.head_bytes().to_vec();
    text.extend_from_slice(b"\r\n");
    let mut fields = [httparse::EMPTY_HEADER; vigil_core::http1::MAX_HEADERS + 8];
    let mut parsed = httparse::Request::new(&mut fields);
    parsed.parse(&text).map_err(|e| e.to_string())?;
    let method = parsed.method.ok_or("no method")?;
    let path = parsed.path.ok_or("no path")?;
    let mut authority = host.to_vec();
    let mut builder = http::Request::builder().method(method);
    let mut grpc = false;
    for f in parsed.headers.iter() {
        let name = f.name.as_bytes();
        if name.eq_ignore_ascii_case(b"host") {
            authority = f.value.to_vec();
            continue;
        }
        if name.eq_ignore_ascii_case(b"content-type") {
            grpc |= f.value.starts_with(b"application/grpc");
        }
        // Connection-specific fields are not HTTP/2 (RFC 9113 8.2.2); the HTTP/1.1
        // head has none but the framing the client side wrote.
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            continue;
        }
        builder = builder.header(f.name, f.value);
    }
    let ms = crate::upstream::deadline_ms(deadline);
    builder = builder.header(vigil_core::admission::DEADLINE_HEADER, ms);
    if grpc {
        builder = builder
            .header("te", "trailers")
            .header("grpc-timeout", format!("{}m", ms.max(1)));
    }
    let authority = String::from_utf8(authority).map_err(|e| e.to_string())?;
    builder
        .uri(format!("http://{authority}{path}"))
        .body(())
        .map_err(|e| e.to_string())
}

impl ResponseHead {
    /// The head of an HTTP/2 answer in the HTTP/1.1 form the client side writes
    /// (`content-length` kept when the target sent it; else the body has no length).
    pub fn from_h2(status: u16, headers: &http::HeaderMap, end_stream: bool) -> ResponseHead {
        let length = headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let framing = match (end_stream, length) {
            (true, _) => vigil_core::http1::Framing::Empty,
            (false, Some(n)) => vigil_core::http1::Framing::Length(n),
            (false, None) => vigil_core::http1::Framing::Chunked,
        };
        ResponseHead::synthesize(
            status,
            headers
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())),
            framing,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::OutgoingBody;
    use std::time::Duration;

    fn outgoing(head: &str, grpc: bool) -> Outgoing {
        let mut out = Outgoing::new(
            head.as_bytes().to_vec(),
            true,
            false,
            true,
            OutgoingBody::Buffered(Bytes::new()),
            false,
        );
        out.set_deadline(grpc, None);
        out
    }

    #[test]
    fn an_h2_attempt_carries_its_deadline_and_grpc_timeout() {
        let out = outgoing(
            "POST /svc/M HTTP/1.1\r\nhost: a\r\ncontent-type: application/grpc\r\n",
            true,
        );
        let req = to_request(&out, b"t", Duration::from_micros(1_234_900)).unwrap();
        let h = req.headers();
        assert_eq!(h["x-vigil-deadline-ms"], "1234");
        assert_eq!(h["grpc-timeout"], "1234m");
        assert_eq!(h["te"], "trailers");

        let out = outgoing("GET / HTTP/1.1\r\nhost: a\r\n", false);
        let req = to_request(&out, b"t", Duration::from_millis(80)).unwrap();
        assert_eq!(req.headers()["x-vigil-deadline-ms"], "80");
        assert!(req.headers().get("grpc-timeout").is_none(), "not gRPC");
    }
}
