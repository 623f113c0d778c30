//! The names an ingress or a retry policy gives the broker, checked. Pure.

use crate::cascade::MAX_NAME_BYTES;

/// A name delayline declares or publishes to: 1 to 255 bytes, not the
/// broker's own (`amq.`).
pub(super) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(format!("{name:?} must be 1 to {MAX_NAME_BYTES} bytes"));
    }
    if name.starts_with("amq.") {
        return Err(format!(
            "{name:?}: names starting with \"amq.\" are the broker's"
        ));
    }
    Ok(())
}

/// The destination a retry of `queue` is listed, filtered, limited and
/// forecast by: the queue's own name when it can be a destination (words
/// of `A-Z a-z 0-9 _ -` between single dots, at most `max_bytes`, not
/// starting with `_`); otherwise `_` then the name with every byte but
/// `A-Z a-z 0-9 -` written `_` and two hex digits (`orders:eu` is
/// `_orders_3aeu`), one word. Distinct queues get distinct destinations: a
/// kept name never starts with `_`, an escaped one always does and reads
/// back to one name (and is never the ingress's keyless `_` alone). One
/// longer than `max_bytes` escaped keeps its first bytes and ends with `-`
/// and 16 hex digits of the name's SHA-256.
pub fn retry_destination(queue: &str, max_bytes: usize) -> String {
    let kept = queue.len() <= max_bytes
        && !queue.starts_with('_')
        && crate::cascade::validate_destination(queue).is_ok();
    if kept {
        return queue.to_owned();
    }
    let mut escaped = String::from("_");
    for byte in queue.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' => escaped.push(char::from(byte)),
            other => escaped.push_str(&format!("_{other:02x}")),
        }
    }
    if escaped.len() <= max_bytes {
        return escaped;
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(queue.as_bytes());
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let mut cut = max_bytes.saturating_sub(1 + hash.len());
    // Not inside an escape: its `_` and two digits stay whole.
    while let Some(at) = escaped[..cut].rfind('_').filter(|at| cut - at < 3) {
        cut = at;
    }
    format!("{}-{hash}", &escaped[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: usize = 197;

    #[test]
    fn a_name_that_can_be_a_destination_is_kept_and_another_escaped() {
        assert_eq!(retry_destination("orders", MAX), "orders");
        assert_eq!(retry_destination("billing.eu-1", MAX), "billing.eu-1");
        assert_eq!(retry_destination("orders:eu", MAX), "_orders_3aeu");
        assert_eq!(retry_destination("my queue", MAX), "_my_20queue");
        assert_eq!(retry_destination("a/b", MAX), "_a_2fb");
        assert_eq!(
            retry_destination("commandes-été", MAX),
            "_commandes-_c3_a9t_c3_a9"
        );
        assert_eq!(retry_destination("_private", MAX), "__5fprivate");
        assert_eq!(retry_destination("a..b", MAX), "_a_2e_2eb");
        let long = "q".repeat(250);
        let shortened = retry_destination(&long, MAX);
        assert_eq!(shortened.len(), MAX);
        assert!(shortened.starts_with("_qqq"), "{shortened}");
        assert_ne!(shortened, retry_destination(&"q".repeat(251), MAX));
    }

    proptest! {
        /// Any name a queue can have gives a destination the cascade takes
        /// (valid, within the bound), never the keyless `_`, and two names
        /// never give one destination.
        #[test]
        fn every_queue_name_gives_a_valid_destination_of_its_own(
            first in "\\PC{1,120}",
            second in "\\PC{1,120}",
            max in 40usize..=253,
        ) {
            prop_assume!(first.len() <= 255 && second.len() <= 255);
            let one = retry_destination(&first, max);
            prop_assert!(crate::cascade::validate_destination(&one).is_ok(), "{one}");
            prop_assert!(one.len() <= max, "{} > {max}", one.len());
            prop_assert_ne!(one.as_str(), "_");
            if first != second {
                prop_assert_ne!(one, retry_destination(&second, max));
            }
        }
    }
}
