//! Release limits under load, on the default chain with the SQLite ledger:
//! the rate a paced destination achieves against the one set; how late an
//! unlimited destination runs while another has many tasks waiting, against
//! the same without them; and the drain after an outage, at the rate set.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, bail};
use indicatif::ProgressBar;
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;

use delayline::testkit::{now_us, quantile};

use crate::arrivals::consume;
use crate::load::submit_due;
use crate::sut::{ServiceUnderTest, Setup, Store};

/// A paced destination: what was set and what arrived.
#[derive(Clone, Debug, Serialize)]
pub struct Paced {
    pub configured_per_sec: f64,
    pub tasks: usize,
    /// Arrivals a second over 10 s of the steady release (from 1 s after
    /// the first arrival: the burst is outside it).
    pub achieved_per_sec: f64,
    /// `achieved / configured`.
    pub ratio: f64,
}

/// An unlimited destination's lateness (ms), alone and beside `waiting`
/// tasks held by a paused limit.
#[derive(Clone, Debug, Serialize)]
pub struct Beside {
    pub waiting: u64,
    pub rate_per_sec: f64,
    pub alone_p50_ms: f64,
    pub alone_p99_ms: f64,
    pub alone_max_ms: f64,
    pub beside_p50_ms: f64,
    pub beside_p99_ms: f64,
    pub beside_max_ms: f64,
}

/// Tasks due while the service was down, released after its restart.
#[derive(Clone, Debug, Serialize)]
pub struct Outage {
    pub tasks: usize,
    pub configured_per_sec: f64,
    /// From the restart (connected) to the first arrival.
    pub first_after_restart_ms: f64,
    /// Over the middle 80 % of the arrivals.
    pub achieved_per_sec: f64,
    pub ratio: f64,
    pub drain_seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Limits {
    pub paced: Vec<Paced>,
    pub beside: Option<Beside>,
    pub outage: Option<Outage>,
}

pub async fn phase(
    amqp_uri: &str,
    channels: usize,
    quick: bool,
    progress: &ProgressBar,
) -> anyhow::Result<Limits> {
    let mut sut =
        ServiceUnderTest::spawn(amqp_uri, channels, &Setup::default_with(Store::Sqlite)).await?;
    let rates: &[f64] = if quick {
        &[100.0, 1_000.0]
    } else {
        &[100.0, 1_000.0, 5_000.0]
    };
    let mut paced = Vec::new();
    for &rate in rates {
        progress.set_message(format!("limits: paced at {rate}/s"));
        paced.push(pace(&mut sut, amqp_uri, rate).await?);
    }
    progress.set_message("limits: beside waiting tasks");
    let waiting = if quick { 10_000 } else { 100_000 };
    let beside = beside(&mut sut, amqp_uri, waiting, progress).await?;
    progress.set_message("limits: the drain after an outage");
    let outage = outage(
        &mut sut,
        amqp_uri,
        waiting,
        if quick { 1_000.0 } else { 5_000.0 },
    )
    .await?;
    sut.stop().await?;
    Ok(Limits {
        paced,
        beside: Some(beside),
        outage: Some(outage),
    })
}

async fn put_limit(
    sut: &ServiceUnderTest,
    name: &str,
    body: serde_json::Value,
) -> anyhow::Result<()> {
    let response = reqwest::Client::new()
        .put(format!("{}/v1/limits/{name}", sut.base))
        .json(&body)
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("PUT /v1/limits/{name}: {}", response.text().await?);
    }
    Ok(())
}

/// Arrival instants (µs) of `count` tasks, each within `wait` of the last.
async fn arrivals(
    receiver: &mut mpsc::UnboundedReceiver<(String, i64)>,
    count: usize,
    wait: Duration,
) -> Vec<(String, i64)> {
    let mut got = Vec::with_capacity(count);
    while got.len() < count {
        match tokio::time::timeout(wait, receiver.recv()).await {
            Ok(Some(arrival)) => got.push(arrival),
            _ => break,
        }
    }
    got
}

/// 12 s of tasks at `rate`, all due at once: the rate over 10 s of it.
async fn pace(sut: &mut ServiceUnderTest, amqp_uri: &str, rate: f64) -> anyhow::Result<Paced> {
    let destination = format!("paced{}", rate as u64);
    let mut receiver = consume(sut, &destination, amqp_uri).await?;
    put_limit(
        sut,
        &destination,
        json!({"destinations": destination, "rate_per_sec": rate}),
    )
    .await?;
    let tasks = (rate * 12.0) as usize;
    let due_ms = (now_us() / 1000) as u64 + 3_000 + tasks as u64 / 3;
    submit_due(std::slice::from_ref(&sut.base), &destination, tasks, due_ms).await?;
    let got = arrivals(&mut receiver, tasks, Duration::from_secs(30)).await;
    if got.len() < tasks {
        bail!("{destination}: {} of {tasks} arrived", got.len());
    }
    let first = got.iter().map(|(_, at)| *at).min().unwrap_or(0);
    let (from, to) = (first + 1_000_000, first + 11_000_000);
    let counted = got.iter().filter(|(_, at)| (from..to).contains(at)).count();
    let achieved = counted as f64 / 10.0;
    Ok(Paced {
        configured_per_sec: rate,
        tasks,
        achieved_per_sec: achieved,
        ratio: achieved / rate,
    })
}

