//! Leeways (issue 77): tasks that say any moment within a window after
//! their due time will do are delivered each at its own moment in it, so
//! that an instant many tasks share arrives spread over the window by
//! design. Never before the due time, never after the window's end, across
//! a SIGKILL; a move keeps the window; the API shows it.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use delayline::cascade::QueueType;
use delayline::clock::{format_epoch_ms, parse_epoch_ms};
use delayline::message::DELIVER_AT_HEADER;
use delayline::testkit::now_ms;
use serde_json::{Value, json};

use crate::common::{
    Backend, Cleanup, TestApp, TestConsumer, free_port, serve_declared, spawn_binary,
    test_settings, wait_ready_at, with_ledger,
};

const TASKS: usize = 10_000;
const LEEWAY_MS: u64 = 10_000;

/// `TASKS` tasks due at `due_ms`, each with a 10 s leeway, in batches of
/// 1,000: their ids.
async fn post_instant(
    http: &reqwest::Client,
    base: &str,
    destination: &str,
    due_ms: u64,
) -> HashSet<String> {
    let mut ids = HashSet::new();
    let task = json!({"destination": destination, "deliver_at": format_epoch_ms(due_ms),
                      "leeway": "10s"});
    for _ in 0..TASKS / 1_000 {
        let batch = json!({"tasks": vec![task.clone(); 1_000]});
        let answer: Value = http
            .post(format!("{base}/v1/tasks/batch"))
            .json(&batch)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for accepted in answer["results"].as_array().unwrap() {
            assert_eq!(accepted["status"], 202, "{accepted}");
            let task = &accepted["task"];
            assert_eq!(task["leeway_ms"], LEEWAY_MS, "{task}");
            assert_eq!(task["due_at"], format_epoch_ms(due_ms), "{task}");
            ids.insert(task["id"].as_str().unwrap().to_owned());
        }
    }
    ids
}

