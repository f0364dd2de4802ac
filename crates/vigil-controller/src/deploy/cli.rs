//! Command-line entry point of `vigil deploy`: thin glue that loads the config, opens
//! the store and runs one verb.
//!
//! Exit codes: 0 success (`run`: the rollout completed); 1 a runtime failure (the store,
//! a signal: the rollout resumes at the next `run`); 2 the rollout was rolled back; 3
//! the rollback failed (a human decides); 4 the rollout was aborted; 5 refused (a
//! revision marked bad, another rollout in progress, another deployer running, hosts
//! whose revision is unknown, nothing to abort); 78 a bad config.

use super::config::{self, DeployConfig};
use super::driver::{self, Db, DriveError, Driver, DriverLock};
use crate::clock::{rfc3339_ms, unix_ms, wall_ms};
use crate::prober::Prober;
use crate::store::{RolloutSave, StoredRollout};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use vigil_core::Time;
use vigil_core::rollout::{Command, Evidence, HostStep, Phase, Rollout, RolloutConfig};

/// Exit code: a runtime failure.
pub const EXIT_FAILURE: u8 = 1;
/// Exit code: the rollout failed and was rolled back.
pub const EXIT_ROLLED_BACK: u8 = 2;
/// Exit code: the rollback itself failed.
pub const EXIT_ROLLBACK_FAILED: u8 = 3;
/// Exit code: a human aborted the rollout.
pub const EXIT_ABORTED: u8 = 4;
/// Exit code: the request was refused.
pub const EXIT_REFUSED: u8 = 5;
/// Exit code: a bad configuration (sysexits' EX_CONFIG).
pub const EXIT_CONFIG: u8 = 78;
/// Most steps of a plan's dry run: far more than any fleet needs (each host takes a few).
const PLAN_STEPS: usize = 100_000;

/// Arguments of `vigil deploy`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The config file (TOML).
    #[arg(
        short,
        long,
        global = true,
        default_value = "deploy.toml",
        env = "VIGIL_DEPLOY_CONFIG"
    )]
    pub config: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: Verb,
}

