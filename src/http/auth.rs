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
use crate::config::Business;

/// What a request's token lets it do, named as the audit log names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// No token was needed or sent (reads on an open console).
    Anyone,
    /// The read token.
    Reader,
    /// The admin token: reads and writes.
    Admin,
    /// A business's own token: its routes only.
    Business {
        /// The business it opens.
        business: String,
        /// True for its admin token (reads and writes), false for its read token.
        admin: bool,
        /// `businesses.NAME.admin_token` or `businesses.NAME.read_token`.
        name: String,
    },
}

impl Role {
    /// The name the audit log and answers show: never the token itself.
    pub fn name(&self) -> &str {
        match self {
            Role::Anyone => "anyone",
            Role::Reader => "read_token",
            Role::Admin => "admin_token",
            Role::Business { name, .. } => name,
        }
    }

    /// Whether this role may write to `business`.
    pub fn writes(&self, business: &str) -> bool {
        match self {
            Role::Admin => true,
            Role::Business {
                business: b, admin, ..
            } => *admin && b == business,
            _ => false,
        }
    }

    /// The one business a business token opens; `None` for the others.
    pub fn only(&self) -> Option<&str> {
        match self {
            Role::Business { business, .. } => Some(business),
            _ => None,
        }
    }

    /// Whether this role may see `b`: its name, counts and tasks. `open`
    /// says whether the route answers callers without a token (the API
    /// while no read token is set; `/metrics` and `/readyz` always); a
    /// business with a token of its own is closed to them even so.
    pub fn sees(&self, b: &Business, open: bool) -> bool {
        match self {
            Role::Admin | Role::Reader => true,
            Role::Business { business, .. } => *business == b.name,
            Role::Anyone => open && !has_own_tokens(b),
        }
    }
}

/// Whether `b` has a token of its own, which closes it to reads without one.
fn has_own_tokens(b: &Business) -> bool {
    b.tokens.read.is_some() || b.tokens.admin.is_some()
}

/// The role a request's token proves, or [`Role::Anyone`] when it sends
/// none or one that proves nothing: for answers that serve every caller,
/// each with only what it may see.
pub fn caller(state: &HttpState, headers: &HeaderMap) -> Role {
    bearer(headers)
        .and_then(|g| role_of(state, g))
        .unwrap_or(Role::Anyone)
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
        return Some(Role::Admin);
    }
    if is(&state.read_token) {
        return Some(Role::Reader);
    }
    state.businesses.iter().find_map(|b| {
        let role = |admin: bool, field: &str| Role::Business {
            business: b.name.clone(),
            admin,
            name: format!("businesses.{}.{field}", b.name),
        };
        if is(&b.tokens.admin) {
            Some(role(true, "admin_token"))
        } else if is(&b.tokens.read) {
            Some(role(false, "read_token"))
        } else {
            None
        }
    })
}

/// A business token used on a route of another business (403).
fn elsewhere(business: &str) -> ApiError {
    ApiError::with(
        StatusCode::FORBIDDEN,
        format!("the bearer token is another business's token: it opens only that business's routes, not business \"{business}\"'s; use this business's token or a global one"),
    )
}

/// Allows a read of `business`'s routes (or, with `None`, of a route
/// across businesses), or says why not (401): no or a wrong token while a
/// read token is configured; another business's token (403).
pub fn require_read(
    state: &HttpState,
    headers: &HeaderMap,
    business: Option<&str>,
) -> Result<Role, ApiError> {
    let given = bearer(headers);
    if let Some(role) = given.and_then(|g| role_of(state, g)) {
        return match (role.only(), business) {
            (Some(own), Some(b)) if own != b => Err(elsewhere(b)),
            _ => Ok(role),
        };
    }
    // A business with a read token of its own is closed to reads without one.
    let closed = state.read_token.is_some()
        || business
            .and_then(|b| state.businesses.iter().find(|x| x.name == b))
            .is_some_and(has_own_tokens);
    match (closed, given) {
        // Reads are open: a token that proves nothing costs nothing.
        (false, _) => Ok(Role::Anyone),
        (true, Some(_)) => Err(ApiError::with(
            StatusCode::UNAUTHORIZED,
            "the bearer token is neither a read token nor an admin token",
        )),
        (true, None) => Err(ApiError::with(
            StatusCode::UNAUTHORIZED,
            "reads need the header Authorization: Bearer <read token or admin token>",
        )),
    }
}

