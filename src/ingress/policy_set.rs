//! Which retry policies are in force together: the configuration's
//! `[[retry]]` sections and those set at run time (kept in the ledger).
//! Pure: the stored policies are read and validated by
//! [`super::policies`].
//!
//! The configuration is this replica's own and wins: a stored policy that
//! has a configured one's name, or covers a queue a configured one covers,
//! is set aside (and said so) rather than applied. The API refuses to make
//! one ([`PolicySet::admits`]); it can only arise from replicas whose
//! configuration files differ. Stored policies never share a queue: the
//! ledger refuses a second claim on one.

use serde::Serialize;

use super::retry::RetryPolicy;

/// A policy set at run time, validated, with who changed it last.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredPolicy {
    pub policy: RetryPolicy,
    pub changed_by: Option<String>,
    pub created_at_ms: u64,
    pub changed_at_ms: u64,
}

/// Where a policy in force comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicySource {
    /// A `[[retry]]` section of this replica's configuration file.
    Configuration,
    /// Set over the API (or the CLI, or the console), kept in the ledger.
    Ledger {
        changed_by: Option<String>,
        created_at_ms: u64,
        changed_at_ms: u64,
    },
}

impl PolicySource {
    /// `configuration` or `api`, as the API and the console say it.
    pub fn as_str(&self) -> &'static str {
        match self {
            PolicySource::Configuration => "configuration",
            PolicySource::Ledger { .. } => "api",
        }
    }
}

/// A policy in force, and where it comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct InForce {
    pub policy: RetryPolicy,
    pub source: PolicySource,
}

/// Why a policy cannot be set at run time.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyConflict {
    #[error(
        "policy {0:?} comes from the configuration file ([[retry]]): change it there (and \
         restart), or give the new policy another name"
    )]
    Configured(String),
    #[error("queue {queue:?} is in policy {policy:?} already: a queue is in one policy at most")]
    QueueTaken { queue: String, policy: String },
}

/// A stored policy the configuration overrides on this replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SetAside {
    pub name: String,
    pub reason: String,
}

/// The policies in force on one replica.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicySet {
    in_force: Vec<InForce>,
    set_aside: Vec<SetAside>,
}

impl PolicySet {
    /// The configuration's policies, then the stored ones it does not
    /// override, by name.
    pub fn new(configured: &[RetryPolicy], stored: Vec<StoredPolicy>) -> PolicySet {
        let mut set = PolicySet {
            in_force: configured
                .iter()
                .map(|policy| InForce {
                    policy: policy.clone(),
                    source: PolicySource::Configuration,
                })
                .collect(),
            set_aside: Vec::new(),
        };
        for stored in stored {
            let in_force = set.in_force.iter().map(|f| &f.policy);
            match conflict(&stored.policy, configured, in_force) {
                Some(conflict) => set.set_aside.push(SetAside {
                    name: stored.policy.name,
                    reason: conflict.to_string(),
                }),
                None => set.in_force.push(InForce {
                    policy: stored.policy,
                    source: PolicySource::Ledger {
                        changed_by: stored.changed_by,
                        created_at_ms: stored.created_at_ms,
                        changed_at_ms: stored.changed_at_ms,
                    },
                }),
            }
        }
        set
    }

    /// With `more` set aside too (stored policies this replica cannot read).
    pub fn also_set_aside(mut self, more: Vec<SetAside>) -> PolicySet {
        self.set_aside.extend(more);
        self
    }

    /// Whether `candidate` may be set at run time: not a configured
    /// policy's name, and none of a configured policy's queues. (Another
    /// stored policy's queues are the ledger's to refuse, atomically.)
    pub fn admits(&self, candidate: &RetryPolicy) -> Result<(), PolicyConflict> {
        let configured: Vec<RetryPolicy> = self
            .in_force
            .iter()
            .filter(|f| f.source == PolicySource::Configuration)
            .map(|f| f.policy.clone())
            .collect();
        match conflict(candidate, &configured, configured.iter()) {
            Some(conflict) => Err(conflict),
            None => Ok(()),
        }
    }

    /// The policy covering `queue`.
    pub fn policy_for(&self, queue: &str) -> Option<&InForce> {
        self.in_force
            .iter()
            .find(|f| f.policy.queues.iter().any(|q| q == queue))
    }

    /// The policy named `name`.
    pub fn named(&self, name: &str) -> Option<&InForce> {
        self.in_force.iter().find(|f| f.policy.name == name)
    }

    /// Every policy in force: the configuration's, then the stored ones by
    /// name.
    pub fn in_force(&self) -> &[InForce] {
        &self.in_force
    }

    /// Stored policies the configuration overrides here.
    pub fn set_aside(&self) -> &[SetAside] {
        &self.set_aside
    }
}

