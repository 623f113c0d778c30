//! Recurring schedules: what held schedules cost the service while none is
//! due (CPU and memory), and how late occurrences arrive beside plain tasks
//! due at the same instants, with those schedules held.

use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::StreamExt;
use indicatif::ProgressBar;
use serde::Serialize;

use delayline::testkit::{now_us, quantile};

use crate::arrivals::consume;
use crate::sut::{ServiceUnderTest, Store};

/// Concurrent requests while creating the held schedules.
const CREATING: usize = 64;
/// Schedules of the lateness measurement, each every second, and as many
/// plain tasks due at each of the same seconds.
const TICKING: u64 = 100;

#[derive(Debug, Serialize)]
pub struct Idle {
    pub schedules: u64,
    pub seconds: f64,
    /// Service CPU (user + system) per second of wall time, in ms.
    pub cpu_ms_per_sec: f64,
    pub rss_mib: f64,
    pub ledger_mib: f64,
}

#[derive(Debug, Serialize)]
pub struct Lateness {
    pub path: String,
    pub tasks: usize,
    pub received: usize,
    pub early: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Serialize)]
pub struct Schedules {
    pub created_per_sec: f64,
    pub idle: Vec<Idle>,
    pub peak_rss_mib: f64,
    /// `GET /v1/schedules/{id}` with the schedules held, p50 and p99 ms.
    pub get_p50_ms: f64,
    pub get_p99_ms: f64,
    pub lateness: Vec<Lateness>,
}

fn idle(sut: &ServiceUnderTest, schedules: u64, seconds: Duration) -> Idle {
    let before = sut.cpu_ms().unwrap_or(f64::NAN);
    std::thread::sleep(seconds);
    let used = sut.cpu_ms().unwrap_or(f64::NAN) - before;
    let rss = sut
        .pid()
        .and_then(ServiceUnderTest::rss_kib_of)
        .unwrap_or_default();
    Idle {
        schedules,
        seconds: seconds.as_secs_f64(),
        cpu_ms_per_sec: used / seconds.as_secs_f64(),
        rss_mib: rss as f64 / 1024.0,
        ledger_mib: sut.ledger_bytes().unwrap_or(f64::NAN) / (1024.0 * 1024.0),
    }
}

