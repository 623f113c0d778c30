use std::any::Any;
use std::time::SystemTime;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use tracing::{Instrument, info_span, warn};

use super::AppState;
use super::error::{ApiError, ErrorBody};
use crate::cascade::{Cascade, validate_destination};
use crate::task::{BatchRequest, Task, TaskAccepted, TaskError};

/// A request body that must be JSON, read whole within the body limit.
pub struct JsonBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|mime| {
                let mime = mime.trim().to_ascii_lowercase();
                mime == "application/json" || mime.ends_with("+json")
            })
            .unwrap_or(false);
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the task as JSON with Content-Type: application/json",
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

async fn publish(state: &AppState, task: &Task) -> Result<(), ApiError> {
    state.publisher.publish_task(task).await.map_err(|error| {
        warn!(task_id = %task.id, %error, "task not accepted");
        ApiError::from(error)
    })
}

pub async fn create_task(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<TaskAccepted>), ApiError> {
    let task = Task::parse(&body, &state.cascade, SystemTime::now())?;
    let span = info_span!("task", task_id = %task.id);
    publish(&state, &task).instrument(span).await?;
    Ok((StatusCode::ACCEPTED, Json(task.accepted())))
}

/// One task's outcome in a batch: `task` when accepted, `error` otherwise.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BatchItem {
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub task: Option<TaskAccepted>,
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
            error: Some(error.body()),
        }
    }
}

/// Publishes every valid task of the batch concurrently; their confirms are
/// pipelined, so a batch costs about one round trip, not one per task.
pub async fn create_batch(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<BatchResponse>, ApiError> {
    let batch: BatchRequest =
        serde_json::from_slice(&body).map_err(|e| ApiError::from(TaskError::from_json(&e)))?;
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
    let outcomes = batch.tasks.iter().map(|raw| {
        let state = &state;
        async move {
            let task = match Task::parse(raw.get().as_bytes(), &state.cascade, now) {
                Ok(task) => task,
                Err(error) => return BatchItem::rejected(error.into()),
            };
            let span = info_span!("task", task_id = %task.id);
            match publish(state, &task).instrument(span).await {
                Ok(()) => BatchItem {
                    status: StatusCode::ACCEPTED.as_u16(),
                    task: Some(task.accepted()),
                    error: None,
                },
                Err(error) => BatchItem::rejected(error),
            }
        }
    });
    Ok(Json(BatchResponse {
        results: join_all(outcomes).await,
    }))
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
    view["binding_key"] = state.cascade.binding_key(&destination).into();
    Ok(Json(view).into_response())
}

#[derive(Serialize)]
struct Status {
    status: &'static str,
}

pub async fn healthz() -> impl IntoResponse {
    Json(Status { status: "ok" })
}

/// Ready means a task posted now would be confirmed: connected and provisioned.
pub async fn readyz(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    if state.publisher.is_ready() {
        Ok(Json(Status { status: "ready" }))
    } else {
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "not connected to RabbitMQ, or the topology is not provisioned yet",
        ))
    }
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
