//! Release limits, pure: a limit as a client states it, validated; its token
//! bucket; whether it holds its destinations now, and why; and which waiting
//! tasks one pass of the limiter lets go.
//!
//! A limit names destinations by a topic pattern (as tokens do) and may
//! pace them (`rate_per_sec`, with a `burst`), pause them (for good, or
//! until a time), and hold them while a consumer queue has more ready
//! messages than a bound. A task whose destination several limits match
//! obeys all of them. The instant is always an argument.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::auth::DestinationPattern;
use crate::clock::{format_epoch_ms, parse_epoch_ms};

/// Longest limit name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// The limiter makes at most this many passes a second: a burst below
/// `rate_per_sec / PASSES_PER_SEC` could not reach the rate.
pub const PASSES_PER_SEC: f64 = 100.0;
/// Fastest rate a limit may set.
pub const MAX_RATE: f64 = 100_000.0;

/// `PUT /v1/limits/{name}`'s body, as received.
#[derive(Clone, Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"destinations": "billing.#", "rate_per_sec": 200, "burst": 50}))]
pub struct LimitRequest {
    /// A topic pattern over destinations, as tokens' `destinations`
    /// (`*` one word, `#` any number).
    pub destinations: String,
    /// Tasks released per second over every replica; fractional allowed
    /// (0.5 is one every 2 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_sec: Option<f64>,
    /// Tasks that may go at once after a quiet spell; default a tenth of a
    /// second's worth (at least 1), and at least `rate_per_sec / 100`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// Hold every matching task until resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Hold every matching task until then (RFC 3339, in the future).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_until: Option<String>,
    /// Keep this queue at no more than `messages` ready messages: release
    /// only into the room below the bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queue_depth: Option<DepthBound>,
}

/// A bound on a consumer queue's ready messages.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DepthBound {
    pub queue: String,
    pub messages: u64,
}

/// A pace: `per_sec` tasks a second, `burst` at once at most.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub per_sec: f64,
    pub burst: u64,
}

/// A valid limit.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    pub name: String,
    pub destinations: DestinationPattern,
    pub rate: Option<Rate>,
    pub paused: bool,
    pub paused_until_ms: Option<u64>,
    pub depth: Option<DepthBound>,
}

/// Why a request does not make a limit: the field, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct LimitError {
    /// The JSON pointer of the body's field at fault, as the API's other
    /// errors say it, or `name` for the limit's name in the path.
    pub field: &'static str,
    pub reason: String,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> LimitError {
    LimitError {
        field,
        reason: reason.into(),
    }
}

/// A limit's name: 1 to [`MAX_NAME_BYTES`] bytes of `[A-Za-z0-9_.-]`.
pub fn check_name(name: &str) -> Result<(), LimitError> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(invalid(
            "name",
            format!("must be 1 to {MAX_NAME_BYTES} bytes"),
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(invalid(
            "name",
            "may hold only A-Z, a-z, 0-9, '_', '-', '.'",
        ));
    }
    Ok(())
}

impl LimitRequest {
    /// The limit this request states, as of `now_ms`.
    pub fn validate(&self, name: &str, now_ms: u64) -> Result<Limit, LimitError> {
        check_name(name)?;
        let destinations = DestinationPattern::parse(&self.destinations)
            .map_err(|e| invalid("/destinations", e.reason))?;
        let rate = self.rate()?;
        let paused_until_ms = match &self.paused_until {
            None => None,
            Some(text) => {
                let at = parse_epoch_ms(text)
                    .ok_or_else(|| invalid("/paused_until", "must be an RFC 3339 time"))?;
                if at <= now_ms {
                    return Err(invalid(
                        "/paused_until",
                        format!(
                            "{text} is not in the future (now is {})",
                            format_epoch_ms(now_ms)
                        ),
                    ));
                }
                Some(at)
            }
        };
        if let Some(bound) = &self.max_queue_depth
            && (bound.queue.is_empty() || bound.queue.len() > 255)
        {
            return Err(invalid("/max_queue_depth/queue", "must be 1 to 255 bytes"));
        }
        Ok(Limit {
            name: name.to_owned(),
            destinations,
            rate,
            paused: self.paused.unwrap_or(false),
            paused_until_ms,
            depth: self.max_queue_depth.clone(),
        })
    }

