//! The command line: `serve`, `provision [--dry-run | --check]`,
//! `migrate-topology --from`, `requeue-unroutable`, `migrate`, `probe`, `route`,
//! `token create`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lapin::Connection;

use crate::broker::{
    ManagementApi, OldChain, Survey, check, connect_any, migrate_topology, provision, queue_state,
    requeue_unroutable, survey,
};
use crate::cascade::{BindingTarget, Cascade, TopologyPlan};
use crate::config::{AmqpSettings, Settings};
use crate::service::{self, shutdown_signal};

#[derive(Debug, Parser)]
#[command(name = "delayline", version, about = "Delayed delivery for RabbitMQ")]
pub struct Cli {
    /// Configuration file (TOML); DELAYLINE__SECTION__KEY variables override it.
    #[arg(long, global = true, env = "DELAYLINE_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API. It answers at once; connecting to RabbitMQ and
    /// provisioning the topology go on in the background, and tasks wait in
    /// the ledger as pending meanwhile (503 without one).
    Serve,
    /// Declare the cascade's exchanges, queues and bindings on the broker.
    Provision {
        /// Print the plan without touching the broker.
        #[arg(long, conflicts_with = "check")]
        dry_run: bool,
        /// Compare the broker with the plan, print every difference and
        /// change nothing; exits with 1 when something is missing or differs.
        #[arg(long)]
        check: bool,
    },
    /// Move every waiting message from an older chain into the configured
    /// one (by what remains of its delay), then delete the old chain.
    /// Safe to run again after a crash.
    MigrateTopology {
        /// The old chain: its version (same prefix), or its settings file.
        #[arg(long, value_name = "VERSION|FILE")]
        from: String,
        /// Say what would move and what would be poisoned, and why; take nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Send the unroutable queue's messages back to the business exchange,
    /// once their destinations are bound; still unroutable ones land there again.
    #[command(alias = "requeue-parked")]
    RequeueUnroutable,
    /// Create or update the ledger's schema (also done at start-up), then exit.
    Migrate,
    /// GET the running service's /readyz (or --path) on http.bind; exits 0
    /// on a 200. The health check of images that have no curl.
    Probe {
        #[arg(long, default_value = "/readyz")]
        path: String,
    },
    /// Make a running delayline read its clients file and certificate again
    /// (SIGHUP), for images that have no `kill`: in a container its process
    /// is PID 1, the default.
    Reload {
        #[arg(long, default_value_t = 1)]
        pid: i32,
    },
    /// Print the API's OpenAPI 3.1 description (as served at /openapi.json).
    Openapi,
    /// API clients' tokens.
    Token {
        #[command(subcommand)]
        action: TokenCommand,
    },
    /// Show how a task would be routed.
    Route {
        /// Delay such as 90s, 1h30m or 250ms.
        #[arg(long, value_parser = humantime::parse_duration)]
        delay: std::time::Duration,
        #[arg(long)]
        destination: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a new client token: prints the token (once: delayline keeps only
    /// its SHA-256) and the client's entry for the clients file.
    Create(NewToken),
}

/// What `token create` is told about the client.
#[derive(Debug, clap::Args)]
pub struct NewToken {
    /// The client's name, recorded on each of its tasks.
    #[arg(long)]
    name: String,
    /// An AMQP topic pattern it may publish to (`billing.#`); repeatable.
    #[arg(long = "destination", value_name = "PATTERN")]
    destinations: Vec<String>,
    /// submit, read, cancel, reschedule, metrics, admin (comma-separated or repeated).
    #[arg(long = "permission", value_delimiter = ',', required = true)]
    permissions: Vec<String>,
    /// Tasks per second (token bucket).
    #[arg(long)]
    rate_per_second: Option<u32>,
    /// Tasks at once above the rate.
    #[arg(long)]
    burst: Option<u32>,
    /// Tasks waiting at once.
    #[arg(long)]
    max_scheduled: Option<u64>,
    /// Append the entry to this clients file instead of printing it;
    /// only the token is printed then.
    #[arg(long, value_name = "FILE")]
    append_to: Option<PathBuf>,
}

/// `token create`: a new token, and the entry that names it by its hash.
/// The entry is checked as the service would check it before anything is
/// printed.
fn create_token(new: NewToken) -> anyhow::Result<()> {
    use std::io::Write;

    let token = crate::auth::token::generate();
    let entry = crate::config::ClientSettings {
        name: new.name,
        token_sha256: crate::config::TokenHashes::One(crate::auth::token::hash_hex(&token)),
        destinations: new.destinations,
        permissions: new.permissions,
        rate_per_second: new.rate_per_second,
        burst: new.burst,
        max_scheduled: new.max_scheduled,
    };
    crate::auth::ClientSet::build(std::slice::from_ref(&entry), None)?;
    let text = client_entry_toml(&entry);
    match new.append_to.as_deref() {
        None => print!("{token}\n\n{text}"),
        Some(path) => {
            // The file must still read, with every client, once the entry is
            // in: a service would keep its old clients on a reload otherwise.
            let existing = match std::fs::read_to_string(path) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
            };
            let clients = crate::auth::parse_clients_file(&format!("{existing}\n{text}"), path)
                .map_err(|e| {
                    anyhow::anyhow!(
                        "{e}; nothing was appended (a `clients = []` line cannot be followed by \
                         [[clients]] entries: remove it)"
                    )
                })?;
            crate::auth::ClientSet::build(&clients, None)
                .map_err(|e| anyhow::anyhow!("{e}; nothing was appended"))?;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
            write!(file, "\n{text}")
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
            println!("{token}");
        }
    }
    Ok(())
}

/// One `[[clients]]` table, as the clients file holds it.
fn client_entry_toml(entry: &crate::config::ClientSettings) -> String {
    let list = |items: &[String]| {
        let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
        format!("[{}]", quoted.join(", "))
    };
    let mut text = format!(
        "[[clients]]\nname = {:?}\ntoken_sha256 = {:?}\ndestinations = {}\npermissions = {}\n",
        entry.name,
        entry
            .token_sha256
            .as_slice()
            .first()
            .cloned()
            .unwrap_or_default(),
        list(&entry.destinations),
        list(&entry.permissions),
    );
    if let Some(rate) = entry.rate_per_second {
        text.push_str(&format!("rate_per_second = {rate}\n"));
    }
    if let Some(burst) = entry.burst {
        text.push_str(&format!("burst = {burst}\n"));
    }
    if let Some(max) = entry.max_scheduled {
        text.push_str(&format!("max_scheduled = {max}\n"));
    }
    text
}

/// The chain `--from` names: a version number, or a settings file.
fn old_chain(from: &str, new: &Cascade) -> anyhow::Result<OldChain> {
    if let Ok(version) = from.parse::<u32>() {
        return Ok(OldChain::version_of(new, version));
    }
    let (_, old) =
        Settings::load(Some(Path::new(from))).map_err(|e| anyhow::anyhow!("--from {from}: {e}"))?;
    Ok(OldChain::from_settings(&old))
}

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
        Command::Reload { pid } => {
            let process = rustix::process::Pid::from_raw(pid)
                .ok_or_else(|| anyhow::anyhow!("--pid {pid} is not a process id"))?;
            rustix::process::kill_process(process, rustix::process::Signal::HUP)
                .map_err(|error| anyhow::anyhow!("sending SIGHUP to process {pid}: {error}"))?;
            println!("sent SIGHUP to process {pid}: it reads its clients and certificate again");
        }
        Command::Openapi => {
            println!(
                "{}",
                serde_json::to_string_pretty(&crate::http::openapi::document())?
            );
        }
        Command::Token {
            action: TokenCommand::Create(new),
        } => create_token(new)?,
        Command::Provision { dry_run: true, .. } => print!("{}", describe_plan(&cascade.plan())),
        Command::Provision { check: true, .. } => {
            let amqp = &settings.amqp;
            let report = on_broker(amqp, "delayline provision --check", async |connection| {
                Ok(check(connection, &cascade).await?)
            })
            .await?;
            print!("{report}");
            if report.problems() > 0 {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::MigrateTopology {
            from,
            dry_run: true,
        } => {
            let old = old_chain(&from, &cascade)?;
            let found = on_broker(
                &settings.amqp,
                "delayline migrate-topology --dry-run",
                async |connection| Ok(survey(connection, &old).await?),
            )
            .await?;
            print!("{}", describe_survey(&found, &old, &cascade));
            let Some(ledger) = open_ledger(&settings).await? else {
                println!(
                    "no ledger (store.url = \"none\"): which tasks the new chain cannot hold shows \
                     only when they are moved"
                );
                return Ok(ExitCode::SUCCESS);
            };
            let beyond = beyond_the_chain(&ledger, &cascade).await;
            ledger.close().await;
            let beyond = beyond?;
            println!(
                "ledger: {} waiting tasks are due later than {} from now, the most {}.v{} holds: \
                 they would go to {}",
                beyond.len(),
                humantime::format_duration(std::time::Duration::from_millis(
                    cascade.max_delay_ms()
                )),
                cascade.prefix(),
                cascade.version(),
                cascade.poison_queue()
            );
            for (id, deliver_at) in beyond.iter().take(20) {
                println!("  {id}  due {deliver_at}");
            }
            if beyond.len() > 20 {
                println!(
                    "  … and {} more (GET /v1/tasks?cursor=… lists them all)",
                    beyond.len() - 20
                );
            }
            println!(
                "a message the ledger does not know is judged when it moves: one without \
                 x-deliver-at-ms, or with a routing key of another chain, is poisoned too"
            );
        }
        Command::MigrateTopology {
            from,
            dry_run: false,
        } => {
            let mut old = old_chain(&from, &cascade)?;
            // Copies of cancelled tasks and older revisions of moved ones
            // stay behind: the new chain may have no release stage to drop them.
            if let Some(ledger) = open_ledger(&settings).await? {
                let superseded = ledger.superseded().await;
                ledger.close().await;
                old.superseded = crate::broker::Superseded(superseded?);
            }
            let amqp = &settings.amqp;
            // It alone counts what a quorum queue holds; without it, ready messages are counted.
            let management = amqp.uris().first().and_then(|uri| {
                ManagementApi::new(uri, settings.metrics.management_url.expose())
                    .map_err(|error| eprintln!("delayline: {error}; counting ready messages only"))
                    .ok()
                    .flatten()
            });
            let report = on_broker(amqp, "delayline migrate-topology", async |connection| {
                Ok(migrate_topology(connection, &old, &cascade, management.as_ref()).await?)
            })
            .await?;
            println!(
                "moved chain {}.v{} ({} levels) into {}.v{}: {} rescheduled, {} already due and \
                 delivered, {} unroutable messages moved, {} poisoned (in {}), {} copies of \
                 cancelled or moved tasks dropped; the old chain is deleted",
                old.prefix,
                old.version,
                report.levels,
                cascade.prefix(),
                cascade.version(),
                report.rescheduled,
                report.overdue,
                report.unroutable,
                report.poisoned,
                cascade.poison_queue(),
                report.superseded,
            );
            for (queue, check) in &report.deleted {
                println!("deleted {queue}: unbound, drained, then {check}");
            }
            if !report.poisoned_tasks.is_empty()
                && let Some(ledger) = open_ledger(&settings).await?
            {
                for (id, reason) in &report.poisoned_tasks {
                    let why = format!(
                        "moved to {} by migrate-topology, not delivered: {reason}",
                        cascade.poison_queue()
                    );
                    ledger.mark_failed(id.clone(), None, why).await?;
                    println!("poisoned task {id}: {reason} (failed in the ledger)");
                }
                ledger.close().await;
            }
            if report.levels != cascade.levels() && report.levels > 0 {
                println!(
                    "the number of levels changed from {} to {}: routing keys now have {} digits, \
                     so consumers bind with {:?}",
                    report.levels,
                    cascade.levels(),
                    cascade.levels(),
                    cascade.binding_key("<destination>")
                );
            }
        }
        Command::Provision { .. } => {
            let amqp = &settings.amqp;
            let report = on_broker(amqp, "delayline provision", async |connection| {
                Ok(provision(connection, &cascade.plan()).await?)
            })
            .await?;
            println!(
                "provisioned {} exchanges, {} queues and {} bindings ({} levels of {} ms, {} queues)",
                report.exchanges,
                report.queues,
                report.bindings,
                cascade.levels(),
                cascade.unit_ms(),
                cascade.queue_type().as_str()
            );
        }
        Command::Migrate => match crate::ledger::migrate_only(&settings.store).await? {
            Some(target) => println!("ledger {target}: schema up to date"),
            None => println!("store.url is \"none\": there is no ledger to migrate"),
        },
        Command::RequeueUnroutable => {
            // Counted delivered before they go: a copy unroutable again then
            // marks its task `unroutable` once more, after this commit.
            if cascade.release_stage()
                && let Some(ledger) = open_ledger(&settings).await?
            {
                let counted = ledger.requeue_unroutable().await?;
                ledger.close().await;
                if counted > 0 {
                    println!("{counted} unroutable tasks in the ledger count as delivered again");
                }
            }
            let amqp = &settings.amqp;
            let (requeued, left) =
                on_broker(amqp, "delayline requeue-unroutable", async |connection| {
                    let requeued = requeue_unroutable(connection, &cascade).await?;
                    let left = queue_state(connection, &cascade.unroutable_queue()).await?;
                    Ok((requeued, left.map_or(0, |q| q.messages)))
                })
                .await?;
            println!(
                "republished {requeued} unroutable messages to {}; {left} are still in {} \
                 (still unroutable, as the broker counts them now)",
                cascade.business_exchange(),
                cascade.unroutable_queue()
            );
        }
        Command::Probe { path } => {
            let (status, body) = if settings.http.tls.enabled() {
                crate::probe::probe_https(&settings.http.bind, &path).await?
            } else {
                crate::probe::probe(&settings.http.bind, &path).await?
            };
            println!("{status} {body}");
            if status != 200 {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Route { delay, destination } => {
            print!("{}", describe_route(&cascade, delay, &destination)?)
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The error and its causes, each said once: most of our errors already
/// quote their cause, which `{:#}` would print again.
fn without_repeats(error: &anyhow::Error) -> String {
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

/// The ledger of `settings`, for a command; None without one.
async fn open_ledger(settings: &Settings) -> anyhow::Result<Option<crate::ledger::Ledger>> {
    // A command's commits are not observed.
    let commit_group_size = prometheus_client::metrics::histogram::Histogram::new([1.0]);
    let release_stage = settings.cascade()?.release_stage();
    Ok(crate::ledger::open(&settings.store, release_stage, commit_group_size).await?)
}

/// Not yet delivered tasks due later than `cascade` can hold from now: (id, due).
async fn beyond_the_chain(
    ledger: &crate::ledger::Ledger,
    cascade: &Cascade,
) -> anyhow::Result<Vec<(String, String)>> {
    let now_ms = crate::task::epoch_ms(std::time::SystemTime::now());
    let mut filter = crate::ledger::TaskFilter {
        after: Some(crate::ledger::Cursor {
            deliver_at_ms: now_ms + cascade.max_delay_ms(),
            id: String::new(),
        }),
        limit: 1000,
        ..crate::ledger::TaskFilter::default()
    };
    let mut beyond = Vec::new();
    loop {
        let page = ledger.list(&filter).await?;
        let Some(last) = page.last() else {
            return Ok(beyond);
        };
        filter.after = Some(crate::ledger::Cursor {
            deliver_at_ms: last.deliver_at_ms,
            id: last.id.clone(),
        });
        beyond.extend(
            page.iter()
                .filter(|r| r.state != crate::task::TaskState::Failed)
                .map(|r| (r.id.clone(), crate::task::format_epoch_ms(r.deliver_at_ms))),
        );
    }
}

fn describe_survey(found: &Survey, old: &OldChain, new: &Cascade) -> String {
    let waiting: u64 = found.waiting.iter().map(|(_, n)| u64::from(*n)).sum();
    let mut text = format!(
        "dry run, nothing moves: chain {}.v{} ({} levels) holds {waiting} ready messages, \
         {} unroutable and {} in its poison queue; they would move into {}.v{} ({} levels of {} ms, \
         delays up to {})\n",
        old.prefix,
        old.version,
        found.levels,
        found.unroutable,
        found.poisoned,
        new.prefix(),
        new.version(),
        new.levels(),
        new.unit_ms(),
        humantime::format_duration(std::time::Duration::from_millis(new.max_delay_ms())),
    );
    for (queue, messages) in found.waiting.iter().filter(|(_, n)| *n > 0) {
        text.push_str(&format!("  {queue}: {messages}\n"));
    }
    text
}

/// Runs `work` on a connection of its own, closed whatever the outcome.
async fn on_broker<T>(
    amqp: &AmqpSettings,
    name: &str,
    work: impl AsyncFnOnce(&Connection) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let timeout = std::time::Duration::from_millis(amqp.connect_timeout_ms);
    let tls = crate::broker::BrokerTls::from_settings(&amqp.tls)?;
    let connection = connect_any(&amqp.uris(), name, timeout, &tls).await?;
    let outcome = work(&connection).await;
    let _ = connection.close(200, "done".into()).await;
    outcome
}

fn describe_route(
    cascade: &Cascade,
    delay: std::time::Duration,
    destination: &str,
) -> anyhow::Result<String> {
    let route = cascade.route(delay, destination)?;
    Ok(format!(
        "routing_key     {}\nentry_exchange  {}\ndelay_ms        {}\nbinding_key     {}\n",
        route.routing_key,
        route.entry_exchange,
        route.delay_ms,
        cascade.binding_key(destination)
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_appended_only_where_the_file_still_reads_with_every_client() {
        let dir = std::env::temp_dir().join(format!("dl-token-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let new = |name: &str, file: &std::path::Path| NewToken {
            name: name.to_owned(),
            destinations: vec!["#".to_owned()],
            permissions: vec!["submit".to_owned()],
            rate_per_second: None,
            burst: None,
            max_scheduled: None,
            append_to: Some(file.to_owned()),
        };
        let fresh = dir.join("fresh.toml");
        create_token(new("a", &fresh)).unwrap();
        create_token(new("b", &fresh)).unwrap();
        let read =
            crate::auth::parse_clients_file(&std::fs::read_to_string(&fresh).unwrap(), &fresh);
        assert_eq!(read.unwrap().len(), 2);
        // The same name twice would not load: refused, nothing written.
        let before = std::fs::read_to_string(&fresh).unwrap();
        assert!(create_token(new("a", &fresh)).is_err());
        assert_eq!(std::fs::read_to_string(&fresh).unwrap(), before);
        // An inline empty list cannot take [[clients]] entries after it.
        let inline = dir.join("inline.toml");
        std::fs::write(&inline, "clients = []\n").unwrap();
        let error = create_token(new("a", &inline)).unwrap_err().to_string();
        assert!(error.contains("clients = []"), "{error}");
        assert_eq!(std::fs::read_to_string(&inline).unwrap(), "clients = []\n");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn from_is_a_version_or_a_settings_file() {
        let new = Settings::default().cascade().unwrap();
        let by_version = old_chain("3", &new).unwrap();
        assert_eq!(by_version, OldChain::version_of(&new, 3));
        assert_eq!(by_version.levels, None);

        let example = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/delayline.example.toml");
        let by_file = old_chain(example, &new).unwrap();
        assert_eq!((by_file.version, by_file.levels), (1, Some(32)));

        let missing = old_chain("no-such.toml", &new).unwrap_err().to_string();
        assert!(missing.contains("--from no-such.toml"), "{missing}");
    }
}
