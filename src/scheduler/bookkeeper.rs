//! The ledger mode's work: every task is recorded before it is published,
//! and the background keeps the ledger's promises (forwarding pending tasks,
//! the watchers of late confirms, retention).
//!
//! A task is recorded as `pending` before it is published and marked
//! `published` only after the broker's confirm. When publishing fails the
//! task stays pending and the answer says so; the forwarder publishes it
//! once the broker is back, routed by what remains of its delay. The row is
//! leased to whoever publishes it, so the forwarder (here or in another
//! replica) never takes a task a request is still publishing.
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

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

use super::answers::{ChangeError, Idempotency, SubmitError, Submitted};
use crate::broker::{LateConfirm, PublishError, Published};
use crate::cascade::Cascade;
use crate::chain::{FailoverResender, KeeperHandles};
use crate::clock::Reading;
use crate::ledger::{Admission, ChangeKey, Entry, Ledger, Move, Republish, Reschedule, StoredTask};
use crate::message;
use crate::message::Message;
use crate::metrics::Metrics;
use crate::release::{ArrivalWatch, Broker, LimitsView, ReleaseHandles};
use crate::task::{Itinerary, Task, TaskState};
use crate::telemetry::TaskTracer;

/// How often the forwarder looks for pending tasks when it found none.
const FORWARD_POLL: Duration = Duration::from_millis(200);
/// How often the resender looks for tasks the release stage never saw.
const RESEND_POLL: Duration = Duration::from_secs(1);
/// How often leases of replicas that are gone are looked for.
const LEASE_WATCH_POLL: Duration = Duration::from_secs(1);
/// Pending tasks published concurrently per round; confirms are pipelined.
const FORWARD_BATCH: u32 = 256;
const PRUNE_BATCH: u32 = 1000;
/// A failed publish is tried again after this much per attempt so far, up to the cap.
const REPUBLISH_STEP_MS: u64 = 500;
const REPUBLISH_CAP_MS: u64 = 10_000;
/// Beyond the confirm timeout, how long a publisher keeps its lease on a task.
const LEASE_MARGIN_MS: u64 = 2_000;
/// The lease of a task whose confirm is late, renewed at half of it while
/// the confirm is awaited; after a crash, the next start's forwarder takes
/// the task when it runs out.
const LATE_LEASE_MS: u64 = 60_000;
/// Refusals of a task published alone after which it is quarantined.
pub const MAX_REFUSALS: u32 = 3;

/// A task as it is taken in: its route (a burst's head start given), its message
/// (checked to fit), and whether it skips the chain.
pub(super) struct Prepared<'t> {
    pub task: Cow<'t, Task>,
    pub message: crate::message::Message,
    /// Staged in the ledger as it is admitted, until its moment: a burst's
    /// task the levels have no room for. Never published into the chain.
    pub staged: bool,
}

#[derive(Clone)]
pub(super) struct Bookkeeper {
    broker: Arc<dyn Broker>,
    ledger: Ledger,
    cascade: Arc<Cascade>,
    metrics: Arc<Metrics>,
    lease_ms: u64,
    /// Tasks awaiting late confirms; finished before the ledger closes.
    watchers: TaskTracker,
    /// The release limits, shared by the release stage, the limiter and
    /// the API.
    limits: LimitsView,
    /// Told when tasks are staged (at admission here, or by the release
    /// stage): the staged release looks again for the earliest moment.
    staged_wake: Arc<tokio::sync::Notify>,
}

