//! The operator's commands, each coordinating ledger and broker through
//! `crate::operations`: provision (and check, and dry run), deprovision,
//! migrate-topology, requeue-unroutable, the retries' wiring check, token
//! create, reload, probe.

use std::process::ExitCode;

use super::args::*;
use super::describe::*;
use crate::broker::OldChain;
use crate::cascade::Cascade;
use crate::config::Settings;
use crate::ingress::plan_with;
use crate::operations::deprovision::{self, Deprovisioned};
use crate::operations::migrate::{self};
use crate::operations::unroutable::{self};
use crate::operations::{provision, token};

/// `delayline provision [--dry-run | --check]`.
pub(super) async fn provision_chain(
    settings: &Settings,
    cascade: &Cascade,
    dry_run: bool,
    check: bool,
) -> anyhow::Result<ExitCode> {
    let plan = plan_with(
        cascade,
        &settings.ingresses(cascade)?,
        settings.retries(cascade)?.as_ref(),
    );
    if dry_run {
        out!("{}", describe_plan(&plan));
        return Ok(ExitCode::SUCCESS);
    }
    if check {
        let report = provision::check(&settings.operator(cascade), cascade, &plan).await?;
        out!("{report}");
        return Ok(match report.problems() {
            0 => ExitCode::SUCCESS,
            _ => ExitCode::FAILURE,
        });
    }
    let report = provision::provision(&settings.amqp, &plan).await?;
    outln!(
        "provisioned {} exchanges, {} queues and {} bindings ({} levels of {} ms, {} queues)",
        report.exchanges,
        report.queues,
        report.bindings,
        cascade.levels(),
        cascade.unit_ms(),
        cascade.queue_type().as_str()
    );
    Ok(ExitCode::SUCCESS)
}

/// `delayline deprovision [--yes [--drop-tasks]] [--queue …]`.
pub(super) async fn deprovision_chain(
    settings: &Settings,
    cascade: &Cascade,
    queues: &[String],
    asked: deprovision::Asked,
) -> anyhow::Result<()> {
    let retries = settings.retries(cascade)?;
    let plan = plan_with(cascade, &settings.ingresses(cascade)?, retries.as_ref());
    let operator = settings.operator(cascade);
    let retries = match retries {
        Some(retries) => {
            Some(crate::operations::wiring::in_force(&operator, cascade, retries).await?)
        }
        None => None,
    };
    let now_ms = crate::clock::now_ms();
    let done = deprovision::deprovision(
        &operator,
        cascade,
        &plan,
        retries.as_ref(),
        queues,
        asked,
        now_ms,
    )
    .await?;
    out!("{}", describe_deprovision(&done, cascade));
    let ran = command_as_run();
    if let Some(refused) = &done.refused {
        anyhow::bail!("nothing deleted: {}", refusal_hint(refused, &ran));
    }
    if !done.deleted && done.chain.iter().chain(&done.named).any(|o| o.exists) {
        out!("{}", deletion_hint(&done, &ran));
    }
    Ok(())
}

/// The command line this process was started with, as an operator would
/// type it again (`delayline` for the program, each word quoted for a shell).
pub(super) fn command_as_run() -> Vec<String> {
    let words = std::env::args_os().skip(1);
    let words = words.map(|word| word.to_string_lossy().into_owned());
    std::iter::once("delayline".to_owned())
        .chain(words)
        .collect()
}

/// `ran` with `flags` added (those it does not have yet), quoted for a shell.
pub(super) fn with_flags(ran: &[String], flags: &[&str]) -> String {
    let mut words: Vec<&str> = ran.iter().map(String::as_str).collect();
    words.extend(flags.iter().filter(|flag| !ran.iter().any(|w| w == *flag)));
    shlex::try_join(words.iter().copied()).unwrap_or_else(|_| words.join(" "))
}

/// Why a deletion was refused, and the command that accepts the loss.
pub(super) fn refusal_hint(refused: &deprovision::Blocker, ran: &[String]) -> String {
    match refused.flag() {
        Some(flag) => format!(
            "{refused}.\nTo delete anyway, accepting that loss: {}",
            with_flags(ran, &["--yes", flag])
        ),
        None => format!("{refused}"),
    }
}

