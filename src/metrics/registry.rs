//! The Prometheus registry: every metric delayline exports, registered
//! once, with the helpers that record into them.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `scheduled`, or `pending` when the ledger holds it for the forwarder.
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    /// The stable error code of the API answer.
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LevelLabel {
    pub level: u32,
    pub queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaderLabel {
    pub queue: String,
    /// The RabbitMQ node leading the queue.
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Release drops: `cancelled`, `stale` (an older revision of a moved task) or
    /// `duplicate`; auth refusals: `missing` or `unknown`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExpiredLabel {
    /// Where its deadline caught the task: `release` (the release stage, as
    /// its message came out of the cascade), `staged` (the staged release),
    /// `limiter` (released by a limit past it) or `waiting` (still waiting
    /// for a limit).
    pub path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassLabel {
    /// The ledger's periodic pass: `resend` (the look for tasks the release
    /// stage never saw) or `prune` (deleting rows past their retention).
    pub pass: &'static str,
}

/// A histogram of seconds from 0.5 ms to about 16 s.
fn pass_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.000_5, 2.0, 16))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabel {
    pub version: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClientLabel {
    pub client: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClientCodeLabel {
    pub client: String,
    /// `rate_limited` or `quota_exceeded`.
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IngressLabel {
    /// The ingress's exchange.
    pub ingress: String,
    /// `accepted`, `replayed` (a message id seen before), or why it was
    /// refused (`bad_delay`, `delay_too_long`, `routing_key_not_accepted`,
    /// `invalid_message_id`, `message_id_conflict`, `too_large`).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabel {
    /// The consumer's queue (one a retry policy covers; empty for a
    /// message no policy covers).
    pub queue: String,
    /// `scheduled` (back to its queue later), `redelivered` (released to
    /// its queue), `parked`, `replayed`, `discarded`, or `refused` (no
    /// policy covers its queue, or it was not dead-lettered).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    /// A consumer's queue.
    pub queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    /// The release limit's name.
    pub limit: String,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub tasks_accepted: Family<StateLabel, Counter>,
    pub tasks_replayed: Counter,
    pub tasks_rejected: Family<CodeLabel, Counter>,
    pub confirm_latency: Histogram,
    pub broker_connected: Gauge,
    pub broker_misconfigured: Gauge,
    /// 1 when `/readyz` would answer 200, as of the last scrape.
    pub ready: Gauge,
    /// 0 when the ledger's last write (or write check) failed.
    pub ledger_writable: Gauge,
    pub ledger_pending: Gauge,
    pub ledger_commit_group: Histogram,
    pub ledger_commit_seconds: Histogram,
    /// How long each of the ledger's periodic passes took, by pass: what a
    /// large ledger costs the service in the background.
    pub ledger_pass: Family<PassLabel, Histogram, fn() -> Histogram>,
    pub forwarded: Family<OutcomeLabel, Counter>,
    pub tasks_failed: Counter,
    pub tasks_resent: Counter,
    pub publish_late: Counter,
    pub publish_unconfirmed: Counter,
    pub level_messages: Family<LevelLabel, Gauge>,
    pub level_held: Family<LevelLabel, Gauge>,
    pub level_held_seconds: Family<LevelLabel, Gauge<f64, AtomicU64>>,
    pub level_ttl_seconds: Family<LevelLabel, Gauge<f64, AtomicU64>>,
    /// 1 for a level delayline found stranded (its probe overtaken) and drains itself.
    pub level_stranded: Family<LevelLabel, Gauge>,
    /// Messages delayline took off a stranded level and sent on, confirmed.
    pub level_drained: Family<LevelLabel, Counter>,
    /// This replica's level probes heard back (itself or from another replica).
    pub level_probes_back: Counter,
    /// Stranded levels handed back to the broker after the recheck interval.
    pub level_handed_back: Family<LevelLabel, Counter>,
    /// Other replicas' level probes this one took and handed on to them.
    pub level_probes_handed_on: Counter,
    pub management_api_up: Gauge,
    /// 1 for the node leading each level and release queue of every shard.
    pub queue_leader: Family<LeaderLabel, Gauge>,
    /// The same, for the API and the console: queue name to node, as the
    /// management API last said.
    pub leaders: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
    pub unroutable_messages: Gauge,
    pub retired_chain_messages: Family<VersionLabel, Gauge>,
    pub release_queue_messages: Gauge,
    pub delivery_lateness: Histogram,
    /// Due messages the release stage holds until their time (a chain that holds).
    pub release_held: Gauge,
    pub release_hold: Histogram,
    pub tasks_delivered: Counter,
    pub tasks_cancelled: Counter,
    pub tasks_rescheduled: Counter,
    pub release_dropped: Family<ReasonLabel, Counter>,
    pub tasks_expired: Family<ExpiredLabel, Counter>,
    pub release_unknown: Counter,
    pub tasks_unroutable: Counter,
    pub tasks_staged: Counter,
    pub staged_released: Counter,
    /// Seconds since the epoch of the last successful depth poll; 0 before the first.
    pub queue_depth_polled: Gauge<f64, AtomicU64>,
    pub auth_refused: Family<ReasonLabel, Counter>,
    pub client_throttled: Family<ClientCodeLabel, Counter>,
    pub client_accepted: Family<ClientLabel, Counter>,
    pub ingress_messages: Family<IngressLabel, Counter>,
    pub retry_messages: Family<RetryLabel, Counter>,
    /// Messages parked in the ledger now, by the queue they failed in.
    pub parked_messages: Family<QueueLabel, Gauge>,
    pub client_scheduled: Family<ClientLabel, Gauge>,
    pub connections_refused: Counter,
    pub request_deadline_exceeded: Counter,
    /// Schedules held, by state (`active`, `paused`, `finished`).
    pub schedules: Family<StateLabel, Gauge>,
    /// Occurrences by outcome: `created` (made a task), `caught_up` (a
    /// missed one delivered under `catch_up = latest`), `missed` (passed
    /// over), `failed` (its task could not be made).
    pub schedule_occurrences: Family<OutcomeLabel, Counter>,
    /// Due tasks waiting in the ledger, per release limit matching them.
    pub limit_waiting: Family<LimitLabel, Gauge>,
    /// Tasks the limiter released, per limit matching them.
    pub limit_released: Family<LimitLabel, Counter>,
    /// How long past its due time each task that waited for a limit was
    /// released (exported under its old name too).
    pub limit_waited: Histogram,
    /// Tasks on their way due within the next minute and hour (every
    /// replica's, from the ledger's counts, read every few seconds).
    pub tasks_due_next_minute: Gauge,
    pub tasks_due_next_hour: Gauge,
    /// The last minutes' lateness, for the console (not exported).
    pub recent_lateness: std::sync::Mutex<super::recent::RecentLateness>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Records how long one of the ledger's periodic passes took, from
    /// `started` until now.
    pub fn observe_ledger_pass(&self, pass: &'static str, started: std::time::Instant) {
        self.ledger_pass
            .get_or_create(&PassLabel { pass })
            .observe(started.elapsed().as_secs_f64());
    }

    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("delayline");
        let tasks_accepted = Family::<StateLabel, Counter>::default();
        registry.register(
            "tasks_accepted",
            "Tasks answered 202, by the state they were accepted in",
            tasks_accepted.clone(),
        );
        let tasks_replayed = Counter::default();
        registry.register(
            "tasks_replayed",
            "Repeated requests answered with the original result; nothing new was scheduled",
            tasks_replayed.clone(),
        );
        let tasks_rejected = Family::<CodeLabel, Counter>::default();
        registry.register(
            "tasks_rejected",
            "Tasks or requests not accepted, by API error code",
            tasks_rejected.clone(),
        );
        // 0.25 ms to about 8 s.
        let confirm_latency = Histogram::new(exponential_buckets(0.000_25, 2.0, 16));
        registry.register(
            "publish_confirm_seconds",
            "Time from publishing a message to the broker's confirm",
            confirm_latency.clone(),
        );
        let broker_connected = Gauge::default();
        registry.register(
            "broker_connected",
            "1 when connected to RabbitMQ with the topology provisioned and not blocked",
            broker_connected.clone(),
        );
        let broker_misconfigured = Gauge::default();
        registry.register(
            "broker_misconfigured",
            "1 while RabbitMQ refuses delayline's connection (credentials, vhost, permissions): \
             only a configuration change ends it",
            broker_misconfigured.clone(),
        );
        let ready = Gauge::default();
        registry.register(
            "ready",
            "1 when /readyz answers 200 (a task posted now would be accepted), read at each scrape",
            ready.clone(),
        );
        let ledger_writable = Gauge::default();
        registry.register(
            "ledger_writable",
            "0 when the ledger's last write, or its write check, failed (a full disk, a read-only \
             database); 1 otherwise, and without a ledger",
            ledger_writable.clone(),
        );
        let ledger_pending = Gauge::default();
        registry.register(
            "ledger_pending_tasks",
            "Tasks in the ledger not yet confirmed by the broker",
            ledger_pending.clone(),
        );
        let ledger_commit_seconds = Histogram::new(exponential_buckets(0.000_25, 2.0, 16));
        registry.register(
            "ledger_commit_seconds",
            "How long each group commit of the ledger took, from its first statement to its \
             commit (a conflict's retries included)",
            ledger_commit_seconds.clone(),
        );
        let ledger_commit_group = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        registry.register(
            "ledger_commit_group_size",
            "Ledger writes committed together in one transaction",
            ledger_commit_group.clone(),
        );
        let ledger_pass =
            Family::<PassLabel, Histogram, fn() -> Histogram>::new_with_constructor(pass_seconds);
        registry.register(
            "ledger_pass_seconds",
            "How long each of the ledger's periodic passes took, by pass (resend, prune)",
            ledger_pass.clone(),
        );
        let forwarded = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "forwarder_tasks",
            "Pending tasks the forwarder tried to publish, by outcome",
            forwarded.clone(),
        );
        let tasks_failed = Counter::default();
        registry.register(
            "tasks_failed",
            "Tasks quarantined because the broker can never take them (state failed)",
            tasks_failed.clone(),
        );
        let tasks_resent = Counter::default();
        registry.register(
            "tasks_resent",
            "Tasks published again because the release stage had not seen them store.resend_after_ms after their due time (cascade.stranded_margin_ms after it when they passed a stranded level, or fell due shortly after a failover)",
            tasks_resent.clone(),
        );
        let publish_late = Counter::default();
        registry.register(
            "publish_late",
            "Publishes not confirmed within amqp.confirm_timeout_ms, whose answer was then awaited",
            publish_late.clone(),
        );
        let publish_unconfirmed = Counter::default();
        registry.register(
            "publish_unconfirmed",
            "Tasks retried after a publish the broker may have taken without confirming it: \
             each may be delivered twice",
            publish_unconfirmed.clone(),
        );
        let level_messages = Family::<LevelLabel, Gauge>::default();
        registry.register(
            "level_queue_messages",
            "Messages in each level queue of the cascade (ready only, unless \
             management_api_up: then held ones too)",
            level_messages.clone(),
        );
        let level_held = Family::<LevelLabel, Gauge>::default();
        registry.register(
            "level_queue_held_messages",
            "Messages a level holds while its dead-letter worker waits for the next level's \
             confirm (quorum queues; read from the management API)",
            level_held.clone(),
        );
        let level_held_seconds = Family::<LevelLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "level_queue_held_seconds",
            "How long a level has held messages at every poll; alert when it exceeds the \
             level's TTL by much",
            level_held_seconds.clone(),
        );
        let level_ttl_seconds = Family::<LevelLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "level_queue_ttl_seconds",
            "How long each level holds a message: the bound held_seconds is compared with",
            level_ttl_seconds.clone(),
        );
        let queue_leader = Family::<LeaderLabel, Gauge>::default();
        registry.register(
            "queue_leader",
            "1 for the node leading each level and release queue of every shard, as the \
             management API last said (none without it): shards spread their leaders over a \
             cluster's nodes",
            queue_leader.clone(),
        );
        let level_stranded = Family::<LevelLabel, Gauge>::default();
        registry.register(
            "level_stranded",
            "1 for a level found to have stopped dead-lettering or fallen far behind (a probe \
             of a later due time came back before its own), which delayline now drains itself",
            level_stranded.clone(),
        );
        let level_drained = Family::<LevelLabel, Counter>::default();
        registry.register(
            "level_drained",
            "Messages delayline took off a stranded level and sent on to where dead-lettering \
             would have, acknowledged after the broker confirmed the copy",
            level_drained.clone(),
        );
        let level_handed_back = Family::<LevelLabel, Counter>::default();
        registry.register(
            "level_handed_back",
            "Stranded levels this replica stopped draining after cascade.stranded_recheck_ms and \
             handed back to the broker, to be probed again (a probe overtaken again takes the \
             level back)",
            level_handed_back.clone(),
        );
        let level_probes_back = Counter::default();
        registry.register(
            "level_probes_back",
            "This replica's level probes heard back: taken by its own release stage, or by \
             another replica's and handed on",
            level_probes_back.clone(),
        );
        let level_probes_handed_on = Counter::default();
        registry.register(
            "level_probes_handed_on",
            "Other replicas' level probes this replica's release stage took and handed on to \
             their senders",
            level_probes_handed_on.clone(),
        );
        let management_api_up = Gauge::default();
        registry.register(
            "management_api_up",
            "1 when queue depths come from the management API (held messages included), \
             0 when from passive declares (ready messages only)",
            management_api_up.clone(),
        );
        let unroutable_messages = Gauge::default();
        registry.register(
            "unroutable_queue_messages",
            "Messages in the unroutable queue: no queue was bound for their destination",
            unroutable_messages.clone(),
        );
        let retired_chain_messages = Family::<VersionLabel, Gauge>::default();
        registry.register(
            "retired_chain_messages",
            "Messages still waiting in an older version of the chain: run migrate-topology",
            retired_chain_messages.clone(),
        );
        let release_queue_messages = Gauge::default();
        registry.register(
            "release_queue_messages",
            "Due tasks waiting in the release queue: growing means too few replicas release, \
             or the business exchange is slow to confirm",
            release_queue_messages.clone(),
        );
        // 0.25 ms to about 65 s.
        let delivery_lateness = Histogram::new(exponential_buckets(0.000_25, 2.0, 19));
        registry.register(
            "delivery_lateness_seconds",
            "From a task's deliver_at to the business exchange's confirm of its release",
            delivery_lateness.clone(),
        );
        let release_held = Gauge::default();
        registry.register(
            "release_held",
            "Due messages the release stage holds, unacknowledged, until their time \
             (at most cascade.hold_limit)",
            release_held.clone(),
        );
        // 1 ms to about 65 s.
        let release_hold = Histogram::new(exponential_buckets(0.001, 2.0, 17));
        registry.register(
            "release_hold_seconds",
            "How long the release stage held each due message before releasing it",
            release_hold.clone(),
        );
        let tasks_delivered = Counter::default();
        registry.register(
            "tasks_delivered",
            "Tasks the release stage delivered to the business exchange (confirmed)",
            tasks_delivered.clone(),
        );
        let limit_waiting = Family::<LimitLabel, Gauge>::default();
        registry.register(
            "limit_waiting",
            "Due tasks waiting in the ledger for a release limit, per limit matching them",
            limit_waiting.clone(),
        );
        let limit_released = Family::<LimitLabel, Counter>::default();
        registry.register(
            "limit_released",
            "Tasks the limiter released, per release limit matching them",
            limit_released.clone(),
        );
        // 1 ms to about 18 h.
        let limit_waited = Histogram::new(exponential_buckets(0.001, 2.0, 27));
        registry.register(
            "limit_waited_seconds",
            "How long past its due time each task that waited for a release limit was released",
            limit_waited.clone(),
        );
        // The same histogram under its old name, for dashboards and alerts
        // that read it (CHANGELOG.md): "held" is a task held to its
        // millisecond, not one waiting for a limit.
        registry.register(
            "limit_held_seconds",
            "Deprecated: limit_waited_seconds under its old name, to be removed",
            limit_waited.clone(),
        );
        let tasks_due_next_minute = Gauge::default();
        registry.register(
            "tasks_due_next_minute",
            "Tasks on their way (not delivered, cancelled or failed) due within the next minute",
            tasks_due_next_minute.clone(),
        );
        let tasks_due_next_hour = Gauge::default();
        registry.register(
            "tasks_due_next_hour",
            "Tasks on their way (not delivered, cancelled or failed) due within the next hour",
            tasks_due_next_hour.clone(),
        );
        let tasks_cancelled = Counter::default();
        registry.register(
            "tasks_cancelled",
            "Tasks cancelled through the API; none of them is delivered",
            tasks_cancelled.clone(),
        );
        let tasks_rescheduled = Counter::default();
        registry.register(
            "tasks_rescheduled",
            "Tasks moved to another due time through the API (a new revision each)",
            tasks_rescheduled.clone(),
        );
        let release_dropped = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "release_dropped",
            "Copies the release stage dropped: of cancelled tasks, of older revisions of moved \
             tasks (stale), or of tasks already delivered (duplicate)",
            release_dropped.clone(),
        );
        let tasks_expired = Family::<ExpiredLabel, Counter>::default();
        registry.register(
            "tasks_expired",
            "Tasks whose deadline passed before they could be published to their destination: \
             never published, kept in the ledger as expired",
            tasks_expired.clone(),
        );
        let release_unknown = Counter::default();
        registry.register(
            "release_unknown",
            "Messages the release stage delivered although the ledger did not know their task \
             (pruned, or another ledger's): never dropped",
            release_unknown.clone(),
        );
        let tasks_staged = Counter::default();
        registry.register(
            "tasks_staged",
            "Tasks staged in the ledger until their moment: a burst's that reached the release \
             stage well before their time (given a head start), or that the levels had no room for as \
             they were admitted",
            tasks_staged.clone(),
        );
        let staged_released = Counter::default();
        registry.register(
            "staged_released",
            "Staged tasks the ledger's staged release published at their moment",
            staged_released.clone(),
        );
        let tasks_unroutable = Counter::default();
        registry.register(
            "tasks_unroutable",
            "Released tasks that no queue was bound for: they wait in the unroutable queue \
             (state unroutable) until requeue-unroutable",
            tasks_unroutable.clone(),
        );
        let queue_depth_polled = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "queue_depth_polled_timestamp_seconds",
            "When the queue depths were last read from the broker",
            queue_depth_polled.clone(),
        );
        let auth_refused = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "auth_refused",
            "Requests refused 401: without a token (missing) or with one nobody holds (unknown)",
            auth_refused.clone(),
        );
        let client_throttled = Family::<ClientCodeLabel, Counter>::default();
        registry.register(
            "client_throttled",
            "Requests refused 429 by client: over its rate (rate_limited) or its quota of \
             waiting tasks (quota_exceeded)",
            client_throttled.clone(),
        );
        let client_accepted = Family::<ClientLabel, Counter>::default();
        registry.register(
            "client_tasks_accepted",
            "Tasks accepted by client (replays not counted)",
            client_accepted.clone(),
        );
        let ingress_messages = Family::<IngressLabel, Counter>::default();
        registry.register(
            "ingress_messages",
            "Messages taken from an AMQP ingress, by ingress and outcome (accepted, replayed, \
             or the reason it was refused)",
            ingress_messages.clone(),
        );
        let retry_messages = Family::<RetryLabel, Counter>::default();
        registry.register(
            "retry_messages",
            "Messages of the retry policies, by queue and outcome (scheduled, redelivered, \
             parked, replayed, discarded, refused)",
            retry_messages.clone(),
        );
        let parked_messages = Family::<QueueLabel, Gauge>::default();
        registry.register(
            "parked_messages",
            "Messages the retry policies parked after their last attempt, in the ledger now (until \
             replayed or discarded), by the queue they failed in",
            parked_messages.clone(),
        );
        let client_scheduled = Family::<ClientLabel, Gauge>::default();
        registry.register(
            "client_scheduled_tasks",
            "Tasks waiting (not yet due) by client, as its quota counts them (clients with a \
             max_scheduled only)",
            client_scheduled.clone(),
        );
        let connections_refused = Counter::default();
        registry.register(
            "connections_refused",
            "Connections answered 503 too_many_connections (above http.max_connections)",
            connections_refused.clone(),
        );
        let request_deadline_exceeded = Counter::default();
        registry.register(
            "request_deadline_exceeded",
            "Requests answered 503 deadline_exceeded (not answered within http.request_timeout_ms)",
            request_deadline_exceeded.clone(),
        );
        let schedules = Family::<StateLabel, Gauge>::default();
        registry.register(
            "schedules",
            "Recurring schedules held in the ledger, by state (active, paused, finished)",
            schedules.clone(),
        );
        let schedule_occurrences = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "schedule_occurrences",
            "Occurrences of recurring schedules, by outcome: created (made a task), caught_up \
             (a missed one delivered once), missed (passed over), failed (no task could be made)",
            schedule_occurrences.clone(),
        );
        Metrics {
            schedules,
            schedule_occurrences,
            connections_refused,
            request_deadline_exceeded,
            auth_refused,
            client_throttled,
            client_accepted,
            ingress_messages,
            retry_messages,
            parked_messages,
            client_scheduled,
            registry,
            tasks_accepted,
            tasks_replayed,
            tasks_rejected,
            confirm_latency,
            broker_connected,
            broker_misconfigured,
            ready,
            ledger_writable,
            ledger_pending,
            ledger_commit_group,
            ledger_commit_seconds,
            ledger_pass,
            forwarded,
            tasks_failed,
            tasks_resent,
            publish_late,
            publish_unconfirmed,
            level_messages,
            level_held,
            level_held_seconds,
            level_ttl_seconds,
            level_stranded,
            level_drained,
            level_probes_back,
            level_probes_handed_on,
            level_handed_back,
            management_api_up,
            queue_leader,
            leaders: Default::default(),
            unroutable_messages,
            retired_chain_messages,
            release_queue_messages,
            delivery_lateness,
            release_held,
            release_hold,
            tasks_delivered,
            tasks_cancelled,
            tasks_rescheduled,
            release_dropped,
            tasks_expired,
            release_unknown,
            tasks_unroutable,
            tasks_staged,
            staged_released,
            queue_depth_polled,
            limit_waiting,
            limit_released,
            limit_waited,
            tasks_due_next_minute,
            tasks_due_next_hour,
            recent_lateness: Default::default(),
        }
    }

    pub fn accepted(&self, state: &'static str, replayed: bool) {
        if replayed {
            self.tasks_replayed.inc();
        } else {
            self.tasks_accepted
                .get_or_create(&StateLabel { state })
                .inc();
        }
    }

    /// Where each queue's leader runs, as the management API just said:
    /// a queue whose leader moved loses its old series.
    pub fn set_leaders(&self, leaders: std::collections::BTreeMap<String, String>) {
        let Ok(mut known) = self.leaders.lock() else {
            return;
        };
        for (queue, node) in known.iter() {
            if leaders.get(queue) != Some(node) {
                self.queue_leader.remove(&LeaderLabel {
                    queue: queue.clone(),
                    node: node.clone(),
                });
            }
        }
        for (queue, node) in &leaders {
            let label = LeaderLabel {
                queue: queue.clone(),
                node: node.clone(),
            };
            self.queue_leader.get_or_create(&label).set(1);
        }
        *known = leaders;
    }

    /// The node leading `queue`, as last known.
    pub fn leader_of(&self, queue: &str) -> Option<String> {
        self.leaders.lock().ok()?.get(queue).cloned()
    }

    /// A delivery `lateness_ms` after its due time, at `now_ms`.
    pub fn delivered(&self, now_ms: u64, lateness_ms: u64) {
        self.delivery_lateness.observe(lateness_ms as f64 / 1000.0);
        if let Ok(mut recent) = self.recent_lateness.lock() {
            recent.observe(now_ms, lateness_ms);
        }
    }

    /// The last minutes' deliveries and lateness, on this replica.
    pub fn recent_lateness(&self, now_ms: u64) -> Option<super::recent::LatenessSummary> {
        self.recent_lateness.lock().ok()?.summary(now_ms)
    }

    pub fn rejected(&self, code: &'static str) {
        self.tasks_rejected.get_or_create(&CodeLabel { code }).inc();
    }

    pub fn auth_refused(&self, reason: &'static str) {
        self.auth_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn client_throttled(&self, client: &str, code: &'static str) {
        self.client_throttled
            .get_or_create(&ClientCodeLabel {
                client: client.to_owned(),
                code,
            })
            .inc();
    }

    pub fn client_accepted(&self, client: &str, tasks: u64) {
        self.client_accepted
            .get_or_create(&ClientLabel {
                client: client.to_owned(),
            })
            .inc_by(tasks);
    }

    pub fn dropped_at_release(&self, reason: &'static str) {
        self.release_dropped
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// `tasks` whose deadline caught them on `path` (see [`ExpiredLabel`]).
    pub fn expired(&self, path: &'static str, tasks: u64) {
        self.tasks_expired
            .get_or_create(&ExpiredLabel { path })
            .inc_by(tasks);
    }

    pub fn forwarded(&self, outcome: &'static str) {
        self.forwarded
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

impl Metrics {
    /// Messages in level queue `queue` (level `level`) as last read; 0
    /// before the first read. For the console, which reads the registry,
    /// not the text it exports.
    pub fn level_queue_messages(&self, level: u32, queue: &str) -> u64 {
        let label = LevelLabel {
            level,
            queue: queue.to_owned(),
        };
        self.level_messages
            .get(&label)
            .map_or(0, |gauge| u64::try_from(gauge.get()).unwrap_or(0))
    }

    /// For a level this replica found stranded and drains: the messages it
    /// sent on. `None` for a level not stranded.
    pub fn stranded_level_drained(&self, level: u32, queue: &str) -> Option<u64> {
        let label = LevelLabel {
            level,
            queue: queue.to_owned(),
        };
        let stranded = self.level_stranded.get(&label).map(|gauge| gauge.get());
        (stranded == Some(1)).then(|| {
            self.level_drained
                .get(&label)
                .map_or(0, |drained| drained.get())
        })
    }

    /// The parked messages of each queue, as the ledger counts them now;
    /// a queue with none is no longer listed.
    pub fn set_parked(&self, per_queue: impl IntoIterator<Item = (String, u64)>) {
        self.parked_messages.clear();
        for (queue, parked) in per_queue {
            self.parked_messages
                .get_or_create(&QueueLabel { queue })
                .set(i64::try_from(parked).unwrap_or(i64::MAX));
        }
    }

    /// One message of a retry policy's, by queue and outcome.
    pub fn retried(&self, queue: &str, outcome: &'static str, messages: u64) {
        self.retry_messages
            .get_or_create(&RetryLabel {
                queue: queue.to_owned(),
                outcome,
            })
            .inc_by(messages);
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;

    #[test]
    fn every_family_is_exposed_with_its_prefix() {
        let metrics = Metrics::new();
        metrics.accepted("scheduled", false);
        metrics.accepted("scheduled", true);
        metrics.dropped_at_release("stale");
        metrics.delivery_lateness.observe(0.004);
        metrics.rejected("invalid_delay");
        metrics.confirm_latency.observe(0.002);
        metrics.forwarded("published");
        metrics
            .level_messages
            .get_or_create(&LevelLabel {
                level: 3,
                queue: "p.v1.level03.wait".into(),
            })
            .set(0);
        let text = metrics.encode().unwrap();
        for line in [
            "delayline_tasks_accepted_total{state=\"scheduled\"} 1",
            "delayline_release_dropped_total{reason=\"stale\"} 1",
            "delayline_delivery_lateness_seconds_count 1",
            "delayline_tasks_delivered_total 0",
            "delayline_tasks_cancelled_total 0",
            "delayline_release_queue_messages 0",
            "delayline_tasks_replayed_total 1",
            "delayline_tasks_rejected_total{code=\"invalid_delay\"} 1",
            "delayline_publish_confirm_seconds_count 1",
            "delayline_forwarder_tasks_total{outcome=\"published\"} 1",
            "delayline_level_queue_messages{level=\"3\",queue=\"p.v1.level03.wait\"} 0",
            "delayline_broker_connected 0",
            "delayline_ledger_commit_group_size_count 0",
            "delayline_unroutable_queue_messages 0",
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}

#[cfg(test)]
mod reference {
    use std::collections::BTreeMap;

    use super::*;

    /// Each metric the reference's table names (prefixed): its type and
    /// labels (`{a,b}`, in order).
    fn documented() -> BTreeMap<String, (String, String)> {
        let page = include_str!("../../docs/api.md");
        let section = page.split("## `GET /metrics`").nth(1).unwrap();
        let section = section.split("\n## ").next().unwrap();
        let mut found = BTreeMap::new();
        for line in section.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            for name in cells[1].split('`').skip(1).step_by(2) {
                let (name, labels) = name.split_once('{').unwrap_or((name, ""));
                let labels = labels.trim_end_matches('}').to_owned();
                let kind = cells[2].to_owned();
                found.insert(format!("delayline_{name}"), (kind, labels));
            }
        }
        found
    }

    /// A series in every labelled family: one with no series is not
    /// exported at all. A family added without a line here is exported
    /// only once it has one, and the reference test says which is missing.
    fn every_family_touched(metrics: &Metrics) {
        let level = || LevelLabel {
            level: 0,
            queue: "q".into(),
        };
        let (outcome, reason) = (OutcomeLabel { outcome: "x" }, ReasonLabel { reason: "x" });
        drop(
            metrics
                .tasks_accepted
                .get_or_create(&StateLabel { state: "x" }),
        );
        drop(metrics.schedules.get_or_create(&StateLabel { state: "x" }));
        drop(
            metrics
                .tasks_rejected
                .get_or_create(&CodeLabel { code: "x" }),
        );
        drop(metrics.ledger_pass.get_or_create(&PassLabel { pass: "x" }));
        drop(metrics.forwarded.get_or_create(&outcome));
        drop(metrics.schedule_occurrences.get_or_create(&outcome));
        drop(metrics.level_messages.get_or_create(&level()));
        drop(metrics.level_held.get_or_create(&level()));
        drop(metrics.level_held_seconds.get_or_create(&level()));
        drop(metrics.level_ttl_seconds.get_or_create(&level()));
        drop(metrics.level_stranded.get_or_create(&level()));
        drop(metrics.level_drained.get_or_create(&level()));
        drop(metrics.level_handed_back.get_or_create(&level()));
        let leader = LeaderLabel {
            queue: "q".into(),
            node: "n".into(),
        };
        drop(metrics.queue_leader.get_or_create(&leader));
        drop(
            metrics
                .retired_chain_messages
                .get_or_create(&VersionLabel { version: 1 }),
        );
        drop(metrics.release_dropped.get_or_create(&reason));
        drop(metrics.auth_refused.get_or_create(&reason));
        drop(
            metrics
                .tasks_expired
                .get_or_create(&ExpiredLabel { path: "x" }),
        );
        let client = || ClientLabel { client: "c".into() };
        let throttled = ClientCodeLabel {
            client: "c".into(),
            code: "x",
        };
        drop(metrics.client_throttled.get_or_create(&throttled));
        drop(metrics.client_accepted.get_or_create(&client()));
        drop(metrics.client_scheduled.get_or_create(&client()));
        let ingress = IngressLabel {
            ingress: "e".into(),
            outcome: "x",
        };
        drop(metrics.ingress_messages.get_or_create(&ingress));
        let retry = RetryLabel {
            queue: "q".into(),
            outcome: "x",
        };
        drop(metrics.retry_messages.get_or_create(&retry));
        drop(
            metrics
                .parked_messages
                .get_or_create(&QueueLabel { queue: "q".into() }),
        );
        let limit = || LimitLabel { limit: "l".into() };
        drop(metrics.limit_waiting.get_or_create(&limit()));
        drop(metrics.limit_released.get_or_create(&limit()));
    }

    /// Each metric the registry exports: its type (a counter by the name
    /// its samples have, `_total`) and its first series' labels.
    fn exported() -> BTreeMap<String, (String, String)> {
        let metrics = Metrics::new();
        every_family_touched(&metrics);
        let text = metrics.encode().unwrap();
        let mut found = BTreeMap::new();
        for rest in text.lines().filter_map(|line| line.strip_prefix("# TYPE ")) {
            let (name, kind) = rest.split_once(' ').unwrap();
            let sample = match kind {
                "counter" => format!("{name}_total"),
                "histogram" => format!("{name}_count"),
                _ => name.to_owned(),
            };
            let series = text.lines().find(|l| l.starts_with(&sample)).unwrap();
            let labels = series[sample.len()..].split(' ').next().unwrap();
            let labels: Vec<&str> = labels
                .trim_matches(|c| c == '{' || c == '}')
                .split(',')
                .filter_map(|pair| pair.split_once('=').map(|(label, _)| label))
                .collect();
            let name = if kind == "counter" {
                sample
            } else {
                name.to_owned()
            };
            found.insert(name, (kind.to_owned(), labels.join(",")));
        }
        found
    }

    /// The metrics reference cannot drift: every metric exported is
    /// documented with its type and labels, and every documented one is
    /// exported.
    #[test]
    fn the_metrics_reference_and_the_registry_agree_on_names_types_and_labels() {
        let (documented, exported) = (documented(), exported());
        let names = |map: &BTreeMap<String, (String, String)>| -> Vec<String> {
            map.keys().cloned().collect()
        };
        let undocumented: Vec<_> = names(&exported)
            .into_iter()
            .filter(|n| !documented.contains_key(n))
            .collect();
        let unexported: Vec<_> = names(&documented)
            .into_iter()
            .filter(|n| !exported.contains_key(n))
            .collect();
        assert!(
            undocumented.is_empty() && unexported.is_empty(),
            "undocumented: {undocumented:?}, documented but not exported: {unexported:?}"
        );
        assert_eq!(documented, exported);
    }

    /// Every series the alert rules' unit tests feed promtool is named and
    /// labelled as the registry exports it (Prometheus adds `instance` and
    /// `job`), a histogram's buckets at bounds it has: a rule tested on
    /// series of another shape would pass its test and never fire.
    #[test]
    fn the_alert_rules_tests_feed_series_shaped_as_exported() {
        let metrics = Metrics::new();
        every_family_touched(&metrics);
        let text = metrics.encode().unwrap();
        let tests = include_str!("../../deploy/prometheus/delayline-alerts.test.yml");
        let series = tests
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- series: "));
        let mut checked = 0;
        for series in series {
            let series = series.trim_matches('\'');
            let (name, labels) = series.split_once('{').unwrap();
            let pairs: Vec<(&str, &str)> = labels
                .trim_end_matches('}')
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .map(|(label, value)| (label, value.trim_matches('"')))
                .collect();
            let le = pairs.iter().find(|(label, _)| *label == "le");
            let ours: Vec<&str> = (pairs.iter())
                .map(|(label, _)| *label)
                .filter(|label| !["instance", "job", "le"].contains(label))
                .collect();
            let exported = text
                .lines()
                .find(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} is not exported"));
            let exported_labels: Vec<&str> = exported[name.len()..]
                .split(' ')
                .next()
                .unwrap()
                .trim_matches(|c| c == '{' || c == '}')
                .split(',')
                .filter_map(|pair| pair.split_once('=').map(|(label, _)| label))
                .filter(|label| *label != "le")
                .collect();
            assert_eq!(ours, exported_labels, "{series}");
            if let Some((_, bound)) = le {
                let bucket = format!("le=\"{bound}\"");
                let found = text
                    .lines()
                    .any(|l| l.starts_with(name) && l.contains(&bucket));
                assert!(found, "{name} has no bucket {bound}");
            }
            checked += 1;
        }
        assert!(checked >= 15, "{checked} series");
    }

    /// Prometheus's conventions: `_total` on counters and only there,
    /// seconds as the unit of time, no other unit spelt out.
    #[test]
    fn metric_names_follow_prometheus_conventions() {
        for (name, (kind, _)) in exported() {
            assert_eq!(
                kind == "counter",
                name.ends_with("_total"),
                "{name}: {kind}"
            );
            for unit in ["_ms", "_millis", "_milliseconds", "_minutes", "_hours"] {
                assert!(!name.contains(unit), "{name}: base units only");
            }
        }
    }
}
