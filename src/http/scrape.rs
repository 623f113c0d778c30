//! `GET /metrics`: the Prometheus scrape.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tracing::warn;

use super::AppState;
use super::error::ApiError;

/// Prometheus scrape. Values that live elsewhere are read now, not mirrored.
pub async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let scheduler = &state.scheduler;
    let metrics = &scheduler.metrics;
    let broker = scheduler.publisher.status();
    metrics.broker_connected.set(i64::from(broker.ready));
    metrics
        .broker_misconfigured
        .set(i64::from(broker.problem.is_some_and(|p| p.misconfigured)));
    if let Some(ledger) = &scheduler.ledger {
        // A scrape must not fail when the ledger does: that is when it matters.
        let pending = ledger.recount_pending().await.unwrap_or_else(|error| {
            warn!(%error, "cannot count pending tasks for /metrics");
            ledger.pending_estimate()
        });
        metrics
            .ledger_pending
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
    }
    let text = metrics.encode().map_err(|error| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            format!("encoding the metrics failed: {error}"),
        )
    })?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

pub fn router() -> axum::Router<AppState> {
    axum::Router::new().route("/metrics", axum::routing::get(metrics))
}
