//! The npm packages the tests drive (amqplib, as Node producers of the
//! delayed-message plugin use it; playwright-core, which drives Debian's
//! Chromium and downloads no browser), under `target/`, installed on first use:
//! `cargo test` needs Node.js and npm, nothing installed by hand.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Pinned, so that a new release cannot change what the tests check.
pub const PACKAGES: &[&str] = &["amqplib@0.10.9", "playwright-core@1.64.1"];

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-node")
}

/// `node` with the packages on its module path, ready to run a script.
pub fn node() -> Command {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(error) = READY.get_or_init(prepare) {
        panic!(
            "the tests' npm packages could not be installed ({error}); they need node and npm, \
             and the npm registry (or: npm install --prefix {} {})",
            folder().display(),
            PACKAGES.join(" ")
        );
    }
    let mut command = Command::new("node");
    command.env("NODE_PATH", folder().join("node_modules"));
    command
}

fn prepare() -> Result<(), String> {
    let folder = folder();
    let stamp = folder.join("packages.txt");
    let wanted = PACKAGES.join("\n");
    if std::fs::read_to_string(&stamp).is_ok_and(|had| had == wanted) {
        return Ok(());
    }
    std::fs::create_dir_all(&folder).map_err(|e| e.to_string())?;
    let output = Command::new("npm")
        .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
        .arg(&folder)
        .args(PACKAGES)
        .output()
        .map_err(|e| format!("npm: {e}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    std::fs::write(&stamp, wanted).map_err(|e| e.to_string())
}
