//! The alert rules against a real Prometheus (Debian's): it scrapes a
//! running delayline every second and evaluates deploy/prometheus's rules
//! with their expressions as written and their timings shortened (`for`,
//! range windows and offsets in seconds, not minutes; the minute a level may
//! hold messages past its TTL, 2 s), while real faults happen: the ledger
//! refused its writes, a destination paused with tasks due, a consumer
//! rejecting until its messages park, the broker blocked by its memory alarm
//! (and tasks late behind it), the password delayline connects with changed,
//! a stalled broker and a lost message, a node's dead-letter workers
//! stopped, the ledger's table locked while thousands of tasks fall due.
//! Each matching alert fires, then resolves once the fault ends. The Grafana dashboard's every query returns data from the same
//! Prometheus, naming only metrics and labels delayline exports.

use std::collections::{BTreeSet, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use delayline::cascade::QueueType;
use lapin::BasicProperties;
use serde_json::{Value, json};

use crate::common::nodes::{BrokerNode, NodeOptions};
use crate::common::{
    Backend, POSTGRES_URL, TestApp, TestConsumer, free_port, psql, sample, test_settings,
    with_ledger,
};
use crate::faults::PgRole;
use crate::retries::{
    Worker, dead_letters_to, declare_queue, policy, publish, reject_all, settings_on,
};

/// The rules with the timings of a test: every `for` 2 s, every range 20 s,
/// a level's minute past its TTL 2 s.
fn rules_for_a_test() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/delayline-alerts.yml");
    let rules = std::fs::read_to_string(path).unwrap();
    let mut shortened = String::new();
    for line in rules.lines() {
        let line = match line.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 2s", &line[..line.len() - line.trim_start().len()]),
            None => shorten_ranges(line).replace(
                "delayline_level_queue_ttl_seconds + 60",
                "delayline_level_queue_ttl_seconds + 2",
            ),
        };
        shortened.push_str(&line);
        shortened.push('\n');
    }
    shortened
}

/// `[15m]`, `[10m]`, `[5m]` as `[20s]`, and `offset 15m` as `offset 20s`.
fn shorten_ranges(line: &str) -> String {
    let line = (1..=60).rev().fold(line.to_owned(), |line, minutes| {
        line.replace(&format!("offset {minutes}m"), "offset 20s")
    });
    shorten_windows(&line)
}

