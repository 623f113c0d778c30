//! What the command line takes: every command, its arguments and their
//! help (clap's derive), and the value lists clap checks before a request
//! is made.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::auth::Permission;
use crate::operations::token;
use crate::task::TaskState;

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
    /// Retry policies: `list`, `set`, `remove` them and see their `changes`
    /// through the running service's API (`admin` permission); `check` a
    /// queue's wiring to the retry exchange on the broker.
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
    /// Expired tasks (their deadline passed before they could be
    /// delivered): `expired` lists them (`read` permission), `replay`
    /// takes one in again as a new task due now (`submit` permission),
    /// through the running service's API.
    Tasks {
        #[command(subcommand)]
        action: TasksCommand,
        /// The service's base URL, instead of http.bind.
        #[arg(long, global = true)]
        url: Option<String>,
        /// A client token.
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
    /// Every policy in force: its queues, backoff and attempts, where it
    /// comes from and who changed it last (see `GET /v1/retries`).
    List,
    /// Set a policy while the service runs (new, or changed whole: a field
    /// not given takes its default), kept in the ledger and in force on
    /// every replica within a second. A policy of the configuration file is
    /// changed there.
    Set(RetryPolicyArgs),
    /// Remove a policy set at run time: its queues' dead letters are
    /// refused until another policy covers them.
    Remove {
        /// The policy's name.
        name: String,
    },
    /// Who changed which policy at run time, and when, newest first.
    Changes {
        /// How many (1 to 500).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
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

/// A retry policy, as `[[retry]]` writes it.
#[derive(Debug, clap::Args)]
pub struct RetryPolicyArgs {
    /// The policy's name (1 to 128 bytes of A-Z, a-z, 0-9, '_', '-', '.').
    pub name: String,
    /// A queue it covers (repeatable; at least one).
    #[arg(long = "queue", value_name = "NAME", required = true)]
    pub queues: Vec<String>,
    /// The wait before the first retry (`1s`).
    #[arg(long)]
    pub initial: Option<String>,
    /// Each retry waits this many times the one before.
    #[arg(long)]
    pub multiplier: Option<f64>,
    /// The longest wait, before jitter (`5m`).
    #[arg(long)]
    pub max_delay: Option<String>,
    /// A wait is lengthened by up to this fraction of itself (0 to 1).
    #[arg(long)]
    pub jitter: Option<f64>,
    /// Deliveries in all, the first included.
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// How long a message may keep failing, from its first failure (`1h`).
    #[arg(long)]
    pub give_up_after: Option<String>,
    /// How late after its time a retry may still be delivered (`5m`).
    #[arg(long)]
    pub max_lateness: Option<String>,
    /// A queue a parked message is also published to.
    #[arg(long)]
    pub park_to: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum TasksCommand {
    /// The expired tasks, in due order, with their deadline and why each
    /// expired.
    Expired {
        /// Only this destination's.
        #[arg(long)]
        destination: Option<String>,
        /// How many (1 to 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Take an expired task in again, once, as a new task due now (its id
    /// is the task's with `~replay`); a second replay answers the first.
    Replay {
        /// The expired task's id.
        id: String,
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
    Replay {
        #[command(flatten)]
        target: ParkedTarget,
        #[command(flatten)]
        group: ParkedGroupArgs,
        /// One message by id only: back after this long instead of now
        /// (`10m`, `1h30m`).
        #[arg(long, requires = "id")]
        after: Option<String>,
    },
    /// Discard one parked message (by id), or every one of a queue.
    Discard {
        #[command(flatten)]
        target: ParkedTarget,
        #[command(flatten)]
        group: ParkedGroupArgs,
    },
    /// The parked messages by group: queue, reason, and the hour their
    /// first attempt failed in, with counts.
    Groups,
}

/// With `--queue`: only one group of the queue's (as `parked groups`
/// shows them).
#[derive(Debug, clap::Args)]
pub struct ParkedGroupArgs {
    /// Only those whose last attempt ended so (`rejected`, `expired`, …).
    #[arg(long, requires = "queue")]
    pub reason: Option<String>,
    /// Only those whose first attempt failed in this hour (RFC 3339, any
    /// time in the hour).
    #[arg(long, requires = "queue")]
    pub first_failed_hour: Option<String>,
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
    pub(super) append_to: Option<PathBuf>,
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
