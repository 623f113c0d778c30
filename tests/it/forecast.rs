//! The forecast against the real broker and both ledgers: what falls due
//! per bucket as tasks are submitted, cancelled, moved and delivered; a
//! client counts only its own destinations; the console's chart and the
//! due-soon gauges say the same; replicas sharing PostgreSQL read one forecast, and the
//! changes their transactions append are folded into the counts.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use delayline::cascade::QueueType;
use delayline::clock::{format_epoch_ms, parse_epoch_ms};
use delayline::config::Settings;
use delayline::testkit::now_ms;
use serde_json::{Value, json};

use crate::common::{
    Backend, TestApp, TestConsumer, bearer_client, eventually, sample, test_settings, with_ledger,
};
use crate::console::Browser;

const MINUTE_MS: u64 = 60_000;

/// 16 levels of 100 ms: delays up to 109 minutes.
fn settings(backend: Backend) -> Settings {
    with_ledger(test_settings(16, 100, QueueType::Quorum), backend)
}

/// Submits one task to `destination` due `delay_s` from now for each of
/// `delays`; their ids and due times.
async fn submit(app: &TestApp, destination: &str, delays: &[u64]) -> Vec<(String, u64)> {
    let tasks: Vec<Value> = delays
        .iter()
        .map(|s| json!({"destination": destination, "delay": format!("{s}s")}))
        .collect();
    let (status, answer) = app.post("/v1/tasks/batch", &json!({"tasks": tasks})).await;
    assert_eq!(status, 200, "{answer}");
    answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|result| {
            assert_eq!(result["status"], 202, "{result}");
            let task = &result["task"];
            let due = parse_epoch_ms(task["deliver_at"].as_str().unwrap()).unwrap();
            (task["id"].as_str().unwrap().to_owned(), due)
        })
        .collect()
}

/// Tasks per minute bucket from `from_ms`, as the forecast should count them.
fn expected(from_ms: u64, due: &[u64]) -> BTreeMap<u64, u64> {
    let mut buckets = BTreeMap::new();
    for at in due {
        *buckets.entry((at - from_ms) / MINUTE_MS).or_default() += 1;
    }
    buckets
}

