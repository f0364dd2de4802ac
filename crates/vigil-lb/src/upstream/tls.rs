//! TLS to targets (`[pools.<name>.tls]`): the client configuration of a pool, the
//! connection to a target plain or over TLS ([`TargetStream`]), and the one dial
//! ([`Dialer`]) that requests, HTTP/2 and health checks all connect with.
//!
//! Floor 6, upstream, a child of [`crate::upstream`] (floors: the crate doc): imports the
//! shared config only. The TLS listeners' module ([`crate::tls`]) reads its PEM files
//! with this module's readers and names its errors with [`TlsError`](crate::upstream::tls::TlsError).
//!
//! Certificates are always verified (rustls's webpki verifier): against `ca` when the
//! pool names one, else against the system's roots (`rustls-native-certs`). The name
//! verified (and sent as SNI) is `server_name`, else each target's own host; an IP
//! address is verified against the certificate's IP addresses. A pool's configuration
//! is built whole when the file is loaded (every file read, the key matched to its
//! certificate), so a bad file rejects a reload and the running one stays. rustls's
//! client keeps a session cache: a new connection to a target resumes its session.

use crate::body::MaybeTls;
use crate::config::{Protocol, TargetTlsConfig};
use arc_swap::ArcSwapOption;
use rustls::ClientConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::future::Future as _;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The crypto provider of every TLS use in the balancer: aws-lc-rs (the binary holds
/// two providers and rustls refuses to guess: `/work/shared/ECOSYSTEM.md`, trap 2).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A certificate, key or CA file that cannot be used: which key, which file, why.
#[derive(Debug, thiserror::Error)]
#[error("key `{key}`: {}: {message}", file.display())]
pub struct TlsError {
    /// Dotted path of the key, e.g. `tls_listeners.public.certificates[1].key`.
    pub key: String,
    /// The file, as resolved.
    pub file: PathBuf,
    /// What is wrong.
    pub message: String,
}

/// The certificates of a PEM file (at least one), or what is wrong with it (`key`: the
/// configuration key that named it).
pub fn read_chain(file: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let fail = |message: String| TlsError {
        key: key.to_string(),
        file: file.to_path_buf(),
        message,
    };
    let chain = CertificateDer::pem_file_iter(file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| fail(format!("cannot read a PEM chain: {e}")))?;
    if chain.is_empty() {
        return Err(fail("no CERTIFICATE in this PEM file".into()));
    }
    Ok(chain)
}

/// The private key of a PEM file.
pub fn read_key(file: &Path, key: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(file).map_err(|e| TlsError {
        key: key.to_string(),
        file: file.to_path_buf(),
        message: format!("cannot read a PEM private key: {e}"),
    })
}

/// A pool's TLS to its targets, built from its `[pools.<name>.tls]`.
pub struct TargetTls {
    /// ALPN `http/1.1`: requests and HTTP health checks of an `http1` pool.
    http1: TlsConnector,
    /// ALPN `h2`: an `h2` pool's requests and `grpc` health checks.
    h2: TlsConnector,
    /// `server_name`, when set: the name every target is verified against.
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for TargetTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TargetTls {
    /// Builds pool `pool`'s TLS (`base`: the configuration file's directory, for
    /// relative paths): reads the CA file (or the system's roots) and the client
    /// certificate, if any.
    pub fn load(cfg: &TargetTlsConfig, pool: &str, base: &Path) -> Result<TargetTls, TlsError> {
        let key = |k: &str| format!("pools.{pool}.tls.{k}");
        let mut roots = rustls::RootCertStore::empty();
        match &cfg.ca {
            Some(ca) => {
                let file = base.join(ca);
                let (added, _) = roots.add_parsable_certificates(read_chain(&file, &key("ca"))?);
                if added == 0 {
                    return Err(TlsError {
                        key: key("ca"),
                        file,
                        message: "no usable CA certificate in this PEM file".into(),
                    });
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(TlsError {
                        key: key("ca"),
                        file: PathBuf::new(),
                        message: format!(
                            "absent, and the system has no root certificates ({} errors reading them): name the CA of the targets' certificates",
                            found.errors.len()
                        ),
                    });
                }
            }
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError {
                key: format!("pools.{pool}.tls"),
                file: PathBuf::new(),
                message: e.to_string(),
            })?
            .with_root_certificates(roots);
        let config = match (&cfg.cert, &cfg.key) {
            (Some(cert), Some(k)) => {
                let (cert_file, key_file) = (base.join(cert), base.join(k));
                let chain = read_chain(&cert_file, &key("cert"))?;
                let private = read_key(&key_file, &key("key"))?;
                builder
                    .with_client_auth_cert(chain, private)
                    .map_err(|e| TlsError {
                        key: key("key"),
                        file: key_file,
                        message: format!("unusable with {}: {e}", cert_file.display()),
                    })?
            }
            _ => builder.with_no_client_auth(),
        };
        let with_alpn = |alpn: &[u8]| {
            let mut c = config.clone();
            c.alpn_protocols = vec![alpn.to_vec()];
            TlsConnector::from(Arc::new(c))
        };
        let server_name = match &cfg.server_name {
            Some(n) => Some(ServerName::try_from(n.clone()).map_err(|e| TlsError {
                key: key("server_name"),
                file: PathBuf::new(),
                message: format!("{n:?}: {e}"),
            })?),
            None => None,
        };
        Ok(TargetTls {
            http1: with_alpn(b"http/1.1"),
            h2: with_alpn(b"h2"),
            server_name,
        })
    }

    /// The name to verify `addr` (`host:port`) against: `server_name`, else its host.
    fn name_for(&self, addr: &str) -> io::Result<ServerName<'static>> {
        if let Some(n) = &self.server_name {
            return Ok(n.clone());
        }
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(host.to_string()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{host:?} cannot be verified as a TLS name ({e}): set tls.server_name"),
            )
        })
    }
}

