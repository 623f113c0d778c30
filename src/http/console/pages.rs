//! The console's pages and forms: each reads or changes through the
//! scheduler with the signed-in client's permissions, and answers server-
//! rendered HTML.

use std::time::Instant;

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::Markup;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::super::error::ApiError;
use super::super::state::AppState;
use crate::auth::{Caller, Permission};
use crate::clock::parse_epoch_ms;
use crate::scheduler::{Cursor, TaskFilter};
use crate::task::TaskState;

const COOKIE: &str = "delayline_console";
const PAGE: u32 = 50;

/// Who is signed in, and the token their forms must carry.
pub(super) struct Session {
    pub(super) caller: Caller,
    signed_in: bool,
    pub(super) csrf: String,
}

impl Session {
    /// The form token pages carry (in the sign-out form), when signed in.
    pub(super) fn page_token(&self) -> Option<&str> {
        self.signed_in.then_some(self.csrf.as_str())
    }
}

/// Why a console request is turned away.
pub(super) enum Refusal {
    /// No session (or a token no longer known): the sign-in page.
    SignIn,
    /// A form without the session's token, or from another site.
    StaleForm,
    /// What the API would answer: the caller lacks the permission.
    Refused(Box<ApiError>),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::SignIn => Redirect::to("/console/login").into_response(),
            Refusal::Refused(error) => refused(*error),
            Refusal::StaleForm => {
                let page = super::views::refusal(
                    "Forbidden",
                    "stale_form",
                    "the form is stale or from another site",
                );
                (StatusCode::FORBIDDEN, html(page)).into_response()
            }
        }
    }
}

/// The session id the cookie carries.
fn cookie_session(headers: &HeaderMap) -> Option<String> {
    let cookies = headers.get(header::COOKIE)?.to_str().ok()?;
    cookies.split(';').find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        (name == COOKIE && !value.is_empty()).then(|| value.to_owned())
    })
}

/// The session of a request, or the sign-in page. Its token is
/// authenticated again: one no longer known ends the session.
fn session(state: &AppState, headers: &HeaderMap) -> Result<Session, Refusal> {
    let id = cookie_session(headers);
    let token = id
        .as_deref()
        .and_then(|id| state.console_sessions.token(id, Instant::now()));
    let Ok(caller) = state.auth.authenticate(token.as_deref()) else {
        if let (Some(id), Some(_)) = (&id, &token) {
            state.console_sessions.close(id);
        }
        return Err(Refusal::SignIn);
    };
    let mut hash = Sha256::new();
    hash.update(state.console_secret);
    hash.update(id.as_deref().unwrap_or("").as_bytes());
    Ok(Session {
        signed_in: token.is_some(),
        caller,
        csrf: format!("{:x}", hash.finalize()),
    })
}

/// A change's form: from this site, with the session's token.
fn check_form(session: &Session, headers: &HeaderMap, csrf: &str) -> Result<(), Refusal> {
    let cross_site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|site| site == "cross-site");
    let matches = bool::from(session.csrf.as_bytes().ct_eq(csrf.as_bytes()));
    if cross_site || !matches {
        return Err(Refusal::StaleForm);
    }
    Ok(())
}

/// The session of a page that needs `permission`: the sign-in page
/// without one, the API's `403 forbidden` answer without the permission.
pub(super) fn page_session(
    state: &AppState,
    headers: &HeaderMap,
    permission: Permission,
) -> Result<Session, Refusal> {
    let session = session(state, headers)?;
    super::super::auth::require(&session.caller, permission)
        .map_err(|error| Refusal::Refused(Box::new(error)))?;
    Ok(session)
}

/// The session of a form that changes something: from this site, with its
/// token, and a caller with `permission`.
pub(super) fn form_session(
    state: &AppState,
    headers: &HeaderMap,
    csrf: &str,
    permission: Permission,
) -> Result<Session, Refusal> {
    let session = session(state, headers)?;
    check_form(&session, headers, csrf)?;
    super::super::auth::require(&session.caller, permission)
        .map_err(|error| Refusal::Refused(Box::new(error)))?;
    Ok(session)
}

pub(super) fn html(markup: Markup) -> Response {
    (
        [(header::CACHE_CONTROL, "no-store")],
        axum::response::Html(markup.into_string()),
    )
        .into_response()
}

