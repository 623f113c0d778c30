//! How delayline declares what it declares: durable, and the plan's
//! exchange kinds as lapin names them. A leaf, shared by declaring and by
//! diagnosing a conflict.

use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};

use crate::cascade::ExchangeKind;

pub(crate) fn lapin_kind(kind: ExchangeKind) -> lapin::ExchangeKind {
    match kind {
        ExchangeKind::Topic => lapin::ExchangeKind::Topic,
        ExchangeKind::Fanout => lapin::ExchangeKind::Fanout,
        ExchangeKind::Direct => lapin::ExchangeKind::Direct,
        ExchangeKind::Headers => lapin::ExchangeKind::Headers,
    }
}

pub(crate) fn durable_exchange() -> ExchangeDeclareOptions {
    ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    }
}

pub(crate) fn durable_queue() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}
