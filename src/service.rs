//! Runs the whole service: broker supervisor plus HTTP listener, and stops
//! them in the order that loses nothing. Each component is built here from
//! its own section of the settings.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::broker::{BrokerError, Publisher, PublisherOptions};
use crate::cascade::Cascade;
use crate::config::Settings;
use crate::http::{AppState, router};
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
    let broker_shutdown = CancellationToken::new();
    let (publisher, mut supervisor) = Publisher::start(
        PublisherOptions::from_settings(&settings.amqp, &cascade, metrics.confirm_latency.clone()),
        cascade.plan(),
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
    let app = router(
        AppState::new(scheduler.clone(), metrics, &settings.http),
        &settings.http,
    );
    let served = async {
        info!(address = %listener.local_addr()?, "listening");
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(ServiceError::from)
    };
    let outcome = tokio::select! {
        served = served => served,
        supervised = &mut supervisor => match supervised {
            Ok(result) => result.map_err(ServiceError::from),
            Err(error) => Err(ServiceError::from(error)),
        },
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
    scheduler.close_ledger().await;
    info!("ledger closed");
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
