//! `[schedules]`, the one section the scheduler reads alone, and the
//! scheduler's timings: `config::Settings::scheduler` derives them from the
//! sections they come from (`[amqp]`, `[store]`, `[schedules]`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Recurring schedules (`/v1/schedules`): how far ahead each occurrence
/// becomes a task, and how often the planner looks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleSettings {
    /// An occurrence becomes a task in the cascade this long before its time
    /// (at most the chain's longest delay), so that a planner that is late,
    /// or a replica that restarts, does not make it late.
    pub lead_ms: u64,
    /// How often the planner looks for schedules whose next occurrence is
    /// within the lead: one index probe, whatever the number of schedules.
    pub poll_ms: u64,
    /// Occurrences a second the planner is counted on to make: an instant
    /// that many schedules share is planned that much earlier than the lead
    /// (its count over this rate), so that all are tasks before it.
    pub plan_rate: u64,
}

impl Default for ScheduleSettings {
    fn default() -> Self {
        Self {
            lead_ms: 30_000,
            poll_ms: 1_000,
            plan_rate: crate::recurrence::PLAN_RATE_PER_S,
        }
    }
}

impl ScheduleSettings {
    pub fn validate(&self) -> Result<(), String> {
        if self.poll_ms == 0 || self.lead_ms < self.poll_ms {
            return Err(
                "schedules.poll_ms must be at least 1 and schedules.lead_ms at least \
                        poll_ms: an occurrence must become a task before its time"
                    .into(),
            );
        }
        if self.plan_rate == 0 {
            return Err("schedules.plan_rate must be at least 1 (occurrences a second)".into());
        }
        Ok(())
    }
}

/// The scheduler's timings, from the configuration.
#[derive(Clone, Debug)]
pub struct SchedulerSettings {
    /// How long a publish may wait for its confirm (`amqp.confirm_timeout_ms`).
    pub confirm_timeout: Duration,
    /// How long RabbitMQ may refuse delayline before it is not ready.
    pub misconfiguration_grace: Duration,
    /// How long a published task's row is kept once due.
    pub retention: Duration,
    pub prune_every: Duration,
    /// When a task still `scheduled` past its due time is published again
    /// (`store.resend_after_ms`); zero never.
    pub resend_after: Duration,
    /// How long before its time an occurrence of a schedule becomes a task.
    pub schedule_lead: Duration,
    /// How often the planner looks for due schedules.
    pub schedule_poll: Duration,
    /// Occurrences a second the planner is counted on to make.
    pub schedule_plan_rate: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_each_bad_value_names_its_setting() {
        assert_eq!(ScheduleSettings::default().validate(), Ok(()));
        let no_rate = ScheduleSettings {
            plan_rate: 0,
            ..ScheduleSettings::default()
        };
        assert!(
            no_rate
                .validate()
                .unwrap_err()
                .contains("schedules.plan_rate")
        );
        let lead_below_poll = ScheduleSettings {
            lead_ms: 500,
            ..ScheduleSettings::default()
        };
        assert!(
            lead_below_poll
                .validate()
                .unwrap_err()
                .contains("schedules.lead_ms")
        );
    }
}