/// After a look: the command that deletes what is present, and what each
/// flag it needs would lose.
pub(super) fn deletion_hint(done: &Deprovisioned, ran: &[String]) -> String {
    let mut text = String::from("nothing deleted.\n");
    for blocker in &done.blockers {
        text += &format!("  {blocker}\n");
    }
    if done.blockers.iter().any(|b| b.flag().is_none()) {
        return text;
    }
    let mut flags = vec!["--yes"];
    flags.extend(done.flags_needed());
    let present = done.chain.iter().chain(&done.named).filter(|o| o.exists);
    text += &format!(
        "`{}` deletes the {} above\n",
        with_flags(ran, &flags),
        count(present.count() as u64, "object present", "objects present")
    );
    text
}

/// `delayline retries check [--queue …]`: each queue's wiring, a finding
/// a line; exit 1 when a link is broken.
pub(super) async fn check_retry_wiring(
    settings: &Settings,
    cascade: &Cascade,
    queues: &[String],
) -> anyhow::Result<ExitCode> {
    let Some(retries) = settings.retries(cascade)? else {
        anyhow::bail!(
            "retries need the release stage (a ledger, and cascade.release_stage not false): \
             without it no retry exchange is declared (give the service's --config)"
        );
    };
    let operator = settings.operator(cascade);
    let retries = crate::operations::wiring::in_force(&operator, cascade, retries).await?;
    let checked = crate::operations::wiring::check(&operator, &retries, queues).await?;
    let mut broken = false;
    for (queue, findings) in &checked {
        outln!("{queue}:");
        for finding in findings {
            broken |= finding.is_problem();
            outln!("  {finding}");
        }
    }
    Ok(if broken {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `delayline requeue-unroutable`.
pub(super) async fn requeue(settings: &Settings, cascade: &Cascade) -> anyhow::Result<()> {
    let operator = settings.operator(cascade);
    let done = unroutable::requeue_unroutable(&operator, cascade, crate::clock::now_ms()).await?;
    out!("{}", describe_requeue(&done, cascade));
    Ok(())
}

/// `delayline migrate-topology --from … [--dry-run]`.
pub(super) async fn migrate_topology(
    settings: &Settings,
    cascade: &Cascade,
    from: &str,
    dry_run: bool,
) -> anyhow::Result<()> {
    let old = old_chain(from, cascade)?;
    let operator = settings.operator(cascade);
    if dry_run {
        let found = migrate::dry_run(&operator, cascade, old).await?;
        out!("{}", describe_dry_run(&found, cascade));
        return Ok(());
    }
    let migrated = migrate::migrate(&operator, cascade, old).await?;
    if let Some(why) = &migrated.management_unavailable {
        eprintln!("delayline: {why}; counting ready messages only");
    }
    out!("{}", describe_migration(&migrated, cascade));
    Ok(())
}

/// The chain `--from` names: a version number (same prefix as `new`), or a
/// settings file.
pub(super) fn old_chain(from: &str, new: &Cascade) -> anyhow::Result<OldChain> {
    if let Ok(version) = from.parse::<u32>() {
        return Ok(OldChain::version_of(new, version));
    }
    let (_, old) = Settings::load(Some(std::path::Path::new(from)))
        .map_err(|error| anyhow::anyhow!("--from {from}: {error}"))?;
    Ok(OldChain::from_settings(&old))
}

/// Prints a new token, and its clients-file entry unless it was appended.
pub(super) fn create_token(new: NewToken) -> anyhow::Result<()> {
    let append_to = new.append_to.clone();
    let created = token::create_token(new.into(), append_to.as_deref())?;
    match append_to {
        None => out!("{}\n\n{}", created.token, created.entry),
        Some(_) => outln!("{}", created.token),
    }
    Ok(())
}

/// Sends SIGHUP to a running `delayline serve`, for images that have no `kill`.
pub(super) fn reload(pid: Option<i32>) -> anyhow::Result<()> {
    let pid = crate::operations::reload::reload(pid)?;
    outln!("sent SIGHUP to delayline (process {pid}): it reads its clients and certificate again");
    Ok(())
}

/// GETs `path` of the running service; success on a 200.
pub(super) async fn probe(settings: &Settings, path: &str) -> anyhow::Result<ExitCode> {
    let (status, body) = if settings.http.tls.enabled() {
        crate::probe::probe_https(&settings.http.bind, path).await?
    } else {
        crate::probe::probe(&settings.http.bind, path).await?
    };
    outln!("{status} {body}");
    Ok(if status == 200 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
