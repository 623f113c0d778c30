//! Every error code the API answers with, in one enum that knows its HTTP
//! status and when it is given. The API reference's table of error codes (`docs/api.md`) and the
//! OpenAPI document's `ErrorBody.code` are checked against (or generated
//! from) [`ErrorCode::ALL`]; an [`super::error::ApiError`] can only be made
//! from one of these.

use axum::http::StatusCode;

/// A stable error code: its name in answers, its status, and when it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    BadRequest,
    MalformedJson,
    InvalidIdempotencyKey,
    UnreadableBody,
    InvalidQuery,
    Unauthenticated,
    InvalidToken,
    Forbidden,
    ForbiddenDestination,
    ForbiddenExchange,
    TaskNotFound,
    ScheduleNotFound,
    LimitNotFound,
    OperationNotFound,
    ParkedNotFound,
    RetryPolicyNotFound,
    NotFound,
    MethodNotAllowed,
    BodyTimeout,
    IdempotencyConflict,
    TooLate,
    TaskCancelled,
    TaskFailed,
    TaskNotExpired,
    PayloadNotKept,
    ScheduleExists,
    ScheduleChanged,
    RetryPolicyConfigured,
    RetryQueueTaken,
    PayloadTooLarge,
    UriTooLong,
    UnsupportedMediaType,
    InvalidRequest,
    InvalidDestination,
    InvalidDelay,
    DelayOutOfRange,
    InvalidPayload,
    InvalidHeader,
    HeadersTooLarge,
    InvalidId,
    InvalidExchange,
    InvalidDeadline,
    InvalidSchedule,
    InvalidLimit,
    InvalidRetryPolicy,
    BatchTooLarge,
    RateLimited,
    QuotaExceeded,
    RequestHeadersTooLarge,
    Internal,
    LedgerDisabled,
    ReleaseStageDisabled,
    Overloaded,
    DeadlineExceeded,
    TooManyConnections,
    LedgerFull,
    LedgerUnavailable,
    BrokerUnavailable,
    BrokerBlocked,
    BrokerTimeout,
    BrokerRejected,
    BrokerUnroutable,
    NotReady,
    BrokerMisconfigured,
    HttpVersionNotSupported,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 65] = [
        ErrorCode::BadRequest,
        ErrorCode::MalformedJson,
        ErrorCode::InvalidIdempotencyKey,
        ErrorCode::UnreadableBody,
        ErrorCode::InvalidQuery,
        ErrorCode::Unauthenticated,
        ErrorCode::InvalidToken,
        ErrorCode::Forbidden,
        ErrorCode::ForbiddenDestination,
        ErrorCode::ForbiddenExchange,
        ErrorCode::TaskNotFound,
        ErrorCode::ScheduleNotFound,
        ErrorCode::LimitNotFound,
        ErrorCode::OperationNotFound,
        ErrorCode::ParkedNotFound,
        ErrorCode::RetryPolicyNotFound,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::BodyTimeout,
        ErrorCode::IdempotencyConflict,
        ErrorCode::TooLate,
        ErrorCode::TaskCancelled,
        ErrorCode::TaskFailed,
        ErrorCode::TaskNotExpired,
        ErrorCode::PayloadNotKept,
        ErrorCode::ScheduleExists,
        ErrorCode::ScheduleChanged,
        ErrorCode::RetryPolicyConfigured,
        ErrorCode::RetryQueueTaken,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UriTooLong,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::InvalidRequest,
        ErrorCode::InvalidDestination,
        ErrorCode::InvalidDelay,
        ErrorCode::DelayOutOfRange,
        ErrorCode::InvalidPayload,
        ErrorCode::InvalidHeader,
        ErrorCode::HeadersTooLarge,
        ErrorCode::InvalidId,
        ErrorCode::InvalidExchange,
        ErrorCode::InvalidDeadline,
        ErrorCode::InvalidSchedule,
        ErrorCode::InvalidLimit,
        ErrorCode::InvalidRetryPolicy,
        ErrorCode::BatchTooLarge,
        ErrorCode::RateLimited,
        ErrorCode::QuotaExceeded,
        ErrorCode::RequestHeadersTooLarge,
        ErrorCode::Internal,
        ErrorCode::LedgerDisabled,
        ErrorCode::ReleaseStageDisabled,
        ErrorCode::Overloaded,
        ErrorCode::DeadlineExceeded,
        ErrorCode::TooManyConnections,
        ErrorCode::LedgerFull,
        ErrorCode::LedgerUnavailable,
        ErrorCode::BrokerUnavailable,
        ErrorCode::BrokerBlocked,
        ErrorCode::BrokerTimeout,
        ErrorCode::BrokerRejected,
        ErrorCode::BrokerUnroutable,
        ErrorCode::NotReady,
        ErrorCode::BrokerMisconfigured,
        ErrorCode::HttpVersionNotSupported,
    ];

    /// The code as answers spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::MalformedJson => "malformed_json",
            ErrorCode::InvalidIdempotencyKey => "invalid_idempotency_key",
            ErrorCode::UnreadableBody => "unreadable_body",
            ErrorCode::InvalidQuery => "invalid_query",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::InvalidToken => "invalid_token",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::ForbiddenDestination => "forbidden_destination",
            ErrorCode::ForbiddenExchange => "forbidden_exchange",
            ErrorCode::TaskNotFound => "task_not_found",
            ErrorCode::ScheduleNotFound => "schedule_not_found",
            ErrorCode::LimitNotFound => "limit_not_found",
            ErrorCode::OperationNotFound => "operation_not_found",
            ErrorCode::ParkedNotFound => "parked_not_found",
            ErrorCode::RetryPolicyNotFound => "retry_policy_not_found",
            ErrorCode::RetryPolicyConfigured => "retry_policy_configured",
            ErrorCode::RetryQueueTaken => "retry_queue_taken",
            ErrorCode::InvalidRetryPolicy => "invalid_retry_policy",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::BodyTimeout => "body_timeout",
            ErrorCode::IdempotencyConflict => "idempotency_conflict",
            ErrorCode::TooLate => "too_late",
            ErrorCode::TaskCancelled => "task_cancelled",
            ErrorCode::TaskFailed => "task_failed",
            ErrorCode::TaskNotExpired => "task_not_expired",
            ErrorCode::PayloadNotKept => "payload_not_kept",
            ErrorCode::ScheduleExists => "schedule_exists",
            ErrorCode::ScheduleChanged => "schedule_changed",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UriTooLong => "uri_too_long",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::InvalidDestination => "invalid_destination",
            ErrorCode::InvalidDelay => "invalid_delay",
            ErrorCode::DelayOutOfRange => "delay_out_of_range",
            ErrorCode::InvalidPayload => "invalid_payload",
            ErrorCode::InvalidHeader => "invalid_header",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::InvalidId => "invalid_id",
            ErrorCode::InvalidExchange => "invalid_exchange",
            ErrorCode::InvalidDeadline => "invalid_deadline",
            ErrorCode::InvalidSchedule => "invalid_schedule",
            ErrorCode::InvalidLimit => "invalid_limit",
            ErrorCode::BatchTooLarge => "batch_too_large",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::RequestHeadersTooLarge => "request_headers_too_large",
            ErrorCode::Internal => "internal",
            ErrorCode::LedgerDisabled => "ledger_disabled",
            ErrorCode::ReleaseStageDisabled => "release_stage_disabled",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::DeadlineExceeded => "deadline_exceeded",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::LedgerFull => "ledger_full",
            ErrorCode::LedgerUnavailable => "ledger_unavailable",
            ErrorCode::BrokerUnavailable => "broker_unavailable",
            ErrorCode::BrokerBlocked => "broker_blocked",
            ErrorCode::BrokerTimeout => "broker_timeout",
            ErrorCode::BrokerRejected => "broker_rejected",
            ErrorCode::BrokerUnroutable => "broker_unroutable",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::BrokerMisconfigured => "broker_misconfigured",
            ErrorCode::HttpVersionNotSupported => "http_version_not_supported",
        }
    }

    /// The HTTP status it is answered with.
    pub const fn status(self) -> StatusCode {
        match self {
            ErrorCode::BadRequest
            | ErrorCode::MalformedJson
            | ErrorCode::InvalidIdempotencyKey
            | ErrorCode::UnreadableBody
            | ErrorCode::InvalidQuery => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthenticated | ErrorCode::InvalidToken => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden
            | ErrorCode::ForbiddenDestination
            | ErrorCode::ForbiddenExchange => StatusCode::FORBIDDEN,
            ErrorCode::TaskNotFound
            | ErrorCode::ScheduleNotFound
            | ErrorCode::LimitNotFound
            | ErrorCode::OperationNotFound
            | ErrorCode::ParkedNotFound
            | ErrorCode::RetryPolicyNotFound
            | ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorCode::IdempotencyConflict
            | ErrorCode::TooLate
            | ErrorCode::TaskCancelled
            | ErrorCode::TaskFailed
            | ErrorCode::TaskNotExpired
            | ErrorCode::PayloadNotKept
            | ErrorCode::ScheduleExists
            | ErrorCode::ScheduleChanged
            | ErrorCode::RetryPolicyConfigured
            | ErrorCode::RetryQueueTaken => StatusCode::CONFLICT,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::UriTooLong => StatusCode::URI_TOO_LONG,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::InvalidRequest
            | ErrorCode::InvalidDestination
            | ErrorCode::InvalidDelay
            | ErrorCode::DelayOutOfRange
            | ErrorCode::InvalidPayload
            | ErrorCode::InvalidHeader
            | ErrorCode::HeadersTooLarge
            | ErrorCode::InvalidId
            | ErrorCode::InvalidExchange
            | ErrorCode::InvalidDeadline
            | ErrorCode::InvalidSchedule
            | ErrorCode::InvalidLimit
            | ErrorCode::InvalidRetryPolicy
            | ErrorCode::BatchTooLarge => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::RateLimited | ErrorCode::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::RequestHeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::LedgerDisabled | ErrorCode::ReleaseStageDisabled => {
                StatusCode::NOT_IMPLEMENTED
            }
            ErrorCode::Overloaded
            | ErrorCode::DeadlineExceeded
            | ErrorCode::TooManyConnections
            | ErrorCode::LedgerFull
            | ErrorCode::LedgerUnavailable
            | ErrorCode::BrokerUnavailable
            | ErrorCode::BrokerBlocked
            | ErrorCode::BrokerTimeout
            | ErrorCode::BrokerRejected
            | ErrorCode::BrokerUnroutable
            | ErrorCode::NotReady
            | ErrorCode::BrokerMisconfigured => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::HttpVersionNotSupported => StatusCode::HTTP_VERSION_NOT_SUPPORTED,
        }
    }

    /// When it is given, as the API reference's table says it (Markdown).
    #[cfg(test)]
    pub const fn when(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => {
                "the request itself is not valid HTTP/1.1 (its request line, or a header with a control byte); the connection is closed"
            }
            ErrorCode::MalformedJson => {
                "the body is not one JSON value (anything after the value but white space counts: `{…} xyz` is refused)"
            }
            ErrorCode::InvalidIdempotencyKey => {
                "empty, over 255 bytes, not visible ASCII (a space is not), or sent with a batch"
            }
            ErrorCode::UnreadableBody => {
                "the request body could not be read (the client stopped sending it, or a broken encoding)"
            }
            ErrorCode::InvalidQuery => {
                "bad `state`, `due_before`, `limit` or `cursor`, or an unknown parameter of `GET /v1/tasks`"
            }
            ErrorCode::Unauthenticated => {
                "tokens are required ([Security](security.md)) and the request has no `Authorization: Bearer` header; with `WWW-Authenticate: Bearer`"
            }
            ErrorCode::InvalidToken => {
                "the token is not one of a configured client's (mistyped, revoked); with `WWW-Authenticate: Bearer …, error=\"invalid_token\"`"
            }
            ErrorCode::Forbidden => {
                "the client lacks the permission the route needs (`submit`, `read`, `cancel`, `reschedule`, `schedule`, `limits`, `metrics`, `admin` for `/v1/topology`)"
            }
            ErrorCode::ForbiddenDestination => {
                "the destination matches none of the client's patterns; in a batch, per task (the others still go)"
            }
            ErrorCode::ForbiddenExchange => {
                "the task's `exchange` is not one the client's `exchanges` name; in a batch, per task (the others still go)"
            }
            ErrorCode::TaskNotFound => {
                "`GET`, `DELETE` or `PATCH /v1/tasks/{id}`: never accepted, pruned, or another client's task"
            }
            ErrorCode::ScheduleNotFound => {
                "`/v1/schedules/{id}`: never created, deleted, or another client's schedule"
            }
            ErrorCode::LimitNotFound => {
                "`/v1/limits/{name}`: never set, deleted, or a limit whose destinations are not all the client's"
            }
            ErrorCode::ParkedNotFound => {
                "`/v1/parked/{id}`: never parked, or replayed or discarded since"
            }
            ErrorCode::RetryPolicyNotFound => {
                "`/v1/retries/policies/{name}`: never set over the API, or removed since (a policy of the configuration file is not the API's)"
            }
            ErrorCode::RetryPolicyConfigured => {
                "`PUT` or `DELETE /v1/retries/policies/{name}` of a policy of the configuration file (`[[retry]]`): change it there"
            }
            ErrorCode::RetryQueueTaken => {
                "`PUT /v1/retries/policies/{name}` naming a queue another policy covers (a queue is in one policy at most); nothing is changed"
            }
            ErrorCode::InvalidRetryPolicy => {
                "a retry policy's `queues`, `initial`, `multiplier`, `max_delay` (with `jitter`, beyond the chain's longest delay), `jitter`, `max_attempts`, `park_to`, `max_lateness` or `give_up_after`, or its name; the message names the field and nothing is changed"
            }
            ErrorCode::OperationNotFound => {
                "`GET /v1/operations/{id}`: never started, or another client's operation"
            }
            ErrorCode::NotFound => "unknown route",
            ErrorCode::MethodNotAllowed => "known route, other method",
            ErrorCode::BodyTimeout => {
                "the body did not arrive whole within `http.body_read_timeout_ms`"
            }
            ErrorCode::IdempotencyConflict => {
                "the key or client id was accepted before with another body (for `PATCH`: another change, or another task)"
            }
            ErrorCode::TooLate => {
                "cancel or move of a task that is `releasing`, `delivered`, `unroutable` or `expired`"
            }
            ErrorCode::TaskCancelled => "move of a cancelled task",
            ErrorCode::ScheduleExists => {
                "`POST /v1/schedules` with the id of a schedule that has other content or timing (the same request again is answered as the first time)"
            }
            ErrorCode::ScheduleChanged => {
                "a change of a schedule that other requests kept changing meanwhile; read it again and retry"
            }
            ErrorCode::TaskFailed => "cancel or move of a failed task",
            ErrorCode::TaskNotExpired => {
                "`POST /v1/tasks/{id}/replay` of a task that did not expire (only an expired task is replayed)"
            }
            ErrorCode::PayloadNotKept => {
                "move of a task whose ledger row keeps only part of its payload (published before the release stage)"
            }
            ErrorCode::PayloadTooLarge => {
                "body over `http.body_limit_bytes` (the message states the limit)"
            }
            ErrorCode::UriTooLong => {
                "a URI longer than the server reads (about 64 KiB); the connection is closed"
            }
            ErrorCode::UnsupportedMediaType => {
                "not `application/json` (or `+json`), or a `charset` other than UTF-8"
            }
            ErrorCode::InvalidRequest => "missing or unknown field, wrong type",
            ErrorCode::InvalidDestination => "bad characters, wildcards, empty words, too long",
            ErrorCode::InvalidDelay => {
                "none or several of `delay_ms`/`delay`/`deliver_at`, negative, not a whole number of milliseconds, unparsable"
            }
            ErrorCode::DelayOutOfRange => "longer than `max_delay_ms` (never clamped)",
            ErrorCode::InvalidPayload => {
                "both payload fields, bad base64, a `content_type` that is not a media type"
            }
            ErrorCode::InvalidHeader => {
                "reserved name (including `CC`, `BCC`), null/array/object value, integer beyond 64 bits"
            }
            ErrorCode::HeadersTooLarge => {
                "the properties and headers would not fit one AMQP frame (the message says the limit)"
            }
            ErrorCode::InvalidId => "empty, over 255 bytes, control characters",
            ErrorCode::InvalidExchange => {
                "`exchange` is not a valid exchange name, or the release stage is off (only it delivers elsewhere than the business exchange)"
            }
            ErrorCode::InvalidDeadline => {
                "`deadline`, `max_lateness_ms` or `max_lateness`: not a time or a duration, more than one of them, a deadline before the task is due (with a leeway, its window's end), or the release stage is off (only it can hold a task back)"
            }
            ErrorCode::InvalidSchedule => {
                "a schedule's `id` or timing: a cron expression that does not parse or never fires, an unknown time zone, an interval below the unit, an end before the start, neither or both of `cron` and `every`; the message names the field"
            }
            ErrorCode::InvalidLimit => {
                "a release limit's `destinations`, `rate_per_sec`, `burst`, `paused_until` (not in the future) or `max_queue_depth` (a queue that does not exist), or its name; the message names the field and nothing is changed"
            }
            ErrorCode::BatchTooLarge => "more than `http.batch_limit` tasks",
            ErrorCode::RateLimited => {
                "over the client's `rate_per_second` (with `Retry-After`), or a batch larger than its `burst`; nothing of the request was taken"
            }
            ErrorCode::QuotaExceeded => {
                "the client has `max_scheduled` tasks waiting already (a batch is refused whole); with `Retry-After`"
            }
            ErrorCode::RequestHeadersTooLarge => {
                "a request head larger than the server reads; the connection is closed"
            }
            ErrorCode::Internal => {
                "a bug or an unexpected failure; the service's log says what (never the client)"
            }
            ErrorCode::LedgerDisabled => {
                "inspection, cancel, move, schedules or release limits with `store.url = \"none\"`"
            }
            ErrorCode::ReleaseStageDisabled => {
                "cancel, move, schedules or release limits with `cascade.release_stage = false`"
            }
            ErrorCode::Overloaded => {
                "more than `http.max_tasks_in_flight` tasks are being taken in; with `Retry-After`, nothing of the request was taken"
            }
            ErrorCode::DeadlineExceeded => {
                "no answer within `http.request_timeout_ms`; with `Retry-After`. The request may have taken effect: retry with the same `Idempotency-Key` or task `id`"
            }
            ErrorCode::TooManyConnections => {
                "`http.max_connections` connections are open; with `Retry-After`, the answer to the new connection's first request, after which it is closed"
            }
            ErrorCode::LedgerFull => "`store.max_pending` tasks wait for the broker already",
            ErrorCode::LedgerUnavailable => {
                "the ledger database failed; nothing was accepted (the service's log says why); \
                 on `/readyz`, the ledger cannot write, and why"
            }
            ErrorCode::BrokerUnavailable => {
                "without a ledger: not connected (reconnecting), or the publish failed; for a release limit's `max_queue_depth`: the queue could not be checked"
            }
            ErrorCode::BrokerBlocked => {
                "without a ledger: a memory or disk alarm blocks publishing"
            }
            ErrorCode::BrokerTimeout => {
                "without a ledger: no confirm within `amqp.confirm_timeout_ms`"
            }
            ErrorCode::BrokerRejected => "without a ledger: the broker nacked the message",
            ErrorCode::BrokerUnroutable => {
                "without a ledger: the broker returned it, the cascade topology is missing"
            }
            ErrorCode::NotReady => "`/readyz` only",
            ErrorCode::BrokerMisconfigured => {
                "`/readyz` only: RabbitMQ has refused delayline's credentials, vhost or permissions for longer than `amqp.misconfiguration_grace_ms`"
            }
            ErrorCode::HttpVersionNotSupported => {
                "a request line with an HTTP version other than 1.0 or 1.1; the connection is closed"
            }
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The API reference's table of error codes (`docs/api.md`), as this enum makes it.
#[cfg(test)]
pub fn readme_table() -> String {
    let mut table = String::from("| status | code | when |\n|---|---|---|\n");
    for code in ErrorCode::ALL {
        table.push_str(&format!(
            "| {} | `{}` | {} |\n",
            code.status().as_u16(),
            code.as_str(),
            code.when()
        ));
    }
    table
}
