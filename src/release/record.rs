//! What became of the tasks the ledger itself released (a limiter's pass
//! over waiting tasks, a staged release's take): each marked delivered at
//! its confirm's time, or put back to be taken again. One home for both:
//! the delivered marks (one a confirm time) are issued side by side, so the
//! writer commits them in one group, and what failed is put back after.

use std::collections::BTreeMap;

use futures_util::future::join_all;
use tracing::warn;

use crate::ledger::Ledger;

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
}

/// The outcomes of one batch of releases from the ledger.
#[derive(Debug, Default)]
pub(super) struct LedgerReleases {
    /// Ids by the time their confirms came: one delivered mark a time.
    delivered: BTreeMap<u64, Vec<String>>,
    again: Vec<String>,
}

impl LedgerReleases {
    pub fn delivered(&mut self, id: String, at_ms: u64) {
        self.delivered.entry(at_ms).or_default().push(id);
    }

    pub fn again(&mut self, id: String) {
        self.again.push(id);
    }

    /// Writes them: what it fails to write, the tasks' leases put back
    /// when they run out.
    pub async fn record(self, ledger: Ledger, put_back: PutBack) {
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
