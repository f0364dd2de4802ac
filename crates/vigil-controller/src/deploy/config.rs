//! `vigil deploy`'s configuration (`deploy.toml`): the hosts, the rollout policy's keys,
//! the install and drain hooks, the store. Every default a named constant; loading names
//! the file, line and key of any mistake (vigil-config, like `fleet.toml`).

use crate::config::{DEFAULT_WEBHOOK_BACKOFF, DEFAULT_WEBHOOK_RETRIES, WebhookConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;
use vigil_core::Invalid;
use vigil_core::rollout::RolloutConfig;

/// Default deployment name: one deployment per store needs no name.
pub const DEFAULT_NAME: &str = "default";
/// Default store: the controller's default store file, so a controller and a deployer
/// started in the same directory share one file.
pub const DEFAULT_STORE: &str = "vigil-data/vigil.db";
/// Default probe interval: 2 s. It bounds how soon a host is seen to report back, and it
/// is the sampling rate of the verdict: a 5-minute bake (the policy's default) gives 150
/// samples per host, three times the 50 the verdict needs, while a fleet of hundreds is
/// still a handful of requests per second.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(2);
/// Default probe timeout: 2 s, as the controller's (a health answer comes from a cached
/// snapshot; slower is itself a symptom).
pub const DEFAULT_PROBE_TIMEOUT: Duration = crate::config::DEFAULT_PROBE_TIMEOUT;
/// Default health path: `/health`, the deep health endpoint, as the controller's: a new
/// revision that cannot reach its database has not reported back.
pub const DEFAULT_PROBE_PATH: &str = crate::config::DEFAULT_PROBE_PATH;
/// Default install timeout: 10 minutes. Installing is slower than an actuator's call
/// (pulling an image, restarting a service with its own drain); a hook that takes
/// longer is killed and the install counts as failed.
pub const DEFAULT_INSTALL_TIMEOUT: Duration = Duration::from_secs(600);
/// Default timeout of one read of the controller's API: 2 s. Its answer comes from a
/// published view (no store access); slower means the controller is in trouble, and
/// the rollout then holds (fail closed) rather than wait.
pub const DEFAULT_CONTROLLER_TIMEOUT: Duration = Duration::from_secs(2);
/// Default timeout of one read of a balancer's metrics: 2 s, as a probe's (the admin
/// listener answers from counters in memory). A balancer that does not answer in time
/// leaves that round's counts out (they are cumulative: the next read has them).
pub const DEFAULT_LB_TIMEOUT: Duration = Duration::from_secs(2);
/// Default drain timeout: 1 minute for a drain or undrain hook (a balancer's admin call,
/// or a script that waits for connections to finish).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// The whole `deploy.toml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeployConfig {
    /// The deployment's name: rollouts and bad revisions are kept per name, so several
    /// deployments can share a store. Defaults to `default`.
    pub name: String,
    /// The SQLite store file (the controller's `data_dir/vigil.db` can be shared).
    /// Relative to the config file. Defaults to `vigil-data/vigil.db`.
    pub store: PathBuf,
    /// The rollout policy: `vigil_core::rollout::RolloutConfig`'s keys.
    pub rollout: RolloutConfig,
    /// How hosts are probed for report-back and samples.
    pub probe: DeployProbeConfig,
    /// How a revision is installed on a host.
    pub install: InstallConfig,
    /// How a host is taken out of service and put back (optional).
    pub drain: DrainConfig,
    /// The controller whose view of the hosts counts (holds, and optionally the host
    /// list itself). Defaults to none.
    pub controller: DeployControllerConfig,
    /// The balancers whose request counts judge a wave. Defaults to none (the
    /// host-reported rule).
    pub lb: DeployLbConfig,
    /// The hosts (empty when `controller.hosts = "controller"`).
    pub hosts: Vec<HostConfig>,
}

