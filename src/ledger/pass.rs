//! The limiter's pass, in the writer's group transaction (on SQLite, the
//! writer's own connection: a pass of its own on sqlx's pool waited for the
//! write lock behind back-to-back group commits and fell far below the
//! rate; BENCHMARKS.md, issue 41), and the limits' rows it reads.
//!
//! A pass locks the limits' rows (on PostgreSQL, passes of several replicas
//! take turns; on SQLite the group already holds the write lock), refills
//! each token bucket, picks waiting tasks in due order per limit (pure:
//! `crate::limit::plan_pass`), moves those it releases to `releasing` under
//! a lease and saves the buckets, all in the group's transaction.

use std::collections::{HashMap, HashSet};

use super::error::LedgerError;
use super::record::{StoredTask, decode_all};
use super::sql::statement_sized_chunks;
use super::transaction::{FromEitherRow, Tx};
use crate::auth::DestinationPattern;
use crate::limit::{Bucket, DepthBound, Limit, Rate, Waiting, plan_pass};

/// A limit as the ledger holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredLimit {
    pub limit: Limit,
    /// Its token bucket as last written (paced limits only).
    pub bucket: Option<Bucket>,
    /// Tasks the limiter released under it so far.
    pub released: u64,
    /// The API client that set it last.
    pub client: Option<String>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
}

pub(super) const LIMIT_COLUMNS: &str = "name, destinations, rate_per_sec, burst, paused, paused_until_ms, \
     depth_queue, depth_messages, tokens, tokens_at_ms, released, client, created_at_ms, \
     updated_at_ms";

#[derive(sqlx::FromRow)]
pub(super) struct LimitRow {
    name: String,
    destinations: String,
    rate_per_sec: Option<f64>,
    burst: Option<i64>,
    paused: i64,
    paused_until_ms: Option<i64>,
    depth_queue: Option<String>,
    depth_messages: Option<i64>,
    tokens: f64,
    tokens_at_ms: i64,
    released: i64,
    client: Option<String>,
    created_at_ms: i64,
    updated_at_ms: i64,
}

