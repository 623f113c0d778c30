use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

use super::headers::{DELIVERY_KEY_HEADER, EXPIRATION_HEADER, HOLD_HEADER, ORIGINAL_ID_HEADER};
use super::*;
use crate::cascade::{Cascade, CascadeSettings};
use crate::task::{Itinerary, Task, TaskParts};

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
        let itinerary = Itinerary::new(&cascade, &id, &destination, delay, accepted_at_ms).unwrap();
        let parts = TaskParts {
            id,
            client_id: false,
            destination,
            payload,
            content_type: "application/json".to_owned(),
            headers: headers
                .into_iter()
                .filter(|(name, _)| !is_reserved_header(name))
                .collect(),
            revision,
            client: None,
            exchange: None,
            leeway_ms: 0,
            deadline_ms: None,
            expired_destination: None,
            carried: None,
        };
        let task = Task::new(parts, itinerary);
        (task, levels)
    }
}

proptest! {
    /// Build then read gives back what was built, for any task.
    #[test]
    fn a_tasks_message_reads_back_as_the_task((task, levels) in task()) {
        let message = of_task(&task.message());
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
    let body =
        br#"{"destination":"billing.invoice","delay_ms":250,"headers":{"tenant":"acme","n":3}}"#;
    let task = Task::parse(body, &cascade(8), accepted_now()).unwrap();
    let message = of_task(&task.message());
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

/// Header names a released message is built from or leaves behind, in
/// the cases a client or the broker may spell them, beside a client's own.
fn release_header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(DELIVER_TO_HEADER.to_owned()),
        Just(DELIVERY_KEY_HEADER.to_owned()),
        Just(EXPIRATION_HEADER.to_owned()),
        Just(EXPIRATION_HEADER.to_ascii_uppercase()),
        Just(HOLD_HEADER.to_owned()),
        Just(ORIGINAL_ID_HEADER.to_owned()),
        Just("X-Delayline-Message-Id".to_owned()),
        Just("x-death".to_owned()),
        Just("X-First-Death-Queue".to_owned()),
        Just("x-last-death-reason".to_owned()),
        Just("x-delivery-count".to_owned()),
        Just("X-Acquired-Count".to_owned()),
        "[a-z][a-z0-9-]{0,12}",
    ]
}

prop_compose! {
    /// Properties of a message taken in over AMQP, with any of the headers
    /// a release reads or drops.
    fn carried()(
        headers in proptest::collection::btree_map(
            release_header_name(),
            prop_oneof![
                "[ -~]{0,10}".prop_map(|s| AMQPValue::LongString(s.into())),
                any::<i64>().prop_map(AMQPValue::LongLongInt),
            ],
            0..8,
        ),
        expiration in proptest::option::of("[0-9]{1,6}"),
        message_id in proptest::option::of("[a-z0-9]{1,8}"),
        user_id in proptest::option::of("[a-z]{1,8}"),
        priority in proptest::option::of(0u8..10),
    ) -> BasicProperties {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert(name.as_str().into(), value);
        }
        let mut properties = BasicProperties::default().with_headers(table);
        if let Some(expiration) = expiration {
            properties = properties.with_expiration(expiration.as_str().into());
        }
        if let Some(id) = message_id {
            properties = properties.with_message_id(id.as_str().into());
        }
        if let Some(user) = user_id {
            properties = properties.with_user_id(user.as_str().into());
        }
        if let Some(priority) = priority {
            properties = properties.with_priority(priority);
        }
        properties
    }
}

/// [`released`] as it was written before it took the headers apart in one
/// pass: the reference the one-pass version must equal.
fn released_as_before(
    routing_key: &str,
    payload: Vec<u8>,
    properties: &BasicProperties,
    cascade: &Cascade,
) -> Message {
    use super::publish::{rebuilt, without_headers};
    use super::read::text_header;
    let exchange = text_header(properties, DELIVER_TO_HEADER);
    let key = text_header(properties, DELIVERY_KEY_HEADER);
    let expiration = text_header(properties, EXPIRATION_HEADER);
    let original_id = text_header(properties, ORIGINAL_ID_HEADER);
    let dropped = [
        DELIVERY_KEY_HEADER,
        EXPIRATION_HEADER,
        HOLD_HEADER,
        ORIGINAL_ID_HEADER,
    ];
    let mut kept = without_headers(properties, &dropped);
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

fn same_message(a: &Message, b: &Message) -> Result<(), TestCaseError> {
    prop_assert_eq!(&a.exchange, &b.exchange);
    prop_assert_eq!(&a.routing_key, &b.routing_key);
    prop_assert_eq!(&a.payload, &b.payload);
    prop_assert_eq!(&a.properties, &b.properties);
    Ok(())
}

proptest! {
    /// The one-pass release keeps, drops and restores what the release
    /// always did, whatever headers a message carries.
    #[test]
    fn a_release_in_one_pass_is_the_release_as_before(
        properties in carried(),
        levels in 1u32..=8,
        key in "[01](\\.[01]){0,7}\\.[a-z]{1,6}",
    ) {
        let cascade = cascade(levels);
        let payload = b"{}".to_vec();
        let new = released(&key, payload.clone(), &properties, &cascade);
        let old = released_as_before(&key, payload, &properties, &cascade);
        same_message(&new, &old)?;
    }

    /// A task's release message built straight from the task is the one
    /// its cascade message was released as, stamped or not, taken in over
    /// AMQP or over HTTP, to the business exchange or its own.
    #[test]
    fn a_task_released_straight_is_its_cascade_message_released(
        (mut task, levels) in task(),
        carried in proptest::option::of(carried()),
        exchange in proptest::option::of("[a-z]{1,8}"),
        release_stage in any::<bool>(),
    ) {
        task.carried = carried;
        task.exchange = exchange;
        let cascade = CascadeSettings {
            levels,
            unit_ms: 10,
            release_stage: Some(release_stage),
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap();
        task.route = cascade.route(Duration::from_millis(task.granted_delay_ms()), &task.destination).unwrap();
        prop_assert_eq!(task.route.held, release_stage);
        let through = of_task(&task.message());
        let before = released(&through.routing_key, through.payload, &through.properties, &cascade);
        let straight = released_of_task(&task.message(), task.payload.clone(), &cascade);
        same_message(&straight, &before)?;
    }
}
