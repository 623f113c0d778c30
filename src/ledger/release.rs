//! What the release stage and the operator's commands record about due
//! tasks: claims and holds for a release limit (group-committed, see
//! [`super::claim`]), deliveries,
//! unroutable releases and their requeue, which copies a migration must
//! not deliver, and the tasks the release stage never saw.

use std::collections::HashMap;

use super::claim::{ClaimAsk, Finding};
use super::error::{LedgerError, QueryContext};
use super::handle::Ledger;
use super::pass::PassInput;
use super::record::{Row, StoredTask, db_ms, decode_all};
use super::sql;
use crate::task::TaskState;

/// A task that expired: its deadline passed before it was published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expiry {
    pub id: String,
    /// The revision that expired (a newer one, moved since, stays).
    pub revision: u64,
    /// When, epoch milliseconds.
    pub at_ms: u64,
    /// Why, and where its message went instead, in the ledger's words.
    pub why: String,
}

impl Ledger {
    /// Takes each task asked about at the release stage: a task that is
    /// neither cancelled nor delivered, in the revision its message
    /// carries, becomes `releasing`, or, when its ask names a release
    /// limit, `waiting` for that limit ([`Finding::Waiting`]) unless
    /// `limits` are given and let it go now (see `claim::hold_claimed`).
    /// Group-committed with the request path's writes (several windows of
    /// due tasks, and the deliveries of earlier ones, share one commit).
    /// The findings answer the asks in their order.
    pub async fn claim_release(
        &self,
        asks: Vec<ClaimAsk>,
        limits: Option<PassInput>,
    ) -> Result<Vec<Finding>, LedgerError> {
        self.writes.claim(asks, limits.map(Box::new)).await
    }

