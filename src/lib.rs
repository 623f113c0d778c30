//! delayline: delayed delivery for RabbitMQ through a binary TTL cascade.
//!
//! # Layout
//!
//! - [`cascade`]: the algorithm as pure logic. Settings and their limits, the
//!   routing key of a delay, the entry exchange, and the topology plan as data.
//!   No I/O; proven with an exhaustive routing simulator and property tests.
//! - [`task`]: a task as submitted over HTTP, validated into what is published.
//!   Pure as well: the clock is an argument.
//! - [`broker`]: everything that talks to RabbitMQ. Connecting (to the first
//!   of a cluster's nodes that answers), declaring the plan (with a full
//!   diagnosis when the broker holds something else), the publisher
//!   (confirms, pipelining, reconnection, bounded waits, isolation of a
//!   suspect message), and reading queue depths (management API or passive
//!   declares).
//! - [`store`]: the task ledger (sqlx; SQLite by default, PostgreSQL for
//!   replicas): migrations, group commit, idempotency, inspection queries.
//! - [`scheduler`]: takes a task in (ledger, then broker) and runs the
//!   forwarder that publishes pending tasks (quarantining those the broker
//!   can never take), the watchers of late confirms, and retention.
//! - [`http`]: the axum API around them, one module (and router) per
//!   resource: tasks in, inspection, topology, health, the metrics scrape.
//! - [`metrics`]: the Prometheus registry; queue depths are polled by [`broker`].
//! - [`service`]: wires it all together and shuts it down in order.
//! - [`config`], [`telemetry`], [`cli`], [`probe`]: settings, logs, the
//!   command line, and the health check that containers run.
//!   `main.rs` only calls [`cli::main`].

pub mod broker;
pub mod cascade;
pub mod cli;
pub mod config;
pub mod http;
pub mod ledger;
pub mod metrics;
pub mod probe;
pub mod scheduler;
pub mod service;
pub mod task;
pub mod telemetry;
