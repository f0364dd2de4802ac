//! P2C in the simulator: each tick's requests are spread over the routing set by
//! vigil-core's [`RoutingSet::pick_p2c`](vigil_core::pool::RoutingSet::pick_p2c), the
//! function `vigil lb` calls for every request.
//!
//! A tick holds many requests (8,000 in a second of `latency-creep`), so the picks are
//! sampled: up to [`SAMPLES`] per tick (every request when there are fewer, and at
//! least [`SAMPLES_PER_SERVER`] per routed server), and their counts share out the
//! tick's requests (systematic rounding, as weights are shared). Each pick compares the
//! load `vigil lb` compares: a server's outstanding requests plus its shed penalty
//! ([`ShedPenalty`]: a shed 503 counts as load, so a shedding server is not a
//! sinkhole). Outstanding is what the server has queued (its backlog) plus what it has
//! in service, by Little's law its rate times its mean worker time (a slow host's delay,
//! its slow dependencies', the wait behind a GC pause). The rate is this tick's picks so
//! far, blended with the last tick's share (so the first picks of a tick are not
//! blind). Outstanding requests are whole numbers: the estimate is rounded at random
//! (one draw), so at low load most loads are 0 or 1 and a tie goes to the first
//! candidate, as in vigil lb, where P2C is close to weighted random.
//!
//! When every routed server looks alike (equal weight, worker time and penalty, nothing
//! queued), P2C's shares are equal: the caller's exact round-robin is kept then, and the
//! picks are sampled only where servers differ. In pools of over 64 servers a difference
//! of weight alone (slow start) keeps the weights' shares, to bound the cost (picks x
//! servers per tick); there P2C would even out the outstanding counts instead. A target
//! that refuses connections is given a healthy worker time, though in vigil lb it holds
//! nothing outstanding and attracts picks until it is ejected: optimistic there.

use super::Sim;
use vigil_core::pool::{DEFAULT_SHED_PENALTY_HALF_LIFE, ShedPenalty};

/// Most sampled picks per tick.
pub(super) const SAMPLES: u64 = 256;
/// Least sampled picks per tick per routed server (when the tick has as many requests).
pub(super) const SAMPLES_PER_SERVER: u64 = 16;
/// Pools larger than this (`pick_p2c`'s stack size) are sampled only where servers
/// differ in worker time, queue or penalty, not in weight alone.
const LARGE_POOL: usize = 64;
/// Weight of last tick's shares in this tick's rate estimate, in picks.
const PRIOR_PICKS: f64 = 16.0;

/// What P2C sees of each server.
pub(super) struct P2cState {
    /// Per server: the load its recent shed answers add.
    shed: Vec<ShedPenalty>,
    /// Per server: its share of the last sampled tick's picks.
    share: Vec<f64>,
    /// Per route, this tick: picks, mean worker time, backlog plus penalty.
    counts: Vec<u64>,
    latency: Vec<f64>,
    base: Vec<f64>,
    /// Per route, this tick: the prior share (a reused buffer).
    prior: Vec<f64>,
    /// Per server: its route's index this tick.
    route_of: Vec<usize>,
    /// This tick's request rate (its first pass's requests), per second.
    rate: f64,
}

impl P2cState {
    pub(super) fn new(n: usize) -> Self {
        P2cState {
            shed: vec![ShedPenalty::default(); n],
            share: vec![0.0; n],
            counts: Vec::with_capacity(n),
            latency: Vec::with_capacity(n),
            base: Vec::with_capacity(n),
            prior: Vec::with_capacity(n),
            route_of: vec![0; n],
            rate: 0.0,
        }
    }
}

impl<'a> Sim<'a> {
    /// Records `n` answers shed by server `i` now (503: refused by admission control or
    /// a full queue).
    pub(super) fn record_shed(&mut self, i: usize, n: u64) {
        let now = Self::pt(self.now);
        self.p2c.shed[i].add_many(now, n, DEFAULT_SHED_PENALTY_HALF_LIFE);
    }

    /// The mean time a request sent to server `i` now stays outstanding, besides its
    /// queue wait: its worker time, and its share of a GC pause's wait.
    fn outstanding_time(&self, i: usize) -> f64 {
        let now = self.now;
        if !self.is_up(i) {
            return self.service.mean();
        }
        let worker = if self.is_plain(i) && self.tick_plain_punctual {
            self.service.mean()
        } else {
            self.mixture(i, now).mean()
        };
        let dt = self.cfg.tick;
        let paused = self.servers[i]
            .gc
            .map_or(0.0, |g| g.paused_fraction(now, dt));
        // A share `paused` of the tick's requests arrive during the pause and wait half
        // of it on average: `paused^2 x dt / 2` per request.
        worker + paused * paused * dt.as_secs_f64() / 2.0
    }

