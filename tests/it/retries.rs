//! Retries with backoff: a consumer's queue names delayline's retry
//! exchange as its `x-dead-letter-exchange`; what it rejects, what expires
//! in it and what a quorum queue dead-letters at its delivery limit comes
//! back to it after the policy's backoff (never early), then is parked, and
//! replayed or discarded over the API. On the default configuration
//! (SQLite ledger, release stage, quorum chain), on either broker.

use std::time::{Duration, SystemTime};

use delayline::broker::connect;
use delayline::cascade::QueueType;
use delayline::clock::epoch_ms;
use delayline::clock::{format_epoch_ms, parse_epoch_ms};
use delayline::config::Settings;
use delayline::ingress::RetrySettings;
use delayline::message::{
    ATTEMPT_HEADER, REFUSAL_CODE_HEADER, RETRY_AFTER_HEADER, RETRY_AT_HEADER, RETRY_QUEUE_HEADER,
};
use delayline::testkit::now_ms;
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicRejectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use crate::common::python::tool;
use crate::common::{
    Backend, Cleanup, TestApp, TestConsumer, amqp_uri, eventually, free_port, sample,
    test_settings, wait_connected_at, with_ledger,
};

/// The lateness a redelivery may have here (two cores, the broker beside).
const LATE_ALLOWED_MS: u64 = 4_000;

/// A policy over `queues`: 200 ms, then 400, 800, at most 2 s, 20% jitter,
/// four deliveries in all.
pub(crate) fn policy(queues: &[&str]) -> RetrySettings {
    RetrySettings {
        name: "work".into(),
        queues: queues.iter().map(|q| (*q).to_owned()).collect(),
        initial: "200ms".into(),
        multiplier: 2.0,
        max_delay: "2s".into(),
        jitter: 0.2,
        max_attempts: 4,
        park_to: None,
        max_lateness: None,
        give_up_after: None,
    }
}

/// Default settings (a 10 ms chain of 8 levels) with `policies`, each
/// queue named under the test's prefix.
pub(crate) fn settings_with(policies: Vec<RetrySettings>) -> Settings {
    settings_on(Backend::Sqlite, policies)
}

pub(crate) fn settings_on(backend: Backend, policies: Vec<RetrySettings>) -> Settings {
    let mut settings = with_ledger(test_settings(8, 10, QueueType::Quorum), backend);
    let prefix = settings.cascade.prefix.clone();
    settings.retry = policies
        .into_iter()
        .map(|mut policy| {
            policy.queues = policy
                .queues
                .iter()
                .map(|q| format!("{prefix}.{q}"))
                .collect();
            policy.park_to = policy.park_to.map(|q| format!("{prefix}.{q}"));
            policy
        })
        .collect();
    settings
}

pub(crate) fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// The one argument a consumer's queue adds, and the others it has.
pub(crate) fn dead_letters_to(app: &TestApp, extra: &[(&str, AMQPValue)]) -> FieldTable {
    dead_letters_under(app.cascade.prefix(), extra)
}

pub(crate) fn dead_letters_under(prefix: &str, extra: &[(&str, AMQPValue)]) -> FieldTable {
    let mut arguments = FieldTable::default();
    let exchange = format!("{prefix}.retry");
    arguments.insert("x-dead-letter-exchange".into(), text(&exchange));
    for (name, value) in extra {
        arguments.insert((*name).into(), value.clone());
    }
    arguments
}

/// A consumer's queue of the test's own (deleted with its other objects).
pub(crate) async fn declare_queue(app: &mut TestApp, name: &str, arguments: FieldTable) -> String {
    let queue = format!("{}.{name}", app.cascade.prefix());
    declare_named(&mut app.cleanup, &queue, arguments).await;
    queue
}

pub(crate) async fn declare_named(cleanup: &mut Cleanup, queue: &str, arguments: FieldTable) {
    cleanup.queues.push(queue.to_owned());
    let connection = connect(amqp_uri(), "retry test queue").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    let options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue.into(), options, arguments)
        .await
        .unwrap();
    let _ = connection.close(200, "declared".into()).await;
}

/// Publishes to `queue` by the default exchange, confirmed.
pub(crate) async fn publish(queue: &str, body: &[u8], properties: BasicProperties) {
    crate::ingress::publish("", queue, body, properties).await;
}

/// A lapin consumer that settles each delivery as the test says.
pub(crate) struct Worker {
    connection: Connection,
    _channel: Channel,
    consumer: lapin::Consumer,
}

impl Worker {
    pub(crate) async fn on(queue: &str) -> Worker {
        let connection = connect(amqp_uri(), "retry test worker").await.unwrap();
        let channel = connection.create_channel().await.unwrap();
        let consumer = channel
            .basic_consume(
                queue.into(),
                "worker".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        Worker {
            connection,
            _channel: channel,
            consumer,
        }
    }

    /// Gone with what it holds unacknowledged, as a crashed consumer.
    async fn die(self) {
        let _ = self.connection.close(200, "crashed".into()).await;
    }

    pub(crate) async fn next(&mut self, timeout: Duration) -> Option<(u64, Delivery)> {
        let delivery = tokio::time::timeout(timeout, self.consumer.next())
            .await
            .ok()??;
        Some((epoch_ms(SystemTime::now()), delivery.unwrap()))
    }
}

pub(crate) fn attempt_of(delivery: &Delivery) -> Option<i64> {
    match delivery
        .properties
        .headers()
        .as_ref()?
        .inner()
        .get(ATTEMPT_HEADER)?
    {
        AMQPValue::LongLongInt(n) => Some(*n),
        other => panic!("attempt header {other:?}"),
    }
}

/// The guide's pika consumer (docs/retries.md), as written: it rejects a
/// message while its attempt is at most its last argument, then acks it.
fn pika_consumer() -> String {
    crate::lifecycle::doc_block("docs/retries.md", "# Retries", "python", 1)
}

/// A consumer of the retries page's, run as written by Python with `args`.
struct Recipe(tokio::process::Child);

impl Recipe {
    fn start<'a>(code: &str, args: impl IntoIterator<Item = &'a str>) -> Recipe {
        let child = tokio::process::Command::new(tool("python"))
            .arg("-c")
            .arg(code)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Recipe(child)
    }

