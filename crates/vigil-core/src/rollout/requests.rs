//! The request-weighted verdict: the balancer's own counts of what clients got from each
//! host, compared between the new and the old revision by a sequential test.
//!
//! Why not the host-reported samples' medians: a host's sample is its error rate over
//! an interval, and a just-returned host gets little traffic (the balancer's slow start),
//! so most of its intervals see a handful of requests and no error. The median of such
//! samples is 0 while the new hosts are plainly worse (issue 37: 5% errors on POSTs,
//! p = 9.5e-8 by their counts, passed a 15 s bake). Here a revision is judged by
//! `sum of errors / sum of requests` over its hosts, every request one trial, so a host
//! weighs what it served, never one vote per host.
//!
//! # The test
//!
//! Wald's sequential probability ratio test (SPRT) on the new hosts' requests, each a
//! Bernoulli trial (error or not):
//!
//! - H0: the new hosts' error rate is the old hosts' `p0`;
//! - H1: it is `p1 = p0 + min_effect` (the smallest worsening worth a rollback).
//!
//! The log-likelihood ratio of `e` errors in `n` requests is
//! `e ln(p1/p0) + (n - e) ln((1 - p1)/(1 - p0))`. It **fails** once it reaches
//! `ln((1 - beta)/alpha)`, **passes** once it falls to `ln(beta/(1 - alpha))`, and is
//! **inconclusive** in between, with the number of further requests that would, at the
//! old rate, bring it down to the pass boundary (`needs`). Wald's bounds hold at every
//! look, so the driver may judge as often as it likes: a fail is acted on as soon as it
//! is reached (during the bake), a pass only once the bake is over.
//!
//! `p0` is not known, only estimated from the old hosts' requests of the same window,
//! and the estimate's doubt counts against each decision: the fail boundary is tested
//! with `p0` at the old rate's upper Wilson bound (at `1 - alpha`), so an old side that
//! happened to see no error in a few hundred requests does not make three errors on the
//! new side damning; the pass boundary with `p0 = (errors + 0.5) / (requests + 1)` (an
//! old side with no error is a small rate, not 0). In the simulation of issue 37's fleet
//! below (tests), with 0.2% errors on both revisions, testing both boundaries at the
//! point estimate failed a good rollout of 6 waves in 1 of 15 seeds; this way in none.
//!
//! Without an old side to compare with (the last wave, or a one-host fleet), the new
//! hosts are held to the fixed limit `max_error_rate` by a Wilson score interval at
//! `1 - alpha`: fail when its lower bound is above the limit, pass when its upper bound
//! is below it ([`FixedLimit`]).
//!
//! Latency is not judged here (the balancer's stats carry none per target yet).

use crate::stats::normal_quantile;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The smallest `p1 - p0` the test uses when `min_effect` is 0 (H1 must differ from H0).
pub const MIN_DELTA: f64 = 1e-4;
/// Requests the new hosts must have served before the fixed limit fails them: a fresh
/// host's first few answers decide nothing (one 500 in one request is a Wilson lower
/// bound of 27%).
pub const MIN_LIMIT_REQUESTS: u64 = 50;
/// Cap on the requests a verdict says it needs (a revision at or above H1's rate never
/// passes: it fails instead, but the figure must stay printable).
pub const MAX_NEEDS: u64 = 1_000_000_000;

/// Requests and errors (5xx) of one host or one side, as the balancer counted them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCounts {
    /// Requests answered.
    pub requests: u64,
    /// Of which errors (5xx, the target's).
    pub errors: u64,
}

impl RequestCounts {
    /// `requests` answered, `errors` of them errors (capped at `requests`).
    pub fn new(requests: u64, errors: u64) -> Self {
        RequestCounts {
            requests,
            errors: errors.min(requests),
        }
    }

    /// The error rate (0 without a request).
    pub fn rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.errors as f64 / self.requests as f64
        }
    }

    /// Both counts added.
    pub fn plus(self, o: RequestCounts) -> RequestCounts {
        RequestCounts::new(self.requests + o.requests, self.errors + o.errors)
    }
}

impl fmt::Display for RequestCounts {
    /// `12 errors / 480 requests (2.50%)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} errors / {} requests ({:.2}%)",
            self.errors,
            self.requests,
            self.rate() * 100.0
        )
    }
}

/// What a request test concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// The new hosts are worse: roll back.
    Fail,
    /// The new hosts are not worse by the effect that matters: proceed.
    Pass,
    /// Not yet: about `needs` more requests on the new hosts decide it.
    Inconclusive {
        /// More requests on the new hosts.
        needs: u64,
    },
}

/// The SPRT of the new hosts' errors against the old hosts' rate (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ErrorSprt {
    /// Chance of failing a revision as good as the old one.
    pub alpha: f64,
    /// Chance of passing a revision worse by `min_effect`.
    pub beta: f64,
    /// The worsening (difference of error rates) H1 stands for.
    pub min_effect: f64,
}

