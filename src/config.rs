//! Configuration: built-in defaults, then an optional file, then environment
//! variables (`DELAYLINE__SECTION__KEY`), each overriding the one before.
//!
//! Unknown keys are errors rather than silently ignored: a misspelt
//! `unit_ms` would otherwise change every delay without a word.

use std::path::Path;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::cascade::{Cascade, CascadeSettings, SettingsError};
use crate::ingress::{Ingress, IngressError, IngressSettings};

/// A setting that may carry a password (a broker or database URI): its
/// `Debug` never shows it, so settings can be logged whole. Code that needs
/// the value says so with [`Secret::expose`]; what is shown to people goes
/// through a redaction (`crate::broker::redact_uri`).
#[derive(Clone)]
pub struct Secret(SecretString);

impl Secret {
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl Default for Secret {
    fn default() -> Self {
        Secret::from("")
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.expose() == other.expose()
    }
}

impl Eq for Secret {}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Secret(SecretString::from(value))
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(SecretString::from(value))
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret::from)
    }
}

/// Only for layering the defaults under the file and the environment
/// ([`Settings::load`]); nothing else serialises settings.
impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.expose())
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub amqp: AmqpSettings,
    pub http: HttpSettings,
    pub cascade: CascadeSettings,
    pub store: StoreSettings,
    pub metrics: MetricsSettings,
    pub log: LogSettings,
    pub auth: AuthSettings,
    pub schedules: ScheduleSettings,
    pub console: ConsoleSettings,
    /// AMQP ingresses (`[[ingress]]`): exchanges producers publish delayed
    /// messages to with the plugin's `x-delay` header.
    pub ingress: Vec<IngressSettings>,
}

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
            reconnect_max_backoff_ms: 5_000,
            connect_timeout_ms: 3_000,
            misconfiguration_grace_ms: 30_000,
            tls: AmqpTlsSettings::default(),
        }
    }
}

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
        }
    }
}

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
    /// How long a task's row is kept once it has been published and is due.
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

/// Recurring schedules (`/v1/schedules`): how far ahead each occurrence
/// becomes a task, and how often the planner looks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleSettings {
    /// An occurrence becomes a task in the cascade this long before its time
    /// (at most the chain's longest delay), so that a planner that is late,
    /// or a replica that restarts, does not make it late.
    pub lead_ms: u64,
    /// How often the planner looks for schedules whose next occurrence is
    /// within the lead: one index probe, whatever the number of schedules.
    pub poll_ms: u64,
}

impl Default for ScheduleSettings {
    fn default() -> Self {
        Self {
            lead_ms: 30_000,
            poll_ms: 1_000,
        }
    }
}

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

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    pub format: LogFormat,
    /// A tracing env-filter directive; `RUST_LOG` takes precedence when set. lapin is
    /// silenced by default: it logs every channel the broker closes, even expected ones,
    /// and delayline reports the connection problems that matter itself.
    pub filter: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            filter: "info,lapin=off".to_owned(),
        }
    }
}

/// Who may use the API. See `crate::auth`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    pub mode: AuthMode,
    /// A TOML file of `[[clients]]`, read at start and again on SIGHUP.
    pub clients_file: String,
    /// Clients given in the configuration itself (`[[auth.clients]]`).
    pub clients: Vec<ClientSettings>,
    /// How often each quota's count of scheduled tasks is read again from the
    /// ledger (deliveries and other replicas' tasks are seen then).
    pub quota_refresh_ms: u64,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            mode: AuthMode::Auto,
            clients_file: String::new(),
            clients: Vec::new(),
            quota_refresh_ms: 2_000,
        }
    }
}

/// - `auto`: tokens are required as soon as any client is configured (or a
///   clients file is named); without clients the API is open, which is only
///   allowed on a loopback address.
/// - `tokens`: tokens are required, even while no client is configured.
/// - `open`: no tokens, on any address: for a network where every peer is
///   trusted, said explicitly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    #[default]
    Auto,
    Tokens,
    Open,
}

