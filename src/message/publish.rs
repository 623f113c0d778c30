//! What delayline publishes: a task's message, a message taken in over
//! AMQP and set aside or released, and the one rule for which of the
//! broker's headers a message leaves behind when it is published again.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use super::headers::*;
use super::read::{deliver_at_ms, text_header};
use super::stamp::Stamp;
use super::value::FieldValue;
use crate::cascade::{Cascade, Route};
use crate::clock::Reading;

/// A message ready to publish: owned, because the publish outlives its caller
/// when the broker is slow to confirm.
#[derive(Clone, Debug)]
pub struct Message {
    pub exchange: String,
    pub routing_key: String,
    pub payload: Vec<u8>,
    pub properties: BasicProperties,
}

/// A task as its message is made of it (`crate::task::Task::message`): this
/// room needs nothing of how a task is validated.
#[derive(Clone, Copy, Debug)]
pub struct TaskMessage<'a> {
    pub id: &'a str,
    pub route: &'a Route,
    /// When the delay started, epoch milliseconds.
    pub accepted_at_ms: u64,
    pub deliver_at_ms: u64,
    pub revision: u64,
    pub payload: &'a [u8],
    pub content_type: &'a str,
    pub headers: &'a [(String, FieldValue)],
    /// Where it is delivered, when not to the business exchange.
    pub exchange: Option<&'a str>,
    /// Its deadline, epoch milliseconds ([`DEADLINE_HEADER`]).
    pub deadline_ms: Option<u64>,
    /// Where its message goes instead once the deadline passed
    /// ([`EXPIRED_TO_HEADER`]).
    pub expired_destination: Option<&'a str>,
    /// The properties of a message taken in over AMQP, delivered as they came.
    pub carried: Option<&'a BasicProperties>,
}

/// The message of a task, to its entry exchange, sent now: the one place a
/// message is stamped with this process's clocks (see [`Stamp`]).
pub fn of_task(task: &TaskMessage<'_>) -> Message {
    of_task_at(task, &crate::clock::read())
}

/// [`of_task`], sent at `now`.
pub fn of_task_at(task: &TaskMessage<'_>, now: &Reading) -> Message {
    let stamp = task
        .route
        .held
        .then(|| Stamp::new(task.route, task.deliver_at_ms, now));
    Message {
        exchange: task.route.entry_exchange.clone(),
        routing_key: task.route.routing_key.clone(),
        payload: task.payload.to_vec(),
        properties: properties_of(task, stamp.as_ref()),
    }
}

/// A task's message properties, as consumers see them (see the module's
/// documentation), with its hold stamp while it waits. A message taken in
/// over AMQP keeps its own properties; delayline's headers are added to
/// its headers.
pub fn properties_of(task: &TaskMessage<'_>, stamp: Option<&Stamp>) -> BasicProperties {
    let mut headers = FieldTable::default();
    match task.carried {
        // As the client encoded them: `task.headers` is only a copy. A hold
        // stamp is delayline's alone to write.
        Some(carried) => {
            for (name, value) in carried.headers().iter().flat_map(|h| h.inner()) {
                if !name.as_str().eq_ignore_ascii_case(HOLD_HEADER) {
                    headers.insert(name.clone(), value.clone());
                }
            }
        }
        None => {
            for (name, value) in task.headers {
                headers.insert(ShortString::from(name.as_str()), amqp_value(value));
            }
        }
    }
    let as_i64 = |v: u64| AMQPValue::LongLongInt(i64::try_from(v).unwrap_or(i64::MAX));
    headers.insert(
        DELAY_HEADER.into(),
        as_i64(task.deliver_at_ms - task.accepted_at_ms),
    );
    headers.insert(DELIVER_AT_HEADER.into(), as_i64(task.deliver_at_ms));
    headers.insert(REVISION_HEADER.into(), as_i64(task.revision));
    if let Some(deadline_ms) = task.deadline_ms {
        headers.insert(DEADLINE_HEADER.into(), as_i64(deadline_ms));
    }
    if let Some(destination) = task.expired_destination {
        let destination = AMQPValue::LongString(LongString::from(destination));
        headers.insert(EXPIRED_TO_HEADER.into(), destination);
    }
    if let Some(stamp) = stamp {
        headers.insert(HOLD_HEADER.into(), stamp.value());
    }
    if let Some(exchange) = task.exchange {
        let exchange = AMQPValue::LongString(LongString::from(exchange));
        headers.insert(DELIVER_TO_HEADER.into(), exchange);
    }
    let properties = match task.carried {
        Some(carried) => carried.clone(),
        None => BasicProperties::default()
            .with_content_type(task.content_type.into())
            // AMQP timestamps are whole seconds.
            .with_timestamp(task.accepted_at_ms / 1000),
    };
    properties
        .with_message_id(task.id.into())
        .with_delivery_mode(2)
        .with_headers(headers)
}

