//! What the operator's commands print: a plan, a migration (and its dry
//! run and survey), a deprovision, a requeue, a route, an error without
//! its repeated causes. Pure: text from what the commands hand it.

use crate::broker::{ObjectKind, OldChain, Survey};
use crate::cascade::{BindingTarget, Cascade, TopologyPlan};
use crate::message::DELIVER_AT_HEADER;
use crate::operations::deprovision::Deprovisioned;
use crate::operations::migrate::{DryRun, Migrated};
use crate::operations::unroutable::Requeued;

/// What `delayline migrate` did to the schema.
pub(super) fn describe_migrated(migrated: crate::ledger::Migrated) -> String {
    if migrated.from == migrated.to {
        format!("schema up to date (version {})", migrated.to)
    } else {
        format!(
            "schema migrated from version {} to {}",
            migrated.from, migrated.to
        )
    }
}

/// `n` and its noun, in the singular for one.
pub(super) fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

/// What `deprovision` found and did, an object a line.
pub(super) fn describe_deprovision(done: &Deprovisioned, cascade: &Cascade) -> String {
    let mut text = format!(
        "chain {}.v{} and what it declared:\n",
        cascade.prefix(),
        cascade.version()
    );
    for object in &done.chain {
        text += &describe_object(object);
    }
    if !done.named.is_empty() {
        text += "queues named with --queue:\n";
        for object in &done.named {
            text += &describe_object(object);
        }
    }
    let counted_by = match done.by_ledger {
        true => "by the ledger",
        false => "messages in its levels and release queues",
    };
    text += &format!(
        "it holds {} ({counted_by}) and {} in its other queues\n",
        count(done.tasks, "task on its way", "tasks on their way"),
        count(done.held, "message", "messages")
    );
    let present = done.chain.iter().chain(&done.named).filter(|o| o.exists);
    let present = present.count() as u64;
    if present == 0 {
        return text + "nothing of it is on the broker\n";
    }
    if !done.deleted {
        return text;
    }
    text += &format!("deleted {}", count(present, "object", "objects"));
    if done.by_ledger {
        text += &format!(
            "; {} cancelled in the ledger, which stays (store.data_dir or store.url)",
            count(done.cancelled, "task", "tasks")
        );
    }
    text + "\n"
}

/// One object of a deprovision listing: a queue with its messages and consumers.
pub(super) fn describe_object(object: &crate::broker::Standing) -> String {
    let what = match (object.exists, object.kind) {
        (false, _) => "absent".to_owned(),
        (true, ObjectKind::Queue) => format!(
            "{}, {}",
            count(object.messages, "message", "messages"),
            count(object.consumers, "consumer", "consumers")
        ),
        (true, ObjectKind::Exchange) => String::new(),
    };
    format!("  {:<8} {}  {what}\n", object.kind.as_str(), object.name)
}

pub(super) fn describe_requeue(done: &Requeued, cascade: &Cascade) -> String {
    let mut text = String::new();
    if done.counted_delivered > 0 {
        text += &format!(
            "{} in the ledger counted as delivered again\n",
            count(
                done.counted_delivered,
                "unroutable task",
                "unroutable tasks"
            )
        );
    }
    text += &format!(
        "republished {} to {}; {} still in {} \
         (still unroutable, as the broker counts them now)\n",
        count(
            done.republished,
            "unroutable message",
            "unroutable messages"
        ),
        cascade.business_exchange(),
        count(done.still_unroutable, "is", "are"),
        cascade.unroutable_queue()
    );
    text
}

pub(super) fn describe_dry_run(found: &DryRun, new: &Cascade) -> String {
    let mut text = describe_survey(&found.survey, &found.old, new);
    if let Some(tasks) = found.tasks {
        text += &format!(
            "ledger: {} on their way; the levels' other messages are the service's level \
             probes (or copies of moved and cancelled tasks), which are not moved\n",
            count(tasks, "task", "tasks")
        );
    }
    let Some(beyond) = &found.beyond else {
        text += "no ledger (store.url = \"none\"): which tasks the new chain cannot hold shows \
                 only when they are moved\n";
        return text;
    };
    text += &format!(
        "ledger: {} due later than {} from now, the most {}.v{} holds: they would go to {}\n",
        count(beyond.len() as u64, "waiting task is", "waiting tasks are"),
        humantime::format_duration(std::time::Duration::from_millis(new.max_delay_ms())),
        new.prefix(),
        new.version(),
        new.poison_queue()
    );
    for (id, deliver_at) in beyond.iter().take(20) {
        text += &format!("  {id}  due {deliver_at}\n");
    }
    if beyond.len() > 20 {
        text += &format!(
            "  … and {} more (GET /v1/tasks?cursor=… lists them all)\n",
            beyond.len() - 20
        );
    }
    text += &format!(
        "a message the ledger does not know is judged when it moves: one without \
         {DELIVER_AT_HEADER}, or with a routing key of another chain, is poisoned too\n"
    );
    text
}

