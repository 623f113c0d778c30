//! An ingress as configured (`[[ingress]]`), validated, and the broker
//! objects it needs as part of the topology plan. Pure.

use serde::{Deserialize, Serialize};

use super::names::check_name;
use crate::auth::DestinationPattern;
use crate::cascade::{
    ArgValue, Arguments, BindingSpec, BindingTarget, Cascade, ExchangeKind, ExchangeSpec,
    TopologyPlan,
};

/// One `[[ingress]]` section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngressSettings {
    /// The exchange producers publish to, with `x-delay` or `x-deliver-at`
    /// headers (declared by delayline: durable, fanout).
    pub exchange: String,
    /// The exchange due messages are delivered to, with the routing key they
    /// were published with; the business exchange when not set. Declared by
    /// delayline (durable, of `type`, its unroutable messages parked in the
    /// chain's unroutable queue) unless it is the business exchange.
    #[serde(default)]
    pub deliver_to: Option<String>,
    /// `deliver_to`'s type, as the plugin's `x-delayed-type`: `direct`
    /// (the default), `topic`, `fanout` or `headers`.
    #[serde(rename = "type", default = "direct")]
    pub kind: String,
    /// Topic patterns (`orders.*`, `#`) a routing key must match; every key
    /// when empty. A message with another key is refused.
    #[serde(default)]
    pub routing_keys: Vec<String>,
}

fn direct() -> String {
    "direct".to_owned()
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("ingress {exchange:?}: {reason}")]
pub struct IngressError {
    pub exchange: String,
    pub reason: String,
}

/// A validated ingress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ingress {
    pub exchange: String,
    pub deliver_to: String,
    /// `deliver_to`'s type, when delayline declares it (not the business exchange).
    pub declared_kind: Option<ExchangeKind>,
    routing_keys: Vec<DestinationPattern>,
    /// The quorum queue delayline consumes, bound to `exchange`.
    pub queue: String,
    /// Where refused messages go, with the reason in headers.
    pub refused_queue: String,
}

impl IngressSettings {
    pub fn validate(self, cascade: &Cascade) -> Result<Ingress, IngressError> {
        let error = |reason: String| IngressError {
            exchange: self.exchange.clone(),
            reason,
        };
        let business = cascade.business_exchange();
        let deliver_to = self
            .deliver_to
            .clone()
            .unwrap_or_else(|| business.to_owned());
        let kind = ExchangeKind::parse(&self.kind).ok_or_else(|| {
            error(format!(
                "type {:?} is not direct, topic, fanout or headers",
                self.kind
            ))
        })?;
        let declared_kind = (deliver_to != business).then_some(kind);
        if deliver_to == business && kind != ExchangeKind::Direct && kind != ExchangeKind::Topic {
            return Err(error(format!(
                "the business exchange {business:?} is a topic exchange, not {}",
                self.kind
            )));
        }
        if deliver_to == self.exchange {
            return Err(error(
                "deliver_to must be another exchange than the one producers publish to".into(),
            ));
        }
        let queue = format!("{}.ingress.{}", cascade.prefix(), self.exchange);
        let refused_queue = format!("{queue}.refused");
        for (field, name) in [
            ("exchange", self.exchange.as_str()),
            ("deliver_to", deliver_to.as_str()),
            ("exchange", refused_queue.as_str()),
        ] {
            check_name(name).map_err(|reason| error(format!("{field}: {reason}")))?;
        }
        let routing_keys = self
            .routing_keys
            .iter()
            .map(|pattern| DestinationPattern::parse(pattern))
            .collect::<Result<_, _>>()
            .map_err(|e| error(format!("routing_keys: {e}")))?;
        Ok(Ingress {
            exchange: self.exchange,
            deliver_to,
            declared_kind,
            routing_keys,
            queue,
            refused_queue,
        })
    }
}

impl Ingress {
    /// Whether a message with `routing_key` is taken.
    pub fn accepts(&self, routing_key: &str) -> bool {
        self.routing_keys.is_empty() || self.routing_keys.iter().any(|p| p.matches(routing_key))
    }

