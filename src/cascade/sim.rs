//! A small model of the broker's routing, used to prove the plan correct.
//!
//! It follows topic bindings (`*` is one word, `#` zero or more), holds a
//! message in a queue for the queue's TTL and then follows its dead-letter
//! exchange, exactly as RabbitMQ does for a queue whose messages all share one TTL.

use std::collections::HashMap;

use super::plan::{BindingTarget, ExchangeKind, TopologyPlan};

/// AMQP topic matching of `key` against binding `pattern`.
pub fn topic_matches(pattern: &str, key: &str) -> bool {
    fn go(pattern: &[&str], key: &[&str]) -> bool {
        match pattern.split_first() {
            None => key.is_empty(),
            Some((&"#", rest)) => (0..=key.len()).any(|skip| go(rest, &key[skip..])),
            Some((&"*", rest)) => !key.is_empty() && go(rest, &key[1..]),
            Some((word, rest)) => key.first() == Some(word) && go(rest, &key[1..]),
        }
    }
    let pattern: Vec<&str> = pattern.split('.').collect();
    let key: Vec<&str> = key.split('.').collect();
    go(&pattern, &key)
}

/// A copy of the message reaching an exchange nothing in the plan routes from.
#[derive(Debug, PartialEq, Eq)]
pub struct Arrival {
    pub exchange: String,
    pub routing_key: String,
    pub elapsed_ms: u64,
}

pub struct Simulator<'a> {
    plan: &'a TopologyPlan,
    ttl: HashMap<&'a str, (u64, &'a str)>,
}

impl<'a> Simulator<'a> {
    pub fn new(plan: &'a TopologyPlan) -> Self {
        let ttl = plan
            .queues
            .iter()
            .filter_map(|q| Some((q.name.as_str(), (q.ttl_ms()?, q.dead_letter_exchange()?))))
            .collect();
        Self { plan, ttl }
    }

    /// A fanout exchange ignores routing keys.
    fn fanout(&self, exchange: &str) -> bool {
        self.plan
            .exchanges
            .iter()
            .any(|e| e.name == exchange && e.kind == ExchangeKind::Fanout)
    }

