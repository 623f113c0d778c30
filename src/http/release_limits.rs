//! `/v1/limits`: release limits, which pace, pause or hold due tasks by
//! destination (see `crate::limit` for the rules and the scheduler's
//! limiter for the mechanism).
//!
//! Every route needs the `limits` permission. A client sees and sets only
//! the limits whose destinations are all its own (`admin`: every limit).
//! (`http/limits.rs` is the request bounds; this is the resource.)

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::auth::require;
use super::error::{ApiError, ErrorCode};
use super::extract::JsonBody;
use super::state::AppState;
use crate::auth::{Caller, Permission};
use crate::clock::format_epoch_ms;
use crate::limit::{DepthBound, LimitRequest, check_name};
use crate::scheduler::{LimitStatus, LimitsError};
use crate::task::{TaskError, deserialize_whole, require_object};

/// A limit: what was set, and what it holds now.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LimitView {
    pub name: String,
    pub destinations: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rate_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub burst: Option<u64>,
    pub paused: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub paused_until: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max_queue_depth: Option<DepthBound>,
    /// Due tasks waiting for it now (its destinations', every replica).
    pub waiting: u64,
    /// The earliest due time of those.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub oldest_waiting: Option<String>,
    /// Why it holds tasks now: `paused`, `paused_until`, `queue_depth`,
    /// `queue_missing`, `queue_depth_unknown`, `rate`; absent when it
    /// holds nothing.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub holds: Option<String>,
    /// The same, in words.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    /// Tasks a second it released over the last ten seconds.
    pub release_rate_per_sec: f64,
    /// Tasks it released so far.
    pub released: u64,
    /// The bounded queue's ready messages, as last read.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub queue_depth: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub client: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<LimitStatus> for LimitView {
    fn from(status: LimitStatus) -> Self {
        let stored = status.stored;
        let request = stored.limit.request();
        LimitView {
            name: stored.limit.name,
            destinations: request.destinations,
            rate_per_sec: request.rate_per_sec,
            burst: request.burst,
            paused: stored.limit.paused,
            paused_until: request.paused_until,
            max_queue_depth: request.max_queue_depth,
            waiting: status.waiting,
            oldest_waiting: status.oldest_waiting_ms.map(format_epoch_ms),
            holds: status.holds.as_ref().map(|h| h.code().to_owned()),
            reason: status.holds.as_ref().map(|h| h.describe()),
            release_rate_per_sec: (status.release_rate * 100.0).round() / 100.0,
            released: stored.released,
            queue_depth: match status.queue_depth {
                Some(crate::limit::Depth::Ready(ready)) => Some(ready),
                _ => None,
            },
            client: stored.client,
            created_at: format_epoch_ms(stored.created_at_ms),
            updated_at: format_epoch_ms(stored.updated_at_ms),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LimitList {
    pub limits: Vec<LimitView>,
}

/// The limit `name` as `caller` may see it: another client's is not found.
async fn visible(
    state: &AppState,
    caller: &Caller,
    name: &str,
    now_ms: u64,
) -> Result<LimitStatus, ApiError> {
    let status = state.scheduler.limit_status(name, now_ms).await?;
    if !caller.may_limit(&status.stored.limit.destinations) {
        return Err(LimitsError::NotFound(name.to_owned()).into());
    }
    Ok(status)
}

/// Sets a limit; `201` when new, `200` when changed in place (its bucket
/// kept, at most the new burst).
#[utoipa::path(put, summary = "Set a release limit", path = "/v1/limits/{name}", tag = "limits",
    params(("name" = String, Path, description = "1 to 128 bytes of A-Z, a-z, 0-9, '_', '-', '.'")),
    request_body = LimitRequest,
    responses(
        (status = 201, description = "created", body = LimitView),
        (status = 200, description = "changed", body = LimitView),
    ))]
