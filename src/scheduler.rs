//! Taking a task in: ledger first, then the broker; and the background work
//! that keeps the ledger's promises (forwarding pending tasks, retention).
//!
//! With a ledger, a task is recorded as `pending` before it is published and
//! marked `published` only after the broker's confirm. When publishing fails
//! the task stays pending and the answer says so; the forwarder publishes it
//! once the broker is back, by what remains of its delay. The row is leased
//! to whoever publishes it, so the forwarder (here or in another replica)
//! never takes a task a request is still publishing.
//!
//! Without a ledger (`store.url = "none"`) a task is only published, and a
//! broker problem is the client's 503.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::join_all;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::broker::{PublishError, Publisher};
use crate::cascade::Cascade;
use crate::metrics::Metrics;
use crate::store::{Admission, Ledger, StoreError, TaskRecord};
use crate::task::{Task, TaskAccepted, TaskState, epoch_ms};

/// How often the forwarder looks for pending tasks when it found none.
const FORWARD_POLL: Duration = Duration::from_millis(200);
/// Pending tasks published concurrently per round; confirms are pipelined.
const FORWARD_BATCH: u32 = 256;
/// How often the pending count is read back from the ledger.
const RECOUNT_EVERY: Duration = Duration::from_secs(5);
const PRUNE_BATCH: u32 = 1000;
/// A retry after a failed publish waits this much per attempt so far, up to the cap.
const RETRY_STEP_MS: u64 = 500;
const RETRY_CAP_MS: u64 = 10_000;
/// Beyond the confirm timeout, how long a publisher keeps its lease on a task.
const LEASE_MARGIN_MS: u64 = 2_000;

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// Stateless mode: the broker did not take the task.
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error(transparent)]
    Ledger(#[from] StoreError),
    #[error("{pending} tasks are waiting for RabbitMQ, the most store.max_pending allows")]
    LedgerFull { pending: u64 },
    #[error("{key} was already used for a different request (task {existing_id})")]
    Conflict { key: String, existing_id: String },
}

/// The answer to a submitted task.
#[derive(Debug)]
pub struct Submitted {
    pub accepted: TaskAccepted,
    /// The same request was accepted before; nothing new was scheduled.
    pub replayed: bool,
}

/// How a client names a request so that a retry is recognised.
#[derive(Clone, Debug, Default)]
pub struct Idempotency {
    /// The Idempotency-Key header.
    pub key: Option<String>,
    /// The canonical request's hash; set when there is a key or a client id.
    pub fingerprint: Option<String>,
}

#[derive(Clone)]
pub struct Scheduler {
    pub publisher: Publisher,
    pub ledger: Option<Ledger>,
    pub cascade: Arc<Cascade>,
    pub metrics: Arc<Metrics>,
    lease_ms: u64,
}

impl Scheduler {
    pub fn new(
        publisher: Publisher,
        ledger: Option<Ledger>,
        cascade: Arc<Cascade>,
        metrics: Arc<Metrics>,
        confirm_timeout: Duration,
    ) -> Self {
        let confirm_ms = u64::try_from(confirm_timeout.as_millis()).unwrap_or(u64::MAX);
        Scheduler {
            publisher,
            ledger,
            cascade,
            metrics,
            lease_ms: confirm_ms.saturating_add(LEASE_MARGIN_MS),
        }
    }

    pub async fn submit(
        &self,
        task: &Task,
        idempotency: Idempotency,
    ) -> Result<Submitted, SubmitError> {
        let Some(ledger) = &self.ledger else {
            self.publisher.publish_task(task).await?;
            return Ok(Submitted {
                accepted: task.accepted(TaskState::Published),
                replayed: false,
            });
        };
        if ledger.is_full() {
            return Err(SubmitError::LedgerFull {
                pending: ledger.max_pending(),
            });
        }
        let now_ms = epoch_ms(SystemTime::now());
        let header_key = idempotency.key.clone();
        let record = TaskRecord::pending(
            task,
            idempotency.key,
            idempotency.fingerprint,
            now_ms + self.lease_ms,
        );
        match ledger.admit(record).await? {
            Admission::New => {}
            Admission::Replay(existing) => {
                return Ok(Submitted {
                    accepted: existing.accepted()?,
                    replayed: true,
                });
            }
            Admission::Conflict(existing) => {
                return Err(SubmitError::Conflict {
                    key: match header_key {
                        Some(key) => format!("Idempotency-Key {key:?}"),
                        None => format!("task id {:?}", task.id),
                    },
                    existing_id: existing.id,
                });
            }
        }
        let state = match self.publisher.publish_task(task).await {
            Ok(()) => {
                if let Err(error) = ledger.mark_published(task.id.clone()).await {
                    // The broker owns the task; the forwarder will publish it
                    // once more when the lease ends (at-least-once).
                    warn!(task_id = %task.id, %error, "published, but not marked so in the ledger");
                }
                TaskState::Published
            }
            Err(publish_error) => {
                debug!(task_id = %task.id, error = %publish_error, "kept pending for the forwarder");
                ledger.pending_changed(1, 0);
                let retry = ledger
                    .retry_later(task.id.clone(), now_ms, publish_error.to_string())
                    .await;
                if let Err(error) = retry {
                    warn!(task_id = %task.id, %error, "the forwarder takes this task when its lease ends");
                }
                TaskState::Pending
            }
        };
        Ok(Submitted {
            accepted: task.accepted(state),
            replayed: false,
        })
    }

