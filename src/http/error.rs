//! Every error the API returns: `{"error": {"code": "...", "message": "..."}}`.
//!
//! Codes are stable and documented in the README; messages are for humans.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::broker::PublishError;
use crate::scheduler::SubmitError;
use crate::store::StoreError;
use crate::task::TaskError;

/// Seconds a client should wait before retrying after a broker problem.
const RETRY_AFTER_SECONDS: &str = "1";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
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
        let status = match error {
            TaskError::MalformedJson(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        };
        ApiError::new(status, error.code(), error.to_string())
    }
}

impl From<PublishError> for ApiError {
    fn from(error: PublishError) -> Self {
        let code = match error {
            PublishError::TooLarge { .. } => {
                return ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "headers_too_large",
                    error.to_string(),
                );
            }
            PublishError::Unavailable(_)
            | PublishError::Broker(_)
            | PublishError::Unconfirmed { .. } => "broker_unavailable",
            PublishError::Blocked(_) => "broker_blocked",
            PublishError::Timeout(_) => "broker_timeout",
            PublishError::Nacked => "broker_rejected",
            PublishError::Returned(_) => "broker_unroutable",
        };
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, error.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ledger_unavailable",
            error.to_string(),
        )
    }
}

impl From<SubmitError> for ApiError {
    fn from(error: SubmitError) -> Self {
        match error {
            SubmitError::TooLarge(error) | SubmitError::Publish(error) => error.into(),
            SubmitError::Ledger(error) => error.into(),
            SubmitError::LedgerFull { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ledger_full",
                error.to_string(),
            ),
            SubmitError::Conflict { .. } => ApiError::new(
                StatusCode::CONFLICT,
                "idempotency_conflict",
                error.to_string(),
            ),
        }
    }
}

/// Carried on every error response so middleware can count rejections by
/// code, including those of extractors that run before a handler.
#[derive(Clone, Copy, Debug)]
pub struct ErrorCode(pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let mut response = (status, Json(ErrorEnvelope { error: self.body() })).into_response();
        response.extensions_mut().insert(ErrorCode(self.code));
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}
