//! From a requested delay and a destination to a routing key and an entry exchange.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::names::{level_exchange_name, release_queue_name};
use super::settings::{Cascade, DeliveryKey, MAX_NAME_BYTES, QueueType, TTL_FAST_PPM};

/// Where and how to publish one task so that it reaches the business exchange
/// after exactly `delay_units` units, with `routing_key` unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// L binary digits of the delay, most significant first, then the destination.
    pub routing_key: String,
    /// The exchange of the highest set digit; for a zero delay, the release
    /// stage (when on) or the business exchange.
    pub entry_exchange: String,
    pub delay_units: u64,
    /// The delay granted. In a chain that holds, the requested delay
    /// rounded up to the precision (`delay_units * unit_ms + hold_ms`); in
    /// one that does not, what the levels are sure to keep the message for
    /// ([`Cascade::least_ms`]), at least the delay requested.
    pub delay_ms: u64,
    /// What the release stage holds the task for after its `delay_units`:
    /// below one unit plus the release lead, and only in a chain that holds
    /// (see [`Cascade::holds`]).
    pub hold_ms: u64,
    /// The release stage holds the message until its due time: it is
    /// published with a stamp saying when that is
    /// ([`crate::message::HOLD_HEADER`]).
    pub held: bool,
    /// The chain's unit: `delay_units` of it are spent in the levels.
    pub unit_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("destination {0}")]
    InvalidDestination(String),
    #[error(
        "destination is {len} bytes; with {levels} levels the routing key allows at most {max} bytes of destination"
    )]
    DestinationTooLong { len: usize, levels: u32, max: usize },
    #[error(
        "a delay of {requested_ms} ms is beyond the longest this cascade supports ({max_ms} ms, {levels} levels of {unit_ms} ms)"
    )]
    DelayTooLong {
        requested_ms: u128,
        max_ms: u64,
        levels: u32,
        unit_ms: u64,
    },
}

/// Checks that `destination` is dot-separated words of `[A-Za-z0-9_-]+`.
///
/// Wildcards are refused because a consumer binding could no longer name the
/// destination exactly, and empty words because topic matching treats them
/// differently across brokers.
pub fn validate_destination(destination: &str) -> Result<(), RouteError> {
    if destination.is_empty() {
        return Err(RouteError::InvalidDestination(
            "must not be empty".to_owned(),
        ));
    }
    for word in destination.split('.') {
        if word.is_empty() {
            return Err(RouteError::InvalidDestination(format!(
                "{destination:?} has an empty word: words are separated by single dots"
            )));
        }
        if let Some(c) = word
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-')))
        {
            return Err(RouteError::InvalidDestination(format!(
                "{destination:?} contains {c:?}; words may only hold A-Z, a-z, 0-9, '_' and '-'"
            )));
        }
    }
    Ok(())
}

impl Cascade {
    /// The longest destination that still fits AMQP's 255-byte routing key.
    pub fn max_destination_bytes(&self) -> usize {
        MAX_NAME_BYTES - 2 * self.levels() as usize
    }

    /// The fewest whole units the levels are sure to keep a message for
    /// at least `delay` ([`Cascade::least_ms`]): `delay` rounded UP to the
    /// unit, and one unit more where a quorum queue's whole milliseconds
    /// could take that rounding's last millisecond off. A task is never early.
    pub fn delay_units(&self, delay: Duration) -> Result<u64, RouteError> {
        let unit_ns = u128::from(self.unit_ms()) * 1_000_000;
        let delay_ms = delay.as_nanos().div_ceil(1_000_000);
        let mut units = delay.as_nanos().div_ceil(unit_ns);
        if self.queue_type() == QueueType::Quorum {
            // No fewer units keep it that long once 1 % of them may go
            // (`least_ms`): start there, not a loop of 1 % of the units
            // below it (millions, for a delay of years).
            let kept_ppm = u128::from(1_000_000 - TTL_FAST_PPM);
            let fewest = delay_ms * 1_000_000 / (kept_ppm * u128::from(self.unit_ms()));
            units = units.max(fewest.saturating_sub(2));
        }
        loop {
            if units > u128::from(self.max_delay_units()) {
                return Err(self.too_long(delay));
            }
            // Bounded by max_delay_units above, which is a u64.
            if u128::from(self.least_ms(units as u64)) >= delay_ms {
                return Ok(units as u64);
            }
            units += 1;
        }
    }

