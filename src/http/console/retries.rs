//! The console's Retries page: the policies in force, where each comes
//! from and who changed it last; a form that sets one (new, or changed
//! whole) and a button that removes one set at run time, through the
//! API's own rules (`admin`, as there); and the latest changes.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::pages::{Notice, error_query, form_session, html, page_session, refused};
use super::views::{notice, page, urlencode};
use crate::auth::Permission;
use crate::http::error::ApiError;
use crate::http::retry_policies::{PolicyView, RetriesView, parse_policy, view};
use crate::http::state::AppState;
use crate::ingress::RetryBook;
use crate::ledger::RetryPolicyChange;

/// Changes shown.
const CHANGES_SHOWN: u32 = 20;

async fn retries_page(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Query(notice): Query<Notice>,
) -> Response {
    let session = match page_session(&state, &headers, Permission::Admin) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let book = state.retries.as_deref();
    let changes = match book.filter(|b| b.settable()) {
        Some(book) => match book.changes(CHANGES_SHOWN).await {
            Ok(changes) => changes,
            Err(error) => return refused(error.into()),
        },
        None => Vec::new(),
    };
    let shown = RetriesPage {
        retries: view(book, &state),
        changes: &changes,
        csrf: &session.csrf,
        notice: notice.into_notice(),
    };
    html(page("Retries", session.page_token(), shown.markup()))
}

struct RetriesPage<'a> {
    retries: RetriesView,
    changes: &'a [RetryPolicyChange],
    csrf: &'a str,
    notice: Option<(bool, String)>,
}

impl RetriesPage<'_> {
    fn markup(&self) -> Markup {
        let retries = &self.retries;
        html! {
            (notice(&self.notice))
            p { "What becomes of a message a consumer gives up on in a queue that dead-letters to "
                code { (retries.exchange.clone().unwrap_or_default()) }
                ": back to its queue after the policy's backoff, then parked (the guide's Retries "
                "page says more). A policy set here is in force on every replica within "
                (retries.refresh_ms) " ms, for the messages taken in after it." }
            @if retries.policies.is_empty() { p { "No retry policy." } } @else { table {
                thead { tr { th { "policy" } th { "queues" } th { "backoff" } th { "attempts" }
                             th { "give up after" } th { "park to" } th { "from" } th { "changed" } th { "" } } }
                tbody { @for policy in &retries.policies { (self.row(policy)) } }
            } }
            @for aside in &retries.set_aside {
                p.error { "Not in force here: " code { (aside.name) } ": " (aside.reason) }
            }
            @if retries.settable { (self.set_form()) (self.changes_markup()) }
        }
    }

    fn row(&self, shown: &PolicyView) -> Markup {
        let policy = &shown.policy;
        let backoff = format!(
            "{} ms × {} up to {} ms, +{}%",
            policy.initial_ms,
            policy.multiplier,
            policy.max_delay_ms,
            (policy.jitter * 100.0).round()
        );
        let changed = match (&shown.changed_at, &shown.changed_by) {
            (Some(at), Some(by)) => format!("{at} by {by}"),
            (Some(at), None) => at.clone(),
            _ => String::new(),
        };
        html! {
            tr {
                td { (policy.name) }
                td { (policy.queues.join(", ")) }
                td { (backoff) }
                td { (policy.max_attempts) }
                td { (policy.give_up_after_ms.map(|ms| format!("{ms} ms")).unwrap_or_default()) }
                td { (policy.park_to.clone().unwrap_or_default()) }
                td { (shown.source) }
                td { (changed) }
                td { @if shown.source == "api" { (self.remove_form(&policy.name)) } }
            }
        }
    }

    fn remove_form(&self, name: &str) -> Markup {
        let confirm = format!(
            "Remove retry policy {name}? Its queues' dead letters are refused until another \
             policy covers them."
        );
        html! {
            form.inline method="post" action=(format!("/console/retries/{}/remove", urlencode(name)))
                data-confirm=(confirm) {
                input type="hidden" name="csrf" value=(self.csrf);
                button type="submit" { "Remove" }
            }
        }
    }

    /// Sets a policy whole: a field left empty takes its default.
    fn set_form(&self) -> Markup {
        html! {
            h2 { "Set a policy" }
            p { "New, or changed whole (an empty field takes its default). A policy of the "
                "configuration file is changed there." }
            form method="post" action="/console/retries" {
                input type="hidden" name="csrf" value=(self.csrf);
                label { "name " input type="text" name="name" required size="16"; }
                label { " queues " input type="text" name="queues" required size="30"
                    placeholder="orders, invoices"; }
                label { " initial " input type="text" name="initial" size="5" placeholder="1s"; }
                label { " multiplier " input type="text" name="multiplier" size="3" placeholder="2"; }
                label { " max delay " input type="text" name="max_delay" size="5" placeholder="5m"; }
                label { " jitter " input type="text" name="jitter" size="3" placeholder="0.1"; }
                label { " attempts " input type="text" name="max_attempts" size="3" placeholder="5"; }
                label { " give up after " input type="text" name="give_up_after" size="5" placeholder="1h"; }
                label { " park to " input type="text" name="park_to" size="12"; }
                " " button type="submit" { "Set" }
            }
        }
    }

    fn changes_markup(&self) -> Markup {
        html! {
            h2 { "Latest changes" }
            @if self.changes.is_empty() { p { "None yet." } } @else { table {
                thead { tr { th { "at" } th { "policy" } th { "change" } th { "by" } th { "as it became" } } }
                tbody { @for change in self.changes {
                    tr {
                        td { (crate::clock::format_epoch_ms(change.at_ms)) }
                        td { (change.policy) }
                        td { (change.change) }
                        td { (change.changed_by.clone().unwrap_or_default()) }
                        td { code { (change.settings.clone().unwrap_or_default()) } }
                    }
                } }
            } }
        }
    }
}

