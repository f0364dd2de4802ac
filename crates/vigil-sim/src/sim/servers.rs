//! The server model's answers: capacity, request failure, dependency calls, and the
//! health checks (`/readyz`, `/health`) and probes computed from a server's state.

use super::model::{Life, Probe};
use super::{
    CHECK_DEP0, CHECK_DISK, CHECK_FDS, CHECK_SELFTEST, CHECK_WATCHDOG, DISK_FAIL, DISK_WARN,
    FDS_FAIL, LOCAL_CHECK_NAMES, RESERVED_HEALTH_LATENCY, Sim, TIMEOUT, WATCHDOG_STALE_INTERVALS,
};
use crate::latency::Mixture;
use crate::rng::hash_unit;
use crate::scenario::{DepCriticality, HealthCapacity, Readiness, Switch};
use std::time::Duration;
use vigil_core::{Criticality, Status, Time};

impl<'a> Sim<'a> {
    pub(super) fn is_up(&self, i: usize) -> bool {
        let s = &self.servers[i];
        s.life == Life::Up && !self.zone_down[s.zone as usize]
    }

    pub(super) fn capacity(&self) -> f64 {
        self.cap_rate
    }

    pub(super) fn fds_exhausted(&self, i: usize, now: Time) -> bool {
        self.servers[i].fds.at(now) >= f64::from(self.cfg.fleet.fd_limit)
    }

    pub(super) fn disk_full(&self, i: usize, now: Time) -> bool {
        self.servers[i].disk.at(now) >= 1.0
    }

    /// Dependency `d` as server `i` sees it at `t`: its error rate, and its extra latency
    /// in seconds (beyond its typical latency, which is part of the service time).
    pub(super) fn dep_for(&self, i: usize, d: usize, t: Time) -> (f64, f64) {
        let dep = &self.deps[d];
        let c = dep.cond_at(t);
        let base = dep.history[0].1;
        let reaches = c.affected >= 1.0
            || hash_unit(self.seed, &[0xDE9, d as u64, c.key, i as u64]) < c.affected;
        let (mut err, extra) = if reaches {
            (c.error_rate_at(t), c.extra_at(t))
        } else {
            (base.error_rate, 0.0)
        };
        if let Some((bd, since, until)) = self.servers[i].conn_broken
            && bd == d
            && since <= t
            && until.is_none_or(|u| t < u)
        {
            err = 1.0;
        }
        (err, extra)
    }

    /// Whether server `i` has no fault of its own (its requests fail only through
    /// dependencies, like every other such server).
    pub(super) fn is_plain(&self, i: usize) -> bool {
        let s = &self.servers[i];
        s.gc.is_none()
            && s.disk.rate == 0.0
            && s.disk.base < 1.0
            && s.fds.rate == 0.0
            && s.gray.is_zero()
            && s.slow.is_zero()
            && !s.bad_version
            && s.conn_broken.is_none()
            && !self.defences[i].degraded
    }

    /// The failure probability of a plain server's requests at `now`, when it is the same
    /// for every plain server (no partial dependency failure); `None` otherwise. (Slow
    /// dependencies make requests late, not failed: see [`Sim::mixture`].)
    pub(super) fn fleet_fail_prob(&self, now: Time) -> Option<f64> {
        let mut ok = 1.0;
        for dep in &self.deps {
            let c = dep.cond_at(now);
            if c.affected < 1.0 {
                return None;
            }
            let err = c.error_rate_at(now);
            if err > 0.0 && dep.criticality == DepCriticality::Critical {
                ok *= 1.0 - dep.request_fraction * err;
            }
        }
        Some((1.0 - ok).clamp(0.0, 1.0))
    }

    /// Whether a plain server's requests all take the same time at `now`, under the
    /// attempt deadline when they do not queue.
    pub(super) fn plain_punctual(&self, now: Time) -> bool {
        self.service.is_constant()
            && self.service.median() <= self.deadline
            && self
                .deps
                .iter()
                .all(|d| d.cond_at(now).extra_at(now) == 0.0)
    }

