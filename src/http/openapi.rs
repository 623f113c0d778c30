//! The API's OpenAPI 3.1 description, generated from the handlers' and the
//! types' own annotations (utoipa), so that it moves with the code: a field
//! added to a request type is in the description by the next build. What
//! utoipa cannot see (the error responses every route shares, which codes
//! each status carries, the token scheme) is added here, from the
//! [`ErrorCode`] enum, which every error answer is made from and which a
//! test keeps equal to the API reference's table (`docs/api.md`).

use serde_json::{Value, json};
use utoipa::OpenApi;

use std::sync::LazyLock;

use super::codes::ErrorCode;
use super::error::{ErrorBody, ErrorEnvelope};

/// Every error code the API answers, with its status: [`ErrorCode::ALL`].
pub static ERROR_CODES: LazyLock<Vec<(u16, &'static str)>> = LazyLock::new(|| {
    ErrorCode::ALL
        .iter()
        .map(|code| (code.status().as_u16(), code.as_str()))
        .collect()
});

#[derive(OpenApi)]
#[openapi(
    info(
        title = "delayline",
        description = "Delayed delivery for RabbitMQ: a task posted here reaches the business \
                       exchange at its time, never early. Every error is \
                       `{\"error\": {\"code\", \"message\"}}`; the codes each status carries are \
                       listed with it. Limits (docs/api.md, \"Limits\"): request head within \
                       `http.header_read_timeout_ms` (20 s), body within \
                       `http.body_read_timeout_ms` (10 s) and `http.body_limit_bytes` (1 MiB), \
                       answer within `http.request_timeout_ms` (30 s), `http.max_connections` \
                       (1024), `http.max_tasks_in_flight` (4096), `http.batch_limit` (1000). \
                       An unknown route answers 404 `not_found`, another method on a known \
                       route 405 `method_not_allowed`."
    ),
    paths(
        super::tasks::create_task,
        super::tasks::create_batch,
        super::inspect::list_tasks,
        super::inspect::get_task,
        super::changes::cancel_task,
        super::changes::cancel_batch,
        super::changes::reschedule_task,
        super::expired::replay_task,
        super::schedules::create_schedule,
        super::schedules::list_schedules,
        super::schedules::get_schedule,
        super::schedules::patch_schedule,
        super::schedules::pause_schedule,
        super::schedules::resume_schedule,
        super::schedules::delete_schedule,
        super::forecast::forecast,
        super::bulk::start_bulk,
        super::bulk::get_operation,
        super::release_limits::put_limit,
        super::release_limits::list_limits,
        super::release_limits::get_limit,
        super::release_limits::delete_limit,
        super::release_limits::pause_limit,
        super::release_limits::resume_limit,
        super::topology::topology,
        super::unroutable::requeue_route,
        super::retry_policies::retries,
        super::retry_policies::get_policy,
        super::retry_policies::put_policy,
        super::retry_policies::delete_policy,
        super::retry_policies::changes,
        super::retries::list,
        super::retries::one,
        super::retries::replay,
        super::retries::discard,
        super::retries::bulk,
        super::retries::groups,
        super::health::healthz,
        super::health::readyz,
        super::scrape::metrics,
    ),
    components(schemas(ErrorEnvelope, ErrorBody)),
    tags(
        (name = "tasks", description = "Scheduling, inspecting, cancelling and moving tasks"),
        (name = "schedules", description = "Recurring schedules: each occurrence becomes a task"),
        (name = "limits", description = "Release limits: pace, pause or hold due tasks by destination"),
        (name = "retries", description = "Retry policies, and the messages they parked after their last attempt"),
        (name = "operations", description = "Probes, topology and metrics"),
    )
)]
struct ApiDoc;

/// The API's OpenAPI 3.1 description (open, like the probes: it holds no secret).
async fn openapi_json() -> axum::Json<Value> {
    axum::Json(document())
}

/// `GET /openapi.json`.
pub fn router() -> axum::Router<super::AppState> {
    axum::Router::new().route("/openapi.json", axum::routing::get(openapi_json))
}

/// The description as served at `GET /openapi.json`.
pub fn document() -> Value {
    let mut document = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|_| json!({}));
    // Relative: the API is wherever this document was fetched from.
    document["servers"] = json!([{"url": "/", "description": "this delayline"}]);
    let codes: Vec<&str> = ERROR_CODES.iter().map(|(_, code)| *code).collect();
    document["components"]["schemas"]["ErrorBody"]["properties"]["code"]["enum"] = json!(codes);
    document["components"]["securitySchemes"] = json!({
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "A client's token (`delayline token create`); not needed while the \
                            API is open (no clients configured, loopback only)."
        }
    });
    if let Some(paths) = document["paths"].as_object_mut() {
        for (path, item) in paths.iter_mut() {
            let Some(operations) = item.as_object_mut() else {
                continue;
            };
            for (method, operation) in operations.iter_mut() {
                add_error_responses(path, method, operation);
            }
        }
    }
    document
}

