//! `requeue-unroutable`: the unroutable queue's messages back to the
//! business exchange, once their destinations are bound.

use super::run::{on_broker, open_ledger};
use super::{OperationError, OperatorSettings};
use crate::broker::AmqpSettings;
use crate::broker::{self, queue_state};
use crate::cascade::Cascade;
use crate::ledger::Ledger;

/// What a requeue did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Requeued {
    /// Unroutable tasks the ledger counts as delivered again.
    pub counted_delivered: u64,
    /// Messages republished to the business exchange.
    pub republished: u64,
    /// Still in the unroutable queue, as the broker counts them now.
    pub still_unroutable: u32,
}

/// The CLI's `requeue-unroutable`, at `now_ms`: with the ledger of `settings`.
pub async fn requeue_unroutable(
    settings: &OperatorSettings,
    cascade: &Cascade,
    now_ms: u64,
) -> Result<Requeued, OperationError> {
    let ledger = match cascade.release_stage() {
        true => open_ledger(settings).await?,
        false => None,
    };
    let done = requeue(ledger.as_ref(), &settings.amqp, cascade, now_ms).await;
    if let Some(ledger) = ledger {
        ledger.close().await;
    }
    done
}

/// Requeues with `ledger` (the service's own, from the API, or the CLI's):
/// one code path for both. The tasks count as delivered at `now_ms`.
pub async fn requeue(
    ledger: Option<&Ledger>,
    amqp: &AmqpSettings,
    cascade: &Cascade,
    now_ms: u64,
) -> Result<Requeued, OperationError> {
    // Counted delivered before they go: a copy unroutable again then marks
    // its task `unroutable` once more, after this commit.
    let mut counted_delivered = 0;
    if cascade.release_stage()
        && let Some(ledger) = ledger
    {
        counted_delivered = ledger.requeue_unroutable(now_ms).await?;
    }
    let (republished, still_unroutable) =
        on_broker(amqp, "delayline requeue-unroutable", async |connection| {
            let requeued = broker::requeue_unroutable(connection, cascade).await?;
            let left = queue_state(connection, &cascade.unroutable_queue()).await?;
            Ok((requeued, left.map_or(0, |q| q.messages)))
        })
        .await?;
    Ok(Requeued {
        counted_delivered,
        republished,
        still_unroutable,
    })
}
