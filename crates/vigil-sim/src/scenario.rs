//! Scenario files: the fleet, its dependencies, the policies, a timeline of faults and
//! the expectations, as TOML.
//!
//! Every section is one struct with `#[serde(default, deny_unknown_fields)]`; every
//! default is a named constant saying why. Loading ends in [`ScenarioConfig::validate`], and
//! every error (syntax, type, unknown key, bad value) names the file, the line and the
//! key, found from the TOML parser's spans by `vigil-config` (the locator `lb.toml` and
//! `fleet.toml` share). The policy sections embed vigil-core's own configuration types
//! ([`PoolConfig`], [`GuardConfig`]), so a scenario's `[lb.pool]` reads exactly like the
//! load balancer's configuration.

use crate::expect::{Expectation, parse_expectations};
pub use crate::path::PathSeg;
use crate::summary::{Policies, Summary};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vigil_core::admission::QueueTimeConfig;
use vigil_core::anomaly::AnomalyConfig;
use vigil_core::breaker::BreakerConfig;
use vigil_core::gate::GateConfig;
use vigil_core::guard::GuardConfig;
use vigil_core::pool::{PoolConfig, RetryBudgetConfig};
use vigil_core::rollout::RolloutConfig;
use vigil_core::throttle::RetryThrottleConfig;

/// Default simulated duration: 1 h, long enough for faults, detection and recovery.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(3600);
/// Default seed: 1 (any fixed value; the point is that there is one).
pub const DEFAULT_SEED: u64 = 1;
/// Default client tick: 1 s. Client arrivals are aggregated per tick and per server
/// (requests are still counted one by one, outcomes drawn per request); 1 s is below
/// every detection interval that matters and keeps a fleet-day fast.
pub const DEFAULT_TICK: Duration = Duration::from_secs(1);
/// Default fleet size: 20 servers, small enough to read, large enough for fractions.
pub const DEFAULT_SERVERS: u32 = 20;
/// Default zones: 3, the usual cloud region shape.
pub const DEFAULT_ZONES: u32 = 3;
/// Default worker threads per server: 16.
pub const DEFAULT_WORKERS: u32 = 16;
/// Default CPU time per request: 20 ms, so a server serves 800 requests/s.
pub const DEFAULT_SERVICE_TIME: Duration = Duration::from_millis(20);
/// Longest ratio of a request's p99 worker time to its median: beyond it the lognormal
/// model's tail says more about the model than about any server.
pub const MAX_TAIL_RATIO: u32 = 1000;
/// Default brownout: an overloaded server loses 10% of its throughput to contention and
/// to rejecting what it cannot queue (with load shedding; without it, far more).
pub const DEFAULT_BROWNOUT: f64 = 0.1;
/// Default queue bound: a server queues what it answers in 1 s when healthy (queue wait
/// plus its mean worker time) and sheds (503) the rest, so a queued request can still
/// make the default client timeout.
pub const DEFAULT_MAX_QUEUE_WAIT: Duration = Duration::from_secs(1);
/// Default background dependency-check interval: 10 s, a predictable load on the
/// dependency whatever the request rate.
pub const DEFAULT_DEP_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// Default dependency-check timeout: 2 s.
pub const DEFAULT_DEP_CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time for a replacement server to boot and start answering: 2 min.
pub const DEFAULT_BOOT_TIME: Duration = Duration::from_secs(120);
/// Default disk usage at boot: 40%.
pub const DEFAULT_DISK_USED: f64 = 0.4;
/// Default file-descriptor limit: 65,536 (a common `nofile`).
pub const DEFAULT_FD_LIMIT: u32 = 65_536;
/// Default file descriptors in use at boot: 2,000.
pub const DEFAULT_FDS_USED: u32 = 2_000;
/// Default client load: 50% of the fleet's capacity, the usual N+1-zone headroom.
pub const DEFAULT_LOAD: f64 = 0.5;
/// Default client timeout: 1 s; a request waiting longer counts as an error.
pub const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default client retry attempts (the first included): 3, the AWS SDKs' standard mode.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Most client attempts a scenario may ask for.
pub const MAX_ATTEMPTS: u32 = 10;
/// Default backoff base: 100 ms, the AWS SDKs' (the k-th retry waits a random time up to
/// `base x 2^(k-1)`).
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Default backoff cap: 20 s, the AWS SDKs' longest backoff.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(20);
/// Longest backoff a scenario may ask for: pending retries are kept per tick up to this
/// far ahead.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Default balancer retries: 0. `vigil lb` retries twice by default; the simulator does
/// not unless the scenario asks, so the figures of scenarios written before retries were
/// modelled stay what they were.
pub const DEFAULT_LB_MAX_RETRIES: u32 = 0;
/// Most balancer retries a scenario may ask for.
pub const MAX_LB_RETRIES: u32 = 5;
/// Default dependency latency: 5 ms.
pub const DEFAULT_DEP_LATENCY: Duration = Duration::from_millis(5);
/// Default LB active-check interval: 5 s (HAProxy's `inter 2s` is tighter; 5 s is
/// Envoy's and most cloud balancers' order of magnitude).
pub const DEFAULT_LB_INTERVAL: Duration = Duration::from_secs(5);
/// Default LB check timeout: 2 s.
pub const DEFAULT_LB_TIMEOUT: Duration = Duration::from_secs(2);
/// Default controller probe interval: 10 s; the controller is careful, not fast.
pub const DEFAULT_CTL_INTERVAL: Duration = Duration::from_secs(10);
/// Default controller probe timeout: 2 s.
pub const DEFAULT_CTL_TIMEOUT: Duration = Duration::from_secs(2);
/// Default queue message processing time per worker thread: 100 ms.
pub const DEFAULT_PROCESS_TIME: Duration = Duration::from_millis(100);
/// Default time a sick worker takes to fail a message: 2 ms (failing is fast, which is
/// why a sick worker that keeps pulling eats the queue).
pub const DEFAULT_FAIL_TIME: Duration = Duration::from_millis(2);
/// Default queue-consumer threads per worker: 4.
pub const DEFAULT_QUEUE_THREADS: u32 = 4;

/// A loaded, validated scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Where it came from.
    pub file: PathBuf,
    /// The configuration.
    pub config: ScenarioConfig,
    /// Expectations on the run with vigil's policies (`[expect]`).
    pub expect: Vec<Expectation>,
    /// Expectations on the naive run (`[expect.naive]`): what the comparison must show.
    pub expect_naive: Vec<Expectation>,
}

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScenarioConfig {
    /// Short name; defaults to the file's stem.
    pub name: String,
    /// What the scenario shows, one paragraph.
    pub description: String,
    /// Simulated time. Defaults to 1h.
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// Default seed (overridden by `--seed`). Defaults to 1.
    pub seed: u64,
    /// Client aggregation tick. Defaults to 1s.
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// The servers.
    pub fleet: FleetConfig,
    /// The clients: open-loop, or retrying.
    pub clients: ClientsConfig,
    /// Dependencies shared by the fleet.
    pub dependencies: Vec<DependencyConfig>,
    /// A queue the servers consume, if any.
    pub queue: Option<QueueConfig>,
    /// The load balancer in front of the fleet.
    pub lb: LbConfig,
    /// The central controller.
    pub controller: ControllerConfig,
    /// The timeline.
    pub faults: Vec<FaultConfig>,
    /// Expectations (parsed separately, see [`crate::expect`]).
    pub expect: toml::Table,
}

