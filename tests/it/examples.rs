//! The client examples under `examples/`, run as a user runs them: in
//! Python (httpx and pika), Node (fetch and amqplib) and Rust (reqwest and
//! lapin), a task submitted over HTTP and consumed, and a message published
//! with `x-delay` through an AMQP ingress, as a plugin producer does. Each
//! program checks itself that its message came and was not early, and
//! exits 0; the test runs it against a service of its own.

use std::path::{Path, PathBuf};
use std::process::Command;

use delayline::cascade::QueueType;
use delayline::ingress::IngressSettings;

use crate::common::{Backend, TestApp, amqp_uri, test_settings, with_ledger};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// How one example program is started, in each language.
fn program(language: &str, name: &str) -> Command {
    match language {
        "python" => {
            let mut command = Command::new(crate::common::python::tool("python"));
            command.arg(repo(&format!("examples/python/{name}.py")));
            command
        }
        "node" => {
            let mut command = crate::common::node::node();
            command.arg(repo(&format!("examples/node/{name}.js")));
            command
        }
        _ => Command::new(rust_examples().join(name)),
    }
}

/// The Rust example's binaries, built once (a workspace member of its own,
/// `examples/rust`).
fn rust_examples() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let status = Command::new(env!("CARGO"))
                .args([
                    "build",
                    "--quiet",
                    "--locked",
                    "-p",
                    "delayline-client-example",
                ])
                .arg("--bins")
                .current_dir(repo(""))
                .status()
                .unwrap();
            assert!(status.success(), "the Rust example does not build");
            repo("target/debug")
        })
        .clone()
}

/// Runs an example program to its end (it gives up by itself after 30 s).
async fn run(mut command: Command) -> String {
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_examples_run_in_python_node_and_rust() {
    let mut settings = with_ledger(test_settings(8, 10, QueueType::Quorum), Backend::Sqlite);
    let prefix = settings.cascade.prefix.clone();
    settings.ingress = vec![IngressSettings {
        exchange: format!("{prefix}.my-exchange.delayed"),
        deliver_to: Some(format!("{prefix}.my-exchange")),
        kind: "direct".to_owned(),
        routing_keys: Vec::new(),
    }];
    let mut app = TestApp::spawn(settings).await;
    let business = app.cascade.business_exchange().to_owned();
    // The Rust example built (or found built) before any program starts, off
    // the runtime's threads.
    tokio::task::spawn_blocking(rust_examples).await.unwrap();
    // The languages side by side: each program mostly waits for its message.
    let languages = ["python", "node", "rust"];
    for language in languages {
        for queue in ["invoices", "my-queue"] {
            app.cleanup
                .queues
                .push(format!("{prefix}.{queue}.{language}"));
        }
    }
    let runs = languages.map(|language| {
        let (base, business, prefix) = (app.base.clone(), business.clone(), prefix.clone());
        async move {
            let mut submit = program(language, "submit_and_consume");
            submit
                .env("DELAYLINE_URL", &base)
                .env("AMQP_URI", amqp_uri())
                .env("BUSINESS_EXCHANGE", &business)
                .env("QUEUE", format!("{prefix}.invoices.{language}"))
                .env("DESTINATION", format!("billing.invoice.{language}"));
            let printed = run(submit).await;
            assert!(
                printed.contains("ms after its time"),
                "{language}: {printed}"
            );

            let mut publish = program(language, "publish_x_delay");
            publish
                .env("AMQP_URI", amqp_uri())
                .env("INGRESS_EXCHANGE", format!("{prefix}.my-exchange.delayed"))
                .env("DELIVER_TO", format!("{prefix}.my-exchange"))
                .env("QUEUE", format!("{prefix}.my-queue.{language}"))
                .env("ROUTING_KEY", format!("my-key.{language}"));
            let printed = run(publish).await;
            assert!(printed.contains("arrived after"), "{language}: {printed}");
        }
    });
    futures_util::future::join_all(runs).await;
    app.stop().await.unwrap();
}

/// The examples' dependency files name the versions the tests install.
#[test]
fn the_examples_dependency_files_pin_what_the_tests_run() {
    let requirements = std::fs::read_to_string(repo("examples/python/requirements.txt")).unwrap();
    for line in requirements.lines().filter(|line| !line.trim().is_empty()) {
        assert!(
            crate::common::python::PACKAGES.contains(&line.trim()),
            "{line} is not what the tests install"
        );
    }
    let package: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo("examples/node/package.json")).unwrap())
            .unwrap();
    let amqplib = package["dependencies"]["amqplib"].as_str().unwrap();
    assert!(
        crate::common::node::PACKAGES.contains(&format!("amqplib@{amqplib}").as_str()),
        "amqplib {amqplib} is not what the tests install"
    );
}

/// Each example program's default queue is its own: no two share one, and
/// no page of the guide declares it (the `x-delay` examples once defaulted
/// to the plugin page's `my-queue`, whose consumer took their message).
/// The README's clean-up names every one.
#[test]
fn the_examples_default_queues_are_their_own() {
    let programs = [
        "examples/python/submit_and_consume.py",
        "examples/python/publish_x_delay.py",
        "examples/node/submit_and_consume.js",
        "examples/node/publish_x_delay.js",
        "examples/rust/src/bin/submit_and_consume.rs",
        "examples/rust/src/bin/publish_x_delay.rs",
        "examples/consumer.rs",
    ];
    let defaults: Vec<String> = programs
        .iter()
        .map(|program| {
            let text = std::fs::read_to_string(repo(program)).unwrap();
            let after = text
                .split("\"QUEUE\", \"")
                .nth(1)
                .unwrap_or_else(|| panic!("{program} reads no QUEUE"));
            after.split('"').next().unwrap().to_owned()
        })
        .collect();
    let distinct: std::collections::HashSet<_> = defaults.iter().collect();
    assert_eq!(distinct.len(), defaults.len(), "{defaults:?}");
    let mut pages = vec![repo("README.md")];
    for entry in std::fs::read_dir(repo("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        for queue in &defaults {
            for declared in [format!("\"{queue}\""), format!("queue={queue:?}")] {
                assert!(
                    !text.contains(&declared),
                    "{} declares {queue}",
                    page.display()
                );
            }
        }
    }
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    for queue in &defaults[..6] {
        assert!(readme.contains(&format!("--queue {queue}")), "{queue}");
    }
}
