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

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

/// The deadlines every API request is given (`router::deadlines`).
#[derive(Clone, Copy, Debug)]
pub struct RequestLimits {
    pub body_read_timeout: Duration,
    pub body_max_bytes: usize,
    pub request_timeout: Duration,
}
