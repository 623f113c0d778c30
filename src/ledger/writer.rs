//! Group commit: the request path's and the release stage's writes, batched
//! into one transaction.
//!
//! Every write is a message to a single writer task, answered once the
//! transaction holding it has committed. While one transaction commits, the
//! writes of every request that arrives meanwhile queue up, and the next
//! transaction takes them all: one commit (and one fsync) per group, not per
//! task, so the ledger keeps up with the broker instead of becoming the limit.
//!
//! A group's transaction runs in steps, each a method of
//! [`super::transaction::Tx`]: admit the new tasks ([`super::admit`]), mark
//! the confirmed ones scheduled (in the revision confirmed), schedule
//! retries, quarantine, mark released tasks delivered, and claim the release
//! stage's due tasks ([`super::claim`]). The SQL of each step is in
//! [`super::sql`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error};

use super::admit::{Admission, Judged, admit};
use super::claim::{ClaimAsk, Finding, UnstageInput, claim, hold_claimed, stage_claimed};
use super::error::LedgerError;
use super::pass::{Pass, PassInput, pass_in};
use super::plan::{PageFound, PlanWrite, plan_in};
use super::record::db_ms;
use super::record::{Republish, Row};
use super::sql::statement_sized_chunks;
use super::transaction::{Store, Tx};

/// Most writes in one transaction.
const MAX_GROUP: usize = 512;
/// Writes that may wait for the writer before callers wait to enqueue.
const QUEUE: usize = 8 * MAX_GROUP;
/// Tries of one group's transaction that PostgreSQL breaks off for a deadlock.
const CONFLICT_ATTEMPTS: u64 = 5;

type Reply<T> = oneshot::Sender<Result<T, LedgerError>>;

enum Write {
    /// A new task; with `unparks`, the parked message it replays, deleted
    /// in the same transaction once the task is recorded (or found
    /// recorded by an earlier replay).
    Admit {
        row: Box<Row>,
        unparks: Option<String>,
        reply: Reply<Admission>,
    },
    Published {
        id: String,
        revision: u64,
        reply: Reply<()>,
    },
    Republish {
        id: String,
        revision: u64,
        republish: Republish,
        reply: Reply<()>,
    },
    Failed {
        id: String,
        /// Only this revision; any revision when `None`.
        revision: Option<u64>,
        reason: String,
        reply: Reply<()>,
    },
    Delivered {
        ids: Vec<String>,
        at_ms: u64,
        reply: Reply<()>,
    },
    /// Due tasks claimed; those claimed that name a limit wait for it
    /// instead, in the same transaction, and those that name a moment
    /// are staged until it.
    Claim {
        asks: Vec<ClaimAsk>,
        limits: Limits,
        reply: Reply<Vec<Finding>>,
    },
    /// Staged tasks taken for release.
    Unstage {
        input: UnstageInput,
        reply: Reply<Vec<Row>>,
    },
    /// One pass of the limiter.
    Pass {
        input: Box<PassInput>,
        reply: Reply<Pass>,
    },
    /// A page of the schedules' planner.
    Plan {
        page: Box<PlanWrite>,
        reply: Reply<PageFound>,
    },
}

#[derive(Clone)]
pub(super) struct Handle {
    writes: mpsc::Sender<Write>,
}

/// What the group commit reports: how many writes each transaction
/// commits, and how long each took (from its first statement to its
/// commit, retries of a conflict included).
#[derive(Clone)]
pub struct CommitObservers {
    pub group_size: Histogram,
    pub seconds: Histogram,
}

impl CommitObservers {
    /// For a command or a test, whose commits nobody observes.
    pub fn unobserved() -> CommitObservers {
        CommitObservers {
            group_size: Histogram::new([1.0]),
            seconds: Histogram::new([1.0]),
        }
    }
}

/// Starts the writer. It keeps `pending` up to date with what it commits.
/// The payload is cut down to `payload_copy_bytes` when a task is published,
/// or, with `keep_payload_until_delivered` (the release stage, where a
/// scheduled task may be moved and published again), when it is delivered.
///
/// On SQLite the writer runs on a thread of its own, with a runtime of its
/// own: its statements (and each commit's `fsync`) block that thread, never
/// the service's workers. On PostgreSQL it is a task like any other.
pub(super) fn spawn(
    store: Store,
    payload_copy_bytes: u32,
    keep_payload_until_delivered: bool,
    commits: CommitObservers,
    pending: Arc<PendingCount>,
    holder: i64,
) -> Result<Handle, LedgerError> {
    let (writes, queue) = mpsc::channel(QUEUE);
    let on_own_thread = matches!(store, Store::Sqlite(_));
    let writer = Writer {
        store,
        payload_copy_bytes,
        keep_payload_until_delivered,
        commits,
        pending,
        holder,
    };
    if on_own_thread {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(LedgerError::WriterThread)?;
        std::thread::Builder::new()
            .name("ledger-writer".to_owned())
            .spawn(move || runtime.block_on(writer.run(queue)))
            .map_err(LedgerError::WriterThread)?;
    } else {
        tokio::spawn(writer.run(queue));
    }
    Ok(Handle { writes })
}

