//! A schedule as a client states it (`POST`, `PATCH`), validated.
//!
//! The content of its occurrences is a task's (destination, exchange,
//! payload, content type, headers), checked by the very rules of
//! `POST /v1/tasks`: an occurrence is parsed as a task body would be.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::ScheduleError;
use super::occurrence::{ScheduleContent, occurrence_body};
use super::timing::{CatchUp, Timing, TimingSpec};
use crate::cascade::Cascade;
use crate::message::FieldValue;
use crate::task::Task;

/// The most bytes of a schedule id: an occurrence's task id adds its
/// revision and time and must stay within a task id's 255.
pub const MAX_SCHEDULE_ID_BYTES: usize = 128;

/// The JSON body of `POST /v1/schedules`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"id": "weekday-report", "destination": "reports.daily",
    "cron": "0 9 * * MON-FRI", "timezone": "Europe/Berlin", "payload": {"report": "daily"}}))]
pub struct ScheduleRequest {
    /// 1 to 128 bytes of `[A-Za-z0-9._-]`; a UUID when absent. Posting the
    /// same schedule again under its id is answered as the first time.
    #[schema(example = "weekday-report", min_length = 1, max_length = 128)]
    pub id: Option<String>,
    /// As a task's: the routing key its occurrences are delivered with.
    #[schema(example = "reports.daily")]
    destination: String,
    /// As a task's: the exchange its occurrences are delivered to.
    exchange: Option<String>,
    /// As a task's.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Object>)]
    payload: Option<Box<RawValue>>,
    /// As a task's.
    #[schema(format = Byte)]
    payload_base64: Option<String>,
    /// As a task's.
    content_type: Option<String>,
    /// As a task's; each occurrence also carries `x-delayline-schedule` (the
    /// schedule's id) and `x-delayline-occurrence` (its time, RFC 3339).
    #[schema(value_type = Option<BTreeMap<String, FieldValue>>)]
    headers: Option<BTreeMap<String, Box<RawValue>>>,
    /// As a task's: each occurrence is delivered at a moment of its own
    /// within this many milliseconds after its time, so that many
    /// schedules of one instant arrive spread over it.
    #[schema(example = 10000)]
    leeway_ms: Option<u64>,
    /// As a task's: each occurrence is never published to its destination
    /// more than this many milliseconds after its moment; it expires
    /// instead (a reminder hours late after an outage is worse than none).
    #[schema(example = 300000)]
    max_lateness_ms: Option<u64>,
    /// A cron expression: five fields (minute, hour, day of month, month,
    /// day of week), or six with seconds first; ranges, steps, names, `L`,
    /// `#`, `W`. One of `cron` and `every`.
    #[schema(example = "0 9 * * MON-FRI")]
    cron: Option<String>,
    /// A fixed interval (`"15m"`, `"1h30m"`), at least the chain's unit,
    /// counted from `start_at` (or from when it is set). One of `cron` and
    /// `every`.
    #[schema(example = "15m")]
    every: Option<String>,
    /// The IANA time zone a cron expression is read in; `UTC` when absent.
    #[schema(example = "Europe/Berlin")]
    timezone: Option<String>,
    /// RFC 3339: no occurrence before it.
    #[schema(format = DateTime)]
    start_at: Option<String>,
    /// RFC 3339: no occurrence after it.
    #[schema(format = DateTime)]
    end_at: Option<String>,
    /// Occurrences missed while no replica ran: `skip` (the default) or
    /// `latest` (the most recent one is delivered once).
    catch_up: Option<CatchUp>,
}

use super::occurrence::present;

/// `null` is "remove", absent is "keep".
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(deserializer).map(Some)
}

/// The JSON body of `PATCH /v1/schedules/{id}`: the fields to change, as in
/// `POST`; `null` removes an optional one. Giving `cron` removes `every` and
/// the other way round; giving `payload` removes `payload_base64` and the
/// other way round.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"cron": "30 8 * * MON-FRI"}))]
pub struct SchedulePatch {
    destination: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>)]
    exchange: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Object>)]
    payload: Option<Option<Box<RawValue>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, format = Byte)]
    payload_base64: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>)]
    content_type: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<BTreeMap<String, FieldValue>>)]
    headers: Option<Option<BTreeMap<String, Box<RawValue>>>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<u64>)]
    leeway_ms: Option<Option<u64>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<u64>)]
    max_lateness_ms: Option<Option<u64>>,
    cron: Option<String>,
    every: Option<String>,
    timezone: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, format = DateTime)]
    start_at: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, format = DateTime)]
    end_at: Option<Option<String>>,
    catch_up: Option<CatchUp>,
}

/// A schedule's content and timing, checked.
#[derive(Clone, Debug)]
pub struct ValidSchedule {
    pub content: ScheduleContent,
    pub spec: TimingSpec,
    pub timing: Timing,
}