    /// The whole millisecond (epoch) a delay asked for at `now` counts
    /// from; `deliver_at` is that plus the delay granted.
    ///
    /// In a chain that holds, the millisecond at or after `now`: the release
    /// stage publishes at `deliver_at` exactly, so it must not be before
    /// `now` plus the delay, even by the fraction of a millisecond the clock
    /// had run. In one that does not, the millisecond at or before `now`:
    /// the message leaves the levels no sooner than `now` plus what they are
    /// sure to keep it for, so a `deliver_at` counted from later could fall
    /// after the message arrives. Both are never early; each is a due time
    /// the consumer sees no message before.
    pub fn delay_start_ms(&self, now: SystemTime) -> u64 {
        let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        let ms = if self.holds() {
            since_epoch.as_nanos().div_ceil(1_000_000)
        } else {
            since_epoch.as_millis()
        };
        u64::try_from(ms).unwrap_or(u64::MAX)
    }

    /// Rounds `delay` UP to the precision, in milliseconds: a task is never
    /// early. At most the chain's longest delay.
    pub fn delay_ms(&self, delay: Duration) -> Result<u64, RouteError> {
        let precision_ns = u128::from(self.precision_ms()) * 1_000_000;
        let ms = delay.as_nanos().div_ceil(precision_ns) * u128::from(self.precision_ms());
        if ms > u128::from(self.max_delay_ms()) {
            return Err(self.too_long(delay));
        }
        // Bounded by max_delay_ms above, which is a u64.
        Ok(ms as u64)
    }

    fn too_long(&self, delay: Duration) -> RouteError {
        RouteError::DelayTooLong {
            requested_ms: delay.as_nanos().div_ceil(1_000_000),
            max_ms: self.max_delay_ms(),
            levels: self.levels(),
            unit_ms: self.unit_ms(),
        }
    }

    /// Plans the route of a task: validates the destination, rounds the delay up
    /// and encodes it as the routing key's binary digits.
    pub fn route(&self, delay: Duration, destination: &str) -> Result<Route, RouteError> {
        validate_destination(destination)?;
        let max = self.max_destination_bytes();
        if destination.len() > max {
            return Err(RouteError::DestinationTooLong {
                len: destination.len(),
                levels: self.levels(),
                max,
            });
        }
        if !self.holds() {
            let delay_units = self.delay_units(delay)?;
            return Ok(self.route_units(delay_units, destination));
        }
        // Whole units in the levels, the release stage holds it for what
        // remains (see `held_units`).
        let delay_ms = self.delay_ms(delay)?;
        let delay_units = self.held_units(delay_ms);
        Ok(Route {
            delay_ms,
            hold_ms: delay_ms - delay_units * self.unit_ms(),
            held: true,
            ..self.route_units(delay_units, destination)
        })
    }

    /// The units a held task of `delay_ms` spends in the levels: enough
    /// fewer than its delay to reach the release stage the release lead
    /// early, so that the broker's transit is absorbed by the hold, and
    /// never with more hops (set digits) than rounding down would take.
    ///
    /// Leaving the lead costs a round delay hops: 60 s is `111100`, 59 s
    /// `111011`. So it gets the most units below the lead that have no more
    /// set digits than rounding down (58 s, `111010`: held 2 s), provided
    /// that holds it at most [`Cascade::round_hold_allowance_units`] longer
    /// than the lead would; otherwise it is rounded down, and reaches the
    /// stage its remainder early (late by the transit when that is nothing).
    fn held_units(&self, delay_ms: u64) -> u64 {
        let rounded_down = delay_ms / self.unit_ms();
        let with_lead = delay_ms.saturating_sub(self.release_lead_ms()) / self.unit_ms();
        let hops = rounded_down.count_ones();
        if with_lead.count_ones() <= hops {
            return with_lead;
        }
        let fewer = highest_set_digits(with_lead, hops);
        if with_lead - fewer <= self.round_hold_allowance_units(rounded_down) {
            fewer
        } else {
            rounded_down
        }
    }

    /// How many units longer than the lead a round delay of `units` may be
    /// held to keep its few hops: 1/256 of the delay (the release stage
    /// holds at most that share of what the levels hold), at least 8 units,
    /// and never more than [`MAX_ROUND_HOLD_MS`], far below RabbitMQ's
    /// consumer timeout (30 minutes by default) for a message held unacked.
    pub fn round_hold_allowance_units(&self, units: u64) -> u64 {
        (units / 256).max(8).min(MAX_ROUND_HOLD_MS / self.unit_ms())
    }

