//! The worker gate for RabbitMQ consumers (lapin).
//!
//! [`consume`] consumes a queue while the [`Worker`]'s gate is open. When the gate closes
//! it cancels the consumer (the broker stops delivering) and sends back, unstamped, the
//! deliveries the prefetch window still holds: they never ran. A message whose handler
//! fails goes where the gate says:
//!
//! - back to the queue stamped with this worker's id: republished to the queue with the
//!   [`FAILED_ON_HEADER`] extended (and [`FAILED_SINCE_HEADER`] set, see
//!   [`Stamp`]), then the original acknowledged, in that order and with
//!   publisher confirms, so a crash in between duplicates the message rather than losing
//!   it (AMQP cannot change a message's headers on `nack`);
//! - back to the queue unstamped (`nack` with requeue) when the worker turned sick;
//! - dead-lettered when it failed on `poison_workers` different workers, each while
//!   otherwise succeeding, for `poison_after` (rule 3 of [`vigil_core::gate`]): published to
//!   [`RabbitConfig::dead_letter_queue`] (confirmed, then acknowledged) or, without one,
//!   rejected without requeue so that the queue's own dead-letter exchange takes it.

use super::{FAILED_ON_HEADER, FAILED_SINCE_HEADER, Restamp, Stamp, Worker};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, message::Delivery};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use vigil_core::gate::Disposition;

/// Default prefetch: 10 deliveries in flight per consumer. A sick worker returns at most
/// this many when it pauses.
pub const DEFAULT_PREFETCH: u16 = 10;

/// What to consume and where poison goes.
#[derive(Clone, Debug)]
pub struct RabbitConfig {
    /// The queue to consume.
    pub queue: String,
    /// Deliveries the broker may push ahead of acknowledgements. Defaults to 10.
    pub prefetch: u16,
    /// Where poison messages are published; `None` rejects them without requeue, for the
    /// queue's `x-dead-letter-exchange` (a queue without one would drop them: set one of
    /// the two).
    pub dead_letter_queue: Option<String>,
}

impl RabbitConfig {
    /// Consume `queue` with the defaults.
    pub fn new(queue: impl Into<String>) -> Self {
        RabbitConfig {
            queue: queue.into(),
            prefetch: DEFAULT_PREFETCH,
            dead_letter_queue: None,
        }
    }
}

/// An error from the broker (the consumer loop ends with it; the worker's gate and
/// counters live on, and liveness does not depend on the broker).
#[derive(Debug, thiserror::Error)]
pub enum RabbitError {
    /// The broker or the connection failed.
    #[error("rabbitmq queue {queue}: {source}")]
    Broker {
        /// The queue consumed.
        queue: String,
        /// What lapin said.
        #[source]
        source: lapin::Error,
    },
    /// The broker refused a copy the worker published; the original is left
    /// unacknowledged, so the broker redelivers it.
    #[error(
        "rabbitmq queue {queue}: the broker refused (nack) the copy published to {to}; the original stays unacknowledged and will be redelivered"
    )]
    Refused {
        /// The queue consumed.
        queue: String,
        /// Where the copy went.
        to: String,
    },
}

static CONSUMERS: AtomicU64 = AtomicU64::new(0);

/// Consumes `config.queue` on `channel` while `worker`'s gate is open, handling each
/// message with `handler` (`Ok` acknowledges it, `Err` sends it where the gate says),
/// until `shutdown` completes (the deliveries still held go back to the queue) or the
/// broker fails.
pub async fn consume<F, Fut>(
    worker: &Worker,
    channel: &Channel,
    config: &RabbitConfig,
    handler: F,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RabbitError>
where
    F: Fn(bytes::Bytes) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let err = |source| RabbitError::Broker {
        queue: config.queue.clone(),
        source,
    };
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(err)?;
    channel
        .basic_qos(config.prefetch, BasicQosOptions::default())
        .await
        .map_err(err)?;
    let mut pulling = worker.pulling();
    tokio::pin!(shutdown);
    loop {
        // Wait for the gate to open.
        if !super::until_pulling(&mut pulling, shutdown.as_mut()).await {
            return Ok(());
        }
        let tag = format!(
            "{}-{}",
            worker.id(),
            CONSUMERS.fetch_add(1, Ordering::Relaxed)
        );
        let mut consumer = channel
            .basic_consume(
                config.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(err)?;
        tracing::info!(worker = worker.id(), queue = %config.queue, "consuming");
        let stop = loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => break true,
                _ = pulling.changed() => if !*pulling.borrow_and_update() { break false },
                delivery = consumer.next() => match delivery {
                    Some(Ok(d)) => handle(worker, channel, config, &handler, d).await?,
                    Some(Err(e)) => return Err(err(e)),
                    // Cancelled by the broker (queue deleted): wait and consume again.
                    None => break false,
                },
            }
        };
        // Stop deliveries, then send back what the prefetch window still holds.
        channel
            .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
            .await
            .map_err(err)?;
        let mut returned = 0;
        while let Some(Ok(d)) = consumer.next().await {
            let ticket = worker.begin();
            d.acker
                .nack(BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                })
                .await
                .map_err(err)?;
            worker.returned(ticket);
            returned += 1;
        }
        tracing::info!(worker = worker.id(), queue = %config.queue, returned, "stopped consuming");
        if stop {
            return Ok(());
        }
    }
}

