//! The runtime side of a pool: drives vigil-core's `Pool` policy with real time, and
//! publishes lock-free routing snapshots for the data path.
//!
//! Floor 5, pool (floors: the crate doc): imports upstream (each target's connections),
//! config and metrics.
//!
//! Design: the policy state ([`vigil_core::pool::Pool`]) sits behind a mutex that is
//! taken only when something may change (a health check result, an error, a success
//! after an error, the 100 ms tick). After every change the pool's [`Routing`] snapshot
//! is rebuilt and swapped into an `ArcSwap`, which the data path reads without locking.
//! Per-target counters (outstanding requests) are atomics. Every event the policy
//! returns is logged with its cause, reflected in metrics, and when a target leaves
//! service its in-flight requests are told at once (a `Notify`), so idempotent ones can
//! be retried elsewhere instead of waiting for a frozen target.

use crate::config::{Balance, CheckType, DEFAULT_HEALTH_PATH, PoolSection};
use crate::metrics::{Metrics, PoolLabels, RequestLabels, TargetLabels};
use crate::upstream::ConnPool;
use crate::upstream::tls::TargetTls;
use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Notify;
use vigil_core::Time;
use vigil_core::anomaly::{Counts, MemberVerdict};
use vigil_core::outlier::{OutlierEvent, RequestOutcome};
use vigil_core::pool::{
    DEFAULT_SHED_PENALTY_HALF_LIFE, Due, Pool, PoolEvent, RetryBudget, RoutingSet, ShedPenalty,
    SuccessRateRule, TargetSpec, too_few_peers,
};
use vigil_core::thresholds::HealthState;
use vigil_core::throttle::{
    AdaptiveThrottle, AdaptiveThrottleConfig, RetryThrottle, RetryThrottleConfig,
};

