//! The console's pages as HTML (maud escapes every value it is given), from
//! data the handlers read through the scheduler. Pure: no I/O here.

use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::ledger::StoredTask;
use crate::metrics::recent::{LatenessSummary, WINDOW_MINUTES};
use crate::scheduler::ScheduleState;
use crate::task::{TaskState, format_epoch_ms};

/// Small, and readable on a narrow screen; contrast at least 4.5:1.
const CSS: &str = "body{font:16px/1.5 system-ui,sans-serif;margin:0;color:#111;background:#fff}\
header{background:#1d3557;padding:.5rem 1rem}header a{color:#fff;margin-right:1rem}\
header a:focus{outline:3px solid #ffb703}main{padding:1rem;max-width:70rem}\
table{border-collapse:collapse;width:100%;display:block;overflow-x:auto}\
th,td{text-align:left;padding:.3rem .6rem;border-bottom:1px solid #ccc;vertical-align:top}\
.bar{background:#1d3557;height:1rem;min-width:1px}.notice{background:#fff3cd;padding:.5rem}\
.error{background:#f8d7da;padding:.5rem}pre{white-space:pre-wrap;word-break:break-all;\
background:#f4f4f4;padding:.5rem}label{display:inline-block;margin:.2rem .8rem .2rem 0}\
button,input,select{font:inherit;padding:.2rem .4rem}";

/// Refreshes the level chart from `/console/levels` every 5 s.
const LEVELS_JS: &str = "setInterval(async()=>{try{const r=await fetch('/console/levels');\
if(!r.ok)return;const l=await r.json();const m=Math.max(1,...l.map(x=>x.messages));\
for(const x of l){const b=document.getElementById('bar-'+x.level);\
const n=document.getElementById('n-'+x.level);if(b)b.style.width=(100*x.messages/m)+'%';\
if(n)n.textContent=x.messages;}}catch(e){}},5000);";

