//! `provision --check`: the broker compared with the plan, changing nothing.
//!
//! Each object is first looked up passively; only one that exists is
//! redeclared with the plan's settings, which the broker either accepts
//! without change (equal settings) or refuses with PRECONDITION_FAILED, which
//! [`super::diagnose`] expands into every difference. A missing object is
//! reported, never created.

use std::fmt;

use lapin::Connection;

use super::inspect::{QueueState, exchange_exists, queue_state};
use super::provision::{declare_exchange, declare_queue};
use super::{BrokerError, TopologyConflict, open_channel};
use crate::cascade::{
    Cascade, ExchangeSpec, MAX_LEVELS, QueueSpec, TopologyPlan, level_queue_name,
    unroutable_queue_name,
};

/// "1 message", "2 messages".
fn counted(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Versions above the configured one that are looked for, in case of a rollback.
const VERSIONS_ABOVE: u32 = 2;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Matches,
    Missing,
    Differs(TopologyConflict),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedObject {
    pub kind: &'static str,
    pub name: String,
    pub status: Status,
    /// For a queue that exists.
    pub messages: Option<u32>,
}

/// Level queues of another version of the chain, still on the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherChain {
    pub version: u32,
    pub levels: Vec<QueueState>,
    /// Messages in that version's unroutable queue.
    pub unroutable: u32,
}

