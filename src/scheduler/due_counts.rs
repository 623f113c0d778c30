//! The upkeep of the ledger's per-minute counts of what falls due, and of
//! the gauges read from the ledger. On PostgreSQL the counts' changes are
//! appended by the transactions that change tasks and folded in here, every
//! [`FOLD_EVERY`] (a forecast reads the unfolded ones too, so folding late
//! only makes it a little slower); the due-soon and parked gauges are read
//! every [`GAUGES_EVERY`], from the ledger every replica shares, so that
//! each replica's scrape says what the ledger holds, not what it did.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::forecast::{MINUTE_MS, Window, tally};
use crate::ledger::Ledger;
use crate::metrics::Metrics;

pub(super) const FOLD_EVERY: Duration = Duration::from_secs(1);
pub(super) const GAUGES_EVERY: Duration = Duration::from_secs(5);

/// Folds the counts' changes and sets the due-soon gauges until `shutdown`.
pub(super) async fn keep_counts(
    ledger: Ledger,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut fold = tokio::time::interval(FOLD_EVERY);
    let mut gauges = tokio::time::interval(GAUGES_EVERY);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = fold.tick() => {
                if let Err(error) = ledger.fold_due_changes(crate::clock::now_ms()).await {
                    warn!(%error, "folding the forecast's counts failed");
                }
            }
            _ = gauges.tick() => {
                if let Err(error) = set_due_soon(&ledger, &metrics, crate::clock::now_ms()).await {
                    warn!(%error, "reading what falls due failed");
                }
                match ledger.parked_per_queue().await {
                    Ok(queues) => metrics.set_parked(queues.into_iter().map(|q| (q.queue, q.parked))),
                    Err(error) => warn!(%error, "counting parked messages failed"),
                }
            }
        }
    }
}

/// The gauges count whole minutes: the one now running, and the next 59.
async fn set_due_soon(
    ledger: &Ledger,
    metrics: &Metrics,
    now_ms: u64,
) -> Result<(), crate::ledger::LedgerError> {
    let from_ms = now_ms - now_ms % MINUTE_MS;
    let hour = Window {
        from_ms,
        to_ms: from_ms + 60 * MINUTE_MS,
        bucket_ms: MINUTE_MS,
    };
    let counts = tally(
        &hour,
        ledger.due_per_minute(hour.from_ms, hour.to_ms).await?,
    );
    let first = counts.buckets.first().copied().unwrap_or(0);
    metrics
        .tasks_due_next_minute
        .set(i64::try_from(first).unwrap_or(i64::MAX));
    metrics
        .tasks_due_next_hour
        .set(i64::try_from(counts.total).unwrap_or(i64::MAX));
    Ok(())
}
