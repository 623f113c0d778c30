//! What happens to a task after it was accepted: cancelled, moved to another
//! time, or taken by the release stage when due.
//!
//! Each decision between a user's change and the release of the same task is
//! one atomic update of its row, conditioned on the state it comes from: a
//! cancel or a move succeeds only from `pending` or `scheduled`, a release
//! only from a state that is neither `cancelled` nor `delivered`, and only
//! for the revision the message carries. Whichever commits first wins; the
//! other finds the row changed. That is what makes a `200` to a cancel a
//! promise that the task is never delivered. Cancels and moves run here, as
//! statements of their own; release claims run in the writer's group
//! commit (`writer::claim`), with the same conditions.

use std::collections::{HashMap, HashSet};

use super::record::{COLUMNS, Row, StoredTask};
use super::writer::sql::placeholders;
use super::writer::statement_sized_chunks;
use super::{Ledger, LedgerError, Pool, QueryContext, db_ms};
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

/// What the ledger says of a message that reached the release stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finding {
    /// The task was due in this revision and is now `releasing`: deliver it.
    Claimed,
    /// The ledger does not know the task (pruned, or another ledger's).
    Absent,
    /// The task is known, but in this state and revision: not claimed.
    Found { state: TaskState, revision: u64 },
}

/// A transaction on either backend's pool.
macro_rules! in_tx {
    ($pool:expr, $t:ident => $body:expr) => {
        match $pool {
            Pool::Sqlite(p) => {
                let mut $t = p.begin().await.context("starting a transaction")?;
                let value = $body;
                $t.commit().await.context("committing")?;
                value
            }
            Pool::Postgres(p) => {
                let mut $t = p.begin().await.context("starting a transaction")?;
                let value = $body;
                $t.commit().await.context("committing")?;
                value
            }
        }
    };
}

/// With `scoped`, only the tasks of the client `$3` are touched.
fn cancel_sql(ids: usize, scoped: bool) -> String {
    let (owner, first_id) = if scoped {
        (" AND client = $3", 4)
    } else {
        ("", 3)
    };
    format!(
        "UPDATE tasks SET state = 'cancelled', cancelled_at_ms = $1 \
         WHERE state = $2{owner} AND id IN ({}) RETURNING {COLUMNS}",
        placeholders(first_id, ids)
    )
}

fn select_sql(ids: usize) -> String {
    format!(
        "SELECT {COLUMNS} FROM tasks WHERE id IN ({})",
        placeholders(1, ids)
    )
}

/// A new revision, pending and leased, only from `$6` and only while the
/// whole payload is kept (the new copy is built from it).
const MOVE: &str = "UPDATE tasks SET revision = revision + 1, deliver_at_ms = $1, delay_ms = $2, \
     routing_key = $3, next_attempt_at_ms = $4, state = 'pending', attempts = attempts + 1, \
     last_error = NULL, published_at_ms = NULL, publish_alone = 0, refusals = 0 \
     WHERE id = $5 AND state = $6 AND payload IS NOT NULL AND length(payload) = payload_bytes \
     AND ($7 IS NULL OR client = $7)";

const RECORD_CHANGE: &str = "INSERT INTO task_changes (idempotency_key, task_id, fingerprint, \
     created_at_ms) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING idempotency_key";

