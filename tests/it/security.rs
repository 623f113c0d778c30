//! Access control and transport security against the real broker, in the
//! default configuration (quorum chain, SQLite ledger, release stage): tokens
//! made by `delayline token create`, clients reloaded on SIGHUP while load
//! runs, HTTPS with certificates made here, amqps to a TLS node of the
//! test's own, the refuse-to-start rule, and no secret in the logs.

use std::collections::HashSet;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::Duration;

use delayline::cascade::QueueType;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::common::nodes::{BrokerNode, NodeOptions, NodeTls};
use crate::common::tls::{TestCa, client_trusting};
use crate::common::{
    Backend, Cleanup, TestApp, TestConsumer, TestUser, delayline_command, free_port, rabbitmqctl,
    serve_command, terminate, test_settings, wait_connected_at, with_ledger,
};

/// `delayline token create …` appending to `file`: the token it printed.
async fn create_token(settings: &delayline::config::Settings, file: &str, args: &[&str]) -> String {
    let mut all = vec!["token", "create", "--append-to", file];
    all.extend_from_slice(args);
    let output = delayline_command(settings, &all).output().await.unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let token = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    assert!(
        token.starts_with("dlt_") && token.len() >= 4 + 43,
        "{token}"
    );
    token
}

async fn post(
    http: &reqwest::Client,
    base: &str,
    token: Option<&str>,
    body: &Value,
) -> (u16, Value) {
    let mut request = http.post(format!("{base}/v1/tasks")).json(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// `curl --cacert CA https://localhost:PORT/healthz`, with curl's defaults
/// (which prefer HTTP/2), answers 200.
fn curl_https_healthz(ca: &TestCa, port: u16) {
    let output = std::process::Command::new("curl")
        .args(["-sS", "--fail", "--cacert", &ca.ca_file()])
        .arg(format!("https://localhost:{port}/healthz"))
        .output()
        .expect("curl runs");
    assert!(
        output.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_https_and_reloads_without_a_restart_and_no_secret_in_the_logs() {
    let mut settings = with_ledger(test_settings(12, 100, QueueType::Quorum), Backend::Sqlite);
    // A broker password of the test's own, to look for in the logs.
    let user = TestUser::create();
    let password = format!("pw-{}", uuid::Uuid::new_v4().simple());
    rabbitmqctl(&["change_password", &user.0, &password]);
    settings.amqp.uri = format!(
        "amqp://{}:{password}@{}/%2f",
        user.0,
        crate::common::broker_address()
    )
    .into();
    settings.metrics.management_url = "none".into();
    let mut cleanup = Cleanup::for_settings(&settings);
    let cascade = settings.cascade().unwrap();

    let first_ca = TestCa::new("first");
    let second_ca = TestCa::new("second");
    let leaf = first_ca.issue("api", "localhost", &["localhost", "127.0.0.1"]);
    let clients_file = first_ca.dir.join("clients.toml").display().to_string();
    let billing = create_token(
        &settings,
        &clients_file,
        &[
            "--name",
            "billing",
            "--destination",
            "billing.#",
            "--permission",
            "submit,read",
        ],
    )
    .await;
    let ops = create_token(
        &settings,
        &clients_file,
        &["--name", "ops", "--permission", "admin"],
    )
    .await;
    let file = std::fs::read_to_string(&clients_file).unwrap();
    assert!(file.contains(&delayline::auth::token::hash_hex(&billing)));
    assert!(
        !file.contains(&billing),
        "the file holds hashes, never tokens"
    );

    let port = free_port();
    let log_path = first_ca.dir.join("service.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut command = serve_command(&settings, port);
    command
        .env("DELAYLINE__AUTH__CLIENTS_FILE", &clients_file)
        .env("DELAYLINE__HTTP__TLS__CERT_FILE", &leaf.cert_file)
        .env("DELAYLINE__HTTP__TLS__KEY_FILE", &leaf.key_file)
        // SIGHUP alone reloads here ("not before the reload"); the files
        // watched are the replicas test's.
        .env("DELAYLINE__HTTP__RELOAD_CHECK_MS", "0")
        .env(
            "DELAYLINE__LOG__FILTER",
            "debug,lapin=off,hyper=off,h2=off,rustls=off",
        )
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log));
    let mut child = command.spawn().unwrap();
    let base = format!("https://localhost:{port}");
    let http = client_trusting(&first_ca);
    wait_connected_at(&http, &base).await;
    // The container's health check speaks HTTPS to its own listener.
    let probe = delayline_command(&settings, &["probe"])
        .env("DELAYLINE__HTTP__BIND", format!("127.0.0.1:{port}"))
        .env("DELAYLINE__HTTP__TLS__CERT_FILE", &leaf.cert_file)
        .env("DELAYLINE__HTTP__TLS__KEY_FILE", &leaf.key_file)
        .output()
        .await
        .unwrap();
    assert!(
        probe.status.success(),
        "{}{}",
        String::from_utf8_lossy(&probe.stdout),
        String::from_utf8_lossy(&probe.stderr)
    );
    // curl as it comes offers HTTP/2 first (ALPN): the server offers only
    // the HTTP/1.1 it serves, so the default client works.
    curl_https_healthz(&first_ca, port);
    // Plain HTTP on the HTTPS port gets no API.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .send()
        .await;
    assert!(plain.is_err() || plain.unwrap().status() != 200);
    // A client that does not trust the certificate does not connect.
    let stranger = client_trusting(&second_ca);
    assert!(
        stranger
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_err()
    );

    let key = cascade.binding_key("#");
    let mut consumer =
        TestConsumer::bind_to(&mut cleanup, &cascade, cascade.business_exchange(), &key).await;
    let task = |destination: &str| json!({"destination": destination, "delay_ms": 300});
    assert_eq!(post(&http, &base, None, &task("billing.a")).await.0, 401);
    assert_eq!(
        post(&http, &base, Some("dlt_wrong"), &task("billing.a"))
            .await
            .0,
        401
    );
    let (status, body) = post(&http, &base, Some(&billing), &task("orders.a")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("forbidden_destination"))
    );
    let topology = http
        .get(format!("{base}/v1/topology"))
        .bearer_auth(&ops)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!topology.contains(&password), "{topology}");

    // Load by billing while a new client is added and the certificate is
    // replaced, each reloaded by SIGHUP: every request is answered 202.
    let mut accepted = HashSet::new();
    let both = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(first_ca.pem().as_bytes()).unwrap())
        .add_root_certificate(reqwest::Certificate::from_pem(second_ca.pem().as_bytes()).unwrap())
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let mut load = Vec::new();
    for _ in 0..3 {
        let (http, base, token, stop) = (both.clone(), base.clone(), billing.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            while !stop.is_cancelled() {
                answers.push(
                    post(
                        &http,
                        &base,
                        Some(&token),
                        &json!({"destination": "billing.load", "delay_ms": 300}),
                    )
                    .await,
                );
            }
            answers
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let orders = create_token(
        &settings,
        &clients_file,
        &[
            "--name",
            "orders",
            "--destination",
            "orders.*",
            "--permission",
            "submit",
        ],
    )
    .await;
    assert_eq!(
        post(&both, &base, Some(&orders), &task("orders.a")).await.0,
        401,
        "not before the reload"
    );
    let renewed = second_ca.issue("api", "localhost", &["localhost", "127.0.0.1"]);
    std::fs::copy(&renewed.cert_file, &leaf.cert_file).unwrap();
    std::fs::copy(&renewed.key_file, &leaf.key_file).unwrap();
    crate::common::hang_up(&child);
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        let answer = post(&both, &base, Some(&orders), &task("orders.a")).await;
        if answer.0 != 401 || Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, 202, "{body}");
    accepted.insert(body["id"].as_str().unwrap().to_owned());
    // New connections get the new certificate, without a restart.
    let renewed_client = client_trusting(&second_ca);
    assert_eq!(
        renewed_client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // A reloaded certificate keeps offering HTTP/1.1 alone.
    curl_https_healthz(&second_ca, port);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    for handle in load {
        for (status, body) in handle.await.unwrap() {
            assert_eq!(status, 202, "a request during the reloads: {body}");
            accepted.insert(body["id"].as_str().unwrap().to_owned());
        }
    }
    assert!(accepted.len() > 10, "the load ran: {}", accepted.len());
    consumer
        .expect_each_once_never_early(accepted, Duration::from_secs(20))
        .await;

    terminate(&child);
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    let logs = std::fs::read_to_string(&log_path).unwrap();
    assert!(logs.contains("SIGHUP: clients reloaded"), "{logs}");
    assert!(logs.contains("SIGHUP: certificate reloaded"), "{logs}");
    assert!(logs.contains("requires a token"), "{logs}");
    let key_body = |pem: &str| pem.lines().nth(1).unwrap_or_default().to_owned();
    for (what, secret) in [
        ("billing's token", billing.as_str()),
        ("ops' token", ops.as_str()),
        ("orders' token", orders.as_str()),
        ("the broker password", password.as_str()),
        ("the first key", &key_body(&leaf.key_pem)),
        ("the renewed key", &key_body(&renewed.key_pem)),
    ] {
        assert!(!secret.is_empty());
        assert!(!logs.contains(secret), "{what} is in the logs");
    }
    drop(user);
}

#[tokio::test]
async fn an_open_api_refuses_to_start_on_a_network_address_unless_said() {
    let settings = with_ledger(test_settings(4, 100, QueueType::Quorum), Backend::Sqlite);
    let _cleanup = Cleanup::for_settings(&settings);
    let port = free_port();
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        delayline_command(&settings, &["serve"])
            .env("DELAYLINE__HTTP__BIND", format!("0.0.0.0:{port}"))
            .output(),
    )
    .await
    .expect("it exits at once")
    .unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("not a loopback address") && said.contains("auth.mode = \"open\""),
        "{said}"
    );

    let log_path = std::env::temp_dir().join(format!("dltest-open-{}.log", uuid::Uuid::new_v4()));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut open = delayline_command(&settings, &["serve"]);
    open.env("DELAYLINE__HTTP__BIND", format!("0.0.0.0:{port}"))
        .env("DELAYLINE__AUTH__MODE", "open")
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .kill_on_drop(true);
    let mut child = open.spawn().unwrap();
    let ready =
        crate::common::wait_ready_at(&reqwest::Client::new(), &format!("http://127.0.0.1:{port}"))
            .await;
    assert_eq!(ready["status"], "ready");
    terminate(&child);
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    let logs = std::fs::read_to_string(&log_path).unwrap();
    let _ = std::fs::remove_file(&log_path);
    assert!(
        logs.contains("the API is OPEN on a network address"),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_travel_over_amqps_never_early_and_a_wrong_ca_is_not_ready() {
    let ca = TestCa::new("broker");
    let server = ca.issue("broker", "localhost", &["localhost", "127.0.0.1"]);
    let node = BrokerNode::start(&NodeOptions {
        tls: Some(NodeTls {
            ca_pem: ca.pem(),
            cert_pem_file: server.cert_file.clone(),
            key_pem_file: server.key_file.clone(),
            external: true,
        }),
        ..NodeOptions::default()
    });
    let tls_port = node.tls_port.unwrap();

    // Password over TLS, in the default configuration.
    let mut settings = with_ledger(test_settings(12, 100, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = format!("amqps://guest:guest@localhost:{tls_port}/%2f").into();
    settings.amqp.tls.ca_file = ca.ca_file();
    settings.metrics.management_url = "none".into();
    // A new node's first TLS handshakes on a loaded machine may outlast the
    // default 3 s; each attempt cut short would start over.
    settings.amqp.connect_timeout_ms = 15_000;
    let app = TestApp::spawn(settings).await;
    let cascade = app.cascade.clone();
    let mut consumer = TestConsumer::on_node(
        &node.uri(),
        &cascade,
        &cascade.binding_key("tls"),
        QueueType::Quorum,
    )
    .await;
    let mut ids = HashSet::new();
    for _ in 0..20 {
        let (status, body) = app
            .post("/v1/tasks", &json!({"destination": "tls", "delay_ms": 300}))
            .await;
        assert_eq!(status, 202, "{body}");
        ids.insert(body["id"].as_str().unwrap().to_owned());
    }
    consumer
        .expect_each_once_never_early(ids, Duration::from_secs(20))
        .await;
    let connections = node.ctl(&["list_connections", "ssl", "user"]);
    assert!(connections.contains("true\tguest"), "{connections}");
    app.stop().await.unwrap();

    // A client certificate instead of a password (SASL EXTERNAL).
    let identity = ca.issue("client", "dltest-cert-user", &["dltest-cert-user"]);
    node.ctl(&[
        "add_user",
        "dltest-cert-user",
        uuid::Uuid::new_v4().to_string().as_str(),
    ]);
    node.ctl(&[
        "set_permissions",
        "-p",
        "/",
        "dltest-cert-user",
        ".*",
        ".*",
        ".*",
    ]);
    let mut settings = with_ledger(test_settings(12, 100, QueueType::Quorum), Backend::Sqlite);
    settings.amqp.uri = format!("amqps://localhost:{tls_port}/%2f?auth_mechanism=external").into();
    settings.amqp.tls.ca_file = ca.ca_file();
    settings.amqp.tls.cert_file = identity.cert_file.clone();
    settings.amqp.tls.key_file = identity.key_file.clone();
    settings.metrics.management_url = "none".into();
    settings.amqp.connect_timeout_ms = 15_000;
    let app = TestApp::spawn(settings).await;
    let cascade = app.cascade.clone();
    let mut consumer = TestConsumer::on_node(
        &node.uri(),
        &cascade,
        &cascade.binding_key("cert"),
        QueueType::Quorum,
    )
    .await;
    let (status, body) = app
        .post(
            "/v1/tasks",
            &json!({"destination": "cert", "delay_ms": 300}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    consumer
        .expect_each_once_never_early(HashSet::from([id]), Duration::from_secs(20))
        .await;
    let connections = node.ctl(&["list_connections", "user", "auth_mechanism"]);
    assert!(
        connections.contains("dltest-cert-user\tEXTERNAL"),
        "{connections}"
    );
    app.stop().await.unwrap();

    // A CA that did not sign the broker's certificate: not ready at once,
    // saying why, and no task is taken without a ledger to hold it.
    let other = TestCa::new("other");
    let mut settings = test_settings(12, 100, QueueType::Quorum);
    settings.store.url = "none".into();
    settings.amqp.uri = format!("amqps://guest:guest@localhost:{tls_port}/%2f").into();
    settings.amqp.tls.ca_file = other.ca_file();
    let app = TestApp::start(settings.clone()).await;
    let started = Instant::now();
    let (status, body) = loop {
        let (status, body) = app.get("/readyz").await;
        if body["error"]["code"] == "broker_misconfigured"
            || started.elapsed() > Duration::from_secs(15)
        {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "broker_misconfigured", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.to_lowercase().contains("certificate"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "no grace for a certificate"
    );
    assert!(!message.contains("guest:guest"), "{message}");
    let (status, _) = app
        .post("/v1/tasks", &json!({"destination": "x", "delay_ms": 0}))
        .await;
    assert_eq!(status, 503);
    app.stop().await.unwrap();
    // And on a ledger, with the same CA, readiness says the same at once.
    let mut settings = with_ledger(settings, Backend::Sqlite);
    settings.amqp.tls.ca_file = other.ca_file();
    let app = TestApp::start(settings).await;
    let started = Instant::now();
    loop {
        let (_, body) = app.get("/readyz").await;
        if body["error"]["code"] == "broker_misconfigured" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_token_example_runs_as_written() {
    let settings = with_ledger(test_settings(32, 100, QueueType::Quorum), Backend::Sqlite);
    let _cleanup = Cleanup::for_settings(&settings);
    let dir = TestCa::new("readme");
    let block = crate::lifecycle::doc_block("docs/security.md", "# Security", "sh", 0);
    // It keeps clear of the quick start's service: another port, chain and ledger.
    for own in [
        "127.0.0.1:8081",
        "PREFIX=tokens-example",
        "DATA_DIR=tokens-example-data",
    ] {
        assert!(block.contains(own), "{own}: {block}");
    }
    // A port picked free may be taken before the service binds it (another
    // test picked the same one): then the block runs again on another.
    let said = (0..3)
        .find_map(|_| {
            let _ = std::fs::remove_file(dir.dir.join("clients.toml"));
            let said =
                tokio::task::block_in_place(|| run_guides_block(&block, &settings, &dir.dir));
            (!said.1.contains("Address already in use")).then_some(said)
        })
        .expect("a free port within three tries");
    let said = format!("{}\n(its log:)\n{}", said.0, said.1);
    let mut lines = said.lines();
    assert_eq!(lines.next(), Some("401"), "{said}");
    let accepted: Value = serde_json::from_str(lines.next().unwrap_or_default()).expect(&said);
    assert_eq!(accepted["destination"], "billing.invoice", "{said}");
    assert!(accepted["id"].is_string());
    let clients = std::fs::read_to_string(dir.dir.join("clients.toml")).unwrap();
    assert!(clients.contains("name = \"billing\""), "{clients}");
}

/// Runs the guide's token block (`block`, as written but for the names the
/// test must not share) in `dir` on a free port, then stops the service it
/// started. Returns what it printed, and its stderr (the service's log),
/// which a failure shows: the block itself sends nothing to stderr.
fn run_guides_block(
    block: &str,
    settings: &delayline::config::Settings,
    dir: &std::path::Path,
) -> (String, String) {
    let port = free_port();
    let block = block
        .replace("127.0.0.1:8081", &format!("127.0.0.1:{port}"))
        .replace("localhost:8081", &format!("127.0.0.1:{port}"))
        .replace("tokens-example-data", &settings.store.data_dir)
        .replace("tokens-example", &settings.cascade.prefix);
    // The service the block starts is stopped once the block has run; the
    // block's own wait ends if the service stops first.
    let script = format!("{block}\nkill $!\nwait $!\n");
    let binary_dir = std::path::Path::new(env!("CARGO_BIN_EXE_delayline"))
        .parent()
        .unwrap()
        .display()
        .to_string();
    let environment = delayline_command(settings, &[]);
    let (stdout, stderr) = (dir.join("block.out"), dir.join("block.err"));
    // A group of its own, so that a block that never ends is stopped with
    // the service it started, not only the shell.
    let mut child = std::process::Command::new("sh")
        .process_group(0)
        .arg("-c")
        .arg(&script)
        .current_dir(dir)
        .envs(
            environment
                .as_std()
                .get_envs()
                .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))),
        )
        .env("DELAYLINE__HTTP__BIND", format!("127.0.0.1:{port}"))
        .env(
            "PATH",
            format!("{binary_dir}:{}", std::env::var("PATH").unwrap_or_default()),
        )
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let ended = loop {
        if child.try_wait().unwrap().is_some() {
            break true;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let group = format!("-{}", child.id());
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &group])
                .status();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap_or_default();
    let (said, log) = (read(&stdout), read(&stderr));
    assert!(
        ended,
        "the block never ended; it printed {said:?}, its log:\n{log}"
    );
    (said, log)
}

/// With tokens required, `metrics.bind` serves `/metrics` open on a listener
/// of its own (and not on the API's), with the API's bounds: a slow client
/// is cut off there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_on_their_own_listener_are_open_and_bounded_while_the_api_needs_tokens() {
    let mut settings = with_ledger(test_settings(4, 100, QueueType::Quorum), Backend::Sqlite);
    settings.auth.clients = vec![delayline::auth::ClientSettings {
        name: "app".to_owned(),
        token_sha256: delayline::auth::TokenHashes::One(delayline::auth::token::hash_hex(
            "tok-app",
        )),
        destinations: vec!["#".to_owned()],
        permissions: vec!["submit".to_owned()],
        ..delayline::auth::ClientSettings::default()
    }];
    let metrics = format!("127.0.0.1:{}", free_port());
    settings.metrics.bind = metrics.clone();
    settings.http.header_read_timeout_ms = 1_000;
    let app = TestApp::spawn(settings).await;
    app.wait_ready().await;

    let http = reqwest::Client::new();
    let scrape = http
        .get(format!("http://{metrics}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(scrape.status(), 200);
    assert!(
        scrape
            .text()
            .await
            .unwrap()
            .contains("delayline_broker_connected 1")
    );
    let on_api = http
        .get(format!("{}/metrics", app.base))
        .bearer_auth("tok-app")
        .send()
        .await
        .unwrap();
    assert_eq!(on_api.status(), 404);
    let task = http
        .post(format!("{}/v1/tasks", app.base))
        .json(&serde_json::json!({"destination": "d", "delay_ms": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(task.status(), 401);

    // A request head that never ends is cut off after the header timeout.
    let mut slow = tokio::net::TcpStream::connect(&metrics).await.unwrap();
    let started = Instant::now();
    tokio::io::AsyncWriteExt::write_all(&mut slow, b"GET /metrics HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut slow, &mut answer),
    )
    .await;
    assert!(read.is_ok(), "the listener kept a slow client for 10 s");
    assert!(answer.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(900));
}

/// Two replicas read one clients file, mounted as Kubernetes mounts a
/// Secret (the file a symbolic link through `..data`, swapped in by
/// renaming a new `..data` over the old one). The file is changed once, no
/// signal is sent to anyone: both refuse the revoked token within a bound
/// (the default `http.reload_check_ms`, 2 s, and a margin), and both still
/// take the client that stayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_refused_by_every_replica_once_the_mounted_file_changes() {
    let settings = test_settings(8, 100, QueueType::Quorum);
    let _cleanup = Cleanup::for_settings(&settings);
    let mount = std::env::temp_dir().join(format!("{}-secret", settings.cascade.prefix));
    let first = mount.join("..2026_12_04_first");
    std::fs::create_dir_all(&first).unwrap();
    let first_file = first.join("clients.toml").display().to_string();
    let args = |name| {
        [
            "--name",
            name,
            "--destination",
            "#",
            "--permission",
            "submit",
        ]
    };
    let kept = create_token(&settings, &first_file, &args("kept")).await;
    let revoked = create_token(&settings, &first_file, &args("revoked")).await;
    std::os::unix::fs::symlink("..2026_12_04_first", mount.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/clients.toml", mount.join("clients.toml")).unwrap();

    let mut replicas = Vec::new();
    for _ in 0..2 {
        let port = free_port();
        let mut command = serve_command(&settings, port);
        command.env("DELAYLINE__AUTH__CLIENTS_FILE", mount.join("clients.toml"));
        let child = command.spawn().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        wait_connected_at(&reqwest::Client::new(), &base).await;
        replicas.push((child, base));
    }
    let http = reqwest::Client::new();
    let task = json!({"destination": "d", "delay": "1s"});
    for (_, base) in &replicas {
        for token in [&kept, &revoked] {
            assert_eq!(post(&http, base, Some(token), &task).await.0, 202);
        }
    }

    // The Secret changes: a new folder without the revoked client, then
    // `..data` renamed over, as the kubelet does.
    let text = std::fs::read_to_string(&first_file).unwrap();
    let without = text
        .split("[[clients]]")
        .filter(|entry| !entry.contains("\"revoked\""))
        .collect::<Vec<_>>()
        .join("[[clients]]");
    let second = mount.join("..2026_12_04_second");
    std::fs::create_dir_all(&second).unwrap();
    std::fs::write(second.join("clients.toml"), without).unwrap();
    std::os::unix::fs::symlink("..2026_12_04_second", mount.join("..data_tmp")).unwrap();
    let changed = Instant::now();
    std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();

    for (_, base) in &replicas {
        loop {
            let status = post(&http, base, Some(&revoked), &task).await.0;
            if status == 401 {
                break;
            }
            assert_eq!(status, 202);
            assert!(
                changed.elapsed() < Duration::from_secs(10),
                "{base} still takes the revoked token"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(post(&http, base, Some(&kept), &task).await.0, 202);
    }
    println!(
        "both replicas refused the revoked token {:?} after the change",
        changed.elapsed()
    );
    for (child, _) in &replicas {
        terminate(child);
    }
    for (mut child, _) in replicas {
        let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    }
    let _ = std::fs::remove_dir_all(&mount);
}
