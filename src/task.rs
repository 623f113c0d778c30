//! A task as submitted over HTTP, validated into what gets published.
//!
//! Pure: the current time is an argument, so every rule (one delay field,
//! past `deliver_at` means now, never early) is unit-tested without a clock.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::cascade::{Cascade, MAX_NAME_BYTES, Route, RouteError};
use crate::clock::format_epoch_ms;
use crate::message::{FieldValue, TaskMessage, is_reserved_header};

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
    /// `x-deliver-at-ms`, `x-delayline-revision`, `x-delayline-exchange`,
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

/// A valid task, ready to publish.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    pub id: String,
    /// The client chose the id, which then names the request for idempotency.
    pub client_id: bool,
    pub destination: String,
    pub route: Route,
    /// Epoch milliseconds at acceptance: the start of the delay
    /// ([`Cascade::delay_start_ms`]).
    pub accepted_at_ms: u64,
    /// `accepted_at_ms + route.delay_ms`: the earliest moment of delivery.
    pub deliver_at_ms: u64,
    pub payload: Vec<u8>,
    pub content_type: String,
    pub headers: Vec<(String, FieldValue)>,
    /// 1, plus one per reschedule (see [`crate::message::REVISION_HEADER`]).
    pub revision: u64,
    /// The API client that submitted it, when tokens are required.
    pub client: Option<String>,
    /// The exchange it is delivered to, when not the business exchange.
    pub exchange: Option<String>,
    /// Its leeway (0: none): `deliver_at_ms` is the moment drawn in
    /// it, [`leeway_offset_ms`] after the due time asked for.
    pub leeway_ms: u64,
    /// A message taken in over AMQP (an ingress): its properties, delivered
    /// as they came (see [`crate::message::taken_in`]). `content_type` and
    /// `headers` are then a copy, for inspection.
    pub carried: Option<lapin::BasicProperties>,
}

/// Where an accepted task is:
/// - `pending`: in the ledger, not yet confirmed by the broker;
/// - `scheduled`: in the cascade (owned by the broker);
/// - `releasing`: due, taken by the release stage, being delivered: too late
///   to cancel or move;
/// - `waiting`: due, and held in the ledger by a release limit (`held_by`
///   names it) until the limit lets it go; it can still be cancelled or moved;
/// - `staged`: kept in the ledger alone until its moment, when the ledger's
///   staged release delivers it: a burst's task, through the levels well
///   before its time (given a lead), or never in them (they had no room for
///   it when it was admitted); it can still be cancelled or moved;
/// - `delivered`: confirmed by the business exchange (release stage only;
///   without it a task stays `scheduled`);
/// - `unroutable`: released, but no queue was bound for its routing key: it
///   waits in the unroutable queue (release stage only);
/// - `cancelled`: withdrawn; it is never delivered;
/// - `failed`: the broker can never take it (quarantined, with the reason in
///   `last_error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    Pending,
    Scheduled,
    Releasing,
    /// Due, and held in the ledger by a release limit.
    Waiting,
    /// Not yet due, kept in the ledger alone until its moment.
    Staged,
    Delivered,
    Unroutable,
    Cancelled,
    Failed,
}

impl TaskState {
    pub const ALL: [TaskState; 9] = [
        TaskState::Pending,
        TaskState::Scheduled,
        TaskState::Releasing,
        TaskState::Waiting,
        TaskState::Staged,
        TaskState::Delivered,
        TaskState::Unroutable,
        TaskState::Cancelled,
        TaskState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Scheduled => "scheduled",
            TaskState::Releasing => "releasing",
            TaskState::Waiting => "waiting",
            TaskState::Staged => "staged",
            TaskState::Delivered => "delivered",
            TaskState::Unroutable => "unroutable",
            TaskState::Cancelled => "cancelled",
            TaskState::Failed => "failed",
        }
    }

    /// The states a cancel or a reschedule can still change a task in, in
    /// the order the ledger tries them (pending first, to count those).
    pub const CHANGEABLE: [TaskState; 4] = [
        TaskState::Pending,
        TaskState::Scheduled,
        TaskState::Waiting,
        TaskState::Staged,
    ];

    /// Whether a cancel or a reschedule can still change the task.
    pub fn is_changeable(self) -> bool {
        Self::CHANGEABLE.contains(&self)
    }

    pub fn parse(text: &str) -> Option<TaskState> {
        Self::ALL.into_iter().find(|state| state.as_str() == text)
    }
}

