//! `vigil demo`: the whole system on one machine, in one command.
//!
//! Starts a fleet of example services (each a child `vigil example-service`), a load
//! balancer in front of them (`vigil lb`) with steady synthetic client traffic, and the
//! fleet controller (`vigil controller`, SQLite store, `log` actuator) watching them.
//! It prints the URLs to open, then narrates what the balancer and the controller do:
//! it polls their public endpoints and prints every change of a target's state, every
//! fail-open and freeze, and every decision, with the reason they give.
//!
//! Faults are injected with `--break` (after `--break-after`) or, in a terminal, by
//! typing a letter and Enter. Each fault switches a real mechanism in one service (a
//! killed process, a disk check that cannot pass, an unreachable database), never a
//! faked status.
//!
//! With `--replicas 2` (or 3) the controller runs as that many replicas on one
//! PostgreSQL schema the demo creates (and drops when it stops): one leads, all share
//! the probing, and `c` SIGKILLs the leader so that the narration shows another take
//! over and act on the fleet.
//!
//! Every child runs with `VIGIL_DIE_WITH_PARENT=1` (it asks the kernel for SIGTERM when
//! the demo dies, even by SIGKILL) and is stopped by the demo on Ctrl-C/SIGTERM: SIGTERM,
//! then SIGKILL after a grace period. No process or port is left behind.

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// `println!` that survives a closed stdout. `vigil demo | tee log` then Ctrl-C kills
/// `tee` too, often first: the demo must still stop and reap its children, where
/// `println!` would panic on the broken pipe. A failed write is dropped: nobody is left
/// to read it.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `eprintln!` that survives a closed stderr: with `vigil demo 2>&1 | tee log` the same
/// Ctrl-C closes stderr too, and `eprintln!` would panic (exit 101, and the runtime's
/// drop would then wait for the stdin reader: a hang until Enter).
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// `eprint!` that survives a closed stderr (see [`tell!`]).
macro_rules! tell_part {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut err = std::io::stderr().lock();
        let _ = write!(err, $($arg)*);
        let _ = err.flush();
    }};
}

mod deploy;
mod queue;

/// Services in the fleet by default: enough to show one ejection (1/6 stays far from the
/// panic threshold and the controller's 30% cap) and fail-open when all break.
pub const DEFAULT_SERVICES: u16 = 6;
/// First port of the demo's block: lb, lb admin, controller, then two per service.
/// Chosen away from the common 8080/9090 so the demo does not collide with other tools.
pub const DEFAULT_BASE_PORT: u16 = 7700;
/// Synthetic client load: steady enough to see errors as a percentage, light enough for
/// a 2-core laptop.
pub const DEFAULT_RPS: u32 = 50;
/// Extra latency of every query of svc-4 on `b`: above the database check's 200 ms "slow"
/// mark and well under its 1 s timeout, so its health is a steady warn, not a flap.
const BROWNOUT_MS: u64 = 500;
/// Half-period of svc-5's database flapping on `f`: each outage (2 failed probes at the
/// demo's 1 s interval) is shorter than the 3 failed checks either component needs to
/// take a target out, so what shows is the flapping itself, which the controller damps.
const FLAP_MS: u64 = 2000;
/// The demo services' disk check fails below this much free space, and never warns. The
/// example service's defaults (fail below 5%, warn below 10%) judge the machine's real
/// disk: on a nearly full laptop every service would fail and the balancer fail open
/// before any key is pressed, and a warn everywhere would hide the brownout's. `d`
/// still breaks svc-2's disk check (it then demands 100% free).
const DEMO_DISK_FAIL_BELOW: &str = "50MiB";
/// How long children get to drain after SIGTERM before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(8);
/// Token of the demo controller's mutating API (the demo is local-only).
const DEMO_TOKEN: &str = "vigil-demo";
/// The demo replicas' lease TTL: short, so that a failover shows within seconds (the
/// default, 10 s, suits a production network).
const DEMO_LEASE_TTL: &str = "3s";
/// The machine's PostgreSQL, where `--replicas` keeps the controller's state.
pub const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";

/// What `--break` can break.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Kill service 1 (SIGKILL): the balancer ejects it, the controller acts on it.
    Kill,
    /// Service 2's disk check demands a threshold no disk can meet: a local failure.
    Disk,
    /// Service 3's database becomes unreachable: its (critical) database check fails.
    Dependency,
    /// Service 4's queries get 500 ms slower: a brownout, a steady warn.
    Brownout,
    /// Service 5's database goes up and down: the controller damps the flapping.
    Flap,
    /// Every service's database becomes unreachable: a shared dependency outage. The
    /// balancer fails open, the controller freezes and blames the shared dependency.
    AllDeps,
    /// Worker-2's disk check demands 100% free: it stops pulling, no message fails.
    WorkerDisk,
    /// Worker-3 fails every message fast, every check passing: the controller finds it
    /// among its peers and acts once.
    BlackHole,
    /// Roll the next good revision out with `vigil deploy` (waves, drain, bake).
    Deploy,
    /// Roll a broken revision out: its hosts report back failing, the first wave fails
    /// and is rolled back, the revision is marked bad.
    DeployBad,
    /// With --replicas: SIGKILL the controller replica that leads; another takes over
    /// within the lease TTL and goes on acting on the fleet.
    KillLeader,
    /// Clear every injected fault, start a killed service (or controller replica) again,
    /// and start the controller again on a fresh store (full action budget, no flap
    /// penalty, no hold).
    Reset,
}

