//! The messages of stranded-level repair (see `crate::cascade`'s `strand`):
//! a probe through one level, and the copy of a message taken off a
//! stranded level to go on down the chain.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use super::headers::{DELIVER_AT_HEADER, PROBE_HEADER};
use super::publish::{Message, restamped};
use super::read::text_header;
use crate::cascade::{Cascade, destination_of, probe_units};
use crate::clock::Reading;

/// The destination a probe's routing key names. The release stage takes a
/// probe off before it looks at a destination: nothing is delivered to it.
const PROBE_DESTINATION: &str = "delayline.probe";

/// A probe through one level, sent by the replica `owner` names when its
/// process's monotonic clock read `sent_ms`: only its sender judges by it,
/// and by that clock, which a stepped wall clock leaves alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// `None`: straight to the release stage, through no level.
    pub level: Option<u32>,
    /// The owner's monotonic clock, milliseconds.
    pub sent_ms: u64,
    pub owner: String,
}

impl Probe {
    /// The probe's message, sent at `wall_ms` (epoch ms): into `level`'s
    /// exchange, with a key whose only set digit is `level`'s, so that it
    /// waits in that level alone. Its due time is stamped as a task's is,
    /// for a drain that takes it off a stranded level.
    pub fn message(&self, cascade: &Cascade, wall_ms: u64) -> Message {
        let units = self.level.map_or(0, probe_units);
        let route = cascade.route_units(units, PROBE_DESTINATION);
        let due_ms = wall_ms + self.ttl_ms(cascade);
        let mut headers = self.header();
        headers.insert(
            DELIVER_AT_HEADER.into(),
            AMQPValue::LongLongInt(i64::try_from(due_ms).unwrap_or(i64::MAX)),
        );
        Message {
            exchange: route.entry_exchange,
            routing_key: route.routing_key,
            payload: Vec::new(),
            properties: BasicProperties::default()
                .with_message_id(ShortString::from("delayline-probe"))
                .with_delivery_mode(2)
                .with_headers(headers),
        }
    }

    /// What another replica's release stage sends the owner when the probe
    /// reached it: the probe again, straight to the owner's own queue
    /// (through the default exchange, which routes by queue name). Not
    /// persistent: that queue goes with the owner's connection.
    pub fn notice(&self, cascade: &Cascade) -> Message {
        Message {
            exchange: String::new(),
            routing_key: cascade.probe_notice_queue(&self.owner),
            payload: Vec::new(),
            properties: BasicProperties::default()
                .with_message_id(ShortString::from("delayline-probe"))
                .with_headers(self.header()),
        }
    }

    fn header(&self) -> FieldTable {
        let mut headers = FieldTable::default();
        headers.insert(
            PROBE_HEADER.into(),
            AMQPValue::LongString(LongString::from(format!(
                "{}:{}:{}",
                self.level.map_or("-".to_owned(), |level| level.to_string()),
                self.sent_ms,
                self.owner
            ))),
        );
        headers
    }

    /// How long the probe waits in its level: 0 through none.
    pub fn ttl_ms(&self, cascade: &Cascade) -> u64 {
        self.level.map_or(0, |level| cascade.level_ttl_ms(level))
    }

    /// The probe a message is, if it is one.
    pub fn read(properties: &BasicProperties) -> Option<Probe> {
        let text = text_header(properties, PROBE_HEADER)?;
        let mut parts = text.splitn(3, ':');
        let level = match parts.next()? {
            "-" => None,
            level => Some(level.parse().ok()?),
        };
        Some(Probe {
            level,
            sent_ms: parts.next()?.parse().ok()?,
            owner: parts.next()?.to_owned(),
        })
    }
}

