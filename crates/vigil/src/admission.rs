//! Admission control for the application's port: refuse, before a worker is spent on
//! it, work that cannot be served in time (a tower layer driving
//! `vigil_core::admission`'s three rules).
//!
//! 1. **Deadline**: the caller's remaining time is read from [`DEADLINE_HEADER`]
//!    (`x-vigil-deadline-ms`, what `vigil lb` sends) or gRPC's `grpc-timeout`. A request
//!    whose deadline has passed, or is shorter than the service's own recent latency, is
//!    refused at once (`check_deadline`). The expected latency is a running median
//!    estimate of the requests this layer let through: each finished request moves the
//!    estimate 5% of itself (at least 50 us) toward its latency, up or down (a
//!    stochastic-approximation median: a burst of outliers moves it by little, unlike a
//!    mean). It starts at zero, so until the service has answered anything only an
//!    expired deadline is refused.
//! 2. **Concurrency limit**: at most `ConcurrencyLimit::limit()` application requests run
//!    at once (AIMD on observed latency: Netflix concurrency-limits' `AIMDLimit`); every
//!    finished request is a sample, a 503 from the application counts as overload.
//! 3. **Queue time**: a request over the limit waits in a queue governed by `QueueTime`
//!    (Facebook's controlled delay, "Fail at scale", ACM Queue 2015): up to `interval`
//!    (100 ms) while the queue empties now and then, only `target` (5 ms) once it has
//!    stood for a whole interval, and then served **last in, first out** (adaptive
//!    LIFO): the newest requests, whose callers still wait, go first. A request that
//!    waited too long, or whose deadline passed while it waited, is refused when a slot
//!    frees up, or when it has waited `interval` (the longest any rule allows).
//!
//! A refusal is a fast `503` with `Retry-After: 1`, counted per reason
//! ([`Refusal::name`]: `expired`, `unmeetable`, `queue_time`; and `queue_full` when the
//! queue holds [`AdmissionConfig::max_queue`] already). Health paths bypass every rule and
//! are answered by vigil's router ([`crate::front`], shared with [`crate::ShedLayer`]).
//!
//! Overload is not a fault: [`Admission::check`] is a local check that **warns** (never
//! fails) while the service refuses or queues, so `/readyz` stays 200 and a balancer does
//! not eject a server for protecting itself.
//!
//! The layer supersedes [`crate::ShedLayer`] (a fixed limit and no queue): the shed layer
//! stays for services that want exactly that.

use crate::front::{Gate, GateLayer, Gated, overloaded};
use crate::{Check, CheckResult, Status};
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::Response;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;
use vigil_core::admission::{
    ConcurrencyLimit, QueueTime, check_deadline, parse_deadline_ms, parse_grpc_timeout,
};
pub use vigil_core::admission::{
    ConcurrencyLimitConfig, DEADLINE_HEADER, QueueTimeConfig, Refusal,
};
use vigil_core::time::Time;

/// `Retry-After` of a refused request, in seconds.
pub const ADMISSION_RETRY_AFTER_SECS: u64 = 1;
/// Default longest queue: 1024 waiting requests. The queue-time rule bounds the wait;
/// this bounds the memory a flood can take before the rule catches up.
pub const DEFAULT_MAX_QUEUE: usize = 1024;
/// How long [`Admission::check`] keeps warning after the last refusal: 10 s, so a
/// readiness probe every few seconds sees an episode of shedding.
pub const DEFAULT_WARN_FOR: Duration = Duration::from_secs(10);
/// The label of a refusal because the queue was full.
pub const QUEUE_FULL: &str = "queue_full";

/// The layer's settings.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// The controlled-delay queue. Defaults to 5 ms target, 100 ms interval.
    pub queue: QueueTimeConfig,
    /// The AIMD concurrency limit. Defaults to 20 at start, 2-1000, 1 s latency target.
    pub limit: ConcurrencyLimitConfig,
    /// The most requests waiting at once. Defaults to 1024.
    pub max_queue: usize,
    /// How long the check warns after a refusal. Defaults to 10 s.
    #[serde(with = "humantime_serde")]
    pub warn_for: Duration,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            queue: QueueTimeConfig::default(),
            limit: ConcurrencyLimitConfig::default(),
            max_queue: DEFAULT_MAX_QUEUE,
            warn_for: DEFAULT_WARN_FOR,
        }
    }
}

