//! The release stage's claim, a step of a group's transaction: a due task
//! in the revision its message carries becomes `releasing`, conditioned on
//! the state it comes from (neither `cancelled` nor `delivered`), so that a
//! cancel committed first wins. What it finds is a [`Finding`] per message.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::error::LedgerError;
use super::pass::{PassInput, release_straight};
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
    /// Claimed, and now `waiting` in the ledger for the release limit it
    /// was claimed for: the limiter releases it.
    Waiting,
    /// Claimed, and now `staged` in the ledger until its moment: the
    /// staged release delivers it.
    Staged,
}

/// The release limit a due task waits for if it is claimed and cannot go
/// at once ([`hold_claimed`]), and the task's destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitsFor {
    pub limit: String,
    pub destination: String,
}

/// One due message a claim asks about, as one record: the task and the
/// revision its message carries, the release limit it waits for if it is
/// claimed and the limits do not let it go, and, for a message that
/// reached the stage well before its time, the moment (epoch ms) the staged
/// release lets it go. Kept together so that nothing pairs one message's
/// limit or moment with another message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimAsk {
    pub id: String,
    pub revision: u64,
    pub waits_for: Option<WaitsFor>,
    pub stage_until: Option<u64>,
}

impl ClaimAsk {
    /// A plain claim: no limit holds it, and it is not staged.
    pub fn of(id: String, revision: u64) -> ClaimAsk {
        ClaimAsk {
            id,
            revision,
            waits_for: None,
            stage_until: None,
        }
    }
}

/// The states one statement of a claim takes tasks from, in order.
struct ClaimFrom {
    states: &'static str,
    /// Pending tasks: the count of pending tasks falls by those claimed.
    pending: bool,
    /// Counted in the forecast already (on their way); a `failed` task
    /// whose message comes after all enters the count when claimed.
    counted: bool,
}

const CLAIM_FROM: [ClaimFrom; 3] = [
    ClaimFrom {
        states: "state = 'pending'",
        pending: true,
        counted: true,
    },
    ClaimFrom {
        states: "state IN ('scheduled', 'releasing')",
        pending: false,
        counted: true,
    },
    ClaimFrom {
        states: "state = 'failed'",
        pending: false,
        counted: false,
    },
];

/// Takes each task asked about, in the revision its message carries: a
/// task that is neither cancelled nor delivered becomes `releasing` (from
/// `pending` first, to count those). The findings answer the asks in their
/// order; also returns how many were pending.
pub(super) async fn claim(
    tx: &mut Tx<'_>,
    asks: &[ClaimAsk],
) -> Result<(Vec<Finding>, u64), LedgerError> {
    let pairs: Vec<(&str, i64)> = asks
        .iter()
        .map(|ask| (ask.id.as_str(), db_ms(ask.revision)))
        .collect();
    // By id and revision: a window may hold a late copy of a task's old
    // revision beside its new one, and only the new one is claimed.
    let mut claimed: HashSet<(String, i64)> = HashSet::with_capacity(pairs.len());
    let is_claimed = |claimed: &HashSet<(String, i64)>, (id, revision): (&str, i64)| {
        claimed.contains(&(id.to_owned(), revision))
    };
    let mut were_pending = 0u64;
    for ClaimFrom {
        states: from,
        pending,
        counted,
    } in CLAIM_FROM
    {
        let open: Vec<(&str, i64)> = pairs
            .iter()
            .copied()
            .filter(|pair| !is_claimed(&claimed, *pair))
            .collect();
        for chunk in statement_sized_chunks(&open) {
            let taken = tx.claim(from, counted, chunk).await?;
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

/// The claimed tasks asked about with a release limit (`waits_for`) wait
/// for it instead (`waiting`, found [`Finding::Waiting`]), in the claim's
/// own transaction: one commit for both, and no moment at which such a task
/// is `releasing` unheld. With `limits` (what the release stage knows of
/// them), those the limits let go now stay claimed, and take their tokens
/// in the same transaction ([`release_straight`]): under its rate a paced
/// destination's tasks do not make the second trip through the ledger.
pub(super) async fn hold_claimed(
    tx: &mut Tx<'_>,
    asks: &[ClaimAsk],
    findings: &mut [Finding],
    limits: Option<&PassInput>,
) -> Result<(), LedgerError> {
    let candidates: Vec<(usize, &str)> = asks
        .iter()
        .zip(findings.iter())
        .enumerate()
        .filter_map(|(i, (ask, finding))| match (&ask.waits_for, finding) {
            (Some(waits_for), Finding::Claimed) => Some((i, waits_for.destination.as_str())),
            _ => None,
        })
        .collect();
    if candidates.is_empty() {
        return Ok(());
    }
    let straight = match limits {
        Some(input) => release_straight(tx, &candidates, input).await?,
        None => HashSet::new(),
    };
    let mut held: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for &(i, _) in candidates.iter().filter(|(i, _)| !straight.contains(i)) {
        if let Some(waits_for) = &asks[i].waits_for {
            held.entry(waits_for.limit.as_str())
                .or_default()
                .push(asks[i].id.as_str());
            findings[i] = Finding::Waiting;
        }
    }
    for (limit, ids) in held {
        for chunk in statement_sized_chunks(&ids) {
            tx.wait_for_limit(chunk, limit).await?;
        }
    }
    Ok(())
}

/// What one take of staged tasks asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnstageInput {
    /// Tasks this process staged whose moment (epoch ms) is at or before this.
    pub by_ms: u64,
    /// Tasks another process staged whose moment is at or before this.
    pub others_by_ms: u64,
    /// This process (its clock's name).
    pub own: &'static str,
    /// Taken under a lease until then.
    pub lease_until_ms: u64,
    /// At most this many.
    pub most: u32,
}

/// The claimed tasks asked about with a moment (`stage_until`) are staged
/// instead, each until its moment, found [`Finding::Staged`]; one whose
/// whole payload the ledger does not hold stays claimed (the release stage
/// holds it).
pub(super) async fn stage_claimed(
    tx: &mut Tx<'_>,
    asks: &[ClaimAsk],
    findings: &mut [Finding],
) -> Result<(), LedgerError> {
    let staged_by = crate::clock::source();
    let mut claimed: Vec<usize> = Vec::new();
    let mut staged: Vec<(&str, i64)> = Vec::new();
    for (i, (ask, finding)) in asks.iter().zip(findings.iter()).enumerate() {
        if let (Some(at_ms), Finding::Claimed) = (ask.stage_until, finding) {
            claimed.push(i);
            staged.push((ask.id.as_str(), db_ms(at_ms)));
        }
    }
    if staged.is_empty() {
        return Ok(());
    }
    for (i, done) in claimed.into_iter().zip(tx.stage(&staged, staged_by).await?) {
        if done {
            findings[i] = Finding::Staged;
        }
    }
    Ok(())
}
