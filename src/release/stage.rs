//! The release stage: every due task passes through the ledger on its way
//! to the business exchange.
//!
//! Level 0 of the cascade dead-letters into the release queue, which every
//! replica consumes (competing consumers). In a chain that holds
//! (`cascade.precision_ms` below the unit), a message arrives up to a unit
//! early and waits, unacknowledged, for its time ([`super::hold`]): a
//! cancel or a move until then still applies, and a replica that dies
//! gives what it held back to the queue. A message that arrives more than
//! the lead and two units before its time (a burst's, given a head start:
//! the scheduler's `burst`) is not held: its task is staged in the ledger in the
//! claim's transaction and the message acknowledged, and the staged release
//! lets it go at its moment ([`super::staged`]). For each group of due
//! messages (those due within [`CLAIM_SPAN`] of one another; the groups of
//! a window go side by side):
//! 1. [`CLAIM_AHEAD`] before the first is due, the ledger is asked, in one
//!    transaction, about all of them: a task that is neither cancelled nor
//!    delivered, in the revision its message carries, becomes `releasing`
//!    (from then on a cancel is too late);
//! 2. what is claimed, and what the ledger does not know (pruned, another
//!    ledger's), is published to the business exchange with the destination
//!    as routing key (or the cascade's whole key, `cascade.delivery_key =
//!    "digits"`; a message taken in by an ingress: to its exchange, with the
//!    key it came with, see [`message::released`]), the same properties and
//!    headers (mandatory, confirmed, pipelined), each at its own time, on
//!    the publisher's channel for due tasks; what is
//!    provably not to be delivered (cancelled, an older revision, a copy of a
//!    task already delivered) is dropped;
//! 3. the claimed tasks are marked `delivered` at the confirm's time, then
//!    the window is acknowledged. A message whose publish failed goes back to
//!    the queue and is released again.
//!
//! Marking before acknowledging means that a message redelivered after a lost
//! acknowledgement finds its task delivered and is dropped as a duplicate; only
//! a crash between the confirm and that commit delivers a task twice.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::hold::{self, Offsets};
use super::in_flight::InFlight;
use super::limit_view::LimitsView;
use super::publisher::{DuePublisher, Outcome, Released};
use super::record::expiry_why;
use super::watch::{Arrival, ArrivalWatch};
use crate::broker::{ConsumeLimits, Inbound, Settle};
use crate::cascade::Cascade;
use crate::clock;
use crate::ledger::{ClaimAsk, Expiry, Finding, Ledger, WaitsFor};
use crate::message::{self, Message};
use crate::metrics::Metrics;
use crate::task::TaskState;

/// Most due messages released together (one ledger claim, one commit).
pub const RELEASE_WINDOW: u16 = 256;
/// Windows a replica works on at once: while one waits for its commit or its
/// confirms, another is claimed. With the window, this bounds the due
/// messages a replica holds unacknowledged.
pub const RELEASE_WINDOWS: u16 = 4;
/// How long before a held message's time it is claimed in the ledger, so
/// that the claim's commit (a synced write, shared with the request path's)
/// is not on its way out: at 1,000 due tasks/s on two cores, 1 % of claims
/// took more than 22 ms, 0.1 % more than 27. A cancel or a move in these
/// last milliseconds finds the task releasing and is answered `too_late`.
pub const CLAIM_AHEAD: Duration = Duration::from_millis(50);
/// Held messages due within this of one another are claimed together: one
/// commit for several, none claimed more than this before `CLAIM_AHEAD`.
pub const CLAIM_SPAN: Duration = Duration::from_millis(5);
/// After a window some of whose messages could not be published, the wait
/// before the next, so that a missing business exchange or a blocked broker
/// is not hammered.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// What the release stage does with one due message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Claimed in the ledger: publish, then mark delivered.
    Deliver,
    /// Unknown to the ledger, or in a state no rule covers: publish anyway
    /// (only what is provably not to be delivered is dropped).
    Forward,
    /// The task was cancelled.
    DropCancelled,
    /// The task expired: its deadline passed before a copy was published.
    DropExpired,
    /// An older revision of a task moved since: its new copy is in the cascade.
    DropStale,
    /// The task was already delivered in this revision: a second copy.
    DropDuplicate,
    /// A copy of a task this replica is releasing right now (the broker gave
    /// it back when a channel died after the first copy was published, before
    /// it was recorded): back to the queue, to be judged once the first is
    /// recorded (then as a duplicate), not published twice.
    Requeue,
    /// Claimed, and a release limit matches its destination: it waits in
    /// the ledger for the limiter ([`super::limiter`]); acknowledged.
    Waits,
    /// Claimed well before its time: staged in the ledger until its moment
    /// ([`super::staged`]); acknowledged.
    Staged,
}

