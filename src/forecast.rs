//! The forecast, pure: what `GET /v1/forecast` asks (a window, a bucket
//! width, a destination pattern), checked; which destinations to count;
//! and the ledger's per-minute counts summed into the window's buckets.
//!
//! The ledger keeps how many tasks fall due in each minute per destination
//! (kept by triggers as tasks come, change and go), so a forecast reads at
//! most one row per minute and destination, not one per task: a day of a
//! million tasks is 1,440 rows a destination. The price is the grain: the
//! window's ends are whole minutes (`from` rounded down, `to` up) and a
//! bucket is a whole number of minutes. The instant is an argument.

use serde::{Deserialize, Serialize};

use crate::auth::DestinationPattern;
use crate::clock::parse_epoch_ms;

/// The grain of the ledger's counts.
pub const MINUTE_MS: u64 = 60_000;
/// Most buckets one forecast answers (a week of minutes).
pub const MAX_BUCKETS: u64 = 10_080;
/// Widest window (a year and a day).
pub const MAX_SPAN_MS: u64 = 366 * 24 * 3_600_000;
/// Buckets in a window whose `to` is not given.
pub const DEFAULT_BUCKETS: u64 = 60;

/// The query string of `GET /v1/forecast`, as received.
#[derive(Clone, Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ForecastQuery {
    /// Start (RFC 3339), rounded down to the minute; default now.
    pub from: Option<String>,
    /// End (RFC 3339), rounded up to the minute; default 60 buckets on.
    pub to: Option<String>,
    /// Width of a bucket, written as a delay is (`1m`, `15m`, `1h`, `1d`):
    /// whole minutes; default `1m`.
    pub bucket: Option<String>,
    /// Only destinations this topic pattern matches (`*` one word, `#` any).
    pub destination: Option<String>,
}

/// A forecast's window: whole minutes, cut into buckets from `from_ms` on
/// (the last one ends at `to_ms`, so it may be shorter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub from_ms: u64,
    pub to_ms: u64,
    pub bucket_ms: u64,
}

/// A query the forecast cannot answer, with the parameter at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ForecastError {
    pub field: &'static str,
    pub reason: String,
}

fn refuse(field: &'static str, reason: impl Into<String>) -> ForecastError {
    ForecastError {
        field,
        reason: reason.into(),
    }
}

impl ForecastQuery {
    /// The window and the pattern this query asks for, at `now_ms`.
    pub fn check(
        &self,
        now_ms: u64,
    ) -> Result<(Window, Option<DestinationPattern>), ForecastError> {
        let bucket_ms = match self.bucket.as_deref() {
            None => MINUTE_MS,
            Some(text) => bucket_width(text)?,
        };
        let from_ms = match self.from.as_deref() {
            None => now_ms,
            Some(text) => instant("from", text)?,
        };
        let from_ms = from_ms - from_ms % MINUTE_MS;
        let to_ms = match self.to.as_deref() {
            None => from_ms.saturating_add(bucket_ms.saturating_mul(DEFAULT_BUCKETS)),
            Some(text) => round_up(instant("to", text)?),
        };
        if to_ms <= from_ms {
            return Err(refuse("to", "must be after from (by a minute at least)"));
        }
        if to_ms - from_ms > MAX_SPAN_MS {
            return Err(refuse("to", "the window may span 366 days at most"));
        }
        let window = Window {
            from_ms,
            to_ms,
            bucket_ms,
        };
        if window.buckets() > MAX_BUCKETS {
            return Err(refuse(
                "bucket",
                format!("the window holds more than {MAX_BUCKETS} buckets; widen them"),
            ));
        }
        let pattern = match self.destination.as_deref() {
            None => None,
            Some(text) => Some(
                DestinationPattern::parse(text)
                    .map_err(|e| refuse("destination", e.to_string()))?,
            ),
        };
        Ok((window, pattern))
    }
}