/// A message consumed from a queue as its producer published it: without
/// the headers the queue added when it delivered the message again (after a
/// crash before the ack), so that a redelivery is the same message, with the
/// same headers and the same fingerprint, and the consumer never sees them.
pub fn as_published(properties: &BasicProperties) -> BasicProperties {
    let Some(headers) = properties.headers() else {
        return properties.clone();
    };
    if !headers
        .inner()
        .keys()
        .any(|name| is_queue_delivery_header(name.as_str()))
    {
        return properties.clone();
    }
    let mut table = FieldTable::default();
    for (name, value) in headers.inner() {
        if !is_queue_delivery_header(name.as_str()) {
            table.insert(name.clone(), value.clone());
        }
    }
    properties.clone().with_headers(table)
}

/// The properties of a message taken in over AMQP, as delayline keeps them
/// while it waits: delivered to `deliver_to` with the routing key it came
/// with, its `expiration` held back (restored by [`released`]), its
/// `user_id` moved to a header (RabbitMQ would refuse it from delayline's
/// connection), and, as the plugin does, the `x-delay` it asked for turned
/// negative so that a consumer can tell it was delayed. Persistent.
pub fn taken_in(
    properties: &BasicProperties,
    deliver_to: &str,
    routing_key: &str,
    delay: Option<u64>,
) -> BasicProperties {
    let kept = set_aside(properties);
    let mut headers = kept.headers().clone().unwrap_or_default();
    let text = |value: &str| AMQPValue::LongString(LongString::from(value));
    headers.insert(DELIVER_TO_HEADER.into(), text(deliver_to));
    headers.insert(DELIVERY_KEY_HEADER.into(), text(routing_key));
    if let Some(delay) = delay {
        let negative = -i64::try_from(delay).unwrap_or(i64::MAX);
        headers.insert(PLUGIN_DELAY_HEADER.into(), AMQPValue::LongLongInt(negative));
    }
    kept.with_delivery_mode(2).with_headers(headers)
}

/// A message's properties with `expiration` and `user_id` moved into
/// headers ([`EXPIRATION_HEADER`], [`USER_ID_HEADER`]): what delayline can
/// publish again without the broker expiring it where it waits, or refusing
/// a user id other than delayline's. Without `CC` and `BCC`: RabbitMQ routed
/// the message by them when it was published; published again, they would
/// route copies anywhere (into the cascade's levels, or to any queue by its
/// name).
pub fn set_aside(properties: &BasicProperties) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, value) in properties.headers().iter().flat_map(|h| h.inner()) {
        if !is_routing_header(name.as_str()) {
            headers.insert(name.clone(), value.clone());
        }
    }
    let text = |value: &str| AMQPValue::LongString(LongString::from(value));
    if let Some(expiration) = properties.expiration() {
        headers.insert(EXPIRATION_HEADER.into(), text(expiration.as_str()));
    }
    if let Some(user_id) = properties.user_id() {
        headers.insert(USER_ID_HEADER.into(), text(user_id.as_str()));
    }
    without_expiration_or_user(properties).with_headers(headers)
}

/// Every property but `expiration` and `user_id` (lapin can set a property,
/// not unset one).
pub(super) fn without_expiration_or_user(p: &BasicProperties) -> BasicProperties {
    let id = p.message_id().as_ref().map(|id| id.as_str().to_owned());
    rebuilt(p, id.as_deref())
}

/// Every property but `expiration` and `user_id`, with `message_id` (none
/// when `None`).
pub(super) fn rebuilt(p: &BasicProperties, message_id: Option<&str>) -> BasicProperties {
    let mut kept = BasicProperties::default();
    if let Some(v) = p.content_type() {
        kept = kept.with_content_type(v.clone());
    }
    if let Some(v) = p.content_encoding() {
        kept = kept.with_content_encoding(v.clone());
    }
    if let Some(v) = p.headers() {
        kept = kept.with_headers(v.clone());
    }
    if let Some(v) = p.delivery_mode() {
        kept = kept.with_delivery_mode(*v);
    }
    if let Some(v) = p.priority() {
        kept = kept.with_priority(*v);
    }
    if let Some(v) = p.correlation_id() {
        kept = kept.with_correlation_id(v.clone());
    }
    if let Some(v) = p.reply_to() {
        kept = kept.with_reply_to(v.clone());
    }
    if let Some(id) = message_id {
        kept = kept.with_message_id(id.into());
    }
    if let Some(v) = p.timestamp() {
        kept = kept.with_timestamp(*v);
    }
    if let Some(v) = p.kind() {
        kept = kept.with_type(v.clone());
    }
    if let Some(v) = p.app_id() {
        kept = kept.with_app_id(v.clone());
    }
    if let Some(v) = p.cluster_id() {
        kept = kept.with_cluster_id(v.clone());
    }
    kept
}

