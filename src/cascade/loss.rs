//! What a lost connection makes suspect, as pure logic: which due times the
//! ledger looks at, and when, after delayline connected again.
//!
//! A failover to another node is when RabbitMQ is least to be trusted. On
//! 3.10 it lost messages it had just confirmed (RELIABILITY.md), and a
//! level can keep what it held at the loss, expired and checked out to a
//! dead-letter worker that is gone, while it passes every message after:
//! the probes of [`super::LevelWatch`] see such a level only if one was
//! inside it at that moment. The ledger's resender would publish those
//! tasks again a minute late. So, for a while after a failover, every task
//! still not seen at the release stage the stranded margin after its due
//! time is published again then: the release stage drops whichever copy
//! comes second, so a task that was merely slow costs one publish more.
//!
//! The window runs from the last moment the old connection was known to
//! be up until the watched levels' whole span after the reconnect: a
//! message the broker held at the loss, or took while its queues elected
//! new leaders, is due by then if it waits only in levels delayline
//! probes. Longer waits are the resender's. An outage longer than
//! [`FAILOVER_MS`] opens no window: the backlog it leaves in the release
//! queue would make the margin take every task behind it for lost, and
//! publishing them all again would double the load when it is highest
//! (which is why the resender waits a minute).

/// The longest a reconnect may take to count as a failover.
pub const FAILOVER_MS: u64 = 30_000;

/// The due times still to be looked at after failovers, and the state of
/// the connection as last seen. Every time is the wall clock, in ms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LossWindow {
    /// `[from, until)`: due times not looked at yet; none when `from >= until`.
    from_ms: u64,
    until_ms: u64,
    /// Connections set up so far, as last seen.
    sessions: u64,
    /// The last time the connection was seen up.
    up_ms: Option<u64>,
}

impl LossWindow {
    /// The broker's state at `now_ms`: `sessions` connections set up so
    /// far, one of them up now or not. A count grown while one was up
    /// before is a reconnect: within [`FAILOVER_MS`] of when the old one
    /// was last seen, it opens (or widens) the window up to `horizon_ms`
    /// after now.
    pub fn observe(&mut self, now_ms: u64, sessions: u64, connected: bool, horizon_ms: u64) {
        let reconnected = sessions > self.sessions;
        if let (true, Some(up_ms)) = (reconnected, self.up_ms)
            && now_ms.saturating_sub(up_ms) <= FAILOVER_MS
        {
            // Open, the window goes on from where it is (what lies before
            // was looked at); closed, from the loss, but never again over
            // what an earlier window looked at.
            if !self.is_open() {
                self.from_ms = self.from_ms.max(up_ms);
            }
            self.until_ms = self.until_ms.max(now_ms.saturating_add(horizon_ms));
        }
        self.sessions = sessions;
        if connected {
            self.up_ms = Some(now_ms);
        }
    }

    /// The due times to look at now, `[from, to)`: those overdue by
    /// `margin_ms` and not looked at yet. `None` when there are none.
    pub fn due(&self, now_ms: u64, margin_ms: u64) -> Option<(u64, u64)> {
        let to_ms = now_ms.saturating_sub(margin_ms).min(self.until_ms);
        (to_ms > self.from_ms).then_some((self.from_ms, to_ms))
    }

    /// The due times before `to_ms` were looked at.
    pub fn looked(&mut self, to_ms: u64) {
        self.from_ms = self.from_ms.max(to_ms);
    }

