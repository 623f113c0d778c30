//! A dead-lettered message as a retry intake reads it (where it died, and
//! which attempt that was), and the properties it waits and comes back
//! with. Pure.
//!
//! What comes back is what left: body, properties and the user's headers,
//! with [`ATTEMPT_HEADER`] saying which attempt the delivery is. The
//! broker's `x-death` history (and `x-first-death-*`, `x-last-death-*`) is
//! removed: it named the consumer's queue once per failure and grew with
//! every attempt; the attempt header says what it said. While it waits, the
//! message's `message_id` is its task's (one task per attempt) and its own
//! travels in [`ORIGINAL_ID_HEADER`], restored on delivery.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use super::headers::*;
use super::publish::{as_published, taken_in};
use super::read::{header_i64, message_id};

/// Where and why RabbitMQ last dead-lettered a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Death {
    /// The queue it died in: the one a retry brings it back to.
    pub queue: String,
    /// `rejected`, `expired`, `maxlen` or `delivery_limit`.
    pub reason: String,
}

/// The most recent death `x-death` records; `None` for a message that was
/// not dead-lettered (published to the retry exchange by hand).
pub fn last_death(properties: &BasicProperties) -> Option<Death> {
    let headers = properties.headers().as_ref()?;
    let AMQPValue::FieldArray(deaths) = headers.inner().get(DEATH_HEADER)? else {
        return None;
    };
    let AMQPValue::FieldTable(last) = deaths.as_slice().first()? else {
        return None;
    };
    let text = |name: &str| match last.inner().get(name)? {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok(),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    };
    Some(Death {
        queue: text("queue").filter(|q| !q.is_empty())?,
        reason: text("reason").unwrap_or_else(|| "unknown".to_owned()),
    })
}

/// A retry a consumer asked for by publishing the failed message to the
/// retry exchange itself (see [`RETRY_QUEUE_HEADER`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AskedRetry {
    /// The queue it failed in, which it comes back to.
    pub queue: String,
    /// When it comes back, epoch milliseconds.
    pub at_ms: u64,
}

/// The retry a message asks for with [`RETRY_QUEUE_HEADER`] and one of
/// [`RETRY_AT_HEADER`] and [`RETRY_AFTER_HEADER`], read at `now_ms`: `None`
/// when it names no queue; the error says what is wrong with the rest.
pub fn asked_retry(
    properties: &BasicProperties,
    now_ms: u64,
) -> Option<Result<AskedRetry, String>> {
    let queue = text_of(properties, RETRY_QUEUE_HEADER)?;
    let headers = properties.headers().as_ref()?.inner();
    let at = |value: &AMQPValue| match value {
        AMQPValue::LongString(text) => {
            let text = String::from_utf8_lossy(text.as_bytes());
            let digits = text.trim().parse::<u64>().ok();
            digits
                .or_else(|| crate::clock::parse_epoch_ms(&text))
                .ok_or_else(|| {
                    format!(
                        "{RETRY_AT_HEADER}: {text:?} is neither epoch milliseconds nor an RFC \
                         3339 time"
                    )
                })
        }
        _ => header_i64(properties, RETRY_AT_HEADER)
            .and_then(|ms| u64::try_from(ms).ok())
            .ok_or_else(|| format!("{RETRY_AT_HEADER}: not a time")),
    };
    let at_ms = match (
        headers.get(RETRY_AT_HEADER),
        headers.get(RETRY_AFTER_HEADER),
    ) {
        (Some(value), None) => at(value),
        (None, Some(_)) => header_i64(properties, RETRY_AFTER_HEADER)
            .and_then(|ms| u64::try_from(ms).ok())
            .map(|ms| now_ms.saturating_add(ms))
            .ok_or_else(|| format!("{RETRY_AFTER_HEADER}: not a whole number of milliseconds")),
        _ => Err(format!(
            "{RETRY_QUEUE_HEADER} needs exactly one of {RETRY_AT_HEADER} and {RETRY_AFTER_HEADER}"
        )),
    };
    Some(at_ms.map(|at_ms| AskedRetry { queue, at_ms }))
}

