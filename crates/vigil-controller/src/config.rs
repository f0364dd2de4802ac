//! The controller's configuration (`fleet.toml`): one struct per part, every default a
//! named constant, loading that names the file, line and key of any mistake.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vigil_core::Invalid;
use vigil_core::anomaly::AnomalyConfig;
use vigil_core::guard::GuardConfig;
use vigil_core::judge::Answers;

pub use crate::aws::config::{AwsActMode, AwsActuatorConfig, AwsConfig, AwsDiscoveryConfig};

/// Default listen address: loopback only, so a fresh install exposes nothing; 9400 is
/// free in the Prometheus exporter port registry's neighbourhood.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9400";
/// Default data directory: relative to the working directory, created on first run.
pub const DEFAULT_DATA_DIR: &str = "vigil-data";
/// Default probe interval: 10 s (the default), a deep check every 10 s per
/// target is cheap for the target and fast enough for replacement decisions.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(10);
/// Default probe timeout: 2 s. A deep-health endpoint answers from a cached snapshot;
/// anything slower than this is itself a symptom.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Default jitter: 10% of the interval, enough to spread a fleet's probes after a
/// restart without making the interval meaningless.
pub const DEFAULT_PROBE_JITTER: f64 = 0.1;
/// Default probe concurrency: 512 in flight. At 2 s timeout that is 256 probes/s even
/// when every target hangs, and far more when they answer.
pub const DEFAULT_PROBE_CONCURRENCY: usize = 512;
/// Default health path: `/health`, the deep (dependency) health endpoint of vigil's
/// library; the controller judges deep health, load balancers use `/readyz`.
pub const DEFAULT_PROBE_PATH: &str = "/health";
/// Default rule for what counts as a health answer: `plain-status`, so a fleet of
/// ordinary servers (no health+json endpoint) is judged by its status codes, 2xx-3xx
/// pass, instead of failing as a whole on its first probes and freezing the guard.
pub const DEFAULT_PROBE_ANSWERS: Answers = Answers::PlainStatus;
/// Default largest health body read: vigil-core's `MAX_REPORT_BYTES` (64 KiB).
pub const DEFAULT_MAX_BODY: usize = vigil_core::report::MAX_REPORT_BYTES;
/// Default heartbeat TTL: 30 s, three missed 10 s heartbeats.
pub const DEFAULT_HEARTBEAT_TTL: Duration = Duration::from_secs(30);
/// Default heartbeat replay window: a signed heartbeat's timestamp may differ from the
/// controller's clock by at most 30 s. NTP keeps clocks within milliseconds; 30 s
/// tolerates a badly kept worker clock while bounding how long a captured heartbeat
/// that never arrived could be replayed (one that arrived never can: timestamps must
/// increase per target).
pub const DEFAULT_HEARTBEAT_MAX_SKEW: Duration = Duration::from_secs(30);
/// Default discovery poll: 2 s. Polling a small file is cheap and needs no inotify.
pub const DEFAULT_DISCOVERY_POLL: Duration = Duration::from_secs(2);
/// Default webhook retries: 5, with doubling backoff about half a minute in total.
pub const DEFAULT_WEBHOOK_RETRIES: u32 = 5;
/// Default first webhook backoff: 500 ms, doubling each retry.
pub const DEFAULT_WEBHOOK_BACKOFF: Duration = Duration::from_millis(500);
/// Default actuator timeout (webhook request, exec command): 10 s.
pub const DEFAULT_ACTUATOR_TIMEOUT: Duration = Duration::from_secs(10);
/// Default life of a liveness restart permit (`actuator.liveness.ttl`): 60 s. The
/// instance collects it on its next liveness probe, and the kubelet restarts only after
/// `failureThreshold` failed probes in a row (default 3 every `periodSeconds`, default
/// 10 s: 30 s), each of which the permit must answer "restart"; 60 s covers that twice.
/// It is not tied to the controller's probe interval: the kubelet's period is what
/// the permit waits for.
pub const DEFAULT_LIVENESS_TTL: Duration = Duration::from_secs(60);
/// Default snapshot interval of the guard state: 30 s (the op log in between is
/// replayed on restart, so this only bounds the replay).
pub const DEFAULT_SNAPSHOT_EVERY: Duration = Duration::from_secs(30);
/// Default number of recent probes kept per target in memory for the API: 10, enough
/// to see a flap pattern; each costs about 80 bytes per target.
pub const DEFAULT_HISTORY: usize = 10;
/// Default: keep probe connections open between probes (one pooled connection per
/// target): cheapest in CPU and kinder to targets than a new connection per probe.
pub const DEFAULT_KEEP_ALIVE: bool = true;

