//! The scheduler's view of the broker: a task becomes a [`Message`], and a
//! message is published through [`Publish`], which the broker's
//! [`Publisher`] implements and tests may replace (no broker needed to check
//! validation, error mapping or idempotency over HTTP).

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::broker::{
    BrokerStatus, ConsumeLimits, IsolatedPublisher, Message, PublishError, Published, Publisher,
    Window,
};
use crate::task::{DELAY_HEADER, DELIVER_AT_HEADER, FieldValue, REVISION_HEADER, Task};

/// What the scheduler needs from the broker.
pub trait Publish: Send + Sync + 'static {
    /// Connected or not, blocked or not, and why.
    fn status(&self) -> BrokerStatus;

    /// Refuses, without sending anything, a message the broker could not take.
    fn check_fits(&self, message: &Message) -> Result<(), PublishError>;

    /// Publishes persistently, mandatory, and awaits the confirm for at most
    /// the confirm timeout; after that the confirm is a [`Published::Late`].
    fn publish_bounded(&self, message: Message) -> BoxFuture<'_, Result<Published, PublishError>>;

    /// A connection of its own, for messages that must be published alone.
    fn isolated(&self) -> Box<dyn PublishAlone>;

    /// `queue`'s messages, a window at a time, until `shutdown` (the
    /// release stage's input).
    fn consume(
        &self,
        queue: String,
        limits: ConsumeLimits,
        shutdown: CancellationToken,
    ) -> mpsc::Receiver<Window>;
}

/// Publishes one message at a time where nothing else is published.
pub trait PublishAlone: Send {
    fn publish(&mut self, message: Message) -> BoxFuture<'_, Result<(), PublishError>>;
    fn close(&mut self) -> BoxFuture<'_, ()>;
}

impl Publish for Publisher {
    fn status(&self) -> BrokerStatus {
        Publisher::status(self)
    }

    fn check_fits(&self, message: &Message) -> Result<(), PublishError> {
        Publisher::check_fits(self, message)
    }

    fn publish_bounded(&self, message: Message) -> BoxFuture<'_, Result<Published, PublishError>> {
        Publisher::publish_bounded(self, message).boxed()
    }

    fn isolated(&self) -> Box<dyn PublishAlone> {
        Box::new(Publisher::isolated(self))
    }

    fn consume(
        &self,
        queue: String,
        limits: ConsumeLimits,
        shutdown: CancellationToken,
    ) -> mpsc::Receiver<Window> {
        Publisher::consume(self, queue, limits, shutdown)
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

/// The message of a task, to its entry exchange.
pub fn message_of(task: &Task) -> Message {
    Message {
        exchange: task.route.entry_exchange.clone(),
        routing_key: task.route.routing_key.clone(),
        payload: task.payload.clone(),
        properties: task_properties(task),
    }
}

/// The message's properties as consumers see them: the caller's headers,
/// the granted delay and due time, the task id as message id, persistent.
pub fn task_properties(task: &Task) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, value) in &task.headers {
        let value = match value {
            FieldValue::Str(s) => AMQPValue::LongString(LongString::from(s.as_str())),
            FieldValue::Int(i) => AMQPValue::LongLongInt(*i),
            FieldValue::Float(f) => AMQPValue::Double(*f),
            FieldValue::Bool(b) => AMQPValue::Boolean(*b),
        };
        headers.insert(ShortString::from(name.as_str()), value);
    }
    let as_i64 = |v: u64| AMQPValue::LongLongInt(i64::try_from(v).unwrap_or(i64::MAX));
    headers.insert(DELAY_HEADER.into(), as_i64(task.granted_delay_ms()));
    headers.insert(DELIVER_AT_HEADER.into(), as_i64(task.deliver_at_ms));
    headers.insert(REVISION_HEADER.into(), as_i64(task.revision));
    BasicProperties::default()
        .with_message_id(task.id.as_str().into())
        .with_content_type(task.content_type.as_str().into())
        // AMQP timestamps are whole seconds.
        .with_timestamp(task.accepted_at_ms / 1000)
        .with_delivery_mode(2)
        .with_headers(headers)
}
