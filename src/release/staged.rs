//! The staged release: tasks the release stage staged in the ledger well
//! before their time ([`crate::ledger`]'s `staged`) are taken back from it
//! near their moment and published then, in release order.
//!
//! Every replica runs one; a take is one statement in the ledger writer's
//! group (on PostgreSQL, replicas skip what another took), under a lease
//! like the limiter's: a replica that dies before marking its take
//! delivered leaves it to be staged again when the lease runs out, and
//! released by whoever takes it then. A take is at most [`PAGE`] tasks and
//! at most [`PAGES_OUT`] are out at once, so memory does not grow with the
//! burst. Each task waits for its own moment by this replica's wall clock
//! (its moment is its due time, or later where the staging replica's clock
//! said so), is published on the publish channels for due tasks, and is
//! marked delivered at its confirm's time, in groups. A task whose
//! destination a release limit holds at its moment waits for that limit
//! instead, as a due task the release stage claims does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::in_flight::InFlight;
use super::limit_view::LimitsView;
use super::publisher::{DuePublisher, Outcome, Released};
use super::record::{LedgerReleases, PutBack};
use super::stage::CLAIM_AHEAD;
use super::watch::ArrivalWatch;
use crate::clock;
use crate::ledger::{Ledger, StoredTask, UnstageInput};

/// Most staged tasks one take releases.
pub const PAGE: u32 = 1000;
/// Takes being released at once: while some publish, others are taken or
/// marked delivered (each a commit). With three, a burst's release kept
/// 1.77–1.83 of two cores busy against its ceiling's 1.84–1.95; with five,
/// 1.83–1.89; eight kept no more busy (bench record 59).
pub const PAGES_OUT: usize = 5;
/// How long the release sleeps at most before it looks again (another
/// replica may have staged an earlier task meanwhile).
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// A take not marked delivered by then is staged again (its replica
/// stopped) and released by whoever takes it next: a burst's tail is late
/// by at most this after a crash. A publish still unconfirmed after
/// [`PUBLISH_LIMIT`] is given up first (and staged again), so a lease runs
/// out only on a replica that stopped.
const LEASE: Duration = Duration::from_secs(10);
/// How long after its moment a task another process staged may be taken:
/// that process's wall clock may be behind this one's (it alone compared
/// its moment with the stamp's bound on the sender's clock), so this
/// replica never releases another's task early unless their hosts' clocks
/// disagree by more than this. A replica that staged a task and died (or
/// was restarted, a new process) leaves it this late.
pub const OTHERS_AFTER: Duration = Duration::from_secs(10);
const PUBLISH_LIMIT: Duration = Duration::from_secs(8);

fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The staged release of one replica.
#[derive(Clone)]
pub(crate) struct StagedRelease {
    pub(super) publisher: DuePublisher,
    pub(super) ledger: Ledger,
    pub(super) in_flight: InFlight,
    pub(super) limits: LimitsView,
    pub(super) watch: Arc<dyn ArrivalWatch>,
    /// Told when the release stage stages tasks.
    pub(super) wake: Arc<tokio::sync::Notify>,
}

/// What became of a taken task's publish.
enum Publish {
    /// Published, refused, or expired, with when the answer came.
    Done(Outcome, u64),
    /// Not published: the replica stops.
    Stopped,
    /// Its row can never be published (it stays taken, its lease runs out).
    Never,
}

impl StagedRelease {
    /// Releases staged tasks at their moments until `shutdown`; what is
    /// taken then and not yet published is staged again at once.
    pub async fn run(self, shutdown: CancellationToken) {
        let pages = Arc::new(Semaphore::new(PAGES_OUT));
        let mut out = JoinSet::new();
        let mut leases_looked_at: Option<tokio::time::Instant> = None;
        while !shutdown.is_cancelled() {
            let mono = tokio::time::Instant::now();
            if leases_looked_at.is_none_or(|at| mono.duration_since(at) >= LOOK_EVERY) {
                self.return_expired().await;
                leases_looked_at = Some(mono);
            }
            while out.try_join_next().is_some() {}
            let pause = match self.wait_for_next().await {
                Some(Duration::ZERO) => {
                    let permit = tokio::select! {
                        () = shutdown.cancelled() => break,
                        permit = pages.clone().acquire_owned() => permit,
                    };
                    let Ok(permit) = permit else { break };
                    match self.take().await {
                        Some(tasks) if !tasks.is_empty() => {
                            let release = self.clone().release(tasks, permit, shutdown.clone());
                            out.spawn(release);
                            continue;
                        }
                        // Another replica took them, or the ledger failed.
                        _ => Duration::from_millis(50),
                    }
                }
                Some(wait) => wait.min(LOOK_EVERY),
                None => LOOK_EVERY,
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(pause) => {}
                () = self.wake.notified() => {}
            }
        }
        while out.join_next().await.is_some() {}
    }

    /// How long until the earliest staged task is to be taken
    /// ([`CLAIM_AHEAD`] before its moment); `None` when nothing is staged
    /// (or the ledger cannot say).
    async fn wait_for_next(&self) -> Option<Duration> {
        let own = clock::source();
        match self.ledger.next_staged_ms(own, ms(OTHERS_AFTER)).await {
            Ok(next) => {
                let take_at_ms = next?.saturating_sub(ms(CLAIM_AHEAD));
                let now_ms = clock::now_ms();
                Some(Duration::from_millis(take_at_ms.saturating_sub(now_ms)))
            }
            Err(error) => {
                warn!(%error, "cannot read when the next staged task is due");
                None
            }
        }
    }

