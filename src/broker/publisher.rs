//! Publishing with confirms, over a connection that heals itself.
//!
//! A supervisor task owns the connection: it connects to the first broker
//! address that answers, provisions the topology, opens the publishing
//! channels in confirm mode and hands them out as one [`Session`]. When the
//! connection dies the session is withdrawn and rebuilt, trying the other
//! addresses first (a cluster's surviving nodes) and backing off only once
//! every address has failed.
//!
//! Publishes are spread over several channels and never wait for one another:
//! each awaits only its own confirm, so confirms are pipelined and throughput
//! grows with the number of concurrent requests. With two channels or more,
//! the first carries only due tasks ([`Publisher::publish_due`]): a task
//! released at its millisecond does not queue in a channel's mailbox behind
//! a batch of new tasks on their way into the cascade.
//!
//! What one message can do to the others is bounded:
//! - A message whose properties cannot fit the negotiated frame (the content
//!   header frame cannot be split) is refused before it is sent: sending it
//!   would make the broker close the whole connection, failing every publish
//!   in flight.
//! - A channel the broker closes because of one message is reopened on its
//!   own; the connection and the other channels go on.
//! - A message that failed while others were in flight with it can be
//!   retried alone on a connection of its own ([`IsolatedPublisher`]), so
//!   that if it is the culprit, it harms nobody and is recognised.
//!
//! While the broker blocks publishing (a memory or disk alarm) nothing is
//! sent: [`PublishError::Blocked`] answers at once. A publish never holds its
//! caller longer than the confirm timeout; one the broker has not answered by
//! then is handed back as a [`LateConfirm`], because the broker may still
//! take it (frames are buffered during a block), and a caller with a ledger
//! must not publish it again before knowing.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use amq_protocol::frame::WriteContext;
use futures_util::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::basic::gen_properties;
use lapin::{BasicProperties, Channel, Connection, Event};
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::publish_error::PublishError;
use super::returns::{Sent, own_outcome};
use super::settings::AmqpSettings;
use super::{BrokerError, Context, connect_with, open_channel, provision};
use crate::cascade::{Cascade, TopologyPlan};
use crate::message::Message;
use crate::secret::redact_uri;

const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// How often the supervisor double-checks a connection that reported no error.
const STATUS_POLL: Duration = Duration::from_millis(500);
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How many publishes that each take a channel alone may be in flight at
/// once ([`Publisher::publish_due_alone`]); the channels are opened as
/// needed and kept.
const ALONE_IN_FLIGHT: usize = 32;
/// RabbitMQ's default `frame_max`, assumed until a connection has negotiated one.
pub const DEFAULT_FRAME_MAX: usize = 131_072;

#[derive(Clone, Debug)]
pub struct PublisherOptions {
    /// Broker addresses, tried in order; a cluster's nodes.
    pub uris: Vec<String>,
    pub channels: usize,
    pub confirm_timeout: Duration,
    /// How long a publish past the confirm timeout is still awaited
    /// ([`LateConfirm::outcome`]).
    pub late_confirm_limit: Duration,
    pub connect_timeout: Duration,
    pub max_backoff: Duration,
    pub connection_name: String,
    /// Header bytes the broker adds on the way down the cascade: a message's
    /// own properties must leave this much of the frame free.
    pub header_reserve: usize,
    /// Observes the time from publish to confirm, in seconds.
    pub confirm_latency: Histogram,
    /// For `amqps://` addresses.
    pub tls: super::BrokerTls,
}

impl PublisherOptions {
    /// The publisher `[amqp]` describes, for `cascade`'s messages.
    pub fn from_settings(
        amqp: &AmqpSettings,
        cascade: &Cascade,
        confirm_latency: Histogram,
        tls: super::BrokerTls,
    ) -> Self {
        PublisherOptions {
            uris: amqp.uris(),
            channels: amqp.publish_channels,
            confirm_timeout: Duration::from_millis(amqp.confirm_timeout_ms),
            late_confirm_limit: amqp.late_confirm_limit(),
            connect_timeout: Duration::from_millis(amqp.connect_timeout_ms),
            max_backoff: Duration::from_millis(amqp.reconnect_max_backoff_ms),
            connection_name: format!("delayline {}", cascade.prefix()),
            header_reserve: cascade.dead_letter_header_bytes(),
            confirm_latency,
            tls,
        }
    }
}

