//! Bursts spread through the levels, as pure logic: which wait in the
//! levels a task takes when many fall due together.
//!
//! Tasks due in the same second share their digits, so without a lead
//! they leave the same levels in the same seconds, and every level has one
//! dead-letter worker (RabbitMQ's, per quorum queue) that passes them one
//! at a time: 100,000 tasks due at one instant took 37 s to come out, one
//! level at a time (BENCHMARKS.md, record 27). The release stage need not
//! get a task one unit before its time: one that arrives well before is
//! staged in the ledger until its moment. So a replica counts, per level
//! and per unit, the tasks it planned to leave each level in that unit
//! (and all levels together: the broker's CPU passes about two levels'
//! worth at once beside taking the burst in and delivering it). A task
//! whose own route has room keeps it, and with it today's precision: one
//! that is not part of a burst always does. One whose route would leave a
//! level in a unit already planned full is part of a burst:
//! - due later than the burst window, it takes a shorter wait if one has
//!   room: the one with the fewest hops (set digits, never more than its
//!   own), the shortest lead first, whose every level has room in the
//!   unit it leaves it, within the window;
//! - otherwise (due within the window, or no shorter wait has room) it
//!   skips the levels altogether ([`Planned::Ledger`]): it is staged in the
//!   ledger as it is admitted, and the ledger's staged release publishes it
//!   at its moment. No hop, no copy in the broker: what the levels cannot
//!   pass in time waits in the ledger, on disk, and the broker's and the
//!   service's memory stay flat however large the burst (a million tasks
//!   due at one instant once overran the levels, which the strand watch
//!   then took for stopped ones: BENCHMARKS.md, "Scale").
//!
//! Only the near future is counted ([`HORIZON_UNITS`]): a task whose
//! levels are left further ahead is routed as it would be alone there.

use std::collections::BTreeMap;

/// How far ahead (in units) the levels' exits are counted.
pub const HORIZON_UNITS: u64 = 4096;

/// How many levels' worth of exits all levels together may be planned to
/// pass in one unit: the broker's hop rate on two cores (about 8,500 a
/// second on 3.10, BENCHMARKS.md) is about three levels' workers at full
/// speed, and it also takes the burst in and delivers it.
pub const LEVELS_AT_ONCE: u32 = 2;

/// How a task of a burst goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Planned {
    /// Through the levels, waiting this many units in them (its own wait,
    /// or a shorter one: a lead).
    Levels(u64),
    /// Straight into the ledger, staged until its moment: the levels have
    /// no room for it in time.
    Ledger,
}

/// The exits a replica planned: per unit, per level, how many tasks leave
/// that level in that unit, and (last) how many leave any.
#[derive(Clone, Debug)]
pub struct LevelLoad {
    /// Tasks a level may be planned to pass in one unit.
    per_unit: u32,
    /// The longest lead, in units.
    window_units: u64,
    levels: u32,
    exits: BTreeMap<u64, Vec<u32>>,
}

/// Each level a task entering at unit `now` with `wait` units passes, and
/// the unit it leaves it: the highest set digit first.
fn exits(now: u64, wait: u64) -> impl Iterator<Item = (u32, u64)> {
    let mut left = now;
    (0..u64::BITS)
        .rev()
        .filter(move |level| wait >> level & 1 == 1)
        .map(move |level| {
            left += 1 << level;
            (level, left)
        })
}

impl LevelLoad {
    /// `per_unit` tasks a level may pass in one unit; leads of at most
    /// `window_units`; a chain of `levels`.
    pub fn new(per_unit: u32, window_units: u64, levels: u32) -> LevelLoad {
        LevelLoad {
            per_unit: per_unit.max(1),
            window_units,
            levels,
            exits: BTreeMap::new(),
        }
    }

    /// How a task entering at unit `now`, whose own route waits `wait`
    /// units, goes (see the module's words); the exits of a wait through
    /// the levels are counted.
    pub fn plan(&mut self, now: u64, wait: u64) -> Planned {
        self.forget_before(now);
        let chosen = if self.has_room(now, wait) {
            Some(wait)
        } else if wait <= self.window_units {
            None
        } else {
            self.shorter(now, wait)
        };
        match chosen {
            Some(chosen) => {
                self.count(now, chosen);
                Planned::Levels(chosen)
            }
            None => Planned::Ledger,
        }
    }

    fn forget_before(&mut self, now: u64) {
        self.exits = self.exits.split_off(&now);
    }

    fn load(&self, level: u32, unit: u64) -> u32 {
        self.exits
            .get(&unit)
            .map_or(0, |levels| levels[level as usize])
    }

    fn total(&self, unit: u64) -> u32 {
        self.load(self.levels, unit)
    }

    fn has_room(&self, now: u64, wait: u64) -> bool {
        exits(now, wait).all(|(level, unit)| {
            unit >= now + HORIZON_UNITS
                || (self.load(level, unit) < self.per_unit
                    && self.total(unit) < self.per_unit.saturating_mul(LEVELS_AT_ONCE))
        })
    }

    /// The waits below `wait` within the window, of at least one unit and
    /// no more hops: the fewest hops first, then the shortest lead.
    fn shorter_waits(&self, wait: u64) -> impl Iterator<Item = u64> {
        let hops = wait.count_ones();
        let lowest = wait.saturating_sub(self.window_units).max(1);
        (1..=hops).flat_map(move |fewest| {
            (lowest..wait)
                .rev()
                .filter(move |shorter| shorter.count_ones() == fewest)
        })
    }

