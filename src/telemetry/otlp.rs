//! Sending spans to an OpenTelemetry collector (OTLP over HTTP, protobuf).
//!
//! Whoever sees a phase of a task end hands its span to a [`TaskTracer`];
//! a task of its own sends what gathered, every `trace.export_interval_ms`,
//! as one `ExportTraceServiceRequest` (the `opentelemetry-proto` types,
//! encoded by prost). Spans are made with their own times and ids
//! ([`super::spans`]), so the SDK's live spans and sampler have nothing to
//! add here; its batch processor would add a thread of its own.
//!
//! Spans never hold a task up: a full queue drops the newest (counted in
//! the log), a collector that fails loses that batch (said in the log,
//! once per streak). Off, the handle holds nothing and every call returns
//! at its first check.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::settings::TraceSettings;
use super::spans::SpanRecord;

/// At most this many spans in one request.
const MAX_BATCH: usize = 2_048;

/// Where spans are recorded. Cheap to clone; [`TaskTracer::off`] when no
/// endpoint is configured.
#[derive(Clone, Debug, Default)]
pub struct TaskTracer {
    queue: Option<Arc<Queue>>,
}

#[derive(Debug)]
struct Queue {
    sender: mpsc::Sender<SpanRecord>,
    dropped: AtomicU64,
}

impl TaskTracer {
    /// Records nothing.
    pub fn off() -> TaskTracer {
        TaskTracer::default()
    }

    /// Whether spans are recorded: callers make none when not.
    pub fn is_on(&self) -> bool {
        self.queue.is_some()
    }

    /// Hands `spans` to the sender; drops them when its queue is full.
    pub fn record(&self, spans: impl IntoIterator<Item = SpanRecord>) {
        let Some(queue) = &self.queue else {
            return;
        };
        for span in spans {
            if queue.sender.try_send(span).is_err() {
                queue.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The tracer `settings` describe, and the task sending its spans
    /// until `shutdown` (then it sends what is left, within the export
    /// timeout); off, and no task, without an endpoint.
    pub fn start(
        settings: &TraceSettings,
        shutdown: CancellationToken,
    ) -> (TaskTracer, Option<JoinHandle<()>>) {
        if !settings.enabled() {
            return (TaskTracer::off(), None);
        }
        let (sender, receiver) = mpsc::channel(settings.max_queued);
        let queue = Arc::new(Queue {
            sender,
            dropped: AtomicU64::new(0),
        });
        let exporter = Exporter {
            client: reqwest::Client::new(),
            url: settings.traces_url(),
            resource: resource(&settings.service_name),
            timeout: Duration::from_millis(settings.export_timeout_ms),
            failing: false,
        };
        info!(url = exporter.url, "sending tasks' spans over OTLP");
        let every = Duration::from_millis(settings.export_interval_ms);
        let task = tokio::spawn(exporter.run(receiver, queue.clone(), every, shutdown));
        (TaskTracer { queue: Some(queue) }, Some(task))
    }
}

struct Exporter {
    client: reqwest::Client,
    url: String,
    resource: Resource,
    timeout: Duration,
    /// The last export failed: the next failure is not logged again.
    failing: bool,
}

impl Exporter {
    async fn run(
        mut self,
        mut receiver: mpsc::Receiver<SpanRecord>,
        queue: Arc<Queue>,
        every: Duration,
        shutdown: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut batch = Vec::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            while let Ok(span) = receiver.try_recv() {
                batch.push(span);
            }
            self.send_all(&mut batch, &queue).await;
        }
        while let Ok(span) = receiver.try_recv() {
            batch.push(span);
        }
        self.send_all(&mut batch, &queue).await;
    }

    /// Sends `batch` in requests of at most [`MAX_BATCH`] spans.
    async fn send_all(&mut self, batch: &mut Vec<SpanRecord>, queue: &Queue) {
        let dropped = queue.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            warn!(
                dropped,
                "spans dropped: more were made than trace.max_queued holds"
            );
        }
        for chunk in batch.chunks(MAX_BATCH) {
            self.send(chunk).await;
        }
        batch.clear();
    }

    async fn send(&mut self, spans: &[SpanRecord]) {
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "delayline".to_owned(),
                        version: env!("CARGO_PKG_VERSION").to_owned(),
                        ..Default::default()
                    }),
                    spans: spans.iter().map(proto_span).collect(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        let sent = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
            .timeout(self.timeout)
            .body(request.encode_to_vec())
            .send()
            .await
            .and_then(reqwest::Response::error_for_status);
        match sent {
            Ok(_) if self.failing => {
                self.failing = false;
                info!(url = self.url, "the OTLP collector takes spans again");
            }
            Ok(_) => {}
            Err(error) => {
                if !self.failing {
                    warn!(url = self.url, %error, spans = spans.len(), "spans not sent to the OTLP collector; they are lost (said once until it takes them again)");
                }
                self.failing = true;
            }
        }
    }
}

fn resource(service_name: &str) -> Resource {
    Resource {
        attributes: vec![text("service.name", service_name)],
        ..Default::default()
    }
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
    }
}

fn proto_span(record: &SpanRecord) -> Span {
    let nanos = |ms: u64| ms.saturating_mul(1_000_000);
    Span {
        trace_id: record.trace_id.to_vec(),
        span_id: record.span_id.to_vec(),
        parent_span_id: record.parent_id.to_vec(),
        name: record.phase.name().to_owned(),
        kind: span::SpanKind::Internal as i32,
        start_time_unix_nano: nanos(record.start_ms),
        end_time_unix_nano: nanos(record.end_ms),
        attributes: record
            .attributes
            .iter()
            .map(|(key, value)| text(key, value))
            .collect(),
        // Sampled: the producer's flag was, or it would not have been made.
        flags: 0x01,
        ..Default::default()
    }
}
