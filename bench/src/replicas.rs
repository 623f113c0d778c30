//! Replicas sharing one PostgreSQL ledger and one chain (issue 42, section
//! 2): the intake and the due rate with 1, 2 and 3 of them, and, with more
//! than one, a replica SIGKILLed while the tasks fall due, every task still
//! delivered.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::bail;
use futures_util::future::join_all;
use indicatif::ProgressBar;
use serde::Serialize;

use delayline::testkit::now_us;

use crate::arrivals::consume;
use crate::sut::{Replica, ServiceUnderTest, Setup, Store};

/// HTTP batch requests in flight per replica, each of this many tasks.
const CONCURRENCY_PER_REPLICA: usize = 8;
const BATCH: usize = 100;

#[derive(Clone, Debug, Serialize)]
pub struct ReplicaRun {
    pub replicas: usize,
    /// `cascade.shards` of the chain they share.
    pub shards: u32,
    /// HTTP batch intake over every replica at once.
    pub intake_per_sec: f64,
    pub intake_errors: u64,
    /// The replicas' CPU per task taken in, µs (PostgreSQL's not counted).
    pub intake_service_cpu_us: f64,
    /// Tasks due at one instant, spread over the replicas when submitted.
    pub due_tasks: usize,
    /// From the due instant to the first arrival.
    pub first_after_due_ms: f64,
    /// Arrivals a second over the middle 80 % of them.
    pub due_per_sec: f64,
    /// From the due instant to the last arrival.
    pub last_after_due_ms: f64,
    /// A replica was SIGKILLed 500 ms after the due instant.
    pub killed_one: bool,
    pub missing: usize,
    pub duplicates: usize,
}

pub async fn phase(
    amqp_uri: &str,
    channels: usize,
    postgres_url: &str,
    quick: bool,
    seconds: u64,
    shards: u32,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<ReplicaRun>> {
    let counts: &[usize] = if quick { &[1, 2] } else { &[1, 2, 3] };
    let due_tasks = if quick { 5_000 } else { 30_000 };
    let mut runs = Vec::new();
    for &replicas in counts {
        progress.set_message(format!("replicas: {replicas}"));
        let setup = Setup {
            shards,
            ..Setup::default_with(Store::Postgres(postgres_url.to_owned()))
        };
        let mut sut = ServiceUnderTest::spawn(amqp_uri, channels, &setup).await?;
        let mut extra = Vec::new();
        for _ in 1..replicas {
            extra.push(sut.replica().await?);
        }
        let run = measure(&mut sut, &mut extra, amqp_uri, due_tasks, seconds, progress)
            .await
            .map(|run| ReplicaRun { shards, ..run });
        for replica in extra {
            replica.stop().await;
        }
        sut.stop().await?;
        runs.push(run?);
    }
    Ok(runs)
}

async fn measure(
    sut: &mut ServiceUnderTest,
    extra: &mut [Replica],
    amqp_uri: &str,
    due_tasks: usize,
    seconds: u64,
    progress: &ProgressBar,
) -> anyhow::Result<ReplicaRun> {
    let bases: Vec<String> = std::iter::once(sut.base.clone())
        .chain(extra.iter().map(|r| r.base.clone()))
        .collect();
    let pids: Vec<u32> = sut
        .pid()
        .into_iter()
        .chain(extra.iter().filter_map(Replica::pid))
        .collect();
    let cpu_before: f64 = pids
        .iter()
        .filter_map(|&p| crate::cpu::process_cpu_ms(p))
        .sum();
    let intakes = join_all(bases.iter().map(|base| {
        crate::load::http(
            base,
            None,
            "postgres",
            CONCURRENCY_PER_REPLICA,
            BATCH,
            Duration::from_secs(seconds),
            progress,
        )
    }))
    .await;
    let cpu_after: f64 = pids
        .iter()
        .filter_map(|&p| crate::cpu::process_cpu_ms(p))
        .sum();
    let mut intake_tasks = 0;
    let mut intake_errors = 0;
    let mut intake_seconds: f64 = 0.0;
    for intake in intakes {
        let intake = intake?;
        intake_tasks += intake.tasks;
        intake_errors += intake.errors;
        intake_seconds = intake_seconds.max(intake.seconds);
    }
    let destination = format!("replicas{}", bases.len());
    let mut receiver = consume(sut, &destination, amqp_uri).await?;
    // Time to submit them all, then due at once.
    let due_ms = now_us() / 1000 + 5_000 + due_tasks as i64 / 2;
    crate::load::submit_due(&bases, &destination, due_tasks, due_ms as u64).await?;
    let kill = extra.last_mut().map(|replica| async move {
        let wait = (due_ms + 500 - now_us() / 1000).max(0) as u64;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        replica.kill().await;
    });
    let killed_one = kill.is_some();
    let collect = async {
        let mut seen = HashSet::new();
        let mut arrivals = Vec::with_capacity(due_tasks);
        let mut duplicates = 0;
        while seen.len() < due_tasks {
            match tokio::time::timeout(Duration::from_secs(90), receiver.recv()).await {
                Ok(Some((id, at_us))) => {
                    if seen.insert(id) {
                        arrivals.push(at_us);
                    } else {
                        duplicates += 1;
                    }
                }
                _ => break,
            }
        }
        // Late duplicates from the killed replica's unacknowledged windows.
        while let Ok(Some((id, _))) =
            tokio::time::timeout(Duration::from_secs(3), receiver.recv()).await
        {
            if !seen.insert(id) {
                duplicates += 1;
            }
        }
        (arrivals, duplicates)
    };
    let ((mut arrivals, duplicates), ()) = match kill {
        Some(kill) => tokio::join!(collect, kill),
        None => (collect.await, ()),
    };
    arrivals.sort_unstable();
    if arrivals.is_empty() {
        bail!("none of the {due_tasks} due tasks arrived");
    }
    let at_ms = |i: usize| arrivals[i] as f64 / 1000.0 - due_ms as f64;
    let (from, to) = (arrivals.len() / 10, arrivals.len() * 9 / 10);
    let span_s = (arrivals[to.max(from + 1) - 1] - arrivals[from]) as f64 / 1e6;
    Ok(ReplicaRun {
        replicas: bases.len(),
        shards: 1,
        intake_per_sec: intake_tasks as f64 / intake_seconds.max(f64::EPSILON),
        intake_errors,
        intake_service_cpu_us: (cpu_after - cpu_before) * 1000.0 / intake_tasks.max(1) as f64,
        due_tasks,
        first_after_due_ms: at_ms(0),
        due_per_sec: (to - from) as f64 / span_s.max(f64::EPSILON),
        last_after_due_ms: at_ms(arrivals.len() - 1),
        killed_one,
        missing: due_tasks - arrivals.len(),
        duplicates,
    })
}
