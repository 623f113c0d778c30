//! Telemetry: logs, and the spans of a task's life.
//!
//! - `settings`: the `[log]` and `[trace]` sections.
//! - `log`: the global subscriber (text or JSON lines).
//! - `spans`: which spans a task's phases make, with their ids and times,
//!   as children of the producer's trace context (pure).
//! - `otlp`: [`TaskTracer`], the handle the scheduler and the release side
//!   record spans through, and the task that sends them to a collector
//!   over OTLP/HTTP. Off, it is nothing but an empty handle.

mod log;
mod otlp;
mod settings;
pub(crate) mod spans;

pub(crate) use log::init;
pub(crate) use otlp::TaskTracer;
pub use settings::{LogSettings, TraceSettings};
pub use spans::TraceContext;
