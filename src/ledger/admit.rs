//! Admitting new tasks, the first step of a group's transaction: repeats
//! within the group and against the ledger are told apart by idempotency
//! key, id and fingerprint ([`Admission`]); the rest are inserted.

use std::collections::{HashMap, HashSet};

use super::error::LedgerError;
use super::record::{Row, StoredTask};
use super::sql::statement_sized_chunks;
use super::transaction::Tx;

/// What admitting a task found.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// Recorded as pending: the caller publishes it now.
    New,
    /// This request was accepted before: answer what it got, schedule nothing.
    Replay(StoredTask),
    /// Its idempotency key or id belongs to a different request.
    Conflict(StoredTask),
}

/// An admission decided on rows, before the existing row is decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Judged {
    New,
    Replay(Row),
    Conflict(Row),
}

impl Judged {
    pub(super) fn into_admission(self) -> Result<Admission, LedgerError> {
        Ok(match self {
            Judged::New => Admission::New,
            Judged::Replay(row) => Admission::Replay(row.decode()?),
            Judged::Conflict(row) => Admission::Conflict(row.decode()?),
        })
    }
}

/// Admits the group's new rows: repeats within the group are judged against
/// their first occurrence, the rest inserted; a row whose key or id is taken
/// is judged against the row that holds it.
pub(super) async fn admit(tx: &mut Tx<'_>, rows: &[&Row]) -> Result<Vec<Judged>, LedgerError> {
    let mut decided = dedupe_in_group(rows);
    let fresh: Vec<&Row> = rows
        .iter()
        .zip(&decided)
        .filter(|(_, decision)| decision.is_none())
        .map(|(row, _)| *row)
        .collect();
    let mut inserted: HashSet<String> = HashSet::with_capacity(fresh.len());
    for chunk in statement_sized_chunks(&fresh) {
        inserted.extend(tx.insert(chunk).await?);
    }
    for (row, decision) in rows.iter().zip(decided.iter_mut()) {
        if decision.is_some() || inserted.contains(&row.id) {
            continue;
        }
        let holder = tx
            .holder_of(row)
            .await?
            .ok_or_else(|| LedgerError::Corrupt {
                id: row.id.clone(),
                reason: "conflicting row vanished; retry the request".to_owned(),
            })?;
        *decision = Some(judge(row, holder));
    }
    Ok(decided
        .into_iter()
        .map(|decision| decision.unwrap_or(Judged::New))
        .collect())
}

/// A retry of a request accepted before, or another request under its key.
fn judge(new: &Row, existing: Row) -> Judged {
    let same_request = new.fingerprint.is_some()
        && existing.fingerprint == new.fingerprint
        && existing.idempotency_key == new.idempotency_key;
    if same_request {
        Judged::Replay(existing)
    } else {
        Judged::Conflict(existing)
    }
}

/// Decides, in order, which rows of the group are new and which repeat an
/// earlier one of the same group; only the first kind goes to the INSERT.
fn dedupe_in_group(rows: &[&Row]) -> Vec<Option<Judged>> {
    let mut first_by_key: HashMap<&str, usize> = HashMap::new();
    let mut first_by_id: HashMap<&str, usize> = HashMap::new();
    let mut decided = Vec::with_capacity(rows.len());
    for (index, row) in rows.iter().enumerate() {
        let earlier = row
            .idempotency_key
            .as_deref()
            .and_then(|key| first_by_key.get(key))
            .or_else(|| first_by_id.get(row.id.as_str()))
            .copied();
        match earlier {
            Some(earlier) => decided.push(Some(judge(row, rows[earlier].clone()))),
            None => {
                if let Some(key) = row.idempotency_key.as_deref() {
                    first_by_key.insert(key, index);
                }
                first_by_id.insert(&row.id, index);
                decided.push(None);
            }
        }
    }
    decided
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, key: Option<&str>, fingerprint: &str) -> Row {
        Row {
            id: id.into(),
            idempotency_key: key.map(Into::into),
            fingerprint: Some(fingerprint.into()),
            destination: "d".into(),
            routing_key: "0.d".into(),
            delay_ms: 0,
            deliver_at_ms: 0,
            content_type: "application/json".into(),
            headers: "{}".into(),
            payload: Some(vec![]),
            payload_bytes: 0,
            state: "pending".into(),
            created_at_ms: 0,
            published_at_ms: None,
            next_attempt_at_ms: 0,
            attempts: 1,
            last_error: None,
            client: None,
            properties: None,
            exchange: None,
            leased_by: None,
            leeway_ms: 0,
            publish_alone: 0,
            refusals: 0,
            revision: 1,
            delivered_at_ms: None,
            cancelled_at_ms: None,
            held_by: None,
            release_at_ms: None,
            staged_by: None,
            deadline_ms: None,
            expired_at_ms: None,
            expired_destination: None,
        }
    }

    #[test]
    fn repeats_within_one_group_are_judged_against_the_first() {
        let first = row("a", Some("k"), "f1");
        let replay = row("b", Some("k"), "f1");
        let conflict = row("c", Some("k"), "f2");
        let same_id = row("a", None, "f1");
        let other = row("d", None, "f3");
        let decided = dedupe_in_group(&[&first, &replay, &conflict, &same_id, &other]);
        assert_eq!(
            decided,
            [
                None,
                Some(Judged::Replay(first.clone())),
                Some(Judged::Conflict(first.clone())),
                // Same id, but the first came with a key this one lacks.
                Some(Judged::Conflict(first.clone())),
                None,
            ]
        );
    }
}
