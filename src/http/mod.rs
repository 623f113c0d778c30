//! The HTTP API (axum): tasks in, topology and health out.
//!
//! One module per resource, each with its own `router()`: `tasks` (taking
//! tasks in), `inspect` (reading them back), `lifecycle` (cancelling and
//! moving them), `topology`, `health` (the
//! probes), `scrape` (`/metrics`); `extract` is the JSON body extractor,
//! `error` the error shape, `fallback` what no route serves.

mod error;
mod extract;
mod fallback;
mod health;
mod inspect;
mod lifecycle;
mod scrape;
mod tasks;
mod topology;

#[cfg(test)]
mod tests;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use std::sync::Arc;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::{DefaultOnFailure, TraceLayer};

pub use error::{ApiError, ErrorBody, ErrorEnvelope};
pub use inspect::{TaskPage, TaskView};
pub use lifecycle::{CancelItem, CancelResponse};
pub use tasks::{BatchItem, BatchResponse};
pub use topology::TopologyView;

use crate::config::HttpSettings;
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;

/// What every handler shares. Cloning is cheap.
#[derive(Clone)]
pub struct AppState {
    scheduler: Scheduler,
    metrics: Arc<Metrics>,
    batch_limit: usize,
    topology: Arc<TopologyView>,
}

impl AppState {
    pub fn new(scheduler: Scheduler, metrics: Arc<Metrics>, http: &HttpSettings) -> Self {
        let topology = Arc::new(TopologyView::new(scheduler.cascade()));
        Self {
            scheduler,
            metrics,
            batch_limit: http.batch_limit,
            topology,
        }
    }
}

/// Every route, one router per resource, merged; then what applies to all.
pub fn router(state: AppState, http: &HttpSettings) -> Router {
    let body_limit_bytes = http.body_limit_bytes;
    Router::new()
        .merge(tasks::router(state.clone()))
        .merge(inspect::router())
        .merge(lifecycle::router())
        .merge(topology::router())
        .merge(health::router())
        .merge(scrape::router())
        .fallback(fallback::not_found)
        .method_not_allowed_fallback(fallback::method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit_bytes))
        // Failed requests are logged where the reason is known (with the task id);
        // tower-http's default would log every 503 readiness probe as an error.
        .layer(
            TraceLayer::new_for_http()
                .on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG)),
        )
        // A bug in one request must answer 500, not take the service down.
        .layer(CatchPanicLayer::custom(fallback::panic_response))
        .with_state(state)
}