impl Default for ScenarioConfig {
    fn default() -> Self {
        ScenarioConfig {
            name: String::new(),
            description: String::new(),
            duration: DEFAULT_DURATION,
            seed: DEFAULT_SEED,
            tick: DEFAULT_TICK,
            fleet: FleetConfig::default(),
            clients: ClientsConfig::default(),
            dependencies: Vec::new(),
            queue: None,
            lb: LbConfig::default(),
            controller: ControllerConfig::default(),
            faults: Vec::new(),
            expect: toml::Table::new(),
        }
    }
}

/// Whether health endpoints have their own thread or share the request workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HealthCapacity {
    /// A reserved thread answers health checks even when every worker is busy (vigil).
    #[default]
    Reserved,
    /// Health checks queue behind requests (the naive server).
    Shared,
}

/// On or off, for features that are policies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Switch {
    /// Enabled. Defaults to this.
    #[default]
    On,
    /// Disabled.
    Off,
}

/// The servers.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// Number of servers. Defaults to 20.
    pub servers: u32,
    /// Zones; server `i` is in zone `i % zones`. Defaults to 3.
    pub zones: u32,
    /// Worker threads per server. Defaults to 16.
    pub workers: u32,
    /// Worker time per request: its median when `service_time_p99` is set. Defaults to
    /// 20ms.
    #[serde(with = "humantime_serde")]
    pub service_time: Duration,
    /// The 99th percentile of the worker time per request (lognormal between the median
    /// and this); absent, every request takes `service_time`.
    #[serde(default, with = "humantime_serde")]
    pub service_time_p99: Option<Duration>,
    /// Throughput lost when overloaded (0 to 1). Defaults to 0.1.
    pub brownout: f64,
    /// The queue a server keeps: as many requests as it answers in this time when
    /// healthy (queue wait plus mean worker time); arrivals beyond are shed with a 503. A
    /// slow server's queue holds as many, which then wait longer. Defaults to 1s.
    #[serde(with = "humantime_serde")]
    pub max_queue_wait: Duration,
    /// `reserved` or `shared` health capacity. Defaults to `reserved`.
    pub health_capacity: HealthCapacity,
    /// Whether `/readyz` fails when the background checker's snapshot is stale.
    /// Defaults to `on`.
    pub watchdog: Switch,
    /// Background dependency-check interval. Defaults to 10s.
    #[serde(with = "humantime_serde")]
    pub dependency_check_interval: Duration,
    /// Background dependency-check timeout. Defaults to 2s.
    #[serde(with = "humantime_serde")]
    pub dependency_check_timeout: Duration,
    /// Time for a replacement to boot. Defaults to 2m.
    #[serde(with = "humantime_serde")]
    pub boot_time: Duration,
    /// Disk usage at boot (0 to 1). Defaults to 0.4.
    pub disk_used: f64,
    /// File-descriptor limit. Defaults to 65536.
    pub fd_limit: u32,
    /// File descriptors used at boot. Defaults to 2000.
    pub fds_used: u32,
    /// The `vigil` library's admission control (`vigil_core::admission`): a request is
    /// refused before it starts when its propagated deadline (the balancer's per-try
    /// timeout, else the client's) has passed or cannot be met, and a standing queue
    /// holds only the queue-time target's worth of work. Defaults to `on`.
    pub admission: Switch,
    /// Queue-time rule of the admission control, as the library reads it.
    pub queue_time: QueueTimeConfig,
    /// The dependency guard (`vigil_core::breaker`): a dependency slower than
    /// `breaker.slow_call`, or failing, opens a breaker per server and dependency, and
    /// the requests that need it are answered degraded (the dependency's `degraded`
    /// share served, the rest failed at once) instead of holding a worker. Defaults to
    /// `on`.
    pub dependency_guard: Switch,
    /// The breaker's settings, as the library reads them.
    pub breaker: BreakerConfig,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            servers: DEFAULT_SERVERS,
            zones: DEFAULT_ZONES,
            workers: DEFAULT_WORKERS,
            service_time: DEFAULT_SERVICE_TIME,
            service_time_p99: None,
            brownout: DEFAULT_BROWNOUT,
            max_queue_wait: DEFAULT_MAX_QUEUE_WAIT,
            health_capacity: HealthCapacity::Reserved,
            watchdog: Switch::On,
            dependency_check_interval: DEFAULT_DEP_CHECK_INTERVAL,
            dependency_check_timeout: DEFAULT_DEP_CHECK_TIMEOUT,
            boot_time: DEFAULT_BOOT_TIME,
            disk_used: DEFAULT_DISK_USED,
            fd_limit: DEFAULT_FD_LIMIT,
            fds_used: DEFAULT_FDS_USED,
            admission: Switch::On,
            queue_time: QueueTimeConfig::default(),
            dependency_guard: Switch::On,
            breaker: BreakerConfig::default(),
        }
    }
}

impl FleetConfig {
    /// The worker time of a request on a healthy server.
    pub fn service(&self) -> crate::latency::ServiceTime {
        crate::latency::ServiceTime::new(
            self.service_time,
            self.service_time_p99.unwrap_or(self.service_time),
        )
    }

    /// Requests per second one healthy server can serve: its workers over the mean
    /// worker time.
    pub fn server_capacity(&self) -> f64 {
        f64::from(self.workers) / self.service().mean()
    }
}

/// What a client does when an attempt fails (an error, or no answer within `timeout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientRetry {
    /// Nothing: the request failed (open-loop clients). Defaults to this.
    #[default]
    None,
    /// Sends it again at once, up to `max_attempts` (the naive client).
    Immediate,
    /// Sends it again after an exponential backoff with full jitter, up to
    /// `max_attempts`.
    Backoff,
}

/// The clients. New requests arrive open-loop (their rate does not slow down when the
/// service does); with `retry`, failed attempts come back, so load rises with failures.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientsConfig {
    /// Offered load as a fraction of the whole fleet's capacity. Defaults to 0.5.
    pub load: f64,
    /// Offered load in requests/s; overrides `load` when set.
    pub rate: Option<f64>,
    /// An attempt not answered within this fails. Defaults to 1s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// `none`, `immediate` or `backoff`. Defaults to `none`.
    pub retry: ClientRetry,
    /// Attempts per request, the first included (with `retry`). Defaults to 3.
    pub max_attempts: u32,
    /// Backoff of the first retry (`backoff`): the k-th waits a random time up to
    /// `backoff_base x 2^(k-1)`. Defaults to 100ms.
    #[serde(with = "humantime_serde")]
    pub backoff_base: Duration,
    /// Longest backoff (`backoff`). Defaults to 20s.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
}

