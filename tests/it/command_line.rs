//! The command line as an operator meets it in a shell: output piped into
//! a reader that stops early; removing what delayline declared.

use std::process::Stdio;

use delayline::cascade::QueueType;
use lapin::BasicProperties;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use crate::common::{
    Backend, TestApp, TestConsumer, amqp_uri, delayline_command, run_delayline, test_settings,
    with_ledger,
};

/// `delayline … | head` where `head` has gone before delayline writes:
/// every command that prints ends quietly (no panic, no error, exit 0), as
/// other command-line tools do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_reader_has_gone_ends_quietly() {
    let settings = test_settings(8, 100, QueueType::Quorum);
    let commands: [&[&str]; 4] = [
        &["provision", "--dry-run"],
        &["openapi"],
        &[
            "route",
            "--delay",
            "10s",
            "--destination",
            "billing.invoice",
        ],
        &["--help"],
    ];
    for args in commands {
        let mut command = delayline_command(&settings, args);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        // The reader is gone before the first line is written.
        drop(child.stdout.take());
        let output = child.wait_with_output().await.unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{args:?}: {}: {stderr}",
            output.status
        );
        assert!(stderr.trim().is_empty(), "{args:?}: {stderr}");
    }
}

/// `delayline deprovision` says what it would delete and deletes nothing;
/// with `--yes` it refuses while a delayline consumes the chain, then while
/// the chain holds a task (saying how many, and the flag); a named queue of
/// the user's that holds messages, or that a consumer reads, is refused
/// (saying how many) until the flag named for that loss is given; every
/// hint is the command as it was run (its `--config` and `--queue`s), with
/// only the flags added. With every flag it deletes the chain of the
/// configured prefix and version, cancels the task in the ledger, and
/// deletes the user's queues that were named, no other. On the broker the
/// suite runs against (3.10 and 4.3 in CI).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deprovision_deletes_the_chain_only_when_told_and_never_loses_work_unasked() {
    let mut settings = with_ledger(test_settings(8, 100, QueueType::Quorum), Backend::Sqlite);
    settings.cascade.business_exchange = None;
    let cascade = settings.cascade().unwrap();
    let mut app = TestApp::spawn(settings.clone()).await;
    // Three queues of the user's: one read by a consumer, one holding three
    // persistent messages (both named below), and one never named.
    let _reader = TestConsumer::bind(&mut app, "#").await;
    let consumed = app.cleanup.queues.last().unwrap().clone();
    let full = format!("{}.user.full", cascade.prefix());
    app.cleanup.queues.push(full.clone());
    declare_with_messages(&full, 3).await;
    let _second = TestConsumer::bind(&mut app, "#").await;
    let kept = app.cleanup.queues.last().unwrap().clone();
    let task = serde_json::json!({"destination": "billing.invoice", "delay": "20s"});
    let (status, accepted) = app.post("/v1/tasks", &task).await;
    assert_eq!(status, 202, "{accepted}");

    let (ok, running) = run_delayline(&settings, &["deprovision", "--yes"]).await;
    assert!(!ok && running.contains("is being consumed"), "{running}");
    let _topology = app.stop_keeping_topology().await;

    // The configuration file's name need not end in .toml.
    let config = std::env::temp_dir().join(format!("{}.conf", cascade.prefix()));
    std::fs::write(&config, "# defaults; the environment says the rest\n").unwrap();
    let config = config.to_str().unwrap().to_owned();
    let named = ["--queue", &full, "--queue", &consumed];
    let look = [&["--config", &config, "deprovision"][..], &named].concat();
    let (ok, looked) = run_delayline(&settings, &look).await;
    assert!(ok, "{looked}");
    for name in [
        cascade.level_queue(7),
        cascade.release_queue(),
        cascade.business_exchange().to_owned(),
    ] {
        assert!(looked.contains(&name), "{name}: {looked}");
    }
    assert!(
        looked.contains("1 task on its way (by the ledger)"),
        "{looked}"
    );
    assert!(
        looked.contains(&format!("{full}  3 messages, 0 consumers")),
        "{looked}"
    );
    assert!(
        looked.contains(&format!("{consumed}  0 messages, 1 consumer")),
        "{looked}"
    );
    let whole = format!(
        "delayline --config {config} deprovision --queue {full} --queue {consumed} --yes \
         --drop-tasks --drop-messages --drop-consumers`"
    );
    assert!(looked.contains(&whole), "{whole} in {looked}");
    assert!(
        !looked.contains(&kept),
        "an unnamed queue of the user's: {looked}"
    );
    assert!(
        queue_exists(&cascade.level_queue(7)).await,
        "a look deleted"
    );

    let (ok, refused) = run_delayline(&settings, &["deprovision", "--yes"]).await;
    assert!(!ok, "{refused}");
    assert!(refused.contains("tasks on their way: 1"), "{refused}");
    assert!(
        refused.contains("delayline deprovision --yes --drop-tasks\n"),
        "{refused}"
    );
    assert!(
        queue_exists(&cascade.release_queue()).await,
        "a refusal deleted"
    );

    let args = [&["deprovision", "--yes", "--drop-tasks"][..], &named].concat();
    let (ok, refused) = run_delayline(&settings, &args).await;
    assert!(!ok, "{refused}");
    assert!(
        refused.contains(&format!("queue {full} holds 3 messages")),
        "{refused}"
    );
    let again = format!(
        "delayline deprovision --yes --drop-tasks --queue {full} --queue {consumed} --drop-messages\n"
    );
    assert!(refused.contains(&again), "{again} in {refused}");
    let args = [&args[..], &["--drop-messages"]].concat();
    let (ok, refused) = run_delayline(&settings, &args).await;
    assert!(!ok, "{refused}");
    assert!(
        refused.contains(&format!("queue {consumed} has 1 consumers")),
        "{refused}"
    );
    for queue in [cascade.release_queue(), full.clone(), consumed.clone()] {
        assert!(queue_exists(&queue).await, "a refusal deleted {queue}");
    }

    let args = [&args[..], &["--drop-consumers"]].concat();
    let (ok, deleted) = run_delayline(&settings, &args).await;
    assert!(ok, "{deleted}");
    assert!(
        deleted.contains("1 task cancelled in the ledger"),
        "{deleted}"
    );
    for queue in [
        cascade.level_queue(7),
        cascade.release_queue(),
        full,
        consumed,
    ] {
        assert!(!queue_exists(&queue).await, "{queue} is still there");
    }
    assert!(queue_exists(&kept).await, "a queue of the user's not named");
    let (ok, after) = run_delayline(&settings, &["deprovision"]).await;
    assert!(ok, "{after}");
    assert!(after.contains("0 tasks on their way"), "{after}");
    assert!(after.contains("nothing of it is on the broker"), "{after}");
    let _ = std::fs::remove_file(&config);
}

