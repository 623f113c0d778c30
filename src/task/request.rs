//! A task as a client states it over HTTP (a body of `POST /v1/tasks`, a
//! batch, a move), validated into a [`Task`]: each field's rules, and the
//! error that names the field at fault. Pure: the current time is an
//! argument.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use base64::Engine;
use serde::Deserialize;
use serde_json::value::RawValue;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::deadline::{AskedDeadline, DeadlineError};
use super::error::TaskError;
use super::model::{Itinerary, Task, TaskParts, leeway_offset_ms};
use crate::cascade::{Cascade, MAX_NAME_BYTES, RouteError, validate_destination};
use crate::clock::format_epoch_ms;
use crate::message::{FieldValue, is_reserved_header};

/// The JSON body of `POST /v1/tasks`, as received.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(
    as = TaskRequest,
    example = json!({"destination": "billing.invoice", "delay": "90s",
                     "payload": {"invoice": 42}, "headers": {"tenant": "acme"}})
)]
pub(crate) struct TaskRequest<'a> {
    /// Words of `[A-Za-z0-9_-]` joined by `.`: the routing key at the business
    /// exchange. With L levels at most 255 - 2L bytes.
    #[schema(example = "billing.invoice", min_length = 1, max_length = 253)]
    destination: String,
    // A number rather than an integer type, so that one beyond 64 bits is
    // reported as a delay out of range, not as a type error.
    /// One of `delay_ms`, `delay`, `deliver_at`: milliseconds from now,
    /// rounded up to the chain's precision (the millisecond with the
    /// release stage, else the unit, and on quorum queues to what the
    /// levels are sure to keep: see docs/cascade.md, Precision).
    #[schema(value_type = Option<u64>, minimum = 0, example = 90000)]
    delay_ms: Option<serde_json::Number>,
    /// A human duration: `"90s"`, `"1h30m"`, `"2s 500ms"`.
    #[schema(example = "90s")]
    delay: Option<String>,
    /// An RFC 3339 time; one in the past means now.
    #[schema(format = DateTime, example = "2026-11-22T14:05:00Z")]
    deliver_at: Option<String>,
    /// A leeway, in milliseconds: any moment within it after the due time
    /// will do. The task is delivered at a moment of its own in
    /// `[due, due + leeway_ms]`, drawn from its id, so that many tasks due
    /// at one instant arrive evenly over the window instead of at once.
    /// At most one of `leeway_ms` and `leeway`.
    #[schema(value_type = Option<u64>, minimum = 0, example = 10000)]
    leeway_ms: Option<serde_json::Number>,
    /// The leeway as a human duration: `"10s"`, `"5m"`.
    #[schema(example = "10s")]
    leeway: Option<String>,
    /// An RFC 3339 time after which the task is never published to its
    /// destination: if it could not be delivered by then (the broker down,
    /// its destination paused or paced, delayline stopped), it becomes
    /// `expired` instead. Not before the due time (with a leeway, the
    /// window's end). At most one of `deadline`, `max_lateness_ms` and
    /// `max_lateness`. Needs the release stage. A move keeps how late the
    /// task may be, not the instant.
    #[schema(format = DateTime, example = "2026-11-22T14:10:00Z")]
    deadline: Option<String>,
    /// The deadline as how late after its due time (its own moment, with
    /// a leeway) the task may still be delivered, in milliseconds.
    #[schema(value_type = Option<u64>, minimum = 0, example = 300000)]
    max_lateness_ms: Option<serde_json::Number>,
    /// `max_lateness_ms` as a human duration: `"5m"`.
    #[schema(example = "5m")]
    max_lateness: Option<String>,
    /// With a deadline: where the task's message goes instead once the
    /// deadline passed (a destination, the routing key at the exchange it
    /// is delivered to), marked `x-delayline-expired-at-ms`. Without it an
    /// expired task's message goes nowhere.
    #[schema(example = "billing.expired", min_length = 1, max_length = 253)]
    expired_destination: Option<String>,
    // Not a plain `Option`, which would take `null` for absent.
    /// Any JSON, `null` included, delivered as its exact JSON bytes
    /// (`application/json`); without it or `payload_base64` the body is empty.
    #[serde(borrow, default, deserialize_with = "present")]
    #[schema(value_type = Option<Object>)]
    payload: Option<&'a RawValue>,
    /// Raw bytes instead of `payload`.
    #[schema(format = Byte)]
    payload_base64: Option<String>,
    /// A media type overriding the default, at most 255 bytes.
    #[schema(example = "text/plain; charset=utf-8", max_length = 255)]
    content_type: Option<String>,
    // Kept raw, so that an integer too large for 64 bits is refused rather
    // than turned into a float.
    /// String, number or boolean values. Reserved: `x-delay-ms`,
    /// `x-deliver-at-ms`, `x-delayline-revision`, `x-delayline-deadline-ms`,
    /// `x-delayline-expired-to`, `x-delayline-expired-at-ms`, `x-delayline-exchange`,
    /// `x-delayline-delivery-key`, `x-delayline-expiration`,
    /// `x-delayline-user-id`, `x-delayline-schedule`,
    /// `x-delayline-occurrence`, `x-death*`, `x-first-death*`, `x-last-death*`,
    /// `CC`, `BCC`. With the other
    /// properties they must fit one AMQP frame (`headers_too_large`).
    #[serde(borrow)]
    #[schema(value_type = Option<BTreeMap<String, FieldValue>>)]
    headers: Option<BTreeMap<String, &'a RawValue>>,
    /// Becomes the message id (1 to 255 bytes); a UUID otherwise. Choosing
    /// it makes the request idempotent.
    #[schema(min_length = 1, max_length = 255)]
    id: Option<String>,
    /// The exchange it is delivered to; the business exchange when absent.
    /// Needs the release stage. With tokens, the client's `exchanges` must
    /// name it. One that does not exist when the task is due sends the task
    /// to the unroutable queue (state `unroutable`).
    #[schema(example = "orders", min_length = 1, max_length = 255)]
    exchange: Option<String>,
}

