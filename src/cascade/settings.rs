//! Cascade settings and their validation.
//!
//! Everything the broker would refuse, or that would make a delay silently
//! wrong, is rejected here, at start-up, before any object is declared.

use serde::{Deserialize, Serialize};

use super::names::{
    level_exchange_name, level_queue_name, poison_queue_name, release_queue_name,
    unroutable_exchange_name, unroutable_queue_name,
};

/// The largest `x-message-ttl` RabbitMQ accepts (10 years, measured on 3.10.8).
pub const MAX_QUEUE_TTL_MS: u64 = 315_360_000_000;

/// More levels than this could not be written as a 64-bit number of units.
pub const MAX_LEVELS: u32 = 64;

/// AMQP short strings (exchange, queue names, routing keys) hold at most 255 bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// The kind of queue each level uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum QueueType {
    /// Replicated, with at-least-once dead-lettering: nothing is lost in transit between levels.
    #[default]
    Quorum,
    /// Single-node durable queues, for brokers without quorum queue support.
    Classic,
}

impl TryFrom<String> for QueueType {
    type Error = String;

    /// Said so that a misspelt setting reads as one, not as serde's enum jargon.
    fn try_from(text: String) -> Result<Self, String> {
        match text.as_str() {
            "quorum" => Ok(QueueType::Quorum),
            "classic" => Ok(QueueType::Classic),
            other => Err(format!(
                "queue_type must be \"quorum\" (the default) or \"classic\", got {other:?}"
            )),
        }
    }
}

/// The routing key a due task is delivered with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum DeliveryKey {
    /// The destination itself (`billing.invoice`), as on any topic exchange.
    /// Needs the release stage, which publishes each due task afresh: the
    /// broker cannot rewrite a routing key while dead-lettering.
    #[default]
    Destination,
    /// The cascade's key: one binary digit per level, then the destination;
    /// consumers bind `*.` once per level before it. Always so without the
    /// release stage.
    Digits,
}

impl TryFrom<String> for DeliveryKey {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        match text.as_str() {
            "destination" => Ok(DeliveryKey::Destination),
            "digits" => Ok(DeliveryKey::Digits),
            other => Err(format!(
                "delivery_key must be \"destination\" (the default) or \"digits\", got {other:?}"
            )),
        }
    }
}

impl DeliveryKey {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryKey::Destination => "destination",
            DeliveryKey::Digits => "digits",
        }
    }
}

impl QueueType {
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Quorum => "quorum",
            QueueType::Classic => "classic",
        }
    }
}

/// Settings as configured; [`CascadeSettings::validate`] turns them into a [`Cascade`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CascadeSettings {
    /// Number of levels L; the longest delay is 2^L - 1 units.
    pub levels: u32,
    /// The unit in milliseconds; every delay is rounded up to a whole number of units.
    pub unit_ms: u64,
    pub queue_type: QueueType,
    /// Prefix of every level exchange and queue name.
    pub prefix: String,
    /// The chain's version, part of every level exchange and queue name.
    /// Changing levels, unit_ms or queue_type needs a new version and a
    /// `delayline migrate-topology --from <old version>`.
    pub version: u32,
    /// The exchange tasks are delivered to when their delay has elapsed.
    pub business_exchange: String,
    /// Whether level 0 dead-letters into a release queue that delayline
    /// consumes (so a task can be cancelled or moved until it is due)
    /// instead of straight to the business exchange. Unset: on with a
    /// ledger, off without one (`crate::config::Settings::cascade`). Part of
    /// the chain's identity: changing it needs a new version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_stage: Option<bool>,
    /// The routing key of a delivered task: the destination (the default),
    /// or the cascade's digits before it. Only the release stage can deliver
    /// with the destination alone; without it the digits stay. Not part of
    /// the broker's objects: it takes effect when delayline restarts, for
    /// every task released from then on, and a chain migrated to another
    /// version is delivered by the new chain's setting.
    pub delivery_key: DeliveryKey,
}

