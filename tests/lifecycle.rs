//! The real binary: SIGTERM drains in-flight publishes before it exits.

mod common;

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use common::{Cleanup, TestConsumer, test_settings};
use delayline::cascade::QueueType;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_publishes_and_every_accepted_task_arrives() {
    let settings = test_settings(3, 10, QueueType::Quorum);
    let cascade = settings.cascade().unwrap();
    let mut cleanup = Cleanup::for_cascade(&cascade);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_delayline"))
        .arg("serve")
        .env("DELAYLINE__HTTP__BIND", format!("127.0.0.1:{port}"))
        .env("DELAYLINE__CASCADE__PREFIX", cascade.prefix())
        .env(
            "DELAYLINE__CASCADE__BUSINESS_EXCHANGE",
            cascade.business_exchange(),
        )
        .env("DELAYLINE__CASCADE__LEVELS", "3")
        .env("DELAYLINE__CASCADE__UNIT_MS", "10")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let key = cascade.binding_key("drain");
    let exchange = cascade.business_exchange().to_owned();
    let mut consumer = TestConsumer::bind_to(&mut cleanup, &cascade, &exchange, &key).await;

    let requests: Vec<_> = (0..200)
        .map(|n| {
            let http = http.clone();
            let url = format!("{base}/v1/tasks");
            tokio::spawn(async move {
                let response = http
                    .post(url)
                    .json(
                        &json!({"destination": "drain", "delay_ms": n % 40, "id": format!("t{n}")}),
                    )
                    .send()
                    .await
                    .ok()?;
                if response.status() != 202 {
                    return None;
                }
                let body: Value = response.json().await.ok()?;
                Some(body["id"].as_str()?.to_owned())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );

    let mut accepted = HashSet::new();
    for request in requests {
        if let Some(id) = request.await.unwrap() {
            accepted.insert(id);
        }
    }
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(
        !accepted.is_empty(),
        "no request was accepted before the signal"
    );
    eprintln!("{} of 200 tasks accepted around the signal", accepted.len());

    while !accepted.is_empty() {
        let message = consumer
            .next(Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("{} accepted tasks never arrived", accepted.len()));
        accepted.remove(message.properties.message_id().as_ref().unwrap().as_str());
    }
}
