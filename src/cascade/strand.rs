//! Stranded levels, as pure logic: when a level is taken to have stopped
//! dead-lettering, and when a message taken off such a level goes on.
//!
//! A quorum queue's at-least-once dead-letter worker can stop for good
//! after a node loss (RabbitMQ #16652, #12625): the level keeps taking
//! messages, they expire, and nothing leaves. The broker reports nothing a
//! client can read over AMQP (expired messages are neither ready nor
//! unacknowledged), so delayline sends a probe through each level, a
//! message that waits in that level alone, and watches for it at the
//! release stage. A level whose oldest unanswered probe is older than its
//! TTL plus a margin is stranded. While it is, delayline consumes the level
//! itself: a consumer takes messages before they expire, and they go on
//! at the time the level would have sent them.

use std::collections::BTreeMap;

use super::Cascade;

/// A message entering level `level` alone: the units of a probe through it.
pub fn probe_units(level: u32) -> u64 {
    1u64 << level
}

/// The 1-based position of digit `level` in a routing key of `levels`
/// digits (`d.d.d.destination`, most significant first), as SQL's
/// `substr` counts.
pub fn digit_position(levels: u32, level: u32) -> u32 {
    (levels - 1 - level) * 2 + 1
}

/// Units the message with `routing_key` still waits below level `level`
/// (its digits under `level`); `None` for a key that is not the chain's.
pub fn units_below(routing_key: &str, levels: u32, level: u32) -> Option<u64> {
    let digits: Vec<&str> = routing_key.splitn(levels as usize + 1, '.').collect();
    if digits.len() <= levels as usize {
        return None;
    }
    let mut units = 0u64;
    for (i, digit) in digits[..levels as usize].iter().enumerate() {
        let at = levels - 1 - i as u32;
        match *digit {
            "1" if at < level => units |= 1 << at,
            "0" | "1" => {}
            _ => return None,
        }
    }
    Some(units)
}

/// Each level the message with `routing_key` waits in, with the units from
/// its entry into the chain until it leaves that level (its digits at and
/// above it), highest level first; empty for a key that is not the chain's.
pub fn levels_left(routing_key: &str, levels: u32) -> Vec<(u32, u64)> {
    let digits: Vec<&str> = routing_key.splitn(levels as usize + 1, '.').collect();
    if digits.len() <= levels as usize {
        return Vec::new();
    }
    let mut units = 0u64;
    let mut left = Vec::new();
    for (i, digit) in digits[..levels as usize].iter().enumerate() {
        let level = levels - 1 - i as u32;
        match *digit {
            "1" => {
                units += 1 << level;
                left.push((level, units));
            }
            "0" => {}
            _ => return Vec::new(),
        }
    }
    left
}

impl Cascade {
    /// When (epoch ms) a message due at `deliver_at_ms` leaves level
    /// `level` on its way: its due time less what the levels below still
    /// hold it for and the release lead (a held chain's release stage holds
    /// the rest). Taken off a stranded level, it goes on then: the release
    /// stage holds it to its millisecond, so going on a little early costs
    /// nothing, and on time it costs no lateness.
    pub fn leaves_level_at_ms(&self, routing_key: &str, level: u32, deliver_at_ms: u64) -> u64 {
        let below = units_below(routing_key, self.levels(), level).unwrap_or(0);
        deliver_at_ms
            .saturating_sub(below.saturating_mul(self.unit_ms()))
            .saturating_sub(self.release_lead_ms())
    }

    /// The longest a message waits in the levels delayline probes, all of
    /// them taken: how long after a failover a message the broker held
    /// then may still be due (see [`super::LossWindow`]).
    pub fn watched_span_ms(&self) -> u64 {
        LevelWatch::watched(self)
            .map(|level| self.level_ttl_ms(level))
            .sum()
    }
}

/// The longest TTL of a level delayline probes and drains: a probe through
/// a longer one would take longer to say anything than the ledger's
/// resender takes to publish its tasks again, and a drained message is
/// held unacknowledged until it goes on, which RabbitMQ's consumer timeout
/// (30 minutes by default) bounds.
pub const MAX_WATCHED_TTL_MS: u64 = 10 * 60 * 1000;

