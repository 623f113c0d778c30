//! The topology as data: every exchange, queue and binding the cascade needs.
//!
//! The provisioner declares exactly this, `provision --dry-run` prints it, and
//! the routing simulator in the tests walks it, so all three agree by construction.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::names::{
    digit_pattern, ledger_marker_name, level_exchange_name, level_queue_name, poison_queue_name,
    probe_notice_queue_name, release_queue_name, unroutable_exchange_name, unroutable_queue_name,
    unroutable_seen_queue_name,
};
use super::settings::{Cascade, MAX_NAME_BYTES, QueueType};

/// The delivery limit of the quorum queues delayline consumes: none, in
/// effect. RabbitMQ 4 gives a quorum queue a limit of 20 when none is set,
/// and drops a message returned more often than that (a consumer's channel
/// or connection closing while it holds the message counts): a delayline
/// that crashed 20 times while tasks were due would lose them. `-1` means
/// "no limit" only from RabbitMQ 4.0 on (3.x drops a message at its first
/// return), so the largest 32-bit value instead, which both read alike.
pub const NO_DELIVERY_LIMIT: i64 = i32::MAX as i64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExchangeKind {
    Topic,
    Fanout,
    Direct,
    Headers,
}

impl ExchangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeKind::Topic => "topic",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Direct => "direct",
            ExchangeKind::Headers => "headers",
        }
    }

    /// A kind as RabbitMQ names it.
    pub fn parse(text: &str) -> Option<ExchangeKind> {
        [Self::Topic, Self::Fanout, Self::Direct, Self::Headers]
            .into_iter()
            .find(|kind| kind.as_str() == text)
    }
}

/// An argument value, typed as RabbitMQ compares it on redeclaration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ArgValue {
    Str(String),
    Int(i64),
}

impl fmt::Display for ArgValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgValue::Str(s) => write!(f, "{s:?}"),
            ArgValue::Int(i) => write!(f, "{i}"),
        }
    }
}

