//! delayline-bench: ingest against the broker's own ceiling, delivery precision
//! and cascade drain rate, measured in one run on the same broker.
//!
//! Each phase starts its own `delayline` process (the release binary next to
//! this one) with a topology of its own, and deletes that topology afterwards.
//! Results go to stdout as tables and to `<out>/results.json`, with plots in
//! `<out>/throughput.png` and `<out>/lateness.png`.

mod arrivals;
mod backlog;
mod burst;
mod capacity;
mod cpu;
mod delivery;
mod floor;
mod forecast;
mod instant;
mod ledger;
mod load;
mod paced;
mod parked;
mod phases;
mod plot;
mod queue_pass;
mod rabbitmqctl;
mod record_cost;
mod replicas;
mod report;
mod retries;
mod routing;
mod schedules;
mod shards;
mod sut;
mod timer;

use phases::Phase;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use delayline::cascade::QueueType;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use delivery::{Delays, Drain, Precision};
use load::Throughput;
use sut::{ServiceUnderTest, Setup, Store};

#[derive(Debug, Parser)]
#[command(
    name = "delayline-bench",
    about = "Benchmarks delayline against the local RabbitMQ"
)]
struct Args {
    /// A short smoke run: fewer tasks, shorter phases.
    #[arg(long)]
    quick: bool,
    /// Where results.json and the plots are written.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp_uri: String,
    /// Seconds each ingest measurement runs (default 10, 2 with --quick).
    #[arg(long)]
    seconds: Option<u64>,
    /// Publishing channels, for both the raw ceiling and the service.
    #[arg(long, default_value_t = 4)]
    channels: usize,
    /// Only these phases (see `phases::Phase`); all by default but
    /// `shards`, `burst`, `instant`, `retries` and `queue-pass`, which run
    /// only when named.
    #[arg(long, value_delimiter = ',', value_enum)]
    phases: Vec<Phase>,
    /// The hold phase's chains (hold-100ms-up, hold-1s-up, hold-1s-hold);
    /// all by default.
    #[arg(long, value_delimiter = ',')]
    hold_chains: Vec<String>,
    /// The hold phase's steady due rates (tasks/s), each for 20 s (4 s with --quick).
    #[arg(long, value_delimiter = ',', default_values_t = [250.0, 500.0, 1000.0])]
    hold_rates: Vec<f64>,
    /// The hold phase's steady runs only (no spread, no drain).
    #[arg(long)]
    hold_steady_only: bool,
    /// The held 1 s chain's steady runs with round delays (30 s and 1 min in
    /// turn) beside the spread ones.
    #[arg(long)]
    hold_round: bool,
    /// Ledgers the HTTP ingest is measured with (none, sqlite, postgres);
    /// `+auth` (`sqlite+auth`) requires a token on every request.
    #[arg(long, value_delimiter = ',', default_value = "none,sqlite,postgres")]
    stores: Vec<String>,
    /// Only redraw `<out>/throughput.png` from `<out>/results.json`.
    #[arg(long)]
    replot: bool,
    /// Tasks the backlog and forecast phases hold (default 1,000,000, 20,000
    /// with --quick).
    #[arg(long)]
    scale: Option<u64>,
    /// The backlog phase's delays spread from two hours to this many days
    /// (0: two to six hours).
    #[arg(long, default_value_t = 0)]
    backlog_days: u64,
    /// The backlog phase's ledger (sqlite or postgres).
    #[arg(long, default_value = "sqlite")]
    backlog_ledger: String,
    /// Tasks the ledger phase writes (default 100,000, 10,000 with --quick).
    #[arg(long)]
    ledger_tasks: Option<usize>,
    /// The ledger phase drops these indexes first, to measure what each
    /// costs a task (the service needs every one of them); `trigger:NAME`
    /// drops a trigger instead.
    #[arg(long, value_delimiter = ',')]
    ledger_drop_index: Vec<String>,
    /// The ledger phase runs these statements after dropping indexes (and
    /// names the runs with `--ledger-label`): to try another index shape
    /// for the writes the phase makes, before building it into the service.
    #[arg(long)]
    ledger_sql: Option<String>,
    /// The ledger phase's label for runs with `--ledger-sql`.
    #[arg(long)]
    ledger_label: Option<String>,
    /// The ledger phase gives every task the same delay (due times that grow
    /// with time, appended to the due-order indexes) instead of spreading
    /// them over an hour.
    #[arg(long)]
    ledger_same_delay: bool,
    /// The ledger phase releases its tasks as a burst's are released: staged
    /// first, then taken in pages and marked delivered (the staged
    /// release's writes); its release figures are of those alone.
    #[arg(long)]
    ledger_staged: bool,
    /// The ingest phase (and the overload phase) gives every task the same
    /// delay, so the ledger's due-order indexes take each at their end,
    /// instead of spreading them over an hour.
    #[arg(long)]
    ingest_same_delay: bool,
    /// The ingest phase gives every HTTP task a deadline (`max_lateness_ms`
    /// of a minute), to measure what deadlines cost on the ingest path
    /// against runs without.
    #[arg(long)]
    ingest_deadline: bool,
    /// The ingest phase measures the AMQP ingress before HTTP, on the
    /// service's fresh ledger and chain, instead of after HTTP's tasks.
    #[arg(long)]
    ingress_first: bool,
    /// Schedules the schedules phase holds (default 100,000; 10,000 with --quick).
    #[arg(long)]
    schedules_held: Option<u64>,
    /// The schedules phase's held schedules each due once a day at a minute
    /// of its own, not once a year.
    #[arg(long)]
    schedules_spread: bool,
    /// The limits phase's steps (paced, ledger, ceiling, beside, outage);
    /// all by default.
    #[arg(long, value_delimiter = ',')]
    limits_steps: Vec<String>,
    /// The limits phase's paced rates (tasks/s); 100, 1000 and 5000 by default.
    #[arg(long, value_delimiter = ',')]
    limits_rates: Vec<f64>,
    /// The limits phase's bursts, as seconds of each rate; the service's
    /// default by default.
    #[arg(long)]
    limits_burst_secs: Option<f64>,
    /// The replicas phase's chain: its shards.
    #[arg(long, default_value_t = 1)]
    replicas_shards: u32,
    /// The shards phase's shard counts.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4])]
    shards: Vec<u32>,
    /// The shards phase's burst, as the rate it is sized for (× 12 s of tasks).
    #[arg(long, default_value_t = 5000.0)]
    shards_rate: f64,
    /// The burst phase's sizes: tasks due at one instant.
    #[arg(long, value_delimiter = ',', default_values_t = [20_000, 100_000])]
    burst_sizes: Vec<usize>,
    /// The burst phase's ways of admitting them: `minute` (spread over the
    /// minute before) and `at-once`.
    #[arg(long, value_delimiter = ',', default_value = "minute,at-once")]
    burst_modes: Vec<String>,
    /// The burst phase's instant, this many seconds after the first
    /// submission (a million needs longer than a minute to admit).
    #[arg(long, default_value_t = 60)]
    burst_ahead_s: u64,
    /// The burst phase's tasks each say any moment within this many seconds
    /// after the instant will do (a leeway; 0: none).
    #[arg(long, default_value_t = 0)]
    burst_leeway_s: u64,
    /// The instant phase's sizes: schedules firing at one second.
    #[arg(long, value_delimiter = ',', default_values_t = [10_000, 50_000, 100_000])]
    instant_sizes: Vec<usize>,
    /// The instant phase's schedules made only this many seconds before
    /// their instant (the last of them; 0: far enough ahead for the planner's
    /// lead and the crowd's).
    #[arg(long, default_value_t = 0)]
    instant_made_s: u64,
    /// The retries phase's sizes: messages a consumer rejects at once.
    #[arg(long, value_delimiter = ',', default_values_t = [10_000])]
    retries_sizes: Vec<usize>,
    /// The parked phase's sizes: messages parked at once, then replayed by
    /// group.
    #[arg(long, value_delimiter = ',', default_values_t = [100_000])]
    parked_sizes: Vec<usize>,
    /// The queue-pass phase's queue types, measured in this order.
    #[arg(long, value_delimiter = ',', default_value = "quorum,classic,stream")]
    pass_types: Vec<String>,
    /// The queue-pass phase's confirms outstanding, over `channels`.
    #[arg(long, default_value_t = 256)]
    pass_in_flight: usize,
    /// The database the postgres ledger gets a schema of its own in.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    postgres_url: String,
}

