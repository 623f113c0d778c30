//! The command line. Each command, by what it acts on:
//! - the service: `serve`;
//! - the broker and the ledger, as the operator (`operator`): `provision
//!   [--dry-run | --check]`, `deprovision`, `migrate-topology --from`,
//!   `requeue-unroutable`, `migrate`, `retries check`, `token create`,
//!   `reload`, `probe`;
//! - nothing but the configuration: `route` (where a delay goes) and
//!   `openapi` (the API's description);
//! - a running service, through its API (`api`): `schedules`, `limits`,
//!   `forecast`, `bulk`, `retries list`, `parked`.
//!
//! What each takes is in `args`; `run` loads the configuration and
//! dispatches; what the operator's commands print is in `describe`.

/// Writes to standard output (see [`output::write_out`]).
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::output::write_out(format_args!($($arg)*)) };
}

macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::output::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod api;
mod args;
mod describe;
mod operator;
mod output;
mod run;
#[cfg(test)]
mod tests;

pub use args::*;
pub use describe::describe_plan;
pub use run::main;