/// The driver's clock: monotonic time since start, as policies see it, and the wall
/// clock at start for human-readable times.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
    wall: SystemTime,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Self {
        Clock {
            start: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// Now, as a policy `Time`.
    pub fn now(&self) -> Time {
        Time::from_elapsed(self.start.elapsed())
    }

    /// A policy `Time` as wall-clock time (RFC 3339, for people).
    pub fn wall(&self, t: Time) -> String {
        humantime::format_rfc3339_millis(self.wall + t.as_elapsed()).to_string()
    }
}

/// One target as the data path sees it.
pub struct TargetRt {
    /// `host:port`.
    pub addr: String,
    /// `host:port` as a `Host` header, for a client request that had none.
    pub host_header: http::HeaderValue,
    /// Pooled connections to it.
    pub conns: Arc<ConnPool>,
    /// Requests in flight to it (P2C's load).
    pub outstanding: AtomicU64,
    /// Load added by its recent shed answers (503, 429): errors count as load.
    shed: Mutex<ShedPenalty>,
    /// Whether `shed` may be non-zero: the data path reads the lock only then.
    shedding: AtomicBool,
    /// Set when an error was reported to outlier detection and no success since (so a
    /// success must be reported too, to reset the streak; otherwise it need not be).
    error_pending: AtomicBool,
    /// Requests that succeeded since the success-rate rule last took the counts.
    succeeded: AtomicU64,
    /// Requests that failed (outlier detection's errors) since then.
    failed: AtomicU64,
    /// The success-rate rule's last verdict on it (`None` while it is out of service or
    /// the rule is off), for `/admin/targets`.
    pub success_rate: Mutex<Option<MemberVerdict>>,
    /// Woken when the target leaves service (unhealthy or ejected).
    pub left_service: Arc<Notify>,
    /// Whether it is in service now (as of the last snapshot).
    pub in_service: AtomicBool,
    /// The last state change and why, for `/admin/targets`.
    pub last_change: Mutex<Option<(Time, String)>>,
    /// Request counters by status code (a cache over the metrics family).
    codes: RwLock<Vec<(u16, Counter)>>,
    labels: TargetLabels,
}

impl TargetRt {
    fn new(pool: &str, addr: &str) -> Self {
        TargetRt {
            addr: addr.to_string(),
            host_header: http::HeaderValue::from_str(addr)
                .unwrap_or_else(|_| http::HeaderValue::from_static("localhost")),
            conns: ConnPool::new(addr),
            outstanding: AtomicU64::new(0),
            shed: Mutex::new(ShedPenalty::default()),
            shedding: AtomicBool::new(false),
            error_pending: AtomicBool::new(false),
            succeeded: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            success_rate: Mutex::new(None),
            left_service: Arc::new(Notify::new()),
            in_service: AtomicBool::new(false),
            last_change: Mutex::new(None),
            codes: RwLock::new(Vec::new()),
            labels: TargetLabels {
                pool: pool.to_string(),
                target: addr.to_string(),
            },
        }
    }

    /// Its load as balancing sees it at `now`: requests in flight plus the penalty of
    /// its recent shed answers ([`ShedPenalty`]), so a target failing fast with 503s does
    /// not look idle and draw more traffic.
    pub fn load(&self, now: Time) -> u64 {
        let outstanding = self.outstanding.load(Ordering::Relaxed);
        if !self.shedding.load(Ordering::Relaxed) {
            return outstanding;
        }
        let shed = self.shed.lock().expect("shed lock");
        let penalty = shed.load(now, DEFAULT_SHED_PENALTY_HALF_LIFE);
        if penalty < 0.5 {
            self.shedding.store(false, Ordering::Relaxed);
        }
        outstanding + penalty.round() as u64
    }

    /// Records one shed answer (503, 429) at `now`.
    fn shed(&self, now: Time) {
        let mut shed = self.shed.lock().expect("shed lock");
        shed.add(now, DEFAULT_SHED_PENALTY_HALF_LIFE);
        self.shedding.store(true, Ordering::Relaxed);
    }

    /// Counts one answered request with `code`.
    pub fn count(&self, metrics: &Metrics, code: u16) {
        if let Some((_, c)) = self
            .codes
            .read()
            .expect("codes lock")
            .iter()
            .find(|(k, _)| *k == code)
        {
            c.inc();
            return;
        }
        let c = metrics
            .requests
            .get_or_create(&RequestLabels {
                pool: self.labels.pool.clone(),
                target: self.labels.target.clone(),
                code: code.to_string(),
            })
            .clone();
        c.inc();
        self.codes.write().expect("codes lock").push((code, c));
    }
}

/// A routing snapshot: who may get traffic (indices into `targets`).
pub struct Routing {
    /// The policy's routing set, keyed by index into `targets`.
    pub set: RoutingSet<usize>,
    /// The targets.
    pub targets: Vec<Arc<TargetRt>>,
}

/// A decaying latency histogram giving the hedge delay (the pool's recent quantile).
pub struct LatencyTracker {
    buckets: [AtomicU64; LATENCY_BUCKETS],
    threshold_us: AtomicU64,
}

const LATENCY_BUCKETS: usize = 64;
/// Samples needed before the quantile is trusted (before that: the max hedge delay).
const MIN_LATENCY_SAMPLES: u64 = 50;

fn latency_bucket(us: u64) -> usize {
    // Three buckets per power of two: 1 us .. 2^21 us (2 s); coarse but lock-free.
    let x = (us.max(1) as f64).log2() * 3.0;
    (x as usize).min(LATENCY_BUCKETS - 1)
}

fn bucket_upper_us(i: usize) -> u64 {
    2f64.powf((i + 1) as f64 / 3.0).ceil() as u64
}

impl Default for LatencyTracker {
    fn default() -> Self {
        LatencyTracker {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            threshold_us: AtomicU64::new(u64::MAX),
        }
    }
}

impl LatencyTracker {
    /// Records one response-header latency.
    pub fn record(&self, d: Duration) {
        self.buckets[latency_bucket(d.as_micros() as u64)].fetch_add(1, Ordering::Relaxed);
    }

    /// Recomputes the quantile and halves the counts (so the estimate follows the last
    /// few seconds). Called once a second.
    pub fn refresh(&self, quantile: f64) {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total < MIN_LATENCY_SAMPLES {
            self.threshold_us.store(u64::MAX, Ordering::Relaxed);
        } else {
            let want = (total as f64 * quantile).ceil() as u64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= want {
                    self.threshold_us
                        .store(bucket_upper_us(i), Ordering::Relaxed);
                    break;
                }
            }
        }
        for b in &self.buckets {
            let v = b.load(Ordering::Relaxed);
            b.fetch_sub(v / 2, Ordering::Relaxed);
        }
    }

    /// The hedge delay: the recent quantile clamped to `[min, max]`.
    pub fn hedge_delay(&self, min: Duration, max: Duration) -> Duration {
        let us = self.threshold_us.load(Ordering::Relaxed);
        if us == u64::MAX {
            return max;
        }
        Duration::from_micros(us).clamp(min, max)
    }
}

/// The span of a pool's recent client success rate: the last minute...
pub const CLIENT_WINDOW: Duration = Duration::from_secs(60);
/// ...in steps of 10 s (the window is 50 to 60 s long once the pool has run a minute).
pub const CLIENT_WINDOW_STEP: Duration = Duration::from_secs(10);

/// What a pool's clients got, counted by the balancer itself (prometheus-client's
/// families cannot be read back): answers by class on the data path (plain atomics),
/// and every [`CLIENT_WINDOW_STEP`] a snapshot of the totals taken by the tick loop, so
/// that the answers and errors of about the last [`CLIENT_WINDOW`] are the totals now
/// minus the oldest snapshot in it. An error is a 5xx, the target's or one vigil made
/// (a gateway error: 502, 503, 504 when no target could answer); a 4xx is the client's
/// and counts as a success, as for outlier detection.
#[derive(Default)]
pub struct ClientStats {
    /// Answers by class: 1xx (upgrades), 2xx, 3xx, 4xx, 5xx, gateway errors.
    classes: [AtomicU64; 6],
    /// (when, answered, errors) totals, oldest first, spanning at most the window.
    snapshots: Mutex<std::collections::VecDeque<(Time, u64, u64)>>,
}

