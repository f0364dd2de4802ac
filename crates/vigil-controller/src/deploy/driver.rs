//! The driver: runs `vigil_core::rollout::Rollout` against real hosts. It takes the
//! policy's commands, records each as an intent in the store before running its hook,
//! feeds back what happened (drained, installed, the hosts' health answers and error
//! rate samples, and with `[lb]` the balancers' request counts per host), and saves the
//! policy's state after every step. It decides nothing itself: every decision is the
//! policy's, and is logged as it is made.

use super::balancer::{BalancerClient, host_counts};
use super::config::{DeployConfig, HostConfig};
use super::controller::{ControllerClient, ControllerTarget};
use super::hooks::{HookContext, Hooks};
use crate::clock::{Clock, unix_ms, wall_ms};
use crate::prober::Prober;
use crate::store::{
    ActionState, RolloutSave, RolloutStep, SqliteStore, StoreError, StoreHandle, StoredRollout,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vigil_core::Time;
use vigil_core::rollout::{Command, ControllerView, Evidence, HostSpec, HostStep, Phase, Rollout};

/// How often the state is saved when only samples changed (every step, decision and
/// phase change is saved at once). Samples lost to a crash are re-collected; saving
/// them every probe round would rewrite the whole state (all samples so far) every
/// `probe.interval`.
const SAVE_SAMPLES_EVERY: Duration = Duration::from_secs(10);
/// Rounds of poll-and-run in one probe interval before probing again: a drain is
/// followed by its install in the same round, without waiting a probe interval.
const MAX_ROUNDS: usize = 16;
/// How many times the initial probe of a host is tried before the rollout refuses to
/// start without its revision (a host restarting at that moment should not stop it).
const START_PROBES: usize = 3;
/// How long `run` waits for the deploy lock before it refuses: longer than `status` or a
/// direct `abort` holds it, far shorter than a running deployer does.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);
/// How long `abort` and `approve` wait for a running driver to apply them.
pub const REQUEST_WAIT: Duration = Duration::from_secs(30);

/// Why the driver stopped before the rollout finished, or would not start.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    /// The store failed: the rollout resumes from what was committed at the next run.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The request is refused: a bad revision, another rollout in progress, another
    /// driver running.
    #[error("{0}")]
    Refused(String),
    /// The stored state cannot be used.
    #[error("{0}")]
    BadState(String),
    /// Something the rollout needs cannot be read now (the controller that lists the
    /// hosts): `run` again once it can.
    #[error("{0}")]
    Unavailable(String),
}

/// The config with its hosts resolved, and the controller whose view counts.
pub struct Resolved {
    /// The config; its `hosts` are the rollout's (the controller's, when it lists them).
    pub cfg: Arc<DeployConfig>,
    /// The controller, when one is configured.
    pub controller: Option<ControllerClient>,
    /// What the first read of it gave (None without a controller).
    pub view: Option<Result<BTreeMap<String, ControllerTarget>, String>>,
}

impl Resolved {
    /// What the policy is told of this read, for these hosts.
    pub fn policy_view(&self) -> ControllerView {
        view_of(self.view.as_ref(), &self.cfg.hosts)
    }
}

/// The policy's view of a read of the controller (no controller: nothing held).
fn view_of(
    read: Option<&Result<BTreeMap<String, ControllerTarget>, String>>,
    hosts: &[HostConfig],
) -> ControllerView {
    match read {
        None => ControllerView::Read {
            held: BTreeSet::new(),
        },
        Some(Err(why)) => ControllerView::Unreadable(why.clone()),
        Some(Ok(targets)) => ControllerView::Read {
            held: hosts
                .iter()
                .filter(|h| targets.get(&h.id).is_some_and(ControllerTarget::held))
                .map(|h| h.id.clone())
                .collect(),
        },
    }
}

