//! The broker's own command line, for what only it reports (its process,
//! its memory, every queue's depth). A leaf: it knows no other bench module.

use anyhow::{Context, bail};

/// `rabbitmqctl` for the broker under test: `RABBITMQCTL` (words split on
/// white space, e.g. `chroot DIR rabbitmqctl -n NODE` for the RabbitMQ 4
/// that `.ci/rabbitmq4.sh` runs), else the machine's.
pub fn rabbitmqctl_command() -> std::process::Command {
    let line = std::env::var("RABBITMQCTL").unwrap_or_else(|_| "rabbitmqctl".to_owned());
    let mut words = line.split_whitespace();
    let mut command = std::process::Command::new(words.next().unwrap_or("rabbitmqctl"));
    command.args(words);
    command
}

/// `rabbitmqctl <args> --formatter json`, parsed.
pub fn rabbitmqctl_json(args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let out = rabbitmqctl_command()
        .args(args)
        .args(["--formatter", "json"])
        .output()
        .context("running rabbitmqctl")?;
    if !out.status.success() {
        bail!(
            "rabbitmqctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("reading rabbitmqctl's JSON")
}
