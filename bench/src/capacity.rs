//! How many tasks per second can fall due, for a given mix of delays.
//!
//! A task waits in one level queue per set binary digit of its delay (in
//! units), and leaves each by one dead-lettering: its hops. Publishing into
//! the entry level is not a hop, and levels whose digit is 0 are crossed by
//! exchange-to-exchange bindings, without a queue. In a steady state the
//! broker dead-letters `due tasks/s × mean hops` messages per second, so
//! with `H` the dead-letter rate the broker sustains (measured by the drain
//! phase), `due tasks/s ≈ H ÷ mean hops` for the delay mix.

use serde::Serialize;

/// Evenly spaced quantiles each mix is sampled at.
const SAMPLES: u64 = 100_000;

#[derive(Clone, Copy, Debug)]
enum Mix {
    Fixed(u64),
    Uniform(u64, u64),
    /// Log-uniform: as many tasks per decade of delay.
    LogUniform(u64, u64),
}

impl Mix {
    /// The delay (ms) at quantile `q` in `[0, 1)`.
    fn at(self, q: f64) -> u64 {
        match self {
            Mix::Fixed(ms) => ms,
            Mix::Uniform(low, high) => low + ((high - low) as f64 * q) as u64,
            Mix::LogUniform(low, high) => {
                let (low, high) = ((low as f64).ln(), (high as f64).ln());
                (low + (high - low) * q).exp() as u64
            }
        }
    }
}

/// The delay mixes sized in BENCHMARKS.md: a few common fixed delays, and
/// spreads as they come from retries, reminders and schedules.
const MIXES: &[(&str, Mix)] = &[
    ("fixed 90 s", Mix::Fixed(90_000)),
    ("fixed 15 min", Mix::Fixed(900_000)),
    ("fixed 24 h", Mix::Fixed(86_400_000)),
    ("uniform 1-60 s", Mix::Uniform(1_000, 60_000)),
    ("uniform 1-60 min", Mix::Uniform(60_000, 3_600_000)),
    ("uniform 1-24 h", Mix::Uniform(3_600_000, 86_400_000)),
    ("log-uniform 1 s-7 d", Mix::LogUniform(1_000, 604_800_000)),
];

#[derive(Clone, Debug, Serialize)]
pub struct Capacity {
    pub mix: String,
    pub unit_ms: u64,
    /// Mean set digits of the delay in units: hops per task.
    pub mean_hops: f64,
    /// The dead-letter rate this was sized with (hops/s).
    pub hops_per_sec: f64,
    /// `hops_per_sec / mean_hops`.
    pub due_tasks_per_sec: f64,
}

/// Hops of a delay: the set digits of its delay, rounded up to units.
#[cfg(test)]
pub fn hops(delay_ms: u64, unit_ms: u64) -> u32 {
    delay_ms.div_ceil(unit_ms).count_ones()
}

/// Every mix's mean hops on a cascade of `unit_ms` rounding up, and the due
/// rate a broker that dead-letters `hops_per_sec` sustains for it.
#[cfg(test)]
pub fn size(unit_ms: u64, hops_per_sec: f64) -> Vec<Capacity> {
    size_by(unit_ms, hops_per_sec, |delay_ms| hops(delay_ms, unit_ms))
}

/// As [`size`], each delay routed as `cascade` routes it (a chain that holds
/// rounds down, less its release lead).
pub fn size_on(cascade: &delayline::cascade::Cascade, hops_per_sec: f64) -> Vec<Capacity> {
    size_by(cascade.unit_ms(), hops_per_sec, |delay_ms| {
        cascade
            .route(std::time::Duration::from_millis(delay_ms), "d")
            .map_or(0, |route| route.delay_units.count_ones())
    })
}

