//! Command-line entry point of `vigil controller`: thin glue that loads the config,
//! opens the store, recovers the guard, starts the tasks and handles signals.

use crate::api::{self, AppState, HeartbeatAuth};
use crate::config::{self, ControllerConfig};
use crate::discovery;
use crate::engine::{Command, Engine, Plan, Source};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::prober::Prober;
use crate::scheduler::{self, Heartbeats};
use crate::store::pg::CONTROLLER_LEASE;
use crate::store::{self, PostgresStore, SqliteStore, Store, StoreError, StoreHandle, StoreHealth};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

/// Exit code for a bad configuration (sysexits' EX_CONFIG).
const EXIT_CONFIG: u8 = 78;
/// Exit code when the daemon cannot run (listener, runtime): sysexits' EX_SOFTWARE
/// would blame us; 1 is the generic failure operators expect. A store it refuses is
/// bad state: [`EXIT_CONFIG`].
const EXIT_FAILURE: u8 = 1;
/// Engine mailbox size: large enough for a burst of results from every probe in
/// flight; when full, probers wait (back-pressure rather than unbounded memory).
const ENGINE_QUEUE: usize = 65_536;
/// How long shutdown waits for in-flight probes and actions before giving up on them
/// (an action cut short stays `intended` and runs again after a restart).
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Arguments of `vigil controller`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The config file (TOML).
    #[arg(
        short,
        long,
        global = true,
        default_value = "fleet.toml",
        env = "VIGIL_CONTROLLER_CONFIG"
    )]
    pub config: PathBuf,
    /// Start over with an empty store when the store is refused (0 bytes, not a vigil
    /// store, failing its integrity check, unwritable): the old file is moved aside,
    /// and what it held is lost (budget spent, holds, freezes, flap penalties, history,
    /// intended actions). A usable store is kept all the same.
    #[arg(long)]
    pub reset_store: bool,
    /// What to do (default: run the controller).
    #[command(subcommand)]
    pub command: Option<Verb>,
}

/// What `--reset-store` loses, said where it is offered and where it is used.
const RESET_LOSES: &str = "the action budget already spent (it is full again), every hold (silences, maintenance) and a manual freeze, flap penalties and failure streaks, the decision, transition and action history, and any action left intended (it is not run again)";

/// A store or state the controller refuses to start on (exit 78, like a bad config).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BadState(String);

/// Verbs of `vigil controller`.
#[derive(clap::Subcommand, Debug)]
pub enum Verb {
    /// Check the config (and the discovery file) and exit: 0 valid, 78 invalid.
    CheckConfig,
    /// Print the key heartbeat target TARGET signs its heartbeats with (derived from
    /// `heartbeat.secret` or VIGIL_HEARTBEAT_SECRET): give it to that worker only.
    HeartbeatKey {
        /// The target's id.
        target: String,
    },
}

/// Runs `vigil controller`.
pub fn run(args: Args) -> ExitCode {
    match args.command {
        Some(Verb::CheckConfig) => check_config(&args.config),
        Some(Verb::HeartbeatKey { target }) => heartbeat_key(&args.config, &target),
        None => daemon(&args.config, args.reset_store),
    }
}

