//! What became of the tasks the ledger itself released (a limiter's pass
//! over waiting tasks, a staged release's take): each marked delivered at
//! its confirm's time, or put back to be taken again. One home for both:
//! the delivered marks (one a confirm time) are issued side by side, so the
//! writer commits them in one group, and what failed is put back after.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::future::join_all;
use tracing::warn;

use super::publisher::{Outcome, Released};
use crate::ledger::{Expiry, Ledger, StoredTask};
use crate::metrics::Metrics;

/// Where a task whose release failed goes back to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PutBack {
    /// `waiting`, for its limit's next pass.
    Wait,
    /// `staged`, taken again at once (its moment has come).
    Stage,
}

impl PutBack {
    /// The state it puts tasks back in, as the ledger names it.
    fn state(self) -> &'static str {
        match self {
            PutBack::Wait => "waiting",
            PutBack::Stage => "staged",
        }
    }

    /// Where a task whose deadline passed was caught (the metrics' path),
    /// and why it expired, in the ledger's words.
    fn expiry(self) -> (&'static str, &'static str) {
        match self {
            PutBack::Wait => (
                "limiter",
                "its deadline passed before its release limit let it go",
            ),
            PutBack::Stage => (
                "staged",
                "its deadline passed before the staged release could publish it (delayline \
                 stopped, or the broker unavailable)",
            ),
        }
    }
}

/// Why a task expired, as the ledger keeps it: `why`, and where its
/// message went instead, if anywhere.
pub(super) fn expiry_why(why: &str, sent_to: Option<&str>) -> String {
    match sent_to {
        Some(destination) => format!("{why}; its message was sent to {destination} instead"),
        None => why.to_owned(),
    }
}

/// The outcomes of one batch of releases from the ledger.
#[derive(Debug, Default)]
pub(super) struct LedgerReleases {
    /// Ids by the time their confirms came: one delivered mark a time.
    delivered: BTreeMap<u64, Vec<String>>,
    again: Vec<String>,
    /// Tasks whose deadline had passed at their publish: never published;
    /// at when, and where their message went instead.
    expired: Vec<(String, u64, u64, Option<String>)>,
}

impl LedgerReleases {
    pub fn delivered(&mut self, id: String, at_ms: u64) {
        self.delivered.entry(at_ms).or_default().push(id);
    }

    pub fn again(&mut self, id: String) {
        self.again.push(id);
    }

    /// Where `outcome`, `task`'s release at `at_ms`, leaves it: delivered,
    /// expired, or put back (a failed publish, said in the log). What was
    /// released, for the caller to observe.
    pub fn note(&mut self, task: &StoredTask, outcome: Outcome, at_ms: u64) -> Option<Released> {
        let id = task.id.clone();
        match outcome {
            Outcome::Published(Ok(released)) => {
                self.delivered(id, at_ms);
                return Some(released);
            }
            Outcome::Expired(None) => self.expired.push((id, task.revision, at_ms, None)),
            Outcome::Expired(Some((to, Ok(_)))) => {
                self.expired.push((id, task.revision, at_ms, Some(to)));
            }
            Outcome::Published(Err(error)) | Outcome::Expired(Some((_, Err(error)))) => {
                warn!(task_id = task.id, %error, "a task released from the ledger could not be published; it is put back");
                self.again(id);
            }
        }
        None
    }

    /// Writes them: what it fails to write, the tasks' leases put back
    /// when they run out (an expired task's too: expired at the next take).
    pub async fn record(self, ledger: Ledger, put_back: PutBack, metrics: Arc<Metrics>) {
        if !self.expired.is_empty() {
            let (path, why) = put_back.expiry();
            metrics.expired(path, self.expired.len() as u64);
            let expired: Vec<Expiry> = self
                .expired
                .into_iter()
                .map(|(id, revision, at_ms, sent_to)| Expiry {
                    why: expiry_why(why, sent_to.as_deref()),
                    id,
                    revision,
                    at_ms,
                })
                .collect();
            if let Err(error) = ledger.mark_expired(&expired).await {
                warn!(%error, "expired tasks not marked so in the ledger");
            }
        }
        let marks = self
            .delivered
            .into_iter()
            .map(|(at_ms, ids)| ledger.mark_delivered(ids, at_ms));
        for marked in join_all(marks).await {
            if let Err(error) = marked {
                warn!(%error, "released tasks not marked delivered in the ledger");
            }
        }
        if self.again.is_empty() {
            return;
        }
        let put = match put_back {
            PutBack::Wait => ledger.wait_again(&self.again).await,
            PutBack::Stage => ledger.stage_again(&self.again).await,
        };
        if let Err(error) = put {
            warn!(
                %error,
                state = put_back.state(),
                "tasks whose release failed are put back only when their lease runs out"
            );
        }
    }
}