/// How many of `at_ms` fall in each second from `from_ms`.
fn per_second(at_ms: impl Iterator<Item = u64>, from_ms: u64) -> Vec<u32> {
    let mut counts = vec![0u32; 12];
    for at in at_ms {
        let second = ((at.saturating_sub(from_ms)) / 1_000) as usize;
        counts[second.min(11)] += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instant_with_a_leeway_arrives_spread_over_it_never_early_nor_after_it_across_a_sigkill()
{
    // 10 levels of 20 ms hold 20 s: the instant and its window.
    let settings = with_ledger(test_settings(10, 20, QueueType::Quorum), Backend::Sqlite);
    let cascade = settings.cascade().unwrap();
    let mut cleanup = Cleanup::for_settings(&settings);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut child = serve_declared(&settings, port, &http, &base).await;
    let key = cascade.binding_key("leeway");
    let exchange = cascade.business_exchange();
    let mut consumer = TestConsumer::bind_to(&mut cleanup, &cascade, exchange, &key).await;
    let due_ms = now_ms() + 5_000;
    let expected = post_instant(&http, &base, "leeway", due_ms).await;
    assert_eq!(expected.len(), TASKS);

    // Killed in the middle of the window, and started again.
    let until = (due_ms + 5_000).saturating_sub(now_ms());
    let mut arrivals: HashMap<String, (u64, u64)> = HashMap::new();
    let mut duplicates = 0;
    let mut receive_until = async |consumer: &mut TestConsumer, end_ms: u64| {
        while now_ms() < end_ms {
            let Some(message) = consumer.next(Duration::from_millis(200)).await else {
                continue;
            };
            let moment = message.header_i64(DELIVER_AT_HEADER).unwrap() as u64;
            let first = arrivals.insert(message.message_id(), (message.received_at_ms, moment));
            duplicates += usize::from(first.is_some());
            if arrivals.len() == TASKS {
                return;
            }
        }
    };
    receive_until(&mut consumer, now_ms() + until).await;
    child.kill().await.unwrap();
    let killed_ms = now_ms();
    child = spawn_binary(&settings, port);
    wait_ready_at(&http, &base).await;
    receive_until(&mut consumer, now_ms() + 40_000).await;
    child.kill().await.unwrap();

    let missing = expected.iter().filter(|id| !arrivals.contains_key(*id));
    assert_eq!(missing.count(), 0, "tasks never delivered");
    for (id, (received_ms, moment_ms)) in &arrivals {
        assert!(*moment_ms >= due_ms, "{id}: its moment before the due time");
        assert!(
            *moment_ms <= due_ms + LEEWAY_MS,
            "{id}: its moment past the window"
        );
        assert!(
            received_ms >= moment_ms,
            "{id}: early by {} ms",
            moment_ms - received_ms
        );
    }
    let moments = per_second(arrivals.values().map(|(_, moment)| *moment), due_ms);
    let received = per_second(arrivals.values().map(|(received, _)| *received), due_ms);
    let late_ms: Vec<u64> = arrivals.values().map(|(r, m)| r - m).collect();
    println!(
        "{TASKS} due at one instant with a 10 s leeway, killed at +{} ms: \
         moments per second {moments:?}, arrivals per second {received:?}, \
         {duplicates} duplicates, latest {} ms after its moment",
        killed_ms - due_ms,
        late_ms.iter().max().unwrap_or(&0)
    );
    // Evenly: no second of the window holds more than twice its share.
    let mean = TASKS as u32 / 10;
    assert!(moments[..10].iter().all(|n| *n <= 2 * mean), "{moments:?}");
    // Arrivals too, before the kill (after it, what fell due meanwhile
    // comes at once).
    let before_kill = ((killed_ms - due_ms) / 1_000) as usize;
    assert!(
        received[..before_kill.min(10)]
            .iter()
            .all(|n| *n <= 2 * mean),
        "{received:?}"
    );
    // What fell due while it restarted goes on once it is back (its staged
    // tasks taken over, none left to a lease): a generous bound for a
    // loaded machine, where 0.5 s is usual.
    let latest = late_ms.iter().max().copied().unwrap_or(0);
    assert!(latest < 8_000, "{latest} ms after its moment");
}

/// A move keeps the leeway and the task's moment in it; the task shows
/// both; a batch of tasks without one shows none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_task_keeps_its_leeway_and_its_moment_in_it() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let settings = with_ledger(test_settings(10, 20, QueueType::Quorum), backend);
        let app = TestApp::spawn(settings).await;
        let task = json!({"destination": "kept", "delay": "5s", "leeway_ms": 4_000,
                          "id": "kept-1"});
        let (status, accepted) = app.post("/v1/tasks", &task).await;
        assert_eq!(status, 202, "{accepted}");
        let offset = |view: &Value| {
            let moment = parse_epoch_ms(view["deliver_at"].as_str().unwrap()).unwrap();
            let due = parse_epoch_ms(view["due_at"].as_str().unwrap()).unwrap();
            moment - due
        };
        let drawn = offset(&accepted);
        assert!(drawn <= 4_000, "{accepted}");
        let (_, moved) = app.patch("/v1/tasks/kept-1", &json!({"delay": "8s"})).await;
        assert_eq!(moved["leeway_ms"], 4_000, "{backend:?}: {moved}");
        assert_eq!(offset(&moved), drawn, "{backend:?}: {moved}");
        let (_, stored) = app.get("/v1/tasks/kept-1").await;
        assert_eq!(stored["leeway_ms"], 4_000, "{backend:?}: {stored}");
        assert_eq!(stored["due_at"], moved["due_at"], "{backend:?}: {stored}");
        // A bulk move by a shift moves the due time; the moment keeps its place.
        let shift = json!({"filter": {"destination": "kept"}, "action": "move", "shift": "2s"});
        let (status, operation) = app.post("/v1/tasks/bulk", &shift).await;
        assert_eq!(status, 202, "{operation}");
        let path = format!("/v1/operations/{}", operation["id"].as_str().unwrap());
        crate::common::eventually("the bulk move is done", async || {
            app.get(&path).await.1["done"] == true
        })
        .await;
        let (_, shifted) = app.get("/v1/tasks/kept-1").await;
        let due_of = |view: &Value| parse_epoch_ms(view["due_at"].as_str().unwrap()).unwrap();
        assert_eq!(
            due_of(&shifted),
            due_of(&stored) + 2_000,
            "{backend:?}: {shifted}"
        );
        assert_eq!(offset(&shifted), drawn, "{backend:?}: {shifted}");
        let plain = json!({"destination": "kept", "delay": "5s", "id": "plain-1"});
        let (_, plain) = app.post("/v1/tasks", &plain).await;
        assert!(plain.get("leeway_ms").is_none() && plain.get("due_at").is_none());
        app.stop().await.unwrap();
    }
}
