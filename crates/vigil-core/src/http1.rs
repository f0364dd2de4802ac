//! HTTP/1.1 message framing, sans-IO (RFC 9112 section 6): where a request or response
//! head ends, how its body is delimited, whether the connection can carry another
//! exchange, and a decoder for chunked bodies.
//!
//! The parsing of the head itself is `httparse`'s; what is here is the part every
//! HTTP/1 peer re-derives from the head (and gets subtly wrong in one place or
//! another): HEAD requests and 1xx/204/304 answers have no body whatever they say,
//! `Transfer-Encoding` beats `Content-Length`, conflicting lengths are an error (a
//! smuggling vector, not a choice), a response without either ends with the
//! connection, and HTTP/1.0 closes unless it asks to keep alive. For requests
//! ([`parse_request`]) the rules are the balancer's smuggling table (docs/lb.md): every
//! framing the RFC calls invalid is refused, never guessed.
//!
//! It is a wire codec, not a policy. The callers own the sockets and buffers:
//!
//! - the load balancer's HTTP/1 downstream server frames client requests with
//!   [`parse_request`], and its HTTP/2 front runs each request head through the same
//!   function, so both protocols share one set of header rules;
//! - the balancer's HTTP/1 upstream client reads response heads with [`parse_response`]
//!   and streams bodies through [`ChunkedDecoder`]; its HTTP/2 client reuses
//!   [`Framing`] and [`MAX_HEADERS`];
//! - the controller's prober reads each (small) health answer with [`parse_response`]
//!   and [`ChunkedDecoder`].
//!
//! Why it stays in vigil-core rather than a `vigil-http1` crate of its own (the rule in
//! DESIGN.md for a second concern): see docs/architecture.md, "Why `http1` is in
//! vigil-core".

use std::mem::MaybeUninit;
use std::ops::Range;

