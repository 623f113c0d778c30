//! Changes in bulk, pure: what `POST /v1/tasks/bulk` asks (a filter over
//! tasks and an action: cancel, or move by a shift or to a time), checked;
//! which tasks the filter matches; each task's new due time; and how a
//! task the action could not change is counted.
//!
//! An operation is worked in pages of tasks in due order (see the
//! scheduler's `bulk`); its counts always add up: every task it matched is
//! `changed`, `too_late` (released or delivered before the change reached
//! it) or `unchanged` (cancelled or failed before, or no longer movable).
//! The instant is always an argument.

use serde::{Deserialize, Serialize};

use crate::auth::DestinationPattern;
use crate::clock::parse_epoch_ms;
use crate::task::TaskState;

/// Tasks read per page: one transaction of changes, then the counts.
pub const PAGE: u32 = 500;

/// `POST /v1/tasks/bulk`'s body, as received.
#[derive(Clone, Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"filter": {"destination": "billing.#", "due_before": "2026-12-01T00:00:00Z"}, "action": "cancel"}))]
pub struct BulkRequest {
    pub filter: BulkFilter,
    /// `cancel` or `move`.
    pub action: String,
    /// With `move`: how far to move each task (`10m`, `-30s`), from its
    /// own due time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shift: Option<String>,
    /// With `move`: the one due time (RFC 3339, in the future) for them all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<String>,
}

/// Which tasks: to destinations the pattern matches (`#` for all), due in
/// `[due_after, due_before)`, in `state` (any by default).
#[derive(Clone, Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkFilter {
    pub destination: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
}

/// A bulk change, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Bulk {
    pub pattern: DestinationPattern,
    pub due_after_ms: u64,
    /// Exclusive; `u64::MAX` when not given (stored as `i64::MAX`).
    pub due_before_ms: u64,
    pub state: Option<TaskState>,
    pub action: Action,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Cancel,
    /// Each task's due time plus this many milliseconds (may be negative).
    Shift(i64),
    /// Every task to this due time.
    MoveTo(u64),
}

/// A request the operation cannot run, with the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct BulkError {
    /// The JSON pointer of the field at fault, as the API's other errors say it.
    pub field: &'static str,
    pub reason: String,
}

fn refuse(field: &'static str, reason: impl Into<String>) -> BulkError {
    BulkError {
        field,
        reason: reason.into(),
    }
}

fn instant(field: &'static str, text: &str) -> Result<u64, BulkError> {
    parse_epoch_ms(text).ok_or_else(|| refuse(field, format!("{text:?} is not an RFC 3339 time")))
}

impl BulkRequest {
    pub fn validate(&self, now_ms: u64) -> Result<Bulk, BulkError> {
        let pattern = DestinationPattern::parse(&self.filter.destination)
            .map_err(|e| refuse("/filter/destination", e.to_string()))?;
        let due_after_ms = match &self.filter.due_after {
            Some(text) => instant("/filter/due_after", text)?,
            None => 0,
        };
        let due_before_ms = match &self.filter.due_before {
            Some(text) => instant("/filter/due_before", text)?,
            None => u64::MAX,
        };
        if due_before_ms <= due_after_ms {
            return Err(refuse("/filter/due_before", "must be after due_after"));
        }
        Ok(Bulk {
            pattern,
            due_after_ms,
            due_before_ms,
            state: self.filter.state,
            action: self.action(now_ms)?,
        })
    }

    fn action(&self, now_ms: u64) -> Result<Action, BulkError> {
        match (self.action.as_str(), &self.shift, &self.deliver_at) {
            ("cancel", None, None) => Ok(Action::Cancel),
            ("cancel", _, _) => Err(refuse(
                "/action",
                "cancel takes neither shift nor deliver_at",
            )),
            ("move", Some(shift), None) => Ok(Action::Shift(shift_ms(shift)?)),
            ("move", None, Some(at)) => {
                let at_ms = instant("/deliver_at", at)?;
                if at_ms <= now_ms {
                    return Err(refuse("/deliver_at", "must be in the future"));
                }
                Ok(Action::MoveTo(at_ms))
            }
            ("move", _, _) => Err(refuse(
                "/action",
                "move takes exactly one of shift and deliver_at",
            )),
            (other, _, _) => Err(refuse(
                "/action",
                format!("must be \"cancel\" or \"move\", got {other:?}"),
            )),
        }
    }
}

/// A duration as `delay` is written, with an optional leading `-`.
fn shift_ms(text: &str) -> Result<i64, BulkError> {
    let (sign, magnitude) = match text.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, text),
    };
    let duration = humantime::parse_duration(magnitude)
        .map_err(|e| refuse("/shift", format!("{text:?} is not a duration: {e}")))?;
    let ms = i64::try_from(duration.as_millis())
        .map_err(|_| refuse("/shift", format!("{text:?} is too long")))?;
    if ms == 0 {
        return Err(refuse("/shift", "must not be zero"));
    }
    Ok(sign * ms)
}

