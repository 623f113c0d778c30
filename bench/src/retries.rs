//! Retries with backoff (issue 68): N messages a consumer rejects at once,
//! on the default configuration (one node, SQLite), with the policy's
//! first wait of 5 s and a jitter of 0.2. Measured: how fast the retry
//! intake takes the dead-lettered messages in (scheduled, in the ledger)
//! and its CPU a message; how the first retries spread over time (each
//! one's wait from its own rejection: never below 5 s, at most 6 s by the
//! jitter, and its lateness past that); early, missing and duplicated.
//! Beside it, the same N messages published at once to the AMQP ingress
//! with `x-delay` = 5 s: the intake delayline had before, measured the same
//! way (messages a second until all are committed, CPU a message).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::StreamExt;
use indicatif::ProgressBar;
use lapin::BasicProperties;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use serde::Serialize;

use delayline::broker::connect;
use delayline::message::ATTEMPT_HEADER;
use delayline::testkit::{now_us, quantile};

use crate::burst::scrape;
use crate::cpu::{CpuPerTask, Meter, broker_pid};
use crate::sut::{RETRIED_QUEUE, RETRY_INITIAL_S, RETRY_JITTER, ServiceUnderTest, Setup, Store};

#[derive(Clone, Debug, Serialize)]
pub struct RetriesRun {
    pub messages: usize,
    pub initial_ms: u64,
    pub jitter: f64,
    /// The consumer's rejections, first to last.
    pub rejected_in_ms: f64,
    /// Retries scheduled a second, from the first rejection until all were.
    pub intake_per_sec: f64,
    pub intake_cpu: CpuPerTask,
    /// The same messages to the AMQP ingress: committed a second.
    pub ingress_per_sec: f64,
    pub ingress_cpu: CpuPerTask,
    /// Each first retry's wait from its own rejection, ms: quantiles.
    pub wait_min_ms: f64,
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    pub wait_max_ms: f64,
    /// The backoff each retry was granted (`x-delay-ms`): never below the
    /// first wait, at most the jitter above it.
    pub granted_min_ms: f64,
    pub granted_max_ms: f64,
    /// Each retry's arrival past its `x-deliver-at-ms` (negative: early).
    pub late_p50_ms: f64,
    pub late_p99_ms: f64,
    pub late_max_ms: f64,
    /// First retries arriving in each 100 ms from the first's arrival.
    pub arrivals_per_100ms: Vec<u64>,
    /// Waits below the policy's first wait.
    pub early: usize,
    pub missing: usize,
    pub duplicates: usize,
}

pub async fn phase(
    amqp_uri: &str,
    channels: usize,
    sizes: &[usize],
    progress: &ProgressBar,
) -> anyhow::Result<Vec<RetriesRun>> {
    let mut runs = Vec::new();
    for &messages in sizes {
        progress.set_message(format!("retries: {messages} rejected at once"));
        let setup = Setup::default_with(Store::Sqlite);
        let mut sut = ServiceUnderTest::spawn(amqp_uri, channels, &setup).await?;
        let run = one(&mut sut, amqp_uri, messages).await;
        sut.stop().await?;
        let run = run?;
        println!(
            "retries: {} rejected at once: rejected in {:.0} ms; intake {:.0}/s, {:.0} µs \
             service CPU a message (the AMQP ingress: {:.0}/s, {:.0} µs); backoffs granted \
             {:.0}–{:.0} ms, late past them p50 {:.0} p99 {:.0} max {:.0} ms; arrived over {:.1} s; \
             first retries waited {:.0}–{:.0} ms from their rejection (p50 {:.0}, p99 {:.0}) for \
             a backoff of {} ms with jitter {}; early {}, missing {}, duplicates {}",
            run.messages,
            run.rejected_in_ms,
            run.intake_per_sec,
            run.intake_cpu.service_us.unwrap_or(f64::NAN),
            run.ingress_per_sec,
            run.ingress_cpu.service_us.unwrap_or(f64::NAN),
            run.granted_min_ms,
            run.granted_max_ms,
            run.late_p50_ms,
            run.late_p99_ms,
            run.late_max_ms,
            run.arrivals_per_100ms.len() as f64 / 10.0,
            run.wait_min_ms,
            run.wait_max_ms,
            run.wait_p50_ms,
            run.wait_p99_ms,
            run.initial_ms,
            run.jitter,
            run.early,
            run.missing,
            run.duplicates
        );
        runs.push(run);
    }
    Ok(runs)
}

