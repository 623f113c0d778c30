//! Test helpers: a real RabbitMQ, a unique name prefix per test, and cleanup
//! of everything a test declared, even when it panics.

pub mod netns;
pub mod node;
pub mod nodes;
pub mod python;
pub mod tls;

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use delayline::broker::{connect, queue_state, teardown};
use delayline::cascade::{Cascade, QueueType, TopologyPlan};
use delayline::config::Settings;
use delayline::message::DELIVER_AT_HEADER;
use delayline::service::{self, ServiceError};
use delayline::testkit::{ConsumeSpec, Consumer};
use lapin::Channel;
use lapin::options::{QueueBindOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use serde_json::Value;
use tokio::process::Child;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The broker the tests share: the machine's, or the one `DLTEST_AMQP_URI`
/// names (CI runs the suite against RabbitMQ 4 as well as 3.10). With it,
/// `DLTEST_RABBITMQCTL` is the command that controls that broker and
/// `DLTEST_MANAGEMENT_URL` its management API.
pub fn amqp_uri() -> &'static str {
    static URI: OnceLock<String> = OnceLock::new();
    URI.get_or_init(|| {
        std::env::var("DLTEST_AMQP_URI")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
    })
}

/// `host:port` of the shared broker.
pub fn broker_address() -> &'static str {
    let uri = amqp_uri();
    let after_user = uri.rsplit_once('@').map_or(uri, |(_, rest)| rest);
    after_user.split('/').next().unwrap_or(after_user)
}

/// `rabbitmqctl` for the shared broker (`DLTEST_RABBITMQCTL`, words split on
/// white space: for RabbitMQ 4 in its folder, `chroot DIR rabbitmqctl -n NODE`).
pub fn rabbitmqctl_command() -> Command {
    let line = std::env::var("DLTEST_RABBITMQCTL").unwrap_or_else(|_| "rabbitmqctl".to_owned());
    let mut words = line.split_whitespace();
    let mut command = Command::new(words.next().unwrap_or("rabbitmqctl"));
    command.args(words);
    command
}

/// Settings for one test: its own prefix and business exchange, small levels and units.
pub fn test_settings(levels: u32, unit_ms: u64, queue_type: QueueType) -> Settings {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let mut settings = Settings::default();
    settings.amqp.uri = amqp_uri().to_owned().into();
    if let Ok(management) = std::env::var("DLTEST_MANAGEMENT_URL") {
        settings.metrics.management_url = management.into();
    }
    settings.cascade.levels = levels;
    settings.cascade.unit_ms = unit_ms;
    settings.cascade.queue_type = queue_type;
    settings.cascade.prefix = format!("dltest-{}", &id[..12]);
    settings.cascade.business_exchange = Some(format!("dltest-{}.business", &id[..12]));
    settings.http.bind = "127.0.0.1:0".to_owned();
    // Stateless unless a test asks for a ledger with `with_ledger`.
    settings.store.url = "none".to_owned().into();
    // Only the metrics test polls queue depths; dozens of pollers would load the broker.
    settings.metrics.queue_poll_ms = 0;
    settings
}

/// An HTTP client whose every request carries `Authorization: Bearer token`.
pub fn bearer_client(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        "authorization",
        format!("Bearer {token}")
            .parse()
            .expect("a token is a header value"),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .expect("an HTTP client")
}

/// The lowest port [`free_port`] hands out: above the fixed ports of the
/// machine's services (5672, 5432, 15672, ...), which stay bound anyway.
const LOWEST_TEST_PORT: u32 = 20_000;

/// A port nothing listens on right now, and that no outgoing connection can
/// take before the test's listener binds it.
///
/// Why not port 0: the kernel's answer lies in its ephemeral range, which it
/// also hands to every outgoing connection (a test's AMQP and HTTP clients),
/// so between this call and the service's bind a client's socket could take
/// it (CI saw "Address already in use" for a metrics listener). Ports below
/// that range are taken only by explicit binds; the counter keeps this test
/// process from handing one out twice, and the bind check skips the ports
/// other processes hold.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static FIRST: OnceLock<u32> = OnceLock::new();
    let span = ephemeral_range_start()
        .saturating_sub(LOWEST_TEST_PORT)
        .max(1);
    // Another test process (the `alone` binary, a second checkout) starts
    // elsewhere in the span.
    let first = *FIRST.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        u32::try_from(random % u64::from(span)).expect("below the span")
    });
    for _ in 0..span {
        let offset = (first + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(LOWEST_TEST_PORT + offset).expect("a port");
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between {LOWEST_TEST_PORT} and the ephemeral range");
}

/// Where the kernel's ports for outgoing connections begin (Linux's
/// `ip_local_port_range`; 32768 where it cannot be read).
fn ephemeral_range_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// The value of the sample `series` (name and labels, as exposed) in a scrape.
pub fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    })
}