/// Arguments of `vigil demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Services in the fleet.
    #[arg(long, default_value_t = DEFAULT_SERVICES, value_parser = clap::value_parser!(u16).range(2..=50))]
    pub services: u16,
    /// First port of the block the demo uses (lb, lb admin, controller, then two per
    /// service). Every port must be free.
    #[arg(long, default_value_t = DEFAULT_BASE_PORT)]
    pub base_port: u16,
    /// Break something, after --break-after. Repeatable: `--break kill --break all-deps`
    /// applies them --break-after apart.
    #[arg(long = "break", value_enum)]
    pub breaks: Vec<Fault>,
    /// When to apply the first --break (and the gap between several).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub break_after: Duration,
    /// Stop by itself after this long (default: run until Ctrl-C).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Synthetic client requests per second through the balancer.
    #[arg(long, default_value_t = DEFAULT_RPS)]
    pub rps: u32,
    /// Where configs, logs and the controller's SQLite store go. Defaults to a fresh
    /// directory under the system's temp dir.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Database URL for the services (default: the machine's PostgreSQL; each service
    /// falls back quietly to its own SQLite file when it is not reachable).
    #[arg(long)]
    pub db: Option<String>,
    /// Run without the queue (workers on the machine's RabbitMQ), even when it is
    /// reachable.
    #[arg(long)]
    pub no_queue: bool,
    /// Controller replicas: 2 or 3 share one PostgreSQL schema (one leads, all probe;
    /// `c` kills the leader to show a failover). The queue is left out then: a worker
    /// sends its heartbeats to one controller address.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    pub replicas: u8,
    /// PostgreSQL for --replicas: the demo creates a schema of its own there and drops
    /// it when it stops.
    #[arg(long, default_value = DEFAULT_POSTGRES)]
    pub postgres: String,
}

/// The ports of one demo run.
#[derive(Clone, Debug)]
struct Ports {
    lb: u16,
    lb_admin: u16,
    /// The controller's (its first replica's) API.
    controller: u16,
    /// (application, reserved health) per service.
    services: Vec<(u16, u16)>,
    /// The API of every controller replica, the first one `controller`; the others
    /// come after the services' ports.
    controllers: Vec<u16>,
}

impl Ports {
    fn new(base: u16, services: usize, replicas: usize) -> Result<Ports> {
        let needed = 3 + 2 * services as u32 + replicas.saturating_sub(1) as u32;
        if u32::from(base) + needed > u32::from(u16::MAX) {
            bail!("--base-port {base} leaves no room for {needed} ports");
        }
        let after = base + 3 + 2 * services as u16;
        Ok(Ports {
            lb: base,
            lb_admin: base + 1,
            controller: base + 2,
            services: (0..services as u16)
                .map(|i| (base + 3 + 2 * i, base + 4 + 2 * i))
                .collect(),
            controllers: std::iter::once(base + 2)
                .chain((1..replicas as u16).map(|k| after + k - 1))
                .collect(),
        })
    }

    fn all(&self) -> Vec<u16> {
        let mut v = vec![self.lb, self.lb_admin];
        v.extend(&self.controllers);
        v.extend(self.services.iter().flat_map(|(a, h)| [*a, *h]));
        v
    }

    /// Fails, naming the port, if any port is taken.
    fn check_free(&self) -> Result<()> {
        for p in self.all() {
            TcpListener::bind(("127.0.0.1", p)).with_context(|| {
                format!("port {p} is in use; choose another block with --base-port")
            })?;
        }
        Ok(())
    }
}

