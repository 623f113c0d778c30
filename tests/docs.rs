//! The documents' links hold: in every Markdown file of the repository (the
//! README, the guide under `docs/`, BENCHMARKS.md, RELIABILITY.md, the
//! benchmark records), every `#anchor` names one of the heading anchors
//! GitHub makes, and every relative link or image names a file, from the
//! document's own folder as GitHub reads it. A heading lost in an edit, a
//! page moved, or a screenshot not committed, fails here, not in a reader's
//! browser. Read off the text; no broker needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Folders that hold no documents of the repository's own.
const NOT_DOCUMENTS: [&str; 4] = ["target", ".git", "node_modules", ".cargo"];

/// Every Markdown file of the repository, as paths from its root.
fn documents() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![PathBuf::new()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(root().join(&folder)).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = folder.join(&name);
            if entry.file_type().unwrap().is_dir() {
                if !NOT_DOCUMENTS.contains(&name.as_str()) {
                    folders.push(path);
                }
            } else if name.ends_with(".md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// GitHub's anchor of a heading: lower case, punctuation dropped but `-`
/// and `_`, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// A document's lines outside code blocks (and not their fences).
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut in_code = false;
    text.lines().filter(move |line| {
        if line.starts_with("```") {
            in_code = !in_code;
            return false;
        }
        !in_code
    })
}

/// The anchors of a document's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .filter(|line| line.starts_with('#'))
        .map(|line| anchor(line.trim_start_matches('#')))
        .collect()
}

/// Every `](target)` of a document, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                found.push(rest[..end].to_owned());
            }
        }
    }
    found
}

#[test]
fn every_link_names_a_heading_or_a_file() {
    let documents = documents();
    for expected in ["README.md", "BENCHMARKS.md", "docs/api.md"] {
        assert!(documents.contains(&PathBuf::from(expected)), "{expected}");
    }
    let mut broken = Vec::new();
    for document in &documents {
        let text = std::fs::read_to_string(root().join(document)).unwrap();
        let folder = document.parent().unwrap_or(Path::new(""));
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                document.clone()
            } else {
                folder.join(file)
            };
            let Ok(target_text) = std::fs::read_to_string(root().join(&target)) else {
                if !root().join(&target).exists() {
                    broken.push(format!("{}: {link} (no such file)", document.display()));
                }
                continue;
            };
            if !fragment.is_empty() && !anchors(&target_text).contains(fragment) {
                broken.push(format!("{}: {link} (no such heading)", document.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(anchor(" Quick start"), "quick-start");
    assert_eq!(
        anchor(" Coming from the x-delayed-message plugin"),
        "coming-from-the-x-delayed-message-plugin"
    );
    assert_eq!(
        anchor(" `GET /v1/tasks/{id}` → `200`"),
        "get-v1tasksid--200"
    );
}

/// The example file's settings: `section.key` and the value as written
/// (`None` for a key shown commented out, which has no default).
fn example_settings() -> Vec<(String, Option<String>)> {
    let text = std::fs::read_to_string(root().join("deploy/delayline.example.toml")).unwrap();
    let mut section = String::new();
    let mut settings = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        if line.starts_with("# [[") {
            section = "[commented".to_owned();
            continue;
        }
        // Array tables ([[ingress]], [[auth.clients]]) are shown commented out.
        if section.starts_with('[') {
            continue;
        }
        let (commented, line) = match line.strip_prefix("# ") {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let Some((key, value)) = line.split_once(" = ") else {
            continue;
        };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            continue;
        }
        let value = (!commented).then(|| value.trim().trim_matches('"').to_owned());
        settings.push((format!("{section}.{key}"), value));
    }
    settings
}

/// The configuration reference (`docs/configuration.md`) names every key
/// of the example file, which a unit test keeps equal to the code's
/// defaults, with that default and its environment variable, and no key
/// the file does not have: the reference cannot drift from the code.
#[test]
fn the_configuration_reference_is_the_example_files_keys_and_defaults() {
    let reference = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let rows: Vec<Vec<&str>> = reference
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| line.split(" | ").collect())
        .collect();
    let settings = example_settings();
    assert!(settings.len() > 40, "the example file read too few keys");
    for (key, value) in &settings {
        let row = rows
            .iter()
            .find(|cells| cells[0].contains(&format!("`{key}`")))
            .unwrap_or_else(|| panic!("docs/configuration.md has no row for `{key}`"));
        let default = match value.as_deref() {
            None => "*(unset)*".to_owned(),
            Some("") => "*(empty)*".to_owned(),
            Some(value) => format!("`{value}`"),
        };
        assert_eq!(row[1], default, "the default of `{key}`");
        let variable = format!("`DELAYLINE__{}`", key.to_uppercase().replace('.', "__"));
        assert!(row[2].contains(&variable), "`{key}`'s variable {variable}");
    }
    for cells in &rows {
        for key in cells[0]
            .split(", ")
            .map(|key| key.trim_matches(['|', ' ', '`']))
        {
            assert!(
                key == "[[ingress]]"
                    || key == "[[retry]]"
                    || settings.iter().any(|(known, _)| known == key),
                "docs/configuration.md documents `{key}`, which the example file has not"
            );
        }
    }
}

/// The lines of a document's code blocks.
fn code(text: &str) -> Vec<&str> {
    let mut in_code = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
                return false;
            }
            in_code
        })
        .collect()
}

