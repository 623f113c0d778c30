//! `migrate-topology`: the operator's side of moving to a new chain. The
//! broker adapter ([`crate::broker::migrate_topology`]) moves messages; this
//! layer decides about tasks through the ledger: which copies are no longer
//! wanted (cancelled tasks, older revisions of moved ones) and which tasks a
//! poisoned message leaves failed.

use std::collections::HashMap;

use lapin::BasicProperties;

use super::run::{on_broker, open_ledger};
use super::{OperationError, OperatorSettings};
use crate::broker::{self, ManagementApi, MigrationReport, OldChain, Survey};
use crate::cascade::Cascade;
use crate::clock::format_epoch_ms;
use crate::ledger::{Cursor, Ledger, TaskFilter};
use crate::message;
use crate::task::TaskState;

/// Copies no longer to be delivered, by task id: those whose revision is
/// below the one given. A cancelled task's is `u64::MAX`. Filled from the
/// ledger, so that a chain moved off the release stage (which drops such
/// copies when they fall due) does not deliver them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Superseded(pub HashMap<String, u64>);

impl Superseded {
    /// A copy is wanted unless its task is known here with a newer revision.
    pub fn still_wanted(&self, properties: &BasicProperties) -> bool {
        let Some((id, revision)) = message::identity(properties) else {
            return true;
        };
        self.0
            .get(&id)
            .is_none_or(|&keep_from| revision >= keep_from)
    }
}

/// What a migration would find, without taking anything.
#[derive(Clone, Debug)]
pub struct DryRun {
    pub old: OldChain,
    pub survey: Survey,
    /// Waiting tasks (id, due) the new chain cannot hold; `None` without a ledger.
    pub beyond: Option<Vec<(String, String)>>,
    /// Tasks on their way, by the ledger: the old chain's messages are
    /// these and, with the release stage, the service's level probes.
    pub tasks: Option<u64>,
}

pub async fn dry_run(
    settings: &OperatorSettings,
    new: &Cascade,
    old: OldChain,
) -> Result<DryRun, OperationError> {
    let survey = on_broker(
        &settings.amqp,
        "delayline migrate-topology --dry-run",
        async |connection| Ok(broker::survey(connection, &old).await?),
    )
    .await?;
    let (beyond, tasks) = match open_ledger(settings).await? {
        None => (None, None),
        Some(ledger) => {
            let beyond = beyond_the_chain(&ledger, new).await;
            let tasks = ledger.tasks_on_their_way().await;
            ledger.close().await;
            (Some(beyond?), Some(tasks?))
        }
    };
    Ok(DryRun {
        old,
        survey,
        beyond,
        tasks,
    })
}

/// Not yet delivered tasks due later than `cascade` can hold from now: (id, due).
async fn beyond_the_chain(
    ledger: &Ledger,
    cascade: &Cascade,
) -> Result<Vec<(String, String)>, OperationError> {
    let now_ms = crate::clock::now_ms();
    let mut filter = TaskFilter {
        after: Some(Cursor {
            deliver_at_ms: now_ms + cascade.max_delay_ms(),
            id: String::new(),
        }),
        limit: 1000,
        ..TaskFilter::default()
    };
    let mut beyond = Vec::new();
    loop {
        let page = ledger.list(&filter, now_ms).await?;
        let Some(last) = page.last() else {
            return Ok(beyond);
        };
        filter.after = Some(Cursor {
            deliver_at_ms: last.deliver_at_ms,
            id: last.id.clone(),
        });
        beyond.extend(
            page.iter()
                .filter(|task| task.state != TaskState::Failed)
                .map(|task| (task.id.clone(), format_epoch_ms(task.deliver_at_ms))),
        );
    }
}

/// What a migration did.
#[derive(Clone, Debug)]
pub struct Migrated {
    pub old: OldChain,
    pub report: MigrationReport,
    /// Poisoned tasks marked failed in the ledger: (id, reason).
    pub failed: Vec<(String, String)>,
    /// Why emptiness was counted in ready messages only, if it was.
    pub management_unavailable: Option<String>,
    /// Staged tasks made pending, to be published into a new chain without
    /// a release stage by what remains of their delay.
    pub staged_forwarded: u64,
}

