//! What `GET /v1/tasks` asks the ledger for, and what its state implies.

use super::cursor::Cursor;
use crate::task::TaskState;

/// What `GET /v1/tasks` filters on.
#[derive(Clone, Debug, Default)]
pub struct TaskFilter {
    /// Only this client's tasks (a caller without `admin`).
    pub client: Option<String>,
    pub destination: Option<String>,
    pub state: Option<TaskState>,
    pub due_before_ms: Option<u64>,
    pub after: Option<Cursor>,
    pub limit: u32,
}

impl TaskFilter {
    /// The same tasks, with what the state implies made explicit so that
    /// the ledger need not read past them: a delivered task fell due before
    /// now (a minute's margin for another replica's clock).
    pub fn bounded(&self, now_ms: u64) -> TaskFilter {
        let mut filter = self.clone();
        if filter.state == Some(TaskState::Delivered) {
            let bound = now_ms.saturating_add(60_000);
            filter.due_before_ms = Some(filter.due_before_ms.map_or(bound, |d| d.min(bound)));
        }
        filter
    }
}

/// States few tasks are in, each with an index of its own (`tasks_pending`,
/// `tasks_failed`, `tasks_unroutable`, `tasks_cancelled`, `tasks_expired`,
/// `tasks_waiting_in_due_order`, `tasks_staged_in_due_order`): listing them goes
/// through that index, not through every task in due order.
pub(super) fn is_rare(state: TaskState) -> bool {
    matches!(
        state,
        TaskState::Pending
            | TaskState::Failed
            | TaskState::Unroutable
            | TaskState::Cancelled
            | TaskState::Expired
            | TaskState::Waiting
            | TaskState::Staged
    )
}
