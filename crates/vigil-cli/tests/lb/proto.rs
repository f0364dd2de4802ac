//! Real-process tests of `vigil lb`'s protocols beyond plain HTTP/1.1: WebSocket (and
//! other HTTP/1.1 upgrades) through the real binary to real backends, driven by real
//! clients (tokio-tungstenite). Every wait polls a condition until a deadline.

use futures::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message;

use crate::lb_support;
use lb_support::{LbProcess, serve_each, take_head};

/// A WebSocket echo server (tokio-tungstenite's server side): every message comes back.
async fn ws_echo_backend() -> SocketAddr {
    serve_each(|tcp| async move {
        let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
            return;
        };
        while let Some(Ok(msg)) = ws.next().await {
            if msg.is_close() {
                break;
            }
            if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                break;
            }
        }
    })
    .await
}

/// A balancer in front of `target` (no active checks: the target speaks WebSocket only).
async fn lb_for(target: SocketAddr, top: &str) -> LbProcess {
    LbProcess::start(&format!(
        "{top}\n[pools.ws]\ntargets = [{{ addr = \"{target}\" }}]\n\
         [pools.ws.health_check]\nenabled = false\n"
    ))
    .await
}

/// The admin `/metrics` text.
async fn metrics(lb: &LbProcess) -> String {
    reqwest::get(format!("http://127.0.0.1:{}/metrics", lb.admin))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text")
}

/// The value of the sample `series` (name and labels exactly as exposed), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Polls `/metrics` until `cond` holds on it, or panics after `within`.
async fn wait_metrics(lb: &LbProcess, within: Duration, what: &str, cond: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + within;
    loop {
        let m = metrics(lb).await;
        if cond(&m) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\nmetrics:\n{m}\nlog:\n{}",
            lb.log()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws_connect(lb: &LbProcess, path: &str) -> Ws {
    let url = format!("ws://127.0.0.1:{}{path}", lb.port);
    let (ws, resp) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "WebSocket handshake through vigil lb: {e}\nlog:\n{}",
                lb.log()
            )
        });
    assert_eq!(resp.status().as_u16(), 101);
    assert_eq!(
        resp.headers().get("via").map(|v| v.as_bytes()),
        Some(&b"1.1 vigil"[..]),
        "the 101 went through vigil"
    );
    ws
}

