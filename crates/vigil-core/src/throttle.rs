//! Retries that stop when they cannot help, and local shedding when the targets refuse
//! most work: the two adaptive throttles a balancer (or any client) keeps per pool.
//!
//! The retry *budget* ([`RetryBudget`](crate::pool::RetryBudget)) bounds retries to a
//! share of requests (20% by default). That is not enough when every attempt fails:
//! clients that retry too multiply the budget's share, and a fleet in overload gets a
//! fifth more work exactly when it can do none (the metastable retry storm, Bronson et
//! al., "Metastable Failures in Distributed Systems", HotOS 2021). Two mechanisms from
//! production systems close that loop; both are pure state machines with time passed in.
//!
//! # [`RetryThrottle`]: gRPC's retry throttling (gRFC A6)
//!
//! A token bucket per pool, counted in thousandths of a token so that it is exact:
//! it starts full at `max_tokens`; every failed attempt takes one token, every success
//! gives back `token_ratio`; a retry (or hedge) may go only while the bucket holds more
//! than half of `max_tokens`. With gRPC's defaults (10 tokens, ratio 0.1) retries stop
//! once more than about 1 attempt in 11 fails for a while (0.1 x 10 successes pay for one
//! failure), and come back as soon as successes refill the bucket; a lone failing target
//! among twenty (5% of attempts) never empties it. Chosen over the SRE book's rule for
//! retries because it is deterministic (no random draw decides a retry), has one
//! parameter that means something (the failure share it tolerates) and is what gRPC
//! clients do, so operators know it. `vigil sim` shows why it is needed on top of the
//! budget (`scenarios/slow-dependency-retries.toml`).
//!
//! # [`AdaptiveThrottle`]: client-side adaptive throttling (Google SRE book, ch. 21)
//!
//! Over a sliding window (two minutes in the book), count `requests` (attempts made)
//! and `accepts` (attempts the targets took: any answer other than an overload refusal
//! or a timeout). Reject a new attempt locally with probability
//! `max(0, (requests - K x accepts) / (requests + 1))`, `K = 2`: while the targets take
//! at least half of what is sent, nothing is shed; when they take almost nothing, the
//! balancer forwards about `K x accepts` and answers the rest itself at once (a fast 503)
//! instead of queueing work the fleet cannot do. Rejected attempts count as requests, so
//! the throttle keeps probing: the forwarded share follows what the targets accept.
//! The caller draws the random number (`u` in `0..1`), as everywhere in vigil-core.
//!
//! Neither throttle decides eligibility (that is [`retry::decide`](crate::retry::decide))
//! nor ejects anyone: a target's failures are the pool's business; these only bound the
//! load the balancer adds.

use crate::Invalid;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Duration;

/// Default bucket size: 10 tokens, gRPC's usual `maxTokens` (gRFC A6's example).
pub const DEFAULT_MAX_TOKENS: u32 = 10;
/// Default refill per success: 0.1 token, gRPC's usual `tokenRatio`: retries stop once
/// more than about 9% of attempts fail (one failure costs what ten successes give).
pub const DEFAULT_TOKEN_RATIO: f64 = 0.1;
/// Default SRE multiplier `K`: forward up to twice what the targets accept (the book's
/// value: it wastes some work on refusals but reacts quickly when they recover).
pub const DEFAULT_THROTTLE_K: f64 = 2.0;
/// Default window of the adaptive throttle: 2 minutes, the book's value; long enough
/// that a short burst of failures sheds nothing, short enough to follow a recovery.
pub const DEFAULT_THROTTLE_WINDOW: Duration = Duration::from_secs(120);
/// Slots of the adaptive throttle's sliding window.
const SLOTS: u32 = 24;

/// [`RetryThrottle`]'s settings (`retries.throttle` in lb.toml).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryThrottleConfig {
    /// Tokens the bucket holds (1-1000); retries go while it holds more than half.
    /// Defaults to 10.
    pub max_tokens: u32,
    /// Tokens a success gives back (0.001-1). Defaults to 0.1.
    pub token_ratio: f64,
}

