//! A user's changes to a waiting task: cancel it, or move it to another
//! time.
//!
//! Each decision between a user's change and the release of the same task is
//! one atomic update of its row, conditioned on the state it comes from: a
//! cancel or a move succeeds only from `pending`, `scheduled` or `waiting`, a release
//! only from a state that is neither `cancelled` nor `delivered`, and only
//! for the revision the message carries ([`super::claim`]). Whichever commits
//! first wins; the other finds the row changed. That is what makes a `200`
//! to a cancel a promise that the task is never delivered. Cancels and moves
//! run here, as transactions of their own.

use std::collections::{HashMap, HashSet};

use super::error::{LedgerError, QueryContext};
use super::handle::Ledger;
use super::record::{COLUMNS, Row, StoredTask, db_ms};
use super::sql::{self, statement_sized_chunks};
use crate::task::TaskState;

/// What a cancel found.
#[derive(Clone, Debug, PartialEq)]
pub enum Cancel {
    /// Cancelled now: it will never be delivered.
    Cancelled(StoredTask),
    /// Cancelled before (a repeated cancel changes nothing).
    AlreadyCancelled(StoredTask),
    /// Released, delivered or failed: too late to cancel.
    Unchangeable(StoredTask),
    NotFound,
}

/// A task's new due time, as a reschedule sets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub deliver_at_ms: u64,
    pub delay_ms: u64,
    pub routing_key: String,
    /// The new copy is leased to the request that publishes it until then.
    pub lease_until_ms: u64,
    /// Its deadline, moved with it ([`crate::task::deadline::moved`]).
    pub deadline_ms: Option<u64>,
}

/// A reschedule request's idempotency: its key and the request's fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeKey {
    pub key: String,
    pub fingerprint: String,
}

/// What a reschedule found.
#[derive(Clone, Debug, PartialEq)]
pub enum Reschedule {
    /// A new revision, pending and leased to the caller, who publishes it.
    Moved(StoredTask),
    /// This change was made before under the same key: nothing new.
    Replay(StoredTask),
    /// The key was used for another change (of `task_id`).
    Conflict {
        task_id: String,
    },
    /// Released, delivered, cancelled or failed: it cannot move any more.
    Unchangeable(StoredTask),
    /// The ledger keeps only part of its payload (it was published before
    /// the release stage kept payloads until delivery): no new copy can be made.
    PayloadNotKept(StoredTask),
    NotFound,
}

/// The task `$id` as the transaction `$tx` sees it, decoded.
macro_rules! read_task {
    ($tx:expr, $id:expr) => {{
        let sql = sql::select(1);
        let row: Option<Row> = sqlx::query_as(&sql)
            .bind($id)
            .fetch_optional(&mut *$tx)
            .await
            .context("reading a task")?;
        row.map(Row::decode).transpose()?
    }};
}

impl Ledger {
    /// Cancels each of `ids` that is pending or scheduled, in one
    /// transaction; the outcomes follow the order of `ids`. With `owner`,
    /// only that client's tasks are found.
    pub async fn cancel(
        &self,
        ids: &[String],
        owner: Option<&str>,
        now_ms: u64,
    ) -> Result<Vec<Cancel>, LedgerError> {
        let unique: Vec<&str> = {
            let mut seen = HashSet::new();
            ids.iter()
                .map(String::as_str)
                .filter(|id| seen.insert(*id))
                .collect()
        };
        let mut found: HashMap<String, Cancel> = HashMap::with_capacity(unique.len());
        let mut was_pending = 0u64;
        in_tx!(&self.pool, tx => {
            for from in TaskState::CHANGEABLE {
                let open = undecided(&unique, |id| found.contains_key(id));
                for chunk in statement_sized_chunks(&open) {
                    let sql = sql::cancel(chunk.len(), owner.is_some());
                    let mut query = sqlx::query_as::<_, Row>(&sql)
                        .bind(db_ms(now_ms))
                        .bind(from.as_str());
                    if let Some(owner) = owner {
                        query = query.bind(owner);
                    }
                    for id in chunk {
                        query = query.bind(*id);
                    }
                    let rows = query.fetch_all(&mut *tx).await.context("cancelling tasks")?;
                    if from == TaskState::Pending {
                        was_pending += rows.len() as u64;
                    }
                    for row in rows {
                        let task = row.decode()?;
                        found.insert(task.id.clone(), Cancel::Cancelled(task));
                    }
                }
            }
            let rest = undecided(&unique, |id| found.contains_key(id));
            for chunk in statement_sized_chunks(&rest) {
                let sql = sql::select(chunk.len());
                let mut query = sqlx::query_as::<_, Row>(&sql);
                for id in chunk {
                    query = query.bind(*id);
                }
                for row in query.fetch_all(&mut *tx).await.context("reading tasks")? {
                    let task = row.decode()?;
                    if !task.within_scope(owner) {
                        continue;
                    }
                    let id = task.id.clone();
                    let outcome = match task.state {
                        TaskState::Cancelled => Cancel::AlreadyCancelled(task),
                        _ => Cancel::Unchangeable(task),
                    };
                    found.insert(id, outcome);
                }
            }
        });
        self.pending.remove(was_pending);
        Ok(ids
            .iter()
            .map(|id| found.get(id).cloned().unwrap_or(Cancel::NotFound))
            .collect())
    }

