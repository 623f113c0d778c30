//! How long the release stage holds a due message: pure logic, no I/O.
//!
//! In a chain that holds, a task reaches the release stage up to one unit
//! before it is due, carrying a [`Stamp`] in the clock of the replica that
//! published it. The releasing replica must not trust its wall clock
//! against `deliver_at`: another host wrote it, and hosts disagree. It
//! uses causality instead. A message sent at `sent` (sender's clock) cannot
//! arrive before `sent + least` (the levels' TTLs), so what this replica's
//! clock reads on arrival, less `sent + least`, is at least the offset
//! between the two clocks: every arrival is a sample, and the smallest
//! recent one is a bound. Releasing at `due + bound` (this replica's clock)
//! is then never early, whatever the clocks' offset; and the bound is as
//! tight as the fastest recent message from that replica, which with a
//! steady flow is within a millisecond or two of the true offset.
//!
//! The clocks are monotonic, so no step of a wall clock moves a bound. Their
//! rates may differ a little: a sample's bound grows by [`DRIFT_PPM`] per
//! unit of its age, and samples older than [`WINDOW_US`] are forgotten. A
//! message's own sample bounds it alone: it is never held longer than its
//! stamp says remains after the TTLs ([`Stamp::own_hold_us`]), plus what
//! fast TTLs may have cut short.
//!
//! The broker's TTLs are not exact either: an Erlang node correcting its
//! clock after the host's clock stepped runs up to 1 % fast until it has
//! caught up ([`crate::cascade::TTL_FAST_PPM`]), and expires messages that much early. A
//! sample therefore allows the levels' time to have been that much shorter.
//! A message stamped by this process's own clock needs no sample: it is
//! released at its due time exactly, however early the broker let it go.

use std::collections::HashMap;

use crate::cascade::ttl_fast_by;
use crate::message::Stamp;

/// How long a sample bounds a clock's offset.
pub const WINDOW_US: u64 = 10_000_000;
/// Samples are kept as the least of each slot this long.
const SLOT_US: u64 = 1_000_000;
/// The most two monotonic clocks' rates are taken to differ by, in parts
/// per million: what a sample's bound grows by as it ages.
pub const DRIFT_PPM: u64 = 100;
/// Past this many senders, the ones heard from least recently are forgotten.
const MAX_SOURCES: usize = 1024;

/// What this replica has seen of other replicas' clocks.
#[derive(Debug, Default)]
pub struct Offsets {
    /// Per sender: `(slot, least sample in it)`, oldest first.
    sources: HashMap<String, Vec<(u64, i128)>>,
}

impl Offsets {
    /// When, in this replica's clock (`own` names it), to release a message
    /// stamped `stamp` that arrived at `arrived_us`: never before it is due
    /// by the sender's clock; at most its own hold (and what fast TTLs cut)
    /// after it arrived, or, from this replica's own clock, at its due time.
    pub fn release_at(&mut self, stamp: &Stamp, arrived_us: u64, own: &str) -> u64 {
        if stamp.source == own {
            // The same clock: its due time is exact. No later than its whole
            // delay after it arrived, since it was sent before it arrived.
            return stamp.due_us.max(arrived_us);
        }
        let own_hold = stamp.own_hold_us();
        let latest = arrived_us
            .saturating_add(own_hold)
            .saturating_add(drift_over(own_hold))
            .saturating_add(ttl_fast_by(stamp.least_us));
        self.observe(stamp, arrived_us);
        // Aged to the latest it may be released: the clocks drift meanwhile.
        let bound = self
            .bound(&stamp.source, latest)
            .unwrap_or_else(|| sample(stamp, arrived_us));
        let target = i128::from(stamp.due_us) + bound;
        let target = u64::try_from(target.max(0)).unwrap_or(u64::MAX);
        target.clamp(arrived_us, latest)
    }

    /// Records what `stamp`, arriving at `arrived_us`, says about its sender's clock.
    fn observe(&mut self, stamp: &Stamp, arrived_us: u64) {
        let slot = arrived_us / SLOT_US;
        let value = sample(stamp, arrived_us);
        if !self.sources.contains_key(&stamp.source) && self.sources.len() >= MAX_SOURCES {
            self.forget_before(arrived_us);
        }
        let slots = self.sources.entry(stamp.source.clone()).or_default();
        match slots.last_mut() {
            Some((last, least)) if *last == slot => *least = (*least).min(value),
            _ => slots.push((slot, value)),
        }
        let oldest = slot.saturating_sub(WINDOW_US / SLOT_US);
        slots.retain(|(slot, _)| *slot >= oldest);
    }

    /// The least offset of `source`'s clock behind this one that its recent
    /// samples allow, grown by the drift their age allows.
    fn bound(&self, source: &str, now_us: u64) -> Option<i128> {
        self.sources
            .get(source)?
            .iter()
            .map(|(slot, least)| {
                // Aged from the slot's start: no sample in it is older.
                let age_us = now_us.saturating_sub(slot * SLOT_US);
                least + i128::from(drift_over(age_us))
            })
            .min()
    }

