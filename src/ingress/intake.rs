//! One message taken in over AMQP, as pure logic: accepted as a [`Task`],
//! or refused with a reason. No I/O; the clock is an argument.

use std::time::{Duration, SystemTime};

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use sha2::{Digest, Sha256};

use super::names::retry_destination;
use super::settings::Ingress;
use crate::cascade::{Cascade, MAX_NAME_BYTES, RouteError, validate_destination};
use crate::message::FieldValue;
use crate::message::{self, BadDelay, Due, PLUGIN_DELAY_HEADER};
use crate::task::{Itinerary, Task, TaskParts};

/// The destination of a task whose routing key cannot be one (empty, as
/// for a fanout or headers exchange, or with characters a destination may
/// not hold). The key itself travels with the message and is delivered.
pub const KEYLESS_DESTINATION: &str = "_";

/// Why a message is refused; it goes to the ingress's refused queue with
/// [`Refusal::code`] and the reason in headers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    BadDelay(#[from] BadDelay),
    #[error("{0}")]
    DelayTooLong(String),
    #[error("routing key {0:?} matches none of this ingress's routing_keys")]
    KeyNotAccepted(String),
    #[error("message_id must be 1 to {MAX_NAME_BYTES} bytes without control characters")]
    InvalidMessageId,
    #[error("message_id {0:?} was already taken for a different message")]
    MessageIdConflict(String),
    #[error("{0}")]
    TooLarge(String),
}

impl Refusal {
    /// Stable, for the refused message's header and the metric's label.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::BadDelay(_) => "bad_delay",
            Refusal::DelayTooLong(_) => "delay_too_long",
            Refusal::KeyNotAccepted(_) => "routing_key_not_accepted",
            Refusal::InvalidMessageId => "invalid_message_id",
            Refusal::MessageIdConflict(_) => "message_id_conflict",
            Refusal::TooLarge(_) => "too_large",
        }
    }
}

/// An accepted message.
#[derive(Clone, Debug, PartialEq)]
pub struct Taken {
    pub task: Task,
    /// With a `message_id`: what identifies the message, so that a
    /// producer's retry is one task and another message with its id a
    /// conflict.
    pub fingerprint: Option<String>,
}

/// The task of a message published to `ingress` with `routing_key`,
/// received at `now`.
pub fn take(
    ingress: &Ingress,
    cascade: &Cascade,
    routing_key: &str,
    payload: &[u8],
    properties: &BasicProperties,
    now: SystemTime,
) -> Result<Taken, Refusal> {
    let properties = &message::as_published(properties);
    if !ingress.accepts(routing_key) {
        return Err(Refusal::KeyNotAccepted(routing_key.to_owned()));
    }
    let accepted_at_ms = cascade.delay_start_ms(now);
    let (delay_ms, asked_delay) = match message::due(properties)? {
        Due::In(ms) => (
            ms,
            has_header(properties, PLUGIN_DELAY_HEADER).then_some(ms),
        ),
        Due::At(at_ms) => (at_ms.saturating_sub(accepted_at_ms), None),
    };
    let destination = destination_of(routing_key, cascade);
    let (id, fingerprint) = match properties.message_id() {
        Some(id) => {
            let id = id.as_str();
            if id.is_empty() || id.chars().any(char::is_control) {
                return Err(Refusal::InvalidMessageId);
            }
            let fingerprint = fingerprint(&ingress.exchange, routing_key, payload, properties);
            (id.to_owned(), Some(fingerprint))
        }
        None => (uuid::Uuid::now_v7().to_string(), None),
    };
    let itinerary = Itinerary::new(
        cascade,
        &id,
        destination,
        Duration::from_millis(delay_ms),
        accepted_at_ms,
    )
    .map_err(|error| match error {
        RouteError::DelayTooLong { .. } => Refusal::DelayTooLong(error.to_string()),
        // The destination was checked: only the delay can be wrong.
        other => Refusal::DelayTooLong(other.to_string()),
    })?;
    let carried = message::taken_in(properties, &ingress.deliver_to, routing_key, asked_delay);
    let parts = TaskParts {
        client_id: fingerprint.is_some(),
        id,
        destination: destination.to_owned(),
        payload: payload.to_vec(),
        content_type: properties
            .content_type()
            .as_ref()
            .map_or("application/octet-stream", |t| t.as_str())
            .to_owned(),
        headers: header_copy(properties),
        revision: 1,
        client: None,
        exchange: ingress.declared_kind.map(|_| ingress.deliver_to.clone()),
        leeway_ms: 0,
        deadline_ms: None,
        expired_destination: None,
        carried: Some(carried),
    };
    Ok(Taken {
        task: Task::new(parts, itinerary),
        fingerprint,
    })
}

