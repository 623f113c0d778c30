//! Release limits as the ledger stores them (the `limits` table, written
//! only here), and the limiter's pass over waiting tasks.
//!
//! A limit's token bucket lives in its row, so that `rate_per_sec` is the
//! rate over every replica sharing the ledger: a pass locks the limits'
//! rows first (on PostgreSQL, passes of several replicas take turns; on
//! SQLite the first statement takes the write lock), takes tokens and
//! moves the waiting tasks it releases to `releasing` in the same
//! transaction. A replica that dies after the commit leaves its tasks
//! `releasing` under a lease; once it runs out they wait again. Tokens are
//! not given back: a crash releases at most what one pass took, later,
//! never more than the bucket allowed.

use std::collections::HashMap;

use super::error::{LedgerError, QueryContext};
use super::handle::Ledger;
use super::record::{Row, StoredTask, db_ms, decode_all};
use super::sql::{self, statement_sized_chunks};
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

const LIMIT_COLUMNS: &str = "name, destinations, rate_per_sec, burst, paused, paused_until_ms, \
     depth_queue, depth_messages, tokens, tokens_at_ms, released, client, created_at_ms, \
     updated_at_ms";

#[derive(sqlx::FromRow)]
struct LimitRow {
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

fn ms(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

impl LimitRow {
    fn decode(self) -> Result<StoredLimit, LedgerError> {
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

fn select_limits(condition: &str) -> String {
    format!("SELECT {LIMIT_COLUMNS} FROM limits {condition} ORDER BY name")
}

/// A new limit with a full bucket; a changed one keeps its bucket (at most
/// the new burst), and its creation time.
fn upsert_limit() -> String {
    format!(
        "INSERT INTO limits ({LIMIT_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 0, $11, $10, $10) \
         ON CONFLICT (name) DO UPDATE SET destinations = excluded.destinations, \
         rate_per_sec = excluded.rate_per_sec, burst = excluded.burst, \
         paused = excluded.paused, paused_until_ms = excluded.paused_until_ms, \
         depth_queue = excluded.depth_queue, depth_messages = excluded.depth_messages, \
         tokens = CASE WHEN limits.rate_per_sec IS NULL OR limits.tokens > excluded.tokens \
             THEN excluded.tokens ELSE limits.tokens END, \
         tokens_at_ms = CASE WHEN limits.rate_per_sec IS NULL THEN excluded.tokens_at_ms \
             ELSE limits.tokens_at_ms END, \
         client = excluded.client, updated_at_ms = excluded.updated_at_ms \
         RETURNING {LIMIT_COLUMNS}"
    )
}

/// Pauses (`$2` = 1) or resumes (`$2` = 0: also ends a `paused_until`).
fn pause_limit() -> String {
    format!(
        "UPDATE limits SET paused = $2, \
         paused_until_ms = CASE WHEN $2 = 0 THEN NULL ELSE paused_until_ms END, \
         updated_at_ms = $3 WHERE name = $1 RETURNING {LIMIT_COLUMNS}"
    )
}

/// Every limit, its row locked until the pass commits (a write, so that
/// SQLite's transaction holds the write lock from its first statement).
fn lock_limits() -> String {
    format!("UPDATE limits SET tokens = tokens RETURNING {LIMIT_COLUMNS}")
}

const DELETE_LIMIT: &str = "DELETE FROM limits WHERE name = $1 RETURNING name";
const SAVE_BUCKET: &str = "UPDATE limits SET tokens = $2, tokens_at_ms = $3, \
     released = released + $4 WHERE name = $1";

/// What one pass of the limiter is given.
#[derive(Clone, Debug)]
pub struct PassInput<'a> {
    pub now_ms: u64,
    /// Released tasks are leased until then.
    pub lease_until_ms: u64,
    /// Destinations with waiting tasks.
    pub destinations: &'a [String],
    /// Most tasks a limit may release now, by name, besides its rate: 0
    /// while it is closed (paused, its queue too deep), room left below
    /// its queue's bound; absent: no bound.
    pub caps: &'a HashMap<String, u64>,
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
}

impl Ledger {
    /// Sets limit `limit` (creating it, or changing it in place); whether it
    /// is new.
    pub async fn put_limit(
        &self,
        limit: &Limit,
        client: Option<&str>,
        now_ms: u64,
    ) -> Result<(StoredLimit, bool), LedgerError> {
        let tokens = limit.rate.map_or(0.0, |r| Bucket::full(r, now_ms).tokens);
        let sql = upsert_limit();
        let row: LimitRow = on_pool!(&self.pool, p => sqlx::query_as(&sql)
            .bind(&limit.name)
            .bind(limit.destinations.as_str())
            .bind(limit.rate.map(|r| r.per_sec))
            .bind(limit.rate.map(|r| db_ms(r.burst)))
            .bind(i64::from(limit.paused))
            .bind(limit.paused_until_ms.map(db_ms))
            .bind(limit.depth.as_ref().map(|d| d.queue.clone()))
            .bind(limit.depth.as_ref().map(|d| db_ms(d.messages)))
            .bind(tokens)
            .bind(db_ms(now_ms))
            .bind(client)
            .fetch_one(p)
            .await)
        .context("setting a limit")?;
        let stored = row.decode()?;
        let created = stored.created_at_ms == now_ms && stored.updated_at_ms == now_ms;
        Ok((stored, created))
    }

    /// Every limit, by name.
    pub async fn limits(&self) -> Result<Vec<StoredLimit>, LedgerError> {
        let sql = select_limits("");
        let rows: Vec<LimitRow> =
            on_pool!(&self.pool, p => sqlx::query_as(&sql).fetch_all(p).await)
                .context("reading limits")?;
        rows.into_iter().map(LimitRow::decode).collect()
    }

    pub async fn limit(&self, name: &str) -> Result<Option<StoredLimit>, LedgerError> {
        let sql = select_limits("WHERE name = $1");
        let row: Option<LimitRow> =
            on_pool!(&self.pool, p => sqlx::query_as(&sql).bind(name).fetch_optional(p).await)
                .context("reading a limit")?;
        row.map(LimitRow::decode).transpose()
    }

    /// Deletes a limit; whether there was one. What it held waits no more
    /// for it (the limiter's next pass releases it, under any other limit).
    pub async fn delete_limit(&self, name: &str) -> Result<bool, LedgerError> {
        let deleted: Option<String> = on_pool!(&self.pool, p => sqlx::query_scalar(DELETE_LIMIT)
            .bind(name)
            .fetch_optional(p)
            .await)
        .context("deleting a limit")?;
        Ok(deleted.is_some())
    }

    /// Pauses or resumes a limit; `None` when there is none of that name.
    pub async fn pause_limit(
        &self,
        name: &str,
        paused: bool,
        now_ms: u64,
    ) -> Result<Option<StoredLimit>, LedgerError> {
        let sql = pause_limit();
        let row: Option<LimitRow> = on_pool!(&self.pool, p => sqlx::query_as(&sql)
            .bind(name)
            .bind(i64::from(paused))
            .bind(db_ms(now_ms))
            .fetch_optional(p)
            .await)
        .context("pausing or resuming a limit")?;
        row.map(LimitRow::decode).transpose()
    }

    /// Tasks released by the limiter whose publish failed: waiting again.
    pub async fn wait_again(&self, ids: &[String]) -> Result<(), LedgerError> {
        for chunk in statement_sized_chunks(ids) {
            let sql = sql::wait_again(chunk.len());
            on_pool!(&self.pool, p => {
                let mut query = sqlx::query(&sql);
                for id in chunk {
                    query = query.bind(id);
                }
                query.execute(p).await.map(|_| ())
            })
            .context("putting released tasks back to wait")?;
        }
        Ok(())
    }

    /// Tasks the limiter released whose lease ran out before `now_ms` (their
    /// replica stopped before marking them delivered) wait again; how many.
    pub async fn return_expired_leases(&self, now_ms: u64) -> Result<u64, LedgerError> {
        let any: Option<String> =
            on_pool!(&self.pool, p => sqlx::query_scalar(sql::ANY_EXPIRED_LEASE)
            .bind(db_ms(now_ms))
            .fetch_optional(p)
            .await)
            .context("looking for released tasks whose lease ran out")?;
        if any.is_none() {
            return Ok(0);
        }
        let returned = on_pool!(&self.pool, p => sqlx::query(sql::RETURN_EXPIRED_LEASES)
            .bind(db_ms(now_ms))
            .execute(p)
            .await
            .map(|done| done.rows_affected()))
        .context("returning released tasks whose lease ran out")?;
        Ok(returned)
    }

    /// Waiting tasks per destination: how many, and the earliest due time.
    pub async fn waiting_per_destination(&self) -> Result<Vec<(String, u64, u64)>, LedgerError> {
        let rows: Vec<(String, i64, i64)> = on_pool!(&self.pool, p =>
            sqlx::query_as(sql::WAITING_PER_DESTINATION).fetch_all(p).await)
        .context("counting waiting tasks")?;
        Ok(rows
            .into_iter()
            .map(|(destination, count, oldest)| (destination, ms(count), ms(oldest)))
            .collect())
    }

    /// One pass of the limiter (see the module's documentation).
    pub async fn limiter_pass(&self, input: PassInput<'_>) -> Result<Pass, LedgerError> {
        let lock = lock_limits();
        let pass = in_tx!(&self.pool, tx => {
            let rows: Vec<LimitRow> = sqlx::query_as(&lock)
                .fetch_all(&mut *tx)
                .await
                .context("locking limits")?;
            let mut limits = rows
                .into_iter()
                .map(LimitRow::decode)
                .collect::<Result<Vec<_>, _>>()?;
            let plan = PassPlan::new(&mut limits, &input);
            let mut waiting = Vec::new();
            for (destination, wanted) in plan.wanted(input.destinations, input.most) {
                let found: Vec<(String, i64)> = sqlx::query_as(sql::WAITING_OF_DESTINATION)
                    .bind(destination)
                    .bind(db_ms(input.now_ms))
                    .bind(i64::try_from(wanted).unwrap_or(i64::MAX))
                    .fetch_all(&mut *tx)
                    .await
                    .context("reading waiting tasks")?;
                waiting.extend(found.into_iter().map(|(id, due)| Waiting {
                    id,
                    destination: destination.clone(),
                    due_ms: ms(due),
                }));
            }
            let ids = plan.release(&waiting, input.most);
            let mut released = Vec::with_capacity(ids.len());
            for chunk in statement_sized_chunks(&ids) {
                let sql = sql::release_waiting(chunk.len());
                let mut query = sqlx::query_as::<_, Row>(&sql).bind(db_ms(input.lease_until_ms));
                for id in chunk {
                    query = query.bind(id);
                }
                let rows = query.fetch_all(&mut *tx).await.context("releasing waiting tasks")?;
                released.extend(decode_all(rows)?);
            }
            for (i, bucket, taken) in plan.spent(&limits, &released) {
                limits[i].bucket = bucket;
                limits[i].released += taken;
                sqlx::query(SAVE_BUCKET)
                    .bind(&limits[i].limit.name)
                    .bind(bucket.map_or(0.0, |b| b.tokens))
                    .bind(db_ms(bucket.map_or(input.now_ms, |b| b.at_ms)))
                    .bind(db_ms(taken))
                    .execute(&mut *tx)
                    .await
                    .context("taking tokens")?;
            }
            Pass { released, limits }
        });
        Ok(pass)
    }
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
    fn new(limits: &mut [StoredLimit], input: &PassInput<'_>) -> PassPlan {
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

    /// Per limit (by index) that is paced or released any of `released`:
    /// its bucket less what they took, and how many.
    fn spent(
        &self,
        limits: &[StoredLimit],
        released: &[StoredTask],
    ) -> Vec<(usize, Option<Bucket>, u64)> {
        limits
            .iter()
            .enumerate()
            .filter_map(|(i, stored)| {
                let taken = released
                    .iter()
                    .filter(|t| stored.limit.matches(&t.destination))
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
