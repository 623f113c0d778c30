//! The names of a chain's broker objects, and a level's binding pattern. A
//! leaf: the settings, the plan and the migration all name objects alike.

// Every object whose arguments follow from the settings carries the chain's
// version in its name: the broker cannot change a queue's arguments, so a
// new TTL, unit or queue type is a new chain beside the old one, never an
// edit of it (see `migrate-topology`). The business exchange and the
// unroutable exchange have no such arguments and keep their names, so
// consumers' bindings outlive every migration.

/// The common part of a shard's level and release names: shard 0 keeps the
/// names a chain had before shards existed, so a chain of one shard is the
/// chain it always was.
pub fn shard_base_name(prefix: &str, version: u32, shard: u32) -> String {
    match shard {
        0 => format!("{prefix}.v{version}"),
        shard => format!("{prefix}.v{version}.s{shard}"),
    }
}

pub fn level_exchange_name(prefix: &str, version: u32, shard: u32, level: u32) -> String {
    format!(
        "{}.level{level:02}",
        shard_base_name(prefix, version, shard)
    )
}

pub fn level_queue_name(prefix: &str, version: u32, shard: u32, level: u32) -> String {
    format!(
        "{}.level{level:02}.wait",
        shard_base_name(prefix, version, shard)
    )
}

/// The binding key at level `level` of a chain of `levels` levels that
/// matches a routing key whose digit `level` is `digit`: the digits above
/// it are wildcards, the destination is `#`.
pub fn digit_pattern(levels: u32, level: u32, digit: bool) -> String {
    let mut pattern = "*.".repeat((levels - 1 - level) as usize);
    pattern.push_str(if digit { "1.#" } else { "0.#" });
    pattern
}

/// Where `migrate-topology` puts the messages it cannot reschedule.
pub fn poison_queue_name(prefix: &str, version: u32) -> String {
    format!("{prefix}.v{version}.poison")
}

/// The release stage's exchange and queue (one name, two kinds of object):
/// level 0 dead-letters here when the release stage is on.
pub fn release_queue_name(prefix: &str, version: u32, shard: u32) -> String {
    format!("{}.release", shard_base_name(prefix, version, shard))
}

/// A replica's own queue (exclusive to its connection, gone with it) where
/// the other replicas hand on the level probes it sent that reached them:
/// `owner` is the replica's name on its probes (16 hex digits).
pub fn probe_notice_queue_name(prefix: &str, version: u32, owner: &str) -> String {
    format!("{prefix}.v{version}.probes.{owner}")
}

/// The exchange that names the ledger a chain belongs to (see [`super::ChainOwner`]).
pub fn ledger_marker_name(prefix: &str, version: u32) -> String {
    format!("{prefix}.v{version}.ledger")
}

/// A second queue behind the unroutable exchange, with the release stage:
/// each copy of an unroutable message in it tells delayline that the task it
/// released reached no queue (the alternate exchange takes the message, so
/// the publisher is told nothing).
pub fn unroutable_seen_queue_name(prefix: &str, version: u32) -> String {
    format!("{prefix}.v{version}.unroutable-seen")
}

/// The business exchange of a chain whose settings name none: the
/// prefix's own, so that two prefixes never deliver into each other's
/// consumers' queues.
pub fn business_exchange_of(prefix: &str) -> String {
    format!("{prefix}.business")
}

/// The alternate exchange of the business exchange.
pub fn unroutable_exchange_name(business_exchange: &str) -> String {
    format!("{business_exchange}.unroutable")
}

pub fn unroutable_queue_name(business_exchange: &str, version: u32) -> String {
    format!("{business_exchange}.unroutable.v{version}")
}