    /// Forgets every sender not heard from since `WINDOW_US` before `now_us`.
    fn forget_before(&mut self, now_us: u64) {
        let oldest = now_us.saturating_sub(WINDOW_US) / SLOT_US;
        self.sources
            .retain(|_, slots| slots.last().is_some_and(|(slot, _)| *slot >= oldest));
    }

    /// How many senders' clocks are bounded.
    #[cfg(test)]
    pub fn senders(&self) -> usize {
        self.sources.len()
    }
}

/// A window's messages as claimed together, by each one's release time
/// (`at_us`): in order of time, each group the messages due within
/// `span_us` of its first. One claim (one ledger commit) per group, made
/// before the group's first time, keeps the commit off the path without
/// claiming any message much earlier than its time.
pub fn claim_groups<T>(mut items: Vec<T>, at_us: impl Fn(&T) -> u64, span_us: u64) -> Vec<Vec<T>> {
    items.sort_by_key(&at_us);
    let mut groups: Vec<Vec<T>> = Vec::new();
    for item in items {
        match groups.last_mut() {
            Some(group) if at_us(&item) - at_us(&group[0]) <= span_us => group.push(item),
            _ => groups.push(vec![item]),
        }
    }
    groups
}

/// The most two clocks may drift apart over `us`.
fn drift_over(us: u64) -> u64 {
    us.div_ceil(1_000_000 / DRIFT_PPM)
}

