//! The task ledger against the real broker, on both backends: idempotency,
//! inspection, store-and-forward through an outage and a restart, the
//! pending bound, retention and payload copies.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::{
    Backend, Cleanup, TestApp, TestConsumer, TestUser, close_connections_named, eventually, sample,
    test_settings, with_ledger,
};
use delayline::auth::{ClientSettings, TokenHashes};
use delayline::cascade::QueueType;
use delayline::clock::parse_epoch_ms;
use serde_json::{Value, json};

/// Each test runs once on SQLite and once on PostgreSQL.
macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Backend::Postgres).await
                }
            )*
        }
    };
}

on_both_backends!(
    a_retry_is_answered_not_scheduled_and_a_different_body_is_a_conflict,
    tasks_can_be_inspected_and_listed_page_by_page,
    pending_tasks_survive_an_outage_and_a_restart_and_arrive_never_early,
    the_pending_bound_turns_into_503,
    payload_copies_are_bounded_and_delivered_rows_are_pruned,
    a_quota_counts_waiting_tasks_from_the_ledger_and_not_cancelled_ones,
);

async fn post_with_key(app: &TestApp, key: &str, body: &Value) -> (u16, Option<String>, Value) {
    let response = app
        .http
        .post(format!("{}/v1/tasks", app.base))
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, replayed, response.json().await.unwrap())
}