/// The class names of [`ClientStats`], in order.
pub const CLIENT_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "gateway_error"];

/// A pool's client answers as `/admin/targets` shows them.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientCounts {
    /// Answers by class, as [`CLIENT_CLASSES`].
    pub classes: [u64; 6],
    /// Answers in the recent window.
    pub recent_answered: u64,
    /// Errors (5xx, gateway errors) in it.
    pub recent_errors: u64,
    /// How long the recent window is.
    pub recent_span: Duration,
}

impl ClientCounts {
    /// Every answer.
    pub fn answered(&self) -> u64 {
        self.classes.iter().sum()
    }

    /// 5xx and gateway errors.
    pub fn errors(&self) -> u64 {
        self.classes[4] + self.classes[5]
    }
}

impl ClientStats {
    /// Counts an answer: the target's (`local` false) or vigil's own.
    pub fn record(&self, code: u16, local: bool) {
        let class = match code {
            502..=504 if local => 5,
            100..=599 => usize::from(code / 100) - 1,
            _ => 4,
        };
        self.classes[class].fetch_add(1, Ordering::Relaxed);
    }

    fn totals(&self) -> ([u64; 6], u64, u64) {
        let classes: [u64; 6] = std::array::from_fn(|i| self.classes[i].load(Ordering::Relaxed));
        let answered = classes.iter().sum();
        (classes, answered, classes[4] + classes[5])
    }

    /// Takes a snapshot every [`CLIENT_WINDOW_STEP`] (called by the tick loop).
    fn tick(&self, now: Time) {
        let mut snaps = self.snapshots.lock().expect("client stats lock");
        if snaps
            .back()
            .is_some_and(|(at, _, _)| now.since(*at) < CLIENT_WINDOW_STEP)
        {
            return;
        }
        let (_, answered, errors) = self.totals();
        snaps.push_back((now, answered, errors));
        while snaps
            .front()
            .is_some_and(|(at, _, _)| now.since(*at) > CLIENT_WINDOW)
        {
            snaps.pop_front();
        }
    }

    /// The counts now.
    pub fn counts(&self, now: Time) -> ClientCounts {
        let (classes, answered, errors) = self.totals();
        let snaps = self.snapshots.lock().expect("client stats lock");
        let (since, a0, e0) = snaps
            .iter()
            .find(|(at, _, _)| now.since(*at) <= CLIENT_WINDOW)
            .copied()
            .unwrap_or((now, answered, errors));
        ClientCounts {
            classes,
            recent_answered: answered.saturating_sub(a0),
            recent_errors: errors.saturating_sub(e0),
            recent_span: now.since(since),
        }
    }
}

/// How one attempt ended, for the retry throttle: whether the target did the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptVerdict {
    /// A response header other than an overload or gateway answer.
    Success,
    /// A reset, garbage, a per-try timeout or send stall, or a 502, 503 or 504 from the
    /// target. (A connect failure is not recorded at all: nothing was sent.)
    Failure,
}

impl AttemptVerdict {
    /// The verdict on a target's response with status `code`: 502, 503 and 504 are the
    /// answers of a target (or a proxy in front of it) that could not do the work.
    pub fn of_status(code: u16) -> AttemptVerdict {
        if matches!(code, 502..=504) {
            AttemptVerdict::Failure
        } else {
            AttemptVerdict::Success
        }
    }
}

/// A pool's retry throttle at run time: vigil-core's token bucket
/// ([`RetryThrottle`]) behind a lock, with the one fact the data path needs on every
/// request kept in an atomic. While the bucket is full, a success changes nothing
/// (the bucket is capped) and a retry is allowed, so the common case (every attempt
/// succeeds) reads one shared flag and takes no lock; the lock is taken on failures,
/// on successes that refill a bucket below its cap, and on retries while it is not
/// full. A success skipped on a flag a concurrent failure is about to clear counts as
/// the earlier of the two: the same bucket in another order.
pub struct RetryThrottleRt {
    /// The bucket, its settings and its gauge; `None`: off.
    bucket: Mutex<Option<Bucket>>,
    /// The bucket is full, or the throttle off: successes and retries need no lock.
    at_rest: AtomicBool,
    /// The throttle is off: nothing is recorded.
    off: AtomicBool,
    name: String,
    metrics: Arc<Metrics>,
}

/// A throttle that is on.
struct Bucket {
    cfg: RetryThrottleConfig,
    throttle: RetryThrottle,
    /// `vigil_lb_retry_throttle_tokens{pool}`.
    gauge: Gauge<f64, AtomicU64>,
}