impl OtherChain {
    pub fn messages(&self) -> u64 {
        self.levels.iter().map(|q| u64::from(q.messages)).sum()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    pub version: u32,
    pub objects: Vec<CheckedObject>,
    pub other_chains: Vec<OtherChain>,
    /// The release queue of a shard beyond the configured ones, when it
    /// exists: the chain had more shards (see [`BrokerError::MoreShards`]).
    pub extra_shard: Option<String>,
    /// The node leading each queue, from the management API; `Err` says
    /// why it is not known (AMQP cannot tell).
    pub leaders: Result<std::collections::BTreeMap<String, String>, String>,
}

impl CheckReport {
    /// Objects that are missing or differ: what `provision` would create or refuse.
    pub fn problems(&self) -> usize {
        self.objects
            .iter()
            .filter(|o| o.status != Status::Matches)
            .count()
            + usize::from(self.extra_shard.is_some())
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for object in &self.objects {
            let messages = object
                .messages
                .map(|n| format!(" ({})", counted(u64::from(n), "message")))
                .unwrap_or_default();
            match &object.status {
                Status::Matches => {
                    let leader = match &self.leaders {
                        Ok(leaders) => leaders
                            .get(&object.name)
                            .map(|node| format!(", led by {node}"))
                            .unwrap_or_default(),
                        Err(_) => String::new(),
                    };
                    writeln!(
                        f,
                        "ok       {:<8} {}{messages}{leader}",
                        object.kind, object.name
                    )?
                }
                Status::Missing => writeln!(f, "missing  {:<8} {}", object.kind, object.name)?,
                Status::Differs(conflict) => {
                    writeln!(f, "differs  {:<8} {}{messages}", object.kind, object.name)?;
                    for d in &conflict.differences {
                        writeln!(
                            f,
                            "           {}: the broker has {}, the plan wants {}",
                            d.field, d.existing, d.wanted
                        )?;
                    }
                }
            }
        }
        if let Some(queue) = &self.extra_shard {
            writeln!(
                f,
                "extra    shard    {queue}: the chain has more shards than configured, and \
                 provisioning refuses it; to change the shard count, raise cascade.version and \
                 run `delayline migrate-topology --from {}`",
                self.version
            )?;
        }
        for chain in &self.other_chains {
            writeln!(
                f,
                "other    chain    v{}: {} holding {}, and {}; move them with \
                 `delayline migrate-topology --from {}`",
                chain.version,
                counted(chain.levels.len() as u64, "level queue"),
                counted(chain.messages(), "message"),
                counted(u64::from(chain.unroutable), "unroutable message"),
                chain.version
            )?;
        }
        if let Err(why) = &self.leaders {
            writeln!(
                f,
                "note     where each queue's leader runs is not known: {why} (the management \
                 API tells it, AMQP does not)"
            )?;
        }
        writeln!(
            f,
            "note     bindings are not compared: AMQP cannot list them, and \
             `delayline provision` (or `serve`) declares any that are missing"
        )?;
        match self.problems() {
            0 => writeln!(f, "chain v{} matches the plan", self.version),
            n => writeln!(
                f,
                "chain v{}: {n} objects missing or different",
                self.version
            ),
        }
    }
}

async fn check_exchange(
    connection: &Connection,
    exchange: &ExchangeSpec,
) -> Result<CheckedObject, BrokerError> {
    let checked = |status| CheckedObject {
        kind: "exchange",
        name: exchange.name.clone(),
        status,
        messages: None,
    };
    if !exchange_exists(connection, &exchange.name).await? {
        return Ok(checked(Status::Missing));
    }
    let channel = open_channel(connection, || {
        format!("opening a channel to check exchange {:?}", exchange.name)
    })
    .await?;
    match declare_exchange(connection, &channel, exchange).await? {
        None => {
            let _ = channel.close(200, "checked".into()).await;
            Ok(checked(Status::Matches))
        }
        Some(conflict) => Ok(checked(Status::Differs(conflict))),
    }
}

async fn check_queue(
    connection: &Connection,
    queue: &QueueSpec,
) -> Result<CheckedObject, BrokerError> {
    let Some(state) = queue_state(connection, &queue.name).await? else {
        return Ok(CheckedObject {
            kind: "queue",
            name: queue.name.clone(),
            status: Status::Missing,
            messages: None,
        });
    };
    let mut channel = open_channel(connection, || {
        format!("opening a channel to check queue {:?}", queue.name)
    })
    .await?;
    let status = match declare_queue(connection, &mut channel, queue).await? {
        None => {
            let _ = channel.close(200, "checked".into()).await;
            Status::Matches
        }
        Some(conflict) => Status::Differs(conflict),
    };
    Ok(CheckedObject {
        kind: "queue",
        name: queue.name.clone(),
        status,
        messages: Some(state.messages),
    })
}

/// The level queues of version `version` of the chain named `prefix`, from
/// level 0 up to the first one missing; empty when there is no such chain.
pub async fn discover_chain(
    connection: &Connection,
    prefix: &str,
    version: u32,
) -> Result<Vec<QueueState>, BrokerError> {
    let mut levels = Vec::new();
    for level in 0..MAX_LEVELS {
        match queue_state(connection, &level_queue_name(prefix, version, 0, level)).await? {
            Some(state) => levels.push(state),
            None => break,
        }
    }
    Ok(levels)
}

/// Compares every object of `plan` (`cascade`'s, with the ingresses') with
/// the broker, and looks for other versions of the chain.
pub async fn check(
    connection: &Connection,
    cascade: &Cascade,
    plan: &TopologyPlan,
) -> Result<CheckReport, BrokerError> {
    let mut objects = Vec::new();
    for exchange in &plan.exchanges {
        objects.push(check_exchange(connection, exchange).await?);
    }
    for queue in &plan.queues {
        objects.push(check_queue(connection, queue).await?);
    }
    let mut other_chains = Vec::new();
    for version in (1..=cascade.version() + VERSIONS_ABOVE).filter(|&v| v != cascade.version()) {
        let levels = discover_chain(connection, cascade.prefix(), version).await?;
        let unroutable_queue = unroutable_queue_name(cascade.business_exchange(), version);
        let unroutable = queue_state(connection, &unroutable_queue).await?;
        if !levels.is_empty() || unroutable.is_some_and(|q| q.messages > 0) {
            other_chains.push(OtherChain {
                version,
                levels,
                unroutable: unroutable.map_or(0, |q| q.messages),
            });
        }
    }
    let extra_shard = match &plan.beyond_last_shard {
        Some(queue) => queue_state(connection, queue).await?.map(|_| queue.clone()),
        None => None,
    };
    Ok(CheckReport {
        version: cascade.version(),
        objects,
        other_chains,
        extra_shard,
        leaders: Err("not asked".to_owned()),
    })
}