/// Reads the controller (if any) and resolves the hosts: the config's, or the
/// controller's targets when it lists them (then a failed read is an error: there is
/// no rollout without its hosts).
pub async fn resolve(cfg: Arc<DeployConfig>) -> Result<Resolved, DriveError> {
    let Some(client) = ControllerClient::new(&cfg.controller) else {
        return Ok(Resolved {
            cfg,
            controller: None,
            view: None,
        });
    };
    let read = client.targets().await;
    let cfg = match (&read, cfg.controller.hosts) {
        (_, super::config::HostSource::Config) => cfg,
        (Err(why), super::config::HostSource::Controller) => {
            return Err(DriveError::Unavailable(format!(
                "cannot list the hosts from the controller: {why}"
            )));
        }
        (Ok(targets), super::config::HostSource::Controller) => {
            let hosts =
                super::controller::select_hosts(&cfg, targets).map_err(DriveError::Refused)?;
            let mut c = (*cfg).clone();
            c.hosts = hosts;
            Arc::new(c)
        }
    };
    if let Err(why) = &read {
        tracing::warn!(controller = %client.url(), error = %why, "the controller cannot be read: no new wave until it can (fail closed)");
    }
    Ok(Resolved {
        cfg,
        controller: Some(client),
        view: Some(read),
    })
}

/// The store, on its own thread (rusqlite blocks): [`StoreHandle`], as the controller's.
#[derive(Clone)]
pub struct Db(StoreHandle<SqliteStore>);

impl Db {
    /// Opens (or creates) the store file.
    pub fn open(path: &Path) -> Result<Db, StoreError> {
        ensure_dir(path)?;
        let (handle, _thread) = StoreHandle::on_thread(Box::new(SqliteStore::open(path)?));
        Ok(Db(handle))
    }

    /// Runs `f` on the store, off the async threads.
    pub async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut SqliteStore) -> Result<R, StoreError> + Send + 'static,
    {
        self.0.call(f).await
    }
}

/// Creates the directory of the store file.
fn ensure_dir(path: &Path) -> Result<(), StoreError> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Unusable {
                path: path.display().to_string(),
                why: format!("cannot create its directory: {e}"),
            })
        }
        _ => Ok(()),
    }
}

/// The one-driver-per-deployment lock: an exclusive `flock` on a file beside the store,
/// released by the kernel when the process dies (SIGKILL included).
pub struct DriverLock {
    _file: std::fs::File,
}

impl DriverLock {
    /// The lock file of deployment `name` in store `store`.
    pub fn path(store: &Path, name: &str) -> PathBuf {
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let mut p = store.as_os_str().to_owned();
        p.push(format!(".deploy-{safe}.lock"));
        PathBuf::from(p)
    }

