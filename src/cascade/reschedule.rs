//! Moving a waiting message from one chain to another, as pure logic.
//!
//! A message inside a level queue carries its whole routing key (L digits,
//! then the destination) and the due time set when it was accepted
//! (its deliver-at header). That is enough to route it afresh
//! in another chain by what remains of its delay, rounded up to the new
//! unit: never early.

use std::time::Duration;

use super::route::{Route, destination_of};
use super::settings::Cascade;

/// Why a message cannot be rescheduled; it goes to the poison queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unschedulable {
    #[error("no due time: the message carries no deliver-at header")]
    NoDeliverAt,
    #[error("routing key {0:?} does not start with {1} binary digits and a destination")]
    MalformedKey(String, u32),
    #[error("{0}")]
    Route(#[from] super::route::RouteError),
}

impl Cascade {
    /// The route in this chain of a message taken from a chain of
    /// `old_levels` levels, due at `deliver_at_ms`, as of `now_ms`. An
    /// overdue message routes with a zero delay: straight to the business exchange.
    pub fn reschedule(
        &self,
        routing_key: &str,
        old_levels: u32,
        deliver_at_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<Route, Unschedulable> {
        let deliver_at_ms = deliver_at_ms.ok_or(Unschedulable::NoDeliverAt)?;
        let destination = destination_of(routing_key, old_levels)
            .ok_or_else(|| Unschedulable::MalformedKey(routing_key.to_owned(), old_levels))?;
        let remaining = Duration::from_millis(deliver_at_ms.saturating_sub(now_ms));
        Ok(self.route(remaining, destination)?)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::cascade::CascadeSettings;

    fn cascade(levels: u32, unit_ms: u64) -> Cascade {
        CascadeSettings {
            levels,
            unit_ms,
            queue_type: crate::cascade::QueueType::Classic,
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap()
    }

    #[test]
    fn malformed_keys_and_missing_headers_are_unschedulable() {
        let new = cascade(4, 10);
        assert_eq!(
            new.reschedule("1.0.d", 2, None, 0),
            Err(Unschedulable::NoDeliverAt)
        );
        for key in ["1.0", "1.2.d", "1.0.", "d"] {
            assert!(
                matches!(
                    new.reschedule(key, 2, Some(0), 0),
                    Err(Unschedulable::MalformedKey(..))
                ),
                "{key}"
            );
        }
        // Destinations may themselves start with digits.
        assert_eq!(destination_of("0.1.1.0.x", 2), Some("1.0.x"));
        // Beyond the new chain's longest delay.
        assert!(matches!(
            new.reschedule("1.d", 1, Some(1_000_000), 0),
            Err(Unschedulable::Route(_))
        ));
    }

    #[test]
    fn overdue_goes_straight_to_the_business_exchange() {
        let new = cascade(4, 10);
        let route = new.reschedule("1.1.d", 2, Some(500), 900).unwrap();
        assert_eq!(route.routing_key, "0.0.0.0.d");
        assert_eq!(route.entry_exchange, new.business_exchange());
    }

    proptest! {
        #[test]
        fn never_early_at_most_one_new_unit_late_destination_kept(
            old_levels in 1u32..20,
            new_levels in 8u32..24,
            new_unit in 1u64..500,
            destination in "[a-z0-9]{1,6}(\\.[0-9a-z]{1,4}){0,3}",
            old_digits in any::<u64>(),
            now_ms in 1_600_000_000_000u64..1_900_000_000_000,
            remaining_ms in -10_000i64..2_000_000,
            quorum in any::<bool>(),
        ) {
            let new = if quorum {
                crate::cascade::for_tests(new_levels, new_unit, crate::cascade::QueueType::Quorum)
            } else {
                cascade(new_levels, new_unit)
            };
            // A quorum queue may take a millisecond off each hop, and 1 %
            // off the whole while its clock catches up: up to a level's
            // worth of milliseconds and that 1 % more than the remaining
            // time needs.
            let slack = |wanted: u64| match quorum {
                true => u64::from(new_levels) + 2 * crate::cascade::ttl_fast_by(wanted + new_unit + u64::from(new_levels)),
                false => 0,
            };
            let digits: Vec<String> = (0..old_levels)
                .rev()
                .map(|l| (old_digits >> l & 1).to_string())
                .collect();
            let key = format!("{}.{destination}", digits.join("."));
            let deliver_at = (now_ms as i64 + remaining_ms).max(0) as u64;
            match new.reschedule(&key, old_levels, Some(deliver_at), now_ms) {
                Ok(route) => {
                    let wanted = remaining_ms.max(0) as u64;
                    prop_assert!(route.delay_ms >= wanted);
                    prop_assert!(route.delay_ms < wanted + new_unit + slack(wanted));
                    prop_assert!(route.delay_units * new_unit < wanted + new_unit + slack(wanted));
                    prop_assert_eq!(new.route_units(route.delay_units, &destination), route.clone());
                    prop_assert_eq!(destination_of(&route.routing_key, new_levels), Some(destination.as_str()));
                }
                Err(Unschedulable::Route(_)) => {
                    prop_assert!(remaining_ms as u64 > new.max_delay_ms());
                }
                Err(other) => prop_assert!(false, "{other}"),
            }
        }
    }
}
