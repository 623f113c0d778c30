//! What goes wrong talking to RabbitMQ, each error with what was being
//! attempted ([`Context`]), and a declaration the broker refused because it
//! holds something else ([`TopologyConflict`]).

use std::fmt;
use std::time::Duration;

use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("cannot connect to RabbitMQ at {uri}: {source}")]
    Connect { uri: String, source: lapin::Error },
    #[error("cannot connect to RabbitMQ at {uri}: no answer within {after:?}")]
    ConnectTimeout { uri: String, after: Duration },
    #[error("{context}: {source}")]
    Call {
        context: String,
        source: lapin::Error,
    },
    #[error("{context}: no answer within {after:?}")]
    CallTimeout { context: String, after: Duration },
    #[error(transparent)]
    Conflict(#[from] TopologyConflict),
    #[error(
        "the chain belongs to another ledger: {marker:?} names ledger {theirs}, this \
         delayline's ledger is {ours}. A chain's release stage delivers or drops each due task \
         by what its ledger says (cancelled, moved, delivered), so every delayline serving the \
         chain must share that ledger: give replicas one PostgreSQL ledger (store.url = \
         \"postgres://…\"), or give this one a chain of its own (another cascade.prefix). If \
         the chain's ledger is gone for good, deleting the exchange {marker:?} hands the chain \
         to this ledger; what waits in the chain is then delivered unchecked, cancelled tasks \
         included"
    )]
    AnotherLedger {
        marker: String,
        ours: String,
        theirs: String,
    },
    #[error(
        "the chain has more shards than cascade.shards = {shards}: {queue:?} exists, and what waits \
         in a shard beyond the configured ones would be consumed by no release stage. The shard \
         count is part of the chain: to change it, raise cascade.version and run `delayline \
         migrate-topology --from <the old version>`, which moves every shard's messages"
    )]
    MoreShards { queue: String, shards: u32 },
    #[error("broker TLS: {0}")]
    Tls(String),
}

impl BrokerError {
    /// A conflict needs an operator; anything else may pass by reconnecting.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            BrokerError::Conflict(_)
                | BrokerError::AnotherLedger { .. }
                | BrokerError::MoreShards { .. }
        )
    }

    /// The broker refused delayline itself (credentials, a missing vhost,
    /// missing permissions), as opposed to being away: retrying goes on, but
    /// it will not pass until someone changes the configuration.
    pub fn is_misconfiguration(&self) -> bool {
        let source = match self {
            BrokerError::Connect { source, .. } | BrokerError::Call { source, .. } => source,
            BrokerError::Tls(_) => return true,
            BrokerError::ConnectTimeout { .. }
            | BrokerError::CallTimeout { .. }
            | BrokerError::Conflict(_)
            | BrokerError::AnotherLedger { .. }
            | BrokerError::MoreShards { .. } => return false,
        };
        match source.kind() {
            lapin::ErrorKind::ProtocolError(amqp) => matches!(
                amqp.kind(),
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)
                    | AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED)
            ),
            lapin::ErrorKind::AuthProviderError(_) => true,
            lapin::ErrorKind::IOError(io) => is_certificate_error(io),
            _ => false,
        }
    }
}

/// Whether a TLS handshake failed over a certificate (an untrusted CA, a
/// wrong host name, an expired or refused certificate): waiting will not fix
/// it, unlike a broker that is away.
fn is_certificate_error(io: &std::io::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = io.get_ref().map(|e| e as _);
    while let Some(error) = source {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return matches!(
                tls,
                rustls::Error::InvalidCertificate(_)
                    | rustls::Error::NoCertificatesPresented
                    | rustls::Error::AlertReceived(
                        rustls::AlertDescription::BadCertificate
                            | rustls::AlertDescription::CertificateRequired
                            | rustls::AlertDescription::UnknownCA
                            | rustls::AlertDescription::CertificateUnknown
                            | rustls::AlertDescription::HandshakeFailure
                    )
            );
        }
        source = error.source();
    }
    false
}

impl BrokerError {
    /// A TLS handshake refused over a certificate (either side's): no retry
    /// will pass it, and no grace applies, unlike credentials that may be
    /// being created right now.
    pub fn is_certificate_problem(&self) -> bool {
        match self {
            BrokerError::Tls(_) => true,
            BrokerError::Connect { source, .. } | BrokerError::Call { source, .. } => {
                matches!(source.kind(), lapin::ErrorKind::IOError(io) if is_certificate_error(io))
            }
            _ => false,
        }
    }
}

/// Adds what was being attempted to every broker error.
pub(crate) trait Context<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T, BrokerError>;
}

impl<T> Context<T> for Result<T, lapin::Error> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T, BrokerError> {
        self.map_err(|source| BrokerError::Call {
            context: context(),
            source,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    pub field: String,
    pub existing: String,
    pub wanted: String,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct TopologyConflict {
    /// "queue" or "exchange".
    pub kind: &'static str,
    pub name: String,
    pub differences: Vec<Difference>,
    pub advice: String,
}

impl fmt::Display for TopologyConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} {:?} already exists on the broker with different settings:",
            self.kind, self.name
        )?;
        for d in &self.differences {
            writeln!(
                f,
                "  - {}: the broker has {}, delayline wants {}",
                d.field, d.existing, d.wanted
            )?;
        }
        write!(f, "{}", self.advice)
    }
}
