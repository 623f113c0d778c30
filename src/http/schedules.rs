//! `/v1/schedules`: recurring schedules, each occurrence a task.
//!
//! Every route needs the `schedule` permission; a client sees and changes
//! its own schedules only (`admin`: every client's), and may point them
//! only at its destinations and exchanges, as its tasks.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::auth::{check_destination, check_exchange, require};
use super::error::{ApiError, ErrorCode};
use super::extract::JsonBody;
use super::state::AppState;
use super::tasks::REPLAYED;
use crate::auth::{Caller, Permission};
use crate::clock::format_epoch_ms;
use crate::message::FieldValue;
use crate::recurrence::{CatchUp, SchedulePatch, ScheduleRequest, occurrence_id};
use crate::scheduler::ScheduleState;
use crate::task::{TaskError, deserialize_whole, require_object};

/// Next occurrences an answer lists.
const UPCOMING: usize = 5;
const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1000;

/// A schedule: what the client stated, its state and its next occurrences.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleView {
    pub id: String,
    /// `active`, `paused`, or `finished` (no occurrence after its end).
    pub state: String,
    /// 1, plus one per change (patch, pause, resume); part of each
    /// occurrence's task id.
    pub revision: u64,
    pub destination: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub exchange: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cron: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub every: Option<String>,
    pub timezone: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub start_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub end_at: Option<String>,
    pub catch_up: CatchUp,
    /// As given (exact JSON).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(value_type = Option<Object>)]
    pub payload: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub payload_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub content_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub leeway_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max_lateness_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(value_type = Option<BTreeMap<String, FieldValue>>)]
    pub headers: Option<BTreeMap<String, Box<RawValue>>>,
    /// The next occurrences due (RFC 3339, UTC), whether already planned
    /// (made tasks ahead of their time) or not; empty while paused or
    /// finished.
    pub next_occurrences: Vec<String>,
    /// The task id the next occurrence due has, or will have
    /// (`GET /v1/tasks/{id}`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_task_id: Option<String>,
    /// The last occurrence that fell due (its time has come).
    pub last_occurrence: Option<String>,
    /// Occurrences that fell due so far (made tasks whose time has come).
    pub occurrences: u64,
    /// Occurrences made tasks ahead of their time (within
    /// `schedules.lead_ms`) and not yet due.
    pub planned: u64,
    /// Occurrences passed over because no replica ran at their time.
    pub missed: u64,
    pub created_at: String,
    pub updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub client: Option<String>,
}

impl From<ScheduleState> for ScheduleView {
    fn from(
        ScheduleState {
            stored,
            upcoming,
            planned,
            fell_due,
            last_fell_due,
        }: ScheduleState,
    ) -> Self {
        let state = match (stored.paused, stored.next_at_ms) {
            (true, _) => "paused",
            (false, Some(_)) => "active",
            (false, None) => "finished",
        };
        ScheduleView {
            state: state.to_owned(),
            next_task_id: upcoming
                .first()
                .map(|at| occurrence_id(&stored.id, stored.revision, *at)),
            next_occurrences: upcoming.into_iter().map(format_epoch_ms).collect(),
            id: stored.id,
            revision: stored.revision,
            destination: stored.content.destination,
            exchange: stored.content.exchange,
            cron: stored.spec.cron,
            every: stored.spec.every,
            timezone: stored.spec.timezone,
            start_at: stored.spec.start_at,
            end_at: stored.spec.end_at,
            catch_up: stored.spec.catch_up,
            payload: stored.content.payload,
            payload_base64: stored.content.payload_base64,
            content_type: stored.content.content_type,
            leeway_ms: stored.content.leeway_ms,
            max_lateness_ms: stored.content.max_lateness_ms,
            headers: stored.content.headers,
            last_occurrence: last_fell_due.map(format_epoch_ms),
            occurrences: fell_due,
            planned,
            missed: stored.missed,
            created_at: format_epoch_ms(stored.created_at_ms),
            updated_at: format_epoch_ms(stored.updated_at_ms),
            client: stored.client,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SchedulePage {
    pub schedules: Vec<ScheduleView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_cursor: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    limit: Option<u32>,
    cursor: Option<String>,
}

/// A JSON object of type `T`, or the task parser's errors naming the field.
fn parse_body<'a, T: Deserialize<'a>>(body: &'a [u8], shape: &str) -> Result<T, ApiError> {
    require_object(body, "", shape)?;
    deserialize_whole(body).map_err(|e| TaskError::from_shape(&e, "", "a schedule").into())
}

/// The answer as of now: the clock read once, at the edge.
fn view(state: &AppState, stored: crate::scheduler::StoredSchedule) -> ScheduleView {
    let now_ms = crate::clock::now_ms();
    ScheduleView::from(state.scheduler.schedule_state(stored, UPCOMING, now_ms))
}

/// Creates a schedule; the same request again answers the same, 200.
#[utoipa::path(post, summary = "Create a recurring schedule", path = "/v1/schedules", tag = "schedules",
    request_body = ScheduleRequest,
    responses(
        (status = 201, description = "created: its first occurrences are listed", body = ScheduleView),
        (status = 200, description = "the same request again: the schedule as it is (`Idempotent-Replayed: true`)", body = ScheduleView),
    ))]
pub async fn create_schedule(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    require(&caller, Permission::Schedule)?;
    let request: ScheduleRequest =
        parse_body(&body, "a schedule: {\"destination\": …, \"cron\": …}")?;
    check_destination(&caller, request.destination())?;
    check_exchange(&caller, request.exchange())?;
    let (stored, created) = state
        .scheduler
        .create_schedule(request, caller.client_name())
        .await?;
    let body = Json(view(&state, stored));
    if created {
        return Ok((StatusCode::CREATED, body).into_response());
    }
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    Ok(response)
}

#[utoipa::path(get, summary = "A schedule and its next occurrences", path = "/v1/schedules/{id}", tag = "schedules",
    params(("id" = String, Path, description = "the schedule id")),
    responses((status = 200, description = "the schedule", body = ScheduleView)))]
