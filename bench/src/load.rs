//! Ingest: raw AMQP publishes with confirms (the broker's ceiling) and the same
//! tasks through delayline's HTTP endpoints.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use delayline::broker::connect;
use delayline::cascade::Cascade;
use delayline::task::Task;
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
    QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation};
use serde::{Deserialize, Serialize};

/// Set once, before any ingest, by `--ingest-same-delay`.
static SAME_DELAY: AtomicBool = AtomicBool::new(false);
/// Set once, before any ingest, by `--ingest-deadline`.
static DEADLINES: AtomicBool = AtomicBool::new(false);

/// Gives every ingest task a deadline from now on (a minute's
/// `max_lateness_ms`): what a deadline costs on the way in.
pub fn use_deadlines() {
    DEADLINES.store(true, Ordering::Relaxed);
}

/// Gives every ingest task the same delay from now on: due times that grow
/// with time, so the ledger's due-order indexes take each task at their end
/// (the best any index shape in due order could do), as a workload of one
/// fixed delay does; the default spreads them over an hour.
pub fn use_same_delay() {
    SAME_DELAY.store(true, Ordering::Relaxed);
}

/// Delays (1 to 2 hours) far longer than the whole ingest phase, so nothing
/// expires while it is measured: the broker spends its time accepting, not
/// dead-lettering earlier measurements' tasks.
fn ingest_delay_ms(n: u64) -> u64 {
    if SAME_DELAY.load(Ordering::Relaxed) {
        return 3_600_000;
    }
    3_600_000 + (n * 7919) % 3_600_000
}

pub fn task_body(n: u64) -> Vec<u8> {
    task_body_due_in(n, ingest_delay_ms(n))
}

/// Task `n`'s body with the delay `delay_ms` (and, with
/// `--ingest-deadline`, a deadline a minute after it is due).
pub fn task_body_due_in(n: u64, delay_ms: u64) -> Vec<u8> {
    let deadline = if DEADLINES.load(Ordering::Relaxed) {
        r#","max_lateness_ms":60000"#
    } else {
        ""
    };
    format!(
        r#"{{"destination":"bench.ingest","delay_ms":{delay_ms}{deadline},"payload":{{"n":{n},"note":"a payload of about a hundred bytes, like a small business event"}},"headers":{{"tenant":"t-{}"}}}}"#,
        n % 16
    )
    .into_bytes()
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Throughput {
    pub path: String,
    /// The service's ledger (none, sqlite, postgres); "-" for raw AMQP.
    pub store: String,
    pub concurrency: usize,
    pub batch_size: usize,
    pub tasks: u64,
    pub errors: u64,
    pub seconds: f64,
    pub tasks_per_sec: f64,
    /// Latency of one request (one publish+confirm for raw AMQP), in ms.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Filled in by the caller, which knows the processes involved.
    pub cpu: crate::cpu::CpuPerTask,
}

fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("static histogram bounds")
}

struct WorkerResult {
    tasks: u64,
    errors: u64,
    latency_us: Histogram<u64>,
}

impl WorkerResult {
    fn new() -> Self {
        WorkerResult {
            tasks: 0,
            errors: 0,
            latency_us: latency_histogram(),
        }
    }
}

fn summarise(
    path: &str,
    store: &str,
    concurrency: usize,
    batch_size: usize,
    elapsed: Duration,
    results: Vec<WorkerResult>,
) -> Throughput {
    let mut latency = latency_histogram();
    let (mut tasks, mut errors) = (0, 0);
    for r in results {
        tasks += r.tasks;
        errors += r.errors;
        let _ = latency.add(&r.latency_us);
    }
    let seconds = elapsed.as_secs_f64();
    Throughput {
        path: path.to_owned(),
        store: store.to_owned(),
        concurrency,
        batch_size,
        tasks,
        errors,
        seconds,
        tasks_per_sec: tasks as f64 / seconds,
        p50_ms: latency.value_at_quantile(0.5) as f64 / 1000.0,
        p99_ms: latency.value_at_quantile(0.99) as f64 / 1000.0,
        cpu: crate::cpu::CpuPerTask::default(),
    }
}