#[derive(Debug, Serialize)]
struct Results {
    machine: Machine,
    quick: bool,
    /// Every ingest task had the same delay (`--ingest-same-delay`).
    ingest_same_delay: bool,
    /// Every HTTP ingest task had a deadline (`--ingest-deadline`).
    #[serde(default)]
    ingest_deadline: bool,
    ingest: Vec<Throughput>,
    raw_ceiling_tasks_per_sec: Option<f64>,
    /// Per ledger: the best HTTP rates against the raw ceiling, and the service's cost.
    stores: Vec<StoreSummary>,
    precision: Vec<Precision>,
    drain: Vec<Drain>,
    /// Due tasks/s per delay mix, sized with the drain's dead-letter rate.
    capacity: Vec<capacity::Capacity>,
    overload: Vec<load::Overload>,
    backlog: Option<backlog::Backlog>,
    /// The default ledger alone: its CPU per task, without broker or HTTP.
    ledger: Vec<ledger::LedgerRun>,
    /// Held schedules' cost, and their occurrences' lateness.
    schedules: Option<schedules::Schedules>,
    /// How late a waiting task runs (the release stage's wait), by waiter.
    timer: Vec<timer::Timer>,
    record_cost: Vec<record_cost::RecordCost>,
    /// Release limits: rates achieved, an unlimited destination beside
    /// waiting tasks, the drain after an outage.
    limits: Option<paced::Limits>,
    /// The forecast over a day of held tasks, per ledger.
    forecast: Vec<forecast::ForecastRun>,
    /// 1, 2 and 3 replicas sharing a PostgreSQL ledger and a chain.
    replicas: Vec<replicas::ReplicaRun>,
    /// One burst's due rate with 1, 2 and 4 shards.
    shards: Vec<shards::ShardRun>,
    /// Tasks due at one instant: how long until the last arrived.
    burst: Vec<burst::BurstRun>,
    /// Schedules firing at one instant.
    instant: Vec<instant::InstantRun>,
    /// Messages rejected at once: the retry intake, and the retries' spread.
    retries: Vec<retries::RetriesRun>,
    /// Messages parked at once, then replayed by group.
    parked: Vec<parked::ParkedRun>,
    /// What a pass through a queue (publish, consume, acknowledge) costs
    /// the broker, per queue type.
    queue_pass: Vec<queue_pass::Pass>,
}

