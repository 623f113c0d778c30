//! Why a publish failed, and what a publisher confirm says about one
//! message: read in one place for every part of the adapter that publishes.

use std::time::Duration;

use lapin::Confirmation;
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// Not connected; the reason is the last connection attempt's error.
    #[error("not connected to RabbitMQ: {0}")]
    Unavailable(String),
    #[error("RabbitMQ blocks publishing ({0}); nothing was sent")]
    Blocked(String),
    #[error(
        "the message's properties and headers take {size} bytes, more than the {limit} that \
         fit in one AMQP frame (frame_max less the room the broker needs for its \
         dead-lettering headers)"
    )]
    TooLarge { size: usize, limit: usize },
    /// The message could not be sent: its channel or connection had failed.
    #[error("publishing to RabbitMQ failed: {0}")]
    Broker(String),
    /// The message was sent, then its channel or connection failed before
    /// the broker confirmed it: the broker may have it (a retry may deliver
    /// it twice), and it may be what failed them. `refused`: the broker
    /// closed them with an error about what was sent (not a shutdown or a
    /// lost socket), which a message sent alone makes its own fault.
    #[error("RabbitMQ failed the channel before confirming the message: {reason}")]
    Unconfirmed { reason: String, refused: bool },
    #[error("RabbitMQ did not confirm the message within {0:?}")]
    Timeout(Duration),
    #[error("RabbitMQ refused the message (negative acknowledgement)")]
    Nacked,
    #[error(
        "RabbitMQ returned the message as unroutable ({0}): the cascade topology is incomplete"
    )]
    Returned(String),
}

impl PublishError {
    pub(super) fn unconfirmed(error: &lapin::Error) -> Self {
        // Only errors about what was sent: a node going away, a queue or an
        // exchange missing while a cluster recovers, or a broker's internal
        // trouble say nothing about the message.
        let refused = match error.kind() {
            lapin::ErrorKind::ProtocolError(amqp) => matches!(
                amqp.kind(),
                AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)
                    | AMQPErrorKind::Hard(
                        AMQPHardError::FRAMEERROR
                            | AMQPHardError::SYNTAXERROR
                            | AMQPHardError::COMMANDINVALID
                            | AMQPHardError::UNEXPECTEDFRAME
                    )
            ),
            _ => false,
        };
        PublishError::Unconfirmed {
            reason: error.to_string(),
            refused,
        }
    }

    /// The message may be what failed its channel or connection: retry it alone.
    pub fn is_suspect(&self) -> bool {
        matches!(self, PublishError::Unconfirmed { .. })
    }

    /// The broker may have taken the message although it was not confirmed.
    pub fn may_have_landed(&self) -> bool {
        matches!(
            self,
            PublishError::Unconfirmed { .. } | PublishError::Timeout(_)
        )
    }
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