impl Handle {
    async fn send<T>(&self, write: impl FnOnce(Reply<T>) -> Write) -> Result<T, LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.writes
            .send(write(reply))
            .await
            .map_err(|_| LedgerError::Closed)?;
        answer.await.map_err(|_| LedgerError::Closed)?
    }

    /// One pass of the limiter, in the next group's transaction.
    pub async fn pass(&self, input: PassInput) -> Result<Pass, LedgerError> {
        self.send(|reply| Write::Pass {
            input: Box::new(input),
            reply,
        })
        .await
    }

    pub async fn admit(&self, row: Row, unparks: Option<String>) -> Result<Admission, LedgerError> {
        self.send(|reply| Write::Admit {
            row: Box::new(row),
            unparks,
            reply,
        })
        .await
    }

    pub async fn published(&self, id: String, revision: u64) -> Result<(), LedgerError> {
        self.send(|reply| Write::Published {
            id,
            revision,
            reply,
        })
        .await
    }

    pub async fn republish(
        &self,
        id: String,
        revision: u64,
        republish: Republish,
    ) -> Result<(), LedgerError> {
        self.send(|reply| Write::Republish {
            id,
            revision,
            republish,
            reply,
        })
        .await
    }

    pub async fn failed(
        &self,
        id: String,
        revision: Option<u64>,
        reason: String,
    ) -> Result<(), LedgerError> {
        self.send(|reply| Write::Failed {
            id,
            revision,
            reason,
            reply,
        })
        .await
    }

    pub async fn delivered(&self, ids: Vec<String>, at_ms: u64) -> Result<(), LedgerError> {
        self.send(|reply| Write::Delivered { ids, at_ms, reply })
            .await
    }

    pub async fn claim(
        &self,
        asks: Vec<ClaimAsk>,
        limits: Limits,
    ) -> Result<Vec<Finding>, LedgerError> {
        self.send(|reply| Write::Claim {
            asks,
            limits,
            reply,
        })
        .await
    }

    pub async fn unstage(&self, input: UnstageInput) -> Result<Vec<Row>, LedgerError> {
        self.send(|reply| Write::Unstage { input, reply }).await
    }

    pub async fn plan(&self, page: PlanWrite) -> Result<PageFound, LedgerError> {
        self.send(|reply| Write::Plan {
            page: Box::new(page),
            reply,
        })
        .await
    }
}

/// One group, split by kind; each keeps its callers' reply channels.
#[derive(Default)]
struct Group {
    admits: Vec<(Box<Row>, Option<String>, Reply<Admission>)>,
    published: Vec<((String, i64), Reply<()>)>,
    republishes: Vec<(String, u64, Republish, Reply<()>)>,
    failed: Vec<(String, Option<u64>, String, Reply<()>)>,
    delivered: Vec<(Vec<String>, u64, Reply<()>)>,
    claims: Vec<ClaimAsked>,
    passes: Vec<(Box<PassInput>, Reply<Pass>)>,
    unstages: Vec<(UnstageInput, Reply<Vec<Row>>)>,
    plans: Vec<(Box<PlanWrite>, Reply<PageFound>)>,
}

/// What the release stage knows of the limits, for a claim that may let
/// its held tasks go at once.
type Limits = Option<Box<PassInput>>;
/// A claim as a group holds it, with its caller's reply channel.
type ClaimAsked = (Vec<ClaimAsk>, Limits, Reply<Vec<Finding>>);

/// What a committed group decided: for each admission, and for each claim.
#[derive(Default)]
struct Decided {
    admissions: Vec<Judged>,
    claims: Vec<Vec<Finding>>,
    passes: Vec<Pass>,
    unstaged: Vec<Vec<Row>>,
    plans: Vec<PageFound>,
}

impl Group {
    fn of(writes: Vec<Write>) -> Group {
        let mut group = Group::default();
        for write in writes {
            match write {
                Write::Admit {
                    row,
                    unparks,
                    reply,
                } => group.admits.push((row, unparks, reply)),
                Write::Published {
                    id,
                    revision,
                    reply,
                } => group.published.push(((id, db_ms(revision)), reply)),
                Write::Republish {
                    id,
                    revision,
                    republish,
                    reply,
                } => group.republishes.push((id, revision, republish, reply)),
                Write::Failed {
                    id,
                    revision,
                    reason,
                    reply,
                } => group.failed.push((id, revision, reason, reply)),
                Write::Delivered { ids, at_ms, reply } => group.delivered.push((ids, at_ms, reply)),
                Write::Claim {
                    asks,
                    limits,
                    reply,
                } => group.claims.push((asks, limits, reply)),
                Write::Pass { input, reply } => group.passes.push((input, reply)),
                Write::Unstage { input, reply } => group.unstages.push((input, reply)),
                Write::Plan { page, reply } => group.plans.push((page, reply)),
            }
        }
        group
    }

