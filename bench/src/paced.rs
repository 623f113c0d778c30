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
    /// The limit's burst, when the run set one.
    pub burst: Option<u64>,
    /// `"cascade"`: the tasks reach the limit as the cascade lets them fall
    /// due (all due at one instant); `"ledger"`: they all wait in the ledger
    /// first (the limit paused, then resumed), so the limiter alone sets the
    /// pace; `"unlimited"`: the cascade's burst with no limit at all, the
    /// machine's ceiling for this path (`configured_per_sec` is then the
    /// rate the burst was sized for).
    pub source: &'static str,
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
    /// `None`: no limit, the machine's ceiling for the drain.
    pub configured_per_sec: Option<f64>,
    /// From the restart (connected) to the first arrival.
    pub first_after_restart_ms: f64,
    /// Over the middle 80 % of the arrivals.
    pub achieved_per_sec: f64,
    pub ratio: Option<f64>,
    pub drain_seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Limits {
    pub paced: Vec<Paced>,
    pub beside: Option<Beside>,
    pub outage: Option<Outage>,
    /// The same drain with no limit: what the machine does without one.
    pub outage_unlimited: Option<Outage>,
}

/// The steps of the phase (`--limits-steps`): `paced` (each rate, the
/// tasks all due at once), `ledger` (each rate, from tasks all waiting),
/// `ceiling` (the top rate's burst with no limit), `beside`, `outage`
/// (at the top rate, then with no limit).
pub const STEPS: [&str; 5] = ["paced", "ledger", "ceiling", "beside", "outage"];

/// How the phase runs (`--limits-*`).
pub struct Options<'a> {
    pub quick: bool,
    /// Only these steps ([`STEPS`]); all when empty.
    pub steps: &'a [String],
    /// The paced rates; 100, 1,000 and 5,000/s when empty (not 5,000 with
    /// `quick`).
    pub rates: &'a [f64],
    /// Each limit's burst as seconds of its rate; the service's default
    /// (a tenth of a second) when `None`.
    pub burst_secs: Option<f64>,
}

pub async fn phase(
    amqp_uri: &str,
    channels: usize,
    options: &Options<'_>,
    progress: &ProgressBar,
) -> anyhow::Result<Limits> {
    let (quick, steps) = (options.quick, options.steps);
    let step = |name: &str| steps.is_empty() || steps.iter().any(|s| s == name);
    let mut sut =
        ServiceUnderTest::spawn(amqp_uri, channels, &Setup::default_with(Store::Sqlite)).await?;
    let rates: &[f64] = match (options.rates, quick) {
        ([], true) => &[100.0, 1_000.0],
        ([], false) => &[100.0, 1_000.0, 5_000.0],
        (rates, _) => rates,
    };
    let top = rates[rates.len() - 1];
    let burst = |rate: f64| options.burst_secs.map(|secs| (rate * secs).ceil() as u64);
    let mut paced = Vec::new();
    for &rate in rates.iter().filter(|_| step("paced")) {
        progress.set_message(format!("limits: paced at {rate}/s"));
        paced.push(pace(&mut sut, amqp_uri, rate, burst(rate), Source::Cascade).await?);
    }
    for &rate in rates.iter().filter(|_| step("ledger")) {
        progress.set_message(format!("limits: paced at {rate}/s from the ledger"));
        paced.push(pace(&mut sut, amqp_uri, rate, burst(rate), Source::Ledger).await?);
    }
    if step("ceiling") {
        // In a service of its own: one that took a level over in the paced
        // steps (a probe overtaken while the burst kept the level's
        // dead-letter worker behind) would still drain it itself, faster
        // than the broker, and the ceiling would not be the paced steps'.
        sut.stop().await?;
        let setup = Setup::default_with(Store::Sqlite);
        sut = ServiceUnderTest::spawn(amqp_uri, channels, &setup).await?;
        progress.set_message(format!("limits: the {top}/s burst with no limit"));
        paced.push(pace(&mut sut, amqp_uri, top, None, Source::Unlimited).await?);
    }
    let waiting = if quick { 10_000 } else { 100_000 };
    let beside = if step("beside") {
        progress.set_message("limits: beside waiting tasks");
        Some(beside(&mut sut, amqp_uri, waiting, progress).await?)
    } else {
        None
    };
    let (mut outage_limited, mut outage_unlimited) = (None, None);
    if step("outage") {
        progress.set_message("limits: the drain after an outage");
        let limit = Some((top, burst(top)));
        outage_limited = Some(outage(&mut sut, amqp_uri, waiting, limit).await?);
        progress.set_message("limits: the drain after an outage, no limit");
        outage_unlimited = Some(outage(&mut sut, amqp_uri, waiting, None).await?);
    }
    sut.stop().await?;
    Ok(Limits {
        paced,
        beside,
        outage: outage_limited,
        outage_unlimited,
    })
}

/// The cascade's burst of `rate` × 12 s of tasks, all due at one instant,
/// with no limit: the rate they fall due at over 10 s of it.
pub async fn unlimited_burst(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    rate: f64,
) -> anyhow::Result<Paced> {
    pace(sut, amqp_uri, rate, None, Source::Unlimited).await
}

