//! Bytes from a peer: a connection plain or TLS ([`MaybeTls`]: a client's
//! [`ClientStream`], and a target's); a request body read as an attempt sends it on
//! ([`BodyReader`], taken by the proxy and by both upstream sides); and the one read-into-a-buffer step every connection uses
//! (`poll_read_more`, whose `Growth` says how it makes room).
//!
//! Floor 7, shared (floors: the crate doc): imports no other module of this crate.

use bytes::{Buf, Bytes, BytesMut};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use vigil_core::http1::{ChunkedDecoder, Decoded};

/// Read buffer space allocated when a read finds less than [`MIN_READ_ROOM`] left.
pub(crate) const READ_RESERVE: usize = 16 * 1024;
const MIN_READ_ROOM: usize = 2 * 1024;

/// A request head's read grows its buffer by this much when under [`HEAD_MIN_ROOM`] is
/// left: the client read buffer starts small ([`crate::spare::CLIENT_READ`]), and a head
/// larger than that takes one more read, not one per kilobyte.
const HEAD_RESERVE: usize = 8 * 1024;
/// Below this much room a head's read grows the buffer first (no read of a few bytes).
const HEAD_MIN_ROOM: usize = 256;

/// How a read makes room in its buffer before reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Growth {
    /// Bodies and answers: [`READ_RESERVE`] when under [`MIN_READ_ROOM`] is left, so
    /// most messages fit many times in what is left of the buffer, whose earlier bytes
    /// may still be shared by messages in flight, and large ones read in large pieces.
    Body,
    /// A request head in the small client read buffer: [`HEAD_RESERVE`] when under
    /// [`HEAD_MIN_ROOM`] is left.
    Head,
}

impl Growth {
    /// Reserves room in `buf` by this rule (nothing when it has enough).
    pub(crate) fn make_room(self, buf: &mut BytesMut) {
        let (min_room, reserve) = match self {
            Growth::Body => (MIN_READ_ROOM, READ_RESERVE),
            Growth::Head => (HEAD_MIN_ROOM, HEAD_RESERVE),
        };
        if buf.capacity() - buf.len() < min_room {
            buf.reserve(reserve);
        }
    }
}

/// The interim answer owed to a client that sent `Expect: 100-continue`.
pub(crate) const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// A connection: plain TCP, or TLS over it (after the handshake); `S` is rustls's
/// server side ([`ClientStream`]) or client side (`upstream::tls::TargetStream`).
///
/// An enum rather than a type parameter of the code that reads and writes it, so that
/// [`BodyReader`], which the proxy and the upstream side take, stays one type; a branch
/// per read or write costs nothing measurable beside the system call.
#[derive(Debug)]
pub enum MaybeTls<S> {
    /// Cleartext.
    Plain(TcpStream),
    /// TLS (boxed: its session state is large, a plain connection should not carry it).
    Tls(Box<S>),
}

/// A client connection.
pub type ClientStream = MaybeTls<tokio_rustls::server::TlsStream<TcpStream>>;