fn present<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(deserializer).map(Some)
}

/// The JSON body of `POST /v1/tasks/batch`: each task is parsed on its own so
/// that one invalid task does not reject the others.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest<'a> {
    /// At most `http.batch_limit` tasks, each as for `POST /v1/tasks`.
    #[serde(borrow)]
    #[schema(value_type = Vec<TaskRequest>)]
    pub tasks: Vec<&'a RawValue>,
}

/// Deserialises the whole of `body` as `T`, saying where a misfit is. As
/// with `serde_json::from_slice`, the value must be all there is: anything
/// but white space after it (`{…} xyz`, `{…}}}`) is malformed JSON, not
/// ignored. Every request body goes through here.
pub(crate) fn deserialize_whole<'de, T: Deserialize<'de>>(
    body: &'de [u8],
) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut deserializer)?;
    deserializer.end().map_err(|e| {
        serde_path_to_error::Error::new(serde_path_to_error::Track::new().path(), e)
    })?;
    Ok(value)
}

/// The body of `POST /v1/tasks/batch`, its tasks not yet parsed.
pub fn parse_batch(body: &[u8]) -> Result<BatchRequest<'_>, TaskError> {
    require_object(body, "", "a batch: {\"tasks\": [task, …]}")?;
    deserialize_whole(body).map_err(|e| TaskError::from_shape(&e, "", "a batch"))
}

/// A body must be a JSON object; serde would also take an array for a struct.
pub(crate) fn require_object(body: &[u8], at: &str, what: &str) -> Result<(), TaskError> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') | None => Ok(()),
        Some(b'[') => Err(TaskError::InvalidRequest(format!(
            "{}: got an array, expected {what}",
            if at.is_empty() { "the body" } else { at }
        ))),
        Some(_) => {
            // Not even JSON, or a scalar: let the parser say which.
            match serde_json::from_slice::<serde_json::Value>(body) {
                Err(error) => Err(TaskError::from_json(&error)),
                Ok(_) => Err(TaskError::InvalidRequest(format!(
                    "{}: got a single value, expected {what}",
                    if at.is_empty() { "the body" } else { at }
                ))),
            }
        }
    }
}