/// The statuses a route can answer besides its own success, by what it does.
fn error_statuses(path: &str, method: &str) -> Vec<u16> {
    // Requests the HTTP layer cannot read, on any route.
    let unreadable = [400, 414, 431, 505];
    if path == "/healthz" {
        return [500].into_iter().chain(unreadable).collect();
    }
    if path == "/readyz" {
        return [500, 503].into_iter().chain(unreadable).collect();
    }
    let mut statuses = vec![401, 403, 500, 503];
    statuses.extend(unreadable);
    if method == "post" || method == "patch" || method == "put" {
        statuses.extend([400, 408, 413, 415, 422]);
    }
    let limits = path.starts_with("/v1/limits");
    if path.starts_with("/v1/tasks") || path.starts_with("/v1/schedules") || limits {
        statuses.push(501);
    }
    if limits && path != "/v1/limits" {
        // `limit_not_found`; a name that is not one (`invalid_limit`).
        statuses.extend([404, 422]);
    }
    if path == "/v1/operations/{id}" {
        // `operation_not_found`; `ledger_disabled`, `release_stage_disabled`.
        statuses.extend([404, 501]);
    }
    if path == "/v1/tasks/bulk" {
        // `idempotency_conflict`; `invalid_idempotency_key`.
        statuses.extend([409, 400]);
    }
    if path == "/v1/forecast" {
        // `invalid_query`; `ledger_disabled`.
        statuses.extend([400, 501]);
    }
    if (path == "/v1/tasks" || path == "/v1/schedules") && method == "get" {
        statuses.push(400);
    }
    if path.starts_with("/v1/schedules") && method != "get" {
        // `schedule_exists` (a new one), `schedule_changed` (a change).
        statuses.push(409);
    }
    if path == "/v1/topology" {
        // `?destination=` that is not one.
        statuses.push(422);
    }
    if path.starts_with("/v1/parked") {
        // `ledger_disabled`; a replay: `idempotency_conflict`,
        // `invalid_destination` (a queue the chain cannot route any more).
        statuses.push(501);
        if method == "get" {
            statuses.push(400);
        } else {
            statuses.extend([409, 413, 422]);
        }
    }
    // `?limit=`; `retry_policy_not_found`, `retry_policy_configured` and
    // `retry_queue_taken`; both: `ledger_disabled`, `release_stage_disabled`.
    match path {
        "/v1/retries/changes" => statuses.extend([400, 501]),
        "/v1/retries/policies/{name}" => statuses.extend([404, 409, 501]),
        _ => {}
    }
    if path.contains("{id}") {
        statuses.push(404);
    }
    if (path == "/v1/tasks" && method == "post") || path == "/v1/tasks/batch" {
        statuses.extend([409, 429]);
    }
    if path == "/v1/tasks/{id}" && method != "get" {
        statuses.push(409);
    }
    if path == "/v1/tasks/{id}/replay" {
        // `task_not_expired`; the client's rate and quota, as a new task's.
        statuses.extend([409, 429]);
    }
    statuses.sort_unstable();
    statuses.dedup();
    statuses
}

fn add_error_responses(path: &str, method: &str, operation: &mut Value) {
    for status in error_statuses(path, method) {
        let codes: Vec<String> = ERROR_CODES
            .iter()
            .filter(|(s, _)| *s == status)
            .map(|(_, code)| format!("`{code}`"))
            .collect();
        let mut response = json!({
            "description": codes.join(", "),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}}
        });
        if status == 503 || status == 429 {
            response["headers"] = json!({"Retry-After": {
                "description": "seconds to wait before retrying",
                "schema": {"type": "integer"}
            }});
        }
        if status == 401 {
            response["headers"] = json!({"WWW-Authenticate": {"schema": {"type": "string"}}});
        }
        operation["responses"][status.to_string()] = response;
    }
    // The probes are open whatever the configuration (an orchestrator has
    // no token): an empty requirement says so.
    operation["security"] = if path == "/healthz" || path == "/readyz" {
        json!([{}])
    } else {
        json!([{"bearer": []}, {}])
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_is_openapi_3_1_with_every_route_and_error_code() {
        let document = document();
        assert!(document["openapi"].as_str().unwrap().starts_with("3.1"));
        let paths = document["paths"].as_object().unwrap();
        for path in [
            "/v1/tasks",
            "/v1/tasks/batch",
            "/v1/tasks/{id}",
            "/v1/tasks/cancel",
            "/v1/schedules",
            "/v1/schedules/{id}",
            "/v1/schedules/{id}/pause",
            "/v1/schedules/{id}/resume",
            "/v1/limits",
            "/v1/limits/{name}",
            "/v1/limits/{name}/pause",
            "/v1/limits/{name}/resume",
            "/v1/forecast",
            "/v1/tasks/bulk",
            "/v1/operations/{id}",
            "/v1/topology",
            "/v1/retries",
            "/v1/parked",
            "/v1/parked/{id}",
            "/v1/parked/{id}/replay",
            "/v1/parked/bulk",
            "/healthz",
            "/readyz",
            "/metrics",
        ] {
            assert!(paths.contains_key(path), "{path}");
        }
        let text = document.to_string();
        for (_, code) in ERROR_CODES.iter() {
            assert!(text.contains(&format!("`{code}`")), "{code} in no response");
        }
        let request = &document["components"]["schemas"]["TaskRequest"];
        for field in [
            "destination",
            "delay_ms",
            "delay",
            "deliver_at",
            "payload",
            "headers",
            "id",
        ] {
            assert!(request["properties"].get(field).is_some(), "{field}");
        }
    }
}
