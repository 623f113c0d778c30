//! One occurrence of a schedule: its task's id and body, and what the
//! planner does when a schedule's next occurrence is near (or long past).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use super::timing::{CatchUp, Timing};
use crate::clock::format_epoch_ms;

/// An occurrence that fell due while no planner ran, and that the planner
/// reaches more than this after its time, was missed: the schedule's
/// `catch_up` decides whether it is delivered. One reached sooner is
/// delivered, late.
pub const MISSED_AFTER_MS: u64 = 2_000;

/// What each occurrence delivers: a task body without id or time.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScheduleContent {
    pub destination: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchange: Option<String>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub payload: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, Box<RawValue>>>,
    /// Each occurrence's leeway (see the task's `leeway_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leeway_ms: Option<u64>,
    /// Each occurrence's deadline, as how late after its moment it may
    /// still be delivered (see the task's `max_lateness_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lateness_ms: Option<u64>,
}

impl ScheduleContent {
    /// The same content byte for byte (raw JSON compared as written).
    pub fn same_as(&self, other: &ScheduleContent) -> bool {
        serde_json::to_string(self).ok() == serde_json::to_string(other).ok()
    }
}

/// A JSON value that is present, `null` included (a plain `Option` would
/// read `null` as absent).
pub(super) fn present<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(deserializer).map(Some)
}

/// The id of the task of the occurrence at `at_ms` of revision `revision`
/// of schedule `schedule_id`: the same on every replica, so that the
/// ledger's primary key makes one occurrence one task. The revision changes
/// with every change to the schedule, so that an occurrence made again
/// after a change is a new task, never a conflict with the one withdrawn.
pub fn occurrence_id(schedule_id: &str, revision: u64, at_ms: u64) -> String {
    format!("{schedule_id}~{revision}@{}", format_epoch_ms(at_ms))
}

/// The body of an occurrence's task, as `POST /v1/tasks` takes it: the
/// schedule's content, the occurrence's id, and its time as `deliver_at`
/// (one in the past is due now). The same bytes on every replica.
pub fn occurrence_body(content: &ScheduleContent, id: &str, at_ms: u64) -> Vec<u8> {
    #[derive(Serialize)]
    struct Body<'a> {
        destination: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        exchange: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        payload: Option<&'a RawValue>,
        #[serde(skip_serializing_if = "Option::is_none")]
        payload_base64: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        content_type: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        headers: Option<&'a BTreeMap<String, Box<RawValue>>>,
        id: &'a str,
        deliver_at: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        leeway_ms: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        max_lateness_ms: Option<u64>,
    }
    let body = Body {
        destination: &content.destination,
        exchange: content.exchange.as_deref(),
        payload: content.payload.as_deref(),
        payload_base64: content.payload_base64.as_deref(),
        content_type: content.content_type.as_deref(),
        headers: content.headers.as_ref(),
        id,
        deliver_at: format_epoch_ms(at_ms),
        leeway_ms: content.leeway_ms,
        max_lateness_ms: content.max_lateness_ms,
    };
    // A struct of strings and raw JSON always serialises.
    serde_json::to_vec(&body).unwrap_or_default()
}

/// What the planner does with a schedule whose next occurrence is
/// `next_at_ms`, at `now_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The occurrence to make a task of, if any.
    pub create: Option<u64>,
    /// Occurrences passed over (missed and not delivered).
    pub missed: u64,
    /// The schedule's next occurrence after this step; `None`: finished.
    pub next_at_ms: Option<u64>,
    /// The step applied the catch-up rule (its occurrences were missed).
    pub caught_up: bool,
}

/// The next step of a schedule: its next occurrence made a task, or, when
/// occurrences were missed, the catch-up rule applied to all of them at once
/// (however long delayline was away, one step).
///
/// Missed means due while no planner ran: before `running_since_ms` (when
/// this planner started), and more than [`MISSED_AFTER_MS`] before `now_ms`.
/// An occurrence a running planner reaches late (an overloaded or
/// unreachable ledger) is made late, never skipped.
pub fn step(timing: &Timing, next_at_ms: u64, now_ms: u64, running_since_ms: u64) -> Step {
    let missed_before = now_ms.saturating_sub(MISSED_AFTER_MS).min(running_since_ms);
    if next_at_ms >= missed_before {
        return Step {
            create: Some(next_at_ms),
            missed: 0,
            next_at_ms: timing.next_after(next_at_ms),
            caught_up: false,
        };
    }
    let latest = timing
        .last_at_or_before(missed_before - 1)
        .filter(|latest| *latest >= next_at_ms)
        .unwrap_or(next_at_ms);
    let missed = timing.count_from_to(next_at_ms, latest);
    let next_at_ms = timing.next_after(latest);
    match timing.catch_up {
        CatchUp::Skip => Step {
            create: None,
            missed,
            next_at_ms,
            caught_up: true,
        },
        CatchUp::Latest => Step {
            create: Some(latest),
            missed: missed - 1,
            next_at_ms,
            caught_up: true,
        },
    }
}
