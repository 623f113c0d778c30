//! A level that stops dead-lettering, found and drained by delayline itself.
//!
//! The broker's fault (RabbitMQ #16652: a quorum queue's at-least-once
//! dead-letter worker stopped for good after a node loss) is stood in for
//! on a node of the test's own: the node's supervisor of those workers is
//! stopped for good. Every
//! at-least-once queue on the node then keeps taking messages and lets none
//! go, as after the node loss measured in issue 42: messages stay past
//! their TTL, counted in the queue's total but neither ready nor
//! unacknowledged, out of any consumer's reach. Then the broker is mended
//! as the runbook says, and delayline hands the levels back to it.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::common::nodes::{BrokerNode, NodeOptions, drain};
use crate::common::{
    Backend, TestApp, TestConsumer, accepted_ids, steady_load, test_settings, with_ledger,
};
use delayline::cascade::QueueType;

/// Stops the node's supervisor of quorum-queue dead-letter workers, and
/// with it every worker, for good (it is not restarted, and no new worker
/// can start): RabbitMQ 3.10 and 4.3 alike then hold every expired message
/// of every at-least-once queue on the node.
pub(crate) const STOP_DEAD_LETTERING: &str =
    "supervisor:terminate_child(rabbit_sup, rabbit_fifo_dlx_sup), whereis(rabbit_fifo_dlx_sup).";

/// The stand-in mended: the supervisor started again. A queue starts its
/// worker when its Raft member becomes leader, so each level's member is
/// then restarted with the runbook's script.
pub(crate) const START_DEAD_LETTERING: &str =
    "supervisor:restart_child(rabbit_sup, rabbit_fifo_dlx_sup).";

