//! The schedules' planner: makes each occurrence a task a lead before its
//! time, a page of due schedules at a time (issue 71).
//!
//! Nothing about a schedule is held in memory: the ledger keeps each one's
//! next occurrence, and the planner takes those within its horizon, a page
//! under a lease (so that replicas sharing a PostgreSQL ledger take
//! different pages of a large instant). For each schedule of the page it
//! works out the steps and the occurrences' tasks (ids every replica
//! computes alike, [`occurrence_id`]); the ledger writes the whole page in
//! one group's transaction, each schedule's steps only if it is still as
//! read and its tasks only with them (`ledger::plan`); then the new tasks
//! are published as a batch's are. A planner that lost a schedule to a
//! change or to another replica wrote nothing of it; one killed before the
//! commit wrote nothing at all, and its lease runs out.
//!
//! The horizon follows the load ([`crate::recurrence::planning_horizon`]):
//! an instant many schedules share is planned early enough for all of its
//! occurrences to be tasks before it.

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Scheduler;
use super::bookkeeper::Bookkeeper;
use crate::clock::{Reading, format_epoch_ms};
use crate::ledger::{Admission, Advance, Entry, Planned, PlannedSchedule, StoredSchedule};
use crate::message::{FieldValue, Message, OCCURRENCE_HEADER, SCHEDULE_HEADER};
use crate::recurrence::{Step, Timing, occurrence_body, occurrence_id, planning_horizon, step};
use crate::stop::Named;
use crate::task::{Task, TaskState, fingerprint};

/// Due schedules taken per page: one group's transaction each.
const PLAN_PAGE: u32 = 1_000;
/// How long a page's schedules are the taker's: far longer than a page's
/// write takes; a replica killed meanwhile holds them this long at most.
const PLAN_LEASE_MS: u64 = 10_000;
/// Schedules ahead of the horizon whose instants are read to see a crowd.
const PEEK: u32 = 4_096;
/// How much earlier than the lead a crowded instant may be planned: one
/// further ahead would need more than 10 minutes of the planner's rate
/// (1.5 million occurrences at 2,500 a second), and schedules held for
/// later (the yearly ones) are not read every poll.
const EARLIER_AT_MOST_MS: u64 = 600_000;
/// Steps of one schedule per poll: its lead over its smallest interval (300
/// by default) is far below.
const MAX_STEPS: usize = 10_000;
/// New tasks of a page published at once.
const PUBLISHING: usize = 256;

/// One occurrence made a task, before the ledger has it.
struct Occurrence {
    task: Task,
    message: Message,
    fingerprint: String,
    /// Staged in the ledger as it is written, not published (a burst's
    /// task the levels have no room for).
    staged: bool,
}

/// One schedule of a page as planned: its steps' record, its occurrences'
/// tasks, and the occurrences that can never be tasks (passed over).
struct Draft {
    id: String,
    advance: Advance,
    tasks: Vec<Occurrence>,
    caught_up: Vec<bool>,
    failed: u64,
}

