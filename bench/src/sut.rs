//! The service under test: a real `delayline` process with a topology of its own.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use delayline::broker::{connect, teardown};
use delayline::cascade::{Cascade, CascadeSettings, QueueType};
use delayline::ingress::{Ingress, IngressSettings, Retries, RetrySettings, plan_with};
use lapin::options::QueueDeleteOptions;
use tokio::process::{Child, Command};

/// Which ledger the service under test keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Store {
    /// `store.url = "none"`: stateless.
    None,
    /// The embedded default, in a directory of its own.
    Sqlite,
    /// A schema of its own in this database.
    Postgres(String),
}

impl Store {
    pub fn name(&self) -> &'static str {
        match self {
            Store::None => "none",
            Store::Sqlite => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    pub fn parse(name: &str, postgres_url: &str) -> anyhow::Result<Store> {
        match name {
            "none" => Ok(Store::None),
            "sqlite" => Ok(Store::Sqlite),
            "postgres" => Ok(Store::Postgres(postgres_url.to_owned())),
            other => bail!("unknown store {other:?}: use none, sqlite or postgres"),
        }
    }
}

pub struct ServiceUnderTest {
    child: Child,
    /// How it was started: relaunched the same way on the same chain and
    /// ledger by [`ServiceUnderTest::relaunch`].
    launch: Vec<(String, String)>,
    pub base: String,
    pub cascade: Cascade,
    amqp_uri: String,
    extra_queues: Vec<String>,
    store: Store,
    /// The SQLite directory or the PostgreSQL schema, deleted by `stop`.
    store_name: String,
    /// The token of the one client, when the API requires tokens.
    pub token: Option<String>,
    /// With the release stage: an AMQP ingress delivering to the business
    /// exchange, for plugin-style producers.
    pub ingress: Option<Ingress>,
    /// With the release stage: one retry policy, over [`RETRIED_QUEUE`]
    /// under the chain's prefix (the retries phase's).
    pub retries: Option<Retries>,
}

/// The retries phase's queue (under the chain's prefix), and its policy's
/// first wait and jitter.
pub const RETRIED_QUEUE: &str = "retried";
/// The parked phase's queue (under the chain's prefix): its policy parks a
/// message after its first attempt.
pub const PARKED_QUEUE: &str = "parked";
pub const RETRY_INITIAL_S: u64 = 5;
pub const RETRY_JITTER: f64 = 0.2;

fn psql(url: &str, sql: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("psql")
        .args([url, "-q", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .status()
        .context("running psql")?;
    if !status.success() {
        bail!("psql {sql} failed");
    }
    Ok(())
}

fn service_binary() -> anyhow::Result<PathBuf> {
    let path = std::env::current_exe()?.with_file_name("delayline");
    if !path.exists() {
        bail!(
            "{} not found: build it next to the benchmark with `cargo build --release --workspace --bins`",
            path.display()
        );
    }
    Ok(path)
}

/// What a service under test is started with, beside the broker's address
/// and its publishing channels.
#[derive(Clone, Debug)]
pub struct Setup {
    pub levels: u32,
    pub unit_ms: u64,
    pub queue_type: QueueType,
    pub store: Store,
    pub release_stage: bool,
    /// `cascade.precision_ms`: unset follows the product's default.
    pub precision_ms: Option<u64>,
    /// Tokens on: one client that may submit anywhere.
    pub auth: bool,
    /// `cascade.shards`.
    pub shards: u32,
}

impl Setup {
    /// The product's default cascade with `store`, the release stage on
    /// exactly when there is a ledger (as by default), no tokens.
    pub fn default_with(store: Store) -> Setup {
        let default = CascadeSettings::default();
        Setup {
            levels: default.levels,
            unit_ms: default.unit_ms,
            queue_type: default.queue_type,
            release_stage: store != Store::None,
            precision_ms: default.precision_ms,
            store,
            auth: false,
            shards: 1,
        }
    }
}

impl ServiceUnderTest {
    pub async fn spawn(amqp_uri: &str, channels: usize, setup: &Setup) -> anyhow::Result<Self> {
        let Setup {
            levels,
            unit_ms,
            queue_type,
            ref store,
            release_stage,
            precision_ms,
            auth,
            shards,
        } = *setup;
        if release_stage && *store == Store::None {
            bail!("the release stage needs a ledger");
        }
        let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
        let cascade = CascadeSettings {
            levels,
            unit_ms,
            queue_type,
            prefix: format!("bench-{id}"),
            version: 1,
            business_exchange: Some(format!("bench-{id}.business")),
            release_stage: Some(release_stage),
            delivery_key: delayline::cascade::DeliveryKey::Destination,
            precision_ms,
            shards,
            ..CascadeSettings::default()
        }
        .validate()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let store_name = format!("bench_{id}");
        let data_dir = std::env::temp_dir().join(&store_name);
        let store_url = match store {
            Store::None => "none".to_owned(),
            Store::Sqlite => String::new(),
            Store::Postgres(url) => {
                psql(url, &format!("CREATE SCHEMA {store_name}"))?;
                format!("{url}?options[search_path]={store_name}")
            }
        };
        // With `auth`, one client may submit anywhere: what is measured is
        // the price of checking its token and destination on every task.
        let token = auth.then(delayline::auth::token::generate);
        let mut command = Command::new(service_binary()?);
        let ingress = match release_stage {
            true => {
                let settings = IngressSettings {
                    exchange: format!("{}.ingress", cascade.prefix()),
                    deliver_to: None,
                    kind: "direct".to_owned(),
                    routing_keys: Vec::new(),
                };
                std::fs::create_dir_all(&data_dir)?;
                let config = data_dir.join("ingress.toml");
                let retried = format!("{}.{RETRIED_QUEUE}", cascade.prefix());
                let parked = format!("{}.{PARKED_QUEUE}", cascade.prefix());
                std::fs::write(
                    &config,
                    format!(
                        "[[ingress]]\nexchange = {:?}\n\n[[retry]]\nname = \"bench\"\n\
                         queues = [{retried:?}]\ninitial = \"{RETRY_INITIAL_S}s\"\n\
                         jitter = {RETRY_JITTER}\nmax_attempts = 3\n\n\
                         [[retry]]\nname = \"bench-parked\"\nqueues = [{parked:?}]\n\
                         max_attempts = 1\n",
                        settings.exchange
                    ),
                )?;
                command.env("DELAYLINE_CONFIG", config);
                Some(settings.validate(&cascade)?)
            }
            false => None,
        };
        let retries = match release_stage {
            true => Retries::new(
                &[RetrySettings {
                    name: "bench".into(),
                    queues: vec![format!("{}.{RETRIED_QUEUE}", cascade.prefix())],
                    initial: format!("{RETRY_INITIAL_S}s"),
                    multiplier: 2.0,
                    max_delay: "5m".into(),
                    jitter: RETRY_JITTER,
                    max_attempts: 3,
                    park_to: None,
                    max_lateness: None,
                    give_up_after: None,
                }],
                &cascade,
            )
            .map(Some)?,
            false => None,
        };
        if let Some(token) = &token {
            std::fs::create_dir_all(&data_dir)?;
            let clients = data_dir.join("clients.toml");
            std::fs::write(
                &clients,
                format!(
                    "[[clients]]\nname = \"bench\"\ntoken_sha256 = \"{}\"\n\
                     destinations = [\"#\"]\npermissions = [\"submit\", \"read\"]\n",
                    delayline::auth::token::hash_hex(token)
                ),
            )?;
            command.env("DELAYLINE__AUTH__CLIENTS_FILE", clients);
        }
        let mut launch: Vec<(String, String)> = command
            .as_std()
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_str()?.to_owned(), v?.to_str()?.to_owned())))
            .collect();
        launch.extend(
            [
                ("DELAYLINE__STORE__URL", store_url),
                ("DELAYLINE__STORE__DATA_DIR", data_dir.display().to_string()),
                ("DELAYLINE__AMQP__URI", amqp_uri.to_owned()),
                ("DELAYLINE__AMQP__PUBLISH_CHANNELS", channels.to_string()),
                ("DELAYLINE__HTTP__BIND", format!("127.0.0.1:{port}")),
                ("DELAYLINE__HTTP__BATCH_LIMIT", "1000".to_owned()),
                ("DELAYLINE__CASCADE__LEVELS", levels.to_string()),
                ("DELAYLINE__CASCADE__SHARDS", shards.to_string()),
                ("DELAYLINE__CASCADE__UNIT_MS", unit_ms.to_string()),
                (
                    "DELAYLINE__CASCADE__QUEUE_TYPE",
                    queue_type.as_str().to_owned(),
                ),
                (
                    "DELAYLINE__CASCADE__RELEASE_STAGE",
                    cascade.release_stage().to_string(),
                ),
                (
                    "DELAYLINE__CASCADE__PRECISION_MS",
                    cascade.precision_ms().to_string(),
                ),
                ("DELAYLINE__CASCADE__PREFIX", cascade.prefix().to_owned()),
                (
                    "DELAYLINE__CASCADE__BUSINESS_EXCHANGE",
                    cascade.business_exchange().to_owned(),
                ),
                ("DELAYLINE__LOG__FILTER", "warn,lapin=off".to_owned()),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        let child = launch_service(&launch)?;
        let sut = ServiceUnderTest {
            child,
            launch,
            base: format!("http://127.0.0.1:{port}"),
            cascade,
            amqp_uri: amqp_uri.to_owned(),
            extra_queues: Vec::new(),
            store: store.clone(),
            store_name,
            token,
            ingress,
            retries,
        };
        sut.wait_connected().await?;
        Ok(sut)
    }

    /// Ready, and connected to the broker.
    async fn wait_connected(&self) -> anyhow::Result<()> {
        wait_connected(&self.base).await
    }

    /// Stops the service (SIGTERM, so it drains), keeping its chain and
    /// ledger: an outage.
    pub async fn halt(&mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .context("delayline did not stop within 30 s")??;
        Ok(())
    }

    /// Starts the service again as it was started, on the same chain and
    /// ledger, and waits until it is connected.
    pub async fn relaunch(&mut self) -> anyhow::Result<()> {
        self.child = launch_service(&self.launch)?;
        self.wait_connected().await
    }

    /// Another replica of this service: the same chain and ledger (which
    /// must be PostgreSQL, to be shared), an HTTP port of its own.
    pub async fn replica(&self) -> anyhow::Result<Replica> {
        if !matches!(self.store, Store::Postgres(_)) {
            bail!("replicas share a PostgreSQL ledger");
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut launch = self.launch.clone();
        for (key, value) in &mut launch {
            if key == "DELAYLINE__HTTP__BIND" {
                *value = format!("127.0.0.1:{port}");
            }
        }
        let replica = Replica {
            child: launch_service(&launch)?,
            base: format!("http://127.0.0.1:{port}"),
        };
        wait_connected(&replica.base).await?;
        Ok(replica)
    }

    /// The product's default cascade (32 levels of 100 ms, quorum queues)
    /// with `store`; the release stage on exactly when there is a ledger, as
    /// by default.
    pub async fn spawn_default(
        amqp_uri: &str,
        channels: usize,
        store: &Store,
        auth: bool,
    ) -> anyhow::Result<Self> {
        let setup = Setup {
            auth,
            ..Setup::default_with(store.clone())
        };
        Self::spawn(amqp_uri, channels, &setup).await
    }

    /// Runs `sqlite` or `postgres` on the ledger itself, while the service
    /// is halted (a bulk fill that the API would take minutes for).
    pub fn on_ledger(&self, sqlite: &str, postgres: &str) -> anyhow::Result<()> {
        match &self.store {
            Store::None => bail!("no ledger"),
            Store::Sqlite => {
                let path = std::env::temp_dir()
                    .join(&self.store_name)
                    .join("delayline.db");
                let connection = rusqlite::Connection::open(path)?;
                connection.execute_batch(sqlite)?;
                Ok(())
            }
            Store::Postgres(url) => psql(
                url,
                &format!("SET search_path = {}; {postgres}", self.store_name),
            ),
        }
    }

    /// One number from the PostgreSQL ledger (`None` on SQLite).
    pub fn postgres_count(&self, sql: &str) -> anyhow::Result<Option<u64>> {
        let Store::Postgres(url) = &self.store else {
            return Ok(None);
        };
        let output = std::process::Command::new("psql")
            .args([
                url.as_str(),
                "-tAc",
                &format!("SET search_path = {}; {sql}", self.store_name),
            ])
            .output()
            .context("running psql")?;
        let text = String::from_utf8_lossy(&output.stdout);
        Ok(text.lines().last().and_then(|l| l.trim().parse().ok()))
    }

    /// A queue deleted with the topology at the end.
    pub fn own_queue(&mut self, name: &str) {
        self.extra_queues.push(name.to_owned());
    }

    /// `sqlite`, `postgres` or `none`.
    pub fn ledger_name(&self) -> &'static str {
        self.store.name()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Resident set size (VmRSS) of process `pid` now, in KiB.
    pub fn rss_kib_of(pid: u32) -> Option<u64> {
        status_kib(pid, "VmRSS")
    }

    /// Bytes of the ledger on disk: SQLite's files (database, WAL), or the
    /// PostgreSQL schema's tables with their indexes and TOAST.
    pub fn ledger_bytes(&self) -> Option<f64> {
        if matches!(self.store, Store::Postgres(_)) {
            let total = self.postgres_count(
                "SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = current_schema() AND c.relkind = 'r'",
            );
            return total.ok().flatten().map(|bytes| bytes as f64);
        }
        let dir = std::env::temp_dir().join(&self.store_name);
        let total: u64 = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|entry| entry.ok()?.metadata().ok())
            .filter(|meta| meta.is_file())
            .map(|meta| meta.len())
            .sum();
        Some(total as f64)
    }

    /// Peak resident set size of the service so far (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        status_kib(self.child.id()?, "VmHWM")
    }

    /// CPU time (user + system) the service has used so far, in ms.
    pub fn cpu_ms(&self) -> Option<f64> {
        crate::cpu::process_cpu_ms(self.child.id()?)
    }

    /// Stops the service (SIGTERM, so it drains) and deletes its topology and ledger.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
        let connection = connect(&self.amqp_uri, "delayline-bench teardown").await?;
        for queue in &self.extra_queues {
            let channel = connection.create_channel().await?;
            let _ = channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let ingresses: Vec<Ingress> = self.ingress.iter().cloned().collect();
        let plan = plan_with(&self.cascade, &ingresses, self.retries.as_ref());
        teardown(&connection, &plan).await?;
        crate::load::close(&connection).await;
        match &self.store {
            Store::None => {}
            Store::Sqlite => {
                let _ = std::fs::remove_dir_all(std::env::temp_dir().join(&self.store_name));
            }
            Store::Postgres(url) => {
                psql(url, &format!("DROP SCHEMA {} CASCADE", self.store_name))?;
            }
        }
        Ok(())
    }
}

/// The service at `base` is ready, and connected to the broker.
async fn wait_connected(base: &str) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    // A start over a large ledger may take a while.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    loop {
        // With a ledger, /readyz is ready before the topology is
        // provisioned: wait for the broker, so that consumers can bind.
        if let Ok(response) = http.get(format!("{}/readyz", base)).send().await
            && response.status() == 200
            && response
                .json::<serde_json::Value>()
                .await
                .is_ok_and(|ready| ready["broker"] == "connected")
        {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("delayline did not become ready within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One more process of a service under test, on its chain and ledger.
pub struct Replica {
    child: Child,
    pub base: String,
}

impl Replica {
    /// SIGKILL: no drain, no goodbye.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// SIGTERM, so it drains, and its exit.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// `delayline serve` with the environment `launch`.
fn launch_service(launch: &[(String, String)]) -> anyhow::Result<Child> {
    Command::new(service_binary()?)
        .envs(launch.iter().map(|(k, v)| (k, v)))
        .arg("serve")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting delayline")
}

/// A `kB` field of `/proc/<pid>/status`.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
