//! The command line as an operator meets it in a shell: output piped into
//! a reader that stops early.

use std::process::Stdio;

use delayline::cascade::QueueType;

use crate::common::{delayline_command, test_settings};

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
