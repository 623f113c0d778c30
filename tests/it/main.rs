//! The integration tests: one binary, one module per area, all against the
//! real broker (and PostgreSQL where a test says so). Every test declares
//! its objects under a prefix of its own and deletes them again (see
//! [`common`]); tests that start RabbitMQ nodes of their own take turns
//! ([`common::nodes`]). No test stops or reconfigures the machine's broker.

mod common;

mod alerts;
mod api;
mod bulk;
mod burst;
mod chaos;
mod command_line;
mod console;
mod contract;
mod deadlines;
mod delivery;
mod deploy;
mod examples;
mod faults;
mod forecast;
mod ingress;
mod ledger;
mod leeway;
mod lifecycle;
mod limits;
mod migrate;
mod partition;
mod precision;
mod provision;
mod release;
mod release_limits;
mod retries;
mod retry_policies;
mod schedules;
mod security;
mod shards;
mod strand;
mod traces;
