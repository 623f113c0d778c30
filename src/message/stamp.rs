//! The hold stamp: when a held message is due, in the clock of the replica
//! that published it.
//!
//! In a chain that holds (`cascade.precision_ms` below the unit), a task is
//! routed by its delay rounded down to the unit and reaches the release
//! stage up to a unit early. The stage must not compare its own wall clock
//! with `deliver_at`, which another host's wall clock wrote. The stamp
//! instead says, in the publishing process's monotonic clock, when the
//! message was sent, when it is due, and the least time the cascade's TTLs
//! keep it: enough for the releasing replica to bound the two clocks'
//! offset from what it sees arrive ([`crate::release::hold`]).

use lapin::BasicProperties;
use lapin::types::{AMQPValue, LongString};

use super::headers::HOLD_HEADER;
use crate::cascade::Route;
use crate::clock::Reading;

/// A held message's timing, in the monotonic clock named `source`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The publishing process's monotonic clock ([`crate::clock::source`]).
    pub source: String,
    /// When the message was published (at the latest: it was stamped just before).
    pub sent_us: u64,
    /// When it is due: `sent_us` plus what remained until `deliver_at`.
    pub due_us: u64,
    /// The least time between `sent_us` and its arrival at the release
    /// stage: what the levels' TTLs hold it for, less a millisecond per
    /// level for the broker's clock, which counts whole milliseconds.
    pub least_us: u64,
}

impl Stamp {
    /// The stamp of a message routed by `route`, due at `deliver_at_ms`
    /// (wall clock), sent at `now`.
    pub fn new(route: &Route, deliver_at_ms: u64, now: &Reading) -> Stamp {
        let remaining_ms = deliver_at_ms.saturating_sub(now.wall_ms);
        let hops = u64::from(route.delay_units.count_ones());
        let least_ms = (route.delay_units.saturating_mul(route.unit_ms)).saturating_sub(hops);
        Stamp {
            source: now.source.to_owned(),
            sent_us: now.mono_us,
            due_us: now
                .mono_us
                .saturating_add(remaining_ms.saturating_mul(1000)),
            least_us: least_ms.saturating_mul(1000),
        }
    }

    /// What the stamp holds the message for after it arrives, by its own
    /// measure: what remains once the TTLs' least time has passed. The
    /// release stage holds no longer than this.
    pub fn own_hold_us(&self) -> u64 {
        self.due_us
            .saturating_sub(self.sent_us)
            .saturating_sub(self.least_us)
    }

    fn encode(&self) -> String {
        // Fixed width: a message's size must not depend on when it is sent
        // (the frame limit was checked when it was accepted).
        format!(
            "{}:{:016x}:{:016x}:{:016x}",
            self.source, self.sent_us, self.due_us, self.least_us
        )
    }

    fn decode(text: &str) -> Option<Stamp> {
        let mut parts = text.split(':');
        let source = parts.next().filter(|s| !s.is_empty())?.to_owned();
        let mut number = || {
            let digits = parts.next().filter(|d| d.len() == 16)?;
            u64::from_str_radix(digits, 16).ok()
        };
        let (sent_us, due_us, least_us) = (number()?, number()?, number()?);
        if parts.next().is_some() || due_us < sent_us {
            return None;
        }
        Some(Stamp {
            source,
            sent_us,
            due_us,
            least_us,
        })
    }

    /// The header's value.
    pub fn value(&self) -> AMQPValue {
        AMQPValue::LongString(LongString::from(self.encode()))
    }

    /// A message's stamp; `None` without one, or with one that is not well
    /// formed (released without a hold).
    pub fn read(properties: &BasicProperties) -> Option<Stamp> {
        match properties.headers().as_ref()?.inner().get(HOLD_HEADER)? {
            AMQPValue::LongString(text) => {
                Stamp::decode(std::str::from_utf8(text.as_bytes()).ok()?)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::cascade::CascadeSettings;

    fn reading(wall_ms: u64, mono_us: u64) -> Reading {
        Reading {
            wall: std::time::UNIX_EPOCH + std::time::Duration::from_millis(wall_ms),
            wall_ms,
            mono_us,
            source: "c0ffee",
        }
    }

    #[test]
    fn a_stamp_says_when_it_is_due_in_the_senders_clock() {
        let cascade = CascadeSettings {
            levels: 8,
            unit_ms: 1000,
            release_stage: Some(true),
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap();
        let route = cascade
            .route(std::time::Duration::from_millis(2_345), "a")
            .unwrap();
        // One unit's lead: one unit in the levels, 1,345 ms held.
        assert_eq!(
            (route.delay_units, route.hold_ms, route.held),
            (1, 1345, true)
        );
        let stamp = Stamp::new(&route, 10_000 + 2_345, &reading(10_000, 7));
        assert_eq!(stamp.sent_us, 7);
        assert_eq!(stamp.due_us, 7 + 2_345_000);
        // A second in one level, less a millisecond for its one hop.
        assert_eq!(stamp.least_us, 999_000);
        assert_eq!(stamp.own_hold_us(), 1_346_000);
        // Overdue when sent: due at once.
        let late = Stamp::new(&route, 9_000, &reading(10_000, 7));
        assert_eq!(late.due_us, 7);
        assert_eq!(late.own_hold_us(), 0);
    }

    #[test]
    fn malformed_stamps_are_not_read() {
        let n = |v: u64| format!("{v:016x}");
        let bad = [
            String::new(),
            format!("a:{}:{}", n(1), n(2)),
            format!("a:{}:{}:{}:{}", n(1), n(2), n(3), n(4)),
            format!(":{}:{}:{}", n(1), n(2), n(3)),
            format!("a:1:{}:{}", n(2), n(3)),
            format!("a:{}:{}:{}", n(5), n(4), n(0)),
            format!("a:-{}:{}:{}", &n(1)[1..], n(2), n(3)),
        ];
        for text in &bad {
            assert_eq!(Stamp::decode(text), None, "{text:?}");
        }
    }

    proptest! {
        #[test]
        fn a_stamp_reads_back_as_written(
            source in "[0-9a-f]{1,16}",
            sent_us in any::<u64>(),
            ahead in 0..u64::MAX / 2,
            least_us in any::<u64>(),
        ) {
            let stamp = Stamp {
                source,
                sent_us: sent_us / 2,
                due_us: sent_us / 2 + ahead,
                least_us,
            };
            let mut headers = lapin::types::FieldTable::default();
            headers.insert(HOLD_HEADER.into(), stamp.value());
            let properties = BasicProperties::default().with_headers(headers);
            prop_assert_eq!(Stamp::read(&properties), Some(stamp));
        }
    }
}