impl Default for ClientsConfig {
    fn default() -> Self {
        ClientsConfig {
            load: DEFAULT_LOAD,
            rate: None,
            timeout: DEFAULT_CLIENT_TIMEOUT,
            retry: ClientRetry::None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff_base: DEFAULT_BACKOFF_BASE,
            backoff_max: DEFAULT_BACKOFF_MAX,
        }
    }
}

/// How much a failing check weighs in `/health`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DepCriticality {
    /// Its failure fails `/health`. Defaults to this.
    #[default]
    Critical,
    /// Its failure only degrades `/health` (warn): the service still serves.
    NonCritical,
}

/// A dependency shared by the fleet (a database, a downstream service).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DependencyConfig {
    /// Its name, used by faults. Required.
    pub name: String,
    /// Typical latency. Defaults to 5ms.
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// Baseline error rate (0 to 1). Defaults to 0.
    pub error_rate: f64,
    /// Fraction of requests that call it (the rest never notice it). Defaults to 1.
    pub request_fraction: f64,
    /// Weight of its check in `/health`. Defaults to `critical`.
    pub criticality: DepCriticality,
    /// Share of the requests that call it which the service can still answer in its
    /// degraded mode, without it (reads served from a cache), when the dependency
    /// guard's breaker is open (0 to 1); the rest fail at once. Defaults to 0.
    pub degraded: f64,
}

impl Default for DependencyConfig {
    fn default() -> Self {
        DependencyConfig {
            name: String::new(),
            latency: DEFAULT_DEP_LATENCY,
            error_rate: 0.0,
            request_fraction: 1.0,
            criticality: DepCriticality::Critical,
            degraded: 0.0,
        }
    }
}

/// A message queue that every server consumes.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueConfig {
    /// Messages per second produced. Defaults to 100.
    pub rate: f64,
    /// Consumer threads per worker. Defaults to 4.
    pub threads: u32,
    /// Time to process one message. Defaults to 100ms.
    #[serde(with = "humantime_serde")]
    pub process_time: Duration,
    /// Time for a sick worker to fail one message. Defaults to 2ms.
    #[serde(with = "humantime_serde")]
    pub fail_time: Duration,
    /// The dependency (a `[[dependencies]]` name) every message calls: a message fails,
    /// after its `process_time`, with the error rate the worker sees (a `dependency`
    /// fault, `conn_broken`). Defaults to none.
    pub dependency: Option<String>,
    /// Fraction of produced messages that are poison (0 to 1): they fail on every
    /// worker, after their `process_time`. Defaults to 0.
    pub poison: f64,
    /// Whether each worker runs vigil's worker gate (`vigil_core::gate::WorkerGate`):
    /// it checks its own host (disk, fds) before pulling, and its kill switch pauses a
    /// worker that fails too many messages. Defaults to `on`.
    pub gate: Switch,
    /// The worker gate's settings, exactly as `vigil::worker` reads them (`readiness`,
    /// `kill_switch`, `poison_workers`). Readiness is observed once per tick.
    pub worker: GateConfig,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            rate: 100.0,
            threads: DEFAULT_QUEUE_THREADS,
            process_time: DEFAULT_PROCESS_TIME,
            fail_time: DEFAULT_FAIL_TIME,
            dependency: None,
            poison: 0.0,
            gate: Switch::On,
            worker: GateConfig::default(),
        }
    }
}

/// Which endpoint a prober checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckPath {
    /// `/readyz`: the host's own health (what a load balancer should use).
    #[default]
    Local,
    /// `/health`: local plus dependencies (what the controller uses).
    Deep,
}

/// The load balancer: vigil-core's `Pool`, driven by active checks and request outcomes.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LbConfig {
    /// Endpoint its active checks use. Defaults to `local`.
    pub check: CheckPath,
    /// Active-check interval. Defaults to 5s.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Active-check timeout. Defaults to 2s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The pool policy, exactly as `vigil lb` reads it (`panic_threshold`, `thresholds`,
    /// `outlier`, slow start).
    pub pool: PoolConfig,
    /// The balancer's retries of failed attempts.
    pub retries: LbRetriesConfig,
    /// How requests are spread over the routing set: `p2c` (vigil lb's default) or
    /// `round-robin`. Defaults to `p2c`.
    pub balance: Balance,
}

/// How the simulated balancer spreads requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Balance {
    /// vigil-core's `RoutingSet::pick_p2c` on outstanding requests plus the shed
    /// penalty, as `vigil lb` balances by default (sampled per tick: see the sim's
    /// module docs). Defaults to this.
    #[default]
    P2c,
    /// Shares in proportion to effective weight (round-robin; nginx's default).
    RoundRobin,
}

impl Default for LbConfig {
    fn default() -> Self {
        LbConfig {
            check: CheckPath::Local,
            interval: DEFAULT_LB_INTERVAL,
            timeout: DEFAULT_LB_TIMEOUT,
            pool: PoolConfig::default(),
            retries: LbRetriesConfig::default(),
            balance: Balance::P2c,
        }
    }
}

/// What bounds the balancer's retries, beyond `max_retries` per request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryLimit {
    /// vigil-core's `RetryBudget`: retries add at most `budget.ratio` of the requests
    /// (plus a floor), whatever fails (vigil). Defaults to this.
    #[default]
    Budget,
    /// Nothing: every failure that may be retried is, up to `max_retries` (the naive
    /// balancer: HAProxy's `retries`, nginx's `proxy_next_upstream_tries`).
    None,
}

/// The balancer's retries, as `vigil lb` makes them: a connect failure or a reset is
/// retried at once, an attempt past `per_try_timeout` once the next try still fits in
/// the client's timeout; an error answer (5xx, a shed 503) is not retried.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LbRetriesConfig {
    /// Most retries of one request. Defaults to 0 (`vigil lb`'s default is 2).
    pub max_retries: u32,
    /// The time one attempt has (`timeouts.per_try` in `lb.toml`): past it, it is
    /// abandoned (a timeout) and may be retried. Absent: an attempt has the client's
    /// whole timeout and a timeout is not retried.
    #[serde(default, with = "humantime_serde")]
    pub per_try_timeout: Option<Duration>,
    /// `budget` or `none`. Defaults to `budget`.
    pub limit: RetryLimit,
    /// The retry budget, exactly as `vigil lb` reads it.
    pub budget: RetryBudgetConfig,
    /// vigil lb's retry throttle (`vigil_core::throttle::RetryThrottle`) on top of the
    /// budget: `on` or `off`. Defaults to `on`.
    pub throttle: Switch,
    /// The throttle's bucket, exactly as `vigil lb` reads it.
    pub bucket: RetryThrottleConfig,
}