/// Runs `vigil demo`.
pub fn run(args: DemoArgs) -> ExitCode {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            tell!("vigil demo: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(demo(args));
    // Nothing left to wait for: the children are reaped, the key reader is a thread of
    // its own (`keys`); tasks still in a request are dropped.
    rt.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tell!("vigil demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

struct Fleet {
    children: BTreeMap<String, Child>,
    queue: Option<queue::Queue>,
    /// Controller replicas the demo killed on purpose (`c`), down until a reset.
    down: Vec<usize>,
    /// The rollouts of `u` and `e`.
    deploys: deploy::Deploys,
}

impl Fleet {
    /// Stops every child: SIGTERM, then SIGKILL for those still running after the grace.
    /// Every child is waited for (reaped), so none is left behind as a zombie.
    async fn stop(&mut self) {
        self.deploys.stop().await;
        if let Some(q) = self.queue.take() {
            q.stop().await;
        }
        for child in self.children.values() {
            if let Some(pid) = child.id() {
                signal(pid, rustix::process::Signal::TERM);
            }
        }
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        for (name, child) in self.children.iter_mut() {
            reap(name, child, deadline).await;
        }
    }
}

/// Stops one child: SIGTERM, then SIGKILL after [`STOP_GRACE`]; waits for it either way.
async fn stop_child(name: &str, child: &mut Child) {
    if let Some(pid) = child.id() {
        signal(pid, rustix::process::Signal::TERM);
    }
    reap(name, child, tokio::time::Instant::now() + STOP_GRACE).await;
}

/// Waits for a child signalled to stop until `deadline`, then kills it (and waits).
async fn reap(name: &str, child: &mut Child, deadline: tokio::time::Instant) {
    if tokio::time::timeout_at(deadline, child.wait())
        .await
        .is_err()
    {
        tell!("demo: {name} did not stop within {STOP_GRACE:?}; killing it");
        if let Err(e) = child.kill().await {
            tell!("demo: cannot kill {name}: {e}");
        }
    }
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        // ESRCH: it has exited already, which is what we wanted.
        let _ = rustix::process::kill_process(pid, sig);
    }
}

async fn demo(args: DemoArgs) -> Result<()> {
    let replicas = usize::from(args.replicas);
    let ports = Ports::new(args.base_port, usize::from(args.services), replicas)?;
    ports.check_free()?;
    let dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("vigil-demo-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let exe = std::env::current_exe().context("finding the vigil binary")?;

    let names: Vec<String> = (1..=args.services).map(|i| format!("svc-{i}")).collect();
    write_lb_config(&dir, &ports)?;
    let with_queue = !args.no_queue
        && replicas == 1
        && match queue::reachable().await {
            Ok(()) => true,
            Err(e) => {
                say!("demo: no queue: RabbitMQ is not reachable ({e:#}); running without it");
                false
            }
        };
    let controller_extra = if with_queue {
        queue::controller_toml()
    } else {
        String::new()
    };
    let store = if replicas > 1 {
        let schema = format!("vigil_demo_{}", std::process::id());
        if !args.no_queue {
            say!(
                "demo: no queue with --replicas: a worker sends its heartbeats to one controller address"
            );
        }
        Some(ReplicaStore::create(&args.postgres, schema).await?)
    } else {
        None
    };
    let launcher = Launcher {
        exe: &exe,
        dir: &dir,
        ports: &ports,
        names: &names,
        db: args.db.as_deref(),
        with_queue,
        controller_extra: &controller_extra,
        store: store.as_ref(),
        revisions: std::sync::Mutex::new(vec!["v1".to_string(); names.len()]),
    };
    launcher.write_controller_configs(1)?;
    let mut fleet = Fleet {
        children: BTreeMap::new(),
        queue: None,
        down: Vec::new(),
        deploys: deploy::Deploys::default(),
    };
    let result = run_fleet(&args, &launcher, &mut fleet).await;
    tell!("demo: stopping {} processes", fleet.children.len());
    fleet.stop().await;
    match &store {
        Some(st) => {
            st.drop_runs().await;
            tell!(
                "demo: stopped; logs are in {}, and the replicas' schemas {}_* are dropped",
                dir.display(),
                st.schema
            );
        }
        None => tell!(
            "demo: stopped; logs and the controller's store are in {}",
            dir.display()
        ),
    }
    result
}

/// The PostgreSQL schemas the controller replicas keep their state in: one per run of
/// the controller (a reset starts them on a fresh one, as a single controller starts on
/// a fresh SQLite store).
struct ReplicaStore {
    /// The server, as given (`--postgres`).
    url: String,
    /// The schemas' prefix: `<prefix>_<run>`.
    schema: String,
    created: std::sync::Mutex<Vec<String>>,
}

impl ReplicaStore {
    /// Checks that PostgreSQL answers, and creates the first run's schema.
    async fn create(url: &str, schema: String) -> Result<ReplicaStore> {
        let st = ReplicaStore {
            url: url.to_string(),
            schema,
            created: std::sync::Mutex::new(Vec::new()),
        };
        st.schema_for(1).await?;
        Ok(st)
    }

    /// One statement on the server, off the async threads.
    async fn execute(&self, sql: String) -> Result<()> {
        let url = self.url.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut c = postgres::Client::connect(&url, postgres::NoTls)
                .with_context(|| format!("--replicas needs PostgreSQL: cannot connect to {url} (choose another with --postgres)"))?;
            // Its NOTICEs ("does not exist, skipping") are not the demo's news.
            c.batch_execute(&format!("SET client_min_messages = warning; {sql}"))
                .with_context(|| format!("{sql} on {url}"))?;
            Ok(())
        })
        .await
        .context("the PostgreSQL task")?
    }

    /// Creates run `run`'s schema; its store URL.
    async fn schema_for(&self, run: u64) -> Result<String> {
        let name = format!("{}_{run}", self.schema);
        self.execute(format!(
            "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"
        ))
        .await?;
        self.created
            .lock()
            .expect("not poisoned")
            .push(name.clone());
        Ok(self.url_of(&name))
    }

    /// The store URL of schema `name`: the server's, with `name` as its search_path.
    fn url_of(&self, name: &str) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}options=-csearch_path%3D{name}", self.url)
    }

    /// Drops every schema this demo created (a failure is said, not fatal).
    async fn drop_runs(&self) {
        let names = std::mem::take(&mut *self.created.lock().expect("not poisoned"));
        for name in names {
            if let Err(e) = self
                .execute(format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                .await
            {
                tell!("demo: cannot drop schema {name}: {e:#}");
            }
        }
    }
}

/// How each child is started, at first and again on a reset (a killed service, the
/// controller on a fresh store).
struct Launcher<'a> {
    exe: &'a Path,
    dir: &'a Path,
    ports: &'a Ports,
    names: &'a [String],
    db: Option<&'a str>,
    /// Whether the demo runs its queue (RabbitMQ reachable, no `--no-queue`).
    with_queue: bool,
    /// The queue's part of the controller's config.
    controller_extra: &'a str,
    /// Where the controller replicas keep their state (`--replicas` > 1); None: one
    /// controller on SQLite.
    store: Option<&'a ReplicaStore>,
    /// The revision each service runs (v1 at the start; `u` and `e` roll others out).
    revisions: std::sync::Mutex<Vec<String>>,
}

