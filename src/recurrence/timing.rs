//! When a schedule fires: a cron expression in an IANA time zone, or a
//! fixed interval, between an optional start and end.
//!
//! The cron grammar and its daylight-saving rules are `croner`'s (five
//! fields, or six with seconds; ranges, steps, names, `L`, `#`, `W`); time
//! zones are `jiff`'s, with the IANA database compiled into the binary, so
//! that an occurrence does not depend on the host's zone files. Times are
//! epoch milliseconds; nothing here reads a clock.

use croner::Cron;
use croner::parser::{CronParser, Seconds};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize};

use super::ScheduleError;

/// What happens to occurrences that fell due while no replica was running
/// (more than [`super::MISSED_AFTER_MS`] before the planner reached them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// They are counted as missed and not delivered.
    #[default]
    Skip,
    /// The most recent of them is delivered once, at once; the others are
    /// counted as missed.
    Latest,
}

/// A schedule's timing as stored and shown: what the client gave, and the
/// anchor of an interval.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimingSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    pub timezone: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
    #[serde(default)]
    pub catch_up: CatchUp,
    /// An interval's first occurrence: `start_at`, or one interval after the
    /// timing was set. Occurrences are this plus whole intervals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor_ms: Option<u64>,
}

impl TimingSpec {
    /// The same timing as the client would state it (the anchor aside).
    pub fn same_request_as(&self, other: &TimingSpec) -> bool {
        let strip = |t: &TimingSpec| TimingSpec {
            anchor_ms: None,
            ..t.clone()
        };
        strip(self) == strip(other)
    }
}

/// A timing, compiled: ready to answer "when next".
#[derive(Clone, Debug)]
pub struct Timing {
    when: When,
    zone: TimeZone,
    start_ms: Option<u64>,
    end_ms: Option<u64>,
    pub catch_up: CatchUp,
}

#[derive(Clone, Debug)]
enum When {
    Cron(Box<Cron>),
    Every { every_ms: u64, anchor_ms: u64 },
}

/// The most missed occurrences counted one by one; beyond it the count says
/// "at least this many" (a cron schedule down for months).
const COUNT_CAP: u64 = 100_000;

impl Timing {
    /// Checks and compiles `spec`. `unit_ms` is the chain's unit: an
    /// interval below it could not be delivered apart.
    pub fn compile(spec: &TimingSpec, unit_ms: u64) -> Result<Timing, ScheduleError> {
        let zone = TimeZone::get(&spec.timezone).map_err(|_| {
            ScheduleError::invalid(
                "/timezone",
                format!(
                    "{:?} is not an IANA time zone such as \"Europe/Berlin\" or \"UTC\"",
                    spec.timezone
                ),
            )
        })?;
        let start_ms = parse_time(spec.start_at.as_deref(), "/start_at")?;
        let end_ms = parse_time(spec.end_at.as_deref(), "/end_at")?;
        if let (Some(start), Some(end)) = (start_ms, end_ms)
            && end <= start
        {
            return Err(ScheduleError::invalid(
                "/end_at",
                "must be after start_at".to_owned(),
            ));
        }
        let when = match (&spec.cron, &spec.every) {
            (Some(expression), None) => When::Cron(Box::new(parse_cron(expression)?)),
            (None, Some(every)) => {
                let every_ms = parse_every(every, unit_ms)?;
                let anchor_ms = spec.anchor_ms.or(start_ms).ok_or_else(|| {
                    ScheduleError::invalid("/every", "an interval needs an anchor".to_owned())
                })?;
                When::Every {
                    every_ms,
                    anchor_ms,
                }
            }
            _ => {
                return Err(ScheduleError::invalid(
                    "/cron",
                    "give exactly one of cron (\"0 9 * * MON-FRI\") and every (\"15m\")".to_owned(),
                ));
            }
        };
        Ok(Timing {
            when,
            zone,
            start_ms,
            end_ms,
            catch_up: spec.catch_up,
        })
    }

