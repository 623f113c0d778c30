//! A stop that ends in bounded time: its setting (`[stop]`), and waiting
//! for named background work until a deadline, naming what was still
//! running when it passed.
//!
//! Why a bound: an orchestrator kills a process that outlives its grace
//! period (Kubernetes' default is 30 s, systemd's 90 s), in the middle of
//! whatever it was doing, and an upgrade waits on it meanwhile. A stop that
//! gives up at a bound of its own, below the grace, ends the same way a
//! crash would (what is unacknowledged returns to its queue, what is
//! pending in the ledger is taken up by the next start or another replica:
//! the crash tests show nothing is lost), but says so, and says what it
//! abandoned.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The `[stop]` section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StopSettings {
    /// How long a stop may take, from the signal to the exit; what still
    /// runs then is abandoned. Below the orchestrator's grace period.
    pub timeout_ms: u64,
}

impl Default for StopSettings {
    fn default() -> Self {
        StopSettings { timeout_ms: 10_000 }
    }
}

impl StopSettings {
    pub fn validate(&self) -> Result<(), String> {
        match self.timeout_ms {
            0 => Err("stop.timeout_ms must be at least 1".to_owned()),
            _ => Ok(()),
        }
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// A piece of background work, by the name a stop that gives up on it
/// says.
#[derive(Debug)]
pub struct Named {
    pub name: &'static str,
    pub handle: JoinHandle<()>,
}

impl Named {
    pub fn spawn(
        name: &'static str,
        work: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Named {
        Named {
            name,
            handle: tokio::spawn(work),
        }
    }
}

/// Waits for every one of `tasks` until `deadline`; returns the names of
/// those still running then, which are aborted (empty: all ended).
pub async fn join_until(mut tasks: Vec<Named>, deadline: Instant) -> Vec<&'static str> {
    for task in &mut tasks {
        if tokio::time::timeout_at(deadline, &mut task.handle)
            .await
            .is_err()
        {
            break;
        }
    }
    let left: Vec<&'static str> = tasks
        .iter()
        .filter(|task| !task.handle.is_finished())
        .map(|task| task.name)
        .collect();
    for task in &tasks {
        task.handle.abort();
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn what_is_still_running_at_the_deadline_is_named_and_aborted() {
        let quick = Named::spawn("quick", async {});
        let (slow_started, started) = tokio::sync::oneshot::channel();
        let slow = Named::spawn("slow", async move {
            let _ = slow_started.send(());
            std::future::pending::<()>().await;
        });
        started.await.unwrap();
        let deadline = Instant::now() + Duration::from_millis(50);
        let left = join_until(vec![quick, slow], deadline).await;
        assert_eq!(left, ["slow"]);
        assert!(Instant::now() >= deadline);
        let ended = Named::spawn("ended", async {});
        let left = join_until(vec![ended], Instant::now() + Duration::from_secs(1)).await;
        assert!(left.is_empty());
    }

    #[test]
    fn a_stop_has_a_bound() {
        assert!(StopSettings::default().validate().is_ok());
        assert!(StopSettings { timeout_ms: 0 }.validate().is_err());
    }
}