impl Task {
    /// Parses and validates one task body received at `now`.
    pub fn parse(body: &[u8], cascade: &Cascade, now: SystemTime) -> Result<Task, TaskError> {
        Self::parse_at(body, cascade, now, "")
    }

    /// As [`Task::parse`], for a task found at the JSON pointer `at` of a
    /// larger request (a batch's `/tasks/3`): errors say where.
    pub fn parse_at(
        body: &[u8],
        cascade: &Cascade,
        now: SystemTime,
        at: &str,
    ) -> Result<Task, TaskError> {
        require_object(body, at, "a task: {\"destination\": …, \"delay_ms\": …}")?;
        let request: TaskRequest =
            deserialize_whole(body).map_err(|e| TaskError::from_shape(&e, at, "a task"))?;
        request.validate(cascade, now).map_err(|error| error.at(at))
    }
}

/// Identifies a request body for idempotency: SHA-256 of its canonical JSON
/// (keys sorted, no whitespace), so that a retry serialised differently by
/// the client still counts as the same request.
pub fn fingerprint(body: &[u8]) -> Result<String, TaskError> {
    use sha2::{Digest, Sha256};
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| TaskError::from_json(&e))?;
    let canonical = serde_json::to_vec(&value).map_err(|e| TaskError::from_json(&e))?;
    Ok(format!("{:x}", Sha256::digest(&canonical)))
}

impl TaskRequest<'_> {
    fn validate(self, cascade: &Cascade, now: SystemTime) -> Result<Task, TaskError> {
        // Where the delay counts from depends on the chain: see
        // `Cascade::delay_start_ms`.
        let accepted_at_ms = cascade.delay_start_ms(now);
        let delay = self.requested_delay(accepted_at_ms)?;
        let leeway_ms = requested_leeway(&self.leeway_ms, &self.leeway)?;
        let delay_field = self.delay_field();
        let leeway_field = if self.leeway_ms.is_some() {
            "/leeway_ms"
        } else {
            "/leeway"
        };
        let (payload, content_type) = self.payload()?;
        let asked_deadline =
            requested_deadline(&self.deadline, &self.max_lateness_ms, &self.max_lateness)?;
        let client_id = self.id.is_some();
        let id = validate_id(self.id)?;
        let moment = delay + Duration::from_millis(leeway_offset_ms(&id, leeway_ms));
        // The whole window must fit the chain, whatever moment this id drew.
        if leeway_ms > 0 {
            let end = delay + Duration::from_millis(leeway_ms);
            cascade
                .route(end, &self.destination)
                .map_err(|error| TaskError::from(error).at(leeway_field))?;
        }
        let itinerary = Itinerary::new(cascade, &id, &self.destination, moment, accepted_at_ms)
            .map_err(|error| {
                let field = match error {
                    RouteError::DelayTooLong { .. } if leeway_ms > 0 => leeway_field,
                    RouteError::DelayTooLong { .. } => delay_field,
                    _ => "/destination",
                };
                TaskError::from(error).at(field)
            })?;
        let deadline_ms = deadline_of(asked_deadline, cascade, &id, &itinerary, leeway_ms)?;
        let expired_destination = expired_destination(self.expired_destination, deadline_ms)?;
        let parts = TaskParts {
            client_id,
            id,
            destination: self.destination,
            payload,
            content_type,
            headers: validate_headers(self.headers.unwrap_or_default())?,
            revision: 1,
            client: None,
            exchange: validate_exchange(self.exchange, cascade)?,
            leeway_ms,
            deadline_ms,
            expired_destination,
            carried: None,
        };
        Ok(Task::new(parts, itinerary))
    }

    /// The pointer of the field the delay was given in.
    fn delay_field(&self) -> &'static str {
        match (&self.delay_ms, &self.delay) {
            (Some(_), _) => "/delay_ms",
            (None, Some(_)) => "/delay",
            _ => "/deliver_at",
        }
    }

    fn requested_delay(&self, accepted_at_ms: u64) -> Result<Duration, TaskError> {
        requested_delay(
            &self.delay_ms,
            &self.delay,
            &self.deliver_at,
            accepted_at_ms,
        )
    }

    fn payload(&self) -> Result<(Vec<u8>, String), TaskError> {
        if let Some(content_type) = &self.content_type {
            if content_type.is_empty() || content_type.len() > MAX_NAME_BYTES {
                return Err(TaskError::InvalidPayload(format!(
                    "/content_type: must be 1 to {MAX_NAME_BYTES} bytes"
                )));
            }
            let is_media_type = content_type
                .parse::<mime::Mime>()
                .is_ok_and(|m| !m.type_().as_str().is_empty() && !m.subtype().as_str().is_empty());
            if !is_media_type {
                return Err(TaskError::InvalidPayload(format!(
                    "/content_type: {content_type:?} is not a media type such as \
                     \"text/plain; charset=utf-8\" (type/subtype, then optional parameters)"
                )));
            }
        }
        let (payload, default_type) = match (self.payload, &self.payload_base64) {
            (Some(_), Some(_)) => {
                return Err(TaskError::InvalidPayload(
                    "give payload or payload_base64, not both".to_owned(),
                ));
            }
            (Some(json), None) => (json.get().as_bytes().to_vec(), "application/json"),
            (None, Some(encoded)) => (
                base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|e| {
                        TaskError::InvalidPayload(format!("/payload_base64: not valid base64: {e}"))
                    })?,
                "application/octet-stream",
            ),
            (None, None) => (Vec::new(), "application/octet-stream"),
        };
        let content_type = self.content_type.as_deref().unwrap_or(default_type);
        Ok((payload, content_type.to_owned()))
    }
}

