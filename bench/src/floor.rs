//! The broker's own floor for a delivery at a set moment, under the load of
//! a run: the bench publishes messages itself, each at its moment, straight
//! to the business exchange (a connection of its own, persistent, confirmed,
//! as the release stage publishes), and a consumer like the tasks' receives
//! them. The lateness from each moment to its arrival is what any publisher
//! on this machine gets under that load: the timer's wake, the publish, the
//! broker's routing and delivery, the consumer. What a held task's lateness
//! exceeds it by is delayline's own.

use std::collections::HashMap;
use std::time::Duration;

use delayline::broker::connect;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use delayline::testkit::{now_us, quantile};

use crate::arrivals::consume;
use crate::sut::ServiceUnderTest;

/// Lateness of the bench's own timed publishes, in ms.
#[derive(Clone, Debug, Serialize)]
pub struct Floor {
    pub probes: usize,
    pub received: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Timed publishes under way: started by [`start`], measured by [`Probe::finish`].
pub struct Probe {
    arrivals: mpsc::UnboundedReceiver<(String, i64)>,
    publishing: JoinHandle<anyhow::Result<HashMap<String, i64>>>,
}

/// Publishes `rate` messages a second for `seconds`, the first `after` from
/// now, each at its own moment, for a consumer of their own (`label`: one
/// per run, so that no consumer of an earlier run takes one).
pub async fn start(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    label: &str,
    after: Duration,
    rate: f64,
    seconds: f64,
) -> anyhow::Result<Probe> {
    let destination = format!("floor-{label}");
    let arrivals = consume(sut, &destination, amqp_uri).await?;
    let exchange = sut.cascade.business_exchange().to_string();
    let connection = connect(amqp_uri, "delayline-bench floor").await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let publishing = tokio::spawn(async move {
        let _keep = connection;
        // The same instant by the timer's clock and by the wall clock the
        // consumer stamps arrivals with.
        let first = tokio::time::Instant::now() + after;
        let first_us = now_us() + after.as_micros() as i64;
        let count = (rate * seconds) as usize;
        let mut moments = HashMap::with_capacity(count);
        let mut confirms = Vec::with_capacity(count);
        for n in 0..count {
            let offset = Duration::from_secs_f64(n as f64 / rate);
            tokio::time::sleep_until(first + offset).await;
            let due_us = first_us + offset.as_micros() as i64;
            let id = format!("floor-{n}");
            let properties = lapin::BasicProperties::default()
                .with_message_id(id.as_str().into())
                .with_delivery_mode(2);
            let confirm = channel
                .basic_publish(
                    exchange.as_str().into(),
                    destination.as_str().into(),
                    BasicPublishOptions::default(),
                    b"{}",
                    properties,
                )
                .await?;
            confirms.push(confirm);
            moments.insert(id, due_us);
        }
        for confirm in confirms {
            confirm.await?;
        }
        Ok(moments)
    });
    Ok(Probe {
        arrivals,
        publishing,
    })
}

impl Probe {
    /// Waits for the publishes and their arrivals (at most `wait` after the
    /// last publish): how late each arrived after its moment.
    pub async fn finish(mut self, wait: Duration) -> anyhow::Result<Floor> {
        let moments = self.publishing.await??;
        let deadline = tokio::time::Instant::now() + wait;
        let mut late = Vec::with_capacity(moments.len());
        while late.len() < moments.len() {
            let Ok(Some((id, at))) = tokio::time::timeout_at(deadline, self.arrivals.recv()).await
            else {
                break;
            };
            if let Some(due) = moments.get(&id) {
                late.push((at - due) as f64 / 1000.0);
            }
        }
        late.sort_by(f64::total_cmp);
        Ok(Floor {
            probes: moments.len(),
            received: late.len(),
            p50_ms: quantile(&late, 0.5),
            p90_ms: quantile(&late, 0.9),
            p99_ms: quantile(&late, 0.99),
            max_ms: late.last().copied().unwrap_or(f64::NAN),
        })
    }
}
