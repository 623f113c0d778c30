//! An example consumer: what a user of delayline runs on their side.
//!
//! It owns a durable quorum queue bound to the business exchange, and prints one
//! line per delivered task with how late it came (it is never early). Any
//! AMQP client does the same; nothing here is specific to delayline but the
//! `x-deliver-at-ms` header it reads.
//!
//! Configured by the environment:
//! `AMQP_URI` (several, separated by commas, for a cluster's nodes: the
//! first that answers is used), `BUSINESS_EXCHANGE` (`delayline.business`), `QUEUE`
//! (`delayline.example`), `BINDING_KEY` (`#`: every destination; for one,
//! use the `binding_key` that `GET /v1/topology` gives).

use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::main]
async fn main() -> Result<(), lapin::Error> {
    let uri = env("AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/%2f");
    let exchange = env("BUSINESS_EXCHANGE", "delayline.business");
    let queue = env("QUEUE", "delayline.example");
    let binding_key = env("BINDING_KEY", "#");

    // The broker may still be starting (compose starts everything at once).
    let connection = 'connected: loop {
        for uri in uri.split(',').map(str::trim) {
            let properties = ConnectionProperties::default()
                .with_connection_name("delayline example consumer".into());
            match Connection::connect(uri, properties).await {
                Ok(connection) => break 'connected connection,
                Err(error) => eprintln!("waiting for RabbitMQ: {error}"),
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    // The exchange is delayline's: bind once it has provisioned it. A failed
    // bind closes the channel, so each attempt has its own.
    let channel = loop {
        let channel = connection.create_channel().await?;
        // A quorum queue, like delayline's own: replicated in a cluster.
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        channel
            .queue_declare(queue.as_str().into(), durable, arguments)
            .await?;
        let bound = channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                binding_key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await;
        match bound {
            Ok(()) => break channel,
            Err(error) => {
                eprintln!("waiting for {exchange:?}: {error}");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    channel.basic_qos(100, BasicQosOptions::default()).await?;
    eprintln!("consuming {queue:?}, bound to {exchange:?} with {binding_key:?}");
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let deliver_at_ms = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-deliver-at-ms").cloned())
            .and_then(|v| match v {
                AMQPValue::LongLongInt(ms) => Some(ms),
                _ => None,
            });
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default();
        println!(
            "{{\"id\":{id:?},\"routing_key\":{:?},\"late_ms\":{},\"bytes\":{}}}",
            delivery.routing_key.as_str(),
            deliver_at_ms.map_or(-1, |at| now_ms - at),
            delivery.data.len()
        );
        delivery.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}
