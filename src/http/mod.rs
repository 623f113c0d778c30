//! The HTTP API (axum): tasks in, topology and health out.
//!
//! One module per resource, each with its own `router()`: `tasks` (taking
//! tasks in), `inspect` (reading them back), `changes` (cancelling and
//! moving them), `schedules` (recurring schedules), `topology`, `health` (the
//! probes), `scrape` (`/metrics`); `auth` is the gate in front of all but the
//! probes, `extract` the JSON body extractor, `error` the error shape,
//! `fallback` what no route serves; `serve` the accept loop, with `wire`
//! turning hyper's bare refusals of unparseable requests into JSON.

mod auth;
mod batch;
pub(crate) mod changes;
pub mod codes;
mod console;
mod error;
mod extract;
mod fallback;
mod health;
mod inspect;
pub mod limits;
pub mod openapi;
mod schedules;
mod scrape;
pub mod serve;
mod tasks;
mod topology;
mod unroutable;
mod wire;

#[cfg(test)]
mod tests;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use std::sync::Arc;
use std::time::Duration;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::{DefaultOnFailure, TraceLayer};

pub use changes::{CancelItem, CancelResponse};
pub use error::{ApiError, ErrorBody, ErrorEnvelope};
pub use inspect::{TaskPage, TaskView};
pub use tasks::{BatchItem, BatchResponse};
pub use topology::TopologyView;

use crate::auth::Authenticator;
use crate::config::{AmqpSettings, HttpSettings};
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;

/// What every handler shares. Cloning is cheap.
#[derive(Clone)]
pub struct AppState {
    scheduler: Scheduler,
    metrics: Arc<Metrics>,
    batch_limit: usize,
    topology: Arc<TopologyView>,
    auth: Arc<Authenticator>,
    limits: limits::RequestLimits,
    intake: limits::Intake,
    /// Per process: the console's form tokens are derived from it.
    console_secret: [u8; 32],
    /// The console's signed-in sessions.
    console_sessions: Arc<console::Sessions>,
    /// The API is served over HTTPS: the console's cookie is `Secure`.
    https: bool,
    /// For operations that take a connection of their own (a requeue).
    amqp: Option<Arc<AmqpSettings>>,
}

impl AppState {
    pub fn new(
        scheduler: Scheduler,
        metrics: Arc<Metrics>,
        http: &HttpSettings,
        auth: Arc<Authenticator>,
    ) -> Self {
        let topology = Arc::new(TopologyView::new(scheduler.cascade()));
        Self {
            scheduler,
            metrics,
            batch_limit: http.batch_limit,
            topology,
            auth,
            limits: limits::RequestLimits {
                body_read_timeout: Duration::from_millis(http.body_read_timeout_ms),
                body_max_bytes: http.body_limit_bytes,
                request_timeout: Duration::from_millis(http.request_timeout_ms),
            },
            intake: limits::Intake::new(http.max_tasks_in_flight),
            console_secret: rand::random(),
            console_sessions: Arc::default(),
            https: http.tls.enabled(),
            amqp: None,
        }
    }

    /// The broker settings operations (a requeue) connect with.
    pub fn with_amqp(mut self, amqp: &AmqpSettings) -> Self {
        self.amqp = Some(Arc::new(amqp.clone()));
        self
    }
}

/// Where `GET /metrics` is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsRoute {
    /// On the API's listener, behind the gate (`metrics` permission).
    WithApi,
    /// On a listener of its own (`metrics.bind`): not on the API's.
    Elsewhere,
}

/// Every route, one router per resource, merged; then what applies to all.
/// Everything but the probes is behind the gate.
pub fn router(
    state: AppState,
    http: &HttpSettings,
    metrics_route: MetricsRoute,
    console: bool,
) -> Router {
    let body_limit_bytes = http.body_limit_bytes;
    let mut gated = Router::new()
        .merge(tasks::router(state.clone()))
        .merge(inspect::router())
        .merge(changes::router())
        .merge(schedules::router())
        .merge(topology::router())
        .merge(unroutable::router());
    if metrics_route == MetricsRoute::WithApi {
        gated = gated.merge(scrape::router());
    }
    gated
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .merge(health::router())
        .merge(openapi::router())
        // Signed in by its own cookie, not the gate's header.
        .merge(if console {
            console::router()
        } else {
            Router::new()
        })
        .fallback(fallback::not_found)
        .method_not_allowed_fallback(fallback::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            limits::deadlines,
        ))
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

/// `GET /metrics` alone, open, for the listener of `metrics.bind`.
pub fn metrics_router(state: AppState) -> Router {
    scrape::open_router().with_state(state)
}
