//! Retry policies (`[[retry]]`), validated, with the broker objects they
//! need, and what a policy decides for a message a consumer gave up on:
//! back to its queue after a backoff, or parked. Pure: the jitter's draw
//! is an argument.
//!
//! A consumer's queue names [`Retries::exchange`] as its
//! `x-dead-letter-exchange`; what it rejects (`requeue=false`), what
//! expires in it, and what a quorum queue dead-letters at its
//! `x-delivery-limit` comes to [`Retries::queue`]. The queue it died in
//! (`x-death`) chooses the policy; the attempt header says how many
//! deliveries failed. Attempt `n` failed (`n` < `max_attempts`) comes back
//! as attempt `n + 1` after `min(initial × multiplier^(n-1), max_delay)`,
//! lengthened by up to `jitter` of itself (never shortened: a backoff is a
//! least wait); attempt `max_attempts` failed is parked, and so is one whose
//! retry would come back later than `give_up_after` from its first failure.
//!
//! A policy comes from a `[[retry]]` section of the configuration or from
//! the API (the same fields, as JSON); [`super::policy_set`] says which
//! are in force together.

use serde::{Deserialize, Serialize};

use super::names::check_name;
use crate::cascade::{Arguments, MAX_NAME_BYTES, TopologyPlan};
use crate::cascade::{BindingSpec, BindingTarget, Cascade, ExchangeKind, ExchangeSpec};

/// One `[[retry]]` section, as written (over the API: as JSON, named by
/// the path).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    /// How the policy is named in the API, the console and metrics (over
    /// the API, the path names it).
    #[serde(default)]
    pub name: String,
    /// The queues it covers, by name: each dead-letters to the retry
    /// exchange. A queue is in one policy at most.
    pub queues: Vec<String>,
    /// The wait before the first retry (`1s`, `500ms`).
    #[serde(default = "default_initial")]
    pub initial: String,
    /// Each retry waits this many times the one before (at least 1).
    #[serde(default = "default_multiplier")]
    pub multiplier: f64,
    /// The longest wait, before jitter (at least `initial`).
    #[serde(default = "default_max_delay")]
    pub max_delay: String,
    /// A wait is lengthened by a random fraction of itself up to this
    /// (0 to 1), so that messages that failed together come back spread.
    #[serde(default = "default_jitter")]
    pub jitter: f64,
    /// Deliveries in all, the first included; the one that fails last is
    /// parked.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// A queue of the user's a parked message is also published to (by
    /// the default exchange); parked messages are in the ledger either way.
    #[serde(default)]
    pub park_to: Option<String>,
    /// How late after its time a retry may still be delivered (`5m`): a
    /// retry that cannot be by then (the broker down, delayline stopped)
    /// is never delivered, and expires in the ledger instead, where it
    /// can be replayed. None: however late.
    #[serde(default)]
    pub max_lateness: Option<String>,
    /// How long a message may keep failing, from its first failure (`1h`):
    /// a retry that would come back later is not made, and the message is
    /// parked, whatever attempts it has left. None: only `max_attempts`.
    #[serde(default)]
    pub give_up_after: Option<String>,
}

fn default_initial() -> String {
    "1s".into()
}
fn default_multiplier() -> f64 {
    2.0
}
fn default_max_delay() -> String {
    "5m".into()
}
fn default_jitter() -> f64 {
    0.1
}
fn default_max_attempts() -> u32 {
    5
}

/// A retry configuration refused at start, naming the setting.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("[[retry]] {policy:?}: {setting}: {reason}")]
pub struct RetryError {
    pub policy: String,
    pub setting: &'static str,
    pub reason: String,
}

/// A policy, validated: what `GET /v1/retries` shows.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RetryPolicy {
    pub name: String,
    pub queues: Vec<String>,
    pub initial_ms: u64,
    pub multiplier: f64,
    pub max_delay_ms: u64,
    pub jitter: f64,
    pub max_attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub park_to: Option<String>,
    /// How late after its time a retry may still be delivered; absent:
    /// however late.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_lateness_ms: Option<u64>,
    /// How long a message may keep failing, from its first failure; absent:
    /// until its attempts run out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub give_up_after_ms: Option<u64>,
}

/// A failed delivery: which attempt it was, and how long ago the message's
/// first attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    pub failed: u32,
    pub failing_for_ms: u64,
}

