// The body of fuzz/fuzz_targets/http1_request.rs (its doc says what it checks), kept apart
// so that the same code replays the saved reproducers and seeds as a plain test on
// stable Rust (crates/vigil-cli/tests/cli/fuzz_replay.rs) and runs under libFuzzer.
use std::mem::MaybeUninit;
use vigil_core::http1::{self, MAX_HEADERS, RequestBody};

/// The target's body: never panics on any input, and checks the invariants its fuzz
/// target's doc lists.
pub fn check(data: &[u8]) {
    let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let Ok(Some((head, parsed))) = http1::parse_request(data, &mut fields) else {
        return;
    };
    assert!(head.len <= data.len());
    let mut shorter = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let cut = head.len / 2;
    assert!(
        !matches!(http1::parse_request(&data[..cut], &mut shorter), Ok(Some(_))),
        "a prefix of a head parsed as complete"
    );
    if let Some(h) = head.host {
        let host = parsed.iter().find(|f| f.name.eq_ignore_ascii_case("host")).unwrap();
        assert_eq!(h, host.value);
    }
    if head.body == RequestBody::Chunked {
        assert!(!head.http10);
        assert!(!parsed.iter().any(|f| f.name.eq_ignore_ascii_case("content-length")));
    }

    let Ok(fwd) = vigil_lb::downstream::forwarded_head(
        &head,
        parsed,
        "192.0.2.1",
        vigil_lb::config::Underscores::Drop,
    ) else {
        return;
    };
    let mut again = fwd.out_head.clone();
    if !fwd.has_host {
        // What the upstream client adds for a client without Host (HTTP/1.0).
        assert!(head.http10, "an HTTP/1.1 request without Host was accepted");
        again.extend_from_slice(b"host: target\r\n");
    }
    again.extend_from_slice(b"\r\n");
    let mut f2 = [const { MaybeUninit::uninit() }; MAX_HEADERS + 8];
    let (h2, fields2) = match http1::parse_request(&again, &mut f2) {
        Ok(Some(r)) => r,
        other => panic!("the forwarded head does not parse: {other:?}"),
    };
    assert_eq!(h2.len, again.len());
    assert_eq!(h2.method, head.method);
    assert_eq!(h2.body, RequestBody::None, "framing fields were forwarded");
    for f in fields2 {
        let n = f.name.to_ascii_lowercase();
        assert!(
            !matches!(
                n.as_str(),
                "connection" | "te" | "trailer" | "transfer-encoding" | "upgrade"
                    | "proxy-authorization" | "proxy-authenticate" | "keep-alive"
                    | "proxy-connection" | "content-length" | "expect"
            ),
            "hop-by-hop or framing field {n} forwarded"
        );
    }
    assert!(
        fields2.iter().all(|f| !f.name.contains('_')),
        "a field with an underscore was forwarded"
    );
    let xff: Vec<_> = fields2
        .iter()
        .filter(|f| f.name.eq_ignore_ascii_case("x-forwarded-for"))
        .collect();
    assert_eq!(xff.len(), 1);
    assert!(xff[0].value.ends_with(b"192.0.2.1"));
}
