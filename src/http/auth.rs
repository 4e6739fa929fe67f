//! Who may write: nobody unless `[http] admin_token` is set, then whoever
//! sends `Authorization: Bearer <token>`. No cookies, so no cross-site
//! request can carry the token.

use axum::http::{HeaderMap, StatusCode};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::HttpState;

/// Allows a write, or says why not: read-only (403) or no or a wrong
/// token (401). The token is never echoed.
pub fn require_admin(state: &HttpState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &state.admin_token else {
        return Err(ApiError::with(
            StatusCode::FORBIDDEN,
            "the console is read-only: set [http] admin_token (or admin_token_file, or DELAYD_HTTP__ADMIN_TOKEN) to allow writes",
        ));
    };
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if same(token.expose().as_bytes(), g.trim().as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::with(
            StatusCode::UNAUTHORIZED,
            "the bearer token is not the admin token",
        )),
        None => Err(ApiError::with(
            StatusCode::UNAUTHORIZED,
            "writes need the header Authorization: Bearer <admin token>",
        )),
    }
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
