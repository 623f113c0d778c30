//! Consuming a queue in windows, on the publisher's connection, for the
//! release stage.
//!
//! The consumer knows nothing of what the messages mean: it hands each
//! window (every delivery that is there at once, up to a window's size) to
//! whoever reads [`Window`]s and settles each delivery as told, acknowledging
//! or returning it to the queue. Several windows may be out at once (up to
//! the prefetch), so that the reader can work on one while another waits for
//! its commits and confirms; they are settled in the order they came, which
//! lets an all-acknowledged window be settled with one `multiple` ack. It rides on the publisher's connection (no
//! connection of its own to pay for) and follows it through reconnections:
//! when the connection is lost, unsettled deliveries return to the queue by
//! themselves, and consuming resumes on the next connection.

use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{Context, Publisher, open_channel};

/// How often the consumer looks for a connection while there is none, and
/// whether its channel still lives while the reader is busy.
const RECONNECT_POLL: Duration = Duration::from_millis(100);
/// The longest a broker call of the consumer may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// At shutdown, the longest wait for the reader to settle what it holds.
const SETTLE_ON_SHUTDOWN: Duration = Duration::from_secs(30);

/// One message as the queue held it.
#[derive(Clone, Debug)]
pub struct Inbound {
    pub routing_key: String,
    pub payload: Vec<u8>,
    pub properties: BasicProperties,
}

/// What becomes of one delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Done with: the queue forgets it.
    Ack,
    /// Not done: back to the queue, to be delivered again.
    Requeue,
}

/// The deliveries that were there at once; settle them to receive the next.
pub struct Window {
    pub messages: Vec<Inbound>,
    settled: oneshot::Sender<Vec<Settle>>,
}

impl Window {
    /// `settles` follows the order of `messages`; a missing one is requeued.
    pub fn settle(self, settles: Vec<Settle>) {
        let _ = self.settled.send(settles);
    }
}

/// How much a consumer takes at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumeLimits {
    /// Most deliveries in one window.
    pub window: u16,
    /// Most windows out at once, unsettled.
    pub windows: u16,
}

impl Publisher {
    /// Consumes `queue` window by window, until `shutdown`: at most
    /// `limits.windows` windows of `limits.window` deliveries are out at once.
    pub fn consume(
        &self,
        queue: String,
        limits: ConsumeLimits,
        shutdown: CancellationToken,
    ) -> Windows {
        self.consume_queue(Source::Shared(queue), limits, shutdown)
    }

    /// As [`Publisher::consume`], from a queue of this connection's own:
    /// declared on each connection, exclusive to it and gone with it.
    pub fn consume_own(
        &self,
        queue: String,
        limits: ConsumeLimits,
        shutdown: CancellationToken,
    ) -> Windows {
        self.consume_queue(Source::Own(queue), limits, shutdown)
    }

    fn consume_queue(
        &self,
        source: Source,
        limits: ConsumeLimits,
        shutdown: CancellationToken,
    ) -> Windows {
        let (windows, receiver) = mpsc::channel(usize::from(limits.windows.max(1)));
        let publisher = self.clone();
        tokio::spawn(async move {
            while !shutdown.is_cancelled() {
                let Some(connection) = publisher.connection() else {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(RECONNECT_POLL) => continue,
                    }
                };
                let outcome = consume_on(&connection, &source, limits, &windows, &shutdown).await;
                let queue = source.name();
                match outcome {
                    Ok(Stop::Shutdown) => return,
                    Ok(Stop::Lost) => debug!(queue, "consumer lost its channel; resuming"),
                    Err(error) => warn!(queue, %error, "cannot consume; retrying"),
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(RECONNECT_POLL * 5) => {}
                }
            }
        });
        Windows(receiver)
    }
}

/// What consuming a queue hands out: its windows, in the order the broker
/// delivered them, until the consumer stops.
pub struct Windows(mpsc::Receiver<Window>);

impl Windows {
    /// The next window; `None` once the consumer has stopped.
    pub async fn recv(&mut self) -> Option<Window> {
        self.0.recv().await
    }

    /// The windows as a stream, for concurrent processing.
    pub fn into_stream(self) -> impl futures_util::Stream<Item = Window> {
        futures_util::stream::unfold(self, |mut windows| async {
            windows.recv().await.map(|window| (window, windows))
        })
    }
}

/// A queue to consume: one the topology declares, or one of the
/// connection's own.
enum Source {
    Shared(String),
    Own(String),
}

impl Source {
    fn name(&self) -> &str {
        match self {
            Source::Shared(queue) | Source::Own(queue) => queue,
        }
    }
}

enum Stop {
    Shutdown,
    /// The channel or connection went away (or the reader of windows did).
    Lost,
}

/// A channel limited to `limits`' unacknowledged messages, consuming `queue`.
async fn start_consumer(
    connection: &lapin::Connection,
    source: &Source,
    limits: &ConsumeLimits,
) -> Result<(lapin::Channel, lapin::Consumer), super::BrokerError> {
    let queue = source.name();
    let channel = bounded(open_channel(connection, || opening(queue)), || {
        opening(queue)
    })
    .await??;
    if let Source::Own(queue) = source {
        declare_own(&channel, queue).await?;
    }
    let prefetch = limits.window.saturating_mul(limits.windows.max(1));
    let limiting = || format!("limiting unacknowledged messages from {queue:?}");
    bounded(
        channel.basic_qos(prefetch, BasicQosOptions::default()),
        limiting,
    )
    .await?
    .context(limiting)?;
    let consuming = || format!("consuming {queue:?}");
    let consume = channel.basic_consume(
        queue.into(),
        "".into(),
        BasicConsumeOptions::default(),
        FieldTable::default(),
    );
    let consumer = bounded(consume, consuming).await?.context(consuming)?;
    Ok((channel, consumer))
}

