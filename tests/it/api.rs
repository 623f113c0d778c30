//! The HTTP API against a real broker: errors, batches, topology, health.

use std::time::Duration;

use crate::common::{
    Backend, TestApp, TestConsumer, TestUser, assert_retry_later, close_connections_named,
    connections_named, eventually, queue_depth, sample, test_settings, with_ledger,
};
use delayline::cascade::QueueType;
use serde_json::{Value, json};

/// Sends `request` as it is and reads everything until the server closes.
async fn raw_exchange(address: &str, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_request_gets_its_code_and_publishes_nothing() {
    let mut settings = test_settings(4, 10, QueueType::Classic);
    settings.http.body_limit_bytes = 4096;
    settings.http.batch_limit = 3;
    let mut app = TestApp::spawn(settings).await;
    let mut everything = TestConsumer::bind(&mut app, "#").await;

    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        (
            "/v1/tasks",
            "application/json",
            "{".into(),
            400,
            "malformed_json",
        ),
        (
            "/v1/tasks",
            "application/json",
            "".into(),
            400,
            "malformed_json",
        ),
        (
            "/v1/tasks",
            "text/plain",
            r#"{"destination":"d","delay_ms":1}"#.into(),
            415,
            "unsupported_media_type",
        ),
        (
            "/v1/tasks",
            "application/json",
            r#"{"delay_ms":1}"#.into(),
            422,
            "invalid_request",
        ),
        (
            "/v1/tasks",
            "application/json",
            r#"{"destination":"d","delay_ms":1,"extra":1}"#.into(),
            422,
            "invalid_request",
        ),
        (
            "/v1/tasks",
            "application/json",
            r#"{"destination":"d.#","delay_ms":1}"#.into(),
            422,
            "invalid_destination",
        ),
        (
            "/v1/tasks",
            "application/json",
            format!(r#"{{"destination":"{}","delay_ms":1}}"#, "d".repeat(250)),
            422,
            "invalid_destination",
        ),
        (
            "/v1/tasks",
            "application/json",
            r#"{"destination":"d"}"#.into(),
            422,
            "invalid_delay",
        ),
        (
            "/v1/tasks",
            "application/json",
            r#"{"destination":"d","delay":"1s","delay_ms":1}"#.into(),
            422,
            "invalid_delay",
        ),
        (
            "/v1/tasks",
            "application/json",
            r#"{"destination":"d","delay_ms":151}"#.into(),
            422,
            "delay_out_of_range",
        ),
        (
            "/v1/tasks",
            "application/json",
            r#"{"destination":"d","delay_ms":1,"payload_base64":"!"}"#.into(),
            422,
            "invalid_payload",
        ),
        (
            "/v1/tasks",
            "application/json",
            r#"{"destination":"d","delay_ms":1,"headers":{"x-deliver-at-ms":1}}"#.into(),
            422,
            "invalid_header",
        ),
        (
            "/v1/tasks",
            "application/json",
            r#"{"destination":"d","delay_ms":1,"id":""}"#.into(),
            422,
            "invalid_id",
        ),
        (
            "/v1/tasks",
            "application/json",
            format!(
                r#"{{"destination":"d","delay_ms":1,"payload":"{}"}}"#,
                "x".repeat(5000)
            ),
            413,
            "payload_too_large",
        ),
        (
            "/v1/tasks/batch",
            "application/json",
            r#"{"tasks":"no"}"#.into(),
            422,
            "invalid_request",
        ),
        (
            "/v1/tasks/batch",
            "application/json",
            r#"{"tasks":[1,2,3,4]}"#.into(),
            422,
            "batch_too_large",
        ),
        (
            "/v1/nothing",
            "application/json",
            "{}".into(),
            404,
            "not_found",
        ),
        // One JSON value and nothing after it.
        (
            "/v1/tasks",
            "application/json",
            r#"{"destination":"x.y","delay_ms":100,"payload":1} xyz"#.into(),
            400,
            "malformed_json",
        ),
        (
            "/v1/tasks",
            "application/json",
            r#"{"destination":"x.y","delay_ms":100,"payload":1}}}"#.into(),
            400,
            "malformed_json",
        ),
    ];
    for (path, content_type, body, status, code) in &cases {
        let response = app
            .http
            .post(format!("{}{path}", app.base))
            .header("content-type", *content_type)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), *status, "{path} {body:.80}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], *code, "{path} {body:.80}: {error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    let response = app
        .http
        .delete(format!("{}/v1/tasks", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], "method_not_allowed");
    let too_large = app
        .http
        .post(format!("{}/v1/tasks", app.base))
        .header("content-type", "application/json")
        .body("x".repeat(5000))
        .send()
        .await
        .unwrap();
    let error: Value = too_large.json().await.unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("4096 bytes"),
        "the 413 states the limit: {error}"
    );

    // What the HTTP layer refuses before any route is JSON too.
    let address = app.base.trim_start_matches("http://").to_owned();
    let long_uri = format!("/v1/tasks/{}", "a".repeat(70_000));
    for (request, status, code) in [
        (
            "POST /v1/tasks HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n".to_owned(),
            400,
            "bad_request",
        ),
        (
            format!("GET {long_uri} HTTP/1.1\r\nHost: x\r\n\r\n"),
            414,
            "uri_too_long",
        ),
    ] {
        let answer = raw_exchange(&address, request.as_bytes()).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{answer:.200}"
        );
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("content-type: application/json"), "{head}");
        let error: Value = serde_json::from_str(body).unwrap();
        assert_eq!(error["error"]["code"], code, "{error}");
    }

    // Nothing reached the broker: no level queue, the unroutable queue nor a catch-all consumer.
    assert!(everything.next(Duration::from_millis(300)).await.is_none());
    for level in 0..app.cascade.levels() {
        assert_eq!(queue_depth(&app.cascade.level_queue(level)).await, 0);
    }
    assert_eq!(queue_depth(&app.cascade.unroutable_queue()).await, 0);
    // And the service is still up.
    assert_eq!(app.get("/healthz").await.0, 200);
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_publishes_valid_tasks_and_reports_invalid_ones_in_order() {
    let mut app = TestApp::spawn(test_settings(4, 10, QueueType::Quorum)).await;
    let key = app.cascade.binding_key("batch.dest");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    let (status, response) = app
        .post(
            "/v1/tasks/batch",
            &json!({"tasks": [
                {"destination": "batch.dest", "delay_ms": 30, "id": "first", "payload": 1},
                {"destination": "batch.*", "delay_ms": 30},
                {"destination": "batch.dest", "delay_ms": 99999},
                {"destination": "batch.dest", "delay": "20ms", "id": "fourth", "payload_base64": "AP8="},
                "not an object",
            ]}),
        )
        .await;
    assert_eq!(status, 200, "{response}");
    let results = response["results"].as_array().unwrap();
    let statuses: Vec<_> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [202, 422, 422, 202, 422]);
    assert_eq!(results[0]["task"]["id"], "first");
    // 3 units of quorum queues keep it 27 ms at the least (a millisecond
    // a hop, 1 % for a clock catching up): 4 (38 ms).
    assert_eq!(results[0]["task"]["delay_ms"], 38);
    assert_eq!(results[1]["error"]["code"], "invalid_destination");
    assert_eq!(results[2]["error"]["code"], "delay_out_of_range");
    assert_eq!(results[3]["task"]["id"], "fourth");
    assert_eq!(results[4]["error"]["code"], "invalid_request");

    let mut ids = Vec::new();
    for _ in 0..2 {
        let message = consumer
            .next(Duration::from_secs(10))
            .await
            .expect("batch task delivered");
        ids.push(message.message_id());
        if ids.last().unwrap() == "fourth" {
            assert_eq!(message.body, [0, 255]);
            assert_eq!(
                message.properties.content_type().as_ref().unwrap().as_str(),
                "application/octet-stream"
            );
        }
    }
    ids.sort();
    assert_eq!(ids, ["first", "fourth"]);
    assert!(consumer.next(Duration::from_millis(300)).await.is_none());
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_tells_consumers_how_to_bind() {
    let app = TestApp::spawn(test_settings(4, 250, QueueType::Quorum)).await;
    let (status, topology) = app.get("/v1/topology").await;
    assert_eq!(status, 200);
    assert_eq!(
        topology["business_exchange"],
        app.cascade.business_exchange()
    );
    assert_eq!(topology["unroutable_queue"], app.cascade.unroutable_queue());
    assert_eq!(topology["unit_ms"], 250);
    assert_eq!(topology["levels"], 4);
    // 15 units of 250 ms, less a millisecond for each quorum level and 1 %
    // for a clock catching up.
    assert_eq!(topology["max_delay_ms"], 3708);
    assert_eq!(topology["queue_type"], "quorum");
    // Stateless, so no release stage: rounded up to the unit, nothing held.
    assert_eq!(topology["precision_ms"], 250);
    assert!(topology.get("release_lead_ms").is_none());
    assert!(topology.get("hold_limit").is_none());
    // And the digits stay in front.
    assert_eq!(topology["delivery_key"], "digits");
    assert_eq!(topology["binding_key"], "*.*.*.*.{destination}");
    let queues = topology["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 4);
    assert_eq!(queues[0]["ttl_ms"], 2000);
    assert_eq!(queues[3]["ttl_ms"], 250);
    assert_eq!(
        queues[3]["dead_letter_exchange"],
        app.cascade.business_exchange()
    );

    let (status, topology) = app.get("/v1/topology?destination=billing.invoice").await;
    assert_eq!(status, 200);
    assert_eq!(topology["binding_key"], "*.*.*.*.billing.invoice");
    let (status, error) = app.get("/v1/topology?destination=a.*").await;
    assert_eq!(status, 422);
    assert_eq!(error["error"]["code"], "invalid_destination");
    app.stop().await.unwrap();

    // The default (a ledger, so the release stage): the destination itself.
    let settings = with_ledger(test_settings(4, 250, QueueType::Quorum), Backend::Sqlite);
    let app = TestApp::spawn(settings).await;
    let (_, topology) = app.get("/v1/topology").await;
    assert_eq!(topology["delivery_key"], "destination");
    assert_eq!(topology["binding_key"], "{destination}");
    let (_, topology) = app.get("/v1/topology?destination=billing.invoice").await;
    assert_eq!(topology["binding_key"], "billing.invoice");
    app.stop().await.unwrap();
}

/// A task posted now gets 503 broker_unavailable with a Retry-After.
async fn assert_task_refused_as_unavailable(app: &TestApp) {
    let response = app
        .http
        .post(format!("{}/v1/tasks", app.base))
        .json(&json!({"destination": "d", "delay_ms": 10}))
        .send()
        .await
        .unwrap();
    assert_retry_later(response, "broker_unavailable").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_broker_means_503_and_not_ready_until_it_reconnects() {
    let user = TestUser::create();
    let mut settings = test_settings(3, 10, QueueType::Classic);
    settings.amqp.uri = user.uri().into();
    settings.amqp.reconnect_max_backoff_ms = 200;
    let app = TestApp::spawn(settings).await;

    // Cut the connection and keep the broker refusing the service until told otherwise.
    user.revoke();
    let name = format!("delayline {}", app.cascade.prefix());
    assert_eq!(close_connections_named(&name), 1);
    eventually("not ready", async || app.get("/readyz").await.0 == 503).await;
    assert_task_refused_as_unavailable(&app).await;

    // Once the broker lets it in again, the service reconnects by itself.
    user.grant();
    eventually("accepting again", async || {
        app.post("/v1/tasks", &json!({"destination": "d", "delay_ms": 10}))
            .await
            .0
            == 202
    })
    .await;
    assert_eq!(app.get("/readyz").await.0, 200);
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_and_503_while_the_broker_is_unreachable() {
    let mut settings = test_settings(3, 10, QueueType::Classic);
    settings.amqp.uri = "amqp://guest:guest@127.0.0.1:1/%2f".to_owned().into();
    let app = TestApp::start(settings).await;
    // Give the listener a moment; it answers even though the broker never will.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let health = loop {
        if let Ok(r) = app.http.get(format!("{}/healthz", app.base)).send().await {
            break r.status();
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(health, 200);
    let (status, body) = app.get("/readyz").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("not_ready"))
    );
    assert_task_refused_as_unavailable(&app).await;
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_is_a_503_and_nothing_unconfirmed_is_reported_accepted() {
    let app = TestApp::spawn(test_settings(3, 1000, QueueType::Quorum)).await;
    // Cap level 2's queue at one message: with reject-publish overflow the broker nacks the next.
    let policy = format!("{}-full", app.cascade.prefix());
    let pattern = format!("^{}$", regex_escape(&app.cascade.level_queue(2)));
    let set = crate::common::rabbitmqctl_command()
        .args([
            "-q",
            "set_policy",
            &policy,
            &pattern,
            r#"{"max-length":1}"#,
            "--apply-to",
            "queues",
        ])
        .status()
        .unwrap();
    assert!(set.success());
    let task = json!({"destination": "d", "delay_ms": 4000});
    let mut statuses = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // The policy takes effect asynchronously; publish until the broker refuses.
    while !statuses.contains(&503) {
        let (status, body) = app.post("/v1/tasks", &task).await;
        if status == 503 {
            assert_eq!(body["error"]["code"], "broker_rejected", "{body}");
        }
        statuses.push(status);
        assert!(
            tokio::time::Instant::now() < deadline,
            "never nacked: {statuses:?}"
        );
    }
    let accepted = statuses.iter().filter(|s| **s == 202).count() as u32;
    let _ = crate::common::rabbitmqctl_command()
        .args(["-q", "clear_policy", &policy])
        .status();
    assert!(accepted >= 1);
    // Quorum queues enforce the limit loosely; what matters is that every 202 was stored.
    assert_eq!(
        crate::common::queue_depth(&app.cascade.level_queue(2)).await,
        accepted
    );
    app.stop().await.unwrap();
}

fn regex_escape(name: &str) -> String {
    name.replace('.', "\\.")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_level_exchange_is_a_503_then_the_service_heals_itself() {
    let mut app = TestApp::spawn(test_settings(3, 10, QueueType::Classic)).await;
    let key = app.cascade.binding_key("heal");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    consumer
        .delete_exchange(&app.cascade.level_exchange(2))
        .await;
    let (status, body) = app
        .post("/v1/tasks", &json!({"destination": "heal", "delay_ms": 40}))
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "broker_unavailable");
    // The failed channel is reopened by the next publish, which declares the topology again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _) = app
            .post(
                "/v1/tasks",
                &json!({"destination": "heal", "delay_ms": 40, "id": "healed"}),
            )
            .await;
        if status == 202 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never healed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let message = consumer
        .next(Duration::from_secs(10))
        .await
        .expect("delivered after healing");
    assert_eq!(message.message_id().as_str(), "healed");
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_tasks_confirms_and_read_queue_depths_from_the_broker() {
    let mut settings = with_ledger(test_settings(12, 10, QueueType::Classic), Backend::Sqlite);
    settings.metrics.queue_poll_ms = 100;
    // Every level's depth is counted exactly below: no level probes
    // (delayline's own messages in the levels).
    settings.cascade.level_probe_ms = 0;
    let app = TestApp::spawn(settings).await;

    // 3000 units: the first digit set is level 11's, where it waits 20.48 s,
    // long enough to be seen there also through the management API, whose
    // counts lag by up to its statistics interval (5 s).
    let (status, _) = app
        .post(
            "/v1/tasks",
            &json!({"destination": "waits", "delay_ms": 30_000}),
        )
        .await;
    assert_eq!(status, 202);
    // Nobody is bound for this destination: it is parked at once.
    let (status, _) = app
        .post(
            "/v1/tasks",
            &json!({"destination": "nobody", "delay_ms": 0}),
        )
        .await;
    assert_eq!(status, 202);
    let retried = || {
        app.http
            .post(format!("{}/v1/tasks", app.base))
            .header("Idempotency-Key", "metrics-retry")
            .json(&json!({"destination": "nobody.either", "delay_ms": 0}))
            .send()
    };
    assert_eq!(retried().await.unwrap().status(), 202);
    assert_eq!(retried().await.unwrap().status(), 202);
    let (status, _) = app
        .post("/v1/tasks", &json!({"destination": "d", "delay_ms": -1}))
        .await;
    assert_eq!(status, 422);
    let unsupported = app
        .http
        .post(format!("{}/v1/tasks", app.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(unsupported.status(), 415);
    let (status, _) = app
        .post(
            "/v1/tasks/batch",
            &json!({"tasks": [{"destination": "nobody", "delay_ms": 0}, {"delay_ms": 1}]}),
        )
        .await;
    assert_eq!(status, 200);

    let level_series = |level: u32| {
        format!(
            "delayline_level_queue_messages{{level=\"{level}\",queue=\"{}\"}}",
            app.cascade.level_queue(level)
        )
    };
    let level11 = level_series(11);
    eventually("the depths to be polled", async || {
        let scrape = app.scrape().await;
        sample(&scrape, &level11) == Some(1.0)
            && sample(&scrape, "delayline_unroutable_queue_messages") == Some(3.0)
    })
    .await;

    let scrape = app.scrape().await;
    let expect = |series: &str, value: f64| {
        assert_eq!(
            sample(&scrape, series),
            Some(value),
            "{series} in\n{scrape}"
        );
    };
    expect("delayline_tasks_accepted_total{state=\"scheduled\"}", 4.0);
    expect("delayline_tasks_replayed_total", 1.0);
    expect(
        "delayline_tasks_rejected_total{code=\"invalid_delay\"}",
        1.0,
    );
    expect(
        "delayline_tasks_rejected_total{code=\"unsupported_media_type\"}",
        1.0,
    );
    expect(
        "delayline_tasks_rejected_total{code=\"invalid_request\"}",
        1.0,
    );
    // Four tasks published, and each of the three due at once published
    // again by the release stage (which counts them delivered, parked or not).
    let confirms = sample(&scrape, "delayline_publish_confirm_seconds_count").unwrap();
    assert!(confirms >= 7.0, "{scrape}");
    assert!(sample(&scrape, "delayline_tasks_delivered_total").unwrap() >= 3.0);
    expect("delayline_release_queue_messages", 0.0);
    expect("delayline_broker_connected", 1.0);
    expect("delayline_ledger_pending_tasks", 0.0);
    for level in 0..11 {
        expect(&level_series(level), 0.0);
    }
    let groups = sample(&scrape, "delayline_ledger_commit_group_size_count").unwrap();
    assert!(groups >= 1.0, "{scrape}");
    assert!(sample(&scrape, "delayline_queue_depth_polled_timestamp_seconds").unwrap() > 1.7e9);

    // The poller borrows the publisher's connection. A queue deleted by hand
    // makes its passive declare fail, which closes the poller's channel but
    // must not cost the publisher its connection.
    let publisher = format!("delayline {}", app.cascade.prefix());
    let connected_since = connections_named(&publisher, "connected_at");
    assert_eq!(connected_since.len(), 1);
    let level6 = level_series(6);
    assert!(
        sample(&app.scrape().await, &level6).is_some(),
        "level 6 is polled"
    );
    delete_queue(&app.cascade.level_queue(6)).await;
    eventually("the deleted queue to leave the metrics", async || {
        sample(&app.scrape().await, &level6).is_none()
    })
    .await;
    let (status, _) = app
        .post("/v1/tasks", &json!({"destination": "after", "delay_ms": 0}))
        .await;
    assert_eq!(status, 202);
    assert_eq!(
        connections_named(&publisher, "connected_at"),
        connected_since
    );
}

async fn delete_queue(queue: &str) {
    let connection = delayline::broker::connect(crate::common::amqp_uri(), "delayline test")
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_delete(queue.into(), Default::default())
        .await
        .unwrap();
    let _ = connection.close(200, "deleted".into()).await;
}

/// What the README's reference says of inputs a new user tried, on the
/// default configuration (SQLite ledger, quorum queues).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_match_the_reference_for_the_inputs_users_tried() {
    let settings = with_ledger(test_settings(8, 10, QueueType::Quorum), Backend::Sqlite);
    let mut app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("#");
    let mut everything = TestConsumer::bind(&mut app, &key).await;
    let post = async |body: &str, content_type: &str, key: Option<&str>| {
        let mut request = app
            .http
            .post(format!("{}/v1/tasks", app.base))
            .header("content-type", content_type)
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (
            status,
            response.json::<Value>().await.unwrap_or(Value::Null),
        )
    };
    let task = |extra: Value| {
        let mut task = json!({"destination": "ref", "delay_ms": 0});
        task.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        task
    };

    // `"payload": null` is JSON, delivered as its bytes.
    let null_payload = task(json!({"payload": null})).to_string();
    let (status, accepted) = post(&null_payload, "application/json", None).await;
    assert_eq!(status, 202, "{accepted}");
    let delivered = everything.next(Duration::from_secs(10)).await.unwrap();
    assert_eq!(delivered.body, b"null");
    assert_eq!(
        delivered
            .properties
            .content_type()
            .as_ref()
            .unwrap()
            .as_str(),
        "application/json"
    );
    // Every time an answer gives has three digits of milliseconds.
    let deliver_at = accepted["deliver_at"].as_str().unwrap();
    assert!(
        deliver_at.len() == 24 && deliver_at.ends_with('Z') && deliver_at.as_bytes()[19] == b'.',
        "{deliver_at}"
    );

    let cases: Vec<(String, &str, Option<&str>, u16, &str)> = vec![
        (
            task(json!({"content_type": "not a type"})).to_string(),
            "application/json",
            None,
            422,
            "invalid_payload",
        ),
        (
            task(json!({"content_type": "a\u{0}b"})).to_string(),
            "application/json",
            None,
            422,
            "invalid_payload",
        ),
        (
            task(json!({"content_type": "a/b\r\nX: y"})).to_string(),
            "application/json",
            None,
            422,
            "invalid_payload",
        ),
        (
            task(json!({"content_type": "é/é"})).to_string(),
            "application/json",
            None,
            422,
            "invalid_payload",
        ),
        (
            r#"{"destination": "ref", "delay_ms": 0, "headers": {"n": 18446744073709551616}}"#
                .to_owned(),
            "application/json",
            None,
            422,
            "invalid_header",
        ),
        (
            task(json!({})).to_string(),
            "application/json; charset=latin1",
            None,
            415,
            "unsupported_media_type",
        ),
        (
            task(json!({})).to_string(),
            "application/json",
            Some("a b"),
            400,
            "invalid_idempotency_key",
        ),
    ];
    for (body, content_type, key, status, code) in cases {
        let (got, answer) = post(&body, content_type, key).await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}"
        );
    }
    // Refused means never published.
    assert!(everything.next(Duration::from_millis(300)).await.is_none());

    // The same id twice in one batch: one task, and the repeat gets its answer.
    let twice = json!({"tasks": [task(json!({"id": "twice"})), task(json!({"id": "twice"}))]});
    let (status, batch) = app.post("/v1/tasks/batch", &twice).await;
    assert_eq!(status, 200);
    let results = batch["results"].as_array().unwrap();
    assert_eq!(results[0]["status"], 202);
    assert_eq!(
        (&results[1]["status"], &results[1]["replayed"]),
        (&json!(202), &json!(true))
    );
    assert_eq!(results[1]["task"], results[0]["task"], "{batch}");
    let (_, stored) = app.get("/v1/tasks/twice").await;
    // Due at once: by now it may have passed the release stage.
    assert!(
        ["scheduled", "releasing", "delivered"].contains(&stored["state"].as_str().unwrap()),
        "{stored}"
    );
    let arrived = everything.next(Duration::from_secs(10)).await.unwrap();
    assert_eq!(arrived.message_id(), "twice");
    assert!(everything.next(Duration::from_millis(300)).await.is_none());
    // Another body under the same id in one batch is a conflict.
    let clash = json!({"tasks": [task(json!({"id": "clash"})), task(json!({"id": "clash", "delay_ms": 5}))]});
    let (_, batch) = app.post("/v1/tasks/batch", &clash).await;
    assert_eq!(batch["results"][1]["error"]["code"], "idempotency_conflict");
    // A batch is not keyed as a whole.
    let response = app
        .http
        .post(format!("{}/v1/tasks/batch", app.base))
        .header("idempotency-key", "whole-batch")
        .json(&json!({"tasks": [task(json!({}))]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], "invalid_idempotency_key");

    // The last page has no next_cursor at all.
    let (_, page) = app.get("/v1/tasks?limit=1000").await;
    assert!(page.get("next_cursor").is_none(), "{page}");
    let (_, page) = app.get("/v1/tasks?limit=1").await;
    assert!(page["next_cursor"].is_string(), "{page}");
    app.stop().await.unwrap();
}

/// Every 4xx names where (a JSON pointer), what was wrong and what is
/// accepted; command errors say each cause once, in plain words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_messages_name_the_field_what_was_wrong_and_what_is_accepted() {
    let settings = with_ledger(test_settings(8, 10, QueueType::Quorum), Backend::Sqlite);
    let app = TestApp::spawn(settings.clone()).await;
    let post_raw = async |path: &str, body: &str| {
        let response = app
            .http
            .post(format!("{}{path}", app.base))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap())
    };
    let cases: [(&str, &str, u16, &str, &[&str]); 5] = [
        (
            "/v1/tasks",
            "[1]",
            422,
            "invalid_request",
            &["the body: got an array, expected a task"],
        ),
        (
            "/v1/tasks/batch",
            r#"[{"destination": "d", "delay_ms": 0}]"#,
            422,
            "invalid_request",
            &["the body: got an array, expected a batch: {\"tasks\": [task, …]}"],
        ),
        (
            "/v1/tasks",
            r#"{"destination": "d", "delay_ms": 99999999999999999999}"#,
            422,
            "delay_out_of_range",
            &["/delay_ms: 1e+20 is longer than any delay"],
        ),
        (
            "/v1/tasks",
            r#"{"destination": 5, "delay_ms": 0}"#,
            422,
            "invalid_request",
            &["/destination: got integer \"5\", expected a string: words of"],
        ),
        (
            "/v1/tasks",
            r#"{"destination": "d", "delay_msec": 0}"#,
            422,
            "invalid_request",
            &[
                "/delay_msec: unknown field \"delay_msec\"",
                "delay_ms, delay, deliver_at",
            ],
        ),
    ];
    for (path, body, status, code, says) in cases {
        let (got, answer) = post_raw(path, body).await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap();
        for words in says {
            assert!(message.contains(words), "{message:?} lacks {words:?}");
        }
        assert!(!message.contains("line 1 column"), "{message}");
    }
    // In a batch, the pointer reaches into the request, not into the item.
    let (_, batch) = post_raw(
        "/v1/tasks/batch",
        r#"{"tasks": [{"destination": "d", "delay_ms": 0}, {"destination": "d", "delay_msec": 1}]}"#,
    )
    .await;
    let message = batch["results"][1]["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("/tasks/1/delay_msec: unknown field"),
        "{message}"
    );
    // So do the checks after parsing: the field, what was wrong, what is accepted.
    let (_, batch) = post_raw(
        "/v1/tasks/batch",
        r#"{"tasks": [{"destination": "d", "delay": "soon"}, {"destination": "d", "delay_ms": 0, "headers": {"CC": "x"}}, {"destination": "d.#", "delay_ms": 0}]}"#,
    )
    .await;
    let said = |i: usize| {
        batch["results"][i]["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(
        said(0).starts_with("/tasks/0/delay: \"soon\" is not a duration such as \"90s\""),
        "{}",
        said(0)
    );
    assert!(
        said(1).starts_with("/tasks/1/headers/CC: reserved"),
        "{}",
        said(1)
    );
    assert!(said(2).starts_with("/tasks/2/destination: "), "{}", said(2));
    app.stop().await.unwrap();

    // A setting with a value it cannot have says which values it can.
    let refused = crate::common::delayline_command(&settings, &["provision", "--dry-run"])
        .env("DELAYLINE__CASCADE__QUEUE_TYPE", "stream")
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let output = String::from_utf8_lossy(&refused.stderr);
    assert!(
        output
            .contains("queue_type must be \"quorum\" (the default) or \"classic\", got \"stream\""),
        "{output}"
    );
    assert!(!output.contains("variant"), "{output}");

    // Each cause once; a URL without a password shows none.
    let mut missing_db = settings.clone();
    missing_db.store.url = "postgres://postgres@127.0.0.1:5432/no_such_database"
        .to_owned()
        .into();
    let (ok, output) = crate::common::run_delayline(&missing_db, &["migrate"]).await;
    assert!(!ok);
    assert_eq!(output.matches("does not exist").count(), 1, "{output}");
    assert!(
        output.contains("postgres://postgres@127.0.0.1:5432/no_such_database"),
        "{output}"
    );
    let mut closed = settings;
    closed.store.url = (format!(
        "postgres://postgres@127.0.0.1:{}/test",
        crate::common::free_port()
    ))
    .into();
    let (ok, output) = crate::common::run_delayline(&closed, &["migrate"]).await;
    assert!(!ok);
    assert!(
        output.to_lowercase().contains("connection refused"),
        "{output}"
    );
    assert_eq!(
        output.to_lowercase().matches("connection refused").count(),
        1,
        "{output}"
    );
}
