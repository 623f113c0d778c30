//! Who may do what: clients, their tokens, the destinations they may
//! publish to, their permissions, rate limits and quotas.
//!
//! Nothing here speaks HTTP (`crate::http::auth` turns these answers into
//! 401/403/429) and the only I/O is reading the clients file. delayline
//! never holds a token, only its SHA-256: a leaked configuration or ledger
//! lets nobody publish.

mod pattern;
mod settings;
pub mod token;
pub use pattern::{DestinationPattern, PatternError};
pub use settings::{AuthMode, AuthSettings, ClientSettings, TokenHashes};
mod clients;
#[cfg(test)]
mod tests;

pub use clients::{
    AuthError, Authenticator, Caller, Client, ClientSet, Permission, Throttled, Unauthenticated,
    Usage, is_loopback_bind, parse_clients_file,
};
