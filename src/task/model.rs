//! A task as delayline keeps it, and the one way one is made:
//! [`Task::new`], from what its entry point decided ([`TaskParts`]) and
//! where and when it goes ([`Itinerary`]). Its route, the shard its id
//! picks and its due time are decided by [`Itinerary`] alone, for every
//! entry point: the API, the ingresses, the retries, the planner (through
//! the API's parser), a move, and a row the ledger hands back.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cascade::{Cascade, Route, RouteError};
use crate::clock::format_epoch_ms;
use crate::message::{FieldValue, TaskMessage};

/// Where and when a task goes: its route through the chain (in the shard
/// its id picks), when its delay started, and when it is due.
#[derive(Clone, Debug, PartialEq)]
pub struct Itinerary {
    pub route: Route,
    /// Epoch milliseconds the delay counts from
    /// ([`Cascade::delay_start_ms`]).
    pub accepted_at_ms: u64,
    /// `accepted_at_ms` plus the route's delay: the earliest moment of
    /// delivery.
    pub deliver_at_ms: u64,
}

impl Itinerary {
    /// Task `id` for `destination`, `delay` after `accepted_at_ms`: routed
    /// through its own shard, due when its route's delay (rounded up or
    /// held, never short) ends.
    pub fn new(
        cascade: &Cascade,
        id: &str,
        destination: &str,
        delay: Duration,
        accepted_at_ms: u64,
    ) -> Result<Itinerary, RouteError> {
        let route = cascade.route(delay, destination)?;
        let route = cascade.in_task_shard(route, id);
        Ok(Itinerary {
            deliver_at_ms: accepted_at_ms + route.delay_ms,
            accepted_at_ms,
            route,
        })
    }

    /// Task `id`, due at `deliver_at_ms` after a delay of `delay_ms`,
    /// routed again by what remains of it at `now_ms` as a new task is, so
    /// that it is never early (already due: straight on). Its due time
    /// stays; its delay still counts from when it was accepted.
    pub fn resumed(
        cascade: &Cascade,
        id: &str,
        destination: &str,
        (deliver_at_ms, delay_ms): (u64, u64),
        now_ms: u64,
    ) -> Result<Itinerary, RouteError> {
        let remaining = Duration::from_millis(deliver_at_ms.saturating_sub(now_ms));
        let route = cascade.route(remaining, destination)?;
        Ok(Itinerary {
            route: cascade.in_task_shard(route, id),
            accepted_at_ms: deliver_at_ms.saturating_sub(delay_ms),
            deliver_at_ms,
        })
    }
}

/// What an entry point decides of a task, besides where and when it goes.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskParts {
    pub id: String,
    /// The client chose the id, which then names the request for idempotency.
    pub client_id: bool,
    pub destination: String,
    pub payload: Vec<u8>,
    pub content_type: String,
    pub headers: Vec<(String, FieldValue)>,
    /// 1, plus one per reschedule.
    pub revision: u64,
    pub client: Option<String>,
    pub exchange: Option<String>,
    pub leeway_ms: u64,
    /// Epoch milliseconds after which it is never published to its
    /// destination (see [`super::deadline`]); `None`: however late.
    pub deadline_ms: Option<u64>,
    /// Where its message goes instead once its deadline passed.
    pub expired_destination: Option<String>,
    pub carried: Option<lapin::BasicProperties>,
}

