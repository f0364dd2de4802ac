//! The example worker's and producer's broker: RabbitMQ or NATS JetStream, chosen by the
//! URL's scheme (`amqp://` / `amqps://`, or `nats://`), with the same queue layout on
//! both, so the worker, the producer, the demo and the benchmark can count what became of
//! every message the same way (published = acknowledged + dead-lettered + still queued).
//!
//! On RabbitMQ a queue is a durable queue `<queue>` and its poison goes to `<queue>.dead`.
//! On JetStream the same names are subjects of one work-queue stream (named after the
//! queue, with every character a stream name may not hold replaced by `_`):
//!
//! - the workers share the durable pull consumer `workers` on subject `<queue>` (a
//!   work-queue stream drops a message once a consumer acknowledged it);
//! - poison is published to `<queue>.dead`, held by the durable consumer `dead` that
//!   nobody pulls: its pending count is the dead letters' count.

use async_nats::jetstream::{self, consumer::pull, stream};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::time::Duration;

/// The durable JetStream consumer the workers share.
pub const NATS_WORKERS: &str = "workers";
/// The durable JetStream consumer that holds the dead letters (never pulled).
pub const NATS_DEAD: &str = "dead";
/// How long JetStream waits for a worker's acknowledgement before redelivering (a worker
/// that dies holding messages gives them back after this).
pub const NATS_ACK_WAIT: Duration = Duration::from_secs(10);

/// A connection to the broker a URL names.
pub enum Broker {
    /// RabbitMQ, with a channel in confirm mode (every publish is confirmed).
    Rabbit {
        /// The connection (the channel lives as long as it does).
        conn: Connection,
        /// The channel everything goes through.
        channel: Channel,
    },
    /// NATS JetStream.
    Nats {
        /// The JetStream context.
        js: jetstream::Context,
    },
}

/// Which broker a URL names, from its scheme.
pub fn is_nats(url: &str) -> bool {
    url.starts_with("nats://") || url.starts_with("tls://")
}

