//! `migrate-topology`: from one version of the chain to the next without
//! losing a message.
//!
//! The new chain is provisioned beside the old one. Every message waiting in
//! an old level queue is consumed, routed afresh by what remains until its
//! due time ([`crate::message::deliver_at_ms`], rounded up to the new unit,
//! so never early), published into the new chain with confirms, and
//! acknowledged only after the confirm.
//! A crash at any point leaves each message either still in the old queue
//! (unacknowledged messages return to it) or already in the new chain, or, if
//! the crash fell between confirm and ack, in both: at worst a duplicate,
//! never a loss. Re-running finishes the job.
//!
//! Messages waiting in the old chain's release queue (its tasks are due)
//! move on as due tasks: into the new chain's release stage, or to the
//! business exchange when the new chain has none. Turning the release stage
//! on or off is such a migration, because it changes level 0's dead-letter
//! target.
//!
//! Unroutable messages move to the new unroutable queue with their
//! routing key; a message that cannot be rescheduled (no header, a key that
//! does not parse, a delay beyond the new chain) goes to the new chain's
//! poison queue with its routing key and the reason in headers.
//!
//! Old queues are drained from the top level down, because a message expiring
//! meanwhile only ever moves down. They are deleted top down, and the old
//! exchanges after them; the deletion is what makes the old chain's level
//! count unknowable, so exchanges outlive queues and give it back on a re-run.
//!
//! Quorum queues refuse `queue.delete` with `if-empty` (RabbitMQ closes the
//! whole connection), so emptiness is established, not asked for: each queue
//! is first unbound from its exchange (nothing can enter it any more; the
//! levels above are gone already), drained once more, given a moment for
//! messages that expired meanwhile to finish dead-lettering, and then found
//! empty: by the management API's total, which counts the messages a quorum
//! queue's dead-letter worker holds, or, where that API does not answer, by
//! the ready count a passive declare gives. Only then is it deleted, and the
//! report says which check each deletion rested on.

use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable as Arguments;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use tracing::info;

use super::check::discover_chain;
use super::inspect::{exchange_exists, queue_state};
use super::management::ManagementApi;
use super::provision::declare_queue;
use super::{BrokerError, Context, confirm_outcome, open_channel, provision};
use crate::cascade::{
    Cascade, MAX_LEVELS, MAX_SHARDS, destination_of, digit_pattern, ledger_marker_name,
    level_exchange_name, level_queue_name, poison_queue_name, release_queue_name,
    unroutable_queue_name, unroutable_seen_queue_name,
};
use crate::message;

/// Messages taken, published and confirmed together.
const WINDOW: u16 = 256;
/// A queue with no delivery for this long is drained.
const IDLE: Duration = Duration::from_millis(300);
/// Drain passes over every old queue before giving up on an ever-refilling one.
const MAX_PASSES: u32 = 20;
/// After a queue's last drain, how long messages that expired meanwhile get
/// to finish dead-lettering (milliseconds, unless the broker's worker stalls).
const SETTLE: Duration = Duration::from_secs(1);
/// The chain being retired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OldChain {
    pub prefix: String,
    pub version: u32,
    pub business_exchange: String,
    /// Known when the old settings are given; otherwise read off the broker.
    pub levels: Option<u32>,
    /// Known when the old settings are given; otherwise read off the
    /// broker (the shards whose level 0 exchange exists, from shard 0 on).
    pub shards: Option<u32>,
}

/// Whether a task's copy waiting in the old chain is still to be delivered,
/// from its properties (its task id and revision). The migration asks it of
/// every message of an old level or release queue and drops the copy when
/// the answer is no; the operator's layer answers it from the ledger.
pub type StillWanted<'a> = &'a (dyn Fn(&BasicProperties) -> bool + Sync);

impl OldChain {
    /// The version before `new`'s, with the same names otherwise.
    pub fn version_of(new: &Cascade, version: u32) -> Self {
        OldChain {
            prefix: new.prefix().to_owned(),
            version,
            business_exchange: new.business_exchange().to_owned(),
            levels: None,
            shards: None,
        }
    }

