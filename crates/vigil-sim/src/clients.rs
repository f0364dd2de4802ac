//! Clients that retry, and the balancer's retries: how load rises with failures.
//!
//! New requests arrive open-loop (a Poisson number per tick, whatever happens to them).
//! What is closed-loop is what follows a failure: with a client retry policy, a failed
//! attempt comes back as a new attempt; with balancer retries, a connect failure, a reset
//! or an attempt past the per-try timeout is sent again by the balancer, within vigil-core's
//! [`RetryBudget`] (vigil) or without limit (the naive balancer). That loop is what turns
//! a short outage into a metastable retry storm: retries add load, load makes answers
//! late, late answers are retried.
//!
//! # Model
//!
//! Attempts are counted per *class* `(k, j)`: the client's `k`-th attempt (from 0) and the
//! balancer's `j`-th try of it (from 0), and per *cohort* (the tick they were sent in).
//! Every tick, the attempts due (new requests in class `(0, 0)`, retries scheduled by
//! earlier ticks) are sent as a new cohort; the servers' outcomes of the tick (answered,
//! error, refused, late) go to the attempts in flight oldest cohort first (queues are
//! first in, first out), shared out over a cohort's classes at random in proportion to
//! their counts. An attempt still queued when its deadline passes (the per-try timeout,
//! else the client's) is a timeout for its client then, not when a server gets to it: it
//! stays in the server's queue as a *zombie*, whose answer, when it comes, nobody reads
//! (the outcomes of a tick go to zombies first), and whose worker time is wasted. That
//! wasted work is what keeps a fleet down: a queue longer than the clients' patience
//! serves only requests whose clients already left. Then, per class:
//!
//! - an answer ends the request: a success;
//! - a refusal (connect failure, reset) is retried by the balancer while `j <
//!   max_retries`, an attempt past `per_try_timeout` too while the next try still starts
//!   within the client's timeout; the budget (vigil) grants what it can
//!   ([`RetryBudget::withdraw_up_to`], deposited with every attempt that is not a
//!   balancer retry, [`RetryBudget::deposit_many`]);
//! - anything else (an error answer, a shed 503, a retry not granted) reaches the client,
//!   which sends it again per its policy while `k + 1 < max_attempts`, or the request
//!   fails.
//!
//! Retries are due at the next tick at the earliest (the tick is the resolution of client
//! traffic): a balancer retry after the failure (or `per_try_timeout`), a client retry
//! after the failure (or its timeout), plus its backoff: with full jitter (Marc Brooker,
//! "Exponential Backoff And Jitter", AWS Architecture Blog), the `k`-th retry waits a
//! uniform time in `[0, min(backoff_max, backoff_base x 2^(k-1))]`. Since the failure
//! itself happened at a uniform time within its tick, the retry's tick follows the sum of
//! two uniforms, whose distribution function is exact here ([`sum_uniform_cdf`]); the
//! retries of a class are spread over ticks by one multinomial draw.
//!
//! Approximations, all in the balancer's favour: a balancer retry's extra time does not
//! count against the client's timeout, and a retry avoids no particular server (it goes
//! wherever the balancer's share sends it).

use crate::rng::SimRng;
use crate::scenario::{ClientRetry, RetryLimit, ScenarioConfig, Switch};
use std::collections::VecDeque;
use vigil_core::Time;
use vigil_core::pool::RetryBudget;
use vigil_core::retry::{self, AttemptEnd, Progress, Replay, Retry, Trigger};
use vigil_core::throttle::RetryThrottle;

/// The requests of the simulated clients, as the balancer's retry rules see them: reads
/// (idempotent GETs without a body), the traffic retries are allowed for.
const READ: Replay = Replay {
    buffered: true,
    idempotent: true,
    all_methods: false,
    upgrade: false,
};

/// The outcomes of a tick's attempts at the servers, by what the balancer saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Answered in time, successfully.
    pub ok: u64,
    /// Answered with an error (5xx), shed (503), or not routed at all.
    pub err: u64,
    /// Refused: connection refused or reset, before any answer (retried at once).
    pub refused: u64,
    /// No answer within the attempt's deadline (the work may still be done: a server
    /// does not know its client left).
    pub timeout: u64,
}

impl Tally {
    /// All outcomes.
    pub fn total(&self) -> u64 {
        self.ok + self.err + self.refused + self.timeout
    }

