use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use tracing::{Instrument, info_span, warn};

use super::AppState;
use super::error::{ApiError, ErrorBody, ErrorCode};
use crate::cascade::{Cascade, MAX_NAME_BYTES, validate_destination};
use crate::scheduler::{Idempotency, Submitted};
use crate::store::{Cursor, Ledger, StoreError, TaskFilter, TaskRecord};
use crate::task::{
    BatchRequest, Task, TaskAccepted, TaskError, TaskState, fingerprint, format_epoch_ms,
    parse_epoch_ms, require_object,
};

/// Names a request so that its retries are answered, not scheduled again.
const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set on the answer to a retry that was recognised.
const REPLAYED: &str = "idempotent-replayed";

/// A request body that must be JSON, read whole within the body limit.
pub struct JsonBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let media_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<mime::Mime>().ok());
        let is_json = media_type.as_ref().is_some_and(|m| {
            m.type_() == mime::APPLICATION
                && (m.subtype() == mime::JSON || m.suffix() == Some(mime::JSON))
        });
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the task as JSON with Content-Type: application/json",
            ));
        }
        // JSON is UTF-8 (RFC 8259); a body declared otherwise would be misread.
        if let Some(charset) = media_type.as_ref().and_then(|m| m.get_param(mime::CHARSET))
            && charset != mime::UTF_8
        {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("JSON is UTF-8; the body says charset={charset}: send it as UTF-8"),
            ));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "payload_too_large",
                        "the request body is larger than http.body_limit_bytes allows",
                    )
                } else {
                    ApiError::new(rejection.status(), "unreadable_body", rejection.body_text())
                }
            })?;
        Ok(JsonBody(bytes))
    }
}

/// The Idempotency-Key header, checked, and the request's fingerprint when
/// the request can be repeated (it has a key or a client-chosen id).
fn idempotency(
    key_header: Option<&HeaderValue>,
    body: &[u8],
    task: &Task,
    has_ledger: bool,
) -> Result<Idempotency, ApiError> {
    if !has_ledger {
        return Ok(Idempotency::default());
    }
    let key = match key_header {
        None => None,
        Some(value) => {
            let key = value
                .to_str()
                .ok()
                .filter(|k| {
                    !k.is_empty()
                        && k.len() <= MAX_NAME_BYTES
                        && k.bytes().all(|b| b.is_ascii_graphic())
                })
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_idempotency_key",
                        format!(
                            "Idempotency-Key must be 1 to {MAX_NAME_BYTES} bytes of visible ASCII"
                        ),
                    )
                })?;
            Some(key.to_owned())
        }
    };
    let fingerprint = if key.is_some() || task.client_id {
        Some(fingerprint(body)?)
    } else {
        None
    };
    Ok(Idempotency { key, fingerprint })
}

async fn submit(
    state: &AppState,
    task: &Task,
    idempotency: Idempotency,
) -> Result<Submitted, ApiError> {
    let span = info_span!("task", task_id = %task.id);
    state
        .scheduler
        .submit(task, idempotency)
        .instrument(span)
        .await
        .inspect(|submitted| {
            let accepted_as = submitted.accepted.state.as_str();
            state
                .scheduler
                .metrics
                .accepted(accepted_as, submitted.replayed);
        })
        .map_err(|error| {
            let error = ApiError::from(error);
            if error.status.is_server_error() {
                warn!(task_id = %task.id, error = %error.message, "task not accepted");
            }
            error
        })
}

