//! Submit a task over HTTP and consume it when it is due.
//!
//! Binds a queue of its own to the business exchange with the destination,
//! schedules one task a second from now with `POST /v1/tasks` (reqwest), and
//! waits for it (lapin): prints how late it came (never early) and exits 0,
//! or exits 1 if it has not come within 30 s. Environment (defaults in
//! brackets): `DELAYLINE_URL` [http://127.0.0.1:8080], `DELAYLINE_TOKEN`
//! [none], `AMQP_URI` [amqp://guest:guest@127.0.0.1:5672/%2f],
//! `BUSINESS_EXCHANGE` [delayline.business], `QUEUE` [examples.rust.invoices],
//! `DESTINATION` [billing.invoice].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

type Error = Box<dyn std::error::Error>;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let queue = env("QUEUE", "examples.rust.invoices");
    let destination = env("DESTINATION", "billing.invoice");
    let uri = env("AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/%2f");
    let connection = Connection::connect(&uri, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.as_str().into(), durable, arguments)
        .await?;
    let exchange = env("BUSINESS_EXCHANGE", "delayline.business");
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            destination.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;

    let url = format!("{}/v1/tasks", env("DELAYLINE_URL", "http://127.0.0.1:8080"));
    let mut request = reqwest::Client::new().post(url).json(&serde_json::json!({
        "destination": destination, "delay": "1s", "payload": {"invoice": 42}
    }));
    if let Ok(token) = std::env::var("DELAYLINE_TOKEN") {
        request = request.bearer_auth(token);
    }
    let task: serde_json::Value = request.send().await?.error_for_status()?.json().await?;
    let id = task["id"].as_str().ok_or("no id in the answer")?.to_owned();
    println!("scheduled {id} for {}", task["deliver_at"]);

    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let arrival = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(delivery) = deliveries.next().await {
            let delivery = delivery?;
            delivery.ack(BasicAckOptions::default()).await?;
            let properties = &delivery.properties;
            if properties.message_id().as_ref().map(|m| m.as_str()) != Some(id.as_str()) {
                continue;
            }
            let deliver_at_ms = properties
                .headers()
                .as_ref()
                .and_then(|headers| headers.inner().get("x-deliver-at-ms").cloned())
                .and_then(|value| match value {
                    AMQPValue::LongLongInt(ms) => Some(ms),
                    _ => None,
                })
                .ok_or("no x-deliver-at-ms header")?;
            return Ok::<_, Error>((now_ms() - deliver_at_ms, delivery.data));
        }
        Err("the consumer ended".into())
    })
    .await
    .map_err(|_| "the task did not arrive within 30 s")??;
    let (lateness_ms, body) = arrival;
    if lateness_ms < 0 {
        return Err(format!("early by {} ms", -lateness_ms).into());
    }
    println!(
        "task {id} arrived {lateness_ms} ms after its time: {}",
        String::from_utf8_lossy(&body)
    );
    connection.close(200, "done".into()).await?;
    Ok(())
}
