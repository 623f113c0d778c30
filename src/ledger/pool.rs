//! Connections: the pool of either backend, the SQLite writer's own
//! connection, and the migrations that bring a schema up to date.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use rusqlite::config::DbConfig;
use sqlx::migrate::{Migrate, MigrateError, Migrator};
use sqlx::pool::PoolOptions;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, Database};

use tracing::{debug, warn};

use super::checkpoint;
use super::error::LedgerError;
use super::settings::{Location, StoreSettings};

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/postgres");

/// How long SQLite waits for another connection's write lock before failing.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// 16 MiB per connection (negative: KiB, not pages); bounded, so the
/// service's memory stays flat however many tasks the ledger holds.
const SQLITE_CACHE_SIZE: &str = "-16384";

#[derive(Clone, Debug)]
pub(crate) enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Opens the pool, creating the SQLite file and its directory if needed.
pub(super) async fn open_pool(
    location: &Location,
    max_connections: u32,
) -> Result<Pool, LedgerError> {
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

/// Warns when the server runs without autovacuum. The ledger's tables
/// churn: a task is inserted, then updated at its confirm, and the
/// forecast's change log is written and emptied all the time; without
/// autovacuum every dead row stays, and admission slows as they pile up
/// (measured: to 0.73 of its first rate by 1.5 million tasks held). The
/// server's setting is the operator's: said, not changed. Said when the
/// ledger is opened to work with (not by `delayline migrate`).
pub(super) async fn warn_without_autovacuum(pool: &PgPool) {
    match sqlx::query_scalar::<_, String>("SHOW autovacuum")
        .fetch_one(pool)
        .await
    {
        Ok(setting) if setting == "off" => warn!(
            "PostgreSQL runs with autovacuum off: the ledger's dead rows are never reclaimed and \
             admission slows as they pile up; turn it on (PostgreSQL's default) or vacuum the \
             ledger's tables often"
        ),
        Ok(_) => {}
        Err(error) => debug!(%error, "cannot read PostgreSQL's autovacuum setting"),
    }
}

/// The group-commit writer's own connection to a migrated SQLite ledger,
/// with the pool's settings (see [`open_pool`]). Statements are prepared
/// once per shape and kept: a group's chunks come in a few fixed sizes.
pub(super) fn open_sqlite_writer(path: &Path) -> Result<rusqlite::Connection, LedgerError> {
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
    // The forecast's triggers cost every insert and every update of a
    // task's state a statement of their own; this connection's
    // transactions sum those counts and write them once a group
    // (`super::due_counts`). Every other connection keeps the triggers.
    let triggers = connection
        .set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false)
        .map_err(failed)?;
    if triggers {
        return Err(LedgerError::WriterTriggers);
    }
    connection.set_prepared_statement_cache_capacity(WRITER_STATEMENTS);
    Ok(connection)
}

/// Statements the writer keeps prepared: every chunk size (7) of each
/// statement over many rows (a quarantine, three claims, states,
/// delivered), the one-row insert and scheduled mark, and the fixed ones,
/// with room to spare.
const WRITER_STATEMENTS: usize = 128;

/// The schema versions a run of the migrations found and left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migrated {
    pub from: i64,
    pub to: i64,
}

/// Applies every migration not yet applied; the versions before and after.
/// Safe to run from several replicas at once: sqlx serialises them with a
/// lock on PostgreSQL.
///
/// On a connection of its own (a pool of one), with sqlx's statement
/// logging off: a migration that rebuilds `tasks` runs for seconds on a
/// large ledger (0015: 21 s for a million tasks), and sqlx's slow-statement
/// warning printed the whole migration's SQL in one line (`delayline
/// migrate` says which versions it applied instead).
pub(super) async fn migrate(pool: &Pool, target: &str) -> Result<Migrated, LedgerError> {
    let migrator = match pool {
        Pool::Sqlite(_) => &SQLITE_MIGRATIONS,
        Pool::Postgres(_) => &POSTGRES_MIGRATIONS,
    };
    let migrated = on_pool!(pool, p => {
        let quiet = quiet_copy(p).await.map_err(|source| LedgerError::Connect {
            target: target.to_owned(),
            source,
        })?;
        let migrated = async {
            let from = latest_version(&quiet).await?;
            migrator.run(&quiet).await?;
            let to = latest_version(&quiet).await?;
            Ok(Migrated { from, to })
        }
        .await;
        quiet.close().await;
        migrated
    })
    .map_err(|source| LedgerError::Migrate {
        target: target.to_owned(),
        source,
    })?;
    Ok(migrated)
}

