//! Every error the API returns: `{"error": {"code": "...", "message": "..."}}`.
//!
//! Codes are stable and each is listed in the API reference's error table (a test
//! keeps the two in step); messages are for humans. What only an operator
//! can act on (a database's error text, a bug) goes to the log, and the
//! client gets the code and a message that says what to do.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use tracing::error;

use crate::ingress::{ParkedError, PolicyConflict, PolicyError};
use crate::operations::OperationError;
use crate::recurrence::ScheduleError;
use crate::scheduler::LedgerError;
use crate::scheduler::PublishError;
use crate::scheduler::{
    BulkOperationError, ChangeError, InspectError, LimitsError, NotReady, RecurringError,
    SubmitError,
};
use crate::task::TaskError;

pub use super::codes::ErrorCode;

/// Seconds a client should wait before retrying after a broker problem.
const RETRY_AFTER_SECONDS: &str = "1";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds for `Retry-After`; a 503 without one says [`RETRY_AFTER_SECONDS`].
    pub retry_after_seconds: Option<u64>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: code.status(),
            code: code.as_str(),
            message: message.into(),
            retry_after_seconds: None,
        }
    }

    /// Tells the client when a retry may succeed (429, 503).
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_seconds = Some(seconds.max(1));
        self
    }

    /// A bug or an unexpected failure: `detail` goes to the log, not to the client.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        error!(%detail, "internal error");
        ApiError::new(
            ErrorCode::Internal,
            "internal error; the request was not completed (the service's log says why)",
        )
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.code.to_owned(),
            message: self.message.clone(),
        }
    }
}

impl From<TaskError> for ApiError {
    fn from(error: TaskError) -> Self {
        let code = match error {
            TaskError::MalformedJson(_) => ErrorCode::MalformedJson,
            TaskError::InvalidRequest(_) => ErrorCode::InvalidRequest,
            TaskError::InvalidDestination(_) => ErrorCode::InvalidDestination,
            TaskError::InvalidDelay(_) => ErrorCode::InvalidDelay,
            TaskError::DelayOutOfRange(_) => ErrorCode::DelayOutOfRange,
            TaskError::InvalidPayload(_) => ErrorCode::InvalidPayload,
            TaskError::InvalidHeader(_) => ErrorCode::InvalidHeader,
            TaskError::InvalidId(_) => ErrorCode::InvalidId,
            TaskError::InvalidExchange(_) => ErrorCode::InvalidExchange,
            TaskError::InvalidDeadline(_) => ErrorCode::InvalidDeadline,
        };
        ApiError::new(code, error.to_string())
    }
}

impl From<PublishError> for ApiError {
    fn from(error: PublishError) -> Self {
        let code = match error {
            PublishError::TooLarge { .. } => {
                return ApiError::new(ErrorCode::HeadersTooLarge, error.to_string());
            }
            PublishError::Unavailable(_)
            | PublishError::Broker(_)
            | PublishError::Unconfirmed { .. } => ErrorCode::BrokerUnavailable,
            PublishError::Blocked(_) => ErrorCode::BrokerBlocked,
            PublishError::Timeout(_) => ErrorCode::BrokerTimeout,
            PublishError::Nacked => ErrorCode::BrokerRejected,
            PublishError::Returned(_) => ErrorCode::BrokerUnroutable,
        };
        ApiError::new(code, error.to_string())
    }
}

impl From<LedgerError> for ApiError {
    fn from(error: LedgerError) -> Self {
        error!(%error, "ledger unavailable");
        ApiError::new(
            ErrorCode::LedgerUnavailable,
            "the task ledger cannot be read or written now; retry later (the service's log \
             says why)",
        )
    }
}

impl From<InspectError> for ApiError {
    fn from(error: InspectError) -> Self {
        match error {
            InspectError::LedgerDisabled => {
                ApiError::new(ErrorCode::LedgerDisabled, error.to_string())
            }
            InspectError::Ledger(error) => error.into(),
        }
    }
}

impl From<ChangeError> for ApiError {
    fn from(error: ChangeError) -> Self {
        match error {
            ChangeError::LedgerDisabled => {
                ApiError::new(ErrorCode::LedgerDisabled, error.to_string())
            }
            ChangeError::ReleaseStageOff => {
                ApiError::new(ErrorCode::ReleaseStageDisabled, error.to_string())
            }
            // The handler says which field; this is the fallback.
            ChangeError::Route(route) => TaskError::from(route).into(),
            ChangeError::Ledger(error) => error.into(),
        }
    }
}

impl From<LimitsError> for ApiError {
    fn from(error: LimitsError) -> Self {
        let message = error.to_string();
        let code = match error {
            LimitsError::LedgerDisabled => ErrorCode::LedgerDisabled,
            LimitsError::ReleaseStageOff => ErrorCode::ReleaseStageDisabled,
            LimitsError::NotFound(_) => ErrorCode::LimitNotFound,
            LimitsError::Invalid(_) => ErrorCode::InvalidLimit,
            LimitsError::Broker(_) => ErrorCode::BrokerUnavailable,
            LimitsError::Ledger(ledger) => return ledger.into(),
        };
        ApiError::new(code, message)
    }
}

