//! What one pass through a queue costs the broker, by queue type: publish
//! confirmed, then consume and acknowledge, the way the AMQP ingress passes
//! every plugin producer's message through its own queue (issue 44).
//!
//! Record 30 put the ingress's gap to HTTP batch mostly on that pass through
//! a quorum queue; record 31 found a classic queue dearer on 3.10. This phase
//! measures the pass alone, without the service, for quorum, classic and
//! stream queues side by side, so that a cheaper type is judged by numbers
//! before anything is built on it. A stream is consumed as the service would
//! have to: over AMQP 0-9-1, with a prefetch, acknowledging windows.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use delayline::broker::connect;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation};
use serde::{Deserialize, Serialize};

use crate::cpu;
use crate::load::{close, confirming_channels};

/// Deliveries a consumer may hold, as the ingress (4 windows of 256).
const PREFETCH: u16 = 1024;
/// Deliveries acknowledged at once, with `multiple`, as one ingress window.
const ACK_EVERY: u64 = 256;
/// How long the consumer may take to catch up once publishing stops.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// One queue type's pass, publishers and the consumer running together.
#[derive(Debug, Serialize, Deserialize)]
pub struct Pass {
    pub queue_type: String,
    pub channels: usize,
    pub in_flight: usize,
    /// Messages published and confirmed while publishing ran.
    pub published: u64,
    /// Of them, consumed and acknowledged by the end (all, unless the drain timed out).
    pub consumed: u64,
    /// From the first publish to the last acknowledgement.
    pub seconds: f64,
    /// Messages through the whole pass a second: consumed over `seconds`.
    pub passed_per_sec: f64,
    /// Confirmed publishes a second while publishing ran.
    pub published_per_sec: f64,
    /// The broker's (and this process's) CPU over `seconds`, per message consumed.
    pub cpu: cpu::CpuPerTask,
}

/// Measures a pass through a fresh queue of each of `queue_types`, named
/// under `prefix` and deleted after.
pub async fn phase(
    uri: &str,
    prefix: &str,
    queue_types: &[String],
    channels: usize,
    in_flight: usize,
    duration: Duration,
) -> anyhow::Result<Vec<Pass>> {
    let broker = cpu::broker_pid();
    let mut passes = Vec::new();
    for queue_type in queue_types {
        let queue = format!("{prefix}.pass-{queue_type}");
        let pass = measure(
            uri, &queue, queue_type, channels, in_flight, duration, broker,
        )
        .await
        .with_context(|| format!("a pass through a {queue_type} queue"))?;
        passes.push(pass);
    }
    Ok(passes)
}

async fn measure(
    uri: &str,
    queue: &str,
    queue_type: &str,
    channels: usize,
    in_flight: usize,
    duration: Duration,
    broker: Option<u32>,
) -> anyhow::Result<Pass> {
    let connection = connect(uri, "delayline-bench queue pass").await?;
    let admin = connection.create_channel().await?;
    declare(&admin, queue, queue_type).await?;
    let consuming = connection.create_channel().await?;
    let consumed = Arc::new(AtomicU64::new(0));
    let consumer = tokio::spawn(consume(
        consuming.clone(),
        queue.to_owned(),
        queue_type == "stream",
        consumed.clone(),
    ));
    let meter = cpu::Meter::start(broker, None);
    let start = Instant::now();
    let published = publish(&connection, queue, channels, in_flight, duration).await;
    let publishing = start.elapsed();
    if let Ok(published) = published {
        drain(&consumed, published, &consumer).await;
    }
    let elapsed = start.elapsed();
    let passed = consumed
        .load(Ordering::Relaxed)
        .min(*published.as_ref().unwrap_or(&0));
    let cpu = meter.finish(passed);
    let failed = consumer.is_finished();
    // Closed before the queue goes: a consumer cancelled by the delete while
    // lapin cancels it too ends the connection in a protocol error.
    let _ = consuming.close(200, "pass measured".into()).await;
    let consumer_error = if failed {
        consumer
            .await
            .map_or_else(|panicked| Some(panicked.into()), Result::err)
    } else {
        consumer.abort();
        None
    };
    // Deleted whatever the pass came to.
    let deleted = admin
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await;
    close(&connection).await;
    let published = published?;
    if let Some(error) = consumer_error {
        return Err(error.context("consuming"));
    }
    deleted?;
    Ok(Pass {
        queue_type: queue_type.to_owned(),
        channels,
        in_flight,
        published,
        consumed: passed,
        seconds: elapsed.as_secs_f64(),
        passed_per_sec: passed as f64 / elapsed.as_secs_f64(),
        published_per_sec: published as f64 / publishing.as_secs_f64(),
        cpu,
    })
}

