//! Group commit: the request path's writes, batched into one transaction.
//!
//! Every write is a message to a single writer task, answered once the
//! transaction holding it has committed. While one transaction commits, the
//! writes of every request that arrives meanwhile queue up, and the next
//! transaction takes them all: one commit (and one fsync) per group, not per
//! task, so the ledger keeps up with the broker instead of becoming the limit.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use prometheus_client::metrics::histogram::Histogram;
use sqlx::QueryBuilder;
use tokio::sync::{mpsc, oneshot};
use tracing::error;

use super::record::{COLUMNS, INSERT_COLUMNS};
use super::{Pool, QueryContext, StoreError, TaskRecord, db_ms, on_pool};
use crate::task::epoch_ms;

/// Most writes in one transaction; also bounds the statement's parameters
/// (17 per row) well below both backends' limits.
const MAX_GROUP: usize = 512;
/// Writes that may wait for the writer before callers wait to enqueue.
const QUEUE: usize = 8 * MAX_GROUP;

/// What admitting a task found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Recorded as pending: the caller publishes it now.
    New,
    /// This request was accepted before: answer what it got, schedule nothing.
    Replay(TaskRecord),
    /// Its idempotency key or id belongs to a different request.
    Conflict(TaskRecord),
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

enum Write {
    Admit {
        record: Box<TaskRecord>,
        reply: Reply<Admission>,
    },
    Published {
        id: String,
        reply: Reply<()>,
    },
    Retry {
        id: String,
        retry: Retry,
        reply: Reply<()>,
    },
    Failed {
        id: String,
        reason: String,
        reply: Reply<()>,
    },
}

/// A failed publish, recorded so the forwarder retries the task later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retry {
    /// The forwarder takes the task from then on.
    pub retry_at_ms: u64,
    pub error: String,
    /// From now on, publish the task only alone.
    pub publish_alone: bool,
    /// The broker refused it while it was alone: one more refusal.
    pub refused: bool,
}

#[derive(Clone)]
pub(super) struct Handle {
    writes: mpsc::Sender<Write>,
}

pub(super) fn spawn(pool: Pool, payload_copy_bytes: u32, group_sizes: Histogram) -> Handle {
    let (writes, queue) = mpsc::channel(QUEUE);
    tokio::spawn(run(pool, queue, payload_copy_bytes, group_sizes));
    Handle { writes }
}

