//! Stops the whole broker (`rabbitmqctl stop_app`) under a running service.
//!
//! Alone in its test binary on purpose: `cargo test` runs test binaries one
//! after another, so no other test sees the outage. (Under a runner that runs
//! binaries in parallel, run this one on its own.)

// The helpers of the integration tests; this binary uses a few of them.
#[allow(dead_code)]
#[path = "it/common/mod.rs"]
mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{
    AMQP_URI, Backend, TestApp, TestConsumer, eventually, rabbitmqctl, test_settings, with_ledger,
};
use delayline::broker::connect;
use delayline::cascade::QueueType;
use lapin::options::{QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::json;

/// The broker's application is stopped until this is dropped, even on panic.
struct BrokerStopped;

impl BrokerStopped {
    fn stop() -> Self {
        rabbitmqctl(&["stop_app"]);
        BrokerStopped
    }
}

impl Drop for BrokerStopped {
    fn drop(&mut self) {
        rabbitmqctl(&["start_app"]);
        rabbitmqctl(&["await_startup"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_accepted_while_rabbitmq_is_stopped_arrive_after_it_restarts() {
    let mut settings = with_ledger(test_settings(5, 50, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.reconnect_max_backoff_ms = 200;
    settings.amqp.confirm_timeout_ms = 1000;
    let mut app = TestApp::spawn(settings).await;

    // A durable consumer queue: it must outlive the broker's restart.
    let queue = format!("{}.consumer.durable", app.cascade.prefix());
    app.cleanup.queues.push(queue.clone());
    let admin = connect(AMQP_URI, "delayline test admin").await.unwrap();
    let channel = admin.create_channel().await.unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.as_str().into(), durable, FieldTable::default())
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.as_str().into(),
            app.cascade.business_exchange().into(),
            app.cascade.binding_key("outage").as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    drop(channel);

    let stopped = BrokerStopped::stop();
    eventually("the service notices the broker is gone", async || {
        app.get("/readyz").await.1["broker"] == "disconnected"
    })
    .await;
    let mut accepted = HashSet::new();
    for n in 0..10u64 {
        let body = json!({"destination": "outage", "delay_ms": n * 100});
        let (status, task) = app.post("/v1/tasks", &body).await;
        assert_eq!(status, 202, "{task}");
        assert_eq!(task["state"], "pending");
        accepted.insert(task["id"].as_str().unwrap().to_owned());
    }
    let app = app.restart().await;
    drop(stopped);

    TestConsumer::existing(&queue)
        .await
        .expect_each_once_never_early(accepted, Duration::from_secs(30))
        .await;
    app.stop().await.unwrap();
}