/// The due time asked for of task `id`, delivered at `deliver_at_ms` in a
/// leeway of `leeway_ms`: the window's start. `None` without one.
pub fn leeway_due_at(id: &str, deliver_at_ms: u64, leeway_ms: u64) -> Option<String> {
    (leeway_ms > 0)
        .then(|| format_epoch_ms(deliver_at_ms.saturating_sub(leeway_offset_ms(id, leeway_ms))))
}

/// What a 202 answers for an accepted task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskAccepted {
    pub id: String,
    pub destination: String,
    pub routing_key: String,
    pub delay_ms: u64,
    /// When it is delivered: with a leeway, the moment drawn in it.
    pub deliver_at: String,
    /// Its leeway, when it has one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub leeway_ms: Option<u64>,
    /// With a leeway: the due time asked for, the window's start.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(format = DateTime)]
    pub due_at: Option<String>,
    pub state: TaskState,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    #[error("request body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    InvalidDestination(String),
    #[error("{0}")]
    InvalidDelay(String),
    #[error("{0}")]
    DelayOutOfRange(String),
    #[error("{0}")]
    InvalidPayload(String),
    #[error("{0}")]
    InvalidHeader(String),
    #[error("{0}")]
    InvalidId(String),
    #[error("{0}")]
    InvalidExchange(String),
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

impl TaskError {
    /// The same error, said of the field at the JSON pointer `at`.
    pub fn at_pointer(self, at: &str) -> TaskError {
        self.at(at)
    }

    /// The same error, said of the task at the JSON pointer `at`.
    fn at(self, at: &str) -> TaskError {
        if at.is_empty() {
            return self;
        }
        // "/tasks/3" and "/delay_ms: …" make "/tasks/3/delay_ms: …".
        let locate = |message: String| match message.starts_with('/') {
            true => format!("{at}{message}"),
            false => format!("{at}: {message}"),
        };
        match self {
            TaskError::MalformedJson(m) => TaskError::MalformedJson(locate(m)),
            TaskError::InvalidRequest(m) => TaskError::InvalidRequest(locate(m)),
            TaskError::InvalidDestination(m) => TaskError::InvalidDestination(locate(m)),
            TaskError::InvalidDelay(m) => TaskError::InvalidDelay(locate(m)),
            TaskError::DelayOutOfRange(m) => TaskError::DelayOutOfRange(locate(m)),
            TaskError::InvalidPayload(m) => TaskError::InvalidPayload(locate(m)),
            TaskError::InvalidHeader(m) => TaskError::InvalidHeader(locate(m)),
            TaskError::InvalidId(m) => TaskError::InvalidId(locate(m)),
            TaskError::InvalidExchange(m) => TaskError::InvalidExchange(locate(m)),
        }
    }

