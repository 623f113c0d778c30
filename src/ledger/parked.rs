//! Parked messages as the ledger stores them (the `parked` table, written
//! only here): what a retry policy gave up on after its last attempt, kept
//! until an operator replays or discards it.
//!
//! Parking is the rare path (a message that failed every attempt), so each
//! is one statement straight to the pool, as a schedule's change. A replay
//! deletes the row in the group-commit transaction that records its task
//! (`Ledger::admit`'s `unparks`), so that a crash leaves either both (the
//! message still parked) or the task alone; a discard deletes it here.

use lapin::BasicProperties;

use super::error::{LedgerError, QueryContext};
use super::handle::Ledger;
use super::record::db_ms;
use super::sql::statement_sized_chunks;
use crate::message;

/// A parked message.
#[derive(Clone, Debug)]
pub struct ParkedMessage {
    pub id: String,
    /// The queue it failed in, and comes back to when replayed.
    pub queue: String,
    pub policy: String,
    /// Why its last attempt ended (`x-death`'s reason: `rejected`,
    /// `expired`, `delivery_limit`, `maxlen`).
    pub reason: String,
    pub attempts: u32,
    /// Its own `message_id`, when it had one.
    pub message_id: Option<String>,
    pub payload: Vec<u8>,
    pub properties: BasicProperties,
    pub parked_at_ms: u64,
    /// When its first attempt failed; `None` for one parked before this
    /// was kept (its group is then the hour it was parked in).
    pub first_failed_at_ms: Option<u64>,
}

impl ParkedMessage {
    /// The hour its failure began (epoch ms, on the hour): its group's.
    pub fn first_failed_hour_ms(&self) -> u64 {
        let at = self.first_failed_at_ms.unwrap_or(self.parked_at_ms);
        at - at % HOUR_MS
    }
}

/// Parked messages are grouped by the hour their failure began.
pub const HOUR_MS: u64 = 3_600_000;

/// Parked messages of one queue, one reason and one hour of first failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParkedGroup {
    pub queue: String,
    pub reason: String,
    /// The hour their first attempts failed in (epoch ms, on the hour).
    pub first_failed_hour_ms: u64,
    pub parked: u64,
    pub oldest_parked_at_ms: u64,
    pub newest_parked_at_ms: u64,
}

/// Which parked messages: of one queue (or every queue), with one reason
/// (or any), whose failure began in one hour (or any).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParkedFilter {
    pub queue: Option<String>,
    pub reason: Option<String>,
    /// The hour (epoch ms, on the hour) their first attempt failed in.
    pub first_failed_hour_ms: Option<u64>,
}

/// A queue's parked messages: how many, and the newest's time.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ParkedQueue {
    pub queue: String,
    pub parked: u64,
    pub newest_at_ms: u64,
}

const COLUMNS: &str = "id, queue, policy, reason, attempts, message_id, payload, properties, \
     parked_at_ms, first_failed_at_ms";

const INSERT_PARKED: &str = "INSERT INTO parked (id, queue, policy, reason, attempts, \
     message_id, payload, properties, parked_at_ms, first_failed_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (id) DO NOTHING";

/// The hour a parked row's failure began (see `ParkedMessage::first_failed_hour_ms`).
const FIRST_FAILED_HOUR: &str = "(COALESCE(first_failed_at_ms, parked_at_ms) / 3600000 * 3600000)";

/// Each group of parked messages: queue, reason, hour of first failure.
fn parked_groups() -> String {
    format!(
        "SELECT queue, reason, {FIRST_FAILED_HOUR} AS hour, COUNT(*), MIN(parked_at_ms), \
         MAX(parked_at_ms) FROM parked GROUP BY queue, reason, hour \
         ORDER BY queue, reason, hour"
    )
}

const PARKED_PER_QUEUE: &str = "SELECT queue, COUNT(*), MAX(parked_at_ms) FROM parked \
     GROUP BY queue ORDER BY queue";

/// Newest first, after the cursor `($3, $4)` (a page's last); `$1`, `$2`
/// filter when not NULL.
fn select_page() -> String {
    format!(
        "SELECT {COLUMNS} FROM parked \
         WHERE ($1 IS NULL OR queue = $1) AND ($2 IS NULL OR reason = $2) \
         AND ($6 IS NULL OR {FIRST_FAILED_HOUR} = $6) \
         AND (parked_at_ms < $3 OR (parked_at_ms = $3 AND id < $4)) \
         ORDER BY parked_at_ms DESC, id DESC LIMIT $5"
    )
}

fn delete_parked(count: usize) -> String {
    let list = (1..=count)
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("DELETE FROM parked WHERE id IN ({list})")
}

#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    queue: String,
    policy: String,
    reason: String,
    attempts: i64,
    message_id: Option<String>,
    payload: Vec<u8>,
    properties: Vec<u8>,
    parked_at_ms: i64,
    first_failed_at_ms: Option<i64>,
}

