//! The release side built and wired: every path that releases due tasks
//! (the release stage, the limiter, the staged release) and the unroutable
//! watch, each given the one [`DuePublisher`] and only the handles it
//! uses. Nothing runs until the scheduler's `background` starts each under
//! its name.

use std::sync::Arc;

use tokio::sync::Notify;

use super::broker::Broker;
use super::limit_view::LimitsView;
use super::limiter::Limiter;
use super::publisher::DuePublisher;
use super::stage::ReleaseStage;
use super::staged::StagedRelease;
use super::unroutable::UnroutableWatch;
use super::watch::ArrivalWatch;
use crate::cascade::Cascade;
use crate::ledger::Ledger;
use crate::metrics::Metrics;
use crate::telemetry::TaskTracer;

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
    /// What the way of delaying learns from what arrives.
    pub watch: Arc<dyn ArrivalWatch>,
    /// Where the spans of the releases go.
    pub tracer: TaskTracer,
}

/// The release side's background work, built, not started.
pub(crate) struct ReleaseSide {
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
            watch,
            tracer,
        } = handles;
        let publisher =
            DuePublisher::new(broker.clone(), cascade.clone(), metrics.clone()).traced(tracer);
        let in_flight = super::in_flight::InFlight::default();
        ReleaseSide {
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
                watch: watch.clone(),
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
                watch,
                staged_wake,
            },
        }
    }
}