/// A publish that outlived the confirm timeout. The broker may still take it
/// (a blocked connection sends it when the alarm clears), so whoever holds
/// this decides what happened by awaiting [`LateConfirm::outcome`] instead
/// of publishing the message again.
pub struct LateConfirm {
    publish: JoinHandle<Result<(), PublishError>>,
    /// The connection it was published on, told when the limit runs out.
    session: std::sync::Weak<Session>,
    /// The whole wait allowed, counted from the publish.
    limit: Duration,
    /// What is left of it when the confirm timeout ran out.
    remaining: Duration,
}

impl LateConfirm {
    /// Resolves when the broker confirms, refuses, or the connection dies,
    /// or once the publish has waited `amqp.late_confirm_limit_ms` in all:
    /// then it is a timeout that may have landed. A channel whose node lost
    /// its quorum (a partition, a paused VM) can stay open and never answer;
    /// a second copy is harmless (the release stage drops it), a task
    /// waiting for good is not.
    pub async fn outcome(self) -> Result<(), PublishError> {
        match tokio::time::timeout(self.remaining, self.publish).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(error)) => Err(PublishError::Unconfirmed {
                reason: format!("the publish task ended abnormally: {error}"),
                refused: false,
            }),
            Err(_) => {
                if let Some(session) = self.session.upgrade() {
                    session.unanswered();
                }
                Err(PublishError::Timeout(self.limit))
            }
        }
    }
}

/// Which of a session's channels a publish takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lane {
    /// New tasks, retries, copies: any channel but the first, in turn.
    Intake,
    /// Tasks released when due: the first channel, theirs alone.
    Due,
}

impl Lane {
    /// The channel of `channels` for the `turn`th publish.
    fn channel(self, turn: usize, channels: usize) -> usize {
        match (self, channels) {
            (_, 0 | 1) | (Lane::Due, _) => 0,
            (Lane::Intake, _) => 1 + turn % (channels - 1),
        }
    }
}

/// How a bounded publish ended.
pub enum Published {
    /// The broker owns the message.
    Confirmed,
    /// No answer within the confirm timeout; the broker may still take it.
    Late(LateConfirm),
}

/// What `/readyz` and the logs say about the broker connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BrokerStatus {
    /// Connected, provisioned and not blocked.
    pub ready: bool,
    /// The address in use (without its password).
    pub node: Option<String>,
    /// Why the broker blocks publishing, while it does.
    pub blocked: Option<String>,
    /// Why the last attempt to connect failed, while not connected.
    pub problem: Option<BrokerProblem>,
    /// Connections set up since the start: a count grown means delayline
    /// connected again, however briefly it was away.
    pub sessions: u64,
}

/// Why delayline is not connected to RabbitMQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerProblem {
    /// The broker's or the system's own words, password left out.
    pub reason: String,
    /// The broker refused delayline (credentials, vhost, permissions): only
    /// a configuration change will end it. Otherwise it is away.
    pub misconfigured: bool,
    /// A TLS certificate was refused (the broker's by delayline, or
    /// delayline's by the broker): misconfigured, without grace.
    pub certificate: bool,
    /// Since when problems of this kind have lasted.
    pub since: Instant,
}

impl BrokerProblem {
    /// The reason, as pending tasks' `last_error` and error answers give it.
    fn describe(problem: Option<&BrokerProblem>) -> String {
        match problem {
            Some(problem) => problem.reason.clone(),
            None => "connecting".to_owned(),
        }
    }
}

/// One connection's worth of publishing channels.
struct Session {
    connection: Connection,
    /// Index into the options' addresses.
    node: usize,
    channels: Vec<tokio::sync::Mutex<Channel>>,
    /// Channels with no publish in flight, for a publish to take alone.
    idle_alone: Mutex<Vec<Channel>>,
    alone_permits: Arc<tokio::sync::Semaphore>,
    /// The broker's reason for blocking, from its `connection.blocked`.
    blocked_reason: Mutex<Option<String>>,
    /// Told when a publish went unanswered past the late confirm limit
    /// while the connection was not blocked.
    stalled: tokio::sync::Notify,
}

