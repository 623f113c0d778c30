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
mod inspect;
mod management;
mod migrate;
mod options;
mod provision;
mod publisher;
mod settings;
mod unroutable;

use std::time::Duration;

use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Confirmation, Connection, ConnectionProperties};

pub use check::{CheckReport, CheckedObject, OtherChain, Status, check, discover_chain};
pub use consume::{ConsumeLimits, Inbound, Settle, Window, Windows};
pub use diagnose::{Difference, TopologyConflict};
pub use inspect::{QueueState, exchange_exists, queue_state};
pub use management::{ManagementApi, ManagementError, QueueCounts};
pub use migrate::{
    EmptinessCheck, MigrateError, MigrationReport, OldChain, StillWanted, Survey, migrate_topology,
    survey,
};
pub use provision::{ProvisionReport, provision, teardown};
pub use publisher::{
    BrokerProblem, BrokerStatus, DEFAULT_FRAME_MAX, IsolatedPublisher, LateConfirm, PublishError,
    Published, Publisher, PublisherOptions, SharedConnection, content_header_frame_size,
};
pub use settings::{AmqpSettings, AmqpTlsSettings};
pub use unroutable::requeue_unroutable;

use crate::cascade::{ArgValue, Arguments};
use crate::secret::redact_uri;

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
    #[error("broker TLS: {0}")]
    Tls(String),
}

impl BrokerError {
    /// A conflict needs an operator; anything else may pass by reconnecting.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            BrokerError::Conflict(_) | BrokerError::AnotherLedger { .. }
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
            | BrokerError::AnotherLedger { .. } => return false,
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

/// TLS towards the broker (`amqps://`): the trusted CAs beyond the system's,
/// and the client certificate, read once at start-up so that a missing or
/// unreadable file is an error then, not at each reconnection.
#[derive(Clone, Default)]
pub struct BrokerTls(lapin::tcp::OwnedTLSConfig);

impl std::fmt::Debug for BrokerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerTls")
            .field("ca", &self.0.cert_chain.is_some())
            .field("client_certificate", &self.0.identity.is_some())
            .finish()
    }
}

impl BrokerTls {
    pub fn from_settings(tls: &AmqpTlsSettings) -> Result<BrokerTls, BrokerError> {
        let read = |what: &str, path: &str| {
            std::fs::read(path)
                .map_err(|error| BrokerError::Tls(format!("{what} {path:?}: {error}")))
        };
        let cert_chain = match tls.ca_file.as_str() {
            "" => None,
            path => Some(
                String::from_utf8(read("amqp.tls.ca_file", path)?).map_err(|_| {
                    BrokerError::Tls(format!("amqp.tls.ca_file {path:?} is not PEM"))
                })?,
            ),
        };
        let identity = match (tls.cert_file.as_str(), tls.key_file.as_str()) {
            ("", "") => None,
            ("", _) | (_, "") => {
                return Err(BrokerError::Tls(
                    "amqp.tls.cert_file and amqp.tls.key_file go together".into(),
                ));
            }
            (cert, key) => Some(lapin::tcp::OwnedIdentity::PKCS8 {
                pem: read("amqp.tls.cert_file", cert)?,
                key: read("amqp.tls.key_file", key)?,
            }),
        };
        Ok(BrokerTls(lapin::tcp::OwnedTLSConfig {
            identity,
            cert_chain,
        }))
    }
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

/// A new channel on `connection`; `purpose` says what for, in the error.
pub(crate) async fn open_channel(
    connection: &Connection,
    purpose: impl FnOnce() -> String,
) -> Result<Channel, BrokerError> {
    connection.create_channel().await.context(purpose)
}

/// What a publisher confirm says about one message: `Ok` only when the
/// broker took it and routed it somewhere.
pub(crate) fn confirm_outcome(confirmation: Confirmation) -> Result<(), PublishError> {
    match confirmation {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) => Err(PublishError::Returned(format!(
            "{} {}",
            returned.reply_code, returned.reply_text
        ))),
        Confirmation::Nack(_) => Err(PublishError::Nacked),
        Confirmation::NotRequested => Err(PublishError::Broker(
            "the channel is not in confirm mode".to_owned(),
        )),
    }
}

pub async fn connect(uri: &str, name: &str) -> Result<Connection, BrokerError> {
    connect_with(uri, name, &BrokerTls::default()).await
}

/// Connects to `uri` (`amqp://` or `amqps://`) with `tls` for the latter.
pub async fn connect_with(
    uri: &str,
    name: &str,
    tls: &BrokerTls,
) -> Result<Connection, BrokerError> {
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let error = |source| BrokerError::Connect {
        uri: redact_uri(uri),
        source,
    };
    let runtime = lapin::runtime::default_runtime().map_err(error)?;
    Connection::connect_with_config(uri, properties, tls.0.clone(), runtime)
        .await
        .map_err(error)
}

/// Connects to the first of `uris` that answers (a cluster's nodes, in the
/// order given); the error is the last address's.
pub async fn connect_any(
    uris: &[String],
    name: &str,
    timeout: Duration,
    tls: &BrokerTls,
) -> Result<Connection, BrokerError> {
    let mut last_error = None;
    for uri in uris {
        let attempt = tokio::time::timeout(timeout, connect_with(uri, name, tls))
            .await
            .unwrap_or_else(|_| {
                Err(BrokerError::ConnectTimeout {
                    uri: redact_uri(uri),
                    after: timeout,
                })
            });
        match attempt {
            Ok(connection) => return Ok(connection),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(|| BrokerError::ConnectTimeout {
        uri: "(no broker address configured)".to_owned(),
        after: timeout,
    }))
}

pub(crate) fn amqp_value(value: &ArgValue) -> AMQPValue {
    match value {
        ArgValue::Str(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        ArgValue::Int(i) => AMQPValue::LongLongInt(*i),
    }
}

pub(crate) fn field_table(arguments: &Arguments) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in arguments {
        table.insert(ShortString::from(key.as_str()), amqp_value(value));
    }
    table
}

/// The broker's text for a PRECONDITION_FAILED channel error, if that is what `error` is.
pub(crate) fn precondition_failed(error: &lapin::Error) -> Option<String> {
    match error.kind() {
        lapin::ErrorKind::ProtocolError(amqp)
            if *amqp.kind() == AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) =>
        {
            let text = amqp.get_message().as_str();
            Some(
                text.strip_prefix("PRECONDITION_FAILED - ")
                    .unwrap_or(text)
                    .to_owned(),
            )
        }
        _ => None,
    }
}
