//! The controller's view of the hosts, as the deployer reads it: `GET /api/targets` of
//! a `vigil controller` (all pages), each target's display state. A host in one of
//! the standings that [`Standing::is_held`] names counts as held by the rollout policy (`Rollout::held`: out of
//! service for the floor, never touched); a read that fails is reported to the policy
//! as unreadable (`ControllerView::Unreadable`), which starts no new wave: fail closed,
//! as CodeDeploy does with alarms it cannot read. The same read can supply the host
//! list itself (`controller.hosts = "controller"`).

use super::config::{DeployConfig, DeployControllerConfig, HostConfig, HostSource};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use std::collections::BTreeMap;
use vigil_core::fleet::Standing;

/// Targets per page asked for: the API's most, so a fleet of a few thousand is a few
/// requests.
const PAGE: usize = 1000;
/// Most pages read in one go (bounds the loop: 100,000 targets).
const MAX_PAGES: usize = 100;

/// One target as the controller shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerTarget {
    /// Its id, URL, zone.
    pub host: HostConfig,
    /// Its group.
    pub group: String,
    /// Its standing as the controller shows it (`healthy`, `maintenance`, ...); None
    /// for a name this deployer does not know (a newer controller's), which is not held.
    pub state: Option<Standing>,
}

impl ControllerTarget {
    /// Whether the rollout counts it as held.
    pub fn held(&self) -> bool {
        self.state.is_some_and(Standing::is_held)
    }
}

/// Reads a controller's targets.
#[derive(Clone)]
pub struct ControllerClient {
    cfg: DeployControllerConfig,
    http: reqwest::Client,
}

impl ControllerClient {
    /// A client for `cfg` (None when no controller is configured).
    pub fn new(cfg: &DeployControllerConfig) -> Option<ControllerClient> {
        cfg.is_set().then(|| ControllerClient {
            cfg: cfg.clone(),
            http: reqwest::Client::builder()
                .timeout(cfg.timeout)
                .build()
                .expect("a reqwest client without TLS builds"),
        })
    }

    /// The controller's URL.
    pub fn url(&self) -> &str {
        &self.cfg.url
    }

    /// Every target, by id; `Err` says why the controller could not be read.
    pub async fn targets(&self) -> Result<BTreeMap<String, ControllerTarget>, String> {
        let base = self.cfg.url.trim_end_matches('/');
        let mut out = BTreeMap::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut url = format!("{base}/api/targets?limit={PAGE}");
            if let Some(a) = &after {
                url.push_str("&after=");
                url.push_str(&percent_encode(a));
            }
            let mut req = self.http.get(url);
            if let Some(t) = self.cfg.token() {
                req = req.bearer_auth(t);
            }
            let what = format!("GET {base}/api/targets");
            let resp = req.send().await.map_err(|e| format!("{what}: {e}"))?;
            let status = resp.status();
            if !status.is_success() {
                return Err(format!("{what}: HTTP {status}"));
            }
            let page: serde_json::Value = resp
                .json()
                .await
                .map_err(|e| format!("{what}: not the controller's JSON: {e}"))?;
            let Some(targets) = page["targets"].as_array() else {
                return Err(format!("{what}: no `targets` array in the answer"));
            };
            for t in targets {
                let (Some(id), Some(state)) = (t["id"].as_str(), t["state"].as_str()) else {
                    return Err(format!("{what}: a target without `id` or `state`: {t}"));
                };
                let text = |k: &str| t[k].as_str().unwrap_or_default().to_string();
                out.insert(
                    id.to_string(),
                    ControllerTarget {
                        host: HostConfig {
                            id: id.to_string(),
                            url: text("url"),
                            zone: text("zone"),
                        },
                        group: text("group"),
                        state: Standing::from_name(state),
                    },
                );
            }
            match page["next_after"].as_str() {
                Some(a) => after = Some(a.to_string()),
                None => return Ok(out),
            }
        }
        Err(format!(
            "{base}/api/targets: more than {MAX_PAGES} pages of {PAGE} targets"
        ))
    }
}

