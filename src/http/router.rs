//! Every route, one router per resource, merged; then what applies to all.

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::{DefaultOnFailure, TraceLayer};

use super::error::{ApiError, ErrorCode};
use super::limits::BodyLimits;
use super::settings::HttpSettings;
use super::state::AppState;
use super::{
    auth, bulk, changes, console, expired, fallback, forecast, health, inspect, openapi,
    release_limits, retries, retry_policies, schedules, scrape, tasks, topology, unroutable,
};

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
        .merge(expired::router())
        .merge(schedules::router())
        .merge(release_limits::router())
        .merge(forecast::router())
        .merge(bulk::router())
        .merge(topology::router())
        .merge(unroutable::router())
        .merge(retries::router())
        .merge(retry_policies::router());
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
            deadlines,
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
