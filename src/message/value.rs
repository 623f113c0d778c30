//! A header value as a task states it: the JSON a client sends, the AMQP
//! type it is published as, and what the ledger stores.

use serde::{Deserialize, Serialize};

/// A caller-supplied header value; AMQP tables carry each as its own type.
/// Stored in the ledger as plain JSON, which the untagged form reads back
/// into the same variants (an integer stays an integer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FieldValue {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// Written by hand: the derived `oneOf` of string, integer, number and
/// boolean lets an integer match two branches, which a strict client reads
/// as invalid. Each JSON value matches exactly one of these.
impl utoipa::PartialSchema for FieldValue {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .description(Some(
                "A header value: a string (AMQP long string), a number (an integer that \
                 fits 64 bits becomes a signed 64-bit integer, any other number a double) \
                 or a boolean.",
            ))
            .item(ObjectBuilder::new().schema_type(Type::String))
            .item(ObjectBuilder::new().schema_type(Type::Number))
            .item(ObjectBuilder::new().schema_type(Type::Boolean))
            .into()
    }
}

impl utoipa::ToSchema for FieldValue {}