pub async fn put_limit(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    require(&caller, Permission::Limits)?;
    let now_ms = crate::clock::now_ms();
    require_object(&body, "", "a limit: {\"destinations\": …}")?;
    let request: LimitRequest = deserialize_whole(&body)
        .map_err(|e| ApiError::from(TaskError::from_shape(&e, "", "a limit")))?;
    let limit = request
        .validate(&name, now_ms)
        .map_err(LimitsError::Invalid)?;
    if !caller.may_limit(&limit.destinations) {
        return Err(forbidden(&caller, limit.destinations.as_str()));
    }
    match state.scheduler.limit_status(&name, now_ms).await {
        Ok(existing) if !caller.may_limit(&existing.stored.limit.destinations) => {
            return Err(forbidden(
                &caller,
                existing.stored.limit.destinations.as_str(),
            ));
        }
        Ok(_) | Err(LimitsError::NotFound(_)) => {}
        Err(error) => return Err(error.into()),
    }
    let (status, created) = state
        .scheduler
        .put_limit(&limit, caller.client_name(), now_ms)
        .await?;
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((code, Json(LimitView::from(status))).into_response())
}

fn forbidden(caller: &Caller, pattern: &str) -> ApiError {
    ApiError::new(
        ErrorCode::ForbiddenDestination,
        format!(
            "client {:?} may set only limits whose destinations are all its own, not {pattern:?}",
            caller.client_name().unwrap_or_default()
        ),
    )
}

#[utoipa::path(get, summary = "Every release limit the client may see, and what each holds", path = "/v1/limits", tag = "limits",
    responses((status = 200, description = "the limits, by name", body = LimitList)))]
pub async fn list_limits(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<LimitList>, ApiError> {
    require(&caller, Permission::Limits)?;
    let now_ms = crate::clock::now_ms();
    let limits = state
        .scheduler
        .limits(now_ms)
        .await?
        .into_iter()
        .filter(|status| caller.may_limit(&status.stored.limit.destinations))
        .map(LimitView::from)
        .collect();
    Ok(Json(LimitList { limits }))
}

#[utoipa::path(get, summary = "A release limit, and what it holds now", path = "/v1/limits/{name}", tag = "limits",
    params(("name" = String, Path, description = "the limit's name")),
    responses((status = 200, description = "the limit", body = LimitView)))]
pub async fn get_limit(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<LimitView>, ApiError> {
    require(&caller, Permission::Limits)?;
    let now_ms = crate::clock::now_ms();
    Ok(Json(visible(&state, &caller, &name, now_ms).await?.into()))
}

#[utoipa::path(delete, summary = "Delete a release limit", path = "/v1/limits/{name}", tag = "limits",
    params(("name" = String, Path, description = "the limit's name")),
    responses((status = 204, description = "deleted: what it held is released (at the rate of any other limit that matches)")))]
pub async fn delete_limit(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    require(&caller, Permission::Limits)?;
    let now_ms = crate::clock::now_ms();
    visible(&state, &caller, &name, now_ms).await?;
    state.scheduler.delete_limit(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, summary = "Pause a release limit", path = "/v1/limits/{name}/pause", tag = "limits",
    params(("name" = String, Path, description = "the limit's name")),
    responses((status = 200, description = "paused: every task it matches waits when due", body = LimitView)))]
pub async fn pause_limit(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<LimitView>, ApiError> {
    set_paused(state, caller, name, true).await
}

#[utoipa::path(post, summary = "Resume a release limit", path = "/v1/limits/{name}/resume", tag = "limits",
    params(("name" = String, Path, description = "the limit's name")),
    responses((status = 200, description = "resumed (a `paused_until` ends too): what waits is released, at the rate if it has one", body = LimitView)))]
pub async fn resume_limit(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<LimitView>, ApiError> {
    set_paused(state, caller, name, false).await
}

async fn set_paused(
    state: AppState,
    caller: Caller,
    name: String,
    paused: bool,
) -> Result<Json<LimitView>, ApiError> {
    require(&caller, Permission::Limits)?;
    let now_ms = crate::clock::now_ms();
    check_name(&name).map_err(LimitsError::Invalid)?;
    visible(&state, &caller, &name, now_ms).await?;
    let status = state.scheduler.pause_limit(&name, paused, now_ms).await?;
    Ok(Json(status.into()))
}

pub fn router() -> axum::Router<AppState> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/v1/limits", get(list_limits))
        .route(
            "/v1/limits/{name}",
            get(get_limit).put(put_limit).delete(delete_limit),
        )
        .route("/v1/limits/{name}/pause", post(pause_limit))
        .route("/v1/limits/{name}/resume", post(resume_limit))
}