    /// Failed outcomes.
    pub fn failed(&self) -> u64 {
        self.err + self.refused + self.timeout
    }

    /// Adds another tally.
    pub fn add(&mut self, o: Tally) {
        self.ok += o.ok;
        self.err += o.err;
        self.refused += o.refused;
        self.timeout += o.timeout;
    }
}

/// What a tick resolved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Client requests that ended in a success.
    pub succeeded: u64,
    /// Client requests that ended in a failure (no attempt left).
    pub failed: u64,
    /// Retries the clients scheduled.
    pub client_retries: u64,
    /// Retries the balancer scheduled.
    pub lb_retries: u64,
    /// Balancer retries the budget or the throttle refused.
    pub lb_denied: u64,
    /// Of those, the ones the retry throttle refused.
    pub lb_throttled: u64,
}

/// Kinds of a class's share of the outcomes: the four of [`Tally`], then "still queued".
const KINDS: usize = 5;

/// The client and balancer retry model (see the module doc).
pub struct Retrying {
    policy: ClientRetry,
    /// Client attempts per request (`K`).
    attempts: usize,
    backoff_base: f64,
    backoff_max: f64,
    client_timeout: f64,
    tick: f64,
    /// Balancer tries per client attempt (`J = max_retries + 1`).
    tries: usize,
    per_try: Option<f64>,
    limit: RetryLimit,
    budget: RetryBudget,
    /// vigil lb's retry throttle (`lb.retries.throttle`), when on and retries are
    /// budgeted.
    throttle: Option<RetryThrottle>,
    /// Attempts due at later ticks per class: `ring[m]` is due `m + 1` ticks after the
    /// current one.
    ring: VecDeque<Vec<u64>>,
    /// Attempts sent and not yet resolved (queued on servers), per cohort (`[0]`: sent
    /// this tick) and class.
    cohorts: VecDeque<Vec<u64>>,
    /// Ticks after which an unresolved attempt has timed out for its client.
    patience: usize,
    /// Attempts timed out for their clients but still in a server's queue.
    zombies: u64,
}

impl Retrying {
    /// The model for `cfg`, or `None` when nothing retries (open-loop clients and no
    /// balancer retries: every attempt is a request, as before retries were modelled).
    pub fn new(cfg: &ScenarioConfig) -> Option<Self> {
        let c = &cfg.clients;
        let r = &cfg.lb.retries;
        if c.retry == ClientRetry::None && r.max_retries == 0 {
            return None;
        }
        let attempts = if c.retry == ClientRetry::None {
            1
        } else {
            c.max_attempts as usize
        };
        let tries = r.max_retries as usize + 1;
        let tick = cfg.tick.as_secs_f64();
        let client_timeout = c.timeout.as_secs_f64();
        let backoff_max = match c.retry {
            ClientRetry::Backoff => c.backoff_max.as_secs_f64(),
            _ => 0.0,
        };
        // The furthest a retry can be due: the failure's tick, its timeout, its backoff.
        let horizon = ((tick + client_timeout + backoff_max) / tick).ceil() as usize + 2;
        Some(Retrying {
            policy: c.retry,
            attempts,
            backoff_base: c.backoff_base.as_secs_f64(),
            backoff_max,
            client_timeout,
            tick,
            tries,
            per_try: r.per_try_timeout.map(|p| p.as_secs_f64()),
            limit: r.limit,
            budget: RetryBudget::new(r.budget),
            throttle: (r.limit == RetryLimit::Budget && r.throttle == Switch::On)
                .then(|| RetryThrottle::new(r.bucket)),
            ring: (0..horizon).map(|_| vec![0; attempts * tries]).collect(),
            cohorts: VecDeque::new(),
            patience: ((r.per_try_timeout.unwrap_or(c.timeout).as_secs_f64() / tick).ceil()
                as usize)
                .max(1),
            zombies: 0,
        })
    }

    fn class(&self, k: usize, j: usize) -> usize {
        k * self.tries + j
    }

    /// Starts a tick at policy time `now` with `fresh` new requests: returns how many
    /// attempts to send (new requests and the retries due now), and deposits those that
    /// are not balancer retries in the budget.
    pub fn start_tick(&mut self, now: Time, fresh: u64) -> u64 {
        let mut due = self.ring.pop_front().expect("the ring is never empty");
        self.ring.push_back(vec![0; due.len()]);
        due[0] += fresh;
        let originals: u64 = (0..self.attempts).map(|k| due[self.class(k, 0)]).sum();
        if self.limit == RetryLimit::Budget && originals > 0 {
            self.budget.deposit_many(now, originals);
        }
        let total = due.iter().sum();
        self.cohorts.push_front(due);
        total
    }

