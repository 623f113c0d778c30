//! Retry policies set at run time, as the ledger stores them (the
//! `retry_policies`, `retry_policy_queues` and `retry_policy_changes`
//! tables, written only here).
//!
//! The ledger does not read a policy: it keeps the text it is given (a
//! `[[retry]]` section's JSON) and the queues it covers. Each queue's row is
//! its claim, taken in the transaction that sets the policy: two replicas
//! setting two policies on one queue at once cannot both succeed. Every
//! change is kept beside, with who made it and when.

use super::error::{LedgerError, QueryContext};
use super::handle::Ledger;
use super::pass::ms;
use super::record::db_ms;

/// A policy as stored: its text, the queues it claims, who changed it last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRetryPolicy {
    pub name: String,
    /// The policy as it was given (the JSON of a `[[retry]]` section).
    pub settings: String,
    pub queues: Vec<String>,
    pub changed_by: Option<String>,
    pub created_at_ms: u64,
    pub changed_at_ms: u64,
}

/// One change to a stored policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicyChange {
    pub policy: String,
    /// `created`, `changed` or `removed`.
    pub change: String,
    /// The policy as it became; `None` when removed.
    pub settings: Option<String>,
    pub changed_by: Option<String>,
    pub at_ms: u64,
}

/// What setting a policy did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyPut {
    Created,
    Changed,
    /// The same text was stored already: nothing written.
    Unchanged,
    /// Nothing written: `queue` is claimed by policy `policy`.
    QueueTaken {
        queue: String,
        policy: String,
    },
}

/// One statement, so a policy and its queues are read as of one moment.
const SELECT_POLICIES: &str = "SELECT p.name, p.settings, p.changed_by, p.created_at_ms, \
     p.changed_at_ms, q.queue FROM retry_policies p \
     LEFT JOIN retry_policy_queues q ON q.policy = p.name ORDER BY p.name, q.queue";
const SELECT_ONE: &str = "SELECT settings FROM retry_policies WHERE name = $1";
const RELEASE_QUEUES: &str = "DELETE FROM retry_policy_queues WHERE policy = $1";
const CLAIM_QUEUE: &str = "INSERT INTO retry_policy_queues (queue, policy) VALUES ($1, $2) \
     ON CONFLICT (queue) DO NOTHING RETURNING queue";
const CLAIMED_BY: &str = "SELECT policy FROM retry_policy_queues WHERE queue = $1";
const UPSERT_POLICY: &str = "INSERT INTO retry_policies \
     (name, settings, changed_by, created_at_ms, changed_at_ms) VALUES ($1, $2, $3, $4, $4) \
     ON CONFLICT (name) DO UPDATE SET settings = excluded.settings, \
     changed_by = excluded.changed_by, changed_at_ms = excluded.changed_at_ms";
const DELETE_POLICY: &str = "DELETE FROM retry_policies WHERE name = $1 RETURNING name";
const RECORD_CHANGE: &str = "INSERT INTO retry_policy_changes \
     (policy, change, settings, changed_by, at_ms) VALUES ($1, $2, $3, $4, $5)";
const SELECT_CHANGES: &str = "SELECT policy, change, settings, changed_by, at_ms \
     FROM retry_policy_changes ORDER BY id DESC LIMIT $1";

type PolicyRow = (String, String, Option<String>, i64, i64, Option<String>);
type ChangeRow = (String, String, Option<String>, Option<String>, i64);

impl Ledger {
    /// Every stored policy, by name, with the queues it claims.
    pub async fn retry_policies(&self) -> Result<Vec<StoredRetryPolicy>, LedgerError> {
        let rows: Vec<PolicyRow> = on_pool!(&self.pool, p => {
            sqlx::query_as(SELECT_POLICIES).fetch_all(p).await
        })
        .context("reading retry policies")?;
        let mut policies: Vec<StoredRetryPolicy> = Vec::new();
        for (name, settings, changed_by, created, changed, queue) in rows {
            // A policy's rows come together (ordered by name), one per queue.
            if policies.last().is_none_or(|last| last.name != name) {
                policies.push(StoredRetryPolicy {
                    name,
                    settings,
                    queues: Vec::new(),
                    changed_by,
                    created_at_ms: ms(created),
                    changed_at_ms: ms(changed),
                });
            }
            if let (Some(policy), Some(queue)) = (policies.last_mut(), queue) {
                policy.queues.push(queue);
            }
        }
        Ok(policies)
    }