/// Verbs of `vigil deploy`.
#[derive(clap::Subcommand, Debug)]
pub enum Verb {
    /// Print the waves a rollout of REVISION would make and why (the hosts are probed
    /// for their revision and health; nothing is changed, nothing is stored).
    Plan {
        /// The revision to deploy.
        #[arg(long)]
        revision: String,
    },
    /// Drive a rollout of REVISION to its end, logging every decision, or resume the
    /// rollout in progress. Exit 0 completed, 2 rolled back, 3 rollback failed, 4
    /// aborted, 5 refused.
    Run {
        /// The revision to deploy (may be left out to resume the rollout in progress).
        #[arg(long)]
        revision: Option<String>,
    },
    /// Show the stored state of the latest rollout.
    Status {
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Abort the rollout in progress (a running `run` applies it at its next round).
    Abort {
        /// Why (recorded with the decision).
        #[arg(long, default_value = "aborted from the command line")]
        reason: String,
    },
    /// Approve a wave held for an inconclusive verdict: it passes.
    Approve,
    /// Clear REVISION's bad mark (a human decision): it may be deployed again.
    ClearBad {
        /// The revision.
        revision: String,
    },
    /// Print the stored decisions of the latest rollout (or of --rollout ID), oldest
    /// first, each with its values.
    Explain {
        /// The rollout's id (default: the latest).
        #[arg(long)]
        rollout: Option<String>,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check the config and exit: 0 valid, 78 invalid.
    CheckConfig,
}

/// Runs `vigil deploy`.
pub fn run(args: Args) -> ExitCode {
    let cfg = match config::load(&args.config) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Verb::CheckConfig = args.command {
        let hosts = match cfg.controller.hosts {
            config::HostSource::Config => format!("{} hosts", cfg.hosts.len()),
            config::HostSource::Controller => format!("hosts from {}", cfg.controller.url),
        };
        println!(
            "{}: ok ({hosts}, install {:?}, drain {:?}, store {})",
            args.config.display(),
            cfg.install.kind,
            cfg.drain.kind,
            cfg.store.display()
        );
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("vigil-deploy")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vigil deploy: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let code = rt.block_on(verb(cfg, args.command));
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

async fn verb(cfg: Arc<DeployConfig>, verb: Verb) -> ExitCode {
    // Verbs that read or change a rollout never create the store: without one there is
    // no rollout (and a store being created by a starting `run` is not raced).
    if !matches!(verb, Verb::Plan { .. } | Verb::Run { .. }) && !cfg.store.exists() {
        return match verb {
            Verb::Status { json: true } => {
                println!(
                    "{}",
                    serde_json::json!({ "deployment": cfg.name, "rollout": null })
                );
                ExitCode::SUCCESS
            }
            Verb::Status { json: false } => {
                println!("deployment {:?}: no rollout yet", cfg.name);
                ExitCode::SUCCESS
            }
            _ => {
                eprintln!(
                    "vigil deploy: deployment {:?} has no rollout yet (no store at {})",
                    cfg.name,
                    cfg.store.display()
                );
                ExitCode::from(EXIT_REFUSED)
            }
        };
    }
    match verb {
        Verb::Plan { revision } => plan(cfg, &revision).await,
        Verb::Run { revision } => run_rollout(cfg, revision).await,
        Verb::Status { json } => with_db(&cfg, |db| status(cfg.clone(), db, json)).await,
        Verb::Abort { reason } => {
            with_db(&cfg, |db| request(cfg.clone(), db, "abort", reason)).await
        }
        Verb::Approve => {
            with_db(&cfg, |db| {
                request(cfg.clone(), db, "approve", String::new())
            })
            .await
        }
        Verb::ClearBad { revision } => {
            with_db(&cfg, |db| request(cfg.clone(), db, "clear_bad", revision)).await
        }
        Verb::Explain { rollout, json } => {
            with_db(&cfg, |db| explain(cfg.clone(), db, rollout, json)).await
        }
        Verb::CheckConfig => ExitCode::SUCCESS,
    }
}

/// Opens the store (an error is a runtime failure) and runs `f` with it.
async fn with_db<F, Fut>(cfg: &DeployConfig, f: F) -> ExitCode
where
    F: FnOnce(Db) -> Fut,
    Fut: std::future::Future<Output = Result<ExitCode, DriveError>>,
{
    let db = match Db::open(&cfg.store) {
        Ok(db) => db,
        Err(e) => {
            eprintln!("vigil deploy: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match f(db).await {
        Ok(code) => code,
        Err(e) => fail(&e),
    }
}

fn fail(e: &DriveError) -> ExitCode {
    eprintln!("vigil deploy: {e}");
    ExitCode::from(match e {
        DriveError::Refused(_) => EXIT_REFUSED,
        DriveError::Store(_) | DriveError::BadState(_) | DriveError::Unavailable(_) => EXIT_FAILURE,
    })
}

// === run ===

async fn run_rollout(cfg: Arc<DeployConfig>, revision: Option<String>) -> ExitCode {
    let driver = match Driver::start_or_resume(cfg.clone(), revision.as_deref()).await {
        Ok(d) => d,
        Err(e) => return fail(&e),
    };
    let id = driver.id().to_string();
    let (mut term, mut int) = match (
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()),
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("vigil deploy: cannot handle signals: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    tracing::info!(rollout = %id, "driving the rollout");
    let result = tokio::select! {
        r = driver.run() => r,
        _ = term.recv() => return interrupted(&id, "SIGTERM"),
        _ = int.recv() => return interrupted(&id, "SIGINT"),
    };
    let phase = match result {
        Ok(p) => p,
        Err(e) => return fail(&e),
    };
    let (code, word) = match &phase {
        Phase::Completed => (0, "completed"),
        Phase::RolledBack { .. } => (EXIT_ROLLED_BACK, "rolled back"),
        Phase::RollbackFailed { .. } => (EXIT_ROLLBACK_FAILED, "rollback failed"),
        Phase::Aborted { .. } => (EXIT_ABORTED, "aborted"),
        other => {
            eprintln!("vigil deploy: rollout {id} stopped unfinished: {other}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    tracing::info!(rollout = %id, outcome = word, "{phase}");
    let line = format!("rollout {id}: {phase}");
    if code == 0 {
        println!("{line}");
    } else {
        eprintln!("vigil deploy: {line}");
    }
    ExitCode::from(code)
}

fn interrupted(id: &str, signal: &str) -> ExitCode {
    let what = format!(
        "{signal}: stopped driving rollout {id}; its state is saved: `vigil deploy run` resumes it"
    );
    tracing::warn!("{what}");
    eprintln!("vigil deploy: {what}");
    ExitCode::from(EXIT_FAILURE)
}

// === plan ===

async fn plan(cfg: Arc<DeployConfig>, revision: &str) -> ExitCode {
    let resolved = match driver::resolve(cfg).await {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    if let Some(Err(why)) = &resolved.view {
        println!(
            "note: the controller cannot be read ({why}): `run` would hold before its first wave (fail closed)"
        );
    }
    let view = resolved.policy_view();
    let cfg = &*resolved.cfg;
    // Read-only: a store that is not there yet holds no bad revision and is not created.
    let (bad, in_progress) = if cfg.store.exists() {
        let db = match Db::open(&cfg.store) {
            Ok(db) => db,
            Err(e) => {
                eprintln!("vigil deploy: {e}");
                return ExitCode::from(EXIT_FAILURE);
            }
        };
        let name = cfg.name.clone();
        match db.call(move |s| s.latest_rollout(&name)).await {
            Ok(Some(l)) => match driver::decode(&l) {
                Ok(r) => (r.bad_revisions().clone(), (!l.finished).then_some(l)),
                Err(e) => return fail(&e),
            },
            Ok(None) => (Default::default(), None),
            Err(e) => return fail(&e.into()),
        }
    } else {
        (Default::default(), None)
    };
    if let Some(l) = in_progress {
        println!(
            "note: rollout {} of {} is in progress ({}); `run` would resume it, not start this one",
            l.id, l.revision, l.phase
        );
    }
    let prober = Prober::new(false);
    let (mut hosts, unknown) = driver::starting_hosts(cfg, &prober).await;
    for (h, why) in &unknown {
        println!(
            "note: {h}: revision unknown ({why}); `run` would refuse to start until it reports one. Planned as unhealthy."
        );
        let zone = cfg.host(h).map(|c| c.zone.clone()).unwrap_or_default();
        let mut s = vigil_core::rollout::HostSpec::new(h.clone(), zone, "(unknown)");
        s.healthy = false;
        hosts.push(s);
    }
    for h in &hosts {
        println!(
            "host {} (zone {:?}): runs {}, {}",
            h.id,
            h.zone,
            h.revision,
            if h.healthy { "healthy" } else { "unhealthy" }
        );
    }
    if let vigil_core::rollout::ControllerView::Read { held } = &view {
        for h in held {
            println!("host {h}: held by the controller (out of service, not touched)");
        }
    }
    let evidence = driver::evidence_of(cfg);
    match evidence {
        Evidence::BalancerRequests => println!(
            "verdicts: by the request counts of the balancer(s) at {} (errors per request, new hosts against old)",
            cfg.lb.admin.join(", ")
        ),
        Evidence::HostSamples => println!(
            "note: no [lb] admin configured: verdicts fall back to the host-reported rule (each host's own error-rate samples, {} per side), which sparse traffic can pass; name the balancers' admin listeners in [lb] admin to judge by what clients got",
            cfg.rollout.min_samples
        ),
    }
    match dry_run(&cfg.rollout, hosts, revision, bad, view, evidence) {
        Ok(decisions) => {
            println!(
                "plan for {revision} (assuming every host reports back passing and every wave passes its verdict):"
            );
            for d in decisions {
                println!("  {d}");
            }
            println!("nothing was changed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vigil deploy: {e}");
            ExitCode::from(EXIT_REFUSED)
        }
    }
}

/// The policy's decisions for a rollout in which every drain and install works and
/// every host reports back passing at once, and every wave passes its verdict once its
/// bake (as configured) is over: the waves it would make, and why. The policy is the
/// one `run` drives, with the config `run` uses and the evidence it would weigh; only
/// the verdict is assumed ([`Rollout::assume_pass`], which says by what rule `run`
/// judges it).
pub fn dry_run(
    config: &RolloutConfig,
    hosts: Vec<vigil_core::rollout::HostSpec>,
    revision: &str,
    bad: std::collections::BTreeSet<String>,
    view: vigil_core::rollout::ControllerView,
    evidence: Evidence,
) -> Result<Vec<String>, vigil_core::rollout::StartError> {
    let mut r = Rollout::start_seeing(config.clone(), hosts, revision, Time::ZERO, bad, view)?;
    r.judge_by(Time::ZERO, evidence);
    let mut now = Time::ZERO;
    for _ in 0..PLAN_STEPS {
        if r.is_finished() {
            break;
        }
        now = now + Duration::from_secs(1);
        // The bake passes in one step; the verdict is assumed.
        if let Phase::Baking { since, .. } = r.phase() {
            now = now.max(*since + config.bake);
        }
        r.assume_pass(now);
        let commands = r.poll(now);
        if commands.is_empty()
            && matches!(r.phase(), Phase::Held { reason, .. } if !reason.starts_with("inconclusive"))
        {
            break;
        }
        for c in commands {
            match c {
                Command::Drain { host } => r.drained(now, &host),
                Command::Install { host, revision, .. } => {
                    r.installed(now, &host, Ok(()));
                    r.report(now, &host, &revision, true);
                }
                Command::Undrain { .. } | Command::Alert { .. } => {}
            }
        }
    }
    Ok(r.decisions()
        .iter()
        .filter(|d| {
            !d.what.contains("reported back: revision") && !d.what.starts_with("verdicts weigh")
        })
        .map(|d| d.what.clone())
        .collect())
}

// === status, explain ===

async fn status(cfg: Arc<DeployConfig>, db: Db, json: bool) -> Result<ExitCode, DriveError> {
    let name = cfg.name.clone();
    let Some(latest) = db.call(move |s| s.latest_rollout(&name)).await? else {
        if json {
            println!(
                "{}",
                serde_json::json!({ "deployment": cfg.name, "rollout": null })
            );
        } else {
            println!("deployment {:?}: no rollout yet", cfg.name);
        }
        return Ok(ExitCode::SUCCESS);
    };
    let rollout = driver::decode(&latest)?;
    let id = latest.id.clone();
    let intended = db.call(move |s| s.rollout_steps(&id, true)).await?;
    let name = cfg.name.clone();
    let requests = db.call(move |s| s.pending_rollout_requests(&name)).await?;
    let hosts: Vec<(String, String, Option<HostStep>)> = cfg
        .hosts
        .iter()
        .map(|h| {
            (
                h.id.clone(),
                h.zone.clone(),
                rollout.host_step(&h.id).cloned(),
            )
        })
        .collect();
    let running = DriverLock::try_take(&cfg.store, &cfg.name)
        .ok()
        .is_some_and(|l| l.is_none());
    if json {
        let v = serde_json::json!({
            "deployment": cfg.name,
            "rollout": latest,
            "driver_running": running,
            "phase": rollout.phase(),
            "wave": rollout.wave_hosts(),
            "floor": rollout.floor(),
            "out_of_service": rollout.out_of_service(),
            "hosts": hosts.iter().map(|(id, zone, step)| serde_json::json!({"id": id, "zone": zone, "step": step})).collect::<Vec<_>>(),
            "bad_revisions": rollout.bad_revisions(),
            "intended_steps": intended,
            "requests": requests,
        });
        println!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "deployment {:?}: rollout {} of {}: {}",
        cfg.name, latest.id, latest.revision, latest.phase
    );
    println!(
        "  started {}, saved {}; {}",
        rfc3339_ms(latest.started_ms),
        rfc3339_ms(latest.updated_ms),
        if running {
            "a `vigil deploy run` is driving it"
        } else {
            "no deployer is running"
        }
    );
    println!(
        "  floor {} in service; {} out of service now; wave: {}",
        rollout.floor(),
        rollout.out_of_service(),
        if rollout.wave_hosts().is_empty() {
            "none".to_string()
        } else {
            rollout.wave_hosts().join(", ")
        }
    );
    for (id, zone, step) in &hosts {
        println!("  host {id} (zone {zone:?}): {}", step_words(step.as_ref()));
    }
    let bad: Vec<&str> = rollout.bad_revisions().iter().map(String::as_str).collect();
    println!(
        "  bad revisions: {}",
        if bad.is_empty() {
            "none".into()
        } else {
            bad.join(", ")
        }
    );
    for s in &intended {
        println!(
            "  step {} intended ({} attempts so far): {}{}",
            s.id,
            s.attempts,
            s.command,
            s.result
                .as_ref()
                .map(|r| format!("; last: {r}"))
                .unwrap_or_default()
        );
    }
    for r in &requests {
        println!("  request waiting for the driver: {} {}", r.kind, r.detail);
    }
    Ok(ExitCode::SUCCESS)
}

fn step_words(step: Option<&HostStep>) -> String {
    let at = |t: &Time| rfc3339_ms(unix_ms(*t));
    match step {
        None => "not part of this rollout".into(),
        Some(HostStep::Pending) => "pending".into(),
        Some(HostStep::Draining { since }) => format!("draining since {}", at(since)),
        Some(HostStep::Installing { since }) => format!("installing (drained since {})", at(since)),
        Some(HostStep::AwaitingReport { since }) => {
            format!("awaiting report-back (since {})", at(since))
        }
        Some(HostStep::Done { at: t }) => format!("done at {}", at(t)),
    }
}

async fn explain(
    cfg: Arc<DeployConfig>,
    db: Db,
    rollout: Option<String>,
    json: bool,
) -> Result<ExitCode, DriveError> {
    let name = cfg.name.clone();
    let all = db.call(move |s| s.rollouts(&name, 1000)).await?;
    let stored = match &rollout {
        Some(id) => all.into_iter().find(|r| r.id == *id),
        None => all.into_iter().next(),
    };
    let Some(stored) = stored else {
        eprintln!(
            "vigil deploy: {}",
            match rollout {
                Some(id) => format!("no rollout {id} in deployment {:?}", cfg.name),
                None => format!("deployment {:?} has no rollout yet", cfg.name),
            }
        );
        return Ok(ExitCode::from(EXIT_REFUSED));
    };
    let r = driver::decode(&stored)?;
    for d in r.decisions() {
        let at = rfc3339_ms(unix_ms(d.at));
        if json {
            println!(
                "{}",
                serde_json::json!({"rollout": stored.id, "at": at, "what": d.what})
            );
        } else {
            println!("{at}  {}", d.what);
        }
    }
    Ok(ExitCode::SUCCESS)
}

// === abort, approve, clear-bad ===

/// Applies a human's request: directly when no deployer runs (the lock is free), else
/// left in the store for the running deployer, waiting until it applied it.
async fn request(
    cfg: Arc<DeployConfig>,
    db: Db,
    kind: &'static str,
    detail: String,
) -> Result<ExitCode, DriveError> {
    let name = cfg.name.clone();
    let Some(latest) = db.call(move |s| s.latest_rollout(&name)).await? else {
        eprintln!("vigil deploy: deployment {:?} has no rollout yet", cfg.name);
        return Ok(ExitCode::from(EXIT_REFUSED));
    };
    if kind != "clear_bad" && latest.finished {
        eprintln!(
            "vigil deploy: nothing to {kind}: rollout {} is {}",
            latest.id, latest.phase
        );
        return Ok(ExitCode::from(EXIT_REFUSED));
    }
    let lock = DriverLock::try_take(&cfg.store, &cfg.name)
        .map_err(|e| DriveError::Refused(format!("cannot take the deploy lock: {e}")))?;
    if let Some(_lock) = lock {
        let mut rollout = driver::decode(&latest)?;
        let clock = crate::clock::Clock::start(Time::from_millis(
            u64::try_from(latest.clock_ms).unwrap_or(0),
        ));
        let now = clock.now();
        let outcome = driver::apply_request(&mut rollout, now, kind, &detail);
        save_direct(&db, &latest, &rollout, unix_ms(now)).await?;
        println!("rollout {}: {outcome}", latest.id);
        return Ok(ExitCode::SUCCESS);
    }
    let name = cfg.name.clone();
    let d = detail.clone();
    let id = db
        .call(move |s| s.add_rollout_request(&name, kind, &d, wall_ms()))
        .await?;
    println!("a deployer is running: {kind} left for it (request {id}); waiting until applied");
    let started = std::time::Instant::now();
    loop {
        if let Some(r) = db.call(move |s| s.rollout_request(id)).await?
            && let Some(outcome) = r.outcome
        {
            println!("rollout {}: {outcome}", latest.id);
            return Ok(ExitCode::SUCCESS);
        }
        if started.elapsed() > driver::REQUEST_WAIT {
            eprintln!(
                "vigil deploy: the running deployer has not applied the {kind} within {}; it stays waiting (request {id})",
                humantime::format_duration(driver::REQUEST_WAIT)
            );
            return Ok(ExitCode::from(EXIT_FAILURE));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Saves a rollout changed without a driver (under the deploy lock).
async fn save_direct(
    db: &Db,
    stored: &StoredRollout,
    rollout: &Rollout,
    clock_ms: i64,
) -> Result<(), DriveError> {
    let save = RolloutSave {
        id: stored.id.clone(),
        name: stored.name.clone(),
        revision: stored.revision.clone(),
        phase: rollout.phase().to_string(),
        finished: rollout.is_finished(),
        state: serde_json::to_string(rollout).expect("a rollout serialises"),
        clock_ms,
        now_ms: wall_ms(),
        ..RolloutSave::default()
    };
    db.call(move |s| s.save_rollout(&save)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_core::rollout::{ControllerView, Floor, HostSpec};

    fn read_nothing() -> ControllerView {
        ControllerView::Read {
            held: Default::default(),
        }
    }

    #[test]
    fn a_plan_shows_the_waves_within_the_floor_and_a_zone_at_a_time() {
        let hosts = vec![
            HostSpec::new("a1", "a", "v1"),
            HostSpec::new("a2", "a", "v1"),
            HostSpec::new("a3", "a", "v1"),
            HostSpec::new("b1", "b", "v1"),
            HostSpec::new("b2", "b", "v2"),
        ];
        let cfg = RolloutConfig {
            min_healthy: Floor::Percent(60),
            ..RolloutConfig::default()
        };
        let plan = dry_run(
            &cfg,
            hosts,
            "v2",
            Default::default(),
            read_nothing(),
            Evidence::BalancerRequests,
        )
        .unwrap();
        let waves: Vec<&String> = plan
            .iter()
            .filter(|d| d.starts_with("wave ") && d.contains(" of v2: "))
            .collect();
        assert_eq!(waves.len(), 3, "{plan:#?}");
        assert!(waves[0].contains("a1, a2 (2 hosts"), "{plan:#?}");
        assert!(waves[1].contains("a3 (1 hosts"), "{plan:#?}");
        assert!(
            waves[2].contains("b1 (1 hosts"),
            "b2 runs v2 already: {plan:#?}"
        );
        assert!(plan.last().unwrap().starts_with("completed"), "{plan:#?}");
    }

    #[test]
    fn a_plan_of_a_bad_revision_is_refused() {
        let hosts = vec![HostSpec::new("a1", "a", "v1")];
        let bad = ["v2".to_string()].into_iter().collect();
        let e = dry_run(
            &RolloutConfig::default(),
            hosts,
            "v2",
            bad,
            read_nothing(),
            Evidence::HostSamples,
        )
        .unwrap_err();
        assert!(e.to_string().contains("marked bad"), "{e}");
    }

    #[test]
    fn a_plan_bakes_as_run_does_and_names_the_last_waves_baseline() {
        let hosts: Vec<HostSpec> = (0..4)
            .map(|i| HostSpec::new(format!("h{i}"), "a", "v1"))
            .collect();
        let plan = dry_run(
            &RolloutConfig::default(),
            hosts.clone(),
            "v2",
            Default::default(),
            read_nothing(),
            Evidence::BalancerRequests,
        )
        .unwrap();
        let text = plan.join("\n");
        assert!(!text.contains("baking for 0s"), "{text}");
        assert_eq!(text.matches("baking for 5m").count(), 4, "{text}");
        assert!(
            !text.contains("no old-revision host left to compare with"),
            "{text}"
        );
        assert!(
            plan.iter().any(|d| d.starts_with("wave 4 baked 5m")
                && d.contains("old hosts' counts of the wave before")),
            "the last wave says what it is compared with: {text}"
        );
        assert!(plan.last().unwrap().starts_with("completed"), "{text}");
        // Without a balancer, the host-reported rule is named.
        let plan = dry_run(
            &RolloutConfig::default(),
            hosts,
            "v2",
            Default::default(),
            read_nothing(),
            Evidence::HostSamples,
        )
        .unwrap();
        assert!(
            plan.iter().any(|d| d.contains("the hosts' own samples")),
            "{plan:#?}"
        );
        assert!(plan.last().unwrap().starts_with("completed"), "{plan:#?}");
    }
}
