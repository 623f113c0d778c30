//! Taking a task in, and everything the API asks about tasks and readiness.
//!
//! The scheduler runs in one of two modes, decided once at start-up:
//! - **with a ledger** (the default): a task is recorded as `pending` before
//!   it is published and marked `published` after the broker's confirm; a
//!   broker problem leaves it pending for the forwarder, so the client still
//!   gets its 202. See [`bookkeeper`].
//! - **stateless** (`store.url = "none"`): a task is only published, and a
//!   broker problem is the client's 503.
//!
//! With a ledger and the release stage (the default), due tasks pass
//! through [`crate::release`] on their way to the business exchange, which
//! is what lets [`Scheduler::cancel`] and [`Scheduler::reschedule`] change
//! a task until it is due; a due task a release limit matches waits in the
//! ledger for the release room's limiter (see [`crate::limit`] for the
//! rules). Which background work runs, the release side's included, is
//! said and started in one place: [`background`].
//!
//! HTTP calls the methods here ([`Scheduler::submit`],
//! [`Scheduler::readiness`], [`Scheduler::task`], [`Scheduler::tasks`],
//! [`Scheduler::cancel`], [`Scheduler::reschedule`],
//! [`Scheduler::refresh_metrics`]) and never reaches the broker or the ledger
//! itself. The broker is seen through [`Broker`].

mod answers;
mod background;
mod bookkeeper;
mod bulk;
mod bulk_worker;
mod due_counts;
mod forecast;
mod limits;
mod planner;
mod recurring;
mod settings;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::warn;

pub(crate) use answers::{
    BulkOperationError, ChangeError, Idempotency, InspectError, LimitsError, NotReady, Readiness,
    SubmitError, Submitted,
};
pub(crate) use recurring::{RecurringError, ScheduleState};
pub(crate) use settings::{ScheduleSettings, SchedulerSettings};

// What the scheduler hands out and takes, named here so that the API above
// it speaks the scheduler's words and imports nothing below it.
pub(crate) use crate::broker::PublishError;
pub(crate) use crate::ledger::{
    Cancel, ChangeKey, Cursor, HOUR_MS, LedgerError, ParkedFilter, ParkedGroup, ParkedMessage,
    ParkedQueue, Reschedule, StoredOperation, StoredSchedule, StoredTask, TaskFilter,
};
#[cfg(test)]
pub(crate) use crate::release::PublishAlone;
pub(crate) use crate::release::{Broker, LimitStatus};

use crate::broker::Published;
use crate::cascade::Cascade;
use crate::chain::{Bursts, HeadStart};
use crate::clock::Reading;
use crate::ledger::Ledger;
use crate::metrics::Metrics;
use crate::task::{Task, TaskState};
use crate::telemetry::spans::{self, Phase, TaskRef};
use crate::telemetry::{TaskTracer, TraceContext};
use bookkeeper::{Bookkeeper, Prepared};

enum Mode {
    Stateless,
    Ledger(Bookkeeper),
}

/// A cheap, cloneable handle.
#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

struct Inner {
    broker: Arc<dyn Broker>,
    mode: Mode,
    cascade: Arc<Cascade>,
    metrics: Arc<Metrics>,
    settings: SchedulerSettings,
    /// Woken by a schedule's change, so that its next occurrence is planned
    /// without waiting for the poll.
    wake_planner: tokio::sync::Notify,
    /// When this process started planning: occurrences due before it (and
    /// not made) fell due while no planner ran here.
    started_ms: u64,
    /// The ledger's last check that it can write, and when: readiness
    /// writes at most once a second, however often it is asked.
    write_checked: tokio::sync::Mutex<Option<(Instant, Result<(), String>)>>,
    /// Where the spans of tasks whose producers trace them go.
    tracer: TaskTracer,
    /// Leads for tasks that fall due together (with a ledger only: what
    /// arrives early is staged there).
    bursts: Option<Bursts>,
}

/// How long readiness reuses the ledger's last check that it can write.
const WRITE_CHECK_REUSED_FOR: Duration = Duration::from_secs(1);
/// How long a task the ledger could not write keeps the service not ready:
/// a nearly full disk takes the check's small write, and refuses the groups
/// tasks are written in. Then the check alone decides again.
const WRITE_FAILURE_REPORTED_FOR: Duration = Duration::from_secs(5);

