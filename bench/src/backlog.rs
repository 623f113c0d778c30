//! A backlog: a million tasks held for hours, and what that does to the
//! broker, the service and the tasks falling due meanwhile.
//!
//! The x-delayed-message plugin is known to fail at this scale (15-minute
//! delays arriving days late past about a million messages). The cascade
//! holds each task in the queue of its highest set digit, so a backlog of
//! long delays sits in a few high levels and the low levels, where short
//! delays pass, stay as short as they were: this phase checks that, and
//! what the backlog costs in memory, disk and inspection latency.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::ProgressBar;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::rabbitmqctl::rabbitmqctl_json;
use crate::sut::ServiceUnderTest;
use delayline::testkit::quantile;

/// Tasks per batch request while the backlog is ingested.
const BATCH: u64 = 500;
/// Batch requests in flight.
const CONCURRENCY: usize = 4;
/// The ingest gives up after 20 minutes, or a minute a 120,000 tasks for a
/// larger backlog, rather than retry a service that refuses everything.
fn ingest_limit(tasks: u64) -> Duration {
    Duration::from_secs((tasks / 2_000).max(20 * 60))
}
/// Every this many batches (per worker), one accepted id is kept for the
/// GET measurement.
const SAMPLE_EVERY: u64 = 5;

const HOUR_MS: u64 = 3_600_000;

/// The delays a backlog's tasks take, spread evenly from `from_ms` to
/// `to_ms`; from two hours on, so that none falls due while the phase runs.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Spread {
    pub from_ms: u64,
    pub to_ms: u64,
}

impl Spread {
    /// Two hours to `days` days, or two to six hours for 0 (the phase's
    /// first shape, kept comparable).
    pub fn over_days(days: u64) -> Spread {
        let to_ms = if days == 0 {
            6 * HOUR_MS
        } else {
            (days * 24 * HOUR_MS).max(3 * HOUR_MS)
        };
        Spread {
            from_ms: 2 * HOUR_MS,
            to_ms,
        }
    }

    fn delay_ms(self, n: u64) -> u64 {
        self.from_ms + (n * 7919 * 1000) % (self.to_ms - self.from_ms)
    }

    /// Half the backlog is due before this delay.
    fn midpoint_ms(self) -> u64 {
        self.from_ms + (self.to_ms - self.from_ms) / 2
    }
}

fn batch_body(spread: Spread, first: u64, count: u64) -> Vec<u8> {
    let mut body = b"{\"tasks\":[".to_vec();
    for n in first..first + count {
        if n > first {
            body.push(b',');
        }
        body.extend(
            format!(
                r#"{{"destination":"bench.backlog.t{}","delay_ms":{},"payload":{{"n":{n},"note":"a payload of about a hundred bytes, like a small business event"}}}}"#,
                n % 16,
                spread.delay_ms(n),
            )
            .bytes(),
        );
    }
    body.extend(b"]}");
    body
}

/// RSS of the service (MiB) after this many tasks were accepted, this
/// many seconds into the ingest.
#[derive(Clone, Debug, Serialize)]
pub struct RssSample {
    pub accepted: u64,
    pub seconds: f64,
    pub rss_mib: f64,
}

/// Tasks admitted a second between two samples, by what the ledger held
/// when the window began.
#[derive(Clone, Debug, Serialize)]
pub struct AdmissionRate {
    pub held: u64,
    pub tasks_per_sec: f64,
}

impl AdmissionRate {
    fn between(samples: &[RssSample]) -> Vec<AdmissionRate> {
        samples
            .windows(2)
            .filter(|pair| pair[1].seconds > pair[0].seconds)
            .map(|pair| AdmissionRate {
                held: pair[0].accepted,
                tasks_per_sec: (pair[1].accepted - pair[0].accepted) as f64
                    / (pair[1].seconds - pair[0].seconds),
            })
            .collect()
    }
}

/// One of the ledger's periodic passes, from `delayline_ledger_pass_seconds`
/// between two scrapes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PassCost {
    pub passes: u64,
    pub mean_ms: f64,
    /// The upper bound of the bucket holding the 99th percentile.
    pub p99_at_most_ms: f64,
}

/// The histogram `delayline_ledger_pass_seconds{pass}` in a scrape: its
/// count, sum and cumulative buckets.
#[derive(Clone, Debug, Default)]
pub struct PassHistogram {
    count: u64,
    sum: f64,
    buckets: Vec<(f64, u64)>,
}