/// A connection to a target: plain TCP, or TLS over it (the client side's
/// [`crate::body::ClientStream`] with rustls's other half).
pub type TargetStream = MaybeTls<tokio_rustls::client::TlsStream<TcpStream>>;

impl TargetStream {
    /// The TCP connection under it.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            MaybeTls::Plain(t) => t,
            MaybeTls::Tls(t) => t.get_ref().0,
        }
    }

    /// Whether an idle connection can take a request: the target has not closed it nor
    /// sent anything unasked. One read attempt: it stops at epoll's last word (no
    /// system call) unless epoll said "readable"; over TLS what arrived is read through
    /// the session, so records that carry no data (a session ticket) leave it usable,
    /// and a `close_notify`, data or an error do not.
    pub fn is_usable(&mut self) -> bool {
        let mut b = [0u8; 1];
        let mut buf = ReadBuf::new(&mut b);
        // Outside tokio's cooperative budget: with it spent (many idle connections
        // looked at in one poll), the read would be `Pending` and a closed connection
        // pass for usable.
        let read = std::pin::pin!(tokio::task::unconstrained(std::future::poll_fn(|cx| {
            Pin::new(&mut *self).poll_read(cx, &mut buf)
        })));
        matches!(
            read.poll(&mut Context::from_waker(Waker::noop())),
            Poll::Pending
        )
    }
}

/// How connections to one target are made: its address, and its pool's TLS (set on
/// every configuration load).
#[derive(Debug)]
pub struct Dialer {
    /// `host:port` as configured (resolved at connect time when not an IP address).
    addr: String,
    /// The address when `addr` is an IP address (no resolution per connect).
    sock: Option<SocketAddr>,
    tls: ArcSwapOption<TargetTls>,
    /// Bumped by every change of `tls`: a connection made under an older one is not
    /// pooled again ([`Dialer::generation`]).
    generation: AtomicU64,
}

impl Dialer {
    /// Cleartext to `addr` until [`Dialer::set_tls`].
    pub fn new(addr: &str) -> Dialer {
        Dialer {
            addr: addr.to_string(),
            sock: addr.parse().ok(),
            tls: ArcSwapOption::empty(),
            generation: AtomicU64::new(0),
        }
    }

