//! One request and its response on a connection, plain or TLS: the head parsed by
//! vigil-core's `http1`, the body framed and bounded.

use crate::{ErrorKind, Limits};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use vigil_core::http1::{self, ChunkedDecoder, Decoded, Framing};
use vigil_core::judge::Answers;

/// First read buffer of a probe: a typical health answer and its head fit in one read.
/// The buffer lives only while the probe runs; an idle connection holds no buffer.
const FIRST_READ: usize = 1024;
/// Largest response head accepted: health answers carry a handful of headers; a
/// larger head is a misbehaving or hostile endpoint.
const MAX_HEAD: usize = 16 * 1024;

/// A connection in use: plain TCP, or TLS over it.
pub(crate) enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    /// Waits until the answer starts to arrive, so that a probe waiting on a slow target
    /// holds no buffer (at the concurrency limit, a thousand waiting probes would hold
    /// a MiB). A TLS connection reads at once: rustls may hold decrypted bytes the
    /// socket's readiness does not show, and its own buffers dwarf this one.
    async fn answer_started(&self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.readable().await,
            Conn::Tls(_) => Ok(()),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Why an exchange failed; `stale` failures on a reused connection are retried once on
/// a fresh one (the server closed the idle connection as we reused it: nothing of the
/// request was answered, and a GET is safe to repeat).
pub(crate) struct Failure {
    pub kind: ErrorKind,
    pub message: String,
    pub stale: bool,
}

impl Failure {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
            stale: false,
        }
    }

    /// Nothing of the request was answered.
    fn stale(message: impl Into<String>) -> Failure {
        Failure {
            kind: ErrorKind::Request,
            message: message.into(),
            stale: true,
        }
    }
}

/// A response read in full: status, `Content-Type`, body, and whether the connection
/// may be reused.
pub(crate) struct Answer {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
    pub reusable: bool,
}

/// Reads more into `buf` (growing it when full). Returns the bytes read (0: EOF).
async fn read_more(conn: &mut Conn, buf: &mut Vec<u8>) -> Result<usize, Failure> {
    if buf.capacity() - buf.len() < FIRST_READ / 2 {
        buf.reserve(buf.len().max(FIRST_READ));
    }
    conn.read_buf(buf)
        .await
        .map_err(|e| Failure::new(ErrorKind::Response, format!("reading the response: {e}")))
}

/// Reads until `buf` holds `need` bytes.
async fn fill(conn: &mut Conn, buf: &mut Vec<u8>, need: usize) -> Result<(), Failure> {
    if need > buf.len() {
        buf.reserve(need - buf.len());
    }
    while buf.len() < need {
        if read_more(conn, buf).await? == 0 {
            return Err(closed_in_body());
        }
    }
    Ok(())
}

fn closed_in_body() -> Failure {
    Failure::new(
        ErrorKind::Response,
        "connection closed in the middle of the body",
    )
}

fn too_large(max_body: usize) -> Failure {
    Failure::new(
        ErrorKind::TooLarge,
        format!("health body larger than {max_body} bytes"),
    )
}

