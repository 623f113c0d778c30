//! Faults of a three-node cluster while tasks, cancels and moves flow, each
//! judged by one checker: every accepted task delivered, none early, none
//! cancelled yet delivered, no stale revision of a moved task delivered,
//! and duplicates and lateness counted (issue 42, section 3).
//!
//! The scenario here is a node paused (SIGSTOP): its sockets stay open and
//! nothing answers, as a hung node or one cut off without a word. Scenarios
//! that cut traffic between nodes need traffic they can tell apart, which
//! nodes sharing 127.0.0.1 do not give: not built yet.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::common::nodes::{Cluster, NodeOptions};
use crate::common::{Backend, TestApp, TestConsumer, test_settings, with_ledger};
use delayline::cascade::QueueType;
use delayline::message::{DELIVER_AT_HEADER, REVISION_HEADER};

/// What the load made of one task, as the API answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Accepted: delivered once, in revision 1.
    Deliver,
    /// Cancelled (200): never delivered.
    Cancelled,
    /// Moved (200, revision 2): delivered in revision 2 only.
    Moved,
    /// A cancel or move that got no clear answer: delivered, in either revision.
    Either,
}

/// Posts tasks on `app` one after another until `stop`; every tenth is
/// cancelled right away, every tenth but five moved to a second later.
async fn load(app: &TestApp, tag: &str, stop: CancellationToken) -> HashMap<String, Expect> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut tasks = HashMap::new();
    let mut n = 0u64;
    while !stop.is_cancelled() {
        n += 1;
        let posted = http
            .post(format!("{}/v1/tasks", app.base))
            .json(&json!({"destination": "paused", "delay_ms": 2_000, "id": format!("{tag}-{n}")}))
            .send()
            .await;
        let Ok(posted) = posted else { continue };
        if posted.status() != 202 {
            continue;
        }
        let id = format!("{tag}-{n}");
        let url = format!("{}/v1/tasks/{id}", app.base);
        let change = match n % 10 {
            3 => Some((http.delete(&url), Expect::Cancelled)),
            7 => Some((
                http.patch(&url).json(&json!({"delay_ms": 3_000})),
                Expect::Moved,
            )),
            _ => None,
        };
        let expect = match change {
            None => Expect::Deliver,
            Some((request, wanted)) => match request.send().await {
                Ok(answer) if answer.status() == 200 => wanted,
                // Too late (409) or refused: the task goes as it was.
                Ok(answer) if answer.status().is_client_error() => Expect::Deliver,
                _ => Expect::Either,
            },
        };
        tasks.insert(id, expect);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tasks
}

/// The checker's verdict on one scenario.
#[derive(Debug, Default)]
struct Verdict {
    accepted: usize,
    delivered: usize,
    never_delivered: Vec<String>,
    duplicates: usize,
    cancelled_but_delivered: Vec<String>,
    stale_revision_delivered: Vec<String>,
    unknown_delivered: usize,
    /// Milliseconds after the delivered copy's `x-deliver-at-ms`, sorted.
    lateness: Vec<i64>,
}

impl Verdict {
    fn lateness_ms(&self, p: f64) -> i64 {
        let last = self.lateness.len().saturating_sub(1);
        self.lateness
            .get((last as f64 * p) as usize)
            .copied()
            .unwrap_or(0)
    }
}