impl RetryThrottleRt {
    fn new(name: &str, cfg: Option<RetryThrottleConfig>, metrics: Arc<Metrics>) -> Self {
        let rt = RetryThrottleRt {
            bucket: Mutex::new(None),
            at_rest: AtomicBool::new(true),
            off: AtomicBool::new(true),
            name: name.to_string(),
            metrics,
        };
        rt.configure(cfg);
        rt
    }

    /// Applies a (re)loaded setting: an unchanged one keeps its bucket, a new one
    /// starts full, `None` turns the throttle off (and its gauge goes).
    fn configure(&self, cfg: Option<RetryThrottleConfig>) {
        let mut bucket = self.bucket.lock().expect("throttle lock");
        if bucket.as_ref().map(|b| b.cfg) == cfg {
            return;
        }
        let labels = PoolLabels {
            pool: self.name.clone(),
        };
        *bucket = cfg.map(|cfg| {
            let throttle = RetryThrottle::new(cfg);
            let gauge = self
                .metrics
                .retry_throttle_tokens
                .get_or_create(&labels)
                .clone();
            gauge.set(throttle.tokens());
            Bucket {
                cfg,
                throttle,
                gauge,
            }
        });
        if bucket.is_none() {
            self.metrics.retry_throttle_tokens.remove(&labels);
        }
        self.off.store(cfg.is_none(), Ordering::Relaxed);
        self.at_rest.store(true, Ordering::Relaxed);
    }

    /// Records how an attempt ended (every attempt, retries and hedges included).
    pub fn record(&self, verdict: AttemptVerdict) {
        let ok = verdict == AttemptVerdict::Success;
        if (ok && self.at_rest.load(Ordering::Relaxed)) || self.off.load(Ordering::Relaxed) {
            return;
        }
        let mut bucket = self.bucket.lock().expect("throttle lock");
        let Some(b) = bucket.as_mut() else {
            return;
        };
        if ok {
            b.throttle.record(1, 0);
        } else {
            b.throttle.record(0, 1);
        }
        let tokens = b.throttle.tokens();
        self.at_rest
            .store(tokens >= f64::from(b.cfg.max_tokens), Ordering::Relaxed);
        b.gauge.set(tokens);
    }

    /// Whether a retry or hedge may go now (the bucket holds more than half its tokens,
    /// or the throttle is off).
    pub fn allows(&self) -> bool {
        if self.at_rest.load(Ordering::Relaxed) {
            return true;
        }
        self.bucket
            .lock()
            .expect("throttle lock")
            .as_ref()
            .is_none_or(|b| b.throttle.allows())
    }

    /// Tokens in the bucket now (`None`: off).
    pub fn tokens(&self) -> Option<f64> {
        self.bucket
            .lock()
            .expect("throttle lock")
            .as_ref()
            .map(|b| b.throttle.tokens())
    }
}

/// A pool's local shedding at run time (`throttle`, off by default): the SRE book's
/// adaptive throttling ([`AdaptiveThrottle`]) behind a lock. Off, it costs the data
/// path one shared flag per request; on, a lock per request and per attempt, which a
/// pool that asks for it pays for seeing its targets' acceptance.
pub struct SheddingRt {
    state: Mutex<Option<(AdaptiveThrottleConfig, AdaptiveThrottle)>>,
    on: AtomicBool,
}

impl SheddingRt {
    fn new(cfg: Option<AdaptiveThrottleConfig>) -> Self {
        let rt = SheddingRt {
            state: Mutex::new(None),
            on: AtomicBool::new(false),
        };
        rt.configure(cfg);
        rt
    }

    /// Applies a (re)loaded setting: an unchanged one keeps its window.
    fn configure(&self, cfg: Option<AdaptiveThrottleConfig>) {
        let mut state = self.state.lock().expect("shedding lock");
        if state.as_ref().map(|(c, _)| *c) != cfg {
            *state = cfg.map(|c| (c, AdaptiveThrottle::new(c)));
        }
        self.on.store(cfg.is_some(), Ordering::Relaxed);
    }

    /// Whether to answer a new request at `now` locally (503) rather than forward it,
    /// given a uniform draw `u` in `0..1`; a shed request counts as a request.
    pub fn sheds(&self, now: Time, u: f64) -> bool {
        if !self.on.load(Ordering::Relaxed) {
            return false;
        }
        self.state
            .lock()
            .expect("shedding lock")
            .as_mut()
            .is_some_and(|(_, t)| t.should_reject(now, u))
    }

    /// Records an attempt a target was sent, ending at `now`: `accepted` when it
    /// answered with anything but an overload refusal (503, 429); a timeout, a reset or
    /// a connect failure is not accepted.
    pub fn record(&self, now: Time, accepted: bool) {
        if !self.on.load(Ordering::Relaxed) {
            return;
        }
        if let Some((_, t)) = self.state.lock().expect("shedding lock").as_mut() {
            t.record(now, 1, u64::from(accepted));
        }
    }
}

