//! The console's Parked page: what the retry policies gave up on, per queue
//! with counts and the newest first, replayed or discarded one at a time or
//! a queue's all at once, through the API's own handlers (`admin`, as
//! there).

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::pages::{Notice, error_query, form_session, html, page_session, refused};
use super::views::{notice, page, urlencode};
use crate::auth::Permission;
use crate::clock::format_epoch_ms;
use crate::http::error::ApiError;
use crate::http::retries::{act_on_filter, act_on_one, parked_filter, replay_after_ms};
use crate::http::state::AppState;
use crate::ingress::{ParkedAction, Unparked};
use crate::scheduler::{ParkedFilter, ParkedGroup, ParkedMessage, ParkedQueue};

/// Messages shown per page.
const SHOWN: u32 = 50;

#[derive(Deserialize)]
struct ParkedPageQuery {
    queue: Option<String>,
    #[serde(flatten)]
    notice: Notice,
}

async fn parked_page(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Query(query): Query<ParkedPageQuery>,
) -> Response {
    let session = match page_session(&state, &headers, Permission::Admin) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let Some(ledger) = state.scheduler.own_ledger() else {
        return refused(ApiError::new(
            crate::http::codes::ErrorCode::LedgerDisabled,
            "this service has no ledger: nothing is parked",
        ));
    };
    let filter = ParkedFilter {
        queue: query.queue.clone(),
        ..ParkedFilter::default()
    };
    let found = tokio::try_join!(
        ledger.parked_per_queue(),
        ledger.parked_groups(),
        ledger.parked(&filter, None, SHOWN)
    );
    let (queues, groups, messages) = match found {
        Ok(found) => found,
        Err(error) => return refused(error.into()),
    };
    let view = ParkedView {
        queues: &queues,
        groups: &groups,
        messages: &messages,
        selected: query.queue.as_deref(),
        csrf: &session.csrf,
        notice: query.notice.into_notice(),
    };
    html(page("Parked", session.page_token(), view.markup()))
}

struct ParkedView<'a> {
    queues: &'a [ParkedQueue],
    groups: &'a [ParkedGroup],
    messages: &'a [ParkedMessage],
    selected: Option<&'a str>,
    csrf: &'a str,
    notice: Option<(bool, String)>,
}

impl ParkedView<'_> {
    fn markup(&self) -> Markup {
        html! {
            (notice(&self.notice))
            p { "Messages a retry policy gave up on after their last attempt. A replay sends one "
                "back to the queue it failed in, now, on its first attempt again (release limits "
                "hold it, and pace a group's); a discard deletes it (the guide's Retries page "
                "says more)." }
            @if self.queues.is_empty() { p { "Nothing is parked." } } @else { table {
                thead { tr { th { "queue" } th { "parked" } th { "newest" } th { "all of the queue's" } } }
                tbody { @for queue in self.queues {
                    tr {
                        td { a href=(format!("/console/parked?queue={}", urlencode(&queue.queue))) { (queue.queue) } }
                        td { (queue.parked) }
                        td { (format_epoch_ms(queue.newest_at_ms)) }
                        td { (self.bulk_form(&queue.queue, "replay", "Replay all"))
                             (self.bulk_form(&queue.queue, "discard", "Discard all")) }
                    }
                } }
            } }
            (self.groups_markup())
            h2 { @if let Some(queue) = self.selected { "Newest of " code { (queue) } } @else { "Newest" } }
            @if self.messages.is_empty() { p { "None." } } @else { table {
                thead { tr { th { "parked" } th { "queue" } th { "reason" } th { "attempts" }
                             th { "message id" } th { "body" } th { "" } } }
                tbody { @for message in self.messages { (self.row(message)) } }
            } }
        }
    }

    /// The groups (queue, reason, hour the failure began), each replayed
    /// or discarded at once: how a failure is cleared once its cause is.
    fn groups_markup(&self) -> Markup {
        html! {
            @if !self.groups.is_empty() {
                h2 { "By queue, reason and the hour the failure began" }
                table {
                    thead { tr { th { "queue" } th { "reason" } th { "first failed" } th { "parked" }
                                 th { "newest" } th { "the group's" } } }
                    tbody { @for group in self.groups {
                        tr {
                            td { (group.queue) }
                            td { (group.reason) }
                            td { (format_epoch_ms(group.first_failed_hour_ms)) }
                            td { (group.parked) }
                            td { (format_epoch_ms(group.newest_parked_at_ms)) }
                            td { (self.group_form(group, "replay", "Replay group"))
                                 (self.group_form(group, "discard", "Discard group")) }
                        }
                    } }
                }
            }
        }
    }

    fn group_form(&self, group: &ParkedGroup, action: &str, label: &str) -> Markup {
        let hour = format_epoch_ms(group.first_failed_hour_ms);
        let confirm = format!(
            "{label}: {} parked messages of {} ({}, first failed in the hour of {hour})?",
            group.parked, group.queue, group.reason
        );
        html! {
            form.inline method="post" action="/console/parked/bulk" data-confirm=(confirm) {
                input type="hidden" name="csrf" value=(self.csrf);
                input type="hidden" name="queue" value=(group.queue);
                input type="hidden" name="reason" value=(group.reason);
                input type="hidden" name="first_failed_hour" value=(hour);
                input type="hidden" name="action" value=(action);
                button type="submit" { (label) }
            }
        }
    }

    fn row(&self, message: &ParkedMessage) -> Markup {
        let body = String::from_utf8_lossy(&message.payload);
        let shown: String = body.chars().take(80).collect();
        html! {
            tr {
                td { (format_epoch_ms(message.parked_at_ms)) }
                td { (message.queue) }
                td { (message.reason) }
                td { (message.attempts) }
                td { (message.message_id.clone().unwrap_or_default()) }
                td { code { (shown) } }
                td { (self.one_form(&message.id, "replay", "Replay"))
                     (self.one_form(&message.id, "discard", "Discard"))
                     (self.later_form(&message.id)) }
            }
        }
    }

    fn one_form(&self, id: &str, action: &str, label: &str) -> Markup {
        html! {
            form.inline method="post" action=(format!("/console/parked/{}/{action}", urlencode(id))) {
                input type="hidden" name="csrf" value=(self.csrf);
                button type="submit" { (label) }
            }
        }
    }

    /// A replay at a time: back after the delay typed (`10m`), as the
    /// API's replay with a `delay`.
    fn later_form(&self, id: &str) -> Markup {
        html! {
            form.inline method="post" action=(format!("/console/parked/{}/replay", urlencode(id))) {
                input type="hidden" name="csrf" value=(self.csrf);
                input type="text" name="delay" placeholder="10m" size="5" required;
                button type="submit" { "Replay later" }
            }
        }
    }

    fn bulk_form(&self, queue: &str, action: &str, label: &str) -> Markup {
        let confirm = format!("{label} of {queue}'s parked messages?");
        html! {
            form.inline method="post" action="/console/parked/bulk" data-confirm=(confirm) {
                input type="hidden" name="csrf" value=(self.csrf);
                input type="hidden" name="queue" value=(queue);
                input type="hidden" name="action" value=(action);
                button type="submit" { (label) }
            }
        }
    }
}