/// The JSON body of `PATCH /v1/tasks/{id}`: a new due time, nothing else.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RescheduleRequest {
    /// Exactly one of the three, as on `POST /v1/tasks`, counted from now.
    #[schema(value_type = Option<u64>, minimum = 0)]
    delay_ms: Option<serde_json::Number>,
    delay: Option<String>,
    #[schema(format = DateTime)]
    deliver_at: Option<String>,
}

/// A task's new delay, from the body of a reschedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewDelay {
    pub delay: Duration,
    /// The JSON pointer of the field it was given in, for errors found later.
    pub field: &'static str,
}

/// A task's new delay from `start_ms` (the chain's
/// [`Cascade::delay_start_ms`] of now), from the body of a reschedule:
/// exactly one of `delay_ms`, `delay` or `deliver_at`, as on submit. Only
/// the due time of a task can change.
pub fn parse_new_delay(body: &[u8], start_ms: u64) -> Result<NewDelay, TaskError> {
    require_object(body, "", "a new due time: {\"delay_ms\": …}")?;
    let request: RescheduleRequest = deserialize_whole(body).map_err(|error| {
        let unknown = error.inner().to_string().starts_with("unknown field");
        if unknown && error.path().iter().count() == 1 {
            TaskError::InvalidRequest(format!(
                "/{}: only a task's due time can change: give exactly one of delay_ms, \
                     delay or deliver_at",
                error.path()
            ))
        } else {
            TaskError::from_shape(&error, "", "a new due time")
        }
    })?;
    let delay = requested_delay(
        &request.delay_ms,
        &request.delay,
        &request.deliver_at,
        start_ms,
    )?;
    let field = match (&request.delay_ms, &request.delay) {
        (Some(_), _) => "/delay_ms",
        (None, Some(_)) => "/delay",
        _ => "/deliver_at",
    };
    Ok(NewDelay { delay, field })
}

