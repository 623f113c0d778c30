//! The retry intake at work: each message a consumer's queue dead-lettered
//! is scheduled back to that queue after its policy's backoff (a task like
//! any other: in the ledger, through the cascade and the release stage,
//! under release limits), parked after its last attempt, or refused when no
//! policy covers its queue. Acknowledged only once what became of it is
//! committed; a crash before that takes it again (at least once: a crash
//! between the commit and the acknowledgement schedules one more retry, or
//! parks it twice).

use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::consumer::{TakeOne, refuse_to, take_windows};
use super::intake::{Refusal, retry_task};
use super::retry::{Retries, RetryPolicy, RetryRefusal, Verdict};
use crate::broker::{Inbound, Published, Settle};
use crate::cascade::Cascade;
use crate::clock::Reading;
use crate::ledger::ParkedMessage;
use crate::message::{self, Death, Message};
use crate::metrics::Metrics;
use crate::scheduler::{Broker, Idempotency, Scheduler, SubmitError};

/// Takes dead-lettered messages in until `shutdown`.
pub struct RetryRunner {
    pub retries: Arc<Retries>,
    pub cascade: Arc<Cascade>,
    pub scheduler: Scheduler,
    pub broker: Arc<dyn Broker>,
    pub metrics: Arc<Metrics>,
}

impl TakeOne for RetryRunner {
    fn take_one<'a>(&'a self, message: &'a Inbound, now: &'a Reading) -> BoxFuture<'a, Settle> {
        Box::pin(self.take(message, now))
    }
}

impl RetryRunner {
    pub async fn run(self, shutdown: CancellationToken) {
        info!(
            exchange = self.retries.exchange,
            queue = self.retries.queue,
            policies = self.retries.policies.len(),
            "taking dead-lettered messages in for retries"
        );
        take_windows(
            self.broker.as_ref(),
            self.retries.queue.clone(),
            &self.retries.exchange,
            shutdown,
            &self,
        )
        .await;
    }

    async fn take(&self, message: &Inbound, now: &Reading) -> Settle {
        let Some(death) = message::last_death(&message.properties) else {
            return self
                .refuse(message, "", RetryRefusal::NotDeadLettered)
                .await;
        };
        let Some(policy) = self.retries.policy_for(&death.queue) else {
            let refusal = RetryRefusal::NoPolicy(death.queue.clone());
            return self.refuse(message, &death.queue, refusal).await;
        };
        let failed = message::attempt(&message.properties);
        match policy.verdict(failed, rand::random::<f64>()) {
            Verdict::Retry { attempt, delay_ms } => {
                self.schedule(message, &death.queue, (attempt, delay_ms), now)
                    .await
            }
            Verdict::Park { attempts } => {
                self.park(message, &death, policy, attempts, now.wall_ms)
                    .await
            }
        }
    }

    /// Back to `queue` as `attempt` after `delay_ms`.
    async fn schedule(
        &self,
        message: &Inbound,
        queue: &str,
        (attempt, delay_ms): (u32, u64),
        now: &Reading,
    ) -> Settle {
        let carried = message::for_retry(&message.properties, queue, attempt);
        let id = uuid::Uuid::now_v7().to_string();
        let task = match retry_task(
            &self.cascade,
            id,
            queue,
            delay_ms,
            (&message.payload, carried),
            now.wall,
        ) {
            Ok(task) => task,
            Err(refusal) => return self.refuse(message, queue, refusal.into()).await,
        };
        let idempotency = Idempotency {
            key: None,
            fingerprint: None,
        };
        match self.scheduler.submit(&task, idempotency, now).await {
            Ok(_) => {
                debug!(
                    queue,
                    attempt,
                    delay_ms,
                    task = task.id,
                    "a retry scheduled"
                );
                self.metrics.retried(queue, "scheduled", 1);
                Settle::Ack
            }
            Err(SubmitError::TooLarge(error)) => {
                let refusal = Refusal::TooLarge(error.to_string());
                self.refuse(message, queue, refusal.into()).await
            }
            Err(error) => {
                debug!(queue, %error, "cannot schedule a retry now");
                Settle::Requeue
            }
        }
    }

    /// Recorded in the ledger (and, if the policy says so, published to its
    /// `park_to` queue), then acknowledged.
    async fn park(
        &self,
        message: &Inbound,
        death: &Death,
        policy: &RetryPolicy,
        attempts: u32,
        now_ms: u64,
    ) -> Settle {
        let Some(ledger) = self.scheduler.own_ledger() else {
            return Settle::Requeue;
        };
        let properties = message::as_published(&message.properties);
        let parked = ParkedMessage {
            id: uuid::Uuid::now_v7().to_string(),
            queue: death.queue.clone(),
            policy: policy.name.clone(),
            reason: death.reason.clone(),
            attempts,
            message_id: message::message_id(&properties).map(str::to_owned),
            payload: message.payload.clone(),
            properties,
            parked_at_ms: now_ms,
        };
        if let Err(error) = ledger.park(&parked).await {
            debug!(queue = death.queue, %error, "cannot park a message now");
            return Settle::Requeue;
        }
        warn!(
            queue = death.queue,
            policy = policy.name,
            attempts,
            reason = death.reason,
            parked = parked.id,
            "a message failed its last attempt: parked"
        );
        self.metrics.retried(&death.queue, "parked", 1);
        if let Some(park_to) = &policy.park_to {
            self.publish_parked(message, death, park_to, attempts).await;
        }
        Settle::Ack
    }

    /// A copy of a parked message to the policy's `park_to` queue, with why
    /// in headers. The ledger has it already: a copy the broker refuses is
    /// said in the log, not retried.
    async fn publish_parked(&self, message: &Inbound, death: &Death, park_to: &str, attempts: u32) {
        let reason = format!(
            "failed {attempts} attempts in queue {:?} (last: {})",
            death.queue, death.reason
        );
        let properties = message::set_aside(&message::republished(&message.properties));
        let copy = Message {
            exchange: String::new(),
            routing_key: park_to.to_owned(),
            payload: message.payload.clone(),
            properties: message::refused(&properties, &death.queue, ("parked", &reason), false),
        };
        match self.broker.publish_bounded(copy).await {
            Ok(Published::Confirmed) => {}
            Ok(Published::Late(_)) | Err(_) => warn!(
                queue = death.queue,
                park_to,
                "a parked message's copy was not confirmed by its park_to queue; the ledger has it"
            ),
        }
    }

    async fn refuse(&self, message: &Inbound, queue: &str, refusal: RetryRefusal) -> Settle {
        let (code, reason) = (refusal.code(), refusal.to_string());
        let queue_label = if self.retries.policy_for(queue).is_some() {
            queue
        } else {
            ""
        };
        let settle = refuse_to(
            self.broker.as_ref(),
            &self.retries.refused_queue,
            message,
            (code, &reason),
        )
        .await;
        if settle == Settle::Ack {
            warn!(
                queue,
                refused_to = self.retries.refused_queue,
                code,
                reason,
                "refused a dead-lettered message"
            );
            self.metrics.retried(queue_label, "refused", 1);
        }
        settle
    }
}

/// A retry that cannot be a task is refused with the intake's reason.
impl From<Refusal> for RetryRefusal {
    fn from(refusal: Refusal) -> RetryRefusal {
        RetryRefusal::Task {
            code: refusal.code(),
            reason: refusal.to_string(),
        }
    }
}
