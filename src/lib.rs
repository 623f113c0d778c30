//! delayline: delayed delivery for RabbitMQ through a binary TTL cascade.
//!
//! # Layout
//!
//! One room per concern, in the order a task travels. Each module's first
//! lines say what it may touch.
//!
//! - [`cascade`]: the algorithm as pure logic. Settings and their limits, the
//!   routing key of a delay, the entry exchange, and the topology plan as data
//!   (shared by the provisioner, `--dry-run` and the routing simulator). No
//!   I/O; proven exhaustively and with property tests.
//! - [`task`]: a task as submitted over HTTP, validated into what is
//!   scheduled. Pure as well: the clock is an argument.
//! - [`auth`]: who may do what. Clients (from the configuration and a
//!   clients file reloaded on SIGHUP), tokens known only by their SHA-256,
//!   destination topic patterns, permissions, rate limits and quotas. No
//!   HTTP and no broker; the one I/O is reading the clients file.
//! - [`http`]: the axum API, one module (and router) per resource: tasks in,
//!   inspection, topology, health, the metrics scrape; the gate in front of
//!   all but the probes (401/403/429); the JSON extractor and the error
//!   shape; the OpenAPI description, generated from the handlers' and types'
//!   annotations; its own accept loop and the bounds on what one client may
//!   hold (header and body timeouts, a request deadline, a connection cap, an
//!   intake bound that sheds overload with 503). It knows the scheduler's
//!   methods, nothing below them.
//! - [`scheduler`]: takes a task in, in one of two modes fixed at start-up
//!   (stateless, or with a ledger, whose bookkeeper records every task,
//!   forwards pending ones, awaits late confirms, moves tasks and prunes);
//!   cancels tasks; runs the release stage, which looks every due task up in
//!   the ledger before it goes to the business exchange (its verdict per
//!   message is a pure function); answers readiness and inspection. It turns
//!   a task into a broker message and sees the broker through the
//!   [`scheduler::Broker`] trait, which tests replace.
//! - [`ledger`]: the task ledger (sqlx; SQLite by default, PostgreSQL for
//!   replicas): migrations, group commit (request writes, release claims and
//!   deliveries share commits), idempotency, cancel and move as single
//!   conditional updates, inspection queries, and the count of pending
//!   tasks. Its rows stay inside; it hands out [`ledger::StoredTask`].
//! - [`broker`]: an adapter to RabbitMQ. Connecting (to the first of a
//!   cluster's nodes that answers), declaring the plan (with a full diagnosis
//!   when the broker holds something else), publishing a message it is given
//!   (confirms, pipelining, reconnection, bounded waits, isolation of a
//!   suspect message), over TLS when asked (`amqps`, a CA bundle, a client
//!   certificate), consuming a queue in windows, reading queue depths,
//!   migrating a chain, requeueing the unroutable queue. It knows nothing of
//!   tasks or ledgers.
//! - [`metrics`]: the Prometheus registry, and the poller that reads queue
//!   depths into it.
//! - [`service`]: builds each component from its own settings section, runs
//!   them (HTTP or HTTPS, an optional metrics listener, reloads on SIGHUP),
//!   and shuts them down in the order that loses nothing.
//! - [`config`], [`telemetry`], [`cli`], [`probe`]: settings (validated once;
//!   secrets never print), logs, the command line, and the health check that
//!   containers run. `main.rs` only calls [`cli::main`].
//!
//! Tests of the untrusted-input parsers with arbitrary input (property-based
//! fuzzing) are in `fuzz.rs`, compiled for tests only.

pub mod auth;
pub mod broker;
pub mod cascade;
pub mod cli;
pub mod config;
#[cfg(test)]
mod fuzz;
pub mod http;
pub mod ledger;
pub mod message;
pub mod metrics;
pub mod operations;
pub mod probe;
pub mod scheduler;
pub mod service;
pub mod task;
pub mod telemetry;
