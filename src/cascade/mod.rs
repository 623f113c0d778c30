//! The binary TTL cascade as pure logic: no I/O, so it is tested exhaustively.
//!
//! A delay of `d` units is written as the L binary digits of `d` in the routing
//! key. Level `l` holds a message for 2^l units when digit `l` is set and passes
//! it straight down otherwise, so the waits add up to exactly `d` units. Each
//! level queue has a single TTL, which keeps FIFO order equal to expiry order:
//! no message ever waits behind a longer-lived one.
//!
//! A chain may have several shards, whole chains of levels side by side
//! (`cascade.shards`): a [`Cascade`] is a view of one of them
//! ([`Cascade::in_shard`]), shard 0 for the chain as a whole, and a task
//! goes through the shard a hash of its id names ([`Cascade::for_task`]).

mod loss;
mod names;
mod plan;
mod reschedule;
mod route;
mod settings;
#[cfg(test)]
mod sim;
mod spread;
mod strand;

pub(crate) use loss::LossWindow;
pub(crate) use names::{
    digit_pattern, ledger_marker_name, level_exchange_name, level_queue_name, poison_queue_name,
    release_queue_name, unroutable_exchange_name, unroutable_queue_name,
    unroutable_seen_queue_name,
};
pub use plan::{ArgValue, BindingSpec, BindingTarget, ExchangeKind, ExchangeSpec, TopologyPlan};
pub(crate) use plan::{Arguments, QueueSpec};
pub(crate) use route::{Route, RouteError, destination_of, validate_destination};
pub use settings::{Cascade, CascadeSettings, DeliveryKey, QueueType, TTL_FAST_PPM, ttl_fast_by};
pub(crate) use settings::{MAX_LEVELS, MAX_NAME_BYTES, MAX_SHARDS, SettingsError};
pub use spread::{LevelLoad, Planned};
pub use strand::{Evidence, LevelWatch};
pub(crate) use strand::{digit_position, levels_left, probe_units, units_below};

/// The one cascade unit tests build: chain `t.v1`, business exchange `biz`.
#[cfg(test)]
pub(crate) fn for_tests(levels: u32, unit_ms: u64, queue_type: QueueType) -> Cascade {
    CascadeSettings {
        levels,
        unit_ms,
        queue_type,
        prefix: "t".into(),
        version: 1,
        business_exchange: Some("biz".into()),
        release_stage: None,
        delivery_key: DeliveryKey::Destination,
        ..CascadeSettings::default()
    }
    .validate()
    .expect("valid test cascade")
}
/// `for_tests`' chain with the release stage and `shards` shards.
#[cfg(test)]
pub(crate) fn sharded_for_tests(levels: u32, unit_ms: u64, shards: u32) -> Cascade {
    CascadeSettings {
        levels,
        unit_ms,
        prefix: "t".into(),
        business_exchange: Some("biz".into()),
        release_stage: Some(true),
        shards,
        ..CascadeSettings::default()
    }
    .validate()
    .expect("valid sharded test cascade")
}

#[cfg(test)]
pub(crate) use settings::{MAX_QUEUE_TTL_MS, max_levels_for_unit};