impl Default for CascadeSettings {
    fn default() -> Self {
        Self {
            levels: 32,
            unit_ms: 100,
            queue_type: QueueType::Quorum,
            prefix: "delayline".to_owned(),
            version: 1,
            business_exchange: "delayline.business".to_owned(),
            release_stage: None,
            delivery_key: DeliveryKey::Destination,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("cascade.levels must be at least 1")]
    NoLevels,
    #[error("cascade.unit_ms must be at least 1")]
    ZeroUnit,
    #[error("cascade.version must be at least 1")]
    ZeroVersion,
    #[error(
        "cascade.levels = {levels} with unit_ms = {unit_ms} gives the top level a TTL of {top_ttl_ms} ms, \
         above RabbitMQ's limit of {MAX_QUEUE_TTL_MS} ms (10 years); {hint}"
    )]
    TtlTooLong {
        levels: u32,
        unit_ms: u64,
        top_ttl_ms: u128,
        hint: String,
    },
    #[error("cascade.{field} {reason}")]
    InvalidName { field: &'static str, reason: String },
}

/// Validated cascade settings. Holding one proves every level's TTL and every
/// object name is acceptable to the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cascade {
    settings: CascadeSettings,
}

/// The largest number of levels whose top TTL (2^(L-1) units) stays within the broker's limit.
pub fn max_levels_for_unit(unit_ms: u64) -> Option<u32> {
    if unit_ms == 0 || unit_ms > MAX_QUEUE_TTL_MS {
        return None;
    }
    // 2^(L-1) * unit_ms <= MAX  <=>  L - 1 <= log2(MAX / unit_ms)
    Some((MAX_QUEUE_TTL_MS / unit_ms).ilog2() + 1)
}

impl CascadeSettings {
    pub fn validate(self) -> Result<Cascade, SettingsError> {
        if self.levels == 0 {
            return Err(SettingsError::NoLevels);
        }
        if self.unit_ms == 0 {
            return Err(SettingsError::ZeroUnit);
        }
        if self.version == 0 {
            return Err(SettingsError::ZeroVersion);
        }
        let top_ttl_ms = (1u128 << (self.levels - 1).min(127)) * u128::from(self.unit_ms);
        if self.levels > MAX_LEVELS || top_ttl_ms > u128::from(MAX_QUEUE_TTL_MS) {
            let hint = match max_levels_for_unit(self.unit_ms) {
                Some(max) => format!("the largest levels for unit_ms = {} is {max}", self.unit_ms),
                None => format!("unit_ms must not exceed {MAX_QUEUE_TTL_MS}"),
            };
            return Err(SettingsError::TtlTooLong {
                levels: self.levels,
                unit_ms: self.unit_ms,
                top_ttl_ms,
                hint,
            });
        }
        check_name("prefix", &self.prefix)?;
        check_name("business_exchange", &self.business_exchange)?;
        // The longest derived names must still be valid AMQP short strings.
        let (prefix, version, top) = (&self.prefix, self.version, self.levels - 1);
        check_name("prefix", &level_queue_name(prefix, version, top))?;
        check_name("prefix", &level_exchange_name(prefix, version, top))?;
        check_name("prefix", &poison_queue_name(prefix, version))?;
        check_name("prefix", &release_queue_name(prefix, version))?;
        let business = &self.business_exchange;
        check_name("business_exchange", &unroutable_exchange_name(business))?;
        check_name(
            "business_exchange",
            &unroutable_queue_name(business, version),
        )?;
        Ok(Cascade { settings: self })
    }
}