/// Every policy, and the broker objects they share.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Retries {
    pub policies: Vec<RetryPolicy>,
    /// The exchange a consumer's queue dead-letters to (fanout).
    pub exchange: String,
    /// The quorum queue delayline takes dead-lettered messages from.
    pub queue: String,
    /// Where a message no policy covers goes, with the reason in headers.
    pub refused_queue: String,
}

/// What becomes of a message whose attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Back to its queue as `attempt`, after `delay_ms`.
    Retry { attempt: u32, delay_ms: u64 },
    /// Parked after `attempts` deliveries: its last, or the last before
    /// `give_up_after` (`gave_up`).
    Park { attempts: u32, gave_up: bool },
}

/// Why the retry intake refuses a dead-lettered message; it goes to the
/// retry refused queue with [`RetryRefusal::code`] and the reason in
/// headers, as an ingress's refusal does.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RetryRefusal {
    #[error(
        "it was not dead-lettered (no x-death header), nor does it name the queue it failed in \
         (x-delayline-retry-queue, with x-delayline-retry-at or x-delayline-retry-after-ms): \
         reject it in a queue that dead-letters to the retry exchange, or publish it there with \
         those headers"
    )]
    NotDeadLettered,
    #[error(
        "no retry policy covers queue {0:?} (none in the configuration, none set over the API)"
    )]
    NoPolicy(String),
    /// A message published to the retry exchange with a retry time whose
    /// headers do not say one.
    #[error("{0}")]
    BadAsk(String),
    /// A retry time further than the policy waits at most: refused rather
    /// than brought back earlier than asked.
    #[error(
        "a retry {asked_ms} ms away was asked for; policy {policy:?} waits at most {max_ms} ms \
         (its max_delay)"
    )]
    WaitTooLong {
        policy: String,
        asked_ms: u64,
        max_ms: u64,
    },
    /// Its retry cannot be a task (too large, or too long a wait): the
    /// intake's refusal, by its code.
    #[error("{reason}")]
    Task { code: &'static str, reason: String },
}

impl RetryRefusal {
    /// Stable, for the refused message's header and the metric's label.
    pub fn code(&self) -> &'static str {
        match self {
            RetryRefusal::NotDeadLettered => "not_dead_lettered",
            RetryRefusal::NoPolicy(_) => "no_retry_policy",
            RetryRefusal::BadAsk(_) => "bad_retry_headers",
            RetryRefusal::WaitTooLong { .. } => "retry_wait_too_long",
            RetryRefusal::Task { code, .. } => code,
        }
    }
}

impl RetrySettings {
    /// Some queue, each once, each a name a queue may have (`park_to` too).
    fn check_queues(&self) -> Result<(), String> {
        if self.queues.is_empty() {
            return Err("names no queue".into());
        }
        for queue in self.queues.iter().chain(&self.park_to) {
            check_name(queue)?;
        }
        let queues = &self.queues;
        match (1..queues.len()).find(|&i| queues[..i].contains(&queues[i])) {
            Some(twice) => Err(format!("names queue {:?} twice", queues[twice])),
            None => Ok(()),
        }
    }

    /// The policy this section describes for `cascade`, or the first
    /// setting that is wrong, and why.
    pub fn validate(self, cascade: &Cascade) -> Result<RetryPolicy, RetryError> {
        let refuse = |setting: &'static str, reason: String| RetryError {
            policy: self.name.clone(),
            setting,
            reason,
        };
        if self.name.is_empty() || self.name.len() > MAX_NAME_BYTES {
            return Err(refuse(
                "name",
                format!("must be 1 to {MAX_NAME_BYTES} bytes"),
            ));
        }
        self.check_queues()
            .map_err(|reason| refuse("queues", reason))?;
        let duration = |setting: &'static str, text: &str| {
            humantime::parse_duration(text)
                .map_err(|e| refuse(setting, format!("{text:?} is not a duration: {e}")))
                // A fraction of a millisecond rounds up: a wait is a least wait.
                .and_then(|d| match u64::try_from(d.as_nanos().div_ceil(1_000_000)) {
                    Ok(ms) if ms > 0 => Ok(ms),
                    _ => Err(refuse(setting, format!("{text:?} must be at least 1ms"))),
                })
        };
        let initial_ms = duration("initial", &self.initial)?;
        let max_lateness_ms = match &self.max_lateness {
            Some(text) => Some(duration("max_lateness", text)?),
            None => None,
        };
        let give_up_after_ms = match &self.give_up_after {
            Some(text) => Some(duration("give_up_after", text)?),
            None => None,
        };
        let max_delay_ms = duration("max_delay", &self.max_delay)?;
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return Err(refuse(
                "multiplier",
                format!("{} is below 1", self.multiplier),
            ));
        }
        if max_delay_ms < initial_ms {
            return Err(refuse(
                "max_delay",
                format!("{} is below initial ({})", self.max_delay, self.initial),
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(refuse(
                "jitter",
                format!("{} is not in 0 to 1", self.jitter),
            ));
        }
        if self.max_attempts == 0 {
            return Err(refuse("max_attempts", "must be at least 1".into()));
        }
        let longest = lengthened(max_delay_ms, self.jitter, 1.0);
        if longest > cascade.max_delay_ms() {
            return Err(refuse(
                "max_delay",
                format!(
                    "with jitter a wait may be {longest} ms, beyond the chain's longest delay \
                     ({} ms)",
                    cascade.max_delay_ms()
                ),
            ));
        }
        Ok(RetryPolicy {
            name: self.name,
            queues: self.queues,
            initial_ms,
            multiplier: self.multiplier,
            max_delay_ms,
            jitter: self.jitter,
            max_attempts: self.max_attempts,
            park_to: self.park_to,
            max_lateness_ms,
            give_up_after_ms,
        })
    }
}