struct Shared {
    session: watch::Sender<Option<Arc<Session>>>,
    next_channel: AtomicUsize,
    options: PublisherOptions,
    plan: TopologyPlan,
    /// Why the last connection attempt failed; cleared once connected.
    problem: Mutex<Option<BrokerProblem>>,
    /// Connections set up so far (see [`BrokerStatus::sessions`]).
    sessions: AtomicU64,
}

impl Shared {
    fn problem(&self) -> Option<BrokerProblem> {
        self.problem.lock().ok().and_then(|problem| problem.clone())
    }

    fn unavailable(&self) -> PublishError {
        PublishError::Unavailable(BrokerProblem::describe(self.problem().as_ref()))
    }

    /// Records a failed attempt; a problem of the same kind keeps its start.
    fn record_problem(&self, error: &BrokerError) {
        let misconfigured = error.is_misconfiguration();
        if let Ok(mut problem) = self.problem.lock() {
            let since = problem
                .as_ref()
                .filter(|p| p.misconfigured == misconfigured)
                .map_or_else(Instant::now, |p| p.since);
            *problem = Some(BrokerProblem {
                reason: error.to_string(),
                misconfigured,
                certificate: error.is_certificate_problem(),
                since,
            });
        }
    }
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
        assert!(!options.uris.is_empty(), "at least one broker address");
        let shared = Arc::new(Shared {
            session: watch::Sender::new(None),
            next_channel: AtomicUsize::new(0),
            options,
            plan,
            problem: Mutex::new(None),
            sessions: AtomicU64::new(0),
        });
        let supervisor = tokio::spawn(supervise(shared.clone(), shutdown));
        (Publisher { shared }, supervisor)
    }

    /// Connected, provisioned and not blocked by a broker resource alarm.
    pub fn is_ready(&self) -> bool {
        self.shared
            .session
            .borrow()
            .as_ref()
            .is_some_and(|s| s.is_ready())
    }

    pub fn status(&self) -> BrokerStatus {
        let session = self.shared.session.borrow().clone();
        let sessions = self.shared.sessions.load(Ordering::Relaxed);
        match session {
            None => BrokerStatus {
                problem: self.shared.problem(),
                sessions,
                ..BrokerStatus::default()
            },
            Some(session) => BrokerStatus {
                ready: session.is_ready(),
                node: Some(redact_uri(&self.shared.options.uris[session.node])),
                blocked: session.blocked(),
                problem: None,
                sessions,
            },
        }
    }

    /// The current connection, when there is one.
    pub fn connection(&self) -> Option<SharedConnection> {
        self.shared.session.borrow().clone().map(SharedConnection)
    }

    /// The address (with its credentials) of the node in use.
    pub(crate) fn node_uri(&self) -> Option<String> {
        let node = self.shared.session.borrow().as_ref()?.node;
        Some(self.shared.options.uris[node].clone())
    }

    /// Declares the whole topology again on the current connection: for a
    /// level that holds messages it cannot dead-letter, whose dead-letter
    /// exchange may be missing.
    pub async fn redeclare_topology(&self) -> Result<(), BrokerError> {
        let Some(connection) = self.connection() else {
            return Ok(());
        };
        provision(&connection, &self.shared.plan).await.map(|_| ())
    }

    /// The most bytes a message's properties (headers included) may take:
    /// the negotiated frame size, or the broker's default before any
    /// connection, less the dead-lettering reserve.
    pub fn properties_limit(&self) -> usize {
        let frame_max = self
            .shared
            .session
            .borrow()
            .as_ref()
            .map_or(DEFAULT_FRAME_MAX, |s| {
                s.connection.configuration().frame_max() as usize
            });
        frame_max.saturating_sub(self.shared.options.header_reserve)
    }

    /// Refuses, without sending anything, a message the broker could not take.
    pub fn check_fits(&self, message: &Message) -> Result<(), PublishError> {
        fits(&message.properties, self.properties_limit())
    }

    /// Publishes and waits for the confirm; a late confirm is a timeout.
    pub async fn publish(&self, message: Message) -> Result<(), PublishError> {
        match self.publish_bounded(message).await? {
            Published::Confirmed => Ok(()),
            Published::Late(_) => Err(PublishError::Timeout(self.shared.options.confirm_timeout)),
        }
    }

    /// Publishes persistently and with `mandatory`. `Confirmed` means the
    /// broker owns the message; the whole call takes at most the confirm
    /// timeout, after which the publish goes on as a [`LateConfirm`].
    pub async fn publish_bounded(&self, message: Message) -> Result<Published, PublishError> {
        self.publish_on(Lane::Intake, message).await
    }

    /// As [`Publisher::publish_bounded`], on the channel kept for due tasks.
    pub async fn publish_due(&self, message: Message) -> Result<Published, PublishError> {
        self.publish_on(Lane::Due, message).await
    }

    /// As [`Publisher::publish_due`], for a message the broker may well
    /// return (to an exchange of the user's, which has no alternate
    /// exchange): on a channel no other publish uses while it is in flight,
    /// so that a return its confirm carries is its own (see
    /// [`super::returns`]).
    pub async fn publish_due_alone(&self, message: Message) -> Result<Published, PublishError> {
        let session = self.ready_session(&message)?;
        // Bounded as the whole publish is: permits held by late confirms
        // (a blocked broker) must not hold the caller for good.
        let timeout = self.shared.options.confirm_timeout;
        let permit = tokio::time::timeout(timeout, session.alone_permits.clone().acquire_owned())
            .await
            .map_err(|_| {
                PublishError::Broker(format!(
                    "all {ALONE_IN_FLIGHT} channels for messages published alone stayed busy \
                     for {timeout:?}; nothing was sent"
                ))
            })?
            .map_err(|_| self.shared.unavailable())?;
        let channel = session.alone_channel().await?;
        let latency = self.shared.options.confirm_latency.clone();
        let holder = session.clone();
        let publish = tokio::spawn(async move {
            let outcome = publish_confirmed(channel.clone(), message, latency).await;
            session.idle(channel);
            drop(permit);
            outcome
        });
        self.bounded(publish, &holder).await
    }

    /// The session to publish `message` on: connected, not blocked, and
    /// the message fits its frames.
    fn ready_session(&self, message: &Message) -> Result<Arc<Session>, PublishError> {
        let session = self.shared.session.borrow().clone();
        let session = session.ok_or_else(|| self.shared.unavailable())?;
        if let Some(reason) = session.blocked() {
            return Err(PublishError::Blocked(reason));
        }
        fits(&message.properties, self.properties_limit())?;
        Ok(session)
    }

    async fn publish_on(&self, lane: Lane, message: Message) -> Result<Published, PublishError> {
        let session = self.ready_session(&message)?;
        let turn = self.shared.next_channel.fetch_add(1, Ordering::Relaxed);
        let index = lane.channel(turn, session.channels.len());
        let channel = session.channel(index, &self.shared.plan).await?;
        let latency = self.shared.options.confirm_latency.clone();
        let mut publish = Box::pin(publish_confirmed(channel, message, latency));
        // lapin queues a publish's frames (and numbers its confirm) on its
        // first poll: polled here, before it is spawned, messages leave in
        // the order their callers got here (the limiter releases in due
        // order); a spawned task's first poll comes in no promised order.
        if let std::task::Poll::Ready(outcome) = futures_util::poll!(publish.as_mut()) {
            return outcome.map(|()| Published::Confirmed);
        }
        self.bounded_in_place(publish, &session).await
    }

    /// The publish's outcome within the confirm timeout, awaited where it
    /// was made; one still unconfirmed then goes on in a task of its own, a
    /// late confirm. A task of its own for every publish cost a burst's
    /// release a spawn and a second wake per message.
    async fn bounded_in_place<F>(
        &self,
        mut publish: Pin<Box<F>>,
        session: &Arc<Session>,
    ) -> Result<Published, PublishError>
    where
        F: Future<Output = Result<(), PublishError>> + Send + 'static,
    {
        let timeout = self.shared.options.confirm_timeout;
        match tokio::time::timeout(timeout, publish.as_mut()).await {
            Ok(outcome) => outcome.map(|()| Published::Confirmed),
            Err(_) => Ok(self.late(tokio::spawn(publish), session)),
        }
    }

    /// The publish's outcome within the confirm timeout, or a late confirm,
    /// for a publish already in a task of its own: one published alone,
    /// whose channel must go back to the idle ones however its caller ends.
    async fn bounded(
        &self,
        mut publish: JoinHandle<Result<(), PublishError>>,
        session: &Arc<Session>,
    ) -> Result<Published, PublishError> {
        let timeout = self.shared.options.confirm_timeout;
        match tokio::time::timeout(timeout, &mut publish).await {
            Ok(Ok(result)) => result.map(|()| Published::Confirmed),
            Ok(Err(error)) => Err(PublishError::Unconfirmed {
                reason: format!("the publish task ended abnormally: {error}"),
                refused: false,
            }),
            Err(_) => Ok(self.late(publish, session)),
        }
    }

    /// A publish the confirm timeout ran out on, awaited up to the late
    /// confirm limit.
    fn late(
        &self,
        publish: JoinHandle<Result<(), PublishError>>,
        session: &Arc<Session>,
    ) -> Published {
        let limit = self.shared.options.late_confirm_limit;
        Published::Late(LateConfirm {
            publish,
            session: Arc::downgrade(session),
            limit,
            remaining: limit.saturating_sub(self.shared.options.confirm_timeout),
        })
    }

    /// A connection of its own for publishing messages one at a time, on the
    /// node the publisher uses. See [`IsolatedPublisher`].
    pub fn isolated(&self) -> IsolatedPublisher {
        IsolatedPublisher {
            publisher: self.clone(),
            connection: None,
        }
    }
}