impl Default for RetryThrottleConfig {
    fn default() -> Self {
        RetryThrottleConfig {
            max_tokens: DEFAULT_MAX_TOKENS,
            token_ratio: DEFAULT_TOKEN_RATIO,
        }
    }
}

impl RetryThrottleConfig {
    /// Checks the ranges (gRFC A6's: `max_tokens` 1-1000, `token_ratio` above 0 with
    /// three decimals).
    pub fn validate(&self) -> Result<(), Invalid> {
        if !(1..=1000).contains(&self.max_tokens) {
            return Err(Invalid::new(
                "max_tokens",
                format!("{} is not within 1-1000", self.max_tokens),
            ));
        }
        if !(self.token_ratio >= 0.001 && self.token_ratio <= 1.0) {
            return Err(Invalid::new(
                "token_ratio",
                format!("{} is not within 0.001-1", self.token_ratio),
            ));
        }
        Ok(())
    }
}

/// gRPC-style retry throttling (see the module doc): failures drain a bucket, successes
/// refill it, and retries go only while it is more than half full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryThrottle {
    /// Thousandths of a token.
    tokens: u64,
    max: u64,
    ratio: u64,
}

impl RetryThrottle {
    /// A full bucket.
    pub fn new(cfg: RetryThrottleConfig) -> Self {
        let max = u64::from(cfg.max_tokens) * 1000;
        RetryThrottle {
            tokens: max,
            max,
            ratio: ((cfg.token_ratio * 1000.0).round() as u64).max(1),
        }
    }

    /// Records `ok` successful and `failed` failed attempts (retries included: each
    /// attempt counts once, as it ends).
    pub fn record(&mut self, ok: u64, failed: u64) {
        self.tokens = self.tokens.saturating_sub(failed.saturating_mul(1000));
        self.tokens = self
            .tokens
            .saturating_add(ok.saturating_mul(self.ratio))
            .min(self.max);
    }

    /// Whether a retry may go now: the bucket holds more than half its tokens.
    pub fn allows(&self) -> bool {
        self.tokens * 2 > self.max
    }

    /// `failed` attempts end one after another, each asking for a retry: records them
    /// and returns how many of the retries may go (those asked while the bucket was
    /// still above half, the failure that asked already counted). This is the exact
    /// outcome of calling `record(0, 1)` then `allows()` `failed` times, in closed form.
    pub fn fail_and_grant(&mut self, failed: u64) -> u64 {
        // After the i-th failure (1-based) the bucket holds tokens - 1000 i, and the
        // retry goes while 2 (tokens - 1000 i) > max, that is while 2000 i < d with
        // d = 2 tokens - max: for i = 1 ..= (d - 1) / 2000.
        let d = (self.tokens * 2).saturating_sub(self.max);
        let granted = d.saturating_sub(1) / 2000;
        self.record(0, failed);
        granted.min(failed)
    }

    /// Tokens in the bucket (for metrics).
    pub fn tokens(&self) -> f64 {
        self.tokens as f64 / 1000.0
    }
}

/// [`AdaptiveThrottle`]'s settings (`throttle` in an lb pool).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdaptiveThrottleConfig {
    /// Forward up to `k` times what the targets accept (at least 1.1; 2 is the book's).
    /// Defaults to 2.
    pub k: f64,
    /// The sliding window requests and accepts are counted over. Defaults to 2 minutes.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

impl Default for AdaptiveThrottleConfig {
    fn default() -> Self {
        AdaptiveThrottleConfig {
            k: DEFAULT_THROTTLE_K,
            window: DEFAULT_THROTTLE_WINDOW,
        }
    }
}

