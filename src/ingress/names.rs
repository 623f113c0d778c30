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
