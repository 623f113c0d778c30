//! Lateness over the last few minutes, for the console's overview: the
//! Prometheus histogram counts since the process started, which says
//! nothing about now, and a scrape-side `rate()` is not there without
//! Prometheus. Pure: the clock is an argument.
//!
//! One slot per minute, each a histogram of log-linear buckets (exact up
//! to 64 ms, then 16 buckets per power of two: under 6.25 % wide), so a
//! quantile is reported as its bucket's upper bound, never below the
//! true value.

/// Minutes the summary covers.
pub const WINDOW_MINUTES: u64 = 5;
const EXACT: u64 = 64;
const SUB_BITS: u32 = 4;
/// Values above about 2^40 ms (35 years) share the last bucket.
const TOP_EXPONENT: u32 = 40;
const BUCKETS: usize = EXACT as usize + ((TOP_EXPONENT - 6 + 1) << SUB_BITS) as usize;
const MINUTE_MS: u64 = 60_000;

#[derive(Debug, Clone)]
struct Slot {
    minute: u64,
    total: u64,
    counts: Vec<u32>,
}

/// The last [`WINDOW_MINUTES`] minutes of deliveries' lateness.
#[derive(Debug, Clone)]
pub struct RecentLateness {
    slots: Vec<Slot>,
    /// The first observation's time: a younger process's window is shorter.
    since_ms: Option<u64>,
}

/// What the overview shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatenessSummary {
    pub delivered: u64,
    /// Deliveries per second over the window (or since the first one).
    pub per_second: f64,
    /// Upper bounds of the buckets holding the quantiles.
    pub p50_ms: u64,
    pub p99_ms: u64,
}

fn bucket(lateness_ms: u64) -> usize {
    if lateness_ms < EXACT {
        return lateness_ms as usize;
    }
    let exponent = (63 - lateness_ms.leading_zeros()).min(TOP_EXPONENT);
    let sub = if exponent == TOP_EXPONENT && lateness_ms >> (TOP_EXPONENT + 1) > 0 {
        (1 << SUB_BITS) - 1
    } else {
        (lateness_ms >> (exponent - SUB_BITS)) & ((1 << SUB_BITS) - 1)
    };
    EXACT as usize + (((exponent - 6) << SUB_BITS) as u64 + sub) as usize
}

/// The largest value `bucket` puts in `index`.
fn upper_bound(index: usize) -> u64 {
    if (index as u64) < EXACT {
        return index as u64;
    }
    let past = index as u64 - EXACT;
    let exponent = 6 + (past >> SUB_BITS) as u32;
    let sub = past & ((1 << SUB_BITS) - 1);
    (((1 << SUB_BITS) + sub + 1) << (exponent - SUB_BITS)) - 1
}

impl Default for RecentLateness {
    fn default() -> Self {
        Self::new()
    }
}

impl RecentLateness {
    pub fn new() -> Self {
        let slot = Slot {
            minute: 0,
            total: 0,
            counts: vec![0; BUCKETS],
        };
        RecentLateness {
            slots: vec![slot; WINDOW_MINUTES as usize],
            since_ms: None,
        }
    }

    pub fn observe(&mut self, now_ms: u64, lateness_ms: u64) {
        self.since_ms.get_or_insert(now_ms);
        let minute = now_ms / MINUTE_MS;
        let slot = &mut self.slots[(minute % WINDOW_MINUTES) as usize];
        if slot.minute != minute {
            slot.minute = minute;
            slot.total = 0;
            slot.counts.fill(0);
        }
        slot.total += 1;
        slot.counts[bucket(lateness_ms)] += 1;
    }

    /// The window ending at `now_ms`; None when nothing was delivered in it.
    pub fn summary(&self, now_ms: u64) -> Option<LatenessSummary> {
        let minute = now_ms / MINUTE_MS;
        let live: Vec<&Slot> = self
            .slots
            .iter()
            .filter(|s| s.total > 0 && s.minute <= minute && minute - s.minute < WINDOW_MINUTES)
            .collect();
        let delivered: u64 = live.iter().map(|s| s.total).sum();
        if delivered == 0 {
            return None;
        }
        let window_start = (minute + 1 - WINDOW_MINUTES.min(minute + 1)) * MINUTE_MS;
        let from = window_start.max(self.since_ms.unwrap_or(window_start));
        let seconds = (now_ms.saturating_sub(from) as f64 / 1000.0).max(1.0);
        let quantile = |q: f64| {
            let rank = ((delivered as f64 * q).ceil() as u64).max(1);
            let mut seen = 0;
            for index in 0..BUCKETS {
                seen += live.iter().map(|s| u64::from(s.counts[index])).sum::<u64>();
                if seen >= rank {
                    return upper_bound(index);
                }
            }
            upper_bound(BUCKETS - 1)
        };
        Some(LatenessSummary {
            delivered,
            per_second: delivered as f64 / seconds,
            p50_ms: quantile(0.50),
            p99_ms: quantile(0.99),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_tile_the_values_in_order() {
        for index in 0..BUCKETS - 1 {
            let top = upper_bound(index);
            assert_eq!(bucket(top), index, "{index}");
            assert_eq!(bucket(top + 1), index + 1, "{index}");
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn nothing_delivered_is_no_summary() {
        let recent = RecentLateness::new();
        assert_eq!(recent.summary(1_000_000), None);
    }

    #[test]
    fn old_minutes_leave_the_window() {
        let mut recent = RecentLateness::new();
        recent.observe(0, 500);
        let later = WINDOW_MINUTES * MINUTE_MS;
        assert_eq!(recent.summary(later), None);
        recent.observe(later, 3);
        let summary = recent.summary(later + 1000).unwrap();
        assert_eq!((summary.delivered, summary.p99_ms), (1, 3));
    }

    #[test]
    fn the_rate_counts_from_the_first_delivery() {
        let mut recent = RecentLateness::new();
        let start = 10 * MINUTE_MS + 5_000;
        for i in 0..100 {
            recent.observe(start + i * 100, 7);
        }
        let summary = recent.summary(start + 10_000).unwrap();
        assert!((summary.per_second - 10.0).abs() < 0.01, "{summary:?}");
    }

    proptest! {
        /// Against the exact quantile of the same values: never below it,
        /// at most one bucket's width above.
        #[test]
        fn quantiles_are_their_buckets_upper_bounds(
            values in prop::collection::vec(0u64..10_000_000, 1..400),
            now in 0u64..1_000_000_000,
        ) {
            let mut recent = RecentLateness::new();
            for v in &values {
                recent.observe(now, *v);
            }
            let summary = recent.summary(now).unwrap();
            let mut sorted = values.clone();
            sorted.sort_unstable();
            for (q, reported) in [(0.50, summary.p50_ms), (0.99, summary.p99_ms)] {
                let rank = ((sorted.len() as f64 * q).ceil() as usize).max(1);
                let exact = sorted[rank - 1];
                prop_assert!(reported >= exact, "q{q}: {reported} < {exact}");
                prop_assert!(reported as f64 <= exact as f64 * 1.0625 + 1.0, "q{q}: {reported} vs {exact}");
            }
            prop_assert_eq!(summary.delivered, values.len() as u64);
        }
    }
}