/// The task of a message a retry policy brings back to `queue` (by the
/// default exchange) after `delay_ms`, waiting with `carried` (see
/// [`message::for_retry`]); `id` is the attempt's own (a replay's is
/// derived from what it replays, so that doing it again is one task).
/// With `max_lateness_ms`, its deadline is that long after it is due.
pub(super) fn retry_task(
    cascade: &Cascade,
    id: String,
    queue: &str,
    (delay_ms, max_lateness_ms): (u64, Option<u64>),
    (payload, carried): (&[u8], BasicProperties),
    now: SystemTime,
) -> Result<Task, Refusal> {
    let accepted_at_ms = cascade.delay_start_ms(now);
    let destination = retry_destination(queue, cascade.max_destination_bytes());
    let itinerary = Itinerary::new(
        cascade,
        &id,
        &destination,
        Duration::from_millis(delay_ms),
        accepted_at_ms,
    )
    .map_err(|error| Refusal::DelayTooLong(error.to_string()))?;
    let parts = TaskParts {
        client_id: false,
        id,
        destination,
        payload: payload.to_vec(),
        content_type: carried
            .content_type()
            .as_ref()
            .map_or("application/octet-stream", |t| t.as_str())
            .to_owned(),
        headers: header_copy(&carried),
        revision: 1,
        client: None,
        exchange: Some(String::new()),
        leeway_ms: 0,
        deadline_ms: max_lateness_ms.map(|ms| itinerary.deliver_at_ms.saturating_add(ms)),
        expired_destination: None,
        carried: Some(carried),
    };
    Ok(Task::new(parts, itinerary))
}

/// The routing key when it can be a destination (listed and filtered by),
/// otherwise [`KEYLESS_DESTINATION`].
fn destination_of<'k>(routing_key: &'k str, cascade: &Cascade) -> &'k str {
    if routing_key.len() <= cascade.max_destination_bytes()
        && validate_destination(routing_key).is_ok()
    {
        routing_key
    } else {
        KEYLESS_DESTINATION
    }
}

fn has_header(properties: &BasicProperties, name: &str) -> bool {
    properties
        .headers()
        .as_ref()
        .is_some_and(|h| h.inner().contains_key(name))
}

/// What the message was, as published: a retry after a lost confirm is the
/// same bytes.
fn fingerprint(
    exchange: &str,
    routing_key: &str,
    payload: &[u8],
    properties: &BasicProperties,
) -> String {
    let mut hash = Sha256::new();
    for part in [exchange.as_bytes(), routing_key.as_bytes()] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hash.update(message::encode_properties(properties));
    hash.update(payload);
    format!("{:x}", hash.finalize())
}

