//! The operator's commands as an application layer: provisioning and
//! checking the chain, migrating it, requeueing what was unroutable,
//! creating client tokens. Each coordinates the ledger and the broker and
//! returns what it did; `cli` parses arguments, calls one and prints.
//!
//! Decisions about a task live here, above the broker adapter: which copies
//! a migration drops (asked of the ledger, see [`migrate`]), which tasks it
//! marks failed, which unroutable tasks count as delivered again.

pub mod migrate;
pub mod provision;
mod settings;
pub mod token;
pub mod unroutable;

use lapin::Connection;
use prometheus_client::metrics::histogram::Histogram;

use crate::auth::AuthError;
use crate::broker::AmqpSettings;
use crate::broker::{BrokerError, BrokerTls, MigrateError, connect_any};
use crate::ledger::{Ledger, LedgerError};

pub use settings::OperatorSettings;

/// Why a command could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum OperationError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("{0}")]
    Clients(#[from] AuthError),
    /// Refused before anything was changed, with the reason.
    #[error("{0}")]
    Refused(String),
    #[error("cannot {action} {path}: {source}")]
    File {
        action: &'static str,
        path: String,
        source: std::io::Error,
    },
}

/// Runs `work` on a broker connection of its own named `name`, closed
/// whatever the outcome.
async fn on_broker<T>(
    amqp: &AmqpSettings,
    name: &str,
    work: impl AsyncFnOnce(&Connection) -> Result<T, OperationError>,
) -> Result<T, OperationError> {
    let timeout = std::time::Duration::from_millis(amqp.connect_timeout_ms);
    let tls = BrokerTls::from_settings(&amqp.tls)?;
    let connection = connect_any(&amqp.uris(), name, timeout, &tls).await?;
    let outcome = work(&connection).await;
    let _ = connection.close(200, "done".into()).await;
    outcome
}

/// The ledger of `settings`, for a command; None without one.
async fn open_ledger(settings: &OperatorSettings) -> Result<Option<Ledger>, OperationError> {
    // A command's commits are not observed.
    let commit_group_size = Histogram::new([1.0]);
    let release_stage = settings.release_stage;
    Ok(crate::ledger::open(&settings.store, release_stage, commit_group_size).await?)
}