impl Default for DeployConfig {
    fn default() -> Self {
        DeployConfig {
            name: DEFAULT_NAME.to_string(),
            store: PathBuf::from(DEFAULT_STORE),
            rollout: RolloutConfig::default(),
            probe: DeployProbeConfig::default(),
            install: InstallConfig::default(),
            drain: DrainConfig::default(),
            controller: DeployControllerConfig::default(),
            lb: DeployLbConfig::default(),
            hosts: Vec::new(),
        }
    }
}

/// Probing hosts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeployProbeConfig {
    /// Time between two rounds of probes (and polls of the policy). Defaults to 2 s.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Timeout of one probe. Defaults to 2 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Health path appended to each host's URL. Defaults to `/health`.
    pub path: String,
    /// A check of the health answer whose `observedValue` (0..1) is the host's error
    /// rate sample; without it, each probe is a sample of 0 (serving) or 1 (not).
    /// Defaults to none.
    pub error_rate_check: Option<String>,
}

impl Default for DeployProbeConfig {
    fn default() -> Self {
        DeployProbeConfig {
            interval: DEFAULT_PROBE_INTERVAL,
            timeout: DEFAULT_PROBE_TIMEOUT,
            path: DEFAULT_PROBE_PATH.to_string(),
            error_rate_check: None,
        }
    }
}

/// How a revision is installed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstallKind {
    /// Run a command (the default).
    #[default]
    Exec,
    /// POST a signed JSON event.
    Webhook,
}

/// The install step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InstallConfig {
    /// `exec` (default) or `webhook`.
    pub kind: InstallKind,
    /// The command, when `kind = "exec"`.
    pub exec: InstallExecConfig,
    /// The webhook, when `kind = "webhook"` (signed like the controller's).
    pub webhook: InstallWebhookConfig,
}

/// The install command. The controller's `ExecConfig` with a longer default timeout
/// (its own type: a nested table takes its defaults from its own type).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InstallExecConfig {
    /// Program and arguments (`{host}`, `{url}`, `{zone}`, `{revision}`, `{key}`
    /// replaced); the `VIGIL_*` variables say the same.
    pub command: Vec<String>,
    /// Kill the command after this long (the install failed). Defaults to 10 minutes.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for InstallExecConfig {
    fn default() -> Self {
        InstallExecConfig {
            command: Vec::new(),
            timeout: DEFAULT_INSTALL_TIMEOUT,
        }
    }
}

/// The install webhook: the controller's `WebhookConfig` with a longer default timeout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InstallWebhookConfig {
    /// `http://` URL to POST the install event to.
    pub url: String,
    /// HMAC-SHA256 key for the `X-Vigil-Signature` header; `VIGIL_WEBHOOK_SECRET` wins.
    pub secret: Option<String>,
    /// Retries after the first attempt. Defaults to 5.
    pub retries: u32,
    /// First backoff, doubled each retry. Defaults to 500 ms.
    #[serde(with = "humantime_serde")]
    pub backoff: Duration,
    /// Timeout of one request (the receiver answers once installed). Defaults to 10
    /// minutes.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for InstallWebhookConfig {
    fn default() -> Self {
        InstallWebhookConfig {
            url: String::new(),
            secret: None,
            retries: DEFAULT_WEBHOOK_RETRIES,
            backoff: DEFAULT_WEBHOOK_BACKOFF,
            timeout: DEFAULT_INSTALL_TIMEOUT,
        }
    }
}

impl InstallWebhookConfig {
    /// As the controller's webhook settings (what the shared sender takes).
    pub fn as_webhook(&self) -> WebhookConfig {
        WebhookConfig {
            url: self.url.clone(),
            secret: self.secret.clone(),
            retries: self.retries,
            backoff: self.backoff,
            timeout: self.timeout,
        }
    }
}

/// How hosts are drained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DrainKind {
    /// No drain step: a host goes straight to its install (the default).
    #[default]
    None,
    /// Run a command (`VIGIL_DRAIN` is `drain` or `undrain`).
    Exec,
    /// `POST` the URL to drain, `DELETE` it to undrain (a balancer's admin API).
    Http,
}