/// The message the release stage publishes for a due message that came
/// down `cascade` with `routing_key`: to the exchange it was taken in for
/// (the business exchange unless it says otherwise), with the routing key
/// it came with (or the one the chain delivers with), its properties as
/// they were but for the broker's dead-lettering history and the routing
/// key delayline kept, its held-back `expiration` restored.
pub fn released(
    routing_key: &str,
    payload: Vec<u8>,
    properties: &BasicProperties,
    cascade: &Cascade,
) -> Message {
    released_owned(routing_key, payload, properties.clone(), cascade)
}

/// What [`released`] makes of [`of_task`]'s message, built straight from
/// the task: the staged release builds one for every task of a burst, and
/// building it through the cascade's message (a hold stamp made, header
/// tables copied, only to be dropped) took a tenth of the service's CPU in
/// a burst's release; this takes about half that (record 54). `payload`
/// is the task's, moved in: `task.payload` is not read.
pub fn released_of_task(task: &TaskMessage<'_>, payload: Vec<u8>, cascade: &Cascade) -> Message {
    let properties = properties_of(task, None);
    released_owned(&task.route.routing_key, payload, properties, cascade)
}

/// Headers delayline kept for the release alone: not delivered. The
/// exchange stays named: a message parked in the unroutable queue goes
/// back there (`requeue-unroutable`).
const RELEASE_ONLY_HEADERS: [&str; 5] = [
    DELIVERY_KEY_HEADER,
    EXPIRATION_HEADER,
    HOLD_HEADER,
    ORIGINAL_ID_HEADER,
    EXPIRED_TO_HEADER,
];

/// A released message (see [`released`]) sent instead to `destination`
/// at its exchange, because its task expired at `expired_at_ms`: marked
/// so ([`EXPIRED_AT_HEADER`]).
pub fn expired_to(mut message: Message, destination: &str, expired_at_ms: u64) -> Message {
    let mut headers = message.properties.headers().clone().unwrap_or_default();
    let at = AMQPValue::LongLongInt(i64::try_from(expired_at_ms).unwrap_or(i64::MAX));
    headers.insert(EXPIRED_AT_HEADER.into(), at);
    message.properties = message.properties.with_headers(headers);
    message.routing_key = destination.to_owned();
    message
}

/// [`released`], of properties it may take apart.
fn released_owned(
    routing_key: &str,
    payload: Vec<u8>,
    properties: BasicProperties,
    cascade: &Cascade,
) -> Message {
    let exchange = text_header(&properties, DELIVER_TO_HEADER);
    let key = text_header(&properties, DELIVERY_KEY_HEADER);
    let expiration = text_header(&properties, EXPIRATION_HEADER);
    let original_id = text_header(&properties, ORIGINAL_ID_HEADER);
    // One pass over the headers, the table moved rather than copied.
    let mut kept = match properties.headers().as_ref().map(kept_on_release) {
        Some(table) => properties.with_headers(table),
        None => properties,
    };
    // A retried message comes back with the id it left with (or none): its
    // task had an id of its own, one per attempt.
    if let Some(original) = original_id {
        kept = rebuilt(&kept, Some(original.as_str()).filter(|id| !id.is_empty()));
    }
    if let Some(expiration) = expiration {
        kept = kept.with_expiration(expiration.as_str().into());
    }
    Message {
        exchange: exchange.unwrap_or_else(|| cascade.business_exchange().to_owned()),
        routing_key: key.unwrap_or_else(|| cascade.delivered_routing_key(routing_key).to_owned()),
        payload,
        properties: kept,
    }
}

/// The headers a released message keeps: neither the broker's (see
/// [`with_headers`]) nor [`RELEASE_ONLY_HEADERS`] (any case).
fn kept_on_release(headers: &FieldTable) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in headers.inner() {
        let text = name.as_str();
        let dropped = is_dead_letter_header(text)
            || is_queue_delivery_header(text)
            || RELEASE_ONLY_HEADERS
                .iter()
                .any(|header| text.eq_ignore_ascii_case(header));
        if !dropped {
            table.insert(name.clone(), value.clone());
        }
    }
    table
}

