//! A page of the schedules' planner, written in one group's transaction
//! (issue 71): each schedule's steps are recorded if it is still as the
//! planner read it (same revision, same next occurrence, not paused), and
//! only then are its occurrences' tasks admitted.
//!
//! Why together: one statement and one commit per schedule (its step
//! recorded apart from its tasks) had the planner fall 50 s behind 50,000
//! schedules firing at one instant, on statements waiting for SQLite's
//! write lock. In the writer's group a page of a thousand costs one commit,
//! shared with the request path's. And why guarded in the same
//! transaction: a planner that loses a schedule to a change, or to another
//! replica, writes nothing of it (no task to withdraw afterwards), and one
//! killed before the commit wrote nothing at all.

use super::admit::{Judged, admit};
use super::error::LedgerError;
use super::record::{Row, db_ms};
use super::transaction::Tx;

/// What a planner records after its steps of a schedule.
#[derive(Clone, Copy, Debug)]
pub struct Advance {
    pub revision: u64,
    /// The next occurrence the planner read (the guard).
    pub from_ms: u64,
    pub to_ms: Option<u64>,
    /// Occurrences it made tasks, and the last of them.
    pub made: u64,
    pub last_made_ms: Option<u64>,
    pub missed: u64,
}

/// What a page's write found, per schedule (see [`Planned`]), before the
/// rows it met are decoded.
pub(super) type PageFound = Vec<Option<Vec<Judged>>>;

/// A page as the writer holds it: each schedule with its tasks' rows.
pub(super) struct PlanWrite {
    pub schedules: Vec<(String, Advance, Vec<Row>)>,
    pub now_ms: u64,
}

/// The page, in the group's transaction `tx`: the steps of each schedule
/// still as read, then the tasks of those, admitted together.
pub(super) async fn plan_in(tx: &mut Tx<'_>, write: &PlanWrite) -> Result<PageFound, LedgerError> {
    let mut advanced = Vec::with_capacity(write.schedules.len());
    for (id, advance, _) in &write.schedules {
        let values = [
            Some(db_ms(advance.revision)),
            Some(db_ms(advance.from_ms)),
            advance.to_ms.map(db_ms),
            advance.last_made_ms.map(db_ms),
            Some(db_ms(advance.made)),
            Some(db_ms(advance.missed)),
            Some(db_ms(write.now_ms)),
        ];
        advanced.push(tx.advance_schedule(id, values).await?);
    }
    let rows: Vec<&Row> = (write.schedules.iter().zip(&advanced))
        .filter(|(_, advanced)| **advanced)
        .flat_map(|((.., rows), _)| rows)
        .collect();
    let mut judged = admit(tx, &rows).await?.into_iter();
    Ok((write.schedules.iter().zip(advanced))
        .map(|((.., rows), advanced)| advanced.then(|| judged.by_ref().take(rows.len()).collect()))
        .collect())
}

impl PlanWrite {
    /// Tasks the page admitted as new and pending (not staged), for the
    /// pending count.
    pub(super) fn admitted_pending(&self, found: &PageFound) -> usize {
        (self.schedules.iter().zip(found))
            .filter_map(|((.., rows), judged)| Some(rows.iter().zip(judged.as_ref()?)))
            .flatten()
            .filter(|(row, judged)| **judged == Judged::New && row.is_pending())
            .count()
    }
}
