//! An ingress at work: the consumer that takes delayed messages in through
//! the scheduler, acknowledging each once its task is committed, and
//! refusing what cannot be a task with the reason.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::{BoxFuture, join_all};
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

/// What an intake does with each message it consumes.
pub(super) trait TakeOne: Sync {
    fn take_one<'a>(&'a self, message: &'a Inbound, now: &'a Reading) -> BoxFuture<'a, Settle>;
}

impl TakeOne for IngressRunner {
    fn take_one<'a>(&'a self, message: &'a Inbound, now: &'a Reading) -> BoxFuture<'a, Settle> {
        Box::pin(self.take(message, now))
    }
}

/// Takes `queue`'s messages in windows until `shutdown`, each settled as
/// `take` says; after a window some of whose messages went back to the
/// queue, pauses (the ledger or the broker is away: not hammered). `name`
/// names the intake in logs.
pub(super) async fn take_windows(
    broker: &dyn Broker,
    queue: String,
    name: &str,
    shutdown: CancellationToken,
    intake: &dyn TakeOne,
) {
    let limits = ConsumeLimits {
        window: INGRESS_WINDOW,
        windows: INGRESS_WINDOWS,
    };
    let windows = broker.consume(queue, limits, shutdown.clone());
    windows
        .into_stream()
        .for_each_concurrent(usize::from(INGRESS_WINDOWS), |window| {
            let shutdown = shutdown.clone();
            async move {
                let now = crate::clock::read();
                let settles =
                    join_all(window.messages.iter().map(|m| intake.take_one(m, &now))).await;
                let retried = settles.iter().filter(|s| **s == Settle::Requeue).count();
                window.settle(settles);
                if retried > 0 {
                    warn!(
                        intake = name,
                        messages = retried,
                        "messages could not be taken in now (the ledger or the broker is away, \
                         or the ledger is full): back to their queue, taken again"
                    );
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = tokio::time::sleep(RETRY_PAUSE) => {}
                    }
                }
            }
        })
        .await;
}

/// To `queue` (by the default exchange), as it came (its `expiration` and
/// `user_id` set aside in headers), with `code` and `reason`; acknowledged
/// once the broker has the copy. A copy whose headers leave no room for the
/// reason (a message refused as too large) keeps its body and properties
/// but not its headers, and says so.
pub(super) async fn refuse_to(
    broker: &dyn Broker,
    queue: &str,
    message: &Inbound,
    (code, reason): (&str, &str),
) -> Settle {
    let properties = message::set_aside(&message.properties);
    let key = message.routing_key.as_str();
    let mut copy = Message {
        exchange: String::new(),
        routing_key: queue.to_owned(),
        payload: message.payload.clone(),
        properties: message::refused(&properties, key, (code, reason), false),
    };
    if broker.check_fits(&copy).is_err() {
        copy.properties = message::refused(&properties, key, (code, reason), true);
    }
    match broker.publish_bounded(copy).await {
        Ok(Published::Confirmed) => Settle::Ack,
        Ok(Published::Late(_)) | Err(_) => Settle::Requeue,
    }
}
