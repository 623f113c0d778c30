//! Release limits as the ledger stores them (the `limits` table, written
//! only here and by the limiter's pass, [`super::pass`], which runs in the
//! writer's group commit).
//!
//! A limit's token bucket lives in its row, so that `rate_per_sec` is the
//! rate over every replica sharing the ledger: a pass locks the limits'
//! rows first (on PostgreSQL, passes of several replicas take turns; on
//! SQLite the first statement takes the write lock), takes tokens and
//! moves the waiting tasks it releases to `releasing` in the same
//! transaction. A replica that dies after the commit leaves its tasks
//! `releasing` under a lease; once it runs out they wait again. Tokens are
//! not given back: a crash releases at most what one pass took, later,
//! never more than the bucket allowed.

use super::error::{LedgerError, QueryContext};
use super::handle::Ledger;
use super::pass::{LIMIT_COLUMNS, LimitRow, Pass, PassInput, StoredLimit, ms};
use super::record::db_ms;
use super::sql::{self, statement_sized_chunks};
use crate::limit::{Bucket, Limit};

fn select_limits(condition: &str) -> String {
    format!("SELECT {LIMIT_COLUMNS} FROM limits {condition} ORDER BY name")
}

/// A new limit with a full bucket; a changed one keeps its bucket (at most
/// the new burst), and its creation time.
fn upsert_limit() -> String {
    format!(
        "INSERT INTO limits ({LIMIT_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 0, $11, $10, $10) \
         ON CONFLICT (name) DO UPDATE SET destinations = excluded.destinations, \
         rate_per_sec = excluded.rate_per_sec, burst = excluded.burst, \
         paused = excluded.paused, paused_until_ms = excluded.paused_until_ms, \
         depth_queue = excluded.depth_queue, depth_messages = excluded.depth_messages, \
         tokens = CASE WHEN limits.rate_per_sec IS NULL OR limits.tokens > excluded.tokens \
             THEN excluded.tokens ELSE limits.tokens END, \
         tokens_at_ms = CASE WHEN limits.rate_per_sec IS NULL THEN excluded.tokens_at_ms \
             ELSE limits.tokens_at_ms END, \
         client = excluded.client, updated_at_ms = excluded.updated_at_ms \
         RETURNING {LIMIT_COLUMNS}"
    )
}

/// Pauses (`$2` = 1) or resumes (`$2` = 0: also ends a `paused_until`).
fn pause_limit() -> String {
    format!(
        "UPDATE limits SET paused = $2, \
         paused_until_ms = CASE WHEN $2 = 0 THEN NULL ELSE paused_until_ms END, \
         updated_at_ms = $3 WHERE name = $1 RETURNING {LIMIT_COLUMNS}"
    )
}

const DELETE_LIMIT: &str = "DELETE FROM limits WHERE name = $1 RETURNING name";
impl Ledger {
    /// Sets limit `limit` (creating it, or changing it in place); whether it
    /// is new.
    pub async fn put_limit(
        &self,
        limit: &Limit,
        client: Option<&str>,
        now_ms: u64,
    ) -> Result<(StoredLimit, bool), LedgerError> {
        let tokens = limit.rate.map_or(0.0, |r| Bucket::full(r, now_ms).tokens);
        let sql = upsert_limit();
        let row: LimitRow = on_pool!(&self.pool, p => sqlx::query_as(&sql)
            .bind(&limit.name)
            .bind(limit.destinations.as_str())
            .bind(limit.rate.map(|r| r.per_sec))
            .bind(limit.rate.map(|r| db_ms(r.burst)))
            .bind(i64::from(limit.paused))
            .bind(limit.paused_until_ms.map(db_ms))
            .bind(limit.depth.as_ref().map(|d| d.queue.clone()))
            .bind(limit.depth.as_ref().map(|d| db_ms(d.messages)))
            .bind(tokens)
            .bind(db_ms(now_ms))
            .bind(client)
            .fetch_one(p)
            .await)
        .context("setting a limit")?;
        let stored = row.decode()?;
        let created = stored.created_at_ms == now_ms && stored.updated_at_ms == now_ms;
        Ok((stored, created))
    }