fn bucket_width(text: &str) -> Result<u64, ForecastError> {
    let width = humantime::parse_duration(text)
        .map_err(|e| refuse("bucket", format!("{text:?} is not a duration: {e}")))?;
    let width_ms = u64::try_from(width.as_millis()).unwrap_or(u64::MAX);
    if width_ms == 0 || width_ms % MINUTE_MS != 0 {
        return Err(refuse(
            "bucket",
            format!("{text:?} is not a whole number of minutes"),
        ));
    }
    if width_ms > MAX_SPAN_MS {
        return Err(refuse("bucket", "a bucket spans 366 days at most"));
    }
    Ok(width_ms)
}

fn instant(field: &'static str, text: &str) -> Result<u64, ForecastError> {
    parse_epoch_ms(text).ok_or_else(|| refuse(field, format!("{text:?} is not an RFC 3339 time")))
}

fn round_up(ms: u64) -> u64 {
    ms.div_ceil(MINUTE_MS).saturating_mul(MINUTE_MS)
}

impl Window {
    pub fn buckets(&self) -> u64 {
        (self.to_ms - self.from_ms).div_ceil(self.bucket_ms)
    }

    /// Where each bucket starts.
    pub fn starts(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.buckets()).map(|i| self.from_ms + i * self.bucket_ms)
    }
}

/// Tasks due in the minute starting at `minute_ms`, as the ledger counts
/// them (summed over the destinations asked for; a minute may come in
/// several rows, which add up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MinuteCount {
    pub minute_ms: u64,
    pub tasks: i64,
}

/// What falls due in each bucket of a window, and the total.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub buckets: Vec<u64>,
    pub total: u64,
}

/// Sums `counts` into `window`'s buckets; a minute outside it counts in none.
pub fn tally(window: &Window, counts: impl IntoIterator<Item = MinuteCount>) -> Tally {
    let mut sums = vec![0_i64; usize::try_from(window.buckets()).unwrap_or(0)];
    for count in counts {
        if count.minute_ms < window.from_ms || count.minute_ms >= window.to_ms {
            continue;
        }
        let index = usize::try_from((count.minute_ms - window.from_ms) / window.bucket_ms);
        if let Some(sum) = index.ok().and_then(|i| sums.get_mut(i)) {
            *sum += count.tasks;
        }
    }
    let buckets: Vec<u64> = sums
        .into_iter()
        .map(|sum| u64::try_from(sum).unwrap_or(0))
        .collect();
    let total = buckets.iter().sum();
    Tally { buckets, total }
}

