//! What the way of delaying learns from the release stage: the one thing
//! the release side tells it. The cascade's level keepers
//! (`crate::chain`) judge its levels by what arrives and when; another
//! way of delaying would watch something else, or nothing.

use crate::broker::Inbound;
use crate::message::Message;

/// A message of a window, as the watch sorts it.
pub(crate) enum Arrival {
    /// A task's message: released as any.
    Task,
    /// The watch's own (a level probe): taken off, with a notice to hand on
    /// to the replica that sent it, if another did.
    Own(Option<Box<Message>>),
}

/// Told of every window the release stage takes, and of the tasks the
/// ledger's release paths let go.
pub(crate) trait ArrivalWatch: Send + Sync + 'static {
    /// A window arrived (tasks and the watch's own messages alike).
    fn arrived(&self, messages: &[Inbound]);
    /// Whether `message` is a task's or the watch's own.
    fn sort(&self, message: &Inbound) -> Arrival;
    /// `tasks` of a burst were staged or released from the ledger: the way
    /// is busy, not stopped.
    fn burst_seen(&self, tasks: usize);
}