impl Verdict {
    fn dropped(self) -> Option<&'static str> {
        match self {
            Verdict::DropCancelled => Some("cancelled"),
            Verdict::DropExpired => Some("expired"),
            Verdict::DropStale => Some("stale"),
            Verdict::DropDuplicate => Some("duplicate"),
            Verdict::Deliver
            | Verdict::Forward
            | Verdict::Requeue
            | Verdict::Waits
            | Verdict::Staged => None,
        }
    }
}

/// Judges a message of revision `revision` by what the ledger found.
pub fn judge(finding: Finding, revision: u64) -> Verdict {
    match finding {
        Finding::Claimed => Verdict::Deliver,
        Finding::Waiting => Verdict::Waits,
        Finding::Staged => Verdict::Staged,
        Finding::Absent => Verdict::Forward,
        Finding::Found {
            state: TaskState::Cancelled,
            ..
        } => Verdict::DropCancelled,
        Finding::Found {
            state: TaskState::Expired,
            ..
        } => Verdict::DropExpired,
        Finding::Found {
            revision: current, ..
        } if current > revision => Verdict::DropStale,
        // Delivered, or waiting in the ledger for a limit or staged (each
        // released from there): this copy is not needed.
        Finding::Found {
            state: TaskState::Delivered | TaskState::Waiting | TaskState::Staged,
            revision: current,
        } if current == revision => Verdict::DropDuplicate,
        // A revision newer than the ledger's, or a state the claim should
        // have taken: nothing proves it must not be delivered.
        Finding::Found { .. } => Verdict::Forward,
    }
}

/// A due message as the release judges it: the task and revision it
/// carries (`None`: not a task's), whether this group entered it in flight
/// (a copy of a task this replica is releasing now waits), and the verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Judged {
    identity: Option<(String, u64)>,
    entered: bool,
    verdict: Verdict,
}

impl Judged {
    fn new(entered: bool, identity: Option<(String, u64)>) -> Judged {
        Judged {
            identity,
            entered,
            verdict: Verdict::Forward,
        }
    }

    /// The task the ledger is asked about: a task's message this group
    /// entered in flight.
    fn asked(&self) -> Option<&(String, u64)> {
        self.identity.as_ref().filter(|_| self.entered)
    }
}

/// Each message's verdict, by the ledger's findings for those it was asked
/// about ([`Judged::asked`], in the same order). A second copy of one task
/// in the group is a duplicate.
fn judge_all<'a>(messages: impl Iterator<Item = &'a mut Judged>, findings: Vec<Finding>) {
    let mut findings = findings.into_iter();
    let mut seen = HashSet::new();
    for judged in messages {
        judged.verdict = match (judged.asked(), &judged.identity) {
            (None, None) => Verdict::Forward,
            (None, Some(_)) => Verdict::Requeue,
            (Some((id, revision)), _) => {
                let verdict = judge(findings.next().unwrap_or(Finding::Absent), *revision);
                if verdict == Verdict::Deliver && !seen.insert(id.clone()) {
                    Verdict::DropDuplicate
                } else {
                    verdict
                }
            }
        };
    }
}

/// One due message of a group through its release, as one record: how it
/// is judged, the release limit that holds its destination now, and what
/// its publish did (and when its confirm came). Kept together so that no
/// filter can pair one message's verdict, limit or publish with another's.
struct DueMessage<'a> {
    due: Due<'a>,
    judged: Judged,
    waits_for: Option<WaitsFor>,
    /// What its release came to, and when (the confirm's time, epoch ms).
    published: Option<(Outcome, u64)>,
}

impl DueMessage<'_> {
    /// What the ledger's claim is asked about it, if anything.
    fn ask(&self) -> Option<ClaimAsk> {
        let (id, revision) = self.judged.asked()?.clone();
        Some(ClaimAsk {
            waits_for: self.waits_for.clone(),
            ..ClaimAsk::of(id, revision)
        })
    }
}

