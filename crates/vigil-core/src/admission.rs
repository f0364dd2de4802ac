//! Whether a service should start a request at all: deadlines, queue time and an
//! adaptive concurrency limit, the three rules that let overload heal by itself.
//!
//! A server in overload that works through its queue in order spends its capacity on
//! requests whose clients have already given up ("Using load shedding to avoid overload",
//! Amazon Builders' Library; "Avoiding insurmountable queue backlogs", same): the answers
//! go to nobody, new requests wait behind them and time out too, and the overload
//! outlives its trigger (Huang et al., "Metastable Failures in the Wild", OSDI 2022).
//! Each rule below refuses such work *before* a worker is spent on it, with a fast 503
//! the balancer can take elsewhere. They are pure: the driver (the `vigil` library's
//! admission layer, the simulator) passes in time, the request's deadline and what it
//! observed.
//!
//! # The rules
//!
//! 1. **Deadline** ([`check_deadline`]): a request carries the time its caller will wait
//!    (the balancer's [`DEADLINE_HEADER`], gRPC's `grpc-timeout`). Refuse it when that
//!    time has passed, or is shorter than the time the request is expected to take: a
//!    started request that cannot finish in time wastes a worker.
//! 2. **Queue time** ([`QueueTime`]): Facebook's controlled delay ("Fail at scale", ACM
//!    Queue 2015, after Nichols and Jacobson's CoDel): if the queue has been empty at some
//!    moment of the last `interval` (100 ms), a request may wait up to `interval`; if it
//!    has not (a standing queue: overload), only up to `target` (5 ms). Past that it is
//!    refused when it reaches the head. A request that carries a deadline is bounded by
//!    rule 1 instead, which is exact ([`QueueTime::admit`] says why). Under overload the
//!    queue is also served **last in, first out** (adaptive LIFO): the newest requests,
//!    whose clients are still waiting, go first; the oldest, the likeliest to be
//!    abandoned, time out in the queue.
//! 3. **Concurrency limit** ([`ConcurrencyLimit`]): additive increase, multiplicative
//!    decrease on latency (Netflix concurrency-limits' `AIMDLimit`, the discipline of TCP
//!    congestion control): each request that finished within `latency_target` while the
//!    limit was in use raises the limit by one per limit's worth of requests (about one per
//!    round trip); a request slower than the target, or refused downstream, cuts it by
//!    `backoff` (0.9), at most once per `latency_target` (one cut per round of slow
//!    answers, not one per answer, so a burst does not collapse it). Requests over the
//!    limit wait in the queue (rule 2).
//!
//! A service shedding by these rules is overloaded, not broken: its readiness says
//! **warn**, never fail, so the balancer does not eject a server for protecting itself.

use crate::Invalid;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The request header carrying the time the caller will still wait, in whole
/// milliseconds, as the balancer sends it: its remaining response-header time, capped by
/// the per-try timeout (like Envoy's `x-envoy-expected-rq-timeout-ms`).
pub const DEADLINE_HEADER: &str = "x-vigil-deadline-ms";
/// The longest deadline a header may carry: one day (a larger value is a mistake, and
/// an absurd one must not overflow a clock).
pub const MAX_DEADLINE: Duration = Duration::from_secs(24 * 3600);
/// Default queue-time target under overload: 5 ms ("Fail at scale": M = 5 ms).
pub const DEFAULT_QUEUE_TARGET: Duration = Duration::from_millis(5);
/// Default queue-time interval: 100 ms ("Fail at scale": N = 100 ms): a queue that has
/// not been empty for that long is a standing queue.
pub const DEFAULT_QUEUE_INTERVAL: Duration = Duration::from_millis(100);
/// Default multiplicative decrease of the concurrency limit: 0.9 (Netflix's AIMD).
pub const DEFAULT_LIMIT_BACKOFF: f64 = 0.9;