/// The API's refusal as a page: its status, code and message.
pub(super) fn refused(error: ApiError) -> Response {
    let body = error.body();
    let title = error.status.canonical_reason().unwrap_or("Refused");
    let page = super::views::refusal(title, &body.code, &body.message);
    (error.status, html(page)).into_response()
}

async fn login_page() -> Response {
    html(super::views::login(None))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(state): State<AppState>, Form(form): Form<LoginForm>) -> Response {
    if state.auth.authenticate(Some(&form.token)).is_err() {
        let page = super::views::login(Some("That token is not known."));
        return (StatusCode::UNAUTHORIZED, html(page)).into_response();
    }
    let id = state.console_sessions.open(&form.token, Instant::now());
    // Over HTTPS, never sent over plain HTTP.
    let secure = if state.https { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={}{secure}",
        super::sessions::LIFETIME.as_secs()
    );
    ([(header::SET_COOKIE, cookie)], Redirect::to("/console")).into_response()
}

async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<ChangeForm>,
) -> Response {
    if let Ok(session) = session(&state, &headers)
        && let Err(refusal) = check_form(&session, &headers, &form.csrf)
    {
        return refusal.into_response();
    }
    if let Some(id) = cookie_session(&headers) {
        state.console_sessions.close(&id);
    }
    let cookie = format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0");
    (
        [(header::SET_COOKIE, cookie)],
        Redirect::to("/console/login"),
    )
        .into_response()
}

/// What `/readyz` would answer, and the broker's and the ledger's state
/// behind it. Where the ledger lives is an administrator's to see; other
/// clients see its kind.
async fn readiness(state: &AppState, caller: &Caller) -> super::views::Readiness {
    let ledger = match state.scheduler.own_ledger() {
        None => "none (stateless)".to_owned(),
        Some(ledger) if caller.may(Permission::Admin) => ledger.target().to_owned(),
        Some(ledger) => ledger.target().split(':').next().unwrap_or("").to_owned(),
    };
    match state.scheduler.readiness().await {
        Ok(ready) => super::views::Readiness {
            verdict: Ok(ready.status),
            rows: vec![
                ("broker", ready.broker),
                ("node", ready.node.unwrap_or("-".to_owned())),
                ("alarm", ready.blocked.unwrap_or("none".to_owned())),
                (
                    "last broker error",
                    ready.broker_error.unwrap_or("-".to_owned()),
                ),
                ("ledger", ledger),
                (
                    "pending in the ledger",
                    ready.pending.unwrap_or(0).to_string(),
                ),
            ],
        },
        Err(why) => super::views::Readiness {
            verdict: Err(why.to_string()),
            rows: vec![("ledger", ledger)],
        },
    }
}

/// Messages held per level, every shard's together, as the metrics last
/// read them from the broker.
fn levels(state: &AppState) -> Vec<(u32, u64)> {
    let cascade = state.scheduler.cascade();
    (0..cascade.levels())
        .rev()
        .map(|level| {
            let messages = cascade
                .every_shard()
                .map(|shard| {
                    state
                        .metrics
                        .level_queue_messages(level, &shard.level_queue(level))
                })
                .sum();
            (level, messages)
        })
        .collect()
}

/// The levels this replica found stranded and drains, in every shard, each
/// with its queue and the messages it sent on, as the metrics say.
fn stranded_levels(state: &AppState) -> Vec<(u32, String, u64)> {
    let cascade = state.scheduler.cascade();
    let levels = cascade
        .every_shard()
        .flat_map(|shard| (0..shard.levels()).map(move |level| (level, shard.level_queue(level))));
    levels
        .filter_map(|(level, queue)| {
            let drained = state.metrics.stranded_level_drained(level, &queue)?;
            Some((level, queue, drained))
        })
        .collect()
}

/// How many of the chain's queues each node leads, as the management API
/// last said: shards spread them over a cluster.
fn leaders_per_node(state: &AppState) -> Option<String> {
    let leaders = state.metrics.leaders.lock().ok()?;
    let mut per_node = std::collections::BTreeMap::<&str, usize>::new();
    for node in leaders.values() {
        *per_node.entry(node.as_str()).or_default() += 1;
    }
    (!per_node.is_empty()).then(|| {
        let counts: Vec<String> = per_node
            .iter()
            .map(|(node, n)| format!("{node}: {n}"))
            .collect();
        counts.join(", ")
    })
}

