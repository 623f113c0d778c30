//! Who holds a task's lease, and whether it still lives (PostgreSQL's
//! migration 0019).
//!
//! A task leased to a process (the request publishing it, the forwarder,
//! the limiter's or the staged release's take, a late confirm's watcher)
//! is left alone by every other until the lease ends: 12 s for a pending
//! task by default. A replica that crashed would leave its tasks that
//! long. So each ledger handle draws a holder number and writes it beside
//! every lease it takes, and on PostgreSQL keeps a session advisory lock
//! on that number on a connection of its own: PostgreSQL drops the lock
//! the moment the holder's process dies (its connection closes). Every
//! replica looks once a second for registered holders whose lock is gone
//! and ends their leases, so their tasks go on a second or two after the
//! crash (or a stop), not after the lease.
//!
//! A holder whose lock connection broke while it lived (PostgreSQL
//! restarted, a network fault) may have its leases ended by another
//! replica meanwhile: the tasks are then published twice at worst, the
//! at-least-once every task has. It takes the lock again as soon as it
//! can. On SQLite (one process) the start ends whatever leases the stopped
//! process left instead (`Ledger::end_leases_of_a_stopped_process`).

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::error::{LedgerError, QueryContext};
use super::sql;

/// How often the holder's lock connection is checked, and how soon a broken
/// one is tried again.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// A holder number for a new ledger handle: positive, so that its two
/// halves are PostgreSQL's `classid` and `objid` of the lock as they are.
pub(super) fn draw() -> i64 {
    (rand::random::<i64>() & i64::MAX).max(1)
}

/// Takes `holder`'s advisory lock on a connection of its own, then
/// registers it: a holder is never registered without its lock, so none is
/// taken for gone while it opens.
pub(super) async fn hold(
    pool: &PgPool,
    holder: i64,
    now_ms: u64,
) -> Result<PgConnection, LedgerError> {
    let mut connection = PgConnection::connect_with(&pool.connect_options())
        .await
        .context("connecting to hold the lease lock")?;
    sqlx::query(sql::LOCK_HOLDER)
        .bind(holder)
        .execute(&mut connection)
        .await
        .context("taking the lease lock")?;
    sqlx::query(sql::REGISTER_HOLDER)
        .bind(holder)
        .bind(super::record::db_ms(now_ms))
        .execute(&mut connection)
        .await
        .context("registering the lease holder")?;
    Ok(connection)
}

/// Keeps `holder`'s lock until `closing`, taking it again whenever its
/// connection breaks. Closing ends the connection, and the lock with it:
/// the replicas that go on take over what this one still held.
pub(super) async fn keep(
    pool: PgPool,
    holder: i64,
    mut connection: Option<PgConnection>,
    closing: CancellationToken,
) {
    loop {
        tokio::select! {
            () = closing.cancelled() => break,
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
        let alive = match connection.as_mut() {
            Some(held) => held.ping().await.is_ok(),
            None => false,
        };
        if alive {
            continue;
        }
        if connection.take().is_some() {
            warn!(
                holder,
                "the lease lock's connection broke; taking the lock again"
            );
        }
        match hold(&pool, holder, crate::clock::now_ms()).await {
            Ok(held) => {
                info!(holder, "the lease lock is held again");
                connection = Some(held);
            }
            Err(error) => warn!(holder, %error, "cannot take the lease lock yet"),
        }
    }
    if let Some(held) = connection {
        let _ = held.close().await;
    }
}

/// Registered holders other than `own` whose lock is gone: their process
/// ended.
pub(super) async fn gone(pool: &PgPool, own: i64) -> Result<Vec<i64>, LedgerError> {
    sqlx::query_scalar(sql::GONE_HOLDERS)
        .bind(own)
        .fetch_all(pool)
        .await
        .context("looking for lease holders that are gone")
}

/// Ends every lease `holder` held (its pending tasks due for the
/// forwarder, its releases back where they were taken from) and forgets
/// it, in one transaction; how many tasks it ended.
pub(super) async fn end_leases_of(pool: &PgPool, holder: i64) -> Result<u64, LedgerError> {
    let mut tx = pool.begin().await.context("starting a transaction")?;
    let mut ended = 0;
    for statement in [
        sql::END_PENDING_LEASES_OF,
        sql::RETURN_RELEASES_OF,
        sql::RETURN_STAGED_RELEASES_OF,
    ] {
        ended += sqlx::query(statement)
            .bind(holder)
            .execute(&mut *tx)
            .await
            .context("ending the leases of a holder that is gone")?
            .rows_affected();
    }
    sqlx::query(sql::FORGET_HOLDER)
        .bind(holder)
        .execute(&mut *tx)
        .await
        .context("forgetting a lease holder that is gone")?;
    tx.commit().await.context("committing")?;
    Ok(ended)
}
