//! `GET /v1/tasks/{id}` and `GET /v1/tasks`: tasks as the ledger knows them.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::auth::{require, unscoped_key};
use super::error::{ApiError, ErrorCode};
use super::state::AppState;
use crate::auth::{Caller, Permission};
use crate::clock::{format_epoch_ms, parse_epoch_ms};
use crate::scheduler::InspectError;
use crate::scheduler::{Cursor, StoredTask, TaskFilter};
use crate::task::TaskState;

/// A task as the ledger knows it.
#[derive(Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct TaskView {
    pub id: String,
    pub state: TaskState,
    pub destination: String,
    /// The exchange it is delivered to, when not the business exchange
    /// (one it named, or an AMQP ingress's).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub exchange: Option<String>,
    pub routing_key: String,
    pub delay_ms: u64,
    /// When it is delivered: with a leeway, the moment drawn in it.
    pub deliver_at: String,
    /// Its leeway, when it has one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub leeway_ms: Option<u64>,
    /// With a leeway: the due time asked for, the window's start.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(format = DateTime)]
    pub due_at: Option<String>,
    pub created_at: String,
    pub published_at: Option<String>,
    pub idempotency_key: Option<String>,
    pub content_type: String,
    pub headers: BTreeMap<String, crate::message::FieldValue>,
    /// The payload's size as submitted.
    pub payload_bytes: u64,
    /// What the ledger still holds of the payload (see store.payload_copy_bytes).
    pub payload_base64: Option<String>,
    pub payload_truncated: bool,
    /// Publishing attempts so far.
    pub attempts: u64,
    /// Why the last attempt failed, while the task is pending; why it
    /// expired (state `expired`) or failed.
    pub last_error: Option<String>,
    /// 1, plus one per reschedule.
    pub revision: u64,
    /// When the business exchange confirmed its release (release stage only).
    pub delivered_at: Option<String>,
    /// `delivered_at` less `deliver_at`, in milliseconds.
    pub lateness_ms: Option<u64>,
    pub cancelled_at: Option<String>,
    /// The release limit it waited for when it fell due (state `waiting`
    /// while it waits; `GET /v1/limits/{name}` says why).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub waited_for: Option<String>,
    /// `waited_for` under its old name, kept for clients that read it
    /// (see CHANGELOG.md); it will be removed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(deprecated)]
    pub held_by: Option<String>,
    /// A staged task's moment (state `staged`, or `releasing` from there):
    /// its due time, or later by the staging replica's clock.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub release_at: Option<String>,
    /// Its deadline, when it has one: never published to its destination
    /// after it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(format = DateTime)]
    pub deadline: Option<String>,
    /// Where its message goes instead once its deadline passed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub expired_destination: Option<String>,
    /// When it expired (state `expired`): its deadline had passed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(format = DateTime)]
    pub expired_at: Option<String>,
    /// The API client that submitted it; absent while the API is open.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub client: Option<String>,
}

impl From<StoredTask> for TaskView {
    fn from(stored: StoredTask) -> TaskView {
        let kept = stored.payload.as_ref().map_or(0, |p| p.len() as u64);
        TaskView {
            revision: stored.revision,
            delivered_at: stored.delivered_ms().map(format_epoch_ms),
            lateness_ms: stored.lateness_ms(),
            cancelled_at: stored.cancelled_at_ms.map(format_epoch_ms),
            waited_for: stored.waited_for.clone(),
            held_by: stored.waited_for.clone(),
            release_at: stored.release_at_ms.map(format_epoch_ms),
            deadline: stored.deadline_ms.map(format_epoch_ms),
            expired_at: stored.expired_at_ms.map(format_epoch_ms),
            expired_destination: stored.expired_destination.clone(),
            state: stored.state,
            deliver_at: format_epoch_ms(stored.deliver_at_ms),
            leeway_ms: (stored.leeway_ms > 0).then_some(stored.leeway_ms),
            due_at: crate::task::leeway_due_at(&stored.id, stored.deliver_at_ms, stored.leeway_ms),
            created_at: format_epoch_ms(stored.created_at_ms),
            published_at: stored.published_at_ms.map(format_epoch_ms),
            headers: stored.headers,
            delay_ms: stored.delay_ms,
            attempts: stored.attempts,
            payload_base64: stored
                .payload
                .as_ref()
                .map(|p| base64::engine::general_purpose::STANDARD.encode(p)),
            payload_bytes: stored.payload_bytes,
            payload_truncated: kept < stored.payload_bytes,
            id: stored.id,
            destination: stored.destination,
            exchange: stored.exchange,
            routing_key: stored.routing_key,
            idempotency_key: stored
                .idempotency_key
                .map(|key| unscoped_key(stored.client.as_deref(), key)),
            client: stored.client,
            content_type: stored.content_type,
            last_error: stored.last_error,
        }
    }
}

