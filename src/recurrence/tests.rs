//! Occurrences through daylight-saving changes (both hemispheres), leap days
//! and month ends; validation naming its field; the catch-up step.

use proptest::prelude::*;
use serde_json::json;

use super::occurrence::MISSED_AFTER_MS;
use super::*;
use crate::cascade::{Cascade, QueueType, for_tests};
use crate::clock::{format_epoch_ms, parse_epoch_ms};

fn at(text: &str) -> u64 {
    parse_epoch_ms(text).expect("an RFC 3339 time")
}

fn chain() -> Cascade {
    for_tests(32, 100, QueueType::Quorum)
}

fn valid(body: serde_json::Value, now: &str) -> ValidSchedule {
    let request: ScheduleRequest = serde_json::from_value(body).expect("a request");
    request.validate(&chain(), at(now)).expect("valid").1
}

fn refused(body: serde_json::Value) -> String {
    let request: ScheduleRequest = serde_json::from_value(body).expect("a request");
    request
        .validate(&chain(), at("2026-11-23T12:00:00Z"))
        .expect_err("refused")
        .to_string()
}

fn cron(expression: &str, zone: &str) -> Timing {
    valid(
        json!({"destination": "d", "cron": expression, "timezone": zone}),
        "2026-01-01T00:00:00Z",
    )
    .timing
}

fn upcoming(timing: &Timing, after: &str, n: usize) -> Vec<String> {
    timing
        .upcoming(at(after), n)
        .into_iter()
        .map(format_epoch_ms)
        .collect()
}

#[test]
fn weekdays_at_nine_in_berlin_skip_the_weekend_and_follow_winter_time() {
    let timing = cron("0 9 * * MON-FRI", "Europe/Berlin");
    // Friday 2026-11-27 after nine; Berlin is UTC+1 in winter.
    assert_eq!(
        upcoming(&timing, "2026-11-27T12:00:00Z", 2),
        ["2026-11-30T08:00:00.000Z", "2026-12-01T08:00:00.000Z"]
    );
}

#[test]
fn a_time_in_the_skipped_hour_fires_once_just_after_the_gap_in_berlin() {
    // 2026-03-29: 02:00 CET becomes 03:00 CEST; 02:30 does not exist.
    let timing = cron("30 2 * * *", "Europe/Berlin");
    assert_eq!(
        upcoming(&timing, "2026-03-28T12:00:00Z", 3),
        [
            "2026-03-29T01:00:00.000Z", // 03:00 CEST, the first moment after the gap
            "2026-03-30T00:30:00.000Z", // 02:30 CEST
            "2026-03-31T00:30:00.000Z",
        ]
    );
}

#[test]
fn a_time_in_the_repeated_hour_fires_once_in_berlin() {
    // 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens twice.
    let timing = cron("30 2 * * *", "Europe/Berlin");
    assert_eq!(
        upcoming(&timing, "2026-10-24T12:00:00Z", 3),
        [
            "2026-10-25T00:30:00.000Z", // the first 02:30 (CEST), not the second
            "2026-10-26T01:30:00.000Z", // 02:30 CET
            "2026-10-27T01:30:00.000Z",
        ]
    );
}

#[test]
fn the_southern_hemisphere_changes_the_other_way_round() {
    let timing = cron("30 2 * * *", "Australia/Sydney");
    // 2026-04-05: 03:00 AEDT becomes 02:00 AEST; 02:30 happens twice, fires once.
    assert_eq!(
        upcoming(&timing, "2026-04-04T00:00:00Z", 2),
        ["2026-04-04T15:30:00.000Z", "2026-04-05T16:30:00.000Z"]
    );
    // 2026-10-04: 02:00 AEST becomes 03:00 AEDT; 02:30 is skipped, fires at 03:00.
    assert_eq!(
        upcoming(&timing, "2026-10-03T00:00:00Z", 2),
        ["2026-10-03T16:00:00.000Z", "2026-10-04T15:30:00.000Z"]
    );
}

#[test]
fn february_29_fires_in_leap_years_only() {
    let timing = cron("0 12 29 2 *", "UTC");
    assert_eq!(
        upcoming(&timing, "2026-01-01T00:00:00Z", 2),
        ["2028-02-29T12:00:00.000Z", "2032-02-29T12:00:00.000Z"]
    );
}

