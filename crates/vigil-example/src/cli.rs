//! Command-line entry point of the example service (`vigil example-service`, or
//! `cargo run --release --example service`).

use crate::service::{AdmissionMode, ServiceConfig, start};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use vigil::checks::Amount;

/// Default application address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default reserved health address: the next port, the convention the README shows.
pub const DEFAULT_HEALTH_LISTEN: &str = "127.0.0.1:8081";
/// Default database: the machine's PostgreSQL, trust auth, database `test`.
pub const DEFAULT_DB: &str = "postgres://postgres@127.0.0.1:5432/test";
/// Default check interval: 1 s, so a demo shows changes at once; a production service
/// would use 5-10 s for dependencies.
pub const DEFAULT_CHECK_INTERVAL: &str = "1s";
/// Default application concurrency before shedding: far above what 2 cores can run at
/// once, so shedding only starts when the service is truly behind.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 512;

/// Arguments of the example service. Every option also reads an environment variable.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Application address.
    #[arg(long, env = "VIGIL_EXAMPLE_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Reserved health listener address (its own thread and runtime).
    #[arg(long, env = "VIGIL_EXAMPLE_HEALTH_LISTEN", default_value = DEFAULT_HEALTH_LISTEN)]
    pub health_listen: SocketAddr,
    /// HAProxy agent-check responder address (`agent-check agent-port ...`): one line
    /// per connection, `up ready 100%` / `up ready 50%` / `down #reason` / `drain`.
    /// Off unless given.
    #[arg(long, env = "VIGIL_EXAMPLE_AGENT_LISTEN")]
    pub agent_listen: Option<SocketAddr>,
    /// gRPC health v1 address (`grpc.health.v1.Health`, Check and Watch; service `""`
    /// is the whole server, SERVING while readiness passes or warns), for a standard
    /// gRPC health client or Kubernetes' `grpc` probe. Off unless given.
    #[arg(long, env = "VIGIL_EXAMPLE_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,
    /// PostgreSQL URL. When unreachable at start, a local SQLite file is used instead.
    #[arg(long, env = "VIGIL_EXAMPLE_DB", default_value = DEFAULT_DB)]
    pub db: String,
    /// The revision this instance runs, reported in health+json as `releaseId` (what
    /// `vigil deploy` reads to see a host report back). Tests "install" a revision by
    /// restarting the service with another value. Defaults to the package version.
    #[arg(long, env = "VIGIL_EXAMPLE_REVISION", default_value = env!("CARGO_PKG_VERSION"))]
    pub revision: String,
    /// Instance name, shown in `/health`'s description and the SQLite file name.
    #[arg(long, env = "VIGIL_EXAMPLE_NAME", default_value = "example")]
    pub name: String,
    /// Directory for the SQLite fallback file; its filesystem is what the disk check
    /// watches. Defaults to `<tmp>/vigil-example`.
    #[arg(long, env = "VIGIL_EXAMPLE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Free space on the data directory's filesystem below which `/health` warns:
    /// a percentage (`10%`) or a size (`2GiB`); `off` never warns.
    #[arg(long, env = "VIGIL_EXAMPLE_DISK_WARN_BELOW", default_value = "10%", value_parser = parse_warn_level)]
    pub disk_warn_below: WarnLevel,
    /// Free space on the data directory's filesystem below which `/health` fails
    /// (readiness too): a percentage (`5%`) or a size (`500MiB`).
    #[arg(long, env = "VIGIL_EXAMPLE_DISK_FAIL_BELOW", default_value = "5%")]
    pub disk_fail_below: Amount,
    /// Worker threads of the application runtime. Defaults to the number of CPUs.
    #[arg(long, env = "VIGIL_EXAMPLE_WORKERS")]
    pub workers: Option<usize>,
    /// Application requests in flight at most: the admission layer's adaptive limit
    /// never goes above it; with `--admission off`, the fixed limit over which new ones
    /// are shed with 503.
    #[arg(long, env = "VIGIL_EXAMPLE_MAX_IN_FLIGHT", default_value_t = DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// Admission control on the application's port: `on` (the default) refuses with a
    /// fast 503 + Retry-After work whose deadline (`x-vigil-deadline-ms`, `grpc-timeout`)
    /// has passed or cannot be met, keeps an adaptive (AIMD) concurrency limit and a
    /// controlled-delay queue (adaptive LIFO under overload), and warns in `/readyz`
    /// while it sheds; `off` keeps only the fixed `--max-in-flight` limit (the naive
    /// setup benchmarks compare it with). Health paths are never refused.
    #[arg(long, env = "VIGIL_EXAMPLE_ADMISSION", default_value = "on", value_parser = parse_admission)]
    pub admission: AdmissionMode,
    /// The longest a database read waits before the read is answered from the cache,
    /// e.g. `1s`, `300ms`; a caller's shorter deadline shortens it (less 50 ms to
    /// answer). Reads slower than this, or failing, open the reads' breaker: the cache
    /// answers at once until trial reads succeed.
    // The default is service::DEFAULT_READ_BUDGET.
    #[arg(long, env = "VIGIL_EXAMPLE_READ_BUDGET", default_value = "1s", value_parser = humantime::parse_duration)]
    pub read_budget: Duration,
    /// Interval of every health check, e.g. `1s`, `250ms`.
    #[arg(long, env = "VIGIL_EXAMPLE_CHECK_INTERVAL", default_value = DEFAULT_CHECK_INTERVAL, value_parser = humantime::parse_duration)]
    pub check_interval: Duration,
    /// How long readiness fails before the listener closes on SIGTERM. Defaults to
    /// vigil's drain delay (5 s).
    #[arg(long, env = "VIGIL_EXAMPLE_DRAIN_DELAY", value_parser = humantime::parse_duration)]
    pub drain_delay: Option<Duration>,
    /// Mark the database check critical: an unreachable database then fails `/health`
    /// (503) instead of degrading it to warn. The demo's fleet sets it, as many service
    /// owners do, to show what a shared dependency outage does to a fleet.
    #[arg(long, env = "VIGIL_EXAMPLE_DEPENDENCY_CRITICAL")]
    pub dependency_critical: bool,
    /// Nice value (-20..=19) of the application's worker threads. Start the process at
    /// a lower nice value (`nice -n -10 ...`) and give the workers a higher one, and the
    /// reserved health thread (which keeps the process's) wins the CPU from saturated
    /// workers. Defaults to leaving them as started.
    #[arg(long, env = "VIGIL_EXAMPLE_WORKER_NICE", allow_hyphen_values = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub worker_nice: Option<i32>,
}