async fn a_retry_is_answered_not_scheduled_and_a_different_body_is_a_conflict(backend: Backend) {
    let settings = with_ledger(test_settings(4, 20, QueueType::Classic), backend);
    let mut app = TestApp::spawn(settings).await;
    let every_destination = app.cascade.binding_key("#");
    let mut consumer = TestConsumer::bind(&mut app, &every_destination).await;

    let body = json!({"destination": "once", "delay_ms": 40, "payload": {"n": 1, "m": 2}});
    let (status, replayed, first) = post_with_key(&app, "order-17", &body).await;
    assert_eq!((status, replayed), (202, None), "{first}");
    assert_eq!(first["state"], "scheduled");

    // The same request, serialised differently: the original answer, marked.
    let reordered = json!({"payload": {"m": 2, "n": 1}, "delay_ms": 40, "destination": "once"});
    let (status, replayed, again) = post_with_key(&app, "order-17", &reordered).await;
    assert_eq!((status, replayed.as_deref()), (202, Some("true")));
    // The replay answers the task as it is now: on a loaded machine the
    // 40 ms task may already be on its way out (seen in CI: `releasing`).
    let mut now = again.clone();
    let state = now["state"].take();
    assert!(
        ["scheduled", "releasing", "delivered"].contains(&state.as_str().unwrap_or("")),
        "{again}"
    );
    let mut original = first.clone();
    original["state"].take();
    assert_eq!(now, original);

    let different = json!({"destination": "once", "delay_ms": 41});
    let (status, _, conflict) = post_with_key(&app, "order-17", &different).await;
    assert_eq!(status, 409);
    assert_eq!(conflict["error"]["code"], "idempotency_conflict");

    // A client id is a key as well, in single and batch requests alike.
    let with_id = json!({"destination": "once", "delay_ms": 0, "id": "client-1"});
    let (status, first_by_id) = app.post("/v1/tasks", &with_id).await;
    assert_eq!(status, 202);
    let (status, batch) = app
        .post(
            "/v1/tasks/batch",
            &json!({"tasks": [with_id, {"destination": "once", "delay_ms": 5, "id": "client-1"}]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(batch["results"][0]["status"], 202);
    assert_eq!(batch["results"][0]["replayed"], true);
    // The original answer; its state is today's (a task due at once may
    // have passed the release stage since).
    let without_state = |task: &Value| {
        let mut task = task.clone();
        task.as_object_mut().unwrap().remove("state");
        task
    };
    assert_eq!(
        without_state(&batch["results"][0]["task"]),
        without_state(&first_by_id)
    );
    assert_eq!(batch["results"][1]["status"], 409);

    let (status, bad_key) = app
        .http
        .post(format!("{}/v1/tasks", app.base))
        .header("Idempotency-Key", "x".repeat(300))
        .json(&body)
        .send()
        .await
        .map(|r| (r.status().as_u16(), r))
        .unwrap();
    assert_eq!(status, 400);
    let bad_key: Value = bad_key.json().await.unwrap();
    assert_eq!(bad_key["error"]["code"], "invalid_idempotency_key");

    // Exactly two messages were scheduled: one per distinct request.
    let mut ids = BTreeSet::new();
    while let Some(message) = consumer.next(Duration::from_secs(2)).await {
        assert!(
            ids.insert(message.message_id()),
            "a task was delivered twice"
        );
    }
    let expected: BTreeSet<String> = [first["id"].as_str().unwrap(), "client-1"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(ids, expected);
    app.stop().await.unwrap();
}

async fn tasks_can_be_inspected_and_listed_page_by_page(backend: Backend) {
    let settings = with_ledger(test_settings(6, 100, QueueType::Classic), backend);
    let app = TestApp::spawn(settings).await;

    // Long enough delays that the cascade keeps them; the listing is by deliver_at.
    let mut expected = Vec::new();
    for (i, delay_ms) in [3000, 1000, 5000, 2000, 4000, 1000, 6000]
        .iter()
        .enumerate()
    {
        let destination = if i % 2 == 0 { "even" } else { "odd" };
        let body = json!({
            "destination": destination, "delay_ms": delay_ms,
            "payload": {"i": i}, "headers": {"attempt": 2}
        });
        let (status, accepted) = app.post("/v1/tasks", &body).await;
        assert_eq!(status, 202, "{accepted}");
        expected.push(accepted);
    }

    let (status, one) = app
        .get(&format!(
            "/v1/tasks/{}",
            expected[0]["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, 200);
    for field in [
        "id",
        "destination",
        "routing_key",
        "delay_ms",
        "deliver_at",
        "state",
    ] {
        assert_eq!(one[field], expected[0][field], "{field}");
    }
    assert_eq!(one["state"], "scheduled");
    assert_eq!(one["headers"], json!({"attempt": 2}));
    assert_eq!(one["content_type"], "application/json");
    assert_eq!(one["payload_base64"], "eyJpIjowfQ==");
    assert_eq!(one["payload_truncated"], false);
    assert_eq!(one["attempts"], 1);
    assert!(one["created_at"].is_string() && one["published_at"].is_string());

    // Three pages of at most three, in due order, each task exactly once.
    let mut seen = Vec::new();
    let mut path = "/v1/tasks?limit=3".to_owned();
    let mut pages = 0;
    loop {
        let (status, page) = app.get(&path).await;
        assert_eq!(status, 200, "{page}");
        pages += 1;
        for task in page["tasks"].as_array().unwrap() {
            let deliver_at = task["deliver_at"].as_str().unwrap();
            seen.push((
                parse_epoch_ms(deliver_at).unwrap(),
                task["id"].as_str().unwrap().to_owned(),
            ));
        }
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/tasks?limit=3&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "pages are in due order");
    let ids: BTreeSet<&str> = seen.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(ids.len(), 7);

    let (_, odd) = app.get("/v1/tasks?destination=odd").await;
    assert_eq!(odd["tasks"].as_array().unwrap().len(), 3);
    assert!(odd["next_cursor"].is_null());
    let due_before = expected[3]["deliver_at"].as_str().unwrap(); // the 2000 ms one
    let (_, soon) = app
        .get(&format!(
            "/v1/tasks?due_before={due_before}&state=scheduled"
        ))
        .await;
    assert_eq!(soon["tasks"].as_array().unwrap().len(), 2, "{soon}");
    let (_, pending) = app.get("/v1/tasks?state=pending").await;
    assert!(pending["tasks"].as_array().unwrap().is_empty());

    for (path, code) in [
        ("/v1/tasks/nope", "task_not_found"),
        ("/v1/tasks?cursor=garbage", "invalid_query"),
        ("/v1/tasks?state=sent", "invalid_query"),
        ("/v1/tasks?limit=0", "invalid_query"),
        ("/v1/tasks?due_before=soon", "invalid_query"),
        ("/v1/tasks?colour=red", "invalid_query"),
    ] {
        let (status, error) = app.get(path).await;
        assert_eq!(error["error"]["code"], code, "{path}");
        assert!(status == 400 || status == 404, "{path}: {status}");
    }
    app.stop().await.unwrap();
}

/// Cuts the service off the broker: its user loses its permissions (so it
/// cannot reconnect) and its connection is closed from the broker's side.
async fn cut_off(app: &TestApp, user: &TestUser) {
    user.revoke();
    close_connections_named(&format!("delayline {}", app.cascade.prefix()));
    eventually("the service notices it lost the broker", async || {
        let (_, ready) = app.get("/readyz").await;
        ready["broker"] == "disconnected"
    })
    .await;
}

async fn pending_tasks_survive_an_outage_and_a_restart_and_arrive_never_early(backend: Backend) {
    let user = TestUser::create();
    let mut settings = with_ledger(test_settings(5, 50, QueueType::Quorum), backend);
    settings.amqp.uri = user.uri().into();
    settings.amqp.reconnect_max_backoff_ms = 200;
    settings.amqp.confirm_timeout_ms = 1000;
    let mut app = TestApp::spawn(settings).await;
    let every_destination = app.cascade.binding_key("#");
    let mut consumer = TestConsumer::bind(&mut app, &every_destination).await;
    cut_off(&app, &user).await;

    // Accepted while the broker is away: 202 pending, and the ledger says why.
    let delays = [0, 200, 700, 1500];
    let mut ids = BTreeSet::new();
    let mut admitted_keys = Vec::new();
    for delay_ms in delays {
        let body = json!({"destination": "later", "delay_ms": delay_ms, "payload": delay_ms});
        let (status, accepted) = app.post("/v1/tasks", &body).await;
        assert_eq!(status, 202, "{accepted}");
        assert_eq!(accepted["state"], "pending");
        ids.insert(accepted["id"].as_str().unwrap().to_owned());
        if delay_ms >= 700 {
            admitted_keys.push((accepted["id"].clone(), accepted["routing_key"].clone()));
        }
    }
    let first = ids.first().unwrap().clone();
    let (_, pending) = app.get(&format!("/v1/tasks/{first}")).await;
    assert_eq!(pending["state"], "pending");
    assert!(pending["last_error"].is_string(), "{pending}");

    // A restart in between: the pending tasks are still there and the
    // service is ready to take more, with the broker still away.
    let app = app.restart().await;
    eventually("ready again without the broker", async || {
        let (status, ready) = app.get("/readyz").await;
        status == 200 && ready["broker"] == "disconnected" && ready["pending"] == 4
    })
    .await;
    let scrape = app.scrape().await;
    assert_eq!(sample(&scrape, "delayline_ledger_pending_tasks"), Some(4.0));
    assert_eq!(sample(&scrape, "delayline_broker_connected"), Some(0.0));

    user.grant();
    consumer
        .expect_each_once_never_early(ids.iter().cloned().collect(), Duration::from_secs(20))
        .await;
    eventually("every task is marked scheduled", async || {
        let (_, listing) = app.get("/v1/tasks?state=pending").await;
        listing["tasks"].as_array().unwrap().is_empty()
    })
    .await;
    // Arrived already: delivered once the release stage records it. Until
    // then a task it claimed while still pending (its forwarded copy's
    // confirm not yet recorded) keeps the error of the attempt before.
    eventually("the first task is recorded delivered", async || {
        let (_, task) = app.get(&format!("/v1/tasks/{first}")).await;
        task["state"] == "delivered"
    })
    .await;
    let (_, published) = app.get(&format!("/v1/tasks/{first}")).await;
    assert!(published["attempts"].as_u64().unwrap() >= 2);
    assert!(published["last_error"].is_null());
    // Forwarded by what remained of their delays, so through fewer units
    // than admitted with: the ledger holds the key each copy went with (the
    // resend of a stranded level picks its tasks by it).
    let units = |key: &Value| {
        let digits = key.as_str().unwrap().split('.').take(5);
        digits.fold(0u32, |units, digit| units * 2 + u32::from(digit == "1"))
    };
    for (id, admitted) in &admitted_keys {
        let (_, task) = app
            .get(&format!("/v1/tasks/{}", id.as_str().unwrap()))
            .await;
        assert!(
            units(&task["routing_key"]) < units(admitted),
            "admitted with {admitted}, now {task}"
        );
    }
    let scrape = app.scrape().await;
    let forwarded = "delayline_forwarder_tasks_total{outcome=\"published\"}";
    assert_eq!(sample(&scrape, forwarded), Some(4.0), "{scrape}");
    assert_eq!(sample(&scrape, "delayline_ledger_pending_tasks"), Some(0.0));
    app.stop().await.unwrap();
}

async fn the_pending_bound_turns_into_503(backend: Backend) {
    let user = TestUser::create();
    let mut settings = with_ledger(test_settings(3, 10, QueueType::Classic), backend);
    settings.amqp.uri = user.uri().into();
    settings.amqp.reconnect_max_backoff_ms = 200;
    settings.store.max_pending = 2;
    let app = TestApp::spawn(settings).await;
    cut_off(&app, &user).await;

    let body = json!({"destination": "d", "delay_ms": 10});
    for _ in 0..2 {
        let (status, accepted) = app.post("/v1/tasks", &body).await;
        assert_eq!((status, &accepted["state"]), (202, &json!("pending")));
    }
    let (status, full) = app.post("/v1/tasks", &body).await;
    assert_eq!(status, 503);
    assert_eq!(full["error"]["code"], "ledger_full");
    let (status, ready) = app.get("/readyz").await;
    assert_eq!(
        (status, &ready["error"]["code"]),
        (503, &json!("ledger_full"))
    );

    // Once the broker is back the backlog drains and tasks are taken again.
    user.grant();
    eventually("the backlog drains", async || {
        app.post("/v1/tasks", &body).await.1["state"] == "scheduled"
    })
    .await;
    app.stop().await.unwrap();
}

async fn payload_copies_are_bounded_and_delivered_rows_are_pruned(backend: Backend) {
    let mut settings = with_ledger(test_settings(3, 10, QueueType::Classic), backend);
    settings.store.payload_copy_bytes = 4;
    settings.store.retention_ms = 3000;
    settings.store.prune_interval_ms = 100;
    let mut app = TestApp::spawn(settings).await;
    let every_destination = app.cascade.binding_key("#");
    let mut consumer = TestConsumer::bind(&mut app, &every_destination).await;

    let body = json!({"destination": "d", "delay_ms": 0, "payload_base64": "AAECAwQFBgc="});
    let (status, accepted) = app.post("/v1/tasks", &body).await;
    assert_eq!(status, 202);
    let path = format!("/v1/tasks/{}", accepted["id"].as_str().unwrap());
    // The broker got the whole payload: the copy is only for inspection.
    let message = consumer.next(Duration::from_secs(10)).await.unwrap();
    assert_eq!(message.body, [0, 1, 2, 3, 4, 5, 6, 7]);
    // With the release stage (the default with a ledger) the whole payload
    // is kept until delivery, when a move can no longer need it.
    eventually("the delivered task keeps only its copy", async || {
        let (status, kept) = app.get(&path).await;
        status == 200 && kept["state"] == "delivered" && kept["payload_base64"] == "AAECAw=="
    })
    .await;
    let (_, kept) = app.get(&path).await;
    assert_eq!(kept["payload_bytes"], 8);
    assert_eq!(kept["payload_truncated"], true);

    eventually(
        "the delivered task is pruned after its retention",
        async || app.get(&path).await.0 == 404,
    )
    .await;
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_ledger_there_is_nothing_to_inspect() {
    let app = TestApp::spawn(test_settings(3, 10, QueueType::Classic)).await;
    for path in ["/v1/tasks/x", "/v1/tasks"] {
        let (status, error) = app.get(path).await;
        assert_eq!(
            (status, &error["error"]["code"]),
            (501, &json!("ledger_disabled"))
        );
    }
    app.stop().await.unwrap();
}

/// A client's quota, as the ledger counts it every `auth.quota_refresh_ms`:
/// its tasks not yet due, less those cancelled; nobody else's.
async fn a_quota_counts_waiting_tasks_from_the_ledger_and_not_cancelled_ones(backend: Backend) {
    let mut settings = with_ledger(test_settings(8, 100, QueueType::Quorum), backend);
    let token = delayline::auth::token::generate();
    let other = delayline::auth::token::generate();
    let client = |name: &str, token: &str, max_scheduled| ClientSettings {
        name: name.to_owned(),
        token_sha256: TokenHashes::One(delayline::auth::token::hash_hex(token)),
        destinations: vec!["#".to_owned()],
        permissions: vec!["submit".to_owned(), "cancel".to_owned()],
        max_scheduled,
        ..ClientSettings::default()
    };
    settings.auth.clients = vec![
        client("quota", &token, Some(2)),
        client("other", &other, None),
    ];
    settings.auth.quota_refresh_ms = 50;
    let app = TestApp::spawn(settings).await;
    let post = async |token: &str| {
        let response = app
            .http
            .post(format!("{}/v1/tasks", app.base))
            .bearer_auth(token)
            .json(&json!({"destination": "quota", "delay": "20s"}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap())
    };
    // Refreshes come and go meanwhile: each must find the same count.
    let refreshes = || tokio::time::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        assert_eq!(post(&other).await.0, 202);
    }
    let (status, first) = post(&token).await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(post(&token).await.0, 202);
    refreshes().await;
    let (status, body) = post(&token).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("quota_exceeded"))
    );

    let id = first["id"].as_str().unwrap();
    let cancelled = app
        .http
        .delete(format!("{}/v1/tasks/{id}", app.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 200);
    refreshes().await;
    assert_eq!(post(&token).await.0, 202);
    refreshes().await;
    let (status, body) = post(&token).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("quota_exceeded"))
    );
}

/// Two replicas' groups lock the same tasks in different orders (one claims
/// what the other marks delivered): PostgreSQL breaks one off to end the
/// deadlock. The writer runs that group again instead of answering the
/// error, so the delivered marks are made. Here the other side is a
/// transaction of the test's, made to wait longer before it looks for a
/// deadlock, so that the writer's group is the one broken off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_broken_off_by_a_deadlock_on_postgresql_is_run_again() {
    use sqlx::{Connection, Executor};
    let settings = with_ledger(test_settings(4, 20, QueueType::Classic), Backend::Postgres);
    let _cleanup = Cleanup::for_settings(&settings);
    let commits = delayline::ledger::CommitObservers::unobserved();
    let ledger = delayline::ledger::open(&settings.store, true, commits)
        .await
        .unwrap()
        .expect("a PostgreSQL ledger");
    let url = settings.store.url.expose().to_owned();
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    for id in ["a", "b"] {
        other
            .execute(&*format!(
                "INSERT INTO tasks (id, destination, routing_key, delay_ms, deliver_at_ms, \
                 content_type, headers, payload_bytes, state, created_at_ms, \
                 next_attempt_at_ms) VALUES ('{id}', 'd', '0.d', 0, 1, 't', '{{}}', 0, \
                 'releasing', 0, 0)"
            ))
            .await
            .unwrap();
    }
    // The other side holds `b`, and looks for a deadlock only after 10 s.
    other.execute("BEGIN").await.unwrap();
    other
        .execute("SET LOCAL deadlock_timeout = '10s'")
        .await
        .unwrap();
    other
        .execute("UPDATE tasks SET last_error = 'held' WHERE id = 'b'")
        .await
        .unwrap();
    let marking = tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.mark_delivered(vec!["a".into(), "b".into()], 5).await }
    });
    // The group has `a` and waits for `b`...
    let mut watcher = sqlx::PgConnection::connect(&url).await.unwrap();
    eventually("the group waits for the other side's lock", async || {
        // This ledger's writer, marking delivered, waiting for a lock (its
        // `tasks` is found through this connection's path: the test's schema).
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE 'UPDATE tasks SET state = ''delivered''%' \
             AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL \
             AND pid IN (SELECT pid FROM pg_locks WHERE relation = 'tasks'::regclass)",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        waiting > 0
    })
    .await;
    // ...and the other side now wants `a`: a deadlock, which PostgreSQL
    // ends after 1 s by breaking the group's transaction off.
    other
        .execute("UPDATE tasks SET last_error = 'held' WHERE id = 'a'")
        .await
        .unwrap();
    other.execute("COMMIT").await.unwrap();
    marking
        .await
        .unwrap()
        .expect("the group was run again, not answered with the deadlock");
    let states: Vec<(String, String)> = sqlx::query_as("SELECT id, state FROM tasks ORDER BY id")
        .fetch_all(&mut watcher)
        .await
        .unwrap();
    assert_eq!(
        states,
        [
            ("a".into(), "delivered".into()),
            ("b".into(), "delivered".into())
        ]
    );
    ledger.close().await;
}