    /// The worker time of server `i`'s requests at `now`: the service time, plus its
    /// host's slowness, plus the extra latency of each dependency for the requests that
    /// call it (a request waiting on a dependency holds its worker).
    pub(super) fn mixture(&self, i: usize, now: Time) -> Mixture {
        let mut m = Mixture::new(self.service, self.servers[i].slow.at(now));
        for d in 0..self.deps.len() {
            // Answered degraded, a request does not wait on the dependency.
            if self.guard_open(i, d) {
                continue;
            }
            let (_, extra) = self.dep_for(i, d, now);
            m.split(self.deps[d].request_fraction, extra);
        }
        m
    }

    /// Requests/s server `i` serves at `now` (before brownout and pauses).
    pub(super) fn server_rate(&self, i: usize, now: Time) -> f64 {
        if self.is_plain(i) && self.tick_plain_punctual {
            return self.cap_rate;
        }
        f64::from(self.cfg.fleet.workers) / self.mixture(i, now).mean()
    }

    /// Probability that a request served by `i` at `now` fails.
    pub(super) fn request_fail_prob(&self, i: usize, now: Time) -> f64 {
        if let Some(p) = self.tick_fail_prob
            && self.is_plain(i)
        {
            return p;
        }
        let s = &self.servers[i];
        if self.disk_full(i, now) {
            return 1.0;
        }
        let mut ok = 1.0 - s.gray.at(now);
        if s.bad_version {
            ok *= 1.0 - self.deploy_error_rate();
        }
        for d in 0..self.deps.len() {
            if self.guard_open(i, d) {
                // Degraded: the cache answers its share, the rest fail at once.
                ok *= 1.0 - self.deps[d].request_fraction * (1.0 - self.deps[d].degraded);
                continue;
            }
            let (err, _) = self.dep_for(i, d, now);
            if err > 0.0 && self.deps[d].criticality == DepCriticality::Critical {
                ok *= 1.0 - self.deps[d].request_fraction * err;
            }
        }
        (1.0 - ok).clamp(0.0, 1.0)
    }

    pub(super) fn deploy_error_rate(&self) -> f64 {
        self.deployments
            .last()
            .and_then(|d| self.cfg.faults[d.fault as usize].error_rate)
            .unwrap_or(0.0)
    }

    pub(super) fn deploy_readiness_fails(&self) -> bool {
        self.deployments.last().is_some_and(|d| {
            self.cfg.faults[d.fault as usize]
                .readiness
                .unwrap_or_default()
                == Readiness::Fails
        })
    }

    /// The background checker's last completed run at `now`: its time and index.
    pub(super) fn last_check_run(&self, i: usize, now: Time) -> (Time, u64) {
        let s = &self.servers[i];
        let horizon = s.checker_dead_at.map_or(now, |d| d.min(now));
        let first = s.boot_at + s.phase;
        if horizon < first {
            return (s.boot_at, u64::MAX);
        }
        // u64 nanoseconds (584 years) rather than u128: this runs on every probe.
        let interval = self.cfg.fleet.dependency_check_interval.as_nanos() as u64;
        let k = horizon.since(first).as_nanos() as u64 / interval;
        (first + Duration::from_nanos(k * interval), k)
    }

