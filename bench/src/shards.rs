//! Sharded chains (`cascade.shards`): the due rate of one burst, all its
//! tasks due at one instant, with 1, 2 and 4 shards.
//!
//! Such a burst is one chain's worst case: its tasks share their delay's
//! digits, so each level's messages leave through that level's one
//! quorum-queue dead-letter worker (record 27). With N shards a level's
//! messages are split over N queues, N workers, and on a cluster N leaders
//! placed `balanced`. Where the broker's own CPU is the bound (one node on
//! few cores), more workers share the same cores.

use std::collections::BTreeMap;

use indicatif::ProgressBar;
use serde::Serialize;

use crate::paced::unlimited_burst;
use crate::rabbitmqctl::rabbitmqctl_json;
use crate::sut::{ServiceUnderTest, Setup, Store};

#[derive(Clone, Debug, Serialize)]
pub struct ShardRun {
    pub shards: u32,
    pub tasks: usize,
    /// Arrivals a second over 10 s, from 1 s after the first.
    pub due_per_sec: f64,
    /// How many of the chain's level and release queues each node leads.
    pub leaders: BTreeMap<String, usize>,
}

pub async fn phase(
    amqp_uri: &str,
    channels: usize,
    shard_counts: &[u32],
    rate: f64,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<ShardRun>> {
    let mut runs = Vec::new();
    for &shards in shard_counts {
        progress.set_message(format!("shards: {shards}, a burst of {rate}/s × 12 s"));
        let setup = Setup {
            shards,
            ..Setup::default_with(Store::Sqlite)
        };
        let mut sut = ServiceUnderTest::spawn(amqp_uri, channels, &setup).await?;
        let leaders = leaders(sut.cascade.prefix()).unwrap_or_default();
        let burst = unlimited_burst(&mut sut, amqp_uri, rate).await;
        sut.stop().await?;
        let burst = burst?;
        runs.push(ShardRun {
            shards,
            tasks: burst.tasks,
            due_per_sec: burst.achieved_per_sec,
            leaders,
        });
    }
    Ok(runs)
}

/// Queues of the chain named `prefix`, counted by the node leading each.
fn leaders(prefix: &str) -> anyhow::Result<BTreeMap<String, usize>> {
    let queues = rabbitmqctl_json(&["list_queues", "name", "leader"])?;
    let mut per_node = BTreeMap::new();
    for queue in queues.as_array().into_iter().flatten() {
        let name = queue["name"].as_str().unwrap_or_default();
        if !name.starts_with(&format!("{prefix}.")) {
            continue;
        }
        // A classic queue (the ingress's) names no leader.
        let leader = match queue["leader"].as_str() {
            Some(node) if !node.is_empty() => node.to_owned(),
            _ => "(classic)".to_owned(),
        };
        *per_node.entry(leader).or_default() += 1;
    }
    Ok(per_node)
}