    fn rate(&self) -> Result<Option<Rate>, LimitError> {
        let Some(per_sec) = self.rate_per_sec else {
            return match self.burst {
                Some(_) => Err(invalid("/burst", "needs rate_per_sec")),
                None => Ok(None),
            };
        };
        if !(per_sec.is_finite() && per_sec > 0.0 && per_sec <= MAX_RATE) {
            return Err(invalid(
                "/rate_per_sec",
                format!("must be above 0 and at most {MAX_RATE}"),
            ));
        }
        let least = (per_sec / PASSES_PER_SEC).ceil().max(1.0) as u64;
        let burst = self
            .burst
            .unwrap_or_else(|| (per_sec / 10.0).ceil().max(1.0) as u64);
        if burst < least {
            return Err(invalid(
                "/burst",
                format!(
                    "must be at least {least} at {per_sec}/s: the limiter releases in at most \
                     {PASSES_PER_SEC} passes a second"
                ),
            ));
        }
        if burst > 1_000_000 {
            return Err(invalid("/burst", "must be at most 1000000"));
        }
        Ok(Some(Rate { per_sec, burst }))
    }
}

impl Limit {
    /// The request that states this limit (what `GET` answers).
    pub fn request(&self) -> LimitRequest {
        LimitRequest {
            destinations: self.destinations.as_str().to_owned(),
            rate_per_sec: self.rate.map(|r| r.per_sec),
            burst: self.rate.map(|r| r.burst),
            paused: Some(self.paused),
            paused_until: self.paused_until_ms.map(format_epoch_ms),
            max_queue_depth: self.depth.clone(),
        }
    }

    pub fn matches(&self, destination: &str) -> bool {
        self.destinations.matches(destination)
    }

    /// Why the limit holds every task it matches at `now_ms`, rate aside;
    /// `depth` is the bound queue's ready messages as last read (`None`:
    /// not read yet, or the queue is missing).
    pub fn closed(&self, now_ms: u64, depth: Option<Depth>) -> Option<Hold> {
        if self.paused {
            return Some(Hold::Paused);
        }
        if let Some(until) = self.paused_until_ms.filter(|&until| until > now_ms) {
            return Some(Hold::PausedUntil(until));
        }
        let bound = self.depth.as_ref()?;
        match depth {
            // At the bound there is no room: what goes must fit below it.
            Some(Depth::Ready(ready)) if ready < bound.messages => None,
            Some(Depth::Ready(ready)) => Some(Hold::QueueDepth {
                queue: bound.queue.clone(),
                ready,
                bound: bound.messages,
            }),
            Some(Depth::Missing) => Some(Hold::QueueMissing(bound.queue.clone())),
            None => Some(Hold::DepthUnknown(bound.queue.clone())),
        }
    }
}

/// A queue's depth as the limiter last read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    Ready(u64),
    Missing,
}

/// Why a limit holds tasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    Paused,
    PausedUntil(u64),
    QueueDepth {
        queue: String,
        ready: u64,
        bound: u64,
    },
    QueueMissing(String),
    DepthUnknown(String),
    /// Tasks wait for the rate: no token left.
    Rate,
}

impl Hold {
    /// A stable word for the reason, as the API and the metrics name it.
    pub fn code(&self) -> &'static str {
        match self {
            Hold::Paused => "paused",
            Hold::PausedUntil(_) => "paused_until",
            Hold::QueueDepth { .. } => "queue_depth",
            Hold::QueueMissing(_) => "queue_missing",
            Hold::DepthUnknown(_) => "queue_depth_unknown",
            Hold::Rate => "rate",
        }
    }

    /// In words.
    pub fn describe(&self) -> String {
        match self {
            Hold::Paused => "paused until resumed".to_owned(),
            Hold::PausedUntil(at) => format!("paused until {}", format_epoch_ms(*at)),
            Hold::QueueDepth {
                queue,
                ready,
                bound,
            } => format!(
                "queue {queue:?} has {ready} ready messages, at or above its bound of {bound}"
            ),
            Hold::QueueMissing(queue) => format!("queue {queue:?} does not exist"),
            Hold::DepthUnknown(queue) => format!("queue {queue:?} not read yet"),
            Hold::Rate => "releasing at its rate".to_owned(),
        }
    }
}