/// Publishes one message at a time on a connection nothing else uses, so a
/// message that makes the broker close its channel or connection harms no
/// other message, and a [`PublishError::Unconfirmed`] with `refused` set is
/// that message's own fault. Connects lazily; reconnects after a failure.
pub struct IsolatedPublisher {
    publisher: Publisher,
    connection: Option<(Connection, Channel)>,
}

impl IsolatedPublisher {
    pub async fn publish(&mut self, message: Message) -> Result<(), PublishError> {
        let main = self.publisher.status();
        if !main.ready {
            return Err(match main.blocked {
                Some(reason) => PublishError::Blocked(reason),
                None => self.publisher.shared.unavailable(),
            });
        }
        fits(&message.properties, self.publisher.properties_limit())?;
        let channel = match &self.connection {
            Some((connection, channel))
                if connection.status().connected() && channel.status().connected() =>
            {
                channel.clone()
            }
            _ => {
                self.close().await;
                let options = &self.publisher.shared.options;
                let unavailable = |error: String| PublishError::Unavailable(error);
                let node = self
                    .publisher
                    .node_uri()
                    .ok_or_else(|| self.publisher.shared.unavailable())?;
                let name = format!("{} (isolated)", options.connection_name);
                let connection = tokio::time::timeout(
                    options.connect_timeout,
                    connect_with(&node, &name, &options.tls),
                )
                .await
                .map_err(|_| unavailable("no answer to an isolated connection".to_owned()))?
                .map_err(|error| unavailable(error.to_string()))?;
                let channel = match open_confirm_channel(&connection).await {
                    Ok(channel) => channel,
                    Err(error) => {
                        close(&connection).await;
                        return Err(unavailable(error.to_string()));
                    }
                };
                self.connection = Some((connection, channel.clone()));
                channel
            }
        };
        let latency = self.publisher.shared.options.confirm_latency.clone();
        let timeout = self.publisher.shared.options.confirm_timeout;
        match tokio::time::timeout(timeout, publish_confirmed(channel, message, latency)).await {
            Ok(result) => result,
            Err(_) => {
                // Nothing else rides on this connection: dropping it is cheap.
                self.close().await;
                Err(PublishError::Timeout(timeout))
            }
        }
    }

