//! How late tokio's timer wakes a task that waits for a moment, as the
//! release stage waits for each held task's time (`release::stage`
//! sleeps on tokio's timer until its monotonic clock reaches the target).
//! The timer counts whole milliseconds and rounds a deadline up to the next
//! one, so a release is late by up to a millisecond before the broker's
//! path begins: this phase measures that share alone, without the broker.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Timer {
    /// `tokio` (tokio::time::sleep) or `alarm` (delayline's).
    pub waiter: String,
    pub waits: usize,
    pub waits_per_sec: f64,
    /// From the moment waited for to the task running again, µs.
    pub late_p50_us: u64,
    pub late_p90_us: u64,
    pub late_p99_us: u64,
    pub late_max_us: u64,
}

/// Each waiter in turn: `rate` waits a second for `seconds`.
pub async fn phase(rate: f64, seconds: f64) -> anyhow::Result<Vec<Timer>> {
    Ok(vec![
        waits(false, rate, seconds).await?,
        waits(true, rate, seconds).await?,
    ])
}

/// `rate` waits a second for `seconds`, each for a moment 50 to 1,050 ms
/// ahead at a random microsecond, all at once on this runtime.
async fn waits(alarm: bool, rate: f64, seconds: f64) -> anyhow::Result<Timer> {
    let start = Instant::now();
    let waits = (rate * seconds) as usize;
    let mut handles = Vec::with_capacity(waits);
    for n in 0..waits {
        let offset = Duration::from_secs_f64(n as f64 / rate);
        tokio::time::sleep_until((start + offset).into()).await;
        let ahead_us = 50_000 + (n as u64 * 7_919_297) % 1_000_000;
        let target_us = delayline::clock::mono_us() + ahead_us;
        handles.push(tokio::spawn(async move {
            if alarm {
                delayline::clock::until_mono_us(target_us).await;
            } else {
                // Sleep, then check the clock, as the release stage did.
                loop {
                    let left = target_us.saturating_sub(delayline::clock::mono_us());
                    if left == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_micros(left)).await;
                }
            }
            delayline::clock::mono_us() - target_us
        }));
    }
    let mut late = Histogram::<u64>::new(3)?;
    for handle in handles {
        late.record(handle.await?)?;
    }
    Ok(Timer {
        waiter: if alarm { "alarm" } else { "tokio" }.to_owned(),
        waits,
        waits_per_sec: rate,
        late_p50_us: late.value_at_quantile(0.5),
        late_p90_us: late.value_at_quantile(0.9),
        late_p99_us: late.value_at_quantile(0.99),
        late_max_us: late.max(),
    })
}
