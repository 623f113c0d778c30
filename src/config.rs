//! Configuration: built-in defaults, then an optional file, then environment
//! variables (`DELAYLINE__SECTION__KEY`), each overriding the one before.
//!
//! Unknown keys are errors rather than silently ignored: a misspelt
//! `unit_ms` would otherwise change every delay without a word.
//!
//! This room only gathers. Each section is defined, defaulted and validated
//! by the room it configures (`broker::AmqpSettings`, `ledger::StoreSettings`,
//! …); here are the layering, the rules that span sections, and the settings
//! derived from several (the cascade with its release stage, the
//! ingresses, the scheduler's timings). Nothing below imports this file:
//! each component is handed its own section (`tests/layout.rs`).

use std::path::Path;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::auth::AuthSettings;
use crate::broker::AmqpSettings;
use crate::cascade::{Cascade, CascadeSettings, SettingsError};
use crate::http::{ConsoleSettings, HttpSettings};
use crate::ingress::{Ingress, IngressError, IngressSettings, Retries, RetryError, RetrySettings};
use crate::ledger::StoreSettings;
use crate::metrics::MetricsSettings;
use crate::operations::OperatorSettings;
use crate::scheduler::{ScheduleSettings, SchedulerSettings};
use crate::stop::StopSettings;
use crate::telemetry::{LogSettings, TraceSettings};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub amqp: AmqpSettings,
    pub http: HttpSettings,
    pub cascade: CascadeSettings,
    pub store: StoreSettings,
    pub metrics: MetricsSettings,
    pub log: LogSettings,
    pub trace: TraceSettings,
    pub auth: AuthSettings,
    pub schedules: ScheduleSettings,
    pub console: ConsoleSettings,
    pub stop: StopSettings,
    /// AMQP ingresses (`[[ingress]]`): exchanges producers publish delayed
    /// messages to with the plugin's `x-delay` header.
    pub ingress: Vec<IngressSettings>,
    /// Retry policies (`[[retry]]`): queues whose dead-lettered messages
    /// delayline brings back later, with backoff, and parks after their
    /// last attempt.
    pub retry: Vec<RetrySettings>,
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
    #[error("configuration: {0}")]
    Retry(#[from] RetryError),
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
            // TOML whatever the name ends in (`delayline.conf`, a mounted
            // secret's key): the format is not guessed from the name.
            let file = config::File::from(file).format(config::FileFormat::Toml);
            builder = builder.add_source(file.required(true));
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
        settings.retries(&cascade)?;
        Ok((settings, cascade))
    }

    /// Each section as its room judges it, then the rules between sections.
    fn check(&self) -> Result<(), ConfigError> {
        for section in [
            self.amqp.validate(),
            self.http.validate(),
            self.store.validate(),
            self.schedules.validate(),
            self.stop.validate(),
            self.trace.validate(),
        ] {
            section.map_err(ConfigError::Invalid)?;
        }
        if self.cascade.release_stage == Some(true) && !self.store.has_ledger() {
            return Err(ConfigError::Invalid(
                "cascade.release_stage = true needs a ledger: the release stage looks every due \
                 task up in it (store.url is \"none\")"
                    .into(),
            ));
        }
        Ok(())
    }

    /// What the operator's commands act with, for `cascade` (this
    /// configuration's chain).
    pub fn operator(&self, cascade: &Cascade) -> OperatorSettings {
        OperatorSettings {
            amqp: self.amqp.clone(),
            store: self.store.clone(),
            management_url: self.metrics.management_url.clone(),
            release_stage: cascade.release_stage(),
        }
    }

    /// The scheduler's timings, from the sections they are set in.
    pub fn scheduler(&self) -> SchedulerSettings {
        SchedulerSettings {
            confirm_timeout: Duration::from_millis(self.amqp.confirm_timeout_ms),
            misconfiguration_grace: Duration::from_millis(self.amqp.misconfiguration_grace_ms),
            retention: Duration::from_millis(self.store.retention_ms),
            prune_every: Duration::from_millis(self.store.prune_interval_ms),
            resend_after: Duration::from_millis(self.store.resend_after_ms),
            schedule_lead: Duration::from_millis(self.schedules.lead_ms),
            schedule_poll: Duration::from_millis(self.schedules.poll_ms),
            schedule_plan_rate: self.schedules.plan_rate,
        }
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

    /// The retry policies `[[retry]]` describes, validated for `cascade`,
    /// with the broker objects they share; `None` without the release
    /// stage. A retry is a task delivered by the release stage to the queue
    /// it failed in (so: a ledger, and the stage). With the stage, the
    /// objects are there even with no section: policies can be set at run
    /// time, over the API.
    pub fn retries(&self, cascade: &Cascade) -> Result<Option<Retries>, ConfigError> {
        if !cascade.release_stage() {
            if self.retry.is_empty() {
                return Ok(None);
            }
            return Err(ConfigError::Invalid(
                "[[retry]] needs the release stage (a ledger, and cascade.release_stage not \
                 false): it keeps every retry and parked message, and delivers each retry back \
                 to the queue it failed in"
                    .into(),
            ));
        }
        Ok(Some(Retries::new(&self.retry, cascade)?))
    }

    /// The cascade `[cascade]` describes, validated; the release stage, when
    /// not set, is on exactly when there is a ledger.
    pub fn cascade(&self) -> Result<Cascade, ConfigError> {
        let mut cascade = self.cascade.clone();
        cascade.release_stage = Some(cascade.release_stage.unwrap_or(self.store.has_ledger()));
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

    #[test]
    fn a_bad_retry_policy_is_refused_at_load_naming_the_setting() {
        let mut file = tempfile();
        writeln!(
            file.1,
            "[[retry]]\nname = \"orders\"\nqueues = [\"orders\"]\ninitial = \"10s\"\n\
             max_delay = \"1s\""
        )
        .unwrap();
        let error = Settings::load(Some(&file.0)).unwrap_err().to_string();
        assert!(error.contains("[[retry]] \"orders\": max_delay"), "{error}");
        let (mut settings, _) = Settings::load(None).unwrap();
        settings.retry = vec![crate::ingress::RetrySettings {
            name: "p".into(),
            queues: vec!["q".into()],
            initial: "1s".into(),
            multiplier: 2.0,
            max_delay: "1m".into(),
            jitter: 0.1,
            max_attempts: 3,
            park_to: None,
            max_lateness: None,
            give_up_after: None,
        }];
        settings.store.url = "none".to_owned().into();
        let cascade = settings.cascade().unwrap();
        let error = settings.retries(&cascade).unwrap_err().to_string();
        assert!(
            error.contains("[[retry]] needs the release stage"),
            "{error}"
        );
        std::fs::remove_file(file.0).unwrap();
    }

    /// A file named as a mounted secret's key or `delayline.conf` is read
    /// as TOML: the name does not choose the format.
    #[test]
    fn a_file_whose_name_does_not_end_in_toml_is_read_as_toml() {
        for name in ["delayline.conf", "config"] {
            let dir = std::env::temp_dir().join(format!("delayline-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir(&dir).unwrap();
            let path = dir.join(name);
            std::fs::write(&path, "[cascade]\nlevels = 9\nunit_ms = 10\n").unwrap();
            let loaded = Settings::load(Some(&path));
            std::fs::remove_dir_all(&dir).unwrap();
            let (_, cascade) = loaded.unwrap();
            assert_eq!(cascade.levels(), 9, "{name}");
        }
    }

    fn tempfile() -> (std::path::PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!("delayline-{}.toml", uuid::Uuid::new_v4()));
        let file = std::fs::File::create(&path).unwrap();
        (path, file)
    }
}
