use super::*;

/// The size of the future an async fn returns, from the fn alone.
fn future_size<A, B, C, D, E, G, F: Future>(_: impl FnOnce(A, B, C, D, E, G) -> F) -> usize {
    std::mem::size_of::<F>()
}

#[test]
fn an_idle_connection_task_is_small_whatever_its_requests_need() {
    // Every client connection's task is as large as the largest state its future
    // can be in: forwarding, HTTP/2, a refusal are boxed so an idle keep-alive
    // connection is not the size of them (docs/lb.md, memory per connection).
    let plain = future_size(serve_connection);
    assert!(plain <= 1280, "serve_connection's future is {plain} bytes");
    fn future_size7<A, B, C, D, E, G, H, F: Future>(
        _: impl FnOnce(A, B, C, D, E, G, H) -> F,
    ) -> usize {
        std::mem::size_of::<F>()
    }
    let tls = future_size7(serve_tls);
    eprintln!("futures: serve_connection {plain} bytes, serve_tls {tls} bytes");
    assert!(tls <= 2048, "serve_tls's future is {tls} bytes");
}

#[test]
fn request_targets_in_origin_absolute_and_asterisk_form() {
    assert_eq!(split_target("/a?b"), Some((None, "/a?b")));
    assert_eq!(split_target("*"), Some((None, "*")));
    assert_eq!(
        split_target("http://example.com:8080/p?q"),
        Some((Some("example.com:8080"), "/p?q"))
    );
    assert_eq!(split_target("HTTPS://h"), Some((Some("h"), "")));
    assert_eq!(split_target("http://h?x=1"), Some((Some("h"), "?x=1")));
    assert_eq!(split_target("example.com:443"), None, "authority form");
    assert_eq!(split_target("ftp://h/"), None);
    assert_eq!(split_target("http:///p"), None, "no authority");
}

/// `forwarded_head` of `raw` from client 10.9.8.7: the head as text, and the host
/// and path it routes by.
fn forward(raw: &str) -> Result<(String, Option<String>, String), (u16, String)> {
    let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let (head, fields) = http1::parse_request(raw.as_bytes(), &mut fields)
        .expect("valid")
        .expect("complete");
    let f = forwarded_head(&head, fields, "10.9.8.7", Underscores::Drop)?;
    assert_eq!(
        f.has_host,
        String::from_utf8_lossy(&f.out_head)
            .to_ascii_lowercase()
            .contains("\r\nhost: ")
    );
    Ok((
        String::from_utf8(f.out_head).unwrap(),
        f.host.map(str::to_string),
        f.path.to_string(),
    ))
}

#[test]
fn forwarded_heads_keep_end_to_end_fields_as_sent_and_nothing_else() {
    let (out, host, path) = forward(
        "POST /a/b?q=1 HTTP/1.1\r\nHost: App.Example\r\nConnection: close, X-Secret\r\n\
             X-Secret: 1\r\nTE: trailers\r\nProxy-Authorization: Basic eDp5\r\n\
             X-Forwarded-For: 10.0.0.1\r\nX-Forwarded-Proto: https\r\nExpect: 100-continue\r\n\
             Content-Length: 3\r\nVia: 1.0 edge\r\nX-Custom:  kept as is\r\n\r\n",
    )
    .unwrap();
    assert_eq!(
        out,
        "POST /a/b?q=1 HTTP/1.1\r\nHost: App.Example\r\nVia: 1.0 edge\r\nX-Custom: kept as is\r\n\
             x-forwarded-for: 10.0.0.1, 10.9.8.7\r\nx-forwarded-proto: http\r\nvia: 1.1 vigil\r\n"
    );
    assert_eq!(
        (host.as_deref(), path.as_str()),
        (Some("App.Example"), "/a/b")
    );
}