    pub fn from_settings(old: &Cascade) -> Self {
        OldChain {
            prefix: old.prefix().to_owned(),
            version: old.version(),
            business_exchange: old.business_exchange().to_owned(),
            levels: Some(old.levels()),
            shards: Some(old.shards()),
        }
    }

    fn level_queue(&self, shard: u32, level: u32) -> String {
        level_queue_name(&self.prefix, self.version, shard, level)
    }

    fn level_exchange(&self, shard: u32, level: u32) -> String {
        level_exchange_name(&self.prefix, self.version, shard, level)
    }

    fn release_queue(&self, shard: u32) -> String {
        release_queue_name(&self.prefix, self.version, shard)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// Levels of the old chain.
    pub levels: u32,
    /// Shards of the old chain.
    pub shards: u32,
    /// Moved into the new chain with their remaining delay.
    pub rescheduled: u64,
    /// Already due: sent straight to the business exchange.
    pub overdue: u64,
    /// Moved to the new unroutable queue.
    pub unroutable: u64,
    /// Could not be rescheduled: in the new poison queue.
    pub poisoned: u64,
    /// Copies of cancelled tasks, or older revisions of moved ones: dropped.
    pub superseded: u64,
    /// The old service's level probes: no task's, so dropped, not moved.
    pub probes: u64,
    /// The task ids (AMQP `message_id`) of the messages poisoned here, with
    /// the reason: for the ledger to say so.
    pub poisoned_tasks: Vec<(String, String)>,
    /// Whether the old chain's queues and exchanges were deleted.
    pub removed: bool,
    /// Each deleted queue, and what showed it empty.
    pub deleted: Vec<(String, EmptinessCheck)>,
}

/// What showed an old queue empty before it was deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmptinessCheck {
    /// The management API counted no message at all, held ones included.
    ManagementTotal,
    /// A passive declare counted no ready message after the settling time;
    /// messages a quorum queue's dead-letter worker holds are not counted.
    ReadyCount,
}

impl std::fmt::Display for EmptinessCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EmptinessCheck::ManagementTotal => {
                "no message in all (management API, held messages included)"
            }
            EmptinessCheck::ReadyCount => {
                "no ready message (passive declare; the management API did not answer, so \
                 messages held by a quorum queue's dead-letter worker could not be counted)"
            }
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(
        "the old and the new chain are both {0}: raise cascade.version (or change cascade.prefix) \
         in the new settings first"
    )]
    SameChain(String),
    #[error(
        "moving a message from {queue:?} failed: {reason}. Nothing unconfirmed was acknowledged; \
         run the migration again"
    )]
    Publish { queue: String, reason: String },
    #[error(
        "chain {chain} still receives messages after {MAX_PASSES} passes: is a delayline of the \
         old version still publishing into it? Stop it, then run the migration again"
    )]
    StillFilling { chain: String },
}

/// What becomes of one message taken from an old queue.
pub(super) enum Kind {
    /// From an old level queue of `levels` levels: rescheduled or poisoned.
    Level { levels: u32 },
    /// From the old unroutable queue of a chain of `levels` levels: its
    /// again in the new one, its routing key rewritten for the new number
    /// of levels, so that `requeue-unroutable` reaches today's bindings.
    Unroutable { levels: u32 },
    /// From the old poison queue: into the new one as it is.
    Poison,
    /// From the unroutable queue back to the business exchange, once its binding exists.
    Requeue,
}

pub(super) struct Mover<'a> {
    pub(super) new: &'a Cascade,
    pub(super) still_wanted: Option<StillWanted<'a>>,
    pub(super) publish: Channel,
    pub(super) report: MigrationReport,
}

