//! The command line run: the configuration loaded, the command given
//! dispatched to the operator's commands (`operator`), the commands that
//! act through the service's API (`api`), or the service itself.

use std::process::ExitCode;

use clap::Parser;

use super::api::*;
use super::args::*;
use super::describe::*;
use super::operator::*;
use crate::cascade::Cascade;
use crate::config::Settings;
use crate::operations::deprovision::{self};
use crate::service::{self, shutdown_signal};

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let (settings, cascade) = match Settings::load(cli.config.as_deref()) {
        Ok(loaded) => loaded,
        Err(error) => {
            eprintln!("delayline: {error}");
            return ExitCode::from(2);
        }
    };
    crate::telemetry::init(&settings.log);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("delayline: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command, settings, cascade)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("delayline: {}", without_repeats(&error));
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, settings: Settings, cascade: Cascade) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve => {
            let listener = tokio::net::TcpListener::bind(&settings.http.bind)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", settings.http.bind))?;
            service::run(settings, cascade, listener, shutdown_signal()).await?;
        }
        Command::Reload { pid } => reload(pid)?,
        Command::Openapi => {
            outln!(
                "{}",
                serde_json::to_string_pretty(&crate::http::openapi::document())?
            );
        }
        Command::Token {
            action: TokenCommand::Create(new),
        } => create_token(new)?,
        Command::Provision { dry_run, check } => {
            return provision_chain(&settings, &cascade, dry_run, check).await;
        }
        Command::MigrateTopology { from, dry_run } => {
            migrate_topology(&settings, &cascade, &from, dry_run).await?
        }
        Command::Migrate => match crate::ledger::migrate_only(&settings.store).await? {
            Some((target, migrated)) => {
                outln!("ledger {target}: {}", describe_migrated(migrated))
            }
            None => outln!("store.url is \"none\": there is no ledger to migrate"),
        },
        Command::Deprovision {
            yes,
            drop_tasks,
            drop_messages,
            drop_consumers,
            drop_retries,
            queues,
        } => {
            let asked = deprovision::Asked {
                delete: yes,
                drop_tasks,
                drop_messages,
                drop_consumers,
                drop_retries,
            };
            deprovision_chain(&settings, &cascade, &queues, asked).await?
        }
        Command::RequeueUnroutable => requeue(&settings, &cascade).await?,
        Command::Probe { path } => return probe(&settings, &path).await,
        Command::Retries {
            action: RetriesCommand::Check { queues },
            ..
        } => return check_retry_wiring(&settings, &cascade, &queues).await,
        through_the_api @ (Command::Limits { .. }
        | Command::Forecast { .. }
        | Command::Bulk { .. }
        | Command::Schedules { .. }
        | Command::Retries { .. }
        | Command::Parked { .. }
        | Command::Tasks { .. }) => out!("{}", through_api(&settings, through_the_api).await?),
        Command::Route { delay, destination } => {
            out!("{}", describe_route(&cascade, delay, &destination)?)
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A command that acts through the running service's API: what it answered.
async fn through_api(settings: &Settings, command: Command) -> anyhow::Result<String> {
    let remote = |url, token| crate::remote::Remote::new(settings, url, token);
    Ok(match command {
        Command::Limits { action, url, token } => limits(settings, action, url, token).await?,
        Command::Forecast { window, url, token } => {
            remote(url, token)?
                .forecast(&forecast_query(&window))
                .await?
        }
        Command::Bulk { action, url, token } => {
            let (body, key) = bulk_request(action);
            remote(url, token)?.bulk(&body, key.as_deref()).await?
        }
        Command::Schedules { action, url, token } => {
            schedules(settings, action, url, token).await?
        }
        Command::Retries { action, url, token } => retries(&remote(url, token)?, action).await?,
        Command::Parked { action, url, token } => parked(&remote(url, token)?, action).await?,
        Command::Tasks { action, url, token } => tasks(&remote(url, token)?, action).await?,
        _ => anyhow::bail!("not a command of the service's API"),
    })
}