    /// Cancels every task on its way (pending, scheduled, waiting,
    /// releasing) at `now_ms`, in one transaction: the chain that held them
    /// is being deleted with them (`delayline deprovision --drop-tasks`),
    /// and a ledger that still had them would publish them again into the
    /// next chain. Returns how many.
    pub async fn cancel_every_task_on_its_way(&self, now_ms: u64) -> Result<u64, LedgerError> {
        let mut cancelled = 0;
        let mut was_pending = 0;
        in_tx!(&self.pool, tx => {
            let states = [
                TaskState::Pending,
                TaskState::Scheduled,
                TaskState::Waiting,
                TaskState::Staged,
                TaskState::Releasing,
            ];
            for from in states {
                let done = sqlx::query(sql::CANCEL_IN_STATE)
                    .bind(db_ms(now_ms))
                    .bind(from.as_str())
                    .execute(&mut *tx)
                    .await
                    .context("cancelling every task on its way")?;
                cancelled += done.rows_affected();
                if from == TaskState::Pending {
                    was_pending = done.rows_affected();
                }
            }
        });
        self.pending.remove(was_pending);
        Ok(cancelled)
    }

    /// Moves a pending or scheduled task to a new due time as a new
    /// revision, pending and leased to the caller, who publishes the new
    /// copy; the release stage drops the old one. With `key`, a repeat of
    /// the same change is a replay and another change under it a conflict.
    /// With `owner`, only that client's task is found.
    pub async fn reschedule(
        &self,
        id: &str,
        change: &Move,
        key: Option<&ChangeKey>,
        owner: Option<&str>,
        now_ms: u64,
    ) -> Result<Reschedule, LedgerError> {
        let holder = self.holder;
        // An early return leaves the transaction uncommitted: rolled back.
        let moved: StoredTask = in_tx!(&self.pool, tx => {
            if let Some(key) = key {
                let recorded: Option<String> = sqlx::query_scalar(sql::RECORD_CHANGE)
                    .bind(&key.key)
                    .bind(id)
                    .bind(&key.fingerprint)
                    .bind(db_ms(now_ms))
                    .fetch_optional(&mut *tx)
                    .await
                    .context("recording a change's idempotency key")?;
                if recorded.is_none() {
                    let (task_id, fingerprint): (String, String) = sqlx::query_as(sql::FIND_CHANGE)
                        .bind(&key.key)
                        .fetch_one(&mut *tx)
                        .await
                        .context("looking up a change's idempotency key")?;
                    if task_id != id || fingerprint != key.fingerprint {
                        return Ok(Reschedule::Conflict { task_id });
                    }
                    return Ok(match read_task!(tx, id) {
                        Some(task) if task.within_scope(owner) => Reschedule::Replay(task),
                        _ => Reschedule::NotFound,
                    });
                }
            }
            let sql = format!("{} RETURNING {COLUMNS}", sql::MOVE);
            let mut moved = None;
            for from in TaskState::CHANGEABLE {
                let row: Option<Row> = sqlx::query_as(&sql)
                    .bind(db_ms(change.deliver_at_ms))
                    .bind(db_ms(change.delay_ms))
                    .bind(&change.routing_key)
                    .bind(db_ms(change.lease_until_ms))
                    .bind(id)
                    .bind(from.as_str())
                    .bind(owner)
                    .bind(holder)
                    .bind(change.deadline_ms.map(db_ms))
                    .fetch_optional(&mut *tx)
                    .await
                    .context("moving a task")?;
                if let Some(row) = row {
                    moved = Some((from, row.decode()?));
                    break;
                }
            }
            let Some((from, task)) = moved else {
                return Ok(match read_task!(tx, id) {
                    None => Reschedule::NotFound,
                    Some(task) if !task.within_scope(owner) => Reschedule::NotFound,
                    Some(task) if task.state.is_changeable() => Reschedule::PayloadNotKept(task),
                    Some(task) => Reschedule::Unchangeable(task),
                });
            };
            if from != TaskState::Pending {
                // Committed below: the count may run ahead by one for a moment.
                self.pending.add(1);
            }
            task
        });
        Ok(Reschedule::Moved(moved))
    }
}

/// The ids of `ids` not yet `decided`, in order.
fn undecided<'a>(ids: &[&'a str], decided: impl Fn(&str) -> bool) -> Vec<&'a str> {
    ids.iter().copied().filter(|id| !decided(id)).collect()
}
