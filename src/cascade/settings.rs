//! Cascade settings and their validation.
//!
//! Everything the broker would refuse, or that would make a delay silently
//! wrong, is rejected here, at start-up, before any object is declared.

use serde::{Deserialize, Serialize};

use super::names::{
    business_exchange_of, level_exchange_name, level_queue_name, poison_queue_name,
    probe_notice_queue_name, release_queue_name, unroutable_exchange_name, unroutable_queue_name,
};

/// The largest `x-message-ttl` RabbitMQ accepts (10 years, measured on 3.10.8).
pub const MAX_QUEUE_TTL_MS: u64 = 315_360_000_000;

/// How much faster than real time a quorum queue's TTLs may run, in parts
/// per million: Erlang's time correction in its no time warp mode (RabbitMQ
/// 3.x on Erlang/OTP 25) speeds the node's clock by up to 1 % until it has
/// caught up with a step of the host's wall clock (a paused VM's, for one).
/// A node in multi time warp mode (4.3 here) is documented to follow a step at once
/// instead: see "A broker's clock running fast" in docs/cascade.md.
pub const TTL_FAST_PPM: u64 = 10_000;

/// The most TTLs adding up to `spent` may have expired early, in the same
/// unit as `spent` (the route counts milliseconds, the release stage's hold
/// microseconds).
pub fn ttl_fast_by(spent: u64) -> u64 {
    spent.div_ceil(1_000_000 / TTL_FAST_PPM)
}

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
    /// The unit in milliseconds: a task spends whole units in the levels
    /// (rounded up without the release stage; with it, the release stage
    /// holds the rest, see `precision_ms`).
    pub unit_ms: u64,
    pub queue_type: QueueType,
    /// Prefix of every level exchange and queue name.
    pub prefix: String,
    /// The chain's version, part of every level exchange and queue name.
    /// Changing levels, unit_ms or queue_type needs a new version and a
    /// `delayline migrate-topology --from <old version>`.
    pub version: u32,
    /// The exchange tasks are delivered to when their delay has elapsed.
    /// Unset: `<prefix>.business`, so that an instance with a prefix of its
    /// own delivers to an exchange of its own (the default prefix keeps
    /// `delayline.business`); its alternate exchange and unroutable queue
    /// are named after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub business_exchange: Option<String>,
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
    /// The granularity delays are honoured to, in milliseconds. Below the
    /// unit, a task is routed by its delay rounded *down* to the unit and
    /// the release stage holds it for what remains (see
    /// `crate::release::hold`). Unset: 1 with the release stage, the unit
    /// without it (every delay rounded up to the unit). Not part of the
    /// broker's objects: it takes effect when delayline restarts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision_ms: Option<u64>,
    /// In a chain that holds: how long before its due time a task reaches
    /// the release stage at the least, so that the cascade's own transit
    /// (the broker's dead-lettering, slower under load) is absorbed by the
    /// hold instead of making the task late. Unset: one unit. A task then
    /// arrives between this and this plus one unit early.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_lead_ms: Option<u64>,
    /// Most due messages the release stage holds at once from each shard's
    /// release queue (its prefetch, beyond what it is releasing). It holds
    /// every task falling due within one unit: at least the peak due rate
    /// per second times the unit in seconds. Past it, due messages wait in
    /// the release queue: late, never lost.
    pub hold_limit: u32,
    /// With the release stage: how often probes go out, each a message
    /// waiting in one level alone (of at most ten minutes' TTL), to find a
    /// level that stopped dead-lettering (see `crate::cascade`'s `strand`).
    /// The next probe goes in while the newest still has two intervals
    /// left in the level, so a level always holds one (a level shorter
    /// than two intervals gets one every interval). 0: no probes.
    pub level_probe_ms: u64,
    /// How long after a level's probe was due a probe of another level may
    /// come back first before the level is taken to be stranded and drained
    /// by delayline itself, and how overdue a task that passed it must be
    /// before it is published again from the ledger. After a failover, for
    /// the watched levels' span, it is how overdue any task not seen at the
    /// release stage must be (see `crate::cascade`'s `loss`).
    pub stranded_margin_ms: u64,
    /// How long a level found stranded stays drained by delayline before it
    /// is handed back to the broker and probed again like any other: its
    /// dead-letter worker may run again (a restarted Raft member, a node
    /// back). A probe overtaken again takes it back at once. 0: drained
    /// until the replica restarts.
    pub stranded_recheck_ms: u64,
    /// Chains of levels (each with its release queue) side by side under
    /// the one business exchange; a task goes to the one a hash of its id
    /// names. Every level is one quorum queue with one leader, whose
    /// dead-letter worker bounds the chain's due rate: shards spread that
    /// over several leaders, and over a cluster's nodes. Part of the
    /// chain's identity: changing it needs a new version and
    /// `migrate-topology`. Shard 0 keeps a one-shard chain's names.
    pub shards: u32,
    /// In a chain that holds, with a ledger: how many tasks a second one
    /// level's dead-letter worker is planned to pass, per level, before
    /// tasks that fall due together are given leads through the levels
    /// (see [`super::spread`]). RabbitMQ's one worker a quorum queue passes
    /// 2,500 to 3,600 a second on two cores alone (BENCHMARKS.md, record
    /// 27), about 1,000 while the broker also takes a burst in, passes other
    /// levels and delivers (record 51: at 2,000, tasks through a level that
    /// 2,000 left together reached the release stage up to 1.5 s late). 0:
    /// no leads, every task routed as it would be alone.
    pub burst_level_rate: u32,
    /// The longest head start a task of a burst is given: it reaches the release
    /// stage at most this long before its time (and is staged in the
    /// ledger until then).
    pub burst_window_ms: u64,
}