/// A name for a policy set at run time: it is a path's word, so 1 to 128
/// bytes of `A-Z a-z 0-9 _ - .` (a configured one may be any text).
pub fn check_run_time_name(name: &str) -> Result<(), RetryError> {
    let fits = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    match fits {
        true => Ok(()),
        false => Err(RetryError {
            policy: name.to_owned(),
            setting: "name",
            reason: format!("must be 1 to {MAX_NAME_BYTES} bytes of A-Z, a-z, 0-9, '_', '-', '.'"),
        }),
    }
}

/// `ms` lengthened by `jitter × draw` of itself, rounded up.
fn lengthened(ms: u64, jitter: f64, draw: f64) -> u64 {
    let extra = (ms as f64 * jitter * draw.clamp(0.0, 1.0)).ceil();
    ms.saturating_add(extra as u64)
}

impl RetryPolicy {
    /// The wait after attempt `failed` (1 for the first delivery), with a
    /// jitter `draw` in [0, 1]: never below the backoff, never above
    /// `max_delay` lengthened by `jitter`.
    pub fn backoff_ms(&self, failed: u32, draw: f64) -> u64 {
        let exponent = i32::try_from(failed.saturating_sub(1)).unwrap_or(i32::MAX);
        let grown = self.initial_ms as f64 * self.multiplier.powi(exponent);
        let base = if grown.is_finite() && grown < self.max_delay_ms as f64 {
            (grown.ceil() as u64).max(self.initial_ms)
        } else {
            self.max_delay_ms
        };
        lengthened(base, self.jitter, draw)
    }

    /// What becomes of a message whose consumer asked it back `delay_ms`
    /// from now after `failure`: parked as any would be; otherwise back
    /// after exactly that wait (no backoff, no jitter), which must be within
    /// the policy's `max_delay`: a longer one is refused, never shortened (a
    /// retry never comes back early).
    pub fn verdict_asked(&self, failure: Failure, delay_ms: u64) -> Result<Verdict, RetryRefusal> {
        if failure.failed < self.max_attempts && delay_ms > self.max_delay_ms {
            return Err(RetryRefusal::WaitTooLong {
                policy: self.name.clone(),
                asked_ms: delay_ms,
                max_ms: self.max_delay_ms,
            });
        }
        Ok(self.settle(failure, delay_ms))
    }

    /// What becomes of a message after `failure`, its wait drawn with
    /// `draw` (see [`RetryPolicy::backoff_ms`]).
    pub fn verdict(&self, failure: Failure, draw: f64) -> Verdict {
        self.settle(failure, self.backoff_ms(failure.failed, draw))
    }

    /// Parked after its last attempt, or when its retry `delay_ms` away
    /// would come back later than `give_up_after` from its first failure;
    /// otherwise back after `delay_ms`.
    fn settle(&self, failure: Failure, delay_ms: u64) -> Verdict {
        let Failure {
            failed,
            failing_for_ms,
        } = failure;
        if failed >= self.max_attempts {
            return Verdict::Park {
                attempts: failed,
                gave_up: false,
            };
        }
        let back_after = failing_for_ms.saturating_add(delay_ms);
        if self.give_up_after_ms.is_some_and(|most| back_after > most) {
            return Verdict::Park {
                attempts: failed,
                gave_up: true,
            };
        }
        Verdict::Retry {
            attempt: failed + 1,
            delay_ms,
        }
    }
}

