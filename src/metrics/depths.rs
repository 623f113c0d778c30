//! The queue-depth poller: level, unroutable and retired-chain queue depths
//! into the metrics, and a stalled level noticed (and its topology declared
//! again).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::Connection;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{LevelLabel, Metrics, VersionLabel};
use crate::broker::{
    BrokerError, ManagementApi, Publisher, QueueCounts, discover_chain, queue_state,
};
use crate::cascade::Cascade;

/// Reads every level queue's depth and the unroutable queue's into
/// `metrics` every `every`, until `shutdown`: from the management API where
/// it answers (held messages included), otherwise by passive declares on the
/// publisher's connection (ready messages only). While the connection is
/// down the depths keep their last values (`broker_connected` says why, the
/// poll timestamp how old they are).
pub async fn poll_queue_depths(
    publisher: Publisher,
    cascade: Arc<Cascade>,
    metrics: Arc<Metrics>,
    every: Duration,
    management_url: String,
    shutdown: CancellationToken,
) {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut poller = DepthPoller {
        cascade,
        metrics,
        management_url,
        api: None,
        api_failed: false,
        held_since: HashMap::new(),
        redeclared_at: None,
    };
    for (level, label) in poller.labels() {
        let ttl = poller.cascade.level_ttl_ms(level) as f64 / 1000.0;
        poller
            .metrics
            .level_ttl_seconds
            .get_or_create(&label)
            .set(ttl);
    }
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = interval.tick() => {}
        }
        let (Some(connection), Some(node)) = (publisher.connection(), publisher.node_uri()) else {
            continue;
        };
        match poller.poll(&connection, &node).await {
            Ok(stalled) => {
                if stalled && poller.may_redeclare() {
                    warn!(
                        "a level has held messages longer than its TTL: declaring the topology \
                         again, in case a dead-letter exchange is missing"
                    );
                    if let Err(error) = publisher.redeclare_topology().await {
                        warn!(%error, "declaring the topology again failed");
                    }
                }
            }
            Err(error) => warn!(%error, "queue depths not polled"),
        }
    }
}

/// Whether a poll's counts tell held messages apart (the management API's
/// do; a passive declare sees ready messages only).
#[derive(Clone, Copy, PartialEq, Eq)]
enum HeldCounts {
    Known,
    Unknown,
}

/// How often a stalled level may trigger declaring the topology again.
const REDECLARE_EVERY: Duration = Duration::from_secs(60);
/// Held messages younger than this are ordinary dead-lettering in flight.
const HELD_GRACE: Duration = Duration::from_secs(10);

struct DepthPoller {
    cascade: Arc<Cascade>,
    metrics: Arc<Metrics>,
    management_url: String,
    /// The management API of the node in use, once found.
    api: Option<(String, ManagementApi)>,
    /// The last management request failed (logged once, until it answers again).
    api_failed: bool,
    /// Since when each level queue (by name: every shard has its levels)
    /// has held messages at every poll.
    held_since: HashMap<String, Instant>,
    redeclared_at: Option<Instant>,
}

impl DepthPoller {
    /// Every level of every shard, as labelled.
    fn labels(&self) -> Vec<(u32, LevelLabel)> {
        self.cascade
            .every_shard()
            .flat_map(|shard| {
                (0..shard.levels()).map(move |level| {
                    let queue = shard.level_queue(level);
                    (level, LevelLabel { level, queue })
                })
            })
            .collect()
    }

    /// One poll; true when a level has held messages longer than its TTL
    /// (and a grace for dead-lettering in flight).
    async fn poll(&mut self, connection: &Connection, node: &str) -> Result<bool, BrokerError> {
        let stalled = match self.counts_from_management(node).await {
            Some(counts) => {
                self.metrics.management_api_up.set(1);
                self.metrics.set_leaders(
                    counts
                        .iter()
                        .filter(|q| q.name != self.cascade.unroutable_queue())
                        .filter_map(|q| Some((q.name.clone(), q.leader_node()?.to_owned())))
                        .collect(),
                );
                self.record_counts(&counts, HeldCounts::Known)
            }
            None => {
                self.metrics.management_api_up.set(0);
                let counts = self.counts_from_passive_declares(connection).await?;
                self.record_counts(&counts, HeldCounts::Unknown)
            }
        };
        self.poll_retired_chains(connection).await?;
        Ok(stalled)
    }

    async fn counts_from_management(&mut self, node: &str) -> Option<Vec<QueueCounts>> {
        if self
            .api
            .as_ref()
            .is_none_or(|(for_node, _)| for_node != node)
        {
            self.api = match ManagementApi::new(node, &self.management_url) {
                Ok(api) => api.map(|api| (node.to_owned(), api)),
                Err(error) => {
                    warn!(%error, "metrics.management_url is unusable; queue depths count ready messages only");
                    None
                }
            };
        }
        let (_, api) = self.api.as_ref()?;
        let cascade = &self.cascade;
        // Every shard's: shard 0's names have no `.s<k>`.
        let chain = regex_escape(&format!("{}.v{}", cascade.prefix(), cascade.version()));
        let pattern = format!(
            "^({chain}(\\.s[0-9]+)?\\.(level[0-9]+\\.wait|release)|{})$",
            regex_escape(&cascade.unroutable_queue()),
        );
        match api.queues(&pattern).await {
            Ok(counts) => {
                if std::mem::take(&mut self.api_failed) {
                    info!(
                        api = api.base(),
                        "queue depths come from the management API again"
                    );
                }
                Some(counts)
            }
            Err(error) => {
                if !std::mem::replace(&mut self.api_failed, true) {
                    info!(%error, "the management API does not answer; queue depths count ready messages only");
                }
                None
            }
        }
    }

