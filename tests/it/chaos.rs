//! The chaos run: the real binary under steady load (SQLite ledger, quorum
//! queues, a three-node cluster of the test's own) while, one after another,
//! a task too large for the broker is posted, the broker closes delayline's
//! connection, a memory alarm blocks publishing, delayline is SIGKILLed and
//! restarted, the node in use stops its broker for a while, and then is lost
//! for good. Every accepted task must arrive, none early; duplicates are
//! counted. `DLTEST_CHAOS_REPORT=FILE` writes the figures as a Markdown table
//! (RELIABILITY.md has a run's).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::common::nodes::{Cluster, NodeOptions, drain};
use crate::common::{
    Backend, TestConsumer, free_port, sample, serve_command, steady_load, test_settings,
    wait_ready_at, with_ledger,
};
use delayline::cascade::QueueType;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Steady load between two faults.
const CALM: Duration = Duration::from_secs(4);
/// How long the deliveries may take once the load stops.
const STALL_ALLOWANCE: Duration = Duration::from_secs(120);

struct Fault {
    name: &'static str,
    /// When it was injected, wall clock: to read beside the service's log.
    at: String,
    /// From the fault's injection (or its end, for a fault that lasts) until
    /// `/readyz` says publishing works again.
    recovered_in: Option<Duration>,
}

fn now_text() -> String {
    delayline::clock::format_epoch_ms(delayline::clock::epoch_ms(std::time::SystemTime::now()))
}

/// The service as the load sees it.
struct Service {
    http: reqwest::Client,
    base: String,
}

impl Service {
    async fn ready(&self) -> Option<Value> {
        let response = self
            .http
            .get(format!("{}/readyz", self.base))
            .send()
            .await
            .ok()?;
        let body: Value = response.json().await.ok()?;
        (body["broker"] == "connected").then_some(body)
    }

