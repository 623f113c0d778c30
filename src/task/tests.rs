use super::*;
use crate::clock::format_epoch_ms;
use crate::task::TaskState;
use std::time::UNIX_EPOCH;

/// Classic queues, whose TTLs are exact: a delay is its units (see
/// the proptest below for quorum queues).
fn cascade() -> Cascade {
    crate::cascade::for_tests(8, 100, crate::cascade::QueueType::Classic)
}

/// 2026-01-01T00:00:00.250Z plus half a millisecond.
fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(1_767_225_600_250_500)
}

fn parse(body: &str) -> Result<Task, TaskError> {
    Task::parse(body.as_bytes(), &cascade(), now())
}

/// A leeway delays the task by its own moment in the window,
/// drawn from its id: never before the due time, never after the
/// window's end, the same moment for the same id; both ways of giving
/// it, and neither with the other.
#[test]
fn a_leeway_puts_the_task_at_its_own_moment_in_it() {
    let plain = parse(r#"{"destination": "d", "delay_ms": 1000, "id": "t-1"}"#).unwrap();
    assert_eq!(plain.leeway_ms, 0);
    let body = r#"{"destination": "d", "delay_ms": 1000, "id": "t-1", "leeway_ms": 20000}"#;
    let late = parse(body).unwrap();
    assert_eq!(late.leeway_ms, 20_000);
    let offset = leeway_offset_ms("t-1", 20_000);
    assert!(offset <= 20_000);
    // Classic queues with 100 ms units: the moment rounds up to a unit.
    let moment = plain.deliver_at_ms + offset;
    assert!(
        late.deliver_at_ms >= moment && late.deliver_at_ms < moment + 100,
        "{} for {moment}",
        late.deliver_at_ms
    );
    assert_eq!(parse(body).unwrap().deliver_at_ms, late.deliver_at_ms);
    let human = r#"{"destination": "d", "delay_ms": 1000, "id": "t-1", "leeway": "20s"}"#;
    assert_eq!(parse(human).unwrap().deliver_at_ms, late.deliver_at_ms);
    let accepted = late.accepted(TaskState::Scheduled);
    assert_eq!(accepted.leeway_ms, Some(20_000));
    assert_eq!(
        accepted.due_at.as_deref(),
        Some(format_epoch_ms(late.deliver_at_ms - offset).as_str())
    );
    assert_eq!(plain.accepted(TaskState::Scheduled).due_at, None);

    let both = r#"{"destination": "d", "delay_ms": 1, "leeway_ms": 5, "leeway": "5ms"}"#;
    assert!(parse(both).unwrap_err().to_string().contains("not both"));
    let wrong = r#"{"destination": "d", "delay_ms": 1, "leeway": "soon"}"#;
    assert!(
        parse(wrong)
            .unwrap_err()
            .to_string()
            .starts_with("/leeway:")
    );
    let negative = r#"{"destination": "d", "delay_ms": 1, "leeway_ms": -5}"#;
    assert!(
        parse(negative)
            .unwrap_err()
            .to_string()
            .starts_with("/leeway_ms:")
    );
    // Beyond 64 bits: out of range, as a delay is, named by its field.
    let huge = r#"{"destination": "d", "delay_ms": 1, "leeway_ms": 1e30}"#;
    let error = parse(huge).unwrap_err();
    assert!(matches!(error, TaskError::DelayOutOfRange(_)), "{error}");
    assert!(error.to_string().starts_with("/leeway_ms:"), "{error}");
    // 8 levels of 100 ms hold 25.5 s: a window whose end is past that is
    // refused there, whatever moment the id drew.
    let too_long = r#"{"destination": "d", "delay_ms": 1000, "leeway": "25s"}"#;
    let error = parse(too_long).unwrap_err();
    assert!(matches!(error, TaskError::DelayOutOfRange(_)), "{error}");
    assert!(error.to_string().starts_with("/leeway"), "{error}");
}

/// Ten thousand tasks of one instant, with the ids the service makes,
/// spread over 10 s: no second of the window holds more than twice its
/// share (the issue's measure), nor less than half.
#[test]
fn tasks_of_one_instant_spread_evenly_over_their_leeway() {
    let mut per_second = [0u32; 11];
    for _ in 0..10_000 {
        let id = uuid::Uuid::now_v7().to_string();
        let offset = leeway_offset_ms(&id, 10_000);
        per_second[(offset / 1_000) as usize] += 1;
    }
    // The window's last millisecond is a second of its own.
    assert!(per_second[10] < 10, "{per_second:?}");
    for (second, count) in per_second[..10].iter().enumerate() {
        assert!(
            (500..=2_000).contains(count),
            "second {second}: {per_second:?}"
        );
    }
}

/// A chain of `queue_type` that holds (1 ms precision) or not.
fn chain(holds: bool, queue_type: crate::cascade::QueueType) -> Cascade {
    crate::cascade::CascadeSettings {
        levels: 8,
        unit_ms: 100,
        queue_type,
        release_stage: Some(holds),
        ..crate::cascade::CascadeSettings::default()
    }
    .validate()
    .unwrap()
}

/// The soonest, in ns, that a message published at `sent_ns` with
/// `routing_key` can leave the levels: each set digit a TTL, less just
/// under a millisecond on a quorum queue, which counts whole ms.
fn soonest_out_ns(routing_key: &str, cascade: &Cascade, sent_ns: u128) -> u128 {
    let loss_ns = match cascade.queue_type() {
        crate::cascade::QueueType::Quorum => 999_999,
        crate::cascade::QueueType::Classic => 0,
    };
    let levels = cascade.levels() as usize;
    let digits: Vec<&str> = routing_key.split('.').take(levels).collect();
    let ttls_ms: Vec<u64> = digits
        .iter()
        .enumerate()
        .filter(|(_, digit)| **digit == "1")
        .map(|(i, _)| cascade.level_ttl_ms((levels - 1 - i) as u32))
        .collect();
    let spent: u128 = ttls_ms
        .iter()
        .map(|ttl_ms| u128::from(*ttl_ms) * 1_000_000 - loss_ns)
        .sum();
    // A quorum queue's clock may run fast while its node catches up.
    let fast_ns = match cascade.queue_type() {
        crate::cascade::QueueType::Quorum => {
            u128::from(crate::cascade::ttl_fast_by(ttls_ms.iter().sum())) * 1_000_000
        }
        crate::cascade::QueueType::Classic => 0,
    };
    sent_ns + spent - fast_ns
}

proptest::proptest! {
    /// Whatever the id and the window: a moment in it.
    #[test]
    fn a_leeway_offset_is_within_the_leeway(id in ".{0,64}", window_ms in 0u64..u64::MAX) {
        proptest::prop_assert!(leeway_offset_ms(&id, window_ms) <= window_ms);
    }
}

proptest::proptest! {
    /// No consumer sees a task before the moment asked for (the instant
    /// the request was taken plus its delay, to the nanosecond), nor
    /// before its `deliver_at`. A chain that holds releases it at
    /// `deliver_at` exactly; one that does not lets it out of the levels
    /// no sooner than the model of the broker's TTLs says, published at
    /// the instant of the request at the soonest. And the latter takes
    /// no unit more than that needs.
    #[test]
    fn no_task_is_seen_before_the_moment_asked_for_or_its_deliver_at(
        now_ns in 1_700_000_000_000_000_000u64..1_800_000_000_000_000_000,
        delay_ms in 0u64..25_000,
        holds in proptest::bool::ANY,
        quorum in proptest::bool::ANY,
    ) {
        use crate::cascade::QueueType;
        let queue_type = if quorum { QueueType::Quorum } else { QueueType::Classic };
        let cascade = chain(holds, queue_type);
        let now = UNIX_EPOCH + Duration::from_nanos(now_ns);
        let asked_ns = u128::from(now_ns) + u128::from(delay_ms) * 1_000_000;
        let body = format!(r#"{{"destination":"a.b","delay_ms":{delay_ms}}}"#);
        let task = Task::parse(body.as_bytes(), &cascade, now).unwrap();
        let deliver_at_ns = u128::from(task.deliver_at_ms) * 1_000_000;
        let accepted_ns = i128::from(task.accepted_at_ms) * 1_000_000;
        proptest::prop_assert!((accepted_ns - i128::from(now_ns)).abs() < 1_000_000);
        if holds {
            proptest::prop_assert!(task.route.held);
            proptest::prop_assert!(deliver_at_ns >= asked_ns);
        } else {
            let out_ns = soonest_out_ns(&task.route.routing_key, &cascade, now_ns.into());
            proptest::prop_assert!(out_ns >= asked_ns, "out {} < asked {}", out_ns, asked_ns);
            proptest::prop_assert!(deliver_at_ns <= out_ns, "deliver_at {} > out {}", deliver_at_ns, out_ns);
            if let Some(fewer) = task.route.delay_units.checked_sub(1) {
                let fewer = cascade.route_units(fewer, "a.b");
                proptest::prop_assert!(soonest_out_ns(&fewer.routing_key, &cascade, now_ns.into()) < asked_ns);
            }
        }
    }
}

#[test]
fn json_payload_is_delivered_as_its_bytes() {
    let task = parse(r#"{"destination":"a.b","delay_ms":150,"payload":{"k": [1, 2]}}"#).unwrap();
    assert_eq!(task.payload, br#"{"k": [1, 2]}"#);
    assert_eq!(task.content_type, "application/json");
    assert_eq!(task.route.delay_ms, 200);
    assert_eq!(task.route.routing_key, "0.0.0.0.0.0.1.0.a.b");
    // A chain that does not hold counts from the whole ms at or before
    // `now`: the message cannot leave the levels before now + 200 ms.
    assert_eq!(task.accepted_at_ms, 1_767_225_600_250);
    assert_eq!(task.deliver_at_ms, 1_767_225_600_450);
    assert_eq!(
        task.accepted(TaskState::Scheduled).deliver_at,
        "2026-01-01T00:00:00.450Z"
    );
    assert!(uuid::Uuid::parse_str(&task.id).is_ok());
}

#[test]
fn the_three_ways_to_say_when() {
    assert_eq!(
        parse(r#"{"destination":"d","delay":"1s"}"#)
            .unwrap()
            .route
            .delay_ms,
        1000
    );
    assert_eq!(
        parse(r#"{"destination":"d","delay":"2s 500ms"}"#)
            .unwrap()
            .route
            .delay_ms,
        2500
    );
    assert_eq!(
        parse(r#"{"destination":"d","delay":"1s50ms"}"#)
            .unwrap()
            .route
            .delay_ms,
        1100
    );
    let at = parse(r#"{"destination":"d","deliver_at":"2026-01-01T00:00:01.3001Z"}"#).unwrap();
    // 1050.1 ms after the accepted millisecond, rounded up to 11 units.
    assert_eq!(at.route.delay_ms, 1100);
    assert!(at.deliver_at_ms as f64 >= 1_767_225_601_300.1);
    let offset =
        parse(r#"{"destination":"d","deliver_at":"2026-01-01T01:00:01.25+01:00"}"#).unwrap();
    assert_eq!(offset.route.delay_ms, 1000);
}

#[test]
fn a_task_enters_the_shard_its_id_names() {
    let cascade = crate::cascade::sharded_for_tests(8, 100, 3);
    let mut seen = std::collections::BTreeSet::new();
    for n in 0..30 {
        let body = format!(r#"{{"id":"task-{n}","destination":"d","delay_ms":1500}}"#);
        let task = Task::parse(body.as_bytes(), &cascade, now()).unwrap();
        let shard = cascade.in_shard(cascade.shard_of(&task.id));
        // 1.5 s: 15 units of 100 ms less the lead, from level 3 down.
        assert_eq!(task.route.entry_exchange, shard.level_exchange(3));
        seen.insert(shard.shard());
    }
    assert_eq!(seen.len(), 3, "every shard takes tasks");
    // One generated here too.
    let task = Task::parse(br#"{"destination":"d","delay_ms":0}"#, &cascade, now()).unwrap();
    let shard = cascade.for_task(&task.id);
    assert_eq!(task.route.entry_exchange, shard.release_queue());
}

#[test]
fn a_past_deliver_at_means_now() {
    let task = parse(r#"{"destination":"d","deliver_at":"2020-01-01T00:00:00Z"}"#).unwrap();
    assert_eq!(task.route.delay_ms, 0);
    assert_eq!(task.route.entry_exchange, "biz");
}

#[test]
fn base64_payload_with_content_type() {
    let task = parse(
        r#"{"destination":"d","delay_ms":0,"payload_base64":"AAEC/w==","content_type":"image/x"}"#,
    )
    .unwrap();
    assert_eq!(task.payload, [0, 1, 2, 255]);
    assert_eq!(task.content_type, "image/x");
}

#[test]
fn headers_keep_their_types() {
    let task = parse(
        r#"{"destination":"d","delay_ms":0,"id":"t-1","headers":{"s":"v","i":-3,"f":1.5,"b":true}}"#,
    )
    .unwrap();
    assert_eq!(task.id, "t-1");
    assert_eq!(
        task.headers,
        [
            ("b".into(), FieldValue::Bool(true)),
            ("f".into(), FieldValue::Float(1.5)),
            ("i".into(), FieldValue::Int(-3)),
            ("s".into(), FieldValue::Str("v".into())),
        ]
    );
}

#[test]
fn headers_survive_the_ledger_json() {
    let task =
        parse(r#"{"destination":"d","delay_ms":0,"headers":{"s":"7","i":7,"f":7.0,"b":false}}"#)
            .unwrap();
    let stored: BTreeMap<_, _> = task.headers.iter().cloned().collect();
    let json = serde_json::to_string(&stored).unwrap();
    let back: BTreeMap<String, FieldValue> = serde_json::from_str(&json).unwrap();
    assert_eq!(back.into_iter().collect::<Vec<_>>(), task.headers);
}

#[test]
fn fingerprints_ignore_formatting_but_not_content() {
    let a = fingerprint(br#"{"destination":"d","delay_ms":5,"payload":{"x":1,"y":2}}"#).unwrap();
    let b =
        fingerprint(b"{ \"payload\": {\"y\":2, \"x\":1}, \"delay_ms\":5, \"destination\":\"d\" }")
            .unwrap();
    let c = fingerprint(br#"{"destination":"d","delay_ms":6,"payload":{"x":1,"y":2}}"#).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a.len(), 64);
}

#[test]
fn every_bad_request_has_its_code() {
    let long_destination = format!(r#"{{"destination":"{}","delay_ms":1}}"#, "d".repeat(240));
    let cases: &[(&str, &str)] = &[
        ("{", "malformed_json"),
        ("[]", "invalid_request"),
        (r#"{"delay_ms":1}"#, "invalid_request"),
        (
            r#"{"destination":"d","delay_ms":1,"delay_sec":3}"#,
            "invalid_request",
        ),
        (r#"{"destination":"d","delay_ms":1.5}"#, "invalid_delay"),
        (
            r#"{"destination":"a.*","delay_ms":1}"#,
            "invalid_destination",
        ),
        (
            r#"{"destination":"a..b","delay_ms":1}"#,
            "invalid_destination",
        ),
        (&long_destination, "invalid_destination"),
        (r#"{"destination":"d"}"#, "invalid_delay"),
        (
            r#"{"destination":"d","delay_ms":1,"delay":"1s"}"#,
            "invalid_delay",
        ),
        (r#"{"destination":"d","delay_ms":-1}"#, "invalid_delay"),
        (r#"{"destination":"d","delay":"soon"}"#, "invalid_delay"),
        (
            r#"{"destination":"d","deliver_at":"tomorrow"}"#,
            "invalid_delay",
        ),
        (
            r#"{"destination":"d","delay_ms":25501}"#,
            "delay_out_of_range",
        ),
        (r#"{"destination":"d","delay":"1h"}"#, "delay_out_of_range"),
        (
            r#"{"destination":"d","delay_ms":1,"payload":1,"payload_base64":"AA=="}"#,
            "invalid_payload",
        ),
        (
            r#"{"destination":"d","delay_ms":1,"payload_base64":"%%"}"#,
            "invalid_payload",
        ),
        (
            r#"{"destination":"d","delay_ms":1,"content_type":""}"#,
            "invalid_payload",
        ),
        (
            r#"{"destination":"d","delay_ms":1,"headers":{"x-delay-ms":1}}"#,
            "invalid_header",
        ),
        (
            r#"{"destination":"d","delay_ms":1,"headers":{"X-Death":"x"}}"#,
            "invalid_header",
        ),
        (
            r#"{"destination":"d","delay_ms":1,"headers":{"k":null}}"#,
            "invalid_header",
        ),
        (
            r#"{"destination":"d","delay_ms":1,"headers":{"k":[1]}}"#,
            "invalid_header",
        ),
        (
            r#"{"destination":"d","delay_ms":1,"headers":{"k":18446744073709551615}}"#,
            "invalid_header",
        ),
        (r#"{"destination":"d","delay_ms":1,"id":""}"#, "invalid_id"),
    ];
    for (body, code) in cases {
        let err = parse(body).unwrap_err();
        assert_eq!(err.code(), *code, "{body}: {err}");
    }
    assert!(parse(r#"{"destination":"d","delay_ms":25500}"#).is_ok());
}

/// A deadline as a time or as how late the task may be; refused before
/// the task is due (with a leeway, its window's end), given twice, or
/// without the release stage (only it can hold a task back).
#[test]
fn a_deadline_is_a_time_after_the_due_time_and_needs_the_release_stage() {
    let staged = crate::cascade::sharded_for_tests(8, 100, 1);
    let parse_staged = |body: &str| Task::parse(body.as_bytes(), &staged, now());
    let plain = parse_staged(r#"{"destination": "d", "delay_ms": 1000}"#).unwrap();
    assert_eq!(plain.deadline_ms, None);
    assert_eq!(plain.accepted(TaskState::Scheduled).deadline, None);
    let late =
        parse_staged(r#"{"destination": "d", "delay_ms": 1000, "max_lateness_ms": 500}"#).unwrap();
    assert_eq!(late.deadline_ms, Some(late.deliver_at_ms + 500));
    let human = r#"{"destination": "d", "delay_ms": 1000, "max_lateness": "2s"}"#;
    let human = parse_staged(human).unwrap();
    assert_eq!(human.deadline_ms, Some(human.deliver_at_ms + 2_000));
    assert_eq!(
        human.accepted(TaskState::Scheduled).deadline,
        Some(format_epoch_ms(human.deliver_at_ms + 2_000))
    );
    // As a time: kept exactly, from the due time on.
    let due = plain.deliver_at_ms;
    let at = |deadline_ms: u64, leeway_ms: u64| {
        format!(
            r#"{{"destination": "d", "delay_ms": 1000, "leeway_ms": {leeway_ms}, "id": "t-9",
                 "deadline": "{}"}}"#,
            format_epoch_ms(deadline_ms)
        )
    };
    assert_eq!(parse_staged(&at(due, 0)).unwrap().deadline_ms, Some(due));
    let early = parse_staged(&at(due - 1, 0)).unwrap_err();
    assert_eq!(early.code(), "invalid_deadline");
    assert!(early.to_string().starts_with("/deadline: "), "{early}");
    // With a leeway, not before the window's end, whatever moment was drawn.
    assert!(parse_staged(&at(due + 4_999, 5_000)).is_err());
    assert!(parse_staged(&at(due + 5_000, 5_000)).is_ok());

    for body in [
        r#"{"destination": "d", "delay_ms": 1, "max_lateness_ms": 5, "max_lateness": "5ms"}"#,
        r#"{"destination": "d", "delay_ms": 1, "max_lateness": "soon"}"#,
        r#"{"destination": "d", "delay_ms": 1, "max_lateness_ms": -1}"#,
        r#"{"destination": "d", "delay_ms": 1, "deadline": "tomorrow"}"#,
    ] {
        let error = parse_staged(body).unwrap_err();
        assert_eq!(error.code(), "invalid_deadline", "{body}: {error}");
    }
    // Without the release stage the broker delivers however late.
    let without = parse(r#"{"destination": "d", "delay_ms": 1, "max_lateness_ms": 5}"#);
    let error = without.unwrap_err();
    assert_eq!(error.code(), "invalid_deadline");
    assert!(error.to_string().contains("release stage"), "{error}");
}
