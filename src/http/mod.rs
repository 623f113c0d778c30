//! The HTTP API (axum): tasks in, topology and health out.
//!
//! One module per resource, each with its own `router()`: `tasks` (taking
//! tasks in), `inspect` (reading them back), `changes` (cancelling and
//! moving them), `expired` (replaying an expired task), `schedules` (recurring schedules), `topology`, `health` (the
//! probes), `scrape` (`/metrics`); `auth` is the gate in front of all but the
//! probes, `extract` the JSON body extractor, `error` the error shape,
//! `fallback` what no route serves; `serve` the accept loop, with `wire`
//! turning hyper's bare refusals of unparseable requests into JSON.

mod auth;
mod batch;
mod bulk;
mod chain_view;
pub(crate) mod changes;
pub mod codes;
mod console;
mod error;
mod expired;
mod extract;
mod fallback;
mod forecast;
mod health;
mod inspect;
pub mod limits;
pub mod openapi;
mod release_limits;
mod reload;
mod retries;
mod retry_policies;
mod router;
mod schedules;
mod scrape;
pub mod serve;
mod settings;
mod state;
mod tasks;
mod topology;
mod unroutable;
mod wire;

#[cfg(test)]
mod tests;

pub use reload::Reloader;
pub use router::{MetricsRoute, metrics_router, router};
pub use settings::{ConsoleSettings, HttpSettings, HttpTlsSettings};
pub use state::AppState;
