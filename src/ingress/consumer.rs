//! An ingress at work: the consumer that takes delayed messages in through
//! the scheduler, acknowledging each once its task is committed, and
//! refusing what cannot be a task with the reason.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::intake::{Refusal, Taken, take};
use super::settings::Ingress;
use crate::broker::{ConsumeLimits, Inbound, Published, Settle};
use crate::cascade::Cascade;
use crate::clock::Reading;
use crate::message;
use crate::message::Message;
use crate::metrics::{IngressLabel, Metrics};
use crate::scheduler::{Broker, Idempotency, Scheduler, SubmitError};

/// Messages taken in one window: the ledger commits them in groups.
const INGRESS_WINDOW: u16 = 256;
/// Windows out at once, as the release stage.
const INGRESS_WINDOWS: u16 = 4;
/// After a window some of whose messages went back to the queue, the wait
/// before the next, so that a ledger or broker that is away is not hammered.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

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
        let limits = ConsumeLimits {
            window: INGRESS_WINDOW,
            windows: INGRESS_WINDOWS,
        };
        let windows = self
            .broker
            .consume(self.ingress.queue.clone(), limits, shutdown.clone());
        windows
            .into_stream()
            .for_each_concurrent(usize::from(INGRESS_WINDOWS), |window| async {
                let now = crate::clock::read();
                let settles =
                    join_all(window.messages.iter().map(|m| self.take_one(m, &now))).await;
                let retried = settles.iter().filter(|s| **s == Settle::Requeue).count();
                window.settle(settles);
                if retried > 0 {
                    warn!(
                        ingress = self.ingress.exchange,
                        messages = retried,
                        "delayed messages could not be taken in now (the ledger or the broker \
                         is away, or the ledger is full): back to the ingress queue, taken again"
                    );
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = tokio::time::sleep(RETRY_PAUSE) => {}
                    }
                }
            })
            .await;
    }

    /// One message: its task committed, or it refused; else back to the queue.
    async fn take_one(&self, message: &Inbound, now: &Reading) -> Settle {
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

    /// To the refused queue, as it came (its `expiration` and `user_id` set
    /// aside in headers), with the reason; acknowledged once the broker has
    /// the copy. A copy whose headers leave no room for the reason (a
    /// message refused as too large) keeps its body and properties but not
    /// its headers, and says so.
    async fn refuse(&self, message: &Inbound, refusal: &Refusal) -> Settle {
        let properties = message::set_aside(&message.properties);
        let reason = refusal.to_string();
        let key = message.routing_key.as_str();
        let mut copy = Message {
            exchange: String::new(),
            routing_key: self.ingress.refused_queue.clone(),
            payload: message.payload.clone(),
            properties: message::refused(&properties, key, (refusal.code(), &reason), false),
        };
        if self.broker.check_fits(&copy).is_err() {
            copy.properties = message::refused(&properties, key, (refusal.code(), &reason), true);
        }
        match self.broker.publish_bounded(copy).await {
            Ok(Published::Confirmed) => {
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
                Settle::Ack
            }
            Ok(Published::Late(_)) | Err(_) => Settle::Requeue,
        }
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
