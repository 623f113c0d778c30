//! The console's pages as HTML (maud escapes every value it is given), from
//! data the handlers read through the scheduler. Pure: no I/O here.

use maud::{DOCTYPE, Markup, html};

use crate::clock::format_epoch_ms;
use crate::metrics::recent::{LatenessSummary, WINDOW_MINUTES};
use crate::scheduler::StoredTask;
use crate::scheduler::{LimitStatus, ScheduleState};
use crate::task::TaskState;

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
                link rel="stylesheet" href=(super::assets::STYLE_PATH);
                script src=(super::assets::SCRIPT_PATH) defer {}
            }
            body {
                header {
                    nav aria-label="Console" {
                        a href="/console" { "Overview" }
                        a href="/console/tasks" { "Tasks" }
                        a href="/console/schedules" { "Schedules" }
                        a href="/console/limits" { "Limits" }
                        a href="/console/problems" { "Problems" }
                        a href="/console/retries" { "Retries" }
                        a href="/console/parked" { "Parked" }
                        @if let Some(csrf) = signed_in {
                            form.inline method="post" action="/console/logout" {
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

/// A refusal (the API's code and message) as a page of its own.
pub fn refusal(title: &str, code: &str, message: &str) -> Markup {
    page(
        title,
        None,
        html! {
            p.error role="alert" { code { (code) } ": " (message) }
            p { a href="/console" { "Back to the overview" } }
        },
    )
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
    pub levels: Vec<(u32, u64)>,
    pub counts: Vec<(&'static str, String)>,
    /// Deliveries over the last minutes on this replica.
    pub recent: Option<LatenessSummary>,
    /// What falls due in the next hour and day (with a ledger, to a
    /// caller who may read).
    pub due: Vec<DueChart>,
}

/// One forecast as bars: each bucket's start (as shown) and tasks.
pub struct DueChart {
    pub title: &'static str,
    pub buckets: Vec<(String, u64)>,
    pub total: u64,
}

pub fn overview(data: &Overview, signed_in: Option<&str>) -> Markup {
    let most = data.levels.iter().map(|(_, n)| *n).fold(1, u64::max);
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
            @if !data.due.is_empty() {
                h2 { "Falling due" }
                @for chart in &data.due { (due_chart(chart)) }
                p { small { "Tasks on their way (not delivered, cancelled or failed), every replica's, per bucket; hover a bar for its count. "
                    a href="/v1/forecast" { "GET /v1/forecast" } " answers the same for any window." } }
            }
            h2 #levels-heading { "Messages held per level" }
            p { small { "Messages in each level's queue, every shard's, as last read from the broker: \
                copies of tasks on their way, and also the copies a move or a cancel left behind (the release \
                stage drops them) and delayline's own level probes, so they may outnumber the tasks counted above." } }
            table aria-labelledby="levels-heading" {
                thead { tr { th { "level" } th { "messages" } th.wide { "" } } }
                tbody {
                    @for (level, messages) in &data.levels {
                        tr {
                            td { (level) }
                            td id=(format!("n-{level}")) { (messages) }
                            td { progress.bar id=(format!("bar-{level}")) value=(messages) max=(most)
                                aria-label=(format!("level {level}")) { (messages) } }
                        }
                    }
                }
            }
        },
    )
}

/// Bars scaled to the fullest bucket; each names its bucket and count.
fn due_chart(chart: &DueChart) -> Markup {
    let most = chart.buckets.iter().map(|(_, n)| *n).fold(1, u64::max);
    let width = chart.buckets.len().max(1) * 10;
    let first = chart
        .buckets
        .first()
        .map_or("", |(start, _)| start.as_str());
    html! {
        h3 { (chart.title) ": " (task_count(chart.total)) }
        svg.forecast viewBox=(format!("0 0 {width} 100")) preserveAspectRatio="none" role="img"
            aria-label=(format!("{}: {}, from {first}", chart.title, task_count(chart.total))) {
            @for (i, (start, tasks)) in chart.buckets.iter().enumerate() {
                @let height = tasks * 100 / most;
                rect x=(i * 10 + 1) y=(100 - height) width="8" height=(height) {
                    title { (start) ": " (tasks) }
                }
            }
        }
    }
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
    /// With one destination, to a caller who may cancel: how many of its
    /// tasks a bulk cancel would change, and the form's token.
    pub bulk_cancel: Option<CancelOffer>,
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
            @if let Some(offer) = query.bulk_cancel.as_ref().filter(|offer| offer.count > 0) {
                form method="post" action="/console/tasks/bulk-cancel"
                    data-confirm=(format!("Cancel {} to {}? None of them will be delivered.", offer.tasks(), query.destination)) {
                    input type="hidden" name="csrf" value=(offer.csrf);
                    input type="hidden" name="destination" value=(query.destination);
                    input type="hidden" name="state" value=(query.state);
                    input type="hidden" name="due_before" value=(query.due_before);
                    button type="submit" { (offer.button()) }
                }
            }
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

/// A bulk operation's counts, as `GET /v1/operations/{id}` gives them.
pub fn operation(
    rows: &[(&'static str, String)],
    running: bool,
    signed_in: Option<&str>,
) -> Markup {
    page(
        "Operation",
        signed_in,
        html! {
            (pairs(rows))
            @if running { p { "Still running: " a href="" { "refresh" } " to see how far it got." } }
        },
    )
}

/// A task's page: what can be done with it depends on the caller.
pub struct TaskPage<'a> {
    pub task: &'a StoredTask,
    pub levels: Vec<(u32, u64)>,
    /// The chain's release stage takes the task at the end of the levels.
    pub release_stage: bool,
    pub may_cancel: bool,
    pub may_reschedule: bool,
    /// The caller may submit tasks: an expired task offers its replay.
    pub may_replay: bool,
    pub csrf: &'a str,
    pub notice: Option<(bool, String)>,
}

pub fn task(view: &TaskPage, signed_in: Option<&str>) -> Markup {
    let task = view.task;
    let changeable = task.state.is_changeable();
    let path = format!("/console/tasks/{}", urlencode(&task.id));
    page(
        &format!("Task {}", task.id),
        signed_in,
        html! {
            (notice(&view.notice))
            p { "State: " strong { (task.state.as_str()) } ", revision " (task.revision) }
            @if let Some(due_at) = crate::task::leeway_due_at(&task.id, task.deliver_at_ms, task.leeway_ms) {
                p { "Leeway: " (task.leeway_ms) " ms after " (due_at)
                    "; delivered at its moment in it, " (format_epoch_ms(task.deliver_at_ms)) }
            }
            h2 { "Timeline" }
            ol { @for (when, what) in timeline(task, &view.levels, view.release_stage) { li { (when) ": " (what) } } }
            @if task.state == TaskState::Expired && view.may_replay {
                form method="post" action=(format!("{path}/replay"))
                    data-confirm="Replay this expired task? A new task is delivered now, late." {
                    input type="hidden" name="csrf" value=(view.csrf);
                    button type="submit" { "Replay now" }
                }
            }
            @if changeable && view.may_cancel {
                form method="post" action=(format!("{path}/cancel"))
                    data-confirm="Cancel this task? It will never be delivered." {
                    input type="hidden" name="csrf" value=(view.csrf);
                    button type="submit" { "Cancel task" }
                }
            }
            @if changeable && view.may_reschedule {
                form method="post" action=(format!("{path}/reschedule"))
                    data-confirm="Move this task to its new due time?" {
                    input type="hidden" name="csrf" value=(view.csrf);
                    label { "Due in " input type="text" name="delay" placeholder="10m" required; }
                    button type="submit" { "Reschedule" }
                }
            }
            h2 { "Payload" }
            (payload(task))
            @if !task.headers.is_empty() {
                h2 { "Headers" }
                table { tbody { @for (name, value) in &task.headers {
                    tr { th scope="row" { (name) } td { (serde_json::to_string(value).unwrap_or_default()) } }
                } } }
            }
        },
    )
}

/// What happened to a task, in time order, with the levels it waits in
/// (each for its TTL from the moment it enters: the broker's transit comes
/// on top) and, with the release stage, when it reaches the stage: before
/// its due time it is held until then; after it, it is late by that much.
fn timeline(
    task: &StoredTask,
    levels: &[(u32, u64)],
    release_stage: bool,
) -> Vec<(String, String)> {
    // `None`: now, after everything that has a time.
    let mut events: Vec<(Option<u64>, String)> =
        vec![(Some(task.created_at_ms), "accepted".to_owned())];
    match (task.published_at_ms, &task.last_error) {
        (Some(at), _) => events.push((Some(at), "published into the cascade".to_owned())),
        (None, Some(error)) if task.state == TaskState::Pending => {
            events.push((None, format!("pending: {error}")));
        }
        (None, _) => {}
    }
    let mut at = task.published_at_ms.unwrap_or(task.created_at_ms);
    for (level, ms) in levels {
        events.push((Some(at), format!("waits in level {level} for {ms} ms")));
        at += ms;
    }
    let due = task.deliver_at_ms;
    if release_stage {
        let what = if at <= due {
            format!("reaches the release stage, held {} ms until due", due - at)
        } else {
            format!("reaches the release stage {} ms after due", at - due)
        };
        events.push((Some(at), what));
    }
    events.push((Some(due), "due".to_owned()));
    if let Some(at) = task.delivered_ms() {
        let late = task.lateness_ms().unwrap_or_default();
        events.push((Some(at), format!("delivered, {late} ms after due")));
    } else if let (TaskState::Unroutable, Some(at)) = (task.state, task.delivered_at_ms) {
        let what = "released, but no queue was bound for it: in the unroutable queue";
        events.push((Some(at), what.to_owned()));
    }
    if let Some(limit) = &task.waited_for {
        let what = if task.state == TaskState::Waiting {
            format!("waits for release limit {limit}")
        } else {
            format!("was held by release limit {limit}")
        };
        events.push((None, what));
    }
    if let Some(at) = task.release_at_ms {
        let what = if task.state == TaskState::Staged {
            "staged in the ledger: released from there at this moment"
        } else {
            "was staged in the ledger until this moment (part of a burst)"
        };
        events.push((Some(at), what.to_owned()));
    }
    if let Some(at) = task.cancelled_at_ms {
        events.push((Some(at), "cancelled".to_owned()));
    }
    if let Some(at) = task.deadline_ms {
        let what = "its deadline: never published to its destination after it";
        events.push((Some(at), what.to_owned()));
    }
    if let Some(at) = task.expired_at_ms {
        let why = task.last_error.as_deref().unwrap_or("its deadline passed");
        events.push((Some(at), format!("expired, never delivered: {why}")));
    }
    events.sort_by_key(|(at, _)| at.unwrap_or(u64::MAX));
    events
        .into_iter()
        .map(|(at, what)| (at.map_or("now".to_owned(), format_epoch_ms), what))
        .collect()
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

/// The Limits page: each release limit, what it holds and why, with its
/// pause or resume.
pub fn limits(found: &[LimitStatus], csrf: &str, signed_in: Option<&str>) -> Markup {
    page(
        "Limits",
        signed_in,
        html! {
            p { "Release limits pace, pause or hold due tasks by destination; a task a limit "
                "holds waits in the ledger (state " code { "waiting" } ") and can still be "
                "cancelled or moved." }
            @if found.is_empty() { p { "None." } } @else { table {
                thead { tr { th { "name" } th { "destinations" } th { "pace" } th { "waiting" }
                             th { "oldest waiting" } th { "why it holds" } th { "released/s" } th { "" } } }
                tbody { @for status in found {
                    @let limit = &status.stored.limit;
                    tr {
                        td { (limit.name) }
                        td { code { (limit.destinations.as_str()) } }
                        td { @if let Some(rate) = limit.rate { (rate.per_sec) "/s, burst " (rate.burst) } @else { "-" } }
                        td { (status.waiting) }
                        td { (status.oldest_waiting_ms.map_or("-".to_owned(), format_epoch_ms)) }
                        td { (status.holds.as_ref().map_or("nothing held".to_owned(), |h| h.describe())) }
                        td { (format!("{:.1}", status.release_rate)) }
                        td {
                            @let action = if limit.paused { "resume" } else { "pause" };
                            form method="post" action=(format!("/console/limits/{}/{action}", urlencode(&limit.name))) {
                                input type="hidden" name="csrf" value=(csrf);
                                button type="submit" aria-label=(format!("{action} {}", limit.name)) { (action) }
                            }
                        }
                    }
                } }
            } }
        },
    )
}

/// The Problems page: failed tasks, unroutable ones, and the requeue.
pub struct Problems<'a> {
    pub failed: &'a [StoredTask],
    pub unroutable: &'a [StoredTask],
    /// Tasks whose deadline passed before they could be published.
    pub expired: &'a [StoredTask],
    /// The unroutable queue's depth, as the metrics last read it.
    pub unroutable_messages: String,
    /// Levels found stranded and drained by this replica: (level, queue,
    /// messages sent on).
    pub stranded: Vec<(u32, String, u64)>,
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
            h2 { "Expired tasks" }
            p { "Their deadline passed before they could be published to their destination: "
                "never delivered." }
            @if view.expired.is_empty() { p { "None." } } @else { table {
                thead { tr { th { "id" } th { "destination" } th { "deadline" } th { "why" } } }
                tbody { @for task in view.expired {
                    tr { td { a href=(format!("/console/tasks/{}", urlencode(&task.id))) { (task.id) } }
                         td { (task.destination) }
                         td { (task.deadline_ms.map(format_epoch_ms).unwrap_or_default()) }
                         td { (task.last_error.clone().unwrap_or_default()) } }
                } }
            } }
            h2 { "Stranded levels" }
            @if view.stranded.is_empty() { p { "None found by this replica." } } @else {
                p { "These levels stopped dead-lettering, or fell far behind (a probe that fell due "
                    "after theirs came back first). delayline takes their messages off and sends "
                    "each on at its time, and publishes the overdue tasks that passed them again. "
                    "See the runbook's \"A level stranded after a node loss\"." }
                table {
                    thead { tr { th { "level" } th { "queue" } th { "messages sent on" } } }
                    tbody { @for (level, queue, drained) in &view.stranded {
                        tr { td { (level) } td { code { (queue) } } td { (drained) } }
                    } }
                }
            }
            h2 { "Unroutable" }
            p { "Messages in the unroutable queue: " (view.unroutable_messages) ". Once their destinations are bound, "
                "requeueing sends them back to the business exchange (as "
                code { "delayline requeue-unroutable" } " does)." }
            @if view.may_requeue {
                form method="post" action="/console/problems/requeue"
                    data-confirm="Send the unroutable messages back to the business exchange?" {
                    input type="hidden" name="csrf" value=(view.csrf);
                    button type="submit" { "Requeue unroutable messages" }
                }
            }
            (task_table(view.unroutable))
        },
    )
}

/// What the last action answered, as the API answered it.
pub(super) fn notice(notice: &Option<(bool, String)>) -> Markup {
    html! {
        @if let Some((ok, text)) = notice {
            p class=(if *ok { "notice" } else { "error" }) role="status" { (text) }
        }
    }
}

/// What a bulk cancel of the tasks shown would change: `count` tasks, or
/// over `count` when `more`; and the form's token.
pub struct CancelOffer {
    pub count: u64,
    pub more: bool,
    pub csrf: String,
}

impl CancelOffer {
    /// "7 tasks", or "over 10000 tasks".
    fn tasks(&self) -> String {
        match self.more {
            true => format!("over {} tasks", self.count),
            false => task_count(self.count),
        }
    }

    /// "Cancel the 7 matching tasks", or "Cancel every matching task
    /// (over 10000)".
    fn button(&self) -> String {
        match self.more {
            true => format!("Cancel every matching task (over {})", self.count),
            false => format!("Cancel the {}", matching(self.count)),
        }
    }
}

/// "1 task", "2 tasks".
fn task_count(n: u64) -> String {
    match n {
        1 => "1 task".to_owned(),
        n => format!("{n} tasks"),
    }
}

/// "matching task", or "2 matching tasks".
fn matching(n: u64) -> String {
    match n {
        1 => "matching task".to_owned(),
        n => format!("{n} matching tasks"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn task(deliver_at_ms: u64, delivered_at_ms: Option<u64>) -> StoredTask {
        StoredTask {
            id: "t".into(),
            idempotency_key: None,
            state: TaskState::Delivered,
            destination: "d".into(),
            routing_key: "0.1.1.d".into(),
            delay_ms: deliver_at_ms - 10_000,
            deliver_at_ms,
            created_at_ms: 10_000,
            published_at_ms: Some(10_005),
            content_type: "text/plain".into(),
            headers: Default::default(),
            payload: None,
            payload_bytes: 0,
            attempts: 1,
            last_error: None,
            client: None,
            exchange: None,
            leeway_ms: 0,
            carried: None,
            publish_alone: false,
            refusals: 0,
            revision: 1,
            delivered_at_ms,
            cancelled_at_ms: None,
            waited_for: None,
            release_at_ms: None,
            staged_by: None,
            deadline_ms: None,
            expired_at_ms: None,
            expired_destination: None,
        }
    }

    fn times(events: &[(String, String)]) -> Vec<u64> {
        events
            .iter()
            .map(|(at, _)| crate::clock::parse_epoch_ms(at).unwrap())
            .collect()
    }

    #[test]
    fn the_timeline_is_in_time_order_and_says_where_the_release_stage_took_over() {
        // 3 s of levels (2 s and 1 s) for a 3.5 s delay: held 495 ms.
        let levels = [(1, 2_000), (0, 1_000)];
        let held = timeline(&task(13_500, Some(13_501)), &levels, true);
        let at = times(&held);
        assert!(at.windows(2).all(|w| w[0] <= w[1]), "{held:?}");
        let whats: Vec<&str> = held.iter().map(|(_, what)| what.as_str()).collect();
        assert_eq!(
            whats,
            [
                "accepted",
                "published into the cascade",
                "waits in level 1 for 2000 ms",
                "waits in level 0 for 1000 ms",
                "reaches the release stage, held 495 ms until due",
                "due",
                "delivered, 1 ms after due",
            ]
        );
        // A delay of whole units with no lead: the levels end after "due",
        // and the timeline says so in order, not a wait ending past due.
        let late = timeline(&task(13_000, Some(13_009)), &levels, true);
        let whats: Vec<&str> = late.iter().map(|(_, what)| what.as_str()).collect();
        assert_eq!(
            whats[4..],
            [
                "due",
                "reaches the release stage 5 ms after due",
                "delivered, 9 ms after due"
            ]
        );
        assert!(times(&late).windows(2).all(|w| w[0] <= w[1]), "{late:?}");
    }

    #[test]
    fn one_task_is_said_in_the_singular() {
        assert_eq!(
            (task_count(1), task_count(2), matching(1), matching(7)),
            (
                "1 task".to_owned(),
                "2 tasks".to_owned(),
                "matching task".to_owned(),
                "7 matching tasks".to_owned()
            )
        );
    }

    /// Past its cap the offer is counted no further: it says "over", in
    /// the confirmation and on the button, never a figure it did not count.
    #[test]
    fn a_cancel_offer_past_its_cap_says_over() {
        let offer = |count, more| CancelOffer {
            count,
            more,
            csrf: "c".into(),
        };
        assert_eq!(
            (offer(7, false).tasks(), offer(7, false).button()),
            (
                "7 tasks".to_owned(),
                "Cancel the 7 matching tasks".to_owned()
            )
        );
        assert_eq!(
            (offer(10_000, true).tasks(), offer(10_000, true).button()),
            (
                "over 10000 tasks".to_owned(),
                "Cancel every matching task (over 10000)".to_owned()
            )
        );
    }

    #[test]
    fn an_unroutable_task_is_not_said_delivered() {
        let mut unroutable = task(13_500, Some(13_501));
        unroutable.state = TaskState::Unroutable;
        let events = timeline(&unroutable, &[], true);
        let last = &events.last().unwrap().1;
        assert!(last.contains("unroutable queue"), "{events:?}");
        assert!(!events.iter().any(|(_, what)| what.contains("delivered")));
    }

    #[test]
    fn a_task_page_has_a_headers_heading_only_with_headers() {
        let page = |task: &StoredTask| {
            let view = TaskPage {
                task,
                levels: Vec::new(),
                release_stage: true,
                may_cancel: false,
                may_reschedule: false,
                may_replay: false,
                csrf: "c",
                notice: None,
            };
            super::task(&view, Some("admin")).into_string()
        };
        let mut with = task(13_500, None);
        assert!(!page(&with).contains("Headers"));
        with.headers
            .insert("k".into(), crate::message::FieldValue::Str("v".into()));
        assert!(page(&with).contains("<h2>Headers</h2>"));
    }
}