impl Scheduler {
    /// With `ledger`, tasks are recorded before they are published;
    /// without one, they are only published.
    pub fn new(
        broker: Arc<dyn Broker>,
        ledger: Option<Ledger>,
        cascade: Arc<Cascade>,
        metrics: Arc<Metrics>,
        settings: SchedulerSettings,
        tracer: TaskTracer,
    ) -> Self {
        let bursts = ledger.as_ref().and_then(|_| Bursts::new(&cascade));
        let mode = match ledger {
            None => Mode::Stateless,
            Some(ledger) => Mode::Ledger(Bookkeeper::new(
                broker.clone(),
                ledger,
                cascade.clone(),
                metrics.clone(),
                settings.confirm_timeout,
            )),
        };
        Scheduler {
            inner: Arc::new(Inner {
                broker,
                mode,
                cascade,
                metrics,
                settings,
                wake_planner: tokio::sync::Notify::new(),
                started_ms: crate::clock::now_ms(),
                write_checked: tokio::sync::Mutex::new(None),
                bursts,
                tracer,
            }),
        }
    }

    pub fn cascade(&self) -> &Cascade {
        &self.inner.cascade
    }

    /// Where the spans of traced tasks go (the retry intake's parked
    /// messages' too).
    pub(crate) fn tracer(&self) -> &TaskTracer {
        &self.inner.tracer
    }

    /// Whether tasks are recorded: only then are idempotency keys honoured
    /// and tasks inspectable.
    pub fn has_ledger(&self) -> bool {
        matches!(self.inner.mode, Mode::Ledger(_))
    }

    /// Takes a valid task in. A task the broker could never take is refused
    /// before anything is recorded or sent.
    pub async fn submit(
        &self,
        task: &Task,
        idempotency: Idempotency,
        now: &Reading,
    ) -> Result<Submitted, SubmitError> {
        self.submit_unparking(task, idempotency, None, now).await
    }

    /// Takes in the task that replays parked message `parked_id`: the
    /// parked row goes in the transaction that records the task, so a
    /// replay is never half done (see `ingress::parked`).
    pub async fn submit_replay(
        &self,
        task: &Task,
        idempotency: Idempotency,
        parked_id: String,
        now: &Reading,
    ) -> Result<Submitted, SubmitError> {
        self.submit_unparking(task, idempotency, Some(parked_id), now)
            .await
    }

    async fn submit_unparking(
        &self,
        task: &Task,
        idempotency: Idempotency,
        unparks: Option<String>,
        now: &Reading,
    ) -> Result<Submitted, SubmitError> {
        let prepared = self.prepare(task, now)?;
        // Read only when spans are recorded: off, tracing costs this check.
        let traceparent = (self.inner.tracer.is_on())
            .then(|| crate::message::traceparent(&prepared.message.properties))
            .flatten();
        let submitted = match &self.inner.mode {
            Mode::Ledger(bookkeeper) => {
                bookkeeper
                    .submit(prepared, idempotency, unparks, now.wall_ms)
                    .await?
            }
            Mode::Stateless => {
                let Prepared { task, message, .. } = prepared;
                match self.inner.broker.publish_bounded(message).await? {
                    Published::Confirmed => {}
                    // Nobody would record a late confirm: the client retries.
                    Published::Late(_) => {
                        return Err(PublishError::Timeout(self.inner.settings.confirm_timeout))?;
                    }
                }
                Submitted {
                    accepted: task.accepted(TaskState::Scheduled),
                    replayed: false,
                }
            }
        };
        self.inner
            .metrics
            .accepted(submitted.accepted.state.as_str(), submitted.replayed);
        if !submitted.replayed {
            self.trace_accept(traceparent.as_deref(), task, &submitted, now.wall_ms);
        }
        Ok(submitted)
    }

    /// The span of `task`'s acceptance, from the request's instant to its
    /// answer, when its producer traces it.
    fn trace_accept(
        &self,
        traceparent: Option<&str>,
        task: &Task,
        submitted: &Submitted,
        from_ms: u64,
    ) {
        let Some(context) = TraceContext::sampled(traceparent) else {
            return;
        };
        let of = TaskRef {
            context,
            task_id: &task.id,
            revision: task.revision,
            destination: &task.destination,
        };
        let accepted = spans::span(&of, Phase::Accept, from_ms, crate::clock::now_ms())
            .with("delayline.state", submitted.accepted.state.as_str())
            .with("delayline.deliver_at_ms", task.deliver_at_ms.to_string());
        self.inner.tracer.record([accepted]);
    }

