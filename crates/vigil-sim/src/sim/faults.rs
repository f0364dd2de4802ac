//! Faults: what each scenario fault does to the models when it starts and ends.

use super::engine::Ev;
use super::model::{DepCond, Deployment, FaultRamp, Gc, Growth, Life, Ramped};
use super::{Mark, Sim};
use crate::scenario::{ControllerMode, DepCriticality, DeployGate, FaultConfig, FaultKind};
use std::time::Duration;

/// How long a successor waits for a lost leader's lease to lapse (`vigil controller`'s
/// `replicas.lease_ttl` default is longer; the demo's is 3 s).
const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(3);

impl<'a> Sim<'a> {
    pub(super) fn on_fault(&mut self, fi: usize, start: bool) {
        let f: &FaultConfig = &self.cfg.faults[fi];
        let now = self.now;
        let targets = f.servers(&self.cfg.fleet);
        if start {
            if !f.kind.is_controllers() && f.kind != FaultKind::Surge {
                self.first_fault_at.get_or_insert(now);
            }
            self.marks.push(Mark {
                start: now.as_elapsed().as_secs_f64(),
                end: f.duration.map(|d| (now + d).as_elapsed().as_secs_f64()),
                label: f.label(),
            });
            self.note(format!("fault: {}", f.label()));
            if let Some(d) = f.duration
                && f.kind != FaultKind::Deploy
                && f.kind != FaultKind::LeaderFailover
            {
                self.schedule(now + d, Ev::FaultEnd(fi as u16));
            }
        } else {
            self.note(format!("fault over: {}", f.label()));
        }
        match f.kind {
            FaultKind::Kill => {
                for i in targets {
                    let i = i as usize;
                    if start {
                        if self.servers[i].life == Life::Up {
                            self.servers[i].life = Life::Down;
                            self.servers[i].backlog = 0;
                            self.harm(i, now);
                        }
                    } else if self.servers[i].life == Life::Down
                        && !self.zone_down[self.servers[i].zone as usize]
                    {
                        // The process restarts in place.
                        let incarnation = self.servers[i].incarnation;
                        self.servers[i].life = Life::Booting;
                        self.cure(i);
                        self.schedule(
                            now,
                            Ev::Boot {
                                server: i as u32,
                                incarnation,
                            },
                        );
                    }
                }
            }
            FaultKind::DiskFill => {
                let fill = f.fill_in.unwrap_or_default().as_secs_f64().max(1e-3);
                for i in targets {
                    let i = i as usize;
                    let s = &mut self.servers[i];
                    if start {
                        let cur = s.disk.at(now);
                        s.disk = Growth {
                            base: cur,
                            t0: now,
                            rate: (1.0 - cur) / fill,
                        };
                        self.harm(i, now + f.fill_in.unwrap_or_default());
                    } else {
                        s.disk = Growth::flat(self.cfg.fleet.disk_used);
                        self.cure(i);
                    }
                }
            }
            FaultKind::FdLeak => {
                let limit = f64::from(self.cfg.fleet.fd_limit);
                let t = f.exhaust_in.unwrap_or_default().as_secs_f64().max(1e-3);
                for i in targets {
                    let i = i as usize;
                    let s = &mut self.servers[i];
                    if start {
                        let cur = s.fds.at(now);
                        s.fds = Growth {
                            base: cur,
                            t0: now,
                            rate: (limit - cur) / t,
                        };
                        self.harm(i, now + f.exhaust_in.unwrap_or_default());
                    } else {
                        s.fds = Growth::flat(f64::from(self.cfg.fleet.fds_used));
                        self.cure(i);
                    }
                }
            }
            FaultKind::GcPauses => {
                for i in targets {
                    let s = &mut self.servers[i as usize];
                    s.gc = start.then(|| Gc {
                        start: now,
                        pause: f.pause.unwrap_or_default(),
                        every: f.every.unwrap_or(Duration::from_secs(1)),
                    });
                }
            }
            FaultKind::CheckerDies => {
                for i in targets {
                    let s = &mut self.servers[i as usize];
                    s.checker_dead_at = if start { Some(now) } else { None };
                }
            }
            FaultKind::ConnBroken => {
                let d = self.dep_index(f.dependency.as_deref());
                for i in targets {
                    let i = i as usize;
                    if start {
                        self.servers[i].conn_broken = Some((d, now, None));
                        if self.deps[d].criticality == DepCriticality::Critical {
                            self.harm(i, now);
                        }
                    } else {
                        if let Some(c) = &mut self.servers[i].conn_broken {
                            c.2 = Some(now);
                        }
                        self.cure(i);
                    }
                }
            }
            FaultKind::Gray => {
                for i in targets {
                    let i = i as usize;
                    if start {
                        self.servers[i].gray = Ramped {
                            to: f.error_rate.unwrap_or(1.0),
                            ramp: FaultRamp::new(now, f.ramp),
                        };
                        self.harm(i, now);
                    } else {
                        self.servers[i].gray = Ramped::default();
                        self.cure(i);
                    }
                }
            }
            FaultKind::Latency => {
                let to = f.latency.unwrap_or_default().as_secs_f64();
                let ramp = FaultRamp::new(now, f.ramp);
                // Harm starts when answers miss the client's timeout at once.
                let edge = self.cfg.clients.timeout.as_secs_f64() - self.service.median();
                for i in targets {
                    let i = i as usize;
                    if start {
                        self.servers[i].slow = Ramped { to, ramp };
                        if to > edge {
                            let at = ramp.map_or(now, |r| r.reaches(edge / to));
                            self.harm(i, at);
                        }
                    } else {
                        self.servers[i].slow = Ramped::default();
                        self.cure(i);
                    }
                }
            }
            FaultKind::Dependency => {
                let d = self.dep_index(f.dependency.as_deref());
                let cond = if start {
                    DepCond {
                        error_rate: f.error_rate.unwrap_or(1.0),
                        extra_latency: f.latency.unwrap_or_default(),
                        affected: f.affected.unwrap_or(1.0),
                        key: fi as u64 + 1,
                        ramp: FaultRamp::new(now, f.ramp),
                        from_error_rate: self.deps[d].history[0].1.error_rate,
                    }
                } else {
                    self.deps[d].history[0].1
                };
                self.deps[d].history.push((now, cond));
            }
            FaultKind::Surge => {
                self.surge_fault =
                    start.then(|| (f.load.unwrap_or(1.0), FaultRamp::new(now, f.ramp)));
                if !start {
                    self.surge = 1.0;
                }
            }
            FaultKind::ZoneDown => {
                let z = f.zone.unwrap_or(0) as usize;
                self.zone_down[z] = start;
                for i in targets {
                    let i = i as usize;
                    if start {
                        self.servers[i].backlog = 0;
                        self.harm(i, now);
                    } else {
                        self.cure(i);
                        if self.servers[i].life != Life::Booting {
                            // Instances in the zone reboot when it comes back.
                            let incarnation = self.servers[i].incarnation;
                            self.servers[i].life = Life::Booting;
                            self.schedule(
                                now + self.cfg.fleet.boot_time,
                                Ev::Boot {
                                    server: i as u32,
                                    incarnation,
                                },
                            );
                        }
                    }
                }
            }
            FaultKind::Deploy => {
                if start {
                    let rollout = match f.gate.unwrap_or_default() {
                        DeployGate::Health => match self.start_rollout(f) {
                            Ok(r) => Some(Box::new(r)),
                            Err(e) => {
                                self.note(format!("deploy: refused: {e}"));
                                return;
                            }
                        },
                        DeployGate::None => None,
                    };
                    let ev = if rollout.is_some() {
                        Ev::DeployPoll { fault: fi as u16 }
                    } else {
                        Ev::DeployWave {
                            fault: fi as u16,
                            wave: 0,
                        }
                    };
                    self.deployments.push(Deployment {
                        fault: fi as u16,
                        deployed: 0,
                        halted: false,
                        rollout,
                        seen_decisions: 0,
                        last_wave: None,
                        rolling_back: false,
                        polls: 0,
                    });
                    self.schedule(now, ev);
                }
            }
            FaultKind::ControllerRestart => {
                if start && self.cfg.controller.mode != ControllerMode::Off {
                    self.ctl_stop(true);
                    self.note("controller down: what it had not committed is lost".into());
                    let d = f.duration.unwrap_or(Duration::from_secs(30));
                    self.schedule(now + d, Ev::ControllerUp);
                }
            }
            FaultKind::StoreOutage => self.ctl.store.down = start,
            FaultKind::ProberCutOff => {
                let r = f.replica.unwrap_or(0) as usize;
                self.ctl.cut[r] = start;
            }
            FaultKind::StoreSlow => {
                self.ctl.store.latency = if start {
                    f.latency.unwrap_or_default()
                } else {
                    Duration::ZERO
                };
            }
            FaultKind::LeaderFailover => {
                if start && self.cfg.controller.mode == ControllerMode::Guarded {
                    // Paused, not dead: a commit under way lands later, in a term
                    // that is no longer its own.
                    self.ctl_stop(false);
                    self.note("controller: the leader is cut off from its lease".into());
                    let d = f.duration.unwrap_or(DEFAULT_LEASE_TTL);
                    self.schedule(now + d, Ev::CtlLead);
                }
            }
        }
    }

    pub(super) fn dep_index(&self, name: Option<&str>) -> usize {
        let name = name.unwrap_or_default();
        self.cfg
            .dependencies
            .iter()
            .position(|d| d.name == name)
            .expect("validated: the dependency exists")
    }
}
