//! Recurring schedules: their changes, and the planner that makes each
//! occurrence a task a lead before its time.
//!
//! Nothing about a schedule is held in memory: the ledger keeps each one's
//! next occurrence, and the planner asks it (one index probe per poll) for
//! those within the lead. An occurrence becomes a task like any other,
//! through [`Scheduler::submit`], with an id every replica computes alike
//! ([`occurrence_id`]): two replicas planning the same occurrence make one
//! task (the second is a replay), and a replica that crashed between the
//! task and recording its step makes the same task again. The step itself
//! is recorded only if the schedule is as the planner read it; a planner
//! that loses to a change (a patch, a pause, a delete) withdraws the task it
//! made, and the change withdraws the occurrences made before it.

use std::time::SystemTime;

use futures_util::StreamExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{ChangeError, Idempotency, Scheduler, SubmitError};
use crate::ledger::{Advance, LedgerError, ScheduleChange, StoredSchedule};
use crate::message::{OCCURRENCE_HEADER, SCHEDULE_HEADER};
use crate::metrics::{OutcomeLabel, StateLabel};
use crate::schedule::{
    MISSED_AFTER_MS, ScheduleError, SchedulePatch, ScheduleRequest, Step, Timing, ValidSchedule,
    occurrence_body, occurrence_id, step,
};
use crate::task::{FieldValue, Task, epoch_ms, fingerprint, format_epoch_ms};

/// Due schedules read per query.
const PLAN_BATCH: u32 = 256;
/// Schedules planned at once.
const PLAN_CONCURRENCY: usize = 16;
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

/// A schedule as an answer gives it: as stored, with its next occurrences.
#[derive(Clone, Debug)]
pub struct ScheduleState {
    pub stored: StoredSchedule,
    pub upcoming: Vec<u64>,
}

/// What a planner's attempt at an occurrence came to.
enum Made {
    Task(String),
    /// It can never be a task (its content no longer fits the chain): passed.
    Failed,
    /// Not now (the ledger is away or full): the step waits for the next poll.
    Later,
}

fn now_ms() -> u64 {
    epoch_ms(SystemTime::now())
}

impl Scheduler {
    fn timing_of(&self, schedule: &StoredSchedule) -> Result<Timing, ScheduleError> {
        Timing::compile(&schedule.spec, self.cascade().unit_ms())
    }