impl Launcher<'_> {
    /// The revision service `i` runs.
    fn revision(&self, i: usize) -> String {
        self.revisions.lock().expect("not poisoned")[i].clone()
    }

    fn set_revision(&self, i: usize, revision: &str) {
        self.revisions.lock().expect("not poisoned")[i] = revision.to_string();
    }

    /// Service `i` (0-based) on its revision. `again`: append to its log rather than
    /// start a new one.
    fn service(&self, i: usize, again: bool) -> Result<Child> {
        let name = &self.names[i];
        let revision = self.revision(i);
        let (app, health) = self.ports.services[i];
        let mut cmd = child_command(self.exe, self.dir, name, again)?;
        cmd.arg("example-service")
            .args(["--name", name])
            .args(["--listen", &format!("127.0.0.1:{app}")])
            .args(["--health-listen", &format!("127.0.0.1:{health}")])
            .args(["--data-dir", &self.dir.join(name).display().to_string()])
            .args([
                "--workers",
                "1",
                "--check-interval",
                "1s",
                "--drain-delay",
                "1s",
            ])
            .args(["--revision", &revision])
            .args([
                "--disk-fail-below",
                if deploy::is_bad(&revision) {
                    "100%"
                } else {
                    DEMO_DISK_FAIL_BELOW
                },
            ])
            .args(["--disk-warn-below", "off"])
            .arg("--dependency-critical");
        if let Some(db) = self.db {
            cmd.args(["--db", db]);
        }
        spawn(cmd, name)
    }

    fn lb(&self) -> Result<Child> {
        let mut cmd = child_command(self.exe, self.dir, "lb", false)?;
        cmd.arg("lb").arg("-c").arg(self.dir.join("lb.toml"));
        spawn(cmd, "lb")
    }

    /// Controller replica `k` (0-based) on the config `write_controller_configs` wrote
    /// last.
    fn controller(&self, k: usize, again: bool) -> Result<Child> {
        let name = controller_name(k);
        let mut cmd = child_command(self.exe, self.dir, &name, again)?;
        cmd.arg("controller")
            .arg("-c")
            .arg(self.dir.join(controller_file(k)));
        spawn(cmd, &name)
    }

    /// Every controller replica's config for the controller's `run`th start (a fresh
    /// store each: a new SQLite directory, or a new PostgreSQL schema).
    fn write_controller_configs(&self, run: u64) -> Result<()> {
        let url = self
            .store
            .map(|st| st.url_of(&format!("{}_{run}", st.schema)));
        for (k, port) in self.ports.controllers.iter().enumerate() {
            let replica = url.as_ref().map(|u| (u.as_str(), k));
            write_controller_config(
                self.dir,
                self.ports,
                *port,
                self.names,
                run,
                self.controller_extra,
                replica,
            )?;
        }
        Ok(())
    }
}

/// Controller replica `k`'s child name (its log and config file names too).
fn controller_name(k: usize) -> String {
    if k == 0 {
        "controller".to_string()
    } else {
        format!("controller-{}", k + 1)
    }
}

/// Controller replica `k`'s config file: `fleet.toml` for the first.
fn controller_file(k: usize) -> String {
    if k == 0 {
        "fleet.toml".to_string()
    } else {
        format!("fleet-{}.toml", k + 1)
    }
}

/// Controller replica `k`'s replica id.
fn replica_id(k: usize) -> String {
    format!("r{}", k + 1)
}

async fn run_fleet(args: &DemoArgs, launcher: &Launcher<'_>, fleet: &mut Fleet) -> Result<()> {
    let (ports, dir, names) = (launcher.ports, launcher.dir, launcher.names);
    for (i, name) in names.iter().enumerate() {
        fleet
            .children
            .insert(name.clone(), launcher.service(i, false)?);
    }
    fleet.children.insert("lb".into(), launcher.lb()?);
    for k in 0..ports.controllers.len() {
        fleet
            .children
            .insert(controller_name(k), launcher.controller(k, false)?);
    }

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .pool_max_idle_per_host(64)
        .build()?;
    wait_until_up(&client, ports, fleet).await?;
    if launcher.with_queue {
        fleet.queue = Some(queue::start(launcher, fleet).await?);
    }

    let lb = format!("http://127.0.0.1:{}", ports.lb);
    let admin = format!("http://127.0.0.1:{}", ports.lb_admin);
    let ctl = format!("http://127.0.0.1:{}", ports.controller);
    say!("");
    say!(
        "vigil demo is running: {} services, a load balancer, {}",
        names.len(),
        match ports.controllers.len() {
            1 => "a controller".to_string(),
            n => format!("{n} controller replicas"),
        }
    );
    say!("  dashboard          {ctl}/");
    say!("  load balancer      {lb}/items/1");
    say!("  lb targets (JSON)  {admin}/admin/targets");
    say!("  lb metrics         {admin}/metrics");
    say!("  controller API     {ctl}/api/targets  {ctl}/api/decisions  {ctl}/api/guard");
    say!("  controller metrics {ctl}/metrics");
    if ports.controllers.len() > 1 {
        for (k, p) in ports.controllers.iter().enumerate() {
            say!(
                "  controller {:<7} http://127.0.0.1:{p}/  who leads http://127.0.0.1:{p}/api/leader",
                replica_id(k)
            );
        }
        if let Some(st) = launcher.store {
            say!(
                "  controller store   PostgreSQL {} schema {}_1 (lease TTL {DEMO_LEASE_TTL})",
                st.url,
                st.schema
            );
        }
    }
    for (name, (app, health)) in names.iter().zip(&ports.services) {
        say!(
            "  {name:<18} http://127.0.0.1:{app}/  health http://127.0.0.1:{health}/health?verbose"
        );
    }
    for line in fleet.queue.iter().flat_map(|q| q.banner()) {
        say!("{line}");
    }
    say!("  logs               {}", dir.display());
    say!("");
    say!("Break things: type a letter and Enter: k kill svc-1, d disk svc-2, p dependency svc-3,");
    say!("  b brownout svc-4, f flap svc-5, a all dependencies, w disk worker-2,");
    say!(
        "  h black hole worker-3, u deploy a good revision, e deploy a bad one,{} r reset,\n  q quit (or Ctrl-C).",
        if ports.controllers.len() > 1 {
            " c kill the leading controller replica,"
        } else {
            ""
        }
    );
    say!("");

    let traffic = Arc::new(Traffic::default());
    let stop = tokio::sync::watch::channel(false);
    let traffic_task = tokio::spawn(generate(
        client.clone(),
        lb.clone(),
        args.rps,
        traffic.clone(),
        stop.1.clone(),
    ));
    // Which run of the controller the narrator is watching: a reset starts a new one
    // on a fresh store, whose decision ids start again from 1.
    let controller_run = Arc::new(AtomicU64::new(1));
    let killed: Killed = Arc::default();
    let narrator = tokio::spawn(narrate(
        client.clone(),
        admin.clone(),
        ports
            .controllers
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect(),
        traffic.clone(),
        controller_run.clone(),
        killed.clone(),
        stop.1.clone(),
    ));

    let started = Instant::now();
    let mut breaks = args.breaks.clone().into_iter();
    let mut next_break = started + args.break_after;
    let mut stdin = keys();
    let mut stdin_open = true;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let outcome = loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break Ok(()),
            _ = sigterm.recv() => break Ok(()),
            line = stdin.recv(), if stdin_open => match line {
                Some(l) => {
                    let fault = match l.trim() {
                        "k" => Some(Fault::Kill), "d" => Some(Fault::Disk),
                        "p" => Some(Fault::Dependency), "b" => Some(Fault::Brownout),
                        "f" => Some(Fault::Flap), "a" => Some(Fault::AllDeps),
                        "w" => Some(Fault::WorkerDisk), "h" => Some(Fault::BlackHole),
                        "c" => Some(Fault::KillLeader),
                        "u" => Some(Fault::Deploy), "e" => Some(Fault::DeployBad),
                        "r" => Some(Fault::Reset), "q" => break Ok(()),
                        "" => None,
                        other => { say!("demo: unknown key {other:?} (k d p b f a w h u e c r q)"); None }
                    };
                    if let Some(f) = fault
                        && let Err(e) = apply(f, &client, launcher, fleet, &controller_run, &killed).await
                    {
                        break Err(e);
                    }
                }
                // No terminal (CI, a pipe closed): keep running on flags alone.
                None => stdin_open = false,
            },
            _ = tick.tick() => {
                if let Err(e) = deploy::install_wanted(launcher, fleet).await {
                    break Err(e);
                }
                if let Some(d) = args.duration
                    && started.elapsed() >= d
                {
                    break Ok(());
                }
                if Instant::now() >= next_break {
                    match breaks.next() {
                        Some(f) => {
                            if let Err(e) = apply(f, &client, launcher, fleet, &controller_run, &killed).await {
                                break Err(e);
                            }
                            next_break = Instant::now() + args.break_after;
                        }
                        None => next_break = started + Duration::from_secs(u64::from(u32::MAX)),
                    }
                }
                if let Some(dead) = fleet.children.iter_mut().find_map(|(n, c)| match c.try_wait() {
                    Ok(Some(status)) if n == "lb" || n.starts_with("controller") => Some(format!("{n} exited ({status}); see its log in {}", dir.display())),
                    _ => None,
                }) {
                    break Err(anyhow::anyhow!(dead));
                }
            }
        }
    };
    let _ = stop.0.send(true);
    for (what, task) in [("traffic", traffic_task), ("narrator", narrator)] {
        if let Err(e) = task.await {
            tell!("demo: the {what} task failed: {e}");
        }
    }
    let t = traffic.snapshot();
    say!(
        "demo: traffic through the balancer: {} requests, {} ok, {} errors ({:.3}% success)",
        t.0,
        t.1,
        t.0.saturating_sub(t.1),
        if t.0 == 0 {
            100.0
        } else {
            100.0 * t.1 as f64 / t.0 as f64
        }
    );
    outcome
}