/// Runs the handler on one delivery and settles it.
async fn handle<F, Fut>(
    worker: &Worker,
    channel: &Channel,
    config: &RabbitConfig,
    handler: &F,
    mut d: Delivery,
) -> Result<(), RabbitError>
where
    F: Fn(bytes::Bytes) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let err = |source| RabbitError::Broker {
        queue: config.queue.clone(),
        source,
    };
    let ticket = worker.begin();
    let data = bytes::Bytes::from(std::mem::take(&mut d.data));
    if !worker.may_pull() {
        // The gate closed while this delivery waited its turn: it never ran.
        d.acker.nack(requeue(true)).await.map_err(err)?;
        worker.returned(ticket);
        return Ok(());
    }
    match handler(data.clone()).await {
        Ok(()) => {
            d.acker.ack(BasicAckOptions::default()).await.map_err(err)?;
            worker.succeeded(ticket);
        }
        Err(why) => {
            let (failed_on, failed_since) = (
                header(&d, FAILED_ON_HEADER),
                header(&d, FAILED_SINCE_HEADER),
            );
            let stamp = Stamp::parse(failed_on.as_deref(), failed_since.as_deref());
            let restamp = worker.failed_stamped(ticket, &stamp);
            tracing::debug!(worker = worker.id(), error = %why, disposition = ?restamp.disposition, "message failed");
            match restamp.disposition {
                Disposition::Requeue { stamp: None } => {
                    d.acker.nack(requeue(true)).await.map_err(err)?;
                }
                Disposition::Requeue { stamp: Some(_) } => {
                    publish(
                        channel,
                        config,
                        &config.queue,
                        &data,
                        &d.properties,
                        &restamp,
                    )
                    .await?;
                    d.acker.ack(BasicAckOptions::default()).await.map_err(err)?;
                }
                Disposition::DeadLetter { workers } => {
                    tracing::warn!(worker = worker.id(), workers, error = %why, "poison message dead-lettered");
                    match &config.dead_letter_queue {
                        Some(dlq) => {
                            publish(channel, config, dlq, &data, &d.properties, &restamp).await?;
                            d.acker.ack(BasicAckOptions::default()).await.map_err(err)?;
                        }
                        None => {
                            d.acker.nack(requeue(false)).await.map_err(err)?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn requeue(requeue: bool) -> BasicNackOptions {
    BasicNackOptions {
        requeue,
        ..BasicNackOptions::default()
    }
}

/// The delivery's header `name` as text, if it is a string (any other type: absent).
fn header(d: &Delivery, name: &str) -> Option<String> {
    let value = d
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(&ShortString::from(name)).cloned());
    match value {
        Some(AMQPValue::LongString(s)) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        Some(AMQPValue::ShortString(s)) => Some(s.as_str().to_string()),
        _ => None,
    }
}

/// Publishes a copy of a message to `queue` (default exchange) with the new stamp, and
/// waits for the broker's confirm.
async fn publish(
    channel: &Channel,
    config: &RabbitConfig,
    queue: &str,
    data: &[u8],
    properties: &BasicProperties,
    stamp: &Restamp,
) -> Result<(), RabbitError> {
    let err = |source| RabbitError::Broker {
        queue: config.queue.clone(),
        source,
    };
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(
        FAILED_ON_HEADER.into(),
        AMQPValue::LongString(LongString::from(stamp.failed_on.clone())),
    );
    // Empty when no failure pointed at the message (an inherited value is overwritten).
    headers.insert(
        FAILED_SINCE_HEADER.into(),
        AMQPValue::LongString(LongString::from(
            stamp.failed_since.clone().unwrap_or_default(),
        )),
    );
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            data,
            properties.clone().with_headers(headers),
        )
        .await
        .map_err(err)?
        .await
        .map_err(err)?;
    if confirm.is_nack() {
        return Err(RabbitError::Refused {
            queue: config.queue.clone(),
            to: queue.to_string(),
        });
    }
    Ok(())
}
