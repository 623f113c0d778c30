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
pub(crate) use pattern::DestinationPattern;
pub(crate) use settings::AuthSettings;
pub use settings::{ClientSettings, TokenHashes};
mod clients;
#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) use clients::Usage;
pub(crate) use clients::{
    AuthError, Authenticator, Caller, Client, ClientSet, Permission, Throttled, Unauthenticated,
    parse_clients_file,
};
#[cfg(test)]
pub(crate) use settings::AuthMode;
