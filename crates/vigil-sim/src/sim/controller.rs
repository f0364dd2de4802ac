//! The controller driver: `/health` probes, vigil-core's `SafetyGuard` (or the naive
//! thresholds), the peer comparison of queue workers, replacements and restarts.
//!
//! The composition of the guard with the peer comparison (which worker is an
//! outlier, how that fails its observation, which decisions count) is
//! `vigil_core::fleet`'s, the very functions `vigil controller` calls.

use super::engine::Ev;
use super::model::{Growth, Life, Ramped};
use super::{CHECK_PEER, DecisionMark, Sim, TIMEOUT};
use crate::scenario::{ControllerMode, GuardStateStore};
use std::time::Duration;
use vigil_core::anomaly::{AnomalyDetector, Counts};
use vigil_core::fleet::{DecisionKind, Effect, Input, judge_peers, peer_check, step};
use vigil_core::gate::WorkerGate;
use vigil_core::guard::{GuardEvent, Observation, SafetyGuard};
use vigil_core::{HealthState, Thresholds};

impl<'a> Sim<'a> {
    pub(super) fn on_ctl_probe(&mut self, i: u32) {
        let now = self.now;
        let iu = i as usize;
        if !self.ctl.up || self.servers[iu].life == Life::Booting {
            return;
        }
        if Self::pt(now) < self.ctl.grace_end[iu] {
            return;
        }
        let p = self.probe(iu, now, true, self.cfg.controller.timeout);
        if p.detail == TIMEOUT {
            self.s.check_timeouts += 1;
        }
        // A queue worker reports its counters with its health; the controller compares
        // it with its peers, and an outlier fails the peer check.
        let mut peer = 0;
        if self.cfg.queue.is_some() && self.cfg.controller.mode == ControllerMode::Guarded {
            let totals = self.msg_totals[iu];
            self.ctl
                .anomaly
                .record_totals(Self::pt(now), &self.ctl_ids[iu], "", totals);
            if self.ctl.outlier[iu] {
                peer = CHECK_PEER;
            }
        }
        let need = self.cfg.controller.guard.thresholds.healthy_threshold + 1;
        if p.ok && peer == 0 && self.ctl.passes_fed[iu] >= need {
            return;
        }
        self.schedule(
            now + p.latency,
            Ev::CtlProbeDone {
                server: i,
                incarnation: self.servers[iu].incarnation,
                endpoint_failed: p.endpoint_failed,
                failing: p.failing | peer,
            },
        );
    }

    pub(super) fn on_ctl_probe_done(
        &mut self,
        i: u32,
        incarnation: u32,
        endpoint_failed: bool,
        failing: u32,
    ) {
        let iu = i as usize;
        if !self.ctl.up || incarnation != self.servers[iu].incarnation {
            return;
        }
        let ok = !endpoint_failed && failing == 0;
        self.ctl.passes_fed[iu] = if ok {
            self.ctl.passes_fed[iu].saturating_add(1)
        } else {
            0
        };
        let now = Self::pt(self.now);
        match self.cfg.controller.mode {
            ControllerMode::Off => {}
            ControllerMode::Naive => {
                if let Some(t) = self.ctl.naive[iu].observe(now, ok)
                    && t.to == HealthState::Unhealthy
                {
                    self.note(format!(
                        "controller (naive): {} unhealthy after {} failed probes: replacing",
                        self.ctl_ids[iu], t.streak
                    ));
                    self.replace(iu);
                }
            }
            ControllerMode::Guarded => {
                let zone = &self.zone_names[self.servers[iu].zone as usize];
                // The probe carries the peer comparison's verdict as of its start (the
                // `CHECK_PEER` bit); the engine composes it into the observation.
                let mut obs = Observation {
                    target: self.ctl_ids[iu].clone(),
                    zone: zone.clone(),
                    endpoint_failed,
                    failing_checks: self.check_names(failing & !CHECK_PEER),
                    disputed: false,
                };
                peer_check(&mut obs, failing & CHECK_PEER != 0);
                let effects = step(&mut self.ctl.guard, now, Input::Probe(obs));
                self.guard_events(&effects);
                for e in effects {
                    match e {
                        Effect::Decide(DecisionKind::Act, d) => {
                            self.note(format!("controller: {d}"));
                            self.replace(iu);
                        }
                        Effect::Decide(DecisionKind::HoldBack, d) => {
                            self.s.controller_holds += 1;
                            self.note(format!("controller: {d}"));
                        }
                        Effect::Decide(DecisionKind::Alert, _)
                        | Effect::Log(_)
                        | Effect::Event(_)
                        | Effect::Refused(_) => {}
                    }
                }
            }
        }
    }

