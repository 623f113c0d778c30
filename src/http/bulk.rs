//! `POST /v1/tasks/bulk` and `/v1/operations/{id}`: a change to every task
//! a filter matches (cancel, or move), answered `202` with an operation
//! that the scheduler works in pages; the operation's counts as it goes.
//!
//! A cancel needs `cancel`, a move `reschedule`; a client's operation
//! reaches only its own tasks, and its filter's destinations must all be
//! its own. An `Idempotency-Key` makes a repeat the same operation.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::auth::require;
use super::error::{ApiError, ErrorCode};
use super::extract::JsonBody;
use super::state::AppState;
use super::tasks::{IDEMPOTENCY_KEY, REPLAYED, idempotency_key};
use crate::auth::{Caller, Permission};
use crate::bulk::{Action, BulkRequest};
use crate::clock::format_epoch_ms;
use crate::scheduler::{BulkOperationError, StoredOperation};
use crate::task::{TaskError, deserialize_whole, fingerprint, require_object};

/// An operation: what was asked, and how far it got.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OperationView {
    pub id: String,
    /// `running`, `done` or `failed`.
    pub state: String,
    pub done: bool,
    /// The request as received.
    #[schema(value_type = Object)]
    pub request: serde_json::Value,
    /// Tasks the filter matched so far.
    pub matched: u64,
    /// Cancelled or moved by this operation.
    pub changed: u64,
    /// Released or delivered before the change reached them.
    pub too_late: u64,
    /// Cancelled or failed before, or no longer movable.
    pub unchanged: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub finished_at: Option<String>,
}

fn count(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

impl From<StoredOperation> for OperationView {
    fn from(stored: StoredOperation) -> Self {
        OperationView {
            done: stored.state != "running",
            request: serde_json::from_str(&stored.request).unwrap_or_default(),
            matched: count(stored.matched),
            changed: count(stored.changed),
            too_late: count(stored.too_late),
            unchanged: count(stored.unchanged),
            error: stored.last_error,
            created_at: format_epoch_ms(count(stored.created_at_ms)),
            updated_at: format_epoch_ms(count(stored.updated_at_ms)),
            finished_at: stored.finished_at_ms.map(|ms| format_epoch_ms(count(ms))),
            id: stored.id,
            state: stored.state,
        }
    }
}

/// Starts a bulk change.
#[utoipa::path(post, summary = "Cancel or move every task a filter matches", path = "/v1/tasks/bulk", tag = "tasks",
    request_body = BulkRequest,
    params(("Idempotency-Key" = Option<String>, Header, description = "the same key and request again is the same operation")),
    responses((status = 202, description = "started (or, with the same key, started before)", body = OperationView)))]
pub async fn start_bulk(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    require_object(&body, "", "a bulk change: {\"filter\": …, \"action\": …}")?;
    let request: BulkRequest = deserialize_whole(&body)
        .map_err(|e| ApiError::from(TaskError::from_shape(&e, "", "a bulk request")))?;
    let key = idempotency_key(headers.get(IDEMPOTENCY_KEY))?;
    let idempotency = (key, fingerprint(&body)?);
    let (operation, created) = start(&state, &caller, &request, Some(idempotency)).await?;
    let location = format!("/v1/operations/{}", operation.id);
    let mut response = (StatusCode::ACCEPTED, Json(OperationView::from(operation))).into_response();
    if let Ok(value) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    if !created {
        response
            .headers_mut()
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// Checks `request` for `caller` (the action's permission, its own
/// destinations) and starts it, under `idempotency` (key, fingerprint) when
/// given; the operation, and whether it is new. The console's bulk cancel
/// starts its operations here too.
pub(super) async fn start(
    state: &AppState,
    caller: &Caller,
    request: &BulkRequest,
    idempotency: Option<(Option<String>, String)>,
) -> Result<(StoredOperation, bool), ApiError> {
    let now_ms = crate::clock::now_ms();
    let bulk = request
        .validate(now_ms)
        .map_err(BulkOperationError::Invalid)?;
    require(
        caller,
        match bulk.action {
            Action::Cancel => Permission::Cancel,
            _ => Permission::Reschedule,
        },
    )?;
    if !caller.reaches(&bulk.pattern) {
        return Err(ApiError::new(
            ErrorCode::ForbiddenDestination,
            format!(
                "client {:?} may change tasks only to its own destinations, not {:?}",
                caller.client_name().unwrap_or_default(),
                bulk.pattern.as_str()
            ),
        ));
    }
    // Without a key, a request of its own: never the same as another.
    let (key, fingerprint) =
        idempotency.unwrap_or_else(|| (None, uuid::Uuid::new_v4().to_string()));
    let started = state
        .scheduler
        .start_bulk(
            request,
            &bulk,
            key,
            fingerprint,
            caller.owner_scope(),
            now_ms,
        )
        .await?;
    Ok(started)
}

/// How far an operation got.
#[utoipa::path(get, summary = "A bulk operation's counts", path = "/v1/operations/{id}", tag = "tasks",
    params(("id" = String, Path, description = "the operation's id")),
    responses((status = 200, description = "the operation", body = OperationView)))]
pub async fn get_operation(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<OperationView>, ApiError> {
    require(&caller, Permission::Read)?;
    let found = state.scheduler.operation(&id, caller.owner_scope()).await?;
    Ok(Json(found.into()))
}

pub fn router() -> axum::Router<AppState> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/v1/tasks/bulk", post(start_bulk))
        .route("/v1/operations/{id}", get(get_operation))
}