    /// Whether due times remain to be looked at.
    pub fn is_open(&self) -> bool {
        self.from_ms < self.until_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Connected from 10,000 on (the first connection), polled every second.
    fn connected_at_start() -> LossWindow {
        let mut window = LossWindow::default();
        window.observe(10_000, 1, true, 5_000);
        window
    }

    #[test]
    fn the_first_connection_opens_nothing() {
        let mut window = LossWindow::default();
        window.observe(10_000, 0, false, 5_000);
        window.observe(11_000, 1, true, 5_000);
        assert!(!window.is_open());
        assert_eq!(window.due(100_000, 0), None);
    }

    #[test]
    fn a_failover_opens_the_window_from_the_last_moment_up() {
        let mut window = connected_at_start();
        window.observe(11_000, 1, true, 5_000);
        window.observe(12_000, 1, false, 5_000);
        window.observe(13_000, 2, true, 5_000);
        assert!(window.is_open());
        // Up at 11,000 for the last time: due times from then on, to 18,000.
        assert_eq!(window.due(13_000, 1_000), Some((11_000, 12_000)));
        window.looked(12_000);
        assert_eq!(window.due(13_500, 1_000), Some((12_000, 12_500)));
        assert_eq!(window.due(40_000, 1_000), Some((12_000, 18_000)));
        window.looked(18_000);
        assert!(!window.is_open());
        assert_eq!(window.due(50_000, 1_000), None);
    }

    #[test]
    fn a_reconnect_between_two_looks_counts_too() {
        let mut window = connected_at_start();
        // Lost and back within the poll: the count says so.
        window.observe(11_000, 2, true, 5_000);
        assert_eq!(window.due(13_000, 1_000), Some((10_000, 12_000)));
    }

    #[test]
    fn an_outage_longer_than_a_failover_opens_nothing() {
        let mut window = connected_at_start();
        window.observe(11_000, 1, false, 5_000);
        window.observe(10_000 + FAILOVER_MS + 1, 2, true, 5_000);
        assert!(!window.is_open());
        // Up again now: the next failover counts from here.
        window.observe(50_000, 2, true, 5_000);
        window.observe(51_000, 3, true, 5_000);
        assert_eq!(window.due(60_000, 1_000), Some((50_000, 56_000)));
    }

    #[test]
    fn a_second_failover_widens_an_open_window() {
        let mut window = connected_at_start();
        window.observe(11_000, 2, true, 5_000);
        window.looked(10_500);
        window.observe(14_000, 3, true, 5_000);
        // From where it was (before the second loss's 11,000), to 19,000.
        assert_eq!(window.due(30_000, 1_000), Some((10_500, 19_000)));
    }

    proptest! {
        /// Whatever the polls see: no due time is looked at before it is
        /// overdue by the margin, none twice, none outside the failovers'
        /// reach, and each due time a failover made suspect is looked at
        /// by the end.
        #[test]
        fn every_suspect_due_time_is_looked_at_once_and_only_once_overdue(
            steps in proptest::collection::vec((1u64..20_000, any::<bool>(), 0u64..3), 1..40),
            horizon_ms in 0u64..20_000,
            margin_ms in 0u64..5_000,
        ) {
            let mut window = LossWindow::default();
            let (mut now_ms, mut sessions) = (1_000u64, 0u64);
            let mut up_ms: Option<u64> = None;
            // What each failover makes suspect: from the last moment up to
            // the horizon after the reconnect.
            let mut suspect: Vec<(u64, u64)> = Vec::new();
            let mut looked: Vec<(u64, u64)> = Vec::new();
            let look = |window: &mut LossWindow, now_ms: u64, looked: &mut Vec<(u64, u64)>| {
                if let Some((from, to)) = window.due(now_ms, margin_ms) {
                    assert!(from < to && to + margin_ms <= now_ms, "only once overdue");
                    looked.push((from, to));
                    window.looked(to);
                }
            };
            for (gap_ms, connected, new_sessions) in steps {
                now_ms += gap_ms;
                sessions += new_sessions;
                if let Some(up) = up_ms.filter(|&up| new_sessions > 0 && now_ms - up <= FAILOVER_MS) {
                    suspect.push((up, now_ms + horizon_ms));
                }
                window.observe(now_ms, sessions, connected, horizon_ms);
                if connected {
                    up_ms = Some(now_ms);
                }
                look(&mut window, now_ms, &mut looked);
            }
            look(&mut window, now_ms + 1_000_000, &mut looked);
            prop_assert!(!window.is_open());
            for pair in looked.windows(2) {
                prop_assert!(pair[0].1 <= pair[1].0, "looked at twice: {looked:?}");
            }
            let reach = (
                suspect.iter().map(|s| s.0).min().unwrap_or(0),
                suspect.iter().map(|s| s.1).max().unwrap_or(0),
            );
            for &(from, to) in &looked {
                prop_assert!(reach.0 <= from && to <= reach.1, "{from}..{to} {suspect:?}");
            }
            for &(a, b) in suspect.iter().filter(|(a, b)| a < b) {
                for t in [a, (a + b) / 2, b - 1] {
                    prop_assert!(
                        looked.iter().any(|&(from, to)| from <= t && t < to),
                        "due time {t} of {a}..{b} never looked at: {looked:?}"
                    );
                }
            }
        }
    }
}
