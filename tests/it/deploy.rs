//! The files in deploy/: no container engine or cluster runs here, so what
//! can be checked is checked. The YAML parses and says what it must (health
//! checks, probes, the Secret it references), the systemd unit passes
//! `systemd-analyze verify`, and the real binary runs with exactly the
//! configuration each of them gives.
//!
//! "Exactly" allows four substitutions, each standing for what the platform
//! itself provides: the AMQP URI and a PostgreSQL URL (secrets; here a vhost
//! and a schema of the test's own), the listen port (a container's port is
//! mapped by the engine), and a data directory (a volume or state directory).
//! A configuration file named by a path inside the container is read from
//! the repository file the image or ConfigMap puts there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common::{POSTGRES_URL, free_port, psql, rabbitmqctl, terminate};
use serde_json::Value as Json;
use serde_norway::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The file parsed, with `<<` merge keys applied as compose applies them.
fn yaml(path: &str) -> Value {
    let mut value: Value =
        serde_norway::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    value
        .apply_merge()
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    value
}

/// The string at `path`: mapping keys, or indexes into sequences.
fn str_of<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    let mut at = value;
    for key in path {
        at = match key.parse::<usize>() {
            Ok(index) if at.is_sequence() => &at[index],
            _ => &at[*key],
        };
    }
    at.as_str()
        .unwrap_or_else(|| panic!("{} is not a string", path.join(".")))
}

/// How the binary is started by one of the deployment files.
#[derive(Debug, Default)]
struct Launch {
    args: Vec<String>,
    env: BTreeMap<String, String>,
}

/// The image's configuration: its ENV and its command.
fn image_launch() -> Launch {
    let dockerfile = read("deploy/Dockerfile").replace("\\\n", " ");
    let mut launch = Launch::default();
    let runtime = dockerfile
        .rsplit("\nFROM ")
        .next()
        .expect("a runtime stage");
    for line in runtime.lines() {
        if let Some(pairs) = line.strip_prefix("ENV ") {
            for pair in pairs.split_whitespace() {
                let (key, value) = pair.split_once('=').expect("ENV key=value");
                launch.env.insert(key.to_owned(), value.to_owned());
            }
        }
        if let Some(cmd) = line.strip_prefix("CMD ") {
            launch.args = serde_json::from_str(cmd).expect("CMD in exec form");
        }
    }
    launch
}

/// A vhost of the test's own, so the deployment's own object names are used
/// as they are without meeting any other test's.
struct Vhost(String);