pub type Arguments = BTreeMap<String, ArgValue>;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExchangeSpec {
    pub name: String,
    pub kind: ExchangeKind,
    pub arguments: Arguments,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueSpec {
    pub name: String,
    pub arguments: Arguments,
    /// The arguments an older delayline declared this queue with, which a
    /// queue that exists already may still have: RabbitMQ cannot change
    /// them in place, so such a queue is used as it is, with a warning,
    /// until `migrate-topology` moves the chain to a new version.
    #[serde(skip)]
    pub legacy_arguments: Option<Arguments>,
}

impl QueueSpec {
    pub fn ttl_ms(&self) -> Option<u64> {
        match self.arguments.get("x-message-ttl") {
            Some(ArgValue::Int(ttl)) => u64::try_from(*ttl).ok(),
            _ => None,
        }
    }

    pub fn dead_letter_exchange(&self) -> Option<&str> {
        match self.arguments.get("x-dead-letter-exchange") {
            Some(ArgValue::Str(dlx)) => Some(dlx),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", content = "name", rename_all = "lowercase")]
pub enum BindingTarget {
    Queue(String),
    Exchange(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BindingSpec {
    pub source: String,
    pub target: BindingTarget,
    pub routing_key: String,
}

/// Everything to declare, in an order the broker accepts: exchanges, queues, bindings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TopologyPlan {
    pub exchanges: Vec<ExchangeSpec>,
    pub queues: Vec<QueueSpec>,
    pub bindings: Vec<BindingSpec>,
    /// With the release stage: the ledger the chain belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<ChainOwner>,
    /// The release queue the first shard beyond the configured ones would
    /// have: it must not exist (the chain had more shards, and what waits in
    /// them would be released by no one).
    #[serde(skip)]
    pub beyond_last_shard: Option<String>,
    /// How many shards the plan's chain has.
    #[serde(skip)]
    pub shards: u32,
}

impl TopologyPlan {
    /// The plan as an instance whose ledger is `ledger` declares it: it
    /// claims the chain for that ledger, or finds it is another's.
    pub fn owned_by(mut self, ledger: &str) -> TopologyPlan {
        if let Some(owner) = &mut self.owner {
            owner.ledger = Some(ledger.to_owned());
        }
        self
    }
}

/// A chain with the release stage belongs to one ledger: the stage delivers
/// or drops each due task by what the ledger says of it (cancelled, moved,
/// delivered), so a delayline with another ledger consuming the same release
/// queue would deliver tasks its ledger never heard of, cancelled ones
/// included. The broker records the owner beside the chain, where every
/// replica sees it: an exchange nothing is published to, whose
/// `alternate-exchange` argument is the ledger's identity. That is the one
/// exchange argument RabbitMQ compares when an exchange is declared again, so
/// the broker itself decides, atomically, which ledger declared it first; a
/// declaration with another identity is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChainOwner {
    pub marker: String,
    /// The ledger of the instance declaring the plan; `None` (provisioning
    /// from the command line, which opens no ledger) claims nothing.
    pub ledger: Option<String>,
}

impl ChainOwner {
    /// The marker exchange to declare, when there is a ledger to claim for.
    pub fn marker_exchange(&self) -> Option<ExchangeSpec> {
        let ledger = self.ledger.as_ref()?;
        Some(ExchangeSpec {
            name: self.marker.clone(),
            kind: ExchangeKind::Fanout,
            arguments: Arguments::from([(
                "alternate-exchange".to_owned(),
                ArgValue::Str(ledger.clone()),
            )]),
        })
    }
}

impl Cascade {
    /// Level `level`'s exchange in this view's shard.
    pub fn level_exchange(&self, level: u32) -> String {
        level_exchange_name(self.prefix(), self.version(), self.shard(), level)
    }

    /// Level `level`'s queue in this view's shard.
    pub fn level_queue(&self, level: u32) -> String {
        level_queue_name(self.prefix(), self.version(), self.shard(), level)
    }

    pub fn unroutable_exchange(&self) -> String {
        unroutable_exchange_name(self.business_exchange())
    }

    pub fn unroutable_queue(&self) -> String {
        unroutable_queue_name(self.business_exchange(), self.version())
    }

    pub fn poison_queue(&self) -> String {
        poison_queue_name(self.prefix(), self.version())
    }

    /// Where the release stage learns that a task it released was unroutable.
    pub fn unroutable_seen_queue(&self) -> String {
        unroutable_seen_queue_name(self.prefix(), self.version())
    }

    /// Where the replica named `owner` hears of its level probes that
    /// another replica's release stage took.
    pub fn probe_notice_queue(&self, owner: &str) -> String {
        probe_notice_queue_name(self.prefix(), self.version(), owner)
    }

    /// The exchange that records which ledger this chain belongs to.
    pub fn ledger_marker(&self) -> String {
        ledger_marker_name(self.prefix(), self.version())
    }

    /// The release stage's queue in this view's shard, and its exchange of
    /// the same name.
    pub fn release_queue(&self) -> String {
        release_queue_name(self.prefix(), self.version(), self.shard())
    }

    /// Where a due task goes: the release stage when it is on, else the
    /// business exchange.
    pub fn due_exchange(&self) -> String {
        if self.release_stage() {
            self.release_queue()
        } else {
            self.business_exchange().to_owned()
        }
    }

    /// A queue of this chain that messages wait in without a TTL or a
    /// dead-letter target, and that delayline consumes: the release queue,
    /// the unroutable queue and its notices, the poison queue. As a quorum
    /// queue it has no delivery limit ([`NO_DELIVERY_LIMIT`]), and no
    /// dead-letter strategy (with nowhere to dead-letter to, RabbitMQ 4 logs
    /// a warning about one every few seconds).
    pub fn plain_queue(&self, name: String) -> QueueSpec {
        let mut arguments = Arguments::new();
        let mut legacy_arguments = None;
        if self.queue_type() == QueueType::Quorum {
            arguments.insert("x-queue-type".into(), ArgValue::Str("quorum".into()));
            arguments.insert("x-delivery-limit".into(), ArgValue::Int(NO_DELIVERY_LIMIT));
            // What delayline declared before: a level queue's arguments.
            legacy_arguments = Some(self.queue_arguments());
        }
        QueueSpec {
            name,
            arguments,
            legacy_arguments,
        }
    }

    /// Where level `level` sends what leaves it: the next level down, or
    /// (from level 0) the release stage or the business exchange.
    pub fn next_exchange(&self, level: u32) -> String {
        match level.checked_sub(1) {
            Some(lower) => self.level_exchange(lower),
            None => self.due_exchange(),
        }
    }

    /// Bytes the broker may add to a message's headers on its way down this
    /// chain: an `x-death` entry for every level queue it waits in (naming the
    /// queue, the exchange and the routing key) and the `x-first-death-*` and
    /// `x-last-death-*` headers. A message's own headers must leave this much
    /// room in the AMQP frame, or the copy that dead-letters could not be
    /// delivered to a consumer with the same frame size.
    pub fn dead_letter_header_bytes(&self) -> usize {
        // A routing key is a short string: at most 255 bytes.
        const ROUTING_KEY: usize = MAX_NAME_BYTES;
        // Field names, type tags, lengths, the count, the reason and the time of one entry.
        const ENTRY_OVERHEAD: usize = 128;
        // x-death itself, and x-{first,last}-death-{queue,exchange,reason}.
        const FIXED: usize = 16 + 6 * (32 + MAX_NAME_BYTES);
        // The last shard has the longest names.
        let longest = self.in_shard(self.shards() - 1);
        let entries: usize = (0..self.levels())
            .map(|level| {
                ENTRY_OVERHEAD
                    + longest.level_queue(level).len()
                    + longest.level_exchange(level).len()
                    + ROUTING_KEY
            })
            .sum();
        FIXED + entries
    }

    /// The binding key at level `level` that matches a routing key whose digit `level` is `digit`.
    pub fn digit_pattern(&self, level: u32, digit: bool) -> String {
        digit_pattern(self.levels(), level, digit)
    }

    /// A release queue: a plain queue whose leader, with several shards,
    /// the broker places (see [`Cascade::spread_leaders`]).
    fn release_queue_spec(&self) -> QueueSpec {
        let mut queue = self.plain_queue(self.release_queue());
        self.spread_leaders(&mut queue.arguments);
        queue
    }

    /// With several shards, each shard's queues ask RabbitMQ to place their
    /// leader on the node with the fewest (`balanced`), so that the shards'
    /// dead-letter workers run on different nodes of a cluster. A chain of
    /// one shard keeps the arguments it always had: the broker refuses to
    /// declare a queue again with others.
    fn spread_leaders(&self, arguments: &mut Arguments) {
        if self.shards() > 1 && self.queue_type() == QueueType::Quorum {
            arguments.insert(
                "x-queue-leader-locator".into(),
                ArgValue::Str("balanced".into()),
            );
        }
    }

    fn queue_arguments(&self) -> Arguments {
        let mut arguments = Arguments::new();
        if self.queue_type() == QueueType::Quorum {
            arguments.insert("x-queue-type".into(), ArgValue::Str("quorum".into()));
            // At-least-once dead-lettering needs reject-publish overflow; together they
            // mean a message is never dropped between two levels.
            arguments.insert(
                "x-dead-letter-strategy".into(),
                ArgValue::Str("at-least-once".into()),
            );
            arguments.insert("x-overflow".into(), ArgValue::Str("reject-publish".into()));
        }
        arguments
    }

    pub fn plan(&self) -> TopologyPlan {
        let business = self.business_exchange().to_owned();
        let unroutable = self.unroutable_exchange();
        let mut plan = TopologyPlan {
            exchanges: vec![
                ExchangeSpec {
                    name: unroutable.clone(),
                    kind: ExchangeKind::Fanout,
                    arguments: Arguments::new(),
                },
                ExchangeSpec {
                    name: business,
                    kind: ExchangeKind::Topic,
                    arguments: Arguments::from([(
                        "alternate-exchange".to_owned(),
                        ArgValue::Str(unroutable.clone()),
                    )]),
                },
            ],
            queues: vec![self.plain_queue(self.unroutable_queue())],
            bindings: vec![BindingSpec {
                source: unroutable,
                target: BindingTarget::Queue(self.unroutable_queue()),
                routing_key: String::new(),
            }],
            owner: self.release_stage().then(|| ChainOwner {
                marker: self.ledger_marker(),
                ledger: None,
            }),
            beyond_last_shard: self
                .release_stage()
                .then(|| release_queue_name(self.prefix(), self.version(), self.shards())),
            shards: self.shards(),
        };
        if self.release_stage() {
            self.plan_unroutable_seen(&mut plan);
        }
        for shard in self.every_shard() {
            shard.plan_shard(&mut plan);
        }
        plan
    }

    /// One shard's objects: its release stage's, then its levels.
    fn plan_shard(&self, plan: &mut TopologyPlan) {
        if self.release_stage() {
            self.plan_release_queue(plan);
        }
        for level in (0..self.levels()).rev() {
            self.plan_level(plan, level);
        }
    }

    /// The shard's release queue, fed by its fanout exchange. No TTL and no
    /// dead-letter exchange: a due task waits here, late but never lost,
    /// until a delayline releases it.
    fn plan_release_queue(&self, plan: &mut TopologyPlan) {
        let release = self.release_queue();
        plan.exchanges.push(ExchangeSpec {
            name: release.clone(),
            kind: ExchangeKind::Fanout,
            arguments: Arguments::new(),
        });
        plan.queues.push(self.release_queue_spec());
        plan.bindings.push(BindingSpec {
            source: release.clone(),
            target: BindingTarget::Queue(release),
            routing_key: String::new(),
        });
    }

    /// The queue that hears of released tasks no queue took: one, shared by
    /// every shard.
    fn plan_unroutable_seen(&self, plan: &mut TopologyPlan) {
        let seen = self.unroutable_seen_queue();
        plan.queues.push(self.plain_queue(seen.clone()));
        plan.bindings.push(BindingSpec {
            source: self.unroutable_exchange(),
            target: BindingTarget::Queue(seen),
            routing_key: String::new(),
        });
    }

    /// Level `level`: its exchange, its queue of one TTL dead-lettering to
    /// the next exchange, digit 1 into the queue and digit 0 straight on.
    fn plan_level(&self, plan: &mut TopologyPlan, level: u32) {
        let exchange = self.level_exchange(level);
        let queue = self.level_queue(level);
        let next = self.next_exchange(level);
        plan.exchanges.push(ExchangeSpec {
            name: exchange.clone(),
            kind: ExchangeKind::Topic,
            arguments: Arguments::new(),
        });
        let mut arguments = self.queue_arguments();
        self.spread_leaders(&mut arguments);
        arguments.insert(
            "x-message-ttl".into(),
            // Validated against MAX_QUEUE_TTL_MS, far below i64::MAX.
            ArgValue::Int(self.level_ttl_ms(level) as i64),
        );
        arguments.insert("x-dead-letter-exchange".into(), ArgValue::Str(next.clone()));
        plan.queues.push(QueueSpec {
            name: queue.clone(),
            arguments,
            legacy_arguments: None,
        });
        plan.bindings.push(BindingSpec {
            source: exchange.clone(),
            target: BindingTarget::Queue(queue),
            routing_key: self.digit_pattern(level, true),
        });
        plan.bindings.push(BindingSpec {
            source: exchange,
            target: BindingTarget::Exchange(next),
            routing_key: self.digit_pattern(level, false),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cascade::CascadeSettings;

    #[test]
    fn the_queues_delayline_consumes_have_no_delivery_limit_and_no_dead_letter_strategy() {
        let cascade = CascadeSettings {
            release_stage: Some(true),
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap();
        let plan = cascade.plan();
        let consumed = [
            cascade.release_queue(),
            cascade.unroutable_queue(),
            cascade.unroutable_seen_queue(),
        ];
        for name in &consumed {
            let queue = plan.queues.iter().find(|q| &q.name == name).unwrap();
            assert_eq!(
                queue.arguments.get("x-delivery-limit"),
                Some(&ArgValue::Int(NO_DELIVERY_LIMIT)),
                "{name}"
            );
            assert!(
                !queue.arguments.contains_key("x-dead-letter-strategy"),
                "{name}"
            );
            // What older chains have: taken as they are, with a warning.
            let legacy = queue.legacy_arguments.as_ref().unwrap();
            assert_eq!(
                legacy.get("x-dead-letter-strategy"),
                Some(&ArgValue::Str("at-least-once".into()))
            );
        }
        // Level queues dead-letter at least once, and are not consumed.
        for level in 0..cascade.levels() {
            let queue = plan
                .queues
                .iter()
                .find(|q| q.name == cascade.level_queue(level))
                .unwrap();
            assert!(!queue.arguments.contains_key("x-delivery-limit"));
            assert!(queue.arguments.contains_key("x-dead-letter-strategy"));
            assert!(queue.legacy_arguments.is_none());
        }
        // Classic queues know no delivery limit.
        let classic = CascadeSettings {
            queue_type: QueueType::Classic,
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap();
        let queue = classic.plain_queue(classic.release_queue());
        assert!(queue.arguments.is_empty() && queue.legacy_arguments.is_none());
    }

    #[test]
    fn four_levels_of_one_second() {
        let cascade = CascadeSettings {
            levels: 4,
            unit_ms: 1000,
            prefix: "p".into(),
            business_exchange: Some("biz".into()),
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap();
        let plan = cascade.plan();
        let names: Vec<_> = plan.exchanges.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "biz.unroutable",
                "biz",
                "p.v1.level03",
                "p.v1.level02",
                "p.v1.level01",
                "p.v1.level00"
            ]
        );
        assert_eq!(plan.queues[0].name, "biz.unroutable.v1");
        let level3 = &plan.queues[1];
        assert_eq!(level3.name, "p.v1.level03.wait");
        assert_eq!(level3.ttl_ms(), Some(8000));
        assert_eq!(level3.dead_letter_exchange(), Some("p.v1.level02"));
        assert_eq!(
            level3.arguments.get("x-dead-letter-strategy"),
            Some(&ArgValue::Str("at-least-once".into()))
        );
        assert_eq!(
            level3.arguments.get("x-overflow"),
            Some(&ArgValue::Str("reject-publish".into()))
        );
        assert_eq!(plan.queues[4].dead_letter_exchange(), Some("biz"));
        let level1: Vec<_> = plan
            .bindings
            .iter()
            .filter(|b| b.source == "p.v1.level01")
            .map(|b| (b.routing_key.as_str(), &b.target))
            .collect();
        assert_eq!(
            level1,
            [
                ("*.*.1.#", &BindingTarget::Queue("p.v1.level01.wait".into())),
                ("*.*.0.#", &BindingTarget::Exchange("p.v1.level00".into())),
            ]
        );
        assert_eq!(
            plan.exchanges[1].arguments.get("alternate-exchange"),
            Some(&ArgValue::Str("biz.unroutable".into()))
        );
    }

    #[test]
    fn a_new_version_renames_every_object_with_arguments_and_nothing_else() {
        let settings = |version| CascadeSettings {
            levels: 3,
            version,
            ..CascadeSettings::default()
        };
        let one = settings(1).validate().unwrap().plan();
        let two = settings(2).validate().unwrap().plan();
        for (a, b) in one.exchanges.iter().zip(&two.exchanges) {
            // Only the business exchange carries an argument, and it names the
            // unversioned alternate exchange.
            assert_eq!(a.name == b.name, a.name.starts_with("delayline.business"));
        }
        for (a, b) in one.queues.iter().zip(&two.queues) {
            assert_ne!(a.name, b.name);
        }
    }

    #[test]
    fn the_release_stage_sits_between_level_zero_and_the_business_exchange() {
        let cascade = CascadeSettings {
            levels: 3,
            prefix: "p".into(),
            business_exchange: Some("biz".into()),
            release_stage: Some(true),
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap();
        let plan = cascade.plan();
        let release = plan
            .queues
            .iter()
            .find(|q| q.name == "p.v1.release")
            .unwrap();
        // A quorum queue like the levels, but nothing expires from it.
        assert_eq!(release.ttl_ms(), None);
        assert_eq!(release.dead_letter_exchange(), None);
        assert_eq!(
            release.arguments.get("x-queue-type"),
            Some(&ArgValue::Str("quorum".into()))
        );
        let level0 = plan
            .queues
            .iter()
            .find(|q| q.name == "p.v1.level00.wait")
            .unwrap();
        assert_eq!(level0.dead_letter_exchange(), Some("p.v1.release"));
        assert!(
            plan.exchanges
                .iter()
                .any(|e| e.name == "p.v1.release" && e.kind == ExchangeKind::Fanout)
        );
        assert!(plan.bindings.contains(&BindingSpec {
            source: "p.v1.release".into(),
            target: BindingTarget::Queue("p.v1.release".into()),
            routing_key: String::new(),
        }));
        assert_eq!(cascade.route_units(0, "d").entry_exchange, "p.v1.release");
        // Without the stage, level 0 leads to the business exchange.
        let off = CascadeSettings {
            release_stage: Some(false),
            ..cascade_settings_of(&cascade)
        }
        .validate()
        .unwrap();
        assert!(off.plan().queues.iter().all(|q| q.name != "p.v1.release"));
        assert_eq!(off.next_exchange(0), "biz");
    }

    fn cascade_settings_of(cascade: &Cascade) -> CascadeSettings {
        CascadeSettings {
            levels: cascade.levels(),
            prefix: cascade.prefix().into(),
            business_exchange: Some(cascade.business_exchange().into()),
            ..CascadeSettings::default()
        }
    }

    #[test]
    fn classic_queues_carry_no_quorum_arguments() {
        let cascade = CascadeSettings {
            levels: 2,
            queue_type: QueueType::Classic,
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap();
        for queue in cascade.plan().queues {
            assert!(!queue.arguments.contains_key("x-queue-type"));
            assert!(!queue.arguments.contains_key("x-overflow"));
        }
    }
}

#[cfg(test)]
mod reserve_tests {
    use crate::cascade::CascadeSettings;

    #[test]
    fn the_dead_letter_reserve_grows_with_the_levels_and_the_names() {
        let reserve = |levels, prefix: &str| {
            CascadeSettings {
                levels,
                prefix: prefix.to_owned(),
                ..CascadeSettings::default()
            }
            .validate()
            .unwrap()
            .dead_letter_header_bytes()
        };
        // The defaults leave 131072 - 14150 = 116922 bytes of a default frame
        // to a message's properties (docs/cascade.md, RELIABILITY.md).
        assert_eq!(reserve(29, "delayline"), 14_150);
        assert!(reserve(29, "delayline") > reserve(8, "delayline"));
        assert!(reserve(8, "a-much-longer-prefix") > reserve(8, "delayline"));
    }
}
