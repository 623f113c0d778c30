//! Recurring schedules as pure logic: a schedule as a client states it,
//! validated ([`request`]); when it fires, a cron expression in a time zone
//! or a fixed interval ([`timing`]); and each occurrence as a task with an
//! id every replica computes alike, plus what the planner does when
//! occurrences were missed ([`occurrence`]); and how far ahead the planner
//! plans when many schedules share an instant ([`lead`]). No I/O; the clock is an
//! argument. The ledger stores schedules and the scheduler's planner makes
//! their occurrences tasks (`scheduler::recurring`).

mod lead;
mod occurrence;
mod request;
#[cfg(test)]
mod tests;
mod timing;

pub use lead::{PLAN_RATE_PER_S, horizon as planning_horizon};
pub use occurrence::{ScheduleContent, Step, occurrence_body, occurrence_id, step};
pub use request::{SchedulePatch, ScheduleRequest, ValidSchedule};
pub use timing::{CatchUp, Timing, TimingSpec};

use crate::task::TaskError;

/// Why a schedule was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// Its id or timing; `field` is the JSON pointer of the field at fault.
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// Its content, as a task's would be refused.
    #[error(transparent)]
    Content(TaskError),
}

impl ScheduleError {
    pub(crate) fn invalid(field: &'static str, message: String) -> Self {
        ScheduleError::Invalid { field, message }
    }
}