/// Which of the destinations with tasks in the window to count: `None`
/// when every one (no need to name them), else those `counted` accepts.
pub fn chosen(destinations: Vec<String>, counted: impl Fn(&str) -> bool) -> Option<Vec<String>> {
    let all = destinations.len();
    let chosen: Vec<String> = destinations.into_iter().filter(|d| counted(d)).collect();
    (chosen.len() < all).then_some(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: u64 = 1_800_000_000_000 + 12_345;

    fn query(from: Option<&str>, to: Option<&str>, bucket: Option<&str>) -> ForecastQuery {
        ForecastQuery {
            from: from.map(str::to_owned),
            to: to.map(str::to_owned),
            bucket: bucket.map(str::to_owned),
            destination: None,
        }
    }

    #[test]
    fn a_window_is_whole_minutes_from_now_by_default() {
        let (window, pattern) = query(None, None, None).check(NOW).unwrap();
        assert_eq!(window.from_ms, NOW - NOW % MINUTE_MS);
        assert_eq!(window.bucket_ms, MINUTE_MS);
        assert_eq!(window.buckets(), DEFAULT_BUCKETS);
        assert!(pattern.is_none());
        let (window, _) = query(
            Some("2026-11-26T10:00:30Z"),
            Some("2026-11-27T10:00:01Z"),
            Some("1h"),
        )
        .check(NOW)
        .unwrap();
        assert_eq!(window.to_ms - window.from_ms, 24 * 3_600_000 + MINUTE_MS);
        assert_eq!(window.buckets(), 25);
        assert_eq!(
            window.starts().last(),
            Some(window.from_ms + 24 * 3_600_000)
        );
    }

    #[test]
    fn every_refusal_names_its_parameter() {
        let cases = [
            (query(Some("yesterday"), None, None), "from"),
            (query(None, Some("2026-13-01T00:00:00Z"), None), "to"),
            (query(None, None, Some("90s")), "bucket"),
            (query(None, None, Some("0m")), "bucket"),
            (query(None, None, Some("soon")), "bucket"),
            (
                query(
                    Some("2026-11-26T10:00:00Z"),
                    Some("2026-11-26T10:00:00Z"),
                    None,
                ),
                "to",
            ),
            (
                query(
                    Some("2026-11-26T10:00:00Z"),
                    Some("2026-11-26T09:00:00Z"),
                    None,
                ),
                "to",
            ),
            (
                query(
                    Some("2026-01-01T00:00:00Z"),
                    Some("2028-01-01T00:00:00Z"),
                    Some("1d"),
                ),
                "to",
            ),
            (
                query(
                    Some("2026-01-01T00:00:00Z"),
                    Some("2026-02-01T00:00:00Z"),
                    None,
                ),
                "bucket",
            ),
            (
                ForecastQuery {
                    destination: Some("a..b".to_owned()),
                    ..ForecastQuery::default()
                },
                "destination",
            ),
        ];
        for (query, field) in cases {
            let error = query.check(NOW).unwrap_err();
            assert_eq!(error.field, field, "{query:?}: {error}");
        }
    }

    #[test]
    fn only_the_destinations_counted_are_named_and_none_when_all_are() {
        let all = vec!["a.x".to_owned(), "b.x".to_owned()];
        assert_eq!(chosen(all.clone(), |_| true), None);
        assert_eq!(
            chosen(all.clone(), |d| d.starts_with('a')),
            Some(vec!["a.x".to_owned()])
        );
        assert_eq!(chosen(all, |_| false), Some(Vec::new()));
    }

    fn counts() -> impl Strategy<Value = Vec<(u64, i64)>> {
        prop::collection::vec((0_u64..200, 1_i64..50), 0..60)
    }

    proptest! {
        /// Each count lands in the bucket its minute falls in, counts
        /// outside the window in none, and the total is the buckets' sum.
        #[test]
        fn the_buckets_hold_exactly_the_counts_of_their_minutes(
            counts in counts(),
            first in 0_u64..100,
            minutes in 1_u64..150,
            width in 1_u64..30,
        ) {
            let window = Window {
                from_ms: first * MINUTE_MS,
                to_ms: (first + minutes) * MINUTE_MS,
                bucket_ms: width * MINUTE_MS,
            };
            let due: Vec<MinuteCount> = counts.iter().map(|&(minute, tasks)| MinuteCount {
                minute_ms: minute * MINUTE_MS,
                tasks,
            }).collect();
            let tally = tally(&window, due);
            prop_assert_eq!(tally.buckets.len() as u64, minutes.div_ceil(width));
            prop_assert_eq!(tally.total, tally.buckets.iter().sum::<u64>());
            for (i, start) in window.starts().enumerate() {
                let end = (start + window.bucket_ms).min(window.to_ms);
                let expected: i64 = counts.iter()
                    .filter(|(minute, _)| (start..end).contains(&(minute * MINUTE_MS)))
                    .map(|(_, tasks)| tasks)
                    .sum();
                prop_assert_eq!(tally.buckets[i] as i64, expected);
            }
        }

        /// A change not yet folded in (a −1 beside its +1) cancels out.
        #[test]
        fn unfolded_changes_cancel_out(minute in 0_u64..60, tasks in 1_i64..9) {
            let window = Window { from_ms: 0, to_ms: 60 * MINUTE_MS, bucket_ms: MINUTE_MS };
            let count = |tasks| MinuteCount { minute_ms: minute * MINUTE_MS, tasks };
            let tally = tally(&window, [count(tasks), count(-1), count(-(tasks - 1))]);
            prop_assert_eq!(tally.total, 0);
        }
    }
}