impl AdaptiveThrottleConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), Invalid> {
        if !(self.k >= 1.1 && self.k <= 100.0) {
            return Err(Invalid::new(
                "k",
                format!(
                    "{} is not within 1.1-100 (below that it sheds healthy load)",
                    self.k
                ),
            ));
        }
        if self.window < Duration::from_secs(1) {
            return Err(Invalid::new(
                "window",
                format!("{:?} is shorter than 1s", self.window),
            ));
        }
        Ok(())
    }
}

/// The SRE book's client-side adaptive throttling (see the module doc).
#[derive(Debug, Clone)]
pub struct AdaptiveThrottle {
    k: f64,
    slot: Duration,
    /// (slot start, requests, accepts), oldest first.
    slots: VecDeque<(Time, u64, u64)>,
    requests: u64,
    accepts: u64,
}

impl AdaptiveThrottle {
    /// An empty window.
    pub fn new(cfg: AdaptiveThrottleConfig) -> Self {
        AdaptiveThrottle {
            k: cfg.k,
            slot: (cfg.window / SLOTS).max(Duration::from_millis(1)),
            slots: VecDeque::with_capacity(SLOTS as usize + 1),
            requests: 0,
            accepts: 0,
        }
    }

    fn advance(&mut self, now: Time) {
        let span = self.slot * SLOTS;
        while let Some(&(start, r, a)) = self.slots.front() {
            if now.since(start) < span {
                break;
            }
            self.requests -= r;
            self.accepts -= a;
            self.slots.pop_front();
        }
        let fresh = self
            .slots
            .back()
            .is_none_or(|&(start, _, _)| now.since(start) >= self.slot);
        if fresh {
            self.slots.push_back((now, 0, 0));
        }
    }

    /// The probability with which a new attempt is rejected locally now.
    pub fn reject_probability(&mut self, now: Time) -> f64 {
        self.advance(now);
        let r = self.requests as f64;
        ((r - self.k * self.accepts as f64) / (r + 1.0)).max(0.0)
    }

    /// Whether to reject an attempt now, given a uniform draw `u` in `0..1`; a rejected
    /// attempt is counted as a request (so the throttle keeps measuring).
    pub fn should_reject(&mut self, now: Time, u: f64) -> bool {
        let reject = u < self.reject_probability(now);
        if reject {
            self.record(now, 1, 0);
        }
        reject
    }

    /// Records attempts that went to a target: `requests` of them, `accepts` taken (an
    /// answer other than an overload refusal, 503 or 429, or a timeout).
    pub fn record(&mut self, now: Time, requests: u64, accepts: u64) {
        self.advance(now);
        let slot = self.slots.back_mut().expect("advance pushes a slot");
        slot.1 += requests;
        slot.2 += accepts;
        self.requests += requests;
        self.accepts += accepts;
    }