/// Parses a [`DEADLINE_HEADER`] value: ASCII digits only (no sign, no space), at most
/// [`MAX_DEADLINE`]. `None` for anything else: a malformed deadline is ignored, never
/// guessed.
pub fn parse_deadline_ms(value: &[u8]) -> Option<Duration> {
    if value.is_empty() || value.len() > 9 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let ms: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    let d = Duration::from_millis(ms);
    (d <= MAX_DEADLINE).then_some(d)
}

/// Parses a gRPC `grpc-timeout` value (PROTOCOL-HTTP2.md: at most 8 digits and a unit,
/// `H` `M` `S` `m` `u` `n`). `None` for anything else, or past [`MAX_DEADLINE`].
pub fn parse_grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let d = match unit {
        b'H' => Duration::from_secs(n.checked_mul(3600)?),
        b'M' => Duration::from_secs(n.checked_mul(60)?),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    };
    (d <= MAX_DEADLINE).then_some(d)
}

/// Formats `d` as a `grpc-timeout` value, in milliseconds (rounded up, so a deadline
/// never grows; at most 8 digits: seconds beyond that).
pub fn format_grpc_timeout(d: Duration) -> String {
    let ms = d.as_nanos().div_ceil(1_000_000);
    if ms < 100_000_000 {
        format!("{ms}m")
    } else {
        format!("{}S", d.as_secs().min(99_999_999))
    }
}

/// Why a request is refused before it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its deadline passed (while it queued, or before it arrived).
    Expired,
    /// Its deadline is shorter than the time it is expected to take.
    Unmeetable,
    /// It waited in the queue longer than the queue-time rule allows.
    QueueTime,
}

impl Refusal {
    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Expired => "expired",
            Refusal::Unmeetable => "unmeetable",
            Refusal::QueueTime => "queue_time",
        }
    }
}

/// Rule 1: may a request whose caller waits until `deadline` start at `now`, expected to
/// take `expected`? (`expected` is what the service knows of its own latency, e.g. its
/// recent median; zero checks only that the deadline has not passed.)
pub fn check_deadline(
    now: Time,
    deadline: Option<Time>,
    expected: Duration,
) -> Result<(), Refusal> {
    match deadline {
        None => Ok(()),
        Some(d) if d <= now => Err(Refusal::Expired),
        Some(d) if d.since(now) < expected => Err(Refusal::Unmeetable),
        Some(_) => Ok(()),
    }
}

/// [`QueueTime`]'s settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueTimeConfig {
    /// The longest wait under overload. Defaults to 5 ms.
    #[serde(with = "humantime_serde")]
    pub target: Duration,
    /// A queue not empty for this long is a standing queue; also the longest wait
    /// otherwise. Defaults to 100 ms.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
}

impl Default for QueueTimeConfig {
    fn default() -> Self {
        QueueTimeConfig {
            target: DEFAULT_QUEUE_TARGET,
            interval: DEFAULT_QUEUE_INTERVAL,
        }
    }
}

impl QueueTimeConfig {
    /// `target` must be shorter than `interval`, and neither zero.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.target.is_zero() || self.target >= self.interval {
            return Err(Invalid::new(
                "target",
                format!(
                    "{:?} must be above 0 and below interval ({:?})",
                    self.target, self.interval
                ),
            ));
        }
        Ok(())
    }
}

/// Rule 2, the controlled-delay queue (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueTime {
    cfg: QueueTimeConfig,
    /// The last instant the queue was seen empty.
    last_empty: Time,
}

impl QueueTime {
    /// A queue last empty at `now`.
    pub fn new(cfg: QueueTimeConfig, now: Time) -> Self {
        QueueTime {
            cfg,
            last_empty: now,
        }
    }

    /// The driver saw the queue empty at `now` (a request started at once, or the last
    /// waiting one left).
    pub fn empty_at(&mut self, now: Time) {
        self.last_empty = self.last_empty.max(now);
    }

