//! The x-delayed-message plugin's users: producers publish with `x-delay`
//! to an ingress exchange, exactly as they published to the plugin's, with
//! lapin, Python's pika and Node's amqplib; consumers bind their queues to
//! the delivered-to exchange with their usual keys. On the default
//! configuration (SQLite ledger, release stage, quorum queues).

use std::time::{Duration, SystemTime};

use delayline::broker::connect;
use delayline::cascade::QueueType;
use delayline::clock::epoch_ms;
use delayline::config::Settings;
use delayline::ingress::IngressSettings;
use delayline::message::{REFUSAL_CODE_HEADER, REFUSAL_REASON_HEADER, ROUTING_KEY_HEADER};
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, DecimalValue, FieldTable, LongString, ShortString};
use tokio::io::AsyncBufReadExt;

use crate::common::node::node;
use crate::common::python::tool;
use crate::common::{
    Backend, TestApp, TestConsumer, amqp_uri, eventually, sample, test_settings, with_ledger,
};
use crate::lifecycle::{doc_block, readme_block};

/// The guide's page on the migration from the plugin, and its section.
const PLUGIN_PAGE: &str = "docs/plugin.md";
const PLUGIN_SECTION: &str = "# Coming from the x-delayed-message plugin";

/// The lateness a delivery may have here (two cores, the broker beside).
const LATE_ALLOWED_MS: u64 = 5_000;

/// Default settings with one ingress per (name, deliver_to type, accepted keys).
pub(crate) fn settings_with(ingresses: &[(&str, &str, &[&str])]) -> Settings {
    let mut settings = with_ledger(test_settings(8, 10, QueueType::Quorum), Backend::Sqlite);
    let prefix = settings.cascade.prefix.clone();
    settings.ingress = ingresses
        .iter()
        .map(|(name, kind, keys)| IngressSettings {
            exchange: format!("{prefix}.{name}.delayed"),
            deliver_to: Some(format!("{prefix}.{name}")),
            kind: (*kind).to_owned(),
            routing_keys: keys.iter().map(|k| k.to_string()).collect(),
        })
        .collect();
    settings
}