/// Most headers accepted in a response head.
pub const MAX_HEADERS: usize = 100;
/// Longest chunk-size line (with extensions) accepted.
pub const MAX_CHUNK_LINE: usize = 4096;
/// Largest trailer section accepted after the last chunk.
pub const MAX_TRAILERS: usize = 16 * 1024;

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (a HEAD request, 1xx, 204, 304, or `Content-Length: 0`).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked` (decode with [`ChunkedDecoder`]).
    Chunked,
    /// Everything until the connection closes (the connection cannot be reused).
    UntilClose,
}

/// A complete response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// Bytes of the head, through its empty line.
    pub len: usize,
    /// Status code.
    pub status: u16,
    /// How the body is delimited.
    pub framing: Framing,
    /// Whether the connection may carry another exchange after this one.
    pub keep_alive: bool,
    /// Header field count.
    pub headers: usize,
    /// Where the reason phrase is in the buffer parsed (empty when there is none).
    pub reason: Range<usize>,
}

/// Why bytes are not an acceptable response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// Not HTTP/1.x (httparse's reason).
    #[error("not an HTTP response: {0}")]
    Syntax(String),
    /// A `Content-Length` that is not a number.
    #[error("bad Content-Length in the response")]
    BadLength,
    /// Two `Content-Length` headers that disagree.
    #[error("conflicting Content-Length headers")]
    ConflictingLength,
    /// A chunk-size line that is not hex, or too long.
    #[error("bad chunk size line in a chunked body")]
    BadChunkSize,
    /// Chunk data not followed by CRLF.
    #[error("a chunk does not end with CRLF")]
    BadChunkEnd,
    /// A chunk-size or trailer line that does not end with CRLF (a bare LF or CR).
    #[error("a line of a chunked body does not end with CRLF")]
    BadLineEnd,
    /// Trailer section over [`MAX_TRAILERS`].
    #[error("chunked trailer section too large")]
    TrailersTooLarge,
}

/// A `Content-Length` value: 1*DIGIT and nothing else (`+5` or `5 5` would be read
/// differently downstream).
fn content_length(value: &[u8]) -> Option<u64> {
    let v = value.trim_ascii();
    (!v.is_empty() && v.iter().all(u8::is_ascii_digit))
        .then(|| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
        .flatten()
}

/// Whether a `Transfer-Encoding` value's final coding is chunked.
fn chunked_last(value: &[u8]) -> bool {
    let last = value.rsplit(|&b| b == b',').next().unwrap_or_default();
    last.trim_ascii().eq_ignore_ascii_case(b"chunked")
}

/// Parses a response head at the start of `buf` (`Ok(None)`: incomplete, read more).
/// `head_request`: the request was HEAD (no body whatever the head says). `on_field` is
/// called with each header field of a final (not 1xx) response, in order, borrowing
/// from `buf` — except `Content-Length` when `Transfer-Encoding` is present.
pub fn parse_response<'b>(
    buf: &'b [u8],
    head_request: bool,
    mut on_field: impl FnMut(&'b str, &'b [u8]),
) -> Result<Option<ResponseHead>, FramingError> {
    // Uninitialised: filling 100 empty fields first would cost more than the parse.
    let mut fields = [const { MaybeUninit::<httparse::Header<'b>>::uninit() }; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(FramingError::Syntax(e.to_string())),
    };
    let status = resp.code.unwrap_or(0);
    let reason = resp.reason.map_or(0..0, |r| {
        let at = r.as_ptr() as usize - buf.as_ptr() as usize;
        at..at + r.len()
    });
    if status < 100 {
        // httparse takes any three digits; "000" is no status at all.
        return Err(FramingError::Syntax(format!("status code {status:03}")));
    }
    let http10 = resp.version == Some(0);
    let (mut saw_close, mut saw_keep_alive) = (false, false);
    let mut length: Option<u64> = None;
    // Some(true): chunked is the final coding; Some(false): another coding is final.
    let mut chunked: Option<bool> = None;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = content_length(h.value).ok_or(FramingError::BadLength)?;
            if length.is_some_and(|c| c != n) {
                return Err(FramingError::ConflictingLength);
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = Some(chunked_last(h.value));
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                saw_close |= token.eq_ignore_ascii_case(b"close");
                saw_keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        }
    }
    // HTTP/1.1 keeps the connection unless told otherwise; 1.0 closes it unless told;
    // a `close` anywhere wins.
    let mut keep_alive = !saw_close && (!http10 || saw_keep_alive);
    // Both lengths (a smuggling attempt, RFC 9112 6.3) or chunked in HTTP/1.0 (6.1):
    // framed by Transfer-Encoding, but the connection is not trusted with another.
    if chunked.is_some() && (length.is_some() || http10) {
        keep_alive = false;
    }
    let framing = if head_request || (100..200).contains(&status) || status == 204 || status == 304
    {
        Framing::Empty
    } else {
        match (chunked, length) {
            (Some(true), _) => Framing::Chunked,
            // Another final coding: the body ends with the connection (RFC 9112 6.3).
            (Some(false), _) | (None, None) => Framing::UntilClose,
            (None, Some(0)) => Framing::Empty,
            (None, Some(n)) => Framing::Length(n),
        }
    };
    if framing == Framing::UntilClose {
        keep_alive = false;
    }
    if status >= 200 {
        for h in resp.headers.iter() {
            // With Transfer-Encoding, Content-Length is not the message's: an
            // intermediary must drop it (RFC 9112 6.3), or its client would trust it.
            if chunked.is_some() && h.name.eq_ignore_ascii_case("content-length") {
                continue;
            }
            on_field(h.name, h.value);
        }
    }
    Ok(Some(ResponseHead {
        len,
        status,
        framing,
        keep_alive,
        headers: resp.headers.len(),
        reason,
    }))
}

/// How a request body is delimited (RFC 9112 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestBody {
    /// No body (no `Content-Length`, no `Transfer-Encoding`, or a length of 0).
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A complete request head; the strings borrow from the buffer parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead<'b> {
    /// Bytes of the head, through its empty line.
    pub len: usize,
    /// The method, as sent (methods are case-sensitive).
    pub method: &'b str,
    /// The request target, as sent (origin, absolute, authority or asterisk form).
    pub target: &'b str,
    /// HTTP/1.0 (else 1.1).
    pub http10: bool,
    /// How the body is delimited.
    pub body: RequestBody,
    /// Whether the client wants the connection kept for another request.
    pub keep_alive: bool,
    /// `Expect: 100-continue`: the client waits for a `100 Continue` before its body.
    pub expect_continue: bool,
    /// The `Host` field value, if there is one.
    pub host: Option<&'b [u8]>,
}

/// Why bytes are not an acceptable request (each a 400, except as noted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Not HTTP/1.x (httparse's reason).
    #[error("not an HTTP/1.1 request: {0}")]
    Syntax(String),
    /// More than [`MAX_HEADERS`] header fields (a 431).
    #[error("more than {MAX_HEADERS} header fields")]
    TooManyHeaders,
    /// A `Content-Length` that is not a number, or two that disagree.
    #[error("bad or conflicting Content-Length")]
    BadLength,
    /// `Transfer-Encoding` whose final coding is not chunked, or sent with
    /// `Content-Length` or in HTTP/1.0: the body's end cannot be trusted (smuggling).
    #[error("Transfer-Encoding other than chunked, or with Content-Length, or in HTTP/1.0")]
    BadTransferEncoding,
    /// A transfer coding besides chunked (`gzip, chunked`): not implemented (a 501).
    #[error("transfer codings other than chunked are not supported")]
    UnsupportedTransferCoding,
    /// An HTTP/1.1 request without `Host` (RFC 9112 3.2).
    #[error("HTTP/1.1 request without a Host field")]
    MissingHost,
    /// Two `Host` fields.
    #[error("more than one Host field")]
    DuplicateHost,
}

/// Parses a request head at the start of `buf` (`Ok(None)`: incomplete, read more).
/// `fields` is where the header fields go (uninitialised space, at most
/// [`MAX_HEADERS`] are looked at); the ones parsed are returned with the head.
pub fn parse_request<'b, 'h>(
    buf: &'b [u8],
    fields: &'h mut [MaybeUninit<httparse::Header<'b>>],
) -> Result<Option<(RequestHead<'b>, &'h [httparse::Header<'b>])>, RequestError> {
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_request_with_uninit_headers(&mut req, buf, fields)
    {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(RequestError::TooManyHeaders),
        Err(e) => return Err(RequestError::Syntax(e.to_string())),
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(RequestError::Syntax("incomplete request line".into()));
    };
    let http10 = version == 0;
    let (mut saw_close, mut saw_keep_alive, mut expect_continue) = (false, false, false);
    let mut length: Option<u64> = None;
    let mut chunked: Option<bool> = None;
    let mut other_coding = false;
    let mut chunked_fields = 0u32;
    let mut host = None;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let n = content_length(h.value).ok_or(RequestError::BadLength)?;
            if length.is_some_and(|c| c != n) {
                return Err(RequestError::BadLength);
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Any field whose final coding is not chunked spoils it for good.
            chunked = Some(chunked != Some(false) && chunked_last(h.value));
            // Anything but one `chunked` (gzip, or chunked twice, in one field or two:
            // fields of one name are one list, RFC 9110 5.3) is not forwarded
            // faithfully by a proxy that frames the body again: refused.
            other_coding |=
                chunked_fields > 0 || h.value.contains(&b',') || h.value.trim_ascii().len() != 7;
            chunked_fields += 1;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                saw_close |= token.eq_ignore_ascii_case(b"close");
                saw_keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case("host") {
            if host.is_some() {
                return Err(RequestError::DuplicateHost);
            }
            host = Some(h.value);
        } else if name.eq_ignore_ascii_case("expect") {
            expect_continue |= h.value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
        }
    }
    if chunked == Some(true) && length.is_none() && !http10 && other_coding {
        return Err(RequestError::UnsupportedTransferCoding);
    }
    if !http10 && host.is_none() {
        return Err(RequestError::MissingHost);
    }
    let body = match (chunked, length) {
        (Some(true), None) if !http10 => RequestBody::Chunked,
        (Some(_), _) => return Err(RequestError::BadTransferEncoding),
        (None, None | Some(0)) => RequestBody::None,
        (None, Some(n)) => RequestBody::Length(n),
    };
    Ok(Some((
        RequestHead {
            len,
            method,
            target,
            http10,
            body,
            keep_alive: !saw_close && (!http10 || saw_keep_alive),
            // An HTTP/1.0 client does not know 100 Continue (RFC 9110 10.1.1).
            expect_continue: expect_continue && !http10,
            host,
        },
        req.headers,
    )))
}

/// Parses a chunk-size line at the start of `buf` (RFC 9112 7.1): `Ok(None)` when
/// incomplete, else the bytes it takes and the size.
///
/// Stricter than `httparse::parse_chunk_size`, which this replaced: that takes an empty
/// line for a size of 0 (the body's end, where nginx and HAProxy answer 400) and any
/// byte in an extension, a bare LF included (`2;\nxx\r\n`: a peer that ends the
/// line at the LF reads `xx` as data). Here: 1 to 16 hex digits, optional spaces or
/// tabs, then either the line end or `;` and an extension of visible characters,
/// spaces and tabs (extensions are ignored: RFC 9112 7.1.1), and the line ends with
/// CRLF and nothing else.
fn chunk_line(buf: &[u8]) -> Result<Option<(usize, u64)>, FramingError> {
    let digits = buf.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits > 16 {
        return Err(FramingError::BadChunkSize);
    }
    let mut i = digits;
    if i == buf.len() {
        return if i > MAX_CHUNK_LINE {
            Err(FramingError::BadChunkSize)
        } else {
            Ok(None)
        };
    }
    if digits == 0 {
        return Err(FramingError::BadChunkSize);
    }
    let mut in_ext = false;
    loop {
        let Some(&b) = buf.get(i) else {
            return if i > MAX_CHUNK_LINE {
                Err(FramingError::BadChunkSize)
            } else {
                Ok(None)
            };
        };
        match b {
            b'\r' => match buf.get(i + 1) {
                None => return Ok(None),
                Some(b'\n') => break,
                Some(_) => return Err(FramingError::BadLineEnd),
            },
            b'\n' => return Err(FramingError::BadLineEnd),
            b' ' | b'\t' => {}
            b';' => in_ext = true,
            0x21..=0x7e | 0x80..=0xff if in_ext => {}
            _ => return Err(FramingError::BadChunkSize),
        }
        i += 1;
        if i > MAX_CHUNK_LINE {
            return Err(FramingError::BadChunkSize);
        }
    }
    let hex = std::str::from_utf8(&buf[..digits]).map_err(|_| FramingError::BadChunkSize)?;
    let size = u64::from_str_radix(hex, 16).map_err(|_| FramingError::BadChunkSize)?;
    Ok(Some((i + 2, size)))
}

/// What [`ChunkedDecoder::decode`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes at this range of the buffer given.
    Data(Range<usize>),
    /// The buffer holds no more body bytes yet: read more, call again.
    NeedMore,
    /// The body ended (trailers included).
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    Size,
    Data(u64),
    DataEnd,
    Trailers(usize),
    Done,
}

/// A chunked-body decoder fed from the caller's buffer.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: ChunkState,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder {
            state: ChunkState::Size,
        }
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a body.
    pub fn new() -> Self {
        Self::default()
    }

    /// True once the last chunk and the trailers went by.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Decodes from the start of `buf`. Returns how many bytes of `buf` were consumed
    /// (the caller drops them) and what they were; body bytes are returned one range
    /// at a time (the range is inside the consumed part).
    pub fn decode(&mut self, buf: &[u8]) -> Result<(usize, Decoded), FramingError> {
        let mut pos = 0;
        loop {
            let rest = &buf[pos..];
            match self.state {
                ChunkState::Done => return Ok((pos, Decoded::End)),
                ChunkState::Size => match chunk_line(rest)? {
                    Some((n, size)) => {
                        pos += n;
                        self.state = if size == 0 {
                            ChunkState::Trailers(0)
                        } else {
                            ChunkState::Data(size)
                        };
                    }
                    None => return Ok((pos, Decoded::NeedMore)),
                },
                ChunkState::Data(left) => {
                    if rest.is_empty() {
                        return Ok((pos, Decoded::NeedMore));
                    }
                    let n = rest.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    self.state = if n as u64 == left {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left - n as u64)
                    };
                    return Ok((pos + n, Decoded::Data(pos..pos + n)));
                }
                ChunkState::DataEnd => match rest {
                    [b'\r', b'\n', ..] => {
                        pos += 2;
                        self.state = ChunkState::Size;
                    }
                    [] | [b'\r'] => return Ok((pos, Decoded::NeedMore)),
                    _ => return Err(FramingError::BadChunkEnd),
                },
                ChunkState::Trailers(seen) => {
                    // Trailer fields are dropped; lines up to the empty one, each
                    // ending with CRLF: a bare LF (or CR) would end a line for a peer
                    // that reads LF alone as a line end, and the two would disagree
                    // on where the message ends (the next request taken for trailers).
                    let Some(lf) = rest.iter().position(|&b| b == b'\n') else {
                        if seen + rest.len() > MAX_TRAILERS {
                            return Err(FramingError::TrailersTooLarge);
                        }
                        return Ok((pos, Decoded::NeedMore));
                    };
                    if lf == 0 || rest[lf - 1] != b'\r' || rest[..lf - 1].contains(&b'\r') {
                        return Err(FramingError::BadLineEnd);
                    }
                    let eol = lf - 1;
                    pos += eol + 2;
                    self.state = if eol == 0 {
                        ChunkState::Done
                    } else if seen + eol + 2 > MAX_TRAILERS {
                        return Err(FramingError::TrailersTooLarge);
                    } else {
                        ChunkState::Trailers(seen + eol + 2)
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
