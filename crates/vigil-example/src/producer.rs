//! A steady producer for the example worker's queue (`vigil example-producer`, the demo's
//! queue, the workers benchmark): publishes numbered messages at a fixed rate, each
//! confirmed by the broker, and counts what the broker confirmed, so that a run can check
//! that nothing was lost (published = acknowledged + dead-lettered + still queued).

use crate::broker::Broker;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A running producer; [`Producer::stop`] ends it.
pub struct Producer {
    published: Arc<AtomicU64>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Producer {
    /// Connects to the broker at `url` (RabbitMQ or NATS: [`Broker`]), declares the
    /// queues and publishes `rate` messages a second to `queue`, each confirmed, until
    /// stopped. Must be called within a tokio runtime.
    pub async fn start(url: &str, queue: &str, rate: f64) -> anyhow::Result<Producer> {
        anyhow::ensure!(
            rate.is_finite() && rate > 0.0,
            "rate must be above 0, not {rate}"
        );
        let broker = Broker::connect(url).await?;
        broker.declare(queue).await?;
        let published = Arc::new(AtomicU64::new(0));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let (count, queue) = (published.clone(), queue.to_string());
        let every = Duration::from_secs_f64(1.0 / rate);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            // A late tick is made up for (Burst): the rate is kept on average.
            loop {
                tokio::select! {
                    biased;
                    _ = stopped.wait_for(|s| *s) => return Ok(()),
                    _ = tick.tick() => {}
                }
                let n = count.load(Ordering::Relaxed);
                broker.publish(&queue, n.to_string()).await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
        });
        Ok(Producer {
            published,
            stop,
            task,
        })
    }

    /// Messages the broker confirmed so far.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// True when the producer ended by itself (a broker error).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops publishing; returns how many messages the broker confirmed, or the broker
    /// error that ended it earlier.
    pub async fn stop(self) -> anyhow::Result<u64> {
        let _ = self.stop.send(true);
        self.task.await??;
        Ok(self.published.load(Ordering::Relaxed))
    }
}

/// Arguments of `vigil example-producer`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The queue to publish to (declared if missing, with `<queue>.dead`).
    #[arg(long, env = "VIGIL_WORKER_QUEUE", default_value = "vigil-jobs")]
    pub queue: String,
    /// The broker: `amqp://...` (RabbitMQ) or `nats://host:port` (NATS JetStream).
    #[arg(long, alias = "amqp", env = "VIGIL_WORKER_BROKER", default_value = crate::worker::DEFAULT_AMQP)]
    pub broker: String,
    /// Messages per second.
    #[arg(long, default_value_t = 40.0)]
    pub rate: f64,
    /// How long to publish (e.g. `60s`); until SIGTERM/Ctrl-C if not given.
    #[arg(long = "for", value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Empty the queue and `<queue>.dead` before publishing.
    #[arg(long)]
    pub purge: bool,
    /// Publish nothing: print the broker's counts, `QUEUED <n> DEAD <m>` (messages in the
    /// queue, ready or held by a worker, and in `<queue>.dead`), and exit.
    #[arg(long, conflicts_with_all = ["purge", "delete", "duration"])]
    pub depths: bool,
    /// Publish nothing: delete the queue and `<queue>.dead` (on NATS: the stream), and exit.
    #[arg(long, conflicts_with_all = ["purge", "duration"])]
    pub delete: bool,
}

/// Publishes until `--for` has passed or SIGTERM/Ctrl-C, then prints `PUBLISHED <n>`
/// (messages the broker confirmed) and exits 0; exit 1 on a broker error. With
/// `--depths` or `--delete`, does that instead and exits.
pub fn run(args: Args) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("example producer: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        if args.depths || args.delete {
            let result = async {
                let broker = Broker::connect(&args.broker).await?;
                if args.delete {
                    broker.delete(&args.queue).await?;
                    println!("DELETED {}", args.queue);
                } else {
                    let (queued, dead) = broker.depths(&args.queue).await?;
                    println!("QUEUED {queued} DEAD {dead}");
                }
                anyhow::Ok(())
            }
            .await;
            return match result {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("example producer: {e:#}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        let result = async {
            if args.purge {
                let broker = Broker::connect(&args.broker).await?;
                broker.declare(&args.queue).await?;
                broker.purge(&args.queue).await?;
            }
            let producer = Producer::start(&args.broker, &args.queue, args.rate).await?;
            println!("PRODUCING queue={} rate={}", args.queue, args.rate);
            let until = async {
                match args.duration {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = vigil::shutdown_signal() => {}
                _ = until => {}
            }
            producer.stop().await
        }
        .await;
        match result {
            Ok(n) => {
                println!("PUBLISHED {n}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("example producer: {e:#}");
                std::process::ExitCode::FAILURE
            }
        }
    })
}
