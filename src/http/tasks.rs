//! `POST /v1/tasks` and `POST /v1/tasks/batch`: taking tasks in, with the
//! idempotency rules, and counting what is refused.

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use tracing::{Instrument, info_span, warn};

use super::auth::{
    admit, check_destination, check_exchange, require, scoped_fingerprint, scoped_key,
};
use super::batch;
use super::error::{AnsweredCode, ApiError, ErrorBody, ErrorCode};
use super::extract::JsonBody;
use super::state::AppState;
use crate::auth::{Caller, Permission};
use crate::cascade::MAX_NAME_BYTES;
use crate::clock::Reading;
use crate::scheduler::{Idempotency, Submitted};
use crate::task::{Task, TaskAccepted, fingerprint, parse_batch};

/// Names a request so that its retries are answered, not scheduled again.
pub(super) const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set on the answer to a retry that was recognised.
pub(super) const REPLAYED: &str = "idempotent-replayed";

/// The Idempotency-Key header, checked: 1 to 255 bytes of visible ASCII.
pub(super) fn idempotency_key(header: Option<&HeaderValue>) -> Result<Option<String>, ApiError> {
    let Some(value) = header else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| {
            !k.is_empty() && k.len() <= MAX_NAME_BYTES && k.bytes().all(|b| b.is_ascii_graphic())
        })
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidIdempotencyKey,
                format!("Idempotency-Key must be 1 to {MAX_NAME_BYTES} bytes of visible ASCII"),
            )
        })?;
    Ok(Some(key.to_owned()))
}

/// The Idempotency-Key header, checked, and the request's fingerprint when
/// the request can be repeated (it has a key or a client-chosen id).
/// Both are the caller's own: its keys never meet another client's, and
/// another client repeating its task id is a conflict, not a replay.
fn idempotency(
    caller: &Caller,
    key_header: Option<&HeaderValue>,
    body: &[u8],
    task: &Task,
    has_ledger: bool,
) -> Result<Idempotency, ApiError> {
    if !has_ledger {
        return Ok(Idempotency::default());
    }
    let key = idempotency_key(key_header)?.map(|key| scoped_key(caller, key));
    let fingerprint = if key.is_some() || task.client_id {
        Some(scoped_fingerprint(caller, fingerprint(body)?))
    } else {
        None
    };
    Ok(Idempotency { key, fingerprint })
}

/// Takes `tasks` from the caller's rate and quota (a client's; an open API
/// has neither).
pub(super) fn admit_tasks(state: &AppState, caller: &Caller, tasks: u64) -> Result<(), ApiError> {
    match caller {
        Caller::Client(client) if tasks > 0 => admit(state, client, tasks),
        _ => Ok(()),
    }
}

/// Takes `tasks` from the caller's rate and quota, and says how many it
/// took. A request whose every valid task (of `parsed`) repeats one
/// accepted before (a client's retry after a lost answer) takes nothing and
/// is let through even at the client's limits: it schedules nothing, and its
/// answer is the one the client lost. The ledger is asked only then.
async fn admit_unless_replays(
    state: &AppState,
    caller: &Caller,
    tasks: u64,
    parsed: &[batch::Parsed],
) -> Result<u64, ApiError> {
    let Err(throttled) = admit_tasks(state, caller, tasks) else {
        return Ok(tasks);
    };
    let mut valid = parsed.iter().flatten().peekable();
    let mut all_replays = valid.peek().is_some();
    for (task, idempotency) in valid {
        if !state.scheduler.is_replay(task, idempotency).await? {
            all_replays = false;
            break;
        }
    }
    if all_replays {
        return Ok(0);
    }
    if let Some(client) = caller.client_name() {
        state.metrics.client_throttled(client, throttled.code);
    }
    Err(throttled)
}

/// Gives back the quota `reserved` tasks took beyond the `accepted` ones
/// (refused, or replays of tasks already counted), and counts the accepted.
pub(super) fn settle(state: &AppState, caller: &Caller, reserved: u64, accepted: u64) {
    if let Caller::Client(client) = caller {
        if client.max_scheduled.is_some() {
            state
                .auth
                .usage
                .give_back(&client.name, reserved.saturating_sub(accepted));
        }
        if accepted > 0 {
            state.metrics.client_accepted(&client.name, accepted);
        }
    }
}

/// The request's W3C trace context (`traceparent`, `tracestate`), given to
/// each task it makes (see [`crate::message::trace_headers`]).
#[derive(Clone, Copy)]
struct Trace<'a> {
    parent: Option<&'a str>,
    state: Option<&'a str>,
}

