//! Tasks, pure: what a task is and the one way one is made ([`model`]: a
//! [`Task`] from its [`TaskParts`] and its [`Itinerary`]), a task as a
//! client states it over HTTP, validated (`request`), why one is refused
//! (`error`), and when one is no longer wanted ([`deadline`]). The current
//! time is an argument, so every rule (one delay field, a past
//! `deliver_at` means now, never early) is unit-tested without a clock.

pub mod deadline;
mod error;
mod model;
mod request;

pub use error::TaskError;
pub use model::{
    Itinerary, Task, TaskAccepted, TaskParts, TaskState, leeway_due_at, leeway_offset_ms, replay_id,
};
pub use request::{BatchRequest, NewDelay, fingerprint, parse_batch, parse_new_delay};
pub(crate) use request::{RescheduleRequest, TaskRequest, deserialize_whole, require_object};
