//! `/v1/parked`: what the retry policies gave up on, listed per queue,
//! newest first, by group, replayed or discarded one at a time or by
//! filter. Parked messages are every queue's, so all of it needs the
//! `admin` permission. (The policies themselves: `retry_policies`.)

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};

use super::auth::require;
use super::error::{ApiError, ErrorCode};
use super::extract::JsonBody;
use super::state::AppState;
use crate::auth::{Caller, Permission};
use crate::clock::{Reading, format_epoch_ms};
use crate::ingress::{Parked, ParkedAction, Unparked};
use crate::scheduler::{HOUR_MS, ParkedFilter, ParkedGroup, ParkedMessage, ParkedQueue};
use crate::task::{TaskError, deserialize_whole, require_object};

/// A parked message, as the API shows it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ParkedView {
    pub id: String,
    /// The queue it failed in, and comes back to when replayed.
    pub queue: String,
    pub policy: String,
    /// Why its last attempt ended: `rejected`, `expired`, `delivery_limit`, `maxlen`.
    pub reason: String,
    pub attempts: u32,
    pub parked_at: String,
    /// The hour its first attempt failed in (its group's).
    pub first_failed_hour: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// The body as text (bytes that are not UTF-8 shown as U+FFFD).
    pub body: String,
    pub body_bytes: usize,
}

impl From<&ParkedMessage> for ParkedView {
    fn from(parked: &ParkedMessage) -> Self {
        let text = |v: &Option<lapin::types::ShortString>| v.as_ref().map(|s| s.to_string());
        ParkedView {
            id: parked.id.clone(),
            queue: parked.queue.clone(),
            policy: parked.policy.clone(),
            reason: parked.reason.clone(),
            attempts: parked.attempts,
            parked_at: format_epoch_ms(parked.parked_at_ms),
            first_failed_hour: format_epoch_ms(parked.first_failed_hour_ms()),
            message_id: parked.message_id.clone(),
            correlation_id: text(parked.properties.correlation_id()),
            content_type: text(parked.properties.content_type()),
            body: String::from_utf8_lossy(&parked.payload).into_owned(),
            body_bytes: parked.payload.len(),
        }
    }
}

/// `GET /v1/parked`'s answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ParkedList {
    /// Every queue with parked messages: how many, and the newest's time.
    pub queues: Vec<ParkedQueueView>,
    /// Newest first.
    pub parked: Vec<ParkedView>,
    /// Pass as `before` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ParkedQueueView {
    pub queue: String,
    pub parked: u64,
    pub newest_at: String,
}

impl From<ParkedQueue> for ParkedQueueView {
    fn from(queue: ParkedQueue) -> Self {
        ParkedQueueView {
            queue: queue.queue,
            parked: queue.parked,
            newest_at: format_epoch_ms(queue.newest_at_ms),
        }
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ParkedQuery {
    /// Only this queue's.
    queue: Option<String>,
    /// Only those whose last attempt ended so (`rejected`, `expired`, …).
    reason: Option<String>,
    /// Only those whose first attempt failed in this hour (RFC 3339; any
    /// time in the hour).
    first_failed_hour: Option<String>,
    /// At most this many (1 to 500, 50 by default).
    limit: Option<u32>,
    /// A previous page's `next`.
    before: Option<String>,
}

const DEFAULT_PAGE: u32 = 50;

fn parse_cursor(text: &str) -> Result<(u64, &str), ApiError> {
    text.split_once(':')
        .and_then(|(ms, id)| Some((ms.parse().ok()?, id)))
        .ok_or_else(|| ApiError::new(ErrorCode::InvalidQuery, "before: not a page's `next`"))
}

#[utoipa::path(get, summary = "Parked messages", path = "/v1/parked", tag = "retries",
    description = "Messages a retry policy gave up on after `max_attempts`: the count per queue, and the messages \
        themselves newest first. Needs `admin`.",
    params(ParkedQuery),
    responses((status = 200, description = "per queue, and a page of messages", body = ParkedList)))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<ParkedQuery>, QueryRejection>,
) -> Result<Json<ParkedList>, ApiError> {
    require(&caller, Permission::Admin)?;
    let Query(query) = query.map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e.body_text()))?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=crate::ingress::PARKED_PAGE).contains(&limit) {
        return Err(ApiError::new(ErrorCode::InvalidQuery, "limit: 1 to 500"));
    }
    let ledger = state.scheduler.own_ledger().ok_or_else(no_ledger)?;
    let filter = parked_filter(
        query.queue,
        query.reason,
        query.first_failed_hour,
        ErrorCode::InvalidQuery,
    )?;
    let before = query.before.as_deref().map(parse_cursor).transpose()?;
    let page = ledger.parked(&filter, before, limit).await?;
    let next = (page.len() == limit as usize)
        .then(|| page.last().map(|p| format!("{}:{}", p.parked_at_ms, p.id)))
        .flatten();
    let queues = ledger.parked_per_queue().await?;
    Ok(Json(ParkedList {
        queues: queues.into_iter().map(Into::into).collect(),
        parked: page.iter().map(Into::into).collect(),
        next,
    }))
}