async fn one(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    messages: usize,
) -> anyhow::Result<RetriesRun> {
    let prefix = sut.cascade.prefix().to_owned();
    let queue = format!("{prefix}.{RETRIED_QUEUE}");
    sut.own_queue(&queue);
    let connection = connect(amqp_uri, "delayline-bench retries").await?;
    let channel = connection.create_channel().await?;
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type".into(), text("quorum"));
    arguments.insert(
        "x-dead-letter-exchange".into(),
        text(&format!("{prefix}.retry")),
    );
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue.as_str().into(), durable, arguments)
        .await?;
    publish_all(&channel, "", &queue, messages, None).await?;

    let meter = Meter::start(broker_pid(), sut.pid());
    let consumer = tokio::spawn(reject_then_ack(channel.clone(), queue, messages));
    let scheduled =
        wait_for_count(sut, "delayline_retry_messages_total", "scheduled", messages).await?;
    let intake_per_sec = messages as f64 / scheduled.as_secs_f64();
    let intake_cpu = meter.finish(messages as u64);
    let seen = consumer.await??;
    let (ingress_per_sec, ingress_cpu) = ingress_burst(sut, &channel, messages).await?;
    crate::load::close(&connection).await;
    Ok(summary(
        messages,
        seen,
        (intake_per_sec, intake_cpu),
        (ingress_per_sec, ingress_cpu),
    ))
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// `count` messages to `exchange` with `key`, confirmed, ids `r-0`…
pub(crate) async fn publish_all(
    channel: &lapin::Channel,
    exchange: &str,
    key: &str,
    count: usize,
    headers: Option<FieldTable>,
) -> anyhow::Result<()> {
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .ok();
    let mut pending = Vec::with_capacity(1000);
    for n in 0..count {
        let mut properties = BasicProperties::default()
            .with_message_id(format!("r-{n}").into())
            .with_delivery_mode(2);
        if let Some(headers) = &headers {
            properties = properties.with_headers(headers.clone());
        }
        let confirm = channel
            .basic_publish(
                exchange.into(),
                key.into(),
                BasicPublishOptions::default(),
                b"retry me",
                properties,
            )
            .await?;
        pending.push(confirm);
        if pending.len() == 1000 {
            for confirm in pending.drain(..) {
                confirm.await?;
            }
        }
    }
    for confirm in pending {
        confirm.await?;
    }
    Ok(())
}

/// What the consumer saw: each message's rejection and its first retry's
/// arrival (µs), each retry's granted wait and lateness past its
/// `x-deliver-at-ms` (ms), and the retries that came more than once.
struct Seen {
    rejected: HashMap<String, i64>,
    retried: HashMap<String, i64>,
    granted_ms: Vec<f64>,
    late_ms: Vec<f64>,
    duplicates: usize,
}

/// A header delayline writes on every delivery, as a number.
fn number(delivery: &lapin::message::Delivery, name: &str) -> Option<i64> {
    match delivery.properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongLongInt(n) => Some(*n),
        _ => None,
    }
}

/// Rejects every first delivery as fast as it comes, acks every retry,
/// until `count` retries arrived (or 3 minutes passed).
async fn reject_then_ack(
    channel: lapin::Channel,
    queue: String,
    count: usize,
) -> anyhow::Result<Seen> {
    channel.basic_qos(2_000, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "bench-worker".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut seen = Seen {
        rejected: HashMap::with_capacity(count),
        retried: HashMap::with_capacity(count),
        granted_ms: Vec::with_capacity(count),
        late_ms: Vec::with_capacity(count),
        duplicates: 0,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while seen.retried.len() < count {
        let Ok(Some(delivery)) = tokio::time::timeout_at(deadline, deliveries.next()).await else {
            break;
        };
        let delivery = delivery?;
        let at = now_us();
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|i| i.to_string())
            .unwrap_or_default();
        let attempt = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(ATTEMPT_HEADER).cloned());
        if attempt.is_none() {
            seen.rejected.insert(id, at);
            delivery
                .reject(BasicRejectOptions { requeue: false })
                .await?;
        } else {
            if seen.retried.insert(id, at).is_some() {
                seen.duplicates += 1;
            }
            if let (Some(granted), Some(due)) = (
                number(&delivery, "x-delay-ms"),
                number(&delivery, "x-deliver-at-ms"),
            ) {
                seen.granted_ms.push(granted as f64);
                seen.late_ms.push((at - due * 1000) as f64 / 1000.0);
            }
            delivery.ack(BasicAckOptions::default()).await?;
        }
    }
    Ok(seen)
}

