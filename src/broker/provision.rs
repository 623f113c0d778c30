//! Declares the topology plan. Declarations are idempotent on the broker, so
//! running this at every start, or twice, changes nothing.

use lapin::options::{ExchangeBindOptions, QueueBindOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use serde::Serialize;
use tracing::warn;

use super::diagnose::{current_argument, diagnose_exchange, diagnose_queue};
use super::options::{durable_exchange, durable_queue, lapin_kind};
use super::{
    BrokerError, Context, TopologyConflict, field_table, open_channel, precondition_failed,
};
use crate::cascade::{BindingTarget, ExchangeSpec, QueueSpec, TopologyPlan};

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProvisionReport {
    pub exchanges: usize,
    pub queues: usize,
    pub bindings: usize,
}

/// Declares `exchange` as the plan has it: a no-op when it exists so, and
/// `Some` conflict, every difference listed, when it exists otherwise (the
/// broker has then closed `channel`).
pub(crate) async fn declare_exchange(
    connection: &Connection,
    channel: &Channel,
    exchange: &ExchangeSpec,
) -> Result<Option<TopologyConflict>, BrokerError> {
    match try_declare_exchange(channel, exchange, "exchange").await? {
        None => Ok(None),
        Some(text) => Ok(Some(diagnose_exchange(connection, exchange, text).await)),
    }
}

/// Declares `exchange` (a `what`, for the error's context); `Some` with the
/// broker's words when it exists otherwise (the broker has then closed
/// `channel`).
async fn try_declare_exchange(
    channel: &Channel,
    exchange: &ExchangeSpec,
    what: &str,
) -> Result<Option<String>, BrokerError> {
    let declared = channel
        .exchange_declare(
            exchange.name.as_str().into(),
            lapin_kind(exchange.kind),
            durable_exchange(),
            field_table(&exchange.arguments),
        )
        .await;
    match declared {
        Ok(()) => Ok(None),
        Err(error) => match precondition_failed(&error) {
            Some(text) => Ok(Some(text)),
            None => Err(BrokerError::Call {
                context: format!("declaring {what} {:?}", exchange.name),
                source: error,
            }),
        },
    }
}

/// Declares `queue` as the plan has it; a conflict as for [`declare_exchange`].
/// A queue an older delayline made with its `legacy_arguments` is taken as
/// it is, with a warning; `channel` is then a new one (the broker closed the
/// first on the mismatch).
pub(crate) async fn declare_queue(
    connection: &Connection,
    channel: &mut Channel,
    queue: &QueueSpec,
) -> Result<Option<TopologyConflict>, BrokerError> {
    let text = match try_declare_queue(channel, &queue.name, &queue.arguments).await? {
        None => return Ok(None),
        Some(text) => text,
    };
    if let Some(legacy) = &queue.legacy_arguments {
        *channel = open_channel(connection, || {
            "opening a channel to provision the topology".to_owned()
        })
        .await?;
        if try_declare_queue(channel, &queue.name, legacy)
            .await?
            .is_none()
        {
            warn!(
                queue = queue.name,
                "this queue was made by an older delayline: as a quorum queue it has \
                 RabbitMQ's default delivery limit (20 on RabbitMQ 4, which drops a message \
                 returned more often, as a consumer that crashes while holding it returns it); \
                 raise cascade.version and run `delayline migrate-topology --from <this \
                 version>` to move the chain onto queues without one"
            );
            return Ok(None);
        }
        *channel = open_channel(connection, || {
            "opening a channel to provision the topology".to_owned()
        })
        .await?;
    }
    Ok(Some(diagnose_queue(connection, queue, text).await))
}

/// Declares a durable queue: `None` when the broker took it, the broker's
/// text when it holds the queue with other settings (the channel is then closed).
async fn try_declare_queue(
    channel: &Channel,
    name: &str,
    arguments: &crate::cascade::Arguments,
) -> Result<Option<String>, BrokerError> {
    let declared = channel
        .queue_declare(name.into(), durable_queue(), field_table(arguments))
        .await;
    match declared {
        Ok(_) => Ok(None),
        Err(error) => match precondition_failed(&error) {
            Some(text) => Ok(Some(text)),
            None => Err(BrokerError::Call {
                context: format!("declaring queue {name:?}"),
                source: error,
            }),
        },
    }
}

/// Declares every exchange, queue and binding of `plan`.
///
/// When the broker already holds an object with other settings, the error
/// lists every difference, not just the first one the broker reports.
/// Refuses a chain that has a shard beyond the plan's (see
/// [`TopologyPlan::beyond_last_shard`]), before anything is declared.
async fn refuse_more_shards(
    connection: &Connection,
    plan: &TopologyPlan,
) -> Result<(), BrokerError> {
    let Some(queue) = &plan.beyond_last_shard else {
        return Ok(());
    };
    if super::inspect::queue_state(connection, queue)
        .await?
        .is_some()
    {
        return Err(BrokerError::MoreShards {
            queue: queue.clone(),
            shards: plan.shards,
        });
    }
    Ok(())
}

pub async fn provision(
    connection: &Connection,
    plan: &TopologyPlan,
) -> Result<ProvisionReport, BrokerError> {
    let mut channel = open_channel(connection, || {
        "opening a channel to provision the topology".to_owned()
    })
    .await?;
    // First: an instance refused the chain declares nothing of it.
    claim_chain(&channel, plan).await?;
    refuse_more_shards(connection, plan).await?;
    for exchange in &plan.exchanges {
        if let Some(conflict) = declare_exchange(connection, &channel, exchange).await? {
            return Err(conflict.into());
        }
    }
    for queue in &plan.queues {
        if let Some(conflict) = declare_queue(connection, &mut channel, queue).await? {
            return Err(conflict.into());
        }
    }
    for binding in &plan.bindings {
        let bound = match &binding.target {
            BindingTarget::Queue(queue) => {
                channel
                    .queue_bind(
                        queue.as_str().into(),
                        binding.source.as_str().into(),
                        binding.routing_key.as_str().into(),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await
            }
            BindingTarget::Exchange(exchange) => {
                channel
                    .exchange_bind(
                        exchange.as_str().into(),
                        binding.source.as_str().into(),
                        binding.routing_key.as_str().into(),
                        ExchangeBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await
            }
        };
        bound.context(|| {
            format!(
                "binding {:?} to {:?} with {:?}",
                binding.source, binding.target, binding.routing_key
            )
        })?;
    }
    // Closing is a courtesy; the declarations are already done.
    let _ = channel.close(200, "provisioned".into()).await;
    Ok(ProvisionReport {
        exchanges: plan.exchanges.len(),
        queues: plan.queues.len(),
        bindings: plan.bindings.len(),
    })
}

/// Records on the broker that the chain belongs to the plan's ledger, or
/// finds that it belongs to another (see [`crate::cascade::ChainOwner`]).
async fn claim_chain(channel: &Channel, plan: &TopologyPlan) -> Result<(), BrokerError> {
    let Some(owner) = &plan.owner else {
        return Ok(());
    };
    let Some(marker) = owner.marker_exchange() else {
        return Ok(());
    };
    match try_declare_exchange(channel, &marker, "the chain's ledger marker").await? {
        None => Ok(()),
        Some(text) => Err(BrokerError::AnotherLedger {
            marker: marker.name.clone(),
            ours: owner.ledger.clone().unwrap_or_default(),
            theirs: current_argument(&text).unwrap_or(text),
        }),
    }
}

/// Deletes every queue and exchange of `plan`, with the messages they hold.
/// Objects already gone are skipped. For tests, benchmarks and retired chains.
pub async fn teardown(connection: &Connection, plan: &TopologyPlan) -> Result<(), BrokerError> {
    for queue in &plan.queues {
        // A delete of a missing queue closes the channel on some versions: one channel each.
        let channel = open_channel(connection, || {
            "opening a channel to provision the topology".to_owned()
        })
        .await?;
        let _ = channel
            .queue_delete(queue.name.as_str().into(), Default::default())
            .await;
    }
    let marker = plan.owner.iter().map(|owner| owner.marker.as_str());
    for exchange in plan.exchanges.iter().map(|e| e.name.as_str()).chain(marker) {
        let channel = open_channel(connection, || {
            "opening a channel to provision the topology".to_owned()
        })
        .await?;
        let _ = channel
            .exchange_delete(exchange.into(), Default::default())
            .await;
    }
    Ok(())
}