    /// Takes the lock, waiting up to [`LOCK_WAIT`] for a short holder (`status` and
    /// `abort` hold it for a moment); None when another process still holds it.
    pub async fn take_soon(store: &Path, name: &str) -> std::io::Result<Option<DriverLock>> {
        let started = Instant::now();
        loop {
            if let Some(l) = Self::try_take(store, name)? {
                return Ok(Some(l));
            }
            if started.elapsed() >= LOCK_WAIT {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Takes the lock, or returns None when another process holds it.
    pub fn try_take(store: &Path, name: &str) -> std::io::Result<Option<DriverLock>> {
        let path = Self::path(store, name);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(DriverLock { _file: file })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// The revision a health answer reports: `releaseId`, else `version`.
pub fn reported_revision(report: &vigil_core::HealthReport) -> Option<String> {
    report.release_id.clone().or_else(|| report.version.clone())
}

/// One host's probe, as the driver uses it.
#[derive(Clone, Debug, PartialEq)]
pub struct HostAnswer {
    /// The revision it reports (None: no answer, or none in it).
    pub revision: Option<String>,
    /// Serving (pass or warn).
    pub healthy: bool,
    /// The error-rate sample of this probe, if any.
    pub sample: Option<f64>,
    /// What was seen.
    pub detail: String,
}

/// Probes every host once, concurrently.
pub async fn probe_hosts(
    cfg: &DeployConfig,
    prober: &Prober,
    hosts: &[HostConfig],
) -> HashMap<String, HostAnswer> {
    let mut set = tokio::task::JoinSet::new();
    for h in hosts {
        let uri = cfg.health_uri(h);
        let (prober, timeout, id) = (prober.clone(), cfg.probe.timeout, h.id.clone());
        let check = cfg.probe.error_rate_check.clone();
        set.spawn(async move {
            let answer = match uri {
                Err(e) => Err(e),
                Ok(uri) => {
                    prober
                        .answer(&uri, timeout, vigil_core::report::MAX_REPORT_BYTES)
                        .await
                }
            };
            (id, to_answer(answer, check.as_deref()))
        });
    }
    let mut out = HashMap::new();
    while let Some(r) = set.join_next().await {
        if let Ok((id, a)) = r {
            out.insert(id, a);
        }
    }
    out
}

fn to_answer(answer: Result<vigil_core::Judgement, String>, check: Option<&str>) -> HostAnswer {
    match answer {
        Err(e) => HostAnswer {
            revision: None,
            healthy: false,
            sample: Some(1.0),
            detail: e,
        },
        Ok(j) => {
            let healthy = j.is_serving();
            let revision = j.report.as_ref().and_then(reported_revision);
            let sample = match check {
                None => Some(if healthy { 0.0 } else { 1.0 }),
                Some(name) => j
                    .report
                    .as_ref()
                    .and_then(|r| r.checks.get(name))
                    .and_then(|rs| rs.first())
                    .and_then(|r| r.observed_value.as_ref())
                    .and_then(serde_json::Value::as_f64)
                    .or((!healthy).then_some(1.0)),
            };
            HostAnswer {
                revision,
                healthy,
                sample,
                detail: j.detail,
            }
        }
    }
}

/// Probes the hosts until each reports a revision (up to 3 rounds, a probe interval apart) and
/// returns them as the policy starts them; hosts that never do are in the error.
pub async fn starting_hosts(
    cfg: &DeployConfig,
    prober: &Prober,
) -> (Vec<HostSpec>, Vec<(String, String)>) {
    let mut known: HashMap<String, HostAnswer> = HashMap::new();
    for round in 0..START_PROBES {
        if round > 0 {
            tokio::time::sleep(cfg.probe.interval).await;
        }
        let missing: Vec<HostConfig> = cfg
            .hosts
            .iter()
            .filter(|h| known.get(&h.id).is_none_or(|a| a.revision.is_none()))
            .cloned()
            .collect();
        if missing.is_empty() {
            break;
        }
        known.extend(probe_hosts(cfg, prober, &missing).await);
    }
    let mut specs = Vec::new();
    let mut unknown = Vec::new();
    for h in &cfg.hosts {
        let a = &known[&h.id];
        match &a.revision {
            Some(rev) => {
                let mut s = HostSpec::new(h.id.clone(), h.zone.clone(), rev.clone());
                s.healthy = a.healthy;
                specs.push(s);
            }
            None => unknown.push((h.id.clone(), a.detail.clone())),
        }
    }
    (specs, unknown)
}

/// A rollout being driven.
pub struct Driver {
    cfg: Arc<DeployConfig>,
    db: Db,
    prober: Prober,
    hooks: Hooks,
    rollout: Rollout,
    id: String,
    started_ms: i64,
    clock: Clock,
    /// What the last save held: decisions, phase and hosts in the wave.
    saved: (usize, Phase, Vec<String>),
    saved_at: Instant,
    /// Decisions already logged.
    logged: usize,
    /// Each host's last reported revision (a host that stops answering keeps it).
    last_revision: HashMap<String, String>,
    /// The controller whose view counts (holds; unreadable holds the next wave).
    controller: Option<ControllerClient>,
    /// The balancers whose request counts are the verdict's evidence.
    balancer: Option<BalancerClient>,
    /// Hosts no balancer lists, already warned about.
    unseen: BTreeSet<String>,
    _lock: DriverLock,
}

/// What the policy's verdict weighs with this config: the balancers' counts when some
/// are configured, else the hosts' own samples.
pub fn evidence_of(cfg: &DeployConfig) -> Evidence {
    if cfg.lb.is_set() {
        Evidence::BalancerRequests
    } else {
        Evidence::HostSamples
    }
}

impl Driver {
    /// Starts a rollout of `revision`, or resumes the one in progress (of `revision`,
    /// when given). Takes the deployment's lock for as long as the driver lives.
    pub async fn start_or_resume(
        cfg: Arc<DeployConfig>,
        revision: Option<&str>,
    ) -> Result<Driver, DriveError> {
        // The lock before the store: two deployers starting at once must not both
        // create (or migrate) the store file.
        ensure_dir(&cfg.store)?;
        let lock = DriverLock::take_soon(&cfg.store, &cfg.name)
            .await
            .map_err(|e| DriveError::Refused(format!("cannot take the deploy lock: {e}")))?
            .ok_or_else(|| {
                DriveError::Refused(format!(
                    "another `vigil deploy run` is driving deployment {:?} (it holds {})",
                    cfg.name,
                    DriverLock::path(&cfg.store, &cfg.name).display()
                ))
            })?;
        let db = Db::open(&cfg.store)?;
        let name = cfg.name.clone();
        let latest = db.call(move |s| s.latest_rollout(&name)).await?;
        let resolved = resolve(cfg).await?;
        let cfg = resolved.cfg.clone();
        let prober = Prober::new(true);
        let hooks = Hooks::new(cfg.clone());
        if let Some(l) = latest.as_ref().filter(|l| !l.finished) {
            if let Some(r) = revision
                && r != l.revision
            {
                return Err(DriveError::Refused(format!(
                    "the rollout {} of revision {} is in progress ({}): run it to its end (`vigil deploy run`) or abort it (`vigil deploy abort`) before deploying {r}",
                    l.id, l.revision, l.phase
                )));
            }
            let rollout = decode(l)?;
            for h in &cfg.hosts {
                if rollout.host_step(&h.id).is_none() {
                    tracing::warn!(host = %h.id, "host in the config but not in the rollout in progress: left alone");
                }
            }
            tracing::info!(rollout = %l.id, revision = %l.revision, phase = %l.phase, "resuming the rollout in progress");
            let clock = Clock::start(Time::from_millis(u64::try_from(l.clock_ms).unwrap_or(0)));
            let mut d = Driver::new(cfg, db, prober, hooks, rollout, l, clock, lock);
            d.controller = resolved.controller;
            d.judge_by();
            // Decisions made before the restart were logged by the run that made them.
            d.logged = d.rollout.decisions().len();
            return Ok(d);
        }
        let Some(revision) = revision else {
            return Err(DriveError::Refused(format!(
                "no rollout of deployment {:?} is in progress: say which revision to deploy (--revision)",
                cfg.name
            )));
        };
        let bad: BTreeSet<String> = match &latest {
            Some(l) => decode(l)?.bad_revisions().clone(),
            None => BTreeSet::new(),
        };
        if bad.contains(revision) {
            return Err(DriveError::Refused(
                vigil_core::rollout::StartError::Bad(revision.to_string()).to_string()
                    + " (`vigil deploy clear-bad` is that decision)",
            ));
        }
        let (hosts, unknown) = starting_hosts(&cfg, &prober).await;
        if !unknown.is_empty() {
            let list: Vec<String> = unknown
                .iter()
                .map(|(h, why)| format!("{h} ({why})"))
                .collect();
            return Err(DriveError::Refused(format!(
                "cannot start: the revision of {} is unknown (no answer, or no releaseId or version in its health answer), so a rollback could not restore it: {}",
                if unknown.len() == 1 {
                    "one host"
                } else {
                    "some hosts"
                },
                list.join("; ")
            )));
        }
        let not_before = latest.as_ref().map_or(0, |l| l.clock_ms);
        let clock = Clock::start(Time::from_millis(u64::try_from(not_before).unwrap_or(0)));
        let rollout = Rollout::start_seeing(
            cfg.rollout.clone(),
            hosts.clone(),
            revision,
            clock.now(),
            bad,
            resolved.policy_view(),
        )
        .map_err(|e| DriveError::Refused(e.to_string()))?;
        let id = rollout.id().to_string();
        let stored = StoredRollout {
            id: id.clone(),
            name: cfg.name.clone(),
            revision: revision.to_string(),
            phase: rollout.phase().to_string(),
            finished: rollout.is_finished(),
            state: String::new(),
            clock_ms: unix_ms(clock.now()),
            started_ms: wall_ms(),
            updated_ms: wall_ms(),
        };
        for h in &hosts {
            tracing::info!(host = %h.id, zone = %h.zone, revision = %h.revision, healthy = h.healthy, "host before the rollout");
        }
        let mut d = Driver::new(cfg, db, prober, hooks, rollout, &stored, clock, lock);
        d.controller = resolved.controller;
        d.judge_by();
        d.save(Vec::new(), Vec::new(), Vec::new()).await?;
        Ok(d)
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        cfg: Arc<DeployConfig>,
        db: Db,
        prober: Prober,
        hooks: Hooks,
        rollout: Rollout,
        stored: &StoredRollout,
        clock: Clock,
        lock: DriverLock,
    ) -> Driver {
        Driver {
            balancer: BalancerClient::new(&cfg.lb),
            unseen: BTreeSet::new(),
            cfg,
            db,
            prober,
            hooks,
            saved: (usize::MAX, Phase::Completed, Vec::new()),
            saved_at: Instant::now(),
            logged: 0,
            last_revision: HashMap::new(),
            controller: None,
            rollout,
            id: stored.id.clone(),
            started_ms: stored.started_ms,
            clock,
            _lock: lock,
        }
    }

    /// Tells the policy what its verdict weighs (the config may have changed between a
    /// crash and the resume: the policy says so when it does).
    fn judge_by(&mut self) {
        let evidence = evidence_of(&self.cfg);
        if evidence == Evidence::HostSamples {
            tracing::info!(
                "no [lb] admin configured: waves are judged by the hosts' own samples (the host-reported rule)"
            );
        }
        self.rollout.judge_by(self.clock.now(), evidence);
    }

    /// The rollout's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The policy's state.
    pub fn rollout(&self) -> &Rollout {
        &self.rollout
    }

    /// Drives the rollout to its end; returns the final phase.
    pub async fn run(mut self) -> Result<Phase, DriveError> {
        self.log_decisions();
        loop {
            self.apply_requests().await?;
            self.run_intended().await?;
            for _ in 0..MAX_ROUNDS {
                let now = self.clock.now();
                let commands = self.rollout.poll(now);
                if commands.is_empty() {
                    break;
                }
                let intents = commands
                    .iter()
                    .map(|c| {
                        (
                            command_host(c),
                            serde_json::to_string(c).expect("a command serialises"),
                        )
                    })
                    .collect();
                let steps = self.save(intents, Vec::new(), Vec::new()).await?;
                for step in steps {
                    self.run_step(step).await?;
                }
            }
            self.save_if_changed().await?;
            if self.rollout.is_finished() {
                self.finish_leftovers().await?;
                return Ok(self.rollout.phase().clone());
            }
            tokio::time::sleep(self.cfg.probe.interval).await;
            self.probe_round().await;
            self.save_if_changed().await?;
        }
    }

    /// Probes every host of the rollout and feeds the answers to the policy.
    async fn probe_round(&mut self) {
        let hosts: Vec<HostConfig> = self
            .cfg
            .hosts
            .iter()
            .filter(|h| self.rollout.host_step(&h.id).is_some())
            .cloned()
            .collect();
        let read_controller = async {
            match &self.controller {
                None => None,
                Some(c) => Some(c.targets().await),
            }
        };
        let read_balancers = async {
            match &self.balancer {
                None => None,
                Some(b) => Some(b.counts().await),
            }
        };
        let (answers, read, counts) = tokio::join!(
            probe_hosts(&self.cfg, &self.prober, &hosts),
            read_controller,
            read_balancers
        );
        let now = self.clock.now();
        match &counts {
            None => {}
            Some(Err(why)) => {
                // Cumulative counts: the next read that works has this round's too.
                tracing::warn!(error = %why, "cannot read the balancers' request counts: this round's are left to the next read");
            }
            Some(Ok(targets)) => {
                for h in &hosts {
                    match host_counts(h, targets) {
                        Some(c) => self.rollout.outcomes(now, &h.id, c),
                        None => {
                            if self.unseen.insert(h.id.clone()) {
                                tracing::warn!(host = %h.id, url = %h.url, "no balancer has counted a request for this host (a target is matched by the host's id, else its URL's host:port): it weighs nothing in the verdict until one does");
                            }
                        }
                    }
                }
            }
        }
        if let Some(read) = &read {
            if let Err(why) = read {
                tracing::warn!(error = %why, "the controller cannot be read: no new wave until it can (fail closed)");
            }
            // Holds first, in one step, before this round's health: a wave is never
            // started on a view half applied.
            self.rollout
                .controller_view(now, view_of(Some(read), &hosts));
        }
        for h in &hosts {
            let Some(a) = answers.get(&h.id) else {
                continue;
            };
            if let Some(r) = &a.revision {
                self.last_revision.insert(h.id.clone(), r.clone());
            }
            let revision = self.last_revision.get(&h.id).cloned().unwrap_or_default();
            if matches!(
                self.rollout.host_step(&h.id),
                Some(HostStep::AwaitingReport { .. })
            ) {
                tracing::debug!(host = %h.id, revision = %revision, healthy = a.healthy, detail = %a.detail, "awaiting report-back");
            }
            self.rollout.report(now, &h.id, &revision, a.healthy);
            if let Some(v) = a.sample {
                self.rollout.sample(now, &h.id, v);
            }
        }
        self.log_decisions();
    }

    /// Runs the steps the store still holds as intended (after a restart, or a drain
    /// that failed and is tried again).
    async fn run_intended(&mut self) -> Result<(), DriveError> {
        let id = self.id.clone();
        let steps = self.db.call(move |s| s.rollout_steps(&id, true)).await?;
        for step in steps {
            self.run_step(step).await?;
        }
        Ok(())
    }

    /// Runs one step's hook, feeds its outcome to the policy and saves both.
    async fn run_step(&mut self, step: RolloutStep) -> Result<(), DriveError> {
        let command: Command = serde_json::from_value(step.command.clone())
            .map_err(|e| DriveError::BadState(format!("step {} holds no command: {e}", step.id)))?;
        if let Some(why) = self.stale(&command) {
            tracing::info!(step = step.id, command = ?command, "{why}: not run");
            return self
                .finish(step.id, ActionState::Failed, format!("not run: {why}"))
                .await;
        }
        let sid = step.id;
        self.db.call(move |s| s.start_step(sid)).await?;
        let attempt = step.attempts + 1;
        let revision = self.rollout.revision().to_string();
        match command {
            command @ (Command::Drain { .. } | Command::Undrain { .. }) => {
                let (drain, host) = match command {
                    Command::Drain { host } => (true, host),
                    Command::Undrain { host } => (false, host),
                    _ => unreachable!("matched above"),
                };
                let result = match self.cfg.host(&host) {
                    None => Err(format!("host {host} is not in the config any more")),
                    Some(h) => {
                        let ctx = HookContext {
                            rollout: &self.id,
                            host: h,
                            revision: &revision,
                            attempt,
                        };
                        self.hooks.drain(&ctx, drain).await
                    }
                };
                match result {
                    Ok(said) => {
                        tracing::info!(host = %host, "{}: {said}", if drain { "drained" } else { "undrained" });
                        if drain {
                            self.rollout.drained(self.clock.now(), &host);
                        }
                        self.finish(sid, ActionState::Done, said).await
                    }
                    Err(why) => {
                        // Tried again every probe interval: a drain that never works
                        // runs into the progress deadline (the policy's to judge); an
                        // undrain is retried until it works.
                        tracing::warn!(host = %host, attempt, error = %why, "{} failed; trying again", if drain { "drain" } else { "undrain" });
                        self.db.call(move |s| s.note_step(sid, &why)).await?;
                        Ok(())
                    }
                }
            }
            Command::Install {
                host,
                revision,
                key,
            } => {
                let rollback = revision != self.rollout.revision();
                let result = match self.cfg.host(&host) {
                    None => Err(format!("host {host} is not in the config any more")),
                    Some(h) => {
                        let ctx = HookContext {
                            rollout: &self.id,
                            host: h,
                            revision: &revision,
                            attempt,
                        };
                        tracing::info!(host = %host, revision = %revision, key = %key, attempt, rollback, "installing");
                        self.hooks.install(&ctx, &key, rollback).await
                    }
                };
                let now = self.clock.now();
                let (state, said) = match &result {
                    Ok(s) => (ActionState::Done, s.clone()),
                    Err(e) => (ActionState::Failed, e.clone()),
                };
                tracing::info!(host = %host, revision = %revision, ok = result.is_ok(), result = %said, "install finished");
                self.rollout.installed(now, &host, result.map(|_| ()));
                self.finish(sid, state, said).await
            }
            Command::Alert { reason } => {
                let r = self.hooks.alert(&self.id, sid, &reason).await;
                let (state, said) = match r {
                    Ok(s) => (ActionState::Done, s),
                    Err(e) => (ActionState::Failed, e),
                };
                self.finish(sid, state, said).await
            }
        }
    }

    /// Why an intended command no longer fits the policy's state (it was recorded, then
    /// the rollout moved on: a deadline, a failure, an abort): None when it still fits.
    fn stale(&self, command: &Command) -> Option<String> {
        match command {
            Command::Drain { host } => (!matches!(
                self.rollout.host_step(host),
                Some(HostStep::Draining { .. })
            ))
            .then(|| format!("{host} is no longer waiting for its drain")),
            Command::Install { host, revision, .. } => {
                let step = self.rollout.host_step(host);
                let fits = if *revision == self.rollout.revision() {
                    matches!(step, Some(HostStep::Installing { .. }))
                } else {
                    // A rollback's reinstall runs even when its host already reports
                    // the previous revision (it may have reported back before the
                    // reinstall's turn): an install of the bad one that was still
                    // landing must not win. Not after the rollback failed: a human
                    // decides then.
                    matches!(
                        self.rollout.phase(),
                        Phase::RollingBack { .. } | Phase::RolledBack { .. }
                    )
                };
                (!fits).then(|| format!("{host} is no longer waiting for {revision}"))
            }
            Command::Undrain { .. } | Command::Alert { .. } => None,
        }
    }

    /// Marks a step finished and saves the state that took its result.
    async fn finish(
        &mut self,
        step: i64,
        state: ActionState,
        said: String,
    ) -> Result<(), DriveError> {
        self.save(Vec::new(), vec![(step, state, said)], Vec::new())
            .await
            .map(|_| ())
    }

    /// The rollout finished: steps still intended are run once more (an undrain), or
    /// given up (a drain no longer wanted) and said so.
    async fn finish_leftovers(&mut self) -> Result<(), DriveError> {
        self.run_intended().await?;
        let id = self.id.clone();
        let left = self.db.call(move |s| s.rollout_steps(&id, true)).await?;
        for step in left {
            let why = step.result.clone().unwrap_or_default();
            tracing::error!(step = step.id, command = %step.command, error = %why, "the rollout ended with this step failing: a human must finish it (e.g. undrain the host)");
            self.finish(
                step.id,
                ActionState::Failed,
                format!("given up when the rollout ended: {why}"),
            )
            .await?;
        }
        Ok(())
    }

    /// Applies what humans asked (abort, approve, clear a bad revision).
    async fn apply_requests(&mut self) -> Result<(), DriveError> {
        let name = self.cfg.name.clone();
        let requests = self
            .db
            .call(move |s| s.pending_rollout_requests(&name))
            .await?;
        if requests.is_empty() {
            return Ok(());
        }
        let mut applied = Vec::new();
        for r in requests {
            let outcome = apply_request(&mut self.rollout, self.clock.now(), &r.kind, &r.detail);
            tracing::info!(request = %r.kind, detail = %r.detail, outcome = %outcome, "request applied");
            applied.push((r.id, outcome));
        }
        self.save(Vec::new(), Vec::new(), applied).await?;
        Ok(())
    }

    async fn save_if_changed(&mut self) -> Result<(), DriveError> {
        if self.fingerprint() != self.saved || self.saved_at.elapsed() >= SAVE_SAMPLES_EVERY {
            self.save(Vec::new(), Vec::new(), Vec::new()).await?;
        }
        Ok(())
    }

    fn fingerprint(&self) -> (usize, Phase, Vec<String>) {
        (
            self.rollout.decisions().len(),
            self.rollout.phase().clone(),
            self.rollout.wave_hosts().to_vec(),
        )
    }

    /// Saves the state with new intents, finished steps and applied requests, in one
    /// transaction; returns the intents as stored.
    async fn save(
        &mut self,
        intents: Vec<(Option<String>, String)>,
        finished_steps: Vec<(i64, ActionState, String)>,
        applied_requests: Vec<(i64, String)>,
    ) -> Result<Vec<RolloutStep>, DriveError> {
        self.log_decisions();
        let save = RolloutSave {
            id: self.id.clone(),
            name: self.cfg.name.clone(),
            revision: self.rollout.revision().to_string(),
            phase: self.rollout.phase().to_string(),
            finished: self.rollout.is_finished(),
            state: serde_json::to_string(&self.rollout).expect("a rollout serialises"),
            clock_ms: unix_ms(self.clock.now()),
            now_ms: wall_ms().max(self.started_ms),
            intents,
            finished_steps,
            applied_requests,
        };
        let steps = self.db.call(move |s| s.save_rollout(&save)).await?;
        self.saved = self.fingerprint();
        self.saved_at = Instant::now();
        Ok(steps)
    }

    /// Logs the decisions made since the last call.
    fn log_decisions(&mut self) {
        for d in &self.rollout.decisions()[self.logged..] {
            tracing::info!(rollout = %self.id, "{}", d.what);
        }
        self.logged = self.rollout.decisions().len();
    }
}

/// The host a command concerns.
fn command_host(c: &Command) -> Option<String> {
    match c {
        Command::Drain { host } | Command::Undrain { host } | Command::Install { host, .. } => {
            Some(host.clone())
        }
        Command::Alert { .. } => None,
    }
}

/// The policy's state of a stored rollout.
pub fn decode(stored: &StoredRollout) -> Result<Rollout, DriveError> {
    serde_json::from_str(&stored.state).map_err(|e| {
        DriveError::BadState(format!(
            "the stored state of rollout {} cannot be read ({e}); it was written by another vigil version, or damaged",
            stored.id
        ))
    })
}

/// Applies a human's request to the policy; returns what it did, in words.
pub fn apply_request(rollout: &mut Rollout, now: Time, kind: &str, detail: &str) -> String {
    match kind {
        "abort" => {
            if rollout.is_finished() {
                format!("nothing to abort: the rollout is {}", rollout.phase())
            } else {
                rollout.abort(now, detail);
                format!("{}", rollout.phase())
            }
        }
        "approve" => {
            let before = rollout.phase().clone();
            rollout.approve(now);
            if *rollout.phase() == before {
                format!("nothing to approve: the rollout is {before}")
            } else {
                format!("approved; now {}", rollout.phase())
            }
        }
        "clear_bad" => {
            if rollout.bad_revisions().contains(detail) {
                rollout.clear_bad(now, detail);
                format!("revision {detail} cleared: it may be deployed again")
            } else {
                format!("revision {detail} was not marked bad")
            }
        }
        other => format!("unknown request {other:?}: ignored"),
    }
}