/// A valid task, ready to publish. Made by [`Task::new`] alone (its one
/// private field sees to it): every entry point routes it the same way.
// `#[non_exhaustive]` would stop other crates only; the private field stops
// this crate's own rooms too.
#[allow(clippy::manual_non_exhaustive)]
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    pub id: String,
    /// The client chose the id, which then names the request for idempotency.
    pub client_id: bool,
    pub destination: String,
    pub route: Route,
    /// Epoch milliseconds at acceptance: the start of the delay
    /// ([`Cascade::delay_start_ms`]).
    pub accepted_at_ms: u64,
    /// `accepted_at_ms + route.delay_ms`: the earliest moment of delivery.
    pub deliver_at_ms: u64,
    pub payload: Vec<u8>,
    pub content_type: String,
    pub headers: Vec<(String, FieldValue)>,
    /// 1, plus one per reschedule (see [`crate::message::REVISION_HEADER`]).
    pub revision: u64,
    /// The API client that submitted it, when tokens are required.
    pub client: Option<String>,
    /// The exchange it is delivered to, when not the business exchange.
    pub exchange: Option<String>,
    /// Its leeway (0: none): `deliver_at_ms` is the moment drawn in
    /// it, [`leeway_offset_ms`] after the due time asked for.
    pub leeway_ms: u64,
    /// Epoch milliseconds after which it is never published to its
    /// destination: it expires instead ([`super::deadline`]).
    pub deadline_ms: Option<u64>,
    /// Where its message goes instead once its deadline passed (a
    /// destination at its exchange); `None`: nowhere.
    pub expired_destination: Option<String>,
    /// A message taken in over AMQP (an ingress): its properties, delivered
    /// as they came (see [`crate::message::taken_in`]). `content_type` and
    /// `headers` are then a copy, for inspection.
    pub carried: Option<lapin::BasicProperties>,
    /// Private: no task is written as a literal outside this file.
    _made: (),
}

/// Where an accepted task is:
/// - `pending`: in the ledger, not yet confirmed by the broker;
/// - `scheduled`: in the cascade (owned by the broker);
/// - `releasing`: due, taken by the release stage, being delivered: too late
///   to cancel or move;
/// - `waiting`: due, and waiting in the ledger for a release limit (`waited_for`
///   names it) until the limit lets it go; it can still be cancelled or moved;
/// - `staged`: kept in the ledger alone until its moment, when the ledger's
///   staged release delivers it: a burst's task, through the levels well
///   before its time (given a head start), or never in them (they had no room for
///   it when it was admitted); it can still be cancelled or moved;
/// - `delivered`: confirmed by the business exchange (release stage only;
///   without it a task stays `scheduled`);
/// - `unroutable`: released, but no queue was bound for its routing key: it
///   waits in the unroutable queue (release stage only);
/// - `cancelled`: withdrawn; it is never delivered;
/// - `failed`: the broker can never take it (quarantined, with the reason in
///   `last_error`);
/// - `expired`: its deadline passed before it could be published to its
///   destination; it never is (why in `last_error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    Pending,
    Scheduled,
    Releasing,
    /// Due, and held in the ledger by a release limit.
    Waiting,
    /// Not yet due, kept in the ledger alone until its moment.
    Staged,
    Delivered,
    Unroutable,
    Cancelled,
    Failed,
    Expired,
}

impl TaskState {
    pub const ALL: [TaskState; 10] = [
        TaskState::Pending,
        TaskState::Scheduled,
        TaskState::Releasing,
        TaskState::Waiting,
        TaskState::Staged,
        TaskState::Delivered,
        TaskState::Unroutable,
        TaskState::Cancelled,
        TaskState::Failed,
        TaskState::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Scheduled => "scheduled",
            TaskState::Releasing => "releasing",
            TaskState::Waiting => "waiting",
            TaskState::Staged => "staged",
            TaskState::Delivered => "delivered",
            TaskState::Unroutable => "unroutable",
            TaskState::Cancelled => "cancelled",
            TaskState::Failed => "failed",
            TaskState::Expired => "expired",
        }
    }

    /// The states a cancel or a reschedule can still change a task in, in
    /// the order the ledger tries them (pending first, to count those).
    pub const CHANGEABLE: [TaskState; 4] = [
        TaskState::Pending,
        TaskState::Scheduled,
        TaskState::Waiting,
        TaskState::Staged,
    ];

    /// Whether a cancel or a reschedule can still change the task.
    pub fn is_changeable(self) -> bool {
        Self::CHANGEABLE.contains(&self)
    }

    pub fn parse(text: &str) -> Option<TaskState> {
        Self::ALL.into_iter().find(|state| state.as_str() == text)
    }
}

/// The due time asked for of task `id`, delivered at `deliver_at_ms` in a
/// leeway of `leeway_ms`: the window's start. `None` without one.
pub fn leeway_due_at(id: &str, deliver_at_ms: u64, leeway_ms: u64) -> Option<String> {
    (leeway_ms > 0)
        .then(|| format_epoch_ms(deliver_at_ms.saturating_sub(leeway_offset_ms(id, leeway_ms))))
}

