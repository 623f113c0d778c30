//! Publish with an `x-delay` header, as a producer of the x-delayed-message
//! plugin does, through delayline's AMQP ingress, and consume the message.
//!
//! Needs an ingress in delayline's configuration (`[[ingress]]` with
//! `exchange` = `INGRESS_EXCHANGE`, `deliver_to` = `DELIVER_TO`, `type` =
//! "direct"; see docs/plugin.md). Declares nothing delayline declares: both
//! exchanges are checked with a passive declare. Exits 0 once the message
//! came, never early; 1 if it did not within 30 s. Environment (defaults in
//! brackets): `AMQP_URI` [amqp://guest:guest@127.0.0.1:5672/%2f],
//! `INGRESS_EXCHANGE` [my-exchange.delayed], `DELIVER_TO` [my-exchange],
//! `QUEUE` [examples.rust.x-delay], `ROUTING_KEY` [my-key].

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};

type Error = Box<dyn std::error::Error>;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let ingress = env("INGRESS_EXCHANGE", "my-exchange.delayed");
    let deliver_to = env("DELIVER_TO", "my-exchange");
    let queue = env("QUEUE", "examples.rust.x-delay");
    let key = env("ROUTING_KEY", "my-key");
    let uri = env("AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/%2f");
    let connection = Connection::connect(&uri, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..ExchangeDeclareOptions::default()
    };
    for exchange in [&ingress, &deliver_to] {
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Direct,
                passive,
                FieldTable::default(),
            )
            .await?;
    }
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.as_str().into(), durable, FieldTable::default())
        .await?;
    channel
        .queue_bind(
            queue.as_str().into(),
            deliver_to.as_str().into(),
            key.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;

    let message_id = uuid::Uuid::new_v4().to_string();
    let mut headers = FieldTable::default();
    headers.insert("x-delay".into(), AMQPValue::LongLongInt(1000));
    let properties = BasicProperties::default()
        .with_message_id(message_id.as_str().into())
        .with_delivery_mode(2)
        .with_headers(headers);
    let sent = Instant::now();
    channel
        .basic_publish(
            ingress.as_str().into(),
            key.as_str().into(),
            BasicPublishOptions::default(),
            b"delayed payload",
            properties,
        )
        .await?
        .await?;
    println!("published {message_id} with x-delay 1000");

    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let body = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(delivery) = deliveries.next().await {
            let delivery = delivery?;
            delivery.ack(BasicAckOptions::default()).await?;
            let id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|m| m.to_string());
            if id.as_deref() == Some(message_id.as_str()) {
                return Ok::<_, Error>(delivery.data);
            }
        }
        Err("the consumer ended".into())
    })
    .await
    .map_err(|_| "the message did not arrive within 30 s")??;
    let waited = sent.elapsed();
    if waited < Duration::from_millis(1000) {
        return Err(format!("early: after {waited:?}").into());
    }
    println!(
        "message {message_id} arrived after {} ms: {}",
        waited.as_millis(),
        String::from_utf8_lossy(&body)
    );
    connection.close(200, "done".into()).await?;
    Ok(())
}
