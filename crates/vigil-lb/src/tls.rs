//! TLS termination: the certificates of each `[tls_listeners.<name>]` entry, chosen per
//! handshake by the name the client asks for (SNI), and replaced on SIGHUP without
//! touching the connections already open.
//!
//! Floor 3, downstream (floors: the crate doc): imports config, and upstream's TLS to
//! targets (its PEM readers, its provider, and each pool's [`TargetTls`], which
//! [`load`] builds with the listeners' so that one reading of the files serves both).
//!
//! rustls (through tokio-rustls) does the TLS; its crypto provider is chosen
//! explicitly, aws-lc-rs (the workspace compiles both ring and aws-lc-rs into the
//! binary, and rustls refuses to guess between two: `/work/shared/ECOSYSTEM.md`, trap
//! 2). Each listener's `ServerConfig` sits in an [`ArcSwap`] ([`TlsSlot`]) that every
//! handshake reads once: a reload builds the new configuration whole (every file read
//! and checked: chain, key, key matching the certificate) before swapping it in, so a
//! bad file rejects the reload and the old certificates stay; connections already
//! open keep the session they negotiated.
//!
//! SNI selection ([`SniCerts`]): an exact name first, then a `*.parent` wildcard
//! covering one label, else the listener's first certificate (clients without SNI,
//! names no certificate lists), as nginx's default server does. Names are listed in
//! the configuration (`server_names`) rather than read from the certificates, so that
//! which certificate answers which name is visible in the file.

use crate::config::{LbConfig, TlsListenerConfig};
pub use crate::upstream::tls::TlsError;
use crate::upstream::tls::{TargetTls, provider, read_chain, read_key};
use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A TLS listener's configuration now: read at each handshake, swapped on reload.
pub type TlsSlot = Arc<ArcSwap<ServerConfig>>;

/// Installs aws-lc-rs as the process's default rustls provider (a no-op when one is
/// installed already). Called first thing by `vigil lb`: anything that builds a rustls
/// configuration without naming a provider would otherwise panic.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Certificates by server name.
#[derive(Debug)]
pub struct SniCerts {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// By the parent of the `*.` (`example.com` for `*.example.com`).
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Arc<CertifiedKey>,
}

impl SniCerts {
    /// The certificate for `name` (the client's SNI, if it sent one).
    pub fn pick(&self, name: Option<&str>) -> &Arc<CertifiedKey> {
        let Some(name) = name else {
            return &self.default;
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(c) = self.exact.get(&name) {
            return c;
        }
        name.split_once('.')
            .and_then(|(_, parent)| self.wildcard.get(parent))
            .unwrap_or(&self.default)
    }
}

impl ResolvesServerCert for SniCerts {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.pick(hello.server_name()).clone())
    }
}

/// Every TLS configuration of a file, each read and checked whole.
#[derive(Debug, Default)]
pub struct Loaded {
    /// One `ServerConfig` per TLS listener, in the order of their names.
    pub listeners: Vec<Arc<ServerConfig>>,
    /// TLS to the targets, by pool (pools with a `[pools.<name>.tls]`).
    pub pools: BTreeMap<String, Arc<TargetTls>>,
}

/// Reads and checks every TLS listener's certificates and every pool's TLS to its
/// targets (`base`: the configuration file's directory, for relative paths).
pub fn load(config: &LbConfig, base: &Path) -> Result<Loaded, TlsError> {
    let listeners = config
        .tls_listeners
        .iter()
        .map(|(name, l)| server_config(l, name, base))
        .collect::<Result<_, _>>()?;
    let pools = config
        .pools
        .iter()
        .filter_map(|(name, p)| p.tls.as_ref().map(|t| (name, t)))
        .map(|(name, t)| Ok((name.clone(), Arc::new(TargetTls::load(t, name, base)?))))
        .collect::<Result<_, TlsError>>()?;
    Ok(Loaded { listeners, pools })
}

/// The `ServerConfig` of the listener named `index`.
pub fn server_config(
    l: &TlsListenerConfig,
    index: &str,
    base: &Path,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let mut exact = HashMap::new();
    let mut wildcard = HashMap::new();
    let mut default = None;
    for (j, c) in l.certificates.iter().enumerate() {
        let key = |k: &str| format!("tls_listeners.{index}.certificates[{j}].{k}");
        let cert_file = base.join(&c.cert);
        let key_file = base.join(&c.key);
        let chain = read_chain(&cert_file, &key("cert"))?;
        let private = read_key(&key_file, &key("key"))?;
        let certified =
            CertifiedKey::from_der(chain, private, &provider).map_err(|e| TlsError {
                key: key("key"),
                file: key_file.clone(),
                message: format!("unusable with {}: {e}", cert_file.display()),
            })?;
        let certified = Arc::new(certified);
        for name in &c.server_names {
            let name = name.to_ascii_lowercase();
            match name.strip_prefix("*.") {
                Some(parent) => wildcard.insert(parent.to_string(), certified.clone()),
                None => exact.insert(name, certified.clone()),
            };
        }
        default.get_or_insert(certified);
    }
    let Some(default) = default else {
        return Err(TlsError {
            key: format!("tls_listeners.{index}.certificates"),
            file: PathBuf::new(),
            message: "a TLS listener needs at least one certificate".into(),
        });
    };
    let certs = SniCerts {
        exact,
        wildcard,
        default,
    };
    let mut sc = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError {
            key: format!("tls_listeners.{index}"),
            file: PathBuf::new(),
            message: e.to_string(),
        })?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(certs));
    sc.alpn_protocols = l.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Ok(Arc::new(sc))
}