/// A limit's token bucket: `tokens` as of `at_ms`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    pub tokens: f64,
    pub at_ms: u64,
}

impl Bucket {
    /// Full, as a new limit starts.
    pub fn full(rate: Rate, now_ms: u64) -> Bucket {
        Bucket {
            tokens: rate.burst as f64,
            at_ms: now_ms,
        }
    }

    /// Refilled at the rate up to `now_ms`, never above the burst. A clock
    /// that went back (another replica's) adds nothing.
    pub fn refill(self, rate: Rate, now_ms: u64) -> Bucket {
        let elapsed_s = now_ms.saturating_sub(self.at_ms) as f64 / 1000.0;
        Bucket {
            tokens: (self.tokens + elapsed_s * rate.per_sec).min(rate.burst as f64),
            at_ms: now_ms.max(self.at_ms),
        }
    }

    /// Whole tasks it allows now.
    pub fn available(&self) -> u64 {
        self.tokens.max(0.0).floor() as u64
    }

    /// When at least `wanted` tokens are there (`wanted` at most the burst).
    pub fn ready_at_ms(&self, rate: Rate, wanted: u64) -> u64 {
        let missing = (wanted.min(rate.burst) as f64 - self.tokens).max(0.0);
        self.at_ms + (missing / rate.per_sec * 1000.0).ceil() as u64
    }
}

/// A waiting task a pass may release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub id: String,
    pub destination: String,
    pub due_ms: u64,
}

/// Which of `waiting` one pass releases, in due order: a task goes only if
/// every limit matching it is open and has a token left (`allowance[i]`
/// for `limits[i]`, `None`: unpaced); a limit out of tokens lets none of
/// its later tasks pass, so each limit releases in due order, while tasks
/// of other limits go on (a limit that would have let a task go does not
/// hold its other tasks back because another limit stopped that one). At most `most` tasks. Returns the ids released
/// and how many tokens each limit gave.
pub fn plan_pass(
    waiting: &[Waiting],
    limits: &[Limit],
    open: &[bool],
    allowance: &[Option<u64>],
    most: usize,
) -> (Vec<String>, Vec<u64>) {
    let mut order: Vec<&Waiting> = waiting.iter().collect();
    order.sort_by(|a, b| (a.due_ms, &a.id).cmp(&(b.due_ms, &b.id)));
    let mut left: Vec<Option<u64>> = allowance.to_vec();
    let mut blocked: Vec<bool> = open.iter().map(|open| !open).collect();
    let mut taken = vec![0u64; limits.len()];
    let mut released = Vec::new();
    for task in order {
        if released.len() >= most {
            break;
        }
        let matching: Vec<usize> = (0..limits.len())
            .filter(|&i| limits[i].matches(&task.destination))
            .collect();
        let passes = matching
            .iter()
            .all(|&i| !blocked[i] && left[i].is_none_or(|n| n > 0));
        if !passes {
            // Later tasks of the limits that stopped it wait behind it; a
            // limit that would have let it go does not hold back its others.
            for &i in &matching {
                if left[i] == Some(0) {
                    blocked[i] = true;
                }
            }
            continue;
        }
        for &i in &matching {
            if let Some(n) = left[i].as_mut() {
                *n -= 1;
            }
            taken[i] += 1;
        }
        released.push(task.id.clone());
    }
    (released, taken)
}