    /// For each task whose older copies must not be delivered, the lowest
    /// revision still to deliver: a moved task's current one, `u64::MAX` for
    /// a cancelled task (for `migrate-topology`).
    pub async fn superseded(&self) -> Result<HashMap<String, u64>, LedgerError> {
        let rows: Vec<(String, String, i64)> =
            on_pool!(&self.pool, p => sqlx::query_as(sql::SUPERSEDED).fetch_all(p).await)
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

    /// Tasks still `scheduled` that fell due in [`from_ms`, `to_ms`):
    /// their message never reached the release stage, which marks every
    /// task it takes. Each becomes `pending` at once (for the forwarder to
    /// publish again) with `reason` as its last error. Returns their ids.
    /// Looked for first by a read: most spans hold none, and a write would
    /// take the lock the group writer commits with. `through`, the 1-based
    /// position of a level's digit in the routing key, narrows them to the
    /// tasks that passed that level; 0 takes all.
    pub async fn resend_unreleased(
        &self,
        (from_ms, to_ms): (u64, u64),
        through: u32,
        now_ms: u64,
        reason: &str,
    ) -> Result<Vec<String>, LedgerError> {
        let through = i32::try_from(through).unwrap_or(0);
        let any: Option<(String,)> = on_pool!(&self.pool, p => sqlx::query_as(sql::ANY_UNRELEASED)
            .bind(db_ms(from_ms))
            .bind(db_ms(to_ms))
            .bind(through)
            .fetch_optional(p)
            .await)
        .context("looking for tasks the release stage never saw")?;
        if any.is_none() {
            return Ok(Vec::new());
        }
        let ids: Vec<(String,)> = on_pool!(&self.pool, p => sqlx::query_as(sql::RESEND_UNRELEASED)
            .bind(db_ms(now_ms))
            .bind(reason)
            .bind(db_ms(from_ms))
            .bind(db_ms(to_ms))
            .bind(through)
            .fetch_all(p)
            .await)
        .context("publishing again the tasks the release stage never saw")?;
        self.pending.add(ids.len() as u64);
        Ok(ids.into_iter().map(|(id,)| id).collect())
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
        let mut marked = 0;
        for (id, revision) in released {
            let done = on_pool!(&self.pool, p => sqlx::query(sql::MARK_UNROUTABLE)
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
    /// only come after this commit), from `now_ms`. Returns how many.
    pub async fn requeue_unroutable(&self, now_ms: u64) -> Result<u64, LedgerError> {
        on_pool!(&self.pool, p => sqlx::query(sql::REQUEUE_UNROUTABLE)
            .bind(db_ms(now_ms))
            .execute(p)
            .await
            .map(|done| done.rows_affected()))
        .context("counting unroutable tasks as delivered again")
    }

    /// Tasks whose deadline passed before they were published to their
    /// destination: each `expired` as its [`Expiry`] says, unless it
    /// reached a final state first (a task delivered is never also
    /// expired). How many changed. A statement each (each has its own
    /// reason), all in one transaction: one commit (and, on SQLite, one
    /// fsync) for a take's expired tasks, not one a task: a burst whose
    /// deadlines passed while delayline was stopped is many of them.
    pub async fn mark_expired(&self, tasks: &[Expiry]) -> Result<u64, LedgerError> {
        if tasks.is_empty() {
            return Ok(0);
        }
        let marked = in_tx!(&self.pool, t => {
            let mut marked = 0;
            for task in tasks {
                marked += sqlx::query(sql::MARK_EXPIRED)
                    .bind(db_ms(task.at_ms))
                    .bind(&task.why)
                    .bind(&task.id)
                    .bind(db_ms(task.revision))
                    .execute(&mut *t)
                    .await
                    .context("marking tasks expired")?
                    .rows_affected();
            }
            marked
        });
        Ok(marked)
    }

    /// Whether any waiting task's deadline passed before `now_ms`: a read,
    /// so that the limiter's sweep takes no write lock (which the group
    /// writer needs) unless there is something to write.
    pub async fn any_waiting_past_deadline(&self, now_ms: u64) -> Result<bool, LedgerError> {
        let any: Option<String> = on_pool!(&self.pool, p =>
            sqlx::query_scalar(sql::ANY_WAITING_PAST_DEADLINE)
            .bind(db_ms(now_ms))
            .fetch_optional(p)
            .await)
        .context("looking for waiting tasks past their deadline")?;
        Ok(any.is_some())
    }

    /// Waiting tasks whose deadline passed before `now_ms` (their limit
    /// paused, or its backlog too long) become `expired`: the limit of
    /// each.
    pub async fn expire_waiting(&self, now_ms: u64) -> Result<Vec<String>, LedgerError> {
        let limits: Vec<Option<String>> = on_pool!(&self.pool, p =>
            sqlx::query_scalar(sql::EXPIRE_WAITING)
            .bind(db_ms(now_ms))
            .fetch_all(p)
            .await)
        .context("expiring waiting tasks past their deadline")?;
        Ok(limits.into_iter().flatten().collect())
    }

    /// At most `most` waiting tasks whose deadline passed before `now_ms`
    /// and whose message goes to an expired destination, taken under a
    /// lease until `lease_until_ms` (as the limiter's releases are) for it
    /// to be sent there.
    pub async fn take_waiting_past_deadline(
        &self,
        now_ms: u64,
        lease_until_ms: u64,
        most: u32,
    ) -> Result<Vec<StoredTask>, LedgerError> {
        let sql = sql::take_waiting_past_deadline();
        let rows: Vec<Row> = on_pool!(&self.pool, p => sqlx::query_as(&sql)
            .bind(db_ms(now_ms))
            .bind(db_ms(lease_until_ms))
            .bind(self.holder)
            .bind(i64::from(most))
            .fetch_all(p)
            .await)
        .context("taking waiting tasks past their deadline")?;
        decode_all(rows)
    }

    /// The tasks the release stage delivered, confirmed by the business
    /// exchange at `at_ms` (group-committed with the request path's writes).
    pub async fn mark_delivered(&self, ids: Vec<String>, at_ms: u64) -> Result<(), LedgerError> {
        self.writes.delivered(ids, at_ms).await
    }
}
