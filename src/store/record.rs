//! A task as the ledger stores it, and the conversions to and from [`Task`].

use std::collections::BTreeMap;

use super::{StoreError, db_ms};
use crate::cascade::{Cascade, Route};
use crate::task::{HeaderValue, Task, TaskAccepted, TaskState, format_epoch_ms};

/// The columns a new row is inserted with, in the order of [`TaskRecord`]'s
/// fields; the others start at their defaults.
pub(crate) const INSERT_COLUMNS: &str = "id, idempotency_key, fingerprint, destination, \
     routing_key, delay_ms, deliver_at_ms, content_type, headers, payload, payload_bytes, state, \
     created_at_ms, published_at_ms, next_attempt_at_ms, attempts, last_error";

/// Every column, in the order of [`TaskRecord`]'s fields.
pub(crate) const COLUMNS: &str = "id, idempotency_key, fingerprint, destination, routing_key, \
     delay_ms, deliver_at_ms, content_type, headers, payload, payload_bytes, state, \
     created_at_ms, published_at_ms, next_attempt_at_ms, attempts, last_error, \
     publish_alone, refusals";

/// One row of `tasks`. Integers are `i64` because that is what both backends
/// store; the accessors give them back as the domain's types.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct TaskRecord {
    pub id: String,
    pub idempotency_key: Option<String>,
    pub fingerprint: Option<String>,
    pub destination: String,
    pub routing_key: String,
    pub delay_ms: i64,
    pub deliver_at_ms: i64,
    pub content_type: String,
    /// A JSON object of the caller's headers.
    pub headers: String,
    pub payload: Option<Vec<u8>>,
    pub payload_bytes: i64,
    pub state: String,
    pub created_at_ms: i64,
    pub published_at_ms: Option<i64>,
    pub next_attempt_at_ms: i64,
    pub attempts: i64,
    pub last_error: Option<String>,
    /// 1 once the task went down with its channel or connection: it is then
    /// only published alone (see `crate::broker::IsolatedPublisher`).
    pub publish_alone: i64,
    /// How often the broker refused it while it was published alone.
    pub refusals: i64,
}

/// The caller's headers as the ledger stores them.
fn headers_json(headers: &[(String, HeaderValue)]) -> String {
    let map: BTreeMap<&str, &HeaderValue> = headers.iter().map(|(k, v)| (k.as_str(), v)).collect();
    serde_json::to_string(&map).unwrap_or_else(|_| "{}".to_owned())
}

fn ms(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

impl TaskRecord {
    /// A new row for `task`: pending, and leased to the request that is about
    /// to publish it until `lease_until_ms`, so the forwarder leaves it alone.
    pub fn pending(
        task: &Task,
        idempotency_key: Option<String>,
        fingerprint: Option<String>,
        lease_until_ms: u64,
    ) -> TaskRecord {
        TaskRecord {
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
            next_attempt_at_ms: db_ms(lease_until_ms),
            attempts: 1,
            last_error: None,
            publish_alone: 0,
            refusals: 0,
        }
    }

    pub fn state(&self) -> Result<TaskState, StoreError> {
        TaskState::parse(&self.state).ok_or_else(|| self.corrupt("unknown state"))
    }

    pub fn deliver_at_ms(&self) -> u64 {
        ms(self.deliver_at_ms)
    }

    pub fn created_at_ms(&self) -> u64 {
        ms(self.created_at_ms)
    }

    pub fn published_at_ms(&self) -> Option<u64> {
        self.published_at_ms.map(ms)
    }

    pub fn header_values(&self) -> Result<BTreeMap<String, HeaderValue>, StoreError> {
        serde_json::from_str(&self.headers).map_err(|e| self.corrupt(&format!("headers: {e}")))
    }

    /// The 202 answer this task got (with its current state).
    pub fn accepted(&self) -> Result<TaskAccepted, StoreError> {
        Ok(TaskAccepted {
            id: self.id.clone(),
            destination: self.destination.clone(),
            routing_key: self.routing_key.clone(),
            delay_ms: ms(self.delay_ms),
            deliver_at: format_epoch_ms(self.deliver_at_ms()),
            state: self.state()?,
        })
    }

    /// The task again, routed by what remains of its delay at `now_ms`.
    /// Only a pending row is sure to hold the whole payload.
    pub fn to_task(&self, cascade: &Cascade, now_ms: u64) -> Result<Task, StoreError> {
        let payload = self
            .payload
            .clone()
            .filter(|p| p.len() as u64 == ms(self.payload_bytes))
            .ok_or_else(|| self.corrupt("the payload is not stored whole"))?;
        let mut task = Task {
            id: self.id.clone(),
            client_id: self.fingerprint.is_some(),
            destination: self.destination.clone(),
            // Replaced by reroute_at below.
            route: Route {
                routing_key: self.routing_key.clone(),
                entry_exchange: String::new(),
                delay_units: 0,
                delay_ms: ms(self.delay_ms),
            },
            accepted_at_ms: self.created_at_ms(),
            deliver_at_ms: self.deliver_at_ms(),
            payload,
            content_type: self.content_type.clone(),
            headers: self.header_values()?.into_iter().collect(),
        };
        task.reroute_at(cascade, now_ms)
            .map_err(|e| self.corrupt(&format!("cannot be routed: {e}")))?;
        Ok(task)
    }

    fn corrupt(&self, reason: &str) -> StoreError {
        StoreError::Corrupt {
            id: self.id.clone(),
            reason: reason.to_owned(),
        }
    }
}
