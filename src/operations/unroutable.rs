//! `requeue-unroutable`: the unroutable queue's messages back to the
//! business exchange, once their destinations are bound.

use super::{OperationError, on_broker, open_ledger};
use crate::broker::{self, queue_state};
use crate::cascade::Cascade;
use crate::config::Settings;

/// What a requeue did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requeued {
    /// Unroutable tasks the ledger counts as delivered again.
    pub counted_delivered: u64,
    /// Messages republished to the business exchange.
    pub republished: u64,
    /// Still in the unroutable queue, as the broker counts them now.
    pub still_unroutable: u32,
}

pub async fn requeue_unroutable(
    settings: &Settings,
    cascade: &Cascade,
) -> Result<Requeued, OperationError> {
    // Counted delivered before they go: a copy unroutable again then marks
    // its task `unroutable` once more, after this commit.
    let mut counted_delivered = 0;
    if cascade.release_stage()
        && let Some(ledger) = open_ledger(settings).await?
    {
        let counted = ledger.requeue_unroutable().await;
        ledger.close().await;
        counted_delivered = counted?;
    }
    let (republished, still_unroutable) = on_broker(
        &settings.amqp,
        "delayline requeue-unroutable",
        async |connection| {
            let requeued = broker::requeue_unroutable(connection, cascade).await?;
            let left = queue_state(connection, &cascade.unroutable_queue()).await?;
            Ok((requeued, left.map_or(0, |q| q.messages)))
        },
    )
    .await?;
    Ok(Requeued {
        counted_delivered,
        republished,
        still_unroutable,
    })
}
