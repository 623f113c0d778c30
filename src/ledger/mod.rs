//! The task ledger: every accepted task as a row, in SQLite (embedded, the
//! default) or PostgreSQL (shared by several replicas).
//!
//! The ledger is what lets delayline answer 202 while RabbitMQ is down (the
//! task waits here as `pending` until the forwarder publishes it), replay a
//! retried request instead of scheduling it twice, and say what is scheduled.
//!
//! Both backends run the same SQL text: `$N` placeholders, integer epoch
//! milliseconds, and nothing either dialect lacks. Only the schema differs,
//! in `migrations/sqlite` and `migrations/postgres`. [`on_pool!`] expands a
//! query once per backend, so every query is written once.
//!
//! Writes on the request path, and the release stage's claims and
//! deliveries, go through [`writer`]: one transaction for everything that
//! arrived while the previous one committed (group commit), run in steps by
//! [`transaction`] ([`admit`] new tasks, [`claim`] due ones, mark the rest).
//! On SQLite the writer has a `rusqlite` connection and a thread of its own
//! (sqlx's SQLite driver cost 1.3–2.5× the CPU per task, BENCHMARKS.md, issue
//! 28); everything else, and PostgreSQL, goes through sqlx's pools. Callers
//! see one [`Ledger`] whichever driver sits below.
//! Cancels and moves ([`change`]) are single conditional updates of their
//! own; [`release`] records what the release stage and the operator's
//! commands learn about due tasks; [`tasks`] reads tasks, claims pending
//! ones for the forwarder and prunes; [`limits`] keeps release limits (the
//! one file that writes the limits table) and runs the limiter's pass;
//! [`forecast`] reads what falls due per minute (counted by triggers, and
//! on SQLite by the writer for its own changes: [`due_counts`]) and folds
//! PostgreSQL's changes into those counts; [`operations`] keeps bulk
//! operations (the one file that writes that table) and reads their pages;
//! [`parked`] keeps the messages retry policies gave up on (the one file
//! that writes the parked table); [`retry_policies`] keeps the retry
//! policies set at run time and who changed them (the one file that writes
//! their tables). The text of every statement on tasks
//! is in [`sql`], and only there (`tests/layout.rs` checks it); the
//! schedules' own table is written in [`schedules`], but for the planner's
//! steps, which [`plan`] writes in the group commit with their tasks (their
//! statement is in [`sql`] with the group's others).
//!
//! This file only declares. Dependencies between the files run one way:
//! `settings` (where the ledger is, and whether there is one) → `error`;
//! `pool` (connections, migrations) → `settings`; [`handle`] (the
//! [`Ledger`], opened) → `pool`, `writer` → `admit`, `claim`, `plan` →
//! `transaction` → `sql` → `filter`, `record`, and `transaction` →
//! `due_counts`; `tasks`, `change`, `release`, `staged`, `schedules`, `parked`
//! and `retry_policies` add methods to the handle.

// The two macros every file below uses: first, so that they are in scope.
#[macro_use]
mod macros;

mod admit;
mod change;
mod checkpoint;
mod claim;
mod cursor;
mod due_counts;
mod error;
mod filter;
mod forecast;
mod handle;
mod holders;
mod limits;
mod operations;
mod parked;
mod pass;
mod plan;
mod pool;
mod record;
mod release;
mod retry_policies;
mod schedules;
mod settings;
mod sql;
mod staged;
mod tasks;
mod transaction;
mod writer;

pub use admit::Admission;
pub(crate) use change::{Cancel, ChangeKey, Move, Reschedule};
pub use claim::{ClaimAsk, Finding, UnstageInput, WaitsFor};
pub(crate) use cursor::Cursor;
pub(crate) use error::LedgerError;
pub(crate) use filter::TaskFilter;
pub use handle::{Ledger, open};
pub(crate) use operations::{PageDone, PagedTask, StoredOperation};
pub(crate) use parked::{HOUR_MS, ParkedFilter, ParkedGroup, ParkedMessage, ParkedQueue};
pub(crate) use pass::{PassInput, StoredLimit};
pub(crate) use plan::Advance;
pub(crate) use pool::{Migrated, migrate_only};
pub use record::Entry;
pub(crate) use record::{Republish, StoredTask};
pub(crate) use release::Expiry;
pub(crate) use retry_policies::{PolicyPut, RetryPolicyChange, StoredRetryPolicy};
pub(crate) use schedules::{Planned, PlannedSchedule, ScheduleChange, StoredSchedule};
pub use settings::StoreSettings;
pub(crate) use settings::is_unmade;
pub use writer::CommitObservers;
