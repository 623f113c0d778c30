//! The one publisher every release path shares: the release stage, the
//! limiter and the staged release each hand it a due task's message, and
//! it decides where that goes (the business exchange, the exchange the
//! task names, or the chain's unroutable queue when that exchange does
//! not exist or returns it) and waits for the broker's confirm.
//!
//! It holds only what publishing needs (the broker port, the chain's
//! names, the metrics, the exchanges seen to exist): the paths that use it
//! keep their own handles on the ledger and the limits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::broker::Broker;
use crate::broker::{Inbound, PublishError, Published};
use crate::cascade::Cascade;
use crate::ledger::StoredTask;
use crate::message;
use crate::metrics::Metrics;
use crate::task::deadline;
use crate::telemetry::TaskTracer;
use crate::telemetry::TraceContext;
use crate::telemetry::spans::{self, Release, ReleaseEnd, TaskRef};

/// How long an exchange other than the business exchange, once seen to
/// exist, is taken to exist without asking the broker again.
const EXCHANGE_SEEN_FOR: Duration = Duration::from_secs(30);

/// What became of a due message the release published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Released {
    /// At the exchange it is delivered to.
    Delivered,
    /// Its exchange does not exist: kept in the chain's unroutable queue,
    /// whose notice marks the task `unroutable`.
    Unroutable,
}

/// What a due task's release at its time came to.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Published to where it is delivered (or refused: it is released
    /// again).
    Published(Result<Released, PublishError>),
    /// Its deadline had passed: never published there. Its message went to
    /// the task's expired destination instead, when it names one (a failed
    /// send is released again, and expires again).
    Expired(Option<(String, Result<Released, PublishError>)>),
}

/// A publish's outcome once confirmed. A late confirm is awaited up to
/// `amqp.late_confirm_limit_ms`: its window holds a quarter of the stage, and
/// past the limit the message is requeued and released again, a possible
/// second copy rather than a stage that waits for good on an answer that may
/// never come.
async fn confirmed(published: Result<Published, PublishError>) -> Result<(), PublishError> {
    match published? {
        Published::Confirmed => Ok(()),
        Published::Late(late) => late.outcome().await,
    }
}

/// Exchanges other than the business exchange seen to exist, and when.
#[derive(Clone, Default)]
struct SeenExchanges(Arc<std::sync::Mutex<HashMap<String, Instant>>>);

impl SeenExchanges {
    fn recently(&self, exchange: &str) -> bool {
        let seen = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.get(exchange)
            .is_some_and(|at| at.elapsed() < EXCHANGE_SEEN_FOR)
    }

    fn saw(&self, exchange: &str) {
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.insert(exchange.to_owned(), Instant::now());
    }
}

/// Publishes due tasks' messages for every release path (see the module's
/// doc). Cheap to clone: its parts are shared.
#[derive(Clone)]
pub(super) struct DuePublisher {
    pub broker: Arc<dyn Broker>,
    pub cascade: Arc<Cascade>,
    pub metrics: Arc<Metrics>,
    exchanges: SeenExchanges,
    tracer: TaskTracer,
}

impl DuePublisher {
    pub fn new(broker: Arc<dyn Broker>, cascade: Arc<Cascade>, metrics: Arc<Metrics>) -> Self {
        DuePublisher {
            broker,
            cascade,
            metrics,
            exchanges: SeenExchanges::default(),
            tracer: TaskTracer::off(),
        }
    }

    /// Records the spans each release closes through `tracer`.
    pub fn traced(mut self, tracer: TaskTracer) -> Self {
        self.tracer = tracer;
        self
    }

