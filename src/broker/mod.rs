//! The adapter to RabbitMQ, and the only module that talks to it: connecting,
//! declaring the plan it is given (`provision`, `check`, `diagnose`),
//! publishing the messages it is given (`publisher`), consuming a queue in
//! windows for the release stage (`consume`), reading depths
//! (`inspect`, `management`), moving a chain (`migrate`) and requeueing the
//! unroutable queue (`unroutable`). It knows nothing of tasks, ledgers or
//! HTTP; channels are opened through [`open_channel`] and confirms read
//! through [`confirm_outcome`], each written once.

mod check;
mod consume;
mod diagnose;
mod inspect;
mod management;
mod migrate;
mod provision;
mod publisher;
mod unroutable;

use std::time::Duration;

use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Confirmation, Connection, ConnectionProperties};

pub use check::{CheckReport, CheckedObject, OtherChain, Status, check, discover_chain};
pub use consume::{ConsumeLimits, Inbound, Settle, Window};
pub use diagnose::{Difference, TopologyConflict};
pub use inspect::{QueueState, exchange_exists, queue_state};
pub use management::{ManagementApi, ManagementError, QueueCounts};
pub use migrate::{
    EmptinessCheck, MigrateError, MigrationReport, OldChain, POISON_REASON_HEADER,
    ROUTING_KEY_HEADER, Superseded, Survey, migrate_topology, survey,
};
pub use provision::{ProvisionReport, provision, teardown};
pub use publisher::{
    BrokerProblem, BrokerStatus, DEFAULT_FRAME_MAX, IsolatedPublisher, LateConfirm, Message,
    PublishError, Published, Publisher, PublisherOptions, SharedConnection,
    content_header_frame_size,
};
pub use unroutable::requeue_unroutable;

use crate::cascade::{ArgValue, Arguments};

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("cannot connect to RabbitMQ at {uri}: {source}")]
    Connect { uri: String, source: lapin::Error },
    #[error("cannot connect to RabbitMQ at {uri}: no answer within {after:?}")]
    ConnectTimeout { uri: String, after: Duration },
    #[error("{context}: {source}")]
    Call {
        context: String,
        source: lapin::Error,
    },
    #[error(transparent)]
    Conflict(#[from] TopologyConflict),
}

impl BrokerError {
    /// A conflict needs an operator; anything else may pass by reconnecting.
    pub fn is_permanent(&self) -> bool {
        matches!(self, BrokerError::Conflict(_))
    }

    /// The broker refused delayline itself (credentials, a missing vhost,
    /// missing permissions), as opposed to being away: retrying goes on, but
    /// it will not pass until someone changes the configuration.
    pub fn is_misconfiguration(&self) -> bool {
        let source = match self {
            BrokerError::Connect { source, .. } | BrokerError::Call { source, .. } => source,
            BrokerError::ConnectTimeout { .. } | BrokerError::Conflict(_) => return false,
        };
        match source.kind() {
            lapin::ErrorKind::ProtocolError(amqp) => matches!(
                amqp.kind(),
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)
                    | AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED)
            ),
            lapin::ErrorKind::AuthProviderError(_) => true,
            _ => false,
        }
    }
}

/// Adds what was being attempted to every broker error.
pub(crate) trait Context<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T, BrokerError>;
}

impl<T> Context<T> for Result<T, lapin::Error> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T, BrokerError> {
        self.map_err(|source| BrokerError::Call {
            context: context(),
            source,
        })
    }
}

/// The URI without its password, for logs and error messages.
pub fn redact_uri(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_owned();
    };
    match rest.split_once('@') {
        // Only a password is hidden; a URI without one shows none.
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
            None => uri.to_owned(),
        },
        None => uri.to_owned(),
    }
}

/// A new channel on `connection`; `purpose` says what for, in the error.
pub(crate) async fn open_channel(
    connection: &Connection,
    purpose: impl FnOnce() -> String,
) -> Result<Channel, BrokerError> {
    connection.create_channel().await.context(purpose)
}

/// What a publisher confirm says about one message: `Ok` only when the
/// broker took it and routed it somewhere.
pub(crate) fn confirm_outcome(confirmation: Confirmation) -> Result<(), PublishError> {
    match confirmation {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) => Err(PublishError::Returned(format!(
            "{} {}",
            returned.reply_code, returned.reply_text
        ))),
        Confirmation::Nack(_) => Err(PublishError::Nacked),
        Confirmation::NotRequested => Err(PublishError::Broker(
            "the channel is not in confirm mode".to_owned(),
        )),
    }
}

pub async fn connect(uri: &str, name: &str) -> Result<Connection, BrokerError> {
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    Connection::connect(uri, properties)
        .await
        .map_err(|source| BrokerError::Connect {
            uri: redact_uri(uri),
            source,
        })
}

/// Connects to the first of `uris` that answers (a cluster's nodes, in the
/// order given); the error is the last address's.
pub async fn connect_any(
    uris: &[String],
    name: &str,
    timeout: Duration,
) -> Result<Connection, BrokerError> {
    let mut last_error = None;
    for uri in uris {
        let attempt = tokio::time::timeout(timeout, connect(uri, name))
            .await
            .unwrap_or_else(|_| {
                Err(BrokerError::ConnectTimeout {
                    uri: redact_uri(uri),
                    after: timeout,
                })
            });
        match attempt {
            Ok(connection) => return Ok(connection),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(|| BrokerError::ConnectTimeout {
        uri: "(no broker address configured)".to_owned(),
        after: timeout,
    }))
}

pub(crate) fn amqp_value(value: &ArgValue) -> AMQPValue {
    match value {
        ArgValue::Str(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        ArgValue::Int(i) => AMQPValue::LongLongInt(*i),
    }
}

pub(crate) fn field_table(arguments: &Arguments) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in arguments {
        table.insert(ShortString::from(key.as_str()), amqp_value(value));
    }
    table
}

/// The broker's text for a PRECONDITION_FAILED channel error, if that is what `error` is.
pub(crate) fn precondition_failed(error: &lapin::Error) -> Option<String> {
    match error.kind() {
        lapin::ErrorKind::ProtocolError(amqp)
            if *amqp.kind() == AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) =>
        {
            let text = amqp.get_message().as_str();
            Some(
                text.strip_prefix("PRECONDITION_FAILED - ")
                    .unwrap_or(text)
                    .to_owned(),
            )
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            redact_uri("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact_uri("amqp://host"), "amqp://host");
        assert_eq!(
            redact_uri("postgres://postgres@127.0.0.1/test"),
            "postgres://postgres@127.0.0.1/test"
        );
    }
}
