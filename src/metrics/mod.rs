//! Prometheus metrics, served at `GET /metrics`.
//!
//! One [`Metrics`] per running service (tests run several in one process, so
//! nothing is global). Counters and histograms are updated where the event
//! happens; values that already live elsewhere (connection state, pending
//! tasks) are read at scrape time instead of being mirrored, so they cannot
//! drift. Queue depths come from [`poll_queue_depths`] (in `depths`), which
//! asks the management API where it answers and passive declares otherwise.

mod depths;
pub mod recent;
mod settings;
pub use depths::poll_queue_depths;
pub use settings::MetricsSettings;
mod registry;

pub use registry::{
    CONTENT_TYPE, ClientLabel, IngressLabel, LevelLabel, LimitLabel, Metrics, OutcomeLabel,
    StateLabel, VersionLabel,
};