/// A text header (a long or short string), if present and UTF-8.
fn text_of(properties: &BasicProperties, name: &str) -> Option<String> {
    match properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok(),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// When the message's first attempt failed ([`FIRST_FAILED_HEADER`]), if
/// it was retried before.
pub fn first_failed_ms(properties: &BasicProperties) -> Option<u64> {
    header_i64(properties, FIRST_FAILED_HEADER).and_then(|ms| u64::try_from(ms).ok())
}

/// Which attempt the delivery that failed was: [`ATTEMPT_HEADER`], or 1
/// (the first) without it or with a value that is not a positive number.
pub fn attempt(properties: &BasicProperties) -> u32 {
    header_i64(properties, ATTEMPT_HEADER)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// delayline's headers a message delivered once carries, which a retry
/// writes afresh.
const OWN_HEADERS: [&str; 12] = [
    DELAY_HEADER,
    DELIVER_AT_HEADER,
    REVISION_HEADER,
    DELIVER_TO_HEADER,
    DELIVERY_KEY_HEADER,
    HOLD_HEADER,
    ATTEMPT_HEADER,
    FIRST_FAILED_HEADER,
    ORIGINAL_ID_HEADER,
    // A retry asked for once is not asked for again by the next failure.
    RETRY_QUEUE_HEADER,
    RETRY_AT_HEADER,
    RETRY_AFTER_HEADER,
];

/// The properties a dead-lettered message waits with, to come back to
/// `queue` (by the default exchange) as `attempt`: its own, without the
/// broker's dead-letter and delivery headers and delayline's from an
/// earlier attempt, with the attempt, when its first attempt failed
/// (`first_failed_ms`, none for a replay: a first attempt again) and its
/// own `message_id` in headers.
pub fn for_retry(
    properties: &BasicProperties,
    queue: &str,
    attempt: u32,
    first_failed_ms: Option<u64>,
) -> BasicProperties {
    let published = as_published(properties);
    let original_id = message_id(&published).unwrap_or_default().to_owned();
    let mut headers = FieldTable::default();
    for (name, value) in published.headers().iter().flat_map(|h| h.inner()) {
        let lower = name.as_str().to_ascii_lowercase();
        if !is_dead_letter_header(&lower) && !OWN_HEADERS.contains(&lower.as_str()) {
            headers.insert(name.clone(), value.clone());
        }
    }
    let cleaned = published.with_headers(headers);
    let waiting = taken_in(&cleaned, "", queue, None);
    let mut headers = waiting.headers().clone().unwrap_or_default();
    headers.insert(
        ShortString::from(ATTEMPT_HEADER),
        AMQPValue::LongLongInt(i64::from(attempt)),
    );
    headers.insert(
        ShortString::from(ORIGINAL_ID_HEADER),
        AMQPValue::LongString(LongString::from(original_id)),
    );
    if let Some(ms) = first_failed_ms {
        let ms = AMQPValue::LongLongInt(i64::try_from(ms).unwrap_or(i64::MAX));
        headers.insert(ShortString::from(FIRST_FAILED_HEADER), ms);
    }
    waiting.with_headers(headers)
}

/// The properties a parked message is replayed with: as it was parked, on
/// its first attempt again (see [`for_retry`]).
pub fn for_replay(properties: &BasicProperties, queue: &str) -> BasicProperties {
    for_retry(properties, queue, 1, None)
}

#[cfg(test)]
mod tests {
    use lapin::types::FieldArray;

    use super::*;
    use crate::cascade::CascadeSettings;
    use crate::message::publish::released;

    fn death(queue: &str, reason: &str) -> AMQPValue {
        let mut table = FieldTable::default();
        let text = |v: &str| AMQPValue::LongString(LongString::from(v));
        table.insert("queue".into(), text(queue));
        table.insert("reason".into(), text(reason));
        table.insert("count".into(), AMQPValue::LongLongInt(1));
        AMQPValue::FieldTable(table)
    }

    fn rejected(queue: &str, extra: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut headers = FieldTable::default();
        headers.insert(
            DEATH_HEADER.into(),
            AMQPValue::FieldArray(FieldArray::from(vec![
                death(queue, "rejected"),
                death("elsewhere", "expired"),
            ])),
        );
        headers.insert(
            "x-first-death-queue".into(),
            AMQPValue::LongString("q".into()),
        );
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(3));
        for (name, value) in extra {
            headers.insert((*name).into(), value.clone());
        }
        BasicProperties::default()
            .with_message_id("order-7".into())
            .with_correlation_id("c-1".into())
            .with_content_type("application/json".into())
            .with_headers(headers)
    }

    /// A consumer names the queue and exactly one time; a wait counts
    /// from when the intake reads it; a time is a number, digits or RFC
    /// 3339; anything else is said, not guessed.
    #[test]
    fn a_consumer_asks_its_own_retry_time_with_a_queue_and_one_time() {
        let asked = |pairs: &[(&str, AMQPValue)]| {
            let mut headers = FieldTable::default();
            for (name, value) in pairs {
                headers.insert((*name).into(), value.clone());
            }
            asked_retry(&BasicProperties::default().with_headers(headers), 10_000)
        };
        let queue = (RETRY_QUEUE_HEADER, AMQPValue::LongString("orders".into()));
        let back = |at_ms| {
            Some(Ok(AskedRetry {
                queue: "orders".into(),
                at_ms,
            }))
        };
        assert_eq!(asked(&[]), None);
        let after = (RETRY_AFTER_HEADER, AMQPValue::LongLongInt(120_000));
        assert_eq!(asked(&[queue.clone(), after.clone()]), back(130_000));
        assert_eq!(
            asked(std::slice::from_ref(&after)),
            None,
            "no queue: not an ask"
        );
        for at in [
            AMQPValue::LongLongInt(90_000),
            AMQPValue::LongString("90000".into()),
            AMQPValue::LongString("1970-01-01T00:01:30Z".into()),
        ] {
            assert_eq!(asked(&[queue.clone(), (RETRY_AT_HEADER, at)]), back(90_000));
        }
        let at = (RETRY_AT_HEADER, AMQPValue::LongLongInt(90_000));
        for wrong in [
            vec![queue.clone()],
            vec![queue.clone(), at, after],
            vec![
                queue.clone(),
                (RETRY_AT_HEADER, AMQPValue::LongString("soon".into())),
            ],
            vec![
                queue.clone(),
                (RETRY_AFTER_HEADER, AMQPValue::LongLongInt(-5)),
            ],
        ] {
            assert!(matches!(asked(&wrong), Some(Err(_))), "{wrong:?}");
        }
    }

    #[test]
    fn the_most_recent_death_names_the_queue_and_the_reason() {
        let death = last_death(&rejected("orders", &[])).unwrap();
        assert_eq!(death.queue, "orders");
        assert_eq!(death.reason, "rejected");
        assert_eq!(last_death(&BasicProperties::default()), None);
    }

    #[test]
    fn the_attempt_is_the_header_or_the_first() {
        assert_eq!(attempt(&rejected("q", &[])), 1);
        let third = rejected("q", &[(ATTEMPT_HEADER, AMQPValue::LongLongInt(3))]);
        assert_eq!(attempt(&third), 3);
        let nonsense = rejected("q", &[(ATTEMPT_HEADER, AMQPValue::LongLongInt(-2))]);
        assert_eq!(attempt(&nonsense), 1);
    }

    #[test]
    fn a_retry_comes_back_to_its_queue_as_it_left_with_the_attempt() {
        let user = AMQPValue::LongString("kept".into());
        let properties = for_retry(
            &rejected("orders", &[("tenant", user.clone())]),
            "orders",
            2,
            Some(5_000),
        );
        assert_eq!(first_failed_ms(&properties), Some(5_000));
        let headers = properties.headers().clone().unwrap();
        assert!(
            headers
                .inner()
                .keys()
                .all(|k| !is_dead_letter_header(k.as_str()))
        );
        assert!(!headers.inner().contains_key("x-delivery-count"));
        // While it waits its task's id replaces the message id: delivered,
        // the original comes back, and the default exchange routes it by
        // the queue's name.
        let cascade = CascadeSettings::default().validate().unwrap();
        let waiting = properties.with_message_id("task-1".into());
        let out = released("0.0.orders", b"{}".to_vec(), &waiting, &cascade);
        assert_eq!(out.exchange, "");
        assert_eq!(out.routing_key, "orders");
        assert_eq!(message_id(&out.properties), Some("order-7"));
        assert_eq!(
            out.properties.correlation_id().as_ref().unwrap().as_str(),
            "c-1"
        );
        let delivered = out.properties.headers().clone().unwrap();
        assert_eq!(delivered.inner().get("tenant"), Some(&user));
        assert_eq!(
            delivered.inner().get(ATTEMPT_HEADER),
            Some(&AMQPValue::LongLongInt(2))
        );
        assert!(!delivered.inner().contains_key(ORIGINAL_ID_HEADER));
        // Rejected again, it is read as attempt 2 and written as attempt 3,
        // its own id kept.
        let again = for_retry(
            &out.properties,
            "orders",
            attempt(&out.properties) + 1,
            first_failed_ms(&out.properties),
        );
        assert_eq!(attempt(&again), 3);
        assert_eq!(message_id(&again), Some("order-7"));
    }

    #[test]
    fn a_message_without_an_id_comes_back_without_one() {
        let properties = for_retry(&BasicProperties::default(), "jobs", 2, None);
        let cascade = CascadeSettings::default().validate().unwrap();
        let waiting = properties.with_message_id("task-1".into());
        let out = released("0.jobs", Vec::new(), &waiting, &cascade);
        assert_eq!(message_id(&out.properties), None);
    }
}
