//! `deprovision`: what delayline declared for the configured chain (its
//! prefix and version), with the queues an operator names, looked at and,
//! when asked, deleted.
//!
//! A chain that still holds work is not deleted unless the operator says to
//! drop it: the tasks on their way (by the ledger, which knows them; without
//! one, the messages in the levels and release queues, where no probe goes;
//! a ledger never made is not made now)
//! and the messages parked in its other queues (unroutable, poison, an
//! ingress's intake and refusals). Dropped tasks are cancelled in the ledger
//! before anything is deleted, so that no replica publishes them again into
//! the next chain. A chain a running delayline consumes is never deleted.

use std::collections::HashSet;

use lapin::Connection;

use super::run::{on_broker, open_existing_ledger};
use super::{OperationError, OperatorSettings};
use crate::broker::{self, BrokerError, ObjectKind, Standing};
use crate::cascade::{Cascade, TopologyPlan};
use crate::ledger::Ledger;

/// What the operator asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    /// Delete; otherwise only say what would go.
    pub delete: bool,
    /// Delete even while the chain holds tasks or parked messages.
    pub drop_tasks: bool,
}

/// What `deprovision` found, and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deprovisioned {
    /// The chain's queues, then its exchanges, as the broker had them.
    pub chain: Vec<Standing>,
    /// The queues the operator named, as the broker had them.
    pub named: Vec<Standing>,
    /// Tasks on their way: by the ledger, or without one the messages in
    /// the levels and release queues.
    pub tasks: u64,
    /// Whether `tasks` is the ledger's count.
    pub by_ledger: bool,
    /// Messages in the chain's other queues.
    pub parked: u64,
    /// Whether the objects were deleted.
    pub deleted: bool,
    /// Tasks the ledger counts cancelled now (they went with the chain).
    pub cancelled: u64,
}

impl Deprovisioned {
    /// Whether deleting loses work.
    pub fn holds_work(&self) -> bool {
        self.tasks > 0 || self.parked > 0
    }
}

/// Looks at `plan` (`cascade`'s chain and ingresses; with the chain's
/// poison queue) and the `named` queues and, as `asked`, deletes them at
/// `now_ms`.
pub async fn deprovision(
    settings: &OperatorSettings,
    cascade: &Cascade,
    plan: &TopologyPlan,
    named: &[String],
    asked: Asked,
    now_ms: u64,
) -> Result<Deprovisioned, OperationError> {
    let (chain, named) = on_broker(&settings.amqp, "delayline deprovision", async |c| {
        Ok(survey(c, cascade, plan, named).await?)
    })
    .await?;
    let carriers = task_queues(cascade);
    let ledger = open_existing_ledger(settings).await?;
    let mut found = Deprovisioned {
        parked: messages_in(&chain, |name| !carriers.contains(name)),
        by_ledger: ledger.is_some(),
        chain,
        named,
        ..Deprovisioned::default()
    };
    let outcome = async {
        found.tasks = match &ledger {
            Some(ledger) => ledger.tasks_on_their_way().await?,
            None => messages_in(&found.chain, |name| carriers.contains(name)),
        };
        delete_if_asked(settings, ledger.as_ref(), &mut found, asked, now_ms).await
    }
    .await;
    if let Some(ledger) = ledger {
        ledger.close().await;
    }
    outcome.map(|()| found)
}

/// The chain's objects (its queues, then its exchanges), and the named queues.
async fn survey(
    connection: &Connection,
    cascade: &Cascade,
    plan: &TopologyPlan,
    named: &[String],
) -> Result<(Vec<Standing>, Vec<Standing>), BrokerError> {
    let queues = plan.queues.iter().map(|q| q.name.clone());
    let queues = queues.chain([cascade.poison_queue()]);
    let exchanges = plan.exchanges.iter().map(|e| e.name.clone());
    let exchanges = exchanges.chain(plan.owner.iter().map(|owner| owner.marker.clone()));
    let mut chain = broker::standing(connection, ObjectKind::Queue, queues).await?;
    chain.extend(broker::standing(connection, ObjectKind::Exchange, exchanges).await?);
    let named = broker::standing(connection, ObjectKind::Queue, named.to_vec()).await?;
    Ok((chain, named))
}

/// The queues a task waits in on its way: every shard's levels and release queue.
fn task_queues(cascade: &Cascade) -> HashSet<String> {
    (0..cascade.shards())
        .map(|shard| cascade.in_shard(shard))
        .flat_map(|shard| {
            let levels = (0..shard.levels()).map(|level| shard.level_queue(level));
            levels.chain([shard.release_queue()]).collect::<Vec<_>>()
        })
        .collect()
}

/// The messages in the queues of `objects` that `counted` names.
fn messages_in(objects: &[Standing], counted: impl Fn(&String) -> bool) -> u64 {
    objects
        .iter()
        .filter(|o| o.kind == ObjectKind::Queue && counted(&o.name))
        .map(|o| u64::from(o.messages))
        .sum()
}

/// Deletes what was found, when asked and allowed: the ledger's tasks
/// cancelled first, so that a failure half-way leaves nothing published again.
async fn delete_if_asked(
    settings: &OperatorSettings,
    ledger: Option<&Ledger>,
    found: &mut Deprovisioned,
    asked: Asked,
    now_ms: u64,
) -> Result<(), OperationError> {
    if !asked.delete {
        return Ok(());
    }
    if let Some(busy) = found.chain.iter().find(|o| o.consumers > 0) {
        return Err(OperationError::Refused(format!(
            "{} is being consumed ({} consumers): stop every delayline of this chain first",
            busy.name, busy.consumers
        )));
    }
    if found.holds_work() && !asked.drop_tasks {
        return Err(OperationError::Refused(format!(
            "the chain holds work that would be lost (tasks on their way: {}, parked \
             messages: {}). Wait until it is delivered, or give --drop-tasks to delete it \
             with the chain",
            found.tasks, found.parked
        )));
    }
    if let Some(ledger) = ledger {
        found.cancelled = ledger.cancel_every_task_on_its_way(now_ms).await?;
    }
    let objects = [&found.chain[..], &found.named[..]].concat();
    on_broker(
        &settings.amqp,
        "delayline deprovision",
        async |connection| Ok(broker::delete_objects(connection, &objects).await?),
    )
    .await?;
    found.deleted = true;
    Ok(())
}