/// What this replica's probes say of one level.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct LevelProbes {
    /// When each of this replica's probes still out through the level was
    /// sent (its monotonic clock, ms: a stepped wall clock must not make a
    /// probe look late). Oldest first: the oldest is the one judged. With
    /// each, once the broker confirmed it, when that was: it entered the
    /// level by then (a publish may wait behind a burst's releases on its
    /// channel).
    out: BTreeMap<u64, Option<u64>>,
    /// Since when the level is taken to be stranded.
    stranded_since_ms: Option<u64>,
    /// What showed it.
    stranded_by: Option<Evidence>,
    /// The latest moment a task seen at the release stage was due to leave
    /// the level (its sender's stamp, this process's clock), and when that
    /// was first seen: a level whose tasks keep coming out, each due to
    /// leave later than the last, is moving.
    passed: Option<Passed>,
}

/// What showed a level stranded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// A probe due more than the margin after its own came back first, and
    /// no task came out of it for twice the margin.
    Overtaken,
    /// It let a task go that was due to leave it more than the margin after
    /// its own probe, which stays out.
    OutOfOrder,
}

impl Evidence {
    /// In words, for the log.
    pub fn says(self) -> &'static str {
        match self {
            Evidence::Overtaken => {
                "a probe that fell due more than the margin after its own came back first, \
                 and no task came out of it for twice the margin"
            }
            Evidence::OutOfOrder => {
                "it let a task go that was due to leave it more than the margin after its own \
                 probe, which it still holds"
            }
        }
    }
}

/// The newest evidence that a level passes tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Passed {
    left_ms: u64,
    seen_ms: u64,
}

/// The probes of every level of a chain, and the verdicts drawn from them.
/// Every time here is one replica's monotonic clock, in milliseconds.
///
/// A probe may be late for reasons that are not the level's: a backlog in
/// the release queue ahead of it (after an outage), a slow broker. So a
/// level is judged by order, not by the clock alone: it is stranded when a
/// probe of another level that fell due more than the margin after its own
/// probe has already come back. Both waited in the same release queue, so
/// only the level can have kept the first. A probe through no level at
/// all, straight to the release queue, overtakes them when every level
/// stopped at once.
///
/// A burst is not a stop: a level passing a burst holds its probe behind
/// thousands of messages its one dead-letter worker passes in order, and a
/// probe of a quiet level overtakes it. So the tasks that reach the release
/// stage speak too ([`LevelWatch::passed`]): a level that let one of them
/// go, due to leave it later than any before, within twice the margin, is
/// moving and not stranded by being overtaken, and so is every level while
/// the replica stages or releases a burst (a level's one worker may wait
/// seconds for the queues it feeds, which the burst fills:
/// [`LevelWatch::burst_seen`]); one that let a task go due
/// to leave it more than the margin after its oldest probe, which stays
/// out, broke its own order, and is stranded even while it moves.
///
/// A node loss can leave a level that passes what comes later but keeps
/// what it held at the loss; only a probe inside it at that moment shows
/// it. So a level always has a probe inside: the next goes in while the
/// newest still has two probe intervals left in the level (a level shorter
/// than that gets one every interval, and has one inside that share of the
/// time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LevelWatch {
    levels: Vec<LevelProbes>,
    /// The probe straight to the release stage, through no level: it
    /// shows how far the release queue is behind, when every level is
    /// stranded at once (a node's dead-letter workers all stopped) and no
    /// probe of a level could overtake another. One out at a time.
    direct: LevelProbes,
    /// How long past its own due time a probe may still be overtaken.
    margin_ms: u64,
    /// How often probes are sent (the keeper's interval).
    every_ms: u64,
    /// The latest due time (sent plus TTL) of a probe that came back.
    latest_due_back_ms: u64,
    /// Until when this replica takes the cascade to be busy with a burst
    /// (it staged or released one from the ledger just before).
    burst_until_ms: u64,
}

