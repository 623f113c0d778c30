//! Group commit: the request path's and the release stage's writes, batched
//! into one transaction.
//!
//! Every write is a message to a single writer task, answered once the
//! transaction holding it has committed. While one transaction commits, the
//! writes of every request that arrives meanwhile queue up, and the next
//! transaction takes them all: one commit (and one fsync) per group, not per
//! task, so the ledger keeps up with the broker instead of becoming the limit.
//!
//! A group's transaction runs in steps, each in [`Tx`]: admit the new tasks
//! (decide repeats within the group, insert the rest in chunks, find who holds
//! a key or id that was taken), mark the confirmed ones scheduled (in the
//! revision confirmed), schedule retries, quarantine, mark released tasks
//! delivered, and claim the release stage's due tasks. The SQL of each step
//! is built by a pure function ([`sql`]), checked without a database.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use prometheus_client::metrics::histogram::Histogram;
use sqlx::{Postgres, Sqlite, Transaction};
use tokio::sync::{mpsc, oneshot};
use tracing::error;

use super::lifecycle::Finding;
use super::record::{INSERT_COLUMNS, Row, StoredTask};
use super::{LedgerError, PendingCount, Pool, QueryContext, db_ms};
use crate::task::{TaskState, epoch_ms};

/// Most writes in one transaction.
const MAX_GROUP: usize = 512;
/// Writes that may wait for the writer before callers wait to enqueue.
const QUEUE: usize = 8 * MAX_GROUP;

/// What admitting a task found.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// Recorded as pending: the caller publishes it now.
    New,
    /// This request was accepted before: answer what it got, schedule nothing.
    Replay(StoredTask),
    /// Its idempotency key or id belongs to a different request.
    Conflict(StoredTask),
}

/// An admission decided on rows, before the existing row is decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Judged {
    New,
    Replay(Row),
    Conflict(Row),
}

impl Judged {
    fn into_admission(self) -> Result<Admission, LedgerError> {
        Ok(match self {
            Judged::New => Admission::New,
            Judged::Replay(row) => Admission::Replay(row.decode()?),
            Judged::Conflict(row) => Admission::Conflict(row.decode()?),
        })
    }
}

type Reply<T> = oneshot::Sender<Result<T, LedgerError>>;