#[utoipa::path(get, summary = "A task as the ledger knows it", path = "/v1/tasks/{id}", tag = "tasks", params(("id" = String, Path, description = "the task id")),
    responses((status = 200, description = "the task as the ledger knows it", body = TaskView)))]
pub async fn get_task(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    require(&caller, Permission::Read)?;
    let stored = state.scheduler.task(&id).await?;
    let stored = stored.filter(|task| task.within_scope(caller.owner_scope()));
    let stored = stored.ok_or_else(|| {
        ApiError::new(
            ErrorCode::TaskNotFound,
            format!("no task {id:?} in the ledger (never accepted, or pruned after retention)"),
        )
    })?;
    Ok(Json(TaskView::from(stored)))
}

const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    destination: Option<String>,
    state: Option<String>,
    due_before: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct TaskPage {
    pub tasks: Vec<TaskView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_cursor: Option<String>,
}

fn invalid_query(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidQuery, message)
}

impl ListQuery {
    fn filter(self, caller: &Caller) -> Result<TaskFilter, ApiError> {
        let state = match self.state.as_deref() {
            None => None,
            Some(text) => Some(TaskState::parse(text).ok_or_else(|| {
                let states: Vec<&str> = TaskState::ALL.iter().map(|s| s.as_str()).collect();
                invalid_query(format!(
                    "state must be one of {}, got {text:?}",
                    states.join(", ")
                ))
            })?),
        };
        let due_before_ms = match self.due_before.as_deref() {
            None => None,
            Some(text) => Some(parse_epoch_ms(text).ok_or_else(|| {
                invalid_query(format!("due_before {text:?} is not an RFC 3339 time"))
            })?),
        };
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(invalid_query(format!("limit must be 1 to {MAX_PAGE}")));
        }
        let after = match self.cursor.as_deref() {
            None => None,
            Some(text) => Some(Cursor::decode(text).map_err(|e| invalid_query(e.to_string()))?),
        };
        Ok(TaskFilter {
            client: caller.owner_scope().map(str::to_owned),
            destination: self.destination,
            state,
            due_before_ms,
            after,
            limit,
        })
    }
}

/// Tasks in due order, a page at a time.
#[utoipa::path(get, summary = "List tasks in due order, a page at a time", path = "/v1/tasks", tag = "tasks",
    params(
        ("destination" = Option<String>, Query, description = "only this destination"),
        ("state" = Option<crate::task::TaskState>, Query, description = "only this state"),
        ("due_before" = Option<String>, Query, format = DateTime, description = "only tasks due before this RFC 3339 time"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "page size, default 100"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page"),
    ),
    responses((status = 200, description = "a page of tasks in due order", body = TaskPage)))]
pub async fn list_tasks(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<TaskPage>, ApiError> {
    require(&caller, Permission::Read)?;
    if !state.scheduler.has_ledger() {
        return Err(InspectError::LedgerDisabled.into());
    }
    let Query(query) = query.map_err(|e| invalid_query(e.body_text()))?;
    let filter = query.filter(&caller)?;
    let stored = state
        .scheduler
        .tasks(&filter, crate::clock::now_ms())
        .await?;
    let next_cursor = Cursor::after_page(&stored, filter.limit);
    let tasks = stored.into_iter().map(TaskView::from).collect();
    Ok(Json(TaskPage { tasks, next_cursor }))
}

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/v1/tasks", axum::routing::get(list_tasks))
        .route("/v1/tasks/{id}", axum::routing::get(get_task))
}
