//! The forecast phase (issue 41): `GET /v1/forecast` over 24 h in 1-minute
//! buckets with a million tasks held over those 24 h, on SQLite and on
//! PostgreSQL. The ledger is filled directly while the service is halted
//! (through the API the fill would take minutes and hold a million messages
//! in the broker); the triggers that keep the per-minute counts run as they
//! would for tasks admitted one by one, so the fill's time is theirs too.
//! Then a bulk cancel of a tenth of them (one destination), timed, with the
//! forecast read while it runs.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::sut::{ServiceUnderTest, Setup, Store};

const DESTINATIONS: u64 = 10;
const REQUESTS: usize = 200;
const DAY_MS: u64 = 86_400_000;

#[derive(Debug, Serialize)]
pub struct ForecastRun {
    pub store: String,
    pub tasks: u64,
    /// Filling the ledger (its triggers counting every task).
    pub fill_seconds: f64,
    /// From the restart until PostgreSQL's changes were folded in.
    pub fold_seconds: f64,
    pub requests: usize,
    /// 24 h in 1-minute buckets, every destination.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The same, for one destination by pattern.
    pub one_destination_p99_ms: f64,
    /// The tasks the forecast counted (must be `tasks`).
    pub counted: u64,
    /// A bulk cancel of one destination's tasks (a tenth of them) among
    /// all: how many it changed, and how long until done.
    pub bulk_cancelled: u64,
    pub bulk_seconds: f64,
    /// The forecast's p99 while the bulk cancel ran.
    pub during_bulk_p99_ms: f64,
}

pub async fn phase(
    amqp_uri: &str,
    channels: usize,
    tasks: u64,
    stores: &[Store],
) -> anyhow::Result<Vec<ForecastRun>> {
    let mut runs = Vec::new();
    for store in stores.iter().filter(|s| **s != Store::None) {
        let mut sut =
            ServiceUnderTest::spawn(amqp_uri, channels, &Setup::default_with(store.clone()))
                .await?;
        let run = measure(&mut sut, store, tasks).await;
        sut.stop().await?;
        runs.push(run?);
    }
    Ok(runs)
}

async fn measure(
    sut: &mut ServiceUnderTest,
    store: &Store,
    tasks: u64,
) -> anyhow::Result<ForecastRun> {
    // Far enough ahead that none falls due (nor is resent) while measured.
    let start_ms = delayline::clock::now_ms() + 600_000;
    let step = DAY_MS / tasks;
    sut.halt().await?;
    let filled = Instant::now();
    let columns = "id, destination, routing_key, delay_ms, deliver_at_ms, content_type, headers, \
                   payload_bytes, state, created_at_ms, next_attempt_at_ms";
    let row = |i: &str| {
        format!(
            "'bench-' || {i}, 'bench.d' || ({i} % {DESTINATIONS}), 'k', 0, {start_ms} + {i} * {step}, \
             'application/json', '{{}}', 0, 'scheduled', {start_ms}, {start_ms}"
        )
    };
    sut.on_ledger(
        &format!(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {last}) \
             INSERT INTO tasks ({columns}) SELECT {} FROM n",
            row("i"),
            last = tasks - 1
        ),
        &format!(
            "INSERT INTO tasks ({columns}) SELECT {} FROM generate_series(0, {}) AS i",
            row("i"),
            tasks - 1
        ),
    )?;
    let fill_seconds = filled.elapsed().as_secs_f64();
    let restarted = Instant::now();
    sut.relaunch().await?;
    while sut
        .postgres_count("SELECT COUNT(*) FROM due_changes")?
        .unwrap_or(0)
        > 0
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fold_seconds = restarted.elapsed().as_secs_f64();
    let http = reqwest::Client::new();
    let window = format!(
        "{}/v1/forecast?from={}&to={}&bucket=1m",
        sut.base,
        delayline::clock::format_epoch_ms(start_ms),
        delayline::clock::format_epoch_ms(start_ms + DAY_MS)
    );
    let (all, counted) = timed(&http, &window).await?;
    let (one, _) = timed(&http, &format!("{window}&destination=bench.d3")).await?;
    let (bulk_cancelled, bulk_seconds, during) = bulk_cancel(&http, &sut.base, &window).await?;
    let quantile =
        |sorted: &[f64], q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    Ok(ForecastRun {
        store: match store {
            Store::Postgres(_) => "postgres".to_owned(),
            _ => "sqlite".to_owned(),
        },
        tasks,
        fill_seconds,
        fold_seconds,
        requests: REQUESTS,
        p50_ms: quantile(&all, 0.5),
        p99_ms: quantile(&all, 0.99),
        max_ms: all[all.len() - 1],
        one_destination_p99_ms: quantile(&one, 0.99),
        counted,
        bulk_cancelled,
        bulk_seconds,
        during_bulk_p99_ms: quantile(&during, 0.99),
    })
}

/// Cancels destination `bench.d7` in bulk, reading the forecast meanwhile;
/// tasks cancelled, seconds until done, forecast times (sorted).
async fn bulk_cancel(
    http: &reqwest::Client,
    base: &str,
    forecast: &str,
) -> anyhow::Result<(u64, f64, Vec<f64>)> {
    let started = Instant::now();
    let body = serde_json::json!({"filter": {"destination": "bench.d7"}, "action": "cancel"});
    let operation: serde_json::Value = http
        .post(format!("{base}/v1/tasks/bulk"))
        .json(&body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let url = format!(
        "{base}/v1/operations/{}",
        operation["id"].as_str().unwrap_or("")
    );
    let mut during = Vec::new();
    loop {
        let at = Instant::now();
        http.get(forecast).send().await?.error_for_status()?;
        during.push(at.elapsed().as_secs_f64() * 1000.0);
        let state: serde_json::Value = http
            .get(&url)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        if state["done"] == true {
            let changed = state["changed"].as_u64().unwrap_or(0);
            during.sort_by(f64::total_cmp);
            return Ok((changed, started.elapsed().as_secs_f64(), during));
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "bulk cancel still running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `REQUESTS` answers to `url`, one after another: their times in ms,
/// sorted, and the last one's total.
async fn timed(http: &reqwest::Client, url: &str) -> anyhow::Result<(Vec<f64>, u64)> {
    let mut took = Vec::with_capacity(REQUESTS);
    let mut total = 0;
    for _ in 0..REQUESTS {
        let started = Instant::now();
        let answer: serde_json::Value = http
            .get(url)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        took.push(started.elapsed().as_secs_f64() * 1000.0);
        total = answer["total"].as_u64().unwrap_or(0);
    }
    took.sort_by(f64::total_cmp);
    Ok((took, total))
}
