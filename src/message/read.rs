//! What a message says, read back: its task's identity, revision, due
//! time and destination; and its properties as the ledger stores them.

use lapin::BasicProperties;
use lapin::types::AMQPValue;

use super::headers::*;
#[cfg(test)]
use super::value::FieldValue;
#[cfg(test)]
use crate::cascade::destination_of;

/// The exchange a released message was delivered to, when it names one
/// other than the business exchange.
pub fn delivered_to(properties: &BasicProperties) -> Option<String> {
    text_header(properties, DELIVER_TO_HEADER)
}

/// A header delayline wrote as text.
pub(super) fn text_header(properties: &BasicProperties, name: &str) -> Option<String> {
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

/// A message's `message_id` as text (a task's id), for logs and lookups.
pub fn message_id(properties: &BasicProperties) -> Option<&str> {
    properties.message_id().as_ref().map(|id| id.as_str())
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

/// The delay a task's message was given ([`DELAY_HEADER`]), if any.
pub fn delay_ms(properties: &BasicProperties) -> Option<u64> {
    header_i64(properties, DELAY_HEADER).and_then(|ms| u64::try_from(ms).ok())
}

/// The W3C `traceparent` a message carries ([`TRACEPARENT_HEADER`]), if any.
pub fn traceparent(properties: &BasicProperties) -> Option<String> {
    text_header(properties, TRACEPARENT_HEADER)
}

/// The deadline a task's message carries ([`DEADLINE_HEADER`]), if any.
pub fn deadline_ms(properties: &BasicProperties) -> Option<u64> {
    header_i64(properties, DEADLINE_HEADER).map(|at| u64::try_from(at).unwrap_or(0))
}

/// Where a task's message goes once its deadline passed
/// ([`EXPIRED_TO_HEADER`]), if anywhere.
pub fn expired_destination(properties: &BasicProperties) -> Option<String> {
    text_header(properties, EXPIRED_TO_HEADER)
}

/// A whole number in a header, as any client library might have encoded it
/// (an integer of any width, a timestamp, or digits).
pub(super) fn header_i64(properties: &BasicProperties, name: &str) -> Option<i64> {
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

/// Everything a task's message says about its task, read back: what the
/// tests hold a message against.
#[cfg(test)]
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

#[cfg(test)]
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

#[cfg(test)]
pub(super) fn field_value(value: &AMQPValue) -> Option<FieldValue> {
    Some(match value {
        AMQPValue::LongString(s) => FieldValue::Str(String::from_utf8(s.as_bytes().to_vec()).ok()?),
        AMQPValue::LongLongInt(i) => FieldValue::Int(*i),
        AMQPValue::Double(f) => FieldValue::Float(*f),
        AMQPValue::Boolean(b) => FieldValue::Bool(*b),
        _ => return None,
    })
}