/// What a 202 answers for an accepted task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskAccepted {
    pub id: String,
    pub destination: String,
    pub routing_key: String,
    pub delay_ms: u64,
    /// When it is delivered: with a leeway, the moment drawn in it.
    pub deliver_at: String,
    /// Its leeway, when it has one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub leeway_ms: Option<u64>,
    /// With a leeway: the due time asked for, the window's start.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(format = DateTime)]
    pub due_at: Option<String>,
    /// Its deadline, when it has one: never published after it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(format = DateTime)]
    pub deadline: Option<String>,
    /// Where its message goes instead once its deadline passed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub expired_destination: Option<String>,
    pub state: TaskState,
}

impl Task {
    /// The one way a task is made (see the module's doc).
    pub fn new(parts: TaskParts, itinerary: Itinerary) -> Task {
        let TaskParts {
            id,
            client_id,
            destination,
            payload,
            content_type,
            headers,
            revision,
            client,
            exchange,
            leeway_ms,
            deadline_ms,
            expired_destination,
            carried,
        } = parts;
        Task {
            id,
            client_id,
            destination,
            route: itinerary.route,
            accepted_at_ms: itinerary.accepted_at_ms,
            deliver_at_ms: itinerary.deliver_at_ms,
            payload,
            content_type,
            headers,
            revision,
            client,
            exchange,
            leeway_ms,
            deadline_ms,
            expired_destination,
            carried,
            _made: (),
        }
    }

    /// This task with a burst's head start: `wait` units in the levels
    /// instead of its route's, in its own shard; due when it was.
    pub fn with_head_start(&self, cascade: &Cascade, wait: u64) -> Task {
        let route = cascade.with_wait(&self.route, wait, &self.destination);
        Task {
            route: cascade.in_task_shard(route, &self.id),
            ..self.clone()
        }
    }

    pub fn accepted(&self, state: TaskState) -> TaskAccepted {
        TaskAccepted {
            id: self.id.clone(),
            destination: self.destination.clone(),
            routing_key: self.route.routing_key.clone(),
            delay_ms: self.route.delay_ms,
            deliver_at: format_epoch_ms(self.deliver_at_ms),
            leeway_ms: (self.leeway_ms > 0).then_some(self.leeway_ms),
            due_at: leeway_due_at(&self.id, self.deliver_at_ms, self.leeway_ms),
            deadline: self.deadline_ms.map(format_epoch_ms),
            expired_destination: self.expired_destination.clone(),
            state,
        }
    }

    /// The delay the client was granted, whatever route the message takes now.
    pub fn granted_delay_ms(&self) -> u64 {
        self.deliver_at_ms - self.accepted_at_ms
    }

    /// What its message is made of ([`crate::message::of_task`]).
    pub fn message(&self) -> TaskMessage<'_> {
        TaskMessage {
            id: &self.id,
            route: &self.route,
            accepted_at_ms: self.accepted_at_ms,
            deliver_at_ms: self.deliver_at_ms,
            revision: self.revision,
            payload: &self.payload,
            content_type: &self.content_type,
            headers: &self.headers,
            exchange: self.exchange.as_deref(),
            deadline_ms: self.deadline_ms,
            expired_destination: self.expired_destination.as_deref(),
            carried: self.carried.as_ref(),
        }
    }
}

/// The id of the task that replays expired task `id` (see
/// `StoredTask::replayed`): one a task, so that a replay asked for twice
/// answers the first (the ledger's ids are unique), and readable where it
/// fits in an id's 255 bytes.
pub fn replay_id(id: &str) -> String {
    let readable = format!("{id}~replay");
    if readable.len() <= crate::cascade::MAX_NAME_BYTES {
        return readable;
    }
    use sha2::{Digest, Sha256};
    format!("replay~{:x}", Sha256::digest(id.as_bytes()))
}

/// Where in its leeway of `window_ms` the task `id` is delivered:
/// `[0, window_ms]` milliseconds after its due time, drawn from its id
/// (FNV-1a, stable across versions and replicas), so that the same task
/// keeps its moment when it is moved or admitted again, and many tasks
/// spread evenly over the window without knowing of each other.
pub fn leeway_offset_ms(id: &str, window_ms: u64) -> u64 {
    if window_ms == 0 {
        return 0;
    }
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash % window_ms.saturating_add(1)
}
