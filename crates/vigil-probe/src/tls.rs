//! HTTPS for probes: the roots a target's certificate is verified against (the system's,
//! plus an optional CA file), the one rustls client configuration built from them, and
//! TLS failures said in the words an operator looks for.
//!
//! Certificates are always verified (rustls's webpki verifier), against the name of the
//! URL's host, sent as SNI (an IP address is verified against the certificate's IP
//! addresses and sends no SNI). There is no switch to skip verification: a probe that
//! trusts any certificate tells nothing a plain TCP connect does not, and a target with
//! a private CA is trusted by naming that CA (`ca_file`, `--ca-file`).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::TlsConnector;

/// The extra CA certificates of a PEM file, read once (`ca_file`, `--ca-file`): a
/// target's certificate chaining to one of them is trusted, as are those chaining to
/// the system's roots.
#[derive(Clone, Debug)]
pub struct CaFile {
    path: PathBuf,
    certs: Arc<[CertificateDer<'static>]>,
}

/// A CA file that cannot be used: which file, why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct CaError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl CaFile {
    /// Reads the certificates of `path` (PEM, at least one `CERTIFICATE`).
    pub fn read(path: &Path) -> Result<CaFile, CaError> {
        let fail = |message: String| CaError {
            path: path.to_path_buf(),
            message,
        };
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| fail(format!("cannot read PEM certificates: {e}")))?;
        if certs.is_empty() {
            return Err(fail("no CERTIFICATE in this PEM file".into()));
        }
        // Parse them now, so a file that is PEM but not a CA fails here, not at the
        // first https probe.
        let mut roots = rustls::RootCertStore::empty();
        let (_, bad) = roots.add_parsable_certificates(certs.iter().cloned());
        if roots.is_empty() {
            return Err(fail(format!(
                "no usable CA certificate in this PEM file ({bad} unparsable)"
            )));
        }
        Ok(CaFile {
            path: path.to_path_buf(),
            certs: certs.into(),
        })
    }

    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The client configuration of every https probe of one [`crate::Client`]: the system's
/// roots and the CA file's, ALPN `http/1.1` (the probe speaks HTTP/1.1 only), rustls's
/// session cache (a new connection to a target resumes its session). `Err`: why no
/// https probe can be made (no roots at all).
pub(crate) fn connector(ca: Option<&CaFile>) -> Result<TlsConnector, String> {
    let mut roots = rustls::RootCertStore::empty();
    let system = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(system.certs);
    if let Some(ca) = ca {
        roots.add_parsable_certificates(ca.certs.iter().cloned());
    }
    if roots.is_empty() {
        return Err(format!(
            "no trusted root certificates: the system has none ({} errors reading them) and no CA file is given",
            system.errors.len()
        ));
    }
    // The provider is named, not taken from the process: a binary holding two rustls
    // providers panics on the implicit one (/work/shared/ECOSYSTEM.md, trap 2).
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The name a target's certificate is verified against: the URL's host (an IPv6
/// literal without its brackets).
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(bare.to_string())
        .map_err(|e| format!("{bare:?} cannot be verified as a TLS name: {e}"))
}

/// Says why a handshake failed: an untrusted or wrong certificate by name, what the
/// server said, or the I/O error.
pub(crate) fn describe(e: &std::io::Error, host: &str) -> String {
    use rustls::{CertificateError, Error};
    let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<Error>()) else {
        return format!("TLS handshake failed: {e}");
    };
    match tls {
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "certificate not trusted: UnknownIssuer".into()
        }
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!("certificate not valid for {host}: {tls}"),
        Error::InvalidCertificate(CertificateError::BadSignature) => {
            "certificate not trusted: BadSignature (a trusted CA has the issuer's name, another key signed it)".into()
        }
        Error::InvalidCertificate(c) => format!("certificate refused: {c:?}"),
        Error::AlertReceived(a) => format!("the server refused the TLS handshake: {a:?}"),
        Error::InvalidMessage(_) | Error::InappropriateHandshakeMessage { .. } => {
            format!("TLS handshake failed: {tls} (does it speak https?)")
        }
        other => format!("TLS handshake failed: {other}"),
    }
}
