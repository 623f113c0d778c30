//! The task ledger: every accepted task as a row, in SQLite (embedded, the
//! default) or PostgreSQL (shared by several replicas).
//!
//! The ledger is what lets delayline answer 202 while RabbitMQ is down (the
//! task waits here as `pending` until the forwarder publishes it), replay a
//! retried request instead of scheduling it twice, and say what is scheduled.
//!
//! Both backends run the same SQL text: `$N` placeholders, integer epoch
//! milliseconds, and nothing either dialect lacks. Only the schema differs,
//! in `migrations/sqlite` and `migrations/postgres`. [`on_pool!`] expands a
//! query once per backend, so every query is written once.
//!
//! Writes on the request path, and the release stage's claims and
//! deliveries, go through [`writer`]: one transaction for everything that
//! arrived while the previous one committed (group commit), run in steps by
//! [`transaction`] ([`admit`] new tasks, [`claim`] due ones, mark the rest).
//! On SQLite the writer has a `rusqlite` connection and a thread of its own
//! (sqlx's SQLite driver cost 1.3–2.5× the CPU per task, BENCHMARKS.md, issue
//! 28); everything else, and PostgreSQL, goes through sqlx's pools. Callers
//! see one [`Ledger`] whichever driver sits below.
//! Cancels and moves ([`change`]) are single conditional updates of their
//! own; [`release`] records what the release stage and the operator's
//! commands learn about due tasks. Every statement's text is in [`sql`].
//!
//! Dependencies between these files run one way: `writer` → `admit`,
//! `claim` → `transaction` → `sql` → `record`; `change` and `release` use
//! `sql` and the [`Ledger`] handle defined here.

mod admit;
mod checkpoint;
mod claim;
mod cursor;
mod record;
mod sql;
mod transaction;
mod writer;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::histogram::Histogram;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection};
use tokio_util::sync::CancellationToken;
use tracing::warn;

pub use admit::Admission;
pub use change::{Cancel, ChangeKey, Move, Reschedule};
pub use claim::Finding;
pub use cursor::{Cursor, CursorError};
pub use record::{Retry, StoredTask};

use record::{Row, decode_all};
use transaction::Store;

use crate::config::StoreSettings;
use crate::task::{Task, TaskState, epoch_ms};

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/postgres");

/// How long SQLite waits for another connection's write lock before failing.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// 16 MiB per connection (negative: KiB, not pages); bounded, so the
/// service's memory stays flat however many tasks the ledger holds.
const SQLITE_CACHE_SIZE: &str = "-16384";

/// Runs `$body` with `$pool` bound to the backend's own pool type: the body
/// is type-checked (and compiled) once per backend.
macro_rules! on_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            $crate::ledger::Pool::Sqlite($p) => $body,
            $crate::ledger::Pool::Postgres($p) => $body,
        }
    };
}

// After `on_pool!`, which they use.
mod change;
mod release;
mod schedules;

pub use schedules::{Advance, ScheduleChange, ScheduleCounts, StoredSchedule};

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("store.url {0:?} is neither empty, \"none\", sqlite://… nor postgres://…")]
    UnknownUrl(String),
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the ledger at {target}: {source}")]
    Connect { target: String, source: sqlx::Error },
    #[error("migrating the ledger at {target}: {source}")]
    Migrate {
        target: String,
        source: sqlx::migrate::MigrateError,
    },
    #[error("ledger: {context}: {source}")]
    Query {
        context: &'static str,
        source: sqlx::Error,
    },
    #[error("ledger: {context}: {source}")]
    Sqlite {
        context: &'static str,
        source: rusqlite::Error,
    },
    #[error("cannot start the ledger's writer: {0}")]
    WriterThread(std::io::Error),
    #[error("ledger row {id}: {reason}")]
    Corrupt { id: String, reason: String },
    #[error("the ledger writer has stopped")]
    Closed,
    /// One failure answered to every write of the group it broke.
    #[error(transparent)]
    Shared(Arc<LedgerError>),
}

