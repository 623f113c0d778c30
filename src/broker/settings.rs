//! `[amqp]`: where the broker is and how delayline talks to it. The broker
//! room owns these settings and says what is wrong with them.

use serde::{Deserialize, Serialize};

use crate::secret::Secret;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AmqpSettings {
    /// `amqp://user:password@host:port/vhost` (`%2f` is the default vhost).
    /// Several, separated by commas, for the nodes of a cluster: delayline
    /// connects to the first that answers and moves on when it is lost.
    pub uri: Secret,
    /// Channels publishes are spread over; confirms are pipelined on each.
    /// With two or more, the first is the release stage's alone.
    pub publish_channels: usize,
    /// How long a publish waits for the broker's confirm: then the task is
    /// answered `pending` and its confirm still awaited (with a ledger), or
    /// the request gets 503 `broker_timeout` (without one).
    pub confirm_timeout_ms: u64,
    /// How long, counted from the publish, a confirm that missed
    /// `confirm_timeout_ms` is still awaited before the task is published
    /// again (a possible second copy, which the release stage drops): a
    /// node cut off from its cluster can hold a channel open and never
    /// answer. Alarms that block publishing longer than this publish the
    /// task once more when they clear. Never shorter than
    /// `confirm_timeout_ms`: a smaller value counts as that.
    pub late_confirm_limit_ms: u64,
    /// Upper bound of the exponential back-off between reconnection attempts.
    pub reconnect_max_backoff_ms: u64,
    /// How long one connection attempt to one address may take.
    pub connect_timeout_ms: u64,
    /// How long RabbitMQ may refuse delayline (credentials, vhost,
    /// permissions) before `/readyz` answers 503: a misconfiguration, unlike
    /// an outage, will not pass by waiting.
    pub misconfiguration_grace_ms: u64,
    /// For `amqps://` URIs: whom to trust and who delayline is.
    pub tls: AmqpTlsSettings,
}

/// TLS towards the broker. The system's trust store is always used; a
/// `ca_file` adds to it (a private CA). A client certificate is for brokers
/// that authenticate by certificate (`?auth_mechanism=external` in the URI).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AmqpTlsSettings {
    /// PEM bundle of CA certificates the broker's certificate may chain to.
    pub ca_file: String,
    /// PEM certificate chain presented to the broker.
    pub cert_file: String,
    /// PEM (PKCS#8, PKCS#1 or SEC1) private key of `cert_file`.
    pub key_file: String,
}

impl AmqpSettings {
    /// How long a publish's confirm is awaited in all (see
    /// [`AmqpSettings::late_confirm_limit_ms`]).
    pub fn late_confirm_limit(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.late_confirm_limit_ms.max(self.confirm_timeout_ms))
    }

    /// The broker addresses of `uri`, in order.
    pub fn uris(&self) -> Vec<String> {
        self.uri
            .expose()
            .split(',')
            .map(str::trim)
            .filter(|uri| !uri.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

impl Default for AmqpSettings {
    fn default() -> Self {
        Self {
            uri: Secret::from("amqp://guest:guest@127.0.0.1:5672/%2f"),
            publish_channels: 5,
            confirm_timeout_ms: 10_000,
            late_confirm_limit_ms: 60_000,
            reconnect_max_backoff_ms: 5_000,
            connect_timeout_ms: 3_000,
            misconfiguration_grace_ms: 30_000,
            tls: AmqpTlsSettings::default(),
        }
    }
}

impl AmqpSettings {
    /// What is wrong with `[amqp]`, said at start-up: retrying a URI that
    /// cannot parse would only log the same warning forever while the
    /// service claims to be ready.
    pub fn validate(&self) -> Result<(), String> {
        if self.publish_channels == 0 {
            return Err("amqp.publish_channels must be at least 1".into());
        }
        let uris = self.uris();
        if uris.is_empty() {
            return Err("amqp.uri must name at least one broker".into());
        }
        for (index, uri) in uris.iter().enumerate() {
            if let Err(error) = uri.parse::<lapin::uri::AMQPUri>() {
                return Err(format!(
                    "amqp.uri: address {} of {} is not an AMQP URI ({error}); write \
                     amqp://user:password@host:5672/vhost (or amqps://…), several separated \
                     by commas",
                    index + 1,
                    uris.len()
                ));
            }
        }
        if self.connect_timeout_ms == 0 {
            return Err("amqp.connect_timeout_ms must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_late_confirm_limit_is_never_shorter_than_the_confirm_timeout() {
        let mut amqp = AmqpSettings::default();
        assert_eq!(amqp.late_confirm_limit().as_millis(), 60_000);
        // A configuration from before the limit existed, with a longer
        // timeout, still starts: the limit follows it.
        amqp.confirm_timeout_ms = 120_000;
        amqp.validate().unwrap();
        assert_eq!(amqp.late_confirm_limit().as_millis(), 120_000);
    }
}