    /// Whether the queue is standing at `now`: not empty for a whole interval.
    pub fn overloaded(&self, now: Time) -> bool {
        now.since(self.last_empty) > self.cfg.interval
    }

    /// The longest a request may have waited when it reaches the head at `now`.
    pub fn max_wait(&self, now: Time) -> Duration {
        if self.overloaded(now) {
            self.cfg.target
        } else {
            self.cfg.interval
        }
    }

    /// Whether to serve the newest waiting request first at `now` (adaptive LIFO).
    pub fn lifo(&self, now: Time) -> bool {
        self.overloaded(now)
    }

    /// Rules 1 and 2 for a request at the head at `now`, waiting since `enqueued`,
    /// whose caller waits until `deadline`, expected to take `expected`: a request that
    /// carries a deadline is bounded by it (rule 1, exact: it may wait as long as it can
    /// still finish in time), one without by the queue-time rule. Why not both: the
    /// controlled delay's 5 ms would also drop the backlog a pause leaves behind (a
    /// stop-the-world GC, a slow disk flush), whose callers are still waiting, and which
    /// the server would answer in time (`vigil sim`'s `gc-pauses` scenario: 0.28% of
    /// requests lost that way, none with the deadline rule); the deadline already says
    /// how long is too long. Under a standing queue the newest go first either way
    /// ([`lifo`](Self::lifo)).
    pub fn admit(
        &self,
        now: Time,
        enqueued: Time,
        deadline: Option<Time>,
        expected: Duration,
    ) -> Result<(), Refusal> {
        match deadline {
            Some(_) => check_deadline(now, deadline, expected),
            None => self.check(now, enqueued),
        }
    }

    /// The longest a request arriving at `now` may wait in the queue, by
    /// [`admit`](Self::admit)'s rules (zero: refuse it at once).
    pub fn wait_bound(&self, now: Time, deadline: Option<Time>, expected: Duration) -> Duration {
        match deadline {
            Some(d) => d.since(now).saturating_sub(expected),
            None => self.max_wait(now),
        }
    }

    /// Rule 2 alone for a request that reached the head at `now` after waiting since
    /// `enqueued`: start it, or refuse it.
    pub fn check(&self, now: Time, enqueued: Time) -> Result<(), Refusal> {
        if now.since(enqueued) > self.max_wait(now) {
            Err(Refusal::QueueTime)
        } else {
            Ok(())
        }
    }
}

/// [`ConcurrencyLimit`]'s settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConcurrencyLimitConfig {
    /// The limit at start. Defaults to 20.
    pub initial: u32,
    /// Never below. Defaults to 2.
    pub min: u32,
    /// Never above. Defaults to 1000.
    pub max: u32,
    /// A request slower than this counts as a sign of overload. Defaults to 1 s.
    #[serde(with = "humantime_serde")]
    pub latency_target: Duration,
    /// The factor of a cut (0.5-0.99). Defaults to 0.9.
    pub backoff: f64,
}

impl Default for ConcurrencyLimitConfig {
    fn default() -> Self {
        ConcurrencyLimitConfig {
            initial: 20,
            min: 2,
            max: 1000,
            latency_target: Duration::from_secs(1),
            backoff: DEFAULT_LIMIT_BACKOFF,
        }
    }
}

impl ConcurrencyLimitConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.min == 0 || self.min > self.max {
            return Err(Invalid::new(
                "min",
                format!(
                    "{} must be at least 1 and at most max ({})",
                    self.min, self.max
                ),
            ));
        }
        if !(self.min..=self.max).contains(&self.initial) {
            return Err(Invalid::new(
                "initial",
                format!(
                    "{} is not within min-max ({}-{})",
                    self.initial, self.min, self.max
                ),
            ));
        }
        if !(0.5..=0.99).contains(&self.backoff) {
            return Err(Invalid::new(
                "backoff",
                format!("{} is not within 0.5-0.99", self.backoff),
            ));
        }
        if self.latency_target.is_zero() {
            return Err(Invalid::new("latency_target", "must be above 0"));
        }
        Ok(())
    }
}

