//! What falls due, per minute and destination: the counts the triggers of
//! migration 0013 keep (`due_counts`, and on PostgreSQL the changes not yet
//! folded into them, `due_changes`), read for a forecast; and the fold.
//! The statements on these two tables are here, and only here, but for the
//! two with which SQLite's group-commit writer, which runs without the
//! triggers, adds its own changes ([`super::due_counts`]).

use super::error::{LedgerError, QueryContext};
use super::handle::Ledger;
use super::pool::Pool;
use super::record::db_ms;
use crate::forecast::{MinuteCount, chosen};

/// The counts and the changes not yet folded in, in `[$1, $2)`.
const DUE: &str = "(SELECT minute_ms, destination, tasks FROM due_counts \
     WHERE minute_ms >= $1 AND minute_ms < $2 \
     UNION ALL SELECT minute_ms, destination, delta FROM due_changes \
     WHERE minute_ms >= $1 AND minute_ms < $2) AS due";

/// Destinations named at most in one statement.
const NAMED_AT_ONCE: usize = 500;

/// One replica at a time folds, so that no two take the same counts' rows in
/// different orders.
const FOLD_LOCK: &str = "SELECT pg_advisory_xact_lock(6446837476)";

/// Moves every committed change into the counts, in one statement: a change
/// committed meanwhile is not seen by the delete and waits for the next fold.
const FOLD: &str = "WITH folded AS (DELETE FROM due_changes \
     RETURNING minute_ms, destination, delta) \
     INSERT INTO due_counts (minute_ms, destination, tasks) \
     SELECT minute_ms, destination, SUM(delta) FROM folded \
     GROUP BY minute_ms, destination ORDER BY minute_ms, destination \
     ON CONFLICT (minute_ms, destination) DO UPDATE SET tasks = due_counts.tasks + EXCLUDED.tasks";

/// Minutes that no longer count anything, once past (a future one may come
/// back; it costs one row until then).
const FORGET_EMPTY: &str = "DELETE FROM due_counts WHERE minute_ms < $1 AND tasks = 0";

/// PostgreSQL's snapshot for the whole transaction (its default gives each
/// statement its own); SQLite's read transaction has one already.
const ONE_SNAPSHOT: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY";

/// `SUM` per minute of the destinations named `$3…` (of `names`, or of all).
fn per_minute_statement(names: Option<usize>) -> String {
    let named = names.map_or(String::new(), |count| {
        let places: Vec<String> = (3..3 + count).map(|i| format!("${i}")).collect();
        format!(" WHERE destination IN ({})", places.join(", "))
    });
    format!("SELECT minute_ms, CAST(SUM(tasks) AS BIGINT) FROM {DUE}{named} GROUP BY minute_ms")
}

/// Reads, on the transaction `$tx`, which destinations fall due in the
/// window, then the counts per minute of those `$counted` accepts, named
/// [`NAMED_AT_ONCE`] at a time (all of them, unnamed, when it accepts every one).
macro_rules! counted_per_minute {
    ($tx:ident, $from_ms:expr, $to_ms:expr, $counted:expr) => {{
        let destinations: Vec<String> =
            sqlx::query_scalar(&format!("SELECT DISTINCT destination FROM {DUE}"))
                .bind(db_ms($from_ms))
                .bind(db_ms($to_ms))
                .fetch_all(&mut *$tx)
                .await
                .context("reading which destinations fall due")?;
        let groups: Vec<Option<Vec<String>>> = match chosen(destinations, $counted) {
            None => vec![None],
            Some(named) => named
                .chunks(NAMED_AT_ONCE)
                .map(|c| Some(c.to_vec()))
                .collect(),
        };
        let mut rows: Vec<(i64, i64)> = Vec::new();
        for group in groups {
            let statement = per_minute_statement(group.as_ref().map(Vec::len));
            let mut query = sqlx::query_as(&statement)
                .bind(db_ms($from_ms))
                .bind(db_ms($to_ms));
            for name in group.iter().flatten() {
                query = query.bind(name);
            }
            let found: Vec<(i64, i64)> = query
                .fetch_all(&mut *$tx)
                .await
                .context("reading what falls due")?;
            rows.extend(found);
        }
        rows
    }};
}

fn minute_counts(rows: Vec<(i64, i64)>) -> Vec<MinuteCount> {
    rows.into_iter()
        .map(|(minute_ms, tasks)| MinuteCount {
            minute_ms: u64::try_from(minute_ms).unwrap_or(0),
            tasks,
        })
        .collect()
}

