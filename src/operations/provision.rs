//! `provision` and `provision --check`: the chain declared, or compared
//! with the plan without changing anything.

use super::OperationError;
use super::run::on_broker;
use crate::broker::AmqpSettings;
use crate::broker::{self, CheckReport, ProvisionReport};
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

/// Every difference between the broker and `cascade`'s plan.
pub async fn check(amqp: &AmqpSettings, cascade: &Cascade) -> Result<CheckReport, OperationError> {
    on_broker(amqp, "delayline provision --check", async |connection| {
        Ok(broker::check(connection, cascade).await?)
    })
    .await
}