/// A pool of one connection to where `pool` connects, quiet.
async fn quiet_copy<DB: Database>(pool: &sqlx::Pool<DB>) -> Result<sqlx::Pool<DB>, sqlx::Error>
where
    <DB::Connection as Connection>::Options: Quiet,
{
    let options = pool.connect_options().as_ref().clone();
    PoolOptions::<DB>::new()
        .max_connections(1)
        .connect_with(options.quiet())
        .await
}

/// Connection options for the migrations: no statement logging, and on
/// PostgreSQL no notices below a warning (each `CREATE … IF NOT EXISTS` of
/// the migrations' table said "already exists, skipping", which sqlx logs
/// at INFO: three lines at every start).
trait Quiet {
    fn quiet(self) -> Self;
}

impl Quiet for SqliteConnectOptions {
    fn quiet(self) -> Self {
        self.disable_statement_logging()
    }
}

impl Quiet for PgConnectOptions {
    fn quiet(self) -> Self {
        self.disable_statement_logging()
            .options([("client_min_messages", "warning")])
    }
}

/// The highest migration applied (0 for a new ledger). The migrations'
/// table is made first, so that only a real failure is an error (a version
/// read wrong would be said wrong), and under the migrator's lock, as the
/// migrator makes it: replicas starting at once would otherwise race to
/// create it (PostgreSQL; SQLite's lock is a no-op).
async fn latest_version<DB: Database>(pool: &sqlx::Pool<DB>) -> Result<i64, MigrateError>
where
    DB::Connection: Migrate,
{
    let mut connection = pool.acquire().await?;
    connection.lock().await?;
    let applied = async {
        connection.ensure_migrations_table().await?;
        connection.list_applied_migrations().await
    }
    .await;
    // The lock is the session's: released before the migrator takes the
    // same connection (the pool has one), or when it closes.
    connection.unlock().await?;
    Ok(applied?.iter().map(|m| m.version).max().unwrap_or(0))
}

