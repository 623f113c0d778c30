//! Answers for what no route serves: unknown routes, other methods, and a
//! handler that panicked.

use std::any::Any;

use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ErrorCode};

pub async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "this route does not accept that method",
    )
}

pub fn panic_response(_: Box<dyn Any + Send + 'static>) -> Response {
    ApiError::internal("a request handler panicked").into_response()
}
