//! Which background work runs, in one place: each is started here under
//! its name (the name a bounded stop reports when it is still running),
//! and all end with the `shutdown` they are given.
//!
//! | work                          | room         | needs, beside a ledger            |
//! |-------------------------------|--------------|-----------------------------------|
//! | the forwarder                 | scheduler    |                                   |
//! | the retention pruner          | scheduler    |                                   |
//! | the lease watch               | scheduler    |                                   |
//! | the forecast's counts         | scheduler    |                                   |
//! | the resender                  | scheduler    | the release stage, resend on      |
//! | the failover resender         | chain        | the release stage, resend on      |
//! | the bulk operations' worker   | scheduler    | the release stage                 |
//! | the schedules' planner        | scheduler    | the release stage                 |
//! | a level keeper (a shard each) | chain        | the release stage, probes on      |
//! | the unroutable watch          | release      | the release stage                 |
//! | the limiter                   | release      | the release stage                 |
//! | the staged release            | release      | the release stage                 |
//! | the release stage             | release      | the release stage                 |
//!
//! The service starts its own (the signal watch, the reloader, the AMQP
//! ingresses and the retry intake) beside these.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::bookkeeper::{self, Bookkeeper};
use super::settings::SchedulerSettings;
use super::{Mode, Scheduler};
use crate::chain::{ShardStrands, level_keepers};
use crate::release::ReleaseSide;
use crate::stop::Named;
use crate::telemetry::TaskTracer;

impl Scheduler {
    /// Starts the background work the table above lists for this mode.
    pub fn spawn_background(&self, shutdown: CancellationToken) -> Vec<Named> {
        let Mode::Ledger(bookkeeper) = &self.inner.mode else {
            return Vec::new();
        };
        let settings = &self.inner.settings;
        let mut work = ledger_upkeep(bookkeeper, settings, &shutdown);
        work.extend(self.spawn_planner(shutdown.clone()));
        if self.inner.cascade.release_stage() {
            let tracer = self.inner.tracer.clone();
            work.extend(release_side(bookkeeper, settings, tracer, shutdown));
        }
        work
    }
}

/// What a ledger needs kept whatever the chain: pending tasks forwarded,
/// old ones pruned, gone leases ended, the forecast's counts folded.
fn ledger_upkeep(
    bookkeeper: &Bookkeeper,
    settings: &SchedulerSettings,
    shutdown: &CancellationToken,
) -> Vec<Named> {
    let ledger = bookkeeper.ledger().clone();
    let metrics = bookkeeper.metrics().clone();
    vec![
        Named::spawn(
            "the forwarder",
            bookkeeper.clone().forward(shutdown.clone()),
        ),
        Named::spawn(
            "the retention pruner",
            bookkeeper::prune(
                ledger.clone(),
                metrics.clone(),
                settings.retention,
                settings.prune_every,
                shutdown.clone(),
            ),
        ),
        Named::spawn(
            "the lease watch",
            bookkeeper::end_gone_leases(ledger.clone(), shutdown.clone()),
        ),
        Named::spawn(
            "the forecast's counts",
            super::due_counts::keep_counts(ledger, metrics, shutdown.clone()),
        ),
    ]
}

/// The resenders, the bulk operations' worker, the cascade's level
/// keepers, and the release room's work (built by [`ReleaseSide`]).
fn release_side(
    bookkeeper: &Bookkeeper,
    settings: &SchedulerSettings,
    tracer: TaskTracer,
    shutdown: CancellationToken,
) -> Vec<Named> {
    let mut work = Vec::new();
    if !settings.resend_after.is_zero() {
        work.push(Named::spawn(
            "the resender",
            bookkeeper
                .clone()
                .resend_unreleased(settings.resend_after, shutdown.clone()),
        ));
        work.push(Named::spawn(
            "the failover resender",
            bookkeeper.failover_resender().run(shutdown.clone()),
        ));
    }
    work.push(Named::spawn(
        "the bulk operations' worker",
        super::bulk_worker::work_operations(bookkeeper.clone(), shutdown.clone()),
    ));
    // The cascade's level keepers hear what reaches the release stage.
    let strands = ShardStrands::new(bookkeeper.cascade(), bookkeeper.metrics());
    let keeping = bookkeeper.keeper_handles(settings.resend_after);
    for (keeper, every) in level_keepers(&strands, &keeping) {
        work.push(Named::spawn(
            "a level keeper",
            keeper.run(every, shutdown.clone()),
        ));
    }
    let side = ReleaseSide::new(bookkeeper.release_handles(Arc::new(strands), tracer));
    work.push(Named::spawn(
        "the unroutable watch",
        side.unroutable_watch.run(shutdown.clone()),
    ));
    work.push(Named::spawn(
        "the limiter",
        side.limiter.run(shutdown.clone()),
    ));
    work.push(Named::spawn(
        "the staged release",
        side.staged_release.run(shutdown.clone()),
    ));
    work.push(Named::spawn("the release stage", side.stage.run(shutdown)));
    work
}
