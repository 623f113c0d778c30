//! The [`Ledger`] handle: opening it (pool, migrations, the writer), the
//! bound on pending tasks, and the writes that go through the group commit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::admit::Admission;
use super::checkpoint;
use super::error::{LedgerError, QueryContext};
use super::holders;
use super::pool::{Pool, migrate, open_pool, open_sqlite_writer, warn_without_autovacuum};
use super::record::{Entry, Lease, Republish, Row};
use super::settings::{Location, StoreSettings};
use super::sql;
use super::transaction::Store;
use super::writer::{self, CommitObservers, PendingCount};
use crate::task::Task;

/// A cheap, cloneable handle to the ledger.
#[derive(Clone)]
pub struct Ledger {
    pub(super) pool: Pool,
    target: Arc<str>,
    /// Made once per ledger (migration 0006): which ledger a chain belongs to.
    identity: Arc<str>,
    pub(super) writes: writer::Handle,
    /// The holder number this handle writes beside each lease it takes
    /// (see [`super::holders`]).
    pub(super) holder: i64,
    pub(super) pending: Arc<PendingCount>,
    max_pending: u64,
    /// `store.health_timeout_ms`.
    health_timeout: Duration,
    /// Stops the recount of pending tasks when the ledger closes.
    closing: CancellationToken,
    /// The last admission the ledger could not write, when and why:
    /// readiness reports it for a while (see [`Ledger::recent_write_failure`]).
    failed_admission: Arc<std::sync::Mutex<Option<(Instant, String)>>>,
}

/// What `check_write` writes: about a task with a small payload.
const WRITE_CHECK_BYTES: usize = 4096;

/// How often the pending count is read back from the database.
const RECOUNT_EVERY: Duration = Duration::from_secs(5);

/// A SQLite ledger with the release stage in a folder of its own, for
/// tests; the caller removes the folder.
#[cfg(test)]
pub(crate) async fn scratch_sqlite() -> (Ledger, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("delayline-ledger-{}", uuid::Uuid::new_v4()));
    let settings = StoreSettings {
        url: format!("sqlite://{}", dir.join("ledger.db").display()).into(),
        ..StoreSettings::default()
    };
    let opened = open(&settings, true, CommitObservers::unobserved()).await;
    let ledger = opened.expect("a SQLite ledger").expect("not stateless");
    (ledger, dir)
}

/// Opens (and migrates) the ledger `settings` name, or `None` in the
/// stateless mode (`store.url = "none"`). `commits` observes each group
/// commit. With `release_stage`, a task's
/// whole payload is kept until it is delivered (a move publishes it again),
/// not only until it is published.
pub async fn open(
    settings: &StoreSettings,
    release_stage: bool,
    commits: CommitObservers,
) -> Result<Option<Ledger>, LedgerError> {
    let Some(location) = Location::parse(settings)? else {
        return Ok(None);
    };
    let pool = open_pool(&location, settings.max_connections).await?;
    let target = location.describe();
    migrate(&pool, &target).await?;
    let identity = read_identity(&pool).await?;
    let pending = Arc::new(PendingCount::default());
    let holder = holders::draw();
    let closing = CancellationToken::new();
    if let Pool::Postgres(pool) = &pool {
        let held = holders::hold(pool, holder, crate::clock::now_ms()).await?;
        let keep = holders::keep(pool.clone(), holder, Some(held), closing.clone());
        tokio::spawn(keep);
    }
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
            commits,
            pending.clone(),
            holder,
        )?,
        holder,
        pool,
        target: target.into(),
        identity: identity.into(),
        pending,
        max_pending: settings.max_pending,
        health_timeout: Duration::from_millis(settings.health_timeout_ms),
        closing,
        failed_admission: Arc::default(),
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
    let read =
        on_pool!(pool, p => sqlx::query_scalar::<_, String>(sql::IDENTITY).fetch_one(p).await);
    read.context("reading the ledger's identity")
}

impl Ledger {
    /// Says at a service's start what in the database's own settings will
    /// hurt the ledger over time (PostgreSQL without autovacuum). The
    /// service calls it, not `open`: an operator's one-off command has no
    /// use for a warning about months of running.
    pub async fn warn_of_database_settings(&self) {
        if let Pool::Postgres(pool) = &self.pool {
            warn_without_autovacuum(pool).await;
        }
    }

    pub fn target(&self) -> &str {
        &self.target
    }