    /// Publishes one message and returns every place a copy of it ends up.
    /// A copy ends at an exchange with no outgoing bindings (the business
    /// exchange), or in a queue without TTL (reported under the queue's name).
    pub fn publish(&self, exchange: &str, routing_key: &str) -> Vec<Arrival> {
        let mut arrivals = Vec::new();
        let mut pending = vec![(exchange.to_owned(), 0u64)];
        let mut hops = 0;
        while let Some((exchange, elapsed_ms)) = pending.pop() {
            hops += 1;
            assert!(hops < 10_000, "routing loop through {exchange}");
            let matching: Vec<_> = self
                .plan
                .bindings
                .iter()
                .filter(|b| {
                    b.source == exchange
                        && (self.fanout(&exchange) || topic_matches(&b.routing_key, routing_key))
                })
                .collect();
            let has_bindings = self.plan.bindings.iter().any(|b| b.source == exchange);
            if !has_bindings {
                arrivals.push(Arrival {
                    exchange,
                    routing_key: routing_key.to_owned(),
                    elapsed_ms,
                });
                continue;
            }
            for binding in matching {
                match &binding.target {
                    BindingTarget::Exchange(next) => pending.push((next.clone(), elapsed_ms)),
                    BindingTarget::Queue(queue) => match self.ttl.get(queue.as_str()) {
                        Some((ttl, dlx)) => pending.push(((*dlx).to_owned(), elapsed_ms + ttl)),
                        None => arrivals.push(Arrival {
                            exchange: queue.clone(),
                            routing_key: routing_key.to_owned(),
                            elapsed_ms,
                        }),
                    },
                }
            }
        }
        arrivals
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::cascade::{
        CascadeSettings, DeliveryKey, QueueType, RouteError, max_levels_for_unit,
    };

    use crate::cascade::for_tests as cascade;

    #[test]
    fn topic_matching_follows_amqp() {
        assert!(topic_matches("*.1.#", "0.1.d"));
        assert!(topic_matches("*.1.#", "0.1.a.b"));
        assert!(!topic_matches("*.1.#", "1.0.d"));
        assert!(topic_matches("#", "a"));
        assert!(topic_matches("#.b", "a.b"));
        assert!(topic_matches("#.b", "b"));
        assert!(topic_matches("*.*.a.b", "0.1.a.b"));
        assert!(!topic_matches("*.*.b", "0.1.a.b"));
        assert!(!topic_matches("*", "a.b"));
    }

    #[test]
    fn worked_example_waits_eight_then_two_seconds() {
        let c = cascade(4, 1000, QueueType::Classic);
        let plan = c.plan();
        let route = c.route(Duration::from_secs(10), "d").unwrap();
        let arrivals = Simulator::new(&plan).publish(&route.entry_exchange, &route.routing_key);
        assert_eq!(
            arrivals,
            [Arrival {
                exchange: "biz".into(),
                routing_key: "1.0.1.0.d".into(),
                elapsed_ms: 10_000
            }]
        );
    }

    /// Every delay of every cascade up to 8 levels, exhaustively.
    #[test]
    fn every_delay_of_small_cascades_arrives_exactly_on_time() {
        for levels in 1..=8 {
            let c = cascade(levels, 7, QueueType::Classic);
            let plan = c.plan();
            let sim = Simulator::new(&plan);
            for units in 0..=c.max_delay_units() {
                let route = c.route_units(units, "a.b");
                let arrivals = sim.publish(&route.entry_exchange, &route.routing_key);
                assert_eq!(arrivals.len(), 1, "levels {levels}, units {units}");
                assert_eq!(arrivals[0].exchange, "biz");
                assert_eq!(arrivals[0].elapsed_ms, units * 7);
                assert_eq!(arrivals[0].routing_key, route.routing_key);
            }
        }
    }

    /// Mostly a unit that keeps `levels` within the broker's TTL limit, sometimes any unit.
    fn levels_and_unit() -> impl Strategy<Value = (u32, u64)> {
        (1u32..=40).prop_flat_map(|levels| {
            let largest_fitting = crate::cascade::MAX_QUEUE_TTL_MS >> (levels - 1);
            let fitting = 1..=largest_fitting.clamp(1, 1_000_000);
            (
                Just(levels),
                prop_oneof![3 => fitting, 1 => 1u64..=1_000_000],
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_delay_arrives_after_exactly_its_effective_delay(
            (levels, unit_ms) in levels_and_unit(),
            quorum in any::<bool>(),
            release_stage in any::<bool>(),
            digits in any::<bool>(),
            version in 1u32..1000,
            fraction in 0.0f64..1.1,
            destination in "[a-z0-9_-]{1,8}(\\.[A-Z0-9_-]{1,8}){0,3}",
        ) {
            let queue_type = if quorum { QueueType::Quorum } else { QueueType::Classic };
            let settings = CascadeSettings {
                levels, unit_ms, queue_type, prefix: "p".into(), version, business_exchange: Some("biz".into()),
                release_stage: Some(release_stage),
                delivery_key: if digits { DeliveryKey::Digits } else { DeliveryKey::Destination },
                ..CascadeSettings::default()
            };
            let fits = max_levels_for_unit(unit_ms).is_some_and(|max| levels <= max);
            let Ok(c) = settings.validate() else {
                prop_assert!(!fits, "valid settings rejected");
                return Ok(());
            };
            prop_assert!(fits, "settings beyond the broker's TTL limit accepted");

            let max_ns = u128::from(c.max_delay_ms()) * 1_000_000;
            let requested = Duration::from_nanos((max_ns as f64 * fraction) as u64);
            match c.route(requested, &destination) {
                Err(RouteError::DelayTooLong { .. }) => prop_assert!(requested.as_nanos() > max_ns),
                Err(e) => prop_assert!(false, "unexpected {e}"),
                Ok(route) => {
                    let effective = Duration::from_millis(route.delay_ms);
                    prop_assert!(effective >= requested, "early");
                    // A quorum queue may take a millisecond off each hop:
                    // then up to a level's worth of them more.
                    let slack = if quorum && !route.held { u64::from(levels) } else { 0 };
                    prop_assert!(effective < requested + Duration::from_millis(c.precision_ms() + slack));
                    prop_assert!(route.routing_key.len() <= 255);
                    // A consumer's binding matches what is delivered, whichever key.
                    let delivered = c.delivered_routing_key(&route.routing_key);
                    prop_assert!(topic_matches(&c.binding_key(&destination), delivered));
                    if c.delivery_key() == DeliveryKey::Destination {
                        prop_assert_eq!(delivered, destination.as_str());
                    }
                    let plan = c.plan();
                    let arrivals = Simulator::new(&plan).publish(&route.entry_exchange, &route.routing_key);
                    // With the release stage, a task arrives in the release
                    // queue (where delayline takes it, and holds it for the
                    // rest of its delay) instead of at the business exchange.
                    let due = if release_stage { c.release_queue() } else { "biz".to_owned() };
                    prop_assert!(route.held || route.hold_ms == 0);
                    prop_assert!(release_stage || !route.held);
                    prop_assert_eq!(arrivals, vec![Arrival {
                        exchange: due,
                        routing_key: route.routing_key.clone(),
                        elapsed_ms: route.delay_units * unit_ms,
                    }]);
                    // Without the stage, the levels' TTLs less what a quorum
                    // queue may take off each: never less than the delay granted.
                    if !route.held {
                        prop_assert!(c.least_ms(route.delay_units) >= route.delay_ms);
                    }
                }
            }
        }

        #[test]
        fn binding_key_never_matches_another_destination(
            levels in 1u32..=8,
            units in 0u64..256,
            a in "[a-z]{1,3}(\\.[a-z]{1,3}){0,2}",
            b in "[a-z]{1,3}(\\.[a-z]{1,3}){0,2}",
        ) {
            let c = cascade(levels, 10, QueueType::Classic);
            let route = c.route_units(units.min(c.max_delay_units()), &b);
            let delivered = c.delivered_routing_key(&route.routing_key);
            prop_assert_eq!(topic_matches(&c.binding_key(&a), delivered), a == b);
        }

        /// In a chain of several shards, a task enters the shard its id
        /// names, waits exactly its delay in that shard's levels alone, and
        /// reaches that shard's release queue: every shard is a whole chain.
        #[test]
        fn a_task_goes_through_its_own_shard_alone(
            shards in 1u32..=12,
            levels in 1u32..=8,
            units in 0u64..256,
            id in "[a-zA-Z0-9_-]{1,24}",
        ) {
            let c = sharded(shards, levels);
            let plan = c.plan();
            let shard = c.for_task(&id);
            prop_assert_eq!(shard.shard(), c.shard_of(&id));
            let units = units.min(c.max_delay_units());
            let route = shard.route_units(units, "d");
            // Planned in shard 0 and moved into the task's: the same route.
            prop_assert_eq!(c.in_task_shard(c.route_units(units, "d"), &id), route.clone());
            let arrivals = Simulator::new(&plan).publish(&route.entry_exchange, &route.routing_key);
            prop_assert_eq!(arrivals, vec![Arrival {
                exchange: shard.release_queue(),
                routing_key: route.routing_key.clone(),
                elapsed_ms: units * 10,
            }]);
            // Its entry is its shard's, and no other shard's.
            for other in c.every_shard().filter(|o| o.shard() != shard.shard()) {
                prop_assert!((0..levels).all(|l| other.level_exchange(l) != route.entry_exchange));
                prop_assert_ne!(other.release_queue(), shard.release_queue());
            }
        }
    }

    fn sharded(shards: u32, levels: u32) -> crate::cascade::Cascade {
        crate::cascade::sharded_for_tests(levels, 10, shards)
    }

    #[test]
    fn shard_zero_keeps_the_names_of_a_chain_of_one() {
        let one = sharded(1, 4);
        let four = sharded(4, 4);
        assert_eq!(one.level_queue(3), "t.v1.level03.wait");
        assert_eq!(four.level_queue(3), "t.v1.level03.wait");
        assert_eq!(four.release_queue(), "t.v1.release");
        let third = four.in_shard(3);
        assert_eq!(third.level_queue(3), "t.v1.s3.level03.wait");
        assert_eq!(third.level_exchange(0), "t.v1.s3.level00");
        assert_eq!(third.release_queue(), "t.v1.s3.release");
        assert_eq!(third.next_exchange(0), "t.v1.s3.release");
        // Shared by every shard.
        assert_eq!(third.poison_queue(), four.poison_queue());
        assert_eq!(third.unroutable_seen_queue(), four.unroutable_seen_queue());
        assert_eq!(third.ledger_marker(), four.ledger_marker());
        // Every shard's objects, once each; the shared ones once.
        let plan = four.plan();
        assert_eq!(plan.queues.len(), 4 * (4 + 1) + 2);
        assert_eq!(plan.shards, 4);
        assert_eq!(plan.beyond_last_shard.as_deref(), Some("t.v1.s4.release"));
        let mut names: Vec<&str> = plan.queues.iter().map(|q| q.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), plan.queues.len());
    }

    #[test]
    fn only_the_queues_of_several_shards_ask_for_balanced_leaders() {
        let locator =
            |q: &crate::cascade::QueueSpec| q.arguments.get("x-queue-leader-locator").cloned();
        // One shard: the arguments a chain always had.
        assert!(
            sharded(1, 4)
                .plan()
                .queues
                .iter()
                .all(|q| locator(q).is_none())
        );
        let plan = sharded(3, 4).plan();
        let four = sharded(3, 4);
        for shard in four.every_shard() {
            for name in (0..4)
                .map(|l| shard.level_queue(l))
                .chain([shard.release_queue()])
            {
                let queue = plan.queues.iter().find(|q| q.name == name).unwrap();
                assert_eq!(
                    locator(queue),
                    Some(crate::cascade::ArgValue::Str("balanced".into())),
                    "{name}"
                );
            }
        }
        // The shared queues are not a shard's.
        let shared = plan
            .queues
            .iter()
            .find(|q| q.name == four.unroutable_queue())
            .unwrap();
        assert!(locator(shared).is_none());
    }
}
