//! What this replica is releasing right now, by task and revision: the
//! release stage and the staged release both enter a window's tasks before
//! they ask the ledger, so that a second copy of a task in flight (the
//! broker gave it back when a channel died) waits instead of being
//! published twice.

use std::collections::HashSet;
use std::sync::Arc;

/// The tasks (id and revision) this replica is releasing: claimed, and not
/// yet recorded delivered or given back.
#[derive(Clone, Default)]
pub(super) struct InFlight(Arc<std::sync::Mutex<HashSet<(String, u64)>>>);

impl InFlight {
    /// A guard for one window: each task entered through it is taken out
    /// of flight again when the guard is dropped.
    pub(super) fn window(&self) -> Entered<'_> {
        Entered {
            in_flight: self,
            entered: Vec::new(),
        }
    }

    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<(String, u64)>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A window's tasks while it is released (see [`InFlight::window`]).
pub(super) struct Entered<'a> {
    in_flight: &'a InFlight,
    /// The tasks this window entered.
    entered: Vec<(String, u64)>,
}

impl Entered<'_> {
    /// Enters a message's task unless it is in flight already (then
    /// false: a copy of a task being released now). A message that is no
    /// task's (`None`) has nothing to enter: true.
    pub(super) fn enter(&mut self, identity: Option<&(String, u64)>) -> bool {
        let Some(identity) = identity else {
            return true;
        };
        let new = self.in_flight.set().insert(identity.clone());
        if new {
            self.entered.push(identity.clone());
        }
        new
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut set = self.in_flight.set();
        for identity in &self.entered {
            set.remove(identity);
        }
    }
}