    /// The ledger's identity, the same for every replica that shares it.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Records `task` as `entry` says: pending, leased to the caller until
    /// `lease_until_ms`, or staged; or finds the task this request repeats.
    /// A request is named by its idempotency key, else its id, and
    /// recognised as the same by its `fingerprint`. With `unparks`, the
    /// parked message it replays goes in the same transaction (kept on a
    /// conflict or a failure).
    pub async fn admit(
        &self,
        task: &Task,
        named: (Option<String>, Option<String>),
        lease_until_ms: u64,
        entry: Entry<'_>,
        unparks: Option<String>,
    ) -> Result<Admission, LedgerError> {
        let lease = Lease {
            until_ms: lease_until_ms,
            holder: self.holder,
        };
        let row = Row::new(task, named, lease, entry);
        let admitted = self.writes.admit(row, unparks).await;
        if let Err(error) = &admitted
            && let Ok(mut failed) = self.failed_admission.lock()
        {
            *failed = Some((Instant::now(), error.to_string()));
        }
        admitted
    }

    /// Why an admission could not be written, if one failed within `within`:
    /// a nearly full disk can take a small write (readiness's own check) and
    /// refuse the groups tasks are written in.
    pub fn recent_write_failure(&self, within: Duration) -> Option<String> {
        let failed = self.failed_admission.lock().ok()?;
        let (at, reason) = failed.as_ref()?;
        (at.elapsed() < within).then(|| reason.clone())
    }

    /// The broker confirmed revision `revision` of the task: it is
    /// scheduled, unless it was moved since (its new copy is then awaited).
    /// Only ever called after a confirm.
    pub async fn mark_published(&self, id: String, revision: u64) -> Result<(), LedgerError> {
        self.writes.published(id, revision).await
    }

    /// Publishing revision `revision` failed: the forwarder takes the task
    /// from `republish.again_at_ms` on.
    pub async fn republish_later(
        &self,
        id: String,
        revision: u64,
        republish: Republish,
    ) -> Result<(), LedgerError> {
        self.writes.republish(id, revision, republish).await
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

    /// `question`'s answer, or [`LedgerError::Silent`] once it has taken
    /// `store.health_timeout_ms`: for `/readyz` and `/metrics`, which must
    /// answer while a lock or a hung server holds the ledger.
    pub async fn answered<T>(
        &self,
        context: &'static str,
        question: impl Future<Output = Result<T, LedgerError>>,
    ) -> Result<T, LedgerError> {
        let within = self.health_timeout;
        tokio::time::timeout(within, question)
            .await
            .unwrap_or(Err(LedgerError::Silent { context, within }))
    }

    /// The pending count as last known, without asking the database.
    pub fn pending_estimate(&self) -> u64 {
        self.pending.get()
    }

    /// Whether the ledger can write now: a row of about a task's size
    /// written and removed in one transaction. A full disk, SQLite's page
    /// limit or a database refusing writes fails it, in the database's words.
    pub async fn check_write(&self) -> Result<(), LedgerError> {
        let filler = vec![0u8; WRITE_CHECK_BYTES];
        in_tx!(&self.pool, tx => {
            sqlx::query(sql::WRITE_CHECK)
                .bind(&filler)
                .execute(&mut *tx)
                .await
                .context("writing (a check that the ledger can write)")?;
            sqlx::query(sql::WRITE_CHECKS_REMOVED)
                .execute(&mut *tx)
                .await
                .context("writing (a check that the ledger can write)")?;
        });
        Ok(())
    }

    /// Counts the pending tasks (other replicas add and forward too).
    pub async fn pending_tasks(&self) -> Result<u64, LedgerError> {
        let count: i64 =
            on_pool!(&self.pool, p => sqlx::query_scalar(sql::PENDING_COUNT).fetch_one(p).await)
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

    /// Closes every connection. Call once nothing writes any more: every
    /// write is awaited by its caller, so none is left queued then.
    pub async fn close(&self) {
        self.closing.cancel();
        on_pool!(&self.pool, p => p.close().await);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::LedgerError;

    /// A question the ledger does not answer is given up at the health
    /// timeout and says so; one it answers is passed through.
    #[tokio::test]
    async fn a_health_question_is_given_up_at_the_timeout() {
        let (ledger, dir) = super::scratch_sqlite().await;
        let started = std::time::Instant::now();
        let silent = ledger
            .answered(
                "counting",
                std::future::pending::<Result<u64, LedgerError>>(),
            )
            .await;
        let waited = started.elapsed();
        let Err(LedgerError::Silent { context, within }) = silent else {
            panic!("{silent:?}");
        };
        assert_eq!((context, within), ("counting", Duration::from_millis(800)));
        assert!(waited >= within && waited < within * 4, "{waited:?}");
        let pending = ledger.answered("counting", ledger.pending_tasks()).await;
        assert_eq!(pending.unwrap(), 0);
        ledger.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}
