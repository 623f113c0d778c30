//! What falls due together (issue 67): N tasks due at one instant, on the
//! default configuration (one node, SQLite, the 1 s chain held to the
//! millisecond), admitted two ways: over the time before it (batches
//! spread until 10 s before it) and all at once (as fast as the service
//! takes them), the instant `--burst-ahead-s` (60 s) after the first. Measured from the instant: when
//! the first and the last arrive, lateness p50 and p99, the release rate
//! (tasks over the time from the instant to the last), against the raw
//! publish ceiling to the business exchange measured on the same service
//! just before the admission and again just after the last arrival (the
//! machine's speed moves between the two); tasks the strand watch
//! published again; early, lost and duplicated; the service's and the
//! broker's peak memory. With a leeway
//! (`--burst-leeway-s`), each task says any moment within it after the
//! instant will do: then also how evenly the window's seconds are filled
//! and how many arrived past its end.

use std::collections::HashSet;
use std::time::Duration;

use indicatif::ProgressBar;
use serde::Serialize;
use tokio::sync::mpsc;

use delayline::testkit::{now_us, quantile};

use crate::arrivals::consume;
use crate::cpu::{CpuPerTask, Meter};
use crate::load::{RawTarget, Throughput, raw_amqp, submit_due_from};
use crate::sut::{ServiceUnderTest, Setup, Store};

#[derive(Clone, Debug, Serialize)]
pub struct BurstRun {
    /// `minute` or `at-once`.
    pub admitted: String,
    pub tasks: usize,
    /// From the first task's submission to the last's acceptance.
    pub admitted_in_s: f64,
    /// From the last acceptance to the instant.
    pub ahead_s: f64,
    pub first_ms: f64,
    pub last_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Tasks over the time from the instant to the last arrival.
    pub release_per_sec: f64,
    /// Confirmed publishes a second to the business exchange, routed to a
    /// consumer's classic queue, measured on the same service just before.
    pub business_ceiling_per_sec: f64,
    /// The same ceiling measured again just after the last arrival: this
    /// machine's speed moves by a quarter within minutes, and the release
    /// comes a minute or more after the first measurement.
    #[serde(default)]
    pub business_ceiling_after_per_sec: f64,
    pub resent: f64,
    pub staged: f64,
    /// Messages the strand watch took off levels it judged stranded and
    /// published on (all levels): 0 when it kept quiet.
    #[serde(default)]
    pub drained: f64,
    /// The service's peak resident memory over the run, MiB.
    #[serde(default)]
    pub service_peak_mib: f64,
    /// The broker's peak resident memory over the run, sampled each second, MiB.
    #[serde(default)]
    pub broker_peak_mib: f64,
    pub early: usize,
    pub lost: usize,
    pub duplicates: usize,
    /// The leeway each task had (0: none).
    #[serde(default)]
    pub leeway_s: f64,
    /// Arrivals after the instant + the leeway.
    #[serde(default)]
    pub past_window: usize,
    /// How far past the window's end the latest of those came, ms.
    #[serde(default)]
    pub past_window_most_ms: f64,
    /// With a leeway: the busiest second of the window over the window's
    /// mean a second (1.0 is perfectly even).
    #[serde(default)]
    pub busiest_second_over_mean: f64,
    /// With a leeway: how late each arrival was after its own moment (its
    /// due time plus the offset drawn in the window), p99 and most, ms.
    #[serde(default)]
    pub after_moment_p99_ms: f64,
    #[serde(default)]
    pub after_moment_max_ms: f64,
    /// CPU a message of each process while the ceiling was measured (the
    /// bench publishing and consuming) and from the instant to the last
    /// arrival (the service publishing, the bench consuming): on two shared
    /// cores, why the release's ratio to the ceiling is what it is.
    #[serde(default)]
    pub ceiling_cpu: CpuPerTask,
    #[serde(default)]
    pub release_cpu: CpuPerTask,
}

/// When the burst falls due: its instant this long after the first
/// submission, and the leeway each task gives.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub ahead: Duration,
    pub leeway: Duration,
}

/// The `minute` mode's batches end this long before the instant.
const LAST_BATCH_AHEAD: Duration = Duration::from_secs(10);

