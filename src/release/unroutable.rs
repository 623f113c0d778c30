//! The unroutable watch: a released message that reached no queue (none
//! bound for its routing key) is kept in the chain's unroutable queue, and
//! the broker's notice of it, in the unroutable-seen queue, marks its task
//! `unroutable` in the ledger. `delayline requeue-unroutable` sends such
//! messages on once a queue is bound.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::broker::Broker;
use crate::broker::{ConsumeLimits, Settle};
use crate::cascade::Cascade;
use crate::ledger::Ledger;
use crate::message;
use crate::metrics::Metrics;

/// Notices of unroutable tasks taken at once.
const NOTICE_WINDOW: u16 = 64;
/// After a window the ledger could not take, the wait before the next.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// What the watch reads from and writes to.
pub(crate) struct UnroutableWatch {
    pub(super) broker: Arc<dyn Broker>,
    pub(super) ledger: Ledger,
    pub(super) cascade: Arc<Cascade>,
    pub(super) metrics: Arc<Metrics>,
}

impl UnroutableWatch {
    /// Marks `unroutable` each task whose released copy reached no queue, as
    /// the notices in the chain's unroutable-seen queue say, until
    /// `shutdown`. A notice is acknowledged once the ledger has it.
    pub async fn run(self, shutdown: CancellationToken) {
        let limits = ConsumeLimits {
            window: NOTICE_WINDOW,
            windows: 1,
        };
        let mut windows = self.broker.consume(
            self.cascade.unroutable_seen_queue(),
            limits,
            shutdown.clone(),
        );
        while let Some(window) = windows.recv().await {
            let released: Vec<(String, u64)> = window
                .messages
                .iter()
                .filter_map(|message| message::identity(&message.properties))
                .collect();
            let at_ms = crate::clock::now_ms();
            let settle = match self.ledger.mark_unroutable(&released, at_ms).await {
                Ok(marked) => {
                    self.metrics.tasks_unroutable.inc_by(marked);
                    if marked > 0 {
                        warn!(
                            tasks = marked,
                            queue = self.cascade.unroutable_queue(),
                            "released tasks reached no queue (none bound for their routing key): \
                             they wait in the unroutable queue; bind one, then run \
                             delayline requeue-unroutable"
                        );
                    }
                    Settle::Ack
                }
                Err(error) => {
                    warn!(%error, "cannot mark unroutable tasks in the ledger; retrying");
                    Settle::Requeue
                }
            };
            let retry = settle == Settle::Requeue;
            let count = window.messages.len();
            window.settle(vec![settle; count]);
            if retry {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(RETRY_PAUSE) => {}
                }
            }
        }
    }
}
