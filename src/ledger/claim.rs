//! The release stage's claim, a step of a group's transaction: a due task
//! in the revision its message carries becomes `releasing`, conditioned on
//! the state it comes from (neither `cancelled` nor `delivered`), so that a
//! cancel committed first wins. What it finds is a [`Finding`] per message.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::error::LedgerError;
use super::record::db_ms;
use super::sql::statement_sized_chunks;
use super::transaction::Tx;
use crate::task::TaskState;

/// What the ledger says of a message that reached the release stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finding {
    /// The task was due in this revision and is now `releasing`: deliver it.
    Claimed,
    /// The ledger does not know the task (pruned, or another ledger's).
    Absent,
    /// The task is known, but in this state and revision: not claimed.
    Found { state: TaskState, revision: u64 },
}

/// Takes each `(id, revision)` due at the release stage: a task that is
/// neither cancelled nor delivered, in the message's revision, becomes
/// `releasing` (from `pending` first, to count those). The findings follow
/// the order of `due`; also returns how many were pending.
pub(super) async fn claim(
    tx: &mut Tx<'_>,
    due: &[(String, u64)],
) -> Result<(Vec<Finding>, u64), LedgerError> {
    let pairs: Vec<(&str, i64)> = due
        .iter()
        .map(|(id, revision)| (id.as_str(), db_ms(*revision)))
        .collect();
    // By id and revision: a window may hold a late copy of a task's old
    // revision beside its new one, and only the new one is claimed.
    let mut claimed: HashSet<(String, i64)> = HashSet::with_capacity(pairs.len());
    let is_claimed = |claimed: &HashSet<(String, i64)>, (id, revision): (&str, i64)| {
        claimed.contains(&(id.to_owned(), revision))
    };
    let mut were_pending = 0u64;
    for (from, pending) in [
        ("state = 'pending'", true),
        ("state IN ('scheduled', 'releasing', 'failed')", false),
    ] {
        let open: Vec<(&str, i64)> = pairs
            .iter()
            .copied()
            .filter(|pair| !is_claimed(&claimed, *pair))
            .collect();
        for chunk in statement_sized_chunks(&open) {
            let taken = tx.claim(from, chunk).await?;
            if pending {
                were_pending += taken.len() as u64;
            }
            claimed.extend(taken);
        }
    }
    let rest: Vec<&str> = pairs
        .iter()
        .filter(|pair| !is_claimed(&claimed, **pair))
        .map(|(id, _)| *id)
        .collect();
    let mut found: HashMap<String, (TaskState, u64)> = HashMap::new();
    for chunk in statement_sized_chunks(&rest) {
        for (id, state, revision) in tx.states(chunk).await? {
            let state = TaskState::parse(&state).ok_or_else(|| LedgerError::Corrupt {
                id: id.clone(),
                reason: format!("unknown state {state:?}"),
            })?;
            found.insert(id, (state, u64::try_from(revision).unwrap_or(0)));
        }
    }
    let findings = pairs
        .iter()
        .map(|&(id, revision)| {
            if is_claimed(&claimed, (id, revision)) {
                Finding::Claimed
            } else {
                match found.get(id) {
                    Some(&(state, revision)) => Finding::Found { state, revision },
                    None => Finding::Absent,
                }
            }
        })
        .collect();
    Ok((findings, were_pending))
}

/// The claimed tasks of `due` whose `held_by` names a release limit wait
/// for it instead (`waiting`), in the claim's own transaction: one commit
/// for both, and no moment at which such a task is `releasing` unheld.
pub(super) async fn hold_claimed(
    tx: &mut Tx<'_>,
    due: &[(String, u64)],
    held_by: &[Option<String>],
    findings: &[Finding],
) -> Result<(), LedgerError> {
    let mut held: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (((id, _), limit), finding) in due.iter().zip(held_by).zip(findings) {
        if let (Some(limit), Finding::Claimed) = (limit, finding) {
            held.entry(limit.as_str()).or_default().push(id.as_str());
        }
    }
    for (limit, ids) in held {
        for chunk in statement_sized_chunks(&ids) {
            tx.hold(chunk, limit).await?;
        }
    }
    Ok(())
}
