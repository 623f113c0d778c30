//! Explains a PRECONDITION_FAILED in full.
//!
//! RabbitMQ names only the first inequivalent argument of a redeclaration. To
//! list every difference, we redeclare with the broker's reported value for
//! that argument (a redeclaration with equivalent settings changes nothing)
//! and read the next complaint, until the declaration is accepted.

use std::collections::BTreeMap;
use std::fmt;

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection};

use super::connection::{amqp_value, open_channel, precondition_failed};
use super::error::{Difference, TopologyConflict};
use super::options::{durable_exchange, durable_queue, lapin_kind};
use crate::cascade::{ExchangeSpec, QueueSpec};

/// Each probe costs a channel; no real object has this many checked arguments.
const MAX_PROBES: usize = 16;

/// One argument RabbitMQ found inequivalent, as its error text gives it.
#[derive(Debug, PartialEq, Eq)]
struct Inequivalent {
    key: String,
    received: Option<Reported>,
    current: Option<Reported>,
}

/// A value in the broker's words: `'v'` or `the value 'v' of type 't'`.
#[derive(Debug, PartialEq, Eq)]
struct Reported {
    value: String,
    amqp_type: Option<String>,
}

impl fmt::Display for Reported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.amqp_type.as_deref() {
            Some("longstr") => write!(f, "{:?}", self.value),
            _ => write!(f, "{}", self.value),
        }
    }
}

fn shown(value: &Option<Reported>) -> String {
    value
        .as_ref()
        .map_or_else(|| "(not set)".to_owned(), Reported::to_string)
}

fn parse_reported(text: &str) -> Option<Option<Reported>> {
    if text == "none" {
        return Some(None);
    }
    if let Some(rest) = text.strip_prefix("the value '") {
        let (value, amqp_type) = rest.rsplit_once("' of type '")?;
        return Some(Some(Reported {
            value: value.to_owned(),
            amqp_type: Some(amqp_type.strip_suffix('\'')?.to_owned()),
        }));
    }
    let value = text.strip_prefix('\'')?.strip_suffix('\'')?;
    Some(Some(Reported {
        value: value.to_owned(),
        amqp_type: None,
    }))
}

/// Parses "inequivalent arg 'K' for queue 'q' in vhost '/': received X but current is Y".
fn parse_inequivalent(text: &str) -> Option<Inequivalent> {
    let rest = text.strip_prefix("inequivalent arg '")?;
    let (key, rest) = rest.split_once('\'')?;
    let (_, values) = rest.split_once(": received ")?;
    let (received, current) = values.rsplit_once(" but current is ")?;
    Some(Inequivalent {
        key: key.to_owned(),
        received: parse_reported(received)?,
        current: parse_reported(current)?,
    })
}

/// The value the broker holds for the argument a PRECONDITION_FAILED text
/// names, as the broker wrote it.
pub(crate) fn current_argument(text: &str) -> Option<String> {
    Some(parse_inequivalent(text)?.current?.value)
}

/// The broker's current value in a form it will find equivalent, or None if unknown.
fn as_amqp(reported: &Reported, wanted: Option<&AMQPValue>) -> Option<AMQPValue> {
    let integer = || reported.value.parse().ok().map(AMQPValue::LongLongInt);
    let string = || {
        Some(AMQPValue::LongString(LongString::from(
            reported.value.as_str(),
        )))
    };
    match reported.amqp_type.as_deref() {
        Some("longstr") => string(),
        Some("bool") => reported.value.parse().ok().map(AMQPValue::Boolean),
        Some(_) => integer(),
        // Without a type the broker found the types of one class: take ours.
        None => match wanted {
            Some(AMQPValue::LongString(_)) => string(),
            Some(AMQPValue::Boolean(_)) => reported.value.parse().ok().map(AMQPValue::Boolean),
            _ => integer(),
        },
    }
}