impl Ledger {
    /// Tasks on their way (pending, scheduled, releasing, waiting, staged) due in
    /// each minute of `[from_ms, to_ms)` of the destinations `counted`
    /// accepts, summed in the database. Which destinations fall due and
    /// their counts are read in one snapshot: read apart, a destination the
    /// filter never saw, admitted between the two reads, was counted with
    /// the others when every one seen was accepted.
    pub async fn due_per_minute_of(
        &self,
        from_ms: u64,
        to_ms: u64,
        counted: impl Fn(&str) -> bool,
    ) -> Result<Vec<MinuteCount>, LedgerError> {
        let rows = match &self.pool {
            Pool::Sqlite(pool) => {
                let mut tx = pool.begin().await.context("starting a transaction")?;
                let rows = counted_per_minute!(tx, from_ms, to_ms, &counted);
                tx.commit().await.context("ending the read")?;
                rows
            }
            Pool::Postgres(pool) => {
                let mut tx = pool.begin().await.context("starting a transaction")?;
                sqlx::query(ONE_SNAPSHOT)
                    .execute(&mut *tx)
                    .await
                    .context("reading in one snapshot")?;
                let rows = counted_per_minute!(tx, from_ms, to_ms, &counted);
                tx.commit().await.context("ending the read")?;
                rows
            }
        };
        Ok(minute_counts(rows))
    }