impl AdmissionConfig {
    /// Checks every part, naming the bad key.
    pub fn validate(&self) -> Result<(), vigil_core::Invalid> {
        self.queue.validate()?;
        self.limit.validate()?;
        if self.max_queue == 0 {
            return Err(vigil_core::Invalid::new("max_queue", "must be at least 1"));
        }
        Ok(())
    }
}

struct Waiter {
    id: u64,
    enqueued: Instant,
    deadline: Option<Instant>,
    tx: oneshot::Sender<Result<(), Refusal>>,
}

/// What became of a waiter that left the queue on its own (its time ran out, or its
/// caller went away).
enum Left {
    /// Still queued: taken out.
    Removed,
    /// Granted a slot it will not use: given back.
    Granted,
    /// Refused by `dispatch` (counted there).
    Refused(Refusal),
    /// `dispatch` found its receiver gone and undid the slot itself.
    Gone,
}

/// A queued request's place: if its future is dropped while it waits (the client
/// disconnected, the balancer's per-try timeout cancelled the attempt), the place is
/// taken out of the queue, or a slot already granted is given back. Without it, a
/// cancelled waiter's slot would stay counted for good and the limit would close.
struct Place<'a> {
    admission: &'a Arc<Admission>,
    id: u64,
    rx: oneshot::Receiver<Result<(), Refusal>>,
    armed: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.admission.leave(self.id, &mut self.rx);
        }
    }
}

struct Inner {
    limit: ConcurrencyLimit,
    queue_time: QueueTime,
    in_flight: u32,
    waiting: VecDeque<Waiter>,
    next_id: u64,
    /// Running median estimate of admitted requests' latency, in seconds.
    median: f64,
    last_refusal: Option<Instant>,
}

/// The shared state of an admission layer: its policies, queue and counters (for the
/// check, metrics and tests). Make one with [`Admission::new`], register
/// [`Admission::check`], then [`crate::Health::admission_layer`].
pub struct Admission {
    cfg: AdmissionConfig,
    epoch: Instant,
    inner: Mutex<Inner>,
    refused: [AtomicU64; 4],
    admitted: AtomicU64,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .field("queued", &self.queued())
            .finish_non_exhaustive()
    }
}

/// The refusal reasons, in the order of [`Admission::refused`]'s counters.
pub const REFUSAL_REASONS: [&str; 4] = ["expired", "unmeetable", "queue_time", QUEUE_FULL];

fn slot(r: Option<Refusal>) -> usize {
    match r {
        Some(Refusal::Expired) => 0,
        Some(Refusal::Unmeetable) => 1,
        Some(Refusal::QueueTime) => 2,
        None => 3,
    }
}

/// A slot under the limit; released (and its latency sampled) on drop.
#[must_use = "the request runs under the limit only while the permit lives"]
pub struct AdmissionPermit {
    admission: Arc<Admission>,
    started: Instant,
    in_flight_at_start: u32,
    overload: bool,
}

impl AdmissionPermit {
    /// Marks the request as refused downstream (a 503 from the application, a
    /// dependency's breaker): the limit counts it as a sign of overload.
    pub fn overloaded(&mut self) {
        self.overload = true;
    }
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        let a = &self.admission;
        let now = Instant::now();
        let latency = now.saturating_duration_since(self.started);
        let mut st = a.lock();
        st.in_flight = st.in_flight.saturating_sub(1);
        let t = a.time(now);
        st.limit
            .on_sample(t, latency, self.in_flight_at_start, self.overload);
        let x = latency.as_secs_f64();
        let step = (st.median * 0.05).max(50e-6);
        if x > st.median {
            st.median = (st.median + step).min(x);
        } else {
            st.median = (st.median - step).max(x).max(0.0);
        }
        a.dispatch(&mut st, now);
    }
}

