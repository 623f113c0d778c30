//! The message format: what a task's AMQP message carries, in one place.
//!
//! Pure, no I/O. Every header name delayline writes or reads is here. A task
//! becomes a [`Message`] here ([`of_task`]); a message's identity, revision,
//! due time and destination are read back here ([`TaskStamp::read`],
//! [`identity`], [`deliver_at_ms`]); and here is the one rule for which of
//! the broker's headers a message leaves behind when delayline publishes it
//! again ([`republished`], [`poisoned`]). The broker adapter sends and
//! receives these messages without knowing what they mean.
//!
//! What a consumer receives: the caller's headers, [`DELAY_HEADER`] (the
//! granted delay), [`DELIVER_AT_HEADER`] (the earliest moment of delivery),
//! [`REVISION_HEADER`], the task id as `message_id`, the content type, the
//! acceptance time as the AMQP timestamp (whole seconds), persistent.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::cascade::{Cascade, destination_of};
use crate::task::{FieldValue, Task};

mod headers;
mod plugin;
mod stamp;

pub use headers::{
    DELAY_HEADER, DELIVER_AT_HEADER, DELIVER_TO_HEADER, DELIVERY_KEY_HEADER, EXPIRATION_HEADER,
    OCCURRENCE_HEADER, POISON_REASON_HEADER, REVISION_HEADER, ROUTING_KEY_HEADER, SCHEDULE_HEADER,
    USER_ID_HEADER, is_dead_letter_header, is_queue_delivery_header, is_reserved_header,
    is_routing_header,
};
pub use plugin::{BadDelay, Due, PLUGIN_DELAY_HEADER, PLUGIN_DELIVER_AT_HEADER, due};
pub use stamp::{HOLD_HEADER, Stamp};

/// A message ready to publish: owned, because the publish outlives its caller
/// when the broker is slow to confirm.
#[derive(Clone, Debug)]
pub struct Message {
    pub exchange: String,
    pub routing_key: String,
    pub payload: Vec<u8>,
    pub properties: BasicProperties,
}

/// The message of a task, to its entry exchange, sent now: the one place a
/// message is stamped with this process's clocks (see [`Stamp`]).
pub fn of_task(task: &Task) -> Message {
    of_task_at(task, &crate::clock::read())
}

/// [`of_task`], sent at `now`.
pub fn of_task_at(task: &Task, now: &crate::clock::Reading) -> Message {
    let stamp = task
        .route
        .held
        .then(|| Stamp::new(&task.route, task.deliver_at_ms, now));
    Message {
        exchange: task.route.entry_exchange.clone(),
        routing_key: task.route.routing_key.clone(),
        payload: task.payload.clone(),
        properties: properties_of(task, stamp.as_ref()),
    }
}

