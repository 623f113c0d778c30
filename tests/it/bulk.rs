//! Changes in bulk against the real broker, on the default configuration
//! (quorum queues, the SQLite ledger, 100 ms units): 20,000 tasks cancelled
//! by destination while some of them fall due, each ending delivered or
//! cancelled and never both, the operation's counts adding up; a move by a
//! shift; an Idempotency-Key making a repeat the same operation; and the
//! refusals (permissions, destinations, bad requests).

use std::collections::HashSet;
use std::time::Duration;

use delayline::cascade::QueueType;
use delayline::config::Settings;
use delayline::message::DELIVER_AT_HEADER;
use serde_json::{Value, json};

use crate::common::{Backend, TestApp, TestConsumer, bearer_client, test_settings, with_ledger};

fn settings() -> Settings {
    with_ledger(test_settings(8, 100, QueueType::Quorum), Backend::Sqlite)
}

/// Submits one task to `destination` per delay (ms), in batches; the ids.
async fn submit(app: &TestApp, destination: &str, delays_ms: &[u64]) -> Vec<String> {
    let mut ids = Vec::new();
    for chunk in delays_ms.chunks(1000) {
        let tasks: Vec<Value> = chunk
            .iter()
            .map(|ms| json!({"destination": destination, "delay": format!("{ms}ms")}))
            .collect();
        let (status, answer) = app.post("/v1/tasks/batch", &json!({"tasks": tasks})).await;
        assert_eq!(status, 200, "{answer}");
        for result in answer["results"].as_array().unwrap() {
            assert_eq!(result["status"], 202, "{result}");
            ids.push(result["task"]["id"].as_str().unwrap().to_owned());
        }
    }
    ids
}

