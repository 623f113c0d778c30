//! `[store]`: where the ledger lives and how long it keeps what. The one
//! place that decides whether there is a ledger at all
//! ([`StoreSettings::location`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::LedgerError;
use crate::secret::{Secret, redact_uri};

/// The task ledger. See `crate::ledger`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSettings {
    /// Empty: SQLite in `data_dir`. Otherwise `sqlite://path`, `postgres://…`,
    /// or `none` for the stateless mode (no ledger: 503 while the broker is down).
    pub url: Secret,
    /// Where the embedded SQLite ledger lives.
    pub data_dir: String,
    /// Connections in the pool.
    pub max_connections: u32,
    /// Tasks waiting for the broker beyond which new tasks get 503, so that
    /// an outage cannot fill the disk silently.
    pub max_pending: u64,
    /// How long a task's row is kept once it has been published and is due
    /// (and a finished bulk operation once it finished).
    pub retention_ms: u64,
    /// How often rows past their retention are deleted.
    pub prune_interval_ms: u64,
    /// With the release stage: a task still `scheduled` this long after its
    /// due time never reached the stage (the broker lost its message) and is
    /// published again. 0 never does.
    pub resend_after_ms: u64,
    /// Bytes of the payload kept after publishing, for inspection; 0 keeps none.
    /// Until then the whole payload is kept: the forwarder may need it.
    pub payload_copy_bytes: u32,
    /// How long `/readyz` and a `/metrics` scrape wait for the ledger to
    /// answer: a table locked by a migration, or a server that hangs, must
    /// not hold them (a scrape cut off by Prometheus loses every metric just
    /// when they matter).
    pub health_timeout_ms: u64,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            url: Secret::default(),
            data_dir: "data".to_owned(),
            max_connections: 8,
            max_pending: 100_000,
            retention_ms: 7 * 24 * 3600 * 1000,
            prune_interval_ms: 60_000,
            resend_after_ms: 60_000,
            payload_copy_bytes: 64 * 1024,
            health_timeout_ms: 800,
        }
    }
}

impl StoreSettings {
    /// Whether tasks are recorded (`store.url` is not `none`): the one place
    /// this is decided.
    pub fn has_ledger(&self) -> bool {
        self.url.expose().trim() != "none"
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.max_connections == 0 {
            return Err("store.max_connections must be at least 1".into());
        }
        if !(1..=60_000).contains(&self.health_timeout_ms) {
            return Err("store.health_timeout_ms must be between 1 and 60000".into());
        }
        Location::parse(self)
            .map(|_| ())
            .map_err(|error| error.to_string())
    }
}

/// Where the ledger lives, as `store.url` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Sqlite(PathBuf),
    Postgres(String),
}

/// Whether `settings` name a ledger that was never made: a SQLite file that
/// does not exist (opening one makes it). A PostgreSQL ledger is taken to
/// exist; without a ledger there is none to make.
pub fn is_unmade(settings: &StoreSettings) -> Result<bool, LedgerError> {
    Ok(matches!(Location::parse(settings)?, Some(Location::Sqlite(path)) if !path.exists()))
}

impl Location {
    /// `None` for the stateless mode (`store.url = "none"`).
    pub fn parse(settings: &StoreSettings) -> Result<Option<Location>, LedgerError> {
        if !settings.has_ledger() {
            return Ok(None);
        }
        let url = settings.url.expose().trim();
        if url.is_empty() {
            let path = Path::new(&settings.data_dir).join("delayline.db");
            return Ok(Some(Location::Sqlite(path)));
        }
        if let Some(path) = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
        {
            let path = path.split('?').next().unwrap_or(path);
            return Ok(Some(Location::Sqlite(PathBuf::from(path))));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Some(Location::Postgres(url.to_owned())));
        }
        Err(LedgerError::UnknownUrl(url.to_owned()))
    }

    /// For logs and errors: never the password.
    pub fn describe(&self) -> String {
        match self {
            // Absolute: a relative path (the default `data/delayline.db`)
            // depends on the directory delayline was started from.
            Location::Sqlite(path) => format!(
                "sqlite://{}",
                std::path::absolute(path)
                    .unwrap_or_else(|_| path.clone())
                    .display()
            ),
            Location::Postgres(url) => redact_uri(url),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location(url: &str) -> Result<Option<Location>, LedgerError> {
        Location::parse(&StoreSettings {
            url: url.into(),
            data_dir: "/var/lib/delayline".to_owned(),
            ..StoreSettings::default()
        })
    }

    #[test]
    fn a_health_timeout_is_between_a_millisecond_and_a_minute() {
        for (timeout, valid) in [
            (0, false),
            (1, true),
            (800, true),
            (60_000, true),
            (60_001, false),
        ] {
            let settings = StoreSettings {
                health_timeout_ms: timeout,
                ..StoreSettings::default()
            };
            assert_eq!(settings.validate().is_ok(), valid, "{timeout}");
        }
    }

    #[test]
    fn store_url_picks_the_backend() {
        assert_eq!(
            location("").unwrap(),
            Some(Location::Sqlite(PathBuf::from(
                "/var/lib/delayline/delayline.db"
            )))
        );
        assert_eq!(location("none").unwrap(), None);
        assert_eq!(
            location("sqlite:///tmp/x.db?mode=rwc").unwrap(),
            Some(Location::Sqlite(PathBuf::from("/tmp/x.db")))
        );
        let pg = location("postgres://app:secret@db/delayline")
            .unwrap()
            .unwrap();
        assert_eq!(pg.describe(), "postgres://app:***@db/delayline");
        assert!(matches!(
            location("mysql://db"),
            Err(LedgerError::UnknownUrl(_))
        ));
    }
}