fn ticker(progress: &ProgressBar, duration: Duration) -> tokio::task::JoinHandle<()> {
    let progress = progress.clone();
    progress.set_length(duration.as_millis() as u64);
    progress.set_position(0);
    tokio::spawn(async move {
        let start = Instant::now();
        while start.elapsed() < duration {
            progress.set_position(start.elapsed().as_millis() as u64);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Waits for every load worker; the elapsed time ends when the last one does.
async fn join_workers(
    workers: Vec<tokio::task::JoinHandle<WorkerResult>>,
    start: Instant,
    tick: tokio::task::JoinHandle<()>,
) -> anyhow::Result<(Vec<WorkerResult>, Duration)> {
    let mut results = Vec::new();
    for worker in workers {
        results.push(worker.await.context("load worker")?);
    }
    tick.abort();
    Ok((results, start.elapsed()))
}

/// Exchange, routing key, body and properties, exactly as delayline would publish them.
type PreparedMessage = (String, String, Vec<u8>, BasicProperties);

/// The broker's own limit: the same messages delayline would publish, straight
/// into the entry exchanges, `in_flight` confirms outstanding over `channels`.
/// Where the raw path publishes: into the cascade as delayline would, or
/// into one plain queue (default exchange, the queue's name as routing key),
/// the same bodies and properties, for what the cascade's entry costs.
pub enum RawTarget<'a> {
    Cascade,
    PlainQueue(&'a str),
    /// Every message to `exchange`, with routing key `key`, or with its
    /// task's own routing key when `None`.
    Exchange {
        label: &'a str,
        exchange: &'a str,
        key: Option<&'a str>,
    },
    /// An AMQP ingress's exchange, as a producer of the delayed-message
    /// plugin publishes: the task's payload, content type and headers, its
    /// delay in `x-delay`, its destination as the routing key.
    Ingress(&'a str),
}

pub async fn raw_amqp(
    uri: &str,
    cascade: &Cascade,
    target: RawTarget<'_>,
    channels: usize,
    in_flight: usize,
    duration: Duration,
    progress: &ProgressBar,
) -> anyhow::Result<Throughput> {
    let now = SystemTime::now();
    let messages: Arc<Vec<PreparedMessage>> = Arc::new(
        (0..1024)
            .map(|n| {
                let task = Task::parse(&task_body(n), cascade, now).expect("valid bench task");
                // What the service sends: with its hold stamp where the chain holds.
                let mut properties = delayline::message::of_task(&task.message()).properties;
                if let RawTarget::Ingress(_) = target {
                    properties = plugin_properties(&task);
                }
                let (exchange, key) = match target {
                    RawTarget::Cascade => (task.route.entry_exchange, task.route.routing_key),
                    RawTarget::PlainQueue(queue) => (String::new(), queue.to_owned()),
                    RawTarget::Exchange { exchange, key, .. } => (
                        exchange.to_owned(),
                        key.map_or(task.route.routing_key, str::to_owned),
                    ),
                    RawTarget::Ingress(exchange) => (exchange.to_owned(), task.destination),
                };
                (exchange, key, task.payload, properties)
            })
            .collect(),
    );
    let path = match target {
        RawTarget::Cascade => format!("amqp cascade ({channels} ch)"),
        RawTarget::PlainQueue(_) => format!("amqp plain queue ({channels} ch)"),
        RawTarget::Exchange { label, .. } => format!("routing: {label}"),
        RawTarget::Ingress(_) => format!("amqp ingress ({channels} ch)"),
    };
    let connection = connect(uri, "delayline-bench raw").await?;
    let opened = confirming_channels(&connection, channels).await?;
    let start = Instant::now();
    let deadline = start + duration;
    let tick = ticker(progress, duration);
    let workers: Vec<_> = (0..in_flight)
        .map(|w| {
            let channel = opened[w % channels].clone();
            let messages = messages.clone();
            tokio::spawn(async move {
                let mut result = WorkerResult::new();
                let mut n = w;
                while Instant::now() < deadline {
                    let (exchange, key, payload, properties) = &messages[n % messages.len()];
                    n += in_flight;
                    let sent = Instant::now();
                    let options = BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    };
                    let confirmed = match channel
                        .basic_publish(
                            exchange.as_str().into(),
                            key.as_str().into(),
                            options,
                            payload,
                            properties.clone(),
                        )
                        .await
                    {
                        Ok(confirm) => confirm.await,
                        Err(e) => Err(e),
                    };
                    match confirmed {
                        Ok(Confirmation::Ack(None)) => {
                            result.tasks += 1;
                            let _ = result.latency_us.record(sent.elapsed().as_micros() as u64);
                        }
                        _ => result.errors += 1,
                    }
                }
                result
            })
        })
        .collect();
    let (results, elapsed) = join_workers(workers, start, tick).await?;
    close(&connection).await;
    Ok(summarise(&path, "-", in_flight, 1, elapsed, results))
}

/// What a plugin producer publishes for `task`: its content type and
/// headers, and its delay as `x-delay` (no message id: delayline makes one).
fn plugin_properties(task: &Task) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, value) in &task.headers {
        if let delayline::message::FieldValue::Str(text) = value {
            headers.insert(
                name.as_str().into(),
                AMQPValue::LongString(text.as_str().into()),
            );
        }
    }
    let delay = i64::try_from(task.granted_delay_ms()).unwrap_or(i64::MAX);
    headers.insert("x-delay".into(), AMQPValue::LongLongInt(delay));
    BasicProperties::default()
        .with_content_type(task.content_type.as_str().into())
        .with_delivery_mode(2)
        .with_headers(headers)
}

/// `concurrency` clients, each POSTing back to back for `duration`.
/// With `batch_size` > 1 they use `/v1/tasks/batch`.
pub async fn http(
    base: &str,
    token: Option<&str>,
    store: &str,
    concurrency: usize,
    batch_size: usize,
    duration: Duration,
    progress: &ProgressBar,
) -> anyhow::Result<Throughput> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token {
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse()?,
        );
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .tcp_nodelay(true)
        .default_headers(headers)
        .build()?;
    let (url, path) = if batch_size > 1 {
        (format!("{base}/v1/tasks/batch"), "http batch")
    } else {
        (format!("{base}/v1/tasks"), "http single")
    };
    // Bodies are built before the clock starts, so the load generator spends
    // its share of the two cores on HTTP, not on formatting JSON.
    let bodies: Arc<Vec<bytes::Bytes>> = Arc::new(
        (0..256u64)
            .map(|k| {
                let first = k * batch_size as u64;
                if batch_size == 1 {
                    return bytes::Bytes::from(task_body(first));
                }
                let mut body = b"{\"tasks\":[".to_vec();
                for i in 0..batch_size as u64 {
                    if i > 0 {
                        body.push(b',');
                    }
                    body.extend(task_body(first + i));
                }
                body.extend(b"]}");
                bytes::Bytes::from(body)
            })
            .collect(),
    );
    let start = Instant::now();
    let deadline = start + duration;
    let tick = ticker(progress, duration);
    let workers: Vec<_> = (0..concurrency)
        .map(|w| {
            let client = client.clone();
            let url = url.clone();
            let bodies = bodies.clone();
            tokio::spawn(async move {
                let mut result = WorkerResult::new();
                let mut n = w;
                while Instant::now() < deadline {
                    let body = bodies[n % bodies.len()].clone();
                    n += concurrency;
                    let sent = Instant::now();
                    let response = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await;
                    let accepted = match response {
                        Ok(r) if batch_size > 1 && r.status() == 200 => {
                            let text = r.text().await.unwrap_or_default();
                            text.matches("\"status\":202").count() as u64
                        }
                        Ok(r) if r.status() == 202 => 1,
                        _ => 0,
                    };
                    let _ = result.latency_us.record(sent.elapsed().as_micros() as u64);
                    result.tasks += accepted;
                    result.errors += batch_size as u64 - accepted;
                }
                result
            })
        })
        .collect();
    let (results, elapsed) = join_workers(workers, start, tick).await?;
    Ok(summarise(
        path,
        store,
        concurrency,
        batch_size,
        elapsed,
        results,
    ))
}

/// Open-loop load beyond capacity, and what the service made of it.
#[derive(Clone, Debug, Serialize)]
pub struct Overload {
    pub store: String,
    /// Single requests per second, closed loop at concurrency 64, just before.
    pub capacity_per_sec: f64,
    pub offered_per_sec: f64,
    pub seconds: f64,
    pub accepted_per_sec: f64,
    /// Answered 503 or 429 (overloaded, too many connections, ...).
    pub refused: u64,
    /// Anything else: other statuses, connection errors.
    pub failed: u64,
    /// What the failures were: `status NNN`, or the client's error kind.
    pub failures: std::collections::BTreeMap<String, u64>,
    pub accepted_p50_ms: f64,
    pub accepted_p99_ms: f64,
    pub refused_p50_ms: f64,
    pub refused_p99_ms: f64,
}

/// Single requests started on a fixed schedule at `offered_per_sec`, whatever
/// the answers (open loop: a closed loop would slow down with the service and
/// never overload it); each is timed from its scheduled start.
pub async fn overload(
    base: &str,
    store: &str,
    capacity_per_sec: f64,
    offered_per_sec: f64,
    duration: Duration,
    progress: &ProgressBar,
) -> anyhow::Result<Overload> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(4096)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(60))
        .build()?;
    let url = format!("{base}/v1/tasks");
    let bodies: Arc<Vec<bytes::Bytes>> = Arc::new(
        (0..256u64)
            .map(|n| bytes::Bytes::from(task_body(n)))
            .collect(),
    );
    let start = Instant::now();
    let tick = ticker(progress, duration);
    let mut requests = tokio::task::JoinSet::new();
    let mut started: u64 = 0;
    while start.elapsed() < duration {
        let due = (start.elapsed().as_secs_f64() * offered_per_sec) as u64;
        while started < due {
            let (client, url) = (client.clone(), url.clone());
            let body = bodies[started as usize % bodies.len()].clone();
            let scheduled = start + Duration::from_secs_f64(started as f64 / offered_per_sec);
            requests.spawn(async move {
                let response = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                let status = match response {
                    Ok(response) => Ok(response.status().as_u16()),
                    Err(error) => {
                        // The innermost cause says what happened on the wire.
                        let mut cause: &dyn std::error::Error = &error;
                        while let Some(source) = cause.source() {
                            cause = source;
                        }
                        Err(cause.to_string())
                    }
                };
                (status, scheduled.elapsed())
            });
            started += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let offered_for = start.elapsed();
    let (mut accepted, mut refused) = (latency_histogram(), latency_histogram());
    let mut failed = 0;
    let mut failures = std::collections::BTreeMap::new();
    while let Some(joined) = requests.join_next().await {
        let (status, took) = joined.context("overload request")?;
        let micros = took.as_micros() as u64;
        match status {
            Ok(202) => {
                let _ = accepted.record(micros);
            }
            Ok(429 | 503) => {
                let _ = refused.record(micros);
            }
            other => {
                failed += 1;
                let kind = match other {
                    Ok(status) => format!("status {status}"),
                    Err(kind) => kind,
                };
                *failures.entry(kind).or_insert(0) += 1;
            }
        }
    }
    tick.abort();
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Ok(Overload {
        store: store.to_owned(),
        capacity_per_sec,
        offered_per_sec: started as f64 / offered_for.as_secs_f64(),
        seconds: offered_for.as_secs_f64(),
        accepted_per_sec: accepted.len() as f64 / offered_for.as_secs_f64(),
        refused: refused.len(),
        failed,
        failures,
        accepted_p50_ms: ms(&accepted, 0.5),
        accepted_p99_ms: ms(&accepted, 0.99),
        refused_p50_ms: ms(&refused, 0.5),
        refused_p99_ms: ms(&refused, 0.99),
    })
}

/// A durable quorum queue, like a level's, for the plain-queue reference;
/// one connection for its declaration, purges and deletion.
pub struct PlainReference {
    pub queue: String,
    connection: lapin::Connection,
    channel: lapin::Channel,
}

impl PlainReference {
    pub async fn declare(uri: &str, queue: String) -> anyhow::Result<Self> {
        let connection = connect(uri, "delayline-bench reference").await?;
        let channel = connection.create_channel().await?;
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue.as_str().into(), durable, arguments)
            .await?;
        Ok(PlainReference {
            queue,
            connection,
            channel,
        })
    }

    /// Empties it between measurements, so each starts from the same depth.
    pub async fn purge(&self) -> anyhow::Result<()> {
        self.channel
            .queue_purge(self.queue.as_str().into(), QueuePurgeOptions::default())
            .await?;
        Ok(())
    }

    pub async fn delete(self) -> anyhow::Result<()> {
        self.channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
        close(&self.connection).await;
        Ok(())
    }
}