pub async fn create_task(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let task = Task::parse(&body, &state.scheduler.cascade, SystemTime::now())?;
    let idempotency = idempotency(
        headers.get(IDEMPOTENCY_KEY),
        &body,
        &task,
        state.scheduler.ledger.is_some(),
    )?;
    let submitted = submit(&state, &task, idempotency).await?;
    let mut response = (StatusCode::ACCEPTED, Json(submitted.accepted)).into_response();
    if submitted.replayed {
        response
            .headers_mut()
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// One task's outcome in a batch: `task` when accepted, `error` otherwise.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
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

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
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

/// Takes every valid task of the batch concurrently: their ledger writes
/// share commits and their confirms are pipelined, so a batch costs about
/// one round trip of each, not one per task. A task's client `id` is its
/// idempotency key.
pub async fn create_batch(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Json<BatchResponse>, ApiError> {
    if headers.contains_key(IDEMPOTENCY_KEY) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            "a batch is not keyed as a whole: give each task an \"id\" instead, which makes \
             each one idempotent on its own",
        ));
    }
    require_object(&body, "", "a batch: {\"tasks\": [task, …]}")?;
    let mut deserializer = serde_json::Deserializer::from_slice(&body);
    let batch: BatchRequest = serde_path_to_error::deserialize(&mut deserializer)
        .map_err(|e| ApiError::from(TaskError::from_shape(&e, "")))?;
    if batch.tasks.len() > state.batch_limit {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "batch_too_large",
            format!(
                "a batch holds at most {} tasks, got {}",
                state.batch_limit,
                batch.tasks.len()
            ),
        ));
    }
    let now = SystemTime::now();
    let has_ledger = state.scheduler.ledger.is_some();
    let parsed: Vec<Result<(Task, Idempotency), ApiError>> = batch
        .tasks
        .iter()
        .enumerate()
        .map(|(index, raw)| {
            let body = raw.get().as_bytes();
            let at = format!("/tasks/{index}");
            let task = Task::parse_at(body, &state.scheduler.cascade, now, &at)?;
            let idempotency = idempotency(None, body, &task, has_ledger)?;
            Ok((task, idempotency))
        })
        .collect();
    // A client id repeated within the batch names one task: the repeat gets
    // the first's answer (as a replay), or a conflict if its body differs.
    let mut first_with_id: HashMap<&str, usize> = HashMap::new();
    let repeats: Vec<Option<usize>> = parsed
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let (task, _) = item.as_ref().ok().filter(|(task, _)| task.client_id)?;
            match first_with_id.get(task.id.as_str()) {
                Some(&first) => Some(first),
                None => {
                    first_with_id.insert(&task.id, index);
                    None
                }
            }
        })
        .collect();
    let outcomes = parsed.iter().zip(&repeats).map(|(item, repeat)| {
        let state = &state;
        async move {
            if repeat.is_some() {
                return None;
            }
            Some(match item {
                Ok((task, idempotency)) => submit(state, task, idempotency.clone()).await,
                Err(error) => Err(error.clone()),
            })
        }
    });
    let outcomes = join_all(outcomes).await;
    let results = (0..parsed.len())
        .map(|index| {
            let outcome = match (repeats[index], &outcomes[index]) {
                (None, Some(outcome)) => outcome.clone(),
                (Some(first), _) => repeat_of(&parsed, first, index, &outcomes[first]),
                (None, None) => Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "a task of the batch was neither submitted nor a repeat",
                )),
            };
            match outcome {
                Ok(submitted) => BatchItem {
                    status: StatusCode::ACCEPTED.as_u16(),
                    task: Some(submitted.accepted),
                    replayed: submitted.replayed,
                    error: None,
                },
                Err(error) => {
                    state.scheduler.metrics.rejected(error.code);
                    BatchItem::rejected(error)
                }
            }
        })
        .collect();
    Ok(Json(BatchResponse { results }))
}

/// The answer to the task at `index`, which repeats the client id of the
/// task at `first` in the same batch.
fn repeat_of(
    parsed: &[Result<(Task, Idempotency), ApiError>],
    first: usize,
    index: usize,
    first_outcome: &Option<Result<Submitted, ApiError>>,
) -> Result<Submitted, ApiError> {
    let fingerprint = |i: usize| {
        parsed[i]
            .as_ref()
            .ok()
            .and_then(|(_, idempotency)| idempotency.fingerprint.clone())
    };
    if fingerprint(first) != fingerprint(index) {
        let id = parsed[index]
            .as_ref()
            .map(|(t, _)| t.id.clone())
            .unwrap_or_default();
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "idempotency_conflict",
            format!("task id {id:?} appears earlier in this batch with a different body"),
        ));
    }
    match first_outcome {
        Some(Ok(submitted)) => Ok(Submitted {
            accepted: submitted.accepted.clone(),
            replayed: true,
        }),
        Some(Err(error)) => Err(error.clone()),
        None => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "a repeated task lost its first occurrence",
        )),
    }
}

/// A task as the ledger knows it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct TaskView {
    pub id: String,
    pub state: TaskState,
    pub destination: String,
    pub routing_key: String,
    pub delay_ms: u64,
    pub deliver_at: String,
    pub created_at: String,
    pub published_at: Option<String>,
    pub idempotency_key: Option<String>,
    pub content_type: String,
    pub headers: BTreeMap<String, crate::task::HeaderValue>,
    /// The payload's size as submitted.
    pub payload_bytes: u64,
    /// What the ledger still holds of the payload (see store.payload_copy_bytes).
    pub payload_base64: Option<String>,
    pub payload_truncated: bool,
    /// Publishing attempts so far.
    pub attempts: u64,
    /// Why the last attempt failed, while the task is pending.
    pub last_error: Option<String>,
}

