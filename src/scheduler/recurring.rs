//! Recurring schedules: their creation, reads and changes. The planner that
//! makes each occurrence a task a lead before its time is `planner`.
//!
//! A change is recorded only if the schedule is as the request read it (its
//! revision), and withdraws the occurrences its old revision made that are
//! not yet due; a planner that loses to a change writes nothing of that
//! schedule.

use tracing::warn;

use super::Scheduler;
use super::answers::ChangeError;
use crate::ledger::{LedgerError, ScheduleChange, StoredSchedule};
use crate::metrics::StateLabel;
use crate::recurrence::{
    ScheduleError, SchedulePatch, ScheduleRequest, Timing, ValidSchedule, occurrence_id,
};

/// Attempts at a change that lost to another change of the same schedule.
const CHANGE_ATTEMPTS: u32 = 5;
/// The most occurrences one change withdraws (its lead over its smallest
/// interval, 300 by default, is far below).
const WITHDRAW_CAP: usize = 100_000;

/// Why a schedule request failed.
#[derive(Debug, thiserror::Error)]
pub enum RecurringError {
    /// Schedules need what cancelling needs: a ledger and the release stage.
    #[error(transparent)]
    Unavailable(ChangeError),
    #[error(transparent)]
    Invalid(#[from] ScheduleError),
    #[error("schedule {0:?} not found")]
    NotFound(String),
    #[error("schedule {0:?} already exists with other content or timing")]
    Exists(String),
    #[error("schedule {0:?} kept changing under this request; retry")]
    Contended(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl From<ChangeError> for RecurringError {
    fn from(error: ChangeError) -> Self {
        match error {
            ChangeError::Ledger(error) => RecurringError::Ledger(error),
            other => RecurringError::Unavailable(other),
        }
    }
}

/// A schedule as an answer gives it at one moment: as stored, with what
/// that moment makes of it. The planner makes occurrences tasks a lead
/// ahead of their time, so what was *planned* (made, not yet due) and what
/// *fell due* are told apart here.
#[derive(Clone, Debug)]
pub struct ScheduleState {
    pub stored: StoredSchedule,
    /// The next occurrences due after the moment, planned already or not.
    pub upcoming: Vec<u64>,
    /// Occurrences made tasks and not yet due.
    pub planned: u64,
    /// Occurrences whose time has come (tasks made, due by now).
    pub fell_due: u64,
    /// The last of those.
    pub last_fell_due: Option<u64>,
}

fn now_ms() -> u64 {
    crate::clock::now_ms()
}

/// How many of `stored`'s occurrences are tasks made ahead and not yet due
/// at `now_ms`: those after it and before its next occurrence to make (the
/// planner makes them in order), or, past its end, up to the last made.
fn planned_at(stored: &StoredSchedule, timing: &Timing, now_ms: u64) -> u64 {
    if stored.paused {
        return 0;
    }
    let Some(first) = timing.next_after(now_ms) else {
        return 0;
    };
    let last_made = match stored.next_at_ms {
        Some(next) if next > first => timing.last_at_or_before(next - 1),
        Some(_) => None,
        None => stored.last_occurrence_ms,
    };
    match last_made {
        Some(last) if last >= first => timing.count_from_to(first, last),
        _ => 0,
    }
}

impl Scheduler {
    pub(super) fn timing_of(&self, schedule: &StoredSchedule) -> Result<Timing, ScheduleError> {
        Timing::compile(&schedule.spec, self.cascade().unit_ms())
    }

    /// `stored` as of `now_ms`, with its next `n` occurrences (none while
    /// paused).
    pub fn schedule_state(&self, stored: StoredSchedule, n: usize, now_ms: u64) -> ScheduleState {
        let Ok(timing) = self.timing_of(&stored) else {
            return ScheduleState {
                fell_due: stored.occurrences,
                last_fell_due: stored.last_occurrence_ms,
                stored,
                upcoming: Vec::new(),
                planned: 0,
            };
        };
        let planned = planned_at(&stored, &timing, now_ms);
        let fell_due = stored.occurrences.saturating_sub(planned);
        let last_fell_due = match stored.last_occurrence_ms {
            _ if fell_due == 0 => None,
            Some(last) if last <= now_ms => Some(last),
            _ => timing.last_at_or_before(now_ms),
        };
        let upcoming = match stored.next_at_ms {
            _ if stored.paused => Vec::new(),
            Some(_) => timing.upcoming(now_ms, n),
            // Past its end: only what was made and is still ahead.
            None => timing.upcoming(now_ms, n.min(planned as usize)),
        };
        ScheduleState {
            stored,
            upcoming,
            planned,
            fell_due,
            last_fell_due,
        }
    }

    /// Creates a schedule for `client`. The same request again (a retry
    /// after a lost answer) is answered with the schedule, `false`.
    pub async fn create_schedule(
        &self,
        request: ScheduleRequest,
        client: Option<&str>,
    ) -> Result<(StoredSchedule, bool), RecurringError> {
        let ledger = self.changeable()?.ledger();
        let now = now_ms();
        let (id, valid) = request.validate(self.cascade(), now)?;
        let id = id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let schedule = StoredSchedule {
            id: id.clone(),
            client: client.map(str::to_owned),
            revision: 1,
            next_at_ms: valid.timing.next_after(now),
            content: valid.content,
            spec: valid.spec,
            paused: false,
            last_occurrence_ms: None,
            occurrences: 0,
            missed: 0,
            created_at_ms: now,
            updated_at_ms: now,
        };
        if ledger.create_schedule(&schedule).await? {
            self.inner.wake_planner.notify_one();
            return Ok((schedule, true));
        }
        match ledger.schedule(&id).await? {
            Some(held)
                if held.client.as_deref() == client
                    && held.content.same_as(&schedule.content)
                    && held.spec.same_request_as(&schedule.spec) =>
            {
                Ok((held, false))
            }
            _ => Err(RecurringError::Exists(id)),
        }
    }

    /// One schedule; `owner`'s only, when given.
    pub async fn schedule(
        &self,
        id: &str,
        owner: Option<&str>,
    ) -> Result<StoredSchedule, RecurringError> {
        let ledger = self.changeable()?.ledger();
        match ledger.schedule(id).await? {
            Some(schedule) if schedule.within_scope(owner) => Ok(schedule),
            _ => Err(RecurringError::NotFound(id.to_owned())),
        }
    }

    /// Schedules in id order after `after`; `owner`'s only, when given.
    pub async fn schedules(
        &self,
        owner: Option<&str>,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<StoredSchedule>, RecurringError> {
        let ledger = self.changeable()?.ledger();
        Ok(ledger.schedules(owner, after, limit).await?)
    }

    /// Changes a schedule's content or timing: the occurrences already made
    /// tasks and not yet due are withdrawn, and the next one is made anew.
    pub async fn patch_schedule(
        &self,
        id: &str,
        patch: SchedulePatch,
        owner: Option<&str>,
    ) -> Result<StoredSchedule, RecurringError> {
        let cascade = self.inner.cascade.clone();
        let mut patch = Some(patch);
        self.change(id, owner, |held, now| {
            // Applied once: a lost race reads the row again and fails fast.
            let patch = patch.take().unwrap_or_default();
            let ValidSchedule {
                content,
                spec,
                timing,
            } = patch.apply(held.content.clone(), held.spec.clone(), &cascade, now)?;
            Ok(ScheduleChange {
                content,
                spec,
                paused: held.paused,
                next_at_ms: timing.next_after(now),
            })
        })
        .await
    }

    /// Pauses (`true`) or resumes a schedule. Paused, no occurrence is made
    /// (and those already made and not yet due are withdrawn); resumed, it
    /// goes on from its first occurrence after now, without catching up.
    pub async fn pause_schedule(
        &self,
        id: &str,
        paused: bool,
        owner: Option<&str>,
    ) -> Result<StoredSchedule, RecurringError> {
        let unit = self.cascade().unit_ms();
        self.change(id, owner, |held, now| {
            let timing = Timing::compile(&held.spec, unit)?;
            Ok(ScheduleChange {
                content: held.content.clone(),
                spec: held.spec.clone(),
                paused,
                next_at_ms: timing.next_after(now),
            })
        })
        .await
    }

    /// Deletes a schedule and withdraws its occurrences not yet due.
    pub async fn delete_schedule(
        &self,
        id: &str,
        owner: Option<&str>,
    ) -> Result<(), RecurringError> {
        let ledger = self.changeable()?.ledger();
        for _ in 0..CHANGE_ATTEMPTS {
            let held = self.schedule(id, owner).await?;
            if ledger.delete_schedule(id, held.revision).await? {
                self.withdraw(&held, now_ms()).await?;
                return Ok(());
            }
        }
        Err(RecurringError::Contended(id.to_owned()))
    }

    /// Reads the schedule, makes `change` of it, records it as the next
    /// revision if nothing else changed it meanwhile (else reads again), and
    /// withdraws what the old revision had made.
    async fn change(
        &self,
        id: &str,
        owner: Option<&str>,
        mut change: impl FnMut(&StoredSchedule, u64) -> Result<ScheduleChange, ScheduleError>,
    ) -> Result<StoredSchedule, RecurringError> {
        let ledger = self.changeable()?.ledger();
        for _ in 0..CHANGE_ATTEMPTS {
            let held = self.schedule(id, owner).await?;
            let now = now_ms();
            let new = change(&held, now)?;
            // What the change withdraws (`withdraw`: none once past its
            // end) no longer counts as made.
            let withdrawn = match (held.next_at_ms, self.timing_of(&held)) {
                (Some(_), Ok(timing)) => planned_at(&held, &timing, now),
                _ => 0,
            };
            if ledger
                .change_schedule(id, held.revision, &new, withdrawn, now)
                .await?
            {
                self.withdraw(&held, now).await?;
                self.inner.wake_planner.notify_one();
                return self.schedule(id, owner).await;
            }
        }
        Err(RecurringError::Contended(id.to_owned()))
    }

    /// Cancels the tasks `old` made whose time is still ahead: those of its
    /// revision before its next occurrence (as many as [`planned_at`]
    /// counts, which the change took off its count). One already due is
    /// delivered.
    async fn withdraw(&self, old: &StoredSchedule, now: u64) -> Result<(), RecurringError> {
        let (Some(next), Ok(timing)) = (old.next_at_ms, self.timing_of(old)) else {
            return Ok(());
        };
        if old.paused {
            return Ok(());
        }
        let mut ids = Vec::new();
        let mut at = now;
        while let Some(occurrence) = timing.next_after(at).filter(|t| *t < next) {
            ids.push(occurrence_id(&old.id, old.revision, occurrence));
            if ids.len() >= WITHDRAW_CAP {
                break;
            }
            at = occurrence;
        }
        if !ids.is_empty() {
            self.cancel(&ids, None, now).await?;
        }
        Ok(())
    }

    /// Sets the schedules gauge, before a scrape.
    pub(super) async fn refresh_schedule_metrics(&self) {
        let Ok(bookkeeper) = self.changeable() else {
            return;
        };
        let ledger = bookkeeper.ledger();
        match ledger
            .answered("counting schedules", ledger.count_schedules())
            .await
        {
            Ok(counts) => {
                for (state, count) in [
                    ("active", counts.active),
                    ("paused", counts.paused),
                    ("finished", counts.finished),
                ] {
                    self.inner
                        .metrics
                        .schedules
                        .get_or_create(&StateLabel { state })
                        .set(i64::try_from(count).unwrap_or(i64::MAX));
                }
            }
            Err(error) => warn!(%error, "cannot count schedules for /metrics"),
        }
    }
}
