//! The command line as an operator meets it in a shell: output piped into
//! a reader that stops early; removing what delayline declared.

use std::process::Stdio;

use delayline::cascade::QueueType;

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
/// the chain holds a task (saying how many, and the flag); with
/// `--drop-tasks` it deletes the chain of the configured prefix and
/// version, cancels the task in the ledger, and deletes a user's queue only
/// when named. On the broker the suite runs against (3.10 and 4.3 in CI).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deprovision_deletes_the_chain_only_when_told_and_never_loses_work_unasked() {
    let mut settings = with_ledger(test_settings(8, 100, QueueType::Quorum), Backend::Sqlite);
    settings.cascade.business_exchange = None;
    let cascade = settings.cascade().unwrap();
    let mut app = TestApp::spawn(settings.clone()).await;
    // Two queues of the user's, bound to the business exchange.
    let _first = TestConsumer::bind(&mut app, "#").await;
    let named = app.cleanup.queues.last().unwrap().clone();
    let _second = TestConsumer::bind(&mut app, "#").await;
    let kept = app.cleanup.queues.last().unwrap().clone();
    let task = serde_json::json!({"destination": "billing.invoice", "delay": "20s"});
    let (status, accepted) = app.post("/v1/tasks", &task).await;
    assert_eq!(status, 202, "{accepted}");

    let (ok, running) = run_delayline(&settings, &["deprovision", "--yes"]).await;
    assert!(!ok && running.contains("is being consumed"), "{running}");
    let _topology = app.stop_keeping_topology().await;

    let (ok, looked) = run_delayline(&settings, &["deprovision"]).await;
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
        looked.contains("deprovision --yes --drop-tasks"),
        "{looked}"
    );
    assert!(
        !looked.contains(&named),
        "an unnamed queue of the user's: {looked}"
    );
    assert!(
        queue_exists(&cascade.level_queue(7)).await,
        "a look deleted"
    );

    let (ok, refused) = run_delayline(&settings, &["deprovision", "--yes"]).await;
    assert!(!ok, "{refused}");
    assert!(refused.contains("tasks on their way: 1"), "{refused}");
    assert!(refused.contains("--drop-tasks"), "{refused}");
    assert!(
        queue_exists(&cascade.release_queue()).await,
        "a refusal deleted"
    );

    let args = ["deprovision", "--yes", "--drop-tasks", "--queue", &named];
    let (ok, deleted) = run_delayline(&settings, &args).await;
    assert!(ok, "{deleted}");
    assert!(
        deleted.contains("1 task cancelled in the ledger"),
        "{deleted}"
    );
    for queue in [cascade.level_queue(7), cascade.release_queue(), named] {
        assert!(!queue_exists(&queue).await, "{queue} is still there");
    }
    assert!(queue_exists(&kept).await, "a queue of the user's not named");
    let (ok, after) = run_delayline(&settings, &["deprovision"]).await;
    assert!(ok, "{after}");
    assert!(after.contains("0 tasks on their way"), "{after}");
    assert!(after.contains("nothing of it is on the broker"), "{after}");
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
