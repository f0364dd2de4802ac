//! `[share]`: shared probe verdicts among the balancers of one pool, under a probe
//! budget (docs/lb.md, "Shared verdicts"; the rules: `vigil_core::share`).

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use vigil_core::Invalid;
pub use vigil_core::share::{DEFAULT_LOCAL_EVERY, DEFAULT_PROBES_PER_INTERVAL};

/// `[share]`. Without peers (the default) every balancer probes every target itself,
/// exactly as without this section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShareConfig {
    /// This balancer's name in the feed. Defaults to the `admin_listen` address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The other balancers' admin URLs (`http://host:port`), whose `/admin/verdicts`
    /// are polled. Defaults to none: no sharing.
    pub peers: Vec<String>,
    /// Balancers that probe each target every interval (the probe budget). Defaults
    /// to 1.
    pub probes_per_interval: usize,
    /// A target that others probe is still probed locally every this many intervals
    /// (the slow probe). Defaults to 10.
    pub local_every: u32,
}

impl Default for ShareConfig {
    fn default() -> Self {
        ShareConfig {
            id: None,
            peers: Vec::new(),
            probes_per_interval: DEFAULT_PROBES_PER_INTERVAL,
            local_every: DEFAULT_LOCAL_EVERY,
        }
    }
}

/// A peer's admin address, parsed from its URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerUrl {
    /// The URL as configured.
    pub url: String,
    /// `host:port` (port 80 when the URL has none).
    pub authority: String,
}

impl ShareConfig {
    /// Whether sharing is on: some peer is configured.
    pub fn enabled(&self) -> bool {
        !self.peers.is_empty()
    }

    /// The id in the feed: `id`, or the admin listener's address.
    pub fn id_or(&self, admin_listen: SocketAddr) -> String {
        self.id.clone().unwrap_or_else(|| admin_listen.to_string())
    }

    /// The peers' admin addresses (validated: every URL parses).
    pub fn peer_urls(&self) -> Vec<PeerUrl> {
        self.peers
            .iter()
            .filter_map(|u| parse_peer(u).ok())
            .collect()
    }

    /// Checks what serde cannot; the key is relative to `[share]`. `admin_listen`: this
    /// balancer's, which no peer may be.
    pub fn validate(&self, admin_listen: SocketAddr) -> Result<(), Invalid> {
        if self.probes_per_interval == 0 {
            return Err(Invalid::new(
                "probes_per_interval",
                "must be at least 1, got 0",
            ));
        }
        if self.local_every == 0 {
            return Err(Invalid::new("local_every", "must be at least 1, got 0"));
        }
        if let Some(id) = &self.id
            && id.trim().is_empty()
        {
            return Err(Invalid::new(
                "id",
                format!(
                    "must not be empty, got {id:?} (leave it out for the admin_listen address)"
                ),
            ));
        }
        let id = self.id_or(admin_listen);
        let mut seen = std::collections::BTreeSet::new();
        for (i, url) in self.peers.iter().enumerate() {
            let key = format!("peers[{i}]");
            let peer = parse_peer(url).map_err(|m| Invalid::new(&key, m))?;
            if *url == id || peer.authority == id {
                return Err(Invalid::new(
                    key,
                    format!("{url:?} is this balancer's own id: a peer must be another balancer"),
                ));
            }
            if peer.authority == admin_listen.to_string() {
                return Err(Invalid::new(
                    key,
                    format!(
                        "{url:?} is this balancer's own admin_listen ({admin_listen}): a peer must be another balancer"
                    ),
                ));
            }
            if !seen.insert(peer.authority.clone()) {
                return Err(Invalid::new(key, format!("{url:?} is listed twice")));
            }
        }
        Ok(())
    }
}

/// `http://host[:port][/]`: the admin URL of a peer.
fn parse_peer(url: &str) -> Result<PeerUrl, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| format!("{url:?} is not a URL (e.g. \"http://10.0.0.2:9901\")"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "{url:?}: only http:// peers are supported (the admin listener speaks plain HTTP)"
        ));
    }
    let Some(auth) = uri.authority() else {
        return Err(format!("{url:?} has no host"));
    };
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() || auth.as_str().contains('@') {
        return Err(format!(
            "{url:?}: give the admin listener's root, http://host:port (/admin/verdicts is added)"
        ));
    }
    Ok(PeerUrl {
        url: url.to_string(),
        authority: format!("{}:{}", auth.host(), auth.port_u16().unwrap_or(80)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin() -> SocketAddr {
        "127.0.0.1:9901".parse().unwrap()
    }

    fn with(f: impl FnOnce(&mut ShareConfig)) -> Result<(), Invalid> {
        let mut c = ShareConfig {
            peers: vec!["http://127.0.0.1:9102".into()],
            ..ShareConfig::default()
        };
        f(&mut c);
        c.validate(admin())
    }

    #[test]
    fn bad_share_settings_name_the_key_and_value() {
        assert_eq!(with(|_| {}), Ok(()));
        let key = |r: Result<(), Invalid>| r.unwrap_err().key;
        assert_eq!(
            key(with(|c| c.probes_per_interval = 0)),
            "probes_per_interval"
        );
        assert_eq!(key(with(|c| c.local_every = 0)), "local_every");
        assert_eq!(key(with(|c| c.id = Some(" ".into()))), "id");
        let e = with(|c| c.peers.push("https://10.0.0.1:9901".into())).unwrap_err();
        assert_eq!(e.key, "peers[1]");
        assert!(e.message.contains("https://10.0.0.1:9901"), "{e:?}");
        assert_eq!(
            key(with(|c| c.peers.push("10.0.0.1:9901".into()))),
            "peers[1]"
        );
        assert_eq!(
            key(with(|c| c.peers.push("http://127.0.0.1:9901".into()))),
            "peers[1]"
        );
        assert_eq!(
            key(with(|c| c.peers.push("http://127.0.0.1:9102/".into()))),
            "peers[1]"
        );
        assert_eq!(
            key(with(|c| {
                c.id = Some("lb-2".into());
                c.peers.push("lb-2".into());
            })),
            "peers[1]"
        );
    }

    #[test]
    fn a_peer_url_gives_its_host_and_port() {
        assert_eq!(
            parse_peer("http://10.0.0.2").unwrap().authority,
            "10.0.0.2:80"
        );
        assert_eq!(
            parse_peer("http://lb-2.internal:9901/").unwrap().authority,
            "lb-2.internal:9901"
        );
    }
}
