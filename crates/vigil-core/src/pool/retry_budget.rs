//! May this request be retried (or hedged) without amplifying an outage: [`RetryBudget`]
//! (based on Finagle's `RetryBudget` / linkerd's retry budget).

use crate::invalid::Invalid;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Default retry ratio: retries may add 20% to the load (linkerd's default), so retries
/// never more than 1.2x an outage's load on the survivors.
pub const DEFAULT_RETRY_RATIO: f64 = 0.2;
/// Default floor: 10 retries per second whatever the traffic (Finagle's and linkerd's
/// `min_retries_per_second`), so a quiet pool can still retry its rare failures.
pub const DEFAULT_MIN_RETRIES_PER_SECOND: u32 = 10;
/// Default window over which requests and retries are counted: 10 s (Finagle's `ttl`).
pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(10);

/// Retry budget settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryBudgetConfig {
    /// Retries allowed per original request over the window (0 to 1, or more to allow
    /// more than one retry per request). Defaults to 0.2.
    pub ratio: f64,
    /// Retries allowed per second regardless of traffic. Defaults to 10.
    pub min_retries_per_second: u32,
    /// Window over which requests and retries are counted. Defaults to 10s.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        RetryBudgetConfig {
            ratio: DEFAULT_RETRY_RATIO,
            min_retries_per_second: DEFAULT_MIN_RETRIES_PER_SECOND,
            window: DEFAULT_RETRY_WINDOW,
        }
    }
}

impl RetryBudgetConfig {
    /// Checks the values; the error names the bad key.
    pub fn validate(&self) -> Result<(), Invalid> {
        if !self.ratio.is_finite() || self.ratio < 0.0 {
            return Err(Invalid::new(
                "ratio",
                format!("must be 0 or more, got {}", self.ratio),
            ));
        }
        if self.window < Duration::from_millis(100) {
            return Err(Invalid::new("window", "must be at least 100ms"));
        }
        Ok(())
    }
}

pub(super) const BUCKETS: usize = 10;

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Bucket {
    pub(super) epoch: u64,
    pub(super) requests: u64,
    pub(super) retries: u64,
}

/// A retry budget (based on Finagle's `RetryBudget` and linkerd's): over the last
/// `window`, retries (and hedged requests) may number at most
/// `min_retries_per_second x window + ratio x requests`. Deposit once per original
/// request ([`RetryBudget::deposit`]), withdraw once per retry
/// ([`RetryBudget::try_withdraw`], which says whether it may go). Counts are kept in 10
/// buckets of `window / 10`, so old traffic ages out smoothly.
#[derive(Clone, Debug)]
pub struct RetryBudget {
    pub(super) config: RetryBudgetConfig,
    pub(super) bucket_len: Duration,
    pub(super) buckets: [Bucket; BUCKETS],
}

impl RetryBudget {
    /// An empty budget (only the floor is available).
    pub fn new(config: RetryBudgetConfig) -> Self {
        RetryBudget {
            bucket_len: (config.window / BUCKETS as u32).max(Duration::from_millis(1)),
            config,
            buckets: [Bucket::default(); BUCKETS],
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RetryBudgetConfig {
        &self.config
    }

    pub(super) fn epoch(&self, now: Time) -> u64 {
        (now.as_elapsed().as_nanos() / self.bucket_len.as_nanos()) as u64
    }

    pub(super) fn bucket(&mut self, now: Time) -> &mut Bucket {
        let e = self.epoch(now);
        let b = &mut self.buckets[(e % BUCKETS as u64) as usize];
        if b.epoch != e {
            *b = Bucket {
                epoch: e,
                ..Default::default()
            };
        }
        b
    }

    pub(super) fn totals(&self, now: Time) -> (u64, u64) {
        let e = self.epoch(now);
        self.buckets
            .iter()
            .filter(|b| b.epoch + (BUCKETS as u64) > e && b.epoch <= e)
            .fold((0, 0), |(q, r), b| (q + b.requests, r + b.retries))
    }

    /// Records an original request (not a retry).
    pub fn deposit(&mut self, now: Time) {
        self.bucket(now).requests += 1;
    }

    /// Retries still allowed now.
    pub fn available(&self, now: Time) -> u64 {
        let (requests, retries) = self.totals(now);
        let allowed = f64::from(self.config.min_retries_per_second)
            * self.config.window.as_secs_f64()
            + self.config.ratio * requests as f64;
        (allowed.floor() as u64).saturating_sub(retries)
    }

    /// Takes one retry from the budget if one is available; false means: do not retry.
    pub fn try_withdraw(&mut self, now: Time) -> bool {
        if self.available(now) == 0 {
            return false;
        }
        self.bucket(now).retries += 1;
        true
    }

    /// Records `n` original requests at once: the same as `n` calls of
    /// [`RetryBudget::deposit`] at `now` (for drivers that aggregate requests per tick,
    /// such as the simulator).
    pub fn deposit_many(&mut self, now: Time, n: u64) {
        self.bucket(now).requests += n;
    }

    /// Takes up to `n` retries from the budget at once and returns how many may go: the
    /// same as counting the successes of `n` calls of [`RetryBudget::try_withdraw`] at
    /// `now`.
    pub fn withdraw_up_to(&mut self, now: Time, n: u64) -> u64 {
        let granted = self.available(now).min(n);
        self.bucket(now).retries += granted;
        granted
    }
}