/// The release queue's consumer (one a replica, every shard's queue).
#[derive(Clone)]
pub(crate) struct ReleaseStage {
    pub(super) publisher: DuePublisher,
    pub(super) ledger: Ledger,
    pub(super) cascade: Arc<Cascade>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) in_flight: InFlight,
    /// What this replica knows of the clocks of replicas whose held
    /// messages it releases.
    pub(super) offsets: Arc<std::sync::Mutex<Offsets>>,
    /// The release limits, as the limiter last read them.
    pub(super) limits: LimitsView,
    /// What the way of delaying learns from what arrives (a level probe
    /// is the cascade's own: `crate::chain`'s level keepers).
    pub(super) watch: Arc<dyn ArrivalWatch>,
    /// Told when this replica stages tasks: the staged release looks again
    /// for the earliest moment.
    pub(super) staged_wake: Arc<tokio::sync::Notify>,
}

fn shards_of(cascade: &Cascade) -> usize {
    usize::try_from(cascade.shards()).unwrap_or(1)
}

/// How each release queue is consumed: four windows at once, or in a chain
/// that holds, enough more for `hold_limit` messages held.
fn release_limits(hold_limit: Option<u32>) -> ConsumeLimits {
    let held_windows = hold_limit.map_or(0, |limit| limit.div_ceil(u32::from(RELEASE_WINDOW)));
    ConsumeLimits {
        window: RELEASE_WINDOW,
        windows: RELEASE_WINDOWS.saturating_add(u16::try_from(held_windows).unwrap_or(u16::MAX)),
    }
}

/// A window's held messages, counted in `release_held` until released or
/// given back.
struct Held<'a> {
    metrics: &'a Metrics,
    arrived_us: u64,
    count: AtomicI64,
}

impl<'a> Held<'a> {
    fn new(metrics: &'a Metrics, targets: impl Iterator<Item = u64>, arrived_us: u64) -> Self {
        let count = targets.filter(|&at| at > arrived_us).count();
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        metrics.release_held.inc_by(count);
        Held {
            metrics,
            arrived_us,
            count: AtomicI64::new(count),
        }
    }

    /// A message due at `target` released at `now_us`.
    fn released(&self, target: u64, now_us: u64) {
        if target > self.arrived_us {
            let held_us = now_us.saturating_sub(self.arrived_us);
            self.metrics.release_hold.observe(held_us as f64 / 1e6);
            self.let_go(target);
        }
    }

    /// A message due at `target` no longer held, not released (dropped).
    fn let_go(&self, target: u64) {
        if target > self.arrived_us {
            self.metrics.release_held.dec();
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.metrics.release_held.dec_by(*self.count.get_mut());
    }
}

/// A task's message of a window: its place there (how the window is
/// settled), and when it is released, `at_us` (this process's monotonic
/// clock).
struct Due<'a> {
    place: usize,
    message: &'a Inbound,
    at_us: u64,
}