/// Waiting tasks per limit: how many and the oldest due time, from the
/// waiting tasks counted per destination.
pub fn waiting_per_limit(
    limits: &[Limit],
    per_destination: &[(String, u64, u64)],
) -> BTreeMap<String, (u64, Option<u64>)> {
    limits
        .iter()
        .map(|limit| {
            let matched = per_destination
                .iter()
                .filter(|(destination, _, _)| limit.matches(destination));
            let (count, oldest) = matched.fold((0, None), |(count, oldest), (_, n, due)| {
                (count + n, Some(oldest.map_or(*due, |o: u64| o.min(*due))))
            });
            (limit.name.clone(), (count, oldest))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn request(json: serde_json::Value) -> LimitRequest {
        serde_json::from_value(json).unwrap()
    }

    fn limit(name: &str, pattern: &str, rate: Option<(f64, u64)>) -> Limit {
        Limit {
            name: name.to_owned(),
            destinations: DestinationPattern::parse(pattern).unwrap(),
            rate: rate.map(|(per_sec, burst)| Rate { per_sec, burst }),
            paused: false,
            paused_until_ms: None,
            depth: None,
        }
    }

    #[test]
    fn every_bad_field_is_named() {
        let cases = [
            (serde_json::json!({"destinations": "a..b"}), "/destinations"),
            (
                serde_json::json!({"destinations": "a", "rate_per_sec": 0}),
                "/rate_per_sec",
            ),
            (
                serde_json::json!({"destinations": "a", "rate_per_sec": -1}),
                "/rate_per_sec",
            ),
            (
                serde_json::json!({"destinations": "a", "rate_per_sec": 1e9}),
                "/rate_per_sec",
            ),
            (
                serde_json::json!({"destinations": "a", "burst": 5}),
                "/burst",
            ),
            (
                serde_json::json!({"destinations": "a", "rate_per_sec": 5000, "burst": 10}),
                "/burst",
            ),
            (
                serde_json::json!({"destinations": "a", "rate_per_sec": 5, "burst": 0}),
                "/burst",
            ),
            (
                serde_json::json!({"destinations": "a", "paused_until": "yesterday"}),
                "/paused_until",
            ),
            (
                serde_json::json!({"destinations": "a", "paused_until": format_epoch_ms(NOW - 1)}),
                "/paused_until",
            ),
            (
                serde_json::json!({"destinations": "a", "max_queue_depth": {"queue": "", "messages": 1}}),
                "/max_queue_depth/queue",
            ),
        ];
        for (json, field) in cases {
            let error = request(json.clone()).validate("l", NOW).unwrap_err();
            assert_eq!(error.field, field, "{json}");
        }
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        for name in ["", long.as_str(), "a b", "a/b"] {
            let error = request(serde_json::json!({"destinations": "a"}))
                .validate(name, NOW)
                .unwrap_err();
            assert_eq!(error.field, "name");
        }
    }

    #[test]
    fn a_request_states_what_it_was_validated_into() {
        let json = serde_json::json!({"destinations": "billing.#", "rate_per_sec": 0.5,
            "paused_until": format_epoch_ms(NOW + 60_000),
            "max_queue_depth": {"queue": "billing", "messages": 10}});
        let limit = request(json).validate("b", NOW).unwrap();
        assert_eq!(
            limit.rate,
            Some(Rate {
                per_sec: 0.5,
                burst: 1
            })
        );
        let again = limit.request().validate("b", NOW).unwrap();
        assert_eq!(again, limit);
        let paced = request(serde_json::json!({"destinations": "a", "rate_per_sec": 200}))
            .validate("a", NOW)
            .unwrap();
        assert_eq!(paced.rate.unwrap().burst, 20);
    }

    #[test]
    fn a_limit_says_why_it_holds() {
        let mut l = limit("l", "a", None);
        assert_eq!(l.closed(NOW, None), None);
        l.paused_until_ms = Some(NOW + 1);
        assert_eq!(l.closed(NOW, None), Some(Hold::PausedUntil(NOW + 1)));
        assert_eq!(l.closed(NOW + 1, None), None);
        l.depth = Some(DepthBound {
            queue: "q".to_owned(),
            messages: 5,
        });
        assert_eq!(l.closed(NOW + 1, Some(Depth::Ready(4))), None);
        assert_eq!(
            l.closed(NOW + 1, Some(Depth::Ready(5))).map(|h| h.code()),
            Some("queue_depth")
        );
        assert_eq!(
            l.closed(NOW + 1, Some(Depth::Missing)).map(|h| h.code()),
            Some("queue_missing")
        );
        assert_eq!(
            l.closed(NOW + 1, None).map(|h| h.code()),
            Some("queue_depth_unknown")
        );
        l.paused = true;
        assert_eq!(l.closed(NOW + 1, Some(Depth::Ready(0))), Some(Hold::Paused));
    }

    #[test]
    fn a_pass_keeps_due_order_per_limit_and_lets_other_limits_go() {
        let limits = [
            limit("slow", "slow.#", Some((1.0, 1))),
            limit("all", "#", None),
        ];
        let waiting = [
            Waiting {
                id: "s1".into(),
                destination: "slow.a".into(),
                due_ms: 1,
            },
            Waiting {
                id: "f1".into(),
                destination: "fast".into(),
                due_ms: 2,
            },
            Waiting {
                id: "s2".into(),
                destination: "slow.b".into(),
                due_ms: 3,
            },
            Waiting {
                id: "f2".into(),
                destination: "fast".into(),
                due_ms: 4,
            },
        ];
        let (released, taken) = plan_pass(&waiting, &limits, &[true, true], &[Some(1), None], 10);
        assert_eq!(released, ["s1", "f1", "f2"]);
        assert_eq!(taken, [1, 3]);
        // A closed limit lets none of its tasks go, and the others still go.
        let (released, _) = plan_pass(&waiting, &limits[..1], &[false], &[Some(5)], 10);
        assert_eq!(released, ["f1", "f2"]);
    }

    proptest! {
        /// Over any window, a bucket refilled and drawn at random instants
        /// gives at most the burst plus the rate times the window.
        #[test]
        fn a_bucket_never_gives_more_than_burst_plus_rate(
            per_sec in 0.5f64..5000.0,
            burst in 1u64..500,
            steps in prop::collection::vec((0u64..300, 0u64..1000), 1..200),
        ) {
            let rate = Rate { per_sec, burst };
            let mut bucket = Bucket::full(rate, 0);
            let mut now = 0;
            let mut given: Vec<(u64, u64)> = Vec::new();
            for (advance, want) in steps {
                now += advance;
                bucket = bucket.refill(rate, now);
                let take = want.min(bucket.available());
                bucket.tokens -= take as f64;
                given.push((now, take));
            }
            for (i, &(start, _)) in given.iter().enumerate() {
                let mut total = 0;
                for &(at, take) in &given[i..] {
                    total += take;
                    let window_s = (at - start) as f64 / 1000.0;
                    prop_assert!(total as f64 <= burst as f64 + per_sec * window_s + 1e-6);
                }
            }
        }

        /// A pass never takes more than an allowance, and releases the
        /// tasks only one limit matches as a prefix of them in due order.
        #[test]
        fn a_pass_obeys_every_allowance_in_due_order(
            tasks in prop::collection::vec((0usize..4, 0u64..50), 0..60),
            allowance in prop::collection::vec(prop::option::of(0u64..10), 3),
            open in prop::collection::vec(any::<bool>(), 3),
        ) {
            let limits = [
                limit("a", "a.#", Some((1.0, 1))),
                limit("b", "*.b", Some((1.0, 1))),
                limit("c", "c", Some((1.0, 1))),
            ];
            let destinations = ["a.x", "a.b", "x.b", "c"];
            let waiting: Vec<Waiting> = tasks.iter().enumerate().map(|(n, (d, due))| Waiting {
                id: format!("t{n:03}"),
                destination: destinations[*d].to_owned(),
                due_ms: *due,
            }).collect();
            let (released, taken) = plan_pass(&waiting, &limits, &open, &allowance, 1000);
            for (i, limit) in limits.iter().enumerate() {
                let mine: Vec<&Waiting> =
                    waiting.iter().filter(|w| limit.matches(&w.destination)).collect();
                let count = mine.iter().filter(|w| released.contains(&w.id)).count() as u64;
                prop_assert_eq!(count, taken[i]);
                let mut only: Vec<&Waiting> = mine
                    .iter()
                    .copied()
                    .filter(|w| limits.iter().filter(|l| l.matches(&w.destination)).count() == 1)
                    .collect();
                only.sort_by(|x, y| (x.due_ms, &x.id).cmp(&(y.due_ms, &y.id)));
                let gone: Vec<bool> = only.iter().map(|w| released.contains(&w.id)).collect();
                prop_assert!(gone.windows(2).all(|w| w[0] || !w[1]), "not a prefix");
                if let Some(n) = allowance[i] {
                    prop_assert!(count <= n);
                }
                if !open[i] {
                    prop_assert_eq!(count, 0);
                }
            }
        }
    }
}
