//! How far ahead the planner plans: the lead follows the load (issue 71).
//!
//! A lone schedule's occurrence becomes a task `schedules.lead_ms` before
//! its time. Fifty thousand firing at one instant cannot all become tasks in
//! that lead's last moments: the planner makes a few thousand a second, and
//! what it has not made by the instant comes out late. So an instant that
//! many schedules share is planned earlier, by as long as making its
//! occurrences (and those of every crowded instant before it) takes at
//! `schedules.plan_rate`, and never further ahead than the chain can hold.

/// Occurrences the planner is counted on to make per second by default
/// (`schedules.plan_rate`): about half what it made on two cores with
/// SQLite (the schedules page), so that the lead it asks for is long enough
/// when the machine is busy too.
pub const PLAN_RATE_PER_S: u64 = 2_500;

/// How far ahead the planner plans at `now_ms`: at least `lead_ms`, and
/// through each later instant of `instants` (in time order, each with how
/// many schedules fall on it) whose occurrences, with those of the
/// instants before it beyond the lead, take longer to make at
/// `rate_per_s` than is left before it beyond the lead; never past
/// `max_ms` after now (the chain's longest delay).
pub fn horizon(
    now_ms: u64,
    lead_ms: u64,
    max_ms: u64,
    instants: &[(u64, u64)],
    rate_per_s: u64,
) -> u64 {
    let lead_ms = lead_ms.min(max_ms);
    let base = now_ms.saturating_add(lead_ms);
    let farthest = now_ms.saturating_add(max_ms);
    let rate_per_s = rate_per_s.max(1);
    let mut horizon = base;
    let mut ahead: u64 = 0;
    for &(at_ms, count) in instants.iter().filter(|(at, _)| *at > base) {
        if at_ms > farthest {
            break;
        }
        ahead = ahead.saturating_add(count);
        let making_ms = ahead.saturating_mul(1000) / rate_per_s;
        if at_ms <= base.saturating_add(making_ms) {
            horizon = at_ms;
        }
    }
    horizon
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_lone_schedule_keeps_the_lead() {
        assert_eq!(horizon(0, 30_000, 600_000, &[(40_000, 1)], 2_500), 30_000);
        assert_eq!(horizon(0, 30_000, 600_000, &[], 2_500), 30_000);
    }

    #[test]
    fn a_crowded_instant_is_planned_as_early_as_making_it_takes() {
        // 50,000 at +60 s take 20 s at 2,500/s: planned from 50 s before.
        let crowd = [(60_000, 50_000)];
        assert_eq!(horizon(0, 30_000, 600_000, &crowd, 2_500), 30_000);
        assert_eq!(horizon(9_999, 30_000, 600_000, &crowd, 2_500), 39_999);
        assert_eq!(horizon(10_000, 30_000, 600_000, &crowd, 2_500), 60_000);
    }

    #[test]
    fn never_beyond_the_chain() {
        let crowd = [(100_000, 1_000_000)];
        assert_eq!(horizon(0, 30_000, 60_000, &crowd, 2_500), 30_000);
        assert_eq!(horizon(0, 90_000, 60_000, &[], 2_500), 60_000);
    }

    proptest! {
        /// The horizon is the lead or an instant of the list, within the
        /// chain; every instant it passes over still leaves time enough to
        /// make it and every instant before it (beyond the lead) at the
        /// rate; a larger crowd never plans later.
        #[test]
        fn plans_every_crowd_in_time(
            now in 0u64..1_000_000,
            lead in 0u64..60_000,
            max in 1u64..600_000,
            mut instants in proptest::collection::vec((1u64..700_000, 0u64..200_000), 0..20),
            rate in 1u64..10_000,
            more in 0u64..100_000,
        ) {
            for (at, _) in &mut instants {
                *at += now;
            }
            instants.sort_unstable();
            instants.dedup_by_key(|(at, _)| *at);
            let found = horizon(now, lead, max, &instants, rate);
            let base = now + lead.min(max);
            prop_assert!(found >= base);
            prop_assert!(found <= now + max.max(lead.min(max)));
            prop_assert!(found == base || instants.iter().any(|(at, _)| *at == found));
            let mut ahead = 0;
            for &(at, count) in instants.iter().filter(|(at, _)| *at > base && *at <= now + max) {
                ahead += count;
                if at > found {
                    prop_assert!(at > base + ahead * 1000 / rate);
                }
            }
            if let Some(first) = instants.first_mut() {
                first.1 += more;
            }
            prop_assert!(horizon(now, lead, max, &instants, rate) >= found);
        }
    }
}
