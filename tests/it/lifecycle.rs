//! The real binary: SIGTERM drains in-flight publishes before it exits, and
//! after SIGKILL the next start forwards what the ledger kept.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use crate::common::{
    Backend, Cleanup, TestApp, TestConsumer, TestUser, amqp_uri, free_port, run_delayline,
    serve_command, spawn_binary, terminate, test_settings, wait_ready_at, with_ledger,
};
use delayline::broker::{connect, provision, queue_state};
use delayline::cascade::QueueType;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_publishes_and_every_accepted_task_arrives() {
    let settings = test_settings(3, 10, QueueType::Quorum);
    let cascade = settings.cascade().unwrap();
    let mut cleanup = Cleanup::for_cascade(&cascade);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = spawn_binary(&settings, port);
    let http = reqwest::Client::new();
    wait_ready_at(&http, &base).await;
    let key = cascade.binding_key("drain");
    let exchange = cascade.business_exchange().to_owned();
    let mut consumer = TestConsumer::bind_to(&mut cleanup, &cascade, &exchange, &key).await;

    let requests: Vec<_> = (0..200)
        .map(|n| {
            let http = http.clone();
            let url = format!("{base}/v1/tasks");
            tokio::spawn(async move {
                let response = http
                    .post(url)
                    .json(
                        &json!({"destination": "drain", "delay_ms": n % 40, "id": format!("t{n}")}),
                    )
                    .send()
                    .await
                    .ok()?;
                if response.status() != 202 {
                    return None;
                }
                let body: Value = response.json().await.ok()?;
                Some(body["id"].as_str()?.to_owned())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    terminate(&child);

    let mut accepted = HashSet::new();
    for request in requests {
        if let Some(id) = request.await.unwrap() {
            accepted.insert(id);
        }
    }
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(
        !accepted.is_empty(),
        "no request was accepted before the signal"
    );
    eprintln!("{} of 200 tasks accepted around the signal", accepted.len());

    while !accepted.is_empty() {
        let message = consumer
            .next(Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("{} accepted tasks never arrived", accepted.len()));
        accepted.remove(message.message_id().as_str());
    }
}

/// A service on the SQLite ledger whose broker user may not touch the
/// broker (every task it takes stays pending until `user.grant()`), and a
/// consumer of `destination`'s tasks (bound after the cleanup, so that it
/// goes first).
struct CutOff {
    user: TestUser,
    settings: delayline::config::Settings,
    consumer: TestConsumer,
    _cleanup: Cleanup,
    admin: lapin::Connection,
}

async fn cut_off(destination: &str) -> CutOff {
    cut_off_on(destination, Backend::Sqlite).await
}

async fn cut_off_on(destination: &str, backend: Backend) -> CutOff {
    let user = TestUser::create();
    user.revoke();
    let mut settings = with_ledger(test_settings(5, 50, QueueType::Quorum), backend);
    settings.amqp.uri = user.uri().into();
    let cascade = settings.cascade().unwrap();
    let mut cleanup = Cleanup::for_settings(&settings);
    // The consumer's queue needs the business exchange before the service made it.
    let admin = connect(amqp_uri(), "delayline test provision")
        .await
        .unwrap();
    provision(&admin, &cascade.plan()).await.unwrap();
    let exchange = cascade.business_exchange().to_owned();
    let key = cascade.binding_key(destination);
    let consumer = TestConsumer::bind_to(&mut cleanup, &cascade, &exchange, &key).await;
    CutOff {
        user,
        settings,
        consumer,
        _cleanup: cleanup,
        admin,
    }
}

/// A service cut off from the broker takes a task to `destination` for
/// each of `delays_ms` (each pending) and is killed; its port and the ids.
async fn pending_then_killed(
    settings: &delayline::config::Settings,
    destination: &str,
    delays_ms: &[u64],
) -> (u16, HashSet<String>) {
    let (mut child, port, accepted) =
        pending_in_a_cut_off_service(settings, destination, delays_ms).await;
    child.kill().await.unwrap();
    (port, accepted)
}

/// A service cut off from the broker, which took a task to `destination`
/// for each of `delays_ms` (each pending): its process, its port and the ids.
async fn pending_in_a_cut_off_service(
    settings: &delayline::config::Settings,
    destination: &str,
    delays_ms: &[u64],
) -> (tokio::process::Child, u16, HashSet<String>) {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let child = spawn_binary(settings, port);
    assert_eq!(wait_ready_at(&http, &base).await["broker"], "disconnected");
    let mut accepted = HashSet::new();
    for delay_ms in delays_ms {
        let response = http
            .post(format!("{base}/v1/tasks"))
            .json(&json!({"destination": destination, "delay_ms": delay_ms}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["state"], "pending", "{body}");
        accepted.insert(body["id"].as_str().unwrap().to_owned());
    }
    (child, port, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_the_next_start_forwards_every_pending_task() {
    let CutOff {
        user,
        settings,
        _cleanup,
        mut consumer,
        admin,
    } = cut_off("crash").await;
    let delays: Vec<u64> = (0..20).map(|n| n * 40).collect();
    let (port, accepted) = pending_then_killed(&settings, "crash", &delays).await;

    user.grant();
    let _child = spawn_binary(&settings, port);
    consumer
        .expect_each_once_never_early(accepted, Duration::from_secs(20))
        .await;
    let _ = admin.close(200, "done".into()).await;
}

/// A SIGKILL while tasks were being published leaves them pending under a
/// lease (`amqp.confirm_timeout_ms` + 2 s) that no live process holds. The
/// next start takes the leases over at once: each task arrives within the
/// restart and 2 s of it, never early, not after the lease (set here a
/// minute ahead, as a slow confirm would leave it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_leased_tasks_go_on_at_the_restart_not_after_their_lease() {
    let CutOff {
        user,
        settings,
        _cleanup,
        mut consumer,
        admin,
    } = cut_off("leased").await;
    let delays: Vec<u64> = (0..10).map(|n| n * 100).collect();
    let (port, accepted) = pending_then_killed(&settings, "leased", &delays).await;
    // Each as a publish cut off before its confirm leaves it: leased.
    let ledger = std::path::Path::new(&settings.store.data_dir).join("delayline.db");
    let leased = rusqlite::Connection::open(&ledger)
        .unwrap()
        .execute(
            "UPDATE tasks SET next_attempt_at_ms = ?1 WHERE state = 'pending'",
            [delayline::testkit::now_ms() as i64 + 60_000],
        )
        .unwrap();
    assert_eq!(leased, 10);

    user.grant();
    let _child = spawn_binary(&settings, port);
    let base = format!("http://127.0.0.1:{port}");
    crate::common::wait_connected_at(&reqwest::Client::new(), &base).await;
    let back = std::time::Instant::now();
    consumer
        .expect_each_once_never_early(accepted, Duration::from_secs(20))
        .await;
    let after = back.elapsed();
    // 2 s, and a margin for a loaded machine.
    assert!(
        after < Duration::from_secs(5),
        "the last leased task arrived {after:?} after the service was back"
    );
    let _ = admin.close(200, "done".into()).await;
}

/// On a shared ledger (PostgreSQL), what a killed replica had leased goes
/// on through the replicas that live, at once (its lease lock went with
/// its connection), not after the lease; while it lived, nobody took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_s_leased_tasks_go_on_through_another_at_once_not_after_their_lease() {
    let CutOff {
        user: _cut_off,
        settings,
        _cleanup,
        mut consumer,
        admin,
    } = cut_off_on("leased-pg", Backend::Postgres).await;
    let delays: Vec<u64> = (0..10).map(|n| n * 100).collect();
    let (mut cut_off_replica, _, accepted) =
        pending_in_a_cut_off_service(&settings, "leased-pg", &delays).await;
    // Each as a publish awaiting its confirm leaves it: leased a minute on.
    let until = delayline::testkit::now_ms() + 60_000;
    crate::common::ledger_sql(
        &settings,
        Backend::Postgres,
        &format!("UPDATE tasks SET next_attempt_at_ms = {until} WHERE state = 'pending'"),
    );

    // A replica that can reach the broker leaves a live replica's leases alone.
    let mut connected = settings.clone();
    connected.amqp.uri = amqp_uri().to_owned().into();
    let other = TestApp::start_sharing(connected).await;
    other.wait_ready().await;
    assert!(
        consumer.next(Duration::from_secs(3)).await.is_none(),
        "a live replica's leased task was taken"
    );

    cut_off_replica.kill().await.unwrap();
    let killed = std::time::Instant::now();
    consumer
        .expect_each_once_never_early(accepted, Duration::from_secs(20))
        .await;
    let after = killed.elapsed();
    // The lease watch looks once a second; a margin for a loaded machine.
    assert!(
        after < Duration::from_secs(5),
        "the last leased task arrived {after:?} after its replica was killed"
    );
    other.stop().await.unwrap();
    let _ = admin.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_task_id_on_every_line_about_a_task() {
    let mut settings = with_ledger(test_settings(3, 10, QueueType::Classic), Backend::Sqlite);
    // Nothing listens there: the task is kept pending, and says so in the log.
    settings.amqp.uri = "amqp://guest:guest@127.0.0.1:1/%2f".to_owned().into();
    let _cleanup = Cleanup::for_settings(&settings);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let child = serve_command(&settings, port)
        .env("DELAYLINE__LOG__FORMAT", "json")
        .env("DELAYLINE__LOG__FILTER", "info,delayline=debug,lapin=off")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    wait_ready_at(&http, &base).await;
    let accepted: Value = http
        .post(format!("{base}/v1/tasks"))
        .json(&json!({"destination": "logged", "delay_ms": 50}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(accepted["state"], "pending");
    let id = accepted["id"].as_str().unwrap().to_owned();

    let log = stop_and_read_log(child).await;
    let lines: Vec<Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(
        lines
            .iter()
            .all(|l| l["timestamp"].is_string() && l["level"].is_string())
    );
    let about_the_task: Vec<&Value> = lines
        .iter()
        .filter(|l| l.to_string().contains(&id))
        .collect();
    assert!(!about_the_task.is_empty(), "no line names the task:\n{log}");
    for line in about_the_task {
        assert_eq!(line["task_id"], id.as_str(), "{line}");
    }
    let kept = lines
        .iter()
        .find(|l| l["message"] == "kept pending for the forwarder")
        .unwrap_or_else(|| panic!("no line says the task was kept:\n{log}"));
    assert_eq!(kept["task_id"], id.as_str());
    // The first line says what this instance serves, field by field.
    let first = &lines[0];
    assert_eq!(first["prefix"], settings.cascade.prefix.as_str(), "{first}");
    assert_eq!(
        first["business_exchange"],
        settings.cascade().unwrap().business_exchange()
    );
    assert_eq!(
        (&first["version"], &first["levels"], &first["unit_ms"]),
        (&json!(1), &json!(3), &json!(10))
    );
    assert_eq!(first["queue_type"], "classic");
    assert!(
        first["ledger"].as_str().unwrap().starts_with("sqlite://"),
        "{first}"
    );
}

/// The real binary's log from its start until it was ready, and its stop.
async fn serve_until_ready_and_read_log(settings: &delayline::config::Settings) -> String {
    let port = free_port();
    let child = serve_command(settings, port)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready_at(&reqwest::Client::new(), &format!("http://127.0.0.1:{port}")).await;
    stop_and_read_log(child).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_carry_no_colours_off_a_terminal_and_start_with_the_chain() {
    let settings = with_ledger(test_settings(3, 10, QueueType::Quorum), Backend::Sqlite);
    let _cleanup = Cleanup::for_settings(&settings);
    let log = serve_until_ready_and_read_log(&settings).await;
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a piped log:\n{log}"
    );
    let first = log.lines().next().unwrap();
    let chain = format!(
        "chain {}.v1, 3 levels of 10 ms (quorum queues)",
        settings.cascade.prefix
    );
    assert!(first.contains(&chain), "{first}");
}

/// On PostgreSQL the service says at start when the server runs without
/// autovacuum (the ledger's dead rows would pile up and slow admission),
/// and only then: this machine's test server has it off, a production
/// server on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgresql_server_without_autovacuum_is_named_at_start() {
    use sqlx::Connection;
    let settings = with_ledger(test_settings(3, 10, QueueType::Quorum), Backend::Postgres);
    let _cleanup = Cleanup::for_settings(&settings);
    let mut server = sqlx::PgConnection::connect(settings.store.url.expose())
        .await
        .unwrap();
    let autovacuum: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(&mut server)
        .await
        .unwrap();
    let log = serve_until_ready_and_read_log(&settings).await;
    let warned = log.contains("PostgreSQL runs with autovacuum off");
    assert_eq!(
        warned,
        autovacuum == "off",
        "autovacuum {autovacuum}:\n{log}"
    );
}

/// `delayline migrate` on a new ledger says from which schema version to
/// which, and run again that there was nothing to do; neither run warns,
/// and on PostgreSQL neither passes on the server's notices (the
/// migrations' `CREATE … IF NOT EXISTS` said "already exists" at every
/// start). (A new ledger migrates in well under sqlx's one second, so this
/// cannot show its slow-statement warning off; that was shown by hand on a
/// large one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_says_which_versions_it_went_between_then_that_it_is_up_to_date() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let settings = with_ledger(test_settings(3, 10, QueueType::Quorum), backend);
        let _cleanup = Cleanup::for_settings(&settings);
        let (ok, first) = run_delayline(&settings, &["migrate"]).await;
        assert!(ok, "{first}");
        let latest = first
            .split("schema migrated from version 0 to ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|version| version.parse::<u32>().ok())
            .unwrap_or_else(|| panic!("no versions in: {first}"));
        assert!(latest >= 14, "{first}");
        let (ok, again) = run_delayline(&settings, &["migrate"]).await;
        assert!(ok, "{again}");
        assert!(
            again.contains(&format!("schema up to date (version {latest})")),
            "{again}"
        );
        for output in [&first, &again] {
            assert!(!output.contains("WARN"), "{backend:?}: {output}");
            assert!(!output.contains("already exists"), "{backend:?}: {output}");
        }
    }
}

/// SIGTERMs the service and returns what it logged (its piped stderr).
async fn stop_and_read_log(child: tokio::process::Child) -> String {
    terminate(&child);
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("stopped")
        .unwrap();
    String::from_utf8(output.stderr).unwrap()
}

/// The code block of `language` that follows `heading` in the README.
pub(crate) fn readme_block(heading: &str, language: &str, nth: usize) -> String {
    doc_block("README.md", heading, language, nth)
}

/// The `nth` code block of `language` that follows `heading` in `document`
/// (a path from the repository's root): the examples run as written.
pub(crate) fn doc_block(document: &str, heading: &str, language: &str, nth: usize) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(document);
    let text = std::fs::read_to_string(&path).unwrap();
    let section = text
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("{document} has no section {heading:?}"));
    let fence = format!("```{language}\n");
    let block = section.split(&fence).nth(nth + 1).expect("the code block");
    let code = block.split("```").next().unwrap();
    // Blocks inside a numbered list are indented.
    code.lines()
        .map(|line| line.strip_prefix("   ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_runs_as_written() {
    // Default levels and unit, a ledger: the service a user starts.
    let mut settings = with_ledger(test_settings(32, 100, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.confirm_timeout_ms = 10_000;
    let mut cleanup = Cleanup::for_settings(&settings);
    let port = free_port();
    let child = spawn_binary(&settings, port);
    // As step 1 takes a moment: the exchanges are declared once connected.
    crate::common::wait_connected_at(&reqwest::Client::new(), &format!("http://127.0.0.1:{port}"))
        .await;

    // The names follow the prefix step 1 exports, and the port its bind:
    // only the broker's address is substituted.
    let prefix = settings.cascade.prefix.clone();
    let bind = format!("127.0.0.1:{port}");
    let step_one = readme_block("## Quick start", "sh", 0);
    assert!(
        step_one.contains("export DELAYLINE__CASCADE__PREFIX=")
            && step_one.contains("export DELAYLINE__HTTP__BIND="),
        "step 1 gives an instance names of its own: {step_one}"
    );
    let queue = format!("{prefix}.invoices");
    cleanup.queues.push(queue.clone());
    let consumer = readme_block("## Quick start", "python", 0)
        .replace("amqp://guest:guest@127.0.0.1:5672/%2f", amqp_uri());
    let mut python = tokio::process::Command::new(crate::common::python::tool("python"))
        .env("DELAYLINE__CASCADE__PREFIX", &prefix)
        .arg("-c")
        .arg(&consumer)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    // The queue is bound once it exists.
    let probe = connect(amqp_uri(), "delayline test readme").await.unwrap();
    let bound = async {
        while queue_state(&probe, &queue).await.unwrap().is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(20), bound)
        .await
        .is_err()
    {
        python.kill().await.unwrap();
        let output = python.wait_with_output().await.unwrap();
        panic!(
            "the README's consumer never declared its queue: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // With the ledger, /readyz is ready before RabbitMQ is connected (tasks
    // would wait as pending); the README's answer shows a connected service.
    crate::common::wait_connected_at(&reqwest::Client::new(), &format!("http://127.0.0.1:{port}"))
        .await;

    let curl = readme_block("## Quick start", "sh", 1);
    let posted = tokio::process::Command::new("sh")
        .env("DELAYLINE__HTTP__BIND", &bind)
        .arg("-c")
        .arg(&curl)
        .output()
        .await
        .unwrap();
    let answer: Value = serde_json::from_slice(&posted.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&posted.stdout)));
    assert_eq!(answer["state"], "scheduled", "{answer}");
    assert_eq!(answer["delay_ms"], 2000);
    let id = answer["id"].as_str().unwrap().to_owned();

    let mut lines = tokio::io::BufReader::new(python.stdout.take().unwrap()).lines();
    let printed = tokio::time::timeout(Duration::from_secs(15), lines.next_line())
        .await
        .expect("the consumer printed nothing")
        .unwrap()
        .unwrap();
    assert_eq!(printed, format!("task {id} arrived: {{'invoice': 42}}"));
    // A payload that is not JSON does not stop the consumer: shown as it came,
    // and the next task arrives too.
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    for body in [
        json!({"destination": "billing.invoice", "delay": "0s", "payload_base64": "/3Jhdw=="}),
        json!({"destination": "billing.invoice", "delay": "0s", "payload": {"invoice": 44}}),
    ] {
        let answer = http
            .post(format!("{base}/v1/tasks"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 202);
    }
    for expected in ["arrived: b'\\xffraw'", "arrived: {'invoice': 44}"] {
        let printed = tokio::time::timeout(Duration::from_secs(15), lines.next_line())
            .await
            .expect("the consumer printed nothing")
            .unwrap()
            .unwrap_or_default();
        assert!(printed.ends_with(expected), "{printed}");
    }
    // As step 3 says: seen delivered, and when.
    let base = format!("http://127.0.0.1:{port}");
    crate::common::eventually("the task is seen delivered", async || {
        let task: Value = reqwest::get(format!("{base}/v1/tasks/{id}"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        task["state"] == "delivered" && task["lateness_ms"].is_u64()
    })
    .await;

    // Step 4: moved, then cancelled, as written.
    let change = readme_block("## Quick start", "sh", 2);
    let changed = tokio::process::Command::new("sh")
        .env("DELAYLINE__HTTP__BIND", &bind)
        .arg("-c")
        .arg(&change)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&changed.stdout);
    // curl prints each answer without a newline: JSON values one after another.
    let answers: Vec<Value> = serde_json::Deserializer::from_str(&stdout)
        .into_iter()
        .map(|answer| answer.unwrap_or_else(|e| panic!("{e}: {stdout}")))
        .collect();
    assert_eq!(answers.len(), 2, "{stdout}");
    assert_eq!(
        (&answers[0]["state"], &answers[0]["revision"]),
        (&json!("scheduled"), &json!(2)),
        "{stdout}"
    );
    assert_eq!(answers[1]["state"], "cancelled", "{stdout}");
    assert!(answers[1]["cancelled_at"].is_string(), "{stdout}");
    python.kill().await.unwrap();
    terminate(&child);
    let _ = child.wait_with_output().await;

    // Step 6: the service stopped, what it declared goes, with the queue named.
    let clean_up = readme_block("## Quick start", "sh", 4);
    let said = run_as_written(&clean_up, &settings).await;
    assert!(
        said.contains(&format!("{queue}  0 messages, 0 consumers")),
        "{said}"
    );
    assert!(said.contains("deleted "), "{said}");
    for gone in [queue, settings.cascade().unwrap().release_queue()] {
        assert!(
            queue_state(&probe, &gone).await.unwrap().is_none(),
            "{gone}: {said}"
        );
    }
    let _ = probe.close(200, "done".into()).await;
}

/// Runs a guide's shell block with `delayline` on the `PATH` and configured
/// by `settings`' environment; what it printed, once it succeeded.
async fn run_as_written(block: &str, settings: &delayline::config::Settings) -> String {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_delayline"));
    let path = format!(
        "{}:{}",
        binary.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = crate::common::delayline_command(settings, &[]);
    let environment: Vec<_> = command
        .as_std()
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
        .collect();
    command = tokio::process::Command::new("sh");
    let output = command
        .args(["-ec", block])
        .envs(environment)
        .env("PATH", path)
        .output()
        .await
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{block}\n{said}");
    said
}
