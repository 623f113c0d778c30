//! Publishing with confirms, over a connection that heals itself.
//!
//! A supervisor task owns the connection: it connects, provisions the
//! topology, opens the publishing channels in confirm mode and hands them out
//! as one [`Session`]. When the connection dies, the session is withdrawn (so
//! publishes fail fast with 503 and `/readyz` says so) and rebuilt with back-off.
//!
//! Publishes are spread over several channels and never wait for one another:
//! each awaits only its own confirm, so confirms are pipelined and throughput
//! grows with the number of concurrent requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, Event};
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::{BrokerError, Context, connect, provision, redact_uri};
use crate::cascade::TopologyPlan;
use crate::task::{DELAY_HEADER, DELIVER_AT_HEADER, HeaderValue, Task};

const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// How often the supervisor double-checks a connection that reported no error.
const STATUS_POLL: Duration = Duration::from_millis(500);
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
pub struct PublisherOptions {
    pub uri: String,
    pub channels: usize,
    pub confirm_timeout: Duration,
    pub max_backoff: Duration,
    pub connection_name: String,
    /// Observes the time from publish to confirm, in seconds.
    pub confirm_latency: Histogram,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    #[error("not connected to RabbitMQ")]
    Unavailable,
    #[error("publishing to RabbitMQ failed: {0}")]
    Broker(String),
    #[error("RabbitMQ did not confirm the message within {0:?}")]
    Timeout(Duration),
    #[error("RabbitMQ refused the message (negative acknowledgement)")]
    Nacked,
    #[error(
        "RabbitMQ returned the message as unroutable ({0}): the cascade topology is incomplete"
    )]
    Returned(String),
}

/// One connection's worth of publishing channels.
struct Session {
    connection: Connection,
    channels: Vec<Channel>,
    /// Cancelled by a publish that found a channel dead, so the supervisor rebuilds.
    broken: CancellationToken,
}

struct Shared {
    session: watch::Sender<Option<Arc<Session>>>,
    next_channel: AtomicUsize,
    confirm_timeout: Duration,
    confirm_latency: Histogram,
}

/// The publisher's live connection, lent for side work such as polling
/// queue depths: a connection of its own would cost several MiB.
pub struct SharedConnection(Arc<Session>);

impl std::ops::Deref for SharedConnection {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.0.connection
    }
}

/// A cheap, cloneable handle to the publishing side of the broker connection.
#[derive(Clone)]
pub struct Publisher {
    shared: Arc<Shared>,
}

impl Publisher {
    /// Starts the connection supervisor. The handle resolves when `shutdown` is
    /// cancelled, or early with the error when the problem needs an operator
    /// (a conflicting topology): retrying could never fix it.
    pub fn start(
        options: PublisherOptions,
        plan: TopologyPlan,
        shutdown: CancellationToken,
    ) -> (Publisher, JoinHandle<Result<(), BrokerError>>) {
        let shared = Arc::new(Shared {
            session: watch::Sender::new(None),
            next_channel: AtomicUsize::new(0),
            confirm_timeout: options.confirm_timeout,
            confirm_latency: options.confirm_latency.clone(),
        });
        let supervisor = tokio::spawn(supervise(shared.clone(), options, plan, shutdown));
        (Publisher { shared }, supervisor)
    }

    /// Connected, provisioned and not blocked by a broker resource alarm.
    pub fn is_ready(&self) -> bool {
        self.shared.session.borrow().as_ref().is_some_and(|s| {
            let status = s.connection.status();
            status.connected() && !status.blocked()
        })
    }

    /// The current connection, when there is one.
    pub fn connection(&self) -> Option<SharedConnection> {
        self.shared.session.borrow().clone().map(SharedConnection)
    }

    pub async fn publish_task(&self, task: &Task) -> Result<(), PublishError> {
        self.publish(
            &task.route.entry_exchange,
            &task.route.routing_key,
            &task.payload,
            task_properties(task),
        )
        .await
    }

    /// Publishes persistently and with `mandatory`, and returns only once the
    /// broker has confirmed the message: an `Ok` means the broker owns it.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let session = self
            .shared
            .session
            .borrow()
            .clone()
            .ok_or(PublishError::Unavailable)?;
        let index =
            self.shared.next_channel.fetch_add(1, Ordering::Relaxed) % session.channels.len();
        let channel = &session.channels[index];
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let started = std::time::Instant::now();
        let confirm = channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                options,
                payload,
                properties,
            )
            .await
            .map_err(|e| session.fail(e))?;
        let confirmation = tokio::time::timeout(self.shared.confirm_timeout, confirm)
            .await
            .map_err(|_| PublishError::Timeout(self.shared.confirm_timeout))?
            .map_err(|e| session.fail(e))?;
        self.shared
            .confirm_latency
            .observe(started.elapsed().as_secs_f64());
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(PublishError::Returned(format!(
                "{} {}",
                returned.reply_code, returned.reply_text
            ))),
            Confirmation::Nack(_) => Err(PublishError::Nacked),
            Confirmation::NotRequested => Err(PublishError::Broker(
                "the channel is not in confirm mode".to_owned(),
            )),
        }
    }
}