    /// Starts the forwarder and the retention pruner; both end with `shutdown`.
    pub fn spawn_background(
        &self,
        retention: Duration,
        prune_every: Duration,
        shutdown: CancellationToken,
    ) -> Vec<JoinHandle<()>> {
        let Some(ledger) = &self.ledger else {
            return Vec::new();
        };
        vec![
            tokio::spawn(self.clone().forward(ledger.clone(), shutdown.clone())),
            tokio::spawn(prune(ledger.clone(), retention, prune_every, shutdown)),
        ]
    }

    /// Publishes pending tasks whenever the broker is ready, until `shutdown`.
    /// At start-up this resumes whatever a previous run left pending.
    async fn forward(self, ledger: Ledger, shutdown: CancellationToken) {
        let mut last_recount = tokio::time::Instant::now();
        loop {
            if last_recount.elapsed() >= RECOUNT_EVERY {
                last_recount = tokio::time::Instant::now();
                if let Err(error) = ledger.recount_pending().await {
                    warn!(%error, "cannot count pending tasks");
                }
            }
            let forwarded = if self.publisher.is_ready() {
                self.forward_round(&ledger).await
            } else {
                0
            };
            if forwarded == 0 {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(FORWARD_POLL) => {}
                }
            } else if shutdown.is_cancelled() {
                return;
            }
        }
    }

    /// One batch of due pending tasks; returns how many were claimed.
    async fn forward_round(&self, ledger: &Ledger) -> usize {
        let now_ms = epoch_ms(SystemTime::now());
        let claimed = match ledger
            .claim_due(now_ms, now_ms + self.lease_ms, FORWARD_BATCH)
            .await
        {
            Ok(claimed) => claimed,
            Err(error) => {
                warn!(%error, "cannot read pending tasks");
                return 0;
            }
        };
        let outcomes = join_all(claimed.iter().map(|r| self.forward_one(ledger, r))).await;
        let published = outcomes.iter().filter(|&&ok| ok).count();
        if !claimed.is_empty() {
            info!(
                published,
                failed = claimed.len() - published,
                "forwarded pending tasks"
            );
        }
        claimed.len()
    }

    async fn forward_one(&self, ledger: &Ledger, record: &TaskRecord) -> bool {
        let now_ms = epoch_ms(SystemTime::now());
        let outcome = match record.to_task(&self.cascade, now_ms) {
            Ok(task) => self
                .publisher
                .publish_task(&task)
                .await
                .map_err(|e| e.to_string()),
            Err(error) => {
                error!(task_id = %record.id, %error, "cannot rebuild a pending task");
                Err(error.to_string())
            }
        };
        self.metrics.forwarded(if outcome.is_ok() {
            "published"
        } else {
            "failed"
        });
        let written = match &outcome {
            Ok(()) => {
                ledger.pending_changed(0, 1);
                ledger.mark_published(record.id.clone()).await
            }
            Err(error) => {
                let attempts = u64::try_from(record.attempts).unwrap_or(1);
                let retry_at = now_ms + (RETRY_STEP_MS * attempts).min(RETRY_CAP_MS);
                ledger
                    .retry_later(record.id.clone(), retry_at, error.clone())
                    .await
            }
        };
        if let Err(error) = written {
            warn!(task_id = %record.id, %error, "forwarding outcome not recorded");
        }
        outcome.is_ok()
    }
}

/// Deletes published tasks once they have been due for `retention`.
async fn prune(ledger: Ledger, retention: Duration, every: Duration, shutdown: CancellationToken) {
    let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let before_ms = epoch_ms(SystemTime::now()).saturating_sub(retention_ms);
        let mut pruned = 0;
        loop {
            match ledger.prune(before_ms, PRUNE_BATCH).await {
                Ok(deleted) => {
                    pruned += deleted;
                    if deleted < u64::from(PRUNE_BATCH) || shutdown.is_cancelled() {
                        break;
                    }
                }
                Err(error) => {
                    warn!(%error, "pruning the ledger failed");
                    break;
                }
            }
        }
        if pruned > 0 {
            debug!(pruned, "pruned delivered tasks from the ledger");
        }
    }
}