    /// A due message of the release stage at `now_ms`: to the business
    /// exchange (or the exchange the task names), as it was published but
    /// for the broker's dead-lettering history, with the routing key it is
    /// delivered with ([`message::released`]); a late confirm is awaited. A
    /// task whose exchange does not exist, or returns it, is kept in the
    /// unroutable queue rather than failing again and again. Past the
    /// deadline its message carries, it expires instead.
    pub(super) async fn release(&self, inbound: &Inbound, now_ms: u64) -> Outcome {
        let properties = &inbound.properties;
        let released = message::released(
            &inbound.routing_key,
            inbound.payload.clone(),
            properties,
            &self.cascade,
        );
        let traced = TracedRelease::of(&self.tracer, &released, now_ms, false);
        let outcome = if deadline::passed(message::deadline_ms(properties), now_ms) {
            let to = message::expired_destination(properties);
            self.expire(released, to, now_ms, None).await
        } else {
            Outcome::Published(self.publish_message(released).await)
        };
        self.trace(traced, &outcome);
        outcome
    }

    /// Records the spans a release closes, when its task is traced.
    fn trace(&self, traced: Option<TracedRelease>, outcome: &Outcome) {
        if let Some(traced) = traced {
            self.tracer
                .record(traced.spans(outcome, crate::clock::now_ms()));
        }
    }

    /// A task the ledger releases (a waiting or a staged one) at `now_ms`,
    /// as [`DuePublisher::release`] does, given up after `limit` (a
    /// possible second copy rather than a release that waits for good).
    /// The error says why its row can never be published.
    /// `by_limit`: the limiter releases it (a release limit held it).
    pub async fn release_stored(
        &self,
        stored: &StoredTask,
        now_ms: u64,
        limit: Duration,
        by_limit: bool,
    ) -> Result<Outcome, String> {
        let message = self.message_of(stored, now_ms)?;
        let traced = TracedRelease::of(&self.tracer, &message, now_ms, by_limit);
        let outcome = if deadline::passed(stored.deadline_ms, now_ms) {
            let to = stored.expired_destination.clone();
            self.expire(message, to, now_ms, Some(limit)).await
        } else {
            Outcome::Published(self.publish_within(message, limit).await)
        };
        self.trace(traced, &outcome);
        Ok(outcome)
    }

    /// An expired task's `message`, sent to its expired destination `to`
    /// (at its exchange) if it names one, marked when it expired.
    async fn expire(
        &self,
        message: message::Message,
        to: Option<String>,
        now_ms: u64,
        limit: Option<Duration>,
    ) -> Outcome {
        let Some(destination) = to else {
            return Outcome::Expired(None);
        };
        let message = message::expired_to(message, &destination, now_ms);
        let sent = match limit {
            Some(limit) => self.publish_within(message, limit).await,
            None => self.publish_message(message).await,
        };
        Outcome::Expired(Some((destination, sent)))
    }

    /// The message a task the ledger releases (a waiting or a staged one)
    /// is published as, built from its row at `now_ms`; the error says
    /// why it can never be.
    fn message_of(&self, stored: &StoredTask, now_ms: u64) -> Result<message::Message, String> {
        let mut task = stored.rerouted(&self.cascade, now_ms)?;
        let payload = std::mem::take(&mut task.payload);
        Ok(message::released_of_task(
            &task.message(),
            payload,
            &self.cascade,
        ))
    }

    /// [`DuePublisher::publish_message`], given up after `limit` (a possible
    /// second copy rather than a release that waits for good).
    async fn publish_within(
        &self,
        message: message::Message,
        limit: Duration,
    ) -> Result<Released, PublishError> {
        tokio::time::timeout(limit, self.publish_message(message))
            .await
            .unwrap_or(Err(PublishError::Timeout(limit)))
    }

