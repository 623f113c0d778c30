//! The SQLite ledger's checkpoints, off the writer's path.
//!
//! In WAL mode every commit appends to the write-ahead log, and a checkpoint
//! copies the log back into the database file. Left to itself, SQLite
//! checkpoints inside the commit that takes the log past 1,000 pages, on the
//! committing connection: the group-commit writer's. That commit, and every
//! write queued behind it (requests, and the release stage's claims of tasks
//! due in the next milliseconds), then waits for the database file's writes
//! and fsync: hundreds of milliseconds on a disk the broker is busy with.
//! So a connection of its own checkpoints, `PASSIVE`: it takes no lock a
//! writer needs, and copies what no reader still uses; the database file's
//! writes and fsync are its own.
//!
//! It checkpoints when the log has grown by [`STEP_PAGES`] since its last
//! pass, as fast as the log grew before, and at least every
//! [`CHECKPOINT_EVERY`]: a timer alone lets a fast writer's log outgrow a
//! pass between two ticks, and the writer then copies that whole window
//! itself while every write waits (record 37 in `docs/bench/history/`).
//!
//! A steady writer's log never pauses, and a log starts over only when a
//! write begins after a checkpoint that copied all of it; beside a steady
//! writer a `PASSIVE` checkpoint never gets to the end. So the writer still
//! checkpoints, past [`WRITER_CHECKPOINT_PAGES`]. Within a step of that
//! bound the checkpointer's passes come back to back, each copying what
//! came in during the one before, so the writer, which checkpoints in the
//! gap after a pass, copies only what came in since that pass began, and
//! its next write starts the log over. If a pass is under way, the writer's
//! checkpoint does not wait for it (SQLite answers busy at once): it tries
//! again on its next commit.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// The longest the log waits to be copied into the database file.
pub(super) const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// The log's growth (pages of 4 KiB, 16 MB) that one pass copies under load.
pub(super) const STEP_PAGES: u32 = 4_000;

/// The shortest pause between two passes: a pass costs an fsync however
/// little it copies.
pub(super) const SOONEST: Duration = Duration::from_millis(10);

/// Pages of log past which the writer checkpoints itself: the log's bound,
/// 64 MB, four steps, so the checkpointer has copied most of it first.
pub(super) const WRITER_CHECKPOINT_PAGES: u32 = 4 * STEP_PAGES;

