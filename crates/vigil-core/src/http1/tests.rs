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
        framing("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 9\r\n\r\n"),
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
    assert!(framing("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n").1);
    assert!(
        framing("HTTP/1.1 200 OK\r\nconnection: keep-alive, foo\r\ncontent-length: 1\r\n\r\n").1
    );
}

#[test]
fn transfer_encoding_hides_content_length_and_costs_the_connection() {
    let mut seen = Vec::new();
    let raw = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\nx: 1\r\n\r\n";
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
        !framing("HTTP/1.0 200 OK\r\nconnection: close, keep-alive\r\ncontent-length: 1\r\n\r\n").1
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
