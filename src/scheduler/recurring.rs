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

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Scheduler;
use super::answers::{ChangeError, Idempotency, SubmitError};
use crate::clock::format_epoch_ms;
use crate::ledger::{Advance, LedgerError, ScheduleChange, StoredSchedule};
use crate::message::FieldValue;
use crate::message::{OCCURRENCE_HEADER, SCHEDULE_HEADER};
use crate::metrics::{OutcomeLabel, StateLabel};
use crate::schedule::{
    ScheduleError, SchedulePatch, ScheduleRequest, Step, Timing, ValidSchedule, occurrence_body,
    occurrence_id, step,
};
use crate::stop::Named;
use crate::task::{Task, fingerprint};

/// Due schedules read per query.
const PLAN_BATCH: u32 = 256;
/// Schedules planned at once.
const PLAN_CONCURRENCY: usize = 16;
/// Occurrences of one schedule submitted at once.
const OCCURRENCES_AT_ONCE: usize = 64;
/// Steps of one schedule per poll: its lead over its smallest interval (300
/// by default) is far below.
const MAX_STEPS: usize = 10_000;
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

/// What a planner's attempt at an occurrence came to.
enum Made {
    Task(String),
    /// It can never be a task (its content no longer fits the chain): passed.
    Failed,
    /// Not now (the ledger is away or full): the step waits for the next poll.
    Later,
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
    fn timing_of(&self, schedule: &StoredSchedule) -> Result<Timing, ScheduleError> {
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

    /// Starts the planner (with a ledger and the release stage); it ends
    /// with `shutdown`.
    pub fn spawn_planner(&self, shutdown: CancellationToken) -> Option<Named> {
        self.changeable().ok()?;
        let planner = self.clone();
        Some(Named::spawn("the schedules' planner", async move {
            info!(
                lead_ms = planner.lead_ms(),
                "planning recurring schedules' occurrences"
            );
            loop {
                planner.plan_due(&shutdown).await;
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

    /// Makes tasks of every occurrence within the lead, a page of due
    /// schedules at a time; a stop is noticed between two schedules (those
    /// begun are finished: each is recorded whole, or planned again).
    pub async fn plan_due(&self, shutdown: &CancellationToken) {
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
                .take_while(|_| std::future::ready(!shutdown.is_cancelled()))
                .map(|schedule| self.plan_one(schedule, now, horizon))
                .buffer_unordered(PLAN_CONCURRENCY)
                .fold(false, |any, advanced| async move { any || advanced })
                .await;
            if !(full && progressed) || shutdown.is_cancelled() {
                return;
            }
        }
    }

    /// Steps one schedule until its next occurrence is beyond `horizon`:
    /// the occurrences' tasks made at once (the ledger commits them in
    /// groups), then one record of all the steps; whether it moved.
    async fn plan_one(&self, schedule: StoredSchedule, now: u64, horizon: u64) -> bool {
        let Ok(bookkeeper) = self.changeable() else {
            return false;
        };
        let (Some(from_ms), Ok(timing)) = (schedule.next_at_ms, self.timing_of(&schedule)) else {
            warn!(schedule = schedule.id, "a stored schedule does not compile");
            return false;
        };
        let mut steps = Vec::new();
        let mut next = Some(from_ms);
        while let Some(at) = next.filter(|at| *at <= horizon && steps.len() < MAX_STEPS) {
            let step = step(&timing, at, now, self.inner.started_ms);
            steps.push(step);
            next = step.next_at_ms;
        }
        // In order (the record stops at the first that must wait), a bounded
        // number at once.
        let creates: Vec<Option<u64>> = steps.iter().map(|step| step.create).collect();
        let made: Vec<Option<Made>> = futures_util::stream::iter(creates)
            .map(|create| self.make_if(&schedule, create))
            .buffered(OCCURRENCES_AT_ONCE)
            .collect()
            .await;
        let (record, tally, made_ids) = tally_steps(&schedule, from_ms, &steps, made);
        if record.to_ms == Some(from_ms) {
            return false;
        }
        match bookkeeper
            .ledger()
            .advance_schedule(&schedule.id, &record, now_ms())
            .await
        {
            Ok(true) => {
                self.count_occurrences(&tally);
                true
            }
            Ok(false) => {
                self.after_lost_race(&schedule, made_ids).await;
                false
            }
            Err(error) => {
                warn!(schedule = schedule.id, %error, "cannot record a schedule's steps");
                false
            }
        }
    }

    fn count_occurrences(&self, tally: &[(&'static str, u64)]) {
        for (outcome, n) in tally.iter().filter(|(_, n)| *n > 0) {
            self.inner
                .metrics
                .schedule_occurrences
                .get_or_create(&OutcomeLabel { outcome })
                .inc_by(*n);
        }
    }

    /// The occurrence a step creates, if it creates one.
    async fn make_if(&self, schedule: &StoredSchedule, create: Option<u64>) -> Option<Made> {
        Some(self.make_occurrence(schedule, create?).await)
    }

    /// The occurrence at `at` as a task: the schedule's content under the
    /// occurrence's id, due at `at`, with headers naming both.
    async fn make_occurrence(&self, schedule: &StoredSchedule, at: u64) -> Made {
        let id = occurrence_id(&schedule.id, schedule.revision, at);
        let body = occurrence_body(&schedule.content, &id, at);
        let now = crate::clock::read();
        let parsed = Task::parse(&body, self.cascade(), now.wall)
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
        match self.submit(&task, idempotency, &now).await {
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
    /// change (or the schedule is gone), the tasks just made belong to a
    /// revision that no longer exists: withdrawn.
    async fn after_lost_race(&self, planned: &StoredSchedule, task_ids: Vec<String>) {
        if task_ids.is_empty() {
            return;
        }
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
        if superseded && let Err(error) = self.cancel(&task_ids, None, now_ms()).await {
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

/// The record of `steps` up to the first whose task must wait (the rest are
/// made again, as replays, at the next poll), the occurrences by outcome,
/// and the ids of the tasks made.
fn tally_steps(
    schedule: &StoredSchedule,
    from_ms: u64,
    steps: &[Step],
    made: Vec<Option<Made>>,
) -> (Advance, [(&'static str, u64); 4], Vec<String>) {
    let mut record = Advance {
        revision: schedule.revision,
        from_ms,
        to_ms: Some(from_ms),
        made: 0,
        last_made_ms: None,
        missed: 0,
    };
    let (mut created, mut caught_up, mut failed) = (0, 0, 0);
    let mut ids = Vec::new();
    for (step, made) in steps.iter().zip(made) {
        match made {
            Some(Made::Later) => break,
            Some(Made::Task(id)) => {
                record.made += 1;
                record.last_made_ms = step.create;
                if step.caught_up {
                    caught_up += 1;
                } else {
                    created += 1;
                }
                ids.push(id);
            }
            Some(Made::Failed) => failed += 1,
            None => {}
        }
        record.missed += step.missed;
        record.to_ms = step.next_at_ms;
    }
    let tally = [
        ("created", created),
        ("caught_up", caught_up),
        ("failed", failed),
        ("missed", record.missed),
    ];
    (record, tally, ids)
}
