//! `delayline reload`: SIGHUP to a running `delayline serve`, for images
//! that have no `kill`. Only a process whose command line is `delayline
//! serve` is signalled: SIGHUP ends most other programs, and makes init
//! re-execute itself.

use std::path::Path;

use super::OperationError;

/// Sends SIGHUP to `pid`, or to the one `delayline serve` running here
/// (in its container, or on this host); returns the process signalled.
pub fn reload(pid: Option<i32>) -> Result<i32, OperationError> {
    let pid = match pid {
        Some(pid) => {
            let command = command_line(pid).ok_or_else(|| {
                OperationError::Refused(format!("no process {pid} can be seen here"))
            })?;
            if !is_delayline_serve(&command) {
                return Err(OperationError::Refused(format!(
                    "process {pid} is `{}`, not `delayline serve`: not signalled",
                    command.join(" ")
                )));
            }
            pid
        }
        None => the_one_service()?,
    };
    let process = rustix::process::Pid::from_raw(pid)
        .ok_or_else(|| OperationError::Refused(format!("{pid} is not a process id")))?;
    rustix::process::kill_process(process, rustix::process::Signal::HUP).map_err(|error| {
        OperationError::Refused(format!("sending SIGHUP to process {pid}: {error}"))
    })?;
    Ok(pid)
}

/// Whether a command line is a delayline serving: the program named
/// `delayline` (by any path) with `serve` among its words.
pub fn is_delayline_serve(command: &[String]) -> bool {
    let Some(program) = command.first() else {
        return false;
    };
    let name = Path::new(program).file_name().and_then(|n| n.to_str());
    name == Some("delayline") && command[1..].iter().any(|word| word == "serve")
}

/// The one `delayline serve` this process can see; refused when there is
/// none or there are several (`--pid` then says which).
fn the_one_service() -> Result<i32, OperationError> {
    let own = std::process::id();
    let entries = std::fs::read_dir("/proc").map_err(|source| OperationError::File {
        action: "list",
        path: "/proc".into(),
        source,
    })?;
    let serving: Vec<i32> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| u32::try_from(*pid).ok() != Some(own))
        .filter(|pid| command_line(*pid).is_some_and(|c| is_delayline_serve(&c)))
        .collect();
    match serving[..] {
        [pid] => Ok(pid),
        [] => Err(OperationError::Refused(
            "no `delayline serve` runs here (each replica reads its files again by itself when \
             they change; see http.reload_check_ms)"
                .into(),
        )),
        _ => Err(OperationError::Refused(format!(
            "several `delayline serve` run here (processes {serving:?}): name one with --pid"
        ))),
    }
}

/// A process's command line, word by word; `None` when it cannot be read.
fn command_line(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let words: Vec<String> = raw
        .split(|byte| *byte == 0)
        .filter(|word| !word.is_empty())
        .map(|word| String::from_utf8_lossy(word).into_owned())
        .collect();
    (!words.is_empty()).then_some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn only_delayline_serving_is_signalled() {
        for serving in [
            "delayline serve",
            "/usr/local/bin/delayline serve",
            "target/release/delayline --config /etc/delayline.toml serve",
        ] {
            assert!(is_delayline_serve(&words(serving)), "{serving}");
        }
        for other in [
            "/sbin/init",
            "systemd --system",
            "delayline reload",
            "delayline-bench serve",
            "/bin/sh -c delayline serve",
            "",
        ] {
            assert!(!is_delayline_serve(&words(other)), "{other}");
        }
    }

    #[test]
    fn init_is_refused_by_its_pid() {
        // PID 1 here is this machine's init or the test's container: not
        // delayline, so nothing is sent.
        if command_line(1).is_some_and(|c| !is_delayline_serve(&c)) {
            let refused = reload(Some(1)).unwrap_err().to_string();
            assert!(refused.contains("not `delayline serve`"), "{refused}");
        }
    }
}
