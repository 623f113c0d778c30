//! What every command needs: why it failed, a broker connection of its own,
//! and the ledger.

use crate::ledger::CommitObservers;
use lapin::Connection;

use super::settings::OperatorSettings;
use crate::auth::AuthError;
use crate::broker::AmqpSettings;
use crate::broker::{BrokerError, BrokerTls, MigrateError, connect_any};
use crate::ledger::{Ledger, LedgerError};

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
pub(super) async fn on_broker<T>(
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

/// The ledger of `settings` if one was ever made, for a command that only
/// reads it or changes what it holds; None without one.
pub(super) async fn open_existing_ledger(
    settings: &OperatorSettings,
) -> Result<Option<Ledger>, OperationError> {
    if crate::ledger::is_unmade(&settings.store)? {
        return Ok(None);
    }
    open_ledger(settings).await
}

/// The ledger of `settings`, for a command; None without one.
pub(super) async fn open_ledger(
    settings: &OperatorSettings,
) -> Result<Option<Ledger>, OperationError> {
    // A command's commits are not observed.
    let release_stage = settings.release_stage;
    Ok(crate::ledger::open(
        &settings.store,
        release_stage,
        CommitObservers::unobserved(),
    )
    .await?)
}