    /// `stored` with its next `n` occurrences (none while paused).
    pub fn schedule_state(&self, stored: StoredSchedule, n: usize) -> ScheduleState {
        let upcoming = match (&stored.next_at_ms, self.timing_of(&stored)) {
            (Some(next), Ok(timing)) if !stored.paused => {
                let mut times = vec![*next];
                times.extend(timing.upcoming(*next, n.saturating_sub(1)));
                times.truncate(n);
                times
            }
            _ => Vec::new(),
        };
        ScheduleState { stored, upcoming }
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
            if ledger.change_schedule(id, held.revision, &new, now).await? {
                self.withdraw(&held, now).await?;
                self.inner.wake_planner.notify_one();
                return self.schedule(id, owner).await;
            }
        }
        Err(RecurringError::Contended(id.to_owned()))
    }

    /// Cancels the tasks `old` made whose time is still ahead: those of its
    /// revision before its next occurrence. One already due is delivered.
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
            self.cancel(&ids, None).await?;
        }
        Ok(())
    }

    /// Starts the planner (with a ledger and the release stage); it ends
    /// with `shutdown`.
    pub fn spawn_planner(&self, shutdown: CancellationToken) -> Option<JoinHandle<()>> {
        self.changeable().ok()?;
        let planner = self.clone();
        Some(tokio::spawn(async move {
            info!(
                lead_ms = planner.lead_ms(),
                "planning recurring schedules' occurrences"
            );
            loop {
                planner.plan_due().await;
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = planner.inner.wake_planner.notified() => {}
                    () = tokio::time::sleep(planner.inner.settings.schedule_poll) => {}
                }
            }
        }))
    }

    /// The lead, within the chain's reach.
    fn lead_ms(&self) -> u64 {
        let lead = u64::try_from(self.inner.settings.schedule_lead.as_millis()).unwrap_or(u64::MAX);
        lead.min(self.cascade().max_delay_ms())
    }

    /// Makes tasks of every occurrence within the lead.
    pub async fn plan_due(&self) {
        let Ok(bookkeeper) = self.changeable() else {
            return;
        };
        let now = now_ms();
        let horizon = now.saturating_add(self.lead_ms());
        loop {
            let due = match bookkeeper.ledger().due_schedules(horizon, PLAN_BATCH).await {
                Ok(due) => due,
                Err(error) => {
                    warn!(%error, "cannot read due schedules; trying again at the next poll");
                    return;
                }
            };
            let full = due.len() == PLAN_BATCH as usize;
            let progressed = futures_util::stream::iter(due)
                .map(|schedule| self.plan_one(schedule, now, horizon))
                .buffer_unordered(PLAN_CONCURRENCY)
                .fold(false, |any, advanced| async move { any || advanced })
                .await;
            if !(full && progressed) {
                return;
            }
        }
    }

    /// Steps one schedule until its next occurrence is beyond `horizon`;
    /// whether it moved at all.
    async fn plan_one(&self, schedule: StoredSchedule, now: u64, horizon: u64) -> bool {
        let Ok(bookkeeper) = self.changeable() else {
            return false;
        };
        let timing = match self.timing_of(&schedule) {
            Ok(timing) => timing,
            Err(error) => {
                warn!(schedule = schedule.id, %error, "a stored schedule does not compile");
                return false;
            }
        };
        let mut advanced = false;
        let mut next = schedule.next_at_ms;
        while let Some(at) = next.filter(|at| *at <= horizon) {
            let step = step(&timing, at, now);
            let made_task = match step.create {
                None => None,
                Some(occurrence) => match self.make_occurrence(&schedule, occurrence).await {
                    Made::Later => return advanced,
                    Made::Task(id) => Some(id),
                    Made::Failed => None,
                },
            };
            let record = Advance {
                revision: schedule.revision,
                from_ms: at,
                to_ms: step.next_at_ms,
                made: step.create.filter(|_| made_task.is_some()),
                missed: step.missed,
            };
            match bookkeeper
                .ledger()
                .advance_schedule(&schedule.id, &record, now_ms())
                .await
            {
                Ok(true) => {
                    let caught_up = at < now.saturating_sub(MISSED_AFTER_MS);
                    self.count_step(&step, made_task.is_some(), caught_up);
                }
                Ok(false) => {
                    if let Some(id) = made_task {
                        self.after_lost_race(&schedule, id).await;
                    }
                    return advanced;
                }
                Err(error) => {
                    warn!(schedule = schedule.id, %error, "cannot record a schedule's step");
                    return advanced;
                }
            }
            advanced = true;
            next = step.next_at_ms;
        }
        advanced
    }

    fn count_step(&self, step: &Step, made: bool, caught_up: bool) {
        let count = |outcome, n| {
            self.inner
                .metrics
                .schedule_occurrences
                .get_or_create(&OutcomeLabel { outcome })
                .inc_by(n);
        };
        if step.create.is_some() {
            let outcome = match (made, caught_up) {
                (false, _) => "failed",
                (true, true) => "caught_up",
                (true, false) => "created",
            };
            count(outcome, 1);
        }
        if step.missed > 0 {
            count("missed", step.missed);
        }
    }

    /// The occurrence at `at` as a task: the schedule's content under the
    /// occurrence's id, due at `at`, with headers naming both.
    async fn make_occurrence(&self, schedule: &StoredSchedule, at: u64) -> Made {
        let id = occurrence_id(&schedule.id, schedule.revision, at);
        let body = occurrence_body(&schedule.content, &id, at);
        let parsed = Task::parse(&body, self.cascade(), SystemTime::now())
            .and_then(|task| Ok((task, fingerprint(&body)?)));
        let (mut task, fingerprint) = match parsed {
            Ok(parsed) => parsed,
            Err(error) => {
                warn!(schedule = schedule.id, occurrence = id, %error,
                      "an occurrence cannot be a task: passed over");
                return Made::Failed;
            }
        };
        task.client = schedule.client.clone();
        task.headers.extend([
            (
                SCHEDULE_HEADER.to_owned(),
                FieldValue::Str(schedule.id.clone()),
            ),
            (
                OCCURRENCE_HEADER.to_owned(),
                FieldValue::Str(format_epoch_ms(at)),
            ),
        ]);
        let idempotency = Idempotency {
            key: None,
            fingerprint: Some(fingerprint),
        };
        match self.submit(&task, idempotency).await {
            Ok(_) => Made::Task(id),
            Err(error @ (SubmitError::TooLarge(_) | SubmitError::Conflict { .. })) => {
                warn!(schedule = schedule.id, occurrence = id, %error,
                      "an occurrence cannot be a task: passed over");
                Made::Failed
            }
            Err(error) => {
                warn!(schedule = schedule.id, %error,
                      "cannot make an occurrence a task now; trying again at the next poll");
                Made::Later
            }
        }
    }

    /// Another replica or a change got to the schedule first. If it was a
    /// change (or the schedule is gone), the task just made belongs to a
    /// revision that no longer exists: withdrawn.
    async fn after_lost_race(&self, planned: &StoredSchedule, task_id: String) {
        let current = match self.changeable() {
            Ok(bookkeeper) => bookkeeper.ledger().schedule(&planned.id).await,
            Err(_) => return,
        };
        let superseded = match current {
            Ok(Some(current)) => current.revision != planned.revision || current.paused,
            Ok(None) => true,
            Err(error) => {
                warn!(schedule = planned.id, %error, "cannot read a schedule back");
                return;
            }
        };
        if superseded && let Err(error) = self.cancel(&[task_id], None).await {
            warn!(schedule = planned.id, %error, "cannot withdraw a superseded occurrence");
        }
    }

    /// Sets the schedules gauge, before a scrape.
    pub(super) async fn refresh_schedule_metrics(&self) {
        let Ok(bookkeeper) = self.changeable() else {
            return;
        };
        match bookkeeper.ledger().count_schedules().await {
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
