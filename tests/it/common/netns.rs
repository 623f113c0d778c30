//! A three-node RabbitMQ cluster whose nodes live in network namespaces the
//! test creates, so that the traffic between them can be cut and restored
//! without touching anything else on the machine.
//!
//! Each node has two links: one into a bridge the nodes share (Erlang
//! distribution, `10.77.R.k`), and one straight to the test's own namespace
//! (AMQP for delayline and the consumer, `10.78.R.4k+2`). Cutting a node off
//! takes its bridge link down: it still serves its clients, and can no
//! longer see the other nodes, as in a network partition. Everything (links,
//! namespaces, nodes, directories) goes when the cluster is dropped, links
//! restored first, whatever happened in the test.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::MutexGuard;

use super::nodes::{own_nodes_turn, rabbitmq_root};

/// Runs `ip` with `args`; panics when it fails.
fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().expect("ip runs");
    assert!(
        output.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

pub struct NsNode {
    /// The Erlang node name, `dltest-<id>@10.77.R.k`.
    pub name: String,
    pub ns: String,
    /// Where clients reach its AMQP listener (port 5672).
    pub client_ip: String,
    cluster_ip: String,
    /// This side of its link into the bridge.
    cluster_link: String,
    client_link: String,
    dir: PathBuf,
    inside: PathBuf,
}

impl NsNode {
    pub fn uri(&self) -> String {
        format!("amqp://guest:guest@{}:5672/%2f", self.client_ip)
    }

    /// A RabbitMQ program (or any) in the node's namespace, in the RabbitMQ 4
    /// folder when there is one, with the node's environment.
    fn program(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.ns]);
        if let Some(root) = rabbitmq_root() {
            command.arg("chroot").arg(root);
        }
        command
            .arg(program)
            .env_remove("ERL_FLAGS")
            .env("ERL_EPMD_ADDRESS", format!("127.0.0.1,{}", self.cluster_ip))
            .env("RABBITMQ_USE_LONGNAME", "true")
            .env("RABBITMQ_CONF_ENV_FILE", self.inside.join("env.conf"));
        command
    }

    pub fn try_ctl(&self, args: &[&str]) -> Output {
        self.program("rabbitmqctl")
            .args(["-q", "-n", &self.name])
            .args(args)
            .output()
            .expect("rabbitmqctl runs")
    }

    pub fn ctl(&self, args: &[&str]) -> String {
        let output = self.try_ctl(args);
        assert!(
            output.status.success(),
            "rabbitmqctl -n {} {args:?}: {}{}",
            self.name,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Cuts the node off from the other nodes (its clients still reach it).
    pub fn cut_off(&self) {
        ip(&["link", "set", &self.cluster_link, "down"]);
    }

    /// Lets the node see the others again.
    pub fn reconnect(&self) {
        ip(&["link", "set", &self.cluster_link, "up"]);
    }

    /// Freezes the node's VM (SIGSTOP): its sockets stay open, nothing answers.
    pub fn pause(&self) {
        super::nodes::freeze(&self.dir);
    }

    /// Lets a paused node run again (SIGCONT); harmless on a running one.
    pub fn resume(&self) {
        super::nodes::thaw(&self.dir);
    }
}

pub struct NsCluster {
    pub nodes: Vec<NsNode>,
    bridge: String,
    _turn: MutexGuard<'static, ()>,
}

impl NsCluster {
    /// Three nodes, clustered, each in a namespace of its own, with
    /// `pause_minority`: a node that sees only a minority stops serving.
    pub fn start() -> NsCluster {
        let turn = own_nodes_turn();
        let id = &uuid::Uuid::new_v4().simple().to_string()[..6];
        let subnet = 1 + u8::from_str_radix(&id[..2], 16).unwrap() % 250;
        let bridge = format!("dl{id}b");
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["link", "set", &bridge, "up"]);
        let mut cluster = NsCluster {
            nodes: Vec::new(),
            bridge,
            _turn: turn,
        };
        for k in 1..=3u8 {
            let node = cluster.add_node(id, subnet, k);
            cluster.nodes.push(node);
        }
        for node in &cluster.nodes {
            let pid_file = node.inside.join("pid").display().to_string();
            node.ctl(&["wait", &pid_file, "--timeout", "120"]);
        }
        let first = cluster.nodes[0].name.clone();
        for node in &cluster.nodes[1..] {
            node.ctl(&["stop_app"]);
            node.ctl(&["reset"]);
            node.ctl(&["join_cluster", &first]);
            node.ctl(&["start_app"]);
            node.ctl(&["await_startup"]);
        }
        cluster
    }

    /// Heals a partition the cluster kept after a fault: RabbitMQ 3.10 with
    /// `pause_minority` can leave a node that came back between two cuts of
    /// a flapping link running apart (its own metadata, blind to bindings
    /// made since on the others) instead of pausing it. Each node that sees
    /// a partition and runs with less than a majority gets the documented
    /// remedy: its app restarted, so that it takes the majority's metadata.
    /// Returns the nodes restarted.
    pub fn heal_partitions(&self) -> Vec<String> {
        let mut restarted = Vec::new();
        for node in &self.nodes {
            let output = node.try_ctl(&["cluster_status", "--formatter", "json"]);
            let Ok(status) = serde_json::from_slice::<serde_json::Value>(&output.stdout) else {
                continue;
            };
            let partitioned = status["partitions"]
                .as_object()
                .is_some_and(|partitions| !partitions.is_empty());
            let running = status["running_nodes"].as_array().map_or(0, Vec::len);
            if partitioned && running * 2 <= self.nodes.len() {
                node.ctl(&["stop_app"]);
                node.ctl(&["start_app"]);
                node.ctl(&["await_startup"]);
                restarted.push(node.name.clone());
            }
        }
        restarted
    }

    /// Every node's client address, as `amqp.uri` takes them, with `query`.
    pub fn uris(&self, query: &str) -> String {
        self.nodes
            .iter()
            .map(|node| format!("{}{query}", node.uri()))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn add_node(&self, id: &str, subnet: u8, k: u8) -> NsNode {
        let ns = format!("dltest{id}n{k}");
        let (cluster_link, client_link) = (format!("dl{id}c{k}"), format!("dl{id}a{k}"));
        let cluster_ip = format!("10.77.{subnet}.{k}");
        let client_ip = format!("10.78.{subnet}.{}", 4 * k + 2);
        ip(&["netns", "add", &ns]);
        ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]);
        for (link, address, bridged) in [
            (&cluster_link, format!("{cluster_ip}/24"), true),
            (&client_link, format!("{client_ip}/30"), false),
        ] {
            let peer = format!("{link}p");
            ip(&["link", "add", link, "type", "veth", "peer", "name", &peer]);
            ip(&["link", "set", &peer, "netns", &ns]);
            if bridged {
                ip(&["link", "set", link, "master", &self.bridge]);
            } else {
                let here = format!("10.78.{subnet}.{}/30", 4 * k + 1);
                ip(&["addr", "add", &here, "dev", link]);
            }
            ip(&["link", "set", link, "up"]);
            ip(&[
                "netns", "exec", &ns, "ip", "addr", "add", &address, "dev", &peer,
            ]);
            ip(&["netns", "exec", &ns, "ip", "link", "set", &peer, "up"]);
        }
        let name = format!("dltest-{id}n{k}@{cluster_ip}");
        let (dir, inside) = match rabbitmq_root() {
            None => {
                let dir = std::env::temp_dir().join(format!("dltest-ns-{id}n{k}"));
                (dir.clone(), dir)
            }
            Some(root) => {
                let inside = PathBuf::from(format!("/tmp/dltest-ns-{id}n{k}"));
                (root.join(inside.strip_prefix("/").unwrap()), inside)
            }
        };
        let node = NsNode {
            name,
            ns,
            client_ip,
            cluster_ip,
            cluster_link,
            client_link,
            dir,
            inside,
        };
        node.launch();
        node
    }
}

