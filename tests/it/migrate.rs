//! `migrate-topology` against a real broker, with tasks in flight: every task
//! still arrives, never early; what cannot be rescheduled is kept, not lost;
//! the old chain is gone afterwards; a crash in the middle costs at worst a
//! duplicate.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::{
    Backend, Cleanup, TestApp, TestConsumer, amqp_uri, close_connections_named, eventually,
    queue_depth, run_delayline, sample, test_settings, with_ledger,
};
use delayline::broker::{
    MigrationReport, OldChain, connect, exchange_exists, migrate_topology, provision, queue_state,
};
use delayline::cascade::{Cascade, QueueType};
use delayline::config::Settings;
use delayline::message::{POISON_REASON_HEADER, ROUTING_KEY_HEADER};
use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use lapin::types::AMQPValue;
use serde_json::json;

/// Version 1: 6 levels of 100 ms, of `source` queues (quorum, the default,
/// unless a test says otherwise). Version 2 changes every setting a queue
/// cannot change in place: 9 levels of 20 ms, the other queue type.
fn old_and_new(source: QueueType) -> (Settings, Settings) {
    let old = test_settings(6, 100, source);
    let mut new = old.clone();
    new.cascade.version = 2;
    new.cascade.levels = 9;
    new.cascade.unit_ms = 20;
    new.cascade.queue_type = match source {
        QueueType::Quorum => QueueType::Classic,
        QueueType::Classic => QueueType::Quorum,
    };
    (old, new)
}

/// Accepts tasks for `destination` into the old chain, due over the next `spread`.
async fn accept_tasks(app: &TestApp, count: u64, spread_ms: u64) -> HashSet<String> {
    let mut ids = HashSet::new();
    for n in 0..count {
        let body = json!({"destination": "moved", "delay_ms": n * spread_ms / count});
        let (status, accepted) = app.post("/v1/tasks", &body).await;
        assert_eq!(status, 202, "{accepted}");
        ids.insert(accepted["id"].as_str().unwrap().to_owned());
    }
    ids
}

/// A task for a destination nobody binds: parked at once.
async fn park_one(app: &TestApp) {
    let body = json!({"destination": "nobody", "delay_ms": 0});
    let (status, accepted) = app.post("/v1/tasks", &body).await;
    assert_eq!(status, 202, "{accepted}");
}

async fn old_chain_is_gone(old: &Cascade) {
    let connection = connect(amqp_uri(), "delayline test probe").await.unwrap();
    for level in 0..old.levels() {
        assert!(
            queue_state(&connection, &old.level_queue(level))
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            !exchange_exists(&connection, &old.level_exchange(level))
                .await
                .unwrap()
        );
    }
    assert!(
        queue_state(&connection, &old.unroutable_queue())
            .await
            .unwrap()
            .is_none()
    );
    let _ = connection.close(200, "probed".into()).await;
}