impl Default for CascadeSettings {
    fn default() -> Self {
        Self {
            // One-second units, held to the millisecond by the release
            // stage: fewer hops per task than 100 ms units, so more due
            // tasks per second, and more precise (BENCHMARKS.md, issue 31).
            // 29 levels: the most a 1 s unit allows (about 17 years).
            levels: 29,
            unit_ms: 1000,
            queue_type: QueueType::Quorum,
            prefix: "delayline".to_owned(),
            version: 1,
            business_exchange: None,
            release_stage: None,
            delivery_key: DeliveryKey::Destination,
            precision_ms: None,
            release_lead_ms: None,
            hold_limit: 20_000,
            level_probe_ms: 1_000,
            stranded_margin_ms: 2_000,
            stranded_recheck_ms: 300_000,
            shards: 1,
            burst_level_rate: 1_000,
            burst_window_ms: 120_000,
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
    #[error(
        "cascade.precision_ms = {precision_ms} must be at least 1 and at most unit_ms ({unit_ms})"
    )]
    PrecisionOutOfRange { precision_ms: u64, unit_ms: u64 },
    #[error(
        "cascade.precision_ms = {precision_ms} is finer than unit_ms = {unit_ms} and needs the \
         release stage, which holds each task for what remains below the unit; without it every \
         delay is rounded up to the unit (leave precision_ms unset)"
    )]
    PrecisionNeedsRelease { precision_ms: u64, unit_ms: u64 },
    #[error("cascade.hold_limit must be between 1 and {MAX_HOLD_LIMIT}")]
    HoldLimit,
    #[error("cascade.release_lead_ms must be at most {MAX_RELEASE_LEAD_MS} (one hour)")]
    ReleaseLead,
    #[error("cascade.shards must be between 1 and {MAX_SHARDS}")]
    Shards,
    #[error("cascade.burst_window_ms must be at most {MAX_BURST_WINDOW_MS} (ten minutes)")]
    BurstWindow,
    #[error(
        "cascade.shards = {0} needs the release stage: without it nothing consumes the chains' \
         ends, and a task's shard is found only by the stage (leave shards at 1, or keep a ledger)"
    )]
    ShardsNeedRelease(u32),
}