/// The copy of a message delayline took off stranded level `level`, sent
/// on at `now` to where dead-lettering would have sent it (the next level
/// down, or the release stage), with the same routing key. In a chain that
/// holds, its hold stamp is made anew for the levels it still passes: the
/// old one promised an arrival no earlier than the broker's TTLs allowed,
/// which a copy sent by delayline need not keep.
pub fn drained(
    routing_key: &str,
    payload: Vec<u8>,
    properties: &BasicProperties,
    cascade: &Cascade,
    level: u32,
    now: &Reading,
) -> Message {
    let levels = cascade.levels();
    let below = crate::cascade::units_below(routing_key, levels, level);
    let properties = match (below, destination_of(routing_key, levels)) {
        (Some(below), Some(destination)) => {
            let mut route = cascade.route_units(below, destination);
            route.held = cascade.holds();
            restamped(properties, &route, now)
        }
        _ => super::publish::republished(properties),
    };
    Message {
        exchange: cascade.next_exchange(level),
        routing_key: routing_key.to_owned(),
        payload,
        properties,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cascade::{QueueType, for_tests};
    use crate::message::{Stamp, deliver_at_ms};

    #[test]
    fn a_probe_waits_in_its_level_alone_and_reads_back() {
        let cascade = for_tests(4, 100, QueueType::Quorum);
        let probe = Probe {
            level: Some(2),
            sent_ms: 1_000,
            owner: "host:1:a".into(),
        };
        let message = probe.message(&cascade, 90_000);
        assert_eq!(message.exchange, cascade.level_exchange(2));
        assert_eq!(message.routing_key, "0.1.0.0.delayline.probe");
        assert_eq!(Probe::read(&message.properties), Some(probe.clone()));
        assert_eq!(deliver_at_ms(&message.properties), Some(90_400));
        assert_eq!(Probe::read(&BasicProperties::default()), None);
        let direct = Probe {
            level: None,
            ..probe.clone()
        };
        let message = direct.message(&cascade, 90_000);
        assert_eq!(message.exchange, cascade.due_exchange());
        assert_eq!(Probe::read(&message.properties), Some(direct));
    }

    #[test]
    fn a_notice_goes_straight_to_the_owners_queue_and_reads_as_the_probe() {
        let cascade = for_tests(4, 100, QueueType::Quorum);
        let probe = Probe {
            level: Some(3),
            sent_ms: 7,
            owner: "00ff00ff00ff00ff".into(),
        };
        let notice = probe.notice(&cascade);
        assert_eq!(notice.exchange, "");
        assert_eq!(
            notice.routing_key,
            cascade.probe_notice_queue("00ff00ff00ff00ff")
        );
        assert!(notice.routing_key.ends_with(".probes.00ff00ff00ff00ff"));
        assert_eq!(Probe::read(&notice.properties), Some(probe));
    }

    #[test]
    fn a_drained_copy_goes_one_level_down_stamped_for_what_remains() {
        let cascade = for_tests(4, 100, QueueType::Quorum);
        let mut headers = FieldTable::default();
        headers.insert(DELIVER_AT_HEADER.into(), AMQPValue::LongLongInt(50_000));
        headers.insert("x-death".into(), AMQPValue::LongString("old".into()));
        let properties = BasicProperties::default().with_headers(headers);
        let now = Reading {
            wall: std::time::UNIX_EPOCH + std::time::Duration::from_millis(49_000),
            wall_ms: 49_000,
            mono_us: 7_000_000,
            source: "me",
        };
        let copy = drained("1.0.1.1.d", b"p".to_vec(), &properties, &cascade, 3, &now);
        assert_eq!(copy.exchange, cascade.level_exchange(2));
        assert_eq!(copy.routing_key, "1.0.1.1.d");
        let headers = copy.properties.headers().clone().unwrap();
        assert!(!headers.inner().contains_key("x-death"));
        if cascade.holds() {
            let stamp = Stamp::read(&copy.properties).unwrap();
            assert_eq!(stamp.source, "me");
            // Three units remain below level 3, less a millisecond a hop.
            assert_eq!(stamp.least_us, (300 - 2) * 1000);
            assert_eq!(stamp.due_us, 7_000_000 + 1_000_000);
        }
        let last = drained("0.0.0.1.d", Vec::new(), &properties, &cascade, 0, &now);
        assert_eq!(last.exchange, cascade.due_exchange());
    }
}