/// One page: navigation, a heading, the body.
/// `signed_in`: the session's form token, when signed in with a token.
pub fn page(title: &str, signed_in: Option<&str>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · delayline" }
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    nav aria-label="Console" {
                        a href="/console" { "Overview" }
                        a href="/console/tasks" { "Tasks" }
                        a href="/console/schedules" { "Schedules" }
                        a href="/console/problems" { "Problems" }
                        @if let Some(csrf) = signed_in {
                            form method="post" action="/console/logout" style="display:inline" {
                                input type="hidden" name="csrf" value=(csrf);
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

pub fn login(error: Option<&str>) -> Markup {
    page(
        "Sign in",
        None,
        html! {
            @if let Some(error) = error { p.error role="alert" { (error) } }
            form method="post" action="/console/login" {
                label for="token" { "Token" }
                input #token type="password" name="token" autocomplete="current-password" required;
                button type="submit" { "Sign in" }
            }
            p { "A client token, as for the API (" code { "delayline token create" } ")." }
        },
    )
}

/// What `/readyz` answers (its status, or why not ready), and the state
/// behind it.
pub struct Readiness {
    pub verdict: Result<String, String>,
    pub rows: Vec<(&'static str, String)>,
}

/// What the overview shows.
pub struct Overview {
    pub chain: Vec<(&'static str, String)>,
    pub ready: Readiness,
    pub levels: Vec<(u32, f64)>,
    pub counts: Vec<(&'static str, String)>,
    /// Deliveries over the last minutes on this replica.
    pub recent: Option<LatenessSummary>,
}

pub fn overview(data: &Overview, signed_in: Option<&str>) -> Markup {
    let most = data.levels.iter().map(|(_, n)| *n).fold(1.0, f64::max);
    page(
        "Overview",
        signed_in,
        html! {
            h2 { "Ready?" }
            @match &data.ready.verdict {
                Ok(status) => p { "/readyz: " strong { (status) } },
                Err(why) => p.error role="status" { "Not ready: " (why) },
            }
            (pairs(&data.ready.rows))
            h2 { "Chain" }
            (pairs(&data.chain))
            h2 { "Counts" }
            (pairs(&data.counts))
            h2 { "Due rate and lateness" }
            @match &data.recent {
                Some(recent) => (pairs(&[
                    ("delivered", recent.delivered.to_string()),
                    ("due rate", format!("{:.1} tasks/s", recent.per_second)),
                    ("lateness p50", format!("≤ {} ms", recent.p50_ms)),
                    ("lateness p99", format!("≤ {} ms", recent.p99_ms)),
                ])),
                None => p { "Nothing delivered here in the last minutes." },
            }
            p { small { "Over the last " (WINDOW_MINUTES) " minutes, on this replica, after each task's due time." } }
            h2 #levels-heading { "Tasks held per level" }
            table aria-labelledby="levels-heading" {
                thead { tr { th { "level" } th { "messages" } th style="width:60%" { "" } } }
                tbody {
                    @for (level, messages) in &data.levels {
                        tr {
                            td { (level) }
                            td id=(format!("n-{level}")) { (messages) }
                            td { div.bar id=(format!("bar-{level}"))
                                style=(format!("width:{}%", 100.0 * messages / most)) {} }
                        }
                    }
                }
            }
            script { (PreEscaped(LEVELS_JS)) }
        },
    )
}

fn pairs(rows: &[(&'static str, String)]) -> Markup {
    html! {
        table { tbody { @for (name, value) in rows { tr { th scope="row" { (name) } td { (value) } } } } }
    }
}

/// The task filter as the form holds it.
#[derive(Default)]
pub struct TaskQuery {
    pub destination: String,
    pub state: String,
    pub due_before: String,
}

pub fn tasks(
    query: &TaskQuery,
    found: &[StoredTask],
    next: Option<String>,
    signed_in: Option<&str>,
) -> Markup {
    page(
        "Tasks",
        signed_in,
        html! {
            form method="get" action="/console/tasks" role="search" {
                label { "Task id " input type="text" name="id"; }
                button type="submit" { "Find" }
            }
            form method="get" action="/console/tasks" {
                label { "Destination " input type="text" name="destination" value=(query.destination); }
                label { "State "
                    select name="state" {
                        option value="" { "any" }
                        @for state in TaskState::ALL {
                            option value=(state.as_str()) selected[query.state == state.as_str()] { (state.as_str()) }
                        }
                    }
                }
                label { "Due before (RFC 3339) " input type="text" name="due_before" value=(query.due_before); }
                button type="submit" { "Filter" }
            }
            (task_table(found))
            @if let Some(cursor) = next {
                a href=(format!("/console/tasks?destination={}&state={}&due_before={}&cursor={cursor}",
                    urlencode(&query.destination), urlencode(&query.state), urlencode(&query.due_before))) { "Next page" }
            }
        },
    )
}

fn task_table(found: &[StoredTask]) -> Markup {
    if found.is_empty() {
        return html! { p { "No tasks." } };
    }
    html! {
        table {
            thead { tr { th { "id" } th { "state" } th { "destination" } th { "due" } th { "late by" } } }
            tbody {
                @for task in found {
                    tr {
                        td { a href=(format!("/console/tasks/{}", urlencode(&task.id))) { (task.id) } }
                        td { (task.state.as_str()) }
                        td { (task.destination) }
                        td { (format_epoch_ms(task.deliver_at_ms)) }
                        td { @if let Some(ms) = task.lateness_ms() { (ms) " ms" } }
                    }
                }
            }
        }
    }
}

/// A task's page: what can be done with it depends on the caller.
pub struct TaskPage<'a> {
    pub task: &'a StoredTask,
    pub levels: Vec<(u32, u64)>,
    pub may_cancel: bool,
    pub may_reschedule: bool,
    pub csrf: &'a str,
    pub notice: Option<(bool, String)>,
}

pub fn task(view: &TaskPage, signed_in: Option<&str>) -> Markup {
    let task = view.task;
    let changeable = matches!(task.state, TaskState::Pending | TaskState::Scheduled);
    let path = format!("/console/tasks/{}", urlencode(&task.id));
    page(
        &format!("Task {}", task.id),
        signed_in,
        html! {
            (notice(&view.notice))
            p { "State: " strong { (task.state.as_str()) } ", revision " (task.revision) }
            h2 { "Timeline" }
            ol { @for (when, what) in timeline(task, &view.levels) { li { (when) ": " (what) } } }
            @if changeable && view.may_cancel {
                form method="post" action=(format!("{path}/cancel"))
                    onsubmit="return confirm('Cancel this task? It will never be delivered.')" {
                    input type="hidden" name="csrf" value=(view.csrf);
                    button type="submit" { "Cancel task" }
                }
            }
            @if changeable && view.may_reschedule {
                form method="post" action=(format!("{path}/reschedule"))
                    onsubmit="return confirm('Move this task to its new due time?')" {
                    input type="hidden" name="csrf" value=(view.csrf);
                    label { "Due in " input type="text" name="delay" placeholder="10m" required; }
                    button type="submit" { "Reschedule" }
                }
            }
            h2 { "Payload" }
            (payload(task))
            h2 { "Headers" }
            table { tbody { @for (name, value) in &task.headers {
                tr { th scope="row" { (name) } td { (serde_json::to_string(value).unwrap_or_default()) } }
            } } }
        },
    )
}

/// What happened to a task, in order, with the levels it waits in.
fn timeline(task: &StoredTask, levels: &[(u32, u64)]) -> Vec<(String, String)> {
    let mut events = vec![(format_epoch_ms(task.created_at_ms), "accepted".to_owned())];
    match (task.published_at_ms, &task.last_error) {
        (Some(at), _) => {
            events.push((format_epoch_ms(at), "published into the cascade".to_owned()))
        }
        (None, Some(error)) => events.push(("now".to_owned(), format!("pending: {error}"))),
        (None, None) => {}
    }
    let mut at = task.published_at_ms.unwrap_or(task.created_at_ms);
    for (level, ms) in levels {
        events.push((
            format_epoch_ms(at),
            format!("waits in level {level} for {ms} ms"),
        ));
        at += ms;
    }
    events.push((format_epoch_ms(task.deliver_at_ms), "due".to_owned()));
    if let Some(at) = task.delivered_at_ms {
        let late = task.lateness_ms().unwrap_or_default();
        events.push((
            format_epoch_ms(at),
            format!("delivered, {late} ms after due"),
        ));
    }
    if let Some(at) = task.cancelled_at_ms {
        events.push((format_epoch_ms(at), "cancelled".to_owned()));
    }
    events
}

fn payload(task: &StoredTask) -> Markup {
    let Some(bytes) = &task.payload else {
        return html! { p { (task.payload_bytes) " bytes (not kept)" } };
    };
    let json = serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .filter(|_| task.content_type.contains("json"))
        .and_then(|v| serde_json::to_string_pretty(&v).ok());
    match (json, std::str::from_utf8(bytes)) {
        (Some(pretty), _) => html! { pre { (pretty) } },
        (None, Ok(text)) if task.content_type.starts_with("text/") => html! { pre { (text) } },
        _ => html! { p { (task.payload_bytes) " bytes of " (task.content_type) } },
    }
}

/// Only shown to a caller with `schedule`, who may pause and resume.
pub fn schedules(found: &[ScheduleState], csrf: &str, signed_in: Option<&str>) -> Markup {
    page(
        "Schedules",
        signed_in,
        html! {
            table {
                thead { tr { th { "id" } th { "state" } th { "when" } th { "next occurrences" } th { "" } } }
                tbody {
                    @for schedule in found {
                        @let stored = &schedule.stored;
                        tr {
                            td { (stored.id) }
                            td { @if stored.paused { "paused" } @else if stored.next_at_ms.is_some() { "active" } @else { "finished" } }
                            td { @if let Some(cron) = &stored.spec.cron { "cron " code { (cron) } " " (stored.spec.timezone) }
                                 @if let Some(every) = &stored.spec.every { "every " (every) } }
                            td { @for at in &schedule.upcoming { (format_epoch_ms(*at)) br; } }
                            td {
                                @let action = if stored.paused { "resume" } else { "pause" };
                                form method="post" action=(format!("/console/schedules/{}/{action}", urlencode(&stored.id))) {
                                    input type="hidden" name="csrf" value=(csrf);
                                    button type="submit" aria-label=(format!("{action} {}", stored.id)) { (action) }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// The Problems page: failed tasks, unroutable ones, and the requeue.
pub struct Problems<'a> {
    pub failed: &'a [StoredTask],
    pub unroutable: &'a [StoredTask],
    /// The unroutable queue's depth, as the metrics last read it.
    pub parked: String,
    pub may_requeue: bool,
    pub csrf: &'a str,
    pub notice: Option<(bool, String)>,
}

pub fn problems(view: &Problems, signed_in: Option<&str>) -> Markup {
    page(
        "Problems",
        signed_in,
        html! {
            (notice(&view.notice))
            h2 { "Failed (quarantined) tasks" }
            @if view.failed.is_empty() { p { "None." } } @else { table {
                thead { tr { th { "id" } th { "destination" } th { "the broker's reason" } } }
                tbody { @for task in view.failed {
                    tr { td { a href=(format!("/console/tasks/{}", urlencode(&task.id))) { (task.id) } }
                         td { (task.destination) } td { (task.last_error.clone().unwrap_or_default()) } }
                } }
            } }
            h2 { "Unroutable" }
            p { "Messages in the unroutable queue: " (view.parked) ". Once their destinations are bound, "
                "requeueing sends them back to the business exchange (as "
                code { "delayline requeue-unroutable" } " does)." }
            @if view.may_requeue {
                form method="post" action="/console/problems/requeue"
                    onsubmit="return confirm('Send the unroutable messages back to the business exchange?')" {
                    input type="hidden" name="csrf" value=(view.csrf);
                    button type="submit" { "Requeue unroutable messages" }
                }
            }
            (task_table(view.unroutable))
        },
    )
}

/// What the last action answered, as the API answered it.
fn notice(notice: &Option<(bool, String)>) -> Markup {
    html! {
        @if let Some((ok, text)) = notice {
            p class=(if *ok { "notice" } else { "error" }) role="status" { (text) }
        }
    }
}

/// Percent-encodes everything but unreserved characters.
pub fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
