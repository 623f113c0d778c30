use super::*;
use crate::clock::format_epoch_ms;
use std::time::UNIX_EPOCH;

fn parse(body: &str) -> Result<Task, TaskError> {
    let cascade = crate::cascade::for_tests(8, 100, crate::cascade::QueueType::Quorum);
    Task::parse(body.as_bytes(), &cascade, UNIX_EPOCH)
}

#[test]
fn a_misspelt_field_is_told_every_field_of_a_task() {
    let error = parse(r#"{"destination":"d","delay_ms":0,"exchnage":"x"}"#).unwrap_err();
    assert_eq!(
        error.to_string(),
        "/exchnage: unknown field \"exchnage\"; the fields of a task are destination, \
         delay_ms, delay, deliver_at, leeway_ms, leeway, deadline, max_lateness_ms, \
         max_lateness, expired_destination, payload, payload_base64, content_type, headers, id, \
         exchange"
    );
}

#[test]
fn a_missing_field_is_named_with_what_it_takes() {
    let error = parse(r#"{"delay":"1s"}"#).unwrap_err();
    assert_eq!(error.code(), "invalid_request");
    assert_eq!(
        error.to_string(),
        "/destination: missing; a task needs \"destination\" (a string: words of A-Z, a-z, \
         0-9, _ and - joined by dots)"
    );
}

#[test]
fn a_delay_in_bare_milliseconds_is_pointed_to_delay_ms() {
    for body in [
        r#"{"destination":"d","delay":2000}"#,
        r#"{"destination":"d","delay":"2000"}"#,
    ] {
        let error = parse(body).unwrap_err().to_string();
        assert!(error.contains("\"delay_ms\""), "{body}: {error}");
    }
    let error = parse(r#"{"destination":"d","delay":"2 fortnights"}"#).unwrap_err();
    assert!(!error.to_string().contains("delay_ms"), "{error}");
}

#[test]
fn a_null_payload_is_delivered_as_json_null_and_an_absent_one_as_nothing() {
    let null = parse(r#"{"destination":"d","delay_ms":0,"payload":null}"#).unwrap();
    assert_eq!(
        (null.payload.as_slice(), null.content_type.as_str()),
        (&b"null"[..], "application/json")
    );
    let absent = parse(r#"{"destination":"d","delay_ms":0}"#).unwrap();
    assert_eq!(
        (absent.payload.as_slice(), absent.content_type.as_str()),
        (&b""[..], "application/octet-stream")
    );
}

#[test]
fn content_types_must_be_media_types() {
    for bad in [
        "not a type",
        "a\u{0}b",
        "\u{0}",
        "a/b\r\nX: y",
        "é/é",
        "text/",
    ] {
        let body = serde_json::json!({"destination": "d", "delay_ms": 0, "content_type": bad});
        let error = parse(&body.to_string()).unwrap_err();
        assert_eq!(error.code(), "invalid_payload", "{bad:?}");
    }
    let good =
        parse(r#"{"destination":"d","delay_ms":0,"content_type":"text/plain; charset=utf-8"}"#);
    assert_eq!(good.unwrap().content_type, "text/plain; charset=utf-8");
}

#[test]
fn header_integers_must_fit_64_bits_and_floats_stay_floats() {
    let header = |json: &str| header_value("h", json);
    assert_eq!(header("9223372036854775807"), Ok(FieldValue::Int(i64::MAX)));
    assert_eq!(
        header("-9223372036854775808"),
        Ok(FieldValue::Int(i64::MIN))
    );
    for too_big in [
        "9223372036854775808",
        "18446744073709551616",
        "99999999999999999999",
    ] {
        assert_eq!(
            header(too_big).unwrap_err().code(),
            "invalid_header",
            "{too_big}"
        );
    }
    assert_eq!(header("1.5"), Ok(FieldValue::Float(1.5)));
    assert_eq!(header("1e19"), Ok(FieldValue::Float(1e19)));
    assert_eq!(header("\"s\""), Ok(FieldValue::Str("s".into())));
    assert_eq!(header("true"), Ok(FieldValue::Bool(true)));
    for bad in ["null", "[1]", "{}"] {
        assert_eq!(header(bad).unwrap_err().code(), "invalid_header", "{bad}");
    }
}

#[test]
fn times_have_three_digits_of_milliseconds() {
    assert_eq!(
        format_epoch_ms(1_767_225_600_060),
        "2026-01-01T00:00:00.060Z"
    );
    assert_eq!(
        format_epoch_ms(1_767_225_600_000),
        "2026-01-01T00:00:00.000Z"
    );
}