/// `channels` channels of `connection` in confirm mode, for publishers.
pub async fn confirming_channels(
    connection: &lapin::Connection,
    channels: usize,
) -> anyhow::Result<Vec<lapin::Channel>> {
    let mut opened = Vec::with_capacity(channels);
    for _ in 0..channels {
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        opened.push(channel);
    }
    Ok(opened)
}

/// Closes a connection, bounded: once a run hung for good awaiting the
/// broker's close-ok after its work was done, and the bench has nothing left
/// to wait for on it.
pub async fn close(connection: &lapin::Connection) {
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        connection.close(200, "bench done".into()),
    )
    .await;
}

/// Submits `count` tasks for `destination` due at `due_ms`, in batches of
/// 1,000 spread over the services at `bases` (ids `{destination}-{n}`);
/// every one must be accepted.
pub async fn submit_due(
    bases: &[String],
    destination: &str,
    count: usize,
    due_ms: u64,
) -> anyhow::Result<()> {
    submit_due_from(bases, destination, (0, count), (due_ms, 0)).await
}

/// [`submit_due`], the tasks numbered from `first` (their ids
/// `{destination}-{n}`): submits tasks `first..first + count` to `destination`, due at `due_ms`
/// with a leeway of `leeway_ms` (none for 0), in batches of 1000 spread
/// over `bases`.
pub async fn submit_due_from(
    bases: &[String],
    destination: &str,
    (first, count): (usize, usize),
    (due_ms, leeway_ms): (u64, u64),
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let due = delayline::clock::format_epoch_ms(due_ms);
    let batches: Vec<(String, serde_json::Value)> = (first..first + count)
        .collect::<Vec<_>>()
        .chunks(1000)
        .enumerate()
        .map(|(k, chunk)| {
            let tasks: Vec<_> = chunk
                .iter()
                .map(|n| {
                    let mut task = serde_json::json!({"destination": destination, "deliver_at": due, "id": format!("{destination}-{n}")});
                    if leeway_ms > 0 {
                        task["leeway_ms"] = leeway_ms.into();
                    }
                    task
                })
                .collect();
            let url = format!("{}/v1/tasks/batch", bases[k % bases.len()]);
            (url, serde_json::json!({ "tasks": tasks }))
        })
        .collect();
    use futures_util::StreamExt;
    let accepted: usize = futures_util::stream::iter(batches)
        .map(|(url, batch)| {
            let client = client.clone();
            async move {
                let Ok(response) = client.post(&url).json(&batch).send().await else {
                    return 0;
                };
                let text = response.text().await.unwrap_or_default();
                text.matches("\"status\":202").count()
            }
        })
        .buffer_unordered(4)
        .fold(0, |sum, n| async move { sum + n })
        .await;
    if accepted != count {
        anyhow::bail!("{} of {count} tasks were not accepted", count - accepted);
    }
    Ok(())
}