/// The whole configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// Address of the API, dashboard and metrics. Defaults to 127.0.0.1:9400.
    pub listen: SocketAddr,
    /// Directory of the SQLite store (`vigil.db`). Defaults to `vigil-data`.
    pub data_dir: PathBuf,
    /// Bearer token for mutating API calls; the `VIGIL_API_TOKEN` environment variable
    /// wins when set. Without either, every mutating call is refused.
    pub api_token: Option<String>,
    /// How targets are probed.
    pub probe: ProbeConfig,
    /// Push (heartbeat) targets.
    pub heartbeat: HeartbeatConfig,
    /// The safety guard.
    pub guard: GuardConfig,
    /// What happens when the guard acts.
    pub actuator: ActuatorConfig,
    /// A watched file, or Auto Scaling groups, listing more targets.
    pub discovery: Option<DiscoveryConfig>,
    /// How AWS is reached (the `aws-autoscaling` actuator, `[discovery.aws]`).
    pub aws: AwsConfig,
    /// The store: SQLite in `data_dir` (the default), or PostgreSQL (`store = "postgres://..."`
    /// or `[store] url`), and its tuning.
    #[serde(deserialize_with = "store_or_url")]
    pub store: StoreConfig,
    /// Several replicas on one PostgreSQL store: this replica's id and the leader lease.
    pub replicas: ReplicasConfig,
    /// How queue workers (heartbeat targets that report counters) are compared with the
    /// other workers of their group: `vigil_core::anomaly`'s keys.
    pub anomaly: AnomalyConfig,
    /// What the dashboard shows besides the controller.
    pub dashboard: DashboardConfig,
    /// Static targets.
    pub targets: Vec<TargetConfig>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            api_token: None,
            probe: ProbeConfig::default(),
            heartbeat: HeartbeatConfig::default(),
            guard: GuardConfig::default(),
            actuator: ActuatorConfig::default(),
            discovery: None,
            aws: AwsConfig::default(),
            store: StoreConfig::default(),
            replicas: ReplicasConfig::default(),
            anomaly: AnomalyConfig::default(),
            dashboard: DashboardConfig::default(),
            targets: Vec::new(),
        }
    }
}

/// The dashboard.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DashboardConfig {
    /// Admin addresses (`admin_listen`, as `http://host:port`) of `vigil lb` instances
    /// whose pools the dashboard shows beside the guard. Empty by default.
    pub balancers: Vec<String>,
}

/// Probing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProbeConfig {
    /// Time between two probes of a target. Defaults to 10 s.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Whole-probe timeout (connect, request, body). Defaults to 2 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Random jitter, as a fraction of the interval (0..0.5). Defaults to 0.1.
    pub jitter: f64,
    /// Probes in flight at most. Defaults to 512.
    pub concurrency: usize,
    /// Path of the deep-health endpoint. Defaults to `/health`.
    pub path: String,
    /// What counts as a health answer (`vigil_core::judge`'s rule table):
    /// `plain-status` judges an answer that is not health+json by its status code
    /// (2xx-3xx pass, else fail); `health+json` fails such answers as garbage. A
    /// health+json body decides either way. Defaults to `plain-status`.
    pub answers: Answers,
    /// Largest body read. Defaults to 64 KiB.
    pub max_body: usize,
    /// Recent probes kept per target for the API. Defaults to 10.
    pub history: usize,
    /// Keep a pooled connection per target between probes (true), or connect for every
    /// probe (false: less memory per target, more CPU). Needs a restart to change.
    /// Defaults to true.
    pub keep_alive: bool,
    /// A PEM file of CA certificates trusted for `https://` targets besides the
    /// system's roots (a private CA); relative to the config file. Read at start: needs
    /// a restart to change. Defaults to none (the system's roots only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            interval: DEFAULT_PROBE_INTERVAL,
            timeout: DEFAULT_PROBE_TIMEOUT,
            jitter: DEFAULT_PROBE_JITTER,
            concurrency: DEFAULT_PROBE_CONCURRENCY,
            path: DEFAULT_PROBE_PATH.to_string(),
            answers: DEFAULT_PROBE_ANSWERS,
            max_body: DEFAULT_MAX_BODY,
            history: DEFAULT_HISTORY,
            keep_alive: DEFAULT_KEEP_ALIVE,
            ca_file: None,
        }
    }
}