/// The lines typed on stdin, read by a thread of their own. A read from a terminal
/// cannot be cancelled: on the runtime's blocking pool it would hold up the runtime's
/// drop (a demo stopped by Ctrl-C would wait for Enter). The thread is left blocked in
/// its read when the demo stops, and ends with the process.
fn keys() -> tokio::sync::mpsc::Receiver<String> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let spawned = std::thread::Builder::new()
        .name("demo-keys".into())
        .spawn(move || {
            for line in std::io::stdin().lines() {
                // Ends on EOF, a read error or the demo no longer listening.
                let Ok(line) = line else { break };
                if tx.blocking_send(line).is_err() {
                    break;
                }
            }
        });
    if let Err(e) = spawned {
        tell!("demo: cannot read keys from stdin ({e}); running on flags alone");
    }
    rx
}

/// A child's command line with its log file `name.log` in `dir` (appended to when
/// `again`: a restarted child keeps the history of its previous run).
fn child_command(exe: &Path, dir: &Path, name: &str, again: bool) -> Result<Command> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(again)
        .truncate(!again)
        .open(dir.join(format!("{name}.log")))
        .with_context(|| format!("opening {name}.log in {}", dir.display()))?;
    let mut cmd = Command::new(exe);
    // A demo run by systemd must not let its children speak for it.
    cmd.env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID");
    cmd.env("VIGIL_DIE_WITH_PARENT", "1")
        .env("VIGIL_LOG_FORMAT", "text")
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true);
    Ok(cmd)
}

fn spawn(mut cmd: Command, name: &str) -> Result<Child> {
    cmd.spawn().with_context(|| format!("starting {name}"))
}

async fn wait_until_up(client: &reqwest::Client, ports: &Ports, fleet: &mut Fleet) -> Result<()> {
    let mut urls = vec![format!("http://127.0.0.1:{}/livez", ports.lb_admin)];
    urls.extend(
        ports
            .controllers
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}/livez")),
    );
    urls.extend(
        ports
            .services
            .iter()
            .map(|(_, h)| format!("http://127.0.0.1:{h}/livez")),
    );
    tell_part!("demo: starting {} processes", fleet.children.len());
    wait_for_urls(client, &urls, fleet, true).await?;
    tell!(" up");
    Ok(())
}

/// Waits until every URL answers 2xx, failing if a child exits meanwhile or after 30 s.
/// `dots`: print a dot on stderr as each answers.
async fn wait_for_urls(
    client: &reqwest::Client,
    urls: &[String],
    fleet: &mut Fleet,
    dots: bool,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    for url in urls {
        loop {
            if client
                .get(url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                break;
            }
            for (name, child) in fleet.children.iter_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    bail!("{name} exited at start ({status}); see {name}.log");
                }
            }
            if Instant::now() > deadline {
                bail!("{url} did not answer within 30s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if dots {
            tell_part!(".");
        }
    }
    Ok(())
}

