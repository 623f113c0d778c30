//! The release side: everything between a due task's message leaving the
//! cascade and its arrival at its destination.
//!
//! - [`stage`]: the release queue's consumer. Level 0 dead-letters into
//!   the release queue; each due message is held to its millisecond
//!   ([`hold`], pure), looked up in the ledger (claimed, or dropped when
//!   provably not to be delivered), published, and recorded delivered.
//!   What arrives well before its time is staged in the ledger instead.
//! - [`staged`]: releases staged tasks from the ledger at their moments.
//! - [`limiter`]: releases, as the release limits allow and in due order,
//!   the tasks that wait in the ledger for a limit ([`limit_view`]: what
//!   this replica knows of the limits; the rules are `crate::limit`'s).
//! - [`publisher`]: the one publisher those three share
//!   ([`publisher::DuePublisher`]); [`unroutable`], the watch that marks a
//!   task whose released message reached no queue; [`record`], what a
//!   release path writes to the ledger after it published; [`in_flight`],
//!   what this replica is releasing now.
//! - [`watch`]: what the way of delaying learns from what arrives
//!   ([`ArrivalWatch`]: the cascade's level keepers, in `crate::chain`).
//! - [`broker`]: the port to the broker the release side and the
//!   scheduler use ([`Broker`]), which tests replace.
//!
//! [`side`] builds all of them from the handles they share; the
//! scheduler's `background` starts each. This room knows tasks, the
//! ledger and the broker port; it takes nothing from the scheduler, nor
//! from the cascade's run time (`crate::chain`).

mod broker;
pub(crate) mod hold;
mod in_flight;
mod limit_view;
mod limiter;
mod publisher;
mod record;
mod side;
mod stage;
mod staged;
mod unroutable;
mod watch;

pub(crate) use broker::Broker;
#[cfg(test)]
pub(crate) use broker::PublishAlone;
pub(crate) use limit_view::{LimitStatus, LimitsView};
pub(crate) use side::{ReleaseHandles, ReleaseSide};
pub use stage::{RELEASE_WINDOW, RELEASE_WINDOWS};
pub use staged::{PAGE, PAGES_OUT};
pub(crate) use watch::{Arrival, ArrivalWatch};
