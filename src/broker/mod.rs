//! The adapter to RabbitMQ, and the only module that talks to it: connecting,
//! declaring the plan it is given (`provision`, `check`, `diagnose`),
//! publishing the messages it is given (`publisher`), consuming a queue in
//! windows for the release stage (`consume`), reading depths
//! (`inspect`, `management`), moving a chain (`migrate`), requeueing the
//! unroutable queue (`unroutable`) and deleting a chain (`deprovision`). It
//! knows nothing of tasks, ledgers or HTTP; channels are opened through [`open_channel`] and confirms read
//! through [`confirm_outcome`], each written once; which publish a returned
//! message belongs to is decided in `returns`.

mod check;
mod consume;
mod deprovision;
mod diagnose;
mod error;
mod inspect;
mod management;
mod migrate;
mod options;
mod provision;
mod publish_error;
mod publisher;
mod returns;
mod settings;
mod unroutable;

pub(crate) use check::{CheckReport, discover_chain};
pub use check::{Status, check};
pub use consume::{ConsumeLimits, Settle};
pub(crate) use consume::{Inbound, Windows};
pub use deprovision::{ObjectKind, Standing};
pub(crate) use deprovision::{delete as delete_objects, standing};
pub use error::BrokerError;
pub(crate) use error::Context;
pub(crate) use error::TopologyConflict;
pub use inspect::{exchange_exists, queue_state};
pub(crate) use management::{ManagementApi, ManagementError, QueueCounts, QueueWiring};
pub(crate) use migrate::{MigrateError, Survey, survey};
pub use migrate::{MigrationReport, OldChain, migrate_topology};
pub(crate) use provision::ProvisionReport;
pub use provision::{provision, teardown};
pub(crate) use publish_error::PublishError;
pub(crate) use publish_error::confirm_outcome;
pub(crate) use publisher::{BrokerStatus, IsolatedPublisher, LateConfirm, Published};
pub use publisher::{DEFAULT_FRAME_MAX, Publisher, PublisherOptions, content_header_frame_size};
pub(crate) use settings::AmqpSettings;
pub use unroutable::requeue_unroutable;
mod connection;

pub use connection::{BrokerTls, connect};
pub(crate) use connection::{connect_any, connect_with};
pub(crate) use connection::{field_table, open_channel, precondition_failed};
#[cfg(test)]
pub(crate) use publisher::BrokerProblem;