/// The drain step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrainConfig {
    /// `none` (default), `exec` or `http`.
    pub kind: DrainKind,
    /// The command, when `kind = "exec"`.
    pub command: Vec<String>,
    /// The URL, when `kind = "http"`; `{host}` is replaced by the host's id.
    pub url: String,
    /// Bearer token sent with the HTTP call (`VIGIL_DRAIN_TOKEN` wins). Defaults to none.
    pub token: Option<String>,
    /// Timeout of one drain or undrain. Defaults to 1 minute.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig {
            kind: DrainKind::None,
            command: Vec::new(),
            url: String::new(),
            token: None,
            timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

/// Where the hosts come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostSource {
    /// The `[[hosts]]` tables (the default).
    #[default]
    Config,
    /// The controller's targets (`GET /api/targets`), selected by `group` and `zone`,
    /// read when a rollout starts or resumes.
    Controller,
}

/// `[controller]`: a `vigil controller` whose view counts. Each probe round the
/// deployer reads its `GET /api/targets`: a host it holds, quarantines or judges
/// unhealthy ([`Standing::is_held`](vigil_core::fleet::Standing::is_held)) counts as out of service and is not touched; when it
/// cannot be read, no new wave starts (fail closed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeployControllerConfig {
    /// The controller's API (`http://host:port`). Defaults to none (no controller).
    pub url: String,
    /// Bearer token sent with each read (reads are open on the controller itself; a
    /// proxy in front may want one). `VIGIL_API_TOKEN` wins. Defaults to none.
    pub token: Option<String>,
    /// Timeout of one read. Defaults to 2 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// `config` (the `[[hosts]]` tables, the default) or `controller` (its targets).
    pub hosts: HostSource,
    /// With `hosts = "controller"`: only targets of this group. Defaults to any.
    pub group: String,
    /// With `hosts = "controller"`: only targets of this zone. Defaults to any.
    pub zone: String,
}

impl Default for DeployControllerConfig {
    fn default() -> Self {
        DeployControllerConfig {
            url: String::new(),
            token: None,
            timeout: DEFAULT_CONTROLLER_TIMEOUT,
            hosts: HostSource::Config,
            group: String::new(),
            zone: String::new(),
        }
    }
}

impl DeployControllerConfig {
    /// Whether a controller is configured.
    pub fn is_set(&self) -> bool {
        !self.url.is_empty()
    }

    /// The token in force: `VIGIL_API_TOKEN` if set and non-empty, else the config's.
    pub fn token(&self) -> Option<String> {
        std::env::var("VIGIL_API_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
            .or_else(|| self.token.clone().filter(|t| !t.is_empty()))
    }
}

/// `[lb]`: the `vigil lb`s in front of the hosts. Each probe round the deployer reads
/// their admin `/metrics` (`vigil_lb_requests_total` per target and code) and the
/// verdict weighs each wave by errors per request, new hosts against old
/// ([`super::balancer`]). Without one, the verdict is the host-reported rule
/// (`probe.error_rate_check` samples), and `deploy plan` says so.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeployLbConfig {
    /// Admin listeners (`http://host:port`) of every balancer in front of the hosts;
    /// their counts are summed. Defaults to none.
    pub admin: Vec<String>,
    /// Timeout of one read. Defaults to 2 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for DeployLbConfig {
    fn default() -> Self {
        DeployLbConfig {
            admin: Vec::new(),
            timeout: DEFAULT_LB_TIMEOUT,
        }
    }
}

impl DeployLbConfig {
    /// Whether a balancer is read.
    pub fn is_set(&self) -> bool {
        !self.admin.is_empty()
    }
}

/// One host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Unique id.
    pub id: String,
    /// Base URL (`http://host:port`); `probe.path` is appended.
    pub url: String,
    /// Zone label (waves stay within one zone by default).
    #[serde(default)]
    pub zone: String,
}

