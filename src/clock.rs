//! This process's clocks, read in one place, and time as delayline writes
//! it (epoch milliseconds, RFC 3339 with three digits of milliseconds).
//!
//! Two clocks, for two jobs. The wall clock (epoch milliseconds) names due
//! times: it is what clients and the ledger speak. A monotonic clock, known
//! by a name drawn at start-up ([`source`]), measures holds: the release
//! stage never compares its wall clock with a due time another host wrote
//! (see [`crate::release::hold`]), because hosts' wall clocks disagree.
//! A stamp carries a reading of this monotonic clock from the replica that
//! published to the replica that releases, which bounds the offset between
//! the two from what it sees arrive.
//!
//! Waiting for a moment of the monotonic clock ([`until_mono_us`]) is here
//! too: tokio's timer counts whole milliseconds and rounds a deadline up,
//! so a task it wakes runs 1 to 2.5 ms after the moment (p50 and p99,
//! `delayline-bench --phases timer`); one thread of this process sleeps to
//! the earliest moment waited for with the system's microsecond timer
//! instead, and wakes each waiting task then.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The wall clock, now: the one place delayline reads it. A request reads
/// it once, at its edge, and hands the instant down.
///
/// Never ahead of the wall clock as it read at start-up plus the monotonic
/// time elapsed since (see [`Follower`]): NTP's slewing moves both clocks
/// alike, so only a step moves the one ahead of the other, and a step
/// forward (by hand, a bad time source) is not taken for elapsed time: it
/// makes no task early. A step back is followed at once (tasks are late,
/// never early), and a step forward again, as far as where the clock was.
pub fn now() -> SystemTime {
    let wall = SystemTime::now();
    let mono_us = mono_us();
    let wall_us = wall.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i128::try_from(since.as_micros()).unwrap_or(i128::MAX)
    });
    let followed_us = follower(wall_us, mono_us).follow_reading(wall_us, mono_us);
    if followed_us == wall_us {
        return wall;
    }
    let followed = u64::try_from(followed_us.max(0)).unwrap_or(u64::MAX);
    UNIX_EPOCH + Duration::from_micros(followed)
}

/// The system's wall clock as it is now, stepped or not: for the tests and
/// the benchmark, which compare what processes started at different times
/// say. A process follows a step forward only if it started after it (see
/// [`now`]): a test process that started before one, reading [`now`],
/// would take the tasks of a service started after it for early.
pub fn system_now() -> SystemTime {
    SystemTime::now()
}

/// A step forward larger than this is said in the log (once per step).
const STEP_WORTH_SAYING_US: i128 = 1_000_000;

/// The wall clock as delayline follows it: its offset from the monotonic
/// clock (wall − monotonic) as at start-up, or less. Linux slews
/// `CLOCK_MONOTONIC` with the wall clock (NTP's frequency and offset
/// corrections apply to both), so that offset changes only when the wall
/// clock is stepped (or the machine was suspended). A step back lowers it,
/// and is followed; a step forward past the start's offset is not, until a
/// restart: a bad step would otherwise release tasks early, and a
/// corrected one only makes them late, which the log says. Pure: the
/// readings are arguments. Shared by every reader without a lock (it is
/// read on the release path, once per task): the ceiling never changes,
/// and whether the clock is ahead is one atomic flag.
#[derive(Debug)]
pub struct Follower {
    /// The offset (wall − monotonic, µs) at start-up: the most it may be.
    ceiling_us: i128,
    /// Whether the wall clock is past the ceiling (a step not followed).
    ahead: AtomicBool,
}

impl Follower {
    /// Starts from the clocks as they read now: the wall clock is taken as it is.
    pub fn new(wall_us: i128, mono_us: u64) -> Follower {
        Follower {
            ceiling_us: wall_us - i128::from(mono_us),
            ahead: AtomicBool::new(false),
        }
    }

    /// The wall clock (µs since the epoch) to use when the system's reads
    /// `wall_us` and the monotonic clock `mono_us`.
    pub fn follow_reading(&self, wall_us: i128, mono_us: u64) -> i128 {
        let offset = wall_us - i128::from(mono_us);
        if offset <= self.ceiling_us {
            // Written only when it changes: a flag every reader shares.
            if self.ahead.load(Ordering::Relaxed) {
                self.ahead.store(false, Ordering::Relaxed);
            }
            return wall_us;
        }
        let step = offset - self.ceiling_us;
        let was_ahead = self.ahead.swap(true, Ordering::Relaxed);
        if !was_ahead && step > STEP_WORTH_SAYING_US {
            tracing::warn!(
                step_ms = step / 1000,
                "the system's clock stepped forward against the monotonic clock: delayline \
                 keeps to the time it had, so that no task is early, and its tasks are late by \
                 the step; restart it to take the new time (see the guide's Clocks)"
            );
        }
        i128::from(mono_us) + self.ceiling_us
    }
}

