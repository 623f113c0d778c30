//! Runs the whole service: broker supervisor plus HTTP listener, and stops
//! them in the order that loses nothing.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::broker::{BrokerError, Publisher, PublisherOptions};
use crate::config::{ConfigError, Settings};
use crate::http::{AppState, router};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("HTTP server: {0}")]
    Http(#[from] std::io::Error),
    #[error("the broker supervisor stopped unexpectedly: {0}")]
    Supervisor(#[from] tokio::task::JoinError),
}

pub fn publisher_options(settings: &Settings) -> PublisherOptions {
    PublisherOptions {
        uri: settings.amqp.uri.clone(),
        channels: settings.amqp.publish_channels,
        confirm_timeout: Duration::from_millis(settings.amqp.confirm_timeout_ms),
        max_backoff: Duration::from_millis(settings.amqp.reconnect_max_backoff_ms),
        connection_name: format!("delayline {}", settings.cascade.prefix),
    }
}

/// Serves until `shutdown` resolves.
///
/// The listener answers at once, but tasks get 503 until the broker is
/// connected and the topology provisioned. On shutdown the listener stops
/// taking requests, in-flight publishes finish and get their confirms, and
/// only then is the broker connection closed. A conflicting topology stops
/// the service with an error: no amount of retrying would fix it.
pub async fn run(
    settings: Settings,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    let cascade = settings.cascade()?;
    let broker_shutdown = CancellationToken::new();
    let (publisher, mut supervisor) = Publisher::start(
        publisher_options(&settings),
        cascade.plan(),
        broker_shutdown.clone(),
    );
    let app = router(
        AppState::new(cascade, publisher, &settings.http),
        settings.http.body_limit_bytes,
    );
    info!(address = %listener.local_addr()?, "listening");
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    tokio::select! {
        served = server => {
            served?;
            info!("HTTP requests drained; closing the broker connection");
            broker_shutdown.cancel();
            supervisor.await??;
        }
        supervised = &mut supervisor => {
            supervised??;
        }
    }
    Ok(())
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
