//! Looking at the broker without changing it: passive declarations.
//!
//! AMQP's passive declare answers whether a queue or exchange exists and, for
//! a queue, how many messages and consumers it has. That is all the metrics,
//! `provision --check` and `migrate-topology` need, so none of them depends
//! on the management plugin being enabled.

use lapin::Connection;
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::FieldTable;

use super::{BrokerError, open_channel};

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
    let channel = open_channel(connection, || {
        format!("opening a channel to look at queue {name:?}")
    })
    .await?;
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
    let channel = open_channel(connection, || {
        format!("opening a channel to look at exchange {name:?}")
    })
    .await?;
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