#[test]
fn the_last_day_of_each_month_and_the_first_monday() {
    let last = cron("0 0 L * *", "UTC");
    assert_eq!(
        upcoming(&last, "2026-01-01T00:00:00Z", 4),
        [
            "2026-01-31T00:00:00.000Z",
            "2026-02-28T00:00:00.000Z",
            "2026-03-31T00:00:00.000Z",
            "2026-04-30T00:00:00.000Z",
        ]
    );
    let first_monday = cron("0 9 * * MON#1", "UTC");
    assert_eq!(
        upcoming(&first_monday, "2026-11-23T00:00:00Z", 2),
        ["2026-12-07T09:00:00.000Z", "2027-01-04T09:00:00.000Z"]
    );
}

#[test]
fn six_fields_put_seconds_first_and_steps_and_ranges_work() {
    let timing = cron("*/20 0-1 12 * * *", "UTC");
    assert_eq!(
        upcoming(&timing, "2026-11-23T11:59:59.500Z", 4),
        [
            "2026-11-23T12:00:00.000Z",
            "2026-11-23T12:00:20.000Z",
            "2026-11-23T12:00:40.000Z",
            "2026-11-23T12:01:00.000Z",
        ]
    );
}

#[test]
fn a_cron_occurrence_is_always_strictly_after_the_time_asked_about() {
    let timing = cron("0 * * * * *", "UTC");
    // Within the second of an occurrence, the next is the following one.
    assert_eq!(
        upcoming(&timing, "2026-11-23T12:00:00.500Z", 1),
        ["2026-11-23T12:01:00.000Z"]
    );
    assert_eq!(
        upcoming(&timing, "2026-11-23T12:00:00.000Z", 1),
        ["2026-11-23T12:01:00.000Z"]
    );
}

#[test]
fn start_and_end_bound_the_occurrences() {
    let timing = valid(
        json!({"destination": "d", "cron": "0 * * * *",
               "start_at": "2026-11-23T14:30:00Z", "end_at": "2026-11-23T16:00:00Z"}),
        "2026-11-23T12:00:00Z",
    )
    .timing;
    assert_eq!(
        upcoming(&timing, "2026-11-23T12:00:00Z", 5),
        ["2026-11-23T15:00:00.000Z", "2026-11-23T16:00:00.000Z"]
    );
}

#[test]
fn an_interval_counts_from_its_start_or_from_when_it_was_set() {
    let from_start = valid(
        json!({"destination": "d", "every": "15m", "start_at": "2026-11-23T12:05:00Z"}),
        "2026-11-23T12:00:00Z",
    );
    assert_eq!(
        upcoming(&from_start.timing, "2026-11-23T12:00:00Z", 2),
        ["2026-11-23T12:05:00.000Z", "2026-11-23T12:20:00.000Z"]
    );
    let from_now = valid(
        json!({"destination": "d", "every": "90s"}),
        "2026-11-23T12:00:00Z",
    );
    assert_eq!(from_now.spec.anchor_ms, Some(at("2026-11-23T12:01:30Z")));
    assert_eq!(
        upcoming(&from_now.timing, "2026-11-23T12:01:30Z", 1),
        ["2026-11-23T12:03:00.000Z"]
    );
}

#[test]
fn bad_timings_are_refused_naming_the_field() {
    let cases = [
        (json!({"destination": "d", "cron": "61 * * * *"}), "/cron"),
        (json!({"destination": "d", "cron": "0 0 30 2 *"}), "/cron"),
        (json!({"destination": "d"}), "/cron"),
        (
            json!({"destination": "d", "cron": "* * * * *", "every": "1m"}),
            "/cron",
        ),
        (
            json!({"destination": "d", "cron": "* * * * *", "timezone": "Mars/Olympus"}),
            "/timezone",
        ),
        (json!({"destination": "d", "every": "50ms"}), "/every"),
        (json!({"destination": "d", "every": "soon"}), "/every"),
        (
            json!({"destination": "d", "every": "1m", "start_at": "2026-11-24T00:00:00Z",
                   "end_at": "2026-11-23T00:00:00Z"}),
            "/end_at",
        ),
        (
            json!({"destination": "d", "cron": "* * * * *", "end_at": "2026-11-22T00:00:00Z"}),
            "/cron",
        ),
        (
            json!({"destination": "d", "cron": "* * * * *", "start_at": "tomorrow"}),
            "/start_at",
        ),
        (
            json!({"id": "a/b", "destination": "d", "every": "1m"}),
            "/id",
        ),
        (json!({"destination": "a b", "every": "1m"}), "/destination"),
        (
            json!({"destination": "d", "every": "1m", "headers": {"x-delayline-schedule": "x"}}),
            "/headers",
        ),
    ];
    for (body, field) in cases {
        let message = refused(body.clone());
        assert!(message.contains(field), "{body}: {message}");
    }
}

