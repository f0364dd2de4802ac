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
mod tests {
    use super::*;

    fn request(raw: &str) -> Result<Option<RequestHead<'_>>, RequestError> {
        let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        parse_request(raw.as_bytes(), &mut fields).map(|r| r.map(|(h, _)| h))
    }

    fn request_body(raw: &str) -> Result<RequestBody, RequestError> {
        request(raw).map(|h| h.expect("complete").body)
    }

    #[test]
    fn request_framing_rejects_every_ambiguous_length() {
        use RequestBody::*;
        assert_eq!(request_body("GET / HTTP/1.1\r\nhost: a\r\n\r\n"), Ok(None));
        assert_eq!(
            request_body("POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\n\r\n"),
            Ok(Length(5))
        );
        assert_eq!(
            request_body(
                "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\n"
            ),
            Ok(Length(5)),
            "the same length twice is one length"
        );
        assert_eq!(
            request_body("POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: Chunked \r\n\r\n"),
            Ok(Chunked)
        );
        for other in [
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked, chunked\r\n\r\n",
        ] {
            assert_eq!(
                request_body(other),
                Err(RequestError::UnsupportedTransferCoding),
                "{other:?}"
            );
        }
        for bad in [
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5 5\r\n\r\n",
        ] {
            assert_eq!(request_body(bad), Err(RequestError::BadLength), "{bad:?}");
        }
        for bad in [
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(
                request_body(bad),
                Err(RequestError::BadTransferEncoding),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn request_head_fields_keep_alive_expect_and_host() {
        let raw = "PUT /a?b HTTP/1.1\r\nHost: example.com\r\nExpect: 100-Continue\r\ncontent-length: 3\r\n\r\nabc";
        let h = request(raw).unwrap().unwrap();
        assert_eq!((h.method, h.target, h.http10), ("PUT", "/a?b", false));
        assert_eq!(h.len, raw.len() - 3);
        assert!(h.keep_alive && h.expect_continue);
        assert_eq!(h.host, Some(&b"example.com"[..]));
        let h = request("GET / HTTP/1.1\r\nhost: a\r\nconnection: foo, Close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive);
        let h = request("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive, "HTTP/1.0 closes unless asked");
        let h = request("GET / HTTP/1.0\r\nconnection: keep-alive\r\nexpect: 100-continue\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(
            h.keep_alive && !h.expect_continue,
            "1.0 knows no 100 Continue"
        );
        assert_eq!(request("GET / HTTP/1.1\r\nhost: a"), Ok(Option::None));
        assert_eq!(
            request("GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n"),
            Err(RequestError::DuplicateHost)
        );
        assert_eq!(
            request("GET / HTTP/1.1\r\n\r\n"),
            Err(RequestError::MissingHost),
            "RFC 9112 3.2: a 1.1 request names its host"
        );
        assert!(matches!(
            request("GET /\r\n\r\n"),
            Err(RequestError::Syntax(_))
        ));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: 1\r\n")).collect();
        assert_eq!(
            request(&format!("GET / HTTP/1.1\r\nhost: a\r\n{many}\r\n")),
            Err(RequestError::TooManyHeaders)
        );
    }

    fn head(raw: &str, head_request: bool) -> Result<Option<ResponseHead>, FramingError> {
        parse_response(raw.as_bytes(), head_request, |_, _| {})
    }

    fn framing(raw: &str) -> (Framing, bool) {
        let h = head(raw, false).unwrap().unwrap();
        (h.framing, h.keep_alive)
    }

    #[test]
    fn body_framing_follows_rfc_9112_section_6_3() {
        use Framing::*;
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"),
            (Length(5), true)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"),
            (Empty, true)
        );
        assert_eq!(
            framing(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 9\r\n\r\n"
            ),
            (Chunked, false),
            "transfer-encoding beats content-length (and the connection is not reused)"
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n"),
            (UntilClose, false),
            "chunked not final: read until close"
        );
        assert_eq!(framing("HTTP/1.1 200 OK\r\n\r\n"), (UntilClose, false));
        assert_eq!(
            framing("HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n"),
            (Empty, true)
        );
        assert_eq!(framing("HTTP/1.1 304 Not Modified\r\n\r\n"), (Empty, true));
        assert_eq!(framing("HTTP/1.1 100 Continue\r\n\r\n"), (Empty, true));
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", true)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Empty, "a HEAD answer has no body");
    }

    #[test]
    fn fields_of_final_answers_are_handed_over_in_order() {
        let mut seen = Vec::new();
        let raw = "HTTP/1.1 200 OK\r\nx-a: 1\r\nX-B: two\r\nx-a: 3\r\n\r\n";
        parse_response(raw.as_bytes(), false, |n, v| {
            seen.push(format!("{n}={}", String::from_utf8_lossy(v)))
        })
        .unwrap()
        .unwrap();
        assert_eq!(seen, ["x-a=1", "X-B=two", "x-a=3"]);
        seen.clear();
        let early = "HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n";
        parse_response(early.as_bytes(), false, |n, _| seen.push(n.to_string()))
            .unwrap()
            .unwrap();
        assert!(seen.is_empty(), "1xx fields are not the answer's");
    }

    #[test]
    fn keep_alive_by_version_and_connection_header() {
        assert!(!framing("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\n").1);
        assert!(!framing("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n").1);
        assert!(
            framing("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n").1
        );
        assert!(
            framing("HTTP/1.1 200 OK\r\nconnection: keep-alive, foo\r\ncontent-length: 1\r\n\r\n")
                .1
        );
    }

    #[test]
    fn transfer_encoding_hides_content_length_and_costs_the_connection() {
        let mut seen = Vec::new();
        let raw =
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\nx: 1\r\n\r\n";
        let h = parse_response(raw.as_bytes(), false, |n, _| seen.push(n.to_string()))
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Chunked);
        assert!(
            !h.keep_alive,
            "both lengths: a smuggling attempt, not reused"
        );
        assert_eq!(
            seen,
            ["transfer-encoding", "x"],
            "Content-Length is not passed on"
        );
        let h = head(
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert!(!h.keep_alive, "chunked in HTTP/1.0 is faulty framing");
    }

    #[test]
    fn content_length_is_digits_and_close_is_final() {
        for bad in ["+5", "5 5", "-1", "0x5", "", "99999999999999999999999"] {
            let raw = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n");
            assert_eq!(head(&raw, false), Err(FramingError::BadLength), "{bad:?}");
        }
        assert!(
            !framing(
                "HTTP/1.0 200 OK\r\nconnection: close, keep-alive\r\ncontent-length: 1\r\n\r\n"
            )
            .1
        );
        assert!(!framing("HTTP/1.0 200 OK\r\nconnection: close\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n").1);
    }

    #[test]
    fn bad_heads_are_errors_and_short_ones_incomplete() {
        assert_eq!(
            head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n", false),
            Ok(None)
        );
        assert_eq!(
            head("HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n", false),
            Err(FramingError::BadLength)
        );
        assert_eq!(
            head(
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
                false
            ),
            Err(FramingError::ConflictingLength)
        );
        assert!(matches!(
            head("garbage\r\n\r\n", false),
            Err(FramingError::Syntax(_))
        ));
        assert!(
            matches!(
                head("HTTP/1.1 042 X\r\n\r\n", false),
                Err(FramingError::Syntax(_))
            ),
            "a status under 100 is not informational: it is not HTTP"
        );
        let h = head(
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\nhello",
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!((h.len, h.headers, h.status), (57, 2, 200));
    }

    /// Decodes `wire` fed in pieces of `step` bytes, as a socket would deliver it.
    fn decode_in_steps(wire: &[u8], step: usize) -> Result<(Vec<u8>, usize), FramingError> {
        let mut d = ChunkedDecoder::new();
        let (mut buf, mut fed, mut out) = (Vec::new(), 0, Vec::new());
        loop {
            let (n, what) = d.decode(&buf)?;
            match what {
                Decoded::Data(r) => out.extend_from_slice(&buf[r]),
                Decoded::End => {
                    buf.drain(..n);
                    return Ok((out, buf.len() + wire.len() - fed));
                }
                Decoded::NeedMore => {
                    if fed == wire.len() {
                        panic!("ran out of input: {:?}", String::from_utf8_lossy(&out));
                    }
                    let more = step.min(wire.len() - fed);
                    buf.extend_from_slice(&wire[fed..fed + more]);
                    fed += more;
                }
            }
            buf.drain(..n);
        }
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_read_sizes() {
        let wire = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, 64] {
            let (body, left) = decode_in_steps(wire, step).unwrap();
            assert_eq!(body, b"hello, world", "step {step}");
            assert_eq!(
                left, 4,
                "the next message's bytes are not consumed (step {step})"
            );
        }
    }

    #[test]
    fn broken_chunked_bodies_are_errors() {
        assert_eq!(
            decode_in_steps(b"zz\r\nhello\r\n0\r\n\r\n", 64),
            Err(FramingError::BadChunkSize)
        );
        assert_eq!(
            decode_in_steps(b"5\r\nhelloXX0\r\n\r\n", 64),
            Err(FramingError::BadChunkEnd)
        );
        let long_ext = format!("5;{}\r\nhello\r\n0\r\n\r\n", "e".repeat(MAX_CHUNK_LINE));
        assert_eq!(
            decode_in_steps(long_ext.as_bytes(), 64),
            Err(FramingError::BadChunkSize)
        );
        let big_trailer = format!("0\r\nx: {}\r\n\r\n", "t".repeat(MAX_TRAILERS));
        assert_eq!(
            decode_in_steps(big_trailer.as_bytes(), 512),
            Err(FramingError::TrailersTooLarge)
        );
    }

    /// RFC 9112 7.1: chunk-size and trailer lines end with CRLF, nothing else; the
    /// inputs here are the ones nginx or HAProxy read differently from a lenient parser
    /// (`bench/lb/smuggling.py`). Each is an error, never a body.
    #[test]
    fn chunk_lines_end_with_crlf_and_nothing_else_is_a_body() {
        for (wire, want) in [
            (&b"2;\nxx\r\nhi\r\n0\r\n\r\n"[..], FramingError::BadLineEnd),
            (b"2\nhi\r\n0\r\n\r\n", FramingError::BadLineEnd),
            (b"2;a\rb\r\nhi\r\n0\r\n\r\n", FramingError::BadLineEnd),
            (b"\r\nhi\r\n0\r\n\r\n", FramingError::BadChunkSize),
            (b"0x2\r\nhi\r\n0\r\n\r\n", FramingError::BadChunkSize),
            (b" 2\r\nhi\r\n0\r\n\r\n", FramingError::BadChunkSize),
            (b"2 3\r\nhi\r\n0\r\n\r\n", FramingError::BadChunkSize),
            (b"2;a\x00\r\nhi\r\n0\r\n\r\n", FramingError::BadChunkSize),
            (
                b"00000000000000002\r\nhi\r\n0\r\n\r\n",
                FramingError::BadChunkSize,
            ),
            (b"2\r\nhi\n0\r\n\r\n", FramingError::BadChunkEnd),
            (b"2\r\nhi\r\n0\r\nx: y\n\r\n", FramingError::BadLineEnd),
            (b"2\r\nhi\r\n0\r\n\n", FramingError::BadLineEnd),
            (b"2\r\nhi\r\n0\r\nx: a\rb\r\n\r\n", FramingError::BadLineEnd),
        ] {
            for step in [1, 3, 64] {
                let mut d = ChunkedDecoder::new();
                let (mut buf, mut fed) = (Vec::new(), 0);
                let got = loop {
                    match d.decode(&buf) {
                        Err(e) => break Some(e),
                        Ok((_, Decoded::End)) => break None,
                        Ok((n, Decoded::NeedMore)) if fed == wire.len() => {
                            panic!("{:?} wants more after {n}", String::from_utf8_lossy(wire))
                        }
                        Ok((n, Decoded::NeedMore)) => {
                            buf.drain(..n);
                            let more = step.min(wire.len() - fed);
                            buf.extend_from_slice(&wire[fed..fed + more]);
                            fed += more;
                        }
                        Ok((n, Decoded::Data(_))) => {
                            buf.drain(..n);
                        }
                    }
                };
                assert_eq!(
                    got,
                    Some(want.clone()),
                    "{:?} read {step} bytes at a time",
                    String::from_utf8_lossy(wire)
                );
            }
        }
        // What RFC 9112 allows still decodes: extensions with quoted strings, spaces
        // before `;` or the line end, sixteen hex digits, upper case.
        for ok in [
            &b"2 ;a=\"b c\";d\r\nhi\r\n0\r\n\r\n"[..],
            b"2\t\r\nhi\r\n0\r\n\r\n",
            b"0000000000000002\r\nhi\r\n0\r\nx: y\r\n\r\n",
        ] {
            assert_eq!(decode_in_steps(ok, 2).unwrap().0, b"hi");
        }
        assert_eq!(
            decode_in_steps(b"A\r\n0123456789\r\n0\r\n\r\n", 5)
                .unwrap()
                .0,
            b"0123456789"
        );
    }

    #[test]
    fn transfer_encoding_chunked_in_two_fields_is_chunked_twice() {
        assert_eq!(
            request_body(
                "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n"
            ),
            Err(RequestError::UnsupportedTransferCoding),
            "fields of one name are one list (RFC 9110 5.3): chunked, chunked"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_chunking_of_any_body_round_trips(
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
            cuts in proptest::collection::vec(1usize..97, 1..8),
            step in 1usize..40,
        ) {
            let mut wire = Vec::new();
            let (mut at, mut i) = (0, 0);
            while at < body.len() {
                let n = cuts[i % cuts.len()].min(body.len() - at);
                wire.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                wire.extend_from_slice(&body[at..at + n]);
                wire.extend_from_slice(b"\r\n");
                at += n;
                i += 1;
            }
            wire.extend_from_slice(b"0\r\n\r\n");
            let (out, left) = decode_in_steps(&wire, step).unwrap();
            proptest::prop_assert_eq!(out, body);
            proptest::prop_assert_eq!(left, 0);
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_parsers(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
        ) {
            let _ = parse_response(&bytes, false, |_, _| {});
            let mut d = ChunkedDecoder::new();
            let mut pos = 0;
            while let Ok((n, what)) = d.decode(&bytes[pos..]) {
                pos += n;
                if what != Decoded::NeedMore && n == 0 || what == Decoded::NeedMore {
                    break;
                }
            }
        }
    }
}
