//! Schedules at scale (issue 71): N schedules firing at one instant, on the
//! default configuration (one node, SQLite). Each schedule fires once, at
//! a whole minute chosen before they are created, far enough ahead for all
//! to be created and for the planner's lead (and the crowd's) beyond that.
//! Measured from the instant: when the planner had made every occurrence a
//! task (the `created` occurrences counted by `/metrics`, polled every
//! 100 ms), when the first and the last occurrence arrived, lateness p50
//! and p99; the service's CPU while planning, per schedule; early, missing
//! and duplicated. With `--instant-made-s S`, the creating starts so that
//! the last schedule is made only about S s before the instant: what a user
//! who makes many schedules just before their instant gets.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::StreamExt;
use indicatif::ProgressBar;
use serde::Serialize;

use delayline::clock::format_epoch_ms;
use delayline::testkit::{now_us, quantile};

use crate::arrivals::consume;
use crate::burst::{arrivals, scrape};
use crate::sut::{ServiceUnderTest, Setup, Store};

/// Concurrent requests while creating the schedules.
const CREATING: usize = 64;
/// Schedules created a second, at least, when the instant is chosen (the
/// schedules phase measured 1,626).
const CREATE_RATE: u64 = 1_200;
/// The planner's lead (`schedules.lead_ms`, 30 s by default) and a margin.
const LEAD_AND_MARGIN_S: u64 = 35;
/// Occurrences a second the planner is counted on (`schedules.plan_rate`,
/// 2,500 by default): the instant leaves the planner that long beyond the
/// lead after the last schedule is created.
const PLAN_RATE: u64 = 2_500;
/// Schedules created a second as measured (3,624 in record 49, 2,394 in
/// record 52), when they are to be made only seconds before their instant.
const MADE_LATE_CREATE_RATE: u64 = 2_400;

#[derive(Clone, Debug, Serialize)]
pub struct InstantRun {
    pub schedules: usize,
    pub created_per_sec: f64,
    /// From the last schedule's creation to the instant.
    pub ahead_s: f64,
    /// When the planner had made the last occurrence a task, from the
    /// instant (negative: before it).
    pub planned_ms: f64,
    pub first_ms: f64,
    pub last_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Service CPU (user + system) from the first occurrence made a task to
    /// the last (polled every 100 ms), per occurrence made meanwhile.
    pub planning_cpu_us_per_schedule: f64,
    pub early: usize,
    pub missing: usize,
    pub duplicates: usize,
}

