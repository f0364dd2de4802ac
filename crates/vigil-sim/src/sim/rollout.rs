//! Rollouts: the simulated `vigil deploy` driving vigil-core's `Rollout`, polled every
//! [`DEPLOY_POLL`], and the timer rollout's waves.

use super::Sim;
use super::engine::Ev;
use crate::scenario::{FaultConfig, Readiness};
use std::time::Duration;
use vigil_core::Status;
use vigil_core::rollout::{Command, HostSpec, Phase, Rollout};

/// How often the simulated `vigil deploy` polls its rollout: once a second.
pub(super) const DEPLOY_POLL: Duration = Duration::from_secs(1);
/// Error-rate samples fed to the rollout: every 10th poll (every 10 s per host).
pub(super) const DEPLOY_SAMPLE_EVERY: u64 = 10;
/// The revision a `deploy` fault rolls out, and the one the fleet runs before.
pub(super) const NEW_REVISION: &str = "v2";
pub(super) const OLD_REVISION: &str = "v1";

pub(super) fn revision_name(new: bool) -> &'static str {
    if new { NEW_REVISION } else { OLD_REVISION }
}

impl<'a> Sim<'a> {
    /// vigil's rollout of fault `f`: every server a host, in its zone, on the old
    /// revision, its health as the balancer sees it.
    pub(super) fn start_rollout(
        &self,
        f: &FaultConfig,
    ) -> Result<Rollout, vigil_core::rollout::StartError> {
        let hosts = (0..self.servers.len())
            .map(|i| HostSpec {
                id: self.ctl_ids[i].clone(),
                zone: self.zone_names[self.servers[i].zone as usize].clone(),
                revision: revision_name(self.servers[i].new_revision).into(),
                healthy: self.is_up(i) && self.in_service(i),
                held: false,
            })
            .collect();
        Rollout::start(f.rollout.clone(), hosts, NEW_REVISION, Self::pt(self.now))
    }

    /// One turn of vigil's rollout, every [`DEPLOY_POLL`]: the hosts' health answers (the
    /// revision they run, and whether `/readyz` passes), their error rates every
    /// [`DEPLOY_SAMPLE_EVERY`] turns, then its commands. Drains and installs take no
    /// time here (an install swaps the version in place, as the timer rollout does); the
    /// host reports back at the next turn.
    pub(super) fn on_deploy_poll(&mut self, fault: u16) {
        let Some(di) = self.deployments.iter().position(|d| d.fault == fault) else {
            return;
        };
        let Some(mut r) = self.deployments[di].rollout.take() else {
            return;
        };
        let now = self.now;
        let pnow = Self::pt(now);
        let sample = self.deployments[di]
            .polls
            .is_multiple_of(DEPLOY_SAMPLE_EVERY);
        self.deployments[di].polls += 1;
        for i in 0..self.servers.len() {
            let healthy = self.is_up(i) && self.checks(i, now, false).1 != Status::Fail;
            let id = &self.ctl_ids[i];
            r.report(
                pnow,
                id,
                revision_name(self.servers[i].new_revision),
                healthy,
            );
            if sample && self.is_up(i) {
                r.sample(pnow, id, self.request_fail_prob(i, now));
            }
        }
        let bad = {
            let f = &self.cfg.faults[fault as usize];
            f.error_rate.unwrap_or(0.0) > 0.0 || f.readiness == Some(Readiness::Fails)
        };
        // Drains and installs answer at once; their follow-ups come out of the next poll.
        // Bounded: each host is drained, installed and undrained at most twice (deploy,
        // rollback).
        for _ in 0..8 {
            let commands = r.poll(pnow);
            if commands.is_empty() {
                break;
            }
            for c in commands {
                match c {
                    Command::Drain { host } => r.drained(pnow, &host),
                    Command::Install { host, revision, .. } => {
                        if let Some(i) = self.ctl_ids.iter().position(|id| *id == host) {
                            let new = revision == NEW_REVISION;
                            self.servers[i].new_revision = new;
                            self.servers[i].bad_version = new && bad;
                            if new && bad {
                                self.harm(i, now);
                            } else {
                                self.cure(i);
                            }
                        }
                        r.installed(pnow, &host, Ok(()));
                    }
                    Command::Undrain { .. } => {}
                    Command::Alert { reason } => self.note(format!("deploy: alert: {reason}")),
                }
            }
        }
        self.rollout_bookkeeping(di, &r);
        let finished = r.is_finished();
        self.deployments[di].rollout = Some(r);
        if !finished {
            self.schedule(now + DEPLOY_POLL, Ev::DeployPoll { fault });
        }
    }

    /// Counts the rollout's waves and rollbacks, and notes its decisions.
    pub(super) fn rollout_bookkeeping(&mut self, di: usize, r: &Rollout) {
        for d in &r.decisions()[self.deployments[di].seen_decisions..] {
            self.note(format!("deploy: {}", d.what));
        }
        self.deployments[di].seen_decisions = r.decisions().len();
        match r.phase() {
            Phase::Deploying { wave } if self.deployments[di].last_wave != Some(*wave) => {
                self.deployments[di].last_wave = Some(*wave);
                self.s.deploy_waves += 1;
                let label = format!("deploy: wave {} to {}", wave + 1, r.wave_hosts().join(", "));
                self.decide_mark("wave", &label);
            }
            Phase::RollingBack { reason } if !self.deployments[di].rolling_back => {
                self.deployments[di].rolling_back = true;
                self.deployments[di].halted = true;
                self.s.rollbacks += 1;
                let label = format!("rollback: {reason}");
                self.decide_mark("rollback", &label);
            }
            _ => {}
        }
    }

    pub(super) fn on_deploy_wave(&mut self, fault: u16, wave: u16) {
        let f = &self.cfg.faults[fault as usize];
        let now = self.now;
        let waves = f.waves.as_deref().unwrap_or_default();
        let Some(di) = self.deployments.iter().position(|d| d.fault == fault) else {
            return;
        };
        if self.deployments[di].halted {
            return;
        }
        let n = self.servers.len() as u32;
        let deployed = self.deployments[di].deployed;
        let Some(frac) = waves.get(wave as usize) else {
            return;
        };
        let upto = ((frac * f64::from(n)).ceil() as u32).min(n);
        let bad = f.error_rate.unwrap_or(0.0) > 0.0 || f.readiness == Some(Readiness::Fails);
        for i in deployed as usize..upto as usize {
            self.servers[i].bad_version = bad;
            self.servers[i].new_revision = true;
            if bad {
                self.harm(i, now);
            }
        }
        self.deployments[di].deployed = upto;
        self.s.deploy_waves += 1;
        self.note(format!("deploy: wave {} to {upto}/{n} servers", wave + 1));
        if (wave as usize) + 1 < waves.len() {
            let next = now + f.wave_interval.unwrap_or(Duration::from_secs(300));
            self.schedule(
                next,
                Ev::DeployWave {
                    fault,
                    wave: wave + 1,
                },
            );
        }
    }
}
