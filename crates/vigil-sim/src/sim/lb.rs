//! The load balancer driver: probes and request outcomes fed to vigil-core's `Pool`,
//! the routing set, and each tick's client traffic spread over it.

use super::engine::Ev;
use super::model::Life;
use super::{MAX_EJECTION_MARKS, RECOVERED, Sample, Sim, TIMEOUT};
use crate::clients::Tally;
use crate::scenario::{Balance, CheckPath};
use vigil_core::HealthState;
use vigil_core::outlier::{OutlierEvent, RequestOutcome};
use vigil_core::pool::PoolEvent;

impl<'a> Sim<'a> {
    pub(super) fn in_service(&self, i: usize) -> bool {
        self.lb_health[i] == HealthState::Healthy && !self.ejected[i]
    }

    pub(super) fn pool_events(&mut self, events: Vec<PoolEvent<u32>>) {
        for e in events {
            self.routes_dirty = true;
            match &e {
                PoolEvent::Health {
                    target, from, to, ..
                } => {
                    let i = *target as usize;
                    self.lb_health[i] = *to;
                    if *from == HealthState::Healthy && *to == HealthState::Unhealthy {
                        self.s.lb_removals += 1;
                    }
                }
                PoolEvent::Outlier { event, .. } => match event {
                    OutlierEvent::Ejected { target, .. } => {
                        self.ejected[*target as usize] = true;
                        self.ejected_count += 1;
                        self.s.ejections += 1;
                    }
                    OutlierEvent::Readmitted { target, .. } => {
                        // Readmission resets both streaks.
                        self.ejected[*target as usize] = false;
                        self.ejected_count -= 1;
                        self.streaks[*target as usize] = (0, 0);
                        self.outlier_dirty[*target as usize] = false;
                    }
                    OutlierEvent::EjectionSkipped { .. } => {
                        self.s.ejections_skipped += 1;
                        continue; // not worth a log line each
                    }
                },
                PoolEvent::FailOpen { entered, .. } => {
                    if *entered {
                        self.s.fail_open_episodes += 1;
                        self.fail_open_since = Some(self.now);
                        if let Some(f) = self.first_fault_at
                            && self.s.first_fail_open_after_fault.is_none()
                        {
                            self.s.first_fail_open_after_fault = Some(self.now.since(f));
                        }
                    } else if let Some(since) = self.fail_open_since.take() {
                        self.s.fail_open_time += self.now.since(since);
                    }
                }
            }
            let line = e.to_string();
            let kind = match &e {
                PoolEvent::FailOpen { entered: true, .. } => Some("fail-open"),
                PoolEvent::FailOpen { entered: false, .. } => Some("fail-open-end"),
                PoolEvent::Outlier {
                    event: OutlierEvent::Ejected { .. },
                    ..
                } if self.ejection_marks < MAX_EJECTION_MARKS => {
                    self.ejection_marks += 1;
                    Some("ejection")
                }
                _ => None,
            };
            if let Some(kind) = kind {
                self.decide_mark(kind, &line);
            }
            self.note(format!("lb: {line}"));
        }
    }

    pub(super) fn on_lb_probe(&mut self, i: u32) {
        let now = self.now;
        let iu = i as usize;
        let deep = self.cfg.lb.check == CheckPath::Deep;
        let p = self.probe(iu, now, deep, self.cfg.lb.timeout);
        if p.detail == TIMEOUT {
            self.s.check_timeouts += 1;
        }
        // Exact elision: a result equal to the previous one, on a target whose verdict
        // already agrees with it, only lengthens a streak past its threshold.
        let settled = if p.ok {
            HealthState::Healthy
        } else {
            HealthState::Unhealthy
        };
        let elide = p.ok == self.lb_last_ok[iu] && self.lb_health[iu] == settled;
        if !elide {
            self.schedule(
                now + p.latency,
                Ev::LbProbeDone {
                    server: i,
                    incarnation: self.servers[iu].incarnation,
                    ok: p.ok,
                    detail: p.detail,
                },
            );
        }
    }