/// The headers the ledger shows for inspection: those of a type a task's
/// headers can hold.
fn header_copy(properties: &BasicProperties) -> Vec<(String, FieldValue)> {
    let Some(headers) = properties.headers() else {
        return Vec::new();
    };
    headers
        .inner()
        .iter()
        .filter(|(name, _)| !message::is_reserved_header(name.as_str()))
        .filter_map(|(name, value)| {
            let value = match value {
                AMQPValue::LongString(s) => {
                    FieldValue::Str(String::from_utf8(s.as_bytes().to_vec()).ok()?)
                }
                AMQPValue::ShortString(s) => FieldValue::Str(s.as_str().to_owned()),
                AMQPValue::LongLongInt(i) => FieldValue::Int(*i),
                AMQPValue::LongInt(i) => FieldValue::Int(i64::from(*i)),
                AMQPValue::ShortInt(i) => FieldValue::Int(i64::from(*i)),
                AMQPValue::Double(f) => FieldValue::Float(*f),
                AMQPValue::Boolean(b) => FieldValue::Bool(*b),
                _ => return None,
            };
            Some((name.to_string(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use lapin::types::{FieldTable, LongString, ShortString};

    use super::*;
    use crate::cascade::CascadeSettings;
    use crate::ingress::IngressSettings;

    const NOW_MS: u64 = 1_700_000_000_000;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(NOW_MS)
    }

    fn chain() -> Cascade {
        CascadeSettings {
            levels: 8,
            unit_ms: 10,
            release_stage: Some(true),
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap()
    }

    fn ingress(routing_keys: &[&str]) -> Ingress {
        IngressSettings {
            exchange: "orders.delayed".into(),
            deliver_to: Some("orders".into()),
            kind: "direct".into(),
            routing_keys: routing_keys.iter().map(|k| k.to_string()).collect(),
        }
        .validate(&chain())
        .unwrap()
    }

    fn with_headers(pairs: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut headers = FieldTable::default();
        for (name, value) in pairs {
            headers.insert(ShortString::from(*name), value.clone());
        }
        BasicProperties::default().with_headers(headers)
    }

    #[test]
    fn a_message_goes_through_the_shard_its_id_names() {
        let cascade = crate::cascade::sharded_for_tests(8, 10, 3);
        let ingress = IngressSettings {
            exchange: "orders.delayed".into(),
            deliver_to: Some("orders".into()),
            kind: "direct".into(),
            routing_keys: Vec::new(),
        }
        .validate(&cascade)
        .unwrap();
        for n in 0..12 {
            let properties = with_headers(&[("x-delay", AMQPValue::LongInt(55))])
                .with_message_id(format!("m-{n}").into());
            let taken = take(&ingress, &cascade, "eu", b"{}", &properties, now()).unwrap();
            let shard = cascade.for_task(&taken.task.id);
            // Four 10 ms units, from level 2 down.
            assert_eq!(taken.task.route.entry_exchange, shard.level_exchange(2));
        }
    }

    #[test]
    fn a_plugin_message_becomes_a_task_delivered_as_it_came_never_early() {
        let properties = with_headers(&[
            ("x-delay", AMQPValue::LongInt(55)),
            ("tenant", AMQPValue::LongString(LongString::from("acme"))),
        ])
        .with_message_id("m-1".into())
        .with_correlation_id("c".into())
        .with_expiration("60000".into())
        .with_user_id("someone".into())
        .with_priority(3);
        let taken = take(
            &ingress(&[]),
            &chain(),
            "eu.order",
            b"{}",
            &properties,
            now(),
        )
        .unwrap();
        let task = &taken.task;
        assert_eq!(task.id, "m-1");
        assert!(task.client_id && taken.fingerprint.is_some());
        assert_eq!(task.destination, "eu.order");
        // 55 ms: four 10 ms units in the levels, 15 ms held by the release
        // stage (a unit's lead, and the 5 ms below the unit).
        assert_eq!(task.route.delay_ms, 55);
        assert_eq!((task.route.delay_units, task.route.hold_ms), (4, 15));
        assert_eq!(task.deliver_at_ms, NOW_MS + 55);
        let message = message::of_task(&task.message());
        let released = message::released(
            &message.routing_key,
            message.payload.clone(),
            &message.properties,
            &chain(),
        );
        assert_eq!(released.exchange, "orders");
        assert_eq!(released.routing_key, "eu.order");
        let delivered = &released.properties;
        assert_eq!(delivered.expiration().as_ref().unwrap().as_str(), "60000");
        assert_eq!(delivered.user_id(), &None);
        assert_eq!(delivered.priority(), &Some(3));
        assert_eq!(delivered.correlation_id().as_ref().unwrap().as_str(), "c");
        assert_eq!(delivered.message_id().as_ref().unwrap().as_str(), "m-1");
        let headers = delivered.headers().as_ref().unwrap().inner();
        assert_eq!(headers.get("x-delay"), Some(&AMQPValue::LongLongInt(-55)));
        assert_eq!(
            headers.get("tenant"),
            Some(&AMQPValue::LongString("acme".into()))
        );
        assert_eq!(
            headers.get(message::USER_ID_HEADER),
            Some(&AMQPValue::LongString("someone".into()))
        );
        assert!(!headers.contains_key(message::DELIVERY_KEY_HEADER));
        // The stamp it waited with is delayline's, not the consumer's.
        assert!(message::Stamp::read(&message.properties).is_some());
        assert!(!headers.contains_key(message::HOLD_HEADER));
        assert_eq!(
            headers.get(message::DELIVER_TO_HEADER),
            Some(&AMQPValue::LongString("orders".into()))
        );
        // While it waits the broker cannot expire it.
        assert_eq!(message.properties.expiration(), &None);
    }

    #[test]
    fn routing_headers_route_once_at_the_ingress_not_again() {
        let keys = AMQPValue::FieldArray(vec![AMQPValue::LongString("1.1.x".into())].into());
        let properties = with_headers(&[("CC", keys.clone()), ("BCC", keys), ("kept", text())]);
        let task = take(&ingress(&[]), &chain(), "k", b"", &properties, now())
            .unwrap()
            .task;
        let message = message::of_task(&task.message());
        let headers = message.properties.headers().clone().unwrap();
        assert!(!headers.inner().contains_key("CC") && !headers.inner().contains_key("BCC"));
        assert!(headers.inner().contains_key("kept"));
    }

    fn text() -> AMQPValue {
        AMQPValue::LongString(LongString::from("v"))
    }

    #[test]
    fn a_retry_is_the_same_message_and_another_message_is_not() {
        let properties = BasicProperties::default().with_message_id("m".into());
        let take =
            |body: &[u8]| take(&ingress(&[]), &chain(), "k", body, &properties, now()).unwrap();
        assert_eq!(take(b"a").fingerprint, take(b"a").fingerprint);
        assert_ne!(take(b"a").fingerprint, take(b"b").fingerprint);
        let anonymous = BasicProperties::default();
        let first = super::take(&ingress(&[]), &chain(), "k", b"", &anonymous, now()).unwrap();
        assert_eq!(first.fingerprint, None);
        assert!(!first.task.client_id);
    }

    #[test]
    fn a_redelivery_is_the_message_as_published_without_the_queues_counts() {
        let published = with_headers(&[("x-delay", AMQPValue::LongInt(20)), ("kept", text())])
            .with_message_id("m".into());
        let redelivered = with_headers(&[
            ("x-delay", AMQPValue::LongInt(20)),
            ("kept", text()),
            ("x-delivery-count", AMQPValue::LongLongInt(1)),
            ("x-acquired-count", AMQPValue::LongLongInt(2)),
        ])
        .with_message_id("m".into());
        let take =
            |p: &BasicProperties| take(&ingress(&[]), &chain(), "k", b"a", p, now()).unwrap();
        let (first, again) = (take(&published), take(&redelivered));
        assert_eq!(
            first.fingerprint, again.fingerprint,
            "a retry, not a conflict"
        );
        assert_eq!(again.task.headers, first.task.headers);
        assert!(
            again
                .task
                .headers
                .iter()
                .all(|(name, _)| !message::is_queue_delivery_header(name)),
            "{:?}",
            again.task.headers
        );
        let delivered = message::of_task(&again.task.message()).properties;
        let names: Vec<String> = delivered
            .headers()
            .as_ref()
            .unwrap()
            .inner()
            .keys()
            .map(|k| k.to_string())
            .collect();
        assert!(
            names.iter().all(|n| !message::is_queue_delivery_header(n)),
            "{names:?}"
        );
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let take = |key: &str, properties: BasicProperties, ingress: &Ingress| {
            take(ingress, &chain(), key, b"", &properties, now()).map(|t| t.task)
        };
        let open = ingress(&[]);
        let bad = with_headers(&[("x-delay", AMQPValue::LongString("soon".into()))]);
        assert_eq!(take("k", bad, &open).unwrap_err().code(), "bad_delay");
        let far = with_headers(&[("x-delay", AMQPValue::LongLongInt(1 << 40))]);
        assert_eq!(take("k", far, &open).unwrap_err().code(), "delay_too_long");
        let picky = ingress(&["eu.*"]);
        let plain = BasicProperties::default();
        assert_eq!(
            take("us.order", plain.clone(), &picky).unwrap_err().code(),
            "routing_key_not_accepted"
        );
        assert!(take("eu.order", plain.clone(), &picky).is_ok());
        let control = plain.clone().with_message_id("a\nb".into());
        assert_eq!(
            take("k", control, &open).unwrap_err().code(),
            "invalid_message_id"
        );
    }

    #[test]
    fn a_key_that_cannot_be_a_destination_is_still_delivered_with() {
        for key in ["", "a..b", "with space", "ünï"] {
            let task = take(
                &ingress(&[]),
                &chain(),
                key,
                b"",
                &BasicProperties::default(),
                now(),
            )
            .unwrap()
            .task;
            assert_eq!(task.destination, KEYLESS_DESTINATION);
            let message = message::of_task(&task.message());
            let released =
                message::released(&message.routing_key, vec![], &message.properties, &chain());
            assert_eq!(released.routing_key, key);
        }
    }

    #[test]
    fn a_due_time_in_the_past_is_due_now() {
        let properties =
            with_headers(&[("x-deliver-at", AMQPValue::LongLongInt(NOW_MS as i64 - 5))]);
        let task = take(&ingress(&[]), &chain(), "k", b"", &properties, now())
            .unwrap()
            .task;
        assert_eq!(task.route.delay_ms, 0);
    }
}
