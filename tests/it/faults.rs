//! Faults one task or the broker can cause, on the default configuration
//! (quorum queues, SQLite ledger): a task the broker can never take, a
//! resource alarm, a level that stops dead-lettering. Tests that disturb the
//! broker itself run on nodes of their own (`crate::common::nodes`).

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

use crate::common::nodes::{BrokerNode, NodeOptions, rabbitmq_root, within};
use crate::common::{
    Backend, Cleanup, TestApp, TestConsumer, TestUser, amqp_uri, close_connections_named,
    connections_named, eventually, queue_depth, rabbitmqctl_json, sample, steady_load,
    test_settings, with_ledger,
};
use delayline::broker::{
    BrokerTls, ConsumeLimits, DEFAULT_FRAME_MAX, Publisher, PublisherOptions, Settle, connect,
    content_header_frame_size,
};
use delayline::cascade::QueueType;
use delayline::clock::epoch_ms;
use delayline::message::of_task;
use delayline::task::Task;
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use prometheus_client::metrics::histogram::Histogram;
use serde_json::{Value, json};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};
use tokio_util::sync::CancellationToken;

/// The most bytes a task's properties may take, from the refusal's message.
fn limit_in(message: &str) -> usize {
    let after = message.split("more than the ").nth(1).expect("the limit");
    after.split_whitespace().next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_the_broker_could_never_take_is_refused_at_admission() {
    let mut settings = with_ledger(test_settings(32, 1, QueueType::Quorum), Backend::Sqlite);
    settings.http.body_limit_bytes = 8 * 1024 * 1024;
    let mut app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("big");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;

    // One header value larger than a frame: RabbitMQ would close the whole
    // connection (FRAME_ERROR) and fail every publish in flight with it.
    let huge = json!({"destination": "big", "delay_ms": 0,
                      "headers": {"h": "x".repeat(200_000)}});
    let (status, body) = app.post("/v1/tasks", &huge).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "headers_too_large");
    let message = body["error"]["message"].as_str().unwrap();
    let limit = limit_in(message);
    assert!(
        limit < DEFAULT_FRAME_MAX && limit > DEFAULT_FRAME_MAX / 2,
        "{message}"
    );

    // Many small headers add up the same way.
    let many: serde_json::Map<String, Value> =
        (0..20_000).map(|i| (format!("h{i}"), json!(i))).collect();
    let (status, body) = app
        .post(
            "/v1/tasks",
            &json!({"destination": "big", "delay_ms": 0, "headers": many}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "headers_too_large");

    // Exactly at the limit is accepted, and survives every hop of the
    // cascade: 4095 ms sets twelve digits, so the broker adds twelve x-death
    // entries on the way, within the room the limit leaves for them.
    let at_limit = |filler: usize| {
        json!({"destination": "big", "delay_ms": 4095, "id": "at-limit",
               "headers": {"h": "x".repeat(filler)}})
    };
    let size_of = |body: &Value| {
        let task =
            Task::parse(body.to_string().as_bytes(), &app.cascade, SystemTime::now()).unwrap();
        content_header_frame_size(&of_task(&task.message()).properties)
    };
    // An empty filler header takes its name and framing: what it holds is the rest.
    let filler = limit - size_of(&at_limit(0));
    assert_eq!(size_of(&at_limit(filler)), limit);
    let (status, body) = app.post("/v1/tasks", &at_limit(filler + 1)).await;
    assert_eq!(status, 422, "one byte over: {body}");
    let (status, body) = app.post("/v1/tasks", &at_limit(filler)).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["state"], "scheduled");
    let delivered = consumer
        .next(Duration::from_secs(20))
        .await
        .expect("the largest task arrives");
    assert_eq!(delivered.message_id(), "at-limit");
    // With the release stage (on here, as by default) the released copy
    // leaves the broker's dead-lettering headers behind; the reserve is
    // what let it reach the release queue through twelve hops.
    let grown = content_header_frame_size(&delivered.properties).saturating_sub(limit);
    let reserve = DEFAULT_FRAME_MAX - limit;
    assert!(
        grown * 32 <= reserve * 12,
        "12 hops added {grown} bytes; the reserve allows {reserve} for 32"
    );

    // In a batch the oversized task is refused alone.
    let (status, body) = app
        .post(
            "/v1/tasks/batch",
            &json!({"tasks": [huge, {"destination": "big", "delay_ms": 0, "id": "small"}]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["results"][0]["status"], 422);
    assert_eq!(body["results"][0]["error"]["code"], "headers_too_large");
    assert_eq!(body["results"][1]["status"], 202);
    let small = consumer.next(Duration::from_secs(10)).await.unwrap();
    assert_eq!(small.message_id(), "small");

    // RabbitMQ routes by CC and BCC and refuses a string there (closing the channel).
    let (status, body) = app
        .post(
            "/v1/tasks",
            &json!({"destination": "big", "delay_ms": 0, "headers": {"CC": "x"}}),
        )
        .await;
    assert_eq!(status, 422);
    assert_eq!(body["error"]["code"], "invalid_header");

    // Nothing refused was recorded or published.
    let (_, page) = app.get("/v1/tasks").await;
    let ids: HashSet<&str> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, HashSet::from(["at-limit", "small"]));
    assert!(consumer.next(Duration::from_millis(300)).await.is_none());
    app.stop().await.unwrap();
}

/// Puts a pending row into a SQLite ledger behind the service's back, as an
/// older version (without admission checks) could have left it.
async fn plant_pending_row(data_dir: &str, id: &str, headers: &Value) {
    let mut db = SqliteConnectOptions::new()
        .filename(format!("{data_dir}/delayline.db"))
        .connect()
        .await
        .unwrap();
    let now = epoch_ms(SystemTime::now()) as i64;
    sqlx::query(
        "INSERT INTO tasks (id, destination, routing_key, delay_ms, deliver_at_ms, content_type, \
         headers, payload, payload_bytes, state, created_at_ms, next_attempt_at_ms, attempts) \
         VALUES ($1, 'poison', '0.poison', 0, $2, 'text/plain', $3, x'6869', 2, 'pending', $2, 0, 0)",
    )
    .bind(id)
    .bind(now)
    .bind(headers.to_string())
    .execute(&mut db)
    .await
    .unwrap();
    db.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_that_can_never_be_published_are_quarantined_and_delay_no_one() {
    let settings = with_ledger(test_settings(8, 50, QueueType::Quorum), Backend::Sqlite);
    let data_dir = settings.store.data_dir.clone();
    let connection_name = format!("delayline {}", settings.cascade.prefix);
    let mut app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("#");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    let connection = connections_named(&connection_name, "pid");
    assert_eq!(connection.len(), 1);

    // Two poisons: one the broker would refuse on its channel (a CC string),
    // one beyond the frame size (it would close the whole connection).
    plant_pending_row(&data_dir, "poison-cc", &json!({"CC": "x"})).await;
    plant_pending_row(&data_dir, "poison-big", &json!({"h": "x".repeat(200_000)})).await;

    // Healthy traffic meanwhile: every task arrives once, never early.
    let mut healthy = HashSet::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let (status, body) = app
            .post(
                "/v1/tasks",
                &json!({"destination": "fine", "delay_ms": 200}),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        healthy.insert(body["id"].as_str().unwrap().to_owned());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    consumer
        .expect_each_once_never_early(healthy, Duration::from_secs(10))
        .await;

    let failed = async |id: &str| {
        let (_, task) = app.get(&format!("/v1/tasks/{id}")).await;
        (task["state"] == "failed").then_some(task)
    };
    eventually("both poisons are quarantined", async || {
        failed("poison-cc").await.is_some() && failed("poison-big").await.is_some()
    })
    .await;
    let big = failed("poison-big").await.unwrap();
    assert!(
        big["last_error"].as_str().unwrap().contains("frame"),
        "{big}"
    );
    // Refused before sending: one look was enough.
    assert_eq!(big["attempts"], 1);
    let cc = failed("poison-cc").await.unwrap();
    assert!(cc["last_error"].as_str().unwrap().contains("CC"), "{cc}");
    // Once among the others, then alone until the third refusal.
    assert!(cc["attempts"].as_u64().unwrap() <= 4, "{cc}");

    // Never a connection lost to them, and never published again.
    assert_eq!(connections_named(&connection_name, "pid"), connection);
    let scrape = app.scrape().await;
    assert_eq!(sample(&scrape, "delayline_tasks_failed_total"), Some(2.0));
    let (_, listed) = app.get("/v1/tasks?state=failed").await;
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 2);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        failed("poison-cc").await.unwrap()["attempts"],
        cc["attempts"]
    );
    assert!(consumer.next(Duration::from_millis(200)).await.is_none());
    app.stop().await.unwrap();
}

/// A quorum queue's TTLs run up to 1 % fast while its node's Erlang clock
/// catches up with a step of its host's wall clock (no time warp mode, the
/// machine's RabbitMQ 3.10): a stateless chain of quorum levels, with no
/// release stage to hold what comes early, still delivers nothing before
/// its `deliver_at` (`Cascade::least_ms` allows for it; before it did, such
/// tasks came up to 4 ms early in `migrate::`'s tests against such a node).
/// The node's wall clock is stepped 10 s ahead, its monotonic clock left
/// alone, as a paused VM's is. RabbitMQ 4.3 here runs Erlang in multi time
/// warp mode, documented to follow a step at once, and its folder's node
/// does not start under libfaketime (see `NodeOptions::steppable_clock`):
/// on that run the test says so and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_quorum_chain_is_never_early_while_the_brokers_clock_catches_up() {
    if rabbitmq_root().is_some() {
        println!(
            "not on RabbitMQ 4: its node runs in multi time warp mode and does not start under libfaketime"
        );
        return;
    }
    let node = BrokerNode::start(&NodeOptions {
        steppable_clock: true,
        ..NodeOptions::default()
    });
    node.step_clock("+10s");
    // Erlang starts catching up some seconds after the step (seen: 8 to
    // 10 s); until then the node's TTLs run at the host's pace.
    let caught_up_from = within(Duration::from_secs(60), async || {
        let behind = tokio::task::block_in_place(|| node.erlang_clock_offset_ms());
        assert!(behind < -5_000, "the node's clock is {behind} ms off");
        behind > -9_990
    })
    .await;
    assert!(caught_up_from, "the node never began to catch up");
    // Levels of 1 s, delays just under 2, 4 and 8 units: routed as though
    // TTLs were exact, each would wait in one level alone, so that the 1 %
    // its TTL may lose (20 to 80 ms) is not hidden by the dead-lettering of
    // several hops (with the allowance they take a unit more).
    let mut settings = test_settings(4, 1000, QueueType::Quorum);
    settings.amqp.uri = node.uri().into();
    let app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("fast");
    let mut consumer =
        TestConsumer::on_node(&node.uri(), &app.cascade, &key, QueueType::Quorum).await;
    let mut ids = HashSet::new();
    for delay_ms in [1_990u64, 3_990, 7_990].repeat(5) {
        let body = json!({"destination": "fast", "delay_ms": delay_ms});
        let (status, accepted) = app.post("/v1/tasks", &body).await;
        assert_eq!(status, 202, "{accepted}");
        ids.insert(accepted["id"].as_str().unwrap().to_owned());
    }
    consumer
        .expect_each_once_never_early(ids, Duration::from_secs(15))
        .await;
    let still = tokio::task::block_in_place(|| node.erlang_clock_offset_ms());
    assert!(
        still < 0,
        "the node caught up too soon to tell ({still} ms)"
    );
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_broker_neither_holds_requests_nor_gets_tasks_twice() {
    let node = BrokerNode::start(&NodeOptions::default());
    let mut settings = with_ledger(test_settings(8, 50, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = node.uri().into();
    settings.amqp.confirm_timeout_ms = 1000;
    let app = TestApp::spawn(settings.clone()).await;
    let key = app.cascade.binding_key("load");
    let mut consumer =
        TestConsumer::on_node(&node.uri(), &app.cascade, &key, QueueType::Quorum).await;
    // Without a ledger there is nowhere to wait: a blocked broker is a quick 503.
    let mut stateless = settings.clone();
    stateless.store.url = "none".to_owned().into();
    // Without a ledger there is no release stage: a chain of its own beside
    // the one with the stage, delivering to the same business exchange.
    stateless.cascade.prefix = format!("{}-stateless", settings.cascade.prefix);
    let stateless = TestApp::spawn(stateless).await;
    // Its tasks arrive with the cascade's digits before the destination.
    consumer
        .channel
        .queue_bind(
            format!("{}.consumer", app.cascade.prefix()).as_str().into(),
            app.cascade.business_exchange().into(),
            stateless.cascade.binding_key("load").as_str().into(),
            lapin::options::QueueBindOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();

    for (raise, clear) in [
        (
            BrokerNode::raise_memory_alarm as fn(&BrokerNode),
            BrokerNode::clear_memory_alarm as fn(&BrokerNode),
        ),
        (BrokerNode::raise_disk_alarm, BrokerNode::clear_disk_alarm),
    ] {
        // RabbitMQ blocks a connection once it has published: both have.
        let (status, _) = stateless
            .post(
                "/v1/tasks",
                &json!({"destination": "load", "delay_ms": 0, "id": "warm"}),
            )
            .await;
        assert_eq!(status, 202);
        let warm = consumer.next(Duration::from_secs(5)).await.unwrap();
        assert_eq!(warm.message_id(), "warm");
        let stop = tokio_util::sync::CancellationToken::new();
        let load = steady_load(&app.http, &app.base, 4, "load", 300, stop.clone());
        tokio::time::sleep(Duration::from_millis(500)).await;
        // rabbitmqctl takes a second or two: off the runtime's workers, or
        // the service's tasks queued behind it wait with it, and the load
        // below would time the test's own block.
        tokio::task::block_in_place(|| raise(&node));
        let blocked = within(Duration::from_secs(10), async || {
            let (_, ready) = app.get("/readyz").await;
            ready["broker"] == "blocked"
        })
        .await;
        assert!(
            blocked,
            "/readyz never said the broker blocks publishing: {:?} {:?}",
            app.get("/readyz").await,
            stateless.get("/readyz").await
        );
        let (status, ready) = app.get("/readyz").await;
        // With a ledger, tasks are still accepted: ready, and says why they wait.
        assert_eq!(status, 200, "{ready}");
        assert!(
            ready["blocked"].as_str().is_some_and(|r| !r.is_empty()),
            "{ready}"
        );
        // A connection idle when the alarm began is blocked by its next
        // publish (which the broker still takes); after that, a quick 503.
        let mut refused = false;
        for _ in 0..3 {
            let started = Instant::now();
            let (status, body) = stateless
                .post(
                    "/v1/tasks",
                    &json!({"destination": "nobody", "delay_ms": 0}),
                )
                .await;
            assert!(started.elapsed() < Duration::from_millis(1500), "{body}");
            if status == 503 {
                assert_eq!(body["error"]["code"], "broker_blocked", "{body}");
                refused = true;
                break;
            }
            assert_eq!(status, 202, "{body}");
        }
        assert!(
            refused,
            "the stateless service never answered broker_blocked"
        );
        let (status, ready) = stateless.get("/readyz").await;
        assert_eq!(status, 503, "{ready}");
        assert!(
            ready["error"]["message"]
                .as_str()
                .unwrap()
                .contains("blocks publishing")
        );
        let (status, pending) = app
            .post("/v1/tasks", &json!({"destination": "load", "delay_ms": 0}))
            .await;
        assert_eq!((status, &pending["state"]), (202, &json!("pending")));
        let (_, task) = app
            .get(&format!("/v1/tasks/{}", pending["id"].as_str().unwrap()))
            .await;
        assert!(
            task["last_error"]
                .as_str()
                .unwrap()
                .contains("blocks publishing"),
            "{task}"
        );
        tokio::time::sleep(Duration::from_secs(4)).await;
        tokio::task::block_in_place(|| clear(&node));
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.cancel();
        let answers = load.await.unwrap();

        // Every request was answered within the confirm timeout (plus the
        // ledger's commit), none waited for the alarm to end.
        let slowest = answers.iter().map(|a| a.took).max().unwrap();
        assert!(
            slowest < Duration::from_millis(2500),
            "a request took {slowest:?}"
        );
        assert!(answers.iter().all(|a| a.status == 202));
        assert!(
            answers
                .iter()
                .any(|a| a.state.as_deref() == Some("pending"))
        );
        let mut ids: HashSet<String> = answers.into_iter().filter_map(|a| a.id).collect();
        ids.insert(pending["id"].as_str().unwrap().to_owned());
        // Each arrives once: a publish buffered during the block is not sent
        // again by the forwarder.
        consumer
            .expect_each_once_never_early(ids, Duration::from_secs(15))
            .await;
        assert!(consumer.next(Duration::from_millis(500)).await.is_none());
        let scrape = app.scrape().await;
        eprintln!(
            "late confirms so far: {:?}, retried unconfirmed: {:?}",
            sample(&scrape, "delayline_publish_late_total"),
            sample(&scrape, "delayline_publish_unconfirmed_total")
        );
    }
    stateless.stop().await.unwrap();
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_confirm_is_awaited_and_the_task_is_not_published_twice() {
    let mut settings = with_ledger(test_settings(8, 50, QueueType::Quorum), Backend::Sqlite);
    // Nearly every confirm comes later than this: the answer is "pending",
    // and the confirm is still awaited instead of publishing again.
    settings.amqp.confirm_timeout_ms = 1;
    let mut app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("late");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    let task = json!({"destination": "late", "delay_ms": 100});
    let posts = (0..100).map(|_| app.post("/v1/tasks", &task));
    let answers = futures_util::future::join_all(posts).await;
    let ids: HashSet<String> = answers
        .iter()
        .map(|(status, body)| {
            assert_eq!(*status, 202, "{body}");
            body["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert!(answers.iter().any(|(_, body)| body["state"] == "pending"));
    consumer
        .expect_each_once_never_early(ids.clone(), Duration::from_secs(10))
        .await;
    eventually("every late confirm is recorded", async || {
        let (_, page) = app.get("/v1/tasks?state=pending&limit=1000").await;
        page["tasks"].as_array().unwrap().is_empty()
    })
    .await;
    let (_, failed) = app.get("/v1/tasks?state=failed").await;
    assert!(failed["tasks"].as_array().unwrap().is_empty(), "{failed}");
    // Well past the retry lease of an ordinary failure: still nothing again.
    assert!(consumer.next(Duration::from_secs(3)).await.is_none());
    let scrape = app.scrape().await;
    assert!(sample(&scrape, "delayline_publish_late_total").unwrap() > 0.0);
    assert_eq!(
        sample(&scrape, "delayline_publish_unconfirmed_total"),
        Some(0.0)
    );
    app.stop().await.unwrap();
}

/// A node that stops answering (SIGSTOP: its sockets stay open, as a node
/// cut off from its quorum can hold a publish without a word) must not hold
/// a task for good: past `amqp.late_confirm_limit_ms` the late confirm is
/// given up and the task published again, while the node still says
/// nothing, and the connection to it is let go. Once it answers, the task
/// arrives once (the release stage drops the second copy). A partition
/// scenario left four tasks pending this way; another, in CI, left tasks
/// waiting through five such limits on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_that_never_comes_is_given_up_at_the_limit() {
    let node = BrokerNode::start(&NodeOptions::default());
    let mut settings = with_ledger(test_settings(8, 50, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = node.uri().into();
    settings.amqp.confirm_timeout_ms = 300;
    settings.amqp.late_confirm_limit_ms = 1_500;
    let app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("unanswered");
    let mut consumer =
        TestConsumer::on_node(&node.uri(), &app.cascade, &key, QueueType::Quorum).await;
    let task = json!({"destination": "unanswered", "delay_ms": 100});
    let (status, warm) = app.post("/v1/tasks", &task).await;
    assert_eq!(
        (status, &warm["state"]),
        (202, &json!("scheduled")),
        "{warm}"
    );

    let paused = node.pause();
    let (status, late) = app.post("/v1/tasks", &task).await;
    assert_eq!((status, &late["state"]), (202, &json!("pending")), "{late}");
    let id = late["id"].as_str().unwrap().to_owned();
    let mut errors = Vec::new();
    let given_up = within(Duration::from_secs(8), async || {
        let (_, task) = app.get(&format!("/v1/tasks/{id}")).await;
        let error = task["last_error"].as_str().unwrap_or_default().to_owned();
        let limit_said = error.contains("did not confirm the message within 1.5s");
        errors.push(error);
        limit_said
    })
    .await;
    errors.dedup();
    assert!(given_up, "the late confirm was never given up: {errors:?}");
    // The node that left a publish unanswered this long is let go (a
    // cluster's next node would be tried first): the next publish would
    // wait as long on it.
    let let_go = within(Duration::from_secs(10), async || {
        app.get("/readyz").await.1["broker"] == "disconnected"
    })
    .await;
    drop(paused);
    assert!(let_go, "still connected to a node that answers nothing");

    let ids = HashSet::from([warm["id"].as_str().unwrap().to_owned(), id]);
    consumer
        .expect_each_once_never_early(ids, Duration::from_secs(30))
        .await;
    eventually("nothing pending once the node answers", async || {
        let (_, page) = app.get("/v1/tasks?state=pending").await;
        page["tasks"].as_array().unwrap().is_empty()
    })
    .await;
    assert!(consumer.next(Duration::from_secs(1)).await.is_none());
    let scrape = app.scrape().await;
    assert!(sample(&scrape, "delayline_publish_unconfirmed_total").unwrap() > 0.0);
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_that_holds_its_messages_shows_in_metrics_and_is_healed() {
    let node = BrokerNode::start(&NodeOptions {
        management: true,
        dead_letter_confirm_timeout_ms: Some(5_000),
        ..NodeOptions::default()
    });
    let mut settings = with_ledger(test_settings(4, 100, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = node.uri().into();
    // No level probes: this test counts a level's messages exactly, and
    // shows the broker's own view and the poller's remedy; delayline's
    // repair of a level that holds its messages is `strand.rs`'s.
    settings.cascade.level_probe_ms = 0;
    settings.metrics.queue_poll_ms = 250;
    settings.metrics.management_url = format!(
        "http://guest:guest@127.0.0.1:{}",
        node.management_port.unwrap()
    )
    .into();
    let app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("held");
    let mut consumer =
        TestConsumer::on_node(&node.uri(), &app.cascade, &key, QueueType::Quorum).await;
    // Level 3's dead-letter exchange disappears, as after a broker restart
    // that recovered the queues before their exchanges.
    consumer
        .delete_exchange(&app.cascade.level_exchange(2))
        .await;
    let mut ids = HashSet::new();
    for _ in 0..5 {
        // 8 units and 100 ms held at the release stage: level 3 only, which
        // holds them 800 ms and then cannot dead-letter.
        let (status, body) = app
            .post(
                "/v1/tasks",
                &json!({"destination": "held", "delay_ms": 900}),
            )
            .await;
        assert_eq!(status, 202);
        ids.insert(body["id"].as_str().unwrap().to_owned());
    }
    let level3 = app.cascade.level_queue(3);
    let series = |name: &str| format!("delayline_{name}{{level=\"3\",queue=\"{level3}\"}}");
    let mut seen_held = false;
    let shown = within(Duration::from_secs(30), async || {
        let scrape = app.scrape().await;
        let held = sample(&scrape, &series("level_queue_held_messages"));
        if held == Some(5.0) && !seen_held {
            seen_held = true;
            // AMQP's passive declare (all /metrics had before) sees none of them.
            let (ready, _, total) = node.queue_counts(&level3).unwrap();
            assert_eq!((ready, total), (0, 5));
            assert_eq!(sample(&scrape, &series("level_queue_messages")), Some(5.0));
            assert_eq!(sample(&scrape, "delayline_management_api_up"), Some(1.0));
            assert_eq!(
                sample(&scrape, &series("level_queue_ttl_seconds")),
                Some(0.8)
            );
        }
        seen_held && sample(&scrape, &series("level_queue_held_seconds")).unwrap_or(0.0) > 2.0
    })
    .await;
    assert!(shown, "the held messages never showed in /metrics");
    // Held past TTL + grace, the poller declares the topology again; the
    // dead-letter worker retries within its confirm timeout (5 s here).
    consumer
        .expect_each_once_never_early(ids, Duration::from_secs(40))
        .await;
    let cleared = within(Duration::from_secs(20), async || {
        let scrape = app.scrape().await;
        sample(&scrape, &series("level_queue_held_messages")) == Some(0.0)
            && sample(&scrape, &series("level_queue_held_seconds")) == Some(0.0)
    })
    .await;
    assert!(cleared, "held messages still reported after delivery");

    // The runbook's remedy for a level stranded by a lost node restarts the
    // queue's Raft member; the level goes on working, nothing in it is lost.
    let (status, body) = app
        .post(
            "/v1/tasks",
            &json!({"destination": "held", "delay_ms": 900}),
        )
        .await;
    assert_eq!(status, 202);
    node.release_stranded_level(&level3);
    consumer
        .expect_each_once_never_early(
            HashSet::from([body["id"].as_str().unwrap().to_owned()]),
            Duration::from_secs(20),
        )
        .await;
    app.stop().await.unwrap();
}

/// Waits until `/readyz` answers `status`; its body then.
async fn readyz_becomes(app: &TestApp, status: u16) -> Value {
    let mut body = Value::Null;
    let became = within(Duration::from_secs(15), async || {
        let (now, answer) = app.get("/readyz").await;
        body = answer;
        now == status
    })
    .await;
    assert!(became, "/readyz never answered {status}: {body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_not_ready_and_says_why_until_it_is_fixed() {
    let user = TestUser::create();
    let mut settings = with_ledger(test_settings(4, 50, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = user.uri().replace(":secret@", ":wrong@").into();
    settings.amqp.misconfiguration_grace_ms = 1_000;
    settings.amqp.reconnect_max_backoff_ms = 300;
    let mut app = TestApp::start(settings).await;

    let refused = readyz_becomes(&app, 503).await;
    assert_eq!(
        refused["error"]["code"], "broker_misconfigured",
        "{refused}"
    );
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("ACCESS_REFUSED"), "{message}");
    assert!(!message.contains("wrong"), "the password leaked: {message}");
    // Tasks are still taken into the ledger, and say why they wait.
    let (status, body) = app
        .post("/v1/tasks", &json!({"destination": "fixed", "delay_ms": 0}))
        .await;
    assert_eq!((status, &body["state"]), (202, &json!("pending")));
    let id = body["id"].as_str().unwrap().to_owned();
    let (_, task) = app.get(&format!("/v1/tasks/{id}")).await;
    assert!(
        task["last_error"]
            .as_str()
            .unwrap()
            .contains("ACCESS_REFUSED"),
        "{task}"
    );
    let scrape = app.scrape().await;
    assert_eq!(sample(&scrape, "delayline_broker_misconfigured"), Some(1.0));

    // The operator gives the user the password the service was configured with.
    crate::common::rabbitmqctl(&["change_password", &user.0, "wrong"]);
    let ready = readyz_becomes(&app, 200).await;
    assert!(ready.get("broker_error").is_none(), "{ready}");
    let key = app.cascade.binding_key("fixed");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    // Bound after the fact: the task may already be parked, so post one more.
    let (_, again) = app
        .post("/v1/tasks", &json!({"destination": "fixed", "delay_ms": 0}))
        .await;
    // The waiting task may come first, if it was released after the binding.
    let mut arrived = consumer.next(Duration::from_secs(10)).await.unwrap();
    if arrived.message_id() == id {
        arrived = consumer.next(Duration::from_secs(10)).await.unwrap();
    }
    assert_eq!(arrived.message_id(), again["id"].as_str().unwrap());
    eventually("the waiting task is published", async || {
        let state = app.get(&format!("/v1/tasks/{id}")).await.1["state"].clone();
        // Released before the consumer bound, it was parked: unroutable.
        ["scheduled", "releasing", "delivered", "unroutable"]
            .contains(&state.as_str().unwrap_or_default())
    })
    .await;
    let scrape = app.scrape().await;
    assert_eq!(sample(&scrape, "delayline_broker_misconfigured"), Some(0.0));
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_vhost_is_a_misconfiguration_and_an_outage_is_not() {
    let mut settings = with_ledger(test_settings(4, 50, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = format!("{}-missing-vhost", crate::common::amqp_uri()).into();
    settings.amqp.misconfiguration_grace_ms = 500;
    let app = TestApp::start(settings.clone()).await;
    let refused = readyz_becomes(&app, 503).await;
    assert_eq!(refused["error"]["code"], "broker_misconfigured");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("NOT_ALLOWED"),
        "{refused}"
    );
    app.stop().await.unwrap();

    // Nothing listens there: an outage. With a ledger tasks are accepted, so
    // the service stays ready, and says what is wrong with the broker.
    settings.amqp.uri = format!(
        "amqp://guest:guest@127.0.0.1:{}/%2f",
        crate::common::free_port()
    )
    .into();
    let app = TestApp::start(settings).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (status, ready) = app.get("/readyz").await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["broker"], "disconnected");
    assert!(
        ready["broker_error"]
            .as_str()
            .unwrap()
            .contains("Connection refused"),
        "{ready}"
    );
    let scrape = app.scrape().await;
    assert_eq!(sample(&scrape, "delayline_broker_misconfigured"), Some(0.0));
    app.stop().await.unwrap();
}

/// Consumers of `queue` on the machine's broker.
fn consumers_of(queue: &str) -> u64 {
    rabbitmqctl_json(&["list_queues", "name", "consumers"])
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == queue)
        .and_then(|q| q["consumers"].as_u64())
        .unwrap_or(0)
}

/// The release stage's consumer, while its reader holds windows unsettled
/// (publishes held by an alarm, say), loses its channel: it must consume
/// again at once instead of waiting for settles that can no longer reach
/// the broker. It once waited for good, and due tasks sat in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_reader_holds_its_windows_consumes_again_after_its_channel_dies() {
    let settings = test_settings(2, 50, QueueType::Quorum);
    let cascade = settings.cascade().unwrap();
    let mut cleanup = Cleanup::for_cascade(&cascade);
    let queue = format!("{}.held", cascade.prefix());
    cleanup.queues.push(queue.clone());
    let connection = connect(amqp_uri(), "delayline test").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    for i in 0..6u8 {
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                &[i],
                BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    let shutdown = CancellationToken::new();
    let options = PublisherOptions::from_settings(
        &settings.amqp,
        &cascade,
        Histogram::new([0.1].into_iter()),
        BrokerTls::default(),
    );
    let name = options.connection_name.clone();
    let (publisher, _supervisor) = Publisher::start(options, cascade.plan(), shutdown.clone());
    let limits = ConsumeLimits {
        window: 1,
        windows: 2,
    };
    let mut windows = publisher.consume(queue.clone(), limits, shutdown.clone());
    // Held, unsettled, and nothing more is read: the consumer fills its
    // buffer and waits on a reader that does not come.
    let held = tokio::time::timeout(Duration::from_secs(10), windows.recv())
        .await
        .expect("a first window")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(consumers_of(&queue), 1);

    assert!(close_connections_named(&name) > 0);
    let lost = Instant::now();
    eventually("the queue is consumed again", async || {
        consumers_of(&queue) == 1
    })
    .await;
    assert!(
        lost.elapsed() < Duration::from_secs(15),
        "consumed again only after {:?}",
        lost.elapsed()
    );

    // A settle from before the loss goes nowhere; every message comes again.
    held.settle(vec![Settle::Ack]);
    let mut payloads = HashSet::new();
    while payloads.len() < 6 {
        let window = tokio::time::timeout(Duration::from_secs(10), windows.recv())
            .await
            .expect("every message again")
            .unwrap();
        payloads.extend(window.messages.iter().map(|m| m.payload.clone()));
        let acks = vec![Settle::Ack; window.messages.len()];
        window.settle(acks);
    }
    eventually("every message is acknowledged", async || {
        queue_depth(&queue).await == 0
    })
    .await;
    shutdown.cancel();
    let _ = connection.close(200, "done".into()).await;
}

/// The whole broker stopped (`rabbitmqctl stop_app`) under a running
/// service: a node of the test's own, so nobody else's broker stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_accepted_while_rabbitmq_is_stopped_arrive_after_it_restarts() {
    let node = BrokerNode::start(&NodeOptions::default());
    let mut settings = with_ledger(test_settings(5, 50, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = node.uri().into();
    settings.amqp.reconnect_max_backoff_ms = 200;
    settings.amqp.confirm_timeout_ms = 1000;
    let app = TestApp::spawn(settings).await;
    // A quorum consumer queue: it outlives the broker's restart.
    let key = app.cascade.binding_key("outage");
    let consumer = TestConsumer::on_node(&node.uri(), &app.cascade, &key, QueueType::Quorum).await;
    drop(consumer);

    node.ctl(&["stop_app"]);
    eventually("the service notices the broker is gone", async || {
        app.get("/readyz").await.1["broker"] == "disconnected"
    })
    .await;
    let mut accepted = HashSet::new();
    for n in 0..10u64 {
        let body = json!({"destination": "outage", "delay_ms": n * 100});
        let (status, task) = app.post("/v1/tasks", &body).await;
        assert_eq!(status, 202, "{task}");
        assert_eq!(task["state"], "pending");
        accepted.insert(task["id"].as_str().unwrap().to_owned());
    }
    let app = app.restart().await;
    node.ctl(&["start_app"]);
    node.ctl(&["await_startup"]);

    let queue = format!("{}.consumer", app.cascade.prefix());
    TestConsumer::existing_on(&node.uri(), &queue)
        .await
        .expect_each_once_never_early(accepted, Duration::from_secs(30))
        .await;
    app.stop().await.unwrap();
}

/// A filesystem of the test's own (tmpfs, `size` bytes), for a ledger that
/// runs out of room; unmounted whatever happens.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let dir = std::env::temp_dir().join(format!("dltest-disk-{}", &id[..12]));
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(
            mounted.success(),
            "mounting a tmpfs (the suite runs as root)"
        );
        SmallDisk(dir)
    }

    /// Fills what room is left with a file; its path.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while file.write_all(&chunk).and_then(|()| file.flush()).is_ok() {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `/readyz` reports a SQLite ledger whose disk is full, with the
/// database's words, once a write fails (SQLite may take a few more first,
/// into room its log already has), and is ready again by itself once there
/// is room: no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_reports_a_full_disk_under_the_ledger_and_recovers_by_itself() {
    let disk = SmallDisk::mount("16m");
    let mut settings = with_ledger(test_settings(6, 100, QueueType::Quorum), Backend::Sqlite);
    settings.store.data_dir = disk.0.join("ledger").display().to_string();
    let app = TestApp::spawn(settings).await;
    readyz_becomes(&app, 200).await;
    let filler = disk.fill();
    let task = json!({"destination": "full.disk", "delay": "5s", "payload": "x".repeat(2_000)});
    let mut refused = 0;
    for _ in 0..5_000 {
        let (status, answer) = app.post("/v1/tasks", &task).await;
        assert!(matches!(status, 202 | 503), "{answer}");
        if status == 503 {
            refused += 1;
            break;
        }
    }
    assert_eq!(refused, 1, "a full disk never refused a task");
    let body = readyz_becomes(&app, 503).await;
    assert_eq!(body["error"]["code"], "ledger_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("the ledger cannot write"), "{message}");
    assert!(message.contains("full"), "{message}");
    std::fs::remove_file(filler).unwrap();
    readyz_becomes(&app, 200).await;
    let (status, answer) = app.post("/v1/tasks", &task).await;
    assert_eq!(status, 202, "{answer}");
    app.stop().await.unwrap();
}

/// A role of the test's own on the suite's PostgreSQL, dropped whatever
/// happens (after the test's schema, which holds what it owns).
pub(crate) struct PgRole(pub(crate) String);

impl Drop for PgRole {
    fn drop(&mut self) {
        let _ = std::process::Command::new("psql")
            .args([crate::common::POSTGRES_URL, "-q", "-c"])
            .arg(format!("DROP ROLE IF EXISTS {}", self.0))
            .output();
    }
}

/// The same on PostgreSQL: a ledger whose role may no longer write (as a
/// full disk, a read-only replica or a revoked grant would refuse) is not
/// ready, saying what PostgreSQL said, and is ready again once it may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_reports_postgresql_refusing_writes_and_recovers_by_itself() {
    let mut settings = with_ledger(test_settings(6, 100, QueueType::Quorum), Backend::Postgres);
    let schema = settings.cascade.prefix.replace('-', "_");
    let role = PgRole(format!("{schema}_writer"));
    crate::common::psql(&format!(
        "CREATE ROLE {0} LOGIN; GRANT ALL ON SCHEMA {schema} TO {0}",
        role.0
    ));
    settings.store.url = format!(
        "postgres://{}@127.0.0.1:5432/test?options[search_path]={schema}",
        role.0
    )
    .into();
    let app = TestApp::spawn(settings).await;
    readyz_becomes(&app, 200).await;
    let writes = "INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA";
    crate::common::psql(&format!("REVOKE {writes} {schema} FROM {}", role.0));
    let body = readyz_becomes(&app, 503).await;
    assert_eq!(body["error"]["code"], "ledger_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("permission denied"), "{message}");
    crate::common::psql(&format!("GRANT {writes} {schema} TO {}", role.0));
    readyz_becomes(&app, 200).await;
    app.stop().await.unwrap();
}