impl DeployConfig {
    /// Checks the values; the error names the bad key.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.name.is_empty() {
            return Err(Invalid::new("name", "must not be empty"));
        }
        if self.store.as_os_str().is_empty() {
            return Err(Invalid::new("store", "must name a file"));
        }
        self.rollout.validate().map_err(|e| e.within("rollout"))?;
        let p = &self.probe;
        if p.interval.is_zero() {
            return Err(Invalid::new("probe.interval", "must be longer than 0s"));
        }
        if p.timeout.is_zero() {
            return Err(Invalid::new("probe.timeout", "must be longer than 0s"));
        }
        if !p.path.starts_with('/') {
            return Err(Invalid::new(
                "probe.path",
                format!("must start with /, got {:?}", p.path),
            ));
        }
        if p.error_rate_check.as_deref() == Some("") {
            return Err(Invalid::new(
                "probe.error_rate_check",
                "must name a check (or be left out)",
            ));
        }
        match self.install.kind {
            InstallKind::Exec => {
                if self.install.exec.command.is_empty() {
                    return Err(Invalid::new(
                        "install.exec.command",
                        "must name a program when install.kind = \"exec\"",
                    ));
                }
                if self.install.exec.timeout.is_zero() {
                    return Err(Invalid::new(
                        "install.exec.timeout",
                        "must be longer than 0s",
                    ));
                }
            }
            InstallKind::Webhook => {
                let w = &self.install.webhook;
                if !w.url.starts_with("http://") {
                    return Err(Invalid::new(
                        "install.webhook.url",
                        format!(
                            "must be an http:// URL when install.kind = \"webhook\", got {:?}",
                            w.url
                        ),
                    ));
                }
                let env_secret = std::env::var("VIGIL_WEBHOOK_SECRET").is_ok_and(|s| !s.is_empty());
                if !env_secret && w.secret.as_deref().unwrap_or("").is_empty() {
                    return Err(Invalid::new(
                        "install.webhook.secret",
                        "must be set (or VIGIL_WEBHOOK_SECRET): install events are always signed",
                    ));
                }
                if w.timeout.is_zero() {
                    return Err(Invalid::new(
                        "install.webhook.timeout",
                        "must be longer than 0s",
                    ));
                }
            }
        }
        match self.drain.kind {
            DrainKind::None => {}
            DrainKind::Exec => {
                if self.drain.command.is_empty() {
                    return Err(Invalid::new(
                        "drain.command",
                        "must name a program when drain.kind = \"exec\"",
                    ));
                }
            }
            DrainKind::Http => {
                if !self.drain.url.starts_with("http://") {
                    return Err(Invalid::new(
                        "drain.url",
                        format!(
                            "must be an http:// URL when drain.kind = \"http\", got {:?}",
                            self.drain.url
                        ),
                    ));
                }
            }
        }
        if self.drain.timeout.is_zero() {
            return Err(Invalid::new("drain.timeout", "must be longer than 0s"));
        }
        let c = &self.controller;
        if c.is_set() && !c.url.starts_with("http://") {
            return Err(Invalid::new(
                "controller.url",
                format!("must be an http:// URL, got {:?}", c.url),
            ));
        }
        if c.timeout.is_zero() {
            return Err(Invalid::new("controller.timeout", "must be longer than 0s"));
        }
        for (i, a) in self.lb.admin.iter().enumerate() {
            if !a.starts_with("http://") || a.len() <= "http://".len() {
                return Err(Invalid::new(
                    format!("lb.admin[{i}]"),
                    format!("must be a balancer's admin http:// URL, got {a:?}"),
                ));
            }
        }
        if self.lb.timeout.is_zero() {
            return Err(Invalid::new("lb.timeout", "must be longer than 0s"));
        }
        match c.hosts {
            HostSource::Controller => {
                if !c.is_set() {
                    return Err(Invalid::new(
                        "controller.hosts",
                        "\"controller\" needs controller.url",
                    ));
                }
                if !self.hosts.is_empty() {
                    return Err(Invalid::new(
                        "hosts",
                        "must be left out when controller.hosts = \"controller\" (the hosts are the controller's targets)",
                    ));
                }
            }
            HostSource::Config => {
                if !c.group.is_empty() || !c.zone.is_empty() {
                    return Err(Invalid::new(
                        if c.group.is_empty() {
                            "controller.zone"
                        } else {
                            "controller.group"
                        },
                        "selects the controller's targets: only with controller.hosts = \"controller\"",
                    ));
                }
                if self.hosts.is_empty() {
                    return Err(Invalid::new("hosts", "must list at least one host"));
                }
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, h) in self.hosts.iter().enumerate() {
            let at = format!("hosts[{i}]");
            if h.id.is_empty() {
                return Err(Invalid::new(format!("{at}.id"), "must not be empty"));
            }
            if !seen.insert(h.id.as_str()) {
                return Err(Invalid::new(
                    format!("{at}.id"),
                    format!("{:?} is a duplicate", h.id),
                ));
            }
            if !h.url.starts_with("http://") {
                return Err(Invalid::new(
                    format!("{at}.url"),
                    format!(
                        "must be an http:// URL (no TLS stack by design), got {:?}",
                        h.url
                    ),
                ));
            }
            self.health_uri(h)
                .map_err(|e| Invalid::new(format!("{at}.url"), e))?;
        }
        Ok(())
    }

    /// The URI probed for host `h`: its URL and `probe.path`.
    pub fn health_uri(&self, h: &HostConfig) -> Result<http::Uri, String> {
        let url = format!("{}{}", h.url.trim_end_matches('/'), self.probe.path);
        url.parse::<http::Uri>()
            .map_err(|e| format!("{:?}: {e}", h.url))
    }

    /// The host with this id.
    pub fn host(&self, id: &str) -> Option<&HostConfig> {
        self.hosts.iter().find(|h| h.id == id)
    }
}

