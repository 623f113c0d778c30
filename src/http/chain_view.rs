//! The chain as the API shows it (`GET /v1/topology`): computed once from
//! the cascade and shared by every request.

use serde::{Deserialize, Serialize};

use crate::cascade::Cascade;

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct LevelView {
    pub level: u32,
    pub exchange: String,
    pub queue: String,
    pub ttl_ms: u64,
    pub dead_letter_exchange: String,
}

/// What a consumer or operator needs to know about the cascade.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
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
    pub queues: Vec<LevelView>,
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
            queues: (0..cascade.levels())
                .rev()
                .map(|level| LevelView {
                    level,
                    exchange: cascade.level_exchange(level),
                    queue: cascade.level_queue(level),
                    ttl_ms: cascade.level_ttl_ms(level),
                    dead_letter_exchange: cascade.next_exchange(level),
                })
                .collect(),
        }
    }
}
