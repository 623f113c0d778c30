//! The default ledger alone, without broker or HTTP: every write the default
//! path makes for a task, through `delayline::ledger` as the service opens it
//! (SQLite, the release stage on), timed and charged to this process's CPU.
//!
//! Why on its own: the ingest phase's service CPU per task mixes HTTP, AMQP
//! and the ledger, and runs of it vary by ±10 % with the broker beside it.
//! Here the ledger is all this process does, so a change of driver, schema or
//! statement shows as it is.
//!
//! Each task makes the four writes it makes in the service, each group
//! committed with whatever other writes are waiting:
//! - admission: the insert, answered before a 202, then the mark after the
//!   broker's confirm (`pending` → `scheduled`), by `concurrency` callers
//!   at once as HTTP requests would;
//! - release: claims of windows of due tasks (`scheduled` → `releasing`),
//!   then the mark after delivery (`delivered`), several windows in flight
//!   as the release stage keeps them.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use delayline::cascade::CascadeSettings;
use delayline::clock::epoch_ms;
use delayline::ledger::StoreSettings;
use delayline::ledger::{Admission, ClaimAsk, Entry, Finding, Ledger, UnstageInput};
use delayline::release::{PAGE, PAGES_OUT};
use delayline::secret::Secret;
use delayline::task::Task;
use futures_util::stream::{self, StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::cpu::process_cpu_ms;

/// Due tasks per claim, as the release stage's windows.
const WINDOW: usize = 256;
/// Claims in flight at once.
const WINDOWS_IN_FLIGHT: usize = 4;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LedgerRun {
    pub label: String,
    pub tasks: usize,
    pub concurrency: usize,
    /// This process's CPU (user + system) per task over the whole run
    /// (with `--ledger-staged`, the staging between the two stages too).
    pub cpu_us_per_task: f64,
    pub admission_cpu_us_per_task: f64,
    pub release_cpu_us_per_task: f64,
    pub admission_tasks_per_sec: f64,
    pub release_tasks_per_sec: f64,
    /// Insert to commit, as a request waits for it before its 202.
    pub admit_p50_ms: f64,
    pub admit_p99_ms: f64,
    /// The file's size after every task was delivered (WAL not counted).
    pub database_bytes: u64,
}

/// How the phase's ledgers differ from the service's schema.
pub struct Schema<'a> {
    /// Indexes (or `trigger:NAME`) dropped first, to measure what each
    /// costs a task (the service needs every one of them).
    pub dropped: &'a [String],
    /// Statements run then: another index shape tried on the same writes.
    pub sql: Option<&'a str>,
    /// What the runs are called with `sql`.
    pub label: Option<&'a str>,
}

/// How the phase's tasks are due and released.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shape {
    /// Every task the same delay (see `--ledger-same-delay`).
    pub same_delay: bool,
    /// Released as a burst's are: staged first (not measured: ahead of the
    /// instant), then taken from the ledger in pages and marked delivered,
    /// the staged release's writes, instead of claimed in windows.
    pub staged: bool,
}

