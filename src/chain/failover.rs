//! The failover resender: after delayline loses its connection to a node,
//! the cascade's levels on it may have lost what they held (a quorum
//! queue's member gone with messages it had confirmed), so each task still
//! `scheduled` the stranded margin after its due time, if that falls in the
//! window the loss makes suspect (`cascade`'s `loss`), is published again
//! from the ledger. The release stage's claim makes a second copy harmless.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cascade::{Cascade, LossWindow};
use crate::ledger::Ledger;
use crate::metrics::Metrics;
use crate::release::Broker;

/// How often the connection is looked at, and the ledger asked.
const POLL: Duration = Duration::from_secs(1);

/// What the failover resender reads and writes.
pub(crate) struct FailoverResender {
    pub broker: Arc<dyn Broker>,
    pub ledger: Ledger,
    pub cascade: Arc<Cascade>,
    pub metrics: Arc<Metrics>,
}

impl FailoverResender {
    /// Publishes again, until `shutdown`, each task still `scheduled` the
    /// stranded margin after its due time if that falls in the window a
    /// failover makes suspect (see [`LossWindow`]): the resender's minute
    /// is for what the broker loses at any time, this for what it loses
    /// when a node goes. Looks every [`POLL`], which is also how
    /// long before the loss the window may begin.
    pub async fn run(self, shutdown: CancellationToken) {
        let margin_ms = self.cascade.stranded_margin_ms();
        let horizon_ms = self.cascade.watched_span_ms();
        let reason = format!(
            "not seen at the release stage {margin_ms} ms after its due time, shortly after \
             delayline lost its connection to RabbitMQ: published again"
        );
        let mut window = LossWindow::default();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(POLL) => {}
            }
            let now_ms = crate::clock::now_ms();
            let status = self.broker.status();
            let was_closed = !window.is_open();
            window.observe(now_ms, status.sessions, status.node.is_some(), horizon_ms);
            if was_closed && window.is_open() {
                info!(
                    horizon_ms,
                    margin_ms,
                    "connected again after a failover: tasks not seen at the release stage \
                     the margin after their due time are published again"
                );
            }
            let Some(span) = window.due(now_ms, margin_ms) else {
                continue;
            };
            match self
                .ledger
                .resend_unreleased(span, 0, now_ms, &reason)
                .await
            {
                Ok(ids) => {
                    window.looked(span.1);
                    if !ids.is_empty() {
                        self.metrics.tasks_resent.inc_by(ids.len() as u64);
                        warn!(
                            tasks = ids.len(),
                            task_ids = %ids[..ids.len().min(20)].join(","),
                            margin_ms,
                            "tasks not seen at the release stage after a failover: published again"
                        );
                    }
                }
                Err(error) => warn!(%error, "cannot look for tasks a failover may have lost"),
            }
        }
    }
}