impl PassHistogram {
    pub fn parse(exposition: &str, pass: &str) -> PassHistogram {
        let label = format!("pass=\"{pass}\"");
        let mut histogram = PassHistogram::default();
        for line in exposition.lines().filter(|l| l.contains(&label)) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            if series.starts_with("delayline_ledger_pass_seconds_count") {
                histogram.count = value.parse().unwrap_or(0);
            } else if series.starts_with("delayline_ledger_pass_seconds_sum") {
                histogram.sum = value.parse().unwrap_or(0.0);
            } else if let Some(le) = series
                .split("le=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
            {
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::NAN)
                };
                histogram.buckets.push((bound, value.parse().unwrap_or(0)));
            }
        }
        histogram
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &PassHistogram) -> PassCost {
        let passes = self.count.saturating_sub(earlier.count);
        let cumulative = |bound: f64, of: &PassHistogram| {
            of.buckets
                .iter()
                .find(|(le, _)| *le == bound)
                .map_or(0, |(_, n)| *n)
        };
        let wanted = (passes as f64 * 0.99).ceil() as u64;
        let p99 = self
            .buckets
            .iter()
            .find(|(le, n)| n.saturating_sub(cumulative(*le, earlier)) >= wanted.max(1))
            .map_or(f64::NAN, |(le, _)| le * 1000.0);
        PassCost {
            passes,
            mean_ms: (self.sum - earlier.sum) * 1000.0 / passes.max(1) as f64,
            p99_at_most_ms: p99,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Answers other than 200 (timed like the rest).
    #[serde(default)]
    pub errors: usize,
}

impl Latency {
    fn of(mut ms: Vec<f64>) -> Latency {
        ms.sort_by(f64::total_cmp);
        Latency {
            errors: 0,
            samples: ms.len(),
            p50_ms: quantile(&ms, 0.5),
            p99_ms: quantile(&ms, 0.99),
            max_ms: ms.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// What the broker holds, from `rabbitmqctl`.
#[derive(Clone, Debug, Serialize)]
pub struct BrokerUse {
    /// The node's resident memory.
    pub memory_mib: f64,
    /// Its data directory (message store, quorum logs) on disk.
    pub disk_mib: f64,
    /// Messages in this service's queues.
    pub messages: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Backlog {
    pub tasks: u64,
    /// `sqlite` or `postgres`.
    pub ledger: String,
    pub spread: Spread,
    pub ingest_seconds: f64,
    pub ingest_tasks_per_sec: f64,
    /// Batch items answered other than 202 (sent again as new tasks).
    pub refused: u64,
    pub broker_before: BrokerUse,
    pub broker_loaded: BrokerUse,
    pub service_rss: Vec<RssSample>,
    pub service_peak_rss_mib: f64,
    /// Admission rate every 5 % of the ingest, by what the ledger held.
    pub admission: Vec<AdmissionRate>,
    /// The last window's rate over the first's.
    pub admission_last_over_first: f64,
    /// The ledger on disk: SQLite's files (database and WAL), or the
    /// PostgreSQL schema's tables with their indexes.
    pub ledger_mib: f64,
    pub ledger_bytes_a_task: f64,
    /// `GET /v1/tasks/{id}` of ids spread over the backlog.
    pub get_task: Latency,
    /// `GET /v1/tasks?due_before=…&limit=100`, half the backlog before that time.
    pub first_page: Latency,
    /// Pages of 1000 followed by their cursors, `deep_rows` rows into the backlog.
    pub deep_pages: Latency,
    pub deep_rows: u64,
    /// `GET /metrics`.
    pub scrape: Latency,
    /// `GET /v1/forecast`, by its window and bucket.
    pub forecast: Vec<(String, Latency)>,
    /// The ledger's periodic passes (`resend`, `prune`) while the backlog
    /// was ingested and while it was held.
    pub passes: Vec<(String, PassCost)>,
    /// Stopped and started again with the backlog held.
    pub restart: Option<Restart>,
    /// Each console page (`GET /console…`), by what it shows.
    pub console: Vec<(String, Latency)>,
    /// Stopping the service and deleting its topology and ledger.
    pub teardown_seconds: f64,
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

/// Bytes under `path`, by `du`.
fn disk_bytes(path: &str) -> anyhow::Result<f64> {
    let out = Command::new("du")
        .args(["-sb", path])
        .output()
        .context("running du")?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("du -sb {path}"))
}

pub fn broker_use(prefix: &str) -> anyhow::Result<BrokerUse> {
    let status = rabbitmqctl_json(&["status"])?;
    let memory = status["memory"]["total"]["rss"]
        .as_f64()
        .unwrap_or(f64::NAN);
    let disk = match status["data_directory"].as_str() {
        Some(dir) => disk_bytes(dir)?,
        None => f64::NAN,
    };
    let queues = rabbitmqctl_json(&["list_queues", "name", "messages"])?;
    let messages = queues
        .as_array()
        .into_iter()
        .flatten()
        .filter(|q| q["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .filter_map(|q| q["messages"].as_u64())
        .sum();
    Ok(BrokerUse {
        memory_mib: mib(memory),
        disk_mib: mib(disk),
        messages,
    })
}

/// Times `count` GETs of `url(i)`; answers other than 200 are counted
/// (and the first printed) rather than ending a run of an hour.
async fn time_gets(
    client: &reqwest::Client,
    count: usize,
    url: impl Fn(usize) -> String,
) -> anyhow::Result<Latency> {
    let mut ms = Vec::with_capacity(count);
    let mut errors = 0;
    for i in 0..count {
        let url = url(i);
        let started = Instant::now();
        let response = client.get(&url).send().await?;
        let status = response.status();
        response.bytes().await?;
        ms.push(started.elapsed().as_secs_f64() * 1000.0);
        if status != 200 {
            if errors == 0 {
                eprintln!("GET {url} answered {status}");
            }
            errors += 1;
        }
    }
    Ok(Latency {
        errors,
        ..Latency::of(ms)
    })
}

/// Ingests `tasks` long-delayed tasks in batches; returns the ingest time,
/// refusals, RSS samples and a spread of accepted ids.
async fn ingest(
    sut: &ServiceUnderTest,
    tasks: u64,
    spread: Spread,
    progress: &ProgressBar,
) -> anyhow::Result<(Duration, u64, Vec<RssSample>, Vec<String>)> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("{}/v1/tasks/batch", sut.base);
    let accepted = Arc::new(AtomicU64::new(0));
    let reserved = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let numbered = Arc::new(AtomicU64::new(0));
    let ids = Arc::new(Mutex::new(Vec::new()));
    progress.set_length(tasks);
    progress.set_position(0);
    progress.set_message("backlog: ingesting");

    let pid = sut.pid();
    let started = Instant::now();
    let sampler = {
        let accepted = accepted.clone();
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut next = 0;
            loop {
                let done = accepted.load(Ordering::Relaxed);
                if done >= next {
                    if let Some(rss) = pid.and_then(ServiceUnderTest::rss_kib_of) {
                        samples.push(RssSample {
                            accepted: done,
                            seconds: started.elapsed().as_secs_f64(),
                            rss_mib: rss as f64 / 1024.0,
                        });
                    }
                    next = done + tasks / 20;
                }
                if done >= tasks {
                    return samples;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    let limit = ingest_limit(tasks);
    let workers = (0..CONCURRENCY).map(|_| {
        let (client, url) = (client.clone(), url.clone());
        let (accepted, reserved, refused, numbered, ids) = (
            accepted.clone(),
            reserved.clone(),
            refused.clone(),
            numbered.clone(),
            ids.clone(),
        );
        let progress = progress.clone();
        async move {
            let mut batches = 0u64;
            while accepted.load(Ordering::Relaxed) < tasks {
                if started.elapsed() > limit {
                    bail!(
                        "the backlog was not ingested within {limit:?}: {} accepted, {} refused",
                        accepted.load(Ordering::Relaxed),
                        refused.load(Ordering::Relaxed)
                    );
                }
                // Reserve what is left (refusals give their share back).
                let count = BATCH.min(tasks.saturating_sub(reserved.load(Ordering::Relaxed)));
                if count == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                reserved.fetch_add(count, Ordering::Relaxed);
                let first = numbered.fetch_add(count, Ordering::Relaxed);
                let answer = async {
                    let response = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(batch_body(spread, first, count))
                        .send()
                        .await?;
                    response.bytes().await
                }
                .await;
                let text = answer
                    .as_deref()
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default();
                let ok = text.matches("\"status\":202").count() as u64;
                if ok < count {
                    refused.fetch_add(count - ok, Ordering::Relaxed);
                    reserved.fetch_sub(count - ok, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                accepted.fetch_add(ok, Ordering::Relaxed);
                progress.inc(ok);
                batches += 1;
                if batches.is_multiple_of(SAMPLE_EVERY)
                    && let Ok(page) = serde_json::from_str::<serde_json::Value>(&text)
                    && let Some(id) =
                        page["results"][(batches % count) as usize]["task"]["id"].as_str()
                {
                    ids.lock().await.push(id.to_owned());
                }
            }
            anyhow::Ok(())
        }
    });
    let ingested: anyhow::Result<Vec<()>> = futures_util::future::join_all(workers)
        .await
        .into_iter()
        .collect();
    if let Err(error) = ingested {
        sampler.abort();
        return Err(error);
    }
    let elapsed = started.elapsed();
    let samples = sampler.await?;
    let ids = std::mem::take(&mut *ids.lock().await);
    Ok((elapsed, refused.load(Ordering::Relaxed), samples, ids))
}

/// Ingests the backlog into `sut` and measures what it costs, against what
/// the broker held when `sut` started; the caller runs the precision
/// measurement before and after.
pub async fn load_and_inspect(
    sut: &ServiceUnderTest,
    broker_before: BrokerUse,
    tasks: u64,
    spread: Spread,
    progress: &ProgressBar,
) -> anyhow::Result<Backlog> {
    let prefix = sut.cascade.prefix().to_owned();
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let base = sut.base.clone();
    let scrape_before = metrics_text(&client, &base).await?;
    let (elapsed, refused, service_rss, ids) = ingest(sut, tasks, spread, progress).await?;
    progress.set_message("backlog: measuring");
    // Wait until the broker holds every task (the last confirms are in, but
    // quorum queues report their counts a moment later).
    let deadline = Instant::now() + Duration::from_secs(60);
    let broker_loaded = loop {
        let loaded = broker_use(&prefix)?;
        if loaded.messages >= tasks || Instant::now() > deadline {
            break loaded;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let scrape_loaded = metrics_text(&client, &base).await?;

    let get_task = time_gets(&client, ids.len(), |i| {
        format!("{base}/v1/tasks/{}", ids[i])
    })
    .await?;
    let now_ms = delayline::clock::epoch_ms(std::time::SystemTime::now());
    let midpoint = delayline::clock::format_epoch_ms(now_ms + spread.midpoint_ms());
    let first_page = time_gets(&client, 50, |_| {
        format!(
            "{base}/v1/tasks?due_before={}&limit=100",
            midpoint.replace('+', "%2B")
        )
    })
    .await?;
    let (deep_pages, deep_rows) = page_deep(&client, &base, tasks / 10).await?;
    let scrape = time_gets(&client, 20, |_| format!("{base}/metrics")).await?;
    let console = console_pages(&client, &base, &ids, &midpoint).await?;
    let forecast = forecasts(&client, &base, now_ms, spread).await?;
    let scrape_held = metrics_text(&client, &base).await?;
    let passes = ["resend", "prune"]
        .into_iter()
        .flat_map(|pass| {
            let [before, loaded, held] = [&scrape_before, &scrape_loaded, &scrape_held]
                .map(|text| PassHistogram::parse(text, pass));
            [
                (format!("{pass}, while ingesting"), loaded.since(&before)),
                (format!("{pass}, while held"), held.since(&loaded)),
            ]
        })
        .collect();
    let admission = AdmissionRate::between(&service_rss);
    let admission_last_over_first = match (admission.first(), admission.last()) {
        (Some(first), Some(last)) => last.tasks_per_sec / first.tasks_per_sec,
        _ => f64::NAN,
    };
    let ledger_bytes = sut.ledger_bytes().unwrap_or(f64::NAN);

    Ok(Backlog {
        tasks,
        ledger: sut.ledger_name().to_owned(),
        spread,
        ingest_seconds: elapsed.as_secs_f64(),
        ingest_tasks_per_sec: tasks as f64 / elapsed.as_secs_f64(),
        refused,
        broker_before,
        broker_loaded,
        service_rss,
        service_peak_rss_mib: sut.peak_rss_kib().unwrap_or_default() as f64 / 1024.0,
        admission,
        admission_last_over_first,
        ledger_mib: mib(ledger_bytes),
        ledger_bytes_a_task: ledger_bytes / tasks as f64,
        get_task,
        first_page,
        deep_pages,
        deep_rows,
        scrape,
        console,
        forecast,
        passes,
        restart: None,
        teardown_seconds: f64::NAN,
    })
}

async fn metrics_text(client: &reqwest::Client, base: &str) -> anyhow::Result<String> {
    Ok(client
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?)
}

/// `GET /v1/forecast` 20 times each over the backlog's whole span by day,
/// its first day by minute, and one destination's span by day.
async fn forecasts(
    client: &reqwest::Client,
    base: &str,
    now_ms: u64,
    spread: Spread,
) -> anyhow::Result<Vec<(String, Latency)>> {
    let at = |ms: u64| delayline::clock::format_epoch_ms(ms).replace('+', "%2B");
    let (from, to) = (at(now_ms), at(now_ms + spread.to_ms + HOUR_MS));
    let day = at(now_ms + 24 * HOUR_MS);
    let queries = [
        ("the span by day", format!("from={from}&to={to}&bucket=1d")),
        ("24 h by minute", format!("from={from}&to={day}&bucket=1m")),
        (
            "one destination, the span by day",
            format!("from={from}&to={to}&bucket=1d&destination=bench.backlog.t3"),
        ),
    ];
    let mut timed = Vec::new();
    for (what, query) in queries {
        let latency = time_gets(client, 20, |_| format!("{base}/v1/forecast?{query}")).await?;
        timed.push((what.to_owned(), latency));
    }
    Ok(timed)
}

/// A restart with the backlog held: how long the service takes from its
/// start to ready, and to release a task whose due time passed while it
/// was stopped.
#[derive(Clone, Debug, Serialize)]
pub struct Restart {
    /// From SIGTERM until the process ended.
    pub stop_seconds: f64,
    /// From the new process's start until `/readyz` answered and the
    /// broker was connected.
    pub ready_seconds: f64,
    /// From the new process's start until the task due while it was
    /// stopped arrived at its consumer.
    pub first_release_seconds: f64,
}

pub async fn restart(sut: &mut ServiceUnderTest, amqp_uri: &str) -> anyhow::Result<Restart> {
    const DUE_IN: Duration = Duration::from_secs(3);
    let mut arrivals = crate::arrivals::consume(sut, "restart", amqp_uri).await?;
    let client = reqwest::Client::new();
    let answer = client
        .post(format!("{}/v1/tasks", sut.base))
        .json(&serde_json::json!({"destination": "restart", "delay_ms": DUE_IN.as_millis() as u64}))
        .send()
        .await?;
    if answer.status() != 202 {
        bail!("the restart's task was answered {}", answer.status());
    }
    let posted = Instant::now();
    let stopping = Instant::now();
    sut.halt().await?;
    let stop_seconds = stopping.elapsed().as_secs_f64();
    // Its due time passes while the service is stopped.
    tokio::time::sleep(
        (posted + DUE_IN + Duration::from_secs(1)).saturating_duration_since(Instant::now()),
    )
    .await;
    let started = Instant::now();
    sut.relaunch().await?;
    let ready_seconds = started.elapsed().as_secs_f64();
    tokio::time::timeout(Duration::from_secs(600), arrivals.recv())
        .await
        .context("the task due while stopped did not arrive within 10 minutes of the start")?
        .context("the restart's consumer ended")?;
    Ok(Restart {
        stop_seconds,
        ready_seconds,
        first_release_seconds: started.elapsed().as_secs_f64(),
    })
}

/// Every console page over the backlog, 20 times each (a task's page for
/// ids spread over it): the round trip on loopback, which bounds the
/// server's time from above. The benchmark's service has no clients, so no
/// sign-in is needed.
async fn console_pages(
    client: &reqwest::Client,
    base: &str,
    ids: &[String],
    midpoint: &str,
) -> anyhow::Result<Vec<(String, Latency)>> {
    let due_before = midpoint.replace('+', "%2B");
    let pages = [
        ("overview", "/console".to_owned()),
        ("level chart (json)", "/console/levels".to_owned()),
        ("tasks, first page", "/console/tasks".to_owned()),
        (
            "tasks of one destination, scheduled",
            "/console/tasks?destination=bench.backlog.t3&state=scheduled".to_owned(),
        ),
        (
            "tasks due before the midpoint",
            format!("/console/tasks?due_before={due_before}"),
        ),
        (
            "tasks failed (none)",
            "/console/tasks?state=failed".to_owned(),
        ),
        (
            "tasks delivered (none)",
            "/console/tasks?state=delivered".to_owned(),
        ),
        (
            "tasks pending (none)",
            "/console/tasks?state=pending".to_owned(),
        ),
        (
            "one destination, cancelled (none)",
            "/console/tasks?destination=bench.backlog.t3&state=cancelled".to_owned(),
        ),
        ("problems", "/console/problems".to_owned()),
        ("schedules", "/console/schedules".to_owned()),
    ];
    let mut timed = Vec::new();
    for (what, path) in pages {
        let latency = time_gets(client, 20, |_| format!("{base}{path}")).await?;
        timed.push((what.to_owned(), latency));
    }
    let step = (ids.len() / 20).max(1);
    let task = time_gets(client, 20.min(ids.len()), |i| {
        format!("{base}/console/tasks/{}", ids[i * step])
    })
    .await?;
    timed.push(("a task's page".to_owned(), task));
    Ok(timed)
}

/// Follows `next_cursor` through pages of 1000 until `rows` rows are behind.
async fn page_deep(
    client: &reqwest::Client,
    base: &str,
    rows: u64,
) -> anyhow::Result<(Latency, u64)> {
    let mut cursor: Option<String> = None;
    let (mut ms, mut seen) = (Vec::new(), 0u64);
    while seen < rows {
        let mut query = vec![("limit", "1000".to_owned())];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor.clone()));
        }
        let started = Instant::now();
        let page: serde_json::Value = client
            .get(format!("{base}/v1/tasks"))
            .query(&query)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        ms.push(started.elapsed().as_secs_f64() * 1000.0);
        seen += page["tasks"].as_array().map_or(0, |t| t.len() as u64);
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    Ok((Latency::of(ms), seen))
}

/// The phase's section of the report.
pub fn print(b: &Backlog) {
    println!(
        "\nbacklog: {} tasks on {} due in {:.1}-{:.1} h, ingested in {:.0} s ({:.0}/s, {} refused and sent again)",
        b.tasks,
        b.ledger,
        b.spread.from_ms as f64 / 3.6e6,
        b.spread.to_ms as f64 / 3.6e6,
        b.ingest_seconds,
        b.ingest_tasks_per_sec,
        b.refused
    );
    let rates: Vec<String> = b
        .admission
        .iter()
        .map(|r| format!("{:.0}", r.tasks_per_sec))
        .collect();
    println!(
        "  admitted a second every 5 %: {}; the last over the first {:.2}",
        rates.join(" "),
        b.admission_last_over_first
    );
    for (when, broker) in [("before", &b.broker_before), ("loaded", &b.broker_loaded)] {
        println!(
            "  broker {when:<7} memory {:>8.0} MiB  disk {:>8.0} MiB  messages {:>9}",
            broker.memory_mib, broker.disk_mib, broker.messages
        );
    }
    let rss: Vec<String> = b
        .service_rss
        .iter()
        .map(|s| format!("{:.0}", s.rss_mib))
        .collect();
    println!(
        "  service RSS MiB every 5 %: {}; peak {:.0} MiB",
        rss.join(" "),
        b.service_peak_rss_mib
    );
    println!(
        "  ledger on disk: {:.0} MiB, {:.0} bytes a task",
        b.ledger_mib, b.ledger_bytes_a_task
    );
    for (what, l) in [
        ("GET /v1/tasks/{id}", &b.get_task),
        ("GET /v1/tasks?due_before (100)", &b.first_page),
        ("pages of 1000 by cursor", &b.deep_pages),
        ("GET /metrics", &b.scrape),
    ] {
        println!(
            "  {what:<32} n={:<5} p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  not 200: {}",
            l.samples, l.p50_ms, l.p99_ms, l.max_ms, l.errors
        );
    }
    println!("  console pages, {} tasks in the ledger:", b.tasks);
    for (what, l) in &b.console {
        println!(
            "    {what:<36} n={:<3} p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  not 200: {}",
            l.samples, l.p50_ms, l.p99_ms, l.max_ms, l.errors
        );
    }
    for (what, l) in &b.forecast {
        println!(
            "  forecast, {what:<32} n={:<3} p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  not 200: {}",
            l.samples, l.p50_ms, l.p99_ms, l.max_ms, l.errors
        );
    }
    for (what, cost) in &b.passes {
        println!(
            "  ledger pass {what:<24} {:>5} passes, mean {:>8.2} ms, p99 at most {:>8.1} ms",
            cost.passes, cost.mean_ms, cost.p99_at_most_ms
        );
    }
    if let Some(r) = &b.restart {
        println!(
            "  restart: stopped in {:.1} s; ready {:.1} s after the start, the task due meanwhile released {:.1} s after it",
            r.stop_seconds, r.ready_seconds, r.first_release_seconds
        );
    }
    println!(
        "  ({} rows paged through; deleting the backlog took {:.0} s)",
        b.deep_rows, b.teardown_seconds
    );
}
