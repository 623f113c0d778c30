//! The benchmark's consumers: every task for a destination, stamped as it
//! arrives.

use delayline::testkit::{ConsumeSpec, Consumer};
use tokio::sync::mpsc;

use crate::sut::ServiceUnderTest;

/// Consumes every task for `destination` from a queue of its own, stamping
/// arrivals (the test kit's consumer, as the integration tests use it).
pub(crate) async fn consume(
    sut: &mut ServiceUnderTest,
    destination: &str,
    amqp_uri: &str,
) -> anyhow::Result<mpsc::UnboundedReceiver<(String, i64)>> {
    let queue = format!("{}.bench.{destination}", sut.cascade.prefix());
    sut.own_queue(&queue);
    let binding_key = sut.cascade.binding_key(destination);
    let spec = ConsumeSpec {
        queue: &queue,
        binding: Some((sut.cascade.business_exchange(), &binding_key)),
        quorum: false,
        ack: false,
        prefetch: Some(2000),
    };
    let mut arrivals = Consumer::start(amqp_uri, spec).await?.into_arrivals();
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(arrival) = arrivals.recv().await {
            if sender.send((arrival.message_id(), arrival.at_us)).is_err() {
                break;
            }
        }
    });
    Ok(receiver)
}