/// Push targets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HeartbeatConfig {
    /// A heartbeat target with no heartbeat for this long fails its probe. Defaults to 30 s.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// The key each heartbeat target's own signing key is derived from
    /// (`vigil controller heartbeat-key <id>` prints it); `VIGIL_HEARTBEAT_SECRET` wins.
    /// Required as soon as a target has `heartbeat = true`. Defaults to none.
    pub secret: Option<String>,
    /// Largest difference between a heartbeat's signed timestamp and the controller's
    /// clock. Defaults to 30 s.
    #[serde(with = "humantime_serde")]
    pub max_skew: Duration,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig {
            ttl: DEFAULT_HEARTBEAT_TTL,
            secret: None,
            max_skew: DEFAULT_HEARTBEAT_MAX_SKEW,
        }
    }
}

impl HeartbeatConfig {
    /// The heartbeat secret in force: `VIGIL_HEARTBEAT_SECRET` if set and non-empty,
    /// else the config's.
    pub fn effective_secret(&self) -> Option<String> {
        std::env::var("VIGIL_HEARTBEAT_SECRET")
            .ok()
            .filter(|t| !t.is_empty())
            .or_else(|| self.secret.clone().filter(|t| !t.is_empty()))
    }

    /// Refuses heartbeat targets when no secret is set: their heartbeats could not be
    /// verified, so every one would be refused and the targets replaced for it.
    pub fn check_targets(&self, targets: &[TargetConfig], what: &str) -> Result<(), Invalid> {
        if let Some(i) = targets.iter().position(|t| t.heartbeat)
            && self.effective_secret().is_none()
        {
            return Err(Invalid::new(
                format!("{what}[{i}].heartbeat"),
                format!(
                    "is true for {:?} but heartbeat.secret (or VIGIL_HEARTBEAT_SECRET) is not set: heartbeats are always signed",
                    targets[i].id
                ),
            ));
        }
        Ok(())
    }
}

/// Which actuator runs when the guard acts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActuatorKind {
    /// Log the action only (a dry run). The default: nothing is replaced until an
    /// operator chooses an actuator.
    #[default]
    Log,
    /// POST a signed JSON event.
    Webhook,
    /// Run a command.
    Exec,
    /// Ask the instance's AWS Auto Scaling group to replace it (`[actuator.aws]`).
    #[serde(rename = "aws-autoscaling")]
    AwsAutoscaling,
    /// Grant the instance a restart permit, which its liveness probe (`vigil check
    /// --fleet`) collects from `GET /api/targets/{id}/liveness` (`[actuator.liveness]`).
    Liveness,
}

/// The actuator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActuatorConfig {
    /// `log` (default), `webhook`, `exec`, `aws-autoscaling` or `liveness`.
    pub kind: ActuatorKind,
    /// Settings of the webhook actuator.
    pub webhook: WebhookConfig,
    /// Settings of the exec actuator.
    pub exec: ExecConfig,
    /// Settings of the aws-autoscaling actuator.
    pub aws: AwsActuatorConfig,
    /// Settings of the liveness actuator.
    pub liveness: LivenessConfig,
}

/// Liveness actuator: an action is a restart permit for the target, collected by its
/// liveness probe (`vigil check --fleet`); see `crate::actuator::Permits`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LivenessConfig {
    /// How long a permit waits to be collected, and answers "restart" once collected.
    /// An uncollected permit then fails its action. Defaults to 60 s.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        LivenessConfig {
            ttl: DEFAULT_LIVENESS_TTL,
        }
    }
}

/// Webhook actuator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookConfig {
    /// `http://` URL to POST the event to.
    pub url: String,
    /// HMAC-SHA256 key for the `X-Vigil-Signature` header; `VIGIL_WEBHOOK_SECRET` wins.
    pub secret: Option<String>,
    /// Retries after the first attempt. Defaults to 5.
    pub retries: u32,
    /// First backoff, doubled each retry. Defaults to 500 ms.
    #[serde(with = "humantime_serde")]
    pub backoff: Duration,
    /// Timeout of one request. Defaults to 10 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            url: String::new(),
            secret: None,
            retries: DEFAULT_WEBHOOK_RETRIES,
            backoff: DEFAULT_WEBHOOK_BACKOFF,
            timeout: DEFAULT_ACTUATOR_TIMEOUT,
        }
    }
}