pub async fn phase(
    amqp_uri: &str,
    channels: usize,
    sizes: &[usize],
    made_s: u64,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<InstantRun>> {
    let mut runs = Vec::new();
    for &schedules in sizes {
        progress.set_message(format!(
            "instant: {schedules} schedules firing at one second"
        ));
        let setup = Setup::default_with(Store::Sqlite);
        let mut sut = ServiceUnderTest::spawn(amqp_uri, channels, &setup).await?;
        let run = one(&mut sut, amqp_uri, (schedules, made_s), progress).await;
        sut.stop().await?;
        let run = run?;
        println!(
            "instant: {} schedules at one second ({:.0} created/s, {:.1} s ahead): planned \
             {:+.0} ms; first +{:.0} ms, last +{:.0} ms, p50 {:.0} ms, p99 {:.0} ms; \
             planning {:.0} µs CPU a schedule; early {}, missing {}, duplicates {}",
            run.schedules,
            run.created_per_sec,
            run.ahead_s,
            run.planned_ms,
            run.first_ms,
            run.last_ms,
            run.p50_ms,
            run.p99_ms,
            run.planning_cpu_us_per_schedule,
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
    (schedules, made_s): (usize, u64),
    progress: &ProgressBar,
) -> anyhow::Result<InstantRun> {
    let mut receiver = consume(sut, "instant", amqp_uri).await?;
    let n = schedules as u64;
    let now_ms = (now_us() / 1000) as u64;
    let instant_ms = if made_s == 0 {
        let earliest = now_ms + 1000 * (n / CREATE_RATE + LEAD_AND_MARGIN_S + n / PLAN_RATE);
        earliest.div_ceil(60_000) * 60_000
    } else {
        // A whole minute (cron's precision), the creating started so that
        // the last is made about `made_s` before it.
        let creating_ms = 1000 * n / MADE_LATE_CREATE_RATE;
        let instant_ms = (now_ms + creating_ms + 1000 * made_s).div_ceil(60_000) * 60_000;
        let start_ms = instant_ms - creating_ms - 1000 * made_s;
        tokio::time::sleep(Duration::from_millis(start_ms.saturating_sub(now_ms))).await;
        instant_ms
    };
    let started = Instant::now();
    create(sut, schedules, instant_ms, progress).await?;
    let created_per_sec = n as f64 / started.elapsed().as_secs_f64();
    let created_ms = (now_us() / 1000) as u64;
    if made_s == 0 && created_ms + 30_000 + 1000 * n / PLAN_RATE > instant_ms {
        bail!("creating the schedules overran: the instant is too near to measure");
    }
    let planned = watch_planner(sut, n, instant_ms).await;
    let got = arrivals(&mut receiver, schedules, instant_ms).await;
    Ok(summary(
        schedules,
        (created_per_sec, created_ms, instant_ms),
        planned.at_ms,
        planned.cpu_us_per_schedule,
        &got,
    ))
}

/// `count` schedules, each firing once, at `instant_ms`.
async fn create(
    sut: &ServiceUnderTest,
    count: usize,
    instant_ms: u64,
    progress: &ProgressBar,
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("{}/v1/schedules", sut.base);
    let at = format_epoch_ms(instant_ms);
    // Once: the end (after the start) comes before the next.
    let end = format_epoch_ms(instant_ms + 1_000);
    progress.set_length(count as u64);
    progress.set_position(0);
    let created = futures_util::stream::iter(0..count)
        .map(|n| {
            let (client, url, at, end) = (client.clone(), url.clone(), at.clone(), end.clone());
            async move {
                let body = serde_json::json!({
                    "id": format!("instant-{n}"), "destination": "instant",
                    "every": "60s", "start_at": at, "end_at": end, "payload": {"n": n}});
                let response = client.post(&url).json(&body).send().await.ok()?;
                (response.status() == 201).then_some(())
            }
        })
        .buffer_unordered(CREATING)
        .inspect(|_| progress.inc(1))
        .filter_map(|created| async move { created })
        .count()
        .await;
    if created != count {
        bail!("{} of {count} schedules were not created", count - created);
    }
    Ok(())
}

/// When the planner made the last occurrence a task, and its CPU a
/// schedule.
struct Planned {
    /// From the instant (negative: before it).
    at_ms: f64,
    /// The service's CPU from the poll that first saw an occurrence made
    /// to the one that saw the last, over the occurrences made between.
    cpu_us_per_schedule: f64,
}

/// Polls the occurrences made tasks every 100 ms until all `count` are.
async fn watch_planner(sut: &ServiceUnderTest, count: u64, instant_ms: u64) -> Planned {
    let deadline = Instant::now()
        + Duration::from_millis(instant_ms.saturating_sub((now_us() / 1000) as u64) + 120_000);
    let mut first: Option<(f64, f64)> = None;
    let mut last = (0.0, f64::NAN);
    while Instant::now() < deadline {
        let made = scrape(&sut.base)
            .await
            .map(|text| created_occurrences(&text))
            .unwrap_or(0.0);
        last = (made, sut.cpu_ms().unwrap_or(f64::NAN));
        if made > 0.0 && first.is_none() {
            first = Some(last);
        }
        if made >= count as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let at_ms = (now_us() / 1000) as f64 - instant_ms as f64;
    let (made_then, cpu_then) = first.unwrap_or(last);
    Planned {
        at_ms,
        cpu_us_per_schedule: (last.1 - cpu_then) * 1000.0 / (last.0 - made_then).max(1.0),
    }
}

fn created_occurrences(scrape: &str) -> f64 {
    scrape
        .lines()
        .filter(|line| line.starts_with("delayline_schedule_occurrences_total"))
        .filter(|line| line.contains("outcome=\"created\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn summary(
    schedules: usize,
    (created_per_sec, created_ms, instant_ms): (f64, u64, u64),
    planned_ms: f64,
    planning_cpu_us_per_schedule: f64,
    got: &[(String, i64)],
) -> InstantRun {
    let instant_us = instant_ms as i64 * 1000;
    let unique: HashSet<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
    let mut late_ms: Vec<f64> = got
        .iter()
        .map(|(_, at)| (at - instant_us) as f64 / 1000.0)
        .collect();
    late_ms.sort_by(f64::total_cmp);
    InstantRun {
        schedules,
        created_per_sec,
        ahead_s: (instant_ms as f64 - created_ms as f64) / 1000.0,
        planned_ms,
        first_ms: late_ms.first().copied().unwrap_or(f64::NAN),
        last_ms: late_ms.last().copied().unwrap_or(f64::NAN),
        p50_ms: quantile(&late_ms, 0.5),
        p99_ms: quantile(&late_ms, 0.99),
        planning_cpu_us_per_schedule,
        early: late_ms.iter().filter(|&&late| late < 0.0).count(),
        missing: schedules.saturating_sub(unique.len()),
        duplicates: got.len() - unique.len(),
    }
}