    /// Adds what this ingress needs to `plan`: its exchange (fanout, so
    /// every key reaches the queue and is judged there), its queue (quorum
    /// without a delivery limit, as the chain's own) and refused queue, and
    /// the exchange delivered to, whose unroutable messages are parked as
    /// the business exchange's are.
    pub fn plan_into(&self, cascade: &Cascade, plan: &mut TopologyPlan) {
        plan.exchanges.push(ExchangeSpec {
            name: self.exchange.clone(),
            kind: ExchangeKind::Fanout,
            arguments: Arguments::new(),
        });
        if let Some(kind) = self.declared_kind
            && !plan.exchanges.iter().any(|e| e.name == self.deliver_to)
        {
            plan.exchanges.push(ExchangeSpec {
                name: self.deliver_to.clone(),
                kind,
                arguments: Arguments::from([(
                    "alternate-exchange".to_owned(),
                    ArgValue::Str(cascade.unroutable_exchange()),
                )]),
            });
        }
        plan.queues.push(cascade.plain_queue(self.queue.clone()));
        plan.queues
            .push(cascade.plain_queue(self.refused_queue.clone()));
        plan.bindings.push(BindingSpec {
            source: self.exchange.clone(),
            target: BindingTarget::Queue(self.queue.clone()),
            routing_key: String::new(),
        });
    }
}

/// The plan of `cascade` with every ingress's objects, and the retry
/// policies' when there are any.
pub fn plan_with(
    cascade: &Cascade,
    ingresses: &[Ingress],
    retries: Option<&super::Retries>,
) -> TopologyPlan {
    let mut plan = cascade.plan();
    for ingress in ingresses {
        ingress.plan_into(cascade, &mut plan);
    }
    if let Some(retries) = retries {
        retries.plan_into(cascade, &mut plan);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cascade::CascadeSettings;

    fn chain() -> Cascade {
        CascadeSettings {
            levels: 4,
            unit_ms: 10,
            release_stage: Some(true),
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap()
    }

    fn settings(deliver_to: Option<&str>, kind: &str) -> IngressSettings {
        IngressSettings {
            exchange: "orders.delayed".into(),
            deliver_to: deliver_to.map(str::to_owned),
            kind: kind.into(),
            routing_keys: vec![],
        }
    }

    #[test]
    fn an_ingress_declares_its_exchange_queues_and_the_exchange_it_delivers_to() {
        let chain = chain();
        let ingress = settings(Some("orders"), "headers")
            .validate(&chain)
            .unwrap();
        let plan = plan_with(&chain, std::slice::from_ref(&ingress), None);
        let orders = plan.exchanges.iter().find(|e| e.name == "orders").unwrap();
        assert_eq!(orders.kind, ExchangeKind::Headers);
        assert_eq!(
            orders.arguments.get("alternate-exchange"),
            Some(&ArgValue::Str(chain.unroutable_exchange()))
        );
        assert!(
            plan.queues
                .iter()
                .any(|q| q.name == "delayline.ingress.orders.delayed")
        );
        assert!(
            plan.queues
                .iter()
                .any(|q| q.name == "delayline.ingress.orders.delayed.refused")
        );
        // To the business exchange: nothing more to declare.
        let to_business = settings(None, "direct").validate(&chain).unwrap();
        assert_eq!(to_business.deliver_to, chain.business_exchange());
        assert_eq!(to_business.declared_kind, None);
    }

    #[test]
    fn bad_ingresses_are_refused_with_the_reason() {
        let chain = chain();
        for (settings, says) in [
            (
                settings(Some("orders"), "x-delayed-message"),
                "is not direct",
            ),
            (settings(None, "fanout"), "is a topic exchange"),
            (
                settings(Some("orders.delayed"), "direct"),
                "another exchange",
            ),
            (settings(Some("amq.direct"), "direct"), "are the broker's"),
            (
                IngressSettings {
                    routing_keys: vec!["a..b".into()],
                    ..settings(None, "direct")
                },
                "routing_keys",
            ),
        ] {
            let error = settings.validate(&chain).unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
        }
    }
}