/// Waits until `at_us` by this process's monotonic clock, to a tenth of a
/// millisecond ([`clock::until_mono_us`]); false if `shutdown` came first.
async fn until(at_us: u64, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = clock::until_mono_us(at_us) => true,
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

impl ReleaseStage {
    /// Releases due tasks until `shutdown`, several windows at once. In a
    /// chain that holds, every window waits for its messages' times: as
    /// many windows are out as the hold limit allows.
    pub async fn run(self, shutdown: CancellationToken) {
        let holds = self.cascade.holds();
        let limits = release_limits(holds.then(|| self.cascade.hold_limit()));
        // Every shard's release queue, each with the limits of one: a
        // shard's due tasks are held by the stage alike.
        let shards = self.cascade.every_shard().map(|shard| {
            Box::pin(
                self.publisher
                    .broker
                    .consume(shard.release_queue(), limits, shutdown.clone())
                    .into_stream(),
            )
        });
        let windows = futures_util::stream::select_all(shards);
        let concurrency =
            (!holds).then_some(usize::from(RELEASE_WINDOWS) * shards_of(&self.cascade));
        windows
            .for_each_concurrent(concurrency, |window| async {
                let settles = self.release_window(&window.messages, &shutdown).await;
                let retry = settles.contains(&Settle::Requeue);
                window.settle(settles);
                if retry {
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = tokio::time::sleep(RETRY_PAUSE) => {}
                    }
                }
            })
            .await;
    }

    /// One window: its level probes noted (or handed on to the replica
    /// that sent them) and taken off, the rest released in time. How to
    /// settle each message.
    async fn release_window(
        &self,
        messages: &[Inbound],
        shutdown: &CancellationToken,
    ) -> Vec<Settle> {
        self.watch.arrived(messages);
        // The watch's own are taken off; a task is given back unless its
        // release says otherwise.
        let mut settles = vec![Settle::Ack; messages.len()];
        let mut notices: Vec<Message> = Vec::new();
        let mut tasks = Vec::with_capacity(messages.len());
        for (place, message) in messages.iter().enumerate() {
            // Sorted (and a probe noted, or handed on) as they arrive, not
            // after the window's tasks are released: a claim that waits (a
            // deadlock broken off and run again) must not make a probe look
            // late and its level stranded.
            match self.watch.sort(message) {
                Arrival::Own(notice) => notices.extend(notice.map(|notice| *notice)),
                Arrival::Task => {
                    settles[place] = Settle::Requeue;
                    tasks.push((place, message));
                }
            }
        }
        let (released, ()) =
            tokio::join!(self.release_in_time(tasks, shutdown), self.hand_on(notices));
        for (place, settle) in released {
            settles[place] = settle;
        }
        settles
    }

    /// Sends each notice of another replica's probe to its owner. One not
    /// taken (its owner gone, the connection lost) is let go: a probe tells
    /// only its owner something, and only while it is on time.
    async fn hand_on(&self, notices: Vec<Message>) {
        let sent = join_all(
            notices
                .into_iter()
                .map(|notice| self.publisher.broker.publish_due(notice)),
        )
        .await;
        for outcome in sent {
            if let Err(error) = outcome {
                debug!(%error, "a level probe's notice to its replica was not taken");
            }
        }
    }

    /// One window's tasks (each with its place in the window), each
    /// released at its time (see [`super::hold`]): the messages due within
    /// [`CLAIM_SPAN`] of each other are claimed together, [`CLAIM_AHEAD`]
    /// before the first is due, and each is published at its own time. The
    /// groups run side by side, so no message waits for an earlier group's
    /// commits or confirms. How to settle each, by place; what `shutdown`
    /// finds still held goes back to the queue, for another replica to hold.
    async fn release_in_time(
        &self,
        tasks: Vec<(usize, &Inbound)>,
        shutdown: &CancellationToken,
    ) -> Vec<(usize, Settle)> {
        let arrived_us = clock::mono_us();
        let due = self.due_times(tasks, arrived_us);
        let (mut settled, rest) = self.stage_early(due, arrived_us).await;
        // The rest, held to their times.
        let held = Held::new(&self.metrics, rest.iter().map(|d| d.at_us), arrived_us);
        let groups = hold::claim_groups(rest, |d| d.at_us, micros(CLAIM_SPAN));
        let released = join_all(
            groups
                .into_iter()
                .map(|group| self.release(group, &held, shutdown)),
        )
        .await;
        settled.extend(released.into_iter().flatten());
        settled
    }

    /// Stages in the ledger each message of a window that arrived more
    /// than [`Cascade::stage_after_ms`] before its time (a burst's head start),
    /// until its moment ([`super::staged`]): acknowledged then, as is a copy
    /// the claim proves needless. The others are returned, held as before.
    async fn stage_early<'a>(
        &self,
        due: Vec<Due<'a>>,
        arrived_us: u64,
    ) -> (Vec<(usize, Settle)>, Vec<Due<'a>>) {
        let beyond_us = self.cascade.stage_after_ms().saturating_mul(1000);
        let (early, mut rest): (Vec<Due<'a>>, Vec<Due<'a>>) = due
            .into_iter()
            .partition(|d| d.at_us > arrived_us.saturating_add(beyond_us));
        if early.is_empty() {
            return (Vec::new(), rest);
        }
        let mut entered = self.in_flight.window();
        let now = clock::read();
        // Each message asked about with its ask: one record.
        let mut asked: Vec<(Due<'a>, ClaimAsk)> = Vec::new();
        for due in early {
            match message::identity(&due.message.properties) {
                Some(identity) if entered.enter(Some(&identity)) => {
                    let ahead_ms = due.at_us.saturating_sub(now.mono_us).div_ceil(1000);
                    let deliver_at_ms =
                        message::deliver_at_ms(&due.message.properties).unwrap_or(0);
                    let until = deliver_at_ms.max(now.wall_ms.saturating_add(ahead_ms + 1));
                    let (id, revision) = identity;
                    let ask = ClaimAsk {
                        stage_until: Some(until),
                        ..ClaimAsk::of(id, revision)
                    };
                    asked.push((due, ask));
                }
                _ => rest.push(due),
            }
        }
        let asks = asked.iter().map(|(_, ask)| ask.clone()).collect();
        let findings = match self.ledger.stage(asks).await {
            Ok(findings) => findings,
            Err(error) => {
                warn!(%error, "cannot stage early tasks in the ledger; they are held instead");
                rest.extend(asked.into_iter().map(|(due, _)| due));
                return (Vec::new(), rest);
            }
        };
        let mut settled = Vec::new();
        let mut staged = 0;
        for ((due, ask), finding) in asked.into_iter().zip(findings) {
            let verdict = judge(finding, ask.revision);
            if verdict == Verdict::Staged {
                staged += 1;
                settled.push((due.place, Settle::Ack));
            } else if let Some(reason) = verdict.dropped() {
                self.metrics.dropped_at_release(reason);
                settled.push((due.place, Settle::Ack));
            } else {
                rest.push(due);
            }
        }
        if staged > 0 {
            self.metrics.tasks_staged.inc_by(staged);
            self.staged_wake.notify_one();
            self.watch
                .burst_seen(usize::try_from(staged).unwrap_or(usize::MAX));
        }
        (settled, rest)
    }

    /// When to release each task, by this process's monotonic clock: on
    /// arrival unless it carries a hold stamp.
    fn due_times<'a>(&self, tasks: Vec<(usize, &'a Inbound)>, arrived_us: u64) -> Vec<Due<'a>> {
        let mut offsets = self
            .offsets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tasks
            .into_iter()
            .map(|(place, message)| Due {
                place,
                message,
                at_us: match message::Stamp::read(&message.properties) {
                    Some(stamp) => offsets.release_at(&stamp, arrived_us, clock::source()),
                    None => arrived_us,
                },
            })
            .collect()
    }

    /// One group of a window's messages (in order of time): claimed
    /// [`CLAIM_AHEAD`] before the first is due, each published at its time,
    /// those delivered marked so. How to settle each.
    async fn release(
        &self,
        due: Vec<Due<'_>>,
        held: &Held<'_>,
        shutdown: &CancellationToken,
    ) -> Vec<(usize, Settle)> {
        let first_us = due.first().map_or(0, |d| d.at_us);
        if !until(first_us.saturating_sub(micros(CLAIM_AHEAD)), shutdown).await
            || !self.publisher.broker.status().ready
        {
            return due.iter().map(|d| (d.place, Settle::Requeue)).collect();
        }
        let mut entered = self.in_flight.window();
        let mut group: Vec<DueMessage<'_>> = due
            .into_iter()
            .map(|due| {
                let identity = message::identity(&due.message.properties);
                DueMessage {
                    waits_for: self.waits_for(&due),
                    judged: Judged::new(entered.enter(identity.as_ref()), identity),
                    due,
                    published: None,
                }
            })
            .collect();
        // A claimed task a release limit holds waits for it, in the
        // claim's own commit, unless the limits let it go now: only a group
        // already due, for a token taken ahead of its task's time would let
        // more than the burst go at once.
        let overdue = group
            .last()
            .is_some_and(|m| m.due.at_us <= clock::mono_us());
        let limited = group.iter().any(|m| m.waits_for.is_some());
        let limits = (overdue && limited).then(|| self.limits.pass_input(clock::now_ms()));
        let asks = group.iter().filter_map(DueMessage::ask).collect();
        let findings = match self.ledger.claim_release(asks, limits).await {
            Ok(findings) => findings,
            Err(error) => {
                warn!(%error, "cannot look due tasks up in the ledger; they are released later");
                return group
                    .iter()
                    .map(|m| (m.due.place, Settle::Requeue))
                    .collect();
            }
        };
        judge_all(group.iter_mut().map(|m| &mut m.judged), findings);
        self.tell_limits(&group);
        let group = join_all(group.into_iter().map(|mut m| async move {
            let publish = matches!(m.judged.verdict, Verdict::Deliver | Verdict::Forward);
            m.published = self.publish_at(&m.due, publish, held, shutdown).await;
            m
        }))
        .await;
        self.record(group).await
    }

    /// The release limit that holds `due`'s destination now, if any.
    fn waits_for(&self, due: &Due<'_>) -> Option<WaitsFor> {
        let destination = self.cascade.destination_in(&due.message.routing_key)?;
        Some(WaitsFor {
            limit: self.limits.limit_for(destination)?,
            destination: destination.to_owned(),
        })
    }

    /// What the claim decided, told to the limits: the limiter looks at
    /// once at a destination whose tasks now wait; a task its limits let
    /// go at once counts as released by them.
    fn tell_limits(&self, group: &[DueMessage<'_>]) {
        let mut straight = Vec::new();
        for message in group {
            let Some(waits_for) = &message.waits_for else {
                continue;
            };
            match message.judged.verdict {
                Verdict::Waits => self.limits.now_waiting(&waits_for.destination),
                Verdict::Deliver => straight.push(waits_for.destination.as_str()),
                _ => {}
            }
        }
        if !straight.is_empty() {
            self.limits.released_straight(&straight, &self.metrics);
        }
    }

    /// A message released at its time (published, or expired past its
    /// deadline then), and when its confirm came; `None` when it is not to
    /// be published, or `shutdown` came first (claimed, it goes back to the
    /// queue and is claimed again by whoever takes it).
    async fn publish_at(
        &self,
        due: &Due<'_>,
        publish: bool,
        held: &Held<'_>,
        shutdown: &CancellationToken,
    ) -> Option<(Outcome, u64)> {
        if !publish {
            held.let_go(due.at_us);
            return None;
        }
        if !until(due.at_us, shutdown).await {
            return None;
        }
        held.released(due.at_us, clock::mono_us());
        // Read just before the publish: never published after its deadline.
        let outcome = self.publisher.release(due.message, clock::now_ms()).await;
        Some((outcome, clock::now_ms()))
    }

    /// How to settle each message of a group, by its verdict and what its
    /// publish did; the delivered and the expired ones are marked so in the
    /// ledger first.
    async fn record(&self, group: Vec<DueMessage<'_>>) -> Vec<(usize, Settle)> {
        let mut delivered: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        let mut expired = Expired::default();
        let mut settles = Vec::with_capacity(group.len());
        for DueMessage {
            due,
            judged,
            published,
            ..
        } in group
        {
            let (message, verdict) = (due.message, judged.verdict);
            let settle = if verdict == Verdict::Waits {
                Settle::Ack
            } else if let Some(reason) = verdict.dropped() {
                self.metrics.dropped_at_release(reason);
                debug!(
                    task_id = message::message_id(&message.properties),
                    reason, "dropped at release"
                );
                Settle::Ack
            } else {
                match published {
                    Some((Outcome::Expired(None), at_ms)) => {
                        expired.add(judged.identity, at_ms, None);
                        Settle::Ack
                    }
                    Some((Outcome::Expired(Some((to, Ok(_)))), at_ms)) => {
                        expired.add(judged.identity, at_ms, Some(to));
                        Settle::Ack
                    }
                    // Its notice marks it unroutable; not delivered.
                    Some((Outcome::Published(Ok(Released::Unroutable)), _)) => Settle::Ack,
                    Some((Outcome::Published(Ok(Released::Delivered)), at_ms)) => {
                        self.observe_delivery(message, verdict, at_ms);
                        if verdict == Verdict::Deliver
                            && let Some((id, _)) = judged.identity
                        {
                            delivered.entry(at_ms).or_default().push(id);
                        }
                        Settle::Ack
                    }
                    Some((
                        Outcome::Published(Err(error)) | Outcome::Expired(Some((_, Err(error)))),
                        _,
                    )) => {
                        warn!(
                            task_id = message::message_id(&message.properties),
                            %error,
                            "a due task could not be released; it is released again"
                        );
                        Settle::Requeue
                    }
                    None => Settle::Requeue,
                }
            };
            settles.push((due.place, settle));
        }
        let marks = delivered
            .into_iter()
            .map(|(at_ms, ids)| self.ledger.mark_delivered(ids, at_ms));
        let (marked, ()) = tokio::join!(join_all(marks), expired.record(self));
        if let Some(Err(error)) = marked.into_iter().find(Result::is_err) {
            // Delivered all the same; a copy that comes again is delivered again.
            warn!(%error, "delivered tasks not marked so in the ledger");
        }
        settles
    }

    fn observe_delivery(&self, message: &Inbound, verdict: Verdict, delivered_at_ms: u64) {
        let deliver_at_ms = message::deliver_at_ms(&message.properties);
        let lateness_ms = deliver_at_ms.map(|at| delivered_at_ms.saturating_sub(at));
        if let Some(lateness_ms) = lateness_ms {
            self.metrics.delivered(delivered_at_ms, lateness_ms);
        }
        let counter = match verdict {
            Verdict::Deliver => &self.metrics.tasks_delivered,
            _ => &self.metrics.release_unknown,
        };
        counter.inc();
        debug!(
            task_id = message::message_id(&message.properties),
            lateness_ms,
            known = verdict == Verdict::Deliver,
            "delivered"
        );
    }
}