fn shorten_windows(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('[') {
        let Some(end) = rest[start..].find(']') else {
            break;
        };
        let inner = &rest[start + 1..start + end];
        out.push_str(&rest[..start]);
        match inner.strip_suffix('m').filter(|n| n.parse::<u32>().is_ok()) {
            Some(_) => out.push_str("[20s]"),
            None => out.push_str(&rest[start..=start + end]),
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

/// Debian's Prometheus, scraping `target` every second, killed when
/// dropped (its data in a folder of its own, removed then).
struct Prometheus {
    child: std::process::Child,
    folder: PathBuf,
    base: String,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let folder = std::env::temp_dir().join(format!("dltest-prometheus-{}", &id[..12]));
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("rules.yml"), rules_for_a_test()).unwrap();
        let config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: [rules.yml]\n\
             scrape_configs:\n  - job_name: delayline\n    static_configs: [{{targets: [\"{target}\"]}}]\n"
        );
        std::fs::write(folder.join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let child = std::process::Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                folder.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                folder.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("prometheus (Debian's package; tests/run installs it)");
        Prometheus {
            child,
            folder,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// The alerts firing now, by name, with their labels.
    async fn firing(&self) -> Vec<Value> {
        let url = format!("{}/api/v1/alerts", self.base);
        let Ok(answer) = reqwest::get(url).await else {
            return Vec::new();
        };
        let body: Value = answer.json().await.unwrap_or_default();
        let alerts = body["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        alerts
            .into_iter()
            .filter(|a| a["state"] == "firing")
            .collect()
    }

    /// Waits until alert `name` (with `labels`) fires (`true`) or has
    /// resolved (`false`), within `bound`; how long it took.
    async fn until(&self, name: &str, labels: &Value, fires: bool, bound: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let firing = self.firing().await.into_iter().any(|alert| {
                let own = &alert["labels"];
                own["alertname"] == name
                    && labels
                        .as_object()
                        .unwrap()
                        .iter()
                        .all(|(k, v)| &own[k] == v)
            });
            if firing == fires {
                return started.elapsed();
            }
            let what = if fires { "fire" } else { "resolve" };
            assert!(
                started.elapsed() < bound,
                "{name} did not {what} within {bound:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Prometheus {
    /// `path` of the HTTP API with `query` (URL-encoded), its `data`;
    /// fails on an error.
    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let url = reqwest::Url::parse_with_params(&format!("{}{path}", self.base), query).unwrap();
        let body: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
        assert_eq!(body["status"], "success", "{path} {query:?}: {body}");
        body["data"].clone()
    }

    /// Once it has scraped delayline twice: rates from then on see what
    /// changes.
    async fn scraping(&self) {
        let started = Instant::now();
        loop {
            let query = [("query", "count_over_time(up[1m])")];
            let url = format!("{}/api/v1/query", self.base);
            let url = reqwest::Url::parse_with_params(&url, query).unwrap();
            // Refused until it listens.
            let up: Value = match reqwest::get(url).await {
                Ok(answer) => answer.json().await.unwrap_or_default(),
                Err(_) => Value::Null,
            };
            let samples = up["data"]["result"][0]["value"][1].as_str().unwrap_or("0");
            if samples.parse::<u32>().unwrap_or(0) >= 2 {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "Prometheus does not scrape"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Every label name the series of `metric` have.
    async fn labels_of(&self, metric: &str) -> BTreeSet<String> {
        let series = self.api("/api/v1/series", &[("match[]", metric)]).await;
        let series = series.as_array().unwrap().iter();
        series
            .flat_map(|s| s.as_object().unwrap().keys().cloned())
            .collect()
    }
}

/// The metric names (`delayline_…`) and the label names (in `by (…)` and in
/// matchers) a PromQL expression uses.
fn names_in(expr: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let words = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
    let metrics = words
        .filter(|w| w.starts_with("delayline_"))
        .map(str::to_owned)
        .collect();
    let mut labels = BTreeSet::new();
    for (open, close) in [("by (", ')'), ("{", '}')] {
        for part in expr.split(open).skip(1) {
            let inside = part.split(close).next().unwrap();
            for item in inside.split(',') {
                let name = item.split(['=', '!', '~']).next().unwrap().trim();
                if !name.is_empty() {
                    labels.insert(name.to_owned());
                }
            }
        }
    }
    (metrics, labels)
}

/// Every query of the Grafana dashboard returns data from `prometheus`,
/// naming only metrics and labels delayline exports.
async fn every_dashboard_query_returns_data(prometheus: &Prometheus) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana/dashboards/delayline.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let answer = prometheus.api("/api/v1/query", &[("query", expr)]).await;
            let result = answer["result"].as_array().unwrap();
            assert!(
                !result.is_empty(),
                "{}: {expr} returned nothing",
                panel["title"]
            );
            let (metrics, labels) = names_in(expr);
            let mut known = BTreeSet::new();
            for metric in &metrics {
                let own = prometheus.labels_of(metric).await;
                assert!(!own.is_empty(), "{expr}: {metric} is not exported");
                known.extend(own);
            }
            for label in &labels {
                assert!(
                    known.contains(label),
                    "{expr}: no label {label} on {metrics:?}"
                );
            }
            queries += 1;
        }
    }
    assert!(queries >= 13, "{queries} queries");
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.folder);
    }
}

/// Fires within 30 s of the fault (scrape, evaluation, `for`), resolves
/// within 60 s of its end (a range of 20 s to leave).
const FIRES_WITHIN: Duration = Duration::from_secs(30);
const RESOLVES_WITHIN: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_alert_fires_under_its_real_fault_and_resolves_after_it() {
    let mut settings = settings_on(Backend::Postgres, vec![parks_at_once()]);
    let schema = settings.cascade.prefix.replace('-', "_");
    let role = PgRole(format!("{schema}_alerts"));
    psql(&format!(
        "CREATE ROLE {0} LOGIN; GRANT ALL ON SCHEMA {schema} TO {0}",
        role.0
    ));
    settings.store.url = format!(
        "postgres://{}@127.0.0.1:5432/test?options[search_path]={schema}",
        role.0
    )
    .into();
    // The levels' depths, which the dashboard shows.
    settings.metrics.queue_poll_ms = 1_000;
    let mut app = TestApp::spawn(settings).await;
    let prometheus = Prometheus::start(app.base.trim_start_matches("http://"));
    let none = json!({});

    // A destination paused with a task due behind it (and one that expires
    // there, and one refused: what the dashboard shows too).
    let cascade = app.cascade.clone();
    let exchange = cascade.business_exchange();
    let key = cascade.binding_key("alerts.paused");
    let mut paused = TestConsumer::bind_to(&mut app.cleanup, &cascade, exchange, &key).await;
    let limit = json!({"destinations": "alerts.paused", "paused": true});
    assert_eq!(app.put("/v1/limits/paused", &limit).await.0, 201);
    let task = json!({"destination": "alerts.paused", "delay_ms": 50});
    assert_eq!(app.post("/v1/tasks", &task).await.0, 202);
    let expiring = json!({"destination": "alerts.paused", "delay_ms": 50, "max_lateness_ms": 100});
    assert_eq!(app.post("/v1/tasks", &expiring).await.0, 202);
    let refused = json!({"destination": "alerts.paused", "delay_ms": -1});
    assert_eq!(app.post("/v1/tasks", &refused).await.0, 422);
    let by_limit = json!({"limit": "paused"});
    let took = prometheus
        .until(
            "DelaylineTasksWaitingBehindLimit",
            &by_limit,
            true,
            FIRES_WITHIN,
        )
        .await;
    println!("waiting behind a limit: fired after {took:?}");
    assert_eq!(app.post("/v1/limits/paused/resume", &none).await.0, 200);
    assert!(
        paused.next(Duration::from_secs(10)).await.is_some(),
        "released"
    );
    prometheus
        .until(
            "DelaylineTasksWaitingBehindLimit",
            &by_limit,
            false,
            RESOLVES_WITHIN,
        )
        .await;

    // A consumer rejecting until its message parks.
    let arguments = dead_letters_to(&app, &[]);
    let queue = declare_queue(&mut app, "alerting", arguments).await;
    let mut worker = Worker::on(&queue).await;
    publish(&queue, b"fails", BasicProperties::default()).await;
    reject_all(&mut worker, 1).await;
    let by_queue = json!({"queue": queue});
    let took = prometheus
        .until("DelaylineParkedGrowing", &by_queue, true, FIRES_WITHIN)
        .await;
    println!("parked: fired after {took:?}");
    prometheus
        .until("DelaylineParkedGrowing", &by_queue, false, RESOLVES_WITHIN)
        .await;

    // A task due to a destination no queue is bound for, and a dead letter
    // from a queue no policy covers: both fire; both resolve once the
    // unroutable message is requeued to a queue bound since and their
    // window has passed.
    let stray = json!({"destination": "alerts.nobody", "delay_ms": 50});
    assert_eq!(app.post("/v1/tasks", &stray).await.0, 202);
    let arguments = dead_letters_to(&app, &[]);
    let uncovered = declare_queue(&mut app, "uncovered", arguments).await;
    let mut rejecting = Worker::on(&uncovered).await;
    publish(&uncovered, b"nobody's", BasicProperties::default()).await;
    reject_all(&mut rejecting, 1).await;
    for alert in ["DelaylineUnroutable", "DelaylineRetryRefused"] {
        let took = prometheus.until(alert, &none, true, FIRES_WITHIN).await;
        println!("{alert}: fired after {took:?}");
    }
    // The operator binds a queue for the destination and requeues.
    let key = cascade.binding_key("alerts.nobody");
    let mut bound = TestConsumer::bind_to(&mut app.cleanup, &cascade, exchange, &key).await;
    let (status, requeued) = app.post("/v1/unroutable/requeue", &none).await;
    assert_eq!(
        (status, &requeued["still_unroutable"]),
        (200, &json!(0)),
        "{requeued}"
    );
    assert!(
        bound.next(Duration::from_secs(10)).await.is_some(),
        "requeued"
    );
    for alert in ["DelaylineUnroutable", "DelaylineRetryRefused"] {
        prometheus.until(alert, &none, false, RESOLVES_WITHIN).await;
    }

    // The ledger refused its writes: not ready either.
    let writes = "INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA";
    psql(&format!("REVOKE {writes} {schema} FROM {}", role.0));
    let took = prometheus
        .until("DelaylineLedgerCannotWrite", &none, true, FIRES_WITHIN)
        .await;
    println!("the ledger cannot write: fired after {took:?}");
    prometheus
        .until("DelaylineNotReady", &none, true, FIRES_WITHIN)
        .await;
    psql(&format!("GRANT {writes} {schema} TO {}", role.0));
    prometheus
        .until("DelaylineLedgerCannotWrite", &none, false, RESOLVES_WITHIN)
        .await;
    prometheus
        .until("DelaylineNotReady", &none, false, RESOLVES_WITHIN)
        .await;
    every_dashboard_query_returns_data(&prometheus).await;
    app.stop().await.unwrap();
}

/// A policy that parks at the first failure (`policy`'s but one attempt).
fn parks_at_once() -> delayline::ingress::RetrySettings {
    delayline::ingress::RetrySettings {
        max_attempts: 1,
        ..policy(&["alerting"])
    }
}

/// The broker's memory alarm blocks publishing: not connected as far as
/// delayline can work, so DelaylineBrokerDisconnected fires; tasks that
/// fall due meanwhile are delivered late once it clears (more than the
/// rule's 5 s), so DelaylineTasksLate fires; both resolve. On a node of
/// the test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_broker_fires_broker_disconnected_and_tasks_late_until_it_is_cleared() {
    let node = BrokerNode::start(&NodeOptions::default());
    let mut settings = settings_on(Backend::Sqlite, Vec::new());
    settings.amqp.uri = node.uri().into();
    let app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("alerts.late");
    let mut consumer =
        TestConsumer::on_node(&node.uri(), &app.cascade, &key, QueueType::Quorum).await;
    let prometheus = Prometheus::start(app.base.trim_start_matches("http://"));
    let none = json!({});
    node.raise_memory_alarm();
    let raised = Instant::now();
    let task = json!({"destination": "alerts.late", "delay_ms": 100});
    for _ in 0..3 {
        assert_eq!(app.post("/v1/tasks", &task).await.0, 202);
    }
    let took = prometheus
        .until("DelaylineBrokerDisconnected", &none, true, FIRES_WITHIN)
        .await;
    println!("a blocked broker: fired after {took:?}");
    // Due 100 ms after they were posted, they come 7 s late at least.
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(raised.elapsed())).await;
    node.clear_memory_alarm();
    for _ in 0..3 {
        let late = consumer.next(Duration::from_secs(30)).await;
        assert!(late.is_some(), "delivered once the alarm cleared");
    }
    let took = prometheus
        .until("DelaylineTasksLate", &none, true, FIRES_WITHIN)
        .await;
    println!("tasks late: fired after {took:?}");
    prometheus
        .until("DelaylineBrokerDisconnected", &none, false, RESOLVES_WITHIN)
        .await;
    prometheus
        .until("DelaylineTasksLate", &none, false, RESOLVES_WITHIN)
        .await;
    app.stop().await.unwrap();
}

/// The password delayline connects with is changed on the broker and its
/// connection closed: the broker refuses it, so DelaylineBrokerMisconfigured
/// fires (past `amqp.misconfiguration_grace_ms`); the password restored,
/// delayline connects again and it resolves. On a node of the test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_password_fires_broker_misconfigured_until_it_is_restored() {
    let node = BrokerNode::start(&NodeOptions::default());
    node.ctl(&["add_user", "alerting", "first-secret"]);
    node.ctl(&["set_permissions", "-p", "/", "alerting", ".*", ".*", ".*"]);
    let mut settings = settings_on(Backend::Sqlite, Vec::new());
    let uri = node.uri().replace("guest:guest", "alerting:first-secret");
    settings.amqp.uri = uri.into();
    settings.amqp.misconfiguration_grace_ms = 500;
    settings.amqp.reconnect_max_backoff_ms = 1_000;
    let app = TestApp::spawn(settings).await;
    let prometheus = Prometheus::start(app.base.trim_start_matches("http://"));
    let none = json!({});
    node.ctl(&["change_password", "alerting", "rotated"]);
    let name = format!("delayline {}", app.cascade.prefix());
    assert!(node.close_connections_named(&name) > 0);
    let took = prometheus
        .until("DelaylineBrokerMisconfigured", &none, true, FIRES_WITHIN)
        .await;
    println!("a refused password: fired after {took:?}");
    node.ctl(&["change_password", "alerting", "first-secret"]);
    prometheus
        .until(
            "DelaylineBrokerMisconfigured",
            &none,
            false,
            RESOLVES_WITHIN,
        )
        .await;
    app.stop().await.unwrap();
}

/// A broker that stalls for 1.5 s under a publish (SIGSTOP: as a disk or
/// a garbage collection can) confirms it that late, so DelaylineConfirmsSlow
/// fires; a task the broker then loses (purged from level 1 while it waits
/// there) is published again by the resender, so DelaylineTasksResent
/// fires. Both resolve once their window has passed. On a node of the
/// test's own, with a chain of 1 s units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_broker_and_a_lost_message_fire_confirms_slow_and_tasks_resent() {
    let node = BrokerNode::start(&NodeOptions::default());
    let mut settings = with_ledger(test_settings(8, 1000, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = node.uri().into();
    settings.store.resend_after_ms = 1_500;
    // No probes: the purge is a lost task, not a stranded level.
    settings.cascade.level_probe_ms = 0;
    let app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("alerts.lost");
    let mut consumer =
        TestConsumer::on_node(&node.uri(), &app.cascade, &key, QueueType::Quorum).await;
    let prometheus = Prometheus::start(app.base.trim_start_matches("http://"));
    let none = json!({});
    // A rate needs a sample from before the fault.
    prometheus.scraping().await;

    let stalled = json!({"destination": "alerts.lost", "delay_ms": 100});
    let paused = node.pause();
    let (answer, ()) = tokio::join!(app.post("/v1/tasks", &stalled), async move {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        drop(paused);
    });
    assert_eq!(answer.0, 202, "{}", answer.1);
    let took = prometheus
        .until("DelaylineConfirmsSlow", &none, true, FIRES_WITHIN)
        .await;
    println!("confirms slow: fired after {took:?}");

    let lost = json!({"destination": "alerts.lost", "delay_ms": 3_000});
    assert_eq!(app.post("/v1/tasks", &lost).await.0, 202);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let level_1 = app.cascade.level_queue(1);
    let purged = consumer
        .channel
        .queue_purge(level_1.as_str().into(), Default::default());
    assert_eq!(purged.await.unwrap(), 1, "the task waits in level 1");
    let took = prometheus
        .until("DelaylineTasksResent", &none, true, FIRES_WITHIN)
        .await;
    println!("tasks resent: fired after {took:?}");
    for _ in 0..2 {
        let arrived = consumer.next(Duration::from_secs(20)).await;
        assert!(
            arrived.is_some(),
            "the stalled task and the lost one arrive"
        );
    }
    for alert in ["DelaylineConfirmsSlow", "DelaylineTasksResent"] {
        prometheus.until(alert, &none, false, RESOLVES_WITHIN).await;
    }
    app.stop().await.unwrap();
}

/// A node's quorum-queue dead-letter workers stop for good (the stand-in of
/// `strand.rs` for RabbitMQ #16652, a worker stopped after a node loss):
/// what expires in a level is held there, so DelaylineLevelHoldsMessages
/// fires, and the probes through a level are overtaken, so delayline takes
/// the level over and DelaylineLevelStranded fires. Mended as the runbook
/// says (the workers' supervisor started again, each level's Raft member
/// restarted), the levels are handed back after `stranded_recheck_ms` and
/// hold nothing: both resolve, and every task arrives once, never early.
/// On a node of the test's own, with the management API (only it counts
/// held messages).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_that_stops_dead_lettering_fires_stranded_and_holds_until_mended() {
    let node = BrokerNode::start(&NodeOptions {
        management: true,
        ..NodeOptions::default()
    });
    // 8 levels of 50 ms, probed every 200 ms with a margin of a second.
    let mut settings = with_ledger(test_settings(8, 50, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = node.uri().into();
    settings.cascade.level_probe_ms = 200;
    settings.cascade.stranded_margin_ms = 1_000;
    settings.cascade.stranded_recheck_ms = 5_000;
    settings.metrics.queue_poll_ms = 250;
    let management = node.management_port.unwrap();
    settings.metrics.management_url = format!("http://guest:guest@127.0.0.1:{management}").into();
    let app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("alerts.held");
    let mut consumer =
        TestConsumer::on_node(&node.uri(), &app.cascade, &key, QueueType::Quorum).await;
    let prometheus = Prometheus::start(app.base.trim_start_matches("http://"));
    let none = json!({});
    let stopped = node.ctl(&["eval", crate::strand::STOP_DEAD_LETTERING]);
    assert_eq!(stopped.trim(), "undefined", "the stand-in took effect");
    let mut ids = HashSet::new();
    for _ in 0..5 {
        // 60 units: levels 5, 4, 3 and 2.
        let task = json!({"destination": "alerts.held", "delay_ms": 3_000});
        let (status, body) = app.post("/v1/tasks", &task).await;
        assert_eq!(status, 202, "{body}");
        ids.insert(body["id"].as_str().unwrap().to_owned());
    }
    // The management API's counts lag by up to its statistics interval (5 s).
    for alert in ["DelaylineLevelHoldsMessages", "DelaylineLevelStranded"] {
        let took = prometheus.until(alert, &none, true, 2 * FIRES_WITHIN).await;
        println!("{alert}: fired after {took:?}");
    }
    let started = node.ctl(&["eval", crate::strand::START_DEAD_LETTERING]);
    assert!(started.contains("ok"), "{started}");
    for level in 0..app.cascade.levels() {
        node.release_stranded_level(&app.cascade.level_queue(level));
    }
    consumer
        .expect_each_once_never_early(ids, Duration::from_secs(40))
        .await;
    for alert in ["DelaylineLevelHoldsMessages", "DelaylineLevelStranded"] {
        prometheus.until(alert, &none, false, RESOLVES_WITHIN).await;
    }
    app.stop().await.unwrap();
}

/// An operator's session holding a table of the PostgreSQL ledger locked (as
/// a migration or a `VACUUM FULL` does) until it is let go; killed with the
/// test if it fails.
struct TableLock(std::process::Child);

impl TableLock {
    /// Locks `table` (schema-qualified) and returns once the lock is held.
    fn take(table: &str) -> TableLock {
        let mut child = std::process::Command::new("psql")
            .args([POSTGRES_URL, "-q", "-v", "ON_ERROR_STOP=1"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("psql runs");
        let stdin = child.stdin.as_mut().unwrap();
        writeln!(stdin, "BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE;").unwrap();
        stdin.flush().unwrap();
        let lock = TableLock(child);
        let held = format!(
            "SELECT count(*) FROM pg_locks WHERE relation = '{table}'::regclass \
             AND mode = 'AccessExclusiveLock' AND granted"
        );
        let started = Instant::now();
        while psql_answer(&held) != "1" {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{table} not locked"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        lock
    }

    /// Commits, which lets the lock go.
    fn release(mut self) {
        let mut stdin = self.0.stdin.take().unwrap();
        writeln!(stdin, "COMMIT;").unwrap();
        drop(stdin);
        assert!(
            self.0.wait().unwrap().success(),
            "the locking session failed"
        );
    }
}

impl Drop for TableLock {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What `sql` answers (one value), as psql prints it.
fn psql_answer(sql: &str) -> String {
    let output = std::process::Command::new("psql")
        .args([POSTGRES_URL, "-At", "-c", sql])
        .output()
        .expect("psql runs");
    assert!(output.status.success(), "{sql}");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// `count` tasks to `destination` due at `due_ms`, in batches: their ids.
async fn post_due_at(
    app: &TestApp,
    destination: &str,
    count: usize,
    due_ms: u64,
) -> HashSet<String> {
    let at = delayline::clock::format_epoch_ms(due_ms);
    let mut ids = HashSet::with_capacity(count);
    while ids.len() < count {
        let tasks: Vec<Value> = (0..1_000.min(count - ids.len()))
            .map(|_| json!({"destination": destination, "deliver_at": at}))
            .collect();
        let (status, batch) = app.post("/v1/tasks/batch", &json!({"tasks": tasks})).await;
        assert_eq!(status, 200, "{batch}");
        for result in batch["results"].as_array().unwrap() {
            let id = result["task"]["id"].as_str();
            ids.insert(id.unwrap_or_else(|| panic!("refused: {result}")).to_owned());
        }
    }
    ids
}

/// More than the rule's 10,000, with room for what the stage has taken.
const PILED_UP: usize = 11_000;

/// The ledger's `tasks` table locked by an operator's session while 11,000
/// tasks fall due at one instant: the release stage cannot take them, so
/// the release queue grows past the rule's 10,000 and
/// DelaylineReleaseQueueGrowing fires; the resender's pass waits the lock
/// out, so DelaylineResendPassSlow fires once it is let go. Meanwhile
/// `/readyz` and `/metrics` answer within `store.health_timeout_ms`
/// (without the bound the scrape waited for the lock, and Prometheus lost
/// every series just then). Every task arrives once, never early; both
/// alerts resolve. On a node of the test's own, with the management API
/// (which counts the messages the stage holds unacknowledged as well).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_ledger_fires_release_queue_growing_and_resend_pass_slow_and_is_still_scraped() {
    let node = BrokerNode::start(&NodeOptions {
        management: true,
        ..NodeOptions::default()
    });
    let mut settings = with_ledger(test_settings(8, 100, QueueType::Classic), Backend::Postgres);
    settings.amqp.uri = node.uri().into();
    settings.metrics.queue_poll_ms = 500;
    let management = node.management_port.unwrap();
    settings.metrics.management_url = format!("http://guest:guest@127.0.0.1:{management}").into();
    // Due at one instant, they come through the levels, not staged ahead.
    settings.cascade.burst_level_rate = 0;
    // The pass runs every second; no task is overdue long enough to be resent.
    settings.store.resend_after_ms = 120_000;
    // Within Prometheus's scrape timeout here (its interval, 1 s).
    settings.store.health_timeout_ms = 300;
    let table = format!("{}.tasks", settings.cascade.prefix.replace('-', "_"));
    let app = TestApp::spawn(settings).await;
    let key = app.cascade.binding_key("alerts.locked");
    let mut consumer =
        TestConsumer::on_node(&node.uri(), &app.cascade, &key, QueueType::Classic).await;
    let prometheus = Prometheus::start(app.base.trim_start_matches("http://"));
    let none = json!({});
    prometheus.scraping().await;

    let due_ms = delayline::testkit::now_ms() + 20_000;
    let ids = post_due_at(&app, "alerts.locked", PILED_UP, due_ms).await;
    let lock = TableLock::take(&table);
    let locked = Instant::now();
    assert!(
        delayline::testkit::now_ms() + 1_000 < due_ms,
        "posting took too long: the tasks fell due before the lock"
    );
    let asked = Instant::now();
    let (status, ready) = app.get("/readyz").await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["error"]["code"], "ledger_unavailable", "{ready}");
    let scrape = app.scrape().await;
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "/readyz and /metrics waited for the lock: {:?}",
        asked.elapsed()
    );
    assert_eq!(sample(&scrape, "delayline_ledger_writable"), Some(0.0));
    let took = prometheus
        .until(
            "DelaylineReleaseQueueGrowing",
            &none,
            true,
            Duration::from_secs(60),
        )
        .await;
    println!("the release queue growing: fired after {took:?}");
    // Held 22 s: the resend pass's window (20 s here) then holds slow passes only.
    tokio::time::sleep(Duration::from_secs(22).saturating_sub(locked.elapsed())).await;
    lock.release();
    let took = prometheus
        .until("DelaylineResendPassSlow", &none, true, FIRES_WITHIN)
        .await;
    println!("the resend pass slow: fired after {took:?}");
    consumer
        .expect_each_once_never_early(ids, Duration::from_secs(60))
        .await;
    for alert in ["DelaylineReleaseQueueGrowing", "DelaylineResendPassSlow"] {
        prometheus.until(alert, &none, false, RESOLVES_WITHIN).await;
    }
    app.stop().await.unwrap();
}

/// Every alert of the rules is fired by a test of this file: a new rule
/// comes with its real fault.
#[test]
fn every_alert_of_the_rules_is_fired_here() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules =
        std::fs::read_to_string(root.join("deploy/prometheus/delayline-alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(root.join("tests/it/alerts.rs")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("- alert: "))
        .map(str::trim)
        .collect();
    assert_eq!(alerts.len(), 15, "{alerts:?}");
    for alert in alerts {
        assert!(
            tests.contains(&format!("\"{alert}\"")),
            "no test fires {alert}"
        );
    }
}