/// Adds what was being done to a database error.
pub(crate) trait QueryContext<T> {
    fn context(self, context: &'static str) -> Result<T, LedgerError>;
}

impl<T> QueryContext<T> for Result<T, sqlx::Error> {
    fn context(self, context: &'static str) -> Result<T, LedgerError> {
        self.map_err(|source| LedgerError::Query { context, source })
    }
}

impl<T> QueryContext<T> for Result<T, rusqlite::Error> {
    fn context(self, context: &'static str) -> Result<T, LedgerError> {
        self.map_err(|source| LedgerError::Sqlite { context, source })
    }
}

/// Where the ledger lives, as `store.url` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Location {
    /// `None` for the stateless mode (`store.url = "none"`).
    pub fn parse(settings: &StoreSettings) -> Result<Option<Location>, LedgerError> {
        let url = settings.url.expose().trim();
        if url.is_empty() {
            let path = Path::new(&settings.data_dir).join("delayline.db");
            return Ok(Some(Location::Sqlite(path)));
        }
        if url == "none" {
            return Ok(None);
        }
        if let Some(path) = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
        {
            let path = path.split('?').next().unwrap_or(path);
            return Ok(Some(Location::Sqlite(PathBuf::from(path))));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Some(Location::Postgres(url.to_owned())));
        }
        Err(LedgerError::UnknownUrl(url.to_owned()))
    }

    /// For logs and errors: never the password.
    pub fn describe(&self) -> String {
        match self {
            // Absolute: a relative path (the default `data/delayline.db`)
            // depends on the directory delayline was started from.
            Location::Sqlite(path) => format!(
                "sqlite://{}",
                std::path::absolute(path)
                    .unwrap_or_else(|_| path.clone())
                    .display()
            ),
            Location::Postgres(url) => crate::broker::redact_uri(url),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// A cheap, cloneable handle to the ledger.
#[derive(Clone)]
pub struct Ledger {
    pool: Pool,
    target: Arc<str>,
    /// Made once per ledger (migration 0006): which ledger a chain belongs to.
    identity: Arc<str>,
    writes: writer::Handle,
    pending: Arc<PendingCount>,
    max_pending: u64,
    /// Stops the recount of pending tasks when the ledger closes.
    closing: CancellationToken,
}

/// Tasks waiting for the broker: the bound that answers 503 before the disk
/// fills. The writer follows what it commits; a recount every
/// [`RECOUNT_EVERY`] adds what other replicas did.
#[derive(Debug, Default)]
pub(crate) struct PendingCount(AtomicU64);

impl PendingCount {
    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, count: u64) {
        self.0.store(count, Ordering::Relaxed);
    }

    fn add(&self, added: u64) {
        self.0.fetch_add(added, Ordering::Relaxed);
    }

    fn remove(&self, removed: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(removed))
            });
    }
}

/// How often the pending count is read back from the database.
const RECOUNT_EVERY: Duration = Duration::from_secs(5);

/// Opens the pool, creating the SQLite file and its directory if needed.
async fn open_pool(location: &Location, max_connections: u32) -> Result<Pool, LedgerError> {
    let connect = |source| LedgerError::Connect {
        target: location.describe(),
        source,
    };
    match location {
        Location::Sqlite(path) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|source| LedgerError::DataDir {
                    path: dir.to_owned(),
                    source,
                })?;
            }
            // WAL lets readers (inspection) run beside the writer; FULL makes
            // every commit durable before a 202 leaves, and group commit
            // shares each fsync between all the requests of a group.
            let options = SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(SQLITE_BUSY_TIMEOUT)
                // Each connection's page cache holds the hot ends of the
                // indexes; at SQLite's default (2 MB) a ledger of more than a
                // few thousand tasks reread index pages from the OS on every
                // group commit.
                .pragma("cache_size", SQLITE_CACHE_SIZE)
                // A group's multi-row insert keeps its statement journal in
                // memory, not in a temporary file created and deleted each time.
                .pragma("temp_store", "memory");
            let pool = SqlitePoolOptions::new()
                .max_connections(max_connections)
                .connect_with(options)
                .await
                .map_err(connect)?;
            Ok(Pool::Sqlite(pool))
        }
        Location::Postgres(url) => {
            let options = PgConnectOptions::from_str(url).map_err(connect)?;
            // One connection first: the pool would only say "timed out",
            // where this says "connection refused" or which database is missing.
            let probe = options.connect().await.map_err(connect)?;
            let _ = probe.close().await;
            let pool = PgPoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(Duration::from_secs(5))
                .connect_with(options)
                .await
                .map_err(connect)?;
            Ok(Pool::Postgres(pool))
        }
    }
}