fn heartbeat_key(path: &Path, target: &str) -> ExitCode {
    let cfg = match config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match cfg.heartbeat.effective_secret() {
        Some(secret) => {
            println!("{}", crate::heartbeat::target_key(&secret, target));
            ExitCode::SUCCESS
        }
        None => {
            eprintln!(
                "{}: heartbeat.secret is not set (nor VIGIL_HEARTBEAT_SECRET): no key to derive",
                path.display()
            );
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

fn check_config(path: &Path) -> ExitCode {
    let cfg = match config::check(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let mut discovered = 0;
    if let Some(d) = &cfg.discovery
        && let Some(file) = d.file()
    {
        match discovery::read(file).and_then(|t| {
            cfg.heartbeat
                .check_targets(&t, "targets")
                .map(|()| t)
                .map_err(|e| format!("{}: {e}", file.display()))
        }) {
            Ok(t) => discovered = t.len(),
            Err(e) => {
                eprintln!("discovery: {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    }
    let groups = cfg
        .discovery
        .as_ref()
        .and_then(|d| d.aws.as_ref())
        .map(|a| {
            format!(
                ", Auto Scaling groups {} listed at run time",
                a.groups.join(", ")
            )
        })
        .unwrap_or_default();
    println!(
        "{}: ok ({} targets, {} discovered{groups}, actuator {:?}, listen {})",
        path.display(),
        cfg.targets.len(),
        discovered,
        cfg.actuator.kind,
        cfg.listen
    );
    ExitCode::SUCCESS
}

fn daemon(path: &Path, reset_store: bool) -> ExitCode {
    let cfg = match config::load(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("vigil-controller")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    // On a worker thread, not this one: what start-up allocates (targets, guard state)
    // and frees then shares the workers' malloc arena with the probing that follows, so
    // its freed memory is reused instead of left behind in an arena nobody else uses.
    let result = rt.block_on(async {
        match tokio::spawn(serve(path.to_path_buf(), cfg, reset_store)).await {
            Ok(r) => r,
            Err(e) => Err(anyhow::anyhow!("the controller task failed: {e}")),
        }
    });
    // Tasks cut short by the drain grace must not hold the exit up.
    rt.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("vigil controller: {e:#}");
            if e.downcast_ref::<BadState>().is_some() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::from(EXIT_FAILURE)
            }
        }
    }
}

/// Opens the store, or refuses to start (BadState) on one it cannot use unless
/// `--reset-store` says to start over.
fn open_store(db: &Path, reset_store: bool) -> anyhow::Result<SqliteStore> {
    match SqliteStore::open(db) {
        Ok(s) => {
            if reset_store {
                tracing::warn!(store = %db.display(), "--reset-store given but the store is usable: kept (delete the file to start over)");
            }
            Ok(s)
        }
        Err(e) if !reset_store => Err(BadState(format!(
            "{e}\nrefusing to start: starting over would lose {RESET_LOSES}. Restore the file, or start once with --reset-store to start over (the file is kept aside)."
        ))
        .into()),
        Err(e) => {
            let aside = store::set_aside(db).map_err(|e| BadState(e.to_string()))?;
            let kept = aside.map_or_else(|| "no file".to_string(), |p| p.display().to_string());
            tracing::warn!(store = %db.display(), refused = %e, old_store_kept_as = %kept, "--reset-store: starting over with an empty store; lost: {RESET_LOSES}");
            eprintln!("vigil controller: --reset-store: {e}; starting over with an empty store (old file kept as {kept}); lost: {RESET_LOSES}");
            SqliteStore::open(db).map_err(|e| BadState(e.to_string()).into())
        }
    }
}

async fn serve(path: PathBuf, cfg: ControllerConfig, reset_store: bool) -> anyhow::Result<()> {
    use anyhow::Context;
    // Listen first: a port already taken fails the start before anything is created
    // (a data dir, a store file, a schema) for a controller that cannot run.
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| {
            format!(
                "{}: key `listen`: cannot listen on {}",
                path.display(),
                cfg.listen
            )
        })?;
    let addr = listener.local_addr()?;
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("creating data_dir {}", cfg.data_dir.display()))?;
    let db = cfg.data_dir.join("vigil.db");
    let replica = cfg.replicas.effective_id();
    let (lead_tx, lead_rx) = watch::channel(Leadership::alone(replica.clone()));
    // Several replicas on PostgreSQL: the store refuses unfenced commits, and the lease
    // is kept on a connection of its own.
    let (store, lease_store, shown): (Box<dyn Store>, _, String) = match &cfg.store.url {
        Some(url) => {
            if reset_store {
                tracing::warn!(
                    "--reset-store does nothing with a PostgreSQL store: drop its schema to start over"
                );
            }
            // The blocking client runs its own runtime: opened off this one.
            let open = async |url: &str| {
                let url = url.to_string();
                let opened = tokio::task::spawn_blocking(move || PostgresStore::open(&url))
                    .await
                    .map_err(|e| anyhow::anyhow!("opening the store panicked: {e}"))?;
                opened.map_err(|e| -> anyhow::Error {
                    match e {
                        StoreError::TooNew { .. } | StoreError::Unusable { .. } => {
                            BadState(format!("{e}\nrefusing to start")).into()
                        }
                        e => anyhow::anyhow!("{e}"),
                    }
                })
            };
            // Every statement bounded well inside the lease: a hung database or a
            // lock held elsewhere fails a call in time, it does not freeze the leader.
            let (statement, lock) = crate::store::pg::limits_for_lease(cfg.replicas.lease_ttl);
            let s = open(url)
                .await?
                .for_replica(CONTROLLER_LEASE, &replica)
                .with_limits(statement, lock);
            let shown = s.url().to_string();
            let lease = open(url).await?.with_limits(statement, lock);
            lead_tx.send_modify(|l| {
                l.store = "postgres";
                l.lease = CONTROLLER_LEASE.to_string();
            });
            tracing::info!(store = %shown, replica = %replica, lease_ttl = ?cfg.replicas.lease_ttl, "PostgreSQL store: this replica follows until it holds the leader lease");
            (Box::new(s), Some(lease), shown)
        }
        None => (
            Box::new(open_store(&db, reset_store)?),
            None,
            db.display().to_string(),
        ),
    };
    let (store, store_thread) = StoreHandle::spawn(store);
    let metrics = Arc::new(Metrics::new());
    let store_health = Arc::new(StoreHealth::default());
    let cfg = Arc::new(cfg);

    let (engine_tx, engine_rx) = mpsc::channel(ENGINE_QUEUE);
    let (actions_tx, actions_rx) = mpsc::unbounded_channel();
    let (plan_tx, plan_rx) = watch::channel(Arc::new(Plan {
        targets: Vec::new(),
        probe: cfg.probe.clone(),
        heartbeat_ttl: cfg.heartbeat.ttl,
    }));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (config_tx, config_rx) = watch::channel(cfg.clone());

    let (mut engine, report) = Engine::recover(
        cfg.clone(),
        store.clone(),
        metrics.clone(),
        store_health.clone(),
        actions_tx.clone(),
        plan_tx,
    )
    .await
    .map_err(|e| {
        BadState(format!(
            "recovering the guard from the store {shown}: {e:#}\nrefusing to start: starting over would lose {RESET_LOSES}; --reset-store starts over (the file is kept aside)"
        ))
    })?;
    let (probing_tx, probing_rx) =
        watch::channel(Arc::new(crate::probing::Probing::alone(replica.clone())));
    let lease_task = lease_store.map(|lease_store| {
        engine.replicated(lead_rx.clone());
        engine.sharded(crate::probing::Sharding::new(
            replica.clone(),
            cfg.replicas.probers,
            cfg.replicas.lease_ttl,
            cfg.probe.interval,
            probing_tx.clone(),
        ));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(crate::leader::run(
            lease_store,
            cfg.replicas.lease(),
            CONTROLLER_LEASE.to_string(),
            replica.clone(),
            lead_tx,
            stop_rx,
        ));
        (stop_tx, task)
    });
    let report = if lease_task.is_some() {
        // The leader resumes intended actions when its term begins, not every replica.
        crate::engine::RecoveryReport {
            pending: Vec::new(),
            ..report
        }
    } else {
        report
    };
    tracing::info!(
        store = %shown,
        snapshot = report.snapshot,
        ops_replayed = report.ops,
        pending_actions = report.pending.len(),
        "store opened, guard recovered"
    );
    // What start-up read of the discovery file (its hash, good or bad) is handed to
    // the watcher: a change made after this read is one it has not seen, whenever it
    // comes (the watcher's first poll compares against it).
    let discovery_status = Arc::new(discovery::DiscoveryStatus::new(metrics.clone()));
    let (discovered, seen) = match cfg
        .discovery
        .as_ref()
        .and_then(|d| d.file().map(|f| (d, f)))
    {
        Some((d, _)) => match std::fs::read_to_string(&d.path) {
            Ok(text) => {
                let seen = Some((d.path.clone(), text_hash(&text)));
                match parse_discovery(&cfg, &d.path, &text) {
                    Ok(t) => {
                        tracing::info!(file = %d.path.display(), targets = t.len(), "discovery file read at start");
                        discovery_status.succeeded(Source::Discovery, t.len());
                        (Some(t), seen)
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "discovery file rejected at start; the targets the store knows are kept until a good file arrives");
                        discovery_status.failed(Source::Discovery, &e);
                        (None, seen)
                    }
                }
            }
            Err(e) => {
                tracing::error!(file = %d.path.display(), error = %e, "discovery file unreadable at start; the targets the store knows are kept until a good file arrives");
                discovery_status.failed(Source::Discovery, &format!("{}: {e}", d.path.display()));
                (None, None)
            }
        },
        None => (Some(Vec::new()), None),
    };
    engine.initial_targets(cfg.targets.clone(), discovered);

    let tasks = tokio_util::task::TaskTracker::new();
    let views = engine.views();
    let engine_task = tokio::spawn(engine.run(engine_rx, shutdown_rx.clone()));
    for a in report.pending {
        tracing::warn!(action = a.id, target_id = %a.target, attempts = a.attempts, "resuming an action left intended by the last run");
        let _ = actions_tx.send(a);
    }
    let heartbeats = Arc::new(Heartbeats::default());
    let permits = crate::actuator::Permits::default();
    tasks.spawn(crate::actuator::run(
        actions_rx,
        config_rx.clone(),
        store.clone(),
        metrics.clone(),
        tasks.clone(),
        permits.clone(),
    ));
    tasks.spawn(scheduler::run(
        plan_rx.clone(),
        probing_rx.clone(),
        engine_tx.clone(),
        {
            let prober = Prober::for_config(&cfg.probe).context("probe.ca_file")?;
            if lease_task.is_some() {
                prober.for_replica(&replica)
            } else {
                prober
            }
        },
        heartbeats.clone(),
        metrics.clone(),
        shutdown_rx.clone(),
        tasks.clone(),
    ));
    tasks.spawn(watch_discovery(
        config_rx.clone(),
        engine_tx.clone(),
        discovery_status.clone(),
        shutdown_rx.clone(),
        seen,
    ));
    tasks.spawn(crate::aws::discovery::run(
        config_rx.clone(),
        engine_tx.clone(),
        discovery_status.clone(),
        shutdown_rx.clone(),
    ));

    let heartbeat_auth = Arc::new(RwLock::new(HeartbeatAuth::of(&cfg)));
    let token = Arc::new(RwLock::new(cfg.effective_token()));
    if token.read().expect("token lock").is_none() {
        tracing::warn!("no api_token configured: mutating API calls are refused");
    }
    let balancers: crate::balancers::BalancerViews = Arc::default();
    tasks.spawn(crate::balancers::run(
        config_rx.clone(),
        balancers.clone(),
        shutdown_rx.clone(),
    ));
    let app = api::router(AppState {
        engine: engine_tx.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
        token: token.clone(),
        heartbeats,
        plan: plan_rx,
        heartbeat_auth: heartbeat_auth.clone(),
        store_health,
        views,
        config: config_rx.clone(),
        balancers,
        leadership: lead_rx,
        probing: probing_rx,
        discovery: discovery_status,
        permits,
    });
    let mut server_shutdown = shutdown_rx.clone();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = server_shutdown.changed().await;
            })
            .await
    });
    // Handlers before saying we listen: a SIGTERM sent as soon as the log says so must
    // drain and exit 0, not find the default action (kill, no final snapshot).
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    tracing::info!(addr = %addr, url = %format!("http://{addr}/"), "vigil controller listening");
    let mut current = cfg;
    let serving = format!("serving on http://{addr}/");
    vigil_daemon::systemd::ready(&serving);
    let watchdog = tokio::spawn(vigil_daemon::systemd::watchdog());
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: draining"); break; }
            _ = int.recv() => { tracing::info!("SIGINT: draining"); break; }
            _ = hup.recv() => {
                vigil_daemon::systemd::reloading();
                match config::load(&path) {
                    Ok(new) => {
                        if new.listen != current.listen || new.data_dir != current.data_dir {
                            tracing::warn!("listen and data_dir changes need a restart; the rest is applied");
                        }
                        let new = Arc::new(new);
                        *token.write().expect("token lock") = new.effective_token();
                        *heartbeat_auth.write().expect("heartbeat auth lock") = HeartbeatAuth::of(&new);
                        let _ = config_tx.send(new.clone());
                        if engine_tx.send(Command::Reconfigure(new.clone())).await.is_err() {
                            break;
                        }
                        current = new;
                        tracing::info!(config = %path.display(), "SIGHUP: config reloaded");
                    }
                    Err(e) => tracing::error!(error = %e, "SIGHUP: new config rejected; keeping the old one"),
                }
                vigil_daemon::systemd::ready(&serving);
            }
        }
    }
    vigil_daemon::systemd::stopping();
    watchdog.abort();
    let _ = shutdown_tx.send(true);
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "HTTP server failed"),
        Err(e) => tracing::error!(error = %e, "HTTP server task panicked"),
    }
    if let Err(e) = engine_task.await {
        tracing::error!(error = %e, "engine task panicked");
    }
    // The engine's last commit is in: give the lease up, so another replica takes over
    // at its next attempt rather than after the TTL.
    if let Some((stop, task)) = lease_task {
        let _ = stop.send(());
        if let Err(e) = task.await {
            tracing::error!(error = %e, "lease task panicked");
        }
    }
    drop(engine_tx);
    drop(actions_tx);
    tasks.close();
    let drained = tokio::time::timeout(DRAIN_GRACE, tasks.wait())
        .await
        .is_ok();
    drop(store);
    if drained {
        // Every handle is gone: the store thread finishes its queue and exits.
        if !matches!(
            tokio::task::spawn_blocking(move || store_thread.join()).await,
            Ok(Ok(()))
        ) {
            tracing::error!("store thread panicked");
        }
    } else {
        // A task cut short still holds a store handle; its thread dies with the
        // process. Everything committed is on disk already.
        tracing::warn!(
            "drain grace ran out: unfinished actions stay intended and run after a restart"
        );
    }
    tracing::info!("vigil controller stopped");
    Ok(())
}

