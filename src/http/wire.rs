//! JSON answers for the requests hyper refuses before the router sees them.
//!
//! hyper answers a request it cannot parse by itself (a control byte in a
//! header, a URI longer than it reads, an unknown HTTP version) with a bare
//! status and an empty body, and offers no hook to change that. Every other
//! refusal has the JSON error shape and a stable code, and clients rely on
//! it, so the connection is wrapped: hyper's own answer is recognised on its
//! way out and replaced by the same status with a JSON body.
//!
//! It is recognised by what only hyper writes: a whole response head with
//! `connection: close`, `content-length: 0` and no content type (every answer
//! of the router has a body and a content type), and a status of the table
//! below. Anything else passes through untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use super::codes::ErrorCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What hyper refuses by itself, with the code and the message said instead.
const REFUSALS: &[(ErrorCode, &str)] = &[
    (
        ErrorCode::BadRequest,
        "the request is not valid HTTP/1.1: its request line or a header could not be read \
         (a control byte in a header value, say)",
    ),
    (
        ErrorCode::UriTooLong,
        "the request's URI is longer than the server reads",
    ),
    (
        ErrorCode::RequestHeadersTooLarge,
        "the request's head is larger than the server reads",
    ),
    (
        ErrorCode::HttpVersionNotSupported,
        "the server speaks HTTP/1.1 (and HTTP/1.0)",
    ),
];

/// The JSON answer for hyper's bare `head`, or `None` when `head` is not one.
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let rest = text.strip_prefix("HTTP/1.1 ")?;
    if !text.ends_with("\r\n\r\n") {
        return None;
    }
    let status: u16 = rest.get(..3)?.parse().ok()?;
    let lines: Vec<String> = text.lines().skip(1).map(str::to_ascii_lowercase).collect();
    let has = |wanted: &str| lines.iter().any(|line| line == wanted);
    let bare = has("connection: close")
        && has("content-length: 0")
        && !lines.iter().any(|line| line.starts_with("content-type:"));
    if !bare {
        return None;
    }
    let (code, message) = REFUSALS
        .iter()
        .find(|(code, _)| code.status().as_u16() == status)?;
    let status = code.status();
    let body =
        serde_json::json!({"error": {"code": code.as_str(), "message": message}}).to_string();
    Some(
        format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\nconnection: close\r\n\
             content-length: {}\r\n\r\n{body}",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            body.len()
        )
        .into_bytes(),
    )
}

/// A connection whose bare refusals from hyper leave it as JSON.
pub struct JsonRefusals<I> {
    inner: I,
    /// A replacement not yet written whole, and how much of it was.
    pending: Option<(Vec<u8>, usize)>,
}

impl<I> JsonRefusals<I> {
    pub fn new(inner: I) -> Self {
        JsonRefusals {
            inner,
            pending: None,
        }
    }
}

impl<I: AsyncWrite + Unpin> JsonRefusals<I> {
    /// Writes what is left of a replacement; ready when nothing is.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            let wrote = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if wrote == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += wrote;
            if *written == bytes.len() {
                self.pending = None;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for JsonRefusals<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for JsonRefusals<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if let Some(json) = replacement(buf) {
            // Taken whole: what hyper wrote is replaced, and the replacement
            // goes out before any flush or shutdown completes.
            this.pending = Some((json, 0));
            let _ = this.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }

    // Not vectored: hyper then writes a response head in one buffer, which
    // is what `replacement` reads.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hyper_says(status: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: 0\r\n\
             date: Mon, 23 Nov 2026 06:38:25 GMT\r\n\r\n"
        )
        .into_bytes()
    }

    #[test]
    fn each_bare_refusal_becomes_its_status_with_a_json_body() {
        for (code, _) in REFUSALS {
            let status = code.status();
            let line = format!("{} {}", status.as_u16(), status.canonical_reason().unwrap());
            let json = String::from_utf8(replacement(&hyper_says(&line)).unwrap()).unwrap();
            let (head, body) = json.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with(&format!("HTTP/1.1 {line}\r\n")), "{head}");
            assert!(head.contains("content-type: application/json"), "{head}");
            assert!(head.contains(&format!("content-length: {}", body.len())));
            let body: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(body["error"]["code"], code.as_str());
        }
    }

    #[test]
    fn answers_of_the_router_pass_untouched() {
        let router_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
            content-length: 2\r\n\r\n{}";
        assert_eq!(replacement(router_400), None);
        assert_eq!(replacement(&hyper_says("200 OK")), None);
        assert_eq!(replacement(&hyper_says("408 Request Timeout")), None);
        // A head cut in two is not recognised, and left as it is.
        let whole = hyper_says("400 Bad Request");
        assert_eq!(replacement(&whole[..20]), None);
    }

    #[tokio::test]
    async fn the_replacement_is_written_whole_before_the_flush_ends() {
        use tokio::io::AsyncWriteExt;
        let (client, server) = tokio::io::duplex(16);
        let mut wrapped = JsonRefusals::new(server);
        let reader = tokio::spawn(async move {
            let mut client = client;
            let mut all = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut client, &mut all)
                .await
                .unwrap();
            all
        });
        let bare = hyper_says("414 URI Too Long");
        wrapped.write_all(&bare).await.unwrap();
        wrapped.flush().await.unwrap();
        wrapped.shutdown().await.unwrap();
        drop(wrapped);
        let all = String::from_utf8(reader.await.unwrap()).unwrap();
        assert!(all.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{all}");
        assert!(all.contains(r#""code":"uri_too_long""#), "{all}");
    }
}
