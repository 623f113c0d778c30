//! What SQLite's group-commit writer changes in the forecast's counts
//! (`due_counts`, [`super::forecast`]), summed per minute and destination
//! and written once a group.
//!
//! The writer's connection runs without migration 0013's triggers
//! ([`super::pool::open_sqlite_writer`]). The triggers cost every task's
//! insert and every update of its state a trigger program of their own, even
//! where they change nothing: a third of the ledger's CPU over a task's life
//! (BENCHMARKS' record 35). Every other connection keeps them. The writer's
//! statements never move a task to another minute or destination, nor
//! delete one: a task entering the count (admitted, or claimed after a
//! quarantine) or leaving it (delivered, quarantined) is all they change in
//! it.

use std::collections::BTreeMap;

use crate::forecast::MINUTE_MS;

/// The states in which a task counts: on its way. The same as the
/// triggers' lists (migration 0018).
const COUNTED: [&str; 5] = ["pending", "scheduled", "releasing", "waiting", "staged"];

/// Whether a task in `state` counts in `due_counts`.
pub(super) fn is_counted(state: &str) -> bool {
    COUNTED.contains(&state)
}

/// Adds `$3` tasks to minute `$1` of destination `$2` (fewer when negative).
pub(super) const COUNT_DUE: &str = "INSERT INTO due_counts (minute_ms, destination, tasks) \
     VALUES ($1, $2, $3) ON CONFLICT (minute_ms, destination) \
     DO UPDATE SET tasks = tasks + excluded.tasks";

/// Removes minute `$1` of destination `$2` once it counts nothing, as the
/// triggers do.
pub(super) const FORGET_UNCOUNTED: &str =
    "DELETE FROM due_counts WHERE minute_ms = $1 AND destination = $2 AND tasks <= 0";

/// What one transaction changed in the counts, summed per minute and
/// destination: a task entering the count adds one in its minute, one
/// leaving it takes one away.
#[derive(Debug, Default)]
pub(super) struct DueChanges(BTreeMap<(i64, String), i64>);

impl DueChanges {
    /// A task due at `deliver_at_ms` for `destination` enters (`+1`) or
    /// leaves (`-1`) the count. The minute is the triggers'
    /// `deliver_at_ms / 60000 * 60000`.
    pub(super) fn add(&mut self, deliver_at_ms: i64, destination: &str, tasks: i64) {
        let minute = i64::try_from(MINUTE_MS).unwrap_or(i64::MAX);
        let key = (deliver_at_ms / minute * minute, destination.to_owned());
        *self.0.entry(key).or_default() += tasks;
    }

    /// Each minute and destination whose count changed, and by how much.
    pub(super) fn changed(&self) -> impl Iterator<Item = (i64, &str, i64)> {
        self.0
            .iter()
            .filter(|(_, tasks)| **tasks != 0)
            .map(|((minute_ms, destination), tasks)| (*minute_ms, destination.as_str(), *tasks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The sums are per minute (as the triggers' `/ 60000 * 60000`) and
        /// destination, and a minute whose changes cancel out is not written.
        #[test]
        fn changes_sum_per_minute_and_destination(
            changes in proptest::collection::vec(
                (0_i64..10_000_000_000_000, proptest::bool::ANY, -1_i64..=1),
                0..64,
            )
        ) {
            let mut due = DueChanges::default();
            let mut expected: BTreeMap<(i64, String), i64> = BTreeMap::new();
            for &(at, second, tasks) in &changes {
                let destination = if second { "e" } else { "d" };
                due.add(at, destination, tasks);
                *expected.entry((at - at % 60_000, destination.to_owned())).or_default() += tasks;
            }
            let changed: Vec<(i64, String, i64)> = due
                .changed()
                .map(|(minute, destination, tasks)| (minute, destination.to_owned(), tasks))
                .collect();
            let wanted: Vec<(i64, String, i64)> = expected
                .into_iter()
                .filter(|(_, tasks)| *tasks != 0)
                .map(|((minute, destination), tasks)| (minute, destination, tasks))
                .collect();
            proptest::prop_assert_eq!(changed, wanted);
        }
    }
}