    pub(super) fn on_ctl_round(&mut self) {
        let now = self.now;
        self.schedule(now + self.cfg.controller.interval, Ev::CtlRound);
        if self.ctl.up && self.cfg.controller.mode == ControllerMode::Guarded {
            let effects = step(&mut self.ctl.guard, Self::pt(now), Input::Tick);
            self.guard_events(&effects);
            if self.cfg.queue.is_some() {
                self.judge_workers();
            }
        }
    }

    /// The controller compares the queue workers with their peers (`vigil_core::anomaly`,
    /// as `vigil controller` does each round) and notes a worker that becomes, or stops
    /// being, an outlier.
    pub(super) fn judge_workers(&mut self) {
        let pnow = Self::pt(self.now);
        let (ids, was) = (&self.ctl_ids, &self.ctl.outlier);
        let judged = judge_peers(&mut self.ctl.anomaly, pnow, |member| {
            ids.iter()
                .position(|id| id == member)
                .is_some_and(|i| was[i])
        });
        for (v, changed) in judged {
            let Some(i) = self.ctl_ids.iter().position(|id| *id == v.member) else {
                continue;
            };
            if let Some(now_outlier) = changed {
                self.ctl.outlier[i] = now_outlier;
                self.note(if now_outlier {
                    format!("controller: worker fails far more than its peers: {v}")
                } else {
                    format!("controller: worker no longer an outlier: {v}")
                });
            }
        }
    }

    /// Counts and notes the guard's events among a step's effects.
    pub(super) fn guard_events(&mut self, effects: &[Effect]) {
        for e in effects.iter().filter_map(|e| match e {
            Effect::Event(ev) => Some(ev),
            _ => None,
        }) {
            let kind = match e {
                GuardEvent::Frozen { .. } => {
                    self.s.freezes += 1;
                    Some("freeze")
                }
                GuardEvent::FreezeAlert { .. } => {
                    self.s.freeze_alerts += 1;
                    Some(DecisionKind::Alert.as_str())
                }
                GuardEvent::Unfrozen { .. } => Some("unfreeze"),
                _ => None,
            };
            let line = e.to_string();
            if let Some(kind) = kind {
                self.decide_mark(kind, &line);
            }
            self.note(format!("guard: {line}"));
        }
    }

    /// Marks a policy decision on the charts.
    pub(super) fn decide_mark(&mut self, kind: &'static str, label: &str) {
        self.decisions.push(DecisionMark {
            t: self.now.as_elapsed().as_secs_f64(),
            kind,
            label: label.to_string(),
        });
    }

    pub(super) fn replace(&mut self, i: usize) {
        self.s.controller_actions += 1;
        let was_up = self.is_up(i);
        let now = self.now;
        if self.cfg.controller.mode == ControllerMode::Guarded {
            self.ctl
                .guard
                .remove_target(Self::pt(now), &self.ctl_ids[i]);
        }
        let s = &mut self.servers[i];
        s.incarnation += 1;
        s.life = Life::Booting;
        s.replaced_while_up = was_up;
        s.backlog = 0;
        let incarnation = s.incarnation;
        // Replacing a faulty server takes it out of service: that is a detection (at 0 s
        // when it happens before the fault does harm, e.g. a disk at 95%).
        if let Some(at) = self.pending_detect[i].take() {
            self.pending_count -= 1;
            self.detect_times.push(now.since(at));
        }
        self.schedule(
            now + self.cfg.fleet.boot_time,
            Ev::Boot {
                server: i as u32,
                incarnation,
            },
        );
    }

