//! Runs the whole service in three visible stages: [`Components::build`]
//! makes each component from its own section of the settings (refusing
//! before anything runs what could never work), [`Components::start`] runs
//! them, and [`Running::stop`] stops them in [`STOP_ORDER`], the order that
//! loses nothing.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::http::serve::{ConnectionLimits, https_config, serve};
use crate::telemetry::TaskTracer;
use axum_server::tls_rustls::RustlsConfig;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::auth::{AuthError, Authenticator};
use crate::broker::{BrokerError, BrokerTls, Publisher, PublisherOptions};
use crate::cascade::Cascade;
use crate::cascade::TopologyPlan;
use crate::config::Settings;
use crate::http::{AppState, MetricsRoute, Reloader, metrics_router, router};
use crate::ingress::{Ingress, IngressRunner, Retries, RetryBook, RetryRunner, plan_with};
use crate::ledger::{self, Ledger, LedgerError};
use crate::metrics::{Metrics, poll_queue_depths};
use crate::scheduler::{Broker, Scheduler};
use crate::stop::{Named, join_until};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("HTTP server: {0}")]
    Http(#[from] std::io::Error),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("HTTPS: {0}")]
    Tls(String),
    #[error("metrics listener on {bind}: {source}")]
    MetricsBind {
        bind: String,
        source: std::io::Error,
    },
    #[error("the broker supervisor stopped unexpectedly: {0}")]
    Supervisor(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// Serves `cascade` (the one `settings` describe, validated by
/// [`Settings::load`] or [`Settings::cascade`]) until `shutdown` resolves.
///
/// The ledger is opened and migrated first: without it nothing could be
/// promised. The listener then answers at once; until the broker is connected
/// and the topology provisioned, tasks wait in the ledger as pending (or get
/// 503 without one). A conflicting topology stops the service with an error:
/// no amount of retrying would fix it. However the service ends, it stops in
/// [`STOP_ORDER`], and the ledger is closed last.
pub async fn run(
    settings: Settings,
    cascade: Cascade,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    let components = Components::build(&settings, cascade, listener.local_addr()?).await?;
    let (mut running, api) = components.start(&settings, shutdown)?;
    let outcome = running.serve_until_stopped(listener, api).await;
    let deadline = running.deadline();
    outcome.and(running.stop(deadline).await)
}

/// The steps of stopping a running service, each begun once the one before
/// it has finished, all within `stop.timeout_ms` of the signal: what still
/// runs then is abandoned, as a crash would leave it (see [`crate::stop`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The listeners stop taking requests; those in progress finish, so
    /// every publish they started has its confirm or its pending row.
    Listeners,
    /// The forwarder finishes its round, the release stage its window, the
    /// pollers their tick.
    Background,
    /// The spans made so far are sent (when spans are sent at all): every
    /// release that made one has finished.
    Spans,
    /// Only now the broker connection closes: nothing publishes any more.
    Broker,
    /// Closing the connection decided every late confirm: record them.
    LateConfirms,
    /// Last, so that everything above could still write.
    Ledger,
}

/// The order a running service stops in (see [`Stop`]).
pub const STOP_ORDER: [Stop; 6] = [
    Stop::Listeners,
    Stop::Background,
    Stop::Spans,
    Stop::Broker,
    Stop::LateConfirms,
    Stop::Ledger,
];

/// What the service runs, built from its settings, before anything runs.
struct Components {
    address: SocketAddr,
    auth: Arc<Authenticator>,
    tls: Option<RustlsConfig>,
    metrics_listener: Option<TcpListener>,
    broker_tls: BrokerTls,
    cascade: Arc<Cascade>,
    metrics: Arc<Metrics>,
    ledger: Option<Ledger>,
    ingresses: Vec<Ingress>,
    retries: Option<Retries>,
}

impl Components {
    /// Refuses, before anything is opened, an open API on a network, a
    /// clients file that does not read, a certificate that does not load;
    /// then opens the ledger.
    async fn build(
        settings: &Settings,
        cascade: Cascade,
        address: SocketAddr,
    ) -> Result<Components, ServiceError> {
        let auth = Arc::new(Authenticator::from_settings(
            &settings.auth,
            &address.to_string(),
            settings.store.has_ledger(),
        )?);
        let tls = match &settings.http.tls {
            tls if tls.enabled() => Some(RustlsConfig::from_config(
                https_config(&tls.cert_file, &tls.key_file).map_err(ServiceError::Tls)?,
            )),
            _ => None,
        };
        let metrics_listener =
            match settings.metrics.bind.as_str() {
                "" => None,
                bind => Some(TcpListener::bind(bind).await.map_err(|source| {
                    ServiceError::MetricsBind {
                        bind: bind.to_owned(),
                        source,
                    }
                })?),
            };
        let broker_tls = BrokerTls::from_settings(&settings.amqp.tls)?;
        let ingresses = settings.ingresses(&cascade)?;
        let retries = settings.retries(&cascade)?;
        let metrics = Arc::new(Metrics::new());
        let ledger = ledger::open(
            &settings.store,
            cascade.release_stage(),
            crate::ledger::CommitObservers {
                group_size: metrics.ledger_commit_group.clone(),
                seconds: metrics.ledger_commit_seconds.clone(),
            },
        )
        .await?;
        if let Some(ledger) = &ledger {
            ledger.warn_of_database_settings().await;
        }
        // Before this process takes a lease of its own; bounded and never
        // fatal: a ledger another process keeps locked leaves the leases
        // to run out, as before.
        let ended = match &ledger {
            Some(ledger) => take_over_leases(ledger).await,
            None => None,
        };
        log_chain(&cascade, ledger.as_ref());
        // After the chain line, which starts every log.
        log_access(&auth, &address);
        if let Some(tasks) = ended.filter(|ended| *ended > 0) {
            info!(
                tasks,
                "took over the leases a stopped delayline left: its tasks go on now"
            );
        }
        Ok(Components {
            address,
            auth,
            tls,
            metrics_listener,
            broker_tls,
            cascade: Arc::new(cascade),
            metrics,
            ledger,
            ingresses,
            retries,
        })
    }

    /// What the broker supervisor declares: the chain, with the ingresses'
    /// objects, claimed for the ledger when there is one.
    fn plan(&self) -> TopologyPlan {
        let plan = plan_with(&self.cascade, &self.ingresses, self.retries.as_ref());
        match &self.ledger {
            Some(ledger) => plan.owned_by(ledger.identity()),
            None => plan,
        }
    }

    /// The retry policies in force, and their objects: none without the
    /// release stage.
    fn retry_book(&mut self, scheduler: &Scheduler) -> Option<Arc<RetryBook>> {
        let ledger = scheduler.own_ledger().cloned();
        let retries = self.retries.take()?;
        Some(Arc::new(RetryBook::new(
            retries,
            self.cascade.clone(),
            ledger,
        )))
    }

    /// The broker supervisor, started: its publisher, its task, and the
    /// token that stops it.
    fn start_broker(
        &self,
        settings: &Settings,
    ) -> (
        Publisher,
        JoinHandle<Result<(), BrokerError>>,
        CancellationToken,
    ) {
        let broker_shutdown = CancellationToken::new();
        let options = PublisherOptions::from_settings(
            &settings.amqp,
            &self.cascade,
            self.metrics.confirm_latency.clone(),
            self.broker_tls.clone(),
        );
        let (publisher, supervisor) =
            Publisher::start(options, self.plan(), broker_shutdown.clone());
        (publisher, supervisor, broker_shutdown)
    }

    /// Starts the broker supervisor, the scheduler's background work, the
    /// pollers, the reloader and the metrics listener; returns them, and the
    /// API for [`Running::serve_until_stopped`].
    fn start(
        mut self,
        settings: &Settings,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(Running, Api), ServiceError> {
        let (publisher, supervisor, broker_shutdown) = self.start_broker(settings);
        let broker: Arc<dyn Broker> = Arc::new(publisher.clone());
        let spans_shutdown = CancellationToken::new();
        let (tracer, spans) = TaskTracer::start(&settings.trace, spans_shutdown.clone());
        let scheduler = Scheduler::new(
            broker.clone(),
            self.ledger.take(),
            self.cascade.clone(),
            self.metrics.clone(),
            settings.scheduler(),
            tracer,
        );
        let mut running = Running {
            stop_serving: CancellationToken::new(),
            stop_asked: Arc::new(OnceLock::new()),
            bound: settings.stop.timeout(),
            background_shutdown: CancellationToken::new(),
            background: Vec::new(),
            broker_shutdown,
            supervisor,
            scheduler: scheduler.clone(),
            spans_shutdown,
            spans,
        };
        running.background = scheduler.spawn_background(running.background_shutdown.clone());
        running.spawn_pollers(settings, publisher, &self, &scheduler);
        let book = self.retry_book(&scheduler);
        let ingresses = std::mem::take(&mut self.ingresses);
        running.spawn_ingresses((ingresses, book.clone()), &broker, &self, &scheduler);
        let reloader = Reloader {
            auth: self.auth.clone(),
            tls: (self.tls.clone()).map(|config| (config, settings.http.tls.clone())),
            check_every: (settings.http.reload_check_ms > 0)
                .then(|| Duration::from_millis(settings.http.reload_check_ms)),
        };
        running.spawn_watches(shutdown, reloader);
        let state = AppState::new(scheduler, self.metrics.clone(), &settings.http, self.auth)
            .with_operator(settings.operator(&self.cascade))
            .with_retries(book);
        let limits = settings.http.connection_limits();
        let metrics_route = match &self.metrics_listener {
            Some(_) => MetricsRoute::Elsewhere,
            None => MetricsRoute::WithApi,
        };
        let console = settings.console.enabled;
        let app = router(state.clone(), &settings.http, metrics_route, console);
        if let Some(listener) = self.metrics_listener {
            info!(address = %listener.local_addr()?, "serving /metrics on its own listener");
            // The same accept loop and bounds as the API's: it is open, so a
            // slow client must not hold it either.
            running.spawn(
                "the metrics listener",
                serve(
                    listener,
                    metrics_router(state),
                    None,
                    limits,
                    self.metrics.clone(),
                    running.stop_serving.clone(),
                ),
            );
        }
        let api = Api {
            address: self.address,
            app,
            tls: self.tls,
            limits,
            metrics: self.metrics,
        };
        Ok((running, api))
    }
}

/// The API, ready to serve on the listener `run` was given.
struct Api {
    address: SocketAddr,
    app: axum::Router,
    tls: Option<RustlsConfig>,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
}

/// A running service: what stopping it must stop.
struct Running {
    stop_serving: CancellationToken,
    /// When the stop was asked for (the signal), if it was.
    stop_asked: Arc<OnceLock<Instant>>,
    /// How long the stop may take from then.
    bound: Duration,
    background_shutdown: CancellationToken,
    background: Vec<Named>,
    broker_shutdown: CancellationToken,
    supervisor: JoinHandle<Result<(), BrokerError>>,
    scheduler: Scheduler,
    spans_shutdown: CancellationToken,
    /// The task sending spans to a collector, when one is configured.
    spans: Option<JoinHandle<()>>,
}

impl Running {
    fn spawn(&mut self, name: &'static str, work: impl Future<Output = ()> + Send + 'static) {
        self.background.push(Named::spawn(name, work));
    }

    /// When the stop must be over: its bound after the signal, or after now
    /// when the service ends on its own (the broker side ended it).
    fn deadline(&self) -> Instant {
        deadline(&self.stop_asked, self.bound)
    }

    /// The watch that stops the listeners on `shutdown`, and the one that
    /// reloads clients and the certificate on SIGHUP and when their files change.
    fn spawn_watches(
        &mut self,
        shutdown: impl Future<Output = ()> + Send + 'static,
        reloader: Reloader,
    ) {
        let watch = stop_serving_on(
            shutdown,
            self.stop_serving.clone(),
            self.stop_asked.clone(),
            self.background_shutdown.clone(),
        );
        self.spawn("the signal watch", watch);
        let reloader = reloader.run(self.background_shutdown.clone());
        self.spawn("the reloader", reloader);
    }

    /// One consumer per AMQP ingress, and the retry intake's, stopped with
    /// the listeners: no new task is taken in while the service drains.
    fn spawn_ingresses(
        &mut self,
        (ingresses, book): (Vec<Ingress>, Option<Arc<RetryBook>>),
        broker: &Arc<dyn Broker>,
        components: &Components,
        scheduler: &Scheduler,
    ) {
        for ingress in ingresses {
            let runner = IngressRunner {
                ingress: Arc::new(ingress),
                cascade: components.cascade.clone(),
                scheduler: scheduler.clone(),
                broker: broker.clone(),
                metrics: components.metrics.clone(),
            };
            self.spawn("an AMQP ingress", runner.run(self.stop_serving.clone()));
        }
        if let Some(book) = book {
            // Policies set at run time, read again every second until the
            // service stops; the intake reads the ones in force per message.
            let fresh = book.clone().keep_fresh(self.background_shutdown.clone());
            self.spawn("the retry policies' refresh", fresh);
            let runner = RetryRunner {
                book,
                cascade: components.cascade.clone(),
                scheduler: scheduler.clone(),
                broker: broker.clone(),
                metrics: components.metrics.clone(),
            };
            self.spawn("the retry intake", runner.run(self.stop_serving.clone()));
        }
    }

    /// The queue-depth poller and the quota refresher, where configured.
    fn spawn_pollers(
        &mut self,
        settings: &Settings,
        publisher: Publisher,
        components: &Components,
        scheduler: &Scheduler,
    ) {
        if settings.metrics.queue_poll_ms > 0 {
            self.spawn(
                "the queue depth poller",
                poll_queue_depths(
                    publisher,
                    components.cascade.clone(),
                    components.metrics.clone(),
                    Duration::from_millis(settings.metrics.queue_poll_ms),
                    settings.metrics.management_url.expose().to_owned(),
                    self.background_shutdown.clone(),
                ),
            );
        }
        if components.auth.tokens_required() && scheduler.has_ledger() {
            self.spawn(
                "the quota refresher",
                refresh_quotas(
                    components.auth.clone(),
                    scheduler.clone(),
                    components.metrics.clone(),
                    Duration::from_millis(settings.auth.quota_refresh_ms.max(100)),
                    self.background_shutdown.clone(),
                ),
            );
        }
    }

    /// Serves the API until shutdown is asked for (its requests drained),
    /// or until the broker supervisor ends the service.
    async fn serve_until_stopped(
        &mut self,
        listener: TcpListener,
        api: Api,
    ) -> Result<(), ServiceError> {
        info!(address = %api.address, https = api.tls.is_some(), "listening");
        let stop = self.stop_serving.clone();
        let served = serve(listener, api.app, api.tls, api.limits, api.metrics, stop);
        // Requests still open at the stop's bound are dropped with it.
        let (asked, bound) = (self.stop_asked.clone(), self.bound);
        let stopping = self.stop_serving.clone();
        let bounded = async move {
            stopping.cancelled().await;
            tokio::time::sleep_until(deadline(&asked, bound)).await;
        };
        tokio::select! {
            () = served => Ok(()),
            () = bounded => {
                warn!("HTTP requests still open at the stop's bound were dropped");
                Ok(())
            }
            supervised = &mut self.supervisor => flatten(supervised),
        }
    }

    /// Stops every component in [`STOP_ORDER`] by `deadline`; the broker's
    /// own ending, if it comes now, is the outcome. Past the deadline what is
    /// left is abandoned and named.
    async fn stop(mut self, deadline: Instant) -> Result<(), ServiceError> {
        let mut stopped = Ok(());
        for step in STOP_ORDER {
            let left = match step {
                Stop::Listeners => {
                    // Also when the broker side ended the service.
                    self.stop_serving.cancel();
                    info!("HTTP requests drained; stopping the forwarder");
                    Vec::new()
                }
                Stop::Background => {
                    self.background_shutdown.cancel();
                    join_until(std::mem::take(&mut self.background), deadline).await
                }
                Stop::Spans => {
                    self.spans_shutdown.cancel();
                    match self.spans.take() {
                        Some(exporter) => {
                            let sent = async {
                                let _ = exporter.await;
                            };
                            within(deadline, sent, "the spans' last export").await
                        }
                        None => Vec::new(),
                    }
                }
                Stop::Broker if self.supervisor.is_finished() => Vec::new(),
                Stop::Broker => {
                    info!("closing the broker connection");
                    self.broker_shutdown.cancel();
                    match timeout_at(deadline, &mut self.supervisor).await {
                        Ok(supervised) => {
                            stopped = flatten(supervised);
                            Vec::new()
                        }
                        Err(_) => vec!["the broker connection's close"],
                    }
                }
                Stop::LateConfirms => {
                    info!("broker connection closed; recording late confirms");
                    let watchers = self.scheduler.finish_watchers();
                    within(deadline, watchers, "the late confirms' records").await
                }
                Stop::Ledger => {
                    let closed = self.scheduler.close_ledger();
                    let left = within(deadline, closed, "the ledger's close").await;
                    if left.is_empty() {
                        info!("ledger closed");
                    }
                    left
                }
            };
            if !left.is_empty() {
                self.abandon(&left);
                return stopped;
            }
        }
        stopped
    }

    /// The stop's bound has passed with `left` still running: it is
    /// abandoned as a crash would leave it, and said.
    fn abandon(&self, left: &[&'static str]) {
        warn!(
            still_running = left.join(", "),
            bound_ms = self.bound.as_millis() as u64,
            "the stop took longer than stop.timeout_ms: abandoned what was still running, as a \
             crash would leave it (what is unacknowledged returns to its queue, what is pending \
             in the ledger is taken up at the next start or by another replica)"
        );
        self.supervisor.abort();
        self.broker_shutdown.cancel();
    }
}

/// `bound` after the stop was `asked` for, or after now.
fn deadline(asked: &OnceLock<Instant>, bound: Duration) -> Instant {
    asked.get().copied().unwrap_or_else(Instant::now) + bound
}

/// `work` finished by `deadline`: nothing left; otherwise `name`.
async fn within(
    deadline: Instant,
    work: impl Future<Output = ()>,
    name: &'static str,
) -> Vec<&'static str> {
    match timeout_at(deadline, work).await {
        Ok(()) => Vec::new(),
        Err(_) => vec![name],
    }
}

fn flatten(
    supervised: Result<Result<(), BrokerError>, tokio::task::JoinError>,
) -> Result<(), ServiceError> {
    match supervised {
        Ok(result) => result.map_err(ServiceError::from),
        Err(error) => Err(ServiceError::from(error)),
    }
}

/// Stops the listeners on `shutdown` (noting when, for the stop's bound),
/// or when the background work ends.
async fn stop_serving_on(
    shutdown: impl Future<Output = ()> + Send + 'static,
    stop_serving: CancellationToken,
    asked: Arc<OnceLock<Instant>>,
    ended: CancellationToken,
) {
    tokio::select! {
        _ = shutdown => {
            let _ = asked.set(Instant::now());
        },
        _ = ended.cancelled() => {},
    }
    stop_serving.cancel();
}

/// The line every log starts with: which chain, and where due tasks go.
fn log_chain(cascade: &Cascade, ledger: Option<&Ledger>) {
    info!(
        business_exchange = cascade.business_exchange(),
        prefix = cascade.prefix(),
        version = cascade.version(),
        levels = cascade.levels(),
        unit_ms = cascade.unit_ms(),
        queue_type = cascade.queue_type().as_str(),
        ledger = ledger.map_or("none (store.url = \"none\")", |l| l.target()),
        "delayline {}: chain {}.v{}, {} levels of {} ms ({} queues), due tasks to {}",
        env!("CARGO_PKG_VERSION"),
        cascade.prefix(),
        cascade.version(),
        cascade.levels(),
        cascade.unit_ms(),
        cascade.queue_type().as_str(),
        cascade.business_exchange(),
    );
}

/// Says at start-up who may use the API.
fn log_access(auth: &Authenticator, address: &std::net::SocketAddr) {
    if auth.tokens_required() {
        info!(
            clients = auth.clients().len(),
            "the API requires a token (Authorization: Bearer); /healthz and /readyz are open"
        );
    } else if address.ip().is_loopback() {
        warn!(
            %address,
            "the API is OPEN: no clients are configured, so anyone who can reach {address} may \
             publish to any destination (allowed on loopback only; configure clients to require \
             tokens)"
        );
    } else {
        warn!(
            %address,
            "the API is OPEN on a network address (auth.mode = \"open\"): anyone who can reach \
             it may publish to any destination"
        );
    }
}

/// How long a start waits to take over a stopped process's leases.
const TAKE_OVER_WAIT: Duration = Duration::from_secs(1);

/// Ends the leases a stopped process left in `ledger` (SQLite's: see
/// [`Ledger::end_leases_of_a_stopped_process`]), within [`TAKE_OVER_WAIT`];
/// how many, or `None` when none was taken over.
async fn take_over_leases(ledger: &Ledger) -> Option<u64> {
    match tokio::time::timeout(TAKE_OVER_WAIT, ledger.end_leases_of_a_stopped_process()).await {
        Ok(Ok(ended)) => ended,
        Ok(Err(error)) => {
            warn!(%error, "cannot take over the leases a stopped delayline left: they run out");
            None
        }
        Err(_) => {
            warn!("the ledger stayed locked: the leases a stopped delayline left run out");
            None
        }
    }
}

/// Reads each quota's count of waiting tasks from the ledger, which sees
/// deliveries, cancellations and other replicas' tasks.
async fn refresh_quotas(
    auth: Arc<Authenticator>,
    scheduler: Scheduler,
    metrics: Arc<Metrics>,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut ticks = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        for client in auth.clients().iter().filter(|c| c.max_scheduled.is_some()) {
            match scheduler
                .waiting_tasks(&client.name, crate::clock::now_ms())
                .await
            {
                Ok(waiting) => {
                    auth.usage.set(&client.name, waiting);
                    metrics
                        .client_scheduled
                        .get_or_create(&crate::metrics::ClientLabel {
                            client: client.name.clone(),
                        })
                        .set(i64::try_from(waiting).unwrap_or(i64::MAX));
                }
                Err(error) => warn!(client = %client.name, %error, "cannot count a quota"),
            }
        }
    }
}

/// Resolves on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    info!("shutdown requested");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each step may still need what the later ones stop: requests publish
    /// and write, background work publishes and writes, the broker's close
    /// decides late confirms, and recording them writes to the ledger.
    #[test]
    fn the_service_stops_outside_in_and_closes_the_ledger_last() {
        let position = |step| STOP_ORDER.iter().position(|s| *s == step).unwrap();
        assert!(position(Stop::Listeners) < position(Stop::Background));
        assert!(position(Stop::Background) < position(Stop::Spans));
        assert!(position(Stop::Spans) < position(Stop::Broker));
        assert!(position(Stop::Broker) < position(Stop::LateConfirms));
        assert!(position(Stop::LateConfirms) < position(Stop::Ledger));
        assert_eq!(STOP_ORDER.last(), Some(&Stop::Ledger));
    }
}