async fn overview(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let session = match session(&state, &headers) {
        Ok(session) => session,
        Err(login) => return login.into_response(),
    };
    state.scheduler.refresh_metrics().await;
    let cascade = state.scheduler.cascade();
    let chain = vec![
        ("levels", cascade.levels().to_string()),
        ("unit", format!("{} ms", cascade.unit_ms())),
        ("queue type", cascade.queue_type().as_str().to_owned()),
        ("version", cascade.version().to_string()),
        ("release stage", cascade.release_stage().to_string()),
        ("shards", cascade.shards().to_string()),
        (
            "queue leaders",
            leaders_per_node(&state).unwrap_or_else(|| "unknown (no management API)".to_owned()),
        ),
    ];
    let ready = readiness(&state, &session.caller).await;
    let metrics = &state.metrics;
    let counts = vec![
        (
            "release queue backlog",
            metrics.release_queue_messages.get().to_string(),
        ),
        (
            "unroutable queue",
            metrics.unroutable_messages.get().to_string(),
        ),
        (
            "delivered (this replica)",
            metrics.tasks_delivered.get().to_string(),
        ),
        (
            "failed (this replica)",
            metrics.tasks_failed.get().to_string(),
        ),
    ];
    let data = super::views::Overview {
        chain,
        ready,
        levels: levels(&state),
        counts,
        recent: state.metrics.recent_lateness(crate::clock::now_ms()),
        due: due_charts(&state, &session.caller, crate::clock::now_ms()).await,
    };
    html(super::views::overview(&data, session.page_token()))
}

/// The next hour in minutes and the next day in hours, as `GET
/// /v1/forecast` would count them for `caller`; none without a ledger or
/// the `read` permission, or when the ledger does not answer.
async fn due_charts(state: &AppState, caller: &Caller, now_ms: u64) -> Vec<super::views::DueChart> {
    use crate::forecast::{MINUTE_MS, Window};
    if !caller.may(Permission::Read) || !state.scheduler.has_ledger() {
        return Vec::new();
    }
    let from_ms = now_ms - now_ms % MINUTE_MS;
    let windows = [
        ("Next hour, by minute", MINUTE_MS, 60),
        ("Next day, by hour", 60 * MINUTE_MS, 24),
    ];
    let mut charts = Vec::new();
    for (title, bucket_ms, buckets) in windows {
        let window = Window {
            from_ms,
            to_ms: from_ms + bucket_ms * buckets,
            bucket_ms,
        };
        let Ok(tally) = state
            .scheduler
            .forecast(&window, |d| caller.sees_destination(d))
            .await
        else {
            return Vec::new();
        };
        charts.push(super::views::DueChart {
            title,
            buckets: window
                .starts()
                .map(crate::clock::format_epoch_ms)
                .zip(tally.buckets)
                .collect(),
            total: tally.total,
        });
    }
    charts
}

async fn levels_json(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(login) = session(&state, &headers) {
        return login.into_response();
    }
    let levels: Vec<serde_json::Value> = levels(&state)
        .into_iter()
        .map(|(level, messages)| serde_json::json!({"level": level, "messages": messages}))
        .collect();
    axum::Json(levels).into_response()
}

#[derive(Deserialize, Default)]
struct TasksQuery {
    id: Option<String>,
    #[serde(default)]
    destination: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    due_before: String,
    cursor: Option<String>,
}

async fn tasks(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<TasksQuery>,
) -> Response {
    let session = match page_session(&state, &headers, Permission::Read) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    if let Some(id) = query.id.as_deref().filter(|id| !id.is_empty()) {
        return Redirect::to(&format!("/console/tasks/{}", super::views::urlencode(id)))
            .into_response();
    }
    let filter = TaskFilter {
        client: session.caller.owner_scope().map(str::to_owned),
        destination: Some(query.destination.clone()).filter(|d| !d.is_empty()),
        state: TaskState::parse(&query.state),
        due_before_ms: parse_epoch_ms(&query.due_before),
        after: query.cursor.as_deref().and_then(|c| Cursor::decode(c).ok()),
        limit: PAGE,
    };
    let found = match state.scheduler.tasks(&filter, crate::clock::now_ms()).await {
        Ok(found) => found,
        Err(error) => return refused(error.into()),
    };
    let next = Cursor::after_page(&found, PAGE);
    let bulk_cancel = bulk_cancel_offer(&state, &session, &query).await;
    let form = super::views::TaskQuery {
        destination: query.destination,
        state: query.state,
        due_before: query.due_before,
        bulk_cancel,
    };
    html(super::views::tasks(
        &form,
        &found,
        next,
        session.page_token(),
    ))
}

