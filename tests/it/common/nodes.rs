//! RabbitMQ nodes of a test's own, beside the machine's broker: for faults
//! that would disturb every other test (alarms, stopping a node, a cluster
//! losing a member). Each node has its own name, ports and directories, and
//! is stopped and deleted when dropped. See `shared/notes/rabbitmq-nodes.md`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use delayline::message::DELIVER_AT_HEADER;

use super::{TestConsumer, free_port};

/// A queue's messages: (ready, unacknowledged, all).
type QueueCounts = (u64, u64, u64);

/// What a node is started with.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    /// Also serve the management HTTP API (on a port of its own).
    pub management: bool,
    /// `dead_letter_worker_publisher_confirm_timeout` in ms (RabbitMQ's default is 180 s).
    pub dead_letter_confirm_timeout_ms: Option<u64>,
    /// Also an `amqps` listener (on a port of its own).
    pub tls: Option<NodeTls>,
    /// The node's wall clock is the host's plus the offset its
    /// `clock-offset` file holds (libfaketime, read at every call; its
    /// monotonic clock left alone, as a paused VM's is), so that a test
    /// can step it ([`BrokerNode::step_clock`]). The machine's RabbitMQ
    /// only: the RabbitMQ 4 folder has no libfaketime of its own, and with
    /// one installed there its `rabbitmq-server` hung in `su` under it
    /// (RELIABILITY.md, "A broker's clock stepped").
    pub steppable_clock: bool,
}

/// libfaketime, as Debian installs it (`bash tests/run` does).
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The TLS listener's PEM files, and whether clients may log in by
/// certificate (SASL EXTERNAL, the user named by the certificate's CN).
#[derive(Clone, Debug)]
pub struct NodeTls {
    pub ca_pem: String,
    pub cert_pem_file: String,
    pub key_pem_file: String,
    pub external: bool,
}

/// Tests with nodes of their own take turns: two cores cannot boot and run
/// several RabbitMQ nodes beside the machine's broker and other tests without
/// making every timing in the run meaningless.
static OWN_NODES: Mutex<()> = Mutex::new(());

pub(crate) fn own_nodes_turn() -> MutexGuard<'static, ()> {
    // A test that panicked with its nodes still frees the turn.
    OWN_NODES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where test nodes come from: the machine's RabbitMQ, or the folder
/// `DLTEST_RABBITMQ_ROOT` names (RabbitMQ 4, installed by
/// `.ci/rabbitmq4.sh`), whose programs run through `chroot` and see the
/// node's directory below the folder's `/tmp`.
pub(crate) fn rabbitmq_root() -> Option<PathBuf> {
    std::env::var_os("DLTEST_RABBITMQ_ROOT").map(PathBuf::from)
}

/// A RabbitMQ program (`rabbitmq-server`, `rabbitmqctl`, `sh`), in the folder
/// when there is one.
fn rabbitmq_program(program: &str) -> Command {
    match rabbitmq_root() {
        None => Command::new(program),
        Some(root) => {
            let mut command = Command::new("chroot");
            command.arg(root).arg(program);
            command
        }
    }
}

pub struct BrokerNode {
    /// The Erlang node name, e.g. `dltest-1a2b3c@localhost`.
    pub name: String,
    pub port: u16,
    pub management_port: Option<u16>,
    pub tls_port: Option<u16>,
    dir: PathBuf,
    /// `dir` as the node's programs see it.
    inside: PathBuf,
    /// A node started on its own holds the turn; a cluster's nodes share the cluster's.
    turn: Option<MutexGuard<'static, ()>>,
}

impl BrokerNode {
    /// Starts a node and waits until it serves AMQP.
    pub fn start(options: &NodeOptions) -> BrokerNode {
        let turn = own_nodes_turn();
        let mut node = Self::launch(options);
        node.turn = Some(turn);
        node.wait_started();
        node
    }