    /// [`DuePublisher::publish`], of a message built for its release.
    pub async fn publish_message(
        &self,
        message: message::Message,
    ) -> Result<Released, PublishError> {
        if !self.exchange_exists(&message.exchange).await? {
            warn!(
                task_id = message::message_id(&message.properties),
                exchange = message.exchange,
                queue = self.cascade.unroutable_queue(),
                "a due task's exchange does not exist: it waits in the unroutable queue"
            );
            return self.to_unroutable(message).await;
        }
        // The business exchange sends what it cannot route to the unroutable
        // queue itself (its alternate exchange): no copy is kept for it on
        // the hot path.
        if message.exchange == self.cascade.business_exchange() {
            self.publish_confirmed(message).await?;
            return Ok(Released::Delivered);
        }
        // Alone on its channel while in flight, so that a return its confirm
        // carries is its own (see `crate::broker`'s `returns`).
        let published = self.broker.publish_due_alone(message.clone()).await;
        match confirmed(published).await {
            // An exchange of the user's without an alternate exchange: the
            // broker returned the message (mandatory). To the unroutable
            // queue, as the business exchange's alternate exchange sends it.
            Err(PublishError::Returned(reason)) => {
                debug!(
                    exchange = message.exchange,
                    reason, "returned: to the unroutable queue"
                );
                self.to_unroutable(message).await
            }
            outcome => {
                outcome?;
                // The default exchange: a retry back to the queue it failed in.
                if message.exchange.is_empty() {
                    self.metrics.retried(&message.routing_key, "redelivered", 1);
                }
                Ok(Released::Delivered)
            }
        }
    }

    /// To the chain's unroutable exchange, whose queues keep it (and tell
    /// the ledger it is unroutable).
    async fn to_unroutable(&self, mut message: message::Message) -> Result<Released, PublishError> {
        message.exchange = self.cascade.unroutable_exchange();
        self.publish_confirmed(message).await?;
        Ok(Released::Unroutable)
    }

    /// Published and confirmed; a late confirm is awaited up to its limit.
    async fn publish_confirmed(&self, message: message::Message) -> Result<(), PublishError> {
        confirmed(self.broker.publish_due(message).await).await
    }

    /// The business exchange exists (the stage declared it); another is
    /// asked about, and remembered for a while once seen.
    async fn exchange_exists(&self, exchange: &str) -> Result<bool, PublishError> {
        // The default exchange always exists (and may not be declared, even
        // passively): a retry goes back to its queue by it.
        if exchange.is_empty()
            || exchange == self.cascade.business_exchange()
            || self.exchanges.recently(exchange)
        {
            return Ok(true);
        }
        let exists = self.broker.exchange_exists(exchange).await?;
        if exists {
            self.exchanges.saw(exchange);
        }
        Ok(exists)
    }
}

/// What a traced task's release spans need, read from its message before
/// it is published (only when spans are recorded).
struct TracedRelease {
    context: TraceContext,
    task_id: String,
    revision: u64,
    destination: String,
    delay_from_ms: u64,
    deliver_at_ms: u64,
    released_ms: u64,
    by_limit: bool,
}

impl TracedRelease {
    fn of(
        tracer: &TaskTracer,
        message: &message::Message,
        released_ms: u64,
        by_limit: bool,
    ) -> Option<TracedRelease> {
        if !tracer.is_on() {
            return None;
        }
        let properties = &message.properties;
        let context = TraceContext::sampled(message::traceparent(properties).as_deref())?;
        let deliver_at_ms = message::deliver_at_ms(properties)?;
        let delay_ms = message::delay_ms(properties).unwrap_or(0);
        Some(TracedRelease {
            context,
            task_id: message::message_id(properties)?.to_owned(),
            revision: message::revision(properties),
            destination: message.routing_key.clone(),
            delay_from_ms: deliver_at_ms.saturating_sub(delay_ms),
            deliver_at_ms,
            released_ms,
            by_limit,
        })
    }

    fn spans(&self, outcome: &Outcome, ended_ms: u64) -> Vec<spans::SpanRecord> {
        let end = match outcome {
            Outcome::Published(Ok(released)) => ReleaseEnd::Delivered {
                unroutable: *released == Released::Unroutable,
            },
            Outcome::Expired(None) | Outcome::Expired(Some((_, Ok(_)))) => ReleaseEnd::Expired,
            Outcome::Published(Err(_)) | Outcome::Expired(Some((_, Err(_)))) => ReleaseEnd::Failed,
        };
        spans::release_spans(&Release {
            task: TaskRef {
                context: self.context,
                task_id: &self.task_id,
                revision: self.revision,
                destination: &self.destination,
            },
            delay_from_ms: self.delay_from_ms,
            deliver_at_ms: self.deliver_at_ms,
            released_ms: self.released_ms,
            ended_ms,
            by_limit: self.by_limit,
            end,
        })
    }
}