impl TestApp {
    pub async fn scrape(&self) -> String {
        let response = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/openmetrics-text")
        );
        response.text().await.unwrap()
    }
}

pub const POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A ledger of the test's own: a fresh SQLite directory, or a fresh
/// PostgreSQL schema; both deleted by the cascade's [`Cleanup`].
pub fn with_ledger(mut settings: Settings, backend: Backend) -> Settings {
    let name = settings.cascade.prefix.replace('-', "_");
    match backend {
        Backend::Sqlite => {
            let dir = std::env::temp_dir().join(&name);
            settings.store.data_dir = dir.display().to_string();
            settings.store.url = String::new().into();
        }
        Backend::Postgres => {
            psql(&format!("CREATE SCHEMA {name}"));
            settings.store.url = (format!("{POSTGRES_URL}?options[search_path]={name}")).into();
        }
    }
    settings
}

/// Runs `sql` on the ledger `settings` name (made by [`with_ledger`]), as
/// a test that puts a row back the way a crash would have left it.
pub fn ledger_sql(settings: &Settings, backend: Backend, sql: &str) {
    match backend {
        Backend::Sqlite => {
            let file = std::path::Path::new(&settings.store.data_dir).join("delayline.db");
            rusqlite::Connection::open(file)
                .unwrap()
                .execute_batch(sql)
                .unwrap();
        }
        Backend::Postgres => {
            let schema = settings.cascade.prefix.replace('-', "_");
            psql(&format!("SET search_path TO {schema}; {sql}"));
        }
    }
}

