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
//!   are spread over the load balancer's routing set by vigil-core's P2C on each
//!   server's outstanding requests, as `vigil lb` balances (sampled per tick, see
//!   `balance.rs`), or, for the naive balancer, in proportion to effective weight
//!   (round-robin).
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

mod admission;
mod balance;
mod controller;
mod detection;
mod engine;
mod faults;
mod lb;
mod model;
mod queue;
mod rollout;
mod servers;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod trace_tests;

use crate::Policies;
use crate::clients::Retrying;
use crate::latency::ServiceTime;
use crate::rng::SimRng;
use crate::scenario::{ControllerMode, ScenarioConfig, Switch};
use crate::summary::Summary;
use engine::{Ev, Periodic, Scheduled};
use model::{
    Controller, Dep, DepCond, Deployment, FaultRamp, Growth, Life, Ramped, Server, SimStore,
};
use std::collections::BinaryHeap;
use std::time::Duration;
use vigil_core::anomaly::{AnomalyDetector, Counts, PEER_CHECK};
use vigil_core::fleet::{Dissent, DissentConfig, DissentTally, Replica, Stored};
use vigil_core::gate::WorkerGate;
use vigil_core::guard::{Observation, SafetyGuard};
use vigil_core::outlier::RequestOutcome;
use vigil_core::pool::{Pool, RoutingSet, TargetSpec};
use vigil_core::shard::Shard;
use vigil_core::{HealthState, Thresholds, Time};

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
pub struct DecisionMark {
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
pub struct RunOutcome {
    /// The numbers.
    pub summary: Summary,
    /// The timeline.
    pub series: Vec<Sample>,
    /// Faults.
    pub marks: Vec<Mark>,
    /// Policy decisions (fail-open, freezes, ejections).
    pub decisions: Vec<DecisionMark>,
    /// Notable events (state changes with reasons), in order.
    pub log: Vec<(Duration, String)>,
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
    /// Per server: admission control and dependency breakers (the library's defences).
    defences: Vec<admission::Defences>,
    deps: Vec<Dep>,
    zone_down: Vec<bool>,
    surge: f64,
    /// The surge in progress: (load multiplier, ramp).
    surge_fault: Option<(f64, Option<FaultRamp>)>,
    // load balancer
    pool: Pool<u32>,
    routes: RoutingSet<u32>,
    routes_dirty: bool,
    lb_health: Vec<HealthState>,
    lb_last_ok: Vec<bool>,
    ejected: Vec<bool>,
    outlier_dirty: Vec<bool>,
    /// Mirror of the outlier detector's (5xx, gateway) streaks per target.
    streaks: Vec<(u32, u32)>,
    ejected_count: usize,
    weights: Vec<f64>,
    /// P2C's view of each server (`balance.rs`).
    p2c: balance::P2cState,
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
    queue: queue::QueueState,
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
    decisions: Vec<DecisionMark>,
    ejection_marks: usize,
    log: Vec<(Duration, String)>,
    log_dropped: u64,
}

/// Runs `cfg` with `seed`. `policies` only labels the summary (pass `cfg.naive()` for
/// the naive policies). `progress` is called with the fraction done, now and then.
pub fn run(
    cfg: &ScenarioConfig,
    seed: u64,
    policies: Policies,
    progress: &mut dyn FnMut(f64),
) -> RunOutcome {
    let mut sim = Sim::new(cfg, seed, policies);
    sim.run(progress);
    sim.finish()
}

impl<'a> Sim<'a> {
    fn new(cfg: &'a ScenarioConfig, seed: u64, policies: Policies) -> Self {
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
                degraded: d.degraded,
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
        // The controller has run for a while: its store holds the warm guard.
        let mut replica = Replica::new(guard);
        replica.snapshot(warm, None);
        let mut stored = Stored::default();
        if let Some(batch) = replica.take() {
            stored.commit(&batch);
        }
        let ctl = Controller {
            up: true,
            replica,
            store: SimStore {
                stored,
                down: false,
                latency: Duration::ZERO,
                in_flight: None,
                commits: 0,
                epoch: None,
                retry_scheduled: false,
                intended: Vec::new(),
            },
            naive: (0..n)
                .map(|_| Thresholds::new_healthy(cfg.controller.guard.thresholds, Time::ZERO))
                .collect(),
            anomaly: AnomalyDetector::new(cfg.controller.anomaly.clone()),
            outlier: vec![false; n],
            listed: vec![Some(0); n],
            committed: vec![Some(0); n],
            members: Vec::new(),
            shard: (cfg.controller.replicas > 1).then(|| {
                Shard::new(
                    (0..cfg.controller.replicas).map(|r| format!("r{r}")),
                    cfg.controller.probers as usize,
                )
            }),
            cut: vec![false; cfg.controller.replicas as usize],
            dissent: Dissent::new(DissentConfig::default()),
            tally: DissentTally::new(),
            #[cfg(test)]
            traces: None,
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
            defences: Vec::new(),
            deps,
            zone_down: vec![false; cfg.fleet.zones as usize],
            surge: 1.0,
            surge_fault: None,
            pool,
            routes: RoutingSet::default(),
            routes_dirty: true,
            lb_health: vec![HealthState::Healthy; n],
            lb_last_ok: vec![true; n],
            ejected: vec![false; n],
            outlier_dirty: vec![false; n],
            streaks: vec![(0, 0); n],
            ejected_count: 0,
            weights: Vec::with_capacity(n),
            p2c: balance::P2cState::new(n),
            runs_buf: Vec::new(),
            pos_buf: Vec::new(),
            served_tick: vec![u64::MAX; n],
            tick_no: 0,
            ctl,
            ctl_ids,
            zone_names,
            dep_check_names,
            deployments: Vec::new(),
            queue: queue::QueueState::default(),
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
            s: cfg.summary(seed, policies),
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
        sim.defences = (0..n).map(|_| sim.fresh_defences(Time::ZERO)).collect();
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

    fn finish(mut self) -> RunOutcome {
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
        RunOutcome {
            summary: self.s,
            series: self.series,
            marks: self.marks,
            decisions: self.decisions,
            log: self.log,
        }
    }
}