/// This process's follower, shared by every reader of the wall clock,
/// started by the first.
fn follower(wall_us: i128, mono_us: u64) -> &'static Follower {
    static FOLLOWER: OnceLock<Follower> = OnceLock::new();
    FOLLOWER.get_or_init(|| Follower::new(wall_us, mono_us))
}

/// The wall clock, now, in epoch milliseconds.
pub fn now_ms() -> u64 {
    epoch_ms(now())
}

/// `time` in epoch milliseconds, rounded down; 0 before the epoch.
pub fn epoch_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// RFC 3339 in UTC with exactly three digits of milliseconds, so that
/// times sort and align as text: `2026-11-22T14:05:00.060Z`.
const MILLIS_RFC3339: &[time::format_description::BorrowedFormatItem<'static>] = time::macros::format_description!(
    "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
);

/// Formats epoch milliseconds as RFC 3339 in UTC, with millisecond precision.
pub fn format_epoch_ms(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(MILLIS_RFC3339).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// Parses an RFC 3339 time into epoch milliseconds, rounded down.
pub fn parse_epoch_ms(text: &str) -> Option<u64> {
    let at = OffsetDateTime::parse(text, &Rfc3339).ok()?;
    u64::try_from(at.unix_timestamp_nanos().div_euclid(1_000_000)).ok()
}

/// The clocks read at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    /// The wall clock, whole: a due time is counted from it, rounded up.
    pub wall: SystemTime,
    /// The wall clock, epoch milliseconds.
    pub wall_ms: u64,
    /// The monotonic clock of [`source`], microseconds.
    pub mono_us: u64,
    /// Whose monotonic clock: this process's name for it.
    pub source: &'static str,
}

struct Origin {
    start: Instant,
    source: String,
}

fn origin() -> &'static Origin {
    static ORIGIN: OnceLock<Origin> = OnceLock::new();
    ORIGIN.get_or_init(|| Origin {
        start: Instant::now(),
        // A fresh name per process: its monotonic clock starts anew.
        source: format!("{:016x}", rand::random::<u64>()),
    })
}

/// The name of this process's monotonic clock.
pub fn source() -> &'static str {
    &origin().source
}

/// This process's monotonic clock, in microseconds since it started.
pub fn mono_us() -> u64 {
    u64::try_from(origin().start.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Both clocks, now: the wall clock first. A due time is counted from the
/// wall reading and held by the monotonic one, so a monotonic reading taken
/// after it (the thread preempted between the two) can only hold a task
/// longer, never release it before its due time.
pub fn read() -> Reading {
    let wall = now();
    let mono_us = mono_us();
    Reading {
        wall,
        wall_ms: epoch_ms(wall),
        mono_us,
        source: source(),
    }
}

/// A task waiting for the monotonic clock to reach `at_us`.
struct Alarm {
    at_us: u64,
    /// Orders alarms of one moment by arrival, so none compares equal.
    seq: u64,
    wake: tokio::sync::oneshot::Sender<()>,
}

impl PartialEq for Alarm {
    fn eq(&self, other: &Self) -> bool {
        (self.at_us, self.seq) == (other.at_us, other.seq)
    }
}

impl Eq for Alarm {}

impl PartialOrd for Alarm {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Alarm {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_us, self.seq).cmp(&(other.at_us, other.seq))
    }
}

/// The alarm thread's inbox, the thread started on first use.
fn alarms() -> Option<&'static mpsc::Sender<Alarm>> {
    static ALARMS: OnceLock<Option<mpsc::Sender<Alarm>>> = OnceLock::new();
    ALARMS
        .get_or_init(|| {
            let (sender, inbox) = mpsc::channel();
            std::thread::Builder::new()
                .name("delayline-alarm".to_owned())
                .spawn(move || ring(&inbox))
                .ok()
                .map(|_| sender)
        })
        .as_ref()
}

