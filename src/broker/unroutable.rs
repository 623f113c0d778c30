//! `requeue-unroutable`: the unroutable queue's messages back to the business
//! exchange, once the bindings they were missing exist.

use lapin::Connection;
use lapin::options::ConfirmSelectOptions;

use super::migrate::{Kind, MigrateError, MigrationReport, Mover};
use super::{Context, open_channel, queue_state};
use crate::cascade::Cascade;

/// Sends the messages in `cascade`'s unroutable queue back to the
/// business exchange with their routing keys, once the missing bindings
/// exist. Only the messages there when it starts are taken: those still
/// unroutable land there again behind them, not taken twice. Returns how
/// many were republished.
pub async fn requeue_unroutable(
    connection: &Connection,
    cascade: &Cascade,
) -> Result<u64, MigrateError> {
    let queue = cascade.unroutable_queue();
    let Some(unroutable) = queue_state(connection, &queue).await? else {
        return Ok(0);
    };
    let channel = open_channel(connection, || {
        "opening a channel to requeue unroutable messages".to_owned()
    })
    .await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .context(|| "enabling publisher confirms".to_owned())?;
    let mut mover = Mover {
        still_wanted: None,
        new: cascade,
        publish: channel,
        report: MigrationReport::default(),
    };
    let limit = u64::from(unroutable.messages);
    let requeued = mover
        .drain(connection, &queue, &Kind::Requeue, Some(limit))
        .await?;
    let _ = mover.publish.close(200, "requeued".into()).await;
    Ok(requeued)
}