/// What keeps `candidate` from being in force beside the `configured`
/// policies and those `in_force` already.
fn conflict<'a>(
    candidate: &RetryPolicy,
    configured: &[RetryPolicy],
    in_force: impl Iterator<Item = &'a RetryPolicy>,
) -> Option<PolicyConflict> {
    if configured.iter().any(|p| p.name == candidate.name) {
        return Some(PolicyConflict::Configured(candidate.name.clone()));
    }
    for other in in_force.filter(|p| p.name != candidate.name) {
        if let Some(queue) = candidate.queues.iter().find(|q| other.queues.contains(q)) {
            return Some(PolicyConflict::QueueTaken {
                queue: queue.clone(),
                policy: other.name.clone(),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn policy(name: &str, queues: &[&str]) -> RetryPolicy {
        RetryPolicy {
            name: name.into(),
            queues: queues.iter().map(|q| (*q).to_owned()).collect(),
            initial_ms: 1000,
            multiplier: 2.0,
            max_delay_ms: 60_000,
            jitter: 0.1,
            max_attempts: 5,
            park_to: None,
            max_lateness_ms: None,
            give_up_after_ms: None,
        }
    }

    fn stored(name: &str, queues: &[&str]) -> StoredPolicy {
        StoredPolicy {
            policy: policy(name, queues),
            changed_by: Some("ops".into()),
            created_at_ms: 1,
            changed_at_ms: 2,
        }
    }

    #[test]
    fn the_configuration_wins_over_a_stored_policy_of_its_name_or_queues() {
        let configured = [policy("orders", &["orders", "invoices"])];
        let set = PolicySet::new(
            &configured,
            vec![
                stored("orders", &["other"]),
                stored("billing", &["billing"]),
                stored("grab", &["invoices"]),
            ],
        );
        let names: Vec<&str> = set
            .in_force()
            .iter()
            .map(|f| f.policy.name.as_str())
            .collect();
        assert_eq!(names, ["orders", "billing"]);
        assert_eq!(
            set.policy_for("orders").unwrap().source,
            PolicySource::Configuration
        );
        assert_eq!(set.policy_for("billing").unwrap().source.as_str(), "api");
        assert!(set.policy_for("other").is_none());
        let aside: Vec<&str> = set.set_aside().iter().map(|a| a.name.as_str()).collect();
        assert_eq!(aside, ["orders", "grab"]);
        assert!(
            set.set_aside()[1]
                .reason
                .contains("\"invoices\" is in policy \"orders\"")
        );
    }

    #[test]
    fn the_api_may_change_a_stored_policy_but_not_a_configured_one() {
        let set = PolicySet::new(&[policy("orders", &["orders"])], vec![stored("b", &["b"])]);
        assert_eq!(
            set.admits(&policy("orders", &["x"])),
            Err(PolicyConflict::Configured("orders".into()))
        );
        assert_eq!(
            set.admits(&policy("new", &["y", "orders"])),
            Err(PolicyConflict::QueueTaken {
                queue: "orders".into(),
                policy: "orders".into()
            })
        );
        assert_eq!(set.admits(&policy("b", &["b", "c"])), Ok(()));
        // Another stored policy's queue is the ledger's to refuse.
        assert_eq!(set.admits(&policy("d", &["b"])), Ok(()));
    }

    proptest! {
        /// However stored and configured policies overlap, each queue has
        /// one policy in force at most, and a configured policy is always in
        /// force as written.
        #[test]
        fn each_queue_has_one_policy_at_most_and_the_configuration_stays(
            configured in prop::collection::vec(prop::collection::btree_set(0u8..8, 1..3), 0..3),
            stored_queues in prop::collection::vec(prop::collection::btree_set(0u8..8, 1..3), 0..5),
        ) {
            let name = |prefix: &str, i: usize| format!("{prefix}{i}");
            let queues = |set: &std::collections::BTreeSet<u8>| -> Vec<String> {
                set.iter().map(|q| format!("q{q}")).collect()
            };
            let mut configured_policies: Vec<RetryPolicy> = Vec::new();
            for (i, set) in configured.iter().enumerate() {
                let mine = queues(set);
                let taken = configured_policies.iter().any(|p| mine.iter().any(|q| p.queues.contains(q)));
                if !taken {
                    let refs: Vec<&str> = mine.iter().map(String::as_str).collect();
                    configured_policies.push(policy(&name("c", i), &refs));
                }
            }
            let stored_policies: Vec<StoredPolicy> = stored_queues
                .iter()
                .enumerate()
                .map(|(i, set)| {
                    let mine = queues(set);
                    let refs: Vec<&str> = mine.iter().map(String::as_str).collect();
                    // Every other one takes a configured policy's name.
                    let policy_name = match configured_policies.first() {
                        Some(first) if i % 2 == 1 => first.name.clone(),
                        _ => name("s", i),
                    };
                    stored(&policy_name, &refs)
                })
                .collect();
            let count = stored_policies.len();
            let set = PolicySet::new(&configured_policies, stored_policies);
            for q in 0u8..8 {
                let queue = format!("q{q}");
                let covering = set.in_force().iter().filter(|f| f.policy.queues.contains(&queue)).count();
                prop_assert!(covering <= 1);
            }
            for policy in &configured_policies {
                let found = set.named(&policy.name).unwrap();
                prop_assert_eq!(&found.policy, policy);
                prop_assert_eq!(&found.source, &PolicySource::Configuration);
            }
            prop_assert_eq!(set.in_force().len() + set.set_aside().len(), configured_policies.len() + count);
        }
    }
}