impl Default for LbRetriesConfig {
    fn default() -> Self {
        LbRetriesConfig {
            max_retries: DEFAULT_LB_MAX_RETRIES,
            per_try_timeout: None,
            limit: RetryLimit::Budget,
            budget: RetryBudgetConfig::default(),
            throttle: Switch::On,
            bucket: RetryThrottleConfig::default(),
        }
    }
}

/// How the controller decides to act.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ControllerMode {
    /// Replace unhealthy servers only when vigil-core's `SafetyGuard` allows. Defaults
    /// to this.
    #[default]
    Guarded,
    /// Replace every server it finds unhealthy, at once (the naive controller).
    Naive,
    /// No controller.
    Off,
}

/// Where the guard's state lives across controller restarts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GuardStateStore {
    /// Saved after every decision and restored at start (vigil's store). Defaults to this.
    #[default]
    Persisted,
    /// Lost on restart.
    InMemory,
}

/// The central controller: deep probes, rise/fall verdicts, the safety guard, replacement.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// `guarded`, `naive` or `off`. Defaults to `guarded`.
    pub mode: ControllerMode,
    /// Probe interval. Defaults to 10s.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Probe timeout. Defaults to 2s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Where the guard's state lives. Defaults to `persisted`.
    pub state: GuardStateStore,
    /// Controller replicas sharing the probing (`vigil controller`'s `[replicas]`):
    /// with more than 1, each target is probed by `probers` of them (rendezvous
    /// hashing, `vigil_core::shard`) and the leader judges it by their agreement.
    /// Defaults to 1 (one controller probes everything).
    pub replicas: u32,
    /// Replicas probing each target when `replicas` > 1. Defaults to 2
    /// (`vigil_core::shard::DEFAULT_PROBERS`).
    pub probers: u32,
    /// The guard policy, exactly as `vigil controller` reads it.
    pub guard: GuardConfig,
    /// How queue workers are compared with their peers, exactly as `vigil controller`
    /// reads its `[anomaly]` section: a worker that fails far more than its peers fails
    /// its probe's peer check (used when the scenario has a `[queue]`).
    pub anomaly: AnomalyConfig,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            mode: ControllerMode::Guarded,
            interval: DEFAULT_CTL_INTERVAL,
            timeout: DEFAULT_CTL_TIMEOUT,
            state: GuardStateStore::Persisted,
            replicas: 1,
            probers: vigil_core::shard::DEFAULT_PROBERS as u32,
            guard: GuardConfig::default(),
            anomaly: AnomalyConfig::default(),
        }
    }
}

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The target servers' processes die (until replaced).
    Kill,
    /// The target servers' disks fill up over `fill_in`.
    DiskFill,
    /// The target servers leak file descriptors until exhausted after `exhaust_in`.
    FdLeak,
    /// Stop-the-world pauses of `pause` every `every`.
    GcPauses,
    /// The target servers' background health checkers die (the snapshot goes stale).
    CheckerDies,
    /// The target servers' own connections to `dependency` break (requests and the
    /// background check from those servers fail; other servers are fine).
    ConnBroken,
    /// Gray failure: `error_rate` of real requests fail, health checks pass.
    Gray,
    /// The target servers' hosts slow down: every request holds its worker `latency`
    /// longer, and health answers take `latency` longer too (a failing disk, swapping,
    /// CPU starvation: the reserved health thread is a thread, not a faster host).
    Latency,
    /// `dependency` returns errors at `error_rate` (1 = down), optionally only to an
    /// `affected` fraction of servers (partial failure), optionally slower by `latency`.
    Dependency,
    /// Client load multiplied by `load`.
    Surge,
    /// Every server of `zone` dies; replacements there fail to boot until it is back.
    ZoneDown,
    /// A new version rolls out; it fails `error_rate` of requests and its readiness
    /// `fails` or `passes`. With `gate = "health"` (vigil) the rollout is
    /// `vigil_core::rollout::Rollout` with the `rollout` settings; with `gate = "none"`
    /// (naive) it pushes `waves` on a timer.
    Deploy,
    /// The controller process restarts (down for `duration`): what it decided and had
    /// not committed is lost; it rebuilds its guard from its store.
    ControllerRestart,
    /// The controller's store fails (commits and reads) for `duration`: nothing is
    /// judged, a decision whose commit failed never happened and is made again once the
    /// store works.
    StoreOutage,
    /// The controller's store takes `latency` per commit for `duration` (a slow disk):
    /// decisions wait for their commit before they are acted on.
    StoreSlow,
    /// The leading controller is cut off from its lease (paused); a successor leads
    /// `duration` later (defaults to 3s), from what the store holds: a commit of the
    /// old term that lands later is refused (fenced), its actions never run.
    LeaderFailover,
    /// Controller replica `replica` (defaults to 0) cannot reach the targets (a route,
    /// a firewall): every probe of its times out, for `duration`. Needs
    /// `controller.replicas` > 1.
    ProberCutOff,
}

impl FaultKind {
    /// Whether the fault is the controller's own (its process or its store), not the
    /// fleet's.
    pub fn is_controllers(self) -> bool {
        matches!(
            self,
            FaultKind::ControllerRestart
                | FaultKind::StoreOutage
                | FaultKind::StoreSlow
                | FaultKind::LeaderFailover
                | FaultKind::ProberCutOff
        )
    }
}

/// Whether a deployment waits for each wave to be healthy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeployGate {
    /// vigil's rollout policy, `vigil_core::rollout::Rollout`, as `vigil deploy` drives
    /// it: waves sized by the floor, one zone at a time, report-back within a progress
    /// deadline, bake and verdict, latched rollback. Defaults to this.
    #[default]
    Health,
    /// Waves (`waves`, every `wave_interval`) follow a timer, whatever happens.
    None,
}

/// Whether a bad version's readiness check notices it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Readiness {
    /// `/readyz` fails on the bad version. Defaults to this.
    #[default]
    Fails,
    /// `/readyz` passes (only real requests fail).
    Passes,
}