    /// Requests and accepts in the window (for metrics).
    pub fn counts(&self) -> (u64, u64) {
        (self.requests, self.accepts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn retries_stop_when_most_attempts_fail_and_come_back() {
        let mut t = RetryThrottle::new(RetryThrottleConfig::default());
        assert!(t.allows());
        // Five failures take 10 tokens to 5: no longer above half.
        assert_eq!(
            t.fail_and_grant(5),
            4,
            "the fifth failure leaves exactly half"
        );
        assert!(!t.allows());
        assert_eq!(t.fail_and_grant(100), 0);
        assert_eq!(t.tokens(), 0.0);
        // 51 successes give 5.1 tokens: above half again.
        t.record(50, 0);
        assert!(!t.allows());
        t.record(1, 0);
        assert!(t.allows());
    }

    #[test]
    fn a_lone_gray_target_never_stops_retries() {
        // One target of twenty failing every attempt: 5% of attempts fail.
        let mut t = RetryThrottle::new(RetryThrottleConfig::default());
        let mut granted = 0;
        for _ in 0..1000 {
            t.record(19, 0);
            granted += t.fail_and_grant(1);
        }
        assert_eq!(granted, 1000);
    }

    #[test]
    fn config_ranges() {
        let bad = RetryThrottleConfig {
            max_tokens: 0,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().key, "max_tokens");
        let bad = RetryThrottleConfig {
            token_ratio: 0.0,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().key, "token_ratio");
        assert!(RetryThrottleConfig::default().validate().is_ok());
        let bad = AdaptiveThrottleConfig {
            k: 1.0,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().key, "k");
    }

    #[test]
    fn the_throttle_sheds_nothing_while_targets_accept_half() {
        let mut a = AdaptiveThrottle::new(AdaptiveThrottleConfig::default());
        let now = Time::from_secs(10);
        a.record(now, 1000, 500);
        assert_eq!(a.reject_probability(now), 0.0);
        a.record(now, 1000, 0);
        // 2000 requests, 500 accepts: (2000 - 1000) / 2001.
        assert!((a.reject_probability(now) - 1000.0 / 2001.0).abs() < 1e-9);
    }

    #[test]
    fn the_window_forgets() {
        let mut a = AdaptiveThrottle::new(AdaptiveThrottleConfig::default());
        a.record(Time::from_secs(0), 1000, 0);
        assert!(a.reject_probability(Time::from_secs(1)) > 0.99);
        assert!(a.reject_probability(Time::from_secs(60)) > 0.99);
        assert_eq!(a.reject_probability(Time::from_secs(121)), 0.0);
        assert_eq!(a.counts(), (0, 0));
    }

    proptest! {
        /// Whatever the order of successes and failures, the retries granted never
        /// exceed what the bucket allows: each is asked after its failure, while the
        /// bucket holds more than half; and the closed form agrees with one at a time.
        #[test]
        fn never_more_retries_than_the_bucket_allows(
            steps in prop::collection::vec((0u64..40, 0u64..40), 1..60),
            max_tokens in 1u32..50, ratio_milli in 1u32..1000,
        ) {
            let cfg = RetryThrottleConfig { max_tokens, token_ratio: f64::from(ratio_milli) / 1000.0 };
            let mut batch = RetryThrottle::new(cfg);
            let mut single = RetryThrottle::new(cfg);
            let (mut oks, mut granted) = (0u64, 0u64);
            for (ok, failed) in steps {
                batch.record(ok, 0);
                single.record(ok, 0);
                oks += ok;
                let g = batch.fail_and_grant(failed);
                let mut g1 = 0;
                for _ in 0..failed {
                    single.record(0, 1);
                    if single.allows() { g1 += 1; }
                }
                prop_assert_eq!(g, g1);
                prop_assert_eq!(&batch, &single);
                granted += g;
                prop_assert!(batch.tokens() <= f64::from(max_tokens));
            }
            // Each granted retry followed a failure that left the bucket above half: the
            // bucket can go from full to half only once plus what successes refill.
            let refill = oks * u64::from(ratio_milli);
            let cap = (u64::from(max_tokens) * 1000 / 2 + refill) / 1000 + 1;
            prop_assert!(granted <= cap, "{} granted, cap {}", granted, cap);
        }

        /// The adaptive throttle never rejects while accepts keep up with requests / K,
        /// and its probability is always within 0..1.
        #[test]
        fn adaptive_probability_is_bounded(
            steps in prop::collection::vec((0u64..100, 0u64..100, 0u64..30), 1..50),
        ) {
            let mut a = AdaptiveThrottle::new(AdaptiveThrottleConfig::default());
            let mut now = Time::ZERO;
            for (req, acc, dt) in steps {
                now = now + Duration::from_secs(dt);
                a.record(now, req, acc.min(req));
                let p = a.reject_probability(now);
                prop_assert!((0.0..1.0).contains(&p));
                let (r, ac) = a.counts();
                if (r as f64) <= 2.0 * ac as f64 { prop_assert_eq!(p, 0.0); }
            }
        }
    }
}
