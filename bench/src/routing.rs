//! What separates the cascade's entry from a plain queue, one step at a time.
//!
//! The same messages (bodies, properties, headers, persistent, `mandatory`,
//! confirms) go to one quorum queue by ever more of the cascade's routing:
//! the default exchange; the same with a level queue's arguments; a topic
//! exchange with `#` and a short key; the same with the 32-digit key; a
//! topic exchange with a level's two digit patterns; and last the cascade's
//! entry itself, on a topology as empty as the others' queues. The broker's
//! CPU per message says which step costs what.

use std::time::Duration;

use anyhow::Context;
use delayline::broker::{connect, provision, teardown};
use delayline::cascade::{
    ArgValue, BindingSpec, BindingTarget, Cascade, ExchangeKind, ExchangeSpec, TopologyPlan,
};
use indicatif::ProgressBar;
use lapin::options::QueuePurgeOptions;

use crate::cpu;
use crate::load::{self, RawTarget, Throughput};

/// The level the bench's ingest delays (1–2 h in 100 ms units) mostly enter at.
const ENTRY_LEVEL: u32 = 16;

/// The side topology: two queues and three exchanges under `cascade`'s prefix.
fn plan(cascade: &Cascade) -> TopologyPlan {
    let name = |what: &str| format!("{}.routing.{what}", cascade.prefix());
    let sink = name("sink");
    let mut level_queue = cascade
        .plan()
        .queues
        .into_iter()
        .find(|q| q.name == cascade.level_queue(ENTRY_LEVEL))
        .expect("the plan declares every level's queue");
    level_queue.name = name("level-args");
    level_queue
        .arguments
        .insert("x-dead-letter-exchange".into(), ArgValue::Str(sink.clone()));
    let topic = |name: String| ExchangeSpec {
        name,
        kind: ExchangeKind::Topic,
        arguments: Default::default(),
    };
    let to_plain = |source: String, routing_key: String| BindingSpec {
        source,
        target: BindingTarget::Queue(name("plain")),
        routing_key,
    };
    TopologyPlan {
        exchanges: vec![topic(sink), topic(name("hash")), topic(name("digits"))],
        queues: vec![cascade.plain_queue(name("plain")), level_queue],
        bindings: vec![
            to_plain(name("hash"), "#".into()),
            // A level exchange's two bindings; here both lead to the queue,
            // so that every message is routed whichever its digit is.
            to_plain(name("digits"), cascade.digit_pattern(ENTRY_LEVEL, true)),
            to_plain(name("digits"), cascade.digit_pattern(ENTRY_LEVEL, false)),
        ],
        owner: None,
        beyond_last_shard: None,
        shards: 1,
    }
}

/// Measures each step for `seconds`, over `channels` with 1024 confirms in flight.
pub async fn split(
    uri: &str,
    cascade: &Cascade,
    channels: usize,
    seconds: Duration,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<Throughput>> {
    let plan = plan(cascade);
    let connection = connect(uri, "delayline-bench routing").await?;
    provision(&connection, &plan)
        .await
        .context("declaring the routing steps")?;
    let name = |what: &str| format!("{}.routing.{what}", cascade.prefix());
    let (plain, level_args) = (name("plain"), name("level-args"));
    let (hash, digits) = (name("hash"), name("digits"));
    let steps = [
        ("default exchange", "", Some(plain.as_str())),
        ("default exch., level args", "", Some(level_args.as_str())),
        ("topic #, 2-word key", hash.as_str(), Some("bench.ingest")),
        ("topic #, 32-digit key", hash.as_str(), None),
        ("topic, level patterns", digits.as_str(), None),
    ];
    let broker = cpu::broker_pid();
    let channel = connection.create_channel().await?;
    let mut measured = Vec::new();
    for (label, exchange, key) in steps {
        progress.set_message(format!("routing: {label}"));
        let meter = cpu::Meter::start(broker, None);
        let target = RawTarget::Exchange {
            label,
            exchange,
            key,
        };
        let mut step =
            load::raw_amqp(uri, cascade, target, channels, 1024, seconds, progress).await?;
        step.cpu = meter.finish(step.tasks);
        measured.push(step);
        for queue in [&plain, &level_args] {
            channel
                .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                .await?;
        }
    }
    progress.set_message("routing: the cascade's entry");
    let meter = cpu::Meter::start(broker, None);
    let mut entry = load::raw_amqp(
        uri,
        cascade,
        RawTarget::Cascade,
        channels,
        1024,
        seconds,
        progress,
    )
    .await?;
    entry.cpu = meter.finish(entry.tasks);
    entry.path = format!("routing: {}", entry.path);
    measured.push(entry);
    teardown(&connection, &plan).await?;
    load::close(&connection).await;
    Ok(measured)
}
