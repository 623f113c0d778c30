//! A group's transaction on either backend, one method per step of the
//! writer's group commit: each binds its statement from [`super::sql`].
//!
//! SQLite's side runs on the writer's own `rusqlite` connection, on the
//! writer's own thread (see [`super::writer`]): each step is a synchronous
//! call into SQLite with a prepared, cached statement, with no channel
//! crossed and no argument copied per statement, as sqlx's SQLite driver
//! does. PostgreSQL's side stays on sqlx.
//!
//! That connection runs without the forecast's triggers: a [`SqliteTx`]
//! sums what its statements change in the counts of what falls due and
//! writes the sums before it commits ([`super::due_counts`] says why).

use rusqlite::{Connection, ToSql};
use sqlx::{PgPool, Postgres, Transaction};

use super::due_counts::{self, DueChanges};
use super::error::{LedgerError, QueryContext};
use super::record::db_ms;
use super::record::{INSERT_COLUMNS, Republish, Row};
use super::sql;

/// A row either backend can read: by name from rusqlite, by sqlx on
/// PostgreSQL.
pub(super) trait FromEitherRow:
    for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin + Sized
{
    fn from_sqlite(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self>;
}

/// What the writer writes to: the ledger's database, through the driver
/// that serves its group commit.
pub(super) enum Store {
    Sqlite(Connection),
    Postgres(PgPool),
}

/// A group's transaction on either backend; one method per step.
pub(super) enum Tx<'c> {
    Sqlite(SqliteTx<'c>),
    Postgres(Transaction<'static, Postgres>),
}

/// An open `BEGIN IMMEDIATE` on the writer's connection: rolled back when
/// dropped uncommitted. It holds the connection by `&mut` (which is `Send`,
/// where rusqlite's own `Transaction` holds `&Connection`, which is not), so
/// that the writer's future can be spawned whichever backend it serves.
/// `due` is what its statements changed in the forecast's counts so far.
pub(super) struct SqliteTx<'c> {
    connection: &'c mut Connection,
    open: bool,
    due: DueChanges,
}

impl Drop for SqliteTx<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.connection.execute_batch("ROLLBACK");
        }
    }
}

