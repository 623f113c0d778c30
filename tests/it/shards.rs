//! Sharded chains (`cascade.shards`) against the real broker: every task
//! goes through the shard its id names and arrives once, never early, with
//! cancels and moves finding it; a chain with more shards than configured is
//! refused; `migrate-topology` changes the shard count and loses nothing.

use std::collections::HashSet;
use std::time::Duration;

use delayline::broker::{OldChain, connect, exchange_exists, migrate_topology, queue_state};
use delayline::cascade::{Cascade, QueueType};
use delayline::config::Settings;
use serde_json::json;

use crate::common::nodes::{Cluster, NodeOptions};
use crate::common::{
    Backend, Cleanup, TestApp, TestConsumer, amqp_uri, close_connections_named, eventually,
    queue_depth, run_delayline, test_settings, with_ledger,
};
use crate::release::serve_until_it_stops;

/// 7 levels of 50 ms (delays up to 6.35 s), quorum, SQLite, `shards` shards.
fn sharded(shards: u32) -> Settings {
    let mut settings = with_ledger(test_settings(7, 50, QueueType::Quorum), Backend::Sqlite);
    settings.cascade.shards = shards;
    // Every task routed as it would be alone: the burst planner would stage
    // some of a batch in the ledger (it counts the levels of all shards
    // together), and these tests count what waits in each shard's levels.
    settings.cascade.burst_level_rate = 0;
    settings
}

async fn post(app: &TestApp, delay_ms: u64) -> String {
    let body = json!({"destination": "sharded", "delay_ms": delay_ms});
    let (status, accepted) = app.post("/v1/tasks", &body).await;
    assert_eq!(status, 202, "{accepted}");
    accepted["id"].as_str().unwrap().to_owned()
}

/// A migration's two sides: the old chain's settings (three shards) and
/// the new version's (two), with what deletes the poison queue
/// `migrate-topology` declares for the new chain (not part of its plan).
fn three_shards_to_two() -> (Settings, Settings, Cleanup) {
    let old = sharded(3);
    let mut new = old.clone();
    new.cascade.version = 2;
    new.cascade.shards = 2;
    let mut poison = Cleanup::empty();
    poison.queues.push(new.cascade().unwrap().poison_queue());
    (old, new, poison)
}

/// Messages waiting in each shard's levels and release queue, by shard.
/// Read over one connection: the reads are not one snapshot, and a
/// connection per queue (24 of them) once took longer on a loaded 4.3 than
/// the tasks stayed in one level.
async fn waiting_per_shard(cascade: &Cascade) -> Vec<u32> {
    let connection = connect(amqp_uri(), "delayline test probe").await.unwrap();
    let mut per_shard = Vec::new();
    for shard in cascade.every_shard() {
        let queues = (0..shard.levels()).map(|level| shard.level_queue(level));
        let mut waiting = 0;
        for queue in queues.chain([shard.release_queue()]) {
            let state = queue_state(&connection, &queue).await.unwrap();
            waiting += state.unwrap_or_else(|| panic!("{queue} exists")).messages;
        }
        per_shard.push(waiting);
    }
    let _ = connection.close(200, "probed".into()).await;
    per_shard
}

