//! The operator's commands as an application layer: provisioning and
//! checking the chain, migrating it, requeueing what was unroutable,
//! deleting it (`deprovision`), checking a queue's wiring to the retries
//! (`wiring`), creating client tokens. Each coordinates the ledger and the broker and
//! returns what it did; `cli` parses arguments, calls one and prints.
//!
//! Decisions about a task live here, above the broker adapter: which copies
//! a migration drops (asked of the ledger, see [`migrate`]), which tasks it
//! marks failed, which unroutable tasks count as delivered again.

pub mod deprovision;
pub mod migrate;
pub mod provision;
pub mod reload;
mod settings;
pub mod token;
pub mod unroutable;
pub mod wiring;
pub use settings::OperatorSettings;
mod run;

pub use run::OperationError;
