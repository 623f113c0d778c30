//! Reading tasks, and the two sweeps over many: the forwarder's claim of
//! pending tasks and the pruning of old ones. The statements are in
//! [`sql`]; this file binds them.

use super::error::{LedgerError, QueryContext};
use super::filter::{TaskFilter, is_rare};
use super::handle::Ledger;
use super::holders;
use super::record::{Row, StoredTask, db_ms, decode_all};
use super::sql;

impl Ledger {
    /// Ends, at a start, the leases a stopped process left in a ledger no
    /// other process uses (SQLite): its pending tasks are due for the
    /// forwarder now, and what its limiter or staged release had taken
    /// waits or is staged again. Without this they waited out their leases
    /// (a pending task's is `amqp.confirm_timeout_ms` + 2 s, 12 s by
    /// default) after every restart. The tasks it staged become this
    /// process's: another process releases a task staged by another 10 s
    /// after its moment, for the hosts' clocks may disagree, and on SQLite
    /// the stopped process ran on this host, by this clock. Call before
    /// this process takes any lease of its own. On PostgreSQL, which
    /// replicas share, a lease may be a live replica's: nothing is done
    /// here (`None`), and [`Ledger::end_leases_of_gone_holders`] ends a
    /// stopped one's.
    pub async fn end_leases_of_a_stopped_process(&self) -> Result<Option<u64>, LedgerError> {
        let super::pool::Pool::Sqlite(pool) = &self.pool else {
            return Ok(None);
        };
        let own = crate::clock::source();
        let leased: Option<String> = sqlx::query_scalar(sql::ANY_LEASE)
            .bind(0_i64)
            .fetch_optional(pool)
            .await
            .context("looking for leases a stopped process left")?;
        let staged: Option<String> = sqlx::query_scalar(sql::ANY_STAGED_BY_ANOTHER)
            .bind(own)
            .fetch_optional(pool)
            .await
            .context("looking for tasks a stopped process staged")?;
        if leased.is_none() && staged.is_none() {
            return Ok(Some(0));
        }
        let mut tx = pool.begin().await.context("starting a transaction")?;
        let mut ended = 0;
        for statement in [
            sql::END_PENDING_LEASES,
            sql::RETURN_EXPIRED_LEASES,
            sql::RETURN_EXPIRED_STAGES,
        ] {
            ended += sqlx::query(statement)
                .bind(i64::MAX)
                .execute(&mut *tx)
                .await
                .context("ending the leases of a stopped process")?
                .rows_affected();
        }
        ended += sqlx::query(sql::ADOPT_STAGED)
            .bind(own)
            .execute(&mut *tx)
            .await
            .context("taking over the tasks a stopped process staged")?
            .rows_affected();
        tx.commit().await.context("committing")?;
        Ok(Some(ended))
    }

    /// Ends the leases of every holder that is gone (PostgreSQL: see
    /// `holders`); how many tasks they held. Nothing to do on SQLite.
    pub async fn end_leases_of_gone_holders(&self) -> Result<u64, LedgerError> {
        let super::pool::Pool::Postgres(pool) = &self.pool else {
            return Ok(0);
        };
        let mut ended = 0;
        for holder in holders::gone(pool, self.holder).await? {
            let tasks = holders::end_leases_of(pool, holder).await?;
            if tasks > 0 {
                tracing::info!(holder, tasks, "ended the leases of a replica that is gone");
            }
            ended += tasks;
        }
        Ok(ended)
    }

    pub async fn get(&self, id: &str) -> Result<Option<StoredTask>, LedgerError> {
        let sql = sql::get();
        let row: Option<Row> =
            on_pool!(&self.pool, p => sqlx::query_as(&sql).bind(id).fetch_optional(p).await)
                .context("reading a task")?;
        row.map(Row::decode).transpose()
    }

    /// Whether a request for task `id` (under `key`, when it has one) with
    /// `fingerprint` repeats one the ledger accepted before, as
    /// [`Ledger::admit`] would judge it; read-only.
    pub async fn is_replay(
        &self,
        id: &str,
        key: Option<&str>,
        fingerprint: &str,
    ) -> Result<bool, LedgerError> {
        let (sql, name) = match key {
            Some(key) => (sql::REQUEST_BY_KEY, key),
            None => (sql::REQUEST_BY_ID, id),
        };
        let held: Option<(Option<String>, Option<String>)> = on_pool!(&self.pool, p =>
            sqlx::query_as(sql).bind(name).fetch_optional(p).await)
        .context("looking for an earlier request")?;
        Ok(held.is_some_and(|(held_key, held_fingerprint)| {
            held_key.as_deref() == key && held_fingerprint.as_deref() == Some(fingerprint)
        }))
    }

