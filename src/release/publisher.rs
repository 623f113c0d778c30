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
}

impl DuePublisher {
    pub fn new(broker: Arc<dyn Broker>, cascade: Arc<Cascade>, metrics: Arc<Metrics>) -> Self {
        DuePublisher {
            broker,
            cascade,
            metrics,
            exchanges: SeenExchanges::default(),
        }
    }

    /// To the business exchange (or the exchange the task names), as it
    /// was published but for the broker's dead-lettering history, with the
    /// routing key it is delivered with ([`message::released`]); a late
    /// confirm is awaited. A task whose exchange does not exist, or
    /// returns it, is kept in the unroutable queue rather than failing
    /// again and again.
    pub(super) async fn publish(&self, message: &Inbound) -> Result<Released, PublishError> {
        let message = message::released(
            &message.routing_key,
            message.payload.clone(),
            &message.properties,
            &self.cascade,
        );
        self.publish_message(message).await
    }

    /// The message a task the ledger releases (a waiting or a staged one)
    /// is published as, built from its row at `now_ms`; the error says
    /// why it can never be.
    pub fn message_of(&self, stored: &StoredTask, now_ms: u64) -> Result<message::Message, String> {
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
    pub async fn publish_within(
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
