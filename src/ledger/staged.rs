//! Staged tasks: what reached the release stage well before its time (a
//! burst's, given a head start through the levels so that it passes them ahead
//! of the instant) is kept in the ledger alone until its moment, and
//! released from there by any replica.
//!
//! Why the ledger: a task held unacknowledged in the release queue costs a
//! place of the stage's prefetch and broker memory until its time, so a
//! burst held that way would stop every other task's release. Staged, it
//! costs one row (whose payload the ledger keeps until delivery anyway),
//! and its release is bounded by how fast a replica publishes, not by the
//! levels' dead-letter workers.
//!
//! The stage's claim stages a task in the claim's own transaction
//! (`claim::stage_claimed`): `staged`, with the moment it is released. The staged
//! release takes those whose moment is near in release order, in the
//! writer's group (`releasing`, leased like the limiter's releases; a lease
//! that runs out stages them again), publishes each at its moment, and marks
//! them delivered.

use super::claim::{ClaimAsk, Finding, UnstageInput};
use super::error::{LedgerError, QueryContext};
use super::handle::Ledger;
use super::pass::ms;
use super::record::{StoredTask, db_ms, decode_all};
use super::sql::{self, statement_sized_chunks};

impl Ledger {
    /// Claims each task asked about that reached the release stage well
    /// before its time and stages it until the moment its ask names
    /// (`stage_until`): [`Finding::Staged`], or what the claim found
    /// instead, in the asks' order. A staged task meets the release limits
    /// at its moment, not now: its ask names none.
    pub async fn stage(&self, asks: Vec<ClaimAsk>) -> Result<Vec<Finding>, LedgerError> {
        debug_assert!(asks.iter().all(|ask| ask.waits_for.is_none()));
        self.writes.claim(asks, None).await
    }

    /// Staged tasks whose moment is by `input.by_ms`, taken for release
    /// in release order (group-committed).
    pub async fn unstage(&self, input: UnstageInput) -> Result<Vec<StoredTask>, LedgerError> {
        decode_all(self.writes.unstage(input).await?)
    }

    /// The earliest moment (epoch ms) `own` (this process) may take a
    /// staged task: its own tasks' moments, another's `others_after_ms`
    /// later; `None` when nothing is staged.
    pub async fn next_staged_ms(
        &self,
        own: &str,
        others_after_ms: u64,
    ) -> Result<Option<u64>, LedgerError> {
        let any: Option<i64> = on_pool!(&self.pool, p =>
            sqlx::query_scalar(sql::NEXT_STAGED).fetch_one(p).await)
        .context("reading the next staged task's moment")?;
        let mine: Option<i64> = on_pool!(&self.pool, p =>
            sqlx::query_scalar(sql::NEXT_OWN_STAGED).bind(own).fetch_one(p).await)
        .context("reading the next staged task's moment")?;
        let any = any.map(|at| ms(at).saturating_add(others_after_ms));
        Ok(match (mine.map(ms), any) {
            (Some(mine), Some(any)) => Some(mine.min(any)),
            (mine, any) => mine.or(any),
        })
    }

    /// Taken staged tasks whose publish failed: staged again, released on
    /// the next take.
    pub async fn stage_again(&self, ids: &[String]) -> Result<(), LedgerError> {
        for chunk in statement_sized_chunks(ids) {
            let sql = sql::stage_again(chunk.len());
            on_pool!(&self.pool, p => {
                let mut query = sqlx::query(&sql);
                for id in chunk {
                    query = query.bind(id);
                }
                query.execute(p).await.map(|_| ())
            })
            .context("staging tasks again")?;
        }
        Ok(())
    }

    /// Taken staged tasks whose lease ran out before `now_ms` (their
    /// replica stopped before marking them delivered) are staged again;
    /// how many.
    pub async fn return_expired_stages(&self, now_ms: u64) -> Result<u64, LedgerError> {
        let any: Option<String> = on_pool!(&self.pool, p =>
            sqlx::query_scalar(sql::ANY_EXPIRED_STAGE)
            .bind(db_ms(now_ms))
            .fetch_optional(p)
            .await)
        .context("looking for staged tasks whose lease ran out")?;
        if any.is_none() {
            return Ok(0);
        }
        let returned = on_pool!(&self.pool, p => sqlx::query(sql::RETURN_EXPIRED_STAGES)
            .bind(db_ms(now_ms))
            .execute(p)
            .await
            .map(|done| done.rows_affected()))
        .context("staging again tasks whose lease ran out")?;
        Ok(returned)
    }

    /// Taken staged tasks `ids` whose destination a release limit holds
    /// now: they wait for `limit` (`waiting`), as a due task the release
    /// stage claims does.
    pub async fn wait_unstaged(&self, ids: &[String], limit: &str) -> Result<(), LedgerError> {
        for chunk in statement_sized_chunks(ids) {
            let sql = sql::hold_releasing(chunk.len());
            on_pool!(&self.pool, p => {
                let mut query = sqlx::query(&sql).bind(limit);
                for id in chunk {
                    query = query.bind(id);
                }
                query.execute(p).await.map(|_| ())
            })
            .context("holding staged tasks for a limit")?;
        }
        Ok(())
    }
    /// Every staged task made pending from `now_ms`, for the forwarder to
    /// publish by what remains of its delay into a chain without a release
    /// stage (`migrate-topology` onto one); how many.
    pub async fn forward_staged(&self, now_ms: u64) -> Result<u64, LedgerError> {
        let forwarded = on_pool!(&self.pool, p => sqlx::query(sql::FORWARD_STAGED)
            .bind(db_ms(now_ms))
            .execute(p)
            .await
            .map(|done| done.rows_affected()))
        .context("making staged tasks pending")?;
        Ok(forwarded)
    }
}
