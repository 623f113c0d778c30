//! Deadlines (issue 79): a task that could not be delivered by its
//! deadline is never published to its destination after it, and becomes
//! `expired` instead; one delivered within it is never also expired.
//! Across a paused destination, a pace limit with a backlog, a broker
//! outage longer than the deadline, and a SIGKILL at the deadline.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use delayline::cascade::QueueType;
use delayline::clock::{format_epoch_ms, parse_epoch_ms};
use delayline::message::{DEADLINE_HEADER, EXPIRED_AT_HEADER};
use delayline::testkit::now_ms;
use serde_json::{Value, json};

use crate::common::{
    Backend, Cleanup, Received, TestApp, TestConsumer, TestUser, close_connections_named,
    delayline_command, eventually, free_port, sample, serve_declared, spawn_binary, test_settings,
    wait_ready_at, with_ledger,
};

fn settings(backend: Backend) -> delayline::config::Settings {
    with_ledger(test_settings(8, 100, QueueType::Quorum), backend)
}

/// Tasks to `destination` due at `due_ms`, each with `extra` fields: their ids.
async fn submit(
    http: &reqwest::Client,
    base: &str,
    destination: &str,
    due_ms: u64,
    count: usize,
    extra: Value,
) -> Vec<String> {
    let mut task = json!({"destination": destination, "deliver_at": format_epoch_ms(due_ms)});
    for (field, value) in extra.as_object().unwrap() {
        task[field] = value.clone();
    }
    let batch = json!({"tasks": vec![task; count]});
    let answer: Value = http
        .post(format!("{base}/v1/tasks/batch"))
        .json(&batch)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let results = answer["results"].as_array().unwrap();
    results
        .iter()
        .map(|result| {
            assert_eq!(result["status"], 202, "{result}");
            result["task"]["id"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// Every task of `destination` in the ledger, by id.
async fn tasks_of(http: &reqwest::Client, base: &str, destination: &str) -> HashMap<String, Value> {
    let url = format!("{base}/v1/tasks?destination={destination}&limit=1000");
    let page: Value = http.get(url).send().await.unwrap().json().await.unwrap();
    let tasks = page["tasks"].as_array().unwrap();
    tasks
        .iter()
        .map(|task| (task["id"].as_str().unwrap().to_owned(), task.clone()))
        .collect()
}

/// What arrives within `quiet` of the one before.
async fn receive_until_quiet(consumer: &mut TestConsumer, quiet: Duration) -> Vec<Received> {
    let mut received = Vec::new();
    while let Some(message) = consumer.next(quiet).await {
        received.push(message);
    }
    received
}

/// Tasks to one destination due at one instant: with a deadline, without,
/// and with a deadline and an expired destination (`<destination>.late`),
/// and a consumer of each destination.
struct Mixed {
    due_ms: u64,
    expiring: Vec<String>,
    kept: Vec<String>,
    sent: Vec<String>,
    consumer: TestConsumer,
    late: TestConsumer,
}

impl Mixed {
    /// Due `due_in_ms` from now, each deadline `lateness_ms` after; `counts`
    /// of each kind.
    async fn submit(
        app: &mut TestApp,
        destination: &str,
        (due_in_ms, lateness_ms): (u64, u64),
        (expiring, kept, sent): (usize, usize, usize),
    ) -> Mixed {
        let key = app.cascade.binding_key(destination);
        let consumer = TestConsumer::bind(app, &key).await;
        let elsewhere = format!("{destination}.late");
        let key = app.cascade.binding_key(&elsewhere);
        let late = TestConsumer::bind(app, &key).await;
        let due_ms = now_ms() + due_in_ms;
        let (http, base) = (&app.http, &app.base);
        let lateness = json!({"max_lateness_ms": lateness_ms});
        let with_destination =
            json!({"max_lateness_ms": lateness_ms, "expired_destination": elsewhere});
        Mixed {
            due_ms,
            expiring: submit(http, base, destination, due_ms, expiring, lateness).await,
            kept: submit(http, base, destination, due_ms, kept, json!({})).await,
            sent: submit(http, base, destination, due_ms, sent, with_destination).await,
            consumer,
            late,
        }
    }
}

fn epoch_ms(view: &Value, field: &str) -> u64 {
    parse_epoch_ms(
        view[field]
            .as_str()
            .unwrap_or_else(|| panic!("{field}: {view}")),
    )
    .unwrap()
}

/// The answer and `GET` show the deadline; a move keeps how late the task
/// may be; one before the due time is refused. On both ledgers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_is_shown_moved_with_its_task_and_refused_before_the_due_time() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let app = TestApp::spawn(settings(backend)).await;
        let task = json!({"destination": "late", "delay": "10s", "max_lateness": "5s",
                          "id": "late-1"});
        let (status, accepted) = app.post("/v1/tasks", &task).await;
        assert_eq!(status, 202, "{accepted}");
        let allowed = |view: &Value| epoch_ms(view, "deadline") - epoch_ms(view, "deliver_at");
        assert_eq!(allowed(&accepted), 5_000, "{backend:?}: {accepted}");
        let (_, stored) = app.get("/v1/tasks/late-1").await;
        assert_eq!(stored["deadline"], accepted["deadline"], "{stored}");
        let (status, moved) = app
            .patch("/v1/tasks/late-1", &json!({"delay": "20s"}))
            .await;
        assert_eq!(status, 200, "{moved}");
        let (_, stored) = app.get("/v1/tasks/late-1").await;
        assert_eq!(allowed(&stored), 5_000, "{backend:?}: {stored}");
        assert!(epoch_ms(&stored, "deadline") > epoch_ms(&accepted, "deadline") + 8_000);

        let before = format_epoch_ms(now_ms() + 5_000);
        let early = json!({"destination": "late", "delay": "10s", "deadline": before});
        let (status, refused) = app.post("/v1/tasks", &early).await;
        assert_eq!(status, 422, "{refused}");
        assert_eq!(refused["error"]["code"], "invalid_deadline", "{refused}");
        let plain = json!({"destination": "late", "delay": "10s"});
        let (_, plain) = app.post("/v1/tasks", &plain).await;
        assert!(plain.get("deadline").is_none(), "{plain}");
        app.stop().await.unwrap();
    }
}

/// A paused destination: the tasks with a deadline expire where they wait,
/// soon after it and never before; those without wait on and arrive once
/// the limit resumes; none that expired ever arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_behind_a_paused_limit_expire_at_their_deadline_and_never_arrive() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let mut app = TestApp::spawn(settings(backend)).await;
        let limit = json!({"destinations": "held", "paused": true});
        let (status, body) = app.put("/v1/limits/held", &limit).await;
        assert_eq!(status, 201, "{body}");
        let Mixed {
            expiring,
            kept,
            sent,
            mut consumer,
            mut late,
            ..
        } = Mixed::submit(&mut app, "held", (1_500, 1_000), (20, 5, 5)).await;

        eventually("the tasks with a deadline expire", async || {
            let tasks = tasks_of(&app.http, &app.base, "held").await;
            expiring
                .iter()
                .chain(&sent)
                .all(|id| tasks[id]["state"] == "expired")
        })
        .await;
        assert_sent_expired(&mut late, &sent, "held.late").await;
        let tasks = tasks_of(&app.http, &app.base, "held").await;
        for id in &expiring {
            let task = &tasks[id];
            let (deadline, expired_at) = (epoch_ms(task, "deadline"), epoch_ms(task, "expired_at"));
            assert!(expired_at > deadline, "{backend:?}: expired early: {task}");
            assert!(
                expired_at < deadline + 2_000,
                "{backend:?}: expired late: {task}"
            );
            let why = task["last_error"].as_str().unwrap();
            assert!(why.contains("release limit held"), "{why}");
        }
        assert!(kept.iter().all(|id| tasks[id]["state"] == "waiting"));
        let replay = replay_one_of(&app, &expiring[0], &kept[0]).await;

        let (status, _) = app.post("/v1/limits/held/resume", &json!({})).await;
        assert_eq!(status, 200);
        let received = receive_until_quiet(&mut consumer, Duration::from_secs(3)).await;
        let arrived: HashSet<String> = received.iter().map(Received::message_id).collect();
        let mut expected: HashSet<String> = kept.iter().cloned().collect();
        expected.insert(replay);
        assert_eq!(arrived, expected, "{backend:?}");
        let scrape = app.scrape().await;
        let waiting = sample(&scrape, "delayline_tasks_expired_total{path=\"waiting\"}");
        assert_eq!(waiting, Some(20.0), "{backend:?}");
        let limiter = sample(&scrape, "delayline_tasks_expired_total{path=\"limiter\"}");
        assert_eq!(limiter, Some(5.0), "{backend:?}");
        app.stop().await.unwrap();
    }
}

