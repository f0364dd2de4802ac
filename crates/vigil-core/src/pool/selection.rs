//! Who gets this request: the immutable [`RoutingSet`] a pool publishes, its two
//! selection policies (power of two choices, based on tower's p2c; round-robin), and the
//! [`ShedPenalty`] that makes shed answers count as load.

use crate::time::Time;
use std::time::Duration;

/// Which way a [`Ramp`] goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RampDirection {
    /// Slow start: from `min_weight x weight` up to the weight.
    Up,
    /// Leaving fail-open: from the weight down to nothing.
    Down,
}

/// A ramp of a target's effective weight, linear over `window` from `start`: slow start
/// (up) or leaving fail-open (down).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ramp {
    /// When the ramp began (the target entered service, or the pool left fail-open).
    pub start: Time,
    /// How long the ramp lasts.
    pub window: Duration,
    /// Fraction of the weight at `start` (slow start only).
    pub min_weight: f64,
    /// Up (slow start) or down (leaving fail-open).
    pub direction: RampDirection,
}

/// One routable target in a [`RoutingSet`].
#[derive(Clone, Debug, PartialEq)]
pub struct Route<K> {
    /// The target.
    pub key: K,
    /// Its configured weight.
    pub weight: u32,
    /// Its slow-start ramp, while it lasts.
    pub ramp: Option<Ramp>,
}

impl<K> Route<K> {
    /// Weight at `now`: `weight x max(min_weight, elapsed / window)` during a slow-start
    /// ramp, `weight x (1 - elapsed / window)` during a ramp down (0 after it).
    pub fn effective_weight(&self, now: Time) -> f64 {
        let w = f64::from(self.weight);
        match self.ramp {
            Some(r) if !r.window.is_zero() => {
                let f = now.since(r.start).as_secs_f64() / r.window.as_secs_f64();
                match r.direction {
                    RampDirection::Up => w * f.clamp(r.min_weight, 1.0),
                    RampDirection::Down => w * (1.0 - f).clamp(0.0, 1.0),
                }
            }
            Some(Ramp {
                direction: RampDirection::Down,
                ..
            }) => 0.0,
            _ => w,
        }
    }
}

/// Who may get traffic, as of one moment: an immutable snapshot (share it behind an
/// `ArcSwap`); selection takes `now` for slow-start ramps.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingSet<K> {
    /// The routable targets, in pool order.
    pub routes: Vec<Route<K>>,
    /// Whether the pool was in fail-open (routes = every target).
    pub fail_open: bool,
}

impl<K> Default for RoutingSet<K> {
    fn default() -> Self {
        RoutingSet {
            routes: Vec::new(),
            fail_open: false,
        }
    }
}

/// Maps a random `u64` to `[0, 1)`.
pub(super) fn unit(r: u64) -> f64 {
    (r >> 11) as f64 / (1u64 << 53) as f64
}

impl<K> RoutingSet<K> {
    /// Number of routable targets.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// True when nothing is routable.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Power of two choices (based on tower's p2c, weighted): samples two distinct
    /// candidates (not `skip`ped, effective weight > 0) with probability proportional
    /// to their effective weight, using the caller's two random numbers, and returns the
    /// one whose `load` (outstanding requests) is lower. `None` when no candidate is left.
    pub fn pick_p2c(
        &self,
        now: Time,
        random: [u64; 2],
        load: impl Fn(&K) -> u64,
        skip: impl Fn(&K) -> bool,
    ) -> Option<&K> {
        // No allocation for ordinary pools: this runs once per request.
        const STACK: usize = 64;
        let n = self.routes.len();
        let mut stack = [0.0f64; STACK];
        let mut heap = Vec::new();
        let weights: &mut [f64] = if n <= STACK {
            &mut stack[..n]
        } else {
            heap.resize(n, 0.0);
            &mut heap
        };
        for (w, r) in weights.iter_mut().zip(&self.routes) {
            *w = if skip(&r.key) {
                0.0
            } else {
                r.effective_weight(now)
            };
        }
        let total: f64 = weights.iter().sum();
        let a = sample(weights, total, unit(random[0]))?;
        let rest = total - weights[a];
        weights[a] = 0.0;
        let b = if rest > 0.0 {
            sample(weights, rest, unit(random[1]))
        } else {
            None
        };
        let a_key = &self.routes[a].key;
        match b {
            Some(b) if load(&self.routes[b].key) < load(a_key) => Some(&self.routes[b].key),
            _ => Some(a_key),
        }
    }