impl SqliteTx<'_> {
    /// The statement, prepared once per text and then taken from the
    /// connection's cache.
    fn prepared(&self, sql: &str) -> rusqlite::Result<rusqlite::CachedStatement<'_>> {
        self.connection.prepare_cached(&sql::for_sqlite(sql))
    }

    fn execute(&self, sql: &str, parameters: &[&dyn ToSql]) -> rusqlite::Result<u64> {
        let changed = self.prepared(sql)?.execute(parameters)?;
        Ok(changed as u64)
    }

    /// Runs `sql`, which returns each changed task's due time and
    /// destination, and counts `tasks` (`+1` entering, `-1` leaving) for
    /// each; returns how many it changed.
    fn count_each(
        &mut self,
        sql: &str,
        parameters: &[&dyn ToSql],
        tasks: i64,
    ) -> rusqlite::Result<u64> {
        let changed: Vec<(i64, String)> = {
            let mut statement = self.prepared(sql)?;
            let rows = statement.query_map(parameters, |row| Ok((row.get(0)?, row.get(1)?)))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        for (deliver_at_ms, destination) in &changed {
            self.due.add(*deliver_at_ms, destination, tasks);
        }
        Ok(changed.len() as u64)
    }

    /// Writes the counts this transaction changed, one row per minute and
    /// destination, then commits.
    fn commit(&mut self) -> rusqlite::Result<()> {
        for (minute_ms, destination, tasks) in self.due.changed() {
            self.prepared(due_counts::COUNT_DUE)?
                .execute(rusqlite::params![minute_ms, destination, tasks])?;
            if tasks < 0 {
                self.prepared(due_counts::FORGET_UNCOUNTED)?
                    .execute(rusqlite::params![minute_ms, destination])?;
            }
        }
        self.connection.execute_batch("COMMIT")?;
        self.open = false;
        Ok(())
    }

    /// Runs `sql`, written for one row and returning nothing, once for each
    /// of `rows` (the parameters after `leading`); returns how many rows it
    /// changed in all.
    ///
    /// Why one row a statement: SQLite gives a statement that writes many
    /// rows and may fail part way (a CHECK, a NOT NULL) a statement journal,
    /// an in-memory copy of every page it changes, to undo just that
    /// statement; and it tests each row it finds against every term of an
    /// `OR` of ids. A prepared statement over one row needs neither: with
    /// the insert and the scheduled mark one row a statement, the admission
    /// costs a quarter less at 16 callers and HTTP batch's service CPU a
    /// task fell by a seventh (record 36). Not for statements that return
    /// rows: SQLite builds a table for a `RETURNING` clause each time it
    /// runs, and the release's claim and delivered mark, run once a row,
    /// cost it twice.
    fn execute_each<'p, Own: IntoIterator<Item = &'p dyn ToSql>>(
        &self,
        sql: &str,
        leading: &[&'p dyn ToSql],
        rows: impl Iterator<Item = Own>,
    ) -> rusqlite::Result<u64> {
        let mut statement = self.prepared(sql)?;
        let mut parameters = leading.to_vec();
        let mut changed = 0;
        for own in rows {
            parameters.truncate(leading.len());
            parameters.extend(own);
            changed += statement.execute(parameters.as_slice())? as u64;
        }
        Ok(changed)
    }

    /// Inserts `rows`, one statement each (see [`Self::execute_each`]);
    /// returns those inserted, not those whose id or key was taken.
    fn insert_each<'r>(&self, rows: &[&'r Row]) -> rusqlite::Result<Vec<&'r Row>> {
        let mut statement = self.prepared(&sql::insert_one())?;
        let mut inserted = Vec::with_capacity(rows.len());
        for row in rows {
            if statement.execute(insert_parameters(row).as_slice())? == 1 {
                inserted.push(*row);
            }
        }
        Ok(inserted)
    }

    fn states(&self, sql: &str, ids: &[&str]) -> rusqlite::Result<Vec<(String, String, i64)>> {
        let mut statement = self.prepared(sql)?;
        let parameters: Vec<&dyn ToSql> = ids.iter().map(|id| id as &dyn ToSql).collect();
        let rows = statement.query_map(parameters.as_slice(), |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })?;
        rows.collect()
    }

    fn row(&self, sql: &str, key: &str) -> rusqlite::Result<Option<Row>> {
        let mut statement = self.prepared(sql)?;
        let mut rows = statement.query_map([key], Row::from_sqlite)?;
        rows.next().transpose()
    }
}

/// The parameters of a new row, in [`INSERT_COLUMNS`] order.
fn insert_parameters(r: &Row) -> [&dyn ToSql; INSERT_COLUMNS.len()] {
    [
        &r.id,
        &r.idempotency_key,
        &r.fingerprint,
        &r.destination,
        &r.routing_key,
        &r.delay_ms,
        &r.deliver_at_ms,
        &r.content_type,
        &r.headers,
        &r.payload,
        &r.payload_bytes,
        &r.state,
        &r.created_at_ms,
        &r.published_at_ms,
        &r.next_attempt_at_ms,
        &r.attempts,
        &r.last_error,
        &r.client,
        &r.properties,
        &r.exchange,
        &r.leased_by,
        &r.leeway_ms,
        &r.release_at_ms,
        &r.staged_by,
        &r.deadline_ms,
        &r.expired_destination,
    ]
}

/// One `(id, revision)` pair as parameters.
fn pair_of<'p>((id, revision): &'p (&'p str, i64)) -> [&'p dyn ToSql; 2] {
    [id, revision]
}

