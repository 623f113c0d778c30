//! The command line: `serve`, `provision [--dry-run | --check]`,
//! `migrate-topology --from`, `requeue-unroutable`, `migrate`, `probe`, `route`,
//! `token create`, `deprovision`, `retries check`, and the commands that act
//! through a running service's API (`schedules`, `limits`, `forecast`,
//! `bulk`, `retries list`, `parked`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::auth::Permission;
use crate::broker::{ObjectKind, OldChain, Survey};
use crate::cascade::{BindingTarget, Cascade, TopologyPlan};
use crate::config::Settings;
use crate::ingress::plan_with;
use crate::message::DELIVER_AT_HEADER;
use crate::operations::deprovision::{self, Deprovisioned};
use crate::operations::migrate::{self, DryRun, Migrated};
use crate::operations::unroutable::{self, Requeued};
use crate::operations::{provision, token};
use crate::service::{self, shutdown_signal};
use crate::task::TaskState;

/// Writes to standard output. A reader that has gone (`| head`) ends the
/// command quietly, as other command-line tools end, where `print!` would
/// panic: nothing is left to say to anyone.
fn write_out(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        if error.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("delayline: cannot write to standard output: {error}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
}

macro_rules! out {
    ($($arg:tt)*) => { write_out(format_args!($($arg)*)) };
}

macro_rules! outln {
    ($($arg:tt)*) => { write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

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
    /// Delete what delayline declared for the configured chain (its prefix
    /// and version: levels, release and poison queues, the business and
    /// unroutable exchanges and queues, ingresses), and the queues named
    /// with --queue. Without --yes it only says what would go.
    Deprovision {
        /// Delete; without it nothing is touched.
        #[arg(long)]
        yes: bool,
        /// Delete even while the chain holds tasks, or messages in its other
        /// queues (the ledger's tasks are cancelled first).
        #[arg(long)]
        drop_tasks: bool,
        /// Delete a named queue even while it holds messages (they are lost).
        #[arg(long)]
        drop_messages: bool,
        /// Delete a named queue even while consumers read it.
        #[arg(long)]
        drop_consumers: bool,
        /// Delete the retry exchange and intake even while [[retry]]
        /// policies are configured: until they are declared again, RabbitMQ
        /// drops what the covered queues reject.
        #[arg(long)]
        drop_retries: bool,
        /// A queue of your own to delete too (a consumer's queue bound to
        /// the business exchange); repeatable. No other queue of yours is
        /// touched, and a named one that holds messages or has consumers
        /// only with --drop-messages or --drop-consumers.
        #[arg(long = "queue", value_name = "NAME")]
        queues: Vec<String>,
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
        /// The path to GET (`/healthz` asks only whether the process answers).
        #[arg(long, default_value = "/readyz")]
        path: String,
    },
    /// Make a running delayline read its clients file and certificate again
    /// (SIGHUP), for images that have no `kill`. Only a `delayline serve`
    /// is signalled: by default the one running here (in its container, or
    /// on this host); refused when there is none or there are several.
    /// Each replica also reads them again by itself when they change.
    Reload {
        /// The process to signal (refused unless it is `delayline serve`).
        #[arg(long)]
        pid: Option<i32>,
    },
    /// Print the API's OpenAPI 3.1 description (as served at /openapi.json).
    Openapi,
    /// API clients' tokens.
    Token {
        #[command(subcommand)]
        action: TokenCommand,
    },
    /// Recurring schedules, through the running service's API (on
    /// http.bind, or --url; a token with the `schedule` permission in
    /// DELAYLINE_TOKEN when clients are configured).
    Schedules {
        #[command(subcommand)]
        action: ScheduleCommand,
        /// The service's base URL, instead of http.bind.
        #[arg(long, global = true)]
        url: Option<String>,
        /// A client token (`schedule` permission; `admin` lists everyone's).
        #[arg(long, global = true, env = "DELAYLINE_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Release limits (pace, pause, or hold destinations while a queue is
    /// deep), through the running service's API (on http.bind, or --url; a
    /// token with the `limits` permission in DELAYLINE_TOKEN when clients
    /// are configured).
    Limits {
        #[command(subcommand)]
        action: LimitCommand,
        /// The service's base URL, instead of http.bind.
        #[arg(long, global = true)]
        url: Option<String>,
        /// A client token (`limits` permission).
        #[arg(long, global = true, env = "DELAYLINE_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// How many tasks fall due in each bucket of a window, through the
    /// running service's API (`read` permission; see `GET /v1/forecast`).
    Forecast {
        #[command(flatten)]
        window: ForecastArgs,
        /// The service's base URL, instead of http.bind.
        #[arg(long)]
        url: Option<String>,
        /// A client token (`read` permission).
        #[arg(long, env = "DELAYLINE_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Cancel or move every task a filter matches, through the running
    /// service's API (`cancel` or `reschedule` permission), and wait until
    /// the operation is done.
    Bulk {
        #[command(subcommand)]
        action: BulkCommand,
        /// The service's base URL, instead of http.bind.
        #[arg(long, global = true)]
        url: Option<String>,
        /// A client token.
        #[arg(long, global = true, env = "DELAYLINE_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Retry policies: `list` them through the running service's API
    /// (`admin` permission); `check` a queue's wiring to the retry exchange
    /// on the broker.
    Retries {
        #[command(subcommand)]
        action: RetriesCommand,
        /// The service's base URL, instead of http.bind.
        #[arg(long, global = true)]
        url: Option<String>,
        /// A client token (`admin` permission).
        #[arg(long, global = true, env = "DELAYLINE_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Parked messages (what a retry policy gave up on), through the
    /// running service's API (`admin` permission).
    Parked {
        #[command(subcommand)]
        action: ParkedCommand,
        /// The service's base URL, instead of http.bind.
        #[arg(long, global = true)]
        url: Option<String>,
        /// A client token (`admin` permission).
        #[arg(long, global = true, env = "DELAYLINE_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Show how a task would be routed.
    Route {
        /// Delay such as 90s, 1h30m or 250ms.
        #[arg(long, value_parser = humantime::parse_duration)]
        delay: std::time::Duration,
        /// The task's destination, the routing key it is delivered with (`billing.invoice`).
        #[arg(long)]
        destination: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Every schedule: its state, timing, next occurrence and counts.
    List,
    /// Pause a schedule: no occurrence is made while paused.
    Pause {
        /// The schedule's id (as `schedules list` shows it).
        id: String,
    },
    /// Resume a paused schedule from its first occurrence after now.
    Resume {
        /// The schedule's id (as `schedules list` shows it).
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum RetriesCommand {
    /// Every policy: its queues, backoff and attempts (see `GET /v1/retries`).
    List,
    /// Whether each queue is wired to the retry exchange, as the broker
    /// shows it: the exchange exists and is delayline's, the intake exists,
    /// a policy covers the queue, and its argument or policy names the
    /// exchange (the last two need the broker's management API). Exits 1
    /// when a link is broken. Acts on the broker, not through the service.
    Check {
        /// A queue to check (repeatable); default every queue of every policy.
        #[arg(long = "queue", value_name = "NAME")]
        queues: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ParkedCommand {
    /// The count per queue, and the newest parked messages.
    List {
        /// Only this queue's messages.
        #[arg(long)]
        queue: Option<String>,
        /// How many messages (1 to 500).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Send one parked message (by id), or every one of a queue, back to
    /// its queue now, on its first attempt again.
    Replay(ParkedTarget),
    /// Discard one parked message (by id), or every one of a queue.
    Discard(ParkedTarget),
}

/// One parked message, or a queue's all.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct ParkedTarget {
    /// The parked message's id (as `parked list` shows it).
    pub id: Option<String>,
    /// Every parked message of this queue.
    #[arg(long)]
    pub queue: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum LimitCommand {
    /// Every limit: what it holds now, why, and its release rate.
    List,
    /// Set a limit (new, or changed in place).
    Set(LimitArgs),
    /// Pause a limit: every task it matches waits when due.
    Pause {
        /// The limit's name.
        name: String,
    },
    /// Resume a limit: what waits is released, at its rate if it has one.
    Resume {
        /// The limit's name.
        name: String,
    },
    /// Delete a limit: what it held is released.
    Delete {
        /// The limit's name.
        name: String,
    },
}

/// What `limits set` is told (see `PUT /v1/limits/{name}`).
#[derive(Debug, clap::Args)]
pub struct LimitArgs {
    /// The limit's name (A-Z, a-z, 0-9, `_`, `-`, `.`).
    pub name: String,
    /// A topic pattern over destinations, as tokens' (`billing.#`).
    #[arg(long)]
    pub destinations: String,
    /// Tasks a second over every replica (fractional allowed).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Tasks that may go at once.
    #[arg(long, requires = "rate")]
    pub burst: Option<u64>,
    /// Hold every matching task until resumed.
    #[arg(long)]
    pub paused: bool,
    /// Hold every matching task until then (RFC 3339).
    #[arg(long)]
    pub paused_until: Option<String>,
    /// Keep this queue at no more than --max-depth ready messages.
    #[arg(long, requires = "max_depth")]
    pub queue: Option<String>,
    /// The most ready messages --queue may hold before matching tasks wait.
    #[arg(long, requires = "queue")]
    pub max_depth: Option<u64>,
}

/// What `forecast` asks (see `GET /v1/forecast`).
#[derive(Debug, clap::Args)]
pub struct ForecastArgs {
    /// Start (RFC 3339); default now.
    #[arg(long)]
    pub from: Option<String>,
    /// End (RFC 3339); default 60 buckets on.
    #[arg(long)]
    pub to: Option<String>,
    /// A bucket's width in whole minutes (1m, 15m, 1h); default 1m.
    #[arg(long)]
    pub bucket: Option<String>,
    /// Only destinations this topic pattern matches.
    #[arg(long)]
    pub destination: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum BulkCommand {
    /// Cancel every task the filter matches.
    Cancel(BulkFilterArgs),
    /// Move every task the filter matches, by --shift or to --deliver-at.
    Move {
        #[command(flatten)]
        filter: BulkFilterArgs,
        /// How far to move each task (10m, -30s).
        #[arg(long, allow_hyphen_values = true, conflicts_with = "deliver_at")]
        shift: Option<String>,
        /// The one new due time (RFC 3339).
        #[arg(long, required_unless_present = "shift")]
        deliver_at: Option<String>,
    },
}

/// Which tasks a bulk change reaches (see `POST /v1/tasks/bulk`).
#[derive(Debug, clap::Args)]
pub struct BulkFilterArgs {
    /// A topic pattern over destinations (`#` for all of the token's).
    #[arg(long)]
    pub destination: String,
    /// Only tasks due at or after this time (RFC 3339).
    #[arg(long)]
    pub due_after: Option<String>,
    /// Only tasks due before this time (RFC 3339).
    #[arg(long)]
    pub due_before: Option<String>,
    /// Only tasks in this state.
    #[arg(long, value_parser = task_states())]
    pub state: Option<String>,
    /// An Idempotency-Key: the same command again is the same operation.
    #[arg(long)]
    pub key: Option<String>,
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
    /// An exchange its tasks may name besides the business exchange
    /// (`*`: any); repeatable.
    #[arg(long = "exchange", value_name = "NAME")]
    exchanges: Vec<String>,
    /// What the client may do (comma-separated or repeated; the security
    /// page says what each allows).
    #[arg(
        long = "permission",
        value_delimiter = ',',
        required = true,
        value_parser = permissions()
    )]
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

/// The task states, as the API spells them: clap lists them in the help
/// and refuses another once, before any request is made.
fn task_states() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(TaskState::ALL.map(TaskState::as_str))
}

/// The permissions a client can be given, from the code's own list.
fn permissions() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(Permission::ALL.map(Permission::as_str))
}

impl From<NewToken> for token::NewClient {
    fn from(new: NewToken) -> Self {
        token::NewClient {
            name: new.name,
            destinations: new.destinations,
            exchanges: new.exchanges,
            permissions: new.permissions,
            rate_per_second: new.rate_per_second,
            burst: new.burst,
            max_scheduled: new.max_scheduled,
        }
    }
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
        | Command::Parked { .. }) => out!("{}", through_api(&settings, through_the_api).await?),
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
        Command::Retries { url, token, .. } => remote(url, token)?.list_retries().await?,
        Command::Parked { action, url, token } => parked(&remote(url, token)?, action).await?,
        _ => anyhow::bail!("not a command of the service's API"),
    })
}

/// `delayline provision [--dry-run | --check]`.
async fn provision_chain(
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
async fn deprovision_chain(
    settings: &Settings,
    cascade: &Cascade,
    queues: &[String],
    asked: deprovision::Asked,
) -> anyhow::Result<()> {
    let retries = settings.retries(cascade)?;
    let plan = plan_with(cascade, &settings.ingresses(cascade)?, retries.as_ref());
    let operator = settings.operator(cascade);
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
fn command_as_run() -> Vec<String> {
    let words = std::env::args_os().skip(1);
    let words = words.map(|word| word.to_string_lossy().into_owned());
    std::iter::once("delayline".to_owned())
        .chain(words)
        .collect()
}

/// `ran` with `flags` added (those it does not have yet), quoted for a shell.
fn with_flags(ran: &[String], flags: &[&str]) -> String {
    let mut words: Vec<&str> = ran.iter().map(String::as_str).collect();
    words.extend(flags.iter().filter(|flag| !ran.iter().any(|w| w == *flag)));
    shlex::try_join(words.iter().copied()).unwrap_or_else(|_| words.join(" "))
}

/// Why a deletion was refused, and the command that accepts the loss.
fn refusal_hint(refused: &deprovision::Blocker, ran: &[String]) -> String {
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
fn deletion_hint(done: &Deprovisioned, ran: &[String]) -> String {
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
async fn check_retry_wiring(
    settings: &Settings,
    cascade: &Cascade,
    queues: &[String],
) -> anyhow::Result<ExitCode> {
    let Some(retries) = settings.retries(cascade)? else {
        anyhow::bail!(
            "no [[retry]] policy is configured: the retry exchange is declared only with one \
             (give the service's --config)"
        );
    };
    let operator = settings.operator(cascade);
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

/// `delayline parked …`, through the running service's API.
async fn parked(remote: &crate::remote::Remote, action: ParkedCommand) -> anyhow::Result<String> {
    Ok(match action {
        ParkedCommand::List { queue, limit } => remote.list_parked(queue.as_deref(), limit).await?,
        ParkedCommand::Replay(target) => {
            let (id, queue) = (target.id.as_deref(), target.queue.as_deref());
            remote.act_on_parked("replay", id, queue).await?
        }
        ParkedCommand::Discard(target) => {
            let (id, queue) = (target.id.as_deref(), target.queue.as_deref());
            remote.act_on_parked("discard", id, queue).await?
        }
    })
}

/// `delayline requeue-unroutable`.
async fn requeue(settings: &Settings, cascade: &Cascade) -> anyhow::Result<()> {
    let operator = settings.operator(cascade);
    let done = unroutable::requeue_unroutable(&operator, cascade, crate::clock::now_ms()).await?;
    out!("{}", describe_requeue(&done, cascade));
    Ok(())
}

/// `delayline migrate-topology --from … [--dry-run]`.
async fn migrate_topology(
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
fn old_chain(from: &str, new: &Cascade) -> anyhow::Result<OldChain> {
    if let Ok(version) = from.parse::<u32>() {
        return Ok(OldChain::version_of(new, version));
    }
    let (_, old) = Settings::load(Some(std::path::Path::new(from)))
        .map_err(|error| anyhow::anyhow!("--from {from}: {error}"))?;
    Ok(OldChain::from_settings(&old))
}

/// Prints a new token, and its clients-file entry unless it was appended.
fn create_token(new: NewToken) -> anyhow::Result<()> {
    let append_to = new.append_to.clone();
    let created = token::create_token(new.into(), append_to.as_deref())?;
    match append_to {
        None => out!("{}\n\n{}", created.token, created.entry),
        Some(_) => outln!("{}", created.token),
    }
    Ok(())
}

/// Sends SIGHUP to a running `delayline serve`, for images that have no `kill`.
fn reload(pid: Option<i32>) -> anyhow::Result<()> {
    let pid = crate::operations::reload::reload(pid)?;
    outln!("sent SIGHUP to delayline (process {pid}): it reads its clients and certificate again");
    Ok(())
}

/// `delayline schedules …`, through the running service's API.
async fn schedules(
    settings: &Settings,
    action: ScheduleCommand,
    url: Option<String>,
    token: Option<String>,
) -> anyhow::Result<String> {
    let remote = crate::remote::Remote::new(settings, url, token)?;
    Ok(match action {
        ScheduleCommand::List => remote.list_schedules().await?,
        ScheduleCommand::Pause { id } => remote.pause_schedule(&id, true).await?,
        ScheduleCommand::Resume { id } => remote.pause_schedule(&id, false).await?,
    })
}

/// `forecast`'s arguments as a query string.
fn forecast_query(window: &ForecastArgs) -> String {
    let fields = [
        ("from", &window.from),
        ("to", &window.to),
        ("bucket", &window.bucket),
        ("destination", &window.destination),
    ];
    let pairs: Vec<(&str, &String)> = fields
        .iter()
        .filter_map(|(name, value)| value.as_ref().map(|v| (*name, v)))
        .collect();
    reqwest::Url::parse_with_params("http://forecast/", pairs)
        .ok()
        .and_then(|url| url.query().map(str::to_owned))
        .unwrap_or_default()
}

/// `bulk …` as the body of `POST /v1/tasks/bulk`, and its key.
fn bulk_request(action: BulkCommand) -> (serde_json::Value, Option<String>) {
    let (filter, action, shift, deliver_at) = match action {
        BulkCommand::Cancel(filter) => (filter, "cancel", None, None),
        BulkCommand::Move {
            filter,
            shift,
            deliver_at,
        } => (filter, "move", shift, deliver_at),
    };
    let body = serde_json::json!({
        "filter": {
            "destination": filter.destination,
            "due_after": filter.due_after,
            "due_before": filter.due_before,
            "state": filter.state,
        },
        "action": action,
        "shift": shift,
        "deliver_at": deliver_at,
    });
    (without_nulls(body), filter.key)
}

/// `value` with its null fields left out, at every depth.
fn without_nulls(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(fields) => serde_json::Value::Object(
            fields
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

/// `delayline limits …`, through the running service's API.
async fn limits(
    settings: &Settings,
    action: LimitCommand,
    url: Option<String>,
    token: Option<String>,
) -> anyhow::Result<String> {
    let remote = crate::remote::Remote::new(settings, url, token)?;
    Ok(match action {
        LimitCommand::List => remote.list_limits().await?,
        LimitCommand::Set(limit) => {
            let body = serde_json::json!({
                "destinations": limit.destinations,
                "rate_per_sec": limit.rate,
                "burst": limit.burst,
                "paused": limit.paused,
                "paused_until": limit.paused_until,
                "max_queue_depth": limit.queue.map(|queue| serde_json::json!({
                    "queue": queue,
                    "messages": limit.max_depth.unwrap_or(0),
                })),
            });
            // Fields not given are left out rather than sent as null.
            let body = without_nulls(body);
            remote.set_limit(&limit.name, &body).await?
        }
        LimitCommand::Pause { name } => remote.pause_limit(&name, true).await?,
        LimitCommand::Resume { name } => remote.pause_limit(&name, false).await?,
        LimitCommand::Delete { name } => remote.delete_limit(&name).await?,
    })
}

/// GETs `path` of the running service; success on a 200.
async fn probe(settings: &Settings, path: &str) -> anyhow::Result<ExitCode> {
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

/// What `delayline migrate` did to the schema.
fn describe_migrated(migrated: crate::ledger::Migrated) -> String {
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
fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

/// What `deprovision` found and did, an object a line.
fn describe_deprovision(done: &Deprovisioned, cascade: &Cascade) -> String {
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
fn describe_object(object: &crate::broker::Standing) -> String {
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

fn describe_requeue(done: &Requeued, cascade: &Cascade) -> String {
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

fn describe_dry_run(found: &DryRun, new: &Cascade) -> String {
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

fn describe_migration(migrated: &Migrated, new: &Cascade) -> String {
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

fn describe_survey(found: &Survey, old: &OldChain, new: &Cascade) -> String {
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

fn describe_route(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command says what it does and every argument what it takes,
    /// in `--help`: an empty line there is a question left to the reader.
    #[test]
    fn every_command_and_argument_has_help() {
        use clap::CommandFactory;
        fn walk(command: &clap::Command, path: &str, silent: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.get_help().is_none() && !matches!(id, "help" | "version") {
                    silent.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands() {
                let path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    silent.push(path.clone());
                }
                walk(sub, &path, silent);
            }
        }
        let mut silent = Vec::new();
        walk(&Cli::command(), "delayline", &mut silent);
        assert!(silent.is_empty(), "without help: {silent:#?}");
    }

    #[test]
    fn states_and_permissions_are_checked_from_the_codes_own_lists() {
        use clap::CommandFactory;
        let parse = |args: &[&str]| Cli::command().try_get_matches_from(args);
        let bulk = [
            "delayline",
            "bulk",
            "cancel",
            "--destination",
            "#",
            "--state",
        ];
        for state in TaskState::ALL {
            assert!(parse(&[&bulk[..], &[state.as_str()]].concat()).is_ok());
        }
        let error = parse(&[&bulk[..], &["done"]].concat())
            .unwrap_err()
            .to_string();
        assert_eq!(error.matches("possible values").count(), 1, "{error}");
        let create = [
            "delayline",
            "token",
            "create",
            "--name",
            "n",
            "--permission",
        ];
        for permission in Permission::ALL {
            assert!(parse(&[&create[..], &[permission.as_str()]].concat()).is_ok());
        }
        assert!(parse(&[&create[..], &["everything"]].concat()).is_err());
    }

    #[test]
    fn from_is_a_version_or_a_settings_file() {
        let new = Settings::default().cascade().unwrap();
        let by_version = old_chain("3", &new).unwrap();
        assert_eq!(by_version, OldChain::version_of(&new, 3));
        assert_eq!(by_version.levels, None);

        let example = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/delayline.example.toml");
        let by_file = old_chain(example, &new).unwrap();
        assert_eq!((by_file.version, by_file.levels), (1, Some(29)));

        let missing = old_chain("no-such.toml", &new).unwrap_err().to_string();
        assert!(missing.contains("--from no-such.toml"), "{missing}");
    }
}
