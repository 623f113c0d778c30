//! Recurring schedules as the ledger stores them.
//!
//! Every change is one statement on one row, guarded by what the caller
//! read (its revision, and for the planner its next occurrence too): two
//! replicas acting on one schedule never both win, and the loser reads the
//! row again to learn why. A schedule's change is a rare write, so it goes
//! straight to the pool; the planner's steps are not (50,000 schedules may
//! fire at one instant): they go through the tasks' group commit with the
//! occurrences' tasks, a page at a time ([`super::plan`]).

use super::admit::{Admission, Judged};
use super::error::{LedgerError, QueryContext};
use super::handle::Ledger;
use super::plan::{Advance, PlanWrite};
use super::pool::Pool;
use super::record::Row as TaskRow;
use super::record::db_ms;
use super::record::{Entry, Lease};
use crate::recurrence::{ScheduleContent, TimingSpec};
use crate::task::Task;

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

/// A schedule's new content, timing and state, for [`Ledger::change_schedule`].
#[derive(Clone, Debug)]
pub struct ScheduleChange {
    pub content: ScheduleContent,
    pub spec: TimingSpec,
    pub paused: bool,
    pub next_at_ms: Option<u64>,
}

/// One schedule of a planner's page: its steps, and its occurrences'
/// tasks, each with the fingerprint of the body it was made from (an
/// occurrence made again is then a replay, not a conflict).
pub struct PlannedSchedule<'a> {
    pub id: &'a str,
    pub advance: Advance,
    /// Each occurrence's task, its fingerprint, and how it enters.
    pub tasks: Vec<(&'a Task, String, Entry<'a>)>,
}