/// A task's message properties, as consumers see them (see the module's
/// documentation), with its hold stamp while it waits. A message taken in
/// over AMQP keeps its own properties; delayline's headers are added to
/// its headers.
pub fn properties_of(task: &Task, stamp: Option<&Stamp>) -> BasicProperties {
    let mut headers = FieldTable::default();
    match &task.carried {
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
            for (name, value) in &task.headers {
                headers.insert(ShortString::from(name.as_str()), amqp_value(value));
            }
        }
    }
    let as_i64 = |v: u64| AMQPValue::LongLongInt(i64::try_from(v).unwrap_or(i64::MAX));
    headers.insert(DELAY_HEADER.into(), as_i64(task.granted_delay_ms()));
    headers.insert(DELIVER_AT_HEADER.into(), as_i64(task.deliver_at_ms));
    headers.insert(REVISION_HEADER.into(), as_i64(task.revision));
    if let Some(stamp) = stamp {
        headers.insert(HOLD_HEADER.into(), stamp.value());
    }
    if let Some(exchange) = &task.exchange {
        let exchange = AMQPValue::LongString(LongString::from(exchange.as_str()));
        headers.insert(DELIVER_TO_HEADER.into(), exchange);
    }
    let properties = match &task.carried {
        Some(carried) => carried.clone(),
        None => BasicProperties::default()
            .with_content_type(task.content_type.as_str().into())
            // AMQP timestamps are whole seconds.
            .with_timestamp(task.accepted_at_ms / 1000),
    };
    properties
        .with_message_id(task.id.as_str().into())
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
fn without_expiration_or_user(p: &BasicProperties) -> BasicProperties {
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
    if let Some(v) = p.message_id() {
        kept = kept.with_message_id(v.clone());
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
    let exchange = text_header(properties, DELIVER_TO_HEADER);
    let key = text_header(properties, DELIVERY_KEY_HEADER);
    let expiration = text_header(properties, EXPIRATION_HEADER);
    // The exchange stays named: a message parked in the unroutable queue
    // goes back there (`requeue-unroutable`).
    let mut kept = without_headers(
        properties,
        &[DELIVERY_KEY_HEADER, EXPIRATION_HEADER, HOLD_HEADER],
    );
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

/// [`republished`], also without the headers named (any case).
fn without_headers(properties: &BasicProperties, names: &[&str]) -> BasicProperties {
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

/// The exchange a released message was delivered to, when it names one
/// other than the business exchange.
pub fn delivered_to(properties: &BasicProperties) -> Option<String> {
    text_header(properties, DELIVER_TO_HEADER)
}

/// A header delayline wrote as text.
fn text_header(properties: &BasicProperties, name: &str) -> Option<String> {
    match properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok(),
        _ => None,
    }
}

/// A message's properties as the ledger stores them: AMQP's own encoding
/// of a content header's properties, which keeps every type a client sent.
pub fn encode_properties(properties: &BasicProperties) -> Vec<u8> {
    use amq_protocol::frame::WriteContext;
    lapin::protocol::basic::gen_properties(properties)(WriteContext::from(Vec::new()))
        .map(|written| written.write)
        // Writing into memory cannot fail.
        .unwrap_or_default()
}

/// Properties stored by [`encode_properties`]; `None` if they do not decode.
pub fn decode_properties(bytes: &[u8]) -> Option<BasicProperties> {
    let (rest, properties) = lapin::protocol::basic::parse_properties(bytes).ok()?;
    rest.is_empty().then_some(properties)
}

fn amqp_value(value: &FieldValue) -> AMQPValue {
    match value {
        FieldValue::Str(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        FieldValue::Int(i) => AMQPValue::LongLongInt(*i),
        FieldValue::Float(f) => AMQPValue::Double(*f),
        FieldValue::Bool(b) => AMQPValue::Boolean(*b),
    }
}

/// The task id and revision a message carries. One without a revision
/// header was published before revisions existed: revision 1.
pub fn identity(properties: &BasicProperties) -> Option<(String, u64)> {
    let id = properties.message_id().as_ref()?.to_string();
    Some((id, revision(properties)))
}

/// The revision a message was published with; 1 without the header (or
/// with one that is not a positive number).
pub fn revision(properties: &BasicProperties) -> u64 {
    header_i64(properties, REVISION_HEADER)
        .and_then(|revision| u64::try_from(revision).ok())
        .unwrap_or(1)
}

/// The epoch millisecond before which the message is never delivered; one
/// before the epoch is overdue.
pub fn deliver_at_ms(properties: &BasicProperties) -> Option<u64> {
    header_i64(properties, DELIVER_AT_HEADER).map(|at| u64::try_from(at).unwrap_or(0))
}

/// A whole number in a header, as any client library might have encoded it
/// (an integer of any width, a timestamp, or digits).
fn header_i64(properties: &BasicProperties, name: &str) -> Option<i64> {
    match properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongLongInt(v) => Some(*v),
        AMQPValue::LongInt(v) => Some(i64::from(*v)),
        AMQPValue::LongUInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortUInt(v) => Some(i64::from(*v)),
        AMQPValue::Timestamp(v) => i64::try_from(*v).ok(),
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?.parse().ok(),
        _ => None,
    }
}

/// Everything a task's message says about its task, read back.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskStamp {
    pub task_id: String,
    pub revision: u64,
    pub deliver_at_ms: Option<u64>,
    pub delay_ms: Option<u64>,
    /// From the routing key, for a chain of the levels given.
    pub destination: Option<String>,
    /// The caller's headers: all but delayline's and the broker's.
    pub headers: Vec<(String, FieldValue)>,
}

impl TaskStamp {
    /// Reads a message routed with `routing_key` by a chain of `levels`
    /// levels; `None` without a task id.
    pub fn read(routing_key: &str, properties: &BasicProperties, levels: u32) -> Option<Self> {
        let (task_id, revision) = identity(properties)?;
        let headers = properties
            .headers()
            .as_ref()
            .map(|table| {
                table
                    .inner()
                    .iter()
                    .filter(|(name, _)| !is_reserved_header(name.as_str()))
                    .filter_map(|(name, value)| Some((name.to_string(), field_value(value)?)))
                    .collect()
            })
            .unwrap_or_default();
        Some(TaskStamp {
            task_id,
            revision,
            deliver_at_ms: deliver_at_ms(properties),
            delay_ms: header_i64(properties, DELAY_HEADER).and_then(|ms| u64::try_from(ms).ok()),
            destination: destination_of(routing_key, levels).map(str::to_owned),
            headers,
        })
    }
}

fn field_value(value: &AMQPValue) -> Option<FieldValue> {
    Some(match value {
        AMQPValue::LongString(s) => FieldValue::Str(String::from_utf8(s.as_bytes().to_vec()).ok()?),
        AMQPValue::LongLongInt(i) => FieldValue::Int(*i),
        AMQPValue::Double(f) => FieldValue::Float(*f),
        AMQPValue::Boolean(b) => FieldValue::Bool(*b),
        _ => return None,
    })
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
    now: &crate::clock::Reading,
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

fn with_headers(properties: &BasicProperties, extra: &[(&str, &str)]) -> BasicProperties {
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use proptest::prelude::*;

    use super::*;
    use crate::cascade::{Cascade, CascadeSettings};

    fn cascade(levels: u32) -> Cascade {
        CascadeSettings {
            levels,
            unit_ms: 10,
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap()
    }

    fn header_value() -> impl Strategy<Value = FieldValue> {
        prop_oneof![
            "[ -~]{0,12}".prop_map(FieldValue::Str),
            any::<i64>().prop_map(FieldValue::Int),
            (-1e12f64..1e12).prop_map(FieldValue::Float),
            any::<bool>().prop_map(FieldValue::Bool),
        ]
    }

    prop_compose! {
        fn task()(
            levels in 1u32..=32,
            delay_ms in 0u64..5_000_000,
            accepted_at_ms in 0u64..4_000_000_000_000,
            destination in "[a-z]{1,8}(\\.[a-z0-9_-]{1,8}){0,3}",
            id in "[A-Za-z0-9_-]{1,40}",
            revision in 1u64..1_000,
            headers in proptest::collection::btree_map("[a-z][a-z0-9-]{0,20}", header_value(), 0..6),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) -> (Task, u32) {
            let cascade = cascade(levels);
            let delay = Duration::from_millis(delay_ms.min(cascade.max_delay_ms()));
            let route = cascade.route(delay, &destination).unwrap();
            let task = Task {
                id,
                client_id: false,
                destination,
                deliver_at_ms: accepted_at_ms + route.delay_ms,
                accepted_at_ms,
                route,
                payload,
                content_type: "application/json".to_owned(),
                headers: headers
                    .into_iter()
                    .filter(|(name, _)| !is_reserved_header(name))
                    .collect(),
                revision,
                client: None,
                exchange: None,
                carried: None,
            };
            (task, levels)
        }
    }

    proptest! {
        /// Build then read gives back what was built, for any task.
        #[test]
        fn a_tasks_message_reads_back_as_the_task((task, levels) in task()) {
            let message = of_task(&task);
            let stamp = TaskStamp::read(&message.routing_key, &message.properties, levels).unwrap();
            prop_assert_eq!(&stamp.task_id, &task.id);
            prop_assert_eq!(stamp.revision, task.revision);
            prop_assert_eq!(stamp.deliver_at_ms, Some(task.deliver_at_ms));
            prop_assert_eq!(stamp.delay_ms, Some(task.granted_delay_ms()));
            prop_assert_eq!(stamp.destination.as_deref(), Some(task.destination.as_str()));
            let mut headers = stamp.headers.clone();
            headers.sort_by(|a, b| a.0.cmp(&b.0));
            prop_assert_eq!(&headers, &task.headers);
            prop_assert_eq!(&message.payload, &task.payload);
            prop_assert_eq!(message.exchange, task.route.entry_exchange.clone());
            prop_assert_eq!(message.properties.delivery_mode(), &Some(2));
            prop_assert_eq!(message.properties.timestamp(), &Some(task.accepted_at_ms / 1000));
            // Republishing keeps all of it.
            let again = republished(&message.properties);
            let reread = TaskStamp::read(&message.routing_key, &again, levels).unwrap();
            prop_assert_eq!(reread, stamp);
        }
    }

    fn accepted_now() -> std::time::SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_700_000_000_000)
    }

    #[test]
    fn a_parsed_task_round_trips_through_its_message() {
        let body = br#"{"destination":"billing.invoice","delay_ms":250,"headers":{"tenant":"acme","n":3}}"#;
        let task = Task::parse(body, &cascade(8), accepted_now()).unwrap();
        let message = of_task(&task);
        let stamp = TaskStamp::read(&message.routing_key, &message.properties, 8).unwrap();
        assert_eq!(stamp.destination.as_deref(), Some("billing.invoice"));
        assert_eq!(stamp.delay_ms, Some(task.granted_delay_ms()));
        assert!(task.granted_delay_ms() >= 250);
        assert_eq!(stamp.headers.len(), 2);
    }

    #[test]
    fn republishing_leaves_the_dead_lettering_history_behind() {
        let mut headers = FieldTable::default();
        headers.insert("x-death".into(), AMQPValue::LongString("levels".into()));
        headers.insert(
            "x-first-death-queue".into(),
            AMQPValue::LongString("q".into()),
        );
        headers.insert(
            "X-Last-Death-Reason".into(),
            AMQPValue::LongString("expired".into()),
        );
        headers.insert("mine".into(), AMQPValue::LongLongInt(1));
        headers.insert(REVISION_HEADER.into(), AMQPValue::LongLongInt(2));
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(1));
        headers.insert("x-acquired-count".into(), AMQPValue::LongLongInt(2));
        let properties = BasicProperties::default()
            .with_message_id("t".into())
            .with_headers(headers);
        let released = republished(&properties);
        let names: Vec<&str> = released
            .headers()
            .as_ref()
            .unwrap()
            .inner()
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(names, ["mine", REVISION_HEADER]);
        assert_eq!(released.message_id(), properties.message_id());

        let poisoned = poisoned(&properties, "1.0.d", "why");
        let headers = poisoned.headers().clone().unwrap();
        assert_eq!(headers.inner().len(), 4, "{headers:?}");
        assert_eq!(
            headers.inner().get(POISON_REASON_HEADER),
            Some(&AMQPValue::LongString("why".into()))
        );
    }

    #[test]
    fn a_message_without_a_revision_is_revision_one() {
        let mut headers = FieldTable::default();
        let properties = BasicProperties::default().with_message_id("t".into());
        assert_eq!(identity(&properties), Some(("t".to_owned(), 1)));
        headers.insert(REVISION_HEADER.into(), AMQPValue::LongLongInt(4));
        let properties = properties.with_headers(headers);
        assert_eq!(identity(&properties), Some(("t".to_owned(), 4)));
        assert_eq!(identity(&BasicProperties::default()), None);
    }

    #[test]
    fn numbers_read_back_from_every_integer_encoding() {
        let with = |value: AMQPValue| {
            let mut headers = FieldTable::default();
            headers.insert(DELIVER_AT_HEADER.into(), value);
            BasicProperties::default().with_headers(headers)
        };
        for (value, read) in [
            (AMQPValue::LongLongInt(7), Some(7)),
            (AMQPValue::LongInt(7), Some(7)),
            (AMQPValue::LongUInt(7), Some(7)),
            (AMQPValue::ShortInt(7), Some(7)),
            (AMQPValue::ShortUInt(7), Some(7)),
            (AMQPValue::Timestamp(7), Some(7)),
            (AMQPValue::LongString("7".into()), Some(7)),
            (AMQPValue::LongLongInt(-1), Some(0)),
            (AMQPValue::LongString("soon".into()), None),
            (AMQPValue::Boolean(true), None),
        ] {
            assert_eq!(deliver_at_ms(&with(value.clone())), read, "{value:?}");
        }
        assert_eq!(deliver_at_ms(&BasicProperties::default()), None);
    }

    #[test]
    fn reserved_names_are_delaylines_the_brokers_and_routing_headers() {
        for name in [
            "x-delay-ms",
            "X-Deliver-At-Ms",
            "x-delayline-revision",
            "x-death",
            "x-first-death-queue",
            "x-last-death-reason",
            "CC",
            "BCC",
        ] {
            assert!(is_reserved_header(name), "{name}");
        }
        for name in ["tenant", "cc", "x-delay", "x-delayline-routing-key"] {
            assert!(!is_reserved_header(name), "{name}");
        }
    }
}
