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
//! - **Clients** are open-loop: each tick, a Poisson number of requests arrives. They are
//!   spread over the load balancer's routing set in proportion to effective weight (what
//!   round-robin gives; P2C's preference for less-loaded targets is not modelled).
//!   Each request's outcome is drawn from the server's state (binomial draws over the
//!   tick's requests, so every request counts, without an event per request).
//! - **Servers** have worker threads and a CPU time per request, hence a capacity; a
//!   backlog that grows when arrivals exceed it; requests older than the client timeout
//!   fail; overload wastes a `brownout` share of capacity. GC pauses stop everything,
//!   health answers included. Disks fill and file descriptors leak at set rates. The
//!   background checker probes dependencies every `dependency_check_interval` (evaluated
//!   lazily: the snapshot at any instant is a pure function of the dependency's history),
//!   and can die, leaving a stale snapshot that only the watchdog notices.
//! - **Health checks are check logic over the model**: `/readyz` aggregates disk, fds,
//!   watchdog, self-test and saturation checks with vigil-core's `Status::aggregate`;
//!   `/health` adds the dependency snapshot with each dependency's criticality. Probes go
//!   through the model's transport: refused when the process is down, EMFILE when fds are
//!   exhausted, stuck behind a GC pause, and queued behind requests when health capacity
//!   is shared; past the probe timeout they fail.
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

use crate::rng::{SimRng, hash_unit};
use crate::scenario::{
    CheckPath, ControllerMode, DepCriticality, DeployGate, FaultConfig, FaultKind, GuardStateStore,
    HealthCapacity, Readiness, ScenarioConfig, Switch,
};
use crate::summary::Summary;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Duration;
use vigil_core::guard::{GuardEvent, Observation, Outcome as GuardOutcome, SafetyGuard};
use vigil_core::outlier::{OutlierEvent, RequestOutcome};
use vigil_core::pool::{Pool, PoolEvent, RoutingSet, TargetSpec};
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
/// Time a reserved health thread takes to answer.
const RESERVED_HEALTH_LATENCY: Duration = Duration::from_millis(1);
/// Chart resolution: samples per run.
const SERIES_POINTS: u64 = 720;
/// Notable events kept for the report.
const MAX_LOG: usize = 400;

// === check names (health+json `component:measurement`) ===

const CHECK_DISK: u32 = 1 << 0;
const CHECK_FDS: u32 = 1 << 1;
const CHECK_WATCHDOG: u32 = 1 << 2;
const CHECK_SELFTEST: u32 = 1 << 3;
const CHECK_DEP0: u32 = 8;
const LOCAL_CHECK_NAMES: [&str; 4] = [
    "disk:utilization",
    "fds:utilization",
    "watchdog:freshness",
    "lifecycle:self-test",
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
    gray: f64,
    bad_version: bool,
    /// Replaced by the controller while it was up (capacity the system took out).
    replaced_while_up: bool,
    /// Arrivals exceeded capacity in the last tick (brownout).
    overloaded: bool,
}

#[derive(Clone, Copy, Debug)]
struct DepCond {
    error_rate: f64,
    extra_latency: Duration,
    affected: f64,
    key: u64,
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
    deployed: u32,
    halted: bool,
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
                gray: 0.0,
                bad_version: false,
                replaced_while_up: false,
                overloaded: false,
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
            served_tick: vec![u64::MAX; n],
            tick_no: 0,
            ctl,
            ctl_ids,
            zone_names,
            dep_check_names,
            deployments: Vec::new(),
            queue_backlog: 0,
            pending_detect: vec![None; n],
            pending_count: 0,
            detect_times: Vec::new(),
            first_fault_at: None,
            fail_open_since: None,
            leaving_fail_open: false,
            s: Summary::new(cfg, seed, naive),
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

    /// Whether dependency `d`'s condition reaches server `i` at `t`, and its error rate
    /// and latency there.
    fn dep_for(&self, i: usize, d: usize, t: Time) -> (f64, Duration) {
        let dep = &self.deps[d];
        let c = dep.cond_at(t);
        let base = dep.history[0].1;
        let reaches = c.affected >= 1.0
            || hash_unit(self.seed, &[0xDE9, d as u64, c.key, i as u64]) < c.affected;
        let (mut err, lat) = if reaches {
            (c.error_rate, dep.latency + c.extra_latency)
        } else {
            (base.error_rate, dep.latency)
        };
        if let Some((bd, since, until)) = self.servers[i].conn_broken
            && bd == d
            && since <= t
            && until.is_none_or(|u| t < u)
        {
            err = 1.0;
        }
        (err, lat)
    }