/// The delay a request asks for with exactly one of its three fields, from
/// `accepted_at_ms`; a `deliver_at` in the past is a zero delay.
fn requested_delay(
    delay_ms: &Option<serde_json::Number>,
    delay: &Option<String>,
    deliver_at: &Option<String>,
    accepted_at_ms: u64,
) -> Result<Duration, TaskError> {
    match (delay_ms, delay, deliver_at) {
        (Some(ms), None, None) => delay_of_ms(ms, "/delay_ms"),
        (None, Some(text), None) => humantime::parse_duration(text).map_err(|e| {
            // A bare number has no unit: milliseconds are `delay_ms`.
            let hint = match text.trim().parse::<u64>() {
                Ok(ms) => format!(" (for {ms} milliseconds, give \"delay_ms\": {ms})"),
                Err(_) => String::new(),
            };
            TaskError::InvalidDelay(format!(
                "/delay: {text:?} is not a duration such as \"90s\" or \"1h30m\": {e}{hint}"
            ))
        }),
        (None, None, Some(text)) => {
            let at = OffsetDateTime::parse(text, &Rfc3339).map_err(|e| {
                    TaskError::InvalidDelay(format!(
                        "/deliver_at: {text:?} is not an RFC 3339 time such as \"2026-01-02T15:04:05Z\": {e}"
                    ))
                })?;
            let from = i128::from(accepted_at_ms) * 1_000_000;
            let nanos = at.unix_timestamp_nanos() - from;
            // A deliver_at in the past means "now".
            Ok(Duration::from_nanos(
                u64::try_from(nanos.max(0)).unwrap_or(u64::MAX),
            ))
        }
        _ => Err(TaskError::InvalidDelay(
            "give exactly one of delay_ms, delay or deliver_at".to_owned(),
        )),
    }
}

/// The leeway a request asks for with at most one of its two
/// fields, in milliseconds (0: none).
fn requested_leeway(
    leeway_ms: &Option<serde_json::Number>,
    leeway: &Option<String>,
) -> Result<u64, TaskError> {
    let window = match (leeway_ms, leeway) {
        (None, None) => return Ok(0),
        (Some(ms), None) => delay_of_ms(ms, "/leeway_ms")?,
        (None, Some(text)) => humantime::parse_duration(text).map_err(|e| {
            TaskError::InvalidDelay(format!(
                "/leeway: {text:?} is not a duration such as \"10s\" or \"5m\": {e}"
            ))
        })?,
        (Some(_), Some(_)) => {
            return Err(TaskError::InvalidDelay(
                "give leeway_ms or leeway, not both".to_owned(),
            ));
        }
    };
    Ok(u64::try_from(window.as_millis()).unwrap_or(u64::MAX))
}