impl Handle {
    async fn send<T>(&self, write: impl FnOnce(Reply<T>) -> Write) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.writes
            .send(write(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    pub async fn admit(&self, record: TaskRecord) -> Result<Admission, StoreError> {
        self.send(|reply| Write::Admit {
            record: Box::new(record),
            reply,
        })
        .await
    }

    pub async fn published(&self, id: String) -> Result<(), StoreError> {
        self.send(|reply| Write::Published { id, reply }).await
    }

    pub async fn retry(&self, id: String, retry: Retry) -> Result<(), StoreError> {
        self.send(|reply| Write::Retry { id, retry, reply }).await
    }

    pub async fn failed(&self, id: String, reason: String) -> Result<(), StoreError> {
        self.send(|reply| Write::Failed { id, reason, reply }).await
    }
}

async fn run(
    pool: Pool,
    mut queue: mpsc::Receiver<Write>,
    payload_copy_bytes: u32,
    group_sizes: Histogram,
) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while queue.recv_many(&mut group, MAX_GROUP).await > 0 {
        group_sizes.observe(group.len() as f64);
        commit(&pool, std::mem::take(&mut group), payload_copy_bytes).await;
    }
}

/// One group, split by kind; each keeps its callers' reply channels.
#[derive(Default)]
struct Group {
    admits: Vec<(Box<TaskRecord>, Reply<Admission>)>,
    published: Vec<(String, Reply<()>)>,
    retries: Vec<(String, Retry, Reply<()>)>,
    failed: Vec<(String, String, Reply<()>)>,
}

async fn commit(pool: &Pool, writes: Vec<Write>, payload_copy_bytes: u32) {
    let mut group = Group::default();
    for write in writes {
        match write {
            Write::Admit { record, reply } => group.admits.push((record, reply)),
            Write::Published { id, reply } => group.published.push((id, reply)),
            Write::Retry { id, retry, reply } => group.retries.push((id, retry, reply)),
            Write::Failed { id, reason, reply } => group.failed.push((id, reason, reply)),
        }
    }
    match transact(pool, &group, payload_copy_bytes).await {
        Ok(admissions) => {
            for ((_, reply), admission) in group.admits.into_iter().zip(admissions) {
                let _ = reply.send(Ok(admission));
            }
            for (_, reply) in group.published {
                let _ = reply.send(Ok(()));
            }
            let replies = group.retries.into_iter().map(|(.., reply)| reply);
            for reply in replies.chain(group.failed.into_iter().map(|(.., reply)| reply)) {
                let _ = reply.send(Ok(()));
            }
        }
        Err(failure) => {
            error!(error = %failure, "ledger write failed");
            let failure = Arc::new(failure);
            let shared = || StoreError::Shared(failure.clone());
            for (_, reply) in group.admits {
                let _ = reply.send(Err(shared()));
            }
            for (_, reply) in group.published {
                let _ = reply.send(Err(shared()));
            }
            let replies = group.retries.into_iter().map(|(.., reply)| reply);
            for reply in replies.chain(group.failed.into_iter().map(|(.., reply)| reply)) {
                let _ = reply.send(Err(shared()));
            }
        }
    }
}

/// Largest rows per statement. Statements come in a few fixed sizes (this and
/// the powers of two below it) so that each is prepared once and then reused
/// from the statement cache, instead of one new statement per group size.
const CHUNK: usize = 64;

fn statement_sized_chunks<T>(items: &[T]) -> Vec<&[T]> {
    let mut chunks = Vec::new();
    let mut rest = items;
    while !rest.is_empty() {
        let size = if rest.len() >= CHUNK {
            CHUNK
        } else {
            1 << rest.len().ilog2()
        };
        let (chunk, tail) = rest.split_at(size);
        chunks.push(chunk);
        rest = tail;
    }
    chunks
}

/// A retry of a request accepted before, or another request under its key.
fn judge(new: &TaskRecord, existing: TaskRecord) -> Admission {
    let same_request = new.fingerprint.is_some()
        && existing.fingerprint == new.fingerprint
        && existing.idempotency_key == new.idempotency_key;
    if same_request {
        Admission::Replay(existing)
    } else {
        Admission::Conflict(existing)
    }
}

/// Decides, in order, which records of the group are new and which repeat
/// an earlier one of the same group; only the first kind goes to the INSERT.
fn dedupe_in_group(records: &[&TaskRecord]) -> Vec<Option<Admission>> {
    let mut first_by_key: HashMap<&str, usize> = HashMap::new();
    let mut first_by_id: HashMap<&str, usize> = HashMap::new();
    let mut decided = Vec::with_capacity(records.len());
    for (index, record) in records.iter().enumerate() {
        let earlier = record
            .idempotency_key
            .as_deref()
            .and_then(|key| first_by_key.get(key))
            .or_else(|| first_by_id.get(record.id.as_str()))
            .copied();
        match earlier {
            Some(earlier) => decided.push(Some(judge(record, records[earlier].clone()))),
            None => {
                if let Some(key) = record.idempotency_key.as_deref() {
                    first_by_key.insert(key, index);
                }
                first_by_id.insert(&record.id, index);
                decided.push(None);
            }
        }
    }
    decided
}

async fn transact(
    pool: &Pool,
    group: &Group,
    payload_copy_bytes: u32,
) -> Result<Vec<Admission>, StoreError> {
    let records: Vec<&TaskRecord> = group.admits.iter().map(|(r, _)| r.as_ref()).collect();
    let mut decided = dedupe_in_group(&records);
    let fresh: Vec<&TaskRecord> = records
        .iter()
        .zip(&decided)
        .filter(|(_, d)| d.is_none())
        .map(|(r, _)| *r)
        .collect();
    let now_ms = db_ms(epoch_ms(std::time::SystemTime::now()));
    // SQLite's substr and PostgreSQL's substring of bytea both count bytes.
    let copy_bytes = i32::try_from(payload_copy_bytes).unwrap_or(i32::MAX);
    let lookup_by_key = format!("SELECT {COLUMNS} FROM tasks WHERE idempotency_key = $1");
    let lookup_by_id = format!("SELECT {COLUMNS} FROM tasks WHERE id = $1");

    on_pool!(pool, p => async {
        let mut tx = p.begin().await.context("starting a transaction")?;
        if !fresh.is_empty() {
            let mut inserted: HashSet<String> = HashSet::with_capacity(fresh.len());
            for chunk in statement_sized_chunks(&fresh) {
                let mut insert = QueryBuilder::new(format!("INSERT INTO tasks ({INSERT_COLUMNS}) "));
                insert.push_values(chunk, |mut row, r| {
                    row.push_bind(&r.id)
                        .push_bind(&r.idempotency_key)
                        .push_bind(&r.fingerprint)
                        .push_bind(&r.destination)
                        .push_bind(&r.routing_key)
                        .push_bind(r.delay_ms)
                        .push_bind(r.deliver_at_ms)
                        .push_bind(&r.content_type)
                        .push_bind(&r.headers)
                        .push_bind(&r.payload)
                        .push_bind(r.payload_bytes)
                        .push_bind(&r.state)
                        .push_bind(r.created_at_ms)
                        .push_bind(r.published_at_ms)
                        .push_bind(r.next_attempt_at_ms)
                        .push_bind(r.attempts)
                        .push_bind(&r.last_error);
                });
                insert.push(" ON CONFLICT DO NOTHING RETURNING id");
                let ids: Vec<String> = insert
                    .build_query_scalar()
                    .fetch_all(&mut *tx)
                    .await
                    .context("recording tasks")?;
                inserted.extend(ids);
            }
            for (record, decision) in records.iter().zip(decided.iter_mut()) {
                if decision.is_some() || inserted.contains(&record.id) {
                    continue;
                }
                // Someone else holds the key or the id: find out who.
                let mut existing = None;
                if let Some(key) = &record.idempotency_key {
                    existing = sqlx::query_as(&lookup_by_key)
                        .bind(key)
                        .fetch_optional(&mut *tx)
                        .await
                        .context("looking up an idempotency key")?;
                }
                if existing.is_none() {
                    existing = sqlx::query_as(&lookup_by_id)
                        .bind(&record.id)
                        .fetch_optional(&mut *tx)
                        .await
                        .context("looking up a task id")?;
                }
                let existing = existing.ok_or_else(|| StoreError::Corrupt {
                    id: record.id.clone(),
                    reason: "conflicting row vanished; retry the request".to_owned(),
                })?;
                *decision = Some(judge(record, existing));
            }
        }
        let published: Vec<&String> = group.published.iter().map(|(id, _)| id).collect();
        for chunk in statement_sized_chunks(&published) {
            let mut update = QueryBuilder::new(
                "UPDATE tasks SET state = 'published', last_error = NULL, published_at_ms = ",
            );
            update
                .push_bind(now_ms)
                .push(", payload = CASE WHEN ")
                .push_bind(copy_bytes)
                .push(" = 0 THEN NULL ELSE substr(payload, 1, ")
                .push_bind(copy_bytes)
                .push(") END WHERE state = 'pending' AND id IN (");
            let mut ids = update.separated(", ");
            for id in chunk {
                ids.push_bind(*id);
            }
            update.push(")");
            update
                .build()
                .execute(&mut *tx)
                .await
                .context("marking tasks published")?;
        }
        for (id, retry, _) in &group.retries {
            sqlx::query(
                "UPDATE tasks SET next_attempt_at_ms = $1, last_error = $2, \
                 publish_alone = CASE WHEN $3 = 1 THEN 1 ELSE publish_alone END, \
                 refusals = refusals + $4 \
                 WHERE id = $5 AND state = 'pending'",
            )
            .bind(db_ms(retry.retry_at_ms))
            .bind(&retry.error)
            .bind(i64::from(retry.publish_alone))
            .bind(i64::from(retry.refused))
            .bind(id)
            .execute(&mut *tx)
            .await
            .context("scheduling a retry")?;
        }
        for (id, reason, _) in &group.failed {
            sqlx::query(
                "UPDATE tasks SET state = 'failed', last_error = $1 \
                 WHERE id = $2 AND state IN ('pending', 'published')",
            )
            .bind(reason)
            .bind(id)
            .execute(&mut *tx)
            .await
            .context("marking a task failed")?;
        }
        tx.commit().await.context("committing")?;
        Ok(decided
            .into_iter()
            .map(|d| d.unwrap_or(Admission::New))
            .collect())
    }
    .await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, key: Option<&str>, fingerprint: &str) -> TaskRecord {
        TaskRecord {
            id: id.into(),
            idempotency_key: key.map(Into::into),
            fingerprint: Some(fingerprint.into()),
            destination: "d".into(),
            routing_key: "0.d".into(),
            delay_ms: 0,
            deliver_at_ms: 0,
            content_type: "application/json".into(),
            headers: "{}".into(),
            payload: Some(vec![]),
            payload_bytes: 0,
            state: "pending".into(),
            created_at_ms: 0,
            published_at_ms: None,
            next_attempt_at_ms: 0,
            attempts: 1,
            last_error: None,
            publish_alone: 0,
            refusals: 0,
        }
    }

    #[test]
    fn chunks_come_in_few_sizes_and_keep_every_item_in_order() {
        for n in 0..=300 {
            let items: Vec<usize> = (0..n).collect();
            let chunks = statement_sized_chunks(&items);
            assert!(
                chunks
                    .iter()
                    .all(|c| c.len().is_power_of_two() && c.len() <= CHUNK)
            );
            assert_eq!(chunks.concat(), items);
            assert!(chunks.len() <= n / CHUNK + CHUNK.ilog2() as usize + 1);
        }
    }

    #[test]
    fn repeats_within_one_group_are_judged_against_the_first() {
        let first = record("a", Some("k"), "f1");
        let replay = record("b", Some("k"), "f1");
        let conflict = record("c", Some("k"), "f2");
        let same_id = record("a", None, "f1");
        let other = record("d", None, "f3");
        let decided = dedupe_in_group(&[&first, &replay, &conflict, &same_id, &other]);
        assert_eq!(
            decided,
            [
                None,
                Some(Admission::Replay(first.clone())),
                Some(Admission::Conflict(first.clone())),
                // Same id, but the first came with a key this one lacks.
                Some(Admission::Conflict(first.clone())),
                None,
            ]
        );
    }
}