/// Settles each window's deliveries once the reader answers, in the order
/// the windows went out; stops when the reader stops answering.
async fn settle_in_order(
    mut settling: mpsc::UnboundedReceiver<(Vec<Delivery>, oneshot::Receiver<Vec<Settle>>)>,
) {
    while let Some((deliveries, answer)) = settling.recv().await {
        // Unsettled (the reader stopped): they return to the queue with the channel.
        let Ok(settles) = answer.await else {
            return;
        };
        if settle(&deliveries, &settles).await.is_err() {
            return;
        }
    }
}

async fn consume_on(
    connection: &lapin::Connection,
    source: &Source,
    limits: ConsumeLimits,
    windows: &mpsc::Sender<Window>,
    shutdown: &CancellationToken,
) -> Result<Stop, super::BrokerError> {
    let queue = source.name();
    let (channel, mut consumer) = start_consumer(connection, source, &limits).await?;
    // Windows out, in the order they came, settled in that order.
    let (out, settling) =
        mpsc::unbounded_channel::<(Vec<Delivery>, oneshot::Receiver<Vec<Settle>>)>();
    let settler = tokio::spawn(settle_in_order(settling));
    let stop = loop {
        let first = tokio::select! {
            () = shutdown.cancelled() => break Stop::Shutdown,
            next = consumer.next() => next,
        };
        let Some(Ok(first)) = first else {
            break Stop::Lost;
        };
        let mut deliveries: Vec<Delivery> = vec![first];
        while deliveries.len() < usize::from(limits.window) {
            match consumer.next().now_or_never() {
                Some(Some(Ok(delivery))) => deliveries.push(delivery),
                _ => break,
            }
        }
        let (settled, answer) = oneshot::channel();
        let messages = deliveries
            .iter()
            .map(|d| Inbound {
                routing_key: d.routing_key.to_string(),
                payload: d.data.clone(),
                properties: d.properties.clone(),
            })
            .collect();
        // The reader may be slow (a broker alarm holds its publishes): the
        // channel can die meanwhile, and then this consumer must start over
        // rather than wait for a reader that would hand back dead deliveries.
        let sent = tokio::select! {
            () = shutdown.cancelled() => break Stop::Shutdown,
            () = lost(&channel) => break Stop::Lost,
            sent = windows.send(Window { messages, settled }) => sent,
        };
        if sent.is_err() || out.send((deliveries, answer)).is_err() {
            break Stop::Shutdown;
        }
    };
    drop(out);
    match stop {
        // The windows out are settled before the channel closes.
        Stop::Shutdown => {
            let _ = tokio::time::timeout(SETTLE_ON_SHUTDOWN, settler).await;
        }
        // Their deliveries went back to the queue with the channel; the
        // reader's late settles go nowhere.
        Stop::Lost => settler.abort(),
    }
    let closing = || format!("closing the channel consuming {queue:?}");
    let _ = bounded(channel.close(200, "consumer stopping".into()), closing).await;
    Ok(stop)
}

/// Declares `queue` as the connection's own: exclusive, not durable, a
/// classic queue whatever the vhost's default (a quorum queue cannot be
/// exclusive).
async fn declare_own(channel: &lapin::Channel, queue: &str) -> Result<(), super::BrokerError> {
    let declaring = || format!("declaring this connection's own queue {queue:?}");
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        lapin::types::AMQPValue::LongString("classic".into()),
    );
    let options = QueueDeclareOptions {
        exclusive: true,
        auto_delete: true,
        ..QueueDeclareOptions::default()
    };
    bounded(
        channel.queue_declare(queue.into(), options, arguments),
        declaring,
    )
    .await?
    .context(declaring)?;
    Ok(())
}

fn opening(queue: &str) -> String {
    format!("opening a channel to consume {queue:?}")
}

/// Resolves once `channel` can no longer carry acknowledgements.
async fn lost(channel: &lapin::Channel) {
    while channel.status().connected() {
        tokio::time::sleep(RECONNECT_POLL).await;
    }
}

/// Every broker call of the consumer gets an answer in time, or the consumer
/// starts over: a call waiting on a half-dead connection would otherwise stop
/// the release stage for good.
async fn bounded<T>(
    call: impl std::future::Future<Output = T>,
    context: impl FnOnce() -> String,
) -> Result<T, super::BrokerError> {
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| super::BrokerError::CallTimeout {
            context: context(),
            after: CALL_TIMEOUT,
        })
}

/// Acknowledges or requeues each delivery; one `multiple` ack when all are acks.
async fn settle(deliveries: &[Delivery], settles: &[Settle]) -> Result<(), lapin::Error> {
    let all_acked = settles.len() == deliveries.len() && settles.iter().all(|s| *s == Settle::Ack);
    if all_acked {
        if let Some(last) = deliveries.last() {
            last.acker.ack(BasicAckOptions { multiple: true }).await?;
        }
        return Ok(());
    }
    for (index, delivery) in deliveries.iter().enumerate() {
        match settles.get(index).copied().unwrap_or(Settle::Requeue) {
            Settle::Ack => {
                delivery.acker.ack(BasicAckOptions::default()).await?;
            }
            Settle::Requeue => {
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                };
                delivery.acker.nack(requeue).await?;
            }
        }
    }
    Ok(())
}
