//! This process's clocks, read in one place.
//!
//! Two clocks, for two jobs. The wall clock (epoch milliseconds) names due
//! times: it is what clients and the ledger speak. A monotonic clock, known
//! by a name drawn at start-up ([`source`]), measures holds: the release
//! stage never compares its wall clock with a due time another host wrote
//! (see [`crate::scheduler::hold`]), because hosts' wall clocks disagree.
//! A stamp carries a reading of this monotonic clock from the replica that
//! published to the replica that releases, which bounds the offset between
//! the two from what it sees arrive.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime};

use crate::task::epoch_ms;

/// The clocks read at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
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

/// Both clocks, now.
pub fn read() -> Reading {
    let mono_us = mono_us();
    Reading {
        wall_ms: epoch_ms(SystemTime::now()),
        mono_us,
        source: source(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_only_moves_forward_and_keeps_its_name() {
        let first = read();
        let second = read();
        assert!(second.mono_us >= first.mono_us);
        assert_eq!(first.source, second.source);
        assert_eq!(source().len(), 16);
    }
}
