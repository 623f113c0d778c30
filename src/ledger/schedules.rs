//! Recurring schedules as the ledger stores them.
//!
//! Every change is one statement on one row, guarded by what the caller
//! read (its revision, and for the planner its next occurrence too): two
//! replicas acting on one schedule never both win, and the loser reads the
//! row again to learn why. These are rare writes (a schedule's change, an
//! occurrence a planner made), so they go straight to the pool rather than
//! through the tasks' group commit.

use super::error::{LedgerError, QueryContext};
use super::handle::Ledger;
use super::record::db_ms;
use crate::schedule::{ScheduleContent, TimingSpec};

/// A schedule as the ledger holds it.
#[derive(Clone, Debug)]
pub struct StoredSchedule {
    pub id: String,
    /// The API client that made it, when tokens are required.
    pub client: Option<String>,
    /// 1, plus one per change (a patch, a pause, a resume): part of each
    /// occurrence's task id.
    pub revision: u64,
    pub content: ScheduleContent,
    pub spec: TimingSpec,
    pub paused: bool,
    /// The earliest occurrence not yet made a task; `None` once it has no
    /// more (past its end).
    pub next_at_ms: Option<u64>,
    pub last_occurrence_ms: Option<u64>,
    /// Occurrences made tasks, and occurrences passed over as missed.
    pub occurrences: u64,
    pub missed: u64,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
}

impl StoredSchedule {
    /// Whether `owner` (a client without `admin`) may see it; `None` sees all.
    pub fn within_scope(&self, owner: Option<&str>) -> bool {
        owner.is_none_or(|owner| self.client.as_deref() == Some(owner))
    }
}

/// What a planner records after its steps of a schedule.
#[derive(Clone, Copy, Debug)]
pub struct Advance {
    pub revision: u64,
    /// The next occurrence the planner read (the guard).
    pub from_ms: u64,
    pub to_ms: Option<u64>,
    /// Occurrences it made tasks, and the last of them.
    pub made: u64,
    pub last_made_ms: Option<u64>,
    pub missed: u64,
}

/// A schedule's new content, timing and state, for [`Ledger::change_schedule`].
#[derive(Clone, Debug)]
pub struct ScheduleChange {
    pub content: ScheduleContent,
    pub spec: TimingSpec,
    pub paused: bool,
    pub next_at_ms: Option<u64>,
}

/// Schedules by state, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScheduleCounts {
    pub active: u64,
    pub paused: u64,
    pub finished: u64,
}

const COLUMNS: &str = "id, client, revision, timing, template, paused, next_at_ms, \
     last_occurrence_ms, occurrences, missed, created_at_ms, updated_at_ms";

#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    client: Option<String>,
    revision: i64,
    timing: String,
    template: String,
    paused: i32,
    next_at_ms: Option<i64>,
    last_occurrence_ms: Option<i64>,
    occurrences: i64,
    missed: i64,
    created_at_ms: i64,
    updated_at_ms: i64,
}