    /// Tasks on their way due in each minute of `[from_ms, to_ms)`, every
    /// destination's, summed in the database in one statement.
    pub async fn due_per_minute(
        &self,
        from_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<MinuteCount>, LedgerError> {
        let statement = per_minute_statement(None);
        let rows: Vec<(i64, i64)> = on_pool!(&self.pool, p => sqlx::query_as(&statement)
            .bind(db_ms(from_ms))
            .bind(db_ms(to_ms))
            .fetch_all(p)
            .await)
        .context("reading what falls due")?;
        Ok(minute_counts(rows))
    }

    /// Every task on its way (pending, scheduled, releasing, waiting, staged),
    /// whenever it falls due: what the chain and the ledger still have to
    /// deliver. Read off the forecast's counts, not the tasks.
    pub async fn tasks_on_their_way(&self) -> Result<u64, LedgerError> {
        let minutes = self.due_per_minute(0, u64::MAX).await?;
        let tasks: i64 = minutes.iter().map(|minute| minute.tasks).sum();
        Ok(u64::try_from(tasks).unwrap_or(0))
    }

    /// Folds PostgreSQL's changes into the counts, and forgets empty
    /// minutes before `now_ms`; returns how many changes. (SQLite's
    /// triggers count in place: nothing to fold.)
    pub async fn fold_due_changes(&self, now_ms: u64) -> Result<u64, LedgerError> {
        let Pool::Postgres(pool) = &self.pool else {
            return Ok(0);
        };
        let mut tx = pool.begin().await.context("starting a transaction")?;
        sqlx::query(FOLD_LOCK)
            .execute(&mut *tx)
            .await
            .context("waiting for the fold's lock")?;
        let folded = sqlx::query(FOLD)
            .execute(&mut *tx)
            .await
            .context("folding what falls due")?
            .rows_affected();
        sqlx::query(FORGET_EMPTY)
            .bind(db_ms(now_ms))
            .execute(&mut *tx)
            .await
            .context("forgetting empty minutes")?;
        tx.commit().await.context("committing")?;
        Ok(folded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::pool::migrated_sqlite;
    use sqlx::Row;

    async fn counts(pool: &sqlx::SqlitePool) -> Vec<(i64, String, i64)> {
        sqlx::query_as("SELECT minute_ms, destination, tasks FROM due_counts ORDER BY 1, 2")
            .fetch_all(pool)
            .await
            .unwrap()
    }

    /// SQLite's writer runs without triggers and does what these four do
    /// itself ([`super::super::due_counts`]); it would skip a new trigger,
    /// so a migration that adds one must change the writer too, and this
    /// list.
    #[tokio::test]
    async fn the_sqlite_schema_has_only_the_forecasts_triggers() {
        let pool = migrated_sqlite().await;
        let triggers: Vec<String> =
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY 1")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(
            triggers,
            [
                "due_counts_on_delete",
                "due_counts_on_enter",
                "due_counts_on_insert",
                "due_counts_on_leave"
            ]
        );
    }

    /// The triggers build no temporary table when they fire: SQLite builds
    /// one for each `IN` over more than two constants, as 0013's state
    /// lists were, every time (migration 0016). `EXPLAIN` lists the
    /// triggers' programs after the statement's own.
    #[tokio::test]
    async fn sqlites_triggers_build_no_table_when_they_fire() {
        let pool = migrated_sqlite().await;
        for statement in [
            "INSERT INTO tasks (id, destination, routing_key, delay_ms, deliver_at_ms, \
             content_type, headers, payload_bytes, state, created_at_ms, next_attempt_at_ms) \
             VALUES ('a', 'd', 'k', 0, 0, 't', '{}', 0, 'pending', 0, 0)",
            "UPDATE tasks SET state = 'cancelled' WHERE id = 'a'",
            "UPDATE tasks SET deliver_at_ms = 1 WHERE id = 'a'",
            "DELETE FROM tasks WHERE id = 'a'",
        ] {
            let explain = format!("EXPLAIN {statement}");
            let steps = sqlx::query(&explain).fetch_all(&pool).await.unwrap();
            let opcodes: Vec<String> = steps.iter().map(|step| step.get(1)).collect();
            let fired = opcodes.iter().filter(|op| *op == "Program").count();
            assert!(fired >= 1, "{statement}: {opcodes:?}");
            assert!(
                !opcodes.iter().any(|op| op == "OpenEphemeral"),
                "{statement}: {opcodes:?}"
            );
        }
    }

    /// SQLite's triggers keep the counts in place through every change a
    /// task goes through: admitted, moved (to another minute, within one),
    /// released, cancelled, pruned.
    #[tokio::test]
    async fn sqlites_triggers_count_each_task_in_its_minute_while_it_is_on_its_way() {
        let pool = migrated_sqlite().await;
        let insert = async |id: &str, destination: &str, at: i64, state: &str| {
            sqlx::query(
                "INSERT INTO tasks (id, destination, routing_key, delay_ms, deliver_at_ms, \
                 content_type, headers, payload_bytes, state, created_at_ms, next_attempt_at_ms) \
                 VALUES ($1, $2, 'k', 0, $3, 't', '{}', 0, $4, 0, 0)",
            )
            .bind(id)
            .bind(destination)
            .bind(at)
            .bind(state)
            .execute(&pool)
            .await
            .unwrap();
        };
        let update = async |statement: &str, id: &str| {
            sqlx::query(statement)
                .bind(id)
                .execute(&pool)
                .await
                .unwrap();
        };
        insert("a", "d", 60_000, "pending").await;
        insert("b", "d", 119_999, "scheduled").await;
        insert("c", "e", 60_001, "waiting").await;
        insert("x", "d", 60_000, "delivered").await;
        assert_eq!(
            counts(&pool).await,
            [(60_000, "d".into(), 2), (60_000, "e".into(), 1)]
        );
        update("UPDATE tasks SET state = 'scheduled' WHERE id = $1", "a").await;
        update("UPDATE tasks SET deliver_at_ms = 60_500 WHERE id = $1", "a").await;
        update(
            "UPDATE tasks SET deliver_at_ms = 180_000 WHERE id = $1",
            "b",
        )
        .await;
        assert_eq!(
            counts(&pool).await,
            [
                (60_000, "d".into(), 1),
                (60_000, "e".into(), 1),
                (180_000, "d".into(), 1)
            ]
        );
        update("UPDATE tasks SET state = 'releasing' WHERE id = $1", "a").await;
        update("UPDATE tasks SET state = 'delivered' WHERE id = $1", "a").await;
        update("UPDATE tasks SET state = 'cancelled' WHERE id = $1", "c").await;
        update("UPDATE tasks SET state = 'pending' WHERE id = $1", "x").await;
        update("DELETE FROM tasks WHERE id = $1", "b").await;
        assert_eq!(counts(&pool).await, [(60_000, "d".into(), 1)]);
        let statement = format!("SELECT minute_ms, destination, tasks FROM {DUE}");
        let read: Vec<(i64, String, i64)> = sqlx::query_as(&statement)
            .bind(0_i64)
            .bind(120_000_i64)
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(read, [(60_000, "d".into(), 1)]);
    }
}
