//! https probes against real rustls servers on loopback, with certificates from a test
//! CA (rcgen): trusted through a CA file, refused without it, refused for the wrong
//! name, handshakes that time out, servers that do not speak TLS, pooled TLS
//! connections.

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use vigil_core::Status;
use vigil_core::judge::Answers;
use vigil_probe::{CaFile, Client, ErrorKind, Limits, Options};

const PASS: &str = r#"{"status":"pass","checks":{"disk:free":[{"status":"pass"}]}}"#;

/// A test CA and its PEM file.
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
            .push(rcgen::DnType::CommonName, "vigil-probe test CA");
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca }
    }

    fn ca_file(&self) -> CaFile {
        CaFile::read(&self.dir.path().join("ca.pem")).expect("the test CA file reads")
    }

    /// A server configuration with a certificate for `names`, signed by this CA.
    fn server(&self, names: &[&str]) -> Arc<rustls::ServerConfig> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = rcgen::CertificateParams::new(names).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        Arc::new(config)
    }
}

/// An https server answering every GET with `answer`, `per_conn` answers per
/// connection (then it closes it, with a close_notify); counts connections.
async fn serve(
    config: Arc<rustls::ServerConfig>,
    answer: String,
    per_conn: usize,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let counted = conns.clone();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let (acceptor, answer) = (acceptor.clone(), answer.clone());
            tokio::spawn(async move {
                // A refused handshake is what some tests are about: nothing to serve.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                for _ in 0..per_conn {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
                    buf.drain(..end + 4);
                    if tls.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, conns)
}

fn health(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/health+json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn client(ca: Option<CaFile>, reuse_connection: bool) -> Client {
    Client::new(Options {
        reuse_connection,
        ca,
        ..Options::default()
    })
}

fn url(addr: SocketAddr) -> http::Uri {
    format!("https://{addr}/health").parse().unwrap()
}

fn limits(timeout: Duration) -> Limits {
    Limits {
        timeout,
        ..Limits::default()
    }
}

#[tokio::test]
async fn an_https_target_trusted_through_the_ca_file_is_judged_over_one_connection() {
    let pki = Pki::new();
    let (addr, conns) = serve(pki.server(&["127.0.0.1"]), health(PASS), usize::MAX).await;
    let c = client(Some(pki.ca_file()), true);
    for i in 0..3 {
        let seen = c
            .get(&url(addr), limits(Duration::from_secs(5)))
            .await
            .unwrap_or_else(|e| panic!("probe {i} of a trusted https target: {e}"));
        assert_eq!(seen.status, 200);
        assert_eq!(seen.judgement.status, Status::Pass, "{:?}", seen.judgement);
        let report = seen.judgement.report.expect("a health+json report");
        assert!(report.checks.contains_key("disk:free"));
        assert_eq!(
            seen.reused,
            i > 0,
            "probe {i}: the TLS connection is pooled"
        );
    }
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "three https probes share one connection"
    );
    assert_eq!(c.idle_connections(), 1);
}

#[tokio::test]
async fn a_failing_https_report_names_its_failing_check() {
    let pki = Pki::new();
    let body = r#"{"status":"fail","checks":{"db:ping":[{"status":"fail"}]}}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/health+json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (addr, _) = serve(pki.server(&["127.0.0.1"]), answer, usize::MAX).await;
    let seen = client(Some(pki.ca_file()), true)
        .get(&url(addr), limits(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(seen.status, 503);
    assert_eq!(seen.judgement.status, Status::Fail);
    let obs = seen.judgement.observation("t", "z");
    assert_eq!(obs.failing_checks, ["db:ping"]);
}

#[tokio::test]
async fn without_the_ca_file_the_certificate_is_not_trusted_and_says_so() {
    let pki = Pki::new();
    let (addr, _) = serve(pki.server(&["127.0.0.1"]), health(PASS), usize::MAX).await;
    let e = client(None, true)
        .get(&url(addr), limits(Duration::from_secs(5)))
        .await
        .expect_err("a certificate of an unknown CA must not be trusted");
    assert_eq!(e.kind, ErrorKind::Tls, "{e}");
    assert_eq!(e.message, "certificate not trusted: UnknownIssuer");
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused() {
    let pki = Pki::new();
    let (addr, _) = serve(pki.server(&["other.test"]), health(PASS), usize::MAX).await;
    let e = client(Some(pki.ca_file()), true)
        .get(&url(addr), limits(Duration::from_secs(5)))
        .await
        .expect_err("a certificate for other.test is not 127.0.0.1's");
    assert_eq!(e.kind, ErrorKind::Tls, "{e}");
    assert!(
        e.message.starts_with(&format!(
            "certificate not valid for 127.0.0.1:{}",
            addr.port()
        )),
        "{e}"
    );
}

#[tokio::test]
async fn a_silent_tls_server_times_out_in_the_handshake() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    // Accepts (the kernel does) and never answers the ClientHello.
    let e = client(None, true)
        .get(&url(addr), limits(Duration::from_millis(300)))
        .await
        .expect_err("no ServerHello: a timeout");
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert_eq!(e.message, "TLS handshake timed out after 300ms");
    drop(l);
}

#[tokio::test]
async fn a_plain_http_server_behind_an_https_url_fails_the_handshake() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(health(PASS).as_bytes()).await;
        }
    });
    let e = client(None, true)
        .get(&url(addr), limits(Duration::from_secs(5)))
        .await
        .expect_err("an HTTP answer is no ServerHello");
    assert_eq!(e.kind, ErrorKind::Tls, "{e}");
    assert!(e.message.starts_with("TLS handshake failed"), "{e}");
}

