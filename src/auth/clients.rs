//! The clients and what each may do: read from the configuration and the
//! clients file, tokens matched by their SHA-256 in constant time, rate
//! limits and quotas.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::pattern::{DestinationPattern, PatternError};
use super::settings::{AuthMode, AuthSettings, ClientSettings};

/// What a client may do. `admin` implies every other permission, and
/// reaches every client's tasks instead of only its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Permission {
    /// `POST /v1/tasks`, `POST /v1/tasks/batch` (to its destinations).
    Submit,
    /// `GET /v1/tasks/{id}`, `GET /v1/tasks` (its own tasks).
    Read,
    /// `DELETE /v1/tasks/{id}`, `POST /v1/tasks/cancel` (its own tasks).
    Cancel,
    /// `PATCH /v1/tasks/{id}` (its own tasks).
    Reschedule,
    /// `/v1/schedules` (its own schedules, to its destinations and exchanges).
    Schedule,
    /// `/v1/limits` (release limits whose destinations are all its own).
    Limits,
    /// `GET /metrics` on the API's listener.
    Metrics,
    /// Everything above, every client's tasks, and `GET /v1/topology`.
    Admin,
}

impl Permission {
    pub const ALL: [Permission; 8] = [
        Permission::Submit,
        Permission::Read,
        Permission::Cancel,
        Permission::Reschedule,
        Permission::Schedule,
        Permission::Limits,
        Permission::Metrics,
        Permission::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Submit => "submit",
            Permission::Read => "read",
            Permission::Cancel => "cancel",
            Permission::Reschedule => "reschedule",
            Permission::Schedule => "schedule",
            Permission::Limits => "limits",
            Permission::Metrics => "metrics",
            Permission::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Permission> {
        Permission::ALL.into_iter().find(|p| p.as_str() == text)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("auth: client {client:?}: {reason}")]
    Client { client: String, reason: String },
    #[error("auth: {0}")]
    Pattern(#[from] PatternError),
    #[error("auth: reading the clients file {path}: {reason}")]
    File { path: String, reason: String },
    #[error(
        "auth: http.bind is {bind}, which is not a loopback address, and no client is \
         configured: anyone who can reach it could publish anything. Configure clients \
         (auth.clients_file or [[auth.clients]]; `delayline token create` makes one), or say \
         auth.mode = \"open\" if every peer on that network is trusted"
    )]
    OpenOnNetwork { bind: String },
    #[error("auth: {0}")]
    Invalid(String),
}

/// A token bucket, kept across reloads while its rate and burst stay.
struct Limiter {
    rate_per_second: u32,
    burst: u32,
    bucket: DefaultDirectRateLimiter,
}

/// Why a client's tasks are not taken now.
#[derive(Debug, PartialEq, Eq)]
pub enum Throttled {
    /// Over its rate: retry after this long.
    Rate { retry_after: Duration },
    /// More tasks in one request than its burst could ever allow.
    LargerThanBurst { tasks: u32, burst: u32 },
    /// As many tasks waiting as its quota allows.
    Quota { max_scheduled: u64, scheduled: u64 },
}

pub struct Client {
    pub name: String,
    token_hashes: Vec<[u8; 32]>,
    destinations: Vec<DestinationPattern>,
    /// Exchanges besides the business exchange its tasks may name; `*`: any.
    exchanges: Vec<String>,
    permissions: HashSet<Permission>,
    limiter: Option<Arc<Limiter>>,
    pub max_scheduled: Option<u64>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("name", &self.name)
            .field("permissions", &self.permissions)
            .finish_non_exhaustive()
    }
}

impl Client {
    pub fn has(&self, permission: Permission) -> bool {
        self.permissions.contains(&Permission::Admin) || self.permissions.contains(&permission)
    }

    pub fn may_publish_to(&self, destination: &str) -> bool {
        self.destinations.iter().any(|p| p.matches(destination))
    }

    /// Whether every destination `pattern` matches is one of its own (a
    /// release limit it may see and set).
    pub fn covers(&self, pattern: &DestinationPattern) -> bool {
        self.destinations.iter().any(|p| p.covers(pattern))
    }

    /// Whether its tasks may be delivered to `exchange`, which is not the
    /// business exchange (every client may deliver there).
    pub fn may_deliver_to(&self, exchange: &str) -> bool {
        self.exchanges.iter().any(|e| e == "*" || e == exchange)
    }

    pub fn exchanges(&self) -> &[String] {
        &self.exchanges
    }

    pub fn destination_patterns(&self) -> Vec<&str> {
        self.destinations.iter().map(|p| p.as_str()).collect()
    }

