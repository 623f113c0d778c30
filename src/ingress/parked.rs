//! Parked messages replayed or discarded: one, or every one a filter
//! matches, a page at a time.
//!
//! A replay makes a task of the message, due now, back to the queue it
//! failed in on its first attempt again (the release stage delivers it, so
//! release limits hold it as any task), and deletes the row in the same
//! transaction that records the task: a replay is done whole or not at all.
//! The task's id is derived from the parked message's, with its id as the
//! fingerprint: two replays of one message (two replicas, or a row left by
//! a version that deleted it afterwards) make one task, and the second
//! counts the message `unchanged`. The task's own delivery is at least
//! once, as every task's: a crash during its release can deliver it twice.

use futures_util::future::join_all;
use serde::Serialize;

use super::intake::retry_task;
use crate::cascade::Cascade;
use crate::clock::Reading;
use crate::ledger::{LedgerError, ParkedFilter, ParkedMessage};
use crate::message;
use crate::metrics::Metrics;
use crate::scheduler::{Idempotency, Scheduler, SubmitError};

/// Parked messages read (and replayed or discarded) per page.
pub const PARKED_PAGE: u32 = 500;

/// Replay (back to its queue, now) or discard (deleted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParkedAction {
    /// Back to its queue `after_ms` from now (0: now).
    Replay {
        after_ms: u64,
    },
    Discard,
}

impl ParkedAction {
    /// `replay` (now) or `discard`.
    pub fn parse(text: &str) -> Option<ParkedAction> {
        match text {
            "replay" => Some(ParkedAction::Replay { after_ms: 0 }),
            "discard" => Some(ParkedAction::Discard),
            _ => None,
        }
    }

    pub fn outcome(self) -> &'static str {
        match self {
            ParkedAction::Replay { .. } => "replayed",
            ParkedAction::Discard => "discarded",
        }
    }
}

/// What an action on parked messages did, counted as bulk operations count:
/// every message matched is `changed` (replayed or discarded) or
/// `unchanged` (gone before the action reached it: another replica's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Unparked {
    pub matched: u64,
    pub changed: u64,
    pub unchanged: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ParkedError {
    #[error("this service has no ledger: nothing is parked")]
    LedgerDisabled,
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// Its queue cannot be a task's destination any more (the chain
    /// changed since): it stays parked.
    #[error("parked message {id} cannot be replayed: {reason}")]
    Unreplayable { id: String, reason: String },
}

/// Parked messages acted on through the service's scheduler and ledger.
pub struct Parked<'a> {
    pub scheduler: &'a Scheduler,
    pub cascade: &'a Cascade,
    pub metrics: &'a Metrics,
}

impl Parked<'_> {
    /// `action` on the parked message `id`; `None` when there is none.
    pub async fn one(
        &self,
        id: &str,
        action: ParkedAction,
        now: &Reading,
    ) -> Result<Option<Unparked>, ParkedError> {
        let ledger = self
            .scheduler
            .own_ledger()
            .ok_or(ParkedError::LedgerDisabled)?;
        let Some(parked) = ledger.parked_message(id).await? else {
            return Ok(None);
        };
        Ok(Some(self.page(vec![parked], action, now).await?))
    }

    /// `action` on every parked message `filter` matches, newest first, a
    /// page at a time. An error stops it: what was done stays done, and the
    /// same call again does the rest.
    pub async fn all(
        &self,
        filter: &ParkedFilter,
        action: ParkedAction,
        now: &Reading,
    ) -> Result<Unparked, ParkedError> {
        let ledger = self
            .scheduler
            .own_ledger()
            .ok_or(ParkedError::LedgerDisabled)?;
        let mut done = Unparked::default();
        let mut cursor: Option<(u64, String)> = None;
        loop {
            let before = cursor.as_ref().map(|(at, id)| (*at, id.as_str()));
            let page = ledger.parked(filter, before, PARKED_PAGE).await?;
            let Some(last) = page.last() else {
                return Ok(done);
            };
            cursor = Some((last.parked_at_ms, last.id.clone()));
            let full = page.len() == PARKED_PAGE as usize;
            let counted = self.page(page, action, now).await?;
            done.matched += counted.matched;
            done.changed += counted.changed;
            done.unchanged += counted.unchanged;
            if !full {
                return Ok(done);
            }
        }
    }

    async fn page(
        &self,
        page: Vec<ParkedMessage>,
        action: ParkedAction,
        now: &Reading,
    ) -> Result<Unparked, ParkedError> {
        let ledger = self
            .scheduler
            .own_ledger()
            .ok_or(ParkedError::LedgerDisabled)?;
        // Which of the page this call changes: for a replay, the messages
        // whose task it made, each row deleted with its task (one found made
        // by another call is not replayed, nor counted, again); for a
        // discard, the rows it deleted.
        let (mine, changed): (Vec<bool>, u64) = match action {
            ParkedAction::Replay { after_ms } => {
                let replays = page.iter().map(|parked| self.replay(parked, after_ms, now));
                let mine: Vec<bool> = join_all(replays)
                    .await
                    .into_iter()
                    .collect::<Result<_, _>>()?;
                let changed = mine.iter().filter(|m| **m).count() as u64;
                (mine, changed)
            }
            ParkedAction::Discard => {
                let ids: Vec<String> = page.iter().map(|p| p.id.clone()).collect();
                (vec![true; page.len()], ledger.unpark(&ids).await?)
            }
        };
        let mut per_queue: std::collections::BTreeMap<&str, u64> = Default::default();
        for (parked, _) in page.iter().zip(&mine).filter(|(_, mine)| **mine) {
            *per_queue.entry(parked.queue.as_str()).or_default() += 1;
        }
        for (queue, messages) in per_queue {
            self.metrics.retried(queue, action.outcome(), messages);
        }
        let matched = page.len() as u64;
        Ok(Unparked {
            matched,
            changed,
            unchanged: matched.saturating_sub(changed),
        })
    }

    /// A task of `parked`, due `after_ms` from now, committed; whether this
    /// call made it (`false`: an earlier, interrupted replay did).
    async fn replay(
        &self,
        parked: &ParkedMessage,
        after_ms: u64,
        now: &Reading,
    ) -> Result<bool, ParkedError> {
        let carried = message::for_replay(&parked.properties, &parked.queue);
        let task = retry_task(
            self.cascade,
            format!("replay-{}", parked.id),
            &parked.queue,
            (after_ms, None),
            (&parked.payload, carried),
            now.wall,
        )
        .map_err(|refusal| ParkedError::Unreplayable {
            id: parked.id.clone(),
            reason: refusal.to_string(),
        })?;
        let idempotency = Idempotency {
            key: None,
            fingerprint: Some(parked.id.clone()),
        };
        let submitted = self
            .scheduler
            .submit_replay(&task, idempotency, parked.id.clone(), now)
            .await?;
        Ok(!submitted.replayed)
    }
}