/// The group-commit writer's own connection to a migrated SQLite ledger,
/// with the pool's settings (see [`open_pool`]). Statements are prepared
/// once per shape and kept: a group's chunks come in a few fixed sizes.
fn open_sqlite_writer(path: &Path) -> Result<rusqlite::Connection, LedgerError> {
    let failed = |source| LedgerError::Sqlite {
        context: "opening the writer's connection",
        source,
    };
    let connection = rusqlite::Connection::open(path).map_err(failed)?;
    connection
        .busy_timeout(SQLITE_BUSY_TIMEOUT)
        .map_err(failed)?;
    connection
        .execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
             PRAGMA cache_size = {SQLITE_CACHE_SIZE}; PRAGMA temp_store = MEMORY; \
             PRAGMA wal_autocheckpoint = {};",
            checkpoint::WRITER_CHECKPOINT_PAGES
        ))
        .map_err(failed)?;
    connection.set_prepared_statement_cache_capacity(WRITER_STATEMENTS);
    Ok(connection)
}

/// Statements the writer keeps prepared: every chunk size (7) of each
/// statement over many rows (insert, two marks, two claims, states,
/// delivered) and the fixed ones, with room to spare.
const WRITER_STATEMENTS: usize = 128;

/// Applies every migration not yet applied. Safe to run from several
/// replicas at once: sqlx serialises them with a lock on PostgreSQL.
async fn migrate(pool: &Pool, target: &str) -> Result<(), LedgerError> {
    let result = match pool {
        Pool::Sqlite(p) => SQLITE_MIGRATIONS.run(p).await,
        Pool::Postgres(p) => POSTGRES_MIGRATIONS.run(p).await,
    };
    result.map_err(|source| LedgerError::Migrate {
        target: target.to_owned(),
        source,
    })
}

/// `delayline migrate`: brings the schema up to date and says where.
pub async fn migrate_only(settings: &StoreSettings) -> Result<Option<String>, LedgerError> {
    let Some(location) = Location::parse(settings)? else {
        return Ok(None);
    };
    let pool = open_pool(&location, 1).await?;
    let target = location.describe();
    let result = migrate(&pool, &target).await;
    on_pool!(&pool, p => p.close().await);
    result.map(|()| Some(target))
}

/// Opens (and migrates) the ledger `settings` name, or `None` in the
/// stateless mode (`store.url = "none"`). `commit_group_size` observes how
/// many writes each transaction commits. With `release_stage`, a task's
/// whole payload is kept until it is delivered (a move publishes it again),
/// not only until it is published.
pub async fn open(
    settings: &StoreSettings,
    release_stage: bool,
    commit_group_size: Histogram,
) -> Result<Option<Ledger>, LedgerError> {
    let Some(location) = Location::parse(settings)? else {
        return Ok(None);
    };
    let pool = open_pool(&location, settings.max_connections).await?;
    let target = location.describe();
    migrate(&pool, &target).await?;
    let identity = read_identity(&pool).await?;
    let pending = Arc::new(PendingCount::default());
    let store = match &pool {
        Pool::Sqlite(pool) => {
            Store::Sqlite(open_sqlite_writer(pool.connect_options().get_filename())?)
        }
        Pool::Postgres(pool) => Store::Postgres(pool.clone()),
    };
    let ledger = Ledger {
        writes: writer::spawn(
            store,
            settings.payload_copy_bytes,
            release_stage,
            commit_group_size,
            pending.clone(),
        )?,
        pool,
        target: target.into(),
        identity: identity.into(),
        pending,
        max_pending: settings.max_pending,
        closing: CancellationToken::new(),
    };
    ledger.pending_tasks().await?;
    tokio::spawn(ledger.clone().recount_until_closed());
    if let Pool::Sqlite(pool) = &ledger.pool {
        let path = pool.connect_options().get_filename().to_owned();
        tokio::spawn(checkpoint::until_closed(path, ledger.closing.clone()));
    }
    Ok(Some(ledger))
}

/// The ledger's identity, made by its migration.
async fn read_identity(pool: &Pool) -> Result<String, LedgerError> {
    const IDENTITY: &str = "SELECT id FROM ledger_identity";
    let read = on_pool!(pool, p => sqlx::query_scalar::<_, String>(IDENTITY).fetch_one(p).await);
    read.context("reading the ledger's identity")
}

