//! Tokens: random, shown once, and known to delayline only by their SHA-256.

use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Every token starts with this, so that a leaked one is easy to recognise
/// (secret scanners, log greps) and to tell from other credentials.
pub const TOKEN_PREFIX: &str = "dlt_";

/// Random bytes in a token: 256 bits.
const TOKEN_BYTES: usize = 32;

/// A new token from the operating system's random source.
pub fn generate() -> String {
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// The SHA-256 of a token, as configured: 64 lowercase hex digits.
pub fn hash_hex(token: &str) -> String {
    format!("{:x}", Sha256::digest(token.as_bytes()))
}

pub fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A configured hash, as bytes; `None` unless it is 64 hex digits.
pub fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_and_hash_as_configured() {
        let token = generate();
        assert!(token.starts_with(TOKEN_PREFIX));
        let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&token[TOKEN_PREFIX.len()..])
            .unwrap();
        assert_eq!(decoded.len() * 8, 256);
        assert_ne!(generate(), token);
        let hex = hash_hex(&token);
        assert_eq!(parse_hash(&hex), Some(hash(&token)));
        assert_eq!(
            hash_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(parse_hash(&hex.to_uppercase()), Some(hash(&token)));
        assert_eq!(parse_hash("abc"), None);
        assert_eq!(parse_hash(&"zz".repeat(32)), None);
    }
}