/// Moves every waiting message of the chain `from` names into `new`, then
/// deletes the old chain. Safe to run again after a crash.
pub async fn migrate(
    settings: &OperatorSettings,
    new: &Cascade,
    old: OldChain,
) -> Result<Migrated, OperationError> {
    // Copies of cancelled tasks and older revisions of moved ones stay
    // behind: the new chain may have no release stage to drop them.
    let superseded = match open_ledger(settings).await? {
        None => Superseded::default(),
        Some(ledger) => {
            let superseded = ledger.superseded().await;
            ledger.close().await;
            Superseded(superseded?)
        }
    };
    let amqp = &settings.amqp;
    // It alone counts what a quorum queue holds; without it, ready messages are counted.
    let (management, management_unavailable) = match amqp.uris().first() {
        None => (None, None),
        Some(uri) => match ManagementApi::new(uri, settings.management_url.expose()) {
            Ok(api) => (api, None),
            Err(error) => (None, Some(error.to_string())),
        },
    };
    let still_wanted = |properties: &BasicProperties| superseded.still_wanted(properties);
    let report = on_broker(amqp, "delayline migrate-topology", async |connection| {
        Ok(
            broker::migrate_topology(connection, &old, new, &still_wanted, management.as_ref())
                .await?,
        )
    })
    .await?;
    let failed = mark_poisoned_failed(settings, new, &report).await?;
    let staged_forwarded = forward_staged(settings, new).await?;
    Ok(Migrated {
        old,
        report,
        failed,
        management_unavailable,
        staged_forwarded,
    })
}

/// Onto a chain without a release stage, nothing releases staged tasks from
/// the ledger: they are made pending, and the service's forwarder publishes
/// each by what remains of its delay.
async fn forward_staged(settings: &OperatorSettings, new: &Cascade) -> Result<u64, OperationError> {
    if new.release_stage() {
        return Ok(0);
    }
    let Some(ledger) = open_ledger(settings).await? else {
        return Ok(0);
    };
    let forwarded = ledger.forward_staged(crate::clock::now_ms()).await;
    ledger.close().await;
    Ok(forwarded?)
}

/// A task whose message went to the poison queue is never delivered: the
/// ledger says so, with the reason.
async fn mark_poisoned_failed(
    settings: &OperatorSettings,
    new: &Cascade,
    report: &MigrationReport,
) -> Result<Vec<(String, String)>, OperationError> {
    if report.poisoned_tasks.is_empty() {
        return Ok(Vec::new());
    }
    let Some(ledger) = open_ledger(settings).await? else {
        return Ok(Vec::new());
    };
    let mut failed = Vec::new();
    for (id, reason) in &report.poisoned_tasks {
        let why = format!(
            "moved to {} by migrate-topology, not delivered: {reason}",
            new.poison_queue()
        );
        if let Err(error) = ledger.mark_failed(id.clone(), None, why).await {
            ledger.close().await;
            return Err(error.into());
        }
        failed.push((id.clone(), reason.clone()));
    }
    ledger.close().await;
    Ok(failed)
}

#[cfg(test)]
mod tests {
    use lapin::types::{AMQPValue, FieldTable};

    use super::*;

    #[test]
    fn a_copy_is_dropped_only_below_the_revision_the_ledger_keeps() {
        let copy = |id: &str, revision: Option<i64>| {
            let mut headers = FieldTable::default();
            if let Some(revision) = revision {
                headers.insert(
                    message::REVISION_HEADER.into(),
                    AMQPValue::LongLongInt(revision),
                );
            }
            BasicProperties::default()
                .with_message_id(id.into())
                .with_headers(headers)
        };
        let superseded = Superseded(HashMap::from([
            ("moved".to_owned(), 3),
            ("cancelled".to_owned(), u64::MAX),
        ]));
        assert!(!superseded.still_wanted(&copy("moved", Some(2))));
        assert!(!superseded.still_wanted(&copy("moved", None)));
        assert!(superseded.still_wanted(&copy("moved", Some(3))));
        assert!(!superseded.still_wanted(&copy("cancelled", Some(9))));
        assert!(superseded.still_wanted(&copy("other", Some(1))));
        assert!(superseded.still_wanted(&BasicProperties::default()));
    }
}