/// The JetStream stream that holds `queue`.
pub fn stream_name(queue: &str) -> String {
    queue
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Broker {
    /// Connects to `url`: RabbitMQ for `amqp://`/`amqps://`, NATS for `nats://`.
    pub async fn connect(url: &str) -> anyhow::Result<Broker> {
        if is_nats(url) {
            let client = async_nats::connect(url)
                .await
                .map_err(|e| anyhow::anyhow!("cannot connect to NATS at {url}: {e}"))?;
            return Ok(Broker::Nats {
                js: jetstream::new(client),
            });
        }
        anyhow::ensure!(
            url.starts_with("amqp://") || url.starts_with("amqps://"),
            "broker URL {url:?}: expected amqp://, amqps:// (RabbitMQ) or nats:// (NATS JetStream)"
        );
        let conn = Connection::connect(url, ConnectionProperties::default())
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to RabbitMQ at {url}: {e}"))?;
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Broker::Rabbit { conn, channel })
    }

    /// Declares `queue` and `<queue>.dead` if missing (on JetStream: the stream and its two
    /// consumers).
    pub async fn declare(&self, queue: &str) -> anyhow::Result<()> {
        match self {
            Broker::Rabbit { channel, .. } => {
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
            Broker::Nats { js } => {
                let name = stream_name(queue);
                let stream = js
                    .get_or_create_stream(stream::Config {
                        name: name.clone(),
                        subjects: vec![queue.to_string(), format!("{queue}.dead")],
                        retention: stream::RetentionPolicy::WorkQueue,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot declare stream {name}: {e}"))?;
                for (consumer, subject) in [
                    (NATS_WORKERS, queue.to_string()),
                    (NATS_DEAD, format!("{queue}.dead")),
                ] {
                    stream
                        .get_or_create_consumer::<pull::Config>(
                            consumer,
                            pull::Config {
                                durable_name: Some(consumer.to_string()),
                                filter_subject: subject,
                                ack_wait: NATS_ACK_WAIT,
                                ..Default::default()
                            },
                        )
                        .await
                        .map_err(|e| {
                            anyhow::anyhow!("cannot declare consumer {consumer} of {name}: {e}")
                        })?;
                }
                Ok(())
            }
        }
    }

    /// Messages still in `queue` (ready, or held by a worker not yet done with them) and
    /// in `<queue>.dead` now, by the broker's own count. On RabbitMQ the first count is
    /// the ready messages only: call it with no consumer holding any.
    pub async fn depths(&self, queue: &str) -> anyhow::Result<(u64, u64)> {
        match self {
            Broker::Rabbit { channel, .. } => {
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
                        .message_count()
                        .into();
                }
                Ok((n[0], n[1]))
            }
            Broker::Nats { js } => {
                let name = stream_name(queue);
                let stream = js
                    .get_stream(&name)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot read stream {name}: {e}"))?;
                let mut n = [0; 2];
                for (slot, consumer) in n.iter_mut().zip([NATS_WORKERS, NATS_DEAD]) {
                    let info = stream
                        .get_consumer::<pull::Config>(consumer)
                        .await
                        .map_err(|e| anyhow::anyhow!("cannot read consumer {consumer}: {e}"))?
                        .get_info()
                        .await
                        .map_err(|e| anyhow::anyhow!("cannot read consumer {consumer}: {e}"))?;
                    *slot = info.num_pending + info.num_ack_pending as u64;
                }
                Ok((n[0], n[1]))
            }
        }
    }

    /// Empties `queue` and `<queue>.dead` (a fresh start for the demo and the benchmark).
    pub async fn purge(&self, queue: &str) -> anyhow::Result<()> {
        match self {
            Broker::Rabbit { channel, .. } => {
                for q in [queue.to_string(), format!("{queue}.dead")] {
                    channel
                        .queue_purge(q.as_str().into(), QueuePurgeOptions::default())
                        .await
                        .map_err(|e| anyhow::anyhow!("cannot purge queue {q}: {e}"))?;
                }
                Ok(())
            }
            Broker::Nats { js } => {
                let name = stream_name(queue);
                js.get_stream(&name)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot read stream {name}: {e}"))?
                    .purge()
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot purge stream {name}: {e}"))?;
                Ok(())
            }
        }
    }

    /// Deletes `queue` and `<queue>.dead` (on JetStream: the stream), if they exist.
    pub async fn delete(&self, queue: &str) -> anyhow::Result<()> {
        match self {
            Broker::Rabbit { channel, .. } => {
                for q in [queue.to_string(), format!("{queue}.dead")] {
                    channel
                        .queue_delete(q.as_str().into(), Default::default())
                        .await
                        .map_err(|e| anyhow::anyhow!("cannot delete queue {q}: {e}"))?;
                }
                Ok(())
            }
            Broker::Nats { js } => {
                let name = stream_name(queue);
                js.delete_stream(&name)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot delete stream {name}: {e}"))?;
                Ok(())
            }
        }
    }

    /// Publishes `body` to `queue` (persistent) and waits for the broker to confirm it.
    pub async fn publish(&self, queue: &str, body: String) -> anyhow::Result<()> {
        match self {
            Broker::Rabbit { channel, .. } => {
                let confirm = channel
                    .basic_publish(
                        "".into(),
                        queue.into(),
                        BasicPublishOptions::default(),
                        body.as_bytes(),
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await?
                    .await?;
                anyhow::ensure!(confirm.is_ack(), "the broker refused message {body}");
                Ok(())
            }
            Broker::Nats { js } => {
                js.publish(queue.to_string(), body.clone().into())
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot publish message {body}: {e}"))?
                    .await
                    .map_err(|e| anyhow::anyhow!("the broker refused message {body}: {e}"))?;
                Ok(())
            }
        }
    }
}
