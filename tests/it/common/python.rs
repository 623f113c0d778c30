//! The Python packages the tests drive (pika and httpx for the README's
//! consumer and the client examples, schemathesis for the contract test,
//! jsonschema for strict schema checks), in a virtual environment under `target/`, made on first use. So `cargo
//! test` needs nothing installed by hand beyond Python itself, and never
//! installs into the machine's own Python.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Pinned, so that a new release cannot change what the tests check.
pub const PACKAGES: &[&str] = &[
    "pika==1.4.4",
    "httpx==0.28.1",
    "schemathesis==4.32.5",
    "jsonschema==4.26.0",
];

/// The environment's folder; its `bin/` holds `python` and `schemathesis`.
fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-python")
}

/// The environment's `bin/NAME`, the environment made (once per test run,
/// and kept between runs) if it is not there yet.
pub fn tool(name: &str) -> PathBuf {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(error) = READY.get_or_init(prepare) {
        panic!(
            "the tests' Python environment could not be made ({error}); it needs python3 with \
             venv and pip, and PyPI (or: python3 -m venv {0} && {0}/bin/pip install {1})",
            folder().display(),
            PACKAGES.join(" ")
        );
    }
    folder().join("bin").join(name)
}

fn prepare() -> Result<(), String> {
    let folder = folder();
    let stamp = folder.join("packages.txt");
    let wanted = PACKAGES.join("\n");
    if std::fs::read_to_string(&stamp).is_ok_and(|had| had == wanted) {
        return Ok(());
    }
    run(Command::new("python3").args(["-m", "venv"]).arg(&folder))?;
    run(Command::new(folder.join("bin/python"))
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .args(PACKAGES))?;
    std::fs::write(&stamp, wanted).map_err(|e| e.to_string())
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