impl Retries {
    /// The policies `sections` describe for `cascade` (none: policies
    /// come only from the API), and the broker objects every policy shares.
    pub fn new(sections: &[RetrySettings], cascade: &Cascade) -> Result<Retries, RetryError> {
        let mut policies: Vec<RetryPolicy> = Vec::with_capacity(sections.len());
        for section in sections {
            let policy = section.clone().validate(cascade)?;
            let twice = |setting, reason| RetryError {
                policy: policy.name.clone(),
                setting,
                reason,
            };
            if policies.iter().any(|p| p.name == policy.name) {
                return Err(twice(
                    "name",
                    "two [[retry]] sections have this name".into(),
                ));
            }
            for queue in &policy.queues {
                if let Some(other) = policies.iter().find(|p| p.queues.contains(queue)) {
                    return Err(twice(
                        "queues",
                        format!("queue {queue:?} is in policy {:?} too", other.name),
                    ));
                }
            }
            policies.push(policy);
        }
        let exchange = format!("{}.retry", cascade.prefix());
        Ok(Retries {
            policies,
            queue: format!("{exchange}.intake"),
            refused_queue: format!("{exchange}.refused"),
            exchange,
        })
    }

    /// The policy covering `queue`.
    pub fn policy_for(&self, queue: &str) -> Option<&RetryPolicy> {
        self.policies
            .iter()
            .find(|p| p.queues.iter().any(|q| q == queue))
    }

