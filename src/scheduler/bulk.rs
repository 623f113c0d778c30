//! Changes in bulk, the API's side: start an operation (recorded in the
//! ledger, answered at once; [`super::bulk_worker`] works it) and read it.

use super::Scheduler;
use super::answers::BulkOperationError;
use crate::bulk::{Bulk, BulkRequest};
use crate::ledger::StoredOperation;

impl Scheduler {
    /// Starts `request` (already checked as `bulk`) for `owner`; with `key`,
    /// the same request again is the same operation, and another request
    /// under it a conflict. Whether it is new.
    pub async fn start_bulk(
        &self,
        request: &BulkRequest,
        bulk: &Bulk,
        key: Option<String>,
        fingerprint: String,
        owner: Option<&str>,
        now_ms: u64,
    ) -> Result<(StoredOperation, bool), BulkOperationError> {
        let bookkeeper = self
            .changeable()
            .map_err(BulkOperationError::Unchangeable)?;
        let text = serde_json::to_string(request).unwrap_or_default();
        let new = StoredOperation {
            id: uuid::Uuid::new_v4().to_string(),
            owner: owner.unwrap_or_default().to_owned(),
            idempotency_key: key.clone(),
            fingerprint,
            request: text,
            state: "running".to_owned(),
            cursor_at_ms: i64::try_from(bulk.due_after_ms).unwrap_or(i64::MAX),
            created_at_ms: i64::try_from(now_ms).unwrap_or(i64::MAX),
            ..StoredOperation::default()
        };
        let (found, created) = bookkeeper.ledger().start_operation(&new).await?;
        if !created && found.fingerprint != new.fingerprint {
            return Err(BulkOperationError::Conflict {
                key: key.unwrap_or_default(),
                existing_id: found.id,
            });
        }
        Ok((found, created))
    }

    /// How many of `destination`'s tasks due before `before_ms` (in `state`,
    /// of `owner`) a cancel could still change, counted up to `at_most`.
    pub async fn count_changeable(
        &self,
        destination: &str,
        (before_ms, at_most): (u64, u64),
        state: Option<crate::task::TaskState>,
        owner: Option<&str>,
    ) -> Result<u64, BulkOperationError> {
        let bookkeeper = self
            .changeable()
            .map_err(BulkOperationError::Unchangeable)?;
        Ok(bookkeeper
            .ledger()
            .count_changeable(destination, (before_ms, at_most), state, owner)
            .await?)
    }

    /// Operation `id`; another owner's is not found.
    pub async fn operation(
        &self,
        id: &str,
        owner: Option<&str>,
    ) -> Result<StoredOperation, BulkOperationError> {
        let bookkeeper = self
            .changeable()
            .map_err(BulkOperationError::Unchangeable)?;
        match bookkeeper.ledger().operation(id).await? {
            Some(found) if owner.is_none_or(|o| o == found.owner) => Ok(found),
            _ => Err(BulkOperationError::NotFound(id.to_owned())),
        }
    }
}