    /// Stores `policy` (its `created_at_ms` unused: a change keeps the
    /// first), claiming its queues and releasing those it no longer covers,
    /// and records the change; all or nothing.
    pub async fn put_retry_policy(
        &self,
        policy: &StoredRetryPolicy,
    ) -> Result<PolicyPut, LedgerError> {
        let at = db_ms(policy.changed_at_ms);
        let put = in_tx!(&self.pool, tx => {
            let before: Option<String> = sqlx::query_scalar(SELECT_ONE)
                .bind(&policy.name)
                .fetch_optional(&mut *tx)
                .await
                .context("reading a retry policy")?;
            if before.as_deref() == Some(policy.settings.as_str()) {
                return Ok(PolicyPut::Unchanged);
            }
            sqlx::query(RELEASE_QUEUES).bind(&policy.name).execute(&mut *tx).await
                .context("releasing a retry policy's queues")?;
            for queue in &policy.queues {
                let claimed: Option<String> = sqlx::query_scalar(CLAIM_QUEUE)
                    .bind(queue)
                    .bind(&policy.name)
                    .fetch_optional(&mut *tx)
                    .await
                    .context("claiming a queue for a retry policy")?;
                if claimed.is_none() {
                    let holder: Option<String> = sqlx::query_scalar(CLAIMED_BY)
                        .bind(queue)
                        .fetch_optional(&mut *tx)
                        .await
                        .context("reading a queue's retry policy")?;
                    // Returning drops the transaction: rolled back.
                    return Ok(PolicyPut::QueueTaken {
                        queue: queue.clone(),
                        policy: holder.unwrap_or_default(),
                    });
                }
            }
            sqlx::query(UPSERT_POLICY)
                .bind(&policy.name)
                .bind(&policy.settings)
                .bind(&policy.changed_by)
                .bind(at)
                .execute(&mut *tx)
                .await
                .context("storing a retry policy")?;
            let put = match before {
                None => PolicyPut::Created,
                Some(_) => PolicyPut::Changed,
            };
            let change = if put == PolicyPut::Created { "created" } else { "changed" };
            sqlx::query(RECORD_CHANGE)
                .bind(&policy.name)
                .bind(change)
                .bind(&policy.settings)
                .bind(&policy.changed_by)
                .bind(at)
                .execute(&mut *tx)
                .await
                .context("recording a retry policy's change")?;
            put
        });
        Ok(put)
    }

    /// Removes policy `name`, releasing its queues, and records it; whether
    /// there was one.
    pub async fn delete_retry_policy(
        &self,
        name: &str,
        changed_by: Option<&str>,
        now_ms: u64,
    ) -> Result<bool, LedgerError> {
        let deleted = in_tx!(&self.pool, tx => {
            let deleted: Option<String> = sqlx::query_scalar(DELETE_POLICY)
                .bind(name)
                .fetch_optional(&mut *tx)
                .await
                .context("removing a retry policy")?;
            if deleted.is_some() {
                sqlx::query(RELEASE_QUEUES).bind(name).execute(&mut *tx).await
                    .context("releasing a retry policy's queues")?;
                sqlx::query(RECORD_CHANGE)
                    .bind(name)
                    .bind("removed")
                    .bind(None::<String>)
                    .bind(changed_by)
                    .bind(db_ms(now_ms))
                    .execute(&mut *tx)
                    .await
                    .context("recording a retry policy's change")?;
            }
            deleted.is_some()
        });
        Ok(deleted)
    }

    /// The last `limit` changes to stored policies, newest first.
    pub async fn retry_policy_changes(
        &self,
        limit: u32,
    ) -> Result<Vec<RetryPolicyChange>, LedgerError> {
        let rows: Vec<ChangeRow> = on_pool!(&self.pool, p => sqlx::query_as(SELECT_CHANGES)
            .bind(i64::from(limit))
            .fetch_all(p)
            .await)
        .context("reading retry policies' changes")?;
        Ok(rows
            .into_iter()
            .map(
                |(policy, change, settings, changed_by, at)| RetryPolicyChange {
                    policy,
                    change,
                    settings,
                    changed_by,
                    at_ms: ms(at),
                },
            )
            .collect())
    }
}