enum Write {
    Admit {
        row: Box<Row>,
        reply: Reply<Admission>,
    },
    Published {
        id: String,
        revision: u64,
        reply: Reply<()>,
    },
    Retry {
        id: String,
        revision: u64,
        retry: Retry,
        reply: Reply<()>,
    },
    Failed {
        id: String,
        /// Only this revision; any revision when `None`.
        revision: Option<u64>,
        reason: String,
        reply: Reply<()>,
    },
    Delivered {
        ids: Vec<String>,
        at_ms: u64,
        reply: Reply<()>,
    },
    Claim {
        due: Due,
        reply: Reply<Vec<Finding>>,
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

/// Starts the writer. It keeps `pending` up to date with what it commits.
/// The payload is cut down to `payload_copy_bytes` when a task is published,
/// or, with `keep_payload_until_delivered` (the release stage, where a
/// scheduled task may be moved and published again), when it is delivered.
pub(super) fn spawn(
    pool: Pool,
    payload_copy_bytes: u32,
    keep_payload_until_delivered: bool,
    group_sizes: Histogram,
    pending: Arc<PendingCount>,
) -> Handle {
    let (writes, queue) = mpsc::channel(QUEUE);
    let writer = Writer {
        pool,
        payload_copy_bytes,
        keep_payload_until_delivered,
        group_sizes,
        pending,
    };
    tokio::spawn(writer.run(queue));
    Handle { writes }
}

impl Handle {
    async fn send<T>(&self, write: impl FnOnce(Reply<T>) -> Write) -> Result<T, LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.writes
            .send(write(reply))
            .await
            .map_err(|_| LedgerError::Closed)?;
        answer.await.map_err(|_| LedgerError::Closed)?
    }

    pub async fn admit(&self, row: Row) -> Result<Admission, LedgerError> {
        self.send(|reply| Write::Admit {
            row: Box::new(row),
            reply,
        })
        .await
    }

    pub async fn published(&self, id: String, revision: u64) -> Result<(), LedgerError> {
        self.send(|reply| Write::Published {
            id,
            revision,
            reply,
        })
        .await
    }

    pub async fn retry(&self, id: String, revision: u64, retry: Retry) -> Result<(), LedgerError> {
        self.send(|reply| Write::Retry {
            id,
            revision,
            retry,
            reply,
        })
        .await
    }

    pub async fn failed(
        &self,
        id: String,
        revision: Option<u64>,
        reason: String,
    ) -> Result<(), LedgerError> {
        self.send(|reply| Write::Failed {
            id,
            revision,
            reason,
            reply,
        })
        .await
    }

    pub async fn delivered(&self, ids: Vec<String>, at_ms: u64) -> Result<(), LedgerError> {
        self.send(|reply| Write::Delivered { ids, at_ms, reply })
            .await
    }

    pub async fn claim(&self, due: Due) -> Result<Vec<Finding>, LedgerError> {
        self.send(|reply| Write::Claim { due, reply }).await
    }
}

/// One group, split by kind; each keeps its callers' reply channels.
#[derive(Default)]
struct Group {
    admits: Vec<(Box<Row>, Reply<Admission>)>,
    published: Vec<((String, i64), Reply<()>)>,
    retries: Vec<(String, u64, Retry, Reply<()>)>,
    failed: Vec<(String, Option<u64>, String, Reply<()>)>,
    delivered: Vec<(Vec<String>, u64, Reply<()>)>,
    claims: Vec<(Due, Reply<Vec<Finding>>)>,
}

/// Tasks due at the release stage, each with the revision its message carries.
type Due = Vec<(String, u64)>;

/// What a committed group decided: for each admission, and for each claim.
#[derive(Default)]
struct Decided {
    admissions: Vec<Judged>,
    claims: Vec<Vec<Finding>>,
}

impl Group {
    fn of(writes: Vec<Write>) -> Group {
        let mut group = Group::default();
        for write in writes {
            match write {
                Write::Admit { row, reply } => group.admits.push((row, reply)),
                Write::Published {
                    id,
                    revision,
                    reply,
                } => group.published.push(((id, db_ms(revision)), reply)),
                Write::Retry {
                    id,
                    revision,
                    retry,
                    reply,
                } => group.retries.push((id, revision, retry, reply)),
                Write::Failed {
                    id,
                    revision,
                    reason,
                    reply,
                } => group.failed.push((id, revision, reason, reply)),
                Write::Delivered { ids, at_ms, reply } => group.delivered.push((ids, at_ms, reply)),
                Write::Claim { due, reply } => group.claims.push((due, reply)),
            }
        }
        group
    }