/// `--admission`: `on` or `off`.
fn parse_admission(s: &str) -> Result<AdmissionMode, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" => Ok(AdmissionMode::On),
        "off" => Ok(AdmissionMode::Off),
        _ => Err(format!("{s:?} is neither on nor off")),
    }
}

/// `--disk-warn-below`: a level, or `off`.
#[derive(Clone, Copy, Debug)]
pub struct WarnLevel(pub Option<Amount>);

fn parse_warn_level(s: &str) -> Result<WarnLevel, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(WarnLevel(None));
    }
    s.parse::<Amount>()
        .map(|a| WarnLevel(Some(a)))
        .map_err(|e| e.to_string())
}

impl Args {
    fn into_config(self) -> Result<ServiceConfig, String> {
        if self.max_in_flight == 0 {
            return Err("--max-in-flight must be at least 1".into());
        }
        if self.read_budget.is_zero() {
            return Err("--read-budget must be greater than zero".into());
        }
        if self.check_interval.is_zero() {
            return Err("--check-interval must be greater than zero".into());
        }
        let workers = self
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        if workers == 0 {
            return Err("--workers must be at least 1".into());
        }
        let data_dir = self
            .data_dir
            .unwrap_or_else(|| std::env::temp_dir().join("vigil-example"));
        let safe_name: String = self
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Ok(ServiceConfig {
            listen: self.listen,
            health_listen: self.health_listen,
            agent_listen: self.agent_listen,
            grpc_listen: self.grpc_listen,
            db: self.db,
            sqlite_path: data_dir.join(format!("{safe_name}.sqlite")),
            data_dir,
            disk_warn_below: self.disk_warn_below.0,
            disk_fail_below: self.disk_fail_below,
            name: self.name,
            revision: self.revision,
            workers,
            max_in_flight: self.max_in_flight,
            check_interval: self.check_interval,
            drain_delay: self
                .drain_delay
                .unwrap_or(vigil::options::DEFAULT_DRAIN_DELAY),
            dependency: if self.dependency_critical {
                vigil::Criticality::Critical
            } else {
                vigil::Criticality::NonCritical
            },
            admission: self.admission,
            read_budget: self.read_budget,
        })
    }
}

/// Names the addresses among `listens` (flag, address) that cannot be bound now because
/// they are in use, for the start-up error: the OS's "Address already in use" says
/// neither which address nor which flag. Empty when none is (or all are port 0).
fn taken(listens: &[(&str, Option<SocketAddr>)]) -> String {
    let taken: Vec<String> = listens
        .iter()
        .filter_map(|(flag, addr)| addr.map(|a| (flag, a)))
        .filter(|(_, a)| {
            a.port() != 0
                && std::net::TcpListener::bind(a)
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse)
        })
        .map(|(flag, a)| format!("{a} ({flag})"))
        .collect();
    if taken.is_empty() {
        String::new()
    } else {
        format!("; in use by another process: {}", taken.join(", "))
    }
}

/// Runs the example service until SIGTERM or Ctrl-C: readiness fails first, the
/// listener closes after the drain delay, then it exits 0. Exit 64 on bad arguments, 1 on
/// a failure to start (a taken port, an unusable data directory).
pub fn run(args: Args) -> ExitCode {
    let worker_nice = args.worker_nice;
    let config = match args.into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("example service: {e}");
            return ExitCode::from(64);
        }
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .worker_threads(config.workers)
        .thread_name("app-worker")
        .enable_all();
    if let Some(nice) = worker_nice {
        // Linux keeps the nice value per thread; `who = 0` is the calling thread. Applies
        // to tokio's blocking-pool threads too (they are the same builder's threads).
        builder.on_thread_start(move || {
            if let Err(e) = rustix::process::setpriority_process(None, nice) {
                tracing::warn!(nice, error = %e, "cannot set the worker thread's nice value");
            }
        });
    }
    let runtime = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("example service: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let listens = [
        ("--listen", Some(config.listen)),
        ("--health-listen", Some(config.health_listen)),
        ("--agent-listen", config.agent_listen),
        ("--grpc-listen", config.grpc_listen),
    ];
    runtime.block_on(async move {
        let running = match start(config).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("example service: cannot start: {e:#}{}", taken(&listens));
                return ExitCode::FAILURE;
            }
        };
        // One machine-readable line for scripts and tests (ports may be 0 = any).
        let agent = running
            .agent_addr
            .map(|a| format!(" agent={a}"))
            .into_iter()
            .chain(running.grpc_addr.map(|a| format!(" grpc={a}")))
            .collect::<String>();
        println!(
            "LISTENING app=http://{} health=http://{} store={}{agent}",
            running.app_addr, running.health_addr, running.store_kind
        );
        match running.wait().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("example service: {e:#}");
                ExitCode::FAILURE
            }
        }
    })
}