/// The bulk cancel's offer counts the tasks it would change up to this
/// many and says "over" beyond: counting a destination of millions on
/// every page view would outlast the request's deadline.
const OFFER_COUNTS_UP_TO: u64 = 10_000;

/// With one destination in the filter, to a caller who may cancel: how many
/// tasks a bulk cancel would change (none when it cannot be counted).
async fn bulk_cancel_offer(
    state: &AppState,
    session: &Session,
    query: &TasksQuery,
) -> Option<super::views::CancelOffer> {
    if query.destination.is_empty() || !session.caller.may(Permission::Cancel) {
        return None;
    }
    let count = state
        .scheduler
        .count_changeable(
            &query.destination,
            (
                parse_epoch_ms(&query.due_before).unwrap_or(u64::MAX),
                OFFER_COUNTS_UP_TO + 1,
            ),
            TaskState::parse(&query.state),
            session.caller.owner_scope(),
        )
        .await
        .ok()?;
    Some(super::views::CancelOffer {
        count: count.min(OFFER_COUNTS_UP_TO),
        more: count > OFFER_COUNTS_UP_TO,
        csrf: session.csrf.clone(),
    })
}

#[derive(Deserialize)]
struct BulkCancelForm {
    csrf: String,
    destination: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    due_before: String,
}

/// The task filter's bulk cancel, as `POST /v1/tasks/bulk` would start it;
/// then the operation's page.
async fn bulk_cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<BulkCancelForm>,
) -> Response {
    let session = match form_session(&state, &headers, &form.csrf, Permission::Cancel) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let request = crate::bulk::BulkRequest {
        filter: crate::bulk::BulkFilter {
            destination: form.destination,
            due_after: None,
            due_before: Some(form.due_before).filter(|t| !t.is_empty()),
            state: TaskState::parse(&form.state),
        },
        action: "cancel".to_owned(),
        ..crate::bulk::BulkRequest::default()
    };
    match super::super::bulk::start(&state, &session.caller, &request, None).await {
        Ok((operation, _)) => Redirect::to(&format!(
            "/console/operations/{}",
            super::views::urlencode(&operation.id)
        ))
        .into_response(),
        Err(error) => refused(error),
    }
}

async fn operation_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let session = match page_session(&state, &headers, Permission::Read) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let found = match state
        .scheduler
        .operation(&id, session.caller.owner_scope())
        .await
    {
        Ok(found) => crate::http::bulk::OperationView::from(found),
        Err(error) => return refused(error.into()),
    };
    let rows = [
        ("operation", found.id.clone()),
        ("state", found.state.clone()),
        ("matched", found.matched.to_string()),
        ("changed", found.changed.to_string()),
        ("too late", found.too_late.to_string()),
        ("unchanged", found.unchanged.to_string()),
        ("started", found.created_at.clone()),
    ];
    html(super::views::operation(
        &rows,
        !found.done,
        session.page_token(),
    ))
}

#[derive(Deserialize, Default)]
pub(super) struct Notice {
    done: Option<String>,
    error: Option<String>,
}

impl Notice {
    /// (succeeded, text) of what the last action answered.
    pub(super) fn into_notice(self) -> Option<(bool, String)> {
        match (self.done, self.error) {
            (_, Some(error)) => Some((false, error)),
            (Some(done), None) => Some((true, done)),
            _ => None,
        }
    }
}

/// `error=` with what the API would have answered.
pub(super) fn error_query(error: &ApiError) -> String {
    let body = error.body();
    format!(
        "error={}",
        super::views::urlencode(&format!("{}: {}", body.code, body.message))
    )
}

/// The levels a task's routing key makes it wait in, top first, with how
/// long each holds it.
fn waits(routing_key: &str, levels: u32, unit_ms: u64) -> Vec<(u32, u64)> {
    routing_key
        .split('.')
        .take(levels as usize)
        .enumerate()
        .filter(|(_, digit)| *digit == "1")
        .map(|(i, _)| {
            let level = levels - 1 - i as u32;
            (level, (1u64 << level) * unit_ms)
        })
        .collect()
}