/// The deadline of task `id`, if it asks for one: after the whole of its
/// window, whatever moment its id drew in it.
fn deadline_of(
    asked: Option<(AskedDeadline, &'static str)>,
    cascade: &Cascade,
    id: &str,
    itinerary: &Itinerary,
    leeway_ms: u64,
) -> Result<Option<u64>, TaskError> {
    let Some((asked, field)) = asked else {
        return Ok(None);
    };
    if !cascade.release_stage() {
        return Err(TaskError::InvalidDeadline(format!(
            "{field}: needs the release stage (a ledger): without it the broker delivers \
             the task however late"
        )));
    }
    let moment_ms = itinerary.deliver_at_ms;
    let due_ms = moment_ms.saturating_sub(leeway_offset_ms(id, leeway_ms));
    let window_end_ms = moment_ms.max(due_ms.saturating_add(leeway_ms));
    match asked.resolve(moment_ms, window_end_ms) {
        Ok(deadline_ms) => Ok(Some(deadline_ms)),
        Err(DeadlineError::BeforeDue {
            deadline_ms,
            window_end_ms,
        }) => Err(TaskError::InvalidDeadline(format!(
            "{field}: {} is before the task is due ({}{}): it could never be delivered",
            format_epoch_ms(deadline_ms),
            format_epoch_ms(window_end_ms),
            if leeway_ms > 0 {
                ", its leeway's end"
            } else {
                ""
            }
        ))),
        Err(DeadlineError::TooLate) => Err(TaskError::InvalidDeadline(format!(
            "{field}: past {}, the latest deadline there is",
            format_epoch_ms(super::deadline::LATEST_MS)
        ))),
    }
}

/// Where an expired task's message goes: a destination, given only with a
/// deadline.
fn expired_destination(
    destination: Option<String>,
    deadline_ms: Option<u64>,
) -> Result<Option<String>, TaskError> {
    let Some(destination) = destination else {
        return Ok(None);
    };
    if deadline_ms.is_none() {
        return Err(TaskError::InvalidDeadline(
            "/expired_destination: needs a deadline (deadline, max_lateness_ms or \
             max_lateness): without one the task never expires"
                .to_owned(),
        ));
    }
    validate_destination(&destination)
        .map_err(|error| TaskError::from(error).at("/expired_destination"))?;
    Ok(Some(destination))
}

/// The deadline a request asks for with at most one of its three fields,
/// and the field's pointer.
fn requested_deadline(
    deadline: &Option<String>,
    max_lateness_ms: &Option<serde_json::Number>,
    max_lateness: &Option<String>,
) -> Result<Option<(AskedDeadline, &'static str)>, TaskError> {
    let lateness = |duration: Duration| {
        AskedDeadline::LatenessAtMost(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    };
    let asked = match (deadline, max_lateness_ms, max_lateness) {
        (None, None, None) => return Ok(None),
        (Some(text), None, None) => {
            let at = OffsetDateTime::parse(text, &Rfc3339).map_err(|e| {
                TaskError::InvalidDeadline(format!(
                    "/deadline: {text:?} is not an RFC 3339 time such as \
                     \"2026-01-02T15:04:05Z\": {e}"
                ))
            })?;
            let ms = at.unix_timestamp_nanos().div_euclid(1_000_000).max(0);
            (
                AskedDeadline::At(u64::try_from(ms).unwrap_or(u64::MAX)),
                "/deadline",
            )
        }
        (None, Some(ms), None) => {
            let duration = delay_of_ms(ms, "/max_lateness_ms")
                .map_err(|error| TaskError::InvalidDeadline(error.to_string()))?;
            (lateness(duration), "/max_lateness_ms")
        }
        (None, None, Some(text)) => {
            let duration = humantime::parse_duration(text).map_err(|e| {
                TaskError::InvalidDeadline(format!(
                    "/max_lateness: {text:?} is not a duration such as \"30s\" or \"5m\": {e}"
                ))
            })?;
            (lateness(duration), "/max_lateness")
        }
        _ => {
            return Err(TaskError::InvalidDeadline(
                "give at most one of deadline, max_lateness_ms or max_lateness".to_owned(),
            ));
        }
    };
    Ok(Some(asked))
}

/// A number of milliseconds as given in `field` (`/delay_ms`, `/leeway_ms`):
/// a whole number from 0; one too large for any chain (beyond 64 bits
/// included) is out of range, not mistyped.
fn delay_of_ms(ms: &serde_json::Number, field: &str) -> Result<Duration, TaskError> {
    if let Some(ms) = ms.as_u64() {
        return Ok(Duration::from_millis(ms));
    }
    match ms.as_f64() {
        Some(f) if f < 0.0 => Err(TaskError::InvalidDelay(format!(
            "{field}: must not be negative, got {ms}"
        ))),
        Some(f) if f.fract() == 0.0 => Err(TaskError::DelayOutOfRange(format!(
            "{field}: {ms} is longer than any delay a chain can hold"
        ))),
        _ => Err(TaskError::InvalidDelay(format!(
            "{field}: must be a whole number of milliseconds, got {ms}"
        ))),
    }
}

fn validate_id(id: Option<String>) -> Result<String, TaskError> {
    let Some(id) = id else {
        // Time-ordered (UUIDv7; the bits after the time are random): the
        // ledger's primary-key index then grows at its end, where a random id
        // writes a page of its own somewhere in an index too big to cache.
        return Ok(uuid::Uuid::now_v7().to_string());
    };
    if id.is_empty() || id.len() > MAX_NAME_BYTES || id.chars().any(char::is_control) {
        return Err(TaskError::InvalidId(format!(
            "/id: must be 1 to {MAX_NAME_BYTES} bytes without control characters"
        )));
    }
    Ok(id)
}

/// The exchange a task names: a valid AMQP name; `None` for the business
/// exchange itself. Only the release stage can deliver elsewhere.
fn validate_exchange(
    exchange: Option<String>,
    cascade: &Cascade,
) -> Result<Option<String>, TaskError> {
    let Some(exchange) = exchange else {
        return Ok(None);
    };
    let invalid = |why: String| Err(TaskError::InvalidExchange(format!("/exchange: {why}")));
    if exchange == cascade.business_exchange() {
        return Ok(None);
    }
    if !cascade.release_stage() {
        return invalid(
            "needs the release stage (a ledger): without it the broker delivers to the \
             business exchange"
                .to_owned(),
        );
    }
    if exchange.is_empty() || exchange.len() > MAX_NAME_BYTES {
        return invalid(format!("must be 1 to {MAX_NAME_BYTES} bytes"));
    }
    if let Some(c) = exchange
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':')))
    {
        return invalid(format!(
            "{exchange:?} contains {c:?}; use letters, digits, '.', '_', '-' or ':'"
        ));
    }
    Ok(Some(exchange))
}

