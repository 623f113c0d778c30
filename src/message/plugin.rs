//! The delay headers a producer of the `x-delayed-message` plugin sets, read
//! as delayline takes them over AMQP (see [`crate::ingress`]). Pure.
//!
//! `x-delay`: milliseconds, in any AMQP integer type (a client library picks
//! the width), a string (or byte array) of decimal digits (the plugin
//! converts those too), a floating-point number with no fraction (JavaScript
//! clients may send one), or a decimal that is a whole number (some clients
//! send a decimal for a number they were given as one). Absent, zero or negative: due now, as with the plugin. Anything
//! else is refused: the plugin would deliver it at once, which for a delay
//! the producer meant is early.
//!
//! `x-deliver-at`, which the plugin never had: the due time, as epoch
//! milliseconds (any integer type or digits) or an RFC 3339 string.

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::headers::{PLUGIN_DELAY_HEADER, PLUGIN_DELIVER_AT_HEADER};

/// When a message taken in over AMQP is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// After this many milliseconds (`x-delay`; 0 without a delay header).
    In(u64),
    /// At this epoch millisecond (`x-deliver-at`).
    At(u64),
}

/// Why a message's delay headers cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadDelay {
    #[error("x-delay is {0}, not a whole number of milliseconds")]
    NotAnInteger(String),
    #[error("x-deliver-at is {0}, neither epoch milliseconds nor an RFC 3339 time")]
    NotATime(String),
    #[error("x-delay and x-deliver-at are both set; give one")]
    Both,
}

/// The due time the headers ask for.
pub fn due(properties: &BasicProperties) -> Result<Due, BadDelay> {
    let headers = properties.headers().as_ref().map(|h| h.inner());
    let delay = headers.and_then(|h| h.get(PLUGIN_DELAY_HEADER));
    let at = headers.and_then(|h| h.get(PLUGIN_DELIVER_AT_HEADER));
    match (delay, at) {
        (Some(_), Some(_)) => Err(BadDelay::Both),
        (None, None) => Ok(Due::In(0)),
        (Some(delay), None) => {
            let ms = delay_ms(delay).ok_or_else(|| BadDelay::NotAnInteger(shown(delay)))?;
            Ok(Due::In(clamped(ms)))
        }
        (None, Some(at)) => deliver_at_ms(at)
            .map(Due::At)
            .ok_or_else(|| BadDelay::NotATime(shown(at))),
    }
}

/// An integer of any AMQP width, digits, or a float without a fraction.
fn delay_ms(value: &AMQPValue) -> Option<i128> {
    Some(match value {
        AMQPValue::ShortShortInt(v) => i128::from(*v),
        AMQPValue::ShortShortUInt(v) => i128::from(*v),
        AMQPValue::ShortInt(v) => i128::from(*v),
        AMQPValue::ShortUInt(v) => i128::from(*v),
        AMQPValue::LongInt(v) => i128::from(*v),
        AMQPValue::LongUInt(v) => i128::from(*v),
        AMQPValue::LongLongInt(v) => i128::from(*v),
        AMQPValue::Float(v) => whole(f64::from(*v))?,
        AMQPValue::Double(v) => whole(*v)?,
        AMQPValue::DecimalValue(v) => whole_decimal(v.value, v.scale)?,
        AMQPValue::ShortString(s) => digits(s.as_str())?,
        AMQPValue::LongString(s) => digits(std::str::from_utf8(s.as_bytes()).ok()?)?,
        AMQPValue::ByteArray(b) => digits(std::str::from_utf8(b.as_slice()).ok()?)?,
        _ => return None,
    })
}

/// An AMQP decimal is `value / 10^scale`: a delay when that is whole.
fn whole_decimal(value: u32, scale: u8) -> Option<i128> {
    match 10u128.checked_pow(u32::from(scale)) {
        Some(divisor) => (u128::from(value) % divisor == 0)
            .then(|| i128::from(value) / i128::try_from(divisor).unwrap_or(i128::MAX)),
        // 10^scale beyond 128 bits: only 0 is whole.
        None => (value == 0).then_some(0),
    }
}

/// Not positive: 0 (now); beyond 64 bits: the largest, which no chain
/// reaches (refused as too long, never taken for now).
fn clamped(ms: i128) -> u64 {
    if ms <= 0 {
        0
    } else {
        u64::try_from(ms).unwrap_or(u64::MAX)
    }
}