    /// Waits until publishing works; how long that took.
    async fn recovery(&self, since: Instant) -> Duration {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.ready().await.is_none() {
            assert!(Instant::now() < deadline, "never recovered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        since.elapsed()
    }

    /// Index of the cluster node in use, once connected (again, should
    /// the connection drop between two looks).
    async fn node(&self, cluster: &Cluster) -> usize {
        loop {
            self.recovery(Instant::now()).await;
            if let Some(ready) = self.ready().await {
                return node_index(&ready, cluster).expect("a node of the cluster");
            }
        }
    }

    /// The node in use, once it is not `spared`: the service is moved off
    /// `spared` by closing its connection there (it then tries the other
    /// addresses first). It lands on the consumer's node when another node's
    /// provisioning times out while leaders move after a fault, which is
    /// allowed; faulting the consumer's node is not what the test means.
    async fn node_other_than(
        &self,
        spared: usize,
        cluster: &Cluster,
        connection_name: &str,
    ) -> usize {
        for _ in 0..5 {
            let node = self.node(cluster).await;
            if node != spared {
                return node;
            }
            cluster.nodes[spared].close_connections_named(connection_name);
            self.left(spared, cluster).await;
        }
        panic!("the service went back to node {spared} five times");
    }

    /// Waits until the connection to `node` is gone: `rabbitmqctl
    /// close_connection` returns before the broker has closed it, and
    /// until then `/readyz` still says connected there.
    async fn left(&self, node: usize, cluster: &Cluster) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Some(ready) = self.ready().await
            && node_index(&ready, cluster) == Some(node)
        {
            assert!(Instant::now() < deadline, "the connection was never closed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Index of the cluster node a `/readyz` answer names.
fn node_index(ready: &Value, cluster: &Cluster) -> Option<usize> {
    let node = ready["node"].as_str()?;
    cluster
        .nodes
        .iter()
        .position(|n| node.contains(&format!(":{}/", n.port)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_accepted_task_arrives_through_every_fault() {
    let cluster = Cluster::start(&NodeOptions {
        dead_letter_confirm_timeout_ms: Some(5_000),
        ..NodeOptions::default()
    });
    let mut settings = with_ledger(test_settings(12, 50, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = cluster.uris().into();
    settings.amqp.confirm_timeout_ms = 2_000;
    let cascade = settings.cascade().unwrap();
    let connection_name = format!("delayline {}", cascade.prefix());
    let port = free_port();
    let service = Service {
        http: reqwest::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
    };
    // The service's log, kept for whoever reads a failure.
    let log = std::env::temp_dir().join(format!("{}.log", cascade.prefix()));
    let spawn = || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        serve_command(&settings, port)
            .env(
                "RUST_LOG",
                "info,delayline::scheduler=debug,delayline::release=debug,delayline::chain=debug,delayline::broker=debug",
            )
            .stderr(file.try_clone().unwrap())
            .stdout(file)
            .spawn()
            .unwrap()
    };
    let mut child = spawn();
    wait_ready_at(&service.http, &service.base).await;
    service.recovery(Instant::now()).await;
    // The consumer's node is never faulted; its queue is replicated anyway.
    let key = cascade.binding_key("chaos");
    let mut consumer =
        TestConsumer::on_node(&cluster.nodes[2].uri(), &cascade, &key, QueueType::Quorum).await;

    let stop = CancellationToken::new();
    let load = steady_load(
        &service.http,
        &service.base,
        4,
        "chaos",
        1_000,
        stop.clone(),
    );
    let started = Instant::now();
    let mut faults = Vec::new();
    tokio::time::sleep(CALM).await;

    // 1. A task whose headers cannot fit a frame: refused, nothing else happens.
    let mut injected_at = now_text();
    let response = service
        .http
        .post(format!("{}/v1/tasks", service.base))
        .json(&json!({"destination": "chaos", "delay_ms": 0,
                      "headers": {"h": "x".repeat(200_000)}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    faults.push(Fault {
        at: injected_at.clone(),
        name: "oversized task (200 KB header)",
        recovered_in: None,
    });
    tokio::time::sleep(CALM).await;

    // 2. The broker closes delayline's connection, three times.
    injected_at = now_text();
    let mut slowest = Duration::ZERO;
    for _ in 0..3 {
        let node = service.node(&cluster).await;
        let closed = Instant::now();
        cluster.nodes[node].close_connections_named(&connection_name);
        service.left(node, &cluster).await;
        slowest = slowest.max(service.recovery(closed).await);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    faults.push(Fault {
        at: injected_at.clone(),
        name: "3 forced connection closes (the slowest)",
        recovered_in: Some(slowest),
    });
    tokio::time::sleep(CALM).await;

    // 3. A memory alarm blocks publishing for 5 s.
    injected_at = now_text();
    cluster.nodes[0].raise_memory_alarm();
    tokio::time::sleep(Duration::from_secs(5)).await;
    cluster.nodes[0].clear_memory_alarm();
    faults.push(Fault {
        at: injected_at.clone(),
        name: "memory alarm, 5 s",
        recovered_in: Some(service.recovery(Instant::now()).await),
    });
    tokio::time::sleep(CALM).await;

    // 4. delayline is killed and started again on the same ledger.
    injected_at = now_text();
    let injected = Instant::now();
    child.kill().await.unwrap();
    child = spawn();
    faults.push(Fault {
        at: injected_at.clone(),
        name: "delayline SIGKILL and restart",
        recovered_in: Some(service.recovery(injected).await),
    });
    tokio::time::sleep(CALM).await;

    // 5. The node in use stops its broker for 10 s.
    injected_at = now_text();
    let node = service.node_other_than(2, &cluster, &connection_name).await;
    cluster.nodes[node].ctl(&["stop_app"]);
    let injected = Instant::now();
    let moved = service.recovery(injected).await;
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(moved)).await;
    cluster.nodes[node].ctl(&["start_app"]);
    cluster.nodes[node].ctl(&["await_startup"]);
    faults.push(Fault {
        at: injected_at.clone(),
        name: "broker stop_app on the node in use, 10 s",
        recovered_in: Some(moved),
    });
    tokio::time::sleep(CALM).await;

    // 6. The node in use is lost for good.
    injected_at = now_text();
    let node = service.node_other_than(2, &cluster, &connection_name).await;
    let injected = Instant::now();
    cluster.nodes[node].stop();
    faults.push(Fault {
        at: injected_at.clone(),
        name: "node in use lost (rabbitmqctl stop)",
        recovered_in: Some(service.recovery(injected).await),
    });
    tokio::time::sleep(CALM).await;

    stop.cancel();
    let answers = load.await.unwrap();
    let load_seconds = started.elapsed().as_secs_f64();
    let accepted: HashSet<String> = answers
        .iter()
        .filter(|a| a.status == 202)
        .filter_map(|a| a.id.clone())
        .collect();
    // A request cut off by the kill got no answer (status 0): not accepted,
    // though its task may have been committed and is then delivered.
    let unanswered = answers.iter().filter(|a| a.status == 0).count();
    let refused: HashMap<u16, usize> = answers
        .iter()
        .filter(|a| a.status != 202 && a.status != 0)
        .fold(HashMap::new(), |mut counts, a| {
            *counts.entry(a.status).or_default() += 1;
            counts
        });
    assert!(refused.is_empty(), "answers other than 202: {refused:?}");

    let drained = drain(
        &mut consumer,
        &accepted,
        &cluster.nodes[2],
        cascade.prefix(),
        STALL_ALLOWANCE,
    )
    .await;
    if !drained.missing.is_empty() {
        // What the ledger and the broker say of them, for whoever reads the failure.
        let mut diagnosis = String::new();
        for id in &drained.missing {
            let answer = service
                .http
                .get(format!("{}/v1/tasks/{id}", service.base))
                .send()
                .await;
            let task = match answer {
                Ok(response) => response.text().await.unwrap_or_default(),
                Err(error) => error.to_string(),
            };
            writeln!(diagnosis, "{id}: {task}").unwrap();
        }
        let queues: Vec<String> = cluster.nodes[2]
            .queue_listing()
            .into_iter()
            .filter(|(_, _, _, all)| *all > 0)
            .map(|q| format!("{q:?}"))
            .collect();
        for fault in &faults {
            writeln!(diagnosis, "fault at {}: {}", fault.at, fault.name).unwrap();
        }
        panic!(
            "{} of {} accepted tasks never arrived:\n{diagnosis}queues holding messages: \
             {queues:?}\nthe service's log: {}",
            drained.missing.len(),
            accepted.len(),
            log.display()
        );
    }
    // What the ledger published again because the broker had lost it.
    let metrics = service
        .http
        .get(format!("{}/metrics", service.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let resent = sample(&metrics, "delayline_tasks_resent_total").unwrap_or(0.0);
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&log);

    let mut report = String::new();
    writeln!(report, "| fault | publishing again after |").unwrap();
    writeln!(report, "|---|---|").unwrap();
    for fault in &faults {
        let recovered = fault.recovered_in.map_or("not affected".to_owned(), |d| {
            format!("{} ms", d.as_millis())
        });
        writeln!(report, "| {} | {recovered} |", fault.name).unwrap();
    }
    writeln!(report).unwrap();
    writeln!(report, "| | |").unwrap();
    writeln!(report, "|---|---|").unwrap();
    for (what, value) in [
        (
            "load",
            format!(
                "{load_seconds:.0} s, 4 clients, {:.0} tasks/s",
                answers.len() as f64 / load_seconds
            ),
        ),
        ("tasks accepted (202)", accepted.len().to_string()),
        ("lost", "0".to_owned()),
        ("delivered early", "0".to_owned()),
        ("duplicates", drained.duplicates.to_string()),
        (
            "published again by the ledger: never reached the release stage",
            resent.to_string(),
        ),
        (
            "requests without an answer (cut off by the kill)",
            unanswered.to_string(),
        ),
        (
            "of those, delivered",
            drained.unanswered_delivered.to_string(),
        ),
        (
            "lateness p50 / p99 / max",
            format!(
                "{} / {} / {} ms",
                drained.percentile(0.5),
                drained.percentile(0.99),
                drained.percentile(1.0)
            ),
        ),
        (
            "levels stranded by a lost node, released by the runbook script",
            if drained.released.is_empty() {
                "none".to_owned()
            } else {
                drained.released.join(", ")
            },
        ),
    ] {
        writeln!(report, "| {what} | {value} |").unwrap();
    }
    eprintln!("{report}");
    for (since, count, median, worst) in drained.by_due_time(2_000) {
        eprintln!(
            "due at +{since:>6} ms: {count:>4} tasks, {median:>6} ms late (median), {worst:>6} ms (worst)"
        );
    }
    if let Ok(path) = std::env::var("DLTEST_CHAOS_REPORT") {
        std::fs::write(path, &report).unwrap();
    }
    assert!(
        drained.unanswered_delivered <= unanswered,
        "delivered tasks nobody was answered for"
    );
}
