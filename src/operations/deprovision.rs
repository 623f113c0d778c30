//! `deprovision`: what delayline declared for the configured chain (its
//! prefix and version), with the queues an operator names, looked at and,
//! when asked, deleted.
//!
//! Nothing is deleted while deleting would lose something the operator has
//! not named (each [`Blocker`] has the flag that names it):
//! - the chain's tasks on their way (by the ledger, which knows them;
//!   without one, the messages in the levels and release queues, where no
//!   probe goes; a ledger never made is not made now) and the messages held
//!   in its other queues (unroutable, poison, an ingress's or the retries'
//!   intake and refused queues): `--drop-tasks`. Dropped tasks are
//!   cancelled in the ledger before anything is deleted, so that no replica
//!   publishes them again into the next chain;
//! - a named queue's messages (`--drop-messages`) or its consumers
//!   (`--drop-consumers`): a named queue is the user's, and RabbitMQ deletes
//!   a queue with whatever it holds and whoever reads it;
//! - the retry exchange and intake while `[[retry]]` policies are
//!   configured (`--drop-retries`): RabbitMQ drops without a word what a
//!   queue dead-letters into a missing exchange, so every queue wired to
//!   it would lose what its consumers reject.
//!
//! A chain a running delayline consumes is never deleted.

use std::collections::HashSet;

use lapin::Connection;

use super::run::{on_broker, open_existing_ledger};
use super::{OperationError, OperatorSettings};
use crate::broker::{self, BrokerError, ObjectKind, Standing};
use crate::cascade::{Cascade, TopologyPlan};
use crate::ingress::Retries;
use crate::ledger::Ledger;

/// What the operator asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    /// Delete; otherwise only say what would go.
    pub delete: bool,
    /// Delete even while the chain holds tasks or messages.
    pub drop_tasks: bool,
    /// Delete named queues that hold messages.
    pub drop_messages: bool,
    /// Delete named queues that consumers read.
    pub drop_consumers: bool,
    /// Delete the retry exchange and intake while retry policies are configured.
    pub drop_retries: bool,
}

/// What stands in the way of deleting, and the flag that accepts the loss.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// A delayline consumes this queue of the chain: no flag deletes it.
    Consumed { queue: String, consumers: u32 },
    /// The chain holds tasks on their way, or messages in its other queues.
    HoldsWork { tasks: u64, held: u64 },
    /// A named queue holds messages.
    NamedMessages { queue: String, messages: u32 },
    /// Consumers read a named queue.
    NamedConsumers { queue: String, consumers: u32 },
    /// Retry policies are configured and their exchange or intake is present.
    RetriesConfigured { exchange: String, policies: usize },
}

