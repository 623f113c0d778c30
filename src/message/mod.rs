//! The message format: what a task's AMQP message carries, in one place.
//!
//! Pure, no I/O. Every header name delayline writes or reads is in
//! [`headers`] (`tests/layout.rs` finds no header name anywhere else). A
//! task becomes a [`Message`] in [`publish`] ([`of_task`]), as does a
//! message an ingress sets aside, releases or refuses; there is the one
//! rule for which of the broker's headers a message leaves behind when
//! delayline publishes it again ([`republished`], [`poisoned`]). A message's
//! identity, revision, due time and destination are read back in [`read`]
//! ([`identity`], [`deliver_at_ms`], [`delivered_to`]). The plugin's
//! delay headers are read in [`plugin`], the hold stamp in [`stamp`]. The
//! broker adapter sends and receives these messages without knowing what
//! they mean. This file only declares.
//!
//! What a consumer receives: the caller's headers, [`DELAY_HEADER`] (the
//! granted delay), [`DELIVER_AT_HEADER`] (the earliest moment of delivery),
//! [`REVISION_HEADER`], [`DEADLINE_HEADER`] when the task has a deadline,
//! the task id as `message_id`, the content type, the
//! acceptance time as the AMQP timestamp (whole seconds), persistent.

mod headers;
mod plugin;
mod probe;
mod publish;
mod read;
mod retry;
mod stamp;
#[cfg(test)]
mod tests;
mod trace;
mod value;

pub use headers::{
    ATTEMPT_HEADER, DEADLINE_HEADER, DELIVER_AT_HEADER, EXPIRED_AT_HEADER, FIRST_FAILED_HEADER,
    OCCURRENCE_HEADER, POISON_REASON_HEADER, REFUSAL_CODE_HEADER, REFUSAL_REASON_HEADER,
    RETRY_AFTER_HEADER, RETRY_AT_HEADER, RETRY_QUEUE_HEADER, REVISION_HEADER, ROUTING_KEY_HEADER,
    SCHEDULE_HEADER, TRACEPARENT_HEADER, TRACESTATE_HEADER,
};
#[cfg(test)]
pub(crate) use headers::{
    DELIVER_TO_HEADER, DELIVERY_KEY_HEADER, HOLD_HEADER, USER_ID_HEADER, is_queue_delivery_header,
};
pub(crate) use headers::{PLUGIN_DELAY_HEADER, is_reserved_header};
pub(crate) use plugin::{BadDelay, Due, due};
pub(crate) use probe::{Probe, drained};
#[cfg(test)]
pub(crate) use publish::properties_of;
pub(crate) use publish::republished;
pub(crate) use publish::{
    Message, as_published, expired_to, of_task_at, poisoned, refused, released, released_of_task,
    restamped, set_aside, taken_in,
};
pub use publish::{TaskMessage, of_task};
#[cfg(test)]
pub(crate) use read::TaskStamp;
pub(crate) use read::{
    deadline_ms, decode_properties, delay_ms, deliver_at_ms, delivered_to, encode_properties,
    expired_destination, identity, message_id, revision, traceparent,
};
pub(crate) use retry::{
    Death, asked_retry, attempt, first_failed_ms, for_replay, for_retry, last_death,
};
pub(crate) use stamp::Stamp;
pub(crate) use trace::carried as trace_headers;
pub use value::FieldValue;