#[tokio::test]
async fn without_reuse_every_https_probe_has_its_own_connection() {
    let pki = Pki::new();
    let (addr, conns) = serve(pki.server(&["127.0.0.1"]), health(PASS), usize::MAX).await;
    let c = client(Some(pki.ca_file()), false);
    for _ in 0..3 {
        let seen = c
            .get(&url(addr), limits(Duration::from_secs(5)))
            .await
            .unwrap();
        assert!(!seen.reused);
    }
    assert_eq!(conns.load(Ordering::SeqCst), 3);
    assert_eq!(c.idle_connections(), 0);
}

#[tokio::test]
async fn a_pooled_tls_connection_closed_by_the_server_is_replaced() {
    let pki = Pki::new();
    // One answer per connection, then a close_notify, without `Connection: close`.
    let (addr, conns) = serve(pki.server(&["127.0.0.1"]), health(PASS), 1).await;
    let c = client(Some(pki.ca_file()), true);
    for i in 0..4 {
        let seen = c.get(&url(addr), limits(Duration::from_secs(5))).await;
        assert!(
            seen.is_ok_and(|s| s.judgement.status == Status::Pass),
            "probe {i} passes despite the closed idle connection"
        );
        // The close arrives before the next probe for some, not for others.
        if i % 2 == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(conns.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn plain_and_https_urls_of_one_client_keep_their_own_connections() {
    let pki = Pki::new();
    let (tls_addr, _) = serve(pki.server(&["127.0.0.1"]), health(PASS), usize::MAX).await;
    let (plain_addr, _) = serve_plain(health(PASS)).await;
    let c = client(Some(pki.ca_file()), true);
    let plain: http::Uri = format!("http://{plain_addr}/health").parse().unwrap();
    for _ in 0..2 {
        for u in [&url(tls_addr), &plain] {
            let seen = c.get(u, limits(Duration::from_secs(5))).await.unwrap();
            assert_eq!(seen.judgement.status, Status::Pass, "{u}");
        }
    }
    assert_eq!(c.idle_connections(), 2);
    let limits = Limits {
        answers: Answers::PlainStatus,
        ..limits(Duration::from_secs(5))
    };
    assert!(c.get(&plain, limits).await.unwrap().reused);
}

/// A plain keep-alive HTTP server answering `answer` (the http:// side of the pool).
async fn serve_plain(answer: String) -> (SocketAddr, ()) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
                    buf.drain(..end + 4);
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, ())
}

#[test]
fn a_ca_file_that_is_missing_or_not_pem_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let e = CaFile::read(&missing).unwrap_err();
    assert!(
        e.to_string().starts_with(&missing.display().to_string()),
        "{e}"
    );
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let e = CaFile::read(&junk).unwrap_err();
    assert!(e.to_string().contains("no CERTIFICATE"), "{e}");
}

#[tokio::test]
async fn another_ca_of_the_same_name_is_a_bad_signature_not_trust() {
    let pki = Pki::new();
    let impostor = Pki::new();
    let (addr, _) = serve(impostor.server(&["127.0.0.1"]), health(PASS), usize::MAX).await;
    let e = client(Some(pki.ca_file()), true)
        .get(&url(addr), limits(Duration::from_secs(5)))
        .await
        .expect_err("signed by another key than the trusted CA's");
    assert_eq!(e.kind, ErrorKind::Tls, "{e}");
    assert!(
        e.message
            .starts_with("certificate not trusted: BadSignature"),
        "{e}"
    );
}
