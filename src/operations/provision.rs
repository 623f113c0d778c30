//! `provision` and `provision --check`: the chain declared, or compared
//! with the plan without changing anything.

use super::{OperationError, on_broker};
use crate::broker::{self, CheckReport, ProvisionReport};
use crate::cascade::Cascade;
use crate::config::AmqpSettings;

/// Declares `cascade`'s plan on the broker.
pub async fn provision(
    amqp: &AmqpSettings,
    cascade: &Cascade,
) -> Result<ProvisionReport, OperationError> {
    on_broker(amqp, "delayline provision", async |connection| {
        Ok(broker::provision(connection, &cascade.plan()).await?)
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
