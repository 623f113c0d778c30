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
use super::policies::RetryBook;
use super::retry::{Failure, RetryPolicy, RetryRefusal, Verdict};
use crate::broker::{Inbound, Published, Settle};
use crate::cascade::Cascade;
use crate::clock::Reading;
use crate::ledger::ParkedMessage;
use crate::message::{self, Death, Message};
use crate::metrics::Metrics;
use crate::scheduler::{Broker, Idempotency, Scheduler, SubmitError};
use crate::telemetry::TraceContext;
use crate::telemetry::spans::{self, Phase, TaskRef};

/// Takes dead-lettered messages in until `shutdown`.
pub struct RetryRunner {
    pub book: Arc<RetryBook>,
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
        // The stored policies first: a message taken in before they are
        // read would be refused for want of its policy.
        while let Err(error) = self.book.refresh().await {
            warn!(%error, "cannot read the stored retry policies yet; the retry intake waits");
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(super::REFRESH_EVERY) => {}
            }
        }
        let retries = self.book.retries();
        info!(
            exchange = retries.exchange,
            queue = retries.queue,
            policies = self.book.current().in_force().len(),
            "taking dead-lettered messages in for retries"
        );
        take_windows(
            self.broker.as_ref(),
            retries.queue.clone(),
            &retries.exchange,
            shutdown,
            &self,
        )
        .await;
    }

    async fn take(&self, message: &Inbound, now: &Reading) -> Settle {
        let (death, asked) = match message::last_death(&message.properties) {
            Some(death) => (death, None),
            None => match self.asked(message, now) {
                Ok(asked) => asked,
                Err((queue, refusal)) => return self.refuse(message, &queue, refusal).await,
            },
        };
        // The policies in force as this message is taken in.
        let policies = self.book.current();
        let Some(in_force) = policies.policy_for(&death.queue) else {
            let refusal = RetryRefusal::NoPolicy(death.queue.clone());
            return self.refuse(message, &death.queue, refusal).await;
        };
        let policy = &in_force.policy;
        let first_failed = message::first_failed_ms(&message.properties).unwrap_or(now.wall_ms);
        let failure = Failure {
            failed: message::attempt(&message.properties),
            failing_for_ms: now.wall_ms.saturating_sub(first_failed),
        };
        let verdict = match asked {
            None => Ok(policy.verdict(failure, rand::random::<f64>())),
            Some(delay_ms) => policy.verdict_asked(failure, delay_ms),
        };
        let verdict = match verdict {
            Ok(verdict) => verdict,
            Err(refusal) => return self.refuse(message, &death.queue, refusal).await,
        };
        match verdict {
            Verdict::Retry { attempt, delay_ms } => {
                let wait = (delay_ms, policy.max_lateness_ms);
                self.schedule(message, &death.queue, (attempt, wait), now)
                    .await
            }
            Verdict::Park { attempts, gave_up } => {
                self.park(message, &death, policy, (attempts, gave_up), now.wall_ms)
                    .await
            }
        }
    }

    /// A message its consumer published to the retry exchange itself, with
    /// the queue it failed in and when to bring it back (see
    /// [`message::asked_retry`]): where it comes back to (as a death
    /// `asked`) and the wait asked for; the refusal, with the queue it
    /// names, when it asks for none or asks wrong.
    fn asked(
        &self,
        message: &Inbound,
        now: &Reading,
    ) -> Result<(Death, Option<u64>), (String, RetryRefusal)> {
        match message::asked_retry(&message.properties, now.wall_ms) {
            None => Err((String::new(), RetryRefusal::NotDeadLettered)),
            Some(Err(why)) => Err((String::new(), RetryRefusal::BadAsk(why))),
            Some(Ok(asked)) => {
                let death = Death {
                    queue: asked.queue,
                    reason: "asked".to_owned(),
                };
                Ok((death, Some(asked.at_ms.saturating_sub(now.wall_ms))))
            }
        }
    }

    /// Back to `queue` as `attempt` after `wait`'s delay, as late as its
    /// most lateness allows (see [`retry_task`]).
    async fn schedule(
        &self,
        message: &Inbound,
        queue: &str,
        (attempt, wait): (u32, (u64, Option<u64>)),
        now: &Reading,
    ) -> Settle {
        let first_failed = message::first_failed_ms(&message.properties).unwrap_or(now.wall_ms);
        let carried = message::for_retry(&message.properties, queue, attempt, Some(first_failed));
        let id = uuid::Uuid::now_v7().to_string();
        let task = match retry_task(
            &self.cascade,
            id,
            queue,
            wait,
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
                    delay_ms = wait.0,
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
        (attempts, gave_up): (u32, bool),
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
            first_failed_at_ms: Some(
                message::first_failed_ms(&message.properties).unwrap_or(now_ms),
            ),
        };
        if let Err(error) = ledger.park(&parked).await {
            debug!(queue = death.queue, %error, "cannot park a message now");
            return Settle::Requeue;
        }
        let why = match gave_up {
            true => "a message failed for as long as its policy's give_up_after: parked",
            false => "a message failed its last attempt: parked",
        };
        warn!(
            queue = death.queue,
            policy = policy.name,
            attempts,
            reason = death.reason,
            parked = parked.id,
            "{why}"
        );
        self.metrics.retried(&death.queue, "parked", 1);
        self.trace_park(&parked);
        if let Some(park_to) = &policy.park_to {
            self.publish_parked(message, death, park_to, attempts).await;
        }
        Settle::Ack
    }

    /// The span of a parked message whose producer traces it: from its
    /// first failure to its parking.
    fn trace_park(&self, parked: &ParkedMessage) {
        let tracer = self.scheduler.tracer();
        if !tracer.is_on() {
            return;
        }
        let traceparent = message::traceparent(&parked.properties);
        let Some(context) = TraceContext::sampled(traceparent.as_deref()) else {
            return;
        };
        let of = TaskRef {
            context,
            task_id: parked.message_id.as_deref().unwrap_or(&parked.id),
            revision: u64::from(parked.attempts),
            destination: &parked.queue,
        };
        let from_ms = parked.first_failed_at_ms.unwrap_or(parked.parked_at_ms);
        let span = spans::span(&of, Phase::Park, from_ms, parked.parked_at_ms)
            .with("delayline.parked_id", parked.id.clone())
            .with("delayline.policy", parked.policy.clone())
            .with("delayline.attempts", parked.attempts.to_string());
        tracer.record([span]);
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
        let queue_label = if self.book.current().policy_for(queue).is_some() {
            queue
        } else {
            ""
        };
        let settle = refuse_to(
            self.broker.as_ref(),
            &self.book.retries().refused_queue,
            message,
            (code, &reason),
        )
        .await;
        if settle == Settle::Ack {
            warn!(
                queue,
                refused_to = self.book.retries().refused_queue,
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