impl Bookkeeper {
    pub fn new(
        broker: Arc<dyn Broker>,
        ledger: Ledger,
        cascade: Arc<Cascade>,
        metrics: Arc<Metrics>,
        confirm_timeout: Duration,
    ) -> Self {
        let confirm_ms = u64::try_from(confirm_timeout.as_millis()).unwrap_or(u64::MAX);
        Bookkeeper {
            broker,
            ledger,
            cascade,
            metrics,
            lease_ms: confirm_ms.saturating_add(LEASE_MARGIN_MS),
            watchers: TaskTracker::new(),
            limits: LimitsView::default(),
            staged_wake: Default::default(),
        }
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn limits(&self) -> &LimitsView {
        &self.limits
    }

    pub async fn finish_watchers(&self) {
        self.watchers.close();
        self.watchers.wait().await;
    }

    /// Until when a task admitted at `now_ms` is the admitter's to publish
    /// (the forwarder's after that).
    pub fn lease_until(&self, now_ms: u64) -> u64 {
        now_ms + self.lease_ms
    }

    /// Records the task (deleting the parked message it `unparks` in the
    /// same write), then publishes `message` (the task's, checked to fit).
    pub async fn submit(
        &self,
        prepared: Prepared<'_>,
        idempotency: Idempotency,
        unparks: Option<String>,
        now_ms: u64,
    ) -> Result<Submitted, SubmitError> {
        let ledger = &self.ledger;
        let Prepared {
            task,
            message,
            staged,
        } = prepared;
        let task = task.as_ref();
        if !staged && ledger.is_full() {
            return Err(SubmitError::LedgerFull {
                pending: ledger.max_pending(),
            });
        }
        let own = crate::clock::source();
        let entry = match staged {
            true => Entry::Staged { by: own },
            false => Entry::Publish,
        };
        let Idempotency { key, fingerprint } = idempotency;
        let admission = ledger
            .admit(
                task,
                (key.clone(), fingerprint),
                now_ms + self.lease_ms,
                entry,
                unparks,
            )
            .await?;
        match admission {
            Admission::New => {}
            Admission::Replay(existing) => {
                return Ok(Submitted {
                    accepted: existing.accepted(),
                    replayed: true,
                });
            }
            Admission::Conflict(existing) => {
                return Err(SubmitError::Conflict {
                    key: match key {
                        Some(key) => format!("Idempotency-Key {key:?}"),
                        None => format!("task id {:?}", task.id),
                    },
                    existing_id: existing.id,
                });
            }
        }
        let state = if staged {
            self.staged_at_admission(1);
            TaskState::Staged
        } else {
            self.publish_recorded(task, message, now_ms).await
        };
        Ok(Submitted {
            accepted: task.accepted(state),
            replayed: false,
        })
    }

    /// `tasks` went into the ledger staged as they were admitted: the
    /// staged release looks again for the earliest moment.
    pub(super) fn staged_at_admission(&self, tasks: u64) {
        self.metrics.tasks_staged.inc_by(tasks);
        self.staged_wake.notify_one();
    }

    /// Publishes a task the ledger holds as pending (leased to the caller),
    /// and records the outcome: scheduled once confirmed; otherwise pending
    /// for the forwarder, or for the watcher of its late confirm.
    pub(super) async fn publish_recorded(
        &self,
        task: &Task,
        message: Message,
        now_ms: u64,
    ) -> TaskState {
        match self.broker.publish_bounded(message).await {
            Ok(Published::Confirmed) => {
                self.record_published(&task.id, task.revision).await;
                TaskState::Scheduled
            }
            Ok(Published::Late(late)) => {
                self.watch_late(&task.id, task.revision, late, 0).await;
                TaskState::Pending
            }
            Err(publish_error) => {
                debug!(task_id = %task.id, error = %publish_error, "kept pending for the forwarder");
                self.record_failed_publish(&task.id, task.revision, &publish_error, now_ms, false)
                    .await;
                TaskState::Pending
            }
        }
    }

    /// Cancels each of `ids` still on its way (see [`Ledger::cancel`]).
    pub async fn cancel(
        &self,
        ids: &[String],
        owner: Option<&str>,
        now_ms: u64,
    ) -> Result<Vec<crate::ledger::Cancel>, ChangeError> {
        let outcomes = self.ledger.cancel(ids, owner, now_ms).await?;
        let cancelled = outcomes
            .iter()
            .filter(|o| matches!(o, crate::ledger::Cancel::Cancelled(_)))
            .count();
        self.metrics.tasks_cancelled.inc_by(cancelled as u64);
        Ok(outcomes)
    }

    /// Moves a task to `delay` from now: a new revision is recorded, then
    /// published as a task is on submit; the release stage drops the old copy.
    pub async fn reschedule(
        &self,
        id: &str,
        delay: Duration,
        key: Option<ChangeKey>,
        owner: Option<&str>,
        now: &Reading,
    ) -> Result<Reschedule, ChangeError> {
        let Some(current) = self.ledger.get(id).await? else {
            return Ok(Reschedule::NotFound);
        };
        if !current.within_scope(owner) {
            return Ok(Reschedule::NotFound);
        }
        let now_ms = now.wall_ms;
        // A task with a leeway keeps it, and its moment in it.
        let offset = crate::task::leeway_offset_ms(id, current.leeway_ms);
        let delay = delay + Duration::from_millis(offset);
        // The destination never changes, so the route can be planned before
        // the row is changed.
        let itinerary = Itinerary::new(
            &self.cascade,
            id,
            &current.destination,
            delay,
            self.delay_start_ms(now),
        )
        .map_err(ChangeError::Route)?;
        let change = Move {
            deliver_at_ms: itinerary.deliver_at_ms,
            delay_ms: itinerary.route.delay_ms,
            routing_key: itinerary.route.routing_key,
            lease_until_ms: now_ms + self.lease_ms,
            deadline_ms: crate::task::deadline::moved(
                current.deadline_ms,
                current.deliver_at_ms,
                itinerary.deliver_at_ms,
            ),
        };
        let moved = match self
            .ledger
            .reschedule(id, &change, key.as_ref(), owner, now_ms)
            .await?
        {
            Reschedule::Moved(moved) => moved,
            other => return Ok(other),
        };
        self.metrics.tasks_rescheduled.inc();
        if let Some(task) = self.reroute(&moved).await {
            self.publish_recorded(&task, message::of_task_at(&task.message(), now), now_ms)
                .await;
        }
        let after = self.ledger.get(id).await?.unwrap_or(moved);
        Ok(Reschedule::Moved(after))
    }

    /// The millisecond a delay given at `now` counts from (see
    /// [`Cascade::delay_start_ms`]): a move to a time is the delay from it,
    /// so that the task lands on that time exactly.
    pub(super) fn delay_start_ms(&self, now: &Reading) -> u64 {
        self.cascade.delay_start_ms(now.wall)
    }

    /// What the release side is built from (see `crate::release::side`),
    /// told of what arrives through `watch`.
    pub fn release_handles(
        &self,
        watch: Arc<dyn ArrivalWatch>,
        tracer: TaskTracer,
    ) -> ReleaseHandles {
        ReleaseHandles {
            broker: self.broker.clone(),
            ledger: self.ledger.clone(),
            cascade: self.cascade.clone(),
            metrics: self.metrics.clone(),
            limits: self.limits.clone(),
            staged_wake: self.staged_wake.clone(),
            watch,
            tracer,
        }
    }

    /// What the cascade's level keepers read and write.
    pub fn keeper_handles(&self, resend_after: Duration) -> KeeperHandles {
        KeeperHandles {
            broker: self.broker.clone(),
            ledger: self.ledger.clone(),
            metrics: self.metrics.clone(),
            resend_after,
        }
    }

    /// The failover resender of this replica.
    pub fn failover_resender(&self) -> FailoverResender {
        FailoverResender {
            broker: self.broker.clone(),
            ledger: self.ledger.clone(),
            cascade: self.cascade.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// The view of the chain as a whole (every shard).
    pub fn cascade(&self) -> &Arc<Cascade> {
        &self.cascade
    }

    /// Publishes again each task still `scheduled` `after` past its due
    /// time, until `shutdown`. The release stage marks every task it takes,
    /// so such a task's message never reached it: the broker lost a message
    /// it had confirmed (seen on RabbitMQ 3.10 after losing a cluster node),
    /// or someone purged a level queue. Published again by what remains
    /// (nothing: straight to the release stage), it is late, not lost; if
    /// the first copy turns up after all, the release stage drops whichever
    /// comes second. Each due time is looked at once, as it passes `after`
    /// ago, from `after` before this process started on.
    pub(super) async fn resend_unreleased(self, after: Duration, shutdown: CancellationToken) {
        let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        let mut from_ms = crate::clock::now_ms().saturating_sub(after_ms);
        let reason = format!(
            "not seen at the release stage {after_ms} ms after its due time: published again"
        );
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(RESEND_POLL) => {}
            }
            let now_ms = crate::clock::now_ms();
            let to_ms = now_ms.saturating_sub(after_ms).max(from_ms);
            let started = std::time::Instant::now();
            let looked = self
                .ledger
                .resend_unreleased((from_ms, to_ms), 0, now_ms, &reason)
                .await;
            self.metrics.observe_ledger_pass("resend", started);
            match looked {
                Ok(ids) => {
                    from_ms = to_ms;
                    if !ids.is_empty() {
                        self.metrics.tasks_resent.inc_by(ids.len() as u64);
                        warn!(
                            tasks = ids.len(),
                            // The first few, to look up.
                            task_ids = %ids[..ids.len().min(20)].join(","),
                            after_ms,
                            "tasks never reached the release stage after their due time \
                             (the broker lost their messages): published again"
                        );
                    }
                }
                Err(error) => warn!(%error, "cannot look for tasks the release stage never saw"),
            }
        }
    }

    /// Publishes pending tasks whenever the broker is ready, until `shutdown`.
    /// At start-up this resumes whatever a previous run left pending.
    pub(super) async fn forward(self, shutdown: CancellationToken) {
        loop {
            let forwarded = if self.broker.status().ready {
                self.forward_round().await
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
    async fn forward_round(&self) -> usize {
        let now_ms = crate::clock::now_ms();
        let claimed = match self
            .ledger
            .claim_due(now_ms, now_ms + self.lease_ms, FORWARD_BATCH)
            .await
        {
            Ok(claimed) => claimed,
            Err(error) => {
                warn!(%error, "cannot read pending tasks");
                return 0;
            }
        };
        let routed: Vec<(&StoredTask, Task)> = join_all(
            claimed
                .iter()
                .map(|stored| async move { Some((stored, self.reroute(stored).await?)) }),
        )
        .await
        .into_iter()
        .flatten()
        .collect();
        self.record_routes(&routed).await;
        let (alone, together): (Vec<_>, Vec<_>) =
            routed.iter().partition(|(stored, _)| stored.publish_alone);
        let together = join_all(together.iter().map(|(stored, task)| async {
            let outcome = self
                .broker
                .publish_bounded(message::of_task(&task.message()))
                .await;
            self.record_forwarded(stored, outcome).await
        }));
        let alone = async {
            let mut isolated = self.broker.isolated();
            let mut published = 0;
            for (stored, task) in &alone {
                let outcome = isolated.publish(message::of_task(&task.message())).await;
                let outcome = outcome.map(|()| Published::Confirmed);
                published += usize::from(self.record_forwarded(stored, outcome).await);
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

    /// Records the keys the forwarder's copies go with, where they are not
    /// those the ledger holds (see [`Ledger::record_routes`]). Not recorded,
    /// the copies still go: only the resend of a stranded level misses
    /// them, and the ledger's own resender does not.
    async fn record_routes(&self, routed: &[(&StoredTask, Task)]) {
        let changed: Vec<(&str, u64, &str)> = routed
            .iter()
            .filter(|(stored, task)| stored.routing_key != task.route.routing_key)
            .map(|(stored, task)| {
                let key = task.route.routing_key.as_str();
                (stored.id.as_str(), stored.revision, key)
            })
            .collect();
        if let Err(error) = self.ledger.record_routes(&changed).await {
            warn!(%error, tasks = changed.len(), "cannot record the routes of forwarded tasks; they are published anyway");
        }
    }

    /// The task of a pending row, routed by what remains of its delay; a row
    /// that cannot be rebuilt is quarantined (retrying could never help).
    async fn reroute(&self, stored: &StoredTask) -> Option<Task> {
        let now_ms = crate::clock::now_ms();
        match stored.rerouted(&self.cascade, now_ms) {
            Ok(task) => Some(task),
            Err(reason) => {
                self.quarantine(&stored.id, stored.revision, reason).await;
                None
            }
        }
    }

    /// Records how forwarding `stored` went; true when it was published.
    async fn record_forwarded(
        &self,
        stored: &StoredTask,
        outcome: Result<Published, PublishError>,
    ) -> bool {
        let attempts = stored.attempts;
        let revision = stored.revision;
        match outcome {
            Ok(Published::Confirmed) => {
                self.metrics.forwarded("published");
                self.record_published(&stored.id, revision).await;
                true
            }
            Ok(Published::Late(late)) => {
                self.metrics.forwarded("late");
                self.watch_late(&stored.id, revision, late, attempts).await;
                false
            }
            Err(error @ PublishError::TooLarge { .. }) => {
                self.metrics.forwarded("failed");
                self.quarantine(&stored.id, revision, error.to_string())
                    .await;
                false
            }
            Err(
                ref error @ PublishError::Unconfirmed {
                    refused: true,
                    ref reason,
                },
            ) if stored.publish_alone => {
                self.metrics.forwarded("failed");
                if stored.refusals + 1 >= MAX_REFUSALS {
                    let why = format!(
                        "RabbitMQ refused the task each of the {MAX_REFUSALS} times it was \
                         published alone: {reason}"
                    );
                    self.quarantine(&stored.id, revision, why).await;
                } else {
                    let again_at = republish_at(crate::clock::now_ms(), attempts);
                    self.record_failed_publish(&stored.id, revision, error, again_at, true)
                        .await;
                }
                false
            }
            Err(error) => {
                self.metrics.forwarded("failed");
                let again_at = republish_at(crate::clock::now_ms(), attempts);
                self.record_failed_publish(&stored.id, revision, &error, again_at, false)
                    .await;
                false
            }
        }
    }

    /// The broker confirmed revision `revision` of the task.
    async fn record_published(&self, id: &str, revision: u64) {
        if let Err(error) = self.ledger.mark_published(id.to_owned(), revision).await {
            // The broker owns the task; the forwarder will publish it once
            // more when the lease ends (at-least-once).
            warn!(task_id = %id, %error, "published, but not marked so in the ledger");
        }
    }

    /// Leaves the task pending for the forwarder from `again_at_ms` on.
    async fn record_failed_publish(
        &self,
        id: &str,
        revision: u64,
        error: &PublishError,
        again_at_ms: u64,
        refused: bool,
    ) {
        if error.may_have_landed() {
            self.metrics.publish_unconfirmed.inc();
        }
        let republish = Republish {
            again_at_ms,
            error: error.to_string(),
            publish_alone: error.is_suspect(),
            refused,
        };
        if let Err(error) = self
            .ledger
            .republish_later(id.to_owned(), revision, republish)
            .await
        {
            warn!(task_id = %id, %error, "the forwarder takes this task when its lease ends");
        }
    }

    /// Takes the task out of the pending ones for good: it can never be published.
    async fn quarantine(&self, id: &str, revision: u64, reason: String) {
        error!(task_id = %id, %reason, "task quarantined: it can never be published");
        self.metrics.tasks_failed.inc();
        let marked = self
            .ledger
            .mark_failed(id.to_owned(), Some(revision), reason);
        if let Err(error) = marked.await {
            warn!(task_id = %id, %error, "quarantine not recorded; retried later");
        }
    }

    /// Keeps the task leased while its late confirm is awaited in the
    /// background, then records what the broker decided.
    async fn watch_late(&self, id: &str, revision: u64, late: LateConfirm, attempts: u64) {
        self.metrics.publish_late.inc();
        let now_ms = crate::clock::now_ms();
        let waiting = PublishError::Timeout(Duration::from_millis(self.lease_ms - LEASE_MARGIN_MS));
        let lease = move |now_ms: u64| Republish {
            again_at_ms: now_ms + LATE_LEASE_MS,
            error: format!("{waiting}; awaiting the broker's late answer"),
            publish_alone: false,
            refused: false,
        };
        let leased = self
            .ledger
            .republish_later(id.to_owned(), revision, lease(now_ms));
        if let Err(error) = leased.await {
            warn!(task_id = %id, %error, "the forwarder takes this task when its lease ends");
        }
        let bookkeeper = self.clone();
        let id = id.to_owned();
        self.watchers.spawn(async move {
            let ledger = &bookkeeper.ledger;
            let outcome = late.outcome();
            tokio::pin!(outcome);
            let mut renew = tokio::time::interval(Duration::from_millis(LATE_LEASE_MS / 2));
            renew.tick().await;
            let outcome = loop {
                tokio::select! {
                    outcome = &mut outcome => break outcome,
                    _ = renew.tick() => {
                        let renewed = ledger.republish_later(
                            id.clone(),
                            revision,
                            lease(crate::clock::now_ms()),
                        );
                        if let Err(error) = renewed.await {
                            warn!(task_id = %id, %error, "cannot renew the lease of a late publish");
                        }
                    }
                }
            };
            match outcome {
                Ok(()) => {
                    debug!(task_id = %id, "late confirm: the broker has the task");
                    bookkeeper.record_published(&id, revision).await;
                }
                Err(error) => {
                    if matches!(error, PublishError::Timeout(_)) {
                        // An answer that may never come (amqp.late_confirm_limit_ms).
                        warn!(task_id = %id, %error, "no answer to a late publish; the forwarder publishes it again");
                    } else {
                        debug!(task_id = %id, %error, "late publish failed; the forwarder retries it");
                    }
                    let again_at = republish_at(crate::clock::now_ms(), attempts);
                    bookkeeper
                        .record_failed_publish(&id, revision, &error, again_at, false)
                        .await;
                }
            }
        });
    }
}

/// A failed publish is tried again later the more attempts it took.
fn republish_at(now_ms: u64, attempts: u64) -> u64 {
    now_ms + (REPUBLISH_STEP_MS * attempts).min(REPUBLISH_CAP_MS)
}

/// Ends, once a [`LEASE_WATCH_POLL`], the leases of replicas that are gone
/// (a shared ledger: see `Ledger::end_leases_of_gone_holders`), so that
/// what a crashed replica had leased goes on now, not after its lease.
pub(super) async fn end_gone_leases(ledger: Ledger, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(LEASE_WATCH_POLL) => {}
        }
        if let Err(error) = ledger.end_leases_of_gone_holders().await {
            warn!(%error, "cannot look for leases of replicas that are gone");
        }
    }
}

/// Deletes published tasks once they have been due for `retention`.
pub(super) async fn prune(
    ledger: Ledger,
    metrics: Arc<Metrics>,
    retention: Duration,
    every: Duration,
    shutdown: CancellationToken,
) {
    let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let started = std::time::Instant::now();
        let before_ms = crate::clock::now_ms().saturating_sub(retention_ms);
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
        metrics.observe_ledger_pass("prune", started);
        if pruned > 0 {
            debug!(pruned, "pruned delivered tasks from the ledger");
        }
    }
}