/// Each of `sent` (expired, with `destination` as their expired
/// destination) arrives there once, after its deadline, marked when it
/// expired; the ledger says where it went.
async fn assert_sent_expired(consumer: &mut TestConsumer, sent: &[String], destination: &str) {
    let received = receive_until_quiet(consumer, Duration::from_secs(3)).await;
    let arrived: Vec<String> = received.iter().map(Received::message_id).collect();
    let mut expected = sent.to_vec();
    let mut sorted = arrived.clone();
    expected.sort();
    sorted.sort();
    assert_eq!(
        sorted, expected,
        "each expired task's message sent to {destination} once"
    );
    for message in &received {
        assert_eq!(message.routing_key, destination);
        let deadline = message.header_i64(DEADLINE_HEADER).unwrap();
        let expired_at = message.header_i64(EXPIRED_AT_HEADER).unwrap();
        assert!(
            expired_at > deadline,
            "expired at {expired_at}, deadline {deadline}"
        );
        assert!(message.header("x-delayline-expired-to").is_none());
    }
}

/// Replays `expired` (once: a second replay answers the first) through
/// the API and the command line, which also lists it; `waiting` is not
/// expired and is not replayed. The replay's id.
async fn replay_one_of(app: &TestApp, expired: &str, waiting: &str) -> String {
    let path = format!("/v1/tasks/{expired}/replay");
    let response = app
        .http
        .post(format!("{}{path}", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    assert!(response.headers().get("idempotent-replayed").is_none());
    let replay: Value = response.json().await.unwrap();
    assert_eq!(replay["id"], format!("{expired}~replay"), "{replay}");
    assert!(replay.get("deadline").is_none(), "{replay}");
    let listed = cli(app, &["tasks", "expired", "--destination", "held"]).await;
    assert!(listed.contains(expired), "{listed}");
    assert!(listed.contains("release limit held"), "{listed}");
    let again = cli(app, &["tasks", "replay", expired]).await;
    assert!(again.contains(&format!("as {expired}~replay")), "{again}");
    let response = app
        .http
        .post(format!("{}{path}", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    let (status, refused) = app
        .post(&format!("/v1/tasks/{waiting}/replay"), &json!({}))
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "task_not_expired");
    replay["id"].as_str().unwrap().to_owned()
}

/// `delayline ARGS --url` against `app`: what it printed.
async fn cli(app: &TestApp, args: &[&str]) -> String {
    let args = [args, &["--url", app.base.as_str()]].concat();
    let output = delayline_command(&app.settings, &args)
        .output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    printed
}

/// A pace limit with a backlog: what it lets go by the deadline arrives
/// (published before it), the rest expires; every task is one or the
/// other, none both, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_backlog_delivers_what_it_can_by_the_deadline_and_expires_the_rest() {
    let mut app = TestApp::spawn(settings(Backend::Sqlite)).await;
    let limit = json!({"destinations": "paced", "rate_per_sec": 20, "burst": 5});
    let (status, body) = app.put("/v1/limits/paced", &limit).await;
    assert_eq!(status, 201, "{body}");
    let key = app.cascade.binding_key("paced");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    let due_ms = now_ms() + 2_000;
    let lateness = json!({"max_lateness_ms": 1_000});
    let ids = submit(&app.http, &app.base, "paced", due_ms, 80, lateness).await;

    let received = receive_until_quiet(&mut consumer, Duration::from_secs(4)).await;
    eventually("every task is delivered or expired", async || {
        let tasks = tasks_of(&app.http, &app.base, "paced").await;
        ids.iter()
            .all(|id| matches!(tasks[id]["state"].as_str(), Some("delivered" | "expired")))
    })
    .await;
    let tasks = tasks_of(&app.http, &app.base, "paced").await;
    assert_outcomes(&tasks, &ids, &received, &HashSet::new());
    let delivered = received.len();
    assert!(
        delivered >= 5 && delivered < ids.len(),
        "{delivered} of {} delivered",
        ids.len()
    );
    app.stop().await.unwrap();
}

/// Each of `ids` delivered or expired, never both (but for those in
/// `in_doubt`: published by a replica killed before it recorded them);
/// each arrival once, at most a moment after its deadline (published
/// before it; the confirm and the consumer's delivery come after).
fn assert_outcomes(
    tasks: &HashMap<String, Value>,
    ids: &[String],
    received: &[Received],
    in_doubt: &HashSet<String>,
) {
    let mut arrived = HashSet::new();
    for message in received {
        let id = message.message_id();
        assert!(arrived.insert(id.clone()), "{id} arrived twice");
        let deadline = message.header_i64(DEADLINE_HEADER).unwrap() as u64;
        assert!(
            message.received_at_ms <= deadline + 500,
            "{id} arrived {} ms after its deadline",
            message.received_at_ms - deadline
        );
    }
    for id in ids {
        let state = tasks[id]["state"].as_str().unwrap();
        match (state, arrived.contains(id)) {
            ("delivered", true) | ("expired", false) => {}
            ("expired", true) if in_doubt.contains(id) => {}
            (state, arrived) => panic!("{id}: {state}, arrived: {arrived}: {}", tasks[id]),
        }
    }
}

/// The broker away for longer than the tasks' deadline: once it is back,
/// the tasks with a deadline come out of the cascade expired, never
/// published; the others arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_a_broker_outage_longer_than_the_deadline_tasks_expire_and_never_arrive() {
    let user = TestUser::create();
    let mut settings = settings(Backend::Sqlite);
    settings.amqp.uri = user.uri().into();
    settings.amqp.reconnect_max_backoff_ms = 200;
    let mut app = TestApp::spawn(settings).await;
    let Mixed {
        due_ms,
        expiring,
        kept,
        sent,
        mut consumer,
        mut late,
    } = Mixed::submit(&mut app, "away", (2_000, 500), (10, 10, 5)).await;
    eventually("every task is in the cascade", async || {
        let tasks = tasks_of(&app.http, &app.base, "away").await;
        tasks.len() == 25 && tasks.values().all(|task| task["state"] == "scheduled")
    })
    .await;

    user.revoke();
    close_connections_named(&format!("delayline {}", app.cascade.prefix()));
    eventually("the service notices it lost the broker", async || {
        app.get("/readyz").await.1["broker"] == "disconnected"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(
        (due_ms + 2_000).saturating_sub(now_ms()),
    ))
    .await;
    user.grant();

    let received = receive_until_quiet(&mut consumer, Duration::from_secs(8)).await;
    let arrived: HashSet<String> = received.iter().map(Received::message_id).collect();
    assert_eq!(arrived, kept.iter().cloned().collect::<HashSet<_>>());
    eventually("the tasks with a deadline are expired", async || {
        let tasks = tasks_of(&app.http, &app.base, "away").await;
        expiring
            .iter()
            .chain(&sent)
            .all(|id| tasks[id]["state"] == "expired")
    })
    .await;
    assert_sent_expired(&mut late, &sent, "away.late").await;
    let (_, one) = app.get(&format!("/v1/tasks/{}", sent[0])).await;
    let why = one["last_error"].as_str().unwrap();
    assert!(
        why.ends_with("its message was sent to away.late instead"),
        "{why}"
    );
    assert_eq!(one["expired_destination"], "away.late", "{one}");
    let scrape = app.scrape().await;
    let expired = sample(&scrape, "delayline_tasks_expired_total{path=\"release\"}");
    assert_eq!(expired, Some(15.0));
    app.stop().await.unwrap();
}

/// A paced backlog whose replica is killed at the deadline and started
/// again: nothing is published after the deadline, every task is delivered
/// or expired, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_at_the_deadline_publishes_nothing_after_it_and_loses_nothing() {
    let settings = settings(Backend::Sqlite);
    let cascade = settings.cascade().unwrap();
    let mut cleanup = Cleanup::for_settings(&settings);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut child = serve_declared(&settings, port, &http, &base).await;
    let limit = json!({"destinations": "killed", "rate_per_sec": 10, "burst": 2});
    let put = http.put(format!("{base}/v1/limits/killed")).json(&limit);
    assert_eq!(put.send().await.unwrap().status(), 201);
    let key = cascade.binding_key("killed");
    let exchange = cascade.business_exchange();
    let mut consumer = TestConsumer::bind_to(&mut cleanup, &cascade, exchange, &key).await;
    let due_ms = now_ms() + 2_000;
    let lateness = json!({"max_lateness_ms": 2_000});
    let ids = submit(&http, &base, "killed", due_ms, 60, lateness).await;

    // Killed at the deadline, in the middle of the limiter's releases.
    let mut received = Vec::new();
    while now_ms() < due_ms + 2_000 {
        received.extend(consumer.next(Duration::from_millis(50)).await);
    }
    child.kill().await.unwrap();
    let mut child = spawn_binary(&settings, port);
    wait_ready_at(&http, &base).await;
    received.extend(receive_until_quiet(&mut consumer, Duration::from_secs(3)).await);
    eventually("every task is delivered or expired", async || {
        let tasks = tasks_of(&http, &base, "killed").await;
        ids.iter()
            .all(|id| matches!(tasks[id]["state"].as_str(), Some("delivered" | "expired")))
    })
    .await;
    let tasks = tasks_of(&http, &base, "killed").await;
    // Published, and killed before the confirm was recorded: the ledger
    // cannot know it arrived (at-least-once), and expires it past its
    // deadline instead of publishing it again.
    let in_doubt: HashSet<String> = received
        .iter()
        .map(Received::message_id)
        .filter(|id| tasks[id]["state"] == "expired")
        .collect();
    assert_outcomes(&tasks, &ids, &received, &in_doubt);
    println!(
        "killed at the deadline: {} of {} delivered, {} expired after they arrived",
        received.len(),
        ids.len(),
        in_doubt.len()
    );
    assert!(in_doubt.len() <= 5, "{in_doubt:?}");
    child.kill().await.unwrap();
}

/// A schedule's occurrences carry its `max_lateness_ms`: each is a task
/// with a deadline that far after its moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedules_occurrences_carry_its_deadline() {
    let mut app = TestApp::spawn(settings(Backend::Sqlite)).await;
    let key = app.cascade.binding_key("reminders");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    let body = json!({"id": "remind", "destination": "reminders", "every": "1s",
                      "max_lateness_ms": 3_000});
    let (status, schedule) = app.post("/v1/schedules", &body).await;
    assert_eq!(status, 201, "{schedule}");
    assert_eq!(schedule["max_lateness_ms"], 3_000, "{schedule}");
    let message = consumer.next(Duration::from_secs(10)).await.unwrap();
    let due = message
        .header_i64(delayline::message::DELIVER_AT_HEADER)
        .unwrap();
    assert_eq!(message.header_i64(DEADLINE_HEADER), Some(due + 3_000));
    let (_, task) = app
        .get(&format!("/v1/tasks/{}", message.message_id()))
        .await;
    assert_eq!(epoch_ms(&task, "deadline"), due as u64 + 3_000, "{task}");
    let (status, _) = app.delete("/v1/schedules/remind").await;
    assert_eq!(status, 204);
    app.stop().await.unwrap();
}

