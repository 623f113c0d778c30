//! The router without a broker: validation, error mapping, idempotency and
//! readiness rules, through `tower::ServiceExt::oneshot` against a scripted
//! [`Publish`]. What only a broker can show (confirms, delivery, timing) is in
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
use prometheus_client::metrics::histogram::Histogram;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::{AppState, router};
use crate::broker::{BrokerProblem, BrokerStatus, Message, PublishError, Published};
use crate::cascade::{Cascade, QueueType};
use crate::config::{HttpSettings, StoreSettings};
use crate::ledger;
use crate::metrics::Metrics;
use crate::scheduler::{Publish, PublishAlone, Scheduler, SchedulerSettings};

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

impl Publish for ScriptedBroker {
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

    fn consume(
        &self,
        _queue: String,
        _limits: crate::broker::ConsumeLimits,
        _shutdown: tokio_util::sync::CancellationToken,
    ) -> tokio::sync::mpsc::Receiver<crate::broker::Window> {
        unimplemented!("the release stage does not run in these tests")
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

fn settings() -> SchedulerSettings {
    SchedulerSettings {
        confirm_timeout: Duration::from_secs(1),
        misconfiguration_grace: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        prune_every: Duration::from_secs(3600),
    }
}

fn app(scheduler: Scheduler, metrics: Arc<Metrics>) -> Router {
    let http = HttpSettings {
        batch_limit: 3,
        ..HttpSettings::default()
    };
    router(AppState::new(scheduler, metrics, &http), &http)
}

/// Without a ledger.
fn stateless(broker: ScriptedBroker) -> Harness {
    let broker = Arc::new(broker);
    let metrics = Arc::new(Metrics::new());
    let scheduler = Scheduler::new(broker.clone(), None, cascade(), metrics.clone(), settings());
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
    let cascade = crate::cascade::CascadeSettings {
        levels: 12,
        unit_ms: 100,
        prefix: "t".into(),
        business_exchange: "biz".into(),
        release_stage: Some(true),
        ..crate::cascade::CascadeSettings::default()
    }
    .validate()
    .unwrap();
    with_ledger_on(broker, Arc::new(cascade)).await
}

async fn with_ledger_on(broker: ScriptedBroker, cascade: Arc<Cascade>) -> Harness {
    let dir = std::env::temp_dir().join(format!("delayline-http-{}", uuid::Uuid::new_v4()));
    let store = StoreSettings {
        data_dir: dir.display().to_string(),
        ..StoreSettings::default()
    };
    let ledger = ledger::open(&store, cascade.release_stage(), Histogram::new([1.0]))
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
    );
    Harness {
        app: app(scheduler, metrics),
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
        match headers.inner().get(crate::task::REVISION_HEADER)? {
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
    // Rounded up to the 100 ms unit, never early.
    assert_eq!(moved.body["delay_ms"], 300);
    assert_eq!(harness.broker.published(), 2);
    assert_eq!(harness.published_revision(1), Some(2));
    // The new copy keeps payload, headers and destination.
    let copy = harness.broker.published.lock().unwrap()[1].clone();
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
            since: Instant::now() - Duration::from_secs(31),
        }),
        ..BrokerStatus::default()
    };
    let answer = harness.get("/readyz").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.code(), "broker_misconfigured");
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

/// Every code the API can answer, read off the source: the literal after a
/// `StatusCode::…,` and the arms of the error mappings.
fn codes_in_source() -> std::collections::BTreeSet<String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |path: &str| std::fs::read_to_string(format!("{root}/{path}")).unwrap();
    let literal_after = |text: &str, marker: &str| -> Vec<String> {
        text.match_indices(marker)
            .filter_map(|(at, _)| {
                let rest = text[at + marker.len()..].trim_start();
                let rest = rest.split_once(',').map(|(_, r)| r.trim_start())?;
                let code = rest.strip_prefix('"')?.split('"').next()?;
                let is_code =
                    !code.is_empty() && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
                is_code.then(|| code.to_owned())
            })
            .collect()
    };
    let arms = |text: &str| -> Vec<String> {
        text.match_indices("=> \"")
            .filter_map(|(at, _)| {
                let code = text[at + 4..].split('"').next()?;
                code.bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_')
                    .then(|| code.to_owned())
            })
            .collect()
    };
    let mut codes = std::collections::BTreeSet::new();
    for file in [
        "src/http/tasks.rs",
        "src/http/inspect.rs",
        "src/http/lifecycle.rs",
        "src/http/extract.rs",
        "src/http/fallback.rs",
        "src/http/error.rs",
    ] {
        let text = read(file);
        codes.extend(literal_after(&text, "StatusCode::"));
    }
    codes.extend(arms(&read("src/http/error.rs")));
    codes.extend(arms(&read("src/http/lifecycle.rs")));
    let task = read("src/task.rs");
    let code_fn = task.split("pub fn code(&self)").nth(1).unwrap();
    codes.extend(arms(code_fn.split("\n    }\n").next().unwrap()));
    codes.insert("internal".to_owned());
    codes
}

#[test]
fn every_error_code_the_api_answers_is_in_the_readmes_table() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let table = readme.split("### Error codes").nth(1).unwrap();
    let table = table.split("\n## ").next().unwrap();
    let codes = codes_in_source();
    assert!(codes.len() > 25, "the scan found too few codes: {codes:?}");
    for code in &codes {
        assert!(
            table.contains(&format!("| `{code}` |")),
            "the README's error table lacks `{code}`"
        );
    }
}