/// The most shards a chain may have: each is a whole chain of level queues
/// (29 by default, up to 39), and the management API lists at most 500
/// queues in one page, which the depth poller reads the chain's from
/// (12 × 39 levels, the release queues and the unroutable queue fit).
pub const MAX_SHARDS: u32 = 12;

/// The largest `hold_limit`: a channel's prefetch is a 16-bit number, and
/// the release stage's own windows take part of it.
pub const MAX_HOLD_LIMIT: u32 = 60_000;

/// The longest `burst_window_ms`: a task staged longer is better kept by
/// the broker (the ledger alone holds it while it is staged).
pub const MAX_BURST_WINDOW_MS: u64 = 600_000;

/// The longest `release_lead_ms`: a task held longer is better kept by the broker.
pub const MAX_RELEASE_LEAD_MS: u64 = 3_600_000;

/// Validated cascade settings. Holding one proves every level's TTL and every
/// object name is acceptable to the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cascade {
    settings: CascadeSettings,
    /// The shard this view names the levels and the release queue of
    /// (see [`Cascade::in_shard`]); 0 for the chain as a whole.
    shard: u32,
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
        self.check_precision()?;
        self.check_shards()?;
        check_name("prefix", &self.prefix)?;
        let business = self.business_exchange.clone();
        let business = business.unwrap_or_else(|| business_exchange_of(&self.prefix));
        check_name("business_exchange", &business)?;
        // The longest derived names must still be valid AMQP short strings.
        let (prefix, version, top) = (&self.prefix, self.version, self.levels - 1);
        let last_shard = self.shards - 1;
        check_name(
            "prefix",
            &level_queue_name(prefix, version, last_shard, top),
        )?;
        check_name(
            "prefix",
            &level_exchange_name(prefix, version, last_shard, top),
        )?;
        check_name("prefix", &poison_queue_name(prefix, version))?;
        check_name("prefix", &release_queue_name(prefix, version, last_shard))?;
        // A replica's name on its probes is 16 hex digits.
        check_name(
            "prefix",
            &probe_notice_queue_name(prefix, version, &"f".repeat(16)),
        )?;
        check_name("business_exchange", &unroutable_exchange_name(&business))?;
        check_name(
            "business_exchange",
            &unroutable_queue_name(&business, version),
        )?;
        Ok(Cascade {
            settings: CascadeSettings {
                business_exchange: Some(business),
                ..self
            },
            shard: 0,
        })
    }
}

