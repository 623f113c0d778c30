//! The telemetry sections: `[log]` (how delayline logs) and `[trace]`
//! (where it sends its spans, if anywhere).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    pub format: LogFormat,
    /// A tracing env-filter directive; `RUST_LOG` takes precedence when set. lapin is
    /// silenced by default: it logs every channel the broker closes, even expected ones,
    /// and delayline reports the connection problems that matter itself.
    pub filter: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            filter: "info,lapin=off".to_owned(),
        }
    }
}

/// `[trace]`: the OTLP endpoint delayline sends its tasks' spans to. Off
/// (no endpoint) by default, and then nothing is made: the only cost is a
/// check that the endpoint is not set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TraceSettings {
    /// The collector's OTLP/HTTP address (`http://collector:4318`, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` gives it): spans go to its
    /// `/v1/traces`, encoded as protobuf, over plain HTTP. Empty: no spans.
    pub otlp_endpoint: String,
    /// The `service.name` the spans carry.
    pub service_name: String,
    /// How often the spans made since are sent, at most.
    pub export_interval_ms: u64,
    /// Spans waiting to be sent, at most: past it new ones are dropped
    /// (and counted) rather than held in memory while a collector is away.
    pub max_queued: usize,
    /// How long one export may take before it is given up (its spans lost).
    pub export_timeout_ms: u64,
}

impl Default for TraceSettings {
    fn default() -> Self {
        TraceSettings {
            otlp_endpoint: String::new(),
            service_name: "delayline".to_owned(),
            export_interval_ms: 1_000,
            max_queued: 10_000,
            export_timeout_ms: 5_000,
        }
    }
}

impl TraceSettings {
    pub fn enabled(&self) -> bool {
        !self.otlp_endpoint.trim().is_empty()
    }

    /// Where spans are posted: the endpoint's `/v1/traces`.
    pub fn traces_url(&self) -> String {
        let base = self.otlp_endpoint.trim().trim_end_matches('/');
        if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if !self.enabled() {
            return Ok(());
        }
        // Plain HTTP only: the spans' client trusts no certificate
        // authority, so an https:// collector would refuse every export.
        let url = self.otlp_endpoint.trim();
        if !url.starts_with("http://") {
            return Err(format!(
                "trace.otlp_endpoint must be an http:// address (OTLP over plain HTTP, to a \
                 collector or agent beside delayline), got {url:?}"
            ));
        }
        if self.export_interval_ms == 0 || self.export_timeout_ms == 0 || self.max_queued == 0 {
            return Err(
                "trace.export_interval_ms, trace.export_timeout_ms and trace.max_queued must be \
                 above 0"
                    .to_owned(),
            );
        }
        if self.service_name.trim().is_empty() {
            return Err("trace.service_name must not be empty".to_owned());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_go_to_the_endpoints_traces_path_and_bad_settings_are_named() {
        let mut trace = TraceSettings::default();
        assert!(!trace.enabled());
        assert_eq!(trace.validate(), Ok(()));
        trace.otlp_endpoint = "http://collector:4318/".to_owned();
        assert_eq!(trace.traces_url(), "http://collector:4318/v1/traces");
        trace.otlp_endpoint = "http://collector:4318/v1/traces".to_owned();
        assert_eq!(trace.traces_url(), "http://collector:4318/v1/traces");
        assert_eq!(trace.validate(), Ok(()));
        for refused in ["collector:4317", "https://collector:4318"] {
            trace.otlp_endpoint = refused.to_owned();
            let error = trace.validate().unwrap_err();
            assert!(error.contains("trace.otlp_endpoint"), "{error}");
        }
        trace.otlp_endpoint = "http://c:4318".to_owned();
        trace.max_queued = 0;
        assert!(trace.validate().unwrap_err().contains("trace.max_queued"));
    }
}