/// Where a paced run's tasks come from (see [`Paced::source`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Cascade,
    Ledger,
    Unlimited,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Cascade => "cascade",
            Source::Ledger => "ledger",
            Source::Unlimited => "unlimited",
        }
    }
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
async fn pace(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    rate: f64,
    burst: Option<u64>,
    source: Source,
) -> anyhow::Result<Paced> {
    let destination = format!("paced{}-{}", rate as u64, source.name());
    let mut receiver = consume(sut, &destination, amqp_uri).await?;
    let mut limit = json!({"destinations": destination, "rate_per_sec": rate});
    if let Some(burst) = burst {
        limit["burst"] = json!(burst);
    }
    if source == Source::Ledger {
        limit["paused"] = json!(true);
    }
    if source != Source::Unlimited {
        put_limit(sut, &destination, limit).await?;
    }
    let tasks = (rate * 12.0) as usize;
    let due_ms = (now_us() / 1000) as u64 + 3_000 + tasks as u64 / 3;
    submit_due(std::slice::from_ref(&sut.base), &destination, tasks, due_ms).await?;
    if source == Source::Ledger {
        all_waiting(sut, &destination, tasks).await?;
        let response = reqwest::Client::new()
            .post(format!("{}/v1/limits/{destination}/resume", sut.base))
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("resuming {destination}: {}", response.status());
        }
    }
    let got = arrivals(&mut receiver, tasks, Duration::from_secs(30)).await;
    if got.len() < tasks {
        bail!("{destination}: {} of {tasks} arrived", got.len());
    }
    if source != Source::Unlimited {
        delete_limit(sut, &destination).await?;
    }
    let first = got.iter().map(|(_, at)| *at).min().unwrap_or(0);
    let (from, to) = (first + 1_000_000, first + 11_000_000);
    let counted = got.iter().filter(|(_, at)| (from..to).contains(at)).count();
    let achieved = counted as f64 / 10.0;
    Ok(Paced {
        burst,
        source: source.name(),
        configured_per_sec: rate,
        tasks,
        achieved_per_sec: achieved,
        ratio: achieved / rate,
    })
}

/// Waits until the limit `name` holds `count` tasks waiting (120 s at most).
async fn all_waiting(sut: &ServiceUnderTest, name: &str, count: usize) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let limit: serde_json::Value = http
            .get(format!("{}/v1/limits/{name}", sut.base))
            .send()
            .await?
            .json()
            .await?;
        if limit["waiting"].as_u64().unwrap_or(0) >= count as u64 {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the tasks of {name} did not all wait within 120 s: {limit}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn delete_limit(sut: &ServiceUnderTest, name: &str) -> anyhow::Result<()> {
    let response = reqwest::Client::new()
        .delete(format!("{}/v1/limits/{name}", sut.base))
        .send()
        .await
        .with_context(|| format!("deleting the limit {name}"))?;
    if !response.status().is_success() {
        bail!("DELETE /v1/limits/{name}: {}", response.status());
    }
    Ok(())
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
    all_waiting(sut, "held", waiting).await?;
    progress.set_message("limits: an unlimited destination beside them");
    let beside = steady_lateness(sut, &mut receiver, "beside").await?;
    delete_limit(sut, "held").await?;
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

/// `tasks` due while the service is stopped, drained after its restart
/// at `rate` (or with no limit).
async fn outage(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    tasks: usize,
    limit: Option<(f64, Option<u64>)>,
) -> anyhow::Result<Outage> {
    let rate = limit.map(|(rate, _)| rate);
    let destination = match rate {
        Some(rate) => format!("outage{}", rate as u64),
        None => "outage-unlimited".to_owned(),
    };
    let mut receiver = consume(sut, &destination, amqp_uri).await?;
    if let Some((rate, burst)) = limit {
        let mut limit = json!({"destinations": destination, "rate_per_sec": rate});
        if let Some(burst) = burst {
            limit["burst"] = json!(burst);
        }
        put_limit(sut, &destination, limit).await?;
    }
    let due_ms = (now_us() / 1000) as u64 + 5_000 + tasks as u64 / 3;
    submit_due(std::slice::from_ref(&sut.base), &destination, tasks, due_ms).await?;
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
        bail!("{destination}: {} of {tasks} arrived", at.len());
    }
    if rate.is_some() {
        delete_limit(sut, &destination).await?;
    }
    at.sort_unstable();
    let (low, high) = (at[tasks / 10], at[tasks * 9 / 10]);
    let achieved = (tasks * 8 / 10) as f64 / ((high - low) as f64 / 1e6);
    Ok(Outage {
        tasks,
        configured_per_sec: rate,
        first_after_restart_ms: (at[0] - restarted) as f64 / 1000.0,
        achieved_per_sec: achieved,
        ratio: rate.map(|rate| achieved / rate),
        drain_seconds: (at[tasks - 1] - at[0]) as f64 / 1e6,
    })
}
