//! Console sign-ins, held by this process: the cookie carries a random
//! session id, never the token, so a stolen cookie is not an API token and
//! dies with its session.
//!
//! A session ends when its holder signs out, when it expires
//! ([`LIFETIME`] after sign-in), or when its client's token is no longer
//! known: every request authenticates the session's token again, so a token
//! removed from the clients file (and reloaded) ends its sessions at once.
//! Sessions live in memory: a restart signs everyone out, and with several
//! replicas behind one address a session is known to the replica that
//! opened it (route the console with sticky sessions, or sign in on each).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

/// How long a sign-in lasts: a working day, then sign in again.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The most sessions held; past it the one that expires first is dropped,
/// so sign-ins cannot grow the process's memory without bound.
const MOST: usize = 10_000;

pub struct Sessions {
    /// By the SHA-256 of the session id: a lookup's timing says nothing of
    /// the ids held.
    held: Mutex<HashMap<[u8; 32], Held>>,
    most: usize,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::holding(MOST)
    }
}

struct Held {
    token: SecretString,
    expires: Instant,
}

fn key(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    fn holding(most: usize) -> Self {
        Sessions {
            held: Mutex::default(),
            most,
        }
    }

    /// A new session for `token` (already authenticated); its id, for the
    /// cookie: 256 random bits.
    pub fn open(&self, token: &str, now: Instant) -> String {
        let id = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
        let mut held = self.lock();
        held.retain(|_, session| session.expires > now);
        if held.len() >= self.most
            && let Some(first) = held
                .iter()
                .min_by_key(|(_, session)| session.expires)
                .map(|(key, _)| *key)
        {
            held.remove(&first);
        }
        let session = Held {
            token: SecretString::from(token.to_owned()),
            expires: now + LIFETIME,
        };
        held.insert(key(&id), session);
        id
    }

    /// The token of a live session; an expired one is dropped.
    pub fn token(&self, id: &str, now: Instant) -> Option<String> {
        let mut held = self.lock();
        let key = key(id);
        match held.get(&key) {
            Some(session) if session.expires > now => {
                Some(session.token.expose_secret().to_owned())
            }
            Some(_) => {
                held.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends a session (signed out, or its token no longer known).
    pub fn close(&self, id: &str) {
        self.lock().remove(&key(id));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Held>> {
        // A panic while held leaves a map that is still whole.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_holds_its_token_until_it_is_closed_or_expires() {
        let sessions = Sessions::default();
        let start = Instant::now();
        let id = sessions.open("tok", start);
        assert_eq!(id.len(), 43, "256 bits, base64url");
        assert!(!id.contains("tok"));
        assert_eq!(sessions.token(&id, start).as_deref(), Some("tok"));
        assert_eq!(sessions.token("another", start), None);
        let other = sessions.open("tok", start);
        assert_ne!(id, other, "every sign-in its own session");
        sessions.close(&id);
        assert_eq!(sessions.token(&id, start), None);
        assert_eq!(sessions.token(&other, start + LIFETIME), None, "expired");
        assert_eq!(sessions.token(&other, start), None, "dropped once expired");
    }

    #[test]
    fn sign_ins_never_hold_more_than_the_bound() {
        let sessions = Sessions::holding(3);
        let start = Instant::now();
        let first = sessions.open("tok", start);
        for n in 1..=3 {
            sessions.open("tok", start + Duration::from_millis(n));
        }
        assert_eq!(sessions.lock().len(), 3);
        assert_eq!(sessions.token(&first, start), None, "the oldest went");
    }
}