/// An [`ErrorSprt`]'s numbers, for the decision's explanation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SprtResult {
    /// What it concluded.
    pub decision: Decision,
    /// The new hosts' counts.
    pub new: RequestCounts,
    /// The old hosts' counts (the baseline).
    pub old: RequestCounts,
    /// H0's error rate (the old side's, smoothed).
    pub p0: f64,
    /// H1's error rate.
    pub p1: f64,
    /// The log-likelihood ratio of H1 over H0.
    pub llr: f64,
    /// It fails at or above this.
    pub fail_at: f64,
    /// It passes at or below this.
    pub pass_at: f64,
}

impl ErrorSprt {
    /// The log-likelihood ratio of `new` for H0 `p0` (and H1 `p0 + min_effect`), with
    /// H1, and the steps of one error and of one success.
    fn llr(&self, new: RequestCounts, p0: f64) -> (f64, f64, f64, f64) {
        let p0 = p0.clamp(1e-9, 1.0 - 2e-9);
        let p1 = (p0 + self.min_effect.max(MIN_DELTA)).min(1.0 - 1e-9);
        let (up, down) = ((p1 / p0).ln(), ((1.0 - p1) / (1.0 - p0)).ln());
        let (e, n) = (new.errors as f64, new.requests as f64);
        (e * up + (n - e) * down, p1, up, down)
    }

    /// Tests `new` against the baseline `old`.
    pub fn test(&self, new: RequestCounts, old: RequestCounts) -> SprtResult {
        let fail_at = ((1.0 - self.beta) / self.alpha).ln();
        let pass_at = (self.beta / (1.0 - self.alpha)).ln();
        // Fail: against the highest old rate the old counts make plausible.
        let p0_high = wilson(old, normal_quantile(1.0 - self.alpha)).1;
        let (llr_fail, _, _, _) = self.llr(new, p0_high);
        // Pass (and needs): against the old rate as estimated.
        let p0 = (old.errors as f64 + 0.5) / (old.requests as f64 + 1.0);
        let (llr_pass, p1, up, down) = self.llr(new, p0);
        let (decision, llr) = if llr_fail >= fail_at {
            (Decision::Fail, llr_fail)
        } else {
            (self.pass_or_wait(llr_pass, pass_at, p0, up, down), llr_pass)
        };
        SprtResult {
            decision,
            new,
            old,
            p0: if decision == Decision::Fail {
                p0_high
            } else {
                p0
            },
            p1: if decision == Decision::Fail {
                (p0_high + self.min_effect.max(MIN_DELTA)).min(1.0)
            } else {
                p1
            },
            llr,
            fail_at,
            pass_at,
        }
    }

    fn pass_or_wait(&self, llr: f64, pass_at: f64, p0: f64, up: f64, down: f64) -> Decision {
        if llr <= pass_at {
            Decision::Pass
        } else {
            // The expected step per request at the old rate (negative: H0 pulls down).
            let drift = p0 * up + (1.0 - p0) * down;
            let needs = ((llr - pass_at) / -drift).ceil();
            Decision::Inconclusive {
                needs: if needs.is_finite() {
                    (needs as u64).clamp(1, MAX_NEEDS)
                } else {
                    MAX_NEEDS
                },
            }
        }
    }
}

impl fmt::Display for SprtResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "new hosts {} vs old {}, by the balancer's counts; SPRT log-LR {:.2} (fails at {:.2}, passes at {:.2}; H0 error rate {:.4}, H1 {:.4})",
            self.new, self.old, self.llr, self.fail_at, self.pass_at, self.p0, self.p1
        )
    }
}

/// The new hosts' error rate against a fixed limit, by a Wilson score interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FixedLimit {
    /// The limit (0..1).
    pub limit: f64,
    /// One-sided confidence of the bounds is `1 - alpha`.
    pub alpha: f64,
}

impl FixedLimit {
    /// The decision on `new`, with the interval's bounds.
    pub fn test(&self, new: RequestCounts) -> (Decision, f64, f64) {
        let z = normal_quantile(1.0 - self.alpha);
        let (lo, hi) = wilson(new, z);
        let decision = if new.requests >= MIN_LIMIT_REQUESTS && lo > self.limit {
            Decision::Fail
        } else if new.requests > 0 && hi < self.limit {
            Decision::Pass
        } else {
            Decision::Inconclusive {
                needs: self.needs(new, z),
            }
        };
        (decision, lo, hi)
    }

    /// The smallest number of further requests, at the observed rate (at least half an
    /// error's worth), after which the upper bound is below the limit.
    fn needs(&self, new: RequestCounts, z: f64) -> u64 {
        let rate = if new.requests == 0 { 0.0 } else { new.rate() };
        if rate >= self.limit {
            return MAX_NEEDS;
        }
        let below = |n: u64| {
            let total = new.requests + n;
            let errors = (rate * total as f64).round() as u64;
            wilson(RequestCounts::new(total, errors), z).1 < self.limit
        };
        let mut hi = 1u64;
        while !below(hi) {
            if hi >= MAX_NEEDS {
                return MAX_NEEDS;
            }
            hi *= 2;
        }
        let mut lo = hi / 2;
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if below(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }
}

/// The Wilson score interval of `c`'s error rate at `z`.
pub fn wilson(c: RequestCounts, z: f64) -> (f64, f64) {
    if c.requests == 0 {
        return (0.0, 1.0);
    }
    let n = c.requests as f64;
    let p = c.rate();
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

#[cfg(test)]
mod tests;
