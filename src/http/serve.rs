//! The accept loop, ours rather than `axum::serve`'s, because a service on a
//! network must bound what each client may hold, and axum's loop configures
//! none of it:
//! - **headers**: a connection that has not sent a whole request head within
//!   `http.header_read_timeout_ms` (an idle keep-alive one included) is
//!   closed; no request was read, so there is nothing to answer;
//! - **connections**: above `http.max_connections`, a new connection's
//!   first request is answered `503 too_many_connections` and the
//!   connection closed, instead of waiting in the kernel's backlog for a
//!   slot nobody promised;
//! - **TLS**: the handshake has the same deadline as the headers.
//!
//! The body deadline and the request deadline are the router's (see
//! [`super::limits`]), where the answer can be JSON.
//!
//! HTTP/1.1 only: every client speaks it, and HTTP/2's own limits (streams
//! per connection, flow control) would need bounds of their own.

use super::codes::ErrorCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::metrics::Metrics;

/// The API's TLS settings from its PEM files (the certificate chain, then the
/// private key). ALPN offers HTTP/1.1 alone, the one protocol served: a
/// client told HTTP/2 is there (curl's default) would speak it to an HTTP/1.1
/// server and fail.
pub fn https_config(cert_file: &str, key_file: &str) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|error| format!("reading http.tls.cert_file {cert_file:?}: {error}"))?;
    if chain.is_empty() {
        return Err(format!(
            "http.tls.cert_file {cert_file:?} holds no certificate"
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|error| format!("reading http.tls.key_file {key_file:?}: {error}"))?;
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| {
            format!("http.tls.cert_file {cert_file:?} and key_file {key_file:?}: {error}")
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What one client may hold of the listener.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
    /// Once shutdown begins, the longest wait for requests in progress.
    pub drain: Duration,
}

/// The answer above the connection cap: the JSON error shape every other
/// refusal has, whatever the request was (it is not parsed).
static TOO_MANY_CONNECTIONS: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let code = ErrorCode::TooManyConnections;
    let body = serde_json::json!({"error": {
        "code": code.as_str(),
        "message": "the service has http.max_connections open; retry shortly",
    }})
    .to_string();
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        code.status().as_u16(),
        code.status().canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes()
});

/// How long a refused connection may take to send its request head, receive
/// its 503 and close.
const REFUSAL: Duration = Duration::from_secs(2);
/// The most of a refused connection's request head that is read.
const MAX_REFUSED_HEAD: usize = 64 * 1024;

/// Serves `app` on `listener` until `stop`, then waits up to `limits.drain`
/// for the requests in progress. `tls`, when given, is asked for its current
/// configuration at every connection, so a reloaded certificate applies to
/// the next one.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<axum_server::tls_rustls::RustlsConfig>,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let service = TowerToHyperService::new(app);
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors, say: pause rather than spin.
                warn!(%error, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics.connections_refused.inc();
            tokio::spawn(refuse(stream));
            continue;
        };
        let connection = Connection {
            service: service.clone(),
            limits,
            stop: stop.clone(),
            _slot: slot,
        };
        match &tls {
            None => {
                tokio::spawn(connection.serve(stream));
            }
            Some(config) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(config.get_inner());
                tokio::spawn(async move {
                    let handshake = acceptor.accept(stream);
                    match tokio::time::timeout(limits.header_read_timeout, handshake).await {
                        Ok(Ok(stream)) => connection.serve(stream).await,
                        Ok(Err(error)) => debug!(%error, "TLS handshake failed"),
                        Err(_) => debug!("TLS handshake timed out"),
                    }
                });
            }
        }
    }
    drop(listener);
    // Every slot back means every connection has finished.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(limits.drain, slots.acquire_many(all))
        .await
        .is_err()
    {
        warn!(
            "requests still in progress after {:?}; stopping anyway",
            limits.drain
        );
    }
}

struct Connection {
    service: TowerToHyperService<Router>,
    limits: ConnectionLimits,
    stop: CancellationToken,
    /// Held while the connection lives.
    _slot: OwnedSemaphorePermit,
}

impl Connection {
    async fn serve<I>(self, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_read_timeout);
        let io = TokioIo::new(super::wire::JsonRefusals::new(io));
        let connection = builder.serve_connection(io, self.service);
        tokio::pin!(connection);
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(error) = served {
                    debug!(%error, "connection ended");
                }
                return;
            }
            () = self.stop.cancelled() => {}
        }
        // Shutting down: finish the request in progress, take no other.
        connection.as_mut().graceful_shutdown();
        if let Err(error) = connection.await {
            debug!(%error, "connection ended while shutting down");
        }
    }
}

/// Answers 503 to the connection's first request, then closes gracefully.
/// The answer waits for the request head: an HTTP client takes bytes that
/// come before its request for a broken connection, not for an answer. What
/// the client sends meanwhile is read and dropped before the close, since
/// closing a socket with unread data resets the connection, and a reset can
/// destroy the answer before the client reads it. The whole exchange is
/// bounded in time, so refused connections cannot pile up.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(REFUSAL, async {
        let mut head = Vec::new();
        let mut buffer = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REFUSED_HEAD {
            let read = stream.read(&mut buffer).await?;
            if read == 0 {
                return Ok(());
            }
            head.extend_from_slice(&buffer[..read]);
        }
        stream.write_all(&TOO_MANY_CONNECTIONS).await?;
        stream.shutdown().await?;
        while stream.read(&mut buffer).await? > 0 {}
        Ok::<(), std::io::Error>(())
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_a_whole_response_with_the_json_error_shape() {
        let text = std::str::from_utf8(&TOO_MANY_CONNECTIONS).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), length);
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], "too_many_connections");
    }
}