/// The operation once done.
async fn finished(app: &TestApp, id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (status, operation) = app.get(&format!("/v1/operations/{id}")).await;
        assert_eq!(status, 200, "{operation}");
        if operation["done"] == true {
            return operation;
        }
        assert!(tokio::time::Instant::now() < deadline, "{operation}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every id of `destination`'s tasks in `state`, page by page.
async fn ids_in_state(app: &TestApp, destination: &str, state: &str) -> HashSet<String> {
    let mut ids = HashSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/tasks?destination={destination}&state={state}&limit=1000");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let (status, page) = app.get(&path).await;
        assert_eq!(status, 200, "{page}");
        for task in page["tasks"].as_array().unwrap() {
            ids.insert(task["id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return ids,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_cancel_of_20000_tasks_falling_due_leaves_each_delivered_or_cancelled() {
    let mut app = TestApp::spawn(settings()).await;
    let destination = format!("{}.bulk", app.cascade.prefix());
    let mut consumer = TestConsumer::bind(&mut app, &destination).await;
    // Due between 4 s and 10 s from now: the cancel's pages meet tasks
    // falling due.
    let delays: Vec<u64> = (0..20_000).map(|i| 4_000 + (i * 6_000) / 20_000).collect();
    let ids = submit(&app, &destination, &delays).await;
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let body = json!({"filter": {"destination": destination}, "action": "cancel"});
    let (status, started) = app.post("/v1/tasks/bulk", &body).await;
    assert_eq!(status, 202, "{started}");
    let operation = finished(&app, started["id"].as_str().unwrap()).await;
    let count = |name: &str| operation[name].as_u64().unwrap();
    assert_eq!(operation["state"], "done", "{operation}");
    assert_eq!(count("matched"), 20_000, "{operation}");
    assert_eq!(
        count("changed") + count("too_late") + count("unchanged"),
        20_000,
        "{operation}"
    );
    assert_eq!(count("unchanged"), 0, "{operation}");

    // Everything not cancelled arrives, once, never early.
    let mut delivered = HashSet::new();
    let expected_deliveries = count("too_late") as usize;
    while delivered.len() < expected_deliveries {
        let message = consumer
            .next(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("{} of {expected_deliveries} arrived", delivered.len()));
        let due = message.header_i64(DELIVER_AT_HEADER).unwrap();
        assert!(message.received_at_ms as i64 >= due, "early");
        assert!(delivered.insert(message.message_id()), "delivered twice");
    }
    assert!(
        consumer.next(Duration::from_secs(3)).await.is_none(),
        "a cancelled task arrived"
    );
    let cancelled = ids_in_state(&app, &destination, "cancelled").await;
    assert_eq!(cancelled.len() as u64, count("changed"));
    assert!(cancelled.is_disjoint(&delivered));
    let all: HashSet<String> = ids.into_iter().collect();
    assert_eq!(&cancelled | &delivered, all);
    println!(
        "bulk cancel: {} cancelled, {} too late (delivered)",
        count("changed"),
        count("too_late")
    );
}

/// A bulk move puts each task exactly where a single move would: by a
/// shift, its due time plus the shift to the millisecond (forward and
/// back); to a time, that time, as `PATCH` with `deliver_at` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_move_lands_each_task_where_a_single_move_would() {
    use delayline::clock::{format_epoch_ms, parse_epoch_ms};
    use delayline::testkit::now_ms;
    let settings = settings();
    let prefix = settings.cascade.prefix.clone();
    let app = TestApp::spawn(settings).await;
    let destination = format!("{prefix}.exact");
    let ids = submit(&app, &destination, &[15_000, 16_000, 17_000]).await;
    let due = async |id: &str| {
        let (status, task) = app.get(&format!("/v1/tasks/{id}")).await;
        assert_eq!(status, 200, "{task}");
        parse_epoch_ms(task["deliver_at"].as_str().unwrap()).unwrap()
    };
    let bulk = async |body: Value| {
        let (status, operation) = app.post("/v1/tasks/bulk", &body).await;
        assert_eq!(status, 202, "{operation}");
        let operation = finished(&app, operation["id"].as_str().unwrap()).await;
        assert_eq!(operation["changed"].as_u64(), Some(3), "{operation}");
    };
    let filter = json!({"destination": destination});
    for (shift, by) in [("1ms", 1), ("2s", 2_000), ("-3s", -3_000)] {
        let mut before = Vec::new();
        for id in &ids {
            before.push(due(id).await);
        }
        bulk(json!({"filter": filter, "action": "move", "shift": shift})).await;
        for (id, was) in ids.iter().zip(before) {
            assert_eq!(
                due(id).await,
                was.checked_add_signed(by).unwrap(),
                "{shift}"
            );
        }
    }
    // To one time: where PATCH puts a task, to the millisecond.
    let at = format_epoch_ms(now_ms() + 20_000 + 7);
    bulk(json!({"filter": filter, "action": "move", "deliver_at": at})).await;
    let other = submit(&app, &format!("{prefix}.single"), &[15_000]).await;
    let (status, moved) = app
        .patch(
            &format!("/v1/tasks/{}", other[0]),
            &json!({"deliver_at": at}),
        )
        .await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["deliver_at"], at.as_str());
    for id in &ids {
        assert_eq!(format_epoch_ms(due(id).await), at);
    }
}

/// A move by a shift brings tasks forward (never before their new due
/// time); a repeat under the same Idempotency-Key is the same operation,
/// another request under it a conflict; a client reaches only its own
/// destinations and needs the action's permission; bad requests are 422
/// with the field named, and nothing is started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_move_is_idempotent_and_under_access_control() {
    use delayline::auth::token::hash_hex;
    use delayline::auth::{ClientSettings, TokenHashes};
    let mut settings = settings();
    let prefix = settings.cascade.prefix.clone();
    let client = |name: &str, permissions: &[&str]| ClientSettings {
        name: name.to_owned(),
        token_sha256: TokenHashes::One(hash_hex(&format!("tok-{name}"))),
        destinations: vec![format!("{prefix}.mine.#")],
        permissions: permissions.iter().map(|p| (*p).to_owned()).collect(),
        ..ClientSettings::default()
    };
    settings.auth.clients = vec![
        client("mover", &["submit", "read", "reschedule"]),
        client("canceller", &["submit", "read", "cancel"]),
    ];
    let mut app = TestApp::spawn(settings.clone()).await;
    let destination = format!("{prefix}.mine.x");
    let mut consumer = TestConsumer::bind(&mut app, &destination).await;
    app.http = bearer_client("tok-mover");
    let ids = submit(&app, &destination, &[20_000; 100]).await;
    let submitted_at = delayline::testkit::now_ms();

    let post = async |token: &str, key: &str, body: &Value| {
        let response = bearer_client(token)
            .post(format!("{}/v1/tasks/bulk", app.base))
            .header("idempotency-key", key)
            .json(body)
            .send()
            .await
            .unwrap();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap(), replayed)
    };
    let forward = json!({"filter": {"destination": format!("{prefix}.mine.#")},
        "action": "move", "shift": "-15s"});
    let (status, first, replayed) = post("tok-mover", "k1", &forward).await;
    assert_eq!((status, replayed), (202, false), "{first}");
    let (status, again, replayed) = post("tok-mover", "k1", &forward).await;
    assert_eq!((status, replayed), (202, true), "{again}");
    assert_eq!(again["id"], first["id"]);
    let other = json!({"filter": {"destination": format!("{prefix}.mine.#")}, "action": "move",
        "shift": "-10s"});
    let (status, conflict, _) = post("tok-mover", "k1", &other).await;
    assert_eq!(
        (status, &conflict["error"]["code"]),
        (409, &json!("idempotency_conflict"))
    );

    let operation = finished(&app, first["id"].as_str().unwrap()).await;
    assert_eq!(
        (operation["matched"].as_u64(), operation["changed"].as_u64()),
        (Some(100), Some(100)),
        "{operation}"
    );
    let mut seen = HashSet::new();
    while seen.len() < 100 {
        let message = consumer
            .next(Duration::from_secs(20))
            .await
            .expect("moved tasks arrive");
        let due = message.header_i64(DELIVER_AT_HEADER).unwrap();
        assert!(message.received_at_ms as i64 >= due, "early");
        assert!(
            message.received_at_ms < submitted_at + 15_000,
            "not brought forward"
        );
        seen.insert(message.message_id());
    }
    assert_eq!(seen, ids.into_iter().collect::<HashSet<_>>());

    // The command line cancels in bulk and waits for the counts.
    // (A client's operation reaches its own tasks: these are the canceller's.)
    app.http = bearer_client("tok-canceller");
    let later = submit(&app, &destination, &[20_000; 10]).await;
    let pattern = format!("{prefix}.mine.#");
    let args = [
        "bulk",
        "cancel",
        "--destination",
        &pattern,
        "--state",
        "scheduled",
    ];
    let printed = crate::common::cli_as(&settings, &app.base, "tok-canceller", &args).await;
    assert!(
        printed.contains("done; matched 10, changed 10, too late 0, unchanged 0"),
        "{printed}"
    );
    let (_, task) = app.get(&format!("/v1/tasks/{}", later[0])).await;
    assert_eq!(task["state"], "cancelled", "{task}");

    // Permissions and destinations; bad requests; another's operation.
    let cancel_all = json!({"filter": {"destination": "#"}, "action": "cancel"});
    let (status, answer, _) = post("tok-canceller", "k2", &cancel_all).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (403, &json!("forbidden_destination"))
    );
    let (status, answer, _) = post("tok-canceller", "k3", &forward).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (403, &json!("forbidden"))
    );
    for (body, field) in [
        (
            json!({"filter": {"destination": "a..b"}, "action": "cancel"}),
            "/filter/destination",
        ),
        (
            json!({"filter": {"destination": format!("{prefix}.mine.#")}, "action": "move"}),
            "/action",
        ),
        (
            json!({"filter": {"destination": format!("{prefix}.mine.#")}, "action": "move",
            "deliver_at": "2020-01-01T00:00:00Z"}),
            "/deliver_at",
        ),
        // An unknown field is said of the request it is not in.
        (
            json!({"filter": {"destination": format!("{prefix}.mine.#")}, "action": "move",
            "shfit": "1m"}),
            "the fields of a bulk request are filter, action, shift, deliver_at",
        ),
    ] {
        let (status, answer, _) = post("tok-mover", "k4", &body).await;
        assert_eq!(
            (status, &answer["error"]["code"]),
            (422, &json!("invalid_request")),
            "{body}"
        );
        assert!(
            answer["error"]["message"].as_str().unwrap().contains(field),
            "{answer}"
        );
    }
    let (status, answer) = {
        let response = bearer_client("tok-canceller")
            .get(format!(
                "{}/v1/operations/{}",
                app.base,
                first["id"].as_str().unwrap()
            ))
            .send()
            .await
            .unwrap();
        (
            response.status().as_u16(),
            response.json::<Value>().await.unwrap(),
        )
    };
    assert_eq!(
        (status, &answer["error"]["code"]),
        (404, &json!("operation_not_found"))
    );
}