    /// Takes up to a page of staged tasks due within [`CLAIM_AHEAD`].
    async fn take(&self) -> Option<Vec<StoredTask>> {
        let now_ms = clock::now_ms();
        let input = UnstageInput {
            by_ms: now_ms + ms(CLAIM_AHEAD),
            others_by_ms: (now_ms + ms(CLAIM_AHEAD)).saturating_sub(ms(OTHERS_AFTER)),
            own: clock::source(),
            lease_until_ms: now_ms + ms(LEASE),
            most: PAGE,
        };
        match self.ledger.unstage(input).await {
            Ok(tasks) => Some(tasks),
            Err(error) => {
                warn!(%error, "cannot take staged tasks from the ledger; trying again");
                None
            }
        }
    }

    async fn return_expired(&self) {
        match self.ledger.return_expired_stages(clock::now_ms()).await {
            Ok(0) => {}
            Ok(returned) => warn!(
                tasks = returned,
                "staged tasks taken for release were not marked delivered within their lease \
                 (a replica stopped): staged again, released at once"
            ),
            Err(error) => warn!(%error, "cannot look for staged tasks whose lease ran out"),
        }
    }

    /// One take: those a release limit holds wait for it; the others are
    /// published each at its moment, then marked delivered (or staged
    /// again).
    async fn release(
        self,
        tasks: Vec<StoredTask>,
        _permit: OwnedSemaphorePermit,
        shutdown: CancellationToken,
    ) {
        self.watch.burst_seen(tasks.len());
        let tasks = self.hold_limited(tasks).await;
        // In flight, as the cascade's windows are, until recorded: a copy of
        // one of these that comes down the cascade meanwhile (a resend after
        // a crash) waits to be judged a duplicate instead of being claimed
        // from `releasing` and delivered too. One a window holds a copy of
        // now is staged again at once: the window finds it taken, drops its
        // copy, and leaves it to the next take (left taken, it waited out
        // its lease: 10 s late after a restart).
        let mut releasing = self.in_flight.window();
        let mut releases = LedgerReleases::default();
        let mut ours = Vec::with_capacity(tasks.len());
        for task in tasks {
            if releasing.enter(Some(&(task.id.clone(), task.revision))) {
                ours.push(task);
            } else {
                releases.again(task.id);
            }
        }
        let published = join_all(ours.into_iter().map(|task| async {
            let outcome = self.publish_at(&task, &shutdown).await;
            (task, outcome)
        }))
        .await;
        for (task, outcome) in published {
            match outcome {
                Publish::Done(outcome, at_ms) => {
                    if let Some(released) = releases.note(&task, outcome, at_ms) {
                        self.observe(&task, released, at_ms);
                    }
                }
                Publish::Stopped => releases.again(task.id),
                Publish::Never => {}
            }
        }
        releases
            .record(
                self.ledger.clone(),
                PutBack::Stage,
                self.publisher.metrics.clone(),
            )
            .await;
        drop(releasing);
    }

    /// The tasks of a take no release limit holds now; the others wait for
    /// their limits in the ledger.
    async fn hold_limited(&self, tasks: Vec<StoredTask>) -> Vec<StoredTask> {
        let limits = &self.limits;
        let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut free = Vec::with_capacity(tasks.len());
        for task in tasks {
            match limits.limit_for(&task.destination) {
                Some(limit) => {
                    limits.now_waiting(&task.destination);
                    held.entry(limit).or_default().push(task.id);
                }
                None => free.push(task),
            }
        }
        for (limit, ids) in held {
            if let Err(error) = self.ledger.wait_unstaged(&ids, &limit).await {
                warn!(%error, limit, "staged tasks a limit holds stay taken until their lease runs out");
            }
        }
        free
    }

    /// Publishes `task` at its moment by this replica's wall clock (or,
    /// past its deadline then, expires it), and says when its confirm
    /// came.
    async fn publish_at(&self, task: &StoredTask, shutdown: &CancellationToken) -> Publish {
        let moment_ms = task.release_at_ms.unwrap_or(task.deliver_at_ms);
        loop {
            let now = clock::read();
            if now.wall_ms >= moment_ms {
                break;
            }
            let at_us = now.mono_us + (moment_ms - now.wall_ms) * 1000;
            tokio::select! {
                () = shutdown.cancelled() => return Publish::Stopped,
                () = clock::until_mono_us(at_us) => {}
            }
        }
        // Read just before the publish: never published after its deadline.
        let now_ms = clock::now_ms();
        match self
            .publisher
            .release_stored(task, now_ms, PUBLISH_LIMIT, false)
            .await
        {
            Ok(outcome) => Publish::Done(outcome, clock::now_ms()),
            Err(reason) => {
                warn!(
                    task_id = task.id,
                    reason, "a staged task cannot be released"
                );
                Publish::Never
            }
        }
    }

    fn observe(&self, task: &StoredTask, released: Released, at_ms: u64) {
        let metrics = &self.publisher.metrics;
        if released == Released::Delivered {
            metrics.delivered(at_ms, at_ms.saturating_sub(task.deliver_at_ms));
            metrics.tasks_delivered.inc();
        }
        metrics.staged_released.inc();
    }
}