impl Vhost {
    fn create() -> Self {
        let name = format!(
            "dltest-deploy-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        rabbitmqctl(&["add_vhost", &name]);
        rabbitmqctl(&["set_permissions", "-p", &name, "guest", ".*", ".*", ".*"]);
        Vhost(name)
    }

    fn uri(&self) -> String {
        format!(
            "amqp://guest:guest@{}/{}",
            crate::common::broker_address(),
            self.0
        )
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        let _ = crate::common::rabbitmqctl_command()
            .args(["-q", "delete_vhost", &self.0])
            .status();
    }
}

/// A PostgreSQL schema and a data directory of the test's own.
struct Ledger {
    schema: String,
    dir: PathBuf,
}

impl Ledger {
    fn create() -> Self {
        let schema = format!(
            "dltest_deploy_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        psql(&format!("CREATE SCHEMA {schema}"));
        let dir = std::env::temp_dir().join(&schema);
        Ledger { schema, dir }
    }

    fn url(&self) -> String {
        format!("{POSTGRES_URL}?options[search_path]={}", self.schema)
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        psql(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a deployment file documents doing once delayline runs, done here as
/// far as a machine without a container engine or cluster can.
struct Documented {
    /// `delayline token create ARGS`, whose entry goes to the clients file
    /// (a copy) and whose token is printed.
    token_create: Vec<String>,
    /// How the file is read again: SIGHUP from outside (`docker compose kill
    /// -s HUP`, `systemctl reload`), or by the service itself once the file
    /// changed (nothing sent).
    reload: Reload,
    /// A shell command that posts a task with `$TOKEN`, to `localhost:8080`;
    /// `None`: a plain POST with the token.
    request: Option<String>,
}

enum Reload {
    Signal,
    ByItself,
}

/// The words of the shell command in `text` that starts with `start`, up to
/// the end of its (continued) line or a closing `)`: quotes removed.
fn shell_words_after(text: &str, start: &str) -> Vec<String> {
    let joined = text
        .lines()
        .map(|line| line.trim_start_matches('#').trim())
        .collect::<Vec<_>>()
        .join(" ")
        .replace("\\ ", " ");
    let rest = joined
        .split_once(start)
        .unwrap_or_else(|| panic!("no {start:?} in {text}"))
        .1;
    let rest = rest.split(')').next().unwrap_or(rest);
    rest.split_whitespace()
        .map(|word| word.trim_matches('\'').trim_matches('"').to_owned())
        .take_while(|word| !word.is_empty())
        .collect()
}

/// Does what `documented` says on the running `service` (started by
/// `command`, listening on `port`): adds a client, reloads, and posts a task
/// with its token (202); with a metrics listener, scrapes it without one.
async fn follow_documented_steps(
    what: &str,
    documented: &Documented,
    command: impl Fn(&[String]) -> tokio::process::Command,
    service: &tokio::process::Child,
    port: u16,
    metrics_port: Option<u16>,
) {
    let created = command(&documented.token_create).output().await.unwrap();
    assert!(
        created.status.success(),
        "{what}: token create: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    let token = String::from_utf8_lossy(&created.stdout).trim().to_owned();
    assert!(token.starts_with("dlt_"), "{what}: printed {token:?}");
    match &documented.reload {
        Reload::Signal => crate::common::hang_up(service),
        Reload::ByItself => {}
    }
    let request = documented.request.clone().unwrap_or_else(|| {
        "curl -s -X POST localhost:8080/v1/tasks -H \"Authorization: Bearer $TOKEN\" \
         -H 'content-type: application/json' -d '{\"destination\": \"d\", \"delay\": \"1s\"}'"
            .to_owned()
    });
    let request = request.replace("localhost:8080", &format!("127.0.0.1:{port}"));
    let request = format!("{request} -s -o /dev/null -w '%{{http_code}}'");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answered = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&request)
            .env("TOKEN", &token)
            .output()
            .await
            .unwrap();
        let status = String::from_utf8_lossy(&answered.stdout).into_owned();
        if status == "202" {
            break;
        }
        // 401 until the reload has read the new client.
        assert!(
            status == "401" && tokio::time::Instant::now() < deadline,
            "{what}: the documented request answered {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(metrics_port) = metrics_port {
        let scrape = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
            .await
            .unwrap();
        assert_eq!(scrape.status(), 200, "{what}: the scraper has no token");
    }
}

/// Runs the binary as `launch` says, with only the documented substitutions
/// and `files` (paths inside the image) mapped to repository files; waits
/// until `delayline probe` (the health check) passes and the broker is
/// connected, then stops it with SIGTERM and expects a clean exit.
async fn runs_as_deployed(
    what: &str,
    launch: Launch,
    files: &[(&str, PathBuf)],
    documented: Option<Documented>,
) {
    let vhost = Vhost::create();
    let ledger = Ledger::create();
    let port = free_port();
    let mut env = launch.env;
    let on_postgres = env
        .get("DELAYLINE__STORE__URL")
        .is_some_and(|u| u.starts_with("postgres"));
    let mut substitute = |key: &str, value: String| {
        if let Some(old) = env.get_mut(key) {
            *old = value;
        }
    };
    substitute("DELAYLINE__AMQP__URI", vhost.uri());
    if on_postgres {
        substitute("DELAYLINE__STORE__URL", ledger.url());
    }
    substitute(
        "DELAYLINE__STORE__DATA_DIR",
        ledger.dir.display().to_string(),
    );
    // The containers listen on every address, behind tokens; the systemd
    // unit keeps the default loopback address, where an open API is allowed.
    let host = if env.contains_key("DELAYLINE__AUTH__CLIENTS_FILE") {
        "0.0.0.0"
    } else {
        "127.0.0.1"
    };
    env.insert("DELAYLINE__HTTP__BIND".into(), format!("{host}:{port}"));
    // A metrics listener's port is mapped like the API's.
    let metrics_port = env.contains_key("DELAYLINE__METRICS__BIND").then(free_port);
    if let Some(metrics_port) = metrics_port {
        env.insert(
            "DELAYLINE__METRICS__BIND".into(),
            format!("{host}:{metrics_port}"),
        );
    }
    // Otherwise the binary would use its default URI, outside the test's vhost.
    assert!(
        env.contains_key("DELAYLINE__AMQP__URI"),
        "{what} gives no AMQP URI"
    );
    let mut args = launch.args;
    let mut documented = documented;
    let mut step_args: Vec<&mut String> = documented
        .iter_mut()
        .flat_map(|d| d.token_create.iter_mut())
        .collect();
    for (inside, outside) in files {
        for value in env
            .values_mut()
            .chain(args.iter_mut())
            .chain(step_args.iter_mut().map(|v| &mut **v))
        {
            if value == inside {
                *value = outside.display().to_string();
            }
        }
    }
    let command = |args: &[String]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_delayline"));
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(&env)
            .kill_on_drop(true);
        command
    };
    let mut service = command(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let answer = loop {
        let probe = command(&["probe".to_owned()]).output().await.unwrap();
        let stdout = String::from_utf8_lossy(&probe.stdout).into_owned();
        if probe.status.success() && stdout.contains("\"broker\":\"connected\"") {
            break stdout;
        }
        if let Ok(Some(status)) = service.try_wait() {
            let output = service.wait_with_output().await.unwrap();
            panic!(
                "{what}: the service exited ({status}):\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: never ready; last probe: {stdout}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let readiness: Json =
        serde_json::from_str(answer.trim_start_matches("200 ")).expect("readiness JSON");
    assert_eq!(readiness["status"], "ready", "{what}");
    if env.contains_key("DELAYLINE__AUTH__CLIENTS_FILE") {
        let refused = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}/v1/tasks"))
            .json(&serde_json::json!({"destination": "d", "delay_ms": 0}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 401, "{what}: tokens are required");
    }
    if let Some(documented) = &documented {
        follow_documented_steps(what, documented, command, &service, port, metrics_port).await;
    }

    terminate(&service);
    let output = tokio::time::timeout(Duration::from_secs(30), service.wait_with_output())
        .await
        .expect("stops on SIGTERM")
        .unwrap();
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_dockerfile_builds_in_stages_and_runs_unprivileged() {
    let dockerfile = read("deploy/Dockerfile");
    let stages: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(stages.len(), 2, "{stages:?}");
    assert!(stages[0].ends_with(" AS build"));
    assert!(stages[1].contains("-slim"), "a small runtime image");
    let runtime = dockerfile.rsplit("\nFROM ").next().unwrap();
    let user = runtime
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER");
    assert!(
        !user.starts_with('0') && !user.starts_with("root"),
        "{user}"
    );
    assert!(runtime.contains("HEALTHCHECK") && runtime.contains("\"delayline\", \"probe\""));
    // Everything it copies from the context exists.
    for line in dockerfile.lines().filter(|l| l.starts_with("COPY ")) {
        if line.contains("--from=") {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        for source in &words[1..words.len() - 1] {
            assert!(repo(source).exists(), "{source} is copied but missing");
        }
    }
    let ignored = read(".dockerignore");
    assert!(ignored.lines().any(|l| l == "target"));
}

/// The build stage's `COPY` lines from the context: (sources, destination).
fn build_context_copies(dockerfile: &str) -> Vec<(Vec<String>, String)> {
    let build = dockerfile.split("\nFROM ").nth(1).expect("a build stage");
    build
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .filter(|l| !l.contains("--from="))
        .map(|l| {
            let mut words: Vec<String> = l.split_whitespace().map(str::to_owned).collect();
            let destination = words.pop().expect("a destination");
            (words, destination)
        })
        .collect()
}

/// Copies a file or folder, leaving out what .dockerignore names.
fn copy_context(from: &Path, to: &Path, ignored: &[&str]) {
    let name = from.file_name().unwrap().to_str().unwrap();
    if ignored.contains(&name) {
        return;
    }
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap().path();
            copy_context(&entry, &to.join(entry.file_name().unwrap()), ignored);
        }
    } else {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }
}

/// No container engine runs here, so the image's build context is built
/// the way its build stage builds it: exactly the files its `COPY` lines
/// take (less .dockerignore), resolved by cargo with the lock file as it
/// is (`cargo metadata --locked`, which fails as `docker build` did when a
/// workspace member is missing). A new workspace member, a file the build reads that is not copied,
/// or a target the `RUN` line names that the copied files lack fails here
/// rather than in `docker build`.
#[test]
fn the_images_build_context_resolves_and_holds_what_the_build_names() {
    let dockerfile = read("deploy/Dockerfile");
    let ignore_file = read(".dockerignore");
    let ignored: Vec<&str> = ignore_file.lines().map(str::trim).collect();
    let context = tempdir("docker-context");
    for (sources, destination) in build_context_copies(&dockerfile) {
        for source in sources {
            let target = if destination.ends_with('/') {
                context.join(&destination).join(&source)
            } else {
                context.join(&destination)
            };
            copy_context(&repo(&source), &target, &ignored);
        }
    }
    // Not offline: the benchmark's dependencies, which `cargo test` never
    // builds, may not be downloaded yet (crates.io is reachable here).
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args(["metadata", "--locked", "--format-version", "1"])
        .current_dir(&context)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "the image's build context does not resolve: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Json = serde_json::from_slice(&output.stdout).unwrap();
    let root = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "delayline")
        .expect("the delayline package");
    // Each target the RUN line builds is in the copied files.
    let run = dockerfile.replace("\\\n", " ");
    let build_line = run
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("a cargo build");
    let words: Vec<&str> = build_line.split_whitespace().collect();
    let mut named = 0;
    for pair in words.windows(2) {
        let kind = match pair[0] {
            "--bin" => "bin",
            "--example" => "example",
            _ => continue,
        };
        let target = root["targets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == pair[1] && t["kind"][0] == kind)
            .unwrap_or_else(|| panic!("{kind} {} is not in the build context", pair[1]));
        let source = Path::new(target["src_path"].as_str().unwrap());
        assert!(
            source.starts_with(&context) && source.exists(),
            "{source:?}"
        );
        named += 1;
    }
    assert_eq!(named, 2, "{build_line}");
    // The build script and what it reads (the migrations) are copied.
    assert!(context.join("src/build.rs").exists() && context.join("migrations").is_dir());
    // What the runtime stage copies from the build stage is what the RUN
    // line put there.
    let runtime = dockerfile.rsplit("\nFROM ").next().unwrap();
    for line in runtime
        .lines()
        .filter(|l| l.starts_with("COPY --from=build "))
    {
        let from = line.split_whitespace().nth(2).unwrap();
        assert!(
            run.contains(&format!(" {from}")),
            "{from} is copied from the build stage but never made there"
        );
    }
    // The user it runs as is the one it creates, and the entrypoint is the
    // binary it installs.
    assert!(runtime.contains("--uid 10001") && runtime.contains("USER 10001:10001"));
    assert!(runtime.contains("ENTRYPOINT [\"delayline\"]"));
    assert!(
        runtime.contains("COPY --from=build /usr/local/bin/delayline /usr/local/bin/delayline")
    );
    std::fs::remove_dir_all(&context).unwrap();
}

/// A compose service's launch: the image's, with the service's environment over it.
fn compose_launch(file: &Value, service: &str) -> Launch {
    let mut launch = image_launch();
    let environment = file["services"][service]["environment"]
        .as_mapping()
        .expect("environment as a mapping");
    for (key, value) in environment {
        let value = match value {
            Value::String(s) => s.clone(),
            other => serde_norway::to_string(other).unwrap().trim().to_owned(),
        };
        launch
            .env
            .insert(key.as_str().unwrap().to_owned(), value.to_owned());
    }
    launch
}

/// The delayline service of a compose file runs: the image's configuration
/// file is the repository's example, which the Dockerfile copies there.
async fn compose_service_runs(what: &str, compose: &Value, documented: Option<Documented>) {
    let image_config = (
        "/etc/delayline/delayline.toml",
        repo("deploy/delayline.example.toml"),
    );
    // A copy: the documented steps append a client to it.
    let dir = tempdir("compose");
    let clients_copy = dir.join("clients.toml");
    std::fs::copy(repo("deploy/clients.toml"), &clients_copy).unwrap();
    let clients = ("/etc/delayline-clients/clients.toml", clients_copy.clone());
    // Where the documented `token create` writes: deploy/ mounted at /out.
    let appended = ("/out/clients.toml", clients_copy);
    assert!(
        compose["services"]["delayline"]["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|v| v.as_str() == Some("./clients.toml:/etc/delayline-clients/clients.toml:ro")),
        "{what} mounts the clients file"
    );
    runs_as_deployed(
        what,
        compose_launch(compose, "delayline"),
        &[image_config, clients, appended],
        documented,
    )
    .await;
    let _ = std::fs::remove_dir_all(dir);
}

/// The steps compose.yaml's first lines document: a client added with
/// `token create` (in the image: the binary here), SIGHUP, then the request.
fn compose_documented_steps() -> Documented {
    let text = read("deploy/compose.yaml");
    let header: String = text
        .lines()
        .take_while(|line| line.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(header.contains("docker compose -f deploy/compose.yaml kill -s HUP delayline"));
    let mut token_create = vec!["token".to_owned(), "create".to_owned()];
    token_create.extend(shell_words_after(&header, "delayline token create"));
    let curl = header
        .split("   curl ")
        .nth(1)
        .expect("a curl step")
        .split("\n#   docker")
        .next()
        .unwrap()
        .lines()
        .map(|line| line.trim_start_matches('#').trim())
        .collect::<Vec<_>>()
        .join(" ")
        .replace("\\ ", " ");
    Documented {
        token_create,
        reload: Reload::Signal,
        request: Some(format!("curl {curl}")),
    }
}

fn assert_healthy_dependencies(file: &Value, service: &str, on: &[&str]) {
    for dependency in on {
        assert_eq!(
            str_of(
                file,
                &["services", service, "depends_on", dependency, "condition"]
            ),
            "service_healthy",
            "{service} waits for {dependency}"
        );
        assert!(
            file["services"][*dependency]["healthcheck"]["test"].is_sequence(),
            "{dependency} has a health check"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_starts_rabbitmq_postgres_delayline_and_a_consumer() {
    let compose = yaml("deploy/compose.yaml");
    assert!(str_of(&compose, &["services", "rabbitmq", "image"]).contains("management"));
    assert_healthy_dependencies(&compose, "delayline", &["rabbitmq", "postgres"]);
    assert_healthy_dependencies(&compose, "consumer", &["delayline"]);
    assert_eq!(
        str_of(&compose, &["services", "delayline", "build", "dockerfile"]),
        "deploy/Dockerfile"
    );
    assert_eq!(
        str_of(&compose, &["services", "consumer", "entrypoint", "0"]),
        "delayline-example-consumer"
    );
    assert!(read("deploy/Dockerfile").contains("/usr/local/bin/delayline-example-consumer"));
    // The levels' dead-letter workers set as the cluster's are.
    assert!(mounts_advanced_config(&compose, "rabbitmq"));
    assert_advanced_config();

    compose_service_runs("compose.yaml", &compose, Some(compose_documented_steps())).await;
}

/// Whether compose's `service` mounts deploy/rabbitmq/advanced.config.
fn mounts_advanced_config(compose: &Value, service: &str) -> bool {
    let volumes = compose["services"][service]["volumes"]
        .as_sequence()
        .unwrap();
    volumes.iter().any(|v| {
        v.as_str()
            .unwrap()
            .starts_with("./rabbitmq/advanced.config:/etc/rabbitmq/advanced.config")
    })
}

/// The dead-letter stall bounded, and the workers' prefetch raised, in a
/// file Erlang reads as RabbitMQ will (a stray character would stop the
/// node from starting): by the `erl` RabbitMQ runs on.
fn assert_advanced_config() {
    let advanced = read("deploy/rabbitmq/advanced.config");
    assert!(advanced.contains("{dead_letter_worker_publisher_confirm_timeout, 10000}"));
    assert!(advanced.contains("{dead_letter_worker_consumer_prefetch, 1024}"));
    let path = repo("deploy/rabbitmq/advanced.config");
    let consult = format!(
        "{{ok, [[{{rabbit, Settings}}]]}} = file:consult(\"{}\"), \
         io:format(\"~p~n\", [lists:sort(Settings)]), halt().",
        path.display()
    );
    let output = std::process::Command::new("erl")
        .args(["-noshell", "-eval", &consult])
        // A failed read is told on stderr; no crash dump in the working tree.
        .env("ERL_CRASH_DUMP_SECONDS", "0")
        .output()
        .expect("erl, which RabbitMQ runs on");
    let read = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{read}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        read.split_whitespace().collect::<String>(),
        "[{dead_letter_worker_consumer_prefetch,1024},\
         {dead_letter_worker_publisher_confirm_timeout,10000}]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_example_gives_delayline_every_node_of_three() {
    let compose = yaml("deploy/compose.cluster.yaml");
    let nodes: Vec<&str> = ["rabbit1", "rabbit2", "rabbit3"]
        .into_iter()
        .filter(|n| compose["services"][*n].is_mapping())
        .collect();
    assert_eq!(nodes.len(), 3);
    // A shard per node: their leaders are placed `balanced`.
    let shards = &[
        "services",
        "delayline",
        "environment",
        "DELAYLINE__CASCADE__SHARDS",
    ];
    assert_eq!(str_of(&compose, shards), "3");
    let cluster_conf = read("deploy/rabbitmq/cluster.conf");
    let delayline_uri = str_of(
        &compose,
        &[
            "services",
            "delayline",
            "environment",
            "DELAYLINE__AMQP__URI",
        ],
    );
    let consumer_uri = str_of(
        &compose,
        &["services", "consumer", "environment", "AMQP_URI"],
    );
    for node in &nodes {
        // Merged from the shared anchor: same cookie, same cluster file.
        assert_eq!(
            str_of(
                &compose,
                &["services", node, "environment", "RABBITMQ_ERLANG_COOKIE"]
            ),
            "delayline-cluster-cookie"
        );
        assert_eq!(str_of(&compose, &["services", node, "hostname"]), *node);
        assert!(cluster_conf.contains(&format!("rabbit@{node}")));
        // No proxy in front: delayline and the consumer move between nodes themselves.
        let address = format!("@{node}:5672/");
        assert!(delayline_uri.contains(&address), "{delayline_uri}");
        assert!(consumer_uri.contains(&address), "{consumer_uri}");
        // Each node bounds the dead-letter stall (see deploy/rabbitmq/advanced.config).
        assert!(mounts_advanced_config(&compose, node), "{node}");
    }
    assert_advanced_config();
    assert!(
        compose["services"]["delayline"]["ports"].is_sequence(),
        "the API is published"
    );
    let mut dependencies = nodes.clone();
    dependencies.push("postgres");
    assert_healthy_dependencies(&compose, "delayline", &dependencies);
    assert_eq!(
        str_of(
            &compose,
            &[
                "services",
                "delayline",
                "environment",
                "DELAYLINE__CASCADE__QUEUE_TYPE"
            ]
        ),
        "quorum"
    );

    compose_service_runs("compose.cluster.yaml", &compose, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_manifests_probe_health_and_take_the_uri_from_the_secret() {
    let deployment = yaml("deploy/k8s/deployment.yaml");
    let service = yaml("deploy/k8s/service.yaml");
    let config_map = yaml("deploy/k8s/configmap.yaml");
    let secret = yaml("deploy/k8s/secret.yaml");
    let kustomization = yaml("deploy/k8s/kustomization.yaml");
    for (document, kind) in [
        (&deployment, "Deployment"),
        (&service, "Service"),
        (&config_map, "ConfigMap"),
        (&secret, "Secret"),
    ] {
        assert_eq!(str_of(document, &["kind"]), kind);
        assert!(document["apiVersion"].is_string());
    }
    let resources = kustomization["resources"].as_sequence().unwrap();
    for resource in resources {
        assert!(repo(&format!("deploy/k8s/{}", resource.as_str().unwrap())).exists());
    }

    let pod = &deployment["spec"]["template"]["spec"];
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], labels);
    assert_eq!(&service["spec"]["selector"], labels);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], Value::Bool(true));
    let container = &pod["containers"][0];
    assert_eq!(
        str_of(container, &["readinessProbe", "httpGet", "path"]),
        "/readyz"
    );
    assert_eq!(
        str_of(container, &["livenessProbe", "httpGet", "path"]),
        "/healthz"
    );
    let port_name = str_of(container, &["ports", "0", "name"]);
    assert_eq!(
        str_of(&service, &["spec", "ports", "0", "targetPort"]),
        port_name
    );
    assert_eq!(
        str_of(container, &["readinessProbe", "httpGet", "port"]),
        port_name
    );

    // The image the deployment guide builds is the one the Deployment runs.
    let image = str_of(container, &["image"]);
    assert!(
        read("docs/deployment.md").contains(&format!("-t {image} .")),
        "docs/deployment.md builds another tag than {image}"
    );
    // A read-only root file system: the image's data directory is a volume.
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"],
        Value::Bool(true)
    );
    let data_dir = "/var/lib/delayline";
    assert!(read("deploy/Dockerfile").contains(&format!("DELAYLINE__STORE__DATA_DIR={data_dir}")));
    let ledger_volume = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"].as_str() == Some(data_dir))
        .expect("the ledger's directory is mounted");
    let volume_name = str_of(ledger_volume, &["name"]);
    assert!(
        pod["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|v| v["name"].as_str() == Some(volume_name)),
        "volume {volume_name} is declared"
    );

    // The container's environment, with each secretKeyRef resolved from the Secret.
    let mut launch = image_launch();
    launch.args = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let mut uses_secret = false;
    for variable in container["env"].as_sequence().unwrap() {
        let name = str_of(variable, &["name"]).to_owned();
        let value = match variable["value"].as_str() {
            Some(value) => value.to_owned(),
            None => {
                let reference = &variable["valueFrom"]["secretKeyRef"];
                assert_eq!(
                    str_of(reference, &["name"]),
                    str_of(&secret, &["metadata", "name"])
                );
                uses_secret |= name == "DELAYLINE__AMQP__URI";
                str_of(&secret, &["stringData", str_of(reference, &["key"])]).to_owned()
            }
        };
        launch.env.insert(name, value);
    }
    assert!(uses_secret, "the AMQP URI comes from the Secret");

    // The ConfigMap is mounted where DELAYLINE_CONFIG points.
    let mount = str_of(container, &["volumeMounts", "0", "mountPath"]);
    assert_eq!(
        str_of(pod, &["volumes", "0", "configMap", "name"]),
        str_of(&config_map, &["metadata", "name"])
    );
    let config_path = format!("{mount}/delayline.toml");
    assert_eq!(launch.env["DELAYLINE_CONFIG"], config_path);
    let dir = tempdir("k8s");
    let config_file = dir.join("delayline.toml");
    std::fs::write(
        &config_file,
        str_of(&config_map, &["data", "delayline.toml"]),
    )
    .unwrap();

    // The clients file is the Secret's, mounted where the variable points.
    let clients_path = launch.env["DELAYLINE__AUTH__CLIENTS_FILE"].clone();
    let clients_file = dir.join("clients.toml");
    std::fs::write(
        &clients_file,
        str_of(&secret, &["stringData", "clients.toml"]),
    )
    .unwrap();
    // The scrape annotations name the metrics listener, open without a token.
    let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
    let metrics_bind = launch.env["DELAYLINE__METRICS__BIND"].clone();
    assert_eq!(
        metrics_bind.rsplit(':').next(),
        Some(str_of(annotations, &["prometheus.io/port"]))
    );
    // The Secret's documented reload, for an image without `kill`.
    let secret_text = read("deploy/k8s/secret.yaml");
    assert!(secret_text.contains("each replica reads it again by"));
    assert!(secret_text.contains("`kubectl exec <pod> -- delayline reload`"));
    let documented = Documented {
        token_create: ["token", "create", "--name", "ops", "--destination", "#"]
            .into_iter()
            .chain([
                "--permission",
                "submit",
                "--append-to",
                clients_path.as_str(),
            ])
            .map(str::to_owned)
            .collect(),
        reload: Reload::ByItself,
        request: None,
    };
    runs_as_deployed(
        "deploy/k8s",
        launch,
        &[
            (config_path.as_str(), config_file.clone()),
            (clients_path.as_str(), clients_file),
        ],
        Some(documented),
    )
    .await;
    let _ = std::fs::remove_dir_all(dir);
}

fn tempdir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "dltest-{what}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_systemd_unit_verifies_and_runs_with_its_environment_file() {
    let unit = read("deploy/systemd/delayline.service");
    let value_of = |key: &str| -> Vec<&str> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .collect()
    };
    let exec_start = value_of("ExecStart")[0];
    let (binary, args) = exec_start.split_once(' ').unwrap();
    let environment_file = value_of("EnvironmentFile")[0];
    assert_eq!(environment_file, "/etc/delayline/delayline.env");
    let installed = [
        (binary, PathBuf::from(env!("CARGO_BIN_EXE_delayline"))),
        (
            "/etc/delayline/delayline.toml",
            repo("deploy/delayline.example.toml"),
        ),
        (environment_file, repo("deploy/systemd/delayline.env")),
    ];

    // systemd-analyze checks the unit with the files where the unit expects them.
    let dir = tempdir("systemd");
    let mut local_unit = unit.clone();
    for (inside, outside) in &installed {
        local_unit = local_unit.replace(inside, &outside.display().to_string());
    }
    let unit_file = dir.join("delayline.service");
    std::fs::write(&unit_file, local_unit).unwrap();
    match std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit_file)
        .output()
    {
        Ok(output) => assert!(
            output.status.success() && output.stderr.is_empty(),
            "systemd-analyze verify: {}",
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(error) => eprintln!("systemd-analyze is not available ({error}); unit not verified"),
    }

    // The environment as systemd builds it: the file, then Environment= lines
    // with %S (the state directory root) expanded.
    let mut launch = Launch {
        args: args.split_whitespace().map(str::to_owned).collect(),
        ..Launch::default()
    };
    for line in read("deploy/systemd/delayline.env").lines() {
        if let Some((key, value)) = line.split_once('=').filter(|_| !line.starts_with('#')) {
            launch.env.insert(key.to_owned(), value.to_owned());
        }
    }
    for assignment in value_of("Environment") {
        let (key, value) = assignment.split_once('=').unwrap();
        let value = value.replace("%S", &dir.display().to_string());
        launch.env.insert(key.to_owned(), value);
    }
    runs_as_deployed("systemd", launch, &installed[1..2], None).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// The alert rules pass `promtool check rules` and their unit tests
/// (`promtool test rules`: each alert quiet, then firing with its labels and
/// annotations); the Operator's PrometheusRule holds the same groups; each
/// alert's `runbook_url` is an entry of docs/runbook.md. (That the tests'
/// series are shaped as /metrics exports them is the library's test
/// `the_alert_rules_tests_feed_series_shaped_as_exported`.)
#[test]
fn the_alert_rules_pass_promtool_and_each_links_its_runbook_entry() {
    let promtool = |args: &[&str]| {
        let output = std::process::Command::new("promtool")
            .args(args)
            .current_dir(repo("deploy/prometheus"))
            .output()
            .expect("promtool (Debian's prometheus package; tests/run installs it)");
        let said = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "promtool {args:?}:\n{said}");
        said
    };
    let checked = promtool(&["check", "rules", "delayline-alerts.yml"]);
    assert!(checked.contains("SUCCESS: 15 rules found"), "{checked}");
    promtool(&["test", "rules", "delayline-alerts.test.yml"]);

    let rules = yaml("deploy/prometheus/delayline-alerts.yml");
    let operator = yaml("deploy/k8s/monitoring/prometheusrule.yaml");
    assert_eq!(str_of(&operator, &["kind"]), "PrometheusRule");
    assert_eq!(operator["spec"]["groups"], rules["groups"]);

    let runbook = read("docs/runbook.md");
    let tested = read("deploy/prometheus/delayline-alerts.test.yml");
    let groups = rules["groups"].as_sequence().unwrap();
    let alerts = groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap());
    for alert in alerts {
        let name = str_of(alert, &["alert"]);
        let url = str_of(alert, &["annotations", "runbook_url"]);
        let anchor = format!("#{}", name.to_lowercase());
        assert!(
            url.ends_with(&format!("docs/runbook.md{anchor}")),
            "{name}: {url}"
        );
        assert!(
            runbook.contains(&format!("\n### {name}\n")),
            "no runbook entry {name}"
        );
        assert!(
            tested.contains(&format!("alertname: {name}\n")),
            "{name} has no unit test"
        );
        let severity = str_of(alert, &["labels", "severity"]);
        assert!(
            ["critical", "warning", "info"].contains(&severity),
            "{name}"
        );
    }
}
