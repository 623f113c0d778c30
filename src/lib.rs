//! delayline: delayed delivery for RabbitMQ through a binary TTL cascade.
//!
//! # Layout
//!
//! - [`cascade`]: the algorithm as pure logic. Settings and their limits, the
//!   routing key of a delay, the entry exchange, and the topology plan as data.
//!   No I/O; proven with an exhaustive routing simulator and property tests.
//! - [`task`]: a task as submitted over HTTP, validated into what is published.
//!   Pure as well: the clock is an argument.
//! - [`broker`]: everything that talks to RabbitMQ. Connecting, declaring the
//!   plan (with a full diagnosis when the broker holds something else), and
//!   the publisher: confirms, pipelining, reconnection.
//! - [`http`]: the axum API around the two: routes, JSON errors, health.
//! - [`service`]: wires broker and HTTP together and shuts them down in order.
//! - [`config`], [`telemetry`], [`cli`]: settings, logs and the command line.
//!   `main.rs` only calls [`cli::main`].

pub mod broker;
pub mod cascade;
pub mod cli;
pub mod config;
pub mod http;
pub mod service;
pub mod task;
pub mod telemetry;
