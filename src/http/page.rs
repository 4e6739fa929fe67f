//! The console: one static page, its script and its style, built into the
//! binary. The page reads everything through the JSON API.

use std::sync::Arc;

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::routing::get;

use super::HttpState;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// Only the page's own script and style run: a body that slipped into the
/// page as markup could not load or run anything.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

type Asset = ([(axum::http::HeaderName, &'static str); 3], &'static str);

fn asset(kind: &'static str, body: &'static str) -> Asset {
    (
        [
            (CONTENT_TYPE, kind),
            (CACHE_CONTROL, "no-cache"),
            (CONTENT_SECURITY_POLICY, POLICY),
        ],
        body,
    )
}

/// `/`, `/console.js` and `/console.css`.
pub(super) fn routes() -> axum::Router<Arc<HttpState>> {
    axum::Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/console.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}
