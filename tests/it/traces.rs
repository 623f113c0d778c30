//! A producer's W3C trace context reaches the consumer unchanged: the
//! `traceparent` and `tracestate` of a request (`POST /v1/tasks`, each task
//! of a batch), the headers of a message taken in by an ingress, and those
//! of a message brought back by a retry policy. A task's own headers win,
//! and a `traceparent` that is not one is not carried. With `[trace]` set,
//! delayline's own spans of each task reach an OTLP receiver (one in the
//! test, decoding what it is sent) as children of the producer's span.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use delayline::clock::format_epoch_ms;
use delayline::ingress::RetrySettings;
use delayline::testkit::now_ms;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};
use serde_json::json;

use crate::common::{TestApp, TestConsumer, eventually};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const STATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_trace_context_reaches_the_consumer_unchanged() {
    let settings = crate::retries::settings_with(Vec::new());
    let mut app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("traced.#");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    let post = |path: &str, body: serde_json::Value, parent: &str| {
        app.http
            .post(format!("{}{path}", app.base))
            .header("traceparent", parent)
            .header("tracestate", STATE)
            .json(&body)
            .send()
    };
    let one = json!({"id": "one", "destination": "traced.one", "delay_ms": 50});
    assert_eq!(post("/v1/tasks", one, PARENT).await.unwrap().status(), 202);
    let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let batch = json!({"tasks": [
        {"id": "two", "destination": "traced.two", "delay_ms": 50},
        {"id": "own", "destination": "traced.own", "delay_ms": 50, "headers": {"traceparent": own}},
    ]});
    assert_eq!(
        post("/v1/tasks/batch", batch, PARENT)
            .await
            .unwrap()
            .status(),
        200
    );
    let bad = json!({"id": "bad", "destination": "traced.bad", "delay_ms": 50});
    assert_eq!(
        post("/v1/tasks", bad, "not-a-traceparent")
            .await
            .unwrap()
            .status(),
        202
    );
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..4 {
        let message = consumer
            .next(Duration::from_secs(10))
            .await
            .expect("delivered");
        let id = message.message_id();
        let parent = message.header("traceparent").cloned();
        let state = message.header("tracestate").cloned();
        seen.insert(id, (parent, state));
    }
    let both = (Some(text(PARENT)), Some(text(STATE)));
    assert_eq!(seen["one"], both);
    assert_eq!(seen["two"], both);
    assert_eq!(seen["own"], (Some(text(own)), None), "the task's own wins");
    assert_eq!(seen["bad"], (None, None), "not a traceparent: not carried");
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_and_a_retry_carry_the_trace_context_of_the_message() {
    let settings = crate::ingress::settings_with(&[("traced", "direct", &[])]);
    let prefix = settings.cascade.prefix.clone();
    let mut settings = settings;
    settings.retry = crate::retries::settings_with(vec![crate::retries::policy(&["failing"])])
        .retry
        .into_iter()
        .map(|mut policy| {
            policy.queues = vec![format!("{prefix}.failing")];
            policy
        })
        .collect();
    let mut app = TestApp::spawn(settings).await;
    let mut trace = FieldTable::default();
    trace.insert("traceparent".into(), text(PARENT));
    trace.insert("tracestate".into(), text(STATE));

    // An ingress: the message as its producer sent it, headers and all.
    let exchange = format!("{prefix}.traced");
    let mut consumer =
        TestConsumer::bind_to(&mut app.cleanup, &app.cascade, &exchange, "invoice").await;
    let mut delayed = trace.clone();
    delayed.insert("x-delay".into(), AMQPValue::LongInt(100));
    let properties = BasicProperties::default().with_headers(delayed);
    let ingress = format!("{prefix}.traced.delayed");
    crate::ingress::publish(&ingress, "invoice", b"traced", properties).await;
    let message = consumer
        .next(Duration::from_secs(10))
        .await
        .expect("delivered");
    assert_eq!(message.header("traceparent"), Some(&text(PARENT)));
    assert_eq!(message.header("tracestate"), Some(&text(STATE)));

    // A retry: back to its queue with the trace it failed with.
    let arguments = crate::retries::dead_letters_to(&app, &[]);
    let queue = crate::retries::declare_queue(&mut app, "failing", arguments).await;
    let mut worker = crate::retries::Worker::on(&queue).await;
    let properties = BasicProperties::default().with_headers(trace);
    crate::retries::publish(&queue, b"fails", properties).await;
    crate::retries::reject_all(&mut worker, 1).await;
    let (_, back) = worker.next(Duration::from_secs(10)).await.expect("retried");
    let headers = back.properties.headers().clone().unwrap_or_default();
    assert_eq!(headers.inner().get("traceparent"), Some(&text(PARENT)));
    assert_eq!(headers.inner().get("tracestate"), Some(&text(STATE)));
    app.stop().await.unwrap();
}

/// Spans an OTLP/HTTP receiver was sent (protobuf, on `/v1/traces`).
struct OtlpReceiver {
    base: String,
    spans: Arc<Mutex<Vec<Span>>>,
    server: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    async fn start() -> OtlpReceiver {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let kept = spans.clone();
        let take = move |headers: HeaderMap, body: Bytes| async move {
            assert_eq!(headers["content-type"], "application/x-protobuf");
            let request = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
            for resource in request.resource_spans {
                let attributes = resource.resource.expect("a resource").attributes;
                assert_eq!(attributes[0].key, "service.name");
                for scope in resource.scope_spans {
                    kept.lock().unwrap().extend(scope.spans);
                }
            }
            StatusCode::OK
        };
        let app = axum::Router::new().route("/v1/traces", axum::routing::post(take));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        OtlpReceiver {
            base,
            spans,
            server,
        }
    }

    /// The spans of task `id`, by name.
    fn of(&self, id: &str) -> BTreeMap<String, Span> {
        let spans = self.spans.lock().unwrap();
        let of_task = spans
            .iter()
            .filter(|span| attribute(span, "delayline.task_id") == Some(id));
        of_task
            .map(|span| (span.name.clone(), span.clone()))
            .collect()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    let value = span.attributes.iter().find(|kv| kv.key == key)?;
    match value.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(text) => Some(text),
        _ => None,
    }
}

fn ms(nanos: u64) -> u64 {
    nanos / 1_000_000
}

/// A task delivered on time and one a pause held past its due time: each
/// span has the producer's trace and its span as parent, the delay ends at
/// the due time, the hold lasts until the pause ends, and nothing is
/// delivered before either. A producer that did not sample its trace gets
/// no spans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_spans_reach_an_otlp_receiver_as_children_of_the_producers_span() {
    let receiver = OtlpReceiver::start().await;
    let giving_up = RetrySettings {
        max_attempts: 2,
        initial: "50ms".into(),
        ..crate::retries::policy(&["failing"])
    };
    let mut settings = crate::retries::settings_with(vec![giving_up]);
    settings.trace.otlp_endpoint = receiver.base.clone();
    settings.trace.export_interval_ms = 100;
    let mut app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("spans.#");
    let mut consumer = TestConsumer::bind(&mut app, &key).await;
    let until = now_ms() + 1_500;
    let pause = json!({"destinations": "spans.held", "paused_until": format_epoch_ms(until)});
    let (status, body) = app.put("/v1/limits/spans-held", &pause).await;
    assert_eq!(status, 201, "{body}");

    let trace: [u8; 16] = rand::random();
    let parent: [u8; 8] = rand::random();
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let sampled = format!("00-{}-{}-01", hex(&trace), hex(&parent));
    let unsampled = format!("00-{}-{}-00", hex(&trace), hex(&parent));
    for (id, destination, traceparent) in [
        ("spans-on-time", "spans.free", &sampled),
        ("spans-held", "spans.held", &sampled),
        ("spans-unsampled", "spans.free", &unsampled),
    ] {
        let task = json!({"id": id, "destination": destination, "delay_ms": 300});
        let url = format!("{}/v1/tasks", app.base);
        let request = app
            .http
            .post(url)
            .header("traceparent", traceparent.as_str());
        assert_eq!(request.json(&task).send().await.unwrap().status(), 202);
    }
    let mut arrived = BTreeMap::new();
    for _ in 0..3 {
        let message = consumer
            .next(Duration::from_secs(10))
            .await
            .expect("delivered");
        arrived.insert(message.message_id(), message.received_at_ms);
    }
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    eventually("every span of both tasks at the receiver", async || {
        receiver.of("spans-on-time").len() >= 3 && receiver.of("spans-held").len() == 4
    })
    .await;
    let on_time = receiver.of("spans-on-time");
    let held = receiver.of("spans-held");
    let mut seen = held.keys().cloned().collect::<Vec<_>>();
    seen.sort();
    let mut expected = names(&[
        "delayline.accept",
        "delayline.delay",
        "delayline.held",
        "delayline.deliver",
    ]);
    expected.sort();
    assert_eq!(seen, expected);
    for span in on_time.values().chain(held.values()) {
        assert_eq!(span.trace_id, trace, "{}", span.name);
        assert_eq!(span.parent_span_id, parent, "{}", span.name);
        assert!(
            span.end_time_unix_nano >= span.start_time_unix_nano,
            "{}",
            span.name
        );
    }
    for (id, spans) in [("spans-on-time", &on_time), ("spans-held", &held)] {
        let accept = &spans["delayline.accept"];
        let due: u64 = attribute(accept, "delayline.deliver_at_ms")
            .unwrap()
            .parse()
            .unwrap();
        let delay = &spans["delayline.delay"];
        assert_eq!(
            (ms(delay.start_time_unix_nano), ms(delay.end_time_unix_nano)),
            (due - 300, due),
            "{id}"
        );
        let deliver = &spans["delayline.deliver"];
        assert!(
            ms(deliver.start_time_unix_nano) >= due,
            "{id}: released before its due time"
        );
        assert_eq!(attribute(deliver, "delayline.outcome"), Some("delivered"));
        assert!(arrived[id] >= due, "{id}: arrived before its due time");
    }
    let hold = &held["delayline.held"];
    assert_eq!(attribute(hold, "delayline.held_by"), Some("limit"));
    assert!(
        ms(hold.end_time_unix_nano) >= until,
        "the hold lasts the pause"
    );
    assert!(ms(held["delayline.deliver"].start_time_unix_nano) >= until);
    assert!(
        receiver.of("spans-unsampled").is_empty(),
        "not sampled: no spans"
    );

    // A message a retry policy gives up on: parked, from its first failure.
    let arguments = crate::retries::dead_letters_to(&app, &[]);
    let queue = crate::retries::declare_queue(&mut app, "failing", arguments).await;
    let mut worker = crate::retries::Worker::on(&queue).await;
    let mut headers = FieldTable::default();
    headers.insert("traceparent".into(), text(&sampled));
    let properties = BasicProperties::default()
        .with_message_id("spans-parked".into())
        .with_headers(headers);
    crate::retries::publish(&queue, b"fails", properties).await;
    let first_failed = now_ms();
    crate::retries::reject_all(&mut worker, 2).await;
    eventually("the parked message's span at the receiver", async || {
        receiver.of("spans-parked").contains_key("delayline.park")
    })
    .await;
    let park = &receiver.of("spans-parked")["delayline.park"];
    assert_eq!(
        (&park.trace_id[..], &park.parent_span_id[..]),
        (&trace[..], &parent[..])
    );
    assert_eq!(attribute(park, "delayline.attempts"), Some("2"));
    assert!(ms(park.start_time_unix_nano) >= first_failed.saturating_sub(5));
    assert!(ms(park.end_time_unix_nano) >= ms(park.start_time_unix_nano) + 50);
    app.stop().await.unwrap();
}
