//! Parked messages replayed by group (issue 79): N messages parked at once
//! (each published to a queue that dead-letters to the retry exchange and
//! rejected by a consumer; the queue's policy parks after one attempt), then
//! listed by group and replayed group by group, on the default
//! configuration (one node, SQLite). Measured: how fast the retry intake
//! parks them, how long `GET /v1/parked/groups` takes over N, how long the
//! replays take (`POST /v1/parked/bulk` a group at a time, called again
//! while it says more was left), and how fast the replayed messages arrive
//! back in their queue; missing and duplicated.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use indicatif::ProgressBar;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use serde::Serialize;
use serde_json::{Value, json};

use delayline::broker::connect;

use crate::sut::{PARKED_QUEUE, ServiceUnderTest, Setup, Store};

#[derive(Clone, Debug, Serialize)]
pub struct ParkedRun {
    pub messages: usize,
    /// From the first publish until all were parked.
    pub parked_in_ms: f64,
    pub parked_per_sec: f64,
    /// `GET /v1/parked/groups` over all of them: the slowest of five reads.
    pub groups_read_ms: f64,
    pub groups: usize,
    /// The replays, group by group, until each answered nothing left.
    pub replay_calls_ms: f64,
    pub replay_calls: usize,
    /// From the first replay call until the last message was back.
    pub replayed_in_ms: f64,
    pub replayed_per_sec: f64,
    pub missing: usize,
    pub duplicates: usize,
}

pub async fn phase(
    amqp_uri: &str,
    channels: usize,
    sizes: &[usize],
    progress: &ProgressBar,
) -> anyhow::Result<Vec<ParkedRun>> {
    let mut runs = Vec::new();
    for &messages in sizes {
        progress.set_message(format!("parked: {messages} parked, replayed by group"));
        let setup = Setup::default_with(Store::Sqlite);
        let mut sut = ServiceUnderTest::spawn(amqp_uri, channels, &setup).await?;
        let run = one(&mut sut, amqp_uri, messages, progress).await;
        sut.stop().await?;
        let run = run?;
        println!(
            "parked: {} parked in {:.0} ms ({:.0}/s); groups read in {:.0} ms ({} groups); \
             replayed by group in {} calls taking {:.0} ms, all back in {:.0} ms ({:.0}/s); \
             missing {}, duplicates {}",
            run.messages,
            run.parked_in_ms,
            run.parked_per_sec,
            run.groups_read_ms,
            run.groups,
            run.replay_calls,
            run.replay_calls_ms,
            run.replayed_in_ms,
            run.replayed_per_sec,
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
    progress: &ProgressBar,
) -> anyhow::Result<ParkedRun> {
    let prefix = sut.cascade.prefix().to_owned();
    let queue = format!("{prefix}.{PARKED_QUEUE}");
    sut.own_queue(&queue);
    let connection = connect(amqp_uri, "delayline-bench parked").await?;
    let channel = connection.create_channel().await?;
    let mut arguments = FieldTable::default();
    let exchange = format!("{prefix}.retry");
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(LongString::from(exchange)),
    );
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue.as_str().into(), durable, arguments)
        .await?;
    let http = reqwest::Client::new();
    let started = Instant::now();
    let rejecting = tokio::spawn(settle(amqp_uri.to_owned(), queue.clone(), messages, false));
    crate::retries::publish_all(&channel, "", &queue, messages, None).await?;
    rejecting.await??;
    let groups = wait_parked(&http, &sut.base, messages, progress).await?;
    let parked_in = started.elapsed();
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let read = Instant::now();
        get(&http, &sut.base, "/v1/parked/groups").await?;
        slowest = slowest.max(read.elapsed());
    }
    let arrived = tokio::spawn(settle(amqp_uri.to_owned(), queue.clone(), messages, true));
    let replaying = Instant::now();
    let (calls, calls_took) = replay_groups(&http, &sut.base, &groups).await?;
    let (seen, duplicates) = arrived.await??;
    let replayed_in = replaying.elapsed();
    let _ = connection.close(200, "done".into()).await;
    Ok(ParkedRun {
        messages,
        parked_in_ms: parked_in.as_secs_f64() * 1e3,
        parked_per_sec: messages as f64 / parked_in.as_secs_f64(),
        groups_read_ms: slowest.as_secs_f64() * 1e3,
        groups: groups.len(),
        replay_calls_ms: calls_took.as_secs_f64() * 1e3,
        replay_calls: calls,
        replayed_in_ms: replayed_in.as_secs_f64() * 1e3,
        replayed_per_sec: seen as f64 / replayed_in.as_secs_f64(),
        missing: messages.saturating_sub(seen),
        duplicates,
    })
}