/// Polls `metric{outcome}` (summed over its labels) every 20 ms until it
/// reaches `count`; how long that took.
async fn wait_for_count(
    sut: &ServiceUnderTest,
    metric: &str,
    outcome: &str,
    count: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        let text = scrape(&sut.base).await.unwrap_or_default();
        let total: f64 = text
            .lines()
            .filter(|l| l.starts_with(metric) && l.contains(&format!("outcome=\"{outcome}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if total >= count as f64 {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("{metric}{{outcome=\"{outcome}\"}} reached {total} of {count} in 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The same count published at once to the AMQP ingress with `x-delay`:
/// committed a second, and CPU a message.
async fn ingress_burst(
    sut: &ServiceUnderTest,
    channel: &lapin::Channel,
    count: usize,
) -> anyhow::Result<(f64, CpuPerTask)> {
    let Some(ingress) = &sut.ingress else {
        bail!("the service has no AMQP ingress");
    };
    let mut headers = FieldTable::default();
    headers.insert(
        "x-delay".into(),
        AMQPValue::LongLongInt(1000 * RETRY_INITIAL_S as i64),
    );
    let meter = Meter::start(broker_pid(), sut.pid());
    let started = Instant::now();
    publish_all(
        channel,
        &ingress.exchange,
        "retries-beside",
        count,
        Some(headers),
    )
    .await?;
    wait_for_count(sut, "delayline_ingress_messages_total", "accepted", count).await?;
    let elapsed = started.elapsed().as_secs_f64();
    Ok((count as f64 / elapsed, meter.finish(count as u64)))
}

fn summary(
    messages: usize,
    seen: Seen,
    (intake_per_sec, intake_cpu): (f64, CpuPerTask),
    (ingress_per_sec, ingress_cpu): (f64, CpuPerTask),
) -> RetriesRun {
    let initial_ms = 1000 * RETRY_INITIAL_S;
    let mut waits: Vec<f64> = seen
        .retried
        .iter()
        .filter_map(|(id, at)| Some((at - seen.rejected.get(id)?) as f64 / 1000.0))
        .collect();
    waits.sort_by(f64::total_cmp);
    let mut granted = seen.granted_ms.clone();
    granted.sort_by(f64::total_cmp);
    let mut late = seen.late_ms.clone();
    late.sort_by(f64::total_cmp);
    let rejections: Vec<i64> = seen.rejected.values().copied().collect();
    let rejected_in_ms = (rejections.iter().max().unwrap_or(&0)
        - rejections.iter().min().unwrap_or(&0)) as f64
        / 1000.0;
    let first = seen.retried.values().min().copied().unwrap_or(0);
    let mut arrivals_per_100ms: Vec<u64> = Vec::new();
    for at in seen.retried.values() {
        let bucket = ((at - first) / 100_000) as usize;
        if arrivals_per_100ms.len() <= bucket {
            arrivals_per_100ms.resize(bucket + 1, 0);
        }
        arrivals_per_100ms[bucket] += 1;
    }
    RetriesRun {
        messages,
        initial_ms,
        jitter: RETRY_JITTER,
        rejected_in_ms,
        intake_per_sec,
        intake_cpu,
        ingress_per_sec,
        ingress_cpu,
        wait_min_ms: waits.first().copied().unwrap_or(f64::NAN),
        wait_p50_ms: quantile(&waits, 0.5),
        wait_p99_ms: quantile(&waits, 0.99),
        wait_max_ms: waits.last().copied().unwrap_or(f64::NAN),
        granted_min_ms: granted.first().copied().unwrap_or(f64::NAN),
        granted_max_ms: granted.last().copied().unwrap_or(f64::NAN),
        late_p50_ms: quantile(&late, 0.5),
        late_p99_ms: quantile(&late, 0.99),
        late_max_ms: late.last().copied().unwrap_or(f64::NAN),
        arrivals_per_100ms,
        early: waits.iter().filter(|w| **w < initial_ms as f64).count()
            + late.iter().filter(|l| **l < 0.0).count(),
        missing: messages.saturating_sub(seen.retried.len()),
        duplicates: seen.duplicates,
    }
}