impl TaskView {
    fn new(record: TaskRecord) -> Result<TaskView, StoreError> {
        let payload_bytes = u64::try_from(record.payload_bytes).unwrap_or(0);
        let kept = record.payload.as_ref().map_or(0, |p| p.len() as u64);
        let payload_truncated = kept < payload_bytes;
        Ok(TaskView {
            state: record.state()?,
            deliver_at: format_epoch_ms(record.deliver_at_ms()),
            created_at: format_epoch_ms(record.created_at_ms()),
            published_at: record.published_at_ms().map(format_epoch_ms),
            headers: record.header_values()?,
            delay_ms: u64::try_from(record.delay_ms).unwrap_or(0),
            attempts: u64::try_from(record.attempts).unwrap_or(0),
            payload_base64: record
                .payload
                .as_ref()
                .map(|p| base64::engine::general_purpose::STANDARD.encode(p)),
            payload_bytes,
            payload_truncated,
            id: record.id,
            destination: record.destination,
            routing_key: record.routing_key,
            idempotency_key: record.idempotency_key,
            content_type: record.content_type,
            last_error: record.last_error,
        })
    }
}

fn ledger(state: &AppState) -> Result<&Ledger, ApiError> {
    state.scheduler.ledger.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "ledger_disabled",
            "this service runs without a ledger (store.url = \"none\"): tasks cannot be inspected",
        )
    })
}

pub async fn get_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    let record = ledger(&state)?.get(&id).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "task_not_found",
            format!("no task {id:?} in the ledger (never accepted, or pruned after retention)"),
        )
    })?;
    Ok(Json(TaskView::new(record)?))
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

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct TaskPage {
    pub tasks: Vec<TaskView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_cursor: Option<String>,
}

fn invalid_query(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", message)
}

