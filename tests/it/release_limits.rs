//! Release limits against the real broker, on the default configuration
//! (quorum queues, the SQLite ledger, 100 ms units; PostgreSQL for
//! replicas): a paced destination beside a free one, pause and resume with
//! waiting tasks cancelled and moved, a consumer queue's depth holding the
//! release, two replicas obeying one rate with one of them killed, and
//! every refusal.

use std::collections::HashSet;
use std::time::Duration;

use delayline::cascade::QueueType;
use delayline::clock::format_epoch_ms;
use delayline::config::Settings;
use delayline::message::DELIVER_AT_HEADER;
use delayline::testkit::now_ms;
use serde_json::{Value, json};

use crate::common::{
    Backend, Received, TestApp, TestConsumer, amqp_uri, eventually, free_port, queue_depth, sample,
    spawn_binary, test_settings, wait_ready_at, with_ledger,
};

fn default_settings(backend: Backend) -> Settings {
    with_ledger(test_settings(8, 100, QueueType::Quorum), backend)
}

/// Submits a task to `destination` due at each of `due_ms`, in batches;
/// their ids.
async fn submit_due(app: &TestApp, destination: &str, due_ms: &[u64]) -> Vec<String> {
    let mut ids = Vec::new();
    for chunk in due_ms.chunks(1000) {
        let tasks: Vec<Value> = chunk
            .iter()
            .map(|at| json!({"destination": destination, "deliver_at": format_epoch_ms(*at)}))
            .collect();
        let (status, answer) = app.post("/v1/tasks/batch", &json!({"tasks": tasks})).await;
        assert_eq!(status, 200, "{answer}");
        for result in answer["results"].as_array().unwrap() {
            assert_eq!(result["status"], 202, "{result}");
            ids.push(result["task"]["id"].as_str().unwrap().to_owned());
        }
    }
    ids
}

/// Receives `count` messages, each within `wait` of the one before.
async fn receive(consumer: &mut TestConsumer, count: usize, wait: Duration) -> Vec<Received> {
    let mut received = Vec::with_capacity(count);
    while received.len() < count {
        let message = consumer
            .next(wait)
            .await
            .unwrap_or_else(|| panic!("{} of {count} arrived", received.len()));
        received.push(message);
    }
    received
}

/// None early, each once, all of `ids`.
fn assert_once_never_early(received: &[Received], ids: &[String]) {
    let mut seen = HashSet::new();
    for message in received {
        let due = message.header_i64(DELIVER_AT_HEADER).unwrap();
        assert!(
            message.received_at_ms as i64 >= due,
            "early by {} ms",
            due - message.received_at_ms as i64
        );
        assert!(seen.insert(message.message_id()), "delivered twice");
    }
    let expected: HashSet<String> = ids.iter().cloned().collect();
    assert_eq!(seen, expected);
}

