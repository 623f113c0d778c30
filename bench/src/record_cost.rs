//! What recording one delivery costs the release stage
//! (`Metrics::delivered`: the lateness histogram, then the last minutes'
//! window behind a mutex), on one thread and on two recording at once, as
//! the release stage's tasks can on two cores. Issue 44 asked whether the
//! mutex per delivery matters beside the rest of a release.

use std::sync::Arc;
use std::time::Instant;

use delayline::testkit::Metrics;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct RecordCost {
    /// Threads recording at once.
    pub threads: usize,
    /// Deliveries recorded by each thread.
    pub calls: u64,
    /// Wall time per recorded delivery, per thread, ns.
    pub ns_per_delivery: f64,
}

/// `calls` deliveries recorded on 1 and then 2 threads at once.
pub fn phase(calls: u64) -> Vec<RecordCost> {
    [1, 2]
        .into_iter()
        .map(|threads| record(threads, calls))
        .collect()
}

fn record(threads: usize, calls: u64) -> RecordCost {
    let metrics = Arc::new(Metrics::new());
    let now_ms = delayline::clock::now_ms();
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|thread| {
            let metrics = metrics.clone();
            std::thread::spawn(move || {
                for n in 0..calls {
                    // Lateness spread over the histogram's buckets.
                    metrics.delivered(now_ms + n / 1_000, (n + thread as u64) % 700);
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.join();
    }
    RecordCost {
        threads,
        calls,
        ns_per_delivery: started.elapsed().as_nanos() as f64 / calls as f64,
    }
}