#[test]
fn an_occurrence_is_a_task_body_with_a_deterministic_id() {
    // The payload's bytes as the client wrote them, spaces and 2.50 kept.
    let request: ScheduleRequest = serde_json::from_str(
        r#"{"destination": "reports.daily", "payload": {"a": [1, 2.50]},
            "headers": {"tenant": "acme"}, "every": "1m"}"#,
    )
    .unwrap();
    let (_, schedule) = request
        .validate(&chain(), at("2026-11-23T12:00:00Z"))
        .unwrap();
    let id = occurrence_id("report", 3, at("2026-11-23T12:01:00Z"));
    assert_eq!(id, "report~3@2026-11-23T12:01:00.000Z");
    let body = occurrence_body(&schedule.content, &id, at("2026-11-23T12:01:00Z"));
    assert_eq!(
        String::from_utf8(body).unwrap(),
        r#"{"destination":"reports.daily","payload":{"a": [1, 2.50]},"headers":{"tenant":"acme"},"id":"report~3@2026-11-23T12:01:00.000Z","deliver_at":"2026-11-23T12:01:00.000Z"}"#
    );
}

/// A schedule's leeway goes to each occurrence: its task is delivered at
/// its own moment in the window after the occurrence's time; a patch
/// removes it; one the chain cannot hold is refused.
#[test]
fn a_schedules_leeway_goes_to_each_occurrence() {
    let schedule = valid(
        json!({"destination": "d", "every": "1m", "leeway_ms": 5000}),
        "2026-11-23T12:00:00Z",
    );
    assert_eq!(schedule.content.leeway_ms, Some(5_000));
    let occurrence = at("2026-11-23T12:01:00Z");
    let id = occurrence_id("s", 1, occurrence);
    let body = occurrence_body(&schedule.content, &id, occurrence);
    let now = std::time::UNIX_EPOCH + std::time::Duration::from_millis(at("2026-11-23T12:00:30Z"));
    let task = crate::task::Task::parse(&body, &chain(), now).unwrap();
    assert_eq!(task.leeway_ms, 5_000);
    let moment = occurrence + crate::task::leeway_offset_ms(&id, 5_000);
    // Quorum levels of 100 ms: the moment rounds up to what they keep.
    assert!(
        task.deliver_at_ms >= moment && task.deliver_at_ms < moment + 200,
        "{} for {moment}",
        task.deliver_at_ms
    );
    let patch: SchedulePatch = serde_json::from_value(json!({"leeway_ms": null})).unwrap();
    let patched = patch
        .apply(
            schedule.content,
            schedule.spec,
            &chain(),
            at("2026-11-23T12:00:00Z"),
        )
        .unwrap();
    assert_eq!(patched.content.leeway_ms, None);
    let too_long = refused(json!({"destination": "d", "every": "1m",
                                  "leeway_ms": 1_000_000_000_000_u64}));
    assert!(too_long.contains("/leeway_ms"), "{too_long}");
}

#[test]
fn a_patch_changes_what_it_names_and_keeps_the_rest() {
    let schedule = valid(
        json!({"destination": "d", "every": "1m", "payload_base64": "AAE=",
               "end_at": "2027-01-01T00:00:00Z"}),
        "2026-11-23T12:00:00Z",
    );
    let patch: SchedulePatch =
        serde_json::from_value(json!({"cron": "0 9 * * *", "payload": {"x": 1}, "end_at": null}))
            .unwrap();
    let patched = patch
        .apply(
            schedule.content,
            schedule.spec,
            &chain(),
            at("2026-11-23T12:00:00Z"),
        )
        .unwrap();
    assert_eq!(patched.spec.cron.as_deref(), Some("0 9 * * *"));
    assert_eq!(patched.spec.every, None);
    assert_eq!(patched.spec.end_at, None);
    assert_eq!(patched.content.payload_base64, None);
    assert_eq!(patched.content.destination, "d");
}

