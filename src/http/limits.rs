//! Bounds on what one request may hold, answered in the API's JSON shape:
//! - a body that is not whole within `http.body_read_timeout_ms` is `408
//!   body_timeout` (a client sending it a byte at a time holds nothing for
//!   long);
//! - a request not answered within `http.request_timeout_ms` is `503
//!   deadline_exceeded`, with `Retry-After`;
//! - tasks beyond `http.max_tasks_in_flight` being taken in at once are
//!   `503 overloaded` at once, with `Retry-After`: under more load than the
//!   broker and the ledger take, the service answers quickly instead of
//!   queueing without bound, and the tasks it accepts keep their latency.
//!
//! The connection-level bounds (headers, connection count) are in
//! [`super::serve`].

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::AppState;
use super::error::{ApiError, ErrorCode};

/// How long a request's body may take to arrive, and how large it may be;
/// the body extractor reads them.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    pub read_timeout: Duration,
    pub max_bytes: usize,
}

/// Tasks being taken in (parsed, recorded, published) at once.
#[derive(Clone, Debug)]
pub struct Intake {
    slots: Arc<Semaphore>,
    capacity: u32,
}

/// Held while the tasks it admitted are being taken in.
pub struct Admitted {
    _slots: OwnedSemaphorePermit,
}

impl Intake {
    pub fn new(max_tasks_in_flight: usize) -> Self {
        let capacity = u32::try_from(max_tasks_in_flight.max(1)).unwrap_or(u32::MAX);
        Intake {
            slots: Arc::new(Semaphore::new(capacity as usize)),
            capacity,
        }
    }

    /// Room for `tasks` more now, or `503 overloaded`. A request larger than
    /// the whole capacity waits for nothing else: it takes all of it.
    pub fn admit(&self, tasks: usize) -> Result<Admitted, ApiError> {
        let wanted = u32::try_from(tasks.max(1))
            .unwrap_or(u32::MAX)
            .min(self.capacity);
        self.slots
            .clone()
            .try_acquire_many_owned(wanted)
            .map(|slots| Admitted { _slots: slots })
            .map_err(|_| {
                ApiError::new(
                    ErrorCode::Overloaded,
                    format!(
                        "{} tasks are being taken in already (http.max_tasks_in_flight); \
                         retry after the Retry-After seconds",
                        self.capacity
                    ),
                )
                .retry_after(1)
            })
    }
}

/// Every API request: its body's deadline for the extractor, and its own.
pub async fn deadlines(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let limits = state.limits;
    request.extensions_mut().insert(BodyLimits {
        read_timeout: limits.body_read_timeout,
        max_bytes: limits.body_max_bytes,
    });
    match tokio::time::timeout(limits.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            state.metrics.request_deadline_exceeded.inc();
            ApiError::new(
                ErrorCode::DeadlineExceeded,
                format!(
                    "no answer within http.request_timeout_ms ({} ms); the request may have \
                     taken effect: retry with the same Idempotency-Key or task id",
                    limits.request_timeout.as_millis()
                ),
            )
            .retry_after(1)
            .into_response()
        }
    }
}

/// The deadlines [`deadlines`] applies.
#[derive(Clone, Copy, Debug)]
pub struct RequestLimits {
    pub body_read_timeout: Duration,
    pub body_max_bytes: usize,
    pub request_timeout: Duration,
}