/// Exec actuator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecConfig {
    /// Program and arguments; the target is passed in `VIGIL_TARGET_*` variables.
    pub command: Vec<String>,
    /// Kill the command after this long. Defaults to 10 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            command: Vec::new(),
            timeout: DEFAULT_ACTUATOR_TIMEOUT,
        }
    }
}

/// Discovery: a watched file, Auto Scaling groups, or both.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// The file: `.json` (an array of targets, or `{"targets": [...]}`) or `.toml`
    /// (`[[targets]]`). Relative paths are relative to the config file. Required
    /// unless `aws` is set.
    pub path: PathBuf,
    /// How often it is checked for changes. Defaults to 2 s.
    #[serde(with = "humantime_serde")]
    pub poll: Duration,
    /// Targets from AWS Auto Scaling groups.
    pub aws: Option<AwsDiscoveryConfig>,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            path: PathBuf::new(),
            poll: DEFAULT_DISCOVERY_POLL,
            aws: None,
        }
    }
}

impl DiscoveryConfig {
    /// The discovery file, if one is configured.
    pub fn file(&self) -> Option<&Path> {
        (!self.path.as_os_str().is_empty()).then_some(self.path.as_path())
    }
}

/// The store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// A PostgreSQL URL (`postgres://user@host:5432/db?options=-csearch_path%3Dvigil`):
    /// several replicas share it, one leads (see `[replicas]`). Defaults to none: SQLite
    /// in `data_dir`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// How often the guard state is snapshotted when it changed since the last snapshot
    /// (every 10 minutes regardless); the op log since is replayed on restart.
    /// Defaults to 30 s.
    #[serde(with = "humantime_serde")]
    pub snapshot_every: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            url: None,
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
        }
    }
}

/// `store = "postgres://..."` (the URL alone) or a `[store]` table.
fn store_or_url<'de, D: serde::Deserializer<'de>>(d: D) -> Result<StoreConfig, D::Error> {
    struct UrlOrTable;
    impl<'de> serde::de::Visitor<'de> for UrlOrTable {
        type Value = StoreConfig;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a PostgreSQL URL (\"postgres://...\") or a [store] table")
        }
        fn visit_str<E: serde::de::Error>(self, url: &str) -> Result<StoreConfig, E> {
            Ok(StoreConfig {
                url: Some(url.to_string()),
                ..StoreConfig::default()
            })
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<StoreConfig, A::Error> {
            StoreConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_any(UrlOrTable)
}

/// Default lease TTL: `vigil_core::lease::DEFAULT_TTL` (10 s): a failover takes about
/// this; shorter makes a slow database demote a healthy leader.
pub const DEFAULT_LEASE_TTL: Duration = vigil_core::lease::DEFAULT_TTL;

/// Several replicas on one PostgreSQL store (ignored with SQLite).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplicasConfig {
    /// This replica's id, unique among the replicas (the lease's holder). Defaults to
    /// `<hostname>-<pid>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// How long the leader lease lasts without renewal; the leader renews it every
    /// third of it and stops acting a fifth of it before it ends. Defaults to 10 s.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// How many live replicas probe each target (rendezvous hashing); a target is
    /// judged failing only when all of them see it fail. Defaults to 2.
    pub probers: usize,
}

/// Default probers per target: `vigil_core::shard::DEFAULT_PROBERS` (2): the least
/// that keeps one partitioned prober from making a target unhealthy alone.
pub const DEFAULT_PROBERS: usize = vigil_core::shard::DEFAULT_PROBERS;

impl Default for ReplicasConfig {
    fn default() -> Self {
        ReplicasConfig {
            id: None,
            lease_ttl: DEFAULT_LEASE_TTL,
            probers: DEFAULT_PROBERS,
        }
    }
}

impl ReplicasConfig {
    /// The id in force: the configured one, else `<hostname>-<pid>`.
    pub fn effective_id(&self) -> String {
        self.id
            .clone()
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| {
                let host = rustix::system::uname()
                    .nodename()
                    .to_string_lossy()
                    .into_owned();
                format!("{host}-{}", std::process::id())
            })
    }

    /// The lease settings for the TTL.
    pub fn lease(&self) -> vigil_core::lease::LeaseConfig {
        vigil_core::lease::LeaseConfig::new(self.lease_ttl)
    }
}