/// Posts a task to `sharded` for each of `delays_ms`, in one batch; their ids.
async fn post_batch(app: &TestApp, delays_ms: impl Iterator<Item = u64>) -> Vec<String> {
    let tasks: Vec<_> = delays_ms
        .map(|delay_ms| json!({"destination": "sharded", "delay_ms": delay_ms}))
        .collect();
    let (status, answer) = app.post("/v1/tasks/batch", &json!({"tasks": tasks})).await;
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().unwrap();
    let ids = results.iter().map(|result| {
        assert_eq!(result["status"], 202, "{result}");
        result["task"]["id"].as_str().unwrap().to_owned()
    });
    ids.collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_task_goes_through_its_own_shard_and_arrives_once_never_early() {
    let mut settings = sharded(3);
    // Probes would wait in the levels beside the tasks counted there.
    settings.cascade.level_probe_ms = 0;
    let mut app = TestApp::spawn(settings).await;
    let cascade = app.cascade.clone();
    let mut consumer = TestConsumer::bind(&mut app, "sharded").await;

    // Waiting in the levels: each shard holds exactly the tasks its ids name.
    // Due late in the chain's span (6.35 s), so that none is due before the
    // cancels below on a loaded machine (one was, in a full run: 409). In
    // one batch, so that none leaves its first level (after 3.2 s) before
    // the last is posted.
    let ids = post_batch(&app, (0..45u64).map(|n| 5_000 + n * 20)).await;
    let mut expected = vec![0u32; 3];
    for id in &ids {
        expected[cascade.shard_of(id) as usize] += 1;
    }
    assert!(expected.iter().all(|&n| n > 0), "{expected:?}");
    eventually("every task to wait in its own shard", async || {
        waiting_per_shard(&cascade).await == expected
    })
    .await;

    // Cancels and moves find a task whatever its shard.
    let mut wanted: HashSet<String> = ids.iter().cloned().collect();
    for id in ids.iter().take(6) {
        let (status, answer) = app.delete(&format!("/v1/tasks/{id}")).await;
        assert_eq!((status, &answer["state"]), (200, &json!("cancelled")));
        wanted.remove(id);
    }
    for id in ids.iter().skip(6).take(6) {
        let (status, answer) = app
            .patch(&format!("/v1/tasks/{id}"), &json!({"delay_ms": 500}))
            .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["revision"], json!(2), "{answer}");
    }
    // Tasks due at once, and through a single level, in every shard too.
    for delay_ms in [0, 50, 120] {
        for _ in 0..4 {
            wanted.insert(post(&app, delay_ms).await);
        }
    }
    consumer
        .expect_each_once_never_early(wanted, Duration::from_secs(15))
        .await;
    // The cancelled ones never come, nor the moved tasks' first copies.
    assert!(consumer.next(Duration::from_millis(1_500)).await.is_none());
    eventually("every shard to be empty", async || {
        waiting_per_shard(&cascade).await == vec![0, 0, 0]
    })
    .await;

    // The API shows every shard.
    let (status, topology) = app.get("/v1/topology").await;
    assert_eq!(status, 200);
    assert_eq!(topology["shards"], json!(3));
    let chains = topology["shard_chains"].as_array().unwrap();
    assert_eq!(chains.len(), 3);
    for (shard, chain) in cascade.every_shard().zip(chains) {
        assert_eq!(chain["release_queue"], json!(shard.release_queue()));
        assert_eq!(chain["queues"][0]["queue"], json!(shard.level_queue(6)));
        assert_eq!(
            chain["queues"][6]["dead_letter_exchange"],
            json!(shard.release_queue())
        );
    }
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_with_more_shards_than_configured_is_refused() {
    let settings = sharded(3);
    let app = TestApp::spawn(settings.clone()).await;
    let _cleanup = app.stop_keeping_topology().await;

    let mut fewer = settings.clone();
    fewer.cascade.shards = 2;
    let (ok, output) = run_delayline(&fewer, &["provision", "--check"]).await;
    assert!(!ok, "{output}");
    assert!(output.contains("extra    shard"), "{output}");
    assert!(output.contains(".s2.release"), "{output}");
    let (code, printed) = serve_until_it_stops(&fewer).await;
    assert_ne!(code, Some(0), "{printed}");
    assert!(
        printed.contains("more shards than cascade.shards = 2"),
        "{printed}"
    );
    // The whole chain is still there, untouched.
    let cascade = settings.cascade().unwrap();
    for shard in cascade.every_shard() {
        queue_depth(&shard.release_queue()).await;
    }
}

/// Every queue and exchange of every shard of `old` is gone.
async fn old_shards_are_gone(old: &Cascade) {
    let connection = connect(amqp_uri(), "delayline test probe").await.unwrap();
    for shard in old.every_shard() {
        assert!(
            queue_state(&connection, &shard.release_queue())
                .await
                .unwrap()
                .is_none()
        );
        for level in 0..shard.levels() {
            let queue = shard.level_queue(level);
            assert!(queue_state(&connection, &queue).await.unwrap().is_none());
            let exchange = shard.level_exchange(level);
            assert!(!exchange_exists(&connection, &exchange).await.unwrap());
        }
    }
    let _ = connection.close(200, "probed".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_topology_changes_the_shard_count_and_every_task_arrives_once_never_early() {
    let (old_settings, new_settings, _poison) = three_shards_to_two();
    let old = old_settings.cascade().unwrap();
    let mut old_app = TestApp::spawn(old_settings).await;
    let mut consumer = TestConsumer::bind(&mut old_app, "sharded").await;
    let mut ids = HashSet::new();
    for n in 0..30u64 {
        ids.insert(post(&old_app, 1_500 + n * 100).await);
    }
    let cancelled = post(&old_app, 2_000).await;
    let (status, _) = old_app.delete(&format!("/v1/tasks/{cancelled}")).await;
    assert_eq!(status, 200);
    let _old_topology = old_app.stop_keeping_topology().await;

    // The new version starts beside the old chain and takes tasks at once.
    let new_app = TestApp::spawn(new_settings.clone()).await;
    for _ in 0..6 {
        ids.insert(post(&new_app, 300).await);
    }
    let (ok, output) = run_delayline(&new_settings, &["migrate-topology", "--from", "1"]).await;
    assert!(ok, "{output}");
    assert!(
        output.contains("the number of shards changed from 3 to 2"),
        "{output}"
    );
    // Every level and release queue of the three shards, and the parking queue.
    let deleted = output.lines().filter(|l| l.starts_with("deleted ")).count();
    assert_eq!(deleted, 3 * (7 + 1) + 1, "{output}");
    old_shards_are_gone(&old).await;

    consumer
        .expect_each_once_never_early(ids, Duration::from_secs(15))
        .await;
    assert!(consumer.next(Duration::from_millis(1_500)).await.is_none());
    let (_, seen) = new_app.get(&format!("/v1/tasks/{cancelled}")).await;
    assert_eq!(seen["state"], json!("cancelled"), "{seen}");
    new_app.stop().await.unwrap();
}

/// From one shard to more in place: shard 0's queues would need the
/// leader locator's argument, which the broker refuses to add to a queue,
/// so provisioning refuses it and names the migration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_shards_in_place_from_one_is_refused_and_names_the_migration() {
    let settings = sharded(1);
    let app = TestApp::spawn(settings.clone()).await;
    let _cleanup = app.stop_keeping_topology().await;
    let mut more = settings.clone();
    more.cascade.shards = 2;
    // Exchanges are declared before queues: shard 1's are, before the refusal.
    let shard = more.cascade().unwrap().in_shard(1);
    let mut stray = Cleanup::empty();
    stray.exchanges.push(shard.release_queue());
    stray
        .exchanges
        .extend((0..shard.levels()).map(|level| shard.level_exchange(level)));
    let (ok, output) = run_delayline(&more, &["provision"]).await;
    assert!(!ok, "{output}");
    assert!(
        output.contains(
            "x-queue-leader-locator: the broker has (not set), delayline wants \"balanced\""
        ),
        "{output}"
    );
    assert!(output.contains("migrate-topology --from"), "{output}");
    // Refused before any queue of shard 1 was declared.
    let connection = connect(amqp_uri(), "delayline test probe").await.unwrap();
    assert!(
        queue_state(&connection, &shard.level_queue(0))
            .await
            .unwrap()
            .is_none()
    );
    let _ = connection.close(200, "probed".into()).await;
}

/// On a three-node cluster, RabbitMQ places each shard's queues' leaders
/// `balanced`: every node leads a share of them, and the API and the
/// metrics say which node leads which queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_shards_leaders_are_spread_over_the_nodes_and_shown() {
    let cluster = Cluster::start(&NodeOptions {
        management: true,
        ..NodeOptions::default()
    });
    let mut settings = sharded(3);
    settings.amqp.uri = cluster.uris().into();
    settings.metrics.queue_poll_ms = 250;
    settings.metrics.management_url = format!(
        "http://guest:guest@127.0.0.1:{}",
        cluster.nodes[0].management_port.unwrap()
    )
    .into();
    let app = TestApp::spawn(settings.clone()).await;
    let key = app.cascade.binding_key("sharded");
    let mut consumer = TestConsumer::on_node(
        &cluster.nodes[0].uri(),
        &app.cascade,
        &key,
        QueueType::Quorum,
    )
    .await;

    // Every level and release queue of the three shards, each led by a node.
    let queues = 3 * (7 + 1);
    let leaders = async || -> Vec<String> {
        let (_, topology) = app.get("/v1/topology").await;
        let chains = topology["shard_chains"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        chains
            .iter()
            .flat_map(|chain| {
                let levels = chain["queues"].as_array().cloned().unwrap_or_default();
                levels
                    .iter()
                    .map(|level| level["leader"].clone())
                    .chain([chain["release_leader"].clone()])
                    .collect::<Vec<_>>()
            })
            .filter_map(|leader| leader.as_str().map(str::to_owned))
            .collect()
    };
    eventually("every shard queue's leader to be known", async || {
        leaders().await.len() == queues
    })
    .await;
    let leaders = leaders().await;
    for node in &cluster.nodes {
        let led = leaders.iter().filter(|l| **l == node.name).count();
        assert!(
            led >= 4,
            "{} leads {led} of {queues}: {leaders:?}",
            node.name
        );
    }
    let scrape = app.scrape().await;
    let series = scrape
        .lines()
        .filter(|l| l.starts_with("delayline_queue_leader{") && l.ends_with(" 1"))
        .count();
    assert_eq!(series, queues, "{scrape}");
    // `provision --check` names each queue's leader too.
    let (ok, output) = run_delayline(&settings, &["provision", "--check"]).await;
    assert!(ok, "{output}");
    for shard in app.cascade.every_shard() {
        let release = shard.release_queue();
        assert!(
            output
                .lines()
                .any(|l| l.contains(&format!("{release} (")) && l.contains(", led by dltest-")),
            "{output}"
        );
    }

    let mut ids = HashSet::new();
    for n in 0..30u64 {
        ids.insert(post(&app, n * 40).await);
    }
    consumer
        .expect_each_once_never_early(ids, Duration::from_secs(15))
        .await;
    drop(consumer);
    app.stop().await.unwrap();
    drop(cluster);
}

/// A migration between sharded chains killed half way, then run again:
/// every task arrives once (the release stage drops a second copy of one
/// moved twice), never early, and the old chain's every shard is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_migration_cut_off_midway_loses_nothing_when_run_again() {
    let (old_settings, new_settings, _poison) = three_shards_to_two();
    let old = old_settings.cascade().unwrap();
    let mut old_app = TestApp::spawn(old_settings).await;
    let mut consumer = TestConsumer::bind(&mut old_app, "sharded").await;
    let mut ids = HashSet::new();
    for n in 0..200u64 {
        ids.insert(post(&old_app, 2_000 + n * 20).await);
    }
    let _old_topology = old_app.stop_keeping_topology().await;
    let new_app = TestApp::spawn(new_settings).await;
    let new = new_app.cascade.clone();
    let old_depth = async || {
        let mut depth = 0;
        for shard in old.every_shard() {
            for level in 0..shard.levels() {
                depth += queue_depth(&shard.level_queue(level)).await;
            }
        }
        depth
    };
    let before = old_depth().await;

    let crashing = "delayline test sharded migrate crash";
    let connection = connect(amqp_uri(), crashing).await.unwrap();
    let migration = {
        let new = new.clone();
        tokio::spawn(async move {
            let old = OldChain::version_of(&new, 1);
            migrate_topology(&connection, &old, &new, &|_| true, None).await
        })
    };
    eventually("half of the old chain to be moved", async || {
        old_depth().await < before / 2
    })
    .await;
    migration.abort();
    close_connections_named(crashing);

    let connection = connect(amqp_uri(), "delayline test sharded migrate")
        .await
        .unwrap();
    let old_chain = OldChain::version_of(&new, 1);
    let report = migrate_topology(&connection, &old_chain, &new, &|_| true, None)
        .await
        .unwrap();
    assert!(report.removed);
    assert_eq!(report.shards, 3, "{report:?}");
    old_shards_are_gone(&old).await;
    consumer
        .expect_each_once_never_early(ids, Duration::from_secs(20))
        .await;
    let _ = connection.close(200, "done".into()).await;
    new_app.stop().await.unwrap();
}