/// One request and its response on `conn`. A body over `max_body` fails the probe,
/// unless plain statuses are answers and the body does not say it is JSON: then an
/// ordinary page too large to read (an application's `/`) is judged by its code, and
/// its connection is closed rather than read to the end.
pub(crate) async fn exchange(
    conn: &mut Conn,
    request: &[u8],
    limits: Limits,
) -> Result<Answer, Failure> {
    let max_body = limits.max_body;
    // A TLS stream buffers what it writes: flushed, or the request may wait there.
    let sent = async {
        conn.write_all(request).await?;
        conn.flush().await
    };
    sent.await
        .map_err(|e| Failure::stale(format!("sending: {e}")))?;
    conn.answer_started()
        .await
        .map_err(|e| Failure::stale(format!("reading the response: {e}")))?;
    let mut buf: Vec<u8> = Vec::with_capacity(FIRST_READ);
    let framing_error = |e: http1::FramingError| Failure::new(ErrorKind::Response, e.to_string());
    let mut content_type: Option<String> = None;
    // Framing rules (HEAD/1xx/204/304, Transfer-Encoding over Content-Length, ...) are
    // vigil-core's, shared with the load balancer's client.
    let head = 'read: loop {
        let n = match read_more(conn, &mut buf).await {
            // Reset before any answer: the server dropped the idle connection.
            Err(f) if buf.is_empty() => return Err(Failure::stale(f.message)),
            r => r?,
        };
        if n == 0 {
            return Err(if buf.is_empty() {
                Failure::stale("connection closed before any response")
            } else {
                Failure::new(
                    ErrorKind::Response,
                    "connection closed in the middle of the response head",
                )
            });
        }
        loop {
            let fields = |name: &str, value: &[u8]| {
                if name.eq_ignore_ascii_case("content-type") {
                    content_type = Some(String::from_utf8_lossy(value).into_owned());
                }
            };
            match http1::parse_response(&buf, false, fields).map_err(framing_error)? {
                None if buf.len() > MAX_HEAD => {
                    return Err(Failure::new(
                        ErrorKind::Response,
                        format!("response head larger than {MAX_HEAD} bytes"),
                    ));
                }
                None => continue 'read,
                Some(h) if h.status == 101 => {
                    return Err(Failure::new(
                        ErrorKind::Response,
                        "the endpoint switched protocols",
                    ));
                }
                // 1xx precede the real answer: skip them.
                Some(h) if h.status < 200 => {
                    buf.drain(..h.len);
                }
                Some(h) => break 'read h,
            }
        }
    };
    let start = head.len;
    let status = head.status;
    let skip_large = limits.answers == Answers::PlainStatus
        && !content_type
            .as_deref()
            .is_some_and(|c| c.to_ascii_lowercase().contains("json"));
    let unread = |content_type| Answer {
        status,
        content_type,
        body: Vec::new(),
        reusable: false,
    };
    match head.framing {
        Framing::Empty => Ok(Answer {
            status,
            content_type,
            body: Vec::new(),
            reusable: head.keep_alive && buf.len() == start,
        }),
        Framing::Length(len) => {
            let Some(len) = usize::try_from(len).ok().filter(|&l| l <= max_body) else {
                return if skip_large {
                    Ok(unread(content_type))
                } else {
                    Err(too_large(max_body))
                };
            };
            fill(conn, &mut buf, start + len).await?;
            let reusable = head.keep_alive && buf.len() == start + len;
            buf.truncate(start + len);
            buf.drain(..start);
            Ok(Answer {
                status,
                content_type,
                body: buf,
                reusable,
            })
        }
        Framing::Chunked => {
            let mut decoder = ChunkedDecoder::new();
            let (mut body, mut pos) = (Vec::new(), start);
            loop {
                let (used, what) = decoder.decode(&buf[pos..]).map_err(framing_error)?;
                match what {
                    Decoded::Data(r) => {
                        if r.len() > max_body - body.len() {
                            return if skip_large {
                                Ok(unread(content_type))
                            } else {
                                Err(too_large(max_body))
                            };
                        }
                        body.extend_from_slice(&buf[pos + r.start..pos + r.end]);
                    }
                    Decoded::End => {
                        return Ok(Answer {
                            status,
                            content_type,
                            body,
                            reusable: head.keep_alive && buf.len() == pos + used,
                        });
                    }
                    Decoded::NeedMore => {
                        if read_more(conn, &mut buf).await? == 0 {
                            return Err(closed_in_body());
                        }
                    }
                }
                pos += used;
            }
        }
        Framing::UntilClose => {
            loop {
                if buf.len() - start > max_body {
                    return if skip_large {
                        Ok(unread(content_type))
                    } else {
                        Err(too_large(max_body))
                    };
                }
                if read_more(conn, &mut buf).await? == 0 {
                    break;
                }
            }
            buf.drain(..start);
            Ok(Answer {
                status,
                content_type,
                body: buf,
                reusable: false,
            })
        }
    }
}