/// One target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// Unique id.
    pub id: String,
    /// Base URL (`http://host:port` or `https://host:port`); the probe path is
    /// appended. Not needed for heartbeat targets.
    #[serde(default)]
    pub url: String,
    /// Zone label (the fraction cap also applies per zone).
    #[serde(default)]
    pub zone: String,
    /// Group label (shown, passed to actuators).
    #[serde(default)]
    pub group: String,
    /// A push target: it sends `POST /api/heartbeat` instead of being probed.
    #[serde(default)]
    pub heartbeat: bool,
    /// This target's own probe interval, e.g. `"30s"`. Defaults to `probe.interval`.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub interval: Option<Duration>,
}

impl TargetConfig {
    /// Checks one target; the error names the key.
    pub fn validate(&self, at: &str) -> Result<(), Invalid> {
        if self.id.is_empty() {
            return Err(Invalid::new(format!("{at}.id"), "must not be empty"));
        }
        if self.interval.is_some_and(|i| i.is_zero()) {
            return Err(Invalid::new(
                format!("{at}.interval"),
                "must be longer than 0s",
            ));
        }
        if !self.heartbeat {
            // https:// is verified against the system's roots and `probe.ca_file`
            // (vigil-probe).
            if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
                return Err(Invalid::new(
                    format!("{at}.url"),
                    format!("must be an http:// or https:// URL, got {:?}", self.url),
                ));
            }
            self.url
                .parse::<http::Uri>()
                .map_err(|e| Invalid::new(format!("{at}.url"), format!("{:?}: {e}", self.url)))?;
        }
        Ok(())
    }
}

/// Checks a list of targets (unique ids, valid URLs): the first problem.
pub fn validate_targets(targets: &[TargetConfig], what: &str) -> Result<(), Invalid> {
    target_problems(targets, what)
        .into_iter()
        .next()
        .map_or(Ok(()), Err)
}

/// Every problem of a list of targets, one per target at most.
fn target_problems(targets: &[TargetConfig], what: &str) -> Vec<Invalid> {
    let mut seen = std::collections::BTreeSet::new();
    let mut bad = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        if let Err(e) = t.validate(&format!("{what}[{i}]")) {
            bad.push(e);
        } else if !seen.insert(t.id.as_str()) {
            bad.push(Invalid::new(
                format!("{what}[{i}].id"),
                format!("{:?} is a duplicate", t.id),
            ));
        }
    }
    bad
}

impl ControllerConfig {
    /// Checks the values; the error names the bad key (the first of [`Self::problems`]).
    pub fn validate(&self) -> Result<(), Invalid> {
        self.problems().into_iter().next().map_or(Ok(()), Err)
    }