    /// How many of `client`'s tasks are waiting (not yet due, and neither
    /// cancelled nor failed): what its quota counts.
    pub async fn waiting_tasks(&self, client: &str, now_ms: u64) -> Result<u64, LedgerError> {
        let count: i64 = on_pool!(&self.pool, p => sqlx::query_scalar(sql::WAITING_TASKS)
            .bind(client)
            .bind(db_ms(now_ms))
            .fetch_one(p)
            .await)
        .context("counting a client's waiting tasks")?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Tasks in due order (`deliver_at`, then id), after the cursor. Only
    /// the filters given are in the statement, so that each can use its
    /// index (`x = $1 OR $1 IS NULL` would hide it from the planner).
    pub async fn list(
        &self,
        filter: &TaskFilter,
        now_ms: u64,
    ) -> Result<Vec<StoredTask>, LedgerError> {
        let filter = &filter.bounded(now_ms);
        let sql = sql::list_sql(filter);
        on_pool!(&self.pool, p => {
            let mut query = sqlx::query_as::<_, Row>(&sql);
            if let Some(client) = &filter.client {
                query = query.bind(client);
            }
            if let Some(destination) = &filter.destination {
                query = query.bind(destination);
            }
            if let Some(state) = filter.state.filter(|s| !is_rare(*s)) {
                query = query.bind(state.as_str());
            }
            if let Some(due_before_ms) = filter.due_before_ms {
                query = query.bind(db_ms(due_before_ms));
            }
            if let Some(cursor) = &filter.after {
                query = query.bind(db_ms(cursor.deliver_at_ms)).bind(&cursor.id);
            }
            query.bind(i64::from(filter.limit)).fetch_all(p).await
        })
        .context("listing tasks")
        .and_then(decode_all)
    }

    /// Takes up to `limit` pending tasks whose lease has expired, leasing them
    /// to the caller until `lease_until_ms` (see [`sql::claim_pending`]).
    pub async fn claim_due(
        &self,
        now_ms: u64,
        lease_until_ms: u64,
        limit: u32,
    ) -> Result<Vec<StoredTask>, LedgerError> {
        let any: Option<String> =
            on_pool!(&self.pool, p => sqlx::query_scalar(sql::ANY_PENDING_DUE)
            .bind(db_ms(now_ms))
            .fetch_optional(p)
            .await)
            .context("looking for pending tasks")?;
        if any.is_none() {
            return Ok(Vec::new());
        }
        let sql = sql::claim_pending();
        on_pool!(&self.pool, p => sqlx::query_as::<_, Row>(&sql)
            .bind(db_ms(now_ms))
            .bind(db_ms(lease_until_ms))
            .bind(i64::from(limit))
            .bind(self.holder)
            .fetch_all(p)
            .await)
        .context("claiming pending tasks")
        .and_then(decode_all)
    }

    /// Records the key each `(id, revision, key)` is about to be published
    /// with by the forwarder, where it differs from the one admitted (the
    /// delay left is shorter, so the levels are others). Without it, the
    /// resend of a stranded level's tasks, which picks them by their key,
    /// would miss the copies that went through that level. One transaction
    /// for the batch: one synced write, not one each.
    pub async fn record_routes(&self, routes: &[(&str, u64, &str)]) -> Result<(), LedgerError> {
        if routes.is_empty() {
            return Ok(());
        }
        in_tx!(&self.pool, tx => {
            for (id, revision, key) in routes {
                sqlx::query(sql::RECORD_ROUTE)
                    .bind(*key)
                    .bind(*id)
                    .bind(db_ms(*revision))
                    .execute(&mut *tx)
                    .await
                    .context("recording the route a task is published with")?;
            }
        });
        Ok(())
    }

    /// Deletes up to `limit` tasks that are no longer pending and were due
    /// before `before_ms`, the idempotency keys of changes made before then
    /// and the bulk operations finished before then; returns how many
    /// tasks. Small batches keep each lock short. A pruned task that still
    /// reaches the release stage is delivered: only what the ledger shows
    /// cancelled is ever dropped.
    pub async fn prune(&self, before_ms: u64, limit: u32) -> Result<u64, LedgerError> {
        on_pool!(&self.pool, p => sqlx::query(sql::PRUNE_CHANGES)
            .bind(db_ms(before_ms))
            .bind(i64::from(limit))
            .execute(p)
            .await
            .map(|_| ()))
        .context("pruning change keys")?;
        self.prune_operations(before_ms).await?;
        let result = on_pool!(&self.pool, p => sqlx::query(sql::PRUNE_TASKS)
            .bind(db_ms(before_ms))
            .bind(i64::from(limit))
            .execute(p)
            .await
            .map(|r| r.rows_affected()))
        .context("pruning delivered tasks")?;
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::cursor::Cursor;
    use crate::ledger::pool::{migrated_sqlite, query_plan, sorts_the_range};
    use crate::task::TaskState;

    /// With tokens every task has a client; the client's tasks are listed
    /// and counted from the due-order index, so no index of their own (a
    /// fourth B-tree taking each task at a random place) slows the intake.
    #[tokio::test]
    async fn a_clients_tasks_are_listed_and_counted_from_the_due_order_index_on_sqlite() {
        let pool = migrated_sqlite().await;
        let plan = async |statement: &str, parameters: usize| {
            query_plan(&pool, statement, parameters).await
        };
        // Every waiting task is counted from the index alone; the withdrawn
        // ones (few) are read through their own.
        let count = plan(sql::WAITING_TASKS, 2).await;
        assert!(
            count.iter().all(|step| !step.starts_with("SCAN tasks"))
                && count
                    .iter()
                    .any(|step| step.contains("COVERING INDEX tasks_by_deliver_at"))
                && count
                    .iter()
                    .any(|step| step.contains("INDEX tasks_withdrawn_by_client")),
            "{count:?}"
        );
        let filter = TaskFilter {
            client: Some("c".to_owned()),
            after: Some(Cursor {
                deliver_at_ms: 1,
                id: "t".to_owned(),
            }),
            limit: 10,
            ..TaskFilter::default()
        };
        let list = plan(&sql::list_sql(&filter), 4).await;
        assert!(
            list.iter().any(|step| step.contains("tasks_by_deliver_at"))
                && list.iter().all(|step| !sorts_the_range(step)),
            "{list:?}"
        );
        // A rare state is read through its own index, with or without a
        // destination; a delivered one from the past only.
        for state in TaskState::ALL.into_iter().filter(|s| is_rare(*s)) {
            for destination in [None, Some("d".to_owned())] {
                let filter = TaskFilter {
                    destination,
                    state: Some(state),
                    limit: 10,
                    ..TaskFilter::default()
                }
                .bounded(1);
                let parameters = 1 + usize::from(filter.destination.is_some());
                let list = plan(&sql::list_sql(&filter), parameters).await;
                let index = format!("INDEX tasks_{}", state.as_str());
                assert!(
                    list.iter().any(|step| step.contains(&index)),
                    "{state:?}: {list:?}"
                );
            }
        }
        let delivered = TaskFilter {
            state: Some(TaskState::Delivered),
            limit: 10,
            ..TaskFilter::default()
        }
        .bounded(1);
        assert_eq!(delivered.due_before_ms, Some(60_001));
        let list = plan(&sql::list_sql(&delivered), 3).await;
        assert!(
            list.iter()
                .any(|step| step.contains("SEARCH tasks USING INDEX tasks_by_deliver_at")),
            "{list:?}"
        );
        let indexes: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tasks'",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert!(
            !indexes.iter().any(|name| name == "tasks_by_client"),
            "{indexes:?}"
        );
    }

    /// Whatever the filter, a list reads an index in due order and sorts at
    /// most the tasks that share a due time; only the pending tasks (at
    /// most `store.max_pending`) are read in attempt order and sorted.
    #[tokio::test]
    async fn every_list_reads_an_index_in_due_order_on_sqlite() {
        let pool = migrated_sqlite().await;
        let states = std::iter::once(None).chain(TaskState::ALL.into_iter().map(Some));
        for state in states {
            for bits in 0..16u8 {
                let filter = TaskFilter {
                    client: (bits & 1 != 0).then(|| "c".to_owned()),
                    destination: (bits & 2 != 0).then(|| "d".to_owned()),
                    state,
                    due_before_ms: (bits & 4 != 0).then_some(9),
                    after: (bits & 8 != 0).then(|| Cursor {
                        deliver_at_ms: 1,
                        id: "t".to_owned(),
                    }),
                    limit: 10,
                };
                let statement = sql::list_sql(&filter);
                let parameters = statement.matches('$').count();
                let list = query_plan(&pool, &statement, parameters).await;
                let sorted_pending = state == Some(TaskState::Pending);
                assert!(
                    list.iter().any(|step| step.contains("USING INDEX")
                        || step.contains("USING COVERING INDEX"))
                        && (sorted_pending || list.iter().all(|step| !sorts_the_range(step))),
                    "{statement}: {list:?}"
                );
            }
        }
    }
}
