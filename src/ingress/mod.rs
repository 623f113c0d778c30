//! AMQP ingresses: the `x-delayed-message` plugin's contract, on the cascade.
//!
//! A producer publishes to an ingress's exchange with an `x-delay` header
//! (or `x-deliver-at`), as it published to the plugin's exchange. delayline
//! consumes the ingress's queue in windows; each message becomes a task
//! ([`intake::take`], pure) that the scheduler takes in as it takes one over
//! HTTP (the ledger's group commit, then the cascade), and is acknowledged
//! only once its task is committed. When due, the release stage delivers it
//! to the ingress's `deliver_to` exchange with the routing key, body and
//! properties it came with ([`crate::message::released`]). A message the
//! ingress refuses goes to its refused queue, with the reason in headers; a
//! message that cannot be taken now (the ledger away) goes back to the queue.
//!
//! It needs the ledger and the release stage (checked with the settings):
//! the routing key and the exchange of a message are restored by the stage.

mod intake;
mod settings;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use intake::{KEYLESS_DESTINATION, Refusal, Taken, take};
pub use settings::{Ingress, IngressError, IngressSettings, plan_with};

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
        let mut copy = Message {
            exchange: String::new(),
            routing_key: self.ingress.refused_queue.clone(),
            payload: message.payload.clone(),
            properties: message::refused(&properties, refusal.code(), &reason, false),
        };
        if self.broker.check_fits(&copy).is_err() {
            copy.properties = message::refused(&properties, refusal.code(), &reason, true);
        }
        match self.broker.publish_bounded(copy).await {
            Ok(Published::Confirmed) => {
                warn!(
                    ingress = self.ingress.exchange,
                    queue = self.ingress.refused_queue,
                    message_id = ?message.properties.message_id(),
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
