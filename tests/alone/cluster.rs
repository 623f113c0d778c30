//! A three-node RabbitMQ cluster of the test's own, losing the node delayline
//! is connected to while tasks flow. One test per binary: the cluster takes
//! the better part of a minute to form on two cores.

use std::time::{Duration, Instant};

use crate::common::nodes::{BrokerNode, Cluster, NodeOptions, drain, within};
use crate::common::{
    Backend, TestApp, TestConsumer, accepted_ids, steady_load, test_settings, with_ledger,
};
use delayline::cascade::QueueType;

/// Which of the cluster's nodes `/readyz` names, by port; None while disconnected.
async fn node_in_use(app: &TestApp, cluster: &Cluster) -> Option<usize> {
    let (_, ready) = app.get("/readyz").await;
    if ready["broker"] != "connected" {
        return None;
    }
    let node = ready["node"].as_str()?;
    cluster
        .nodes
        .iter()
        .position(|n| node.contains(&format!(":{}/", n.port)))
}

/// Where each quorum queue's leader lives, as `alive` sees it: (queue, node name).
fn leaders(alive: &BrokerNode) -> Vec<(String, String)> {
    alive
        .ctl(&["list_queues", "name", "leader"])
        .lines()
        .filter_map(|line| {
            let (queue, leader) = line.split_once('\t')?;
            Some((queue.to_owned(), leader.trim().to_owned()))
        })
        .collect()
}

/// The service's warnings and what the strand watch judged, filtered by
/// `DLTEST_LOG` when set: a failure here cannot be rerun at will, and the
/// harness prints them only when the test fails. Called before the service
/// starts, so that this subscriber is the one installed.
fn keep_logs() {
    let filter = std::env::var("DLTEST_LOG")
        .unwrap_or_else(|_| "warn,delayline::chain::strands=info".to_owned());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_test_writer()
        .try_init();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_node_in_use_moves_to_another_and_loses_nothing() {
    keep_logs();
    // A short dead-letter confirm timeout bounds the stall quorum queues can
    // show after a member is lost (180 s by default; see the runbook).
    let booting = Instant::now();
    let cluster = Cluster::start(&NodeOptions {
        dead_letter_confirm_timeout_ms: Some(5_000),
        ..NodeOptions::default()
    });
    eprintln!("cluster formed in {:?}", booting.elapsed());
    let mut settings = with_ledger(test_settings(8, 50, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = cluster.uris().into();
    settings.amqp.confirm_timeout_ms = 2_000;
    settings.amqp.reconnect_max_backoff_ms = 1_000;
    // A probe inside every level of 400 ms or more at every moment, as the
    // default second does for every level of a chain of 1 s units: a level
    // that keeps what it held at the loss shows only in a probe inside it.
    settings.cascade.level_probe_ms = 200;
    let app = TestApp::spawn(settings).await;
    assert_eq!(
        node_in_use(&app, &cluster).await,
        Some(0),
        "the first address"
    );
    // The level queues' leaders are where they were declared: on the node to be lost.
    let leaders = leaders(&cluster.nodes[2]);
    let on_first = leaders
        .iter()
        .filter(|(queue, leader)| {
            queue.starts_with(&format!("{}.v1.level", app.cascade.prefix()))
                && *leader == cluster.nodes[0].name
        })
        .count();
    assert_eq!(on_first, 8, "{leaders:?}");
    let key = app.cascade.binding_key("load");
    let mut consumer = TestConsumer::on_node(
        &cluster.nodes[2].uri(),
        &app.cascade,
        &key,
        QueueType::Quorum,
    )
    .await;

    let stop = tokio_util::sync::CancellationToken::new();
    let load = steady_load(&app.http, &app.base, 4, "load", 500, stop.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lost_at = Instant::now();
    // Off the runtime's workers: the service runs on them.
    tokio::task::block_in_place(|| cluster.nodes[0].stop());
    let moved = within(Duration::from_secs(30), async || {
        node_in_use(&app, &cluster).await.is_some_and(|n| n != 0)
    })
    .await;
    let recovered_in = lost_at.elapsed();
    assert!(moved, "never connected to a surviving node");
    eprintln!("publishing resumed on another node {recovered_in:?} after the loss");
    // About a second on an idle machine (README); generous here, where two
    // cores run three nodes and the machine's broker.
    assert!(recovered_in < Duration::from_secs(15), "{recovered_in:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ids = accepted_ids(load, stop).await;

    // Every task arrives, none early; a task in flight at the loss may come
    // twice. Should delayline fail to drain a level stranded by the loss,
    // `drain` releases it the way the runbook says, and the test fails.
    let drained = drain(
        &mut consumer,
        &ids,
        &cluster.nodes[2],
        app.cascade.prefix(),
        Duration::from_secs(120),
    )
    .await;
    if !drained.missing.is_empty() || !drained.released.is_empty() {
        // What the strand watch saw, for a failure that cannot be rerun.
        let scrape = app.scrape().await;
        let watch = scrape.lines().filter(|line| {
            !line.starts_with('#')
                && ["level_", "resent", "release", "ready"]
                    .iter()
                    .any(|name| line.contains(name))
        });
        eprintln!("metrics:\n{}", watch.collect::<Vec<_>>().join("\n"));
        eprintln!(
            "{:?}",
            cluster.nodes[2].ctl(&["list_queues", "name", "messages", "messages_ready"])
        );
    }
    assert!(
        drained.missing.is_empty(),
        "never arrived: {:?}",
        drained.missing
    );
    eprintln!(
        "{} tasks delivered, {} duplicates, at most {} ms late, stranded levels released: {:?}",
        ids.len(),
        drained.duplicates,
        drained.percentile(1.0),
        drained.released
    );
    assert_eq!(drained.unanswered_delivered, 0);
    // Which tasks, by when they fell due, came how late (the harness shows
    // it when the test fails).
    eprintln!(
        "by due second (from the first due, tasks, median and worst ms late): {:?}",
        drained.by_due_time(1_000)
    );
    // A level the loss stranded is drained by delayline itself (see
    // `strand.rs`): no operator's remedy, and no task the resender's minute
    // (`store.resend_after_ms`) late. The p99 bound is half that minute:
    // RELIABILITY.md's runs gave 1.5-1.7 s, but on two cores running three
    // nodes beside the machine's brokers a local CI run saw 17 s (the worst
    // 29 s) with every level found and drained by delayline, nothing missing
    // and nothing left to the resender: a stall not yet diagnosed, which the
    // line above places in time.
    assert!(
        drained.released.is_empty(),
        "the runbook's remedy was needed for {:?}",
        drained.released
    );
    assert!(
        drained.percentile(0.99) < 30_000,
        "p99 {} ms late",
        drained.percentile(0.99)
    );
    let scrape = app.scrape().await;
    eprintln!(
        "late {:?} unconfirmed {:?} forwarded {:?}",
        crate::common::sample(&scrape, "delayline_publish_late_total"),
        crate::common::sample(&scrape, "delayline_publish_unconfirmed_total"),
        crate::common::sample(
            &scrape,
            "delayline_forwarder_tasks_total{outcome=\"published\"}"
        )
    );
    let stopping = Instant::now();
    app.stop().await.unwrap();
    eprintln!("service stopped in {:?}", stopping.elapsed());
    let dropping = Instant::now();
    drop(consumer);
    drop(cluster);
    eprintln!("cluster stopped in {:?}", dropping.elapsed());
}