    /// The first of [`LevelLoad::shorter_waits`] with room, if any. A wait
    /// whose first level, where every task of the moment enters together,
    /// is full in the unit it leaves it is skipped with every other wait
    /// through that level first: tasks entering at one moment through one
    /// level leave it together.
    fn shorter(&self, now: u64, wait: u64) -> Option<u64> {
        let first_full = |w: u64| {
            let top = w.ilog2();
            self.load(top, now + (1 << top)) >= self.per_unit
        };
        let mut full_tops = 0u64;
        let mut looked = 0u64;
        for shorter in self.shorter_waits(wait) {
            let top = 1u64 << shorter.ilog2();
            if full_tops & top != 0 {
                continue;
            }
            if looked & top == 0 {
                looked |= top;
                if first_full(shorter) {
                    full_tops |= top;
                    continue;
                }
            }
            if self.has_room(now, shorter) {
                return Some(shorter);
            }
        }
        None
    }

    fn count(&mut self, now: u64, wait: u64) {
        for (level, unit) in exits(now, wait) {
            if unit < now + HORIZON_UNITS && level < self.levels {
                let levels = self
                    .exits
                    .entry(unit)
                    .or_insert_with(|| vec![0; self.levels as usize + 1]);
                levels[level as usize] = levels[level as usize].saturating_add(1);
                let total = self.levels as usize;
                levels[total] = levels[total].saturating_add(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_task_leaves_its_levels_highest_digit_first() {
        let left: Vec<(u32, u64)> = exits(100, 0b1011).collect();
        assert_eq!(left, vec![(3, 108), (1, 110), (0, 111)]);
        assert_eq!(exits(5, 0).count(), 0);
    }

    use Planned::{Ledger, Levels};

    #[test]
    fn a_burst_due_within_the_window_skips_the_levels() {
        let mut load = LevelLoad::new(2, 120, 29);
        assert_eq!(load.plan(0, 58), Levels(58));
        assert_eq!(load.plan(0, 58), Levels(58));
        assert_eq!(load.plan(0, 58), Ledger);
        assert_eq!(load.plan(0, 121), Levels(121));
        assert_eq!(load.plan(0, 121), Levels(121));
        assert_ne!(
            load.plan(0, 121),
            Ledger,
            "due beyond the window: through the levels"
        );
    }

    #[test]
    fn tasks_alone_keep_their_route_and_a_burst_spreads_with_no_more_hops() {
        let mut load = LevelLoad::new(2, 50, 29);
        assert_eq!(load.plan(0, 58), Levels(58));
        assert_eq!(load.plan(0, 58), Levels(58));
        // 58 (`111010`) is full, and so is level 5 at unit 32, which 58
        // left it at: one hop through level 4 (16), then level 3 (8), …
        assert_eq!(load.plan(0, 58), Levels(16));
        assert_eq!(load.plan(0, 58), Levels(16));
        assert_eq!(load.plan(0, 58), Levels(8));
        // A second later, 58 has room again.
        assert_eq!(load.plan(1, 58), Levels(58));
    }

    #[test]
    fn with_no_room_in_the_window_a_task_waits_in_the_ledger() {
        let mut load = LevelLoad::new(1, 2, 29);
        assert_eq!(load.plan(0, 4), Levels(4));
        // 3 has two hops, 2 one: 2 (level 1, left at 2).
        assert_eq!(load.plan(0, 4), Levels(2));
        // 3 has more hops than 4, 2 is full, and so is 4: the ledger, and
        // nothing counted in the levels.
        assert_eq!(load.plan(0, 4), Ledger);
        assert_eq!(load.exits[&4][2], 1);
        // A unit later, the levels have room again.
        assert_eq!(load.plan(1, 4), Levels(4));
    }

    proptest! {
        #[test]
        fn a_plan_never_waits_longer_nor_takes_more_hops_nor_leads_past_the_window(
            per_unit in 1u32..5,
            window in 2u64..200,
            tasks in proptest::collection::vec((0u64..20, 1u64..5_000), 1..200),
        ) {
            let mut load = LevelLoad::new(per_unit, window, 29);
            let mut now = 0;
            for (step, wait) in tasks {
                now += step / 10;
                let Planned::Levels(chosen) = load.plan(now, wait) else {
                    continue;
                };
                prop_assert!(chosen <= wait);
                prop_assert!(chosen >= 1, "a wait through the levels is at least a unit");
                prop_assert!(chosen.count_ones() <= wait.count_ones());
                prop_assert!(wait - chosen <= window);
            }
        }

        #[test]
        fn no_level_is_ever_planned_past_its_rate(
            per_unit in 1u32..4,
            waits in proptest::collection::vec(1u64..300, 1..300),
        ) {
            let mut load = LevelLoad::new(per_unit, 100, 29);
            for wait in waits {
                let load_had_own_room = load.has_room(0, wait);
                let had_room = load_had_own_room
                    || load.shorter_waits(wait).any(|w| load.has_room(0, w));
                let planned = load.plan(0, wait);
                let chosen = match planned {
                    Planned::Levels(chosen) => chosen,
                    Planned::Ledger => 0,
                };
                // Through the levels, never past their rate; the ledger only
                // where they had no room (within the window, a wait of its own).
                let over = exits(0, chosen).any(|(l, u)| {
                    load.load(l, u) > per_unit || load.total(u) > per_unit * LEVELS_AT_ONCE
                });
                prop_assert!(!over, "{wait} planned as {planned:?}");
                prop_assert!(
                    planned == Planned::Levels(wait) || !load_had_own_room,
                    "a task whose own route had room keeps it"
                );
                prop_assert!(planned != Planned::Ledger || !had_room || wait <= 100);
            }
        }
    }
}