pub(super) fn describe_migration(migrated: &Migrated, new: &Cascade) -> String {
    let Migrated { old, report, .. } = migrated;
    let mut text = format!(
        "moved chain {}.v{} ({} levels) into {}.v{}: {} rescheduled, {} already due and \
         delivered, {} unroutable messages moved, {} poisoned (in {}), {} and {} dropped; the \
         old chain is deleted\n",
        old.prefix,
        old.version,
        report.levels,
        new.prefix(),
        new.version(),
        report.rescheduled,
        report.overdue,
        report.unroutable,
        report.poisoned,
        new.poison_queue(),
        count(
            report.superseded,
            "copy of a cancelled or moved task",
            "copies of cancelled or moved tasks"
        ),
        count(report.probes, "level probe", "level probes"),
    );
    for (queue, check) in &report.deleted {
        text += &format!("deleted {queue}: unbound, drained, then {check}\n");
    }
    for (id, reason) in &migrated.failed {
        text += &format!("poisoned task {id}: {reason} (failed in the ledger)\n");
    }
    if migrated.staged_forwarded > 0 {
        text += &format!(
            "{} pending again, to be published by what remains of their delay: the new \
             chain has no release stage to release them from the ledger\n",
            count(migrated.staged_forwarded, "staged task", "staged tasks")
        );
    }
    if report.shards != new.shards() && report.shards > 0 {
        text += &format!(
            "the number of shards changed from {} to {}: each task now goes through the shard \
             its id names among {}\n",
            report.shards,
            new.shards(),
            new.shards()
        );
    }
    if report.levels != new.levels() && report.levels > 0 {
        text += &format!(
            "the number of levels changed from {} to {}: routing keys now have {} digits, \
             so consumers bind with {:?}\n",
            report.levels,
            new.levels(),
            new.levels(),
            new.binding_key("<destination>")
        );
    }
    text
}

/// The error and its causes, each said once: most of our errors already
/// quote their cause, which `{:#}` would print again.
pub(super) fn without_repeats(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

pub(super) fn describe_survey(found: &Survey, old: &OldChain, new: &Cascade) -> String {
    let waiting: u64 = found.waiting.iter().map(|(_, n)| u64::from(*n)).sum();
    let mut text = format!(
        "dry run, nothing moves: chain {}.v{} ({}, {}) holds {} in its levels and release \
         queues, {} unroutable and {} in its poison queue; they would move into {}.v{} ({} of \
         {} ms, {}, delays up to {})\n",
        old.prefix,
        old.version,
        count(found.levels, "level", "levels"),
        count(found.shards, "shard", "shards"),
        count(waiting, "ready message", "ready messages"),
        found.unroutable,
        found.poisoned,
        new.prefix(),
        new.version(),
        count(new.levels(), "level", "levels"),
        new.unit_ms(),
        count(new.shards(), "shard", "shards"),
        humantime::format_duration(std::time::Duration::from_millis(new.max_delay_ms())),
    );
    for (queue, messages) in found.waiting.iter().filter(|(_, n)| *n > 0) {
        text.push_str(&format!("  {queue}: {messages}\n"));
    }
    text
}

pub(super) fn describe_route(
    cascade: &Cascade,
    delay: std::time::Duration,
    destination: &str,
) -> anyhow::Result<String> {
    let route = cascade.route(delay, destination)?;
    let mut text = format!(
        "routing_key     {}\nentry_exchange  {}\ndelay_ms        {}\nhold_ms         {}\nbinding_key     {}\n",
        route.routing_key,
        route.entry_exchange,
        route.delay_ms,
        route.hold_ms,
        cascade.binding_key(destination)
    );
    if cascade.shards() > 1 {
        text += &format!(
            "shards          {}: the entry exchange is shard 0's; a task enters the same level \
             of the shard a hash of its id names\n",
            cascade.shards()
        );
    }
    Ok(text)
}

/// One line per object, in declaration order.
pub fn describe_plan(plan: &TopologyPlan) -> String {
    let mut out = String::new();
    let arguments = |args: &crate::cascade::Arguments| {
        args.iter()
            .map(|(k, v)| format!(" {k}={v}"))
            .collect::<String>()
    };
    for e in &plan.exchanges {
        out += &format!(
            "exchange {} type={} durable{}\n",
            e.name,
            e.kind.as_str(),
            arguments(&e.arguments)
        );
    }
    for q in &plan.queues {
        out += &format!("queue    {} durable{}\n", q.name, arguments(&q.arguments));
    }
    for b in &plan.bindings {
        let target = match &b.target {
            BindingTarget::Queue(q) => format!("queue {q}"),
            BindingTarget::Exchange(e) => format!("exchange {e}"),
        };
        out += &format!("binding  {} -> {target} key={}\n", b.source, b.routing_key);
    }
    out
}
