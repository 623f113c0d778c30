//! The names of the headers delayline writes and reads, and which names a
//! task may not set. A leaf: task validation reads it without depending on
//! how messages are built, and it imports nothing.

/// The delay granted, in milliseconds (the request rounded up to the
/// chain's precision).
pub const DELAY_HEADER: &str = "x-delay-ms";
/// Epoch milliseconds before which the message is never delivered.
pub const DELIVER_AT_HEADER: &str = "x-deliver-at-ms";
/// Epoch milliseconds after which the task is never published to its
/// destination (its deadline): the release stage expires it instead. Kept
/// on delivery, as the due time is.
pub const DEADLINE_HEADER: &str = "x-delayline-deadline-ms";
/// Where a task's message goes instead when its deadline passes (a
/// destination, the routing key at its exchange). Removed on delivery.
pub const EXPIRED_TO_HEADER: &str = "x-delayline-expired-to";
/// On a message an expired task sent to its `expired_destination`: when it
/// expired, epoch milliseconds.
pub const EXPIRED_AT_HEADER: &str = "x-delayline-expired-at-ms";
/// The task's revision the message was published with: the release stage
/// drops a copy older than the ledger's (the task was moved since).
pub const REVISION_HEADER: &str = "x-delayline-revision";
/// The routing key a message had before delayline moved it to a queue of
/// its own by that queue's name: a poisoned message's, or one an ingress
/// refused.
pub const ROUTING_KEY_HEADER: &str = "x-delayline-routing-key";
/// Why a message was poisoned.
pub const POISON_REASON_HEADER: &str = "x-delayline-poison-reason";

/// The exchange a task is delivered to, when it is not the business
/// exchange (a task named it, or an AMQP ingress took it in). Kept on
/// delivery, so that `requeue-unroutable` sends a parked message back there.
pub const DELIVER_TO_HEADER: &str = "x-delayline-exchange";
/// A message taken in over AMQP: the routing key it came with, which it is
/// delivered with. Removed on delivery.
pub const DELIVERY_KEY_HEADER: &str = "x-delayline-delivery-key";
/// A message taken in over AMQP: its `expiration` property, held back while
/// it waits (the broker would expire it inside the cascade) and restored on
/// delivery. Removed on delivery.
pub const EXPIRATION_HEADER: &str = "x-delayline-expiration";
/// A message taken in over AMQP: the `user_id` property it was published
/// with. RabbitMQ refuses a `user_id` other than the publishing
/// connection's, so delayline cannot publish it again as a property; it
/// travels, and is delivered, as this header.
pub const USER_ID_HEADER: &str = "x-delayline-user-id";

/// The header carrying a hold stamp (`super::Stamp`), as
/// `<source>:<sent_us>:<due_us>:<least_us>`, each number 16 hexadecimal
/// digits. Removed on delivery.
pub const HOLD_HEADER: &str = "x-delayline-hold";

/// A probe of one level (see `crate::cascade` on stranded levels), as
/// `<level>:<sent_ms>:<owner>`: the release stage takes it off, never delivers it.
pub const PROBE_HEADER: &str = "x-delayline-probe";

/// On a message an ingress refused: why, as a stable code.
pub const REFUSAL_CODE_HEADER: &str = "x-delayline-refused";
/// On a message an ingress refused: why, in words.
pub const REFUSAL_REASON_HEADER: &str = "x-delayline-refused-reason";
/// On a refused copy that had to leave its headers behind.
pub const HEADERS_DROPPED_HEADER: &str = "x-delayline-refused-headers-dropped";

/// The `x-delayed-message` plugin's delay header, read by an ingress.
pub const PLUGIN_DELAY_HEADER: &str = "x-delay";
/// A due time, delayline's addition to the plugin's contract.
pub const PLUGIN_DELIVER_AT_HEADER: &str = "x-deliver-at";