impl ScheduleRequest {
    /// Where its occurrences go, for access control before validation.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    pub fn exchange(&self) -> Option<&str> {
        self.exchange.as_deref()
    }

    /// Checks the request at `now_ms`: its id (if given), its timing (it must
    /// fire at least once after now), its content (as a task's).
    pub fn validate(
        self,
        cascade: &Cascade,
        now_ms: u64,
    ) -> Result<(Option<String>, ValidSchedule), ScheduleError> {
        if let Some(id) = &self.id {
            check_id(id)?;
        }
        let spec = TimingSpec {
            cron: self.cron,
            every: self.every,
            timezone: self.timezone.unwrap_or_else(|| "UTC".to_owned()),
            start_at: self.start_at,
            end_at: self.end_at,
            catch_up: self.catch_up.unwrap_or_default(),
            anchor_ms: None,
        };
        let content = ScheduleContent {
            destination: self.destination,
            exchange: self.exchange,
            payload: self.payload,
            payload_base64: self.payload_base64,
            content_type: self.content_type,
            headers: self.headers,
            leeway_ms: self.leeway_ms,
            max_lateness_ms: self.max_lateness_ms,
        };
        Ok((self.id, validate_parts(content, spec, cascade, now_ms)?))
    }
}

impl SchedulePatch {
    /// A new destination, if it names one.
    pub fn destination(&self) -> Option<&str> {
        self.destination.as_deref()
    }

    /// A new exchange (`Some(None)`: back to the business exchange).
    pub fn exchange(&self) -> Option<Option<&str>> {
        self.exchange.as_ref().map(Option::as_deref)
    }

    /// The schedule `content` and `spec` with this patch applied, checked as
    /// a new request is. An interval's anchor is kept unless the timing's
    /// start or interval changed.
    pub fn apply(
        self,
        mut content: ScheduleContent,
        mut spec: TimingSpec,
        cascade: &Cascade,
        now_ms: u64,
    ) -> Result<ValidSchedule, ScheduleError> {
        let reanchor = self.every.is_some() || self.cron.is_some() || self.start_at.is_some();
        if let Some(destination) = self.destination {
            content.destination = destination;
        }
        set(&mut content.exchange, self.exchange);
        set(&mut content.content_type, self.content_type);
        set(&mut content.headers, self.headers);
        set(&mut content.leeway_ms, self.leeway_ms);
        set(&mut content.max_lateness_ms, self.max_lateness_ms);
        if let Some(payload) = self.payload {
            content.payload = payload;
            content.payload_base64 = None;
        }
        if let Some(encoded) = self.payload_base64 {
            content.payload_base64 = encoded;
            content.payload = None;
        }
        if let Some(cron) = self.cron {
            spec.cron = Some(cron);
            spec.every = None;
        }
        if let Some(every) = self.every {
            spec.every = Some(every);
            spec.cron = None;
        }
        if let Some(timezone) = self.timezone {
            spec.timezone = timezone;
        }
        set(&mut spec.start_at, self.start_at);
        set(&mut spec.end_at, self.end_at);
        if let Some(catch_up) = self.catch_up {
            spec.catch_up = catch_up;
        }
        if reanchor {
            spec.anchor_ms = None;
        }
        validate_parts(content, spec, cascade, now_ms)
    }
}

fn set<T>(field: &mut Option<T>, change: Option<Option<T>>) {
    if let Some(value) = change {
        *field = value;
    }
}

/// Anchors an interval (at `start_at`, else one interval from now), compiles
/// the timing, requires an occurrence after now, and checks the content by
/// parsing the first occurrence's task.
fn validate_parts(
    content: ScheduleContent,
    mut spec: TimingSpec,
    cascade: &Cascade,
    now_ms: u64,
) -> Result<ValidSchedule, ScheduleError> {
    let unit_ms = cascade.unit_ms();
    if spec.every.is_some() && spec.anchor_ms.is_none() {
        let start = spec
            .start_at
            .as_deref()
            .and_then(crate::clock::parse_epoch_ms);
        let every = spec
            .every
            .as_deref()
            .and_then(|e| humantime::parse_duration(e).ok())
            .map_or(0, |e| u64::try_from(e.as_millis()).unwrap_or(u64::MAX));
        spec.anchor_ms = Some(start.unwrap_or(now_ms.saturating_add(every)));
    }
    let timing = Timing::compile(&spec, unit_ms)?;
    let Some(first) = timing.next_after(now_ms) else {
        let field = if spec.cron.is_some() {
            "/cron"
        } else {
            "/every"
        };
        return Err(ScheduleError::invalid(
            field,
            "never fires: no occurrence after now (and before end_at)".to_owned(),
        ));
    };
    if first == u64::MAX {
        return Err(ScheduleError::invalid(
            "/start_at",
            "too far ahead".to_owned(),
        ));
    }
    // Due now: the content is checked, not the chain's reach (an occurrence
    // becomes a task only shortly before its time).
    let probe = occurrence_body(&content, "schedule-probe", now_ms);
    let now = std::time::UNIX_EPOCH + std::time::Duration::from_millis(now_ms);
    Task::parse(&probe, cascade, now).map_err(ScheduleError::Content)?;
    Ok(ValidSchedule {
        content,
        spec,
        timing,
    })
}

/// 1 to [`MAX_SCHEDULE_ID_BYTES`] of `[A-Za-z0-9._-]`: safe in a URL path and
/// in an occurrence's task id.
pub fn check_id(id: &str) -> Result<(), ScheduleError> {
    let valid = !id.is_empty()
        && id.len() <= MAX_SCHEDULE_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(ScheduleError::invalid(
            "/id",
            format!("a schedule id is 1 to {MAX_SCHEDULE_ID_BYTES} bytes of [A-Za-z0-9._-]"),
        ))
    }
}