/// `delayline migrate`: brings the schema up to date; where, and from which
/// version to which.
pub async fn migrate_only(
    settings: &StoreSettings,
) -> Result<Option<(String, Migrated)>, LedgerError> {
    let Some(location) = Location::parse(settings)? else {
        return Ok(None);
    };
    let pool = open_pool(&location, 1).await?;
    let target = location.describe();
    let result = migrate(&pool, &target).await;
    on_pool!(&pool, p => p.close().await);
    result.map(|migrated| Some((target, migrated)))
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

/// The group writer's connection (its settings, triggers off) to a new,
/// migrated SQLite ledger in a scratch directory, which the caller removes.
#[cfg(test)]
pub(crate) async fn migrated_sqlite_writer() -> (std::path::PathBuf, rusqlite::Connection) {
    let dir = std::env::temp_dir().join(format!("dl-writer-{}", uuid::Uuid::new_v4()));
    let path = dir.join("ledger.db");
    let pool = open_pool(&Location::Sqlite(path.clone()), 1)
        .await
        .expect("a SQLite ledger");
    migrate(&pool, "scratch").await.expect("the migrations run");
    on_pool!(&pool, p => p.close().await);
    let writer = open_sqlite_writer(&path).expect("the writer's connection");
    (dir, writer)
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

/// Whether a plan's step sorts what it read in due order as a whole, rather
/// than only the rows that share a due time (SQLite's "right part of the
/// order by": the indexes end in the rowid, and ties are ordered by id).
#[cfg(test)]
pub(crate) fn sorts_the_range(step: &str) -> bool {
    step.contains("TEMP B-TREE")
        && !step.contains("RIGHT PART OF ORDER BY")
        && !step.contains("LAST TERM OF ORDER BY")
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

    /// A run of the migrations says which versions it found and left: all
    /// of them on a new ledger, none on one already up to date.
    #[tokio::test]
    async fn a_migration_run_says_from_which_version_to_which() {
        let dir = std::env::temp_dir().join(format!("dl-migrated-{}", uuid::Uuid::new_v4()));
        let pool = open_pool(&Location::Sqlite(dir.join("ledger.db")), 1)
            .await
            .unwrap();
        let latest = SQLITE_MIGRATIONS.iter().map(|m| m.version).max().unwrap();
        assert!(latest >= 16);
        let first = migrate(&pool, "scratch").await.unwrap();
        assert_eq!(
            first,
            Migrated {
                from: 0,
                to: latest
            }
        );
        let again = migrate(&pool, "scratch").await.unwrap();
        assert_eq!(
            again,
            Migrated {
                from: latest,
                to: latest
            }
        );
        on_pool!(&pool, p => p.close().await);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A version that cannot be read is an error, not a new ledger's 0: a
    /// read-only file without the migrations' table cannot be given one.
    /// Read-only once migrated, the version reads.
    #[tokio::test]
    async fn a_version_that_cannot_be_read_is_an_error_not_zero() {
        let dir = std::env::temp_dir().join(format!("dl-version-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger.db");
        let read_only = async || {
            let options = SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .read_only(true);
            SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await
                .unwrap()
        };
        rusqlite::Connection::open(&path).unwrap();
        let empty = read_only().await;
        assert!(latest_version(&empty).await.is_err());
        empty.close().await;

        let pool = open_pool(&Location::Sqlite(path.clone()), 1).await.unwrap();
        let migrated = migrate(&pool, "scratch").await.unwrap();
        on_pool!(&pool, p => p.close().await);
        let migrated_read_only = read_only().await;
        assert_eq!(
            latest_version(&migrated_read_only).await.unwrap(),
            migrated.to
        );
        migrated_read_only.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Migration 0015 rebuilds `tasks` with its CHECK on `state` written
    /// without `IN`: every column of every row stays as it was, a state
    /// outside the eight is still refused, and the forecast's triggers,
    /// made again, still count.
    #[tokio::test]
    async fn migration_0015_keeps_every_row_the_check_and_the_triggers() {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let run = async |sql: &str| sqlx::raw_sql(sql).execute(&pool).await;
        let (before, after): (Vec<_>, Vec<_>) =
            SQLITE_MIGRATIONS.iter().partition(|m| m.version < 15);
        let rebuild = after[0];
        assert_eq!(rebuild.version, 15);
        for migration in before {
            run(&migration.sql).await.unwrap();
        }
        let insert = |id: &str, state: &str| {
            format!(
                "INSERT INTO tasks (id, idempotency_key, fingerprint, destination, routing_key, \
                 delay_ms, deliver_at_ms, content_type, headers, payload, payload_bytes, state, \
                 created_at_ms, published_at_ms, next_attempt_at_ms, attempts, last_error, \
                 publish_alone, refusals, revision, delivered_at_ms, cancelled_at_ms, client, \
                 properties, exchange, held_by) VALUES ('{id}', 'k-{id}', 'f', 'd', '1.d', 5, \
                 60000, 'text/plain', '{{}}', x'01', 1, '{state}', 5, 6, 7, 2, 'e', 1, 3, 4, 8, \
                 9, 'c', x'02', 'x', 'l')"
            )
        };
        for (id, state) in [("a", "waiting"), ("b", "delivered"), ("c", "scheduled")] {
            run(&insert(id, state)).await.unwrap();
        }
        let rows = async || -> Vec<String> {
            let columns: Vec<String> =
                sqlx::query_scalar("SELECT name FROM pragma_table_info('tasks') ORDER BY cid")
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            let quoted: Vec<String> = columns.iter().map(|c| format!("quote({c})")).collect();
            let every = format!(
                "SELECT {} FROM tasks ORDER BY id",
                quoted.join(" || ',' || ")
            );
            sqlx::query_scalar(&every).fetch_all(&pool).await.unwrap()
        };
        let counts = async || -> Vec<(i64, String, i64)> {
            sqlx::query_as("SELECT minute_ms, destination, tasks FROM due_counts")
                .fetch_all(&pool)
                .await
                .unwrap()
        };
        let (rows_before, counts_before) = (rows().await, counts().await);
        assert_eq!(counts_before, [(60000, "d".to_owned(), 2)]);

        run(&rebuild.sql).await.unwrap();

        assert_eq!(rows().await, rows_before);
        assert_eq!(counts().await, counts_before);
        assert!(run(&insert("d", "nowhere")).await.is_err());
        run(&insert("e", "pending")).await.unwrap();
        assert_eq!(counts().await, [(60000, "d".to_owned(), 3)]);
    }

    /// Migration 0018 rebuilds `tasks` again, for the state `staged` and
    /// the column `release_at_ms`: every row keeps every column it had (the
    /// new one NULL), a state outside the nine is refused, and the
    /// forecast's triggers count a staged task as one on its way.
    #[tokio::test]
    async fn migration_0018_keeps_every_row_and_counts_a_staged_task() {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let run = async |sql: &str| sqlx::raw_sql(sql).execute(&pool).await;
        let (before, after): (Vec<_>, Vec<_>) =
            SQLITE_MIGRATIONS.iter().partition(|m| m.version < 18);
        assert_eq!(after[0].version, 18);
        for migration in before {
            run(&migration.sql).await.unwrap();
        }
        let insert = |id: &str, state: &str| {
            format!(
                "INSERT INTO tasks (id, destination, routing_key, delay_ms, deliver_at_ms, \
                 content_type, headers, payload, payload_bytes, state, created_at_ms, \
                 next_attempt_at_ms, held_by) VALUES ('{id}', 'd', '1.d', 5, 60000, \
                 'text/plain', '{{}}', x'01', 1, '{state}', 5, 7, 'l')"
            )
        };
        for (id, state) in [("a", "waiting"), ("b", "delivered"), ("c", "scheduled")] {
            run(&insert(id, state)).await.unwrap();
        }
        let every = "SELECT id || state || deliver_at_ms || quote(payload) || \
                     next_attempt_at_ms || held_by FROM tasks ORDER BY id";
        let rows =
            async || -> Vec<String> { sqlx::query_scalar(every).fetch_all(&pool).await.unwrap() };
        let counts = async || -> Vec<(i64, String, i64)> {
            sqlx::query_as("SELECT minute_ms, destination, tasks FROM due_counts")
                .fetch_all(&pool)
                .await
                .unwrap()
        };
        let rows_before = rows().await;
        assert_eq!(counts().await, [(60000, "d".to_owned(), 2)]);

        run(&after[0].sql).await.unwrap();

        assert_eq!(rows().await, rows_before);
        assert_eq!(counts().await, [(60000, "d".to_owned(), 2)]);
        let new_column: Vec<Option<i64>> = sqlx::query_scalar("SELECT release_at_ms FROM tasks")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(new_column, [None, None, None]);
        assert!(run(&insert("d", "nowhere")).await.is_err());
        run(&insert("e", "staged")).await.unwrap();
        assert_eq!(counts().await, [(60000, "d".to_owned(), 3)]);
        run("UPDATE tasks SET state = 'releasing' WHERE id = 'e'")
            .await
            .unwrap();
        assert_eq!(counts().await, [(60000, "d".to_owned(), 3)]);
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
}
