//! `/v1/retries`: the retry policies in force (the configuration's and
//! those set at run time), set, changed and removed while the service
//! runs, and who changed what. Every route needs `admin`: a policy decides
//! what becomes of any queue's failures.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::auth::require;
use super::error::{ApiError, ErrorCode};
use super::extract::JsonBody;
use super::state::AppState;
use crate::auth::{Caller, Permission};
use crate::clock::format_epoch_ms;
use crate::ingress::{
    InForce, PolicyError, PolicySource, REFRESH_EVERY, RetryBook, RetryPolicy, RetrySettings,
    SetAside,
};
use crate::ledger::RetryPolicyChange;
use crate::task::{TaskError, deserialize_whole, require_object};

/// A policy in force, and where it comes from.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PolicyView {
    #[serde(flatten)]
    pub policy: RetryPolicy,
    /// `configuration` (a `[[retry]]` section of this replica's file) or
    /// `api` (set at run time, kept in the ledger, shared by replicas).
    pub source: &'static str,
    /// The client that changed it last (set at run time by a client).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_at: Option<String>,
}

impl From<&InForce> for PolicyView {
    fn from(in_force: &InForce) -> Self {
        let (changed_by, created_at, changed_at) = match &in_force.source {
            PolicySource::Configuration => (None, None, None),
            PolicySource::Ledger {
                changed_by,
                created_at_ms,
                changed_at_ms,
            } => (
                changed_by.clone(),
                Some(format_epoch_ms(*created_at_ms)),
                Some(format_epoch_ms(*changed_at_ms)),
            ),
        };
        PolicyView {
            policy: in_force.policy.clone(),
            source: in_force.source.as_str(),
            changed_by,
            created_at,
            changed_at,
        }
    }
}

/// The retry policies and the broker objects they share.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RetriesView {
    /// The configuration's, then those set at run time, by name.
    pub policies: Vec<PolicyView>,
    /// Policies stored in the ledger that are not in force on this replica
    /// (its configuration has their name or a queue of theirs, or its chain
    /// cannot hold their longest wait), and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub set_aside: Vec<SetAside>,
    /// Whether policies can be set at run time here (a ledger and the
    /// release stage).
    pub settable: bool,
    /// How long a change made on one replica takes at most to be in force
    /// on the others.
    pub refresh_ms: u64,
    /// The exchange a consumer's queue names as its `x-dead-letter-exchange`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exchange: Option<String>,
    /// The quorum queue delayline takes dead-lettered messages from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Where a message no policy covers goes, with the reason in headers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused_queue: Option<String>,
    /// The header a retried delivery carries: which attempt it is.
    pub attempt_header: &'static str,
    /// Each covered queue's destination: what its retries are listed,
    /// filtered, limited and forecast by (the queue's own name, or an
    /// escaped form of it, starting with `_`, for one that cannot be a
    /// destination).
    pub destinations: std::collections::BTreeMap<String, String>,
}

#[utoipa::path(get, summary = "The retry policies", path = "/v1/retries", tag = "retries",
    description = "Every policy in force: which queues it covers, its backoff (`initial_ms`, `multiplier`, \
        `max_delay_ms`, `jitter`), `max_attempts`, `give_up_after_ms`, `park_to`, where it comes from \
        (`configuration` or `api`) and who changed it last; and the exchange a covered queue dead-letters to. \
        Needs `admin`.",
    responses((status = 200, description = "the policies (none: an empty list)", body = RetriesView)))]
pub async fn retries(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<RetriesView>, ApiError> {
    require(&caller, Permission::Admin)?;
    Ok(Json(view(state.retries.as_deref(), &state)))
}

/// What `GET /v1/retries` shows of `book` (none without the release stage).
pub(super) fn view(book: Option<&RetryBook>, state: &AppState) -> RetriesView {
    let set = book.map(RetryBook::current).unwrap_or_default();
    let max_bytes = state.scheduler.cascade().max_destination_bytes();
    let queues = set.in_force().iter().flat_map(|f| &f.policy.queues);
    let destinations = queues
        .map(|queue| {
            let destination = crate::ingress::retry_destination(queue, max_bytes);
            (queue.clone(), destination)
        })
        .collect();
    let retries = book.map(RetryBook::retries);
    RetriesView {
        destinations,
        policies: set.in_force().iter().map(PolicyView::from).collect(),
        set_aside: set.set_aside().to_vec(),
        settable: book.is_some_and(RetryBook::settable),
        refresh_ms: u64::try_from(REFRESH_EVERY.as_millis()).unwrap_or(u64::MAX),
        exchange: retries.map(|r| r.exchange.clone()),
        queue: retries.map(|r| r.queue.clone()),
        refused_queue: retries.map(|r| r.refused_queue.clone()),
        attempt_header: crate::message::ATTEMPT_HEADER,
    }
}

/// The book, or why policies cannot be set here.
fn book(state: &AppState) -> Result<&RetryBook, ApiError> {
    match (state.retries.as_deref(), state.scheduler.own_ledger()) {
        (Some(book), _) if book.settable() => Ok(book),
        (_, None) => Err(PolicyError::LedgerDisabled.into()),
        (_, Some(_)) => Err(ApiError::new(
            ErrorCode::ReleaseStageDisabled,
            "retry policies need the release stage (cascade.release_stage is false)",
        )),
    }
}

/// `body`, a `[[retry]]` section as JSON, named `name` (by the path; a
/// `name` in the body must be the same).
pub(super) fn parse_policy(name: &str, body: &[u8]) -> Result<RetrySettings, ApiError> {
    require_object(body, "", "a retry policy: {\"queues\": [...], …}")?;
    let mut settings: RetrySettings = deserialize_whole(body)
        .map_err(|e| ApiError::from(TaskError::from_shape(&e, "", "a retry policy")))?;
    if !settings.name.is_empty() && settings.name != name {
        return Err(ApiError::new(
            ErrorCode::InvalidRetryPolicy,
            format!(
                "/name: {:?} is not the path's {name:?} (leave it out)",
                settings.name
            ),
        ));
    }
    settings.name = name.to_owned();
    Ok(settings)
}

#[utoipa::path(put, summary = "Set a retry policy", path = "/v1/retries/policies/{name}", tag = "retries",
    description = "Creates or changes a policy, kept in the ledger: in force on this replica at once, on every \
        replica sharing the ledger within `refresh_ms`, for the messages taken in after it (a retry already \
        scheduled keeps its wait). The body is a `[[retry]]` section as JSON (durations as text: `\"1s\"`). \
        A queue another policy covers is refused (`409 retry_queue_taken`), as is a policy of the \
        configuration file (`409 retry_policy_configured`). Needs `admin`.",
    params(("name" = String, Path, description = "1 to 128 bytes of A-Z, a-z, 0-9, '_', '-', '.'")),
    request_body = RetrySettings,
    responses(
        (status = 201, description = "created", body = PolicyView),
        (status = 200, description = "changed, or unchanged", body = PolicyView),
    ))]