fn headers(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in pairs {
        table.insert(ShortString::from(*name), value.clone());
    }
    table
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// The user the tests connect to the broker as.
fn amqp_user() -> String {
    let uri = amqp_uri();
    let after_scheme = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    let credentials = after_scheme.split_once('@').map_or("guest", |(c, _)| c);
    credentials.split(':').next().unwrap_or("guest").to_owned()
}

/// Publishes as a lapin user publishes to the plugin's exchange: confirmed.
pub(crate) async fn publish(exchange: &str, key: &str, body: &[u8], properties: BasicProperties) {
    let connection = connect(amqp_uri(), "plugin producer").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let confirmation = channel
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            body,
            properties,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(
        confirmation.is_ack(),
        "the broker did not take it: {confirmation:?}"
    );
    let _ = connection.close(200, "published".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapin_producers_and_consumers_of_every_exchange_type_change_one_exchange_name() {
    let settings = settings_with(&[
        ("direct", "direct", &[]),
        ("topic", "topic", &[]),
        ("fanout", "fanout", &[]),
        ("headers", "headers", &[]),
    ]);
    let prefix = settings.cascade.prefix.clone();
    let mut app = TestApp::spawn(settings).await;
    let name = |kind: &str| format!("{prefix}.{kind}");
    let mut consumers = Vec::new();
    for (kind, key) in [
        ("direct", "invoice"),
        ("topic", "billing.*"),
        ("fanout", ""),
    ] {
        let exchange = name(kind);
        consumers.push(TestConsumer::bind_to(&mut app.cleanup, &app.cascade, &exchange, key).await);
    }
    let matching = headers(&[("x-match", text("all")), ("kind", text("invoice"))]);
    let exchange = name("headers");
    consumers.push(
        TestConsumer::bind_with(&mut app.cleanup, &app.cascade, &exchange, "", matching).await,
    );

    let sent_at_ms = epoch_ms(SystemTime::now());
    for (kind, key) in [
        ("direct", "invoice"),
        ("topic", "billing.invoice"),
        ("fanout", "anything"),
        ("headers", "ignored"),
    ] {
        let properties = BasicProperties::default()
            .with_headers(headers(&[
                ("x-delay", AMQPValue::LongInt(300)),
                ("kind", text("invoice")),
                (
                    "nested",
                    AMQPValue::FieldArray(vec![AMQPValue::ShortInt(7)].into()),
                ),
            ]))
            .with_content_type("application/json".into())
            .with_content_encoding("identity".into())
            .with_message_id(format!("{kind}-1").into())
            .with_correlation_id("corr".into())
            .with_reply_to("replies".into())
            .with_priority(4)
            .with_type("invoice.created".into())
            .with_app_id("billing".into())
            .with_timestamp(1_700_000_000)
            .with_expiration("600000".into())
            // The broker checks it against the publishing connection's user.
            .with_user_id(amqp_user().into());
        publish(
            &name(&format!("{kind}.delayed")),
            key,
            b"{\"n\":1}",
            properties,
        )
        .await;
    }

    for (consumer, (kind, key)) in consumers.iter_mut().zip([
        ("direct", "invoice"),
        ("topic", "billing.invoice"),
        ("fanout", "anything"),
        ("headers", "ignored"),
    ]) {
        let message = consumer
            .next(Duration::from_millis(300 + LATE_ALLOWED_MS))
            .await
            .unwrap_or_else(|| panic!("nothing delivered through {kind}"));
        assert!(
            message.received_at_ms >= sent_at_ms + 300,
            "{kind}: {} ms early",
            sent_at_ms + 300 - message.received_at_ms
        );
        assert_eq!(message.routing_key, key, "{kind}");
        assert_eq!(message.body, b"{\"n\":1}");
        let p = &message.properties;
        assert_eq!(
            p.message_id().as_ref().unwrap().as_str(),
            format!("{kind}-1")
        );
        assert_eq!(
            p.content_type().as_ref().unwrap().as_str(),
            "application/json"
        );
        assert_eq!(p.content_encoding().as_ref().unwrap().as_str(), "identity");
        assert_eq!(p.correlation_id().as_ref().unwrap().as_str(), "corr");
        assert_eq!(p.reply_to().as_ref().unwrap().as_str(), "replies");
        assert_eq!(p.priority(), &Some(4));
        assert_eq!(p.kind().as_ref().unwrap().as_str(), "invoice.created");
        assert_eq!(p.app_id().as_ref().unwrap().as_str(), "billing");
        assert_eq!(p.timestamp(), &Some(1_700_000_000));
        assert_eq!(p.delivery_mode(), &Some(2));
        // Held back while it waited, in force again from delivery on.
        assert_eq!(p.expiration().as_ref().unwrap().as_str(), "600000");
        assert_eq!(message.header("kind"), Some(&text("invoice")));
        assert_eq!(
            message.header("nested"),
            Some(&AMQPValue::FieldArray(vec![AMQPValue::ShortInt(7)].into()))
        );
        // delayline publishes as its own user: the producer's travels as a header.
        assert_eq!(p.user_id(), &None);
        assert_eq!(
            message.header("x-delayline-user-id"),
            Some(&text(&amqp_user()))
        );
        // As the plugin does: the delay it waited, negated.
        assert_eq!(
            message.header("x-delay"),
            Some(&AMQPValue::LongLongInt(-300))
        );
        // Named, so that a copy parked as unroutable goes back there.
        assert_eq!(
            message.header("x-delayline-exchange"),
            Some(&text(&name(kind)))
        );
        assert!(message.header("x-delayline-delivery-key").is_none());
        assert!(
            consumer.next(Duration::from_millis(200)).await.is_none(),
            "{kind}: twice"
        );
    }

    // A task like any other: in the ledger, delivered, with its lateness.
    let (status, task) = app.get("/v1/tasks/direct-1").await;
    assert_eq!(status, 200, "{task}");
    eventually("the ingress task to be marked delivered", async || {
        app.get("/v1/tasks/direct-1").await.1["state"] == "delivered"
    })
    .await;
    let scrape = app.scrape().await;
    let accepted = format!(
        "delayline_ingress_messages_total{{ingress=\"{}\",outcome=\"accepted\"}}",
        name("direct.delayed")
    );
    assert_eq!(sample(&scrape, &accepted), Some(1.0), "{scrape}");
    drop(consumers);
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_the_reason_and_a_retry_is_one_task() {
    let settings = settings_with(&[("eu", "topic", &["eu.*"])]);
    let prefix = settings.cascade.prefix.clone();
    let mut app = TestApp::spawn(settings).await;
    let ingress = format!("{prefix}.eu.delayed");
    let refused_queue = format!("{prefix}.ingress.{ingress}.refused");
    let delivered = format!("{prefix}.eu");
    let mut consumer = TestConsumer::bind_to(&mut app.cleanup, &app.cascade, &delivered, "#").await;
    let with_delay =
        |delay: AMQPValue| BasicProperties::default().with_headers(headers(&[("x-delay", delay)]));

    publish(&ingress, "eu.order", b"a", with_delay(text("soon"))).await;
    publish(
        &ingress,
        "eu.order",
        b"b",
        with_delay(AMQPValue::LongLongInt(1 << 40)),
    )
    .await;
    publish(
        &ingress,
        "us.order",
        b"c",
        with_delay(AMQPValue::LongInt(10)),
    )
    .await;
    // Headers the broker took, with no room left for delayline's and the
    // dead-lettering history: it could never be published into the cascade.
    let crowded =
        BasicProperties::default().with_headers(headers(&[("big", text(&"x".repeat(128_000)))]));
    publish(&ingress, "eu.order", b"e", crowded).await;
    // A producer's retry after a lost confirm: one task. Another message
    // with the same id: refused, not lost, not delivered.
    let once = with_delay(AMQPValue::LongInt(50)).with_message_id("once".into());
    publish(&ingress, "eu.order", b"d", once.clone()).await;
    publish(&ingress, "eu.order", b"d", once.clone()).await;
    // The same message as the ingress queue hands it over again after a
    // crash, with the count it adds: the same task, not a conflict.
    let redelivered = BasicProperties::default()
        .with_headers(headers(&[
            ("x-delay", AMQPValue::LongInt(50)),
            ("x-delivery-count", AMQPValue::LongLongInt(1)),
        ]))
        .with_message_id("once".into());
    publish(&ingress, "eu.order", b"d", redelivered).await;
    publish(&ingress, "eu.order", b"other", once).await;
    // A decimal that is a whole number is a delay.
    let decimal = with_delay(AMQPValue::DecimalValue(DecimalValue {
        scale: 0,
        value: 60,
    }))
    .with_message_id("decimal".into());
    publish(&ingress, "eu.decimal", b"f", decimal).await;

    let mut refused = TestConsumer::existing(&refused_queue).await;
    let mut codes = Vec::new();
    for _ in 0..5 {
        let message = refused
            .next(Duration::from_secs(10))
            .await
            .expect("refused");
        let Some(AMQPValue::LongString(code)) = message.header(REFUSAL_CODE_HEADER) else {
            panic!("no refusal code");
        };
        // The key it was published with, kept (as a header: the copy
        // reaches the refused queue by the queue's name).
        let came_with = if message.body == b"c" {
            "us.order"
        } else {
            "eu.order"
        };
        assert_eq!(
            message.header(ROUTING_KEY_HEADER),
            Some(&text(came_with)),
            "{:?}",
            message.body
        );
        if message.body == b"a" {
            // The reason in AMQP's words, not Rust's.
            assert_eq!(
                message.header(REFUSAL_REASON_HEADER),
                Some(&text(
                    "x-delay is the string \"soon\", not a whole number of milliseconds"
                ))
            );
        }
        codes.push((
            String::from_utf8_lossy(code.as_bytes()).into_owned(),
            message.body,
        ));
    }
    codes.sort();
    assert_eq!(
        codes,
        [
            ("bad_delay".to_owned(), b"a".to_vec()),
            ("delay_too_long".to_owned(), b"b".to_vec()),
            ("message_id_conflict".to_owned(), b"other".to_vec()),
            ("routing_key_not_accepted".to_owned(), b"c".to_vec()),
            ("too_large".to_owned(), b"e".to_vec()),
        ]
    );
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let message = consumer
            .next(Duration::from_secs(10))
            .await
            .expect("delivered");
        // Nothing the ingress queue added reaches the consumer.
        assert_eq!(message.header("x-delivery-count"), None);
        bodies.push(message.body);
    }
    bodies.sort();
    assert_eq!(bodies, [b"d".to_vec(), b"f".to_vec()]);
    assert!(
        consumer.next(Duration::from_millis(500)).await.is_none(),
        "delivered twice"
    );
    let (_, once) = app.get("/v1/tasks/once").await;
    assert_eq!(
        once["headers"],
        serde_json::json!({"x-delay": 50}),
        "{once}"
    );

    // An ingress task is a task: cancelled or moved by its message id, and
    // a move publishes its properties again as they came.
    let later = |id: &str| {
        let mut table = headers(&[("x-delay", AMQPValue::LongInt(2_000))]);
        table.insert("tenant".into(), text("acme"));
        BasicProperties::default()
            .with_headers(table)
            .with_message_id(id.into())
            .with_correlation_id("kept".into())
    };
    publish(&ingress, "eu.cancel", b"never", later("to-cancel")).await;
    publish(&ingress, "eu.move", b"moved", later("to-move")).await;
    eventually("both ingress tasks to be scheduled", async || {
        app.get("/v1/tasks/to-cancel").await.1["state"] == "scheduled"
            && app.get("/v1/tasks/to-move").await.1["state"] == "scheduled"
    })
    .await;
    let (status, answer) = app.delete("/v1/tasks/to-cancel").await;
    assert_eq!(status, 200, "{answer}");
    let moved_at_ms = epoch_ms(SystemTime::now());
    let (status, answer) = app
        .patch("/v1/tasks/to-move", &serde_json::json!({"delay_ms": 100}))
        .await;
    assert_eq!(status, 200, "{answer}");
    let message = consumer.next(Duration::from_secs(10)).await.expect("moved");
    assert!(message.received_at_ms >= moved_at_ms + 100, "early");
    assert_eq!(message.body, b"moved");
    assert_eq!(message.routing_key, "eu.move");
    assert_eq!(
        message
            .properties
            .correlation_id()
            .as_ref()
            .unwrap()
            .as_str(),
        "kept"
    );
    assert_eq!(message.header("tenant"), Some(&text("acme")));
    assert!(
        consumer.next(Duration::from_millis(2_500)).await.is_none(),
        "a cancelled or moved copy was delivered"
    );
    let scrape = app.scrape().await;
    for (outcome, count) in [("accepted", 4.0), ("replayed", 2.0), ("bad_delay", 1.0)] {
        let series = format!(
            "delayline_ingress_messages_total{{ingress=\"{ingress}\",outcome=\"{outcome}\"}}"
        );
        assert_eq!(sample(&scrape, &series), Some(count), "{series}");
    }
    drop((refused, consumer));
    app.stop().await.unwrap();
}

/// The plugin README's example, in Python as its users translate it: two
/// messages, the later published first; only the exchange name is ours.
const PIKA_PRODUCER: &str = r#"
import sys
import pika

uri, exchange = sys.argv[1], sys.argv[2]
connection = pika.BlockingConnection(pika.URLParameters(uri))
channel = connection.channel()
channel.confirm_delivery()

channel.basic_publish(exchange=exchange, routing_key="",
                      properties=pika.BasicProperties(headers={"x-delay": 600}),
                      body=b"delayed payload 1")
channel.basic_publish(exchange=exchange, routing_key="",
                      properties=pika.BasicProperties(headers={"x-delay": 200}),
                      body=b"delayed payload 2")
connection.close()
"#;

/// Node's amqplib, as its users publish to the plugin's exchange, with the
/// README's changed declare lines: both exchanges checked (passive), as
/// delayline declared them.
const AMQPLIB_PRODUCER: &str = r#"
const amqp = require("amqplib");
// `node -e`: the arguments follow the interpreter.
const [uri, exchange, deliverTo] = process.argv.slice(1);
(async () => {
  const connection = await amqp.connect(uri);
  const channel = await connection.createConfirmChannel();
  await channel.checkExchange(deliverTo);
  await channel.checkExchange(exchange);
  channel.publish(exchange, "jobs.email", Buffer.from("hello from node"), {
    headers: { "x-delay": 250 }, persistent: true, messageId: "node-1",
    contentType: "text/plain",
  });
  await channel.waitForConfirms();
  await connection.close();
})().catch((error) => { console.error(error); process.exit(1); });
"#;

/// Runs a producer script to its end; its errors fail the test.
async fn run_producer(mut command: tokio::process::Command) {
    let output = command.output().await.unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pika_and_amqplib_producers_publish_as_they_did_to_the_plugin() {
    let settings = settings_with(&[("py", "direct", &[]), ("js", "topic", &[])]);
    let prefix = settings.cascade.prefix.clone();
    let mut app = TestApp::spawn(settings).await;
    let python_queue = format!("{prefix}.py");
    let node_queue = format!("{prefix}.js");
    let mut from_python =
        TestConsumer::bind_to(&mut app.cleanup, &app.cascade, &python_queue, "").await;
    let mut from_node =
        TestConsumer::bind_to(&mut app.cleanup, &app.cascade, &node_queue, "jobs.*").await;

    let sent_at_ms = epoch_ms(SystemTime::now());
    let python = tool("python");
    let mut pika = tokio::process::Command::new(python);
    pika.args([
        "-c",
        PIKA_PRODUCER,
        amqp_uri(),
        &format!("{prefix}.py.delayed"),
    ]);
    run_producer(pika).await;
    let mut amqplib = tokio::process::Command::from(node());
    amqplib.args([
        "-e",
        AMQPLIB_PRODUCER,
        amqp_uri(),
        &format!("{prefix}.js.delayed"),
        &format!("{prefix}.js"),
    ]);
    run_producer(amqplib).await;

    let timeout = Duration::from_millis(600 + LATE_ALLOWED_MS);
    let first = from_python.next(timeout).await.expect("first from pika");
    let second = from_python.next(timeout).await.expect("second from pika");
    // The shorter delay first, as with the plugin; neither early.
    assert_eq!(first.body, b"delayed payload 2");
    assert_eq!(second.body, b"delayed payload 1");
    assert!(first.received_at_ms >= sent_at_ms + 200);
    assert!(second.received_at_ms >= sent_at_ms + 600);
    let from_js = from_node.next(timeout).await.expect("from amqplib");
    assert!(from_js.received_at_ms >= sent_at_ms + 250);
    assert_eq!(from_js.body, b"hello from node");
    assert_eq!(from_js.routing_key, "jobs.email");
    assert_eq!(from_js.message_id(), "node-1");
    assert_eq!(
        from_js.properties.content_type().as_ref().unwrap().as_str(),
        "text/plain"
    );
    drop((from_python, from_node));
    app.stop().await.unwrap();
}

/// The README's pika programs with the test's names: every `"my-…"` name
/// under the test's prefix, and the broker the tests use.
fn readme_program(block: usize, prefix: &str) -> String {
    doc_block(PLUGIN_PAGE, PLUGIN_SECTION, "python", block)
        .replace("\"my-", &format!("\"{prefix}.my-"))
        .replace("amqp://guest:guest@localhost:5672/%2f", amqp_uri())
}

/// The settings a documented configuration block gives.
fn settings_of_block(block: &str) -> Settings {
    let file = std::env::temp_dir().join(format!("dltest-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(&file, block).unwrap();
    let (settings, _) = Settings::load(Some(&file)).unwrap();
    std::fs::remove_file(&file).unwrap();
    settings
}

/// The plugin migration exactly as the guide gives it: its configuration
/// block as the file delayline is started with (the README's brief one is
/// the same ingress), then the plugin README's consumer and producer with
/// their declare lines changed as it shows, declares included. The declare
/// a plugin user had fails on this broker, as the guide says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_migration_runs_as_written() {
    let from_readme = settings_of_block(&doc_block(PLUGIN_PAGE, PLUGIN_SECTION, "toml", 0));
    let brief = settings_of_block(&readme_block(
        "## Coming from the x-delayed-message plugin",
        "toml",
        0,
    ));
    assert_eq!(brief.ingress, from_readme.ingress);
    let mut settings = settings_with(&[]);
    // 10 ms units: 10 levels reach the README's 5 s.
    settings.cascade.levels = 10;
    let prefix = settings.cascade.prefix.clone();
    let mut ingress = from_readme.ingress[0].clone();
    assert_eq!(
        (
            ingress.exchange.as_str(),
            ingress.deliver_to.as_deref(),
            ingress.kind.as_str()
        ),
        ("my-exchange.delayed", Some("my-exchange"), "direct")
    );
    ingress.exchange = format!("{prefix}.{}", ingress.exchange);
    ingress.deliver_to = ingress.deliver_to.map(|to| format!("{prefix}.{to}"));
    settings.ingress = vec![ingress];
    let mut app = TestApp::spawn(settings).await;
    app.cleanup.queues.push(format!("{prefix}.my-queue"));

    // The plugin's own declare, as the user had it: refused by the broker.
    let old_declare = format!(
        "import sys\nimport pika\nconnection = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))\n\
         connection.channel().exchange_declare(exchange=\"{prefix}.my-exchange\", \
         exchange_type=\"x-delayed-message\", durable=True, arguments={{\"x-delayed-type\": \"direct\"}})\n"
    );
    let refused = tokio::process::Command::new(tool("python"))
        .args(["-c", &old_declare, amqp_uri()])
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("unknown exchange type 'x-delayed-message'"),
        "{stderr}"
    );

    let mut consumer = tokio::process::Command::new(tool("python"))
        .args(["-c", &readme_program(0, &prefix)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The consumer's queue is bound before anything is published.
    let queue = format!("{prefix}.my-queue");
    eventually("the README consumer's queue is declared", async || {
        queue_exists(&queue).await
    })
    .await;
    let sent_at_ms = epoch_ms(SystemTime::now());
    let mut producer = tokio::process::Command::new(tool("python"));
    producer.args(["-c", &readme_program(1, &prefix)]);
    run_producer(producer).await;

    let mut lines = tokio::io::BufReader::new(consumer.stdout.take().unwrap()).lines();
    let printed = tokio::time::timeout(
        Duration::from_millis(5_000 + LATE_ALLOWED_MS),
        lines.next_line(),
    )
    .await
    .expect("the consumer printed the message in time")
    .unwrap()
    .expect("a line");
    let received_at_ms = epoch_ms(SystemTime::now());
    assert_eq!(printed, "delayed payload -5000");
    assert!(received_at_ms >= sent_at_ms + 5_000, "early");
    consumer.kill().await.unwrap();
    // Marked delivered once the broker confirmed the release, which may be
    // just after the consumer has it.
    eventually("the README's task is delivered", async || {
        app.get("/v1/tasks/order-17").await.1["state"] == "delivered"
    })
    .await;
    app.stop().await.unwrap();
}

/// Whether a queue of that name is declared (a passive declare).
async fn queue_exists(name: &str) -> bool {
    let connection = connect(amqp_uri(), "queue check").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    let declared = channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .is_ok();
    let _ = connection.close(200, "checked".into()).await;
    declared
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_names_its_exchange_and_one_that_is_missing_is_parked_not_jammed() {
    let settings = settings_with(&[]);
    let prefix = settings.cascade.prefix.clone();
    let mut app = TestApp::spawn(settings).await;
    let orders = format!("{prefix}.orders");
    let missing = format!("{prefix}.missing");
    app.cleanup.declare_exchange(&orders).await;
    let mut consumer =
        TestConsumer::bind_to(&mut app.cleanup, &app.cascade, &orders, "billing.invoice").await;
    let business_key = app.cascade.binding_key("billing.invoice");
    let mut business = TestConsumer::bind(&mut app, &business_key).await;

    let task = |id: &str, exchange: &str| {
        serde_json::json!({"id": id, "destination": "billing.invoice", "delay_ms": 50,
                           "payload": id, "exchange": exchange})
    };
    let (status, answer) = app.post("/v1/tasks", &task("to-orders", &orders)).await;
    assert_eq!(status, 202, "{answer}");
    let (status, answer) = app.post("/v1/tasks", &task("to-nowhere", &missing)).await;
    assert_eq!(status, 202, "{answer}");
    let message = consumer
        .next(Duration::from_secs(10))
        .await
        .expect("at its exchange");
    assert_eq!(message.message_id(), "to-orders");
    assert_eq!(message.routing_key, "billing.invoice");
    let (_, seen) = app.get("/v1/tasks/to-orders").await;
    assert_eq!(seen["exchange"], orders.as_str());

    // The missing exchange parks its task; the stage goes on with the next.
    eventually(
        "the task of a missing exchange to be unroutable",
        async || app.get("/v1/tasks/to-nowhere").await.1["state"] == "unroutable",
    )
    .await;
    let (status, answer) = app
        .post(
            "/v1/tasks",
            &serde_json::json!({"destination": "billing.invoice", "delay_ms": 10}),
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    assert!(
        business.next(Duration::from_secs(10)).await.is_some(),
        "the stage is jammed"
    );

    // Once the exchange exists and is bound, requeue-unroutable sends it there.
    app.cleanup.declare_exchange(&missing).await;
    let mut late =
        TestConsumer::bind_to(&mut app.cleanup, &app.cascade, &missing, "billing.invoice").await;
    let connection = connect(amqp_uri(), "requeue").await.unwrap();
    let requeued = delayline::broker::requeue_unroutable(&connection, &app.cascade)
        .await
        .unwrap();
    assert_eq!(requeued, 1);
    let _ = connection.close(200, "requeued".into()).await;
    let message = late
        .next(Duration::from_secs(10))
        .await
        .expect("requeued to its exchange");
    assert_eq!(message.message_id(), "to-nowhere");

    // An exchange of the user's without an alternate exchange, and no queue
    // bound for the key: the broker returns it, and it is parked too.
    let unbound = serde_json::json!({"id": "unbound", "destination": "nobody.here",
                                     "delay_ms": 10, "exchange": orders});
    let (status, answer) = app.post("/v1/tasks", &unbound).await;
    assert_eq!(status, 202, "{answer}");
    eventually("a returned task to be unroutable", async || {
        app.get("/v1/tasks/unbound").await.1["state"] == "unroutable"
    })
    .await;
    drop((consumer, business, late));
    app.stop().await.unwrap();
}

/// RabbitMQ returns a message no queue took before it confirms it, but the
/// return names no delivery tag: with many releases in flight on one
/// channel, the client library can hand it to another publish's confirm. A
/// task was once marked delivered while the broker had dropped it, and the
/// task whose confirm carried the return was parked although delivered.
/// Half of 300 tasks due in the same millisecond at an exchange of the
/// user's have a queue bound: exactly those arrive, once each, and exactly
/// the others are parked and marked unroutable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returned_releases_among_many_in_flight_are_each_parked_and_no_other() {
    let settings = settings_with(&[]);
    let prefix = settings.cascade.prefix.clone();
    let mut app = TestApp::spawn(settings).await;
    let orders = format!("{prefix}.orders");
    app.cleanup.declare_exchange(&orders).await;
    let mut consumer =
        TestConsumer::bind_to(&mut app.cleanup, &app.cascade, &orders, "billing.invoice").await;

    let tasks: Vec<serde_json::Value> = (0..300)
        .map(|i| {
            let destination = if i % 2 == 0 {
                "billing.invoice".to_owned()
            } else {
                format!("nobody.{i}")
            };
            serde_json::json!({"id": format!("t{i}"), "destination": destination,
                               "delay_ms": 1_500, "payload": i.to_string(),
                               "exchange": orders})
        })
        .collect();
    let (status, answer) = app
        .post("/v1/tasks/batch", &serde_json::json!({"tasks": tasks}))
        .await;
    assert_eq!(status, 200, "{answer}");

    let mut arrived = std::collections::BTreeSet::new();
    while arrived.len() < 150 {
        let message = consumer
            .next(Duration::from_secs(15))
            .await
            .expect("every routable task");
        assert!(
            arrived.insert(message.message_id().to_owned()),
            "{} twice",
            message.message_id()
        );
    }
    let expected: std::collections::BTreeSet<String> =
        (0..300).step_by(2).map(|i| format!("t{i}")).collect();
    assert_eq!(arrived, expected);
    for i in 0..300 {
        let id = format!("t{i}");
        let state = if i % 2 == 0 {
            "delivered"
        } else {
            "unroutable"
        };
        eventually(&format!("{id} to be {state}"), async || {
            app.get(&format!("/v1/tasks/{id}")).await.1["state"] == state
        })
        .await;
    }
    assert!(
        consumer.next(Duration::from_millis(500)).await.is_none(),
        "a parked task arrived"
    );
    drop(consumer);
    app.stop().await.unwrap();
}

/// The plugin page's step 2, its command as written, deletes an exchange on
/// this broker: the management API, on RabbitMQ 3.10 and 4.x alike (the
/// page once named a `rabbitmqctl` command that exists on neither). The
/// shared broker's API when it has one (`DLTEST_MANAGEMENT_URL`), else a
/// node of the test's own with the plugin on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_pages_delete_command_deletes_the_exchange() {
    use crate::common::nodes::{BrokerNode, NodeOptions};
    let (node, uri, api) = match std::env::var("DLTEST_MANAGEMENT_URL") {
        Ok(url) => (None, amqp_uri().to_owned(), url),
        Err(_) => {
            let node = BrokerNode::start(&NodeOptions {
                management: true,
                ..NodeOptions::default()
            });
            let api = format!(
                "http://guest:guest@127.0.0.1:{}",
                node.management_port.unwrap()
            );
            let uri = node.uri();
            (Some(node), uri, api)
        }
    };
    let (credentials, address) = api
        .trim_start_matches("http://")
        .split_once('@')
        .expect("the API's URL names its user");
    let id = uuid::Uuid::new_v4().simple().to_string();
    let exchange = format!("dltest-{}.my-exchange", &id[..12]);
    let connection = connect(&uri, "plugin page test").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .exchange_declare(
            exchange.as_str().into(),
            lapin::ExchangeKind::Direct,
            lapin::options::ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    // Block 0 reads the plugin's `messages_delayed`, which only the plugin's
    // exchange has; block 1 deletes.
    let command = doc_block(PLUGIN_PAGE, PLUGIN_SECTION, "sh", 1)
        .replace("guest:guest", credentials)
        .replace("localhost:15672", address)
        .replace("my-exchange", &exchange);
    let ran = tokio::process::Command::new("sh")
        .args(["-c", &command])
        .output()
        .await
        .unwrap();
    assert!(
        ran.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let still_there = delayline::broker::exchange_exists(&connection, &exchange)
        .await
        .unwrap();
    assert!(!still_there, "{exchange} is still declared");
    let _ = connection.close(200, "done".into()).await;
    drop(node);
}