impl<'a> Trace<'a> {
    fn of(headers: &'a HeaderMap) -> Trace<'a> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        Trace {
            parent: text(crate::message::TRACEPARENT_HEADER),
            state: text(crate::message::TRACESTATE_HEADER),
        }
    }
}

/// A task parsed, checked against the caller's destinations, marked as the
/// caller's, and given the request's trace context.
fn parse_for(
    state: &AppState,
    caller: &Caller,
    (body, trace): (&[u8], Trace<'_>),
    now: &Reading,
    at: &str,
) -> Result<Task, ApiError> {
    let mut task = Task::parse_at(body, state.scheduler.cascade(), now.wall, at)?;
    let carried = crate::message::trace_headers(trace.parent, trace.state, &task.headers);
    task.headers.extend(carried);
    check_destination(caller, &task.destination)?;
    if let Some(expired_destination) = &task.expired_destination {
        check_destination(caller, expired_destination)?;
    }
    check_exchange(caller, task.exchange.as_deref())?;
    task.client = caller.client_name().map(str::to_owned);
    Ok(task)
}

pub(super) async fn submit(
    state: &AppState,
    task: &Task,
    idempotency: Idempotency,
    now: &Reading,
) -> Result<Submitted, ApiError> {
    let span = info_span!("task", task_id = %task.id);
    state
        .scheduler
        .submit(task, idempotency, now)
        .instrument(span)
        .await
        .map_err(|error| {
            let error = ApiError::from(error);
            if error.status.is_server_error() {
                warn!(task_id = %task.id, error = %error.message, "task not accepted");
            }
            error
        })
}

/// The W3C trace context headers, as the OpenAPI document describes them.
const TRACEPARENT_DOC: &str = "W3C trace context: carried to each task the request makes (unless \
     the task's own headers hold one) and on to the consumer; one that is not a valid traceparent \
     is not carried";
const TRACESTATE_DOC: &str = "W3C trace context: carried with the traceparent";

#[utoipa::path(post, summary = "Schedule a task", path = "/v1/tasks", tag = "tasks",
    request_body = crate::task::TaskRequest,
    params(("Idempotency-Key" = Option<String>, Header,
            description = "1 to 255 visible ASCII bytes: a repeat of the request is answered, not scheduled again"),
        ("traceparent" = Option<String>, Header, description = TRACEPARENT_DOC),
        ("tracestate" = Option<String>, Header, description = TRACESTATE_DOC)),
    responses(
        (status = 202, description = "accepted (`Idempotent-Replayed: true` on a recognised repeat)", body = crate::task::TaskAccepted,
         headers(("Idempotent-Replayed" = String, description = "`true` on a recognised repeat"))),
    ))]
pub async fn create_task(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    require(&caller, Permission::Submit)?;
    let _intake = state.intake.admit(1)?;
    // The request's one instant: its due time and its hold stamp both count from it.
    let now = crate::clock::read();
    let trace = Trace::of(&headers);
    let parsed = parse_for(&state, &caller, (&body, trace), &now, "").and_then(|task| {
        let idempotency = idempotency(
            &caller,
            headers.get(IDEMPOTENCY_KEY),
            &body,
            &task,
            state.scheduler.has_ledger(),
        )?;
        Ok((task, idempotency))
    });
    // Even an invalid task takes from the rate: refusing it costs work too.
    let reserved = admit_unless_replays(&state, &caller, 1, std::slice::from_ref(&parsed)).await?;
    let submitted = match parsed {
        Ok((task, idempotency)) => submit(&state, &task, idempotency, &now).await,
        Err(error) => Err(error),
    };
    let accepted = submitted.as_ref().is_ok_and(|s| !s.replayed);
    settle(&state, &caller, reserved, u64::from(accepted));
    Ok(accepted_answer(submitted?))
}