impl CascadeSettings {
    fn check_shards(&self) -> Result<(), SettingsError> {
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(SettingsError::Shards);
        }
        if self.shards > 1 && self.release_stage != Some(true) {
            return Err(SettingsError::ShardsNeedRelease(self.shards));
        }
        Ok(())
    }

    fn check_precision(&self) -> Result<(), SettingsError> {
        if self.hold_limit == 0 || self.hold_limit > MAX_HOLD_LIMIT {
            return Err(SettingsError::HoldLimit);
        }
        if self
            .release_lead_ms
            .is_some_and(|lead| lead > MAX_RELEASE_LEAD_MS)
        {
            return Err(SettingsError::ReleaseLead);
        }
        if self.burst_window_ms > MAX_BURST_WINDOW_MS {
            return Err(SettingsError::BurstWindow);
        }
        let Some(precision_ms) = self.precision_ms else {
            return Ok(());
        };
        let unit_ms = self.unit_ms;
        if precision_ms == 0 || precision_ms > unit_ms {
            return Err(SettingsError::PrecisionOutOfRange {
                precision_ms,
                unit_ms,
            });
        }
        if precision_ms < unit_ms && self.release_stage != Some(true) {
            return Err(SettingsError::PrecisionNeedsRelease {
                precision_ms,
                unit_ms,
            });
        }
        Ok(())
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
        // Always set by `validate`.
        self.settings
            .business_exchange
            .as_deref()
            .unwrap_or_default()
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

    /// The granularity delays are honoured to (see
    /// [`CascadeSettings::precision_ms`]): 1 ms by default with the release
    /// stage, the unit without it.
    pub fn precision_ms(&self) -> u64 {
        match self.settings.precision_ms {
            Some(precision_ms) => precision_ms,
            None if self.release_stage() => 1,
            None => self.unit_ms(),
        }
    }

    /// Whether tasks are routed by their delay rounded down to the unit and
    /// held by the release stage for the rest.
    pub fn holds(&self) -> bool {
        self.precision_ms() < self.unit_ms()
    }

    /// How long before its due time a held task reaches the release stage
    /// at the least: one unit unless set; 0 in a chain that does not hold.
    pub fn release_lead_ms(&self) -> u64 {
        if !self.holds() {
            return 0;
        }
        self.settings.release_lead_ms.unwrap_or(self.unit_ms())
    }

    /// Most due messages the release stage holds at once.
    pub fn hold_limit(&self) -> u32 {
        self.settings.hold_limit
    }

    /// Tasks a second one level is planned to pass before a burst's tasks
    /// get leads; 0 when tasks get none (no ledger to stage them in, or a
    /// chain that does not hold).
    pub fn burst_level_rate(&self) -> u32 {
        if self.holds() && self.release_stage() {
            self.settings.burst_level_rate
        } else {
            0
        }
    }

    /// The longest head start a burst's task is given, in whole units.
    pub fn burst_window_units(&self) -> u64 {
        self.settings.burst_window_ms / self.unit_ms()
    }

    /// How far ahead of its time a task that reaches the release stage is
    /// staged in the ledger rather than held unacknowledged: the lead and
    /// two units (a task routed without a burst's head start arrives within the
    /// lead and one unit, and a round delay's up to 64 s early).
    pub fn stage_after_ms(&self) -> u64 {
        self.release_lead_ms() + 2 * self.unit_ms()
    }

    /// How often levels are probed; `None` when they are not.
    pub fn level_probe(&self) -> Option<std::time::Duration> {
        (self.release_stage() && self.settings.level_probe_ms > 0)
            .then(|| std::time::Duration::from_millis(self.settings.level_probe_ms))
    }

    /// See [`CascadeSettings::stranded_margin_ms`].
    pub fn stranded_margin_ms(&self) -> u64 {
        self.settings.stranded_margin_ms
    }

    /// How long a stranded level stays drained before it is handed back
    /// (see [`CascadeSettings::stranded_recheck_ms`]); `None`: for good.
    pub fn stranded_recheck(&self) -> Option<std::time::Duration> {
        (self.settings.stranded_recheck_ms > 0)
            .then(|| std::time::Duration::from_millis(self.settings.stranded_recheck_ms))
    }

    /// How many chains of levels side by side (see [`CascadeSettings::shards`]).
    pub fn shards(&self) -> u32 {
        self.settings.shards
    }

    /// The shard this view names (0 for the chain as a whole).
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// This chain as seen from `shard`: its levels, its release queue and
    /// the routes into them are that shard's; everything else is shared.
    pub fn in_shard(&self, shard: u32) -> Cascade {
        debug_assert!(shard < self.shards());
        Cascade {
            settings: self.settings.clone(),
            shard,
        }
    }

    /// Every shard's view, shard 0 first.
    pub fn every_shard(&self) -> impl Iterator<Item = Cascade> + '_ {
        (0..self.shards()).map(|shard| self.in_shard(shard))
    }

    /// The shard of the task `id`: a stable hash of the id, so that every
    /// replica, and every later change of the task, finds the same one.
    pub fn shard_of(&self, id: &str) -> u32 {
        shard_of(id, self.shards())
    }

    /// The view of the shard the task `id` goes through: borrowed in a
    /// chain of one shard, which is the common case and on every task's path.
    pub fn for_task(&self, id: &str) -> std::borrow::Cow<'_, Cascade> {
        let shard = self.shard_of(id);
        if shard == self.shard {
            std::borrow::Cow::Borrowed(self)
        } else {
            std::borrow::Cow::Owned(self.in_shard(shard))
        }
    }

    /// 2^L - 1: every digit of the routing key set.
    pub fn max_delay_units(&self) -> u64 {
        // levels <= 39 after validation, so this cannot overflow.
        (1u64 << self.levels()) - 1
    }

    /// The longest delay a task can be granted: in a chain that does not
    /// hold, what every level together is sure to keep a message for.
    pub fn max_delay_ms(&self) -> u64 {
        if self.holds() {
            self.max_delay_units() * self.unit_ms()
        } else {
            self.least_ms(self.max_delay_units())
        }
    }

    /// The least time `units` keep a message in the levels, whole
    /// milliseconds. A quorum queue stamps a message's arrival and its
    /// expiry with the leader's clock in whole milliseconds, so each level
    /// may let it go up to a millisecond before its TTL (seen on 3.10 and
    /// 4.3, held to that millisecond by the integration test
    /// `delivery::quorum_levels_…`); and that clock is Erlang's, which runs
    /// up to [`TTL_FAST_PPM`] fast while the node catches up with a step of
    /// the host's clock. A classic queue counts microseconds of the host's
    /// own clock and does neither (both measured on 3.10.8 with the host's
    /// clock stepped 10 s: a 20 s TTL passed in 19.81 s in a quorum queue,
    /// 20.02 s in a classic one).
    pub fn least_ms(&self, units: u64) -> u64 {
        let spent = units.saturating_mul(self.unit_ms());
        match self.queue_type() {
            QueueType::Quorum => spent
                .saturating_sub(u64::from(units.count_ones()))
                .saturating_sub(ttl_fast_by(spent)),
            QueueType::Classic => spent,
        }
    }

    /// TTL of level `level`'s queue: 2^level units.
    pub fn level_ttl_ms(&self, level: u32) -> u64 {
        (1u64 << level) * self.unit_ms()
    }
}

