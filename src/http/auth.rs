//! The API's gate in HTTP terms: `Authorization: Bearer` in, `401`/`403`/
//! `429` out. Who may do what is decided in `crate::auth`; this module only
//! carries the answer to the handlers (as a [`Caller`] extension) and shapes
//! the refusals.

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ErrorCode};
use super::state::AppState;
use crate::auth::{Caller, Client, Permission, Throttled, Unauthenticated};

/// Authenticates every request to the routes it wraps; the probes are not
/// wrapped (an orchestrator has no token).
pub async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer_token);
    match state.auth.authenticate(bearer) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(reason) => {
            state.metrics.auth_refused(reason.as_str());
            unauthenticated(&reason).into_response()
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header (the scheme is
/// case-insensitive, RFC 7235).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn unauthenticated(reason: &Unauthenticated) -> ApiError {
    if *reason == Unauthenticated::Missing {
        ApiError::new(
            ErrorCode::Unauthenticated,
            "this API needs a token: send \"Authorization: Bearer <token>\"",
        )
    } else {
        ApiError::new(
            ErrorCode::InvalidToken,
            "the token is not known (mistyped, revoked, or of another deployment)",
        )
    }
}

/// The authenticated caller, as the middleware found it.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::internal("a route that needs a caller is not authenticated"))
    }
}

/// 403 unless the caller has `permission`.
pub fn require(caller: &Caller, permission: Permission) -> Result<(), ApiError> {
    if caller.may(permission) {
        return Ok(());
    }
    let name = caller.client_name().unwrap_or_default();
    Err(ApiError::new(
        ErrorCode::Forbidden,
        format!(
            "client {name:?} does not have the {:?} permission this needs",
            permission.as_str()
        ),
    ))
}

/// 403 unless the caller may publish to `destination`.
pub fn check_destination(caller: &Caller, destination: &str) -> Result<(), ApiError> {
    match caller {
        Caller::Client(client) if !client.may_publish_to(destination) => Err(ApiError::new(
            ErrorCode::ForbiddenDestination,
            format!(
                "client {:?} may not publish to {destination:?} (its destinations: {})",
                client.name,
                client.destination_patterns().join(", ")
            ),
        )),
        _ => Ok(()),
    }
}

/// 403 unless the caller may deliver to `exchange` (`None`: the business
/// exchange, which every caller may).
pub fn check_exchange(caller: &Caller, exchange: Option<&str>) -> Result<(), ApiError> {
    match (caller, exchange) {
        (Caller::Client(client), Some(exchange)) if !client.may_deliver_to(exchange) => {
            Err(ApiError::new(
                ErrorCode::ForbiddenExchange,
                format!(
                    "client {:?} may not deliver to the exchange {exchange:?} (its exchanges: {})",
                    client.name,
                    match client.exchanges() {
                        [] => "only the business exchange".to_owned(),
                        named => named.join(", "),
                    }
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// Takes `tasks` from the client's rate and quota, or says when to retry.
pub fn admit(state: &AppState, client: &Client, tasks: u64) -> Result<(), ApiError> {
    let throttled = client
        .take(u32::try_from(tasks).unwrap_or(u32::MAX))
        .and_then(|()| state.auth.usage.reserve(client, tasks));
    throttled.map_err(|throttled| throttle_error(&client.name, throttled))
}

fn throttle_error(client: &str, throttled: Throttled) -> ApiError {
    match throttled {
        Throttled::Rate { retry_after } => ApiError::new(
            ErrorCode::RateLimited,
            format!("client {client:?} is over its rate; retry after the Retry-After seconds"),
        )
        .retry_after(retry_after.as_secs_f64().ceil() as u64),
        Throttled::LargerThanBurst { tasks, burst } => ApiError::new(
            ErrorCode::RateLimited,
            format!(
                "{tasks} tasks in one request is more than client {client:?}'s burst of \
                 {burst}: send smaller batches"
            ),
        ),
        Throttled::Quota {
            max_scheduled,
            scheduled,
        } => ApiError::new(
            ErrorCode::QuotaExceeded,
            format!(
                "client {client:?} has {scheduled} tasks waiting, and may have at most \
                 {max_scheduled}: retry once some are delivered or cancelled"
            ),
        )
        .retry_after(1),
    }
}

/// What the ledger stores as a request's idempotency key: scoped to the
/// client, so two clients' keys never meet.
pub fn scoped_key(caller: &Caller, key: String) -> String {
    match caller.client_name() {
        Some(client) => format!("{client}/{key}"),
        None => key,
    }
}

/// The key as the client sent it.
pub fn unscoped_key(client: Option<&str>, key: String) -> String {
    match client.and_then(|c| key.strip_prefix(&format!("{c}/"))) {
        Some(own) => own.to_owned(),
        None => key,
    }
}

/// A fingerprint that is the client's own: another client repeating the
/// same id or body is a conflict, never a replay of someone else's task.
pub fn scoped_fingerprint(caller: &Caller, fingerprint: String) -> String {
    match caller.client_name() {
        Some(client) => format!("{client}:{fingerprint}"),
        None => fingerprint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_as_rfc_6750_says() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearerabc"), None);
    }

    #[test]
    fn scoped_keys_read_back_as_sent() {
        assert_eq!(unscoped_key(Some("billing"), "billing/k/1".into()), "k/1");
        assert_eq!(unscoped_key(None, "billing/k".into()), "billing/k");
        assert_eq!(unscoped_key(Some("ops"), "k".into()), "k");
    }
}