    /// Fills `self.weights` (per route) with P2C's picks among `n` requests. Returns
    /// false, filling nothing, when the routed servers look alike: P2C's shares are then
    /// the weights', and the caller's apportionment applies.
    /// `first`: the tick's first pass (its requests set the rate, and its shares are the
    /// next tick's prior); a spill pass (requests moved off a target ejected mid-tick)
    /// keeps both.
    pub(super) fn p2c_weights(&mut self, n: u64, first: bool, uniform: bool) -> bool {
        let now = Self::pt(self.now);
        let k = self.routes.routes.len();
        let mut p = std::mem::replace(&mut self.p2c, P2cState::new(0));
        p.latency.clear();
        p.base.clear();
        for (j, r) in self.routes.routes.iter().enumerate() {
            let i = r.key as usize;
            p.route_of[i] = j;
            p.latency.push(self.outstanding_time(i));
            let penalty = p.shed[i].load(now, DEFAULT_SHED_PENALTY_HALF_LIFE);
            p.base.push(self.servers[i].backlog as f64 + penalty);
        }
        // Unequal weights (a slow-start ramp) give unequal outstanding counts, which P2C
        // evens out: sampled, except in pools over `pick_p2c`'s stack size, where the
        // weights' shares stand in (the cost would be picks x servers a tick).
        let small = k <= LARGE_POOL;
        let alike = (uniform || !small)
            && p.latency.iter().all(|&l| l == p.latency[0])
            && p.base.iter().all(|&b| b < 0.5);
        if alike || n == 0 {
            if alike && first {
                let total: f64 = self
                    .routes
                    .routes
                    .iter()
                    .map(|r| r.effective_weight(now))
                    .sum();
                for r in &self.routes.routes {
                    p.share[r.key as usize] =
                        r.effective_weight(now) / total.max(f64::MIN_POSITIVE);
                }
            }
            self.p2c = p;
            return false;
        }
        // The prior: last tick's shares, else the weights' (in a reused buffer: this
        // runs every tick the servers differ).
        let mut prior = std::mem::take(&mut p.prior);
        prior.clear();
        prior.extend(self.routes.routes.iter().map(|r| p.share[r.key as usize]));
        if prior.iter().sum::<f64>() <= 0.0 {
            prior.clear();
            prior.extend(self.routes.routes.iter().map(|r| r.effective_weight(now)));
        }
        let total: f64 = prior.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        prior.iter_mut().for_each(|s| *s /= total);
        let picks = n.min(SAMPLES.max(SAMPLES_PER_SERVER * k as u64));
        if first {
            p.rate = n as f64 / self.cfg.tick.as_secs_f64();
        }
        let rate = p.rate;
        p.counts.clear();
        p.counts.resize(k, 0);
        let rng = std::cell::RefCell::new(&mut self.rng);
        for m in 0..picks {
            let random = {
                let mut r = rng.borrow_mut();
                [r.next_u64(), r.next_u64()]
            };
            let load = |key: &u32| {
                let j = p.route_of[*key as usize];
                let share =
                    (PRIOR_PICKS * prior[j] + p.counts[j] as f64) / (PRIOR_PICKS + m as f64);
                let x = p.base[j] + share * rate * p.latency[j];
                (x + rng.borrow_mut().unit()) as u64
            };
            let picked = self.routes.pick_p2c(now, random, load, |_| false);
            if let Some(key) = picked {
                let j = p.route_of[*key as usize];
                p.counts[j] += 1;
            }
        }
        p.prior = prior;
        let sum: u64 = p.counts.iter().sum();
        if sum == 0 {
            self.p2c = p;
            return false;
        }
        self.weights.clear();
        if first {
            p.share.iter_mut().for_each(|s| *s = 0.0);
        }
        for (j, r) in self.routes.routes.iter().enumerate() {
            let share = p.counts[j] as f64 / sum as f64;
            if first {
                p.share[r.key as usize] = share;
            }
            self.weights.push(share);
        }
        self.p2c = p;
        true
    }
}
