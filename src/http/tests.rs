//! The router without a broker: validation, error mapping, idempotency and
//! readiness rules, through `tower::ServiceExt::oneshot` against a scripted
//! [`Broker`]. What only a broker can show (confirms, delivery, timing) is in
//! `tests/it`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::{AppState, router};
use crate::broker::{BrokerProblem, BrokerStatus, PublishError, Published};
use crate::cascade::{Cascade, QueueType};
use crate::http::HttpSettings;
use crate::ledger;
use crate::ledger::StoreSettings;
use crate::message::Message;
use crate::metrics::Metrics;
use crate::scheduler::{Broker, PublishAlone, Scheduler, SchedulerSettings};

/// A broker that answers publishes as the test scripted, and keeps what it took.
#[derive(Default)]
struct ScriptedBroker {
    status: Mutex<BrokerStatus>,
    /// Answers to the next publishes, in order; confirmed once exhausted.
    answers: Mutex<VecDeque<PublishError>>,
    /// Properties (headers included) larger than this do not fit.
    properties_limit: Option<usize>,
    published: Mutex<Vec<Message>>,
}

impl ScriptedBroker {
    fn ready() -> Self {
        let broker = ScriptedBroker::default();
        *broker.status.lock().unwrap() = BrokerStatus {
            ready: true,
            node: Some("amqp://test".into()),
            blocked: None,
            problem: None,
            sessions: 1,
        };
        broker
    }

    fn then_fail(self, error: PublishError) -> Self {
        self.answers.lock().unwrap().push_back(error);
        self
    }

    fn published(&self) -> usize {
        self.published.lock().unwrap().len()
    }
}

impl Broker for ScriptedBroker {
    fn status(&self) -> BrokerStatus {
        self.status.lock().unwrap().clone()
    }

    fn check_fits(&self, message: &Message) -> Result<(), PublishError> {
        let size = crate::broker::content_header_frame_size(&message.properties);
        match self.properties_limit {
            Some(limit) if size > limit => Err(PublishError::TooLarge { size, limit }),
            _ => Ok(()),
        }
    }

    fn publish_bounded(&self, message: Message) -> BoxFuture<'_, Result<Published, PublishError>> {
        let answer = self.answers.lock().unwrap().pop_front();
        async move {
            match answer {
                Some(error) => Err(error),
                None => {
                    self.published.lock().unwrap().push(message);
                    Ok(Published::Confirmed)
                }
            }
        }
        .boxed()
    }

    fn isolated(&self) -> Box<dyn PublishAlone> {
        unimplemented!("the forwarder does not run in these tests")
    }

    fn exchange_exists<'a>(&'a self, _name: &'a str) -> BoxFuture<'a, Result<bool, PublishError>> {
        unimplemented!("the release stage does not run in these tests")
    }

    /// Every queue exists but those whose name starts with `missing`.
    fn queue_depth<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, PublishError>> {
        let depth = (!name.starts_with("missing")).then_some(0);
        async move { Ok(depth) }.boxed()
    }

    fn consume(
        &self,
        _queue: String,
        _limits: crate::broker::ConsumeLimits,
        _shutdown: tokio_util::sync::CancellationToken,
    ) -> crate::broker::Windows {
        unimplemented!("the release stage does not run in these tests")
    }

    fn consume_own(
        &self,
        _queue: String,
        _limits: crate::broker::ConsumeLimits,
        _shutdown: tokio_util::sync::CancellationToken,
    ) -> crate::broker::Windows {
        unimplemented!("the level probes do not run in these tests")
    }
}

struct Harness {
    app: Router,
    broker: Arc<ScriptedBroker>,
    _data: Option<TempDir>,
}

/// A directory removed when dropped.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cascade() -> Arc<Cascade> {
    Arc::new(crate::cascade::for_tests(12, 100, QueueType::Quorum))
}

/// A scheduler without a ledger, on `broker`.
fn stateless_scheduler(broker: Arc<ScriptedBroker>, metrics: Arc<Metrics>) -> Scheduler {
    let tracer = crate::telemetry::TaskTracer::off();
    Scheduler::new(broker, None, cascade(), metrics, settings(), tracer)
}

fn settings() -> SchedulerSettings {
    SchedulerSettings {
        confirm_timeout: Duration::from_secs(1),
        misconfiguration_grace: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        prune_every: Duration::from_secs(3600),
        resend_after: Duration::from_secs(60),
        schedule_lead: Duration::from_secs(30),
        schedule_poll: Duration::from_secs(1),
        schedule_plan_rate: 2_500,
    }
}

fn app(scheduler: Scheduler, metrics: Arc<Metrics>) -> Router {
    app_with(scheduler, metrics, crate::auth::Authenticator::open())
}

fn app_with(
    scheduler: Scheduler,
    metrics: Arc<Metrics>,
    auth: crate::auth::Authenticator,
) -> Router {
    let http = HttpSettings {
        batch_limit: 3,
        ..HttpSettings::default()
    };
    let auth = Arc::new(auth);
    router(
        AppState::new(scheduler, metrics, &http, auth),
        &http,
        crate::http::MetricsRoute::WithApi,
        true,
    )
}

/// Without a ledger.
fn stateless(broker: ScriptedBroker) -> Harness {
    let broker = Arc::new(broker);
    let metrics = Arc::new(Metrics::new());
    let scheduler = stateless_scheduler(broker.clone(), metrics.clone());
    Harness {
        app: app(scheduler, metrics),
        broker,
        _data: None,
    }
}

/// With the default ledger (SQLite), in a directory of its own.
async fn with_ledger(broker: ScriptedBroker) -> Harness {
    with_ledger_on(broker, cascade()).await
}

/// With the default ledger and the release stage, as the default
/// configuration runs (the stage itself does not run: no broker here).
async fn with_release_stage(broker: ScriptedBroker) -> Harness {
    with_ledger_on(broker, release_stage_cascade()).await
}

/// Twelve levels of 100 ms with the release stage on, as the default
/// configuration runs.
fn release_stage_cascade() -> Arc<Cascade> {
    let cascade = crate::cascade::CascadeSettings {
        levels: 12,
        unit_ms: 100,
        prefix: "t".into(),
        business_exchange: Some("biz".into()),
        release_stage: Some(true),
        ..crate::cascade::CascadeSettings::default()
    }
    .validate()
    .unwrap();
    Arc::new(cascade)
}

async fn with_ledger_on(broker: ScriptedBroker, cascade: Arc<Cascade>) -> Harness {
    with_ledger_and_auth(broker, cascade, crate::auth::Authenticator::open()).await
}

