//! Stranded levels found and drained by delayline itself.
//!
//! After a node loss, a quorum queue's at-least-once dead-letter worker can
//! stop for good (RabbitMQ #16652): the level takes messages, they expire,
//! and nothing leaves. The ledger's resender publishes such tasks again a
//! minute late; this does better. Each level (of at most ten minutes' TTL)
//! always has a probe inside (see [`crate::cascade::LevelWatch`] for when
//! the next goes in, and for the verdict). Replicas share the release
//! queue, so a probe may reach another replica's release stage: that one
//! takes it off at once and sends a notice of it straight to the sender's
//! own queue (exclusive to its connection), where the sender notes it as if
//! it had come itself. A level found stranded is then
//! - consumed by delayline: each message is taken before it expires (a
//!   message delivered to a consumer does not expire), waits here until the
//!   time the level would have let it go, and goes on to where
//!   dead-lettering would have sent it; it is acknowledged only after the
//!   broker confirmed the copy;
//! - and the tasks that passed it and are overdue by the margin (those the
//!   broker holds expired, where no consumer can reach them) are published
//!   again from the ledger at once. The release stage's claim makes any
//!   second copy harmless when the broker lets the first go after all.
//!
//! The broker does not say when a level's worker runs again (a restarted
//! Raft member, a node back), so a level drained for
//! `cascade.stranded_recheck_ms` is handed back: its drain stops and it is
//! probed again like any other, and taken back if a probe overtakes its
//! own. A drained level loses nothing, and neither does a recheck.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::broker::{ConsumeLimits, Inbound, Published, Settle};
use crate::cascade::{Cascade, Evidence, LevelWatch, digit_position, levels_left};
use crate::ledger::Ledger;
use crate::message::{self, Message, Probe};
use crate::metrics::{LevelLabel, Metrics};
use crate::release::{Arrival, ArrivalWatch, Broker};

/// Tasks staged or released from the ledger at once that show a burst.
const BURST_TASKS: usize = 16;
/// How often the ledger is asked for overdue tasks that passed a stranded level.
const RESEND_POLL: Duration = Duration::from_secs(1);
/// How long a drain window waits after the broker refused a copy.
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// The notices of probes handed on by other replicas: a few at a time.
const NOTICE_LIMITS: ConsumeLimits = ConsumeLimits {
    window: 50,
    windows: 1,
};
/// A drained level's consumer: messages taken at once, before they expire.
const DRAIN_LIMITS: ConsumeLimits = ConsumeLimits {
    window: 100,
    windows: 100,
};

/// What this replica's probes say, shared by the prober and the release stage.
#[derive(Clone)]
pub(crate) struct Strands {
    watch: Arc<Mutex<LevelWatch>>,
    cascade: Arc<Cascade>,
    /// This replica's name on its probes: fresh for each replica, not each
    /// process, since one process may run two (as the tests do), and each
    /// must know its own probes from the other's.
    owner: Arc<str>,
    metrics: Arc<Metrics>,
}

impl Strands {
    pub fn new(cascade: Arc<Cascade>, metrics: Arc<Metrics>) -> Strands {
        let every_ms = cascade.level_probe().map_or(0, |every| {
            u64::try_from(every.as_millis()).unwrap_or(u64::MAX)
        });
        let watch = LevelWatch::new(cascade.levels(), cascade.stranded_margin_ms(), every_ms);
        Strands {
            watch: Arc::new(Mutex::new(watch)),
            cascade,
            owner: format!("{:016x}", rand::random::<u64>()).into(),
            metrics,
        }
    }

    /// The view of the shard these probes go through.
    pub fn cascade(&self) -> Arc<Cascade> {
        self.cascade.clone()
    }