/// The forecast's non-empty buckets by index, and its total.
async fn forecast(app: &TestApp, query: &str) -> (BTreeMap<u64, u64>, u64) {
    let (status, answer) = app.get(&format!("/v1/forecast?{query}")).await;
    assert_eq!(status, 200, "{answer}");
    let buckets = answer["buckets"].as_array().unwrap();
    let counts = buckets
        .iter()
        .enumerate()
        .filter(|(_, b)| b["tasks"].as_u64().unwrap() > 0)
        .map(|(i, b)| (i as u64, b["tasks"].as_u64().unwrap()))
        .collect();
    (counts, answer["total"].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forecast_counts_what_falls_due_and_follows_cancels_and_moves_on_sqlite() {
    use delayline::auth::token::hash_hex;
    use delayline::auth::{ClientSettings, TokenHashes};
    let mut settings = settings(Backend::Sqlite);
    let prefix = settings.cascade.prefix.clone();
    let client = |name: &str, destinations: &str, permissions: &[&str]| ClientSettings {
        name: name.to_owned(),
        token_sha256: TokenHashes::One(hash_hex(&format!("tok-{name}"))),
        destinations: vec![destinations.to_owned()],
        permissions: permissions.iter().map(|p| (*p).to_owned()).collect(),
        ..ClientSettings::default()
    };
    settings.auth.clients = vec![
        client("root", "#", &["admin"]),
        client("billing", &format!("{prefix}.a.#"), &["read"]),
    ];
    let mut app = TestApp::spawn(settings.clone()).await;
    app.http = bearer_client("tok-root");
    let from_ms = now_ms() / MINUTE_MS * MINUTE_MS;
    let a: Vec<u64> = (0..40).map(|i| 150 + i * 7).collect();
    let b: Vec<u64> = (0..10).map(|i| 1_800 + i * 30).collect();
    let a = submit(&app, &format!("{prefix}.a.x"), &a).await;
    let b = submit(&app, &format!("{prefix}.b.x"), &b).await;
    let window = format!(
        "from={}&to={}&destination={prefix}.%23",
        format_epoch_ms(from_ms),
        format_epoch_ms(from_ms + 60 * MINUTE_MS)
    );
    let query = format!("{window}&bucket=1m");
    let due = |tasks: &[(String, u64)]| tasks.iter().map(|(_, at)| *at).collect::<Vec<_>>();
    let all: Vec<u64> = due(&a).into_iter().chain(due(&b)).collect();
    assert_eq!(forecast(&app, &query).await, (expected(from_ms, &all), 50));

    // Cancelled tasks leave it; a moved one changes minute.
    let cancelled: Vec<&String> = a.iter().take(10).map(|(id, _)| id).collect();
    let (status, answer) = app
        .post("/v1/tasks/cancel", &json!({"ids": cancelled}))
        .await;
    assert_eq!(status, 200, "{answer}");
    let (status, moved) = app
        .patch(&format!("/v1/tasks/{}", b[0].0), &json!({"delay": "200s"}))
        .await;
    assert_eq!(status, 200, "{moved}");
    let moved_to = parse_epoch_ms(moved["deliver_at"].as_str().unwrap()).unwrap();
    let mut now_due: Vec<u64> = due(&a[10..]).into_iter().chain(due(&b[1..])).collect();
    now_due.push(moved_to);
    assert_eq!(
        forecast(&app, &query).await,
        (expected(from_ms, &now_due), 40)
    );
    let (hourly, total) = forecast(&app, &format!("{window}&bucket=1h")).await;
    assert_eq!((hourly, total), (BTreeMap::from([(0, 40)]), 40));

    // A client counts its own destinations only, whatever it asks.
    let billing = bearer_client("tok-billing");
    let scoped: Value = billing
        .get(format!("{}/v1/forecast?{query}", app.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(scoped["total"], 30, "{scoped}");

    // The gauges and the console's chart say the same.
    eventually("the due-soon gauge counts them", async || {
        sample(&app.scrape().await, "delayline_tasks_due_next_hour") == Some(40.0)
    })
    .await;
    let console = Browser::sign_in(&app, "tok-root").await;
    let (status, page) = console.get("/console").await;
    assert_eq!(status, 200);
    assert!(
        page.contains("Next hour, by minute: 40 tasks")
            && page.contains("Next day, by hour: 40 tasks"),
        "{page}"
    );

    // The command line says the same.
    let pattern = format!("{prefix}.#");
    let args = ["forecast", "--bucket", "1h", "--destination", &pattern];
    let printed = crate::common::cli_as(&settings, &app.base, "tok-billing", &args).await;
    assert!(printed.ends_with("total\t30\n"), "{printed}");

    // Refusals name the parameter.
    for (bad, field) in [
        ("bucket=90s", "bucket"),
        ("from=yesterday", "from"),
        ("to=2020-01-01T00:00:00Z", "to"),
        ("destination=a..b", "destination"),
        ("bucket=1m&to=2099-01-01T00:00:00Z", "to"),
        ("colour=red", "unknown field"),
    ] {
        let (status, answer) = app.get(&format!("/v1/forecast?{bad}")).await;
        assert_eq!(
            (status, &answer["error"]["code"]),
            (400, &json!("invalid_query")),
            "{bad}: {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{bad}: {message}");
    }

    // Delivered tasks leave it: the ledger's writer counts them out itself
    // (it runs without the triggers), in the commit that marks them.
    let mut consumer = TestConsumer::bind(&mut app, &format!("{prefix}.c.#")).await;
    let soon = submit(&app, &format!("{prefix}.c.x"), &[3, 3, 4]).await;
    assert_eq!(forecast(&app, &query).await.1, 43);
    let ids: HashSet<String> = soon.iter().map(|(id, _)| id.clone()).collect();
    consumer
        .expect_each_once_never_early(ids, Duration::from_secs(30))
        .await;
    eventually("delivered tasks leave the forecast", async || {
        forecast(&app, &query).await.1 == 40
    })
    .await;
    for (id, _) in &soon {
        let (_, task) = app.get(&format!("/v1/tasks/{id}")).await;
        assert_eq!(task["state"], "delivered", "{task}");
    }
}

/// Two replicas on one PostgreSQL ledger: tasks submitted through either
/// are counted by both at once (the unfolded changes are read too), and
/// a cancel and a move count at once, and the fold leaves the counts the
/// same and the changes empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_postgresql_read_one_forecast_and_fold_its_changes() {
    let settings = settings(Backend::Postgres);
    let prefix = settings.cascade.prefix.clone();
    let schema = prefix.replace('-', "_");
    let first = TestApp::spawn(settings.clone()).await;
    let second = TestApp::start_sharing(settings).await;
    second.wait_ready().await;
    let from_ms = now_ms() / MINUTE_MS * MINUTE_MS;
    let mut due = Vec::new();
    for (app, offset) in [(&first, 150), (&second, 400)] {
        let delays: Vec<u64> = (0..25).map(|i| offset + i * 11).collect();
        due.extend(submit(app, &format!("{prefix}.x"), &delays).await);
    }
    let at: Vec<u64> = due.iter().map(|(_, at)| *at).collect();
    let query = format!(
        "from={}&to={}&bucket=1m",
        format_epoch_ms(from_ms),
        format_epoch_ms(from_ms + 60 * MINUTE_MS)
    );
    for app in [&first, &second] {
        assert_eq!(forecast(app, &query).await, (expected(from_ms, &at), 50));
    }
    let (status, answer) = second
        .post("/v1/tasks/cancel", &json!({"ids": [due[0].0, due[30].0]}))
        .await;
    assert_eq!(status, 200, "{answer}");
    let unfolded = || {
        let output = std::process::Command::new("psql")
            .args([
                crate::common::POSTGRES_URL,
                "-tAc",
                &format!("SELECT COUNT(*) FROM {schema}.due_changes"),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    let (status, moved) = first
        .patch(
            &format!("/v1/tasks/{}", due[1].0),
            &json!({"delay": "3000s"}),
        )
        .await;
    assert_eq!(status, 200, "{moved}");
    let moved_to = parse_epoch_ms(moved["deliver_at"].as_str().unwrap()).unwrap();
    eventually("every change is folded", async || unfolded() == "0").await;
    let mut left: Vec<u64> = at
        .iter()
        .enumerate()
        .filter(|(i, _)| ![0, 1, 30].contains(i))
        .map(|(_, at)| *at)
        .collect();
    left.push(moved_to);
    for app in [&first, &second] {
        assert_eq!(forecast(app, &query).await, (expected(from_ms, &left), 48));
    }
    drop(second);
}

/// A pattern's forecast counts exactly its destinations' tasks in the
/// current minute. First only its own are due in the window (some waiting
/// behind a paused limit) while tasks of new destinations are admitted into
/// that minute and cancelled, again and again, as the forecast is read:
/// read apart, the destinations and their counts let such a task in (44
/// where 37 were due, once seen). Then tasks of other destinations fall due
/// in the same minute beside them, waiting behind a limit too. On both
/// ledgers (on PostgreSQL a cancelled destination stays listed, at 0, until
/// its minute is past, so the first phase races only once there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patterns_forecast_counts_only_its_destinations_while_others_fall_due_beside_them() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        counts_only_its_destinations(backend).await;
    }
}

async fn counts_only_its_destinations(backend: Backend) {
    let app = TestApp::spawn(settings(backend)).await;
    // All of it in one minute: the current one, with 25 s of it left at least.
    while now_ms() % MINUTE_MS > 35_000 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let minute = now_ms() - now_ms() % MINUTE_MS;
    let later_s = (minute + 58_000 - now_ms()) / 1000;
    for (name, pattern) in [("x-held", "x.held"), ("other-held", "other.held")] {
        let limit = json!({"destinations": pattern, "paused": true});
        let (status, body) = app.put(&format!("/v1/limits/{name}"), &limit).await;
        assert_eq!(status, 201, "{body}");
    }
    submit(&app, "x.held", &[0; 3]).await;
    submit(&app, "x.soon", &[later_s; 4]).await;
    let waiting = async |count: usize| {
        eventually("the held tasks wait", async || {
            let (_, held) = app.get("/v1/tasks?state=waiting").await;
            held["tasks"].as_array().is_some_and(|t| t.len() == count)
        })
        .await
    };
    waiting(3).await;
    let only_x = |(buckets, total): (BTreeMap<u64, u64>, u64)| {
        assert_eq!(total, 7, "{backend:?}: {buckets:?}");
        assert_eq!(buckets.get(&0), Some(&7), "{backend:?}: {buckets:?}");
    };
    let star = format!("from={}&destination=x.%2A", format_epoch_ms(minute));
    let hash = format!("from={}&destination=x.%23", format_epoch_ms(minute));
    let admitting = async {
        for n in 0..40 {
            for (id, _) in submit(&app, &format!("new{n}.d"), &[later_s; 7]).await {
                assert_eq!(app.delete(&format!("/v1/tasks/{id}")).await.0, 200);
            }
        }
    };
    let reading = async {
        for _ in 0..80 {
            only_x(forecast(&app, &star).await);
            only_x(forecast(&app, &hash).await);
        }
    };
    tokio::join!(admitting, reading);

    submit(&app, "other.held", &[0; 5]).await;
    submit(&app, "other.soon", &[later_s; 2]).await;
    waiting(8).await;
    only_x(forecast(&app, &star).await);
    only_x(forecast(&app, &hash).await);
    let (_, total) = forecast(&app, &format!("from={}", format_epoch_ms(minute))).await;
    assert_eq!(total, 14, "{backend:?}: every destination's");
    assert!(now_ms() < minute + 58_000, "the test ran past its minute");
}
