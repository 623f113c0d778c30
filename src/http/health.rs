//! `GET /healthz` and `GET /readyz`: the probes. The readiness rule itself is
//! the scheduler's ([`Scheduler::readiness`](crate::scheduler::Scheduler::readiness)).

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Serialize;

use super::error::ApiError;
use super::state::AppState;
use crate::scheduler::Readiness;

#[derive(Serialize, utoipa::ToSchema)]
struct Status {
    status: &'static str,
}

#[utoipa::path(get, summary = "Liveness: the process serves HTTP", path = "/healthz", tag = "operations",
    responses((status = 200, description = "the process serves HTTP", body = Status)))]
pub async fn healthz() -> impl IntoResponse {
    Json(Status { status: "ok" })
}

/// 200 with what the service runs on when a task posted now would be
/// accepted; 503 with why not otherwise.
#[utoipa::path(get, summary = "Readiness: whether a task posted now would be accepted", path = "/readyz", tag = "operations",
    responses((status = 200, description = "a task posted now would be accepted", body = Readiness)))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Readiness>, ApiError> {
    Ok(Json(state.scheduler.readiness().await?))
}

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/healthz", axum::routing::get(healthz))
        .route("/readyz", axum::routing::get(readyz))
}