impl ClientStream {
    /// Ready when a read may return something. TLS may hold decrypted bytes the socket
    /// no longer shows, so it is always ready (a TLS connection that gave its buffers
    /// back takes a buffer again at once: the release saves memory on plain ones only).
    pub(crate) fn poll_read_ready(&self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<()>> {
        match self {
            MaybeTls::Plain(tcp) => tcp.poll_read_ready(cx),
            MaybeTls::Tls(_) => Poll::Ready(Ok(())),
        }
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> MaybeTls<S> {
    /// Writes all of `buf` and flushes it (TLS keeps records until flushed).
    pub(crate) async fn write_now(&mut self, buf: &[u8]) -> io::Result<()> {
        self.write_all(buf).await?;
        match self {
            MaybeTls::Plain(_) => Ok(()),
            MaybeTls::Tls(t) => t.flush().await,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for MaybeTls<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(t) => Pin::new(t).poll_read(cx, buf),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for MaybeTls<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(t) => Pin::new(t).poll_write(cx, buf),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(t) => Pin::new(t).poll_flush(cx),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(t) => Pin::new(t).poll_shutdown(cx),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Reads what the socket has into `buf` (0: closed), after making room by `growth`. A
/// short read tells tokio the socket is drained, so the next read waits for epoll
/// without a system call.
pub(crate) fn poll_read_more<S: tokio::io::AsyncRead + Unpin>(
    tcp: &mut S,
    buf: &mut BytesMut,
    growth: Growth,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    growth.make_room(buf);
    tokio_util::io::poll_read_buf(Pin::new(tcp), cx, buf)
}

/// Largest chunk size taken from a client: `i64::MAX`, nginx's (its `off_t`); HAProxy
/// stops below 2^60. A size of 16 hex digits above it (`ffffffffffffffff`) overflows
/// a signed length in a peer, and no real body comes near it.
const MAX_CHUNK_SIZE: u64 = i64::MAX as u64;

/// Whether the chunk-size line that `before` ends with (what the decoder consumed
/// before a chunk's first data: the previous chunk's CRLF, if any, then the line)
/// names more than [`MAX_CHUNK_SIZE`]. Empty when the data continues a chunk.
///
/// The decoder ([`ChunkedDecoder`], vigil-core) takes any 16 hex digits; this limit
/// belongs in its `chunk_line`, where it would also cover targets' answers, and moves
/// there when vigil-core's parser is next changed.
fn chunk_too_large(before: &[u8]) -> bool {
    let line = before.strip_prefix(b"\r\n").unwrap_or(before);
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    // A chunk line goes on with its end, an extension or whitespace; a trailer field
    // line (`abc: 1`, after the last chunk) with a colon.
    if !matches!(line.get(digits), Some(b'\r' | b';' | b' ' | b'\t')) {
        return false;
    }
    std::str::from_utf8(&line[..digits])
        .ok()
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .is_some_and(|size| size > MAX_CHUNK_SIZE)
}

/// What is left of a streamed request body.
#[derive(Debug)]
enum Remaining {
    Length(u64),
    Chunked(ChunkedDecoder),
    Done,
}

/// A client's request body, read as the target connection sends it on (too large to
/// buffer, or of unknown length). Borrowed from the client connection for one request
/// (HTTP/1.1), or owning the request's HTTP/2 stream.
pub struct BodyReader<'c> {
    src: BodySource<'c>,
    /// Longest wait for more of the body.
    idle_timeout: Duration,
}

enum BodySource<'c> {
    H1 {
        tcp: &'c mut ClientStream,
        rbuf: &'c mut BytesMut,
        state: Remaining,
        /// `100 Continue` is owed to the client before reading.
        continue_due: bool,
    },
    /// `None` once read to the end or handed over ([`BodyReader::take_h2`]).
    H2(Option<h2::RecvStream>),
}

impl<'c> BodyReader<'c> {
    /// The body of an HTTP/1.1 request: `length` bytes, or chunked when `None`, read
    /// from `tcp` after what `rbuf` already holds; `continue_due` when `100 Continue`
    /// is owed to the client before the first read.
    pub(crate) fn h1(
        tcp: &'c mut ClientStream,
        rbuf: &'c mut BytesMut,
        length: Option<u64>,
        continue_due: bool,
        idle_timeout: Duration,
    ) -> BodyReader<'c> {
        BodyReader {
            src: BodySource::H1 {
                tcp,
                rbuf,
                state: match length {
                    Some(n) => Remaining::Length(n),
                    None => Remaining::Chunked(ChunkedDecoder::new()),
                },
                continue_due,
            },
            idle_timeout,
        }
    }

    /// The body of an HTTP/2 request.
    pub(crate) fn h2(recv: h2::RecvStream, idle_timeout: Duration) -> BodyReader<'c> {
        BodyReader {
            src: BodySource::H2(Some(recv)),
            idle_timeout,
        }
    }

    /// The HTTP/2 stream itself, for a target that takes the body while it answers
    /// (an HTTP/2 target: gRPC streams both ways at once); `None` for HTTP/1.1.
    pub fn take_h2(&mut self) -> Option<h2::RecvStream> {
        match &mut self.src {
            BodySource::H2(recv) => recv.take(),
            BodySource::H1 { .. } => None,
        }
    }

    /// The next piece of the body (decoded from chunks), or `None` at its end.
    pub async fn next_data(&mut self) -> Option<io::Result<Bytes>> {
        let idle_timeout = self.idle_timeout;
        let (tcp, rbuf, state, continue_due) = match &mut self.src {
            BodySource::H1 {
                tcp,
                rbuf,
                state,
                continue_due,
            } => (tcp, rbuf, state, continue_due),
            BodySource::H2(slot) => {
                let recv = slot.as_mut()?;
                return match tokio::time::timeout(idle_timeout, recv.data()).await {
                    Ok(Some(Ok(data))) => {
                        let _ = recv.flow_control().release_capacity(data.len());
                        Some(Ok(data))
                    }
                    Ok(Some(Err(e))) => Some(Err(io::Error::other(e))),
                    Ok(None) => {
                        *slot = None;
                        None
                    }
                    Err(_) => Some(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client's request body stalled",
                    ))),
                };
            }
        };
        loop {
            match state {
                Remaining::Done => return None,
                Remaining::Length(0) => {
                    *state = Remaining::Done;
                    return None;
                }
                Remaining::Length(left) if !rbuf.is_empty() => {
                    let n = rbuf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                    *left -= n as u64;
                    return Some(Ok(rbuf.split_to(n).freeze()));
                }
                Remaining::Chunked(dec) if !rbuf.is_empty() => match dec.decode(rbuf) {
                    // Refused as soon as its line is in, data or not.
                    Ok((n, ref d))
                        if chunk_too_large(match d {
                            Decoded::Data(r) => &rbuf[..r.start],
                            Decoded::NeedMore => &rbuf[..n],
                            Decoded::End => &[],
                        }) =>
                    {
                        return Some(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "chunk size over 2^63 - 1 bytes",
                        )));
                    }
                    Ok((_, Decoded::Data(r))) => {
                        rbuf.advance(r.start);
                        return Some(Ok(rbuf.split_to(r.len()).freeze()));
                    }
                    Ok((n, Decoded::NeedMore)) => rbuf.advance(n),
                    Ok((n, Decoded::End)) => {
                        rbuf.advance(n);
                        *state = Remaining::Done;
                        return None;
                    }
                    Err(e) => {
                        return Some(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
                    }
                },
                _ => {}
            }
            if *continue_due {
                *continue_due = false;
                if let Err(e) = tcp.write_now(CONTINUE).await {
                    return Some(Err(e));
                }
            }
            let more =
                std::future::poll_fn(|cx| poll_read_more(&mut **tcp, rbuf, Growth::Body, cx));
            match tokio::time::timeout(idle_timeout, more).await {
                Ok(Ok(0)) => {
                    return Some(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the client closed the connection in the request body",
                    )));
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Some(Err(e)),
                Err(_) => {
                    return Some(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client's request body stalled",
                    )));
                }
            }
        }
    }

    /// True once the body was read to its end (the next request can follow).
    pub fn is_done(&self) -> bool {
        match &self.src {
            BodySource::H1 { state, .. } => matches!(state, Remaining::Done),
            BodySource::H2(recv) => recv.is_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_over_the_largest_signed_length_are_found_and_others_are_not() {
        assert!(chunk_too_large(b"ffffffffffffffff\r\n"));
        assert!(chunk_too_large(b"\r\n8000000000000000;ext=1\r\n"));
        assert!(!chunk_too_large(b"7fffffffffffffff\r\n"));
        assert!(!chunk_too_large(b"\r\n1a\r\n"));
        assert!(!chunk_too_large(b""), "data continuing a chunk");
        assert!(
            !chunk_too_large(b"ffffffffffffffff: x\r\n"),
            "a trailer field line is no chunk line"
        );
    }
}
