//! Logging set-up: human-readable text by default, JSON lines for log shippers.

use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use super::settings::{LogFormat, LogSettings};

/// Installs the global subscriber. `RUST_LOG`, when set, wins over `log.filter`
/// so an operator can turn up verbosity without touching the configuration.
pub fn init(settings: &LogSettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&settings.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match settings.format {
        // Colours only on a terminal: in a file or a log shipper they are noise.
        LogFormat::Text => registry
            .with(
                fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        // Event fields at the top level, so `task_id` is a key of its own for
        // log shippers; the enclosing span (with the request's task) nests under "span".
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    // A second initialisation (several services in one test binary) keeps the first subscriber.
    let _ = result;
}
