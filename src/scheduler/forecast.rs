//! What falls due: the API's forecast, read from the ledger's per-minute
//! counts (kept by [`super::due_counts`]): which destinations fall due in
//! the window, then the counts per minute of those the caller may see,
//! summed in the database, both in one snapshot.

use super::Scheduler;
use super::answers::InspectError;
use crate::forecast::{Tally, Window, tally};

impl Scheduler {
    /// Tasks on their way due in each bucket of `window`, of the
    /// destinations `counted` accepts (every replica's).
    pub async fn forecast(
        &self,
        window: &Window,
        counted: impl Fn(&str) -> bool,
    ) -> Result<Tally, InspectError> {
        let ledger = self.ledger()?;
        let (from_ms, to_ms) = (window.from_ms, window.to_ms);
        let counts = ledger.due_per_minute_of(from_ms, to_ms, counted).await?;
        Ok(tally(window, counts))
    }
}
