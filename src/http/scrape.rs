//! `GET /metrics`: the Prometheus scrape.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::auth::require;
use super::error::ApiError;
use super::state::AppState;
use crate::auth::{Caller, Permission};

/// Prometheus scrape. Values that live elsewhere are read now, not mirrored.
#[utoipa::path(get, summary = "Prometheus scrape", path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus metrics (OpenMetrics text)", content_type = "application/openmetrics-text", body = String)))]
pub async fn metrics(State(state): State<AppState>, caller: Caller) -> Result<Response, ApiError> {
    require(&caller, Permission::Metrics)?;
    scrape(&state).await
}

/// On a listener of its own, the scrape needs no token.
async fn open_metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    scrape(&state).await
}

async fn scrape(state: &AppState) -> Result<Response, ApiError> {
    state.scheduler.refresh_metrics().await;
    let text = state
        .metrics
        .encode()
        .map_err(|error| ApiError::internal(format!("encoding the metrics failed: {error}")))?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

pub fn router() -> axum::Router<AppState> {
    axum::Router::new().route("/metrics", axum::routing::get(metrics))
}

pub fn open_router() -> axum::Router<AppState> {
    axum::Router::new().route("/metrics", axum::routing::get(open_metrics))
}