async fn task_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(notice): Query<Notice>,
) -> Response {
    let session = match page_session(&state, &headers, Permission::Read) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let found = match state.scheduler.task(&id).await {
        Ok(found) => found.filter(|t| t.within_scope(session.caller.owner_scope())),
        Err(error) => return refused(error.into()),
    };
    let Some(task) = found else {
        let page = super::views::refusal(
            "Not Found",
            crate::http::codes::ErrorCode::TaskNotFound.as_str(),
            &format!("no task {id:?}"),
        );
        return (StatusCode::NOT_FOUND, html(page)).into_response();
    };
    let cascade = state.scheduler.cascade();
    let view = super::views::TaskPage {
        levels: waits(&task.routing_key, cascade.levels(), cascade.unit_ms()),
        release_stage: cascade.release_stage(),
        task: &task,
        may_cancel: session.caller.may(Permission::Cancel),
        may_reschedule: session.caller.may(Permission::Reschedule),
        may_replay: session.caller.may(Permission::Submit),
        csrf: &session.csrf,
        notice: notice.into_notice(),
    };
    html(super::views::task(&view, session.page_token()))
}

#[derive(Deserialize)]
struct ChangeForm {
    csrf: String,
    delay: Option<String>,
}

/// Back to the task's page, saying what the API would have answered.
fn back_to(id: &str, outcome: Result<String, ApiError>) -> Response {
    let query = match outcome {
        Ok(done) => format!("done={}", super::views::urlencode(&done)),
        Err(error) => error_query(&error),
    };
    Redirect::to(&format!(
        "/console/tasks/{}?{query}",
        super::views::urlencode(id)
    ))
    .into_response()
}

async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<ChangeForm>,
) -> Response {
    let session = match form_session(&state, &headers, &form.csrf, Permission::Cancel) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let outcome =
        super::super::changes::cancel_one(&state, &id, session.caller.owner_scope()).await;
    back_to(
        &id,
        outcome.map(|task| format!("cancelled ({})", task.state.as_str())),
    )
}

async fn reschedule(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<ChangeForm>,
) -> Response {
    let session = match form_session(&state, &headers, &form.csrf, Permission::Reschedule) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let delay = form.delay.unwrap_or_default();
    let body = serde_json::json!({ "delay": delay }).to_string();
    let now = crate::clock::read();
    let start_ms = state.scheduler.cascade().delay_start_ms(now.wall);
    let outcome = match crate::task::parse_new_delay(body.as_bytes(), start_ms) {
        Ok(new) => super::super::changes::move_one(
            &state,
            &id,
            new.delay,
            session.caller.owner_scope(),
            &now,
        )
        .await
        .map(|task| {
            format!(
                "moved: due {}",
                crate::clock::format_epoch_ms(task.deliver_at_ms)
            )
        }),
        Err(error) => Err(error.into()),
    };
    back_to(&id, outcome)
}

/// An expired task's replay: the API's `POST /v1/tasks/{id}/replay`; the
/// page shown is the new task's.
async fn replay(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<ChangeForm>,
) -> Response {
    let session = match form_session(&state, &headers, &form.csrf, Permission::Submit) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let now = crate::clock::read();
    let outcome = super::super::expired::replay_expired(&state, &session.caller, &id, &now).await;
    match outcome {
        Ok(submitted) => back_to(
            &submitted.accepted.id,
            Ok(format!("replayed {id} as this task, due now")),
        ),
        Err(error) => back_to(&id, Err(error)),
    }
}

async fn schedules(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let session = match page_session(&state, &headers, Permission::Schedule) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let found = match state
        .scheduler
        .schedules(session.caller.owner_scope(), None, 100)
        .await
    {
        Ok(found) => found,
        Err(error) => return refused(error.into()),
    };
    let now_ms = crate::clock::now_ms();
    let states: Vec<_> = found
        .into_iter()
        .map(|s| state.scheduler.schedule_state(s, 3, now_ms))
        .collect();
    html(super::views::schedules(
        &states,
        &session.csrf,
        session.page_token(),
    ))
}

async fn pause(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    Form(form): Form<ChangeForm>,
) -> Response {
    let session = match form_session(&state, &headers, &form.csrf, Permission::Schedule) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let paused = action == "pause";
    let owner = session.caller.owner_scope();
    match state.scheduler.pause_schedule(&id, paused, owner).await {
        Ok(_) => Redirect::to("/console/schedules").into_response(),
        Err(error) => refused(error.into()),
    }
}

