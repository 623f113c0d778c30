//! Runs the whole service: broker supervisor plus HTTP listener, and stops
//! them in the order that loses nothing.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::broker::{BrokerError, Publisher, PublisherOptions, poll_queue_depths};
use crate::cascade::Cascade;
use crate::config::{ConfigError, Settings};
use crate::http::{AppState, router};
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;
use crate::store::{self, LedgerOptions, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("HTTP server: {0}")]
    Http(#[from] std::io::Error),
    #[error("the broker supervisor stopped unexpectedly: {0}")]
    Supervisor(#[from] tokio::task::JoinError),
}

pub fn publisher_options(
    settings: &Settings,
    cascade: &Cascade,
    metrics: &Metrics,
) -> PublisherOptions {
    PublisherOptions {
        uris: settings.amqp.uris(),
        channels: settings.amqp.publish_channels,
        confirm_timeout: Duration::from_millis(settings.amqp.confirm_timeout_ms),
        connect_timeout: Duration::from_millis(settings.amqp.connect_timeout_ms),
        max_backoff: Duration::from_millis(settings.amqp.reconnect_max_backoff_ms),
        connection_name: format!("delayline {}", settings.cascade.prefix),
        header_reserve: cascade.dead_letter_header_bytes(),
        confirm_latency: metrics.confirm_latency.clone(),
    }
}

/// Serves until `shutdown` resolves.
///
/// The ledger is opened and migrated first: without it nothing could be
/// promised. The listener then answers at once; until the broker is connected
/// and the topology provisioned, tasks wait in the ledger as pending (or get
/// 503 without one). On shutdown the listener stops taking requests, in-flight
/// publishes finish and get their confirms, the forwarder finishes its round,
/// and only then are the broker connection and the ledger closed. A
/// conflicting topology stops the service with an error: no amount of
/// retrying would fix it.
pub async fn run(
    settings: Settings,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    let cascade = Arc::new(settings.cascade()?);
    let metrics = Arc::new(Metrics::new());
    let ledger = store::open(
        &settings.store,
        LedgerOptions {
            max_pending: settings.store.max_pending,
            payload_copy_bytes: settings.store.payload_copy_bytes,
            commit_group_size: metrics.ledger_commit_group.clone(),
        },
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
    let broker_shutdown = CancellationToken::new();
    let (publisher, mut supervisor) = Publisher::start(
        publisher_options(&settings, &cascade, &metrics),
        cascade.plan(),
        broker_shutdown.clone(),
    );
    let scheduler = Scheduler::new(
        publisher.clone(),
        ledger.clone(),
        cascade.clone(),
        metrics.clone(),
        Duration::from_millis(settings.amqp.confirm_timeout_ms),
    );
    let background_shutdown = CancellationToken::new();
    let mut background = scheduler.spawn_background(
        Duration::from_millis(settings.store.retention_ms),
        Duration::from_millis(settings.store.prune_interval_ms),
        background_shutdown.clone(),
    );
    if settings.metrics.queue_poll_ms > 0 {
        background.push(tokio::spawn(poll_queue_depths(
            publisher,
            cascade,
            metrics,
            Duration::from_millis(settings.metrics.queue_poll_ms),
            settings.metrics.management_url.clone(),
            background_shutdown.clone(),
        )));
    }
    let app = router(
        AppState::new(scheduler.clone(), &settings.http, &settings.amqp),
        settings.http.body_limit_bytes,
    );
    info!(address = %listener.local_addr()?, "listening");
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    let outcome = tokio::select! {
        served = server => served.map_err(ServiceError::from),
        supervised = &mut supervisor => supervised.map_err(ServiceError::from).and_then(|r| {
            r.map_err(ServiceError::from)
        }),
    };
    info!("HTTP requests drained; stopping the forwarder");
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
    if let Some(ledger) = ledger {
        ledger.close().await;
        info!("ledger closed");
    }
    outcome.and(stopped)
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