    /// Every value that cannot be used, each naming its key, in the file's order of
    /// sections. One per check: a policy section (`guard`, `anomaly`, `aws`, ...) whose
    /// own `validate` stops at its first reports that one.
    pub fn problems(&self) -> Vec<Invalid> {
        let mut bad = Vec::new();
        for (i, url) in self.dashboard.balancers.iter().enumerate() {
            let ok = url.starts_with("http://")
                && url.parse::<http::Uri>().is_ok_and(|u| u.host().is_some());
            if !ok {
                bad.push(Invalid::new(
                    format!("dashboard.balancers[{i}]"),
                    format!(
                        "must be a vigil lb admin address like \"http://127.0.0.1:9101\", got {url:?}"
                    ),
                ));
            }
        }
        let p = &self.probe;
        if p.interval.is_zero() {
            bad.push(Invalid::new("probe.interval", "must be longer than 0s"));
        }
        if p.timeout.is_zero() {
            bad.push(Invalid::new("probe.timeout", "must be longer than 0s"));
        }
        if !(0.0..=0.5).contains(&p.jitter) {
            bad.push(Invalid::new(
                "probe.jitter",
                format!("must be within 0..0.5, got {}", p.jitter),
            ));
        }
        if p.concurrency == 0 {
            bad.push(Invalid::new("probe.concurrency", "must be at least 1"));
        }
        if !p.path.starts_with('/') {
            bad.push(Invalid::new(
                "probe.path",
                format!("must start with /, got {:?}", p.path),
            ));
        }
        if p.max_body == 0 {
            bad.push(Invalid::new("probe.max_body", "must be at least 1"));
        }
        if self.heartbeat.ttl.is_zero() {
            bad.push(Invalid::new("heartbeat.ttl", "must be longer than 0s"));
        }
        if self.heartbeat.max_skew.is_zero() {
            bad.push(Invalid::new("heartbeat.max_skew", "must be longer than 0s"));
        }
        bad.extend(self.guard.validate().err().map(|e| e.within("guard")));
        bad.extend(self.anomaly.validate().err().map(|e| e.within("anomaly")));
        match self.actuator.kind {
            ActuatorKind::Log => {}
            ActuatorKind::Webhook => {
                if !self.actuator.webhook.url.starts_with("http://") {
                    bad.push(Invalid::new(
                        "actuator.webhook.url",
                        format!(
                            "must be an http:// URL when actuator.kind = \"webhook\", got {:?}",
                            self.actuator.webhook.url
                        ),
                    ));
                }
                let env_secret = std::env::var("VIGIL_WEBHOOK_SECRET").is_ok_and(|s| !s.is_empty());
                if !env_secret
                    && self
                        .actuator
                        .webhook
                        .secret
                        .as_deref()
                        .unwrap_or("")
                        .is_empty()
                {
                    bad.push(Invalid::new(
                        "actuator.webhook.secret",
                        "must be set (or VIGIL_WEBHOOK_SECRET): webhook events are always signed",
                    ));
                }
            }
            ActuatorKind::Exec => {
                if self.actuator.exec.command.is_empty() {
                    bad.push(Invalid::new(
                        "actuator.exec.command",
                        "must name a program when actuator.kind = \"exec\"",
                    ));
                }
            }
            ActuatorKind::AwsAutoscaling => {}
            ActuatorKind::Liveness => {
                if self.actuator.liveness.ttl.is_zero() {
                    bad.push(Invalid::new(
                        "actuator.liveness.ttl",
                        "must be longer than 0s (the instance collects its permit within it)",
                    ));
                }
            }
        }
        let aws_discovery = self.discovery.as_ref().and_then(|d| d.aws.as_ref());
        if let Some(a) = aws_discovery {
            bad.extend(a.validate().err().map(|e| e.within("discovery.aws")));
        }
        bad.extend(
            self.aws
                .validate(
                    self.actuator.kind == ActuatorKind::AwsAutoscaling || aws_discovery.is_some(),
                )
                .err()
                .map(|e| e.within("aws")),
        );
        if let Some(d) = &self.discovery {
            if d.path.as_os_str().is_empty() && d.aws.is_none() {
                bad.push(Invalid::new(
                    "discovery.path",
                    "must name a file (or set [discovery.aws])",
                ));
            }
            if d.poll.is_zero() {
                bad.push(Invalid::new("discovery.poll", "must be longer than 0s"));
            }
        }
        if self.store.snapshot_every.is_zero() {
            bad.push(Invalid::new(
                "store.snapshot_every",
                "must be longer than 0s",
            ));
        }
        if let Some(url) = &self.store.url
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            bad.push(Invalid::new(
                "store.url",
                format!(
                    "must be a PostgreSQL URL (postgres://...), got {:?}",
                    crate::store::pg::redact(url)
                ),
            ));
        }
        if self.replicas.probers == 0 {
            bad.push(Invalid::new("replicas.probers", "must be at least 1"));
        }
        if self.replicas.id.as_deref() == Some("") {
            bad.push(Invalid::new("replicas.id", "must not be empty"));
        }
        if self.replicas.lease().validate().is_err() {
            bad.push(Invalid::new("replicas.lease_ttl", "must be at least 3ms"));
        }
        bad.extend(target_problems(&self.targets, "targets"));
        bad.extend(self.heartbeat.check_targets(&self.targets, "targets").err());
        bad
    }

    /// The API token in force: `VIGIL_API_TOKEN` if set and non-empty, else the config's.
    pub fn effective_token(&self) -> Option<String> {
        std::env::var("VIGIL_API_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
            .or_else(|| self.api_token.clone().filter(|t| !t.is_empty()))
    }
}