#[test]
fn absolute_form_becomes_origin_form_and_names_the_host() {
    let (out, host, path) = forward("GET http://h:1/p?q HTTP/1.1\r\nHost: h:1\r\n\r\n").unwrap();
    assert_eq!(
        out,
        "GET /p?q HTTP/1.1\r\nhost: h:1\r\nx-forwarded-for: 10.9.8.7\r\n\
             x-forwarded-proto: http\r\nvia: 1.1 vigil\r\n"
    );
    assert_eq!((host.as_deref(), path.as_str()), (Some("h:1"), "/p"));
    let (out, host, _) = forward("GET http://a/?x HTTP/1.1\r\nHost: b\r\n\r\n").unwrap();
    assert!(out.starts_with("GET /?x HTTP/1.1\r\nhost: a\r\n"), "{out}");
    assert!(
        !out.contains("Host: b"),
        "a conflicting Host is replaced: {out}"
    );
    assert_eq!(
        host.as_deref(),
        Some("a"),
        "the authority wins (RFC 9112 3.2.2)"
    );
    let (out, _, path) = forward("GET http://a?x HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    assert!(out.starts_with("GET /?x HTTP/1.1\r\n"), "{out}");
    assert_eq!(path, "/");
    let (out, _, _) =
        forward("GET / HTTP/1.1\r\nHost: h\r\nConnection: host, x-a\r\nx-a: 1\r\n\r\n").unwrap();
    assert!(
        out.contains("Host: h\r\n"),
        "Connection cannot name Host away: {out}"
    );
    assert!(!out.contains("x-a"), "{out}");
    let refused = |raw: &str| forward(raw).unwrap_err().0;
    assert_eq!(refused("CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n"), 405);
    assert_eq!(refused("GET a:443 HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    assert_eq!(
        refused("GET http://u:p@b:80/x HTTP/1.1\r\nHost: b\r\n\r\n"),
        400,
        "userinfo is never a host to route by"
    );
    assert_eq!(refused("GET http://@b/x HTTP/1.1\r\nHost: b\r\n\r\n"), 400);
}

#[test]
fn malformed_host_values_are_refused_and_valid_ones_kept() {
    for good in [
        "b",
        "b:80",
        "App.Example",
        "10.0.0.1:8080",
        "[::1]",
        "[::1]:8443",
        "[v1.x]",
        "b:",
        "",
        "xn--bcher-kva.example",
        "a%41b",
        "a_b~c!$&'()*+,;=",
    ] {
        assert!(valid_host(good.as_bytes()), "{good:?} is a valid Host");
    }
    for bad in [
        "a b",
        "b:80@evil",
        "u@b",
        "b:8a",
        "b:80:90",
        "[::1",
        "[]",
        "[::1]x",
        "a/b",
        "a%4",
        "a%zz",
        "a\\b",
        "a\"b",
        "a{b}",
    ] {
        assert!(!valid_host(bad.as_bytes()), "{bad:?} is not a Host");
    }
    let refused = |raw: &str| forward(raw).unwrap_err();
    assert_eq!(refused("GET / HTTP/1.1\r\nHost: a b\r\n\r\n").0, 400);
    assert_eq!(refused("GET / HTTP/1.1\r\nHost: b:80@evil\r\n\r\n").0, 400);
    assert_eq!(
        refused("GET http://b/ HTTP/1.1\r\nHost: b:80@evil\r\n\r\n").0,
        400,
        "the Host field is checked even when the authority replaces it"
    );
}

#[test]
fn a_clients_deadline_fields_are_read_and_never_forwarded() {
    let raw = "POST /svc/M HTTP/1.1\r\nHost: a\r\nX-Vigil-Deadline-Ms: 250\r\n\
                   content-type: application/grpc+proto\r\ngrpc-timeout: 2S\r\n\r\n";
    let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let (head, fields) = http1::parse_request(raw.as_bytes(), &mut fields)
        .unwrap()
        .unwrap();
    let f = forwarded_head(&head, fields, "10.9.8.7", Underscores::Drop).unwrap();
    let out = String::from_utf8(f.out_head.clone())
        .unwrap()
        .to_ascii_lowercase();
    assert!(!out.contains("x-vigil-deadline-ms"), "{out}");
    assert!(!out.contains("grpc-timeout"), "{out}");
    assert!(
        out.contains("content-type: application/grpc+proto\r\n"),
        "{out}"
    );
    assert!(f.grpc);
    let ms = Duration::from_millis;
    assert_eq!(f.deadline, Some(ms(250)));
    assert_eq!(f.grpc_timeout, Some(Duration::from_secs(2)));
    assert_eq!(f.client_deadline(ClientDeadline::Strip), None);
    assert_eq!(f.client_deadline(ClientDeadline::Trust), Some(ms(250)));

    // A malformed deadline is ignored, never guessed; a plain request is not gRPC.
    let raw = "GET / HTTP/1.1\r\nHost: a\r\nx-vigil-deadline-ms: -5\r\n\r\n";
    let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let (head, fields) = http1::parse_request(raw.as_bytes(), &mut fields)
        .unwrap()
        .unwrap();
    let f = forwarded_head(&head, fields, "10.9.8.7", Underscores::Drop).unwrap();
    assert!(!String::from_utf8_lossy(&f.out_head).contains("deadline"));
    assert!(!f.grpc);
    assert_eq!(f.client_deadline(ClientDeadline::Trust), None);
}

#[test]
fn underscored_field_names_are_dropped_forwarded_or_refused_as_configured() {
    let raw = "POST / HTTP/1.1\r\nHost: a\r\nContent_Length: 44\r\nX-A: 1\r\n\r\n";
    let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let (head, fields) = http1::parse_request(raw.as_bytes(), &mut fields)
        .unwrap()
        .unwrap();
    let f = forwarded_head(&head, fields, "10.9.8.7", Underscores::Drop).unwrap();
    let out = String::from_utf8(f.out_head).unwrap();
    assert!(!out.contains("Content_Length"), "{out}");
    assert!(out.contains("X-A: 1\r\n"), "{out}");
    assert_eq!(f.underscores_dropped, 1);
    let f = forwarded_head(&head, fields, "10.9.8.7", Underscores::Forward).unwrap();
    assert!(
        String::from_utf8(f.out_head)
            .unwrap()
            .contains("Content_Length: 44\r\n")
    );
    assert_eq!(f.underscores_dropped, 0);
    let e = forwarded_head(&head, fields, "10.9.8.7", Underscores::Reject).unwrap_err();
    assert_eq!(e.0, 400, "{e:?}");
}

#[test]
fn higher_minor_versions_of_http1_are_found_to_be_served_as_1_1() {
    assert_eq!(newer_minor(b"GET / HTTP/1.2\r\nHost: a\r\n\r\n"), Some(13));
    assert_eq!(
        newer_minor(b"GET / HTTP/1.9"),
        Some(13),
        "line not complete yet"
    );
    assert_eq!(newer_minor(b"GET / HTTP/1.2\n"), Some(13));
    for other in [
        &b"GET / HTTP/1.1\r\n"[..],
        b"GET / HTTP/2.0\r\n",
        b"GET / HTTP/1.10\r\n",
        b"GET / HTTP/1.x\r\n",
        b"PRI * HTTP/2.0\r\n",
        b"HTTP/1.2",
    ] {
        assert_eq!(
            newer_minor(other),
            None,
            "{:?}",
            String::from_utf8_lossy(other)
        );
    }
}

#[test]
fn a_head_end_is_looked_for_only_in_what_arrived_since() {
    let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    // Fed a byte at a time, the end is found exactly when the last byte arrives.
    let ends: Vec<usize> = (1..=head.len())
        .filter(|&n| may_end_head(&head[..n], n - 1))
        .collect();
    assert_eq!(ends, vec![head.len()]);
    assert!(
        may_end_head(b"GET / HTTP/1.0\n\n", 14),
        "bare line feeds too"
    );
    assert!(!may_end_head(b"GET / HTTP/1.1\r\nHost: a\r\n", 0));
    assert!(may_end_head(head, 0) && !may_end_head(head, head.len() + 5));
}

#[test]
fn chunked_output_frames_each_piece() {
    let mut out = Vec::new();
    put_data(&mut out, b"hello", true);
    put_data(&mut out, b"", true);
    put_data(&mut out, &[b'x'; 26], true);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        format!("5\r\nhello\r\n1a\r\n{}\r\n", "x".repeat(26))
    );
    let mut out = Vec::new();
    put_data(&mut out, b"raw", false);
    assert_eq!(out, b"raw");
}
