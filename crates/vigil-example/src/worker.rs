//! The example queue worker (`vigil example-worker`): consumes a RabbitMQ queue or a NATS
//! JetStream work stream (`--broker`, by the URL's scheme; the layout: [`crate::broker`])
//! through the library's worker gate (`vigil::worker`), with fault injection, for the
//! demo, the benchmark and anyone trying the gate on a real broker.
//!
//! Each message takes `work_time` to process. Its local checks (disk, fds, memory) feed
//! the gate: while they pass it pulls, when one fails it stops and sends back what it
//! holds. Faults, switched over HTTP on the worker's address:
//!
//! - `POST /fault/disk?on=true`: the disk check demands 100% free space (it fails): the
//!   worker stops pulling within one check interval and fails nothing;
//! - `POST /fault/black-hole?on=true`: every message fails after `fail_time` (2 ms) while
//!   every check passes (a bad config, a poisoned local cache): the kill switch pauses it,
//!   and a controller comparing it with its peers finds it;
//! - `POST /fault/dependency?on=true`: every message fails after `work_time` and the
//!   dependency check `db:connect` fails (the dependency every worker shares is down): a
//!   shared cause, nobody is an outlier, nothing is dead-lettered, and a kill-switch
//!   pause ends once the check passes again (rules 3-4 of `vigil_core::gate`);
//! - `POST /fault/reset`: all off.
//!
//! A message whose body is `poison` fails on every worker (a payload nobody can parse):
//! the gate dead-letters it after 2 otherwise succeeding workers failed it.
//!
//! `GET /worker` answers the worker's report (gate state, counters), and `/livez`,
//! `/readyz`, `/health` are the library's. With `--naive` the worker has no gate: no
//! local checks and no kill switch (the baseline the benchmark compares with).
//!
//! With `--controller URL --heartbeat-key KEY` it also sends the library's signed
//! heartbeats (`vigil::heartbeat`) to a `vigil controller`, as target `--id`: its
//! `/health` report (local checks) and its counters (processed, failed, in flight, the
//! oldest message's age), which the controller compares with its peers'.

use crate::broker::Broker;
use crate::service::DiskWithFault;
use axum::Router;
use axum::extract::{Query, State};
use axum::routing::{get, post};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use vigil::checks::{Amount, DiskSpace, FileDescriptors, Memory};
use vigil::heartbeat::{HeartbeatConfig, Heartbeats};
use vigil::worker::nats::NatsConfig;
use vigil::worker::rabbitmq::RabbitConfig;
use vigil::worker::{GateConfig, KillSwitchConfig, Worker};
use vigil::{CheckOptions, Health};

/// Default broker: the machine's RabbitMQ.
pub const DEFAULT_AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// The machine's NATS (with JetStream), for `--broker`.
pub const DEFAULT_NATS: &str = "nats://127.0.0.1:4222";
/// Default worker address (faults, report, health).
pub const DEFAULT_WORKER_LISTEN: &str = "127.0.0.1:8090";

/// Arguments of the example worker. Every option also reads an environment variable.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The queue to consume (declared if missing, with `<queue>.dead` for poison).
    #[arg(long, env = "VIGIL_WORKER_QUEUE", default_value = "vigil-jobs")]
    pub queue: String,
    /// The broker: `amqp://...` (RabbitMQ) or `nats://host:port` (NATS JetStream).
    #[arg(long, alias = "amqp", env = "VIGIL_WORKER_BROKER", default_value = DEFAULT_AMQP)]
    pub broker: String,
    /// The worker's id (stamped on the messages it fails; its target id for heartbeats).
    #[arg(long, env = "VIGIL_WORKER_ID", default_value = "worker")]
    pub id: String,
    /// Address for faults, the report and the health endpoints (port 0: any).
    #[arg(long, env = "VIGIL_WORKER_LISTEN", default_value = DEFAULT_WORKER_LISTEN)]
    pub listen: SocketAddr,
    /// Time to process one message.
    #[arg(long, env = "VIGIL_WORKER_WORK_TIME", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub work_time: Duration,
    /// Time a black hole takes to fail one message.
    #[arg(long, env = "VIGIL_WORKER_FAIL_TIME", default_value = "2ms", value_parser = humantime::parse_duration)]
    pub fail_time: Duration,
    /// Messages in flight (RabbitMQ prefetch; the fetch batch on NATS).
    #[arg(long, env = "VIGIL_WORKER_PREFETCH", default_value_t = 4)]
    pub prefetch: u16,
    /// Local check interval.
    #[arg(long, env = "VIGIL_WORKER_CHECK_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub check_interval: Duration,
    /// No gate: pull whatever the host's state, never pause (the naive baseline).
    #[arg(long, env = "VIGIL_WORKER_NAIVE")]
    pub naive: bool,
    /// Directory whose filesystem the disk check watches. Defaults to the temp dir.
    #[arg(long, env = "VIGIL_WORKER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// A `vigil controller`'s base URL (`http://host:port`) to send signed heartbeats
    /// to, as target `--id`. Off unless given; needs `--heartbeat-key`.
    #[arg(long, env = "VIGIL_WORKER_CONTROLLER", requires = "heartbeat_key")]
    pub controller: Option<String>,
    /// The target's own heartbeat key (`vigil controller heartbeat-key <id>` prints it).
    #[arg(long, env = "VIGIL_WORKER_HEARTBEAT_KEY", hide_env_values = true)]
    pub heartbeat_key: Option<String>,
    /// Interval between heartbeats. Defaults to the library's (5 s).
    #[arg(long, env = "VIGIL_WORKER_HEARTBEAT_EVERY", value_parser = humantime::parse_duration)]
    pub heartbeat_every: Option<Duration>,
}