/// Receives until `tasks` are all accounted for (or `allowance` runs
/// out), then what else comes within a few seconds; asserts none early.
async fn check(
    consumer: &mut TestConsumer,
    tasks: &HashMap<String, Expect>,
    allowance: Duration,
) -> Verdict {
    let mut verdict = Verdict {
        accepted: tasks.len(),
        ..Verdict::default()
    };
    let expected: HashSet<&String> = tasks
        .iter()
        .filter(|(_, e)| **e != Expect::Cancelled)
        .map(|(id, _)| id)
        .collect();
    let mut seen = HashSet::new();
    let deadline = Instant::now() + allowance;
    loop {
        let wait = if expected.iter().all(|id| seen.contains(*id)) {
            Duration::from_secs(3)
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        let Some(message) = consumer.next(wait).await else {
            break;
        };
        let id = message.message_id();
        let deliver_at = message.header_i64(DELIVER_AT_HEADER).unwrap();
        let late = message.received_at_ms as i64 - deliver_at;
        assert!(late >= 0, "{id} delivered early by {} ms", -late);
        if !seen.insert(id.clone()) {
            verdict.duplicates += 1;
            continue;
        }
        verdict.delivered += 1;
        verdict.lateness.push(late);
        let revision = message.header_i64(REVISION_HEADER).unwrap_or(1);
        match tasks.get(&id) {
            None => verdict.unknown_delivered += 1,
            Some(Expect::Cancelled) => verdict.cancelled_but_delivered.push(id),
            Some(Expect::Moved) if revision != 2 => verdict.stale_revision_delivered.push(id),
            Some(Expect::Deliver) if revision != 1 => verdict.stale_revision_delivered.push(id),
            Some(_) => {}
        }
    }
    verdict.never_delivered = expected
        .into_iter()
        .filter(|id| !seen.contains(*id))
        .cloned()
        .collect();
    verdict.lateness.sort_unstable();
    verdict
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_loses_nothing_and_delivers_nothing_early_cancelled_or_stale() {
    let cluster = Cluster::start(&NodeOptions {
        dead_letter_confirm_timeout_ms: Some(5_000),
        ..NodeOptions::default()
    });
    // Heartbeats notice a node that stopped answering without closing.
    let uris: Vec<String> = cluster
        .nodes
        .iter()
        .map(|node| format!("{}?heartbeat=2", node.uri()))
        .collect();
    let mut settings = with_ledger(test_settings(8, 50, QueueType::Quorum), Backend::Postgres);
    settings.amqp.uri = uris.join(",").into();
    settings.amqp.confirm_timeout_ms = 2_000;
    settings.amqp.reconnect_max_backoff_ms = 1_000;
    let first = TestApp::spawn(settings.clone()).await;
    let second = TestApp::start_sharing(settings).await;
    second.wait_ready().await;
    let key = first.cascade.binding_key("paused");
    let mut consumer = TestConsumer::on_node(
        &cluster.nodes[2].uri(),
        &first.cascade,
        &key,
        QueueType::Quorum,
    )
    .await;

    let stop = CancellationToken::new();
    let loads = tokio::join!(
        async {
            let load_first = load(&first, "a", stop.clone());
            let load_second = load(&second, "b", stop.clone());
            tokio::join!(load_first, load_second)
        },
        async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            // Both replicas are on the first address: the node they use.
            cluster.nodes[0].pause();
            tokio::time::sleep(Duration::from_secs(20)).await;
            cluster.nodes[0].resume();
            tokio::time::sleep(Duration::from_secs(5)).await;
            stop.cancel();
        }
    );
    let ((first_tasks, second_tasks), ()) = loads;
    let tasks: HashMap<String, Expect> = first_tasks.into_iter().chain(second_tasks).collect();
    let verdict = check(&mut consumer, &tasks, Duration::from_secs(120)).await;
    eprintln!(
        "paused node: accepted {}, delivered {}, never delivered {}, duplicates {}, \
         cancelled but delivered {}, stale revision delivered {}, unknown {}, \
         lateness p50 {} ms, p99 {} ms, max {} ms",
        verdict.accepted,
        verdict.delivered,
        verdict.never_delivered.len(),
        verdict.duplicates,
        verdict.cancelled_but_delivered.len(),
        verdict.stale_revision_delivered.len(),
        verdict.unknown_delivered,
        verdict.lateness_ms(0.5),
        verdict.lateness_ms(0.99),
        verdict.lateness_ms(1.0),
    );
    assert!(verdict.accepted > 100, "{verdict:?}");
    assert!(
        verdict.never_delivered.is_empty(),
        "{:?}",
        verdict.never_delivered
    );
    assert!(
        verdict.cancelled_but_delivered.is_empty(),
        "{:?}",
        verdict.cancelled_but_delivered
    );
    assert!(
        verdict.stale_revision_delivered.is_empty(),
        "{:?}",
        verdict.stale_revision_delivered
    );
    assert_eq!(verdict.unknown_delivered, 0);
    drop(consumer);
    second.stop().await.unwrap();
    first.stop().await.unwrap();
    drop(cluster);
}
