//! The opaque cursor of `GET /v1/tasks`: where the previous page ended, in
//! the listing's order (`deliver_at`, then id). Keyset pagination: a page
//! costs the same however deep it is, and rows added meanwhile are not
//! skipped or repeated.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub deliver_at_ms: u64,
    pub id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cursor is not one this service returned")]
pub struct CursorError;

impl Cursor {
    /// The cursor of the page after `page`, when it is full (`limit` rows):
    /// a shorter page is the last.
    pub fn after_page(page: &[super::StoredTask], limit: u32) -> Option<String> {
        let last = page.last().filter(|_| page.len() == limit as usize)?;
        let cursor = Cursor {
            deliver_at_ms: last.deliver_at_ms,
            id: last.id.clone(),
        };
        Some(cursor.encode())
    }

    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!("{}:{}", self.deliver_at_ms, self.id))
    }

    pub fn decode(text: &str) -> Result<Cursor, CursorError> {
        let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| CursorError)?;
        let text = String::from_utf8(bytes).map_err(|_| CursorError)?;
        let (ms, id) = text.split_once(':').ok_or(CursorError)?;
        Ok(Cursor {
            deliver_at_ms: ms.parse().map_err(|_| CursorError)?,
            id: id.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn round_trips(deliver_at_ms in any::<u64>(), id in ".{0,64}") {
            let cursor = Cursor { deliver_at_ms, id };
            prop_assert_eq!(Cursor::decode(&cursor.encode()), Ok(cursor));
        }

        #[test]
        fn garbage_is_an_error_not_a_panic(text in ".{0,64}") {
            let _ = Cursor::decode(&text);
        }
    }

    #[test]
    fn ids_with_colons_survive() {
        let cursor = Cursor {
            deliver_at_ms: 7,
            id: "a:b:c".into(),
        };
        assert_eq!(Cursor::decode(&cursor.encode()), Ok(cursor));
        assert_eq!(Cursor::decode("!!"), Err(CursorError));
        assert_eq!(
            Cursor::decode(&URL_SAFE_NO_PAD.encode("x:y")),
            Err(CursorError)
        );
    }
}