/// The sum of every sample of `metric` (all its label sets) in a scrape.
pub(crate) fn sum_of(scrape: &str, metric: &str) -> f64 {
    scrape
        .lines()
        .filter(|line| line.starts_with(&format!("{metric}{{")))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A service of `shards` shards of 8 levels of 50 ms on `node`, probing
/// every 200 ms with a margin of a second, handing stranded levels back
/// after `recheck_ms`; and a consumer of its destination `stranded`.
async fn stranding_app(node: &BrokerNode, shards: u32, recheck_ms: u64) -> (TestApp, TestConsumer) {
    let mut settings = with_ledger(test_settings(8, 50, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = node.uri().into();
    settings.cascade.shards = shards;
    settings.cascade.level_probe_ms = 200;
    settings.cascade.stranded_margin_ms = 1_000;
    settings.cascade.stranded_recheck_ms = recheck_ms;
    let app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("stranded");
    let consumer = TestConsumer::on_node(&node.uri(), &app.cascade, &key, QueueType::Quorum).await;
    (app, consumer)
}

/// Tasks due 3 s after they are sent (56 units in levels 5, 4 and 3: 1.6 +
/// 0.8 + 0.4 s, 200 ms held), sent for 2 s, then dead-lettering stopped on
/// `node`, then sent for `after` more: the ids accepted, and when
/// dead-lettering stopped.
async fn load_across_the_stop(
    app: &TestApp,
    node: &BrokerNode,
    after: Duration,
) -> (std::collections::HashSet<String>, Instant) {
    let stop = CancellationToken::new();
    let load = steady_load(&app.http, &app.base, 2, "stranded", 3_000, stop.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stopped_at = Instant::now();
    let supervisor = node.ctl(&["eval", STOP_DEAD_LETTERING]);
    assert_eq!(supervisor.trim(), "undefined", "the stand-in took effect");
    tokio::time::sleep(after).await;
    (accepted_ids(load, stop).await, stopped_at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_that_stops_dead_lettering_is_drained_by_delayline_within_seconds() {
    let node = BrokerNode::start(&NodeOptions::default());
    // Past the first load's drain, so the levels are handed back to a
    // mended broker.
    let (app, mut consumer) = stranding_app(&node, 1, 20_000).await;
    let (ids, stopped_at) = load_across_the_stop(&app, &node, Duration::from_secs(8)).await;

    let drained = drain(
        &mut consumer,
        &ids,
        &node,
        app.cascade.prefix(),
        Duration::from_secs(60),
    )
    .await;
    let scrape = app.scrape().await;
    let stranded = sum_of(&scrape, "delayline_level_stranded");
    let taken_off = sum_of(&scrape, "delayline_level_drained_total");
    let resent = crate::common::sample(&scrape, "delayline_tasks_resent_total");
    eprintln!(
        "{} tasks after stopping dead-lettering {:?} ago: p50 {} ms, p99 {} ms, max {} ms late; \
         {} duplicates; levels stranded {stranded}, messages drained {taken_off}, resent \
         {resent:?}; by due time {:?}",
        ids.len(),
        stopped_at.elapsed(),
        drained.percentile(0.5),
        drained.percentile(0.99),
        drained.percentile(1.0),
        drained.duplicates,
        drained.by_due_time(1_000),
    );
    drained.assert_all_arrived_unaided();
    assert!(stranded >= 3.0, "levels 3, 4 and 5 at least: {stranded}");
    assert!(taken_off > 0.0, "nothing drained");
    // The console's problems page names them.
    let page = app
        .http
        .get(format!("{}/console/problems", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("Stranded levels") && page.contains(&app.cascade.level_queue(5)),
        "{page}"
    );
    // A few seconds, not the resender's minute: the margin, the probe's
    // way round, and a loaded two-core machine.
    assert!(
        drained.percentile(0.99) < 8_000,
        "p99 {} ms",
        drained.percentile(0.99)
    );
    assert_eq!(drained.unanswered_delivered, 0);
    hands_the_levels_back_once_the_broker_is_mended(&app, &node, &mut consumer, stopped_at).await;
    drop(consumer);
    app.stop().await.unwrap();
    drop(node);
}

/// The broker mended as the runbook says: delayline hands the stranded
/// levels back after `stranded_recheck_ms`, and tasks through them then
/// arrive by the broker's own dead-lettering, none taken off by delayline.
async fn hands_the_levels_back_once_the_broker_is_mended(
    app: &TestApp,
    node: &BrokerNode,
    consumer: &mut TestConsumer,
    stopped_at: Instant,
) {
    let started = node.ctl(&["eval", START_DEAD_LETTERING]);
    assert!(started.contains("ok"), "{started}");
    for level in 0..app.cascade.levels() {
        node.release_stranded_level(&app.cascade.level_queue(level));
    }
    let handed_back = crate::common::nodes::within(Duration::from_secs(40), async || {
        let scrape = app.scrape().await;
        sum_of(&scrape, "delayline_level_stranded") == 0.0
            && sum_of(&scrape, "delayline_level_handed_back_total") >= 3.0
    })
    .await;
    assert!(handed_back, "{}", app.scrape().await);
    eprintln!(
        "handed back {:?} after stopping dead-lettering",
        stopped_at.elapsed()
    );
    let drained_before = sum_of(&app.scrape().await, "delayline_level_drained_total");

    let stop = CancellationToken::new();
    let load = steady_load(&app.http, &app.base, 2, "stranded", 3_000, stop.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ids = accepted_ids(load, stop).await;
    let drained = drain(
        consumer,
        &ids,
        node,
        app.cascade.prefix(),
        Duration::from_secs(60),
    )
    .await;
    drained.assert_all_arrived_unaided();
    let scrape = app.scrape().await;
    assert_eq!(
        sum_of(&scrape, "delayline_level_stranded"),
        0.0,
        "taken again"
    );
    assert_eq!(
        sum_of(&scrape, "delayline_level_drained_total"),
        drained_before,
        "the broker dead-letters again: delayline took nothing off"
    );
    eprintln!(
        "{} tasks after the hand-back: p99 {} ms late",
        ids.len(),
        drained.percentile(0.99)
    );
}

/// In a chain of two shards, each shard's levels are probed and drained on
/// their own: the stand-in stops every level of both, and both shards'
/// levels are found stranded, drained, and their tasks arrive in seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shard_s_stranded_levels_are_found_and_drained() {
    let node = BrokerNode::start(&NodeOptions::default());
    let (app, mut consumer) = stranding_app(&node, 2, 300_000).await;
    let (ids, _) = load_across_the_stop(&app, &node, Duration::from_secs(6)).await;
    let drained = drain(
        &mut consumer,
        &ids,
        &node,
        app.cascade.prefix(),
        Duration::from_secs(60),
    )
    .await;
    drained.assert_all_arrived_unaided();
    let scrape = app.scrape().await;
    for shard in app.cascade.every_shard() {
        let stranded: usize = (0..shard.levels())
            .filter(|&level| {
                let series = format!(
                    "delayline_level_stranded{{level=\"{level}\",queue=\"{}\"}}",
                    shard.level_queue(level)
                );
                crate::common::sample(&scrape, &series) == Some(1.0)
            })
            .count();
        assert!(
            stranded >= 3,
            "shard {}: {stranded} levels stranded",
            shard.shard()
        );
    }
    assert!(
        drained.percentile(0.99) < 8_000,
        "p99 {} ms",
        drained.percentile(0.99)
    );
    eprintln!(
        "two shards: {} tasks, p99 {} ms late, {} duplicates",
        ids.len(),
        drained.percentile(0.99),
        drained.duplicates
    );
    drop(consumer);
    app.stop().await.unwrap();
    drop(node);
}