fn size_by(unit_ms: u64, hops_per_sec: f64, hops_of: impl Fn(u64) -> u32) -> Vec<Capacity> {
    MIXES
        .iter()
        .map(|(name, mix)| {
            let total: u64 = (0..SAMPLES)
                .map(|i| u64::from(hops_of(mix.at(i as f64 / SAMPLES as f64))))
                .sum();
            let mean_hops = total as f64 / SAMPLES as f64;
            Capacity {
                mix: (*name).to_owned(),
                unit_ms,
                mean_hops,
                hops_per_sec,
                due_tasks_per_sec: hops_per_sec / mean_hops,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_hops_once_per_set_digit_of_its_delay_in_units() {
        // 10 s in 1 s units is 1010: levels 3 and 1.
        assert_eq!(hops(10_000, 1_000), 2);
        // Rounded up: 10.001 s is 11 units, 1011.
        assert_eq!(hops(10_001, 1_000), 3);
        assert_eq!(hops(0, 100), 0);
        // 90 s in 100 ms units: 900 = 0b1110000100.
        assert_eq!(hops(90_000, 100), 4);
    }

    #[test]
    fn a_fixed_delay_needs_exactly_its_hops_and_spreads_need_about_half_the_digits() {
        let sized = size(100, 6_000.0);
        let fixed = sized.iter().find(|c| c.mix == "fixed 90 s").unwrap();
        assert_eq!(fixed.mean_hops, 4.0);
        assert_eq!(fixed.due_tasks_per_sec, 1_500.0);
        let day = sized.iter().find(|c| c.mix == "uniform 1-24 h").unwrap();
        // 864,000 units need 20 digits; a spread sets about half of them.
        assert!((8.0..12.0).contains(&day.mean_hops), "{}", day.mean_hops);
    }

    /// The default chain (1 s units, held, a unit's lead) takes no more
    /// hops than 1 s units rounding up, for any mix, fixed delays of whole
    /// seconds included.
    #[test]
    fn the_held_default_takes_the_coarse_units_hops_for_spreads() {
        let default = delayline::cascade::CascadeSettings {
            release_stage: Some(true),
            ..delayline::cascade::CascadeSettings::default()
        }
        .validate()
        .unwrap();
        let held = size_on(&default, 8_553.0);
        let coarse = size(1_000, 8_553.0);
        for (h, c) in held.iter().zip(&coarse) {
            println!(
                "{}: held {:.2} hops, 1 s rounding up {:.2}",
                h.mix, h.mean_hops, c.mean_hops
            );
            assert!(h.mean_hops <= c.mean_hops + 1e-9, "{}", h.mix);
        }
        // 24 h = 86,400 s: 5 set digits, where 86,399 would take 11.
        let day = held.iter().find(|c| c.mix == "fixed 24 h").unwrap();
        assert_eq!(day.mean_hops, 5.0);
    }

    /// BENCHMARKS.md's table of 100 ms against 1 s units: about 3.3 fewer
    /// digits, but a hop is a set digit, so 1.5-1.7 fewer hops for a spread.
    #[test]
    fn a_one_second_unit_saves_the_set_digits_not_the_digits() {
        let fine = size(100, 8_553.0);
        let coarse = size(1_000, 8_553.0);
        let saved: Vec<(String, f64)> = fine
            .iter()
            .zip(&coarse)
            .map(|(f, c)| (f.mix.clone(), f.mean_hops - c.mean_hops))
            .collect();
        let expected = [
            ("fixed 90 s", 0.0),
            ("fixed 15 min", 1.0),
            ("fixed 24 h", 3.0),
            ("uniform 1-60 s", 1.52),
            ("uniform 1-60 min", 1.64),
            ("uniform 1-24 h", 1.70),
            ("log-uniform 1 s-7 d", 1.63),
        ];
        assert_eq!(saved.len(), expected.len());
        for ((mix, hops), (want_mix, want)) in saved.iter().zip(expected) {
            assert_eq!(mix, want_mix);
            assert!(
                (hops - want).abs() < 0.006,
                "{mix}: {hops} fewer hops, not {want}"
            );
        }
    }
}
