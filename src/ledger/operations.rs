//! Bulk operations as the ledger stores them (the `operations` table,
//! written only here) and the page of tasks an operation reads next. An
//! operation is taken by one replica at a time under a lease; its counts
//! and cursor are written after each page, so another replica resumes
//! where a dead one stopped (that page is worked again: a task it had
//! cancelled is then counted `unchanged`, so the counts still add up).

use super::error::{LedgerError, QueryContext};
use super::handle::Ledger;
use super::record::db_ms;
use super::sql;
use crate::task::TaskState;

/// An operation as the ledger holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredOperation {
    pub id: String,
    /// The client that asked ('' on an open API).
    pub owner: String,
    pub idempotency_key: Option<String>,
    pub fingerprint: String,
    /// The request as received (JSON), which the worker checks again.
    pub request: String,
    /// `running`, `done` or `failed`.
    pub state: String,
    pub matched: i64,
    pub changed: i64,
    pub too_late: i64,
    pub unchanged: i64,
    pub cursor_at_ms: i64,
    pub cursor_id: String,
    pub last_error: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub finished_at_ms: Option<i64>,
}

const OPERATION_COLUMNS: &str = "id, owner, idempotency_key, fingerprint, request, state, matched, \
     changed, too_late, unchanged, cursor_at_ms, cursor_id, last_error, created_at_ms, \
     updated_at_ms, finished_at_ms";

/// What one page did, and where the operation stands after it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageDone {
    pub matched: u64,
    pub changed: u64,
    pub too_late: u64,
    pub unchanged: u64,
    pub cursor_at_ms: u64,
    pub cursor_id: String,
    /// The last page: the operation is done.
    pub finished: bool,
}

/// A task a page read: enough to match it and to move it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PagedTask {
    pub id: String,
    pub destination: String,
    pub state: TaskState,
    pub deliver_at_ms: u64,
    /// Its leeway (0: none): `deliver_at_ms` is a moment in it.
    pub leeway_ms: u64,
}

fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Ledger {
    /// Records a new operation, or finds the one its owner made under the
    /// same idempotency key; whether it is new.
    pub async fn start_operation(
        &self,
        new: &StoredOperation,
    ) -> Result<(StoredOperation, bool), LedgerError> {
        let insert = format!(
            "INSERT INTO operations ({OPERATION_COLUMNS}) VALUES \
             ($1, $2, $3, $4, $5, 'running', 0, 0, 0, 0, $6, '', NULL, $7, $7, NULL) \
             ON CONFLICT DO NOTHING RETURNING {OPERATION_COLUMNS}"
        );
        let created: Option<StoredOperation> = on_pool!(&self.pool, p => sqlx::query_as(&insert)
            .bind(&new.id)
            .bind(&new.owner)
            .bind(&new.idempotency_key)
            .bind(&new.fingerprint)
            .bind(&new.request)
            .bind(new.cursor_at_ms)
            .bind(new.created_at_ms)
            .fetch_optional(p)
            .await)
        .context("recording an operation")?;
        if let Some(created) = created {
            return Ok((created, true));
        }
        let existing = format!(
            "SELECT {OPERATION_COLUMNS} FROM operations WHERE owner = $1 AND idempotency_key = $2"
        );
        let found: StoredOperation = on_pool!(&self.pool, p => sqlx::query_as(&existing)
            .bind(&new.owner)
            .bind(&new.idempotency_key)
            .fetch_one(p)
            .await)
        .context("finding an operation by its idempotency key")?;
        Ok((found, false))
    }

    pub async fn operation(&self, id: &str) -> Result<Option<StoredOperation>, LedgerError> {
        let select = format!("SELECT {OPERATION_COLUMNS} FROM operations WHERE id = $1");
        on_pool!(&self.pool, p => sqlx::query_as(&select).bind(id).fetch_optional(p).await)
            .context("reading an operation")
    }

    /// Leases the oldest running operation no one holds until
    /// `lease_until_ms`; on PostgreSQL the condition is checked again on the
    /// locked row, so two replicas never take the same one.
    pub async fn take_operation(
        &self,
        now_ms: u64,
        lease_until_ms: u64,
    ) -> Result<Option<StoredOperation>, LedgerError> {
        // A read first: an UPDATE takes SQLite's write lock even when it
        // matches nothing, and the group writer needs that lock; every
        // replica asks five times a second, and nearly always in vain.
        const ANY_TO_TAKE: &str = "SELECT id FROM operations WHERE state = 'running' \
             AND leased_until_ms <= $1 LIMIT 1";
        let any: Option<String> = on_pool!(&self.pool, p => sqlx::query_scalar(ANY_TO_TAKE)
            .bind(db_ms(now_ms))
            .fetch_optional(p)
            .await)
        .context("looking for an operation to take")?;
        if any.is_none() {
            return Ok(None);
        }
        let take = format!(
            "UPDATE operations SET leased_until_ms = $1 WHERE id = (SELECT id FROM operations \
             WHERE state = 'running' AND leased_until_ms <= $2 ORDER BY created_at_ms LIMIT 1) \
             AND state = 'running' AND leased_until_ms <= $2 RETURNING {OPERATION_COLUMNS}"
        );
        on_pool!(&self.pool, p => sqlx::query_as(&take)
            .bind(db_ms(lease_until_ms))
            .bind(db_ms(now_ms))
            .fetch_optional(p)
            .await)
        .context("taking an operation")
    }

    /// Deletes operations that finished before `before_ms` (the ledger's
    /// retention, as for delivered tasks): their answers are no longer
    /// asked for, and an idempotency key of theirs is free again.
    pub(super) async fn prune_operations(&self, before_ms: u64) -> Result<u64, LedgerError> {
        const PRUNE: &str = "DELETE FROM operations WHERE state <> 'running' \
             AND finished_at_ms < $1";
        on_pool!(&self.pool, p => sqlx::query(PRUNE)
            .bind(db_ms(before_ms))
            .execute(p)
            .await
            .map(|r| r.rows_affected()))
        .context("pruning finished bulk operations")
    }

    /// Adds a page's counts and moves the cursor (and the lease); the last
    /// page marks the operation done.
    pub async fn record_page(
        &self,
        id: &str,
        page: &PageDone,
        lease_until_ms: u64,
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        const RECORD: &str = "UPDATE operations SET matched = matched + $1, \
             changed = changed + $2, too_late = too_late + $3, unchanged = unchanged + $4, \
             cursor_at_ms = $5, cursor_id = $6, leased_until_ms = $7, updated_at_ms = $8, \
             state = CASE WHEN $9 = 1 THEN 'done' ELSE state END, \
             finished_at_ms = CASE WHEN $9 = 1 THEN $8 ELSE finished_at_ms END \
             WHERE id = $10";
        on_pool!(&self.pool, p => sqlx::query(RECORD)
            .bind(signed(page.matched))
            .bind(signed(page.changed))
            .bind(signed(page.too_late))
            .bind(signed(page.unchanged))
            .bind(db_ms(page.cursor_at_ms))
            .bind(&page.cursor_id)
            .bind(db_ms(lease_until_ms))
            .bind(db_ms(now_ms))
            .bind(i64::from(page.finished))
            .bind(id)
            .execute(p)
            .await
            .map(|_| ()))
        .context("recording an operation's page")
    }

    /// Ends an operation that cannot go on (its request no longer checks).
    pub async fn fail_operation(
        &self,
        id: &str,
        error: &str,
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        const FAIL: &str = "UPDATE operations SET state = 'failed', last_error = $1, \
             updated_at_ms = $2, finished_at_ms = $2 WHERE id = $3";
        on_pool!(&self.pool, p => sqlx::query(FAIL)
            .bind(error)
            .bind(db_ms(now_ms))
            .bind(id)
            .execute(p)
            .await
            .map(|_| ()))
        .context("failing an operation")
    }

    /// How many of `destination`'s tasks due before `before_ms` (in
    /// `state`, of `owner`) a cancel could still change, counted up to
    /// `at_most`.
    pub async fn count_changeable(
        &self,
        destination: &str,
        (before_ms, at_most): (u64, u64),
        state: Option<TaskState>,
        owner: Option<&str>,
    ) -> Result<u64, LedgerError> {
        let statement = sql::count_changeable(state.is_some(), owner.is_some());
        let count: i64 = on_pool!(&self.pool, p => {
            let mut query = sqlx::query_scalar(&statement)
                .bind(destination)
                .bind(db_ms(before_ms.min(i64::MAX as u64)))
                .bind(db_ms(at_most.min(i64::MAX as u64)));
            if let Some(state) = state {
                query = query.bind(state.as_str());
            }
            if let Some(owner) = owner {
                query = query.bind(owner);
            }
            query.fetch_one(p).await
        })
        .context("counting tasks a cancel could change")?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Up to `limit` tasks due after the cursor and before `before_ms`, in
    /// due order (to one destination and of one owner only, when given).
    pub async fn bulk_page(
        &self,
        after: (u64, &str),
        before_ms: u64,
        only: (Option<&str>, Option<&str>),
        limit: u32,
    ) -> Result<Vec<PagedTask>, LedgerError> {
        let (destination, owner) = only;
        let statement = sql::bulk_page(destination.is_some(), owner.is_some());
        let rows: Vec<(String, String, String, i64, i64)> = on_pool!(&self.pool, p => {
            let mut query = sqlx::query_as(&statement)
                .bind(db_ms(after.0))
                .bind(after.1)
                .bind(db_ms(before_ms.min(i64::MAX as u64)))
                .bind(i64::from(limit));
            if let Some(destination) = destination {
                query = query.bind(destination);
            }
            if let Some(owner) = owner {
                query = query.bind(owner);
            }
            query.fetch_all(p).await
        })
        .context("reading a page of tasks")?;
        rows.into_iter()
            .map(|(id, destination, state, deliver_at_ms, leeway_ms)| {
                let state = TaskState::parse(&state).ok_or_else(|| LedgerError::Corrupt {
                    id: id.clone(),
                    reason: format!("unknown state {state:?}"),
                })?;
                Ok(PagedTask {
                    id,
                    destination,
                    state,
                    deliver_at_ms: u64::try_from(deliver_at_ms).unwrap_or(0),
                    leeway_ms: u64::try_from(leeway_ms).unwrap_or(0),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::StoredOperation;
    use crate::ledger::pool::{migrated_sqlite, query_plan, sorts_the_range};
    use crate::ledger::sql;

    fn operation(id: &str, created_at_ms: i64) -> StoredOperation {
        StoredOperation {
            id: id.to_owned(),
            owner: String::new(),
            idempotency_key: None,
            fingerprint: "f".to_owned(),
            request: "{}".to_owned(),
            state: "running".to_owned(),
            matched: 0,
            changed: 0,
            too_late: 0,
            unchanged: 0,
            cursor_at_ms: 0,
            cursor_id: String::new(),
            last_error: None,
            created_at_ms,
            updated_at_ms: created_at_ms,
            finished_at_ms: None,
        }
    }

    /// Nothing to take is found without a write; a finished operation is
    /// pruned with the ledger's retention, a running one never.
    #[tokio::test]
    async fn finished_operations_are_pruned_and_running_ones_taken() {
        let (ledger, dir) = crate::ledger::handle::scratch_sqlite().await;
        assert!(
            ledger
                .take_operation(1_000, 31_000)
                .await
                .unwrap()
                .is_none()
        );
        for (id, created_at_ms) in [("finished", 1_000), ("running", 1_001)] {
            let new = operation(id, created_at_ms);
            ledger.start_operation(&new).await.unwrap();
        }
        let taken = ledger.take_operation(1_001, 31_001).await.unwrap().unwrap();
        assert_eq!(taken.id, "finished");
        ledger
            .fail_operation("finished", "for the test", 2_000)
            .await
            .unwrap();
        // Leased: not taken again before its lease runs out.
        let next = ledger.take_operation(2_000, 32_000).await.unwrap().unwrap();
        assert_eq!(next.id, "running");
        assert!(
            ledger
                .take_operation(3_000, 33_000)
                .await
                .unwrap()
                .is_none()
        );

        assert_eq!(ledger.prune_operations(2_000).await.unwrap(), 0);
        assert_eq!(ledger.prune_operations(2_001).await.unwrap(), 1);
        assert!(ledger.operation("finished").await.unwrap().is_none());
        assert!(ledger.operation("running").await.unwrap().is_some());
        ledger.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The pruner reads the due-order index from its start, never the
    /// table.
    #[tokio::test]
    async fn pruning_reads_the_due_order_index_on_sqlite() {
        let pool = migrated_sqlite().await;
        let plan = query_plan(&pool, sql::PRUNE_TASKS, 2).await;
        assert!(
            plan.iter().any(|step| step.contains("tasks_by_deliver_at"))
                && plan.iter().all(|step| !step.starts_with("SCAN tasks")),
            "{plan:?}"
        );
    }

    /// A page is one range of an index in due order, never a sort of the
    /// table: the due-order index, or the destination's with one destination.
    /// The indexes end in the rowid, not the id (migration 0021): only tasks
    /// due the same millisecond are sorted, by id.
    #[tokio::test]
    async fn a_page_is_read_from_an_index_in_due_order_on_sqlite() {
        let pool = migrated_sqlite().await;
        for (one_destination, owned, index) in [
            (false, false, "tasks_by_deliver_at"),
            (false, true, "tasks_by_deliver_at"),
            (true, false, "tasks_by_destination"),
            (true, true, "tasks_by_destination"),
        ] {
            let statement = sql::bulk_page(one_destination, owned);
            let parameters = 4 + usize::from(one_destination) + usize::from(owned);
            let plan = query_plan(&pool, &statement, parameters).await;
            assert!(
                plan.iter().any(|step| step.contains(index))
                    && plan.iter().all(|step| !sorts_the_range(step)),
                "{statement}: {plan:?}"
            );
        }
    }
}
