//! A steady producer for the example worker's queue (`vigil example-producer`, the demo's
//! queue, the workers benchmark): publishes numbered messages at a fixed rate, each
//! confirmed by the broker, and counts what the broker confirmed, so that a run can check
//! that nothing was lost (published = acknowledged + dead-lettered + still queued).

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Connects to `amqp` and opens a channel.
pub async fn connect(amqp: &str) -> anyhow::Result<(Connection, Channel)> {
    let conn = Connection::connect(amqp, ConnectionProperties::default())
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to RabbitMQ at {amqp}: {e}"))?;
    let channel = conn.create_channel().await?;
    Ok((conn, channel))
}

/// Declares `queue` and `<queue>.dead` (durable) if missing, as the example worker does.
pub async fn declare_queues(channel: &Channel, queue: &str) -> anyhow::Result<()> {
    for q in [queue.to_string(), format!("{queue}.dead")] {
        channel
            .queue_declare(
                q.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| anyhow::anyhow!("cannot declare queue {q}: {e}"))?;
    }
    Ok(())
}

/// Messages ready in `queue` and in `<queue>.dead` now (a passive declare: the broker's
/// own count, without consuming).
pub async fn depths(channel: &Channel, queue: &str) -> anyhow::Result<(u32, u32)> {
    let mut n = [0; 2];
    for (slot, q) in n
        .iter_mut()
        .zip([queue.to_string(), format!("{queue}.dead")])
    {
        *slot = channel
            .queue_declare(
                q.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| anyhow::anyhow!("cannot read queue {q}: {e}"))?
            .message_count();
    }
    Ok((n[0], n[1]))
}

/// Empties `queue` and `<queue>.dead` (a fresh start for the demo and the benchmark).
pub async fn purge_queues(channel: &Channel, queue: &str) -> anyhow::Result<()> {
    for q in [queue.to_string(), format!("{queue}.dead")] {
        channel
            .queue_purge(q.as_str().into(), QueuePurgeOptions::default())
            .await
            .map_err(|e| anyhow::anyhow!("cannot purge queue {q}: {e}"))?;
    }
    Ok(())
}

/// A running producer; [`Producer::stop`] ends it.
pub struct Producer {
    published: Arc<AtomicU64>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Producer {
    /// Connects to `amqp`, declares the queues and publishes `rate` messages a second to
    /// `queue` until stopped. Must be called within a tokio runtime.
    pub async fn start(amqp: &str, queue: &str, rate: f64) -> anyhow::Result<Producer> {
        anyhow::ensure!(
            rate.is_finite() && rate > 0.0,
            "rate must be above 0, not {rate}"
        );
        let (conn, channel) = connect(amqp).await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        declare_queues(&channel, queue).await?;
        let published = Arc::new(AtomicU64::new(0));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let (count, queue) = (published.clone(), queue.to_string());
        let every = Duration::from_secs_f64(1.0 / rate);
        let task = tokio::spawn(async move {
            let _conn = conn;
            let mut tick = tokio::time::interval(every);
            // A late tick is made up for (Burst): the rate is kept on average.
            loop {
                tokio::select! {
                    biased;
                    _ = stopped.wait_for(|s| *s) => return Ok(()),
                    _ = tick.tick() => {}
                }
                let n = count.load(Ordering::Relaxed);
                let confirm = channel
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        n.to_string().as_bytes(),
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await?
                    .await?;
                anyhow::ensure!(confirm.is_ack(), "the broker refused message {n}");
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
    /// RabbitMQ URL.
    #[arg(long, env = "VIGIL_WORKER_AMQP", default_value = crate::worker::DEFAULT_AMQP)]
    pub amqp: String,
    /// Messages per second.
    #[arg(long, default_value_t = 40.0)]
    pub rate: f64,
    /// How long to publish (e.g. `60s`); until SIGTERM/Ctrl-C if not given.
    #[arg(long = "for", value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Empty the queue and `<queue>.dead` before publishing.
    #[arg(long)]
    pub purge: bool,
}

/// Publishes until `--for` has passed or SIGTERM/Ctrl-C, then prints `PUBLISHED <n>`
/// (messages the broker confirmed) and exits 0; exit 1 on a broker error.
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
        let result = async {
            if args.purge {
                let (_conn, channel) = connect(&args.amqp).await?;
                declare_queues(&channel, &args.queue).await?;
                purge_queues(&channel, &args.queue).await?;
            }
            let producer = Producer::start(&args.amqp, &args.queue, args.rate).await?;
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
