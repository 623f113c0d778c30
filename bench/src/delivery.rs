//! Delivery: how close to the requested time tasks arrive, and how fast the
//! cascade drains a burst that falls due at once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use delayline::broker::connect;
use futures_util::StreamExt;
use indicatif::ProgressBar;
use lapin::types::FieldTable;
use serde::Serialize;
use tokio::sync::mpsc;

use delayline::testkit::{now_us, quantile};

use crate::arrivals::consume;

use crate::sut::ServiceUnderTest;

#[derive(Clone, Debug, Serialize)]
pub struct Precision {
    pub unit_ms: u64,
    pub queue_type: String,
    pub release_stage: bool,
    pub label: String,
    pub tasks: usize,
    pub received: usize,
    /// Tasks falling due per second over the window.
    pub due_per_sec: f64,
    /// Received before the requested time: must be 0.
    pub early: usize,
    /// Received before the `deliver_at` delayline answered: must be 0.
    pub early_vs_deliver_at: usize,
    /// Lateness relative to the requested time (send time + requested delay), ms.
    pub late_p50_ms: f64,
    pub late_p90_ms: f64,
    pub late_p99_ms: f64,
    pub late_max_ms: f64,
    /// Lateness relative to `deliver_at` (requested rounded up to the unit): the cascade's own delay.
    pub after_deliver_at_p50_ms: f64,
    pub after_deliver_at_p99_ms: f64,
    /// The hops the mix takes on this chain (the hold phase computes it).
    #[serde(default)]
    pub mean_hops: Option<f64>,
    /// The broker's floor measured alongside (steady runs): the bench's
    /// own publishes at set moments, under the same load.
    #[serde(default)]
    pub floor: Option<crate::floor::Floor>,
    #[serde(skip)]
    pub lateness_ms: Vec<f64>,
}

/// The delay of a precision run's `n`th task: a deterministic spread, a
/// prime stride making it look random to the unit.
pub fn spread_delay_ms(delays: Delays, n: usize) -> u64 {
    let span = delays.max_ms - delays.min_ms;
    delays.min_ms + (n as u64 * 104_729) % span.max(1)
}

/// Mean dead-letterings per task of a precision run's delays on `cascade`:
/// one per set digit of its delay in units (rounded as the chain routes).
pub fn mean_hops(delays: Delays, cascade: &delayline::cascade::Cascade) -> f64 {
    let hops: u64 = (0..delays.tasks)
        .map(|n| {
            let delay = Duration::from_millis(spread_delay_ms(delays, n));
            cascade
                .route(delay, "d")
                .map_or(0, |route| u64::from(route.delay_units.count_ones()))
        })
        .sum();
    hops as f64 / delays.tasks.max(1) as f64
}

struct Submitted {
    requested_due_us: i64,
    deliver_at_us: i64,
}

/// How many tasks a precision run submits, and the span of their delays.
#[derive(Clone, Copy, Debug)]
pub struct Delays {
    pub tasks: usize,
    pub min_ms: u64,
    pub max_ms: u64,
}

/// How a precision run's tasks are submitted.
#[derive(Clone, Copy, Debug)]
pub enum Intake<'a> {
    /// `POST /v1/tasks`.
    Http,
    /// Published to this AMQP ingress exchange with `x-delay`, as a
    /// producer of the delayed-message plugin does; its due time is taken
    /// as the publish's start plus the delay (there is no answer to read a
    /// `deliver_at` from).
    Ingress(&'a str),
}

/// Submits `delays.tasks` tasks with delays spread uniformly (to the
/// microsecond's millisecond, so most are not whole units) over
/// `delays.min_ms..delays.max_ms`, over HTTP.
pub async fn precision(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    label: &str,
    delays: Delays,
    progress: &ProgressBar,
) -> anyhow::Result<Precision> {
    precision_over(sut, amqp_uri, label, delays, Intake::Http, progress).await
}