    /// `host:port` as configured.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// TLS (or cleartext, `None`) for new connections; true when that changed (then
    /// the generation moves on).
    pub fn set_tls(&self, tls: Option<Arc<TargetTls>>) -> bool {
        let old = self.tls.swap(tls.clone());
        let changed = match (old, tls) {
            (None, None) => false,
            (Some(a), Some(b)) => !Arc::ptr_eq(&a, &b),
            _ => true,
        };
        if changed {
            // After the swap: a dial that reads the new generation dials with the new
            // settings (it reads the generation first, then the settings).
            self.generation.fetch_add(1, Ordering::Release);
        }
        changed
    }

    /// Which TLS settings are current: read it before [`Dialer::dial`], keep it with
    /// the connection, and pool the connection again only while it is unchanged (a
    /// connection busy during a reload that changed the CA, the name or the client
    /// certificate must not live on under the old ones).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Connects (`TCP_NODELAY`), then makes the TLS handshake when the pool has TLS,
    /// offering `protocol`'s ALPN; each step within what is left of `within` (an
    /// error of kind `TimedOut` says which step ran out of time).
    pub async fn dial(&self, protocol: Protocol, within: Duration) -> io::Result<TargetStream> {
        let tls = self.tls.load_full();
        let due = tokio::time::Instant::now() + within;
        let timed_out = |what: &str| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{what} within {}", humantime::format_duration(within)),
            )
        };
        let connecting = async {
            match self.sock {
                Some(sa) => TcpStream::connect(sa).await,
                None => TcpStream::connect(self.addr.as_str()).await,
            }
        };
        let tcp = tokio::time::timeout_at(due, connecting)
            .await
            .map_err(|_| timed_out("no connection"))??;
        tcp.set_nodelay(true)?;
        let Some(tls) = tls else {
            return Ok(TargetStream::Plain(tcp));
        };
        let connector = match protocol {
            Protocol::Http1 => &tls.http1,
            Protocol::H2 => &tls.h2,
        };
        let stream =
            tokio::time::timeout_at(due, connector.connect(tls.name_for(&self.addr)?, tcp))
                .await
                .map_err(|_| timed_out("TLS handshake: no handshake"))?
                .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake: {e}")))?;
        Ok(TargetStream::Tls(Box::new(stream)))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// TLS settings trusting a throw-away CA (for the pool's tests too).
    pub(crate) fn tls(server_name: Option<&str>) -> TargetTls {
        let ca = rcgen::generate_simple_self_signed(vec!["a.test".into()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.cert.pem()).unwrap();
        let cfg = TargetTlsConfig {
            ca: Some("ca.pem".into()),
            server_name: server_name.map(str::to_string),
            ..TargetTlsConfig::default()
        };
        TargetTls::load(&cfg, "api", dir.path()).unwrap()
    }

    #[test]
    fn each_target_is_verified_as_its_own_host_unless_a_server_name_is_set() {
        let own = tls(None);
        let is = |t: &TargetTls, addr: &str, want: &str| {
            assert_eq!(
                t.name_for(addr).unwrap(),
                ServerName::try_from(want.to_string()).unwrap(),
                "{addr}"
            );
        };
        is(&own, "api-1.internal:8443", "api-1.internal");
        // An address is verified as an address (an IP SAN), not as a DNS name.
        is(&own, "10.0.0.7:443", "10.0.0.7");
        assert!(matches!(
            own.name_for("10.0.0.7:443").unwrap(),
            ServerName::IpAddress(_)
        ));
        is(&own, "[::1]:443", "::1");
        let named = tls(Some("api.internal"));
        is(&named, "10.0.0.7:443", "api.internal");
    }

    #[test]
    fn a_bad_ca_file_is_named_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), "not pem").unwrap();
        let cfg = TargetTlsConfig {
            ca: Some("ca.pem".into()),
            ..TargetTlsConfig::default()
        };
        let e = TargetTls::load(&cfg, "api", dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("key `pools.api.tls.ca`: "), "{e}");
        assert!(e.contains("ca.pem"), "{e}");
        let cfg = TargetTlsConfig {
            ca: Some("missing.pem".into()),
            ..TargetTlsConfig::default()
        };
        let e = TargetTls::load(&cfg, "api", dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.pem: cannot read a PEM chain"), "{e}");
    }
}
