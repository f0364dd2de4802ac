//! The controller driver: `/health` probes, vigil-core's fleet [`Replica`] (the guard
//! with its mode and the batch not yet committed, as `vigil controller` drives it) or
//! the naive thresholds, the peer comparison of queue workers, its store, replacements
//! and restarts.
//!
//! The composition of the guard with the peer comparison (which worker is an
//! outlier, how that fails its observation, which decisions count) is
//! `vigil_core::fleet`'s, the very functions `vigil controller` calls; so are the
//! journal and its failure paths: a decision is acted on only once its batch is in the
//! store, a failed commit never happened (the guard is put back as the store has it),
//! a restart rebuilds the guard from the store and loses the batch not yet committed,
//! a successor's term fences the batch of the leader it replaced.

use super::engine::Ev;
use super::model::{Growth, Life, Ramped};
use super::{CHECK_PEER, DecisionMark, Sim, TIMEOUT};
use crate::scenario::{ControllerMode, GuardStateStore};
use std::time::Duration;
use vigil_core::anomaly::{AnomalyDetector, Counts};
use vigil_core::fleet::{
    AfterCommit, Commit, DecisionKind, Effect, Input, Judged, Replica, Stored, Uncommitted,
    judge_peers, peer_check, tally_dissent,
};
use vigil_core::gate::WorkerGate;
use vigil_core::guard::{GuardEvent, Observation, Op, SafetyGuard};
use vigil_core::shard::{Report, agree, fresh_for};
use vigil_core::{HealthState, Thresholds};

/// While the store fails, how often the controller tries it again (`vigil
/// controller`'s `STORE_RETRY_EVERY`).
const STORE_RETRY_EVERY: Duration = Duration::from_secs(1);