pub async fn phase(
    amqp_uri: &str,
    channels: usize,
    timing: Timing,
    sizes: &[usize],
    modes: &[String],
    progress: &ProgressBar,
) -> anyhow::Result<Vec<BurstRun>> {
    let mut runs = Vec::new();
    for mode in modes {
        for &tasks in sizes {
            progress.set_message(format!("burst: {tasks} due at once, admitted {mode}"));
            let setup = Setup::default_with(Store::Sqlite);
            let mut sut = ServiceUnderTest::spawn(amqp_uri, channels, &setup).await?;
            let broker = crate::cpu::broker_pid();
            let peak = BrokerPeak::watch(broker);
            let plan = Plan {
                tasks,
                mode,
                timing,
            };
            let run = one(&mut sut, amqp_uri, channels, &plan, progress).await;
            let service_peak_kib = sut.peak_rss_kib().unwrap_or(0);
            sut.stop().await?;
            let mut run = run?;
            run.service_peak_mib = service_peak_kib as f64 / 1024.0;
            run.broker_peak_mib = peak.stop() as f64 / 1024.0;
            println!(
                "burst: {} admitted {} in {:.1} s, {:.1} s ahead: first +{:.0} ms, last +{:.0} ms, \
                 p50 {:.0} ms, p99 {:.0} ms; {:.0}/s against a ceiling of {:.0}/s ({:.0}/s after); \
                 resent {}, staged {}, drained {}, early {}, lost {}, duplicates {}; \
                 peak memory: service {:.0} MiB, broker {:.0} MiB; \
                 leeway {} s: past the window {} (by up to {:.0} ms), busiest second over the mean {:.2}, \
                 after its own moment p99 {:.0} ms, most {:.0} ms",
                run.tasks,
                run.admitted,
                run.admitted_in_s,
                run.ahead_s,
                run.first_ms,
                run.last_ms,
                run.p50_ms,
                run.p99_ms,
                run.release_per_sec,
                run.business_ceiling_per_sec,
                run.business_ceiling_after_per_sec,
                run.resent,
                run.staged,
                run.drained,
                run.early,
                run.lost,
                run.duplicates,
                run.service_peak_mib,
                run.broker_peak_mib,
                run.leeway_s,
                run.past_window,
                run.past_window_most_ms,
                run.busiest_second_over_mean,
                run.after_moment_p99_ms,
                run.after_moment_max_ms
            );
            print_cpu(&run);
            runs.push(run);
        }
    }
    Ok(runs)
}

/// CPU a message of each process, at the ceiling and in the release.
fn print_cpu(run: &BurstRun) {
    let us = |value: Option<f64>| value.map_or("?".to_owned(), |us| format!("{us:.1}"));
    let (ceiling, release) = (&run.ceiling_cpu, &run.release_cpu);
    println!(
        "burst cpu a message, µs: ceiling: broker {}, bench {}, service {}; \
         release: broker {}, service {}, bench {}",
        us(ceiling.broker_us),
        us(ceiling.load_generator_us),
        us(ceiling.service_us),
        us(release.broker_us),
        us(release.service_us),
        us(release.load_generator_us),
    );
    let busy = |cpu: &CpuPerTask, per_sec: f64| {
        cpu.total_us()
            .map_or("?".to_owned(), |us| format!("{:.2}", us * per_sec / 1e6))
    };
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    // Both are CPU-bound on a machine this size: a release that keeps fewer
    // cores busy than its ceiling did waits somewhere (a bubble), which its
    // ratio to the ceiling alone does not tell from a slower process.
    println!(
        "burst cores busy: ceiling {}, release {} (of {cores})",
        busy(ceiling, run.business_ceiling_per_sec),
        busy(release, run.release_per_sec),
    );
}

/// One run's size, way of admitting and lead before the instant.
struct Plan<'a> {
    tasks: usize,
    mode: &'a str,
    timing: Timing,
}

/// The broker's peak resident memory, sampled each second until stopped.
struct BrokerPeak {
    peak_kib: std::sync::Arc<std::sync::atomic::AtomicU64>,
    sampler: tokio::task::JoinHandle<()>,
}

