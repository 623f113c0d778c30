//! Release limits at work: the release stage hands a due task a limit
//! matches to the ledger (`waiting`), and the limiter releases what waits,
//! in due order, as the limits allow.
//!
//! Why the ledger and not the broker: a task that waits in the release
//! queue unacknowledged takes a place of the stage's prefetch (and of
//! `hold_limit`), so 100,000 tasks paused on one destination would stop
//! every other destination's releases. Acknowledged and kept in the ledger
//! (which holds its whole payload until delivery anyway), a waiting task
//! costs one row and an index entry, the release queue goes on, and the
//! ledger can count, cancel and move it like any other.
//!
//! A task that is already due when the release stage claims it, and that
//! its limits would let go at once (open, a token left, nothing waiting
//! before it), takes its tokens in the claim's transaction and is released
//! by the stage like any other (`ledger::claim::hold_claimed`): below its
//! rate a paced destination's tasks make one trip through the ledger, not
//! two (the second trip had kept a 5,000/s limit fed by the cascade at 0.6
//! of its rate on two cores; what remained was the cascade's own feed,
//! BENCHMARKS.md records 25 and 27). A claim made ahead of its tasks' time
//! (a held chain) spends no tokens early: its tasks wait.
//!
//! Every replica runs a limiter; their passes take turns on the limits'
//! rows ([`crate::ledger`]), so a rate is a rate over all of them. A pass
//! runs in the ledger writer's group commit, with the release stage's
//! claims and holds, not beside them.
//! A limit's queue depth is read every [`DEPTH_EVERY`] by each replica.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::limit_view::LimitsView;
use super::publisher::{DuePublisher, Released};
use super::record::{LedgerReleases, PutBack};
use crate::clock;
use crate::ledger::{Ledger, PassInput, StoredTask};
use crate::limit::{Depth, waiting_per_limit};
use crate::metrics::LimitLabel;

/// Pause between passes while tasks wait: at most 100 passes a second
/// (see [`crate::limit::PASSES_PER_SEC`]).
const PASS_EVERY: Duration = Duration::from_millis(10);
/// How often the limits and the waiting tasks' destinations are read again
/// from the ledger (other replicas change them too).
const REFRESH_EVERY: Duration = Duration::from_millis(250);
/// How often each limit's consumer queue depth is read.
pub const DEPTH_EVERY: Duration = Duration::from_secs(1);
/// Most tasks one pass releases.
const PASS_MOST: usize = 1000;
/// A released task not marked delivered by then waits again (its replica
/// stopped); a publish still unconfirmed after [`PUBLISH_LIMIT`] is given
/// up first, so a lease runs out only on a replica that stopped.
const LEASE: Duration = Duration::from_secs(30);
const PUBLISH_LIMIT: Duration = Duration::from_secs(20);

/// Waits for a recording to end (what it did not write, the leases return).
async fn finish(recording: Option<JoinHandle<()>>) {
    if let Some(handle) = recording
        && let Err(error) = handle.await
    {
        warn!(%error, "a limiter's ledger writes stopped abnormally");
    }
}

/// The limiter of one replica.
pub(crate) struct Limiter {
    publisher: DuePublisher,
    ledger: Ledger,
    view: LimitsView,
}

impl Limiter {
    pub(super) fn new(publisher: DuePublisher, ledger: Ledger, view: LimitsView) -> Limiter {
        Limiter {
            publisher,
            ledger,
            view,
        }
    }