async fn get(http: &reqwest::Client, base: &str, path: &str) -> anyhow::Result<Value> {
    Ok(http
        .get(format!("{base}{path}"))
        .send()
        .await?
        .json()
        .await?)
}

/// The groups once they hold `count` messages in all (within ten minutes).
async fn wait_parked(
    http: &reqwest::Client,
    base: &str,
    count: usize,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<Value>> {
    let until = Instant::now() + Duration::from_secs(600);
    loop {
        let answer = get(http, base, "/v1/parked/groups").await?;
        let groups = answer["groups"].as_array().cloned().unwrap_or_default();
        let parked: u64 = groups.iter().filter_map(|g| g["parked"].as_u64()).sum();
        progress.set_message(format!("parked: {parked} of {count} parked"));
        if parked as usize >= count {
            return Ok(groups);
        }
        anyhow::ensure!(Instant::now() < until, "only {parked} of {count} parked");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Each group replayed by its filter, called again while a call leaves
/// some (a request cut by the service's timeout, or matches it did not
/// reach): how many calls, and how long they took in all.
async fn replay_groups(
    http: &reqwest::Client,
    base: &str,
    groups: &[Value],
) -> anyhow::Result<(usize, Duration)> {
    let started = Instant::now();
    let mut calls = 0;
    for group in groups {
        let filter = json!({"queue": group["queue"], "reason": group["reason"],
                            "first_failed_hour": group["first_failed_hour"]});
        let body = json!({"filter": filter, "action": "replay"});
        loop {
            calls += 1;
            let response = http
                .post(format!("{base}/v1/parked/bulk"))
                .json(&body)
                .send()
                .await?;
            let done: Value = response.json().await.unwrap_or(Value::Null);
            if done["matched"].as_u64() == Some(0) {
                break;
            }
            anyhow::ensure!(calls < 10_000, "the replays never ended: {done}");
        }
    }
    Ok((calls, started.elapsed()))
}

/// Consumes `queue` until `count` distinct messages arrived (or none for
/// 30 s), acking each (`ack`) or rejecting it to the retry exchange: how
/// many did, and how many came twice.
async fn settle(
    uri: String,
    queue: String,
    count: usize,
    ack: bool,
) -> anyhow::Result<(usize, usize)> {
    let connection = connect(&uri, "delayline-bench parked consumer").await?;
    let channel = connection.create_channel().await?;
    channel.basic_qos(1000, BasicQosOptions::default()).await?;
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut seen = HashSet::with_capacity(count);
    let mut duplicates = 0;
    while seen.len() < count {
        let next = tokio::time::timeout(Duration::from_secs(30), consumer.next()).await;
        let Ok(Some(Ok(delivery))) = next else { break };
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned())
            .unwrap_or_default();
        if !seen.insert(id) {
            duplicates += 1;
        }
        if ack {
            delivery.ack(BasicAckOptions::default()).await?;
        } else {
            let reject = BasicRejectOptions { requeue: false };
            delivery.reject(reject).await?;
        }
    }
    let _ = connection.close(200, "done".into()).await;
    Ok((seen.len(), duplicates))
}
