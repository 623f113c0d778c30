//! `[metrics]`: where `/metrics` is served and how often queue depths are
//! read.

use serde::{Deserialize, Serialize};

use crate::secret::Secret;

/// `GET /metrics`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSettings {
    /// How often the level and unroutable queue depths are read from the
    /// broker; 0 turns it off.
    pub queue_poll_ms: u64,
    /// RabbitMQ's management API, which also counts messages held by a
    /// quorum queue's dead-letter worker: empty for the AMQP node's host on
    /// port 15672 with the AMQP credentials, `http://user:password@host:port`,
    /// or `none`. Where it does not answer, depths come from passive declares
    /// on the publisher's connection (ready messages only).
    pub management_url: Secret,
    /// Empty: `/metrics` is on the API's listener (behind a token when
    /// clients are configured). Otherwise an address of its own, plain HTTP
    /// and open, for a scraper on a private network.
    pub bind: String,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self {
            queue_poll_ms: 5_000,
            management_url: Secret::default(),
            bind: String::new(),
        }
    }
}
