//! https health endpoints for the tests of `vigil check` and `vigil controller`: a test
//! CA (rcgen) written as a PEM file, and a rustls server on loopback (its own threads,
//! so sync and async tests alike can use it) answering every GET the same way.

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;

/// A test CA and its PEM file (`ca_path`).
pub struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Pki {
    /// A CA named `vigil test CA`.
    pub fn new() -> Pki {
        Pki::named("vigil test CA")
    }

    /// A CA named `name` (two CAs of one name are one issuer to a verifier, which then
    /// finds the signature bad, not the issuer unknown).
    pub fn named(name: &str) -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca }
    }

    /// The CA's PEM file.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Serves `answer` (a whole HTTP/1.1 response, keep-alive) over TLS on 127.0.0.1,
    /// with a certificate for 127.0.0.1 signed by this CA; lives as long as the test
    /// process.
    pub fn serve(&self, answer: String) -> SocketAddr {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &self.ca)
            .unwrap();
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
        let config = Arc::new(config);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for tcp in l.incoming() {
                let Ok(tcp) = tcp else { continue };
                let (config, answer) = (config.clone(), answer.clone());
                std::thread::spawn(move || {
                    let Ok(conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    serve_conn(rustls::StreamOwned::new(conn, tcp), answer.as_bytes());
                });
            }
        });
        addr
    }
}

/// Answers each request head on `s` with `answer` until the client goes (or refuses
/// the certificate: the handshake runs inside the first read).
fn serve_conn(mut s: impl Read + Write, answer: &[u8]) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        buf.drain(..end + 4);
        if s.write_all(answer).and_then(|()| s.flush()).is_err() {
            return;
        }
    }
}

/// A 200 health+json answer with `body`.
pub fn health_json(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/health+json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}