/// The alarm thread: wakes each alarm once the clock reaches its moment,
/// sleeping to the earliest in between.
fn ring(inbox: &mpsc::Receiver<Alarm>) {
    let mut waiting: BinaryHeap<Reverse<Alarm>> = BinaryHeap::new();
    loop {
        let now = mono_us();
        while waiting
            .peek()
            .is_some_and(|Reverse(alarm)| alarm.at_us <= now)
        {
            if let Some(Reverse(alarm)) = waiting.pop() {
                // Its waiter may be gone (shut down): nothing to wake.
                let _ = alarm.wake.send(());
            }
        }
        let next = match waiting.peek() {
            Some(Reverse(alarm)) => inbox.recv_timeout(Duration::from_micros(alarm.at_us - now)),
            None => inbox.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(alarm) => waiting.push(Reverse(alarm)),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// How long after the moment tokio's timer wakes a wait the alarm has not
/// woken: the alarm is for precision, never the only way a wait ends.
const BACKSTOP_US: u64 = 3_000;

/// Resolves once this process's monotonic clock ([`mono_us`]) reads
/// `at_us` or later: within about a tenth of a millisecond of it, where
/// tokio's timer would take 1 to 2.5 ms. Should the alarm thread not wake
/// it (it could not start, or its timed waits misbehave, as under a
/// library that fakes the clock), tokio's timer ends the wait a little
/// later, as it did before the alarm.
pub async fn until_mono_us(at_us: u64) {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    while let Some(left_us) = at_us.checked_sub(mono_us()).filter(|left| *left > 0) {
        let (wake, woken) = tokio::sync::oneshot::channel();
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let backstop = tokio::time::sleep(Duration::from_micros(left_us + BACKSTOP_US));
        if alarms().is_some_and(|alarms| alarms.send(Alarm { at_us, seq, wake }).is_ok()) {
            tokio::select! {
                _ = woken => {}
                () = backstop => {}
            }
        } else {
            backstop.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EPOCH_US: i128 = 1_800_000_000_000_000;

    #[test]
    fn a_clock_that_runs_with_the_monotonic_one_is_taken_as_it_is() {
        let follower = Follower::new(EPOCH_US, 0);
        for second in 1..100u64 {
            let mono = second * 1_000_000;
            let wall = EPOCH_US + i128::from(mono);
            assert_eq!(follower.follow_reading(wall, mono), wall);
        }
    }

    #[test]
    fn a_step_forward_is_not_followed_and_a_step_back_is_at_once() {
        let follower = Follower::new(EPOCH_US, 0);
        let true_wall = |mono: u64| EPOCH_US + i128::from(mono);
        // Stepped 5 s ahead at 10 s: still the true time.
        let at = 10_000_000;
        let followed = follower.follow_reading(true_wall(at) + 5_000_000, at);
        assert_eq!(followed, true_wall(at));
        // 3 s behind the true time: followed at once.
        let at = 20_000_000;
        assert_eq!(
            follower.follow_reading(true_wall(at) - 3_000_000, at),
            true_wall(at) - 3_000_000
        );
        // Back to the true time, where it had been: followed at once too.
        let at = 30_000_000;
        assert_eq!(follower.follow_reading(true_wall(at), at), true_wall(at));
    }

    proptest! {
        /// Whatever the system's clock does, the clock followed is never
        /// ahead of it, nor of the time at start-up plus the monotonic
        /// time elapsed.
        #[test]
        fn the_followed_clock_is_never_ahead_of_the_true_time(
            steps in proptest::collection::vec((1u64..5_000_000, -10_000_000i128..10_000_000), 1..40)
        ) {
            let follower = Follower::new(EPOCH_US, 0);
            let mut mono = 0u64;
            for (elapsed, offset) in steps {
                mono += elapsed;
                let wall = EPOCH_US + i128::from(mono) + offset;
                let followed = follower.follow_reading(wall, mono);
                prop_assert!(followed <= wall);
                prop_assert!(followed <= EPOCH_US + i128::from(mono));
                prop_assert!(offset > 0 || followed == wall);
            }
        }
    }

    #[test]
    fn the_monotonic_clock_only_moves_forward_and_keeps_its_name() {
        let first = read();
        let second = read();
        assert!(second.mono_us >= first.mono_us);
        assert_eq!(first.source, second.source);
        assert_eq!(source().len(), 16);
    }

    #[tokio::test]
    async fn a_wait_ends_at_its_moment_never_before() {
        let mut late_us = Vec::new();
        let waits = (0..200u64).map(|n| {
            let at_us = mono_us() + 2_000 + n * 97 % 5_000;
            async move {
                until_mono_us(at_us).await;
                mono_us() - at_us
            }
        });
        for late in futures_util::future::join_all(waits).await {
            late_us.push(late);
        }
        late_us.sort_unstable();
        // Never before (the subtraction would have wrapped); and on time
        // for most, however loaded the machine running the tests is.
        assert!(late_us[100] < 50_000, "{late_us:?}");
        until_mono_us(0).await;
    }
}