/// One task published to an ingress exchange: its id and due times.
async fn publish_to_ingress(
    channel: &lapin::Channel,
    exchange: &str,
    destination: &str,
    id: String,
    delay_ms: u64,
) -> Option<(String, Submitted)> {
    let mut headers = FieldTable::default();
    headers.insert(
        "x-delay".into(),
        lapin::types::AMQPValue::LongLongInt(delay_ms as i64),
    );
    let properties = lapin::BasicProperties::default()
        .with_message_id(id.as_str().into())
        .with_delivery_mode(2)
        .with_headers(headers);
    let requested_due_us = now_us() + delay_ms as i64 * 1000;
    let confirm = channel
        .basic_publish(
            exchange.into(),
            destination.into(),
            lapin::options::BasicPublishOptions::default(),
            b"{}",
            properties,
        )
        .await
        .ok()?
        .await
        .ok()?;
    confirm.is_ack().then_some((
        id,
        Submitted {
            requested_due_us,
            deliver_at_us: requested_due_us,
        },
    ))
}

/// As [`precision`], the tasks submitted through `intake`.
pub async fn precision_over(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    label: &str,
    delays: Delays,
    intake: Intake<'_>,
    progress: &ProgressBar,
) -> anyhow::Result<Precision> {
    let Delays {
        tasks,
        min_ms: min_delay_ms,
        max_ms: max_delay_ms,
    } = delays;
    let destination = format!("precision-{label}");
    let mut arrivals = consume(sut, &destination, amqp_uri).await?;
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("{}/v1/tasks", sut.base);
    progress.set_length(tasks as u64);
    progress.set_position(0);
    progress.set_message(format!("{label}: submitting"));

    let span = max_delay_ms - min_delay_ms;
    let publisher = match intake {
        Intake::Http => None,
        Intake::Ingress(_) => {
            let connection = connect(amqp_uri, "delayline-bench plugin producer").await?;
            let channel = connection.create_channel().await?;
            channel
                .confirm_select(lapin::options::ConfirmSelectOptions::default())
                .await?;
            Some((connection, channel))
        }
    };
    let submissions = futures_util::stream::iter(0..tasks)
        .map(|n| {
            let publisher = publisher.as_ref().map(|(_, channel)| channel.clone());
            let client = client.clone();
            let url = url.clone();
            let destination = destination.clone();
            async move {
                let delay_ms = spread_delay_ms(delays, n);
                // The label keeps ids apart when one ledger is measured twice.
                let id = format!("{destination}-{n}");
                if let (Some(channel), Intake::Ingress(exchange)) = (publisher, intake) {
                    return publish_to_ingress(&channel, exchange, &destination, id, delay_ms)
                        .await;
                }
                let requested_due_us = now_us() + delay_ms as i64 * 1000;
                let body =
                    serde_json::json!({"destination": destination, "delay_ms": delay_ms, "id": id});
                let response = client.post(&url).json(&body).send().await.ok()?;
                if response.status() != 202 {
                    return None;
                }
                let accepted: serde_json::Value = response.json().await.ok()?;
                let deliver_at = accepted["deliver_at"].as_str()?;
                let deliver_at = time::OffsetDateTime::parse(
                    deliver_at,
                    &time::format_description::well_known::Rfc3339,
                )
                .ok()?;
                Some((
                    id,
                    Submitted {
                        requested_due_us,
                        deliver_at_us: (deliver_at.unix_timestamp_nanos() / 1000) as i64,
                    },
                ))
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let submitted: HashMap<String, Submitted> = submissions.into_iter().flatten().collect();
    if submitted.len() != tasks {
        bail!(
            "{} of {tasks} precision tasks were not accepted",
            tasks - submitted.len()
        );
    }
    let wait = Duration::from_millis(max_delay_ms) + Duration::from_secs(60);
    let due_per_sec = tasks as f64 / (span as f64 / 1000.0);
    let measured = Measured {
        label,
        submitted: &submitted,
        wait,
        due_per_sec,
    };
    Ok(measured.receive(sut, &mut arrivals, progress).await)
}

/// Tasks submitted for a precision run, to be received.
struct Measured<'a> {
    label: &'a str,
    submitted: &'a HashMap<String, Submitted>,
    /// The longest to wait for all of them.
    wait: Duration,
    due_per_sec: f64,
}

impl Measured<'_> {
    /// Receives every task once: how early and how late each was.
    async fn receive(
        self,
        sut: &ServiceUnderTest,
        arrivals: &mut mpsc::UnboundedReceiver<(String, i64)>,
        progress: &ProgressBar,
    ) -> Precision {
        let Measured {
            label,
            submitted,
            wait,
            due_per_sec,
        } = self;
        let tasks = submitted.len();
        progress.set_message(format!("{label}: waiting for deliveries"));

        let deadline = Instant::now() + wait;
        let (mut late, mut after_deliver_at) = (Vec::new(), Vec::new());
        let (mut early, mut early_vs_deliver_at) = (0, 0);
        let mut seen = std::collections::HashSet::new();
        while seen.len() < tasks {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let Ok(Some((id, at))) = tokio::time::timeout(remaining, arrivals.recv()).await else {
                break;
            };
            let Some(task) = submitted.get(&id) else {
                continue;
            };
            if !seen.insert(id) {
                continue;
            }
            progress.inc(1);
            if at < task.requested_due_us {
                early += 1;
            }
            if at < task.deliver_at_us {
                early_vs_deliver_at += 1;
            }
            late.push((at - task.requested_due_us) as f64 / 1000.0);
            after_deliver_at.push((at - task.deliver_at_us) as f64 / 1000.0);
        }
        late.sort_by(f64::total_cmp);
        after_deliver_at.sort_by(f64::total_cmp);
        Precision {
            unit_ms: sut.cascade.unit_ms(),
            queue_type: sut.cascade.queue_type().as_str().to_owned(),
            release_stage: sut.cascade.release_stage(),
            label: label.to_owned(),
            tasks,
            received: seen.len(),
            due_per_sec,
            early,
            early_vs_deliver_at,
            late_p50_ms: quantile(&late, 0.5),
            late_p90_ms: quantile(&late, 0.9),
            late_p99_ms: quantile(&late, 0.99),
            late_max_ms: late.last().copied().unwrap_or(f64::NAN),
            after_deliver_at_p50_ms: quantile(&after_deliver_at, 0.5),
            after_deliver_at_p99_ms: quantile(&after_deliver_at, 0.99),
            mean_hops: None,
            floor: None,
            lateness_ms: late,
        }
    }
}

/// A steady state at `rate` tasks/s: submitted at that rate for `seconds`
/// (in batches every 50 ms, open loop), each due 3-5 s after it is sent,
/// so that tasks fall due at that rate too, while others keep coming in.
/// Submitting them all first instead synchronises the levels: every task
/// with the same high digit expires at once, a burst no steady load makes.
/// The delays of a steady run's tasks.
#[derive(Clone, Copy, Debug)]
pub enum Mix {
    /// 3 to 5 s, spread to the millisecond.
    Spread,
    /// Whole seconds, as users most often ask (30 s, 1 min), in turn:
    /// delays whose set digits rounding down would keep. The bench sends a
    /// batch every 50 ms; a task gets the millisecond of the tick its own
    /// request would have come in (n % 50) on top, so that 1,000 requests
    /// a second fall due spread as they came, not 50 at one millisecond.
    Round(&'static [u64]),
}

impl Mix {
    fn delay_ms(self, n: usize) -> u64 {
        match self {
            Mix::Spread => 3_000 + (n as u64 * 104_729) % 2_000,
            Mix::Round(seconds) => seconds[n % seconds.len()] * 1_000 + (n % 50) as u64,
        }
    }

    /// When the first tasks fall due after they are sent.
    fn first_due(self) -> Duration {
        match self {
            Mix::Spread => Duration::from_secs(4),
            Mix::Round(seconds) => Duration::from_secs(seconds.iter().copied().min().unwrap_or(0)),
        }
    }

    fn longest(self) -> Duration {
        match self {
            Mix::Spread => Duration::from_secs(5),
            Mix::Round(seconds) => Duration::from_secs(seconds.iter().copied().max().unwrap_or(0)),
        }
    }
}

pub async fn steady(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    label: &str,
    rate: f64,
    seconds: f64,
    mix: Mix,
    progress: &ProgressBar,
) -> anyhow::Result<Precision> {
    const TICK: Duration = Duration::from_millis(50);
    let destination = format!("steady-{label}");
    let mut arrivals = consume(sut, &destination, amqp_uri).await?;
    // While the tasks fall due, a tenth as many publishes of the bench's
    // own at set moments.
    let floor_rate = (rate / 10.0).max(50.0);
    let probe =
        crate::floor::start(sut, amqp_uri, label, mix.first_due(), floor_rate, seconds).await?;
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("{}/v1/tasks/batch", sut.base);
    let tasks = (rate * seconds) as usize;
    progress.set_length(tasks as u64);
    progress.set_position(0);
    progress.set_message(format!("{label}: submitting at {rate}/s"));
    let mut ticker = tokio::time::interval(TICK);
    let mut sent = 0usize;
    let mut batches = Vec::new();
    let started = Instant::now();
    while sent < tasks {
        ticker.tick().await;
        // As many as the rate says by now: a late tick catches up.
        let due_by_now = ((started.elapsed().as_secs_f64() + TICK.as_secs_f64()) * rate) as usize;
        let batch: Vec<usize> = (sent..due_by_now.min(tasks)).collect();
        sent += batch.len();
        if batch.is_empty() {
            continue;
        }
        let client = client.clone();
        let url = url.clone();
        let destination = destination.clone();
        batches.push(tokio::spawn(async move {
            let delays: Vec<u64> = batch.iter().map(|&n| mix.delay_ms(n)).collect();
            let body: Vec<_> = batch
                .iter()
                .zip(&delays)
                .map(|(&n, delay_ms)| serde_json::json!({"destination": destination, "delay_ms": delay_ms, "id": format!("{destination}-{n}")}))
                .collect();
            let before_us = now_us();
            let response = client.post(&url).json(&serde_json::json!({"tasks": body})).send().await.ok()?;
            let answer: serde_json::Value = response.json().await.ok()?;
            let results = answer["results"].as_array()?.clone();
            let mut submitted = Vec::new();
            for (delay_ms, result) in delays.iter().zip(results) {
                let deliver_at = result["task"]["deliver_at"].as_str()?;
                let deliver_at = time::OffsetDateTime::parse(deliver_at, &time::format_description::well_known::Rfc3339).ok()?;
                let id = result["task"]["id"].as_str()?.to_owned();
                let task = Submitted {
                    // Sent no earlier than this: the requested time is no earlier.
                    requested_due_us: before_us + *delay_ms as i64 * 1000,
                    deliver_at_us: (deliver_at.unix_timestamp_nanos() / 1000) as i64,
                };
                submitted.push((id, task));
            }
            Some(submitted)
        }));
    }
    let mut submitted = HashMap::new();
    for batch in batches {
        submitted.extend(batch.await?.unwrap_or_default());
    }
    if submitted.len() != tasks {
        bail!(
            "{} of {tasks} steady tasks were not accepted",
            tasks - submitted.len()
        );
    }
    let wait = Duration::from_secs(65) + mix.longest();
    let measured = Measured {
        label,
        submitted: &submitted,
        wait,
        due_per_sec: rate,
    };
    let mut precision = measured.receive(sut, &mut arrivals, progress).await;
    precision.floor = Some(probe.finish(Duration::from_secs(10)).await?);
    Ok(precision)
}

#[derive(Clone, Debug, Serialize)]
pub struct Drain {
    /// Queue type, ledger and release stage.
    pub label: String,
    pub queue_type: String,
    pub release_stage: bool,
    pub tasks: usize,
    pub received: usize,
    /// From the common due time to the last arrival.
    pub drain_seconds: f64,
    pub due_tasks_per_sec: f64,
    pub first_arrival_after_due_ms: f64,
    /// Level queues a task of the burst passes (set digits of its delay in
    /// units, as its batch was sent), on average.
    pub mean_hops: f64,
    /// `due_tasks_per_sec × mean_hops`: the dead-letter rate the drain
    /// implies, counting every hop as if inside the drain window. The low
    /// levels' hops of all tasks do fall together just before the due time,
    /// the top levels' earlier, so this overstates the rate by a little.
    pub hops_per_sec: f64,
}

/// A burst of `tasks` tasks that all fall due at the same moment, entering at
/// different levels (their delays differ by when they were submitted).
pub async fn burst(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    label: &str,
    tasks: usize,
    progress: &ProgressBar,
) -> anyhow::Result<Drain> {
    let mut arrivals = consume(sut, "burst", amqp_uri).await?;
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("{}/v1/tasks/batch", sut.base);
    // Submission runs at several thousand tasks/s; leave room for it before the due time.
    let due_us = now_us() + 3_000_000 + tasks as i64 * 400;
    let due_at = delayline::clock::format_epoch_ms((due_us / 1000) as u64);
    progress.set_length(tasks as u64);
    progress.set_position(0);
    progress.set_message("burst: submitting");
    let batches: Vec<_> = (0..tasks)
        .collect::<Vec<_>>()
        .chunks(500)
        .map(|chunk| {
            let tasks: Vec<_> = chunk
                .iter()
                .map(|n| serde_json::json!({"destination": "burst", "deliver_at": due_at, "id": format!("b{n}")}))
                .collect();
            serde_json::json!({ "tasks": tasks })
        })
        .collect();
    let unit_us = sut.cascade.unit_ms() as i64 * 1000;
    let holds = sut.cascade.holds();
    let (accepted, hops): (usize, u64) = futures_util::stream::iter(batches)
        .map(|batch| {
            let client = client.clone();
            let url = url.clone();
            async move {
                // Rounded up, or down where the release stage holds the rest.
                let remaining_us = (due_us - now_us()).max(0) as u64;
                let units = if holds {
                    remaining_us / unit_us as u64
                } else {
                    remaining_us.div_ceil(unit_us as u64)
                };
                let Ok(response) = client.post(&url).json(&batch).send().await else {
                    return (0, 0);
                };
                let accepted = response
                    .text()
                    .await
                    .unwrap_or_default()
                    .matches("\"status\":202")
                    .count();
                (accepted, accepted as u64 * u64::from(units.count_ones()))
            }
        })
        .buffer_unordered(4)
        .fold(
            (0, 0),
            |(sum, hops), (n, h)| async move { (sum + n, hops + h) },
        )
        .await;
    if accepted != tasks {
        bail!(
            "{} of {tasks} burst tasks were not accepted",
            tasks - accepted
        );
    }
    if now_us() > due_us {
        bail!(
            "submitting the burst took longer than planned; the tasks were due before all were sent"
        );
    }
    progress.set_message("burst: draining");
    let deadline = Instant::now() + Duration::from_secs(300);
    let (mut first, mut last, mut received) = (i64::MAX, 0, 0);
    while received < tasks {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let Ok(Some((_, at))) = tokio::time::timeout(remaining, arrivals.recv()).await else {
            break;
        };
        first = first.min(at);
        last = last.max(at);
        received += 1;
        progress.inc(1);
    }
    let drain_seconds = (last - due_us) as f64 / 1e6;
    let due_tasks_per_sec = received as f64 / drain_seconds;
    let mean_hops = hops as f64 / accepted.max(1) as f64;
    Ok(Drain {
        label: label.to_owned(),
        queue_type: sut.cascade.queue_type().as_str().to_owned(),
        release_stage: sut.cascade.release_stage(),
        tasks,
        received,
        drain_seconds,
        due_tasks_per_sec,
        first_arrival_after_due_ms: (first - due_us) as f64 / 1000.0,
        mean_hops,
        hops_per_sec: due_tasks_per_sec * mean_hops,
    })
}
