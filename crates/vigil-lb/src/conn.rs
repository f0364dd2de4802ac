//! A client connection that the accept loop can still write to after hyper gave up on
//! it: how a slowloris client gets its 408.
//!
//! hyper's `header_read_timeout` closes a connection whose request header does not
//! arrive in time, but sends nothing (it also applies to idle keep-alive connections,
//! where closing silently is right). The accept loop keeps a duplicate of the socket
//! (`try_clone`, a `dup` of the descriptor) and hyper reads through [`CountingStream`],
//! which counts bytes read at no cost per read; the handler marks where each request
//! ended. When hyper reports the header timeout and bytes arrived after the last mark, a
//! request was half-sent: the loop writes `408 Request Timeout` on its duplicate and
//! closes.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Byte counts of one connection.
#[derive(Debug, Default)]
pub struct ConnMarks {
    read: AtomicU64,
    mark: AtomicU64,
}

impl ConnMarks {
    /// Marks everything read so far as belonging to complete requests.
    pub fn mark(&self) {
        self.mark
            .store(self.read.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// True when bytes of an incomplete request were read after the last mark.
    pub fn partial(&self) -> bool {
        self.read.load(Ordering::Relaxed) > self.mark.load(Ordering::Relaxed)
    }
}

/// A TCP stream that counts the bytes read through it.
pub struct CountingStream {
    tcp: TcpStream,
    marks: Arc<ConnMarks>,
}

impl CountingStream {
    /// Wraps a stream.
    pub fn new(tcp: TcpStream, marks: Arc<ConnMarks>) -> Self {
        CountingStream { tcp, marks }
    }
}

impl AsyncRead for CountingStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.tcp).poll_read(cx, buf))?;
        let n = buf.filled().len() - before;
        self.marks.read.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for CountingStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Splits an accepted stream into the stream hyper serves and a duplicate of the
/// socket for a last word (the 408).
pub fn with_duplicate(tcp: TcpStream) -> io::Result<(TcpStream, std::net::TcpStream)> {
    let std = tcp.into_std()?;
    let dup = std.try_clone()?;
    Ok((TcpStream::from_std(std)?, dup))
}

/// Writes a minimal response on a socket hyper has given up on (best effort: the
/// socket is non-blocking and the response is tiny, so one write normally takes it).
pub fn write_final(tcp: &std::net::TcpStream, response: &[u8]) {
    use std::io::Write;
    let mut w = tcp;
    let _ = w.write_all(response);
}