impl Session {
    fn fail(&self, error: lapin::Error) -> PublishError {
        // A channel-level error closes the channel for good: rebuild the session.
        self.broken.cancel();
        PublishError::Broker(error.to_string())
    }
}

/// The message as consumers see it.
pub fn task_properties(task: &Task) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, value) in &task.headers {
        let value = match value {
            HeaderValue::Str(s) => AMQPValue::LongString(LongString::from(s.as_str())),
            HeaderValue::Int(i) => AMQPValue::LongLongInt(*i),
            HeaderValue::Float(f) => AMQPValue::Double(*f),
            HeaderValue::Bool(b) => AMQPValue::Boolean(*b),
        };
        headers.insert(ShortString::from(name.as_str()), value);
    }
    let as_i64 = |v: u64| AMQPValue::LongLongInt(i64::try_from(v).unwrap_or(i64::MAX));
    headers.insert(DELAY_HEADER.into(), as_i64(task.granted_delay_ms()));
    headers.insert(DELIVER_AT_HEADER.into(), as_i64(task.deliver_at_ms));
    BasicProperties::default()
        .with_message_id(task.id.as_str().into())
        .with_content_type(task.content_type.as_str().into())
        // AMQP timestamps are whole seconds.
        .with_timestamp(task.accepted_at_ms / 1000)
        .with_delivery_mode(2)
        .with_headers(headers)
}

async fn establish(
    options: &PublisherOptions,
    plan: &TopologyPlan,
) -> Result<Session, BrokerError> {
    let connection = connect(&options.uri, &options.connection_name).await?;
    let session = async {
        provision(&connection, plan).await?;
        let mut channels = Vec::with_capacity(options.channels);
        for _ in 0..options.channels {
            let channel = connection
                .create_channel()
                .await
                .context(|| "opening a publishing channel".to_owned())?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .context(|| "enabling publisher confirms".to_owned())?;
            channels.push(channel);
        }
        Ok(channels)
    }
    .await;
    match session {
        Ok(channels) => Ok(Session {
            connection,
            channels,
            broken: CancellationToken::new(),
        }),
        Err(error) => {
            close(&connection).await;
            Err(error)
        }
    }
}

async fn close(connection: &Connection) {
    let _ = tokio::time::timeout(
        CLOSE_TIMEOUT,
        connection.close(200, "delayline stopping".into()),
    )
    .await;
}

/// Resolves with the reason once `connection` is no longer usable.
async fn connection_lost(connection: &Connection) -> String {
    let mut events = Box::pin(connection.events_listener());
    let mut poll = tokio::time::interval(STATUS_POLL);
    loop {
        tokio::select! {
            event = events.next() => match event {
                // A channel closed by the broker (a failed passive declare of
                // the depth poller, say) is reported here too, but leaves the
                // connection open; a publishing channel's failure is caught by
                // the publish that meets it.
                Some(Event::Error(error)) if connection.status().connected() => {
                    debug!(%error, "a channel was closed; the connection is still open");
                }
                Some(Event::Error(error)) => return error.to_string(),
                Some(Event::ConnectionBlocked(reason)) => warn!(%reason, "RabbitMQ blocked publishing"),
                Some(Event::ConnectionUnblocked) => info!("RabbitMQ unblocked publishing"),
                Some(_) => {}
                None => return "the connection's event stream ended".to_owned(),
            },
            _ = poll.tick() => {
                if !connection.status().connected() {
                    return "the connection is no longer open".to_owned();
                }
            }
        }
    }
}

async fn supervise(
    shared: Arc<Shared>,
    options: PublisherOptions,
    plan: TopologyPlan,
    shutdown: CancellationToken,
) -> Result<(), BrokerError> {
    let uri = redact_uri(&options.uri);
    let mut backoff = INITIAL_BACKOFF;
    loop {
        let attempt = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            attempt = establish(&options, &plan) => attempt,
        };
        let session = match attempt {
            Ok(session) => Arc::new(session),
            Err(error) if error.is_permanent() => {
                error!(%error, "cannot provision the cascade topology");
                return Err(error);
            }
            Err(error) => {
                warn!(%error, retry_in_ms = backoff.as_millis() as u64, "RabbitMQ is not available");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(options.max_backoff);
                continue;
            }
        };
        backoff = INITIAL_BACKOFF;
        shared.session.send_replace(Some(session.clone()));
        info!(%uri, channels = options.channels, "connected to RabbitMQ, topology provisioned, accepting tasks");
        let lost = tokio::select! {
            _ = shutdown.cancelled() => None,
            reason = connection_lost(&session.connection) => Some(reason),
            _ = session.broken.cancelled() => Some("a publishing channel was closed".to_owned()),
        };
        shared.session.send_replace(None);
        close(&session.connection).await;
        match lost {
            None => return Ok(()),
            Some(reason) => warn!(%reason, "lost RabbitMQ; refusing tasks until reconnected"),
        }
    }
}