/// One pool at run time.
pub struct PoolRt {
    /// The pool's name.
    pub name: String,
    /// Its configuration (swapped on reload).
    pub section: ArcSwap<PoolSection>,
    /// The policy state.
    pub state: Mutex<Pool<String>>,
    /// Every target, by address.
    pub targets: Mutex<BTreeMap<String, Arc<TargetRt>>>,
    /// The current routing snapshot.
    pub routing: ArcSwap<Routing>,
    /// Retries and hedges allowed.
    pub budget: Mutex<RetryBudget>,
    /// Retries and hedges stopped while most attempts fail (`retries.throttle`).
    pub throttle: RetryThrottleRt,
    /// Requests shed locally while the targets refuse most (`throttle`).
    pub shedding: SheddingRt,
    /// Recent latency, for hedging.
    pub latency: LatencyTracker,
    /// The success-rate rule's state (taken only by the tick loop).
    success_rate: Mutex<SuccessRateRule<String>>,
    /// What its clients got.
    pub clients: ClientStats,
    /// Round-robin counter.
    pub rr: AtomicU64,
    /// Latency histogram handle.
    pub duration: Histogram,
    clock: Clock,
    metrics: Arc<Metrics>,
}

impl PoolRt {
    /// Builds a pool from its configuration; targets start per `new_targets`. `tls`:
    /// its TLS to the targets, when its section has one (read by `crate::tls::load`).
    pub fn new(
        name: &str,
        section: PoolSection,
        tls: Option<Arc<TargetTls>>,
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> Self {
        let now = clock.now();
        let mut pool = Pool::new(name, section.core());
        let mut targets = BTreeMap::new();
        for t in &section.targets {
            pool.add_target(t.addr.clone(), spec(t), now);
            let target = Arc::new(TargetRt::new(name, &t.addr));
            target.conns.set_protocol(section.protocol, tls.clone());
            targets.insert(t.addr.clone(), target);
        }
        let duration = metrics
            .duration
            .get_or_create(&PoolLabels {
                pool: name.to_string(),
            })
            .clone();
        let success_rate = SuccessRateRule::new(section.outlier.success_rate.anomaly());
        let rt = PoolRt {
            name: name.to_string(),
            budget: Mutex::new(RetryBudget::new(section.retries.budget)),
            throttle: RetryThrottleRt::new(
                name,
                section.retries.throttle.tokens(),
                metrics.clone(),
            ),
            shedding: SheddingRt::new(section.throttle),
            section: ArcSwap::from_pointee(section),
            state: Mutex::new(pool),
            targets: Mutex::new(targets),
            routing: ArcSwap::from_pointee(Routing {
                set: RoutingSet::default(),
                targets: Vec::new(),
            }),
            latency: LatencyTracker::default(),
            success_rate: Mutex::new(success_rate),
            clients: ClientStats::default(),
            rr: AtomicU64::new(0),
            duration,
            clock,
            metrics,
        };
        let state = rt.state.lock().expect("pool lock");
        if state.fail_open().is_some() {
            tracing::warn!(pool = name, "pool starts in fail-open");
        }
        rt.publish(&state);
        drop(state);
        rt
    }

    /// Applies a new configuration (a reload): keeps every known target's state.
    pub fn reconfigure(&self, section: PoolSection, tls: Option<Arc<TargetTls>>) {
        let now = self.clock.now();
        let mut state = self.state.lock().expect("pool lock");
        let mut events = state.reconfigure(section.core(), now);
        events.extend(state.set_targets(
            section.targets.iter().map(|t| (t.addr.clone(), spec(t))),
            now,
        ));
        {
            let mut targets = self.targets.lock().expect("targets lock");
            targets.retain(|addr, _| section.targets.iter().any(|t| &t.addr == addr));
            for t in &section.targets {
                targets
                    .entry(t.addr.clone())
                    .or_insert_with(|| Arc::new(TargetRt::new(&self.name, &t.addr)))
                    .conns
                    .set_protocol(section.protocol, tls.clone());
            }
        }
        *self.budget.lock().expect("budget lock") = RetryBudget::new(section.retries.budget);
        self.throttle.configure(section.retries.throttle.tokens());
        self.shedding.configure(section.throttle);
        self.section.store(Arc::new(section));
        self.handle(&mut state, events);
    }

    /// The balancing policy.
    pub fn balance(&self) -> Balance {
        self.section.load().balance
    }

    /// Records an active check's result. Returns whether the checks have a verdict on the
    /// target now (healthy or unhealthy, not "not checked yet").
    pub fn observe_probe(&self, addr: &str, ok: bool, detail: String) -> bool {
        let now = self.clock.now();
        let key = addr.to_string();
        let mut state = self.state.lock().expect("pool lock");
        let events = state.observe_probe(&key, now, ok, detail);
        self.handle(&mut state, events);
        state
            .health(&key)
            .is_some_and(|h| h != vigil_core::HealthState::Unknown)
    }

    /// Records a forwarded request's outcome (passive outlier detection). Successes take
    /// the lock only when they end an error streak. A shed answer (503, 429) is load, not
    /// a failure: it raises the target's load for balancing and leaves outlier detection
    /// alone (vigil_core::outlier, rule 5). Every other outcome is counted for the
    /// success-rate rule.
    pub fn observe_request(&self, target: &TargetRt, outcome: RequestOutcome) {
        if outcome.is_shed() {
            target.shed(self.clock.now());
            return;
        }
        if outcome.is_error() {
            target.failed.fetch_add(1, Ordering::Relaxed);
            target.error_pending.store(true, Ordering::Relaxed);
        } else {
            target.succeeded.fetch_add(1, Ordering::Relaxed);
            if !target.error_pending.swap(false, Ordering::Relaxed) {
                return;
            }
        }
        let now = self.clock.now();
        let jitter: f64 = rand::random();
        let mut state = self.state.lock().expect("pool lock");
        let events = state.observe_request(&target.addr, now, outcome, jitter);
        if !events.is_empty() {
            self.handle(&mut state, events);
        }
    }

    /// Advances time: readmissions after ejections end; every
    /// `outlier.success_rate.interval`, the success-rate rule.
    pub fn tick(&self) {
        let now = self.clock.now();
        let mut state = self.state.lock().expect("pool lock");
        let events = state.tick(now);
        if !events.is_empty() {
            self.handle(&mut state, events);
        }
        drop(state);
        self.judge_success_rates();
        self.clients.tick(now);
    }

    /// The success-rate rule (vigil_core::anomaly over the targets in service, the pool
    /// as one cohort): takes each target's counts since the last time into the window,
    /// judges every target against its peers, and ejects the outliers through outlier
    /// detection (`max_ejection_percent`, ejection times, fail-open as for any
    /// ejection). A target out of service (unhealthy, ejected) is forgotten: it is judged
    /// afresh on its return, never on what it did before it left.
    fn judge_success_rates(&self) {
        let config = self.section.load().outlier.success_rate;
        let now = self.clock.now();
        let mut rule = self.success_rate.lock().expect("success rate lock");
        match rule.due(now, config.enabled, config.interval, config.anomaly()) {
            Due::NotYet | Due::Off { cleared: false } => return,
            Due::Off { cleared: true } => {
                for t in self.targets.lock().expect("targets lock").values() {
                    *t.success_rate.lock().expect("verdict lock") = None;
                }
                return;
            }
            Due::Now => {}
        }
        let targets: BTreeMap<String, Arc<TargetRt>> =
            self.targets.lock().expect("targets lock").clone();
        let counts = targets.iter().map(|(addr, t)| {
            let c = Counts::new(
                t.succeeded.swap(0, Ordering::Relaxed),
                t.failed.swap(0, Ordering::Relaxed),
            );
            (addr.clone(), c)
        });
        let mut state = self.state.lock().expect("pool lock");
        let judged = rule.judge(now, &mut state, counts, rand::random::<f64>);
        for addr in &judged.forgotten {
            if let Some(t) = targets.get(addr) {
                *t.success_rate.lock().expect("verdict lock") = None;
            }
        }
        for (addr, v) in judged.verdicts {
            tracing::debug!(pool = %self.name, target_id = %addr, "success rate: {v}");
            if too_few_peers(&v) {
                tracing::info!(pool = %self.name, target_id = %addr, "success rate, report only: {v}");
            }
            if let Some(t) = targets.get(&addr) {
                *t.success_rate.lock().expect("verdict lock") = Some(v);
            }
        }
        if !judged.events.is_empty() {
            self.handle(&mut state, judged.events);
        }
    }

    /// Whether `addr` is one of its targets.
    pub fn has_target(&self, addr: &str) -> bool {
        self.targets
            .lock()
            .expect("targets lock")
            .contains_key(addr)
    }

    /// Targets in service other than `addr` (what a drain of `addr` would leave).
    pub fn in_service_besides(&self, addr: &str) -> usize {
        let now = self.clock.now();
        let state = self.state.lock().expect("pool lock");
        state
            .targets(now)
            .filter(|v| {
                v.key != addr
                    && matches!(
                        v.state,
                        vigil_core::pool::TargetState::Healthy
                            | vigil_core::pool::TargetState::SlowStart
                    )
            })
            .count()
    }

    /// Requests in flight on `addr` (0 when it is not a target).
    pub fn in_flight(&self, addr: &str) -> u64 {
        self.targets
            .lock()
            .expect("targets lock")
            .get(addr)
            .map_or(0, |t| t.outstanding.load(Ordering::Relaxed))
    }

    /// Whether `addr` is drained.
    pub fn is_drained(&self, addr: &str) -> bool {
        self.state
            .lock()
            .expect("pool lock")
            .is_drained(&addr.to_string())
    }

    /// Drains `addr` (no new request; those in flight finish) or puts it back; logs it
    /// and records it as the target's last change. `None` when it is not a target of
    /// this pool; otherwise its requests still in flight.
    pub fn set_drained(&self, addr: &str, drained: bool, by: &str) -> Option<u64> {
        let now = self.clock.now();
        let key = addr.to_string();
        let mut state = self.state.lock().expect("pool lock");
        let was = state.is_drained(&key);
        let events = state.set_drained(&key, drained, now)?;
        let target = self
            .targets
            .lock()
            .expect("targets lock")
            .get(addr)
            .cloned()?;
        let in_flight = target.outstanding.load(Ordering::Relaxed);
        if was != drained {
            let msg = if drained {
                format!(
                    "pool {}: target {addr} drained by {by}: no new requests, {in_flight} in flight finish there",
                    self.name
                )
            } else {
                format!(
                    "pool {}: target {addr} undrained by {by}: back in service when healthy",
                    self.name
                )
            };
            tracing::info!(pool = %self.name, target_id = %addr, "{msg}");
            *target.last_change.lock().expect("last change lock") = Some((now, msg));
        }
        self.handle(&mut state, events);
        Some(in_flight)
    }

    fn handle(&self, state: &mut Pool<String>, events: Vec<PoolEvent<String>>) {
        let now = self.clock.now();
        self.publish(state);
        let targets = self.targets.lock().expect("targets lock");
        for ev in &events {
            let msg = ev.to_string();
            match ev {
                PoolEvent::Health { to, target, .. } => {
                    if *to == HealthState::Healthy {
                        tracing::info!(pool = %self.name, target_id = %target, "{msg}");
                    } else {
                        tracing::warn!(pool = %self.name, target_id = %target, "{msg}");
                    }
                }
                PoolEvent::Outlier { event, .. } => {
                    if let OutlierEvent::Readmitted { .. } = event {
                        tracing::info!(pool = %self.name, target_id = %event.target(), "{msg}");
                    } else {
                        tracing::warn!(pool = %self.name, target_id = %event.target(), "{msg}");
                    }
                    if let OutlierEvent::Ejected { target, .. } = event {
                        self.metrics
                            .ejections
                            .get_or_create(&TargetLabels {
                                pool: self.name.clone(),
                                target: target.clone(),
                            })
                            .inc();
                    }
                }
                PoolEvent::FailOpen { entered, .. } => {
                    if !*entered {
                        tracing::warn!(pool = %self.name, "{msg}");
                    } else if let Some(last) = self.default_path_missing(state, now) {
                        // Most likely a plain web server behind a minimal config: not an
                        // emergency, a missing `health_check.path` (docs/lb.md, "A plain
                        // web server").
                        tracing::warn!(
                            pool = %self.name,
                            "{msg}: every target checked answers 404 on the default health_check.path, not a failure of the targets but a missing setting; last: {last}"
                        );
                    } else {
                        tracing::error!(pool = %self.name, "{msg}");
                    }
                }
            }
            let about = match ev {
                PoolEvent::Health { target, .. } => Some(target),
                PoolEvent::Outlier { event, .. } => Some(event.target()),
                PoolEvent::FailOpen { .. } => None,
            };
            if let Some(t) = about.and_then(|a| targets.get(a)) {
                *t.last_change.lock().expect("last change lock") = Some((now, msg.clone()));
            }
            // The snapshot is already published without it: wake its in-flight requests
            // so idempotent ones move to another target now.
            if let Some(t) = ev.left_service().and_then(|a| targets.get(a)) {
                t.left_service.notify_waiters();
            }
        }
    }

    /// When the pool checks the default path ([`DEFAULT_HEALTH_PATH`]) over HTTP and
    /// every target with a verdict is unhealthy for a 404 there: the last such check's
    /// detail (which carries the checker's hint). A 404 on a path the operator chose
    /// is a failure like any other, and is never excused here.
    fn default_path_missing(&self, state: &Pool<String>, now: Time) -> Option<String> {
        let hc = &self.section.load().health_check;
        if hc.check_type != CheckType::Http || hc.path != DEFAULT_HEALTH_PATH {
            return None;
        }
        let mut last = None;
        for t in state.targets(now) {
            match t.health {
                HealthState::Unknown => {}
                HealthState::Healthy => return None,
                HealthState::Unhealthy => {
                    let p = t.last_probe?;
                    if !p.detail.starts_with("HTTP 404") {
                        return None;
                    }
                    last = Some(p.detail.clone());
                }
            }
        }
        last
    }

    /// Rebuilds and swaps the routing snapshot; updates the gauges.
    fn publish(&self, state: &Pool<String>) {
        let now = self.clock.now();
        let set = state.routing_set(now);
        let targets_by_addr = self.targets.lock().expect("targets lock");
        let mut targets = Vec::with_capacity(set.len());
        let mut routes = Vec::with_capacity(set.len());
        for r in set.routes {
            if let Some(t) = targets_by_addr.get(&r.key) {
                routes.push(vigil_core::pool::Route {
                    key: targets.len(),
                    weight: r.weight,
                    ramp: r.ramp,
                });
                targets.push(t.clone());
            }
        }
        for (addr, t) in targets_by_addr.iter() {
            let up = state.is_in_service(addr);
            t.in_service.store(up, Ordering::Relaxed);
            self.metrics
                .target_up
                .get_or_create(&TargetLabels {
                    pool: self.name.clone(),
                    target: addr.clone(),
                })
                .set(i64::from(up));
        }
        self.metrics
            .fail_open
            .get_or_create(&PoolLabels {
                pool: self.name.clone(),
            })
            .set(i64::from(set.fail_open));
        self.routing.store(Arc::new(Routing {
            set: RoutingSet {
                routes,
                fail_open: set.fail_open,
            },
            targets,
        }));
    }

    /// Picks a target for a request, skipping `tried`. `None` when nothing is left.
    pub fn pick(&self, tried: &[Arc<TargetRt>]) -> Option<Arc<TargetRt>> {
        let routing = self.routing.load();
        let now = self.clock.now();
        let skip = |i: &usize| tried.iter().any(|t| Arc::ptr_eq(t, &routing.targets[*i]));
        let picked = match self.balance() {
            Balance::P2c => routing.set.pick_p2c(
                now,
                [rand::random(), rand::random()],
                |i| routing.targets[*i].load(now),
                skip,
            ),
            Balance::RoundRobin => {
                routing
                    .set
                    .pick_round_robin(now, self.rr.fetch_add(1, Ordering::Relaxed), skip)
            }
            Balance::LeastRequest => {
                routing
                    .set
                    .pick_least(now, rand::random(), |i| routing.targets[*i].load(now), skip)
            }
        };
        picked.map(|i| routing.targets[*i].clone())
    }

    /// Closes target connections idle for `max_idle` or more.
    pub fn evict_idle(&self, max_idle: Duration) {
        for t in self.targets.lock().expect("targets lock").values() {
            t.conns.evict_idle(max_idle);
        }
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Current time.
    pub fn now(&self) -> Time {
        self.clock.now()
    }
}

fn spec(t: &crate::config::TargetConfig) -> TargetSpec {
    TargetSpec {
        weight: t.weight,
        zone: t.zone.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_answers_are_counted_by_class_and_over_the_last_minute() {
        let c = ClientStats::default();
        c.tick(Time::ZERO);
        for (code, local) in [(200, false), (204, false), (404, false), (500, false)] {
            c.record(code, local);
        }
        c.record(503, false); // the target's own 503: a 5xx
        c.record(502, true); // vigil's: a gateway error
        c.record(408, true); // the client's slow body: a 4xx
        let n = c.counts(Time::from_secs(5));
        assert_eq!(n.classes, [0, 2, 0, 2, 2, 1]);
        assert_eq!((n.answered(), n.errors()), (7, 3));
        assert_eq!((n.recent_answered, n.recent_errors), (7, 3));
        assert_eq!(n.recent_span, Duration::from_secs(5));
        // A minute of quiet, snapshots every 10 s: the old answers leave the window.
        for s in (10..=70).step_by(10) {
            c.tick(Time::from_secs(s));
        }
        c.record(200, false);
        let n = c.counts(Time::from_secs(75));
        assert_eq!((n.answered(), n.errors()), (8, 3), "totals stay");
        assert_eq!((n.recent_answered, n.recent_errors), (1, 0));
        assert_eq!(
            n.recent_span,
            Duration::from_secs(55),
            "the oldest snapshot in the minute"
        );
    }

    #[test]
    fn hedge_delay_follows_the_recent_quantile() {
        let l = LatencyTracker::default();
        let (min, max) = (Duration::from_millis(1), Duration::from_secs(1));
        assert_eq!(
            l.hedge_delay(min, max),
            max,
            "no samples: never hedge early"
        );
        for _ in 0..95 {
            l.record(Duration::from_millis(2));
        }
        for _ in 0..5 {
            l.record(Duration::from_millis(200));
        }
        l.refresh(0.9);
        let d = l.hedge_delay(min, max);
        assert!(
            d >= Duration::from_millis(2) && d < Duration::from_millis(4),
            "p90 of mostly-2ms is about 2ms, got {d:?}"
        );
        l.refresh(0.99);
        let d = l.hedge_delay(min, max);
        assert!(
            d >= Duration::from_millis(200),
            "p99 sees the slow tail: {d:?}"
        );
    }
}