pub fn psql(sql: &str) {
    let output = Command::new("psql")
        .args([POSTGRES_URL, "-q", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("psql runs");
    assert!(
        output.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Deletes a test's ledger, whichever backend it is on.
fn delete_ledger(settings: &Settings) {
    if settings.store.url.expose().starts_with("postgres") {
        let schema = settings.cascade.prefix.replace('-', "_");
        psql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
    } else if settings.store.url.expose().is_empty() {
        let _ = std::fs::remove_dir_all(&settings.store.data_dir);
    }
}

/// Deletes the cascade's objects, the test's own queues and its ledger when dropped.
pub struct Cleanup {
    plan: TopologyPlan,
    /// Queues the test declared itself, such as consumer queues.
    pub queues: Vec<String>,
    /// Exchanges the test declared itself (a user's own exchange).
    pub exchanges: Vec<String>,
    ledger_of: Option<Settings>,
    /// Where the objects live: the machine's broker, or nodes of the test's own.
    uris: Vec<String>,
}

impl Cleanup {
    /// Declares a direct exchange of the test's own on the machine's
    /// broker, as a user would; it is deleted with the test's other
    /// objects, whatever happens.
    pub async fn declare_exchange(&mut self, name: &str) {
        self.exchanges.push(name.to_owned());
        let connection = connect(amqp_uri(), "exchange owner").await.unwrap();
        let channel = connection.create_channel().await.unwrap();
        channel
            .exchange_declare(
                name.into(),
                lapin::ExchangeKind::Direct,
                lapin::options::ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        let _ = connection.close(200, "declared".into()).await;
    }

    pub fn for_cascade(cascade: &Cascade) -> Self {
        // With the retry objects a service of this prefix declares whenever
        // its release stage is on (deleting one that is not there is no
        // error), named where the service names them.
        let retries = delayline::ingress::Retries::new(&[], cascade).expect("no policies");
        Cleanup {
            plan: delayline::ingress::plan_with(cascade, &[], Some(&retries)),
            queues: Vec::new(),
            exchanges: Vec::new(),
            ledger_of: None,
            uris: vec![amqp_uri().to_owned()],
        }
    }

    /// Cleans nothing: what is left when a cleanup moved elsewhere.
    pub fn empty() -> Self {
        Cleanup {
            plan: TopologyPlan {
                exchanges: Vec::new(),
                queues: Vec::new(),
                bindings: Vec::new(),
                owner: None,
                beyond_last_shard: None,
                shards: 1,
            },
            queues: Vec::new(),
            exchanges: Vec::new(),
            ledger_of: None,
            uris: vec![amqp_uri().to_owned()],
        }
    }

    pub fn for_settings(settings: &Settings) -> Self {
        let cascade = settings.cascade().expect("valid test settings");
        let mut cleanup = Self::for_cascade(&cascade);
        let ingresses = settings.ingresses(&cascade).expect("valid test ingresses");
        let retries = settings.retries(&cascade).expect("valid test retries");
        cleanup.plan = delayline::ingress::plan_with(&cascade, &ingresses, retries.as_ref());
        cleanup.ledger_of = Some(settings.clone());
        cleanup.uris = settings.amqp.uris();
        cleanup
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(settings) = &self.ledger_of {
            delete_ledger(settings);
        }
        // Nodes of the test's own are deleted whole, with what they hold; the
        // machine's broker (whatever user the test connected as) is cleaned.
        let own_nodes = !self
            .uris
            .iter()
            .any(|uri| uri.contains(&format!("@{}/", broker_address())));
        if own_nodes
            || (self.plan.exchanges.is_empty()
                && self.queues.is_empty()
                && self.exchanges.is_empty())
        {
            return;
        }
        let plan = self.plan.clone();
        let queues = std::mem::take(&mut self.queues);
        let exchanges = std::mem::take(&mut self.exchanges);
        // Drop cannot be async, and may run inside a runtime: use a thread of its own.
        let cleaned = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("cleanup runtime");
            runtime.block_on(async move {
                let connection = connect(amqp_uri(), "delayline test cleanup")
                    .await
                    .expect("cleanup connection");
                for queue in queues {
                    let channel = connection.create_channel().await.expect("cleanup channel");
                    let _ = channel
                        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                for exchange in exchanges {
                    let channel = connection.create_channel().await.expect("cleanup channel");
                    let _ = channel
                        .exchange_delete(exchange.as_str().into(), Default::default())
                        .await;
                }
                teardown(&connection, &plan)
                    .await
                    .expect("cleanup teardown");
                let _ = connection.close(200, "cleaned".into()).await;
            });
        })
        .join();
        if cleaned.is_err() && !std::thread::panicking() {
            panic!("cleanup failed");
        }
    }
}

/// Sends the request: its status, and its JSON body (null when none).
async fn answer(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A running delayline on an ephemeral port, with its own topology.
pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    pub settings: Settings,
    pub cascade: Cascade,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<Result<(), ServiceError>>>,
    // Last, so the service has stopped before its topology is deleted.
    pub cleanup: Cleanup,
}

/// Logs of the services a test runs, when `DLTEST_LOG` holds a filter
/// (e.g. `DLTEST_LOG=info,delayline=debug cargo test --test faults -- --nocapture`).
pub fn init_logs() {
    if let Ok(filter) = std::env::var("DLTEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
}

impl TestApp {
    pub async fn spawn(settings: Settings) -> TestApp {
        let app = Self::start(settings).await;
        app.wait_ready().await;
        app
    }

    /// Starts another replica on `settings`, whose objects and ledger some
    /// other owner cleans up; without waiting for readiness.
    pub async fn start_sharing(settings: Settings) -> TestApp {
        Self::start_with(settings, Cleanup::empty()).await
    }

    /// Starts again on the topology and ledger `cleanup` kept (see
    /// [`TestApp::stop_keeping_topology`]), ready.
    pub async fn resume(settings: Settings, cleanup: Cleanup) -> TestApp {
        let app = Self::start_with(settings, cleanup).await;
        app.wait_ready().await;
        app
    }

    /// Starts without waiting for readiness.
    pub async fn start(settings: Settings) -> TestApp {
        let cleanup = Cleanup::for_settings(&settings);
        Self::start_with(settings, cleanup).await
    }

    async fn start_with(settings: Settings, cleanup: Cleanup) -> TestApp {
        init_logs();
        let cascade = settings.cascade().expect("valid test settings");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(service::run(
            settings.clone(),
            cascade.clone(),
            listener,
            async {
                let _ = stopped.await;
            },
        ));
        TestApp {
            base,
            http: reqwest::Client::new(),
            settings,
            cascade,
            stop: Some(stop),
            handle: Some(handle),
            cleanup,
        }
    }

    /// Ready and connected to the broker, so tasks are published at once.
    pub async fn wait_ready(&self) {
        wait_connected_at(&self.http, &self.base).await;
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        answer(self.http.post(url).json(body)).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        answer(self.http.get(format!("{}{path}", self.base))).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        answer(self.http.put(url).json(body)).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        answer(self.http.delete(format!("{}{path}", self.base))).await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        answer(self.http.patch(url).json(body)).await
    }

    /// Stops the service gracefully and starts it again on the same settings
    /// (and ledger), without waiting for the broker.
    pub async fn restart(mut self) -> TestApp {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.handle
            .take()
            .unwrap()
            .await
            .unwrap()
            .expect("clean stop");
        let cleanup = std::mem::replace(&mut self.cleanup, Cleanup::empty());
        let settings = self.settings.clone();
        drop(self);
        Self::start_with(settings, cleanup).await
    }

    /// Stops the service gracefully but leaves its topology (and ledger) to
    /// the returned cleanup, for a test that goes on with them.
    pub async fn stop_keeping_topology(mut self) -> Cleanup {
        let cleanup = std::mem::replace(&mut self.cleanup, Cleanup::empty());
        self.stop().await.expect("clean stop");
        cleanup
    }

    /// Stops the service gracefully and returns how it ended.
    pub async fn stop(mut self) -> Result<(), ServiceError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.handle.take().unwrap().await.unwrap()
    }

    /// How the service ended, if it ended on its own.
    pub async fn join(mut self) -> Result<(), ServiceError> {
        tokio::time::timeout(Duration::from_secs(30), self.handle.take().unwrap())
            .await
            .expect("service did not stop")
            .unwrap()
    }
}

impl Drop for TestApp {
    /// A test that did not stop its service stops it here, as the service
    /// stops (its background tasks too) and within a bound, before the
    /// cleanup deletes its objects: an aborted service leaves its broker
    /// tasks running until the test's runtime ends, and one reconnecting
    /// then declares the chain again behind the cleanup.
    fn drop(&mut self) {
        let Some(mut handle) = self.handle.take() else {
            return;
        };
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime)
                if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread =>
            {
                tokio::task::block_in_place(|| {
                    runtime.block_on(async {
                        let bound = Duration::from_secs(15);
                        if tokio::time::timeout(bound, &mut handle).await.is_err() {
                            handle.abort();
                        }
                    })
                })
            }
            _ => handle.abort(),
        }
    }
}

/// A message as a consumer received it, stamped with the moment it arrived.
pub struct Received {
    pub received_at_ms: u64,
    pub routing_key: String,
    pub body: Vec<u8>,
    pub properties: lapin::BasicProperties,
}

impl Received {
    /// The task id.
    pub fn message_id(&self) -> String {
        self.properties
            .message_id()
            .as_ref()
            .expect("every task has a message_id")
            .to_string()
    }

    pub fn header(&self, name: &str) -> Option<&lapin::types::AMQPValue> {
        self.properties.headers().as_ref()?.inner().get(name)
    }

    pub fn header_i64(&self, name: &str) -> Option<i64> {
        match self.header(name)? {
            lapin::types::AMQPValue::LongLongInt(v) => Some(*v),
            other => panic!("header {name} is {other:?}"),
        }
    }
}

/// A consumer on a fresh queue bound to the business exchange with
/// `binding_key`: the test kit's consumer (`delayline::testkit`), which
/// stamps and acknowledges each message the moment it arrives.
pub struct TestConsumer {
    kit: Consumer,
    pub channel: Channel,
}

impl TestConsumer {
    pub async fn bind(app: &mut TestApp, binding_key: &str) -> TestConsumer {
        let exchange = app.cascade.business_exchange().to_owned();
        Self::bind_to(&mut app.cleanup, &app.cascade, &exchange, binding_key).await
    }

    /// A queue named after the cascade's prefix, deleted by `cleanup`.
    pub async fn bind_to(
        cleanup: &mut Cleanup,
        cascade: &Cascade,
        exchange: &str,
        binding_key: &str,
    ) -> TestConsumer {
        Self::bind_with(
            cleanup,
            cascade,
            exchange,
            binding_key,
            FieldTable::default(),
        )
        .await
    }

    /// As [`TestConsumer::bind_to`], with binding arguments (a headers
    /// exchange's `x-match` and headers).
    pub async fn bind_with(
        cleanup: &mut Cleanup,
        cascade: &Cascade,
        exchange: &str,
        binding_key: &str,
        arguments: FieldTable,
    ) -> TestConsumer {
        let queue = format!("{}.consumer.{}", cascade.prefix(), cleanup.queues.len());
        cleanup.queues.push(queue.clone());
        let consumer = Self::declare(
            amqp_uri(),
            &queue,
            Some((exchange, binding_key)),
            QueueType::Classic,
        )
        .await;
        if !arguments.inner().is_empty() {
            // Bound again with the arguments; the plain binding goes.
            let channel = &consumer.channel;
            channel
                .queue_bind(
                    queue.as_str().into(),
                    exchange.into(),
                    binding_key.into(),
                    QueueBindOptions::default(),
                    arguments,
                )
                .await
                .unwrap();
            channel
                .queue_unbind(
                    queue.as_str().into(),
                    exchange.into(),
                    binding_key.into(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
        consumer
    }

    /// Consumes an existing queue (such as the unroutable one).
    pub async fn existing(queue: &str) -> TestConsumer {
        Self::declare(amqp_uri(), queue, None, QueueType::Classic).await
    }

    /// A durable queue of `queue_type` on the broker at `uri` (a node of the
    /// test's own, which deletes it with everything else).
    pub async fn on_node(
        uri: &str,
        cascade: &Cascade,
        binding_key: &str,
        queue_type: QueueType,
    ) -> TestConsumer {
        let queue = format!("{}.consumer", cascade.prefix());
        let binding = Some((cascade.business_exchange(), binding_key));
        Self::declare(uri, &queue, binding, queue_type).await
    }

    /// Consumes a queue that exists already on the broker at `uri`.
    pub async fn existing_on(uri: &str, queue: &str) -> TestConsumer {
        Self::declare(uri, queue, None, QueueType::Classic).await
    }

    async fn declare(
        uri: &str,
        queue: &str,
        binding: Option<(&str, &str)>,
        queue_type: QueueType,
    ) -> TestConsumer {
        let spec = ConsumeSpec {
            queue,
            binding,
            quorum: queue_type == QueueType::Quorum,
            ack: true,
            prefetch: None,
        };
        let kit = Consumer::start(uri, spec).await.unwrap();
        let channel = kit.channel.clone();
        TestConsumer { kit, channel }
    }

    /// Receives every one of `ids` exactly once, none before its
    /// `x-deliver-at-ms`, each within `wait` of the one before.
    pub async fn expect_each_once_never_early(&mut self, ids: HashSet<String>, wait: Duration) {
        let duplicates = self.expect_each_never_early(ids, wait).await;
        assert_eq!(duplicates, 0, "tasks delivered twice");
    }

    /// Receives every one of `ids` at least once, none before its
    /// `x-deliver-at-ms`; returns how many arrived more than once.
    pub async fn expect_each_never_early(&mut self, ids: HashSet<String>, wait: Duration) -> usize {
        let mut missing = ids.clone();
        let mut duplicates = 0;
        while !missing.is_empty() {
            let message = self
                .next(wait)
                .await
                .unwrap_or_else(|| panic!("{} tasks never arrived", missing.len()));
            let deliver_at = message.header_i64(DELIVER_AT_HEADER).unwrap();
            assert!(
                message.received_at_ms as i64 >= deliver_at,
                "early by {} ms",
                deliver_at - message.received_at_ms as i64
            );
            let id = message.message_id();
            assert!(ids.contains(&id), "{id} was never accepted");
            if !missing.remove(&id) {
                duplicates += 1;
            }
        }
        duplicates
    }

    /// Deletes an exchange, as an operator's mistake or a broker restart can.
    pub async fn delete_exchange(&self, name: &str) {
        self.channel
            .exchange_delete(
                name.into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await
            .unwrap();
    }

    /// The next message, or None if nothing arrives within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Received> {
        let arrival = self.kit.next(timeout).await?;
        Some(Received {
            received_at_ms: arrival.at_ms(),
            routing_key: arrival.routing_key,
            body: arrival.body,
            properties: arrival.properties,
        })
    }
}

/// Messages waiting in `queue`, by a passive declare.
pub async fn queue_depth(queue: &str) -> u32 {
    let connection = connect(amqp_uri(), "delayline test probe").await.unwrap();
    let state = queue_state(&connection, queue).await.unwrap();
    let _ = connection.close(200, "probed".into()).await;
    state
        .unwrap_or_else(|| panic!("queue {queue} exists"))
        .messages
}

/// Runs `rabbitmqctl` with JSON output and parses it.
pub fn rabbitmqctl_json(args: &[&str]) -> Value {
    let output = rabbitmqctl_command()
        .args(args)
        .args(["-q", "--formatter", "json"])
        .output()
        .expect("rabbitmqctl runs");
    assert!(
        output.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("rabbitmqctl JSON")
}

/// Closes, from the broker's side, every connection whose name is `name`.
pub fn close_connections_named(name: &str) -> usize {
    let pids = connections_named(name, "pid");
    for pid in &pids {
        let status = rabbitmqctl_command()
            .args(["-q", "close_connection", pid, "test closes the connection"])
            .status()
            .unwrap();
        assert!(status.success());
    }
    pids.len()
}

/// `field` (as `rabbitmqctl list_connections` names it) of each connection
/// whose client named it `name`. The plain format prints pids as
/// close_connection takes them; JSON does not.
pub fn connections_named(name: &str, field: &str) -> Vec<String> {
    let output = rabbitmqctl_command()
        .args(["-q", "list_connections", field, "client_properties"])
        .output()
        .expect("rabbitmqctl runs");
    let needle = format!("{{\"connection_name\",\"{name}\"}}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains(&needle))
        .filter_map(|line| line.split('\t').next())
        .map(str::to_owned)
        .collect()
}

/// SIGTERM, as systemd, Kubernetes and docker send it.
/// SIGHUP, as `kill -HUP`, `systemctl reload` or `docker compose kill -s HUP` send it.
pub fn hang_up(child: &tokio::process::Child) {
    let pid = child.id().expect("running").to_string();
    let status = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(status.success());
}

pub fn terminate(child: &tokio::process::Child) {
    let pid = child.id().expect("running");
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

pub fn rabbitmqctl(args: &[&str]) {
    let status = rabbitmqctl_command()
        .arg("-q")
        .args(args)
        .status()
        .expect("rabbitmqctl runs");
    assert!(status.success(), "rabbitmqctl {args:?} failed");
}

/// A broker user of the test's own: revoking its permissions cuts the
/// service off the broker deterministically, without touching other tests.
pub struct TestUser(pub String);

impl TestUser {
    pub fn create() -> Self {
        let name = format!(
            "dltest-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        rabbitmqctl(&["add_user", &name, "secret"]);
        let user = TestUser(name);
        user.grant();
        user
    }

    pub fn uri(&self) -> String {
        format!("amqp://{}:secret@{}/%2f", self.0, broker_address())
    }

    pub fn grant(&self) {
        rabbitmqctl(&["set_permissions", "-p", "/", &self.0, ".*", ".*", ".*"]);
    }

    pub fn revoke(&self) {
        rabbitmqctl(&["clear_permissions", "-p", "/", &self.0]);
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = rabbitmqctl_command()
            .args(["-q", "delete_user", &self.0])
            .status();
    }
}

/// Waits up to 20 s for `check` to hold.
/// `response` is a `503` that tells the client to come back in a second,
/// with error code `code`.
pub async fn assert_retry_later(response: reqwest::Response, code: &str) {
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], code, "{body}");
}

pub async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What one request of a load got.
pub struct Answer {
    pub status: u16,
    pub id: Option<String>,
    pub state: Option<String>,
    pub took: Duration,
}

/// Stops `load` (a [`steady_load`] fired by `stop`): every request was
/// answered 202; the ids it was given.
pub async fn accepted_ids(
    load: tokio::task::JoinHandle<Vec<Answer>>,
    stop: tokio_util::sync::CancellationToken,
) -> std::collections::HashSet<String> {
    stop.cancel();
    let answers = load.await.unwrap();
    assert!(answers.iter().all(|a| a.status == 202));
    answers.into_iter().filter_map(|a| a.id).collect()
}

/// Posts tasks from `clients` concurrent clients, each pausing 25 ms
/// between requests, until `stop` fires.
pub fn steady_load(
    http: &reqwest::Client,
    base: &str,
    clients: usize,
    destination: &str,
    delay_ms: u64,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<Vec<Answer>> {
    let http = http.clone();
    let url = format!("{base}/v1/tasks");
    let task = serde_json::json!({"destination": destination, "delay_ms": delay_ms});
    tokio::spawn(async move {
        let workers = (0..clients).map(|_| {
            let (http, url, stop, task) = (http.clone(), url.clone(), stop.clone(), task.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.is_cancelled() {
                    let started = std::time::Instant::now();
                    // A request the service could not answer (it was killed) counts as status 0.
                    let (status, body) = match http.post(&url).json(&task).send().await {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            (status, response.json().await.unwrap_or(Value::Null))
                        }
                        Err(_) => (0, Value::Null),
                    };
                    answers.push(Answer {
                        status,
                        id: body["id"].as_str().map(str::to_owned),
                        state: body["state"].as_str().map(str::to_owned),
                        took: started.elapsed(),
                    });
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                answers
            })
        });
        let mut all = Vec::new();
        for worker in futures_util::future::join_all(workers).await {
            all.extend(worker.unwrap());
        }
        all
    })
}

/// The `delayline serve` binary on `port`, configured by the environment.
pub fn spawn_binary(settings: &Settings, port: u16) -> Child {
    serve_command(settings, port).spawn().unwrap()
}

pub fn serve_command(settings: &Settings, port: u16) -> tokio::process::Command {
    let mut command = delayline_command(settings, &["serve"]);
    command
        .env("DELAYLINE__HTTP__BIND", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command
}

/// `delayline ARGS` configured by the environment with `settings`' broker,
/// chain and ledger, as an operator would run it.
pub fn delayline_command(settings: &Settings, args: &[&str]) -> tokio::process::Command {
    let mut command = configured(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_delayline")),
        settings,
    );
    command.args(args);
    command
}

/// Runs `delayline ARGS --url BASE` as the client holding `token` and
/// returns what it printed; fails the test, with its stderr, unless it
/// succeeded.
pub async fn cli_as(settings: &Settings, base: &str, token: &str, args: &[&str]) -> String {
    let args = [args, &["--url", base]].concat();
    let mut command = delayline_command(settings, &args);
    command.env("DELAYLINE_TOKEN", token);
    let output = command.output().await.unwrap();
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `delayline serve` on `port`, ready, its business exchange declared (so
/// that a consumer can bind to it at once).
pub async fn serve_declared(
    settings: &Settings,
    port: u16,
    http: &reqwest::Client,
    base: &str,
) -> Child {
    let cascade = settings.cascade().unwrap();
    let child = spawn_binary(settings, port);
    wait_ready_at(http, base).await;
    eventually("the business exchange is declared", async || {
        let connection = delayline::broker::connect(amqp_uri(), "probe")
            .await
            .unwrap();
        delayline::broker::exchange_exists(&connection, cascade.business_exchange())
            .await
            .unwrap()
    })
    .await;
    child
}

/// `command` with `settings` in its environment.
fn configured(
    mut command: tokio::process::Command,
    settings: &Settings,
) -> tokio::process::Command {
    let c = &settings.cascade;
    if let Some(precision_ms) = c.precision_ms {
        command.env("DELAYLINE__CASCADE__PRECISION_MS", precision_ms.to_string());
    }
    if let Some(business) = &c.business_exchange {
        command.env("DELAYLINE__CASCADE__BUSINESS_EXCHANGE", business);
    }
    command.env(
        "DELAYLINE__STOP__TIMEOUT_MS",
        settings.stop.timeout_ms.to_string(),
    );
    command
        .env("DELAYLINE__CASCADE__HOLD_LIMIT", c.hold_limit.to_string())
        .env(
            "DELAYLINE__CASCADE__LEVEL_PROBE_MS",
            c.level_probe_ms.to_string(),
        )
        .env(
            "DELAYLINE__CASCADE__STRANDED_MARGIN_MS",
            c.stranded_margin_ms.to_string(),
        )
        .env("DELAYLINE__AMQP__URI", settings.amqp.uri.expose())
        .env("DELAYLINE__AMQP__RECONNECT_MAX_BACKOFF_MS", "200")
        .env(
            "DELAYLINE__AMQP__CONFIRM_TIMEOUT_MS",
            settings.amqp.confirm_timeout_ms.to_string(),
        )
        .env(
            "DELAYLINE__AMQP__LATE_CONFIRM_LIMIT_MS",
            settings.amqp.late_confirm_limit_ms.to_string(),
        )
        .env("DELAYLINE__CASCADE__PREFIX", &c.prefix)
        .env("DELAYLINE__CASCADE__LEVELS", c.levels.to_string())
        .env("DELAYLINE__CASCADE__UNIT_MS", c.unit_ms.to_string())
        .env("DELAYLINE__CASCADE__QUEUE_TYPE", c.queue_type.as_str())
        .env("DELAYLINE__CASCADE__VERSION", c.version.to_string())
        .env("DELAYLINE__CASCADE__SHARDS", c.shards.to_string())
        .env(
            "DELAYLINE__CASCADE__BURST_LEVEL_RATE",
            c.burst_level_rate.to_string(),
        )
        .env(
            "DELAYLINE__CASCADE__BURST_WINDOW_MS",
            c.burst_window_ms.to_string(),
        )
        .env(
            "DELAYLINE__CASCADE__RELEASE_STAGE",
            // As the settings resolve it, so that an unset stage follows the ledger here too.
            settings
                .cascade()
                .expect("valid test settings")
                .release_stage()
                .to_string(),
        )
        .env(
            "DELAYLINE__SCHEDULES__LEAD_MS",
            settings.schedules.lead_ms.to_string(),
        )
        .env(
            "DELAYLINE__SCHEDULES__POLL_MS",
            settings.schedules.poll_ms.to_string(),
        )
        .env(
            "DELAYLINE__SCHEDULES__PLAN_RATE",
            settings.schedules.plan_rate.to_string(),
        )
        .env("DELAYLINE__STORE__URL", settings.store.url.expose())
        .env("DELAYLINE__STORE__DATA_DIR", &settings.store.data_dir)
        .env(
            "DELAYLINE__METRICS__MANAGEMENT_URL",
            settings.metrics.management_url.expose(),
        );
    command
}

/// Runs `delayline ARGS` to the end: whether it succeeded, and its output.
pub async fn run_delayline(settings: &Settings, args: &[&str]) -> (bool, String) {
    let output = delayline_command(settings, args).output().await.unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Ready and connected to the broker. With a ledger `/readyz` answers 200
/// before RabbitMQ is connected (tasks would wait as pending); a test that
/// expects tasks to be published at once waits for this instead.
pub async fn wait_connected_at(http: &reqwest::Client, base: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut last = String::from("no answer");
    loop {
        if let Ok(r) = http.get(format!("{base}/readyz")).send().await {
            let status = r.status();
            let body = r.json::<Value>().await.unwrap_or_default();
            if status == 200 && body["broker"] == "connected" {
                return;
            }
            last = format!("{status} {body}");
        }
        // What readiness said last tells a slow broker from a refusal.
        assert!(
            tokio::time::Instant::now() < deadline,
            "{base} never became ready and connected; /readyz said last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn wait_ready_at(http: &reqwest::Client, base: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(response) = http.get(format!("{base}/readyz")).send().await
            && response.status() == 200
        {
            return response.json().await.unwrap();
        }
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