impl Args {
    /// The arguments with every default, for `queue` and `id` (tests, the demo).
    pub fn new(queue: impl Into<String>, id: impl Into<String>) -> Args {
        Args {
            queue: queue.into(),
            broker: DEFAULT_AMQP.to_string(),
            id: id.into(),
            listen: DEFAULT_WORKER_LISTEN
                .parse()
                .expect("a valid default address"),
            work_time: Duration::from_millis(100),
            fail_time: Duration::from_millis(2),
            prefetch: 4,
            check_interval: Duration::from_secs(1),
            naive: false,
            data_dir: None,
            controller: None,
            heartbeat_key: None,
            heartbeat_every: None,
        }
    }
}

/// The body of a message no worker can handle (tests of the poison rule).
pub const POISON: &[u8] = b"poison";

/// The switches of the injected faults.
#[derive(Default)]
struct Faults {
    disk: Arc<AtomicBool>,
    black_hole: AtomicBool,
    dependency: Arc<AtomicBool>,
}

/// The shared dependency's check: fails while the dependency fault is on (what a real
/// worker's background check of its database would say).
struct DependencyCheck {
    down: Arc<AtomicBool>,
}

impl vigil::Check for DependencyCheck {
    async fn check(&self) -> vigil::CheckResult {
        if self.down.load(Ordering::SeqCst) {
            vigil::CheckResult::fail("connection refused (fault injected)")
        } else {
            vigil::CheckResult::new(vigil::Status::Pass)
        }
    }
    fn component_type(&self) -> &str {
        "datastore"
    }
}

/// A started worker.
pub struct Running {
    /// Where its HTTP endpoints listen.
    pub addr: SocketAddr,
    /// Its gate and counters.
    pub worker: Worker,
    /// Its health.
    pub health: Health,
    /// Its heartbeats to the controller, when it sends them.
    pub heartbeats: Option<Heartbeats>,
    stop: tokio::sync::watch::Sender<bool>,
    consumer: tokio::task::JoinHandle<anyhow::Result<()>>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// Stops consuming (held messages go back to the queue) and serving.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        let consumed = self.consumer.await?;
        self.server.abort();
        consumed
    }

    /// Runs until SIGTERM/Ctrl-C, or until the consumer ends with a broker error.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        tokio::select! {
            _ = vigil::shutdown_signal() => {}
            r = &mut self.consumer => return r?,
        }
        self.stop().await
    }
}