fn no_ledger() -> ApiError {
    ApiError::new(
        ErrorCode::LedgerDisabled,
        "this service has no ledger: nothing is parked",
    )
}

#[utoipa::path(get, summary = "A parked message", path = "/v1/parked/{id}", tag = "retries",
    params(("id" = String, Path)),
    responses((status = 200, description = "the message", body = ParkedView),
        (status = 404, description = "`parked_not_found`")))]
pub async fn one(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ParkedView>, ApiError> {
    require(&caller, Permission::Admin)?;
    let ledger = state.scheduler.own_ledger().ok_or_else(no_ledger)?;
    match ledger.parked_message(&id).await? {
        Some(parked) => Ok(Json((&parked).into())),
        None => Err(not_found(&id)),
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        ErrorCode::ParkedNotFound,
        format!("no parked message {id:?} (never parked, or replayed or discarded since)"),
    )
}

/// Parked messages, acted on through the service's scheduler.
fn parked(state: &AppState) -> Parked<'_> {
    Parked {
        scheduler: &state.scheduler,
        cascade: state.scheduler.cascade(),
        metrics: &state.metrics,
    }
}

/// `action` on parked message `id`, through the service's scheduler.
pub(super) async fn act_on_one(
    state: &AppState,
    id: &str,
    action: ParkedAction,
    now: &Reading,
) -> Result<Unparked, ApiError> {
    parked(state)
        .one(id, action, now)
        .await?
        .ok_or_else(|| not_found(id))
}

#[utoipa::path(post, summary = "Replay a parked message", path = "/v1/parked/{id}/replay", tag = "retries",
    description = "Back to the queue it failed in, on its first attempt again (a task: release limits hold it): \
        now, or, with a body of one of `delay_ms`, `delay` or `deliver_at` (as a move's), then. Needs `admin`.",
    params(("id" = String, Path)),
    request_body(content = Option<crate::task::RescheduleRequest>, description = "when; now without a body"),
    responses((status = 200, description = "what was done", body = Unparked),
        (status = 404, description = "`parked_not_found`")))]
pub async fn replay(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Unparked>, ApiError> {
    require(&caller, Permission::Admin)?;
    let now = crate::clock::read();
    let after_ms = replay_after_ms(&state, &body, &now)?;
    Ok(Json(
        act_on_one(&state, &id, ParkedAction::Replay { after_ms }, &now).await?,
    ))
}

/// How long from now a replay's body asks it to wait: none without one,
/// else exactly one of `delay_ms`, `delay` or `deliver_at`, as a move's.
pub(super) fn replay_after_ms(
    state: &AppState,
    body: &[u8],
    now: &Reading,
) -> Result<u64, ApiError> {
    // No body, or an empty object (what clients sent before a time could
    // be given): now.
    let empty = body.iter().all(u8::is_ascii_whitespace)
        || serde_json::from_slice::<serde_json::Value>(body)
            .is_ok_and(|value| value.as_object().is_some_and(serde_json::Map::is_empty));
    if empty {
        return Ok(0);
    }
    let start_ms = state.scheduler.cascade().delay_start_ms(now.wall);
    let asked = crate::task::parse_new_delay(body, start_ms)?;
    Ok(u64::try_from(asked.delay.as_millis()).unwrap_or(u64::MAX))
}

#[utoipa::path(delete, summary = "Discard a parked message", path = "/v1/parked/{id}", tag = "retries",
    params(("id" = String, Path)),
    responses((status = 200, description = "what was done", body = Unparked),
        (status = 404, description = "`parked_not_found`")))]
pub async fn discard(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Unparked>, ApiError> {
    require(&caller, Permission::Admin)?;
    let now = crate::clock::read();
    Ok(Json(
        act_on_one(&state, &id, ParkedAction::Discard, &now).await?,
    ))
}

/// `POST /v1/parked/bulk`'s body.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"filter": {"queue": "orders"}, "action": "replay"}))]
pub struct ParkedBulk {
    #[serde(default)]
    pub filter: ParkedBulkFilter,
    /// `replay` or `discard`.
    pub action: String,
}

/// Which parked messages: of `queue` (every queue when absent), whose last
/// attempt ended for `reason` (any when absent), whose first attempt
/// failed in the hour of `first_failed_hour` (any when absent): a group of
/// `GET /v1/parked/groups`, or several.
#[derive(Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ParkedBulkFilter {
    #[serde(default)]
    pub queue: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    /// RFC 3339: any time in the hour.
    #[serde(default)]
    #[schema(format = DateTime)]
    pub first_failed_hour: Option<String>,
}

