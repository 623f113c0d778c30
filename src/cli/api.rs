//! The commands that act through a running service's API
//! (`crate::remote`): schedules, limits, forecast, bulk, retry policies,
//! parked; each builds its request and prints what the service answered.

use super::args::*;
use crate::config::Settings;

/// `delayline parked …`, through the running service's API.
pub(super) async fn parked(
    remote: &crate::remote::Remote,
    action: ParkedCommand,
) -> anyhow::Result<String> {
    Ok(match action {
        ParkedCommand::List { queue, limit } => remote.list_parked(queue.as_deref(), limit).await?,
        ParkedCommand::Replay {
            target,
            group,
            after,
        } => {
            let which = parked_which(&target, &group);
            remote
                .act_on_parked("replay", which, after.as_deref())
                .await?
        }
        ParkedCommand::Discard { target, group } => {
            let which = parked_which(&target, &group);
            remote.act_on_parked("discard", which, None).await?
        }
        ParkedCommand::Groups => remote.parked_groups().await?,
    })
}

/// One parked message by id, or the filter of `POST /v1/parked/bulk`.
fn parked_which(target: &ParkedTarget, group: &ParkedGroupArgs) -> crate::remote::ParkedWhich {
    match &target.id {
        Some(id) => crate::remote::ParkedWhich::One(id.clone()),
        None => crate::remote::ParkedWhich::Filter(serde_json::json!({
            "queue": target.queue,
            "reason": group.reason,
            "first_failed_hour": group.first_failed_hour,
        })),
    }
}

/// `delayline retries …` but `check`, through the running service's API.
pub(super) async fn retries(
    remote: &crate::remote::Remote,
    action: RetriesCommand,
) -> anyhow::Result<String> {
    Ok(match action {
        RetriesCommand::List | RetriesCommand::Check { .. } => remote.list_retries().await?,
        RetriesCommand::Set(policy) => {
            let body = without_nulls(serde_json::json!({
                "queues": policy.queues,
                "initial": policy.initial,
                "multiplier": policy.multiplier,
                "max_delay": policy.max_delay,
                "jitter": policy.jitter,
                "max_attempts": policy.max_attempts,
                "give_up_after": policy.give_up_after,
                "max_lateness": policy.max_lateness,
                "park_to": policy.park_to,
            }));
            remote.set_retry_policy(&policy.name, &body).await?
        }
        RetriesCommand::Remove { name } => remote.remove_retry_policy(&name).await?,
        RetriesCommand::Changes { limit } => remote.retry_policy_changes(limit).await?,
    })
}

/// `delayline tasks …`, through the running service's API.
pub(super) async fn tasks(
    remote: &crate::remote::Remote,
    action: TasksCommand,
) -> anyhow::Result<String> {
    Ok(match action {
        TasksCommand::Expired { destination, limit } => {
            remote.list_expired(destination.as_deref(), limit).await?
        }
        TasksCommand::Replay { id } => remote.replay_task(&id).await?,
    })
}

/// `delayline schedules …`, through the running service's API.
pub(super) async fn schedules(
    settings: &Settings,
    action: ScheduleCommand,
    url: Option<String>,
    token: Option<String>,
) -> anyhow::Result<String> {
    let remote = crate::remote::Remote::new(settings, url, token)?;
    Ok(match action {
        ScheduleCommand::List => remote.list_schedules().await?,
        ScheduleCommand::Pause { id } => remote.pause_schedule(&id, true).await?,
        ScheduleCommand::Resume { id } => remote.pause_schedule(&id, false).await?,
    })
}

/// `forecast`'s arguments as a query string.
pub(super) fn forecast_query(window: &ForecastArgs) -> String {
    let fields = [
        ("from", &window.from),
        ("to", &window.to),
        ("bucket", &window.bucket),
        ("destination", &window.destination),
    ];
    let pairs: Vec<(&str, &String)> = fields
        .iter()
        .filter_map(|(name, value)| value.as_ref().map(|v| (*name, v)))
        .collect();
    reqwest::Url::parse_with_params("http://forecast/", pairs)
        .ok()
        .and_then(|url| url.query().map(str::to_owned))
        .unwrap_or_default()
}

/// `bulk …` as the body of `POST /v1/tasks/bulk`, and its key.
pub(super) fn bulk_request(action: BulkCommand) -> (serde_json::Value, Option<String>) {
    let (filter, action, shift, deliver_at) = match action {
        BulkCommand::Cancel(filter) => (filter, "cancel", None, None),
        BulkCommand::Move {
            filter,
            shift,
            deliver_at,
        } => (filter, "move", shift, deliver_at),
    };
    let body = serde_json::json!({
        "filter": {
            "destination": filter.destination,
            "due_after": filter.due_after,
            "due_before": filter.due_before,
            "state": filter.state,
        },
        "action": action,
        "shift": shift,
        "deliver_at": deliver_at,
    });
    (without_nulls(body), filter.key)
}

/// `value` with its null fields left out, at every depth.
pub(super) fn without_nulls(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(fields) => serde_json::Value::Object(
            fields
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

/// `delayline limits …`, through the running service's API.
pub(super) async fn limits(
    settings: &Settings,
    action: LimitCommand,
    url: Option<String>,
    token: Option<String>,
) -> anyhow::Result<String> {
    let remote = crate::remote::Remote::new(settings, url, token)?;
    Ok(match action {
        LimitCommand::List => remote.list_limits().await?,
        LimitCommand::Set(limit) => {
            let body = serde_json::json!({
                "destinations": limit.destinations,
                "rate_per_sec": limit.rate,
                "burst": limit.burst,
                "paused": limit.paused,
                "paused_until": limit.paused_until,
                "max_queue_depth": limit.queue.map(|queue| serde_json::json!({
                    "queue": queue,
                    "messages": limit.max_depth.unwrap_or(0),
                })),
            });
            // Fields not given are left out rather than sent as null.
            let body = without_nulls(body);
            remote.set_limit(&limit.name, &body).await?
        }
        LimitCommand::Pause { name } => remote.pause_limit(&name, true).await?,
        LimitCommand::Resume { name } => remote.pause_limit(&name, false).await?,
        LimitCommand::Delete { name } => remote.delete_limit(&name).await?,
    })
}
