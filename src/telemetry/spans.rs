//! A task's spans, pure: where a task spent its time, as spans a tracing
//! tool shows under the producer's own span. Pure: the moments are
//! arguments; [`super::otlp`] sends what is made here.
//!
//! A task's phases last from its request to its delivery, through
//! restarts and replicas, so they are not live spans: each is made, with
//! its start and end, once the phase is over, by whoever saw it end (the
//! replica that accepted the task, the one that released it). Each is a
//! child of the producer's span, in the producer's trace; a task whose
//! producer sent no trace context, or one not sampled, makes none (the
//! producer decided not to trace it). A span's id is derived from the
//! trace, the task, its revision and the phase: a phase made twice (a
//! release repeated after a crash) is the same span, not a second one.

use sha2::{Digest, Sha256};

/// A producer's trace context, read from its W3C `traceparent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    /// The producer's span: every span of the task is its child.
    pub parent_id: [u8; 8],
    /// The producer's sampling decision (flag `01`).
    pub sampled: bool,
}

impl TraceContext {
    /// `version-traceid-parentid-flags`: 2, 32, 16 and 2 lowercase hex
    /// digits; a trace id or parent id of zeros is invalid, and so is
    /// version `ff`. A version after `00` may add fields after the flags.
    pub fn parse(text: &str) -> Option<TraceContext> {
        let parts: Vec<&str> = text.split('-').collect();
        let (version, trace, parent, flags) = match parts.as_slice() {
            [version, trace, parent, flags] => (*version, *trace, *parent, *flags),
            [version, trace, parent, flags, ..] if *version != "00" => {
                (*version, *trace, *parent, *flags)
            }
            _ => return None,
        };
        let [_]: [u8; 1] = hex(version).filter(|_| version != "ff")?;
        let trace_id: [u8; 16] = hex(trace).filter(|id| *id != [0; 16])?;
        let parent_id: [u8; 8] = hex(parent).filter(|id| *id != [0; 8])?;
        let [flags]: [u8; 1] = hex(flags)?;
        Some(TraceContext {
            trace_id,
            parent_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The context of `traceparent` when the producer sampled it: only
    /// then are the task's spans made.
    pub fn sampled(traceparent: Option<&str>) -> Option<TraceContext> {
        traceparent
            .and_then(|text| TraceContext::parse(text.trim()))
            .filter(|context| context.sampled)
    }
}

/// `N` bytes from exactly `2N` lowercase hex digits.
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let lowercase = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    if text.len() != 2 * N || !text.as_bytes().iter().all(lowercase) {
        return None;
    }
    let mut bytes = [0u8; N];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(bytes)
}

/// A phase of a task's life, one span each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// From the request (or the message taken in) to the task's answer.
    Accept,
    /// From the start of its delay to its due time.
    Delay,
    /// From its due time to its release: a release limit held it, or it
    /// came out of the way of delaying late.
    Held,
    /// Its release: published to its destination, until the confirm.
    Deliver,
    /// Its deadline had passed at its release: not delivered.
    Expire,
    /// A retry policy gave up on the message: parked.
    Park,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Accept => "delayline.accept",
            Phase::Delay => "delayline.delay",
            Phase::Held => "delayline.held",
            Phase::Deliver => "delayline.deliver",
            Phase::Expire => "delayline.expire",
            Phase::Park => "delayline.park",
        }
    }
}

/// One finished span, ready to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanRecord {
    pub phase: Phase,
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_id: [u8; 8],
    /// Epoch milliseconds.
    pub start_ms: u64,
    /// Epoch milliseconds, never before the start.
    pub end_ms: u64,
    pub attributes: Vec<(&'static str, String)>,
}

/// The task a span is of, in its producer's trace.
#[derive(Clone, Copy, Debug)]
pub struct TaskRef<'a> {
    pub context: TraceContext,
    pub task_id: &'a str,
    pub revision: u64,
    pub destination: &'a str,
}

/// The span of `task`'s `phase` from `start_ms` to `end_ms` (an end before
/// the start, as clocks of two replicas can give, is taken as the start).
pub fn span(task: &TaskRef<'_>, phase: Phase, start_ms: u64, end_ms: u64) -> SpanRecord {
    SpanRecord {
        phase,
        trace_id: task.context.trace_id,
        span_id: span_id(task, phase),
        parent_id: task.context.parent_id,
        start_ms,
        end_ms: end_ms.max(start_ms),
        attributes: vec![
            ("delayline.task_id", task.task_id.to_owned()),
            ("delayline.revision", task.revision.to_string()),
            ("delayline.destination", task.destination.to_owned()),
        ],
    }
}

impl SpanRecord {
    /// With one more attribute.
    pub fn with(mut self, key: &'static str, value: impl Into<String>) -> SpanRecord {
        self.attributes.push((key, value.into()));
        self
    }
}

/// The same for the same trace, task, revision and phase; never zero.
fn span_id(task: &TaskRef<'_>, phase: Phase) -> [u8; 8] {
    let mut hash = Sha256::new();
    hash.update(task.context.trace_id);
    hash.update(task.task_id.as_bytes());
    hash.update(task.revision.to_be_bytes());
    hash.update(phase.name().as_bytes());
    let digest = hash.finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

/// How a release ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseEnd {
    /// At its destination (`unroutable`: kept in the unroutable queue).
    Delivered { unroutable: bool },
    /// Past its deadline: not delivered.
    Expired,
    /// The publish failed: it is released again.
    Failed,
}