impl<'a> Sim<'a> {
    pub(super) fn on_ctl_probe(&mut self, i: u32) {
        let now = self.now;
        let iu = i as usize;
        if !self.ctl.up || self.servers[iu].life == Life::Booting {
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
        // Sharded probing: which of the target's probers cannot reach it.
        let cut = match &self.ctl.shard {
            Some(sh) => sh
                .probers_of(&self.ctl_ids[iu])
                .iter()
                .enumerate()
                .filter(|(_, p)| self.ctl.cut[replica_index(p)])
                .fold(0u16, |m, (k, _)| m | (1 << k)),
            None => 0,
        };
        self.schedule(
            now + p.latency,
            Ev::CtlProbeDone {
                server: i,
                incarnation: self.servers[iu].incarnation,
                endpoint_failed: p.endpoint_failed,
                failing: p.failing | peer,
                cut,
            },
        );
    }

    pub(super) fn on_ctl_probe_done(
        &mut self,
        i: u32,
        incarnation: u32,
        endpoint_failed: bool,
        failing: u32,
        cut: u16,
    ) {
        let iu = i as usize;
        if !self.ctl.up || incarnation != self.servers[iu].incarnation {
            return;
        }
        let ok = !endpoint_failed && failing == 0;
        // The naive controller acts on any prober's failure: one cut off from the
        // target sees it fail.
        let naive_ok = ok && cut == 0;
        let now = Self::pt(self.now);
        match self.cfg.controller.mode {
            ControllerMode::Off => {}
            ControllerMode::Naive => {
                if let Some(t) = self.ctl.naive[iu].observe(now, naive_ok)
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
                let input = match self.ctl.shard.as_ref() {
                    None => Input::Probe(obs),
                    Some(sh) => {
                        // The leader judges by the agreement of the target's probers,
                        // each fresh (they probe on the same tick here); a prober cut
                        // off sees the endpoint fail.
                        let probers = sh.probers_of(&obs.target);
                        let reports: Vec<Option<Report>> = (0..probers.len())
                            .map(|k| {
                                Some(Report {
                                    failing: !ok || cut & (1 << k) != 0,
                                    age: Duration::ZERO,
                                })
                            })
                            .collect();
                        let c = &self.cfg.controller;
                        let fresh = fresh_for(c.interval, c.timeout);
                        tally_dissent(&mut self.ctl.tally, &probers, &reports, fresh);
                        let (id, zone) = (obs.target.clone(), obs.zone.clone());
                        let judged =
                            Judged::of(agree(&reports, fresh), &id, &zone, || (!ok).then_some(obs));
                        Input::Agreed { id, judged }
                    }
                };
                let turn = self.ctl.replica.step(now, input);
                self.guard_events(&turn.effects);
                self.ctl_flush();
            }
        }
    }

    pub(super) fn on_ctl_round(&mut self) {
        let now = self.now;
        self.schedule(now + self.cfg.controller.interval, Ev::CtlRound);
        if self.ctl.up && self.cfg.controller.mode == ControllerMode::Guarded {
            let turn = self.ctl.replica.step(Self::pt(now), Input::Tick);
            self.guard_events(&turn.effects);
            if self.cfg.queue.is_some() {
                self.judge_workers();
            }
            if self.ctl.shard.is_some() {
                self.check_dissent();
            }
            self.ctl_flush();
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

    /// The leader's dissent rule over this interval's verdicts, as `vigil controller`
    /// runs it: a replica failing most of its targets alone is said to be cut off,
    /// once when it starts and once when it ends.
    fn check_dissent(&mut self) {
        let tally = std::mem::take(&mut self.ctl.tally);
        let round = self.ctl.dissent.judge(&tally);
        for d in round.started {
            self.note(format!(
                "controller: replica {} fails {} of the {} targets it probes while their other probers pass them: it is likely cut off from the targets; the guard holds the actions they would need",
                d.replica, d.alone, d.fresh
            ));
        }
        for r in round.ended {
            self.note(format!(
                "controller: replica {r} agrees with the other probers again"
            ));
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
        self.ctl_member(i, None);
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

    /// A new instance in slot `i`: the controller starts its grace period (the guard's,
    /// as a target added to `vigil controller`'s list).
    pub(super) fn controller_meets_new_instance(&mut self, i: usize) {
        let pnow = Self::pt(self.now);
        match self.cfg.controller.mode {
            ControllerMode::Guarded => {
                self.ctl_member(i, Some(self.servers[i].incarnation));
                self.ctl_flush();
            }
            ControllerMode::Naive => {
                self.ctl.naive[i] =
                    Thresholds::new_unknown(self.cfg.controller.guard.thresholds, pnow);
            }
            ControllerMode::Off => {}
        }
    }

    /// The fleet lists instance `incarnation` in slot `i` (None: none, it is being
    /// replaced). While the controller judges, the guard learns it now (journaled);
    /// otherwise it waits for the next batch that can commit, as `vigil controller`'s
    /// target lists do.
    fn ctl_member(&mut self, i: usize, incarnation: Option<u32>) {
        if self.cfg.controller.mode != ControllerMode::Guarded {
            return;
        }
        self.ctl.listed[i] = incarnation;
        if self.ctl.up && self.ctl.replica.mode().judges() {
            self.ctl_apply_member(i);
        }
    }

    /// Brings the guard's knowledge of slot `i` to what the fleet lists: a replaced
    /// instance is removed, a new one added (in its grace period).
    fn ctl_apply_member(&mut self, i: usize) {
        let pnow = Self::pt(self.now);
        let id = self.ctl_ids[i].clone();
        let listed = self.ctl.listed[i];
        let known = self.ctl.replica.guard().target(pnow, &id).is_some();
        if known {
            let op = Op::Remove {
                at: pnow,
                id: id.clone(),
            };
            self.ctl.replica.apply(pnow, op, Some(&id));
        }
        if listed.is_some() {
            let zone = self.zone_names[self.servers[i].zone as usize].clone();
            let op = Op::Add {
                at: pnow,
                id: id.clone(),
                zone,
            };
            self.ctl.replica.apply(pnow, op, Some(&id));
        }
        self.ctl.members.push((i, listed));
    }

    /// Every slot whose listed instance is not the one the guard knows as committed
    /// (after a restart, a failover or a failed commit): brought up to date.
    fn ctl_reconcile(&mut self) {
        for i in 0..self.servers.len() {
            if self.ctl.listed[i] != self.ctl.committed[i] {
                self.ctl_apply_member(i);
            }
        }
    }

    /// Commits the replica's batch, as `vigil controller` does after every turn of its
    /// loop (one commit at a time: the next waits for the one under way).
    pub(super) fn ctl_flush(&mut self) {
        if !self.ctl.up
            || self.cfg.controller.mode != ControllerMode::Guarded
            || self.ctl.store.in_flight.is_some()
        {
            return;
        }
        if self.ctl.replica.mode().follows() {
            self.ctl.members.clear();
        }
        let Some(batch) = self.ctl.replica.take() else {
            return;
        };
        let members = std::mem::take(&mut self.ctl.members);
        self.ctl.store.commits += 1;
        let n = self.ctl.store.commits;
        self.ctl.store.in_flight = Some((n, batch, members));
        if self.ctl.store.latency.is_zero() {
            self.on_ctl_committed(n);
        } else {
            let at = self.now + self.ctl.store.latency;
            self.schedule(at, Ev::CtlCommitted(n));
        }
    }

    /// Commit number `n` reaches the store: written (its acts run, once), refused (a
    /// successor's term: fenced, its acts never run), or failed (undone).
    pub(super) fn on_ctl_committed(&mut self, n: u32) {
        if !matches!(&self.ctl.store.in_flight, Some((m, ..)) if *m == n) {
            return; // Lost with a restart.
        }
        let (_, batch, members) = self.ctl.store.in_flight.take().expect("matched above");
        let acts = acts(&batch);
        if batch.epoch != self.ctl.store.epoch {
            self.note(format!(
                "controller: another replica took over: this batch is rolled back and its {acts} action(s) are NOT run"
            ));
            self.ctl_flush();
            return;
        }
        if self.ctl.store.down {
            let after = self
                .ctl
                .replica
                .committed(Commit::Failed("store unreachable".into()));
            if after == (AfterCommit::Undo { first: true }) {
                self.note(format!(
                    "controller: store failing: the batch is undone, its {acts} action(s) are NOT run; nothing is judged until it works again"
                ));
            }
            self.ctl_read_store();
            self.ctl_schedule_retry();
            return;
        }
        self.ctl.store.stored.commit(&batch);
        for (i, inc) in members {
            self.ctl.committed[i] = inc;
        }
        if self.ctl.replica.committed(Commit::Done) == AfterCommit::Recovered {
            self.note("controller: the store took the batch: judging resumes".into());
        }
        for e in batch.effects {
            match e {
                Effect::Decide(DecisionKind::Act, d) => {
                    if let Some(i) = self.ctl_ids.iter().position(|id| *id == d.target) {
                        self.ctl.store.intended.push(i);
                    }
                    self.note(format!("controller: {d}"));
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
        self.ctl_run_intended();
        self.ctl_flush();
    }

    /// Runs the committed actions not yet run (once each: a restarted controller or a
    /// successor resumes those its predecessor left intended).
    fn ctl_run_intended(&mut self) {
        if !self.ctl.up {
            return;
        }
        for i in std::mem::take(&mut self.ctl.store.intended) {
            self.replace(i);
        }
    }

    /// Puts the guard back as the store holds it (a store that is down cannot be read:
    /// the guard stays ahead of it until it can).
    fn ctl_read_store(&mut self) -> bool {
        if self.ctl.store.down {
            return false;
        }
        let now = Self::pt(self.now);
        self.ctl
            .replica
            .restore(&self.ctl.store.stored, now)
            .expect("the simulator's store holds what the replica wrote");
        true
    }

    fn ctl_schedule_retry(&mut self) {
        if !self.ctl.store.retry_scheduled {
            self.ctl.store.retry_scheduled = true;
            self.schedule(self.now + STORE_RETRY_EVERY, Ev::CtlRetry);
        }
    }

    /// The failing store's retry: the guard as committed, what waited applied, and a
    /// snapshot of it all committed (or undone again).
    pub(super) fn on_ctl_retry(&mut self) {
        self.ctl.store.retry_scheduled = false;
        if !self.ctl.up || self.ctl.replica.mode().judges() || self.ctl.replica.mode().follows() {
            return;
        }
        if self.ctl.replica.mode().dirty() && !self.ctl_read_store() {
            self.ctl_schedule_retry();
            return;
        }
        self.ctl.replica.retry();
        self.ctl_reconcile();
        self.ctl.replica.snapshot(Self::pt(self.now), None);
        self.ctl_flush();
    }

    /// A successor takes the lease over (`leader_failover`): a new term, the guard as
    /// the store holds it, the actions its predecessor left intended resumed.
    pub(super) fn on_ctl_lead(&mut self) {
        let epoch = self.ctl.store.epoch.map_or(2, |e| e + 1);
        self.ctl.store.epoch = Some(epoch);
        self.ctl_start(format!("replica {epoch} leads (epoch {epoch})"));
        self.ctl.replica.lead(
            Some(epoch),
            "the store could not be read at the start of this term".into(),
        );
        if self.ctl_read_store() {
            self.ctl.replica.retry();
            self.ctl_reconcile();
            self.ctl.replica.snapshot(Self::pt(self.now), None);
        } else {
            self.ctl_schedule_retry();
        }
        self.ctl_run_intended();
        self.ctl_flush();
    }

    /// A controller process starts (a restart, or a successor): its guard is what the
    /// store holds (or a fresh one, `state = "in-memory"`), its peer comparison
    /// starts afresh.
    fn ctl_start(&mut self, how: String) {
        let pnow = Self::pt(self.now);
        let n = self.servers.len();
        self.ctl.up = true;
        let cfg = self.cfg.controller.guard.clone();
        self.ctl.members.clear();
        #[cfg(test)]
        if let Some(traces) = &mut self.ctl.traces {
            traces.extend(self.ctl.replica.take_trace());
        }
        self.ctl.replica = match self.cfg.controller.state {
            GuardStateStore::Persisted => {
                Replica::rebuild(&self.ctl.store.stored, &cfg)
                    .expect("the simulator's store holds what the replica wrote")
                    .replica
            }
            GuardStateStore::InMemory => {
                // No store: every listed instance is new to it.
                let mut g = SafetyGuard::new(cfg);
                for i in 0..n {
                    if self.ctl.listed[i].is_some() {
                        let zone = &self.zone_names[self.servers[i].zone as usize];
                        g.add_target(pnow, &self.ctl_ids[i], zone);
                    }
                }
                let mut r = Replica::new(g);
                r.snapshot(pnow, None);
                let mut stored = Stored::default();
                if let Some(b) = r.take() {
                    stored.commit(&b);
                }
                self.ctl.store.stored = stored;
                self.ctl.committed = self.ctl.listed.clone();
                r
            }
        };
        #[cfg(test)]
        if self.ctl.traces.is_some() {
            self.ctl.replica.start_trace();
        }
        self.ctl.anomaly = AnomalyDetector::new(self.cfg.controller.anomaly.clone());
        self.ctl.outlier = vec![false; n];
        for i in 0..n {
            self.ctl.naive[i] = Thresholds::new_unknown(self.cfg.controller.guard.thresholds, pnow);
        }
        self.note(format!(
            "controller: {how} ({} guard state)",
            match self.cfg.controller.state {
                GuardStateStore::Persisted => "the store's",
                GuardStateStore::InMemory => "fresh, in-memory",
            }
        ));
    }

    /// The controller process stops (`controller_restart`, or cut off from its lease
    /// by `leader_failover`): what it had not committed is gone with it. `dies`: a
    /// commit under way dies with it (a paused process's lands later, fenced).
    pub(super) fn ctl_stop(&mut self, dies: bool) {
        self.ctl.up = false;
        let mut lost = self.ctl.replica.take().map(|b| acts(&b)).unwrap_or(0);
        if dies && let Some((_, b, _)) = self.ctl.store.in_flight.take() {
            lost += acts(&b);
        }
        if lost > 0 {
            self.note(if dies {
                format!(
                    "controller: {lost} decided action(s) not committed are lost with the process, never run"
                )
            } else {
                format!(
                    "controller: the cut-off leader's {lost} decided action(s) are not committed: they never run"
                )
            });
        }
    }

    pub(super) fn on_controller_up(&mut self) {
        self.ctl_start("restarted".into());
        if self.cfg.controller.mode == ControllerMode::Guarded {
            self.ctl_reconcile();
            self.ctl_run_intended();
            self.ctl_flush();
        }
    }
}

/// The acts decided in `batch`.
fn acts(batch: &Uncommitted) -> usize {
    batch
        .effects
        .iter()
        .filter(|e| matches!(e, Effect::Decide(DecisionKind::Act, _)))
        .count()
}

/// The index of replica `r{k}`.
fn replica_index(name: &str) -> usize {
    name[1..].parse().expect("replicas are named r0, r1, ...")
}