    /// The `count` JSON lines it prints (each within 20 s of the one
    /// before), once it ended well.
    async fn lines(mut self, count: usize) -> Vec<Value> {
        let stdout = self.0.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut seen: Vec<Value> = Vec::new();
        while seen.len() < count {
            let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
                .await
                .expect("the consumer got every delivery")
                .unwrap()
                .expect("the consumer printed every delivery");
            seen.push(serde_json::from_str(&line).unwrap());
        }
        assert!(self.0.wait().await.unwrap().success());
        seen
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pika_consumer_rejecting_three_times_gets_it_back_after_each_backoff_then_acks() {
    let mut app = TestApp::spawn(settings_with(vec![policy(&["orders"])])).await;
    let arguments = dead_letters_to(&app, &[("x-queue-type", text("quorum"))]);
    let queue = declare_queue(&mut app, "orders", arguments).await;
    let exchange = format!("{}.retry", app.cascade.prefix());
    let consumer = Recipe::start(&pika_consumer(), [amqp_uri(), &queue, &exchange, "3"]);
    let mut headers = FieldTable::default();
    headers.insert("tenant".into(), text("acme"));
    let properties = BasicProperties::default()
        .with_message_id("order-42".into())
        .with_correlation_id("corr-9".into())
        .with_content_type("application/json".into())
        .with_headers(headers);
    publish(&queue, br#"{"order":42}"#, properties).await;
    let seen = consumer.lines(4).await;
    let attempts: Vec<i64> = seen
        .iter()
        .map(|s| s["attempt"].as_i64().unwrap())
        .collect();
    assert_eq!(attempts, [1, 2, 3, 4]);
    for (n, backoff_ms) in [(1, 200u64), (2, 400), (3, 800)] {
        let gap = seen[n]["at_ms"].as_u64().unwrap() - seen[n - 1]["at_ms"].as_u64().unwrap();
        assert!(
            gap >= backoff_ms,
            "attempt {} came back early: {gap} ms",
            n + 1
        );
        assert!(
            gap <= backoff_ms * 12 / 10 + LATE_ALLOWED_MS,
            "attempt {}: {gap} ms",
            n + 1
        );
    }
    // What came back is what left, every time.
    for delivery in &seen {
        assert_eq!(delivery["message_id"], "order-42");
        assert_eq!(delivery["correlation_id"], "corr-9");
        assert_eq!(delivery["content_type"], "application/json");
        assert_eq!(delivery["tenant"], "acme");
        assert_eq!(delivery["body"], r#"{"order":42}"#);
    }
    let (_, parked) = app.get("/v1/parked").await;
    assert_eq!(parked["parked"], json!([]));
    let scrape = app.scrape().await;
    let series = |outcome: &str| {
        format!("delayline_retry_messages_total{{queue=\"{queue}\",outcome=\"{outcome}\"}}")
    };
    assert_eq!(sample(&scrape, &series("scheduled")), Some(3.0));
    assert_eq!(sample(&scrape, &series("redelivered")), Some(3.0));
}

/// Rejects every delivery of the next `count` messages; their arrivals.
pub(crate) async fn reject_all(worker: &mut Worker, count: usize) -> Vec<(u64, Delivery)> {
    let mut seen = Vec::new();
    while seen.len() < count {
        let (at, delivery) = worker
            .next(Duration::from_secs(20))
            .await
            .expect("a delivery");
        delivery
            .reject(BasicRejectOptions { requeue: false })
            .await
            .unwrap();
        seen.push((at, delivery));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_failing_every_attempt_is_parked_then_replayed_and_acked_on_a_classic_queue() {
    park_then_replay(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_messages_are_kept_and_replayed_by_a_postgresql_ledger_too() {
    park_then_replay(Backend::Postgres).await;
}

async fn park_then_replay(backend: Backend) {
    let settings = settings_on(backend, vec![policy(&["billing"])]);
    let mut app = TestApp::spawn(settings.clone()).await;
    let arguments = dead_letters_to(&app, &[]);
    let queue = declare_queue(&mut app, "billing", arguments).await;
    let mut worker = Worker::on(&queue).await;
    publish(
        &queue,
        b"invoice",
        BasicProperties::default().with_message_id("inv-1".into()),
    )
    .await;
    let seen = reject_all(&mut worker, 4).await;
    let attempts: Vec<Option<i64>> = seen.iter().map(|(_, d)| attempt_of(d)).collect();
    assert_eq!(attempts, [None, Some(2), Some(3), Some(4)]);

    let mut parked = json!(null);
    eventually("the message is parked", async || {
        parked = app.get(&format!("/v1/parked?queue={queue}")).await.1;
        parked["parked"].as_array().is_some_and(|p| p.len() == 1)
    })
    .await;
    let message = &parked["parked"][0];
    assert_eq!(message["attempts"], 4);
    assert_eq!(message["reason"], "rejected");
    assert_eq!(message["policy"], "work");
    assert_eq!(message["message_id"], "inv-1");
    assert_eq!(message["body"], "invoice");
    assert_eq!(parked["queues"][0]["queue"], queue);
    assert_eq!(parked["queues"][0]["parked"], 1);
    // Nothing more comes: parked is not retried.
    assert!(worker.next(Duration::from_millis(1_500)).await.is_none());
    // How many are parked now is a gauge, read from the ledger.
    let gauge = format!("delayline_parked_messages{{queue=\"{queue}\"}}");
    eventually("the parked gauge counts it", async || {
        sample(&app.scrape().await, &gauge) == Some(1.0)
    })
    .await;

    // Kept aside, to put back below beside its task (as another replica's
    // replay at the same moment, or an earlier version, leaves it).
    crate::common::ledger_sql(
        &settings,
        backend,
        "CREATE TABLE parked_kept AS SELECT * FROM parked",
    );

    // The command line lists it and replays it, through the API.
    let id = message["id"].as_str().unwrap();
    let parked_cli = async |args: &[&str]| {
        let args = [args, &["--url", &app.base]].concat();
        let (ok, said) = crate::common::run_delayline(&app.settings, &args).await;
        assert!(ok, "{args:?}: {said}");
        said
    };
    let listed = parked_cli(&["parked", "list", "--queue", &queue]).await;
    assert!(listed.contains(&format!("{queue}\t1\t")), "{listed}");
    assert!(
        listed.contains(&format!("{id}\t{queue}\twork\trejected\t4\t")),
        "{listed}"
    );
    let policies = parked_cli(&["retries", "list"]).await;
    assert!(
        policies.contains(&format!("work\t{queue}\t200\t")),
        "{policies}"
    );
    let done = parked_cli(&["parked", "replay", id]).await;
    assert_eq!(
        done,
        "replayed 1 of 1 matched (0 gone before the action reached them)\n"
    );
    let (_, delivery) = worker
        .next(Duration::from_secs(10))
        .await
        .expect("replayed");
    assert_eq!(delivery.data, b"invoice");
    assert_eq!(attempt_of(&delivery), Some(1));
    assert_eq!(
        delivery.properties.message_id().as_ref().unwrap().as_str(),
        "inv-1"
    );
    delivery.ack(BasicAckOptions::default()).await.unwrap();
    let (status, _) = app.get(&format!("/v1/parked/{id}")).await;
    assert_eq!(status, 404);
    let (status, again) = app
        .post(&format!("/v1/parked/{id}/replay"), &json!({}))
        .await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (404, Some("parked_not_found"))
    );
    assert!(
        worker.next(Duration::from_millis(1_000)).await.is_none(),
        "acked: gone"
    );
    let scrape = app.scrape().await;
    let series = |outcome: &str| {
        format!("delayline_retry_messages_total{{queue=\"{queue}\",outcome=\"{outcome}\"}}")
    };
    assert_eq!(sample(&scrape, &series("parked")), Some(1.0));
    assert_eq!(sample(&scrape, &series("replayed")), Some(1.0));

    // The row back beside its recorded task, replayed again: the same task,
    // no second copy, counted unchanged, and the row goes with it.
    crate::common::ledger_sql(
        &settings,
        backend,
        "INSERT INTO parked SELECT * FROM parked_kept; DROP TABLE parked_kept",
    );
    let again = json!({"filter": {"queue": queue}, "action": "replay"});
    let (status, done) = app.post("/v1/parked/bulk", &again).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done, json!({"matched": 1, "changed": 0, "unchanged": 1}));
    assert!(
        worker.next(Duration::from_millis(1_000)).await.is_none(),
        "replayed twice"
    );
    let (status, _) = app.get(&format!("/v1/parked/{id}")).await;
    assert_eq!(status, 404, "the row goes all the same");
    let scrape = app.scrape().await;
    assert_eq!(
        sample(&scrape, &series("replayed")),
        Some(1.0),
        "counted again"
    );
    eventually("the parked gauge no longer lists the queue", async || {
        sample(&app.scrape().await, &gauge).is_none()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_delivery_limit_and_expiry_come_back_and_park_with_their_reason() {
    let policies = vec![RetrySettings {
        max_attempts: 2,
        ..policy(&["limited", "expiring"])
    }];
    let mut app = TestApp::spawn(settings_with(policies)).await;
    let quorum = dead_letters_to(
        &app,
        &[
            ("x-queue-type", text("quorum")),
            ("x-delivery-limit", AMQPValue::LongInt(1)),
        ],
    );
    let limited = declare_queue(&mut app, "limited", quorum).await;
    let expiring_arguments = dead_letters_to(&app, &[("x-message-ttl", AMQPValue::LongInt(100))]);
    let expiring = declare_queue(&mut app, "expiring", expiring_arguments).await;
    publish(&limited, b"flaky", BasicProperties::default()).await;
    publish(&expiring, b"stale", BasicProperties::default()).await;

    // A consumer that dies holding it (its connection closed, unacked): the
    // queue counts a failed delivery, and past its delivery limit (1)
    // dead-letters it; both attempts end so. (A nack with requeue counts on
    // 3.10 but not on 4.x, so the test crashes instead.)
    let mut attempts_seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let mut worker = Worker::on(&limited).await;
        let Some((_, delivery)) = worker.next(Duration::from_secs(5)).await else {
            break;
        };
        attempts_seen.insert(attempt_of(&delivery));
        worker.die().await;
    }
    assert_eq!(attempts_seen, [None, Some(2)].into_iter().collect());
    let mut parked = json!(null);
    eventually("both are parked", async || {
        parked = app.get("/v1/parked").await.1;
        parked["parked"].as_array().is_some_and(|p| p.len() == 2)
    })
    .await;
    let reason_of = |queue: &str| {
        let list = parked["parked"].as_array().unwrap();
        let found = list.iter().find(|p| p["queue"] == queue).unwrap();
        (
            found["reason"].as_str().unwrap().to_owned(),
            found["attempts"].as_u64(),
        )
    };
    assert_eq!(reason_of(&limited), ("delivery_limit".to_owned(), Some(2)));
    assert_eq!(reason_of(&expiring), ("expired".to_owned(), Some(2)));
    // Discarded by filter: the expired one only.
    let discard = json!({"filter": {"reason": "expired"}, "action": "discard"});
    let (status, done) = app.post("/v1/parked/bulk", &discard).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done, json!({"matched": 1, "changed": 1, "unchanged": 0}));
    let (_, left) = app.get("/v1/parked").await;
    assert_eq!(left["parked"].as_array().unwrap().len(), 1);
    assert_eq!(left["parked"][0]["queue"], limited);
    let scrape = app.scrape().await;
    let discarded =
        format!("delayline_retry_messages_total{{queue=\"{expiring}\",outcome=\"discarded\"}}");
    assert_eq!(sample(&scrape, &discarded), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_no_policy_covers_goes_to_the_refused_queue_and_is_never_looped() {
    let mut app = TestApp::spawn(settings_with(vec![policy(&["covered"])])).await;
    let arguments = dead_letters_to(&app, &[]);
    let stray = declare_queue(&mut app, "stray", arguments).await;
    let refused_queue = format!("{}.retry.refused", app.cascade.prefix());
    let mut refused = TestConsumer::existing(&refused_queue).await;
    let mut worker = Worker::on(&stray).await;
    publish(&stray, b"nobody's", BasicProperties::default()).await;
    reject_all(&mut worker, 1).await;
    let copy = refused
        .next(Duration::from_secs(10))
        .await
        .expect("refused");
    assert_eq!(copy.body, b"nobody's");
    let code = copy.header(REFUSAL_CODE_HEADER).cloned();
    assert_eq!(code, Some(text("no_retry_policy")));
    assert!(
        worker.next(Duration::from_millis(1_500)).await.is_none(),
        "not looped"
    );
    let refused_count = "delayline_retry_messages_total{queue=\"\",outcome=\"refused\"}";
    assert_eq!(sample(&app.scrape().await, refused_count), Some(1.0));
    let (status, policies) = app.get("/v1/retries").await;
    assert_eq!(status, 200);
    assert_eq!(
        policies["exchange"],
        format!("{}.retry", app.cascade.prefix())
    );
    assert_eq!(policies["policies"][0]["initial_ms"], 200);
    assert_eq!(policies["policies"][0]["max_attempts"], 4);
    assert_eq!(policies["attempt_header"], ATTEMPT_HEADER);
}

/// A consumer's own time: the message published to the retry exchange with
/// the queue and a wait (or a time), then acked, comes back then, never
/// earlier, as the next attempt, without the three headers; a wait beyond
/// the policy's `max_delay`, or headers without a time, are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_at_the_consumers_time_comes_back_then_and_a_wait_beyond_the_policy_is_refused() {
    let mut app = TestApp::spawn(settings_with(vec![policy(&["timed"])])).await;
    let arguments = dead_letters_to(&app, &[]);
    let queue = declare_queue(&mut app, "timed", arguments).await;
    let exchange = format!("{}.retry", app.cascade.prefix());
    let refused_queue = format!("{}.retry.refused", app.cascade.prefix());
    let mut refused = TestConsumer::existing(&refused_queue).await;
    let mut worker = Worker::on(&queue).await;
    let properties = BasicProperties::default().with_message_id("timed-1".into());
    publish(&queue, b"later, please", properties).await;

    // After a wait: back that long after delayline took it in, or later.
    let (first_at, first) = worker
        .next(Duration::from_secs(20))
        .await
        .expect("a delivery");
    assert_eq!(attempt_of(&first), None);
    let after = [(RETRY_AFTER_HEADER, AMQPValue::LongLongInt(1_500))];
    ask_back(&exchange, &queue, &first, &after).await;
    first.ack(BasicAckOptions::default()).await.unwrap();
    let second = came_back(&mut worker, first_at + 1_500, 2).await;

    // At a time (RFC 3339), within the policy's max_delay (2 s): back then.
    let back_at = now_ms() + 1_800;
    let at = [(RETRY_AT_HEADER, text(&format_epoch_ms(back_at)))];
    ask_back(&exchange, &queue, &second, &at).await;
    second.ack(BasicAckOptions::default()).await.unwrap();
    let third = came_back(&mut worker, back_at, 3).await;

    // Beyond the policy's max_delay (2 s), or without a time: refused.
    let too_long = vec![(RETRY_AFTER_HEADER, AMQPValue::LongLongInt(60_000))];
    for (asks, code) in [
        (too_long, "retry_wait_too_long"),
        (vec![], "bad_retry_headers"),
    ] {
        ask_back(&exchange, &queue, &third, &asks).await;
        let copy = refused
            .next(Duration::from_secs(10))
            .await
            .expect("refused");
        assert_eq!(copy.header(REFUSAL_CODE_HEADER).cloned(), Some(text(code)));
    }
    third.ack(BasicAckOptions::default()).await.unwrap();
    assert!(
        worker.next(Duration::from_millis(1_500)).await.is_none(),
        "nothing more"
    );
}

/// The next delivery: at `back_at` or later (within the lateness allowed
/// here), as `attempt`, the message as it left, without the headers that
/// asked for it.
async fn came_back(worker: &mut Worker, back_at: u64, attempt: i64) -> Delivery {
    let (came, delivery) = worker.next(Duration::from_secs(20)).await.expect("back");
    assert!(came >= back_at, "back {} ms early", back_at - came);
    assert!(
        came <= back_at + LATE_ALLOWED_MS,
        "back {} ms late",
        came - back_at
    );
    assert_eq!(attempt_of(&delivery), Some(attempt));
    assert_eq!(delivery.data, b"later, please");
    let id = delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str().to_owned());
    assert_eq!(id.as_deref(), Some("timed-1"));
    let headers = delivery.properties.headers().clone().unwrap_or_default();
    for asked in [RETRY_QUEUE_HEADER, RETRY_AT_HEADER, RETRY_AFTER_HEADER] {
        assert!(!headers.inner().contains_key(asked), "{asked} came back");
    }
    delivery
}

/// Publishes `delivery` again to the retry `exchange` as a consumer asking
/// for its own retry time does: its properties and headers, plus the queue
/// and `asks` (confirmed).
async fn ask_back(exchange: &str, queue: &str, delivery: &Delivery, asks: &[(&str, AMQPValue)]) {
    let mut headers = delivery.properties.headers().clone().unwrap_or_default();
    headers.insert(RETRY_QUEUE_HEADER.into(), text(queue));
    for (name, value) in asks {
        headers.insert((*name).into(), value.clone());
    }
    let properties = delivery.properties.clone().with_headers(headers);
    crate::ingress::publish(exchange, "", &delivery.data, properties).await;
}

/// The retries page's recipe for a 429's `Retry-After`, run as written:
/// the message comes back after exactly that long, as attempt 2, and is
/// acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pika_recipe_for_a_429_brings_the_message_back_after_retry_after() {
    let mut app = TestApp::spawn(settings_with(vec![policy(&["limited"])])).await;
    let arguments = dead_letters_to(&app, &[("x-queue-type", text("quorum"))]);
    let queue = declare_queue(&mut app, "limited", arguments).await;
    let exchange = format!("{}.retry", app.cascade.prefix());
    let recipe = crate::lifecycle::doc_block(
        "docs/retries.md",
        "## A retry at your consumer's time",
        "python",
        0,
    );
    let consumer = Recipe::start(&recipe, [amqp_uri(), &queue, &exchange, "2"]);
    let properties = BasicProperties::default().with_message_id("call-7".into());
    publish(&queue, b"{}", properties).await;
    let seen = consumer.lines(2).await;
    let attempts: Vec<i64> = seen
        .iter()
        .map(|s| s["attempt"].as_i64().unwrap())
        .collect();
    assert_eq!(attempts, [1, 2]);
    let gap = seen[1]["at_ms"].as_u64().unwrap() - seen[0]["at_ms"].as_u64().unwrap();
    assert!(gap >= 2_000, "back after {gap} ms, Retry-After was 2 s");
    assert!(gap <= 2_000 + LATE_ALLOWED_MS, "back after {gap} ms");
    assert_eq!(seen[1]["message_id"], "call-7");
}

/// A parked message replayed at a time (a body with a delay) comes back
/// then, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_message_replayed_at_a_time_comes_back_then() {
    let once = RetrySettings {
        max_attempts: 1,
        ..policy(&["once"])
    };
    let mut app = TestApp::spawn(settings_with(vec![once])).await;
    let arguments = dead_letters_to(&app, &[]);
    let queue = declare_queue(&mut app, "once", arguments).await;
    let mut worker = Worker::on(&queue).await;
    publish(&queue, b"parked", BasicProperties::default()).await;
    reject_all(&mut worker, 1).await;
    let path = format!("/v1/parked?queue={queue}");
    eventually("parked", async || {
        app.get(&path).await.1["parked"]
            .as_array()
            .is_some_and(|p| p.len() == 1)
    })
    .await;
    let (_, parked) = app.get(&path).await;
    let id = parked["parked"][0]["id"].as_str().unwrap().to_owned();
    let (status, refused) = app
        .post(
            &format!("/v1/parked/{id}/replay"),
            &json!({"delay": "soon"}),
        )
        .await;
    assert_eq!(
        (status, &refused["error"]["code"]),
        (422, &json!("invalid_delay"))
    );
    let asked_at = now_ms();
    let (status, done) = app
        .post(
            &format!("/v1/parked/{id}/replay"),
            &json!({"delay_ms": 1_500}),
        )
        .await;
    assert_eq!((status, &done["changed"]), (200, &json!(1)), "{done}");
    let (came, delivery) = worker
        .next(Duration::from_secs(20))
        .await
        .expect("replayed");
    assert!(
        came >= asked_at + 1_500,
        "back {} ms early",
        asked_at + 1_500 - came
    );
    assert_eq!(delivery.data, b"parked");
    delivery.ack(BasicAckOptions::default()).await.unwrap();
}

/// Parked messages by group (queue, reason, the hour their failure
/// began), with counts, over the API and the command line; a group
/// replayed and another discarded as a whole, by its filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_messages_are_grouped_and_a_group_replayed_or_discarded_whole() {
    let once = RetrySettings {
        max_attempts: 2,
        ..policy(&["ga", "gb"])
    };
    let mut app = TestApp::spawn(settings_with(vec![once])).await;
    let arguments = dead_letters_to(&app, &[]);
    let a = declare_queue(&mut app, "ga", arguments.clone()).await;
    let b = declare_queue(&mut app, "gb", arguments).await;
    let started_ms = now_ms();
    let mut worker_a = Worker::on(&a).await;
    let mut worker_b = Worker::on(&b).await;
    for (queue, worker, count) in [(&a, &mut worker_a, 3), (&b, &mut worker_b, 2)] {
        for n in 0..count {
            publish(
                queue,
                format!("m{n}").as_bytes(),
                BasicProperties::default(),
            )
            .await;
        }
        // Each fails twice: its first failure's hour is its group's.
        reject_all(worker, count * 2).await;
    }
    eventually("all five parked", async || {
        app.get("/v1/parked").await.1["parked"]
            .as_array()
            .is_some_and(|p| p.len() == 5)
    })
    .await;
    let (status, groups) = app.get("/v1/parked/groups").await;
    assert_eq!(status, 200, "{groups}");
    let groups = groups["groups"].as_array().unwrap().clone();
    assert_eq!(groups.len(), 2, "{groups:?}");
    let hour = started_ms - started_ms % 3_600_000;
    for (group, queue, count) in [(&groups[0], &a, 3), (&groups[1], &b, 2)] {
        assert_eq!(
            (&group["queue"], &group["parked"]),
            (&json!(queue), &json!(count))
        );
        assert_eq!(group["reason"], "rejected");
        let first = parse_epoch_ms(group["first_failed_hour"].as_str().unwrap()).unwrap();
        // The hour may have turned while the test ran.
        assert!(first == hour || first == hour + 3_600_000, "{group}");
    }
    let printed = cli(&app, &["parked", "groups"]).await;
    assert!(
        printed.contains(a.as_str()) && printed.contains(b.as_str()),
        "{printed}"
    );

    // Replay group a (its filter as the groups answer it): all three back.
    let filter = json!({"queue": a, "reason": "rejected",
                        "first_failed_hour": groups[0]["first_failed_hour"]});
    let (status, done) = app
        .post(
            "/v1/parked/bulk",
            &json!({"filter": filter, "action": "replay"}),
        )
        .await;
    assert_eq!((status, &done["changed"]), (200, &json!(3)), "{done}");
    for _ in 0..3 {
        let (_, delivery) = worker_a
            .next(Duration::from_secs(20))
            .await
            .expect("replayed");
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    // Discard group b from the command line.
    let hour_b = groups[1]["first_failed_hour"].as_str().unwrap();
    let args = [
        "parked",
        "discard",
        "--queue",
        &b,
        "--reason",
        "rejected",
        "--first-failed-hour",
        hour_b,
    ];
    let printed = cli(&app, &args).await;
    assert!(printed.starts_with("discarded 2 of 2"), "{printed}");
    let (_, groups) = app.get("/v1/parked/groups").await;
    assert_eq!(groups["groups"], json!([]));
    assert!(worker_b.next(Duration::from_millis(500)).await.is_none());
}

/// `delayline ARGS --url` against `app`: what it printed.
async fn cli(app: &TestApp, args: &[&str]) -> String {
    let args = [args, &["--url", app.base.as_str()]].concat();
    let output = crate::common::delayline_command(&app.settings, &args)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{args:?}: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_limit_on_the_queue_holds_its_retries_until_resumed() {
    let mut app = TestApp::spawn(settings_with(vec![policy(&["paced"])])).await;
    let arguments = dead_letters_to(&app, &[]);
    let queue = declare_queue(&mut app, "paced", arguments).await;
    let limit = json!({"destinations": queue, "paused": true});
    let (status, body) = app.put("/v1/limits/paced", &limit).await;
    assert_eq!(status, 201, "{body}");
    let mut worker = Worker::on(&queue).await;
    publish(&queue, b"later", BasicProperties::default()).await;
    reject_all(&mut worker, 1).await;
    // Due after 200 ms, it waits for the limit instead.
    assert!(
        worker.next(Duration::from_millis(1_500)).await.is_none(),
        "held"
    );
    let path = format!("/v1/tasks?destination={queue}&state=waiting");
    eventually("the retry waits for the limit", async || {
        app.get(&path).await.1["tasks"]
            .as_array()
            .is_some_and(|t| t.len() == 1)
    })
    .await;
    let (status, _) = app.post("/v1/limits/paced/resume", &json!({})).await;
    assert_eq!(status, 200);
    let (_, delivery) = worker
        .next(Duration::from_secs(10))
        .await
        .expect("released");
    assert_eq!(attempt_of(&delivery), Some(2));
    assert_eq!(delivery.data, b"later");
    delivery.ack(BasicAckOptions::default()).await.unwrap();
}

/// A policy with `max_lateness`: a retry held past it (its queue's limit
/// paused) is never delivered; it expires in the ledger, and a replay of
/// it brings the message back to its queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_held_past_its_policys_max_lateness_expires_and_can_be_replayed() {
    let late = RetrySettings {
        max_lateness: Some("300ms".into()),
        ..policy(&["late"])
    };
    let mut app = TestApp::spawn(settings_with(vec![late])).await;
    let (_, policies) = app.get("/v1/retries").await;
    assert_eq!(
        policies["policies"][0]["max_lateness_ms"], 300,
        "{policies}"
    );
    let arguments = dead_letters_to(&app, &[]);
    let queue = declare_queue(&mut app, "late", arguments).await;
    let limit = json!({"destinations": queue, "paused": true});
    let (status, body) = app.put("/v1/limits/late", &limit).await;
    assert_eq!(status, 201, "{body}");
    let mut worker = Worker::on(&queue).await;
    publish(&queue, b"too late", BasicProperties::default()).await;
    reject_all(&mut worker, 1).await;
    let path = format!("/v1/tasks?destination={queue}&state=expired");
    eventually("the held retry expires", async || {
        app.get(&path).await.1["tasks"]
            .as_array()
            .is_some_and(|t| t.len() == 1)
    })
    .await;
    let (_, expired) = app.get(&path).await;
    let id = expired["tasks"][0]["id"].as_str().unwrap().to_owned();
    let (status, _) = app.post("/v1/limits/late/resume", &json!({})).await;
    assert_eq!(status, 200);
    assert!(
        worker.next(Duration::from_millis(1_500)).await.is_none(),
        "an expired retry was delivered"
    );
    let (status, replay) = app
        .post(&format!("/v1/tasks/{id}/replay"), &json!({}))
        .await;
    assert_eq!(status, 202, "{replay}");
    let (_, delivery) = worker
        .next(Duration::from_secs(10))
        .await
        .expect("replayed");
    assert_eq!(attempt_of(&delivery), Some(2));
    assert_eq!(delivery.data, b"too late");
    delivery.ack(BasicAckOptions::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_parked_messages_and_replays_one_now_one_later_and_discards_a_group() {
    use crate::console::{Browser, csrf_of};
    use delayline::auth::token::hash_hex;
    use delayline::auth::{ClientSettings, TokenHashes};

    let mut settings = settings_with(vec![RetrySettings {
        max_attempts: 1,
        ..policy(&["clicks"])
    }]);
    let client = |name: &str, permissions: &[&str]| ClientSettings {
        name: name.to_owned(),
        token_sha256: TokenHashes::One(hash_hex(&format!("tok-{name}"))),
        destinations: vec!["#".to_owned()],
        permissions: permissions.iter().map(|p| (*p).to_owned()).collect(),
        ..ClientSettings::default()
    };
    settings.auth.clients = vec![client("ops", &["admin"]), client("viewer", &["read"])];
    let mut app = TestApp::spawn(settings).await;
    let arguments = dead_letters_to(&app, &[]);
    let queue = declare_queue(&mut app, "clicks", arguments).await;
    let mut worker = Worker::on(&queue).await;
    for n in 0..3 {
        let body = format!("click {n}");
        publish(&queue, body.as_bytes(), BasicProperties::default()).await;
    }
    reject_all(&mut worker, 3).await;

    let ops = Browser::sign_in(&app, "tok-ops").await;
    let mut page = String::new();
    eventually("all three are parked", async || {
        page = ops.get("/console/parked").await.1;
        // The count and the list are two reads: wait for both to show three.
        page.contains(&format!(">{queue}</a></td><td>3</td>"))
            && (0..3).all(|n| page.contains(&format!("click {n}")))
            && page.contains("Replay group")
    })
    .await;
    // Newest first.
    let (first, second) = (page.find("click 2").unwrap(), page.find("click 1").unwrap());
    assert!(first < second, "newest first");
    let viewer = Browser::sign_in(&app, "tok-viewer").await;
    assert_eq!(viewer.get("/console/parked").await.0, 403);

    // Replay: the newest, at once.
    let csrf = csrf_of(&page);
    let ids = replay_paths(&page);
    let delivery = replay_on_console(&ops, &ids[0], &[("csrf", &csrf)], &mut worker).await;
    assert_eq!(delivery.data, b"click 2");
    delivery.ack(BasicAckOptions::default()).await.unwrap();

    // Replay later: the next, a second after the click, never before.
    let clicked = std::time::Instant::now();
    let form = [("csrf", csrf.as_str()), ("delay", "1s")];
    let delivery = replay_on_console(&ops, &ids[1], &form, &mut worker).await;
    assert!(
        clicked.elapsed() >= Duration::from_secs(1),
        "early: {:?}",
        clicked.elapsed()
    );
    assert_eq!(delivery.data, b"click 1");
    delivery.ack(BasicAckOptions::default()).await.unwrap();

    // Discard the group (its queue, reason and hour, as the page's form says).
    let page = ops.get("/console/parked").await.1;
    let value = |name: &str| {
        let field = format!("name=\"{name}\" value=\"");
        let at = page
            .find(&field)
            .unwrap_or_else(|| panic!("no {name} in {page}"))
            + field.len();
        page[at..at + page[at..].find('"').unwrap()].to_owned()
    };
    let (reason, hour) = (value("reason"), value("first_failed_hour"));
    let form = [
        ("csrf", csrf.as_str()),
        ("queue", queue.as_str()),
        ("reason", reason.as_str()),
        ("first_failed_hour", hour.as_str()),
        ("action", "discard"),
    ];
    let (status, location) = ops.post("/console/parked/bulk", &form, "same-origin").await;
    assert_eq!(status, 303, "{location}");
    assert!(location.contains("discarded%201%20of%201"), "{location}");
    assert!(
        ops.get("/console/parked")
            .await
            .1
            .contains("Nothing is parked.")
    );
}

/// Posts one of the Parked page's replay forms (to `path`), which says it
/// replayed one message, and receives that message.
async fn replay_on_console(
    ops: &crate::console::Browser,
    path: &str,
    form: &[(&str, &str)],
    worker: &mut Worker,
) -> Delivery {
    let (status, location) = ops.post(path, form, "same-origin").await;
    assert_eq!(status, 303, "{location}");
    assert!(location.contains("replayed%201%20of%201"), "{location}");
    let (_, delivery) = worker
        .next(Duration::from_secs(10))
        .await
        .expect("the replayed message");
    delivery
}

/// The replay forms' paths on the console's Parked page, in its order
/// (each message has a Replay and a Replay later form, to one path).
fn replay_paths(page: &str) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    for (at, _) in page.match_indices("/replay\"") {
        let start = page[..at].rfind("/console/parked/").unwrap();
        let path = &page[start..at + "/replay".len()];
        if paths.last().is_none_or(|last| last != path) {
            paths.push(path.to_owned());
        }
    }
    paths
}

/// `settings`' retry policies as the file a service reads (`[[retry]]` is
/// read from a file only), under `target/`.
pub(crate) fn retry_config_file(settings: &Settings) -> std::path::PathBuf {
    let mut text = String::new();
    for policy in &settings.retry {
        let queues: Vec<String> = policy.queues.iter().map(|q| format!("{q:?}")).collect();
        text.push_str(&format!(
            "[[retry]]\nname = {:?}\nqueues = [{}]\ninitial = {:?}\nmultiplier = {}\n\
             max_delay = {:?}\njitter = {}\nmax_attempts = {}\n\n",
            policy.name,
            queues.join(", "),
            policy.initial,
            policy.multiplier,
            policy.max_delay,
            policy.jitter,
            policy.max_attempts
        ));
    }
    let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-configs");
    std::fs::create_dir_all(&folder).unwrap();
    let path = folder.join(format!("{}.toml", settings.cascade.prefix));
    std::fs::write(&path, text).unwrap();
    path
}

/// The binary, with `settings` and their retry policies, on `port`.
pub(crate) async fn serve(
    settings: &Settings,
    config: &std::path::Path,
    port: u16,
) -> tokio::process::Child {
    let mut command = crate::common::serve_command(settings, port);
    command.env("DELAYLINE_CONFIG", config);
    let child = command.spawn().unwrap();
    wait_connected_at(&reqwest::Client::new(), &format!("http://127.0.0.1:{port}")).await;
    child
}

/// Counts a delivery by its message id, and acknowledges it.
pub(crate) async fn count_and_ack(
    counts: &mut std::collections::HashMap<String, u32>,
    delivery: Delivery,
) {
    let id = delivery
        .properties
        .message_id()
        .as_ref()
        .unwrap()
        .to_string();
    *counts.entry(id).or_default() += 1;
    delivery.ack(BasicAckOptions::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_while_taking_retries_in_and_while_messages_are_parked_loses_nothing() {
    let settings = settings_with(vec![
        RetrySettings {
            name: "killed".into(),
            ..policy(&["killed"])
        },
        RetrySettings {
            name: "parks".into(),
            max_attempts: 1,
            ..policy(&["parks"])
        },
    ]);
    let prefix = settings.cascade.prefix.clone();
    let mut cleanup = Cleanup::for_settings(&settings);
    let config = retry_config_file(&settings);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = serve(&settings, &config, port).await;
    let (killed, parks) = (format!("{prefix}.killed"), format!("{prefix}.parks"));
    for queue in [&killed, &parks] {
        declare_named(&mut cleanup, queue, dead_letters_under(&prefix, &[])).await;
    }

    // Killed while hundreds of rejected messages are being taken in.
    const SENT: usize = 300;
    for n in 0..SENT {
        let properties = BasicProperties::default().with_message_id(format!("k-{n}").into());
        publish(&killed, b"k", properties).await;
    }
    let mut worker = Worker::on(&killed).await;
    reject_all(&mut worker, SENT).await;
    child.kill().await.unwrap();
    let mut child = serve(&settings, &config, port).await;
    let mut back: std::collections::HashMap<String, u32> = Default::default();
    while back.len() < SENT {
        let (_, delivery) = worker
            .next(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("{} never came back", SENT - back.len()));
        assert!(attempt_of(&delivery) >= Some(2), "a retry");
        count_and_ack(&mut back, delivery).await;
    }
    while let Some((_, delivery)) = worker.next(Duration::from_secs(2)).await {
        count_and_ack(&mut back, delivery).await;
    }
    // At least once; a second copy only for what was taken in, not yet
    // acknowledged, when the process died.
    assert!(back.values().all(|copies| *copies <= 2), "{back:?}");

    // Parked, then killed: still parked after the restart, and replayed.
    let mut parking = Worker::on(&parks).await;
    for n in 0..5 {
        let properties = BasicProperties::default().with_message_id(format!("p-{n}").into());
        publish(&parks, b"p", properties).await;
    }
    reject_all(&mut parking, 5).await;
    let http = reqwest::Client::new();
    let parked_count = async || -> u64 {
        let list: Value = http
            .get(format!("{base}/v1/parked"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        list["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["parked"].as_u64().unwrap())
            .sum()
    };
    eventually("five are parked", async || parked_count().await == 5).await;
    child.kill().await.unwrap();
    let mut child = serve(&settings, &config, port).await;
    assert_eq!(parked_count().await, 5);
    let replay = json!({"filter": {"queue": parks}, "action": "replay"});
    let done: Value = http
        .post(format!("{base}/v1/parked/bulk"))
        .json(&replay)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(done, json!({"matched": 5, "changed": 5, "unchanged": 0}));
    for _ in 0..5 {
        let (_, delivery) = parking
            .next(Duration::from_secs(10))
            .await
            .expect("replayed");
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    assert!(
        parking.next(Duration::from_millis(1_000)).await.is_none(),
        "once each"
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policys_park_to_queue_gets_a_copy_of_what_is_parked_with_why() {
    let mut app = TestApp::spawn(settings_with(vec![RetrySettings {
        max_attempts: 1,
        park_to: Some("dead".into()),
        ..policy(&["fragile"])
    }]))
    .await;
    let dead = declare_queue(&mut app, "dead", FieldTable::default()).await;
    let arguments = dead_letters_to(&app, &[]);
    let fragile = declare_queue(&mut app, "fragile", arguments).await;
    let mut copies = TestConsumer::existing(&dead).await;
    let mut worker = Worker::on(&fragile).await;
    let properties = BasicProperties::default().with_message_id("once".into());
    publish(&fragile, b"broken", properties).await;
    reject_all(&mut worker, 1).await;
    let copy = copies.next(Duration::from_secs(10)).await.expect("a copy");
    assert_eq!(copy.body, b"broken");
    assert_eq!(copy.message_id(), "once");
    assert_eq!(
        copy.header(REFUSAL_CODE_HEADER).cloned(),
        Some(text("parked"))
    );
    // And in the ledger, replayable.
    let (_, parked) = app.get(&format!("/v1/parked?queue={fragile}")).await;
    assert_eq!(parked["parked"][0]["message_id"], "once");
}

/// `delayline retries check` finds each broken link between a queue and the
/// retries: before delayline ever started, the retry exchange is missing
/// (RabbitMQ would drop every rejected message); once it runs, a queue
/// wired by its argument or by a RabbitMQ policy passes, a queue that names
/// nothing (seen where the management API is, said as not seen where it is
/// not) and a queue no policy covers are problems, exit 1. And
/// `deprovision` keeps the retry exchange and intake while policies are
/// configured, unless `--drop-retries`. On both brokers (3.10 here has no
/// management API, 4.3 has).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wiring_check_finds_each_broken_link_and_deprovision_keeps_the_retry_exchange() {
    let settings = settings_with(vec![policy(&["by-argument", "by-policy", "unwired"])]);
    let config = retry_config_file(&settings);
    let config = config.to_str().unwrap().to_owned();
    let prefix = settings.cascade.prefix.clone();
    let exchange = format!("{prefix}.retry");
    let check = |queues: &[&str]| {
        let mut args = vec!["--config", config.as_str(), "retries", "check"];
        for queue in queues {
            args.extend(["--queue", queue]);
        }
        args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>()
    };
    let run = async |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::common::run_delayline(&settings, &args).await
    };

    let (ok, before) = run(check(&[])).await;
    assert!(!ok, "{before}");
    let missing = format!("PROBLEM  exchange {exchange} does not exist: RabbitMQ drops");
    assert!(before.contains(&missing), "{before}");

    let mut app = TestApp::spawn(settings.clone()).await;
    let wired = dead_letters_to(&app, &[]);
    let by_argument = declare_queue(&mut app, "by-argument", wired).await;
    let by_policy = declare_queue(&mut app, "by-policy", FieldTable::default()).await;
    let unwired = declare_queue(&mut app, "unwired", FieldTable::default()).await;
    let policy_name = format!("{prefix}-retry-wiring");
    let _cleared = crate::precision::PolicyCleared(policy_name.clone());
    let definition = format!(r#"{{"dead-letter-exchange":"{exchange}"}}"#);
    let pattern = format!("^{}$", by_policy.replace('.', "\\."));
    crate::common::rabbitmqctl(&[
        "set_policy",
        &policy_name,
        &pattern,
        &definition,
        "--apply-to",
        "queues",
    ]);

    let (ok, checked) = run(check(&[])).await;
    println!("{checked}");
    assert!(
        checked.contains(&format!("ok       exchange {exchange} exists")),
        "{checked}"
    );
    assert!(
        checked.contains(&format!(
            "ok       the intake queue {exchange}.intake exists"
        )),
        "{checked}"
    );
    let seen = !checked.contains("unknown  ");
    if std::env::var("DLTEST_MANAGEMENT_URL").is_ok() {
        assert!(seen, "the management API is there: {checked}");
    }
    if seen {
        assert!(!ok, "{checked}");
        let fanout = format!("fanout, bound to the intake {exchange}.intake");
        assert!(checked.contains(&fanout), "{checked}");
        let by_arg =
            format!("ok       {by_argument}'s x-dead-letter-exchange argument names {exchange}");
        assert!(checked.contains(&by_arg), "{checked}");
        eventually("the policy names the exchange", async || {
            let (_, checked) = run(check(&[&by_policy])).await;
            checked.contains(&format!(
                "ok       policy {policy_name} applied to {by_policy} names {exchange}"
            ))
        })
        .await;
        assert!(
            checked.contains(&format!("PROBLEM  nothing names {exchange} for {unwired}")),
            "{checked}"
        );
    } else {
        assert!(ok, "what was not seen is no problem: {checked}");
        assert!(
            checked.contains(&format!(
                "unknown  {unwired}'s arguments and policy not seen"
            )),
            "{checked}"
        );
    }
    let stray = format!("{prefix}.stray");
    let (ok, uncovered) = run(check(&[&stray])).await;
    assert!(!ok, "{uncovered}");
    assert!(
        uncovered.contains(&format!("PROBLEM  no retry policy covers {stray}")),
        "{uncovered}"
    );
    assert!(
        uncovered.contains(&format!("PROBLEM  queue {stray} does not exist")),
        "{uncovered}"
    );

    let _topology = app.stop_keeping_topology().await;
    let deprovision = |more: &[&str]| {
        let mut args = vec!["--config", config.as_str(), "deprovision", "--yes"];
        args.extend(more);
        args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>()
    };
    let (ok, refused) = run(deprovision(&[])).await;
    assert!(!ok, "{refused}");
    assert!(
        refused.contains("1 retry policies are in force"),
        "{refused}"
    );
    let whole = format!("delayline --config {config} deprovision --yes --drop-retries");
    assert!(refused.contains(&whole), "{whole} in {refused}");
    assert!(
        exchange_exists(&exchange).await,
        "a refusal deleted the retry exchange"
    );
    let (ok, deleted) = run(deprovision(&["--drop-retries"])).await;
    assert!(ok, "{deleted}");
    assert!(!exchange_exists(&exchange).await, "{deleted}");
}

async fn exchange_exists(name: &str) -> bool {
    let connection = connect(amqp_uri(), "retry wiring test").await.unwrap();
    let exists = delayline::broker::exchange_exists(&connection, name)
        .await
        .unwrap();
    let _ = connection.close(200, "looked".into()).await;
    exists
}

/// Queues whose names cannot be destinations (a colon, a space, a slash,
/// non-ASCII, 250 bytes) are retried as any other, each under a
/// destination of its own (`GET /v1/retries` says which): its retries are
/// found by `GET /v1/tasks?destination=`, apart from every other queue's,
/// not all under one `_`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_whose_names_cannot_be_destinations_are_retried_each_under_its_own() {
    let prefix_bytes = "dltest-000000000000.".len();
    let long = "l".repeat(250 - prefix_bytes);
    let suffixes = [
        "colon:q",
        "a space",
        "a/slash",
        "commandes-été",
        long.as_str(),
    ];
    let mut app = TestApp::spawn(settings_with(vec![policy(&suffixes)])).await;
    let mut queues = Vec::new();
    for suffix in suffixes {
        let arguments = dead_letters_to(&app, &[]);
        queues.push(declare_queue(&mut app, suffix, arguments).await);
    }
    assert_eq!(queues[4].len(), 250);
    let (status, retries) = app.get("/v1/retries").await;
    assert_eq!(status, 200, "{retries}");
    let mut destinations = std::collections::HashSet::new();
    for queue in &queues {
        let destination = retries["destinations"][queue.as_str()].as_str().unwrap();
        assert!(
            destination.starts_with('_') && destination != "_",
            "{destination}"
        );
        assert!(
            destinations.insert(destination.to_owned()),
            "shared: {destination}"
        );
    }
    for queue in &queues {
        let mut worker = Worker::on(queue).await;
        publish(queue, b"work", BasicProperties::default()).await;
        reject_all(&mut worker, 1).await;
        let (_, back) = worker
            .next(Duration::from_secs(20))
            .await
            .expect("retried to its own queue");
        assert_eq!(attempt_of(&back), Some(2), "{queue}");
        back.ack(BasicAckOptions::default()).await.unwrap();
        let destination = retries["destinations"][queue.as_str()].as_str().unwrap();
        let path = format!("/v1/tasks?destination={destination}");
        let (status, listed) = app.get(&path).await;
        assert_eq!(status, 200, "{listed}");
        let tasks = listed["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 1, "{queue}: {listed}");
        assert_eq!(tasks[0]["destination"], destination);
    }
}