    pub(super) fn on_lb_probe_done(&mut self, i: u32, _gen: u32, ok: bool, detail: &'static str) {
        self.lb_last_ok[i as usize] = ok;
        let ev = self.pool.observe_probe(&i, Self::pt(self.now), ok, detail);
        self.pool_events(ev);
    }

    /// Feeds a tick's outcomes at server `i` to outlier detection, in a random order, and
    /// returns how many outcomes happened before it was ejected (all, if it was not).
    /// `fails` are the failures, of up to two kinds, each interleaved at random.
    pub(super) fn feed_outcomes(
        &mut self,
        i: u32,
        ok: u64,
        fails: [(RequestOutcome, u64); 2],
    ) -> u64 {
        let [(kind_a, a), (kind_b, b)] = fails;
        let failed = a + b;
        let total = ok + failed;
        if ok == 0
            && [(kind_a, a), (kind_b, b)]
                .iter()
                .all(|&(k, n)| n == 0 || k.is_shed())
        {
            // Shed answers neither count towards ejection nor reset a streak: nothing to
            // feed (vigil_core::outlier, rule 5).
            return total;
        }
        if failed == 0 {
            if ok > 0 {
                return self.feed_runs(i, &[(None, ok)]);
            }
            return total;
        }
        // Failures against successes, then, among the failures, one kind against the
        // other: the runs of a uniformly random interleaving of the tick's outcomes.
        // (The buffers are reused: this runs for every server with failures, every tick.)
        let mut runs = std::mem::take(&mut self.runs_buf);
        runs.clear();
        if a == 0 || b == 0 {
            let kind = if a > 0 { kind_a } else { kind_b };
            self.interleave(&mut runs, failed, ok, Some(kind), None);
        } else {
            let mut outcomes = Vec::new();
            self.interleave(&mut outcomes, failed, ok, true, false);
            let mut kinds = Vec::new();
            self.interleave(&mut kinds, a, b, kind_a, kind_b);
            let mut k = kinds.iter().copied();
            let mut cur = k.next().expect("a > 0");
            for (f, mut n) in outcomes {
                if !f {
                    runs.push((None, n));
                    continue;
                }
                while n > 0 {
                    if cur.1 == 0 {
                        cur = k.next().expect("as many kinds as failures");
                    }
                    let take = n.min(cur.1);
                    match runs.last_mut() {
                        Some((Some(last), len)) if *last == cur.0 => *len += take,
                        _ => runs.push((Some(cur.0), take)),
                    }
                    cur.1 -= take;
                    n -= take;
                }
            }
        }
        let consumed = self.feed_runs(i, &runs);
        self.runs_buf = runs;
        consumed
    }

    /// Appends to `runs` the run lengths `(label, length)` of a uniformly random
    /// interleaving of `x` items labelled `first` and `y` labelled `second`: the minority
    /// at random positions when it is small, item by item (without replacement)
    /// otherwise.
    pub(super) fn interleave<T: Copy + PartialEq>(
        &mut self,
        runs: &mut Vec<(T, u64)>,
        x: u64,
        y: u64,
        first: T,
        second: T,
    ) {
        let total = x + y;
        let push = |runs: &mut Vec<(T, u64)>, is_first: bool, len: u64| {
            if len == 0 {
                return;
            }
            let label = if is_first { first } else { second };
            match runs.last_mut() {
                Some((l, n)) if *l == label => *n += len,
                _ => runs.push((label, len)),
            }
        };
        if y == 0 {
            push(runs, true, x);
        } else if x == 0 {
            push(runs, false, y);
        } else if x.min(y) <= 256 {
            let minority_first = x <= y;
            let k = x.min(y);
            let mut pos = std::mem::take(&mut self.pos_buf);
            pos.clear();
            while (pos.len() as u64) < k {
                let p = self.rng.below(total);
                if !pos.contains(&p) {
                    pos.push(p);
                }
            }
            pos.sort_unstable();
            let mut cursor = 0u64;
            for &p in &pos {
                push(runs, !minority_first, p - cursor);
                push(runs, minority_first, 1);
                cursor = p + 1;
            }
            push(runs, !minority_first, total - cursor);
            self.pos_buf = pos;
        } else {
            let (mut x_left, mut left) = (x, total);
            while left > 0 {
                let is_first = self.rng.below(left) < x_left;
                if is_first {
                    x_left -= 1;
                }
                left -= 1;
                push(runs, is_first, 1);
            }
        }
    }