/// Checkpoints the ledger at `path` until `closing`, each pass when the log
/// is due to have grown by [`STEP_PAGES`] ([`pause_after`]).
pub(super) async fn until_closed(path: PathBuf, closing: CancellationToken) {
    let mut connection = None;
    let mut last = Pass::default();
    let mut pause = CHECKPOINT_EVERY;
    loop {
        tokio::select! {
            () = closing.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        let path = path.clone();
        let taken = connection.take();
        let started = Instant::now();
        // Blocking (file writes, fsync): not on the service's workers.
        let done = tokio::task::spawn_blocking(move || once(taken, &path)).await;
        pause = match done {
            Ok(Ok((kept, logged))) => {
                connection = Some(kept);
                let pass = Pass { started, logged };
                let pause = pause_from_now(&last, &pass);
                last = pass;
                pause
            }
            Ok(Err(error)) => {
                warn!(%error, "cannot checkpoint the SQLite ledger; trying again");
                CHECKPOINT_EVERY
            }
            Err(error) => {
                warn!(%error, "the SQLite ledger's checkpoint stopped abnormally");
                CHECKPOINT_EVERY
            }
        };
    }
}

/// A checkpoint's start and the pages the log held then.
struct Pass {
    started: Instant,
    logged: u64,
}

impl Default for Pass {
    fn default() -> Pass {
        Pass {
            started: Instant::now(),
            logged: 0,
        }
    }
}

/// [`pause_after`], less the time since `pass` started (its own length),
/// and never below [`SOONEST`].
fn pause_from_now(last: &Pass, pass: &Pass) -> Duration {
    pause_after(last, pass)
        .saturating_sub(pass.started.elapsed())
        .max(SOONEST)
}

/// How long after `pass` started the next should: when the log, growing as
/// it grew since `last`, will have grown by [`STEP_PAGES`]; between
/// [`SOONEST`] and [`CHECKPOINT_EVERY`]. Within a step of the writer's
/// bound, while the log grows, at once: the writer checkpoints in the gap
/// after a pass, and copies what came in since that pass began, so those
/// passes are kept short. (A log that stopped growing there stays that long
/// until the next write: it waits the longest pause like any idle log.)
fn pause_after(last: &Pass, pass: &Pass) -> Duration {
    // A log smaller than before started over in between and grew at least
    // to its size.
    let grown = if pass.logged >= last.logged {
        pass.logged - last.logged
    } else {
        pass.logged
    };
    let near_the_bound = pass.logged + u64::from(STEP_PAGES) >= u64::from(WRITER_CHECKPOINT_PAGES);
    if grown > 0 && near_the_bound {
        return SOONEST;
    }
    let between = pass.started.saturating_duration_since(last.started);
    step_time(grown, between)
}

/// The time to grow [`STEP_PAGES`] at `grown` pages in `between`, between
/// [`SOONEST`] and [`CHECKPOINT_EVERY`]: pure, for the tests.
fn step_time(grown: u64, between: Duration) -> Duration {
    if grown == 0 {
        return CHECKPOINT_EVERY;
    }
    let nanos = between.as_nanos() * u128::from(STEP_PAGES) / u128::from(grown);
    let nanos = u64::try_from(nanos).unwrap_or(u64::MAX);
    Duration::from_nanos(nanos).clamp(SOONEST, CHECKPOINT_EVERY)
}

/// One `PASSIVE` checkpoint on `connection` (opened if `None`); the
/// connection, to keep for the next, and the pages the log held.
fn once(
    connection: Option<rusqlite::Connection>,
    path: &std::path::Path,
) -> Result<(rusqlite::Connection, u64), rusqlite::Error> {
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
    // -1 when the ledger is not in WAL mode: nothing logged.
    Ok((connection, u64::try_from(logged).unwrap_or(0)))
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
        let (kept, _) = once(None, &path).unwrap();
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
    /// the log stays near its bound instead of holding every write (120 MB
    /// here, the bound 64 MB).
    #[test]
    fn the_log_stays_bounded_under_writes_that_never_pause() {
        let (dir, path, writer) = writer_of_a_new_ledger();
        let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let checkpointer = {
            let (path, writing) = (path.clone(), writing.clone());
            // `until_closed`'s pacing, on a thread.
            std::thread::spawn(move || {
                let (mut connection, mut last, mut pause) = (None, Pass::default(), SOONEST);
                while writing.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(pause);
                    let started = Instant::now();
                    let (kept, logged) = once(connection, &path).unwrap();
                    connection = Some(kept);
                    let pass = Pass { started, logged };
                    pause = pause_from_now(&last, &pass);
                    last = pass;
                }
            })
        };
        let page = vec![7u8; 4000];
        for _ in 0..300 {
            let tx = writer.unchecked_transaction().unwrap();
            for _ in 0..100 {
                tx.execute("INSERT INTO t VALUES (?1)", [&page]).unwrap();
            }
            tx.commit().unwrap();
        }
        writing.store(false, std::sync::atomic::Ordering::Relaxed);
        checkpointer.join().unwrap();
        let log = std::fs::metadata(dir.join("ledger.db-wal")).unwrap().len();
        // The bound, and what comes in while a pass of the checkpointer
        // makes the writer's checkpoint wait for its next commit.
        let bound = u64::from(WRITER_CHECKPOINT_PAGES + STEP_PAGES) * 4096;
        assert!(log < bound, "{log} bytes of log");
        drop(writer);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A log growing at a steady rate is checkpointed each [`STEP_PAGES`]
    /// of growth, within [`SOONEST`] and [`CHECKPOINT_EVERY`]; an idle log
    /// every [`CHECKPOINT_EVERY`].
    mod pacing {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn the_pause_lets_the_log_grow_one_step(
                grown in 0_u64..1_000_000,
                between_us in 1_u64..2_000_000,
            ) {
                let between = Duration::from_micros(between_us);
                let pause = step_time(grown, between);
                prop_assert!((SOONEST..=CHECKPOINT_EVERY).contains(&pause));
                if grown == 0 {
                    prop_assert_eq!(pause, CHECKPOINT_EVERY);
                } else {
                    // Growing as before, the log grows one step in the pause
                    // unless a bound cut it short or long.
                    let in_pause = grown as f64 * pause.as_secs_f64() / between.as_secs_f64();
                    let step = f64::from(STEP_PAGES);
                    if pause == SOONEST {
                        prop_assert!(in_pause >= step * 0.999);
                    } else if pause == CHECKPOINT_EVERY {
                        prop_assert!(in_pause <= step * 1.001);
                    } else {
                        prop_assert!((in_pause - step).abs() <= step * 0.001, "{in_pause}");
                    }
                }
            }

            #[test]
            fn faster_growth_never_waits_longer(
                grown in 0_u64..1_000_000,
                more in 0_u64..1_000_000,
                between_us in 1_u64..2_000_000,
            ) {
                let between = Duration::from_micros(between_us);
                prop_assert!(step_time(grown + more, between) <= step_time(grown, between));
            }
        }

        /// A log that started over since the last pass grew at least to
        /// its size; one that did not, by the difference.
        #[test]
        fn growth_is_read_across_a_log_that_started_over() {
            let started = Instant::now();
            let last = Pass {
                started,
                logged: 9_000,
            };
            let quarter = started + CHECKPOINT_EVERY / 4;
            let grew = |logged| {
                pause_after(
                    &last,
                    &Pass {
                        started: quarter,
                        logged,
                    },
                )
            };
            // 2,000 pages in a quarter of the longest pause: a step in half of it.
            assert_eq!(grew(11_000), CHECKPOINT_EVERY / 2);
            assert_eq!(grew(2_000), CHECKPOINT_EVERY / 2);
            assert_eq!(grew(9_000), CHECKPOINT_EVERY);
            // Within a step of the writer's bound: at once, while it grows.
            assert_eq!(grew(12_000), SOONEST);
            let idle = Pass {
                started,
                logged: 12_000,
            };
            let still = Pass {
                started: quarter,
                logged: 12_000,
            };
            assert_eq!(pause_after(&idle, &still), CHECKPOINT_EVERY);
        }
    }
}
