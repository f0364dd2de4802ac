//! Latency as a distribution: the worker time of a request, lognormal from its median
//! and its 99th percentile, and the chance that an answer comes too late.
//!
//! Why lognormal: service times are products of many small delays (cache misses, lock
//! waits, I/O), which makes their logarithm roughly normal; a lognormal is fixed by two
//! numbers an operator knows (the median and the p99 of a dashboard) and has the long
//! right tail that makes timeouts happen before the median moves. A median equal to the
//! p99 gives the degenerate distribution (every request takes the median), which is the
//! model of scenarios that say nothing about tails.
//!
//! The simulator aggregates requests per tick, so it never samples one request's time:
//! it asks for the mean (which sets a server's capacity, workers / mean) and for the
//! survival function (the share of answers slower than a deadline), both in closed form.
//! [`ServiceTime::sample`] exists for tests that check the closed forms against draws.

use crate::rng::SimRng;
use std::time::Duration;
use vigil_core::stats::normal_quantile;

/// The standard normal quantile of 0.99.
const Z99: f64 = 2.326_347_874_040_841;

/// A request's worker time: lognormal with the given median and p99 (in seconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServiceTime {
    median: f64,
    /// ln(median).
    mu: f64,
    /// Standard deviation of ln(time); 0 when the median is the p99.
    sigma: f64,
}

impl ServiceTime {
    /// The distribution with this median and 99th percentile (`p99 >= median`).
    pub fn new(median: Duration, p99: Duration) -> Self {
        let m = median.as_secs_f64().max(1e-9);
        let q = p99.as_secs_f64().max(m);
        ServiceTime {
            median: m,
            mu: m.ln(),
            sigma: (q / m).ln() / Z99,
        }
    }

    /// The median, seconds.
    pub fn median(&self) -> f64 {
        self.median
    }

    /// True when every request takes the median.
    pub fn is_constant(&self) -> bool {
        self.sigma == 0.0
    }

    /// The mean, seconds: `median x exp(sigma^2 / 2)`.
    pub fn mean(&self) -> f64 {
        self.median * (self.sigma * self.sigma / 2.0).exp()
    }

    /// The share of requests whose worker time exceeds `x` seconds: `P(S > x)`.
    pub fn survival(&self, x: f64) -> f64 {
        if x <= 0.0 {
            return 1.0;
        }
        if self.sigma == 0.0 {
            return if x < self.median { 1.0 } else { 0.0 };
        }
        0.5 * erfc((x.ln() - self.mu) / (self.sigma * std::f64::consts::SQRT_2))
    }

    /// The expected excess over `k` seconds, `E[(S - k)+]` (for a lognormal, the Black-Scholes
    /// call formula): the integral of [`ServiceTime::survival`] from `k` to infinity.
    pub fn excess(&self, k: f64) -> f64 {
        if k <= 0.0 {
            return self.mean() - k;
        }
        if self.sigma == 0.0 {
            return (self.median - k).max(0.0);
        }
        let d1 = (self.mu + self.sigma * self.sigma - k.ln()) / self.sigma;
        let d2 = d1 - self.sigma;
        self.mean() * normal_cdf(d1) - k * normal_cdf(d2)
    }

    /// The `q`-quantile, seconds (`0 < q < 1`).
    pub fn quantile(&self, q: f64) -> f64 {
        (self.mu + self.sigma * normal_quantile(q)).exp()
    }

    /// One request's worker time, seconds.
    pub fn sample(&self, rng: &mut SimRng) -> f64 {
        (self.mu + self.sigma * rng.normal()).exp()
    }
}

/// Most terms of a [`Mixture`]: each dependency slowed by a fault doubles them (the
/// requests that call it and those that do not); past four, further ones only add
/// their mean.
const MAX_TERMS: usize = 16;

/// The worker time of a server's requests right now: a mix of the base distribution
/// shifted by fixed delays (a slow host, slow dependencies for the requests that call
/// them), as `(share, shift in seconds)` terms.
#[derive(Clone, Copy, Debug)]
pub struct Mixture {
    base: ServiceTime,
    len: usize,
    terms: [(f64, f64); MAX_TERMS],
}

impl Mixture {
    /// Every request takes `base` plus `shift` seconds.
    pub fn new(base: ServiceTime, shift: f64) -> Self {
        let mut terms = [(0.0, 0.0); MAX_TERMS];
        terms[0] = (1.0, shift);
        Mixture {
            base,
            len: 1,
            terms,
        }
    }

    /// A `share` of the requests (chosen independently of earlier splits) takes `extra`
    /// seconds more.
    pub fn split(&mut self, share: f64, extra: f64) {
        if share <= 0.0 || extra <= 0.0 {
            return;
        }
        if share >= 1.0 || self.len * 2 > MAX_TERMS {
            let add = share.min(1.0) * extra;
            for t in &mut self.terms[..self.len] {
                t.1 += add;
            }
            return;
        }
        for k in 0..self.len {
            let (p, s) = self.terms[k];
            self.terms[k] = (p * (1.0 - share), s);
            self.terms[self.len + k] = (p * share, s + extra);
        }
        self.len *= 2;
    }

    /// True when every request takes the base distribution, unshifted.
    pub fn is_base(&self) -> bool {
        self.len == 1 && self.terms[0].1 == 0.0
    }

    /// The mean worker time, seconds.
    pub fn mean(&self) -> f64 {
        self.base.mean()
            + self.terms[..self.len]
                .iter()
                .map(|(p, s)| p * s)
                .sum::<f64>()
    }

    /// The share of requests that waited `wait` seconds and are not answered within
    /// `deadline` seconds of their arrival.
    pub fn late(&self, wait: f64, deadline: f64) -> f64 {
        self.terms[..self.len]
            .iter()
            .map(|(p, s)| p * self.base.survival(deadline - wait - s))
            .sum::<f64>()
            .clamp(0.0, 1.0)
    }