/// FNV-1a (64 bits) of `id`, modulo `shards`: fixed by its definition,
/// not by a library's version or a process's random seed, since a task's
/// shard must not change between releases or replicas.
pub fn shard_of(id: &str, shards: u32) -> u32 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = id.bytes().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    });
    // The remainder is below `shards`, a u32.
    (hash % u64::from(shards.max(1))) as u32
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
    fn defaults_are_valid_and_reach_over_seventeen_years() {
        // With the default ledger, the release stage is on: the chain holds.
        let cascade = CascadeSettings {
            release_stage: Some(true),
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap();
        assert!(cascade.holds());
        assert_eq!(cascade.max_delay_ms(), 536_870_911_000);
        // Stateless, the 29 quorum levels may each take a millisecond off,
        // and a clock catching up 1 % of the whole.
        let stateless = CascadeSettings::default().validate().unwrap();
        assert_eq!(
            stateless.max_delay_ms(),
            536_870_911_000 - 29 - 5_368_709_110
        );
        assert!(cascade.max_delay_ms() > 17 * 365 * 24 * 3600 * 1000);
        assert_eq!(
            max_levels_for_unit(cascade.unit_ms()),
            Some(cascade.levels())
        );
    }

    #[test]
    fn a_precision_below_the_unit_needs_the_release_stage() {
        let precise = |release_stage, precision_ms| {
            CascadeSettings {
                release_stage: Some(release_stage),
                precision_ms,
                ..CascadeSettings::default()
            }
            .validate()
        };
        // Unset: to the millisecond with the stage, the unit without.
        assert_eq!(precise(true, None).unwrap().precision_ms(), 1);
        assert!(precise(true, None).unwrap().holds());
        assert_eq!(precise(false, None).unwrap().precision_ms(), 1000);
        assert!(!precise(false, None).unwrap().holds());
        assert_eq!(precise(false, None).unwrap().release_lead_ms(), 0);
        assert_eq!(precise(true, None).unwrap().release_lead_ms(), 1000);
        assert!(matches!(
            precise(false, Some(10)),
            Err(SettingsError::PrecisionNeedsRelease { .. })
        ));
        assert!(precise(false, Some(1000)).is_ok());
        for out_of_range in [0, 1001] {
            assert!(matches!(
                precise(true, Some(out_of_range)),
                Err(SettingsError::PrecisionOutOfRange { .. })
            ));
        }
        let unbounded = CascadeSettings {
            hold_limit: 0,
            ..CascadeSettings::default()
        };
        assert_eq!(unbounded.validate(), Err(SettingsError::HoldLimit));
        let far = CascadeSettings {
            release_lead_ms: Some(MAX_RELEASE_LEAD_MS + 1),
            ..CascadeSettings::default()
        };
        assert_eq!(far.validate(), Err(SettingsError::ReleaseLead));
        let window = CascadeSettings {
            burst_window_ms: MAX_BURST_WINDOW_MS + 1,
            ..CascadeSettings::default()
        };
        assert_eq!(window.validate(), Err(SettingsError::BurstWindow));
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
            business_exchange: Some("x".repeat(250)),
            ..CascadeSettings::default()
        };
        assert!(s.validate().is_err());
    }

    #[test]
    fn the_business_exchange_follows_the_prefix_unless_named() {
        let default = CascadeSettings::default().validate().unwrap();
        assert_eq!(default.business_exchange(), "delayline.business");
        let own = CascadeSettings {
            prefix: "billing-delays".into(),
            ..CascadeSettings::default()
        };
        let own = own.validate().unwrap();
        assert_eq!(own.business_exchange(), "billing-delays.business");
        assert_eq!(
            own.unroutable_exchange(),
            "billing-delays.business.unroutable"
        );
        let named = CascadeSettings {
            prefix: "billing-delays".into(),
            business_exchange: Some("shared".into()),
            ..CascadeSettings::default()
        };
        assert_eq!(named.validate().unwrap().business_exchange(), "shared");
    }

    #[test]
    fn a_task_s_shard_is_fixed_by_its_id_alone() {
        // FNV-1a is fixed by its definition: these never change between
        // releases, or a task moved after an upgrade would be sought elsewhere.
        assert_eq!(shard_of("", 7), (0xcbf2_9ce4_8422_2325u64 % 7) as u32);
        assert_eq!(
            shard_of("a", 1_000),
            (0xaf63_dc4c_8601_ec8cu64 % 1_000) as u32
        );
        for id in ["a", "task-1", "0190d3c2-7b1e-7c4a-9f00-000000000000"] {
            assert_eq!(shard_of(id, 1), 0);
            assert!(shard_of(id, 5) < 5);
        }
        // Spread evenly enough: 12,000 ids over 4 shards, each within 10 %.
        let mut counts = [0u32; 4];
        for n in 0..12_000 {
            counts[shard_of(&format!("task-{n}"), 4) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (2_700..=3_300).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn shards_are_bounded_and_need_the_release_stage() {
        let with = |shards, release_stage| {
            CascadeSettings {
                shards,
                release_stage,
                ..CascadeSettings::default()
            }
            .validate()
        };
        assert_eq!(with(0, Some(true)), Err(SettingsError::Shards));
        assert_eq!(with(MAX_SHARDS + 1, Some(true)), Err(SettingsError::Shards));
        assert_eq!(
            with(2, Some(false)),
            Err(SettingsError::ShardsNeedRelease(2))
        );
        assert_eq!(with(2, None), Err(SettingsError::ShardsNeedRelease(2)));
        let twelve = with(MAX_SHARDS, Some(true)).unwrap();
        assert_eq!(twelve.shards(), MAX_SHARDS);
        assert_eq!(twelve.for_task("x").shard(), shard_of("x", MAX_SHARDS));
        assert!(with(1, Some(false)).is_ok());
    }
}