    fn watch(&self) -> std::sync::MutexGuard<'_, LevelWatch> {
        self.watch.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A task sent at `sent_ms` (this process's clock) reached the release
    /// stage at `now_ms`: each watched level it passed shows progress.
    fn task_passed(&self, routing_key: &str, sent_ms: u64, now_ms: u64) {
        let unit_ms = self.cascade.unit_ms();
        let watched_below = LevelWatch::watched(&self.cascade).count() as u32;
        let mut watch = self.watch();
        for (level, units) in levels_left(routing_key, self.cascade.levels()) {
            if level < watched_below {
                watch.passed(level, sent_ms + units * unit_ms, now_ms);
            }
        }
    }

    /// This replica's `probe` came back.
    fn heard(&self, probe: &Probe) {
        let ttl_ms = probe.ttl_ms(&self.cascade);
        self.watch().came_back(probe.level, probe.sent_ms, ttl_ms);
        self.metrics.level_probes_back.inc();
    }

    /// Notes each of this replica's probes that the other replicas' release
    /// stages took, as they hand them on to its own queue, until `shutdown`.
    async fn hear_notices(self, broker: Arc<dyn Broker>, shutdown: CancellationToken) {
        let queue = self.cascade.probe_notice_queue(&self.owner);
        let mut windows = broker.consume_own(queue, NOTICE_LIMITS, shutdown);
        while let Some(window) = windows.recv().await {
            for message in &window.messages {
                match Probe::read(&message.properties) {
                    Some(probe) if *probe.owner == *self.owner => self.heard(&probe),
                    _ => {}
                }
            }
            let count = window.messages.len();
            window.settle(vec![Settle::Ack; count]);
        }
    }
}

/// The resend loops of stranded levels: one per level, whichever shards it
/// is stranded in. The ledger does not keep a task's shard, so a loop per
/// shard would publish the same tasks again once for each (and, on
/// PostgreSQL, deadlock on the same rows).
#[derive(Clone, Default)]
pub(crate) struct Resends(Arc<Mutex<HashMap<u32, (usize, CancellationToken)>>>);

impl Resends {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, (usize, CancellationToken)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A shard took `level` over: the token to start its loop with, when
    /// none runs yet; the loop runs until the token is cancelled.
    fn taken(&self, level: u32, shutdown: &CancellationToken) -> Option<CancellationToken> {
        let mut loops = self.lock();
        if let Some((shards, _)) = loops.get_mut(&level) {
            *shards += 1;
            return None;
        }
        let stop = shutdown.child_token();
        loops.insert(level, (1, stop.clone()));
        Some(stop)
    }

    /// A shard handed `level` back: its loop stops with the last one.
    fn handed_back(&self, level: u32) {
        let mut loops = self.lock();
        if let Some((shards, stop)) = loops.get_mut(&level) {
            *shards -= 1;
            if *shards == 0 {
                stop.cancel();
                loops.remove(&level);
            }
        }
    }
}

/// Every shard's [`Strands`]: each shard has its levels and its release
/// queue, so its probes are judged against each other alone (a probe of
/// one shard can overtake another shard's for reasons of its own queue).
#[derive(Clone)]
pub(crate) struct ShardStrands {
    shards: Arc<[Strands]>,
    cascade: Arc<Cascade>,
    metrics: Arc<Metrics>,
    resends: Resends,
}

impl ShardStrands {
    pub fn new(cascade: &Arc<Cascade>, metrics: &Arc<Metrics>) -> ShardStrands {
        ShardStrands {
            shards: cascade
                .every_shard()
                .map(|shard| Strands::new(Arc::new(shard), metrics.clone()))
                .collect(),
            cascade: cascade.clone(),
            metrics: metrics.clone(),
            resends: Resends::default(),
        }
    }

    /// The resend loops every shard's keeper shares.
    pub fn resends(&self) -> Resends {
        self.resends.clone()
    }

    /// Each shard's, shard 0 first.
    pub fn each(&self) -> impl Iterator<Item = &Strands> {
        self.shards.iter()
    }

    /// This replica staged `tasks` of a burst, or released them from the
    /// ledger: every shard's watch takes its levels to be busy with it for
    /// a while (see [`LevelWatch::burst_seen`]). A few staged tasks (a long
    /// round delay's) are no burst.
    pub fn burst_seen(&self, tasks: usize) {
        if tasks < BURST_TASKS {
            return;
        }
        let now_ms = crate::clock::mono_us() / 1000;
        for shard in self.shards.iter() {
            shard.watch().burst_seen(now_ms);
        }
    }

    /// Tasks reached the release stage: each one this process sent (its
    /// stamp in this process's clock) tells its shard's watch which levels
    /// passed it and when they were due to (see [`LevelWatch::passed`]).
    pub fn tasks_arrived(&self, messages: &[Inbound]) {
        let now_ms = crate::clock::mono_us() / 1000;
        for message in messages {
            let Some(stamp) = message::Stamp::read(&message.properties) else {
                continue;
            };
            if stamp.source != crate::clock::source() {
                continue;
            }
            let shard =
                message::message_id(&message.properties).map_or(0, |id| self.cascade.shard_of(id));
            if let Some(strands) = self.shards.get(shard as usize) {
                strands.task_passed(&message.routing_key, stamp.sent_us / 1000, now_ms);
            }
        }
    }

