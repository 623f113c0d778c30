//! Runs the whole service: broker supervisor plus HTTP listener, and stops
//! them in the order that loses nothing. Each component is built here from
//! its own section of the settings.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::http::serve::{ConnectionLimits, https_config, serve};
use axum_server::tls_rustls::RustlsConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::auth::{AuthError, Authenticator};
use crate::broker::{BrokerError, BrokerTls, Publisher, PublisherOptions};
use crate::cascade::Cascade;
use crate::config::Settings;
use crate::http::{AppState, MetricsRoute, metrics_router, router};
use crate::ledger::{self, LedgerError};
use crate::metrics::{Metrics, poll_queue_depths};
use crate::scheduler::{Scheduler, SchedulerSettings};

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
}

/// Serves `cascade` (the one `settings` describe, validated by
/// [`Settings::load`] or [`Settings::cascade`]) until `shutdown` resolves.
///
/// The ledger is opened and migrated first: without it nothing could be
/// promised. The listener then answers at once; until the broker is connected
/// and the topology provisioned, tasks wait in the ledger as pending (or get
/// 503 without one). On shutdown the listener stops taking requests, in-flight
/// publishes finish and get their confirms, the forwarder finishes its round,
/// and only then are the broker connection and the ledger closed. A
/// conflicting topology stops the service with an error: no amount of
/// retrying would fix it. The ledger is closed whichever way the service ends.
pub async fn run(
    settings: Settings,
    cascade: Cascade,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    let address = listener.local_addr()?;
    // Refused before anything is opened: an open API on a network, or a
    // clients file that does not read, must not start serving.
    let auth = Arc::new(Authenticator::from_settings(
        &settings.auth,
        &address.to_string(),
        settings.has_ledger(),
    )?);
    let tls = match &settings.http.tls {
        tls if tls.enabled() => Some(RustlsConfig::from_config(
            https_config(&tls.cert_file, &tls.key_file).map_err(ServiceError::Tls)?,
        )),
        _ => None,
    };
    let metrics_listener = match settings.metrics.bind.as_str() {
        "" => None,
        bind => {
            Some(
                TcpListener::bind(bind)
                    .await
                    .map_err(|source| ServiceError::MetricsBind {
                        bind: bind.to_owned(),
                        source,
                    })?,
            )
        }
    };
    let broker_tls = BrokerTls::from_settings(&settings.amqp.tls)?;
    let cascade = Arc::new(cascade);
    let metrics = Arc::new(Metrics::new());
    let ledger = ledger::open(
        &settings.store,
        cascade.release_stage(),
        metrics.ledger_commit_group.clone(),
    )
    .await?;
    info!(
        business_exchange = cascade.business_exchange(),
        prefix = cascade.prefix(),
        version = cascade.version(),
        levels = cascade.levels(),
        unit_ms = cascade.unit_ms(),
        queue_type = cascade.queue_type().as_str(),
        ledger = ledger
            .as_ref()
            .map_or("none (store.url = \"none\")", |l| l.target()),
        "delayline {}: chain {}.v{}, {} levels of {} ms ({} queues), due tasks to {}",
        env!("CARGO_PKG_VERSION"),
        cascade.prefix(),
        cascade.version(),
        cascade.levels(),
        cascade.unit_ms(),
        cascade.queue_type().as_str(),
        cascade.business_exchange(),
    );
    // After the chain line, which starts every log.
    log_access(&auth, &address);
    let broker_shutdown = CancellationToken::new();
    let (publisher, mut supervisor) = Publisher::start(
        PublisherOptions::from_settings(
            &settings.amqp,
            &cascade,
            metrics.confirm_latency.clone(),
            broker_tls,
        ),
        match &ledger {
            Some(ledger) => cascade.plan().owned_by(ledger.identity()),
            None => cascade.plan(),
        },
        broker_shutdown.clone(),
    );
    let scheduler = Scheduler::new(
        Arc::new(publisher.clone()),
        ledger,
        cascade.clone(),
        metrics.clone(),
        SchedulerSettings::from(&settings),
    );
    let background_shutdown = CancellationToken::new();
    let mut background = scheduler.spawn_background(background_shutdown.clone());
    if settings.metrics.queue_poll_ms > 0 {
        background.push(tokio::spawn(poll_queue_depths(
            publisher,
            cascade,
            metrics.clone(),
            Duration::from_millis(settings.metrics.queue_poll_ms),
            settings.metrics.management_url.expose().to_owned(),
            background_shutdown.clone(),
        )));
    }
    let state = AppState::new(
        scheduler.clone(),
        metrics.clone(),
        &settings.http,
        auth.clone(),
    );
    let metrics_route = match metrics_listener {
        Some(_) => MetricsRoute::Elsewhere,
        None => MetricsRoute::WithApi,
    };
    let app = router(state.clone(), &settings.http, metrics_route);
    if auth.tokens_required() && scheduler.has_ledger() {
        background.push(tokio::spawn(refresh_quotas(
            auth.clone(),
            scheduler.clone(),
            metrics.clone(),
            Duration::from_millis(settings.auth.quota_refresh_ms.max(100)),
            background_shutdown.clone(),
        )));
    }
    let stop_serving = CancellationToken::new();
    background.push(tokio::spawn({
        let (stop_serving, ended) = (stop_serving.clone(), background_shutdown.clone());
        async move {
            tokio::select! {
                _ = shutdown => {},
                _ = ended.cancelled() => {},
            }
            stop_serving.cancel();
        }
    }));
    background.push(tokio::spawn(reload_on_hangup(
        auth,
        tls.clone()
            .map(|config| (config, settings.http.tls.clone())),
        background_shutdown.clone(),
    )));
    let limits = ConnectionLimits {
        header_read_timeout: Duration::from_millis(settings.http.header_read_timeout_ms),
        max_connections: settings.http.max_connections.max(1),
        drain: GRACEFUL_DRAIN,
    };
    if let Some(listener) = metrics_listener {
        info!(address = %listener.local_addr()?, "serving /metrics on its own listener");
        // The same accept loop and bounds as the API's: it is open, so a
        // slow client must not hold it either.
        background.push(tokio::spawn(serve(
            listener,
            metrics_router(state),
            None,
            limits,
            metrics.clone(),
            stop_serving.clone(),
        )));
    }
    info!(%address, https = tls.is_some(), "listening");
    let served = async {
        serve(listener, app, tls, limits, metrics, stop_serving.clone()).await;
        Ok::<(), ServiceError>(())
    };
    let outcome = tokio::select! {
        served = served => served,
        supervised = &mut supervisor => match supervised {
            Ok(result) => result.map_err(ServiceError::from),
            Err(error) => Err(ServiceError::from(error)),
        },
    };
    info!("HTTP requests drained; stopping the forwarder");
    // Also when the broker side ended the service: the metrics listener stops.
    stop_serving.cancel();
    background_shutdown.cancel();
    for task in background {
        let _ = task.await;
    }
    let mut stopped = Ok(());
    if !supervisor.is_finished() {
        info!("closing the broker connection");
        broker_shutdown.cancel();
        stopped = match supervisor.await {
            Ok(result) => result.map_err(ServiceError::from),
            Err(error) => Err(ServiceError::from(error)),
        };
    }
    info!("broker connection closed; recording late confirms");
    // Closing the connection decided every late confirm; record them first.
    scheduler.finish_watchers().await;
    scheduler.close_ledger().await;
    info!("ledger closed");
    outcome.and(stopped)
}