/// The most arrivals in any window of `window_ms` (consumer's clock).
fn most_in_window(received: &[Received], window_ms: u64) -> usize {
    let mut at: Vec<u64> = received.iter().map(|m| m.received_at_ms).collect();
    at.sort_unstable();
    let mut most = 0;
    let mut start = 0;
    for end in 0..at.len() {
        while at[end] - at[start] >= window_ms {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

async fn limit(app: &TestApp, name: &str) -> Value {
    let (status, body) = app.get(&format!("/v1/limits/{name}")).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The limit is paused until all 3,000 wait in the ledger, then resumed:
/// what the limiter releases is then in due order. With the rate alone from
/// the start, the broker's dead-lettering, seconds behind on a loaded 4.3,
/// brought a task to the release stage after later ones had been released
/// (197 ms of due time apart, once in CI): no limiter can order a task it
/// has not seen. The rate under a live cascade is also shown by
/// `two_replicas_obey_one_rate_and_a_killed_one_loses_nothing`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_destination_arrives_at_its_rate_in_due_order_and_another_on_time() {
    let mut app = TestApp::spawn(default_settings(Backend::Sqlite)).await;
    let (status, body) = app
        .put(
            "/v1/limits/paced",
            &json!({"destinations": "paced", "rate_per_sec": 200, "burst": 50, "paused": true}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        (body["rate_per_sec"].as_f64(), body["burst"].as_u64()),
        (Some(200.0), Some(50))
    );
    let key = app.cascade.binding_key("paced");
    let mut paced = TestConsumer::bind(&mut app, &key).await;
    let key = app.cascade.binding_key("free");
    let mut free = TestConsumer::bind(&mut app, &key).await;

    // 3,000 due within one second, and 100 for a destination without a limit.
    let start = now_ms() + 5_000;
    let due: Vec<u64> = (0..3_000).map(|n| start + n / 3).collect();
    let paced_ids = submit_due(&app, "paced", &due).await;
    let free_ids = submit_due(&app, "free", &vec![start; 100]).await;

    let on_time = receive(&mut free, 100, Duration::from_secs(15)).await;
    assert_once_never_early(&on_time, &free_ids);
    let latest = on_time.iter().map(|m| m.received_at_ms).max().unwrap();
    assert!(
        latest < start + 2_000,
        "the free destination waited {} ms",
        latest - start
    );
    eventually("every paced task waits", async || {
        limit(&app, "paced").await["waiting"] == 3_000
    })
    .await;
    assert!(paced.next(Duration::from_millis(100)).await.is_none());
    let (status, resumed) = app.post("/v1/limits/paced/resume", &json!({})).await;
    assert_eq!(status, 200, "{resumed}");

    // While it paces: tasks wait, and say for which limit.
    let status = limit(&app, "paced").await;
    assert!(status["waiting"].as_u64().unwrap() > 0, "{status}");
    assert_eq!(status["holds"], "rate", "{status}");
    let (_, waiting) = app.get("/v1/tasks?state=waiting&limit=1").await;
    let task = &waiting["tasks"][0];
    assert_eq!(
        (&task["state"], &task["waited_for"]),
        (&json!("waiting"), &json!("paced"))
    );
    // The field's old name, kept for a release (CHANGELOG.md).
    assert_eq!(task["held_by"], task["waited_for"]);

    let received = receive(&mut paced, 3_000, Duration::from_secs(5)).await;
    assert_once_never_early(&received, &paced_ids);
    assert!(paced.next(Duration::from_secs(1)).await.is_none());
    // 200/s plus the burst in any window, and 250 ms of the rate (50) for
    // the broker's delivery jitter: the consumer can see a release's
    // messages late, bunched with the next (seen: up to 36 over in a second,
    // on a loaded machine). The bucket itself is proven exact in
    // `limit::tests`.
    let most = most_in_window(&received, 1_000);
    assert!(most <= 200 + 50 + 50, "{most} arrived within one second");
    let most_in_5s = most_in_window(&received, 5_000);
    assert!(
        most_in_5s <= 1_000 + 50 + 50,
        "{most_in_5s} arrived within 5 s"
    );
    let first = received.iter().map(|m| m.received_at_ms).min().unwrap();
    let last = received.iter().map(|m| m.received_at_ms).max().unwrap();
    assert!(
        last - first >= 13_000,
        "3,000 at 200/s after a burst of 50 took {} ms",
        last - first
    );
    // In due order, but for the tasks of one pass (at most the burst, 17 ms
    // of due time), published side by side.
    let mut latest_due = 0;
    for message in &received {
        let due = message.header_i64(DELIVER_AT_HEADER).unwrap() as u64;
        assert!(due + 100 >= latest_due, "due {due} after {latest_due}");
        latest_due = latest_due.max(due);
    }
    eventually("the limit counts what it released", async || {
        let status = limit(&app, "paced").await;
        status["waiting"] == 0 && status["released"] == 3_000
    })
    .await;
    // How long they waited, under the histogram's name and its deprecated
    // one (CHANGELOG.md), which dashboards and alerts may still read.
    let scrape = app.scrape().await;
    let waited = sample(&scrape, "delayline_limit_waited_seconds_count");
    assert!(waited.is_some_and(|count| count >= 3_000.0), "{waited:?}");
    assert_eq!(
        sample(&scrape, "delayline_limit_held_seconds_count"),
        waited
    );
    println!(
        "paced: 3,000 over {} ms, at most {most} in a second",
        last - first
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_tasks_wait_can_be_cancelled_and_moved_and_all_arrive_once_after_resume() {
    let mut app = TestApp::spawn(default_settings(Backend::Sqlite)).await;
    let key = app.cascade.binding_key("held");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    let (status, body) = app
        .put(
            "/v1/limits/held",
            &json!({"destinations": "held", "paused": true}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let ids = submit_due(&app, "held", &[now_ms() + 500; 20]).await;
    eventually("every due task waits", async || {
        limit(&app, "held").await["waiting"] == 20
    })
    .await;
    let status = limit(&app, "held").await;
    assert_eq!(status["holds"], "paused", "{status}");
    assert!(consumer.next(Duration::from_millis(500)).await.is_none());

    // A waiting task is cancelled, and another moved (it waits again when due).
    let (status, cancelled) = app.delete(&format!("/v1/tasks/{}", ids[0])).await;
    assert_eq!(
        (status, &cancelled["state"]),
        (200, &json!("cancelled")),
        "{cancelled}"
    );
    let (status, moved) = app
        .patch(&format!("/v1/tasks/{}", ids[1]), &json!({"delay": "1s"}))
        .await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["revision"], 2);
    eventually("the moved task waits again", async || {
        let (_, task) = app.get(&format!("/v1/tasks/{}", ids[1])).await;
        task["state"] == "waiting"
    })
    .await;
    assert!(consumer.next(Duration::from_millis(300)).await.is_none());

    let (status, resumed) = app.post("/v1/limits/held/resume", &json!({})).await;
    assert_eq!(status, 200, "{resumed}");
    let received = receive(&mut consumer, 19, Duration::from_secs(10)).await;
    assert_once_never_early(&received, &ids[1..]);
    assert!(
        consumer.next(Duration::from_secs(1)).await.is_none(),
        "the cancelled one"
    );
    let (_, task) = app.get(&format!("/v1/tasks/{}", ids[0])).await;
    assert_eq!(task["state"], "cancelled");

    // Paused until a time: nothing goes before it.
    let until = now_ms() + 2_000;
    let (status, body) = app
        .put(
            "/v1/limits/held",
            &json!({"destinations": "held", "paused_until": format_epoch_ms(until)}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let later = submit_due(&app, "held", &[now_ms() + 300; 5]).await;
    let received = receive(&mut consumer, 5, Duration::from_secs(10)).await;
    assert_once_never_early(&received, &later);
    assert!(received.iter().all(|m| m.received_at_ms >= until));
    let (status, _) = app.delete("/v1/limits/held").await;
    assert_eq!(status, 204);
    assert_eq!(app.get("/v1/limits/held").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_queue_at_its_bound_holds_the_release_until_it_drains() {
    let mut app = TestApp::spawn(default_settings(Backend::Sqlite)).await;
    let queue = format!("{}.deep-consumer", app.cascade.business_exchange());
    // Deleted with the chain, even if the test fails.
    app.cleanup.queues.push(queue.clone());
    let connection = delayline::broker::connect(amqp_uri(), "limits test")
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(
            queue.as_str().into(),
            lapin::options::QueueDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.as_str().into(),
            app.cascade.business_exchange().into(),
            app.cascade.binding_key("deep").as_str().into(),
            lapin::options::QueueBindOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let (status, body) = app
        .put(
            "/v1/limits/deep",
            &json!({"destinations": "deep", "max_queue_depth": {"queue": queue, "messages": 5}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let ids = submit_due(&app, "deep", &[now_ms() + 500; 20]).await;

    // The consumer takes nothing: the queue fills to its bound, and stays.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(queue_depth(&queue).await, 5);
    let status = limit(&app, "deep").await;
    assert_eq!(
        (&status["holds"], &status["waiting"]),
        (&json!("queue_depth"), &json!(15)),
        "{status}"
    );

    // It takes them again: the rest follows, never above the bound.
    let mut taken = HashSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while taken.len() < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of 20 taken",
            taken.len()
        );
        assert!(queue_depth(&queue).await <= 5);
        let got = channel
            .basic_get(
                queue.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap();
        match got {
            Some(message) => {
                let id = message
                    .delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .unwrap()
                    .to_string();
                assert!(taken.insert(id), "delivered twice");
            }
            None => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    assert_eq!(taken, ids.into_iter().collect::<HashSet<_>>());
    channel
        .queue_delete(
            queue.as_str().into(),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_limit_is_refused_with_its_field_and_nothing_changes() {
    let app = TestApp::spawn(default_settings(Backend::Sqlite)).await;
    let past = format_epoch_ms(now_ms() - 1_000);
    let long = "x".repeat(129);
    let cases = [
        ("l", json!({"destinations": "a..b"}), "/destinations"),
        (
            "l",
            json!({"destinations": "a", "rate_per_sec": 0}),
            "/rate_per_sec",
        ),
        ("l", json!({"destinations": "a", "burst": 5}), "/burst"),
        (
            "l",
            json!({"destinations": "a", "rate_per_sec": 5000, "burst": 1}),
            "/burst",
        ),
        (
            "l",
            json!({"destinations": "a", "paused_until": past}),
            "/paused_until",
        ),
        (
            "l",
            json!({"destinations": "a", "max_queue_depth": {"queue": "no-such-queue-here", "messages": 1}}),
            "/max_queue_depth/queue",
        ),
        (long.as_str(), json!({"destinations": "a"}), "name"),
    ];
    for (name, body, field) in cases {
        let (status, answer) = app.put(&format!("/v1/limits/{name}"), &body).await;
        assert_eq!(status, 422, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_limit", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("{field}:")), "{message}");
    }
    let (status, answer) = app
        .put("/v1/limits/l", &json!({"destinations": "a", "rate": 5}))
        .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (422, &json!("invalid_request"))
    );
    let (_, list) = app.get("/v1/limits").await;
    assert_eq!(list["limits"], json!([]), "nothing was set");
    for (method, path) in [
        ("get", "/v1/limits/l"),
        ("delete", "/v1/limits/l"),
        ("post", "/v1/limits/l/pause"),
    ] {
        let (status, answer) = match method {
            "get" => app.get(path).await,
            "delete" => app.delete(path).await,
            _ => app.post(path, &json!({})).await,
        };
        assert_eq!(
            (status, &answer["error"]["code"]),
            (404, &json!("limit_not_found")),
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_obey_one_rate_and_a_killed_one_loses_nothing() {
    let settings = default_settings(Backend::Postgres);
    let mut first = TestApp::spawn(settings.clone()).await;
    let port = free_port();
    let http = reqwest::Client::new();
    let mut second = spawn_binary(&settings, port);
    wait_ready_at(&http, &format!("http://127.0.0.1:{port}")).await;
    let (status, body) = first
        .put(
            "/v1/limits/shared",
            &json!({"destinations": "shared", "rate_per_sec": 100, "burst": 10}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let key = first.cascade.binding_key("shared");
    let mut consumer = TestConsumer::bind(&mut first, &key).await;
    let start = now_ms() + 3_000;
    let ids = submit_due(&first, "shared", &vec![start; 800]).await;

    // Both replicas release; one is killed halfway.
    tokio::time::sleep(Duration::from_millis(3_000 + 4_000)).await;
    second.kill().await.unwrap();
    // What it released and had not recorded waits again after its lease.
    let mut received = Vec::new();
    let mut seen = HashSet::new();
    while seen.len() < ids.len() {
        let message = consumer
            .next(Duration::from_secs(45))
            .await
            .unwrap_or_else(|| panic!("{} of {} arrived", seen.len(), ids.len()));
        seen.insert(message.message_id());
        received.push(message);
    }
    let duplicates = received.len() - seen.len();
    assert!(
        duplicates <= 10,
        "{duplicates} duplicates: more than one pass's burst"
    );
    let before_lease: Vec<Received> = received
        .into_iter()
        .filter(|m| m.received_at_ms < start + 20_000)
        .collect();
    // The rate plus the burst, and 250 ms of the rate for the broker's
    // delivery jitter, as in the single replica's test (150 ms was once
    // exceeded by one message, on RabbitMQ 4.3 in CI).
    let most = most_in_window(&before_lease, 1_000);
    assert!(
        most <= 100 + 10 + 25,
        "{most} within one second over two replicas"
    );
    let most_in_5s = most_in_window(&before_lease, 5_000);
    assert!(
        most_in_5s <= 500 + 10 + 25,
        "{most_in_5s} within 5 s over two replicas"
    );
    let expected: HashSet<String> = ids.into_iter().collect();
    assert_eq!(seen, expected);
    println!("two replicas: at most {most} a second, {duplicates} duplicates after SIGKILL");
}

/// The `limits` permission and the token's destinations decide what a
/// client sees and sets; the CLI sets, lists, pauses, resumes and deletes
/// through the API with a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_under_access_control_and_the_cli_acts_through_the_api() {
    use delayline::auth::token::hash_hex;
    use delayline::auth::{ClientSettings, TokenHashes};
    let mut settings = default_settings(Backend::Sqlite);
    let client = |name: &str, permissions: &[&str]| ClientSettings {
        name: name.to_owned(),
        token_sha256: TokenHashes::One(hash_hex(&format!("tok-{name}"))),
        destinations: vec!["billing.#".to_owned()],
        permissions: permissions.iter().map(|p| (*p).to_owned()).collect(),
        ..ClientSettings::default()
    };
    settings.auth.clients = vec![
        client("operator", &["limits"]),
        client("submitter", &["submit", "read"]),
        client("root", &["admin"]),
    ];
    let app = TestApp::spawn(settings.clone()).await;
    let put = async |token: &str, name: &str, body: Value| {
        let response = app
            .http
            .put(format!("{}/v1/limits/{name}", app.base))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap())
    };
    let get = async |token: &str, path: &str| {
        let response = app
            .http
            .get(format!("{}{path}", app.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        (
            response.status().as_u16(),
            response.json::<Value>().await.unwrap(),
        )
    };
    let (status, answer) = put("tok-submitter", "b", json!({"destinations": "billing.#"})).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (403, &json!("forbidden"))
    );
    for wider in ["#", "shipping.x", "*.invoice"] {
        let (status, answer) = put("tok-operator", "b", json!({"destinations": wider})).await;
        assert_eq!(
            (status, &answer["error"]["code"]),
            (403, &json!("forbidden_destination")),
            "{wider}"
        );
    }
    let (status, answer) = put(
        "tok-root",
        "everything",
        json!({"destinations": "#", "paused": false}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let (status, _) = get("tok-operator", "/v1/limits/everything").await;
    assert_eq!(
        status, 404,
        "a limit beyond the client's destinations is not found"
    );
    let (status, answer) = put(
        "tok-operator",
        "everything",
        json!({"destinations": "billing.#"}),
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (403, &json!("forbidden_destination"))
    );

    let cli = async |args: &[&str]| {
        crate::common::cli_as(&settings, &app.base, "tok-operator", args).await
    };
    let set = cli(&[
        "limits",
        "set",
        "invoices",
        "--destinations",
        "billing.invoice",
        "--rate",
        "0.5",
    ])
    .await;
    assert!(
        set.contains("limit invoices: holds nothing now, 0 waiting"),
        "{set}"
    );
    let paused = cli(&["limits", "pause", "invoices"]).await;
    assert!(
        paused.contains("limit invoices: paused until resumed"),
        "{paused}"
    );
    let listed = cli(&["limits", "list"]).await;
    assert!(
        listed.contains("invoices\tbilling.invoice\tpaused\t0\t0.0\t0.5"),
        "{listed}"
    );
    assert!(!listed.contains("everything"), "{listed}");
    let (_, all) = get("tok-root", "/v1/limits").await;
    assert_eq!(
        all["limits"].as_array().unwrap().len(),
        2,
        "admin sees every limit"
    );
    let resumed = cli(&["limits", "resume", "invoices"]).await;
    assert!(resumed.contains("holds nothing now"), "{resumed}");
    let deleted = cli(&["limits", "delete", "invoices"]).await;
    assert!(deleted.contains("deleted"), "{deleted}");
    assert_eq!(get("tok-operator", "/v1/limits/invoices").await.0, 404);
}

/// The limiter publishes a waiting task to the exchange the task names, on
/// a channel alone while its confirm is awaited (see `crate::broker`'s
/// returns): one the broker returns, no queue bound for its key, is parked
/// and marked unroutable, and the other is delivered, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_task_its_exchange_returns_is_parked_and_the_other_delivered() {
    let settings = default_settings(Backend::Sqlite);
    let orders = format!("{}.orders", settings.cascade.prefix);
    let mut app = TestApp::spawn(settings).await;
    app.cleanup.declare_exchange(&orders).await;
    let mut consumer =
        TestConsumer::bind_to(&mut app.cleanup, &app.cascade, &orders, "held.bound").await;
    let (status, body) = app
        .put(
            "/v1/limits/held",
            &json!({"destinations": "held.#", "paused": true}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    for (id, destination) in [("bound", "held.bound"), ("unbound", "held.unbound")] {
        let task = json!({"id": id, "destination": destination, "delay_ms": 50,
                          "exchange": orders});
        let (status, answer) = app.post("/v1/tasks", &task).await;
        assert_eq!(status, 202, "{answer}");
    }
    eventually("both tasks to wait", async || {
        limit(&app, "held").await["waiting"] == 2
    })
    .await;
    assert!(consumer.next(Duration::from_millis(300)).await.is_none());

    let (status, resumed) = app.post("/v1/limits/held/resume", &json!({})).await;
    assert_eq!(status, 200, "{resumed}");
    let message = consumer
        .next(Duration::from_secs(10))
        .await
        .expect("released to its exchange");
    assert_eq!(message.message_id(), "bound");
    eventually("the returned task to be unroutable", async || {
        app.get("/v1/tasks/unbound").await.1["state"] == "unroutable"
    })
    .await;
    eventually("the released task to be delivered", async || {
        app.get("/v1/tasks/bound").await.1["state"] == "delivered"
    })
    .await;
    assert!(
        consumer.next(Duration::from_millis(500)).await.is_none(),
        "a second copy"
    );
    drop(consumer);
    app.stop().await.unwrap();
}

/// Tasks of distinct due times wait behind a paused limit (submitted out of
/// order); once resumed they arrive in due order, as the release-control
/// page promises, on either backend's ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_tasks_are_released_in_due_order_after_a_resume() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        released_in_due_order_after_a_resume(backend).await;
    }
}

async fn released_in_due_order_after_a_resume(backend: Backend) {
    let mut app = TestApp::spawn(default_settings(backend)).await;
    let key = app.cascade.binding_key("ordered");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    let (status, body) = app
        .put(
            "/v1/limits/ordered",
            &json!({"destinations": "ordered", "paused": true}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let start = now_ms() + 400;
    // Due 30 ms apart, submitted one at a time in a scrambled order.
    let order = [5, 2, 7, 0, 3, 6, 1, 4];
    let mut due_of = std::collections::HashMap::new();
    for n in order {
        let id = submit_due(&app, "ordered", &[start + n * 30])
            .await
            .remove(0);
        due_of.insert(id, start + n * 30);
    }
    eventually("every task waits", async || {
        limit(&app, "ordered").await["waiting"] == 8
    })
    .await;
    let (status, resumed) = app.post("/v1/limits/ordered/resume", &json!({})).await;
    assert_eq!(status, 200, "{resumed}");
    let received = receive(&mut consumer, 8, Duration::from_secs(10)).await;
    let ids: Vec<String> = due_of.keys().cloned().collect();
    assert_once_never_early(&received, &ids);
    let arrived: Vec<u64> = received.iter().map(|m| due_of[&m.message_id()]).collect();
    let mut sorted = arrived.clone();
    sorted.sort_unstable();
    assert_eq!(arrived, sorted, "{backend:?}: arrived out of due order");
}
