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
//! [`REVISION_HEADER`], the task id as `message_id`, the content type, the
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
mod value;

pub use headers::{
    ATTEMPT_HEADER, DELIVER_AT_HEADER, OCCURRENCE_HEADER, POISON_REASON_HEADER,
    REFUSAL_CODE_HEADER, REFUSAL_REASON_HEADER, REVISION_HEADER, ROUTING_KEY_HEADER,
    SCHEDULE_HEADER,
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
    Message, as_published, of_task_at, poisoned, refused, released, released_of_task, restamped,
    set_aside, taken_in,
};
pub use publish::{TaskMessage, of_task};
#[cfg(test)]
pub(crate) use read::TaskStamp;
pub(crate) use read::{
    decode_properties, deliver_at_ms, delivered_to, encode_properties, identity, message_id,
};
pub(crate) use retry::{Death, attempt, for_replay, for_retry, last_death};
pub(crate) use stamp::Stamp;
pub use value::FieldValue;
