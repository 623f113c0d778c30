//! An ingress at work: the consumer that takes delayed messages in through
//! the scheduler, acknowledging each once its task is committed, and
//! refusing what cannot be a task with the reason. What it decides for one
//! message is [`super::intake`]'s (pure); the windows it consumes in are
//! [`super::consumer`]'s, shared with the retry intake.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::consumer::{TakeOne, refuse_to, take_windows};
use super::intake::{Refusal, Taken, take};
use super::settings::Ingress;
use crate::broker::{Inbound, Settle};
use crate::cascade::Cascade;
use crate::clock::Reading;
use crate::message;
use crate::metrics::{IngressLabel, Metrics};
use crate::scheduler::{Broker, Idempotency, Scheduler, SubmitError};

/// Takes one ingress's messages in until `shutdown`.
pub struct IngressRunner {
    pub ingress: Arc<Ingress>,
    pub cascade: Arc<Cascade>,
    pub scheduler: Scheduler,
    pub broker: Arc<dyn Broker>,
    pub metrics: Arc<Metrics>,
}

impl IngressRunner {
    pub async fn run(self, shutdown: CancellationToken) {
        info!(
            exchange = self.ingress.exchange,
            deliver_to = self.ingress.deliver_to,
            queue = self.ingress.queue,
            "taking delayed messages in over AMQP"
        );
        take_windows(
            self.broker.as_ref(),
            self.ingress.queue.clone(),
            &self.ingress.exchange,
            shutdown,
            &self,
        )
        .await;
    }

    /// One message: its task committed, or it refused; else back to the queue.
    async fn take(&self, message: &Inbound, now: &Reading) -> Settle {
        let taken = take(
            &self.ingress,
            &self.cascade,
            &message.routing_key,
            &message.payload,
            &message.properties,
            now.wall,
        );
        let Taken { task, fingerprint } = match taken {
            Ok(taken) => taken,
            Err(refusal) => return self.refuse(message, &refusal).await,
        };
        let idempotency = Idempotency {
            key: None,
            fingerprint,
        };
        match self.scheduler.submit(&task, idempotency, now).await {
            Ok(submitted) => {
                let outcome = if submitted.replayed {
                    "replayed"
                } else {
                    "accepted"
                };
                self.count(outcome);
                Settle::Ack
            }
            Err(SubmitError::Conflict { .. }) => {
                self.refuse(message, &Refusal::MessageIdConflict(task.id))
                    .await
            }
            Err(SubmitError::TooLarge(error)) => {
                self.refuse(message, &Refusal::TooLarge(error.to_string()))
                    .await
            }
            Err(error) => {
                // Said once per window, by `run`.
                debug!(ingress = self.ingress.exchange, %error, "cannot take a message in now");
                Settle::Requeue
            }
        }
    }

    async fn refuse(&self, message: &Inbound, refusal: &Refusal) -> Settle {
        let refused = refuse_to(
            self.broker.as_ref(),
            &self.ingress.refused_queue,
            message,
            (refusal.code(), &refusal.to_string()),
        )
        .await;
        if refused == Settle::Ack {
            warn!(
                ingress = self.ingress.exchange,
                queue = self.ingress.refused_queue,
                message_id = message::message_id(&message.properties),
                routing_key = message.routing_key,
                code = refusal.code(),
                reason = %refusal,
                "refused a delayed message"
            );
            self.count(refusal.code());
        }
        refused
    }

    fn count(&self, outcome: &'static str) {
        self.metrics
            .ingress_messages
            .get_or_create(&IngressLabel {
                ingress: self.ingress.exchange.clone(),
                outcome,
            })
            .inc();
    }
}

impl TakeOne for IngressRunner {
    fn take_one<'a>(&'a self, message: &'a Inbound, now: &'a Reading) -> BoxFuture<'a, Settle> {
        Box::pin(self.take(message, now))
    }
}
