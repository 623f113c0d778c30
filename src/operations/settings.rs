//! What the operator's commands need of the configuration: the sections
//! they act with, gathered by `config::Settings::operator`, so that this
//! layer does not read the configuration itself.

use crate::broker::AmqpSettings;
use crate::ledger::StoreSettings;
use crate::secret::Secret;

#[derive(Clone, Debug)]
pub struct OperatorSettings {
    pub amqp: AmqpSettings,
    pub store: StoreSettings,
    /// `metrics.management_url`: a migration counts a quorum queue's
    /// messages through it.
    pub management_url: Secret,
    /// Whether the chain has a release stage (a ledger then keeps each
    /// task's payload until it is delivered).
    pub release_stage: bool,
}
