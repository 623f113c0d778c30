//! Bulk operations at work: a worker on every replica takes running
//! operations one at a time under a lease and works each in pages of
//! [`PAGE`] tasks in due order. A page's cancels are one transaction, its
//! moves are published a few at a time, then its counts and cursor are
//! written: intake and release go on between pages, and a replica that
//! dies leaves the rest to another once its lease runs out.

use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::answers::{BulkOperationError, ChangeError};
use super::bookkeeper::Bookkeeper;
use crate::bulk::{Action, Bulk, BulkRequest, Outcome, PAGE, not_changed};
use crate::ledger::{Cancel, ChangeKey, PageDone, PagedTask, Reschedule, StoredOperation};

/// How long a replica holds an operation without writing a page.
const LEASE: Duration = Duration::from_secs(30);
/// How often a worker looks for an operation.
const POLL: Duration = Duration::from_millis(200);
/// Moves published at once within a page.
const MOVES_AT_ONCE: usize = 32;

/// Works running operations until `shutdown`.
pub(super) async fn work_operations(bookkeeper: Bookkeeper, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(POLL) => {}
        }
        let now_ms = crate::clock::now_ms();
        let taken = bookkeeper
            .ledger()
            .take_operation(now_ms, now_ms + lease_ms())
            .await;
        match taken {
            Ok(Some(operation)) => {
                if let Err(error) = work(&bookkeeper, &operation, &shutdown).await {
                    warn!(%error, id = %operation.id, "a bulk operation's page failed; it is retried");
                }
            }
            Ok(None) => {}
            Err(error) => warn!(%error, "looking for bulk operations failed"),
        }
    }
}

fn lease_ms() -> u64 {
    u64::try_from(LEASE.as_millis()).unwrap_or(u64::MAX)
}

/// Works `operation` page by page to its end (or `shutdown`).
async fn work(
    bookkeeper: &Bookkeeper,
    operation: &StoredOperation,
    shutdown: &CancellationToken,
) -> Result<(), BulkOperationError> {
    let ledger = bookkeeper.ledger();
    let created_ms = u64::try_from(operation.created_at_ms).unwrap_or(0);
    let checked = serde_json::from_str::<BulkRequest>(&operation.request)
        .map_err(|e| e.to_string())
        .and_then(|request| request.validate(created_ms).map_err(|e| e.to_string()));
    let bulk = match checked {
        Ok(bulk) => bulk,
        Err(error) => {
            ledger
                .fail_operation(&operation.id, &error, crate::clock::now_ms())
                .await?;
            return Ok(());
        }
    };
    let owner = Some(operation.owner.as_str()).filter(|o| !o.is_empty());
    let mut cursor = (
        u64::try_from(operation.cursor_at_ms).unwrap_or(0),
        operation.cursor_id.clone(),
    );
    while !shutdown.is_cancelled() {
        let page = ledger
            .bulk_page(
                (cursor.0, &cursor.1),
                bulk.due_before_ms,
                (bulk.pattern.exact(), owner),
                PAGE,
            )
            .await?;
        let mut done = PageDone {
            finished: page.len() < PAGE as usize,
            cursor_at_ms: cursor.0,
            cursor_id: cursor.1.clone(),
            ..PageDone::default()
        };
        if let Some(last) = page.last() {
            (done.cursor_at_ms, done.cursor_id) = (last.deliver_at_ms, last.id.clone());
        }
        let matched: Vec<&PagedTask> = page
            .iter()
            .filter(|task| bulk.matches(&task.destination, task.state))
            .collect();
        let now = crate::clock::read();
        for outcome in apply(bookkeeper, &bulk, &operation.id, &matched, owner, &now).await? {
            done.matched += 1;
            match outcome {
                Outcome::Changed => done.changed += 1,
                Outcome::TooLate => done.too_late += 1,
                Outcome::Unchanged => done.unchanged += 1,
            }
        }
        let lease_until_ms = now.wall_ms + lease_ms();
        ledger
            .record_page(&operation.id, &done, lease_until_ms, now.wall_ms)
            .await?;
        if done.finished {
            break;
        }
        cursor = (done.cursor_at_ms, done.cursor_id);
    }
    Ok(())
}

/// The action on one page's matched tasks; an outcome for each.
async fn apply(
    bookkeeper: &Bookkeeper,
    bulk: &Bulk,
    operation_id: &str,
    tasks: &[&PagedTask],
    owner: Option<&str>,
    now: &crate::clock::Reading,
) -> Result<Vec<Outcome>, BulkOperationError> {
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    if bulk.action == Action::Cancel {
        let ids: Vec<String> = tasks.iter().map(|t| t.id.clone()).collect();
        let outcomes = bookkeeper
            .cancel(&ids, owner, now.wall_ms)
            .await
            .map_err(BulkOperationError::Unchangeable)?;
        return Ok(outcomes
            .into_iter()
            .map(|outcome| match outcome {
                Cancel::Cancelled(_) => Outcome::Changed,
                Cancel::Unchangeable(task) => not_changed(task.state),
                Cancel::AlreadyCancelled(_) | Cancel::NotFound => Outcome::Unchanged,
            })
            .collect());
    }
    let moves: Vec<_> = tasks
        .iter()
        .map(|task| move_one(bookkeeper, bulk, operation_id, task, owner, now))
        .collect();
    futures_util::stream::iter(moves)
        .buffered(MOVES_AT_ONCE)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Moves one task as the operation says; keyed by operation and task, so
/// that a page worked again replays instead of moving it twice.
async fn move_one(
    bookkeeper: &Bookkeeper,
    bulk: &Bulk,
    operation_id: &str,
    task: &PagedTask,
    owner: Option<&str>,
    now: &crate::clock::Reading,
) -> Result<Outcome, BulkOperationError> {
    // Counted from where a single move's delay counts from, so that each
    // task lands exactly where `PATCH` would put it.
    let start_ms = bookkeeper.delay_start_ms(now);
    // A shift moves the due time asked for; the move keeps the task's
    // moment in its leeway on top.
    let offset_ms = crate::task::leeway_offset_ms(&task.id, task.leeway_ms);
    let due_ms = task.deliver_at_ms.saturating_sub(offset_ms);
    let new_due_ms = bulk.new_due_ms(due_ms, start_ms);
    let delay = Duration::from_millis(new_due_ms - start_ms);
    let key = ChangeKey {
        key: format!("bulk:{operation_id}:{}", task.id),
        fingerprint: operation_id.to_owned(),
    };
    match bookkeeper
        .reschedule(&task.id, delay, Some(key), owner, now)
        .await
    {
        Ok(Reschedule::Moved(_) | Reschedule::Replay(_)) => Ok(Outcome::Changed),
        Ok(Reschedule::Unchangeable(task)) => Ok(not_changed(task.state)),
        Ok(_) | Err(ChangeError::Route(_)) => Ok(Outcome::Unchanged),
        Err(error) => Err(BulkOperationError::Unchangeable(error)),
    }
}
