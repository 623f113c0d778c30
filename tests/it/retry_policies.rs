//! Retry policies set at run time: over the API, the CLI and the console,
//! kept in the ledger, in force at once on the replica that took the change
//! and within a second on the others, beside the configuration's (which
//! they cannot take over); who changed what is kept; `give_up_after` parks a
//! message that kept failing; a SIGKILL loses no policy, and the retries
//! taken in around it are applied the stored policy.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use delayline::config::Settings;
use delayline::ingress::RetrySettings;
use delayline::message::REFUSAL_CODE_HEADER;
use lapin::BasicProperties;
use serde_json::{Value, json};

use crate::common::{
    Backend, Cleanup, TestApp, TestConsumer, cli_as, eventually, free_port, spawn_binary,
    wait_connected_at,
};
use crate::console::{Browser, client, csrf_of};
use crate::retries::{
    Worker, attempt_of, count_and_ack, dead_letters_to, dead_letters_under, declare_named,
    declare_queue, policy, publish, reject_all, settings_on, settings_with, text,
};

/// `method path` with `body` as the client holding `token`: its status and
/// JSON answer.
async fn call(
    app: &TestApp,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = app
        .http
        .request(method, format!("{}{path}", app.base))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

/// The names of the policies `GET /v1/retries` shows, with their source.
fn sources(retries: &Value) -> Vec<(String, String)> {
    let policies = retries["policies"].as_array().unwrap();
    let field = |p: &Value, name: &str| p[name].as_str().unwrap_or("?").to_owned();
    policies
        .iter()
        .map(|p| (field(p, "name"), field(p, "source")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_set_at_run_time_retries_and_parks_is_refused_what_it_cannot_take_and_is_kept() {
    let mut settings = settings_with(vec![policy(&["configured"])]);
    settings.auth.clients = vec![client("ops", &["admin"]), client("viewer", &["read"])];
    let mut app = TestApp::spawn(settings.clone()).await;
    let prefix = app.cascade.prefix().to_owned();
    let arguments = dead_letters_to(&app, &[]);
    let queue = declare_queue(&mut app, "runtime", arguments).await;
    let configured = format!("{prefix}.configured");
    let mut worker = Worker::on(&queue).await;

    // Set with the CLI, as client ops.
    let set = [
        "retries",
        "set",
        "late",
        "--queue",
        &queue,
        "--initial",
        "100ms",
        "--max-delay",
        "1s",
        "--jitter",
        "0",
        "--max-attempts",
        "2",
    ];
    let line = cli_as(&settings, &app.base, "tok-ops", &set).await;
    assert!(
        line.contains("late\t") && line.contains("\tapi\tops\t"),
        "{line}"
    );
    let (_, retries) = call(&app, "tok-ops", reqwest::Method::GET, "/v1/retries", None).await;
    let expected = [("work", "configuration"), ("late", "api")];
    let expected: Vec<(String, String)> =
        expected.map(|(n, s)| (n.to_owned(), s.to_owned())).to_vec();
    assert_eq!(sources(&retries), expected, "{retries}");
    assert_eq!(retries["policies"][1]["changed_by"], "ops");
    assert_eq!(retries["settable"], true);

    // In force at once: back after at least 100 ms as attempt 2, then parked.
    publish(&queue, b"once", BasicProperties::default()).await;
    let (rejected_at, _) = reject_all(&mut worker, 1).await.remove(0);
    let (back_at, delivery) = worker.next(Duration::from_secs(10)).await.expect("retried");
    assert!(back_at >= rejected_at + 100, "never early");
    assert_eq!(attempt_of(&delivery), Some(2));
    delivery
        .reject(lapin::options::BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    let parked = format!("/v1/parked?queue={queue}");
    eventually("parked after its two attempts", async || {
        let (_, list) = call(&app, "tok-ops", reqwest::Method::GET, &parked, None).await;
        list["parked"][0]["policy"] == "late"
    })
    .await;

    // What it cannot take is refused, and changes nothing.
    let refusals = [
        (
            "other",
            json!({"queues": [configured], "max_delay": "1s"}),
            409,
            "retry_queue_taken",
        ),
        (
            "other",
            json!({"queues": [queue], "max_delay": "1s"}),
            409,
            "retry_queue_taken",
        ),
        (
            "work",
            json!({"queues": ["x"], "max_delay": "1s"}),
            409,
            "retry_policy_configured",
        ),
        (
            "bad",
            json!({"queues": ["x"], "max_attempts": 0}),
            422,
            "invalid_retry_policy",
        ),
        (
            "bad",
            json!({"queues": ["x"], "give_up_after": "soon"}),
            422,
            "invalid_retry_policy",
        ),
        (
            "bad",
            json!({"queues": ["x"], "name": "other"}),
            422,
            "invalid_retry_policy",
        ),
        (
            "bad",
            json!({"queues": ["x"], "backoff": 2}),
            422,
            "invalid_request",
        ),
        (
            "sp ace",
            json!({"queues": ["x"], "max_delay": "1s"}),
            422,
            "invalid_retry_policy",
        ),
    ];
    for (name, body, status, code) in refusals {
        let path = format!("/v1/retries/policies/{}", name.replace(' ', "%20"));
        let answer = call(&app, "tok-ops", reqwest::Method::PUT, &path, Some(body)).await;
        assert_eq!(
            (answer.0, &answer.1["error"]["code"]),
            (status, &json!(code)),
            "{name}: {}",
            answer.1
        );
    }
    let as_viewer = call(
        &app,
        "tok-viewer",
        reqwest::Method::PUT,
        "/v1/retries/policies/v",
        Some(json!({"queues": ["y"]})),
    )
    .await;
    assert_eq!(as_viewer.0, 403);
    let (_, after) = call(&app, "tok-ops", reqwest::Method::GET, "/v1/retries", None).await;
    assert_eq!(sources(&after), expected, "nothing changed: {after}");

    // The console changes it (in force at once) and removes it; the queue's
    // dead letters are refused then.
    let ops = Browser::sign_in(&app, "tok-ops").await;
    let page = ops.get("/console/retries").await.1;
    assert!(
        page.contains(">late</td>") && page.contains(">configuration</td>"),
        "{page}"
    );
    let csrf = csrf_of(&page);
    let form = [
        ("csrf", csrf.as_str()),
        ("name", "late"),
        ("queues", queue.as_str()),
        ("initial", "100ms"),
        ("max_delay", "1s"),
        ("max_attempts", "3"),
        ("give_up_after", "10m"),
    ];
    let (status, location) = ops.post("/console/retries", &form, "same-origin").await;
    assert_eq!(status, 303, "{location}");
    assert!(location.contains("done="), "{location}");
    let (_, late) = call(
        &app,
        "tok-ops",
        reqwest::Method::GET,
        "/v1/retries/policies/late",
        None,
    )
    .await;
    assert_eq!(
        (
            late["max_attempts"].clone(),
            late["give_up_after_ms"].clone()
        ),
        (json!(3), json!(600_000))
    );
    let viewer = Browser::sign_in(&app, "tok-viewer").await;
    assert_eq!(viewer.get("/console/retries").await.0, 403);
    let (status, location) = ops
        .post(
            "/console/retries/late/remove",
            &[("csrf", &csrf)],
            "same-origin",
        )
        .await;
    assert_eq!(status, 303, "{location}");
    assert!(location.contains("removed"), "{location}");
    let refused_queue = format!("{prefix}.retry.refused");
    let mut refused = TestConsumer::existing(&refused_queue).await;
    publish(&queue, b"orphan", BasicProperties::default()).await;
    reject_all(&mut worker, 1).await;
    let copy = refused
        .next(Duration::from_secs(10))
        .await
        .expect("refused");
    assert_eq!(
        copy.header(REFUSAL_CODE_HEADER).cloned(),
        Some(text("no_retry_policy"))
    );
    let gone = call(
        &app,
        "tok-ops",
        reqwest::Method::DELETE,
        "/v1/retries/policies/late",
        None,
    )
    .await;
    assert_eq!(
        (gone.0, &gone.1["error"]["code"]),
        (404, &json!("retry_policy_not_found"))
    );
    let configured_one = call(
        &app,
        "tok-ops",
        reqwest::Method::DELETE,
        "/v1/retries/policies/work",
        None,
    )
    .await;
    assert_eq!(configured_one.0, 409);

    // Who changed what, newest first, over the API and the CLI.
    let (_, changes) = call(
        &app,
        "tok-ops",
        reqwest::Method::GET,
        "/v1/retries/changes",
        None,
    )
    .await;
    let seen: Vec<(&str, &str, &str)> = changes["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let field = |name| c[name].as_str().unwrap_or("?");
            (field("policy"), field("change"), field("changed_by"))
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("late", "removed", "ops"),
            ("late", "changed", "ops"),
            ("late", "created", "ops")
        ]
    );
    assert_eq!(changes["changes"][1]["settings"]["max_attempts"], 3);
    let printed = cli_as(&settings, &app.base, "tok-ops", &["retries", "changes"]).await;
    assert_eq!(
        printed.lines().filter(|l| l.contains("\tlate\t")).count(),
        3,
        "{printed}"
    );
}

/// `give_up_after`: a message that keeps failing is parked once its next
/// retry would come back later than that from its first failure, with
/// attempts left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_up_after_parks_a_message_that_kept_failing_with_attempts_left() {
    let mut app = TestApp::spawn(settings_with(Vec::new())).await;
    let arguments = dead_letters_to(&app, &[]);
    let queue = declare_queue(&mut app, "stubborn", arguments).await;
    let body = json!({"queues": [queue], "initial": "300ms", "multiplier": 2, "max_delay": "2s",
                      "jitter": 0, "max_attempts": 10, "give_up_after": "2s"});
    let (status, set) = app.put("/v1/retries/policies/stubborn", &body).await;
    assert_eq!(status, 201, "{set}");
    assert_eq!(set["give_up_after_ms"], 2000);
    let mut worker = Worker::on(&queue).await;
    publish(&queue, b"stubborn", BasicProperties::default()).await;
    // Fails at 0, back at 300 ms, fails; back at 900 ms or so, fails; the
    // next would be back at 2.1 s at the earliest, past 2 s: parked after 3
    // attempts of 10.
    let seen = reject_all(&mut worker, 3).await;
    let attempts: Vec<Option<i64>> = seen.iter().map(|(_, d)| attempt_of(d)).collect();
    assert_eq!(attempts, [None, Some(2), Some(3)]);
    let path = format!("/v1/parked?queue={queue}");
    eventually("parked with attempts left", async || {
        app.get(&path).await.1["parked"][0]["attempts"] == 3
    })
    .await;
    assert!(
        worker.next(Duration::from_millis(1_500)).await.is_none(),
        "no fourth attempt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_postgresql_take_each_change_within_a_second() {
    let settings = settings_on(Backend::Postgres, Vec::new());
    let mut first = TestApp::spawn(settings.clone()).await;
    let second = TestApp::start_sharing(settings.clone()).await;
    second.wait_ready().await;
    let arguments = dead_letters_to(&first, &[]);
    let queue = declare_queue(&mut first, "shared", arguments).await;
    let in_force_on_second = async |max_attempts: Option<u64>| {
        let (_, retries) = second.get("/v1/retries").await;
        let found = retries["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "shared");
        found.map(|p| p["max_attempts"].as_u64().unwrap()) == max_attempts
    };
    let versions = [
        (
            reqwest::Method::PUT,
            json!({"queues": [queue], "initial": "100ms", "max_delay": "1s",
                                      "jitter": 0, "max_attempts": 3}),
            Some(3),
        ),
        (
            reqwest::Method::PUT,
            json!({"queues": [queue], "initial": "100ms", "max_delay": "1s",
                                      "jitter": 0, "max_attempts": 2}),
            Some(2),
        ),
    ];
    for (method, body, expected) in versions {
        let url = format!("{}/v1/retries/policies/shared", first.base);
        let started = Instant::now();
        let answer = first
            .http
            .request(method, url)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success());
        eventually("the other replica takes the change", async || {
            in_force_on_second(expected).await
        })
        .await;
        // The bound is a second; the margin is for two loaded cores.
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }

    // Both replicas take dead letters in: each applies the stored policy.
    let mut worker = Worker::on(&queue).await;
    for n in 0..20 {
        let properties = BasicProperties::default().with_message_id(format!("m-{n}").into());
        publish(&queue, b"shared", properties).await;
    }
    reject_all(&mut worker, 20).await;
    let mut back: HashMap<String, u32> = HashMap::new();
    while back.len() < 20 {
        let (_, delivery) = worker.next(Duration::from_secs(15)).await.expect("retried");
        assert_eq!(attempt_of(&delivery), Some(2));
        count_and_ack(&mut back, delivery).await;
    }

    // Removed on the second, gone from the first within the bound too.
    let (status, _) = second.delete("/v1/retries/policies/shared").await;
    assert_eq!(status, 204);
    eventually("the first replica takes the removal", async || {
        first.get("/v1/retries").await.1["policies"]
            .as_array()
            .unwrap()
            .is_empty()
    })
    .await;
    let (_, changes) = first.get("/v1/retries/changes").await;
    assert_eq!(changes["changes"].as_array().unwrap().len(), 3, "{changes}");
    drop(second);
}

/// A policy stored before a SIGKILL is in force after it, before the first
/// dead letter is taken in: what was rejected around the kill comes back,
/// none refused for want of its policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_set_at_run_time_outlives_a_sigkill_and_covers_what_was_taken_in_around_it() {
    let settings: Settings = settings_with(Vec::new());
    let prefix = settings.cascade.prefix.clone();
    let mut cleanup = Cleanup::for_settings(&settings);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut child = spawn_binary(&settings, port);
    wait_connected_at(&http, &base).await;
    let queue = format!("{prefix}.killed");
    declare_named(&mut cleanup, &queue, dead_letters_under(&prefix, &[])).await;
    let body = RetrySettings {
        name: "kept".into(),
        queues: vec![queue.clone()],
        ..policy(&[])
    };
    let body = serde_json::to_value(&body).unwrap();
    let answer = http
        .put(format!("{base}/v1/retries/policies/kept"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);

    const SENT: usize = 200;
    for n in 0..SENT {
        let properties = BasicProperties::default().with_message_id(format!("k-{n}").into());
        publish(&queue, b"k", properties).await;
    }
    let mut worker = Worker::on(&queue).await;
    reject_all(&mut worker, SENT).await;
    child.kill().await.unwrap();
    let mut child = spawn_binary(&settings, port);
    wait_connected_at(&http, &base).await;
    let refused_queue = format!("{prefix}.retry.refused");
    let mut refused = TestConsumer::existing(&refused_queue).await;
    let mut back: HashMap<String, u32> = HashMap::new();
    while back.len() < SENT {
        let (_, delivery) = worker
            .next(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("{} never came back", SENT - back.len()));
        assert_eq!(attempt_of(&delivery), Some(2));
        count_and_ack(&mut back, delivery).await;
    }
    assert!(
        refused.next(Duration::from_millis(500)).await.is_none(),
        "none refused"
    );
    let listed: Value = http
        .get(format!("{base}/v1/retries"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["policies"][0]["name"], "kept");
    assert_eq!(listed["policies"][0]["source"], "api");
    child.kill().await.unwrap();
}