impl From<BulkOperationError> for ApiError {
    fn from(error: BulkOperationError) -> Self {
        let message = error.to_string();
        let code = match error {
            BulkOperationError::Unchangeable(change) => return change.into(),
            BulkOperationError::Invalid(_) => ErrorCode::InvalidRequest,
            BulkOperationError::NotFound(_) => ErrorCode::OperationNotFound,
            BulkOperationError::Conflict { .. } => ErrorCode::IdempotencyConflict,
            BulkOperationError::Ledger(ledger) => return ledger.into(),
        };
        ApiError::new(code, message)
    }
}

impl From<RecurringError> for ApiError {
    fn from(error: RecurringError) -> Self {
        let message = error.to_string();
        let code = match error {
            RecurringError::Unavailable(change) => return change.into(),
            RecurringError::Ledger(ledger) => return ledger.into(),
            RecurringError::Invalid(ScheduleError::Content(task)) => return task.into(),
            RecurringError::Invalid(ScheduleError::Invalid { .. }) => ErrorCode::InvalidSchedule,
            RecurringError::NotFound(_) => ErrorCode::ScheduleNotFound,
            RecurringError::Exists(_) => ErrorCode::ScheduleExists,
            RecurringError::Contended(_) => ErrorCode::ScheduleChanged,
        };
        ApiError::new(code, message)
    }
}

impl From<NotReady> for ApiError {
    fn from(error: NotReady) -> Self {
        let code = match error {
            NotReady::Misconfigured { .. } => ErrorCode::BrokerMisconfigured,
            NotReady::Broker(_) => ErrorCode::NotReady,
            NotReady::LedgerFull { .. } => ErrorCode::LedgerFull,
            NotReady::LedgerCannotWrite(_) => ErrorCode::LedgerUnavailable,
            NotReady::Ledger(error) => return error.into(),
        };
        ApiError::new(code, error.to_string())
    }
}

impl From<SubmitError> for ApiError {
    fn from(error: SubmitError) -> Self {
        match error {
            SubmitError::TooLarge(error) | SubmitError::Publish(error) => error.into(),
            SubmitError::Ledger(error) => error.into(),
            SubmitError::LedgerFull { .. } => {
                ApiError::new(ErrorCode::LedgerFull, error.to_string())
            }
            SubmitError::Conflict { .. } => {
                ApiError::new(ErrorCode::IdempotencyConflict, error.to_string())
            }
        }
    }
}

/// What an operation run from the API (a requeue) answers: the broker or the ledger away is a 503.
impl From<OperationError> for ApiError {
    fn from(error: OperationError) -> Self {
        match error {
            OperationError::Ledger(error) => error.into(),
            OperationError::Broker(_) | OperationError::Migrate(_) => ApiError::new(
                ErrorCode::BrokerUnavailable,
                format!("the requeue did not complete: {error}"),
            ),
            other => ApiError::internal(other),
        }
    }
}

/// Carried on every error response so middleware can count rejections by
/// code, including those of extractors that run before a handler.
#[derive(Clone, Copy, Debug)]
pub struct AnsweredCode(pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let mut response = (status, Json(ErrorEnvelope { error: self.body() })).into_response();
        response.extensions_mut().insert(AnsweredCode(self.code));
        if let Some(seconds) = self.retry_after_seconds {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        } else if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            // RFC 6750: say which scheme, and whether a token was refused.
            let challenge = if self.code == ErrorCode::InvalidToken.as_str() {
                "Bearer realm=\"delayline\", error=\"invalid_token\""
            } else {
                "Bearer realm=\"delayline\""
            };
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        response
    }
}

impl From<PolicyError> for ApiError {
    fn from(error: PolicyError) -> Self {
        let message = error.to_string();
        let code = match error {
            PolicyError::LedgerDisabled => ErrorCode::LedgerDisabled,
            PolicyError::NotFound(_) => ErrorCode::RetryPolicyNotFound,
            PolicyError::Invalid(_) => ErrorCode::InvalidRetryPolicy,
            PolicyError::Conflict(PolicyConflict::Configured(_)) => {
                ErrorCode::RetryPolicyConfigured
            }
            PolicyError::Conflict(PolicyConflict::QueueTaken { .. }) => ErrorCode::RetryQueueTaken,
            PolicyError::Ledger(ledger) => return ledger.into(),
        };
        ApiError::new(code, message)
    }
}

impl From<ParkedError> for ApiError {
    fn from(error: ParkedError) -> Self {
        match error {
            ParkedError::LedgerDisabled => {
                ApiError::new(ErrorCode::LedgerDisabled, error.to_string())
            }
            ParkedError::Ledger(error) => error.into(),
            ParkedError::Submit(error) => error.into(),
            ParkedError::Unreplayable { .. } => {
                ApiError::new(ErrorCode::InvalidDestination, error.to_string())
            }
        }
    }
}