/// Lateness (ms) of 10 s of tasks at 200/s due 2 s after submission, each
/// submitted alone.
async fn steady_lateness(
    sut: &ServiceUnderTest,
    receiver: &mut mpsc::UnboundedReceiver<(String, i64)>,
    tag: &str,
) -> anyhow::Result<Vec<f64>> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("{}/v1/tasks", sut.base);
    let mut due: HashMap<String, i64> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    for n in 0..2_000 {
        tick.tick().await;
        let id = format!("{tag}-{n}");
        let at_ms = (now_us() / 1000) as u64 + 2_000;
        let body = json!({"destination": "free", "deliver_at": delayline::clock::format_epoch_ms(at_ms), "id": id});
        let response = client.post(&url).json(&body).send().await?;
        if response.status() != 202 {
            bail!("a steady task was refused: {}", response.text().await?);
        }
        due.insert(id, at_ms as i64 * 1000);
    }
    let got = arrivals(receiver, due.len(), Duration::from_secs(30)).await;
    let mut late: Vec<f64> = got
        .iter()
        .filter_map(|(id, at)| Some((at - due.get(id)?) as f64 / 1000.0))
        .collect();
    if late.len() < due.len() {
        bail!("{tag}: {} of {} arrived", late.len(), due.len());
    }
    late.sort_by(f64::total_cmp);
    Ok(late)
}

async fn beside(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    waiting: usize,
    progress: &ProgressBar,
) -> anyhow::Result<Beside> {
    let mut receiver = consume(sut, "free", amqp_uri).await?;
    let alone = steady_lateness(sut, &mut receiver, "alone").await?;
    // Where the held tasks go once their limit is deleted.
    let mut sink = consume(sut, "held", amqp_uri).await?;
    put_limit(sut, "held", json!({"destinations": "held", "paused": true})).await?;
    progress.set_message(format!("limits: {waiting} tasks held by a paused limit"));
    let due_ms = (now_us() / 1000) as u64 + 3_000 + waiting as u64 / 3;
    submit_due(std::slice::from_ref(&sut.base), "held", waiting, due_ms).await?;
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let limit: serde_json::Value = http
            .get(format!("{}/v1/limits/held", sut.base))
            .send()
            .await?
            .json()
            .await?;
        if limit["waiting"].as_u64().unwrap_or(0) >= waiting as u64 {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the held tasks did not all wait within 120 s: {limit}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    progress.set_message("limits: an unlimited destination beside them");
    let beside = steady_lateness(sut, &mut receiver, "beside").await?;
    let response = http
        .delete(format!("{}/v1/limits/held", sut.base))
        .send()
        .await
        .context("deleting the paused limit")?;
    if !response.status().is_success() {
        bail!("DELETE /v1/limits/held: {}", response.status());
    }
    // Released now, unlimited: all of them delivered before the next phase
    // (the outage's restart found tens of thousands still waiting, and its
    // first arrival came after them).
    progress.set_message(format!("limits: the {waiting} held tasks released"));
    let released = arrivals(&mut sink, waiting, Duration::from_secs(180)).await;
    if released.len() < waiting {
        bail!(
            "{} of the {waiting} held tasks arrived once released",
            released.len()
        );
    }
    Ok(Beside {
        waiting: waiting as u64,
        rate_per_sec: 200.0,
        alone_p50_ms: quantile(&alone, 0.5),
        alone_p99_ms: quantile(&alone, 0.99),
        alone_max_ms: alone.last().copied().unwrap_or(0.0),
        beside_p50_ms: quantile(&beside, 0.5),
        beside_p99_ms: quantile(&beside, 0.99),
        beside_max_ms: beside.last().copied().unwrap_or(0.0),
    })
}

async fn outage(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    tasks: usize,
    rate: f64,
) -> anyhow::Result<Outage> {
    let mut receiver = consume(sut, "outage", amqp_uri).await?;
    put_limit(
        sut,
        "outage",
        json!({"destinations": "outage", "rate_per_sec": rate}),
    )
    .await?;
    let due_ms = (now_us() / 1000) as u64 + 5_000 + tasks as u64 / 3;
    submit_due(std::slice::from_ref(&sut.base), "outage", tasks, due_ms).await?;
    sut.halt().await?;
    let wait_ms = (due_ms + 3_000).saturating_sub((now_us() / 1000) as u64);
    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    sut.relaunch().await?;
    let restarted = now_us();
    let wait = Duration::from_secs(30);
    let mut at: Vec<i64> = arrivals(&mut receiver, tasks, wait)
        .await
        .into_iter()
        .map(|(_, at)| at)
        .collect();
    if at.len() < tasks {
        bail!("outage: {} of {tasks} arrived", at.len());
    }
    at.sort_unstable();
    let (low, high) = (at[tasks / 10], at[tasks * 9 / 10]);
    let achieved = (tasks * 8 / 10) as f64 / ((high - low) as f64 / 1e6);
    Ok(Outage {
        tasks,
        configured_per_sec: rate,
        first_after_restart_ms: (at[0] - restarted) as f64 / 1000.0,
        achieved_per_sec: achieved,
        ratio: achieved / rate,
        drain_seconds: (at[tasks - 1] - at[0]) as f64 / 1e6,
    })
}