    /// The first occurrence strictly after `after_ms`, within start and end.
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        let next = match &self.when {
            When::Every {
                every_ms,
                anchor_ms,
            } => {
                if after_ms < *anchor_ms {
                    Some(*anchor_ms)
                } else {
                    let steps = (after_ms - anchor_ms) / every_ms + 1;
                    steps
                        .checked_mul(*every_ms)
                        .and_then(|d| anchor_ms.checked_add(d))
                }
            }
            When::Cron(cron) => {
                let from = match self.start_ms {
                    Some(start) if start > after_ms => start - 1,
                    _ => after_ms,
                };
                self.cron_next(cron, from)
            }
        }?;
        (self.end_ms.is_none_or(|end| next <= end)).then_some(next)
    }

    /// The last occurrence at or before `at_ms`, within start and end.
    pub fn last_at_or_before(&self, at_ms: u64) -> Option<u64> {
        let at_ms = self.end_ms.map_or(at_ms, |end| at_ms.min(end));
        let last = match &self.when {
            When::Every {
                every_ms,
                anchor_ms,
            } => {
                (at_ms >= *anchor_ms).then(|| anchor_ms + (at_ms - anchor_ms) / every_ms * every_ms)
            }
            When::Cron(cron) => {
                let floor = zoned(at_ms - at_ms % 1000, &self.zone)?;
                let previous = cron.find_previous_occurrence(&floor, true).ok()?;
                epoch_ms(previous.timestamp())
            }
        }?;
        (self.start_ms.is_none_or(|start| last >= start)).then_some(last)
    }

    /// How many occurrences lie in `from_ms..=to_ms`, both occurrences;
    /// at most [`COUNT_CAP`].
    pub fn count_from_to(&self, from_ms: u64, to_ms: u64) -> u64 {
        if to_ms < from_ms {
            return 0;
        }
        if let When::Every { every_ms, .. } = &self.when {
            return ((to_ms - from_ms) / every_ms + 1).min(COUNT_CAP);
        }
        let mut count = 1;
        let mut at = from_ms;
        while count < COUNT_CAP {
            match self.next_after(at) {
                Some(next) if next <= to_ms => {
                    count += 1;
                    at = next;
                }
                _ => break,
            }
        }
        count
    }

    /// Up to `n` occurrences after `after_ms`.
    pub fn upcoming(&self, after_ms: u64, n: usize) -> Vec<u64> {
        let mut times = Vec::with_capacity(n);
        let mut at = after_ms;
        while times.len() < n {
            let Some(next) = self.next_after(at) else {
                break;
            };
            times.push(next);
            at = next;
        }
        times
    }

    /// A cron occurrence strictly after `after_ms`. Cron times are whole
    /// seconds, so the search starts at the second `after_ms` is in: the
    /// next whole second after that is after `after_ms` too.
    fn cron_next(&self, cron: &Cron, after_ms: u64) -> Option<u64> {
        let floor = zoned(after_ms - after_ms % 1000, &self.zone)?;
        let next = cron.find_next_occurrence(&floor, false).ok()?;
        epoch_ms(next.timestamp())
    }
}

fn zoned(ms: u64, zone: &TimeZone) -> Option<jiff::Zoned> {
    let ms = i64::try_from(ms).ok()?;
    Some(Timestamp::from_millisecond(ms).ok()?.to_zoned(zone.clone()))
}

fn epoch_ms(at: Timestamp) -> Option<u64> {
    u64::try_from(at.as_millisecond()).ok()
}

/// Five fields, or six with seconds first (an optional seventh, the year, as
/// croner reads it). Day of month and day of week combine as in Vixie cron:
/// either matches.
fn parse_cron(expression: &str) -> Result<Cron, ScheduleError> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(expression)
        .map_err(|e| {
            ScheduleError::invalid(
                "/cron",
                format!("{expression:?} is not a cron expression such as \"0 9 * * MON-FRI\": {e}"),
            )
        })
}

fn parse_every(text: &str, unit_ms: u64) -> Result<u64, ScheduleError> {
    let every = humantime::parse_duration(text).map_err(|e| {
        ScheduleError::invalid(
            "/every",
            format!("{text:?} is not a duration such as \"15m\" or \"1h30m\": {e}"),
        )
    })?;
    let every_ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
    if every_ms < unit_ms || every.subsec_nanos() % 1_000_000 != 0 {
        return Err(ScheduleError::invalid(
            "/every",
            format!(
                "{text:?} is below the chain's unit ({unit_ms} ms) or not whole milliseconds: \
                 occurrences would not be delivered apart"
            ),
        ));
    }
    Ok(every_ms)
}

fn parse_time(text: Option<&str>, field: &'static str) -> Result<Option<u64>, ScheduleError> {
    let Some(text) = text else {
        return Ok(None);
    };
    crate::clock::parse_epoch_ms(text).map(Some).ok_or_else(|| {
        ScheduleError::invalid(
            field,
            format!("{text:?} is not an RFC 3339 time such as \"2026-01-02T15:04:05Z\""),
        )
    })
}
