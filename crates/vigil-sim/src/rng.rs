//! Seeded randomness for the simulator: one ChaCha stream per run, plus stateless hashes.
//!
//! Every random draw of a run comes from one [`SimRng`] seeded from the scenario's seed,
//! consumed in a fixed order (events are processed in `(time, sequence)` order, servers
//! in index order), which is what makes a run byte-identical for a given seed. Values
//! that the model evaluates lazily (a server's background dependency check at some past
//! instant) use [`hash_unit`] instead, a pure function of the seed and the coordinates,
//! so they do not depend on when, or whether, the model looks at them.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The run's random number generator.
pub struct SimRng {
    inner: ChaCha8Rng,
}

impl SimRng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        SimRng {
            inner: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// A uniform draw in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        self.inner.random::<f64>()
    }

    /// A uniform 64-bit draw.
    pub fn next_u64(&mut self) -> u64 {
        self.inner.random()
    }

    /// A uniform integer in `[0, n)`; `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        self.inner.random_range(0..n)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (p >= 1.0 || self.unit() < p)
    }

    /// A standard normal draw (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(f64::MIN_POSITIVE);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// A Poisson draw with mean `mean`: exact (Knuth) for small means, the normal
    /// approximation (error well under 1% of the mean) above 30.
    pub fn poisson(&mut self, mean: f64) -> u64 {
        if mean <= 0.0 {
            return 0;
        }
        if mean < 30.0 {
            let limit = (-mean).exp();
            let mut k = 0u64;
            let mut p = self.unit();
            while p > limit {
                k += 1;
                p *= self.unit();
            }
            return k;
        }
        (mean + mean.sqrt() * self.normal()).round().max(0.0) as u64
    }

    /// A binomial draw: successes among `n` trials of probability `p`. Exact by inversion
    /// while `n x min(p, 1-p)` is small (the common case: rare failures, about one
    /// uniform per call), the normal approximation otherwise.
    pub fn binomial(&mut self, n: u64, p: f64) -> u64 {
        if n == 0 || p <= 0.0 {
            return 0;
        }
        if p >= 1.0 {
            return n;
        }
        if p > 0.5 {
            return n - self.binomial(n, 1.0 - p);
        }
        let nf = n as f64;
        if nf * p < 25.0 {
            // Inversion: walk the pmf from 0 with the recurrence
            // P(k+1) = P(k) * (n-k)/(k+1) * p/(1-p).
            let q = 1.0 - p;
            let mut pmf = q.powf(nf);
            if pmf <= 0.0 {
                return self.binomial_normal(n, p);
            }
            let mut cdf = pmf;
            let u = self.unit();
            let mut k = 0u64;
            let ratio = p / q;
            while u > cdf && k < n {
                pmf *= (nf - k as f64) / (k as f64 + 1.0) * ratio;
                k += 1;
                cdf += pmf;
                if pmf < 1e-300 {
                    break;
                }
            }
            return k;
        }
        self.binomial_normal(n, p)
    }

    fn binomial_normal(&mut self, n: u64, p: f64) -> u64 {
        let nf = n as f64;
        let x = nf * p + (nf * p * (1.0 - p)).sqrt() * self.normal();
        x.round().clamp(0.0, nf) as u64
    }
}

/// SplitMix64's finaliser: a well-mixed 64-bit hash of `x`.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A uniform value in `[0, 1)` determined only by `seed` and `coords`.
pub fn hash_unit(seed: u64, coords: &[u64]) -> f64 {
    let mut h = mix(seed);
    for c in coords {
        h = mix(h ^ c);
    }
    (h >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = SimRng::new(7);
        let mut b = SimRng::new(7);
        for _ in 0..100 {
            assert_eq!(a.unit().to_bits(), b.unit().to_bits());
        }
    }

    #[test]
    fn binomial_mean_is_close() {
        let mut r = SimRng::new(1);
        for &(n, p) in &[
            (10u64, 0.01),
            (400, 0.001),
            (400, 0.3),
            (5, 0.9),
            (1000, 0.999),
        ] {
            let trials = 20_000;
            let sum: u64 = (0..trials).map(|_| r.binomial(n, p)).sum();
            let mean = sum as f64 / trials as f64;
            let expected = n as f64 * p;
            let sd = (n as f64 * p * (1.0 - p) / trials as f64).sqrt();
            assert!(
                (mean - expected).abs() < 6.0 * sd + 1e-3,
                "binomial({n}, {p}) mean {mean}, expected {expected}"
            );
            assert!((0..100).all(|_| r.binomial(n, p) <= n), "never more than n");
        }
    }

    #[test]
    fn poisson_mean_is_close() {
        let mut r = SimRng::new(2);
        for &mean in &[0.5, 4.0, 29.0, 400.0] {
            let trials = 20_000;
            let sum: u64 = (0..trials).map(|_| r.poisson(mean)).sum();
            let m = sum as f64 / trials as f64;
            assert!(
                (m - mean).abs() < 6.0 * (mean / trials as f64).sqrt(),
                "poisson({mean}) mean {m}"
            );
        }
    }

    #[test]
    fn hash_unit_is_a_pure_function() {
        assert_eq!(hash_unit(1, &[2, 3]), hash_unit(1, &[2, 3]));
        assert_ne!(hash_unit(1, &[2, 3]), hash_unit(1, &[3, 2]));
        assert_ne!(hash_unit(1, &[2, 3]), hash_unit(2, &[2, 3]));
    }
}