    pub async fn close(&mut self) {
        if let Some((connection, _)) = self.connection.take() {
            close(&connection).await;
        }
    }
}

/// The message's content header frame, as it would be sent, must fit `limit`.
fn fits(properties: &BasicProperties, limit: usize) -> Result<(), PublishError> {
    let size = content_header_frame_size(properties);
    if size > limit {
        return Err(PublishError::TooLarge { size, limit });
    }
    Ok(())
}

/// Frame header (type, channel, size: 7), class id, weight and body size
/// (12), and the frame end (1) around a content header's properties.
const CONTENT_HEADER_FRAMING: usize = 20;

/// Bytes of the content header frame carrying `properties`, framing included:
/// what the broker compares with `frame_max`.
pub fn content_header_frame_size(properties: &BasicProperties) -> usize {
    gen_properties(properties)(WriteContext::from(Vec::new()))
        .map(|written| written.write.len() + CONTENT_HEADER_FRAMING)
        // Serialising into memory cannot fail; if it did, refuse the message.
        .unwrap_or(usize::MAX)
}

async fn publish_confirmed(
    channel: Channel,
    message: Message,
    latency: Histogram,
) -> Result<(), PublishError> {
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let message_id = message.properties.message_id().clone();
    let started = Instant::now();
    let confirm = channel
        .basic_publish(
            message.exchange.as_str().into(),
            message.routing_key.as_str().into(),
            options,
            &message.payload,
            message.properties,
        )
        .await
        .map_err(|e| match e.kind() {
            // Refused before anything was written.
            lapin::ErrorKind::InvalidChannelState(..)
            | lapin::ErrorKind::InvalidConnectionState(_) => PublishError::Broker(e.to_string()),
            // The frames may have reached the broker before the socket failed.
            _ => PublishError::unconfirmed(&e),
        })?;
    let confirmation = confirm.await.map_err(|e| PublishError::unconfirmed(&e))?;
    latency.observe(started.elapsed().as_secs_f64());
    let sent = Sent {
        exchange: &message.exchange,
        routing_key: &message.routing_key,
        message_id,
        payload: &message.payload,
    };
    own_outcome(confirmation, &sent)
}