    /// The release stage took `probe` off: noted by the shard of this
    /// replica that sent it; for another replica's, the notice to send its
    /// owner. Either way the probe itself is acknowledged. (Handed back to
    /// the queue instead, a probe could go to the same replica again and
    /// again, each time held with the window it came in, until its owner
    /// took it for late: a healthy level taken for stranded.)
    pub fn probe_arrived(&self, probe: &Probe) -> Option<Message> {
        match self.shards.iter().find(|own| *own.owner == *probe.owner) {
            Some(own) => {
                own.heard(probe);
                None
            }
            None => {
                self.metrics.level_probes_handed_on.inc();
                Some(probe.notice(&self.cascade))
            }
        }
    }
}

/// What the release stage tells the level keepers (see
/// [`crate::release::ArrivalWatch`]): a probe is the watch's own.
impl ArrivalWatch for ShardStrands {
    fn arrived(&self, messages: &[Inbound]) {
        self.tasks_arrived(messages);
    }

    fn sort(&self, message: &Inbound) -> Arrival {
        match Probe::read(&message.properties) {
            Some(probe) => Arrival::Own(self.probe_arrived(&probe).map(Box::new)),
            None => Arrival::Task,
        }
    }

    fn burst_seen(&self, tasks: usize) {
        ShardStrands::burst_seen(self, tasks);
    }
}

/// What the level keepers read and write.
pub(crate) struct KeeperHandles {
    pub broker: Arc<dyn Broker>,
    pub ledger: Ledger,
    pub metrics: Arc<Metrics>,
    /// How long a task that passed no stranded level may be overdue before
    /// the ledger's own resender publishes it again (`store.resend_after_ms`).
    pub resend_after: Duration,
}

/// Every shard's level keeper, with how often it probes; none when the
/// chain sends no probes (`cascade.level_probe_ms = 0`).
pub(crate) fn level_keepers(
    strands: &ShardStrands,
    handles: &KeeperHandles,
) -> Vec<(LevelKeeper, Duration)> {
    let Some(every) = strands.cascade.level_probe() else {
        return Vec::new();
    };
    strands
        .each()
        .map(|shard| {
            let keeper = LevelKeeper {
                broker: handles.broker.clone(),
                ledger: handles.ledger.clone(),
                cascade: shard.cascade(),
                metrics: handles.metrics.clone(),
                strands: shard.clone(),
                resend_after: handles.resend_after,
                resends: strands.resends(),
            };
            (keeper, every)
        })
        .collect()
}

/// Probes the levels of one shard, and drains those found stranded.
#[derive(Clone)]
pub(crate) struct LevelKeeper {
    broker: Arc<dyn Broker>,
    ledger: Ledger,
    cascade: Arc<Cascade>,
    metrics: Arc<Metrics>,
    strands: Strands,
    /// How long a task that passed no stranded level may be overdue before
    /// the ledger's own resender publishes it again (`store.resend_after_ms`).
    resend_after: Duration,
    /// Shared by every shard's keeper (see [`Resends`]).
    resends: Resends,
}

impl LevelKeeper {
    /// Probes every `every`, until `shutdown`.
    pub async fn run(self, every: Duration, shutdown: CancellationToken) {
        tokio::spawn(
            self.strands
                .clone()
                .hear_notices(self.broker.clone(), shutdown.clone()),
        );
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Each level taken over: what stops its drain and its resends.
        let mut taken_over: HashMap<u32, CancellationToken> = HashMap::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = interval.tick() => {}
            }
            // Probes out stay out while the broker is away: judged by order,
            // its absence delays them no more than a backlog does, and a
            // level that, after a node loss, passes new messages but keeps
            // those it held before shows only in a probe sent before it.
            if !self.broker.status().ready {
                continue;
            }
            self.send_probes().await;
            let now_ms = crate::clock::now_ms();
            let mono_ms = crate::clock::mono_us() / 1000;
            let found = self.strands.watch().newly_stranded(&self.cascade, mono_ms);
            for level in found {
                let stop = shutdown.child_token();
                self.take_over(level, now_ms, &stop, &shutdown);
                taken_over.insert(level, stop);
            }
            if let Some(recheck) = self.cascade.stranded_recheck() {
                self.hand_back_due(mono_ms, recheck, &mut taken_over);
            }
        }
    }

    /// Levels drained for `recheck` handed back to the broker: their drain
    /// stopped (what it held goes back to the level, which lets it go no
    /// earlier than its TTL), and probed again like any other level.
    fn hand_back_due(
        &self,
        mono_ms: u64,
        recheck: Duration,
        taken_over: &mut HashMap<u32, CancellationToken>,
    ) {
        let after_ms = u64::try_from(recheck.as_millis()).unwrap_or(u64::MAX);
        let mut watch = self.strands.watch();
        for level in watch.due_for_recheck(mono_ms, after_ms) {
            if let Some(stop) = taken_over.remove(&level) {
                stop.cancel();
            }
            self.resends.handed_back(level);
            watch.hand_back(level);
            let label = self.label(level);
            self.metrics.level_stranded.get_or_create(&label).set(0);
            self.metrics.level_handed_back.get_or_create(&label).inc();
            info!(
                level,
                queue = label.queue,
                "handing a stranded level back to the broker after {recheck:?} of draining: \
                 probed again, and taken back if a probe overtakes its own"
            );
        }
    }

    /// A probe through each watched level that wants one (and one through
    /// none). Noted as out before it is sent, since a short level's may be
    /// back before its confirm; taken back if the broker did not confirm it.
    async fn send_probes(&self) {
        let now = crate::clock::read();
        let sent_ms = now.mono_us / 1000;
        let wanted: Vec<Option<u32>> = {
            let mut watch = self.strands.watch();
            let wanted: Vec<Option<u32>> = LevelWatch::watched(&self.cascade)
                .map(Some)
                .chain([None])
                .filter(|&level| watch.wants_probe(&self.cascade, level, sent_ms))
                .collect();
            for &level in &wanted {
                watch.sent(level, sent_ms);
            }
            wanted
        };
        let sent = join_all(wanted.iter().map(|&level| {
            let probe = Probe {
                level,
                sent_ms,
                owner: self.strands.owner.to_string(),
            };
            self.broker
                .publish_due(probe.message(&self.cascade, now.wall_ms))
        }))
        .await;
        let confirmed_ms = crate::clock::mono_us() / 1000;
        let mut watch = self.strands.watch();
        for (level, outcome) in wanted.into_iter().zip(sent) {
            if matches!(outcome, Ok(Published::Confirmed)) {
                watch.confirmed(level, sent_ms, confirmed_ms);
            } else {
                watch.not_sent(level, sent_ms);
            }
        }
    }

    fn label(&self, level: u32) -> LevelLabel {
        LevelLabel {
            level,
            queue: self.cascade.level_queue(level),
        }
    }

    /// `level` found stranded: said, drained, and its overdue tasks resent.
    /// Until `stop` (a recheck, or shutdown).
    fn take_over(
        &self,
        level: u32,
        now_ms: u64,
        stop: &CancellationToken,
        shutdown: &CancellationToken,
    ) {
        let queue = self.cascade.level_queue(level);
        let evidence = self.strands.watch().evidence(level);
        warn!(
            level,
            queue,
            connected_to = self.broker.status().node.unwrap_or_default(),
            margin_ms = self.cascade.stranded_margin_ms(),
            evidence = evidence.map_or("", Evidence::says),
            "a level stopped dead-lettering, or fell far behind (RabbitMQ's at-least-once \
             dead-letter worker on the node leading it stopped, rabbitmq-queues quorum_status \
             {queue} names that node; see the runbook's \"A level stranded after a node loss\"); \
             delayline now takes its messages off and sends each on at its time, and publishes \
             the overdue tasks that passed it again"
        );
        self.metrics
            .level_stranded
            .get_or_create(&self.label(level))
            .set(1);
        tokio::spawn(self.clone().drain(level, stop.clone()));
        // A resender set to never (0) is obeyed here too.
        if !self.resend_after.is_zero()
            && let Some(resending) = self.resends.taken(level, shutdown)
        {
            tokio::spawn(self.clone().resend_through(level, now_ms, resending));
        }
    }

    /// Consumes `level`'s queue until `shutdown`, each message sent on at
    /// the time the level would have let it go.
    async fn drain(self, level: u32, shutdown: CancellationToken) {
        let windows = self.broker.consume(
            self.cascade.level_queue(level),
            DRAIN_LIMITS,
            shutdown.clone(),
        );
        windows
            .into_stream()
            .for_each_concurrent(None, |window| async {
                let settles = join_all(
                    window
                        .messages
                        .iter()
                        .map(|message| self.send_on(message, level, &shutdown)),
                )
                .await;
                let retry = settles.contains(&Settle::Requeue);
                window.settle(settles);
                // A copy the broker would not take (the next level's
                // exchange missing, a connection lost) comes back at once:
                // not in a tight loop.
                if retry {
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = tokio::time::sleep(RETRY_PAUSE) => {}
                    }
                }
            })
            .await;
        info!(level, "stopped draining the level");
    }

    /// One message taken off stranded `level`: at its time, a copy to
    /// where dead-lettering would have sent it; acknowledged once confirmed.
    async fn send_on(&self, inbound: &Inbound, level: u32, shutdown: &CancellationToken) -> Settle {
        let now_ms = crate::clock::now_ms();
        let leaves_ms = match message::deliver_at_ms(&inbound.properties) {
            Some(deliver_at_ms) => {
                self.cascade
                    .leaves_level_at_ms(&inbound.routing_key, level, deliver_at_ms)
            }
            // Not delayline's: as if it had just come in.
            None => now_ms + self.cascade.level_ttl_ms(level),
        };
        tokio::select! {
            () = shutdown.cancelled() => return Settle::Requeue,
            () = tokio::time::sleep(Duration::from_millis(leaves_ms.saturating_sub(now_ms))) => {}
        }
        let copy = message::drained(
            &inbound.routing_key,
            inbound.payload.clone(),
            &inbound.properties,
            &self.cascade,
            level,
            &crate::clock::read(),
        );
        match self.broker.publish_due(copy).await {
            Ok(Published::Confirmed) => {
                self.metrics
                    .level_drained
                    .get_or_create(&self.label(level))
                    .inc();
                Settle::Ack
            }
            Ok(Published::Late(_)) | Err(_) => Settle::Requeue,
        }
    }

    /// Until `shutdown`: tasks that passed `level`, still `scheduled` the
    /// margin after their due time, published again from the ledger (the
    /// broker holds their messages expired, out of any consumer's reach).
    /// From where the ledger's own resender has not yet looked. The ledger
    /// does not keep a task's shard, so in a chain of several shards the
    /// overdue tasks of every shard that passed this level are published
    /// again, by one loop however many shards have the level stranded
    /// ([`Resends`]): elsewhere they are that late already, and the release
    /// stage drops whichever copy comes second.
    async fn resend_through(self, level: u32, now_ms: u64, shutdown: CancellationToken) {
        let after_ms = u64::try_from(self.resend_after.as_millis()).unwrap_or(u64::MAX);
        let margin_ms = self.cascade.stranded_margin_ms();
        let position = digit_position(self.cascade.levels(), level);
        let mut from_ms = now_ms.saturating_sub(after_ms);
        let reason = format!(
            "passed level {level}, which stopped dead-lettering or fell far behind, and not seen \
             at the release stage {margin_ms} ms after its due time: published again"
        );
        loop {
            let now_ms = crate::clock::now_ms();
            let to_ms = now_ms.saturating_sub(margin_ms).max(from_ms);
            match self
                .ledger
                .resend_unreleased((from_ms, to_ms), position, now_ms, &reason)
                .await
            {
                Ok(ids) => {
                    from_ms = to_ms;
                    if !ids.is_empty() {
                        self.metrics.tasks_resent.inc_by(ids.len() as u64);
                        warn!(
                            level,
                            tasks = ids.len(),
                            "tasks held by a stranded level: published again"
                        );
                    }
                }
                Err(error) => warn!(%error, level, "cannot look for tasks a stranded level holds"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(RESEND_POLL) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_resend_loop_a_level_however_many_shards_have_it_stranded() {
        let resends = Resends::default();
        let shutdown = CancellationToken::new();
        let first = resends
            .taken(4, &shutdown)
            .expect("the first shard starts it");
        assert!(resends.taken(4, &shutdown).is_none(), "a second does not");
        assert!(
            resends.taken(5, &shutdown).is_some(),
            "another level has its own"
        );
        resends.handed_back(4);
        assert!(!first.is_cancelled(), "one shard still has it stranded");
        resends.handed_back(4);
        assert!(first.is_cancelled(), "stopped with the last");
        // Taken again later: a loop of its own again.
        assert!(resends.taken(4, &shutdown).is_some());
        resends.handed_back(9);
    }
}