    /// Starts the node's process without waiting for it.
    fn launch(options: &NodeOptions) -> BrokerNode {
        // A run's tag (DLTEST_RUN_ID, set by .ci/run) lets it stop exactly
        // the nodes it started, should a test be killed before its cleanup.
        let run_tag: String = std::env::var("DLTEST_RUN_ID")
            .unwrap_or_default()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        let id = format!(
            "{run_tag}{}",
            &uuid::Uuid::new_v4().simple().to_string()[..10]
        );
        let name = format!("dltest-{id}@localhost");
        // `inside` is how the node's programs see `dir`.
        let (dir, inside) = match rabbitmq_root() {
            None => {
                let dir = std::env::temp_dir().join(format!("dltest-node-{id}"));
                (dir.clone(), dir)
            }
            Some(root) => {
                let inside = PathBuf::from(format!("/tmp/dltest-node-{id}"));
                (root.join(inside.strip_prefix("/").unwrap()), inside)
            }
        };
        let port = free_port();
        let management_port = options.management.then(free_port);
        std::fs::create_dir_all(dir.join("mnesia")).unwrap();
        std::fs::create_dir_all(dir.join("log")).unwrap();
        let mut config = format!("listeners.tcp.local = 127.0.0.1:{port}\n");
        let tls_port = options.tls.as_ref().map(|_| free_port());
        let mut plugins = Vec::new();
        if let (Some(tls), Some(tls_port)) = (&options.tls, tls_port) {
            // The node reads its files as the rabbitmq user: copies in its directory.
            let copy = |from: &str, leaf: &str| {
                std::fs::copy(from, dir.join(leaf)).unwrap();
                inside.join(leaf).display().to_string()
            };
            std::fs::write(dir.join("ca.pem"), &tls.ca_pem).unwrap();
            let ca = inside.join("ca.pem");
            config.push_str(&format!(
                "listeners.ssl.default = 127.0.0.1:{tls_port}\n\
                 ssl_options.cacertfile = {}\n\
                 ssl_options.certfile = {}\n\
                 ssl_options.keyfile = {}\n\
                 ssl_options.verify = verify_peer\n\
                 ssl_options.fail_if_no_peer_cert = false\n",
                ca.display(),
                copy(&tls.cert_pem_file, "server.pem"),
                copy(&tls.key_pem_file, "server.key"),
            ));
            if tls.external {
                config.push_str(
                    "auth_mechanisms.1 = PLAIN\nauth_mechanisms.2 = AMQPLAIN\n\
                     auth_mechanisms.3 = EXTERNAL\nssl_cert_login_from = common_name\n",
                );
                plugins.push("rabbitmq_auth_mechanism_ssl");
            }
        }
        if let Some(management) = management_port {
            config.push_str(&format!(
                "management.tcp.port = {management}\nmanagement.tcp.ip = 127.0.0.1\n"
            ));
        }
        std::fs::write(dir.join("rabbitmq.conf"), config).unwrap();
        if options.management {
            plugins.push("rabbitmq_management");
        }
        std::fs::write(
            dir.join("enabled_plugins"),
            format!("[{}].", plugins.join(",")),
        )
        .unwrap();
        let advanced = match options.dead_letter_confirm_timeout_ms {
            Some(ms) => {
                format!("[{{rabbit, [{{dead_letter_worker_publisher_confirm_timeout, {ms}}}]}}].")
            }
            None => "[].".to_owned(),
        };
        std::fs::write(dir.join("advanced.config"), advanced).unwrap();
        if options.steppable_clock {
            assert!(
                Path::new(FAKETIME).exists(),
                "needs libfaketime: `bash tests/run` installs it (apt-get install -y faketime)"
            );
            std::fs::write(dir.join("clock-offset"), "+0").unwrap();
        }
        // The rabbitmq user of wherever the node runs.
        let status = rabbitmq_program("chown")
            .args(["-R", "rabbitmq:rabbitmq", inside.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(status.success(), "chown {inside:?}");
        let path = |leaf: &str| inside.join(leaf).display().to_string();
        let mut server = match rabbitmq_root() {
            None => Command::new("rabbitmq-server"),
            // chroot passes the environment on.
            Some(_) => rabbitmq_program("rabbitmq-server"),
        };
        if options.steppable_clock {
            server
                .env("LD_PRELOAD", FAKETIME)
                .env("FAKETIME_TIMESTAMP_FILE", path("clock-offset"))
                .env("FAKETIME_NO_CACHE", "1")
                .env("DONT_FAKE_MONOTONIC", "1");
        }
        let status = server
            .arg("-detached")
            .env("RABBITMQ_NODENAME", &name)
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", free_port().to_string())
            .env("RABBITMQ_MNESIA_BASE", path("mnesia"))
            .env("RABBITMQ_LOG_BASE", path("log"))
            .env("RABBITMQ_PID_FILE", path("pid"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", path("rabbitmq.conf"))
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", path("advanced.config"))
            .status()
            .expect("rabbitmq-server runs");
        assert!(status.success(), "rabbitmq-server -detached failed");
        BrokerNode {
            name,
            port,
            management_port,
            tls_port,
            dir,
            inside,
            turn: None,
        }
    }

    fn wait_started(&self) {
        let pid_file = self.inside.join("pid").display().to_string();
        self.ctl(&["wait", &pid_file, "--timeout", "120"]);
    }

    /// Sets the node's wall clock to the host's plus `offset` (libfaketime's
    /// form: `+10s`); the node must have been started with a steppable clock.
    pub fn step_clock(&self, offset: &str) {
        std::fs::write(self.dir.join("clock-offset"), offset).unwrap();
    }

    /// How far the node's Erlang clock is from its host's wall clock, in
    /// ms: below 0 while it catches up with a step forward.
    pub fn erlang_clock_offset_ms(&self) -> i64 {
        let said = self.ctl(&[
            "eval",
            "erlang:system_time(millisecond) - os:system_time(millisecond).",
        ]);
        said.trim().parse().unwrap_or_else(|_| panic!("{said}"))
    }

    pub fn uri(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// `rabbitmqctl` against this node; panics when it fails.
    pub fn ctl(&self, args: &[&str]) -> String {
        let output = self.try_ctl(args);
        assert!(
            output.status.success(),
            "rabbitmqctl -n {} {args:?}: {}",
            self.name,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    pub fn try_ctl(&self, args: &[&str]) -> Output {
        rabbitmq_program("rabbitmqctl")
            .args(["-q", "-n", &self.name])
            .args(args)
            .output()
            .expect("rabbitmqctl runs")
    }

    /// Blocks every publishing connection, as a memory alarm does.
    pub fn raise_memory_alarm(&self) {
        self.ctl(&["set_vm_memory_high_watermark", "0.0000001"]);
    }

    pub fn clear_memory_alarm(&self) {
        self.ctl(&["set_vm_memory_high_watermark", "0.4"]);
    }

    /// Blocks publishers by pretending the disk is nearly full.
    pub fn raise_disk_alarm(&self) {
        self.ctl(&["set_disk_free_limit", "100000GB"]);
    }

    pub fn clear_disk_alarm(&self) {
        self.ctl(&["set_disk_free_limit", "50MB"]);
    }

    /// Closes, from the broker's side, every connection the client named
    /// `name`; returns how many.
    pub fn close_connections_named(&self, name: &str) -> usize {
        let listing = self.ctl(&["list_connections", "pid", "client_properties"]);
        let needle = format!("{{\"connection_name\",\"{name}\"}}");
        let pids: Vec<&str> = listing
            .lines()
            .filter(|line| line.contains(&needle))
            .filter_map(|line| line.split('\t').next())
            .collect();
        for pid in &pids {
            self.ctl(&["close_connection", pid, "test closes the connection"]);
        }
        pids.len()
    }

    /// Level queues of the chain `prefix` that hold expired messages (more
    /// in all than ready and unacknowledged: held for dead-lettering, as
    /// the runbook reads it), or whose counts the broker cannot give (no
    /// leader): called when nothing has arrived for a while, they are
    /// stranded (see deploy/rabbitmq/release-stranded-level.sh). A message
    /// still waiting out its TTL, such as delayline's probe, is ready.
    pub fn stranded_levels(&self, prefix: &str) -> Vec<String> {
        self.queue_counts_where_known()
            .into_iter()
            .filter(|(name, counts)| {
                let level = name.starts_with(prefix) && name.contains(".level");
                level && counts.is_none_or(|(ready, unacked, all)| all > ready + unacked)
            })
            .map(|(name, _)| name)
            .collect()
    }

    /// What each quorum queue's member on this node holds, from the Raft
    /// state machine itself (`rabbit_fifo:overview/1`): ready, checked out,
    /// and held for dead-lettering (`num_discarded`, and checked out to the
    /// dead-letter worker). For a failure that cannot be rerun.
    pub fn quorum_overviews(&self) -> String {
        const OVERVIEWS: &str = "[{N, maps:with([num_messages, num_ready_messages, \
            num_checked_out, num_discarded, num_discard_checked_out, num_consumers], O), L} \
            || Q <- rabbit_amqqueue:list(), amqqueue:get_type(Q) =:= rabbit_quorum_queue, \
            {resource, _, queue, N} <- [amqqueue:get_name(Q)], \
            {ok, {_, O}, L} <- [catch ra:local_query({element(1, amqqueue:get_pid(Q)), node()}, \
            fun rabbit_fifo:overview/1)]].";
        let output = self.try_ctl(&["eval", OVERVIEWS]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    }

    /// The runbook's remedy for a stranded level, run against this node.
    pub fn release_stranded_level(&self, queue: &str) {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/rabbitmq/release-stranded-level.sh"
        );
        // The script runs where the node's rabbitmqctl is: a copy in its directory.
        std::fs::copy(script, self.dir.join("release-stranded-level.sh")).unwrap();
        let copy = self.inside.join("release-stranded-level.sh");
        let output = rabbitmq_program("sh")
            .arg(copy)
            .arg(queue)
            .env("RABBITMQCTL_OPTS", format!("-n {}", self.name))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{script} {queue}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Freezes the node's VM (SIGSTOP) until the guard is dropped: its
    /// sockets stay open and nothing answers, as a node that lost its
    /// quorum may hold a publish without a word.
    pub fn pause(&self) -> Paused<'_> {
        freeze(&self.dir);
        Paused(self)
    }

    /// Stops the node for good (its directories go when it is dropped).
    pub fn stop(&self) {
        let _ = self.try_ctl(&["stop"]);
    }

    /// Every queue with its messages as the broker counts them: (name,
    /// ready, unacknowledged, all). Quorum queues count the messages their
    /// dead-letter worker holds only in the total.
    pub fn queue_listing(&self) -> Vec<(String, u64, u64, u64)> {
        self.queue_counts_where_known()
            .into_iter()
            .filter_map(|(name, counts)| {
                let (ready, unacked, all) = counts?;
                Some((name, ready, unacked, all))
            })
            .collect()
    }

    /// Every queue with its counts, `None` where the
    /// broker cannot give them (a quorum queue without a leader).
    fn queue_counts_where_known(&self) -> Vec<(String, Option<QueueCounts>)> {
        let listing = self.ctl(&[
            "list_queues",
            "name",
            "messages_ready",
            "messages_unacknowledged",
            "messages",
        ]);
        listing
            .lines()
            .map(|line| {
                let fields: Vec<&str> = line.split('\t').collect();
                let count = |i: usize| fields.get(i)?.trim().parse().ok();
                let counts = (|| Some((count(1)?, count(2)?, count(3)?)))();
                (fields[0].to_owned(), counts)
            })
            .collect()
    }

    /// (ready, unacknowledged, all) of `queue`.
    pub fn queue_counts(&self, queue: &str) -> Option<(u64, u64, u64)> {
        self.queue_listing()
            .into_iter()
            .find(|(name, ..)| name == queue)
            .map(|(_, ready, unacked, all)| (ready, unacked, all))
    }
}

impl Drop for BrokerNode {
    fn drop(&mut self) {
        self.stop();
        // DLTEST_KEEP_NODES keeps the node's logs and data for a post-mortem.
        if std::env::var_os("DLTEST_KEEP_NODES").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("kept node {} in {}", self.name, self.dir.display());
        }
    }
}

/// Three nodes in one cluster; quorum queues declared on it have a replica on each.
pub struct Cluster {
    pub nodes: Vec<BrokerNode>,
    /// Dropped after the nodes (fields drop in order).
    _turn: MutexGuard<'static, ()>,
}

impl Cluster {
    pub fn start(options: &NodeOptions) -> Cluster {
        let turn = own_nodes_turn();
        // Booting is the slow part: let the three boot at once.
        let nodes: Vec<BrokerNode> = (0..3).map(|_| BrokerNode::launch(options)).collect();
        for node in &nodes {
            node.wait_started();
        }
        for node in &nodes[1..] {
            node.ctl(&["stop_app"]);
            node.ctl(&["reset"]);
            node.ctl(&["join_cluster", &nodes[0].name]);
            node.ctl(&["start_app"]);
            node.ctl(&["await_startup"]);
        }
        Cluster { nodes, _turn: turn }
    }

    /// Every node's address, as `amqp.uri` takes them.
    pub fn uris(&self) -> String {
        self.nodes
            .iter()
            .map(BrokerNode::uri)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// What receiving every accepted task took.
#[derive(Debug, Default)]
pub struct Drained {
    pub duplicates: usize,
    /// Tasks delivered that no 202 named (their request was cut off).
    pub unanswered_delivered: usize,
    /// Milliseconds after `x-deliver-at-ms`, one per task, sorted.
    pub lateness: Vec<i64>,
    /// (`x-deliver-at-ms`, lateness) of each task, in arrival order.
    pub timeline: Vec<(i64, i64)>,
    /// Levels released with the runbook's script.
    pub released: Vec<String>,
    /// Accepted tasks that had not arrived when the allowance ran out.
    pub missing: Vec<String>,
}

impl Drained {
    /// Tasks by when they were due, in buckets of `bucket_ms`: (due since
    /// the first, count, median and worst lateness).
    pub fn by_due_time(&self, bucket_ms: i64) -> Vec<(i64, usize, i64, i64)> {
        let first = self.timeline.iter().map(|(due, _)| *due).min().unwrap_or(0);
        let mut buckets: std::collections::BTreeMap<i64, Vec<i64>> = Default::default();
        for (due, late) in &self.timeline {
            buckets
                .entry((due - first) / bucket_ms)
                .or_default()
                .push(*late);
        }
        buckets
            .into_iter()
            .map(|(bucket, mut late)| {
                late.sort_unstable();
                (
                    bucket * bucket_ms,
                    late.len(),
                    late[late.len() / 2],
                    late[late.len() - 1],
                )
            })
            .collect()
    }

    /// Every accepted task arrived, and no level needed the runbook's remedy.
    pub fn assert_all_arrived_unaided(&self) {
        assert!(self.missing.is_empty(), "never arrived: {:?}", self.missing);
        assert!(
            self.released.is_empty(),
            "the runbook's remedy was needed for {:?}",
            self.released
        );
    }

    pub fn percentile(&self, p: f64) -> i64 {
        self.lateness[((self.lateness.len() - 1) as f64 * p) as usize]
    }
}

/// Receives every task of `accepted` (asserting none is early), then what
/// else arrives within a few seconds; what never came is in `missing`. When nothing arrives for 20 s and a
/// level of `prefix` holds stranded messages, applies the runbook's remedy
/// through `node` (a surviving node), as an operator alerted by
/// `delayline_level_queue_held_seconds` would.
pub async fn drain(
    consumer: &mut TestConsumer,
    accepted: &HashSet<String>,
    node: &BrokerNode,
    prefix: &str,
    allowance: Duration,
) -> Drained {
    let mut drained = Drained::default();
    let mut missing = accepted.clone();
    let mut seen = HashSet::new();
    let deadline = Instant::now() + allowance;
    let mut quiet_since = Instant::now();
    let mut receive = async |consumer: &mut TestConsumer, wait, drained: &mut Drained| {
        let message = consumer.next(wait).await?;
        let deliver_at = message.header_i64(DELIVER_AT_HEADER).unwrap();
        let late = message.received_at_ms as i64 - deliver_at;
        assert!(late >= 0, "delivered early by {} ms", -late);
        let id = message.message_id();
        if !seen.insert(id.clone()) {
            drained.duplicates += 1;
        } else {
            drained.lateness.push(late);
            drained.timeline.push((deliver_at, late));
            if !accepted.contains(&id) {
                drained.unanswered_delivered += 1;
            }
        }
        Some(id)
    };
    while !missing.is_empty() {
        match receive(consumer, Duration::from_secs(5), &mut drained).await {
            Some(id) => {
                missing.remove(&id);
                quiet_since = Instant::now();
            }
            None => {
                if Instant::now() >= deadline {
                    drained.missing = missing.into_iter().collect();
                    drained.lateness.sort_unstable();
                    return drained;
                }
                if quiet_since.elapsed() >= Duration::from_secs(20) {
                    let stranded = node.stranded_levels(prefix);
                    if !stranded.is_empty() {
                        eprintln!("before the remedy: {}", node.quorum_overviews());
                    }
                    for queue in stranded {
                        eprintln!("{queue} holds stranded messages: releasing it (runbook)");
                        node.release_stranded_level(&queue);
                        drained.released.push(queue);
                    }
                    quiet_since = Instant::now();
                }
            }
        }
    }
    while receive(consumer, Duration::from_secs(3), &mut drained)
        .await
        .is_some()
    {}
    drained.lateness.sort_unstable();
    drained
}

/// A paused node ([`BrokerNode::pause`]); it runs again when this goes,
/// whatever the test did meanwhile.
pub struct Paused<'a>(&'a BrokerNode);

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        thaw(&self.0.dir);
    }
}

/// SIGSTOPs the node whose pid file is in `dir`.
pub(crate) fn freeze(dir: &Path) {
    let pid = std::fs::read_to_string(dir.join("pid")).expect("the node's pid file");
    let status = Command::new("kill")
        .args(["-STOP", pid.trim()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// SIGCONTs a node [`freeze`] stopped; harmless on a running one.
pub(crate) fn thaw(dir: &Path) {
    if let Ok(pid) = std::fs::read_to_string(dir.join("pid")) {
        let _ = Command::new("kill").args(["-CONT", pid.trim()]).status();
    }
}

/// Polls `check` every 100 ms until it holds or `limit` passes; returns whether it held.
pub async fn within(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
