//! The chain as the API shows it (`GET /v1/topology`): computed once from
//! the cascade and shared by every request.

use serde::{Deserialize, Serialize};

use crate::cascade::Cascade;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct LevelView {
    pub level: u32,
    pub exchange: String,
    pub queue: String,
    pub ttl_ms: u64,
    pub dead_letter_exchange: String,
    /// The RabbitMQ node leading the queue, as the management API last
    /// said (absent without it: AMQP does not tell).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub leader: Option<String>,
}

/// One shard: a whole chain of levels and its release queue.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ShardView {
    pub shard: u32,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub release_queue: Option<String>,
    /// The node leading the release queue, as the management API last said.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub release_leader: Option<String>,
    /// Top level first.
    pub queues: Vec<LevelView>,
}

/// What a consumer or operator needs to know about the cascade.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct TopologyView {
    pub business_exchange: String,
    pub unroutable_exchange: String,
    pub unroutable_queue: String,
    pub unit_ms: u64,
    pub levels: u32,
    /// The longest delay a task is granted; without the release stage, on
    /// quorum queues, a millisecond less for each level (docs/cascade.md, "Without
    /// the release stage").
    pub max_delay_ms: u64,
    pub queue_type: String,
    /// The release stage's queue (and exchange), where level 0 leads when
    /// the stage is on; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub release_queue: Option<String>,
    /// How close to `deliver_at` a task is delivered, never before it: 1
    /// when the release stage holds each task to its millisecond, the unit
    /// when delays are rounded up to it.
    pub precision_ms: u64,
    /// When the release stage holds: how long before its time a task
    /// reaches it at least (`cascade.release_lead_ms`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub release_lead_ms: Option<u64>,
    /// When the release stage holds: the most tasks it holds at once
    /// (`cascade.hold_limit`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub hold_limit: Option<u32>,
    /// `destination` (a task is delivered with its destination as routing
    /// key) or `digits` (the cascade's digits come first).
    pub delivery_key: String,
    /// The pattern to bind a queue to the business exchange with, for one destination.
    pub binding_key: String,
    /// Shard 0's levels (the whole chain's, with one shard), top level first.
    pub queues: Vec<LevelView>,
    /// Chains of levels side by side (`cascade.shards`); a task goes
    /// through the one a hash of its id names.
    pub shards: u32,
    /// Every shard, shard 0 first: its release queue and its levels, with
    /// where their leaders run.
    pub shard_chains: Vec<ShardView>,
}

impl TopologyView {
    pub fn new(cascade: &Cascade) -> Self {
        TopologyView {
            business_exchange: cascade.business_exchange().to_owned(),
            unroutable_exchange: cascade.unroutable_exchange(),
            unroutable_queue: cascade.unroutable_queue(),
            unit_ms: cascade.unit_ms(),
            levels: cascade.levels(),
            max_delay_ms: cascade.max_delay_ms(),
            queue_type: cascade.queue_type().as_str().to_owned(),
            release_queue: cascade.release_stage().then(|| cascade.release_queue()),
            precision_ms: cascade.precision_ms(),
            release_lead_ms: cascade.holds().then(|| cascade.release_lead_ms()),
            hold_limit: cascade.holds().then(|| cascade.hold_limit()),
            delivery_key: cascade.delivery_key().as_str().to_owned(),
            binding_key: cascade.binding_key("{destination}"),
            queues: level_views(cascade),
            shards: cascade.shards(),
            shard_chains: cascade
                .every_shard()
                .map(|shard| ShardView {
                    shard: shard.shard(),
                    release_queue: shard.release_stage().then(|| shard.release_queue()),
                    release_leader: None,
                    queues: level_views(&shard),
                })
                .collect(),
        }
    }

    /// The view with each queue's leader as `leader_of` says.
    pub fn with_leaders(&self, leader_of: impl Fn(&str) -> Option<String>) -> TopologyView {
        let mut view = self.clone();
        let levels = view.queues.iter_mut().chain(
            view.shard_chains
                .iter_mut()
                .flat_map(|s| s.queues.iter_mut()),
        );
        for level in levels {
            level.leader = leader_of(&level.queue);
        }
        for shard in &mut view.shard_chains {
            shard.release_leader = shard.release_queue.as_deref().and_then(&leader_of);
        }
        view
    }
}

/// One shard's levels, top level first.
fn level_views(shard: &Cascade) -> Vec<LevelView> {
    (0..shard.levels())
        .rev()
        .map(|level| LevelView {
            level,
            exchange: shard.level_exchange(level),
            queue: shard.level_queue(level),
            ttl_ms: shard.level_ttl_ms(level),
            dead_letter_exchange: shard.next_exchange(level),
            leader: None,
        })
        .collect()
}