/// A client's waiting tasks. Both counts read an index alone
/// (`tasks_by_deliver_at` carries the client): a task not yet due is waiting
/// unless it was withdrawn.
const WAITING_TASKS: &str = "SELECT \
    (SELECT COUNT(*) FROM tasks WHERE client = $1 AND deliver_at_ms > $2) \
    - (SELECT COUNT(*) FROM tasks WHERE client = $1 AND deliver_at_ms > $2 \
       AND state IN ('cancelled', 'failed'))";

/// What `GET /v1/tasks` filters on.
#[derive(Clone, Debug, Default)]
pub struct TaskFilter {
    /// Only this client's tasks (a caller without `admin`).
    pub client: Option<String>,
    pub destination: Option<String>,
    pub state: Option<TaskState>,
    pub due_before_ms: Option<u64>,
    pub after: Option<Cursor>,
    pub limit: u32,
}

impl TaskFilter {
    /// The same tasks, with what the state implies made explicit so that
    /// the ledger need not read past them: a delivered task fell due before
    /// now (a minute's margin for another replica's clock).
    pub fn bounded(&self, now_ms: u64) -> TaskFilter {
        let mut filter = self.clone();
        if filter.state == Some(TaskState::Delivered) {
            let bound = now_ms.saturating_add(60_000);
            filter.due_before_ms = Some(filter.due_before_ms.map_or(bound, |d| d.min(bound)));
        }
        filter
    }
}

/// States few tasks are in, each with an index of its own (`tasks_pending`,
/// `tasks_failed`, `tasks_unroutable`, `tasks_cancelled`): listing them goes
/// through that index, not through every task in due order.
fn is_rare(state: TaskState) -> bool {
    matches!(
        state,
        TaskState::Pending | TaskState::Failed | TaskState::Unroutable | TaskState::Cancelled
    )
}

/// The statement [`Ledger::list`] runs for `filter`, its parameters in the
/// order the filter's fields are declared.
///
/// A rare state is written as a literal (it is one of a fixed set), which a
/// partial index can be matched against, and the destination as an
/// expression, so that the planner reads the state's few tasks rather than
/// every task of the destination. The pending tasks' index is in attempt
/// order: they are sorted (there are at most `store.max_pending`).
fn list_sql(filter: &TaskFilter) -> String {
    let rare = filter.state.filter(|state| is_rare(*state));
    let mut conditions = Vec::new();
    let mut parameters = 0;
    let mut next = || {
        parameters += 1;
        format!("${parameters}")
    };
    if filter.client.is_some() {
        conditions.push(format!("client = {}", next()));
    }
    if filter.destination.is_some() {
        let column = if rare.is_some() {
            "destination || ''"
        } else {
            "destination"
        };
        conditions.push(format!("{column} = {}", next()));
    }
    match (filter.state, rare) {
        (Some(_), Some(state)) => conditions.push(format!("state = '{}'", state.as_str())),
        (Some(_), None) => conditions.push(format!("state = {}", next())),
        (None, _) => {}
    }
    if filter.due_before_ms.is_some() {
        conditions.push(format!("deliver_at_ms < {}", next()));
    }
    if filter.after.is_some() {
        let (at, id) = (next(), next());
        conditions.push(format!(
            "(deliver_at_ms > {at} OR (deliver_at_ms = {at} AND id > {id}))"
        ));
    }
    let limit = next();
    let condition = if conditions.is_empty() {
        String::new()
    } else {
        format!("WHERE {} ", conditions.join(" AND "))
    };
    let order = match rare {
        Some(TaskState::Pending) => "+deliver_at_ms",
        _ => "deliver_at_ms",
    };
    format!(
        "SELECT {} FROM tasks {condition}ORDER BY {order}, id LIMIT {limit}",
        record::COLUMNS
    )
}

