//! The scheduler's view of the broker: a message (built by
//! [`crate::message`]) is published, and a queue consumed in windows
//! ([`Windows`]), through [`Broker`], which the broker's
//! [`Publisher`] implements and tests may replace (no broker needed to check
//! validation, error mapping or idempotency over HTTP).

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::broker::{
    BrokerStatus, ConsumeLimits, IsolatedPublisher, PublishError, Published, Publisher, Windows,
};
use crate::message::Message;

/// What the scheduler needs from the broker.
pub trait Broker: Send + Sync + 'static {
    /// Connected or not, blocked or not, and why.
    fn status(&self) -> BrokerStatus;

    /// Refuses, without sending anything, a message the broker could not take.
    fn check_fits(&self, message: &Message) -> Result<(), PublishError>;

    /// Publishes persistently, mandatory, and awaits the confirm for at most
    /// the confirm timeout; after that the confirm is a [`Published::Late`].
    fn publish_bounded(&self, message: Message) -> BoxFuture<'_, Result<Published, PublishError>>;

    /// As [`Broker::publish_bounded`], for a task released when due: where
    /// new tasks' publishes do not delay it.
    fn publish_due(&self, message: Message) -> BoxFuture<'_, Result<Published, PublishError>> {
        self.publish_bounded(message)
    }

    /// As [`Broker::publish_due`], for a message the broker may return (to
    /// an exchange without an alternate exchange): on a channel nothing
    /// else uses while it is in flight, so a return its confirm carries is
    /// its own.
    fn publish_due_alone(
        &self,
        message: Message,
    ) -> BoxFuture<'_, Result<Published, PublishError>> {
        self.publish_due(message)
    }

    /// A connection of its own, for messages that must be published alone.
    fn isolated(&self) -> Box<dyn PublishAlone>;

    /// Whether an exchange of that name exists (a passive declare, on a
    /// channel of its own: a missing exchange closes the channel asking).
    fn exchange_exists<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, PublishError>>;

    /// A queue's ready messages (a passive declare on a channel of its
    /// own); `None` when it does not exist.
    fn queue_depth<'a>(&'a self, name: &'a str)
    -> BoxFuture<'a, Result<Option<u64>, PublishError>>;

    /// `queue`'s messages, a window at a time, until `shutdown` (the
    /// release stage's input).
    fn consume(&self, queue: String, limits: ConsumeLimits, shutdown: CancellationToken)
    -> Windows;

    /// As [`Broker::consume`], from a queue of this replica's own, declared
    /// on each connection and gone with it (where other replicas hand on
    /// its level probes).
    fn consume_own(
        &self,
        queue: String,
        limits: ConsumeLimits,
        shutdown: CancellationToken,
    ) -> Windows;
}

/// Publishes one message at a time where nothing else is published.
pub trait PublishAlone: Send {
    fn publish(&mut self, message: Message) -> BoxFuture<'_, Result<(), PublishError>>;
    fn close(&mut self) -> BoxFuture<'_, ()>;
}

impl Broker for Publisher {
    fn status(&self) -> BrokerStatus {
        Publisher::status(self)
    }

    fn check_fits(&self, message: &Message) -> Result<(), PublishError> {
        Publisher::check_fits(self, message)
    }

    fn publish_bounded(&self, message: Message) -> BoxFuture<'_, Result<Published, PublishError>> {
        Publisher::publish_bounded(self, message).boxed()
    }

    fn publish_due(&self, message: Message) -> BoxFuture<'_, Result<Published, PublishError>> {
        Publisher::publish_due(self, message).boxed()
    }

    fn publish_due_alone(
        &self,
        message: Message,
    ) -> BoxFuture<'_, Result<Published, PublishError>> {
        Publisher::publish_due_alone(self, message).boxed()
    }

    fn isolated(&self) -> Box<dyn PublishAlone> {
        Box::new(Publisher::isolated(self))
    }

    fn exchange_exists<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, PublishError>> {
        async move {
            let connection = self
                .connection()
                .ok_or_else(|| PublishError::Unavailable("not connected".to_owned()))?;
            crate::broker::exchange_exists(&connection, name)
                .await
                .map_err(|error| PublishError::Broker(error.to_string()))
        }
        .boxed()
    }

    fn queue_depth<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, PublishError>> {
        async move {
            let connection = self
                .connection()
                .ok_or_else(|| PublishError::Unavailable("not connected".to_owned()))?;
            let state = crate::broker::queue_state(&connection, name)
                .await
                .map_err(|error| PublishError::Broker(error.to_string()))?;
            Ok(state.map(|state| u64::from(state.messages)))
        }
        .boxed()
    }

    fn consume(
        &self,
        queue: String,
        limits: ConsumeLimits,
        shutdown: CancellationToken,
    ) -> Windows {
        Publisher::consume(self, queue, limits, shutdown)
    }

    fn consume_own(
        &self,
        queue: String,
        limits: ConsumeLimits,
        shutdown: CancellationToken,
    ) -> Windows {
        Publisher::consume_own(self, queue, limits, shutdown)
    }
}

impl PublishAlone for IsolatedPublisher {
    fn publish(&mut self, message: Message) -> BoxFuture<'_, Result<(), PublishError>> {
        IsolatedPublisher::publish(self, message).boxed()
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        IsolatedPublisher::close(self).boxed()
    }
}