/// What a page's write found for one schedule: `None` if it was not as the
/// planner read it (nothing of it written), otherwise each task's
/// admission, in order.
pub type Planned = Option<Vec<Admission>>;

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
             planning_until_ms = NULL, \
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

    /// Takes up to `limit` active schedules whose next occurrence is at or
    /// before `before_ms`, earliest first, for `lease_ms` from `now_ms`:
    /// one probe of `schedules_due`, however many are held. Those another
    /// planner holds under an unexpired lease are passed over (on
    /// PostgreSQL, so are rows another replica is taking this moment), so
    /// replicas take different pages of a large instant. The page's write
    /// ([`Ledger::plan_schedules`]) clears the lease.
    pub async fn take_due_schedules(
        &self,
        before_ms: u64,
        limit: u32,
        now_ms: u64,
        lease_ms: u64,
    ) -> Result<Vec<StoredSchedule>, LedgerError> {
        const DUE: &str = "SELECT id FROM schedules WHERE paused = 0 AND next_at_ms IS NOT NULL \
             AND next_at_ms <= $1 AND (planning_until_ms IS NULL OR planning_until_ms <= $2)";
        // Read first: most polls find none, and a write would take the lock
        // the group writer commits with.
        let any: Option<(String,)> =
            on_pool!(&self.pool, p => sqlx::query_as(&format!("{DUE} LIMIT 1"))
            .bind(db_ms(before_ms))
            .bind(db_ms(now_ms))
            .fetch_optional(p)
            .await)
            .context("looking for due schedules")?;
        if any.is_none() {
            return Ok(Vec::new());
        }
        let sql = |lock: &str| {
            format!(
                "UPDATE schedules SET planning_until_ms = $3 WHERE id IN (\
                 SELECT id FROM schedules WHERE paused = 0 AND next_at_ms IS NOT NULL \
                 AND next_at_ms <= $1 \
                 AND (planning_until_ms IS NULL OR planning_until_ms <= $4) \
                 ORDER BY next_at_ms LIMIT $2{lock}) RETURNING {COLUMNS}"
            )
        };
        let until = db_ms(now_ms.saturating_add(lease_ms));
        // SQLite has one writer at a time: nothing to pass over.
        let sql = match &self.pool {
            Pool::Sqlite(_) => sql(""),
            Pool::Postgres(_) => sql(" FOR UPDATE SKIP LOCKED"),
        };
        let rows: Vec<Row> = on_pool!(&self.pool, p => sqlx::query_as(&sql)
            .bind(db_ms(before_ms))
            .bind(i64::from(limit))
            .bind(until)
            .bind(db_ms(now_ms))
            .fetch_all(p)
            .await)
        .context("taking due schedules")?;
        let mut due = decode_rows(rows)?;
        due.sort_by_key(|s| (s.next_at_ms, s.id.clone()));
        Ok(due)
    }

    /// Hands back the leases of schedules a page could not plan (the
    /// ledger refused its write): planned again at the next poll.
    pub async fn release_schedules(&self, ids: &[&str]) -> Result<(), LedgerError> {
        for id in ids {
            const SQL: &str = "UPDATE schedules SET planning_until_ms = NULL WHERE id = $1";
            on_pool!(&self.pool, p => sqlx::query(SQL).bind(*id).execute(p).await.map(drop))
                .context("handing back a schedule's planning lease")?;
        }
        Ok(())
    }

    /// The instants of the next `peek` active schedules due after
    /// `after_ms` and at most at `until_ms`, each with how many fall on it:
    /// one read of the index `schedules_due`. The last instant is counted
    /// whole (the peek may have cut it), so a crowd at one instant is seen
    /// in full.
    pub async fn schedule_instants(
        &self,
        (after_ms, until_ms): (u64, u64),
        peek: u32,
    ) -> Result<Vec<(u64, u64)>, LedgerError> {
        const SQL: &str = "SELECT next_at_ms, COUNT(*) FROM (SELECT next_at_ms FROM schedules \
             WHERE paused = 0 AND next_at_ms IS NOT NULL AND next_at_ms > $1 \
             AND next_at_ms <= $3 \
             ORDER BY next_at_ms LIMIT $2) AS ahead GROUP BY next_at_ms ORDER BY next_at_ms";
        const AT: &str = "SELECT COUNT(*) FROM schedules \
             WHERE paused = 0 AND next_at_ms IS NOT NULL AND next_at_ms = $1";
        let rows: Vec<(i64, i64)> = on_pool!(&self.pool, p => sqlx::query_as(SQL)
            .bind(db_ms(after_ms))
            .bind(i64::from(peek))
            .bind(db_ms(until_ms))
            .fetch_all(p)
            .await)
        .context("reading the schedules' next instants")?;
        let mut instants: Vec<(u64, u64)> =
            rows.into_iter().map(|(at, n)| (ms(at), ms(n))).collect();
        let seen: u64 = instants.iter().map(|(_, n)| n).sum();
        if seen >= u64::from(peek)
            && let Some((at, n)) = instants.last_mut()
        {
            let (whole,): (i64,) = on_pool!(&self.pool, p => sqlx::query_as(AT)
                .bind(db_ms(*at))
                .fetch_one(p)
                .await)
            .context("counting the schedules at one instant")?;
            *n = ms(whole).max(*n);
        }
        Ok(instants)
    }

    /// Writes a page of planned schedules in the next group's transaction
    /// (see the module's documentation). Their tasks are admitted `pending`,
    /// leased to the caller until `lease_until_ms`: it publishes them, as
    /// the request path does a batch's.
    pub async fn plan_schedules(
        &self,
        page: Vec<PlannedSchedule<'_>>,
        lease_until_ms: u64,
        now_ms: u64,
    ) -> Result<Vec<Planned>, LedgerError> {
        let schedules = page
            .into_iter()
            .map(|planned| {
                let rows = (planned.tasks.into_iter())
                    .map(|(task, fingerprint, entry)| {
                        let lease = Lease {
                            until_ms: lease_until_ms,
                            holder: self.holder,
                        };
                        TaskRow::new(task, (None, Some(fingerprint)), lease, entry)
                    })
                    .collect();
                (planned.id.to_owned(), planned.advance, rows)
            })
            .collect();
        let judged = self.writes.plan(PlanWrite { schedules, now_ms }).await?;
        judged
            .into_iter()
            .map(|found| {
                found
                    .map(|tasks| tasks.into_iter().map(Judged::into_admission).collect())
                    .transpose()
            })
            .collect()
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