#[derive(Deserialize)]
struct ParkedForm {
    csrf: String,
    queue: Option<String>,
    /// With `first_failed_hour`: one group of the page's.
    reason: Option<String>,
    /// A replay of one message: after this long (`10m`), not now.
    delay: Option<String>,
    first_failed_hour: Option<String>,
    action: Option<String>,
}

/// Back to the page, saying what was done or what the API would have answered.
fn back(
    queue: Option<&str>,
    outcome: Result<Unparked, ApiError>,
    action: ParkedAction,
) -> Response {
    let verb = action.outcome();
    let said = match outcome {
        Ok(done) => format!(
            "done={}",
            urlencode(&format!(
                "{verb} {} of {} matched",
                done.changed, done.matched
            ))
        ),
        Err(error) => error_query(&error),
    };
    let queue = queue
        .map(|q| format!("queue={}&", urlencode(q)))
        .unwrap_or_default();
    Redirect::to(&format!("/console/parked?{queue}{said}")).into_response()
}

async fn one(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Path((id, action)): Path<(String, String)>,
    Form(form): Form<ParkedForm>,
) -> Response {
    if let Err(refusal) = form_session(&state, &headers, &form.csrf, Permission::Admin) {
        return refusal.into_response();
    }
    let Some(action) = ParkedAction::parse(&action) else {
        return refused(ApiError::new(
            crate::http::codes::ErrorCode::NotFound,
            "no such action",
        ));
    };
    let now = crate::clock::read();
    let action = match (action, form.delay.filter(|d| !d.trim().is_empty())) {
        (ParkedAction::Replay { .. }, Some(delay)) => {
            let body = serde_json::json!({ "delay": delay }).to_string();
            match replay_after_ms(&state, body.as_bytes(), &now) {
                Ok(after_ms) => ParkedAction::Replay { after_ms },
                Err(error) => return back(None, Err(error), action),
            }
        }
        (action, _) => action,
    };
    let outcome = act_on_one(&state, &id, action, &now).await;
    back(None, outcome, action)
}

async fn bulk(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Form(form): Form<ParkedForm>,
) -> Response {
    if let Err(refusal) = form_session(&state, &headers, &form.csrf, Permission::Admin) {
        return refusal.into_response();
    }
    let Some(action) = form.action.as_deref().and_then(ParkedAction::parse) else {
        return refused(ApiError::new(
            crate::http::codes::ErrorCode::InvalidRequest,
            "action: replay or discard",
        ));
    };
    let code = crate::http::codes::ErrorCode::InvalidRequest;
    let filter = parked_filter(
        form.queue.clone(),
        form.reason,
        form.first_failed_hour,
        code,
    );
    let now = crate::clock::read();
    let outcome = match filter {
        Ok(filter) => act_on_filter(&state, filter, action, &now).await,
        Err(error) => Err(error),
    };
    back(form.queue.as_deref(), outcome, action)
}

/// The Parked page's routes, part of the console's one router (and its
/// security headers).
pub(super) fn routes() -> axum::Router<AppState> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/console/parked", get(parked_page))
        .route("/console/parked/bulk", post(bulk))
        .route("/console/parked/{id}/{action}", post(one))
}
