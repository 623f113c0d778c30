//! `delayline probe`: the health check for container images without curl.
//!
//! One plain HTTP/1.0 request to the service's own listener; the exit code
//! says whether it answered 200. Docker's HEALTHCHECK and compose's
//! `healthcheck` run it inside the container.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TIMEOUT: Duration = Duration::from_secs(3);
/// A health answer is a few hundred bytes; anything longer is cut.
const MAX_ANSWER: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("http.bind {0:?} is not host:port")]
    Address(String),
    #[error("{address}: {source}")]
    Io {
        address: String,
        source: std::io::Error,
    },
    #[error("{0}: no answer within {TIMEOUT:?}")]
    Timeout(String),
    #[error("{0}: the answer is not HTTP")]
    NotHttp(String),
    #[error("{address}: {source}")]
    Https {
        address: String,
        source: reqwest::Error,
    },
}

/// GET `path` from this service's own HTTPS listener at `bind`. The
/// certificate is not checked: it names the service for its clients, not
/// the loopback address the probe reaches it on, and the probe only asks
/// whether the process answers.
pub async fn probe_https(bind: &str, path: &str) -> Result<(u16, String), ProbeError> {
    let address = local_address(bind)?;
    let https = |source| ProbeError::Https {
        address: address.clone(),
        source,
    };
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(TIMEOUT)
        .build()
        .map_err(https)?;
    let response = client
        .get(format!("https://{address}{path}"))
        .send()
        .await
        .map_err(https)?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(https)?;
    Ok((status, body))
}

/// Where to reach a listener bound to `bind`: a wildcard address is reached on loopback.
fn local_address(bind: &str) -> Result<String, ProbeError> {
    let (host, port) = bind
        .rsplit_once(':')
        .ok_or_else(|| ProbeError::Address(bind.to_owned()))?;
    let host = match host {
        "0.0.0.0" | "" => "127.0.0.1",
        "[::]" => "[::1]",
        other => other,
    };
    Ok(format!("{host}:{port}"))
}

/// GET `path` from the listener at `bind`: the status code and the body.
pub async fn probe(bind: &str, path: &str) -> Result<(u16, String), ProbeError> {
    let address = local_address(bind)?;
    let io = |source| ProbeError::Io {
        address: address.clone(),
        source,
    };
    let exchange = async {
        let mut stream = TcpStream::connect(&address).await.map_err(io)?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.map_err(io)?;
        let mut answer = Vec::new();
        stream
            .take(MAX_ANSWER)
            .read_to_end(&mut answer)
            .await
            .map_err(io)?;
        Ok::<_, ProbeError>(answer)
    };
    let answer = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| ProbeError::Timeout(address.clone()))??;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .filter(|_| answer.starts_with("HTTP/"))
        .ok_or_else(|| ProbeError::NotHttp(address.clone()))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_binds_are_probed_on_loopback() {
        assert_eq!(local_address("0.0.0.0:8080").unwrap(), "127.0.0.1:8080");
        assert_eq!(local_address("[::]:80").unwrap(), "[::1]:80");
        assert_eq!(local_address("10.0.0.1:1").unwrap(), "10.0.0.1:1");
        assert!(local_address("nonsense").is_err());
    }
}