/// Moves everything out of `old` into `new` and removes `old`, dropping the
/// copies of tasks not `still_wanted`. `management` is the broker's
/// management API, when it may answer: it is what can count a quorum queue's
/// held messages before the queue is deleted.
pub async fn migrate_topology(
    connection: &Connection,
    old: &OldChain,
    new: &Cascade,
    still_wanted: StillWanted<'_>,
    management: Option<&ManagementApi>,
) -> Result<MigrationReport, MigrateError> {
    if old.prefix == new.prefix() && old.version == new.version() {
        return Err(MigrateError::SameChain(format!(
            "{}.v{}",
            old.prefix, old.version
        )));
    }
    let channel = prepare_new_chain(connection, new).await?;
    let (levels, shards) = old_shape(connection, old).await?;
    let drained = OldQueues::find(connection, old, new, levels, shards).await?;
    let mut mover = Mover {
        new,
        still_wanted: Some(still_wanted),
        publish: channel,
        report: MigrationReport {
            levels,
            shards,
            ..MigrationReport::default()
        },
    };
    for pass in 1..=MAX_PASSES {
        let mut moved = 0;
        for (queue, kind) in &drained.queues {
            moved += mover.drain(connection, queue, kind, None).await?;
        }
        info!(
            pass,
            moved,
            rescheduled = mover.report.rescheduled,
            overdue = mover.report.overdue,
            unroutable = mover.report.unroutable,
            poisoned = mover.report.poisoned,
            superseded = mover.report.superseded,
            "migration pass done"
        );
        if moved == 0
            && mover
                .remove_drained(connection, &drained.queues, &drained.bindings, management)
                .await?
        {
            delete_old_exchanges(connection, old, (levels, shards), drained.has_release_stage)
                .await?;
            mover.report.removed = true;
            let _ = mover.publish.close(200, "migrated".into()).await;
            return Ok(mover.report);
        }
    }
    Err(MigrateError::StillFilling {
        chain: format!("{}.v{}", old.prefix, old.version),
    })
}

/// Provisions the new chain and its poison queue; returns a channel with
/// publisher confirms to move messages on.
async fn prepare_new_chain(
    connection: &Connection,
    new: &Cascade,
) -> Result<Channel, MigrateError> {
    provision(connection, &new.plan()).await?;
    let poison = new.plain_queue(new.poison_queue());
    let mut channel =
        open_channel(connection, || "opening a channel to migrate".to_owned()).await?;
    if let Some(conflict) = declare_queue(connection, &mut channel, &poison).await? {
        return Err(BrokerError::from(conflict).into());
    }
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .context(|| "enabling publisher confirms".to_owned())?;
    Ok(channel)
}

/// The old chain's queues, in the order they are drained, and where each
/// level queue is bound.
struct OldQueues {
    queues: Vec<(String, Kind)>,
    /// The binding of each queue of `queues` at the same index, if any.
    bindings: Vec<(String, String)>,
    has_release_stage: bool,
}

impl OldQueues {
    async fn find(
        connection: &Connection,
        old: &OldChain,
        new: &Cascade,
        levels: u32,
        shards: u32,
    ) -> Result<OldQueues, MigrateError> {
        let old_unroutable = unroutable_queue_name(&old.business_exchange, old.version);
        // With another prefix but the same version and business exchange, both
        // chains share one unroutable queue: nothing to move there.
        let own_unroutable_queue = old_unroutable != new.unroutable_queue();
        // From now on only the new unroutable queue receives what is unroutable.
        if own_unroutable_queue && queue_state(connection, &old_unroutable).await?.is_some() {
            unbind_unroutable_queue(connection, &old_unroutable, &old.business_exchange).await?;
        }
        // Top level first, every shard's at once: a message only ever moves
        // down its own shard.
        let mut queues: Vec<(String, Kind)> = Vec::new();
        // Where each level queue is bound: its exchange, for digit 1 of its level.
        let mut bindings: Vec<(String, String)> = Vec::new();
        for level in (0..levels).rev() {
            for shard in 0..shards {
                queues.push((old.level_queue(shard, level), Kind::Level { levels }));
                bindings.push((
                    old.level_exchange(shard, level),
                    digit_pattern(levels, level, true),
                ));
            }
        }
        // The old release stage, if it had one, holds tasks already due: they
        // move on as due tasks (to the new chain's release stage or business
        // exchange), in the order they flow, after level 0.
        let has_release_stage = queue_state(connection, &old.release_queue(0))
            .await?
            .is_some();
        for shard in (0..shards).filter(|_| has_release_stage) {
            let old_release = old.release_queue(shard);
            queues.push((old_release.clone(), Kind::Level { levels }));
            bindings.push((old_release, String::new()));
        }
        if own_unroutable_queue {
            queues.push((old_unroutable, Kind::Unroutable { levels }));
        }
        queues.push((poison_queue_name(&old.prefix, old.version), Kind::Poison));
        Ok(OldQueues {
            queues,
            bindings,
            has_release_stage,
        })
    }
}