/// `count` schedules due once a year (1 January, 00:00, in one of several
/// zones): held, never due while the bench runs. With `spread`, each is due
/// once a day at a minute of its own instead (the day's 1,440 minutes in
/// turn), so that some fall within every few minutes past the planner's
/// lead, as a real deployment's do.
async fn create_held(
    sut: &ServiceUnderTest,
    count: u64,
    spread: bool,
    progress: &ProgressBar,
) -> anyhow::Result<f64> {
    const ZONES: [&str; 4] = [
        "UTC",
        "Europe/Berlin",
        "America/New_York",
        "Australia/Sydney",
    ];
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("{}/v1/schedules", sut.base);
    progress.set_length(count);
    progress.set_position(0);
    progress.set_message("schedules: creating the held ones");
    let started = Instant::now();
    let created = futures_util::stream::iter(0..count)
        .map(|n| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let cron = if spread {
                    format!("{} {} * * *", n % 60, (n / 60) % 24)
                } else {
                    "0 0 1 1 *".to_owned()
                };
                let body = serde_json::json!({
                    "id": format!("held-{n}"), "destination": "bench.held",
                    "cron": cron, "timezone": ZONES[n as usize % ZONES.len()],
                    "payload": {"n": n}});
                let response = client.post(&url).json(&body).send().await.ok()?;
                (response.status() == 201).then_some(())
            }
        })
        .buffer_unordered(CREATING)
        .inspect(|_| progress.inc(1))
        .filter_map(|created| async move { created })
        .count()
        .await as u64;
    if created != count {
        bail!("{} of {count} schedules were not created", count - created);
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

async fn time_gets(sut: &ServiceUnderTest, held: u64) -> anyhow::Result<(f64, f64)> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let mut ms = Vec::new();
    for n in 0..200u64 {
        let id = (n * 7919) % held.max(1);
        let started = Instant::now();
        let response = client
            .get(format!("{}/v1/schedules/held-{id}", sut.base))
            .send()
            .await?;
        if response.status() != 200 {
            bail!("GET held-{id}: {}", response.status());
        }
        response.bytes().await?;
        ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    Ok((quantile(&ms, 0.5), quantile(&ms, 0.99)))
}

/// [`TICKING`] schedules every second and as many plain tasks due at each
/// of the same whole seconds, for `seconds`: lateness after each due time.
async fn lateness(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    seconds: u64,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<Lateness>> {
    let mut arrivals = consume(sut, "bench.tick", amqp_uri).await?;
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let now_ms = (now_us() / 1000) as u64;
    // Both start at the same whole second, far enough ahead to be set up.
    let first_ms = (now_ms / 1000 + 5) * 1000;
    let last_ms = first_ms + (seconds - 1) * 1000;
    progress.set_message("schedules: lateness");
    for n in 0..TICKING {
        let body = serde_json::json!({
            "id": format!("tick-{n}"), "destination": "bench.tick", "every": "1s",
            "start_at": delayline::clock::format_epoch_ms(first_ms),
            "end_at": delayline::clock::format_epoch_ms(last_ms)});
        let response = client
            .post(format!("{}/v1/schedules", sut.base))
            .json(&body)
            .send()
            .await?;
        if response.status() != 201 {
            bail!("a ticking schedule: {}", response.text().await?);
        }
    }
    let plain = futures_util::stream::iter(0..TICKING * seconds)
        .map(|n| {
            let client = client.clone();
            let url = format!("{}/v1/tasks", sut.base);
            let due = first_ms + (n / TICKING) * 1000;
            async move {
                let body = serde_json::json!({"id": format!("plain-{n}"), "destination": "bench.tick",
                    "deliver_at": delayline::clock::format_epoch_ms(due)});
                let response = client.post(&url).json(&body).send().await.ok()?;
                (response.status() == 202).then_some(())
            }
        })
        .buffer_unordered(32)
        .filter_map(|accepted| async move { accepted })
        .count()
        .await;
    let expected = (TICKING * seconds) as usize;
    if plain != expected {
        bail!(
            "{} of {expected} plain tasks were not accepted",
            expected - plain
        );
    }
    let (mut occurrences, mut tasks) = (Vec::new(), Vec::new());
    let (mut early_occurrences, mut early_tasks) = (0, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(last_ms - now_ms + 30_000);
    while occurrences.len() + tasks.len() < 2 * expected {
        let Ok(Some((id, at_us))) = tokio::time::timeout_at(deadline, arrivals.recv()).await else {
            break;
        };
        let due_ms = match id.split_once('@') {
            Some((_, occurrence)) => delayline::clock::parse_epoch_ms(occurrence),
            None => id
                .strip_prefix("plain-")
                .and_then(|n| n.parse::<u64>().ok())
                .map(|n| first_ms + (n / TICKING) * 1000),
        };
        let Some(due_ms) = due_ms else { continue };
        let late_ms = at_us as f64 / 1000.0 - due_ms as f64;
        let (samples, early) = if id.contains('@') {
            (&mut occurrences, &mut early_occurrences)
        } else {
            (&mut tasks, &mut early_tasks)
        };
        if late_ms < 0.0 {
            *early += 1;
        }
        samples.push(late_ms);
    }
    Ok(vec![
        summarise(
            "occurrences of schedules",
            occurrences,
            early_occurrences,
            expected,
        ),
        summarise("plain tasks, same due times", tasks, early_tasks, expected),
    ])
}

fn summarise(path: &str, mut late: Vec<f64>, early: usize, tasks: usize) -> Lateness {
    late.sort_by(f64::total_cmp);
    Lateness {
        path: path.to_owned(),
        tasks,
        received: late.len(),
        early,
        p50_ms: quantile(&late, 0.5),
        p99_ms: quantile(&late, 0.99),
        max_ms: late.last().copied().unwrap_or(f64::NAN),
    }
}

/// The default configuration: idle without schedules, `held` created, idle
/// with them, then the lateness of occurrences beside plain tasks.
pub async fn phase(
    amqp_uri: &str,
    channels: usize,
    (held, spread): (u64, bool),
    idle_seconds: Duration,
    tick_seconds: u64,
    progress: &ProgressBar,
) -> anyhow::Result<Schedules> {
    let mut sut =
        ServiceUnderTest::spawn_default(amqp_uri, channels, &Store::Sqlite, false).await?;
    progress.set_message("schedules: idle, none held");
    let mut idles = vec![idle(&sut, 0, idle_seconds)];
    let created_per_sec = create_held(&sut, held, spread, progress).await?;
    // Let the writes settle (WAL checkpoint, allocator) before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;
    progress.set_message(format!("schedules: idle, {held} held"));
    idles.push(idle(&sut, held, idle_seconds));
    let (get_p50_ms, get_p99_ms) = time_gets(&sut, held).await?;
    let lateness = lateness(&mut sut, amqp_uri, tick_seconds, progress).await?;
    let peak_rss_mib = sut.peak_rss_kib().unwrap_or_default() as f64 / 1024.0;
    sut.stop().await?;
    Ok(Schedules {
        created_per_sec,
        idle: idles,
        peak_rss_mib,
        get_p50_ms,
        get_p99_ms,
        lateness,
    })
}

pub fn print(schedules: &Schedules) {
    println!("\nRecurring schedules (default configuration):");
    println!(
        "created {:.0} schedules/s over HTTP",
        schedules.created_per_sec
    );
    println!("| schedules held | service CPU, ms per s idle | RSS | ledger |");
    println!("|---|---|---|---|");
    for idle in &schedules.idle {
        println!(
            "| {} | {:.2} | {:.1} MiB | {:.1} MiB |",
            idle.schedules, idle.cpu_ms_per_sec, idle.rss_mib, idle.ledger_mib
        );
    }
    println!(
        "peak RSS {:.1} MiB; GET /v1/schedules/{{id}} p50 {:.2} ms, p99 {:.2} ms",
        schedules.peak_rss_mib, schedules.get_p50_ms, schedules.get_p99_ms
    );
    println!("| due at the same seconds | tasks | received | early | p50 | p99 | max |");
    println!("|---|---|---|---|---|---|---|");
    for row in &schedules.lateness {
        println!(
            "| {} | {} | {} | {} | {:.1} ms | {:.1} ms | {:.1} ms |",
            row.path, row.tasks, row.received, row.early, row.p50_ms, row.p99_ms, row.max_ms
        );
    }
}
