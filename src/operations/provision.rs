//! `provision` and `provision --check`: the chain declared, or compared
//! with the plan without changing anything.

use super::run::on_broker;
use super::{OperationError, OperatorSettings};
use crate::broker::AmqpSettings;
use crate::broker::{self, CheckReport, ManagementApi, ProvisionReport};
use crate::cascade::{Cascade, TopologyPlan};

/// Declares `plan` (a chain's, with its ingresses) on the broker.
pub async fn provision(
    amqp: &AmqpSettings,
    plan: &TopologyPlan,
) -> Result<ProvisionReport, OperationError> {
    on_broker(amqp, "delayline provision", async |connection| {
        Ok(broker::provision(connection, plan).await?)
    })
    .await
}

/// Every difference between the broker and `plan` (`cascade`'s, with its
/// ingresses), and where the management API answers, the node leading each
/// of the chain's queues.
pub async fn check(
    settings: &OperatorSettings,
    cascade: &Cascade,
    plan: &TopologyPlan,
) -> Result<CheckReport, OperationError> {
    let amqp = &settings.amqp;
    let mut report = on_broker(amqp, "delayline provision --check", async |connection| {
        Ok(broker::check(connection, cascade, plan).await?)
    })
    .await?;
    report.leaders = leaders(settings, cascade).await;
    Ok(report)
}

/// The node leading each queue of `cascade`'s chain, as the management API
/// says; `Err` says why it is not known (AMQP cannot tell).
async fn leaders(
    settings: &OperatorSettings,
    cascade: &Cascade,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let uri = settings.amqp.uris().first().cloned().unwrap_or_default();
    let api = ManagementApi::new(&uri, settings.management_url.expose())
        .map_err(|error| error.to_string())?
        .ok_or("metrics.management_url is \"none\"")?;
    let chain = format!("{}.v{}.", cascade.prefix(), cascade.version()).replace('.', "\\.");
    let queues = api
        .queues(&format!("^{chain}"))
        .await
        .map_err(|error| error.to_string())?;
    Ok(queues
        .iter()
        .filter_map(|q| Some((q.name.clone(), q.leader_node()?.to_owned())))
        .collect())
}
