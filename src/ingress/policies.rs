//! The retry policies in force on this replica, kept fresh: the
//! configuration's, and those set at run time in the ledger (over the API,
//! the CLI or the console), which every replica sharing the ledger reads
//! again every [`REFRESH_EVERY`]. A change made here is in force here at
//! once, and on the other replicas within that bound; it applies to the
//! messages taken in after it (a retry already scheduled keeps its wait).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::policy_set::{InForce, PolicyConflict, PolicySet, SetAside, StoredPolicy};
use super::retry::{Retries, RetryError, RetrySettings, check_run_time_name};
use crate::cascade::Cascade;
use crate::ledger::{Ledger, LedgerError, PolicyPut, RetryPolicyChange, StoredRetryPolicy};

/// How often each replica reads the stored policies again: the bound
/// within which a change made on one is in force on all.
pub const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// What can go wrong when policies are changed or read.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "this service has no ledger (or no release stage): retry policies come only from its configuration"
    )]
    LedgerDisabled,
    #[error("no retry policy named {0:?} is set over the API")]
    NotFound(String),
    #[error(transparent)]
    Invalid(#[from] RetryError),
    #[error(transparent)]
    Conflict(#[from] PolicyConflict),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// The broker objects every policy shares, and the policies in force.
pub struct RetryBook {
    retries: Retries,
    cascade: Arc<Cascade>,
    /// Where policies set at run time are kept; `None` without a ledger.
    ledger: Option<Ledger>,
    in_force: ArcSwap<PolicySet>,
}

impl RetryBook {
    /// The configuration's policies alone, until the first
    /// [`RetryBook::refresh`] reads the ledger's.
    pub fn new(retries: Retries, cascade: Arc<Cascade>, ledger: Option<Ledger>) -> RetryBook {
        let configured = PolicySet::new(&retries.policies, Vec::new());
        RetryBook {
            retries,
            cascade,
            ledger,
            in_force: ArcSwap::from_pointee(configured),
        }
    }

    /// The broker objects, and the configuration's policies.
    pub fn retries(&self) -> &Retries {
        &self.retries
    }

    /// The policies in force now.
    pub fn current(&self) -> Arc<PolicySet> {
        self.in_force.load_full()
    }

    /// Whether policies can be set at run time here.
    pub fn settable(&self) -> bool {
        self.ledger.is_some()
    }

    fn ledger(&self) -> Result<&Ledger, PolicyError> {
        self.ledger.as_ref().ok_or(PolicyError::LedgerDisabled)
    }

    /// Reads the stored policies again; says in the log what changed.
    pub async fn refresh(&self) -> Result<(), LedgerError> {
        let Some(ledger) = &self.ledger else {
            return Ok(());
        };
        let rows = ledger.retry_policies().await?;
        let (stored, unreadable) = validated(rows, &self.cascade);
        let set = PolicySet::new(&self.retries.policies, stored).also_set_aside(unreadable);
        let before = self.in_force.load();
        if **before != set {
            for aside in set.set_aside() {
                if !before.set_aside().contains(aside) {
                    warn!(
                        policy = aside.name,
                        reason = aside.reason,
                        "a stored retry policy is not in force here"
                    );
                }
            }
            let names: Vec<&str> = set
                .in_force()
                .iter()
                .map(|f| f.policy.name.as_str())
                .collect();
            info!(policies = ?names, "retry policies in force");
            self.in_force.store(Arc::new(set));
        }
        Ok(())
    }

    /// Reads the stored policies again every [`REFRESH_EVERY`] until
    /// `shutdown`; a ledger that cannot be read leaves the last read in
    /// force.
    pub async fn keep_fresh(self: Arc<Self>, shutdown: CancellationToken) {
        if self.ledger.is_none() {
            return;
        }
        loop {
            if let Err(error) = self.refresh().await {
                warn!(%error, "cannot read the stored retry policies; the last read stand");
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(REFRESH_EVERY) => {}
            }
        }
    }

    /// Sets policy `settings.name` (new, or changed in place) as
    /// `changed_by` at `now_ms`; the policy as now in force, and whether it
    /// is new. In force here at once.
    pub async fn put(
        &self,
        settings: RetrySettings,
        changed_by: Option<&str>,
        now_ms: u64,
    ) -> Result<(InForce, bool), PolicyError> {
        let ledger = self.ledger()?;
        check_run_time_name(&settings.name)?;
        let policy = settings.clone().validate(&self.cascade)?;
        let text = serde_json::to_string(&settings).map_err(|error| RetryError {
            policy: policy.name.clone(),
            setting: "name",
            reason: error.to_string(),
        })?;
        self.current().admits(&policy)?;
        let row = StoredRetryPolicy {
            name: policy.name.clone(),
            settings: text,
            queues: policy.queues.clone(),
            changed_by: changed_by.map(str::to_owned),
            created_at_ms: now_ms,
            changed_at_ms: now_ms,
        };
        let created = match ledger.put_retry_policy(&row).await? {
            PolicyPut::QueueTaken { queue, policy } => {
                return Err(PolicyConflict::QueueTaken { queue, policy }.into());
            }
            PolicyPut::Created => true,
            PolicyPut::Changed | PolicyPut::Unchanged => false,
        };
        self.refresh().await?;
        match self.current().named(&policy.name) {
            Some(in_force) => Ok((in_force.clone(), created)),
            // Removed by another replica in between.
            None => Err(PolicyError::NotFound(policy.name)),
        }
    }

    /// Removes policy `name`, set at run time, as `changed_by` at `now_ms`.
    /// The queues it covered are covered by none (their dead letters are
    /// refused) until another policy takes them.
    pub async fn remove(
        &self,
        name: &str,
        changed_by: Option<&str>,
        now_ms: u64,
    ) -> Result<(), PolicyError> {
        let ledger = self.ledger()?;
        if self.retries.policies.iter().any(|p| p.name == name) {
            return Err(PolicyConflict::Configured(name.to_owned()).into());
        }
        if !ledger.delete_retry_policy(name, changed_by, now_ms).await? {
            return Err(PolicyError::NotFound(name.to_owned()));
        }
        self.refresh().await?;
        Ok(())
    }

    /// The last `limit` changes made at run time, newest first.
    pub async fn changes(&self, limit: u32) -> Result<Vec<RetryPolicyChange>, PolicyError> {
        Ok(self.ledger()?.retry_policy_changes(limit).await?)
    }
}

/// Each stored row as a policy for `cascade`, or set aside with why (a
/// chain whose longest delay is shorter than another replica's, or a row a
/// later version wrote).
pub fn validated(
    rows: Vec<StoredRetryPolicy>,
    cascade: &Cascade,
) -> (Vec<StoredPolicy>, Vec<SetAside>) {
    let mut stored = Vec::with_capacity(rows.len());
    let mut unreadable = Vec::new();
    for row in rows {
        let settings = serde_json::from_str::<RetrySettings>(&row.settings)
            .map_err(|error| error.to_string())
            .and_then(|settings| {
                settings
                    .validate(cascade)
                    .map_err(|error| error.to_string())
            });
        match settings {
            Ok(policy) => stored.push(StoredPolicy {
                policy,
                changed_by: row.changed_by,
                created_at_ms: row.created_at_ms,
                changed_at_ms: row.changed_at_ms,
            }),
            Err(reason) => unreadable.push(SetAside {
                name: row.name,
                reason,
            }),
        }
    }
    (stored, unreadable)
}