    pub(super) fn on_boot(&mut self, i: u32, incarnation: u32) {
        let iu = i as usize;
        let now = self.now;
        if self.servers[iu].incarnation != incarnation || self.servers[iu].life == Life::Up {
            return;
        }
        let zone_down = self.zone_down[self.servers[iu].zone as usize];
        let f = &self.cfg.fleet;
        let phase = Duration::from_nanos(
            self.rng
                .below(f.dependency_check_interval.as_nanos() as u64),
        );
        let s = &mut self.servers[iu];
        s.replaced_while_up = false;
        if zone_down {
            // The zone is gone: the new instance never answers, and the controller sees
            // it as a new instance (grace period, then probes).
            s.life = Life::Down;
            self.controller_meets_new_instance(iu);
            return;
        }
        s.life = Life::Up;
        s.boot_at = now;
        s.phase = phase;
        s.disk = Growth::flat(f.disk_used);
        s.fds = Growth::flat(f64::from(f.fds_used));
        s.gc = None;
        s.checker_dead_at = None;
        s.conn_broken = None;
        s.gray = Ramped::default();
        s.slow = Ramped::default();
        s.backlog = 0;
        self.defences[iu] = self.fresh_defences(now);
        // A new worker: a fresh gate, counters from zero.
        self.msg_totals[iu] = Counts::default();
        if let (Some(g), Some(q)) = (self.gates.get_mut(iu), &self.cfg.queue) {
            *g = WorkerGate::new(q.worker.clone(), Self::pt(now));
        }
        self.controller_meets_new_instance(iu);
        if self.servers[iu].bad_version && self.deploy_error_rate() > 0.0 {
            self.harm(iu, now);
        }
    }

    /// A new instance in slot `i`: the controller starts its grace period.
    pub(super) fn controller_meets_new_instance(&mut self, i: usize) {
        let pnow = Self::pt(self.now);
        self.ctl.passes_fed[i] = 0;
        self.ctl.grace_end[i] = pnow + self.cfg.controller.guard.grace;
        match self.cfg.controller.mode {
            ControllerMode::Guarded => {
                let zone = self.zone_names[self.servers[i].zone as usize].clone();
                self.ctl.guard.add_target(pnow, &self.ctl_ids[i], &zone);
            }
            ControllerMode::Naive => {
                self.ctl.naive[i] =
                    Thresholds::new_unknown(self.cfg.controller.guard.thresholds, pnow);
            }
            ControllerMode::Off => {}
        }
    }

    pub(super) fn on_controller_up(&mut self) {
        let pnow = Self::pt(self.now);
        self.ctl.up = true;
        let n = self.servers.len();
        let cfg = self.cfg.controller.guard.clone();
        self.ctl.guard = match self.cfg.controller.state {
            GuardStateStore::Persisted => {
                // What the store holds: the state after the last decision, serialised.
                let saved =
                    serde_json::to_string(self.ctl.guard.state()).expect("guard state serialises");
                let state = serde_json::from_str(&saved).expect("guard state deserialises");
                SafetyGuard::restore(cfg, state)
            }
            GuardStateStore::InMemory => {
                let mut g = SafetyGuard::new(cfg);
                for i in 0..n {
                    let zone = &self.zone_names[self.servers[i].zone as usize];
                    g.add_target(pnow, &self.ctl_ids[i], zone);
                }
                g
            }
        };
        self.ctl.anomaly = AnomalyDetector::new(self.cfg.controller.anomaly.clone());
        self.ctl.outlier = vec![false; n];
        for i in 0..n {
            self.ctl.naive[i] = Thresholds::new_unknown(self.cfg.controller.guard.thresholds, pnow);
            self.ctl.passes_fed[i] = 0;
            if self.cfg.controller.state == GuardStateStore::InMemory {
                self.ctl.grace_end[i] = pnow + self.cfg.controller.guard.grace;
            }
        }
        self.note(format!(
            "controller restarted ({} guard state)",
            match self.cfg.controller.state {
                GuardStateStore::Persisted => "persisted",
                GuardStateStore::InMemory => "fresh, in-memory",
            }
        ));
    }
}