    /// Every limit, by name.
    pub async fn limits(&self) -> Result<Vec<StoredLimit>, LedgerError> {
        let sql = select_limits("");
        let rows: Vec<LimitRow> =
            on_pool!(&self.pool, p => sqlx::query_as(&sql).fetch_all(p).await)
                .context("reading limits")?;
        rows.into_iter().map(LimitRow::decode).collect()
    }

    pub async fn limit(&self, name: &str) -> Result<Option<StoredLimit>, LedgerError> {
        let sql = select_limits("WHERE name = $1");
        let row: Option<LimitRow> =
            on_pool!(&self.pool, p => sqlx::query_as(&sql).bind(name).fetch_optional(p).await)
                .context("reading a limit")?;
        row.map(LimitRow::decode).transpose()
    }

    /// Deletes a limit; whether there was one. What it held waits no more
    /// for it (the limiter's next pass releases it, under any other limit).
    pub async fn delete_limit(&self, name: &str) -> Result<bool, LedgerError> {
        let deleted: Option<String> = on_pool!(&self.pool, p => sqlx::query_scalar(DELETE_LIMIT)
            .bind(name)
            .fetch_optional(p)
            .await)
        .context("deleting a limit")?;
        Ok(deleted.is_some())
    }

    /// Pauses or resumes a limit; `None` when there is none of that name.
    pub async fn pause_limit(
        &self,
        name: &str,
        paused: bool,
        now_ms: u64,
    ) -> Result<Option<StoredLimit>, LedgerError> {
        let sql = pause_limit();
        let row: Option<LimitRow> = on_pool!(&self.pool, p => sqlx::query_as(&sql)
            .bind(name)
            .bind(i64::from(paused))
            .bind(db_ms(now_ms))
            .fetch_optional(p)
            .await)
        .context("pausing or resuming a limit")?;
        row.map(LimitRow::decode).transpose()
    }

    /// Tasks released by the limiter whose publish failed: waiting again.
    pub async fn wait_again(&self, ids: &[String]) -> Result<(), LedgerError> {
        for chunk in statement_sized_chunks(ids) {
            let sql = sql::wait_again(chunk.len());
            on_pool!(&self.pool, p => {
                let mut query = sqlx::query(&sql);
                for id in chunk {
                    query = query.bind(id);
                }
                query.execute(p).await.map(|_| ())
            })
            .context("putting released tasks back to wait")?;
        }
        Ok(())
    }

    /// Tasks the limiter released whose lease ran out before `now_ms` (their
    /// replica stopped before marking them delivered) wait again; how many.
    pub async fn return_expired_leases(&self, now_ms: u64) -> Result<u64, LedgerError> {
        let any: Option<String> =
            on_pool!(&self.pool, p => sqlx::query_scalar(sql::ANY_EXPIRED_LEASE)
            .bind(db_ms(now_ms))
            .fetch_optional(p)
            .await)
            .context("looking for released tasks whose lease ran out")?;
        if any.is_none() {
            return Ok(0);
        }
        let returned = on_pool!(&self.pool, p => sqlx::query(sql::RETURN_EXPIRED_LEASES)
            .bind(db_ms(now_ms))
            .execute(p)
            .await
            .map(|done| done.rows_affected()))
        .context("returning released tasks whose lease ran out")?;
        Ok(returned)
    }

    /// Waiting tasks per destination: how many, and the earliest due time.
    pub async fn waiting_per_destination(&self) -> Result<Vec<(String, u64, u64)>, LedgerError> {
        let rows: Vec<(String, i64, i64)> = on_pool!(&self.pool, p =>
            sqlx::query_as(sql::WAITING_PER_DESTINATION).fetch_all(p).await)
        .context("counting waiting tasks")?;
        Ok(rows
            .into_iter()
            .map(|(destination, count, oldest)| (destination, ms(count), ms(oldest)))
            .collect())
    }

    /// One pass of the limiter (see the module's documentation).
    pub async fn limiter_pass(&self, input: PassInput) -> Result<Pass, LedgerError> {
        self.writes.pass(input).await
    }
}