impl ListQuery {
    fn filter(self) -> Result<TaskFilter, ApiError> {
        let state = match self.state.as_deref() {
            None => None,
            Some(text) => Some(TaskState::parse(text).ok_or_else(|| {
                invalid_query(format!(
                    "state must be pending, published or failed, got {text:?}"
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
            destination: self.destination,
            state,
            due_before_ms,
            after,
            limit,
        })
    }
}

/// Tasks in due order, a page at a time.
pub async fn list_tasks(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<TaskPage>, ApiError> {
    let ledger = ledger(&state)?;
    let Query(query) = query.map_err(|e| invalid_query(e.body_text()))?;
    let filter = query.filter()?;
    let records = ledger.list(&filter).await?;
    let next_cursor = (records.len() == filter.limit as usize)
        .then(|| records.last())
        .flatten()
        .map(|last| {
            Cursor {
                deliver_at_ms: last.deliver_at_ms(),
                id: last.id.clone(),
            }
            .encode()
        });
    let tasks = records
        .into_iter()
        .map(TaskView::new)
        .collect::<Result<_, _>>()?;
    Ok(Json(TaskPage { tasks, next_cursor }))
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LevelView {
    pub level: u32,
    pub exchange: String,
    pub queue: String,
    pub ttl_ms: u64,
    pub dead_letter_exchange: String,
}

/// What a consumer or operator needs to know about the cascade.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TopologyView {
    pub business_exchange: String,
    pub unroutable_exchange: String,
    pub unroutable_queue: String,
    pub unit_ms: u64,
    pub levels: u32,
    pub max_delay_ms: u64,
    pub queue_type: String,
    /// The pattern to bind a queue to the business exchange with, for one destination.
    pub binding_key: String,
    pub queues: Vec<LevelView>,
}

impl TopologyView {
    pub fn new(cascade: &Cascade) -> Self {
        TopologyView {
            business_exchange: cascade.business_exchange().to_owned(),
            unroutable_exchange: cascade.unroutable_exchange(),
            unroutable_queue: cascade.unroutable_queue(),
            unit_ms: cascade.unit_ms(),
            levels: cascade.levels(),
            max_delay_ms: cascade.max_delay_ms(),
            queue_type: cascade.queue_type().as_str().to_owned(),
            binding_key: cascade.binding_key("{destination}"),
            queues: (0..cascade.levels())
                .rev()
                .map(|level| LevelView {
                    level,
                    exchange: cascade.level_exchange(level),
                    queue: cascade.level_queue(level),
                    ttl_ms: cascade.level_ttl_ms(level),
                    dead_letter_exchange: cascade.next_exchange(level),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct TopologyQuery {
    destination: Option<String>,
}

/// With `?destination=`, `binding_key` is the exact key for that destination.
pub async fn topology(
    State(state): State<AppState>,
    Query(query): Query<TopologyQuery>,
) -> Result<Response, ApiError> {
    let Some(destination) = query.destination else {
        return Ok(Json(state.topology.as_ref()).into_response());
    };
    validate_destination(&destination).map_err(|e| ApiError::from(TaskError::from(e)))?;
    let mut view = serde_json::to_value(state.topology.as_ref())
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    view["binding_key"] = state.scheduler.cascade.binding_key(&destination).into();
    Ok(Json(view).into_response())
}

#[derive(Serialize)]
struct Status {
    status: &'static str,
}

/// Prometheus scrape. Values that live elsewhere are read now, not mirrored.
pub async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let scheduler = &state.scheduler;
    let metrics = &scheduler.metrics;
    let broker = scheduler.publisher.status();
    metrics.broker_connected.set(i64::from(broker.ready));
    metrics
        .broker_misconfigured
        .set(i64::from(broker.problem.is_some_and(|p| p.misconfigured)));
    if let Some(ledger) = &scheduler.ledger {
        // A scrape must not fail when the ledger does: that is when it matters.
        let pending = ledger.recount_pending().await.unwrap_or_else(|error| {
            warn!(%error, "cannot count pending tasks for /metrics");
            ledger.pending_estimate()
        });
        metrics
            .ledger_pending
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
    }
    let text = metrics.encode().map_err(|error| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            format!("encoding the metrics failed: {error}"),
        )
    })?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

/// Counts the rejections of the task routes' error responses; a batch's
/// per-task rejections are counted where they are decided.
pub async fn count_rejections(
    State(state): State<AppState>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    if let Some(ErrorCode(code)) = response.extensions().get::<ErrorCode>() {
        state.scheduler.metrics.rejected(code);
    }
    response
}

pub async fn healthz() -> impl IntoResponse {
    Json(Status { status: "ok" })
}

#[derive(Serialize)]
struct Readiness {
    status: &'static str,
    /// Whether tasks are published as they come, or wait in the ledger.
    broker: &'static str,
    /// The broker address in use (without its password).
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    /// Why the broker blocks publishing (a resource alarm), while it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    blocked: Option<String>,
    /// Why the last attempt to connect failed, while disconnected.
    #[serde(skip_serializing_if = "Option::is_none")]
    broker_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pending: Option<u64>,
}

/// Ready means a task posted now would be accepted. Without a ledger that
/// needs the broker (connected and provisioned); with one, the ledger must
/// answer and have room, and the broker may be away.
pub async fn readyz(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let status = state.scheduler.publisher.status();
    if let Some(problem) = &status.problem
        && problem.misconfigured
        && problem.since.elapsed() >= state.misconfiguration_grace
    {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "broker_misconfigured",
            format!(
                "RabbitMQ has refused delayline for {} s: {} (check amqp.uri: user, password, \
                 vhost, and the user's permissions)",
                problem.since.elapsed().as_secs(),
                problem.reason
            ),
        ));
    }
    let broker_error = status.problem.as_ref().map(|p| p.reason.clone());
    let broker = match (&status.node, &status.blocked) {
        (Some(_), Some(_)) => "blocked",
        (Some(_), None) if status.ready => "connected",
        _ => "disconnected",
    };
    let Some(ledger) = &state.scheduler.ledger else {
        if !status.ready {
            let message = match (&status.blocked, &broker_error) {
                (Some(reason), _) => format!("RabbitMQ blocks publishing: {reason}"),
                (None, Some(error)) => format!("not connected to RabbitMQ: {error}"),
                (None, None) => {
                    "not connected to RabbitMQ, or the topology is not provisioned yet".to_owned()
                }
            };
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                message,
            ));
        }
        return Ok(Json(Readiness {
            status: "ready",
            broker,
            node: status.node,
            blocked: None,
            broker_error: None,
            pending: None,
        }));
    };
    let pending = ledger.recount_pending().await?;
    if ledger.is_full() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ledger_full",
            format!("{pending} tasks are waiting for RabbitMQ, the most store.max_pending allows"),
        ));
    }
    Ok(Json(Readiness {
        status: "ready",
        broker,
        node: status.node,
        blocked: status.blocked,
        broker_error,
        pending: Some(pending),
    }))
}

pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not accept that method",
    )
}

pub fn panic_response(_: Box<dyn Any + Send + 'static>) -> Response {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal error; the request was not completed",
    )
    .into_response()
}