/// Why a task the release stage expired did, as the ledger keeps it.
const EXPIRED_AT_RELEASE: &str = "its deadline passed before the release stage could publish \
     it (the broker unavailable or blocked, delayline stopped, or its message late out of the \
     cascade)";

/// A group's messages whose deadline passed at their time: counted, and
/// their tasks (those the message names) marked expired in the ledger.
#[derive(Default)]
struct Expired {
    tasks: Vec<Expiry>,
    messages: u64,
}

impl Expired {
    /// A message that expired at `at_ms`, its message sent to `sent_to`.
    fn add(&mut self, identity: Option<(String, u64)>, at_ms: u64, sent_to: Option<String>) {
        self.messages += 1;
        if let Some((id, revision)) = identity {
            let why = expiry_why(EXPIRED_AT_RELEASE, sent_to.as_deref());
            self.tasks.push(Expiry {
                id,
                revision,
                at_ms,
                why,
            });
        }
    }

    async fn record(self, stage: &ReleaseStage) {
        if self.messages == 0 {
            return;
        }
        stage.metrics.expired("release", self.messages);
        if let Err(error) = stage.ledger.mark_expired(&self.tasks).await {
            // Never published all the same; a copy that comes again expires again.
            warn!(%error, "expired tasks not marked so in the ledger");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_is_provably_not_due_is_dropped() {
        use TaskState::*;
        let found = |state, revision| Finding::Found { state, revision };
        assert_eq!(judge(Finding::Claimed, 1), Verdict::Deliver);
        assert_eq!(judge(Finding::Absent, 1), Verdict::Forward);
        for state in TaskState::ALL {
            for (current, message) in [(1, 1), (2, 1), (1, 2), (3, 3)] {
                let verdict = judge(found(state, current), message);
                let expected = match (state, current.cmp(&message)) {
                    (Cancelled, _) => Verdict::DropCancelled,
                    (Expired, _) => Verdict::DropExpired,
                    (_, std::cmp::Ordering::Greater) => Verdict::DropStale,
                    (Delivered | Waiting | Staged, std::cmp::Ordering::Equal) => {
                        Verdict::DropDuplicate
                    }
                    _ => Verdict::Forward,
                };
                assert_eq!(
                    verdict, expected,
                    "{state:?} r{current}, message r{message}"
                );
            }
        }
    }

    #[test]
    fn a_window_forwards_the_unknown_waits_for_copies_in_flight_and_drops_repeats() {
        let task = |id: &str, revision| Some((id.to_owned(), revision));
        let mut group = [
            Judged::new(true, None),
            Judged::new(true, task("a", 1)),
            Judged::new(false, task("b", 1)),
            Judged::new(true, task("a", 1)),
            Judged::new(true, task("c", 2)),
        ];
        let findings = vec![Finding::Claimed, Finding::Claimed, Finding::Absent];
        judge_all(group.iter_mut(), findings);
        let verdicts: Vec<Verdict> = group.iter().map(|m| m.verdict).collect();
        assert_eq!(
            verdicts,
            [
                Verdict::Forward,
                Verdict::Deliver,
                Verdict::Requeue,
                Verdict::DropDuplicate,
                judge(Finding::Absent, 2),
            ]
        );
    }
}
