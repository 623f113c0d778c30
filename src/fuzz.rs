//! Property-based fuzzing of what parses untrusted input: the task parser,
//! the conversion of a task's JSON headers into AMQP table values, the
//! plugin's delay headers an AMQP ingress reads (against an oracle written
//! another way), and the routing-key encoder (whose exhaustive properties, walked through the
//! routing simulator, live in `cascade::sim`). Each target takes arbitrary
//! bytes, arbitrary JSON, and near-valid tasks (valid fields with one part
//! random), and checks that nothing panics, that every refusal has an API
//! error code, and that what is accepted is what was asked.
//!
//! CI runs proptest's default number of cases; a longer run:
//! `PROPTEST_CASES=100000 cargo test --lib fuzz::`.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lapin::types::AMQPValue;
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::cascade::{Cascade, QueueType};
use crate::message::FieldValue;
use crate::message::properties_of;
use crate::task::{Task, TaskError};

fn cascade() -> Cascade {
    crate::cascade::for_tests(32, 100, QueueType::Quorum)
}

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(1_767_225_600_250)
}

/// The codes a task body can be refused with (all 400 or 422).
const PARSE_CODES: [&str; 9] = [
    "malformed_json",
    "invalid_request",
    "invalid_destination",
    "invalid_delay",
    "delay_out_of_range",
    "invalid_payload",
    "invalid_header",
    "invalid_id",
    "invalid_deadline",
];

fn refused_with_a_code(error: &TaskError) {
    assert!(PARSE_CODES.contains(&error.code()), "{error:?}");
    let status = crate::http::openapi::ERROR_CODES
        .iter()
        .find(|(_, code)| *code == error.code())
        .map(|(status, _)| *status);
    assert!(matches!(status, Some(400 | 422)), "{error:?}");
}

/// Any JSON value, nested a little.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(".{0,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A destination, mostly valid words, sometimes anything.
fn destination() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec("[A-Za-z0-9_-]{1,12}", 1..6).prop_map(|w| w.join(".")),
        1 => ".{0,300}",
    ]
}

/// A delay field, valid or not.
fn delay() -> impl Strategy<Value = (String, Value)> {
    prop_oneof![
        any::<u64>().prop_map(|ms| ("delay_ms".to_owned(), json!(ms))),
        (0u64..10_000_000).prop_map(|ms| ("delay_ms".to_owned(), json!(ms))),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| ("delay_ms".to_owned(), json!(f))),
        "[0-9]{1,6}(ms|s|m|h| )?[0-9]{0,3}(ms|s)?"
            .prop_map(|text| ("delay".to_owned(), json!(text))),
        ".{0,20}".prop_map(|text| ("delay".to_owned(), json!(text))),
        ".{0,30}".prop_map(|text| ("deliver_at".to_owned(), json!(text))),
        (0i64..4_000_000_000).prop_map(|s| {
            let at = UNIX_EPOCH + Duration::from_secs(s.unsigned_abs());
            (
                "deliver_at".to_owned(),
                json!(humantime::format_rfc3339_millis(at).to_string()),
            )
        }),
    ]
}

/// A leeway field, valid or not.
fn leeway() -> impl Strategy<Value = (String, Value)> {
    prop_oneof![
        any::<u64>().prop_map(|ms| ("leeway_ms".to_owned(), json!(ms))),
        (0u64..100_000).prop_map(|ms| ("leeway_ms".to_owned(), json!(ms))),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| ("leeway_ms".to_owned(), json!(f))),
        "[0-9]{1,4}(ms|s|m)?".prop_map(|text| ("leeway".to_owned(), json!(text))),
        ".{0,12}".prop_map(|text| ("leeway".to_owned(), json!(text))),
    ]
}

