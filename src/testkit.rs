//! What the integration tests and the benchmark share: a consumer that
//! stamps each message the moment it arrives, the wall clock in
//! microseconds, and quantiles. Not used by the service itself; kept in the
//! library so that the tests and the benchmark measure lateness the same
//! way, with one consumer set-up between them.

use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::task::JoinHandle;

use crate::broker::{BrokerError, connect};
/// The service's metrics, for the benchmark's measure of what recording a
/// delivery costs.
pub use crate::metrics::Metrics;

/// The system's wall clock, in microseconds since the epoch: stepped or
/// not, as a process started now reads it ([`crate::clock::system_now`]).
pub fn now_us() -> i64 {
    crate::clock::system_now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
        })
}

/// The system's wall clock in milliseconds since the epoch (see [`now_us`]).
pub fn now_ms() -> u64 {
    u64::try_from(now_us() / 1000).unwrap_or(0)
}

/// The value at quantile `q` of `sorted` (nearest rank); NaN when empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// A message as a consumer received it, stamped with the moment it arrived.
#[derive(Clone, Debug)]
pub struct Arrival {
    /// The wall clock when it arrived, microseconds ([`now_us`]).
    pub at_us: i64,
    pub routing_key: String,
    pub body: Vec<u8>,
    pub properties: BasicProperties,
}

impl Arrival {
    /// The wall clock when it arrived, epoch milliseconds (rounded down).
    pub fn at_ms(&self) -> u64 {
        u64::try_from(self.at_us / 1000).unwrap_or(0)
    }

    /// The task id (`message_id`), empty when there is none.
    pub fn message_id(&self) -> String {
        self.properties
            .message_id()
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default()
    }
}

/// Which queue to consume, and how.
#[derive(Clone, Debug)]
pub struct ConsumeSpec<'a> {
    pub queue: &'a str,
    /// Declare the queue (durable) and bind it to `(exchange, key)`;
    /// without, the queue must exist.
    pub binding: Option<(&'a str, &'a str)>,
    /// Declare it as a quorum queue rather than a classic one.
    pub quorum: bool,
    /// Acknowledge each message after stamping it; without, the broker
    /// counts it delivered as it sends it (`no_ack`).
    pub ack: bool,
    /// At most this many messages unacknowledged on the channel.
    pub prefetch: Option<u16>,
}

/// A consumer whose messages are stamped as they arrive: a test that reads
/// them later still measures when they came.
pub struct Consumer {
    pub channel: Channel,
    arrived: UnboundedReceiver<Arrival>,
    stamping: Stamping,
}

/// The task that stamps arrivals; it holds the connection, and it ends with
/// the consumer unless set free ([`Consumer::into_arrivals`]).
struct Stamping(Option<JoinHandle<()>>);

impl Drop for Stamping {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

impl Consumer {
    /// Consumes `spec.queue` on the broker at `uri`, declaring and binding
    /// it first when `spec.binding` says so.
    pub async fn start(uri: &str, spec: ConsumeSpec<'_>) -> Result<Consumer, BrokerError> {
        let connection = connect(uri, "delayline test consumer").await?;
        let failed = |what: &str| {
            let context = format!("{what} {}", spec.queue);
            move |source| BrokerError::Call { context, source }
        };
        let channel = connection
            .create_channel()
            .await
            .map_err(failed("opening a channel for"))?;
        if let Some((exchange, key)) = spec.binding {
            declare_bound(&channel, &spec, exchange, key).await?;
        }
        if let Some(prefetch) = spec.prefetch {
            channel
                .basic_qos(prefetch, BasicQosOptions::default())
                .await
                .map_err(failed("setting the prefetch of"))?;
        }
        let options = BasicConsumeOptions {
            no_ack: !spec.ack,
            ..BasicConsumeOptions::default()
        };
        let consumer = channel
            .basic_consume(spec.queue.into(), "".into(), options, FieldTable::default())
            .await
            .map_err(failed("consuming"))?;
        let (arrivals, arrived) = unbounded_channel();
        let stamping = tokio::spawn(stamp_each(connection, consumer, arrivals, spec.ack));
        Ok(Consumer {
            channel,
            arrived,
            stamping: Stamping(Some(stamping)),
        })
    }

    /// The next message, waiting at most `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Arrival> {
        tokio::time::timeout(timeout, self.arrived.recv())
            .await
            .ok()
            .flatten()
    }

    /// The messages as they arrive, for a consumer that reads them on a task
    /// of its own. The consumer keeps running at least as long as the
    /// receiver lives.
    pub fn into_arrivals(mut self) -> UnboundedReceiver<Arrival> {
        // Set free: it ends with the broker's consumer, or at the first
        // message after the receiver is dropped (the benchmark's consumers
        // live as long as its run).
        self.stamping.0 = None;
        self.arrived
    }
}

async fn declare_bound(
    channel: &Channel,
    spec: &ConsumeSpec<'_>,
    exchange: &str,
    key: &str,
) -> Result<(), BrokerError> {
    let mut arguments = FieldTable::default();
    if spec.quorum {
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
    }
    // Durable: RabbitMQ 4 deprecates transient queues that are not
    // exclusive (and later releases refuse them).
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let failed = |what: &str| {
        let context = format!("{what} {}", spec.queue);
        move |source| BrokerError::Call { context, source }
    };
    channel
        .queue_declare(spec.queue.into(), options, arguments)
        .await
        .map_err(failed("declaring"))?;
    channel
        .queue_bind(
            spec.queue.into(),
            exchange.into(),
            key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(failed("binding"))?;
    Ok(())
}

/// Stamps each delivery as it arrives (before acknowledging it, when asked).
async fn stamp_each(
    connection: Connection,
    mut consumer: lapin::Consumer,
    arrivals: tokio::sync::mpsc::UnboundedSender<Arrival>,
    ack: bool,
) {
    let _open = connection;
    loop {
        let delivery = match consumer.next().await {
            Some(Ok(delivery)) => delivery,
            Some(Err(error)) => {
                tracing::warn!(%error, "a test consumer ended");
                return;
            }
            None => {
                tracing::warn!("a test consumer's stream ended (cancelled by the broker?)");
                return;
            }
        };
        let at_us = now_us();
        if ack && delivery.ack(BasicAckOptions::default()).await.is_err() {
            return;
        }
        let arrival = Arrival {
            at_us,
            routing_key: delivery.routing_key.to_string(),
            body: delivery.data,
            properties: delivery.properties,
        };
        if arrivals.send(arrival).is_err() {
            return;
        }
    }
}