/// Why a config file was refused: file, line, column, key path and the offending line
/// (the one implementation every vigil TOML file shares).
pub use vigil_config::{ConfigError, ErrorKind};

/// Loads, parses and validates a config file; the error lists every value that cannot
/// be used. Relative paths inside (data dir, discovery file, `probe.ca_file`) are
/// resolved against the file's directory.
pub fn load(path: &Path) -> Result<ControllerConfig, ConfigError> {
    load_with(path, |_| None)
}

/// [`load`], and `listen` must be free now (`check-config`, like `nginx -t`: a daemon
/// started on this file must be able to listen).
pub fn check(path: &Path) -> Result<ControllerConfig, ConfigError> {
    load_with(path, |c| {
        vigil_config::try_bind("listen", c.listen, "controller").err()
    })
}

fn load_with(
    path: &Path,
    more: impl Fn(&ControllerConfig) -> Option<Invalid>,
) -> Result<ControllerConfig, ConfigError> {
    let text = vigil_config::read(path)?;
    let mut config: ControllerConfig = vigil_config::from_str(path, &text)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut bad = config.problems();
    if let Some(ca) = &mut config.probe.ca_file {
        if ca.is_relative() {
            *ca = base.join(&*ca);
        }
        // Read now, as the prober will at start: a CA file that cannot be used is a
        // bad config, not a failure of every https probe.
        if let Err(e) = vigil_probe::CaFile::read(ca) {
            bad.push(Invalid::new("probe.ca_file", e.to_string()));
        }
    }
    bad.extend(more(&config));
    vigil_config::invalid_all(path, &text, bad)?;
    if config.data_dir.is_relative() {
        config.data_dir = base.join(&config.data_dir);
    }
    if let Some(d) = &mut config.discovery
        && d.path.is_relative()
        && d.file().is_some()
    {
        d.path = base.join(&d.path);
    }
    Ok(config)
}

