//! The report the benchmark prints at its end: a section a phase, each
//! printed only when its phase ran (its results are not empty). Phases with
//! a module of their own print their section there (`ledger::print`,
//! `schedules::print`, `backlog::print`).

use crate::{Results, backlog, ledger, schedules};

/// Every section, in the order a reader compares them.
pub fn print(results: &Results) {
    let m = &results.machine;
    println!(
        "\nmachine: {} cpus, {}; RabbitMQ {}",
        m.cpus, m.cpu_model, m.rabbitmq
    );
    ledger::print(&results.ledger);
    if let Some(measured) = &results.schedules {
        schedules::print(measured);
    }
    ingest(results);
    overload(results);
    precision(results);
    capacity(results);
    if let Some(b) = &results.backlog {
        backlog::print(b);
    }
    drain(results);
}

/// The ingest measurements, each beside the raw ceiling, and a summary per ledger.
fn ingest(results: &Results) {
    if results.ingest.is_empty() {
        return;
    }
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
    println!("(CPU us/task: broker / service / PostgreSQL server / load generator, from /proc)");
}

/// What the service accepted and refused when offered more than its capacity.
fn overload(results: &Results) {
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
}

/// Lateness at each due rate, and the broker's own floor beside it.
fn precision(results: &Results) {
    if results.precision.is_empty() {
        return;
    }
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

/// The cascade's dead-letter rate for each mix of delays.
fn capacity(results: &Results) {
    if results.capacity.is_empty() {
        return;
    }
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

/// How fast a backlog due at once came out.
fn drain(results: &Results) {
    if results.drain.is_empty() {
        return;
    }
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