/// Rule 3, the AIMD concurrency limit (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct ConcurrencyLimit {
    cfg: ConcurrencyLimitConfig,
    limit: f64,
    last_cut: Option<Time>,
}

impl ConcurrencyLimit {
    /// The initial limit.
    pub fn new(cfg: ConcurrencyLimitConfig) -> Self {
        ConcurrencyLimit {
            limit: f64::from(cfg.initial),
            cfg,
            last_cut: None,
        }
    }

    /// The limit now: requests that may run at once.
    pub fn limit(&self) -> u32 {
        self.limit as u32
    }

    /// Whether a request may start now with `in_flight` already running.
    pub fn admits(&self, in_flight: u32) -> bool {
        in_flight < self.limit()
    }

    /// A request finished at `now` after `latency`, with `in_flight` requests running
    /// when it started (itself included); `overload` when it was refused downstream (a
    /// dependency's breaker, a 503). Returns true when the limit changed.
    pub fn on_sample(
        &mut self,
        now: Time,
        latency: Duration,
        in_flight: u32,
        overload: bool,
    ) -> bool {
        let before = self.limit();
        if overload || latency > self.cfg.latency_target {
            let due = self
                .last_cut
                .is_none_or(|t| now.since(t) >= self.cfg.latency_target);
            if due {
                self.limit = (self.limit * self.cfg.backoff).max(f64::from(self.cfg.min));
                self.last_cut = Some(now);
            }
        } else if f64::from(in_flight) * 2.0 >= self.limit {
            // Only a limit in use grows (an idle service proves nothing about more).
            self.limit = (self.limit + 1.0 / self.limit).min(f64::from(self.cfg.max));
        }
        self.limit() != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn deadline_headers_parse_strictly() {
        assert_eq!(
            parse_deadline_ms(b"1500"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_deadline_ms(b"0"), Some(Duration::ZERO));
        for bad in [
            &b""[..],
            b"-1",
            b" 5",
            b"5 ",
            b"1e3",
            b"0x10",
            b"999999999",
            b"1.5",
        ] {
            assert_eq!(
                parse_deadline_ms(bad),
                None,
                "{:?}",
                std::str::from_utf8(bad)
            );
        }
        assert_eq!(
            parse_grpc_timeout(b"100m"),
            Some(Duration::from_millis(100))
        );
        assert_eq!(parse_grpc_timeout(b"2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(
            parse_grpc_timeout(b"250000u"),
            Some(Duration::from_millis(250))
        );
        for bad in [&b"100"[..], b"m", b"123456789m", b"10x", b"-1S", b"99999H"] {
            assert_eq!(
                parse_grpc_timeout(bad),
                None,
                "{:?}",
                std::str::from_utf8(bad)
            );
        }
        assert_eq!(format_grpc_timeout(Duration::from_micros(1500)), "2m");
        assert_eq!(
            parse_grpc_timeout(format_grpc_timeout(Duration::from_secs(3)).as_bytes()),
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn the_deadline_rule() {
        let now = Time::from_secs(10);
        let ms = Duration::from_millis;
        assert_eq!(check_deadline(now, None, ms(50)), Ok(()));
        assert_eq!(
            check_deadline(now, Some(Time::from_secs(9)), ms(0)),
            Err(Refusal::Expired)
        );
        assert_eq!(check_deadline(now, Some(now), ms(0)), Err(Refusal::Expired));
        let soon = now + ms(30);
        assert_eq!(
            check_deadline(now, Some(soon), ms(50)),
            Err(Refusal::Unmeetable)
        );
        assert_eq!(check_deadline(now, Some(soon), ms(20)), Ok(()));
    }

    #[test]
    fn queue_time_tightens_on_a_standing_queue_and_turns_lifo() {
        let mut q = QueueTime::new(QueueTimeConfig::default(), Time::ZERO);
        let t = Time::from_millis(50);
        assert!(!q.overloaded(t));
        assert_eq!(q.max_wait(t), DEFAULT_QUEUE_INTERVAL);
        assert_eq!(
            q.check(t, Time::ZERO),
            Ok(()),
            "50 ms of wait, no standing queue"
        );
        let t = Time::from_millis(150);
        assert!(q.overloaded(t) && q.lifo(t));
        assert_eq!(q.check(t, Time::from_millis(140)), Err(Refusal::QueueTime));
        assert_eq!(q.check(t, Time::from_millis(146)), Ok(()));
        q.empty_at(Time::from_millis(149));
        assert!(!q.overloaded(t));
    }

    #[test]
    fn the_limit_grows_in_use_and_cuts_once_per_round() {
        let cfg = ConcurrencyLimitConfig::default();
        let mut l = ConcurrencyLimit::new(cfg);
        let ok = Duration::from_millis(100);
        // Idle: no growth.
        for i in 0..100 {
            l.on_sample(Time::from_millis(i), ok, 1, false);
        }
        assert_eq!(l.limit(), 20);
        // In use: about one per limit's worth of requests.
        for i in 0..200 {
            l.on_sample(Time::from_millis(i), ok, 15, false);
        }
        assert!((28..=30).contains(&l.limit()), "{}", l.limit());
        let before = l.limit;
        // A burst of slow answers cuts once...
        for i in 0..50 {
            l.on_sample(
                Time::from_secs(10) + Duration::from_millis(i),
                Duration::from_secs(2),
                20,
                false,
            );
        }
        assert_eq!(
            l.limit(),
            (before * 0.9) as u32,
            "one cut for the whole burst"
        );
        // ...and again a latency target later.
        assert!(l.on_sample(Time::from_secs(12), Duration::from_secs(2), 20, false));
        assert!(l.admits(l.limit() - 1) && !l.admits(l.limit()));
    }

    proptest! {
        /// The limit never leaves min-max, whatever the samples.
        #[test]
        fn the_limit_stays_in_bounds(
            samples in prop::collection::vec((0u64..5000, 0u32..100, any::<bool>()), 1..300),
        ) {
            let cfg = ConcurrencyLimitConfig { initial: 5, min: 2, max: 40, ..Default::default() };
            let mut l = ConcurrencyLimit::new(cfg);
            let mut now = Time::ZERO;
            for (ms, inflight, over) in samples {
                now = now + Duration::from_millis(ms / 10);
                l.on_sample(now, Duration::from_millis(ms), inflight, over);
                prop_assert!((2..=40).contains(&l.limit()));
            }
        }

        /// A request is never started past its deadline, nor after waiting past the
        /// queue-time rule's bound.
        #[test]
        fn a_refused_request_is_one_that_could_not_be_served(
            now_ms in 0u64..10_000, deadline_ms in 0u64..10_000, expected_ms in 0u64..500,
            empty_ms in 0u64..10_000, enq_back in 0u64..500,
        ) {
            let now = Time::from_millis(now_ms);
            let d = Time::from_millis(deadline_ms);
            if check_deadline(now, Some(d), Duration::from_millis(expected_ms)).is_ok() {
                prop_assert!(d > now && d.since(now) >= Duration::from_millis(expected_ms));
            }
            let mut q = QueueTime::new(QueueTimeConfig::default(), Time::ZERO);
            q.empty_at(Time::from_millis(empty_ms.min(now_ms)));
            let enq = Time::from_millis(now_ms.saturating_sub(enq_back));
            if q.check(now, enq).is_ok() {
                prop_assert!(now.since(enq) <= DEFAULT_QUEUE_INTERVAL);
                if q.overloaded(now) { prop_assert!(now.since(enq) <= DEFAULT_QUEUE_TARGET); }
            }
        }
    }
}