/// Parses config text (not validated; `load` does both); the error names line,
/// column and key.
pub fn parse(text: &str) -> Result<ControllerConfig, ConfigError> {
    vigil_config::from_str(Path::new("fleet.toml"), text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_has_a_default() {
        let c = parse("").unwrap();
        assert_eq!(c, ControllerConfig::default());
        c.validate().unwrap();
    }

    #[test]
    fn the_example_config_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/fleet.toml");
        let c = load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.targets.is_empty());
    }

    #[test]
    fn every_bad_value_is_reported_not_only_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.toml");
        std::fs::write(
            &path,
            "[probe]\ninterval = \"0s\"\njitter = 0.9\n[heartbeat]\nttl = \"0s\"\n\
             [[targets]]\nid = \"a\"\nurl = \"ftp://a\"\n[[targets]]\nid = \"\"\n",
        )
        .unwrap();
        let e = load(&path).unwrap_err();
        let keys: Vec<_> = e.all().map(|l| l.key.clone().unwrap_or_default()).collect();
        assert_eq!(
            keys,
            [
                "probe.interval",
                "probe.jitter",
                "heartbeat.ttl",
                "targets[0].url",
                "targets[1].id"
            ],
            "every problem, in order: {e}"
        );
        assert!(e.to_string().ends_with("5 problems"), "{e}");
    }

    #[test]
    fn https_targets_are_valid_and_the_ca_file_is_read_at_load_beside_the_file() {
        let c = parse("[[targets]]\nid = \"a\"\nurl = \"https://a.example:8443\"\n").unwrap();
        c.validate().expect("https:// targets are probed over TLS");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.toml");
        std::fs::write(&path, "[probe]\nca_file = \"certs/ca.pem\"\n").unwrap();
        let e = load(&path).unwrap_err();
        assert_eq!(
            (e.key.as_deref(), e.line),
            (Some("probe.ca_file"), Some(2)),
            "{e}"
        );
        let resolved = dir.path().join("certs/ca.pem");
        assert!(
            e.message.contains(&resolved.display().to_string()),
            "relative to the config file: {e}"
        );
        std::fs::create_dir(dir.path().join("certs")).unwrap();
        std::fs::write(&resolved, "not PEM\n").unwrap();
        let e = load(&path).unwrap_err();
        assert!(e.message.contains("no CERTIFICATE"), "{e}");
    }

    #[test]
    fn check_refuses_a_listen_address_already_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.toml");
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        std::fs::write(&path, format!("listen = \"{addr}\"\n")).unwrap();
        load(&path).expect("load does not look at the network");
        let e = check(&path).unwrap_err();
        assert_eq!((e.key.as_deref(), e.line), (Some("listen"), Some(1)), "{e}");
        assert!(e.message.contains(&addr.to_string()), "{e}");
        drop(taken);
        check(&path).expect("free again");
    }

    #[test]
    fn unknown_keys_are_rejected_with_line_and_key() {
        let err = parse("[probe]\ninterval = \"1s\"\nintervall = \"2s\"\n").unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert_eq!(err.key.as_deref(), Some("probe.intervall"), "{err}");
    }

    #[test]
    fn durations_are_humantime_strings() {
        let c = parse("[[targets]]\nid = \"a\"\nurl = \"http://x\"\ninterval = \"30s\"\n").unwrap();
        assert_eq!(c.targets[0].interval, Some(Duration::from_secs(30)));
        let c = parse("[probe]\ninterval = \"250ms\"\n[guard.budget]\nper = \"5m\"\n").unwrap();
        assert_eq!(c.probe.interval, Duration::from_millis(250));
        assert_eq!(c.guard.budget.per, Duration::from_secs(300));
    }

    #[test]
    fn the_store_is_a_postgres_url_or_a_table() {
        let c = parse("store = \"postgres://u@h/db\"\n").unwrap();
        assert_eq!(c.store.url.as_deref(), Some("postgres://u@h/db"));
        assert_eq!(c.store.snapshot_every, DEFAULT_SNAPSHOT_EVERY);
        let c = parse("[store]\nurl = \"postgres://u@h/db\"\nsnapshot_every = \"5s\"\n").unwrap();
        assert_eq!(c.store.url.as_deref(), Some("postgres://u@h/db"));
        assert_eq!(c.store.snapshot_every, Duration::from_secs(5));
        let err = parse("[store]\nsnapshot_evry = \"5s\"\n").unwrap_err();
        assert_eq!(err.key.as_deref(), Some("store.snapshot_evry"), "{err}");
        let bad = |toml: &str| parse(toml).unwrap().validate().unwrap_err().key;
        assert_eq!(bad("store = \"mysql://x\""), "store.url");
        assert_eq!(bad("[replicas]\nlease_ttl = \"0s\""), "replicas.lease_ttl");
        assert_eq!(bad("[replicas]\nprobers = 0"), "replicas.probers");
    }

    #[test]
    fn validate_names_the_bad_key() {
        let bad = |toml: &str| parse(toml).unwrap().validate().unwrap_err().key;
        assert!(bad("[probe]\njitter = 0.9") == "probe.jitter");
        assert!(bad("[guard]\nmax_unhealthy_fraction = 2.0") == "guard.max_unhealthy_fraction");
        assert!(bad("[guard.budget]\nper = \"0s\"") == "guard.budget.per");
        assert!(bad("[actuator]\nkind = \"webhook\"") == "actuator.webhook.url");
        if std::env::var_os("VIGIL_WEBHOOK_SECRET").is_none() {
            assert!(
                bad("[actuator]\nkind = \"webhook\"\n[actuator.webhook]\nurl = \"http://x/\"")
                    == "actuator.webhook.secret"
            );
        }
        assert!(bad("[[targets]]\nid = \"a\"\nurl = \"ftp://x\"") == "targets[0].url");
        assert!(bad("[discovery]\npoll = \"1s\"") == "discovery.path");
        assert!(bad("[discovery.aws]\ngroups = []") == "discovery.aws.groups");
        assert!(
            bad(
                "[discovery.aws]\ngroups = [\"g\"]\nurl = \"http://{ip}\"\n[aws]\nregion = \"eu-west-1\""
            ) == "discovery.aws.url"
        );
        assert!(bad("[aws]\nendpoint = \"ftp://x\"") == "aws.endpoint");
        assert!(bad("[aws]\nregion = \"EU West\"") == "aws.region");
        assert!(
            bad(
                "[actuator]\nkind = \"aws-autoscaling\"\n[aws]\nregion = \"eu-west-1\"\ndeadline = \"0s\""
            ) == "aws.deadline"
        );
        assert!(
            bad(
                "[[targets]]\nid = \"a\"\nurl = \"http://x\"\n[[targets]]\nid = \"a\"\nurl = \"http://y\""
            ) == "targets[1].id"
        );
    }
}
