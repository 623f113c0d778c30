//! The API against its own description: schemathesis (property-based, from
//! `GET /openapi.json`) drives the running binary in its default
//! configuration (quorum queues, SQLite ledger, default unit and levels) and
//! must find nothing: no 5xx but 503, every answer's status, headers, content
//! type and body as described. A queue bound with `#` to every exchange a
//! task can enter the cascade by then shows that exactly the accepted tasks
//! were published, nothing that was refused.

use std::collections::HashSet;
use std::process::Command;
use std::time::Duration;

use crate::common::{
    Backend, Cleanup, TestConsumer, amqp_uri, free_port, sample, spawn_binary, test_settings,
    wait_connected_at, with_ledger,
};
use delayline::broker::connect;
use delayline::cascade::QueueType;
use lapin::options::QueueBindOptions;
use lapin::types::FieldTable;

/// Enough cases to cover every operation's shapes; fixed, so a failure can
/// be replayed with the same seed.
const EXAMPLES_PER_OPERATION: &str = "25";
const SEED: &str = "20261122";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_and_only_accepted_tasks_are_published() {
    let mut settings = with_ledger(test_settings(32, 100, QueueType::Quorum), Backend::Sqlite);
    // Every message into the cascade is counted below: no level probes
    // (delayline's own, one a second).
    settings.cascade.level_probe_ms = 0;
    let cascade = settings.cascade().unwrap();
    let mut cleanup = Cleanup::for_settings(&settings);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut child = spawn_binary(&settings, port);
    wait_connected_at(&http, &base).await;

    // Every way into the cascade: each level's exchange, and the release
    // stage's for a task already due.
    let queue = format!("{}.consumer.{}", cascade.prefix(), cleanup.queues.len());
    let mut published =
        TestConsumer::bind_to(&mut cleanup, &cascade, &cascade.due_exchange(), "#").await;
    let connection = connect(amqp_uri(), "delayline test binder").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    for level in 0..cascade.levels() {
        channel
            .queue_bind(
                queue.as_str().into(),
                cascade.level_exchange(level).as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    let _ = connection.close(200, "bound".into()).await;

    let schema = format!("{base}/openapi.json");
    // Schemathesis keeps a cache in its working directory: not in the checkout.
    let workdir = std::env::temp_dir().join(cascade.prefix());
    std::fs::create_dir_all(&workdir).unwrap();
    let run_in = workdir.clone();
    let run = tokio::task::spawn_blocking(move || {
        Command::new(crate::common::python::tool("schemathesis"))
            .current_dir(run_in)
            .args(["run", &schema, "--checks"])
            .arg(
                "not_a_server_error,status_code_conformance,content_type_conformance,\
                 response_headers_conformance,response_schema_conformance",
            )
            .args(["--max-examples", EXAMPLES_PER_OPERATION, "--seed", SEED])
            .args(["--generation-database", "none", "--no-color"])
            .output()
    })
    .await
    .unwrap()
    .expect("schemathesis runs");
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "schemathesis found something:\n{report}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );

    // Schedules it made keep making tasks: delete them, and let a planner's
    // step under way finish, so that the counts below hold still.
    loop {
        let page: serde_json::Value = http
            .get(format!("{base}/v1/schedules?limit=1000"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let schedules = page["schedules"].as_array().unwrap();
        if schedules.is_empty() {
            break;
        }
        for schedule in schedules {
            let id = schedule["id"].as_str().unwrap();
            let deleted = http
                .delete(format!("{base}/v1/schedules/{id}"))
                .send()
                .await
                .unwrap();
            assert_eq!(deleted.status(), 204);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let scrape = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let accepted: f64 = ["scheduled", "pending"]
        .iter()
        .filter_map(|state| {
            sample(
                &scrape,
                &format!("delayline_tasks_accepted_total{{state=\"{state}\"}}"),
            )
        })
        .sum();
    assert!(
        accepted > 0.0,
        "schemathesis had no task accepted:\n{report}"
    );
    let mut ids = HashSet::new();
    while let Some(message) = published.next(Duration::from_secs(3)).await {
        ids.insert(message.message_id());
    }
    assert_eq!(
        ids.len() as f64,
        accepted,
        "tasks published into the cascade against tasks answered 202"
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_dir_all(workdir);
}

/// Runs `validate_schema.py` on `instances` (schema name, body) against
/// `document`: the errors it found, empty when every body matches.
fn schema_errors(document: &serde_json::Value, instances: &[(&str, serde_json::Value)]) -> String {
    use std::io::Write;
    let input = serde_json::json!({
        "document": document,
        "instances": instances
            .iter()
            .map(|(schema, instance)| serde_json::json!({"schema": schema, "instance": instance}))
            .collect::<Vec<_>>(),
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/validate_schema.py");
    let mut child = Command::new(crate::common::python::tool("python"))
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        report.contains("bodies checked"),
        "the validator ran: {report}"
    );
    if output.status.success() {
        String::new()
    } else {
        report
    }
}

/// Headers of every kind, in a request and in the answers that carry them
/// back, match the document under a validator that enforces `oneOf` (an
/// integer header once matched two branches, which strict generated
/// clients refuse).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_with_headers_of_every_kind_match_the_document_strictly() {
    use crate::common::TestApp;
    use serde_json::json;
    let settings = with_ledger(test_settings(12, 100, QueueType::Quorum), Backend::Sqlite);
    let app = TestApp::spawn(settings).await;
    let (_, document) = app.get("/openapi.json").await;
    let headers = json!({
        "text": "x", "integer": 42, "negative": -7, "large": 9007199254740993u64,
        "fraction": 1.5, "exponent": 1e300, "yes": true, "no": false
    });
    let request = json!({"destination": "kinds.a", "delay": "60s", "headers": headers});
    let (status, accepted) = app.post("/v1/tasks", &request).await;
    assert_eq!(status, 202, "{accepted}");
    let id = accepted["id"].as_str().unwrap().to_owned();
    let (_, view) = app.get(&format!("/v1/tasks/{id}")).await;
    assert_eq!(view["headers"]["integer"], 42, "{view}");
    let (_, page) = app.get("/v1/tasks?destination=kinds.a").await;
    let batch = json!({"tasks": [request.clone(), {"destination": "kinds.b", "delay": "-1s"}]});
    let (_, batch_answer) = app.post("/v1/tasks/batch", &batch).await;
    let (_, moved) = app
        .patch(&format!("/v1/tasks/{id}"), &json!({"delay": "90s"}))
        .await;
    // A leeway, given either way, comes back with its window's start.
    let spread = json!({"destination": "kinds.l", "delay": "60s", "leeway": "10s"});
    let (status, spread_accepted) = app.post("/v1/tasks", &spread).await;
    assert_eq!(status, 202, "{spread_accepted}");
    assert_eq!(spread_accepted["leeway_ms"], 10_000, "{spread_accepted}");
    let spread_id = spread_accepted["id"].as_str().unwrap().to_owned();
    let (_, spread_view) = app.get(&format!("/v1/tasks/{spread_id}")).await;
    assert!(spread_view["due_at"].is_string(), "{spread_view}");
    let spread_ms = json!({"destination": "kinds.l", "delay": "60s", "leeway_ms": 250});
    let schedule = json!({"destination": "kinds.s", "every": "1h", "headers": headers,
                          "payload": {"n": 1}, "timezone": "Europe/Berlin",
                          "leeway_ms": 5000});
    let (status, created) = app.post("/v1/schedules", &schedule).await;
    assert_eq!(status, 201, "{created}");
    let schedule_id = created["id"].as_str().unwrap().to_owned();
    let patch = json!({"cron": "0 9 * * MON#1", "end_at": null, "headers": {"n": 7}});
    let (_, patched) = app
        .patch(&format!("/v1/schedules/{schedule_id}"), &patch)
        .await;
    let (_, schedules) = app.get("/v1/schedules").await;
    let limit = json!({"destinations": "kinds.#", "rate_per_sec": 0.5, "burst": 2,
                       "paused_until": "2100-01-01T00:00:00Z"});
    let (status, limit_set) = app.put("/v1/limits/kinds", &limit).await;
    assert_eq!(status, 201, "{limit_set}");
    let (_, limits) = app.get("/v1/limits").await;
    let (_, forecast) = app.get("/v1/forecast?bucket=1h").await;
    let bulk = json!({"filter": {"destination": "kinds.b", "state": "scheduled"},
                      "action": "move", "shift": "1m"});
    let (status, operation) = app.post("/v1/tasks/bulk", &bulk).await;
    assert_eq!(status, 202, "{operation}");
    let (_, operation_later) = app
        .get(&format!(
            "/v1/operations/{}",
            operation["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(app.delete("/v1/limits/kinds").await.0, 204);
    let instances = [
        ("LimitRequest", limit),
        ("LimitView", limit_set),
        ("LimitList", limits),
        ("Forecast", forecast),
        ("BulkRequest", bulk),
        ("OperationView", operation),
        ("OperationView", operation_later),
        ("ScheduleRequest", schedule),
        ("ScheduleView", created),
        ("SchedulePatch", patch),
        ("ScheduleView", patched),
        ("SchedulePage", schedules),
        ("TaskRequest", request),
        ("TaskAccepted", accepted),
        ("TaskView", view.clone()),
        ("TaskPage", page),
        ("BatchRequest", batch),
        ("BatchResponse", batch_answer),
        ("TaskView", moved),
        ("TaskRequest", spread),
        ("TaskRequest", spread_ms),
        ("TaskAccepted", spread_accepted),
        ("TaskView", spread_view),
    ];
    let errors = schema_errors(&document, &instances);
    assert!(errors.is_empty(), "{errors}");

    // The validator would have caught the old schema: with its four
    // overlapping branches, the integer header matches two.
    let mut derived = document.clone();
    derived["components"]["schemas"]["FieldValue"] = json!({"oneOf": [
        {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
    ]});
    let errors = schema_errors(&derived, &[("TaskView", view)]);
    assert!(errors.contains("integer"), "{errors}");
}