    /// Answers every caller: admissions and claims with what was decided
    /// for each, the others with `()`; or everyone with the failure that
    /// broke the group.
    fn answer(self, outcome: Result<Decided, LedgerError>) {
        let (decided, failure) = match outcome {
            Ok(decided) => (decided, None),
            Err(failure) => {
                error!(error = %failure, "ledger write failed");
                (Decided::default(), Some(Arc::new(failure)))
            }
        };
        let Decided { admissions, claims } = decided;
        let result = || match &failure {
            None => Ok(()),
            Some(failure) => Err(LedgerError::Shared(failure.clone())),
        };
        let mut admissions = admissions.into_iter();
        for (_, reply) in self.admits {
            let answer = result().and_then(|()| match admissions.next() {
                Some(judged) => judged.into_admission(),
                None => Err(LedgerError::Closed),
            });
            let _ = reply.send(answer);
        }
        let mut claims = claims.into_iter();
        for (_, reply) in self.claims {
            let answer = result().and_then(|()| claims.next().ok_or(LedgerError::Closed));
            let _ = reply.send(answer);
        }
        let others = (self.published.into_iter().map(|(_, reply)| reply))
            .chain(self.retries.into_iter().map(|(.., reply)| reply))
            .chain(self.failed.into_iter().map(|(.., reply)| reply))
            .chain(self.delivered.into_iter().map(|(.., reply)| reply));
        for reply in others {
            let _ = reply.send(result());
        }
    }
}

struct Writer {
    pool: Pool,
    payload_copy_bytes: u32,
    keep_payload_until_delivered: bool,
    group_sizes: Histogram,
    pending: Arc<PendingCount>,
}

impl Writer {
    async fn run(self, mut queue: mpsc::Receiver<Write>) {
        let mut writes = Vec::with_capacity(MAX_GROUP);
        while queue.recv_many(&mut writes, MAX_GROUP).await > 0 {
            self.group_sizes.observe(writes.len() as f64);
            let group = Group::of(std::mem::take(&mut writes));
            let outcome = self.transact(&group).await;
            group.answer(outcome);
        }
    }

    /// One transaction for the whole group; the pending count follows what
    /// it committed.
    async fn transact(&self, group: &Group) -> Result<Decided, LedgerError> {
        let mut tx = Tx::begin(&self.pool).await?;
        let rows: Vec<&Row> = group.admits.iter().map(|(row, _)| row.as_ref()).collect();
        let admissions = admit(&mut tx, &rows).await?;
        let ids: Vec<(&str, i64)> = group
            .published
            .iter()
            .map(|((id, revision), _)| (id.as_str(), *revision))
            .collect();
        let now_ms = db_ms(epoch_ms(std::time::SystemTime::now()));
        let trim_on_publish = !self.keep_payload_until_delivered;
        let mut published = 0;
        for chunk in statement_sized_chunks(&ids) {
            published += tx
                .mark_published(chunk, now_ms, trim_on_publish, self.payload_copy_bytes)
                .await?;
        }
        for (id, revision, retry, _) in &group.retries {
            tx.schedule_retry(id, *revision, retry).await?;
        }
        let mut failed_pending = 0;
        for (id, revision, reason, _) in &group.failed {
            failed_pending += u64::from(tx.mark_failed(id, *revision, reason).await?);
        }
        for (ids, at_ms, _) in &group.delivered {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            for chunk in statement_sized_chunks(&ids) {
                tx.mark_delivered(chunk, db_ms(*at_ms), self.payload_copy_bytes)
                    .await?;
            }
        }
        let mut claims = Vec::with_capacity(group.claims.len());
        let mut claimed_pending = 0;
        for (due, _) in &group.claims {
            let (findings, were_pending) = claim(&mut tx, due).await?;
            claims.push(findings);
            claimed_pending += were_pending;
        }
        tx.commit().await?;
        let admitted = admissions.iter().filter(|a| **a == Judged::New).count();
        self.pending.add(admitted as u64);
        self.pending
            .remove(published + failed_pending + claimed_pending);
        Ok(Decided { admissions, claims })
    }
}

/// Takes each `(id, revision)` due at the release stage: a task that is
/// neither cancelled nor delivered, in the message's revision, becomes
/// `releasing` (from `pending` first, to count those). The findings follow
/// the order of `due`; also returns how many were pending.
async fn claim(tx: &mut Tx, due: &[(String, u64)]) -> Result<(Vec<Finding>, u64), LedgerError> {
    let pairs: Vec<(&str, i64)> = due
        .iter()
        .map(|(id, revision)| (id.as_str(), db_ms(*revision)))
        .collect();
    let mut claimed: HashSet<String> = HashSet::with_capacity(pairs.len());
    let mut were_pending = 0u64;
    for (from, pending) in [
        ("state = 'pending'", true),
        ("state IN ('scheduled', 'releasing', 'failed')", false),
    ] {
        let open: Vec<(&str, i64)> = pairs
            .iter()
            .copied()
            .filter(|(id, _)| !claimed.contains(*id))
            .collect();
        for chunk in statement_sized_chunks(&open) {
            let ids = tx.claim(from, chunk).await?;
            if pending {
                were_pending += ids.len() as u64;
            }
            claimed.extend(ids);
        }
    }
    let rest: Vec<&str> = pairs
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| !claimed.contains(*id))
        .collect();
    let mut found: HashMap<String, (TaskState, u64)> = HashMap::new();
    for chunk in statement_sized_chunks(&rest) {
        for (id, state, revision) in tx.states(chunk).await? {
            let state = TaskState::parse(&state).ok_or_else(|| LedgerError::Corrupt {
                id: id.clone(),
                reason: format!("unknown state {state:?}"),
            })?;
            found.insert(id, (state, u64::try_from(revision).unwrap_or(0)));
        }
    }
    let findings = due
        .iter()
        .map(|(id, _)| {
            if claimed.contains(id) {
                Finding::Claimed
            } else {
                match found.get(id) {
                    Some(&(state, revision)) => Finding::Found { state, revision },
                    None => Finding::Absent,
                }
            }
        })
        .collect();
    Ok((findings, were_pending))
}

