//! `POST /v1/unroutable/requeue`: the unroutable queue's messages back to the
//! business exchange once their destinations are bound. The same operation
//! as `delayline requeue-unroutable`, with the service's own ledger; the
//! console's Problems page acts through it.

use axum::Json;
use axum::extract::State;

use super::auth::require;
use super::codes::ErrorCode;
use super::error::ApiError;
use super::state::AppState;
use crate::auth::{Caller, Permission};
use crate::operations::unroutable::{Requeued, requeue};

/// Requeues the unroutable queue's messages (an administrator's action:
/// they are every client's).
pub async fn requeue_unroutable(state: &AppState, caller: &Caller) -> Result<Requeued, ApiError> {
    require(caller, Permission::Admin)?;
    let Some(operator) = state.operator.as_deref() else {
        return Err(ApiError::new(
            ErrorCode::BrokerUnavailable,
            "this service has no broker settings to requeue with",
        ));
    };
    let cascade = state.scheduler.cascade();
    let now_ms = crate::clock::read().wall_ms;
    Ok(requeue(
        state.scheduler.own_ledger(),
        &operator.amqp,
        cascade,
        now_ms,
    )
    .await?)
}

#[utoipa::path(post, summary = "Requeue the unroutable queue's messages", path = "/v1/unroutable/requeue", tag = "operations",
    description = "Sends the messages in the unroutable queue back to the business exchange, once the bindings they \
        were missing exist; those still unroutable land there again. Needs the `admin` permission.",
    responses((status = 200, description = "what was requeued", body = Requeued)))]
pub async fn requeue_route(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Requeued>, ApiError> {
    Ok(Json(requeue_unroutable(&state, &caller).await?))
}

pub fn router() -> axum::Router<AppState> {
    axum::Router::new().route("/v1/unroutable/requeue", axum::routing::post(requeue_route))
}