    /// Feeds runs of outcomes (`None`: a success) to outlier detection, only where they
    /// can change a decision (see [`Sim::feed_outcomes`]); returns the outcomes consumed
    /// before an ejection.
    ///
    /// Exactness: the detector's streaks are mirrored here (`streaks`: errors, gateway
    /// errors; a non-gateway error resets the latter, as in the detector). A block of
    /// failures that cannot reach a threshold and is followed by a success changes
    /// nothing (the success resets both streaks), so it is not fed. A block that can
    /// reach one is fed until the ejection (or the refusal, reported once per streak);
    /// further failures of that tick cannot change anything since room for an ejection
    /// only appears at readmission, in `Pool::tick`; and a run on a saturated streak with
    /// no room changes no decision either (the next error with room ejects either way).
    /// Outcomes of an ejected target are ignored by the detector, so they are not fed.
    pub(super) fn feed_runs(&mut self, i: u32, runs: &[(Option<RequestOutcome>, u64)]) -> u64 {
        let iu = i as usize;
        let total: u64 = runs.iter().map(|r| r.1).sum();
        let oc = self.cfg.lb.pool.outlier;
        if oc.max_ejection_percent == 0 {
            return total;
        }
        // Failures still needed to reach a threshold, from streaks (errors, gateway).
        let need = |kind: RequestOutcome, (s5, sg): (u32, u32)| -> u32 {
            let need_5xx = (oc.consecutive_5xx > 0).then(|| oc.consecutive_5xx.saturating_sub(s5));
            let need_gw = (kind.is_gateway_error() && oc.consecutive_gateway_errors > 0)
                .then(|| oc.consecutive_gateway_errors.saturating_sub(sg));
            match (need_5xx, need_gw) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => u32::MAX,
            }
        };
        let advance = |kind: RequestOutcome, (s5, sg): (u32, u32), n: u64| -> (u32, u32) {
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            (
                s5.saturating_add(n),
                if kind.is_gateway_error() {
                    sg.saturating_add(n)
                } else {
                    0
                },
            )
        };
        let now = Self::pt(self.now);
        let mut consumed = 0u64;
        let mut k = 0;
        while k < runs.len() {
            let (kind, len) = runs[k];
            let Some(_) = kind else {
                if len > 0 {
                    if self.outlier_dirty[iu] && !self.ejected[iu] {
                        self.outlier_dirty[iu] = false;
                        let j = self.rng.unit();
                        let ev =
                            self.pool
                                .observe_request(&i, now, RequestOutcome::Response(200), j);
                        self.pool_events(ev);
                    }
                    self.streaks[iu] = (0, 0);
                }
                consumed += len;
                k += 1;
                continue;
            };
            // A block of failures: runs k..end.
            let mut end = k;
            while end < runs.len() && runs[end].0.is_some() {
                end += 1;
            }
            let block: u64 = runs[k..end].iter().map(|r| r.1).sum();
            if self.ejected[iu] {
                consumed += block;
                k = end;
                continue;
            }
            let mut dry = self.streaks[iu];
            let mut reaches = false;
            for &(kind, len) in &runs[k..end] {
                let kind = kind.expect("a failure run");
                if len > 0 && u64::from(need(kind, dry)) <= len {
                    reaches = true;
                    break;
                }
                dry = advance(kind, dry, len);
            }
            if !reaches && end < runs.len() {
                // Reset by the success run that follows: no effect.
                consumed += block;
                k = end;
                continue;
            }
            for &(kind, len) in &runs[k..end] {
                let kind = kind.expect("a failure run");
                if len == 0 {
                    continue;
                }
                let need = need(kind, self.streaks[iu]);
                let reaches = u64::from(need) <= len;
                // Saturated streak with no room for an ejection: feeding changes nothing.
                let room = self.ejected_count < oc.max_ejected(self.servers.len());
                if need == 0 && !room {
                    consumed += len;
                    continue;
                }
                let feed = if reaches { u64::from(need.max(1)) } else { len };
                self.outlier_dirty[iu] = true;
                for f in 0..feed {
                    let j = self.rng.unit();
                    let ev = self.pool.observe_request(&i, now, kind, j);
                    let ejected = ev.iter().any(|e| e.left_service() == Some(&i));
                    self.pool_events(ev);
                    self.streaks[iu] = advance(kind, self.streaks[iu], 1);
                    if ejected {
                        return consumed + f + 1;
                    }
                }
                consumed += len;
            }
            k = end;
        }
        total
    }

    /// Serves `n` new requests at server `i` this tick: what the balancer saw of them (and
    /// of queued ones served now), and how many spilled (arrived after an ejection: they
    /// go elsewhere).
    pub(super) fn serve(&mut self, i: u32, n: u64, feed: bool) -> (Tally, u64) {
        let iu = i as usize;
        let now = self.now;
        let dt = self.cfg.tick;
        let up = self.is_up(iu);
        // Fast path, the common case: a server without a fault of its own, nothing
        // queued, under capacity, punctual, and dependencies failing nobody. Same outcome
        // as the general path below (no draw is needed when nothing can fail).
        if up
            && self.tick_fail_prob == Some(0.0)
            && self.tick_plain_punctual
            && self.servers[iu].backlog == 0
            && (n as f64) <= self.tick_full_cap
            && self.is_plain(iu)
        {
            self.servers[iu].overloaded = false;
            self.servers[iu].shedding = false;
            self.defences[iu].queue.empty_at(Self::pt(now));
            if feed && n > 0 && self.outlier_dirty[iu] {
                self.feed_runs(i, &[(None, n)]);
            }
            let ok = Tally {
                ok: n,
                ..Tally::default()
            };
            return (ok, 0);
        }
        let refuse = |this: &mut Self, outcome: RequestOutcome| {
            let consumed = if feed {
                this.feed_outcomes(i, 0, [(outcome, n), (outcome, 0)])
            } else {
                n
            };
            let refused = Tally {
                refused: consumed.min(n),
                ..Tally::default()
            };
            (refused, n - consumed.min(n))
        };
        if !up {
            return refuse(self, RequestOutcome::ConnectFailure);
        }
        let plain = self.is_plain(iu);
        if !plain && self.fds_exhausted(iu, now) {
            return refuse(self, RequestOutcome::Reset);
        }
        let brownout = self.cfg.fleet.brownout;
        let paused = if plain {
            0.0
        } else {
            self.servers[iu]
                .gc
                .map_or(0.0, |g| g.paused_fraction(now, dt))
        };
        // Capacity: the workers over the mean worker time (the same for every plain
        // server while punctual, computed once).
        let (cap_rate, mixture) = if plain && self.tick_plain_punctual {
            (self.cap_rate, None)
        } else {
            let m = self.mixture(iu, now);
            (f64::from(self.cfg.fleet.workers) / m.mean(), Some(m))
        };
        let full = cap_rate * dt.as_secs_f64();
        let overloaded = n as f64 > full;
        let eff = if overloaded { 1.0 - brownout } else { 1.0 };
        // Non-negative, so `as` truncation is floor (and much cheaper).
        let cap = (full * (1.0 - paused) * eff) as u64;
        // The queue holds as many requests as a healthy server answers within
        // `max_queue_wait` (their wait plus a worker time). A slow server's queue holds as
        // many: they wait longer.
        let healthy_mean = self.service.mean();
        let max_wait = (self.cfg.fleet.max_queue_wait.as_secs_f64() - healthy_mean).max(0.0);
        let drain = cap_rate * eff;
        let plain_queue = (max_wait * self.cap_rate * eff) as u64;
        // Admission control: no more than the deadline and the queue-time rule let
        // wait, at this server's own pace.
        let max_queue = match self.admission_wait(iu, now) {
            Some(w) => plain_queue.min((w * drain) as u64),
            None => plain_queue,
        };
        let s = &mut self.servers[iu];
        s.overloaded = overloaded;
        // What stands beyond the bound now (it shrank with a brownout) is shed this tick.
        let before = s.backlog.min(max_queue);
        let total = s.backlog + n;
        // Serve what capacity allows, queue what can still be answered in time, shed the
        // rest.
        let (served, dropped) = if total > cap {
            let waiting = total - cap;
            let dropped = waiting.saturating_sub(max_queue);
            s.backlog = waiting - dropped;
            (cap, dropped)
        } else {
            s.backlog = 0;
            (total, 0)
        };
        let after = s.backlog;
        s.shedding = dropped > 0 && paused == 0.0;
        if s.shedding && self.cfg.lb.balance == Balance::P2c {
            self.record_shed(iu, dropped);
        }
        if max_queue < plain_queue {
            let plain_dropped = (total.saturating_sub(cap)).saturating_sub(plain_queue);
            self.s.admission_refused += dropped - plain_dropped.min(dropped);
        }
        for d in 0..self.deps.len() {
            if self.guard_open(iu, d) {
                self.s.degraded += (served as f64 * self.deps[d].request_fraction) as u64;
            }
        }
        self.defences_after_tick(iu, now, served);
        // Late answers: the requests served now waited from about `before` to `after`
        // queued requests' worth of work (first in, first out), then took their worker
        // time; past the attempt's deadline the balancer has given up on them, though
        // the server did the work.
        let late_p = if served == 0 {
            0.0
        } else {
            let (w0, w1) = (before as f64 / drain, after as f64 / drain);
            match mixture {
                None => {
                    // Constant worker time.
                    let (lo, hi) = (w0.min(w1), w0.max(w1));
                    let edge = self.deadline - self.service.median();
                    if hi <= edge {
                        0.0
                    } else if lo > edge {
                        1.0
                    } else {
                        (hi - edge) / (hi - lo)
                    }
                }
                Some(m) => m.late_over(w0, w1, self.deadline),
            }
        };
        let late = self.rng.binomial(served, late_p);
        let p = self.request_fail_prob(iu, now);
        let failed = self.rng.binomial(served - late, p);
        let ok = served - late - failed;
        // A server that sheds answers 503 (load, never an ejection); one stopped in a GC
        // pause answers nothing: its overflow times out at the balancer.
        let (overflow, overflow_tally) = if paused > 0.0 {
            (
                RequestOutcome::Timeout,
                Tally {
                    timeout: dropped,
                    ..Tally::default()
                },
            )
        } else {
            (
                RequestOutcome::Response(503),
                Tally {
                    err: dropped,
                    ..Tally::default()
                },
            )
        };
        let mut all = Tally {
            ok,
            err: failed,
            refused: 0,
            timeout: late,
        };
        all.add(overflow_tally);
        if !feed {
            return (all, 0);
        }
        // Shed requests first (rejected on arrival), then the served mix.
        let mut consumed = 0;
        if dropped > 0 {
            consumed = self.feed_outcomes(i, 0, [(overflow, dropped), (overflow, 0)]);
            if consumed < dropped {
                let spill = (served + dropped - consumed).min(n);
                let kept = overflow_tally.total().min(consumed);
                let mut t = overflow_tally;
                t.err = t.err.min(kept);
                t.timeout = t.timeout.min(kept);
                return (t, spill);
            }
        }
        let c2 = self.feed_outcomes(
            i,
            ok,
            [
                (RequestOutcome::Response(500), failed),
                (RequestOutcome::Timeout, late),
            ],
        );
        consumed += c2;
        let outcomes = served + dropped;
        if c2 < served {
            let spill = (outcomes - consumed).min(n);
            // Outcomes before the ejection keep the tick's mix.
            let kept = outcomes - spill;
            let share = |x: u64| ((x as f64) * kept as f64 / outcomes.max(1) as f64).round() as u64;
            let kept_ok = share(ok).min(kept);
            let kept_late = share(late).min(kept - kept_ok);
            let t = Tally {
                ok: kept_ok,
                err: kept - kept_ok - kept_late,
                refused: 0,
                timeout: kept_late,
            };
            return (t, spill);
        }
        (all, 0)
    }

    pub(super) fn refresh_routes(&mut self) {
        if self.routes_dirty {
            self.routes = self.pool.routing_set(Self::pt(self.now));
            self.routes_dirty = false;
        }
    }

    /// Spreads `n` requests over the routing set; returns what the balancer saw and how
    /// many spilled.
    pub(super) fn distribute(&mut self, n: u64, feed: bool) -> (Tally, u64) {
        self.refresh_routes();
        let unrouted = Tally {
            err: n,
            ..Tally::default()
        };
        if self.routes.is_empty() {
            return (unrouted, 0);
        }
        let now = Self::pt(self.now);
        // Equal weights and no slow-start ramp (and, with P2C, servers alike): round-robin,
        // exactly (each target gets n / k, and the remainder goes to the next targets in
        // rotation, continuing where the last tick stopped). With P2C otherwise: its
        // sampled picks' shares (`balance.rs`). Otherwise: shares in proportion to
        // effective weight, rounded randomly (unbiased; with retries, systematically from one
        // random offset, so the shares add up to `n` exactly and every attempt sent is
        // accounted for).
        let w0 = self.routes.routes[0].weight;
        let uniform = w0 > 0
            && self.routes.routes.iter().all(|r| {
                r.weight == w0
                    && r.ramp
                        .is_none_or(|_| r.effective_weight(now) >= f64::from(w0))
            });
        // P2C (vigil's balancer) where the servers differ: sampled picks as weights.
        let p2c = self.cfg.lb.balance == Balance::P2c && self.p2c_weights(n, feed, uniform);
        let uniform = uniform && !p2c;
        let k = self.routes.routes.len() as u64;
        let (base, rem, off) = (n / k, n % k, self.rr % k);
        let mut total_w = 0.0;
        if uniform {
            self.rr = self.rr.wrapping_add(n);
        } else if p2c {
            total_w = 1.0;
        } else {
            self.weights.clear();
            for r in &self.routes.routes {
                let w = r.effective_weight(now);
                total_w += w;
                self.weights.push(w);
            }
            if total_w <= 0.0 {
                return (unrouted, 0);
            }
        }
        let systematic = (!uniform && (p2c || self.retrying.is_some())).then(|| self.rng.unit());
        let mut cum = 0.0;
        let mut given = 0u64;
        let mut tally = Tally::default();
        let mut spill = 0;
        let routes = std::mem::take(&mut self.routes.routes);
        for (j, r) in routes.iter().enumerate() {
            let nj = if uniform {
                base + u64::from((j as u64 + k - off) % k < rem)
            } else if let Some(u) = systematic {
                cum += n as f64 * self.weights[j] / total_w;
                let upto = if j + 1 == routes.len() {
                    n
                } else {
                    ((cum + u) as u64).min(n)
                };
                let nj = upto.saturating_sub(given);
                given += nj;
                nj
            } else {
                let share = n as f64 * self.weights[j] / total_w;
                (share + self.rng.unit()) as u64
            };
            self.served_tick[r.key as usize] = self.tick_no;
            if nj == 0 && self.servers[r.key as usize].backlog == 0 {
                continue;
            }
            let (t, s) = self.serve(r.key, nj, feed);
            tally.add(t);
            spill += s;
        }
        if self.routes.routes.is_empty() && !self.routes_dirty {
            self.routes.routes = routes;
        }
        (tally, spill)
    }

    pub(super) fn on_tick(&mut self) {
        let now = self.now;
        let dt = self.cfg.tick;
        self.tick_no += 1;
        // Readmissions, and the end of the dwell before leaving fail-open.
        if (self.ejected_count > 0 || self.fail_open_since.is_some())
            && let Some(d) = self.pool.next_deadline()
            && d <= Self::pt(now)
        {
            let ev = self.pool.tick(Self::pt(now));
            self.pool_events(ev);
        }
        // Leaving fail-open: the unhealthy servers' shares ramp down; a route whose ramp
        // ended must leave the set (it counts as in service while it is there).
        let leaving = self.pool.leaving_fail_open(Self::pt(now)).is_some();
        if leaving || self.leaving_fail_open {
            self.routes_dirty = true;
        }
        self.leaving_fail_open = leaving;
        self.refresh_routes();
        self.tick_fail_prob = self.fleet_fail_prob(now);
        self.tick_plain_punctual = self.plain_punctual(now);
        if let Some((load, ramp)) = self.surge_fault {
            self.surge = 1.0 + (load - 1.0) * ramp.map_or(1.0, |r| r.progress(now));
        }
        let base =
            self.cfg.clients.rate.unwrap_or(
                self.cfg.clients.load * self.capacity() * f64::from(self.cfg.fleet.servers),
            );
        let arrivals = self.rng.poisson(base * self.surge * dt.as_secs_f64());
        self.s.fresh_requests += arrivals;
        let attempts = match &mut self.retrying {
            Some(r) => r.start_tick(Self::pt(now), arrivals),
            None => arrivals,
        };
        self.s.tries += attempts;
        let (mut tally, spill) = self.distribute(attempts, true);
        if spill > 0 {
            let (t, _) = self.distribute(spill, false);
            tally.add(t);
        }
        // One pass over the fleet: servers out of the routing set still drain their
        // backlog; capacity counts.
        let (mut up_total, mut replacing, mut queued) = (0usize, 0usize, 0u64);
        for i in 0..self.servers.len() {
            if self.servers[i].backlog > 0 && self.served_tick[i] != self.tick_no {
                let (t, _) = self.serve(i as u32, 0, false);
                tally.add(t);
            }
            queued += self.servers[i].backlog;
            if self.is_up(i) {
                up_total += 1;
            } else if self.servers[i].life == Life::Booting && self.servers[i].replaced_while_up {
                replacing += 1;
            }
        }
        self.s.request_timeouts += tally.timeout;
        let (requests, failed) = match &mut self.retrying {
            Some(r) => {
                let out = r.finish_tick(Self::pt(now), &mut self.rng, tally, queued);
                self.s.client_retries += out.client_retries;
                self.s.lb_retries += out.lb_retries;
                self.s.lb_retries_denied += out.lb_denied;
                self.s.lb_retries_throttled += out.lb_throttled;
                (out.succeeded + out.failed, out.failed)
            }
            None => (tally.total(), tally.failed()),
        };
        self.s.requests += requests;
        self.s.client_errors += failed;
        let elapsed = now.as_elapsed();
        if self
            .cfg
            .faults
            .iter()
            .any(|f| f.at <= elapsed && f.duration.is_none_or(|d| elapsed < f.at + d))
        {
            self.s.during_faults.0 += requests;
            self.s.during_faults.1 += failed;
        }
        if requests > 0 && ((requests - failed) as f64) < RECOVERED * requests as f64 {
            self.last_bad_tick_end = Some(now + dt);
        }
        if self.cfg.queue.is_some() {
            self.queue_tick();
        }
        if self.pending_count > 0 {
            self.detect_tick();
        }
        self.refresh_routes();
        let in_service = self
            .routes
            .routes
            .iter()
            .filter(|r| self.is_up(r.key as usize))
            .count() as u32;
        let routed_up = in_service as usize;
        let removed = (up_total - routed_up.min(up_total)) + replacing;
        let frac = removed as f64 / self.servers.len() as f64;
        if frac > self.s.max_removed_fraction {
            self.s.max_removed_fraction = frac;
        }
        self.s.min_in_service = self.s.min_in_service.min(in_service);
        self.in_service_sum += f64::from(in_service);
        self.ticks += 1;
        let fail_open = self.pool.fail_open().is_some();
        let b = (now.as_elapsed().as_nanos() / self.bucket.as_nanos()) as usize;
        if self.series.len() <= b {
            self.series.push(Sample {
                t: (self.bucket * b as u32).as_secs_f64(),
                in_service_min: in_service,
                ..Sample::default()
            });
        }
        let smp = self.series.last_mut().expect("pushed above");
        smp.requests += requests;
        smp.failures += failed;
        smp.in_service_min = smp.in_service_min.min(in_service);
        if fail_open {
            smp.fail_open += dt.as_secs_f64() / self.bucket.as_secs_f64();
        }
        smp.up = up_total as u32;
        self.schedule(now + dt, Ev::Tick);
    }
}