/// The phase: `tasks` tasks at 16 and at 256 callers, a tenth of them at
/// one, each run in a fresh ledger of its own, of `schema`.
pub async fn phase(
    tasks: usize,
    schema: &Schema<'_>,
    shape: Shape,
) -> anyhow::Result<Vec<LedgerRun>> {
    let Shape { same_delay, staged } = shape;
    let mut label = match (schema.label, schema.dropped.is_empty()) {
        (Some(label), _) => format!("sqlite {label}"),
        (None, true) => "sqlite".to_owned(),
        (None, false) => format!("sqlite -{}", schema.dropped.join(" -")),
    };
    if same_delay {
        label.push_str(" same-delay");
    }
    if staged {
        label.push_str(" staged");
    }
    let mut runs = Vec::new();
    for concurrency in [1, 16, 256] {
        let dir = std::env::temp_dir().join(format!(
            "delayline-bench-ledger-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir)?;
        let tasks = if concurrency == 1 { tasks / 10 } else { tasks };
        let run = default_ledger(&label, &dir, (tasks, concurrency), schema, shape).await;
        let _ = std::fs::remove_dir_all(&dir);
        runs.push(run?);
    }
    Ok(runs)
}

/// The phase's table, on stdout.
pub fn print(runs: &[LedgerRun]) {
    if runs.is_empty() {
        return;
    }
    println!(
        "\n{:<40} {:>8} {:>5} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8} {:>8} {:>10}",
        "ledger",
        "tasks",
        "conc",
        "CPU us",
        "admit us",
        "release us",
        "admit/s",
        "release/s",
        "p50 ms",
        "p99 ms",
        "file MiB"
    );
    for l in runs {
        println!(
            "{:<40} {:>8} {:>5} {:>9.1} {:>9.1} {:>9.1} {:>10.0} {:>10.0} {:>8.2} {:>8.2} {:>10.1}",
            l.label,
            l.tasks,
            l.concurrency,
            l.cpu_us_per_task,
            l.admission_cpu_us_per_task,
            l.release_cpu_us_per_task,
            l.admission_tasks_per_sec,
            l.release_tasks_per_sec,
            l.admit_p50_ms,
            l.admit_p99_ms,
            l.database_bytes as f64 / 1_048_576.0
        );
    }
}

/// Runs `tasks` tasks through a fresh SQLite ledger in `dir` of `schema`.
async fn default_ledger(
    label: &str,
    dir: &Path,
    (tasks, concurrency): (usize, usize),
    schema: &Schema<'_>,
    Shape { same_delay, staged }: Shape,
) -> anyhow::Result<LedgerRun> {
    let path = dir.join("ledger.db");
    let settings = StoreSettings {
        url: Secret::from(format!("sqlite://{}", path.display())),
        ..StoreSettings::default()
    };
    let commits = delayline::ledger::CommitObservers::unobserved();
    let ledger = delayline::ledger::open(&settings, true, commits)
        .await?
        .context("the ledger is on")?;
    // Before the writer's first statement: it prepares against this schema.
    let connection = rusqlite::Connection::open(&path)?;
    for name in schema.dropped {
        let statement = match name.strip_prefix("trigger:") {
            Some(trigger) => format!("DROP TRIGGER {trigger}"),
            None => format!("DROP INDEX {name}"),
        };
        connection.execute_batch(&statement)?;
    }
    if let Some(sql) = schema.sql {
        connection
            .execute_batch(sql)
            .context("the phase's --ledger-sql")?;
    }
    drop(connection);
    // Built before measuring: parsing is the HTTP layer's cost, not the ledger's.
    let cascade = CascadeSettings::default().validate()?;
    let now = SystemTime::now();
    // The same delay for every task puts each at the end of the due-order
    // indexes (due times that grow with time), as a workload of one fixed
    // delay does; the default spreads them over an hour.
    let body = |n: u64| match same_delay {
        true => crate::load::task_body_due_in(n, 3_600_000),
        false => crate::load::task_body(n),
    };
    let built: Vec<Task> = (0..tasks as u64)
        .map(|n| Task::parse(&body(n), &cascade, now))
        .collect::<Result<_, _>>()?;
    let ids: Vec<String> = built.iter().map(|t| t.id.clone()).collect();

    let cpu_before = own_cpu_ms()?;
    let started = Instant::now();
    let latencies = admit_all(&ledger, built, concurrency).await?;
    let admitted_in = started.elapsed();
    let cpu_admitted = own_cpu_ms()?;
    if staged {
        // Ahead of the instant in the service: in neither stage's figures.
        stage_all(&ledger, &ids).await?;
    }
    let (cpu_released_from, released_from) = (own_cpu_ms()?, started.elapsed());
    if staged {
        release_staged(&ledger, tasks).await?;
    } else {
        release_all(&ledger, ids).await?;
    }
    let released_in = started.elapsed() - released_from;
    let cpu_after = own_cpu_ms()?;
    ledger.close().await;

    let per_task = |ms: f64| ms * 1000.0 / tasks as f64;
    let quantile = |q: f64| latencies.value_at_quantile(q) as f64 / 1000.0;
    Ok(LedgerRun {
        label: label.to_owned(),
        tasks,
        concurrency,
        cpu_us_per_task: per_task(cpu_after - cpu_before),
        admission_cpu_us_per_task: per_task(cpu_admitted - cpu_before),
        release_cpu_us_per_task: per_task(cpu_after - cpu_released_from),
        admission_tasks_per_sec: tasks as f64 / admitted_in.as_secs_f64(),
        release_tasks_per_sec: tasks as f64 / released_in.as_secs_f64(),
        admit_p50_ms: quantile(0.5),
        admit_p99_ms: quantile(0.99),
        database_bytes: std::fs::metadata(&path).map_or(0, |m| m.len()),
    })
}

fn own_cpu_ms() -> anyhow::Result<f64> {
    process_cpu_ms(std::process::id()).context("reading this process's CPU time")
}

/// Admits every task, `concurrency` at a time, each marked scheduled right
/// after (as the confirm would); the insert's latencies in µs.
async fn admit_all(
    ledger: &Ledger,
    tasks: Vec<Task>,
    concurrency: usize,
) -> anyhow::Result<Histogram<u64>> {
    let one = |task: Task| async move {
        let started = Instant::now();
        let admission = ledger
            .admit(&task, (None, None), 0, Entry::Publish, None)
            .await?;
        let took = started.elapsed();
        if admission != Admission::New {
            bail!("task {} was not new: {admission:?}", task.id);
        }
        ledger.mark_published(task.id, 1).await?;
        anyhow::Ok(took)
    };
    let mut latencies = Histogram::new_with_bounds(1, 60_000_000, 3)?;
    let mut admitted = stream::iter(tasks).map(one).buffer_unordered(concurrency);
    while let Some(took) = admitted.next().await {
        latencies.record(micros(took?))?;
    }
    Ok(latencies)
}

/// Claims the tasks in windows and marks each window delivered.
async fn release_all(ledger: &Ledger, ids: Vec<String>) -> anyhow::Result<()> {
    let one = async |window: &[String]| {
        let asks = window.iter().map(|id| ClaimAsk::of(id.clone(), 1));
        let findings = ledger.claim_release(asks.collect(), None).await?;
        if let Some(other) = findings.iter().find(|f| **f != Finding::Claimed) {
            bail!("a due task was not claimed: {other:?}");
        }
        ledger
            .mark_delivered(window.to_vec(), epoch_ms(SystemTime::now()))
            .await?;
        anyhow::Ok(())
    };
    in_windows(&ids, one).await
}

/// Claims the tasks in windows and stages each until now.
async fn stage_all(ledger: &Ledger, ids: &[String]) -> anyhow::Result<()> {
    let now_ms = epoch_ms(SystemTime::now());
    let one = async |window: &[String]| {
        let asks = window.iter().map(|id| ClaimAsk {
            stage_until: Some(now_ms),
            ..ClaimAsk::of(id.clone(), 1)
        });
        let findings = ledger.stage(asks.collect()).await?;
        if let Some(other) = findings.iter().find(|f| **f != Finding::Staged) {
            bail!("a due task was not staged: {other:?}");
        }
        anyhow::Ok(())
    };
    in_windows(ids, one).await
}

/// Takes the staged tasks in pages, a few at once, and marks each page
/// delivered, until all `tasks` are.
async fn release_staged(ledger: &Ledger, tasks: usize) -> anyhow::Result<()> {
    let take = async |_: usize| {
        let now_ms = epoch_ms(SystemTime::now());
        let input = UnstageInput {
            by_ms: now_ms,
            others_by_ms: now_ms,
            own: delayline::clock::source(),
            lease_until_ms: now_ms + 60_000,
            most: PAGE,
        };
        let taken: Vec<String> = ledger
            .unstage(input)
            .await?
            .into_iter()
            .map(|t| t.id)
            .collect();
        let count = taken.len();
        ledger.mark_delivered(taken, now_ms).await?;
        anyhow::Ok(count)
    };
    let pages = tasks.div_ceil(PAGE as usize);
    let released: Vec<usize> = stream::iter(0..pages)
        .map(take)
        .buffer_unordered(PAGES_OUT)
        .try_collect()
        .await?;
    let released: usize = released.iter().sum();
    if released != tasks {
        bail!("{released} of {tasks} staged tasks were taken");
    }
    Ok(())
}

/// Runs `one` on each window of `ids`, a few windows at once.
async fn in_windows(
    ids: &[String],
    one: impl AsyncFn(&[String]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    stream::iter(ids.chunks(WINDOW))
        .map(|window| one(window))
        .buffer_unordered(WINDOWS_IN_FLIGHT)
        .try_collect()
        .await
}

fn micros(took: Duration) -> u64 {
    u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1)
}
