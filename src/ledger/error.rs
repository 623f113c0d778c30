//! What can go wrong in the ledger, and the context every query adds.

use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("store.url {0:?} is neither empty, \"none\", sqlite://… nor postgres://…")]
    UnknownUrl(String),
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the ledger at {target}: {source}")]
    Connect { target: String, source: sqlx::Error },
    #[error("migrating the ledger at {target}: {source}")]
    Migrate {
        target: String,
        source: sqlx::migrate::MigrateError,
    },
    #[error("ledger: {context}: {source}")]
    Query {
        context: &'static str,
        source: sqlx::Error,
    },
    #[error("ledger: {context}: {source}")]
    Sqlite {
        context: &'static str,
        source: rusqlite::Error,
    },
    #[error("cannot start the ledger's writer: {0}")]
    WriterThread(std::io::Error),
    /// The writer counts what falls due itself, so it must not run the
    /// triggers that count it too (an SQLite built without the option).
    #[error("cannot start the ledger's writer: SQLite kept its triggers on")]
    WriterTriggers,
    #[error("ledger row {id}: {reason}")]
    Corrupt { id: String, reason: String },
    #[error("the ledger writer has stopped")]
    Closed,
    /// A health question the ledger did not answer in time (see
    /// [`super::Ledger::answered`]).
    #[error(
        "ledger: {context}: no answer within {} ms (a table locked by a migration or a \
         VACUUM FULL, or a database server that hangs)", .within.as_millis()
    )]
    Silent {
        context: &'static str,
        within: std::time::Duration,
    },
    /// One failure answered to every write of the group it broke.
    #[error(transparent)]
    Shared(Arc<LedgerError>),
}

/// Adds what was being done to a database error.
pub(crate) trait QueryContext<T> {
    fn context(self, context: &'static str) -> Result<T, LedgerError>;
}

impl<T> QueryContext<T> for Result<T, sqlx::Error> {
    fn context(self, context: &'static str) -> Result<T, LedgerError> {
        self.map_err(|source| LedgerError::Query { context, source })
    }
}

impl<T> QueryContext<T> for Result<T, rusqlite::Error> {
    fn context(self, context: &'static str) -> Result<T, LedgerError> {
        self.map_err(|source| LedgerError::Sqlite { context, source })
    }
}

impl LedgerError {
    /// PostgreSQL broke the transaction off to end a deadlock, or for a
    /// serialization failure: nothing of it was committed, and the same
    /// transaction run again normally succeeds. Two replicas' groups lock
    /// the same tasks in different orders (one claims what the other marks
    /// delivered), so this happens in normal operation.
    pub fn is_transient_conflict(&self) -> bool {
        match self {
            LedgerError::Query {
                source: sqlx::Error::Database(error),
                ..
            } => matches!(error.code().as_deref(), Some("40P01" | "40001")),
            LedgerError::Shared(inner) => inner.is_transient_conflict(),
            _ => false,
        }
    }
}
