//! Who may read and who may write. Writes need the admin token (none
//! configured: nobody writes); reads need the read token or the admin
//! token when a read token is configured, and are open otherwise (which a
//! listener beyond loopback allows only when told so). Tokens travel as
//! `Authorization: Bearer`, never as cookies, so no cross-site request can
//! carry one; they are compared in constant time and never echoed.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::HttpState;

/// What a request's token lets it do, named as the audit log names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// No token was needed or sent (reads on an open console).
    Anyone,
    /// The read token.
    Reader,
    /// The admin token: reads and writes.
    Admin,
}

impl Role {
    /// The name the audit log and answers show: never the token itself.
    pub fn name(self) -> &'static str {
        match self {
            Role::Anyone => "anyone",
            Role::Reader => "read_token",
            Role::Admin => "admin_token",
        }
    }
}

/// The role the request's bearer token proves, if it names one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

fn role_of(state: &HttpState, given: &str) -> Option<Role> {
    let is = |t: &Option<crate::secret::Secret>| {
        t.as_ref()
            .is_some_and(|t| same(t.expose().as_bytes(), given.as_bytes()))
    };
    if is(&state.admin_token) {
        Some(Role::Admin)
    } else if is(&state.read_token) {
        Some(Role::Reader)
    } else {
        None
    }
}

/// Allows a read, or says why not (401): no or a wrong token while a read
/// token is configured.
pub fn require_read(state: &HttpState, headers: &HeaderMap) -> Result<Role, ApiError> {
    let given = bearer(headers);
    if let Some(role) = given.and_then(|g| role_of(state, g)) {
        return Ok(role);
    }
    match (&state.read_token, given) {
        // Reads are open: a token that proves nothing costs nothing.
        (None, _) => Ok(Role::Anyone),
        (Some(_), Some(_)) => Err(ApiError::with(
            StatusCode::UNAUTHORIZED,
            "the bearer token is neither the read token nor the admin token",
        )),
        (Some(_), None) => Err(ApiError::with(
            StatusCode::UNAUTHORIZED,
            "reads need the header Authorization: Bearer <read token or admin token>",
        )),
    }
}

/// Allows a write, or says why not: read-only (403), no or a wrong token
/// (401), the read token (403).
pub fn require_admin(state: &HttpState, headers: &HeaderMap) -> Result<Role, ApiError> {
    if state.admin_token.is_none() {
        return Err(ApiError::with(
            StatusCode::FORBIDDEN,
            "the console is read-only: set [http] admin_token (or admin_token_file, or DELAYD_HTTP__ADMIN_TOKEN) to allow writes",
        ));
    }
    match bearer(headers).map(|g| role_of(state, g)) {
        Some(Some(Role::Admin)) => Ok(Role::Admin),
        Some(Some(_)) => Err(ApiError::with(
            StatusCode::FORBIDDEN,
            "the read token only reads; writes need the admin token",
        )),
        Some(None) => Err(ApiError::with(
            StatusCode::UNAUTHORIZED,
            "the bearer token is not the admin token",
        )),
        None => Err(ApiError::with(
            StatusCode::UNAUTHORIZED,
            "writes need the header Authorization: Bearer <admin token>",
        )),
    }
}

/// Every `GET` under `/api/v1` is a read: checked here once, so no read
/// handler can forget it. Writes check [`require_admin`] in their handler,
/// where a dry run (a count) checks [`require_read`] instead.
pub async fn reads(
    State(state): State<std::sync::Arc<HttpState>>,
    req: Request,
    next: Next,
) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        if let Err(e) = require_read(&state, req.headers()) {
            return e.into_response();
        }
    }
    next.run(req).await
}

/// Compares in time that depends on the expected token's length only, not
/// on where `given` first differs or how long it is.
fn same(expected: &[u8], given: &[u8]) -> bool {
    let mut eq = (expected.len() as u64).ct_eq(&(given.len() as u64));
    for (i, e) in expected.iter().enumerate() {
        eq &= e.ct_eq(given.get(i).unwrap_or(&0));
    }
    eq.into()
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn only_the_exact_token_matches() {
        assert!(same(b"s3cret-token", b"s3cret-token"));
        assert!(!same(b"s3cret-token", b"s3cret-toke"));
        assert!(!same(b"s3cret-token", b"s3cret-token2"));
        assert!(!same(b"s3cret-token", b"S3cret-token"));
        assert!(!same(b"s3cret-token", b""));
    }
}
