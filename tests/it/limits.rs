//! Clients that misbehave, on the default configuration (quorum queues,
//! SQLite ledger): headers or a body sent a byte at a time, more connections
//! than allowed, a request that outlives its deadline, and more tasks at once
//! than the service takes in. Slow clients are few and loopback only; every
//! wait is bounded.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::common::{
    Backend, TestApp, TestConsumer, assert_retry_later, sample, test_settings, with_ledger,
};
use delayline::cascade::QueueType;
use delayline::config::Settings;
use futures_util::future::join_all;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn default_settings() -> Settings {
    with_ledger(test_settings(8, 20, QueueType::Quorum), Backend::Sqlite)
}

fn address(app: &TestApp) -> String {
    app.base.trim_start_matches("http://").to_owned()
}

/// Sends `bytes` one at a time, `every` apart, until the server closes the
/// connection or `bytes` run out; then reads what the server answered.
async fn trickle(stream: &mut TcpStream, bytes: &[u8], every: Duration) -> String {
    for byte in bytes {
        if stream.write_all(&[*byte]).await.is_err() {
            break;
        }
        tokio::time::sleep(every).await;
    }
    read_answer(stream).await
}

/// Everything the server sends until it closes (bounded: 10 s).
async fn read_answer(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

fn json_body(answer: &str) -> Value {
    let (_, body) = answer.split_once("\r\n\r\n").expect("a whole response");
    serde_json::from_str(body).unwrap_or_else(|_| panic!("a JSON body: {answer}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_sent_a_byte_at_a_time_are_cut_off_at_the_header_timeout() {
    let mut settings = default_settings();
    settings.http.header_read_timeout_ms = 1_000;
    let app = TestApp::spawn(settings).await;
    let mut stream = TcpStream::connect(address(&app)).await.unwrap();
    let started = Instant::now();
    let head = "POST /v1/tasks HTTP/1.1\r\nhost: x\r\n".to_owned() + &"x-slow: y\r\n".repeat(50);
    let answer = trickle(&mut stream, head.as_bytes(), Duration::from_millis(100)).await;
    let held = started.elapsed();
    assert!(answer.is_empty(), "no request was read: {answer}");
    assert!(
        held >= Duration::from_millis(900) && held < Duration::from_secs(8),
        "closed after {held:?}"
    );
    // Nobody else waited meanwhile.
    let (status, _) = app.get("/v1/topology").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_a_byte_at_a_time_is_answered_408_and_nothing_is_published() {
    let mut settings = default_settings();
    settings.http.body_read_timeout_ms = 1_000;
    let mut app = TestApp::spawn(settings).await;
    let mut consumer = TestConsumer::bind(&mut app, "#").await;
    let body = json!({"destination": "slow", "delay_ms": 0}).to_string();
    let mut stream = TcpStream::connect(address(&app)).await.unwrap();
    let head = format!(
        "POST /v1/tasks HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let answer = trickle(&mut stream, body.as_bytes(), Duration::from_millis(200)).await;
    let held = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert_eq!(json_body(&answer)["error"]["code"], "body_timeout");
    assert!(held < Duration::from_secs(8), "answered after {held:?}");
    assert!(consumer.next(Duration::from_millis(500)).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_the_connection_cap_a_new_connection_is_answered_503_at_once() {
    let mut settings = default_settings();
    settings.http.max_connections = 3;
    settings.http.header_read_timeout_ms = 5_000;
    let app = TestApp::spawn(settings).await;
    // Three idle connections hold every slot.
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(TcpStream::connect(address(&app)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let mut refused = TcpStream::connect(address(&app)).await.unwrap();
    refused
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = read_answer(&mut refused).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert_eq!(json_body(&answer)["error"]["code"], "too_many_connections");

    // Their slots come back when they go.
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let status = app.get("/healthz").await.0;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let scrape = app.scrape().await;
    // At least the one above; a probe may have come before the slots did.
    let refused = sample(&scrape, "delayline_connections_refused_total");
    assert!(refused.is_some_and(|n| n >= 1.0), "{scrape}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_deadline_is_answered_503_with_retry_after() {
    let mut settings = default_settings();
    // Shorter than any batch of a hundred tasks takes on the ledger.
    settings.http.request_timeout_ms = 1;
    let app = TestApp::spawn(settings).await;
    app.wait_ready().await;
    let tasks: Vec<Value> = (0..100)
        .map(|n| json!({"destination": "late", "delay_ms": 5_000, "id": format!("late-{n}")}))
        .collect();
    let response = app
        .http
        .post(format!("{}/v1/tasks/batch", app.base))
        .json(&json!({ "tasks": tasks }))
        .send()
        .await
        .unwrap();
    assert_retry_later(response, "deadline_exceeded").await;
}

/// Many more tasks at once than `http.max_tasks_in_flight`: the surplus is
/// answered 503 with Retry-After at once, everything answered 202 is
/// delivered, and nothing answered 503 is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_tasks_at_once_than_the_intake_takes_are_refused_fast_and_never_published() {
    let mut settings = default_settings();
    settings.http.max_tasks_in_flight = 2;
    let mut app = TestApp::spawn(settings).await;
    app.wait_ready().await;
    let mut consumer = TestConsumer::bind(&mut app, "#").await;
    let answers = join_all((0..64).map(|n| {
        let (http, base) = (app.http.clone(), app.base.clone());
        async move {
            let started = Instant::now();
            let response = http
                .post(format!("{base}/v1/tasks"))
                .json(&json!({"destination": "crowd", "delay_ms": 100, "payload": n}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").cloned();
            let body: Value = response.json().await.unwrap();
            (status, retry_after, body, started.elapsed())
        }
    }))
    .await;
    let mut accepted = HashSet::new();
    let mut refused = 0;
    for (status, retry_after, body, took) in &answers {
        match status {
            202 => {
                accepted.insert(body["id"].as_str().unwrap().to_owned());
            }
            503 => {
                assert_eq!(body["error"]["code"], "overloaded", "{body}");
                assert!(retry_after.is_some());
                assert!(*took < Duration::from_secs(5), "refused after {took:?}");
                refused += 1;
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert!(
        refused > 0,
        "64 tasks at once never exceeded an intake of 2"
    );
    assert!(!accepted.is_empty());
    consumer
        .expect_each_once_never_early(accepted, Duration::from_secs(10))
        .await;
    assert!(
        consumer.next(Duration::from_millis(500)).await.is_none(),
        "a refused task was published"
    );
}
