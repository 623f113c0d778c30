//! Whether a consumer's queue is wired to the retries: what the broker
//! shows of the retry exchange, the intake and the queue, judged. Pure.
//!
//! RabbitMQ drops without a word a message dead-lettered into an exchange
//! that does not exist, and dead-letters nothing from a queue that names no
//! dead-letter exchange: either way what a consumer rejects is gone, and
//! nothing in delayline sees it. So the wiring is checked from the broker's
//! side, link by link: the exchange exists and is ours (fanout, bound to
//! the intake), the queue exists and names it (its argument, which
//! overrules a policy, or else the policy applied to it), and a policy of
//! ours covers the queue.

use super::Retries;

/// What the broker shows; `None` where it could not be seen (a queue's
/// arguments and policy, an exchange's type and bindings need the
/// management API).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    pub exchange_exists: bool,
    pub intake_exists: bool,
    pub queue_exists: bool,
    /// The retry exchange's type and the queues bound to it.
    pub exchange: Option<(String, Vec<String>)>,
    /// The queue's dead-letter exchange by argument and by policy.
    pub dead_letter: Option<DeadLetter>,
    /// Why the management API's side was not seen.
    pub unseen: Option<String>,
}

/// Where a queue's dead letters go, by its argument and by its policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadLetter {
    pub argument: Option<String>,
    /// The policy's name and the exchange it names.
    pub policy: Option<(Option<String>, String)>,
}

/// One link of the wiring, judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    Ok(String),
    Problem(String),
    /// Not seen: said, so that a check that cannot see is not taken for a pass.
    Unknown(String),
}

impl Finding {
    pub fn is_problem(&self) -> bool {
        matches!(self, Finding::Problem(_))
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Ok(text) => write!(f, "ok       {text}"),
            Finding::Problem(text) => write!(f, "PROBLEM  {text}"),
            Finding::Unknown(text) => write!(f, "unknown  {text}"),
        }
    }
}

/// Each link between `queue` and the retries, judged from what was `observed`.
pub fn judge(retries: &Retries, queue: &str, observed: &Observed) -> Vec<Finding> {
    let exchange = &retries.exchange;
    let mut found = vec![exchange_finding(retries, observed)];
    found.push(match observed.intake_exists {
        true => Finding::Ok(format!("the intake queue {} exists", retries.queue)),
        false => Finding::Problem(format!(
            "the intake queue {} does not exist: start delayline or run `delayline provision`",
            retries.queue
        )),
    });
    found.push(
        match retries
            .policies
            .iter()
            .find(|p| p.queues.iter().any(|q| q == queue))
        {
            Some(policy) => Finding::Ok(format!("retry policy {:?} covers {queue}", policy.name)),
            None => Finding::Problem(format!(
                "no retry policy covers {queue} (none in the configuration, none set over the \
                 API): what it dead-letters goes to {} and is never retried",
                retries.refused_queue
            )),
        },
    );
    if !observed.queue_exists {
        found.push(Finding::Problem(format!("queue {queue} does not exist")));
        return found;
    }
    found.push(dead_letter_finding(exchange, queue, observed));
    found
}

/// The retry exchange: present, and ours (fanout, bound to the intake).
fn exchange_finding(retries: &Retries, observed: &Observed) -> Finding {
    let exchange = &retries.exchange;
    if !observed.exchange_exists {
        return Finding::Problem(format!(
            "exchange {exchange} does not exist: RabbitMQ drops every message a queue \
             dead-letters to it. Start delayline (it declares it) or run `delayline provision`"
        ));
    }
    match &observed.exchange {
        None => Finding::Ok(format!(
            "exchange {exchange} exists (its type and bindings not seen: {})",
            observed.unseen.as_deref().unwrap_or("no management API")
        )),
        Some((kind, _)) if kind != "fanout" => Finding::Problem(format!(
            "exchange {exchange} is of type {kind}, not delayline's fanout: another program \
             declared it"
        )),
        Some((_, bound)) if !bound.contains(&retries.queue) => Finding::Problem(format!(
            "exchange {exchange} is not bound to the intake {}: what reaches it is dropped; \
             restart delayline or run `delayline provision`",
            retries.queue
        )),
        Some(_) => Finding::Ok(format!(
            "exchange {exchange} exists, fanout, bound to the intake {}",
            retries.queue
        )),
    }
}