    /// Takes `tasks` from the client's bucket, or says how long to wait.
    pub fn take(&self, tasks: u32) -> Result<(), Throttled> {
        let (Some(limiter), Some(n)) = (&self.limiter, NonZeroU32::new(tasks)) else {
            return Ok(());
        };
        match limiter.bucket.check_n(n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(Throttled::Rate {
                retry_after: not_until.wait_time_from(DefaultClock::default().now()),
            }),
            Err(_) => Err(Throttled::LargerThanBurst {
                tasks,
                burst: limiter.burst,
            }),
        }
    }

    fn build(
        settings: &ClientSettings,
        previous: Option<&Arc<Client>>,
    ) -> Result<Client, AuthError> {
        let invalid = |reason: String| AuthError::Client {
            client: settings.name.clone(),
            reason,
        };
        let name = &settings.name;
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(invalid(
                "a name is 1 to 64 characters of A-Z, a-z, 0-9, '_', '-', '.'".into(),
            ));
        }
        let token_hashes = settings
            .token_sha256
            .as_slice()
            .iter()
            .map(|hex| {
                super::token::parse_hash(hex.trim()).ok_or_else(|| {
                    invalid(
                        "token_sha256 must be 64 hex digits: the SHA-256 of the token, never \
                         the token itself (`delayline token create` prints both)"
                            .into(),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if token_hashes.is_empty() {
            return Err(invalid("token_sha256 is missing".into()));
        }
        let destinations = settings
            .destinations
            .iter()
            .map(|p| DestinationPattern::parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        let permissions = settings
            .permissions
            .iter()
            .map(|p| {
                Permission::parse(p).ok_or_else(|| {
                    let known: Vec<&str> = Permission::ALL.iter().map(|p| p.as_str()).collect();
                    invalid(format!(
                        "unknown permission {p:?} (known: {})",
                        known.join(", ")
                    ))
                })
            })
            .collect::<Result<HashSet<_>, _>>()?;
        if permissions.is_empty() {
            return Err(invalid("it has no permissions".into()));
        }
        if permissions.contains(&Permission::Submit) && destinations.is_empty() {
            return Err(invalid(
                "it may submit but has no destinations (\"#\" allows every destination)".into(),
            ));
        }
        let limiter =
            Limiter::build(settings, previous).map_err(|reason| invalid(reason.into()))?;
        Ok(Client {
            name: name.clone(),
            token_hashes,
            destinations,
            exchanges: settings.exchanges.clone(),
            permissions,
            limiter,
            max_scheduled: settings.max_scheduled,
        })
    }
}

impl Limiter {
    /// The client's token bucket, if it has a rate; the previous one, with
    /// what it has counted, when a reload leaves its rate and burst as they were.
    fn build(
        settings: &ClientSettings,
        previous: Option<&Arc<Client>>,
    ) -> Result<Option<Arc<Limiter>>, &'static str> {
        let (rate, burst) = match (settings.rate_per_second, settings.burst) {
            (None, None) => return Ok(None),
            (None, Some(_)) => return Err("burst needs rate_per_second"),
            (Some(rate), burst) => (rate, burst.unwrap_or(rate)),
        };
        let rate_nz = NonZeroU32::new(rate).ok_or("rate_per_second must be at least 1")?;
        let burst_nz = NonZeroU32::new(burst).ok_or("burst must be at least 1")?;
        let kept = previous
            .and_then(|p| p.limiter.clone())
            .filter(|l| l.rate_per_second == rate && l.burst == burst);
        Ok(Some(kept.unwrap_or_else(|| {
            Arc::new(Limiter {
                rate_per_second: rate,
                burst,
                bucket: RateLimiter::direct(Quota::per_second(rate_nz).allow_burst(burst_nz)),
            })
        })))
    }
}

/// The clients known at one moment; replaced whole on reload.
#[derive(Debug, Default)]
pub struct ClientSet {
    clients: Vec<Arc<Client>>,
}

impl ClientSet {
    pub fn build(
        settings: &[ClientSettings],
        previous: Option<&ClientSet>,
    ) -> Result<ClientSet, AuthError> {
        let mut names = HashSet::new();
        let mut hashes = HashSet::new();
        let mut clients = Vec::with_capacity(settings.len());
        for entry in settings {
            let old = previous.and_then(|p| p.clients.iter().find(|c| c.name == entry.name));
            let client = Client::build(entry, old)?;
            if !names.insert(client.name.clone()) {
                return Err(AuthError::Client {
                    client: client.name,
                    reason: "the name is used twice".into(),
                });
            }
            for hash in &client.token_hashes {
                if !hashes.insert(*hash) {
                    return Err(AuthError::Client {
                        client: client.name.clone(),
                        reason: "its token is also another client's".into(),
                    });
                }
            }
            clients.push(Arc::new(client));
        }
        Ok(ClientSet { clients })
    }

    pub fn len(&self) -> usize {
        self.clients.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Client>> {
        self.clients.iter()
    }

    /// The client `token` belongs to. Every configured hash is compared, in
    /// constant time and without stopping at a match, so the answer's timing
    /// says nothing about which bytes were right.
    pub fn authenticate(&self, token: &str) -> Option<Arc<Client>> {
        let presented = super::token::hash(token);
        let mut found = None;
        for client in &self.clients {
            for hash in &client.token_hashes {
                if bool::from(hash.ct_eq(&presented)) {
                    found = Some(client.clone());
                }
            }
        }
        found
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientsFile {
    #[serde(default)]
    clients: Vec<ClientSettings>,
}

fn read_clients_file(path: &Path) -> Result<Vec<ClientSettings>, AuthError> {
    let text = std::fs::read_to_string(path).map_err(|e| AuthError::File {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    parse_clients_file(&text, path)
}

/// The clients of a clients file's `text` (read from `path`, for errors).
pub fn parse_clients_file(text: &str, path: &Path) -> Result<Vec<ClientSettings>, AuthError> {
    let file: ClientsFile = config::Config::builder()
        .add_source(config::File::from_str(text, config::FileFormat::Toml))
        .build()
        .and_then(|c| c.try_deserialize())
        .map_err(|e| AuthError::File {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
    Ok(file.clients)
}

/// Who is calling: anyone (the API is open), or a known client.
#[derive(Clone, Debug)]
pub enum Caller {
    Anyone,
    Client(Arc<Client>),
}

impl Caller {
    pub fn may(&self, permission: Permission) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Client(client) => client.has(permission),
        }
    }

    /// The client whose tasks alone this caller may see and change; `None`
    /// when it may reach every task (open API, or admin).
    pub fn owner_scope(&self) -> Option<&str> {
        match self {
            Caller::Client(client) if !client.has(Permission::Admin) => Some(&client.name),
            _ => None,
        }
    }

    /// Whether this caller may see and set a release limit over `pattern`:
    /// its destinations cover it (open API and `admin`: every limit).
    pub fn may_limit(&self, pattern: &DestinationPattern) -> bool {
        self.reaches(pattern)
    }

    /// Whether every destination `pattern` matches is this caller's own (a
    /// bulk change or a limit it may make; open API and `admin`: any).
    pub fn reaches(&self, pattern: &DestinationPattern) -> bool {
        match self {
            Caller::Client(client) if !client.has(Permission::Admin) => client.covers(pattern),
            _ => true,
        }
    }

    /// Whether tasks to `destination` count in this caller's forecast: its
    /// own destinations (open API and `admin`: every one).
    pub fn sees_destination(&self, destination: &str) -> bool {
        match self {
            Caller::Client(client) if !client.has(Permission::Admin) => {
                client.may_publish_to(destination)
            }
            _ => true,
        }
    }

    /// The name recorded on the tasks this caller submits.
    pub fn client_name(&self) -> Option<&str> {
        match self {
            Caller::Anyone => None,
            Caller::Client(client) => Some(&client.name),
        }
    }

    #[cfg(test)]
    pub fn may_publish_to(&self, destination: &str) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Client(client) => client.may_publish_to(destination),
        }
    }
}

/// Why a request has no caller.
#[derive(Debug, PartialEq, Eq)]
pub enum Unauthenticated {
    Missing,
    Unknown,
}

impl Unauthenticated {
    /// The `reason` label of the refusal's metric.
    pub fn as_str(&self) -> &'static str {
        match self {
            Unauthenticated::Missing => "missing",
            Unauthenticated::Unknown => "unknown",
        }
    }
}

/// Per-client counts of tasks not yet due, for quotas: refreshed from the
/// ledger (which sees deliveries and other replicas), and moved at once by
/// this replica's own intake so a burst cannot overshoot between refreshes.
#[derive(Debug, Default)]
pub struct Usage {
    scheduled: Mutex<HashMap<String, u64>>,
}

impl Usage {
    /// Counts `tasks` against `client`'s quota if they fit.
    pub fn reserve(&self, client: &Client, tasks: u64) -> Result<(), Throttled> {
        let Some(max_scheduled) = client.max_scheduled else {
            return Ok(());
        };
        let mut scheduled = self
            .scheduled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = scheduled.entry(client.name.clone()).or_default();
        if *count + tasks > max_scheduled {
            return Err(Throttled::Quota {
                max_scheduled,
                scheduled: *count,
            });
        }
        *count += tasks;
        Ok(())
    }

    /// Gives back what a reservation did not use (tasks refused or replayed).
    pub fn give_back(&self, client: &str, tasks: u64) {
        let mut scheduled = self
            .scheduled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = scheduled.get_mut(client) {
            *count = count.saturating_sub(tasks);
        }
    }

    pub fn set(&self, client: &str, count: u64) {
        let mut scheduled = self
            .scheduled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        scheduled.insert(client.to_owned(), count);
    }

    #[cfg(test)]
    pub fn get(&self, client: &str) -> u64 {
        let scheduled = self
            .scheduled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        scheduled.get(client).copied().unwrap_or(0)
    }
}

/// The API's gate: the configured clients (reloadable), and whether a token
/// is required at all.
pub struct Authenticator {
    required: bool,
    /// Quotas need a ledger: checked on every reload, not only at start.
    has_ledger: bool,
    inline: Vec<ClientSettings>,
    file: Option<PathBuf>,
    clients: ArcSwap<ClientSet>,
    pub usage: Usage,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("required", &self.required)
            .field("clients", &self.clients.load().len())
            .finish_non_exhaustive()
    }
}

/// Whether `bind` (an `http.bind` value) only listens on loopback.
pub fn is_loopback_bind(bind: &str) -> bool {
    if let Ok(address) = bind.parse::<SocketAddr>() {
        return address.ip().is_loopback();
    }
    bind.rsplit_once(':')
        .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"))
}

impl Authenticator {
    /// No tokens: every caller may do everything.
    #[cfg(test)]
    pub fn open() -> Authenticator {
        Authenticator {
            required: false,
            has_ledger: false,
            inline: Vec::new(),
            file: None,
            clients: ArcSwap::from_pointee(ClientSet::default()),
            usage: Usage::default(),
        }
    }

    /// The gate `auth` describes for an API bound to `http_bind`; refuses an
    /// open API on a non-loopback address unless `auth.mode = "open"`.
    pub fn from_settings(
        auth: &AuthSettings,
        http_bind: &str,
        has_ledger: bool,
    ) -> Result<Authenticator, AuthError> {
        let file = (!auth.clients_file.is_empty()).then(|| PathBuf::from(&auth.clients_file));
        let configured = file.is_some() || !auth.clients.is_empty();
        let required = match auth.mode {
            AuthMode::Open if configured => {
                return Err(AuthError::Invalid(
                    "auth.mode = \"open\" with clients configured: tokens would be ignored; \
                     remove the clients or the mode"
                        .into(),
                ));
            }
            AuthMode::Open => false,
            AuthMode::Tokens => true,
            AuthMode::Auto if configured => true,
            AuthMode::Auto if is_loopback_bind(http_bind) => false,
            AuthMode::Auto => {
                return Err(AuthError::OpenOnNetwork {
                    bind: http_bind.to_owned(),
                });
            }
        };
        let authenticator = Authenticator {
            required,
            has_ledger,
            inline: auth.clients.clone(),
            file,
            clients: ArcSwap::from_pointee(ClientSet::default()),
            usage: Usage::default(),
        };
        authenticator.reload()?;
        Ok(authenticator)
    }

    pub fn tokens_required(&self) -> bool {
        self.required
    }

    pub fn clients(&self) -> Arc<ClientSet> {
        self.clients.load_full()
    }

    /// The clients file a reload reads, if any.
    pub fn clients_file(&self) -> Option<&std::path::Path> {
        self.file.as_deref()
    }

    /// Reads the inline clients and the clients file again and swaps them in
    /// whole; on any error the clients in use stay as they were. Returns how
    /// many clients are now configured.
    pub fn reload(&self) -> Result<usize, AuthError> {
        let mut settings = self.inline.clone();
        if let Some(file) = &self.file {
            settings.extend(read_clients_file(file)?);
        }
        let current = self.clients.load();
        let next = ClientSet::build(&settings, Some(&current))?;
        if !self.has_ledger && next.iter().any(|c| c.max_scheduled.is_some()) {
            return Err(AuthError::Invalid(
                "max_scheduled needs a ledger (store.url is \"none\"): only the ledger knows \
                 which tasks are still waiting"
                    .into(),
            ));
        }
        let count = next.len();
        self.clients.store(Arc::new(next));
        Ok(count)
    }

    /// The caller a bearer token (or its absence) names.
    pub fn authenticate(&self, bearer: Option<&str>) -> Result<Caller, Unauthenticated> {
        if !self.required {
            return Ok(Caller::Anyone);
        }
        let token = bearer.ok_or(Unauthenticated::Missing)?;
        self.clients
            .load()
            .authenticate(token)
            .map(Caller::Client)
            .ok_or(Unauthenticated::Unknown)
    }
}
