//! AMQP ingresses: the `x-delayed-message` plugin's contract, on the cascade.
//!
//! A producer publishes to an ingress's exchange with an `x-delay` header
//! (or `x-deliver-at`), as it published to the plugin's exchange. delayline
//! consumes the ingress's queue in windows; each message becomes a task
//! ([`intake::take`], pure) that the scheduler takes in as it takes one over
//! HTTP (the ledger's group commit, then the cascade), and is acknowledged
//! only once its task is committed. When due, the release stage delivers it
//! to the ingress's `deliver_to` exchange with the routing key, body and
//! properties it came with ([`crate::message::released`]). A message the
//! ingress refuses goes to its refused queue, with the reason in headers; a
//! message that cannot be taken now (the ledger away) goes back to the queue.
//!
//! It needs the ledger and the release stage (checked with the settings):
//! the routing key and the exchange of a message are restored by the stage.
//!
//! Retries are an intake too: a consumer's queue dead-letters to the retry
//! exchange ([`retry`]: the policies, their broker objects and verdicts,
//! pure); [`retry_runner`] takes each message in and schedules it back to the
//! queue it died in after the policy's backoff (a task, by the default
//! exchange), or parks it in the ledger after its last attempt; [`parked`]
//! replays or discards parked messages; [`policies`] keeps the policies in
//! force fresh (the configuration's and those set at run time in the
//! ledger, which [`policy_set`] combines, pure); [`wiring`] judges whether a
//! queue is wired to the retry exchange (pure). The message's side (where it died,
//! its attempt, what comes back) is `message`'s `retry`.
//!
//! The files pair by intake: [`intake`] judges a delayed message (pure) and
//! [`intake_runner`] consumes them; [`retry`] judges a dead-lettered one
//! (pure) and [`retry_runner`] consumes them; [`consumer`] is what both
//! runners share (windows, the refused copy).

mod consumer;
mod intake;
mod intake_runner;
mod names;
pub use names::retry_destination;
mod parked;
mod policies;
mod policy_set;
mod retry;
mod retry_runner;
mod settings;
pub mod wiring;
pub(crate) use settings::IngressError;
pub use settings::{Ingress, IngressSettings, plan_with};

pub(crate) use intake_runner::IngressRunner;
pub(crate) use parked::{PARKED_PAGE, Parked, ParkedAction, ParkedError, Unparked};
pub(crate) use policies::{PolicyError, REFRESH_EVERY, RetryBook, validated};
pub use policy_set::{InForce, PolicyConflict, PolicySet, PolicySource, SetAside};
pub use retry::{Retries, RetryError, RetryPolicy, RetryRefusal, RetrySettings};
pub(crate) use retry_runner::RetryRunner;