/// A deadline field (with, sometimes, an expired destination), valid or
/// not: an RFC 3339 time, or how late, in milliseconds or as a duration.
fn deadline() -> impl Strategy<Value = Vec<(String, Value)>> {
    let field = prop_oneof![
        (0u64..300_000_000_000_000).prop_map(|ms| (
            "deadline".to_owned(),
            json!(crate::clock::format_epoch_ms(ms))
        )),
        ".{0,30}".prop_map(|text| ("deadline".to_owned(), json!(text))),
        any::<u64>().prop_map(|ms| ("max_lateness_ms".to_owned(), json!(ms))),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| ("max_lateness_ms".to_owned(), json!(f))),
        "[0-9]{1,6}(ms|s|m|h)?".prop_map(|text| ("max_lateness".to_owned(), json!(text))),
    ];
    let elsewhere =
        prop::option::of(destination().prop_map(|d| ("expired_destination".to_owned(), json!(d))));
    (prop::collection::vec(field, 0..3), elsewhere).prop_map(|(mut fields, elsewhere)| {
        fields.extend(elsewhere);
        fields
    })
}

/// Header values of every kind a caller may send.
fn header_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        ".{0,60}".prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
    ]
}

fn headers() -> impl Strategy<Value = BTreeMap<String, Value>> {
    prop::collection::btree_map("[a-zA-Z][a-zA-Z0-9_.-]{0,20}", header_value(), 0..8)
}

/// A task whose every field is plausible, some of them wrong.
fn near_valid_task() -> impl Strategy<Value = Value> {
    (
        destination(),
        delay(),
        headers(),
        prop::option::of(any_json()),
        prop::option::of("[ -~]{0,300}"),
        prop::option::of(leeway()),
        deadline(),
    )
        .prop_map(
            |(destination, (field, delay), headers, payload, id, leeway, deadline)| {
                let mut task = json!({"destination": destination, "headers": headers});
                task[field] = delay;
                if let Some((field, window)) = leeway {
                    task[field] = window;
                }
                for (field, value) in deadline {
                    task[field] = value;
                }
                if let Some(payload) = payload {
                    task["payload"] = payload;
                }
                if let Some(id) = id {
                    task["id"] = json!(id);
                }
                task
            },
        )
}

/// What an accepted task must be.
fn accepted_as_asked(task: &Task, asked: &Value) {
    assert_eq!(
        Some(task.destination.as_str()),
        asked["destination"].as_str()
    );
    assert!(task.route.routing_key.ends_with(&task.destination));
    // Whole units of quorum queues, less a millisecond a hop and 1 % for
    // a clock catching up.
    let hops = u64::from(task.route.delay_units.count_ones());
    let spent = task.route.delay_units * 100;
    let fast = crate::cascade::ttl_fast_by(spent);
    assert_eq!(task.route.delay_ms, spent - hops - fast);
    // With a leeway (either field), at the moment its id drew in the
    // window, never before.
    if let Some(window) = asked["leeway_ms"].as_u64() {
        assert_eq!(task.leeway_ms, window);
    }
    let offset = crate::task::leeway_offset_ms(&task.id, task.leeway_ms);
    if let Some(ms) = asked["delay_ms"].as_u64() {
        assert!(task.route.delay_ms >= ms + offset, "never early");
        assert!(task.route.delay_ms < ms + offset + 100 + 32);
    }
    // The properties a publish sends are built without panicking, and
    // every header kept its JSON type as an AMQP value.
    let properties = properties_of(&task.message(), None);
    let table = properties.headers().clone().unwrap_or_default();
    for (name, value) in &task.headers {
        let sent = table
            .inner()
            .get(name.as_str())
            .expect("each header is sent");
        let same_kind = matches!(
            (value, sent),
            (FieldValue::Str(_), AMQPValue::LongString(_))
                | (FieldValue::Int(_), AMQPValue::LongLongInt(_))
                | (FieldValue::Float(_), AMQPValue::Double(_))
                | (FieldValue::Bool(_), AMQPValue::Boolean(_))
        );
        assert!(same_kind, "{name}: {value:?} sent as {sent:?}");
    }
    let _ = crate::broker::content_header_frame_size(&properties);
}

/// A request body parser, reduced to whether it took the body.
type BodyParser = fn(&[u8]) -> Result<(), TaskError>;

