// The body of fuzz/fuzz_targets/http1_framing.rs (its doc says what it checks), kept apart
// so that the same code replays the saved reproducers and seeds as a plain test on
// stable Rust (crates/vigil-cli/tests/cli/fuzz_replay.rs) and runs under libFuzzer.
use std::mem::MaybeUninit;
use vigil_core::http1::{self, ChunkedDecoder, Decoded, MAX_HEADERS, RequestBody};

#[derive(Debug, PartialEq, Eq)]
enum Read {
    /// More bytes are needed.
    Incomplete,
    /// Refused.
    Reject,
    /// A whole message: head length, body, bytes taken in all.
    Message(usize, Vec<u8>, usize),
}

/// The target's body: never panics on any input, and checks the invariants its fuzz
/// target's doc lists.
pub fn check(input: &[u8]) {
    let Some((&step, data)) = input.split_first() else {
        return;
    };
    let step = usize::from(step % 16) + 1;
    let vigil = vigil_reads(data, step);
    let oracle = oracle_reads(data);
    match (&vigil, &oracle) {
        (Read::Reject, _) | (Read::Incomplete, Read::Incomplete | Read::Reject) => {}
        (Read::Message(..), _) => assert_eq!(vigil, oracle, "vigil and the oracle disagree"),
        (Read::Incomplete, Read::Message(..)) => {
            panic!("vigil wants more where the oracle has a whole message: {oracle:?}")
        }
    }
}

/// vigil's reading.
fn vigil_reads(data: &[u8], step: usize) -> Read {
    let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let head = match http1::parse_request(data, &mut fields) {
        Ok(Some((h, _))) => h,
        Ok(None) => return Read::Incomplete,
        Err(_) => return Read::Reject,
    };
    let rest = &data[head.len..];
    match head.body {
        RequestBody::None => Read::Message(head.len, Vec::new(), head.len),
        RequestBody::Length(n) => match usize::try_from(n) {
            Ok(n) if n <= rest.len() => Read::Message(head.len, rest[..n].to_vec(), head.len + n),
            _ => Read::Incomplete,
        },
        RequestBody::Chunked => {
            // Fed `step` bytes at a time: the decoder sees `rest[at..fed]`.
            let mut d = ChunkedDecoder::new();
            let (mut at, mut fed, mut body) = (0, 0, Vec::new());
            loop {
                match d.decode(&rest[at..fed]) {
                    Err(_) => return Read::Reject,
                    Ok((n, Decoded::Data(r))) => {
                        body.extend_from_slice(&rest[at + r.start..at + r.end]);
                        at += n;
                    }
                    Ok((n, Decoded::End)) => return Read::Message(head.len, body, head.len + at + n),
                    Ok((n, Decoded::NeedMore)) => {
                        at += n;
                        if fed == rest.len() {
                            return Read::Incomplete;
                        }
                        fed = (fed + step).min(rest.len());
                    }
                }
            }
        }
    }
}