impl LevelWatch {
    pub fn new(levels: u32, margin_ms: u64, every_ms: u64) -> LevelWatch {
        LevelWatch {
            levels: vec![LevelProbes::default(); levels as usize],
            direct: LevelProbes::default(),
            margin_ms,
            every_ms,
            latest_due_back_ms: 0,
            burst_until_ms: 0,
        }
    }

    /// The levels probed: those of at most [`MAX_WATCHED_TTL_MS`].
    pub fn watched(cascade: &Cascade) -> impl Iterator<Item = u32> + '_ {
        (0..cascade.levels()).filter(|&level| cascade.level_ttl_ms(level) <= MAX_WATCHED_TTL_MS)
    }

    /// Whether a probe should go through `level` (`None`: straight to the
    /// release stage) at `now_ms`: the level is not taken over (its probes
    /// would pass through delayline's own consumer and say nothing of the
    /// broker), and its newest probe out, if any, leaves it within two
    /// intervals (so the next is inside before it leaves, whatever the
    /// tick's jitter or the confirm's wait). The direct probe waits for
    /// its last to come back.
    pub fn wants_probe(&self, cascade: &Cascade, level: Option<u32>, now_ms: u64) -> bool {
        let Some(probes) = self.probes(level) else {
            return false;
        };
        if probes.stranded_since_ms.is_some() {
            return false;
        }
        match (level, probes.out.last_key_value().map(|(sent, _)| sent)) {
            (_, None) => true,
            (None, Some(_)) => false,
            (Some(level), Some(&newest)) => {
                let leaves_ms = newest.saturating_add(cascade.level_ttl_ms(level));
                leaves_ms < now_ms.saturating_add(self.every_ms.saturating_mul(2))
            }
        }
    }

    fn probes(&self, level: Option<u32>) -> Option<&LevelProbes> {
        match level {
            Some(level) => self.levels.get(level as usize),
            None => Some(&self.direct),
        }
    }

    fn probes_mut(&mut self, level: Option<u32>) -> Option<&mut LevelProbes> {
        match level {
            Some(level) => self.levels.get_mut(level as usize),
            None => Some(&mut self.direct),
        }
    }

    /// This replica's probe went through `level` at `sent_ms`.
    pub fn sent(&mut self, level: Option<u32>, sent_ms: u64) {
        if let Some(probes) = self.probes_mut(level) {
            probes.out.insert(sent_ms, None);
        }
    }

    /// The broker confirmed the probe sent through `level` at `sent_ms`,
    /// at `confirmed_ms`.
    pub fn confirmed(&mut self, level: Option<u32>, sent_ms: u64, confirmed_ms: u64) {
        if let Some(entered) = self
            .probes_mut(level)
            .and_then(|probes| probes.out.get_mut(&sent_ms))
        {
            *entered = Some(confirmed_ms);
        }
    }

    /// The probe noted as sent through `level` at `sent_ms` was not (the
    /// broker did not confirm it).
    pub fn not_sent(&mut self, level: Option<u32>, sent_ms: u64) {
        if let Some(probes) = self.probes_mut(level) {
            probes.out.remove(&sent_ms);
        }
    }

    /// This replica's probe sent through `level` at `sent_ms`, due `ttl_ms`
    /// later, reached the release stage. The older ones of the level stay
    /// out: a level that passes new messages may keep old ones.
    pub fn came_back(&mut self, level: Option<u32>, sent_ms: u64, ttl_ms: u64) {
        self.latest_due_back_ms = self.latest_due_back_ms.max(sent_ms + ttl_ms);
        if let Some(probes) = self.probes_mut(level) {
            probes.out.remove(&sent_ms);
        }
    }

    /// This replica staged a burst's tasks, or released them from the
    /// ledger, at `now_ms`: for twice the margin, a level whose probe is
    /// overtaken is taken to be behind the burst, not stopped (one that
    /// breaks its own order still is).
    pub fn burst_seen(&mut self, now_ms: u64) {
        self.burst_until_ms = now_ms.saturating_add(self.margin_ms.saturating_mul(2));
    }

    /// A task seen at the release stage at `now_ms` was due to leave
    /// `level` at `left_ms` (both this process's monotonic clock).
    pub fn passed(&mut self, level: u32, left_ms: u64, now_ms: u64) {
        if let Some(probes) = self.levels.get_mut(level as usize)
            && probes.passed.is_none_or(|p| left_ms > p.left_ms)
        {
            probes.passed = Some(Passed {
                left_ms,
                seen_ms: now_ms,
            });
        }
    }

    /// The levels found stranded at `now_ms` that were not before: a probe
    /// due more than the margin after theirs has come back first and the
    /// level shows no progress of its own, or the level let a task go due
    /// to leave it more than the margin after its probe.
    pub fn newly_stranded(&mut self, cascade: &Cascade, now_ms: u64) -> Vec<u32> {
        let (margin_ms, latest) = (self.margin_ms, self.latest_due_back_ms);
        let mut found = Vec::new();
        for (level, probes) in (0u32..).zip(&mut self.levels) {
            let Some((&sent, &entered)) = probes.out.first_key_value() else {
                continue;
            };
            let late_after = (sent + cascade.level_ttl_ms(level)).saturating_add(margin_ms);
            let moving = now_ms < self.burst_until_ms
                || probes.passed.is_some_and(|p| {
                    now_ms.saturating_sub(p.seen_ms) <= margin_ms.saturating_mul(2)
                });
            // Against when the probe surely was inside: the task entered the
            // level after that, so it cannot leave before the probe.
            let order_broken = entered.is_some_and(|entered_ms| {
                let inside_late_after =
                    (entered_ms + cascade.level_ttl_ms(level)).saturating_add(margin_ms);
                probes.passed.is_some_and(|p| p.left_ms > inside_late_after)
            });
            let overtaken = latest > late_after;
            let evidence = if order_broken {
                Some(Evidence::OutOfOrder)
            } else {
                (overtaken && !moving).then_some(Evidence::Overtaken)
            };
            if evidence.is_some() && probes.stranded_since_ms.is_none() {
                probes.stranded_by = evidence;
                probes.stranded_since_ms = Some(now_ms);
                found.push(level);
            }
        }
        found
    }

    /// The levels taken to be stranded at least `after_ms` before `now_ms`:
    /// due to be handed back to the broker (see [`LevelWatch::hand_back`]).
    pub fn due_for_recheck(&self, now_ms: u64, after_ms: u64) -> Vec<u32> {
        self.stranded()
            .into_iter()
            .filter(|&(_, since)| now_ms.saturating_sub(since) >= after_ms)
            .map(|(level, _)| level)
            .collect()
    }

    /// `level` handed back to the broker: probed again like any other
    /// level, and stranded again only if a probe overtakes its next one.
    pub fn hand_back(&mut self, level: u32) {
        if let Some(probes) = self.levels.get_mut(level as usize) {
            *probes = LevelProbes::default();
        }
    }

    /// What showed `level` stranded, while it is taken to be.
    pub fn evidence(&self, level: u32) -> Option<Evidence> {
        self.levels
            .get(level as usize)
            .filter(|probes| probes.stranded_since_ms.is_some())
            .and_then(|probes| probes.stranded_by)
    }

    /// The levels taken to be stranded, each with since when.
    pub fn stranded(&self) -> Vec<(u32, u64)> {
        (0u32..)
            .zip(&self.levels)
            .filter_map(|(level, probes)| Some((level, probes.stranded_since_ms?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cascade::{QueueType, for_tests};
    use proptest::prelude::*;

    #[test]
    fn digits_below_a_level_are_what_remains_after_it() {
        assert_eq!(units_below("1.0.1.1.d", 4, 3), Some(0b011));
        assert_eq!(units_below("1.0.1.1.d", 4, 1), Some(0b1));
        assert_eq!(units_below("1.0.1.1.d", 4, 0), Some(0));
        assert_eq!(units_below("1.0.1.1.a.b", 4, 3), Some(0b011));
        assert_eq!(units_below("1.0.x.1.d", 4, 3), None);
        assert_eq!(units_below("1.0", 4, 3), None);
        assert_eq!(digit_position(4, 3), 1);
        assert_eq!(digit_position(4, 0), 7);
        assert_eq!(&"1.0.1.1.d"[6..7], "1");
    }

    #[test]
    fn a_key_says_when_its_message_leaves_each_level() {
        assert_eq!(levels_left("1.0.1.1.d", 4), vec![(3, 8), (1, 10), (0, 11)]);
        assert_eq!(levels_left("0.0.0.0.d", 4), vec![]);
        assert_eq!(levels_left("1.x.1.1.d", 4), vec![]);
        assert_eq!(levels_left("1.0", 4), vec![]);
    }

    #[test]
    fn a_level_passing_a_burst_is_not_stranded_but_one_that_breaks_its_order_is() {
        let cascade = for_tests(4, 100, QueueType::Quorum);
        let mut watch = LevelWatch::new(4, 1_000, 100);
        // Level 3's probe (due 10,800) waits behind a burst; level 0's,
        // due 12,000, overtakes it.
        watch.sent(Some(3), 10_000);
        watch.came_back(None, 12_000, 0);
        // Tasks keep leaving level 3, each due to leave later, older than the probe.
        watch.passed(3, 10_500, 11_900);
        assert!(watch.newly_stranded(&cascade, 12_000).is_empty(), "moving");
        watch.passed(3, 10_400, 12_500);
        assert!(
            watch.newly_stranded(&cascade, 13_850).is_empty(),
            "an earlier task is no progress, but 2 s have not passed"
        );
        watch.passed(3, 10_600, 13_500);
        assert!(watch.newly_stranded(&cascade, 15_500).is_empty());
        // No progress for more than twice the margin: stopped, unless the
        // replica staged or released a burst within twice the margin.
        watch.burst_seen(14_000);
        assert!(watch.newly_stranded(&cascade, 15_999).is_empty());
        assert_eq!(watch.newly_stranded(&cascade, 16_000), vec![3]);
        assert_eq!(watch.evidence(3), Some(Evidence::Overtaken));

        let mut watch = LevelWatch::new(4, 1_000, 100);
        watch.sent(Some(3), 10_000);
        // Until the broker confirmed the probe, nothing says when it
        // entered: its publish may wait behind others.
        watch.passed(3, 11_801, 11_950);
        assert!(watch.newly_stranded(&cascade, 11_950).is_empty());
        watch.confirmed(Some(3), 10_000, 10_001);
        // A task due to leave level 3 past the probe (inside by 10,001) and
        // the margin came out: the level kept its probe while passing newer
        // messages.
        assert!(
            watch.newly_stranded(&cascade, 12_000).is_empty(),
            "by 1 ms no"
        );
        watch.passed(3, 11_802, 12_001);
        watch.burst_seen(12_001);
        assert_eq!(
            watch.newly_stranded(&cascade, 12_001),
            vec![3],
            "even in a burst"
        );
        assert_eq!(watch.evidence(3), Some(Evidence::OutOfOrder));
    }

    #[test]
    fn a_message_leaves_a_level_when_the_levels_below_and_the_lead_remain() {
        let cascade = for_tests(4, 100, QueueType::Quorum);
        // 0b1011 units: at level 3 it still has 0b011 = 3 units below.
        let key = "1.0.1.1.d";
        assert_eq!(cascade.leaves_level_at_ms(key, 3, 10_000), 10_000 - 300);
        assert_eq!(cascade.leaves_level_at_ms(key, 0, 10_000), 10_000);
        assert_eq!(cascade.level_ttl_ms(3), 800);
    }

    #[test]
    fn a_probe_overtaken_by_one_due_past_the_margin_strands_its_level_once() {
        let cascade = for_tests(4, 100, QueueType::Quorum);
        let mut watch = LevelWatch::new(4, 1_000, 100);
        watch.sent(Some(2), 10_000);
        watch.sent(Some(0), 10_000);
        assert!(!watch.wants_probe(&cascade, Some(2), 10_000));
        // Level 0's probe, due at 10,100, is back: no later than level 2's
        // (due 10,400) plus the margin.
        watch.came_back(Some(0), 10_000, 100);
        assert!(
            watch.newly_stranded(&cascade, 60_000).is_empty(),
            "late, not overtaken"
        );
        watch.came_back(Some(0), 11_300, 100);
        assert!(watch.newly_stranded(&cascade, 60_000).is_empty());
        watch.came_back(Some(0), 11_301, 100);
        assert_eq!(watch.newly_stranded(&cascade, 60_000), vec![2]);
        assert!(watch.newly_stranded(&cascade, 70_000).is_empty());
        assert_eq!(watch.stranded(), vec![(2, 60_000)]);
        assert!(
            !watch.wants_probe(&cascade, Some(2), 60_000),
            "a level taken over is not probed"
        );
        assert!(watch.wants_probe(&cascade, Some(1), 60_000));
    }

    #[test]
    fn with_every_level_stranded_the_direct_probe_overtakes_them() {
        let cascade = for_tests(4, 100, QueueType::Quorum);
        let mut watch = LevelWatch::new(4, 1_000, 100);
        for level in 0..4 {
            watch.sent(Some(level), 10_000);
        }
        watch.sent(None, 10_000);
        assert!(!watch.wants_probe(&cascade, None, 11_000), "one at a time");
        watch.not_sent(None, 10_000);
        assert!(watch.wants_probe(&cascade, None, 10_000));
        watch.sent(None, 10_000);
        watch.came_back(None, 10_000, 0);
        assert!(watch.wants_probe(&cascade, None, 10_000));
        watch.sent(None, 11_250);
        watch.came_back(None, 11_250, 0);
        // Due 11,250: past levels 0 (10,100) and 1 (10,200) and the margin.
        assert_eq!(watch.newly_stranded(&cascade, 12_000), vec![0, 1]);
        watch.came_back(None, 20_000, 0);
        assert_eq!(watch.newly_stranded(&cascade, 20_000), vec![2, 3]);
    }

    #[test]
    fn a_stranded_level_is_handed_back_after_the_recheck_and_taken_again_if_overtaken() {
        let cascade = for_tests(4, 100, QueueType::Quorum);
        let mut watch = LevelWatch::new(4, 1_000, 100);
        watch.sent(Some(2), 10_000);
        watch.came_back(None, 11_500, 0);
        assert_eq!(watch.newly_stranded(&cascade, 12_000), vec![2]);
        assert!(watch.due_for_recheck(71_999, 60_000).is_empty());
        assert_eq!(watch.due_for_recheck(72_000, 60_000), vec![2]);
        watch.hand_back(2);
        assert!(watch.stranded().is_empty());
        assert!(watch.wants_probe(&cascade, Some(2), 72_000), "probed again");
        // Its old probe, drained late, says nothing of the new one.
        watch.sent(Some(2), 72_000);
        watch.came_back(Some(2), 10_000, 400);
        assert!(!watch.wants_probe(&cascade, Some(2), 72_000));
        // Back in time: handed back for good.
        watch.came_back(Some(2), 72_000, 400);
        assert!(watch.newly_stranded(&cascade, 72_500).is_empty());
        // Overtaken again: taken again.
        watch.sent(Some(2), 80_000);
        watch.came_back(None, 81_401, 0);
        assert_eq!(watch.newly_stranded(&cascade, 81_500), vec![2]);
    }

    #[test]
    fn only_levels_of_at_most_ten_minutes_are_watched() {
        let cascade = for_tests(20, 1000, QueueType::Quorum);
        let watched: Vec<u32> = LevelWatch::watched(&cascade).collect();
        assert_eq!(watched, (0..10).collect::<Vec<_>>(), "2^9 s = 512 s");
    }

    #[test]
    fn a_probe_older_than_one_back_through_the_same_level_stays_out() {
        // After a node loss a level may pass a new probe and keep the one
        // it held at the loss: the old one is still judged.
        let cascade = for_tests(4, 100, QueueType::Quorum);
        let mut watch = LevelWatch::new(4, 1_000, 100);
        watch.sent(Some(3), 10_000);
        watch.sent(Some(3), 10_700);
        watch.came_back(Some(3), 10_700, 800);
        assert!(watch.newly_stranded(&cascade, 11_600).is_empty());
        watch.sent(Some(0), 11_801);
        watch.came_back(Some(0), 11_801, 100);
        assert_eq!(watch.newly_stranded(&cascade, 12_000), vec![3]);
    }

    proptest! {
        /// However late the probes come back (a backlog in the release
        /// queue delays them all alike), a level whose probes come back in
        /// due order, within the margin, is never stranded; one whose probe
        /// stays out is, as soon as a probe due past its own and the margin
        /// comes back.
        #[test]
        fn only_a_level_overtaken_past_the_margin_is_stranded(
            probes in proptest::collection::vec((0u32..6, 0u64..20_000, 0u64..900), 1..40),
            backlog in 0u64..60_000,
        ) {
            let cascade = for_tests(6, 50, QueueType::Quorum);
            let margin = 1_000;
            let mut watch = LevelWatch::new(6, margin, 100);
            // (back at, level, sent): the release stage sees them in due
            // order, each up to 900 ms off, all behind the same backlog.
            let mut events: Vec<(u64, u32, u64)> = probes
                .iter()
                .map(|&(level, sent, jitter)| {
                    (sent + cascade.level_ttl_ms(level) + jitter + backlog, level, sent)
                })
                .collect();
            events.sort();
            let mut sent_order = probes.clone();
            sent_order.sort_by_key(|p| p.1);
            for (level, sent, _) in &sent_order {
                watch.sent(Some(*level), *sent);
            }
            for (at, level, sent) in events {
                watch.came_back(Some(level), sent, cascade.level_ttl_ms(level));
                prop_assert!(watch.newly_stranded(&cascade, at).is_empty());
            }
            // Level 3's next probe stays out; level 0's, due 1,001 ms after it, comes back.
            let last = 100_000;
            watch.sent(Some(3), last);
            let due = last + cascade.level_ttl_ms(3) + margin + 1;
            watch.came_back(Some(0), due - cascade.level_ttl_ms(0), cascade.level_ttl_ms(0));
            prop_assert_eq!(watch.newly_stranded(&cascade, due + backlog), vec![3]);
        }

        /// With ticks at most twice the interval apart, a level whose TTL
        /// is at least two intervals has a probe inside at every moment
        /// from its first: the next goes in before the newest leaves. And
        /// no more than a few are out at once.
        #[test]
        fn a_level_always_holds_a_probe(
            level in 2u32..8,
            gaps in proptest::collection::vec(100u64..200, 1..300),
        ) {
            let cascade = for_tests(8, 50, QueueType::Quorum);
            let ttl = cascade.level_ttl_ms(level);
            let mut watch = LevelWatch::new(8, 1_000, 100);
            let mut inside: Vec<u64> = Vec::new();
            let mut now = 0;
            for gap in gaps {
                // Back at the release stage as soon as they leave the level.
                for &sent in inside.iter().filter(|&&sent| sent + ttl <= now) {
                    watch.came_back(Some(level), sent, ttl);
                }
                inside.retain(|&sent| sent + ttl > now);
                if watch.wants_probe(&cascade, Some(level), now) {
                    watch.sent(Some(level), now);
                    inside.push(now);
                }
                prop_assert!(
                    inside.iter().any(|&sent| sent + ttl > now + gap),
                    "none inside until the tick after {now}"
                );
                prop_assert!(inside.len() <= 4, "{} inside at {now}", inside.len());
                now += gap;
            }
            prop_assert!(watch.newly_stranded(&cascade, now).is_empty());
        }
    }
}
