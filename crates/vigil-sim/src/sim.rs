//! The simulation: a discrete-event engine on a virtual clock, the fleet's models, and
//! the drivers that feed vigil-core's policies.
//!
//! # Engine
//!
//! Events live in a binary heap ordered by `(time, sequence)`; the sequence number (the
//! order of scheduling) breaks ties, so two events at the same instant always run in the
//! same order. Time only moves when an event is taken. Randomness comes from one seeded
//! stream ([`SimRng`]) consumed in event order, plus pure hashes for lazily evaluated
//! values. There is no wall clock, no thread and no sleep: the same scenario and seed
//! give the same run, byte for byte.
//!
//! # What is simulated, and how honestly
//!
//! - **Clients**: each tick, a Poisson number of new requests arrives (open-loop). They
//!   are spread over the load balancer's routing set in proportion to effective weight
//!   (what round-robin gives; P2C's preference for less-loaded targets is not modelled).
//!   Each request's outcome is drawn from the server's state (binomial draws over the
//!   tick's requests, so every request counts, without an event per request). With
//!   client or balancer retries, failed attempts come back ([`crate::clients`]), within
//!   vigil-core's [`RetryBudget`](vigil_core::pool::RetryBudget) for the balancer's.
//! - **Servers** have worker threads and a worker time per request (lognormal between
//!   its median and its p99, [`crate::latency`], plus a slow host's delay and slow
//!   dependencies' for the requests that call them), hence a capacity; a queue that
//!   grows when arrivals exceed it, holding what a healthy server answers within
//!   `max_queue_wait`; answers later than the attempt's deadline are timeouts (the work
//!   is done anyway); overload wastes a `brownout` share of capacity. GC pauses stop
//!   everything, health answers included; a slow host slows them too. Disks fill and
//!   file descriptors leak at set rates; some faults ramp linearly. The
//!   background checker probes dependencies every `dependency_check_interval` (evaluated
//!   lazily: the snapshot at any instant is a pure function of the dependency's history),
//!   and can die, leaving a stale snapshot that only the watchdog notices.
//! - **Health checks are check logic over the model**: `/readyz` aggregates disk, fds,
//!   watchdog, self-test and saturation checks with vigil-core's `Status::aggregate`;
//!   `/health` adds the dependency snapshot with each dependency's criticality. Probes go
//!   through the model's transport: refused when the process is down, EMFILE when fds are
//!   exhausted, stuck behind a GC pause, slowed by a slow host, and queued behind requests
//!   (shed with them when the queue is full) when health capacity is shared; past the
//!   probe timeout they fail. The background dependency check fails when the dependency
//!   answers slower than its timeout.
//! - **The load balancer** is vigil-core's [`Pool`] (thresholds, outlier ejection,
//!   fail-open, slow start), fed with every probe result and request outcome that can
//!   change its state. Elisions keep a fleet-day fast and are exact: a probe result equal
//!   to the previous one on a target whose verdict already agrees changes no decision, so
//!   it is not fed; a run of successes resets the outlier streaks exactly as one success
//!   does, so runs are fed as one; a failure run that cannot reach a threshold before a
//!   success resets it is not fed (see `feed_runs`). When a target is ejected mid-tick,
//!   the rest of its share of that tick goes to the new routing set.
//! - **The controller** probes `/health`, and asks vigil-core's [`SafetyGuard`] before
//!   replacing anyone (or, naive, replaces whoever its thresholds call unhealthy). The
//!   guard's state is persisted (serialised after the last decision and restored) across
//!   controller restarts, unless the scenario says `state = "in-memory"`. As for the
//!   pool, passing observations of a target the guard already holds healthy are elided.

use crate::clients::{Retrying, Tally};
use crate::latency::{Mixture, ServiceTime};
use crate::rng::{SimRng, hash_unit};
use crate::scenario::{
    CheckPath, ControllerMode, DepCriticality, DeployGate, FaultConfig, FaultKind, GuardStateStore,
    HealthCapacity, Readiness, ScenarioConfig, Switch,
};
use crate::summary::Summary;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Duration;
use vigil_core::anomaly::{AnomalyDetector, Counts, PEER_CHECK};
use vigil_core::gate::{GateChange, Pause, WorkerGate};
use vigil_core::guard::{GuardEvent, Observation, Outcome as GuardOutcome, SafetyGuard};
use vigil_core::outlier::{OutlierEvent, RequestOutcome};
use vigil_core::pool::{Pool, PoolEvent, RoutingSet, TargetSpec};
use vigil_core::rollout::{Command, HostSpec, Phase, Rollout};
use vigil_core::{Criticality, Health, Status, Thresholds, Time};

/// Policy time is simulation time plus this epoch, so the fleet can be warmed up
/// (checked healthy, past every grace period) "before" the run starts at t = 0.
const EPOCH: Duration = Duration::from_secs(24 * 3600);
/// The watchdog calls the background checker's snapshot stale after this many intervals
/// (plus the check timeout): one missed run is a hiccup, three is a dead checker.
const WATCHDOG_STALE_INTERVALS: u32 = 3;
/// Disk usage at which the disk check fails (and warns at [`DISK_WARN`]).
const DISK_FAIL: f64 = 0.95;
/// Disk usage at which the disk check warns.
const DISK_WARN: f64 = 0.85;
/// File-descriptor usage at which the fd check fails.
const FDS_FAIL: f64 = 0.95;
/// What a probe whose answer came too late says.
const TIMEOUT: &str = "timeout";
/// Time a reserved health thread takes to answer.
const RESERVED_HEALTH_LATENCY: Duration = Duration::from_millis(1);
/// Chart resolution: samples per run.
const SERIES_POINTS: u64 = 720;
/// Notable events kept for the report.
const MAX_LOG: usize = 400;
/// A tick whose client success rate is at least this is a good one: a fleet has
/// recovered from its last fault once every later tick is good (`recover_within`). One
/// failed request in a hundred is the usual line between an incident and noise.
const RECOVERED: f64 = 0.99;

// === rollouts ===

/// How often the simulated `vigil deploy` polls its rollout: once a second.
const DEPLOY_POLL: Duration = Duration::from_secs(1);
/// Error-rate samples fed to the rollout: every 10th poll (every 10 s per host).
const DEPLOY_SAMPLE_EVERY: u64 = 10;
/// The revision a `deploy` fault rolls out, and the one the fleet runs before.
const NEW_REVISION: &str = "v2";
const OLD_REVISION: &str = "v1";

fn revision_name(new: bool) -> &'static str {
    if new { NEW_REVISION } else { OLD_REVISION }
}

// === check names (health+json `component:measurement`) ===

const CHECK_DISK: u32 = 1 << 0;
const CHECK_FDS: u32 = 1 << 1;
const CHECK_WATCHDOG: u32 = 1 << 2;
const CHECK_SELFTEST: u32 = 1 << 3;
/// Not a check of the server: the controller's comparison of a queue worker with its
/// peers (`vigil_core::anomaly`), which the controller adds to its probe's result.
const CHECK_PEER: u32 = 1 << 4;
const CHECK_DEP0: u32 = 8;
const LOCAL_CHECK_NAMES: [&str; 5] = [
    "disk:utilization",
    "fds:utilization",
    "watchdog:freshness",
    "lifecycle:self-test",
    PEER_CHECK,
];

/// One sample of the run's timeline (one of about 720 buckets).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// Start of the bucket, seconds.
    pub t: f64,
    /// Client requests in the bucket.
    pub requests: u64,
    /// Failed client requests in the bucket.
    pub failures: u64,
    /// Fewest servers in service during the bucket.
    pub in_service_min: u32,
    /// Fraction of the bucket spent in fail-open.
    pub fail_open: f64,
    /// Servers up (process running) at the end of the bucket.
    pub up: u32,
}

/// A fault on the timeline, for charts.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    /// Start, seconds.
    pub start: f64,
    /// End, seconds (the run's end when open).
    pub end: Option<f64>,
    /// What.
    pub label: String,
}

/// A policy decision on the timeline, for charts: why the lines move.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// When, seconds.
    pub t: f64,
    /// What kind: `fail-open`, `fail-open-end`, `freeze`, `unfreeze`, `alert`, `ejection`.
    pub kind: &'static str,
    /// The policy's own words (its event's `Display`).
    pub label: String,
}

/// Ejections marked on the charts at most (the rest are counted in the summary): a
/// gray failure ejects thousands of times a day, which would bury the other marks.
const MAX_EJECTION_MARKS: usize = 200;

/// Everything a run produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The numbers.
    pub summary: Summary,
    /// The timeline.
    pub series: Vec<Sample>,
    /// Faults.
    pub marks: Vec<Mark>,
    /// Policy decisions (fail-open, freezes, ejections).
    pub decisions: Vec<Decision>,
    /// Notable events (state changes with reasons), in order.
    pub log: Vec<(Duration, String)>,
}

// === engine ===

#[derive(Clone, Copy, Debug)]
enum Ev {
    Tick,
    LbProbe(u32),
    LbProbeDone {
        server: u32,
        incarnation: u32,
        ok: bool,
        detail: &'static str,
    },
    CtlProbe(u32),
    CtlProbeDone {
        server: u32,
        incarnation: u32,
        endpoint_failed: bool,
        failing: u32,
    },
    CtlRound,
    FaultStart(u16),
    FaultEnd(u16),
    Boot {
        server: u32,
        incarnation: u32,
    },
    DeployWave {
        fault: u16,
        wave: u16,
    },
    /// vigil's rollout policy's turn: feed it the hosts' health and error rates, carry out
    /// its commands.
    DeployPoll {
        fault: u16,
    },
    ControllerUp,
}

/// A strictly periodic event per server (active probes): presorted phases walked in
/// cycles, so a fleet's probes cost no heap operations.
#[derive(Default)]
struct Periodic {
    /// (phase in ns, server), sorted.
    phases: Vec<(u64, u32)>,
    interval: u64,
    cycle: u64,
    next: usize,
}

impl Periodic {
    fn new(mut phases: Vec<(u64, u32)>, interval: Duration) -> Self {
        phases.sort_unstable();
        Periodic {
            phases,
            interval: interval.as_nanos() as u64,
            cycle: 0,
            next: 0,
        }
    }

    fn next_at(&self) -> Option<Time> {
        let (phase, _) = self.phases.get(self.next)?;
        Some(Time::ZERO + Duration::from_nanos(self.cycle * self.interval + phase))
    }

    fn advance(&mut self) -> u32 {
        let server = self.phases[self.next].1;
        self.next += 1;
        if self.next == self.phases.len() {
            self.next = 0;
            self.cycle += 1;
        }
        server
    }
}

struct Scheduled {
    at: Time,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap, we want the earliest first.
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

// === models ===

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    Up,
    Down,
    Booting,
}

/// A quantity growing linearly from `base` at `t0` by `rate` per second.
#[derive(Clone, Copy, Debug)]
struct Growth {
    base: f64,
    t0: Time,
    rate: f64,
}

impl Growth {
    fn flat(base: f64) -> Self {
        Growth {
            base,
            t0: Time::ZERO,
            rate: 0.0,
        }
    }
    fn at(&self, now: Time) -> f64 {
        self.base + self.rate * now.since(self.t0).as_secs_f64()
    }
}

/// A fault growing linearly to its full size over `len` from `start`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ramp {
    start: Time,
    len: Duration,
}

impl Ramp {
    fn new(start: Time, len: Option<Duration>) -> Option<Ramp> {
        len.map(|len| Ramp { start, len })
    }

    /// How far the ramp is at `t`: 0 before it starts, 1 once it is over.
    fn progress(&self, t: Time) -> f64 {
        if t <= self.start {
            return 0.0;
        }
        if self.len.is_zero() {
            return 1.0;
        }
        (t.since(self.start).as_secs_f64() / self.len.as_secs_f64()).min(1.0)
    }

    /// When the ramp reaches `fraction` of its size.
    fn reaches(&self, fraction: f64) -> Time {
        self.start + self.len.mul_f64(fraction.clamp(0.0, 1.0))
    }
}

/// A fault's size at a given time: `to`, reached at the end of its ramp, if any.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Ramped {
    to: f64,
    ramp: Option<Ramp>,
}

impl Ramped {
    fn at(&self, t: Time) -> f64 {
        match self.ramp {
            None => self.to,
            Some(r) => self.to * r.progress(t),
        }
    }

    fn is_zero(&self) -> bool {
        self.to == 0.0
    }
}

#[derive(Clone, Copy, Debug)]
struct Gc {
    start: Time,
    pause: Duration,
    every: Duration,
}

impl Gc {
    /// Remaining pause at `now`, if paused.
    fn remaining(&self, now: Time) -> Option<Duration> {
        if now < self.start {
            return None;
        }
        let into = now.since(self.start).as_nanos() % self.every.as_nanos();
        let into = Duration::from_nanos(into as u64);
        (into < self.pause).then(|| self.pause - into)
    }
    /// Paused fraction of `[now, now + dt)`.
    fn paused_fraction(&self, now: Time, dt: Duration) -> f64 {
        let end = now + dt;
        if end <= self.start {
            return 0.0;
        }
        let from = now.max(self.start);
        let every = self.every.as_nanos();
        let mut k = from.since(self.start).as_nanos() / every;
        let mut paused = 0u128;
        loop {
            let ps = self.start.as_elapsed().as_nanos() + k * every;
            let pe = ps + self.pause.as_nanos();
            let (a, b) = (
                ps.max(from.as_elapsed().as_nanos()),
                pe.min(end.as_elapsed().as_nanos()),
            );
            if b > a {
                paused += b - a;
            }
            if ps >= end.as_elapsed().as_nanos() {
                break;
            }
            k += 1;
        }
        paused as f64 / dt.as_nanos() as f64
    }
}