/// The oracle: RFC 9112 6.1-6.3 and 7.1, written out plainly.
fn oracle_reads(data: &[u8]) -> Read {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(data) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Read::Incomplete,
        Err(_) => return Read::Reject,
    };
    let http10 = req.version == Some(0);
    let is = |h: &httparse::Header<'_>, n: &str| h.name.eq_ignore_ascii_case(n);
    let hosts = req.headers.iter().filter(|h| is(h, "host")).count();
    if hosts > 1 || (!http10 && hosts == 0) {
        return Read::Reject;
    }
    // Content-Length: every element of every field 1*DIGIT, all the same (6.3 item 5).
    let mut length: Option<u64> = None;
    for h in req.headers.iter().filter(|h| is(h, "content-length")) {
        for v in h.value.split(|&b| b == b',') {
            let v = trim_ows(v);
            if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
                return Read::Reject;
            }
            let Ok(n) = std::str::from_utf8(v).unwrap_or("x").parse::<u64>() else {
                return Read::Reject;
            };
            if length.is_some_and(|l| l != n) {
                return Read::Reject;
            }
            length = Some(n);
        }
    }
    // Transfer-Encoding: exactly one coding, chunked, in HTTP/1.1, without
    // Content-Length (6.1, 6.3 items 3 and 4; anything else is refused by a proxy that
    // frames the body again).
    let codings: Vec<&[u8]> = req
        .headers
        .iter()
        .filter(|h| is(h, "transfer-encoding"))
        .flat_map(|h| h.value.split(|&b| b == b','))
        .map(trim_ows)
        .collect();
    let rest = &data[head_len..];
    if codings.is_empty() {
        let n = length.unwrap_or(0);
        return match usize::try_from(n) {
            Ok(n) if n <= rest.len() => Read::Message(head_len, rest[..n].to_vec(), head_len + n),
            _ => Read::Incomplete,
        };
    }
    if http10 || length.is_some() || codings.len() != 1 || !codings[0].eq_ignore_ascii_case(b"chunked")
    {
        return Read::Reject;
    }
    // chunked-body = *chunk last-chunk trailer-section CRLF (7.1), lines ending in CRLF.
    let mut pos = 0;
    let mut body = Vec::new();
    loop {
        let Some(eol) = find_crlf(&rest[pos..]) else {
            return if rest[pos..].iter().any(|&b| b == b'\n' || b == b'\r') {
                Read::Reject
            } else {
                Read::Incomplete
            };
        };
        let line = &rest[pos..pos + eol];
        let Some(size) = chunk_size(line) else {
            return Read::Reject;
        };
        pos += eol + 2;
        if size == 0 {
            break;
        }
        let Ok(size) = usize::try_from(size) else {
            return Read::Incomplete;
        };
        if rest.len() - pos < size + 2 {
            return if rest.len() - pos > size && rest[pos + size] != b'\r' {
                Read::Reject
            } else {
                Read::Incomplete
            };
        }
        body.extend_from_slice(&rest[pos..pos + size]);
        if &rest[pos + size..pos + size + 2] != b"\r\n" {
            return Read::Reject;
        }
        pos += size + 2;
    }
    // trailer-section: field lines (not interpreted), then an empty line.
    loop {
        let Some(eol) = find_crlf(&rest[pos..]) else {
            return if rest[pos..].iter().any(|&b| b == b'\n' || b == b'\r') {
                Read::Reject
            } else {
                Read::Incomplete
            };
        };
        pos += eol + 2;
        if eol == 0 {
            return Read::Message(head_len, body, head_len + pos);
        }
    }
}

/// The first CRLF, when no bare CR or LF comes before it (a bare one is refused).
fn find_crlf(b: &[u8]) -> Option<usize> {
    let i = b.iter().position(|&c| c == b'\r' || c == b'\n')?;
    (b[i] == b'\r' && b.get(i + 1) == Some(&b'\n')).then_some(i)
}

/// chunk-size [ chunk-ext ] (7.1, 7.1.1): 1*HEXDIG, then optional whitespace, then
/// either the end or `;` and an extension of visible characters and whitespace (not
/// interpreted). `None`: not a chunk line.
fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return None;
    }
    let after = &line[digits..];
    let ws = after.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
    // Nothing after the size, or an extension of visible characters and tabs.
    let extension_ok = |ext: &[u8]| ext.iter().all(|&b| b == b'\t' || b >= 0x20 && b != 0x7f);
    match after.get(ws) {
        None => {}
        Some(b';') if extension_ok(&after[ws..]) => {}
        Some(_) => return None,
    }
    u64::from_str_radix(std::str::from_utf8(&line[..digits]).ok()?, 16).ok()
}

fn trim_ows(v: &[u8]) -> &[u8] {
    let s = v.iter().position(|&b| b != b' ' && b != b'\t').unwrap_or(v.len());
    let e = v.iter().rposition(|&b| b != b' ' && b != b'\t').map_or(s, |e| e + 1);
    &v[s..e.max(s)]
}
