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
//!
//! One task must not be able to make others late:
//! - a task the broker could never take (properties beyond the frame size) is
//!   refused at admission, and quarantined (`failed`) if one reaches the
//!   forwarder anyway (an older row, a broker with a smaller frame size);
//! - a task that was in flight when its channel or connection failed is
//!   retried only alone, on a connection of its own; one the broker refuses
//!   [`MAX_REFUSALS`] times that way is quarantined;
//! - a publish the broker has not confirmed within the timeout is answered
//!   `pending` at once, and its confirm is still awaited (a blocked broker
//!   sends buffered messages when the alarm clears): the task stays leased
//!   meanwhile, so the forwarder does not publish a second copy.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::join_all;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

use crate::broker::{LateConfirm, Message, PublishError, Published, Publisher};
use crate::cascade::Cascade;
use crate::metrics::Metrics;
use crate::store::{Admission, Ledger, Retry, StoreError, TaskRecord};
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
/// The lease of a task whose confirm is late, renewed at half of it while
/// the confirm is awaited; after a crash, the next start's forwarder takes
/// the task when it runs out.
const LATE_LEASE_MS: u64 = 60_000;
/// Refusals of a task published alone after which it is quarantined.
pub const MAX_REFUSALS: i64 = 3;

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// Its properties could never be published; nothing was recorded.
    #[error("{0}")]
    TooLarge(PublishError),
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
#[derive(Clone, Debug)]
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
    /// Tasks awaiting late confirms; finished before the ledger closes.
    watchers: TaskTracker,
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
            watchers: TaskTracker::new(),
        }
    }

    /// Waits for every late confirm to be decided and recorded. Call once the
    /// broker connection is closed (which decides them all), before the
    /// ledger closes.
    pub async fn finish_watchers(&self) {
        self.watchers.close();
        self.watchers.wait().await;
    }

    pub async fn submit(
        &self,
        task: &Task,
        idempotency: Idempotency,
    ) -> Result<Submitted, SubmitError> {
        // Built once: checked now, before anything is recorded, then published.
        let message = Message::of_task(task);
        self.publisher
            .check_fits(&message)
            .map_err(SubmitError::TooLarge)?;
        let Some(ledger) = &self.ledger else {
            self.publisher.publish(message).await?;
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
        let published = self.publisher.publish_bounded(message).await;
        let state = match published {
            Ok(Published::Confirmed) => {
                self.record_published(ledger, &task.id).await;
                TaskState::Published
            }
            Ok(Published::Late(late)) => {
                ledger.pending_changed(1, 0);
                self.watch_late(ledger, &task.id, late, 0).await;
                TaskState::Pending
            }
            Err(publish_error) => {
                debug!(task_id = %task.id, error = %publish_error, "kept pending for the forwarder");
                ledger.pending_changed(1, 0);
                self.record_retry(ledger, &task.id, &publish_error, now_ms, false)
                    .await;
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

    /// One batch of due pending tasks; returns how many were claimed. Tasks
    /// under suspicion are published one at a time on a connection of their
    /// own, beside (not among) the others.
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
        let (alone, together): (Vec<&TaskRecord>, Vec<&TaskRecord>) =
            claimed.iter().partition(|r| r.publish_alone != 0);
        let together = join_all(together.iter().map(|r| async {
            let outcome = match self.rebuild(ledger, r).await {
                Some(task) => {
                    self.publisher
                        .publish_bounded(Message::of_task(&task))
                        .await
                }
                None => return false,
            };
            self.record_forwarded(ledger, r, outcome).await
        }));
        let alone = async {
            let mut isolated = self.publisher.isolated();
            let mut published = 0;
            for record in &alone {
                if let Some(task) = self.rebuild(ledger, record).await {
                    let outcome = isolated.publish(Message::of_task(&task)).await;
                    let outcome = outcome.map(|()| Published::Confirmed);
                    published += usize::from(self.record_forwarded(ledger, record, outcome).await);
                }
            }
            isolated.close().await;
            published
        };
        let (together, alone_published) = tokio::join!(together, alone);
        let published = together.iter().filter(|&&ok| ok).count() + alone_published;
        if !claimed.is_empty() {
            info!(
                published,
                failed = claimed.len() - published,
                "forwarded pending tasks"
            );
        }
        claimed.len()
    }

    /// The task of a pending row, routed by what remains of its delay; a row
    /// that cannot be rebuilt is quarantined (retrying could never help).
    async fn rebuild(&self, ledger: &Ledger, record: &TaskRecord) -> Option<Task> {
        let now_ms = epoch_ms(SystemTime::now());
        match record.to_task(&self.cascade, now_ms) {
            Ok(task) => Some(task),
            Err(error) => {
                self.quarantine(ledger, &record.id, error.to_string()).await;
                None
            }
        }
    }

    /// Records how forwarding `record` went; true when it was published.
    async fn record_forwarded(
        &self,
        ledger: &Ledger,
        record: &TaskRecord,
        outcome: Result<Published, PublishError>,
    ) -> bool {
        match outcome {
            Ok(Published::Confirmed) => {
                self.metrics.forwarded("published");
                ledger.pending_changed(0, 1);
                self.record_published(ledger, &record.id).await;
                true
            }
            Ok(Published::Late(late)) => {
                self.metrics.forwarded("late");
                self.watch_late(ledger, &record.id, late, record.attempts)
                    .await;
                false
            }
            Err(error @ PublishError::TooLarge { .. }) => {
                self.metrics.forwarded("failed");
                self.quarantine(ledger, &record.id, error.to_string()).await;
                false
            }
            Err(
                ref error @ PublishError::Unconfirmed {
                    refused: true,
                    ref reason,
                },
            ) if record.publish_alone != 0 => {
                self.metrics.forwarded("failed");
                if record.refusals + 1 >= MAX_REFUSALS {
                    let why = format!(
                        "RabbitMQ refused the task each of the {MAX_REFUSALS} times it was \
                         published alone: {reason}"
                    );
                    self.quarantine(ledger, &record.id, why).await;
                } else {
                    let retry_at = retry_at(epoch_ms(SystemTime::now()), record.attempts);
                    self.record_retry(ledger, &record.id, error, retry_at, true)
                        .await;
                }
                false
            }
            Err(error) => {
                self.metrics.forwarded("failed");
                let retry_at = retry_at(epoch_ms(SystemTime::now()), record.attempts);
                self.record_retry(ledger, &record.id, &error, retry_at, false)
                    .await;
                false
            }
        }
    }

    /// The broker confirmed the task.
    async fn record_published(&self, ledger: &Ledger, id: &str) {
        if let Err(error) = ledger.mark_published(id.to_owned()).await {
            // The broker owns the task; the forwarder will publish it once
            // more when the lease ends (at-least-once).
            warn!(task_id = %id, %error, "published, but not marked so in the ledger");
        }
    }

    /// Leaves the task pending for the forwarder from `retry_at_ms` on.
    async fn record_retry(
        &self,
        ledger: &Ledger,
        id: &str,
        error: &PublishError,
        retry_at_ms: u64,
        refused: bool,
    ) {
        if error.may_have_landed() {
            self.metrics.publish_unconfirmed.inc();
        }
        let retry = Retry {
            retry_at_ms,
            error: error.to_string(),
            publish_alone: error.is_suspect(),
            refused,
        };
        if let Err(error) = ledger.retry_later(id.to_owned(), retry).await {
            warn!(task_id = %id, %error, "the forwarder takes this task when its lease ends");
        }
    }

    /// Takes the task out of the pending ones for good: it can never be published.
    async fn quarantine(&self, ledger: &Ledger, id: &str, reason: String) {
        error!(task_id = %id, %reason, "task quarantined: it can never be published");
        self.metrics.tasks_failed.inc();
        match ledger.mark_failed(id.to_owned(), reason).await {
            Ok(()) => ledger.pending_changed(0, 1),
            Err(error) => warn!(task_id = %id, %error, "quarantine not recorded; retried later"),
        }
    }

    /// Keeps the task leased while its late confirm is awaited in the
    /// background, then records what the broker decided.
    async fn watch_late(&self, ledger: &Ledger, id: &str, late: LateConfirm, attempts: i64) {
        self.metrics.publish_late.inc();
        let now_ms = epoch_ms(SystemTime::now());
        let waiting = PublishError::Timeout(std::time::Duration::from_millis(
            self.lease_ms - LEASE_MARGIN_MS,
        ));
        let lease = move |now_ms: u64| Retry {
            retry_at_ms: now_ms + LATE_LEASE_MS,
            error: format!("{waiting}; awaiting the broker's late answer"),
            publish_alone: false,
            refused: false,
        };
        if let Err(error) = ledger.retry_later(id.to_owned(), lease(now_ms)).await {
            warn!(task_id = %id, %error, "the forwarder takes this task when its lease ends");
        }
        let scheduler = self.clone();
        let ledger = ledger.clone();
        let id = id.to_owned();
        self.watchers.spawn(async move {
            let outcome = late.outcome();
            tokio::pin!(outcome);
            let mut renew = tokio::time::interval(Duration::from_millis(LATE_LEASE_MS / 2));
            renew.tick().await;
            let outcome = loop {
                tokio::select! {
                    outcome = &mut outcome => break outcome,
                    _ = renew.tick() => {
                        let renewed = ledger.retry_later(id.clone(), lease(epoch_ms(SystemTime::now())));
                        if let Err(error) = renewed.await {
                            warn!(task_id = %id, %error, "cannot renew the lease of a late publish");
                        }
                    }
                }
            };
            match outcome {
                Ok(()) => {
                    debug!(task_id = %id, "late confirm: the broker has the task");
                    ledger.pending_changed(0, 1);
                    scheduler.record_published(&ledger, &id).await;
                }
                Err(error) => {
                    debug!(task_id = %id, %error, "late publish failed; the forwarder retries it");
                    let retry_at = retry_at(epoch_ms(SystemTime::now()), attempts);
                    scheduler
                        .record_retry(&ledger, &id, &error, retry_at, false)
                        .await;
                }
            }
        });
    }
}

/// A retry after a failed publish waits longer the more attempts it took.
fn retry_at(now_ms: u64, attempts: i64) -> u64 {
    let attempts = u64::try_from(attempts).unwrap_or(1);
    now_ms + (RETRY_STEP_MS * attempts).min(RETRY_CAP_MS)
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