    /// Whether server `i` has no fault of its own (its requests fail only through
    /// dependencies, like every other such server).
    fn is_plain(&self, i: usize) -> bool {
        let s = &self.servers[i];
        s.gc.is_none()
            && s.disk.rate == 0.0
            && s.disk.base < 1.0
            && s.fds.rate == 0.0
            && s.gray == 0.0
            && !s.bad_version
            && s.conn_broken.is_none()
    }

    /// The failure probability of a plain server's requests at `now`, when it is the same
    /// for every plain server (no partial dependency failure); `None` otherwise.
    fn fleet_fail_prob(&self, now: Time) -> Option<f64> {
        let mut ok = 1.0;
        for dep in &self.deps {
            let c = dep.cond_at(now);
            if c.affected < 1.0 {
                return None;
            }
            let lat = dep.latency + c.extra_latency;
            let err = if lat > self.cfg.clients.timeout {
                1.0
            } else {
                c.error_rate
            };
            if err > 0.0 && dep.criticality == DepCriticality::Critical {
                ok *= 1.0 - dep.request_fraction * err;
            }
        }
        Some((1.0 - ok).clamp(0.0, 1.0))
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
        let mut ok = 1.0 - s.gray;
        if s.bad_version {
            ok *= 1.0 - self.deploy_error_rate();
        }
        for d in 0..self.deps.len() {
            let (err, lat) = self.dep_for(i, d, now);
            let err = if lat > self.cfg.clients.timeout {
                1.0
            } else {
                err
            };
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
                let (err, lat) = self.dep_for(i, d, last_run);
                let failed = lat > f.dependency_check_timeout
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
        let mut latency = s.gc.and_then(|g| g.remaining(now)).unwrap_or_default();
        latency += match self.cfg.fleet.health_capacity {
            HealthCapacity::Reserved => RESERVED_HEALTH_LATENCY,
            HealthCapacity::Shared => {
                // Behind the whole queue, drained at the (browned-out) service rate.
                let eff = if s.overloaded {
                    1.0 - self.cfg.fleet.brownout
                } else {
                    1.0
                };
                Duration::from_secs_f64(s.backlog as f64 / (self.capacity() * eff))
                    + self.cfg.fleet.service_time
            }
        };
        if latency > timeout {
            return fail(timeout, "timeout");
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
    fn feed_outcomes(&mut self, i: u32, ok: u64, failed: u64, failure: RequestOutcome) -> u64 {
        let total = ok + failed;
        if failure.is_shed() && ok == 0 {
            // Shed answers neither count towards ejection nor reset a streak: nothing to
            // feed (vigil_core::outlier, rule 5).
            return total;
        }
        if failed == 0 {
            if ok > 0 {
                return self.feed_runs(i, &[(false, ok)], failure);
            }
            return total;
        }
        // The run lengths (is_failure, length) of a uniformly random interleaving of the
        // tick's outcomes: place the minority at random positions when it is small, draw
        // outcome by outcome (without replacement) otherwise.
        let mut runs: Vec<(bool, u64)> = Vec::new();
        fn push(runs: &mut Vec<(bool, u64)>, fail: bool, len: u64) {
            if len == 0 {
                return;
            }
            match runs.last_mut() {
                Some((f, n)) if *f == fail => *n += len,
                _ => runs.push((fail, len)),
            }
        }
        if ok == 0 {
            push(&mut runs, true, failed);
        } else if failed.min(ok) <= 256 {
            let minority_fail = failed <= ok;
            let k = failed.min(ok);
            let mut pos: Vec<u64> = Vec::with_capacity(k as usize);
            while (pos.len() as u64) < k {
                let p = self.rng.below(total);
                if !pos.contains(&p) {
                    pos.push(p);
                }
            }
            pos.sort_unstable();
            let mut cursor = 0u64;
            for p in pos {
                push(&mut runs, !minority_fail, p - cursor);
                push(&mut runs, minority_fail, 1);
                cursor = p + 1;
            }
            push(&mut runs, !minority_fail, total - cursor);
        } else {
            let (mut f_left, mut left) = (failed, total);
            while left > 0 {
                let f = self.rng.below(left) < f_left;
                if f {
                    f_left -= 1;
                }
                left -= 1;
                push(&mut runs, f, 1);
            }
        }
        self.feed_runs(i, &runs, failure)
    }

    /// Feeds run lengths to outlier detection, only where they can change a decision
    /// (see [`Sim::feed_outcomes`]); returns the outcomes consumed before an ejection.
    ///
    /// Exactness: the detector's streaks are mirrored here (`streak_5xx`, `streak_gw`).
    /// A failure run that cannot reach a threshold and is followed by a success changes
    /// nothing (the success resets both streaks), so it is not fed. A run that can reach
    /// one is fed until the ejection (or the refusal, reported once per streak); further
    /// failures of that tick cannot change anything since room for an ejection only
    /// appears at readmission, in `Pool::tick`. Outcomes of an ejected target are ignored
    /// by the detector, so they are not fed.
    fn feed_runs(&mut self, i: u32, runs: &[(bool, u64)], failure: RequestOutcome) -> u64 {
        let iu = i as usize;
        let total: u64 = runs.iter().map(|r| r.1).sum();
        let oc = self.cfg.lb.pool.outlier;
        if oc.max_ejection_percent == 0 {
            return total;
        }
        let gateway = failure.is_gateway_error();
        let now = Self::pt(self.now);
        let mut consumed = 0u64;
        for (k, &(is_fail, len)) in runs.iter().enumerate() {
            if len == 0 {
                continue;
            }
            if !is_fail {
                if self.outlier_dirty[iu] && !self.ejected[iu] {
                    self.outlier_dirty[iu] = false;
                    let j = self.rng.unit();
                    let ev = self
                        .pool
                        .observe_request(&i, now, RequestOutcome::Response(200), j);
                    self.pool_events(ev);
                }
                self.streaks[iu] = (0, 0);
                consumed += len;
                continue;
            }
            if self.ejected[iu] {
                consumed += len;
                continue;
            }
            let (s5, sg) = self.streaks[iu];
            let need_5xx = (oc.consecutive_5xx > 0).then(|| oc.consecutive_5xx.saturating_sub(s5));
            let need_gw = (gateway && oc.consecutive_gateway_errors > 0)
                .then(|| oc.consecutive_gateway_errors.saturating_sub(sg));
            let need = match (need_5xx, need_gw) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => u32::MAX,
            };
            let last = k + 1 == runs.len();
            let reaches = u64::from(need) <= len;
            if !reaches && !last {
                // Reset by the success run that follows: no effect.
                consumed += len;
                continue;
            }
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
                let ev = self.pool.observe_request(&i, now, failure, j);
                let ejected = ev.iter().any(|e| e.left_service() == Some(&i));
                self.pool_events(ev);
                let st = &mut self.streaks[iu];
                st.0 = st.0.saturating_add(1);
                if gateway {
                    st.1 = st.1.saturating_add(1);
                }
                if ejected {
                    return consumed + f + 1;
                }
            }
            consumed += len;
        }
        total
    }

    /// Serves `n` new requests at server `i` this tick. Returns (ok, failed, spilled):
    /// spilled requests arrived after an ejection and go elsewhere.
    fn serve(&mut self, i: u32, n: u64, feed: bool) -> (u64, u64, u64) {
        let iu = i as usize;
        let now = self.now;
        let dt = self.cfg.tick;
        let up = self.is_up(iu);
        // Fast path, the common case: a server without a fault of its own, nothing
        // queued, under capacity, and dependencies failing nobody. Same outcome as the
        // general path below (no draw is needed when nothing can fail).
        if up
            && self.tick_fail_prob == Some(0.0)
            && self.servers[iu].backlog == 0
            && (n as f64) <= self.tick_full_cap
            && self.is_plain(iu)
        {
            self.servers[iu].overloaded = false;
            if feed && n > 0 && self.outlier_dirty[iu] {
                self.feed_runs(i, &[(false, n)], RequestOutcome::Response(500));
            }
            return (n, 0, 0);
        }
        if !up {
            let consumed = if feed {
                self.feed_outcomes(i, 0, n, RequestOutcome::ConnectFailure)
            } else {
                n
            };
            return (0, consumed.min(n), n - consumed.min(n));
        }
        let plain = self.is_plain(iu);
        if !plain && self.fds_exhausted(iu, now) {
            let consumed = if feed {
                self.feed_outcomes(i, 0, n, RequestOutcome::Reset)
            } else {
                n
            };
            return (0, consumed.min(n), n - consumed.min(n));
        }
        let cap_rate = self.cap_rate;
        let brownout = self.cfg.fleet.brownout;
        let paused = if plain {
            0.0
        } else {
            self.servers[iu]
                .gc
                .map_or(0.0, |g| g.paused_fraction(now, dt))
        };
        let full = cap_rate * dt.as_secs_f64();
        let overloaded = n as f64 > full;
        let eff = if overloaded { 1.0 - brownout } else { 1.0 };
        // Non-negative, so `as` truncation is floor (and much cheaper).
        let cap = (full * (1.0 - paused) * eff) as u64;
        let max_queue = (self.cfg.fleet.max_queue_wait.as_secs_f64() * cap_rate * eff) as u64;
        let s = &mut self.servers[iu];
        s.overloaded = overloaded;
        let total = s.backlog + n;
        // Serve what capacity allows, queue up to `max_queue_wait` of work, shed the rest.
        let (served, dropped) = if total > cap {
            let waiting = total - cap;
            let dropped = waiting.saturating_sub(max_queue);
            s.backlog = waiting - dropped;
            (cap, dropped)
        } else {
            s.backlog = 0;
            (total, 0)
        };
        let p = self.request_fail_prob(iu, now);
        let failed = self.rng.binomial(served, p);
        let ok = served - failed;
        if !feed {
            return (ok, failed + dropped, 0);
        }
        // Shed requests first (rejected on arrival), then the served mix.
        let mut consumed = 0;
        if dropped > 0 {
            // A server that sheds answers 503 (load, never an ejection); one stopped in
            // a GC pause answers nothing: its overflow times out at the balancer.
            let overflow = if paused > 0.0 {
                RequestOutcome::Timeout
            } else {
                RequestOutcome::Response(503)
            };
            consumed = self.feed_outcomes(i, 0, dropped, overflow);
            if consumed < dropped {
                let spill = (served + dropped - consumed).min(n);
                return (0, consumed, spill);
            }
        }
        let c2 = self.feed_outcomes(i, ok, failed, RequestOutcome::Response(500));
        consumed += c2;
        let outcomes = served + dropped;
        if c2 < ok + failed {
            let spill = (outcomes - consumed).min(n);
            // Outcomes before the ejection keep the tick's success ratio.
            let kept = outcomes - spill;
            let kept_ok = ((ok as f64) * kept as f64 / outcomes.max(1) as f64).round() as u64;
            return (kept_ok, kept - kept_ok, spill);
        }
        (ok, failed + dropped, 0)
    }

    fn refresh_routes(&mut self) {
        if self.routes_dirty {
            self.routes = self.pool.routing_set(Self::pt(self.now));
            self.routes_dirty = false;
        }
    }

    /// Spreads `n` requests over the routing set; returns (ok, failed, spilled).
    fn distribute(&mut self, n: u64, feed: bool) -> (u64, u64, u64) {
        self.refresh_routes();
        if self.routes.is_empty() {
            return (0, n, 0);
        }
        let now = Self::pt(self.now);
        // Equal weights and no slow-start ramp: round-robin, exactly (each target gets
        // n / k, and the remainder goes to the next targets in rotation, continuing
        // where the last tick stopped). Otherwise: shares in proportion to effective
        // weight, rounded randomly (unbiased).
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
                return (0, n, 0);
            }
        }
        let (mut ok, mut failed, mut spill) = (0, 0, 0);
        let routes = std::mem::take(&mut self.routes.routes);
        for (j, r) in routes.iter().enumerate() {
            let nj = if uniform {
                base + u64::from((j as u64 + k - off) % k < rem)
            } else {
                let share = n as f64 * self.weights[j] / total_w;
                (share + self.rng.unit()) as u64
            };
            self.served_tick[r.key as usize] = self.tick_no;
            if nj == 0 && self.servers[r.key as usize].backlog == 0 {
                continue;
            }
            let (o, f, s) = self.serve(r.key, nj, feed);
            ok += o;
            failed += f;
            spill += s;
        }
        if self.routes.routes.is_empty() && !self.routes_dirty {
            self.routes.routes = routes;
        }
        (ok, failed, spill)
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
        let base =
            self.cfg.clients.rate.unwrap_or(
                self.cfg.clients.load * self.capacity() * f64::from(self.cfg.fleet.servers),
            );
        let arrivals = self.rng.poisson(base * self.surge * dt.as_secs_f64());
        let (mut ok, mut failed, spill) = self.distribute(arrivals, true);
        if spill > 0 {
            let (o, f, _) = self.distribute(spill, false);
            ok += o;
            failed += f;
        }
        // One pass over the fleet: servers out of the routing set still drain their
        // backlog; capacity counts.
        let (mut up_total, mut replacing) = (0usize, 0usize);
        for i in 0..self.servers.len() {
            if self.servers[i].backlog > 0 && self.served_tick[i] != self.tick_no {
                let (o, f, _) = self.serve(i as u32, 0, false);
                ok += o;
                failed += f;
            }
            if self.is_up(i) {
                up_total += 1;
            } else if self.servers[i].life == Life::Booting && self.servers[i].replaced_while_up {
                replacing += 1;
            }
        }
        let requests = ok + failed;
        self.s.requests += requests;
        self.s.client_errors += failed;
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