/// Waits until the consumer has acknowledged `published` messages, it has
/// stopped, or [`DRAIN_LIMIT`] has passed.
async fn drain(
    consumed: &AtomicU64,
    published: u64,
    consumer: &tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let drained = Instant::now() + DRAIN_LIMIT;
    while consumed.load(Ordering::Relaxed) < published
        && Instant::now() < drained
        && !consumer.is_finished()
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A durable queue of `queue_type` (`quorum`, `classic` or `stream`).
async fn declare(channel: &lapin::Channel, queue: &str, queue_type: &str) -> anyhow::Result<()> {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(queue_type.into()),
    );
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), durable, arguments)
        .await?;
    Ok(())
}

/// Consumes `queue` for good, acknowledging every [`ACK_EVERY`] deliveries
/// at once and counting what it acknowledged.
async fn consume(
    channel: lapin::Channel,
    queue: String,
    stream: bool,
    consumed: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let mut arguments = FieldTable::default();
    if stream {
        // A stream consumer says where to start; acks only free its credit.
        arguments.insert(
            "x-stream-offset".into(),
            AMQPValue::LongString("first".into()),
        );
    }
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            arguments,
        )
        .await?;
    let mut unacked = 0;
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        unacked += 1;
        if unacked == ACK_EVERY {
            delivery
                .acker
                .ack(BasicAckOptions { multiple: true })
                .await?;
            consumed.fetch_add(unacked, Ordering::Relaxed);
            unacked = 0;
        }
    }
    Ok(())
}

/// What a plugin producer publishes: a small JSON body, a tenant header and
/// its delay in `x-delay`, persistent, `in_flight` confirms outstanding over
/// `channels`, for `duration`. Returns the count confirmed, rounded down to
/// whole acknowledgement windows so that the consumer can account for all.
async fn publish(
    connection: &lapin::Connection,
    queue: &str,
    channels: usize,
    in_flight: usize,
    duration: Duration,
) -> anyhow::Result<u64> {
    let opened = confirming_channels(connection, channels).await?;
    let deadline = Instant::now() + duration;
    let confirmed = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..in_flight)
        .map(|w| {
            let channel = opened[w % channels].clone();
            let queue = queue.to_owned();
            let confirmed = confirmed.clone();
            tokio::spawn(async move {
                let mut n = w as u64;
                while Instant::now() < deadline {
                    let (payload, properties) = plugin_message(n);
                    n += in_flight as u64;
                    let options = BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    };
                    let sent = channel
                        .basic_publish(
                            "".into(),
                            queue.as_str().into(),
                            options,
                            &payload,
                            properties,
                        )
                        .await;
                    if let Ok(Confirmation::Ack(None)) = async { sent?.await }.await {
                        confirmed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.context("publisher")?;
    }
    let confirmed = confirmed.load(Ordering::Relaxed);
    // The consumer counts whole windows; a remainder below one is dropped.
    Ok(confirmed - confirmed % ACK_EVERY)
}

fn plugin_message(n: u64) -> (Vec<u8>, BasicProperties) {
    let payload = format!(
        r#"{{"n":{n},"note":"a payload of about a hundred bytes, like a small business event"}}"#
    );
    let mut headers = FieldTable::default();
    headers.insert(
        "tenant".into(),
        AMQPValue::LongString(format!("t-{}", n % 16).as_str().into()),
    );
    headers.insert(
        "x-delay".into(),
        AMQPValue::LongLongInt(3_600_000 + (n % 1000) as i64),
    );
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_headers(headers);
    (payload.into_bytes(), properties)
}