    /// The stable, machine-readable code of the error.
    pub fn code(&self) -> &'static str {
        match self {
            TaskError::MalformedJson(_) => "malformed_json",
            TaskError::InvalidRequest(_) => "invalid_request",
            TaskError::InvalidDestination(_) => "invalid_destination",
            TaskError::InvalidDelay(_) => "invalid_delay",
            TaskError::DelayOutOfRange(_) => "delay_out_of_range",
            TaskError::InvalidPayload(_) => "invalid_payload",
            TaskError::InvalidHeader(_) => "invalid_header",
            TaskError::InvalidId(_) => "invalid_id",
            TaskError::InvalidExchange(_) => "invalid_exchange",
        }
    }

    pub(crate) fn from_json(error: &serde_json::Error) -> Self {
        match error.classify() {
            serde_json::error::Category::Data => TaskError::InvalidRequest(error.to_string()),
            _ => TaskError::MalformedJson(error.to_string()),
        }
    }

    /// A body that does not fit the request's shape, said in the request's
    /// terms: where (a JSON pointer below `at`), what was found, and what
    /// is accepted there. `object` names the request in words ("a task",
    /// "a bulk request"), for a field it does not have.
    pub(crate) fn from_shape(
        error: &serde_path_to_error::Error<serde_json::Error>,
        at: &str,
        object: &str,
    ) -> Self {
        let inner = error.inner();
        if !matches!(inner.classify(), serde_json::error::Category::Data) {
            return TaskError::MalformedJson(inner.to_string());
        }
        let pointer = json_pointer(at, error.path());
        let text = inner.to_string();
        // serde's words, less the position (of no use in a JSON body) and the backquotes.
        let text = text
            .split(" at line ")
            .next()
            .unwrap_or(&text)
            .replace('`', "\"");
        if let Some(unknown) = text.strip_prefix("unknown field ") {
            let name = unknown.split(',').next().unwrap_or(unknown);
            // serde lists the struct's own fields, so the list cannot drift.
            let fields = unknown
                .split_once("expected one of ")
                .map_or(String::new(), |(_, list)| list.replace('"', ""));
            let container = pointer
                .rsplit_once('/')
                .map_or("", |(container, _)| container);
            let owner = if container == at { object } else { container };
            return TaskError::InvalidRequest(format!(
                "{pointer}: unknown field {name}; the fields of {owner} are {fields}"
            ));
        }
        if let Some(missing) = text.strip_prefix("missing field ") {
            // The pointer is the object's; the field is named by serde.
            let name = missing.trim_matches('"');
            let accepts = accepted(name).map_or(String::new(), |what| format!(" ({what})"));
            return TaskError::InvalidRequest(format!(
                "{pointer}/{name}: missing; {object} needs \"{name}\"{accepts}"
            ));
        }
        let field = pointer.rsplit('/').next().unwrap_or_default();
        let found = text
            .strip_prefix("invalid type: ")
            .and_then(|t| t.split(", expected").next())
            .unwrap_or(&text);
        let expected = accepted(field)
            .unwrap_or_else(|| text.split(", expected ").nth(1).unwrap_or("another value"));
        let hint = if field == "delay" && found.starts_with("integer") {
            " (a number of milliseconds is \"delay_ms\")"
        } else {
            ""
        };
        TaskError::InvalidRequest(format!("{pointer}: got {found}, expected {expected}{hint}"))
    }
}

/// The JSON pointer of a place serde found wrong, below `at`.
fn json_pointer(at: &str, path: &serde_path_to_error::Path) -> String {
    let mut pointer = at.to_owned();
    for segment in path.iter() {
        match segment {
            serde_path_to_error::Segment::Seq { index } => pointer.push_str(&format!("/{index}")),
            serde_path_to_error::Segment::Map { key }
            | serde_path_to_error::Segment::Enum { variant: key } => {
                pointer.push('/');
                pointer.push_str(key);
            }
            serde_path_to_error::Segment::Unknown => pointer.push_str("/?"),
        }
    }
    pointer
}

/// What a request field accepts, in the reference's words.
fn accepted(field: &str) -> Option<&'static str> {
    Some(match field {
        "destination" => "a string: words of A-Z, a-z, 0-9, _ and - joined by dots",
        "delay_ms" => "a whole number of milliseconds, 0 or more",
        "delay" => "a duration string such as \"90s\" or \"1h30m\"",
        "deliver_at" => "an RFC 3339 time string such as \"2026-01-02T15:04:05Z\"",
        "payload_base64" => "a base64 string",
        "content_type" => "a media type string such as \"text/plain\"",
        "headers" => "an object of string, number or boolean values",
        "id" => "a string of 1 to 255 bytes",
        "tasks" => "an array of task objects",
        _ => return None,
    })
}