fn every_minute(catch_up: &str) -> Timing {
    valid(
        json!({"destination": "d", "every": "1m", "start_at": "2026-11-23T12:00:00Z",
               "catch_up": catch_up}),
        "2026-11-23T11:00:00Z",
    )
    .timing
}

#[test]
fn an_occurrence_reached_in_time_or_just_late_is_made_a_task() {
    let timing = every_minute("skip");
    let next = at("2026-11-23T12:00:00Z");
    for now in [next - 30_000, next, next + MISSED_AFTER_MS] {
        assert_eq!(
            step(&timing, next, now, now),
            Step {
                create: Some(next),
                missed: 0,
                next_at_ms: Some(next + 60_000),
                caught_up: false,
            }
        );
    }
}

#[test]
fn after_an_outage_missed_occurrences_are_skipped_or_the_latest_is_delivered_once() {
    let next = at("2026-11-23T12:00:00Z");
    let now = at("2026-11-23T13:00:30Z");
    assert_eq!(
        step(&every_minute("skip"), next, now, now),
        Step {
            create: None,
            missed: 61,
            next_at_ms: Some(at("2026-11-23T13:01:00Z")),
            caught_up: true,
        }
    );
    assert_eq!(
        step(&every_minute("latest"), next, now, now),
        Step {
            create: Some(at("2026-11-23T13:00:00Z")),
            missed: 60,
            next_at_ms: Some(at("2026-11-23T13:01:00Z")),
            caught_up: true,
        }
    );
}

#[test]
fn a_cron_schedule_catches_up_in_one_step_however_long_it_was_away() {
    let timing = valid(
        json!({"destination": "d", "cron": "0 9 * * *", "timezone": "Europe/Berlin",
               "catch_up": "latest"}),
        "2026-01-01T00:00:00Z",
    )
    .timing;
    let next = at("2026-01-01T08:00:00Z");
    let now = at("2026-03-01T12:00:00Z");
    let step = step(&timing, next, now, now);
    assert_eq!(step.create, Some(at("2026-03-01T08:00:00Z")));
    assert_eq!(step.missed, 59);
    assert_eq!(step.next_at_ms, Some(at("2026-03-02T08:00:00Z")));
}

#[test]
fn a_planner_that_was_running_makes_a_late_occurrence_late_and_skips_nothing() {
    let timing = every_minute("skip");
    let next = at("2026-11-23T12:00:00Z");
    let now = at("2026-11-23T12:10:00Z");
    // Running since before the occurrence: behind (an overloaded ledger),
    // not away.
    let started = next - 1;
    assert_eq!(
        step(&timing, next, now, started),
        Step {
            create: Some(next),
            missed: 0,
            next_at_ms: Some(next + 60_000),
            caught_up: false,
        }
    );
}

proptest! {
    /// Whatever the interval, anchor and clock, a step makes a task only of
    /// a real occurrence, never of one after `now` plus the planner's reach,
    /// and moves the schedule strictly forward over exactly the occurrences
    /// it made or counted.
    #[test]
    fn a_step_accounts_for_every_occurrence_it_passes(
        every_s in 1u64..=3600,
        anchor_offset in 0u64..=86_400_000,
        behind in 0u64..=10_000_000,
        latest in any::<bool>(),
    ) {
        let start = at("2026-11-23T00:00:00Z") + anchor_offset;
        let timing = valid(
            json!({"destination": "d", "every": format!("{every_s}s"),
                   "start_at": format_epoch_ms(start),
                   "catch_up": if latest { "latest" } else { "skip" }}),
            "2026-11-22T00:00:00Z",
        ).timing;
        let next = start;
        let now = next + behind;
        let step = step(&timing, next, now, now);
        let after = step.next_at_ms.expect("an interval without end never finishes");
        prop_assert!(after > next);
        prop_assert_eq!((after - start) % (every_s * 1000), 0);
        let passed = (after - next) / (every_s * 1000);
        prop_assert_eq!(passed, step.missed + u64::from(step.create.is_some()));
        if let Some(created) = step.create {
            prop_assert_eq!((created - start) % (every_s * 1000), 0);
            prop_assert!(created >= next && created < after);
        }
        // Nothing counted missed was within the grace.
        if step.missed > 0 {
            prop_assert!(now - MISSED_AFTER_MS > next);
        }
    }
}