/// Once the old queues are gone: the old chain's exchanges, top level first.
async fn delete_old_exchanges(
    connection: &Connection,
    old: &OldChain,
    (levels, shards): (u32, u32),
    has_release_stage: bool,
) -> Result<(), MigrateError> {
    // Shard 0's last: its level exchanges are what tells a re-run the old
    // chain's shape.
    for shard in (0..shards).rev() {
        for level in (0..levels).rev() {
            delete_exchange(connection, &old.level_exchange(shard, level)).await?;
        }
    }
    if has_release_stage {
        for shard in 0..shards {
            delete_exchange(connection, &old.release_queue(shard)).await?;
        }
        delete_exchange(connection, &ledger_marker_name(&old.prefix, old.version)).await?;
        // Notices that a released task was unroutable: the unroutable
        // message itself moved with the unroutable queue.
        let notices = unroutable_seen_queue_name(&old.prefix, old.version);
        delete_notices(connection, &notices).await?;
    }
    Ok(())
}

/// What a migration would find, looked at without taking anything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Survey {
    pub levels: u32,
    pub shards: u32,
    /// Ready messages in each old level queue that exists, top level first,
    /// then in the old release queue if there is one.
    pub waiting: Vec<(String, u32)>,
    pub unroutable: u32,
    pub poisoned: u32,
}

/// Counts what waits in `old` (ready messages, by passive declares), for
/// `migrate-topology --dry-run`.
pub async fn survey(connection: &Connection, old: &OldChain) -> Result<Survey, BrokerError> {
    let (levels, shards) = old_shape(connection, old).await?;
    let mut waiting = Vec::new();
    let queues = (0..levels)
        .rev()
        .flat_map(|level| (0..shards).map(move |shard| old.level_queue(shard, level)))
        .chain((0..shards).map(|shard| old.release_queue(shard)));
    for queue in queues {
        if let Some(state) = queue_state(connection, &queue).await? {
            waiting.push((queue, state.messages));
        }
    }
    let count = async |queue: String| {
        queue_state(connection, &queue)
            .await
            .map(|q| q.map_or(0, |q| q.messages))
    };
    Ok(Survey {
        levels,
        shards,
        waiting,
        unroutable: count(unroutable_queue_name(&old.business_exchange, old.version)).await?,
        poisoned: count(poison_queue_name(&old.prefix, old.version)).await?,
    })
}

/// The old chain's levels and shards, as given or read off the broker.
async fn old_shape(connection: &Connection, old: &OldChain) -> Result<(u32, u32), BrokerError> {
    let levels = match old.levels {
        Some(levels) => levels,
        None => old_levels(connection, old).await?,
    };
    let shards = match old.shards {
        Some(shards) => shards,
        // No chain left (a re-run after it was deleted): no shard either.
        None if levels == 0 => 0,
        None => old_shards(connection, old).await?,
    };
    Ok((levels, shards))
}

/// The old chain's shard count: shard 0, and each further shard whose level
/// 0 exchange (or release queue) exists, up to the first missing.
async fn old_shards(connection: &Connection, old: &OldChain) -> Result<u32, BrokerError> {
    let mut shards = 1;
    while shards < MAX_SHARDS
        && (exchange_exists(connection, &old.level_exchange(shards, 0)).await?
            || queue_state(connection, &old.release_queue(shards))
                .await?
                .is_some())
    {
        shards += 1;
    }
    Ok(shards)
}