async fn limits(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let session = match page_session(&state, &headers, Permission::Limits) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let now_ms = crate::clock::now_ms();
    let found: Vec<_> = match state.scheduler.limits(now_ms).await {
        Ok(found) => found
            .into_iter()
            .filter(|status| session.caller.may_limit(&status.stored.limit.destinations))
            .collect(),
        Err(error) => return refused(error.into()),
    };
    html(super::views::limits(
        &found,
        &session.csrf,
        session.page_token(),
    ))
}

/// Pauses or resumes a limit the caller may see, then back to the page.
async fn pause_limit(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    Form(form): Form<ChangeForm>,
) -> Response {
    let session = match form_session(&state, &headers, &form.csrf, Permission::Limits) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let paused = match action.as_str() {
        "pause" => true,
        "resume" => false,
        _ => return refused(crate::scheduler::LimitsError::NotFound(name).into()),
    };
    let now_ms = crate::clock::now_ms();
    let visible = match state.scheduler.limit_status(&name, now_ms).await {
        Ok(status) => session.caller.may_limit(&status.stored.limit.destinations),
        Err(error) => return refused(error.into()),
    };
    if !visible {
        return refused(crate::scheduler::LimitsError::NotFound(name).into());
    }
    match state.scheduler.pause_limit(&name, paused, now_ms).await {
        Ok(_) => Redirect::to("/console/limits").into_response(),
        Err(error) => refused(error.into()),
    }
}

async fn problems(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(notice): Query<Notice>,
) -> Response {
    let session = match page_session(&state, &headers, Permission::Read) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let of_state = |state: TaskState| TaskFilter {
        client: session.caller.owner_scope().map(str::to_owned),
        state: Some(state),
        limit: PAGE,
        ..TaskFilter::default()
    };
    let now_ms = crate::clock::now_ms();
    let failed = state
        .scheduler
        .tasks(&of_state(TaskState::Failed), now_ms)
        .await;
    let unroutable = state
        .scheduler
        .tasks(&of_state(TaskState::Unroutable), now_ms)
        .await;
    let expired = state
        .scheduler
        .tasks(&of_state(TaskState::Expired), now_ms)
        .await;
    let (failed, unroutable, expired) = match (failed, unroutable, expired) {
        (Ok(failed), Ok(unroutable), Ok(expired)) => (failed, unroutable, expired),
        (Err(error), _, _) | (_, Err(error), _) | (_, _, Err(error)) => {
            return refused(error.into());
        }
    };
    let unroutable_messages = state.metrics.unroutable_messages.get().to_string();
    let view = super::views::Problems {
        failed: &failed,
        unroutable: &unroutable,
        expired: &expired,
        unroutable_messages,
        stranded: stranded_levels(&state),
        may_requeue: session.caller.may(Permission::Admin),
        csrf: &session.csrf,
        notice: notice.into_notice(),
    };
    html(super::views::problems(&view, session.page_token()))
}

/// The Problems page's requeue: the API's `POST /v1/unroutable/requeue`.
async fn requeue(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<ChangeForm>,
) -> Response {
    let session = match form_session(&state, &headers, &form.csrf, Permission::Admin) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let query = match super::super::unroutable::requeue_unroutable(&state, &session.caller).await {
        Ok(done) => format!(
            "done={}",
            super::views::urlencode(&format!(
                "requeued {} messages; {} still unroutable",
                done.republished, done.still_unroutable
            ))
        ),
        Err(error) => error_query(&error),
    };
    Redirect::to(&format!("/console/problems?{query}")).into_response()
}

/// The console's pages but the Parked page (`super::parked`).
pub(super) fn routes() -> axum::Router<AppState> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/console", get(overview))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .route("/console/levels", get(levels_json))
        .route("/console/tasks", get(tasks))
        .route("/console/tasks/bulk-cancel", post(bulk_cancel))
        .route("/console/operations/{id}", get(operation_page))
        .route("/console/tasks/{id}", get(task_page))
        .route("/console/tasks/{id}/cancel", post(cancel))
        .route("/console/tasks/{id}/reschedule", post(reschedule))
        .route("/console/tasks/{id}/replay", post(replay))
        .route("/console/schedules", get(schedules))
        .route("/console/schedules/{id}/{action}", post(pause))
        .route("/console/limits", get(limits))
        .route("/console/limits/{name}/{action}", post(pause_limit))
        .route("/console/problems", get(problems))
        .route("/console/problems/requeue", post(requeue))
}