/// Loads, parses and validates a deploy config; `store` is resolved against the file's
/// directory.
pub fn load(path: &Path) -> Result<DeployConfig, vigil_config::ConfigError> {
    let text = vigil_config::read(path)?;
    let mut config: DeployConfig = vigil_config::from_str(path, &text)?;
    config
        .validate()
        .map_err(|e| vigil_config::invalid(path, &text, e))?;
    if config.store.is_relative() {
        config.store = path.parent().unwrap_or(Path::new(".")).join(&config.store);
    }
    Ok(config)
}

/// Parses config text (not validated; `load` does both).
pub fn parse(text: &str) -> Result<DeployConfig, vigil_config::ConfigError> {
    vigil_config::from_str(Path::new("deploy.toml"), text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "[install.exec]\ncommand = [\"true\"]\n[[hosts]]\nid = \"a\"\nurl = \"http://127.0.0.1:1\"\n";

    #[test]
    fn every_field_but_the_hosts_and_the_install_command_has_a_default() {
        let c = parse("").unwrap();
        assert_eq!(c, DeployConfig::default());
        assert_eq!(c.validate().unwrap_err().key, "install.exec.command");
        parse(MINIMAL).unwrap().validate().unwrap();
    }

    #[test]
    fn install_timeouts_default_to_ten_minutes_when_their_table_is_given() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.install.exec.timeout, DEFAULT_INSTALL_TIMEOUT);
        let c = parse("[install.webhook]\nurl = \"http://x\"\n").unwrap();
        assert_eq!(c.install.webhook.timeout, DEFAULT_INSTALL_TIMEOUT);
        assert_eq!(
            c.install.webhook.as_webhook().timeout,
            DEFAULT_INSTALL_TIMEOUT
        );
    }

    #[test]
    fn the_example_config_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/deploy.toml");
        let c = load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.hosts.len() >= 2);
    }

    #[test]
    fn unknown_keys_are_rejected_with_line_and_key() {
        let err = parse("[rollout]\nbake = \"1m\"\nbaek = \"2m\"\n").unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert_eq!(err.key.as_deref(), Some("rollout.baek"), "{err}");
    }

    #[test]
    fn rollout_keys_map_onto_the_policy() {
        let c = parse(&format!(
            "{MINIMAL}[rollout]\nmin_healthy = \"60%\"\nbake = \"30s\"\nzones = \"any\"\nmin_samples = 3\n"
        ))
        .unwrap();
        assert_eq!(
            c.rollout.min_healthy,
            vigil_core::rollout::Floor::Percent(60)
        );
        assert_eq!(c.rollout.bake, Duration::from_secs(30));
        assert_eq!(c.rollout.zones, vigil_core::rollout::Zones::Any);
        assert_eq!(c.rollout.min_samples, 3);
        let c = parse(&format!("{MINIMAL}[rollout]\nmin_healthy = 2\n")).unwrap();
        assert_eq!(c.rollout.min_healthy, vigil_core::rollout::Floor::Count(2));
    }

    #[test]
    fn validate_names_the_bad_key() {
        let bad = |toml: &str| parse(toml).unwrap().validate().unwrap_err().key;
        assert_eq!(
            bad(&format!("{MINIMAL}[rollout]\nalpha = 2.0")),
            "rollout.alpha"
        );
        assert_eq!(
            bad(&format!("{MINIMAL}[probe]\npath = \"health\"")),
            "probe.path"
        );
        assert_eq!(
            bad(&format!("{MINIMAL}[drain]\nkind = \"http\"")),
            "drain.url"
        );
        assert_eq!(
            bad(&format!("{MINIMAL}[drain]\nkind = \"exec\"")),
            "drain.command"
        );
        assert_eq!(
            bad(&format!(
                "{MINIMAL}[[hosts]]\nid = \"a\"\nurl = \"http://x\""
            )),
            "hosts[1].id"
        );
        assert_eq!(
            bad("[install.exec]\ncommand = [\"true\"]\n[[hosts]]\nid = \"a\"\nurl = \"https://x\""),
            "hosts[0].url"
        );
        assert_eq!(bad("[install.exec]\ncommand = [\"true\"]"), "hosts");
        assert_eq!(
            bad(&format!("{MINIMAL}[controller]\nurl = \"https://c\"")),
            "controller.url"
        );
        assert_eq!(
            bad(&format!("{MINIMAL}[controller]\nhosts = \"controller\"")),
            "controller.hosts"
        );
        assert_eq!(
            bad(&format!(
                "{MINIMAL}[controller]\nurl = \"http://c\"\nhosts = \"controller\""
            )),
            "hosts"
        );
        assert_eq!(
            bad(&format!(
                "{MINIMAL}[controller]\nurl = \"http://c\"\ngroup = \"web\""
            )),
            "controller.group"
        );
        let c = parse(
            "[install.exec]\ncommand = [\"true\"]\n[controller]\nurl = \"http://c:1\"\nhosts = \"controller\"\ngroup = \"web\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.controller.hosts, HostSource::Controller);
        assert_eq!(
            bad("[install]\nkind = \"webhook\"\n[[hosts]]\nid = \"a\"\nurl = \"http://x\""),
            "install.webhook.url"
        );
        assert_eq!(
            bad(&format!(
                "{MINIMAL}[lb]\nadmin = [\"http://127.0.0.1:9901\", \"127.0.0.1:9902\"]"
            )),
            "lb.admin[1]"
        );
        let c = parse(&format!(
            "{MINIMAL}[lb]\nadmin = [\"http://127.0.0.1:9901\"]"
        ))
        .unwrap();
        c.validate().unwrap();
        assert!(c.lb.is_set());
        assert_eq!(c.lb.timeout, DEFAULT_LB_TIMEOUT);
    }
}
