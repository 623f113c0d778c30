//! What the API asks of release limits: set, read (with what each holds
//! now), pause, resume, delete. The limits are kept in the ledger and put
//! to work by [`super::limiter`]; this is the scheduler's facade for them.

use super::answers::LimitsError;
use super::bookkeeper::Bookkeeper;
use super::{Mode, Scheduler};
use crate::limit::{Depth, Limit, LimitError};
use crate::release::LimitStatus;

impl Scheduler {
    /// The bookkeeper, when limits can hold tasks: a ledger to wait in, and
    /// a release stage every due task passes.
    fn limiting(&self) -> Result<&Bookkeeper, LimitsError> {
        match &self.inner.mode {
            Mode::Stateless => Err(LimitsError::LedgerDisabled),
            Mode::Ledger(_) if !self.inner.cascade.release_stage() => {
                Err(LimitsError::ReleaseStageOff)
            }
            Mode::Ledger(bookkeeper) => Ok(bookkeeper),
        }
    }

    /// Sets a limit (new, or changed in place), set by `client`; whether it
    /// is new. Its bounded queue must exist.
    pub async fn put_limit(
        &self,
        limit: &Limit,
        client: Option<&str>,
        now_ms: u64,
    ) -> Result<(LimitStatus, bool), LimitsError> {
        let bookkeeper = self.limiting()?;
        if let Some(bound) = &limit.depth {
            match self.inner.broker.queue_depth(&bound.queue).await? {
                Some(ready) => bookkeeper
                    .limits()
                    .saw_depth(&bound.queue, Depth::Ready(ready)),
                None => {
                    return Err(LimitsError::Invalid(LimitError {
                        field: "/max_queue_depth/queue",
                        reason: format!("queue {:?} does not exist", bound.queue),
                    }));
                }
            }
        }
        let (_, created) = bookkeeper.ledger().put_limit(limit, client, now_ms).await?;
        let status = self.changed_limit(bookkeeper, &limit.name, now_ms).await?;
        Ok((status, created))
    }

    /// Every limit with what it holds now, read from the ledger.
    pub async fn limits(&self, now_ms: u64) -> Result<Vec<LimitStatus>, LimitsError> {
        let bookkeeper = self.limiting()?;
        Ok(statuses(bookkeeper, now_ms, false).await?)
    }

    pub async fn limit_status(&self, name: &str, now_ms: u64) -> Result<LimitStatus, LimitsError> {
        let found = self.limits(now_ms).await?;
        named(found, name)
    }

    /// Limit `name` as it is after a change here, which this replica's
    /// release stage and limiter take at once (others within a refresh).
    async fn changed_limit(
        &self,
        bookkeeper: &Bookkeeper,
        name: &str,
        now_ms: u64,
    ) -> Result<LimitStatus, LimitsError> {
        named(statuses(bookkeeper, now_ms, true).await?, name)
    }

    /// Deletes a limit: what it held is released (at the rate of any other
    /// limit that matches it).
    pub async fn delete_limit(&self, name: &str) -> Result<(), LimitsError> {
        let bookkeeper = self.limiting()?;
        if !bookkeeper.ledger().delete_limit(name).await? {
            return Err(LimitsError::NotFound(name.to_owned()));
        }
        bookkeeper
            .limits()
            .changed(bookkeeper.ledger().limits().await?);
        Ok(())
    }

    /// Pauses or resumes a limit (resuming also ends a `paused_until`).
    pub async fn pause_limit(
        &self,
        name: &str,
        paused: bool,
        now_ms: u64,
    ) -> Result<LimitStatus, LimitsError> {
        let bookkeeper = self.limiting()?;
        if bookkeeper
            .ledger()
            .pause_limit(name, paused, now_ms)
            .await?
            .is_none()
        {
            return Err(LimitsError::NotFound(name.to_owned()));
        }
        self.changed_limit(bookkeeper, name, now_ms).await
    }
}

/// Every limit with what it holds now; with `changed`, also handed to this
/// replica's release stage and limiter.
async fn statuses(
    bookkeeper: &Bookkeeper,
    now_ms: u64,
    changed: bool,
) -> Result<Vec<LimitStatus>, crate::ledger::LedgerError> {
    let ledger = bookkeeper.ledger();
    let limits = ledger.limits().await?;
    let waiting = ledger.waiting_per_destination().await?;
    if changed {
        bookkeeper.limits().changed(limits.clone());
    }
    Ok(bookkeeper.limits().status(limits, &waiting, now_ms))
}

fn named(found: Vec<LimitStatus>, name: &str) -> Result<LimitStatus, LimitsError> {
    found
        .into_iter()
        .find(|status| status.stored.limit.name == name)
        .ok_or_else(|| LimitsError::NotFound(name.to_owned()))
}
