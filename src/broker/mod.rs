//! The adapter to RabbitMQ, and the only module that talks to it: connecting,
//! declaring the plan it is given (`provision`, `check`, `diagnose`),
//! publishing the messages it is given (`publisher`), consuming a queue in
//! windows for the release stage (`consume`), reading depths
//! (`inspect`, `management`), moving a chain (`migrate`) and requeueing the
//! unroutable queue (`unroutable`). It knows nothing of tasks, ledgers or
//! HTTP; channels are opened through [`open_channel`] and confirms read
//! through [`confirm_outcome`], each written once.

mod check;
mod consume;
mod diagnose;
mod error;
mod inspect;
mod management;
mod migrate;
mod options;
mod provision;
mod publish_error;
mod publisher;
mod settings;
mod unroutable;

pub use check::{CheckReport, CheckedObject, OtherChain, Status, check, discover_chain};
pub use consume::{ConsumeLimits, Inbound, Settle, Window, Windows};
pub(crate) use error::Context;
pub use error::{BrokerError, Difference, TopologyConflict};
pub use inspect::{QueueState, exchange_exists, queue_state};
pub use management::{ManagementApi, ManagementError, QueueCounts};
pub use migrate::{
    EmptinessCheck, MigrateError, MigrationReport, OldChain, StillWanted, Survey, migrate_topology,
    survey,
};
pub use provision::{ProvisionReport, provision, teardown};
pub use publish_error::PublishError;
pub(crate) use publish_error::confirm_outcome;
pub use publisher::{
    BrokerProblem, BrokerStatus, DEFAULT_FRAME_MAX, IsolatedPublisher, LateConfirm, Published,
    Publisher, PublisherOptions, SharedConnection, content_header_frame_size,
};
pub use settings::{AmqpSettings, AmqpTlsSettings};
pub use unroutable::requeue_unroutable;
mod connection;

pub use connection::{BrokerTls, connect, connect_any, connect_with};
pub(crate) use connection::{field_table, open_channel, precondition_failed};