/// One timeline entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    /// When it starts.
    #[serde(with = "humantime_serde")]
    pub at: Duration,
    /// What it is.
    pub kind: FaultKind,
    /// Which servers: `server:3`, `servers:0-4`, `fraction:0.1`, `zone:1`, `all`.
    #[serde(default)]
    pub target: Option<String>,
    /// How long it lasts (absent: until the run ends, or until the server is replaced).
    #[serde(default, with = "humantime_serde")]
    pub duration: Option<Duration>,
    /// Dependency name (`dependency`, `conn_broken`).
    #[serde(default)]
    pub dependency: Option<String>,
    /// Error rate, 0 to 1 (`dependency`, `gray`, `deploy`).
    #[serde(default)]
    pub error_rate: Option<f64>,
    /// Added latency (`dependency`, `latency`).
    #[serde(default, with = "humantime_serde")]
    pub latency: Option<Duration>,
    /// The fault grows linearly from nothing to its full size over this (`latency`,
    /// `dependency`, `gray`, `surge`).
    #[serde(default, with = "humantime_serde")]
    pub ramp: Option<Duration>,
    /// Fraction of servers a dependency fault reaches (partial failure). Defaults to 1.
    #[serde(default)]
    pub affected: Option<f64>,
    /// Time until the disk is full (`disk_fill`).
    #[serde(default, with = "humantime_serde")]
    pub fill_in: Option<Duration>,
    /// Time until file descriptors run out (`fd_leak`).
    #[serde(default, with = "humantime_serde")]
    pub exhaust_in: Option<Duration>,
    /// Pause length (`gc_pauses`).
    #[serde(default, with = "humantime_serde")]
    pub pause: Option<Duration>,
    /// Pause period (`gc_pauses`).
    #[serde(default, with = "humantime_serde")]
    pub every: Option<Duration>,
    /// Load multiplier (`surge`).
    #[serde(default)]
    pub load: Option<f64>,
    /// Zone index (`zone_down`).
    #[serde(default)]
    pub zone: Option<u32>,
    /// Controller replica index (`prober_cut_off`).
    #[serde(default)]
    pub replica: Option<u32>,
    /// Cumulative fleet fractions per wave of the timer rollout, e.g. `[0.1, 0.3, 1.0]`
    /// (`deploy` with `gate = "none"`, and the naive run).
    #[serde(default)]
    pub waves: Option<Vec<f64>>,
    /// vigil's rollout settings, exactly as `vigil deploy` reads `[rollout]` (`deploy`
    /// with `gate = "health"`). Defaults to `vigil deploy`'s defaults.
    #[serde(default)]
    pub rollout: RolloutConfig,
    /// Time between waves of the timer rollout (`deploy`).
    #[serde(default, with = "humantime_serde")]
    pub wave_interval: Option<Duration>,
    /// Whether the bad version fails readiness (`deploy`).
    #[serde(default)]
    pub readiness: Option<Readiness>,
    /// Whether the rollout waits for health (`deploy`).
    #[serde(default)]
    pub gate: Option<DeployGate>,
    /// Label shown on the report's timeline.
    #[serde(default)]
    pub label: Option<String>,
}

/// A set of servers a fault applies to.
#[derive(Clone, Debug, PartialEq)]
pub enum TargetSet {
    /// Every server.
    All,
    /// Servers `a..=b`.
    Range(u32, u32),
    /// The first `ceil(f x servers)` servers (spread over zones, as `i % zones`).
    Fraction(f64),
    /// Every server in a zone.
    Zone(u32),
}

impl TargetSet {
    /// Parses `server:3`, `servers:0-4`, `fraction:0.1`, `zone:1`, `all`.
    pub fn parse(s: &str) -> Result<TargetSet, String> {
        let bad = || {
            format!(
                "bad target {s:?}: expected `server:N`, `servers:A-B`, `fraction:F`, `zone:Z` or `all`"
            )
        };
        if s == "all" {
            return Ok(TargetSet::All);
        }
        let (kind, arg) = s.split_once(':').ok_or_else(bad)?;
        match kind {
            "server" => {
                let n = arg.parse().map_err(|_| bad())?;
                Ok(TargetSet::Range(n, n))
            }
            "servers" => {
                let (a, b) = arg.split_once('-').ok_or_else(bad)?;
                let (a, b) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                Ok(TargetSet::Range(a, b))
            }
            "fraction" => {
                let f: f64 = arg.parse().map_err(|_| bad())?;
                if !(0.0..=1.0).contains(&f) {
                    return Err(bad());
                }
                Ok(TargetSet::Fraction(f))
            }
            "zone" => Ok(TargetSet::Zone(arg.parse().map_err(|_| bad())?)),
            _ => Err(bad()),
        }
    }

    /// The server indices, in order.
    pub fn servers(&self, fleet: &FleetConfig) -> Vec<u32> {
        let n = fleet.servers;
        match *self {
            TargetSet::All => (0..n).collect(),
            TargetSet::Range(a, b) => (a..=b.min(n.saturating_sub(1))).collect(),
            TargetSet::Fraction(f) => (0..((f * f64::from(n)).ceil() as u32).min(n)).collect(),
            TargetSet::Zone(z) => (0..n).filter(|i| i % fleet.zones.max(1) == z).collect(),
        }
    }
}

// === errors ===

fn path_string(path: &[PathSeg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            PathSeg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            PathSeg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// A scenario that cannot be used, and where: file, line, column, key path and the
/// offending line (the one implementation every vigil TOML file shares).
pub type ScenarioError = vigil_config::ConfigError;

/// An error about `path` in `src`, located by the parser's spans.
pub fn error_at(file: &Path, src: &str, path: &[PathSeg], message: String) -> ScenarioError {
    vigil_config::invalid(
        file,
        src,
        vigil_core::Invalid::new(path_string(path), message),
    )
}

// === loading ===

impl Scenario {
    /// Reads, parses and validates a scenario file.
    pub fn load(file: &Path) -> Result<Scenario, ScenarioError> {
        Scenario::parse(file, &vigil_config::read(file)?)
    }

    /// Parses and validates scenario text (`file` is only used in errors and for the
    /// default name).
    pub fn parse(file: &Path, src: &str) -> Result<Scenario, ScenarioError> {
        let mut config: ScenarioConfig = vigil_config::from_str(file, src)?;
        if config.name.is_empty() {
            config.name = file
                .file_stem()
                .map_or_else(|| "scenario".into(), |s| s.to_string_lossy().into_owned());
        }
        config
            .validate()
            .map_err(|(path, msg)| error_at(file, src, &path, msg))?;
        let (expect, expect_naive) = parse_expectations(&config.expect)
            .map_err(|(path, msg)| error_at(file, src, &path, msg))?;
        Ok(Scenario {
            file: file.to_path_buf(),
            config,
            expect,
            expect_naive,
        })
    }
}

type Invalid = (Vec<PathSeg>, String);

fn key(k: &str) -> PathSeg {
    PathSeg::Key(k.to_string())
}

fn fraction(v: f64, path: &[&str], what: &str) -> Result<(), Invalid> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err((
            path.iter().map(|k| key(k)).collect(),
            format!("{what} must be between 0 and 1, got {v}"),
        ))
    }
}