    /// The route of a delay already expressed in units (`<= max_delay_units`),
    /// to an already validated destination.
    pub fn route_units(&self, delay_units: u64, destination: &str) -> Route {
        debug_assert!(delay_units <= self.max_delay_units());
        let levels = self.levels();
        let mut routing_key = String::with_capacity(2 * levels as usize + destination.len());
        for level in (0..levels).rev() {
            routing_key.push(if delay_units >> level & 1 == 1 {
                '1'
            } else {
                '0'
            });
            routing_key.push('.');
        }
        routing_key.push_str(destination);
        Route {
            routing_key,
            entry_exchange: self.entry_exchange_in(self.shard(), delay_units),
            delay_units,
            // What the levels are sure to keep it for: granted in a chain
            // that does not hold (one that holds grants its own).
            delay_ms: self.least_ms(delay_units),
            hold_ms: 0,
            held: false,
            unit_ms: self.unit_ms(),
        }
    }

    /// Where a task of `delay_units` enters shard `shard`: the exchange of
    /// its highest set digit; for a zero delay, the shard's release stage
    /// (when on) or the business exchange.
    fn entry_exchange_in(&self, shard: u32, delay_units: u64) -> String {
        match delay_units.checked_ilog2() {
            Some(highest_set_digit) => {
                level_exchange_name(self.prefix(), self.version(), shard, highest_set_digit)
            }
            None if self.release_stage() => {
                release_queue_name(self.prefix(), self.version(), shard)
            }
            None => self.business_exchange().to_owned(),
        }
    }

    /// The destination a routing key of this chain ends with (its digits
    /// dropped); `None` for a key that is not one of this chain's.
    pub fn destination_in<'k>(&self, routing_key: &'k str) -> Option<&'k str> {
        destination_of(routing_key, self.levels())
    }

    /// `route` (of a held task) waiting `units` in the levels instead, a
    /// burst's head start ([`super::LevelLoad`]): the same delay granted, the
    /// release stage holding (or staging) it for the rest.
    pub fn with_wait(&self, route: &Route, units: u64, destination: &str) -> Route {
        Route {
            delay_ms: route.delay_ms,
            hold_ms: route.delay_ms.saturating_sub(units * self.unit_ms()),
            held: true,
            ..self.route_units(units, destination)
        }
    }

    /// `route`, planned in any shard, through the shard the task `id`
    /// names instead (see [`Cascade::shard_of`]): only its entry differs,
    /// since every shard has the same levels.
    pub fn in_task_shard(&self, mut route: Route, id: &str) -> Route {
        if self.shards() > 1 {
            route.entry_exchange = self.entry_exchange_in(self.shard_of(id), route.delay_units);
        }
        route
    }

    /// The key a consumer binds its queue to the business exchange with to
    /// receive exactly one destination (or, with a topic pattern, the
    /// destinations it matches). Delivered with the destination as key: the
    /// destination itself. With the digits: `#.b` would also match a
    /// destination `a.b`, whereas L `*` words match only the L delay digits.
    pub fn binding_key(&self, destination: &str) -> String {
        match self.delivery_key() {
            DeliveryKey::Destination => destination.to_owned(),
            DeliveryKey::Digits => {
                let mut key = "*.".repeat(self.levels() as usize);
                key.push_str(destination);
                key
            }
        }
    }

    /// The routing key a due message, routed through this chain with
    /// `routing_key`, is delivered with. A key that does not carry this
    /// chain's digits (a message from elsewhere) is delivered as it is.
    pub fn delivered_routing_key<'k>(&self, routing_key: &'k str) -> &'k str {
        match self.delivery_key() {
            DeliveryKey::Destination => {
                destination_of(routing_key, self.levels()).unwrap_or(routing_key)
            }
            DeliveryKey::Digits => routing_key,
        }
    }
}

/// The destination of a routing key written by a chain of `levels` levels.
pub fn destination_of(routing_key: &str, levels: u32) -> Option<&str> {
    let mut rest = routing_key;
    for _ in 0..levels {
        let (digit, tail) = rest.split_once('.')?;
        if digit != "0" && digit != "1" {
            return None;
        }
        rest = tail;
    }
    (!rest.is_empty()).then_some(rest)
}

/// The longest a round delay is held beyond the lead to keep its hops.
pub const MAX_ROUND_HOLD_MS: u64 = 64_000;

