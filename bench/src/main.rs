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
mod plot;
mod queue_pass;
mod rabbitmqctl;
mod record_cost;
mod replicas;
mod retries;
mod routing;
mod schedules;
mod shards;
mod sut;
mod timer;

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
    /// Only these phases (ingest, routing, precision, hold, drain, overload,
    /// backlog, ledger, schedules, timer, record-cost, limits, forecast,
    /// replicas); all by default. `shards`, `burst`, `instant`, `retries`
    /// and `queue-pass` run only when named.
    #[arg(long, value_delimiter = ',')]
    phases: Vec<String>,
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
    /// The ingest phase (and the overload phase) gives every task the same
    /// delay, so the ledger's due-order indexes take each at their end,
    /// instead of spreading them over an hour.
    #[arg(long)]
    ingest_same_delay: bool,
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
    let run = |phase: &str| args.phases.is_empty() || args.phases.iter().any(|p| p == phase);
    let seconds = Duration::from_secs(args.seconds.unwrap_or(if args.quick { 2 } else { 10 }));
    std::fs::create_dir_all(&args.out)?;
    if args.replot {
        return replot(&args.out);
    }
    let mut results = Results {
        machine: machine(),
        quick: args.quick,
        ingest_same_delay: args.ingest_same_delay,
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
        queue_pass: Vec::new(),
    };

    if run("ingest") {
        let stores = args
            .stores
            .iter()
            .map(|name| {
                let (store, auth) = match name.strip_suffix("+auth") {
                    Some(store) => (store, true),
                    None => (name.as_str(), false),
                };
                Ok((Store::parse(store, &args.postgres_url)?, auth, name.clone()))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let broker = cpu::broker_pid();
        for (store, auth, label) in stores {
            let sut = ServiceUnderTest::spawn_default(&args.amqp_uri, args.channels, &store, auth)
                .await?;
            let progress = bar("ingest");
            if results.raw_ceiling_tasks_per_sec.is_none() {
                // The ceiling is the best the broker does into the cascade's
                // entry at any depth of pipelining, over the service's
                // channels and four times as many; a plain quorum queue,
                // same messages, is measured beside it, not counted in it.
                let wider = args.channels * 4;
                let reference = load::PlainReference::declare(
                    &args.amqp_uri,
                    format!("{}.plain-reference", sut.cascade.prefix()),
                )
                .await?;
                for channels in [args.channels, wider] {
                    for in_flight in [64, 256, 1024] {
                        progress.set_message(format!(
                            "ingest: raw AMQP, {channels} channels, {in_flight} in flight"
                        ));
                        let meter = cpu::Meter::start(broker, sut.pid());
                        let mut raw = load::raw_amqp(
                            &args.amqp_uri,
                            &sut.cascade,
                            load::RawTarget::Cascade,
                            channels,
                            in_flight,
                            seconds,
                            &progress,
                        )
                        .await?;
                        raw.cpu = meter.finish(raw.tasks);
                        let best = results
                            .raw_ceiling_tasks_per_sec
                            .unwrap_or(0.0)
                            .max(raw.tasks_per_sec);
                        results.raw_ceiling_tasks_per_sec = Some(best);
                        results.ingest.push(raw);
                    }
                    progress.set_message(format!("ingest: plain queue, {channels} channels"));
                    let meter = cpu::Meter::start(broker, sut.pid());
                    let mut plain = load::raw_amqp(
                        &args.amqp_uri,
                        &sut.cascade,
                        load::RawTarget::PlainQueue(&reference.queue),
                        channels,
                        1024,
                        seconds,
                        &progress,
                    )
                    .await?;
                    plain.cpu = meter.finish(plain.tasks);
                    results.ingest.push(plain);
                    reference.purge().await?;
                }
                reference.delete().await?;
            }
            let ingress = sut.ingress.is_some() && !auth;
            if ingress && args.ingress_first {
                ingest_over_ingress(&args, &sut, &label, seconds, &progress, &mut results).await?;
            }
            let summary =
                ingest_over_http(&args, &sut, &label, seconds, &progress, &mut results).await?;
            if ingress && !args.ingress_first {
                ingest_over_ingress(&args, &sut, &label, seconds, &progress, &mut results).await?;
            }
            progress.finish_and_clear();
            results.stores.push(summary);
            sut.stop().await?;
        }
    }

    if run("routing") {
        // A topology of its own, so that its level queues start as empty as
        // the side queues the steps before it are measured into.
        let sut =
            ServiceUnderTest::spawn_default(&args.amqp_uri, args.channels, &Store::None, false)
                .await?;
        let progress = bar("routing");
        let steps = routing::split(
            &args.amqp_uri,
            &sut.cascade,
            args.channels,
            seconds,
            &progress,
        )
        .await?;
        progress.finish_and_clear();
        results.ingest.extend(steps);
        sut.stop().await?;
    }

    if run("precision") {
        let (low, high) = if args.quick { (50, 500) } else { (200, 5000) };
        // (unit, min delay, max delay): delays span several units, starting above one unit.
        let scenarios = if args.quick {
            [(1000, 1_000, 4_000), (10, 100, 2_100)]
        } else {
            [(1000, 1_000, 11_000), (10, 100, 5_100)]
        };
        for (unit_ms, min_delay, max_delay) in scenarios {
            let levels = if unit_ms >= 1000 { 20 } else { 24 };
            let setup = Setup {
                levels,
                unit_ms,
                queue_type: QueueType::Quorum,
                store: Store::None,
                release_stage: false,
                precision_ms: None,
                auth: false,
                shards: 1,
            };
            let mut sut = ServiceUnderTest::spawn(&args.amqp_uri, args.channels, &setup).await?;
            for (label, tasks) in [("low", low), ("high", high)] {
                let progress = bar(&format!("precision {unit_ms} ms {label}"));
                let label = format!("{unit_ms}ms-{label}");
                let delays = Delays {
                    tasks,
                    min_ms: min_delay,
                    max_ms: max_delay,
                };
                let precision =
                    delivery::precision(&mut sut, &args.amqp_uri, &label, delays, &progress)
                        .await?;
                progress.finish_and_clear();
                results.precision.push(precision);
            }
            sut.stop().await?;
        }
        // What the release stage adds at a low rate: the default ledger with
        // the stage off and on, the same tasks, one after the other.
        let (min_delay, max_delay) = if args.quick {
            (100, 2_100)
        } else {
            (100, 5_100)
        };
        for release_stage in [false, true] {
            let setup = Setup {
                levels: 24,
                unit_ms: 10,
                queue_type: QueueType::Quorum,
                store: Store::Sqlite,
                release_stage,
                precision_ms: None,
                auth: false,
                shards: 1,
            };
            let mut sut = ServiceUnderTest::spawn(&args.amqp_uri, args.channels, &setup).await?;
            let label = if release_stage {
                "10ms-release"
            } else {
                "10ms-sqlite"
            };
            let progress = bar(&format!("precision {label}"));
            let delays = Delays {
                tasks: low,
                min_ms: min_delay,
                max_ms: max_delay,
            };
            let precision =
                delivery::precision(&mut sut, &args.amqp_uri, label, delays, &progress).await?;
            progress.finish_and_clear();
            results.precision.push(precision);
            // The same tasks from a plugin-style producer, through the ingress.
            if let Some(exchange) = sut.ingress.as_ref().map(|i| i.exchange.clone()) {
                let progress = bar("precision 10ms-ingress");
                let intake = delivery::Intake::Ingress(&exchange);
                let precision = delivery::precision_over(
                    &mut sut,
                    &args.amqp_uri,
                    "10ms-ingress",
                    delays,
                    intake,
                    &progress,
                )
                .await?;
                progress.finish_and_clear();
                results.precision.push(precision);
            }
            sut.stop().await?;
        }
    }

    if run("hold") {
        hold_phase(&args, &mut results).await?;
    }

    if run("drain") {
        let tasks = if args.quick { 2_000 } else { 20_000 };
        // The cascade alone (both queue types), then the default ledger with
        // the release stage off and on: the stage's cost is the last two side by side.
        for (queue_type, store, release_stage) in [
            (QueueType::Quorum, Store::None, false),
            (QueueType::Classic, Store::None, false),
            (QueueType::Quorum, Store::Sqlite, false),
            (QueueType::Quorum, Store::Sqlite, true),
        ] {
            let setup = Setup {
                levels: 16,
                unit_ms: 10,
                queue_type,
                store: store.clone(),
                release_stage,
                precision_ms: None,
                auth: false,
                shards: 1,
            };
            let mut sut = ServiceUnderTest::spawn(&args.amqp_uri, args.channels, &setup).await?;
            let label = format!(
                "{}{}{}",
                queue_type.as_str(),
                if store == Store::None { "" } else { "+sqlite" },
                if release_stage { "+release" } else { "" }
            );
            let progress = bar(&format!("drain ({label})"));
            let drain = delivery::burst(&mut sut, &args.amqp_uri, &label, tasks, &progress).await?;
            progress.finish_and_clear();
            results.drain.push(drain);
            sut.stop().await?;
        }
        // The cascade alone (quorum, no ledger): its dead-letter rate sizes
        // the default cascade for other delay mixes.
        if let Some(cascade) = results.drain.first() {
            // The default chain, with its release stage: held, a unit's lead.
            let default = delayline::cascade::CascadeSettings {
                release_stage: Some(true),
                ..delayline::cascade::CascadeSettings::default()
            }
            .validate()?;
            results.capacity = capacity::size_on(&default, cascade.hops_per_sec);
        }
    }

    if run("overload") {
        // The default configuration; its capacity measured first, then twice
        // that offered, open loop.
        let sut =
            ServiceUnderTest::spawn_default(&args.amqp_uri, args.channels, &Store::Sqlite, false)
                .await?;
        let progress = bar("overload: capacity");
        let mut capacity = load::http(&sut.base, None, "sqlite", 64, 1, seconds, &progress).await?;
        // Listed with the ingest rows, but not a point of the ingest curves.
        capacity.path = "http single (capacity)".to_owned();
        progress.set_message("overload: 2x capacity, open loop");
        let overload = load::overload(
            &sut.base,
            "sqlite",
            capacity.tasks_per_sec,
            capacity.tasks_per_sec * 2.0,
            seconds,
            &progress,
        )
        .await?;
        progress.finish_and_clear();
        results.ingest.push(capacity);
        results.overload.push(overload);
        sut.stop().await?;
    }

    if run("backlog") {
        let tasks = args
            .scale
            .unwrap_or(if args.quick { 20_000 } else { 1_000_000 });
        results.backlog = Some(backlog_phase(&args, tasks, &mut results.precision).await?);
    }

    if run("ledger") {
        let tasks = args
            .ledger_tasks
            .unwrap_or(if args.quick { 10_000 } else { 100_000 });
        let schema = ledger::Schema {
            dropped: &args.ledger_drop_index,
            sql: args.ledger_sql.as_deref(),
            label: args.ledger_label.as_deref(),
        };
        results.ledger = ledger::phase(tasks, &schema, args.ledger_same_delay).await?;
    }

    if run("limits") {
        let progress = bar("limits");
        if let Some(step) = args
            .limits_steps
            .iter()
            .find(|step| !paced::STEPS.contains(&step.as_str()))
        {
            anyhow::bail!("--limits-steps: no step {step} (of {:?})", paced::STEPS);
        }
        let options = paced::Options {
            quick: args.quick,
            steps: &args.limits_steps,
            rates: &args.limits_rates,
            burst_secs: args.limits_burst_secs,
        };
        let limits = paced::phase(&args.amqp_uri, args.channels, &options, &progress).await?;
        progress.finish_and_clear();
        for paced in &limits.paced {
            println!(
                "limits: paced at {}/s ({}), achieved {:.1}/s over 10 s (ratio {:.3}, {} tasks)",
                paced.configured_per_sec,
                paced.source,
                paced.achieved_per_sec,
                paced.ratio,
                paced.tasks
            );
        }
        if let Some(b) = &limits.beside {
            println!(
                "limits: unlimited destination at {}/s, lateness ms p50/p99/max: alone {:.1}/{:.1}/{:.1}, beside {} waiting {:.1}/{:.1}/{:.1}",
                b.rate_per_sec,
                b.alone_p50_ms,
                b.alone_p99_ms,
                b.alone_max_ms,
                b.waiting,
                b.beside_p50_ms,
                b.beside_p99_ms,
                b.beside_max_ms
            );
        }
        for o in limits.outage.iter().chain(&limits.outage_unlimited) {
            let rate = o
                .configured_per_sec
                .map_or("no limit".to_owned(), |rate| format!("{rate}/s"));
            println!(
                "limits: outage drain of {} at {rate}: first {:.0} ms after restart, achieved {:.1}/s (ratio {}), drained in {:.1} s",
                o.tasks,
                o.first_after_restart_ms,
                o.achieved_per_sec,
                o.ratio.map_or("-".to_owned(), |r| format!("{r:.3}")),
                o.drain_seconds
            );
        }
        results.limits = Some(limits);
    }

    if args.phases.iter().any(|p| p == "shards") {
        let progress = bar("shards");
        results.shards = shards::phase(
            &args.amqp_uri,
            args.channels,
            &args.shards,
            args.shards_rate,
            &progress,
        )
        .await?;
        progress.finish_and_clear();
        for r in &results.shards {
            println!(
                "shards: {} shard(s), {} tasks due at once: {:.0}/s over 10 s; leaders {:?}",
                r.shards, r.tasks, r.due_per_sec, r.leaders
            );
        }
    }

    if args.phases.iter().any(|p| p == "burst") {
        let progress = bar("burst");
        results.burst = burst::phase(
            &args.amqp_uri,
            args.channels,
            burst::Timing {
                ahead: Duration::from_secs(args.burst_ahead_s),
                leeway: Duration::from_secs(args.burst_leeway_s),
            },
            &args.burst_sizes,
            &args.burst_modes,
            &progress,
        )
        .await?;
        progress.finish_and_clear();
    }

    if args.phases.iter().any(|p| p == "instant") {
        let progress = bar("instant");
        results.instant = instant::phase(
            &args.amqp_uri,
            args.channels,
            &args.instant_sizes,
            args.instant_made_s,
            &progress,
        )
        .await?;
        progress.finish_and_clear();
    }

    if args.phases.iter().any(|p| p == "retries") {
        let progress = bar("retries");
        results.retries = retries::phase(
            &args.amqp_uri,
            args.channels,
            &args.retries_sizes,
            &progress,
        )
        .await?;
        progress.finish_and_clear();
    }

    if args.phases.iter().any(|p| p == "queue-pass") {
        let prefix = format!("delayline-bench-{}", std::process::id());
        results.queue_pass = queue_pass::phase(
            &args.amqp_uri,
            &prefix,
            &args.pass_types,
            args.channels,
            args.pass_in_flight,
            seconds,
        )
        .await?;
        for p in &results.queue_pass {
            println!(
                "queue-pass: {} queue, {} in flight over {} channels: {:.0}/s through \
                 (published {:.0}/s), {} of {} consumed; broker {:.0} µs a message",
                p.queue_type,
                p.in_flight,
                p.channels,
                p.passed_per_sec,
                p.published_per_sec,
                p.consumed,
                p.published,
                p.cpu.broker_us.unwrap_or(f64::NAN)
            );
        }
    }

    if run("replicas") {
        let progress = bar("replicas");
        let seconds = args.seconds.unwrap_or(if args.quick { 2 } else { 10 });
        results.replicas = replicas::phase(
            &args.amqp_uri,
            args.channels,
            &args.postgres_url,
            args.quick,
            seconds,
            args.replicas_shards,
            &progress,
        )
        .await?;
        progress.finish_and_clear();
        for r in &results.replicas {
            println!(
                "replicas: {} on PostgreSQL, {} shard(s): intake {:.0} tasks/s ({} errors, {:.0} µs service CPU a task); \
                 {} due at once: first {:.0} ms after, {:.0}/s, last {:.0} ms after{}; missing {}, duplicates {}",
                r.replicas,
                r.shards,
                r.intake_per_sec,
                r.intake_errors,
                r.intake_service_cpu_us,
                r.due_tasks,
                r.first_after_due_ms,
                r.due_per_sec,
                r.last_after_due_ms,
                if r.killed_one {
                    ", one replica SIGKILLed 500 ms after"
                } else {
                    ""
                },
                r.missing,
                r.duplicates
            );
        }
    }

    if run("forecast") {
        let tasks = args
            .scale
            .unwrap_or(if args.quick { 20_000 } else { 1_000_000 });
        let stores = [Store::Sqlite, Store::parse("postgres", &args.postgres_url)?];
        let progress = bar("forecast");
        results.forecast = forecast::phase(&args.amqp_uri, args.channels, tasks, &stores).await?;
        progress.finish_and_clear();
        for run in &results.forecast {
            println!(
                "forecast ({}): {} tasks over 24 h, 1-minute buckets: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; one destination p99 {:.1} ms; counted {}; fill {:.1} s, fold {:.1} s; bulk cancel of {} in {:.1} s, forecast p99 meanwhile {:.1} ms",
                run.store,
                run.tasks,
                run.p50_ms,
                run.p99_ms,
                run.max_ms,
                run.one_destination_p99_ms,
                run.counted,
                run.fill_seconds,
                run.fold_seconds,
                run.bulk_cancelled,
                run.bulk_seconds,
                run.during_bulk_p99_ms
            );
        }
    }

    if run("timer") {
        let timers = timer::phase(1_000.0, if args.quick { 2.0 } else { 10.0 }).await?;
        for timer in &timers {
            println!(
                "timer ({}): {} waits at {}/s, late p50 {} µs, p90 {} µs, p99 {} µs, max {} µs",
                timer.waiter,
                timer.waits,
                timer.waits_per_sec,
                timer.late_p50_us,
                timer.late_p90_us,
                timer.late_p99_us,
                timer.late_max_us
            );
        }
        results.timer = timers;
    }

    if run("record-cost") {
        let calls = if args.quick { 1_000_000 } else { 10_000_000 };
        let costs = record_cost::phase(calls);
        for cost in &costs {
            println!(
                "record-cost: a delivery recorded in {:.0} ns ({} thread(s) at once, {} each)",
                cost.ns_per_delivery, cost.threads, cost.calls
            );
        }
        results.record_cost = costs;
    }

    if run("schedules") {
        let held = args
            .schedules_held
            .unwrap_or(if args.quick { 10_000 } else { 100_000 });
        let (idle, ticks) = if args.quick { (5, 5) } else { (30, 20) };
        let progress = bar("schedules");
        let measured = schedules::phase(
            &args.amqp_uri,
            args.channels,
            (held, args.schedules_spread),
            Duration::from_secs(idle),
            ticks,
            &progress,
        )
        .await?;
        progress.finish_and_clear();
        results.schedules = Some(measured);
    }

    print_report(&results);
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

fn print_report(results: &Results) {
    let m = &results.machine;
    println!(
        "\nmachine: {} cpus, {}; RabbitMQ {}",
        m.cpus, m.cpu_model, m.rabbitmq
    );
    ledger::print(&results.ledger);
    if let Some(measured) = &results.schedules {
        schedules::print(measured);
    }
    if !results.ingest.is_empty() {
        if results.ingest_same_delay {
            println!("\n(every ingest task has the same delay: --ingest-same-delay)");
        }
        println!(
            "\n{:<22} {:>9} {:>5} {:>6} {:>10} {:>8} {:>9} {:>9} {:>7} {:>20}",
            "ingest",
            "ledger",
            "conc",
            "batch",
            "tasks/s",
            "ratio",
            "p50 ms",
            "p99 ms",
            "errors",
            "CPU us/task b/s/d/l"
        );
        let us = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
        let ceiling = results.raw_ceiling_tasks_per_sec.unwrap_or(f64::NAN);
        for t in &results.ingest {
            println!(
                "{:<22} {:>9} {:>5} {:>6} {:>10.0} {:>8.2} {:>9.2} {:>9.2} {:>7} {:>20}",
                t.path,
                t.store,
                t.concurrency,
                t.batch_size,
                t.tasks_per_sec,
                t.tasks_per_sec / ceiling,
                t.p50_ms,
                t.p99_ms,
                t.errors,
                format!(
                    "{}/{}/{}/{}",
                    us(t.cpu.broker_us),
                    us(t.cpu.service_us),
                    us(t.cpu.database_us),
                    us(t.cpu.load_generator_us)
                )
            );
        }
        let fmt = |r: Option<f64>| r.map_or("-".to_owned(), |r| format!("{r:.2}"));
        println!(
            "\n{:<9} {:>12} {:>12} {:>10} {:>12}",
            "ledger", "best single", "best batch", "peak MiB", "CPU us/task"
        );
        for s in &results.stores {
            println!(
                "{:<9} {:>12} {:>12} {:>10} {:>12}",
                s.store,
                fmt(s.best_single_ratio),
                fmt(s.best_batch_ratio),
                s.service_peak_rss_kib
                    .map_or("-".to_owned(), |k| format!("{:.1}", k as f64 / 1024.0)),
                s.service_cpu_us_per_task
                    .map_or("-".to_owned(), |c| format!("{c:.0}")),
            );
        }
        println!("(ratios to the raw AMQP ceiling; targets: single 0.5, batch 0.8)");
        println!(
            "(CPU us/task: broker / service / PostgreSQL server / load generator, from /proc)"
        );
    }
    for o in &results.overload {
        println!(
            "\noverload ({}): capacity {:.0}/s, offered {:.0}/s for {:.1} s: accepted {:.0}/s \
             (p50 {:.1} ms, p99 {:.1} ms), refused {} (p50 {:.1} ms, p99 {:.1} ms), failed {} {:?}",
            o.store,
            o.capacity_per_sec,
            o.offered_per_sec,
            o.seconds,
            o.accepted_per_sec,
            o.accepted_p50_ms,
            o.accepted_p99_ms,
            o.refused,
            o.refused_p50_ms,
            o.refused_p99_ms,
            o.failed,
            o.failures
        );
    }
    if !results.precision.is_empty() {
        println!(
            "\n{:<14} {:>6} {:>8} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12}",
            "precision",
            "tasks",
            "due/s",
            "recv",
            "early",
            "late p50",
            "p90",
            "p99",
            "max",
            "vs due p50",
            "vs due p99"
        );
        for p in &results.precision {
            println!(
                "{:<14} {:>6} {:>8.0} {:>6} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>12.1} {:>12.1}",
                p.label,
                p.tasks,
                p.due_per_sec,
                p.received,
                p.early,
                p.late_p50_ms,
                p.late_p90_ms,
                p.late_p99_ms,
                p.late_max_ms,
                p.after_deliver_at_p50_ms,
                p.after_deliver_at_p99_ms
            );
        }
        println!(
            "(lateness in ms relative to the requested time; 'vs due' relative to deliver_at, the time rounded up to the unit)"
        );
        for p in &results.precision {
            if let Some(f) = &p.floor {
                println!(
                    "{:<14} broker floor ({} of {} timed publishes): p50 {:.1}, p90 {:.1}, p99 {:.1}, max {:.1} ms",
                    p.label, f.received, f.probes, f.p50_ms, f.p90_ms, f.p99_ms, f.max_ms
                );
            }
        }
    }
    if !results.capacity.is_empty() {
        println!(
            "\n{:<22} {:>8} {:>10} {:>12} {:>12}",
            "capacity: delay mix", "unit ms", "mean hops", "hops/s", "due tasks/s"
        );
        for c in &results.capacity {
            println!(
                "{:<22} {:>8} {:>10.2} {:>12.0} {:>12.0}",
                c.mix, c.unit_ms, c.mean_hops, c.hops_per_sec, c.due_tasks_per_sec
            );
        }
        println!("(due tasks/s = the cascade's dead-letter rate / mean hops of the mix)");
    }
    if let Some(b) = &results.backlog {
        print_backlog(b);
    }
    if !results.drain.is_empty() {
        println!(
            "\n{:<24} {:>7} {:>9} {:>10} {:>12} {:>14} {:>10} {:>8}",
            "drain",
            "tasks",
            "received",
            "seconds",
            "due tasks/s",
            "first after ms",
            "mean hops",
            "hops/s"
        );
        for d in &results.drain {
            println!(
                "{:<24} {:>7} {:>9} {:>10.2} {:>12.0} {:>14.1} {:>10.2} {:>8.0}",
                d.label,
                d.tasks,
                d.received,
                d.drain_seconds,
                d.due_tasks_per_sec,
                d.first_arrival_after_due_ms,
                d.mean_hops,
                d.hops_per_sec
            );
        }
    }
}

fn print_backlog(b: &backlog::Backlog) {
    println!(
        "\nbacklog: {} tasks on {} due in {:.1}-{:.1} h, ingested in {:.0} s ({:.0}/s, {} refused and sent again)",
        b.tasks,
        b.ledger,
        b.spread.from_ms as f64 / 3.6e6,
        b.spread.to_ms as f64 / 3.6e6,
        b.ingest_seconds,
        b.ingest_tasks_per_sec,
        b.refused
    );
    let rates: Vec<String> = b
        .admission
        .iter()
        .map(|r| format!("{:.0}", r.tasks_per_sec))
        .collect();
    println!(
        "  admitted a second every 5 %: {}; the last over the first {:.2}",
        rates.join(" "),
        b.admission_last_over_first
    );
    for (when, broker) in [("before", &b.broker_before), ("loaded", &b.broker_loaded)] {
        println!(
            "  broker {when:<7} memory {:>8.0} MiB  disk {:>8.0} MiB  messages {:>9}",
            broker.memory_mib, broker.disk_mib, broker.messages
        );
    }
    let rss: Vec<String> = b
        .service_rss
        .iter()
        .map(|s| format!("{:.0}", s.rss_mib))
        .collect();
    println!(
        "  service RSS MiB every 5 %: {}; peak {:.0} MiB",
        rss.join(" "),
        b.service_peak_rss_mib
    );
    println!(
        "  ledger on disk: {:.0} MiB, {:.0} bytes a task",
        b.ledger_mib, b.ledger_bytes_a_task
    );
    for (what, l) in [
        ("GET /v1/tasks/{id}", &b.get_task),
        ("GET /v1/tasks?due_before (100)", &b.first_page),
        ("pages of 1000 by cursor", &b.deep_pages),
        ("GET /metrics", &b.scrape),
    ] {
        println!(
            "  {what:<32} n={:<5} p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  not 200: {}",
            l.samples, l.p50_ms, l.p99_ms, l.max_ms, l.errors
        );
    }
    println!("  console pages, {} tasks in the ledger:", b.tasks);
    for (what, l) in &b.console {
        println!(
            "    {what:<36} n={:<3} p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  not 200: {}",
            l.samples, l.p50_ms, l.p99_ms, l.max_ms, l.errors
        );
    }
    for (what, l) in &b.forecast {
        println!(
            "  forecast, {what:<32} n={:<3} p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  not 200: {}",
            l.samples, l.p50_ms, l.p99_ms, l.max_ms, l.errors
        );
    }
    for (what, cost) in &b.passes {
        println!(
            "  ledger pass {what:<24} {:>5} passes, mean {:>8.2} ms, p99 at most {:>8.1} ms",
            cost.passes, cost.mean_ms, cost.p99_at_most_ms
        );
    }
    if let Some(r) = &b.restart {
        println!(
            "  restart: stopped in {:.1} s; ready {:.1} s after the start, the task due meanwhile released {:.1} s after it",
            r.stop_seconds, r.ready_seconds, r.first_release_seconds
        );
    }
    println!(
        "  ({} rows paged through; deleting the backlog took {:.0} s)",
        b.deep_rows, b.teardown_seconds
    );
}