/// The old chain's level count: its contiguous exchanges (or queues) from level 0.
async fn old_levels(connection: &Connection, old: &OldChain) -> Result<u32, BrokerError> {
    let mut exchanges = 0;
    while exchanges < MAX_LEVELS
        && exchange_exists(connection, &old.level_exchange(0, exchanges)).await?
    {
        exchanges += 1;
    }
    let queues = discover_chain(connection, &old.prefix, old.version)
        .await?
        .len() as u32;
    Ok(exchanges.max(queues))
}

async fn unbind_unroutable_queue(
    connection: &Connection,
    queue: &str,
    business_exchange: &str,
) -> Result<(), BrokerError> {
    let exchange = crate::cascade::unroutable_exchange_name(business_exchange);
    let channel = open_channel(connection, || {
        "opening a channel to unbind the old unroutable queue".to_owned()
    })
    .await?;
    channel
        .queue_unbind(
            queue.into(),
            exchange.as_str().into(),
            "".into(),
            FieldTable::default(),
        )
        .await
        .context(|| format!("unbinding {queue:?} from {exchange:?}"))?;
    let _ = channel.close(200, "unbound".into()).await;
    Ok(())
}

/// How `queue` was shown empty, or None when it is not.
async fn emptiness(
    connection: &Connection,
    queue: &str,
    management: Option<&ManagementApi>,
) -> Result<Option<EmptinessCheck>, BrokerError> {
    if let Some(api) = management {
        let pattern = format!("^{}$", queue.replace('.', "\\."));
        match api.queues(&pattern).await {
            Ok(counts) => {
                let total: u64 = counts.iter().map(|q| q.messages).sum();
                return Ok((total == 0).then_some(EmptinessCheck::ManagementTotal));
            }
            Err(error) => {
                info!(%error, "the management API does not answer; counting ready messages only")
            }
        }
    }
    let ready = queue_state(connection, queue)
        .await?
        .map_or(0, |q| q.messages);
    Ok((ready == 0).then_some(EmptinessCheck::ReadyCount))
}

async fn unbind(
    connection: &Connection,
    queue: &str,
    exchange: &str,
    pattern: &str,
) -> Result<(), BrokerError> {
    let channel = open_channel(connection, || {
        format!("opening a channel to unbind {queue:?}")
    })
    .await?;
    channel
        .queue_unbind(
            queue.into(),
            exchange.into(),
            pattern.into(),
            Arguments::default(),
        )
        .await
        .context(|| format!("unbinding {queue:?} from {exchange:?}"))?;
    let _ = channel.close(200, "unbound".into()).await;
    Ok(())
}

async fn delete_exchange(connection: &Connection, exchange: &str) -> Result<(), BrokerError> {
    delete_old(connection, OldObject::Exchange(exchange)).await
}

/// Deletes a queue of notices, whatever it holds.
async fn delete_notices(connection: &Connection, queue: &str) -> Result<(), BrokerError> {
    delete_old(connection, OldObject::Queue(queue)).await
}