const FIND_CHANGE: &str =
    "SELECT task_id, fingerprint FROM task_changes WHERE idempotency_key = $1";

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
            for from in [TaskState::Pending, TaskState::Scheduled] {
                let open = undecided(&unique, |id| found.contains_key(id));
                for chunk in statement_sized_chunks(&open) {
                    let sql = cancel_sql(chunk.len(), owner.is_some());
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
                let sql = select_sql(chunk.len());
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
        // An early return leaves the transaction uncommitted: rolled back.
        let moved: StoredTask = in_tx!(&self.pool, tx => {
            if let Some(key) = key {
                let recorded: Option<String> = sqlx::query_scalar(RECORD_CHANGE)
                    .bind(&key.key)
                    .bind(id)
                    .bind(&key.fingerprint)
                    .bind(db_ms(now_ms))
                    .fetch_optional(&mut *tx)
                    .await
                    .context("recording a change's idempotency key")?;
                if recorded.is_none() {
                    let (task_id, fingerprint): (String, String) = sqlx::query_as(FIND_CHANGE)
                        .bind(&key.key)
                        .fetch_one(&mut *tx)
                        .await
                        .context("looking up a change's idempotency key")?;
                    if task_id != id || fingerprint != key.fingerprint {
                        return Ok(Reschedule::Conflict { task_id });
                    }
                    let sql = select_sql(1);
                    let row: Option<Row> = sqlx::query_as(&sql)
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await
                        .context("reading a task")?;
                    return Ok(match row.map(Row::decode).transpose()? {
                        Some(task) if task.within_scope(owner) => Reschedule::Replay(task),
                        _ => Reschedule::NotFound,
                    });
                }
            }
            let sql = format!("{MOVE} RETURNING {COLUMNS}");
            let mut moved = None;
            for from in [TaskState::Pending, TaskState::Scheduled] {
                let row: Option<Row> = sqlx::query_as(&sql)
                    .bind(db_ms(change.deliver_at_ms))
                    .bind(db_ms(change.delay_ms))
                    .bind(&change.routing_key)
                    .bind(db_ms(change.lease_until_ms))
                    .bind(id)
                    .bind(from.as_str())
                    .bind(owner)
                    .fetch_optional(&mut *tx)
                    .await
                    .context("moving a task")?;
                if let Some(row) = row {
                    moved = Some((from, row.decode()?));
                    break;
                }
            }
            let Some((from, task)) = moved else {
                let sql = select_sql(1);
                let row: Option<Row> = sqlx::query_as(&sql)
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await
                    .context("reading a task")?;
                return Ok(match row.map(Row::decode).transpose()? {
                    None => Reschedule::NotFound,
                    Some(task) if !task.within_scope(owner) => Reschedule::NotFound,
                    Some(task) if task.state.is_changeable() => Reschedule::PayloadNotKept(task),
                    Some(task) => Reschedule::Unchangeable(task),
                });
            };
            if from == TaskState::Scheduled {
                // Committed below: the count may run ahead by one for a moment.
                self.pending.add(1);
            }
            task
        });
        Ok(Reschedule::Moved(moved))
    }

    /// Takes each `(id, revision)` due at the release stage: a task that
    /// is neither cancelled nor delivered, in the revision its message
    /// carries, becomes `releasing`. Group-committed with the request path's
    /// writes (several windows of due tasks, and the deliveries of earlier
    /// ones, share one commit). The findings follow the order of `due`.
    pub async fn claim_release(
        &self,
        due: Vec<(String, u64)>,
    ) -> Result<Vec<Finding>, LedgerError> {
        self.writes.claim(due).await
    }

    /// For each task whose older copies must not be delivered, the lowest
    /// revision still to deliver: a moved task's current one, `u64::MAX` for
    /// a cancelled task (for `migrate-topology`).
    pub async fn superseded(&self) -> Result<HashMap<String, u64>, LedgerError> {
        const SQL: &str =
            "SELECT id, state, revision FROM tasks WHERE state = 'cancelled' OR revision > 1";
        let rows: Vec<(String, String, i64)> =
            on_pool!(&self.pool, p => sqlx::query_as(SQL).fetch_all(p).await)
                .context("reading cancelled and moved tasks")?;
        Ok(rows
            .into_iter()
            .map(|(id, state, revision)| {
                let keep_from = if state == TaskState::Cancelled.as_str() {
                    u64::MAX
                } else {
                    u64::try_from(revision).unwrap_or(1)
                };
                (id, keep_from)
            })
            .collect())
    }

    /// Tasks the release stage released whose message reached no queue (the
    /// business exchange's alternate exchange took it): each `(id,
    /// revision)` still releasing or delivered in that revision becomes
    /// `unroutable`, delivered at `at_ms` unless marked before. Returns how
    /// many changed. Rare, so a statement each rather than a group.
    pub async fn mark_unroutable(
        &self,
        released: &[(String, u64)],
        at_ms: u64,
    ) -> Result<u64, LedgerError> {
        const SQL: &str = "UPDATE tasks SET state = 'unroutable', \
             delivered_at_ms = COALESCE(delivered_at_ms, $3) \
             WHERE id = $1 AND revision = $2 AND state IN ('releasing', 'delivered')";
        let mut marked = 0;
        for (id, revision) in released {
            let done = on_pool!(&self.pool, p => sqlx::query(SQL)
                .bind(id)
                .bind(db_ms(*revision))
                .bind(db_ms(at_ms))
                .execute(p)
                .await
                .map(|done| done.rows_affected()))
            .context("marking released tasks unroutable")?;
            marked += done;
        }
        Ok(marked)
    }

    /// Before `requeue-unroutable` sends the unroutable queue's messages to
    /// the business exchange again: their tasks count as delivered, until a
    /// copy that is unroutable again marks its task so once more (which can
    /// only come after this commit). Returns how many.
    pub async fn requeue_unroutable(&self) -> Result<u64, LedgerError> {
        const SQL: &str = "UPDATE tasks SET state = 'delivered' WHERE state = 'unroutable'";
        on_pool!(&self.pool, p => sqlx::query(SQL)
            .execute(p)
            .await
            .map(|done| done.rows_affected()))
        .context("counting unroutable tasks as delivered again")
    }

    /// The tasks the release stage delivered, confirmed by the business
    /// exchange at `at_ms` (group-committed with the request path's writes).
    pub async fn mark_delivered(&self, ids: Vec<String>, at_ms: u64) -> Result<(), LedgerError> {
        self.writes.delivered(ids, at_ms).await
    }
}

/// The ids of `ids` not yet `decided`, in order.
fn undecided<'a>(ids: &[&'a str], decided: impl Fn(&str) -> bool) -> Vec<&'a str> {
    ids.iter().copied().filter(|id| !decided(id)).collect()
}