/// A task's release, as the release side saw it.
#[derive(Clone, Copy, Debug)]
pub struct Release<'a> {
    pub task: TaskRef<'a>,
    /// When its delay started (its due time less its delay).
    pub delay_from_ms: u64,
    pub deliver_at_ms: u64,
    /// When the release began, and when its publish ended.
    pub released_ms: u64,
    pub ended_ms: u64,
    /// Released by the limiter: a release limit held it.
    pub by_limit: bool,
    pub end: ReleaseEnd,
}

/// The spans a release closes: its delay, the wait after its due time
/// (when there was one), and its delivery or expiry. A failed publish
/// closes none: the release that succeeds later does.
pub fn release_spans(release: &Release<'_>) -> Vec<SpanRecord> {
    let task = &release.task;
    let mut spans = vec![span(
        task,
        Phase::Delay,
        release.delay_from_ms,
        release.deliver_at_ms,
    )];
    if release.released_ms > release.deliver_at_ms {
        let by = if release.by_limit { "limit" } else { "release" };
        let held = span(
            task,
            Phase::Held,
            release.deliver_at_ms,
            release.released_ms,
        );
        spans.push(held.with("delayline.held_by", by));
    }
    let (phase, outcome) = match release.end {
        ReleaseEnd::Delivered { unroutable: false } => (Phase::Deliver, "delivered"),
        ReleaseEnd::Delivered { unroutable: true } => (Phase::Deliver, "unroutable"),
        ReleaseEnd::Expired => (Phase::Expire, "expired"),
        ReleaseEnd::Failed => return Vec::new(),
    };
    let last = span(task, phase, release.released_ms, release.ended_ms);
    spans.push(last.with("delayline.outcome", outcome));
    spans
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn task(context: TraceContext) -> TaskRef<'static> {
        TaskRef {
            context,
            task_id: "t-1",
            revision: 1,
            destination: "billing",
        }
    }

    #[test]
    fn a_traceparent_gives_its_trace_its_parent_and_its_sampling() {
        let context = TraceContext::parse(VALID).unwrap();
        assert_eq!(context.trace_id[0], 0x4b);
        assert_eq!(
            context.parent_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert!(context.sampled);
        let unsampled = VALID.replace("-01", "-00");
        assert_eq!(TraceContext::sampled(Some(&unsampled)), None);
        assert!(TraceContext::parse(&unsampled).is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad}");
        }
        // A later version may add fields.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
        assert!(TraceContext::parse(later).is_some());
    }

    #[test]
    fn a_release_closes_its_delay_its_wait_and_its_delivery_as_children_of_the_producer() {
        let context = TraceContext::parse(VALID).unwrap();
        let release = Release {
            task: task(context),
            delay_from_ms: 1_000,
            deliver_at_ms: 91_000,
            released_ms: 95_000,
            ended_ms: 95_004,
            by_limit: true,
            end: ReleaseEnd::Delivered { unroutable: false },
        };
        let spans = release_spans(&release);
        let phases: Vec<Phase> = spans.iter().map(|s| s.phase).collect();
        assert_eq!(phases, [Phase::Delay, Phase::Held, Phase::Deliver]);
        let times: Vec<(u64, u64)> = spans.iter().map(|s| (s.start_ms, s.end_ms)).collect();
        assert_eq!(times, [(1_000, 91_000), (91_000, 95_000), (95_000, 95_004)]);
        for span in &spans {
            assert_eq!(
                (span.trace_id, span.parent_id),
                (context.trace_id, context.parent_id)
            );
        }
        assert!(
            spans[1]
                .attributes
                .contains(&("delayline.held_by", "limit".to_owned()))
        );
        // On time: no wait; a failed publish: nothing yet.
        let on_time = Release {
            released_ms: 91_000,
            ..release
        };
        assert_eq!(release_spans(&on_time).len(), 2);
        let failed = Release {
            end: ReleaseEnd::Failed,
            ..release
        };
        assert!(release_spans(&failed).is_empty());
    }

    proptest! {
        #[test]
        fn ids_are_stable_distinct_per_phase_and_never_zero(
            trace in any::<[u8; 16]>(),
            parent in any::<[u8; 8]>(),
            id in "[a-z0-9-]{1,20}",
            revision in 1u64..5,
        ) {
            let context = TraceContext { trace_id: trace, parent_id: parent, sampled: true };
            let task = TaskRef { context, task_id: &id, revision, destination: "d" };
            let phases = [Phase::Accept, Phase::Delay, Phase::Held, Phase::Deliver, Phase::Expire, Phase::Park];
            let ids: Vec<[u8; 8]> = phases.iter().map(|p| span(&task, *p, 1, 2).span_id).collect();
            for (i, a) in ids.iter().enumerate() {
                prop_assert_ne!(*a, [0u8; 8]);
                prop_assert_eq!(*a, span(&task, phases[i], 5, 9).span_id);
                prop_assert!(ids.iter().skip(i + 1).all(|b| b != a));
            }
        }

        #[test]
        fn a_span_never_ends_before_it_starts(start in any::<u64>(), end in any::<u64>()) {
            let context = TraceContext::parse(VALID).unwrap();
            let made = span(&task(context), Phase::Delay, start, end);
            prop_assert!(made.end_ms >= made.start_ms);
        }

        #[test]
        fn parsing_agrees_with_the_format(text in "[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}") {
            let zero_trace = text[3..35].bytes().all(|b| b == b'0');
            let zero_parent = text[36..52].bytes().all(|b| b == b'0');
            let valid = &text[..2] != "ff" && !zero_trace && !zero_parent;
            prop_assert_eq!(TraceContext::parse(&text).is_some(), valid);
        }
    }
}
