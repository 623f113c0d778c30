//! `delayline retries check`: whether each queue a retry policy covers (or
//! that the operator names) is wired to the retry exchange, as the broker
//! shows it. AMQP tells whether the objects exist; the management API, where
//! the broker has it, tells an exchange's type and bindings and a queue's
//! arguments and policy. What could not be seen is said, not passed.

use super::run::{on_broker, open_existing_ledger};
use super::{OperationError, OperatorSettings};
use crate::broker::{ManagementApi, ManagementError, QueueWiring, exchange_exists, queue_state};
use crate::cascade::Cascade;
use crate::ingress::wiring::{DeadLetter, Finding, Observed, judge};
use crate::ingress::{PolicySet, Retries};

/// `retries` with the policies set at run time the ledger keeps, as a
/// service of `cascade` would apply them beside the configuration's.
pub async fn in_force(
    settings: &OperatorSettings,
    cascade: &Cascade,
    retries: Retries,
) -> Result<Retries, OperationError> {
    let Some(ledger) = open_existing_ledger(settings).await? else {
        return Ok(retries);
    };
    let rows = ledger.retry_policies().await;
    ledger.close().await;
    let (stored, _) = crate::ingress::validated(rows?, cascade);
    let set = PolicySet::new(&retries.policies, stored);
    let policies = set.in_force().iter().map(|f| f.policy.clone()).collect();
    Ok(Retries {
        policies,
        ..retries
    })
}

/// Each queue's wiring, judged: `queues`, or every queue of every policy.
pub async fn check(
    settings: &OperatorSettings,
    retries: &Retries,
    queues: &[String],
) -> Result<Vec<(String, Vec<Finding>)>, OperationError> {
    let queues: Vec<String> = match queues.is_empty() {
        true => retries
            .policies
            .iter()
            .flat_map(|p| p.queues.clone())
            .collect(),
        false => queues.to_vec(),
    };
    let seen = on_broker(&settings.amqp, "delayline retries check", async |c| {
        let exchange = exchange_exists(c, &retries.exchange).await?;
        let intake = queue_state(c, &retries.queue).await?.is_some();
        let mut each = Vec::new();
        for queue in &queues {
            each.push(queue_state(c, queue).await?.is_some());
        }
        Ok((exchange, intake, each))
    })
    .await?;
    let (exchange_exists, intake_exists, queues_exist) = seen;
    let api = management(settings);
    // The exchange once for every queue; each queue's wiring on its own.
    let exchange = match &api {
        Ok(api) => api.exchange(&retries.exchange).await.map_err(unseen),
        Err(why) => Err(why.clone()),
    };
    let mut checked = Vec::new();
    for (queue, queue_exists) in queues.into_iter().zip(queues_exist) {
        let seen = match (&api, &exchange) {
            (Ok(api), Ok(exchange)) => (api.queue_wiring(&queue).await)
                .map(|wiring| (exchange.clone(), wiring))
                .map_err(unseen),
            (_, Err(why)) | (Err(why), _) => Err(why.clone()),
        };
        let observed = match seen {
            Ok((exchange, wiring)) => Observed {
                exchange: exchange.map(|e| (e.kind, e.bound_queues)),
                dead_letter: wiring.map(|w| dead_letter(&w)),
                ..Observed::default()
            },
            Err(why) => Observed {
                unseen: Some(why),
                ..Observed::default()
            },
        };
        let observed = Observed {
            exchange_exists,
            intake_exists,
            queue_exists,
            ..observed
        };
        let findings = judge(retries, &queue, &observed);
        checked.push((queue, findings));
    }
    Ok(checked)
}

fn unseen(error: ManagementError) -> String {
    format!("the management API: {error}")
}

/// Where a queue's dead letters go, as the management API shows it.
fn dead_letter(wiring: &QueueWiring) -> DeadLetter {
    DeadLetter {
        argument: wiring.argument_dead_letter_exchange().map(str::to_owned),
        policy: wiring
            .policy_dead_letter_exchange()
            .map(|named| (wiring.policy.clone(), named.to_owned())),
    }
}

/// The management API of the first broker address, or why there is none.
fn management(settings: &OperatorSettings) -> Result<ManagementApi, String> {
    let uri = settings.amqp.uris().first().cloned().unwrap_or_default();
    ManagementApi::new(&uri, settings.management_url.expose())
        .map_err(|error| error.to_string())?
        .ok_or_else(|| "metrics.management_url is \"none\"".to_owned())
}