/// The largest number no greater than `n` with at most `digits` set binary
/// digits: `n`'s highest `digits` set digits.
fn highest_set_digits(n: u64, digits: u32) -> u64 {
    let mut kept = 0;
    let mut rest = n;
    for _ in 0..digits {
        let Some(top) = rest.checked_ilog2() else {
            break;
        };
        kept |= 1 << top;
        rest &= !(1 << top);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Classic queues: their TTLs are exact, so a delay is its units.
    fn cascade(levels: u32, unit_ms: u64) -> Cascade {
        crate::cascade::for_tests(levels, unit_ms, crate::cascade::QueueType::Classic)
    }

    fn quorum(levels: u32, unit_ms: u64) -> Cascade {
        crate::cascade::for_tests(levels, unit_ms, crate::cascade::QueueType::Quorum)
    }

    #[test]
    fn a_quorum_chain_grants_what_its_levels_keep_less_a_millisecond_a_hop() {
        let c = quorum(4, 1000);
        // 10 units keep it for 9,898 ms at the least (a millisecond a hop,
        // 1 % for a clock catching up): one unit more.
        let ten = c.route(Duration::from_secs(10), "d").unwrap();
        assert_eq!(ten.routing_key, "1.0.1.1.d");
        assert_eq!(ten.delay_units, 11);
        assert_eq!(ten.delay_ms, 10_887);
        let just_under = c.route(Duration::from_millis(9_898), "d").unwrap();
        assert_eq!(just_under.routing_key, "1.0.1.0.d");
        assert_eq!(just_under.delay_ms, 9_898);
        // The guide's figures (docs/cascade.md): 10 s on 100 ms units.
        let readme = quorum(32, 100).route(Duration::from_secs(10), "d").unwrap();
        assert_eq!((readme.delay_units, readme.delay_ms), (102, 10_094));
        let exact = cascade(32, 100)
            .route(Duration::from_secs(10), "d")
            .unwrap();
        assert_eq!((exact.delay_units, exact.delay_ms), (100, 10_000));
        // The longest: every level, less a millisecond each and 1 %.
        let c = quorum(4, 10);
        assert_eq!(c.max_delay_ms(), 144);
        let max = c.route(Duration::from_millis(144), "d").unwrap();
        assert_eq!(max.routing_key, "1.1.1.1.d");
        assert_eq!(max.delay_ms, 144);
        let err = c.route(Duration::from_millis(145), "d").unwrap_err();
        assert!(
            matches!(err, RouteError::DelayTooLong { max_ms: 144, .. }),
            "{err:?}"
        );
    }

    /// The default chain (29 levels of 1 s, held), as a user has it.
    fn default_held() -> Cascade {
        crate::cascade::CascadeSettings {
            release_stage: Some(true),
            ..crate::cascade::CascadeSettings::default()
        }
        .validate()
        .unwrap()
    }

    #[test]
    fn round_delays_reach_the_release_stage_a_lead_early_with_no_more_hops() {
        let chain = default_held();
        assert_eq!((chain.unit_ms(), chain.release_lead_ms()), (1_000, 1_000));
        for (seconds, units) in [
            (30, 29),
            (60, 58),
            (120, 116),
            (300, 298),
            (3_600, 3_592),
            (7_200, 7_184),
            (86_400, 86_336),
            // Not round: the lead costs no hop, so it is one unit less.
            (59, 58),
            (61, 60),
        ] {
            let route = chain.route(Duration::from_secs(seconds), "d").unwrap();
            assert_eq!(route.delay_units, units, "{seconds} s");
            assert!(
                route.delay_units.count_ones() <= seconds.count_ones(),
                "{seconds} s"
            );
            assert!(
                route.hold_ms >= chain.release_lead_ms(),
                "{seconds} s: a lead"
            );
            assert_eq!(route.delay_ms, seconds * 1_000);
        }
        // A power of two would be held for half its delay: beyond the
        // allowance, it is rounded down (reaching the stage with no lead).
        let far = chain.route(Duration::from_secs(1 << 20), "d").unwrap();
        assert_eq!((far.delay_units, far.hold_ms), (1 << 20, 0));
    }

    #[test]
    fn the_highest_set_digits_are_the_largest_number_with_that_many() {
        for n in 0..2_048u64 {
            for digits in 0..12 {
                let expected = (0..=n).rev().find(|m| m.count_ones() <= digits).unwrap();
                assert_eq!(highest_set_digits(n, digits), expected, "{n} {digits}");
            }
        }
    }

    #[test]
    fn worked_example_ten_seconds_with_four_levels() {
        let route = cascade(4, 1000)
            .route(Duration::from_secs(10), "d")
            .unwrap();
        assert_eq!(route.routing_key, "1.0.1.0.d");
        assert_eq!(route.entry_exchange, "t.v1.level03");
        assert_eq!(route.delay_units, 10);
        assert_eq!(route.delay_ms, 10_000);
    }

    #[test]
    fn delays_round_up_to_the_unit() {
        let c = cascade(8, 100);
        assert_eq!(c.delay_units(Duration::ZERO).unwrap(), 0);
        assert_eq!(c.delay_units(Duration::from_nanos(1)).unwrap(), 1);
        assert_eq!(c.delay_units(Duration::from_millis(100)).unwrap(), 1);
        assert_eq!(c.delay_units(Duration::from_millis(101)).unwrap(), 2);
        assert_eq!(c.delay_units(Duration::from_micros(199_999)).unwrap(), 2);
    }

    #[test]
    fn boundaries_zero_one_max_and_beyond() {
        let c = cascade(4, 10);
        let zero = c.route(Duration::ZERO, "d").unwrap();
        assert_eq!(zero.routing_key, "0.0.0.0.d");
        assert_eq!(zero.entry_exchange, "biz");
        let one = c.route(Duration::from_millis(10), "d").unwrap();
        assert_eq!(one.routing_key, "0.0.0.1.d");
        assert_eq!(one.entry_exchange, "t.v1.level00");
        let max = c.route(Duration::from_millis(150), "d").unwrap();
        assert_eq!(max.routing_key, "1.1.1.1.d");
        assert_eq!(max.delay_ms, 150);
        let err = c.route(Duration::from_micros(150_001), "d").unwrap_err();
        assert_eq!(
            err,
            RouteError::DelayTooLong {
                requested_ms: 151,
                max_ms: 150,
                levels: 4,
                unit_ms: 10
            }
        );
    }

    #[test]
    fn routing_key_fits_255_bytes_exactly() {
        let c = cascade(32, 100);
        let longest = "d".repeat(255 - 64);
        assert_eq!(
            c.route(Duration::ZERO, &longest).unwrap().routing_key.len(),
            255
        );
        let too_long = "d".repeat(255 - 63);
        assert!(matches!(
            c.route(Duration::ZERO, &too_long),
            Err(RouteError::DestinationTooLong {
                len: 192,
                levels: 32,
                max: 191
            })
        ));
    }

    #[test]
    fn destinations_are_plain_words() {
        for ok in ["d", "billing.invoice", "a-b_c.D9"] {
            assert!(validate_destination(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a..b", ".a", "a.", "a.*", "#", "a b", "é", "a/b"] {
            assert!(validate_destination(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn binding_key_has_one_star_per_level_when_delivered_with_the_digits() {
        assert_eq!(cascade(4, 10).binding_key("a.b"), "*.*.*.*.a.b");
        let released = released(4, DeliveryKey::Digits);
        assert_eq!(released.binding_key("a.b"), "*.*.*.*.a.b");
        assert_eq!(released.delivered_routing_key("1.0.0.1.a.b"), "1.0.0.1.a.b");
    }

    fn released(levels: u32, delivery_key: DeliveryKey) -> Cascade {
        crate::cascade::CascadeSettings {
            levels,
            unit_ms: 10,
            release_stage: Some(true),
            delivery_key,
            ..Default::default()
        }
        .validate()
        .unwrap()
    }

    #[test]
    fn with_the_release_stage_a_task_is_delivered_with_its_destination() {
        let chain = released(4, DeliveryKey::Destination);
        assert_eq!(chain.binding_key("a.b"), "a.b");
        let route = chain.route(Duration::from_millis(50), "a.b").unwrap();
        assert_eq!(chain.delivered_routing_key(&route.routing_key), "a.b");
        // A destination that looks like digits keeps all of its words.
        let route = chain.route(Duration::from_millis(10), "1.0.x").unwrap();
        assert_eq!(chain.delivered_routing_key(&route.routing_key), "1.0.x");
        // Not this chain's key: as it came.
        assert_eq!(chain.delivered_routing_key("1.0.a"), "1.0.a");
        assert_eq!(chain.delivered_routing_key("plain"), "plain");
    }
}
