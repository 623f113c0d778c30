//! `[http]` and `[console]`: the API's listener, its bounds, its
//! certificate and the web console. The HTTP room owns them and says what
//! is wrong with them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::serve::ConnectionLimits;

/// How long requests in progress may take to finish once shutdown began.
const GRACEFUL_DRAIN: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    pub bind: String,
    /// Largest accepted request body; larger ones get 413.
    pub body_limit_bytes: usize,
    /// Most tasks in one batch request.
    pub batch_limit: usize,
    /// A connection must send a whole request head within this (an idle
    /// keep-alive connection is closed after it too).
    pub header_read_timeout_ms: u64,
    /// A request's body must arrive whole within this, or `408 body_timeout`.
    pub body_read_timeout_ms: u64,
    /// A request not answered within this is `503 deadline_exceeded`.
    pub request_timeout_ms: u64,
    /// Open connections at most; above, a new one is answered `503
    /// too_many_connections` and closed.
    pub max_connections: usize,
    /// Tasks being taken in at once at most (a batch counts its tasks);
    /// above, `503 overloaded` at once.
    pub max_tasks_in_flight: usize,
    /// HTTPS instead of HTTP when both files are set.
    pub tls: HttpTlsSettings,
    /// How often the clients file and the certificate files are checked;
    /// changed contents are read again as on SIGHUP, so that a replaced
    /// file (a Kubernetes Secret swapped in place) reaches every replica by
    /// itself. 0: only on SIGHUP.
    pub reload_check_ms: u64,
}

/// The API's certificate; both files are read again on SIGHUP, so a renewed
/// certificate is served without a restart.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpTlsSettings {
    /// PEM certificate chain, leaf first.
    pub cert_file: String,
    /// PEM private key.
    pub key_file: String,
}

impl HttpTlsSettings {
    pub fn enabled(&self) -> bool {
        !self.cert_file.is_empty() || !self.key_file.is_empty()
    }
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:8080".to_owned(),
            body_limit_bytes: 1024 * 1024,
            batch_limit: 1000,
            header_read_timeout_ms: 20_000,
            body_read_timeout_ms: 10_000,
            request_timeout_ms: 30_000,
            max_connections: 1024,
            max_tasks_in_flight: 4096,
            tls: HttpTlsSettings::default(),
            reload_check_ms: 2_000,
        }
    }
}

/// The web console under `/console`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleSettings {
    /// Serve it; with clients configured it asks for a token.
    pub enabled: bool,
}

impl Default for ConsoleSettings {
    fn default() -> Self {
        Self { enabled: true }
    }
}

impl HttpSettings {
    /// The accept loop's bounds (`serve`).
    pub fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            max_connections: self.max_connections.max(1),
            drain: GRACEFUL_DRAIN,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.batch_limit == 0 {
            return Err("http.batch_limit must be at least 1".into());
        }
        if (1..100).contains(&self.reload_check_ms) {
            return Err("http.reload_check_ms must be 0 (off) or at least 100".into());
        }
        let tls = &self.tls;
        if tls.enabled() && (tls.cert_file.is_empty() || tls.key_file.is_empty()) {
            return Err("http.tls.cert_file and http.tls.key_file go together".into());
        }
        Ok(())
    }
}