impl Blocker {
    /// The flag that deletes anyway, if any does.
    pub fn flag(&self) -> Option<&'static str> {
        match self {
            Blocker::Consumed { .. } => None,
            Blocker::HoldsWork { .. } => Some("--drop-tasks"),
            Blocker::NamedMessages { .. } => Some("--drop-messages"),
            Blocker::NamedConsumers { .. } => Some("--drop-consumers"),
            Blocker::RetriesConfigured { .. } => Some("--drop-retries"),
        }
    }

    /// Whether `asked` accepts this loss.
    fn waived_by(&self, asked: Asked) -> bool {
        match self {
            Blocker::Consumed { .. } => false,
            Blocker::HoldsWork { .. } => asked.drop_tasks,
            Blocker::NamedMessages { .. } => asked.drop_messages,
            Blocker::NamedConsumers { .. } => asked.drop_consumers,
            Blocker::RetriesConfigured { .. } => asked.drop_retries,
        }
    }
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocker::Consumed { queue, consumers } => write!(
                f,
                "{queue} is being consumed ({consumers} consumers): stop every delayline of \
                 this chain first"
            ),
            Blocker::HoldsWork { tasks, held } => write!(
                f,
                "the chain holds work that would be lost (tasks on their way: {tasks}, \
                 messages in its other queues: {held})"
            ),
            Blocker::NamedMessages { queue, messages } => write!(
                f,
                "queue {queue} holds {messages} messages, which would be lost"
            ),
            Blocker::NamedConsumers { queue, consumers } => write!(
                f,
                "queue {queue} has {consumers} consumers, whose queue would be gone"
            ),
            Blocker::RetriesConfigured { exchange, policies } => write!(
                f,
                "{policies} retry policies are in force (configured, or set over the API): \
                 every queue that dead-letters to {exchange} would lose what its consumers reject (RabbitMQ drops a \
                 dead-letter into a missing exchange silently) until delayline declares it again"
            ),
        }
    }
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
    /// Messages in the chain's other queues (unroutable, poison, intakes,
    /// refused): not tasks, and not the ledger's parked retries.
    pub held: u64,
    /// Everything that stands in the way of deleting.
    pub blockers: Vec<Blocker>,
    /// The first blocker the operator did not waive, when asked to delete.
    pub refused: Option<Blocker>,
    /// Whether the objects were deleted.
    pub deleted: bool,
    /// Tasks the ledger counts cancelled now (they went with the chain).
    pub cancelled: u64,
}

impl Deprovisioned {
    /// The flags that would delete what was found, in the order of the blockers.
    pub fn flags_needed(&self) -> Vec<&'static str> {
        let mut flags: Vec<&'static str> = Vec::new();
        for flag in self.blockers.iter().filter_map(Blocker::flag) {
            if !flags.contains(&flag) {
                flags.push(flag);
            }
        }
        flags
    }
}

/// Looks at `plan` (`cascade`'s chain, ingresses and `retries`; with the
/// chain's poison queue) and the `named` queues and, as `asked`, deletes
/// them at `now_ms`.
pub async fn deprovision(
    settings: &OperatorSettings,
    cascade: &Cascade,
    plan: &TopologyPlan,
    retries: Option<&Retries>,
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
        held: messages_in(&chain, |name| !carriers.contains(name)),
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
        found.blockers = blockers(&found, retries);
        found.refused = match asked.delete {
            true => found.blockers.iter().find(|b| !b.waived_by(asked)).cloned(),
            false => None,
        };
        if asked.delete && found.refused.is_none() {
            delete(settings, ledger.as_ref(), &mut found, now_ms).await?;
        }
        Ok::<(), OperationError>(())
    }
    .await;
    if let Some(ledger) = ledger {
        ledger.close().await;
    }
    outcome.map(|()| found)
}

