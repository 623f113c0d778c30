//! `DELETE /v1/tasks/{id}`, `POST /v1/tasks/cancel` and `PATCH
//! /v1/tasks/{id}`: withdrawing and moving tasks that are not yet due.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::auth::{require, scoped_fingerprint, scoped_key};
use super::error::{ApiError, ErrorBody, ErrorCode};
use super::extract::JsonBody;
use super::inspect::TaskView;
use super::state::AppState;
use super::tasks::{IDEMPOTENCY_KEY, REPLAYED, idempotency_key};
use crate::auth::{Caller, Permission};
use crate::scheduler::ChangeError;
use crate::scheduler::{Cancel, ChangeKey, Reschedule, StoredTask};
use crate::task::{
    TaskError, TaskState, deserialize_whole, fingerprint, parse_new_delay, require_object,
};

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        ErrorCode::TaskNotFound,
        format!("no task {id:?} in the ledger (never accepted, or pruned after retention)"),
    )
}

/// Why a task that exists cannot be changed, in the state it is in.
fn unchangeable(task: &StoredTask, change: &str) -> ApiError {
    let code = match task.state {
        TaskState::Releasing | TaskState::Delivered | TaskState::Unroutable => ErrorCode::TooLate,
        TaskState::Cancelled => ErrorCode::TaskCancelled,
        TaskState::Failed => ErrorCode::TaskFailed,
        TaskState::Expired => ErrorCode::TooLate,
        // A changeable task is never answered this way.
        TaskState::Pending | TaskState::Scheduled | TaskState::Waiting | TaskState::Staged => {
            ErrorCode::Internal
        }
    };
    let why = match task.state {
        TaskState::Releasing => "it is due and being delivered",
        TaskState::Delivered => "it was delivered",
        TaskState::Unroutable => {
            "it was released, and waits in the unroutable queue (no queue is bound for it)"
        }
        TaskState::Cancelled => "it was cancelled",
        TaskState::Failed => "it failed and is never delivered",
        TaskState::Expired => "its deadline passed: it expired and is never delivered",
        TaskState::Pending | TaskState::Scheduled | TaskState::Waiting | TaskState::Staged => {
            "it changed meanwhile; retry"
        }
    };
    ApiError::new(
        code,
        format!("task {:?} cannot be {change}: {why}", task.id),
    )
}

/// A cancelled task no longer counts against its client's quota.
fn release_quota(state: &AppState, outcomes: &[Cancel]) {
    for outcome in outcomes {
        if let Cancel::Cancelled(task) = outcome
            && let Some(client) = &task.client
        {
            state.auth.usage.give_back(client, 1);
        }
    }
}

/// What one cancel comes to, as `DELETE` answers it.
fn cancel_answer(id: &str, outcome: Cancel) -> Result<TaskView, ApiError> {
    match outcome {
        Cancel::Cancelled(task) | Cancel::AlreadyCancelled(task) => Ok(TaskView::from(task)),
        Cancel::Unchangeable(task) => Err(unchangeable(&task, "cancelled")),
        Cancel::NotFound => Err(not_found(id)),
    }
}

/// Cancels a task that is not yet due; repeating it answers the same.
#[utoipa::path(delete, summary = "Cancel a task", path = "/v1/tasks/{id}", tag = "tasks", params(("id" = String, Path, description = "the task id")),
    responses((status = 200, description = "cancelled (again): it is never delivered", body = crate::http::inspect::TaskView)))]
pub async fn cancel_task(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    require(&caller, Permission::Cancel)?;
    cancel_one(&state, &id, caller.owner_scope())
        .await
        .map(Json)
}

/// Cancels one task (`DELETE /v1/tasks/{id}`, and the console's button).
pub(super) async fn cancel_one(
    state: &AppState,
    id: &str,
    owner: Option<&str>,
) -> Result<TaskView, ApiError> {
    let ids = [id.to_owned()];
    let now_ms = crate::clock::now_ms();
    let mut outcomes = state.scheduler.cancel(&ids, owner, now_ms).await?;
    release_quota(state, &outcomes);
    cancel_answer(id, outcomes.pop().unwrap_or(Cancel::NotFound))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelRequest {
    pub(crate) ids: Vec<String>,
}

/// The body of `POST /v1/tasks/cancel`.
pub(crate) fn parse_cancel(body: &[u8]) -> Result<CancelRequest, TaskError> {
    require_object(body, "", "{\"ids\": [task id, …]}")?;
    deserialize_whole(body).map_err(|e| {
        if !matches!(e.inner().classify(), serde_json::error::Category::Data) {
            return TaskError::from_json(e.inner());
        }
        TaskError::InvalidRequest(format!(
            "/{}: {}; expected {{\"ids\": [task id, …]}}",
            e.path(),
            e.inner()
                .to_string()
                .split(" at line ")
                .next()
                .unwrap_or("")
        ))
    })
}

/// One id's outcome in a batch cancel: `task` when cancelled, `error` otherwise.
#[derive(Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct CancelItem {
    pub id: String,
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub task: Option<TaskView>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<ErrorBody>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct CancelResponse {
    pub results: Vec<CancelItem>,
}

/// Cancels many tasks in one ledger transaction, each on its own merits.
#[utoipa::path(post, summary = "Cancel many tasks", path = "/v1/tasks/cancel", tag = "tasks",
    request_body = CancelRequest,
    responses((status = 200, description = "one result per id, in order", body = CancelResponse)))]