fn check_name(field: &'static str, name: &str) -> Result<(), SettingsError> {
    let invalid = |reason: String| Err(SettingsError::InvalidName { field, reason });
    if name.is_empty() {
        return invalid("must not be empty".to_owned());
    }
    if name.starts_with("amq.") {
        return invalid(format!(
            "{name:?}: names starting with \"amq.\" are reserved by the broker"
        ));
    }
    if name.len() > MAX_NAME_BYTES {
        return invalid(format!(
            "{name:?} is {} bytes, more than AMQP's {MAX_NAME_BYTES}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':')))
    {
        return invalid(format!(
            "{name:?} contains {c:?}; use letters, digits, '.', '_', '-' or ':'"
        ));
    }
    Ok(())
}

impl Cascade {
    pub fn levels(&self) -> u32 {
        self.settings.levels
    }

    pub fn unit_ms(&self) -> u64 {
        self.settings.unit_ms
    }

    pub fn queue_type(&self) -> QueueType {
        self.settings.queue_type
    }

    pub fn prefix(&self) -> &str {
        &self.settings.prefix
    }

    pub fn version(&self) -> u32 {
        self.settings.version
    }

    pub fn business_exchange(&self) -> &str {
        &self.settings.business_exchange
    }

    /// Level 0 dead-letters into the release queue, which delayline
    /// consumes, rather than to the business exchange.
    pub fn release_stage(&self) -> bool {
        self.settings.release_stage.unwrap_or(false)
    }

    /// The routing key a due task is delivered with, in effect: the
    /// destination needs the release stage.
    pub fn delivery_key(&self) -> DeliveryKey {
        if self.release_stage() {
            self.settings.delivery_key
        } else {
            DeliveryKey::Digits
        }
    }

    /// 2^L - 1: every digit of the routing key set.
    pub fn max_delay_units(&self) -> u64 {
        // levels <= 39 after validation, so this cannot overflow.
        (1u64 << self.levels()) - 1
    }

    pub fn max_delay_ms(&self) -> u64 {
        self.max_delay_units() * self.unit_ms()
    }

    /// TTL of level `level`'s queue: 2^level units.
    pub fn level_ttl_ms(&self, level: u32) -> u64 {
        (1u64 << level) * self.unit_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(levels: u32, unit_ms: u64) -> CascadeSettings {
        CascadeSettings {
            levels,
            unit_ms,
            ..CascadeSettings::default()
        }
    }

    #[test]
    fn defaults_are_valid_and_reach_over_thirteen_years() {
        let cascade = CascadeSettings::default().validate().unwrap();
        assert_eq!(cascade.max_delay_ms(), 429_496_729_500);
        assert!(cascade.max_delay_ms() > 13 * 365 * 24 * 3600 * 1000);
    }

    #[test]
    fn top_ttl_above_broker_limit_is_rejected_with_the_largest_levels() {
        assert_eq!(max_levels_for_unit(100), Some(32));
        assert_eq!(max_levels_for_unit(1), Some(39));
        assert_eq!(max_levels_for_unit(1000), Some(29));
        let err = settings(33, 100).validate().unwrap_err();
        assert!(matches!(err, SettingsError::TtlTooLong { .. }));
        assert!(
            err.to_string()
                .contains("the largest levels for unit_ms = 100 is 32"),
            "{err}"
        );
        assert!(settings(39, 1).validate().is_ok());
        assert!(settings(40, 1).validate().is_err());
        assert!(settings(200, 1).validate().is_err());
        let err = settings(1, MAX_QUEUE_TTL_MS + 1).validate().unwrap_err();
        assert!(err.to_string().contains("unit_ms must not exceed"), "{err}");
        assert!(settings(1, MAX_QUEUE_TTL_MS).validate().is_ok());
    }

    #[test]
    fn zero_levels_and_zero_unit_are_rejected() {
        assert_eq!(settings(0, 100).validate(), Err(SettingsError::NoLevels));
        assert_eq!(settings(4, 0).validate(), Err(SettingsError::ZeroUnit));
        let unversioned = CascadeSettings {
            version: 0,
            ..settings(4, 10)
        };
        assert_eq!(unversioned.validate(), Err(SettingsError::ZeroVersion));
    }

    #[test]
    fn bad_names_are_rejected() {
        for prefix in ["", "amq.x", "has space", "star*", &"p".repeat(250)] {
            let s = CascadeSettings {
                prefix: prefix.to_owned(),
                ..CascadeSettings::default()
            };
            assert!(s.validate().is_err(), "{prefix:?} accepted");
        }
        let s = CascadeSettings {
            business_exchange: "x".repeat(250),
            ..CascadeSettings::default()
        };
        assert!(s.validate().is_err());
    }
}