async fn with_ledger_and_auth(
    broker: ScriptedBroker,
    cascade: Arc<Cascade>,
    auth: crate::auth::Authenticator,
) -> Harness {
    let dir = std::env::temp_dir().join(format!("delayline-http-{}", uuid::Uuid::new_v4()));
    let store = StoreSettings {
        data_dir: dir.display().to_string(),
        ..StoreSettings::default()
    };
    let ledger = ledger::open(
        &store,
        cascade.release_stage(),
        ledger::CommitObservers::unobserved(),
    )
    .await
    .unwrap()
    .unwrap();
    let broker = Arc::new(broker);
    let metrics = Arc::new(Metrics::new());
    let scheduler = Scheduler::new(
        broker.clone(),
        Some(ledger),
        cascade,
        metrics.clone(),
        settings(),
        crate::telemetry::TaskTracer::off(),
    );
    Harness {
        app: app_with(scheduler, metrics, auth),
        broker,
        _data: Some(TempDir(dir)),
    }
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    text: String,
    body: Value,
}

impl Answer {
    fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or_default()
    }
}

impl Harness {
    async fn call(&self, request: Request<Body>) -> Answer {
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Answer {
            status,
            headers,
            text,
            body,
        }
    }

    async fn post(&self, path: &str, body: &str, key: Option<&str>) -> Answer {
        let mut request = Request::post(path).header("content-type", "application/json");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        self.call(request.body(Body::from(body.to_owned())).unwrap())
            .await
    }

    async fn get(&self, path: &str) -> Answer {
        self.call(Request::get(path).body(Body::empty()).unwrap())
            .await
    }

    async fn delete(&self, path: &str) -> Answer {
        self.call(Request::delete(path).body(Body::empty()).unwrap())
            .await
    }

    async fn patch(&self, path: &str, body: &str, key: Option<&str>) -> Answer {
        let mut request = Request::patch(path).header("content-type", "application/json");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        self.call(request.body(Body::from(body.to_owned())).unwrap())
            .await
    }

    /// The revision header of the `index`th message published.
    fn published_revision(&self, index: usize) -> Option<i64> {
        let published = self.broker.published.lock().unwrap();
        let headers = published.get(index)?.properties.headers().clone()?;
        match headers.inner().get(crate::message::REVISION_HEADER)? {
            lapin::types::AMQPValue::LongLongInt(revision) => Some(*revision),
            _ => None,
        }
    }
}