/// The ledger's filter of parked messages, the hour read from RFC 3339
/// (any time in it); one that is not is refused with `code` (a query's
/// `invalid_query`, a body's `invalid_request`).
pub(super) fn parked_filter(
    queue: Option<String>,
    reason: Option<String>,
    first_failed_hour: Option<String>,
    code: ErrorCode,
) -> Result<ParkedFilter, ApiError> {
    let hour = match first_failed_hour {
        None => None,
        Some(text) => {
            let at = crate::clock::parse_epoch_ms(&text).ok_or_else(|| {
                ApiError::new(
                    code,
                    format!("first_failed_hour: {text:?} is not an RFC 3339 time"),
                )
            })?;
            Some(at - at % HOUR_MS)
        }
    };
    Ok(ParkedFilter {
        queue,
        reason,
        first_failed_hour_ms: hour,
    })
}

/// One group of parked messages: a queue, a reason, the hour their first
/// attempts failed in, with counts.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ParkedGroupView {
    pub queue: String,
    pub reason: String,
    /// The hour their first attempts failed in (on the hour).
    pub first_failed_hour: String,
    pub parked: u64,
    pub oldest_parked_at: String,
    pub newest_parked_at: String,
}

/// `GET /v1/parked/groups`' answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ParkedGroups {
    /// By queue, reason and hour.
    pub groups: Vec<ParkedGroupView>,
}

#[utoipa::path(get, summary = "Parked messages by group", path = "/v1/parked/groups", tag = "retries",
    description = "Every group of parked messages (a queue, the reason their last attempt ended, the hour their \
        first attempt failed in), with counts: the way operators clear a failure after fixing its cause, by \
        replaying or discarding a group (`POST /v1/parked/bulk` with the group as its filter). Needs `admin`.",
    responses((status = 200, description = "by queue, reason and hour", body = ParkedGroups)))]
pub async fn groups(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<ParkedGroups>, ApiError> {
    require(&caller, Permission::Admin)?;
    let ledger = state.scheduler.own_ledger().ok_or_else(no_ledger)?;
    let groups = ledger.parked_groups().await?;
    Ok(Json(ParkedGroups {
        groups: groups.iter().map(group_view).collect(),
    }))
}

fn group_view(group: &ParkedGroup) -> ParkedGroupView {
    ParkedGroupView {
        queue: group.queue.clone(),
        reason: group.reason.clone(),
        first_failed_hour: format_epoch_ms(group.first_failed_hour_ms),
        parked: group.parked,
        oldest_parked_at: format_epoch_ms(group.oldest_parked_at_ms),
        newest_parked_at: format_epoch_ms(group.newest_parked_at_ms),
    }
}

/// Replays or discards by filter; the console's buttons act through it.
pub(super) async fn act_on_filter(
    state: &AppState,
    filter: ParkedFilter,
    action: ParkedAction,
    now: &Reading,
) -> Result<Unparked, ApiError> {
    Ok(parked(state).all(&filter, action, now).await?)
}

#[utoipa::path(post, summary = "Replay or discard parked messages by filter", path = "/v1/parked/bulk", tag = "retries",
    description = "Every parked message the filter matches, a page of 500 at a time, newest first; counted as bulk \
        operations count (`matched` = `changed` + `unchanged`, the latter gone before the action reached them). \
        An error stops it: what was done stays done, and the same request again does the rest. Needs `admin`.",
    request_body = ParkedBulk,
    responses((status = 200, description = "what was done", body = Unparked)))]
pub async fn bulk(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody,
) -> Result<Json<Unparked>, ApiError> {
    require(&caller, Permission::Admin)?;
    require_object(&body, "", "a bulk action: {\"filter\": …, \"action\": …}")?;
    let request: ParkedBulk = deserialize_whole(&body)
        .map_err(|e| ApiError::from(TaskError::from_shape(&e, "", "a parked bulk action")))?;
    let action = ParkedAction::parse(&request.action).ok_or_else(|| {
        ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "/action: must be \"replay\" or \"discard\", got {:?}",
                request.action
            ),
        )
    })?;
    let filter = parked_filter(
        request.filter.queue,
        request.filter.reason,
        request.filter.first_failed_hour,
        ErrorCode::InvalidRequest,
    )?;
    let now = crate::clock::read();
    Ok(Json(act_on_filter(&state, filter, action, &now).await?))
}

pub fn router() -> axum::Router<AppState> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/v1/parked", get(list))
        .route("/v1/parked/bulk", post(bulk))
        .route("/v1/parked/groups", get(groups))
        .route("/v1/parked/{id}", get(one).delete(discard))
        .route("/v1/parked/{id}/replay", post(replay))
}