    /// Least request (HAProxy's `leastconn`, nginx's `least_conn`, weighted as Envoy's
    /// `least_request`): every candidate (not `skip`ped, effective weight > 0) is looked
    /// at and the one with the lowest `(load + 1) / effective weight` wins; ties go to the
    /// first at or after a position drawn from `random`, so equal targets share evenly.
    /// A scan of the whole pool: exact for the few-target pools of a single balancer,
    /// where power of two choices can still send a request to the second-busiest
    /// target. `None` when no candidate is left.
    pub fn pick_least(
        &self,
        now: Time,
        random: u64,
        load: impl Fn(&K) -> u64,
        skip: impl Fn(&K) -> bool,
    ) -> Option<&K> {
        let n = self.routes.len();
        if n == 0 {
            return None;
        }
        let start = (random % n as u64) as usize;
        let mut best: Option<(f64, usize)> = None;
        for i in (start..n).chain(0..start) {
            let r = &self.routes[i];
            if skip(&r.key) {
                continue;
            }
            let w = r.effective_weight(now);
            if w <= 0.0 {
                continue;
            }
            let score = (load(&r.key) as f64 + 1.0) / w;
            if best.is_none_or(|(b, _)| score < b) {
                best = Some((score, i));
            }
        }
        best.map(|(_, i)| &self.routes[i].key)
    }

    /// Round-robin: the `counter`-th pick (the caller increments it per request) over the
    /// candidates not `skip`ped, each getting a share proportional to its effective
    /// weight (equal weights: plain rotation). `None` when no candidate is left.
    pub fn pick_round_robin(
        &self,
        now: Time,
        counter: u64,
        skip: impl Fn(&K) -> bool,
    ) -> Option<&K> {
        // Integer slots per target: weight x 1000 keeps slow-start ramps fine-grained.
        let slots: Vec<u64> = self
            .routes
            .iter()
            .map(|r| {
                if skip(&r.key) {
                    0
                } else {
                    (r.effective_weight(now) * 1000.0).round() as u64
                }
            })
            .collect();
        let total: u64 = slots.iter().sum();
        if total == 0 {
            return None;
        }
        let equal = slots.iter().filter(|s| **s > 0).all(|s| {
            *s == *slots
                .iter()
                .find(|s| **s > 0)
                .expect("total > 0 so one is positive")
        });
        if equal {
            let live: Vec<usize> = (0..slots.len()).filter(|i| slots[*i] > 0).collect();
            return Some(&self.routes[live[(counter % live.len() as u64) as usize]].key);
        }
        let mut pos = counter % total;
        for (i, s) in slots.iter().enumerate() {
            if pos < *s {
                return Some(&self.routes[i].key);
            }
            pos -= s;
        }
        unreachable!("pos < total = sum of slots")
    }
}

pub(super) fn sample(weights: &[f64], total: f64, u: f64) -> Option<usize> {
    if total <= 0.0 {
        return None;
    }
    let mut x = u * total;
    let mut last = None;
    for (i, w) in weights.iter().enumerate() {
        if *w <= 0.0 {
            continue;
        }
        last = Some(i);
        if x < *w {
            return Some(i);
        }
        x -= w;
    }
    // Rounding can leave x just past the last weight: that is the last candidate.
    last
}

// === impl ShedPenalty ===

/// Default half-life of the load a shed answer adds: 1 s. A target shedding `r` answers
/// a second carries about `1.44 x r` extra outstanding requests (`r x half-life / ln 2`)
/// as balancing sees it, and forgets them within seconds once it stops shedding.
pub const DEFAULT_SHED_PENALTY_HALF_LIFE: Duration = Duration::from_secs(1);

/// The extra load a target carries for the answers it shed recently (503, 429:
/// [`RequestOutcome::is_shed`](crate::outlier::RequestOutcome::is_shed)): errors count as load (the SRE book, "Handling
/// Overload"). A shed answer costs the target almost no time, so its outstanding count
/// drops and least-loaded balancing (P2C, least request) would send it *more* traffic:
/// a sinkhole. Adding this penalty to the outstanding count keeps an overloaded target's
/// share down until it stops shedding. Each shed answer adds 1, decaying exponentially
/// with `half_life`. Plain data (two words), so a driver may keep it in atomics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShedPenalty {
    /// The penalty as of `at`.
    pub value: f64,
    /// When `value` was last updated.
    pub at: Time,
}

impl ShedPenalty {
    /// The penalty at `now`.
    pub fn load(&self, now: Time, half_life: Duration) -> f64 {
        if self.value <= 0.0 || half_life.is_zero() {
            return 0.0;
        }
        let halvings = now.since(self.at).as_secs_f64() / half_life.as_secs_f64();
        self.value * (-halvings).exp2()
    }

    /// Records one shed answer at `now`.
    pub fn add(&mut self, now: Time, half_life: Duration) {
        self.add_many(now, 1, half_life);
    }

    /// Records `n` shed answers at `now` (a driver that counts answers in batches, as
    /// `vigil sim` does per tick).
    pub fn add_many(&mut self, now: Time, n: u64, half_life: Duration) {
        self.value = self.load(now, half_life) + n as f64;
        self.at = now;
    }
}