impl From<RouteError> for TaskError {
    fn from(error: RouteError) -> Self {
        match error {
            RouteError::DelayTooLong { .. } => TaskError::DelayOutOfRange(error.to_string()),
            RouteError::InvalidDestination(_) | RouteError::DestinationTooLong { .. } => {
                TaskError::InvalidDestination(error.to_string())
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

    pub fn accepted(&self, state: TaskState) -> TaskAccepted {
        TaskAccepted {
            id: self.id.clone(),
            destination: self.destination.clone(),
            routing_key: self.route.routing_key.clone(),
            delay_ms: self.route.delay_ms,
            deliver_at: format_epoch_ms(self.deliver_at_ms),
            leeway_ms: (self.leeway_ms > 0).then_some(self.leeway_ms),
            due_at: leeway_due_at(&self.id, self.deliver_at_ms, self.leeway_ms),
            state,
        }
    }

    /// The delay the client was granted, whatever route the message takes now.
    pub fn granted_delay_ms(&self) -> u64 {
        self.deliver_at_ms - self.accepted_at_ms
    }

    /// What its message is made of ([`crate::message::of_task`]).
    pub fn message(&self) -> TaskMessage<'_> {
        TaskMessage {
            id: &self.id,
            route: &self.route,
            accepted_at_ms: self.accepted_at_ms,
            deliver_at_ms: self.deliver_at_ms,
            revision: self.revision,
            payload: &self.payload,
            content_type: &self.content_type,
            headers: &self.headers,
            exchange: self.exchange.as_deref(),
            carried: self.carried.as_ref(),
        }
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
        let route = cascade.route(moment, &self.destination).map_err(|error| {
            let field = match error {
                RouteError::DelayTooLong { .. } if leeway_ms > 0 => leeway_field,
                RouteError::DelayTooLong { .. } => delay_field,
                _ => "/destination",
            };
            TaskError::from(error).at(field)
        })?;
        let route = cascade.in_task_shard(route, &id);
        Ok(Task {
            client_id,
            id,
            deliver_at_ms: accepted_at_ms + route.delay_ms,
            accepted_at_ms,
            route,
            destination: self.destination,
            payload,
            content_type,
            headers: validate_headers(self.headers.unwrap_or_default())?,
            revision: 1,
            client: None,
            exchange: validate_exchange(self.exchange, cascade)?,
            leeway_ms,
            carried: None,
        })
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

/// Where in its leeway of `window_ms` the task `id` is delivered:
/// `[0, window_ms]` milliseconds after its due time, drawn from its id
/// (FNV-1a, stable across versions and replicas), so that the same task
/// keeps its moment when it is moved or admitted again, and many tasks
/// spread evenly over the window without knowing of each other.
pub fn leeway_offset_ms(id: &str, window_ms: u64) -> u64 {
    if window_ms == 0 {
        return 0;
    }
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash % window_ms.saturating_add(1)
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
mod tests {
    use super::*;
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
        let spent: u128 = digits
            .iter()
            .enumerate()
            .filter(|(_, digit)| **digit == "1")
            .map(|(i, _)| {
                let level = (levels - 1 - i) as u32;
                u128::from(cascade.level_ttl_ms(level)) * 1_000_000 - loss_ns
            })
            .sum();
        sent_ns + spent
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
        let task =
            parse(r#"{"destination":"a.b","delay_ms":150,"payload":{"k": [1, 2]}}"#).unwrap();
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
        let task = parse(r#"{"destination":"d","delay_ms":0,"payload_base64":"AAEC/w==","content_type":"image/x"}"#)
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
        let task = parse(
            r#"{"destination":"d","delay_ms":0,"headers":{"s":"7","i":7,"f":7.0,"b":false}}"#,
        )
        .unwrap();
        let stored: BTreeMap<_, _> = task.headers.iter().cloned().collect();
        let json = serde_json::to_string(&stored).unwrap();
        let back: BTreeMap<String, FieldValue> = serde_json::from_str(&json).unwrap();
        assert_eq!(back.into_iter().collect::<Vec<_>>(), task.headers);
    }

    #[test]
    fn fingerprints_ignore_formatting_but_not_content() {
        let a =
            fingerprint(br#"{"destination":"d","delay_ms":5,"payload":{"x":1,"y":2}}"#).unwrap();
        let b = fingerprint(
            b"{ \"payload\": {\"y\":2, \"x\":1}, \"delay_ms\":5, \"destination\":\"d\" }",
        )
        .unwrap();
        let c =
            fingerprint(br#"{"destination":"d","delay_ms":6,"payload":{"x":1,"y":2}}"#).unwrap();
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
}

#[cfg(test)]
mod reference_tests {
    use super::*;
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
             delay_ms, delay, deliver_at, leeway_ms, leeway, payload, payload_base64, \
             content_type, headers, id, exchange"
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
}