    /// Passes over what waits until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut refreshed_at = None;
        let mut depths_at = None;
        // The last pass's ledger writes, run beside the next pass.
        let mut recording: Option<JoinHandle<()>> = None;
        loop {
            let mono = tokio::time::Instant::now();
            if refreshed_at.is_none_or(|at| mono.duration_since(at) >= REFRESH_EVERY) {
                self.refresh().await;
                refreshed_at = Some(mono);
            }
            if depths_at.is_none_or(|at| mono.duration_since(at) >= DEPTH_EVERY) {
                self.read_depths().await;
                depths_at = Some(mono);
            }
            let now_ms = clock::now_ms();
            let released = if self.view.worth_a_pass(now_ms) {
                let (released, record) = self.pass(now_ms).await;
                // One recording at a time: a ledger that falls behind slows
                // the passes instead of piling up writes.
                finish(recording.take()).await;
                recording = record.map(tokio::spawn);
                released
            } else {
                0
            };
            let pause = match released {
                n if n >= PASS_MOST => Duration::ZERO,
                _ if self.view.read().destinations.is_empty() => REFRESH_EVERY,
                _ => PASS_EVERY,
            };
            tokio::select! {
                () = shutdown.cancelled() => return finish(recording).await,
                () = tokio::time::sleep(pause) => {}
                () = self.view.wake.notified() => {}
            }
        }
    }

    /// Reads the limits and the destinations that wait again, after
    /// putting back to wait what a stopped replica released and never
    /// marked delivered.
    async fn refresh(&self) {
        let ledger = &self.ledger;
        match ledger.return_expired_leases(clock::now_ms()).await {
            Ok(0) => {}
            Ok(returned) => warn!(
                tasks = returned,
                "tasks a limiter released were not marked delivered within their lease (a \
                 replica stopped): they wait again"
            ),
            Err(error) => warn!(%error, "cannot look for released tasks whose lease ran out"),
        }
        self.expire_waiting().await;
        let (limits, waiting) = tokio::join!(ledger.limits(), ledger.waiting_per_destination());
        let (limits, waiting) = match (limits, waiting) {
            (Ok(limits), Ok(waiting)) => (limits, waiting),
            (Err(error), _) | (_, Err(error)) => {
                warn!(%error, "cannot read release limits; the last read stand");
                return;
            }
        };
        let metrics = &self.publisher.metrics;
        let plain: Vec<_> = limits.iter().map(|l| l.limit.clone()).collect();
        for (name, (count, _)) in waiting_per_limit(&plain, &waiting) {
            metrics
                .limit_waiting
                .get_or_create(&LimitLabel { limit: name })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        let mut view = self.view.write();
        view.limits = limits;
        view.destinations = waiting.into_iter().map(|(d, _, _)| d).collect();
        view.record(clock::now_ms());
    }

    /// Waiting tasks whose deadline passed (their limit paused, or its
    /// backlog too long) expire where they wait: never released after it.
    /// Those whose message goes to an expired destination are taken, as a
    /// pass's are, and their message sent there.
    async fn expire_waiting(&self) {
        let now_ms = clock::now_ms();
        match self.ledger.any_waiting_past_deadline(now_ms).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                warn!(%error, "cannot look for waiting tasks past their deadline");
                return;
            }
        }
        let lease_until_ms = now_ms + LEASE.as_millis() as u64;
        let most = u32::try_from(PASS_MOST).unwrap_or(u32::MAX);
        let taken = self
            .ledger
            .take_waiting_past_deadline(now_ms, lease_until_ms, most)
            .await;
        match taken {
            Ok(taken) if !taken.is_empty() => self.publish(taken).await.await,
            Ok(_) => {}
            Err(error) => warn!(%error, "cannot take waiting tasks past their deadline"),
        }
        match self.ledger.expire_waiting(now_ms).await {
            Ok(limits) if limits.is_empty() => {}
            Ok(limits) => {
                let tasks = limits.len() as u64;
                self.publisher.metrics.expired("waiting", tasks);
                info!(
                    tasks,
                    "waiting tasks expired: their deadline passed before their release limit let \
                     them go"
                );
            }
            Err(error) => warn!(%error, "cannot expire waiting tasks past their deadline"),
        }
    }

    /// Reads each bounded queue's depth.
    async fn read_depths(&self) {
        let queues: Vec<String> = {
            let view = self.view.read();
            let mut queues: Vec<String> = view
                .limits
                .iter()
                .filter_map(|l| l.limit.depth.as_ref().map(|d| d.queue.clone()))
                .collect();
            queues.sort();
            queues.dedup();
            queues
        };
        let broker = &self.publisher.broker;
        let read = join_all(queues.iter().map(|queue| broker.queue_depth(queue))).await;
        let mut depths = HashMap::new();
        for (queue, depth) in queues.into_iter().zip(read) {
            match depth {
                Ok(Some(ready)) => {
                    depths.insert(queue, Depth::Ready(ready));
                }
                Ok(None) => {
                    depths.insert(queue, Depth::Missing);
                }
                // Unknown: the limit holds until it is read.
                Err(error) => warn!(%error, queue, "cannot read a limit's queue depth"),
            }
        }
        let mut view = self.view.write();
        view.depths = depths;
        view.released_since_read.clear();
    }

    /// One pass: how many it released and published, and the ledger
    /// writes that record what became of them.
    async fn pass(
        &self,
        now_ms: u64,
    ) -> (usize, Option<impl Future<Output = ()> + Send + 'static>) {
        // Each read of the view in a statement of its own: a read guard
        // alive while `caps` reads again would deadlock behind a writer.
        let destinations = self.view.read().destinations.clone();
        let caps = self.view.caps(now_ms);
        let input = PassInput {
            now_ms,
            lease_until_ms: now_ms + LEASE.as_millis() as u64,
            destinations,
            caps,
            most: PASS_MOST,
        };
        let pass = match self.ledger.limiter_pass(input).await {
            Ok(pass) => pass,
            Err(error) => {
                warn!(%error, "cannot release waiting tasks; trying again");
                return (0, None);
            }
        };
        self.view.write().limits = pass.limits;
        self.view.drained(&pass.drained);
        self.view.count_released(&pass.released);
        let count = pass.released.len();
        // Published before the next pass: planning the next while these are
        // confirmed started the release sooner after an outage but drained
        // it at half the rate on two cores (BENCHMARKS.md, issue 41). Their
        // marks need not wait: a released task is `releasing` under its
        // lease, which no pass takes.
        let record = self.publish(pass.released).await;
        (count, (count > 0).then_some(record))
    }

    /// Publishes released tasks, each to where it is delivered; the ledger
    /// writes that record what became of them.
    async fn publish(
        &self,
        released: Vec<StoredTask>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let outcomes = join_all(released.iter().map(|stored| async {
            // Read just before the publish: never published after its deadline.
            let now_ms = clock::now_ms();
            match self
                .publisher
                .release_stored(stored, now_ms, PUBLISH_LIMIT, true)
                .await
            {
                Ok(outcome) => Some((outcome, clock::now_ms())),
                Err(reason) => {
                    warn!(
                        task_id = stored.id,
                        reason, "a waiting task cannot be released"
                    );
                    None
                }
            }
        }))
        .await;
        let mut releases = LedgerReleases::default();
        for (stored, outcome) in released.iter().zip(outcomes) {
            if let Some((outcome, at_ms)) = outcome
                && let Some(released) = releases.note(stored, outcome, at_ms)
            {
                self.observe(stored, released, at_ms);
            }
        }
        releases.record(
            self.ledger.clone(),
            PutBack::Wait,
            self.publisher.metrics.clone(),
        )
    }

    fn observe(&self, stored: &StoredTask, outcome: Released, at_ms: u64) {
        let metrics = &self.publisher.metrics;
        let lateness_ms = at_ms.saturating_sub(stored.deliver_at_ms);
        if outcome == Released::Delivered {
            metrics.delivered(at_ms, lateness_ms);
            metrics.tasks_delivered.inc();
        }
        metrics.limit_waited.observe(lateness_ms as f64 / 1000.0);
        for limit in self
            .view
            .read()
            .limits
            .iter()
            .filter(|l| l.limit.matches(&stored.destination))
        {
            metrics
                .limit_released
                .get_or_create(&LimitLabel {
                    limit: limit.limit.name.clone(),
                })
                .inc();
        }
    }
}