/// Sends `msg` and expects it back within 10 s.
async fn echo(ws: &mut Ws, msg: Message) {
    ws.send(msg.clone()).await.expect("send");
    let back = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("an echo within 10 s")
        .expect("the stream is open")
        .expect("a message");
    assert_eq!(back, msg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_talks_to_an_echo_backend_through_the_balancer() {
    let backend = ws_echo_backend().await;
    let lb = lb_for(backend, "").await;
    let mut ws = ws_connect(&lb, "/chat?room=1").await;
    echo(&mut ws, Message::text("hello through vigil")).await;
    // Larger than a tunnel buffer (16 KiB) and than a socket's usual window.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    echo(&mut ws, Message::binary(big.clone())).await;
    for i in 0..50 {
        echo(&mut ws, Message::text(format!("message {i}"))).await;
    }
    let m = metrics(&lb).await;
    assert_eq!(
        sample(&m, "vigil_lb_tunnels_total{pool=\"ws\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "vigil_lb_tunnels_open{pool=\"ws\"}"),
        Some(1.0),
        "{m}"
    );
    for direction in ["to_target", "to_client"] {
        let bytes = sample(
            &m,
            &format!("vigil_lb_tunnel_bytes_total{{pool=\"ws\",direction=\"{direction}\"}}"),
        )
        .unwrap_or(0.0);
        assert!(bytes > big.len() as f64, "{direction}: {bytes} bytes\n{m}");
    }
    // A second one at the same time on another connection.
    let mut other = ws_connect(&lb, "/").await;
    echo(&mut other, Message::text("second")).await;
    ws.close(None).await.expect("close handshake");
    while let Some(Ok(_)) = ws.next().await {}
    drop(ws);
    other.close(None).await.expect("close handshake");
    while let Some(Ok(_)) = other.next().await {}
    drop(other);
    wait_metrics(&lb, Duration::from_secs(10), "both tunnels closed", |m| {
        sample(m, "vigil_lb_tunnels_open{pool=\"ws\"}") == Some(0.0)
            && sample(
                m,
                "vigil_lb_tunnels_closed_total{pool=\"ws\",reason=\"closed\"}",
            ) == Some(2.0)
    })
    .await;
}

/// What a plain HTTP backend saw: each request head, as text.
async fn recording_backend(answer: &'static str) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let addr = serve_each(move |mut tcp| {
        let seen = s.clone();
        async move {
            let mut buf = Vec::new();
            while let Some(head) = take_head(&mut tcp, &mut buf).await {
                seen.lock().unwrap().push(head);
                if tcp.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (addr, seen)
}

#[tokio::test]
async fn an_upgrade_the_target_declines_stays_http_and_only_valid_upgrades_are_forwarded() {
    let (backend, seen) = recording_backend("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
    let lb = lb_for(backend, "").await;
    let mut c = tokio::net::TcpStream::connect(("127.0.0.1", lb.port))
        .await
        .unwrap();
    let mut buf = Vec::new();
    let ws_head = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: \
                   dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
    // 1. A valid upgrade the target answers with 200: an ordinary answer, and the
    //    connection goes on as HTTP.
    // 2. The same as a POST with a body: not an upgrade (the body would be taken for
    //    the new protocol's bytes by one reader and not by another).
    // 3. h2c: never forwarded (h2c smuggling), a plain request.
    // 4. A plain request after them on the same connection.
    let requests = [
        format!("GET /a HTTP/1.1\r\nHost: x\r\n{ws_head}\r\n"),
        format!("POST /b HTTP/1.1\r\nHost: x\r\n{ws_head}Content-Length: 2\r\n\r\nhi"),
        "GET /c HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n\
         HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
            .to_string(),
        "GET /d HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
    ];
    for r in &requests {
        c.write_all(r.as_bytes()).await.unwrap();
        let head = tokio::time::timeout(Duration::from_secs(10), take_head(&mut c, &mut buf))
            .await
            .expect("an answer")
            .expect("the connection stays open");
        assert!(head.starts_with("HTTP/1.1 200"), "{r}: {head}");
        assert!(
            !head.to_ascii_lowercase().contains("upgrade"),
            "no upgrade in the answer: {head}"
        );
        lb_support::take_exact(&mut c, &mut buf, 2).await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    let lower: Vec<String> = seen.iter().map(|h| h.to_ascii_lowercase()).collect();
    assert!(
        lower[0].contains("\r\nupgrade: websocket\r\n") && lower[0].contains("connection: upgrade"),
        "a valid upgrade is forwarded with its Upgrade: {}",
        seen[0]
    );
    assert!(
        lower[0].contains("sec-websocket-key: dghlihnhbxbszsbub25jzq=="),
        "{}",
        seen[0]
    );
    for (i, h) in lower.iter().enumerate().skip(1) {
        assert!(
            !h.contains("upgrade") && !h.contains("http2-settings"),
            "request {i} must go as a plain request: {h}"
        );
    }
    let m = metrics(&lb).await;
    assert_eq!(
        sample(&m, "vigil_lb_tunnels_total{pool=\"ws\"}"),
        None,
        "{m}"
    );
}

#[tokio::test]
async fn a_101_to_a_request_that_asked_for_no_upgrade_is_a_502() {
    let (backend, _) = recording_backend(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
    )
    .await;
    let lb = lb_for(backend, "").await;
    let resp = reqwest::get(format!("http://127.0.0.1:{}/", lb.port))
        .await
        .expect("an answer");
    assert_eq!(resp.status().as_u16(), 502);
}

#[tokio::test]
async fn a_quiet_tunnel_is_closed_after_tunnel_idle() {
    let backend = ws_echo_backend().await;
    let lb = lb_for(backend, "[timeouts]\ntunnel_idle = \"300ms\"").await;
    let mut ws = ws_connect(&lb, "/").await;
    // Traffic keeps it open past the idle time.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        echo(&mut ws, Message::text("ping")).await;
    }
    let quiet = Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("the tunnel closes within 10 s");
    assert!(
        !matches!(end, Some(Ok(Message::Text(_) | Message::Binary(_)))),
        "{end:?}"
    );
    let waited = quiet.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "closed after {waited:?}, before the idle time"
    );
    wait_metrics(&lb, Duration::from_secs(10), "an idle close counted", |m| {
        sample(
            m,
            "vigil_lb_tunnels_closed_total{pool=\"ws\",reason=\"idle\"}",
        ) == Some(1.0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_tunnels_open_until_the_drain_timeout_then_closes_them_and_exits_0() {
    let backend = ws_echo_backend().await;
    let mut lb = lb_for(backend, "drain_timeout = \"2s\"").await;
    let mut ws = ws_connect(&lb, "/").await;
    echo(&mut ws, Message::text("before")).await;
    lb.signal("TERM");
    let term = Instant::now();
    // Draining: no new connection is taken, but the tunnel works on.
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", lb.port))
        .await
        .is_ok()
    {
        assert!(Instant::now() < deadline, "still listening after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    echo(&mut ws, Message::text("during the drain")).await;
    assert!(
        term.elapsed() < Duration::from_secs(2),
        "the echo came in the drain time"
    );
    let end = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("the tunnel is closed after the drain time");
    assert!(
        !matches!(end, Some(Ok(Message::Text(_) | Message::Binary(_)))),
        "{end:?}"
    );
    let closed = term.elapsed();
    assert!(
        closed >= Duration::from_millis(1900),
        "closed {closed:?} after SIGTERM, before the 2 s drain timeout"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = lb.child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "vigil lb did not exit\n{}",
            lb.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(0), "{}", lb.log());
    assert!(
        lb.log().contains("tunnels still open; closing"),
        "the log says why it closed: {}",
        lb.log()
    );
}

// === TLS termination ===

/// A test CA (rcgen) and the leaf certificates it signs, as PEM files in a directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "vigil test CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertifiedIssuer::self_signed(params, key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca }
    }

    fn path(&self, file: &str) -> std::path::PathBuf {
        self.dir.path().join(file)
    }

    /// Writes a fresh key and a certificate for `names` (CN the first) as
    /// `{stem}.pem` and `{stem}.key`; returns the certificate's DER.
    fn leaf(&self, stem: &str, names: &[&str]) -> Vec<u8> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, names[0].as_str());
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        std::fs::write(self.path(&format!("{stem}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{stem}.key")), key.serialize_pem()).unwrap();
        cert.der().to_vec()
    }

    /// A TLS client trusting this CA, offering `alpn`.
    fn client(&self, alpn: &[&str]) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

type TlsClient = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// A TLS connection to 127.0.0.1:`port` asking for `sni`; the certificate it got.
async fn tls_connect(pki: &Pki, port: u16, sni: &str, alpn: &[&str]) -> (TlsClient, Vec<u8>) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the TLS listener");
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap();
    let tls = tokio::time::timeout(Duration::from_secs(10), pki.client(alpn).connect(name, tcp))
        .await
        .expect("handshake within 10 s")
        .unwrap_or_else(|e| panic!("TLS handshake for {sni}: {e}"));
    let cert = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    (tls, cert)
}

/// One GET of `path` on an open HTTP/1.1 connection: status line and body.
async fn get_on<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    c: &mut S,
    path: &str,
) -> (String, Vec<u8>) {
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: a.test\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    let head = tokio::time::timeout(Duration::from_secs(10), take_head(c, &mut buf))
        .await
        .expect("an answer within 10 s")
        .expect("a response head");
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .expect("a content-length");
    let body = lb_support::take_exact(c, &mut buf, len).await.unwrap();
    (head.lines().next().unwrap().to_string(), body)
}

/// `curl` with `args`: (exit code, stdout, stderr).
async fn curl(args: &[String]) -> (i32, String, String) {
    let out = tokio::process::Command::new("curl")
        .args(["-s", "--max-time", "10"])
        .args(args)
        .output()
        .await
        .expect("curl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn wait_log(lb: &LbProcess, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lb.log().contains(what) {
        assert!(
            Instant::now() < deadline,
            "no {what:?} in the log:\n{}",
            lb.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn tls_listener_toml(pki: &Pki, port: u16, alpn: &str) -> String {
    format!(
        "[tls_listeners.public]\nlisten = \"127.0.0.1:{port}\"\n{alpn}\n\
         [[tls_listeners.public.certificates]]\ncert = \"{a}.pem\"\nkey = \"{a}.key\"\nserver_names = [\"a.test\"]\n\
         [[tls_listeners.public.certificates]]\ncert = \"{b}.pem\"\nkey = \"{b}.key\"\nserver_names = [\"b.test\", \"*.b.test\"]\n",
        a = pki.path("a").display(),
        b = pki.path("b").display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_sni_selection_and_certificates_reloaded_on_sighup_keeping_connections() {
    let pki = Pki::new();
    let cert_a = pki.leaf("a", &["a.test"]);
    let cert_b = pki.leaf("b", &["b.test", "*.b.test"]);
    let (backend, seen) = recording_backend("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
    let tls_port = lb_support::free_port();
    let lb = LbProcess::start(&format!(
        "{}\n[pools.web]\ntargets = [{{ addr = \"{backend}\" }}]\n[pools.web.health_check]\nenabled = false\n",
        tls_listener_toml(&pki, tls_port, "")
    ))
    .await;

    // curl, verifying the chain against the test CA and the name: a.test and b.test
    // each get their own certificate.
    let ca = pki.path("ca.pem").display().to_string();
    for (name, path) in [
        ("a.test", "/one"),
        ("b.test", "/two"),
        ("x.b.test", "/three"),
    ] {
        let (code, out, err) = curl(&[
            "--cacert".into(),
            ca.clone(),
            "--resolve".into(),
            format!("{name}:{tls_port}:127.0.0.1"),
            "-w".into(),
            " %{http_code} %{http_version}".into(),
            format!("https://{name}:{tls_port}{path}"),
        ])
        .await;
        assert_eq!(
            (code, out.as_str()),
            // HTTP/2: ALPN offers h2 first, and curl takes it.
            (0, "ok 200 2"),
            "{name}: {err}\n{}",
            lb.log()
        );
    }
    // No SNI (an IP address) or a name no certificate lists: the first certificate.
    for url in [
        format!("https://127.0.0.1:{tls_port}/"),
        format!("https://c.test:{tls_port}/"),
    ] {
        let (code, out, err) = curl(&[
            "-vk".into(),
            "--resolve".into(),
            format!("c.test:{tls_port}:127.0.0.1"),
            url.clone(),
        ])
        .await;
        assert_eq!((code, out.as_str()), (0, "ok"), "{url}: {err}");
        assert!(
            err.contains("CN=a.test"),
            "{url}: the default certificate: {err}"
        );
    }
    // The target hears it came over TLS.
    let heads = seen.lock().unwrap().clone();
    assert!(
        heads.iter().all(|h| h
            .to_ascii_lowercase()
            .contains("x-forwarded-proto: https\r\n")),
        "{heads:?}"
    );

    // A keep-alive connection opened before the reload.
    let (mut kept, got) = tls_connect(&pki, tls_port, "a.test", &["http/1.1"]).await;
    assert_eq!(got, cert_a);
    assert_eq!(get_on(&mut kept, "/before").await.1, b"ok");
    let (_, got) = tls_connect(&pki, tls_port, "b.test", &["http/1.1"]).await;
    assert_eq!(got, cert_b, "SNI b.test picks b's certificate");

    // New certificates for a.test: SIGHUP; new handshakes get them, the open
    // connection goes on.
    let new_a = pki.leaf("a", &["a.test"]);
    assert_ne!(new_a, cert_a);
    lb.signal("HUP");
    wait_log(&lb, "configuration reloaded").await;
    let (_, got) = tls_connect(&pki, tls_port, "a.test", &["http/1.1"]).await;
    assert_eq!(
        got, new_a,
        "a handshake after the reload gets the new certificate"
    );
    let (status, body) = get_on(&mut kept, "/after").await;
    assert_eq!(
        (status.as_str(), body.as_slice()),
        ("HTTP/1.1 200 OK", &b"ok"[..])
    );

    // A broken key: the reload is rejected, the running certificates stay.
    std::fs::write(pki.path("a.key"), "-----BEGIN PRIVATE KEY-----\nnope\n").unwrap();
    lb.signal("HUP");
    wait_log(&lb, "reload rejected").await;
    assert!(
        lb.log()
            .contains("tls_listeners.public.certificates[0].key"),
        "{}",
        lb.log()
    );
    let (_, got) = tls_connect(&pki, tls_port, "a.test", &["http/1.1"]).await;
    assert_eq!(got, new_a);
    assert_eq!(get_on(&mut kept, "/still").await.1, b"ok");
    let m = metrics(&lb).await;
    assert!(
        sample(&m, "vigil_lb_tls_handshakes_total{result=\"ok\"}").unwrap_or(0.0) >= 8.0,
        "{m}"
    );
}

/// Writes `text` to `config` and runs `vigil lb check-config` on it: (exit code, stderr).
fn check_config(config: &std::path::Path, text: &str) -> (Option<i32>, String) {
    std::fs::write(config, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["lb", "check-config", "-c"])
        .arg(config)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_reads_the_certificates_and_names_the_bad_key() {
    let pki = Pki::new();
    pki.leaf("a", &["a.test"]);
    pki.leaf("b", &["b.test"]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lb.toml");
    let text = format!(
        "{}\n[pools.web]\ntargets = [{{ addr = \"127.0.0.1:1\" }}]\n",
        tls_listener_toml(&pki, 1, "")
    );
    let check = || check_config(&config, &text);
    let (code, err) = check();
    assert_eq!(code, Some(0), "{err}");
    std::fs::remove_file(pki.path("b.key")).unwrap();
    let (code, err) = check();
    assert_eq!(code, Some(78));
    assert!(
        err.contains("key `tls_listeners.public.certificates[1].key`") && err.contains("b.key"),
        "{err}"
    );
    // A key that is not the certificate's.
    pki.leaf("c", &["c.test"]);
    std::fs::copy(pki.path("c.key"), pki.path("b.key")).unwrap();
    let (code, err) = check();
    assert_eq!(code, Some(78));
    assert!(err.contains("certificates[1].key"), "{err}");
}

// === HTTP/2 and gRPC ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_speaks_http2_in_cleartext_and_over_tls_to_an_http1_target() {
    let pki = Pki::new();
    pki.leaf("a", &["a.test"]);
    pki.leaf("b", &["b.test"]);
    let (backend, seen) =
        recording_backend("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-from: target\r\n\r\nok").await;
    let tls_port = lb_support::free_port();
    let lb = LbProcess::start(&format!(
        "{}\n[pools.web]\ntargets = [{{ addr = \"{backend}\" }}]\n[pools.web.health_check]\nenabled = false\n",
        tls_listener_toml(&pki, tls_port, "")
    ))
    .await;
    let ca = pki.path("ca.pem").display().to_string();
    let fmt = "-w".to_string();
    let what = " %{http_code} %{http_version}".to_string();
    // Cleartext with prior knowledge (h2c). One URL per curl: curl 7.88 fails its
    // second transfer on a reused prior-knowledge connection ("Error in the HTTP2
    // framing layer") before sending anything; several streams on one connection are
    // the gRPC test's (tonic reuses its connection).
    for path in ["/h2c/1", "/h2c/2"] {
        let (code, out, err) = curl(&[
            "--http2-prior-knowledge".into(),
            fmt.clone(),
            what.clone(),
            format!("http://127.0.0.1:{}{path}", lb.port),
        ])
        .await;
        assert_eq!((code, out.as_str()), (0, "ok 200 2"), "{err}\n{}", lb.log());
    }
    // Over TLS, HTTP/2 chosen by ALPN; a POST with a body too.
    let (code, out, err) = curl(&[
        "--http2".into(),
        "--cacert".into(),
        ca.clone(),
        "--resolve".into(),
        format!("a.test:{tls_port}:127.0.0.1"),
        "-D".into(),
        "-".into(),
        "--data-binary".into(),
        "hello".into(),
        fmt.clone(),
        what.clone(),
        format!("https://a.test:{tls_port}/tls/post"),
    ])
    .await;
    assert_eq!(code, 0, "{err}\n{}", lb.log());
    assert!(out.starts_with("HTTP/2 200"), "{out}");
    assert!(
        out.contains("x-from: target") && out.contains("via: 1.1 vigil"),
        "{out}"
    );
    assert!(out.ends_with("ok 200 2"), "{out}");
    // An HTTP/1.1 client on the same TLS listener still gets HTTP/1.1.
    let (code, out, _) = curl(&[
        "--http1.1".into(),
        "--cacert".into(),
        ca.clone(),
        "--resolve".into(),
        format!("a.test:{tls_port}:127.0.0.1"),
        fmt.clone(),
        what.clone(),
        format!("https://a.test:{tls_port}/tls/h1"),
    ])
    .await;
    assert_eq!((code, out.as_str()), (0, "ok 200 1.1"));
    let heads = seen.lock().unwrap().clone();
    assert_eq!(heads.len(), 4, "{heads:?}");
    let lower: Vec<String> = heads.iter().map(|h| h.to_ascii_lowercase()).collect();
    assert!(
        lower[0].starts_with("get /h2c/1 http/1.1\r\n"),
        "{}",
        heads[0]
    );
    assert!(
        lower[0].contains("x-forwarded-proto: http\r\n"),
        "{}",
        heads[0]
    );
    assert!(
        lower[2].starts_with("post /tls/post http/1.1\r\n")
            && lower[2].contains("host: a.test:")
            && lower[2].contains("content-length: 5\r\n")
            && lower[2].contains("x-forwarded-proto: https\r\n"),
        "{}",
        heads[2]
    );
}

/// A gRPC server with the standard health service (tonic-health); its reporter.
async fn grpc_backend() -> (SocketAddr, tonic_health::server::HealthReporter) {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("vigil.Test", tonic_health::ServingStatus::Serving)
        .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
    });
    (addr, reporter)
}

/// A tonic health client to the balancer's plain listener (HTTP/2, prior knowledge).
async fn health_client(
    lb: &LbProcess,
) -> tonic_health::pb::health_client::HealthClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", lb.port))
        .unwrap()
        .connect()
        .await
        .expect("connect to vigil lb");
    tonic_health::pb::health_client::HealthClient::new(channel)
}

/// An error is a trailers-only answer: its grpc-status (5, NOT_FOUND) must arrive.
async fn unknown_service_is_not_found(
    client: &mut tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>,
) {
    let e = client
        .check(tonic_health::pb::HealthCheckRequest {
            service: "no.Such".into(),
        })
        .await
        .expect_err("an unknown service");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
}

async fn admin_state(lb: &LbProcess, pool: &str) -> (String, String) {
    let v: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{}/admin/targets", lb.admin))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let t = &v["pools"][pool]["targets"][0];
    (
        t["state"].as_str().unwrap_or_default().to_string(),
        t.to_string(),
    )
}

async fn wait_state(lb: &LbProcess, pool: &str, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (state, all) = admin_state(lb, pool).await;
        if state == want {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "target never {want}: {all}\nlog:\n{}",
            lb.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_client_calls_a_grpc_target_through_the_balancer_judged_by_grpc_checks() {
    use tonic_health::pb::HealthCheckRequest;
    let (backend, reporter) = grpc_backend().await;
    let lb = LbProcess::start(&format!(
        "[pools.grpc]\nprotocol = \"h2\"\nslow_start_window = \"0s\"\n\
         targets = [{{ addr = \"{backend}\" }}]\n\
         [pools.grpc.health_check]\ntype = \"grpc\"\ninterval = \"100ms\"\ntimeout = \"1s\"\n\
         healthy_threshold = 1\nunhealthy_threshold = 2\n"
    ))
    .await;
    let detail = wait_state(&lb, "grpc", "healthy").await;
    assert!(detail.contains("gRPC SERVING"), "{detail}");

    // tonic's client, HTTP/2 with prior knowledge to the balancer's plain listener.
    let mut client = health_client(&lb).await;
    // Unary, answered with data and trailers (grpc-status 0).
    for service in ["", "vigil.Test"] {
        let status = client
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|s| panic!("Check({service:?}) through vigil: {s}\n{}", lb.log()))
            .into_inner()
            .status;
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
    }
    // An error is a trailers-only answer: its grpc-status arrives.
    unknown_service_is_not_found(&mut client).await;

    // Server streaming (Watch): the first status, then a change, through the balancer.
    let mut watch = client
        .watch(HealthCheckRequest {
            service: "vigil.Test".into(),
        })
        .await
        .expect("Watch through vigil")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("a first status")
        .expect("a message")
        .expect("not the end");
    assert_eq!(first.status, 1, "SERVING");
    reporter
        .set_service_status("vigil.Test", tonic_health::ServingStatus::NotServing)
        .await;
    let next = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("the change streamed")
        .expect("a message")
        .expect("not the end");
    assert_eq!(next.status, 2, "NOT_SERVING");

    // The active gRPC check feeds the pool policy: NOT_SERVING for the whole server
    // takes the target out, SERVING brings it back.
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let detail = wait_state(&lb, "grpc", "unhealthy").await;
    assert!(detail.contains("gRPC NOT_SERVING"), "{detail}");
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    wait_state(&lb, "grpc", "healthy").await;
    let m = metrics(&lb).await;
    let target =
        format!("vigil_lb_requests_total{{pool=\"grpc\",target=\"{backend}\",code=\"200\"}}");
    assert!(sample(&m, &target).unwrap_or(0.0) >= 4.0, "{m}");
}

#[tokio::test]
async fn a_grpc_check_of_a_service_the_server_does_not_know_fails() {
    let (backend, _reporter) = grpc_backend().await;
    let lb = LbProcess::start(&format!(
        "[pools.grpc]\nprotocol = \"h2\"\ntargets = [{{ addr = \"{backend}\" }}]\n\
         [pools.grpc.health_check]\ntype = \"grpc\"\ngrpc_service = \"no.Such\"\n\
         interval = \"100ms\"\nhealthy_threshold = 1\nunhealthy_threshold = 1\n"
    ))
    .await;
    let detail = wait_state(&lb, "grpc", "unhealthy").await;
    assert!(detail.contains("grpc-status 5"), "NOT_FOUND: {detail}");
}

// === TLS to targets ===

/// HAProxy as a foreign TLS target (OpenSSL, not rustls): one frontend that takes any
/// client and one that requires a client certificate from the test CA; each answers
/// every request itself with what it saw of the TLS session and the request.
struct TlsTarget {
    child: std::process::Child,
    _log: std::path::PathBuf,
    /// Any client.
    open: u16,
    /// Clients with a certificate from the test CA only.
    mutual: u16,
}

impl TlsTarget {
    async fn start(pki: &Pki) -> TlsTarget {
        pki.leaf("target", &["target.test", "127.0.0.1"]);
        let crt = pki.path("target.crt.pem");
        let pem = std::fs::read_to_string(pki.path("target.pem")).unwrap()
            + &std::fs::read_to_string(pki.path("target.key")).unwrap();
        std::fs::write(&crt, pem).unwrap();
        let (open, mutual) = (lb_support::free_port(), lb_support::free_port());
        let answer = "http-request return status 200 content-type text/plain lf-string \
            \"sni=%[ssl_fc_sni] alpn=%[ssl_fc_alpn] client=%[ssl_c_s_dn(cn)] host=%[req.hdr(host)] \
            path=%[path] body=%[req.body_size]\\n\"";
        let cfg = format!(
            "global\n  nbthread 1\ndefaults\n  mode http\n  timeout client 10s\n  timeout connect 2s\n  timeout server 10s\n\
             frontend open\n  bind 127.0.0.1:{open} ssl crt {crt} alpn h2,http/1.1\n  option http-buffer-request\n  {answer}\n\
             frontend mutual\n  bind 127.0.0.1:{mutual} ssl crt {crt} ca-file {ca} verify required alpn http/1.1\n  {answer}\n",
            crt = crt.display(),
            ca = pki.path("ca.pem").display(),
        );
        let file = pki.path("haproxy.cfg");
        std::fs::write(&file, cfg).unwrap();
        let log = pki.path("haproxy.log");
        let child = std::process::Command::new("haproxy")
            .args(["-db", "-f"])
            .arg(&file)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("haproxy runs (scripts/install-test-deps.sh installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        for port in [open, mutual] {
            while tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                assert!(
                    Instant::now() < deadline,
                    "haproxy did not listen: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        TlsTarget {
            child,
            _log: log,
            open,
            mutual,
        }
    }
}

impl Drop for TlsTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 request through the balancer: (status, body).
async fn through(lb: &LbProcess, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let resp = reqwest::Client::new()
        .request(
            method.parse().unwrap(),
            format!("http://127.0.0.1:{}{path}", lb.port),
        )
        .header("host", "app.test")
        .body(body.to_vec())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("an answer from the balancer");
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_over_tls_are_verified_named_and_shown_a_client_certificate() {
    let pki = Pki::new();
    pki.leaf("client", &["vigil-client"]);
    let target = TlsTarget::start(&pki).await;
    let ca = pki.path("ca.pem");
    let pool = |name: &str, port: u16, tls: &str| {
        format!(
            "[pools.{name}]\nslow_start_window = \"0s\"\ntargets = [{{ addr = \"127.0.0.1:{port}\" }}]\n\
             [pools.{name}.tls]\nca = \"{ca}\"\n{tls}\n\
             [pools.{name}.health_check]\npath = \"/readyz\"\ninterval = \"100ms\"\ntimeout = \"2s\"\nhealthy_threshold = 1\nunhealthy_threshold = 1\n\
             [[routes]]\npath_prefix = \"/{name}/\"\npool = \"{name}\"\n",
            ca = ca.display(),
        )
    };
    let client = format!(
        "cert = \"{}\"\nkey = \"{}\"",
        pki.path("client.pem").display(),
        pki.path("client.key").display()
    );
    let lb = LbProcess::start(
        &[
            // Verified as its address: the certificate has 127.0.0.1 among its names.
            pool("ip", target.open, ""),
            pool("named", target.open, "server_name = \"target.test\""),
            // A name the certificate does not have: never trusted.
            pool("wrong", target.open, "server_name = \"other.test\""),
            pool("mutual", target.mutual, &client),
            // The target asks for a client certificate this pool has not got.
            pool("nocert", target.mutual, ""),
            // HTTP/2 to the target over TLS (ALPN h2), as a gRPC pool would.
            pool("h2", target.open, "").replacen(
                "[pools.h2]\n",
                "[pools.h2]\nprotocol = \"h2\"\n",
                1,
            ),
        ]
        .concat(),
    )
    .await;

    for name in ["ip", "named", "mutual", "h2"] {
        let detail = wait_state(&lb, name, "healthy").await;
        assert!(
            detail.contains("HTTP 200"),
            "{name}: the check over TLS passed: {detail}"
        );
    }
    // Why, in the check's detail: the balancer refused the target's certificate...
    let detail = wait_state(&lb, "wrong", "unhealthy").await;
    assert!(
        detail.contains(
            "connect failed: TLS handshake: invalid peer certificate: certificate not valid for name"
        ) && detail.contains("other.test"),
        "{detail}"
    );
    // ... or the target refused the balancer (TLS 1.3: after the client's side of the
    // handshake, on the first read).
    let detail = wait_state(&lb, "nocert", "unhealthy").await;
    assert!(detail.contains("CertificateRequired"), "{detail}");

    // Requests: the target saw TLS with ALPN http/1.1, the name asked for, the Host
    // of the client, and the body whole.
    let (status, body) = through(&lb, "GET", "/ip/x", b"").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("alpn=http/1.1") && body.contains("host=app.test"),
        "{body}"
    );
    assert!(
        body.starts_with("sni= "),
        "no SNI for an IP address (RFC 6066): {body}"
    );
    let (status, body) = through(&lb, "POST", "/named/y", &[b'x'; 12_000]).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("sni=target.test") && body.contains("path=/named/y"),
        "{body}"
    );
    assert!(body.contains("body=12000"), "the body went whole: {body}");
    let (status, body) = through(&lb, "GET", "/mutual/z", b"").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("client=vigil-client"),
        "the client certificate was shown: {body}"
    );
    let (status, body) = through(&lb, "POST", "/h2/w", b"over h2").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("alpn=h2") && body.contains("host=app.test"),
        "{body}"
    );
    // Kept-alive TLS connections are reused: many requests, all answered.
    for i in 0..50 {
        let (status, body) = through(&lb, "GET", &format!("/named/{i}"), b"").await;
        assert_eq!(status, 200, "request {i}: {body}");
    }
    // An upload larger than the retry buffer is streamed to the TLS target.
    let (status, body) = through(&lb, "POST", "/named/upload", &vec![b'u'; 3 << 20]).await;
    assert_eq!(status, 200, "{body}");
    for name in ["wrong", "nocert"] {
        let (status, body) = through(&lb, "GET", &format!("/{name}/"), b"").await;
        assert_eq!(
            status, 502,
            "{name}: a target that fails the handshake gets nothing: {body}"
        );
    }

    // A reload re-reads the pools' TLS: `wrong` is given the certificate's name and
    // comes into service...
    let text = std::fs::read_to_string(&lb.config).unwrap();
    std::fs::write(
        &lb.config,
        text.replace(
            "server_name = \"other.test\"",
            "server_name = \"target.test\"",
        ),
    )
    .unwrap();
    lb.signal("HUP");
    wait_log(&lb, "configuration reloaded").await;
    wait_state(&lb, "wrong", "healthy").await;
    let (status, body) = through(&lb, "GET", "/wrong/again", b"").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("sni=target.test"), "{body}");
    // ... and a CA file that cannot be read rejects a reload: the running TLS stays.
    std::fs::write(pki.path("broken.pem"), "not a certificate").unwrap();
    let text = std::fs::read_to_string(&lb.config).unwrap();
    std::fs::write(
        &lb.config,
        text.replacen(
            &format!("ca = \"{}\"", ca.display()),
            &format!("ca = \"{}\"", pki.path("broken.pem").display()),
            1,
        ),
    )
    .unwrap();
    lb.signal("HUP");
    wait_log(&lb, "reload rejected").await;
    assert!(
        lb.log().contains("pools.ip.tls.ca") && lb.log().contains("broken.pem"),
        "the rejection names the key and the file: {}",
        lb.log()
    );
    let (status, body) = through(&lb, "GET", "/ip/still", b"").await;
    assert_eq!(status, 200, "{body}");
}

#[test]
fn check_config_reads_the_targets_ca_and_client_certificate() {
    let pki = Pki::new();
    pki.leaf("client", &["vigil-client"]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lb.toml");
    let check = |tls: &str| {
        check_config(
            &config,
            &format!(
                "[pools.web]\ntargets = [{{ addr = \"127.0.0.1:1\" }}]\n[pools.web.tls]\n{tls}\n"
            ),
        )
    };
    let ca = pki.path("ca.pem").display().to_string();
    let (cert, key) = (
        pki.path("client.pem").display().to_string(),
        pki.path("client.key").display().to_string(),
    );
    let (code, err) = check(&format!(
        "ca = \"{ca}\"\ncert = \"{cert}\"\nkey = \"{key}\""
    ));
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = check("ca = \"missing.pem\"");
    assert_eq!(code, Some(78));
    assert!(
        err.contains("key `pools.web.tls.ca`") && err.contains("missing.pem"),
        "{err}"
    );
    let (code, err) = check(&format!("ca = \"{ca}\"\ncert = \"{cert}\""));
    assert_eq!(code, Some(78));
    assert!(
        err.contains("pools.web.tls.key") && err.contains("both `cert` and `key`"),
        "{err}"
    );
    // A key that is not the certificate's.
    pki.leaf("other", &["other.test"]);
    let other = pki.path("other.key").display().to_string();
    let (code, err) = check(&format!(
        "ca = \"{ca}\"\ncert = \"{cert}\"\nkey = \"{other}\""
    ));
    assert_eq!(code, Some(78));
    assert!(
        err.contains("pools.web.tls.key") && err.contains("other.key"),
        "{err}"
    );
    let (code, err) = check("server_name = \"not a name\"");
    assert_eq!(code, Some(78));
    assert!(err.contains("pools.web.tls.server_name"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_target_over_tls_is_proxied_to_and_judged_by_grpc_checks_over_tls() {
    use tonic_health::pb::HealthCheckRequest;
    // tonic's TLS server takes the process's default provider.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let pki = Pki::new();
    pki.leaf("grpc", &["grpc.test", "127.0.0.1"]);
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let identity = tonic::transport::Identity::from_pem(
        std::fs::read(pki.path("grpc.pem")).unwrap(),
        std::fs::read(pki.path("grpc.key")).unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
        .unwrap()
        .add_service(service)
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(server);
    let lb = LbProcess::start(&format!(
        "[pools.grpc]\nprotocol = \"h2\"\nslow_start_window = \"0s\"\n\
         targets = [{{ addr = \"{backend}\" }}]\n\
         [pools.grpc.tls]\nca = \"{}\"\n\
         [pools.grpc.health_check]\ntype = \"grpc\"\ninterval = \"100ms\"\ntimeout = \"1s\"\n\
         healthy_threshold = 1\nunhealthy_threshold = 2\n",
        pki.path("ca.pem").display()
    ))
    .await;
    let detail = wait_state(&lb, "grpc", "healthy").await;
    assert!(
        detail.contains("gRPC SERVING"),
        "the check over TLS: {detail}"
    );

    // A gRPC client in cleartext to the balancer, the balancer in TLS to the target.
    let mut client = health_client(&lb).await;
    let answer = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("Check through the balancer");
    assert_eq!(answer.into_inner().status, 1, "SERVING");
    // A trailers-only error answer comes back as such over TLS too.
    unknown_service_is_not_found(&mut client).await;

    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let detail = wait_state(&lb, "grpc", "unhealthy").await;
    assert!(detail.contains("gRPC NOT_SERVING"), "{detail}");
}
