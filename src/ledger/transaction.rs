//! A group's transaction on either backend, one method per step of the
//! writer's group commit: each binds its statement from [`super::sql`].

use sqlx::{Postgres, Sqlite, Transaction};

use super::record::{Retry, Row};
use super::sql;
use super::{LedgerError, Pool, QueryContext, db_ms};

/// A group's transaction on either backend; one method per step.
pub(super) enum Tx {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

/// Runs `$body` with `$tx` bound to the backend's own transaction type
/// (and `$sql`, when given, in the backend's own placeholders).
macro_rules! on_tx {
    ($tx:expr, $t:ident => $body:expr) => {
        match $tx {
            Tx::Sqlite($t) => $body,
            Tx::Postgres($t) => $body,
        }
    };
    ($tx:expr, $sql:ident, $t:ident => $body:expr) => {
        match $tx {
            Tx::Sqlite($t) => {
                let $sql = sql::for_sqlite(&$sql);
                let $sql: &str = &$sql;
                $body
            }
            Tx::Postgres($t) => {
                let $sql: &str = &$sql;
                $body
            }
        }
    };
}

impl Tx {
    pub(super) async fn begin(pool: &Pool) -> Result<Tx, LedgerError> {
        Ok(match pool {
            Pool::Sqlite(p) => Tx::Sqlite(p.begin().await.context("starting a transaction")?),
            Pool::Postgres(p) => Tx::Postgres(p.begin().await.context("starting a transaction")?),
        })
    }

    pub(super) async fn commit(self) -> Result<(), LedgerError> {
        on_tx!(self, t => t.commit().await).context("committing")
    }

    /// One chunk of new rows; returns the ids actually inserted.
    pub(super) async fn insert(&mut self, rows: &[&Row]) -> Result<Vec<String>, LedgerError> {
        let sql = sql::insert(rows.len());
        on_tx!(self, sql, t => {
            let mut query = sqlx::query_scalar(sql);
            for r in rows {
                query = query
                    .bind(&r.id)
                    .bind(&r.idempotency_key)
                    .bind(&r.fingerprint)
                    .bind(&r.destination)
                    .bind(&r.routing_key)
                    .bind(r.delay_ms)
                    .bind(r.deliver_at_ms)
                    .bind(&r.content_type)
                    .bind(&r.headers)
                    .bind(&r.payload)
                    .bind(r.payload_bytes)
                    .bind(&r.state)
                    .bind(r.created_at_ms)
                    .bind(r.published_at_ms)
                    .bind(r.next_attempt_at_ms)
                    .bind(r.attempts)
                    .bind(&r.last_error)
                    .bind(&r.client)
                    .bind(&r.properties)
                    .bind(&r.exchange);
            }
            query.fetch_all(&mut **t).await
        })
        .context("recording tasks")
    }

    /// One chunk of a release claim: the ids claimed.
    pub(super) async fn claim(
        &mut self,
        from: &str,
        pairs: &[(&str, i64)],
    ) -> Result<Vec<String>, LedgerError> {
        let sql = sql::claim(from, pairs.len());
        on_tx!(self, sql, t => {
            let mut query = sqlx::query_scalar::<_, String>(sql);
            for (id, revision) in pairs {
                query = query.bind(*id).bind(*revision);
            }
            query.fetch_all(&mut **t).await
        })
        .context("claiming due tasks")
    }

    pub(super) async fn states(
        &mut self,
        ids: &[&str],
    ) -> Result<Vec<(String, String, i64)>, LedgerError> {
        let sql = sql::states(ids.len());
        on_tx!(self, sql, t => {
            let mut query = sqlx::query_as::<_, (String, String, i64)>(sql);
            for id in ids {
                query = query.bind(*id);
            }
            query.fetch_all(&mut **t).await
        })
        .context("reading due tasks")
    }

    /// The row holding `row`'s idempotency key, or else its id.
    pub(super) async fn holder_of(&mut self, row: &Row) -> Result<Option<Row>, LedgerError> {
        if let Some(key) = &row.idempotency_key {
            let sql = sql::holder_by_key();
            let holder =
                on_tx!(self, t => sqlx::query_as(&sql).bind(key).fetch_optional(&mut **t).await)
                    .context("looking up an idempotency key")?;
            if holder.is_some() {
                return Ok(holder);
            }
        }
        let sql = sql::holder_by_id();
        on_tx!(self, t => sqlx::query_as(&sql).bind(&row.id).fetch_optional(&mut **t).await)
            .context("looking up a task id")
    }

    /// Returns how many of the pairs were pending and are now scheduled.
    pub(super) async fn mark_published(
        &mut self,
        pairs: &[(&str, i64)],
        now_ms: i64,
        trim: bool,
        payload_copy_bytes: u32,
    ) -> Result<u64, LedgerError> {
        let sql = sql::mark_published(pairs.len(), trim);
        let copy_bytes = i32::try_from(payload_copy_bytes).unwrap_or(i32::MAX);
        on_tx!(self, sql, t => {
            let mut query = sqlx::query(sql).bind(now_ms).bind(copy_bytes);
            for (id, revision) in pairs {
                query = query.bind(*id).bind(*revision);
            }
            query.execute(&mut **t).await.map(|done| done.rows_affected())
        })
        .context("marking tasks scheduled")
    }

    pub(super) async fn mark_delivered(
        &mut self,
        ids: &[&str],
        at_ms: i64,
        payload_copy_bytes: u32,
    ) -> Result<(), LedgerError> {
        let sql = sql::mark_delivered(ids.len());
        let copy_bytes = i32::try_from(payload_copy_bytes).unwrap_or(i32::MAX);
        on_tx!(self, sql, t => {
            let mut query = sqlx::query(sql).bind(at_ms).bind(copy_bytes);
            for id in ids {
                query = query.bind(*id);
            }
            query.execute(&mut **t).await.map(|_| ())
        })
        .context("marking tasks delivered")
    }

    pub(super) async fn schedule_retry(
        &mut self,
        id: &str,
        revision: u64,
        retry: &Retry,
    ) -> Result<(), LedgerError> {
        on_tx!(self, t => sqlx::query(sql::SCHEDULE_RETRY)
            .bind(db_ms(retry.retry_at_ms))
            .bind(&retry.error)
            .bind(i64::from(retry.publish_alone))
            .bind(i64::from(retry.refused))
            .bind(id)
            .bind(db_ms(revision))
            .execute(&mut **t)
            .await
            .map(|_| ()))
        .context("scheduling a retry")?;
        Ok(())
    }

    /// Returns whether the task was pending.
    pub(super) async fn mark_failed(
        &mut self,
        id: &str,
        revision: Option<u64>,
        reason: &str,
    ) -> Result<bool, LedgerError> {
        for (sql, was_pending) in [(sql::FAIL_PENDING, true), (sql::FAIL_SCHEDULED, false)] {
            let changed = on_tx!(self, t => sqlx::query(sql)
                .bind(reason)
                .bind(id)
                .bind(revision.map(db_ms))
                .execute(&mut **t)
                .await
                .map(|done| done.rows_affected()))
            .context("marking a task failed")?;
            if changed > 0 {
                return Ok(was_pending);
            }
        }
        Ok(false)
    }
}