impl Admission {
    /// The state of a layer with `cfg`; panics on an invalid config (see
    /// [`AdmissionConfig::validate`]).
    pub fn new(cfg: AdmissionConfig) -> Arc<Admission> {
        if let Err(e) = cfg.validate() {
            panic!("vigil: invalid admission config: {e}");
        }
        let epoch = Instant::now();
        Arc::new(Admission {
            cfg,
            epoch,
            inner: Mutex::new(Inner {
                limit: ConcurrencyLimit::new(cfg.limit),
                queue_time: QueueTime::new(cfg.queue, Time::ZERO),
                in_flight: 0,
                waiting: VecDeque::new(),
                next_id: 0,
                median: 0.0,
                last_refusal: None,
            }),
            refused: Default::default(),
            admitted: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn time(&self, now: Instant) -> Time {
        Time::from_elapsed(now.saturating_duration_since(self.epoch))
    }

    /// The concurrency limit now.
    pub fn limit(&self) -> u32 {
        self.lock().limit.limit()
    }

    /// Application requests running now.
    pub fn in_flight(&self) -> u32 {
        self.lock().in_flight
    }

    /// Requests waiting in the queue now.
    pub fn queued(&self) -> usize {
        self.lock().waiting.len()
    }

    /// The latency the deadline rule expects a request to take (the running median).
    pub fn expected_latency(&self) -> Duration {
        Duration::from_secs_f64(self.lock().median)
    }

    /// Requests refused so far for `reason` (a [`REFUSAL_REASONS`] label).
    pub fn refused(&self, reason: &str) -> u64 {
        REFUSAL_REASONS
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.refused[i].load(Ordering::Relaxed))
    }

    /// Requests refused so far, every reason.
    pub fn refused_total(&self) -> u64 {
        self.refused.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Requests admitted so far.
    pub fn admitted_total(&self) -> u64 {
        self.admitted.load(Ordering::Relaxed)
    }

    fn count(&self, st: &mut Inner, r: Option<Refusal>, now: Instant) {
        self.refused[slot(r)].fetch_add(1, Ordering::Relaxed);
        st.last_refusal = Some(now);
    }

    fn permit(self: &Arc<Self>, st: &mut Inner, now: Instant) -> AdmissionPermit {
        st.in_flight += 1;
        self.admitted.fetch_add(1, Ordering::Relaxed);
        AdmissionPermit {
            admission: self.clone(),
            started: now,
            in_flight_at_start: st.in_flight,
            overload: false,
        }
    }

    /// Hands free slots to waiters: the newest first under overload (adaptive LIFO),
    /// else the oldest; refuses those that waited too long or whose deadline passed.
    /// The permit itself is made by the waiter (in_flight is counted here).
    fn dispatch(&self, st: &mut Inner, now: Instant) {
        let t = self.time(now);
        while st.limit.admits(st.in_flight) {
            let lifo = st.queue_time.lifo(t);
            let Some(w) = (if lifo {
                st.waiting.pop_back()
            } else {
                st.waiting.pop_front()
            }) else {
                break;
            };
            // vigil-core's rule, as `vigil sim` drives it: a request with a deadline may
            // wait while it can still finish in time; one without, by the queue time.
            let expected = Duration::from_secs_f64(st.median);
            let verdict = st.queue_time.admit(
                t,
                self.time(w.enqueued),
                w.deadline.map(|d| self.time(d)),
                expected,
            );
            match verdict {
                Ok(()) => {
                    // Counted before the waiter runs, so the slot is not given twice.
                    st.in_flight += 1;
                    if w.tx.send(Ok(())).is_err() {
                        // Its caller left: the slot is free again.
                        st.in_flight -= 1;
                    }
                }
                Err(r) => {
                    if w.tx.send(Err(r)).is_ok() {
                        self.count(st, Some(r), now);
                    }
                }
            }
        }
        if st.waiting.is_empty() {
            st.queue_time.empty_at(t);
        }
    }

    /// Takes waiter `id` out of the queue, or gives back the slot `dispatch` granted it
    /// (a sent permit is read from `rx` under the lock, so `dispatch` cannot be halfway).
    fn leave(&self, id: u64, rx: &mut oneshot::Receiver<Result<(), Refusal>>) -> Left {
        let mut st = self.lock();
        let now = Instant::now();
        if let Some(i) = st.waiting.iter().position(|w| w.id == id) {
            st.waiting.remove(i);
            if st.waiting.is_empty() {
                let t = self.time(now);
                st.queue_time.empty_at(t);
            }
            return Left::Removed;
        }
        match rx.try_recv() {
            Ok(Ok(())) => {
                st.in_flight = st.in_flight.saturating_sub(1);
                self.dispatch(&mut st, now);
                Left::Granted
            }
            Ok(Err(r)) => Left::Refused(r),
            Err(_) => Left::Gone,
        }
    }

    /// Rules 1-3 for a request with the caller's `deadline`: a permit, at once or after
    /// queueing, or the reason it is refused (counted).
    pub async fn acquire(
        self: &Arc<Self>,
        deadline: Option<Instant>,
    ) -> Result<AdmissionPermit, &'static str> {
        let now = Instant::now();
        let rx = {
            let mut st = self.lock();
            let t = self.time(now);
            let expected = Duration::from_secs_f64(st.median);
            if let Err(r) = check_deadline(t, deadline.map(|d| self.time(d)), expected) {
                self.count(&mut st, Some(r), now);
                return Err(r.name());
            }
            if st.waiting.is_empty() && st.limit.admits(st.in_flight) {
                st.queue_time.empty_at(t);
                return Ok(self.permit(&mut st, now));
            }
            if st.waiting.len() >= self.cfg.max_queue {
                self.count(&mut st, None, now);
                return Err(QUEUE_FULL);
            }
            let (tx, rx) = oneshot::channel();
            let id = st.next_id;
            st.next_id += 1;
            st.waiting.push_back(Waiter {
                id,
                enqueued: now,
                deadline,
                tx,
            });
            (id, rx)
        };
        let (id, rx) = rx;
        let mut place = Place {
            admission: self,
            id,
            rx,
            armed: true,
        };
        // When it can no longer be served in time: its deadline less the expected
        // latency, else the queue-time rule's longest wait.
        let give_up = {
            let st = self.lock();
            let t = self.time(now);
            let expected = Duration::from_secs_f64(st.median);
            now + st
                .queue_time
                .wait_bound(t, deadline.map(|d| self.time(d)), expected)
        };
        let waited = tokio::time::timeout_at(give_up, &mut place.rx).await;
        match waited {
            Ok(Ok(Ok(()))) => {
                // dispatch counted the slot already; it is the permit's from here.
                place.armed = false;
                let st = self.lock();
                self.admitted.fetch_add(1, Ordering::Relaxed);
                Ok(AdmissionPermit {
                    admission: self.clone(),
                    started: Instant::now(),
                    in_flight_at_start: st.in_flight,
                    overload: false,
                })
            }
            Ok(Ok(Err(r))) => {
                place.armed = false;
                Err(r.name())
            }
            // A waiter's sender is dropped only after sending; were it otherwise, the
            // request has waited its time.
            Ok(Err(_)) | Err(_) => {
                place.armed = false;
                let left = self.leave(id, &mut place.rx);
                let now = Instant::now();
                let r = match left {
                    Left::Refused(r) => return Err(r.name()),
                    Left::Removed if deadline.is_some_and(|d| d <= now) => Refusal::Expired,
                    // Its deadline less the expected latency came first.
                    Left::Removed if deadline.is_some() => Refusal::Unmeetable,
                    // Granted at the moment the timer fired (given back), or still
                    // queued past its time.
                    Left::Removed | Left::Granted | Left::Gone => Refusal::QueueTime,
                };
                let mut st = self.lock();
                self.count(&mut st, Some(r), now);
                Err(r.name())
            }
        }
    }

    /// A local check for `/readyz`: **warn** (never fail) while requests queue, the
    /// queue stands, or within `warn_for` of the last refusal; pass otherwise.
    pub fn check(self: &Arc<Self>) -> AdmissionCheck {
        AdmissionCheck {
            admission: self.clone(),
        }
    }
}

/// The deadline a request carries: the shorter of [`DEADLINE_HEADER`] and `grpc-timeout`, from `now`.
pub fn request_deadline<B>(req: &Request<B>, now: Instant) -> Option<Instant> {
    headers_deadline(req.headers(), now)
}

/// The deadline in a request's headers (see [`request_deadline`]): what a handler reads
/// to bound its own calls below the caller's patience, with or without this layer.
pub fn headers_deadline(h: &HeaderMap, now: Instant) -> Option<Instant> {
    // Both present: the shorter, as vigil lb reads them.
    let vigil = h
        .get(DEADLINE_HEADER)
        .and_then(|v| parse_deadline_ms(v.as_bytes()));
    let grpc = h
        .get("grpc-timeout")
        .and_then(|v| parse_grpc_timeout(v.as_bytes()));
    let d = match (vigil, grpc) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    Some(now + d)
}

/// See [`Admission::check`].
#[derive(Debug)]
pub struct AdmissionCheck {
    admission: Arc<Admission>,
}

impl Check for AdmissionCheck {
    async fn check(&self) -> CheckResult {
        let a = &self.admission;
        let now = Instant::now();
        let (limit, in_flight, queued, standing, recent) = {
            let st = a.lock();
            let t = a.time(now);
            (
                st.limit.limit(),
                st.in_flight,
                st.waiting.len(),
                st.queue_time.overloaded(t) && !st.waiting.is_empty(),
                st.last_refusal
                    .is_some_and(|r| now.saturating_duration_since(r) < a.cfg.warn_for),
            )
        };
        let refused = a.refused_total();
        let text = format!(
            "{in_flight} of {limit} requests in flight, {queued} queued, {refused} refused so far"
        );
        let status = if standing || recent || queued > 0 {
            Status::Warn
        } else {
            Status::Pass
        };
        let text = match status {
            Status::Pass => text,
            _ => format!("shedding load (overloaded, not broken): {text}"),
        };
        CheckResult::new(status)
            .with_observed(in_flight, "count")
            .with_output(text)
    }

    fn component_type(&self) -> &str {
        "system"
    }
}

// === impl AdmissionLayer ===

/// The tower layer; see the module doc. Build it with
/// [`crate::Health::admission_layer`]; apply it with `Router::layer`.
pub type AdmissionLayer = GateLayer<Arc<Admission>>;

/// The service made by [`AdmissionLayer`].
pub type AdmissionService<S> = Gated<S, Arc<Admission>>;

impl AdmissionLayer {
    /// A layer in front of `health` (the health router) sharing `admission`.
    pub fn new(health: Router, admission: Arc<Admission>) -> Self {
        GateLayer::with_gate(health, admission)
    }

    /// The shared state (counters, limit).
    pub fn admission(&self) -> Arc<Admission> {
        self.gate().clone()
    }
}

impl Gate for Arc<Admission> {
    type Ticket = AdmissionPermit;

    fn enter(
        &self,
        req: &Request<Body>,
    ) -> impl Future<Output = Result<AdmissionPermit, Response>> + Send + 'static {
        let admission = self.clone();
        let deadline = request_deadline(req, Instant::now());
        async move {
            admission.acquire(deadline).await.map_err(|reason| {
                overloaded(
                    ADMISSION_RETRY_AFTER_SECS,
                    format!("overloaded: request refused ({reason})\n"),
                )
            })
        }
    }

    /// A shed answer from further in (a `503` with `Retry-After`, as
    /// [`overloaded`] makes it) is a sign of overload; a plain `503` ("the database is
    /// down and the item is not cached") is not, or a dependency outage at light load
    /// would sink the limit to its minimum and refuse what the cache could serve.
    fn leave(permit: &mut AdmissionPermit, response: &Response) {
        if response.status() == StatusCode::SERVICE_UNAVAILABLE
            && response
                .headers()
                .contains_key(axum::http::header::RETRY_AFTER)
        {
            permit.overloaded();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;

    fn cfg(limit: u32) -> AdmissionConfig {
        AdmissionConfig {
            limit: ConcurrencyLimitConfig {
                initial: limit,
                min: limit,
                max: limit,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn the_shorter_of_both_deadline_headers_counts() {
        let now = Instant::now();
        let mut h = HeaderMap::new();
        h.insert(DEADLINE_HEADER, "900".parse().unwrap());
        h.insert("grpc-timeout", "200m".parse().unwrap());
        assert_eq!(
            headers_deadline(&h, now),
            Some(now + Duration::from_millis(200))
        );
        h.insert("grpc-timeout", "2S".parse().unwrap());
        assert_eq!(
            headers_deadline(&h, now),
            Some(now + Duration::from_millis(900))
        );
        h.remove(DEADLINE_HEADER);
        assert_eq!(
            headers_deadline(&h, now),
            Some(now + Duration::from_secs(2))
        );
        h.remove("grpc-timeout");
        assert_eq!(headers_deadline(&h, now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_shed_503_cuts_the_limit() {
        let a = Admission::new(AdmissionConfig::default());
        let before = a.limit();
        let plain = (StatusCode::SERVICE_UNAVAILABLE, "db down, not cached").into_response();
        let mut p = a.acquire(None).await.unwrap();
        <Arc<Admission> as Gate>::leave(&mut p, &plain);
        drop(p);
        assert_eq!(a.limit(), before, "a plain 503 is not overload");
        let shed = overloaded(1, "overloaded".into());
        let mut p = a.acquire(None).await.unwrap();
        <Arc<Admission> as Gate>::leave(&mut p, &shed);
        drop(p);
        assert!(a.limit() < before, "a shed 503 cuts it: {}", a.limit());
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_gives_its_place_and_its_granted_slot_back() {
        let a = Admission::new(cfg(1));
        let busy = a.acquire(None).await.expect("starts at once");
        // Cancelled while queued: taken out of the queue.
        let w = tokio::spawn({
            let a = a.clone();
            async move { a.acquire(None).await.map(drop) }
        });
        tokio::task::yield_now().await;
        assert_eq!(a.queued(), 1);
        w.abort();
        let _ = w.await;
        assert_eq!((a.queued(), a.in_flight()), (0, 1));
        // Granted a slot, then cancelled before it ran: the slot comes back.
        let w = tokio::spawn({
            let a = a.clone();
            async move { a.acquire(None).await.map(drop) }
        });
        tokio::task::yield_now().await;
        assert_eq!(a.queued(), 1);
        drop(busy);
        assert_eq!(a.in_flight(), 1, "dispatch granted the waiter the slot");
        w.abort();
        let _ = w.await;
        assert_eq!(
            a.in_flight(),
            0,
            "the cancelled waiter's slot is free again"
        );
        let p = a.acquire(None).await.expect("the limit is open again");
        drop(p);
        assert_eq!(a.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn lifo_under_overload_serves_the_newest() {
        let a = Admission::new(cfg(1));
        let busy = a
            .acquire(None)
            .await
            .expect("the first request starts at once");
        // Keep the queue standing past the 100 ms interval: one waiter after another.
        let old = tokio::spawn({
            let a = a.clone();
            async move { a.acquire(None).await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(60)).await;
        let mid = tokio::spawn({
            let a = a.clone();
            async move { a.acquire(None).await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            old.await.unwrap().err(),
            Some("queue_time"),
            "a request waiting past the interval is refused"
        );
        let mut newest = Vec::new();
        for _ in 0..3 {
            let a2 = a.clone();
            newest.push(tokio::spawn(async move {
                a2.acquire(None).await.map(|p| (Instant::now(), p))
            }));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(busy);
        tokio::time::sleep(Duration::from_millis(1)).await;
        // The newest got the slot; the two before it are stale (over the 5 ms target
        // once the next slot frees) and time out.
        let last = newest.pop().unwrap();
        assert!(
            last.is_finished(),
            "under overload the newest request goes first"
        );
        let (_, permit) = last.await.unwrap().expect("the newest is admitted");
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(permit);
        for h in newest {
            assert_eq!(h.await.unwrap().err(), Some("queue_time"));
        }
        drop(mid);
        assert!(a.refused("queue_time") >= 3, "{a:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn fifo_without_a_standing_queue() {
        let a = Admission::new(cfg(1));
        let busy = a.acquire(None).await.unwrap();
        let first = tokio::spawn({
            let a = a.clone();
            async move { a.acquire(None).await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let second = tokio::spawn({
            let a = a.clone();
            async move { a.acquire(None).await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        drop(busy);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(first.is_finished(), "a short queue is served in order");
        assert!(first.await.unwrap().is_ok());
        assert!(second.await.unwrap().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn expired_deadline_is_refused_and_counted() {
        let a = Admission::new(AdmissionConfig::default());
        assert_eq!(a.acquire(Some(Instant::now())).await.err(), Some("expired"));
        assert_eq!(a.refused("expired"), 1);
        assert!(
            a.acquire(Some(Instant::now() + Duration::from_secs(1)))
                .await
                .is_ok()
        );
    }
}