    /// `task` as it goes into the chain (with a head start through the levels if
    /// it is part of a burst, or staged in the ledger if the levels have no
    /// room for it) and its message, built once and checked now, before
    /// anything is recorded, then published. A task the broker could never
    /// take is refused here, staged or not.
    fn prepare<'t>(&self, task: &'t Task, now: &Reading) -> Result<Prepared<'t>, SubmitError> {
        let head_start = self
            .inner
            .bursts
            .as_ref()
            .and_then(|bursts| bursts.head_start(&self.inner.cascade, task, now.wall_ms));
        let (task, staged) = match head_start {
            None => (Cow::Borrowed(task), false),
            Some(HeadStart::Levels(ahead)) => (Cow::Owned(*ahead), false),
            Some(HeadStart::Ledger) => (Cow::Borrowed(task), true),
        };
        let message = crate::message::of_task_at(&task.message(), now);
        self.inner
            .broker
            .check_fits(&message)
            .map_err(SubmitError::TooLarge)?;
        Ok(Prepared {
            task,
            message,
            staged,
        })
    }

    /// Whether the ledger can write (a full disk, a database refusing
    /// writes: the database's words say why not): no task it could not
    /// write in the last seconds, and its own check, made at most once a
    /// second; the next check after one that failed sees a ledger that
    /// writes again.
    async fn check_write(&self, ledger: &Ledger) -> Result<(), NotReady> {
        if let Some(reason) = ledger.recent_write_failure(WRITE_FAILURE_REPORTED_FOR) {
            return Err(NotReady::LedgerCannotWrite(reason));
        }
        let mut checked = self.inner.write_checked.lock().await;
        let fresh = checked
            .as_ref()
            .filter(|(at, _)| at.elapsed() < WRITE_CHECK_REUSED_FOR);
        let outcome = match fresh {
            Some((_, outcome)) => outcome.clone(),
            None => {
                let outcome = ledger.check_write().await.map_err(|e| e.to_string());
                *checked = Some((Instant::now(), outcome.clone()));
                outcome
            }
        };
        outcome.map_err(NotReady::LedgerCannotWrite)
    }

    /// The ledger's part of readiness: it answers (within
    /// `store.health_timeout_ms`), has room and can write; the pending count.
    async fn ledger_readiness(&self, ledger: &Ledger) -> Result<u64, NotReady> {
        let checked = async {
            let pending = ledger.pending_tasks().await?;
            if ledger.is_full() {
                return Err(NotReady::LedgerFull { pending });
            }
            self.check_write(ledger).await?;
            Ok(pending)
        };
        let bounded = ledger.answered("checking readiness", async {
            Ok::<_, LedgerError>(checked.await)
        });
        bounded.await?
    }

    /// Ready means a task posted now would be accepted. Without a ledger that
    /// needs the broker (connected and provisioned); with one, the ledger must
    /// answer, have room and be able to write, and the broker may be away.
    /// Either way, a broker that has refused delayline's credentials beyond
    /// the grace is not ready: that will not pass by waiting.
    pub async fn readiness(&self) -> Result<Readiness, NotReady> {
        let status = self.inner.broker.status();
        if let Some(problem) = &status.problem
            && problem.misconfigured
            && (problem.certificate
                || problem.since.elapsed() >= self.inner.settings.misconfiguration_grace)
        {
            return Err(NotReady::Misconfigured {
                since: problem.since.elapsed(),
                reason: problem.reason.clone(),
            });
        }
        let broker_error = status.problem.as_ref().map(|p| p.reason.clone());
        let broker = match (&status.node, &status.blocked) {
            (Some(_), Some(_)) => "blocked",
            (Some(_), None) if status.ready => "connected",
            _ => "disconnected",
        };
        let pending = match &self.inner.mode {
            Mode::Stateless => {
                if !status.ready {
                    return Err(NotReady::Broker(match (&status.blocked, &broker_error) {
                        (Some(reason), _) => format!("RabbitMQ blocks publishing: {reason}"),
                        (None, Some(error)) => format!("not connected to RabbitMQ: {error}"),
                        (None, None) => "not connected to RabbitMQ, or the topology is not \
                                         provisioned yet"
                            .to_owned(),
                    }));
                }
                None
            }
            Mode::Ledger(bookkeeper) => Some(self.ledger_readiness(bookkeeper.ledger()).await?),
        };
        let stateless = pending.is_none();
        Ok(Readiness {
            status: "ready".to_owned(),
            broker: broker.to_owned(),
            node: status.node,
            blocked: status.blocked.filter(|_| !stateless),
            broker_error: broker_error.filter(|_| !stateless),
            pending,
        })
    }

    /// The service's ledger, for an operation run from the API.
    pub fn own_ledger(&self) -> Option<&Ledger> {
        self.ledger().ok()
    }

    fn ledger(&self) -> Result<&Ledger, InspectError> {
        match &self.inner.mode {
            Mode::Ledger(bookkeeper) => Ok(bookkeeper.ledger()),
            Mode::Stateless => Err(InspectError::LedgerDisabled),
        }
    }

    /// The bookkeeper, when tasks can be changed: a ledger, and a release
    /// stage that looks every due task up in it.
    fn changeable(&self) -> Result<&Bookkeeper, ChangeError> {
        match &self.inner.mode {
            Mode::Stateless => Err(ChangeError::LedgerDisabled),
            Mode::Ledger(_) if !self.inner.cascade.release_stage() => {
                Err(ChangeError::ReleaseStageOff)
            }
            Mode::Ledger(bookkeeper) => Ok(bookkeeper),
        }
    }

    /// Cancels each of `ids` that is still pending or scheduled, at once;
    /// the outcomes follow the order of `ids`. A task answered cancelled is
    /// never delivered. With `owner`, other clients' tasks are not found.
    pub async fn cancel(
        &self,
        ids: &[String],
        owner: Option<&str>,
        now_ms: u64,
    ) -> Result<Vec<Cancel>, ChangeError> {
        self.changeable()?.cancel(ids, owner, now_ms).await
    }

    /// Moves a pending or scheduled task to be due `delay` from now (rounded
    /// up to the unit), as a new revision. With `owner`, another client's
    /// task is not found.
    pub async fn reschedule(
        &self,
        id: &str,
        delay: Duration,
        key: Option<ChangeKey>,
        owner: Option<&str>,
        now: &Reading,
    ) -> Result<Reschedule, ChangeError> {
        self.changeable()?
            .reschedule(id, delay, key, owner, now)
            .await
    }

    /// Whether submitting `task` under `idempotency` would repeat a request
    /// accepted before (and so schedule nothing). Without a ledger, or
    /// without a key or client id, nothing is recognised as a repeat.
    pub async fn is_replay(
        &self,
        task: &Task,
        idempotency: &Idempotency,
    ) -> Result<bool, InspectError> {
        let (Mode::Ledger(bookkeeper), Some(fingerprint)) =
            (&self.inner.mode, &idempotency.fingerprint)
        else {
            return Ok(false);
        };
        Ok(bookkeeper
            .ledger()
            .is_replay(&task.id, idempotency.key.as_deref(), fingerprint)
            .await?)
    }

    /// One task as the ledger knows it.
    pub async fn task(&self, id: &str) -> Result<Option<StoredTask>, InspectError> {
        Ok(self.ledger()?.get(id).await?)
    }

    /// How many of `client`'s tasks are waiting to fall due at `now_ms`
    /// (for quotas).
    pub async fn waiting_tasks(&self, client: &str, now_ms: u64) -> Result<u64, InspectError> {
        Ok(self.ledger()?.waiting_tasks(client, now_ms).await?)
    }

    /// Tasks in due order (`deliver_at`, then id), a page at a time.
    pub async fn tasks(
        &self,
        filter: &TaskFilter,
        now_ms: u64,
    ) -> Result<Vec<StoredTask>, InspectError> {
        Ok(self.ledger()?.list(filter, now_ms).await?)
    }

    /// Sets the gauges whose values live elsewhere (the broker connection,
    /// the ledger's pending count), just before a scrape reads them.
    pub async fn refresh_metrics(&self) {
        let metrics = &self.inner.metrics;
        let broker = self.inner.broker.status();
        metrics.broker_connected.set(i64::from(broker.ready));
        metrics
            .broker_misconfigured
            .set(i64::from(broker.problem.is_some_and(|p| p.misconfigured)));
        // Readiness counts the pending tasks already: counted once per scrape.
        let ready = self.readiness().await;
        if let Mode::Ledger(bookkeeper) = &self.inner.mode {
            let ledger = bookkeeper.ledger();
            let pending = match &ready {
                Ok(Readiness {
                    pending: Some(pending),
                    ..
                })
                | Err(NotReady::LedgerFull { pending }) => *pending,
                // A scrape must not fail when the ledger does: that is when it matters.
                Err(NotReady::Ledger(_)) => ledger.pending_estimate(),
                _ => ledger
                    .answered("counting pending tasks", ledger.pending_tasks())
                    .await
                    .unwrap_or_else(|error| {
                        warn!(%error, "cannot count pending tasks for /metrics");
                        ledger.pending_estimate()
                    }),
            };
            metrics
                .ledger_pending
                .set(i64::try_from(pending).unwrap_or(i64::MAX));
        }
        metrics.ready.set(i64::from(ready.is_ok()));
        let cannot_write = matches!(
            ready,
            Err(NotReady::LedgerCannotWrite(_) | NotReady::Ledger(_))
        );
        metrics.ledger_writable.set(i64::from(!cannot_write));
        self.refresh_schedule_metrics().await;
    }

    /// Waits for every late confirm to be decided and recorded. Call once the
    /// broker connection is closed (which decides them all), before the
    /// ledger closes.
    pub async fn finish_watchers(&self) {
        if let Mode::Ledger(bookkeeper) = &self.inner.mode {
            bookkeeper.finish_watchers().await;
        }
    }

    /// Closes the ledger, if there is one. Call last.
    pub async fn close_ledger(&self) {
        if let Mode::Ledger(bookkeeper) = &self.inner.mode {
            bookkeeper.ledger().close().await;
        }
    }
}
