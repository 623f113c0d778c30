//! What both intakes (an ingress, the retry intake) share: consuming a
//! queue in windows, each message settled as the intake says, and the
//! copy of a refused message to a refused queue with the reason.

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::{BoxFuture, join_all};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::broker::{ConsumeLimits, Inbound, Published, Settle};
use crate::clock::Reading;
use crate::message;
use crate::message::Message;
use crate::scheduler::Broker;

/// Messages taken in one window: the ledger commits them in groups.
const WINDOW: u16 = 256;
/// Windows out at once, as the release stage.
const WINDOWS_OUT: u16 = 4;
/// After a window some of whose messages went back to the queue, the wait
/// before the next, so that a ledger or broker that is away is not hammered.
const AWAY_PAUSE: Duration = Duration::from_secs(1);

/// What an intake does with each message it consumes.
pub(super) trait TakeOne: Sync {
    fn take_one<'a>(&'a self, message: &'a Inbound, now: &'a Reading) -> BoxFuture<'a, Settle>;
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
        window: WINDOW,
        windows: WINDOWS_OUT,
    };
    let windows = broker.consume(queue, limits, shutdown.clone());
    windows
        .into_stream()
        .for_each_concurrent(usize::from(WINDOWS_OUT), |window| {
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
                        () = tokio::time::sleep(AWAY_PAUSE) => {}
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
