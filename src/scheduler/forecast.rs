//! What falls due: the API's forecast, read from the ledger's per-minute
//! counts (kept by [`super::due_counts`]): which destinations fall due in
//! the window, then the counts per minute of those the caller may see,
//! summed in the database.

use super::Scheduler;
use super::answers::InspectError;
use crate::forecast::{Tally, Window, chosen, tally};

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
        let only = chosen(ledger.due_destinations(from_ms, to_ms).await?, counted);
        if only.as_ref().is_some_and(Vec::is_empty) {
            return Ok(tally(window, []));
        }
        let counts = ledger
            .due_per_minute(from_ms, to_ms, only.as_deref())
            .await?;
        Ok(tally(window, counts))
    }
}
