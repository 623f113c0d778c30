//! W3C Trace Context (`traceparent`, `tracestate`): what a producer's
//! request says of its trace, carried as the delivered message's headers of
//! the same names, unchanged, so that its consumer continues the trace. Pure.
//!
//! Over AMQP (an ingress, a retry) the headers travel with the message as
//! every header does; over HTTP they are request headers, which
//! [`carried`] turns into the task's. A `traceparent` that is not one is
//! dropped (the specification: a receiver that cannot parse it starts a
//! new trace), and `tracestate` only travels with a valid `traceparent`.

use super::headers::{TRACEPARENT_HEADER, TRACESTATE_HEADER};
use super::value::FieldValue;

/// `version-traceid-parentid-flags` (the rules are
/// [`crate::telemetry::TraceContext::parse`]'s, which reads it for spans).
pub fn is_traceparent(text: &str) -> bool {
    crate::telemetry::TraceContext::parse(text).is_some()
}

/// The headers a request's trace context gives its task, but those the
/// task names itself (its own win): none without a valid `traceparent`.
pub fn carried(
    traceparent: Option<&str>,
    tracestate: Option<&str>,
    own: &[(String, FieldValue)],
) -> Vec<(String, FieldValue)> {
    let Some(traceparent) = traceparent.map(str::trim).filter(|t| is_traceparent(t)) else {
        return Vec::new();
    };
    let named = |name: &str| own.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    let mut headers = Vec::new();
    if !named(TRACEPARENT_HEADER) {
        headers.push((
            TRACEPARENT_HEADER.to_owned(),
            FieldValue::Str(traceparent.to_owned()),
        ));
        let state = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= 512);
        if let Some(state) = state.filter(|_| !named(TRACESTATE_HEADER)) {
            headers.push((
                TRACESTATE_HEADER.to_owned(),
                FieldValue::Str(state.to_owned()),
            ));
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_carried_with_its_tracestate_unless_the_task_names_its_own() {
        let carried_here = carried(Some(VALID), Some("congo=t61rcWkgMzE"), &[]);
        assert_eq!(
            carried_here,
            [
                ("traceparent".to_owned(), FieldValue::Str(VALID.into())),
                (
                    "tracestate".to_owned(),
                    FieldValue::Str("congo=t61rcWkgMzE".into())
                ),
            ]
        );
        let own = [("traceparent".to_owned(), FieldValue::Str("mine".into()))];
        assert!(carried(Some(VALID), Some("a=b"), &own).is_empty());
        assert!(
            carried(None, Some("a=b"), &[]).is_empty(),
            "no tracestate alone"
        );
        // Which traceparents are valid is the parser's to say, and its
        // tests' (`crate::telemetry::spans`); here, one that is not is not
        // carried.
        let bad = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
        assert!(carried(Some(bad), Some("a=b"), &[]).is_empty());
    }

    proptest! {
        /// Whatever the request says, what is carried is a valid
        /// traceparent (and a tracestate only beside one), never a header
        /// the task named itself.
        #[test]
        fn only_a_valid_traceparent_is_carried(parent in ".{0,80}", state in prop::option::of(".{0,40}")) {
            let headers = carried(Some(&parent), state.as_deref(), &[]);
            match headers.first() {
                None => prop_assert!(!is_traceparent(parent.trim())),
                Some((name, FieldValue::Str(value))) => {
                    prop_assert_eq!(name.as_str(), "traceparent");
                    prop_assert!(is_traceparent(value));
                }
                Some(other) => prop_assert!(false, "{other:?}"),
            }
        }
    }
}