/// A discovery file's text, hashed: a large file is not kept (nor copied at every
/// poll) just to see whether it changed.
fn text_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// A discovery file's targets, checked as the config's are (heartbeat targets need
/// the heartbeat secret).
fn parse_discovery(
    cfg: &ControllerConfig,
    path: &Path,
    text: &str,
) -> Result<Vec<config::TargetConfig>, String> {
    let targets = discovery::parse(path, text)?;
    cfg.heartbeat
        .check_targets(&targets, "targets")
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(targets)
}

/// Polls the discovery file; a changed, valid list replaces the old one; an invalid
/// one is reported and ignored (the old list stays). `seen`: the file as start-up read
/// it (path and hash), so the first poll applies any change made since.
async fn watch_discovery(
    mut config: watch::Receiver<Arc<ControllerConfig>>,
    engine: mpsc::Sender<Command>,
    status: Arc<discovery::DiscoveryStatus>,
    mut shutdown: watch::Receiver<bool>,
    seen: Option<(PathBuf, u64)>,
) {
    let mut last = seen;
    // Whether the current spell of an unreadable file was reported (start-up reports
    // its own).
    let mut unreadable_reported = true;
    loop {
        let d = config
            .borrow_and_update()
            .discovery
            .clone()
            .filter(|d| d.file().is_some());
        let poll = d.as_ref().map_or(Duration::from_secs(1), |d| d.poll);
        if let Some(d) = d {
            match std::fs::read_to_string(&d.path) {
                Ok(text) => {
                    unreadable_reported = false;
                    let hash = text_hash(&text);
                    let changed = last
                        .as_ref()
                        .is_none_or(|(p, h)| *p != d.path || *h != hash);
                    if changed {
                        let cfg = config.borrow().clone();
                        match parse_discovery(&cfg, &d.path, &text) {
                            Ok(targets) => {
                                tracing::info!(file = %d.path.display(), targets = targets.len(), "discovery file changed");
                                status.succeeded(Source::Discovery, targets.len());
                                if engine
                                    .send(Command::Targets {
                                        source: Source::Discovery,
                                        targets,
                                    })
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                            }
                            Err(e) => {
                                status.failed(Source::Discovery, &e);
                                tracing::error!(error = %e, "discovery file rejected; keeping the previous target list")
                            }
                        }
                        last = Some((d.path.clone(), hash));
                    }
                }
                Err(e) => {
                    // Every unreadable poll counts; the log says it once per spell.
                    status.failed(Source::Discovery, &format!("{}: {e}", d.path.display()));
                    if !unreadable_reported {
                        tracing::error!(file = %d.path.display(), error = %e, "discovery file unreadable; keeping the previous target list");
                        unreadable_reported = true;
                    }
                }
            }
        }
        tokio::select! {
            biased;
            _ = shutdown.changed() => return,
            _ = config.changed() => {}
            _ = tokio::time::sleep(poll) => {}
        }
    }
}