    /// The server's health checks at `now`: a bitmask of failing checks and the aggregate
    /// status, `deep` adding the dependency snapshot.
    pub(super) fn checks(&self, i: usize, now: Time, deep: bool) -> (u32, Status) {
        let s = &self.servers[i];
        let f = &self.cfg.fleet;
        let mut failing = 0u32;
        // vigil-core's aggregation, folded as we go: worst of the weighted statuses.
        let mut status = Status::Pass;
        let mut add = |st: Status, crit: Criticality| status = status.worst(st.weighted(crit));
        let disk = s.disk.at(now);
        if disk >= DISK_FAIL {
            failing |= CHECK_DISK;
            add(Status::Fail, Criticality::Critical);
        } else if disk >= DISK_WARN {
            add(Status::Warn, Criticality::Critical);
        }
        if s.fds.at(now) >= FDS_FAIL * f64::from(f.fd_limit) {
            failing |= CHECK_FDS;
            add(Status::Fail, Criticality::Critical);
        }
        let (last_run, k) = self.last_check_run(i, now);
        if f.watchdog == Switch::On {
            let stale =
                f.dependency_check_interval * WATCHDOG_STALE_INTERVALS + f.dependency_check_timeout;
            if now.since(last_run) > stale {
                failing |= CHECK_WATCHDOG;
                add(Status::Fail, Criticality::Critical);
            }
        }
        if s.bad_version && self.deploy_readiness_fails() {
            failing |= CHECK_SELFTEST;
            add(Status::Fail, Criticality::Critical);
        }
        if s.backlog > 0 {
            // Saturation only warns: a busy server is still a server.
            add(Status::Warn, Criticality::Critical);
        }
        if deep {
            for d in 0..self.deps.len().min(32 - CHECK_DEP0 as usize) {
                let (err, extra) = self.dep_for(i, d, last_run);
                // The check times out when the dependency answers slower than its timeout.
                let lat = self.deps[d].latency.as_secs_f64() + extra;
                let failed = lat > f.dependency_check_timeout.as_secs_f64()
                    || (err > 0.0
                        && hash_unit(
                            self.seed,
                            &[i as u64, u64::from(s.incarnation), k, d as u64],
                        ) < err);
                if failed {
                    let crit = match self.deps[d].criticality {
                        DepCriticality::Critical => {
                            failing |= 1 << (CHECK_DEP0 + d as u32);
                            Criticality::Critical
                        }
                        DepCriticality::NonCritical => Criticality::NonCritical,
                    };
                    add(Status::Fail, crit);
                }
            }
        }
        (failing, status)
    }

    /// Probes server `i`'s `/readyz` (or `/health` when `deep`) at `now`.
    pub(super) fn probe(&self, i: usize, now: Time, deep: bool, timeout: Duration) -> Probe {
        let fail = |latency, detail| Probe {
            ok: false,
            latency,
            endpoint_failed: true,
            failing: 0,
            detail,
        };
        if !self.is_up(i) {
            return fail(Duration::ZERO, "connection refused");
        }
        if self.fds_exhausted(i, now) {
            return fail(Duration::ZERO, "connection reset: accept failed (EMFILE)");
        }
        let s = &self.servers[i];
        if self.cfg.fleet.health_capacity == HealthCapacity::Shared && s.shedding {
            // A probe is a request like any other: a full queue sheds it.
            return fail(self.cfg.fleet.service_time, "HTTP 503 shed");
        }
        let mut latency = s.gc.and_then(|g| g.remaining(now)).unwrap_or_default();
        // A slow host answers health checks slowly too, on whatever thread.
        let slow = Duration::from_secs_f64(s.slow.at(now));
        latency += slow
            + match self.cfg.fleet.health_capacity {
                HealthCapacity::Reserved => RESERVED_HEALTH_LATENCY,
                HealthCapacity::Shared => {
                    // Behind the whole queue, drained at the (browned-out) service rate.
                    let eff = if s.overloaded {
                        1.0 - self.cfg.fleet.brownout
                    } else {
                        1.0
                    };
                    Duration::from_secs_f64(s.backlog as f64 / (self.server_rate(i, now) * eff))
                        + self.cfg.fleet.service_time
                }
            };
        if latency > timeout {
            return fail(timeout, TIMEOUT);
        }
        let (failing, status) = self.checks(i, now, deep);
        let ok = status != Status::Fail;
        Probe {
            ok,
            latency,
            endpoint_failed: false,
            failing,
            detail: if ok { "HTTP 200" } else { "HTTP 503 fail" },
        }
    }

    pub(super) fn check_names(&self, mask: u32) -> Vec<String> {
        let mut v = Vec::new();
        for (b, name) in LOCAL_CHECK_NAMES.iter().enumerate() {
            if mask & (1 << b) != 0 {
                v.push((*name).to_string());
            }
        }
        for (d, name) in self.dep_check_names.iter().enumerate() {
            if mask & (1 << (CHECK_DEP0 + d as u32)) != 0 {
                v.push(name.clone());
            }
        }
        v
    }
}