impl Session {
    fn is_ready(&self) -> bool {
        let status = self.connection.status();
        status.connected() && !status.blocked()
    }

    /// A publish went unanswered past the late confirm limit. Unless the
    /// broker blocks publishing (an alarm holds every node's publishes
    /// alike), the node is taken for one that can no longer confirm (cut
    /// off from its quorum, or left running apart after a partition): the
    /// next publish would wait as long, so the supervisor connects again,
    /// another node first.
    fn unanswered(&self) {
        if self.blocked().is_none() {
            self.stalled.notify_one();
        }
    }

    fn blocked(&self) -> Option<String> {
        if !self.connection.status().blocked() {
            return None;
        }
        let reason = self
            .blocked_reason
            .lock()
            .ok()
            .and_then(|reason| reason.clone());
        Some(reason.unwrap_or_else(|| "a resource alarm".to_owned()))
    }

    /// A channel with no publish in flight: an idle one, or a new one.
    async fn alone_channel(&self) -> Result<Channel, PublishError> {
        let idle = self.idle_alone.lock().ok().and_then(|mut idle| idle.pop());
        if let Some(channel) = idle.filter(|channel| channel.status().connected()) {
            return Ok(channel);
        }
        open_confirm_channel(&self.connection)
            .await
            .map_err(|error| PublishError::Broker(error.to_string()))
    }

    /// `channel` has no publish in flight any more.
    fn idle(&self, channel: Channel) {
        if let Ok(mut idle) = self.idle_alone.lock() {
            idle.push(channel);
        }
    }

    /// Publishing channel `index`, reopened if the broker closed it: a
    /// channel error is about one message, not a reason to drop the others.
    /// The topology is declared again first, because the commonest reason
    /// is an exchange that was deleted under the cascade.
    async fn channel(&self, index: usize, plan: &TopologyPlan) -> Result<Channel, PublishError> {
        let mut slot = self.channels[index].lock().await;
        if slot.status().connected() {
            return Ok(slot.clone());
        }
        if !self.connection.status().connected() {
            return Err(PublishError::Unavailable(
                "the connection was lost".to_owned(),
            ));
        }
        let reopened = async {
            provision(&self.connection, plan).await?;
            open_confirm_channel(&self.connection).await
        };
        let channel = reopened
            .await
            .map_err(|error| PublishError::Broker(error.to_string()))?;
        debug!(
            index,
            "reopened a publishing channel the broker had closed, topology declared again"
        );
        *slot = channel.clone();
        Ok(channel)
    }
}

async fn open_confirm_channel(connection: &Connection) -> Result<Channel, BrokerError> {
    let channel = open_channel(connection, || "opening a publishing channel".to_owned()).await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .context(|| "enabling publisher confirms".to_owned())?;
    Ok(channel)
}