#[tokio::test]
async fn a_task_is_cancelled_once_and_then_cannot_move() {
    let harness = with_release_stage(ScriptedBroker::ready()).await;
    let posted = harness
        .post("/v1/tasks", r#"{"destination":"d","delay":"100s"}"#, None)
        .await;
    assert_eq!(posted.status, StatusCode::ACCEPTED);
    assert_eq!(posted.body["state"], "scheduled");
    let id = posted.body["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/tasks/{id}");

    let cancelled = harness.delete(&path).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.text);
    assert_eq!(cancelled.body["state"], "cancelled");
    assert!(cancelled.body["cancelled_at"].is_string());
    // DELETE is idempotent: the same answer again.
    let again = harness.delete(&path).await;
    assert_eq!(
        (again.status, &again.body["state"]),
        (StatusCode::OK, &json!("cancelled"))
    );
    let moved = harness.patch(&path, r#"{"delay_ms":5}"#, None).await;
    assert_eq!(
        (moved.status, moved.code()),
        (StatusCode::CONFLICT, "task_cancelled")
    );
    assert_eq!(harness.get(&path).await.body["state"], "cancelled");
    assert_eq!(
        harness.get("/v1/tasks?state=cancelled").await.body["tasks"][0]["id"],
        json!(id)
    );

    let unknown = harness.delete("/v1/tasks/nope").await;
    assert_eq!(
        (unknown.status, unknown.code()),
        (StatusCode::NOT_FOUND, "task_not_found")
    );
    let scrape = harness.get("/metrics").await.text;
    assert!(
        scrape.contains("delayline_tasks_cancelled_total 1"),
        "{scrape}"
    );
}

#[tokio::test]
async fn a_move_is_a_new_revision_published_with_its_revision() {
    let harness = with_release_stage(ScriptedBroker::ready()).await;
    let posted = harness
        .post(
            "/v1/tasks",
            r#"{"destination":"d","delay":"100s","payload":{"n":1}}"#,
            None,
        )
        .await;
    let id = posted.body["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/tasks/{id}");
    assert_eq!(harness.published_revision(0), Some(1));

    let moved = harness
        .patch(&path, r#"{"delay_ms":250}"#, Some("move-1"))
        .await;
    assert_eq!(moved.status, StatusCode::OK, "{}", moved.text);
    assert_eq!(moved.body["revision"], 2);
    assert_eq!(moved.body["state"], "scheduled");
    // Held to the millisecond by the release stage, never early: one unit
    // in the levels (a unit's lead left), the rest held, with a stamp
    // saying when it is due.
    assert_eq!(moved.body["delay_ms"], 250);
    assert!(
        moved.body["routing_key"]
            .as_str()
            .unwrap()
            .ends_with("0.1.d")
    );
    assert_eq!(harness.broker.published(), 2);
    assert_eq!(harness.published_revision(1), Some(2));
    // The new copy keeps payload, headers and destination.
    let copy = harness.broker.published.lock().unwrap()[1].clone();
    let stamp = crate::message::Stamp::read(&copy.properties).expect("a hold stamp");
    // 250 ms from the whole ms at or after the move, stamped by the wall
    // clock's ms at or before: up to 251 ms remain; less the level's 99.
    assert!(
        stamp.own_hold_us() > 100_000 && stamp.own_hold_us() <= 152_000,
        "{stamp:?}"
    );
    assert_eq!(copy.payload, br#"{"n":1}"#);
    assert!(copy.routing_key.ends_with(".d"));

    // The same change again under its key: answered, not made again.
    let replay = harness
        .patch(&path, r#"{"delay_ms":250}"#, Some("move-1"))
        .await;
    assert_eq!(replay.status, StatusCode::OK);
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.body["revision"], 2);
    assert_eq!(harness.broker.published(), 2);
    let conflict = harness
        .patch(&path, r#"{"delay_ms":999}"#, Some("move-1"))
        .await;
    assert_eq!(
        (conflict.status, conflict.code()),
        (StatusCode::CONFLICT, "idempotency_conflict")
    );

    for (body, code) in [
        (r#"{"delay_ms":1,"delay":"1s"}"#, "invalid_delay"),
        (r#"{"destination":"x","delay_ms":1}"#, "invalid_request"),
        (r#"{"delay":"soon"}"#, "invalid_delay"),
        (r#"{"delay":"1000y"}"#, "delay_out_of_range"),
        (r#"{"delay_ms":99999999}"#, "delay_out_of_range"),
    ] {
        let refused = harness.patch(&path, body, None).await;
        assert_eq!(refused.code(), code, "{body}: {}", refused.text);
        if code == "delay_out_of_range" {
            // Said of the field the client used.
            let field = if body.contains("delay_ms") {
                "/delay_ms"
            } else {
                "/delay"
            };
            let message = refused.body["error"]["message"].as_str().unwrap();
            assert!(message.starts_with(field), "{message}");
        }
        assert!(refused.status.is_client_error());
    }
    let moved_again = harness.patch(&path, r#"{"delay":"2s"}"#, None).await;
    assert_eq!(moved_again.body["revision"], 3);
    assert_eq!(harness.broker.published(), 3);
    let scrape = harness.get("/metrics").await.text;
    assert!(
        scrape.contains("delayline_tasks_rescheduled_total 2"),
        "{scrape}"
    );
}

#[tokio::test]
async fn a_move_whose_publish_fails_leaves_the_new_revision_pending() {
    let harness = with_release_stage(ScriptedBroker::ready().then_fail(PublishError::Nacked)).await;
    // The first publish is refused: the task waits, pending, in revision 1.
    let posted = harness
        .post("/v1/tasks", r#"{"destination":"d","delay":"100s"}"#, None)
        .await;
    assert_eq!(posted.body["state"], "pending");
    let path = format!("/v1/tasks/{}", posted.body["id"].as_str().unwrap());
    // A pending task moves too; its new copy is then confirmed.
    let moved = harness.patch(&path, r#"{"delay":"200s"}"#, None).await;
    assert_eq!(moved.status, StatusCode::OK, "{}", moved.text);
    assert_eq!(
        (&moved.body["state"], &moved.body["revision"]),
        (&json!("scheduled"), &json!(2))
    );
}

/// The regression of issue 24: a body is one JSON value and nothing after it.
#[tokio::test]
async fn a_body_with_anything_after_its_json_value_is_refused_on_every_route() {
    let harness = with_release_stage(ScriptedBroker::ready()).await;
    let posted = harness
        .post("/v1/tasks", r#"{"destination":"d","delay":"100s"}"#, None)
        .await;
    let id = posted.body["id"].as_str().unwrap().to_owned();
    let published = harness.broker.published();
    let task = r#"{"destination":"x.y","delay_ms":100000,"payload":1}"#;
    let batch = r#"{"tasks":[{"destination":"x.y","delay_ms":100000}]}"#;
    let cancel = format!(r#"{{"ids":["{id}"]}}"#);
    for trailer in [" xyz", "}}", " {}", ","] {
        for (method, path, body) in [
            ("POST", "/v1/tasks".to_owned(), task.to_owned()),
            ("POST", "/v1/tasks/batch".to_owned(), batch.to_owned()),
            ("POST", "/v1/tasks/cancel".to_owned(), cancel.clone()),
            (
                "PATCH",
                format!("/v1/tasks/{id}"),
                r#"{"delay_ms":5000}"#.to_owned(),
            ),
        ] {
            let answer = harness
                .call(
                    Request::builder()
                        .method(method)
                        .uri(&path)
                        .header("content-type", "application/json")
                        .body(Body::from(format!("{body}{trailer}")))
                        .unwrap(),
                )
                .await;
            assert_eq!(
                answer.status,
                StatusCode::BAD_REQUEST,
                "{path} {body}{trailer}"
            );
            assert_eq!(answer.code(), "malformed_json", "{path}: {}", answer.text);
        }
    }
    assert_eq!(
        harness.broker.published(),
        published,
        "nothing refused is published"
    );
    let seen = harness.get(&format!("/v1/tasks/{id}")).await;
    assert_eq!(seen.body["state"], "scheduled", "{}", seen.text);
    assert_eq!(seen.body["revision"], 1, "{}", seen.text);
}

#[tokio::test]
async fn a_batch_cancel_answers_each_id_on_its_own() {
    let harness = with_release_stage(ScriptedBroker::ready()).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let posted = harness
            .post("/v1/tasks", r#"{"destination":"d","delay":"100s"}"#, None)
            .await;
        ids.push(posted.body["id"].as_str().unwrap().to_owned());
    }
    let body = json!({"ids": [ids[0], "nope", ids[1]]}).to_string();
    let answer = harness.post("/v1/tasks/cancel", &body, None).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    let statuses: Vec<u64> = answer.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 404, 200]);
    assert_eq!(answer.body["results"][1]["error"]["code"], "task_not_found");
    assert_eq!(answer.body["results"][2]["task"]["state"], "cancelled");
    // Again, and the same id twice: each answered as cancelled.
    let body = json!({"ids": [ids[0], ids[0]]}).to_string();
    let again = harness.post("/v1/tasks/cancel", &body, None).await;
    assert_eq!(
        again.body["results"][1]["task"]["state"], "cancelled",
        "{}",
        again.text
    );
    let too_many = json!({"ids": ["a", "b", "c", "d"]}).to_string();
    let refused = harness.post("/v1/tasks/cancel", &too_many, None).await;
    assert_eq!(refused.code(), "batch_too_large");
    let malformed = harness
        .post("/v1/tasks/cancel", r#"{"id":"a"}"#, None)
        .await;
    assert_eq!(malformed.code(), "invalid_request");
}

#[tokio::test]
async fn cancelling_needs_a_ledger_and_the_release_stage() {
    let stateless = stateless(ScriptedBroker::ready());
    let answer = stateless.delete("/v1/tasks/x").await;
    assert_eq!(
        (answer.status, answer.code()),
        (StatusCode::NOT_IMPLEMENTED, "ledger_disabled")
    );
    let answer = stateless
        .patch("/v1/tasks/x", r#"{"delay_ms":1}"#, None)
        .await;
    assert_eq!(answer.code(), "ledger_disabled");
    let without_stage = with_ledger(ScriptedBroker::ready()).await;
    let answer = without_stage.delete("/v1/tasks/x").await;
    assert_eq!(
        (answer.status, answer.code()),
        (StatusCode::NOT_IMPLEMENTED, "release_stage_disabled")
    );
    let answer = without_stage
        .post("/v1/tasks/cancel", r#"{"ids":["x"]}"#, None)
        .await;
    assert_eq!(answer.code(), "release_stage_disabled");
}

#[tokio::test]
async fn bad_input_is_a_4xx_with_its_code_and_nothing_is_published() {
    let harness = stateless(ScriptedBroker::ready());
    for (body, status, code) in [
        ("{", 400, "malformed_json"),
        ("[]", 422, "invalid_request"),
        (r#"{"destination":"d"}"#, 422, "invalid_delay"),
        (r#"{"destination":"d","delay_ms":-1}"#, 422, "invalid_delay"),
        (
            r#"{"destination":"a b","delay_ms":1}"#,
            422,
            "invalid_destination",
        ),
        (
            r#"{"destination":"d","delay_ms":1,"headers":{"CC":"x"}}"#,
            422,
            "invalid_header",
        ),
    ] {
        let answer = harness.post("/v1/tasks", body, None).await;
        assert_eq!(answer.status.as_u16(), status, "{body}: {:?}", answer.body);
        assert_eq!(answer.code(), code, "{body}: {:?}", answer.body);
    }
    let unsupported = harness
        .call(
            Request::post("/v1/tasks")
                .header("content-type", "text/plain")
                .body(Body::from(r#"{"destination":"d","delay_ms":1}"#))
                .unwrap(),
        )
        .await;
    assert_eq!(unsupported.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(unsupported.code(), "unsupported_media_type");
    let batch = r#"{"tasks":[{"destination":"d","delay_ms":1},{"destination":"d","delay_ms":1},
        {"destination":"d","delay_ms":1},{"destination":"d","delay_ms":1}]}"#;
    let too_many = harness.post("/v1/tasks/batch", batch, None).await;
    assert_eq!(too_many.code(), "batch_too_large");
    assert_eq!(harness.broker.published(), 0);
}

#[tokio::test]
async fn a_task_the_broker_could_never_take_is_refused_before_anything_happens() {
    let broker = ScriptedBroker {
        properties_limit: Some(200),
        ..ScriptedBroker::ready()
    };
    let harness = with_ledger(broker).await;
    let big = json!({"destination": "d", "delay_ms": 1, "headers": {"h": "x".repeat(300)}});
    let answer = harness.post("/v1/tasks", &big.to_string(), None).await;
    assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(answer.code(), "headers_too_large");
    assert_eq!(harness.broker.published(), 0);
    let listed = harness.get("/v1/tasks").await;
    assert_eq!(listed.body["tasks"], json!([]), "nothing was recorded");
}

#[tokio::test]
async fn without_a_ledger_each_broker_problem_is_a_503_with_its_code() {
    for (error, code) in [
        (
            PublishError::Unavailable("down".into()),
            "broker_unavailable",
        ),
        (PublishError::Blocked("memory".into()), "broker_blocked"),
        (
            PublishError::Timeout(Duration::from_secs(1)),
            "broker_timeout",
        ),
        (PublishError::Nacked, "broker_rejected"),
        (
            PublishError::Returned("312 NO_ROUTE".into()),
            "broker_unroutable",
        ),
    ] {
        let harness = stateless(ScriptedBroker::ready().then_fail(error));
        let answer = harness
            .post("/v1/tasks", r#"{"destination":"d","delay_ms":1}"#, None)
            .await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{code}");
        assert_eq!(answer.code(), code);
        assert_eq!(answer.headers["retry-after"], "1");
    }
}

#[tokio::test]
async fn with_a_ledger_a_broker_problem_leaves_the_task_pending_not_refused() {
    let broker = ScriptedBroker::ready().then_fail(PublishError::Unavailable("down".into()));
    let harness = with_ledger(broker).await;
    let answer = harness
        .post("/v1/tasks", r#"{"destination":"d","delay_ms":1}"#, None)
        .await;
    assert_eq!(answer.status, StatusCode::ACCEPTED);
    assert_eq!(answer.body["state"], "pending");
    let id = answer.body["id"].as_str().unwrap();
    let stored = harness.get(&format!("/v1/tasks/{id}")).await;
    assert_eq!(stored.body["state"], "pending");
    assert!(
        stored.body["last_error"]
            .as_str()
            .unwrap()
            .contains("not connected")
    );
}

#[tokio::test]
async fn a_retried_request_is_answered_again_and_a_different_one_under_its_key_conflicts() {
    let harness = with_ledger(ScriptedBroker::ready()).await;
    let body = r#"{"destination":"d","delay_ms":1000,"payload":{"n":1}}"#;
    let first = harness.post("/v1/tasks", body, Some("k-1")).await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    assert!(!first.headers.contains_key("idempotent-replayed"));
    // The same request, serialised differently.
    let again = r#"{ "payload": {"n": 1}, "delay_ms": 1000, "destination": "d" }"#;
    let replay = harness.post("/v1/tasks", again, Some("k-1")).await;
    assert_eq!(replay.status, StatusCode::ACCEPTED);
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.body["id"], first.body["id"]);
    let other = r#"{"destination":"d","delay_ms":1000,"payload":{"n":2}}"#;
    let conflict = harness.post("/v1/tasks", other, Some("k-1")).await;
    assert_eq!(conflict.status, StatusCode::CONFLICT);
    assert_eq!(conflict.code(), "idempotency_conflict");
    let bad_key = harness.post("/v1/tasks", body, Some("")).await;
    assert_eq!(bad_key.code(), "invalid_idempotency_key");
    let batch_key = harness
        .post("/v1/tasks/batch", r#"{"tasks":[]}"#, Some("k-2"))
        .await;
    assert_eq!(batch_key.code(), "invalid_idempotency_key");
    assert_eq!(
        harness.broker.published(),
        1,
        "one schedule for one request"
    );
}

#[tokio::test]
async fn a_client_id_repeated_in_a_batch_names_one_task() {
    let harness = with_ledger(ScriptedBroker::ready()).await;
    let batch = r#"{"tasks":[
        {"id":"a","destination":"d","delay_ms":1},
        {"id":"a","destination":"d","delay_ms":1},
        {"id":"a","destination":"d","delay_ms":2}]}"#;
    let answer = harness.post("/v1/tasks/batch", batch, None).await;
    let statuses: Vec<u64> = answer.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [202, 202, 409]);
    assert_eq!(answer.body["results"][1]["replayed"], true);
    assert_eq!(harness.broker.published(), 1);
}

#[tokio::test]
async fn readiness_follows_the_mode_and_the_broker() {
    let broker = ScriptedBroker::default();
    *broker.status.lock().unwrap() = BrokerStatus {
        problem: Some(BrokerProblem {
            reason: "connection refused".into(),
            misconfigured: false,
            certificate: false,
            since: Instant::now(),
        }),
        ..BrokerStatus::default()
    };
    let harness = stateless(broker);
    let answer = harness.get("/readyz").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.code(), "not_ready");
    assert!(
        answer.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("connection refused")
    );

    // With a ledger the same broker is no reason to refuse tasks.
    let broker = ScriptedBroker::default();
    *broker.status.lock().unwrap() = harness.broker.status();
    let harness = with_ledger(broker).await;
    let answer = harness.get("/readyz").await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
    assert_eq!(answer.body["broker"], "disconnected");
    assert_eq!(answer.body["pending"], 0);

    // Refused credentials, beyond the grace: not ready either way.
    *harness.broker.status.lock().unwrap() = BrokerStatus {
        problem: Some(BrokerProblem {
            reason: "ACCESS_REFUSED".into(),
            misconfigured: true,
            certificate: false,
            since: Instant::now() - Duration::from_secs(31),
        }),
        ..BrokerStatus::default()
    };
    let answer = harness.get("/readyz").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.code(), "broker_misconfigured");
}

/// A console session lives only as long as its client's token: once the
/// token leaves the clients file and the file is reloaded, the session's
/// cookie opens nothing.
#[tokio::test]
async fn a_console_session_ends_when_its_token_is_removed() {
    let dir = std::env::temp_dir().join(format!("dl-console-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("clients.toml");
    let entry = |name: &str| {
        format!(
            "[[clients]]\nname = \"{name}\"\ntoken_sha256 = \"{}\"\ndestinations = [\"#\"]\npermissions = [\"read\"]\n",
            crate::auth::token::hash_hex(&format!("tok-{name}"))
        )
    };
    std::fs::write(&file, entry("kept") + &entry("gone")).unwrap();
    let auth = Arc::new(
        crate::auth::Authenticator::from_settings(
            &crate::auth::AuthSettings {
                clients_file: file.display().to_string(),
                ..crate::auth::AuthSettings::default()
            },
            "127.0.0.1:8080",
            false,
        )
        .unwrap(),
    );
    let metrics = Arc::new(Metrics::new());
    let broker = Arc::new(ScriptedBroker::ready());
    let scheduler = stateless_scheduler(broker.clone(), metrics.clone());
    let http = HttpSettings::default();
    let harness = Harness {
        app: router(
            AppState::new(scheduler, metrics, &http, auth.clone()),
            &http,
            crate::http::MetricsRoute::WithApi,
            true,
        ),
        broker,
        _data: None,
    };
    let sign_in = async |name: &str| {
        let answer = harness
            .call(
                Request::post("/console/login")
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(Body::from(format!("token=tok-{name}")))
                    .unwrap(),
            )
            .await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER);
        let set = answer.headers["set-cookie"].to_str().unwrap().to_owned();
        set.split(';').next().unwrap().to_owned()
    };
    let (kept, gone) = (sign_in("kept").await, sign_in("gone").await);
    let levels = async |cookie: &str| {
        harness
            .call(
                Request::get("/console/levels")
                    .header("cookie", cookie)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .status
    };
    assert_eq!(levels(&kept).await, StatusCode::OK);
    assert_eq!(levels(&gone).await, StatusCode::OK);
    std::fs::write(&file, entry("kept")).unwrap();
    auth.reload().unwrap();
    assert_eq!(levels(&kept).await, StatusCode::OK);
    assert_eq!(
        levels(&gone).await,
        StatusCode::SEE_OTHER,
        "to the sign-in page"
    );
    // Giving the token back does not bring the session back.
    std::fs::write(&file, entry("kept") + &entry("gone")).unwrap();
    auth.reload().unwrap();
    assert_eq!(levels(&gone).await, StatusCode::SEE_OTHER);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `console.enabled = false`: no console route answers but as an unknown
/// route does; on (the default), the console answers.
#[tokio::test]
async fn the_console_is_served_only_when_enabled() {
    for enabled in [true, false] {
        let metrics = Arc::new(Metrics::new());
        let broker = Arc::new(ScriptedBroker::ready());
        let scheduler = stateless_scheduler(broker.clone(), metrics.clone());
        let http = HttpSettings::default();
        let auth = Arc::new(crate::auth::Authenticator::open());
        let harness = Harness {
            app: router(
                AppState::new(scheduler, metrics, &http, auth),
                &http,
                crate::http::MetricsRoute::WithApi,
                enabled,
            ),
            broker,
            _data: None,
        };
        for path in [
            "/console",
            "/console/login",
            "/console/levels",
            "/console/problems",
        ] {
            let answer = harness.get(path).await;
            if enabled {
                // Served (the Problems page of a ledgerless service answers
                // what the API does: 501 ledger_disabled).
                assert_ne!(answer.status, StatusCode::NOT_FOUND, "{path}");
            } else {
                assert_eq!(answer.code(), "not_found", "{path}");
            }
        }
    }
}

#[tokio::test]
async fn unknown_routes_methods_and_a_ledgerless_inspection_have_their_codes() {
    let harness = stateless(ScriptedBroker::ready());
    assert_eq!(harness.get("/v2/tasks").await.code(), "not_found");
    let put = harness
        .call(Request::put("/v1/tasks").body(Body::empty()).unwrap())
        .await;
    assert_eq!(put.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(put.code(), "method_not_allowed");
    let inspect = harness.get("/v1/tasks/x").await;
    assert_eq!(inspect.status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(inspect.code(), "ledger_disabled");
    let list = harness.get("/v1/tasks").await;
    assert_eq!(list.code(), "ledger_disabled");
}

#[tokio::test]
async fn rejections_are_counted_by_code_at_the_scrape() {
    let harness = stateless(ScriptedBroker::ready());
    harness.post("/v1/tasks", "{", None).await;
    harness
        .post("/v1/tasks", r#"{"destination":"d","delay_ms":1}"#, None)
        .await;
    let scrape = harness.get("/metrics").await;
    assert_eq!(scrape.status, StatusCode::OK);
    let text = scrape.text;
    assert!(
        text.contains("delayline_tasks_rejected_total{code=\"malformed_json\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("delayline_tasks_accepted_total{state=\"scheduled\"} 1"),
        "{text}"
    );
    assert!(text.contains("delayline_broker_connected 1"), "{text}");
}

/// Every code the API can answer: an `ApiError`, and every refusal written
/// below the router, is made from an [`ErrorCode`].
fn codes_in_source() -> std::collections::BTreeSet<String> {
    crate::http::codes::ErrorCode::ALL
        .iter()
        .map(|code| code.as_str().to_owned())
        .collect()
}

/// The API reference (`docs/api.md`), as the tests read it.
fn api_reference() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md")).unwrap()
}

/// The API reference's table is the enum's, row for row: status, code and when.
#[test]
fn the_api_references_error_table_is_the_error_code_enum() {
    let reference = api_reference();
    let table = reference.split("## Error codes\n\n").nth(1).unwrap();
    let table = table.split("\n\n").next().unwrap().trim_end();
    assert_eq!(
        format!("{table}\n"),
        crate::http::codes::readme_table(),
        "regenerate docs/api.md's table from http::codes::readme_table()"
    );
}

/// No source of the HTTP layer spells an error code as a string: each is
/// made from the enum, so none can be missing from the table or the document.
#[test]
fn no_error_code_is_spelled_outside_the_enum() {
    let root = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src/http"));
    let mut folders = vec![root];
    let mut files = Vec::new();
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else {
                files.push(path);
            }
        }
    }
    for path in files {
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name == "codes.rs" || name == "tests.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.split("#[cfg(test)]").next().unwrap();
        for code in crate::http::codes::ErrorCode::ALL {
            let quoted = format!("\"{}\"", code.as_str());
            assert!(!text.contains(&quoted), "{name} spells {quoted}");
        }
    }
}

#[test]
fn every_error_code_the_api_answers_is_in_the_api_references_table() {
    let reference = api_reference();
    let table = reference.split("## Error codes").nth(1).unwrap();
    let table = table.split("\n## ").next().unwrap();
    let codes = codes_in_source();
    assert!(codes.len() > 25, "the scan found too few codes: {codes:?}");
    for code in &codes {
        assert!(
            table.contains(&format!("| `{code}` |")),
            "docs/api.md's error table lacks `{code}`"
        );
    }
}

/// The 401/403/429 matrix, on the default ledger (SQLite, release stage).
mod access {
    use super::*;
    use crate::auth::{AuthSettings, ClientSettings, TokenHashes};
    use crate::auth::{Authenticator, token};

    fn client(name: &str, destinations: &[&str], permissions: &[&str]) -> ClientSettings {
        ClientSettings {
            name: name.to_owned(),
            token_sha256: TokenHashes::One(token::hash_hex(&format!("tok-{name}"))),
            destinations: destinations.iter().map(|d| d.to_string()).collect(),
            permissions: permissions.iter().map(|p| p.to_string()).collect(),
            ..ClientSettings::default()
        }
    }

    const OWN_TASKS: [&str; 4] = ["submit", "read", "cancel", "reschedule"];

    async fn harness() -> Harness {
        let clients = vec![
            ClientSettings {
                exchanges: vec!["orders".to_owned()],
                ..client("billing", &["billing.#"], &OWN_TASKS)
            },
            client("orders", &["orders.*.eu"], &OWN_TASKS),
            client("reader", &["billing.#"], &["read"]),
            client("ops", &["#"], &["admin"]),
            ClientSettings {
                rate_per_second: Some(1),
                burst: Some(2),
                ..client("limited", &["limited"], &["submit"])
            },
            ClientSettings {
                max_scheduled: Some(2),
                ..client("quota", &["quota"], &["submit", "cancel"])
            },
        ];
        let auth = Authenticator::from_settings(
            &AuthSettings {
                clients,
                ..AuthSettings::default()
            },
            "0.0.0.0:8080",
            true,
        )
        .unwrap();
        with_ledger_and_auth(ScriptedBroker::ready(), release_stage_cascade(), auth).await
    }

    impl Harness {
        async fn send(
            &self,
            method: &str,
            path: &str,
            body: Option<&str>,
            who: Option<&str>,
            key: Option<&str>,
        ) -> Answer {
            let mut request = Request::builder().method(method).uri(path);
            if let Some(who) = who {
                request = request.header("authorization", format!("Bearer tok-{who}"));
            }
            if let Some(key) = key {
                request = request.header("idempotency-key", key);
            }
            let body = match body {
                Some(body) => {
                    request = request.header("content-type", "application/json");
                    Body::from(body.to_owned())
                }
                None => Body::empty(),
            };
            self.call(request.body(body).unwrap()).await
        }

        async fn submit(&self, who: &str, destination: &str) -> Answer {
            let body = format!(r#"{{"destination":"{destination}","delay":"100s"}}"#);
            self.send("POST", "/v1/tasks", Some(&body), Some(who), None)
                .await
        }

        async fn submit_id(&self, who: &str, destination: &str) -> String {
            let answer = self.submit(who, destination).await;
            assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.text);
            answer.body["id"].as_str().unwrap().to_owned()
        }
    }

    #[tokio::test]
    async fn no_token_or_an_unknown_one_is_401_and_the_probes_stay_open() {
        let harness = harness().await;
        for (who, code) in [(None, "unauthenticated"), (Some("nobody"), "invalid_token")] {
            for (method, path) in [
                ("POST", "/v1/tasks"),
                ("POST", "/v1/tasks/batch"),
                ("GET", "/v1/tasks"),
                ("GET", "/v1/tasks/x"),
                ("DELETE", "/v1/tasks/x"),
                ("PATCH", "/v1/tasks/x"),
                ("POST", "/v1/tasks/cancel"),
                ("GET", "/v1/topology"),
                ("GET", "/metrics"),
            ] {
                let answer = harness.send(method, path, Some("{}"), who, None).await;
                assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{method} {path}");
                assert_eq!(answer.code(), code, "{method} {path}");
                let challenge = answer.headers["www-authenticate"].to_str().unwrap();
                assert!(challenge.starts_with("Bearer"), "{challenge}");
            }
        }
        // The token is the whole credential: its hash is not one.
        let hash = token::hash_hex("tok-billing");
        let request = Request::get("/v1/tasks")
            .header("authorization", format!("Bearer {hash}"))
            .body(Body::empty())
            .unwrap();
        assert_eq!(harness.call(request).await.status, StatusCode::UNAUTHORIZED);
        assert_eq!(harness.get("/healthz").await.status, StatusCode::OK);
        assert_ne!(
            harness.get("/readyz").await.status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(harness.broker.published(), 0);
        let scrape = harness
            .send("GET", "/metrics", None, Some("ops"), None)
            .await;
        assert!(
            scrape
                .text
                .contains("delayline_auth_refused_total{reason=\"missing\"} 9"),
            "{}",
            scrape.text
        );
    }

    #[tokio::test]
    async fn a_client_delivers_only_to_the_exchanges_it_is_granted() {
        let harness = harness().await;
        let post = |exchange: &str, client: &'static str| {
            let body = format!(
                r#"{{"destination":"billing.invoice","delay":"100s","exchange":"{exchange}"}}"#
            );
            let harness = &harness;
            async move {
                harness
                    .send("POST", "/v1/tasks", Some(&body), Some(client), None)
                    .await
            }
        };
        let granted = post("orders", "billing").await;
        assert_eq!(granted.status, StatusCode::ACCEPTED, "{}", granted.text);
        let published = harness.broker.published.lock().unwrap()[0].clone();
        let headers = published.properties.headers().clone().unwrap();
        assert_eq!(
            headers.inner().get(crate::message::DELIVER_TO_HEADER),
            Some(&lapin::types::AMQPValue::LongString("orders".into()))
        );
        let other = post("payments", "billing").await;
        assert_eq!(
            (other.status, other.code()),
            (StatusCode::FORBIDDEN, "forbidden_exchange"),
            "{}",
            other.text
        );
        assert!(other.text.contains("orders"), "{}", other.text);
        // The business exchange, named, is every client's.
        let business = post("biz", "billing").await;
        assert_eq!(business.status, StatusCode::ACCEPTED, "{}", business.text);
        let bad = post("has space", "billing").await;
        assert_eq!(
            (bad.status, bad.code()),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_exchange")
        );
        assert_eq!(
            harness.broker.published(),
            2,
            "refused tasks are not published"
        );
    }

    #[tokio::test]
    async fn a_client_publishes_only_to_its_destinations_single_and_batch() {
        let harness = harness().await;
        let own = harness.submit("billing", "billing.invoice.eu").await;
        assert_eq!(own.status, StatusCode::ACCEPTED, "{}", own.text);
        let other = harness.submit("billing", "orders.new.eu").await;
        assert_eq!(other.status, StatusCode::FORBIDDEN);
        assert_eq!(other.code(), "forbidden_destination");
        assert!(
            other.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("billing.#")
        );
        assert_eq!(
            harness.broker.published(),
            1,
            "the refused task is not published"
        );
        let reader = harness.submit("reader", "billing.invoice").await;
        assert_eq!(
            (reader.status, reader.code()),
            (StatusCode::FORBIDDEN, "forbidden")
        );

        let batch = r#"{"tasks":[{"destination":"billing.a","delay":"100s"},
            {"destination":"orders.x.eu","delay":"100s"},{"destination":"billing","delay":"100s"}]}"#;
        let answer = harness
            .send(
                "POST",
                "/v1/tasks/batch",
                Some(batch),
                Some("billing"),
                None,
            )
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
        let statuses: Vec<u64> = answer.body["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["status"].as_u64().unwrap())
            .collect();
        assert_eq!(statuses, [202, 403, 202]);
        assert_eq!(
            answer.body["results"][1]["error"]["code"],
            "forbidden_destination"
        );
        assert_eq!(harness.broker.published(), 3);
        let refused = harness
            .send("POST", "/v1/tasks/batch", Some(batch), Some("reader"), None)
            .await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        assert_eq!(harness.broker.published(), 3);
        // An admin, too, publishes only to its own patterns ("#" here).
        assert_eq!(
            harness.submit("ops", "anything.at.all").await.status,
            StatusCode::ACCEPTED
        );
    }

    #[tokio::test]
    async fn a_client_reads_cancels_and_moves_only_its_own_tasks() {
        let harness = harness().await;
        let billing = harness.submit_id("billing", "billing.a").await;
        let orders = harness.submit_id("orders", "orders.new.eu").await;
        let task = format!("/v1/tasks/{billing}");
        let moved = Some(r#"{"delay":"200s"}"#);
        // Who may do what to billing's task, in order (the move succeeds).
        let matrix = [
            ("GET", task.as_str(), None, "billing", StatusCode::OK),
            ("GET", &task, None, "orders", StatusCode::NOT_FOUND),
            ("GET", &task, None, "reader", StatusCode::NOT_FOUND),
            ("GET", &task, None, "ops", StatusCode::OK),
            ("GET", "/v1/tasks", None, "limited", StatusCode::FORBIDDEN),
            ("PATCH", &task, moved, "orders", StatusCode::NOT_FOUND),
            ("PATCH", &task, moved, "reader", StatusCode::FORBIDDEN),
            ("PATCH", &task, moved, "billing", StatusCode::OK),
            ("DELETE", &task, None, "orders", StatusCode::NOT_FOUND),
            ("DELETE", &task, None, "reader", StatusCode::FORBIDDEN),
            (
                "GET",
                "/v1/topology",
                None,
                "billing",
                StatusCode::FORBIDDEN,
            ),
            ("GET", "/v1/topology", None, "ops", StatusCode::OK),
            ("GET", "/metrics", None, "billing", StatusCode::FORBIDDEN),
        ];
        for (method, path, body, who, expected) in matrix {
            let answer = harness.send(method, path, body, Some(who), None).await;
            assert_eq!(
                answer.status, expected,
                "{method} {path} as {who}: {}",
                answer.text
            );
        }
        let own = harness
            .send("GET", &task, None, Some("billing"), None)
            .await;
        assert_eq!(
            (&own.body["client"], &own.body["revision"]),
            (&json!("billing"), &json!(2))
        );

        // Each lists its own tasks; an administrator lists everyone's.
        let listed = [
            ("billing", vec![billing.clone()]),
            ("orders", vec![orders.clone()]),
        ]
        .into_iter()
        .chain([
            ("reader", vec![]),
            ("ops", vec![billing.clone(), orders.clone()]),
        ]);
        for (who, expected) in listed {
            let answer = harness
                .send("GET", "/v1/tasks", None, Some(who), None)
                .await;
            let mut ids: Vec<String> = answer.body["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["id"].as_str().unwrap().to_owned())
                .collect();
            ids.sort();
            let mut expected = expected;
            expected.sort();
            assert_eq!(ids, expected, "{who}");
        }

        let batch = format!(r#"{{"ids":["{billing}","{orders}"]}}"#);
        let answer = harness
            .send(
                "POST",
                "/v1/tasks/cancel",
                Some(&batch),
                Some("orders"),
                None,
            )
            .await;
        let statuses: Vec<u64> = answer.body["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["status"].as_u64().unwrap())
            .collect();
        assert_eq!(statuses, [404, 200], "{}", answer.text);
        let admin = harness.send("DELETE", &task, None, Some("ops"), None).await;
        assert_eq!(
            admin.status,
            StatusCode::OK,
            "an admin cancels anyone's task"
        );
    }

    #[tokio::test]
    async fn idempotency_keys_and_ids_are_each_clients_own() {
        let harness = harness().await;
        let body = r#"{"destination":"billing.a","delay":"100s"}"#;
        let first = harness
            .send("POST", "/v1/tasks", Some(body), Some("billing"), Some("k1"))
            .await;
        let body = r#"{"destination":"orders.a.eu","delay":"100s"}"#;
        let second = harness
            .send("POST", "/v1/tasks", Some(body), Some("orders"), Some("k1"))
            .await;
        assert_eq!(first.status, StatusCode::ACCEPTED);
        assert_eq!(second.status, StatusCode::ACCEPTED, "{}", second.text);
        assert_ne!(first.body["id"], second.body["id"]);
        assert!(second.headers.get("idempotent-replayed").is_none());
        let id = first.body["id"].as_str().unwrap();
        let shown = harness
            .send(
                "GET",
                &format!("/v1/tasks/{id}"),
                None,
                Some("billing"),
                None,
            )
            .await;
        assert_eq!(
            shown.body["idempotency_key"], "k1",
            "shown as the client sent it"
        );
        // Another client reusing a client-chosen id gets a conflict, never
        // the other client's task.
        let body = r#"{"id":"shared-id","destination":"billing.a","delay":"100s"}"#;
        let own = harness
            .send("POST", "/v1/tasks", Some(body), Some("billing"), None)
            .await;
        assert_eq!(own.status, StatusCode::ACCEPTED);
        let body = r#"{"id":"shared-id","destination":"orders.a.eu","delay":"100s"}"#;
        let theirs = harness
            .send("POST", "/v1/tasks", Some(body), Some("orders"), None)
            .await;
        assert_eq!(theirs.status, StatusCode::CONFLICT, "{}", theirs.text);
        let body = r#"{"id":"shared-id","destination":"billing.a","delay":"100s"}"#;
        let replayed = harness
            .send("POST", "/v1/tasks", Some(body), Some("billing"), None)
            .await;
        assert_eq!(replayed.headers["idempotent-replayed"], "true");
    }

    #[tokio::test]
    async fn rate_limits_and_quotas_answer_429_and_are_counted_by_client() {
        let harness = harness().await;
        assert_eq!(
            harness.submit("limited", "limited").await.status,
            StatusCode::ACCEPTED
        );
        assert_eq!(
            harness.submit("limited", "limited").await.status,
            StatusCode::ACCEPTED
        );
        let over = harness.submit("limited", "limited").await;
        assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(over.code(), "rate_limited");
        let retry: u64 = over.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=1).contains(&retry), "{retry}");
        let batch = r#"{"tasks":[{"destination":"limited","delay":"1s"},
            {"destination":"limited","delay":"1s"},{"destination":"limited","delay":"1s"}]}"#;
        let too_big = harness
            .send(
                "POST",
                "/v1/tasks/batch",
                Some(batch),
                Some("limited"),
                None,
            )
            .await;
        assert_eq!(too_big.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            too_big.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("burst")
        );
        assert_eq!(harness.broker.published(), 2);

        let first = harness.submit_id("quota", "quota").await;
        harness.submit_id("quota", "quota").await;
        let over = harness.submit("quota", "quota").await;
        assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(over.code(), "quota_exceeded");
        assert!(over.headers.contains_key("retry-after"));
        // A batch that would overshoot is refused whole.
        let batch = r#"{"tasks":[{"destination":"quota","delay":"1s"}]}"#;
        let refused = harness
            .send("POST", "/v1/tasks/batch", Some(batch), Some("quota"), None)
            .await;
        assert_eq!(refused.code(), "quota_exceeded");
        // A refused task does not count; a cancelled one stops counting.
        let cancelled = harness
            .send(
                "DELETE",
                &format!("/v1/tasks/{first}"),
                None,
                Some("quota"),
                None,
            )
            .await;
        assert_eq!(cancelled.status, StatusCode::OK);
        let bad = r#"{"destination":"quota","delay":"-1s"}"#;
        let invalid = harness
            .send("POST", "/v1/tasks", Some(bad), Some("quota"), None)
            .await;
        assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            harness.submit("quota", "quota").await.status,
            StatusCode::ACCEPTED
        );
        assert_eq!(
            harness.submit("quota", "quota").await.code(),
            "quota_exceeded"
        );

        let scrape = harness
            .send("GET", "/metrics", None, Some("ops"), None)
            .await
            .text;
        for line in [
            "delayline_client_throttled_total{client=\"limited\",code=\"rate_limited\"} 2",
            "delayline_client_throttled_total{client=\"quota\",code=\"quota_exceeded\"} 3",
            "delayline_client_tasks_accepted_total{client=\"quota\"} 3",
        ] {
            assert!(scrape.contains(line), "{line} in\n{scrape}");
        }
    }

    /// A client's retry after a lost answer is answered as the original was,
    /// also at its quota or rate: it schedules nothing, so it takes neither.
    #[tokio::test]
    async fn a_retry_of_an_accepted_task_is_answered_again_at_the_clients_limits() {
        let harness = harness().await;
        let keyed = r#"{"destination":"quota","delay":"100s"}"#;
        let first = harness
            .send("POST", "/v1/tasks", Some(keyed), Some("quota"), Some("k-1"))
            .await;
        assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.text);
        let with_id = r#"{"destination":"quota","delay":"100s","id":"retried-id"}"#;
        let second = harness
            .send("POST", "/v1/tasks", Some(with_id), Some("quota"), None)
            .await;
        assert_eq!(second.status, StatusCode::ACCEPTED, "{}", second.text);
        assert_eq!(
            harness.submit("quota", "quota").await.code(),
            "quota_exceeded"
        );

        let again = harness
            .send("POST", "/v1/tasks", Some(keyed), Some("quota"), Some("k-1"))
            .await;
        assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.text);
        assert_eq!(again.headers["idempotent-replayed"], "true");
        assert_eq!(again.body["id"], first.body["id"]);
        let again = harness
            .send("POST", "/v1/tasks", Some(with_id), Some("quota"), None)
            .await;
        assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.text);
        let batch = format!(r#"{{"tasks":[{with_id}]}}"#);
        let again = harness
            .send("POST", "/v1/tasks/batch", Some(&batch), Some("quota"), None)
            .await;
        assert_eq!(again.body["results"][0]["status"], 202, "{}", again.text);
        assert_eq!(again.body["results"][0]["replayed"], true, "{}", again.text);
        // A batch with one new task among the retries is still over the quota.
        let mixed = format!(
            r#"{{"tasks":[{with_id},{{"destination":"quota","delay":"100s","id":"new"}}]}}"#
        );
        let refused = harness
            .send("POST", "/v1/tasks/batch", Some(&mixed), Some("quota"), None)
            .await;
        assert_eq!(refused.code(), "quota_exceeded");
        assert_eq!(
            harness.broker.published(),
            2,
            "the retries published nothing"
        );

        // The same at the rate limit (burst 2).
        let limited = r#"{"destination":"limited","delay":"100s","id":"limited-1"}"#;
        for _ in 0..2 {
            let answer = harness
                .send("POST", "/v1/tasks", Some(limited), Some("limited"), None)
                .await;
            assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.text);
        }
        let answer = harness
            .send("POST", "/v1/tasks", Some(limited), Some("limited"), None)
            .await;
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.text);
        assert_eq!(
            harness.submit("limited", "limited").await.code(),
            "rate_limited"
        );
    }
}

/// The API reference (`docs/api.md`) and the OpenAPI description name the same
/// endpoints and the same error codes with the same statuses, and those are
/// the codes the source answers.
#[test]
fn the_api_reference_and_the_openapi_description_agree_on_endpoints_and_error_codes() {
    use std::collections::BTreeSet;
    let reference = api_reference();
    let mut in_readme = BTreeSet::new();
    for heading in reference.lines().filter(|l| l.starts_with("## `")) {
        for endpoint in heading.split('`').skip(1).step_by(2) {
            if let Some((method, path)) = endpoint.split_once(' ') {
                in_readme.insert((method.to_lowercase(), path.to_owned()));
            }
        }
    }
    let document = super::openapi::document();
    let mut in_description = BTreeSet::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            in_description.insert((method.clone(), path.clone()));
        }
    }
    // The description describes itself too.
    in_readme.remove(&("get".to_owned(), "/openapi.json".to_owned()));
    assert_eq!(in_readme, in_description);

    let table = reference.split("## Error codes").nth(1).unwrap();
    let table = table.split("\n## ").next().unwrap();
    let readme_codes: BTreeSet<(u16, String)> = table
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let status = cells.get(1)?.parse().ok()?;
            Some((status, cells.get(2)?.trim_matches('`').to_owned()))
        })
        .collect();
    let described: BTreeSet<(u16, String)> = super::openapi::ERROR_CODES
        .iter()
        .map(|(status, code)| (*status, (*code).to_owned()))
        .collect();
    assert_eq!(readme_codes, described);
    let answered: BTreeSet<String> = codes_in_source().into_iter().collect();
    let described: BTreeSet<String> = described.into_iter().map(|(_, code)| code).collect();
    assert_eq!(answered, described);
}

/// A task's own code (what its parser's tests speak of) is the code the API answers.
#[test]
fn a_task_errors_code_is_the_one_answered() {
    use crate::task::TaskError;
    let text = || "why".to_owned();
    for error in [
        TaskError::MalformedJson(text()),
        TaskError::InvalidRequest(text()),
        TaskError::InvalidDestination(text()),
        TaskError::InvalidDelay(text()),
        TaskError::DelayOutOfRange(text()),
        TaskError::InvalidPayload(text()),
        TaskError::InvalidHeader(text()),
        TaskError::InvalidId(text()),
    ] {
        let code = error.code();
        assert_eq!(super::error::ApiError::from(error).code, code);
    }
}