/// `202` with the accepted task, marked `Idempotent-Replayed` when the
/// request repeated one accepted before.
pub(super) fn accepted_answer(submitted: Submitted) -> Response {
    let mut response = (StatusCode::ACCEPTED, Json(submitted.accepted)).into_response();
    if submitted.replayed {
        response
            .headers_mut()
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// One task's outcome in a batch: `task` when accepted, `error` otherwise.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct BatchItem {
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub task: Option<TaskAccepted>,
    /// The task was accepted by an earlier request with the same id.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub replayed: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<ErrorBody>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct BatchResponse {
    pub results: Vec<BatchItem>,
}

impl BatchItem {
    fn rejected(error: ApiError) -> Self {
        BatchItem {
            status: error.status.as_u16(),
            task: None,
            replayed: false,
            error: Some(error.body()),
        }
    }
}

/// Each task of a batch parsed on its own, its errors located at
/// `/tasks/{index}`: one bad task does not refuse the others.
fn parse_each(
    state: &AppState,
    caller: &Caller,
    (tasks, trace): (&[&serde_json::value::RawValue], Trace<'_>),
    now: &Reading,
) -> Vec<batch::Parsed> {
    let has_ledger = state.scheduler.has_ledger();
    tasks
        .iter()
        .enumerate()
        .map(|(index, raw)| {
            let body = raw.get().as_bytes();
            let at = format!("/tasks/{index}");
            let task = parse_for(state, caller, (body, trace), now, &at)?;
            let idempotency = idempotency(caller, None, body, &task, has_ledger)?;
            Ok((task, idempotency))
        })
        .collect()
}

/// Takes every valid task of the batch concurrently: their ledger writes
/// share commits and their confirms are pipelined, so a batch costs about
/// one round trip of each, not one per task. A task's client `id` is its
/// idempotency key.
#[utoipa::path(post, summary = "Schedule many tasks in one request", path = "/v1/tasks/batch", tag = "tasks",
    request_body = crate::task::BatchRequest,
    params(("traceparent" = Option<String>, Header, description = TRACEPARENT_DOC),
        ("tracestate" = Option<String>, Header, description = TRACESTATE_DOC)),
    responses((status = 200, description = "one result per task, in order", body = BatchResponse)))]
pub async fn create_batch(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Json<BatchResponse>, ApiError> {
    require(&caller, Permission::Submit)?;
    if headers.contains_key(IDEMPOTENCY_KEY) {
        return Err(ApiError::new(
            ErrorCode::InvalidIdempotencyKey,
            "a batch is not keyed as a whole: give each task an \"id\" instead, which makes \
             each one idempotent on its own",
        ));
    }
    let request = parse_batch(&body)?;
    if request.tasks.len() > state.batch_limit {
        return Err(ApiError::new(
            ErrorCode::BatchTooLarge,
            format!(
                "a batch holds at most {} tasks, got {}",
                state.batch_limit,
                request.tasks.len()
            ),
        ));
    }
    let now = crate::clock::read();
    let parsed = parse_each(&state, &caller, (&request.tasks, Trace::of(&headers)), &now);
    // The rate and quota are taken for the whole batch or not at all: a 429
    // means that nothing in it was taken.
    let valid = parsed.iter().filter(|item| item.is_ok()).count();
    let _intake = state.intake.admit(valid)?;
    let reserved = admit_unless_replays(&state, &caller, valid as u64, &parsed).await?;
    // A client id repeated within the batch names one task: the repeat gets
    // the first's answer (as a replay), or a conflict if its body differs.
    let repeats = batch::earlier_with_same_id(&batch::client_ids(&parsed));
    let outcomes = parsed.iter().zip(&repeats).map(|(item, repeat)| {
        let (state, now) = (&state, &now);
        async move {
            if repeat.is_some() {
                return None;
            }
            Some(match item {
                Ok((task, idempotency)) => submit(state, task, idempotency.clone(), now).await,
                Err(error) => Err(error.clone()),
            })
        }
    });
    let outcomes = join_all(outcomes).await;
    let accepted = outcomes
        .iter()
        .flatten()
        .filter(|outcome| outcome.as_ref().is_ok_and(|s| !s.replayed))
        .count() as u64;
    settle(&state, &caller, reserved, accepted);
    let results = batch::answers(&parsed, &repeats, &outcomes)
        .into_iter()
        .map(|answer| match answer {
            Ok(submitted) => BatchItem {
                status: StatusCode::ACCEPTED.as_u16(),
                task: Some(submitted.accepted),
                replayed: submitted.replayed,
                error: None,
            },
            Err(error) => {
                state.metrics.rejected(error.code);
                BatchItem::rejected(error)
            }
        })
        .collect();
    Ok(Json(BatchResponse { results }))
}

/// Counts the rejections of the task routes' error responses; a batch's
/// per-task rejections are counted where they are decided.
pub async fn count_rejections(
    State(state): State<AppState>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    if let Some(AnsweredCode(code)) = response.extensions().get::<AnsweredCode>() {
        state.metrics.rejected(code);
    }
    response
}

/// The task routes; their refusals are counted by code.
pub fn router(state: AppState) -> axum::Router<AppState> {
    let count_rejections = axum::middleware::from_fn_with_state(state, count_rejections);
    axum::Router::new()
        .route(
            "/v1/tasks",
            axum::routing::post(create_task).route_layer(count_rejections.clone()),
        )
        .route(
            "/v1/tasks/batch",
            axum::routing::post(create_batch).route_layer(count_rejections),
        )
}
