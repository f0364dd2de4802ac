//! The worker gate for NATS JetStream pull consumers (async-nats).
//!
//! [`consume`] fetches batches from a pull consumer only while the [`Worker`]'s gate is
//! open: a pull consumer gets nothing it did not ask for, so a closed gate stops the flow
//! at the next batch. Messages of the current batch that arrive after the gate closed are
//! NAKed with [`NatsConfig::nak_delay`] (redelivered later, to whoever asks), unstamped:
//! they never ran. A message whose handler fails goes where the gate says:
//!
//! - back to the stream stamped with this worker's id: republished to its subject with
//!   the [`FAILED_ON_HEADER`] extended and [`FAILED_SINCE_HEADER`] set (waiting for the stream's acknowledgement), then
//!   the original acknowledged, so a crash in between duplicates rather than loses it
//!   (JetStream cannot change a message's headers on NAK);
//! - NAKed with a delay, unstamped, when the worker turned sick;
//! - dead-lettered when it failed on `poison_workers` different workers, each while
//!   otherwise succeeding, for `poison_after` (rule 3 of [`vigil_core::gate`]): published to
//!   [`NatsConfig::dead_letter_subject`] and then acknowledged, or, without one,
//!   terminated (`AckKind::Term`, which JetStream reports as an advisory).

use super::{FAILED_ON_HEADER, FAILED_SINCE_HEADER, Stamp, Worker};
use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind, consumer::PullConsumer};
use futures::StreamExt;
use std::future::Future;
use std::time::Duration;
use vigil_core::gate::Disposition;

/// Default batch: 10 messages per fetch (a sick worker NAKs at most this many).
pub const DEFAULT_BATCH: usize = 10;
/// Default fetch expiry: 1 s, so a closed gate is noticed within a second even when the
/// stream is idle.
pub const DEFAULT_EXPIRES: Duration = Duration::from_secs(1);
/// Default NAK delay: 1 s, so a message a sick worker returns is not handed straight
/// back to it.
pub const DEFAULT_NAK_DELAY: Duration = Duration::from_secs(1);

/// How to fetch and where poison goes.
#[derive(Clone, Debug)]
pub struct NatsConfig {
    /// Messages per fetch. Defaults to 10.
    pub batch: usize,
    /// How long one fetch waits for messages. Defaults to 1 s.
    pub expires: Duration,
    /// Redelivery delay of a message sent back unprocessed. Defaults to 1 s.
    pub nak_delay: Duration,
    /// Subject poison messages are published to; `None` terminates them.
    pub dead_letter_subject: Option<String>,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            batch: DEFAULT_BATCH,
            expires: DEFAULT_EXPIRES,
            nak_delay: DEFAULT_NAK_DELAY,
            dead_letter_subject: None,
        }
    }
}

/// An error from NATS (the consumer loop ends with it; the worker's gate and counters
/// live on, and liveness does not depend on the broker).
#[derive(Debug, thiserror::Error)]
#[error("nats jetstream: {what}: {source}")]
pub struct NatsError {
    what: &'static str,
    #[source]
    source: async_nats::Error,
}

fn nats_err<E: Into<async_nats::Error>>(what: &'static str) -> impl FnOnce(E) -> NatsError {
    move |e| NatsError {
        what,
        source: e.into(),
    }
}

/// Fetches from `consumer` while `worker`'s gate is open, handling each message with
/// `handler` (`Ok` acknowledges it, `Err` sends it where the gate says), until `shutdown`
/// completes or NATS fails. `js` is used to republish stamped and dead-lettered copies.
pub async fn consume<F, Fut>(
    worker: &Worker,
    js: &jetstream::Context,
    consumer: &PullConsumer,
    config: &NatsConfig,
    handler: F,
    shutdown: impl Future<Output = ()>,
) -> Result<(), NatsError>
where
    F: Fn(bytes::Bytes) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut pulling = worker.pulling();
    tokio::pin!(shutdown);
    loop {
        if !super::until_pulling(&mut pulling, shutdown.as_mut()).await {
            return Ok(());
        }
        let mut batch = consumer
            .fetch()
            .max_messages(config.batch)
            .expires(config.expires)
            .messages()
            .await
            .map_err(nats_err("fetch"))?;
        let mut stopping = false;
        loop {
            let message = tokio::select! {
                biased;
                _ = &mut shutdown => {
                    stopping = true;
                    None
                }
                m = batch.next() => m,
            };
            let Some(message) = message else { break };
            let message = message.map_err(nats_err("fetch"))?;
            let ticket = worker.begin();
            if !worker.may_pull() {
                message
                    .ack_with(AckKind::Nak(Some(config.nak_delay)))
                    .await
                    .map_err(nats_err("nak"))?;
                worker.returned(ticket);
                continue;
            }
            match handler(message.payload.clone()).await {
                Ok(()) => {
                    message.ack().await.map_err(nats_err("ack"))?;
                    worker.succeeded(ticket);
                }
                Err(why) => {
                    let header = |name: &str| {
                        message
                            .headers
                            .as_ref()
                            .and_then(|h| h.get(name))
                            .map(|v| v.as_str().to_string())
                    };
                    let (failed_on, failed_since) =
                        (header(FAILED_ON_HEADER), header(FAILED_SINCE_HEADER));
                    let stamp = Stamp::parse(failed_on.as_deref(), failed_since.as_deref());
                    let restamp = worker.failed_stamped(ticket, &stamp);
                    let disposition = restamp.disposition.clone();
                    tracing::debug!(worker = worker.id(), error = %why, ?disposition, "message failed");
                    let copy_to = match &disposition {
                        Disposition::Requeue { stamp: None } => None,
                        Disposition::Requeue { stamp: Some(_) } => {
                            Some(message.subject.to_string())
                        }
                        Disposition::DeadLetter { workers } => {
                            tracing::warn!(worker = worker.id(), workers, error = %why, "poison message dead-lettered");
                            config.dead_letter_subject.clone()
                        }
                    };
                    match (copy_to, disposition) {
                        (Some(subject), _) => {
                            let mut headers =
                                message.headers.clone().unwrap_or_else(HeaderMap::new);
                            headers.insert(FAILED_ON_HEADER, restamp.failed_on.as_str());
                            // Empty when no failure pointed at the message.
                            headers.insert(
                                FAILED_SINCE_HEADER,
                                restamp.failed_since.as_deref().unwrap_or(""),
                            );
                            js.publish_with_headers(subject, headers, message.payload.clone())
                                .await
                                .map_err(nats_err("republish"))?
                                .await
                                .map_err(nats_err("republish"))?;
                            message.ack().await.map_err(nats_err("ack"))?;
                        }
                        (None, Disposition::DeadLetter { .. }) => {
                            message
                                .ack_with(AckKind::Term)
                                .await
                                .map_err(nats_err("term"))?;
                        }
                        (None, _) => {
                            message
                                .ack_with(AckKind::Nak(Some(config.nak_delay)))
                                .await
                                .map_err(nats_err("nak"))?;
                        }
                    }
                }
            }
        }
        if stopping {
            // Messages of the batch not yet received are redelivered after their ack wait.
            return Ok(());
        }
    }
}