    /// Sets the depths and the poll's timestamp from one poll's counts,
    /// with no await between them, so that a scrape showing these depths
    /// also shows when they were read; true when a level has held messages
    /// longer than it should.
    fn record_counts(&mut self, counts: &[QueueCounts], held_counts: HeldCounts) -> bool {
        let polled_at = crate::clock::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.metrics.queue_depth_polled.set(polled_at);
        let now = Instant::now();
        let mut stalled = false;
        for (level, label) in self.labels() {
            let Some(queue) = counts.iter().find(|q| q.name == label.queue) else {
                self.forget_level(&label);
                continue;
            };
            let metrics = &self.metrics;
            metrics
                .level_messages
                .get_or_create(&label)
                .set(i64::try_from(queue.messages).unwrap_or(i64::MAX));
            if held_counts == HeldCounts::Unknown {
                // Held messages are invisible here: no series rather than a false 0.
                metrics.level_held.remove(&label);
                metrics.level_held_seconds.remove(&label);
                self.held_since.remove(&label.queue);
                continue;
            }
            let held = queue.held();
            metrics
                .level_held
                .get_or_create(&label)
                .set(i64::try_from(held).unwrap_or(i64::MAX));
            let held_for = if held > 0 {
                now - *self.held_since.entry(label.queue.clone()).or_insert(now)
            } else {
                self.held_since.remove(&label.queue);
                Duration::ZERO
            };
            metrics
                .level_held_seconds
                .get_or_create(&label)
                .set(held_for.as_secs_f64());
            let ttl = Duration::from_millis(self.cascade.level_ttl_ms(level));
            stalled |= held_for > ttl + HELD_GRACE;
        }
        let unroutable = self.cascade.unroutable_queue();
        let unroutable_counts = counts.iter().find(|q| q.name == unroutable);
        self.metrics
            .unroutable_messages
            .set(unroutable_counts.map_or(0, |q| i64::try_from(q.messages).unwrap_or(i64::MAX)));
        // Every shard's release queue together.
        let releases: Vec<String> = self
            .cascade
            .every_shard()
            .map(|s| s.release_queue())
            .collect();
        let released: u64 = counts
            .iter()
            .filter(|q| releases.contains(&q.name))
            .map(|q| q.messages)
            .sum();
        self.metrics
            .release_queue_messages
            .set(i64::try_from(released).unwrap_or(i64::MAX));
        stalled
    }

    fn forget_level(&mut self, label: &LevelLabel) {
        // Not provisioned yet, or deleted by hand: no series rather than a false 0.
        self.metrics.level_messages.remove(label);
        self.metrics.level_held.remove(label);
        self.metrics.level_held_seconds.remove(label);
        self.held_since.remove(&label.queue);
    }

    /// The depths a passive declare sees: ready messages only.
    async fn counts_from_passive_declares(
        &self,
        connection: &Connection,
    ) -> Result<Vec<QueueCounts>, BrokerError> {
        let mut queues: Vec<String> = self.labels().into_iter().map(|(_, l)| l.queue).collect();
        queues.push(self.cascade.unroutable_queue());
        if self.cascade.release_stage() {
            queues.extend(self.cascade.every_shard().map(|s| s.release_queue()));
        }
        let mut counts = Vec::with_capacity(queues.len());
        for name in queues {
            if let Some(state) = queue_state(connection, &name).await? {
                let messages = u64::from(state.messages);
                counts.push(QueueCounts {
                    name,
                    messages,
                    messages_ready: messages,
                    messages_unacknowledged: 0,
                    leader: None,
                    node: None,
                });
            }
        }
        Ok(counts)
    }

    /// An older chain left behind still delivers, but blocks its deletion and
    /// hides messages from the level metrics: make it visible.
    async fn poll_retired_chains(&self, connection: &Connection) -> Result<(), BrokerError> {
        for version in 1..self.cascade.version() {
            let label = VersionLabel { version };
            let levels = discover_chain(connection, self.cascade.prefix(), version).await?;
            if levels.is_empty() {
                self.metrics.retired_chain_messages.remove(&label);
            } else {
                let messages: u64 = levels.iter().map(|q| u64::from(q.messages)).sum();
                self.metrics
                    .retired_chain_messages
                    .get_or_create(&label)
                    .set(i64::try_from(messages).unwrap_or(i64::MAX));
            }
        }
        Ok(())
    }

    fn may_redeclare(&mut self) -> bool {
        let now = Instant::now();
        if self
            .redeclared_at
            .is_some_and(|at| now - at < REDECLARE_EVERY)
        {
            return false;
        }
        self.redeclared_at = Some(now);
        true
    }
}

/// `text` as a regular expression matching only itself (names hold letters,
/// digits, `.`, `_`, `-` and `:`, of which only `.` is special).
fn regex_escape(text: &str) -> String {
    text.replace('.', "\\.")
}