pub async fn put_policy(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    require(&caller, Permission::Admin)?;
    let now_ms = crate::clock::now_ms();
    let book = book(&state)?;
    let settings = parse_policy(&name, &body)?;
    let (in_force, created) = book.put(settings, caller.client_name(), now_ms).await?;
    let code = match created {
        true => StatusCode::CREATED,
        false => StatusCode::OK,
    };
    Ok((code, Json(PolicyView::from(&in_force))).into_response())
}

#[utoipa::path(get, summary = "A retry policy", path = "/v1/retries/policies/{name}", tag = "retries",
    params(("name" = String, Path)),
    responses((status = 200, description = "the policy, from the configuration or the API", body = PolicyView),
        (status = 404, description = "`retry_policy_not_found`")))]
pub async fn get_policy(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<PolicyView>, ApiError> {
    require(&caller, Permission::Admin)?;
    let set = state
        .retries
        .as_deref()
        .map(RetryBook::current)
        .unwrap_or_default();
    match set.named(&name) {
        Some(in_force) => Ok(Json(in_force.into())),
        None => Err(PolicyError::NotFound(name).into()),
    }
}

#[utoipa::path(delete, summary = "Remove a retry policy", path = "/v1/retries/policies/{name}", tag = "retries",
    description = "Removes a policy set at run time. Its queues' dead letters are refused (to the retry refused \
        queue, with why) until another policy covers them; retries already scheduled still come back. Needs \
        `admin`.",
    params(("name" = String, Path)),
    responses((status = 204, description = "removed"),
        (status = 404, description = "`retry_policy_not_found`")))]
pub async fn delete_policy(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    require(&caller, Permission::Admin)?;
    let now_ms = crate::clock::now_ms();
    book(&state)?
        .remove(&name, caller.client_name(), now_ms)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// One change made at run time.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PolicyChangeView {
    pub policy: String,
    /// `created`, `changed` or `removed`.
    pub change: String,
    /// The policy as it became, as it was given; absent when removed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(value_type = Option<Object>)]
    pub settings: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub changed_by: Option<String>,
    pub at: String,
}

impl From<RetryPolicyChange> for PolicyChangeView {
    fn from(change: RetryPolicyChange) -> Self {
        let settings = change
            .settings
            .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)));
        PolicyChangeView {
            policy: change.policy,
            change: change.change,
            settings,
            changed_by: change.changed_by,
            at: format_epoch_ms(change.at_ms),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PolicyChanges {
    /// Newest first.
    pub changes: Vec<PolicyChangeView>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ChangesQuery {
    /// At most this many (1 to 500, 50 by default).
    limit: Option<u32>,
}

#[utoipa::path(get, summary = "Who changed which retry policy, and when", path = "/v1/retries/changes",
    tag = "retries", params(ChangesQuery),
    responses((status = 200, description = "the changes made at run time, newest first", body = PolicyChanges)))]
pub async fn changes(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<ChangesQuery>, QueryRejection>,
) -> Result<Json<PolicyChanges>, ApiError> {
    require(&caller, Permission::Admin)?;
    let Query(query) = query.map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e.body_text()))?;
    let limit = query.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::new(ErrorCode::InvalidQuery, "limit: 1 to 500"));
    }
    let changes = book(&state)?.changes(limit).await?;
    Ok(Json(PolicyChanges {
        changes: changes.into_iter().map(Into::into).collect(),
    }))
}

pub fn router() -> axum::Router<AppState> {
    use axum::routing::get;
    axum::Router::new()
        .route("/v1/retries", get(retries))
        .route("/v1/retries/changes", get(changes))
        .route(
            "/v1/retries/policies/{name}",
            get(get_policy).put(put_policy).delete(delete_policy),
        )
}