/// Everything that deleting what was `found` would lose, or break.
pub fn blockers(found: &Deprovisioned, retries: Option<&Retries>) -> Vec<Blocker> {
    let mut blockers: Vec<Blocker> = found
        .chain
        .iter()
        .filter(|o| o.consumers > 0)
        .map(|o| Blocker::Consumed {
            queue: o.name.clone(),
            consumers: o.consumers,
        })
        .collect();
    if found.tasks > 0 || found.held > 0 {
        blockers.push(Blocker::HoldsWork {
            tasks: found.tasks,
            held: found.held,
        });
    }
    for queue in found.named.iter().filter(|q| q.exists) {
        if queue.messages > 0 {
            blockers.push(Blocker::NamedMessages {
                queue: queue.name.clone(),
                messages: queue.messages,
            });
        }
        if queue.consumers > 0 {
            blockers.push(Blocker::NamedConsumers {
                queue: queue.name.clone(),
                consumers: queue.consumers,
            });
        }
    }
    if let Some(retries) = retries.filter(|r| !r.policies.is_empty()) {
        let ours = [&retries.exchange, &retries.queue];
        if found
            .chain
            .iter()
            .any(|o| o.exists && ours.contains(&&o.name))
        {
            blockers.push(Blocker::RetriesConfigured {
                exchange: retries.exchange.clone(),
                policies: retries.policies.len(),
            });
        }
    }
    blockers
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

/// Deletes what was found: the ledger's tasks cancelled first, so that a
/// failure half-way leaves nothing published again.
async fn delete(
    settings: &OperatorSettings,
    ledger: Option<&Ledger>,
    found: &mut Deprovisioned,
    now_ms: u64,
) -> Result<(), OperationError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(name: &str, messages: u32, consumers: u32) -> Standing {
        Standing {
            name: name.into(),
            kind: ObjectKind::Queue,
            exists: true,
            messages,
            consumers,
        }
    }

    fn retries(policies: usize) -> Retries {
        Retries {
            policies: (0..policies)
                .map(|i| crate::ingress::RetryPolicy {
                    name: format!("p{i}"),
                    queues: vec![format!("q{i}")],
                    initial_ms: 1000,
                    multiplier: 2.0,
                    max_delay_ms: 10_000,
                    jitter: 0.0,
                    max_attempts: 3,
                    park_to: None,
                    max_lateness_ms: None,
                    give_up_after_ms: None,
                })
                .collect(),
            exchange: "d.retry".into(),
            queue: "d.retry.intake".into(),
            refused_queue: "d.retry.refused".into(),
        }
    }

    #[test]
    fn a_named_queue_in_use_is_a_blocker_for_each_loss_and_an_empty_idle_one_none() {
        let found = Deprovisioned {
            named: vec![
                queue("full", 3, 0),
                queue("read", 0, 1),
                queue("idle", 0, 0),
            ],
            ..Deprovisioned::default()
        };
        let found = Deprovisioned {
            blockers: blockers(&found, None),
            ..found
        };
        assert_eq!(
            found.blockers,
            [
                Blocker::NamedMessages {
                    queue: "full".into(),
                    messages: 3
                },
                Blocker::NamedConsumers {
                    queue: "read".into(),
                    consumers: 1
                },
            ]
        );
        assert_eq!(
            found.flags_needed(),
            ["--drop-messages", "--drop-consumers"]
        );
        let only_messages = Asked {
            delete: true,
            drop_messages: true,
            ..Asked::default()
        };
        let left: Vec<_> = found
            .blockers
            .iter()
            .filter(|b| !b.waived_by(only_messages))
            .collect();
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(left[0].to_string().contains("1 consumers"), "{}", left[0]);
    }

    #[test]
    fn the_retry_objects_block_while_policies_are_configured_and_present() {
        let present = Deprovisioned {
            chain: vec![queue("d.retry.intake", 0, 0)],
            ..Deprovisioned::default()
        };
        let blocked = blockers(&present, Some(&retries(2)));
        assert_eq!(blocked.len(), 1);
        assert_eq!(blocked[0].flag(), Some("--drop-retries"));
        assert!(blocked[0].to_string().contains("d.retry"), "{}", blocked[0]);
        assert!(blockers(&present, Some(&retries(0))).is_empty());
        assert!(blockers(&present, None).is_empty());
        let absent = Deprovisioned {
            chain: vec![Standing {
                exists: false,
                ..queue("d.retry.intake", 0, 0)
            }],
            ..Deprovisioned::default()
        };
        assert!(blockers(&absent, Some(&retries(2))).is_empty());
    }

    #[test]
    fn a_consumed_chain_has_no_flag_and_work_needs_drop_tasks() {
        let found = Deprovisioned {
            chain: vec![queue("d.release", 0, 2)],
            tasks: 1,
            ..Deprovisioned::default()
        };
        let blocked = blockers(&found, None);
        assert_eq!(blocked[0].flag(), None);
        assert_eq!(blocked[1].flag(), Some("--drop-tasks"));
        let everything = Asked {
            delete: true,
            drop_tasks: true,
            drop_messages: true,
            drop_consumers: true,
            drop_retries: true,
        };
        assert!(!blocked[0].waived_by(everything));
    }
}