impl Scheduler {
    /// Starts the planner (with a ledger and the release stage); it ends
    /// with `shutdown`.
    pub(super) fn spawn_planner(&self, shutdown: CancellationToken) -> Option<Named> {
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

    /// How far ahead to plan at `now`: the lead, or further for a crowded
    /// instant beyond it (the lead alone if the ledger cannot say).
    async fn horizon(&self, bookkeeper: &Bookkeeper, now: u64) -> u64 {
        let lead = self.lead_ms();
        let max = (self.cascade().max_delay_ms()).min(lead.saturating_add(EARLIER_AT_MOST_MS));
        let window = (now.saturating_add(lead), now.saturating_add(max));
        let instants = match bookkeeper.ledger().schedule_instants(window, PEEK).await {
            Ok(instants) => instants,
            Err(error) => {
                warn!(%error, "cannot read the schedules' next instants; planning the lead only");
                Vec::new()
            }
        };
        let rate = self.inner.settings.schedule_plan_rate;
        planning_horizon(now, lead, max, &instants, rate)
    }

    /// Makes tasks of every occurrence within the horizon, a page of due
    /// schedules at a time; a stop is noticed between two pages (a page
    /// begun is written whole, or not at all).
    pub async fn plan_due(&self, shutdown: &CancellationToken) {
        let Ok(bookkeeper) = self.changeable() else {
            return;
        };
        let now = now_ms();
        let horizon = self.horizon(bookkeeper, now).await;
        loop {
            let taken = bookkeeper
                .ledger()
                .take_due_schedules(horizon, PLAN_PAGE, now_ms(), PLAN_LEASE_MS)
                .await;
            let due = match taken {
                Ok(due) => due,
                Err(error) => {
                    warn!(%error, "cannot read due schedules; trying again at the next poll");
                    return;
                }
            };
            let full = due.len() == PLAN_PAGE as usize;
            let progressed = self.plan_page(bookkeeper, due, now, horizon).await;
            if !(full && progressed) || shutdown.is_cancelled() {
                return;
            }
        }
    }

    /// One page: drafted, written, its new tasks published; whether any
    /// schedule moved.
    async fn plan_page(
        &self,
        bookkeeper: &Bookkeeper,
        due: Vec<StoredSchedule>,
        now: u64,
        horizon: u64,
    ) -> bool {
        let reading = crate::clock::read();
        let own = crate::clock::source();
        let drafts: Vec<Draft> = (due.iter())
            .filter_map(|schedule| self.draft(schedule, now, horizon, &reading))
            .collect();
        let ledger = bookkeeper.ledger();
        let written = if ledger.is_full() {
            Err("the ledger is full".to_owned())
        } else {
            let page = drafts.iter().map(|draft| draft.planned(own)).collect();
            let lease_until = bookkeeper.lease_until(reading.wall_ms);
            (ledger.plan_schedules(page, lease_until, now_ms()).await).map_err(|e| e.to_string())
        };
        let found = match written {
            Ok(found) => found,
            Err(error) => {
                warn!(%error, "cannot make due schedules' occurrences tasks now; trying again at the next poll");
                let ids: Vec<&str> = due.iter().map(|s| s.id.as_str()).collect();
                if let Err(error) = ledger.release_schedules(&ids).await {
                    warn!(%error, "cannot hand back the schedules' planning leases");
                }
                return false;
            }
        };
        let mut new = Vec::new();
        let mut advanced = false;
        for (draft, found) in drafts.into_iter().zip(found) {
            advanced |= found.is_some();
            new.extend(self.settle_draft(draft, found));
        }
        let (staged, new): (Vec<Occurrence>, Vec<Occurrence>) =
            new.into_iter().partition(|occurrence| occurrence.staged);
        if !staged.is_empty() {
            bookkeeper.staged_at_admission(staged.len() as u64);
            for _ in &staged {
                self.inner
                    .metrics
                    .accepted(TaskState::Staged.as_str(), false);
            }
        }
        self.publish_planned(bookkeeper, new, reading.wall_ms).await;
        advanced
    }

    /// Steps `schedule` until its next occurrence is beyond `horizon`, and
    /// makes each occurrence a step creates a task; `None` if it cannot be
    /// planned (it no longer compiles) or nothing moves.
    fn draft(
        &self,
        schedule: &StoredSchedule,
        now: u64,
        horizon: u64,
        reading: &Reading,
    ) -> Option<Draft> {
        let (Some(from_ms), Ok(timing)) = (schedule.next_at_ms, self.timing_of(schedule)) else {
            warn!(schedule = schedule.id, "a stored schedule does not compile");
            return None;
        };
        let steps = steps_within(&timing, from_ms, horizon, now, self.inner.started_ms);
        let mut draft = Draft {
            id: schedule.id.clone(),
            advance: Advance {
                revision: schedule.revision,
                from_ms,
                to_ms: Some(from_ms),
                made: 0,
                last_made_ms: None,
                missed: 0,
            },
            tasks: Vec::new(),
            caught_up: Vec::new(),
            failed: 0,
        };
        for step in &steps {
            if let Some(at) = step.create {
                match self.occurrence(schedule, at, reading) {
                    Some(occurrence) => {
                        draft.advance.made += 1;
                        draft.advance.last_made_ms = Some(at);
                        draft.tasks.push(occurrence);
                        draft.caught_up.push(step.caught_up);
                    }
                    None => draft.failed += 1,
                }
            }
            draft.advance.missed += step.missed;
            draft.advance.to_ms = step.next_at_ms;
        }
        (draft.advance.to_ms != Some(from_ms)).then_some(draft)
    }

    /// The occurrence at `at` as a task: the schedule's content under the
    /// occurrence's id, due at `at`, with headers naming both; `None` if it
    /// can never be one (its content no longer fits the chain).
    fn occurrence(&self, schedule: &StoredSchedule, at: u64, now: &Reading) -> Option<Occurrence> {
        let id = occurrence_id(&schedule.id, schedule.revision, at);
        let body = occurrence_body(&schedule.content, &id, at);
        let made = Task::parse(&body, self.cascade(), now.wall)
            .and_then(|task| Ok((task, fingerprint(&body)?)))
            .map_err(|error| error.to_string())
            .and_then(|(mut task, fingerprint)| {
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
                let prepared = self.prepare(&task, now).map_err(|e| e.to_string())?;
                Ok(Occurrence {
                    task: prepared.task.into_owned(),
                    message: prepared.message,
                    fingerprint,
                    staged: prepared.staged,
                })
            });
        match made {
            Ok(occurrence) => Some(occurrence),
            Err(error) => {
                warn!(schedule = schedule.id, occurrence = id, %error,
                      "an occurrence cannot be a task: passed over");
                None
            }
        }
    }

    /// Counts what the page's write found for `draft`; its tasks the
    /// ledger took as new, to publish.
    fn settle_draft(&self, draft: Draft, found: Planned) -> Vec<Occurrence> {
        // Lost to a change or to another replica: nothing of it written.
        let Some(admissions) = found else {
            return Vec::new();
        };
        let (mut created, mut caught_up, mut failed) = (0, 0, draft.failed);
        let mut new = Vec::new();
        let outcomes = draft.tasks.into_iter().zip(draft.caught_up).zip(admissions);
        for ((occurrence, was_caught_up), admission) in outcomes {
            match admission {
                Admission::Conflict(_) => {
                    warn!(
                        schedule = draft.id,
                        occurrence = occurrence.task.id,
                        "an occurrence's id holds another task: passed over"
                    );
                    failed += 1;
                    continue;
                }
                Admission::New => new.push(occurrence),
                Admission::Replay(_) => {}
            }
            if was_caught_up {
                caught_up += 1;
            } else {
                created += 1;
            }
        }
        self.count_occurrences(&[
            ("created", created),
            ("caught_up", caught_up),
            ("failed", failed),
            ("missed", draft.advance.missed),
        ]);
        new
    }

    /// Publishes a page's new tasks, as the request path does a batch's:
    /// scheduled once confirmed, otherwise pending for the forwarder.
    async fn publish_planned(&self, bookkeeper: &Bookkeeper, new: Vec<Occurrence>, now_ms: u64) {
        let states: Vec<TaskState> = futures_util::stream::iter(new)
            .map(|occurrence| async move {
                let Occurrence { task, message, .. } = occurrence;
                bookkeeper.publish_recorded(&task, message, now_ms).await
            })
            .buffer_unordered(PUBLISHING)
            .collect()
            .await;
        for state in states {
            self.inner.metrics.accepted(state.as_str(), false);
        }
    }

    fn count_occurrences(&self, tally: &[(&'static str, u64)]) {
        for (outcome, n) in tally.iter().filter(|(_, n)| *n > 0) {
            self.inner
                .metrics
                .schedule_occurrences
                .get_or_create(&crate::metrics::OutcomeLabel { outcome })
                .inc_by(*n);
        }
    }
}

impl Draft {
    /// The draft as the ledger writes it; a staged occurrence is staged by
    /// the process `own`.
    fn planned<'a>(&'a self, own: &'a str) -> PlannedSchedule<'a> {
        let entry = |o: &Occurrence| match o.staged {
            true => Entry::Staged { by: own },
            false => Entry::Publish,
        };
        PlannedSchedule {
            id: &self.id,
            advance: self.advance,
            tasks: (self.tasks.iter())
                .map(|o| (&o.task, o.fingerprint.clone(), entry(o)))
                .collect(),
        }
    }
}

/// The steps from `from_ms` until the next occurrence is beyond `horizon`
/// (at most [`MAX_STEPS`]).
fn steps_within(
    timing: &Timing,
    from_ms: u64,
    horizon: u64,
    now: u64,
    started_ms: u64,
) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut next = Some(from_ms);
    while let Some(at) = next.filter(|at| *at <= horizon && steps.len() < MAX_STEPS) {
        let step = step(timing, at, now, started_ms);
        steps.push(step);
        next = step.next_at_ms;
    }
    steps
}

fn now_ms() -> u64 {
    crate::clock::now_ms()
}