/// Admits the group's new rows: repeats within the group are judged against
/// their first occurrence, the rest inserted; a row whose key or id is taken
/// is judged against the row that holds it.
async fn admit(tx: &mut Tx, rows: &[&Row]) -> Result<Vec<Judged>, LedgerError> {
    let mut decided = dedupe_in_group(rows);
    let fresh: Vec<&Row> = rows
        .iter()
        .zip(&decided)
        .filter(|(_, decision)| decision.is_none())
        .map(|(row, _)| *row)
        .collect();
    let mut inserted: HashSet<String> = HashSet::with_capacity(fresh.len());
    for chunk in statement_sized_chunks(&fresh) {
        inserted.extend(tx.insert(chunk).await?);
    }
    for (row, decision) in rows.iter().zip(decided.iter_mut()) {
        if decision.is_some() || inserted.contains(&row.id) {
            continue;
        }
        let holder = tx
            .holder_of(row)
            .await?
            .ok_or_else(|| LedgerError::Corrupt {
                id: row.id.clone(),
                reason: "conflicting row vanished; retry the request".to_owned(),
            })?;
        *decision = Some(judge(row, holder));
    }
    Ok(decided
        .into_iter()
        .map(|decision| decision.unwrap_or(Judged::New))
        .collect())
}

/// Largest rows per statement. Statements come in a few fixed sizes (this and
/// the powers of two below it) so that each is prepared once and then reused
/// from the statement cache, instead of one new statement per group size.
/// 64 rows of 18 parameters stay far below both backends' limits.
const CHUNK: usize = 64;
// Both backends cap a statement's parameters; SQLite's default is 32,766.
const _: () = assert!(CHUNK * INSERT_COLUMNS.len() < 32_766);

