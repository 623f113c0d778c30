//! `deprovision`: objects as the broker has them, and their deletion.
//! Which of them may go, and what their messages are, is decided above
//! (`crate::operations::deprovision`); this only looks and deletes.

use lapin::Connection;
use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};

use super::inspect::{QueueState, exchange_exists, queue_state};
use super::{BrokerError, Context, open_channel};

/// One object as the broker has it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standing {
    pub name: String,
    pub kind: ObjectKind,
    pub exists: bool,
    /// A queue's ready messages and consumers (0 for an exchange).
    pub messages: u32,
    pub consumers: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    Queue,
    Exchange,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Queue => "queue",
            ObjectKind::Exchange => "exchange",
        }
    }
}

/// Each of `names` as the broker has it, as a queue or as an exchange.
pub async fn standing(
    connection: &Connection,
    kind: ObjectKind,
    names: impl IntoIterator<Item = String>,
) -> Result<Vec<Standing>, BrokerError> {
    let mut found = Vec::new();
    for name in names {
        let (exists, state) = match kind {
            ObjectKind::Queue => {
                let state = queue_state(connection, &name).await?;
                (state.is_some(), state)
            }
            ObjectKind::Exchange => (exchange_exists(connection, &name).await?, None),
        };
        let QueueState {
            messages,
            consumers,
        } = state.unwrap_or(QueueState {
            messages: 0,
            consumers: 0,
        });
        found.push(Standing {
            name,
            kind,
            exists,
            messages,
            consumers,
        });
    }
    Ok(found)
}

/// Deletes every object of `objects` that exists, with what it holds, each
/// on a channel of its own (a failed delete closes its channel). An object
/// gone meanwhile is no error.
pub async fn delete(connection: &Connection, objects: &[Standing]) -> Result<(), BrokerError> {
    for object in objects.iter().filter(|o| o.exists) {
        let name = object.name.as_str();
        let channel = open_channel(connection, || {
            format!("opening a channel to delete {name:?}")
        })
        .await?;
        match object.kind {
            ObjectKind::Queue => {
                channel
                    .queue_delete(name.into(), QueueDeleteOptions::default())
                    .await
                    .context(|| format!("deleting queue {name:?}"))?;
            }
            ObjectKind::Exchange => {
                channel
                    .exchange_delete(name.into(), ExchangeDeleteOptions::default())
                    .await
                    .context(|| format!("deleting exchange {name:?}"))?;
            }
        }
        let _ = channel.close(200, "deleted".into()).await;
    }
    Ok(())
}
