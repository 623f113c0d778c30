//! `GET /v1/topology`: what a consumer or operator needs to know about the cascade.

use axum::Json;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::auth::require;
use super::chain_view::TopologyView;
use super::error::ApiError;
use super::state::AppState;
use crate::auth::{Caller, Permission};
use crate::cascade::validate_destination;
use crate::task::TaskError;

#[derive(Debug, Deserialize)]
pub struct TopologyQuery {
    destination: Option<String>,
}

/// With `?destination=`, `binding_key` is the exact key for that destination.
#[utoipa::path(get, summary = "The cascade and the binding key for a destination", path = "/v1/topology", tag = "operations",
    params(("destination" = Option<String>, Query, description = "gives the exact binding key for it")),
    responses((status = 200, description = "the cascade's objects", body = TopologyView)))]
pub async fn topology(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<TopologyQuery>,
) -> Result<Response, ApiError> {
    require(&caller, Permission::Admin)?;
    let view = state
        .topology
        .with_leaders(|queue| state.metrics.leader_of(queue));
    let Some(destination) = query.destination else {
        return Ok(Json(view).into_response());
    };
    validate_destination(&destination).map_err(|e| ApiError::from(TaskError::from(e)))?;
    let mut view = serde_json::to_value(view).map_err(ApiError::internal)?;
    view["binding_key"] = state.scheduler.cascade().binding_key(&destination).into();
    Ok(Json(view).into_response())
}

pub fn router() -> axum::Router<AppState> {
    axum::Router::new().route("/v1/topology", axum::routing::get(topology))
}
