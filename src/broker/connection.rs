//! Connecting to RabbitMQ (the first of a cluster's nodes that answers,
//! over TLS when asked), the adapter's errors with what was attempted, and
//! the channel and confirm helpers every part of the adapter uses.

use std::time::Duration;

use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ConnectionProperties};

use super::error::{BrokerError, Context};
use super::settings::AmqpTlsSettings;
use crate::cascade::{ArgValue, Arguments};
use crate::secret::redact_uri;

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

/// A new channel on `connection`; `purpose` says what for, in the error.
pub(crate) async fn open_channel(
    connection: &Connection,
    purpose: impl FnOnce() -> String,
) -> Result<Channel, BrokerError> {
    connection.create_channel().await.context(purpose)
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