#[derive(Clone, Debug)]
struct Server {
    zone: u32,
    incarnation: u32,
    life: Life,
    boot_at: Time,
    /// Background checker phase within its interval.
    phase: Duration,
    backlog: u64,
    disk: Growth,
    fds: Growth,
    gc: Option<Gc>,
    checker_dead_at: Option<Time>,
    /// (dependency, since, until)
    conn_broken: Option<(usize, Time, Option<Time>)>,
    /// Share of requests failing (a gray failure).
    gray: Ramped,
    /// Extra worker time of every request and health answer, seconds (a slow host).
    slow: Ramped,
    bad_version: bool,
    /// Runs the revision being rolled out (bad or not).
    new_revision: bool,
    /// Replaced by the controller while it was up (capacity the system took out).
    replaced_while_up: bool,
    /// Arrivals exceeded capacity in the last tick (brownout).
    overloaded: bool,
    /// Its queue was full in the last tick: it shed arrivals (503).
    shedding: bool,
}

#[derive(Clone, Copy, Debug)]
struct DepCond {
    error_rate: f64,
    extra_latency: Duration,
    affected: f64,
    key: u64,
    /// Ramping from `from_error_rate` (and no extra latency) to the values above.
    ramp: Option<Ramp>,
    from_error_rate: f64,
}

impl DepCond {
    fn error_rate_at(&self, t: Time) -> f64 {
        match self.ramp {
            None => self.error_rate,
            Some(r) => {
                self.from_error_rate + (self.error_rate - self.from_error_rate) * r.progress(t)
            }
        }
    }

    /// Extra latency, seconds.
    fn extra_at(&self, t: Time) -> f64 {
        let full = self.extra_latency.as_secs_f64();
        self.ramp.map_or(full, |r| full * r.progress(t))
    }
}

struct Dep {
    latency: Duration,
    request_fraction: f64,
    criticality: DepCriticality,
    /// Conditions over time, first at t = 0.
    history: Vec<(Time, DepCond)>,
}

impl Dep {
    fn cond_at(&self, t: Time) -> &DepCond {
        self.history
            .iter()
            .rev()
            .find(|(at, _)| *at <= t)
            .map(|(_, c)| c)
            .unwrap_or(&self.history[0].1)
    }
}

#[derive(Clone, Copy, Debug)]
struct Probe {
    ok: bool,
    latency: Duration,
    endpoint_failed: bool,
    failing: u32,
    detail: &'static str,
}

struct Deployment {
    fault: u16,
    /// Timer rollout: servers `0..deployed` got the new version.
    deployed: u32,
    halted: bool,
    /// vigil's rollout (`gate = "health"`), the policy `vigil deploy` drives.
    rollout: Option<Box<Rollout>>,
    /// Its decisions already noted, and the last wave counted.
    seen_decisions: usize,
    last_wave: Option<usize>,
    rolling_back: bool,
    polls: u64,
}

/// The controller's state that a restart loses (the guard's may be persisted).
struct Controller {
    up: bool,
    guard: SafetyGuard,
    /// Naive mode: thresholds per server.
    naive: Vec<Thresholds>,
    /// Consecutive passes fed per server (for the exact elision).
    passes_fed: Vec<u32>,
    /// When a server's grace period ends (policy time).
    grace_end: Vec<Time>,
    /// Queue workers compared with their peers, as `vigil controller` does with the
    /// counters workers report (kept in memory there too: a restart starts afresh).
    anomaly: AnomalyDetector,
    /// Per server: the comparison's last verdict said outlier.
    outlier: Vec<bool>,
}

/// One simulation run.
pub struct Sim<'a> {
    cfg: &'a ScenarioConfig,
    seed: u64,
    now: Time,
    seq: u64,
    heap: BinaryHeap<Scheduled>,
    /// Requests/s one server serves.
    cap_rate: f64,
    /// A healthy server's worker time per request.
    service: ServiceTime,
    /// An attempt's deadline at the balancer, seconds: the per-try timeout, else the
    /// client's.
    deadline: f64,
    /// This tick, a plain server's requests all take the same time, under the deadline
    /// when they do not queue (no tail, no slow dependency).
    tick_plain_punctual: bool,
    /// Client and balancer retries, when the scenario has any.
    retrying: Option<Retrying>,
    /// This tick's failure probability of plain servers' requests, when uniform.
    tick_fail_prob: Option<f64>,
    /// Requests one server serves in a tick.
    tick_full_cap: f64,
    /// Round-robin position across ticks (equal-weight apportionment).
    rr: u64,
    lb_probes: Periodic,
    ctl_probes: Periodic,
    rng: SimRng,
    servers: Vec<Server>,
    deps: Vec<Dep>,
    zone_down: Vec<bool>,
    surge: f64,
    /// The surge in progress: (load multiplier, ramp).
    surge_fault: Option<(f64, Option<Ramp>)>,
    // load balancer
    pool: Pool<u32>,
    routes: RoutingSet<u32>,
    routes_dirty: bool,
    lb_health: Vec<Health>,
    lb_last_ok: Vec<bool>,
    ejected: Vec<bool>,
    outlier_dirty: Vec<bool>,
    /// Mirror of the outlier detector's (5xx, gateway) streaks per target.
    streaks: Vec<(u32, u32)>,
    ejected_count: usize,
    weights: Vec<f64>,
    /// Reused buffers of `feed_outcomes`.
    runs_buf: Vec<(Option<RequestOutcome>, u64)>,
    pos_buf: Vec<u64>,
    served_tick: Vec<u64>,
    tick_no: u64,
    // controller
    ctl: Controller,
    ctl_ids: Vec<String>,
    zone_names: Vec<String>,
    dep_check_names: Vec<String>,
    deployments: Vec<Deployment>,
    // queue
    queue_backlog: u64,
    /// Per server: its worker gate (the library's `WorkerGate`), when the queue's gate is
    /// on; rebuilt when the server is replaced.
    gates: Vec<WorkerGate>,
    /// Per server: messages this incarnation handled, and failed (what a worker reports).
    msg_totals: Vec<Counts>,
    // detection: per server, when its harm started (pending detection)
    pending_detect: Vec<Option<Time>>,
    pending_count: usize,
    detect_times: Vec<Duration>,
    first_fault_at: Option<Time>,
    fail_open_since: Option<Time>,
    /// The pool was ramping the unhealthy servers' shares down at the last tick.
    leaving_fail_open: bool,
    // metrics
    s: Summary,
    /// End of the last tick whose client success rate was below [`RECOVERED`].
    last_bad_tick_end: Option<Time>,
    in_service_sum: f64,
    ticks: u64,
    series: Vec<Sample>,
    bucket: Duration,
    marks: Vec<Mark>,
    decisions: Vec<Decision>,
    ejection_marks: usize,
    log: Vec<(Duration, String)>,
    log_dropped: u64,
}

/// Runs `cfg` with `seed`. `naive` only labels the summary (pass `cfg.naive()` for the
/// naive policies). `progress` is called with the fraction done, now and then.
pub fn run(cfg: &ScenarioConfig, seed: u64, naive: bool, progress: &mut dyn FnMut(f64)) -> Outcome {
    let mut sim = Sim::new(cfg, seed, naive);
    sim.run(progress);
    sim.finish()
}

impl<'a> Sim<'a> {
    fn new(cfg: &'a ScenarioConfig, seed: u64, naive: bool) -> Self {
        let n = cfg.fleet.servers as usize;
        let mut rng = SimRng::new(seed);
        let interval = cfg.fleet.dependency_check_interval;
        let servers: Vec<Server> = (0..n)
            .map(|i| Server {
                zone: i as u32 % cfg.fleet.zones,
                incarnation: 0,
                life: Life::Up,
                boot_at: Time::ZERO,
                phase: Duration::from_nanos(rng.below(interval.as_nanos() as u64)),
                backlog: 0,
                disk: Growth::flat(cfg.fleet.disk_used),
                fds: Growth::flat(f64::from(cfg.fleet.fds_used)),
                gc: None,
                checker_dead_at: None,
                conn_broken: None,
                gray: Ramped::default(),
                slow: Ramped::default(),
                bad_version: false,
                new_revision: false,
                replaced_while_up: false,
                overloaded: false,
                shedding: false,
            })
            .collect();
        let deps = cfg
            .dependencies
            .iter()
            .map(|d| Dep {
                latency: d.latency,
                request_fraction: d.request_fraction,
                criticality: d.criticality,
                history: vec![(
                    Time::ZERO,
                    DepCond {
                        error_rate: d.error_rate,
                        extra_latency: Duration::ZERO,
                        affected: 1.0,
                        key: 0,
                        ramp: None,
                        from_error_rate: d.error_rate,
                    },
                )],
            })
            .collect();
        let ctl_ids: Vec<String> = (0..n).map(|i| format!("server-{i:04}")).collect();
        let zone_names: Vec<String> = (0..cfg.fleet.zones).map(|z| format!("zone-{z}")).collect();
        let mut guard = SafetyGuard::new(cfg.controller.guard.clone());
        let warm =
            Time::from_elapsed(EPOCH) - cfg.controller.guard.grace - Duration::from_secs(600);
        for (i, s) in servers.iter().enumerate() {
            guard.add_target(warm, &ctl_ids[i], &zone_names[s.zone as usize]);
        }
        let k = cfg.controller.guard.thresholds.healthy_threshold + 1;
        for j in 0..k {
            let t = warm + cfg.controller.guard.grace + Duration::from_secs(u64::from(j) + 1);
            for (i, s) in servers.iter().enumerate() {
                guard.observe(
                    t,
                    &Observation::pass(&ctl_ids[i], &zone_names[s.zone as usize]),
                );
            }
        }
        guard.drain_events();
        let ctl = Controller {
            up: true,
            guard,
            naive: (0..n)
                .map(|_| Thresholds::new_healthy(cfg.controller.guard.thresholds, Time::ZERO))
                .collect(),
            passes_fed: vec![k; n],
            grace_end: vec![Time::ZERO; n],
            anomaly: AnomalyDetector::new(cfg.controller.anomaly.clone()),
            outlier: vec![false; n],
        };
        let mut pool = Pool::new("fleet", cfg.lb.pool);
        let warm = Time::from_elapsed(EPOCH) - Duration::from_secs(60);
        for i in 0..n as u32 {
            pool.add_target(
                i,
                TargetSpec {
                    zone: None,
                    ..TargetSpec::default()
                },
                warm,
            );
        }
        for j in 0..cfg.lb.pool.thresholds.healthy_threshold {
            for i in 0..n as u32 {
                pool.observe_probe(
                    &i,
                    warm + Duration::from_secs(u64::from(j)),
                    true,
                    "warm-up",
                );
            }
        }
        let dep_check_names = cfg
            .dependencies
            .iter()
            .map(|d| format!("{}:connect", d.name))
            .collect();
        let bucket = (cfg.duration / SERIES_POINTS as u32).max(cfg.tick);
        let bucket = Duration::from_nanos(
            bucket.as_nanos().div_ceil(cfg.tick.as_nanos()) as u64 * cfg.tick.as_nanos() as u64,
        );
        let mut sim = Sim {
            cfg,
            seed,
            now: Time::ZERO,
            seq: 0,
            heap: BinaryHeap::new(),
            cap_rate: cfg.fleet.server_capacity(),
            service: cfg.fleet.service(),
            deadline: cfg
                .lb
                .retries
                .per_try_timeout
                .unwrap_or(cfg.clients.timeout)
                .as_secs_f64(),
            tick_plain_punctual: true,
            retrying: Retrying::new(cfg),
            tick_fail_prob: None,
            tick_full_cap: cfg.fleet.server_capacity() * cfg.tick.as_secs_f64(),
            rr: 0,
            lb_probes: Periodic::default(),
            ctl_probes: Periodic::default(),
            rng,
            servers,
            deps,
            zone_down: vec![false; cfg.fleet.zones as usize],
            surge: 1.0,
            surge_fault: None,
            pool,
            routes: RoutingSet::default(),
            routes_dirty: true,
            lb_health: vec![Health::Healthy; n],
            lb_last_ok: vec![true; n],
            ejected: vec![false; n],
            outlier_dirty: vec![false; n],
            streaks: vec![(0, 0); n],
            ejected_count: 0,
            weights: Vec::with_capacity(n),
            runs_buf: Vec::new(),
            pos_buf: Vec::new(),
            served_tick: vec![u64::MAX; n],
            tick_no: 0,
            ctl,
            ctl_ids,
            zone_names,
            dep_check_names,
            deployments: Vec::new(),
            queue_backlog: 0,
            gates: match &cfg.queue {
                Some(q) if q.gate == Switch::On => (0..n)
                    .map(|_| WorkerGate::new(q.worker.clone(), Self::pt(Time::ZERO)))
                    .collect(),
                _ => Vec::new(),
            },
            msg_totals: vec![Counts::default(); n],
            pending_detect: vec![None; n],
            pending_count: 0,
            detect_times: Vec::new(),
            first_fault_at: None,
            fail_open_since: None,
            leaving_fail_open: false,
            s: Summary::new(cfg, seed, naive),
            last_bad_tick_end: None,
            in_service_sum: 0.0,
            ticks: 0,
            series: Vec::new(),
            bucket,
            marks: Vec::new(),
            decisions: Vec::new(),
            ejection_marks: 0,
            log: Vec::new(),
            log_dropped: 0,
        };
        sim.s.min_in_service = n as u32;
        sim.schedule(Time::ZERO, Ev::Tick);
        let mut lb = Vec::with_capacity(n);
        let mut ctl = Vec::with_capacity(n);
        for i in 0..n as u32 {
            lb.push((sim.rng.below(cfg.lb.interval.as_nanos() as u64), i));
            if cfg.controller.mode != ControllerMode::Off {
                ctl.push((sim.rng.below(cfg.controller.interval.as_nanos() as u64), i));
            }
        }
        sim.lb_probes = Periodic::new(lb, cfg.lb.interval);
        sim.ctl_probes = Periodic::new(ctl, cfg.controller.interval);
        if cfg.controller.mode != ControllerMode::Off {
            sim.schedule(Time::ZERO + cfg.controller.interval, Ev::CtlRound);
        }
        for (i, f) in cfg.faults.iter().enumerate() {
            sim.schedule(Time::from_elapsed(f.at), Ev::FaultStart(i as u16));
        }
        sim
    }

