//! `GET /healthz` and `GET /readyz`: the probes, and the readiness rule.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Serialize;

use super::AppState;
use super::error::ApiError;

#[derive(Serialize)]
struct Status {
    status: &'static str,
}

pub async fn healthz() -> impl IntoResponse {
    Json(Status { status: "ok" })
}

#[derive(Serialize)]
struct Readiness {
    status: &'static str,
    /// Whether tasks are published as they come, or wait in the ledger.
    broker: &'static str,
    /// The broker address in use (without its password).
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    /// Why the broker blocks publishing (a resource alarm), while it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    blocked: Option<String>,
    /// Why the last attempt to connect failed, while disconnected.
    #[serde(skip_serializing_if = "Option::is_none")]
    broker_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pending: Option<u64>,
}

/// Ready means a task posted now would be accepted. Without a ledger that
/// needs the broker (connected and provisioned); with one, the ledger must
/// answer and have room, and the broker may be away.
pub async fn readyz(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let status = state.scheduler.publisher.status();
    if let Some(problem) = &status.problem
        && problem.misconfigured
        && problem.since.elapsed() >= state.misconfiguration_grace
    {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "broker_misconfigured",
            format!(
                "RabbitMQ has refused delayline for {} s: {} (check amqp.uri: user, password, \
                 vhost, and the user's permissions)",
                problem.since.elapsed().as_secs(),
                problem.reason
            ),
        ));
    }
    let broker_error = status.problem.as_ref().map(|p| p.reason.clone());
    let broker = match (&status.node, &status.blocked) {
        (Some(_), Some(_)) => "blocked",
        (Some(_), None) if status.ready => "connected",
        _ => "disconnected",
    };
    let Some(ledger) = &state.scheduler.ledger else {
        if !status.ready {
            let message = match (&status.blocked, &broker_error) {
                (Some(reason), _) => format!("RabbitMQ blocks publishing: {reason}"),
                (None, Some(error)) => format!("not connected to RabbitMQ: {error}"),
                (None, None) => {
                    "not connected to RabbitMQ, or the topology is not provisioned yet".to_owned()
                }
            };
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                message,
            ));
        }
        return Ok(Json(Readiness {
            status: "ready",
            broker,
            node: status.node,
            blocked: None,
            broker_error: None,
            pending: None,
        }));
    };
    let pending = ledger.recount_pending().await?;
    if ledger.is_full() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ledger_full",
            format!("{pending} tasks are waiting for RabbitMQ, the most store.max_pending allows"),
        ));
    }
    Ok(Json(Readiness {
        status: "ready",
        broker,
        node: status.node,
        blocked: status.blocked,
        broker_error,
        pending: Some(pending),
    }))
}

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/healthz", axum::routing::get(healthz))
        .route("/readyz", axum::routing::get(readyz))
}