    /// Adds the retry exchange (fanout: every dead-lettered message reaches
    /// the intake, whatever its key), the intake queue (quorum, as the
    /// chain's own) and the refused queue to `plan`.
    pub fn plan_into(&self, cascade: &Cascade, plan: &mut TopologyPlan) {
        plan.exchanges.push(ExchangeSpec {
            name: self.exchange.clone(),
            kind: ExchangeKind::Fanout,
            arguments: Arguments::new(),
        });
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::cascade::CascadeSettings;

    fn chain() -> Cascade {
        CascadeSettings {
            levels: 20,
            unit_ms: 10,
            release_stage: Some(true),
            ..CascadeSettings::default()
        }
        .validate()
        .unwrap()
    }

    fn section(name: &str, queues: &[&str]) -> RetrySettings {
        RetrySettings {
            name: name.into(),
            queues: queues.iter().map(|q| (*q).to_owned()).collect(),
            initial: "1s".into(),
            multiplier: 2.0,
            max_delay: "1m".into(),
            jitter: 0.2,
            max_attempts: 4,
            park_to: None,
            max_lateness: None,
            give_up_after: None,
        }
    }

    fn policy() -> RetryPolicy {
        section("orders", &["orders"]).validate(&chain()).unwrap()
    }

    /// Attempt `failed` failed, the message's first failure just now.
    fn fresh(failed: u32) -> Failure {
        Failure {
            failed,
            failing_for_ms: 0,
        }
    }

    #[test]
    fn give_up_after_parks_a_message_whose_retry_would_come_back_after_it() {
        let mut section = section("orders", &["orders"]);
        section.give_up_after = Some("5s".into());
        section.jitter = 0.0;
        let policy = section.validate(&chain()).unwrap();
        let after = |failed, failing_for_ms| {
            policy.verdict(
                Failure {
                    failed,
                    failing_for_ms,
                },
                0.0,
            )
        };
        // 1 s, then 2 s: back at 1 s and 3 s, within 5 s.
        assert_eq!(
            after(1, 0),
            Verdict::Retry {
                attempt: 2,
                delay_ms: 1000
            }
        );
        assert_eq!(
            after(2, 3000),
            Verdict::Retry {
                attempt: 3,
                delay_ms: 2000
            }
        );
        // The third would wait 4 s, back at 7.5 s: parked with attempts left.
        assert_eq!(
            after(3, 3500),
            Verdict::Park {
                attempts: 3,
                gave_up: true
            }
        );
        // An asked wait is judged the same way, and never refused for it.
        let asked = policy.verdict_asked(
            Failure {
                failed: 1,
                failing_for_ms: 4500,
            },
            600,
        );
        assert_eq!(
            asked,
            Ok(Verdict::Park {
                attempts: 1,
                gave_up: true
            })
        );
        assert_eq!(
            policy.verdict_asked(
                Failure {
                    failed: 1,
                    failing_for_ms: 4500
                },
                500
            ),
            Ok(Verdict::Retry {
                attempt: 2,
                delay_ms: 500
            })
        );
    }

    #[test]
    fn a_failing_message_comes_back_after_1_2_4_seconds_then_is_parked() {
        let policy = policy();
        let waits: Vec<Verdict> = (1..=4)
            .map(|failed| policy.verdict(fresh(failed), 0.0))
            .collect();
        assert_eq!(
            waits,
            [
                Verdict::Retry {
                    attempt: 2,
                    delay_ms: 1000
                },
                Verdict::Retry {
                    attempt: 3,
                    delay_ms: 2000
                },
                Verdict::Retry {
                    attempt: 4,
                    delay_ms: 4000
                },
                Verdict::Park {
                    attempts: 4,
                    gave_up: false
                },
            ]
        );
        assert_eq!(policy.backoff_ms(1, 1.0), 1200);
        assert_eq!(policy.backoff_ms(30, 0.0), 60_000);
    }

    #[test]
    fn bad_policies_are_refused_naming_the_setting() {
        let chain = chain();
        let bad = |change: fn(&mut RetrySettings)| {
            let mut settings = section("p", &["orders"]);
            change(&mut settings);
            settings.validate(&chain).unwrap_err()
        };
        assert_eq!(bad(|s| s.queues.clear()).setting, "queues");
        assert_eq!(bad(|s| s.multiplier = 0.5).setting, "multiplier");
        assert_eq!(bad(|s| s.multiplier = f64::NAN).setting, "multiplier");
        assert_eq!(bad(|s| s.max_delay = "500ms".into()).setting, "max_delay");
        assert_eq!(bad(|s| s.max_delay = "100days".into()).setting, "max_delay");
        assert_eq!(bad(|s| s.jitter = 1.5).setting, "jitter");
        assert_eq!(bad(|s| s.max_attempts = 0).setting, "max_attempts");
        let mut fractional = section("fractional", &["q"]);
        fractional.initial = "1500us".into();
        fractional.max_delay = "2ms".into();
        let taken = Retries::new(&[fractional], &chain).unwrap();
        assert_eq!(taken.policies[0].initial_ms, 2, "rounded up");
        assert_eq!(bad(|s| s.initial = "soon".into()).setting, "initial");
        assert_eq!(bad(|s| s.queues = vec!["amq.x".into()]).setting, "queues");
        let twice = Retries::new(
            &[section("a", &["orders", "x"]), section("b", &["orders"])],
            &chain,
        )
        .unwrap_err();
        assert_eq!(twice.setting, "queues");
        assert!(
            twice.to_string().contains("\"orders\" is in policy \"a\""),
            "{twice}"
        );
        assert!(Retries::new(&[], &chain).unwrap().policies.is_empty());
        assert_eq!(
            bad(|s| s.queues = vec!["a".into(), "b".into(), "a".into()]).setting,
            "queues"
        );
        assert_eq!(
            bad(|s| s.give_up_after = Some("never".into())).setting,
            "give_up_after"
        );
    }

    #[test]
    fn the_policies_declare_an_exchange_an_intake_and_a_refused_queue() {
        let chain = chain();
        let retries = Retries::new(&[section("a", &["orders"])], &chain).unwrap();
        let mut plan = chain.plan();
        retries.plan_into(&chain, &mut plan);
        assert!(plan.exchanges.iter().any(|e| e.name == "delayline.retry"));
        assert!(
            plan.queues
                .iter()
                .any(|q| q.name == "delayline.retry.intake")
        );
        assert!(
            plan.queues
                .iter()
                .any(|q| q.name == "delayline.retry.refused")
        );
        assert_eq!(retries.policy_for("orders").unwrap().name, "a");
        assert!(retries.policy_for("billing").is_none());
    }

    proptest! {
        #[test]
        fn a_wait_is_never_below_its_backoff_nor_above_the_jittered_cap(
            initial in 1u64..10_000,
            factor in 1u64..100,
            multiplier in 1.0f64..5.0,
            jitter in 0.0f64..=1.0,
            max_attempts in 1u32..40,
            failed in 1u32..60,
            draw in 0.0f64..=1.0,
        ) {
            let policy = RetryPolicy {
                name: "p".into(),
                queues: vec!["q".into()],
                initial_ms: initial,
                multiplier,
                max_delay_ms: initial * factor,
                jitter,
                max_attempts,
                park_to: None,
                max_lateness_ms: None,
                give_up_after_ms: None,
            };
            let wait = policy.backoff_ms(failed, draw);
            let plain = policy.backoff_ms(failed, 0.0);
            prop_assert!(wait >= plain);
            prop_assert!(plain >= initial && plain <= policy.max_delay_ms);
            prop_assert!(wait <= lengthened(policy.max_delay_ms, jitter, 1.0));
            // Each retry waits at least as long as the one before.
            prop_assert!(policy.backoff_ms(failed + 1, 0.0) >= plain);
            match policy.verdict(fresh(failed), draw) {
                Verdict::Retry { attempt, delay_ms } => {
                    prop_assert!(failed < max_attempts);
                    prop_assert_eq!(attempt, failed + 1);
                    prop_assert_eq!(delay_ms, wait);
                }
                Verdict::Park { attempts, gave_up } => {
                    prop_assert!(failed >= max_attempts && !gave_up);
                    prop_assert_eq!(attempts, failed);
                }
            }
        }

        /// A wait the consumer asks for is kept exactly (never shortened:
        /// one beyond `max_delay` is refused), and the attempts run out
        /// as for a rejection.
        #[test]
        fn an_asked_wait_is_kept_exactly_or_refused_never_shortened(
            max_delay in 1u64..100_000,
            asked in 0u64..200_000,
            max_attempts in 1u32..40,
            failed in 1u32..60,
        ) {
            let policy = RetryPolicy {
                name: "p".into(),
                queues: vec!["q".into()],
                initial_ms: 1,
                multiplier: 2.0,
                max_delay_ms: max_delay,
                jitter: 0.5,
                max_attempts,
                park_to: None,
                max_lateness_ms: None,
                give_up_after_ms: None,
            };
            match policy.verdict_asked(fresh(failed), asked) {
                Ok(Verdict::Retry { attempt, delay_ms }) => {
                    prop_assert!(failed < max_attempts && asked <= max_delay);
                    prop_assert_eq!((attempt, delay_ms), (failed + 1, asked));
                }
                Ok(Verdict::Park { attempts, gave_up }) => {
                    prop_assert!(failed >= max_attempts && !gave_up);
                    prop_assert_eq!(attempts, failed);
                }
                Err(refusal) => {
                    prop_assert!(failed < max_attempts && asked > max_delay);
                    prop_assert_eq!(refusal.code(), "retry_wait_too_long");
                }
            }
        }
    }

    proptest! {
        /// With `give_up_after`, no retry comes back later than it from the
        /// first failure; one that would is parked with attempts left, and
        /// only then.
        #[test]
        fn no_retry_comes_back_after_give_up_after(
            give_up_after in 1u64..100_000,
            failing_for in 0u64..200_000,
            failed in 1u32..10,
            draw in 0.0f64..=1.0,
            asked in proptest::option::of(0u64..60_000),
        ) {
            let mut policy = policy();
            policy.give_up_after_ms = Some(give_up_after);
            let failure = Failure { failed, failing_for_ms: failing_for };
            let (verdict, wait) = match asked {
                None => (policy.verdict(failure, draw), policy.backoff_ms(failed, draw)),
                Some(asked) => (policy.verdict_asked(failure, asked).unwrap(), asked),
            };
            let back_after = failing_for + wait;
            match verdict {
                Verdict::Retry { .. } => prop_assert!(back_after <= give_up_after),
                Verdict::Park { gave_up: true, .. } => {
                    prop_assert!(back_after > give_up_after && failed < policy.max_attempts);
                }
                Verdict::Park { gave_up: false, .. } => prop_assert!(failed >= policy.max_attempts),
            }
        }
    }

    #[test]
    fn a_retry_refusal_says_its_stable_code_and_what_to_do() {
        assert_eq!(RetryRefusal::NotDeadLettered.code(), "not_dead_lettered");
        assert!(
            RetryRefusal::NotDeadLettered
                .to_string()
                .contains("dead-letters to the retry exchange")
        );
        let no_policy = RetryRefusal::NoPolicy("orders".into());
        assert_eq!(no_policy.code(), "no_retry_policy");
        assert!(no_policy.to_string().contains("\"orders\""));
        let too_large = RetryRefusal::Task {
            code: "too_large",
            reason: "over 128 KiB".into(),
        };
        assert_eq!(
            (too_large.code(), too_large.to_string().as_str()),
            ("too_large", "over 128 KiB")
        );
    }
}
