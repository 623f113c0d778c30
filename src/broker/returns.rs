//! Returned messages, and which publish each belongs to.
//!
//! RabbitMQ returns a mandatory message that no queue took (`basic.return`)
//! before it confirms it, but the return names no delivery tag: lapin hands
//! it to the next confirm it completes, and with several publishes in flight
//! on one channel (a multiple ack, acks out of order) that may be another
//! publish's. Taken at its word, a released task the broker had dropped was
//! once marked delivered, and the task whose confirm carried the return,
//! delivered, was sent to the unroutable queue as well. So:
//! - a publish that may well come back (a release to an exchange of the
//!   user's, which has no alternate exchange) takes a channel alone while it
//!   is in flight ([`super::Publisher::publish_due_alone`]): its confirm
//!   carries its own return and no other;
//! - every publish recognises its own return by its content; one that is not
//!   its own (a level probe's notice to a replica that is gone, a message
//!   into a chain whose bindings are missing) is logged, and the publish is
//!   told what its confirm says of its own message.

use lapin::Confirmation;
use lapin::message::BasicReturnMessage;
use lapin::types::ShortString;
use tracing::warn;

use super::publish_error::{PublishError, confirm_outcome};

/// What a publish sent, enough to know its message when it comes back.
pub(super) struct Sent<'a> {
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub message_id: Option<ShortString>,
    pub payload: &'a [u8],
}

impl Sent<'_> {
    /// The returned message is this one (or one no different from it).
    fn is(&self, returned: &BasicReturnMessage) -> bool {
        let delivery = &returned.delivery;
        delivery.exchange.as_str() == self.exchange
            && delivery.routing_key.as_str() == self.routing_key
            && delivery.properties.message_id() == &self.message_id
            && delivery.data == self.payload
    }
}

/// What the confirm says about `sent`'s own message; a returned message it
/// carries that is another publish's is logged and set aside.
pub(super) fn own_outcome(confirmation: Confirmation, sent: &Sent<'_>) -> Result<(), PublishError> {
    let (own, stray) = match confirmation {
        Confirmation::Ack(Some(returned)) if !sent.is(&returned) => {
            (Confirmation::Ack(None), returned)
        }
        Confirmation::Nack(Some(returned)) if !sent.is(&returned) => {
            (Confirmation::Nack(None), returned)
        }
        confirmation => return confirm_outcome(confirmation),
    };
    warn!(
        exchange = %stray.delivery.exchange,
        routing_key = %stray.delivery.routing_key,
        message_id = stray.delivery.properties.message_id().as_ref().map(|id| id.as_str()),
        reply_code = stray.reply_code,
        reply_text = %stray.reply_text,
        "RabbitMQ returned a message no queue took, to the confirm of another publish on its \
         channel: it is not that publish's"
    );
    confirm_outcome(own)
}

#[cfg(test)]
mod tests {
    use lapin::BasicProperties;
    use lapin::message::Delivery;

    use super::*;

    fn returned(routing_key: &str, id: &str, payload: &[u8]) -> BasicReturnMessage {
        let mut delivery = Delivery::mock(
            0,
            "orders".into(),
            routing_key.into(),
            false,
            payload.to_vec(),
        );
        delivery.properties = BasicProperties::default().with_message_id(id.into());
        BasicReturnMessage {
            delivery,
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
        }
    }

    fn sent<'a>(routing_key: &'a str, id: &str, payload: &'a [u8]) -> Sent<'a> {
        Sent {
            exchange: "orders",
            routing_key,
            message_id: Some(id.into()),
            payload,
        }
    }

    #[test]
    fn a_publish_owns_only_the_return_of_its_own_message() {
        let own = sent("billing", "t1", b"1");
        let outcome = own_outcome(
            Confirmation::Ack(Some(returned("billing", "t1", b"1"))),
            &own,
        );
        assert!(matches!(outcome, Err(PublishError::Returned(_))));
        // Another task's return: this one was taken.
        for other in [
            returned("nobody", "t1", b"1"),
            returned("billing", "t2", b"1"),
            returned("billing", "t1", b"2"),
        ] {
            assert_eq!(own_outcome(Confirmation::Ack(Some(other)), &own), Ok(()));
        }
        let nacked = own_outcome(Confirmation::Nack(Some(returned("x", "t9", b""))), &own);
        assert_eq!(nacked, Err(PublishError::Nacked));
        assert_eq!(own_outcome(Confirmation::Ack(None), &own), Ok(()));
    }
}