/// How long requests in progress may take to finish once shutdown began.
const GRACEFUL_DRAIN: Duration = Duration::from_secs(30);

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

/// On SIGHUP, reads the clients and the API's certificate again. What fails
/// to read is logged and the old one kept: a reload never stops the service.
async fn reload_on_hangup(
    auth: Arc<Authenticator>,
    tls: Option<(RustlsConfig, crate::config::HttpTlsSettings)>,
    shutdown: CancellationToken,
) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            warn!("cannot listen for SIGHUP: clients and certificates reload only on restart");
            return;
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                received = hangups.recv() => if received.is_none() { return },
            }
            match auth.reload() {
                Ok(clients) => info!(clients, "SIGHUP: clients reloaded"),
                Err(error) => {
                    error!(%error, "SIGHUP: clients NOT reloaded; the previous ones stay")
                }
            }
            if let Some((config, files)) = &tls {
                match https_config(&files.cert_file, &files.key_file) {
                    Ok(reloaded) => {
                        config.reload_from_config(reloaded);
                        info!(cert_file = %files.cert_file, "SIGHUP: certificate reloaded")
                    }
                    Err(error) => error!(
                        %error,
                        "SIGHUP: certificate NOT reloaded; the previous one stays"
                    ),
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (auth, tls);
        shutdown.cancelled().await;
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
            match scheduler.waiting_tasks(&client.name).await {
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