/// Allows a write to `business`, or says why not: read-only (403), no or
/// a wrong token (401), a read token or another business's token (403).
pub fn require_admin(
    state: &HttpState,
    headers: &HeaderMap,
    business: &str,
) -> Result<Role, ApiError> {
    let own = state
        .businesses
        .iter()
        .find(|b| b.name == business)
        .is_some_and(|b| b.tokens.admin.is_some());
    if state.admin_token.is_none() && !own {
        return Err(ApiError::with(
            StatusCode::FORBIDDEN,
            "the console is read-only: set [http] admin_token (or admin_token_file, or DELAYD_HTTP__ADMIN_TOKEN), or the business's own admin_token, to allow writes",
        ));
    }
    match bearer(headers).map(|g| role_of(state, g)) {
        Some(Some(role)) if role.writes(business) => Ok(role),
        Some(Some(role)) if role.only().is_some_and(|b| b != business) => Err(elsewhere(business)),
        Some(Some(_)) => Err(ApiError::with(
            StatusCode::FORBIDDEN,
            "a read token only reads; writes need an admin token",
        )),
        Some(None) => Err(ApiError::with(
            StatusCode::UNAUTHORIZED,
            "the bearer token is not an admin token",
        )),
        None => Err(ApiError::with(
            StatusCode::UNAUTHORIZED,
            "writes need the header Authorization: Bearer <admin token>",
        )),
    }
}

/// The business a path under `/api/v1` names (`/businesses/NAME/...`),
/// decoded; `None` for routes across businesses.
fn business_in(path: &str) -> Option<String> {
    let path = path.strip_prefix("/api/v1").unwrap_or(path);
    let rest = path.strip_prefix("/businesses/")?;
    let raw = rest.split('/').next().filter(|s| !s.is_empty())?;
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// Every `GET` under `/api/v1` is a read: checked here once, so no read
/// handler can forget it. Writes check [`require_admin`] in their handler,
/// where a dry run (a count) checks [`require_read`] instead. A path that
/// names an unknown business answers 404 here, for every method, naming
/// only the businesses the caller may see.
pub async fn reads(
    State(state): State<std::sync::Arc<HttpState>>,
    req: Request,
    next: Next,
) -> Response {
    let business = business_in(req.uri().path());
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        if let Err(e) = require_read(&state, req.headers(), business.as_deref()) {
            return e.into_response();
        }
    }
    if let Some(name) = business.filter(|n| !state.businesses.iter().any(|b| &b.name == n)) {
        let role = caller(&state, req.headers());
        return unknown(&name, &state.seen_by(&role, state.read_token.is_none())).into_response();
    }
    next.run(req).await
}

/// An unknown business (404), naming only `known`, what the caller may see.
fn unknown(name: &str, known: &[&Business]) -> ApiError {
    let names: Vec<&str> = known.iter().map(|b| b.name.as_str()).collect();
    ApiError::not_found(if names.is_empty() {
        format!("unknown business \"{name}\"; with a token, GET /api/v1/businesses lists the businesses it may read")
    } else {
        format!(
            "unknown business \"{name}\": the businesses this request may read are {}",
            names.join(", ")
        )
    })
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
    use super::{business_in, same};

    #[test]
    fn the_business_of_a_path_is_its_decoded_second_segment() {
        assert_eq!(
            business_in("/businesses/billing/tasks").as_deref(),
            Some("billing")
        );
        assert_eq!(business_in("/businesses/a%20b").as_deref(), Some("a b"));
        assert_eq!(business_in("/businesses"), None);
        assert_eq!(business_in("/audit"), None);
    }

    #[test]
    fn only_the_exact_token_matches() {
        assert!(same(b"s3cret-token", b"s3cret-token"));
        assert!(!same(b"s3cret-token", b"s3cret-toke"));
        assert!(!same(b"s3cret-token", b"s3cret-token2"));
        assert!(!same(b"s3cret-token", b"S3cret-token"));
        assert!(!same(b"s3cret-token", b""));
    }
}