/// Applies one fault. Fails only when the demo cannot go on (a reset could not start
/// a child again).
async fn apply(
    f: Fault,
    client: &reqwest::Client,
    launcher: &Launcher<'_>,
    fleet: &mut Fleet,
    controller_run: &AtomicU64,
    killed: &Killed,
) -> Result<()> {
    let (ports, names) = (launcher.ports, launcher.names);
    let app = |i: usize| {
        format!(
            "http://127.0.0.1:{}",
            ports.services[i % ports.services.len()].0
        )
    };
    let name = |i: usize| names[i % names.len()].clone();
    let post = |url: String| {
        let client = client.clone();
        async move {
            match client.post(&url).send().await {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => say!("demo: {url} answered {}", r.status()),
                Err(e) => say!("demo: {url}: {e}"),
            }
        }
    };
    match f {
        Fault::Kill => {
            let n = name(0);
            say!("demo: BREAK kill: SIGKILL {n}");
            if let Some(pid) = fleet.children.get(&n).and_then(|c| c.id()) {
                signal(pid, rustix::process::Signal::KILL);
            }
        }
        Fault::Disk => {
            say!(
                "demo: BREAK disk: {}'s disk check now demands 100% free space",
                name(1)
            );
            post(format!("{}/fault/disk?on=true", app(1))).await;
        }
        Fault::Dependency => {
            say!(
                "demo: BREAK dependency: {}'s database becomes unreachable",
                name(2)
            );
            post(format!("{}/fault/dependency?on=true", app(2))).await;
        }
        Fault::Brownout => {
            say!(
                "demo: BREAK brownout: {}'s queries get {BROWNOUT_MS} ms slower",
                name(3)
            );
            post(format!("{}/fault/brownout?ms={BROWNOUT_MS}", app(3))).await;
        }
        Fault::Flap => {
            say!(
                "demo: BREAK flap: {}'s database goes down for {FLAP_MS} ms, up for {FLAP_MS} ms, again and again",
                name(4)
            );
            post(format!("{}/fault/flap?on=true&period_ms={FLAP_MS}", app(4))).await;
        }
        Fault::AllDeps => {
            say!("demo: BREAK all-deps: every service's database becomes unreachable");
            for i in 0..names.len() {
                post(format!("{}/fault/dependency?on=true", app(i))).await;
            }
        }
        Fault::WorkerDisk | Fault::BlackHole => match &fleet.queue {
            Some(q) if f == Fault::WorkerDisk => q.break_disk(client).await,
            Some(q) => q.break_black_hole(client).await,
            None => say!("demo: no queue in this run (RabbitMQ not reachable, or --no-queue)"),
        },
        Fault::Deploy | Fault::DeployBad => {
            let run = controller_run.load(Ordering::SeqCst);
            fleet
                .deploys
                .start(launcher, run, f == Fault::DeployBad)
                .await?;
        }
        Fault::KillLeader => {
            if ports.controllers.len() < 2 {
                say!("demo: c needs several controller replicas (--replicas 2)");
                return Ok(());
            }
            let mut leader = None;
            for (k, p) in ports.controllers.iter().enumerate() {
                if fleet.down.contains(&k) {
                    continue;
                }
                let l = get_json(client, &format!("http://127.0.0.1:{p}/api/leader")).await;
                if let Some(l) = l
                    && l["leading"].as_bool() == Some(true)
                {
                    leader = Some((k, l["epoch"].as_i64().unwrap_or(0)));
                    break;
                }
            }
            let Some((k, epoch)) = leader else {
                say!("demo: no controller replica leads right now; try c again in a few seconds");
                return Ok(());
            };
            let name = controller_name(k);
            say!(
                "demo: BREAK kill-leader: SIGKILL controller replica {} (it leads, epoch {epoch}); another takes over within the lease TTL ({DEMO_LEASE_TTL})",
                replica_id(k)
            );
            if let Some(mut c) = fleet.children.remove(&name) {
                if let Some(pid) = c.id() {
                    signal(pid, rustix::process::Signal::KILL);
                }
                let _ = c.wait().await;
            }
            fleet.down.push(k);
            *killed.lock().expect("not poisoned") = Some((replica_id(k), Instant::now()));
        }
        Fault::Reset => {
            say!("demo: RESET every injected fault");
            fleet.deploys.stop().await;
            if let Some(q) = &fleet.queue {
                q.reset(client, launcher, &mut fleet.children).await?;
            }
            let mut restarted = Vec::new();
            for (i, n) in names.iter().enumerate() {
                let running = fleet
                    .children
                    .get_mut(n)
                    .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
                if running {
                    post(format!("{}/fault/reset", app(i))).await;
                    continue;
                }
                say!("demo: {n} is not running: starting it again");
                fleet.children.insert(n.clone(), launcher.service(i, true)?);
                restarted.push(format!("http://127.0.0.1:{}/livez", ports.services[i].1));
            }
            // Flap penalties, holds and spent budget tokens are the guard's memory, kept
            // in the store on purpose (a restart never refills the budget): the demo
            // forgets them by starting the controller again on a fresh store.
            let run = controller_run.load(Ordering::SeqCst) + 1;
            for k in 0..ports.controllers.len() {
                let name = controller_name(k);
                if let Some(mut c) = fleet.children.remove(&name) {
                    stop_child(&name, &mut c).await;
                }
            }
            fleet.down.clear();
            *killed.lock().expect("not poisoned") = None;
            let fresh = match launcher.store {
                Some(st) => {
                    st.schema_for(run).await?;
                    format!("PostgreSQL schema {}_{run}", st.schema)
                }
                None => controller_dir(launcher.dir, run).display().to_string(),
            };
            launcher.write_controller_configs(run)?;
            for (k, p) in ports.controllers.iter().enumerate() {
                fleet
                    .children
                    .insert(controller_name(k), launcher.controller(k, true)?);
                restarted.push(format!("http://127.0.0.1:{p}/livez"));
            }
            wait_for_urls(client, &restarted, fleet, false).await?;
            controller_run.store(run, Ordering::SeqCst);
            say!(
                "demo: the controller started again on a fresh store ({fresh}): full action budget, no flap penalty, no hold, an empty decision log"
            );
        }
    }
    Ok(())
}