/// What became of one task the operation matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Changed,
    TooLate,
    Unchanged,
}

impl Bulk {
    /// Whether a task to `destination` in `state` is the operation's (its
    /// due time is the page's bound).
    pub fn matches(&self, destination: &str, state: TaskState) -> bool {
        self.state.is_none_or(|wanted| wanted == state) && self.pattern.matches(destination)
    }

    /// The new due time of a task due at `deliver_at_ms` (never before
    /// `now_ms`: a shift into the past makes it due now).
    pub fn new_due_ms(&self, deliver_at_ms: u64, now_ms: u64) -> u64 {
        let due = match self.action {
            Action::Cancel => deliver_at_ms,
            Action::Shift(ms) => deliver_at_ms.saturating_add_signed(ms),
            Action::MoveTo(at) => at,
        };
        due.max(now_ms)
    }
}

/// How a task the action did not change is counted, by the state it was
/// found in: released or delivered (or on its way there) is too late.
pub fn not_changed(state: TaskState) -> Outcome {
    match state {
        TaskState::Releasing | TaskState::Delivered | TaskState::Unroutable => Outcome::TooLate,
        _ => Outcome::Unchanged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const NOW: u64 = 1_800_000_000_000;

    fn request(value: serde_json::Value) -> BulkRequest {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_request_is_checked_field_by_field() {
        let ok = request(json!({"filter": {"destination": "billing.#",
            "due_after": "2027-01-15T08:00:00Z", "state": "waiting"}, "action": "move", "shift": "-10m"}))
        .validate(NOW)
        .unwrap();
        assert_eq!(ok.action, Action::Shift(-600_000));
        assert_eq!(ok.due_before_ms, u64::MAX);
        assert!(ok.matches("billing.eu", TaskState::Waiting));
        assert!(!ok.matches("billing.eu", TaskState::Scheduled));
        assert!(!ok.matches("shipping", TaskState::Waiting));
        let refused = [
            (
                json!({"filter": {"destination": "a..b"}, "action": "cancel"}),
                "/filter/destination",
            ),
            (
                json!({"filter": {"destination": "#", "due_after": "soon"}, "action": "cancel"}),
                "/filter/due_after",
            ),
            (
                json!({"filter": {"destination": "#", "due_after": "2027-01-02T00:00:00Z",
                "due_before": "2027-01-01T00:00:00Z"}, "action": "cancel"}),
                "/filter/due_before",
            ),
            (
                json!({"filter": {"destination": "#"}, "action": "delete"}),
                "/action",
            ),
            (
                json!({"filter": {"destination": "#"}, "action": "cancel", "shift": "1m"}),
                "/action",
            ),
            (
                json!({"filter": {"destination": "#"}, "action": "move"}),
                "/action",
            ),
            (
                json!({"filter": {"destination": "#"}, "action": "move", "shift": "1m",
                "deliver_at": "2099-01-01T00:00:00Z"}),
                "/action",
            ),
            (
                json!({"filter": {"destination": "#"}, "action": "move", "shift": "later"}),
                "/shift",
            ),
            (
                json!({"filter": {"destination": "#"}, "action": "move", "shift": "0s"}),
                "/shift",
            ),
            (
                json!({"filter": {"destination": "#"}, "action": "move",
                "deliver_at": "2020-01-01T00:00:00Z"}),
                "/deliver_at",
            ),
        ];
        for (body, field) in refused {
            let error = request(body.clone()).validate(NOW).unwrap_err();
            assert_eq!(error.field, field, "{body}: {error}");
        }
    }

    #[test]
    fn only_released_or_delivered_tasks_are_too_late() {
        for state in TaskState::ALL {
            let expected = match state {
                TaskState::Releasing | TaskState::Delivered | TaskState::Unroutable => {
                    Outcome::TooLate
                }
                _ => Outcome::Unchanged,
            };
            assert_eq!(not_changed(state), expected, "{state:?}");
        }
    }

    proptest! {
        /// A move never makes a task due before now, and a shift moves it
        /// by exactly the shift when that stays in the future.
        #[test]
        fn a_moved_task_is_never_due_before_now(
            due in NOW - 1_000_000..NOW + 1_000_000,
            shift in -2_000_000_i64..2_000_000,
        ) {
            let bulk = Bulk {
                pattern: DestinationPattern::parse("#").unwrap(),
                due_after_ms: 0,
                due_before_ms: u64::MAX,
                state: None,
                action: Action::Shift(shift),
            };
            let moved = bulk.new_due_ms(due, NOW);
            prop_assert!(moved >= NOW);
            let shifted = due.saturating_add_signed(shift);
            if shifted >= NOW {
                prop_assert_eq!(moved, shifted);
            }
        }
    }
}