async fn establish(
    options: &PublisherOptions,
    node: usize,
    plan: &TopologyPlan,
) -> Result<Session, BrokerError> {
    let uri = &options.uris[node];
    let connection = tokio::time::timeout(
        options.connect_timeout,
        connect_with(uri, &options.connection_name, &options.tls),
    )
    .await
    .map_err(|_| BrokerError::ConnectTimeout {
        uri: redact_uri(uri),
        after: options.connect_timeout,
    })??;
    let channels = async {
        provision(&connection, plan).await?;
        let mut channels = Vec::with_capacity(options.channels);
        for _ in 0..options.channels {
            channels.push(tokio::sync::Mutex::new(
                open_confirm_channel(&connection).await?,
            ));
        }
        Ok(channels)
    }
    .await;
    match channels {
        Ok(channels) => Ok(Session {
            connection,
            node,
            channels,
            idle_alone: Mutex::new(Vec::new()),
            alone_permits: Arc::new(tokio::sync::Semaphore::new(ALONE_IN_FLIGHT)),
            blocked_reason: Mutex::new(None),
            stalled: tokio::sync::Notify::new(),
        }),
        Err(error) => {
            close(&connection).await;
            Err(error)
        }
    }
}

/// Tries every address once, starting with `first`; the error is the last one's.
async fn establish_any(
    options: &PublisherOptions,
    first: usize,
    plan: &TopologyPlan,
) -> Result<Session, BrokerError> {
    let count = options.uris.len();
    let mut last_error = None;
    for offset in 0..count {
        let node = (first + offset) % count;
        match establish(options, node, plan).await {
            Ok(session) => return Ok(session),
            Err(error) if error.is_permanent() => return Err(error),
            Err(error) => {
                if count > 1 {
                    warn!(%error, "broker address not usable; trying the next");
                }
                // What only an operator can fix says more than a node that is away.
                if !last_error
                    .as_ref()
                    .is_some_and(BrokerError::is_misconfiguration)
                {
                    last_error = Some(error);
                }
            }
        }
    }
    Err(last_error.expect("at least one broker address"))
}

async fn close(connection: &Connection) {
    let _ = tokio::time::timeout(
        CLOSE_TIMEOUT,
        connection.close(200, "delayline stopping".into()),
    )
    .await;
}

/// Resolves with the reason once the session's connection is no longer
/// usable; records the broker's blocking and unblocking on the way.
async fn connection_lost(session: &Session) -> String {
    let connection = &session.connection;
    let mut events = Box::pin(connection.events_listener());
    let mut poll = tokio::time::interval(STATUS_POLL);
    loop {
        tokio::select! {
            event = events.next() => match event {
                // A channel closed by the broker (a failed passive declare of
                // the depth poller, or a message it refused) is reported here
                // too, but leaves the connection open; a publishing channel is
                // reopened by the next publish that needs it.
                Some(Event::Error(error)) if connection.status().connected() => {
                    debug!(%error, "a channel was closed; the connection is still open");
                }
                Some(Event::Error(error)) => return error.to_string(),
                Some(Event::ConnectionBlocked(reason)) => {
                    warn!(%reason, "RabbitMQ blocks publishing: new tasks wait in the ledger (503 without one)");
                    if let Ok(mut blocked) = session.blocked_reason.lock() {
                        *blocked = Some(reason);
                    }
                }
                Some(Event::ConnectionUnblocked) => info!("RabbitMQ unblocked publishing"),
                Some(_) => {}
                None => return "the connection's event stream ended".to_owned(),
            },
            _ = poll.tick() => {
                if !connection.status().connected() {
                    return "the connection is no longer open".to_owned();
                }
            }
            () = session.stalled.notified() => {
                return "a publish went unanswered past amqp.late_confirm_limit_ms: the node \
                        may be cut off from its peers"
                    .to_owned();
            }
        }
    }
}