fn nonzero(d: Duration, path: &[&str]) -> Result<(), Invalid> {
    if d.is_zero() {
        Err((
            path.iter().map(|k| key(k)).collect(),
            "must be longer than 0s".into(),
        ))
    } else {
        Ok(())
    }
}

/// A vigil-core validation error about a policy section embedded under `prefix`.
fn core_error(prefix: &[&str], e: vigil_core::Invalid) -> Invalid {
    let mut path: Vec<PathSeg> = prefix.iter().map(|k| key(k)).collect();
    path.extend(e.key.split('.').filter(|k| !k.is_empty()).map(key));
    (path, e.message)
}

impl ScenarioConfig {
    /// An empty summary for a run of this scenario.
    pub fn summary(&self, seed: u64, policies: Policies) -> Summary {
        let cfg = self;
        Summary {
            scenario: cfg.name.clone(),
            policies: policies.as_str(),
            seed,
            servers: cfg.fleet.servers,
            duration: cfg.duration,
            has_queue: cfg.queue.is_some(),
            fault_ends: cfg.faults.iter().any(|f| f.duration.is_some()),
            has_retries: cfg.clients.retry != ClientRetry::None || cfg.lb.retries.max_retries > 0,
            ..Summary::default()
        }
    }

    /// Checks values the types cannot; the error carries the key path.
    pub fn validate(&self) -> Result<(), Invalid> {
        nonzero(self.duration, &["duration"])?;
        nonzero(self.tick, &["tick"])?;
        if self.tick > Duration::from_secs(10) {
            return Err((vec![key("tick")], "must be at most 10s".into()));
        }
        let f = &self.fleet;
        if f.servers == 0 {
            return Err((
                vec![key("fleet"), key("servers")],
                "must be at least 1".into(),
            ));
        }
        if f.zones == 0 || f.zones > f.servers {
            return Err((
                vec![key("fleet"), key("zones")],
                format!("must be between 1 and fleet.servers ({})", f.servers),
            ));
        }
        if f.workers == 0 {
            return Err((
                vec![key("fleet"), key("workers")],
                "must be at least 1".into(),
            ));
        }
        nonzero(f.service_time, &["fleet", "service_time"])?;
        if let Some(p99) = f.service_time_p99
            && (p99 < f.service_time || p99 > f.service_time * MAX_TAIL_RATIO)
        {
            return Err((
                vec![key("fleet"), key("service_time_p99")],
                format!(
                    "must be between fleet.service_time ({}) and {MAX_TAIL_RATIO} times it",
                    humantime::format_duration(f.service_time)
                ),
            ));
        }
        nonzero(
            f.dependency_check_interval,
            &["fleet", "dependency_check_interval"],
        )?;
        fraction(f.brownout, &["fleet", "brownout"], "brownout")?;
        fraction(f.disk_used, &["fleet", "disk_used"], "disk_used")?;
        if f.fds_used >= f.fd_limit {
            return Err((
                vec![key("fleet"), key("fds_used")],
                format!("must be below fleet.fd_limit ({})", f.fd_limit),
            ));
        }
        if !(0.0..=100.0).contains(&self.clients.load) {
            return Err((
                vec![key("clients"), key("load")],
                "must be between 0 and 100 (a fraction of capacity)".into(),
            ));
        }
        if let Some(r) = self.clients.rate
            && (r.is_nan() || r < 0.0)
        {
            return Err((
                vec![key("clients"), key("rate")],
                "must be 0 or more requests/s".into(),
            ));
        }
        let c = &self.clients;
        nonzero(c.timeout, &["clients", "timeout"])?;
        if !(1..=MAX_ATTEMPTS).contains(&c.max_attempts) {
            return Err((
                vec![key("clients"), key("max_attempts")],
                format!("must be between 1 and {MAX_ATTEMPTS} (the first attempt included)"),
            ));
        }
        nonzero(c.backoff_base, &["clients", "backoff_base"])?;
        if c.backoff_max < c.backoff_base || c.backoff_max > MAX_BACKOFF {
            return Err((
                vec![key("clients"), key("backoff_max")],
                format!(
                    "must be between clients.backoff_base ({}) and {}",
                    humantime::format_duration(c.backoff_base),
                    humantime::format_duration(MAX_BACKOFF)
                ),
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, d) in self.dependencies.iter().enumerate() {
            let at = |k: &str| vec![key("dependencies"), PathSeg::Index(i), key(k)];
            if d.name.is_empty() {
                return Err((at("name"), "every dependency needs a name".into()));
            }
            if !names.insert(d.name.as_str()) {
                return Err((at("name"), format!("duplicate dependency {:?}", d.name)));
            }
            if !(0.0..=1.0).contains(&d.error_rate) {
                return Err((at("error_rate"), "must be between 0 and 1".into()));
            }
            if !(0.0..=1.0).contains(&d.request_fraction) {
                return Err((at("request_fraction"), "must be between 0 and 1".into()));
            }
            if !(0.0..=1.0).contains(&d.degraded) {
                return Err((at("degraded"), "must be between 0 and 1".into()));
            }
        }
        f.queue_time
            .validate()
            .map_err(|m| core_error(&["fleet", "queue_time"], m))?;
        f.breaker
            .validate()
            .map_err(|m| core_error(&["fleet", "breaker"], m))?;
        self.lb
            .retries
            .bucket
            .validate()
            .map_err(|m| core_error(&["lb", "retries", "bucket"], m))?;
        if let Some(q) = &self.queue {
            nonzero(q.process_time, &["queue", "process_time"])?;
            nonzero(q.fail_time, &["queue", "fail_time"])?;
            if q.rate < 0.0 {
                return Err((vec![key("queue"), key("rate")], "must be 0 or more".into()));
            }
            if !(0.0..=1.0).contains(&q.poison) {
                return Err((
                    vec![key("queue"), key("poison")],
                    "must be between 0 and 1".into(),
                ));
            }
            if let Some(name) = &q.dependency
                && !self.dependencies.iter().any(|d| &d.name == name)
            {
                return Err((
                    vec![key("queue"), key("dependency")],
                    format!("no dependency named {name:?} in [[dependencies]]"),
                ));
            }
            q.worker
                .validate()
                .map_err(|m| core_error(&["queue", "worker"], m))?;
        }
        nonzero(self.lb.interval, &["lb", "interval"])?;
        nonzero(self.lb.timeout, &["lb", "timeout"])?;
        if self.lb.timeout >= self.lb.interval {
            return Err((
                vec![key("lb"), key("timeout")],
                "must be shorter than lb.interval (one probe at a time per server)".into(),
            ));
        }
        self.lb
            .pool
            .validate()
            .map_err(|m| core_error(&["lb", "pool"], m))?;
        let r = &self.lb.retries;
        if r.max_retries > MAX_LB_RETRIES {
            return Err((
                vec![key("lb"), key("retries"), key("max_retries")],
                format!("must be at most {MAX_LB_RETRIES}"),
            ));
        }
        if let Some(p) = r.per_try_timeout {
            nonzero(p, &["lb", "retries", "per_try_timeout"])?;
            if p > c.timeout {
                return Err((
                    vec![key("lb"), key("retries"), key("per_try_timeout")],
                    format!(
                        "must be at most clients.timeout ({}): the client is gone after it",
                        humantime::format_duration(c.timeout)
                    ),
                ));
            }
        }
        r.budget
            .validate()
            .map_err(|m| core_error(&["lb", "retries", "budget"], m))?;
        nonzero(self.controller.interval, &["controller", "interval"])?;
        nonzero(self.controller.timeout, &["controller", "timeout"])?;
        if self.controller.timeout >= self.controller.interval {
            return Err((
                vec![key("controller"), key("timeout")],
                "must be shorter than controller.interval".into(),
            ));
        }
        for (k, v) in [
            ("replicas", self.controller.replicas),
            ("probers", self.controller.probers),
        ] {
            if !(1..=16).contains(&v) {
                return Err((
                    vec![key("controller"), key(k)],
                    "must be between 1 and 16".into(),
                ));
            }
        }
        self.controller
            .guard
            .validate()
            .map_err(|m| core_error(&["controller", "guard"], m))?;
        self.controller
            .anomaly
            .validate()
            .map_err(|m| core_error(&["controller", "anomaly"], m))?;
        for (i, fault) in self.faults.iter().enumerate() {
            fault.validate(self).map_err(|(k, m)| {
                (
                    vec![key("faults"), PathSeg::Index(i), key(k)],
                    format!("{m} (a {:?} fault)", fault.kind),
                )
            })?;
        }
        Ok(())
    }
}

impl FaultConfig {
    fn validate(&self, s: &ScenarioConfig) -> Result<(), (&'static str, String)> {
        use FaultKind::*;
        let need = |present: bool, k: &'static str| {
            if present {
                Ok(())
            } else {
                Err((k, format!("`{k}` is required")))
            }
        };
        if self.at > s.duration {
            return Err((
                "at",
                format!(
                    "is after the end of the run (duration {})",
                    humantime::format_duration(s.duration)
                ),
            ));
        }
        match self.kind {
            Kill | DiskFill | FdLeak | GcPauses | CheckerDies | ConnBroken | Gray | Latency => {
                need(self.target.is_some(), "target")?;
            }
            _ => {}
        }
        if let Some(r) = self.ramp {
            if !matches!(self.kind, Latency | Dependency | Gray | Surge) {
                return Err((
                    "ramp",
                    "only latency, dependency, gray and surge faults ramp".into(),
                ));
            }
            if r.is_zero() {
                return Err(("ramp", "must be longer than 0s".into()));
            }
            if let Some(d) = self.duration
                && r > d
            {
                return Err((
                    "ramp",
                    format!(
                        "must be at most the fault's duration ({})",
                        humantime::format_duration(d)
                    ),
                ));
            }
        }
        if let Some(t) = &self.target {
            let set = TargetSet::parse(t).map_err(|m| ("target", m))?;
            if let TargetSet::Range(a, _) = set
                && a >= s.fleet.servers
            {
                return Err((
                    "target",
                    format!(
                        "server {a} does not exist (fleet.servers = {})",
                        s.fleet.servers
                    ),
                ));
            }
            if let TargetSet::Zone(z) = set
                && z >= s.fleet.zones
            {
                return Err((
                    "target",
                    format!("zone {z} does not exist (fleet.zones = {})", s.fleet.zones),
                ));
            }
        }
        match self.kind {
            DiskFill => need(self.fill_in.is_some(), "fill_in")?,
            FdLeak => need(self.exhaust_in.is_some(), "exhaust_in")?,
            GcPauses => {
                need(self.pause.is_some(), "pause")?;
                need(self.every.is_some(), "every")?;
                if self.pause >= self.every {
                    return Err(("pause", "must be shorter than `every`".into()));
                }
            }
            ConnBroken | Dependency => {
                need(self.dependency.is_some(), "dependency")?;
                let name = self.dependency.as_deref().unwrap_or_default();
                if !s.dependencies.iter().any(|d| d.name == name) {
                    return Err((
                        "dependency",
                        format!("no dependency named {name:?} in [[dependencies]]"),
                    ));
                }
            }
            Gray => need(self.error_rate.is_some(), "error_rate")?,
            Latency | StoreSlow => {
                need(self.latency.is_some(), "latency")?;
                if self.latency.is_some_and(|l| l.is_zero()) {
                    return Err(("latency", "must be longer than 0s".into()));
                }
            }
            Surge => need(self.load.is_some(), "load")?,
            ProberCutOff => {
                let r = self.replica.unwrap_or(0);
                if s.controller.replicas < 2 || r >= s.controller.replicas {
                    return Err((
                        "replica",
                        format!(
                            "must be below controller.replicas ({}), which must be at least 2 for probers to be cut off",
                            s.controller.replicas
                        ),
                    ));
                }
            }
            ZoneDown => {
                need(self.zone.is_some(), "zone")?;
                if self.zone.unwrap_or(0) >= s.fleet.zones {
                    return Err((
                        "zone",
                        format!("must be below fleet.zones ({})", s.fleet.zones),
                    ));
                }
            }
            Deploy => {
                need(self.waves.is_some(), "waves")?;
                need(self.wave_interval.is_some(), "wave_interval")?;
                self.rollout
                    .validate()
                    .map_err(|e| ("rollout", format!("{}: {}", e.key, e.message)))?;
                let waves = self.waves.as_deref().unwrap_or_default();
                if waves.is_empty()
                    || waves.windows(2).any(|w| w[0] >= w[1])
                    || waves.iter().any(|w| !(0.0..=1.0).contains(w) || *w == 0.0)
                {
                    return Err((
                        "waves",
                        "must be increasing cumulative fractions in (0, 1], e.g. [0.1, 0.5, 1.0]"
                            .into(),
                    ));
                }
            }
            _ => {}
        }
        if let Some(e) = self.error_rate
            && !(0.0..=1.0).contains(&e)
        {
            return Err(("error_rate", "must be between 0 and 1".into()));
        }
        if let Some(a) = self.affected
            && !(0.0..=1.0).contains(&a)
        {
            return Err(("affected", "must be between 0 and 1".into()));
        }
        if let Some(l) = self.load
            && !(l > 0.0 && l <= 100.0)
        {
            return Err(("load", "must be a multiplier above 0".into()));
        }
        Ok(())
    }

    /// The target servers.
    pub fn servers(&self, fleet: &FleetConfig) -> Vec<u32> {
        match self.kind {
            FaultKind::ZoneDown => TargetSet::Zone(self.zone.unwrap_or(0)).servers(fleet),
            _ => self
                .target
                .as_deref()
                .and_then(|t| TargetSet::parse(t).ok())
                .unwrap_or(TargetSet::All)
                .servers(fleet),
        }
    }

    /// A short label for timelines.
    pub fn label(&self) -> String {
        if let Some(l) = &self.label {
            return l.clone();
        }
        let what = format!("{:?}", self.kind);
        let mut s = String::new();
        for (i, c) in what.chars().enumerate() {
            if c.is_uppercase() && i > 0 {
                s.push(' ');
            }
            s.push(c.to_ascii_lowercase());
        }
        match (&self.target, &self.dependency) {
            (_, Some(d)) => format!("{s} {d}"),
            (Some(t), None) => format!("{s} {t}"),
            _ => s,
        }
    }
}

// === the naive comparison ===

impl ScenarioConfig {
    /// The same scenario with naive policies: the load balancer checks `/health` (deep),
    /// never fails open, balances round-robin and retries without a budget, the controller acts on every unhealthy verdict with no
    /// guard, servers have no watchdog and answer health checks from the request
    /// workers, queue workers pull without checking their host, and rollouts follow a
    /// timer. Outlier detection and thresholds are kept: they are not what the article
    /// argues about.
    pub fn naive(&self) -> ScenarioConfig {
        let mut n = self.clone();
        n.lb.check = CheckPath::Deep;
        n.lb.pool.panic_threshold = 0.0;
        n.lb.retries.limit = RetryLimit::None;
        if n.controller.mode != ControllerMode::Off {
            n.controller.mode = ControllerMode::Naive;
        }
        n.fleet.watchdog = Switch::Off;
        n.fleet.admission = Switch::Off;
        n.fleet.dependency_guard = Switch::Off;
        n.lb.retries.throttle = Switch::Off;
        n.lb.balance = Balance::RoundRobin;
        n.fleet.health_capacity = HealthCapacity::Shared;
        if let Some(q) = &mut n.queue {
            q.gate = Switch::Off;
        }
        for f in &mut n.faults {
            if f.kind == FaultKind::Deploy {
                f.gate = Some(DeployGate::None);
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> Result<Scenario, ScenarioError> {
        Scenario::parse(Path::new("x.toml"), src)
    }

    #[test]
    fn every_field_has_a_default() {
        let s = parse("").expect("an empty scenario is valid");
        assert_eq!(s.config.fleet.servers, DEFAULT_SERVERS);
        assert_eq!(s.config.name, "x");
    }

    #[test]
    fn unknown_keys_are_rejected_with_line_and_key() {
        let e = parse("[fleet]\nservers = 3\nsrevers = 4\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("srevers"), "{e}");
    }

    #[test]
    fn type_errors_name_the_key_and_line() {
        let e = parse("duration = \"1h\"\n[fleet]\nservers = \"many\"\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert_eq!(e.key.as_deref(), Some("fleet.servers"), "{e}");
    }

    #[test]
    fn validation_errors_name_the_key_and_line() {
        let src = "[[faults]]\nat = \"1m\"\nkind = \"kill\"\ntarget = \"server:0\"\n\n[[faults]]\nat = \"2m\"\nkind = \"kill\"\ntarget = \"server:99\"\n";
        let e = parse(src).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("faults[1].target"), "{e}");
        assert_eq!(e.line, Some(9), "{e}");
        let s = e.to_string();
        assert!(s.starts_with("x.toml:9:"), "{s}");
    }

    #[test]
    fn core_policy_errors_name_the_nested_key() {
        let e = parse("[lb.pool]\npanic_threshold = 1.5\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("lb.pool.panic_threshold"), "{e}");
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn retry_and_latency_keys_are_validated_with_their_names() {
        for (src, key, line) in [
            ("[clients]\nmax_attempts = 0\n", "clients.max_attempts", 2),
            (
                "[clients]\nbackoff_max = \"10m\"\n",
                "clients.backoff_max",
                2,
            ),
            (
                "[lb.retries]\nmax_retries = 9\n",
                "lb.retries.max_retries",
                2,
            ),
            (
                "[lb.retries]\nper_try_timeout = \"2s\"\n",
                "lb.retries.per_try_timeout",
                2,
            ),
            (
                "[lb.retries.budget]\nwindow = \"1ms\"\n",
                "lb.retries.budget.window",
                2,
            ),
            (
                "[fleet]\nservice_time_p99 = \"1ms\"\n",
                "fleet.service_time_p99",
                2,
            ),
            (
                "[[faults]]\nat = \"1m\"\nkind = \"latency\"\ntarget = \"all\"\n",
                "faults[0].latency",
                1,
            ),
            (
                "[[faults]]\nat = \"1m\"\nkind = \"surge\"\nload = 2.0\nduration = \"1m\"\nramp = \"2m\"\n",
                "faults[0].ramp",
                6,
            ),
            (
                "[[faults]]\nat = \"1m\"\nkind = \"kill\"\ntarget = \"all\"\nramp = \"2m\"\n",
                "faults[0].ramp",
                5,
            ),
        ] {
            let e = parse(src).expect_err(src);
            assert_eq!(e.key.as_deref(), Some(key), "{e}");
            assert_eq!(e.line, Some(line), "{e}");
        }
        let ok = "[clients]\nretry = \"backoff\"\n[lb.retries]\nmax_retries = 2\nper_try_timeout = \"500ms\"\nlimit = \"none\"\n[[faults]]\nat = \"1m\"\nkind = \"latency\"\ntarget = \"all\"\nlatency = \"2s\"\nramp = \"5m\"\n";
        let s = parse(ok).expect("valid");
        assert_eq!(s.config.clients.retry, ClientRetry::Backoff);
        assert_eq!(s.config.lb.retries.limit, RetryLimit::None);
        assert_eq!(s.config.naive().lb.retries.limit, RetryLimit::None);
        let plain = parse("").unwrap().config;
        assert_eq!(
            plain.clients.retry,
            ClientRetry::None,
            "open-loop by default"
        );
        assert_eq!(
            plain.lb.retries.max_retries, 0,
            "no balancer retries by default"
        );
        assert_eq!(plain.naive().lb.retries.limit, RetryLimit::None);
    }

    #[test]
    fn targets_parse() {
        assert_eq!(TargetSet::parse("server:3"), Ok(TargetSet::Range(3, 3)));
        assert_eq!(TargetSet::parse("servers:1-4"), Ok(TargetSet::Range(1, 4)));
        assert!(TargetSet::parse("servers:4-1").is_err());
        assert!(TargetSet::parse("fraction:2").is_err());
        let fleet = FleetConfig::default();
        assert_eq!(TargetSet::Zone(1).servers(&fleet).len(), 7);
        assert_eq!(TargetSet::Fraction(0.1).servers(&fleet), vec![0, 1]);
    }
}