/// What a query value percent-encodes: every byte but RFC 3986's unreserved
/// characters (`A-Z a-z 0-9 - . _ ~`).
const QUERY_VALUE_ENCODED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `text` as a query value: unreserved characters (RFC 3986) as they are, every other
/// byte as `%XX`.
fn percent_encode(text: &str) -> String {
    utf8_percent_encode(text, QUERY_VALUE_ENCODED).to_string()
}

/// The hosts a rollout covers: the config's, or (with `controller.hosts = "controller"`)
/// the controller's targets selected by group and zone. Probed targets only: a
/// heartbeat target has no URL to read a revision from, and is left out (logged).
pub fn select_hosts(
    cfg: &DeployConfig,
    targets: &BTreeMap<String, ControllerTarget>,
) -> Result<Vec<HostConfig>, String> {
    if cfg.controller.hosts == HostSource::Config {
        return Ok(cfg.hosts.clone());
    }
    let c = &cfg.controller;
    let mut hosts = Vec::new();
    for t in targets.values() {
        if (!c.group.is_empty() && t.group != c.group)
            || (!c.zone.is_empty() && t.host.zone != c.zone)
        {
            continue;
        }
        if !t.host.url.starts_with("http://") {
            tracing::warn!(host = %t.host.id, url = %t.host.url, "controller target left out of the rollout: no http:// URL to probe (a heartbeat target?)");
            continue;
        }
        hosts.push(t.host.clone());
    }
    if hosts.is_empty() {
        return Err(format!(
            "the controller at {} has no probed target{}{}",
            c.url,
            if c.group.is_empty() {
                String::new()
            } else {
                format!(" in group {:?}", c.group)
            },
            if c.zone.is_empty() {
                String::new()
            } else {
                format!(" in zone {:?}", c.zone)
            }
        ));
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(id: &str, group: &str, zone: &str, state: &str, url: &str) -> ControllerTarget {
        ControllerTarget {
            host: HostConfig {
                id: id.into(),
                url: url.into(),
                zone: zone.into(),
            },
            group: group.into(),
            state: Standing::from_name(state),
        }
    }

    #[test]
    fn the_selector_picks_probed_targets_of_its_group_and_zone() {
        let mut cfg = super::super::config::parse(
            "[install.exec]\ncommand = [\"true\"]\n[controller]\nurl = \"http://c:1\"\nhosts = \"controller\"\ngroup = \"web\"\n",
        )
        .unwrap();
        let targets: BTreeMap<String, ControllerTarget> = [
            target("a", "web", "z1", "healthy", "http://127.0.0.1:1"),
            target("b", "web", "z2", "maintenance", "http://127.0.0.1:2"),
            target("c", "db", "z1", "healthy", "http://127.0.0.1:3"),
            target("d", "web", "z1", "healthy", ""),
        ]
        .into_iter()
        .map(|t| (t.host.id.clone(), t))
        .collect();
        let ids = |h: Vec<HostConfig>| h.into_iter().map(|h| h.id).collect::<Vec<_>>();
        assert_eq!(ids(select_hosts(&cfg, &targets).unwrap()), ["a", "b"]);
        cfg.controller.zone = "z2".into();
        assert_eq!(ids(select_hosts(&cfg, &targets).unwrap()), ["b"]);
        cfg.controller.group = "none".into();
        let e = select_hosts(&cfg, &targets).unwrap_err();
        assert!(e.contains("group \"none\""), "{e}");
        assert!(targets["b"].held() && !targets["a"].held());
        assert_eq!(percent_encode("10.0.0.1:80/a b"), "10.0.0.1%3A80%2Fa%20b");
    }

    #[test]
    fn a_tricky_target_id_is_encoded_as_the_hand_written_encoder_did() {
        // Pinned to the old encoder's output: `%`, `&`, `+`, `#` and non-ASCII escaped
        // (upper-case hex), unreserved characters kept.
        assert_eq!(
            percent_encode("w 1/50%&a+b#é~_.-"),
            "w%201%2F50%25%26a%2Bb%23%C3%A9~_.-"
        );
    }
}