/// Arrival, less the earliest the message could have arrived by its
/// sender's clock (its TTLs run as fast as a broker's may): at least the
/// offset of the sender's clock behind this one.
fn sample(stamp: &Stamp, arrived_us: u64) -> i128 {
    let earliest = stamp.least_us.saturating_sub(ttl_fast_by(stamp.least_us));
    i128::from(arrived_us) - i128::from(stamp.sent_us) - i128::from(earliest)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn stamp(source: &str, sent_us: u64, due_us: u64, least_us: u64) -> Stamp {
        Stamp {
            source: source.to_owned(),
            sent_us,
            due_us,
            least_us,
        }
    }

    #[test]
    fn the_first_message_from_a_sender_is_held_for_what_its_stamp_says_remains() {
        let mut offsets = Offsets::default();
        // Sent at 1 s by its clock, due 2.3 s later, two seconds in the
        // levels; it arrives at 50 s by ours, 5 ms after the TTLs let it.
        // What fast TTLs may have cut (1 % of two seconds) is added.
        let first = stamp("a", 1_000_000, 3_300_000, 2_000_000);
        let released = offsets.release_at(&first, 50_005_000, "me");
        assert!((50_325_000..=50_325_100).contains(&released), "{released}");
    }

    #[test]
    fn a_faster_message_tightens_the_bound_for_the_next() {
        let mut offsets = Offsets::default();
        // The sender's clock is 49 s behind ours. One message comes through
        // with no transit, another with 20 ms.
        let quick = stamp("a", 1_000_000, 1_000_000, 0);
        assert_eq!(offsets.release_at(&quick, 50_000_000, "me"), 50_000_000);
        let slow = stamp("a", 1_100_000, 2_000_000, 800_000);
        let released = offsets.release_at(&slow, 50_920_000, "me");
        // Due at 2 s by the sender's clock: 51 s by ours, plus the quick
        // sample's drift allowance (100 µs a second).
        assert!((51_000_000..=51_000_200).contains(&released), "{released}");
    }

    #[test]
    fn a_message_of_this_replicas_own_clock_is_released_when_due() {
        let mut offsets = Offsets::default();
        let own = stamp("me", 10, 1_500_000, 1_000_000);
        assert_eq!(offsets.release_at(&own, 1_200_000, "me"), 1_500_000);
        // Late already: at once.
        assert_eq!(offsets.release_at(&own, 1_600_000, "me"), 1_600_000);
        // A broker whose TTLs ran fast let it out before the levels' time:
        // still at its due time, not its stamp's hold after arriving.
        assert_eq!(offsets.release_at(&own, 700_000, "me"), 1_500_000);
        assert_eq!(offsets.senders(), 0);
    }

    #[test]
    fn old_samples_and_silent_senders_are_forgotten() {
        let mut offsets = Offsets::default();
        offsets.release_at(&stamp("a", 0, 0, 0), 1_000_000, "me");
        offsets.release_at(&stamp("a", 0, 0, 0), 1_000_000 + WINDOW_US * 2, "me");
        assert_eq!(offsets.sources["a"].len(), 1);
        for n in 0..MAX_SOURCES + 5 {
            let at = 100 * WINDOW_US + n as u64;
            offsets.release_at(&stamp(&n.to_string(), 0, 0, 0), at, "me");
        }
        assert!(offsets.senders() <= MAX_SOURCES + 5);
        assert!(!offsets.sources.contains_key("a"));
    }

    /// A message of the simulation: sent at `sent` (true time, µs), due
    /// `ahead` later, `least` in the levels, arriving `transit` after that.
    fn message() -> impl Strategy<Value = (u64, u64, u64, u64)> {
        (
            0u64..30_000_000,
            0u64..2_000_000,
            0u64..2_000_000,
            prop_oneof![Just(0u64), 0u64..50_000, 0u64..3_000_000],
        )
    }

    proptest! {

        /// Every message is in exactly one group, groups follow one another
        /// in time, and a group spans at most `span`.
        #[test]
        fn claim_groups_cover_each_message_once_in_order_within_the_span(
            targets in proptest::collection::vec(0u64..50_000, 0..300),
            span in 0u64..10_000,
        ) {
            let groups = claim_groups((0..targets.len()).collect(), |&i| targets[i], span);
            let mut seen: Vec<usize> = groups.iter().flatten().copied().collect();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..targets.len()).collect::<Vec<_>>());
            for group in &groups {
                let first = targets[group[0]];
                prop_assert!(group.iter().all(|&i| targets[i] >= first && targets[i] - first <= span));
            }
            for pair in groups.windows(2) {
                let last = pair[0].iter().map(|&i| targets[i]).max().unwrap_or(0);
                prop_assert!(targets[pair[1][0]] > last);
                // Not split needlessly: the next group starts past the span.
                prop_assert!(targets[pair[1][0]] - targets[pair[0][0]] > span);
            }
        }
        /// Whatever the offset of the two clocks (and a rate within the
        /// drift allowed), however late each message and however fast the
        /// broker's TTLs (within what is allowed), none is released before
        /// it is due by the sender's clock, none is held past its own hold
        /// and what fast TTLs cut, and a message after one that came through
        /// without transit is released within a millisecond of its due time.
        #[test]
        fn never_early_whatever_the_clocks_say(
            offset in -1_000_000_000_000i64..1_000_000_000_000,
            drift_ppm in -(DRIFT_PPM as i64)..=DRIFT_PPM as i64,
            fast_ppm in prop_oneof![Just(0u64), 0u64..=crate::cascade::TTL_FAST_PPM],
            mut messages in proptest::collection::vec(message(), 1..40),
        ) {
            // What the levels really took: their TTLs, run `fast_ppm` fast.
            let levels = |least: u64| least - least * fast_ppm / 1_000_000;
            // Taken in the order they arrive, as the stage takes them.
            messages.sort_by_key(|(sent, ahead, least, transit)| sent + levels(*least.min(ahead)) + transit);
            // The sender's clock reads true time; ours reads it shifted
            // by `offset` and running `drift_ppm` fast or slow.
            let ours = |t: u64| -> i128 {
                i128::from(t) + i128::from(offset) + i128::from(t) * i128::from(drift_ppm) / 1_000_000
            };
            let base = 2_000_000_000_000i128;
            let mut offsets = Offsets::default();
            let mut quick_since: Option<u64> = None;
            for (sent, ahead, least, transit) in messages {
                let least = least.min(ahead);
                let arrived = sent + levels(least) + transit;
                let due = sent + ahead;
                let s = stamp("sender", sent, due, least);
                let arrived_ours = u64::try_from(base + ours(arrived)).unwrap();
                let released_ours = offsets.release_at(&s, arrived_ours, "me");
                let due_ours = base + ours(due);
                // Never early, to the microsecond the drift's rounding allows.
                prop_assert!(i128::from(released_ours) + 1 >= due_ours,
                    "released {released_ours}, due {due_ours}");
                prop_assert!(released_ours >= arrived_ours);
                prop_assert!(released_ours <= arrived_ours + s.own_hold_us()
                    + drift_over(s.own_hold_us()) + ttl_fast_by(least));
                if transit == 0 && least == 0 {
                    quick_since.get_or_insert(arrived);
                }
                if let Some(since) = quick_since
                    && arrived.saturating_sub(since) < SLOT_US
                    && due >= arrived
                {
                    let late = i128::from(released_ours) - due_ours;
                    prop_assert!(late <= 1_000, "{late} µs late after a quick sample");
                }
            }
        }

        /// A message of this process's own clock is released exactly at its
        /// due time, or on arrival when late, however early the broker let
        /// it out.
        #[test]
        fn a_message_of_the_own_clock_is_never_early_whatever_the_broker(
            sent in 0u64..1_000_000_000,
            ahead in 0u64..100_000_000,
            least in 0u64..100_000_000,
            arrived_after in 0u64..200_000_000,
        ) {
            let least = least.min(ahead);
            let due = sent + ahead;
            let arrived = sent + arrived_after;
            let released = Offsets::default().release_at(&stamp("me", sent, due, least), arrived, "me");
            prop_assert_eq!(released, due.max(arrived));
        }
    }
}