    /// Attempts sent and not resolved yet (zombies excluded).
    pub fn in_flight(&self) -> u64 {
        self.cohorts.iter().flatten().sum()
    }

    /// Ends a tick: `tally` is what the servers resolved this tick, `queued` what they
    /// still hold. Attempts in flight beyond what the servers hold were lost with a
    /// server: they time out like the others.
    pub fn finish_tick(
        &mut self,
        now: Time,
        rng: &mut SimRng,
        tally: Tally,
        queued: u64,
    ) -> Resolved {
        let mut out = Resolved::default();
        // Zombies are the oldest in the queues: their answers come first, unread; the
        // late ones first, as they are the likeliest to be theirs.
        let mut left = tally;
        let mut absorb = self.zombies.min(left.total());
        self.zombies -= absorb;
        for k in [
            &mut left.timeout,
            &mut left.ok,
            &mut left.err,
            &mut left.refused,
        ] {
            let cut = absorb.min(*k);
            *k -= cut;
            absorb -= cut;
        }
        // The rest, oldest cohort first.
        for a in (0..self.cohorts.len()).rev() {
            let live: u64 = self.cohorts[a].iter().sum();
            let remaining = left.total();
            if live == 0 || remaining == 0 {
                continue;
            }
            let take = live.min(remaining);
            let kinds = [left.ok, left.err, left.refused, left.timeout, 0];
            let mine = split(rng, &[take, remaining - take], kinds)[0];
            left.ok -= mine[0];
            left.err -= mine[1];
            left.refused -= mine[2];
            left.timeout -= mine[3];
            let kinds = [mine[0], mine[1], mine[2], mine[3], live - take];
            let shares = split(rng, &self.cohorts[a], kinds);
            for (c, share) in shares.iter().enumerate() {
                let [ok, err, refused, timeout, still] = *share;
                self.cohorts[a][c] = still;
                out.succeeded += ok;
                if let Some(t) = &mut self.throttle {
                    t.record(ok, 0);
                }
                let (k, j) = (c / self.tries, c % self.tries);
                self.resolve_failures(now, rng, k, j, err, refused, timeout, &mut out);
            }
        }
        // The deadline passed for the oldest cohort: its clients (or the balancer, per
        // try) gave up; the servers still hold its attempts.
        if self.cohorts.len() > self.patience {
            let expired = self.cohorts.pop_back().expect("longer than patience");
            for (c, &n) in expired.iter().enumerate() {
                if n > 0 {
                    let (k, j) = (c / self.tries, c % self.tries);
                    self.resolve_failures(now, rng, k, j, 0, 0, n, &mut out);
                    self.zombies += n;
                }
            }
        }
        // Only what the servers still hold can be a zombie.
        self.zombies = self.zombies.min(queued.saturating_sub(self.in_flight()));
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn resolve_failures(
        &mut self,
        now: Time,
        rng: &mut SimRng,
        k: usize,
        j: usize,
        err: u64,
        refused: u64,
        timeout: u64,
        out: &mut Resolved,
    ) {
        // The balancer: vigil-core's eligibility rules (`retry::decide`), the same for
        // every attempt of a class: refusals at once, timeouts while the next try fits
        // in the client's timeout (without a per-try timeout a timeout is the client's
        // own deadline: not retried).
        let progress = |time_left| Progress {
            retries: j as u32,
            max_retries: self.tries as u32 - 1,
            time_left,
            hedging: false,
        };
        let go = |end, time_left| {
            matches!(
                retry::decide(&READ, Trigger::Failed(end), &progress(time_left)),
                Retry::Go(_)
            )
        };
        let refused_ok = if refused > 0 && go(AttemptEnd::Connect, true) {
            refused
        } else {
            0
        };
        let timeout_ok = match self.per_try {
            Some(p) if timeout > 0 => {
                let time_left = ((j + 1) as f64 * p) < self.client_timeout;
                if go(AttemptEnd::Timeout, time_left) {
                    timeout
                } else {
                    0
                }
            }
            _ if timeout > 0 && go(AttemptEnd::Deadline, false) => timeout,
            _ => 0,
        };
        let wanted = refused_ok + timeout_ok;
        // The throttle (as vigil lb drives it): every attempt that failed after it was
        // sent takes a token, those that want a retry ask in turn after their failure
        // (`fail_and_grant`); a refusal (nothing was sent) takes none but its retry
        // still needs the bucket above half. Then the budget grants what it can.
        let allowed = match &mut self.throttle {
            Some(t) => {
                t.record(0, err + timeout - timeout_ok);
                let refused_go = if t.allows() { refused_ok } else { 0 };
                refused_go + t.fail_and_grant(timeout_ok)
            }
            None => wanted,
        };
        out.lb_throttled += wanted - allowed;
        let granted = match self.limit {
            RetryLimit::Budget if allowed > 0 => self.budget.withdraw_up_to(now, allowed),
            _ => allowed,
        };
        out.lb_denied += wanted - granted;
        out.lb_retries += granted;
        // Refusals first: they cost no server time and a refused try is the likelier to
        // succeed elsewhere (the order within a tick is otherwise arbitrary).
        let g_refused = granted.min(refused_ok);
        let g_timeout = granted - g_refused;
        let next = self.class(k, j + 1);
        self.schedule(rng, next, g_refused, 0.0, 0.0);
        if let Some(p) = self.per_try {
            self.schedule(rng, next, g_timeout, p, 0.0);
        }
        // The client sees the rest.
        let timed_out = timeout - g_timeout;
        let fast = err + refused - g_refused;
        if self.policy == ClientRetry::None || k + 1 >= self.attempts {
            out.failed += fast + timed_out;
            return;
        }
        let width = match self.policy {
            ClientRetry::Backoff => self
                .backoff_max
                .min(self.backoff_base * 2f64.powi(k as i32)),
            _ => 0.0,
        };
        // A timed-out attempt ends when the balancer gives up (per try) or the client does.
        let waited = self
            .per_try
            .map_or(self.client_timeout, |p| (j + 1) as f64 * p)
            .min(self.client_timeout);
        let retry = self.class(k + 1, 0);
        self.schedule(rng, retry, fast, 0.0, width);
        self.schedule(rng, retry, timed_out, waited, width);
        out.client_retries += fast + timed_out;
    }

    /// Schedules `n` attempts of class `c`, each due `after + U(0, tick) + U(0, width)`
    /// seconds after the start of the current tick (at the next tick at the earliest).
    fn schedule(&mut self, rng: &mut SimRng, c: usize, n: u64, after: f64, width: f64) {
        if n == 0 {
            return;
        }
        let horizon = self.ring.len();
        let mut left = n;
        let mut mass = 1.0;
        let mut m = 0usize;
        while left > 0 {
            let lo = m as f64 * self.tick - after;
            let hi = lo + self.tick;
            let p = sum_uniform_cdf(hi, self.tick, width) - sum_uniform_cdf(lo, self.tick, width);
            let ahead = m.clamp(1, horizon);
            let last = ahead == horizon || hi >= self.tick + width;
            let here = if last || mass <= 0.0 {
                left
            } else {
                rng.binomial(left, (p / mass).clamp(0.0, 1.0))
            };
            self.ring[ahead - 1][c] += here;
            left -= here;
            mass -= p;
            m += 1;
        }
    }
}

/// The distribution function of `U(0, a) + U(0, b)` at `x`.
pub fn sum_uniform_cdf(x: f64, a: f64, b: f64) -> f64 {
    let (a, b) = if a <= b { (a, b) } else { (b, a) };
    if x <= 0.0 {
        return 0.0;
    }
    if x >= a + b {
        return 1.0;
    }
    if a <= 0.0 {
        return x / b;
    }
    if x < a {
        x * x / (2.0 * a * b)
    } else if x <= b {
        (x - a / 2.0) / b
    } else {
        1.0 - (a + b - x) * (a + b - x) / (2.0 * a * b)
    }
}

/// Shares `kinds` (totals that add up to the sum of `classes`) out over the classes at
/// random, each class getting its count: per class, kind by kind, a binomial draw at the
/// kind's remaining share, kept within what the other kinds and classes can absorb, so
/// the result is always a partition.
fn split(rng: &mut SimRng, classes: &[u64], mut kinds: [u64; KINDS]) -> Vec<[u64; KINDS]> {
    let mut out = vec![[0u64; KINDS]; classes.len()];
    let mut pool: u64 = kinds.iter().sum();
    let nonempty = classes.iter().rposition(|&c| c > 0);
    for (ci, &count) in classes.iter().enumerate() {
        if count == 0 {
            continue;
        }
        if Some(ci) == nonempty {
            // The last class takes what is left.
            out[ci] = kinds;
            break;
        }
        let mut c = count.min(pool);
        let mut rest = pool;
        for k in 0..KINDS {
            let have = kinds[k];
            let x = if k + 1 == KINDS {
                c
            } else {
                let others = rest - have;
                let lo = c.saturating_sub(others);
                let hi = have.min(c);
                let p = if rest == 0 {
                    0.0
                } else {
                    have as f64 / rest as f64
                };
                rng.binomial(c, p).clamp(lo, hi)
            };
            out[ci][k] = x;
            kinds[k] -= x;
            c -= x;
            rest -= have;
        }
        pool -= count.min(pool);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;
    use std::path::Path;

    fn model(src: &str) -> Retrying {
        let s = Scenario::parse(Path::new("t.toml"), src).expect("valid scenario");
        Retrying::new(&s.config).expect("something retries")
    }

    fn due(m: &Retrying, ahead: usize) -> u64 {
        m.ring[ahead - 1].iter().sum()
    }

    const NOW: Time = Time::ZERO;

    #[test]
    fn open_loop_clients_and_no_balancer_retries_need_no_model() {
        let s = Scenario::parse(Path::new("t.toml"), "").unwrap();
        assert!(Retrying::new(&s.config).is_none());
    }

    #[test]
    fn immediate_retries_come_back_next_tick_until_the_attempts_run_out() {
        let mut m = model("[clients]\nretry = \"immediate\"\nmax_attempts = 3\n");
        let mut rng = SimRng::new(1);
        assert_eq!(m.start_tick(NOW, 100), 100);
        let fail = Tally {
            err: 100,
            ..Tally::default()
        };
        let r = m.finish_tick(NOW, &mut rng, fail, 0);
        assert_eq!((r.client_retries, r.failed, r.succeeded), (100, 0, 0));
        assert_eq!(
            due(&m, 1),
            100,
            "an immediate retry is due at the next tick"
        );
        // Second attempts fail too: third attempts; then they fail for good.
        assert_eq!(m.start_tick(NOW, 0), 100);
        let r = m.finish_tick(NOW, &mut rng, fail, 0);
        assert_eq!(r.client_retries, 100);
        assert_eq!(m.start_tick(NOW, 0), 100);
        let r = m.finish_tick(NOW, &mut rng, fail, 0);
        assert_eq!(
            (r.client_retries, r.failed),
            (0, 100),
            "3 attempts, no more"
        );
        assert_eq!(m.start_tick(NOW, 0), 0);
    }

    #[test]
    fn timed_out_attempts_are_retried_after_the_timeout() {
        let mut m = model("[clients]\nretry = \"immediate\"\ntimeout = \"3s\"\n");
        let mut rng = SimRng::new(2);
        m.start_tick(NOW, 1000);
        let late = Tally {
            timeout: 1000,
            ..Tally::default()
        };
        m.finish_tick(NOW, &mut rng, late, 0);
        // Failed at U(0, 1 s) + 3 s: due 3 ticks later.
        assert_eq!(due(&m, 3), 1000);
    }

    #[test]
    fn backoff_spreads_retries_over_its_jitter_window() {
        let mut m = model(
            "[clients]\nretry = \"backoff\"\nmax_attempts = 5\nbackoff_base = \"4s\"\nbackoff_max = \"10s\"\n",
        );
        let mut rng = SimRng::new(3);
        // Third attempts (k = 2) of fast failures: delay U(0, min(10, 4 x 2^2) = 10 s),
        // plus U(0, 1 s) for the failure's instant.
        let third = m.class(2, 0);
        let mut cohort = vec![0; m.attempts * m.tries];
        cohort[third] = 100_000;
        m.cohorts.push_front(cohort);
        let r = m.finish_tick(
            NOW,
            &mut rng,
            Tally {
                err: 100_000,
                ..Tally::default()
            },
            0,
        );
        assert_eq!(r.client_retries, 100_000);
        let total: u64 = (1..=m.ring.len()).map(|a| due(&m, a)).sum();
        assert_eq!(total, 100_000, "every retry is due somewhere");
        assert_eq!(due(&m, 12), 0, "none after 11 s");
        // Ticks 1..9 each get about a tenth (10,000); tick 1 also the first second's.
        for a in 2..=9 {
            let got = due(&m, a) as f64;
            assert!((got - 10_000.0).abs() < 600.0, "tick {a}: {got}");
        }
        assert!(due(&m, 10) > 0 && due(&m, 10) < 10_000);
    }

    #[test]
    fn the_throttle_stops_balancer_retries_when_most_attempts_fail() {
        // A generous budget: only the throttle can stop the retries.
        let src = "[lb.retries]\nmax_retries = 2\nper_try_timeout = \"300ms\"\n\
                   [lb.retries.budget]\nratio = 1.0\n";
        let mut m = model(src);
        let mut rng = SimRng::new(4);
        m.start_tick(NOW, 1000);
        let late = Tally {
            timeout: 1000,
            ..Tally::default()
        };
        // The per-try timeout passes after a tick (300 ms < 1 s): the cohort is resolved.
        let r = m.finish_tick(NOW, &mut rng, late, 0);
        // 10 tokens, one per failure: the first four failures leave more than half.
        assert_eq!((r.lb_retries, r.lb_throttled), (4, 996), "{r:?}");
        assert_eq!(r.lb_denied, 996, "throttled retries count as denied");
        assert!(!m.throttle.as_ref().expect("on").allows());
        // Refusals (nothing sent) take no token, but their retries wait for the bucket.
        m.start_tick(NOW, 10);
        let refused = Tally {
            refused: 14,
            ..Tally::default()
        };
        let r = m.finish_tick(NOW, &mut rng, refused, 0);
        assert_eq!(r.lb_retries, 0, "{r:?}");
        // Successes refill it: 51 give back 5.1 tokens, above half again.
        m.start_tick(NOW, 51);
        let ok = Tally {
            ok: 51,
            ..Tally::default()
        };
        m.finish_tick(NOW, &mut rng, ok, 0);
        assert!(m.throttle.as_ref().expect("on").allows());
        m.start_tick(NOW, 10);
        let r = m.finish_tick(NOW, &mut rng, refused, 0);
        assert!(r.lb_retries > 0, "{r:?}");
    }

    #[test]
    fn the_budget_bounds_balancer_retries_and_the_naive_balancer_has_none() {
        let budget = "[lb.retries.budget]\nratio = 0.2\nmin_retries_per_second = 0\n";
        // The budget alone (the throttle has its own test).
        let src = format!("[lb.retries]\nmax_retries = 2\nthrottle = \"off\"\n{budget}");
        let refused = Tally {
            refused: 1000,
            ..Tally::default()
        };
        let mut m = model(&src);
        let mut rng = SimRng::new(4);
        m.start_tick(NOW, 1000);
        let r = m.finish_tick(NOW, &mut rng, refused, 0);
        assert_eq!(
            (r.lb_retries, r.lb_denied),
            (200, 800),
            "20% of 1000 requests"
        );
        assert_eq!(
            r.failed, 800,
            "the denied ones fail: the clients do not retry"
        );
        let mut naive = model(&format!(
            "[lb.retries]\nmax_retries = 2\nlimit = \"none\"\n{budget}"
        ));
        naive.start_tick(NOW, 1000);
        let r = naive.finish_tick(NOW, &mut rng, refused, 0);
        assert_eq!((r.lb_retries, r.lb_denied), (1000, 0));
        // Retries of retries: up to max_retries, then the client sees the failure.
        assert_eq!(naive.start_tick(NOW, 0), 1000);
        naive.finish_tick(NOW, &mut rng, refused, 0);
        assert_eq!(naive.start_tick(NOW, 0), 1000);
        let r = naive.finish_tick(NOW, &mut rng, refused, 0);
        assert_eq!((r.lb_retries, r.failed), (0, 1000), "3 tries, no more");
    }

    #[test]
    fn timeouts_are_retried_by_the_balancer_only_within_the_clients_timeout() {
        let late = Tally {
            timeout: 100,
            ..Tally::default()
        };
        let mut rng = SimRng::new(5);
        // No per-try timeout: a timeout is the client's, not retried.
        let mut m = model("[lb.retries]\nmax_retries = 3\nlimit = \"none\"\n");
        m.start_tick(NOW, 100);
        assert_eq!(m.finish_tick(NOW, &mut rng, late, 0).lb_retries, 0);
        // 400 ms per try in a 1 s client timeout: tries at 0, 0.4 and 0.8 s.
        let mut m =
            model("[lb.retries]\nmax_retries = 3\nlimit = \"none\"\nper_try_timeout = \"400ms\"\n");
        let mut tries = 1;
        m.start_tick(NOW, 100);
        while m.finish_tick(NOW, &mut rng, late, 0).lb_retries > 0 {
            tries += 1;
            m.start_tick(NOW, 0);
        }
        assert_eq!(tries, 3);
    }

    #[test]
    fn queued_attempts_stay_in_flight_and_lost_ones_time_out() {
        let mut m = model("[clients]\nretry = \"immediate\"\nmax_attempts = 2\n");
        let mut rng = SimRng::new(6);
        m.start_tick(NOW, 100);
        let r = m.finish_tick(
            NOW,
            &mut rng,
            Tally {
                ok: 60,
                ..Tally::default()
            },
            40,
        );
        assert_eq!((r.succeeded, m.in_flight()), (60, 40));
        // The server holding them dies: 40 lost, retried by their clients.
        m.start_tick(NOW, 0);
        let r = m.finish_tick(NOW, &mut rng, Tally::default(), 0);
        assert_eq!((r.client_retries, m.in_flight()), (40, 0));
    }

    #[test]
    fn clients_give_up_on_queued_attempts_and_their_late_answers_go_unread() {
        let mut m = model("[clients]\nretry = \"immediate\"\nmax_attempts = 2\n");
        let mut rng = SimRng::new(8);
        // 100 attempts sit in a deep queue: nothing comes back for them.
        m.start_tick(NOW, 100);
        let r = m.finish_tick(NOW, &mut rng, Tally::default(), 100);
        assert_eq!(
            r,
            Resolved::default(),
            "within their 1 s deadline: still waiting"
        );
        m.start_tick(NOW, 0);
        let r = m.finish_tick(NOW, &mut rng, Tally::default(), 100);
        assert_eq!(r.client_retries, 100, "past the deadline the clients retry");
        assert_eq!(
            (m.in_flight(), m.zombies),
            (0, 100),
            "the servers still hold them"
        );
        // The retries arrive; the servers answer 100 requests in time: the zombies'
        // (the oldest), which nobody reads. Then the retries' own answers.
        assert_eq!(m.start_tick(NOW, 0), 100);
        let answered = Tally {
            ok: 100,
            ..Tally::default()
        };
        let r = m.finish_tick(NOW, &mut rng, answered, 100);
        assert_eq!(r.succeeded, 0, "answers to gone clients are wasted work");
        let r = m.finish_tick(NOW, &mut rng, answered, 0);
        assert_eq!(r.succeeded, 100);
    }

    #[test]
    fn split_is_a_partition() {
        let mut rng = SimRng::new(7);
        for _ in 0..200 {
            let classes: Vec<u64> = (0..6).map(|_| rng.below(50)).collect();
            let total: u64 = classes.iter().sum();
            let mut kinds = [0u64; KINDS];
            let mut left = total;
            for k in kinds.iter_mut().take(KINDS - 1) {
                *k = rng.below(left + 1);
                left -= *k;
            }
            kinds[KINDS - 1] = left;
            let out = split(&mut rng, &classes, kinds);
            for (c, row) in classes.iter().zip(&out) {
                assert_eq!(row.iter().sum::<u64>(), *c, "each class gets its count");
            }
            for k in 0..KINDS {
                assert_eq!(
                    out.iter().map(|r| r[k]).sum::<u64>(),
                    kinds[k],
                    "each kind is used up"
                );
            }
        }
    }

    #[test]
    fn sum_of_uniforms() {
        assert_eq!(sum_uniform_cdf(0.5, 1.0, 0.0), 0.5);
        assert_eq!(sum_uniform_cdf(1.0, 1.0, 1.0), 0.5);
        assert!((sum_uniform_cdf(0.5, 1.0, 1.0) - 0.125).abs() < 1e-12);
        assert!((sum_uniform_cdf(1.5, 1.0, 1.0) - 0.875).abs() < 1e-12);
        assert!((sum_uniform_cdf(2.0, 1.0, 3.0) - 0.5).abs() < 1e-12);
        assert_eq!(sum_uniform_cdf(5.0, 1.0, 3.0), 1.0);
    }
}