impl NsNode {
    fn launch(&self) {
        std::fs::create_dir_all(self.dir.join("mnesia")).unwrap();
        std::fs::create_dir_all(self.dir.join("log")).unwrap();
        std::fs::write(
            self.dir.join("rabbitmq.conf"),
            format!(
                "listeners.tcp.1 = {}:5672\nloopback_users = none\n\
                 cluster_partition_handling = pause_minority\nnet_ticktime = 10\n",
                self.client_ip
            ),
        )
        .unwrap();
        std::fs::write(self.dir.join("enabled_plugins"), "[].").unwrap();
        std::fs::write(
            self.dir.join("advanced.config"),
            "[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}].",
        )
        .unwrap();
        // Not the machine's rabbitmq-env.conf: it pins distribution to 127.0.0.1.
        std::fs::write(self.dir.join("env.conf"), "").unwrap();
        let mut chown = match rabbitmq_root() {
            None => Command::new("chown"),
            Some(root) => {
                let mut command = Command::new("chroot");
                command.arg(root).arg("chown");
                command
            }
        };
        let status = chown
            .args(["-R", "rabbitmq:rabbitmq", self.inside.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(status.success());
        let status = self.program("epmd").arg("-daemon").status().unwrap();
        assert!(status.success(), "epmd in {}", self.ns);
        let path = |leaf: &str| self.inside.join(leaf).display().to_string();
        let octets = self.cluster_ip.replace('.', ",");
        let status = self
            .program("rabbitmq-server")
            .arg("-detached")
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_PORT", "5672")
            .env("RABBITMQ_DIST_PORT", "25672")
            .env("RABBITMQ_MNESIA_BASE", path("mnesia"))
            .env("RABBITMQ_LOG_BASE", path("log"))
            .env("RABBITMQ_PID_FILE", path("pid"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", path("rabbitmq.conf"))
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", path("advanced.config"))
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                format!("-kernel inet_dist_use_interface {{{octets}}}"),
            )
            .status()
            .expect("rabbitmq-server runs");
        assert!(status.success(), "rabbitmq-server -detached in {}", self.ns);
    }

    /// Stops everything in the namespace (never with a pattern: the
    /// namespace shares the machine's processes) and deletes it.
    fn remove(&self) {
        self.resume();
        let _ = Command::new("ip")
            .args(["link", "set", &self.cluster_link, "up"])
            .status();
        let _ = self.try_ctl(&["stop"]);
        if let Ok(output) = Command::new("ip")
            .args(["netns", "pids", &self.ns])
            .output()
        {
            for pid in String::from_utf8_lossy(&output.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.cluster_link])
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.client_link])
            .status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        if std::env::var_os("DLTEST_KEEP_NODES").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for NsCluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            node.remove();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}