async fn supervise(shared: Arc<Shared>, shutdown: CancellationToken) -> Result<(), BrokerError> {
    let options = &shared.options;
    let plan = &shared.plan;
    let mut backoff = INITIAL_BACKOFF;
    let mut first = 0;
    loop {
        let attempt = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            attempt = establish_any(options, first, plan) => attempt,
        };
        let session = match attempt {
            Ok(session) => Arc::new(session),
            Err(error) if error.is_permanent() => {
                error!(%error, "cannot provision the cascade topology");
                return Err(error);
            }
            Err(error) => {
                shared.record_problem(&error);
                let retry_in_ms = backoff.as_millis() as u64;
                if error.is_certificate_problem() {
                    error!(
                        %error,
                        retry_in_ms,
                        "TLS towards RabbitMQ failed over a certificate: check amqp.tls.ca_file \
                         (the CA that signed the broker's certificate), the host name in \
                         amqp.uri (it must be in the certificate), and amqp.tls.cert_file if the \
                         broker asks for one; tasks wait in the ledger meanwhile"
                    );
                } else if error.is_misconfiguration() {
                    error!(
                        %error,
                        retry_in_ms,
                        "RabbitMQ refuses delayline: check amqp.uri (user, password, vhost) and \
                         the user's permissions; tasks wait in the ledger meanwhile"
                    );
                } else {
                    warn!(%error, retry_in_ms, "RabbitMQ is not available");
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(options.max_backoff);
                continue;
            }
        };
        backoff = INITIAL_BACKOFF;
        if let Ok(mut problem) = shared.problem.lock() {
            *problem = None;
        }
        let node = redact_uri(&options.uris[session.node]);
        shared.sessions.fetch_add(1, Ordering::Relaxed);
        shared.session.send_replace(Some(session.clone()));
        info!(
            %node,
            channels = options.channels,
            frame_max = session.connection.configuration().frame_max(),
            "connected to RabbitMQ, topology provisioned, publishing"
        );
        let lost = tokio::select! {
            _ = shutdown.cancelled() => None,
            reason = connection_lost(&session) => Some(reason),
        };
        shared.session.send_replace(None);
        close(&session.connection).await;
        match lost {
            None => return Ok(()),
            Some(reason) => {
                warn!(%reason, %node, "lost RabbitMQ; reconnecting, other addresses first");
                // The node just lost is tried last.
                first = (session.node + 1) % options.uris.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::{AMQPValue, FieldTable};

    use super::*;

    #[test]
    fn due_tasks_have_the_first_channel_to_themselves_when_there_are_two_or_more() {
        for turn in 0..10 {
            assert_eq!(Lane::Due.channel(turn, 4), 0);
            assert_eq!(Lane::Intake.channel(turn, 4), 1 + turn % 3);
            assert_eq!(Lane::Intake.channel(turn, 1), 0);
            assert_eq!(Lane::Due.channel(turn, 1), 0);
        }
    }

    #[test]
    fn the_frame_size_is_the_size_of_the_frame_sent() {
        use amq_protocol::frame::{AMQPContentHeader, AMQPFrame, gen_frame};
        let mut headers = FieldTable::default();
        headers.insert("k".into(), AMQPValue::LongLongInt(7));
        let properties = BasicProperties::default()
            .with_message_id("id".into())
            .with_headers(headers);
        let frame = AMQPFrame::Header(
            1,
            AMQPContentHeader {
                class_id: 60,
                body_size: 12,
                properties: properties.clone(),
            },
        );
        let sent = gen_frame(&frame)(WriteContext::from(Vec::new()))
            .unwrap()
            .write
            .len();
        assert_eq!(content_header_frame_size(&properties), sent);
    }

    #[test]
    fn the_frame_size_counts_every_header_byte() {
        let mut headers = FieldTable::default();
        let empty = content_header_frame_size(&BasicProperties::default());
        // Frame header (7) + class, weight, body size (12) + flags (2) + frame end (1).
        assert_eq!(empty, 22);
        headers.insert("k".into(), AMQPValue::LongString("x".repeat(1000).into()));
        let one = content_header_frame_size(&BasicProperties::default().with_headers(headers));
        // Table length (4) + name (1 + 1) + type (1) + string length (4) + 1000.
        assert_eq!(one - empty, 4 + 2 + 1 + 4 + 1000);
        assert!(fits(&BasicProperties::default(), empty).is_ok());
        assert_eq!(
            fits(&BasicProperties::default(), empty - 1),
            Err(PublishError::TooLarge {
                size: empty,
                limit: empty - 1
            })
        );
    }
}