/// Every parser of a request body, by name.
fn body_parsers() -> [(&'static str, BodyParser); 4] {
    [
        ("task", |b| Task::parse(b, &cascade(), now()).map(drop)),
        ("batch", |b| crate::task::parse_batch(b).map(drop)),
        ("reschedule", |b| {
            crate::task::parse_new_delay(b, cascade().delay_start_ms(now())).map(drop)
        }),
        ("cancel", |b| {
            crate::http::changes::parse_cancel(b).map(drop)
        }),
    ]
}

/// A body each parser takes, before mutation.
fn valid_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(br#"{"destination":"x.y","delay_ms":100000,"payload":1}"#.to_vec()),
        Just(br#"{"tasks":[{"destination":"a","delay_ms":5}]}"#.to_vec()),
        Just(br#"{"delay_ms":100}"#.to_vec()),
        Just(br#"{"ids":["t1","t2"]}"#.to_vec()),
    ]
}

/// A valid body with bytes added after it, before it, inside it, or cut:
/// where a parser that stops at the end of the first value would differ
/// from one that reads the whole body.
fn mutated_body() -> impl Strategy<Value = Vec<u8>> {
    let tail = prop_oneof![
        Just(b" xyz".to_vec()),
        Just(b"}}".to_vec()),
        Just(b"]".to_vec()),
        Just(b" {}".to_vec()),
        Just(b",".to_vec()),
        Just(b"\n\t ".to_vec()),
        Just(b"\0".to_vec()),
        prop::collection::vec(any::<u8>(), 1..8),
    ];
    (valid_body(), tail, any::<prop::sample::Index>(), 0..4u8).prop_map(
        |(mut body, extra, at, how)| {
            let at = at.index(body.len() + 1);
            match how {
                0 => body.extend_from_slice(&extra),
                1 => drop(body.splice(0..0, extra)),
                2 => drop(body.splice(at..at, extra)),
                _ => body.truncate(at),
            };
            body
        },
    )
}

proptest! {
    /// The oracle for what is JSON at all is `serde_json::from_slice`: no
    /// body parser takes a body it refuses (trailing bytes included).
    #[test]
    fn every_body_parser_takes_only_what_serde_json_takes(body in mutated_body()) {
        let is_json = serde_json::from_slice::<Value>(&body).is_ok();
        for (name, parse) in body_parsers() {
            match parse(&body) {
                Ok(()) => prop_assert!(
                    is_json,
                    "the {} parser took {:?}, which is not JSON",
                    name,
                    String::from_utf8_lossy(&body)
                ),
                Err(error) => refused_with_a_code(&error),
            }
        }
    }

    #[test]
    fn the_task_parser_takes_any_bytes(body in prop::collection::vec(any::<u8>(), 0..512)) {
        match Task::parse(&body, &cascade(), now()) {
            Ok(task) => accepted_as_asked(&task, &serde_json::from_slice(&body).unwrap()),
            Err(error) => refused_with_a_code(&error),
        }
    }

    #[test]
    fn the_task_parser_takes_any_json(value in any_json()) {
        let body = serde_json::to_vec(&value).unwrap();
        match Task::parse(&body, &cascade(), now()) {
            Ok(task) => accepted_as_asked(&task, &value),
            Err(error) => refused_with_a_code(&error),
        }
    }

    #[test]
    fn the_task_parser_takes_near_valid_tasks(value in near_valid_task()) {
        let body = serde_json::to_vec(&value).unwrap();
        match Task::parse(&body, &cascade(), now()) {
            Ok(task) => accepted_as_asked(&task, &value),
            Err(error) => refused_with_a_code(&error),
        }
    }

    /// Headers of every JSON kind become AMQP values of the same kind and
    /// the same value; a reserved name is refused, never passed on.
    #[test]
    fn headers_convert_to_amqp_values_of_their_kind(headers in headers()) {
        let value = json!({"destination": "a.b", "delay_ms": 0, "headers": headers});
        let parsed = Task::parse(&serde_json::to_vec(&value).unwrap(), &cascade(), now());
        // The oracle spells the reserved names itself, apart from
        // `crate::message`, so that a name dropped there fails here.
        let reserved = headers.keys().any(|name| {
            let lower = name.to_ascii_lowercase();
            lower.starts_with("x-death") || lower.starts_with("x-first-death")
                || lower.starts_with("x-last-death") || lower == "x-delay-ms"
                || lower == "x-deliver-at-ms" || lower == "x-delayline-revision"
                || name == "CC" || name == "BCC"
        });
        match parsed {
            Ok(task) => {
                prop_assert!(!reserved);
                for (name, sent) in &headers {
                    let kept = task
                        .headers
                        .iter()
                        .find(|(kept, _)| kept == name)
                        .map(|(_, value)| value)
                        .expect("kept");
                    let same = match (sent, kept) {
                        (Value::String(s), FieldValue::Str(k)) => s == k,
                        (Value::Bool(b), FieldValue::Bool(k)) => b == k,
                        (Value::Number(n), FieldValue::Int(k)) => n.as_i64() == Some(*k),
                        (Value::Number(n), FieldValue::Float(k)) => n.as_f64() == Some(*k),
                        _ => false,
                    };
                    prop_assert!(same, "{name}: {sent} kept as {kept:?}");
                }
                accepted_as_asked(&task, &value);
            }
            Err(error) => {
                prop_assert!(reserved, "{error:?}");
                prop_assert_eq!(error.code(), "invalid_header");
            }
        }
    }

    /// Any delay to any destination on any cascade: refused with a reason,
    /// or a key of one binary digit per level (the delay rounded up to the
    /// unit, never down), then the destination, entering at the level of
    /// the highest set digit.
    #[test]
    fn the_routing_key_encoder_takes_any_delay_and_destination(
        levels in 1u32..=40,
        unit_ms in prop_oneof![Just(1u64), Just(10), Just(100), 1u64..=60_000],
        delay_ns in prop_oneof![any::<u64>(), 0u64..100_000_000_000],
        destination in destination(),
        precision in prop_oneof![Just(None), Just(Some(1u64)), (1u64..=60_000).prop_map(Some)],
    ) {
        // A cascade the settings refuse (its top TTL too long) has no routes.
        let settings = crate::cascade::CascadeSettings {
            levels,
            unit_ms,
            queue_type: QueueType::Quorum,
            prefix: "t".into(),
            version: 1,
            business_exchange: Some("biz".into()),
            release_stage: Some(precision.is_some()),
            delivery_key: crate::cascade::DeliveryKey::Digits,
            precision_ms: precision.map(|p| p.min(unit_ms)),
            ..crate::cascade::CascadeSettings::default()
        };
        let Ok(cascade) = settings.validate() else {
            return Ok(());
        };
        let delay = Duration::from_nanos(delay_ns);
        let Ok(route) = cascade.route(delay, &destination) else {
            return Ok(());
        };
        let digits: Vec<&str> = route.routing_key.splitn(levels as usize + 1, '.').collect();
        prop_assert_eq!(digits.len(), levels as usize + 1);
        prop_assert_eq!(digits[levels as usize], destination.as_str());
        let units = digits[..levels as usize]
            .iter()
            .try_fold(0u64, |units, digit| match *digit {
                "0" => Some(units << 1),
                "1" => Some(units << 1 | 1),
                _ => None,
            });
        prop_assert_eq!(units, Some(route.delay_units));
        // Never early: rounded up to the precision; what the levels do not
        // hold, the release stage holds, and only below one unit. Without
        // the stage, what the quorum levels are sure to keep: a millisecond
        // less for each set digit and 1 % of the whole (`least_ms`), which
        // may cost up to `levels` ms more than a unit.
        let precision_ms = cascade.precision_ms();
        let slack = if route.held { 0 } else { u64::from(levels) };
        prop_assert!(u128::from(route.delay_ms) * 1_000_000 >= u128::from(delay_ns));
        prop_assert!(u128::from(route.delay_ms) * 1_000_000 < u128::from(delay_ns) + u128::from(precision_ms + slack) * 1_000_000);
        if route.held {
            prop_assert_eq!(route.delay_ms, route.delay_units * unit_ms + route.hold_ms);
        } else {
            prop_assert_eq!(route.delay_ms, cascade.least_ms(route.delay_units));
        }
        if !route.held && route.delay_units > 0 {
            // The fewest units that keep it that long.
            let fewer_keep = cascade.least_ms(route.delay_units - 1);
            prop_assert!(u128::from(fewer_keep) * 1_000_000 < u128::from(delay_ns));
        }
        if route.held {
            // Never more hops than rounding down; the lead held unless no
            // count of units within the round-delay allowance below the
            // lead has so few hops (searched one by one), and then rounded
            // down; held longer than the lead only by that allowance.
            let rounded_down = route.delay_ms / unit_ms;
            let hops = rounded_down.count_ones();
            prop_assert!(route.delay_units.count_ones() <= hops);
            let lead = cascade.release_lead_ms();
            let with_lead = route.delay_ms.saturating_sub(lead) / unit_ms;
            let allowance = cascade.round_hold_allowance_units(rounded_down);
            let best = (with_lead.saturating_sub(allowance)..=with_lead)
                .rev()
                .find(|units| units.count_ones() <= hops);
            prop_assert_eq!(route.delay_units, best.unwrap_or(rounded_down));
            prop_assert!(route.hold_ms < unit_ms + lead + allowance * unit_ms);
        } else {
            prop_assert!(route.hold_ms < unit_ms + cascade.release_lead_ms());
        }
        prop_assert_eq!(route.held, precision_ms < unit_ms);
        if !route.held {
            prop_assert_eq!(route.hold_ms, 0);
        }
        let expected = match route.delay_units.checked_ilog2() {
            Some(level) => cascade.level_exchange(level),
            None => cascade.due_exchange(),
        };
        prop_assert_eq!(route.entry_exchange, expected);
    }
}

/// Any value a client library might put in `x-delay`: every integer width
/// at its edges and between, doubles and floats (whole, fractional, not
/// finite), strings of digits and signs and spaces and other characters,
/// and other types.
fn delay_header() -> impl Strategy<Value = AMQPValue> {
    prop_oneof![
        any::<i8>().prop_map(AMQPValue::ShortShortInt),
        any::<u8>().prop_map(AMQPValue::ShortShortUInt),
        any::<i16>().prop_map(AMQPValue::ShortInt),
        any::<u16>().prop_map(AMQPValue::ShortUInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<u32>().prop_map(AMQPValue::LongUInt),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        (-1_000_000i64..1_000_000).prop_map(AMQPValue::LongLongInt),
        any::<f64>().prop_map(AMQPValue::Double),
        (-1e6f64..1e6).prop_map(|v| AMQPValue::Double(v.round())),
        any::<f32>().prop_map(AMQPValue::Float),
        "[ +-]{0,2}[0-9]{0,45}[ ]{0,2}".prop_map(|t| AMQPValue::LongString(t.as_str().into())),
        "[ -~]{0,12}".prop_map(|t| AMQPValue::LongString(t.as_str().into())),
        "[0-9]{1,6}".prop_map(|t| AMQPValue::ShortString(t.as_str().into())),
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<u64>().prop_map(AMQPValue::Timestamp),
        Just(AMQPValue::Void),
    ]
}

/// The plugin's contract, said another way: a whole number of
/// milliseconds, or nothing; not positive is now, beyond 64 bits too long.
fn delay_oracle(value: &AMQPValue) -> Option<u64> {
    let whole: i128 = match value {
        AMQPValue::ShortShortInt(v) => (*v).into(),
        AMQPValue::ShortShortUInt(v) => (*v).into(),
        AMQPValue::ShortInt(v) => (*v).into(),
        AMQPValue::ShortUInt(v) => (*v).into(),
        AMQPValue::LongInt(v) => (*v).into(),
        AMQPValue::LongUInt(v) => (*v).into(),
        AMQPValue::LongLongInt(v) => (*v).into(),
        AMQPValue::Double(v) if v.is_finite() && v.trunc() == *v => *v as i128,
        AMQPValue::Float(v) if v.is_finite() && v.trunc() == *v => *v as i128,
        AMQPValue::LongString(s) => {
            let text = std::str::from_utf8(s.as_bytes()).ok()?.trim();
            match text.parse::<i128>() {
                Ok(v) => v,
                // All digits, yet no i128: huge.
                Err(_)
                    if text
                        .trim_start_matches(['-', '+'])
                        .chars()
                        .all(|c| c.is_ascii_digit())
                        && text.chars().any(|c| c.is_ascii_digit())
                        && text.matches(['-', '+']).count() <= 1
                        && !text[1..].contains(['-', '+']) =>
                {
                    if text.starts_with('-') {
                        i128::MIN
                    } else {
                        i128::MAX
                    }
                }
                Err(_) => return None,
            }
        }
        AMQPValue::ShortString(s) => s.as_str().trim().parse().ok()?,
        _ => return None,
    };
    Some(if whole <= 0 {
        0
    } else {
        u64::try_from(whole).unwrap_or(u64::MAX)
    })
}

proptest! {
    /// `x-delay` as an AMQP ingress reads it agrees with the oracle: the
    /// same delay, or refused exactly when the oracle finds no number.
    #[test]
    fn the_plugin_delay_header_reads_as_the_oracle_says(value in delay_header()) {
        let mut headers = lapin::types::FieldTable::default();
        headers.insert("x-delay".into(), value.clone());
        let properties = lapin::BasicProperties::default().with_headers(headers);
        let read = crate::message::due(&properties);
        match delay_oracle(&value) {
            Some(ms) => prop_assert_eq!(read, Ok(crate::message::Due::In(ms)), "{:?}", value),
            None => prop_assert!(
                matches!(read, Err(crate::message::BadDelay::NotAnInteger(_))),
                "{:?} read as {:?}", value, read
            ),
        }
    }

    /// `x-deliver-at` in epoch milliseconds, of any integer type, is the
    /// same instant, a past one now-or-earlier, never one taken for now
    /// that lies beyond 64 bits.
    #[test]
    fn the_deliver_at_header_reads_epoch_milliseconds(value in delay_header()) {
        let mut headers = lapin::types::FieldTable::default();
        headers.insert("x-deliver-at".into(), value.clone());
        let properties = lapin::BasicProperties::default().with_headers(headers);
        let read = crate::message::due(&properties);
        match (&value, delay_oracle(&value)) {
            (AMQPValue::Timestamp(seconds), _) => prop_assert_eq!(
                read, Ok(crate::message::Due::At(seconds.saturating_mul(1000)))
            ),
            (_, Some(ms)) => prop_assert_eq!(read, Ok(crate::message::Due::At(ms)), "{:?}", value),
            // Not a number: an RFC 3339 time, or refused.
            (_, None) => prop_assert!(
                matches!(read, Ok(crate::message::Due::At(_)) | Err(crate::message::BadDelay::NotATime(_))),
                "{:?} read as {:?}", value, read
            ),
        }
    }
}

/// What a retry intake reads of `x-delayline-attempt`, said another way: a
/// whole number the header holds as an integer (or as text), from 1 to
/// `u32::MAX`; the first attempt otherwise.
fn attempt_oracle(value: &AMQPValue) -> u32 {
    let whole: Option<i64> = match value {
        AMQPValue::LongLongInt(v) => Some(*v),
        AMQPValue::LongInt(v) => Some((*v).into()),
        AMQPValue::LongUInt(v) => Some((*v).into()),
        AMQPValue::ShortInt(v) => Some((*v).into()),
        AMQPValue::ShortUInt(v) => Some((*v).into()),
        AMQPValue::Timestamp(v) => i64::try_from(*v).ok(),
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes())
            .ok()
            .and_then(|t| t.parse().ok()),
        _ => None,
    };
    whole
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// An `x-death` header of any shape: an array of tables whose `queue` and
/// `reason` are of any type (or missing), or not an array at all.
fn death_header() -> impl Strategy<Value = AMQPValue> {
    let field = prop_oneof![
        "[ -~]{0,12}".prop_map(|t| Some(AMQPValue::LongString(t.as_str().into()))),
        "[a-z]{0,8}".prop_map(|t| Some(AMQPValue::ShortString(t.as_str().into()))),
        delay_header().prop_map(Some),
        Just(None),
    ];
    let entry = (field.clone(), field).prop_map(|(queue, reason)| {
        let mut table = lapin::types::FieldTable::default();
        for (name, value) in [("queue", queue), ("reason", reason)] {
            if let Some(value) = value {
                table.insert(name.into(), value);
            }
        }
        AMQPValue::FieldTable(table)
    });
    prop_oneof![
        prop::collection::vec(prop_oneof![entry, delay_header()], 0..4)
            .prop_map(|entries| AMQPValue::FieldArray(entries.into())),
        delay_header(),
    ]
}

proptest! {
    /// Where a dead-lettered message died and which attempt it was, read
    /// from headers of any shape: never a panic; the queue only when the
    /// newest entry is a table naming one as text; the attempt as the
    /// oracle says; and what comes back always carries the next attempt.
    #[test]
    fn a_dead_lettered_messages_headers_read_as_the_oracle_says(
        death in death_header(),
        attempt in delay_header(),
    ) {
        let mut headers = lapin::types::FieldTable::default();
        headers.insert("x-death".into(), death.clone());
        headers.insert("x-delayline-attempt".into(), attempt.clone());
        let properties = lapin::BasicProperties::default().with_headers(headers);
        let expected_queue = match &death {
            AMQPValue::FieldArray(entries) => match entries.as_slice().first() {
                Some(AMQPValue::FieldTable(table)) => match table.inner().get("queue") {
                    Some(AMQPValue::LongString(s)) => std::str::from_utf8(s.as_bytes()).ok().map(str::to_owned),
                    Some(AMQPValue::ShortString(s)) => Some(s.as_str().to_owned()),
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        }
        .filter(|queue| !queue.is_empty());
        let read = crate::message::last_death(&properties).map(|d| d.queue);
        prop_assert_eq!(read, expected_queue);
        let failed = crate::message::attempt(&properties);
        prop_assert_eq!(failed, attempt_oracle(&attempt), "{:?}", attempt);
        let next = failed.saturating_add(1);
        let back = crate::message::for_retry(&properties, "q", next, None);
        prop_assert_eq!(crate::message::attempt(&back), next);
        let kept = back.headers().clone().unwrap_or_default();
        prop_assert!(!kept.inner().contains_key("x-death"));
    }
}

proptest! {
    /// With the release stage, a near-valid task with deadline fields is
    /// refused with a code, or accepted with a deadline no earlier than its
    /// moment and no later than an RFC 3339 time can say (its answer shows
    /// it as one), and an expired destination only beside a deadline.
    #[test]
    fn a_deadline_is_refused_with_a_code_or_kept_within_what_can_be_shown(
        value in near_valid_task(),
    ) {
        let staged = crate::cascade::sharded_for_tests(32, 100, 1);
        let body = serde_json::to_vec(&value).unwrap();
        match Task::parse(&body, &staged, now()) {
            Err(error) => refused_with_a_code(&error),
            Ok(task) => {
                if let Some(deadline) = task.deadline_ms {
                    prop_assert!(deadline >= task.deliver_at_ms, "{value}");
                    prop_assert!(deadline <= crate::task::deadline::LATEST_MS);
                    let shown = task.accepted(crate::task::TaskState::Pending).deadline;
                    let shown = shown.as_deref().and_then(crate::clock::parse_epoch_ms);
                    prop_assert_eq!(shown, Some(deadline));
                }
                prop_assert!(task.expired_destination.is_none() || task.deadline_ms.is_some());
            }
        }
    }

    /// A retry time a consumer asks for, in headers of any kind: read
    /// without panicking; a wait is never in the past; a number given as
    /// the time is that instant.
    #[test]
    fn a_consumers_retry_headers_read_without_panicking(
        at in prop::option::of(delay_header()),
        after in prop::option::of(delay_header()),
    ) {
        use crate::message::{RETRY_AFTER_HEADER, RETRY_AT_HEADER, RETRY_QUEUE_HEADER};
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(RETRY_QUEUE_HEADER.into(), AMQPValue::LongString("q".into()));
        for (name, value) in [(RETRY_AT_HEADER, &at), (RETRY_AFTER_HEADER, &after)] {
            if let Some(value) = value {
                headers.insert(name.into(), value.clone());
            }
        }
        let properties = lapin::BasicProperties::default().with_headers(headers);
        let now_ms = 1_767_225_600_250;
        let asked = crate::message::asked_retry(&properties, now_ms);
        let Some(Ok(asked)) = asked else { return Ok(()) };
        prop_assert_eq!(asked.queue.as_str(), "q");
        match (&at, &after) {
            (None, Some(_)) => prop_assert!(asked.at_ms >= now_ms),
            (Some(AMQPValue::LongLongInt(ms)), None) => {
                prop_assert_eq!(i64::try_from(asked.at_ms).ok(), Some(*ms));
            }
            (Some(_), None) => {}
            both => prop_assert!(false, "both or neither taken: {:?}", both),
        }
    }
}

/// A retry policy's body, each field valid, absent or random (what
/// `PUT /v1/retries/policies/{name}` reads; admins only, but untrusted all
/// the same).
fn near_valid_policy() -> impl Strategy<Value = Value> {
    let duration = prop_oneof![
        Just(json!("1s")),
        Just(json!("250ms")),
        Just(json!("1500us")),
        Just(json!("99999999999y")),
        Just(json!("0s")),
        "[0-9]{1,12}(ns|us|ms|s|m|h|d)".prop_map(Value::from),
        any_json(),
    ];
    let number = prop_oneof![
        any::<f64>()
            .prop_map(|n| serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number)),
        any::<i64>().prop_map(Value::from),
        any_json(),
    ];
    let fields = (
        prop::option::of(duration.clone()),
        prop::option::of(number.clone()),
        prop::option::of(duration.clone()),
        prop::option::of(number.clone()),
        prop::option::of(number),
        prop::option::of(duration),
        prop::option::of(prop_oneof![
            Just(json!(["orders"])),
            Just(json!(["a", "a"])),
            any_json()
        ]),
    );
    fields.prop_map(
        |(initial, multiplier, max_delay, jitter, attempts, give_up, queues)| {
            let mut body = json!({"queues": ["orders"]});
            let named = [
                ("initial", initial),
                ("multiplier", multiplier),
                ("max_delay", max_delay),
                ("jitter", jitter),
                ("max_attempts", attempts),
                ("give_up_after", give_up),
                ("queues", queues),
            ];
            for (name, value) in named {
                if let Some(value) = value {
                    body[name] = value;
                }
            }
            body
        },
    )
}

proptest! {
    /// A policy body is refused, naming a setting, or becomes a policy
    /// whose every wait is at least 1 ms, within the chain, and grows.
    #[test]
    fn a_retry_policy_body_is_refused_or_keeps_its_promises(value in near_valid_policy()) {
        let chain = crate::cascade::sharded_for_tests(20, 10, 1);
        let Ok(mut settings) = serde_json::from_value::<crate::ingress::RetrySettings>(value) else {
            return Ok(());
        };
        settings.name = "p".into();
        match settings.validate(&chain) {
            Err(error) => prop_assert!(!error.setting.is_empty()),
            Ok(policy) => {
                prop_assert!(policy.initial_ms >= 1 && policy.max_delay_ms >= policy.initial_ms);
                prop_assert!(policy.multiplier >= 1.0 && (0.0..=1.0).contains(&policy.jitter));
                prop_assert!(policy.max_attempts >= 1);
                for failed in 1..=policy.max_attempts.min(64) {
                    let wait = policy.backoff_ms(failed, 1.0);
                    prop_assert!(wait >= policy.initial_ms && wait <= chain.max_delay_ms());
                }
            }
        }
    }
}