/// A command names the binary as the reader has it then: `cargo run
/// --release --` in the README until its install step, `delayline` in the
/// guide, which starts with the install (`docs/getting-started.md`).
#[test]
fn commands_name_the_binary_as_the_reader_has_it() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let (before_install, _) = readme
        .split_once("cargo install --locked --path .")
        .expect("the README's install step");
    for line in code(before_install) {
        assert!(
            !line.trim_start().starts_with("delayline "),
            "README, before the install step: {line}"
        );
    }
    for document in documents() {
        let name = document.to_string_lossy().into_owned();
        let how_to_build = ["docs/getting-started.md", "docs/development.md"];
        if !name.starts_with("docs/")
            || name.starts_with("docs/bench/")
            || how_to_build.contains(&name.as_str())
        {
            continue;
        }
        let text = std::fs::read_to_string(root().join(&document)).unwrap();
        let built = text.lines().find(|line| line.contains("cargo run"));
        assert!(
            built.is_none(),
            "{name} names the binary as cargo run, after the install: {built:?}"
        );
    }
}

/// The getting-started page states the Rust version `Cargo.toml` declares
/// (an older toolchain stops on it), and promises no first delivery in
/// minutes that the first build alone takes longer than.
#[test]
fn getting_started_states_the_rust_version_and_an_honest_first_run() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let version = manifest
        .lines()
        .find_map(|line| line.strip_prefix("rust-version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("Cargo.toml declares a rust-version");
    let page = std::fs::read_to_string(root().join("docs/getting-started.md")).unwrap();
    assert!(
        page.contains(&format!("Rust {version} or later")),
        "{version}"
    );
    assert!(!page.contains("five minutes"));
    assert!(page.contains("eight minutes on two cores"));
}

/// Every deploy file gives a stop more time than the stop's own bound
/// (`stop.timeout_ms` in the example file) and a few seconds to exit, so
/// that delayline ends its stop itself, saying what it abandoned, before
/// the orchestrator kills it.
#[test]
fn the_deploy_files_grace_periods_exceed_the_stops_bound() {
    let bound_ms: u64 = example_settings()
        .into_iter()
        .find(|(key, _)| key == "stop.timeout_ms")
        .and_then(|(_, value)| value?.parse().ok())
        .expect("the example file's stop.timeout_ms");
    let graces = [
        (
            "deploy/k8s/deployment.yaml",
            "terminationGracePeriodSeconds: ",
        ),
        ("deploy/systemd/delayline.service", "TimeoutStopSec="),
        ("deploy/compose.yaml", "stop_grace_period: "),
        ("deploy/compose.cluster.yaml", "stop_grace_period: "),
    ];
    for (file, key) in graces {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let seconds: u64 = text
            .lines()
            .find_map(|line| line.trim().strip_prefix(key))
            .map(|value| value.trim_end_matches('s').trim())
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("{file} sets no {key}"));
        assert!(seconds * 1000 >= bound_ms + 3_000, "{file}: {seconds} s");
    }
}

/// The plugin migration says, at the step that deletes the plugin's
/// exchange, that deleting it discards what it holds, that producers move
/// first and the longest `x-delay` still held is waited out (and how to see
/// it), and to migrate before upgrading to RabbitMQ 4.3.
#[test]
fn the_plugin_migration_warns_before_the_exchange_is_deleted() {
    let page = std::fs::read_to_string(root().join("docs/plugin.md")).unwrap();
    let (before, _) = page
        .split_once("curl -fsS -u guest:guest -X DELETE")
        .expect("the delete step");
    let step = before
        .rsplit_once("2. **Delete the plugin's exchange**")
        .expect("step 2")
        .1;
    for said in [
        "discards every message it still holds",
        "Move the producers first",
        "Wait out the longest `x-delay` still held",
        "messages_delayed",
    ] {
        assert!(step.contains(said), "step 2 before the delete: {said:?}");
    }
    assert!(page.contains("Migrate before you upgrade RabbitMQ to 4.3"));
}