/// The console's Problems page lists an expired task with why; its page
/// says when its deadline was and offers its replay, which makes the new
/// task (with the API's permission: `submit`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_lists_an_expired_task_and_replays_it() {
    use delayline::auth::token::hash_hex;
    use delayline::auth::{ClientSettings, TokenHashes};
    let mut settings = settings(Backend::Sqlite);
    settings.auth.clients = vec![ClientSettings {
        name: "ops".to_owned(),
        token_sha256: TokenHashes::One(hash_hex("tok-ops")),
        destinations: vec!["#".to_owned()],
        permissions: ["submit", "read", "limits"].map(str::to_owned).to_vec(),
        ..ClientSettings::default()
    }];
    let app = TestApp::spawn(settings).await;
    let as_ops = |request: reqwest::RequestBuilder| request.bearer_auth("tok-ops");
    let limit = json!({"destinations": "console.late", "paused": true});
    let put = as_ops(app.http.put(format!("{}/v1/limits/late", app.base)));
    assert_eq!(put.json(&limit).send().await.unwrap().status(), 201);
    let task = json!({"id": "late-c", "destination": "console.late", "delay_ms": 200,
                      "max_lateness_ms": 300});
    let post = as_ops(app.http.post(format!("{}/v1/tasks", app.base)));
    assert_eq!(post.json(&task).send().await.unwrap().status(), 202);
    let state_of = async |id: &str| -> Value {
        let get = as_ops(app.http.get(format!("{}/v1/tasks/{id}", app.base)));
        get.send().await.unwrap().json().await.unwrap()
    };
    eventually("the task expires", async || {
        state_of("late-c").await["state"] == "expired"
    })
    .await;

    let ops = crate::console::Browser::sign_in(&app, "tok-ops").await;
    let (status, problems) = ops.get("/console/problems").await;
    assert_eq!(status, 200);
    assert!(
        problems.contains("Expired tasks") && problems.contains("late-c"),
        "{problems}"
    );
    assert!(problems.contains("release limit late"), "{problems}");
    let (_, page) = ops.get("/console/tasks/late-c").await;
    assert!(
        page.contains("Replay now") && page.contains("its deadline"),
        "{page}"
    );
    let csrf = crate::console::csrf_of(&page);
    let (status, location) = ops
        .post(
            "/console/tasks/late-c/replay",
            &[("csrf", &csrf)],
            "same-origin",
        )
        .await;
    assert_eq!(status, 303, "{location}");
    assert!(
        location.starts_with("/console/tasks/late-c~replay?done="),
        "{location}"
    );
    let replay = state_of("late-c~replay").await;
    assert_eq!(replay["destination"], "console.late", "{replay}");
    app.stop().await.unwrap();
}