#[derive(Default)]
struct Traffic {
    /// Requests answered (or failed): counted on completion, so a request still in
    /// flight when the demo stops is not reported as an error.
    sent: AtomicU64,
    ok: AtomicU64,
}

impl Traffic {
    /// (sent, ok), with ok <= sent.
    fn snapshot(&self) -> (u64, u64) {
        let ok = self.ok.load(Ordering::SeqCst);
        (self.sent.load(Ordering::SeqCst), ok)
    }
}

/// Open-loop client traffic: `rps` requests per second, whatever the answers take.
async fn generate(
    client: reqwest::Client,
    lb: String,
    rps: u32,
    traffic: Arc<Traffic>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    if rps == 0 {
        return;
    }
    let mut every = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rps)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut i: u64 = 0;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = every.tick() => {}
        }
        i += 1;
        let url = format!("{lb}/items/{}", 1 + i % 10);
        let (client, traffic) = (client.clone(), traffic.clone());
        tokio::spawn(async move {
            let ok = client
                .get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            // sent before ok, and `snapshot` reads them the other way round: a reader
            // never sees more ok than sent.
            traffic.sent.fetch_add(1, Ordering::SeqCst);
            if ok {
                traffic.ok.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
}

/// The controller replica the demo last killed on purpose (`c`), and when.
type Killed = Arc<std::sync::Mutex<Option<(String, Instant)>>>;

/// Prints what changed at the balancer and the controller, with their reasons, and a
/// traffic line every 10 s. `ctls`: every controller replica's API, read from the
/// first that answers (any replica serves the reads); with several, who leads too.
async fn narrate(
    client: reqwest::Client,
    admin: String,
    ctls: Vec<String>,
    traffic: Arc<Traffic>,
    controller_run: Arc<AtomicU64>,
    killed: Killed,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut leader: Option<(String, i64)> = None;
    let mut watching_run = controller_run.load(Ordering::SeqCst);
    let mut lb_state: BTreeMap<String, String> = BTreeMap::new();
    let mut fail_open: Option<bool> = None;
    let mut frozen: Option<bool> = None;
    let mut seen_decisions: i64 = 0;
    let mut last_outcome: BTreeMap<String, String> = BTreeMap::new();
    let mut every = tokio::time::interval(Duration::from_millis(500));
    let mut last_line = Instant::now();
    let mut last_traffic = traffic.snapshot();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = every.tick() => {}
        }
        let run = controller_run.load(Ordering::SeqCst);
        if run != watching_run {
            // A new controller on a fresh store: its decisions are numbered from 1.
            watching_run = run;
            seen_decisions = 0;
            last_outcome.clear();
            frozen = None;
        }
        if let Some(v) = get_json(&client, &format!("{admin}/admin/targets")).await {
            for (pool, p) in v["pools"].as_object().into_iter().flatten() {
                let fo = p["fail_open"].as_bool().unwrap_or(false);
                if fail_open.is_some_and(|f| f != fo) || (fail_open.is_none() && fo) {
                    say!(
                        "lb: pool {pool} {} ({} of {} healthy, panic threshold {})",
                        if fo {
                            "FAILS OPEN: routing to every target"
                        } else {
                            "left fail-open"
                        },
                        p["healthy"],
                        p["known"],
                        p["panic_threshold"]
                    );
                }
                fail_open = Some(fo);
                for t in p["targets"].as_array().into_iter().flatten() {
                    let addr = t["addr"].as_str().unwrap_or("?").to_string();
                    let state = t["state"].as_str().unwrap_or("?").to_string();
                    if lb_state.get(&addr).is_some_and(|s| *s != state) {
                        let why = t["reason"]
                            .as_str()
                            .or(t["ejection_reason"].as_str())
                            .unwrap_or("");
                        say!("lb: target {addr} {} -> {state}: {why}", lb_state[&addr]);
                    }
                    lb_state.insert(addr, state);
                }
            }
        }
        let mut answering = None;
        for c in &ctls {
            if let Some(g) = get_json(&client, &format!("{c}/api/guard")).await {
                answering = Some((c.as_str(), g));
                break;
            }
        }
        let ctl = answering.as_ref().map_or(ctls[0].as_str(), |(c, _)| c);
        if ctls.len() > 1
            && let Some(l) = get_json(&client, &format!("{ctl}/api/leader")).await
        {
            let lease = &l["leader"];
            let now = (
                lease["holder"].as_str().unwrap_or("?").to_string(),
                lease["epoch"].as_i64().unwrap_or(0),
            );
            let live = lease["expires_ms"].as_i64() > lease["now_ms"].as_i64();
            if live && leader.as_ref() != Some(&now) {
                let after = killed
                    .lock()
                    .expect("not poisoned")
                    .take()
                    .map(|(r, at)| {
                        format!(
                            ", {:.1} s after {r} was killed (lease TTL {DEMO_LEASE_TTL})",
                            at.elapsed().as_secs_f64()
                        )
                    })
                    .unwrap_or_default();
                say!(
                    "controller: replica {} {} (epoch {}){after}",
                    now.0,
                    if leader.is_some() {
                        "LEADS NOW"
                    } else {
                        "leads"
                    },
                    now.1
                );
                leader = Some(now);
            }
        }
        if let Some((_, g)) = answering {
            let guard = &g["guard"];
            let fr = guard["frozen"].as_bool().unwrap_or(false);
            if frozen.is_some_and(|f| f != fr) || (frozen.is_none() && fr) {
                say!(
                    "controller: {} {}",
                    if fr {
                        "FROZEN, acting on no one:"
                    } else {
                        "unfrozen"
                    },
                    reasons(&guard["reasons"])
                );
            }
            frozen = Some(fr);
        }
        if let Some(d) = get_json(&client, &format!("{ctl}/api/decisions?limit=20")).await {
            let mut fresh: Vec<&Value> = d["decisions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|x| x["id"].as_i64().is_some_and(|id| id > seen_decisions))
                .collect();
            fresh.sort_by_key(|x| x["id"].as_i64());
            for x in fresh {
                seen_decisions = seen_decisions.max(x["id"].as_i64().unwrap_or(0));
                // One line per change of outcome for a target: a held-back target is
                // re-decided at every probe, and saying so each time would drown the rest.
                let target = x["target"].as_str().unwrap_or("?").to_string();
                let outcome = x["outcome"].as_str().unwrap_or("?").to_string();
                if last_outcome.insert(target, outcome.clone()).as_deref() == Some(outcome.as_str())
                {
                    continue;
                }
                say!(
                    "controller: {} {}: {}",
                    x["outcome"].as_str().unwrap_or("?"),
                    x["target"].as_str().unwrap_or("?"),
                    x["summary"]
                        .as_str()
                        .map_or_else(|| reasons(&x["reasons"]), str::to_string)
                );
            }
        }
        if last_line.elapsed() >= Duration::from_secs(10) {
            let now = traffic.snapshot();
            let (sent, ok) = (now.0 - last_traffic.0, now.1 - last_traffic.1);
            say!(
                "traffic: {sent} requests in the last 10s, {ok} ok, {} errors",
                sent.saturating_sub(ok)
            );
            last_traffic = now;
            last_line = Instant::now();
        }
    }
}

fn reasons(reasons: &Value) -> String {
    match reasons {
        Value::Array(rs) => rs
            .iter()
            .map(|r| {
                r.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| r.to_string())
            })
            .collect::<Vec<_>>()
            .join("; "),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

async fn get_json(client: &reqwest::Client, url: &str) -> Option<Value> {
    let r = client.get(url).send().await.ok()?;
    r.json().await.ok()
}

fn write_lb_config(dir: &Path, ports: &Ports) -> Result<()> {
    let targets: Vec<String> = ports
        .services
        .iter()
        .enumerate()
        .map(|(i, (app, _))| {
            format!(
                "  {{ addr = \"127.0.0.1:{app}\", zone = \"{}\" }},",
                zone(i)
            )
        })
        .collect();
    let cfg = format!(
        r#"# Written by `vigil demo`.
listen = "127.0.0.1:{lb}"
admin_listen = "127.0.0.1:{admin}"
drain_timeout = "2s"

[timeouts]
connect = "300ms"
response_header = "2s"

[pools.fleet]
targets = [
{targets}
]
panic_threshold = 0.5
slow_start_window = "5s"

# The demo's balancer reads deep health (/health as health+json) so that you can watch
# it fail open when a shared dependency fails everywhere. In production, point a
# balancer at /readyz (local health) and leave dependencies to the controller.
[pools.fleet.health_check]
path = "/health"
health_json = true
interval = "1s"
timeout = "500ms"
healthy_threshold = 2
unhealthy_threshold = 3
new_targets = "healthy"

[pools.fleet.outlier]
base_ejection_time = "10s"
max_ejection_percent = 20
"#,
        lb = ports.lb,
        admin = ports.lb_admin,
        targets = targets.join("\n"),
    );
    std::fs::write(dir.join("lb.toml"), cfg).context("writing lb.toml")
}

fn zone(i: usize) -> &'static str {
    ["zone-a", "zone-b", "zone-c"][i % 3]
}

/// The store of the controller's `run`th start (each reset starts it on a fresh one).
fn controller_dir(dir: &Path, run: u64) -> PathBuf {
    dir.join(format!("controller-{run}"))
}

/// The config of one controller (`port`: its API) for its `run`th start. `replica`:
/// the PostgreSQL store URL and its replica index when it is one of several.
fn write_controller_config(
    dir: &Path,
    ports: &Ports,
    port: u16,
    names: &[String],
    run: u64,
    extra: &str,
    replica: Option<(&str, usize)>,
) -> Result<()> {
    let mut targets = String::new();
    for (i, (name, (_, health))) in names.iter().zip(&ports.services).enumerate() {
        targets.push_str(&format!(
            "\n[[targets]]\nid = \"{name}\"\nurl = \"http://127.0.0.1:{health}\"\nzone = \"{}\"\n",
            zone(i)
        ));
    }
    let (file, data, store) = match replica {
        Some((url, k)) => (
            controller_file(k),
            dir.join(format!("controller-{run}-{}", replica_id(k))),
            format!(
                "\n# Several replicas on one PostgreSQL schema: one leads, all probe.\n[store]\nurl = \"{url}\"\n\n[replicas]\nid = \"{}\"\nlease_ttl = \"{DEMO_LEASE_TTL}\"\n",
                replica_id(k)
            ),
        ),
        None => (controller_file(0), controller_dir(dir, run), String::new()),
    };
    let cfg = format!(
        r#"# Written by `vigil demo`.
listen = "127.0.0.1:{ctl}"
data_dir = "{data}"
api_token = "{DEMO_TOKEN}"
{store}
[probe]
interval = "1s"
timeout = "800ms"

[guard]
min_failing = "3s"
grace = "3s"
max_unhealthy_fraction = 0.3

[guard.thresholds]
healthy_threshold = 2
unhealthy_threshold = 3

[guard.budget]
actions = 2
per = "10m"

[actuator]
kind = "log"

# The balancer's pools on the same page as the guard.
[dashboard]
balancers = ["http://127.0.0.1:{lb_admin}"]
{targets}{extra}"#,
        ctl = port,
        lb_admin = ports.lb_admin,
        data = data.display(),
    );
    std::fs::write(dir.join(&file), cfg).with_context(|| format!("writing {file}"))
}