/// The console's task filter offers a bulk cancel of one destination,
/// stating the count in its confirmation, and shows the operation's counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_cancels_a_filtered_destination_in_bulk_stating_the_count() {
    use crate::console::{Browser, csrf_of};
    use delayline::auth::token::hash_hex;
    use delayline::auth::{ClientSettings, TokenHashes};
    let mut settings = settings();
    let prefix = settings.cascade.prefix.clone();
    settings.auth.clients = vec![ClientSettings {
        name: "ops".to_owned(),
        token_sha256: TokenHashes::One(hash_hex("tok-ops")),
        destinations: vec![format!("{prefix}.#")],
        permissions: vec!["submit".into(), "read".into(), "cancel".into()],
        ..ClientSettings::default()
    }];
    let mut app = TestApp::spawn(settings).await;
    app.http = bearer_client("tok-ops");
    let destination = format!("{prefix}.console");
    let ids = submit(&app, &destination, &[20_000; 7]).await;
    submit(&app, &format!("{prefix}.other"), &[20_000; 3]).await;

    let console = Browser::sign_in(&app, "tok-ops").await;
    let (status, page) = console
        .get(&format!("/console/tasks?destination={destination}"))
        .await;
    assert_eq!(status, 200);
    assert!(
        page.contains("Cancel the 7 matching tasks")
            && page.contains(&format!("Cancel 7 tasks to {destination}?")),
        "{page}"
    );
    let csrf = csrf_of(&page);
    let (status, location) = console
        .post(
            "/console/tasks/bulk-cancel",
            &[
                ("csrf", &csrf),
                ("destination", &destination),
                ("state", ""),
                ("due_before", ""),
            ],
            "same-origin",
        )
        .await;
    assert_eq!(status, 303, "{location}");
    assert!(location.starts_with("/console/operations/"), "{location}");
    crate::common::eventually("the operation is done", async || {
        let (_, page) = console.get(&location).await;
        page.contains("done") && page.contains(">7<")
    })
    .await;
    for id in &ids {
        let (_, task) = app.get(&format!("/v1/tasks/{id}")).await;
        assert_eq!(task["state"], "cancelled", "{task}");
    }
    let (_, other) = app
        .get(&format!(
            "/v1/tasks?destination={prefix}.other&state=scheduled"
        ))
        .await;
    assert_eq!(other["tasks"].as_array().unwrap().len(), 3);
}
