//! A client connection that the accept loop can still write to after hyper gave up on
//! it: how a slowloris client gets its 408.
//!
//! hyper's `header_read_timeout` closes a connection whose request header does not
//! arrive in time, but sends nothing (it also applies to idle keep-alive connections,
//! where closing silently is right). [`SharedStream`] shares the socket between hyper and
//! the accept loop (tokio's `TcpStream` reads and writes through `&self` with
//! `try_read`/`try_write`), and counts bytes read; the handler marks where each request
//! ended. When hyper reports the header timeout and bytes arrived after the last mark, a
//! request was half-sent: the loop writes `408 Request Timeout` and closes.

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

/// A TCP stream shared between hyper and the accept loop.
pub struct SharedStream {
    tcp: Arc<TcpStream>,
    marks: Arc<ConnMarks>,
}

impl SharedStream {
    /// Wraps a stream.
    pub fn new(tcp: Arc<TcpStream>, marks: Arc<ConnMarks>) -> Self {
        SharedStream { tcp, marks }
    }
}

impl AsyncRead for SharedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.tcp.poll_read_ready(cx))?;
            match self.tcp.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    self.marks.read.fetch_add(n as u64, Ordering::Relaxed);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for SharedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.tcp.poll_write_ready(cx))?;
            match self.tcp.try_write(buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.tcp.poll_write_ready(cx))?;
            match self.tcp.try_write_vectored(bufs) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The socket closes when the last holder (the accept loop's task) drops it.
        Poll::Ready(Ok(()))
    }
}

/// Writes a minimal response on a stream hyper has given up on.
pub async fn write_final(tcp: &TcpStream, response: &[u8]) {
    let mut rest = response;
    while !rest.is_empty() {
        if tcp.writable().await.is_err() {
            return;
        }
        match tcp.try_write(rest) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        }
    }
}