    /// The share of requests not answered within `deadline` when their waits spread
    /// evenly between `w0` and `w1` seconds: the mean of [`Mixture::late`] over the
    /// waits, exact (the integral of a survival function is a difference of expected
    /// excesses, closed-form for a lognormal).
    pub fn late_over(&self, w0: f64, w1: f64, deadline: f64) -> f64 {
        let (lo, hi) = if w0 <= w1 { (w0, w1) } else { (w1, w0) };
        if hi - lo < 1e-9 {
            return self.late(lo, deadline);
        }
        self.terms[..self.len]
            .iter()
            .map(|(p, s)| {
                let area =
                    self.base.excess(deadline - hi - s) - self.base.excess(deadline - lo - s);
                p * area / (hi - lo)
            })
            .sum::<f64>()
            .clamp(0.0, 1.0)
    }
}

/// The complementary error function (Numerical Recipes' `erfcc`, Chebyshev fit,
/// fractional error under 1.2e-7 everywhere).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// The standard normal distribution function.
fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_median_and_the_p99_are_the_configured_ones() {
        let s = ServiceTime::new(ms(20), ms(200));
        assert!(
            (s.quantile(0.5) - 0.020).abs() < 1e-9,
            "{}",
            s.quantile(0.5)
        );
        assert!(
            (s.quantile(0.99) - 0.200).abs() < 1e-6,
            "{}",
            s.quantile(0.99)
        );
        assert!((s.survival(0.020) - 0.5).abs() < 1e-6);
        assert!(
            (s.survival(0.200) - 0.01).abs() < 1e-6,
            "{}",
            s.survival(0.2)
        );
        // The tail is heavy: about 1 request in 1,000 takes 20 times the median.
        let far = s.survival(0.400);
        assert!(far > 1e-4 && far < 3e-3, "{far}");
    }

    #[test]
    fn sampled_quantiles_match_the_closed_forms() {
        let s = ServiceTime::new(ms(20), ms(200));
        let mut rng = SimRng::new(3);
        let mut v: Vec<f64> = (0..200_000).map(|_| s.sample(&mut rng)).collect();
        v.sort_by(f64::total_cmp);
        let q = |p: f64| v[(p * v.len() as f64) as usize];
        assert!((q(0.5) / 0.020 - 1.0).abs() < 0.02, "median {}", q(0.5));
        assert!((q(0.99) / 0.200 - 1.0).abs() < 0.05, "p99 {}", q(0.99));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        assert!(
            (mean / s.mean() - 1.0).abs() < 0.02,
            "mean {mean} vs {}",
            s.mean()
        );
    }

    #[test]
    fn a_constant_time_has_no_tail() {
        let s = ServiceTime::new(ms(20), ms(20));
        assert!(s.is_constant());
        assert_eq!(s.mean(), 0.020);
        assert_eq!(s.survival(0.019), 1.0);
        assert_eq!(
            s.survival(0.020),
            0.0,
            "an answer at the deadline is in time"
        );
        assert_eq!(s.survival(5.0), 0.0);
    }

    #[test]
    fn shifts_delay_answers_and_cost_worker_time() {
        let base = ServiceTime::new(ms(20), ms(20));
        let mut m = Mixture::new(base, 0.5);
        assert!((m.mean() - 0.520).abs() < 1e-12);
        // A 0.52 s answer after 0.5 s of queueing misses a 1 s deadline.
        assert_eq!(m.late(0.0, 1.0), 0.0);
        assert_eq!(m.late(0.5, 1.0), 1.0);
        // 40% of the requests call a dependency 2 s slower: they all miss 1 s.
        m.split(0.4, 2.0);
        assert!((m.late(0.0, 1.0) - 0.4).abs() < 1e-12);
        assert!((m.mean() - (0.520 + 0.8)).abs() < 1e-12);
        // Waits spread evenly from 0 to 2 s: those over 0.98 s are late.
        let m = Mixture::new(base, 0.0);
        let late = m.late_over(0.0, 2.0, 1.0);
        assert!((late - 0.51).abs() < 1e-9, "{late}");
        assert!(
            (m.late_over(2.0, 0.0, 1.0) - late).abs() < 1e-12,
            "either order"
        );
        assert!(Mixture::new(base, 0.0).is_base());
    }

    #[test]
    fn late_over_waits_is_the_mean_of_late() {
        // Against a fine Riemann sum of `late`, with a tail.
        let mut m = Mixture::new(ServiceTime::new(ms(20), ms(300)), 0.1);
        m.split(0.3, 0.25);
        for (w0, w1, d) in [
            (0.0, 1.0, 0.5),
            (0.2, 0.9, 1.0),
            (0.0, 0.05, 0.2),
            (1.0, 3.0, 1.0),
        ] {
            let n = 20_000;
            let riemann = (0..n)
                .map(|k| m.late(w0 + (w1 - w0) * (k as f64 + 0.5) / n as f64, d))
                .sum::<f64>()
                / n as f64;
            let exact = m.late_over(w0, w1, d);
            assert!(
                (exact - riemann).abs() < 1e-4,
                "{w0}..{w1} by {d}: {exact} vs {riemann}"
            );
        }
    }

    #[test]
    fn erfc_is_accurate() {
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.479_500_122_186_953_5),
            (1.0, 0.157_299_207_050_285_1),
            (2.0, 0.004_677_734_981_047_266),
            (-1.0, 1.842_700_792_949_715),
        ] {
            assert!((erfc(x) - want).abs() < 2e-7 * want.max(1e-3), "erfc({x})");
        }
    }
}
