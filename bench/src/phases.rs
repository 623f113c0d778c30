//! The benchmark's phases, each one unit: a variant of [`Phase`] (its name
//! on the command line), whether it runs when no phase is named, and the
//! function that runs it and keeps its results. The runner (`main`) goes
//! through [`Phase::ALL`] in order.

use std::time::Duration;

use delayline::cascade::QueueType;

use crate::delivery::Delays;
use crate::sut::{ServiceUnderTest, Setup, Store};
use crate::{
    Args, Results, backlog_phase, bar, burst, capacity, cpu, delivery, forecast, hold_phase,
    ingest_over_http, ingest_over_ingress, instant, ledger, load, paced, parked, queue_pass,
    record_cost, replicas, retries, routing, schedules, shards, timer,
};

/// Every phase, as `--phases` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    Ingest,
    Routing,
    Precision,
    Hold,
    Drain,
    Overload,
    Backlog,
    Ledger,
    Limits,
    Shards,
    Burst,
    Instant,
    Retries,
    Parked,
    QueuePass,
    Replicas,
    Forecast,
    Timer,
    RecordCost,
    Schedules,
}

impl Phase {
    /// Every phase, in the order they run.
    pub const ALL: [Phase; 20] = [
        Phase::Ingest,
        Phase::Routing,
        Phase::Precision,
        Phase::Hold,
        Phase::Drain,
        Phase::Overload,
        Phase::Backlog,
        Phase::Ledger,
        Phase::Limits,
        Phase::Shards,
        Phase::Burst,
        Phase::Instant,
        Phase::Retries,
        Phase::Parked,
        Phase::QueuePass,
        Phase::Replicas,
        Phase::Forecast,
        Phase::Timer,
        Phase::RecordCost,
        Phase::Schedules,
    ];

    /// Whether it runs when no phase is named: those that need the broker
    /// to themselves for long, or a machine of their own, run only when
    /// named.
    pub fn by_default(self) -> bool {
        !matches!(
            self,
            Phase::Shards
                | Phase::Burst
                | Phase::Instant
                | Phase::Retries
                | Phase::Parked
                | Phase::QueuePass
        )
    }

    /// Runs the phase, keeping what it measured in `results`.
    pub async fn run(
        self,
        args: &Args,
        seconds: Duration,
        results: &mut Results,
    ) -> anyhow::Result<()> {
        match self {
            Phase::Ingest => ingest(args, seconds, results).await,
            Phase::Routing => routing(args, seconds, results).await,
            Phase::Precision => precision(args, seconds, results).await,
            Phase::Hold => hold(args, seconds, results).await,
            Phase::Drain => drain(args, seconds, results).await,
            Phase::Overload => overload(args, seconds, results).await,
            Phase::Backlog => backlog(args, seconds, results).await,
            Phase::Ledger => ledger(args, seconds, results).await,
            Phase::Limits => limits(args, seconds, results).await,
            Phase::Shards => shards(args, seconds, results).await,
            Phase::Burst => burst(args, seconds, results).await,
            Phase::Instant => instant(args, seconds, results).await,
            Phase::Retries => retries(args, seconds, results).await,
            Phase::Parked => parked(args, results).await,
            Phase::QueuePass => queue_pass(args, seconds, results).await,
            Phase::Replicas => replicas(args, seconds, results).await,
            Phase::Forecast => forecast(args, seconds, results).await,
            Phase::Timer => timer(args, seconds, results).await,
            Phase::RecordCost => record_cost(args, seconds, results).await,
            Phase::Schedules => schedules(args, seconds, results).await,
        }
    }
}

async fn ingest(args: &Args, seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
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
        let sut =
            ServiceUnderTest::spawn_default(&args.amqp_uri, args.channels, &store, auth).await?;
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
            ingest_over_ingress(args, &sut, &label, seconds, &progress, results).await?;
        }
        let summary = ingest_over_http(args, &sut, &label, seconds, &progress, results).await?;
        if ingress && !args.ingress_first {
            ingest_over_ingress(args, &sut, &label, seconds, &progress, results).await?;
        }
        progress.finish_and_clear();
        results.stores.push(summary);
        sut.stop().await?;
    }
    Ok(())
}

async fn routing(args: &Args, seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
    // A topology of its own, so that its level queues start as empty as
    // the side queues the steps before it are measured into.
    let sut =
        ServiceUnderTest::spawn_default(&args.amqp_uri, args.channels, &Store::None, false).await?;
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
    Ok(())
}

async fn precision(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
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
                delivery::precision(&mut sut, &args.amqp_uri, &label, delays, &progress).await?;
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
    Ok(())
}

async fn hold(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
    hold_phase(args, results).await?;
    Ok(())
}

async fn drain(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
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
    Ok(())
}

async fn overload(args: &Args, seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
    // The default configuration; its capacity measured first, then twice
    // that offered, open loop.
    let sut = ServiceUnderTest::spawn_default(&args.amqp_uri, args.channels, &Store::Sqlite, false)
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
    Ok(())
}

async fn backlog(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
    let tasks = args
        .scale
        .unwrap_or(if args.quick { 20_000 } else { 1_000_000 });
    results.backlog = Some(backlog_phase(args, tasks, &mut results.precision).await?);
    Ok(())
}

async fn ledger(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
    let tasks = args
        .ledger_tasks
        .unwrap_or(if args.quick { 10_000 } else { 100_000 });
    let schema = ledger::Schema {
        dropped: &args.ledger_drop_index,
        sql: args.ledger_sql.as_deref(),
        label: args.ledger_label.as_deref(),
    };
    let shape = ledger::Shape {
        same_delay: args.ledger_same_delay,
        staged: args.ledger_staged,
    };
    results.ledger = ledger::phase(tasks, &schema, shape).await?;
    Ok(())
}

async fn limits(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
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
    Ok(())
}

async fn shards(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
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
    Ok(())
}

async fn burst(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
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
    Ok(())
}

async fn instant(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
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
    Ok(())
}

async fn retries(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
    let progress = bar("retries");
    results.retries = retries::phase(
        &args.amqp_uri,
        args.channels,
        &args.retries_sizes,
        &progress,
    )
    .await?;
    progress.finish_and_clear();
    Ok(())
}

async fn parked(args: &Args, results: &mut Results) -> anyhow::Result<()> {
    let progress = bar("parked");
    results.parked =
        parked::phase(&args.amqp_uri, args.channels, &args.parked_sizes, &progress).await?;
    progress.finish_and_clear();
    Ok(())
}

async fn queue_pass(args: &Args, seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
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
    Ok(())
}

async fn replicas(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
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
    Ok(())
}

async fn forecast(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
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
    Ok(())
}

async fn timer(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
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
    Ok(())
}

async fn record_cost(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
    let calls = if args.quick { 1_000_000 } else { 10_000_000 };
    let costs = record_cost::phase(calls);
    for cost in &costs {
        println!(
            "record-cost: a delivery recorded in {:.0} ns ({} thread(s) at once, {} each)",
            cost.ns_per_delivery, cost.threads, cost.calls
        );
    }
    results.record_cost = costs;
    Ok(())
}

async fn schedules(args: &Args, _seconds: Duration, results: &mut Results) -> anyhow::Result<()> {
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
    Ok(())
}