impl BrokerPeak {
    fn watch(pid: Option<u32>) -> BrokerPeak {
        use std::sync::atomic::Ordering;
        let peak_kib = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let sampled = peak_kib.clone();
        let sampler = tokio::spawn(async move {
            let Some(pid) = pid else { return };
            loop {
                if let Some(kib) = ServiceUnderTest::rss_kib_of(pid) {
                    sampled.fetch_max(kib, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        BrokerPeak { peak_kib, sampler }
    }

    fn stop(self) -> u64 {
        self.sampler.abort();
        self.peak_kib.load(std::sync::atomic::Ordering::Relaxed)
    }
}

async fn one(
    sut: &mut ServiceUnderTest,
    amqp_uri: &str,
    channels: usize,
    plan: &Plan<'_>,
    progress: &ProgressBar,
) -> anyhow::Result<BurstRun> {
    let (tasks, mode) = (plan.tasks, plan.mode);
    let mut ceiling_arrivals = consume(sut, "ceiling", amqp_uri).await?;
    let broker = crate::cpu::broker_pid();
    let meter = Meter::start(broker, sut.pid());
    let ceiling = business_ceiling(sut, amqp_uri, channels, progress).await?;
    let ceiling_cpu = meter.finish(ceiling.tasks);
    tokio::spawn(async move { while ceiling_arrivals.recv().await.is_some() {} });
    let mut receiver = consume(sut, "burst", amqp_uri).await?;
    let start_us = now_us();
    let due_ms = (start_us / 1000) as u64 + plan.timing.ahead.as_millis() as u64;
    let leeway_ms = plan.timing.leeway.as_millis() as u64;
    let bases = std::slice::from_ref(&sut.base);
    if mode == "minute" {
        let slices = plan
            .timing
            .ahead
            .saturating_sub(LAST_BATCH_AHEAD)
            .as_secs()
            .max(1) as usize;
        let per_slice = tasks.div_ceil(slices);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        for first in (0..tasks).step_by(per_slice) {
            tick.tick().await;
            let count = per_slice.min(tasks - first);
            submit_due_from(bases, "burst", (first, count), (due_ms, leeway_ms)).await?;
        }
    } else {
        submit_due_from(bases, "burst", (0, tasks), (due_ms, leeway_ms)).await?;
    }
    let admitted_us = now_us();
    // None arrives before the instant: the release's CPU is metered from it.
    let to_instant = (due_ms as i64 * 1000 - now_us()).max(0) as u64;
    tokio::time::sleep(Duration::from_micros(to_instant)).await;
    let meter = Meter::start(broker, sut.pid());
    let got = arrivals(&mut receiver, tasks, due_ms + leeway_ms).await;
    let release_cpu = meter.finish(got.len() as u64);
    let scrape = scrape(&sut.base).await.unwrap_or_default();
    let ceiling_after = business_ceiling(sut, amqp_uri, channels, progress).await?;
    let mut run = summary(
        mode,
        tasks,
        (start_us, admitted_us, due_ms),
        &got,
        (ceiling.tasks_per_sec, ceiling_after.tasks_per_sec),
        &scrape,
    );
    if leeway_ms > 0 {
        spread_over_window(&mut run, &got, (due_ms, leeway_ms));
    }
    (run.ceiling_cpu, run.release_cpu) = (ceiling_cpu, release_cpu);
    Ok(run)
}

/// The raw publish ceiling to the business exchange (the bench's own
/// confirmed publishes for 5 s, to the `ceiling` consumer's queue).
async fn business_ceiling(
    sut: &ServiceUnderTest,
    amqp_uri: &str,
    channels: usize,
    progress: &ProgressBar,
) -> anyhow::Result<Throughput> {
    let target = RawTarget::Exchange {
        label: "business",
        exchange: sut.cascade.business_exchange(),
        key: Some("ceiling"),
    };
    let (in_flight, lasting) = (256, Duration::from_secs(5));
    raw_amqp(
        amqp_uri,
        &sut.cascade,
        target,
        channels,
        in_flight,
        lasting,
        progress,
    )
    .await
}

/// How evenly the arrivals filled the window `[due, due + leeway]`, by
/// whole seconds, and how many came after it.
fn spread_over_window(run: &mut BurstRun, got: &[(String, i64)], (due_ms, leeway_ms): (u64, u64)) {
    let (due_us, end_us) = (due_ms as i64 * 1000, (due_ms + leeway_ms) as i64 * 1000);
    let seconds = leeway_ms.div_ceil(1000).max(1) as usize;
    let mut by_second = vec![0usize; seconds];
    for &(_, at) in got {
        if at > end_us {
            run.past_window += 1;
            run.past_window_most_ms = run.past_window_most_ms.max((at - end_us) as f64 / 1000.0);
        } else if at >= due_us {
            by_second[(((at - due_us) / 1_000_000) as usize).min(seconds - 1)] += 1;
        }
    }
    let mean = by_second.iter().sum::<usize>() as f64 / seconds as f64;
    let busiest = by_second.iter().copied().max().unwrap_or(0) as f64;
    let mut after_moment: Vec<f64> = got
        .iter()
        .map(|(id, at)| {
            let moment_us =
                (due_ms + delayline::task::leeway_offset_ms(id, leeway_ms)) as i64 * 1000;
            (at - moment_us) as f64 / 1000.0
        })
        .collect();
    after_moment.sort_by(f64::total_cmp);
    run.after_moment_p99_ms = quantile(&after_moment, 0.99);
    run.after_moment_max_ms = after_moment.last().copied().unwrap_or(f64::NAN);
    run.leeway_s = leeway_ms as f64 / 1000.0;
    run.busiest_second_over_mean = busiest / mean.max(f64::MIN_POSITIVE);
}

/// Arrivals until `count` came, or 30 s passed without one after the instant.
pub(crate) async fn arrivals(
    receiver: &mut mpsc::UnboundedReceiver<(String, i64)>,
    count: usize,
    due_ms: u64,
) -> Vec<(String, i64)> {
    let mut got = Vec::with_capacity(count);
    let ahead = Duration::from_millis(due_ms.saturating_sub((now_us() / 1000) as u64));
    while got.len() < count {
        let wait = if got.is_empty() {
            ahead + Duration::from_secs(30)
        } else {
            Duration::from_secs(30)
        };
        match tokio::time::timeout(wait, receiver.recv()).await {
            Ok(Some(arrival)) => got.push(arrival),
            _ => break,
        }
    }
    got
}

fn summary(
    mode: &str,
    tasks: usize,
    (start_us, admitted_us, due_ms): (i64, i64, u64),
    got: &[(String, i64)],
    (ceiling, ceiling_after): (f64, f64),
    scrape: &str,
) -> BurstRun {
    let due_us = due_ms as i64 * 1000;
    let unique: HashSet<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
    let mut late_ms: Vec<f64> = got
        .iter()
        .map(|(_, at)| (at - due_us) as f64 / 1000.0)
        .collect();
    late_ms.sort_by(f64::total_cmp);
    let last_ms = late_ms.last().copied().unwrap_or(f64::NAN);
    BurstRun {
        admitted: mode.to_owned(),
        tasks,
        admitted_in_s: (admitted_us - start_us) as f64 / 1e6,
        ahead_s: (due_us - admitted_us) as f64 / 1e6,
        first_ms: late_ms.first().copied().unwrap_or(f64::NAN),
        last_ms,
        p50_ms: quantile(&late_ms, 0.5),
        p99_ms: quantile(&late_ms, 0.99),
        release_per_sec: unique.len() as f64 / (last_ms.max(1.0) / 1000.0),
        business_ceiling_per_sec: ceiling,
        business_ceiling_after_per_sec: ceiling_after,
        resent: sample(scrape, "delayline_tasks_resent_total"),
        staged: sample(scrape, "delayline_tasks_staged_total"),
        drained: scrape
            .lines()
            .filter(|line| line.starts_with("delayline_level_drained_total"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
        service_peak_mib: 0.0,
        broker_peak_mib: 0.0,
        early: late_ms.iter().filter(|&&late| late < 0.0).count(),
        lost: tasks - unique.len(),
        duplicates: got.len() - unique.len(),
        leeway_s: 0.0,
        past_window: 0,
        past_window_most_ms: 0.0,
        busiest_second_over_mean: 0.0,
        after_moment_p99_ms: 0.0,
        after_moment_max_ms: 0.0,
        ceiling_cpu: CpuPerTask::default(),
        release_cpu: CpuPerTask::default(),
    }
}

pub(crate) async fn scrape(base: &str) -> anyhow::Result<String> {
    Ok(reqwest::get(format!("{base}/metrics"))
        .await?
        .text()
        .await?)
}

fn sample(scrape: &str, metric: &str) -> f64 {
    scrape
        .lines()
        .find_map(|line| line.strip_prefix(metric)?.trim().parse().ok())
        .unwrap_or(0.0)
}