#[derive(Debug, Serialize)]
struct StoreSummary {
    store: String,
    best_single_ratio: Option<f64>,
    best_batch_ratio: Option<f64>,
    service_peak_rss_kib: Option<u64>,
    /// Service CPU time (user + system) per task accepted over HTTP.
    service_cpu_us_per_task: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Machine {
    cpus: usize,
    cpu_model: String,
    rabbitmq: String,
}

fn machine() -> Machine {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let rabbitmq = rabbitmqctl::rabbitmqctl_command()
        .args(["-q", "version"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    Machine {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model,
        rabbitmq,
    }
}

fn bar(message: &str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:40} [{bar:30}] {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(message.to_owned());
    bar
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.ingest_same_delay {
        load::use_same_delay();
    }
    if args.ingest_deadline {
        load::use_deadlines();
    }
    let seconds = Duration::from_secs(args.seconds.unwrap_or(if args.quick { 2 } else { 10 }));
    std::fs::create_dir_all(&args.out)?;
    if args.replot {
        return replot(&args.out);
    }
    let mut results = Results {
        machine: machine(),
        quick: args.quick,
        ingest_same_delay: args.ingest_same_delay,
        ingest_deadline: args.ingest_deadline,
        ingest: Vec::new(),
        raw_ceiling_tasks_per_sec: None,
        stores: Vec::new(),
        precision: Vec::new(),
        drain: Vec::new(),
        capacity: Vec::new(),
        overload: Vec::new(),
        backlog: None,
        ledger: Vec::new(),
        schedules: None,
        timer: Vec::new(),
        record_cost: Vec::new(),
        limits: None,
        forecast: Vec::new(),
        replicas: Vec::new(),
        shards: Vec::new(),
        burst: Vec::new(),
        instant: Vec::new(),
        retries: Vec::new(),
        parked: Vec::new(),
        queue_pass: Vec::new(),
    };

    for phase in Phase::ALL {
        if args.runs(phase) {
            phase.run(&args, seconds, &mut results).await?;
        }
    }

    report::print(&results);
    let json = args.out.join("results.json");
    std::fs::write(&json, serde_json::to_vec_pretty(&results)?)?;
    println!("\nresults: {}", json.display());
    for written in plot::write_plots(
        &args.out,
        &results.ingest,
        results.raw_ceiling_tasks_per_sec,
        &results.precision,
    ) {
        match written {
            Ok(path) => println!("plot:    {}", path.display()),
            Err(error) => println!("plot skipped: {error}"),
        }
    }
    Ok(())
}

/// Redraws the throughput plot of an earlier run (lateness samples are not
/// kept in results.json, so its lateness plots stay as they were drawn).
/// Issue 31: the same tasks at about 1,000 due/s on the default ledger and
/// release stage, three ways: today's 100 ms unit rounding up, a 1 s unit
/// rounding up, and a 1 s unit whose release stage holds the rest. Then
/// the burst drain of the first and the last, for their due rates.
async fn hold_phase(args: &Args, results: &mut Results) -> anyhow::Result<()> {
    let delays = if args.quick {
        Delays {
            tasks: 2_000,
            min_ms: 3_000,
            max_ms: 5_000,
        }
    } else {
        Delays {
            tasks: 20_000,
            min_ms: 8_000,
            max_ms: 28_000,
        }
    };
    let configs = [
        ("hold-100ms-up", 100, 100),
        ("hold-1s-up", 1000, 1000),
        ("hold-1s-hold", 1000, 1),
    ];
    for (label, unit_ms, precision_ms) in configs {
        if !args.hold_chains.is_empty() && !args.hold_chains.iter().any(|c| c == label) {
            continue;
        }
        let setup = Setup {
            levels: 20,
            unit_ms,
            queue_type: QueueType::Quorum,
            store: Store::Sqlite,
            release_stage: true,
            precision_ms: Some(precision_ms),
            auth: false,
            shards: 1,
        };
        let mut sut = ServiceUnderTest::spawn(&args.amqp_uri, args.channels, &setup).await?;
        let progress = bar(&format!("hold {label}"));
        if !args.hold_steady_only {
            let mut precision =
                delivery::precision(&mut sut, &args.amqp_uri, label, delays, &progress).await?;
            precision.mean_hops = Some(delivery::mean_hops(delays, &sut.cascade));
            results.precision.push(precision);
        }
        // Steady states: tasks coming in and falling due at the same rate.
        let mut mixes = vec![("steady", delivery::Mix::Spread)];
        if args.hold_round && label == "hold-1s-hold" {
            print_round_routes(&sut.cascade);
            mixes.push(("round", delivery::Mix::Round(&[30, 60])));
        }
        for (run, &rate) in args.hold_rates.iter().enumerate() {
            for &(name, mix) in &mixes {
                // A rate given again is another run: its own destination and ids
                // (the same ids would be answered as replays, never delivered).
                let again = args.hold_rates[..run]
                    .iter()
                    .filter(|&&r| r == rate)
                    .count();
                let steady = match again {
                    0 => format!("{label}-{name}-{rate}"),
                    n => format!("{label}-{name}-{rate}-run{}", n + 1),
                };
                let seconds = if args.quick { 4.0 } else { 20.0 };
                let precision = delivery::steady(
                    &mut sut,
                    &args.amqp_uri,
                    &steady,
                    rate,
                    seconds,
                    mix,
                    &progress,
                )
                .await?;
                results.precision.push(precision);
            }
        }
        progress.finish_and_clear();
        if label != "hold-1s-up" && !args.hold_steady_only {
            let tasks = if args.quick { 2_000 } else { 20_000 };
            let progress = bar(&format!("drain ({label})"));
            let drain = delivery::burst(&mut sut, &args.amqp_uri, label, tasks, &progress).await?;
            progress.finish_and_clear();
            results.drain.push(drain);
        }
        sut.stop().await?;
    }
    Ok(())
}

/// Where round delays wait on a chain: units in the levels, hops, and what
/// the release stage holds (the lead that absorbs the transit).
fn print_round_routes(cascade: &delayline::cascade::Cascade) {
    println!("round delays on this chain: delay, units in the levels, hops, held");
    for seconds in [30u64, 60, 300, 3_600, 86_400] {
        if let Ok(route) = cascade.route(std::time::Duration::from_secs(seconds), "d") {
            println!(
                "  {seconds:>6} s  {:>6} units  {} hops  held {:.1} s",
                route.delay_units,
                route.delay_units.count_ones(),
                route.hold_ms as f64 / 1000.0
            );
        }
    }
}

fn replot(out: &std::path::Path) -> anyhow::Result<()> {
    #[derive(serde::Deserialize)]
    struct Earlier {
        ingest: Vec<Throughput>,
        raw_ceiling_tasks_per_sec: Option<f64>,
    }
    let earlier: Earlier = serde_json::from_slice(&std::fs::read(out.join("results.json"))?)?;
    let path = plot::throughput(
        &out.join("throughput.png"),
        &earlier.ingest,
        earlier.raw_ceiling_tasks_per_sec,
    )
    .map_err(|error| anyhow::anyhow!("{error}"))?;
    println!("plot:    {}", path.display());
    Ok(())
}

/// The default configuration, its precision measured on an empty broker,
/// then `tasks` long delays ingested and inspected, then its precision again.
async fn backlog_phase(
    args: &Args,
    tasks: u64,
    precision: &mut Vec<Precision>,
) -> anyhow::Result<backlog::Backlog> {
    let store = Store::parse(&args.backlog_ledger, &args.postgres_url)?;
    let mut sut =
        ServiceUnderTest::spawn_default(&args.amqp_uri, args.channels, &store, false).await?;
    let broker_before = backlog::broker_use(sut.cascade.prefix())?;
    // A moderate rate (100 due/s) of short delays, as a service sees beside its backlog.
    let (probes, min_delay, max_delay) = if args.quick {
        (300, 100, 3_100)
    } else {
        (1_000, 100, 10_100)
    };
    let progress = bar("backlog");
    let empty = format!("{}empty", plot::BACKLOG_LABEL);
    let delays = Delays {
        tasks: probes,
        min_ms: min_delay,
        max_ms: max_delay,
    };
    precision.push(delivery::precision(&mut sut, &args.amqp_uri, &empty, delays, &progress).await?);
    let spread = backlog::Spread::over_days(args.backlog_days);
    let mut measured =
        backlog::load_and_inspect(&sut, broker_before, tasks, spread, &progress).await?;
    let loaded = format!("{}loaded", plot::BACKLOG_LABEL);
    precision
        .push(delivery::precision(&mut sut, &args.amqp_uri, &loaded, delays, &progress).await?);
    progress.set_message("backlog: a restart");
    measured.restart = Some(backlog::restart(&mut sut, &args.amqp_uri).await?);
    progress.set_message("backlog: deleting it");
    let started = std::time::Instant::now();
    sut.stop().await?;
    measured.teardown_seconds = started.elapsed().as_secs_f64();
    progress.finish_and_clear();
    Ok(measured)
}

/// Single and batch HTTP ingest against one service; the summary is
/// relative to the raw ceiling measured before.
/// Plugin-style producers publishing to the service's AMQP ingress, as fast
/// as the broker confirms, for `seconds`; the rate is the service's: tasks
/// committed in the ledger (its `accepted` count) over the time from the
/// first publish until it has taken the last.
async fn ingest_over_ingress(
    args: &Args,
    sut: &ServiceUnderTest,
    store: &str,
    seconds: Duration,
    progress: &ProgressBar,
    results: &mut Results,
) -> anyhow::Result<()> {
    let Some(ingress) = &sut.ingress else {
        return Ok(());
    };
    let broker = cpu::broker_pid();
    for in_flight in [256, 1024] {
        progress.set_message(format!(
            "ingest [{store}]: amqp ingress, {in_flight} in flight"
        ));
        let before = ingress_accepted(sut, &ingress.exchange).await?;
        let meter = cpu::Meter::start(broker, sut.pid());
        let started = std::time::Instant::now();
        let mut measured = load::raw_amqp(
            &args.amqp_uri,
            &sut.cascade,
            load::RawTarget::Ingress(&ingress.exchange),
            args.channels,
            in_flight,
            seconds,
            progress,
        )
        .await?;
        let wanted = before + measured.tasks;
        let deadline = started + Duration::from_secs(600);
        while ingress_accepted(sut, &ingress.exchange).await? < wanted {
            if std::time::Instant::now() > deadline {
                anyhow::bail!(
                    "the ingress did not take {} messages in 10 minutes",
                    measured.tasks
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let elapsed = started.elapsed().as_secs_f64();
        measured.store = store.to_owned();
        measured.seconds = elapsed;
        measured.tasks_per_sec = measured.tasks as f64 / elapsed;
        measured.cpu = meter.finish(measured.tasks);
        results.ingest.push(measured);
    }
    Ok(())
}

/// The ingress's `accepted` count, from the service's metrics.
async fn ingress_accepted(sut: &ServiceUnderTest, exchange: &str) -> anyhow::Result<u64> {
    let text = reqwest::get(format!("{}/metrics", sut.base))
        .await?
        .text()
        .await?;
    let series =
        format!("delayline_ingress_messages_total{{ingress=\"{exchange}\",outcome=\"accepted\"}} ");
    Ok(text
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map_or(0, |count| count as u64))
}

async fn ingest_over_http(
    args: &Args,
    sut: &ServiceUnderTest,
    store: &str,
    seconds: Duration,
    progress: &ProgressBar,
    results: &mut Results,
) -> anyhow::Result<StoreSummary> {
    let cpu_before = sut.cpu_ms();
    let broker = cpu::broker_pid();
    let first = results.ingest.len();
    let single = if args.quick {
        vec![1, 16, 64]
    } else {
        vec![1, 4, 16, 64, 256]
    };
    let batch = if args.quick {
        vec![1, 4]
    } else {
        vec![1, 2, 4, 8, 16]
    };
    let runs = single
        .into_iter()
        .map(|c| (c, 1))
        .chain(batch.into_iter().map(|c| (c, 100)));
    for (concurrency, batch_size) in runs {
        let kind = if batch_size > 1 {
            "batch(100)"
        } else {
            "single"
        };
        progress.set_message(format!("ingest [{store}]: http {kind} x{concurrency}"));
        let meter = cpu::Meter::start(broker, sut.pid());
        let mut measured = load::http(
            &sut.base,
            sut.token.as_deref(),
            store,
            concurrency,
            batch_size,
            seconds,
            progress,
        )
        .await?;
        measured.cpu = meter.finish(measured.tasks);
        results.ingest.push(measured);
    }
    let measured = &results.ingest[first..];
    let http_tasks: u64 = measured.iter().map(|t| t.tasks).sum();
    let ceiling = results.raw_ceiling_tasks_per_sec.unwrap_or(f64::NAN);
    let best = |path: &str| {
        measured
            .iter()
            .filter(|t| t.path == path)
            .map(|t| t.tasks_per_sec / ceiling)
            .reduce(f64::max)
    };
    Ok(StoreSummary {
        store: store.to_owned(),
        best_single_ratio: best("http single"),
        best_batch_ratio: best("http batch"),
        service_peak_rss_kib: sut.peak_rss_kib(),
        service_cpu_us_per_task: match (cpu_before, sut.cpu_ms()) {
            (Some(before), Some(after)) => {
                Some((after - before) * 1000.0 / http_tasks.max(1) as f64)
            }
            _ => None,
        },
    })
}

impl Args {
    /// Whether `phase` runs: named, or none named and it runs by default.
    fn runs(&self, phase: Phase) -> bool {
        if self.phases.is_empty() {
            phase.by_default()
        } else {
            self.phases.contains(&phase)
        }
    }
}