/// The set form, as typed.
#[derive(Deserialize)]
struct PolicyForm {
    csrf: String,
    name: String,
    /// Comma-separated.
    queues: String,
    #[serde(default)]
    initial: String,
    #[serde(default)]
    multiplier: String,
    #[serde(default)]
    max_delay: String,
    #[serde(default)]
    jitter: String,
    #[serde(default)]
    max_attempts: String,
    #[serde(default)]
    give_up_after: String,
    #[serde(default)]
    park_to: String,
}

impl PolicyForm {
    /// The form as the API's body: empty fields left out, numbers as
    /// numbers (one that is not stays text, for the API to refuse).
    fn body(&self) -> serde_json::Value {
        let queues: Vec<&str> = self
            .queues
            .split(',')
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .collect();
        let mut body = serde_json::json!({ "queues": queues });
        let texts = [
            ("initial", &self.initial),
            ("max_delay", &self.max_delay),
            ("give_up_after", &self.give_up_after),
            ("park_to", &self.park_to),
        ];
        let numbers = [
            ("multiplier", &self.multiplier),
            ("jitter", &self.jitter),
            ("max_attempts", &self.max_attempts),
        ];
        for (field, value) in texts.into_iter().chain(numbers) {
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            let typed = match numbers.iter().any(|(name, _)| *name == field) {
                true => serde_json::from_str(value).unwrap_or_else(|_| value.into()),
                false => value.into(),
            };
            body[field] = typed;
        }
        body
    }
}

/// Back to the page, saying what was done or what the API would have
/// answered.
fn back(outcome: Result<String, ApiError>) -> Response {
    let said = match outcome {
        Ok(done) => format!("done={}", urlencode(&done)),
        Err(error) => error_query(&error),
    };
    Redirect::to(&format!("/console/retries?{said}")).into_response()
}

fn settable(state: &AppState) -> Result<&RetryBook, ApiError> {
    state
        .retries
        .as_deref()
        .filter(|b| b.settable())
        .ok_or_else(|| {
            ApiError::new(
                crate::http::codes::ErrorCode::LedgerDisabled,
                "retry policies are set at run time only with a ledger and the release stage",
            )
        })
}

async fn set(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Form(form): Form<PolicyForm>,
) -> Response {
    let change = async |book: &RetryBook, client: Option<&str>, now_ms: u64| {
        let settings = parse_policy(&form.name, form.body().to_string().as_bytes())?;
        let (_, created) = book.put(settings, client, now_ms).await?;
        let verb = if created { "created" } else { "set" };
        Ok(format!("retry policy {} {verb}", form.name))
    };
    as_admin(&state, &headers, &form.csrf, change).await
}

#[derive(Deserialize)]
struct RemoveForm {
    csrf: String,
}

async fn remove(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<RemoveForm>,
) -> Response {
    let change = async |book: &RetryBook, client: Option<&str>, now_ms: u64| {
        book.remove(&name, client, now_ms).await?;
        Ok(format!("retry policy {name} removed"))
    };
    as_admin(&state, &headers, &form.csrf, change).await
}

/// Makes `change` as the signed-in admin whose form carries the session's
/// token (with the book that sets policies, the client's name and now),
/// then goes back to the page saying what it did.
async fn as_admin(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    csrf: &str,
    change: impl AsyncFnOnce(&RetryBook, Option<&str>, u64) -> Result<String, ApiError>,
) -> Response {
    let session = match form_session(state, headers, csrf, Permission::Admin) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let now_ms = crate::clock::now_ms();
    let outcome = match settable(state) {
        Ok(book) => change(book, session.caller.client_name(), now_ms).await,
        Err(error) => Err(error),
    };
    back(outcome)
}

/// The Retries page's routes, part of the console's one router (and its
/// security headers).
pub(super) fn routes() -> axum::Router<AppState> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/console/retries", get(retries_page).post(set))
        .route("/console/retries/{name}/remove", post(remove))
}