fn validate_headers(
    headers: BTreeMap<String, &RawValue>,
) -> Result<Vec<(String, FieldValue)>, TaskError> {
    headers
        .into_iter()
        .map(|(name, value)| {
            if name.is_empty() || name.len() > MAX_NAME_BYTES {
                return Err(TaskError::InvalidHeader(format!(
                    "/headers: header names must be 1 to {MAX_NAME_BYTES} bytes"
                )));
            }
            if is_reserved_header(&name) {
                return Err(TaskError::InvalidHeader(format!(
                    "{}: reserved for delayline or the broker",
                    header_pointer(&name)
                )));
            }
            Ok((name.clone(), header_value(&name, value.get())?))
        })
        .collect()
}

/// The JSON pointer of header `name` (RFC 6901 escapes `~` and `/`).
fn header_pointer(name: &str) -> String {
    format!("/headers/{}", name.replace('~', "~0").replace('/', "~1"))
}

/// One header's value from its JSON text: a string, a boolean, an integer
/// that fits 64 signed bits, or a number with a fraction or an exponent.
fn header_value(name: &str, json: &str) -> Result<FieldValue, TaskError> {
    let invalid =
        |what: String| TaskError::InvalidHeader(format!("{}: {what}", header_pointer(name)));
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| invalid(e.to_string()))?;
    match value {
        serde_json::Value::String(s) => Ok(FieldValue::Str(s)),
        serde_json::Value::Bool(b) => Ok(FieldValue::Bool(b)),
        serde_json::Value::Number(n) => {
            let integer = !json.contains(['.', 'e', 'E']);
            match (integer, n.as_i64(), n.as_f64()) {
                (true, Some(i), _) => Ok(FieldValue::Int(i)),
                (true, None, _) => Err(invalid(format!(
                    "{json} does not fit a signed 64-bit integer \
                     (-9223372036854775808 to 9223372036854775807)"
                ))),
                (false, _, Some(f)) => Ok(FieldValue::Float(f)),
                (false, _, None) => Err(invalid(format!("{json} is not a number AMQP can carry"))),
            }
        }
        other => Err(invalid(format!(
            "must be a string, number or boolean, got {}",
            match other {
                serde_json::Value::Null => "null",
                serde_json::Value::Array(_) => "an array",
                _ => "an object",
            }
        ))),
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

#[cfg(test)]
#[path = "reference_tests.rs"]
mod reference_tests;