fn ms(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

impl Row {
    fn decode(self) -> Result<StoredSchedule, LedgerError> {
        let corrupt = |what: &str, e: serde_json::Error| LedgerError::Corrupt {
            id: self.id.clone(),
            reason: format!("schedule {what}: {e}"),
        };
        let spec = serde_json::from_str(&self.timing).map_err(|e| corrupt("timing", e))?;
        let content = serde_json::from_str(&self.template).map_err(|e| corrupt("template", e))?;
        Ok(StoredSchedule {
            spec,
            content,
            revision: ms(self.revision),
            paused: self.paused != 0,
            next_at_ms: self.next_at_ms.map(ms),
            last_occurrence_ms: self.last_occurrence_ms.map(ms),
            occurrences: ms(self.occurrences),
            missed: ms(self.missed),
            created_at_ms: ms(self.created_at_ms),
            updated_at_ms: ms(self.updated_at_ms),
            id: self.id,
            client: self.client,
        })
    }
}

fn json<T: serde::Serialize>(value: &T) -> String {
    // Content and timing are strings, numbers and raw JSON: they serialise.
    serde_json::to_string(value).unwrap_or_default()
}

fn decode_rows(rows: Vec<Row>) -> Result<Vec<StoredSchedule>, LedgerError> {
    rows.into_iter().map(Row::decode).collect()
}

impl Ledger {
    /// Records a new schedule at revision 1; `false` if its id is taken.
    pub async fn create_schedule(&self, schedule: &StoredSchedule) -> Result<bool, LedgerError> {
        const SQL: &str = "INSERT INTO schedules (id, client, revision, destination, timing, \
             template, paused, next_at_ms, created_at_ms, updated_at_ms) \
             VALUES ($1, $2, 1, $3, $4, $5, $6, $7, $8, $8) ON CONFLICT (id) DO NOTHING";
        let (timing, template) = (json(&schedule.spec), json(&schedule.content));
        let inserted = on_pool!(&self.pool, p => sqlx::query(SQL)
            .bind(&schedule.id)
            .bind(&schedule.client)
            .bind(&schedule.content.destination)
            .bind(&timing)
            .bind(&template)
            .bind(i32::from(schedule.paused))
            .bind(schedule.next_at_ms.map(db_ms))
            .bind(db_ms(schedule.created_at_ms))
            .execute(p)
            .await
            .map(|r| r.rows_affected()))
        .context("creating a schedule")?;
        Ok(inserted == 1)
    }

    pub async fn schedule(&self, id: &str) -> Result<Option<StoredSchedule>, LedgerError> {
        let sql = format!("SELECT {COLUMNS} FROM schedules WHERE id = $1");
        let row: Option<Row> =
            on_pool!(&self.pool, p => sqlx::query_as(&sql).bind(id).fetch_optional(p).await)
                .context("reading a schedule")?;
        row.map(Row::decode).transpose()
    }

    /// Schedules in id order after `after`, `owner`'s only when given.
    pub async fn schedules(
        &self,
        owner: Option<&str>,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<StoredSchedule>, LedgerError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM schedules WHERE id > $1 AND ($2 IS NULL OR client = $2) \
             ORDER BY id LIMIT $3"
        );
        let rows: Vec<Row> = on_pool!(&self.pool, p => sqlx::query_as(&sql)
            .bind(after.unwrap_or(""))
            .bind(owner)
            .bind(i64::from(limit))
            .fetch_all(p)
            .await)
        .context("listing schedules")?;
        decode_rows(rows)
    }

    /// Replaces a schedule's content, timing and state as of `revision`,
    /// making it revision + 1, with the `withdrawn` occurrences (made, not
    /// yet due, cancelled by the change) off its count; `false` if it
    /// changed since (or is gone).
    pub async fn change_schedule(
        &self,
        id: &str,
        revision: u64,
        change: &ScheduleChange,
        withdrawn: u64,
        now_ms: u64,
    ) -> Result<bool, LedgerError> {
        const SQL: &str = "UPDATE schedules SET revision = revision + 1, destination = $3, \
             timing = $4, template = $5, paused = $6, next_at_ms = $7, updated_at_ms = $8, \
             occurrences = CASE WHEN occurrences > $9 THEN occurrences - $9 ELSE 0 END \
             WHERE id = $1 AND revision = $2";
        let (timing, template) = (json(&change.spec), json(&change.content));
        let changed = on_pool!(&self.pool, p => sqlx::query(SQL)
            .bind(id)
            .bind(db_ms(revision))
            .bind(&change.content.destination)
            .bind(&timing)
            .bind(&template)
            .bind(i32::from(change.paused))
            .bind(change.next_at_ms.map(db_ms))
            .bind(db_ms(now_ms))
            .bind(db_ms(withdrawn))
            .execute(p)
            .await
            .map(|r| r.rows_affected()))
        .context("changing a schedule")?;
        Ok(changed == 1)
    }

    /// Deletes a schedule as of `revision`; `false` if it changed since.
    pub async fn delete_schedule(&self, id: &str, revision: u64) -> Result<bool, LedgerError> {
        const SQL: &str = "DELETE FROM schedules WHERE id = $1 AND revision = $2";
        let deleted = on_pool!(&self.pool, p => sqlx::query(SQL)
            .bind(id)
            .bind(db_ms(revision))
            .execute(p)
            .await
            .map(|r| r.rows_affected()))
        .context("deleting a schedule")?;
        Ok(deleted == 1)
    }

    /// Active schedules whose next occurrence is at or before `before_ms`,
    /// earliest first: one probe of `schedules_due`, however many are held.
    pub async fn due_schedules(
        &self,
        before_ms: u64,
        limit: u32,
    ) -> Result<Vec<StoredSchedule>, LedgerError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM schedules \
             WHERE paused = 0 AND next_at_ms IS NOT NULL AND next_at_ms <= $1 \
             ORDER BY next_at_ms LIMIT $2"
        );
        let rows: Vec<Row> = on_pool!(&self.pool, p => sqlx::query_as(&sql)
            .bind(db_ms(before_ms))
            .bind(i64::from(limit))
            .fetch_all(p)
            .await)
        .context("finding due schedules")?;
        decode_rows(rows)
    }

    /// Records a planner's steps, if the schedule is still as it read it
    /// (same revision, same next occurrence, not paused); `false` otherwise.
    pub async fn advance_schedule(
        &self,
        id: &str,
        step: &Advance,
        now_ms: u64,
    ) -> Result<bool, LedgerError> {
        const SQL: &str = "UPDATE schedules SET next_at_ms = $4, \
             last_occurrence_ms = COALESCE($5, last_occurrence_ms), \
             occurrences = occurrences + $6, missed = missed + $7, updated_at_ms = $8 \
             WHERE id = $1 AND revision = $2 AND next_at_ms = $3 AND paused = 0";
        let advanced = on_pool!(&self.pool, p => sqlx::query(SQL)
            .bind(id)
            .bind(db_ms(step.revision))
            .bind(db_ms(step.from_ms))
            .bind(step.to_ms.map(db_ms))
            .bind(step.last_made_ms.map(db_ms))
            .bind(db_ms(step.made))
            .bind(db_ms(step.missed))
            .bind(db_ms(now_ms))
            .execute(p)
            .await
            .map(|r| r.rows_affected()))
        .context("advancing a schedule")?;
        Ok(advanced == 1)
    }

    /// Schedules by state: active (with a next occurrence), paused, finished.
    pub async fn count_schedules(&self) -> Result<ScheduleCounts, LedgerError> {
        const SQL: &str = "SELECT \
             (SELECT COUNT(*) FROM schedules WHERE paused = 0 AND next_at_ms IS NOT NULL), \
             (SELECT COUNT(*) FROM schedules WHERE paused <> 0), \
             (SELECT COUNT(*) FROM schedules WHERE paused = 0 AND next_at_ms IS NULL)";
        let (active, paused, finished): (i64, i64, i64) =
            on_pool!(&self.pool, p => sqlx::query_as(SQL).fetch_one(p).await)
                .context("counting schedules")?;
        Ok(ScheduleCounts {
            active: ms(active),
            paused: ms(paused),
            finished: ms(finished),
        })
    }
}