pub async fn get_schedule(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    require(&caller, Permission::Schedule)?;
    let stored = state.scheduler.schedule(&id, caller.owner_scope()).await?;
    Ok(Json(view(&state, stored)))
}

/// Schedules in id order, a page at a time.
#[utoipa::path(get, summary = "List schedules in id order, a page at a time", path = "/v1/schedules", tag = "schedules",
    params(
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "page size, default 100"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page"),
    ),
    responses((status = 200, description = "a page of schedules", body = SchedulePage)))]
pub async fn list_schedules(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<SchedulePage>, ApiError> {
    require(&caller, Permission::Schedule)?;
    let Query(query) = query.map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e.body_text()))?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::new(
            ErrorCode::InvalidQuery,
            format!("limit must be 1 to {MAX_PAGE}"),
        ));
    }
    let stored = state
        .scheduler
        .schedules(caller.owner_scope(), query.cursor.as_deref(), limit)
        .await?;
    let next_cursor = (stored.len() == limit as usize)
        .then(|| stored.last().map(|s| s.id.clone()))
        .flatten();
    let schedules = stored.into_iter().map(|s| view(&state, s)).collect();
    Ok(Json(SchedulePage {
        schedules,
        next_cursor,
    }))
}

/// Changes a schedule: future occurrences follow; one already made a task
/// and not yet due is withdrawn and made again as the schedule now says.
#[utoipa::path(patch, summary = "Change a schedule's timing or content", path = "/v1/schedules/{id}", tag = "schedules",
    params(("id" = String, Path, description = "the schedule id")),
    request_body = SchedulePatch,
    responses((status = 200, description = "changed: a new revision", body = ScheduleView)))]
pub async fn patch_schedule(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<ScheduleView>, ApiError> {
    require(&caller, Permission::Schedule)?;
    let patch: SchedulePatch = parse_body(&body, "the fields to change: {\"cron\": …}")?;
    if let Some(destination) = patch.destination() {
        check_destination(&caller, destination)?;
    }
    if let Some(exchange) = patch.exchange() {
        check_exchange(&caller, exchange)?;
    }
    let stored = state
        .scheduler
        .patch_schedule(&id, patch, caller.owner_scope())
        .await?;
    Ok(Json(view(&state, stored)))
}

#[utoipa::path(post, summary = "Pause a schedule", path = "/v1/schedules/{id}/pause", tag = "schedules",
    params(("id" = String, Path, description = "the schedule id")),
    responses((status = 200, description = "paused: no occurrence is made, those made and not yet due are withdrawn", body = ScheduleView)))]
pub async fn pause_schedule(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    set_paused(state, caller, id, true).await
}

#[utoipa::path(post, summary = "Resume a paused schedule", path = "/v1/schedules/{id}/resume", tag = "schedules",
    params(("id" = String, Path, description = "the schedule id")),
    responses((status = 200, description = "resumed from its first occurrence after now (nothing is caught up)", body = ScheduleView)))]
pub async fn resume_schedule(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    set_paused(state, caller, id, false).await
}

async fn set_paused(
    state: AppState,
    caller: Caller,
    id: String,
    paused: bool,
) -> Result<Json<ScheduleView>, ApiError> {
    require(&caller, Permission::Schedule)?;
    let stored = state
        .scheduler
        .pause_schedule(&id, paused, caller.owner_scope())
        .await?;
    Ok(Json(view(&state, stored)))
}

#[utoipa::path(delete, summary = "Delete a schedule", path = "/v1/schedules/{id}", tag = "schedules",
    params(("id" = String, Path, description = "the schedule id")),
    responses((status = 204, description = "deleted; its occurrences not yet due are withdrawn")))]
pub async fn delete_schedule(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    require(&caller, Permission::Schedule)?;
    state
        .scheduler
        .delete_schedule(&id, caller.owner_scope())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub fn router() -> axum::Router<AppState> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/v1/schedules", get(list_schedules).post(create_schedule))
        .route(
            "/v1/schedules/{id}",
            get(get_schedule)
                .patch(patch_schedule)
                .delete(delete_schedule),
        )
        .route("/v1/schedules/{id}/pause", post(pause_schedule))
        .route("/v1/schedules/{id}/resume", post(resume_schedule))
}