    fn schedule(&mut self, at: Time, ev: Ev) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at,
            seq: self.seq,
            ev,
        });
    }

    /// Policy time for simulation time `t`.
    fn pt(t: Time) -> Time {
        t + EPOCH
    }

    fn note(&mut self, msg: String) {
        if self.log.len() < MAX_LOG {
            self.log.push((self.now.as_elapsed(), msg));
        } else {
            self.log_dropped += 1;
        }
    }

    fn run(&mut self, progress: &mut dyn FnMut(f64)) {
        let end = Time::from_elapsed(self.cfg.duration);
        let step = (self.cfg.duration / 100).max(Duration::from_secs(1));
        let mut next_progress = Time::ZERO + step;
        loop {
            // Merge the heap with the two periodic probe streams (earliest first; on a
            // tie the heap, then LB probes, then controller probes: fixed, so
            // deterministic).
            let heap_at = self.heap.peek().map(|s| s.at);
            let lb_at = self.lb_probes.next_at();
            let ctl_at = self.ctl_probes.next_at();
            let first = [heap_at, lb_at, ctl_at].into_iter().flatten().min();
            let Some(at) = first else { break };
            let ev = if heap_at == Some(at) {
                self.heap.pop().expect("peeked").ev
            } else if lb_at == Some(at) {
                Ev::LbProbe(self.lb_probes.advance())
            } else {
                Ev::CtlProbe(self.ctl_probes.advance())
            };
            if at >= end {
                break;
            }
            self.now = at;
            self.s.events += 1;
            if at >= next_progress {
                progress(at.as_elapsed().as_secs_f64() / self.cfg.duration.as_secs_f64());
                next_progress = at + step;
            }
            self.handle(ev);
        }
        self.now = end;
        progress(1.0);
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Tick => self.on_tick(),
            Ev::LbProbe(i) => self.on_lb_probe(i),
            Ev::LbProbeDone {
                server,
                incarnation,
                ok,
                detail,
            } => self.on_lb_probe_done(server, incarnation, ok, detail),
            Ev::CtlProbe(i) => self.on_ctl_probe(i),
            Ev::CtlProbeDone {
                server,
                incarnation,
                endpoint_failed,
                failing,
            } => self.on_ctl_probe_done(server, incarnation, endpoint_failed, failing),
            Ev::CtlRound => self.on_ctl_round(),
            Ev::FaultStart(f) => self.on_fault(f as usize, true),
            Ev::FaultEnd(f) => self.on_fault(f as usize, false),
            Ev::Boot {
                server,
                incarnation,
            } => self.on_boot(server, incarnation),
            Ev::DeployWave { fault, wave } => self.on_deploy_wave(fault, wave),
            Ev::DeployPoll { fault } => self.on_deploy_poll(fault),
            Ev::ControllerUp => self.on_controller_up(),
        }
    }

    // === servers ===

    fn is_up(&self, i: usize) -> bool {
        let s = &self.servers[i];
        s.life == Life::Up && !self.zone_down[s.zone as usize]
    }

    fn capacity(&self) -> f64 {
        self.cap_rate
    }

    fn fds_exhausted(&self, i: usize, now: Time) -> bool {
        self.servers[i].fds.at(now) >= f64::from(self.cfg.fleet.fd_limit)
    }

    fn disk_full(&self, i: usize, now: Time) -> bool {
        self.servers[i].disk.at(now) >= 1.0
    }

    /// Dependency `d` as server `i` sees it at `t`: its error rate, and its extra latency
    /// in seconds (beyond its typical latency, which is part of the service time).
    fn dep_for(&self, i: usize, d: usize, t: Time) -> (f64, f64) {
        let dep = &self.deps[d];
        let c = dep.cond_at(t);
        let base = dep.history[0].1;
        let reaches = c.affected >= 1.0
            || hash_unit(self.seed, &[0xDE9, d as u64, c.key, i as u64]) < c.affected;
        let (mut err, extra) = if reaches {
            (c.error_rate_at(t), c.extra_at(t))
        } else {
            (base.error_rate, 0.0)
        };
        if let Some((bd, since, until)) = self.servers[i].conn_broken
            && bd == d
            && since <= t
            && until.is_none_or(|u| t < u)
        {
            err = 1.0;
        }
        (err, extra)
    }

    /// Whether server `i` has no fault of its own (its requests fail only through
    /// dependencies, like every other such server).
    fn is_plain(&self, i: usize) -> bool {
        let s = &self.servers[i];
        s.gc.is_none()
            && s.disk.rate == 0.0
            && s.disk.base < 1.0
            && s.fds.rate == 0.0
            && s.gray.is_zero()
            && s.slow.is_zero()
            && !s.bad_version
            && s.conn_broken.is_none()
    }

    /// The failure probability of a plain server's requests at `now`, when it is the same
    /// for every plain server (no partial dependency failure); `None` otherwise. (Slow
    /// dependencies make requests late, not failed: see [`Sim::mixture`].)
    fn fleet_fail_prob(&self, now: Time) -> Option<f64> {
        let mut ok = 1.0;
        for dep in &self.deps {
            let c = dep.cond_at(now);
            if c.affected < 1.0 {
                return None;
            }
            let err = c.error_rate_at(now);
            if err > 0.0 && dep.criticality == DepCriticality::Critical {
                ok *= 1.0 - dep.request_fraction * err;
            }
        }
        Some((1.0 - ok).clamp(0.0, 1.0))
    }

    /// Whether a plain server's requests all take the same time at `now`, under the
    /// attempt deadline when they do not queue.
    fn plain_punctual(&self, now: Time) -> bool {
        self.service.is_constant()
            && self.service.median() <= self.deadline
            && self
                .deps
                .iter()
                .all(|d| d.cond_at(now).extra_at(now) == 0.0)
    }

    /// The worker time of server `i`'s requests at `now`: the service time, plus its
    /// host's slowness, plus the extra latency of each dependency for the requests that
    /// call it (a request waiting on a dependency holds its worker).
    fn mixture(&self, i: usize, now: Time) -> Mixture {
        let mut m = Mixture::new(self.service, self.servers[i].slow.at(now));
        for d in 0..self.deps.len() {
            let (_, extra) = self.dep_for(i, d, now);
            m.split(self.deps[d].request_fraction, extra);
        }
        m
    }

    /// Requests/s server `i` serves at `now` (before brownout and pauses).
    fn server_rate(&self, i: usize, now: Time) -> f64 {
        if self.is_plain(i) && self.tick_plain_punctual {
            return self.cap_rate;
        }
        f64::from(self.cfg.fleet.workers) / self.mixture(i, now).mean()
    }

    /// Probability that a request served by `i` at `now` fails.
    fn request_fail_prob(&self, i: usize, now: Time) -> f64 {
        if let Some(p) = self.tick_fail_prob
            && self.is_plain(i)
        {
            return p;
        }
        let s = &self.servers[i];
        if self.disk_full(i, now) {
            return 1.0;
        }
        let mut ok = 1.0 - s.gray.at(now);
        if s.bad_version {
            ok *= 1.0 - self.deploy_error_rate();
        }
        for d in 0..self.deps.len() {
            let (err, _) = self.dep_for(i, d, now);
            if err > 0.0 && self.deps[d].criticality == DepCriticality::Critical {
                ok *= 1.0 - self.deps[d].request_fraction * err;
            }
        }
        (1.0 - ok).clamp(0.0, 1.0)
    }

    fn deploy_error_rate(&self) -> f64 {
        self.deployments
            .last()
            .and_then(|d| self.cfg.faults[d.fault as usize].error_rate)
            .unwrap_or(0.0)
    }

    fn deploy_readiness_fails(&self) -> bool {
        self.deployments.last().is_some_and(|d| {
            self.cfg.faults[d.fault as usize]
                .readiness
                .unwrap_or_default()
                == Readiness::Fails
        })
    }

    /// The background checker's last completed run at `now`: its time and index.
    fn last_check_run(&self, i: usize, now: Time) -> (Time, u64) {
        let s = &self.servers[i];
        let horizon = s.checker_dead_at.map_or(now, |d| d.min(now));
        let first = s.boot_at + s.phase;
        if horizon < first {
            return (s.boot_at, u64::MAX);
        }
        // u64 nanoseconds (584 years) rather than u128: this runs on every probe.
        let interval = self.cfg.fleet.dependency_check_interval.as_nanos() as u64;
        let k = horizon.since(first).as_nanos() as u64 / interval;
        (first + Duration::from_nanos(k * interval), k)
    }

    /// The server's health checks at `now`: a bitmask of failing checks and the aggregate
    /// status, `deep` adding the dependency snapshot.
    fn checks(&self, i: usize, now: Time, deep: bool) -> (u32, Status) {
        let s = &self.servers[i];
        let f = &self.cfg.fleet;
        let mut failing = 0u32;
        // vigil-core's aggregation, folded as we go: worst of the weighted statuses.
        let mut status = Status::Pass;
        let mut add = |st: Status, crit: Criticality| status = status.worst(st.weighted(crit));
        let disk = s.disk.at(now);
        if disk >= DISK_FAIL {
            failing |= CHECK_DISK;
            add(Status::Fail, Criticality::Critical);
        } else if disk >= DISK_WARN {
            add(Status::Warn, Criticality::Critical);
        }
        if s.fds.at(now) >= FDS_FAIL * f64::from(f.fd_limit) {
            failing |= CHECK_FDS;
            add(Status::Fail, Criticality::Critical);
        }
        let (last_run, k) = self.last_check_run(i, now);
        if f.watchdog == Switch::On {
            let stale =
                f.dependency_check_interval * WATCHDOG_STALE_INTERVALS + f.dependency_check_timeout;
            if now.since(last_run) > stale {
                failing |= CHECK_WATCHDOG;
                add(Status::Fail, Criticality::Critical);
            }
        }
        if s.bad_version && self.deploy_readiness_fails() {
            failing |= CHECK_SELFTEST;
            add(Status::Fail, Criticality::Critical);
        }
        if s.backlog > 0 {
            // Saturation only warns: a busy server is still a server.
            add(Status::Warn, Criticality::Critical);
        }
        if deep {
            for d in 0..self.deps.len().min(32 - CHECK_DEP0 as usize) {
                let (err, extra) = self.dep_for(i, d, last_run);
                // The check times out when the dependency answers slower than its timeout.
                let lat = self.deps[d].latency.as_secs_f64() + extra;
                let failed = lat > f.dependency_check_timeout.as_secs_f64()
                    || (err > 0.0
                        && hash_unit(
                            self.seed,
                            &[i as u64, u64::from(s.incarnation), k, d as u64],
                        ) < err);
                if failed {
                    let crit = match self.deps[d].criticality {
                        DepCriticality::Critical => {
                            failing |= 1 << (CHECK_DEP0 + d as u32);
                            Criticality::Critical
                        }
                        DepCriticality::NonCritical => Criticality::NonCritical,
                    };
                    add(Status::Fail, crit);
                }
            }
        }
        (failing, status)
    }

    /// Probes server `i`'s `/readyz` (or `/health` when `deep`) at `now`.
    fn probe(&self, i: usize, now: Time, deep: bool, timeout: Duration) -> Probe {
        let fail = |latency, detail| Probe {
            ok: false,
            latency,
            endpoint_failed: true,
            failing: 0,
            detail,
        };
        if !self.is_up(i) {
            return fail(Duration::ZERO, "connection refused");
        }
        if self.fds_exhausted(i, now) {
            return fail(Duration::ZERO, "connection reset: accept failed (EMFILE)");
        }
        let s = &self.servers[i];
        if self.cfg.fleet.health_capacity == HealthCapacity::Shared && s.shedding {
            // A probe is a request like any other: a full queue sheds it.
            return fail(self.cfg.fleet.service_time, "HTTP 503 shed");
        }
        let mut latency = s.gc.and_then(|g| g.remaining(now)).unwrap_or_default();
        // A slow host answers health checks slowly too, on whatever thread.
        let slow = Duration::from_secs_f64(s.slow.at(now));
        latency += slow
            + match self.cfg.fleet.health_capacity {
                HealthCapacity::Reserved => RESERVED_HEALTH_LATENCY,
                HealthCapacity::Shared => {
                    // Behind the whole queue, drained at the (browned-out) service rate.
                    let eff = if s.overloaded {
                        1.0 - self.cfg.fleet.brownout
                    } else {
                        1.0
                    };
                    Duration::from_secs_f64(s.backlog as f64 / (self.server_rate(i, now) * eff))
                        + self.cfg.fleet.service_time
                }
            };
        if latency > timeout {
            return fail(timeout, TIMEOUT);
        }
        let (failing, status) = self.checks(i, now, deep);
        let ok = status != Status::Fail;
        Probe {
            ok,
            latency,
            endpoint_failed: false,
            failing,
            detail: if ok { "HTTP 200" } else { "HTTP 503 fail" },
        }
    }

    fn check_names(&self, mask: u32) -> Vec<String> {
        let mut v = Vec::new();
        for (b, name) in LOCAL_CHECK_NAMES.iter().enumerate() {
            if mask & (1 << b) != 0 {
                v.push((*name).to_string());
            }
        }
        for (d, name) in self.dep_check_names.iter().enumerate() {
            if mask & (1 << (CHECK_DEP0 + d as u32)) != 0 {
                v.push(name.clone());
            }
        }
        v
    }

    // === load balancer ===

    fn in_service(&self, i: usize) -> bool {
        self.lb_health[i] == Health::Healthy && !self.ejected[i]
    }

    fn pool_events(&mut self, events: Vec<PoolEvent<u32>>) {
        for e in events {
            self.routes_dirty = true;
            match &e {
                PoolEvent::Health {
                    target, from, to, ..
                } => {
                    let i = *target as usize;
                    self.lb_health[i] = *to;
                    if *from == Health::Healthy && *to == Health::Unhealthy {
                        self.s.lb_removals += 1;
                    }
                }
                PoolEvent::Outlier { event, .. } => match event {
                    OutlierEvent::Ejected { target, .. } => {
                        self.ejected[*target as usize] = true;
                        self.ejected_count += 1;
                        self.s.ejections += 1;
                    }
                    OutlierEvent::Readmitted { target, .. } => {
                        // Readmission resets both streaks.
                        self.ejected[*target as usize] = false;
                        self.ejected_count -= 1;
                        self.streaks[*target as usize] = (0, 0);
                        self.outlier_dirty[*target as usize] = false;
                    }
                    OutlierEvent::EjectionSkipped { .. } => {
                        self.s.ejections_skipped += 1;
                        continue; // not worth a log line each
                    }
                },
                PoolEvent::FailOpen { entered, .. } => {
                    if *entered {
                        self.s.fail_open_episodes += 1;
                        self.fail_open_since = Some(self.now);
                        if let Some(f) = self.first_fault_at
                            && self.s.first_fail_open_after_fault.is_none()
                        {
                            self.s.first_fail_open_after_fault = Some(self.now.since(f));
                        }
                    } else if let Some(since) = self.fail_open_since.take() {
                        self.s.fail_open_time += self.now.since(since);
                    }
                }
            }
            let line = e.to_string();
            let kind = match &e {
                PoolEvent::FailOpen { entered: true, .. } => Some("fail-open"),
                PoolEvent::FailOpen { entered: false, .. } => Some("fail-open-end"),
                PoolEvent::Outlier {
                    event: OutlierEvent::Ejected { .. },
                    ..
                } if self.ejection_marks < MAX_EJECTION_MARKS => {
                    self.ejection_marks += 1;
                    Some("ejection")
                }
                _ => None,
            };
            if let Some(kind) = kind {
                self.decide_mark(kind, &line);
            }
            self.note(format!("lb: {line}"));
        }
    }

    fn on_lb_probe(&mut self, i: u32) {
        let now = self.now;
        let iu = i as usize;
        let deep = self.cfg.lb.check == CheckPath::Deep;
        let p = self.probe(iu, now, deep, self.cfg.lb.timeout);
        if p.detail == TIMEOUT {
            self.s.check_timeouts += 1;
        }
        // Exact elision: a result equal to the previous one, on a target whose verdict
        // already agrees with it, only lengthens a streak past its threshold.
        let settled = if p.ok {
            Health::Healthy
        } else {
            Health::Unhealthy
        };
        let elide = p.ok == self.lb_last_ok[iu] && self.lb_health[iu] == settled;
        if !elide {
            self.schedule(
                now + p.latency,
                Ev::LbProbeDone {
                    server: i,
                    incarnation: self.servers[iu].incarnation,
                    ok: p.ok,
                    detail: p.detail,
                },
            );
        }
    }

    fn on_lb_probe_done(&mut self, i: u32, _gen: u32, ok: bool, detail: &'static str) {
        self.lb_last_ok[i as usize] = ok;
        let ev = self.pool.observe_probe(&i, Self::pt(self.now), ok, detail);
        self.pool_events(ev);
    }

    /// Feeds a tick's outcomes at server `i` to outlier detection, in a random order, and
    /// returns how many outcomes happened before it was ejected (all, if it was not).
    /// `fails` are the failures, of up to two kinds, each interleaved at random.
    fn feed_outcomes(&mut self, i: u32, ok: u64, fails: [(RequestOutcome, u64); 2]) -> u64 {
        let [(kind_a, a), (kind_b, b)] = fails;
        let failed = a + b;
        let total = ok + failed;
        if ok == 0
            && [(kind_a, a), (kind_b, b)]
                .iter()
                .all(|&(k, n)| n == 0 || k.is_shed())
        {
            // Shed answers neither count towards ejection nor reset a streak: nothing to
            // feed (vigil_core::outlier, rule 5).
            return total;
        }
        if failed == 0 {
            if ok > 0 {
                return self.feed_runs(i, &[(None, ok)]);
            }
            return total;
        }
        // Failures against successes, then, among the failures, one kind against the
        // other: the runs of a uniformly random interleaving of the tick's outcomes.
        // (The buffers are reused: this runs for every server with failures, every tick.)
        let mut runs = std::mem::take(&mut self.runs_buf);
        runs.clear();
        if a == 0 || b == 0 {
            let kind = if a > 0 { kind_a } else { kind_b };
            self.interleave(&mut runs, failed, ok, Some(kind), None);
        } else {
            let mut outcomes = Vec::new();
            self.interleave(&mut outcomes, failed, ok, true, false);
            let mut kinds = Vec::new();
            self.interleave(&mut kinds, a, b, kind_a, kind_b);
            let mut k = kinds.iter().copied();
            let mut cur = k.next().expect("a > 0");
            for (f, mut n) in outcomes {
                if !f {
                    runs.push((None, n));
                    continue;
                }
                while n > 0 {
                    if cur.1 == 0 {
                        cur = k.next().expect("as many kinds as failures");
                    }
                    let take = n.min(cur.1);
                    match runs.last_mut() {
                        Some((Some(last), len)) if *last == cur.0 => *len += take,
                        _ => runs.push((Some(cur.0), take)),
                    }
                    cur.1 -= take;
                    n -= take;
                }
            }
        }
        let consumed = self.feed_runs(i, &runs);
        self.runs_buf = runs;
        consumed
    }

    /// Appends to `runs` the run lengths `(label, length)` of a uniformly random
    /// interleaving of `x` items labelled `first` and `y` labelled `second`: the minority
    /// at random positions when it is small, item by item (without replacement)
    /// otherwise.
    fn interleave<T: Copy + PartialEq>(
        &mut self,
        runs: &mut Vec<(T, u64)>,
        x: u64,
        y: u64,
        first: T,
        second: T,
    ) {
        let total = x + y;
        let push = |runs: &mut Vec<(T, u64)>, is_first: bool, len: u64| {
            if len == 0 {
                return;
            }
            let label = if is_first { first } else { second };
            match runs.last_mut() {
                Some((l, n)) if *l == label => *n += len,
                _ => runs.push((label, len)),
            }
        };
        if y == 0 {
            push(runs, true, x);
        } else if x == 0 {
            push(runs, false, y);
        } else if x.min(y) <= 256 {
            let minority_first = x <= y;
            let k = x.min(y);
            let mut pos = std::mem::take(&mut self.pos_buf);
            pos.clear();
            while (pos.len() as u64) < k {
                let p = self.rng.below(total);
                if !pos.contains(&p) {
                    pos.push(p);
                }
            }
            pos.sort_unstable();
            let mut cursor = 0u64;
            for &p in &pos {
                push(runs, !minority_first, p - cursor);
                push(runs, minority_first, 1);
                cursor = p + 1;
            }
            push(runs, !minority_first, total - cursor);
            self.pos_buf = pos;
        } else {
            let (mut x_left, mut left) = (x, total);
            while left > 0 {
                let is_first = self.rng.below(left) < x_left;
                if is_first {
                    x_left -= 1;
                }
                left -= 1;
                push(runs, is_first, 1);
            }
        }
    }

    /// Feeds runs of outcomes (`None`: a success) to outlier detection, only where they
    /// can change a decision (see [`Sim::feed_outcomes`]); returns the outcomes consumed
    /// before an ejection.
    ///
    /// Exactness: the detector's streaks are mirrored here (`streaks`: errors, gateway
    /// errors; a non-gateway error resets the latter, as in the detector). A block of
    /// failures that cannot reach a threshold and is followed by a success changes
    /// nothing (the success resets both streaks), so it is not fed. A block that can
    /// reach one is fed until the ejection (or the refusal, reported once per streak);
    /// further failures of that tick cannot change anything since room for an ejection
    /// only appears at readmission, in `Pool::tick`; and a run on a saturated streak with
    /// no room changes no decision either (the next error with room ejects either way).
    /// Outcomes of an ejected target are ignored by the detector, so they are not fed.
    fn feed_runs(&mut self, i: u32, runs: &[(Option<RequestOutcome>, u64)]) -> u64 {
        let iu = i as usize;
        let total: u64 = runs.iter().map(|r| r.1).sum();
        let oc = self.cfg.lb.pool.outlier;
        if oc.max_ejection_percent == 0 {
            return total;
        }
        // Failures still needed to reach a threshold, from streaks (errors, gateway).
        let need = |kind: RequestOutcome, (s5, sg): (u32, u32)| -> u32 {
            let need_5xx = (oc.consecutive_5xx > 0).then(|| oc.consecutive_5xx.saturating_sub(s5));
            let need_gw = (kind.is_gateway_error() && oc.consecutive_gateway_errors > 0)
                .then(|| oc.consecutive_gateway_errors.saturating_sub(sg));
            match (need_5xx, need_gw) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => u32::MAX,
            }
        };
        let advance = |kind: RequestOutcome, (s5, sg): (u32, u32), n: u64| -> (u32, u32) {
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            (
                s5.saturating_add(n),
                if kind.is_gateway_error() {
                    sg.saturating_add(n)
                } else {
                    0
                },
            )
        };
        let now = Self::pt(self.now);
        let mut consumed = 0u64;
        let mut k = 0;
        while k < runs.len() {
            let (kind, len) = runs[k];
            let Some(_) = kind else {
                if len > 0 {
                    if self.outlier_dirty[iu] && !self.ejected[iu] {
                        self.outlier_dirty[iu] = false;
                        let j = self.rng.unit();
                        let ev =
                            self.pool
                                .observe_request(&i, now, RequestOutcome::Response(200), j);
                        self.pool_events(ev);
                    }
                    self.streaks[iu] = (0, 0);
                }
                consumed += len;
                k += 1;
                continue;
            };
            // A block of failures: runs k..end.
            let mut end = k;
            while end < runs.len() && runs[end].0.is_some() {
                end += 1;
            }
            let block: u64 = runs[k..end].iter().map(|r| r.1).sum();
            if self.ejected[iu] {
                consumed += block;
                k = end;
                continue;
            }
            let mut dry = self.streaks[iu];
            let mut reaches = false;
            for &(kind, len) in &runs[k..end] {
                let kind = kind.expect("a failure run");
                if len > 0 && u64::from(need(kind, dry)) <= len {
                    reaches = true;
                    break;
                }
                dry = advance(kind, dry, len);
            }
            if !reaches && end < runs.len() {
                // Reset by the success run that follows: no effect.
                consumed += block;
                k = end;
                continue;
            }
            for &(kind, len) in &runs[k..end] {
                let kind = kind.expect("a failure run");
                if len == 0 {
                    continue;
                }
                let need = need(kind, self.streaks[iu]);
                let reaches = u64::from(need) <= len;
                // Saturated streak with no room for an ejection: feeding changes nothing.
                let room = self.ejected_count < oc.max_ejected(self.servers.len());
                if need == 0 && !room {
                    consumed += len;
                    continue;
                }
                let feed = if reaches { u64::from(need.max(1)) } else { len };
                self.outlier_dirty[iu] = true;
                for f in 0..feed {
                    let j = self.rng.unit();
                    let ev = self.pool.observe_request(&i, now, kind, j);
                    let ejected = ev.iter().any(|e| e.left_service() == Some(&i));
                    self.pool_events(ev);
                    self.streaks[iu] = advance(kind, self.streaks[iu], 1);
                    if ejected {
                        return consumed + f + 1;
                    }
                }
                consumed += len;
            }
            k = end;
        }
        total
    }

    /// Serves `n` new requests at server `i` this tick: what the balancer saw of them (and
    /// of queued ones served now), and how many spilled (arrived after an ejection: they
    /// go elsewhere).
    fn serve(&mut self, i: u32, n: u64, feed: bool) -> (Tally, u64) {
        let iu = i as usize;
        let now = self.now;
        let dt = self.cfg.tick;
        let up = self.is_up(iu);
        // Fast path, the common case: a server without a fault of its own, nothing
        // queued, under capacity, punctual, and dependencies failing nobody. Same outcome
        // as the general path below (no draw is needed when nothing can fail).
        if up
            && self.tick_fail_prob == Some(0.0)
            && self.tick_plain_punctual
            && self.servers[iu].backlog == 0
            && (n as f64) <= self.tick_full_cap
            && self.is_plain(iu)
        {
            self.servers[iu].overloaded = false;
            self.servers[iu].shedding = false;
            if feed && n > 0 && self.outlier_dirty[iu] {
                self.feed_runs(i, &[(None, n)]);
            }
            let ok = Tally {
                ok: n,
                ..Tally::default()
            };
            return (ok, 0);
        }
        let refuse = |this: &mut Self, outcome: RequestOutcome| {
            let consumed = if feed {
                this.feed_outcomes(i, 0, [(outcome, n), (outcome, 0)])
            } else {
                n
            };
            let refused = Tally {
                refused: consumed.min(n),
                ..Tally::default()
            };
            (refused, n - consumed.min(n))
        };
        if !up {
            return refuse(self, RequestOutcome::ConnectFailure);
        }
        let plain = self.is_plain(iu);
        if !plain && self.fds_exhausted(iu, now) {
            return refuse(self, RequestOutcome::Reset);
        }
        let brownout = self.cfg.fleet.brownout;
        let paused = if plain {
            0.0
        } else {
            self.servers[iu]
                .gc
                .map_or(0.0, |g| g.paused_fraction(now, dt))
        };
        // Capacity: the workers over the mean worker time (the same for every plain
        // server while punctual, computed once).
        let (cap_rate, mixture) = if plain && self.tick_plain_punctual {
            (self.cap_rate, None)
        } else {
            let m = self.mixture(iu, now);
            (f64::from(self.cfg.fleet.workers) / m.mean(), Some(m))
        };
        let full = cap_rate * dt.as_secs_f64();
        let overloaded = n as f64 > full;
        let eff = if overloaded { 1.0 - brownout } else { 1.0 };
        // Non-negative, so `as` truncation is floor (and much cheaper).
        let cap = (full * (1.0 - paused) * eff) as u64;
        // The queue holds as many requests as a healthy server answers within
        // `max_queue_wait` (their wait plus a worker time). A slow server's queue holds as
        // many: they wait longer.
        let healthy_mean = self.service.mean();
        let max_wait = (self.cfg.fleet.max_queue_wait.as_secs_f64() - healthy_mean).max(0.0);
        let drain = cap_rate * eff;
        let max_queue = (max_wait * self.cap_rate * eff) as u64;
        let s = &mut self.servers[iu];
        s.overloaded = overloaded;
        // What stands beyond the bound now (it shrank with a brownout) is shed this tick.
        let before = s.backlog.min(max_queue);
        let total = s.backlog + n;
        // Serve what capacity allows, queue what can still be answered in time, shed the
        // rest.
        let (served, dropped) = if total > cap {
            let waiting = total - cap;
            let dropped = waiting.saturating_sub(max_queue);
            s.backlog = waiting - dropped;
            (cap, dropped)
        } else {
            s.backlog = 0;
            (total, 0)
        };
        let after = s.backlog;
        s.shedding = dropped > 0 && paused == 0.0;
        // Late answers: the requests served now waited from about `before` to `after`
        // queued requests' worth of work (first in, first out), then took their worker
        // time; past the attempt's deadline the balancer has given up on them, though
        // the server did the work.
        let late_p = if served == 0 {
            0.0
        } else {
            let (w0, w1) = (before as f64 / drain, after as f64 / drain);
            match mixture {
                None => {
                    // Constant worker time.
                    let (lo, hi) = (w0.min(w1), w0.max(w1));
                    let edge = self.deadline - self.service.median();
                    if hi <= edge {
                        0.0
                    } else if lo > edge {
                        1.0
                    } else {
                        (hi - edge) / (hi - lo)
                    }
                }
                Some(m) => m.late_over(w0, w1, self.deadline),
            }
        };
        let late = self.rng.binomial(served, late_p);
        let p = self.request_fail_prob(iu, now);
        let failed = self.rng.binomial(served - late, p);
        let ok = served - late - failed;
        // A server that sheds answers 503 (load, never an ejection); one stopped in a GC
        // pause answers nothing: its overflow times out at the balancer.
        let (overflow, overflow_tally) = if paused > 0.0 {
            (
                RequestOutcome::Timeout,
                Tally {
                    timeout: dropped,
                    ..Tally::default()
                },
            )
        } else {
            (
                RequestOutcome::Response(503),
                Tally {
                    err: dropped,
                    ..Tally::default()
                },
            )
        };
        let mut all = Tally {
            ok,
            err: failed,
            refused: 0,
            timeout: late,
        };
        all.add(overflow_tally);
        if !feed {
            return (all, 0);
        }
        // Shed requests first (rejected on arrival), then the served mix.
        let mut consumed = 0;
        if dropped > 0 {
            consumed = self.feed_outcomes(i, 0, [(overflow, dropped), (overflow, 0)]);
            if consumed < dropped {
                let spill = (served + dropped - consumed).min(n);
                let kept = overflow_tally.total().min(consumed);
                let mut t = overflow_tally;
                t.err = t.err.min(kept);
                t.timeout = t.timeout.min(kept);
                return (t, spill);
            }
        }
        let c2 = self.feed_outcomes(
            i,
            ok,
            [
                (RequestOutcome::Response(500), failed),
                (RequestOutcome::Timeout, late),
            ],
        );
        consumed += c2;
        let outcomes = served + dropped;
        if c2 < served {
            let spill = (outcomes - consumed).min(n);
            // Outcomes before the ejection keep the tick's mix.
            let kept = outcomes - spill;
            let share = |x: u64| ((x as f64) * kept as f64 / outcomes.max(1) as f64).round() as u64;
            let kept_ok = share(ok).min(kept);
            let kept_late = share(late).min(kept - kept_ok);
            let t = Tally {
                ok: kept_ok,
                err: kept - kept_ok - kept_late,
                refused: 0,
                timeout: kept_late,
            };
            return (t, spill);
        }
        (all, 0)
    }

    fn refresh_routes(&mut self) {
        if self.routes_dirty {
            self.routes = self.pool.routing_set(Self::pt(self.now));
            self.routes_dirty = false;
        }
    }

    /// Spreads `n` requests over the routing set; returns what the balancer saw and how
    /// many spilled.
    fn distribute(&mut self, n: u64, feed: bool) -> (Tally, u64) {
        self.refresh_routes();
        let unrouted = Tally {
            err: n,
            ..Tally::default()
        };
        if self.routes.is_empty() {
            return (unrouted, 0);
        }
        let now = Self::pt(self.now);
        // Equal weights and no slow-start ramp: round-robin, exactly (each target gets
        // n / k, and the remainder goes to the next targets in rotation, continuing
        // where the last tick stopped). Otherwise: shares in proportion to effective
        // weight, rounded randomly (unbiased; with retries, systematically from one
        // random offset, so the shares add up to `n` exactly and every attempt sent is
        // accounted for).
        let w0 = self.routes.routes[0].weight;
        let uniform = w0 > 0
            && self.routes.routes.iter().all(|r| {
                r.weight == w0
                    && r.ramp
                        .is_none_or(|_| r.effective_weight(now) >= f64::from(w0))
            });
        let k = self.routes.routes.len() as u64;
        let (base, rem, off) = (n / k, n % k, self.rr % k);
        let mut total_w = 0.0;
        if uniform {
            self.rr = self.rr.wrapping_add(n);
        } else {
            self.weights.clear();
            for r in &self.routes.routes {
                let w = r.effective_weight(now);
                total_w += w;
                self.weights.push(w);
            }
            if total_w <= 0.0 {
                return (unrouted, 0);
            }
        }
        let systematic = (!uniform && self.retrying.is_some()).then(|| self.rng.unit());
        let mut cum = 0.0;
        let mut given = 0u64;
        let mut tally = Tally::default();
        let mut spill = 0;
        let routes = std::mem::take(&mut self.routes.routes);
        for (j, r) in routes.iter().enumerate() {
            let nj = if uniform {
                base + u64::from((j as u64 + k - off) % k < rem)
            } else if let Some(u) = systematic {
                cum += n as f64 * self.weights[j] / total_w;
                let upto = if j + 1 == routes.len() {
                    n
                } else {
                    ((cum + u) as u64).min(n)
                };
                let nj = upto.saturating_sub(given);
                given += nj;
                nj
            } else {
                let share = n as f64 * self.weights[j] / total_w;
                (share + self.rng.unit()) as u64
            };
            self.served_tick[r.key as usize] = self.tick_no;
            if nj == 0 && self.servers[r.key as usize].backlog == 0 {
                continue;
            }
            let (t, s) = self.serve(r.key, nj, feed);
            tally.add(t);
            spill += s;
        }
        if self.routes.routes.is_empty() && !self.routes_dirty {
            self.routes.routes = routes;
        }
        (tally, spill)
    }

    fn on_tick(&mut self) {
        let now = self.now;
        let dt = self.cfg.tick;
        self.tick_no += 1;
        // Readmissions, and the end of the dwell before leaving fail-open.
        if (self.ejected_count > 0 || self.fail_open_since.is_some())
            && let Some(d) = self.pool.next_deadline()
            && d <= Self::pt(now)
        {
            let ev = self.pool.tick(Self::pt(now));
            self.pool_events(ev);
        }
        // Leaving fail-open: the unhealthy servers' shares ramp down; a route whose ramp
        // ended must leave the set (it counts as in service while it is there).
        let leaving = self.pool.leaving_fail_open(Self::pt(now)).is_some();
        if leaving || self.leaving_fail_open {
            self.routes_dirty = true;
        }
        self.leaving_fail_open = leaving;
        self.refresh_routes();
        self.tick_fail_prob = self.fleet_fail_prob(now);
        self.tick_plain_punctual = self.plain_punctual(now);
        if let Some((load, ramp)) = self.surge_fault {
            self.surge = 1.0 + (load - 1.0) * ramp.map_or(1.0, |r| r.progress(now));
        }
        let base =
            self.cfg.clients.rate.unwrap_or(
                self.cfg.clients.load * self.capacity() * f64::from(self.cfg.fleet.servers),
            );
        let arrivals = self.rng.poisson(base * self.surge * dt.as_secs_f64());
        self.s.fresh_requests += arrivals;
        let attempts = match &mut self.retrying {
            Some(r) => r.start_tick(Self::pt(now), arrivals),
            None => arrivals,
        };
        self.s.tries += attempts;
        let (mut tally, spill) = self.distribute(attempts, true);
        if spill > 0 {
            let (t, _) = self.distribute(spill, false);
            tally.add(t);
        }
        // One pass over the fleet: servers out of the routing set still drain their
        // backlog; capacity counts.
        let (mut up_total, mut replacing, mut queued) = (0usize, 0usize, 0u64);
        for i in 0..self.servers.len() {
            if self.servers[i].backlog > 0 && self.served_tick[i] != self.tick_no {
                let (t, _) = self.serve(i as u32, 0, false);
                tally.add(t);
            }
            queued += self.servers[i].backlog;
            if self.is_up(i) {
                up_total += 1;
            } else if self.servers[i].life == Life::Booting && self.servers[i].replaced_while_up {
                replacing += 1;
            }
        }
        self.s.request_timeouts += tally.timeout;
        let (requests, failed) = match &mut self.retrying {
            Some(r) => {
                let out = r.finish_tick(Self::pt(now), &mut self.rng, tally, queued);
                self.s.client_retries += out.client_retries;
                self.s.lb_retries += out.lb_retries;
                self.s.lb_retries_denied += out.lb_denied;
                (out.succeeded + out.failed, out.failed)
            }
            None => (tally.total(), tally.failed()),
        };
        self.s.requests += requests;
        self.s.client_errors += failed;
        if requests > 0 && ((requests - failed) as f64) < RECOVERED * requests as f64 {
            self.last_bad_tick_end = Some(now + dt);
        }
        if self.cfg.queue.is_some() {
            self.queue_tick();
        }
        if self.pending_count > 0 {
            self.detect_tick();
        }
        self.refresh_routes();
        let in_service = self
            .routes
            .routes
            .iter()
            .filter(|r| self.is_up(r.key as usize))
            .count() as u32;
        let routed_up = in_service as usize;
        let removed = (up_total - routed_up.min(up_total)) + replacing;
        let frac = removed as f64 / self.servers.len() as f64;
        if frac > self.s.max_removed_fraction {
            self.s.max_removed_fraction = frac;
        }
        self.s.min_in_service = self.s.min_in_service.min(in_service);
        self.in_service_sum += f64::from(in_service);
        self.ticks += 1;
        let fail_open = self.pool.fail_open().is_some();
        let b = (now.as_elapsed().as_nanos() / self.bucket.as_nanos()) as usize;
        if self.series.len() <= b {
            self.series.push(Sample {
                t: (self.bucket * b as u32).as_secs_f64(),
                in_service_min: in_service,
                ..Sample::default()
            });
        }
        let smp = self.series.last_mut().expect("pushed above");
        smp.requests += requests;
        smp.failures += failed;
        smp.in_service_min = smp.in_service_min.min(in_service);
        if fail_open {
            smp.fail_open += dt.as_secs_f64() / self.bucket.as_secs_f64();
        }
        smp.up = up_total as u32;
        self.schedule(now + dt, Ev::Tick);
    }

    // === queue ===

    /// One tick of the queue: arrivals, then every worker whose gate lets it pull takes
    /// a share in proportion to its speed. A worker failing a message spends `fail_time`
    /// on it, a healthy one `process_time`: a worker that fails fast pulls more (the
    /// black hole). A worker fails every message when its disk or fds are exhausted, and
    /// the share a gray failure sets otherwise (its health checks pass: only the kill
    /// switch and the controller's peer comparison can see it). Failed messages go back
    /// to the queue.
    fn queue_tick(&mut self) {
        let cfg: &'a ScenarioConfig = self.cfg;
        let q = cfg.queue.as_ref().expect("checked by caller");
        let now = self.now;
        let dt = cfg.tick.as_secs_f64();
        let arrivals = self.rng.poisson(q.rate * dt);
        self.queue_backlog += arrivals;
        // (server, speed, share of its messages failing)
        let mut speeds: Vec<(usize, f64, f64)> = Vec::new();
        let mut demand = 0.0;
        for i in 0..self.servers.len() {
            if !self.is_up(i) {
                continue;
            }
            if !self.gates.is_empty() && !self.gate_lets_pull(i, now) {
                continue;
            }
            let fail = if self.disk_full(i, now) || self.fds_exhausted(i, now) {
                1.0
            } else {
                self.servers[i].gray.at(now).clamp(0.0, 1.0)
            };
            let per =
                q.process_time.as_secs_f64() * (1.0 - fail) + q.fail_time.as_secs_f64() * fail;
            let speed = f64::from(q.threads) * dt / per;
            demand += speed;
            speeds.push((i, speed, fail));
        }
        if demand <= 0.0 || self.queue_backlog == 0 {
            self.s.max_queue_backlog = self.s.max_queue_backlog.max(self.queue_backlog);
            return;
        }
        let take = (self.queue_backlog as f64).min(demand);
        let mut pulled_total = 0u64;
        let mut failed = 0u64;
        let pnow = Self::pt(now);
        for (i, speed, fail) in speeds {
            let share = take * speed / demand;
            let n = (share + self.rng.unit()).floor() as u64;
            let n = n.min(self.queue_backlog - pulled_total);
            pulled_total += n;
            let mut f = 0u64;
            for _ in 0..n {
                // Certain outcomes draw nothing: runs without gray failures keep their
                // random sequence.
                let ok = !(fail >= 1.0 || (fail > 0.0 && self.rng.unit() < fail));
                f += u64::from(!ok);
                if let Some(change) = self.gates.get_mut(i).and_then(|g| g.record(pnow, ok)) {
                    self.gate_changed(i, change);
                }
            }
            failed += f;
            let t = &mut self.msg_totals[i];
            *t = Counts::new(t.ok + (n - f), t.failed + f);
        }
        self.s.messages_delivered += pulled_total;
        self.s.message_failures += failed;
        // Failed messages go back to the queue (redelivered after their visibility timeout).
        self.queue_backlog = self.queue_backlog - pulled_total + failed;
        self.s.max_queue_backlog = self.s.max_queue_backlog.max(self.queue_backlog);
    }

    /// Worker `i`'s gate at `now`: feeds it the host's readiness (the library feeds it
    /// every snapshot of the local checks; here, once per tick) and its timers, and says
    /// whether it may pull.
    fn gate_lets_pull(&mut self, i: usize, now: Time) -> bool {
        let (failing, status) = self.checks(i, now, false);
        let readiness = if status == Status::Fail {
            Err(self.check_names(failing).join(", "))
        } else {
            Ok(())
        };
        let pnow = Self::pt(now);
        let g = &mut self.gates[i];
        if let Some(change) = g
            .observe_readiness(pnow, readiness)
            .or_else(|| g.tick(pnow))
        {
            self.gate_changed(i, change);
        }
        self.gates[i].may_pull()
    }

    fn gate_changed(&mut self, i: usize, change: GateChange) {
        let id = &self.ctl_ids[i];
        let line = match change {
            GateChange::Paused(Pause::Unready { reason }) => {
                self.s.worker_pauses += 1;
                format!("worker {id}: stops pulling: {reason}")
            }
            GateChange::Paused(Pause::KillSwitch { failed, of, until }) => {
                self.s.worker_pauses += 1;
                let pause = until.since(Self::pt(self.now));
                format!(
                    "worker {id}: kill switch: {failed} of {of} messages failed; paused for {}",
                    humantime::format_duration(pause)
                )
            }
            GateChange::Resumed { probation: true } => {
                format!("worker {id}: pulls again, on probation")
            }
            GateChange::Resumed { probation: false } => format!("worker {id}: pulls again"),
        };
        self.note(line);
    }

    // === detection ===

    fn harm(&mut self, i: usize, at: Time) {
        if self.pending_detect[i].is_none() {
            self.pending_detect[i] = Some(at);
            self.pending_count += 1;
        }
    }

    fn detect_tick(&mut self) {
        let now = self.now;
        for i in 0..self.pending_detect.len() {
            if let Some(at) = self.pending_detect[i]
                && now >= at
                && !self.in_service(i)
            {
                self.detect_times.push(now.since(at));
                self.pending_detect[i] = None;
                self.pending_count -= 1;
            }
        }
    }

    fn cure(&mut self, i: usize) {
        if self.pending_detect[i].take().is_some() {
            self.pending_count -= 1;
        }
    }

    // === controller ===

    fn on_ctl_probe(&mut self, i: u32) {
        let now = self.now;
        let iu = i as usize;
        if !self.ctl.up || self.servers[iu].life == Life::Booting {
            return;
        }
        if Self::pt(now) < self.ctl.grace_end[iu] {
            return;
        }
        let p = self.probe(iu, now, true, self.cfg.controller.timeout);
        if p.detail == TIMEOUT {
            self.s.check_timeouts += 1;
        }
        // A queue worker reports its counters with its health; the controller compares
        // it with its peers, and an outlier fails the peer check.
        let mut peer = 0;
        if self.cfg.queue.is_some() && self.cfg.controller.mode == ControllerMode::Guarded {
            let totals = self.msg_totals[iu];
            self.ctl
                .anomaly
                .record_totals(Self::pt(now), &self.ctl_ids[iu], "", totals);
            if self.ctl.outlier[iu] {
                peer = CHECK_PEER;
            }
        }
        let need = self.cfg.controller.guard.thresholds.healthy_threshold + 1;
        if p.ok && peer == 0 && self.ctl.passes_fed[iu] >= need {
            return;
        }
        self.schedule(
            now + p.latency,
            Ev::CtlProbeDone {
                server: i,
                incarnation: self.servers[iu].incarnation,
                endpoint_failed: p.endpoint_failed,
                failing: p.failing | peer,
            },
        );
    }

    fn on_ctl_probe_done(&mut self, i: u32, incarnation: u32, endpoint_failed: bool, failing: u32) {
        let iu = i as usize;
        if !self.ctl.up || incarnation != self.servers[iu].incarnation {
            return;
        }
        let ok = !endpoint_failed && failing == 0;
        self.ctl.passes_fed[iu] = if ok {
            self.ctl.passes_fed[iu].saturating_add(1)
        } else {
            0
        };
        let now = Self::pt(self.now);
        match self.cfg.controller.mode {
            ControllerMode::Off => {}
            ControllerMode::Naive => {
                if let Some(t) = self.ctl.naive[iu].observe(now, ok)
                    && t.to == Health::Unhealthy
                {
                    self.note(format!(
                        "controller (naive): {} unhealthy after {} failed probes: replacing",
                        self.ctl_ids[iu], t.streak
                    ));
                    self.replace(iu);
                }
            }
            ControllerMode::Guarded => {
                let zone = &self.zone_names[self.servers[iu].zone as usize];
                let obs = Observation {
                    target: self.ctl_ids[iu].clone(),
                    zone: zone.clone(),
                    endpoint_failed,
                    failing_checks: self.check_names(failing),
                };
                let decision = self.ctl.guard.observe(now, &obs);
                self.guard_events();
                if let Some(d) = decision {
                    match d.outcome {
                        GuardOutcome::Act => {
                            self.note(format!("controller: {d}"));
                            self.replace(iu);
                        }
                        GuardOutcome::HoldBack => {
                            if !d.repeated {
                                self.s.controller_holds += 1;
                                self.note(format!("controller: {d}"));
                            }
                        }
                    }
                }
            }
        }
    }

    fn on_ctl_round(&mut self) {
        let now = self.now;
        self.schedule(now + self.cfg.controller.interval, Ev::CtlRound);
        if self.ctl.up && self.cfg.controller.mode == ControllerMode::Guarded {
            self.ctl.guard.tick(Self::pt(now));
            self.guard_events();
            if self.cfg.queue.is_some() {
                self.judge_workers();
            }
        }
    }

    /// The controller compares the queue workers with their peers (`vigil_core::anomaly`,
    /// as `vigil controller` does each round) and notes a worker that becomes, or stops
    /// being, an outlier.
    fn judge_workers(&mut self) {
        let pnow = Self::pt(self.now);
        self.ctl.anomaly.expire(pnow);
        for v in self.ctl.anomaly.evaluate(pnow) {
            let Some(i) = self.ctl_ids.iter().position(|id| *id == v.member) else {
                continue;
            };
            let now_outlier = v.is_outlier();
            if now_outlier != self.ctl.outlier[i] {
                self.ctl.outlier[i] = now_outlier;
                self.note(if now_outlier {
                    format!("controller: worker fails far more than its peers: {v}")
                } else {
                    format!("controller: worker no longer an outlier: {v}")
                });
            }
        }
    }

    /// Counts and notes the guard's events.
    fn guard_events(&mut self) {
        for e in self.ctl.guard.drain_events() {
            let kind = match e {
                GuardEvent::Frozen { .. } => {
                    self.s.freezes += 1;
                    Some("freeze")
                }
                GuardEvent::FreezeAlert { .. } => {
                    self.s.freeze_alerts += 1;
                    Some("alert")
                }
                GuardEvent::Unfrozen { .. } => Some("unfreeze"),
                _ => None,
            };
            let line = e.to_string();
            if let Some(kind) = kind {
                self.decide_mark(kind, &line);
            }
            self.note(format!("guard: {line}"));
        }
    }

    /// Marks a policy decision on the charts.
    fn decide_mark(&mut self, kind: &'static str, label: &str) {
        self.decisions.push(Decision {
            t: self.now.as_elapsed().as_secs_f64(),
            kind,
            label: label.to_string(),
        });
    }

    fn replace(&mut self, i: usize) {
        self.s.controller_actions += 1;
        let was_up = self.is_up(i);
        let now = self.now;
        if self.cfg.controller.mode == ControllerMode::Guarded {
            self.ctl
                .guard
                .remove_target(Self::pt(now), &self.ctl_ids[i]);
        }
        let s = &mut self.servers[i];
        s.incarnation += 1;
        s.life = Life::Booting;
        s.replaced_while_up = was_up;
        s.backlog = 0;
        let incarnation = s.incarnation;
        // Replacing a faulty server takes it out of service: that is a detection (at 0 s
        // when it happens before the fault does harm, e.g. a disk at 95%).
        if let Some(at) = self.pending_detect[i].take() {
            self.pending_count -= 1;
            self.detect_times.push(now.since(at));
        }
        self.schedule(
            now + self.cfg.fleet.boot_time,
            Ev::Boot {
                server: i as u32,
                incarnation,
            },
        );
    }

    fn on_boot(&mut self, i: u32, incarnation: u32) {
        let iu = i as usize;
        let now = self.now;
        if self.servers[iu].incarnation != incarnation || self.servers[iu].life == Life::Up {
            return;
        }
        let zone_down = self.zone_down[self.servers[iu].zone as usize];
        let f = &self.cfg.fleet;
        let phase = Duration::from_nanos(
            self.rng
                .below(f.dependency_check_interval.as_nanos() as u64),
        );
        let s = &mut self.servers[iu];
        s.replaced_while_up = false;
        if zone_down {
            // The zone is gone: the new instance never answers, and the controller sees
            // it as a new instance (grace period, then probes).
            s.life = Life::Down;
            self.controller_meets_new_instance(iu);
            return;
        }
        s.life = Life::Up;
        s.boot_at = now;
        s.phase = phase;
        s.disk = Growth::flat(f.disk_used);
        s.fds = Growth::flat(f64::from(f.fds_used));
        s.gc = None;
        s.checker_dead_at = None;
        s.conn_broken = None;
        s.gray = Ramped::default();
        s.slow = Ramped::default();
        s.backlog = 0;
        // A new worker: a fresh gate, counters from zero.
        self.msg_totals[iu] = Counts::default();
        if let (Some(g), Some(q)) = (self.gates.get_mut(iu), &self.cfg.queue) {
            *g = WorkerGate::new(q.worker.clone(), Self::pt(now));
        }
        self.controller_meets_new_instance(iu);
        if self.servers[iu].bad_version && self.deploy_error_rate() > 0.0 {
            self.harm(iu, now);
        }
    }

    /// A new instance in slot `i`: the controller starts its grace period.
    fn controller_meets_new_instance(&mut self, i: usize) {
        let pnow = Self::pt(self.now);
        self.ctl.passes_fed[i] = 0;
        self.ctl.grace_end[i] = pnow + self.cfg.controller.guard.grace;
        match self.cfg.controller.mode {
            ControllerMode::Guarded => {
                let zone = self.zone_names[self.servers[i].zone as usize].clone();
                self.ctl.guard.add_target(pnow, &self.ctl_ids[i], &zone);
            }
            ControllerMode::Naive => {
                self.ctl.naive[i] =
                    Thresholds::new_unknown(self.cfg.controller.guard.thresholds, pnow);
            }
            ControllerMode::Off => {}
        }
    }

    fn on_controller_up(&mut self) {
        let pnow = Self::pt(self.now);
        self.ctl.up = true;
        let n = self.servers.len();
        let cfg = self.cfg.controller.guard.clone();
        self.ctl.guard = match self.cfg.controller.state {
            GuardStateStore::Persisted => {
                // What the store holds: the state after the last decision, serialised.
                let saved =
                    serde_json::to_string(self.ctl.guard.state()).expect("guard state serialises");
                let state = serde_json::from_str(&saved).expect("guard state deserialises");
                SafetyGuard::restore(cfg, state)
            }
            GuardStateStore::InMemory => {
                let mut g = SafetyGuard::new(cfg);
                for i in 0..n {
                    let zone = &self.zone_names[self.servers[i].zone as usize];
                    g.add_target(pnow, &self.ctl_ids[i], zone);
                }
                g
            }
        };
        self.ctl.anomaly = AnomalyDetector::new(self.cfg.controller.anomaly.clone());
        self.ctl.outlier = vec![false; n];
        for i in 0..n {
            self.ctl.naive[i] = Thresholds::new_unknown(self.cfg.controller.guard.thresholds, pnow);
            self.ctl.passes_fed[i] = 0;
            if self.cfg.controller.state == GuardStateStore::InMemory {
                self.ctl.grace_end[i] = pnow + self.cfg.controller.guard.grace;
            }
        }
        self.note(format!(
            "controller restarted ({} guard state)",
            match self.cfg.controller.state {
                GuardStateStore::Persisted => "persisted",
                GuardStateStore::InMemory => "fresh, in-memory",
            }
        ));
    }

    // === faults ===

    fn on_fault(&mut self, fi: usize, start: bool) {
        let f: &FaultConfig = &self.cfg.faults[fi];
        let now = self.now;
        let targets = f.servers(&self.cfg.fleet);
        if start {
            if f.kind != FaultKind::Surge && f.kind != FaultKind::ControllerRestart {
                self.first_fault_at.get_or_insert(now);
            }
            self.marks.push(Mark {
                start: now.as_elapsed().as_secs_f64(),
                end: f.duration.map(|d| (now + d).as_elapsed().as_secs_f64()),
                label: f.label(),
            });
            self.note(format!("fault: {}", f.label()));
            if let Some(d) = f.duration
                && f.kind != FaultKind::Deploy
            {
                self.schedule(now + d, Ev::FaultEnd(fi as u16));
            }
        } else {
            self.note(format!("fault over: {}", f.label()));
        }
        match f.kind {
            FaultKind::Kill => {
                for i in targets {
                    let i = i as usize;
                    if start {
                        if self.servers[i].life == Life::Up {
                            self.servers[i].life = Life::Down;
                            self.servers[i].backlog = 0;
                            self.harm(i, now);
                        }
                    } else if self.servers[i].life == Life::Down
                        && !self.zone_down[self.servers[i].zone as usize]
                    {
                        // The process restarts in place.
                        let incarnation = self.servers[i].incarnation;
                        self.servers[i].life = Life::Booting;
                        self.cure(i);
                        self.schedule(
                            now,
                            Ev::Boot {
                                server: i as u32,
                                incarnation,
                            },
                        );
                    }
                }
            }
            FaultKind::DiskFill => {
                let fill = f.fill_in.unwrap_or_default().as_secs_f64().max(1e-3);
                for i in targets {
                    let i = i as usize;
                    let s = &mut self.servers[i];
                    if start {
                        let cur = s.disk.at(now);
                        s.disk = Growth {
                            base: cur,
                            t0: now,
                            rate: (1.0 - cur) / fill,
                        };
                        self.harm(i, now + f.fill_in.unwrap_or_default());
                    } else {
                        s.disk = Growth::flat(self.cfg.fleet.disk_used);
                        self.cure(i);
                    }
                }
            }
            FaultKind::FdLeak => {
                let limit = f64::from(self.cfg.fleet.fd_limit);
                let t = f.exhaust_in.unwrap_or_default().as_secs_f64().max(1e-3);
                for i in targets {
                    let i = i as usize;
                    let s = &mut self.servers[i];
                    if start {
                        let cur = s.fds.at(now);
                        s.fds = Growth {
                            base: cur,
                            t0: now,
                            rate: (limit - cur) / t,
                        };
                        self.harm(i, now + f.exhaust_in.unwrap_or_default());
                    } else {
                        s.fds = Growth::flat(f64::from(self.cfg.fleet.fds_used));
                        self.cure(i);
                    }
                }
            }
            FaultKind::GcPauses => {
                for i in targets {
                    let s = &mut self.servers[i as usize];
                    s.gc = start.then(|| Gc {
                        start: now,
                        pause: f.pause.unwrap_or_default(),
                        every: f.every.unwrap_or(Duration::from_secs(1)),
                    });
                }
            }
            FaultKind::CheckerDies => {
                for i in targets {
                    let s = &mut self.servers[i as usize];
                    s.checker_dead_at = if start { Some(now) } else { None };
                }
            }
            FaultKind::ConnBroken => {
                let d = self.dep_index(f.dependency.as_deref());
                for i in targets {
                    let i = i as usize;
                    if start {
                        self.servers[i].conn_broken = Some((d, now, None));
                        if self.deps[d].criticality == DepCriticality::Critical {
                            self.harm(i, now);
                        }
                    } else {
                        if let Some(c) = &mut self.servers[i].conn_broken {
                            c.2 = Some(now);
                        }
                        self.cure(i);
                    }
                }
            }
            FaultKind::Gray => {
                for i in targets {
                    let i = i as usize;
                    if start {
                        self.servers[i].gray = Ramped {
                            to: f.error_rate.unwrap_or(1.0),
                            ramp: Ramp::new(now, f.ramp),
                        };
                        self.harm(i, now);
                    } else {
                        self.servers[i].gray = Ramped::default();
                        self.cure(i);
                    }
                }
            }
            FaultKind::Latency => {
                let to = f.latency.unwrap_or_default().as_secs_f64();
                let ramp = Ramp::new(now, f.ramp);
                // Harm starts when answers miss the client's timeout at once.
                let edge = self.cfg.clients.timeout.as_secs_f64() - self.service.median();
                for i in targets {
                    let i = i as usize;
                    if start {
                        self.servers[i].slow = Ramped { to, ramp };
                        if to > edge {
                            let at = ramp.map_or(now, |r| r.reaches(edge / to));
                            self.harm(i, at);
                        }
                    } else {
                        self.servers[i].slow = Ramped::default();
                        self.cure(i);
                    }
                }
            }
            FaultKind::Dependency => {
                let d = self.dep_index(f.dependency.as_deref());
                let cond = if start {
                    DepCond {
                        error_rate: f.error_rate.unwrap_or(1.0),
                        extra_latency: f.latency.unwrap_or_default(),
                        affected: f.affected.unwrap_or(1.0),
                        key: fi as u64 + 1,
                        ramp: Ramp::new(now, f.ramp),
                        from_error_rate: self.deps[d].history[0].1.error_rate,
                    }
                } else {
                    self.deps[d].history[0].1
                };
                self.deps[d].history.push((now, cond));
            }
            FaultKind::Surge => {
                self.surge_fault = start.then(|| (f.load.unwrap_or(1.0), Ramp::new(now, f.ramp)));
                if !start {
                    self.surge = 1.0;
                }
            }
            FaultKind::ZoneDown => {
                let z = f.zone.unwrap_or(0) as usize;
                self.zone_down[z] = start;
                for i in targets {
                    let i = i as usize;
                    if start {
                        self.servers[i].backlog = 0;
                        self.harm(i, now);
                    } else {
                        self.cure(i);
                        if self.servers[i].life != Life::Booting {
                            // Instances in the zone reboot when it comes back.
                            let incarnation = self.servers[i].incarnation;
                            self.servers[i].life = Life::Booting;
                            self.schedule(
                                now + self.cfg.fleet.boot_time,
                                Ev::Boot {
                                    server: i as u32,
                                    incarnation,
                                },
                            );
                        }
                    }
                }
            }
            FaultKind::Deploy => {
                if start {
                    let rollout = match f.gate.unwrap_or_default() {
                        DeployGate::Health => match self.start_rollout(f) {
                            Ok(r) => Some(Box::new(r)),
                            Err(e) => {
                                self.note(format!("deploy: refused: {e}"));
                                return;
                            }
                        },
                        DeployGate::None => None,
                    };
                    let ev = if rollout.is_some() {
                        Ev::DeployPoll { fault: fi as u16 }
                    } else {
                        Ev::DeployWave {
                            fault: fi as u16,
                            wave: 0,
                        }
                    };
                    self.deployments.push(Deployment {
                        fault: fi as u16,
                        deployed: 0,
                        halted: false,
                        rollout,
                        seen_decisions: 0,
                        last_wave: None,
                        rolling_back: false,
                        polls: 0,
                    });
                    self.schedule(now, ev);
                }
            }
            FaultKind::ControllerRestart => {
                if start && self.cfg.controller.mode != ControllerMode::Off {
                    self.ctl.up = false;
                    self.note("controller down".into());
                    let d = f.duration.unwrap_or(Duration::from_secs(30));
                    self.schedule(now + d, Ev::ControllerUp);
                }
            }
        }
    }

    fn dep_index(&self, name: Option<&str>) -> usize {
        let name = name.unwrap_or_default();
        self.cfg
            .dependencies
            .iter()
            .position(|d| d.name == name)
            .expect("validated: the dependency exists")
    }

    /// vigil's rollout of fault `f`: every server a host, in its zone, on the old
    /// revision, its health as the balancer sees it.
    fn start_rollout(&self, f: &FaultConfig) -> Result<Rollout, vigil_core::rollout::StartError> {
        let hosts = (0..self.servers.len())
            .map(|i| HostSpec {
                id: self.ctl_ids[i].clone(),
                zone: self.zone_names[self.servers[i].zone as usize].clone(),
                revision: revision_name(self.servers[i].new_revision).into(),
                healthy: self.is_up(i) && self.in_service(i),
                held: false,
            })
            .collect();
        Rollout::start(f.rollout.clone(), hosts, NEW_REVISION, Self::pt(self.now))
    }

    /// One turn of vigil's rollout, every [`DEPLOY_POLL`]: the hosts' health answers (the
    /// revision they run, and whether `/readyz` passes), their error rates every
    /// [`DEPLOY_SAMPLE_EVERY`] turns, then its commands. Drains and installs take no
    /// time here (an install swaps the version in place, as the timer rollout does); the
    /// host reports back at the next turn.
    fn on_deploy_poll(&mut self, fault: u16) {
        let Some(di) = self.deployments.iter().position(|d| d.fault == fault) else {
            return;
        };
        let Some(mut r) = self.deployments[di].rollout.take() else {
            return;
        };
        let now = self.now;
        let pnow = Self::pt(now);
        let sample = self.deployments[di]
            .polls
            .is_multiple_of(DEPLOY_SAMPLE_EVERY);
        self.deployments[di].polls += 1;
        for i in 0..self.servers.len() {
            let healthy = self.is_up(i) && self.checks(i, now, false).1 != Status::Fail;
            let id = &self.ctl_ids[i];
            r.report(
                pnow,
                id,
                revision_name(self.servers[i].new_revision),
                healthy,
            );
            if sample && self.is_up(i) {
                r.sample(pnow, id, self.request_fail_prob(i, now));
            }
        }
        let bad = {
            let f = &self.cfg.faults[fault as usize];
            f.error_rate.unwrap_or(0.0) > 0.0 || f.readiness == Some(Readiness::Fails)
        };
        // Drains and installs answer at once; their follow-ups come out of the next poll.
        // Bounded: each host is drained, installed and undrained at most twice (deploy,
        // rollback).
        for _ in 0..8 {
            let commands = r.poll(pnow);
            if commands.is_empty() {
                break;
            }
            for c in commands {
                match c {
                    Command::Drain { host } => r.drained(pnow, &host),
                    Command::Install { host, revision, .. } => {
                        if let Some(i) = self.ctl_ids.iter().position(|id| *id == host) {
                            let new = revision == NEW_REVISION;
                            self.servers[i].new_revision = new;
                            self.servers[i].bad_version = new && bad;
                            if new && bad {
                                self.harm(i, now);
                            } else {
                                self.cure(i);
                            }
                        }
                        r.installed(pnow, &host, Ok(()));
                    }
                    Command::Undrain { .. } => {}
                    Command::Alert { reason } => self.note(format!("deploy: alert: {reason}")),
                }
            }
        }
        self.rollout_bookkeeping(di, &r);
        let finished = r.is_finished();
        self.deployments[di].rollout = Some(r);
        if !finished {
            self.schedule(now + DEPLOY_POLL, Ev::DeployPoll { fault });
        }
    }

    /// Counts the rollout's waves and rollbacks, and notes its decisions.
    fn rollout_bookkeeping(&mut self, di: usize, r: &Rollout) {
        for d in &r.decisions()[self.deployments[di].seen_decisions..] {
            self.note(format!("deploy: {}", d.what));
        }
        self.deployments[di].seen_decisions = r.decisions().len();
        match r.phase() {
            Phase::Deploying { wave } if self.deployments[di].last_wave != Some(*wave) => {
                self.deployments[di].last_wave = Some(*wave);
                self.s.deploy_waves += 1;
                let label = format!("deploy: wave {} to {}", wave + 1, r.wave_hosts().join(", "));
                self.decide_mark("wave", &label);
            }
            Phase::RollingBack { reason } if !self.deployments[di].rolling_back => {
                self.deployments[di].rolling_back = true;
                self.deployments[di].halted = true;
                self.s.rollbacks += 1;
                let label = format!("rollback: {reason}");
                self.decide_mark("rollback", &label);
            }
            _ => {}
        }
    }

    fn on_deploy_wave(&mut self, fault: u16, wave: u16) {
        let f = &self.cfg.faults[fault as usize];
        let now = self.now;
        let waves = f.waves.as_deref().unwrap_or_default();
        let Some(di) = self.deployments.iter().position(|d| d.fault == fault) else {
            return;
        };
        if self.deployments[di].halted {
            return;
        }
        let n = self.servers.len() as u32;
        let deployed = self.deployments[di].deployed;
        let Some(frac) = waves.get(wave as usize) else {
            return;
        };
        let upto = ((frac * f64::from(n)).ceil() as u32).min(n);
        let bad = f.error_rate.unwrap_or(0.0) > 0.0 || f.readiness == Some(Readiness::Fails);
        for i in deployed as usize..upto as usize {
            self.servers[i].bad_version = bad;
            self.servers[i].new_revision = true;
            if bad {
                self.harm(i, now);
            }
        }
        self.deployments[di].deployed = upto;
        self.s.deploy_waves += 1;
        self.note(format!("deploy: wave {} to {upto}/{n} servers", wave + 1));
        if (wave as usize) + 1 < waves.len() {
            let next = now + f.wave_interval.unwrap_or(Duration::from_secs(300));
            self.schedule(
                next,
                Ev::DeployWave {
                    fault,
                    wave: wave + 1,
                },
            );
        }
    }

    fn finish(mut self) -> Outcome {
        let end = self.now;
        if let Some(since) = self.fail_open_since.take() {
            self.s.fail_open_time += end.since(since);
        }
        for i in 0..self.pending_detect.len() {
            if let Some(at) = self.pending_detect[i]
                && at < end
            {
                self.s.undetected += 1;
            }
        }
        if !self.detect_times.is_empty() {
            let sum: Duration = self.detect_times.iter().sum();
            self.s.detect_mean = Some(sum / self.detect_times.len() as u32);
            self.s.detect_max = self.detect_times.iter().max().copied();
        }
        self.s.detected = self.detect_times.len() as u32;
        // Recovery: from the end of the last fault that ended to the end of the last bad
        // tick, if the run did not end bad.
        let last_end = self
            .cfg
            .faults
            .iter()
            .filter_map(|f| f.duration.map(|d| Time::from_elapsed(f.at + d)))
            .filter(|t| *t <= end)
            .max();
        self.s.recovered_after = last_end.and_then(|fe| match self.last_bad_tick_end {
            Some(bad) if bad >= end => None,
            Some(bad) => Some(bad.since(fe)),
            None => Some(Duration::ZERO),
        });
        self.s.mean_in_service = if self.ticks > 0 {
            self.in_service_sum / self.ticks as f64
        } else {
            0.0
        };
        self.s.finish();
        if self.log_dropped > 0 {
            let n = self.log_dropped;
            self.log
                .push((end.as_elapsed(), format!("... and {n} more events")));
        }
        Outcome {
            summary: self.s,
            series: self.series,
            marks: self.marks,
            decisions: self.decisions,
            log: self.log,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;
    use std::path::Path;

    fn busy_scenario() -> Scenario {
        // Every kind of event: kills, a gray failure, a dependency spell, a lost zone,
        // a disk filling, a controller restart, a queue.
        Scenario::parse(
            Path::new("t.toml"),
            r#"
duration = "20m"
[fleet]
servers = 12
[[dependencies]]
name = "db"
request_fraction = 0.5
[queue]
rate = 50.0
[[faults]]
at = "1m"
kind = "kill"
target = "server:1"
[[faults]]
at = "2m"
kind = "gray"
target = "server:2"
error_rate = 0.5
[[faults]]
at = "3m"
kind = "dependency"
dependency = "db"
error_rate = 0.3
affected = 0.5
duration = "5m"
[[faults]]
at = "9m"
kind = "zone_down"
zone = 1
duration = "4m"
[[faults]]
at = "4m"
kind = "disk_fill"
target = "server:5"
fill_in = "3m"
[[faults]]
at = "10m"
kind = "controller_restart"
"#,
        )
        .expect("valid scenario")
    }

    #[test]
    fn same_seed_same_run_different_seed_different_run() {
        let s = busy_scenario();
        let a = run(&s.config, 7, false, &mut |_| {});
        let b = run(&s.config, 7, false, &mut |_| {});
        assert_eq!(a.summary, b.summary, "same seed, same numbers");
        assert_eq!(a.series, b.series, "same seed, same timeline");
        assert_eq!(a.log, b.log, "same seed, same events");
        let c = run(&s.config, 8, false, &mut |_| {});
        assert_ne!(a.summary, c.summary, "the seed must matter");
    }

    #[test]
    fn a_run_accounts_for_every_request_and_sees_its_faults() {
        let s = busy_scenario();
        let o = run(&s.config, 1, false, &mut |_| {});
        let sum: u64 = o.series.iter().map(|x| x.requests).sum();
        assert_eq!(sum, o.summary.requests, "the timeline adds up to the total");
        assert!(o.summary.client_errors > 0, "faults cost something");
        assert!(o.summary.ejections > 0, "the gray failure is ejected");
        assert!(
            o.summary.controller_actions > 0,
            "the dead server is replaced"
        );
        assert_eq!(o.marks.len(), 6, "every fault is marked");
        assert!(o.summary.messages_delivered > 0, "the queue is consumed");
    }

    fn sim_for(src: &str) -> Scenario {
        Scenario::parse(Path::new("t.toml"), src).expect("valid scenario")
    }

    /// Twenty servers in two zones, a `deploy` fault at 2m with `extra` keys and a rollout
    /// of waves of at most 4 hosts, 1 minute of bake.
    fn deploy_scenario(extra: &str) -> Scenario {
        sim_for(&format!(
            "duration = \"40m\"\n[fleet]\nservers = 20\nzones = 2\n\
             [[faults]]\nat = \"2m\"\nkind = \"deploy\"\nwaves = [0.5, 1.0]\n\
             wave_interval = \"5m\"\n{extra}\n\
             [faults.rollout]\nmax_wave = 4\nbake = \"1m\"\nprogress_deadline = \"2m\"\n"
        ))
    }

    #[test]
    fn a_good_revision_rolls_out_in_floor_sized_waves_one_zone_at_a_time() {
        let s = deploy_scenario("error_rate = 0.0\nreadiness = \"passes\"");
        let o = run(&s.config, 1, false, &mut |_| {});
        // 20 hosts, at most 4 per wave, a wave never spans the two zones of 10: 3 waves
        // per zone.
        assert_eq!(o.summary.deploy_waves, 6, "{:#?}", o.log);
        assert_eq!(o.summary.rollbacks, 0);
        assert!(
            o.log
                .iter()
                .any(|(_, l)| l.contains("completed") || l.contains("every host runs")),
            "{:#?}",
            o.log
        );
        assert_eq!(o.summary.client_errors, 0);
    }

    #[test]
    fn a_revision_failing_requests_behind_a_passing_readiness_is_rolled_back_by_its_error_rate() {
        // /readyz passes, 20% of requests fail: only the rollout's error-rate samples see
        // it, during the bake of the first wave.
        let s = deploy_scenario("error_rate = 0.2\nreadiness = \"passes\"");
        let o = run(&s.config, 1, false, &mut |_| {});
        assert_eq!(o.summary.deploy_waves, 1, "{:#?}", o.log);
        assert_eq!(o.summary.rollbacks, 1, "{:#?}", o.log);
        assert!(
            o.log
                .iter()
                .any(|(_, l)| l.contains("deploy:") && l.contains("error rate")),
            "the log says why: {:#?}",
            o.log
        );
        // The timer rollout pushes both waves.
        let naive = run(&s.config.naive(), 1, true, &mut |_| {});
        assert_eq!(naive.summary.deploy_waves, 2);
        assert!(naive.summary.client_errors > 10 * o.summary.client_errors.max(1));
    }

    /// Ten queue workers; `faults` appended.
    fn queue_scenario(controller: &str, faults: &str) -> Scenario {
        sim_for(&format!(
            "duration = \"20m\"\n[fleet]\nservers = 10\n[clients]\nrate = 0.0\n\
             [queue]\nrate = 100.0\n[controller]\nmode = \"{controller}\"\n{faults}"
        ))
    }

    #[test]
    fn the_kill_switch_alone_pauses_a_black_hole_for_longer_and_longer() {
        // Controller off: only the worker's own gate can see a failure its checks pass.
        let s = queue_scenario(
            "off",
            "[[faults]]\nat = \"2m\"\nkind = \"gray\"\ntarget = \"server:3\"\nerror_rate = 1.0\n",
        );
        let o = run(&s.config, 1, false, &mut |_| {});
        let naive = run(&s.config.naive(), 1, true, &mut |_| {});
        let rate = o.summary.metric("message_failure_rate").unwrap();
        let naive_rate = naive.summary.metric("message_failure_rate").unwrap();
        // 18 minutes of black hole: pauses of 1, 2, 4, 8 minutes, each after a probation
        // of 10 messages; never pulling freely again.
        assert!(
            (3..=6).contains(&o.summary.worker_pauses),
            "pauses doubling, not toggling: {}",
            o.summary.worker_pauses
        );
        assert!(rate < 0.01, "vigil {rate}");
        assert!(naive_rate > 0.5, "naive {naive_rate}");
        assert!(
            o.log
                .iter()
                .any(|(_, l)| l.contains("kill switch") && l.contains("server-0003")),
            "the log says which worker paused and why"
        );
        assert_eq!(o.summary.controller_actions, 0);
    }

    #[test]
    fn workers_failing_alike_are_not_outliers_and_nobody_is_replaced() {
        // Every worker fails 30% of its messages: a shared cause (a bad dependency), not
        // a sick worker. The peer comparison finds nobody; the kill switches pause them
        // all (locally), and the controller replaces none.
        let s = queue_scenario(
            "guarded",
            "[[faults]]\nat = \"2m\"\nkind = \"gray\"\ntarget = \"all\"\nerror_rate = 0.3\n",
        );
        let o = run(&s.config, 1, false, &mut |_| {});
        assert_eq!(o.summary.controller_actions, 0, "{:?}", o.log);
        assert!(
            !o.log
                .iter()
                .any(|(_, l)| l.contains("far more than its peers")),
            "nobody is an outlier"
        );
        // The same fault on one worker: it is the outlier, and only it is replaced.
        let s = queue_scenario(
            "guarded",
            "[[faults]]\nat = \"2m\"\nkind = \"gray\"\ntarget = \"server:6\"\nerror_rate = 0.3\n",
        );
        let o = run(&s.config, 1, false, &mut |_| {});
        assert_eq!(o.summary.controller_actions, 1, "{:?}", o.log);
        assert!(
            o.log
                .iter()
                .any(|(_, l)| l.contains("far more than its peers") && l.contains("server-0006")),
            "{:?}",
            o.log
        );
    }

    #[test]
    fn ramps_grow_linearly_to_their_size() {
        let r = Ramp {
            start: Time::from_secs(100),
            len: Duration::from_secs(200),
        };
        assert_eq!(r.progress(Time::from_secs(50)), 0.0, "not before it starts");
        assert_eq!(r.progress(Time::from_secs(100)), 0.0);
        assert_eq!(r.progress(Time::from_secs(150)), 0.25);
        assert_eq!(r.progress(Time::from_secs(300)), 1.0);
        assert_eq!(r.progress(Time::from_secs(900)), 1.0, "and stays there");
        assert_eq!(r.reaches(0.5), Time::from_secs(200));
        let slow = Ramped {
            to: 3.0,
            ramp: Some(r),
        };
        assert_eq!(slow.at(Time::from_secs(200)), 1.5);
        assert_eq!(
            Ramped {
                to: 3.0,
                ramp: None
            }
            .at(Time::ZERO),
            3.0
        );
        // A ramped dependency fault grows from the dependency's usual error rate.
        let c = DepCond {
            error_rate: 0.5,
            extra_latency: Duration::from_secs(2),
            affected: 1.0,
            key: 1,
            ramp: Some(r),
            from_error_rate: 0.1,
        };
        assert!((c.error_rate_at(Time::from_secs(200)) - 0.3).abs() < 1e-12);
        assert_eq!(c.extra_at(Time::from_secs(150)), 0.5);
    }

    #[test]
    fn checks_time_out_when_the_answer_is_slower_than_their_timeout() {
        let s = sim_for("[fleet]\nservers = 4\n[[dependencies]]\nname = \"db\"\n");
        let mut sim = Sim::new(&s.config, 1, false);
        let now = Time::from_secs(60);
        let timeout = Duration::from_secs(2);
        assert!(
            sim.probe(0, now, false, timeout).ok,
            "a healthy server answers"
        );
        // A host slower than the check timeout: the check times out, even on the
        // reserved health thread.
        sim.servers[0].slow = Ramped {
            to: 2.5,
            ramp: None,
        };
        let p = sim.probe(0, now, false, timeout);
        assert!(!p.ok && p.endpoint_failed, "{p:?}");
        assert_eq!((p.detail, p.latency), (TIMEOUT, timeout));
        // Slower, but within the timeout: it answers, late.
        sim.servers[0].slow = Ramped {
            to: 1.5,
            ramp: None,
        };
        let p = sim.probe(0, now, false, timeout);
        assert!(p.ok, "{p:?}");
        assert!(p.latency > Duration::from_millis(1500));
        // The background dependency check times out against a slow database: /health
        // fails with the dependency's check, /readyz does not notice.
        sim.deps[0].history.push((
            Time::ZERO,
            DepCond {
                error_rate: 0.0,
                extra_latency: Duration::from_secs(3),
                affected: 1.0,
                key: 1,
                ramp: None,
                from_error_rate: 0.0,
            },
        ));
        let (failing, status) = sim.checks(1, now, true);
        assert_eq!(status, Status::Fail);
        assert_eq!(sim.check_names(failing), vec!["db:connect".to_string()]);
        assert_eq!(sim.checks(1, now, false).1, Status::Pass);
    }

    #[test]
    fn slow_requests_hold_workers_and_answer_late() {
        let s = sim_for("[fleet]\nservers = 2\nzones = 1\nbrownout = 0.0\n");
        let mut sim = Sim::new(&s.config, 1, false);
        sim.tick_fail_prob = Some(0.0);
        // Healthy: 400 requests in a second, all in time.
        let (t, _) = sim.serve(1, 400, false);
        assert_eq!(
            t,
            Tally {
                ok: 400,
                ..Tally::default()
            }
        );
        // 480 ms more per request: 16 workers serve 32 a second, the queue holds what a
        // healthy server answers in 1 s (784 requests), the rest is shed; all late (no
        // brownout here, to keep the figures round).
        sim.servers[0].slow = Ramped {
            to: 0.48,
            ramp: None,
        };
        let (t, _) = sim.serve(0, 1000, false);
        assert_eq!(t.ok + t.timeout, 32, "{t:?}");
        assert_eq!(t.err, 1000 - 32 - 784, "shed beyond the queue: {t:?}");
        assert_eq!(sim.servers[0].backlog, 784);
        let (t, _) = sim.serve(0, 0, false);
        assert_eq!(t.timeout, 32, "queued behind 24 s of work: late");
    }

    #[test]
    fn retries_and_latency_are_deterministic_per_seed() {
        let s = sim_for(
            r#"
duration = "10m"
[fleet]
servers = 10
service_time_p99 = "200ms"
max_queue_wait = "5s"
[clients]
retry = "backoff"
[lb.retries]
max_retries = 2
per_try_timeout = "500ms"
[[dependencies]]
name = "db"
request_fraction = 0.5
[[faults]]
at = "1m"
kind = "latency"
target = "servers:0-1"
latency = "2s"
ramp = "3m"
[[faults]]
at = "2m"
kind = "dependency"
dependency = "db"
error_rate = 0.2
latency = "800ms"
ramp = "1m"
duration = "2m"
"#,
        );
        let a = run(&s.config, 3, false, &mut |_| {});
        let b = run(&s.config, 3, false, &mut |_| {});
        assert_eq!(a.summary, b.summary, "same seed, same numbers");
        assert_eq!(a.series, b.series, "same seed, same timeline");
        assert_eq!(a.log, b.log, "same seed, same events");
        assert!(a.summary.client_retries > 0 && a.summary.lb_retries > 0);
        assert!(a.summary.request_timeouts > 0);
        let sum: u64 = a.series.iter().map(|x| x.requests).sum();
        assert_eq!(sum, a.summary.requests, "the timeline adds up to the total");
        let c = run(&s.config, 4, false, &mut |_| {});
        assert_ne!(a.summary, c.summary, "the seed must matter");
    }

    #[test]
    fn gc_pause_fraction_and_remaining() {
        let g = Gc {
            start: Time::from_secs(10),
            pause: Duration::from_millis(500),
            every: Duration::from_secs(2),
        };
        assert_eq!(g.remaining(Time::from_secs(9)), None);
        assert_eq!(
            g.remaining(Time::from_millis(10_100)),
            Some(Duration::from_millis(400))
        );
        assert_eq!(g.remaining(Time::from_millis(10_600)), None);
        let f = g.paused_fraction(Time::from_secs(10), Duration::from_secs(1));
        assert!((f - 0.5).abs() < 1e-9, "{f}");
        let f = g.paused_fraction(Time::from_secs(11), Duration::from_secs(1));
        assert!(f.abs() < 1e-9, "{f}");
    }
}
