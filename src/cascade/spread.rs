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
//! worth at once beside taking the burst in and delivering it). Tasks that
//! entered a level together leave it together, and its worker passes them
//! one after another: a task comes out of a level as late as the tasks
//! planned to leave it in the same unit make it, and over its hops that
//! lag adds up. What absorbs it is the task's *slack*: how long before its
//! moment its route brings it to the release stage (its hold there, the
//! release lead or more; a round delay rounded down to keep its few hops
//! has only its remainder), plus any lead it is given. So a route has room
//! only when the tasks ahead of it, summed over its exits, pass within
//! that slack at the planned rate: 448 tasks of 64 s and a remainder under
//! a second, one hop through level 6 together, once reached the stage up to
//! 1.9 s after their moments. A task whose own route has room keeps it,
//! and with it today's precision: a task alone always has room, so one
//! that is not part of a burst always does. One whose route has no room
//! is part of a burst:
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
    /// units and brings it to the release stage with a slack of `slack`
    /// tasks (its hold there at the planned rate), goes (see the module's
    /// words); the exits of a wait through the levels are counted.
    pub fn plan(&mut self, now: u64, wait: u64, slack: u32) -> Planned {
        self.forget_before(now);
        let chosen = if self.has_room(now, wait, u64::from(slack)) {
            Some(wait)
        } else if wait <= self.window_units {
            None
        } else {
            self.shorter(now, wait, slack)
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

    /// Whether a route entering at `now` and waiting `wait` has room: each
    /// level and the levels together have room in every unit it leaves one,
    /// and the tasks ahead of it at its exits, summed, are at most `slack`.
    fn has_room(&self, now: u64, wait: u64, slack: u64) -> bool {
        let mut ahead = 0u64;
        for (level, unit) in exits(now, wait) {
            if unit >= now + HORIZON_UNITS {
                continue;
            }
            let level_load = self.load(level, unit);
            if level_load >= self.per_unit
                || self.total(unit) >= self.per_unit.saturating_mul(LEVELS_AT_ONCE)
            {
                return false;
            }
            ahead += u64::from(level_load);
        }
        ahead <= slack
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
    fn shorter(&self, now: u64, wait: u64, slack: u32) -> Option<u64> {
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
            // Its lead, `wait - shorter` units, adds to its slack.
            let lead = (wait - shorter).saturating_mul(u64::from(self.per_unit));
            if self.has_room(now, shorter, u64::from(slack).saturating_add(lead)) {
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
        assert_eq!(load.plan(0, 58, 100), Levels(58));
        assert_eq!(load.plan(0, 58, 100), Levels(58));
        assert_eq!(load.plan(0, 58, 100), Ledger);
        assert_eq!(load.plan(0, 121, 100), Levels(121));
        assert_eq!(load.plan(0, 121, 100), Levels(121));
        assert_ne!(
            load.plan(0, 121, 100),
            Ledger,
            "due beyond the window: through the levels"
        );
    }

    #[test]
    fn a_route_has_room_while_the_tasks_ahead_of_it_fit_its_slack() {
        let mut load = LevelLoad::new(100, 200, 29);
        // One hop (level 2, left at unit 4), a slack of 3: four tasks.
        for _ in 0..4 {
            assert_eq!(load.plan(0, 4, 3), Levels(4));
        }
        assert_eq!(load.plan(0, 4, 3), Ledger);
        // Two hops (levels 1 and 0): the third would have two ahead of it
        // at each exit, four in all.
        assert_eq!(load.plan(0, 3, 3), Levels(3));
        assert_eq!(load.plan(0, 3, 3), Levels(3));
        assert_eq!(load.plan(0, 3, 3), Ledger);
        // With no slack (a round delay's remainder of nothing), a task alone
        // keeps its route, and a second behind it does not.
        assert_eq!(load.plan(1, 4, 0), Levels(4));
        assert_eq!(load.plan(1, 4, 0), Ledger);
    }

    #[test]
    fn a_lead_adds_to_a_tasks_slack() {
        let mut load = LevelLoad::new(100, 50, 29);
        assert_eq!(load.plan(0, 58, 0), Levels(58));
        // Four ahead of it on its own route; 32 reaches the stage 26 units
        // early, time for 2,600 to pass ahead of it.
        assert_eq!(load.plan(0, 58, 0), Levels(32));
    }

    #[test]
    fn tasks_alone_keep_their_route_and_a_burst_spreads_with_no_more_hops() {
        let mut load = LevelLoad::new(2, 50, 29);
        assert_eq!(load.plan(0, 58, 100), Levels(58));
        assert_eq!(load.plan(0, 58, 100), Levels(58));
        // 58 (`111010`) is full, and so is level 5 at unit 32, which 58
        // left it at: one hop through level 4 (16), then level 3 (8), …
        assert_eq!(load.plan(0, 58, 100), Levels(16));
        assert_eq!(load.plan(0, 58, 100), Levels(16));
        assert_eq!(load.plan(0, 58, 100), Levels(8));
        // A second later, 58 has room again.
        assert_eq!(load.plan(1, 58, 100), Levels(58));
    }

    #[test]
    fn with_no_room_in_the_window_a_task_waits_in_the_ledger() {
        let mut load = LevelLoad::new(1, 2, 29);
        assert_eq!(load.plan(0, 4, 100), Levels(4));
        // 3 has two hops, 2 one: 2 (level 1, left at 2).
        assert_eq!(load.plan(0, 4, 100), Levels(2));
        // 3 has more hops than 4, 2 is full, and so is 4: the ledger, and
        // nothing counted in the levels.
        assert_eq!(load.plan(0, 4, 100), Ledger);
        assert_eq!(load.exits[&4][2], 1);
        // A unit later, the levels have room again.
        assert_eq!(load.plan(1, 4, 100), Levels(4));
    }

    proptest! {
        #[test]
        fn a_plan_never_waits_longer_nor_takes_more_hops_nor_leads_past_the_window(
            per_unit in 1u32..5,
            window in 2u64..200,
            tasks in proptest::collection::vec((0u64..20, 1u64..5_000, 0u32..20), 1..200),
        ) {
            let mut load = LevelLoad::new(per_unit, window, 29);
            let mut now = 0;
            for (step, wait, slack) in tasks {
                now += step / 10;
                let Planned::Levels(chosen) = load.plan(now, wait, slack) else {
                    continue;
                };
                prop_assert!(chosen <= wait);
                prop_assert!(chosen >= 1, "a wait through the levels is at least a unit");
                prop_assert!(chosen.count_ones() <= wait.count_ones());
                prop_assert!(wait - chosen <= window);
            }
        }

        #[test]
        fn no_level_is_ever_planned_past_its_rate_nor_a_route_past_its_slack(
            per_unit in 1u32..4,
            waits in proptest::collection::vec((1u64..300, 0u32..12), 1..300),
        ) {
            let mut load = LevelLoad::new(per_unit, 100, 29);
            for (wait, slack) in waits {
                let with_lead = |w: u64| u64::from(slack) + (wait - w) * u64::from(per_unit);
                let load_had_own_room = load.has_room(0, wait, u64::from(slack));
                let had_room = load_had_own_room
                    || load.shorter_waits(wait).any(|w| load.has_room(0, w, with_lead(w)));
                let planned = load.plan(0, wait, slack);
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
                // Counted now, the task itself is at each of its exits.
                let ahead: u64 = exits(0, chosen).map(|(l, u)| u64::from(load.load(l, u))).sum();
                prop_assert!(
                    chosen == 0 || ahead <= with_lead(chosen) + u64::from(chosen.count_ones()),
                    "{wait} planned as {planned:?} behind {ahead}"
                );
                prop_assert!(
                    planned == Planned::Levels(wait) || !load_had_own_room,
                    "a task whose own route had room keeps it"
                );
                prop_assert!(planned != Planned::Ledger || !had_room || wait <= 100);
            }
        }
    }
}