pub(super) fn ms(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

impl LimitRow {
    pub(super) fn decode(self) -> Result<StoredLimit, LedgerError> {
        let destinations =
            DestinationPattern::parse(&self.destinations).map_err(|e| LedgerError::Corrupt {
                id: format!("limit {}", self.name),
                reason: e.to_string(),
            })?;
        let rate = match (self.rate_per_sec, self.burst) {
            (Some(per_sec), Some(burst)) => Some(Rate {
                per_sec,
                burst: ms(burst),
            }),
            _ => None,
        };
        let depth = match (self.depth_queue, self.depth_messages) {
            (Some(queue), Some(messages)) => Some(DepthBound {
                queue,
                messages: ms(messages),
            }),
            _ => None,
        };
        Ok(StoredLimit {
            bucket: rate.map(|_| Bucket {
                tokens: self.tokens,
                at_ms: ms(self.tokens_at_ms),
            }),
            limit: Limit {
                name: self.name,
                destinations,
                rate,
                paused: self.paused != 0,
                paused_until_ms: self.paused_until_ms.map(ms),
                depth,
            },
            released: ms(self.released),
            client: self.client,
            created_at_ms: ms(self.created_at_ms),
            updated_at_ms: ms(self.updated_at_ms),
        })
    }
}

impl FromEitherRow for LimitRow {
    fn from_sqlite(row: &rusqlite::Row<'_>) -> rusqlite::Result<LimitRow> {
        Ok(LimitRow {
            name: row.get("name")?,
            destinations: row.get("destinations")?,
            rate_per_sec: row.get("rate_per_sec")?,
            burst: row.get("burst")?,
            paused: row.get("paused")?,
            paused_until_ms: row.get("paused_until_ms")?,
            depth_queue: row.get("depth_queue")?,
            depth_messages: row.get("depth_messages")?,
            tokens: row.get("tokens")?,
            tokens_at_ms: row.get("tokens_at_ms")?,
            released: row.get("released")?,
            client: row.get("client")?,
            created_at_ms: row.get("created_at_ms")?,
            updated_at_ms: row.get("updated_at_ms")?,
        })
    }
}

/// Every limit, its row locked until the pass commits (a write, so that
/// SQLite's transaction holds the write lock from its first statement).
pub(super) fn lock_limits() -> String {
    format!("UPDATE limits SET tokens = tokens RETURNING {LIMIT_COLUMNS}")
}

const SAVE_BUCKET: &str = "UPDATE limits SET tokens = $2, tokens_at_ms = $3, \
     released = released + $4 WHERE name = $1";

/// What one pass of the limiter is given (owned: it crosses to the writer).
#[derive(Clone, Debug)]
pub struct PassInput {
    pub now_ms: u64,
    /// Released tasks are leased until then.
    pub lease_until_ms: u64,
    /// Destinations with waiting tasks.
    pub destinations: Vec<String>,
    /// Most tasks a limit may release now, by name, besides its rate: 0
    /// while it is closed (paused, its queue too deep), room left below
    /// its queue's bound; absent: no bound.
    pub caps: HashMap<String, u64>,
    /// Most tasks released in one pass.
    pub most: usize,
}

/// What one pass did.
#[derive(Clone, Debug, Default)]
pub struct Pass {
    /// Now `releasing`, leased: publish them, then mark them delivered.
    pub released: Vec<StoredTask>,
    /// The limits as the pass left them.
    pub limits: Vec<StoredLimit>,
    /// Destinations of `PassInput::destinations` nothing waits for once
    /// the pass commits (every task that waited was released).
    pub drained: Vec<String>,
}

/// Every limit, its row locked until `tx` commits.
async fn locked_limits(tx: &mut Tx<'_>) -> Result<Vec<StoredLimit>, LedgerError> {
    tx.rows_of::<LimitRow>(&lock_limits(), "locking limits")
        .await?
        .into_iter()
        .map(LimitRow::decode)
        .collect()
}

/// One pass, in the group's transaction `tx`.
pub(super) async fn pass_in(
    tx: &mut Tx<'_>,
    input: &PassInput,
    holder: i64,
) -> Result<Pass, LedgerError> {
    let mut limits = locked_limits(tx).await?;
    let plan = PassPlan::new(&mut limits, input);
    let mut waiting = Vec::new();
    // Destinations read, each drained if the pass leaves nothing of it.
    let mut read: HashSet<&str> = HashSet::new();
    for (destination, wanted) in plan.wanted(&input.destinations, input.most) {
        let found = tx.waiting_of(destination, input.now_ms, wanted).await?;
        read.insert(destination);
        waiting.extend(found.into_iter().map(|(id, due)| Waiting {
            id,
            destination: destination.clone(),
            due_ms: ms(due),
        }));
    }
    let ids = plan.release(&waiting, input.most);
    let going: HashSet<&str> = ids.iter().map(String::as_str).collect();
    for task in waiting.iter().filter(|t| !going.contains(t.id.as_str())) {
        read.remove(task.destination.as_str());
    }
    let read: Vec<String> = read.into_iter().map(str::to_owned).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut released = Vec::with_capacity(ids.len());
    for chunk in statement_sized_chunks(&ids) {
        let rows = tx
            .release_waiting(chunk, (input.lease_until_ms, holder))
            .await?;
        released.extend(decode_all(rows)?);
    }
    // An UPDATE's RETURNING rows come in no promised order: the pass hands
    // them on in due order (ties by id), the order they are published in.
    released.sort_by(|a, b| (a.deliver_at_ms, &a.id).cmp(&(b.deliver_at_ms, &b.id)));
    let destinations: Vec<&str> = released.iter().map(|t| t.destination.as_str()).collect();
    // Drained: nothing waits any more, due by this clock or not.
    let mut drained = Vec::new();
    for destination in read {
        if tx.waiting_of(&destination, u64::MAX, 1).await?.is_empty() {
            drained.push(destination);
        }
    }
    for (i, bucket, taken) in plan.spent(&limits, &destinations) {
        limits[i].bucket = bucket;
        limits[i].released += taken;
        let (tokens, at_ms) = bucket.map_or((0.0, input.now_ms), |b| (b.tokens, b.at_ms));
        tx.save_bucket(SAVE_BUCKET, &limits[i].limit.name, tokens, at_ms, taken)
            .await?;
    }
    Ok(Pass {
        released,
        limits,
        drained,
    })
}

/// Which of `candidates` (a claim's position and destination, in order
/// of time), claimed just now for a release limit, the limits let go at
/// once, their tokens taken: the same rules as a pass ([`plan_pass`]),
/// and none of a limit that tasks wait for, so that nothing overtakes
/// them (those the ledger holds for the candidates' own destinations, and
/// `input.destinations`, which the release stage last saw waiting).
pub(super) async fn release_straight(
    tx: &mut Tx<'_>,
    candidates: &[(usize, &str)],
    input: &PassInput,
) -> Result<HashSet<usize>, LedgerError> {
    let mut limits = locked_limits(tx).await?;
    let mut plan = PassPlan::new(&mut limits, input);
    let mut busy: Vec<&str> = input.destinations.iter().map(String::as_str).collect();
    let mut own: Vec<&str> = candidates.iter().map(|(_, d)| *d).collect();
    own.sort_unstable();
    own.dedup();
    for destination in own {
        if !tx.waiting_of(destination, u64::MAX, 1).await?.is_empty() {
            busy.push(destination);
        }
    }
    // Paused as the rows say now, too: a pause set on another replica may
    // not have reached this one's view yet.
    for (open, limit) in plan.open.iter_mut().zip(&plan.limits) {
        let paused = limit.paused || limit.paused_until_ms.is_some_and(|u| u > input.now_ms);
        if paused || busy.iter().any(|d| limit.matches(d)) {
            *open = false;
        }
    }
    // Their order is their time: a position stands in for the due time.
    let waiting: Vec<Waiting> = candidates
        .iter()
        .enumerate()
        .map(|(k, (i, destination))| Waiting {
            id: i.to_string(),
            destination: (*destination).to_owned(),
            due_ms: k as u64,
        })
        .collect();
    let go: HashSet<usize> = plan
        .release(&waiting, usize::MAX)
        .iter()
        .filter_map(|i| i.parse().ok())
        .collect();
    let destinations: Vec<&str> = candidates
        .iter()
        .filter(|(i, _)| go.contains(i))
        .map(|(_, d)| *d)
        .collect();
    for (i, bucket, taken) in plan.spent(&limits, &destinations) {
        if taken == 0 {
            continue;
        }
        let (tokens, at_ms) = bucket.map_or((0.0, input.now_ms), |b| (b.tokens, b.at_ms));
        tx.save_bucket(SAVE_BUCKET, &limits[i].limit.name, tokens, at_ms, taken)
            .await?;
    }
    Ok(go)
}

/// A pass's decisions, from the limits as locked: which are open, how many
/// tokens each has, and (pure) which waiting tasks go.
struct PassPlan {
    open: Vec<bool>,
    allowance: Vec<Option<u64>>,
    limits: Vec<Limit>,
}

impl PassPlan {
    /// Refills each paced limit's bucket to `now_ms` (in `limits`).
    fn new(limits: &mut [StoredLimit], input: &PassInput) -> PassPlan {
        for stored in limits.iter_mut() {
            if let (Some(rate), Some(bucket)) = (stored.limit.rate, stored.bucket) {
                stored.bucket = Some(bucket.refill(rate, input.now_ms));
            }
        }
        let cap = |l: &StoredLimit| input.caps.get(&l.limit.name).copied();
        PassPlan {
            open: limits.iter().map(|l| cap(l) != Some(0)).collect(),
            allowance: limits
                .iter()
                .map(|l| match (l.bucket.map(|b| b.available()), cap(l)) {
                    (Some(tokens), Some(cap)) => Some(tokens.min(cap)),
                    (tokens, cap) => tokens.or(cap),
                })
                .collect(),
            limits: limits.iter().map(|l| l.limit.clone()).collect(),
        }
    }

    /// The destinations worth reading, and at most how many of each: none
    /// of a destination a closed or empty limit holds.
    fn wanted<'d>(&self, destinations: &'d [String], most: usize) -> Vec<(&'d String, u64)> {
        destinations
            .iter()
            .filter_map(|destination| {
                let mut wanted = most as u64;
                for (i, limit) in self.limits.iter().enumerate() {
                    if limit.matches(destination) {
                        if !self.open[i] {
                            return None;
                        }
                        wanted = wanted.min(self.allowance[i].unwrap_or(u64::MAX));
                    }
                }
                (wanted > 0).then_some((destination, wanted))
            })
            .collect()
    }

    fn release(&self, waiting: &[Waiting], most: usize) -> Vec<String> {
        plan_pass(waiting, &self.limits, &self.open, &self.allowance, most).0
    }

    /// Per limit (by index) that is paced or released any of the tasks
    /// released to `destinations`: its bucket less what they took, and how
    /// many.
    fn spent(
        &self,
        limits: &[StoredLimit],
        destinations: &[&str],
    ) -> Vec<(usize, Option<Bucket>, u64)> {
        limits
            .iter()
            .enumerate()
            .filter_map(|(i, stored)| {
                let taken = destinations
                    .iter()
                    .filter(|d| stored.limit.matches(d))
                    .count() as u64;
                let bucket = stored.bucket.map(|b| Bucket {
                    tokens: b.tokens - taken as f64,
                    at_ms: b.at_ms,
                });
                (taken > 0 || bucket.is_some()).then_some((i, bucket, taken))
            })
            .collect()
    }
}