pub(super) fn statement_sized_chunks<T>(items: &[T]) -> Vec<&[T]> {
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
fn judge(new: &Row, existing: Row) -> Judged {
    let same_request = new.fingerprint.is_some()
        && existing.fingerprint == new.fingerprint
        && existing.idempotency_key == new.idempotency_key;
    if same_request {
        Judged::Replay(existing)
    } else {
        Judged::Conflict(existing)
    }
}

/// Decides, in order, which rows of the group are new and which repeat an
/// earlier one of the same group; only the first kind goes to the INSERT.
fn dedupe_in_group(rows: &[&Row]) -> Vec<Option<Judged>> {
    let mut first_by_key: HashMap<&str, usize> = HashMap::new();
    let mut first_by_id: HashMap<&str, usize> = HashMap::new();
    let mut decided = Vec::with_capacity(rows.len());
    for (index, row) in rows.iter().enumerate() {
        let earlier = row
            .idempotency_key
            .as_deref()
            .and_then(|key| first_by_key.get(key))
            .or_else(|| first_by_id.get(row.id.as_str()))
            .copied();
        match earlier {
            Some(earlier) => decided.push(Some(judge(row, rows[earlier].clone()))),
            None => {
                if let Some(key) = row.idempotency_key.as_deref() {
                    first_by_key.insert(key, index);
                }
                first_by_id.insert(&row.id, index);
                decided.push(None);
            }
        }
    }
    decided
}

/// The statements of a group's transaction. Both backends are built the
/// same text: `$N` placeholders, nothing either dialect lacks. SQLite gets
/// it through [`sql::for_sqlite`].
pub(super) mod sql {
    use std::borrow::Cow;

    use super::super::record::{COLUMNS, INSERT_COLUMNS};

    /// The statement SQLite is given: `$N` placeholders that appear once
    /// each, in order, become anonymous `?`.
    ///
    /// Why: sqlx finds the argument of each numbered parameter by its name,
    /// and SQLite looks a name up by walking a list of all of them, so
    /// binding a 64-row insert (over a thousand parameters) took quadratic
    /// time, about a tenth of the service's CPU under load. Anonymous
    /// parameters have no name to look up. A statement that repeats a
    /// number, or numbers out of order, keeps its `$N`: sqlx numbers
    /// anonymous parameters apart from numbered ones, so one statement must
    /// not mix the two.
    pub fn for_sqlite(sql: &str) -> Cow<'_, str> {
        let bytes = sql.as_bytes();
        let mut out = String::with_capacity(sql.len());
        let (mut expected, mut copied, mut at) = (1usize, 0, 0);
        while at < bytes.len() {
            if bytes[at] != b'$' {
                at += 1;
                continue;
            }
            let digits = bytes[at + 1..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            let number = sql[at + 1..at + 1 + digits].parse::<usize>().ok();
            if number != Some(expected) {
                return Cow::Borrowed(sql);
            }
            out.push_str(&sql[copied..at]);
            out.push('?');
            expected += 1;
            at += 1 + digits;
            copied = at;
        }
        if expected == 1 {
            return Cow::Borrowed(sql);
        }
        out.push_str(&sql[copied..]);
        Cow::Owned(out)
    }

    /// `$first, $first+1, …` for `count` parameters.
    pub fn placeholders(first: usize, count: usize) -> String {
        (first..first + count)
            .map(|n| format!("${n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Inserts `rows` new rows (every column of [`INSERT_COLUMNS`], in
    /// order, row after row) and returns the ids it inserted; a row whose id
    /// or idempotency key is taken is skipped, not an error.
    pub fn insert(rows: usize) -> String {
        let width = INSERT_COLUMNS.len();
        let values = (0..rows)
            .map(|row| format!("({})", placeholders(1 + row * width, width)))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "INSERT INTO tasks ({}) VALUES {values} ON CONFLICT DO NOTHING RETURNING id",
            INSERT_COLUMNS.join(", ")
        )
    }

    /// `((id = $first AND revision = $first+1) OR …)` for `pairs` pairs.
    /// Not `(id, revision) IN (VALUES …)`: SQLite scans the whole table for
    /// that, where each term of the OR is a primary-key lookup.
    pub fn id_revision_pairs(first: usize, pairs: usize) -> String {
        let terms = (0..pairs)
            .map(|pair| {
                let id = first + 2 * pair;
                format!("(id = ${id} AND revision = ${})", id + 1)
            })
            .collect::<Vec<_>>()
            .join(" OR ");
        format!("({terms})")
    }

    /// Keeps the first `$copy` bytes of the payload (none when `$copy` is 0);
    /// SQLite's `substr` and PostgreSQL's on `bytea` both count bytes.
    fn trimmed_payload(copy: usize) -> String {
        format!("payload = CASE WHEN ${copy} = 0 THEN NULL ELSE substr(payload, 1, ${copy}) END")
    }

    /// Marks pending tasks scheduled at `$1`, each only in the revision
    /// given (a task moved since waits for its new copy's confirm); with
    /// `trim`, keeps `$2` bytes of the payload. The `(id, revision)` pairs
    /// are `$3…`.
    pub fn mark_published(pairs: usize, trim: bool) -> String {
        let payload = if trim {
            format!(", {}", trimmed_payload(2))
        } else {
            // $2 is bound either way, so that the parameters keep their numbers.
            ", payload = CASE WHEN $2 < 0 THEN NULL ELSE payload END".to_owned()
        };
        format!(
            "UPDATE tasks SET state = 'scheduled', last_error = NULL, published_at_ms = $1{payload} \
             WHERE state = 'pending' AND {}",
            id_revision_pairs(3, pairs)
        )
    }

    /// Marks releasing tasks delivered at `$1`, keeping `$2` bytes of the
    /// payload; the ids are `$3…`. A task the release stage claimed while
    /// still pending (its confirm not yet recorded) carries the error of an
    /// earlier attempt: delivered, it has none.
    pub fn mark_delivered(ids: usize) -> String {
        format!(
            "UPDATE tasks SET state = 'delivered', delivered_at_ms = $1, last_error = NULL, {} \
             WHERE state = 'releasing' AND id IN ({})",
            trimmed_payload(2),
            placeholders(3, ids)
        )
    }

    pub const SCHEDULE_RETRY: &str = "UPDATE tasks SET next_attempt_at_ms = $1, last_error = $2, \
         publish_alone = CASE WHEN $3 = 1 THEN 1 ELSE publish_alone END, \
         refusals = refusals + $4 \
         WHERE id = $5 AND revision = $6 AND state = 'pending'";

    /// Quarantines a task (in revision `$3`, or any when NULL), first if
    /// pending (the count of pending tasks changes), else if scheduled (a
    /// migration set its message aside).
    pub const FAIL_PENDING: &str = "UPDATE tasks SET state = 'failed', last_error = $1 \
         WHERE id = $2 AND ($3 IS NULL OR revision = $3) AND state = 'pending'";
    pub const FAIL_SCHEDULED: &str = "UPDATE tasks SET state = 'failed', last_error = $1 \
         WHERE id = $2 AND ($3 IS NULL OR revision = $3) AND state = 'scheduled'";

    /// Claims `(id, revision)` pairs (`$1…`) of tasks matching `from`: `releasing`.
    pub fn claim(from: &str, pairs: usize) -> String {
        format!(
            "UPDATE tasks SET state = 'releasing' WHERE {from} AND {} RETURNING id",
            id_revision_pairs(1, pairs)
        )
    }

    /// The state and revision of `ids` tasks (`$1…`).
    pub fn states(ids: usize) -> String {
        format!(
            "SELECT id, state, revision FROM tasks WHERE id IN ({})",
            placeholders(1, ids)
        )
    }

    pub fn holder_by_key() -> String {
        format!("SELECT {COLUMNS} FROM tasks WHERE idempotency_key = $1")
    }

    pub fn holder_by_id() -> String {
        format!("SELECT {COLUMNS} FROM tasks WHERE id = $1")
    }
}

/// A group's transaction on either backend; one method per step.
enum Tx {
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
    async fn begin(pool: &Pool) -> Result<Tx, LedgerError> {
        Ok(match pool {
            Pool::Sqlite(p) => Tx::Sqlite(p.begin().await.context("starting a transaction")?),
            Pool::Postgres(p) => Tx::Postgres(p.begin().await.context("starting a transaction")?),
        })
    }

    async fn commit(self) -> Result<(), LedgerError> {
        on_tx!(self, t => t.commit().await).context("committing")
    }

    /// One chunk of new rows; returns the ids actually inserted.
    async fn insert(&mut self, rows: &[&Row]) -> Result<Vec<String>, LedgerError> {
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
                    .bind(&r.client);
            }
            query.fetch_all(&mut **t).await
        })
        .context("recording tasks")
    }

    /// One chunk of a release claim: the ids claimed.
    async fn claim(
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

    async fn states(&mut self, ids: &[&str]) -> Result<Vec<(String, String, i64)>, LedgerError> {
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
    async fn holder_of(&mut self, row: &Row) -> Result<Option<Row>, LedgerError> {
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
    async fn mark_published(
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

    async fn mark_delivered(
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

    async fn schedule_retry(
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
    async fn mark_failed(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, key: Option<&str>, fingerprint: &str) -> Row {
        Row {
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
            client: None,
            publish_alone: 0,
            refusals: 0,
            revision: 1,
            delivered_at_ms: None,
            cancelled_at_ms: None,
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
        let first = row("a", Some("k"), "f1");
        let replay = row("b", Some("k"), "f1");
        let conflict = row("c", Some("k"), "f2");
        let same_id = row("a", None, "f1");
        let other = row("d", None, "f3");
        let decided = dedupe_in_group(&[&first, &replay, &conflict, &same_id, &other]);
        assert_eq!(
            decided,
            [
                None,
                Some(Judged::Replay(first.clone())),
                Some(Judged::Conflict(first.clone())),
                // Same id, but the first came with a key this one lacks.
                Some(Judged::Conflict(first.clone())),
                None,
            ]
        );
    }

    /// The `$N` placeholders of `sql`, in order of appearance.
    fn parameters(sql: &str) -> Vec<usize> {
        sql.split('$')
            .skip(1)
            .map(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().expect("a number after $")
            })
            .collect()
    }

    #[test]
    fn an_insert_numbers_every_column_of_every_row_once_and_in_order() {
        for rows in [1, 2, 7, CHUNK] {
            let sql = sql::insert(rows);
            let width = INSERT_COLUMNS.len();
            assert_eq!(
                parameters(&sql),
                (1..=rows * width).collect::<Vec<_>>(),
                "{sql}"
            );
            assert_eq!(sql.matches('(').count(), rows + 1, "{sql}");
            assert!(sql.starts_with("INSERT INTO tasks (id, idempotency_key, "));
            assert!(sql.ends_with(" ON CONFLICT DO NOTHING RETURNING id"));
        }
    }

    #[test]
    fn marking_scheduled_binds_time_and_copy_size_then_each_id_with_its_revision() {
        for trim in [true, false] {
            let sql = sql::mark_published(3, trim);
            let mut found = parameters(&sql);
            found.dedup();
            assert_eq!(found, [1, 2, 3, 4, 5, 6, 7, 8], "{sql}");
            assert!(
                sql.ends_with(
                    "WHERE state = 'pending' AND ((id = $3 AND revision = $4) OR \
                     (id = $5 AND revision = $6) OR (id = $7 AND revision = $8))"
                ),
                "{sql}"
            );
            assert_eq!(sql.contains("substr"), trim);
        }
    }

    #[test]
    fn marking_delivered_binds_time_and_copy_size_then_the_ids() {
        let sql = sql::mark_delivered(2);
        let mut found = parameters(&sql);
        found.dedup();
        assert_eq!(found, [1, 2, 3, 4], "{sql}");
        assert!(sql.contains("last_error = NULL"), "{sql}");
        assert!(sql.ends_with("WHERE state = 'releasing' AND id IN ($3, $4)"));
    }

    #[test]
    fn a_claim_binds_each_id_with_its_revision() {
        let sql = sql::claim("state = 'pending'", 2);
        assert_eq!(parameters(&sql), [1, 2, 3, 4]);
        assert_eq!(
            sql,
            "UPDATE tasks SET state = 'releasing' WHERE state = 'pending' AND \
             ((id = $1 AND revision = $2) OR (id = $3 AND revision = $4)) RETURNING id"
        );
        assert_eq!(parameters(&sql::states(3)), [1, 2, 3]);
    }

    /// Every statement that names tasks by id finds them by the primary key,
    /// on the default backend, however large the ledger: the query plan of
    /// each, on a migrated SQLite ledger, searches and never scans `tasks`.
    #[tokio::test]
    async fn statements_by_id_use_the_primary_key_on_sqlite() {
        let pool = super::super::migrated_sqlite().await;
        let statements = [
            sql::mark_published(3, true),
            sql::mark_published(3, false),
            sql::mark_delivered(3),
            sql::claim("state = 'pending'", 3),
            sql::claim("state IN ('scheduled', 'releasing', 'failed')", 3),
            sql::states(3),
            sql::SCHEDULE_RETRY.to_owned(),
            sql::FAIL_PENDING.to_owned(),
            sql::holder_by_id(),
        ];
        for statement in statements {
            let count = parameters(&statement).into_iter().max().unwrap_or(0);
            let plan = super::super::query_plan(&pool, &statement, count).await;
            assert!(
                plan.iter().all(|step| !step.starts_with("SCAN tasks")),
                "{statement}\n{plan:?}"
            );
            assert!(
                plan.iter()
                    .any(|step| step.contains("USING INDEX sqlite_autoindex_tasks_1")
                        || step.contains("USING PRIMARY KEY")),
                "{statement}\n{plan:?}"
            );
        }
    }

    #[test]
    fn sqlite_gets_anonymous_placeholders_only_where_they_bind_the_same() {
        let insert = sql::insert(3);
        let anonymous = sql::for_sqlite(&insert);
        assert!(!anonymous.contains('$'), "{anonymous}");
        assert_eq!(
            anonymous.matches('?').count(),
            3 * INSERT_COLUMNS.len(),
            "{anonymous}"
        );
        assert_eq!(anonymous.replace('?', ""), strip_numbers(&insert));
        assert!(!sql::for_sqlite(&sql::mark_published(2, false)).contains('$'));
        assert!(!sql::for_sqlite(&sql::states(5)).contains('$'));
        // $2 twice, or $3 before $2: the numbers stay.
        for kept in [
            sql::mark_published(2, true),
            sql::mark_delivered(2),
            "SELECT $1, $3, $2".to_owned(),
            "SELECT $2".to_owned(),
            "SELECT 1".to_owned(),
            sql::FAIL_PENDING.to_owned(),
        ] {
            assert_eq!(sql::for_sqlite(&kept), kept);
        }
    }

    /// `sql` without the digits of its `$N`, and without the `$`.
    fn strip_numbers(sql: &str) -> String {
        let mut out = String::new();
        let mut in_number = false;
        for c in sql.chars() {
            if c == '$' {
                in_number = true;
            } else if !(in_number && c.is_ascii_digit()) {
                in_number = false;
                out.push(c);
            }
        }
        out
    }

    proptest::proptest! {
        /// Whatever text lies between in-order placeholders is kept as it is,
        /// and every placeholder becomes one `?`.
        #[test]
        fn anonymous_placeholders_keep_the_text_around_them(
            between in proptest::collection::vec("[a-z ,()=']{0,8}", 1..40),
        ) {
            let numbered: String = between
                .iter()
                .enumerate()
                .map(|(n, text)| format!("{text}${}", n + 1))
                .collect();
            let anonymous = sql::for_sqlite(&numbered);
            let expected: String = between.iter().map(|text| format!("{text}?")).collect();
            proptest::prop_assert_eq!(anonymous.as_ref(), expected.as_str());
        }
    }

    #[test]
    fn fixed_statements_number_their_parameters_from_one() {
        for (sql, count) in [
            (sql::SCHEDULE_RETRY.to_owned(), 6),
            (sql::FAIL_PENDING.to_owned(), 3),
            (sql::FAIL_SCHEDULED.to_owned(), 3),
            (sql::holder_by_key(), 1),
            (sql::holder_by_id(), 1),
        ] {
            let mut found = parameters(&sql);
            found.sort_unstable();
            found.dedup();
            assert_eq!(found, (1..=count).collect::<Vec<_>>(), "{sql}");
        }
    }
}