    /// Answers every caller: admissions and claims with what was decided
    /// for each, the others with `()`; or everyone with the failure that
    /// broke the group.
    fn answer(self, outcome: Result<Decided, LedgerError>) {
        let (decided, failure) = match outcome {
            Ok(decided) => (decided, None),
            Err(failure) => {
                error!(error = %failure, "ledger write failed");
                (Decided::default(), Some(Arc::new(failure)))
            }
        };
        let Decided {
            admissions,
            claims,
            passes,
            unstaged,
            plans,
        } = decided;
        let result = || match &failure {
            None => Ok(()),
            Some(failure) => Err(LedgerError::Shared(failure.clone())),
        };
        let mut admissions = admissions.into_iter();
        for (.., reply) in self.admits {
            let answer = result().and_then(|()| match admissions.next() {
                Some(judged) => judged.into_admission(),
                None => Err(LedgerError::Closed),
            });
            let _ = reply.send(answer);
        }
        let mut claims = claims.into_iter();
        for (.., reply) in self.claims {
            let answer = result().and_then(|()| claims.next().ok_or(LedgerError::Closed));
            let _ = reply.send(answer);
        }
        let mut passes = passes.into_iter();
        for (_, reply) in self.passes {
            let answer = result().and_then(|()| passes.next().ok_or(LedgerError::Closed));
            let _ = reply.send(answer);
        }
        let mut unstaged = unstaged.into_iter();
        for (_, reply) in self.unstages {
            let answer = result().and_then(|()| unstaged.next().ok_or(LedgerError::Closed));
            let _ = reply.send(answer);
        }
        let mut plans = plans.into_iter();
        for (_, reply) in self.plans {
            let answer = result().and_then(|()| plans.next().ok_or(LedgerError::Closed));
            let _ = reply.send(answer);
        }
        let others = (self.published.into_iter().map(|(_, reply)| reply))
            .chain(self.republishes.into_iter().map(|(.., reply)| reply))
            .chain(self.failed.into_iter().map(|(.., reply)| reply))
            .chain(self.delivered.into_iter().map(|(.., reply)| reply));
        for reply in others {
            let _ = reply.send(result());
        }
    }
}

struct Writer {
    store: Store,
    payload_copy_bytes: u32,
    keep_payload_until_delivered: bool,
    commits: CommitObservers,
    pending: Arc<PendingCount>,
    /// Written beside each lease the group's statements take.
    holder: i64,
}

impl Writer {
    async fn run(mut self, mut queue: mpsc::Receiver<Write>) {
        let mut writes = Vec::with_capacity(MAX_GROUP);
        while queue.recv_many(&mut writes, MAX_GROUP).await > 0 {
            self.commits.group_size.observe(writes.len() as f64);
            let group = Group::of(std::mem::take(&mut writes));
            let started = std::time::Instant::now();
            let outcome = self.transact_until_settled(&group).await;
            (self.commits.seconds).observe(started.elapsed().as_secs_f64());
            group.answer(outcome);
        }
    }

