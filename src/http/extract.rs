//! The JSON body extractor every write route uses: JSON in UTF-8, within the body limit.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};

use super::error::{ApiError, ErrorCode};
use super::limits::BodyLimits;

/// A request body that must be JSON, read whole within the body limit.
pub struct JsonBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let media_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<mime::Mime>().ok());
        let is_json = media_type.as_ref().is_some_and(|m| {
            m.type_() == mime::APPLICATION
                && (m.subtype() == mime::JSON || m.suffix() == Some(mime::JSON))
        });
        if !is_json {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "send the task as JSON with Content-Type: application/json",
            ));
        }
        // JSON is UTF-8 (RFC 8259); a body declared otherwise would be misread.
        if let Some(charset) = media_type.as_ref().and_then(|m| m.get_param(mime::CHARSET))
            && charset != mime::UTF_8
        {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                format!("JSON is UTF-8; the body says charset={charset}: send it as UTF-8"),
            ));
        }
        let limits = request.extensions().get::<BodyLimits>().copied();
        let reading = Bytes::from_request(request, state);
        let read = match limits.map(|l| l.read_timeout) {
            Some(limit) => tokio::time::timeout(limit, reading).await.map_err(|_| {
                ApiError::new(
                    ErrorCode::BodyTimeout,
                    format!(
                        "the request body did not arrive whole within \
                             http.body_read_timeout_ms ({} ms)",
                        limit.as_millis()
                    ),
                )
            })?,
            None => reading.await,
        };
        let bytes = read.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    ErrorCode::PayloadTooLarge,
                    match limits {
                        Some(limits) => format!(
                            "the request body is larger than the {} bytes http.body_limit_bytes \
                             allows",
                            limits.max_bytes
                        ),
                        None => "the request body is larger than http.body_limit_bytes allows"
                            .to_owned(),
                    },
                )
            } else {
                ApiError::new(ErrorCode::UnreadableBody, rejection.body_text())
            }
        })?;
        Ok(JsonBody(bytes))
    }
}
