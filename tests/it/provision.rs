//! The provisioner against a real broker: exact topology, idempotency, conflicts.

use std::collections::BTreeSet;
use std::process::Command;

use crate::common::{Cleanup, TestApp, amqp_uri, queue_depth, rabbitmqctl_json, test_settings};
use delayline::broker::{BrokerError, Status, check, connect, provision, queue_state};
use delayline::cascade::{ArgValue, BindingTarget, QueueType};
use delayline::ingress::{IngressSettings, plan_with};
use delayline::service::ServiceError;
use lapin::options::{
    BasicPublishOptions, ExchangeDeclareOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, ExchangeKind as LapinKind};
use serde_json::Value;

fn arg_json(value: &ArgValue) -> Value {
    match value {
        ArgValue::Str(s) => Value::from(s.as_str()),
        ArgValue::Int(i) => Value::from(*i),
    }
}

/// rabbitmqctl prints arguments as [name, type, value] triples.
fn broker_arguments(object: &Value) -> BTreeSet<(String, String)> {
    object["arguments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a[0].as_str().unwrap().to_owned(), a[2].to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_holds_exactly_the_plan() {
    for queue_type in [QueueType::Quorum, QueueType::Classic] {
        let cascade = test_settings(5, 100, queue_type).cascade().unwrap();
        let _cleanup = Cleanup::for_cascade(&cascade);
        let plan = cascade.plan();
        let connection = connect(amqp_uri(), "delayline test").await.unwrap();
        let report = provision(&connection, &plan).await.unwrap();
        assert_eq!(
            (report.exchanges, report.queues, report.bindings),
            (7, 6, 11)
        );

        let ours = |name: &str| name.starts_with(cascade.prefix());
        let queues = rabbitmqctl_json(&["list_queues", "name", "durable", "type", "arguments"]);
        let queues: Vec<&Value> = queues
            .as_array()
            .unwrap()
            .iter()
            .filter(|q| ours(q["name"].as_str().unwrap()))
            .collect();
        assert_eq!(queues.len(), plan.queues.len());
        for spec in &plan.queues {
            let found = queues
                .iter()
                .find(|q| q["name"] == spec.name.as_str())
                .expect("queue declared");
            assert_eq!(found["durable"], true);
            assert_eq!(found["type"], queue_type.as_str());
            let wanted: BTreeSet<_> = spec
                .arguments
                .iter()
                .map(|(k, v)| (k.clone(), arg_json(v).to_string()))
                .collect();
            let mut found_arguments = broker_arguments(found);
            // RabbitMQ 4 records the type of a classic queue declared without one.
            if queue_type == QueueType::Classic {
                found_arguments.remove(&("x-queue-type".to_owned(), "\"classic\"".to_owned()));
            }
            assert_eq!(found_arguments, wanted, "{}", spec.name);
        }

        let exchanges =
            rabbitmqctl_json(&["list_exchanges", "name", "type", "durable", "arguments"]);
        for spec in &plan.exchanges {
            let found = exchanges
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == spec.name.as_str())
                .expect("exchange declared");
            let kind = spec.kind.as_str();
            assert_eq!(
                (found["type"].as_str(), found["durable"].as_bool()),
                (Some(kind), Some(true))
            );
            let wanted: BTreeSet<_> = spec
                .arguments
                .iter()
                .map(|(k, v)| (k.clone(), arg_json(v).to_string()))
                .collect();
            let mut found_arguments = broker_arguments(found);
            // RabbitMQ 4 records the type of a classic queue declared without one.
            if queue_type == QueueType::Classic {
                found_arguments.remove(&("x-queue-type".to_owned(), "\"classic\"".to_owned()));
            }
            assert_eq!(found_arguments, wanted, "{}", spec.name);
        }

        let bindings = rabbitmqctl_json(&[
            "list_bindings",
            "source_name",
            "destination_name",
            "destination_kind",
            "routing_key",
        ]);
        let on_broker: BTreeSet<(String, String, String, String)> = bindings
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| ours(b["source_name"].as_str().unwrap()))
            .map(|b| {
                let s = |k: &str| b[k].as_str().unwrap().to_owned();
                (
                    s("source_name"),
                    s("destination_kind"),
                    s("destination_name"),
                    s("routing_key"),
                )
            })
            .collect();
        let planned: BTreeSet<_> = plan
            .bindings
            .iter()
            .map(|b| {
                let (kind, name) = match &b.target {
                    BindingTarget::Queue(q) => ("queue", q),
                    BindingTarget::Exchange(e) => ("exchange", e),
                };
                (
                    b.source.clone(),
                    kind.to_owned(),
                    name.clone(),
                    b.routing_key.clone(),
                )
            })
            .collect();
        assert_eq!(on_broker, planned);
        let _ = connection.close(200, "done".into()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioning_twice_changes_nothing() {
    let cascade = test_settings(4, 10, QueueType::Quorum).cascade().unwrap();
    let _cleanup = Cleanup::for_cascade(&cascade);
    let connection = connect(amqp_uri(), "delayline test").await.unwrap();
    let first = provision(&connection, &cascade.plan()).await.unwrap();

    // A parked message must survive re-provisioning.
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(Default::default()).await.unwrap();
    channel
        .basic_publish(
            cascade.business_exchange().into(),
            "0.0.0.0.no.consumer".into(),
            BasicPublishOptions::default(),
            b"kept",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(queue_depth(&cascade.unroutable_queue()).await, 1);

    let second = provision(&connection, &cascade.plan()).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(queue_depth(&cascade.unroutable_queue()).await, 1);
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_queue_is_explained_in_full_and_stops_the_service() {
    let settings = test_settings(4, 100, QueueType::Quorum);
    let cascade = settings.cascade().unwrap();
    let _cleanup = Cleanup::for_cascade(&cascade);
    // Someone declared level 2 by hand: classic, another TTL, no dead-lettering.
    let connection = connect(amqp_uri(), "delayline test").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert("x-message-ttl".into(), AMQPValue::LongInt(999));
    channel
        .queue_declare(
            cascade.level_queue(2).as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            arguments,
        )
        .await
        .unwrap();

    let error = provision(&connection, &cascade.plan()).await.unwrap_err();
    let BrokerError::Conflict(conflict) = &error else {
        panic!("expected a conflict, got {error}");
    };
    assert_eq!(conflict.kind, "queue");
    assert_eq!(conflict.name, cascade.level_queue(2));
    let mut differences: Vec<_> = conflict
        .differences
        .iter()
        // RabbitMQ 4 records the type of a classic queue declared without one.
        .map(|d| match (d.field.as_str(), d.existing.as_str()) {
            ("x-queue-type", "classic") => (d.field.as_str(), "(not set)", "\"quorum\""),
            _ => (d.field.as_str(), d.existing.as_str(), d.wanted.as_str()),
        })
        .collect();
    differences.sort();
    let exchange = format!("{:?}", cascade.level_exchange(1));
    // Every argument RabbitMQ compares on redeclaration; it does not compare
    // x-dead-letter-strategy, so that one cannot be seen from outside.
    assert_eq!(
        differences,
        [
            ("x-dead-letter-exchange", "(not set)", exchange.as_str()),
            ("x-message-ttl", "999", "400"),
            ("x-overflow", "(not set)", "\"reject-publish\""),
            ("x-queue-type", "(not set)", "\"quorum\""),
        ]
    );
    let message = error.to_string();
    assert!(message.contains(&cascade.level_queue(2)), "{message}");
    assert!(
        message.contains("cannot change a queue's arguments in place"),
        "{message}"
    );
    let _ = connection.close(200, "done".into()).await;

    // The service refuses to start rather than serve a cascade it cannot trust.
    let app = TestApp::start(settings).await;
    match app.join().await {
        Err(ServiceError::Broker(BrokerError::Conflict(c))) => {
            assert_eq!(c.name, cascade.level_queue(2))
        }
        other => panic!("service should stop with the conflict, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_business_exchange_is_explained() {
    let cascade = test_settings(2, 100, QueueType::Classic).cascade().unwrap();
    let _cleanup = Cleanup::for_cascade(&cascade);
    let connection = connect(amqp_uri(), "delayline test").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .exchange_declare(
            cascade.business_exchange().into(),
            LapinKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let error = provision(&connection, &cascade.plan()).await.unwrap_err();
    let BrokerError::Conflict(conflict) = &error else {
        panic!("expected a conflict, got {error}");
    };
    assert_eq!(conflict.kind, "exchange");
    let differences: Vec<_> = conflict
        .differences
        .iter()
        .map(|d| (d.field.as_str(), d.existing.as_str()))
        .collect();
    // RabbitMQ does not compare alternate-exchange once the type differs, so the type is what it reports.
    assert_eq!(differences[0], ("type", "direct"));
    assert!(error.to_string().contains(cascade.business_exchange()));
    let _ = connection.close(200, "done".into()).await;
}

#[test]
fn cli_prints_the_plan_and_routes_without_a_broker() {
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_delayline"))
            .args(args)
            .env("DELAYLINE__CASCADE__LEVELS", "4")
            .env("DELAYLINE__CASCADE__UNIT_MS", "1000")
            .env("DELAYLINE__AMQP__URI", "amqp://guest:guest@127.0.0.1:1/%2f")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    // The default chain holds: 9 units (1001) in the levels, a unit's lead
    // held by the release stage, as many hops as 10 (1010).
    let route = run(&["route", "--delay", "10s", "--destination", "d"]);
    assert!(route.contains("routing_key     1.0.0.1.d"), "{route}");
    assert!(
        route.contains("entry_exchange  delayline.v1.level03"),
        "{route}"
    );
    assert!(route.contains("delay_ms        10000"), "{route}");
    assert!(route.contains("hold_ms         1000"), "{route}");
    // 12 s (1100) would take a hop more with the lead (11 is 1011): 10
    // (1010) has as few, and the release stage holds the other 2 s.
    let route = run(&["route", "--delay", "12s", "--destination", "d"]);
    assert!(route.contains("routing_key     1.0.1.0.d"), "{route}");
    assert!(route.contains("hold_ms         2000"), "{route}");
    // Without the release stage, rounded up to the unit.
    let stateless = Command::new(env!("CARGO_BIN_EXE_delayline"))
        .args(["route", "--delay", "9.5s", "--destination", "d"])
        .env("DELAYLINE__CASCADE__LEVELS", "4")
        .env("DELAYLINE__STORE__URL", "none")
        .output()
        .unwrap();
    let stateless = String::from_utf8(stateless.stdout).unwrap();
    assert!(
        stateless.contains("routing_key     1.0.1.0.d"),
        "{stateless}"
    );
    assert!(stateless.contains("hold_ms         0"), "{stateless}");
    let plan = run(&["provision", "--dry-run"]);
    // Four levels, the unroutable queue and, with the default ledger, the
    // release stage and its notices of unroutable tasks, and the retries'
    // intake and refused queues (a policy can be set while running).
    assert_eq!(plan.lines().filter(|l| l.starts_with("queue")).count(), 9);
    assert!(plan.contains("queue    delayline.retry.intake"), "{plan}");
    assert!(
        plan.contains("queue    delayline.v1.unroutable-seen durable"),
        "{plan}"
    );
    assert!(
        plan.contains("queue    delayline.v1.release durable"),
        "{plan}"
    );
    assert!(
        plan.contains(
            "queue    delayline.v1.level00.wait durable x-dead-letter-exchange=\"delayline.v1.release\""
        ),
        "{plan}"
    );
    assert!(
        plan.contains(
            "queue    delayline.v1.level03.wait durable x-dead-letter-exchange=\"delayline.v1.level02\""
        ),
        "{plan}"
    );

    let bad = Command::new(env!("CARGO_BIN_EXE_delayline"))
        .args(["route", "--delay", "10s", "--destination", "d"])
        .env("DELAYLINE__CASCADE__UNIT_MSEC", "5")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unit_msec"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_lists_every_difference_and_other_versions_and_changes_nothing() {
    let mut settings = test_settings(3, 50, QueueType::Classic);
    let v1 = settings.cascade().unwrap();
    // An ingress's objects are checked with the chain's.
    let ingress = IngressSettings {
        exchange: format!("{}.in", v1.prefix()),
        deliver_to: None,
        kind: "direct".into(),
        routing_keys: Vec::new(),
    }
    .validate(&v1)
    .unwrap();
    let mut cleanup = Cleanup::for_cascade(&v1);
    cleanup
        .queues
        .extend([ingress.queue.clone(), ingress.refused_queue.clone()]);
    cleanup.exchanges.push(ingress.exchange.clone());
    let connection = connect(amqp_uri(), "delayline test").await.unwrap();
    let plan = plan_with(&v1, std::slice::from_ref(&ingress), None);
    provision(&connection, &plan).await.unwrap();

    let report = check(&connection, &v1, &plan).await.unwrap();
    assert_eq!(report.problems(), 0, "{report}");
    assert!(report.other_chains.is_empty());
    let checked: Vec<&str> = report.objects.iter().map(|o| o.name.as_str()).collect();
    for name in [&ingress.exchange, &ingress.queue, &ingress.refused_queue] {
        assert!(checked.contains(&name.as_str()), "{name}: {report}");
    }
    // One of them gone: said missing.
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_delete(
            ingress.refused_queue.as_str().into(),
            QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    let report = check(&connection, &v1, &plan).await.unwrap();
    let missing: Vec<&str> = report
        .objects
        .iter()
        .filter(|o| o.status == Status::Missing)
        .map(|o| o.name.as_str())
        .collect();
    assert_eq!(missing, [ingress.refused_queue.as_str()], "{report}");

    // Same version, another unit: every level queue differs in its TTL.
    let mut other_unit = settings.clone();
    other_unit.cascade.unit_ms = 100;
    let other_unit = other_unit.cascade().unwrap();
    let report = check(&connection, &other_unit, &other_unit.plan())
        .await
        .unwrap();
    let differing: Vec<(String, Vec<String>)> = report
        .objects
        .iter()
        .filter_map(|o| match &o.status {
            Status::Differs(c) => Some((
                o.name.clone(),
                c.differences
                    .iter()
                    .map(|d| format!("{}: {} -> {}", d.field, d.existing, d.wanted))
                    .collect(),
            )),
            _ => None,
        })
        .collect();
    let ttls = |level: u32| {
        vec![format!(
            "x-message-ttl: {} -> {}",
            50 << level,
            100 << level
        )]
    };
    let expected: Vec<_> = (0..3)
        .rev()
        .map(|level| (v1.level_queue(level), ttls(level)))
        .collect();
    assert_eq!(differing, expected);

    // The next version: its objects are missing, and v1 is found beside it.
    settings.cascade.version = 2;
    let v2 = settings.cascade().unwrap();
    let report = check(&connection, &v2, &v2.plan()).await.unwrap();
    let missing: BTreeSet<&str> = report
        .objects
        .iter()
        .filter(|o| o.status == Status::Missing)
        .map(|o| o.name.as_str())
        .collect();
    let mut expected: BTreeSet<String> = (0..3)
        .flat_map(|l| [v2.level_exchange(l), v2.level_queue(l)])
        .collect();
    expected.insert(v2.unroutable_queue());
    assert_eq!(missing, expected.iter().map(String::as_str).collect());
    assert_eq!(report.other_chains.len(), 1);
    assert_eq!(report.other_chains[0].version, 1);
    assert_eq!(report.other_chains[0].levels.len(), 3);
    // Nothing was declared by looking.
    assert!(
        queue_state(&connection, &v2.level_queue(0))
            .await
            .unwrap()
            .is_none()
    );

    // The command says the same and fails while anything is missing.
    let run = |version: &str| {
        Command::new(env!("CARGO_BIN_EXE_delayline"))
            .args(["provision", "--check"])
            .env("DELAYLINE__AMQP__URI", amqp_uri())
            .env("DELAYLINE__CASCADE__PREFIX", v1.prefix())
            .env(
                "DELAYLINE__CASCADE__BUSINESS_EXCHANGE",
                v1.business_exchange(),
            )
            .env("DELAYLINE__CASCADE__LEVELS", "3")
            .env("DELAYLINE__CASCADE__UNIT_MS", "50")
            .env("DELAYLINE__CASCADE__QUEUE_TYPE", "classic")
            .env("DELAYLINE__CASCADE__VERSION", version)
            // As the test's settings have it: no ledger, so no release stage.
            .env("DELAYLINE__STORE__URL", "none")
            .output()
            .unwrap()
    };
    let matching = run("1");
    let out = String::from_utf8_lossy(&matching.stdout);
    assert!(matching.status.success(), "{out}");
    assert!(out.contains("chain v1 matches the plan"), "{out}");
    // Each queue's leader, where the management API answers; else why not.
    assert!(
        out.contains(", led by ") || out.contains("where each queue's leader runs is not known"),
        "{out}"
    );
    let next = run("2");
    let out = String::from_utf8_lossy(&next.stdout);
    assert_eq!(next.status.code(), Some(1), "{out}");
    assert!(
        out.contains(&format!("missing  queue    {}", v2.level_queue(2))),
        "{out}"
    );
    assert!(out.contains("migrate-topology --from 1"), "{out}");
    assert!(
        out.contains("v1: 3 level queues holding 0 messages, and 0 unroutable messages"),
        "{out}"
    );

    // A parked message of v1 counts too, in the singular.
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_publish(
            "".into(),
            v1.unroutable_queue().as_str().into(),
            lapin::options::BasicPublishOptions::default(),
            b"parked",
            lapin::BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    crate::common::eventually("the message to be unroutable", async || {
        crate::common::queue_depth(&v1.unroutable_queue()).await == 1
    })
    .await;
    let out = String::from_utf8_lossy(&run("2").stdout).into_owned();
    assert!(out.contains("and 1 unroutable message;"), "{out}");
    let _ = connection.close(200, "done".into()).await;
}

/// Two instances on one vhost with prefixes of their own and no business
/// exchange named: each delivers to `<prefix>.business`, so a consumer
/// bound to one never receives the other's tasks, though both name the
/// same destination (the guide's security example runs beside the quick
/// start so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_different_prefixes_deliver_only_to_their_own_consumers() {
    use crate::common::{Backend, TestConsumer, with_ledger};
    let mut apps = Vec::new();
    let mut consumers = Vec::new();
    for _ in 0..2 {
        let mut settings = with_ledger(test_settings(4, 10, QueueType::Quorum), Backend::Sqlite);
        settings.cascade.business_exchange = None;
        let prefix = settings.cascade.prefix.clone();
        let mut app = TestApp::spawn(settings).await;
        assert_eq!(
            app.cascade.business_exchange(),
            format!("{prefix}.business")
        );
        consumers.push(TestConsumer::bind(&mut app, "#").await);
        apps.push(app);
    }
    let mut ids = Vec::new();
    for app in &apps {
        let task = serde_json::json!({"destination": "billing.invoice", "delay_ms": 50});
        let (status, accepted) = app.post("/v1/tasks", &task).await;
        assert_eq!(status, 202, "{accepted}");
        ids.push(accepted["id"].as_str().unwrap().to_owned());
    }
    for (consumer, id) in consumers.iter_mut().zip(&ids) {
        let message = consumer
            .next(std::time::Duration::from_secs(10))
            .await
            .expect("its own task");
        assert_eq!(&message.message_id(), id);
        let other = consumer.next(std::time::Duration::from_secs(1)).await;
        assert!(other.is_none(), "another instance's task crossed over");
    }
}