/// `pairs` as parameters, each id followed by its revision.
fn pair_parameters<'p>(pairs: &'p [(&'p str, i64)]) -> Vec<&'p dyn ToSql> {
    pairs.iter().flat_map(pair_of).collect()
}

impl Tx<'_> {
    pub(super) async fn begin(store: &mut Store) -> Result<Tx<'_>, LedgerError> {
        Ok(match store {
            Store::Sqlite(connection) => {
                // IMMEDIATE: the write lock is taken now, so that a group
                // that reads before it writes (a claim) never fails to
                // upgrade its lock past another connection's write.
                connection
                    .execute_batch("BEGIN IMMEDIATE")
                    .context("starting a transaction")?;
                Tx::Sqlite(SqliteTx {
                    connection,
                    open: true,
                    due: DueChanges::default(),
                })
            }
            Store::Postgres(pool) => {
                Tx::Postgres(pool.begin().await.context("starting a transaction")?)
            }
        })
    }

    pub(super) async fn commit(self) -> Result<(), LedgerError> {
        match self {
            Tx::Sqlite(mut tx) => tx.commit().context("committing"),
            Tx::Postgres(t) => t.commit().await.context("committing"),
        }
    }

    /// One chunk of new rows; returns the ids actually inserted.
    pub(super) async fn insert(&mut self, rows: &[&Row]) -> Result<Vec<String>, LedgerError> {
        match self {
            Tx::Sqlite(tx) => {
                let inserted = tx.insert_each(rows).context("recording tasks")?;
                for row in &inserted {
                    if due_counts::is_counted(&row.state) {
                        tx.due.add(row.deliver_at_ms, &row.destination, 1);
                    }
                }
                Ok(inserted.into_iter().map(|row| row.id.clone()).collect())
            }
            Tx::Postgres(t) => {
                let sql = sql::insert(rows.len());
                let mut query = sqlx::query_scalar(&sql);
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
                        .bind(&r.exchange)
                        .bind(r.leased_by)
                        .bind(r.leeway_ms)
                        .bind(r.release_at_ms)
                        .bind(&r.staged_by)
                        .bind(r.deadline_ms)
                        .bind(&r.expired_destination);
                }
                query.fetch_all(&mut **t).await.context("recording tasks")
            }
        }
    }

    /// One chunk of a release claim, of tasks matching `from` (which
    /// are `counted` in the forecast, or all not): the `(id, revision)`
    /// pairs it claimed.
    pub(super) async fn claim(
        &mut self,
        from: &str,
        counted: bool,
        pairs: &[(&str, i64)],
    ) -> Result<Vec<(String, i64)>, LedgerError> {
        let sql = sql::claim(from, pairs.len());
        let claimed: Vec<(String, i64, i64, String)> = match self {
            Tx::Sqlite(tx) => {
                let read = || -> rusqlite::Result<Vec<(String, i64, i64, String)>> {
                    let mut statement = tx.prepared(&sql)?;
                    let rows = statement.query_map(pair_parameters(pairs).as_slice(), |row| {
                        Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
                    })?;
                    rows.collect()
                };
                let claimed = read().context("claiming due tasks")?;
                if !counted {
                    for (_, _, deliver_at_ms, destination) in &claimed {
                        tx.due.add(*deliver_at_ms, destination, 1);
                    }
                }
                claimed
            }
            Tx::Postgres(t) => {
                let mut query = sqlx::query_as(&sql);
                for (id, revision) in pairs {
                    query = query.bind(*id).bind(*revision);
                }
                query
                    .fetch_all(&mut **t)
                    .await
                    .context("claiming due tasks")?
            }
        };
        Ok(claimed
            .into_iter()
            .map(|(id, revision, ..)| (id, revision))
            .collect())
    }

    pub(super) async fn states(
        &mut self,
        ids: &[&str],
    ) -> Result<Vec<(String, String, i64)>, LedgerError> {
        let sql = sql::states(ids.len());
        match self {
            Tx::Sqlite(tx) => tx.states(&sql, ids).context("reading due tasks"),
            Tx::Postgres(t) => {
                let mut query = sqlx::query_as::<_, (String, String, i64)>(&sql);
                for id in ids {
                    query = query.bind(*id);
                }
                query.fetch_all(&mut **t).await.context("reading due tasks")
            }
        }
    }

    /// The row holding `row`'s idempotency key, or else its id.
    pub(super) async fn holder_of(&mut self, row: &Row) -> Result<Option<Row>, LedgerError> {
        if let Some(key) = &row.idempotency_key {
            let by_key = sql::holder_by_key();
            let holder = self
                .row(&by_key, key, "looking up an idempotency key")
                .await?;
            if holder.is_some() {
                return Ok(holder);
            }
        }
        self.row(&sql::holder_by_id(), &row.id, "looking up a task id")
            .await
    }

    /// The one row `sql` selects by `key`, if any.
    async fn row(
        &mut self,
        sql: &str,
        key: &str,
        context: &'static str,
    ) -> Result<Option<Row>, LedgerError> {
        match self {
            Tx::Sqlite(tx) => tx.row(sql, key).context(context),
            Tx::Postgres(t) => sqlx::query_as(sql)
                .bind(key)
                .fetch_optional(&mut **t)
                .await
                .context(context),
        }
    }

    /// Returns how many of the pairs were pending and are now scheduled.
    pub(super) async fn mark_published(
        &mut self,
        pairs: &[(&str, i64)],
        now_ms: i64,
        trim: bool,
        payload_copy_bytes: u32,
    ) -> Result<u64, LedgerError> {
        let copy_bytes = i32::try_from(payload_copy_bytes).unwrap_or(i32::MAX);
        match self {
            Tx::Sqlite(tx) => {
                let each = pairs.iter().map(pair_of);
                tx.execute_each(&sql::mark_published(1, trim), &[&now_ms, &copy_bytes], each)
                    .context("marking tasks scheduled")
            }
            Tx::Postgres(t) => {
                let sql = sql::mark_published(pairs.len(), trim);
                let mut query = sqlx::query(&sql).bind(now_ms).bind(copy_bytes);
                for (id, revision) in pairs {
                    query = query.bind(*id).bind(*revision);
                }
                let done = query.execute(&mut **t).await;
                done.map(|done| done.rows_affected())
                    .context("marking tasks scheduled")
            }
        }
    }

    pub(super) async fn mark_delivered(
        &mut self,
        ids: &[&str],
        at_ms: i64,
        payload_copy_bytes: u32,
    ) -> Result<(), LedgerError> {
        let sql = sql::mark_delivered(ids.len());
        let copy_bytes = i32::try_from(payload_copy_bytes).unwrap_or(i32::MAX);
        match self {
            Tx::Sqlite(tx) => {
                let mut parameters: Vec<&dyn ToSql> = vec![&at_ms, &copy_bytes];
                parameters.extend(ids.iter().map(|id| id as &dyn ToSql));
                tx.count_each(&sql, &parameters, -1)
                    .map(|_| ())
                    .context("marking tasks delivered")
            }
            Tx::Postgres(t) => {
                let mut query = sqlx::query(&sql).bind(at_ms).bind(copy_bytes);
                for id in ids {
                    query = query.bind(*id);
                }
                let done = query.execute(&mut **t).await;
                done.map(|_| ()).context("marking tasks delivered")
            }
        }
    }

    /// Claimed tasks staged, each until its moment: per task, whether it
    /// was (the ledger holds its whole payload).
    pub(super) async fn stage(
        &mut self,
        staged: &[(&str, i64)],
        staged_by: &str,
    ) -> Result<Vec<bool>, LedgerError> {
        let mut done = Vec::with_capacity(staged.len());
        match self {
            Tx::Sqlite(tx) => {
                let mut stage = || -> rusqlite::Result<()> {
                    let mut statement = tx.prepared(sql::STAGE_RELEASING)?;
                    for (id, at) in staged {
                        done.push(statement.execute(rusqlite::params![at, id, staged_by])? == 1);
                    }
                    Ok(())
                };
                stage().context("staging due tasks")?;
            }
            Tx::Postgres(t) => {
                for (id, at) in staged {
                    let changed = sqlx::query(sql::STAGE_RELEASING)
                        .bind(*at)
                        .bind(*id)
                        .bind(staged_by)
                        .execute(&mut **t)
                        .await
                        .context("staging due tasks")?;
                    done.push(changed.rows_affected() == 1);
                }
            }
        }
        Ok(done)
    }

    /// Up to `most` staged tasks whose moment is by `by_ms` (staged by
    /// `own`) or by `others_by_ms` (staged by another process), taken for
    /// release under a lease until `lease_until_ms`, in release order.
    pub(super) async fn unstage(
        &mut self,
        (by_ms, others_by_ms): (u64, u64),
        own: &str,
        (lease_until_ms, holder): (u64, i64),
        most: u32,
    ) -> Result<Vec<Row>, LedgerError> {
        let sql = sql::unstage();
        let (by, lease, most) = (db_ms(by_ms), db_ms(lease_until_ms), i64::from(most));
        let others_by = db_ms(others_by_ms);
        match self {
            Tx::Sqlite(tx) => {
                let read = || -> rusqlite::Result<Vec<Row>> {
                    let parameters: [&dyn ToSql; 6] =
                        [&by, &lease, &most, &own, &others_by, &holder];
                    let mut statement = tx.prepared(&sql)?;
                    let rows = statement.query_map(parameters.as_slice(), Row::from_sqlite)?;
                    rows.collect()
                };
                read().context("taking staged tasks")
            }
            Tx::Postgres(t) => sqlx::query_as::<_, Row>(&sql)
                .bind(by)
                .bind(lease)
                .bind(most)
                .bind(own)
                .bind(others_by)
                .bind(holder)
                .fetch_all(&mut **t)
                .await
                .context("taking staged tasks"),
        }
    }

    /// Claimed tasks `ids` wait for limit `limit` instead.
    pub(super) async fn wait_for_limit(
        &mut self,
        ids: &[&str],
        limit: &str,
    ) -> Result<(), LedgerError> {
        let sql = sql::hold_releasing(ids.len());
        match self {
            Tx::Sqlite(tx) => {
                let mut parameters: Vec<&dyn ToSql> = vec![&limit];
                parameters.extend(ids.iter().map(|id| id as &dyn ToSql));
                tx.execute(&sql, &parameters)
                    .map(|_| ())
                    .context("holding due tasks for a limit")
            }
            Tx::Postgres(t) => {
                let mut query = sqlx::query(&sql).bind(limit);
                for id in ids {
                    query = query.bind(*id);
                }
                let done = query.execute(&mut **t).await;
                done.map(|_| ()).context("holding due tasks for a limit")
            }
        }
    }

    /// Every row `sql` (without parameters) returns.
    pub(super) async fn rows_of<T: FromEitherRow>(
        &mut self,
        sql: &str,
        what: &'static str,
    ) -> Result<Vec<T>, LedgerError> {
        match self {
            Tx::Sqlite(tx) => {
                let read = || -> rusqlite::Result<Vec<T>> {
                    let mut statement = tx.prepared(sql)?;
                    let rows = statement.query_map([], |row| T::from_sqlite(row))?;
                    rows.collect()
                };
                read().context(what)
            }
            Tx::Postgres(t) => sqlx::query_as::<_, T>(sql)
                .fetch_all(&mut **t)
                .await
                .context(what),
        }
    }

    /// Up to `wanted` of `destination`'s waiting tasks due by `now_ms`, in
    /// due order: id and due time.
    pub(super) async fn waiting_of(
        &mut self,
        destination: &str,
        now_ms: u64,
        wanted: u64,
    ) -> Result<Vec<(String, i64)>, LedgerError> {
        let (now, wanted) = (db_ms(now_ms), i64::try_from(wanted).unwrap_or(i64::MAX));
        match self {
            Tx::Sqlite(tx) => {
                let read = || -> rusqlite::Result<Vec<(String, i64)>> {
                    let mut statement = tx.prepared(sql::WAITING_OF_DESTINATION)?;
                    let rows = statement
                        .query_map(rusqlite::params![destination, now, wanted], |row| {
                            Ok((row.get(0)?, row.get(1)?))
                        })?;
                    rows.collect()
                };
                read().context("reading waiting tasks")
            }
            Tx::Postgres(t) => sqlx::query_as(sql::WAITING_OF_DESTINATION)
                .bind(destination)
                .bind(now)
                .bind(wanted)
                .fetch_all(&mut **t)
                .await
                .context("reading waiting tasks"),
        }
    }

    /// Moves waiting tasks `ids` to `releasing`, leased until
    /// `lease_until_ms`; the rows as they are now.
    pub(super) async fn release_waiting(
        &mut self,
        ids: &[&str],
        (lease_until_ms, holder): (u64, i64),
    ) -> Result<Vec<Row>, LedgerError> {
        let sql = sql::release_waiting(ids.len());
        let lease = db_ms(lease_until_ms);
        match self {
            Tx::Sqlite(tx) => {
                let read = || -> rusqlite::Result<Vec<Row>> {
                    let mut parameters: Vec<&dyn ToSql> = vec![&lease, &holder];
                    parameters.extend(ids.iter().map(|id| id as &dyn ToSql));
                    let mut statement = tx.prepared(&sql)?;
                    let rows = statement.query_map(parameters.as_slice(), Row::from_sqlite)?;
                    rows.collect()
                };
                read().context("releasing waiting tasks")
            }
            Tx::Postgres(t) => {
                let mut query = sqlx::query_as::<_, Row>(&sql).bind(lease).bind(holder);
                for id in ids {
                    query = query.bind(*id);
                }
                query
                    .fetch_all(&mut **t)
                    .await
                    .context("releasing waiting tasks")
            }
        }
    }

    /// Writes a limit's bucket after a pass (`sql`: name, tokens, as of,
    /// released).
    pub(super) async fn save_bucket(
        &mut self,
        sql: &str,
        name: &str,
        tokens: f64,
        at_ms: u64,
        taken: u64,
    ) -> Result<(), LedgerError> {
        let (at, taken) = (db_ms(at_ms), db_ms(taken));
        match self {
            Tx::Sqlite(tx) => tx
                .execute(sql, &[&name, &tokens, &at, &taken])
                .map(|_| ())
                .context("taking tokens"),
            Tx::Postgres(t) => sqlx::query(sql)
                .bind(name)
                .bind(tokens)
                .bind(at)
                .bind(taken)
                .execute(&mut **t)
                .await
                .map(|_| ())
                .context("taking tokens"),
        }
    }

    pub(super) async fn schedule_republish(
        &mut self,
        id: &str,
        revision: u64,
        republish: &Republish,
        holder: i64,
    ) -> Result<(), LedgerError> {
        let again_at = db_ms(republish.again_at_ms);
        let publish_alone = i64::from(republish.publish_alone);
        let refused = i64::from(republish.refused);
        let revision = db_ms(revision);
        match self {
            Tx::Sqlite(tx) => tx
                .execute(
                    sql::SCHEDULE_RETRY,
                    &[
                        &again_at,
                        &republish.error,
                        &publish_alone,
                        &refused,
                        &id,
                        &revision,
                        &holder,
                    ],
                )
                .map(|_| ())
                .context("recording a failed publish to be tried again"),
            Tx::Postgres(t) => sqlx::query(sql::SCHEDULE_RETRY)
                .bind(again_at)
                .bind(&republish.error)
                .bind(publish_alone)
                .bind(refused)
                .bind(id)
                .bind(revision)
                .bind(holder)
                .execute(&mut **t)
                .await
                .map(|_| ())
                .context("recording a failed publish to be tried again"),
        }
    }

    /// Deletes the parked messages whose replays this transaction records
    /// (one statement a row, as the insert).
    pub(super) async fn unpark(&mut self, ids: &[&str]) -> Result<(), LedgerError> {
        match self {
            Tx::Sqlite(tx) => {
                let each = ids.iter().map(|id| [id as &dyn ToSql]);
                tx.execute_each(sql::UNPARK, &[], each)
                    .context("deleting replayed parked messages")?;
            }
            Tx::Postgres(t) => {
                for id in ids {
                    sqlx::query(sql::UNPARK)
                        .bind(*id)
                        .execute(&mut **t)
                        .await
                        .context("deleting replayed parked messages")?;
                }
            }
        }
        Ok(())
    }

    /// Returns whether the task was pending.
    pub(super) async fn mark_failed(
        &mut self,
        id: &str,
        revision: Option<u64>,
        reason: &str,
    ) -> Result<bool, LedgerError> {
        let revision = revision.map(db_ms);
        for (sql, was_pending) in [(sql::FAIL_PENDING, true), (sql::FAIL_SCHEDULED, false)] {
            let changed = match self {
                Tx::Sqlite(tx) => tx
                    .count_each(sql, &[&reason, &id, &revision], -1)
                    .context("marking a task failed")?,
                Tx::Postgres(t) => sqlx::query(sql)
                    .bind(reason)
                    .bind(id)
                    .bind(revision)
                    .execute(&mut **t)
                    .await
                    .map(|done| done.rows_affected())
                    .context("marking a task failed")?,
            };
            if changed > 0 {
                return Ok(was_pending);
            }
        }
        Ok(false)
    }

    /// Records a planner's steps of schedule `id` if it is still as the
    /// planner read it, and hands back its planning lease; whether it was.
    /// `values` are the statement's parameters after the id, in order.
    pub(super) async fn advance_schedule(
        &mut self,
        id: &str,
        values: [Option<i64>; 7],
    ) -> Result<bool, LedgerError> {
        let changed = match self {
            Tx::Sqlite(tx) => {
                let mut parameters: Vec<&dyn ToSql> = vec![&id];
                parameters.extend(values.iter().map(|v| v as &dyn ToSql));
                tx.execute(sql::ADVANCE_SCHEDULE, &parameters)
                    .context("advancing a schedule")?
            }
            Tx::Postgres(t) => values
                .iter()
                .fold(sqlx::query(sql::ADVANCE_SCHEDULE).bind(id), |q, v| {
                    q.bind(*v)
                })
                .execute(&mut **t)
                .await
                .map(|done| done.rows_affected())
                .context("advancing a schedule")?,
        };
        Ok(changed == 1)
    }
}
