//! The release side built and wired: every path that releases due tasks
//! (the release stage, the limiter, the staged release), the unroutable
//! watch and the level keepers, each given the one [`DuePublisher`] and
//! only the handles it uses. Nothing runs until the scheduler's
//! `background` starts each under its name.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::broker::Broker;
use super::limit_view::LimitsView;
use super::limiter::Limiter;
use super::publisher::DuePublisher;
use super::stage::ReleaseStage;
use super::staged::StagedRelease;
use super::strands::{LevelKeeper, ShardStrands};
use super::unroutable::UnroutableWatch;
use crate::cascade::Cascade;
use crate::ledger::Ledger;
use crate::metrics::Metrics;

/// What the release side is built from, shared with the scheduler.
pub(crate) struct ReleaseHandles {
    pub broker: Arc<dyn Broker>,
    pub ledger: Ledger,
    pub cascade: Arc<Cascade>,
    pub metrics: Arc<Metrics>,
    /// The release limits as this replica knows them (the API changes them).
    pub limits: LimitsView,
    /// Told when tasks are staged (by the release stage or on admission).
    pub staged_wake: Arc<Notify>,
    /// How overdue a task may be before the ledger's resender publishes it
    /// again (`store.resend_after_ms`); a level keeper takes a stranded
    /// level's tasks over before then.
    pub resend_after: Duration,
}

/// The release side's background work, built, not started.
pub(crate) struct ReleaseSide {
    /// One a shard, with how often each probes its levels; none when
    /// the chain sends no probes (`cascade.level_probe_ms = 0`).
    pub level_keepers: Vec<(LevelKeeper, Duration)>,
    pub unroutable_watch: UnroutableWatch,
    pub limiter: Limiter,
    pub staged_release: StagedRelease,
    pub stage: ReleaseStage,
}

impl ReleaseSide {
    pub fn new(handles: ReleaseHandles) -> ReleaseSide {
        let ReleaseHandles {
            broker,
            ledger,
            cascade,
            metrics,
            limits,
            staged_wake,
            resend_after,
        } = handles;
        let strands = ShardStrands::new(&cascade, &metrics);
        let level_keepers = cascade.level_probe().map_or_else(Vec::new, |every| {
            strands
                .each()
                .map(|shard| {
                    let keeper = LevelKeeper {
                        broker: broker.clone(),
                        ledger: ledger.clone(),
                        cascade: shard.cascade(),
                        metrics: metrics.clone(),
                        strands: shard.clone(),
                        resend_after,
                        resends: strands.resends(),
                    };
                    (keeper, every)
                })
                .collect()
        });
        let publisher = DuePublisher::new(broker.clone(), cascade.clone(), metrics.clone());
        let in_flight = super::in_flight::InFlight::default();
        ReleaseSide {
            level_keepers,
            unroutable_watch: UnroutableWatch {
                broker,
                ledger: ledger.clone(),
                cascade: cascade.clone(),
                metrics: metrics.clone(),
            },
            limiter: Limiter::new(publisher.clone(), ledger.clone(), limits.clone()),
            staged_release: StagedRelease {
                publisher: publisher.clone(),
                ledger: ledger.clone(),
                in_flight: in_flight.clone(),
                limits: limits.clone(),
                strands: strands.clone(),
                wake: staged_wake.clone(),
            },
            stage: ReleaseStage {
                publisher,
                ledger,
                cascade,
                metrics,
                in_flight,
                offsets: Default::default(),
                limits,
                strands,
                staged_wake,
            },
        }
    }
}