/// On a message a retry policy brings back to its queue: which attempt
/// this delivery is (2 for the first retry). A message without it is on
/// its first attempt.
pub const ATTEMPT_HEADER: &str = "x-delayline-attempt";
/// On a message a retry policy brings back: when its first attempt
/// failed, epoch milliseconds (kept through its later attempts; parked
/// messages are grouped by its hour).
pub const FIRST_FAILED_HEADER: &str = "x-delayline-first-failed-at-ms";
/// While a retried message waits: the `message_id` it had (empty when it
/// had none); restored on delivery, and removed.
pub const ORIGINAL_ID_HEADER: &str = "x-delayline-message-id";
/// On a message a consumer publishes to the retry exchange itself, instead
/// of rejecting it, to name when it comes back: the queue it failed in
/// (which it comes back to).
pub const RETRY_QUEUE_HEADER: &str = "x-delayline-retry-queue";
/// With [`RETRY_QUEUE_HEADER`]: when it comes back, epoch milliseconds (a
/// number) or an RFC 3339 time (a string).
pub const RETRY_AT_HEADER: &str = "x-delayline-retry-at";
/// With [`RETRY_QUEUE_HEADER`], instead of [`RETRY_AT_HEADER`]: how long
/// after the retry intake takes it in, in milliseconds (a 429's
/// `Retry-After` seconds × 1000).
pub const RETRY_AFTER_HEADER: &str = "x-delayline-retry-after-ms";
/// RabbitMQ's dead-letter history: a table per queue and reason, the most
/// recent first. A retry intake reads the queue and reason of the first.
pub const DEATH_HEADER: &str = "x-death";

/// An occurrence of a recurring schedule: the schedule's id.
pub const SCHEDULE_HEADER: &str = "x-delayline-schedule";
/// An occurrence of a recurring schedule: its time (RFC 3339, UTC).
pub const OCCURRENCE_HEADER: &str = "x-delayline-occurrence";

/// W3C Trace Context: the producer's trace, carried to the consumer as is
/// (see [`super::trace`]).
pub const TRACEPARENT_HEADER: &str = "traceparent";
pub const TRACESTATE_HEADER: &str = "tracestate";

/// delayline's headers of a message taken in over AMQP; a task over HTTP
/// may not set them.
const INGRESS_HEADERS: [&str; 4] = [
    DELIVER_TO_HEADER,
    DELIVERY_KEY_HEADER,
    EXPIRATION_HEADER,
    USER_ID_HEADER,
];

/// What RabbitMQ adds while dead-lettering: `x-death`, `x-first-death-*`,
/// `x-last-death-*`. They name delayline's own queues and say nothing about
/// the task.
const DEAD_LETTER_HEADER_PREFIXES: [&str; 3] = ["x-death", "x-first-death", "x-last-death"];

/// RabbitMQ's sender-selected distribution headers: it routes copies by
/// them, and refuses a message whose value is not an array (closing the
/// publishing channel), so they are never passed through.
const ROUTING_HEADERS: [&str; 2] = ["CC", "BCC"];

/// What a quorum queue adds to a message it delivers again: the count of
/// deliveries (`x-delivery-count`) and, on RabbitMQ 4, of acquisitions
/// (`x-acquired-count`). They describe the queue delayline consumed, not the
/// message its producer sent.
const QUEUE_DELIVERY_HEADERS: [&str; 2] = ["x-delivery-count", "x-acquired-count"];

/// A header a queue adds when it delivers a message again.
pub fn is_queue_delivery_header(name: &str) -> bool {
    QUEUE_DELIVERY_HEADERS
        .iter()
        .any(|header| name.eq_ignore_ascii_case(header))
}

/// A header RabbitMQ adds while dead-lettering (case as the broker may spell it).
pub fn is_dead_letter_header(name: &str) -> bool {
    // Compared in place: these run on every header of every message
    // released or published again, and a lowercase copy is an allocation.
    DEAD_LETTER_HEADER_PREFIXES.iter().any(|prefix| {
        name.as_bytes()
            .get(..prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
    })
}

/// `CC` or `BCC`: RabbitMQ routes copies of a message by them.
pub fn is_routing_header(name: &str) -> bool {
    ROUTING_HEADERS.contains(&name)
}

/// A header a task may not set: delayline's own (those of a message taken in
/// over AMQP too), the broker's dead-letter history, and the broker's
/// routing headers.
pub fn is_reserved_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == DELAY_HEADER
        || lower == DELIVER_AT_HEADER
        || lower == REVISION_HEADER
        || lower == DEADLINE_HEADER
        || lower == EXPIRED_TO_HEADER
        || lower == EXPIRED_AT_HEADER
        || INGRESS_HEADERS.contains(&lower.as_str())
        || lower == HOLD_HEADER
        || lower == PROBE_HEADER
        || lower == SCHEDULE_HEADER
        || lower == OCCURRENCE_HEADER
        || lower == ATTEMPT_HEADER
        || lower == FIRST_FAILED_HEADER
        || lower == RETRY_QUEUE_HEADER
        || lower == RETRY_AT_HEADER
        || lower == RETRY_AFTER_HEADER
        || lower == ORIGINAL_ID_HEADER
        || is_dead_letter_header(name)
        || ROUTING_HEADERS.contains(&name)
}