/// What names the queue's dead-letter exchange: its argument overrules a policy.
fn dead_letter_finding(exchange: &str, queue: &str, observed: &Observed) -> Finding {
    let Some(dead_letter) = &observed.dead_letter else {
        return Finding::Unknown(format!(
            "{queue}'s arguments and policy not seen ({}): check that its \
             x-dead-letter-exchange argument or its policy's dead-letter-exchange is {exchange}",
            observed.unseen.as_deref().unwrap_or("no management API")
        ));
    };
    let policy_name = |name: &Option<String>| name.clone().unwrap_or_else(|| "?".to_owned());
    match (&dead_letter.argument, &dead_letter.policy) {
        (Some(argument), _) if argument == exchange => Finding::Ok(format!(
            "{queue}'s x-dead-letter-exchange argument names {exchange}"
        )),
        (Some(argument), _) => Finding::Problem(format!(
            "{queue}'s x-dead-letter-exchange argument names {argument:?}, not {exchange} \
             (an argument overrules any policy)"
        )),
        (None, Some((name, named))) if named == exchange => Finding::Ok(format!(
            "policy {} applied to {queue} names {exchange} as its dead-letter-exchange",
            policy_name(name)
        )),
        (None, Some((name, named))) => Finding::Problem(format!(
            "policy {} applied to {queue} names {named:?} as its dead-letter-exchange, \
             not {exchange}",
            policy_name(name)
        )),
        (None, None) => Finding::Problem(format!(
            "nothing names {exchange} for {queue}: no x-dead-letter-exchange argument and no \
             policy with dead-letter-exchange, so what its consumers reject is dropped"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::RetryPolicy;

    fn retries() -> Retries {
        Retries {
            policies: vec![RetryPolicy {
                name: "orders".into(),
                queues: vec!["orders".into()],
                initial_ms: 1000,
                multiplier: 2.0,
                max_delay_ms: 10_000,
                jitter: 0.0,
                max_attempts: 3,
                park_to: None,
                max_lateness_ms: None,
                give_up_after_ms: None,
            }],
            exchange: "d.retry".into(),
            queue: "d.retry.intake".into(),
            refused_queue: "d.retry.refused".into(),
        }
    }

    fn wired() -> Observed {
        Observed {
            exchange_exists: true,
            intake_exists: true,
            queue_exists: true,
            exchange: Some(("fanout".into(), vec!["d.retry.intake".into()])),
            dead_letter: Some(DeadLetter {
                argument: Some("d.retry".into()),
                policy: None,
            }),
            unseen: None,
        }
    }

    fn problems(observed: &Observed, queue: &str) -> Vec<String> {
        let found = judge(&retries(), queue, observed);
        found
            .iter()
            .filter(|f| f.is_problem())
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_queue_wired_by_argument_or_by_policy_has_no_problem() {
        assert_eq!(problems(&wired(), "orders"), Vec::<String>::new());
        let by_policy = Observed {
            dead_letter: Some(DeadLetter {
                argument: None,
                policy: Some((Some("orders-retry".into()), "d.retry".into())),
            }),
            ..wired()
        };
        assert_eq!(problems(&by_policy, "orders"), Vec::<String>::new());
    }

    #[test]
    fn each_broken_link_is_a_problem_that_names_it() {
        let cases: [(Observed, &str, &str); 7] = [
            (
                Observed {
                    exchange_exists: false,
                    ..wired()
                },
                "orders",
                "does not exist: RabbitMQ drops",
            ),
            (
                Observed {
                    intake_exists: false,
                    ..wired()
                },
                "orders",
                "intake queue d.retry.intake does not exist",
            ),
            (
                Observed {
                    exchange: Some(("topic".into(), vec![])),
                    ..wired()
                },
                "orders",
                "of type topic",
            ),
            (
                Observed {
                    exchange: Some(("fanout".into(), vec![])),
                    ..wired()
                },
                "orders",
                "not bound to the intake",
            ),
            (wired(), "payments", "no retry policy covers payments"),
            (
                Observed {
                    queue_exists: false,
                    ..wired()
                },
                "orders",
                "queue orders does not exist",
            ),
            (
                Observed {
                    dead_letter: Some(DeadLetter::default()),
                    ..wired()
                },
                "orders",
                "nothing names d.retry",
            ),
        ];
        for (observed, queue, said) in cases {
            let found = problems(&observed, queue);
            assert!(found.iter().any(|p| p.contains(said)), "{said}: {found:?}");
        }
    }

    #[test]
    fn an_argument_naming_another_exchange_overrules_a_policy_naming_ours() {
        let observed = Observed {
            dead_letter: Some(DeadLetter {
                argument: Some("elsewhere".into()),
                policy: Some((Some("p".into()), "d.retry".into())),
            }),
            ..wired()
        };
        let found = problems(&observed, "orders");
        assert!(found[0].contains("\"elsewhere\""), "{found:?}");
        let by_other_policy = Observed {
            dead_letter: Some(DeadLetter {
                argument: None,
                policy: Some((Some("p".into()), "elsewhere".into())),
            }),
            ..wired()
        };
        assert!(problems(&by_other_policy, "orders")[0].contains("policy p"));
    }

    #[test]
    fn what_was_not_seen_is_said_and_is_no_problem_and_no_pass() {
        let observed = Observed {
            exchange: None,
            dead_letter: None,
            unseen: Some("connection refused".into()),
            ..wired()
        };
        let found = judge(&retries(), "orders", &observed);
        assert!(!found.iter().any(Finding::is_problem), "{found:?}");
        let unknown = found.iter().find(|f| matches!(f, Finding::Unknown(_)));
        assert!(unknown.unwrap().to_string().contains("connection refused"));
    }
}