fn whole(value: f64) -> Option<i128> {
    // `as` saturates: a double beyond 2^127 is still a (huge) integer, which
    // the chain refuses as too long.
    (value.is_finite() && value.fract() == 0.0).then_some(value as i128)
}

/// An optionally signed run of ASCII digits, surrounding spaces allowed.
fn digits(text: &str) -> Option<i128> {
    let text = text.trim();
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // More digits than 128 bits hold: still a number, and far too long.
    let overflow = if text.starts_with('-') {
        i128::MIN
    } else {
        i128::MAX
    };
    Some(text.parse().unwrap_or(overflow))
}

fn deliver_at_ms(value: &AMQPValue) -> Option<u64> {
    let text = match value {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?.to_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::Timestamp(seconds) => return Some(seconds.saturating_mul(1000)),
        other => return delay_ms(other).map(clamped),
    };
    if let Some(ms) = digits(&text) {
        return Some(clamped(ms));
    }
    let at = OffsetDateTime::parse(text.trim(), &Rfc3339).ok()?;
    // Rounded up: a due time between two milliseconds is the later one.
    let nanos = at.unix_timestamp_nanos();
    let ms = nanos / 1_000_000 + i128::from(nanos % 1_000_000 > 0);
    Some(clamped(ms))
}

/// A header's value as an error message shows it, in AMQP's words: its
/// type and, shortened, its content (never Rust's debug form, which a
/// producer in another language cannot read).
fn shown(value: &AMQPValue) -> String {
    let text = match value {
        AMQPValue::LongString(s) => {
            format!("the string {:?}", String::from_utf8_lossy(s.as_bytes()))
        }
        AMQPValue::ShortString(s) => format!("the short string {:?}", s.as_str()),
        AMQPValue::ByteArray(b) => format!(
            "the byte array {:?} ({} bytes)",
            String::from_utf8_lossy(b.as_slice()),
            b.len()
        ),
        AMQPValue::Boolean(b) => format!("the boolean {b}"),
        AMQPValue::Float(v) => format!("the float {v}"),
        AMQPValue::Double(v) => format!("the double {v}"),
        AMQPValue::DecimalValue(d) => decimal_shown(d.value, d.scale),
        AMQPValue::Timestamp(t) => format!("the timestamp {t}"),
        AMQPValue::FieldArray(a) => format!("an array of {} values", a.as_slice().len()),
        AMQPValue::FieldTable(t) => format!("a table of {} fields", t.inner().len()),
        AMQPValue::Void => "void (no value)".to_owned(),
        integer => match delay_ms(integer) {
            Some(v) => format!("the integer {v}"),
            None => "a value of an unknown type".to_owned(),
        },
    };
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// `value / 10^scale` written out: the decimal 2000.5.
fn decimal_shown(value: u32, scale: u8) -> String {
    let digits = format!("{value:0>width$}", width = usize::from(scale) + 1);
    let (whole, fraction) = digits.split_at(digits.len() - usize::from(scale));
    if fraction.is_empty() {
        format!("the decimal {whole}")
    } else {
        format!("the decimal {whole}.{fraction}")
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::{DecimalValue, FieldTable, LongString, ShortString};

    use super::*;

    fn with(name: &str, value: AMQPValue) -> BasicProperties {
        let mut headers = FieldTable::default();
        headers.insert(ShortString::from(name), value);
        BasicProperties::default().with_headers(headers)
    }

    #[test]
    fn every_integer_width_is_a_delay_and_not_positive_is_now() {
        for value in [
            AMQPValue::ShortShortInt(50),
            AMQPValue::ShortShortUInt(50),
            AMQPValue::ShortInt(50),
            AMQPValue::ShortUInt(50),
            AMQPValue::LongInt(50),
            AMQPValue::LongUInt(50),
            AMQPValue::LongLongInt(50),
            AMQPValue::Double(50.0),
            AMQPValue::Float(50.0),
            AMQPValue::LongString(LongString::from("50")),
            AMQPValue::ShortString(ShortString::from(" 50 ")),
            AMQPValue::ByteArray(b"50".to_vec().into()),
            AMQPValue::DecimalValue(DecimalValue {
                scale: 0,
                value: 50,
            }),
            AMQPValue::DecimalValue(DecimalValue {
                scale: 2,
                value: 5000,
            }),
        ] {
            assert_eq!(
                due(&with("x-delay", value.clone())),
                Ok(Due::In(50)),
                "{value:?}"
            );
        }
        for value in [
            AMQPValue::LongInt(0),
            AMQPValue::LongInt(-5000),
            AMQPValue::LongString(LongString::from("-1")),
        ] {
            assert_eq!(
                due(&with("x-delay", value.clone())),
                Ok(Due::In(0)),
                "{value:?}"
            );
        }
        assert_eq!(due(&BasicProperties::default()), Ok(Due::In(0)));
    }

    #[test]
    fn a_delay_that_is_not_an_integer_is_refused() {
        for value in [
            AMQPValue::Double(1.5),
            AMQPValue::Double(f64::NAN),
            AMQPValue::LongString(LongString::from("5s")),
            AMQPValue::LongString(LongString::from("")),
            AMQPValue::Boolean(true),
            AMQPValue::Void,
            AMQPValue::DecimalValue(DecimalValue {
                scale: 1,
                value: 15,
            }),
            AMQPValue::DecimalValue(DecimalValue {
                scale: 255,
                value: 1,
            }),
        ] {
            let refused = due(&with("x-delay", value.clone()));
            assert!(
                matches!(refused, Err(BadDelay::NotAnInteger(_))),
                "{value:?}: {refused:?}"
            );
        }
    }

    #[test]
    fn a_refusal_says_what_was_sent_in_amqps_words() {
        let reason = |value| match due(&with("x-delay", value)) {
            Err(refused) => refused.to_string(),
            Ok(due) => panic!("{due:?} accepted"),
        };
        let cases = [
            (
                AMQPValue::DecimalValue(DecimalValue {
                    scale: 3,
                    value: 2_000_500,
                }),
                "x-delay is the decimal 2000.500, not a whole number of milliseconds",
            ),
            (
                AMQPValue::DecimalValue(DecimalValue { scale: 2, value: 5 }),
                "x-delay is the decimal 0.05, not a whole number of milliseconds",
            ),
            (
                AMQPValue::Boolean(true),
                "x-delay is the boolean true, not a whole number of milliseconds",
            ),
            (
                AMQPValue::ByteArray(b"3s".to_vec().into()),
                "x-delay is the byte array \"3s\" (2 bytes), not a whole number of milliseconds",
            ),
            (
                AMQPValue::Double(1.5),
                "x-delay is the double 1.5, not a whole number of milliseconds",
            ),
            (
                AMQPValue::FieldTable(FieldTable::default()),
                "x-delay is a table of 0 fields, not a whole number of milliseconds",
            ),
            (
                AMQPValue::Void,
                "x-delay is void (no value), not a whole number of milliseconds",
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(reason(value), expected);
        }
        let at = due(&with("x-deliver-at", AMQPValue::Boolean(false)));
        assert_eq!(
            at.unwrap_err().to_string(),
            "x-deliver-at is the boolean false, neither epoch milliseconds nor an RFC 3339 time"
        );
    }

    #[test]
    fn a_due_time_is_epoch_milliseconds_or_rfc_3339_rounded_up() {
        let at = |value| due(&with("x-deliver-at", value));
        assert_eq!(
            at(AMQPValue::LongLongInt(1_700_000_000_000)),
            Ok(Due::At(1_700_000_000_000))
        );
        assert_eq!(
            at(AMQPValue::LongString(LongString::from("1700000000000"))),
            Ok(Due::At(1_700_000_000_000))
        );
        assert_eq!(
            at(AMQPValue::LongString(LongString::from(
                "2023-11-14T22:13:20.0001Z"
            ))),
            Ok(Due::At(1_700_000_000_001))
        );
        assert_eq!(
            at(AMQPValue::Timestamp(1_700_000_000)),
            Ok(Due::At(1_700_000_000_000))
        );
        assert!(matches!(
            at(AMQPValue::LongString(LongString::from("tomorrow"))),
            Err(BadDelay::NotATime(_))
        ));
        let mut both = FieldTable::default();
        both.insert("x-delay".into(), AMQPValue::LongInt(1));
        both.insert("x-deliver-at".into(), AMQPValue::LongInt(1));
        let both = BasicProperties::default().with_headers(both);
        assert_eq!(due(&both), Err(BadDelay::Both));
    }
}