/// One client of the API (the same shape as in the clients file).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSettings {
    /// `[A-Za-z0-9_.-]`, unique: recorded on each of its tasks.
    pub name: String,
    /// Hex SHA-256 of the token (`delayline token create` prints it), or
    /// several, while a token is being rotated.
    pub token_sha256: TokenHashes,
    /// AMQP topic patterns of the destinations it may publish to.
    #[serde(default)]
    pub destinations: Vec<String>,
    /// Exchanges its tasks may name (`"exchange"`) besides the business
    /// exchange, by exact name; `"*"` for any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exchanges: Vec<String>,
    /// `submit`, `read`, `cancel`, `reschedule`, `schedule`, `metrics`, `admin`.
    #[serde(default)]
    pub permissions: Vec<String>,
    /// Tasks per second, refilled continuously (token bucket); none: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<u32>,
    /// Tasks that may be taken at once above the rate (default: one second's worth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Tasks this client may have waiting (not yet due) at once; needs a ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_scheduled: Option<u64>,
}

/// One hash or several (`token_sha256 = ["new", "old"]` during a rotation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenHashes {
    One(String),
    Many(Vec<String>),
}

impl Default for TokenHashes {
    fn default() -> Self {
        TokenHashes::Many(Vec::new())
    }
}

impl TokenHashes {
    pub fn as_slice(&self) -> &[String] {
        match self {
            TokenHashes::One(one) => std::slice::from_ref(one),
            TokenHashes::Many(many) => many,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("configuration: {0}")]
    Cascade(#[from] SettingsError),
    #[error("configuration: {0}")]
    Invalid(String),
    #[error("configuration: {0}")]
    Ingress(#[from] IngressError),
}

pub const ENV_PREFIX: &str = "DELAYLINE";

impl Settings {
    /// Defaults, overridden by `file` when given, overridden by the
    /// environment; checked whole, with the cascade they describe (validated
    /// here, once, and handed on as it is).
    pub fn load(file: Option<&Path>) -> Result<(Self, Cascade), ConfigError> {
        let mut builder =
            config::Config::builder().add_source(config::Config::try_from(&Settings::default())?);
        if let Some(file) = file {
            builder = builder.add_source(config::File::from(file).required(true));
        }
        let settings: Settings = builder
            .add_source(
                config::Environment::with_prefix(ENV_PREFIX)
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true),
            )
            .build()?
            .try_deserialize()?;
        settings.check()?;
        let cascade = settings.cascade()?;
        settings.ingresses(&cascade)?;
        Ok((settings, cascade))
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.amqp.publish_channels == 0 {
            return Err(ConfigError::Invalid(
                "amqp.publish_channels must be at least 1".into(),
            ));
        }
        if self.amqp.uris().is_empty() {
            return Err(ConfigError::Invalid(
                "amqp.uri must name at least one broker".into(),
            ));
        }
        for (index, uri) in self.amqp.uris().iter().enumerate() {
            // Said now: retrying a URI that cannot parse would only log the
            // same warning forever while the service claims to be ready.
            if let Err(error) = uri.parse::<lapin::uri::AMQPUri>() {
                return Err(ConfigError::Invalid(format!(
                    "amqp.uri: address {} of {} is not an AMQP URI ({error}); write \
                     amqp://user:password@host:5672/vhost (or amqps://…), several separated \
                     by commas",
                    index + 1,
                    self.amqp.uris().len()
                )));
            }
        }
        if self.amqp.connect_timeout_ms == 0 {
            return Err(ConfigError::Invalid(
                "amqp.connect_timeout_ms must be at least 1".into(),
            ));
        }
        if self.http.batch_limit == 0 {
            return Err(ConfigError::Invalid(
                "http.batch_limit must be at least 1".into(),
            ));
        }
        if self.schedules.poll_ms == 0 || self.schedules.lead_ms < self.schedules.poll_ms {
            return Err(ConfigError::Invalid(
                "schedules.poll_ms must be at least 1 and schedules.lead_ms at least poll_ms: \
                 an occurrence must become a task before its time"
                    .into(),
            ));
        }
        if self.store.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "store.max_connections must be at least 1".into(),
            ));
        }
        let tls = &self.http.tls;
        if tls.enabled() && (tls.cert_file.is_empty() || tls.key_file.is_empty()) {
            return Err(ConfigError::Invalid(
                "http.tls.cert_file and http.tls.key_file go together".into(),
            ));
        }
        if self.cascade.release_stage == Some(true) && !self.has_ledger() {
            return Err(ConfigError::Invalid(
                "cascade.release_stage = true needs a ledger: the release stage looks every due \
                 task up in it (store.url is \"none\")"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Whether tasks are recorded (`store.url` is not `none`).
    pub fn has_ledger(&self) -> bool {
        self.store.url.expose().trim() != "none"
    }

    /// The ingresses `[[ingress]]` describes, validated for `cascade`. They
    /// need the release stage, which restores a message's routing key and
    /// exchange (and so a ledger).
    pub fn ingresses(&self, cascade: &Cascade) -> Result<Vec<Ingress>, ConfigError> {
        if !self.ingress.is_empty() && !cascade.release_stage() {
            return Err(ConfigError::Invalid(
                "[[ingress]] needs the release stage (a ledger, and cascade.release_stage not \
                 false): it delivers each message with the routing key and to the exchange it \
                 came for"
                    .into(),
            ));
        }
        let mut ingresses: Vec<Ingress> = Vec::with_capacity(self.ingress.len());
        for settings in &self.ingress {
            let ingress = settings.clone().validate(cascade)?;
            if ingresses.iter().any(|i| i.exchange == ingress.exchange) {
                return Err(ConfigError::Invalid(format!(
                    "two [[ingress]] sections for the exchange {:?}",
                    ingress.exchange
                )));
            }
            ingresses.push(ingress);
        }
        Ok(ingresses)
    }

    /// The cascade `[cascade]` describes, validated; the release stage, when
    /// not set, is on exactly when there is a ledger.
    pub fn cascade(&self) -> Result<Cascade, ConfigError> {
        let mut cascade = self.cascade.clone();
        cascade.release_stage = Some(cascade.release_stage.unwrap_or(self.has_ledger()));
        Ok(cascade.validate()?)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_broker_uri_that_cannot_parse_is_refused_at_start_without_its_password() {
        for (uri, said) in [
            (
                "ampq://guest:s3cret@localhost:5672/%2f",
                "Invalid AMQP scheme: ampq",
            ),
            ("not a uri", "address 1 of 1"),
            (
                "amqp://localhost:5672/%2f, amqp://h:notaport/",
                "address 2 of 2",
            ),
        ] {
            let settings = Settings {
                amqp: AmqpSettings {
                    uri: uri.into(),
                    ..AmqpSettings::default()
                },
                ..Settings::default()
            };
            let error = settings.check().unwrap_err().to_string();
            assert!(error.contains(said), "{uri}: {error}");
            assert!(error.contains("amqp://user:password@host"), "{error}");
            assert!(!error.contains("s3cret"), "{error}");
        }
        let cluster = Settings {
            amqp: AmqpSettings {
                uri: "amqp://a:5672/%2f,amqps://u:p@b:5671/v".into(),
                ..AmqpSettings::default()
            },
            ..Settings::default()
        };
        cluster.check().unwrap();
    }

    #[test]
    fn file_overrides_defaults_and_unknown_keys_are_errors() {
        let mut file = tempfile();
        writeln!(
            file.1,
            "[cascade]\nlevels = 8\nunit_ms = 10\nqueue_type = \"classic\""
        )
        .unwrap();
        let (settings, cascade) = Settings::load(Some(&file.0)).unwrap();
        assert_eq!(cascade.levels(), 8);
        assert_eq!(settings.cascade.levels, 8);
        assert_eq!(settings.cascade.unit_ms, 10);
        assert_eq!(settings.amqp, AmqpSettings::default());

        let mut bad = tempfile();
        writeln!(bad.1, "[cascade]\nunit_msec = 10").unwrap();
        let err = Settings::load(Some(&bad.0)).unwrap_err().to_string();
        assert!(err.contains("unit_msec"), "{err}");

        let mut too_long = tempfile();
        writeln!(too_long.1, "[cascade]\nlevels = 33").unwrap();
        let err = Settings::load(Some(&too_long.0)).unwrap_err().to_string();
        assert!(err.contains("largest levels"), "{err}");
    }

    #[test]
    fn the_release_stage_follows_the_ledger_unless_set() {
        let mut settings = Settings::default();
        assert!(
            settings.cascade().unwrap().release_stage(),
            "default: SQLite"
        );
        settings.store.url = "none".into();
        assert!(!settings.cascade().unwrap().release_stage());
        settings.cascade.release_stage = Some(true);
        let err = settings.check().unwrap_err().to_string();
        assert!(err.contains("needs a ledger"), "{err}");
        settings.store.url = "".into();
        settings.cascade.release_stage = Some(false);
        assert!(!settings.cascade().unwrap().release_stage());

        let mut file = tempfile();
        writeln!(file.1, "[cascade]\nrelease_stage = false").unwrap();
        let (_, cascade) = Settings::load(Some(&file.0)).unwrap();
        assert!(!cascade.release_stage());
    }

    #[test]
    fn settings_can_be_logged_without_their_passwords() {
        let mut settings = Settings::default();
        settings.amqp.uri = "amqp://app:amqp-secret@rabbit/%2f".into();
        settings.store.url = "postgres://app:pg-secret@db/delayline".into();
        settings.metrics.management_url = "http://admin:http-secret@rabbit:15672".into();
        let logged = format!("{settings:?} {settings:#?}");
        for secret in ["amqp-secret", "pg-secret", "http-secret"] {
            assert!(!logged.contains(secret), "{logged}");
        }
        assert_eq!(settings.amqp.uris(), ["amqp://app:amqp-secret@rabbit/%2f"]);
    }

    #[test]
    fn the_example_file_documents_exactly_the_defaults() {
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/delayline.example.toml");
        assert_eq!(
            Settings::load(Some(&example)).unwrap().0,
            Settings::default()
        );
    }

    #[test]
    fn ingresses_are_read_from_the_file_and_need_the_release_stage() {
        let mut file = tempfile();
        writeln!(
            file.1,
            "[[ingress]]\nexchange = \"orders.delayed\"\ndeliver_to = \"orders\"\n\
             type = \"topic\"\nrouting_keys = [\"orders.*\"]\n\n\
             [[ingress]]\nexchange = \"jobs.delayed\""
        )
        .unwrap();
        let (settings, cascade) = Settings::load(Some(&file.0)).unwrap();
        let ingresses = settings.ingresses(&cascade).unwrap();
        assert_eq!(ingresses.len(), 2);
        assert_eq!(ingresses[0].deliver_to, "orders");
        assert!(ingresses[0].accepts("orders.eu") && !ingresses[0].accepts("jobs"));
        assert_eq!(ingresses[1].deliver_to, "delayline.business");

        let mut stateless = settings.clone();
        stateless.store.url = "none".to_owned().into();
        let cascade = stateless.cascade().unwrap();
        let error = stateless.ingresses(&cascade).unwrap_err().to_string();
        assert!(error.contains("needs the release stage"), "{error}");
        let mut twice = settings.clone();
        twice.ingress.push(settings.ingress[1].clone());
        let cascade = twice.cascade().unwrap();
        let error = twice.ingresses(&cascade).unwrap_err().to_string();
        assert!(error.contains("two [[ingress]] sections"), "{error}");
        std::fs::remove_file(file.0).unwrap();
    }

    fn tempfile() -> (std::path::PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!("delayline-{}.toml", uuid::Uuid::new_v4()));
        let file = std::fs::File::create(&path).unwrap();
        (path, file)
    }
}