impl Row {
    fn decode(self) -> Result<ParkedMessage, LedgerError> {
        let properties =
            message::decode_properties(&self.properties).ok_or_else(|| LedgerError::Corrupt {
                id: self.id.clone(),
                reason: "parked message's properties do not decode".into(),
            })?;
        Ok(ParkedMessage {
            id: self.id,
            queue: self.queue,
            policy: self.policy,
            reason: self.reason,
            attempts: u32::try_from(self.attempts).unwrap_or(0),
            message_id: self.message_id,
            payload: self.payload,
            properties,
            parked_at_ms: u64::try_from(self.parked_at_ms).unwrap_or(0),
            first_failed_at_ms: self
                .first_failed_at_ms
                .and_then(|ms| u64::try_from(ms).ok()),
        })
    }
}

impl Ledger {
    /// Records a parked message (once: the same id again changes nothing).
    pub async fn park(&self, parked: &ParkedMessage) -> Result<(), LedgerError> {
        let properties = message::encode_properties(&parked.properties);
        on_pool!(&self.pool, p => sqlx::query(INSERT_PARKED)
            .bind(&parked.id)
            .bind(&parked.queue)
            .bind(&parked.policy)
            .bind(&parked.reason)
            .bind(i64::from(parked.attempts))
            .bind(&parked.message_id)
            .bind(&parked.payload)
            .bind(&properties)
            .bind(db_ms(parked.parked_at_ms))
            .bind(parked.first_failed_at_ms.map(db_ms))
            .execute(p)
            .await
            .map(|_| ()))
        .context("parking a message")
    }

    /// Up to `limit` parked messages `filter` matches, newest first, older
    /// than `before` (a page's last: its time and id) when given.
    pub async fn parked(
        &self,
        filter: &ParkedFilter,
        before: Option<(u64, &str)>,
        limit: u32,
    ) -> Result<Vec<ParkedMessage>, LedgerError> {
        let sql = select_page();
        let (at_ms, id) = match before {
            Some((at_ms, id)) => (db_ms(at_ms), id.to_owned()),
            // Past every id at the newest instant.
            None => (i64::MAX, "\u{10FFFF}".to_owned()),
        };
        let rows: Vec<Row> = on_pool!(&self.pool, p => sqlx::query_as(&sql)
            .bind(&filter.queue)
            .bind(&filter.reason)
            .bind(at_ms)
            .bind(&id)
            .bind(i64::from(limit))
            .bind(filter.first_failed_hour_ms.map(db_ms))
            .fetch_all(p)
            .await)
        .context("reading parked messages")?;
        rows.into_iter().map(Row::decode).collect()
    }

    /// One parked message.
    pub async fn parked_message(&self, id: &str) -> Result<Option<ParkedMessage>, LedgerError> {
        let sql = format!("SELECT {COLUMNS} FROM parked WHERE id = $1");
        let row: Option<Row> =
            on_pool!(&self.pool, p => sqlx::query_as(&sql).bind(id).fetch_optional(p).await)
                .context("reading a parked message")?;
        row.map(Row::decode).transpose()
    }

    /// Each queue with parked messages: how many, and the newest's time.
    pub async fn parked_per_queue(&self) -> Result<Vec<ParkedQueue>, LedgerError> {
        let rows: Vec<(String, i64, i64)> = on_pool!(&self.pool, p =>
            sqlx::query_as(PARKED_PER_QUEUE).fetch_all(p).await)
        .context("counting parked messages")?;
        Ok(rows
            .into_iter()
            .map(|(queue, parked, newest)| ParkedQueue {
                queue,
                parked: u64::try_from(parked).unwrap_or(0),
                newest_at_ms: u64::try_from(newest).unwrap_or(0),
            })
            .collect())
    }

    /// Every group of parked messages (queue, reason, hour of first
    /// failure), with counts, by queue, reason and hour.
    pub async fn parked_groups(&self) -> Result<Vec<ParkedGroup>, LedgerError> {
        let sql = parked_groups();
        let rows: Vec<(String, String, i64, i64, i64, i64)> =
            on_pool!(&self.pool, p => sqlx::query_as(&sql).fetch_all(p).await)
                .context("grouping parked messages")?;
        let ms = |value: i64| u64::try_from(value).unwrap_or(0);
        Ok(rows
            .into_iter()
            .map(
                |(queue, reason, hour, parked, oldest, newest)| ParkedGroup {
                    queue,
                    reason,
                    first_failed_hour_ms: ms(hour),
                    parked: ms(parked),
                    oldest_parked_at_ms: ms(oldest),
                    newest_parked_at_ms: ms(newest),
                },
            )
            .collect())
    }

    /// Deletes parked messages (discarded); how many were there.
    pub async fn unpark(&self, ids: &[String]) -> Result<u64, LedgerError> {
        let mut deleted = 0;
        for chunk in statement_sized_chunks(ids) {
            let sql = delete_parked(chunk.len());
            deleted += on_pool!(&self.pool, p => {
                let mut query = sqlx::query(&sql);
                for id in chunk {
                    query = query.bind(id);
                }
                query.execute(p).await.map(|done| done.rows_affected())
            })
            .context("deleting parked messages")?;
        }
        Ok(deleted)
    }
}