    /// [`Writer::transact`], run again when PostgreSQL broke it off to end a
    /// deadlock with another replica's group (nothing of it was
    /// committed): answering the error instead would leave claims to be
    /// redelivered and delivered marks unmade, for a conflict that a second
    /// try, a few milliseconds later, does not meet.
    async fn transact_until_settled(&mut self, group: &Group) -> Result<Decided, LedgerError> {
        let mut attempt = 1;
        loop {
            match self.transact(group).await {
                Err(error) if error.is_transient_conflict() && attempt < CONFLICT_ATTEMPTS => {
                    debug!(%error, attempt, "a group's transaction met another's; trying again");
                    tokio::time::sleep(Duration::from_millis(2 * attempt)).await;
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    /// One transaction for the whole group; the pending count follows what
    /// it committed.
    async fn transact(&mut self, group: &Group) -> Result<Decided, LedgerError> {
        let mut tx = Tx::begin(&mut self.store).await?;
        let rows: Vec<&Row> = group.admits.iter().map(|(row, ..)| row.as_ref()).collect();
        let admissions = admit(&mut tx, &rows).await?;
        let replayed: Vec<&str> = (group.admits.iter().zip(&admissions))
            .filter(|(_, judged)| !matches!(judged, Judged::Conflict(_)))
            .filter_map(|((_, unparks, _), _)| unparks.as_deref())
            .collect();
        tx.unpark(&replayed).await?;
        let mut plans = Vec::with_capacity(group.plans.len());
        for (page, _) in &group.plans {
            plans.push(plan_in(&mut tx, page).await?);
        }
        let ids: Vec<(&str, i64)> = group
            .published
            .iter()
            .map(|((id, revision), _)| (id.as_str(), *revision))
            .collect();
        let now_ms = db_ms(crate::clock::now_ms());
        let trim_on_publish = !self.keep_payload_until_delivered;
        let mut published = 0;
        for chunk in statement_sized_chunks(&ids) {
            published += tx
                .mark_published(chunk, now_ms, trim_on_publish, self.payload_copy_bytes)
                .await?;
        }
        for (id, revision, republish, _) in &group.republishes {
            tx.schedule_republish(id, *revision, republish, self.holder)
                .await?;
        }
        let mut failed_pending = 0;
        for (id, revision, reason, _) in &group.failed {
            failed_pending += u64::from(tx.mark_failed(id, *revision, reason).await?);
        }
        for (ids, at_ms, _) in &group.delivered {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            for chunk in statement_sized_chunks(&ids) {
                tx.mark_delivered(chunk, db_ms(*at_ms), self.payload_copy_bytes)
                    .await?;
            }
        }
        let mut claims = Vec::with_capacity(group.claims.len());
        let mut claimed_pending = 0;
        for (asks, limits, _) in &group.claims {
            let (mut findings, were_pending) = claim(&mut tx, asks).await?;
            hold_claimed(&mut tx, asks, &mut findings, limits.as_deref()).await?;
            stage_claimed(&mut tx, asks, &mut findings).await?;
            claims.push(findings);
            claimed_pending += were_pending;
        }
        // Last: a pass releases what this group's holds made wait.
        let mut passes = Vec::with_capacity(group.passes.len());
        for (input, _) in &group.passes {
            passes.push(pass_in(&mut tx, input, self.holder).await?);
        }
        let mut unstaged = Vec::with_capacity(group.unstages.len());
        for (input, _) in &group.unstages {
            let by = (input.by_ms, input.others_by_ms);
            let lease = (input.lease_until_ms, self.holder);
            let taken = tx.unstage(by, input.own, lease, input.most);
            unstaged.push(taken.await?);
        }
        tx.commit().await?;
        let admitted = newly_pending(group, &rows, &admissions, &plans);
        self.pending.add(admitted as u64);
        self.pending
            .remove(published + failed_pending + claimed_pending);
        Ok(Decided {
            admissions,
            claims,
            passes,
            unstaged,
            plans,
        })
    }
}

/// The tasks a group admitted as new and pending: only those wait for the
/// broker (a staged one waits for its moment in the ledger alone).
fn newly_pending(
    group: &Group,
    rows: &[&Row],
    admissions: &[Judged],
    plans: &[PageFound],
) -> usize {
    let admitted = (rows.iter().zip(admissions))
        .filter(|(row, judged)| **judged == Judged::New && row.is_pending())
        .count();
    let planned: usize = (group.plans.iter().zip(plans))
        .map(|((page, _), found)| page.admitted_pending(found))
        .sum();
    admitted + planned
}

/// Tasks waiting for the broker: the bound that answers 503 before the disk
/// fills. The writer follows what it commits; a recount every
/// a periodic recount (`handle`) adds what other replicas did.
#[derive(Debug, Default)]
pub(crate) struct PendingCount(AtomicU64);

impl PendingCount {
    pub(super) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    pub(super) fn set(&self, count: u64) {
        self.0.store(count, Ordering::Relaxed);
    }

    pub(super) fn add(&self, added: u64) {
        self.0.fetch_add(added, Ordering::Relaxed);
    }

    pub(super) fn remove(&self, removed: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(removed))
            });
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::cascade::CascadeSettings;
    use crate::ledger::WaitsFor;
    use crate::task::{Task, TaskState};

    fn row() -> Row {
        let cascade = CascadeSettings::default().validate().unwrap();
        let body = br#"{"destination": "d", "delay_ms": 1000}"#;
        let task = Task::parse(body, &cascade, SystemTime::now()).unwrap();
        let lease = crate::ledger::record::Lease {
            until_ms: 0,
            holder: 1,
        };
        Row::pending(&task, None, None, lease)
    }

    /// The count a bulk cancel offers stops at the cap it is given: the
    /// console counts a destination of millions only that far.
    #[tokio::test]
    async fn the_count_a_cancel_could_change_stops_at_its_cap() {
        let (ledger, dir) = crate::ledger::handle::scratch_sqlite().await;
        for _ in 0..12 {
            ledger.writes.admit(row(), None).await.unwrap();
        }
        for (at_most, counted) in [(5, 5), (12, 12), (100, 12)] {
            let count = ledger
                .count_changeable("d", (u64::MAX, at_most), None, None)
                .await
                .unwrap();
            assert_eq!(count, counted, "at most {at_most}");
        }
        let pending = ledger
            .count_changeable("d", (u64::MAX, 100), Some(TaskState::Pending), None)
            .await
            .unwrap();
        assert_eq!(pending, 12);
        ledger.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A task admitted staged (a burst's the levels have no room for): in
    /// the ledger alone at once, not counted as waiting for the broker,
    /// taken at its moment in admission order (not by id), and counted in
    /// the forecast as any task on its way.
    #[tokio::test]
    async fn a_task_admitted_staged_waits_for_no_broker_and_is_taken_in_admission_order() {
        use crate::ledger::{Entry, UnstageInput};
        let (ledger, dir) = crate::ledger::handle::scratch_sqlite().await;
        let own = crate::clock::source();
        let lease = crate::ledger::record::Lease {
            until_ms: 0,
            holder: 1,
        };
        let cascade = CascadeSettings::default().validate().unwrap();
        let mut staged = Vec::new();
        // Ids against admission order: "z…" first, "a…" last.
        for (n, id) in ["z-first", "m-second", "a-third"].into_iter().enumerate() {
            let body = format!(r#"{{"id": "{id}", "destination": "d", "delay_ms": 60000}}"#);
            let mut task = Task::parse(body.as_bytes(), &cascade, SystemTime::now()).unwrap();
            task.accepted_at_ms += n as u64;
            task.deliver_at_ms = 5_000;
            let row = Row::new(&task, (None, None), lease, Entry::Staged { by: own });
            assert!(!row.is_pending());
            ledger.writes.admit(row, None).await.unwrap();
            staged.push(id);
        }
        ledger.writes.admit(row(), None).await.unwrap();
        assert_eq!(
            ledger.pending_estimate(),
            1,
            "only the pending task waits for the broker"
        );
        let seen = ledger.get("a-third").await.unwrap().unwrap();
        assert_eq!(
            (seen.state, seen.release_at_ms, seen.published_at_ms),
            (TaskState::Staged, Some(5_000), None)
        );
        assert_eq!(
            ledger.next_staged_ms(own, 10_000).await.unwrap(),
            Some(5_000)
        );
        let take = UnstageInput {
            by_ms: 5_000,
            others_by_ms: 0,
            own,
            lease_until_ms: 10_000,
            most: 10,
        };
        let taken = ledger.unstage(take).await.unwrap();
        let ids: Vec<&str> = taken.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, staged, "in admission order");
        assert!(
            taken.iter().all(|t| t.payload.is_some()),
            "whole payloads kept"
        );
        ledger.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A staged task: claimed and staged in one commit, taken back only
    /// once its moment is near, in release order, staged again when its
    /// take's lease runs out or its publish failed, delivered once marked;
    /// a cancel applies while it is staged; a copy found staged is no task
    /// to stage again.
    #[tokio::test]
    async fn a_staged_task_is_taken_back_at_its_moment_and_a_lease_that_runs_out_stages_it_again() {
        use crate::ledger::{Cancel, UnstageInput};
        let (ledger, dir) = crate::ledger::handle::scratch_sqlite().await;
        let rows = [row(), row(), row()];
        for row in &rows {
            ledger.writes.admit(row.clone(), None).await.unwrap();
        }
        let revision = u64::try_from(rows[0].revision).unwrap();
        let asks: Vec<ClaimAsk> = rows
            .iter()
            .zip([5_000, 3_000, 4_000])
            .map(|(r, until)| ClaimAsk {
                stage_until: Some(until),
                ..ClaimAsk::of(r.id.clone(), revision)
            })
            .collect();
        let findings = ledger.stage(asks.clone()).await.unwrap();
        assert_eq!(findings, vec![Finding::Staged; 3]);
        let again = ledger.stage(asks[..1].to_vec()).await.unwrap();
        assert_eq!(
            again,
            vec![Finding::Found {
                state: TaskState::Staged,
                revision
            }]
        );
        let own = crate::clock::source();
        assert_eq!(
            ledger.next_staged_ms(own, 10_000).await.unwrap(),
            Some(3_000)
        );
        assert_eq!(
            ledger.next_staged_ms("another", 10_000).await.unwrap(),
            Some(13_000),
            "another process's moment, 10 s later"
        );
        let others = UnstageInput {
            by_ms: 12_999,
            others_by_ms: 2_999,
            own: "another",
            lease_until_ms: 0,
            most: 10,
        };
        assert!(ledger.unstage(others).await.unwrap().is_empty());
        let staged = ledger.get(&rows[1].id).await.unwrap().unwrap();
        assert_eq!(
            (staged.state, staged.release_at_ms),
            (TaskState::Staged, Some(3_000))
        );

        // Staged by this process: taken at their moments (another's only
        // by `others_by_ms`).
        let take = |by_ms, lease_until_ms| UnstageInput {
            by_ms,
            others_by_ms: 0,
            own: crate::clock::source(),
            lease_until_ms,
            most: 10,
        };
        assert!(
            ledger
                .unstage(take(2_999, 10_000))
                .await
                .unwrap()
                .is_empty()
        );
        let taken = ledger.unstage(take(4_000, 10_000)).await.unwrap();
        let ids: Vec<&str> = taken.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(
            ids,
            [rows[1].id.as_str(), rows[2].id.as_str()],
            "in release order"
        );
        assert!(taken.iter().all(|t| t.state == TaskState::Releasing));
        // A cancel comes too late for a task taken, and in time for one staged.
        let cancels = ledger
            .cancel(&[rows[1].id.clone(), rows[0].id.clone()], None, 1)
            .await
            .unwrap();
        assert!(
            matches!(cancels[0], Cancel::Unchangeable(_)),
            "{:?}",
            cancels[0]
        );
        assert!(
            matches!(cancels[1], Cancel::Cancelled(_)),
            "{:?}",
            cancels[1]
        );
        // The take's lease runs out: staged again, taken again at once.
        assert_eq!(ledger.return_expired_stages(9_999).await.unwrap(), 0);
        assert_eq!(ledger.return_expired_stages(10_001).await.unwrap(), 2);
        let taken = ledger.unstage(take(4_000, 20_000)).await.unwrap();
        assert_eq!(taken.len(), 2);
        ledger.stage_again(&[rows[2].id.clone()]).await.unwrap();
        ledger
            .mark_delivered(vec![rows[1].id.clone()], 4_100)
            .await
            .unwrap();
        let delivered = ledger.get(&rows[1].id).await.unwrap().unwrap();
        let again = ledger.get(&rows[2].id).await.unwrap().unwrap();
        assert_eq!(
            (delivered.state, again.state),
            (TaskState::Delivered, TaskState::Staged)
        );
        // Onto a chain without a release stage: pending, for the forwarder.
        assert_eq!(ledger.forward_staged(5_000).await.unwrap(), 1);
        let forwarded = ledger.get(&rows[2].id).await.unwrap().unwrap();
        assert_eq!(
            (forwarded.state, forwarded.release_at_ms),
            (TaskState::Pending, None)
        );
        ledger.close().await;
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Tasks past their deadline are marked expired in one transaction,
    /// each only in the revision that expired and only while not final: a
    /// take's worth of them costs one commit, not one a task.
    #[tokio::test]
    async fn expired_tasks_are_marked_together_each_in_its_revision_and_never_once_final() {
        let (ledger, dir) = crate::ledger::handle::scratch_sqlite().await;
        let rows: Vec<Row> = (0..300).map(|_| row()).collect();
        for row in &rows {
            ledger.writes.admit(row.clone(), None).await.unwrap();
        }
        ledger.cancel(&[rows[0].id.clone()], None, 1).await.unwrap();
        let mut expired: Vec<crate::ledger::Expiry> = rows
            .iter()
            .map(|row| crate::ledger::Expiry {
                id: row.id.clone(),
                revision: u64::try_from(row.revision).unwrap(),
                at_ms: 7_000,
                why: "its deadline passed".to_owned(),
            })
            .collect();
        // Not the row's revision (as when it was moved since): left alone.
        expired[1].revision += 1;
        assert_eq!(ledger.mark_expired(&expired).await.unwrap(), 298);
        let state = async |row: &Row| ledger.get(&row.id).await.unwrap().unwrap().state;
        assert_eq!(state(&rows[0]).await, TaskState::Cancelled);
        assert_eq!(state(&rows[1]).await, TaskState::Pending);
        for row in &rows[2..] {
            assert_eq!(state(row).await, TaskState::Expired);
        }
        assert_eq!(ledger.mark_expired(&[]).await.unwrap(), 0);
        ledger.close().await;
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A claim holds the claimed tasks a limit names in the same commit:
    /// `waiting` for that limit, the others `releasing`; a task not
    /// claimed (here: an older revision) is not held.
    #[tokio::test]
    async fn a_claim_holds_what_a_limit_names_in_its_own_commit() {
        let (ledger, dir) = crate::ledger::handle::scratch_sqlite().await;
        let rows = [row(), row(), row()];
        for row in &rows {
            ledger.writes.admit(row.clone(), None).await.unwrap();
        }
        let revision = u64::try_from(rows[0].revision).unwrap();
        let paced = |id: &str, revision| ClaimAsk {
            waits_for: Some(waits_for("pace")),
            ..ClaimAsk::of(id.to_owned(), revision)
        };
        let asks = vec![
            ClaimAsk::of(rows[0].id.clone(), revision),
            paced(&rows[1].id, revision),
            paced(&rows[2].id, revision + 1),
        ];
        let findings = ledger.claim_release(asks, None).await.unwrap();
        assert_eq!(findings[..2], [Finding::Claimed, Finding::Waiting]);
        assert!(matches!(findings[2], Finding::Found { .. }));
        let stored = async |i: usize| ledger.get(&rows[i].id).await.unwrap().unwrap();
        let (released, held, other) = (stored(0).await, stored(1).await, stored(2).await);
        assert_eq!(
            (released.state.as_str(), released.waited_for),
            ("releasing", None)
        );
        assert_eq!(
            (held.state.as_str(), held.waited_for.as_deref()),
            ("waiting", Some("pace"))
        );
        assert_eq!((other.state.as_str(), other.waited_for), ("pending", None));
        ledger.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn waits_for(limit: &str) -> WaitsFor {
        WaitsFor {
            limit: limit.to_owned(),
            destination: "d".to_owned(),
        }
    }

    /// With the limits given, a claim lets go at once what a pass would
    /// (a token each), holds the rest, and lets nothing overtake a task
    /// that waits: a full bucket later still holds the next task. A pass
    /// that releases the last waiting task says its destination drained.
    #[tokio::test]
    async fn a_claim_lets_go_what_the_limits_allow_and_holds_the_rest() {
        use crate::auth::DestinationPattern;
        use crate::limit::{Limit, Rate};
        let (ledger, dir) = crate::ledger::handle::scratch_sqlite().await;
        let now_ms = crate::clock::now_ms();
        let limit = Limit {
            name: "pace".to_owned(),
            destinations: DestinationPattern::parse("d").unwrap(),
            rate: Some(Rate {
                per_sec: 1.0,
                burst: 2,
            }),
            paused: false,
            paused_until_ms: None,
            depth: None,
        };
        ledger.put_limit(&limit, None, now_ms).await.unwrap();
        // Due already, so that any pass below may release them.
        let rows: Vec<Row> = (0..4)
            .map(|_| Row {
                deliver_at_ms: now_ms as i64 - 1_000,
                ..row()
            })
            .collect();
        for row in &rows {
            ledger.writes.admit(row.clone(), None).await.unwrap();
        }
        let input = |now_ms| PassInput {
            now_ms,
            lease_until_ms: now_ms,
            destinations: Vec::new(),
            caps: std::collections::HashMap::new(),
            most: usize::MAX,
        };
        let claim = async |rows: &[Row], now_ms| {
            let asks = rows
                .iter()
                .map(|r| ClaimAsk {
                    waits_for: Some(waits_for("pace")),
                    ..ClaimAsk::of(r.id.clone(), 1)
                })
                .collect();
            ledger
                .claim_release(asks, Some(input(now_ms)))
                .await
                .unwrap()
        };
        assert_eq!(
            claim(&rows[..3], now_ms).await,
            [Finding::Claimed, Finding::Claimed, Finding::Waiting]
        );
        let released = ledger.limit("pace").await.unwrap().unwrap().released;
        assert_eq!(released, 2, "the tokens taken are counted as released");
        // Ten seconds on the bucket is full again, but a task waits.
        assert_eq!(claim(&rows[3..], now_ms + 10_000).await, [Finding::Waiting]);
        let stored = ledger.get(&rows[0].id).await.unwrap().unwrap();
        assert_eq!(
            (stored.state.as_str(), stored.waited_for),
            ("releasing", None)
        );
        // A pass with a token for one of the two waiting: "d" still waits.
        let pass = async |now_ms| {
            let mut input = input(now_ms);
            input.destinations = vec!["d".to_owned()];
            ledger.limiter_pass(input).await.unwrap()
        };
        let first = pass(now_ms + 1_500).await;
        assert_eq!((first.released.len(), first.drained.len()), (1, 0));
        let second = pass(now_ms + 2_500).await;
        assert_eq!(second.released.len(), 1);
        assert_eq!(second.drained, ["d"], "every waiting task released");
        ledger.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Moves the admitted `row` a second later (its revision 2).
    async fn move_a_second_later(ledger: &crate::ledger::Ledger, row: &Row) {
        let change = crate::ledger::Move {
            deliver_at_ms: u64::try_from(row.deliver_at_ms).unwrap() + 1_000,
            delay_ms: 2_000,
            routing_key: row.routing_key.clone(),
            lease_until_ms: 0,
            deadline_ms: None,
        };
        let moved = ledger.reschedule(&row.id, &change, None, None, 0).await;
        assert!(
            matches!(moved, Ok(crate::ledger::Reschedule::Moved(_))),
            "{moved:?}"
        );
    }

    /// One window may carry a late copy of a moved task's old revision
    /// beside its new one: only the new one is claimed, and the old one is
    /// found in the new revision (stale, dropped), in either order.
    #[tokio::test]
    async fn a_window_with_both_revisions_of_a_moved_task_claims_only_the_new_one() {
        let (ledger, dir) = crate::ledger::handle::scratch_sqlite().await;
        let moved = [row(), row()];
        for row in &moved {
            ledger.writes.admit(row.clone(), None).await.unwrap();
            move_a_second_later(&ledger, row).await;
        }
        let windows = [
            vec![(moved[0].id.clone(), 1), (moved[0].id.clone(), 2)],
            vec![(moved[1].id.clone(), 2), (moved[1].id.clone(), 1)],
        ];
        for due in windows {
            let asks = due.iter().cloned().map(|(id, r)| ClaimAsk::of(id, r));
            let findings = ledger.claim_release(asks.collect(), None).await.unwrap();
            for ((_, revision), finding) in due.iter().zip(&findings) {
                // The release stage drops a message found in a newer revision.
                let expected = if *revision == 2 {
                    Finding::Claimed
                } else {
                    Finding::Found {
                        state: crate::task::TaskState::Releasing,
                        revision: 2,
                    }
                };
                assert_eq!(*finding, expected, "revision {revision}");
            }
        }
        ledger.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The scheduled mark is bound to the revision that was published: a
    /// confirm for a task's old revision, come after the task moved, leaves
    /// it pending (its new copy's confirm marks it), while another task's
    /// mark sent beside it still takes.
    #[tokio::test]
    async fn a_scheduled_mark_for_an_old_revision_leaves_the_task_pending() {
        let (ledger, dir) = crate::ledger::handle::scratch_sqlite().await;
        let (moved, kept) = (row(), row());
        for row in [&moved, &kept] {
            ledger.writes.admit(row.clone(), None).await.unwrap();
        }
        move_a_second_later(&ledger, &moved).await;
        let state = async |id: &str| {
            let stored = ledger.get(id).await.unwrap().unwrap();
            (stored.state.as_str().to_owned(), stored.revision)
        };
        let (late, current) = (
            ledger.writes.published(moved.id.clone(), 1),
            ledger.writes.published(kept.id.clone(), 1),
        );
        let (late, current) = tokio::join!(late, current);
        late.unwrap();
        current.unwrap();
        assert_eq!(state(&moved.id).await, ("pending".to_owned(), 2));
        assert_eq!(state(&kept.id).await, ("scheduled".to_owned(), 1));
        ledger.writes.published(moved.id.clone(), 2).await.unwrap();
        assert_eq!(state(&moved.id).await, ("scheduled".to_owned(), 2));
        ledger.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The counts of what falls due, and a recount of the tasks on their
    /// way, per minute and destination.
    async fn counts_and_recount(
        ledger: &crate::ledger::Ledger,
    ) -> (Vec<(i64, String, i64)>, Vec<(i64, String, i64)>) {
        let super::super::pool::Pool::Sqlite(pool) = &ledger.pool else {
            unreachable!("a SQLite ledger");
        };
        let read = async |sql: &str| -> Vec<(i64, String, i64)> {
            sqlx::query_as(sql).fetch_all(pool).await.unwrap()
        };
        let counts = read("SELECT minute_ms, destination, tasks FROM due_counts ORDER BY 1, 2");
        let recount = read(
            "SELECT deliver_at_ms / 60000 * 60000, destination, COUNT(*) FROM tasks \
             WHERE state IN ('pending', 'scheduled', 'releasing', 'waiting', 'staged') \
             GROUP BY 1, 2 ORDER BY 1, 2",
        );
        (counts.await, recount.await)
    }

    /// The writer's connection runs without the forecast's triggers and
    /// counts what its own statements change, once a group: through
    /// admissions (a repeat among them), a confirm, quarantines of a
    /// pending and of a scheduled task, a claim (of a failed task too), a
    /// hold for a limit and deliveries, the counts stay a recount of the
    /// tasks on their way. A cancel on another connection is still counted
    /// by the triggers.
    #[tokio::test]
    async fn the_writer_counts_what_falls_due_as_the_triggers_would() {
        let (ledger, dir) = crate::ledger::handle::scratch_sqlite().await;
        let now_ms = i64::try_from(crate::clock::now_ms()).unwrap();
        let rows: Vec<Row> = (0..8_i64)
            .map(|i| Row {
                destination: if i % 3 == 0 { "e" } else { "d" }.to_owned(),
                deliver_at_ms: now_ms + i * 25_000,
                ..row()
            })
            .collect();
        for row in rows.iter().chain([&rows[2]]) {
            ledger.writes.admit(row.clone(), None).await.unwrap();
        }
        let (counts, recount) = counts_and_recount(&ledger).await;
        assert_eq!(recount.iter().map(|(.., n)| n).sum::<i64>(), 8);
        assert_eq!(counts, recount, "after admissions");

        let id = |i: usize| rows[i].id.clone();
        for i in 0..5 {
            ledger.mark_published(id(i), 1).await.unwrap();
        }
        ledger
            .mark_failed(id(5), None, "never".into())
            .await
            .unwrap();
        ledger
            .mark_failed(id(1), Some(1), "set aside".into())
            .await
            .unwrap();
        let (counts, recount) = counts_and_recount(&ledger).await;
        assert_eq!(recount.iter().map(|(.., n)| n).sum::<i64>(), 6);
        assert_eq!(counts, recount, "after quarantines");

        let mut asks = [0, 1, 2, 6].map(|i| ClaimAsk::of(id(i), 1)).to_vec();
        asks[2].waits_for = Some(waits_for("pace"));
        let findings = ledger.claim_release(asks, None).await.unwrap();
        assert_eq!(
            findings,
            [
                Finding::Claimed,
                Finding::Claimed,
                Finding::Waiting,
                Finding::Claimed
            ]
        );
        let (counts, recount) = counts_and_recount(&ledger).await;
        assert_eq!(
            recount.iter().map(|(.., n)| n).sum::<i64>(),
            7,
            "the failed task came back"
        );
        assert_eq!(counts, recount, "after the claim");

        ledger
            .mark_delivered(vec![id(0), id(1), id(6)], 0)
            .await
            .unwrap();
        let (counts, recount) = counts_and_recount(&ledger).await;
        assert_eq!(recount.iter().map(|(.., n)| n).sum::<i64>(), 4);
        assert_eq!(counts, recount, "after deliveries");

        let cancelled = ledger.cancel(&[id(7)], None, 0).await.unwrap();
        assert_eq!(cancelled.len(), 1);
        let (counts, recount) = counts_and_recount(&ledger).await;
        assert_eq!(recount.iter().map(|(.., n)| n).sum::<i64>(), 3);
        assert_eq!(counts, recount, "after a cancel on the pool");
        ledger.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A replay's parked message goes in the transaction that records its
    /// task: kept when the task is not recorded (a failed group) or the id
    /// is another request's, deleted with the task recorded, and with the
    /// task found recorded by an earlier replay of the same message.
    #[tokio::test]
    async fn a_replayed_parked_message_goes_in_the_write_that_records_its_task() {
        let (ledger, dir) = crate::ledger::handle::scratch_sqlite().await;
        let parked = |id: &str| crate::ledger::ParkedMessage {
            id: id.to_owned(),
            queue: "q".to_owned(),
            policy: "p".to_owned(),
            reason: "rejected".to_owned(),
            attempts: 3,
            message_id: None,
            payload: b"x".to_vec(),
            properties: lapin::BasicProperties::default(),
            parked_at_ms: 1,
            first_failed_at_ms: None,
        };
        let is_parked = async |id: &str| ledger.parked_message(id).await.unwrap().is_some();
        for id in ["first", "conflict", "again"] {
            ledger.park(&parked(id)).await.unwrap();
        }
        let mut refused = row();
        refused.state = "not a state".to_owned();
        let unparks = |id: &str| Some(id.to_owned());
        let failed = ledger.writes.admit(refused, unparks("first")).await;
        assert!(failed.is_err());
        assert!(is_parked("first").await, "kept: no task was recorded");

        let mut task = row();
        task.fingerprint = Some("replay-of-first".to_owned());
        let admitted = ledger.writes.admit(task.clone(), unparks("first")).await;
        assert_eq!(admitted.unwrap(), Admission::New);
        assert!(!is_parked("first").await, "gone with its task recorded");
        assert!(ledger.get(&task.id).await.unwrap().is_some());

        let mut other = task.clone();
        other.fingerprint = Some("another request".to_owned());
        let conflict = ledger.writes.admit(other, unparks("conflict")).await;
        assert!(matches!(conflict.unwrap(), Admission::Conflict(_)));
        assert!(is_parked("conflict").await, "kept: its task is not this");

        let again = ledger.writes.admit(task.clone(), unparks("again")).await;
        assert!(matches!(again.unwrap(), Admission::Replay(_)));
        assert!(!is_parked("again").await, "gone: its task was recorded");
        ledger.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A group that fails is answered with its failure and rolled back on
    /// the writer's own SQLite connection, which takes the next group as if
    /// nothing had happened (no transaction left open, nothing half written).
    #[tokio::test]
    async fn a_failed_group_is_rolled_back_and_the_next_one_commits() {
        let (ledger, dir) = crate::ledger::handle::scratch_sqlite().await;
        let mut refused = row();
        refused.state = "not a state".to_owned();
        let failure = ledger
            .writes
            .admit(refused.clone(), None)
            .await
            .unwrap_err();
        assert!(failure.to_string().contains("CHECK"), "{failure}");

        let kept = row();
        assert_eq!(
            ledger.writes.admit(kept.clone(), None).await.unwrap(),
            Admission::New
        );
        assert!(ledger.get(&refused.id).await.unwrap().is_none());
        assert!(ledger.get(&kept.id).await.unwrap().is_some());
        ledger.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
