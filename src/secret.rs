//! Secrets in settings, and URIs shown without their passwords: a leaf that
//! every room's settings use, so that none of them imports another's to keep
//! a password out of a log.

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A setting that may carry a password (a broker or database URI): its
/// `Debug` never shows it, so settings can be logged whole. Code that needs
/// the value says so with [`Secret::expose`]; what is shown to people goes
/// through [`redact_uri`].
#[derive(Clone)]
pub struct Secret(SecretString);

impl Secret {
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl Default for Secret {
    fn default() -> Self {
        Secret::from("")
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.expose() == other.expose()
    }
}

impl Eq for Secret {}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Secret(SecretString::from(value))
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(SecretString::from(value))
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret::from)
    }
}

/// Only for layering the defaults under the file and the environment
/// (`config::Settings::load`); nothing else serialises settings.
impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.expose())
    }
}

/// The URI without its password, for logs and error messages.
pub fn redact_uri(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_owned();
    };
    match rest.split_once('@') {
        // Only a password is hidden; a URI without one shows none.
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
            None => uri.to_owned(),
        },
        None => uri.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            redact_uri("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact_uri("amqp://host"), "amqp://host");
        assert_eq!(
            redact_uri("postgres://postgres@127.0.0.1/test"),
            "postgres://postgres@127.0.0.1/test"
        );
        assert_eq!(format!("{:?}", Secret::from("pw")), "Secret([redacted])");
    }
}