    fn queue_tick(&mut self) {
        let q = self.cfg.queue.as_ref().expect("checked by caller");
        let now = self.now;
        let dt = self.cfg.tick.as_secs_f64();
        let arrivals = self.rng.poisson(q.rate * dt);
        self.queue_backlog += arrivals;
        let mut speeds: Vec<(usize, f64, bool)> = Vec::new();
        let mut demand = 0.0;
        for i in 0..self.servers.len() {
            if !self.is_up(i) {
                continue;
            }
            let sick = self.disk_full(i, now) || self.fds_exhausted(i, now);
            if q.gate == Switch::On {
                // The worker gate: check the host before pulling.
                let (_, status) = self.checks(i, now, false);
                if status == Status::Fail {
                    continue;
                }
            }
            let per = if sick { q.fail_time } else { q.process_time };
            let speed = f64::from(q.threads) * dt / per.as_secs_f64();
            demand += speed;
            speeds.push((i, speed, sick));
        }
        if demand <= 0.0 || self.queue_backlog == 0 {
            self.s.max_queue_backlog = self.s.max_queue_backlog.max(self.queue_backlog);
            return;
        }
        let take = (self.queue_backlog as f64).min(demand);
        let mut pulled_total = 0u64;
        let mut failed = 0u64;
        for (_, speed, sick) in speeds {
            let share = take * speed / demand;
            let n = (share + self.rng.unit()).floor() as u64;
            let n = n.min(self.queue_backlog - pulled_total);
            pulled_total += n;
            if sick {
                failed += n;
            }
        }
        self.s.messages_delivered += pulled_total;
        self.s.message_failures += failed;
        // Failed messages go back to the queue (redelivered after their visibility timeout).
        self.queue_backlog = self.queue_backlog - pulled_total + failed;
        self.s.max_queue_backlog = self.s.max_queue_backlog.max(self.queue_backlog);
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
        let need = self.cfg.controller.guard.thresholds.healthy_threshold + 1;
        if p.ok && self.ctl.passes_fed[iu] >= need {
            return;
        }
        self.schedule(
            now + p.latency,
            Ev::CtlProbeDone {
                server: i,
                incarnation: self.servers[iu].incarnation,
                endpoint_failed: p.endpoint_failed,
                failing: p.failing,
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
        s.gray = 0.0;
        s.backlog = 0;
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
                        self.servers[i].gray = f.error_rate.unwrap_or(1.0);
                        self.harm(i, now);
                    } else {
                        self.servers[i].gray = 0.0;
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
                    }
                } else {
                    self.deps[d].history[0].1
                };
                self.deps[d].history.push((now, cond));
            }
            FaultKind::Surge => {
                self.surge = if start { f.load.unwrap_or(1.0) } else { 1.0 };
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
                    self.deployments.push(Deployment {
                        fault: fi as u16,
                        deployed: 0,
                        halted: false,
                    });
                    self.schedule(
                        now,
                        Ev::DeployWave {
                            fault: fi as u16,
                            wave: 0,
                        },
                    );
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
        if wave > 0 && f.gate.unwrap_or_default() == DeployGate::Health {
            let out = (0..deployed as usize)
                .filter(|&i| !self.in_service(i) || !self.is_up(i))
                .count();
            if out > 0 {
                self.deployments[di].halted = true;
                self.s.rollbacks += 1;
                self.note(format!(
                    "deploy: wave {wave} held: {out}/{deployed} servers of the previous waves out of service; rolling back"
                ));
                for i in 0..deployed as usize {
                    self.servers[i].bad_version = false;
                    self.cure(i);
                }
                return;
            }
        }
        let Some(frac) = waves.get(wave as usize) else {
            return;
        };
        let upto = ((frac * f64::from(n)).ceil() as u32).min(n);
        let bad = f.error_rate.unwrap_or(0.0) > 0.0 || f.readiness == Some(Readiness::Fails);
        for i in deployed as usize..upto as usize {
            self.servers[i].bad_version = bad;
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
