// The body of fuzz/fuzz_targets/http1_response.rs (its doc says what it checks), kept apart
// so that the same code replays the saved reproducers and seeds as a plain test on
// stable Rust (crates/vigil-cli/tests/cli/fuzz_replay.rs) and runs under libFuzzer.
use vigil_core::http1::{self, ChunkedDecoder, Decoded};

/// Decodes `wire` fed `step` bytes at a time; the body and whether it ended cleanly.
fn decode(wire: &[u8], step: usize) -> (Vec<u8>, bool) {
    let (mut d, mut buf, mut fed, mut out) = (ChunkedDecoder::new(), Vec::new(), 0, Vec::new());
    loop {
        let (n, what) = match d.decode(&buf) {
            Ok(r) => r,
            Err(_) => return (out, false),
        };
        assert!(n <= buf.len(), "consumed {n} of {}", buf.len());
        match what {
            Decoded::Data(r) => {
                assert!(r.start <= r.end && r.end <= n && !r.is_empty());
                out.extend_from_slice(&buf[r]);
            }
            Decoded::End => return (out, true),
            Decoded::NeedMore => {
                if fed == wire.len() {
                    return (out, false);
                }
                let more = step.min(wire.len() - fed);
                buf.extend_from_slice(&wire[fed..fed + more]);
                fed += more;
            }
        }
        buf.drain(..n);
    }
}

/// The target's body: never panics on any input, and checks the invariants its fuzz
/// target's doc lists.
pub fn check(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut fields = 0usize;
    if let Ok(Some(h)) = http1::parse_response(rest, flags & 1 == 1, |name, value| {
        fields += 1;
        assert!(!name.is_empty());
        let (start, end) = (value.as_ptr() as usize, value.as_ptr() as usize + value.len());
        let base = rest.as_ptr() as usize;
        assert!(start >= base && end <= base + rest.len(), "a field outside the input");
    }) {
        assert!(h.len <= rest.len());
        assert!((100..1000).contains(&h.status));
        assert!(fields == 0 || fields == h.headers);
    }
    let step = usize::from(flags >> 1).max(1);
    let (whole, ended) = decode(rest, rest.len().max(1));
    let (pieces, ended_pieces) = decode(rest, step);
    assert_eq!(ended, ended_pieces, "the end must not depend on read sizes");
    if ended {
        assert_eq!(whole, pieces, "the body must not depend on read sizes");
    }
}
