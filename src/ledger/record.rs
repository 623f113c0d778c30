//! A task as the ledger stores it ([`Row`], private to the ledger) and as the
//! ledger hands it out ([`StoredTask`], in the domain's types).

use std::collections::BTreeMap;

use super::error::LedgerError;
use crate::cascade::Cascade;
use crate::clock::format_epoch_ms;
use crate::message;
use crate::message::FieldValue;
use crate::task::{Itinerary, Task, TaskAccepted, TaskParts, TaskState};

/// The columns a new row is inserted with, the first of [`Row`]'s fields in
/// their order (a test holds them to [`COLUMNS`]); the others start at
/// their defaults.
pub(super) const INSERT_COLUMNS: [&str; 26] = [
    "id",
    "idempotency_key",
    "fingerprint",
    "destination",
    "routing_key",
    "delay_ms",
    "deliver_at_ms",
    "content_type",
    "headers",
    "payload",
    "payload_bytes",
    "state",
    "created_at_ms",
    "published_at_ms",
    "next_attempt_at_ms",
    "attempts",
    "last_error",
    "client",
    "properties",
    "exchange",
    "leased_by",
    "leeway_ms",
    "release_at_ms",
    "staged_by",
    "deadline_ms",
    "expired_destination",
];

/// Declares [`Row`], one field per column of `tasks`, with [`COLUMNS`] and
/// [`Row::from_sqlite`] made from the same list, so that the three cannot
/// drift apart (sqlx reads a row by the fields' names, rusqlite by position).
macro_rules! row {
    (
        $(#[$first_meta:meta])* $first:ident: $first_ty:ty,
        $($(#[$meta:meta])* $field:ident: $ty:ty,)+
    ) => {
        /// Every column, in the order of [`Row`]'s fields.
        pub(super) const COLUMNS: &str =
            concat!(stringify!($first) $(, ", ", stringify!($field))+);

        /// One row of `tasks`. Integers are `i64` because that is what both
        /// backends store; [`Row::decode`] turns them into the domain's types.
        #[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
        pub(super) struct Row {
            $(#[$first_meta])* pub $first: $first_ty,
            $($(#[$meta])* pub $field: $ty,)+
        }

        impl Row {
            /// A row read by the writer's SQLite connection, selected as
            /// [`COLUMNS`] (in that order).
            pub(super) fn from_sqlite(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
                let mut column = 0;
                let mut next = || {
                    column += 1;
                    column - 1
                };
                Ok(Row {
                    $first: row.get(next())?,
                    $($field: row.get(next())?,)+
                })
            }
        }
    };
}

row! {
    id: String,
    idempotency_key: Option<String>,
    fingerprint: Option<String>,
    destination: String,
    routing_key: String,
    delay_ms: i64,
    deliver_at_ms: i64,
    content_type: String,
    /// A JSON object of the caller's headers.
    headers: String,
    payload: Option<Vec<u8>>,
    payload_bytes: i64,
    state: String,
    created_at_ms: i64,
    published_at_ms: Option<i64>,
    next_attempt_at_ms: i64,
    attempts: i64,
    last_error: Option<String>,
    client: Option<String>,
    /// A message taken in over AMQP: its properties, AMQP-encoded.
    properties: Option<Vec<u8>>,
    /// The exchange it is delivered to; NULL: the business exchange.
    exchange: Option<String>,
    /// The ledger handle that last leased it (migration 0019 on
    /// PostgreSQL): its leases end when that holder is gone.
    leased_by: Option<i64>,
    /// Its leeway (migration 0020 on PostgreSQL); 0: none.
    leeway_ms: i64,
    /// When a staged task is released (migration 0018).
    release_at_ms: Option<i64>,
    /// The process that staged it (its clock's name).
    staged_by: Option<String>,
    /// After when it is never published to its destination (migration
    /// 0022 on PostgreSQL); NULL: however late.
    deadline_ms: Option<i64>,
    /// Where its message goes instead once the deadline passed.
    expired_destination: Option<String>,
    publish_alone: i64,
    refusals: i64,
    revision: i64,
    delivered_at_ms: Option<i64>,
    cancelled_at_ms: Option<i64>,
    /// The limit that held it, once one did.
    held_by: Option<String>,
    /// When it expired (its deadline passed before it was published).
    expired_at_ms: Option<i64>,
}

/// A task as the ledger knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredTask {
    pub id: String,
    pub idempotency_key: Option<String>,
    pub state: TaskState,
    pub destination: String,
    /// The routing key it was first published with.
    pub routing_key: String,
    pub delay_ms: u64,
    pub deliver_at_ms: u64,
    pub created_at_ms: u64,
    pub published_at_ms: Option<u64>,
    pub content_type: String,
    pub headers: BTreeMap<String, FieldValue>,
    /// What the ledger holds of the payload: all of it while the task is
    /// pending, at most `store.payload_copy_bytes` once published.
    pub payload: Option<Vec<u8>>,
    /// The payload's size as submitted.
    pub payload_bytes: u64,
    /// Publishing attempts so far.
    pub attempts: u64,
    pub last_error: Option<String>,
    /// The API client that submitted it (`None` when the API was open).
    pub client: Option<String>,
    /// A message taken in over AMQP: its properties (see [`Task::carried`]).
    pub carried: Option<lapin::BasicProperties>,
    /// The exchange it is delivered to, when not the business exchange.
    pub exchange: Option<String>,
    /// Its leeway in milliseconds (0: none): `deliver_at_ms` is the
    /// moment drawn in it (see [`crate::task::leeway_offset_ms`]).
    pub leeway_ms: u64,
    /// It went down with its channel or connection once: it is published
    /// only alone from then on (see `crate::broker::IsolatedPublisher`).
    pub publish_alone: bool,
    /// How often the broker refused it while it was published alone.
    pub refusals: u32,
    /// 1, plus one per reschedule.
    pub revision: u64,
    /// When the business exchange confirmed it (release stage only). An
    /// unroutable task keeps the moment it was released here, which was no
    /// delivery: [`StoredTask::delivered_ms`] says so.
    pub delivered_at_ms: Option<u64>,
    pub cancelled_at_ms: Option<u64>,
    /// The release limit it waited for when it fell due (`waiting`), once
    /// one did (the column is `held_by`).
    pub waited_for: Option<String>,
    /// When the staged release lets it go (`staged`, or `releasing` from
    /// there): its due time, or later by the staging replica's clock.
    pub release_at_ms: Option<u64>,
    /// The process that staged it (its clock's name).
    pub staged_by: Option<String>,
    /// After when it is never published to its destination
    /// ([`crate::task::deadline`]).
    pub deadline_ms: Option<u64>,
    /// When it expired: its deadline passed before it was published.
    pub expired_at_ms: Option<u64>,
    /// Where its message goes instead once the deadline passed.
    pub expired_destination: Option<String>,
}

impl StoredTask {
    /// How late the delivery was: from `deliver_at` to the business
    /// exchange's confirm.
    pub fn lateness_ms(&self) -> Option<u64> {
        self.delivered_ms()
            .map(|at| at.saturating_sub(self.deliver_at_ms))
    }

    /// When it was delivered: never while unroutable (no queue took it).
    pub fn delivered_ms(&self) -> Option<u64> {
        self.delivered_at_ms
            .filter(|_| self.state != TaskState::Unroutable)
    }

    /// Whether a caller limited to `owner`'s tasks (`None`: every task) may
    /// reach this one; others' tasks are answered as if they did not exist.
    pub fn within_scope(&self, owner: Option<&str>) -> bool {
        owner.is_none_or(|owner| self.client.as_deref() == Some(owner))
    }

    /// The whole payload, which only a pending task is sure to have (and,
    /// with the release stage, a scheduled one).
    pub fn whole_payload(&self) -> Option<&[u8]> {
        self.payload
            .as_deref()
            .filter(|p| p.len() as u64 == self.payload_bytes)
    }

    /// The task of this row, routed by what remains of its delay at
    /// `now_ms` as a new task is (held, or rounded up), so it is never early;
    /// a task already due goes straight to the business exchange. The error
    /// says why the row can never be published.
    pub fn rerouted(&self, cascade: &Cascade, now_ms: u64) -> Result<Task, String> {
        let payload = self
            .whole_payload()
            .ok_or("the ledger does not hold the whole payload")?;
        let itinerary = Itinerary::resumed(
            cascade,
            &self.id,
            &self.destination,
            (self.deliver_at_ms, self.delay_ms),
            now_ms,
        )
        .map_err(|error| format!("cannot be routed: {error}"))?;
        let parts = TaskParts {
            id: self.id.clone(),
            client_id: false,
            destination: self.destination.clone(),
            payload: payload.to_vec(),
            content_type: self.content_type.clone(),
            headers: self.headers.clone().into_iter().collect(),
            revision: self.revision,
            client: self.client.clone(),
            exchange: self.exchange.clone(),
            leeway_ms: self.leeway_ms,
            deadline_ms: self.deadline_ms,
            expired_destination: self.expired_destination.clone(),
            carried: self.carried.clone(),
        };
        Ok(Task::new(parts, itinerary))
    }

    /// The task that replays this one, expired: a new task
    /// ([`crate::task::replay_id`]) with its destination, exchange, payload
    /// and headers, due at `now_ms`, without a deadline (it is asked for
    /// now, by someone who knows it is late). The error says why the row
    /// cannot be replayed.
    pub fn replayed(&self, cascade: &Cascade, now_ms: u64) -> Result<Task, String> {
        let payload = self
            .whole_payload()
            .ok_or("the ledger does not hold the whole payload")?;
        let id = crate::task::replay_id(&self.id);
        let itinerary = Itinerary::new(cascade, &id, &self.destination, Default::default(), now_ms)
            .map_err(|error| format!("cannot be routed: {error}"))?;
        let parts = TaskParts {
            id,
            client_id: true,
            destination: self.destination.clone(),
            payload: payload.to_vec(),
            content_type: self.content_type.clone(),
            headers: self.headers.clone().into_iter().collect(),
            revision: 1,
            client: self.client.clone(),
            exchange: self.exchange.clone(),
            leeway_ms: 0,
            deadline_ms: None,
            expired_destination: None,
            carried: self.carried.clone(),
        };
        Ok(Task::new(parts, itinerary))
    }

    /// The 202 answer this task got (with its current state).
    pub fn accepted(&self) -> TaskAccepted {
        TaskAccepted {
            id: self.id.clone(),
            destination: self.destination.clone(),
            routing_key: self.routing_key.clone(),
            delay_ms: self.delay_ms,
            deliver_at: format_epoch_ms(self.deliver_at_ms),
            leeway_ms: (self.leeway_ms > 0).then_some(self.leeway_ms),
            due_at: crate::task::leeway_due_at(&self.id, self.deliver_at_ms, self.leeway_ms),
            deadline: self.deadline_ms.map(format_epoch_ms),
            expired_destination: self.expired_destination.clone(),
            state: self.state,
        }
    }
}

/// The caller's headers as the ledger stores them.
fn headers_json(headers: &[(String, FieldValue)]) -> String {
    let map: BTreeMap<&str, &FieldValue> = headers.iter().map(|(k, v)| (k.as_str(), v)).collect();
    serde_json::to_string(&map).unwrap_or_else(|_| "{}".to_owned())
}

fn ms(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// A lease on a task: until when, and whose (see `super::holders`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Lease {
    pub until_ms: u64,
    pub holder: i64,
}

/// How a new task enters the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    /// Pending, leased to the caller, who publishes it into the chain.
    Publish,
    /// Staged until its moment (its `deliver_at_ms`) by the process `by`
    /// (its clock's name), never published into the chain: the ledger's
    /// staged release publishes it then. A burst's tasks the levels have no
    /// room for enter so.
    Staged { by: &'a str },
}

impl Row {
    /// A new row for `task`, entering as `entry` says: pending and leased
    /// to the request that is about to publish it (so the forwarder leaves
    /// it alone), or staged.
    pub fn new(
        task: &Task,
        (idempotency_key, fingerprint): (Option<String>, Option<String>),
        lease: Lease,
        entry: Entry<'_>,
    ) -> Row {
        let pending = Row::pending(task, idempotency_key, fingerprint, lease);
        match entry {
            Entry::Publish => pending,
            Entry::Staged { by } => Row {
                state: TaskState::Staged.as_str().to_owned(),
                next_attempt_at_ms: 0,
                leased_by: None,
                release_at_ms: Some(pending.deliver_at_ms),
                staged_by: Some(by.to_owned()),
                ..pending
            },
        }
    }

    /// Whether the row is pending (waits for the broker's confirm).
    pub fn is_pending(&self) -> bool {
        self.state == TaskState::Pending.as_str()
    }

    /// A new row for `task`: pending, and leased to the request that is about
    /// to publish it, so the forwarder leaves it alone.
    pub fn pending(
        task: &Task,
        idempotency_key: Option<String>,
        fingerprint: Option<String>,
        lease: Lease,
    ) -> Row {
        Row {
            id: task.id.clone(),
            idempotency_key,
            fingerprint,
            destination: task.destination.clone(),
            routing_key: task.route.routing_key.clone(),
            delay_ms: db_ms(task.route.delay_ms),
            deliver_at_ms: db_ms(task.deliver_at_ms),
            content_type: task.content_type.clone(),
            headers: headers_json(&task.headers),
            payload: Some(task.payload.clone()),
            payload_bytes: db_ms(task.payload.len() as u64),
            state: TaskState::Pending.as_str().to_owned(),
            created_at_ms: db_ms(task.accepted_at_ms),
            published_at_ms: None,
            next_attempt_at_ms: db_ms(lease.until_ms),
            attempts: 1,
            last_error: None,
            client: task.client.clone(),
            properties: task.carried.as_ref().map(message::encode_properties),
            exchange: task.exchange.clone(),
            leased_by: Some(lease.holder),
            leeway_ms: db_ms(task.leeway_ms),
            publish_alone: 0,
            refusals: 0,
            revision: db_ms(task.revision),
            delivered_at_ms: None,
            cancelled_at_ms: None,
            held_by: None,
            release_at_ms: None,
            staged_by: None,
            deadline_ms: task.deadline_ms.map(db_ms),
            expired_destination: task.expired_destination.clone(),
            expired_at_ms: None,
        }
    }

    /// The row in the domain's types; a row that does not decode is corrupt.
    pub fn decode(self) -> Result<StoredTask, LedgerError> {
        let corrupt = |reason: String| LedgerError::Corrupt {
            id: self.id.clone(),
            reason,
        };
        let state = TaskState::parse(&self.state)
            .ok_or_else(|| corrupt(format!("unknown state {:?}", self.state)))?;
        let headers = serde_json::from_str(&self.headers)
            .map_err(|error| corrupt(format!("headers: {error}")))?;
        let carried = match &self.properties {
            None => None,
            Some(bytes) => Some(
                message::decode_properties(bytes)
                    .ok_or_else(|| corrupt("message properties do not decode".to_owned()))?,
            ),
        };
        Ok(StoredTask {
            state,
            headers,
            carried,
            delay_ms: ms(self.delay_ms),
            deliver_at_ms: ms(self.deliver_at_ms),
            created_at_ms: ms(self.created_at_ms),
            published_at_ms: self.published_at_ms.map(ms),
            payload_bytes: ms(self.payload_bytes),
            attempts: ms(self.attempts),
            publish_alone: self.publish_alone != 0,
            refusals: u32::try_from(self.refusals).unwrap_or(u32::MAX),
            revision: ms(self.revision),
            delivered_at_ms: self.delivered_at_ms.map(ms),
            cancelled_at_ms: self.cancelled_at_ms.map(ms),
            id: self.id,
            idempotency_key: self.idempotency_key,
            destination: self.destination,
            routing_key: self.routing_key,
            content_type: self.content_type,
            payload: self.payload,
            last_error: self.last_error,
            client: self.client,
            exchange: self.exchange,
            leeway_ms: ms(self.leeway_ms),
            waited_for: self.held_by,
            release_at_ms: self.release_at_ms.map(ms),
            staged_by: self.staged_by,
            deadline_ms: self.deadline_ms.map(ms),
            expired_at_ms: self.expired_at_ms.map(ms),
            expired_destination: self.expired_destination,
        })
    }
}

/// Decodes every row, failing on the first that is corrupt.
/// Epoch milliseconds as the ledger stores them.
pub(super) fn db_ms(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

pub(super) fn decode_all(rows: Vec<Row>) -> Result<Vec<StoredTask>, LedgerError> {
    rows.into_iter().map(Row::decode).collect()
}
/// A failed publish, recorded so that the forwarder publishes the task
/// again later. ("Retry" is a consumer's retry, `crate::ingress`'s alone.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Republish {
    /// The forwarder takes the task from then on.
    pub again_at_ms: u64,
    pub error: String,
    /// From now on, publish the task only alone.
    pub publish_alone: bool,
    /// The broker refused it while it was alone: one more refusal.
    pub refused: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cascade::QueueType;

    fn cascade() -> Cascade {
        crate::cascade::for_tests(8, 100, QueueType::Quorum)
    }

    fn stored(payload: &[u8], payload_bytes: u64) -> StoredTask {
        StoredTask {
            id: "t".into(),
            idempotency_key: None,
            state: TaskState::Pending,
            destination: "d".into(),
            routing_key: "0.0.0.0.1.0.1.0.d".into(),
            delay_ms: 1000,
            deliver_at_ms: 11_000,
            created_at_ms: 10_000,
            published_at_ms: None,
            content_type: "text/plain".into(),
            headers: [("h".to_owned(), FieldValue::Int(7))].into(),
            payload: Some(payload.to_vec()),
            payload_bytes,
            attempts: 1,
            last_error: None,
            client: None,
            exchange: None,
            leeway_ms: 0,
            carried: None,
            publish_alone: false,
            refusals: 0,
            revision: 3,
            delivered_at_ms: None,
            cancelled_at_ms: None,
            waited_for: None,
            release_at_ms: None,
            staged_by: None,
            deadline_ms: None,
            expired_at_ms: None,
            expired_destination: None,
        }
    }

    #[test]
    fn a_row_is_rerouted_through_its_task_s_shard() {
        let cascade = crate::cascade::sharded_for_tests(8, 100, 4);
        for id in ["t", "u", "v", "w", "x"] {
            let row = StoredTask {
                id: id.into(),
                ..stored(b"hi", 2)
            };
            let task = row.rerouted(&cascade, 10_349).unwrap();
            let shard = cascade.in_shard(cascade.shard_of(id));
            assert_eq!(task.route.entry_exchange, shard.level_exchange(2), "{id}");
        }
    }

    #[test]
    fn rerouting_counts_what_remains_and_is_never_early() {
        let stored = stored(b"hi", 2);
        // 349 ms of the delay passed in the ledger: 651 ms remain; 7 units
        // of quorum queues keep it 690 ms at the least (a ms a hop, and 1 %
        // for a clock catching up).
        let task = stored.rerouted(&cascade(), 10_349).unwrap();
        assert_eq!(task.route.delay_ms, 690);
        assert_eq!(task.route.routing_key, "0.0.0.0.0.1.1.1.d");
        assert_eq!(
            task.granted_delay_ms(),
            1000,
            "the header keeps the granted delay"
        );
        assert_eq!(task.payload, b"hi");
        assert_eq!(task.revision, 3, "a new copy carries the ledger's revision");
        assert_eq!(task.headers, [("h".to_owned(), FieldValue::Int(7))]);
        // A moved task: its revision's delay, counted from the move.
        let moved = StoredTask {
            deliver_at_ms: 60_000,
            delay_ms: 5_000,
            ..stored.clone()
        };
        let task = moved.rerouted(&cascade(), 55_100).unwrap();
        assert_eq!(task.granted_delay_ms(), 5_000, "the move's delay");
        // 4,900 ms remain: 49 units keep it 4,848 at the least, so 50.
        assert_eq!(task.route.delay_units, 50);
        assert_eq!(task.route.delay_ms, 4_947);
        // Overdue: straight to the business exchange.
        let task = stored.rerouted(&cascade(), 11_005).unwrap();
        assert_eq!(task.route.delay_ms, 0);
        assert_eq!(task.route.entry_exchange, cascade().business_exchange());
    }

    #[test]
    fn a_row_without_its_whole_payload_is_never_published() {
        assert!(stored(b"hi", 5).rerouted(&cascade(), 10_000).is_err());
    }

    #[test]
    fn a_new_row_inserts_the_first_columns_in_the_rows_order() {
        let inserted = INSERT_COLUMNS.join(", ");
        assert!(COLUMNS.starts_with(&format!("{inserted}, ")), "{COLUMNS}");
        assert_eq!(COLUMNS.split(", ").count(), 33);
        assert!(
            INSERT_COLUMNS.contains(&"staged_by"),
            "a task may enter staged"
        );
    }
}