/// Cleans both chains and the new poison queue, whatever the test left.
fn cleanup_both(old: &Cascade, new: &Cascade) -> Cleanup {
    let mut cleanup = Cleanup::for_cascade(old);
    cleanup.queues.push(new.poison_queue());
    cleanup.queues.push(old.poison_queue());
    cleanup
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_in_flight_move_from_a_quorum_chain_and_arrive_once_never_early() {
    tasks_in_flight_move(QueueType::Quorum).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_in_flight_move_from_a_classic_chain_and_arrive_once_never_early() {
    tasks_in_flight_move(QueueType::Classic).await;
}

async fn tasks_in_flight_move(source: QueueType) {
    let (old_settings, new_settings) = old_and_new(source);
    let old = old_settings.cascade().unwrap();
    let new = new_settings.cascade().unwrap();
    let _old_cleanup = cleanup_both(&old, &new);

    let mut old_app = TestApp::spawn(old_settings).await;
    // Consumers bind by destination whatever the number of digits before it.
    let mut consumer = TestConsumer::bind(&mut old_app, "#.moved").await;
    let mut ids = accept_tasks(&old_app, 30, 3000).await;
    park_one(&old_app).await;
    let mut old_topology = old_app.stop_keeping_topology().await;

    // The upgrade: the new version starts beside the old chain, takes tasks,
    // and its metrics show what still waits in the old one.
    let mut new_settings = new_settings;
    new_settings.metrics.queue_poll_ms = 100;
    let new_app = TestApp::spawn(new_settings.clone()).await;
    ids.extend(accept_tasks(&new_app, 5, 1000).await);
    let retired = "delayline_retired_chain_messages{version=\"1\"}";
    eventually("the old chain to show in the metrics", async || {
        sample(&new_app.scrape().await, retired).is_some_and(|n| n > 0.0)
    })
    .await;

    // A message without x-deliver-at-ms, published by something else.
    let connection = connect(amqp_uri(), "delayline test migrate").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    let stray_key = "1.0.0.0.0.0.moved";
    channel
        .basic_publish(
            old.level_exchange(5).as_str().into(),
            stray_key.into(),
            BasicPublishOptions::default(),
            b"stray",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();

    // The runbook's step: `delayline migrate-topology --from 1`, with the new settings.
    let (ok, output) = run_delayline(&new_settings, &["migrate-topology", "--from", "1"]).await;
    assert!(ok, "{output}");
    assert!(
        output.contains(" 1 unroutable messages moved, 1 poisoned"),
        "{output}"
    );
    assert!(output.contains("the old chain is deleted"), "{output}");
    // Six levels and the parking queue, each shown empty before deletion:
    // by the management API where the broker has it, else by ready count.
    let deleted: Vec<&str> = output
        .lines()
        .filter(|l| l.starts_with("deleted "))
        .collect();
    assert_eq!(deleted.len(), 7, "{output}");
    assert!(
        deleted
            .iter()
            .all(|l| l.contains("no message in all (management API")
                || l.contains("no ready message (passive declare")),
        "{output}"
    );
    old_chain_is_gone(&old).await;
    eventually("the old chain to leave the metrics", async || {
        sample(&new_app.scrape().await, retired).is_none()
    })
    .await;

    consumer
        .expect_each_once_never_early(ids, Duration::from_secs(20))
        .await;
    assert_eq!(queue_depth(&new.unroutable_queue()).await, 1);
    let mut poison = TestConsumer::existing(&new.poison_queue()).await;
    let stray = poison.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(stray.body, b"stray");
    assert_eq!(
        stray.header(ROUTING_KEY_HEADER),
        Some(&AMQPValue::LongString(stray_key.into()))
    );
    assert!(stray.header(POISON_REASON_HEADER).is_some());

    // Nothing left to do: a re-run (the runbook's step 5) changes nothing.
    let (ok, output) = run_delayline(&new_settings, &["migrate-topology", "--from", "1"]).await;
    assert!(ok, "{output}");
    assert!(
        output.contains(": 0 rescheduled, 0 already due"),
        "{output}"
    );
    let again = migrate_topology(
        &connection,
        &OldChain::version_of(&new, 1),
        &new,
        &|_| true,
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        again,
        MigrationReport {
            removed: true,
            ..MigrationReport::default()
        }
    );
    // The parked task was re-keyed for the new number of levels: once its
    // consumer binds with today's key, `requeue-unroutable` delivers it.
    let key = new.binding_key("nobody");
    let mut late_binder =
        TestConsumer::bind_to(&mut old_topology, &new, new.business_exchange(), &key).await;
    let (ok, output) = run_delayline(&new_settings, &["requeue-unroutable"]).await;
    assert!(ok, "{output}");
    let requeued = late_binder
        .next(Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("not requeued: {output}"));
    assert_eq!(requeued.routing_key, format!("{}nobody", "0.".repeat(9)));
    let _ = connection.close(200, "done".into()).await;
    new_app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_cut_off_midway_loses_nothing_when_run_again() {
    let (old_settings, new_settings) = old_and_new(QueueType::Quorum);
    let old = old_settings.cascade().unwrap();
    let new = new_settings.cascade().unwrap();
    let _old_cleanup = cleanup_both(&old, &new);
    let _new_cleanup = Cleanup::for_cascade(&new);

    let mut old_app = TestApp::spawn(old_settings).await;
    let mut consumer = TestConsumer::bind(&mut old_app, "#.moved").await;
    let ids = accept_tasks(&old_app, 200, 6000).await;
    let _old_topology = old_app.stop_keeping_topology().await;
    let old_depth = async || {
        let mut depth = 0;
        for level in 0..old.levels() {
            depth += queue_depth(&old.level_queue(level)).await;
        }
        depth
    };
    let before = old_depth().await;

    // The process dies once about half has moved: its connection goes,
    // unacknowledged messages return to the old queues, confirmed ones are
    // already in the new chain.
    let crashing = "delayline test migrate crash";
    let connection = connect(amqp_uri(), crashing).await.unwrap();
    provision(&connection, &new.plan()).await.unwrap();
    let migration = {
        let new = new.clone();
        tokio::spawn(async move {
            migrate_topology(
                &connection,
                &OldChain::version_of(&new, 1),
                &new,
                &|_| true,
                None,
            )
            .await
        })
    };
    eventually("half of the old chain to be moved", async || {
        old_depth().await < before / 2
    })
    .await;
    migration.abort();
    // Dropping lapin's connection closes it; if it has not yet, the broker does.
    close_connections_named(crashing);

    let connection = connect(amqp_uri(), "delayline test migrate").await.unwrap();
    let report = migrate_topology(
        &connection,
        &OldChain::version_of(&new, 1),
        &new,
        &|_| true,
        None,
    )
    .await
    .unwrap();
    assert!(report.removed);
    old_chain_is_gone(&old).await;
    let duplicates = consumer
        .expect_each_never_early(ids, Duration::from_secs(20))
        .await;
    // At most the window being confirmed when it died.
    assert!(duplicates <= 256, "{duplicates} duplicates");
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_tasks_reach_their_consumer_once_it_is_bound() {
    let mut app = TestApp::spawn(test_settings(3, 10, QueueType::Quorum)).await;
    for destination in ["late.binder", "nobody"] {
        let (status, _) = app
            .post(
                "/v1/tasks",
                &json!({"destination": destination, "delay_ms": 0}),
            )
            .await;
        assert_eq!(status, 202);
    }
    let unroutable = app.cascade.unroutable_queue();
    crate::common::eventually("both to be unroutable", async || {
        queue_depth(&unroutable).await == 2
    })
    .await;

    // The consumer's binding arrives late; the command sends both back, and
    // the one nobody binds is parked again rather than lost or looping.
    let key = app.cascade.binding_key("late.binder");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_delayline"))
        // The command's former name still works.
        .arg("requeue-parked")
        .env("DELAYLINE__AMQP__URI", amqp_uri())
        .env("DELAYLINE__CASCADE__PREFIX", app.cascade.prefix())
        .env(
            "DELAYLINE__CASCADE__BUSINESS_EXCHANGE",
            app.cascade.business_exchange(),
        )
        .env("DELAYLINE__CASCADE__LEVELS", "3")
        .env("DELAYLINE__CASCADE__UNIT_MS", "10")
        .env("DELAYLINE__CASCADE__QUEUE_TYPE", "quorum")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("republished 2 unroutable messages"),
        "{stdout}"
    );
    // The command counts what the broker counts at once: RabbitMQ 4 may not
    // count the copy parked again yet, so the queue itself is what settles it.
    assert!(stdout.contains(" still in"), "{stdout}");
    let received = consumer.next(Duration::from_secs(5)).await.unwrap();
    assert!(received.routing_key.ends_with("late.binder"));
    crate::common::eventually("the one nobody binds to be parked again", async || {
        queue_depth(&unroutable).await == 1
    })
    .await;
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_prefix_named_by_the_old_settings_keeps_the_shared_parking_queue() {
    let old_settings = test_settings(4, 100, QueueType::Quorum);
    let mut new_settings = old_settings.clone();
    new_settings.cascade.prefix = format!("{}-renamed", old_settings.cascade.prefix);
    let old = old_settings.cascade().unwrap();
    let new = new_settings.cascade().unwrap();
    assert_eq!(old.unroutable_queue(), new.unroutable_queue());
    let _cleanup = cleanup_both(&old, &new);
    let _new_cleanup = Cleanup::for_cascade(&new);

    let mut old_app = TestApp::spawn(old_settings).await;
    let mut consumer = TestConsumer::bind(&mut old_app, "#.moved").await;
    let ids = accept_tasks(&old_app, 20, 1500).await;
    park_one(&old_app).await;
    let _old_topology = old_app.stop_keeping_topology().await;

    let connection = connect(amqp_uri(), "delayline test migrate").await.unwrap();
    let report = migrate_topology(
        &connection,
        &OldChain::from_settings(&old),
        &new,
        &|_| true,
        None,
    )
    .await
    .unwrap();
    assert!(report.removed);
    assert_eq!((report.levels, report.unroutable), (4, 0));
    consumer
        .expect_each_once_never_early(ids, Duration::from_secs(20))
        .await;
    // The shared parking queue is neither moved nor deleted.
    assert_eq!(queue_depth(&new.unroutable_queue()).await, 1);
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_names_what_the_new_chain_cannot_hold_and_the_ledger_keeps_the_poisoned() {
    let mut old_settings = with_ledger(test_settings(8, 100, QueueType::Quorum), Backend::Sqlite);
    // A probe goes into level 7 (12.8 s) whenever the newest there has two
    // intervals (10 s) left: one is still there when the migration runs.
    old_settings.cascade.level_probe_ms = 5_000;
    let mut new_settings = old_settings.clone();
    new_settings.cascade.version = 2;
    // At most 1.5 s: a task due in 20 s cannot be held.
    new_settings.cascade.levels = 4;
    let old = old_settings.cascade().unwrap();
    let new = new_settings.cascade().unwrap();
    let _cleanup = cleanup_both(&old, &new);

    let old_app = TestApp::spawn(old_settings).await;
    let connection = connect(amqp_uri(), "delayline test migrate").await.unwrap();
    eventually("a probe waits in level 7", async || {
        queue_state(&connection, &old.level_queue(7))
            .await
            .unwrap()
            .is_some_and(|q| q.messages >= 1)
    })
    .await;
    for (id, delay_ms) in [("too-long", 20_000), ("fits", 1_200)] {
        let body = json!({"destination": "moved", "id": id, "delay_ms": delay_ms});
        let (status, accepted) = old_app.post("/v1/tasks", &body).await;
        assert_eq!((status, &accepted["state"]), (202, &json!("scheduled")));
    }
    let _old_topology = old_app.stop_keeping_topology().await;
    // Messages only move down, into the release queue, which nothing
    // consumes now: their sum changes only if something takes them.
    let waiting = async || {
        let mut ready = 0;
        let queues = (0..8).map(|level| old.level_queue(level));
        for queue in queues.chain([old.release_queue()]) {
            ready += queue_state(&connection, &queue)
                .await
                .unwrap()
                .map_or(0, |q| q.messages);
        }
        ready
    };
    // Settled first: a message the stopped stage held comes back to the
    // release queue a moment after its channel closes.
    let settled = async || {
        let mut last = waiting().await;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = waiting().await;
            if now == last {
                return now;
            }
            last = now;
        }
    };
    let before = settled().await;

    let dry_run = ["migrate-topology", "--from", "1", "--dry-run"];
    let (ok, output) = run_delayline(&new_settings, &dry_run).await;
    assert!(ok, "{output}");
    assert!(output.contains("dry run, nothing moves"), "{output}");
    assert!(
        output.contains("ledger: 1 waiting task is due later than 1s 500ms"),
        "{output}"
    );
    // The probes are messages, not tasks.
    assert!(output.contains("ledger: 2 tasks on their way"), "{output}");
    assert!(output.contains("  too-long  due "), "{output}");
    assert!(!output.contains("  fits  due "), "{output}");
    assert!(output.contains(&new.poison_queue()), "{output}");
    assert_eq!(settled().await, before, "a dry run took messages");

    let (ok, output) = run_delayline(&new_settings, &["migrate-topology", "--from", "1"]).await;
    assert!(ok, "{output}");
    assert!(output.contains("poisoned task too-long"), "{output}");
    // The probes are dropped, not moved as tasks: "fits" alone is moved
    // (or delivered, if it fell due meanwhile).
    assert!(
        output.contains("1 rescheduled, 0 already due")
            || output.contains("0 rescheduled, 1 already due"),
        "{output}"
    );
    assert!(!output.contains(" 0 level probes dropped"), "{output}");
    let new_app = TestApp::spawn(new_settings).await;
    let (_, task) = new_app.get("/v1/tasks/too-long").await;
    assert_eq!(task["state"], "failed", "{task}");
    assert!(
        task["last_error"]
            .as_str()
            .unwrap()
            .contains(&new.poison_queue()),
        "{task}"
    );
    let _ = connection.close(200, "done".into()).await;
    new_app.stop().await.unwrap();
}
