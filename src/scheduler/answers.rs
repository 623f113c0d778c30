//! What the scheduler answers, and why it refuses: the words the API above
//! it speaks.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::broker::PublishError;
use crate::bulk::BulkError;
use crate::cascade::RouteError;
use crate::ledger::LedgerError;
use crate::limit::LimitError;
use crate::task::TaskAccepted;

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// Its properties could never be published; nothing was recorded.
    #[error("{0}")]
    TooLarge(PublishError),
    /// Stateless mode: the broker did not take the task.
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("{pending} tasks are waiting for RabbitMQ, the most store.max_pending allows")]
    LedgerFull { pending: u64 },
    #[error("{key} was already used for a different request (task {existing_id})")]
    Conflict { key: String, existing_id: String },
}

/// The answer to a submitted task.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub accepted: TaskAccepted,
    /// The same request was accepted before; nothing new was scheduled.
    pub replayed: bool,
}

/// How a client names a request so that a retry is recognised.
#[derive(Clone, Debug, Default)]
pub struct Idempotency {
    /// The Idempotency-Key header.
    pub key: Option<String>,
    /// The canonical request's hash; set when there is a key or a client id.
    pub fingerprint: Option<String>,
}

/// Why inspecting tasks failed.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("this service runs without a ledger (store.url = \"none\"): tasks cannot be inspected")]
    LedgerDisabled,
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// Why a task could not be cancelled or moved.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    #[error(
        "this service runs without a ledger (store.url = \"none\"): tasks cannot be cancelled \
         or moved"
    )]
    LedgerDisabled,
    #[error(
        "the release stage is off (cascade.release_stage = false): a scheduled task reaches the \
         business exchange without passing delayline, so it cannot be cancelled or moved"
    )]
    ReleaseStageOff,
    /// The new due time cannot be routed (beyond the chain's longest delay).
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// Why a bulk operation could not be started or read.
#[derive(Debug, thiserror::Error)]
pub enum BulkOperationError {
    /// The ledger or the release stage is missing: tasks cannot change.
    #[error(transparent)]
    Unchangeable(ChangeError),
    #[error(transparent)]
    Invalid(#[from] BulkError),
    #[error("no operation {0:?}")]
    NotFound(String),
    #[error("{key} was already used for a different bulk request (operation {existing_id})")]
    Conflict { key: String, existing_id: String },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// What `/readyz` answers when ready.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Readiness {
    pub status: String,
    /// `connected` (tasks are published as they come), `blocked` or
    /// `disconnected` (they wait in the ledger).
    pub broker: String,
    /// The broker address in use (without its password).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub node: Option<String>,
    /// Why the broker blocks publishing (a resource alarm), while it does.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub blocked: Option<String>,
    /// Why the last attempt to connect failed, while disconnected.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub broker_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pending: Option<u64>,
}

/// Why a task posted now would not be accepted.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    /// RabbitMQ has refused delayline itself for longer than the grace.
    #[error(
        "RabbitMQ has refused delayline for {} s: {reason} (check amqp.uri: user, password, \
         vhost, and the user's permissions)", .since.as_secs()
    )]
    Misconfigured { since: Duration, reason: String },
    /// Stateless mode, and the broker cannot take a task now.
    #[error("{0}")]
    Broker(String),
    #[error("{pending} tasks are waiting for RabbitMQ, the most store.max_pending allows")]
    LedgerFull { pending: u64 },
    /// A write to the ledger failed just now (tasks would be refused).
    #[error("the ledger cannot write: {0}")]
    LedgerCannotWrite(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// Why a release limit could not be read or set.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    #[error(
        "this service runs without a ledger (store.url = \"none\"): release limits keep waiting \
         tasks in the ledger, so there are none"
    )]
    LedgerDisabled,
    #[error(
        "the release stage is off (cascade.release_stage = false): due tasks reach the business \
         exchange without passing delayline, so nothing can hold them"
    )]
    ReleaseStageOff,
    #[error("no release limit {0:?}")]
    NotFound(String),
    #[error(transparent)]
    Invalid(#[from] LimitError),
    /// The broker could not be asked about the bounded queue.
    #[error("cannot check the queue with RabbitMQ: {0}")]
    Broker(#[from] PublishError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}