/// A burst staged in the ledger (100 ms units, a level rate of 100 a
/// second: 150 tasks make a burst) with delayline stopped across its
/// instant and its deadline: once started again, the staged release and
/// the release stage expire every task, and none arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_burst_held_past_its_deadline_by_a_stop_expires_and_never_arrives() {
    let mut settings = settings(Backend::Sqlite);
    settings.cascade.burst_level_rate = 100;
    settings.cascade.burst_window_ms = 3_000;
    let mut app = TestApp::spawn(settings.clone()).await;
    let key = app.cascade.binding_key("staged");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    let due_ms = now_ms() + 5_000;
    let lateness = json!({"max_lateness_ms": 1_000});
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.extend(submit(&app.http, &app.base, "staged", due_ms, 25, lateness.clone()).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eventually("tasks of the burst are staged", async || {
        let (_, page) = app.get("/v1/tasks?state=staged&limit=10").await;
        !page["tasks"].as_array().unwrap().is_empty()
    })
    .await;
    assert!(now_ms() < due_ms, "staged before the instant");
    let cleanup = app.stop_keeping_topology().await;
    tokio::time::sleep(Duration::from_millis(
        (due_ms + 1_500).saturating_sub(now_ms()),
    ))
    .await;

    let app = TestApp::resume(settings, cleanup).await;
    eventually("every task of the burst expired", async || {
        let tasks = tasks_of(&app.http, &app.base, "staged").await;
        ids.iter()
            .all(|id| tasks.get(id).is_some_and(|t| t["state"] == "expired"))
    })
    .await;
    assert!(
        consumer.next(Duration::from_secs(1)).await.is_none(),
        "an expired task arrived"
    );
    let scrape = app.scrape().await;
    let expired = |path: &str| {
        let series = format!("delayline_tasks_expired_total{{path=\"{path}\"}}");
        sample(&scrape, &series).unwrap_or(0.0)
    };
    assert!(expired("staged") > 0.0, "{scrape}");
    assert_eq!(expired("staged") + expired("release"), 150.0);
    app.stop().await.unwrap();
}