/// A durable queue of the user's holding `messages` persistent messages.
async fn declare_with_messages(queue: &str, messages: usize) {
    let connection = delayline::broker::connect(amqp_uri(), "deprovision test")
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), durable, FieldTable::default())
        .await
        .unwrap();
    let _ = connection.close(200, "declared".into()).await;
    let persistent = BasicProperties::default().with_delivery_mode(2);
    for _ in 0..messages {
        crate::ingress::publish("", queue, b"kept", persistent.clone()).await;
    }
}

/// Whether a queue of that name is declared on the suite's broker.
async fn queue_exists(name: &str) -> bool {
    let connection = delayline::broker::connect(amqp_uri(), "deprovision test")
        .await
        .unwrap();
    let state = delayline::broker::queue_state(&connection, name).await;
    let _ = connection.close(200, "checked".into()).await;
    state.unwrap().is_some()
}

/// `delayline reload` signals only a `delayline serve`: another process
/// named by `--pid` is refused and keeps running, a serving delayline is
/// signalled (it logs the reload and goes on serving).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_signals_only_a_serving_delayline() {
    let settings = test_settings(8, 100, QueueType::Quorum);
    // What the service declares goes with the test.
    let _cleanup = crate::common::Cleanup::for_settings(&settings);
    let mut other = tokio::process::Command::new("sleep")
        .arg("30")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = other.id().unwrap().to_string();
    let (ok, refused) = run_delayline(&settings, &["reload", "--pid", &pid]).await;
    assert!(!ok, "{refused}");
    assert!(
        refused.contains("`sleep 30`, not `delayline serve`"),
        "{refused}"
    );
    assert!(
        other.try_wait().unwrap().is_none(),
        "the other process was signalled"
    );
    let _ = other.kill().await;

    let port = crate::common::free_port();
    let mut service = crate::common::serve_command(&settings, port)
        .env("DELAYLINE__HTTP__RELOAD_CHECK_MS", "0")
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    crate::common::wait_ready_at(&reqwest::Client::new(), &base).await;
    let pid = service.id().unwrap().to_string();
    let (ok, sent) = run_delayline(&settings, &["reload", "--pid", &pid]).await;
    assert!(ok, "{sent}");
    assert!(
        sent.contains(&format!("sent SIGHUP to delayline (process {pid})")),
        "{sent}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        service.try_wait().unwrap().is_none(),
        "the service stopped on SIGHUP"
    );
    crate::common::terminate(&service);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), service.wait()).await;
}
