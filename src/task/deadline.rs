//! Deadlines, pure: when a task that could not be delivered in time is no
//! longer wanted. A reminder delivered two hours late (after an outage,
//! behind a paused destination) is worse than none; a task with a
//! deadline is never published to its destination after it, and becomes
//! `expired` instead.
//!
//! A deadline is kept as an instant (epoch milliseconds), whichever way it
//! was asked for: an RFC 3339 time (`deadline`), or how late the task may
//! be after its own moment (`max_lateness`). A move keeps how late the task
//! may be, not the instant: the deadline moves with the due time (a task
//! moved past its old deadline was moved to be delivered then).

/// The latest deadline there is: the last millisecond of the year 9999,
/// the last an RFC 3339 time can say (a later one could not be shown).
pub const LATEST_MS: u64 = 253_402_300_799_999;

/// Why a deadline is refused, said of the field it was given in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeadlineError {
    /// An instant before the end of the task's window (its due time, or
    /// the end of its leeway): some moment it may be delivered at would be
    /// past it.
    BeforeDue {
        deadline_ms: u64,
        window_end_ms: u64,
    },
    /// Past [`LATEST_MS`].
    TooLate,
}

/// A task's deadline as asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AskedDeadline {
    /// An instant, epoch milliseconds.
    At(u64),
    /// How late after its own moment it may still be delivered.
    LatenessAtMost(u64),
}

impl AskedDeadline {
    /// The deadline of a task delivered at `moment_ms`, the moment drawn in
    /// a window that ends at `window_end_ms` (its due time without a
    /// leeway). An instant must not fall inside the window: a task's
    /// moment is drawn from its id, and whether a task is refused must not
    /// depend on which moment it drew.
    pub fn resolve(self, moment_ms: u64, window_end_ms: u64) -> Result<u64, DeadlineError> {
        match self {
            AskedDeadline::At(deadline_ms) if deadline_ms < window_end_ms => {
                Err(DeadlineError::BeforeDue {
                    deadline_ms,
                    window_end_ms,
                })
            }
            AskedDeadline::At(deadline_ms) if deadline_ms <= LATEST_MS => Ok(deadline_ms),
            AskedDeadline::LatenessAtMost(ms) if moment_ms.saturating_add(ms) <= LATEST_MS => {
                Ok(moment_ms + ms)
            }
            _ => Err(DeadlineError::TooLate),
        }
    }
}

/// Whether a task with `deadline_ms` may no longer be published at
/// `now_ms`. The deadline itself is still in time.
pub fn passed(deadline_ms: Option<u64>, now_ms: u64) -> bool {
    deadline_ms.is_some_and(|deadline| now_ms > deadline)
}

/// The deadline of a task moved from `old_moment_ms` to `new_moment_ms`:
/// as late after its new moment as it was allowed after its old one.
pub fn moved(deadline_ms: Option<u64>, old_moment_ms: u64, new_moment_ms: u64) -> Option<u64> {
    let allowed = deadline_ms?.saturating_sub(old_moment_ms);
    Some(new_moment_ms.saturating_add(allowed).min(LATEST_MS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A resolved deadline is never before the task's moment, so a task
        /// is never expired before it could have been delivered.
        #[test]
        fn a_deadline_is_never_before_the_moment(
            window_start in 0u64..1 << 45,
            leeway in 0u64..100_000,
            offset_share in 0u64..=1000,
            asked in 0u64..1 << 49,
            lateness in 0u64..1 << 49,
        ) {
            let window_end = window_start + leeway;
            let moment = window_start + leeway * offset_share / 1000;
            for ask in [AskedDeadline::At(asked), AskedDeadline::LatenessAtMost(lateness)] {
                match ask.resolve(moment, window_end) {
                    Ok(deadline) => {
                        prop_assert!(deadline >= moment);
                        prop_assert!(!passed(Some(deadline), moment));
                        if let AskedDeadline::At(at) = ask {
                            prop_assert_eq!(deadline, at);
                            prop_assert!(at >= window_end);
                        }
                    }
                    Err(DeadlineError::BeforeDue { deadline_ms, window_end_ms }) => {
                        prop_assert_eq!(ask, AskedDeadline::At(deadline_ms));
                        prop_assert!(deadline_ms < window_end_ms);
                    }
                    Err(DeadlineError::TooLate) => match ask {
                        AskedDeadline::At(at) => prop_assert!(at > LATEST_MS),
                        AskedDeadline::LatenessAtMost(ms) => {
                            prop_assert!(moment + ms > LATEST_MS);
                        }
                    },
                }
            }
        }

        /// Passed exactly after the deadline, never at it, never without one.
        #[test]
        fn passed_only_after_the_deadline(deadline in 0u64..1 << 50, now in 0u64..1 << 50) {
            prop_assert_eq!(passed(Some(deadline), now), now > deadline);
            prop_assert!(!passed(None, now));
        }

        /// A move keeps the lateness allowed, whichever way the task moves.
        #[test]
        fn a_move_keeps_the_lateness_allowed(
            old in 0u64..1 << 45,
            new in 0u64..1 << 45,
            allowed in 0u64..1 << 40,
        ) {
            let moved = moved(Some(old + allowed), old, new);
            prop_assert_eq!(moved, Some((new + allowed).min(LATEST_MS)));
            prop_assert_eq!(super::moved(None, old, new), None);
        }
    }
}