/// Connects to the broker, declares the queues, and starts consuming and serving.
pub async fn start(args: Args) -> anyhow::Result<Running> {
    let faults = Arc::new(Faults::default());
    let every = CheckOptions::every(args.check_interval);
    let health = if args.naive {
        // Nothing vouches for or against the host: the gate never closes on readiness.
        Health::builder()
            .description(format!("vigil example worker {} (naive)", args.id))
            .start()
    } else {
        let dir = args.data_dir.clone().unwrap_or_else(std::env::temp_dir);
        Health::builder()
            .description(format!("vigil example worker {}", args.id))
            .local(
                "disk:free",
                DiskWithFault {
                    normal: DiskSpace::new(&dir).fail_below(Amount::Percent(1.0)),
                    impossible: DiskSpace::new(&dir).fail_below(Amount::Percent(100.0)),
                    fault: faults.disk.clone(),
                },
                every.clone(),
            )
            .local("fd:open", FileDescriptors::new(), every.clone())
            .local("memory:working-set", Memory::new(), every.clone())
            .dependency(
                "db:connect",
                DependencyCheck {
                    down: faults.dependency.clone(),
                },
                every,
            )
            .start()
    };
    let gate = if args.naive {
        GateConfig {
            kill_switch: KillSwitchConfig {
                min_messages: 0,
                ..KillSwitchConfig::default()
            },
            ..GateConfig::default()
        }
    } else {
        GateConfig::default()
    };
    let worker = Worker::start(args.id.clone(), &health, gate);
    let heartbeats = match &args.controller {
        None => None,
        Some(url) => {
            let mut config = HeartbeatConfig::new(
                url.clone(),
                args.id.clone(),
                args.heartbeat_key.clone().unwrap_or_default(),
            );
            if let Some(every) = args.heartbeat_every {
                config.every = every;
            }
            Some(vigil::heartbeat::start(
                &health,
                Some(worker.clone()),
                config,
            )?)
        }
    };

    let broker = Broker::connect(&args.broker).await?;
    broker.declare(&args.queue).await?;
    let dead = format!("{}.dead", args.queue);

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let consumer = {
        let (worker, faults) = (worker.clone(), faults.clone());
        let (work, fail) = (args.work_time, args.fail_time);
        let (queue, prefetch) = (args.queue.clone(), args.prefetch);
        tokio::spawn(async move {
            let handler = move |body: bytes::Bytes| {
                let faults = faults.clone();
                async move { handle(&faults, &body, work, fail).await }
            };
            let mut stopped = stopped;
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            match broker {
                Broker::Rabbit { conn, channel } => {
                    let mut config = RabbitConfig::new(queue);
                    config.prefetch = prefetch;
                    config.dead_letter_queue = Some(dead);
                    let r = vigil::worker::rabbitmq::consume(
                        &worker, &channel, &config, handler, shutdown,
                    )
                    .await;
                    drop(conn);
                    r.map_err(anyhow::Error::from)
                }
                Broker::Nats { js } => {
                    let name = crate::broker::stream_name(&queue);
                    let consumer = js
                        .get_stream(&name)
                        .await
                        .map_err(|e| anyhow::anyhow!("cannot read stream {name}: {e}"))?
                        .get_consumer(crate::broker::NATS_WORKERS)
                        .await
                        .map_err(|e| anyhow::anyhow!("cannot read consumer of {name}: {e}"))?;
                    let config = NatsConfig {
                        batch: prefetch.max(1).into(),
                        dead_letter_subject: Some(dead),
                        ..NatsConfig::default()
                    };
                    vigil::worker::nats::consume(
                        &worker, &js, &consumer, &config, handler, shutdown,
                    )
                    .await
                    .map_err(anyhow::Error::from)
                }
            }
        })
    };

    let app = Router::new()
        .route("/worker", get(report))
        .route("/fault/disk", post(fault_disk))
        .route("/fault/black-hole", post(fault_black_hole))
        .route("/fault/dependency", post(fault_dependency))
        .route("/fault/reset", post(fault_reset))
        .with_state(AppState {
            worker: worker.clone(),
            faults,
        })
        .merge(health.router());
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    tracing::info!(%addr, queue = %args.queue, broker = %args.broker, naive = args.naive, controller = ?args.controller, "example worker consuming");
    Ok(Running {
        addr,
        worker,
        health,
        heartbeats,
        stop,
        consumer,
        server,
    })
}

/// One message: the work, or the injected fault's failure.
async fn handle(
    faults: &Faults,
    body: &[u8],
    work: Duration,
    fail: Duration,
) -> Result<(), String> {
    if body == POISON {
        tokio::time::sleep(fail).await;
        return Err("cannot parse the message (poison)".into());
    }
    if faults.black_hole.load(Ordering::SeqCst) {
        tokio::time::sleep(fail).await;
        return Err("black hole: this worker fails every message (fault injected)".into());
    }
    tokio::time::sleep(work).await;
    if faults.dependency.load(Ordering::SeqCst) {
        return Err("dependency unreachable (fault injected)".into());
    }
    Ok(())
}

#[derive(Clone)]
struct AppState {
    worker: Worker,
    faults: Arc<Faults>,
}

#[derive(Deserialize)]
struct Switch {
    #[serde(default = "yes")]
    on: bool,
}

fn yes() -> bool {
    true
}

async fn report(State(s): State<AppState>) -> axum::Json<vigil::worker::WorkerReport> {
    axum::Json(s.worker.report())
}

fn switched(name: &str, on: bool) -> String {
    tracing::warn!(fault = name, on, "fault switched");
    format!("{name}: {}\n", if on { "on" } else { "off" })
}

async fn fault_disk(State(s): State<AppState>, Query(q): Query<Switch>) -> String {
    s.faults.disk.store(q.on, Ordering::SeqCst);
    switched("disk", q.on)
}

async fn fault_black_hole(State(s): State<AppState>, Query(q): Query<Switch>) -> String {
    s.faults.black_hole.store(q.on, Ordering::SeqCst);
    switched("black-hole", q.on)
}

async fn fault_dependency(State(s): State<AppState>, Query(q): Query<Switch>) -> String {
    s.faults.dependency.store(q.on, Ordering::SeqCst);
    switched("dependency", q.on)
}

async fn fault_reset(State(s): State<AppState>) -> String {
    for f in [&*s.faults.disk, &s.faults.black_hole, &*s.faults.dependency] {
        f.store(false, Ordering::SeqCst);
    }
    switched("all faults", false)
}

/// Runs the example worker until SIGTERM or Ctrl-C (held messages go back to the
/// queue). Exit 1 when the broker is unreachable or fails.
pub fn run(args: Args) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("example worker: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let running = match start(args).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("example worker: cannot start: {e:#}");
                return std::process::ExitCode::FAILURE;
            }
        };
        println!("LISTENING worker=http://{}", running.addr);
        match running.wait().await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("example worker: {e:#}");
                std::process::ExitCode::FAILURE
            }
        }
    })
}