/// [`republished`], also without the headers named (any case).
pub(super) fn without_headers(properties: &BasicProperties, names: &[&str]) -> BasicProperties {
    let mut kept = republished(properties);
    if let Some(headers) = kept.headers().clone() {
        let mut table = FieldTable::default();
        for (name, value) in headers.inner() {
            let lower = name.as_str().to_ascii_lowercase();
            if !names.contains(&lower.as_str()) {
                table.insert(name.clone(), value.clone());
            }
        }
        kept = kept.with_headers(table);
    }
    kept
}

pub(super) fn amqp_value(value: &FieldValue) -> AMQPValue {
    match value {
        FieldValue::Str(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        FieldValue::Int(i) => AMQPValue::LongLongInt(*i),
        FieldValue::Float(f) => AMQPValue::Double(*f),
        FieldValue::Bool(b) => AMQPValue::Boolean(*b),
    }
}

/// The properties of a message delayline publishes again (released, moved
/// to another chain): as they were, without the broker's dead-letter
/// history and without the count a quorum queue adds when it delivers a
/// message again (a release queue's message taken again after a crash).
/// Those headers name the old queues, and took the room the frame kept for
/// them, which the new publish would otherwise count against the task's
/// own headers.
pub fn republished(properties: &BasicProperties) -> BasicProperties {
    with_headers(properties, &[])
}

/// [`republished`] into another chain by `route`: its old hold stamp
/// replaced by one of `now` (another chain, another least time), or
/// removed when the new chain does not hold.
pub fn restamped(
    properties: &BasicProperties,
    route: &crate::cascade::Route,
    now: &Reading,
) -> BasicProperties {
    let kept = without_headers(properties, &[HOLD_HEADER]);
    let Some(deliver_at_ms) = deliver_at_ms(properties).filter(|_| route.held) else {
        return kept;
    };
    let mut headers = kept.headers().clone().unwrap_or_default();
    let stamp = Stamp::new(route, deliver_at_ms, now);
    headers.insert(HOLD_HEADER.into(), stamp.value());
    kept.with_headers(headers)
}

/// As [`republished`], for the poison queue: with the routing key it had
/// and the reason it cannot be rescheduled.
pub fn poisoned(properties: &BasicProperties, routing_key: &str, reason: &str) -> BasicProperties {
    with_headers(
        properties,
        &[
            (ROUTING_KEY_HEADER, routing_key),
            (POISON_REASON_HEADER, reason),
        ],
    )
}

pub(super) fn with_headers(
    properties: &BasicProperties,
    extra: &[(&str, &str)],
) -> BasicProperties {
    if extra.is_empty() && properties.headers().is_none() {
        return properties.clone();
    }
    let mut kept = FieldTable::default();
    if let Some(headers) = properties.headers() {
        for (name, value) in headers.inner() {
            if !is_dead_letter_header(name.as_str()) && !is_queue_delivery_header(name.as_str()) {
                kept.insert(name.clone(), value.clone());
            }
        }
    }
    for (name, value) in extra {
        kept.insert(
            ShortString::from(*name),
            AMQPValue::LongString(LongString::from(*value)),
        );
    }
    properties.clone().with_headers(kept)
}

/// A message an ingress refused, to its refused queue: as it came (see
/// [`set_aside`]), with the refusal's `code` and `reason`, and the
/// `routing_key` it came with (the copy goes to the queue by its name, so
/// the key would otherwise be lost). A copy whose headers leave no room for
/// them (`headers_dropped`) keeps its body, properties and routing key but
/// not its other headers, and says so.
pub fn refused(
    properties: &BasicProperties,
    routing_key: &str,
    (code, reason): (&str, &str),
    headers_dropped: bool,
) -> BasicProperties {
    let mut headers = if headers_dropped {
        let mut note = FieldTable::default();
        note.insert(
            ShortString::from(HEADERS_DROPPED_HEADER),
            AMQPValue::Boolean(true),
        );
        note
    } else {
        properties.headers().clone().unwrap_or_default()
    };
    let text = |value: &str| AMQPValue::LongString(LongString::from(value));
    headers.insert(ShortString::from(REFUSAL_CODE_HEADER), text(code));
    headers.insert(ShortString::from(REFUSAL_REASON_HEADER), text(reason));
    headers.insert(ShortString::from(ROUTING_KEY_HEADER), text(routing_key));
    properties.clone().with_headers(headers)
}
