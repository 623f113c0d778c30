//! The HTTP API (axum): tasks in, topology and health out.

mod error;
mod handlers;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::{Router, middleware};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::{DefaultOnFailure, TraceLayer};

pub use error::{ApiError, ErrorBody, ErrorEnvelope};
pub use handlers::{BatchItem, BatchResponse, TaskPage, TaskView, TopologyView};

use crate::config::{AmqpSettings, HttpSettings};
use crate::scheduler::Scheduler;

/// What every handler shares. Cloning is cheap.
#[derive(Clone)]
pub struct AppState {
    pub scheduler: Scheduler,
    pub batch_limit: usize,
    /// How long RabbitMQ may refuse delayline before `/readyz` says 503.
    pub misconfiguration_grace: Duration,
    topology: Arc<TopologyView>,
}

impl AppState {
    pub fn new(scheduler: Scheduler, http: &HttpSettings, amqp: &AmqpSettings) -> Self {
        let topology = Arc::new(TopologyView::new(&scheduler.cascade));
        Self {
            scheduler,
            batch_limit: http.batch_limit,
            misconfiguration_grace: Duration::from_millis(amqp.misconfiguration_grace_ms),
            topology,
        }
    }
}

pub fn router(state: AppState, body_limit_bytes: usize) -> Router {
    let count_rejections =
        middleware::from_fn_with_state(state.clone(), handlers::count_rejections);
    Router::new()
        .route(
            "/v1/tasks",
            post(handlers::create_task)
                .route_layer(count_rejections.clone())
                .get(handlers::list_tasks),
        )
        .route(
            "/v1/tasks/batch",
            post(handlers::create_batch).route_layer(count_rejections),
        )
        .route("/v1/tasks/{id}", get(handlers::get_task))
        .route("/metrics", get(handlers::metrics))
        .route("/v1/topology", get(handlers::topology))
        .route("/healthz", get(handlers::healthz))
        .route("/readyz", get(handlers::readyz))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit_bytes))
        // Failed requests are logged where the reason is known (with the task id);
        // tower-http's default would log every 503 readiness probe as an error.
        .layer(
            TraceLayer::new_for_http()
                .on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG)),
        )
        // A bug in one request must answer 500, not take the service down.
        .layer(CatchPanicLayer::custom(handlers::panic_response))
        .with_state(state)
}