pub async fn cancel_batch(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody,
) -> Result<Json<CancelResponse>, ApiError> {
    require(&caller, Permission::Cancel)?;
    let request = parse_cancel(&body)?;
    if request.ids.len() > state.batch_limit {
        return Err(ApiError::new(
            ErrorCode::BatchTooLarge,
            format!(
                "a batch holds at most {} ids, got {}",
                state.batch_limit,
                request.ids.len()
            ),
        ));
    }
    let outcomes = state
        .scheduler
        .cancel(&request.ids, caller.owner_scope(), crate::clock::now_ms())
        .await?;
    release_quota(&state, &outcomes);
    let results = request
        .ids
        .into_iter()
        .zip(outcomes)
        .map(|(id, outcome)| match cancel_answer(&id, outcome) {
            Ok(task) => CancelItem {
                id,
                status: StatusCode::OK.as_u16(),
                task: Some(task),
                error: None,
            },
            Err(error) => CancelItem {
                id,
                status: error.status.as_u16(),
                task: None,
                error: Some(error.body()),
            },
        })
        .collect();
    Ok(Json(CancelResponse { results }))
}

/// Moves a task that is not yet due to a new due time (a new revision).
#[utoipa::path(patch, summary = "Move a task to a new due time", path = "/v1/tasks/{id}", tag = "tasks", params(("id" = String, Path, description = "the task id")),
    request_body = crate::task::RescheduleRequest,
    responses((status = 200, description = "moved: a new revision and due time", body = crate::http::inspect::TaskView)))]
pub async fn reschedule_task(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    require(&caller, Permission::Reschedule)?;
    let now = crate::clock::read();
    let start_ms = state.scheduler.cascade().delay_start_ms(now.wall);
    let new_delay = parse_new_delay(&body, start_ms)?;
    let key = match idempotency_key(headers.get(IDEMPOTENCY_KEY))? {
        None => None,
        Some(key) => Some(ChangeKey {
            key: scoped_key(&caller, key),
            // The same change is the same body for the same task (the
            // ledger compares the task as well).
            fingerprint: scoped_fingerprint(&caller, fingerprint(&body)?),
        }),
    };
    let rescheduled = state
        .scheduler
        .reschedule(&id, new_delay.delay, key, caller.owner_scope(), &now)
        .await
        .map_err(|error| match error {
            // Said of the field the new delay was given in.
            ChangeError::Route(route) => TaskError::from(route).at_pointer(new_delay.field).into(),
            other => ApiError::from(other),
        })?;
    let (task, replayed) = move_answer(&id, rescheduled)?;
    let mut response = Json(TaskView::from(task)).into_response();
    if replayed {
        response
            .headers_mut()
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// Moves one task to `delay` from now, without an idempotency key (the
/// console's button).
pub(super) async fn move_one(
    state: &AppState,
    id: &str,
    delay: std::time::Duration,
    owner: Option<&str>,
    now: &crate::clock::Reading,
) -> Result<StoredTask, ApiError> {
    let rescheduled = state
        .scheduler
        .reschedule(id, delay, None, owner, now)
        .await?;
    move_answer(id, rescheduled).map(|(task, _)| task)
}

/// What a move comes to, as `PATCH` answers it: the task, and whether it
/// repeated a move made before.
fn move_answer(id: &str, rescheduled: Reschedule) -> Result<(StoredTask, bool), ApiError> {
    Ok(match rescheduled {
        Reschedule::Moved(task) => (task, false),
        Reschedule::Replay(task) => (task, true),
        Reschedule::Conflict { task_id } => {
            return Err(ApiError::new(
                ErrorCode::IdempotencyConflict,
                format!(
                    "this Idempotency-Key was already used for a different change (of task \
                     {task_id:?})"
                ),
            ));
        }
        Reschedule::Unchangeable(task) => return Err(unchangeable(&task, "moved")),
        Reschedule::PayloadNotKept(task) => {
            return Err(ApiError::new(
                ErrorCode::PayloadNotKept,
                format!(
                    "task {:?} cannot be moved: the ledger keeps only part of its payload (it \
                     was published before the release stage kept payloads until delivery); \
                     cancel it and submit it again",
                    task.id
                ),
            ));
        }
        Reschedule::NotFound => return Err(not_found(id)),
    })
}

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route(
            "/v1/tasks/{id}",
            axum::routing::delete(cancel_task).patch(reschedule_task),
        )
        .route("/v1/tasks/cancel", axum::routing::post(cancel_batch))
}
