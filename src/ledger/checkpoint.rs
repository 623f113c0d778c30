//! The SQLite ledger's checkpoints, off the writer's path.
//!
//! In WAL mode every commit appends to the write-ahead log, and a checkpoint
//! copies the log back into the database file. Left to itself, SQLite
//! checkpoints inside the commit that takes the log past 1,000 pages, on the
//! committing connection: the group-commit writer's. That commit, and every
//! write queued behind it (requests, and the release stage's claims of tasks
//! due in the next milliseconds), then waits for the database file's writes
//! and fsync: hundreds of milliseconds on a disk the broker is busy with.
//! So a connection of its own checkpoints every [`CHECKPOINT_EVERY`],
//! `PASSIVE`: it takes no lock a writer needs, and copies what no reader
//! still uses; the database file's writes and fsync are its own.
//!
//! That alone would let the log grow for as long as writes never pause: a
//! log starts over only when a write begins after a checkpoint that copied
//! all of it, and beside a steady writer a `PASSIVE` checkpoint never gets
//! to the end. So the writer still checkpoints, past
//! [`WRITER_CHECKPOINT_PAGES`] (four times SQLite's default): it has only
//! what came in since the last of those (a quarter second's worth) to copy,
//! and its next write starts the log over.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// How often the log is copied into the database file.
pub(super) const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// Pages of log (4 KiB each) past which the writer checkpoints itself:
/// the log's bound, 16 MB.
pub(super) const WRITER_CHECKPOINT_PAGES: u32 = 4_000;

/// Checkpoints the ledger at `path` every [`CHECKPOINT_EVERY`] until `closing`.
pub(super) async fn until_closed(path: PathBuf, closing: CancellationToken) {
    let mut connection = None;
    loop {
        tokio::select! {
            () = closing.cancelled() => return,
            () = tokio::time::sleep(CHECKPOINT_EVERY) => {}
        }
        let path = path.clone();
        let taken = connection.take();
        // Blocking (file writes, fsync): not on the service's workers.
        let done = tokio::task::spawn_blocking(move || once(taken, &path)).await;
        match done {
            Ok(Ok(kept)) => connection = Some(kept),
            Ok(Err(error)) => warn!(%error, "cannot checkpoint the SQLite ledger; trying again"),
            Err(error) => warn!(%error, "the SQLite ledger's checkpoint stopped abnormally"),
        }
    }
}

/// One `PASSIVE` checkpoint on `connection` (opened if `None`); the
/// connection, to keep for the next.
fn once(
    connection: Option<rusqlite::Connection>,
    path: &std::path::Path,
) -> Result<rusqlite::Connection, rusqlite::Error> {
    let connection = match connection {
        Some(connection) => connection,
        None => rusqlite::Connection::open(path)?,
    };
    let started = Instant::now();
    // (busy, pages in the log, pages copied): a busy checkpoint copies
    // what it can, and the next one goes on.
    let (busy, logged, copied): (i64, i64, i64) =
        connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })?;
    debug!(
        busy,
        logged,
        copied,
        took_ms = started.elapsed().as_millis() as u64,
        "checkpointed the SQLite ledger"
    );
    Ok(connection)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory, its ledger file, and the group writer's own
    /// connection to it (its settings) with a table `t (x BLOB)`.
    fn writer_of_a_new_ledger() -> (PathBuf, PathBuf, rusqlite::Connection) {
        let dir = std::env::temp_dir().join(format!("dl-checkpoint-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger.db");
        let writer = super::super::pool::open_sqlite_writer(&path).unwrap();
        writer.execute_batch("CREATE TABLE t (x BLOB);").unwrap();
        (dir, path, writer)
    }

    /// The writer's commits leave the log to the checkpointer, which copies
    /// it all into the database file.
    #[test]
    fn the_writer_leaves_the_log_and_a_passive_checkpoint_copies_all_of_it() {
        let (dir, path, writer) = writer_of_a_new_ledger();
        // Rows of most of a page: past SQLite's 1,000 pages of log, short of
        // the writer's bound.
        let page = vec![0u8; 3000];
        for _ in 0..600 {
            writer
                .execute("INSERT INTO t VALUES (?1)", [&page])
                .unwrap();
        }
        let frames = |connection: &rusqlite::Connection| -> (i64, i64) {
            connection
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                    Ok((row.get(1)?, row.get(2)?))
                })
                .unwrap()
        };
        let kept = once(None, &path).unwrap();
        let (logged, copied) = frames(&kept);
        // Past SQLite's 1,000 pages, the writer did not checkpoint: the
        // log holds every commit, and the checkpoint copied all of it.
        assert!(logged > 1000, "{logged} frames in the log");
        assert!(logged < i64::from(WRITER_CHECKPOINT_PAGES));
        assert_eq!(logged, copied);
        drop((kept, writer));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Under writes that never pause, with the checkpointer beside them,
    /// the log stays near its bound instead of holding every write (100 MB
    /// here).
    #[test]
    fn the_log_stays_bounded_under_writes_that_never_pause() {
        let (dir, path, writer) = writer_of_a_new_ledger();
        let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let checkpointer = {
            let (path, writing) = (path.clone(), writing.clone());
            std::thread::spawn(move || {
                let mut connection = None;
                while writing.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                    connection = Some(once(connection, &path).unwrap());
                }
            })
        };
        let page = vec![7u8; 4000];
        for _ in 0..250 {
            let tx = writer.unchecked_transaction().unwrap();
            for _ in 0..100 {
                tx.execute("INSERT INTO t VALUES (?1)", [&page]).unwrap();
            }
            tx.commit().unwrap();
        }
        writing.store(false, std::sync::atomic::Ordering::Relaxed);
        checkpointer.join().unwrap();
        let log = std::fs::metadata(dir.join("ledger.db-wal")).unwrap().len();
        // The bound, and what comes in while a checkpoint runs.
        let bound = u64::from(WRITER_CHECKPOINT_PAGES) * 4096;
        assert!(log < 3 * bound, "{log} bytes of log");
        drop(writer);
        let _ = std::fs::remove_dir_all(dir);
    }
}
