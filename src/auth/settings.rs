//! `[auth]`: the clients of the API and how tokens are required. The auth
//! room owns these settings; the clients file has the same shape.

use serde::{Deserialize, Serialize};

/// Who may use the API. See `crate::auth`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    pub mode: AuthMode,
    /// A TOML file of `[[clients]]`, read at start and again on SIGHUP.
    pub clients_file: String,
    /// Clients given in the configuration itself (`[[auth.clients]]`).
    pub clients: Vec<ClientSettings>,
    /// How often each quota's count of scheduled tasks is read again from the
    /// ledger (deliveries and other replicas' tasks are seen then).
    pub quota_refresh_ms: u64,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            mode: AuthMode::Auto,
            clients_file: String::new(),
            clients: Vec::new(),
            quota_refresh_ms: 2_000,
        }
    }
}

/// - `auto`: tokens are required as soon as any client is configured (or a
///   clients file is named); without clients the API is open, which is only
///   allowed on a loopback address.
/// - `tokens`: tokens are required, even while no client is configured.
/// - `open`: no tokens, on any address: for a network where every peer is
///   trusted, said explicitly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    #[default]
    Auto,
    Tokens,
    Open,
}

/// One client of the API (the same shape as in the clients file).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSettings {
    /// `[A-Za-z0-9_.-]`, unique: recorded on each of its tasks.
    pub name: String,
    /// Hex SHA-256 of the token (`delayline token create` prints it), or
    /// several, while a token is being rotated.
    pub token_sha256: TokenHashes,
    /// AMQP topic patterns of the destinations it may publish to.
    #[serde(default)]
    pub destinations: Vec<String>,
    /// Exchanges its tasks may name (`"exchange"`) besides the business
    /// exchange, by exact name; `"*"` for any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exchanges: Vec<String>,
    /// `submit`, `read`, `cancel`, `reschedule`, `schedule`, `metrics`, `admin`.
    #[serde(default)]
    pub permissions: Vec<String>,
    /// Tasks per second, refilled continuously (token bucket); none: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<u32>,
    /// Tasks that may be taken at once above the rate (default: one second's worth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Tasks this client may have waiting (not yet due) at once; needs a ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_scheduled: Option<u64>,
}

/// One hash or several (`token_sha256 = ["new", "old"]` during a rotation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenHashes {
    One(String),
    Many(Vec<String>),
}

impl Default for TokenHashes {
    fn default() -> Self {
        TokenHashes::Many(Vec::new())
    }
}

impl TokenHashes {
    pub fn as_slice(&self) -> &[String] {
        match self {
            TokenHashes::One(one) => std::slice::from_ref(one),
            TokenHashes::Many(many) => many,
        }
    }
}