/// An object of the old chain deleted as it is (not a queue of waiting
/// messages: those are drained and shown empty first).
enum OldObject<'a> {
    Exchange(&'a str),
    Queue(&'a str),
}

/// Deletes `object` if it exists, on a channel of its own.
async fn delete_old(connection: &Connection, object: OldObject<'_>) -> Result<(), BrokerError> {
    let (name, exists) = match object {
        OldObject::Exchange(name) => (name, exchange_exists(connection, name).await?),
        OldObject::Queue(name) => (name, queue_state(connection, name).await?.is_some()),
    };
    if !exists {
        return Ok(());
    }
    let channel = open_channel(connection, || {
        format!("opening a channel to delete {name:?}")
    })
    .await?;
    let deleted = match object {
        OldObject::Exchange(_) => {
            channel
                .exchange_delete(name.into(), ExchangeDeleteOptions::default())
                .await
        }
        OldObject::Queue(_) => channel
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await
            .map(drop),
    };
    deleted.context(|| format!("deleting the old {name:?}"))?;
    let _ = channel.close(200, "deleted".into()).await;
    Ok(())
}

impl Mover<'_> {
    /// Deletes each old queue that exists, top level first, once it is shown
    /// empty (see the module's documentation). False when one was not: it
    /// took or still held messages, so another pass is needed.
    async fn remove_drained(
        &mut self,
        connection: &Connection,
        queues: &[(String, Kind)],
        bindings: &[(String, String)],
        management: Option<&ManagementApi>,
    ) -> Result<bool, MigrateError> {
        for (index, (queue, kind)) in queues.iter().enumerate() {
            if queue_state(connection, queue).await?.is_none() {
                continue;
            }
            if let Some((exchange, pattern)) = bindings.get(index)
                && exchange_exists(connection, exchange).await?
            {
                unbind(connection, queue, exchange, pattern).await?;
            }
            if self.drain(connection, queue, kind, None).await? > 0 {
                return Ok(false);
            }
            tokio::time::sleep(SETTLE).await;
            let Some(check) = emptiness(connection, queue, management).await? else {
                return Ok(false);
            };
            let channel = open_channel(connection, || {
                format!("opening a channel to delete {queue:?}")
            })
            .await?;
            channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await
                .context(|| format!("deleting {queue:?}"))?;
            let _ = channel.close(200, "deleted".into()).await;
            info!(queue, checked = %check, "deleted the drained old queue");
            self.report.deleted.push((queue.clone(), check));
        }
        Ok(true)
    }

    /// Where a message goes, and with which properties.
    fn destination(
        &mut self,
        delivery: &Delivery,
        kind: &Kind,
    ) -> (String, String, BasicProperties) {
        let key = delivery.routing_key.as_str();
        match kind {
            Kind::Level { levels } => {
                let deliver_at = message::deliver_at_ms(&delivery.properties);
                // One reading for the route and its stamp alike.
                let now = crate::clock::read();
                match self.new.reschedule(key, *levels, deliver_at, now.wall_ms) {
                    Ok(route) => {
                        // Into the new chain's shard for the task's id.
                        let id = delivery.properties.message_id().as_ref();
                        let route = self
                            .new
                            .in_task_shard(route, id.map_or("", |id| id.as_str()));
                        // Due already (not merely within the new chain's release lead).
                        if route.delay_ms == 0 {
                            self.report.overdue += 1;
                        } else {
                            self.report.rescheduled += 1;
                        }
                        // Stamped afresh: another chain, another least time.
                        let properties = message::restamped(&delivery.properties, &route, &now);
                        (route.entry_exchange, route.routing_key, properties)
                    }
                    Err(reason) => {
                        self.report.poisoned += 1;
                        if let Some(id) = delivery.properties.message_id() {
                            self.report
                                .poisoned_tasks
                                .push((id.to_string(), reason.to_string()));
                        }
                        let properties =
                            message::poisoned(&delivery.properties, key, &reason.to_string());
                        (String::new(), self.new.poison_queue(), properties)
                    }
                }
            }
            Kind::Unroutable { levels } => {
                self.report.unroutable += 1;
                // Due already: the key a zero delay has in the new chain.
                let rekeyed = destination_of(key, *levels)
                    .and_then(|destination| self.new.route(Duration::ZERO, destination).ok())
                    .map_or_else(|| key.to_owned(), |route| route.routing_key);
                (
                    self.new.unroutable_exchange(),
                    rekeyed,
                    delivery.properties.clone(),
                )
            }
            Kind::Requeue => {
                self.report.unroutable += 1;
                // Where it was delivered to: the business exchange, or the
                // exchange the task named.
                let exchange = message::delivered_to(&delivery.properties)
                    .unwrap_or_else(|| self.new.business_exchange().to_owned());
                (exchange, key.to_owned(), delivery.properties.clone())
            }
            Kind::Poison => {
                self.report.poisoned += 1;
                (
                    String::new(),
                    self.new.poison_queue(),
                    delivery.properties.clone(),
                )
            }
        }
    }

    /// Moves what `queue` holds, window by window, until it stays empty for
    /// [`IDLE`]. Returns how many messages were moved.
    pub(super) async fn drain(
        &mut self,
        connection: &Connection,
        queue: &str,
        kind: &Kind,
        limit: Option<u64>,
    ) -> Result<u64, MigrateError> {
        // Deleting it later (if-empty) proves it stayed empty.
        if queue_state(connection, queue)
            .await?
            .is_none_or(|q| q.messages == 0)
        {
            return Ok(0);
        }
        let consuming = open_channel(connection, || {
            format!("opening a channel to drain {queue:?}")
        })
        .await?;
        consuming
            .basic_qos(WINDOW, BasicQosOptions::default())
            .await
            .context(|| format!("limiting unacknowledged messages from {queue:?}"))?;
        let tag = "delayline-migrate-topology";
        let mut consumer = consuming
            .basic_consume(
                queue.into(),
                tag.into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .context(|| format!("consuming {queue:?}"))?;
        let mut moved = 0;
        while limit.is_none_or(|limit| moved < limit) {
            let first = match tokio::time::timeout(IDLE, consumer.next()).await {
                // Idle, or the consumer was cancelled by the broker.
                Err(_) | Ok(None) => break,
                Ok(Some(delivery)) => delivery,
            };
            let mut window = vec![first.context(|| format!("receiving from {queue:?}"))?];
            while window.len() < usize::from(WINDOW) {
                match consumer.next().now_or_never() {
                    Some(Some(delivery)) => {
                        window.push(delivery.context(|| format!("receiving from {queue:?}"))?)
                    }
                    _ => break,
                }
            }
            // Beyond the limit, deliveries stay unacknowledged and return to
            // the queue when the channel closes.
            if let Some(limit) = limit {
                window.truncate(usize::try_from(limit - moved).unwrap_or(usize::MAX));
            }
            self.publish_window(queue, kind, &window).await?;
            if let Some(last) = window.last() {
                last.acker
                    .ack(BasicAckOptions { multiple: true })
                    .await
                    .context(|| format!("acknowledging moved messages of {queue:?}"))?;
            }
            moved += window.len() as u64;
        }
        let _ = consuming
            .basic_cancel(tag.into(), BasicCancelOptions::default())
            .await;
        let _ = consuming.close(200, "drained".into()).await;
        if moved > 0 {
            match kind {
                Kind::Requeue => info!(
                    queue,
                    moved, "sent unroutable messages back to the business exchange"
                ),
                _ => info!(queue, moved, "moved messages out of the old chain"),
            }
        }
        Ok(moved)
    }

    /// Publishes every message of the window, then waits for all confirms.
    async fn publish_window(
        &mut self,
        queue: &str,
        kind: &Kind,
        window: &[Delivery],
    ) -> Result<(), MigrateError> {
        let failed = |reason: String| MigrateError::Publish {
            queue: queue.to_owned(),
            reason,
        };
        let mut confirms = Vec::with_capacity(window.len());
        for delivery in window {
            if matches!(kind, Kind::Level { .. })
                && message::Probe::read(&delivery.properties).is_some()
            {
                self.report.probes += 1;
                continue;
            }
            if matches!(kind, Kind::Level { .. })
                && self
                    .still_wanted
                    .is_some_and(|wanted| !wanted(&delivery.properties))
            {
                self.report.superseded += 1;
                continue;
            }
            let (exchange, routing_key, properties) = self.destination(delivery, kind);
            let confirm = self
                .publish
                .basic_publish(
                    exchange.as_str().into(),
                    routing_key.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &delivery.data,
                    properties,
                )
                .await
                .map_err(|e| failed(e.to_string()))?;
            confirms.push(confirm);
        }
        for confirm in confirms {
            let confirmation = confirm.await.map_err(|e| failed(e.to_string()))?;
            confirm_outcome(confirmation).map_err(|e| failed(e.to_string()))?;
        }
        Ok(())
    }
}
