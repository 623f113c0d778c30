//! Looking at the broker without changing it: passive declarations.
//!
//! AMQP's passive declare answers whether a queue or exchange exists and, for
//! a queue, how many messages and consumers it has. That is all the metrics,
//! `provision --check` and `migrate-topology` need, so none of them depends
//! on the management plugin being enabled.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use lapin::Connection;
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::FieldTable;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::check::discover_chain;
use super::{BrokerError, Context, Publisher};
use crate::cascade::Cascade;
use crate::metrics::{LevelLabel, Metrics, VersionLabel};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueState {
    pub messages: u32,
    pub consumers: u32,
}

fn not_found(error: &lapin::Error) -> bool {
    matches!(error.kind(), lapin::ErrorKind::ProtocolError(amqp)
        if *amqp.kind() == AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
}

/// The queue's depth, or `None` when it does not exist. A NOT_FOUND closes
/// the channel, so each lookup has its own.
pub async fn queue_state(
    connection: &Connection,
    name: &str,
) -> Result<Option<QueueState>, BrokerError> {
    let channel = connection
        .create_channel()
        .await
        .context(|| format!("opening a channel to look at queue {name:?}"))?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    match channel
        .queue_declare(name.into(), passive, FieldTable::default())
        .await
    {
        Ok(queue) => {
            let _ = channel.close(200, "looked".into()).await;
            Ok(Some(QueueState {
                messages: queue.message_count(),
                consumers: queue.consumer_count(),
            }))
        }
        Err(error) if not_found(&error) => Ok(None),
        Err(error) => Err(BrokerError::Call {
            context: format!("looking at queue {name:?}"),
            source: error,
        }),
    }
}

pub async fn exchange_exists(connection: &Connection, name: &str) -> Result<bool, BrokerError> {
    let channel = connection
        .create_channel()
        .await
        .context(|| format!("opening a channel to look at exchange {name:?}"))?;
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..ExchangeDeclareOptions::default()
    };
    // The kind is ignored by a passive declare.
    match channel
        .exchange_declare(
            name.into(),
            lapin::ExchangeKind::Topic,
            passive,
            FieldTable::default(),
        )
        .await
    {
        Ok(()) => {
            let _ = channel.close(200, "looked".into()).await;
            Ok(true)
        }
        Err(error) if not_found(&error) => Ok(false),
        Err(error) => Err(BrokerError::Call {
            context: format!("looking at exchange {name:?}"),
            source: error,
        }),
    }
}

/// Reads every level queue's depth and the unroutable queue's into
/// `metrics` every `every`, until `shutdown`. It borrows the publisher's
/// connection, so while that is down the depths keep their last values
/// (`broker_connected` says why, the poll timestamp how old they are).
pub async fn poll_queue_depths(
    publisher: Publisher,
    cascade: Arc<Cascade>,
    metrics: Arc<Metrics>,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = interval.tick() => {}
        }
        let Some(connection) = publisher.connection() else {
            continue;
        };
        match poll_once(&connection, &cascade, &metrics).await {
            Ok(()) => {
                let now = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                metrics.queue_depth_polled.set(now);
            }
            Err(error) => warn!(%error, "queue depths not polled"),
        }
    }
}

async fn poll_once(
    connection: &Connection,
    cascade: &Cascade,
    metrics: &Metrics,
) -> Result<(), BrokerError> {
    for level in 0..cascade.levels() {
        let label = LevelLabel {
            level,
            queue: cascade.level_queue(level),
        };
        match queue_state(connection, &label.queue).await? {
            Some(state) => {
                metrics
                    .level_messages
                    .get_or_create(&label)
                    .set(i64::from(state.messages));
            }
            // Not provisioned yet, or deleted by hand: no series rather than a false 0.
            None => {
                metrics.level_messages.remove(&label);
            }
        }
    }
    let unroutable = queue_state(connection, &cascade.unroutable_queue()).await?;
    metrics
        .unroutable_messages
        .set(unroutable.map_or(0, |s| i64::from(s.messages)));
    // An older chain left behind still delivers, but blocks its deletion and
    // hides messages from the level metrics above: make it visible.
    for version in 1..cascade.version() {
        let label = VersionLabel { version };
        let levels = discover_chain(connection, cascade.prefix(), version).await?;
        if levels.is_empty() {
            metrics.retired_chain_messages.remove(&label);
        } else {
            let messages: u64 = levels.iter().map(|q| u64::from(q.messages)).sum();
            metrics
                .retired_chain_messages
                .get_or_create(&label)
                .set(i64::try_from(messages).unwrap_or(i64::MAX));
        }
    }
    Ok(())
}