/// What one redeclaration tries: the broker's object as we currently understand it.
#[derive(Clone)]
struct Guess {
    kind: Option<lapin::ExchangeKind>,
    durable: bool,
    arguments: BTreeMap<ShortString, AMQPValue>,
}

impl Guess {
    async fn declare(&self, connection: &Connection, name: &str) -> Result<(), Option<String>> {
        let channel: Channel = open_channel(connection, String::new)
            .await
            .map_err(|_| None)?;
        let arguments = FieldTable::from(self.arguments.clone());
        let result = match &self.kind {
            Some(kind) => {
                let options = lapin::options::ExchangeDeclareOptions {
                    durable: self.durable,
                    ..durable_exchange()
                };
                channel
                    .exchange_declare(name.into(), kind.clone(), options, arguments)
                    .await
            }
            None => {
                let options = lapin::options::QueueDeclareOptions {
                    durable: self.durable,
                    ..durable_queue()
                };
                channel
                    .queue_declare(name.into(), options, arguments)
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Ok(()) => {
                let _ = channel.close(200, "probed".into()).await;
                Ok(())
            }
            Err(error) => Err(precondition_failed(&error)),
        }
    }

    /// Adopts the broker's value for one argument; false if it cannot be expressed.
    fn adopt(&mut self, found: &Inequivalent) -> bool {
        if found.key == "durable" {
            self.durable = found.current.as_ref().is_some_and(|c| c.value == "true");
            return true;
        }
        let key = ShortString::from(found.key.as_str());
        match &found.current {
            None => {
                self.arguments.remove(&key);
                true
            }
            Some(current) => match as_amqp(current, self.arguments.get(&key)) {
                Some(value) => {
                    self.arguments.insert(key, value);
                    true
                }
                None => false,
            },
        }
    }
}

/// Collects every inequivalent argument, starting from the broker's first complaint.
async fn probe_arguments(
    connection: &Connection,
    name: &str,
    mut guess: Guess,
    mut text: String,
    differences: &mut Vec<Difference>,
) {
    for _ in 0..MAX_PROBES {
        let Some(found) = parse_inequivalent(&text) else {
            differences.push(Difference {
                field: "declaration".into(),
                existing: format!("refused it: {text}"),
                wanted: "the planned settings".into(),
            });
            return;
        };
        differences.push(Difference {
            field: found.key.clone(),
            existing: shown(&found.current),
            wanted: shown(&found.received),
        });
        if !guess.adopt(&found) {
            return;
        }
        match guess.declare(connection, name).await {
            Ok(()) | Err(None) => return,
            Err(Some(next)) => text = next,
        }
    }
}

fn wanted_arguments(arguments: &crate::cascade::Arguments) -> BTreeMap<ShortString, AMQPValue> {
    arguments
        .iter()
        .map(|(k, v)| (ShortString::from(k.as_str()), amqp_value(v)))
        .collect()
}

pub(crate) async fn diagnose_queue(
    connection: &Connection,
    queue: &QueueSpec,
    text: String,
) -> TopologyConflict {
    let guess = Guess {
        kind: None,
        durable: true,
        arguments: wanted_arguments(&queue.arguments),
    };
    let mut differences = Vec::new();
    probe_arguments(connection, &queue.name, guess, text, &mut differences).await;
    TopologyConflict {
        kind: "queue",
        name: queue.name.clone(),
        advice: queue_advice(&queue.name, &differences),
        differences,
    }
}

/// What to do about a queue that differs: when the difference is where level
/// 0 leads (the release stage, or the business exchange), the release stage
/// is what differs, and the advice says so rather than list the settings.
fn queue_advice(queue: &str, differences: &[Difference]) -> String {
    const NEVER_DELETE: &str = "Never delete it by hand: that loses the messages it holds.";
    let release = queue
        .strip_suffix(".level00.wait")
        .map(|chain| format!("{chain}.release"));
    let release_stage = |value: &str| {
        release
            .as_deref()
            .is_some_and(|release| value.trim_matches('"') == release)
    };
    let dead_letter = differences
        .iter()
        .find(|d| d.field == "x-dead-letter-exchange");
    match dead_letter {
        Some(d) if release_stage(&d.existing) => format!(
            "The chain was built with the release stage, and this delayline runs without it \
             (store.url = \"none\", or cascade.release_stage = false). Start it with the \
             ledger the chain was built with (the release stage is on by default with a \
             ledger), or move the chain off the stage: raise cascade.version and run \
             `delayline migrate-topology --from <this version>`. {NEVER_DELETE}"
        ),
        Some(d) if release_stage(&d.wanted) => format!(
            "The chain was built without the release stage, and this delayline has it on (the \
             default with a ledger). Either set cascade.release_stage = false to serve the \
             chain as it is, or raise cascade.version and run `delayline migrate-topology \
             --from <this version>`, which moves its messages onto a chain with the stage. \
             {NEVER_DELETE}"
        ),
        _ => format!(
            "RabbitMQ cannot change a queue's arguments in place. Either restore the cascade \
             settings that created it (levels, unit_ms, queue_type, shards), or raise cascade.version \
             and run `delayline migrate-topology --from <this version>`, which moves the \
             messages of {queue:?} into the new chain and removes the old one. {NEVER_DELETE}"
        ),
    }
}

fn kind_name(kind: &lapin::ExchangeKind) -> String {
    match kind {
        lapin::ExchangeKind::Direct => "direct".to_owned(),
        lapin::ExchangeKind::Fanout => "fanout".to_owned(),
        lapin::ExchangeKind::Headers => "headers".to_owned(),
        lapin::ExchangeKind::Topic => "topic".to_owned(),
        other => format!("{other:?}"),
    }
}

pub(crate) async fn diagnose_exchange(
    connection: &Connection,
    exchange: &ExchangeSpec,
    text: String,
) -> TopologyConflict {
    let wanted_kind = lapin_kind(exchange.kind);
    let mut guess = Guess {
        kind: Some(wanted_kind.clone()),
        durable: true,
        arguments: wanted_arguments(&exchange.arguments),
    };
    let mut differences = Vec::new();
    let mut text = Some(text);
    if text
        .as_deref()
        .is_some_and(|t| t.starts_with("cannot redeclare exchange"))
    {
        (guess, text) =
            find_kind_and_durability(connection, exchange, guess, &mut differences).await;
    }
    if let Some(text) = text {
        probe_arguments(connection, &exchange.name, guess, text, &mut differences).await;
    }
    TopologyConflict {
        kind: "exchange",
        name: exchange.name.clone(),
        differences,
        advice: format!(
            "RabbitMQ cannot change an exchange in place. Either point delayline at another \
             exchange (cascade.business_exchange or cascade.prefix), or delete {:?} \
             (with rabbitmqadmin or the management UI) \
             so that delayline can declare it; its bindings go with it.",
            exchange.name
        ),
    }
}

/// The broker does not say which of an exchange's type and durability
/// differ: each is tried until a declaration passes them. Returns the
/// guess that passed and the broker's next complaint (about arguments),
/// and notes the differences found.
async fn find_kind_and_durability(
    connection: &Connection,
    exchange: &ExchangeSpec,
    guess: Guess,
    differences: &mut Vec<Difference>,
) -> (Guess, Option<String>) {
    let wanted_kind = lapin_kind(exchange.kind);
    let kinds = [
        lapin::ExchangeKind::Topic,
        lapin::ExchangeKind::Fanout,
        lapin::ExchangeKind::Direct,
        lapin::ExchangeKind::Headers,
    ];
    let candidates = kinds
        .into_iter()
        .flat_map(|kind| [(kind.clone(), true), (kind, false)]);
    for (kind, durable) in candidates {
        let candidate = Guess {
            kind: Some(kind.clone()),
            durable,
            ..guess.clone()
        };
        let next = match candidate.declare(connection, &exchange.name).await {
            Err(Some(t)) if t.starts_with("cannot redeclare exchange") => continue,
            Err(None) => continue,
            outcome => outcome.err().flatten(),
        };
        if kind_name(&kind) != kind_name(&wanted_kind) {
            differences.push(Difference {
                field: "type".into(),
                existing: kind_name(&kind),
                wanted: kind_name(&wanted_kind),
            });
        }
        if !durable {
            differences.push(Difference {
                field: "durable".into(),
                existing: "false".into(),
                wanted: "true".into(),
            });
        }
        return (candidate, next);
    }
    differences.push(Difference {
        field: "type, durable, auto-delete or internal".into(),
        existing: "something else".into(),
        wanted: format!("a durable {} exchange", kind_name(&wanted_kind)),
    });
    (guess, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_difference_in_where_level_0_leads_is_said_to_be_the_release_stage() {
        let leads = |existing: &str, wanted: &str| {
            vec![Difference {
                field: "x-dead-letter-exchange".into(),
                existing: format!("{existing:?}"),
                wanted: format!("{wanted:?}"),
            }]
        };
        let level0 = "dl.v1.level00.wait";
        let without = queue_advice(level0, &leads("dl.v1.release", "biz"));
        assert!(
            without.contains("built with the release stage"),
            "{without}"
        );
        assert!(without.contains("store.url = \"none\""), "{without}");
        let with = queue_advice(level0, &leads("biz", "dl.v1.release"));
        assert!(with.contains("built without the release stage"), "{with}");
        let ttl = vec![Difference {
            field: "x-message-ttl".into(),
            existing: "100".into(),
            wanted: "200".into(),
        }];
        let other = queue_advice("dl.v1.level03.wait", &ttl);
        assert!(
            other.contains("levels, unit_ms, queue_type, shards"),
            "{other}"
        );
    }

    #[test]
    fn parses_each_form_of_inequivalent_arg() {
        let typed = parse_inequivalent(
            "inequivalent arg 'x-message-ttl' for queue 'p.level03.wait' in vhost '/': \
             received the value '8000' of type 'long' but current is the value '2000' of type 'signedint'",
        )
        .unwrap();
        assert_eq!(typed.key, "x-message-ttl");
        assert_eq!(shown(&typed.received), "8000");
        assert_eq!(shown(&typed.current), "2000");

        let missing = parse_inequivalent(
            "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': \
             received the value 'quorum' of type 'longstr' but current is none",
        )
        .unwrap();
        assert_eq!(shown(&missing.received), "\"quorum\"");
        assert_eq!(missing.current, None);
        assert_eq!(shown(&missing.current), "(not set)");

        let plain = parse_inequivalent(
            "inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'",
        )
        .unwrap();
        assert_eq!(plain.key, "durable");
        assert_eq!(
            plain.current,
            Some(Reported {
                value: "false".into(),
                amqp_type: None
            })
        );
        assert!(parse_inequivalent("cannot redeclare exchange 'x' in vhost '/'").is_none());
    }

    #[test]
    fn adopting_the_broker_value_keeps_its_type_class() {
        let mut guess = Guess {
            kind: None,
            durable: true,
            arguments: BTreeMap::from([
                ("x-message-ttl".into(), AMQPValue::LongLongInt(8000)),
                (
                    "x-queue-type".into(),
                    AMQPValue::LongString("quorum".into()),
                ),
            ]),
        };
        let found = parse_inequivalent(
            "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received '8000' but current is '2000'",
        )
        .unwrap();
        assert!(guess.adopt(&found));
        assert_eq!(
            guess.arguments.get(&ShortString::from("x-message-ttl")),
            Some(&AMQPValue::LongLongInt(2000))
        );
        let found = parse_inequivalent(
            "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': \
             received the value 'quorum' of type 'longstr' but current is none",
        )
        .unwrap();
        assert!(guess.adopt(&found));
        assert!(
            !guess
                .arguments
                .contains_key(&ShortString::from("x-queue-type"))
        );
    }
}
