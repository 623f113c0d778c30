//! The API against its own description: schemathesis (property-based, from
//! `GET /openapi.json`) drives the running binary in its default
//! configuration (quorum queues, SQLite ledger, default unit and levels) and
//! must find nothing: no 5xx but 503, every answer's status, headers, content
//! type and body as described. A queue bound with `#` to every exchange a
//! task can enter the cascade by then shows that exactly the accepted tasks
//! were published, nothing that was refused.

use std::collections::HashSet;
use std::process::Command;
use std::time::Duration;

use crate::common::{
    AMQP_URI, Backend, Cleanup, TestConsumer, free_port, sample, spawn_binary, test_settings,
    wait_connected_at, with_ledger,
};
use delayline::broker::connect;
use delayline::cascade::QueueType;
use lapin::options::QueueBindOptions;
use lapin::types::FieldTable;

/// Enough cases to cover every operation's shapes; fixed, so a failure can
/// be replayed with the same seed.
const EXAMPLES_PER_OPERATION: &str = "25";
const SEED: &str = "20261122";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_and_only_accepted_tasks_are_published() {
    let settings = with_ledger(test_settings(32, 100, QueueType::Quorum), Backend::Sqlite);
    let cascade = settings.cascade().unwrap();
    let mut cleanup = Cleanup::for_settings(&settings);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut child = spawn_binary(&settings, port);
    wait_connected_at(&http, &base).await;

    // Every way into the cascade: each level's exchange, and the release
    // stage's for a task already due.
    let queue = format!("{}.consumer.{}", cascade.prefix(), cleanup.queues.len());
    let mut published =
        TestConsumer::bind_to(&mut cleanup, &cascade, &cascade.due_exchange(), "#").await;
    let connection = connect(AMQP_URI, "delayline test binder").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    for level in 0..cascade.levels() {
        channel
            .queue_bind(
                queue.as_str().into(),
                cascade.level_exchange(level).as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    let _ = connection.close(200, "bound".into()).await;

    let schema = format!("{base}/openapi.json");
    // Schemathesis keeps a cache in its working directory: not in the checkout.
    let workdir = std::env::temp_dir().join(cascade.prefix());
    std::fs::create_dir_all(&workdir).unwrap();
    let run_in = workdir.clone();
    let run = tokio::task::spawn_blocking(move || {
        Command::new("schemathesis")
            .current_dir(run_in)
            .args(["run", &schema, "--checks"])
            .arg(
                "not_a_server_error,status_code_conformance,content_type_conformance,\
                 response_headers_conformance,response_schema_conformance",
            )
            .args(["--max-examples", EXAMPLES_PER_OPERATION, "--seed", SEED])
            .args(["--generation-database", "none", "--no-color"])
            .output()
    })
    .await
    .unwrap()
    .expect("schemathesis runs (pip install schemathesis; .ci/run installs it)");
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "schemathesis found something:\n{report}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let scrape = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let accepted: f64 = ["scheduled", "pending"]
        .iter()
        .filter_map(|state| {
            sample(
                &scrape,
                &format!("delayline_tasks_accepted_total{{state=\"{state}\"}}"),
            )
        })
        .sum();
    assert!(
        accepted > 0.0,
        "schemathesis had no task accepted:\n{report}"
    );
    let mut ids = HashSet::new();
    while let Some(message) = published.next(Duration::from_secs(3)).await {
        ids.insert(message.message_id());
    }
    assert_eq!(
        ids.len() as f64,
        accepted,
        "tasks published into the cascade against tasks answered 202"
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_dir_all(workdir);
}
