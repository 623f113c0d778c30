//! Head starts for tasks that fall due together: each task's wait in the levels
//! is planned by this replica's [`LevelLoad`] (the pure rules are in
//! `crate::cascade`'s `spread`), so that a burst passes the levels over
//! the burst window before its instant instead of one level's dead-letter
//! worker at a time at it. The release stage stages what arrives well
//! before its time, and the ledger's staged release lets it go then; what
//! the levels have no room for is staged in the ledger as it is admitted.
//!
//! Each replica counts its own tasks: replicas side by side may each plan
//! a level up to the rate.

use std::sync::{Mutex, PoisonError};

use crate::cascade::{Cascade, LevelLoad, Planned};
use crate::task::Task;

pub(crate) struct Bursts {
    load: Mutex<LevelLoad>,
    /// Tasks a level passes a second, as planned.
    rate: u32,
}

impl Bursts {
    /// `None` where tasks get no leads (`cascade.burst_level_rate = 0`, a
    /// chain that does not hold, or no ledger to stage them in).
    pub fn new(cascade: &Cascade) -> Option<Bursts> {
        let rate = cascade.burst_level_rate();
        let per_unit = u64::from(rate) * cascade.unit_ms() / 1000;
        let window = cascade.burst_window_units();
        (rate > 0 && window > 0).then(|| Bursts {
            rate,
            load: Mutex::new(LevelLoad::new(
                u32::try_from(per_unit.max(1)).unwrap_or(u32::MAX),
                window,
                cascade.levels(),
            )),
        })
    }

    /// How `task` goes when the levels its own route passes are planned
    /// full in the units it would leave them: with a head start through
    /// the levels, or straight into the ledger, staged until its moment
    /// (`None`: its route stands).
    pub fn head_start(&self, cascade: &Cascade, task: &Task, now_ms: u64) -> Option<HeadStart> {
        if !task.route.held || task.route.delay_units == 0 {
            return None;
        }
        let now_unit = now_ms / cascade.unit_ms();
        // What its hold at the release stage absorbs of the levels' lag.
        let slack = u64::from(self.rate) * task.route.hold_ms / 1000;
        let planned = self
            .load
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .plan(
                now_unit,
                task.route.delay_units,
                u32::try_from(slack).unwrap_or(u32::MAX),
            );
        match planned {
            Planned::Levels(wait) if wait == task.route.delay_units => None,
            Planned::Levels(wait) => Some(HeadStart::Levels(Box::new(
                task.with_head_start(cascade, wait),
            ))),
            Planned::Ledger => Some(HeadStart::Ledger),
        }
    }
}

/// How a task of a burst goes instead of its own route: its head start.
/// (A schedule's *lead* is how long before its instant an occurrence is
/// made a task: `crate::recurrence`'s.)
pub(crate) enum HeadStart {
    /// Through the levels with a shorter wait: staged by the release stage
    /// when it arrives, until its moment.
    Levels(Box<Task>),
    /// Into the ledger as it is admitted, staged until its moment: never
    /// published into the chain.
    Ledger,
}