/// Epoch milliseconds as the ledger stores them.
pub(crate) fn db_ms(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

impl Ledger {
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The ledger's identity, the same for every replica that shares it.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Records `task` as pending, leased to the caller until
    /// `lease_until_ms`; or finds the task this request repeats. A request is
    /// named by its idempotency key, else its id, and recognised as the same
    /// by its `fingerprint`.
    pub async fn admit(
        &self,
        task: &Task,
        idempotency_key: Option<String>,
        fingerprint: Option<String>,
        lease_until_ms: u64,
    ) -> Result<Admission, LedgerError> {
        let row = Row::pending(task, idempotency_key, fingerprint, lease_until_ms);
        self.writes.admit(row).await
    }

    /// The broker confirmed revision `revision` of the task: it is
    /// scheduled, unless it was moved since (its new copy is then awaited).
    /// Only ever called after a confirm.
    pub async fn mark_published(&self, id: String, revision: u64) -> Result<(), LedgerError> {
        self.writes.published(id, revision).await
    }

    /// Publishing revision `revision` failed: the forwarder takes the task
    /// from `retry.retry_at_ms` on.
    pub async fn retry_later(
        &self,
        id: String,
        revision: u64,
        retry: Retry,
    ) -> Result<(), LedgerError> {
        self.writes.retry(id, revision, retry).await
    }

    /// The task can never be delivered: it never publishes (pending), or its
    /// message was set aside (scheduled, then poisoned by a migration); for
    /// good, with `reason` as its `last_error`. Only `revision` of it, when given.
    pub async fn mark_failed(
        &self,
        id: String,
        revision: Option<u64>,
        reason: String,
    ) -> Result<(), LedgerError> {
        self.writes.failed(id, revision, reason).await
    }

    /// Whether the bound on waiting tasks is reached.
    pub fn is_full(&self) -> bool {
        self.pending.get() >= self.max_pending
    }

    pub fn max_pending(&self) -> u64 {
        self.max_pending
    }

    /// The pending count as last known, without asking the database.
    pub fn pending_estimate(&self) -> u64 {
        self.pending.get()
    }

    /// Counts the pending tasks (other replicas add and forward too).
    pub async fn pending_tasks(&self) -> Result<u64, LedgerError> {
        const SQL: &str = "SELECT COUNT(*) FROM tasks WHERE state = 'pending'";
        let count: i64 = on_pool!(&self.pool, p => sqlx::query_scalar(SQL).fetch_one(p).await)
            .context("counting pending tasks")?;
        let count = u64::try_from(count).unwrap_or(0);
        self.pending.set(count);
        Ok(count)
    }

    async fn recount_until_closed(self) {
        loop {
            tokio::select! {
                () = self.closing.cancelled() => return,
                () = tokio::time::sleep(RECOUNT_EVERY) => {}
            }
            if let Err(error) = self.pending_tasks().await {
                warn!(%error, "cannot count pending tasks");
            }
        }
    }

    pub async fn get(&self, id: &str) -> Result<Option<StoredTask>, LedgerError> {
        let sql = format!("SELECT {} FROM tasks WHERE id = $1", record::COLUMNS);
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
        const BY_KEY: &str = "SELECT idempotency_key, fingerprint FROM tasks \
             WHERE idempotency_key = $1";
        const BY_ID: &str = "SELECT idempotency_key, fingerprint FROM tasks WHERE id = $1";
        let (sql, name) = match key {
            Some(key) => (BY_KEY, key),
            None => (BY_ID, id),
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
        let count: i64 = on_pool!(&self.pool, p => sqlx::query_scalar(WAITING_TASKS)
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
    pub async fn list(&self, filter: &TaskFilter) -> Result<Vec<StoredTask>, LedgerError> {
        let filter = &filter.bounded(epoch_ms(SystemTime::now()));
        let sql = list_sql(filter);
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
    /// to the caller until `lease_until_ms`. The condition is repeated outside
    /// the subquery so that, on PostgreSQL, a replica that waited for another
    /// replica's claim re-checks it and skips what was just taken.
    pub async fn claim_due(
        &self,
        now_ms: u64,
        lease_until_ms: u64,
        limit: u32,
    ) -> Result<Vec<StoredTask>, LedgerError> {
        let sql = format!(
            "UPDATE tasks SET next_attempt_at_ms = $2, attempts = attempts + 1 \
             WHERE state = 'pending' AND next_attempt_at_ms <= $1 AND id IN ( \
                 SELECT id FROM tasks WHERE state = 'pending' AND next_attempt_at_ms <= $1 \
                 ORDER BY next_attempt_at_ms LIMIT $3) \
             RETURNING {}",
            record::COLUMNS
        );
        on_pool!(&self.pool, p => sqlx::query_as::<_, Row>(&sql)
            .bind(db_ms(now_ms))
            .bind(db_ms(lease_until_ms))
            .bind(i64::from(limit))
            .fetch_all(p)
            .await)
        .context("claiming pending tasks")
        .and_then(decode_all)
    }

    /// Deletes up to `limit` tasks that are no longer pending and were due
    /// before `before_ms`, and the idempotency keys of changes made before
    /// then; returns how many tasks. Small batches keep each lock short. A
    /// pruned task that still reaches the release stage is delivered: only
    /// what the ledger shows cancelled is ever dropped.
    pub async fn prune(&self, before_ms: u64, limit: u32) -> Result<u64, LedgerError> {
        const SQL: &str = "DELETE FROM tasks WHERE id IN ( \
             SELECT id FROM tasks WHERE state <> 'pending' AND deliver_at_ms < $1 LIMIT $2)";
        const CHANGES: &str = "DELETE FROM task_changes WHERE idempotency_key IN ( \
             SELECT idempotency_key FROM task_changes WHERE created_at_ms < $1 LIMIT $2)";
        on_pool!(&self.pool, p => sqlx::query(CHANGES)
            .bind(db_ms(before_ms))
            .bind(i64::from(limit))
            .execute(p)
            .await
            .map(|_| ()))
        .context("pruning change keys")?;
        let result = on_pool!(&self.pool, p => sqlx::query(SQL)
            .bind(db_ms(before_ms))
            .bind(i64::from(limit))
            .execute(p)
            .await
            .map(|r| r.rows_affected()))
        .context("pruning delivered tasks")?;
        Ok(result)
    }

    /// Closes every connection. Call once nothing writes any more: every
    /// write is awaited by its caller, so none is left queued then.
    pub async fn close(&self) {
        self.closing.cancel();
        on_pool!(&self.pool, p => p.close().await);
    }
}

/// An empty SQLite ledger in memory, migrated, for tests of its statements.
#[cfg(test)]
pub(crate) async fn migrated_sqlite() -> sqlx::SqlitePool {
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .expect("an in-memory SQLite database");
    SQLITE_MIGRATIONS
        .run(&pool)
        .await
        .expect("the migrations run");
    pool
}

/// SQLite's plan for `statement` (its `parameters` bound to numbers): one
/// line per step, such as `SEARCH tasks USING INDEX …`.
#[cfg(test)]
pub(crate) async fn query_plan(
    pool: &sqlx::SqlitePool,
    statement: &str,
    parameters: usize,
) -> Vec<String> {
    let explain = format!("EXPLAIN QUERY PLAN {statement}");
    let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(&explain);
    for n in 0..parameters {
        query = query.bind(n as i64);
    }
    let rows = query.fetch_all(pool).await.expect("a query plan");
    rows.into_iter().map(|(.., detail)| detail).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Migration 0009 rebuilds `tasks` (the idempotency key's uniqueness
    /// becomes a partial index): a ledger of 0008 keeps every row, a key
    /// still names one task, and tasks without a key are as many as before.
    #[tokio::test]
    async fn migration_0009_keeps_every_row_and_each_key_names_one_task() {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let run = async |sql: &str| sqlx::raw_sql(sql).execute(&pool).await.unwrap();
        for before in [
            include_str!("../../migrations/sqlite/0001_tasks.sql"),
            include_str!("../../migrations/sqlite/0002_failed_tasks.sql"),
            include_str!("../../migrations/sqlite/0003_task_lifecycle.sql"),
            include_str!("../../migrations/sqlite/0004_task_clients.sql"),
            include_str!("../../migrations/sqlite/0005_client_in_due_order.sql"),
            include_str!("../../migrations/sqlite/0006_ledger_identity.sql"),
            include_str!("../../migrations/sqlite/0007_unroutable_state.sql"),
            include_str!("../../migrations/sqlite/0008_ingress_properties_and_exchange.sql"),
        ] {
            run(before).await;
        }
        let insert = |id: &str, key: Option<&str>| {
            let key = key.map_or("NULL".to_owned(), |k| format!("'{k}'"));
            format!(
                "INSERT INTO tasks (id, idempotency_key, destination, routing_key, delay_ms, \
                 deliver_at_ms, content_type, headers, payload, payload_bytes, state, \
                 created_at_ms, next_attempt_at_ms) VALUES ('{id}', {key}, 'd', '0.d', 5, 10, \
                 'text/plain', '{{}}', x'01', 1, 'scheduled', 5, 5) ON CONFLICT DO NOTHING"
            )
        };
        for (id, key) in [("a", Some("k")), ("b", None), ("c", None)] {
            assert_eq!(run(&insert(id, key)).await.rows_affected(), 1);
        }
        run(include_str!(
            "../../migrations/sqlite/0009_idempotency_keys_only_where_given.sql"
        ))
        .await;

        let rows: Vec<(String, Option<String>, Option<Vec<u8>>)> =
            sqlx::query_as("SELECT id, idempotency_key, payload FROM tasks ORDER BY id")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(
            rows,
            [
                ("a".to_owned(), Some("k".to_owned()), Some(vec![1])),
                ("b".to_owned(), None, Some(vec![1])),
                ("c".to_owned(), None, Some(vec![1])),
            ]
        );
        assert_eq!(run(&insert("d", Some("k"))).await.rows_affected(), 0);
        assert_eq!(run(&insert("e", None)).await.rows_affected(), 1);
        assert_eq!(run(&insert("a", None)).await.rows_affected(), 0);
    }

    fn location(url: &str) -> Result<Option<Location>, LedgerError> {
        Location::parse(&StoreSettings {
            url: url.into(),
            data_dir: "/var/lib/delayline".to_owned(),
            ..StoreSettings::default()
        })
    }

    #[test]
    fn store_url_picks_the_backend() {
        assert_eq!(
            location("").unwrap(),
            Some(Location::Sqlite(PathBuf::from(
                "/var/lib/delayline/delayline.db"
            )))
        );
        assert_eq!(location("none").unwrap(), None);
        assert_eq!(
            location("sqlite:///tmp/x.db?mode=rwc").unwrap(),
            Some(Location::Sqlite(PathBuf::from("/tmp/x.db")))
        );
        let pg = location("postgres://app:secret@db/delayline")
            .unwrap()
            .unwrap();
        assert_eq!(pg.describe(), "postgres://app:***@db/delayline");
        assert!(matches!(
            location("mysql://db"),
            Err(LedgerError::UnknownUrl(_))
        ));
    }

    /// Every connection of the pool, not only the first, gets the settings
    /// the group commit was measured with (BENCHMARKS.md, issue 16).
    #[tokio::test]
    async fn every_sqlite_connection_has_the_measured_cache_and_journal_settings() {
        let dir = std::env::temp_dir().join(format!("dl-pragmas-{}", uuid::Uuid::new_v4()));
        let path = dir.join("ledger.db");
        let Pool::Sqlite(pool) = open_pool(&Location::Sqlite(path), 2).await.unwrap() else {
            panic!("a SQLite location opens a SQLite pool");
        };
        let mut connections = vec![pool.acquire().await.unwrap(), pool.acquire().await.unwrap()];
        for connection in &mut connections {
            let cache: i64 = sqlx::query_scalar("PRAGMA cache_size")
                .fetch_one(&mut **connection)
                .await
                .unwrap();
            assert_eq!(cache.to_string(), SQLITE_CACHE_SIZE);
            // 2 is MEMORY for temp_store, and FULL for synchronous.
            let temp_store: i64 = sqlx::query_scalar("PRAGMA temp_store")
                .fetch_one(&mut **connection)
                .await
                .unwrap();
            assert_eq!(temp_store, 2);
            let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(&mut **connection)
                .await
                .unwrap();
            assert_eq!(synchronous, 2, "every commit is synced");
            let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
                .fetch_one(&mut **connection)
                .await
                .unwrap();
            assert_eq!(journal, "wal");
        }
        drop(connections);
        pool.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

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
        let count = plan(WAITING_TASKS, 2).await;
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
        let list = plan(&list_sql(&filter), 4).await;
        assert!(
            list.iter().any(|step| step.contains("tasks_by_deliver_at"))
                && list.iter().all(|step| !step.contains("TEMP B-TREE")),
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
                let list = plan(&list_sql(&filter), parameters).await;
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
        let list = plan(&list_sql(&delivered), 3).await;
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
}
