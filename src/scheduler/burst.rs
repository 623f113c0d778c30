//! Leads for tasks that fall due together: each task's wait in the levels
//! is planned by this replica's [`LevelLoad`] (the pure rules are in
//! `crate::cascade`'s `spread`), so that a burst passes the levels over
//! the burst window before its instant instead of one level's dead-letter
//! worker at a time at it. The release stage stages what arrives well
//! before its time, and the ledger's staged release lets it go then.
//!
//! Each replica counts its own tasks: replicas side by side may each plan
//! a level up to the rate.

use std::sync::{Mutex, PoisonError};

use crate::cascade::{Cascade, LevelLoad};
use crate::task::Task;

pub(super) struct Bursts {
    load: Mutex<LevelLoad>,
}

impl Bursts {
    /// `None` where tasks get no leads (`cascade.burst_level_rate = 0`, a
    /// chain that does not hold, or no ledger to stage them in).
    pub fn new(cascade: &Cascade) -> Option<Bursts> {
        let rate = cascade.burst_level_rate();
        let per_unit = u64::from(rate) * cascade.unit_ms() / 1000;
        let window = cascade.burst_window_units();
        (rate > 0 && window > 0).then(|| Bursts {
            load: Mutex::new(LevelLoad::new(
                u32::try_from(per_unit.max(1)).unwrap_or(u32::MAX),
                window,
                cascade.levels(),
            )),
        })
    }

    /// `task`, given a lead if the levels its own route passes are planned
    /// full in the units it would leave them (`None`: its route stands).
    pub fn lead(&self, cascade: &Cascade, task: &Task, now_ms: u64) -> Option<Task> {
        if !task.route.held || task.route.delay_units == 0 {
            return None;
        }
        let now_unit = now_ms / cascade.unit_ms();
        let wait = self
            .load
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .plan(now_unit, task.route.delay_units);
        if wait == task.route.delay_units {
            return None;
        }
        let route = cascade.with_wait(&task.route, wait, &task.destination);
        Some(Task {
            route: cascade.in_task_shard(route, &task.id),
            ..task.clone()
        })
    }
}
